"""`belugactl bench soak --mixed`: honest, stalling, forgetful and hostile tenants on one server.

One real `belugactl metadata-server` process (as `bench soak` starts it), and beside it:
- honest tenants: writers and readers (even slots on CXL-RPC rings, odd over TCP) whose every byte is
  checked (soak.py's checker) and whose lookups (GET) and saves (RESERVE, copy and CRC32C, COMMIT) are
  timed;
- stalling writers: they stall 0.5..8 s after their fence check, before their stores, half of their
  writes (soak.py's `--stall-writers`): their stores land on reused extents, which readers must catch;
- forgetful writers: they commit without the block's CRC32C, by sending the raw frames an old client
  sent (a token-only COMMIT, a COMMIT whose checksum kind is 0, a COMMIT_MANY item of kind 0); every
  one must be refused with NO_CHECKSUM, and one accepted fails the run;
- hostile tenants, over TCP, in the second phase only: a lease flood (GET_MANY naming one key over
  and over, never released), a reservation flood (RESERVE_MANY of the whole area, again and again,
  never committed), namespace churn (OPEN_NS of 4,096 names, again and again) and a connection
  flood (as many clients as the server's TCP connection cap, pinging, and as many sockets that
  never send a byte, each replaced as soon as the server closes it).
With tenants (the default; manifest `tenants:`, `tenants_rack`) each attacker is a tenant of its
own with quotas, and is judged by its tenant's figures in /stats against them.

After a warm-up (a fifth of the run: start-up, the area's first fill), the run has three phases of
equal length on the same server: quiet, attacked (the hostile tenants run), quiet again (they are
stopped). The honest tenants' throughput and p50/p99 per transport and operation are reported for
each, and the p99 ratio: the larger of the attacked phase over both quiet ones together and over
the one after alone (the machine's own load drifts during a run, and the first quiet phase still
carries the area's first fill: a quiet phase on each side of the attack keeps both out of it)
(goal: within 2x; it fails the run only under `--p99-ratio-max`, since a loaded machine moves it).
Each attacker's outcome is judged from the server's own /stats (polled on the admin port while it
runs) against its tenant's quotas (`--no-tenants`: the per-client caps): bounded (the server held
no more for it than that, and others were served) or unbounded. A fresh client connects, pings
and opens a new namespace once a second during the attack (the probe): the connection flood and
the namespace churn must not lock it out. Goals that fail: wrong bytes served (above 0), a
forgetful commit accepted, an attacker unbounded or never served, a newcomer locked out, the honest
tenants not served while attacked.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.errors import UsageError
from belugactl.workflows.bench import soak

ATTACKERS = ("lease-flood", "reserve-flood", "namespace-churn", "connection-flood")
HOSTILE_NS = "hostile/{}"
# With tenants (manifest `tenants:`): each attacker is a tenant of its own (named after it) owning
# the instance of a host of its own, with the same quotas: a sixteenth of the area pending, 1,024
# live leases, 32 namespaces, a quarter of the connection cap. The honest clients are the implicit
# tenant (no quotas): TCP clients that name none, and spare rings, past every instance's rings (2
# an instance); the manifest's `honest` tenant owns soak-0's instance, as every instance needs one.
RINGS_PER_INSTANCE = 2
TENANT_HOST = """\
  - name: soak-{n}
    address: 127.0.0.{n_1}
    roles: [worker]
    platform: gpu
    numa: {{cpu_nodes: 1, cxl_nodes: 1}}
    gpus: {{count: 1, model: L40S}}
"""
TENANT = """\
  - name: {name}
    instances: [soak-{n}]
    weight: 1
    quotas: {{live_leases: 1024, reserved_bytes: {reserved_mib}MiB, namespaces: 32, connections: {conns}}}
