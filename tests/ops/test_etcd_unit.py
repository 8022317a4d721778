"""`export systemd`'s etcd unit (serve.metadata.etcd, issue 32 item 2): one member per endpoint host, named
after the manifest host, peers on the client port + 1, escaped like the other units; and a real etcd
started with the unit's own ExecStart arguments accepts them."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.systemd import ETCD_UNIT_NAME, SERVE_UNIT_NAME, UNIT_NAME, etcd_unit_text
from tests.support.etcd import _free_port, require_etcd

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "examples" / "lab.yaml"
CPU_DEMO = REPO / "examples" / "cpu-demo.yaml"


def with_etcd(path: Path, anchor: str, endpoints: list[str]) -> str:
    text = path.read_text()
    assert text.count(anchor) == 1
    conf = json.dumps({"endpoints": endpoints, "candidates": ["lab-1", "lab-2"]})
    return text.replace(anchor, f"{anchor}    etcd: {conf}\n")


def lab(endpoints: list[str]):
    return load_manifest_text(with_etcd(LAB, "    host: lab-1\n", endpoints))


def directive(text: str, key: str) -> str:
    return next(line.partition("=")[2] for line in text.splitlines() if line.startswith(f"{key}="))


def test_a_member_host_gets_its_unit_named_after_the_host() -> None:
    m = lab(["http://10.0.2.15:2379", "http://10.0.2.16:2379", "http://10.0.2.17:2379"])
    text, note = etcd_unit_text(m, "lab-2")
    assert text is not None and note == "lab-2 is etcd member lab-2 (http://10.0.2.16:2379) of 3"
    argv = shlex.split(directive(text, "ExecStart"))
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == "/usr/bin/etcd" and opts["--name"] == "lab-2"
    assert (
        opts["--initial-cluster"]
        == "lab-1=http://10.0.2.15:2380,lab-2=http://10.0.2.16:2380,10.0.2.17=http://10.0.2.17:2380"
    )
    assert opts["--listen-client-urls"] == "http://10.0.2.16:2379,http://127.0.0.1:2379"  # doctor on the host
    assert opts["--advertise-client-urls"] == "http://10.0.2.16:2379"
    assert opts["--listen-peer-urls"] == opts["--initial-advertise-peer-urls"] == "http://10.0.2.16:2380"
    assert opts["--data-dir"] == f"/var/lib/belugactl-etcd/{m.name}" and opts["--initial-cluster-state"] == "new"
    assert directive(text, "User") == "etcd" and directive(text, "StateDirectory") == "belugactl-etcd"
    assert directive(text, "Conflicts") == "etcd.service" and directive(text, "Before") == SERVE_UNIT_NAME
    assert directive(text, "Type") == "notify"


def test_no_unit_where_the_host_is_no_member_or_there_is_no_etcd() -> None:
    m = lab(["http://10.0.2.15:2379"])
    text, note = etcd_unit_text(m, "lab-2")
    assert text is None and "lab-2 is no member" in note
    text, note = etcd_unit_text(load_manifest_text(LAB.read_text()), "lab-1")
    assert text is None and "no serve.metadata.etcd" in note
    text, note = etcd_unit_text(lab(["https://10.0.2.15:2379"]), "lab-1")
    assert text is None and "certificates" in note
    # a name, not an IP: etcd binds IPs only, so the member listens on every address
    text, _ = etcd_unit_text(lab(["http://lab-1:2379"]), "lab-1")
    assert text is not None and "--listen-client-urls http://0.0.0.0:2379 " in text


def test_the_etcd_binary_path_is_escaped_like_the_other_units() -> None:
    text, _ = etcd_unit_text(lab(["http://10.0.2.15:2379"]), "lab-1", binary="/opt/etcd 50%/$X/etcd")
    assert text is not None and directive(text, "ExecStart").startswith('"/opt/etcd 50%%/$$X/etcd" --name lab-1 ')


def test_cli_writes_the_etcd_unit_beside_the_others(tmp_path: Path, capsys) -> None:
    manifest = tmp_path / "rack.yaml"
    manifest.write_text(with_etcd(LAB, "    host: lab-1\n", ["http://10.0.2.15:2379", "http://10.0.2.16:2379"]))
    out = tmp_path / "units"
    out.mkdir()
    assert run(["export", "systemd", "-f", str(manifest), "--host", "lab-1", "-o", f"{out}/"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([UNIT_NAME, SERVE_UNIT_NAME, ETCD_UNIT_NAME])
    assert ETCD_UNIT_NAME in capsys.readouterr().err
    assert run(["export", "systemd", "-f", str(manifest), "--host", "lab-1"]) == 0
    assert f"# ---- {ETCD_UNIT_NAME}" in capsys.readouterr().out
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run(["export", "systemd", "-f", str(LAB), "--host", "lab-1", "-o", f"{plain}/"]) == 0
    assert sorted(p.name for p in plain.iterdir()) == sorted([UNIT_NAME, SERVE_UNIT_NAME])


@pytest.mark.process
def test_a_real_etcd_runs_with_the_units_arguments(tmp_path: Path) -> None:
    binary = require_etcd()
    port = _free_port()
    while (peer := port + 1) and not _port_free(peer):
        port = _free_port()
    anchor = "  metadata: {admin_bind: 127.0.0.1, admin_port: 9470, rpc_port: 9471, spin_after_ms: 0}\n"
    text = CPU_DEMO.read_text().replace(anchor, "  metadata:\n    admin_bind: 127.0.0.1\n")
    m = load_manifest_text(with_etcd_text(text, f"http://127.0.0.1:{port}"))
    unit, _ = etcd_unit_text(m, "cpu-demo", binary=binary)
    assert unit is not None
    argv = shlex.split(directive(unit, "ExecStart"))
    argv[argv.index("--data-dir") + 1] = str(tmp_path / "data")  # systemd's StateDirectory, here a temp dir
    log = open(tmp_path / "etcd.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=log, stderr=log)  # noqa: S603
    try:
        members = None
        for _ in range(200):
            if proc.poll() is not None:
                break
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/cluster/member/list", data=b"{}")
                with urllib.request.urlopen(req, timeout=1) as r:  # noqa: S310 - loopback
                    members = json.loads(r.read())["members"]
                    break
            except OSError:
                time.sleep(0.05)
        assert members is not None, (tmp_path / "etcd.log").read_text()[-2000:]
        assert [(x["name"], x["peerURLs"]) for x in members] == [("cpu-demo", [f"http://127.0.0.1:{port + 1}"])]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def with_etcd_text(text: str, endpoint: str) -> str:
    anchor = "    admin_bind: 127.0.0.1\n"
    assert text.count(anchor) == 1
    return text.replace(anchor, anchor + f"    etcd: {{endpoints: [{endpoint}], candidates: [cpu-demo]}}\n")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
