"""`bench mds --scale`: the metadata server at the size of the rack it is for (issue 31).

A real `belugactl metadata-server` process on a sparse file pool of the 16-host example's size
(examples/beluga-rack.yaml: 8 TiB, a 1 GiB journal, 272 rings of 256 slots), filled through its own
client over CXL-RPC to each size in turn. Only metadata is written: each block is reserved and
committed with the CRC32C of its bytes, which are the sparse file's zero pages (nothing is copied,
so only the pages the server touches cost memory). At each size: the server's memory a block, the
batched save rate, lookup latency, the loop's longest pause (a prober process asks once a
millisecond and records the longest gap between answers), a journal restart to /readyz and the
SIGTERM stop before it, the watermark eviction if the fill reached it, and one large reserve in a
pool of small blocks (a separate server whose pool those blocks overfill). Then, on small pools,
QD1 latency and QD128 throughput at each ring count, with and without the client's flushes.

Every phase is bounded by `budget_s`; what does not fit is reported as skipped, never run for an
hour. The figures go beside issue 31's targets in one table (`mds_scale_report.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.errors import BelugaError, EnvironmentProblem
from belugactl.workflows.bench.mds_scale_report import SKIPPED, met_summary, report_rows

# examples/beluga-rack.yaml's pool (tests/dataplane/test_bench_mds_scale.py keeps these equal to it).
EXAMPLE_POOL_BYTES = 8 << 40
EXAMPLE_JOURNAL = "1GiB"
EXAMPLE_RINGS = 272  # 16 hosts x 8 instances x (scheduler + worker) + 16 spare
SLOTS_PER_RING = 256
PROCESS_RINGS = 2  # the bench rack's one host runs a scheduler and a worker: the rest are spare rings
NAMESPACE = "bench/scale"
KEY_LEN = 32  # a vLLM sha256 block hash
BATCH = 64  # blocks a save: a 2000-token request of 32-token blocks is 62
DEFAULT_BLOCK = 2 << 20  # an 8B-class model's block: 4 M of them fill the 8 TiB pool
SMALL_BLOCK = 64 << 10  # the mixed pool: small blocks, then one large reserve
LARGE_BLOCK = 2 << 20
CHUNK_BYTES = 2 << 20  # the allocator's chunk (dataplane/mds/allocator.py CHUNK)
MIXED_OVERFILL = 1.25  # the small-block fill is this many times what the mixed pool's KV area holds
MIXED_TOUCH = 16  # random earlier blocks looked up after each save of the mixed fill
MIXED_LEASE_TTL_S = 1.0  # the mixed server's lease TTL: the touches' leases end before the large reserve
LOOKUP_SAMPLES = 2000
RING_SAMPLES = 5000
RING_SECONDS = 0.5
PAUSE_THRESHOLD_MS = 2.0  # gaps the prober prints; the longest gap it reports whatever its length
PAUSE_TARGET_MS = 5.0
MAX_SERVER_RSS = 14 << 30  # stop filling before the server nears 16 GB (the machine has 23 GiB, shared)
MIN_AVAILABLE = 2 << 30  # ... or the machine has less than this left
STATS_NEAR_WATERMARK = 0.85  # above this share of the KV area, read the eviction count after every save
# What the server's /stats says of its own loop (mds/loop_stats.py): its longest turn since start (and
# what it was), and its last look at the rings that found nothing. An older server has none.
SERVER_LONGEST_TURN_US = ("loop", "longest_turn_us")
SERVER_LONGEST_TURN_WHAT = ("loop", "longest_turn_what")
SERVER_RING_PASS_US = ("loop", "ring_pass_us")


@dataclass
class Budget:
    """The benchmark's wall-clock allowance; each phase asks before it starts."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def deadline(self) -> float:
        return self.start + self.seconds