"""


def tenants_rack(rack: str, cfg: MixedConfig) -> str:
    """The soak rack with a host and a tenant for each attacker, and the honest tenant."""
    hosts = "".join(TENANT_HOST.format(n=n, n_1=n + 1) for n in range(1, len(cfg.attackers) + 1))
    tenants = "tenants:\n  - name: honest\n    instances: [soak-0]\n    weight: 3\n"
    reserved_mib, conns = max(8, cfg.kv_mib // 16), max(2, cfg.tcp_max_connections // 4)
    tenants += "".join(
        TENANT.format(name=kind, n=n, reserved_mib=reserved_mib, conns=conns) for n, kind in enumerate(cfg.attackers, 1)
    )
    return rack.replace("serve:\n", hosts + tenants + "serve:\n", 1)


P99_GOAL = 2.0
PHASES = ("quiet", "attacked", "after")  # measured; "after" is quiet again, the attackers stopped
WARMUP_SHARE = 0.2
_SAMPLES_CAP = 20_000  # latency samples kept per (phase, kind) in a worker (reservoir beyond)
# What the honest side may hold beside an attacker: a lease per reader, reservations in flight,
# its own namespaces and the probe's (the server's figures are totals over every owner).
_LEASE_SLACK = 256
_NS_SLACK = 64


@dataclass
class MixedConfig:
    seconds: float = 60.0  # warm-up (a fifth), then quiet, attacked and quiet again (equal thirds of the rest)
    writers: int = 2
    readers: int = 2
    stallers: int = 1
    forgetful: int = 1
    attackers: tuple[str, ...] = ATTACKERS
    keys: int = 0  # 0: half again what the area holds (eviction all the time, saves never run dry)
    kv_mib: int = 1024
    restart_every_s: float = 0.0
    kill_every_s: float = 0.0
    restart_policy: str = "journal"
    lease_ttl_s: float = 5.0
    reservation_ttl_s: float = 3.0
    tcp_max_connections: int = 64
    tenants: bool = True  # the rack names tenants: "honest", and one per attacker (tenants_rack)
    p99_ratio_max: float | None = None
    seed: int = 1

    def check(self) -> None:
        if not 4 <= self.seconds <= 86_400:
            raise UsageError(f"--seconds {self.seconds} is out of range for --mixed", fix="give 4 to 86400 seconds")
        if not (1 <= self.writers <= 64 and 1 <= self.readers <= 64):
            raise UsageError("--writers and --readers must be between 1 and 64")
        if not (0 <= self.stallers <= 16 and 0 <= self.forgetful <= 16):
            raise UsageError("--stallers and --forgetful must be between 0 and 16")
        if unknown := set(self.attackers) - set(ATTACKERS):
            raise UsageError(f"unknown attacker {sorted(unknown)[0]!r}", fix=f"use {', '.join(ATTACKERS)}")
        if self.keys == 0:
            self.keys = max(64, int(1.5 * (self.kv_mib << 20) / (sum(soak.SIZES) / len(soak.SIZES))))
        if not 16 <= self.keys <= 10_000_000:
            raise UsageError("--keys must be between 16 and 10000000")
        if not 64 <= self.kv_mib <= 65536:
            raise UsageError("--kv-mib must be between 64 and 65536 with --mixed")
        if self.p99_ratio_max is not None and not self.p99_ratio_max > 0:
            raise UsageError("--p99-ratio-max must be above 0")
        if not 8 <= self.tcp_max_connections <= 4096:
            raise UsageError("the server's TCP connection cap must be between 8 and 4096")

    def soak_config(self) -> soak.SoakConfig:
        return soak.SoakConfig(
            seconds=self.seconds, writers=self.writers, readers=self.readers, keys=self.keys, kv_mib=self.kv_mib,
            restart_every_s=self.restart_every_s, kill_every_s=self.kill_every_s, restart_policy=self.restart_policy,
            lease_ttl_s=self.lease_ttl_s, reservation_ttl_s=self.reservation_ttl_s, seed=self.seed,
        )  # fmt: skip


# --- worker processes -----------------------------------------------------------------------------


@dataclass
class Latencies:
    """Seconds per (phase, kind), kind "lookup" or "save"; a uniform sample past the cap."""

    quiet: dict[str, list[float]] = field(default_factory=lambda: {"lookup": [], "save": []})
    attacked: dict[str, list[float]] = field(default_factory=lambda: {"lookup": [], "save": []})
    after: dict[str, list[float]] = field(default_factory=lambda: {"lookup": [], "save": []})
    seen: dict[str, int] = field(default_factory=dict)

    def add(self, phase: str, kind: str, value: float, rng: random.Random) -> None:
        got = getattr(self, phase)[kind]
        n = self.seen[f"{phase}.{kind}"] = self.seen.get(f"{phase}.{kind}", 0) + 1
        if len(got) < _SAMPLES_CAP:
            got.append(value)
        elif (i := rng.randrange(n)) < _SAMPLES_CAP:
            got[i] = value


class _Stop:
    def __init__(self) -> None:
        self.stop = False
        signal.signal(signal.SIGTERM, self._term)

    def _term(self, _s: int, _f: object) -> None:
        self.stop = True


def _dump(out: Path, data: dict[str, Any]) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, out)


def _honest(spec: dict[str, Any]) -> int:
    """A writer, reader or stalling writer (soak.py's), whose lookups and saves are timed by phase."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError
    from belugactl.pool.mapping import PoolMapping

    stopper = _Stop()
    rng = random.Random(spec["seed"])
    counts = soak.WorkerCounts()
    lat = Latencies()
    out = Path(spec["out"])
    lat_out = out.with_suffix(".lat")
    flag = Path(spec["attack_flag"])
    done = flag.with_suffix(".done")
    pool = PoolMapping.open(spec["pool"])
    client = None
    deadline = time.monotonic() + spec["seconds"]
    phase = "quiet"  # then "attacked" once the flag is there, then "after" (quiet again)
    last_dump = last_lat = 0.0

    def dump_latencies() -> None:
        _dump(lat_out, {"quiet": lat.quiet, "attacked": lat.attacked, "after": lat.after, "seen": lat.seen})

    while not stopper.stop and time.monotonic() < deadline:
        now = time.monotonic()
        if now - last_dump > 0.2:
            if phase != "after":
                phase = "after" if done.exists() else "attacked" if phase == "attacked" or flag.exists() else "quiet"
            _dump(out, {"counts": vars(counts)})
            last_dump = now
        if now - last_lat > 2.0:
            dump_latencies()
            last_lat = now
        if client is None:
            try:
                cxl = spec["address"].startswith("cxl")
                client = connect(
                    spec["address"], pool=pool if cxl else None, timeout_s=5.0, tenant="" if cxl else spec["tenant"]
                )
            except MetadataError as exc:
                _count_error(counts, exc)
                time.sleep(0.05)
                continue
        key = soak.key_of(rng.randrange(spec["keys"]))
        timings: list[float] = []
        try:
            if spec["role"] == "reader":
                soak._read_one(client, pool, key, counts, spec["lease_ttl"], timings)
            else:
                stall = spec["stall"]
                soak._write_one(client, pool, key, rng, counts, False, stall, spec["reservation_ttl"], timings)
            counts.ops += 1
        except MetadataError as exc:
            _count_error(counts, exc)
            name = type(exc).__name__
            if name == "MetadataUnavailable":
                time.sleep(0.05)
            elif name == "StaleEpoch":
                with contextlib.suppress(MetadataError):
                    client.reconnect()
            else:
                counts.ops += 1
            continue
        # A stalling writer's saves are not an honest tenant's latency; warm-up is not measured.
        # Nor is the gap between the quiet phase's end and every attacker's start.
        now = time.monotonic()
        if (
            timings
            and spec["stall"] == 0
            and now >= spec["measure_from"]
            and (phase != "quiet" or now < spec["quiet_end"])
        ):
            kind = "lookup" if spec["role"] == "reader" else "save"
            lat.add(phase, kind, timings[0], rng)
    _dump(out, {"counts": vars(counts)})
    dump_latencies()
    return 0


def _count_error(counts: soak.WorkerCounts, exc: BaseException) -> None:
    name = type(exc).__name__
    counts.errors[name] = counts.errors.get(name, 0) + 1
    why = f"{name}: {getattr(exc, 'why', None) or exc}"
    if why in counts.error_reasons or len(counts.error_reasons) < 8:
        counts.error_reasons[why] = counts.error_reasons.get(why, 0) + 1


def _raw(client: Any, op: int, payload: bytes) -> tuple[int, bytes]:
    """Send a request's bytes as they are (no client-side checks); the server's code and reply."""
    from belugactl.dataplane.rpc.transport import TransportError

    client._before_call()  # reconnects a broken transport (after a restart)
    try:
        code, _epoch, reply = client.transport.call(op, client._epoch32, payload, client._timeout_ns)
    except TransportError:
        client.transport.broken = True
        raise
    return code, reply


def _forgetful(spec: dict[str, Any]) -> int:
    """Reserves and writes a block as an honest writer does, then commits it without its CRC32C."""
    import struct

    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import AlreadyPresent, MetadataError, PoolFull
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.dataplane.rpc.protocol import Code, Op
    from belugactl.dataplane.rpc.transport import TransportError
    from belugactl.pool.mapping import PoolMapping

    stopper = _Stop()
    rng = random.Random(spec["seed"])
    pool = PoolMapping.open(spec["pool"])
    out = Path(spec["out"])
    got: dict[str, Any] = {"attempts": 0, "refused_no_checksum": 0, "accepted": 0, "other": {}, "errors": {}}
    forms = ("token-only COMMIT", "COMMIT with checksum kind 0", "COMMIT_MANY item of kind 0")
    got["forms"] = dict.fromkeys(forms, 0)
    client = None
    deadline = time.monotonic() + spec["seconds"]
    last_dump = 0.0
    while not stopper.stop and time.monotonic() < deadline:
        if time.monotonic() - last_dump > 0.2:
            _dump(out, got)
            last_dump = time.monotonic()
        try:
            if client is None:
                cxl = spec["address"].startswith("cxl")
                client = connect(
                    spec["address"], pool=pool if cxl else None, timeout_s=5.0, tenant="" if cxl else spec["tenant"]
                )
            key = soak.key_of(rng.randrange(spec["keys"]))
            n = soak.size_of(key)
            try:
                r = client.reserve(soak.NAMESPACE, key, n)
            except (AlreadyPresent, PoolFull):
                time.sleep(0.01)
                continue
            data = soak.block_bytes(key, rng.getrandbits(63) | 1, n)
            pos = 0
            for off, length in r.extents:
                take = min(length, n - pos)
                if take > 0:
                    pool.write(off, data[pos : pos + take])
                pos += take
            form = forms[got["attempts"] % 3]
            if form == forms[0]:
                code, _ = _raw(client, Op.COMMIT, p.encode_u64(r.token))
            elif form == forms[1]:
                code, _ = _raw(client, Op.COMMIT, p.encode_u64(r.token) + bytes(8))
            else:
                many = struct.pack("<HHI", 1, 0, 0) + struct.pack("<QIHH", r.token, 0, p.CHECKSUM_NONE, 0)
                code, reply = _raw(client, Op.COMMIT_MANY, many)
                if code == 0:
                    code = p.decode_codes_reply(reply, "COMMIT_MANY reply")[0]
            got["attempts"] += 1
            got["forms"][form] += 1
            if code == Code.NO_CHECKSUM:
                got["refused_no_checksum"] += 1
            elif code == Code.OK:
                got["accepted"] += 1  # the failure this writer exists to find
            else:
                name = Code(code).name if code in Code._value2member_map_ else str(code)
                got["other"][name] = got["other"].get(name, 0) + 1
            with contextlib.suppress(MetadataError):
                client.abort(r.token)  # the honest thing left to do with it
        except (MetadataError, TransportError) as exc:
            name = type(exc).__name__
            got["errors"][name] = got["errors"].get(name, 0) + 1
            if name == "StaleEpoch" and client is not None:
                with contextlib.suppress(MetadataError):
                    client.reconnect()
            else:
                time.sleep(0.05)
    _dump(out, got)
    return 0


def _attacker(spec: dict[str, Any]) -> int:
    """One hostile tenant over TCP until SIGTERM: what it asked, and what the server gave it."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError
    from belugactl.dataplane.rpc.transport import TransportError

    stopper = _Stop()
    out = Path(spec["out"])
    kind = spec["kind"]
    got: dict[str, Any] = {"kind": kind, "ready": False, "requests": 0, "codes": {}, "errors": {}}
    state: dict[str, Any] = {}
    last_dump = 0.0
    client = None
    while not stopper.stop:
        if time.monotonic() - last_dump > 0.2:
            _dump(out, got)
            last_dump = time.monotonic()
        try:
            if kind == "connection-flood":
                _connection_flood_round(spec, got, state)
                got["ready"] = True
                continue
            if client is None:
                client = connect(spec["address"], timeout_s=10.0, tenant=spec["tenant"])
                state.clear()
            _ATTACKS[kind](client, spec, got, state)
            got["ready"] = True
        except (MetadataError, TransportError) as exc:
            name = type(exc).__name__
            got["errors"][name] = got["errors"].get(name, 0) + 1
            if client is not None and name == "StaleEpoch":
                with contextlib.suppress(MetadataError):
                    client.reconnect()
                state.clear()
            time.sleep(0.05)
    _dump(out, got)
    return 0


def _code_name(code: int) -> str:
    from belugactl.dataplane.rpc.protocol import Code

    return Code(code).name if code in Code._value2member_map_ else str(code)


def _count(got: dict[str, Any], code: int, n: int = 1) -> None:
    name = _code_name(code)
    got["codes"][name] = got["codes"].get(name, 0) + n


def _lease_flood(client: Any, spec: dict[str, Any], got: dict[str, Any], state: dict[str, Any]) -> None:
    """GET_MANY naming one committed key as often as a message holds, never releasing a lease."""
    from belugactl.dataplane import native
    from belugactl.dataplane.metadata_errors import AlreadyPresent
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.dataplane.rpc.protocol import Op

    ns_name = HOSTILE_NS.format("leases")
    key = b"lease-flood".ljust(32, b".")
    if "payload" not in state:
        with contextlib.suppress(AlreadyPresent):
            r = client.reserve(ns_name, key, 4096)
            client.commit(r.token, native.crc32c(bytes(4096)))  # its bytes are never read
        repeats = min(1024, p.get_many_capacity(client.transport.max_payload, len(key)))
        state["payload"] = p.encode_lookup(client._ns_id(ns_name), [key] * repeats)
        got["repeats_per_message"] = repeats
    sent = time.monotonic()
    code, reply = _raw(client, Op.GET_MANY, state["payload"])
    got["requests"] += 1
    _count(got, code)
    if code == 0:
        answered = p.decode_get_many_reply_ex(reply)
        leases = {item[0] for item in answered if item[0]}
        got["keys_found"] = got.get("keys_found", 0) + sum(1 for item in answered if item[0])
        got["leases_granted"] = got.get("leases_granted", 0) + len(leases)
        got["leases_per_message_max"] = max(got.get("leases_per_message_max", 0), len(leases))
        # Never released: every lease asked for within the last lease TTL is still live.
        live = _window(state, len(leases), client.lease_ttl_s, sent)
        got["live_leases_max"] = max(got.get("live_leases_max", 0), live)
        if not leases:
            state.pop("payload")  # its block was evicted: put it again


def _window(state: dict[str, Any], n: int, ttl_s: float, sent: float) -> int:
    """What was granted by requests sent within the last `ttl_s` seconds, this grant of `n` (its
    request sent at `sent`) included. By the send time, not the answer's: the server's clock for a
    grant starts in between, so a grant counted here has certainly not yet run out."""
    from collections import deque

    now = time.monotonic()
    window = state.setdefault("window", deque())
    window.append((sent, n))
    state["in_window"] = state.get("in_window", 0) + n
    while window and window[0][0] < now - ttl_s:
        state["in_window"] -= window.popleft()[1]
    return int(state["in_window"])


def _reserve_flood(client: Any, spec: dict[str, Any], got: dict[str, Any], state: dict[str, Any]) -> None:
    """RESERVE_MANY of the whole area in 2 MiB blocks, fresh keys each round, never committed."""
    from belugactl.dataplane.client import Reservation
    from belugactl.dataplane.rpc.protocol import Code

    ns_name = HOSTILE_NS.format("reserve")
    rounds = state["rounds"] = state.get("rounds", 0) + 1
    n = max(1, int(spec["area_bytes"]) // (2 << 20))
    items = [(b"r%06d-%06d" % (rounds % 1_000_000, i) + b"." * 18, 2 << 20) for i in range(n)]
    sent = time.monotonic()
    answered = client.reserve_many(ns_name, items)
    got["requests"] += 1
    held = sum(isinstance(r, Reservation) for r in answered)
    got["granted"] = got.get("granted", 0) + held
    got["asked"] = got.get("asked", 0) + n
    # Never committed: every reservation asked for within the last reservation TTL is still held.
    held_bytes = _window(state, held * (2 << 20), spec["reservation_ttl"], sent)
    got["held_bytes_max"] = max(got.get("held_bytes_max", 0), held_bytes)
    for r in answered:
        if not isinstance(r, Reservation):
            _count(got, int(r))
    if held == 0 and Code.POOL_FULL in answered:
        time.sleep(0.05)  # at its cap: ask again soon (as a flood would), not in a busy loop


def _namespace_churn(client: Any, spec: dict[str, Any], got: dict[str, Any], state: dict[str, Any]) -> None:
    """OPEN_NS of 4,096 distinct names, round and round."""
    from belugactl.dataplane.rpc import protocol as p
    from belugactl.dataplane.rpc.protocol import Op

    i = state["next"] = (state.get("next", -1) + 1) % 4096
    code, _reply = _raw(client, Op.OPEN_NS, p.encode_name(HOSTILE_NS.format(f"churn/{i}")))
    got["requests"] += 1
    _count(got, code)


def _connection_flood_round(spec: dict[str, Any], got: dict[str, Any], state: dict[str, Any]) -> None:
    """Twice the server's connection cap, in two halves: clients that say HELLO (as the tenant) and
    ping every half second, and plain sockets that never send a byte. Each round (0.1 s) replaces
    the sockets the server closed at once, and the clients it closed or refused every half second."""
    import select
    import socket

    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError

    conns: list[Any] = state.setdefault("conns", [])
    raw: list[socket.socket] = state.setdefault("raw", [])
    want = spec["connections"] // 2
    now = time.monotonic()
    if now >= state.get("next_ping", 0.0):
        state["next_ping"] = now + 0.5
        for c in list(conns):
            try:
                c.ping(b"p")
                got["requests"] += 1
            except MetadataError:
                got["closed_by_server"] = got.get("closed_by_server", 0) + 1
                conns.remove(c)
                with contextlib.suppress(Exception):
                    c.close()
        while len(conns) < want:
            try:
                conns.append(connect(spec["address"], timeout_s=2.0, tenant=spec["tenant"]))
                got["opened"] = got.get("opened", 0) + 1
            except MetadataError:
                got["refused"] = got.get("refused", 0) + 1
                break  # at the cap or its tenant's quota: try again next time
    if raw:
        readable, _, _ = select.select(raw, [], [], 0)
        for s in readable:
            try:
                closed = not s.recv(1)
            except OSError:
                closed = True
            if closed:
                got["silent_closed_by_server"] = got.get("silent_closed_by_server", 0) + 1
                raw.remove(s)
                s.close()
    host, port = spec["address"].removeprefix("tcp://").rsplit(":", 1)
    while len(raw) < want:
        try:
            raw.append(socket.create_connection((host, int(port)), timeout=1))
        except OSError:
            break
        got["silent_opened"] = got.get("silent_opened", 0) + 1
    got["held"] = len(conns)
    got["held_max"] = max(got.get("held_max", 0), len(conns))
    time.sleep(0.1)


_ATTACKS = {"lease-flood": _lease_flood, "reserve-flood": _reserve_flood, "namespace-churn": _namespace_churn}


def _main(spec: dict[str, Any]) -> int:
    role = spec["role"]
    if role in ("writer", "reader", "staller"):
        return _honest(spec)
    if role == "forgetful":
        return _forgetful(spec)
    return _attacker(spec)


# --- the orchestrator ---------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _admin_stats(record: dict[str, Any]) -> dict[str, Any] | None:
    url = record.get("admin")
    if not url:
        return None
    try:
        with urllib.request.urlopen(url + "/stats", timeout=5) as r:  # noqa: S310 - the loopback admin port
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class _Watch:
    """The server's figures that judge the attackers, highest seen per phase (polled /stats)."""

    FIGURES = ("leases", "bytes_reserved", "namespaces", "connections")
    TENANT = {"leases": "live_leases", "bytes_reserved": "reserved_bytes", "namespaces": "namespaces",
              "connections": "connections"}  # fmt: skip

    def __init__(self) -> None:
        self.high: dict[str, dict[str, int]] = {p: dict.fromkeys(self.FIGURES, 0) for p in PHASES}
        # The same figures per tenant (manifest tenants), highest while attacked
        self.tenant: dict[str, dict[str, int]] = {}  # tenant -> its highest figures while attacked
        self.last: dict[str, Any] = {}
        self.polls = dict.fromkeys(PHASES, 0)
        self.missed = dict.fromkeys(PHASES, 0)

    def poll(self, record: dict[str, Any], phase: str) -> None:
        st = _admin_stats(record)
        if st is None:
            self.missed[phase] += 1
            return
        self.polls[phase] += 1
        self.last = st
        ix, tcp = st.get("index", {}), st.get("tcp", {})
        now = {
            "leases": int(ix.get("leases", 0)),
            "bytes_reserved": int(ix.get("bytes_reserved", 0)),
            "namespaces": int(ix.get("namespaces", 0)),
            "connections": int(tcp.get("connections", 0)),
        }
        high = self.high[phase]
        for k, v in now.items():
            high[k] = max(high[k], v)
        for name, fig in (ix.get("tenants") or {}).items():
            mine = self.tenant.setdefault(name, dict.fromkeys(self.FIGURES, 0))
            if phase == "attacked":
                for k, field_name in self.TENANT.items():
                    mine[k] = max(mine[k], int(fig.get(field_name, 0) or 0))


def _probe(tcp: str, n: int) -> tuple[str, str] | None:
    """A newcomer during the attack: connect and ping, then open a namespace of its own.
    None: served; else (what failed: "connect" or "namespace", why)."""
    from belugactl.dataplane.client import connect
    from belugactl.dataplane.metadata_errors import MetadataError

    stage = "connect"
    try:
        with connect(tcp, timeout_s=5.0) as c:
            c.ping(b"probe")
            stage = "namespace"
            c.clear_namespace(f"probe/{n % 8}")  # opens it (NS_LIMIT if the table were taken)
    except MetadataError as exc:
        return stage, f"{type(exc).__name__}: {getattr(exc, 'why', None) or exc}"[:200]
    return None


def run_mixed(cfg: MixedConfig, *, workdir: Path | None = None) -> dict[str, Any]:
    cfg.check()
    scfg = cfg.soak_config()
    honest = cfg.writers + cfg.readers + cfg.stallers + cfg.forgetful
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="beluga-soak-mixed-")))
        manifest = workdir / "soak.yaml"
        pool_path = workdir / "soak.pool"
        pool_mib = 2 * (cfg.kv_mib + 16)
        rack = soak.SOAK_RACK.format(pool_mib=pool_mib, kv_mib=cfg.kv_mib, rings=honest + 2)
        if cfg.tenants:
            rack = tenants_rack(rack, cfg)
        manifest.write_text(rack)
        soak._cli(["pool", "create-file", "-f", str(manifest), str(pool_path)])
        port = soak._free_port()
        extra = ("--tcp-max-connections", str(cfg.tcp_max_connections))
        server = soak._Server(manifest, pool_path, port, scfg, workdir / "server.log", extra)
        server.start()
        stack.callback(server.stop)
        result = _drive(cfg, server, pool_path, f"tcp://127.0.0.1:{port}", workdir)
        result["server_log_tail"] = (workdir / "server.log").read_text()[-1500:] if result["failed"] else ""
        return result
    raise AssertionError("unreachable")  # pragma: no cover


