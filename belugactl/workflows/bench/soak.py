"""`belugactl bench soak`: the KV path under faults, checked byte for byte.

A real `belugactl metadata-server` process serves a file pool made by `belugactl pool create-file`.
Writer and reader processes, half over CXL-RPC rings (`cxl://<pool>#<ring>`) and half over TCP,
put and get blocks of mixed sizes through the public client API (`dataplane.client.connect`);
the pool is far smaller than the key space, so the server evicts all the time. Meanwhile the
server is SIGKILLed and restarted, and clients are SIGKILLed in the middle of their work and
replaced (a killed CXL client's ring is taken over by its replacement).

The checker: a block's bytes are a function of its key and a nonce its writer picked (each 4 KiB
page: nonce and page index, then a slice of a SHAKE-128 pad of key and nonce). A reader that gets a key's extents
under a lease copies them and checks every byte. A read is void, not wrong, when the server
restarted during the copy (the pool epoch moved) or the lease ran out before the copy ended: a
connector must drop such a read too.

Checksums: writers commit the CRC32C of the bytes they store (computed while copying them into the
pool); readers copy a block out while checking it (`client.copy_verified`). A mismatch is
`corrupt_detected`: caught, treated as a miss, and the key deleted so later readers miss too (what
the connector does). A stalled writer (`--stall-writers`) that overwrites extents reclaimed and
handed to another block produces exactly that. Anything a reader accepted that differs from its
key's content is `wrong_bytes_served` (the goal: 0). The faulty writer (`--faulty-writer`) puts
another key's bytes with a checksum that matches them, so only the byte checker can catch it: the
checker stays able to fail.

Workers write their counters to a small JSON file every few hundred milliseconds, so a worker
killed mid-run still counts up to its last snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.errors import EnvironmentProblem, UsageError

NAMESPACE = "soak/tp0"
HEADER = 16  # nonce (8 B) + page index (8 B) at the start of every 4 KiB page
_PAGE = 4096
_PAD = 64 << 10
_PAGE_HEAD = struct.Struct("<QQ")
# Block sizes of a few model layouts, one a key (derived from the key, so a reader knows it):
# small, sub-chunk, the 1.25 and 1.5 MiB that starved the old allocator, and multi-chunk.
SIZES = (16 << 10, 64 << 10, 160 << 10, 700_000, 5 << 18, 3 << 19, 2_621_440)

SOAK_RACK = """\
version: 1
name: bench-soak
pool:
  source: {{kind: cxl-region, memdevs: all, type: ram}}
  size: {pool_mib}MiB
  align: 2MiB
layout:
  metadata: {{slots_per_ring: 16, slot_size: 512B, spare_rings: {rings}, journal: 4MiB}}
  shared_kv: {kv_mib}MiB
  partition_size: equal
hosts:
  - name: soak-0
    address: 127.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {{cpu_nodes: 1, cxl_nodes: 1}}
    gpus: {{count: 1, model: L40S}}
serve:
  vllm:
    model: soak/model
    instances_per_host: 1
