"""Every command parses its manifest once and resolves the layout at most once more (issue 10 part 2).

Before the rack context, `serve` parsed the manifest up to three times and resolved the layout
four times; a workflow that goes back to the file (or resolves the layout itself) fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from belugactl.pool.file_pool import create_file_pool
from tests.support.paths import CPU_DEMO, LAB, LAB_GUEST


@pytest.fixture
def demo_pool(tmp_path: Path) -> Path:
    pool = tmp_path / "demo.pool"
    create_file_pool(pool, CPU_DEMO)
    return pool


COMMANDS = {
    "serve --dry-run": lambda pool, tmp: ["serve", "-f", str(CPU_DEMO), "--pool", str(pool), "--dry-run",
                                          "--run-dir", str(tmp / "run")],
    "serve --dry-run --json": lambda pool, tmp: ["serve", "-f", str(CPU_DEMO), "--pool", str(pool), "--dry-run",
                                                 "--json", "--run-dir", str(tmp / "run")],
    "doctor": lambda pool, tmp: ["doctor", "-f", str(LAB), "--root", str(LAB_GUEST), "--json"],
    "plan": lambda pool, tmp: ["plan", "-f", str(LAB), "--host", "lab-1", "--root", str(LAB_GUEST)],
    "setup --dry-run": lambda pool, tmp: ["setup", "-f", str(LAB), "--host", "lab-1", "--root", str(LAB_GUEST),
                                          "--dry-run"],
    "pool show": lambda pool, tmp: ["pool", "show", "-f", str(LAB), "--json"],
    "manifest check": lambda pool, tmp: ["manifest", "check", "-f", str(LAB), "--json"],
    "export systemd": lambda pool, tmp: ["export", "systemd", "-f", str(LAB), "--host", "lab-2"],
    "rack agent info": lambda pool, tmp: ["rack", "agent", "info", "-f", str(LAB), "--host", "lab-1"],
}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_parses_the_manifest_once(name, cli, demo_pool, model_calls, tmp_path):
    result = cli(*COMMANDS[name](demo_pool, tmp_path))
    assert result.code in (0, 1), (result.stdout, result.stderr)  # doctor on the fixture has failures
    assert model_calls["manifest parses"] == 1, dict(model_calls)
    assert model_calls["layout resolutions"] <= 1, dict(model_calls)


def test_status_reads_no_manifest(cli, model_calls, tmp_path):
    result = cli("status", "--run-dir", str(tmp_path / "run"), "--json")
    assert result.code == 0
    assert model_calls["manifest parses"] == 0


def test_serve_with_its_checks_parses_once(cli, demo_pool, model_calls, tmp_path, monkeypatch):
    """The full preflight (ports, pool header against the manifest) up to the start of the processes."""
    import belugactl.workflows.serve.supervisor as supervisor
    from belugactl.workflows.serve import preflight

    class Started(Exception):
        pass

    def start(self):  # type: ignore[no-untyped-def]
        raise Started

    monkeypatch.setattr(supervisor.Supervisor, "start", start)
    monkeypatch.setattr(preflight, "check_vllm", lambda plan: None)
    monkeypatch.setattr(preflight, "check_ports", lambda ports: None)
    with pytest.raises(Started):
        cli("serve", "-f", str(CPU_DEMO), "--pool", str(demo_pool), "--run-dir", str(tmp_path / "run"))
    assert model_calls["manifest parses"] == 1, dict(model_calls)
    # the context's layout; the pool mapping verifies the header against the manifest with its own
    assert model_calls["layout resolutions"] <= 2, dict(model_calls)