def _drive(cfg: MixedConfig, server: Any, pool_path: Path, tcp: str, workdir: Path) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    t0 = time.monotonic()
    # Start-up and the first fill of the area (first touches of the pool's pages) are not measured:
    # a fifth of the run, then quiet, attacked and quiet again, each as long as the others.
    warmup_s = cfg.seconds * WARMUP_SHARE
    measure_from = t0 + warmup_s
    phase_s = (cfg.seconds - warmup_s) / 3
    quiet_end = measure_from + phase_s
    flag = workdir / "attack.flag"
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    files: dict[str, list[Path]] = {}
    spawned = 0
    roles = (
        ["writer"] * cfg.writers + ["reader"] * cfg.readers + ["staller"] * cfg.stallers
        + ["forgetful"] * cfg.forgetful
    )  # fmt: skip

    def spawn(name: str, spec: dict[str, Any]) -> None:
        nonlocal spawned
        spawned += 1
        out = workdir / f"{name}-{spawned}.json"
        spec = {**spec, "out": str(out), "seed": cfg.seed * 1000 + spawned, "pool": str(pool_path)}
        proc = subprocess.Popen([sys.executable, "-m", __name__, json.dumps(spec)])  # noqa: S603
        procs[name] = (proc, out)
        files.setdefault(name, []).append(out)

    def ring(slot: int) -> int:
        """The slot's ring: with tenants a spare ring (the implicit tenant's, as every honest client's),
        past every instance's rings."""
        return RINGS_PER_INSTANCE * (1 + len(cfg.attackers)) + slot if cfg.tenants else slot

    def spawn_slot(slot: int) -> None:
        role = roles[slot]
        spawn(f"{role}.{slot}", {
            "role": role, "address": f"cxl://{pool_path}#{ring(slot)}" if slot % 2 == 0 else tcp,
            "tenant": "",  # the implicit tenant, as the spare rings: one namespace for every honest client
            "seconds": cfg.seconds + 120, "keys": cfg.keys, "lease_ttl": cfg.lease_ttl_s,
            "reservation_ttl": cfg.reservation_ttl_s, "stall": 0.5 if role == "staller" else 0.0,
            "attack_flag": str(flag), "measure_from": measure_from, "quiet_end": quiet_end,
        })  # fmt: skip

    for slot in range(len(roles)):
        spawn_slot(slot)
    watch = _Watch()
    restarts = kills = 0
    probes_ok = 0
    probe_failures: list[tuple[str, str]] = []
    attack_started = attack_end = after_end = None
    next_restart = t0 + cfg.restart_every_s if cfg.restart_every_s > 0 else float("inf")
    next_kill = t0 + cfg.kill_every_s if cfg.kill_every_s > 0 else float("inf")
    next_poll = next_probe = 0.0
    try:
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            phase = "after" if after_end is not None else "attacked" if attack_started is not None else "quiet"
            if now >= next_poll:
                watch.poll(server.record, phase)
                next_poll = now + 0.5
            if attack_started is None and now >= quiet_end:
                attack_started = _start_attack(cfg, spawn, tcp, procs, watch)
                flag.touch()
                attack_end = time.monotonic() + phase_s  # as long as the quiet one measured
            if attack_started is not None and after_end is None and now >= next_probe:
                why = _probe(tcp, probes_ok + len(probe_failures))
                probes_ok += why is None
                if why is not None:
                    probe_failures.append(why)
                next_probe = time.monotonic() + 1.0
            if after_end is None and attack_end is not None and time.monotonic() >= attack_end:
                watch.poll(server.record, "attacked")
                _stop_attack(cfg, procs)
                flag.with_suffix(".done").touch()
                after_end = time.monotonic() + phase_s
            if after_end is not None and time.monotonic() >= after_end:
                break
            if now >= next_kill:
                slot = rng.randrange(len(roles))
                proc, _ = procs[f"{roles[slot]}.{slot}"]
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                kills += 1
                spawn_slot(slot)
                next_kill = now + cfg.kill_every_s
            if now >= next_restart:
                server.kill()
                restarts += 1
                server.start()
                soak._wait_ready(tcp, 15.0)
                next_restart = time.monotonic() + cfg.restart_every_s
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result = _report(cfg, files, watch, t0)
    result.update(server_restarts=restarts, client_kills=kills, warmup_s=round(warmup_s, 2))
    result["phase_s"] = round(phase_s, 2)
    for entry in result["latency"].values():  # honest throughput, each phase
        for phase in PHASES:
            entry[f"per_s_{phase}"] = round(entry[f"ops_{phase}"] / phase_s, 1)
    result["probe"] = {
        "served": probes_ok,
        "connect_failed": sum(stage == "connect" for stage, _ in probe_failures),
        "namespace_failed": sum(stage == "namespace" for stage, _ in probe_failures),
        "failures": [f"{stage}: {why}" for stage, why in probe_failures[:5]],
    }
    _judge(cfg, result)
    return result