"""


# --- the checker ------------------------------------------------------------------------------------


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"soak-key-%d" % i).digest()


def size_of(key: bytes) -> int:
    return SIZES[key[0] % len(SIZES)]


def block_bytes(key: bytes, nonce: int, nbytes: int) -> bytes:
    """Every 4 KiB page: the nonce and the page's index (16 B), then its slice of a 64 KiB pad drawn
    from SHAKE-128(key, nonce). Cheap to make and to check, and a page out of place, another
    writer's page or another key's page all differ."""
    pad = hashlib.shake_128(key + nonce.to_bytes(8, "little")).digest(_PAD)
    parts = []
    for p in range(-(-nbytes // _PAGE)):
        parts.append(_PAGE_HEAD.pack(nonce, p))
        at = (p % (_PAD // _PAGE)) * _PAGE
        parts.append(pad[at + HEADER : at + _PAGE])
    return b"".join(parts)[:nbytes]


def wrong_bytes(key: bytes, data: bytes, nbytes: int) -> int:
    """How many bytes of `data` differ from what any writer of `key` could have written (0: good)."""
    if len(data) != nbytes or nbytes != size_of(key):
        return max(len(data), nbytes)
    nonce = int.from_bytes(data[:8], "little")
    want = block_bytes(key, nonce, nbytes)
    if data == want:
        return 0
    return sum(1 for a, b in zip(data, want, strict=True) if a != b)


# --- a worker process ---------------------------------------------------------------------------------


@dataclass
class WorkerCounts:
    ops: int = 0  # requests the server answered (refusals included)
    refused: int = 0  # reservations refused: key present or being written, or pool full
    committed: int = 0
    reads_verified: int = 0
    reads_void: int = 0
    misses: int = 0
    wrong_reads: int = 0
    wrong_bytes: int = 0
    corrupt_detected: int = 0  # reads whose CRC32C did not match: caught, treated as misses
    stalled: int = 0  # writes that stalled between their fence check and their stores (--stall-writers)
    errors: dict[str, int] = field(default_factory=dict)
    error_reasons: dict[str, int] = field(default_factory=dict)  # a few distinct messages, counted
    wrong_examples: list[str] = field(default_factory=list)


def _worker(spec: dict[str, Any]) -> int:
    """One writer or reader, until its deadline or SIGTERM. Never raises for a server fault."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError
    from belugactl.pool.mapping import PoolMapping

    stop = False

    def _term(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    rng = random.Random(spec["seed"])
    counts = WorkerCounts()
    out = Path(spec["out"])
    pool = PoolMapping.open(spec["pool"])
    client = None
    last_dump = 0.0
    deadline = time.monotonic() + spec["seconds"]
    keys = spec["keys"]
    lease_ttl = spec["lease_ttl"]

    def dump() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(vars(counts)))
        os.replace(tmp, out)

    def count_error(exc: BaseException) -> None:
        name = type(exc).__name__
        counts.errors[name] = counts.errors.get(name, 0) + 1
        why = f"{name}: {getattr(exc, 'why', None) or exc}"
        if why in counts.error_reasons or len(counts.error_reasons) < 8:
            counts.error_reasons[why] = counts.error_reasons.get(why, 0) + 1

    while not stop and time.monotonic() < deadline:
        now = time.monotonic()
        if now - last_dump > 0.2:
            dump()
            last_dump = now
        if client is None:
            try:
                # A generous timeout: on a loaded host a slow answer is not a dead server.
                client = connect(
                    spec["address"], pool=pool if spec["address"].startswith("cxl") else None, timeout_s=5.0
                )
            except MetadataError as exc:
                count_error(exc)
                time.sleep(0.05)
                continue
        key = key_of(rng.randrange(keys))
        try:
            if spec["role"] == "writer":
                _write_one(
                    client,
                    pool,
                    key,
                    rng,
                    counts,
                    spec.get("faulty", False),
                    spec.get("stall", 0.0),
                    spec["reservation_ttl"],
                )
            else:
                _read_one(client, pool, key, counts, lease_ttl)
            counts.ops += 1
        except MetadataError as exc:
            count_error(exc)
            name = type(exc).__name__
            if name == "MetadataUnavailable":
                time.sleep(0.05)  # down or in its fencing grace: the next call reconnects
            elif name == "StaleEpoch":
                with contextlib.suppress(MetadataError):
                    client.reconnect()
            else:
                counts.ops += 1  # answered with a refusal (exists, pool full, ...): an op all the same
    dump()
    return 0


