"""One KV-index client's round trips with every byte checked, as JSON: the lab's cross-host RPC driver, run inside the
guests by tests/dataplane/test_rpc_lab.py (it lives with the other in-guest tools in `belugactl/lab/guest/`).

    python -m belugactl.lab.guest.rpc_driver put   --pool /dev/dax0.0 -f rack.yaml --host lab-2 \\
        --namespace probe --block a:12288 --block b:2621440 --seed 7
    python -m belugactl.lab.guest.rpc_driver check --pool /dev/dax0.0 -f rack.yaml --host lab-1 \\
        --namespace probe --block a:12288 --block b:2621440 --seed 7
    python -m belugactl.lab.guest.rpc_driver check --pool /dev/dax0.0 --address tcp://127.0.0.1:9471 ...

`put` reserves each block, writes its bytes into the returned extents through this process's own
pool mapping, commits, then checks lookup_prefix, get and the bytes read back. `check` only looks
up, gets and compares (a block another client wrote). Block contents are a pure function of
(seed, name, size), so a process on another host can verify them without being sent anything.
The CXL ring is `--ring`, else the layout's ring of (`--host`, `--instance`); `--address` selects
another transport (e.g. TCP) while the bytes still move through `--pool`.

Prints one JSON document (stdout): the ring and address used, the server epoch, each block's key,
extents and verdict, lookup results, per-op latencies in ms, and the headers of the ring's used
slots (so an observer of the pool's backing store can find them at the layout's offsets).
Exit status 0 when every check passed, 1 otherwise (the document says which failed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from belugactl.dataplane import native
from belugactl.dataplane.client import KVIndexClient, connect
from belugactl.dataplane.rpc.protocol import HEADER, MAGIC
from belugactl.pool.mapping import PoolMapping

T = TypeVar("T")
ABSENT_KEY_NAME = "never-written"


def block_key(name: str) -> bytes:
    """A 32-byte key like a vLLM block hash (every key of one lookup chain has the same length)."""
    return hashlib.sha256(f"belugactl-rpc-probe/{name}".encode()).digest()


def block_bytes(seed: int, name: str, nbytes: int) -> bytes:
    # Random.randbytes is C-speed, and a str seed is hashed with sha512 (no hash randomization),
    # so every process on every host derives the same bytes.
    return random.Random(f"{seed}/{name}/{nbytes}").randbytes(nbytes)


def parse_block(text: str) -> tuple[str, int]:
    name, sep, size = text.rpartition(":")
    if not sep or not name or not size.isdigit() or int(size) <= 0:
        raise argparse.ArgumentTypeError(f"block {text!r}: write NAME:NBYTES, e.g. a:12288")
    return name, int(size)


def write_extents(pool: PoolMapping, extents: Sequence[tuple[int, int]], data: bytes) -> None:
    pos = 0
    for off, length in extents:
        take = min(length, len(data) - pos)
        if take <= 0:
            break
        pool.write(off, data[pos : pos + take])
        pos += take
    if pos != len(data):
        raise ValueError(f"extents {list(extents)} hold {pos} of the block's {len(data)} bytes")


def read_extents(pool: PoolMapping, extents: Sequence[tuple[int, int]], nbytes: int) -> bytes:
    out = bytearray()
    for off, length in extents:
        take = min(length, nbytes - len(out))
        if take <= 0:
            break
        out += pool.read(off, take)
    return bytes(out)


class RpcDriver:
    def __init__(self, client: KVIndexClient, pool: PoolMapping) -> None:
        self.client = client
        self.pool = pool
        self.latency_ms: dict[str, list[float]] = {}
        self.failures: list[str] = []

    def timed(self, op: str, fn: Callable[..., T], *args: Any) -> T:
        t0 = time.perf_counter()
        out = fn(*args)
        self.latency_ms.setdefault(op, []).append((time.perf_counter() - t0) * 1e3)
        return out

    def expect(self, ok: bool, what: str) -> bool:
        if not ok:
            self.failures.append(what)
        return ok

    def put(self, namespace: str, name: str, nbytes: int, seed: int) -> dict[str, Any]:
        data = block_bytes(seed, name, nbytes)
        res = self.timed("reserve", self.client.reserve, namespace, block_key(name), nbytes)
        t0 = time.perf_counter()
        write_extents(self.pool, res.extents, data)
        write_ms = (time.perf_counter() - t0) * 1e3
        self.timed("commit", self.client.commit, res.token, native.crc32c(data))
        return {"name": name, "nbytes": nbytes, "reserved_extents": res.extents, "write_ms": round(write_ms, 2)}

    def check(self, namespace: str, name: str, nbytes: int, seed: int) -> dict[str, Any]:
        loc = self.timed("get", self.client.get, namespace, block_key(name))
        if not self.expect(loc is not None, f"get {name}: not found"):
            return {"name": name, "found": False, "ok": False}
        assert loc is not None
        got = read_extents(self.pool, loc.extents, loc.nbytes)
        want = block_bytes(seed, name, nbytes)
        ok = self.expect(loc.nbytes == nbytes and got == want, f"get {name}: bytes differ from the pattern")
        # Only on a mismatch: a per-byte Python loop over megabytes takes tens of seconds under TCG.
        first_bad = None
        if not ok:
            diffs = (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
            first_bad = next(diffs, min(len(got), len(want)))
        self.timed("release", self.client.release, [loc.lease_id])
        return {
            "name": name,
            "found": True,
            "nbytes": loc.nbytes,
            "extents": loc.extents,
            "sha256": hashlib.sha256(got).hexdigest(),
            "first_bad_byte": first_bad,
            "ok": ok,
        }

    def ring_slots(self, ring: int) -> list[dict[str, int]]:
        """Headers of the ring's slots that carry a message (magic set), as this host reads them."""
        g = self.pool.geometry
        out = []
        for slot in range(g.slots_per_ring):
            off = g.slot_offset(ring, slot)
            status, seq, magic, epoch, op, code, length = HEADER.unpack(self.pool.read(off, HEADER.size))
            if magic == MAGIC:
                out.append({"slot": slot, "offset": off, "status": status, "seq": seq, "epoch": epoch, "op": op})
        return out