def _stop_attack(cfg: MixedConfig, procs: dict[str, Any]) -> None:
    """SIGTERM every attacker (each writes its last figures) and wait for them."""
    for kind in cfg.attackers:
        proc, _ = procs[kind]
        if proc.poll() is None:
            proc.terminate()
    for kind in cfg.attackers:
        proc, _ = procs[kind]
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_attack(cfg: MixedConfig, spawn: Any, tcp: str, procs: dict[str, Any], watch: _Watch) -> float:
    """Start the hostile tenants and wait (bounded) until each has begun its attack."""
    area = int(watch.last.get("index", {}).get("bytes_capacity", cfg.kv_mib << 20)) if watch.last else cfg.kv_mib << 20
    for kind in cfg.attackers:
        spawn(kind, {"role": "attacker", "kind": kind, "address": tcp, "connections": 2 * cfg.tcp_max_connections,
                     "area_bytes": area, "reservation_ttl": cfg.reservation_ttl_s,
                     "tenant": kind if cfg.tenants else ""})  # fmt: skip
    end = time.monotonic() + 30
    while time.monotonic() < end:
        ready = 0
        for kind in cfg.attackers:
            with contextlib.suppress(OSError, ValueError):
                ready += bool(json.loads(procs[kind][1].read_text()).get("ready"))
        if ready == len(cfg.attackers):
            break
        time.sleep(0.1)
    return time.monotonic()


