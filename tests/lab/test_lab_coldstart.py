"""`belugactl lab coldstart`: the refusals without a lab, and one real cold start on the ram profile."""

import json
import os
import signal

import pytest

from belugactl.errors import UsageError
from belugactl.lab import coldstart, prereqs
from belugactl.lab.paths import STATE_ENV
from belugactl.model.manifest import load_manifest
from tests.support.lab import REPO, our_qemus, run_cli, unavailable


def test_a_manifest_whose_hosts_are_not_the_labs_guests_is_refused():
    path = REPO / "examples" / "beluga-rack.yaml"
    manifest = load_manifest(path)
    with pytest.raises(UsageError) as err:
        coldstart.run(str(path), hosts=[h.name for h in manifest.hosts], pool_size=int(manifest.pool.size),
                      name="never-booted")
    assert "lab-1" in str(err.value) and "examples/lab-ram.yaml" in (err.value.fix or "")


@pytest.mark.lab
@pytest.mark.lab_ram
@pytest.mark.timeout(900)
def test_cold_start_boots_sets_up_and_checks_both_guests_and_reports_every_phase(tmp_path):
    if prereqs.find_program("busybox") is None:
        unavailable("busybox not found (Debian package busybox-static)")
    env = dict(os.environ, **{STATE_ENV: str(tmp_path / "labstate")})
    prep = run_cli(env, "lab", "prepare", "--json", timeout=900)
    if prep.returncode != 0:
        unavailable(f"`belugactl lab prepare` (ram) failed: {prep.stderr.strip()[-500:]}")
    try:
        r = run_cli(env, "lab", "coldstart", "-f", str(REPO / "examples" / "lab-ram.yaml"), "--name", "pytest-cold",
                    "--json", timeout=840)
        try:
            doc = json.loads(r.stdout)
        except ValueError:
            pytest.fail(f"coldstart printed no JSON (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        print(json.dumps(doc["phases"]), doc["total_s"])
        assert r.returncode == 0 and doc["green"], json.dumps(doc["runs"], indent=1)
        assert [p["phase"].split(":")[0] for p in doc["phases"]] == ["boot", "warm", "setup", "doctor"]
        assert doc["total_s"] == pytest.approx(sum(p["seconds"] for p in doc["phases"]), abs=0.5)
        runs = {(x["host"], x["command"]): x for x in doc["runs"]}
        assert set(runs) == {(h, c) for h in ("lab-1", "lab-2") for c in ("setup", "doctor")}
        # Every command went through the guests' resident belugactl, and doctor is green everywhere.
        assert all(x["warm"] and x["rc"] == 0 for x in runs.values()), runs
        assert all("0 failed" in runs[(h, "doctor")]["summary"] for h in ("lab-1", "lab-2"))
        assert (doc["profile"], doc["devices"], doc["switch"], doc["kept"]) == ("ram", 2, True, False)
        # Without --keep the lab is gone.
        st = run_cli(env, "lab", "status", "--name", "pytest-cold", "--json", timeout=60)
        assert json.loads(st.stdout)["state"] == "down"
    finally:
        run_cli(env, "lab", "down", "--name", "pytest-cold", timeout=120)
        for pid in our_qemus(tmp_path / "labstate"):
            os.kill(pid, signal.SIGKILL)
