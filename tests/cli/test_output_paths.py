"""Every file a command writes goes where the user said, or the command refuses (exit 2, nothing written).

The rule (belugactl/cli/output_path.py): a file in an existing directory, an existing directory where a
command writes several files, or `-` for stdout. Devices (even /dev/null, reached here through a link in
tmp_path so no test writes outside it), FIFOs and directories given as a file are refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"
NOCXL = REPO / "tests" / "fixtures" / "nocxl"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def devnull(tmp_path: Path) -> Path:
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    return link


def _refused(result, *words: str) -> None:  # noqa: ANN001
    assert result.code == 2, (result.code, result.stderr)
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_prometheus_into_a_missing_directory_is_refused(cli, tmp_path):
    target = tmp_path / "missing" / "p.yml"
    _refused(cli("export", "prometheus", "-f", str(LAB), "-o", str(target)), "does not exist", "mkdir -p")
    assert _files(tmp_path) == set()


def test_grafana_onto_a_directory_is_refused(cli, tmp_path):
    _refused(cli("export", "grafana", "-o", str(tmp_path)), "is a directory")
    assert _files(tmp_path) == set()


def test_grafana_onto_a_device_is_refused_and_dash_is_stdout(cli, devnull):
    _refused(cli("export", "grafana", "-o", str(devnull)), "is a device", "-o -")
    printed = cli("export", "grafana", "-o", "-")
    assert printed.code == 0 and json.loads(printed.stdout)


def test_systemd_into_a_missing_directory_writes_no_file_named_after_it(cli, tmp_path):
    target = f"{tmp_path}/new/units/"
    _refused(cli("export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", target), "does not exist")
    assert _files(tmp_path) == set()


def test_systemd_onto_a_device_writes_nothing_beside_it(cli, tmp_path, devnull):
    _refused(cli("export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", str(devnull)), "is a device")
    assert _files(tmp_path) == {"null"}


def test_systemd_onto_a_name_that_is_no_unit_is_refused(cli, tmp_path):
    _refused(cli("export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", str(tmp_path / "units")), ".service")
    assert _files(tmp_path) == set()


def test_systemd_into_a_directory_names_the_files_it_wrote(cli, tmp_path):
    done = cli("export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", f"{tmp_path}/")
    assert done.code == 0, done.stderr
    assert _files(tmp_path) == {"belugactl-setup.service", "belugactl-serve.service"}
    assert "systemctl enable belugactl-setup.service belugactl-serve.service" in done.stderr


def test_capture_onto_a_device_is_refused(cli, tmp_path, devnull):
    _refused(cli("discover", "--root", str(NOCXL), "--capture", str(devnull)), "is a device")
    assert _files(tmp_path) == {"null"}


def test_capture_to_a_tar_name_makes_no_directory_of_that_name(cli, tmp_path):
    target = tmp_path / "s.tar"
    _refused(cli("discover", "--root", str(NOCXL), "--capture", str(target)), "s.tar.gz")
    assert _files(tmp_path) == set()


def test_capture_into_a_missing_directory_creates_none(cli, tmp_path):
    for target in (tmp_path / "missing" / "b.tar.gz", tmp_path / "missing" / "bundle"):
        _refused(cli("discover", "--root", str(NOCXL), "--capture", str(target)), "does not exist")
    assert _files(tmp_path) == set()


def test_capture_writes_the_tarball_it_was_told(cli, tmp_path):
    done = cli("discover", "--root", str(NOCXL), "--capture", str(tmp_path / "s.tar.gz"))
    assert done.code == 0, done.stderr
    assert _files(tmp_path) == {"s.tar.gz"}


def test_svg_onto_a_directory_or_a_device_is_refused(cli, tmp_path, devnull):
    _refused(cli("pool", "show", "-f", str(LAB), "--svg", str(tmp_path)), "is a directory")
    _refused(cli("pool", "show", "-f", str(LAB), "--svg", str(devnull)), "is a device")
    target = tmp_path / "missing" / "x.svg"
    _refused(cli("pool", "show", "-f", str(LAB), "--svg", str(target)), "does not exist")
    assert _files(tmp_path) == {"null"}
