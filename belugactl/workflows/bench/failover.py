"""`bench failover`: the leader's death measured (issue 32's benchmark).

Per size: a sparse file pool of a bench rack whose journal covers the blocks (`failover_manifest`),
an etcd (a throwaway one on loopback, `etcd_local.py`, or `--etcd`), two `metadata-server --standby`
processes, N committed blocks of 4 KiB filled through the client's batched RESERVE_MANY /
COMMIT_MANY (the sample's blocks carry their own bytes, the rest the sparse file's zero pages, each
committed with the CRC32C of its bytes). Each kill SIGKILLs the leader and times, from the signal,
the first lookup answered by the server that took over (a prober client on its own ring, retrying
every 10 ms with a 0.2 s wait: what a CXL-RPC client waits); then counts every committed key that
no longer hits, reads back the sample's blocks (CRC32C and bytes against what was written), and
starts the killed server again as the standby. Beside it, `--with-start-empty`: the only server
SIGKILLed and a plain one started with `--restart-policy start-empty`: the time to its first answer
and its hit rate (every block a miss). Goals from the measured figures (`goals`), exit 1 when one
fails (the CLI)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from belugactl.errors import EnvironmentProblem, UsageError

NAMESPACE = "bench/failover"
RACK_NAME = "bench-failover"
BLOCK = 4096
SAMPLE = 1000  # blocks whose bytes are written and read back after every kill
BATCH = 64  # blocks a save (RESERVE_MANY + COMMIT_MANY), as `bench mds --scale`
COUNT_CHUNK = 4096  # keys a hit-counting burst
TARGET_MARGIN_S = 2.0  # the target: the leader's lease TTL + this
WAIT_S = 60.0  # a bound on any one wait past the TTL (a server's record, the first answer)
KV_HEADROOM = 1.5  # the KV area holds this many times the blocks: far below the eviction watermark
SLOT_SIZE = 1024  # the bench rack's slots: ~30 keys a lookup request instead of ~7 at 256 B
PROBER_TIMEOUT_S = 0.2
PROBER_RETRY_S = 0.01
MAIN_RING, PROBER_RING = 0, 1


@dataclass(frozen=True)
class FailoverConfig:
    kills: int = 20
    sizes: tuple[int, ...] = (100_000,)
    ttl_s: int = 5
    etcd_url: str | None = None
    start_empty: bool = True
    sample: int = SAMPLE
    # Check the checker: after the first failover, one committed block is deleted and one sampled
    # block's bytes are overwritten behind the benchmark's back; the run must count both and fail.
    faulty: bool = False
    # The standbys keep no copy of the index (`metadata-server --cold-standby`): each takeover
    # rebuilds from the journal. The default (warm) waits before each kill until the standby's copy
    # has caught up with every committed block, as a standby does between failures.
    cold_standby: bool = False


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kKmM]?)$")


def parse_sizes(text: str) -> tuple[int, ...]:
    """`100k,1M` -> (100000, 1000000): decimal counts of blocks."""
    out: list[int] = []
    for part in text.split(","):
        m = _SIZE.match(part.strip())
        n = 0
        if m:
            n = int(float(m.group(1)) * {"": 1, "k": 1000, "m": 1_000_000}[m.group(2).lower()])
        if not m or not 1 <= n <= 50_000_000:
            raise UsageError(
                f"--blocks {text!r}: {part.strip()!r} is not a block count",
                why="each size is a whole count of blocks, 1 to 50M, optionally with k (1000) or M (1000000)",
                fix="pass e.g. --blocks 100k,1M",
            )
        out.append(n)
    return tuple(out)


def size_label(n: int) -> str:
    if n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


def failover_manifest(blocks: int) -> str:
    """A one-host bench rack whose KV area holds `blocks` 4 KiB blocks with room to spare (no eviction)
    and whose journal covers the whole area at 4 KiB (min_block), so every commit is journaled."""
    from belugactl.model.journal_sizing import journal_bytes, namespace_bytes

    mib = 1 << 20
    align = 2 * mib  # the pool's align: every region a multiple of it
    kv = max(64 * mib, -(-int(blocks * BLOCK * KV_HEADROOM) // align) * align)
    journal = -(-journal_bytes(kv, BLOCK, namespace_bytes(RACK_NAME, 1)) // align) * align
    pool = kv + journal + 64 * mib  # header, rings, alignment
    return f"""\
