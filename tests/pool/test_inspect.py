"""`pool inspect` on a real file pool made by `pool create-file`, with and without a metadata server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.cli.app import run
from belugactl.dataplane.mds.server import MetadataServer, ServerConfig
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Op
from belugactl.dataplane.rpc.transport import CxlTransport
from belugactl.model.manifest import load_manifest
from belugactl.pool import header as hdr
from belugactl.pool.mapping import PoolMapping
from belugactl.workflows.pool_inspect import admin_url_for, inspect_pool
from tests.support.blocks import zeros_crc

NS = 5_000_000_000
NOBODY = "http://127.0.0.1:9"  # the discard port: nothing answers HTTP there


@pytest.fixture
def created(tmp_path: Path, manifest_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "inspect.pool"
    assert run(["pool", "create-file", "-f", str(manifest_path), str(path)]) == 0
    capsys.readouterr()
    return path


def _inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert run(["pool", "inspect", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_fresh_pool(created: Path, manifest_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _inspect_json(capsys, str(created), "-f", str(manifest_path), "--admin", NOBODY)
    manifest = load_manifest(manifest_path)
    assert doc["epoch"] == 0 and doc["claim"] == {"word": 0, "holder": None}
    assert doc["manifest"]["matches"] and doc["manifest"]["differences"] == []
    assert doc["layout_hash"] == doc["manifest"]["layout_hash"] == doc["header"]["layout_hash"]
    assert [h["name"] for h in doc["hosts"]] == [h.name for h in manifest.hosts]
    # 2 hosts x 2 instances x (scheduler + 1 worker) own rings 0..7; the 2 spare rings have no owner;
    # none was ever used
    assert [r["owner"] for r in doc["rings"]] == [
        f"{h}/vllm-{i}/{p}" for h in ("h0", "h1") for i in (0, 1) for p in ("scheduler", "worker0")
    ] + ["spare", "spare"]
    assert not any(r["used"] for r in doc["rings"])
    assert doc["journal"]["state"] == "empty"
    assert doc["shared_kv"]["server"] == "not running" and "usage" not in doc["shared_kv"]
    # without a manifest: no owners, no comparison, the header alone
    bare = _inspect_json(capsys, str(created), "--admin", NOBODY)
    assert bare["manifest"] is None and {r["owner"] for r in bare["rings"]} == {None}


def test_a_served_pool_shows_ring_activity_journal_and_usage(
    created: Path, manifest_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = PoolMapping.open(created)
    config = ServerConfig(rpc_port=None, admin_port=0, fence_grace_s=0, restart_policy="journal")
    server = MetadataServer(pool, config)
    try:
        server.start()
        t = CxlTransport(pool, 2)

        def call(op: int, payload: bytes) -> bytes:
            t.submit(op, server.epoch, payload)
            assert server.poll_once(NS)
            code, _epoch, reply = t.collect(NS)
            assert code == 0
            return reply

        call(Op.HELLO, p.encode_hello(2))
        ns = p.decode_u32(call(Op.OPEN_NS, p.encode_name("m/tp0")), "ns")
        for i in range(3):
            token, _extents = p.decode_reserve_reply(call(Op.RESERVE, p.encode_reserve(ns, bytes([i]) * 32, 5000)))
            call(Op.COMMIT, p.encode_commit(token, zeros_crc(5000)))
        server.publish_snapshot()
        admin = f"http://127.0.0.1:{server.admin_port}"
        doc = _inspect_json(capsys, str(created), "-f", str(manifest_path), "--admin", admin)
    finally:
        server.close()
        pool.close()
    assert doc["epoch"] == 1
    ring = doc["rings"][2]
    assert ring["owner"] == "h0/vllm-1/scheduler" and ring["used"] and ring["current_epoch"]
    assert ring["last_epoch"] == 1 and ring["last_state"] == "free" and ring["requests_waiting"] == 0
    assert ring["last_slot"] == ring["last_seq"] % 8  # 8 slots per ring in this rack
    assert [r["ring"] for r in doc["rings"] if r["used"]] == [2]
    journal = doc["journal"]
    assert journal["state"] == "active" and journal["commits"] == 3 and journal["removes"] == 0
    kv = doc["shared_kv"]
    assert kv["server"] == "running" and kv["usage"]["entries"] == 3
    assert kv["usage"]["bytes_used"] >= 3 * 5000
    # the server is gone now: inspect says so instead of failing
    after = _inspect_json(capsys, str(created), "--admin", admin)
    assert after["shared_kv"]["server"] == "not running" and after["journal"]["commits"] == 3


def test_claim_word_names_its_host_and_a_foreign_manifest_is_reported(
    created: Path, rack_text: str, tmp_path: Path
) -> None:
    with PoolMapping.open(created) as pool:
        pool.write(hdr.CLAIM_OFFSET, hdr.claim_nonce("h1").to_bytes(8, "little"))
    other = tmp_path / "other.yaml"
    other.write_text(rack_text.replace("shared_kv: 40MiB", "shared_kv: 20MiB"))
    doc = inspect_pool(created, load_manifest(other), admin_url=NOBODY)
    assert doc["claim"]["holder"] == "h1"
    assert not doc["manifest"]["matches"]
    assert "shared_kv_size" in {d["field"] for d in doc["manifest"]["differences"]}
    assert {r["owner"] for r in doc["rings"]} == {None}  # another layout's clients say nothing about these rings


def test_human_output_and_errors(created: Path, manifest_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["pool", "inspect", str(created), "-f", str(manifest_path), "--admin", NOBODY]) == 0
    out = capsys.readouterr().out
    for words in ("layout      ", "(matches dp-test)", "claim word  0x0000000000000000", "rings       10, 0 used",
                  "journal     empty", f"metadata    not running ({NOBODY})"):
        assert words in out
    blank = created.parent / "blank.pool"
    blank.write_bytes(bytes(4 << 20))
    assert run(["pool", "inspect", str(blank)]) == 2  # PoolMismatch: never initialized
    assert "never initialized" in capsys.readouterr().err


def test_admin_url_follows_the_manifest(manifest_path: Path) -> None:
    m = load_manifest(manifest_path)
    assert admin_url_for(None) == "http://127.0.0.1:9470"
    assert admin_url_for(m) == f"http://{m.serve.metadata.admin_bind}:{m.serve.metadata.admin_port}"