def _load(paths: list[Path]) -> list[dict[str, Any]]:
    got = []
    for f in paths:
        with contextlib.suppress(OSError, ValueError):
            got.append(json.loads(f.read_text()))
    return got


def _report(cfg: MixedConfig, files: dict[str, list[Path]], watch: _Watch, t0: float) -> dict[str, Any]:
    totals = soak.WorkerCounts()
    by_role: dict[str, dict[str, int]] = {}
    samples: dict[str, dict[str, list[float]]] = {}
    seen: dict[str, dict[str, int]] = {}  # row -> phase -> operations timed (beyond the samples kept)
    for name, paths in files.items():
        role = name.split(".")[0]
        if role not in ("writer", "reader", "staller"):
            continue
        transport = "cxl" if int(name.split(".")[1]) % 2 == 0 else "tcp"
        for data in _load(paths):
            c = data["counts"]
            r = by_role.setdefault(role, {})
            for k in ("ops", "committed", "reads_verified", "reads_void", "misses", "wrong_reads", "wrong_bytes",
                      "corrupt_detected", "stalled", "refused"):  # fmt: skip
                setattr(totals, k, getattr(totals, k) + c.get(k, 0))
                r[k] = r.get(k, 0) + c.get(k, 0)
            for k, v in c["errors"].items():
                totals.errors[k] = totals.errors.get(k, 0) + v
            for k, v in c["error_reasons"].items():
                totals.error_reasons[k] = totals.error_reasons.get(k, 0) + v
            totals.wrong_examples.extend(c["wrong_examples"][: 5 - len(totals.wrong_examples)])
        for data in _load([f.with_suffix(".lat") for f in paths]):
            for phase in PHASES:
                for kind, values in (data.get(phase) or {}).items():
                    if not any(data.get("seen", {}).get(f"{ph}.{kind}") for ph in PHASES):
                        continue
                    samples.setdefault(f"{kind} {transport}", {}).setdefault(phase, []).extend(values)
                    row = seen.setdefault(f"{kind} {transport}", {})
                    row[phase] = row.get(phase, 0) + int(data.get("seen", {}).get(f"{phase}.{kind}", 0))
    latency = {}
    for row, by_phase in sorted(samples.items()):
        # The quiet reference: before and after the attack together (the machine's own load drifts).
        phases = {"before": by_phase.get("quiet", []), "attacked": by_phase.get("attacked", []),
                  "after": by_phase.get("after", [])}  # fmt: skip
        phases["quiet"] = phases["before"] + phases["after"]
        entry: dict[str, Any] = {f"samples_{ph}": len(v) for ph, v in phases.items()}
        for ph in PHASES:
            entry[f"ops_{ph}"] = seen.get(row, {}).get(ph, 0)
        for ph, values in phases.items():
            for name, qq in (("p50", 0.50), ("p99", 0.99)):
                v = _percentile(values, qq)
                entry[f"{name}_{ph}_ms"] = None if v is None else round(v * 1e3, 3)
        # The larger of attacked over both quiet phases and attacked over the one after: the first
        # quiet phase still carries the area's first fill (its page writeback), which flatters the
        # pooled ratio; the one after alone would flatter it when the machine's load rises instead.
        pa, ratios = entry["p99_attacked_ms"], []
        for ref in ("quiet", "after"):
            pq = entry[f"p99_{ref}_ms"]
            enough = len(phases[ref]) >= 20 and len(phases["attacked"]) >= 20
            entry[f"p99_ratio_{ref}"] = round(pa / pq, 2) if pq and pa is not None and enough else None
            ratios += [entry[f"p99_ratio_{ref}"]] if entry[f"p99_ratio_{ref}"] is not None else []
        entry["p99_ratio"] = max(ratios) if ratios else None
        latency[row] = entry
    forgetful = {"attempts": 0, "refused_no_checksum": 0, "accepted": 0, "other": {}, "errors": {}}
    for name, paths in files.items():
        if name.startswith("forgetful."):
            for data in _load(paths):
                for k in ("attempts", "refused_no_checksum", "accepted"):
                    forgetful[k] += data.get(k, 0)
                for k in ("other", "errors"):
                    for code, n in data.get(k, {}).items():
                        forgetful[k][code] = forgetful[k].get(code, 0) + n
    attackers = {}
    for kind in cfg.attackers:
        data = (_load(files.get(kind, [])) or [{}])[-1]
        data.pop("ready", None)
        data.pop("kind", None)
        attackers[kind] = data
    ratios = [e["p99_ratio"] for e in latency.values() if e["p99_ratio"] is not None]
    return {
        "benchmark": "soak --mixed",
        "seconds": round(time.monotonic() - t0, 2),
        "tenants": {
            "writers": cfg.writers,
            "readers": cfg.readers,
            "stallers": cfg.stallers,
            "forgetful": cfg.forgetful,
            "attackers": list(cfg.attackers),
        },
        "transports": "honest: even slots CXL-RPC rings, odd slots TCP; attackers: TCP",
        "tenants_in_rack": cfg.tenants,
        "keys": cfg.keys,
        "kv_area_bytes": cfg.kv_mib << 20,
        "ops": totals.ops,
        "committed": totals.committed,
        "reads_verified": totals.reads_verified,
        "reads_void": totals.reads_void,
        "misses": totals.misses,
        "stalled_writes": totals.stalled,
        "by_role": by_role,
        "wrong_reads": totals.wrong_reads,
        "wrong_bytes_served": totals.wrong_bytes,
        "corrupt_detected": totals.corrupt_detected,
        "wrong_examples": totals.wrong_examples,
        "client_errors": dict(sorted(totals.errors.items())),
        "client_error_reasons": dict(sorted(totals.error_reasons.items(), key=lambda kv: -kv[1])[:10]),
        "forgetful": forgetful,
        "latency": latency,
        "p99_ratio_worst": max(ratios) if ratios else None,
        "p99_ratio_goal": P99_GOAL,
        "p99_ratio_max": cfg.p99_ratio_max,
        "attackers": attackers,
        "server": {
            "high_quiet": watch.high["quiet"],
            "high_attacked": watch.high["attacked"],
            "tenant_high_attacked": watch.tenant,
            "tenants": watch.last.get("index", {}).get("tenants", {}),
            "stats_polls": watch.polls,
            "stats_polls_missed": watch.missed,
            "quotas": watch.last.get("index", {}).get("quotas", {}),
            "tcp_limits": watch.last.get("tcp", {}).get("limits", {}),
            "tcp_evicted_idle": watch.last.get("tcp", {}).get("evicted_idle"),
            "tcp_refused_over_cap": watch.last.get("tcp", {}).get("refused_over_cap"),
            "evictions": watch.last.get("index", {}).get("evictions"),
            "bytes_capacity": watch.last.get("index", {}).get("bytes_capacity"),
        },
    }