version: 1
name: {RACK_NAME}
pool:
  source: {{kind: cxl-region, memdevs: all, type: ram}}
  size: {pool // mib}MiB
  align: 2MiB
layout:
  metadata:
    slots_per_ring: 128
    slot_size: {SLOT_SIZE}B
    spare_rings: 2
    journal: {journal // mib}MiB
    min_block: 4KiB
  shared_kv: {kv // mib}MiB
hosts:
  - name: bench-0
    address: 127.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {{cpu_nodes: 1, cxl_nodes: 1}}
    gpus: {{count: 1, model: L40S}}
serve:
  metadata: {{client_live_leases: 1073741824}}
  vllm:
    model: bench/model
    instances_per_host: 1
"""


def key_of(i: int) -> bytes:
    import hashlib

    return hashlib.blake2b(b"failover" + i.to_bytes(8, "little"), digest_size=32).digest()


def block_bytes(key: bytes) -> bytes:
    return key * (BLOCK // len(key))


def sample_indices(blocks: int, sample: int) -> list[int]:
    n = min(blocks, sample)
    return sorted({i * blocks // n for i in range(n)}) if n else []


# --- the servers ----------------------------------------------------------------------------------


class Server:
    """One `belugactl metadata-server` child; its JSON records read with a deadline."""

    def __init__(self, argv: list[str], log: Path) -> None:
        with log.open("a") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)  # noqa: S603
        self.log = log
        self.warm: dict[str, Any] | None = None
        self.admin = ""  # its admin URL, from its records
        # Lines read by a thread: a select() on the pipe would miss a second record already in the
        # reader's buffer (a standby's "warm" and "started" can come together).
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name="bench failover: a server's records", daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with suppress(ValueError, OSError):  # the pipe closed under the reader
            for line in self.proc.stdout:
                self.lines.put(line)
                with self.log.open("a") as log:  # beside its stderr, for whoever reads the log
                    log.write(line)
        self.lines.put(None)

    def record(self, timeout_s: float) -> dict[str, Any]:
        with suppress(queue.Empty):
            line = self.lines.get(timeout=timeout_s)
            if line is not None:
                return json.loads(line)
        self.kill()
        tail = self.log.read_text(errors="replace")[-2000:]
        raise EnvironmentProblem(
            f"a metadata server printed no record within {timeout_s:g} s (or exited)",
            why=tail or None,
            fix="see the server's log above; a loaded machine may need a longer --ttl",
        )

    def expect(self, event: str, timeout_s: float) -> dict[str, Any]:
        """The next record, which must be `event`. A "warm" record (a standby's copy of the index
        caught up with the journal) comes at its own time: kept aside unless it is the one asked for."""
        if event == "warm" and self.warm is not None:
            return self.warm
        rec = self.record(timeout_s)
        while rec.get("event") == "warm" and event != "warm":
            self.warm = rec
            rec = self.record(timeout_s)
        if rec.get("event", "started") != event:
            raise EnvironmentProblem(f"a metadata server reported {rec.get('event')!r}, not {event!r}", why=str(rec))
        if rec.get("admin"):
            self.admin = rec["admin"]
        return rec

    def sigkill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def server_argv(manifest: Path, pool: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
        "--rpc-port", "0", "--admin-port", "0", "--fence-grace", "0", "--json", *extra,
    ]  # fmt: skip


def standby_argv(manifest: Path, pool: Path, etcd: str, member: str, ttl: int, cold: bool = False) -> list[str]:
    extra = ("--cold-standby",) if cold else ()
    return server_argv(
        manifest, pool, "--standby", "--etcd", etcd, "--member", member, "--leader-ttl", str(ttl), *extra
    )


def wait_caught_up(server: Server, entries: int, timeout_s: float) -> float:
    """Until the standby's copy of the index holds `entries` and has caught up with the journal
    (its /stats); the seconds it took. EnvironmentProblem when it does not within `timeout_s`."""
    import urllib.request

    t0 = time.monotonic()
    end = t0 + timeout_s
    follow: dict[str, Any] = {}
    while time.monotonic() < end:
        with suppress(OSError, ValueError):
            with urllib.request.urlopen(server.admin + "/stats", timeout=2) as r:  # noqa: S310 - loopback
                follow = json.loads(r.read()).get("follow") or {}
            if follow.get("warm") and follow.get("entries") == entries:
                return time.monotonic() - t0
        time.sleep(0.1)
    raise EnvironmentProblem(
        f"the standby's copy of the index did not catch up within {timeout_s:g} s",
        why=f"it holds {follow.get('entries')} of {entries} entries ({follow})",
        fix="a loaded machine may need fewer --blocks; --cold-standby measures without the copy",
    )


# --- the client's side ------------------------------------------------------------------------------


def fill(client: Any, pool: Any, keys: Sequence[bytes], sample: set[int]) -> float:
    """Commit every key (batched); the sample's blocks carry their bytes. Returns the seconds taken."""
    from belugactl.dataplane import native
    from belugactl.dataplane.rpc.protocol import Code

    zero_crc = native.crc32c(bytes(BLOCK))
    t0 = time.perf_counter()
    i = 0
    while i < len(keys):
        n = min(BATCH, len(keys) - i)
        got = client.reserve_many(NAMESPACE, [(keys[j], BLOCK) for j in range(i, i + n)])
        refused = [r for r in got if isinstance(r, int)]
        if refused:
            if {int(r) for r in refused} == {int(Code.NOT_READY)}:  # fenced just after a start
                for r in got:
                    if not isinstance(r, int):
                        client.abort(r.token)
                time.sleep(0.05)
                continue
            raise EnvironmentProblem(
                f"the fill was refused at block {i:,}: {sorted({Code(int(r)).name for r in refused})}",
                why="the bench rack's pool should hold every block with room to spare",
            )
        commits = []
        for j, r in zip(range(i, i + n), got, strict=True):
            if j in sample:
                data = block_bytes(keys[j])
                pool.write(r.extents[0][0], data)
                commits.append((r.token, native.crc32c(data)))
            else:
                commits.append((r.token, zero_crc))
        codes = client.commit_many(commits)
        if any(int(c) for c in codes):
            raise EnvironmentProblem(
                f"a commit of the fill was refused at block {i:,}: {sorted({int(c) for c in codes})}"
            )
        i += n
    return time.perf_counter() - t0


def count_hits(client: Any, keys: Sequence[bytes]) -> int:
    """How many of `keys` are committed: GET_MANY in bursts (one answer a key, hit or miss), leases
    handed back at once."""
    hits = 0
    for start in range(0, len(keys), COUNT_CHUNK):
        got = client.get_many_tuples(NAMESPACE, keys[start : start + COUNT_CHUNK])
        leases = [t[1] for t in got if t is not None]
        hits += len(leases)
        if leases:
            with suppress(Exception):
                client.release(leases)
    return hits


def check_sample(client: Any, pool: Any, keys: Sequence[bytes], sample: Sequence[int]) -> tuple[int, int]:
    """Read back the sample's blocks: (wrong reads, wrong bytes). A miss is not a wrong read (counted
    as lost); a block whose CRC32C or bytes differ from what was written is."""
    from belugactl.dataplane.client import copy_verified
    from belugactl.dataplane.metadata_errors import CorruptBlock

    reads = bytes_wrong = 0
    locs = client.get_many(NAMESPACE, [keys[i] for i in sample])
    leases = []
    buf = bytearray(BLOCK)
    for i, loc in zip(sample, locs, strict=True):
        if loc is None:
            continue
        leases.append(loc.lease_id)
        want = block_bytes(keys[i])
        crc_ok = True
        try:
            copy_verified(pool.buf, loc, buf, key=keys[i])
        except CorruptBlock:
            crc_ok = False
        if not crc_ok or bytes(buf) != want:
            reads += 1
            bytes_wrong += sum(a != b for a, b in zip(buf, want, strict=True)) or BLOCK
    if leases:
        with suppress(Exception):
            client.release(leases)
    return reads, bytes_wrong


def first_answer(prober: Any, key: bytes, since: float, timeout_s: float) -> tuple[float, bool]:
    """Retry one lookup until a server answers: (seconds since `since`, whether it was a hit)."""
    from belugactl.dataplane.metadata_errors import MetadataError

    while True:
        if time.monotonic() - since > timeout_s:
            raise EnvironmentProblem(f"no server answered a lookup within {timeout_s:g} s of the kill")
        try:
            prober.reconnect()
            hit = prober.lookup_prefix(NAMESPACE, [key]) == 1
            return time.monotonic() - since, hit
        except MetadataError:
            time.sleep(PROBER_RETRY_S)


@contextmanager
def _clients(pool_path: Path) -> Iterator[tuple[Any, Any, Any]]:
    from belugactl.dataplane.client import connect
    from belugactl.pool.mapping import PoolMapping

    pool = PoolMapping.open(pool_path)
    try:
        client = connect(f"cxl://{pool_path}#{MAIN_RING}", pool=pool, timeout_s=120)
        prober = connect(f"cxl://{pool_path}#{PROBER_RING}", pool=pool, timeout_s=PROBER_TIMEOUT_S)
        try:
            yield client, prober, pool
        finally:
            client.close()
            prober.close()
    finally:
        pool.close()


def _reconnect(client: Any, timeout_s: float) -> None:
    from belugactl.dataplane.metadata_errors import MetadataError

    end = time.monotonic() + timeout_s
    while True:
        try:
            client.reconnect()
            return
        except MetadataError:
            if time.monotonic() > end:
                raise
            time.sleep(PROBER_RETRY_S)


# --- one size -------------------------------------------------------------------------------------


def run_size(cfg: FailoverConfig, blocks: int, etcd: str, tmp: Path, say: Callable[[str], None]) -> dict[str, Any]:
    from belugactl.pool.file_pool import create_file_pool

    label = size_label(blocks)
    manifest = tmp / f"failover-{label}.yaml"
    manifest.write_text(failover_manifest(blocks))
    pool_path = tmp / f"pool-{label}"
    create_file_pool(pool_path, manifest)
    names = (f"mds-a-{label}-{os.getpid()}", f"mds-b-{label}-{os.getpid()}")
    wait = cfg.ttl_s + WAIT_S
    servers: dict[str, Server] = {}
    row: dict[str, Any] = {"blocks": blocks, "label": label, "block_bytes": BLOCK, "kills": cfg.kills}
    try:
        for name in names:  # the first leads before the second starts (a previous size's lease may still lapse)
            servers[name] = Server(
                standby_argv(manifest, pool_path, etcd, name, cfg.ttl_s, cfg.cold_standby), tmp / f"{name}.log"
            )
            servers[name].expect("standby", wait)
            if name == names[0]:
                servers[name].expect("started", wait)
        leader = names[0]
        keys = [key_of(i) for i in range(blocks)]
        sample = sample_indices(blocks, cfg.sample)
        with _clients(pool_path) as (client, prober, pool):
            say(f"{label}: filling {blocks:,} blocks")
            row["fill_s"] = round(fill(client, pool, keys, set(sample)), 3)
            before = count_hits(client, keys)
            row["hit_rate_before"] = before / blocks
            times: list[float] = []
            first_hits = wrong_reads = wrong_bytes = 0
            least_hits = before
            hit_after: list[float] = []
            rebuilds: list[float] = []  # the new leader's own: from winning the election to serving
            restored = None
            live_now = before  # committed blocks the leader holds now
            catch_up: list[float] = []  # a standby's copy catching up before a kill (warm standbys)
            warm_takeovers = 0
            for k in range(cfg.kills):
                other = names[1] if leader == names[0] else names[0]
                if not cfg.cold_standby:
                    catch_up.append(wait_caught_up(servers[other], live_now, wait + blocks / 10_000))
                killed = time.monotonic()
                servers[leader].sigkill()
                took, hit = first_answer(prober, keys[sample[0]] if sample else keys[0], killed, wait)
                times.append(took)
                first_hits += hit
                rec = servers[other].expect("started", wait)
                if isinstance(rec.get("took_s"), (int, float)):
                    rebuilds.append(float(rec["took_s"]))
                restored = rec.get("restored_entries")
                warm_takeovers += bool(rec.get("warm"))
                _reconnect(client, wait)
                if cfg.faulty and k == 0:
                    _inject_faults(client, pool, keys, sample)
                hits = count_hits(client, keys)
                live_now = hits
                hit_after.append(hits / blocks)
                least_hits = min(least_hits, hits)  # a block lost at one kill stays lost: count it once
                r, b = check_sample(client, pool, keys, sample)
                wrong_reads += r
                wrong_bytes += b
                say(f"{label}: kill {k + 1}/{cfg.kills}: first answer {took:.2f} s, {before - hits} missing, {r} wrong")
                servers[leader] = Server(
                    standby_argv(manifest, pool_path, etcd, leader, cfg.ttl_s, cfg.cold_standby), tmp / f"{leader}.log"
                )
                servers[leader].expect("standby", wait)
                leader = other
            row.update(
                first_answer_s=_summary(times), first_answer_hits=first_hits, committed_blocks_lost=before - least_hits,
                wrong_reads=wrong_reads, wrong_bytes_served=wrong_bytes, sample_blocks=len(sample),
                hit_rate_after=min(hit_after) if hit_after else None,
                takeover_rebuild_s=_summary(rebuilds), restored_entries=restored,
                standby="cold" if cfg.cold_standby else "warm", warm_takeovers=warm_takeovers,
                standby_catch_up_s=_summary(catch_up) if catch_up else None,
            )  # fmt: skip
            if cfg.start_empty:
                row["start_empty"] = _start_empty(servers, leader, manifest, pool_path, prober, client, keys, tmp, wait)
                say(f"{label}: start-empty: first answer {row['start_empty']['first_answer_s']:.2f} s")
    finally:
        for s in servers.values():
            s.stop()
    return row


def _inject_faults(client: Any, pool: Any, keys: Sequence[bytes], sample: Sequence[int]) -> None:
    """--faulty: a committed block gone (the last key) and one sampled block's bytes changed."""
    client.delete(NAMESPACE, keys[-1])
    victim = keys[sample[len(sample) // 2]]
    loc = client.get(NAMESPACE, victim)
    if loc is not None:
        pool.write(loc.extents[0][0], bytes(b ^ 0xFF for b in pool.read(loc.extents[0][0], 16)))
        with suppress(Exception):
            client.release([loc.lease_id])


def _start_empty(
    servers: dict[str, Server], leader: str, manifest: Path, pool_path: Path, prober: Any, client: Any,
    keys: Sequence[bytes], tmp: Path, wait: float,
) -> dict[str, Any]:  # fmt: skip
    """The only server SIGKILLed, a plain one started with --restart-policy start-empty: its first
    answer from the kill, and the hit rate after."""
    for name, s in servers.items():
        if name != leader:
            s.stop()  # the standby goes first: the leader is the only server
    killed = time.monotonic()
    servers[leader].sigkill()
    servers["start-empty"] = Server(
        server_argv(manifest, pool_path, "--restart-policy", "start-empty"), tmp / "start-empty.log"
    )
    took, hit = first_answer(prober, keys[0], killed, wait)
    servers["start-empty"].expect("started", wait)
    _reconnect(client, wait)
    hits = count_hits(client, keys)
    return {
        "first_answer_s": round(took, 3), "first_answer_hit": hit, "hit_rate_after": hits / len(keys),
        "committed_blocks_lost": len(keys) - hits,
    }  # fmt: skip


def _summary(times: Sequence[float]) -> dict[str, Any]:
    if not times:
        return {"p50": None, "max": None, "all": []}
    return {
        "p50": round(statistics.median(times), 3),
        "max": round(max(times), 3),
        "all": [round(t, 3) for t in times],
    }


# --- goals ----------------------------------------------------------------------------------------


def goals(row: dict[str, Any], ttl_s: int) -> list[dict[str, Any]]:
    """Issue 32's goals for one size, judged from its measured figures only."""
    label = row["label"]
    if "error" in row:
        return [{"goal": f"{label}: measured", "want": "the run completes", "figure": row["error"], "ok": False}]
    target = ttl_s + TARGET_MARGIN_S
    fa = row["first_answer_s"]
    out = []
    if fa["max"] is not None:
        out.append({
            "goal": f"{label}: first answer after the kill (p50 / max)", "want": f"<= {target:g} s (TTL + 2 s)",
            "figure": f"{fa['p50']:g} / {fa['max']:g} s", "ok": fa["max"] <= target,
        })  # fmt: skip
    lost = row["committed_blocks_lost"]
    out.append({"goal": f"{label}: committed blocks lost", "want": "0", "figure": f"{lost:,}", "ok": lost == 0})
    wrong = row["wrong_reads"]
    out.append({
        "goal": f"{label}: wrong bytes served ({row['sample_blocks']:,} blocks read back a kill)", "want": "0",
        "figure": f"{row['wrong_bytes_served']:,} bytes ({wrong:,} wrong reads)", "ok": wrong == 0,
    })  # fmt: skip
    before, after = row["hit_rate_before"], row["hit_rate_after"]
    out.append({
        "goal": f"{label}: hit rate after failover (worst kill)", "want": f"= before ({before:.4f})",
        "figure": "-" if after is None else f"{after:.4f}", "ok": after is None or after >= before,
    })  # fmt: skip
    return out


def judge(report: dict[str, Any]) -> dict[str, Any]:
    """Add the goals and `failed` to a report of measured sizes."""
    report["goals"] = [g for row in report["sizes"] for g in goals(row, report["ttl_s"])]
    report["failed"] = any(g["ok"] is False for g in report["goals"])
    return report


def _size_or_error(
    cfg: FailoverConfig, blocks: int, etcd: str, tmp: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """One size's row; a size that could not be measured is a row with its error (the other sizes'
    figures are kept, and the run fails)."""
    try:
        return run_size(cfg, blocks, etcd, tmp, say)
    except EnvironmentProblem as exc:
        why = f" ({exc.why.strip()[-300:]})" if getattr(exc, "why", None) else ""
        say(f"{size_label(blocks)}: not measured: {exc}{why}")
        return {"blocks": blocks, "label": size_label(blocks), "error": f"{exc}{why}"}


def run_failover(cfg: FailoverConfig, say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    from belugactl.workflows.bench.etcd_local import local_etcd

    if cfg.kills < 1:
        raise UsageError(f"--kills {cfg.kills}: at least 1", fix="pass e.g. --kills 20")
    if not 2 <= cfg.ttl_s <= 60:
        raise UsageError(f"--ttl {cfg.ttl_s}: the leader's lease TTL is 2..60 whole seconds", fix="pass e.g. --ttl 5")
    with ExitStack() as stack:
        etcd_url = cfg.etcd_url or stack.enter_context(local_etcd()).url
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="beluga-failover-")))
        rows = [_size_or_error(cfg, n, etcd_url, tmp, say) for n in cfg.sizes]
    return judge({
        "kills": cfg.kills, "ttl_s": cfg.ttl_s, "target_s": cfg.ttl_s + TARGET_MARGIN_S,
        "etcd": cfg.etcd_url or "local (loopback, started for the run)", "sizes": rows,
    })  # fmt: skip