def _write_one(
    client: Any,
    pool: Any,
    key: bytes,
    rng: random.Random,
    counts: WorkerCounts,
    faulty: bool,
    stall: float,
    reservation_ttl: float,
    timings: list[float] | None = None,
) -> None:
    """One put. `timings` (bench soak --mixed): a committed save's seconds from RESERVE sent to
    COMMIT answered (the copy and checksum included) is appended to it."""
    from belugactl.dataplane import native
    from belugactl.dataplane.metadata_errors import AlreadyPresent, PoolFull

    nbytes = size_of(key)
    t0 = time.monotonic()
    try:
        r = client.reserve(NAMESPACE, key, nbytes)
    except (AlreadyPresent, PoolFull) as exc:
        counts.errors[type(exc).__name__] = counts.errors.get(type(exc).__name__, 0) + 1
        counts.refused += 1
        return
    data = block_bytes(key, rng.getrandbits(63) | 1, nbytes)
    if faulty and rng.random() < 0.5:
        # The checker's own check: a buggy writer puts another key's bytes (same size) here.
        other = next(k for k in (key_of(rng.randrange(1 << 30)) for _ in range(1000)) if size_of(k) == nbytes)
        data = block_bytes(other, rng.getrandbits(63) | 1, nbytes)
    # What a connector checks before its stores: the server has not restarted and the
    # reservation has not outlived its TTL (after which the server hands the extents out again).
    if pool.epoch() != client.epoch or time.monotonic() - t0 > reservation_ttl / 2:
        return
    if stall and rng.random() < stall:
        # A writer stalled between that check and its stores (preempted, paging, a GC pause),
        # past a restart or its reservation's TTL: its extents may belong to another block now.
        counts.stalled += 1
        time.sleep(rng.uniform(0.5, 8.0))
    # Store and checksum in one pass (what a connector does with host memory). The faulty
    # writer's checksum matches the wrong bytes it stores: only the byte checker can see them.
    pos = 0
    crc = 0
    for off, n in r.extents:
        take = min(n, nbytes - pos)
        if take <= 0:
            break
        if pool.needs_flush:
            pool.write(off, data[pos : pos + take])
            crc = native.crc32c(data, pos, take, crc)
        else:
            crc = native.copy_crc32c(pool.buf, off, data, pos, take, crc)
        pos += take
    if rng.random() < 0.03:
        client.abort(r.token)
        return
    client.commit(r.token, checksum=crc)
    counts.committed += 1
    if timings is not None:
        timings.append(time.monotonic() - t0)


def _read_one(
    client: Any, pool: Any, key: bytes, counts: WorkerCounts, lease_ttl: float, timings: list[float] | None = None
) -> None:
    """One get, copied out and checked byte for byte. `timings` (bench soak --mixed): the lookup's
    seconds (GET sent to answered, hit or miss) is appended to it."""
    from belugactl.dataplane import native
    from belugactl.dataplane.client import copy_verified
    from belugactl.dataplane.metadata_errors import CorruptBlock

    epoch = client.epoch
    t0 = time.monotonic()
    loc = client.get(NAMESPACE, key)
    if timings is not None:
        timings.append(time.monotonic() - t0)
    if loc is None:
        counts.misses += 1
        return
    corrupt = False
    try:
        out = bytearray(loc.nbytes)
        if pool.needs_flush:
            for off, n in loc.extents:
                native.flush(pool.buf, off, n, True)
        try:
            copy_verified(pool.buf, loc, out, key=key)
        except CorruptBlock:
            corrupt = True
        data = bytes(out)
        # Void, as a connector must treat it: the server restarted (the lease and the extents
        # belong to a dead epoch) or the lease may have lapsed during the copy.
        if pool.epoch() != epoch or client.epoch != epoch or time.monotonic() - t0 > lease_ttl / 2:
            counts.reads_void += 1
            return
        if corrupt:
            # Caught: a miss for this reader, and the key goes so later readers miss too.
            counts.corrupt_detected += 1
            client.delete(NAMESPACE, key)
            return
        bad = wrong_bytes(key, data, loc.nbytes)
        if bad:
            counts.wrong_reads += 1
            counts.wrong_bytes += bad
            if len(counts.wrong_examples) < 5:
                counts.wrong_examples.append(
                    f"key {key[:8].hex()} epoch {epoch} nbytes {loc.nbytes} extents {loc.extents[:4]}: "
                    f"{bad} bytes differ"
                )
        else:
            counts.reads_verified += 1
    finally:
        client.release([loc.lease_id])


# --- the orchestrator -----------------------------------------------------------------------------------