def _judge(cfg: MixedConfig, r: dict[str, Any]) -> None:
    """Each goal beside its figure, and `failed` (the goals missed) for the exit code."""
    goals: list[dict[str, Any]] = []

    def goal(name: str, want: str, figure: str, ok: bool | None) -> None:
        goals.append({"goal": name, "want": want, "figure": figure, "ok": ok})

    wrong = (
        f"{r['wrong_bytes_served']:,} in {r['wrong_reads']} reads ({r['reads_verified']:,} verified, "
        f"{r['corrupt_detected']} caught by CRC32C)"
    )
    goal("wrong bytes served", "0", wrong, r["wrong_bytes_served"] == 0)
    if cfg.forgetful:
        f = r["forgetful"]
        goal("forgetful commits", "all refused (NO_CHECKSUM)",
             f"{f['refused_no_checksum']:,} of {f['attempts']:,} refused, {f['accepted']} accepted",
             f["accepted"] == 0 and f["attempts"] > 0 and f["refused_no_checksum"] == f["attempts"])  # fmt: skip
    for kind in cfg.attackers:
        figure, ok = _judge_attacker(cfg, r, kind)
        goal(f"{kind} attacker", "refused/bounded", figure, ok)
    served = all(e["samples_attacked"] > 0 for e in r["latency"].values()) and len(r["latency"]) > 0
    counted = ", ".join(f"{k} {e['samples_attacked']:,}" for k, e in r["latency"].items()) or "no samples"
    goal("honest tenants served while attacked", "every transport and operation", counted, served)
    worst = r["p99_ratio_worst"]
    limit = cfg.p99_ratio_max
    goal("honest p99, attacked / quiet", f"<= {limit if limit is not None else P99_GOAL:g}x"
         + ("" if limit is not None else " (reported; --p99-ratio-max enforces)"),
         "no samples" if worst is None else f"{worst:g}x (worst of {len(r['latency'])} rows)",
         None if limit is None else worst is not None and worst <= limit)  # fmt: skip
    r["goals"] = goals
    r["failed"] = [g["goal"] for g in goals if g["ok"] is False]


