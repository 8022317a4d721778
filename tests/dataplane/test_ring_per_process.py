"""A ring per vLLM process: every scheduler and worker of the layout, each a client process on its
own CXL-RPC ring, talks to one real metadata server at the same time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from belugactl.model.layout import resolve_layout
from belugactl.workflows.pool_inspect import inspect_pool
from tests.dataplane.test_server_process import server

pytestmark = pytest.mark.timeout(180)

# One process of an instance: a worker saves its blocks (reserve, write, commit in bursts) and reads
# them back; the scheduler looks up a chain with leases and hands them to the next worker, as the
# connector does. Every client waits for the start file, so they all talk to the server at once.
CLIENT = textwrap.dedent(
    """
    import json, os, sys, time
    from belugactl.dataplane import native
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping
    address, pool_path, tag, go = sys.argv[1:5]
    pool = PoolMapping.open(pool_path)
    c = connect(address, pool=pool, timeout_s=10.0)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.005)
    keys = [f"{tag}-{i}".encode().ljust(32, b".") for i in range(24)]
    out = {"tag": tag, "address": address}
    if tag.endswith("scheduler"):
        n = 0
        chain = [f"{tag[: -len('scheduler')]}worker0-{i}".encode().ljust(32, b".") for i in range(24)]
        for _ in range(1000):  # the worker of this instance saves concurrently: look until all are in
            n, leases = c.lookup_prefix_leased("m/tp0", chain)
            c.release(leases)
            if n == len(keys):
                break
            time.sleep(0.01)
        out["found"] = n
    else:
        rs = c.reserve_many("m/tp0", [(k, 4096 + i) for i, k in enumerate(keys)])
        crcs = []
        for k, r in zip(keys, rs):
            data = (k * 200)[: r.nbytes]
            crcs.append(native.crc32c(data))
            pos = 0
            for off, n in r.extents:
                pool.write(off, data[pos : pos + n])
                pos += n
        codes = c.commit_many([(r.token, crc) for r, crc in zip(rs, crcs)])
        out["committed"] = sum(int(code) == 0 for code in codes)
        locs = c.get_many("m/tp0", keys)
        ok = 0
        for k, loc in zip(keys, locs):
            got = b"".join(pool.read(off, n) for off, n in loc.extents)[: loc.nbytes]
            ok += got == (k * 200)[: loc.nbytes]
        c.release([loc.lease_id for loc in locs])
        out["read_back"] = ok
    out["round_trips"] = c.round_trips
    c.close()
    print(json.dumps(out))
    """
)


def test_every_process_of_the_layout_on_its_own_ring_at_once(
    manifest_path: Path, pool_path: Path, manifest, tmp_path: Path
) -> None:
    layout = resolve_layout(manifest)
    # 2 hosts x 2 instances x (scheduler + 1 worker): 8 rings owned, 2 spare
    assert len(layout.clients) == 8 and layout.rpc.ring_count == 10
    go = tmp_path / "go"
    with server(manifest_path, pool_path) as srv:
        procs = {}
        for c in layout.clients:
            tag = f"{c.host}-{c.instance}-{c.process}"
            procs[c.ring] = subprocess.Popen(  # noqa: S603 - our interpreter, our script
                [sys.executable, "-c", CLIENT, f"cxl://{pool_path}#{c.ring}", str(pool_path), tag, str(go)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
        time.sleep(0.5)
        go.touch()
        results = {}
        for ring, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]
            results[ring] = json.loads(out)
        doc = inspect_pool(pool_path, manifest, stats={})
        srv["proc"].terminate()
    for c in layout.clients:
        r = results[c.ring]
        assert r["address"].endswith(f"#{c.ring}")
        if c.process == "scheduler":
            assert r["found"] == 24  # its instance's worker saved them all, over another ring
        else:
            assert r["committed"] == 24 and r["read_back"] == 24
        assert r["round_trips"] > 0
    # the server answered every owned ring and nothing else: each ring's last request came from its owner
    used = {e["ring"]: e for e in doc["rings"] if e["used"]}
    assert sorted(used) == [c.ring for c in layout.clients]
    for c in layout.clients:
        assert used[c.ring]["owner"] == c.owner and used[c.ring]["current_epoch"]
        assert used[c.ring]["requests_waiting"] == 0
    assert [e["owner"] for e in doc["rings"] if not e["used"]] == ["spare", "spare"]