def summarize(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "min": round(min(samples), 3),
        "median": round(statistics.median(samples), 3),
        "max": round(max(samples), 3),
    }


def process_age_s() -> float | None:
    """Seconds since this process started (interpreter start-up and imports included), from /proc."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    pool = PoolMapping.open(args.pool, args.file)
    ring = args.ring
    if ring is None and args.host is not None:
        if pool.layout is None:
            raise SystemExit("--host needs -f MANIFEST (the layout names each host's ring)")
        ring = pool.layout.ring_for(args.host, args.instance)
    address = args.address or (f"cxl://{args.pool}#{ring}" if ring is not None else None)
    if address is None:
        raise SystemExit("give --ring, --host (with -f) or --address")
    doc: dict[str, Any] = {"action": args.action, "hostname": socket.gethostname(), "address": address,
                           "ring": ring, "needs_flush": pool.needs_flush}  # fmt: skip
    t0 = time.perf_counter()
    client = connect(address, pool=pool if address.startswith("cxl:") else None, timeout_s=args.timeout)
    doc["connect_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    doc["epoch"] = client.epoch
    driver = RpcDriver(client, pool)
    try:
        names = [name for name, _ in args.block]
        if args.action == "put":
            doc["put"] = [driver.put(args.namespace, name, nbytes, args.seed) for name, nbytes in args.block]
        chain = [block_key(n) for n in names]
        doc["lookup_prefix"] = driver.timed("lookup_prefix", client.lookup_prefix, args.namespace,
                                           [*chain, block_key(ABSENT_KEY_NAME)])  # fmt: skip
        driver.expect(doc["lookup_prefix"] == len(chain), f"lookup_prefix {doc['lookup_prefix']} != {len(chain)}")
        doc["absent_get"] = driver.timed("get", client.get, args.namespace, block_key(ABSENT_KEY_NAME))
        driver.expect(doc["absent_get"] is None, "get of a key never written found something")
        t_check = time.perf_counter()
        doc["blocks"] = [driver.check(args.namespace, name, nbytes, args.seed) for name, nbytes in args.block]
        doc["check_blocks_s"] = round(time.perf_counter() - t_check, 3)
        for _ in range(args.pings):
            driver.timed("ping", client.ping, b"x" * 16)
        if ring is not None and address.startswith("cxl:"):
            doc["slots"] = driver.ring_slots(ring)
    finally:
        client.close()
        pool.close()
    doc["latency_ms"] = {op: summarize(s) for op, s in driver.latency_ms.items()}
    doc["failures"] = driver.failures
    doc["run_s"] = round(time.perf_counter() - started, 3)
    doc["process_age_s"] = process_age_s()
    doc["ok"] = not driver.failures
    return doc


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m belugactl.lab.guest.rpc_driver", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["put", "check"])
    ap.add_argument("--pool", required=True, help="/dev/daxX.Y or a file pool (the bytes move through it)")
    ap.add_argument("-f", "--file", default=None, help="rack manifest (verifies the header; names the rings)")
    ap.add_argument("--host", default=None, help="take the layout's ring of this host (needs -f)")
    ap.add_argument("--instance", type=int, default=0, help="instance on --host (default 0)")
    ap.add_argument("--ring", type=int, default=None, help="ring index (overrides --host)")
    ap.add_argument("--address", default=None, help="transport address instead of cxl://POOL#RING (e.g. tcp://...)")
    ap.add_argument("--namespace", default="rpc-probe")
    ap.add_argument("--block", type=parse_block, action="append", required=True, help="NAME:NBYTES (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pings", type=int, default=20, help="PING round trips to time (default 20)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for each reply (default 10)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        doc = run(args)
    except Exception as exc:  # report any failure as data: the caller is a test reading JSON
        doc = {"action": args.action, "ok": False, "error": f"{type(exc).__name__}: {exc}",
               "why": getattr(exc, "why", None)}  # fmt: skip
    print(json.dumps(doc, default=str))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