def _judge_attacker(cfg: MixedConfig, r: dict[str, Any], kind: str) -> tuple[str, bool]:
    """What one attacker got, and whether that is bounded: against its own tenant's manifest
    quotas and its own figures in /stats when the rack names tenants, else against the per-owner
    caps and the server's totals (less what the honest side may hold)."""
    srv = r["server"]
    a = r["attackers"].get(kind) or {}
    high = srv["high_attacked"]
    cap_conn = int((srv.get("tcp_limits") or {}).get("max_connections") or cfg.tcp_max_connections)
    capacity = int(srv.get("bytes_capacity") or cfg.kv_mib << 20)
    if cfg.tenants:
        tenant = (srv.get("tenants") or {}).get(kind) or {}
        limits = {k: v or 0 for k, v in (tenant.get("limits") or {}).items()}
        refused = tenant.get("refused") or {}
        held = srv["tenant_high_attacked"].get(kind) or dict.fromkeys(_Watch.FIGURES, 0)
        whose, slack_leases, slack_bytes, slack_ns = "its tenant's quota", 0, 0, 0
    else:
        limits = (srv.get("quotas") or {}).get("limits") or {}
        refused = (srv.get("quotas") or {}).get("refused") or {}
        held = high
        whose, slack_leases, slack_ns = "an owner's cap", _LEASE_SLACK, _NS_SLACK
        slack_bytes = (cfg.writers + cfg.stallers + cfg.forgetful) * (8 << 20)
    who = "its tenant" if cfg.tenants else "the server in all"
    probe = r["probe"]
    if kind == "lease-flood":
        cap = int(limits.get("live_leases", 0))
        per_message = a.get("leases_per_message_max", 0)
        mine = a.get("live_leases_max", 0)  # asked for within the last TTL: certainly live at once
        figure = (
            f"{a.get('requests', 0):,} GET_MANY of {a.get('repeats_per_message', 0)} repeats of one key, <= "
            f"{per_message} lease a message; it counted <= {mine:,} live, {who} held <= {held['leases']:,} "
            f"({whose}: {cap:,}); {refused.get('leases', 0):,} lookups refused by quota"
        )
        ok = cap > 0 and held["leases"] <= cap + slack_leases and mine <= cap and per_message <= 1
        active = a.get("keys_found", 0) > 0  # it was served its key's leases at all
    elif kind == "reserve-flood":
        cap = int(limits.get("reserved_bytes", 0))
        mine = a.get("held_bytes_max", 0)
        figure = (
            f"{a.get('granted', 0):,} of {a.get('asked', 0):,} 2 MiB reservations granted ({a.get('codes', {})}); "
            f"it held <= {mine >> 20:,} MiB, {who} <= {held['bytes_reserved'] >> 20:,} MiB ({whose}: "
            f"{cap >> 20:,} MiB; area {capacity >> 20:,} MiB)"
        )
        ok = 0 < cap < capacity and held["bytes_reserved"] <= cap + slack_bytes and mine <= cap
        active = a.get("requests", 0) > 0
    elif kind == "namespace-churn":
        cap = int(limits.get("namespaces", 0))
        figure = (
            f"{a.get('requests', 0):,} OPEN_NS of 4,096 names ({a.get('codes', {})}); {who} held <= "
            f"{held['namespaces']:,} ({whose}: {cap:,}); a newcomer opened one {probe['served']} times, refused "
            f"{probe['namespace_failed']}"
        )
        ok = cap > 0 and held["namespaces"] <= cap + slack_ns and probe["namespace_failed"] == 0
        active = a.get("requests", 0) > 0
    else:
        cap = int(limits.get("connections", 0)) if cfg.tenants else cap_conn
        figure = (
            f"{cfg.tcp_max_connections} clients (HELLO, ping), held <= {a.get('held_max', 0)}: "
            f"{a.get('opened', 0):,} opened, {a.get('refused', 0):,} refused, {a.get('closed_by_server', 0):,} "
            f"closed; {cfg.tcp_max_connections} silent sockets: {a.get('silent_opened', 0):,} opened, "
            f"{a.get('silent_closed_by_server', 0):,} closed by the server; {who} held <= "
            f"{held['connections']} ({whose}: {cap}; server {high['connections']} of {cap_conn}); a newcomer "
            f"(the probe) served {probe['served']}, locked out {probe['connect_failed']}"
        )
        ok = cap > 0 and held["connections"] <= cap and high["connections"] <= cap_conn and not probe["connect_failed"]
        active = a.get("opened", 0) > 0
    if not active:
        ok = False
        figure += " (the attacker was never served: no attack took place)"
    if not srv["stats_polls"]["attacked"]:
        ok = False  # nothing to judge it by: a server whose /stats does not answer is stalled anyway
        figure += " (the server's /stats never answered during the attack)"
    return figure, ok


if __name__ == "__main__":
    sys.exit(_main(json.loads(sys.argv[1])))