@dataclass
class SoakConfig:
    seconds: float = 30.0
    ops: int = 0  # 0: no op bound
    writers: int = 4
    readers: int = 4
    keys: int = 300
    kv_mib: int = 64
    restart_every_s: float = 8.0
    kill_every_s: float = 3.0
    restart_policy: str = "journal"
    lease_ttl_s: float = 5.0
    reservation_ttl_s: float = 3.0
    fence_grace_s: float | None = None  # None: the server's default
    faulty_writer: bool = False  # writer 0 writes wrong bytes half the time: proves the checker sees them
    stall_writers: float = 0.0  # fraction of writes that stall 0.5-8 s between epoch check and stores
    seed: int = 1
    # Two metadata servers elected through a throwaway etcd on loopback: each "restart" SIGKILLs the
    # leader, the standby takes over, and the killed one comes back as the new standby.
    elected: bool = False
    leader_ttl_s: int = 2

    def check(self) -> None:
        if not 0 < self.seconds <= 86_400:
            raise UsageError(f"--seconds {self.seconds} is out of range", fix="give 1 to 86400 seconds")
        if self.ops < 0:
            raise UsageError("--ops must be 0 (no bound) or positive")
        if not (1 <= self.writers <= 64 and 1 <= self.readers <= 64):
            raise UsageError("--writers and --readers must be between 1 and 64")
        if not 16 <= self.keys <= 10_000_000:
            raise UsageError("--keys must be between 16 and 10000000")
        if not 16 <= self.kv_mib <= 65536:
            raise UsageError("--kv-mib must be between 16 and 65536")
        if not 0.5 <= self.reservation_ttl_s <= 3600:
            raise UsageError("--reservation-ttl must be between 0.5 and 3600 seconds")
        if not 0 <= self.stall_writers <= 1:
            raise UsageError("--stall-writers is a fraction between 0 and 1")
        if self.restart_policy not in ("start-empty", "journal"):
            raise UsageError(f"unknown restart policy {self.restart_policy!r}", fix="use start-empty or journal")
        if self.elected and self.restart_policy != "journal":
            raise UsageError(
                "--elected with --restart-policy start-empty",
                why="a standby takes over with the index the journal keeps",
                fix="drop --restart-policy (journal is the default)",
            )
        if self.elected and not 2 <= self.leader_ttl_s <= 60:
            raise UsageError("--leader-ttl must be between 2 and 60 seconds")


class _Server:
    """The metadata server as a child process, driven through its CLI only."""

    def __init__(
        self, manifest: Path, pool: Path, port: int, cfg: SoakConfig, log: Path, extra: tuple[str, ...] = ()
    ) -> None:
        self.argv = [
            sys.executable, "-m", "belugactl", "metadata-server", "-f", str(manifest), "--pool", str(pool),
            "--rpc-port", str(port), "--admin-port", "0", "--json", "--restart-policy", cfg.restart_policy,
            "--lease-ttl", str(cfg.lease_ttl_s), "--reservation-ttl", str(cfg.reservation_ttl_s),
        ]  # fmt: skip
        if cfg.fence_grace_s is not None:
            self.argv += ["--fence-grace", str(cfg.fence_grace_s)]
        self.argv += list(extra)
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.record: dict[str, Any] = {}

    def start(self) -> None:
        with self.log.open("a") as err:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=err, text=True)  # noqa: S603
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise EnvironmentProblem(
                "the metadata server did not start", why=self.log.read_text()[-2000:], fix="see the server log above"
            )
        self.record = json.loads(line)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self) -> None:
        """SIGKILL, then start again on the same pool (its journal, under restart policy journal)."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class _Elected:
    """Two `metadata-server --standby` members on one pool, elected through etcd: `restart()` SIGKILLs
    the leader, waits for the standby's takeover and starts the killed one again as the standby. TCP
    clients name both (a candidates list); CXL clients keep their rings, which the new leader serves."""

    def __init__(self, manifest: Path, pool: Path, etcd: str, cfg: SoakConfig, workdir: Path) -> None:
        self.ports = {"soak-a": _free_port(), "soak-b": _free_port()}
        self.manifest, self.pool, self.etcd, self.cfg, self.workdir = manifest, pool, etcd, cfg, workdir
        self.members: dict[str, Any] = {}
        self.leader = "soak-a"
        self.takeovers: list[float] = []  # SIGKILL of the leader to the standby's "started", seconds
        self.warm_takeovers = 0

    @property
    def address(self) -> str:
        return "tcp://" + ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def _launch(self, name: str) -> Any:
        from belugactl.workflows.bench.failover import Server

        cfg = self.cfg
        argv = [
            sys.executable, "-m", "belugactl", "metadata-server", "-f", str(self.manifest), "--pool", str(self.pool),
            "--rpc-port", str(self.ports[name]), "--admin-port", "0", "--json",
            "--lease-ttl", str(cfg.lease_ttl_s), "--reservation-ttl", str(cfg.reservation_ttl_s),
            "--standby", "--etcd", self.etcd, "--member", name, "--leader-ttl", str(cfg.leader_ttl_s),
        ]  # fmt: skip
        if cfg.fence_grace_s is not None:
            argv += ["--fence-grace", str(cfg.fence_grace_s)]
        server = self.members[name] = Server(argv, self.workdir / f"{name}.log")
        server.expect("standby", self._wait_s)
        return server

    @property
    def _wait_s(self) -> float:
        return self.cfg.leader_ttl_s + 30.0

    def start(self) -> None:
        """The first member leads before the second starts, which stands by."""
        self._launch("soak-a").expect("started", self._wait_s)
        self._launch("soak-b")

    def restart(self) -> None:
        killed, other = self.leader, "soak-b" if self.leader == "soak-a" else "soak-a"
        t0 = time.monotonic()
        self.members[killed].sigkill()
        rec = self.members[other].expect("started", self._wait_s)
        self.takeovers.append(time.monotonic() - t0)
        self.warm_takeovers += bool(rec.get("warm"))
        self.leader = other
        self._launch(killed)

    def stop(self) -> None:
        for server in self.members.values():
            server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(argv: list[str]) -> None:
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "belugactl", *argv], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode:
        raise EnvironmentProblem(f"`belugactl {' '.join(argv)}` failed", why=(done.stderr or done.stdout)[-2000:])


def _server_stats(address: str) -> dict[str, Any] | None:
    """The server's counters through a short-lived TCP client (None when it does not answer)."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError

    try:
        with connect(address, timeout_s=1.0) as c:
            return c.stats()
    except MetadataError:
        return None


