"""`metadata-server --standby`: two server processes on one file pool and a real etcd on loopback.

Kill the leader (SIGKILL): the standby serves the committed blocks. Pause it (SIGSTOP): the standby
takes over, and the old leader, resumed, writes no byte of the pool. Lose etcd: the leader stops
serving by its deadline; etcd back: one leader again; that leader stopped cleanly: the standby
takes over."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.mds.leadership import Etcd3gwKV, leader_key
from belugactl.dataplane.nowait import start_lookup
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc
from tests.support.etcd import Etcd, running_etcd
from tests.support.pool_bytes import fingerprint

pytestmark = pytest.mark.process

CPU_DEMO = Path(__file__).resolve().parents[2] / "examples" / "cpu-demo.yaml"
NS = "m/tp0"


class Member:
    """One `metadata-server --standby --json` process and the records it prints, one per change of role."""

    def __init__(self, name: str, pool: Path, etcd: Etcd, ttl: int, tmp: Path, *extra: str) -> None:
        self.name = name
        argv = [sys.executable, "-m", "belugactl", "metadata-server", "-f", str(CPU_DEMO), "--pool", str(pool),
                "--rpc-port", "0", "--admin-port", "0", "--json", "--standby", "--etcd", etcd.url,
                "--member", name, "--leader-ttl", str(ttl), *extra]  # fmt: skip
        self.err = open(tmp / f"{name}.err", "w+")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err, text=True)  # noqa: S603
        self.events: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.admin = ""
        self.warm: dict | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def expect(self, event: str, timeout_s: float = 30.0) -> dict:
        """The next record, which must be `event` (roles change in order). A "warm" record (the
        standby's copy caught up) comes from a thread at its own time: skipped unless asked for."""
        if event == "warm" and self.warm is not None:
            return self.warm
        while True:
            try:
                rec = self.events.get(timeout=timeout_s)
            except queue.Empty:
                self.err.seek(0)
                raise AssertionError(
                    f"{self.name}: no {event!r} within {timeout_s} s: {self.err.read()[-3000:]}"
                ) from None
            if rec["event"] != "warm" or event == "warm":
                break
            self.warm = rec
        assert rec["event"] == event, (rec, event)
        if rec.get("admin"):
            self.admin = rec["admin"]
        return rec

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.admin + path, timeout=5) as r:  # noqa: S310 - loopback
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.admin + "/metrics", timeout=5) as r:  # noqa: S310 - loopback
            return r.read().decode()

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.err.close()


@contextmanager
def rack() -> Iterator[tuple[Etcd, Path, Path]]:
    with running_etcd() as etcd, tempfile.TemporaryDirectory(prefix="beluga-standby-") as tmp:
        pool = Path(tmp) / "pool"
        create_file_pool(pool, CPU_DEMO)
        yield etcd, pool, Path(tmp)


@contextmanager
def members(etcd: Etcd, pool: Path, tmp: Path, *spec: tuple) -> Iterator[list[Member]]:
    """(name, TTL, extra flags...) each; the first one leads."""
    started: list[Member] = []
    try:
        for name, ttl, *extra in spec:
            started.append(Member(name, pool, etcd, ttl, tmp, *extra))
            started[-1].expect("standby")
            if len(started) == 1:
                started[0].expect("started")  # the first one leads
        yield started
    finally:
        for m in started:
            m.stop()


def commit_blocks(pool_path: Path, ring: int, count: int = 5) -> list[bytes]:
    """`count` blocks written and committed through `ring`, each filled with its own key's bytes."""
    pool = PoolMapping.open(pool_path)
    client = connect(f"cxl://{pool_path}#{ring}", pool=pool, timeout_s=5)
    keys = [os.urandom(32) for _ in range(count)]
    for k in keys:
        r = client.reserve(NS, k, 32 * 1000)
        pool.write(r.extents[0][0], k * 1000)
        client.commit(r.token, zeros_crc(r.nbytes))
    client.close()
    pool.close()
    return keys