def scale_manifest(
    *, pool_bytes: int, rings: int, journal: str, shared_kv: str = "rest", min_block: str | None = None
) -> str:
    """One metadata/worker host, `rings` rings of the example's shape, a pool of `pool_bytes`."""
    smallest = f"\n    min_block: {min_block}" if min_block else ""
    return f"""\
version: 1
name: bench-scale
pool:
  source: {{kind: cxl-region, memdevs: all, type: ram}}
  size: {pool_bytes >> 20}MiB
  align: 2MiB
layout:
  metadata:
    slots_per_ring: {SLOTS_PER_RING}
    slot_size: 256B
    spare_rings: {rings - PROCESS_RINGS}
    journal: {journal}{smallest}
  shared_kv: {shared_kv}
hosts:
  - name: bench-0
    address: 127.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {{cpu_nodes: 1, cxl_nodes: 1}}
    gpus: {{count: 1, model: L40S}}
serve:
  vllm:
    model: bench/model
    instances_per_host: 1
"""


def key_of(i: int, tag: bytes = b"") -> bytes:
    """Block `i`'s key: derived, not kept (4 M keys would cost the benchmark more memory than the server)."""
    return hashlib.blake2b(tag + i.to_bytes(8, "little"), digest_size=KEY_LEN).digest()


def _zeros_crc(nbytes: int) -> int:
    from belugactl.dataplane import native

    return native.crc32c(bytes(nbytes))


# --- the server process --------------------------------------------------------------------------