def _wait_ready(address: str, timeout_s: float) -> bool:
    """Until the server answers a request (past its fencing grace), or the timeout."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with connect(address, timeout_s=1.0) as c:
                c.ping(b"x")
                return True
        except MetadataError:
            time.sleep(0.05)
    return False


def run_soak(cfg: SoakConfig, *, workdir: Path | None = None) -> dict[str, Any]:
    cfg.check()
    nworkers = cfg.writers + cfg.readers
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="beluga-soak-")))
        manifest = workdir / "soak.yaml"
        pool_path = workdir / "soak.pool"
        pool_mib = 2 * (cfg.kv_mib + 16)
        manifest.write_text(SOAK_RACK.format(pool_mib=pool_mib, kv_mib=cfg.kv_mib, rings=nworkers + 2))
        _cli(["pool", "create-file", "-f", str(manifest), str(pool_path)])
        server: _Server | _Elected
        if cfg.elected:
            from belugactl.workflows.bench.etcd_local import local_etcd

            etcd = stack.enter_context(local_etcd())
            server = _Elected(manifest, pool_path, etcd.url, cfg, workdir)
            tcp = server.address
            stack.callback(server.stop)
            server.start()
        else:
            port = _free_port()
            tcp = f"tcp://127.0.0.1:{port}"
            server = _Server(manifest, pool_path, port, cfg, workdir / "server.log")
            server.start()
            stack.callback(server.stop)
        result = _drive(cfg, server, pool_path, tcp, workdir)
        if isinstance(server, _Elected):
            times = sorted(server.takeovers)
            result["elected"] = {
                "leader_ttl_s": cfg.leader_ttl_s,
                "leader_changes": len(times),
                "warm_takeovers": server.warm_takeovers,
                "takeover_p50_s": round(times[len(times) // 2], 2) if times else None,
                "takeover_max_s": round(times[-1], 2) if times else None,
            }
        logs = sorted(workdir.glob("*.log"))
        tail = "".join(f.read_text(errors="replace")[-1500:] for f in logs)
        result["server_log_tail"] = tail if result["wrong_reads"] else ""
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _drive(cfg: SoakConfig, server: _Server | _Elected, pool_path: Path, tcp: str, workdir: Path) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    end = t0 + cfg.seconds
    workers: dict[int, tuple[subprocess.Popen[bytes], Path]] = {}  # slot -> (process, counts file)
    files: list[Path] = []
    spawned = 0

    def spawn(slot: int) -> None:
        nonlocal spawned
        spawned += 1
        role = "writer" if slot < cfg.writers else "reader"
        address = f"cxl://{pool_path}#{slot}" if slot % 2 == 0 else tcp
        out = workdir / f"worker-{spawned}.json"
        spec = {
            "role": role, "address": address, "pool": str(pool_path), "seed": cfg.seed * 1000 + spawned,
            "seconds": max(1.0, end - time.monotonic() + 30), "keys": cfg.keys, "out": str(out),
            "lease_ttl": cfg.lease_ttl_s, "faulty": cfg.faulty_writer and slot == 0, "stall": cfg.stall_writers,
            "reservation_ttl": cfg.reservation_ttl_s,
        }  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(spec)])  # noqa: S603
        workers[slot] = (proc, out)
        files.append(out)

    def total_ops() -> int:
        n = 0
        for f in files:
            with contextlib.suppress(OSError, ValueError):
                n += json.loads(f.read_text())["ops"]
        return n

    for slot in range(cfg.writers + cfg.readers):
        spawn(slot)
    restarts = survived = kills = 0
    evictions = 0
    next_restart = t0 + cfg.restart_every_s if cfg.restart_every_s > 0 else float("inf")
    next_kill = t0 + cfg.kill_every_s if cfg.kill_every_s > 0 else float("inf")
    pending_survival: int | None = None  # ops total at the last restart, until the clients move on
    try:
        while time.monotonic() < end and not (cfg.ops and total_ops() >= cfg.ops):
            time.sleep(0.1)
            now = time.monotonic()
            if pending_survival is not None and total_ops() > pending_survival and _server_stats(tcp) is not None:
                survived += 1
                pending_survival = None
            if now >= next_kill:
                slot = rng.randrange(len(workers))
                proc, _ = workers[slot]
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                kills += 1
                spawn(slot)
                next_kill = now + cfg.kill_every_s
            if now >= next_restart and now < end - 5.0:  # time left to come back and be seen serving
                stats = _server_stats(tcp)
                evictions += int(stats.get("evictions", 0)) if stats else 0
                server.restart()
                restarts += 1
                _wait_ready(tcp, 15.0)
                pending_survival = total_ops()
                next_restart = time.monotonic() + cfg.restart_every_s
        # The last restart counts once the clients are seen to work again (bounded wait).
        wait_end = time.monotonic() + 20
        while pending_survival is not None and time.monotonic() < wait_end:
            if total_ops() > pending_survival and _server_stats(tcp) is not None:
                survived += 1
                pending_survival = None
            else:
                time.sleep(0.2)
        stats = _server_stats(tcp)
        evictions += int(stats.get("evictions", 0)) if stats else 0
    finally:
        for proc, _ in workers.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in workers.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    totals = WorkerCounts()
    for f in files:
        with contextlib.suppress(OSError, ValueError):
            c = json.loads(f.read_text())
            for name in (
                "ops",
                "refused",
                "committed",
                "reads_verified",
                "reads_void",
                "misses",
                "wrong_reads",
                "wrong_bytes",
                "corrupt_detected",
            ):
                setattr(totals, name, getattr(totals, name) + c[name])
            for k, v in c["errors"].items():
                totals.errors[k] = totals.errors.get(k, 0) + v
            for k, v in c["error_reasons"].items():
                totals.error_reasons[k] = totals.error_reasons.get(k, 0) + v
            totals.wrong_examples.extend(c["wrong_examples"][: 5 - len(totals.wrong_examples)])
    return {
        "benchmark": "soak",
        "seconds": round(time.monotonic() - t0, 2),
        "writers": cfg.writers,
        "readers": cfg.readers,
        "transports": "even slots CXL-RPC rings, odd slots TCP",
        "block_sizes": list(SIZES),
        "keys": cfg.keys,
        "kv_area_bytes": cfg.kv_mib << 20,
        "restart_policy": cfg.restart_policy,
        "faulty_writer": cfg.faulty_writer,
        "stall_writers": cfg.stall_writers,
        "ops": totals.ops,
        "committed": totals.committed,
        "reserve_refused": totals.refused,
        "reads_verified": totals.reads_verified,
        "reads_void": totals.reads_void,
        "misses": totals.misses,
        "server_restarts": restarts,
        "restarts_survived": survived,
        "client_kills": kills,
        "evictions": evictions,
        "wrong_reads": totals.wrong_reads,
        "wrong_bytes": totals.wrong_bytes,
        # The goal, 0: bytes readers accepted (checksum passed) that differ from the key's content.
        "wrong_bytes_served": totals.wrong_bytes,
        # Blocks whose CRC32C did not match their writer's: caught, treated as misses, deleted.
        "corrupt_detected": totals.corrupt_detected,
        "wrong_examples": totals.wrong_examples,
        "client_errors": dict(sorted(totals.errors.items())),
        "client_error_reasons": dict(sorted(totals.error_reasons.items(), key=lambda kv: -kv[1])[:10]),
    }


if __name__ == "__main__":
    sys.exit(_worker(json.loads(sys.argv[1])))