def served(pool_path: Path, ring: int, keys: list[bytes], timeout_s: float = 5.0) -> int:
    """How many of `keys` the current leader serves through `ring`, each block's bytes checked."""
    pool = PoolMapping.open(pool_path)
    client = connect(f"cxl://{pool_path}#{ring}", pool=pool, timeout_s=timeout_s)
    try:
        n = client.lookup_prefix(NS, keys)
        for k in keys[:n]:
            loc = client.get(NS, k)
            assert loc is not None
            assert b"".join(pool.read(off, ln) for off, ln in loc.extents)[: 32 * 1000] == k * 1000
        return n
    finally:
        client.close()
        pool.close()


def wait_fence_line_clear(pool_path: Path, timeout_s: float = 30.0) -> None:
    """Until the leader has lowered its fence line to 0 (its housekeeping, once nothing is reserved)."""
    from belugactl.dataplane.mds.fencing import FENCE_LINE

    with PoolMapping.open(pool_path) as pool:
        at = pool.geometry.journal_offset + FENCE_LINE
        end = time.monotonic() + timeout_s
        while int.from_bytes(pool.read(at, 8), "little") and time.monotonic() < end:
            time.sleep(0.02)
        assert not int.from_bytes(pool.read(at, 8), "little"), "the leader's fence line stayed up"


def test_sigkill_the_leader_and_the_standby_serves_every_committed_block() -> None:
    with rack() as (etcd, pool, tmp), members(etcd, pool, tmp, ("mds-a", 2), ("mds-b", 2)) as (a, b):
        keys = commit_blocks(pool, ring=1)
        status, body = b.get("/readyz")
        assert status == 503 and "mds-a leads" in body["reason"]
        killed = time.monotonic()
        a.signal(signal.SIGKILL)
        rec = b.expect("started")
        assert rec["restored_entries"] == len(keys) and rec["epoch"] == 2
        assert rec["warm"]  # its copy of the index, kept in step with the journal, not a rebuild
        assert served(pool, ring=2, keys=keys) == len(keys)
        # Reported, not asserted (a loaded machine): the lease TTL (2 s here) plus the takeover.
        print(f"\nfailover: first answer {time.monotonic() - killed:.2f} s after SIGKILL (TTL 2 s)")
        status, stats = b.get("/stats")
        lead = stats["leadership"]
        assert lead["leading"] and lead["leader"] == "mds-b" and lead["leader_changes"] == 1
        metrics = b.metrics()
        assert 'beluga_mds_leader{member="mds-b"} 1.0' in metrics
        assert "beluga_mds_leader_terms_won_total 1.0" in metrics
        term_start = next(ln for ln in metrics.splitlines() if ln.startswith("beluga_mds_leader_term_start_seconds "))
        assert float(term_start.split()[1]) > 0  # leading: when its term began
        assert b.get("/readyz")[0] == 200


def test_a_warm_standby_shows_its_copy_and_a_cold_one_rebuilds() -> None:
    with (
        rack() as (etcd, pool, tmp),
        members(etcd, pool, tmp, ("mds-a", 2), ("mds-b", 2), ("mds-c", 2, "--cold-standby")) as (a, b, c),
    ):
        keys = commit_blocks(pool, ring=1, count=7)
        end = time.monotonic() + 20
        while (b.get("/stats")[1].get("follow") or {}).get("entries") != len(keys):
            assert time.monotonic() < end, b.get("/stats")
            time.sleep(0.05)
        status, stats = b.get("/stats")
        assert stats["follow"]["warm"] and not stats["follow"]["lost"]
        assert "beluga_mds_standby_warm 1.0" in b.metrics() and "beluga_mds_standby_entries 7.0" in b.metrics()
        assert c.get("/stats")[1]["follow"] is None and "beluga_mds_standby_warm" not in c.metrics()
        b.stop()  # only the cold standby is left to take over
        a.signal(signal.SIGKILL)
        rec = c.expect("started")
        assert not rec["warm"] and rec["restored_entries"] == len(keys)
        assert served(pool, ring=2, keys=keys) == len(keys)