class ServerProcess:
    """`belugactl metadata-server` in a child process, started and stopped under our clock."""

    def __init__(self, manifest: Path, pool: Path, extra: Sequence[str], log: Path) -> None:
        self.manifest, self.pool, self.extra, self.log = manifest, pool, list(extra), log
        self.proc: subprocess.Popen[str] | None = None
        self.record: dict[str, Any] = {}

    def start(self, deadline: float) -> float:
        """Start it; return the seconds from start to /readyz 200. EnvironmentProblem past `deadline`."""
        argv = [
            sys.executable, "-m", "belugactl", "metadata-server", "-f", str(self.manifest), "--pool", str(self.pool),
            "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json", *self.extra,
        ]  # fmt: skip
        t0 = time.monotonic()
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)  # noqa: S603
        line = _readline(self.proc, deadline)
        if not line:
            self.kill()
            tail = self.log.read_text(errors="replace")[-2000:]
            raise EnvironmentProblem("the metadata server did not start (or not within the budget)", why=tail)
        self.record = json.loads(line)
        while not _ready(self.record["admin"]):
            if time.monotonic() > deadline:
                self.kill()
                raise EnvironmentProblem("the metadata server was not ready within the budget")
            time.sleep(0.01)
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout_s: float = 120.0) -> float | None:
        """SIGTERM; the seconds to its exit, or None if it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def snapshot(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.record["admin"] + "/stats", timeout=30) as r:  # noqa: S310 - loopback
            return json.loads(r.read())

    def memory(self) -> tuple[int, int]:
        """(RSS, anonymous RSS): the pool's mapped pages are file pages, the index's are anonymous."""
        import psutil

        m = psutil.Process(self.pid).memory_info()
        return m.rss, m.rss - m.shared

    def cpu_s(self) -> float:
        import psutil

        t = psutil.Process(self.pid).cpu_times()
        return t.user + t.system


def _readline(proc: subprocess.Popen[str], deadline: float) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.2):
                return proc.stdout.readline()
            if proc.poll() is not None:
                return ""
    return ""


def _ready(admin: str) -> bool:
    try:
        with urllib.request.urlopen(admin + "/readyz", timeout=5) as r:  # noqa: S310 - loopback
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _dig(doc: dict[str, Any], path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


# --- the pause prober ------------------------------------------------------------------------------


class PauseProbe:
    """The prober process (`mds_pause_probe.py`) and the gaps it reported, by CLOCK_MONOTONIC."""

    def __init__(self, pool: Path, ring: int) -> None:
        argv = [
            sys.executable, "-m", "belugactl.workflows.bench.mds_pause_probe",
            str(pool), str(ring), NAMESPACE, str(PAUSE_THRESHOLD_MS),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # noqa: S603
        self.gaps: list[tuple[float, float]] = []
        self.answers = 0
        self.longest = 0.0
        assert self.proc.stdout is not None
        first = _readline(self.proc, time.monotonic() + 60)
        if first.strip() != "ready":
            self.proc.kill()
            raise EnvironmentProblem("the pause prober did not start")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, *rest = line.split()
            if word == "gap":
                self.gaps.append((float(rest[0]), float(rest[1])))
            elif word == "done":
                self.answers, self.longest = int(rest[0]), float(rest[1])

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        return {
            "answers": self.answers,
            "client_longest_s": round(self.longest, 6) if self.answers else None,
            "client_gaps_over_target": sum(1 for _t, g in self.gaps if g * 1e3 > PAUSE_TARGET_MS),
            "client_longest_gaps_s": sorted((round(g, 4) for _t, g in self.gaps), reverse=True)[:5],
            "probe_interval_ms": 1.0,
        }


# --- filling --------------------------------------------------------------------------------------


@dataclass
class Fill:
    """What one fill segment did."""

    filled: int = 0
    seconds: float = 0.0
    stopped: str = ""  # why it stopped short: "budget", "memory", "pool full"
    eviction_saves: list[float] = field(default_factory=list)
    evicted: int = 0
    fenced_s: float = 0.0  # waited for RESERVE's fence (the previous epoch's writers) after a restart


def fill(
    client: Any,
    server: ServerProcess,
    first: int,
    last: int,
    block: int,
    *,
    deadline: float,
    tag: bytes = b"",
    touch: int = 0,
    batch: int = BATCH,
) -> Fill:
    """Save blocks `first`..`last`-1 in saves of `batch` (RESERVE_MANY + COMMIT_MANY); time every save
    that evicted (the server's eviction count, read after each save once the area is nearly full).
    `touch`: after each save, look up that many random earlier blocks (one GET_MANY burst), so the
    LRU order is not the fill order, as in a cache whose prefixes are hit."""
    import psutil

    from belugactl.dataplane.rpc.protocol import Code

    crc = _zeros_crc(block)
    rng = random.Random(11)
    out = Fill()
    st = client.stats()
    capacity, used, evictions = st["bytes_capacity"], st["bytes_used"], st["evictions"]
    near = STATS_NEAR_WATERMARK * capacity
    since_check = 0
    t0 = time.perf_counter()
    i = first
    while i < last:
        if time.monotonic() > deadline:
            out.stopped = "budget"
            break
        if (i - first) % (batch * 256) < batch and i > first and _out_of_memory(server, psutil):
            out.stopped = "memory"
            break
        n = min(batch, last - i)
        s0 = time.perf_counter()
        got = client.reserve_many(NAMESPACE, [(key_of(j, tag), block) for j in range(i, i + n)])
        tokens = [r.token for r in got if not isinstance(r, int)]
        codes = client.commit_many([(t, crc) for t in tokens]) if tokens else []
        took = time.perf_counter() - s0
        committed = [int(c) for c in codes].count(0)
        if not committed:
            refused = {int(r) for r in got if isinstance(r, int)}
            if refused == {int(Code.NOT_READY)}:  # fenced after a restart: wait it out, untimed
                out.fenced_s += time.perf_counter() - s0
                time.sleep(0.05)
                continue
            out.stopped = ", ".join(sorted(Code(c).name for c in refused)) or "nothing committed"
            break
        out.filled += committed
        i += n
        since_check += committed
        if touch:
            client.get_many(NAMESPACE, [key_of(rng.randrange(first, i), tag) for _ in range(touch)])
        if used + since_check * block >= near:
            st = client.stats()
            if st["evictions"] > evictions:
                out.eviction_saves.append(took)
                out.evicted += st["evictions"] - evictions
            used, evictions, since_check = st["bytes_used"], st["evictions"], 0
    out.seconds = time.perf_counter() - t0
    return out


def _out_of_memory(server: ServerProcess, psutil: Any) -> bool:
    rss, _anon = server.memory()
    return rss > MAX_SERVER_RSS or psutil.virtual_memory().available < MIN_AVAILABLE


def lookup_latency(client: Any, filled: int, samples: int | None = None, tag: bytes = b"") -> dict[str, float]:
    """QD1 lookups of random saved keys (an evicted one is a miss, answered the same way)."""
    samples = samples or LOOKUP_SAMPLES
    rng = random.Random(5)
    keys = [key_of(rng.randrange(max(1, filled)), tag) for _ in range(samples)]
    for k in keys[: samples // 10]:  # the server busy-polling, caches filled
        client.lookup_prefix(NAMESPACE, [k])
    times = []
    perf = time.perf_counter_ns
    for k in keys:
        t = perf()
        client.lookup_prefix(NAMESPACE, [k])
        times.append(perf() - t)
    times.sort()
    return {"p50": times[len(times) // 2] / 1000, "p99": times[min(len(times) - 1, int(0.99 * len(times)))] / 1000}


# --- the sizes ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _client(pool_path: Path, ring: int, timeout_s: float = 600.0, tcp: str = "") -> Iterator[Any]:
    """A client on `ring`, or over TCP at `tcp` when given (its frames carry whole batches)."""
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping

    pool = PoolMapping.open(pool_path)
    try:
        address = tcp or f"cxl://{pool_path}#{ring}"
        client = connect(address, pool=pool, timeout_s=timeout_s)
        try:
            yield client
        finally:
            client.close()
    finally:
        pool.close()


def bench_sizes(
    sizes: Sequence[int],
    *,
    block: int,
    pool_path: Path,
    tmp: Path,
    budget: Budget,
    rings: int = EXAMPLE_RINGS,
    save_blocks: int = BATCH,
    save_over: str = "cxl",
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Fill one server to each size in turn (cumulative), measuring at each; returns (sizes, pool)."""
    from belugactl.pool.file_pool import create_file_pool

    manifest = tmp / "scale.yaml"
    manifest.write_text(scale_manifest(pool_bytes=EXAMPLE_POOL_BYTES, rings=rings, journal=EXAMPLE_JOURNAL))
    create_file_pool(pool_path, manifest)
    extra = ["--restart-policy", "journal"]
    server = ServerProcess(manifest, pool_path, extra, tmp / "server.log")
    server.start(budget.deadline() + 120)
    results: list[dict[str, Any]] = []
    pool_doc: dict[str, Any] = {"path": str(pool_path), "bytes": EXAMPLE_POOL_BYTES, "rings": rings}
    try:
        with _client(pool_path, 0) as c:
            c.clear_namespace(NAMESPACE)  # opens it before the baseline
            st = c.stats()
        pool_doc["kv_area_bytes"] = st["bytes_capacity"]
        _rss0, anon0 = server.memory()
        filled = 0
        prev: dict[str, Any] | None = None
        stop_all = False
        for n in sizes:
            if stop_all or budget.left() <= 0:
                results.append({"blocks": n, "status": SKIPPED})
                continue
            doc, filled, stop_all = _one_size(
                server, pool_path, n, filled, block, anon0, budget, prev, tmp, save_blocks, save_over
            )
            results.append(doc)
            prev = doc
    finally:
        server.stop(timeout_s=30)
        server.kill()
    return results, pool_doc


def _one_size(
    server: ServerProcess,
    pool_path: Path,
    n: int,
    filled: int,
    block: int,
    anon0: int,
    budget: Budget,
    prev: dict[str, Any] | None,
    tmp: Path,
    save_blocks: int = BATCH,
    save_over: str = "cxl",
) -> tuple[dict[str, Any], int, bool]:
    doc: dict[str, Any] = {"blocks": n}
    probe = PauseProbe(pool_path, 1)
    turn0 = _dig(server.snapshot(), SERVER_LONGEST_TURN_US)
    cpu0 = server.cpu_s()
    with _client(pool_path, 0, tcp=server.record["rpc"] if save_over == "tcp" else "") as c:
        f = fill(c, server, filled, n, block, deadline=budget.deadline(), batch=save_blocks)
        cpu = server.cpu_s() - cpu0
        filled += f.filled
        doc["filled"] = filled
        doc["status"] = "done" if not f.stopped else f"partial ({f.stopped})"
        st = c.stats()
        doc["entries"] = st["entries"]
        doc["save_blocks_per_s"] = round(f.filled / (f.seconds - f.fenced_s)) if f.filled else None
        doc["fenced_s"] = round(f.fenced_s, 3)
        doc["server_cpu_us_per_block"] = round(cpu / f.filled * 1e6, 2) if f.filled else None
        pause = probe.stop()  # before the lookups: on two cores the prober would be in their figures
        doc["lookup_us"] = {k: round(v, 2) for k, v in lookup_latency(c, filled).items()}
    snap = server.snapshot()
    turn = _dig(snap, SERVER_LONGEST_TURN_US)
    pause["server_longest_s"] = None if turn is None else turn / 1e6
    pause["server_reported_before_fill_us"] = turn0
    pause["server_longest_what"] = _dig(snap, SERVER_LONGEST_TURN_WHAT)
    doc["pause"] = pause
    rss, anon = server.memory()
    doc["rss_bytes"], doc["anon_rss_bytes"] = rss, anon
    doc["bytes_per_block"] = round((anon - anon0) / st["entries"], 1) if st["entries"] else None
    used = st["bytes_used"] / st["bytes_capacity"] if st["bytes_capacity"] else 0.0
    saves = sorted(f.eviction_saves)
    doc["eviction"] = {
        "events": len(saves),
        "evicted": f.evicted,
        "used_fraction": round(used, 4),
        "save_s_p99": saves[min(len(saves) - 1, int(0.99 * len(saves)))] if saves else None,
        "save_s_max": saves[-1] if saves else None,
    }
    doc["restart"] = _restart(server, st["entries"], budget, prev, n)
    stop_all = bool(f.stopped) or doc["restart"].get("status", "done") not in ("done", SKIPPED)
    try:
        doc["mixed"] = _mixed(n, budget, tmp, doc["save_blocks_per_s"]) if not stop_all else {"status": SKIPPED}
    except BelugaError as e:  # a phase that cannot run is reported; the figures measured so far stay
        doc["mixed"] = {"status": f"failed: {e}"}
    return doc, filled, stop_all


def _restart(
    server: ServerProcess, entries: int, budget: Budget, prev: dict[str, Any] | None, n: int
) -> dict[str, Any]:
    """SIGTERM (timed to exit), then a start with the journal (timed to /readyz)."""
    last = (prev or {}).get("restart") or {}
    if last.get("ready_s") and prev:
        estimate = last["ready_s"] * n / prev["blocks"] + last["stop_s"]
        if estimate > budget.left():
            return {"status": SKIPPED, "estimate_s": round(estimate, 1)}
    stop_s = server.stop(timeout_s=max(30.0, budget.left()))
    if stop_s is None:
        return {"status": "killed: no exit after SIGTERM within the budget"}
    try:
        ready_s = server.start(budget.deadline() + 120)  # a start that began is let finish, a little past
    except EnvironmentProblem as e:
        return {"status": f"not ready: {e}", "stop_s": round(stop_s, 3)}
    return {
        "stop_s": round(stop_s, 3),
        "ready_s": round(ready_s, 3),
        "restored": int(server.record.get("restored_entries", 0)),
        "expected": entries,
    }


def mixed_manifest(n: int) -> str:
    """The mixed pool's manifest: a KV area of 1/MIXED_OVERFILL of `n` small blocks, and a journal
    that covers it in small blocks (manifest check refuses a smaller one)."""
    from belugactl.model.journal_sizing import default_journal, namespace_bytes
    from belugactl.units import align_up

    kv = align_up(int(n * SMALL_BLOCK / MIXED_OVERFILL), CHUNK_BYTES)
    journal = default_journal(kv, SMALL_BLOCK, namespace_bytes("bench-scale", 1), CHUNK_BYTES)
    return scale_manifest(
        pool_bytes=kv + journal + (16 << 20),  # the header, 4 rings, the journal, the host's partition
        rings=4,
        journal=f"{journal >> 20}MiB",
        shared_kv=f"{kv >> 20}MiB",
        min_block=f"{SMALL_BLOCK >> 10}KiB",
    )


def _mixed(n: int, budget: Budget, tmp: Path, rate: float | None) -> dict[str, Any]:
    """A server whose KV area holds 1/MIXED_OVERFILL of `n` small blocks, filled with `n` of them
    (eviction runs, every chunk is carved for the small class), then one large RESERVE."""
    from belugactl.pool.file_pool import create_file_pool

    estimate = n / (rate or 20_000) * 1.5 + 5
    if estimate > budget.left():
        return {"status": SKIPPED, "estimate_s": round(estimate, 1)}
    manifest = tmp / "mixed.yaml"
    manifest.write_text(mixed_manifest(n))
    pool_path = create_file_pool(tmp / f"mixed-{n}.pool", manifest)
    lease_ttl = MIXED_LEASE_TTL_S
    # No watermark slack: the small blocks fill every chunk, so the large reserve must make a chunk free.
    extra = ["--lease-ttl", str(lease_ttl), "--high-watermark", "1.0", "--low-watermark", "0.99"]
    server = ServerProcess(manifest, pool_path, extra, tmp / "mixed.log")
    try:
        server.start(budget.deadline() + 60)
        with _client(pool_path, 0) as c:
            c.clear_namespace(NAMESPACE)
            f = fill(c, server, 0, n, SMALL_BLOCK, deadline=budget.deadline(), tag=b"small", touch=MIXED_TOUCH)
            time.sleep(lease_ttl + 0.5)  # every lease over: what the reserve may evict is every block
            before = c.stats()
            t0 = time.perf_counter()
            refused = ""
            try:
                r = c.reserve(NAMESPACE, key_of(0, b"large"), LARGE_BLOCK)
            except Exception as e:  # noqa: BLE001 - a refusal is a figure here (POOL_FULL), not a failure
                refused, r = type(e).__name__, None
            took = time.perf_counter() - t0
            after = c.stats()
            if r is not None:
                c.abort(r.token)
    finally:
        server.stop(timeout_s=60)
        server.kill()
        with contextlib.suppress(OSError):
            pool_path.unlink()
    return {
        "status": "done" if not f.stopped else f"partial ({f.stopped})",
        "small_bytes": SMALL_BLOCK,
        "large_bytes": LARGE_BLOCK,
        "chunk_bytes": CHUNK_BYTES,
        "kv_area_bytes": before["bytes_capacity"],
        "small_saved": f.filled,
        "live_before": before["entries"],
        "evicted": after["evictions"] - before["evictions"],
        "reserve_s": round(took, 6),
        "refused": refused or None,
    }


# --- the rings ------------------------------------------------------------------------------------


def bench_rings(rings: Sequence[int], *, budget: Budget, tmp: Path, samples: int | None = None) -> list[dict[str, Any]]:
    """A fresh server on a small pool laid out with each ring count; one busy client on ring 0."""
    samples = samples or RING_SAMPLES
    from belugactl.pool.file_pool import create_file_pool
    from belugactl.workflows.bench.server import bench_rack, running_server

    out: list[dict[str, Any]] = []
    for count in rings:
        if budget.left() <= 0:
            out.append({"rings": count, "status": SKIPPED})
            continue
        manifest = tmp / f"rings-{count}.yaml"
        manifest.write_text(bench_rack(spare_rings=count - PROCESS_RINGS, slots_per_ring=SLOTS_PER_RING))
        pool_path = create_file_pool(tmp / f"rings-{count}.pool", manifest)
        doc: dict[str, Any] = {"rings": count, "status": "done"}
        try:
            with running_server(manifest, pool_path) as srv:
                for mode in ("none", "flush"):
                    doc[mode] = _ring_mode(pool_path, mode == "flush", samples)
                    snap = _stats(srv["admin"])
                    pass_us = _dig(snap, SERVER_RING_PASS_US)
                    doc[mode]["pass_us"] = pass_us
                doc["server_flushes"] = bool(snap.get("pool", {}).get("needs_flush"))
        finally:
            with contextlib.suppress(OSError):
                pool_path.unlink()
        out.append(doc)
    return out


def _stats(admin: str) -> dict[str, Any]:
    with urllib.request.urlopen(admin + "/stats", timeout=30) as r:  # noqa: S310 - loopback
        return json.loads(r.read())


def _ring_mode(pool_path: Path, flush: bool, samples: int) -> dict[str, Any]:
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.pool.mapping import PoolMapping

    pool = PoolMapping.open(pool_path)
    if flush:
        pool.needs_flush = True  # the client flushes as on a shared write-back pool (see the doc's note)
    try:
        client = connect(f"cxl://{pool_path}#0", pool=pool, timeout_s=10.0)
        try:
            key = key_of(0, b"ring")
            r = client.reserve(NAMESPACE, key, 4096)
            client.commit(r.token, _zeros_crc(4096))
            # Best of three rounds' medians: on a shared machine one round can lose its CPU throughout.
            rounds = [lookup_latency(client, 1, max(10, samples // 3), tag=b"ring") for _ in range(3)]
            look = {"p50": min(r["p50"] for r in rounds), "p99": statistics.median(r["p99"] for r in rounds)}
            payload = p.encode_lookup(client._ns_id(NAMESPACE), [key])
            ops = _native_qd128(client, payload, RING_SECONDS)
            client.delete(NAMESPACE, key)
        finally:
            client.close()
    finally:
        pool.close()
    return {"qd1_p50_us": round(look["p50"], 3), "qd1_p99_us": round(look["p99"], 2), "qd128_ops_per_s": ops}


def _native_qd128(client: Any, payload: bytes, seconds: float, qd: int = 128) -> float | None:
    """Lookups/s with `qd` in flight on one ring, generated in C (the server's capacity, not Python's)."""
    from array import array

    from belugactl.dataplane import native
    from belugactl.dataplane.rpc.protocol import Op

    burst = native.optional("rpc_burst")
    t = client.transport
    if burst is None or t.kind != "cxl":
        return None
    offsets = array("q", t._offsets)
    done = elapsed_ns = 0
    while elapsed_ns < seconds * 1e9:
        seq = t._seq  # rpc_burst keeps seq % slots == slot, as the server expects
        n, ns = burst(
            t.buf, offsets, seq, client._epoch32, int(Op.LOOKUP_PREFIX), payload, qd, 2_000, 5 * 10**9, t.flush
        )
        t._seq = seq + n
        done += n
        elapsed_ns += ns
    return round(done / (elapsed_ns / 1e9))


# --- the whole benchmark --------------------------------------------------------------------------


def bench_scale(
    *,
    sizes: Sequence[int],
    rings: Sequence[int],
    block: int = DEFAULT_BLOCK,
    pool: Path | None = None,
    budget_s: float = 1800.0,
    save_blocks: int = BATCH,
    save_over: str = "cxl",
) -> dict[str, Any]:
    """The rings first (seconds), then the sizes (minutes), all within `budget_s`; the fill saves
    `save_blocks` blocks at a time (a long prompt's save is thousands), over a CXL ring or `save_over`
    "tcp"."""
    import psutil

    budget = Budget(budget_s)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="belugactl-scale-") as tmp_name:
        tmp = Path(tmp_name)
        ring_docs = bench_rings(rings, budget=budget, tmp=tmp)
        pool_path = pool if pool is not None else tmp / "pool.bin"
        try:
            size_docs, pool_doc = bench_sizes(
                sizes,
                block=block,
                pool_path=pool_path,
                tmp=tmp,
                budget=budget,
                save_blocks=save_blocks,
                save_over=save_over,
            )
        finally:
            with contextlib.suppress(OSError):
                pool_path.unlink()
    doc: dict[str, Any] = {
        "benchmark": "mds-scale",
        "started_utc": started,
        "seconds": round(time.monotonic() - budget.start, 1),
        "budget_s": budget_s,
        "load_average_1m_at_start": round(load[0], 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "block_bytes": block,
        "blocks_per_save": save_blocks,
        "saves_over": save_over,
        "pool": pool_doc,
        "sizes": size_docs,
        "rings": ring_docs,
        "notes": [
            "bytes per block: the server's anonymous RSS (RSS less file pages: the pool's mapped pages) "
            "less its value with an empty index, over the entries; after a restart, less the first start's",
            "QD1 p50 at a ring count: the lowest of three rounds' medians; p99: their middle one",
            "mixed pool: high watermark 1.0, so the small blocks fill every chunk before the large reserve",
            "pause (client probe): the longest gap between two answers of a process asking once a millisecond "
            "(the interval included); on a shared machine the scheduler's gaps count too",
            "flush: the client flushes; the server on a file pool never does (it flushes on a shared devdax "
            "pool mapped write-back), so a pass with flushes is not measured here",
            f"server-side figures read from /stats {'.'.join(SERVER_LONGEST_TURN_US)} and "
            f"{'.'.join(SERVER_RING_PASS_US)}: 'not reported' while the server has none",
        ],
    }
    doc["table"] = [list(r) for r in report_rows(doc)]
    doc["targets"] = met_summary(report_rows(doc))
    return doc