def test_a_paused_leader_resumed_after_the_takeover_writes_nothing() -> None:
    # mds-b's longer TTL keeps it the leader while it is paused for the byte comparison below.
    # mds-a never busy-polls, so the pause finds it in its idle wait (what a SIGSTOP finds almost
    # always): a pause in the middle of a busy-poll is the window docs/dataplane.md says is left.
    spec = (("mds-a", 2, "--spin-after-ms", "0"), ("mds-b", 10))
    with rack() as (etcd, pool, tmp), members(etcd, pool, tmp, *spec) as (a, b):
        keys = commit_blocks(pool, ring=1)
        wait_fence_line_clear(pool)  # else mds-b would refuse RESERVE for the writer window (30 s)
        mapped = PoolMapping.open(pool)
        late = connect(f"cxl://{pool}#5", pool=mapped, timeout_s=5)  # mds-a's client, epoch 1
        assert late.lookup_prefix(NS, keys) == len(keys)  # its namespace is open
        a.signal(signal.SIGSTOP)
        b.expect("started")
        assert served(pool, ring=2, keys=keys) == len(keys)
        # A reservation open at mds-b: the fence line (mds/fencing.py) holds mds-b's writer deadline,
        # which mds-a's clean stop (nothing open there) would lower to 0: a lost term writes not even that.
        writer = connect(f"cxl://{pool}#4", pool=mapped, timeout_s=5)
        writer.reserve(NS, os.urandom(32), 32 * 1000)
        b.signal(signal.SIGSTOP)  # now nothing may write the pool but the old leader
        # A lookup of mds-a's epoch in ring 5, as from a client that read the pool's epoch word just
        # before mds-b bumped it (the client's own check is skipped to stage that race): the old
        # leader would answer it in its first look at the rings after the resume.
        late._check_fence = lambda op: None  # type: ignore[method-assign]
        assert start_lookup(late, NS, keys) is not None
        before = fingerprint(pool)
        a.signal(signal.SIGCONT)
        rec = a.expect("stepped-down")
        assert "deadline" in rec["reason"] or "epoch" in rec["reason"], rec
        a.expect("standby")  # the pool is unmapped by now
        after = fingerprint(pool)
        b.signal(signal.SIGCONT)
        assert after == before  # header, rings, journal, KV area: not a byte written on resume
        assert served(pool, ring=3, keys=keys) == len(keys)
        status, body = a.get("/readyz")
        assert status == 503 and "mds-b leads" in body["reason"]
        writer.close()
        late.close()
        mapped.close()


def test_etcd_lost_the_leader_stops_by_its_deadline_and_back_one_leader() -> None:
    with rack() as (etcd, pool, tmp), members(etcd, pool, tmp, ("mds-a", 2), ("mds-b", 2)) as (a, b):
        keys = commit_blocks(pool, ring=1)
        assert a.get("/readyz")[0] == 200
        etcd.stop()
        rec = a.expect("stepped-down")  # by its deadline: TTL - margin after the last keep-alive
        assert "etcd unreachable" in rec["reason"] or "deadline" in rec["reason"], rec
        a.expect("standby")
        assert a.get("/readyz")[0] == 503 and b.get("/readyz")[0] == 503  # nobody serves without etcd
        etcd.start()
        winner = None
        end = time.monotonic() + 30
        while winner is None and time.monotonic() < end:
            for m in (a, b):
                try:
                    rec = m.events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if rec["event"] == "warm":  # a standby's copy caught up (its own time)
                    continue
                assert rec["event"] == "started", rec
                winner = m
                m.admin = rec["admin"]
        assert winner is not None, "no leader after etcd came back"
        other = b if winner is a else a
        time.sleep(0.5)  # the loser would have printed "started" by now if it had won too
        assert other.events.empty()
        assert winner.get("/readyz")[0] == 200 and other.get("/readyz")[0] == 503
        assert served(pool, ring=2, keys=keys) == len(keys)
        # A clean stop revokes the lease: the standby takes over without waiting out the TTL.
        winner.signal(signal.SIGTERM)
        assert winner.proc.wait(timeout=30) == 0
        key = Etcd3gwKV([etcd.url]).get(leader_key("cpu-demo"))  # gone at once, or the standby's already
        assert key is None or json.loads(key.value)["member"] == other.name
        other.expect("started")
        assert served(pool, ring=3, keys=keys) == len(keys)
