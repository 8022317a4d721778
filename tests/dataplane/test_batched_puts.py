"""RESERVE_MANY and COMMIT_MANY: what N single RESERVEs and COMMITs do, in one message per slot's
worth, and a request's save in a constant number of metadata round trips (docs/dataplane.md,
"Batched puts")."""

from __future__ import annotations

import struct
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from belugactl.dataplane import native
from belugactl.dataplane.client import KVIndexClient, Reservation, connect, copy_verified
from belugactl.dataplane.mds.allocator import CHUNK, Allocator
from belugactl.dataplane.mds.index import Entry, KVIndex
from belugactl.dataplane.mds.service import MetadataService
from belugactl.dataplane.rpc import protocol as p
from belugactl.dataplane.rpc.protocol import Code, Op
from belugactl.dataplane.rpc.transport import ClientTransport
from belugactl.pool.mapping import PoolMapping
from tests.dataplane.test_server_process import server

EPOCH = 7


def service(chunks: int = 16) -> MetadataService:
    return MetadataService(KVIndex(Allocator(CHUNK, chunks * CHUNK)), epoch=EPOCH)


def keys(n: int, tag: bytes = b"k") -> list[bytes]:
    return [tag + i.to_bytes(4, "big") + b"." * 27 for i in range(n)]


def reserve_many(s: MetadataService, ns: int, items, max_reply: int = 4096, owner: int = 0):
    code, rep = s.handle(Op.RESERVE_MANY, EPOCH, p.encode_reserve_many(ns, items), max_reply, owner)
    return code, (p.decode_reserve_many_reply(rep) if code == 0 else [])


def raw_commit_many(entries) -> bytes:
    """A COMMIT_MANY frame as any client could send it: a commit without a checksum too (kind 0),
    which the encoder refuses to build."""
    return struct.pack("<HHI", len(entries), 0, 0) + b"".join(
        struct.pack("<QIHH", t, crc or 0, p.CHECKSUM_NONE if crc is None else p.CHECKSUM_CRC32C, action)
        for t, crc, action in entries
    )


def commit_many(s: MetadataService, entries, owner: int = 0):
    code, rep = s.handle(Op.COMMIT_MANY, EPOCH, raw_commit_many(entries), 4096, owner)
    return code, (p.decode_codes_reply(rep, "reply") if code == 0 else [])


# --- the wire ----------------------------------------------------------------------------------


def test_codecs_round_trip_and_capacities() -> None:
    items = [(k, 1000 + i) for i, k in enumerate(keys(5))]
    assert p.decode_reserve_many(p.encode_reserve_many(3, items)) == (3, items)
    commit, abort = p.COMMIT_MANY_COMMIT, p.COMMIT_MANY_ABORT
    entries = [(11, 0xDEADBEEF, commit), (12, 0, commit), (13, None, abort)]
    assert p.decode_commit_many(p.encode_commit_many(entries)) == entries
    ext = [(4096, 100), (8192, 5)]
    reply = p.encode_many_reply([p.encode_reserve_many_item(0, 9, ext), p.encode_reserve_many_item(int(Code.EXISTS))])
    assert p.decode_reserve_many_reply(reply) == [(0, 9, ext), (int(Code.EXISTS), 0, [])]
    assert p.decode_codes_reply(p.encode_codes_reply([0, 8, 15]), "r") == [0, 8, 15]
    # A 256 B slot (224 B payload): 5 reservations of 32-byte keys, 13 commits.
    assert p.reserve_many_capacity(224, 32) == 5 and p.commit_many_capacity(224) == 13
    assert len(p.encode_reserve_many(1, items)) <= 224 < len(p.encode_reserve_many(1, items + items[:1]))
    assert len(p.encode_commit_many(entries * 4 + entries[:1])) <= 224
    assert p.reserve_many_capacity(4 << 20, 32) == p.commit_many_capacity(4 << 20) == 0xFFFF  # counts are u16
    with pytest.raises(ValueError):
        p.encode_reserve_many(1, [(b"a" * 32, 1), (b"b" * 16, 1)])  # one key length per message


# --- the service: per-key answers, partial failure ------------------------------------------------


def test_reserve_many_answers_per_key_and_skips_present_keys() -> None:
    s = service()
    ns = s.index.open_namespace("ns")
    ks = keys(4)
    token, _ = s.index.reserve(ns, ks[1], 5000)
    s.index.commit(token)  # committed already
    s.index.reserve(ns, ks[2], 5000)  # another client is writing it
    code, got = reserve_many(s, ns, [(k, 5000) for k in ks] + [(ks[0], 5000)])  # the first key twice
    assert code == 0
    assert [c for c, _t, _e in got] == [0, Code.EXISTS, Code.EXISTS, 0, Code.EXISTS]
    assert all(t and len(e) == 1 for c, t, e in got if c == 0)
    assert s.index.counters.pool_full == 0 and s.errors == {"EXISTS": 3}  # as 3 refused RESERVEs count


def test_the_first_out_of_space_refuses_every_later_key_untried() -> None:
    s = service(chunks=2)  # 4 MiB: two 1.5 MiB blocks fit, the third does not
    ns = s.index.open_namespace("ns")
    ks = keys(5)
    sizes = [1536 << 10, 1536 << 10, 3 << 20, 4096, 4096]  # the small ones would fit, but come after the hole
    code, got = reserve_many(s, ns, list(zip(ks, sizes, strict=True)))
    assert code == 0 and [c for c, _t, _e in got] == [0, 0] + [Code.POOL_FULL] * 3
    assert len(s.index.pending) == 2 and s.index.counters.pool_full == 1  # only the third was tried


def test_keys_whose_reply_does_not_fit_are_left_for_the_next_request_and_leak_nothing() -> None:
    s = service()
    ns = s.index.open_namespace("ns")
    ks = keys(8)
    one = p.RESERVE_MANY_ITEM_SIZE + 16  # a one-extent reservation's share of the reply
    code, got = reserve_many(s, ns, [(k, 5000) for k in ks], max_reply=4 + 3 * one)
    assert code == 0 and len(got) == 3 and all(c == 0 for c, _t, _e in got)
    assert len(s.index.pending) == 3 and s.index.alloc.used == 3 * s.index.pending[got[0][1]].alloc.footprint
    # The client asks again for the rest, which are untouched.
    code, got = reserve_many(s, ns, [(k, 5000) for k in ks[3:]], max_reply=4096)
    assert code == 0 and len(got) == 5 and len(s.index.pending) == 8


def test_a_key_whose_extents_fit_no_reply_answers_too_big_and_gives_the_space_back() -> None:
    s = service(chunks=64)
    ns = s.index.open_namespace("ns")
    tokens = [s.index.reserve(ns, bytes([i]) * 8, CHUNK)[0] for i in range(60)]
    for token in tokens[::2]:
        s.index.abort(token)  # fragment: a 20-chunk block now needs many extents
    used = s.index.alloc.used
    code, got = reserve_many(s, ns, [(b"big".ljust(32), 20 * CHUNK), (b"small".ljust(32), 4096)], max_reply=96)
    assert code == 0 and [c for c, _t, _e in got] == [Code.TOO_BIG, 0]
    assert s.index.alloc.used == used + s.index.pending[got[1][1]].alloc.footprint


def test_reserve_many_is_refused_whole_while_fencing_or_for_an_unknown_namespace() -> None:
    s = service()
    ns = s.index.open_namespace("ns")
    calls = []
    s.on_reserve = lambda: calls.append(1)
    s.reserve_blocked = "an earlier epoch's writers may still write"
    assert reserve_many(s, ns, [(k, 4096) for k in keys(3)])[0] == Code.NOT_READY
    s.reserve_blocked = ""
    assert reserve_many(s, ns + 99, [(k, 4096) for k in keys(3)])[0] == Code.UNKNOWN_NS
    assert not s.index.pending and not calls
    assert reserve_many(s, ns, [(k, 4096) for k in keys(3)])[0] == 0
    assert calls == [1]  # fencing records the writers' deadline once per request that reserved


class _Journal:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, int | None]] = []

    def committed(self, e: Entry) -> None:
        self.records.append(("commit", e.key[1], e.checksum))

    def removed(self, e: Entry) -> None:
        self.records.append(("remove", e.key[1], e.checksum))


def _observable(s: MetadataService) -> dict:
    idx = s.index
    return {
        "journal": idx.journal.records,
        "entries": sorted((k[1], e.checksum, e.alloc.nbytes) for k, e in idx.entries.items()),
        "lru": [k[1] for k in idx.lru],
        "pending": sorted(pd.key[1] for pd in idx.pending.values()),
        "counters": vars(idx.counters),
        "errors": dict(s.errors),
        "used": idx.alloc.used,
    }


def test_commit_many_does_exactly_what_single_commits_and_aborts_do() -> None:
    """Two servers, the same reservations; one gets N COMMIT/ABORT requests, the other one
    COMMIT_MANY: journal records, index, LRU order, ownership refusals, counters and error counts
    end up the same."""
    results = []
    for batched in (False, True):
        s = service()
        s.index.journal = _Journal()
        ns = s.index.open_namespace("ns")
        mine = [s.index.reserve(ns, k, 3000 + i, owner=1)[0] for i, k in enumerate(keys(6))]
        theirs = s.index.reserve(ns, b"victim".ljust(32), 4096, owner=2)[0]
        entries = [
            (mine[0], 0x11111111, p.COMMIT_MANY_COMMIT),
            (mine[1], None, p.COMMIT_MANY_COMMIT),  # no checksum: NO_CHECKSUM, left reserved
            (theirs, 0x22222222, p.COMMIT_MANY_COMMIT),  # another owner's: NOT_OWNER, left alone
            (mine[2], None, p.COMMIT_MANY_ABORT),
            (mine[0], 0x11111111, p.COMMIT_MANY_COMMIT),  # twice: the second finds no reservation
            (0x1234, 0x44, p.COMMIT_MANY_COMMIT),  # never issued
            (mine[4], 0x33333333, p.COMMIT_MANY_COMMIT),
            (theirs, None, p.COMMIT_MANY_ABORT),  # another owner's abort: refused too
        ]
        if batched:
            code, codes = commit_many(s, entries, owner=1)
            assert code == 0
        else:
            codes = []
            for token, checksum, action in entries:
                op, payload = (
                    (Op.ABORT, p.encode_u64(token))
                    if action == p.COMMIT_MANY_ABORT
                    else (Op.COMMIT, p.encode_u64(token) if checksum is None else p.encode_commit(token, checksum))
                )
                codes.append(s.handle(op, EPOCH, payload, 4096, 1)[0])
        gone = Code.NO_RESERVATION
        assert codes == [0, Code.NO_CHECKSUM, Code.NOT_OWNER, 0, gone, gone, 0, Code.NOT_OWNER]
        results.append(_observable(s))
    single, batch = results
    assert single == batch
    assert batch["counters"]["commits_checksummed"] == 2 and batch["counters"]["foreign_refused"] == 2
    assert [r[0] for r in batch["journal"]] == ["commit"] * 2


def test_malformed_batches_are_refused_whole_before_anything_changes() -> None:
    s = service()
    ns = s.index.open_namespace("ns")
    ks = keys(3)
    good = p.encode_reserve_many(ns, [(k, 4096) for k in ks])
    # a zero-byte item after two good ones: nothing is reserved
    zero = bytearray(good)
    struct.pack_into("<Q", zero, 8 + 2 * 40, 0)
    assert s.handle(Op.RESERVE_MANY, EPOCH, bytes(zero), 4096)[0] == Code.BAD_ARGS
    # a count that overflows the payload, and a count of zero
    assert s.handle(Op.RESERVE_MANY, EPOCH, struct.pack("<IHH", ns, 0xFFFF, 32) + good[8:], 4096)[0] == Code.BAD_LENGTH
    assert s.handle(Op.RESERVE_MANY, EPOCH, struct.pack("<IHH", ns, 0, 32), 4096)[0] == Code.BAD_LENGTH
    assert s.handle(Op.RESERVE_MANY, EPOCH, struct.pack("<IHH", ns, 1, 0) + b"\0" * 8, 4096)[0] == Code.BAD_ARGS
    assert not s.index.pending
    tokens = [s.index.reserve(ns, k, 4096)[0] for k in ks]
    batch = bytearray(p.encode_commit_many([(t, 0, p.COMMIT_MANY_COMMIT) for t in tokens]))
    bad_action = bytearray(batch)
    struct.pack_into("<H", bad_action, 8 + 2 * 16 + 14, 7)  # the last item's action
    bad_kind = bytearray(batch)
    struct.pack_into("<H", bad_kind, 8 + 2 * 16 + 12, 9)  # the last item's checksum kind
    for payload in (bad_action, bad_kind):
        assert s.handle(Op.COMMIT_MANY, EPOCH, bytes(payload), 4096)[0] == Code.BAD_ARGS
    assert s.handle(Op.COMMIT_MANY, EPOCH, struct.pack("<HHI", 0xFFFF, 0, 0) + batch[8:], 4096)[0] == Code.BAD_LENGTH
    assert s.handle(Op.COMMIT_MANY, EPOCH, struct.pack("<HHI", 0, 0, 0), 4096)[0] == Code.BAD_LENGTH
    assert s.handle(Op.COMMIT_MANY, EPOCH, struct.pack("<HHI", 3, 1, 0) + batch[8:], 4096)[0] == Code.BAD_ARGS
    assert not s.index.entries and len(s.index.pending) == 3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from([Op.RESERVE_MANY, Op.COMMIT_MANY]),
    head=st.tuples(st.integers(0, 3), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)),
    tail=st.binary(max_size=400),
    max_reply=st.sampled_from([0, 3, 20, 224, 4096]),
)
def test_batches_of_garbage_never_raise_and_replies_fit(op: int, head, tail: bytes, max_reply: int) -> None:
    s = service()
    s.index.open_namespace("ns")
    code, rep = s.handle(op, EPOCH, struct.pack("<IHH", *head) + tail, max_reply)
    assert isinstance(code, int) and len(rep) <= max_reply
    # Whatever was reserved was answered: no reservation the client never heard of.
    if op == Op.RESERVE_MANY:
        answered = {t for c, t, _e in p.decode_reserve_many_reply(rep) if c == 0} if code == 0 else set()
        assert set(s.index.pending) == answered


# --- a real server, a real client -----------------------------------------------------------------

RACK_64 = """\
version: 1
name: batch-test
pool:
  source: {kind: cxl-region, memdevs: all, type: ram}
  size: 64MiB
  align: 2MiB
layout:
  metadata: {slots_per_ring: 64, slot_size: 256B, spare_rings: 2, journal: 2MiB}
  shared_kv: 32MiB
  partition_size: equal
hosts:
  - name: h0
    address: 127.0.0.1
    roles: [metadata, worker]
    platform: gpu
    numa: {cpu_nodes: 1, cxl_nodes: 1}
    gpus: {count: 1, model: L40S}
serve:
  vllm:
    model: test/model
    instances_per_host: 1
"""


@pytest.fixture
def rack64(tmp_path: Path) -> tuple[Path, Path]:
    from belugactl.pool.file_pool import create_file_pool

    manifest = tmp_path / "rack64.yaml"
    manifest.write_text(RACK_64)
    return manifest, create_file_pool(tmp_path / "pool64.bin", manifest)


def _content(key: bytes, n: int) -> bytes:
    return (key * (n // len(key) + 1))[:n]


def _save(c, pool: PoolMapping, ns: str, ks: list[bytes], n: int) -> tuple[int, int]:
    """A connector-like save; returns (messages, round trips) it cost."""
    m0, t0 = c.messages, c.round_trips
    got = c.reserve_many(ns, [(k, n) for k in ks])
    assert all(isinstance(r, Reservation) for r in got), got
    commits = []
    for k, r in zip(ks, got, strict=True):
        assert c.writable(r)
        data = _content(k, n)
        pos = 0
        for off, length in r.extents:
            pool.write(off, data[pos : pos + length])
            pos += length
        commits.append((r.token, native.crc32c(data)))
    assert c.commit_many(commits) == [Code.OK] * len(ks)
    return c.messages - m0, c.round_trips - t0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "cxl"])
def test_a_save_costs_the_same_round_trips_for_8_and_62_blocks(rack64, transport: str) -> None:
    manifest, pool_path = rack64
    with server(manifest, pool_path) as srv:
        pool = PoolMapping.open(pool_path)
        address = srv["rpc"] if transport == "tcp" else f"cxl://{pool_path}#1"
        c = connect(address, pool=pool if transport == "cxl" else None, timeout_s=5.0)
        c.clear_namespace("m/tp0")  # opens the namespace: not part of a save
        n = 16 << 10
        costs = {}
        for blocks in (8, 62):
            ks = keys(blocks, tag=bytes([blocks]))
            costs[blocks] = _save(c, pool, "m/tp0", ks, n)
            # every block is there, byte for byte, its checksum verified
            locs = c.get_many("m/tp0", ks)
            for k, loc in zip(ks, locs, strict=True):
                assert loc is not None and loc.checksum == native.crc32c(_content(k, n))
                out = bytearray(n)
                copy_verified(pool.buf, loc, out, key=k)
                assert bytes(out) == _content(k, n)
            assert c.release([loc.lease_id for loc in locs if loc]) == blocks
        if transport == "tcp":
            # One RESERVE_MANY and one COMMIT_MANY, whatever the block count.
            assert costs == {8: (2, 2), 62: (2, 2)}
        else:
            # 224-byte slots: 5 reservations or 13 commits a message, each batch one pipelined burst.
            assert costs[8] == (2 + 1, 2) and costs[62] == (13 + 5, 2)
        stats = c.stats()
        assert stats["entries"] == 70 and stats["reservations"] == 0
        c.close()
        pool.close()


@pytest.mark.timeout(120)
def test_a_ring_smaller_than_the_burst_is_used_as_a_sliding_window(manifest_path: Path, pool_path: Path) -> None:
    with server(manifest_path, pool_path) as srv:  # the small rack: 8 slots a ring
        pool = PoolMapping.open(pool_path)
        c = connect(f"cxl://{pool_path}#2", pool=pool, timeout_s=5.0)
        c.clear_namespace("m/tp0")
        messages, trips = _save(c, pool, "m/tp0", keys(62), 4096)
        assert messages == 13 + 5 and trips == 2 + 1  # 13 reserve messages over 8 slots: two windows
        assert c.lookup_prefix("m/tp0", keys(62)) == 62
        c.close()
        pool.close()
        _ = srv


class _InProcess(ClientTransport):
    """Requests straight into a service (an older server, here), one at a time."""

    scheme = kind = "inproc"
    example = "inproc://"

    def __init__(self, s: MetadataService) -> None:
        self.s = s
        self.max_payload = 224
        self.broken = False
        self._replies: deque = deque()

    @classmethod
    def open(cls, address: str, *, pool, timeout_s: float) -> _InProcess:  # noqa: ANN001
        raise NotImplementedError

    def default_client_id(self) -> int:
        return 1

    def reset(self) -> None:
        self._replies.clear()

    def submit(self, op: int, epoch: int, payload: bytes) -> int:
        code, reply = self.s.handle(op, epoch, payload, self.max_payload, 1)
        self._replies.append((code, self.s.epoch32, reply))
        return len(self._replies)

    def collect(self, timeout_ns: int):  # noqa: ANN201
        return self._replies.popleft()

    def call(self, op: int, epoch: int, payload: bytes, timeout_ns: int):  # noqa: ANN201
        self.submit(op, epoch, payload)
        return self.collect(timeout_ns)

    @property
    def pending(self) -> int:
        return len(self._replies)


def test_the_client_falls_back_to_single_requests_against_an_older_server() -> None:
    s = service()
    del s._dispatch[Op.RESERVE_MANY], s._dispatch[Op.COMMIT_MANY]  # a server from before them: BAD_OP
    c = KVIndexClient(_InProcess(s), address="inproc://old", client_id=1, timeout_s=1.0)
    c.reconnect()
    ks = keys(4)
    s.index.commit(s.index.reserve(s.index.open_namespace("ns"), ks[1], 4096)[0])
    got = c.reserve_many("ns", [(k, 4096) for k in ks])
    assert [r if isinstance(r, Code) else "reserved" for r in got] == ["reserved", Code.EXISTS, "reserved", "reserved"]
    tokens = [r.token for r in got if isinstance(r, Reservation)]
    assert c.finish_many([(tokens[0], 5), (tokens[1], 6)], [tokens[2]]) == ([Code.OK, Code.OK], [Code.OK])
    assert c.commit_many([(tokens[0], 5)]) == [Code.NO_RESERVATION]
    assert s.errors.get("BAD_OP") == 1  # asked once, then single requests only
    assert s.index.counters.commits == 3 and s.index.counters.aborts == 1
    assert s.index.counters.commits_checksummed == 2


def test_past_the_first_out_of_space_key_later_messages_reservations_are_given_back() -> None:
    """The server's rule holds within one message; the client applies it over the whole burst."""
    s = service(chunks=4)
    c = KVIndexClient(_InProcess(s), address="inproc://new", client_id=1, timeout_s=1.0)
    c.reconnect()
    ks = keys(12)
    sizes = [4096, 4096, 64 << 20] + [4096] * 9  # the third can never fit; 5 keys a message
    got = c.reserve_many("ns", list(zip(ks, sizes, strict=True)))
    assert [isinstance(r, Reservation) for r in got] == [True, True] + [False] * 10
    assert all(r is Code.POOL_FULL for r in got[2:])
    assert s.ops["RESERVE_MANY"] == 3  # messages 2 and 3 were granted ...
    assert len(s.index.pending) == 2 and s.index.counters.aborts == 7  # ... and given back in one COMMIT_MANY
    assert s.ops["COMMIT_MANY"] == 1


@pytest.mark.timeout(120)
def test_batched_commits_are_journaled_and_survive_a_sigkill(manifest_path: Path, pool_path: Path) -> None:
    import os
    import signal

    from belugactl.dataplane.metadata_errors import StaleEpoch

    ks = keys(12, tag=b"j")
    n = 20_000
    pool = PoolMapping.open(pool_path)
    with server(manifest_path, pool_path, "--restart-policy", "journal") as srv:
        c = connect(f"cxl://{pool_path}#2", pool=pool, timeout_s=2.0)
        got = c.reserve_many("m/tp0", [(k, n) for k in ks])
        commits = []
        for k, r in zip(ks[:10], got, strict=False):  # the last two are written, never committed
            data = _content(k, n)
            pool.write(r.extents[0][0], data)
            commits.append((r.token, native.crc32c(data)))
        assert c.finish_many(commits, [got[10].token]) == ([Code.OK] * 10, [Code.OK])
        os.kill(srv["proc"].pid, signal.SIGKILL)
        srv["proc"].wait(timeout=10)
    with server(manifest_path, pool_path, "--restart-policy", "journal") as srv2:
        assert srv2["restored_entries"] == 10
        with pytest.raises(StaleEpoch):
            c.get_many("m/tp0", ks)
        c.reconnect()
        assert c.lookup_prefix("m/tp0", ks) == 10
        locs = c.get_many("m/tp0", ks)
        assert locs[10] is None and locs[11] is None
        for k, loc in zip(ks[:10], locs, strict=False):
            assert loc is not None and loc.checksum == native.crc32c(_content(k, n))  # the journal kept it
            out = bytearray(n)
            copy_verified(pool.buf, loc, out, key=k)
        c.close()
    pool.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["tcp", "cxl"])
def test_a_long_prefix_lookup_is_one_burst_and_stops_at_the_first_gap(rack64, transport: str) -> None:
    """LOOKUP_PREFIX for a 124-block chain (a 4000-token prompt) goes out as one pipelined burst,
    not one round trip per slot's worth of keys; the prefix still ends at the first missing key,
    and leases granted past it are handed back."""
    manifest, pool_path = rack64
    with server(manifest, pool_path) as srv:
        pool = PoolMapping.open(pool_path)
        address = srv["rpc"] if transport == "tcp" else f"cxl://{pool_path}#1"
        c = connect(address, pool=pool if transport == "cxl" else None, timeout_s=5.0)
        c.clear_namespace("m/tp0")
        chain = keys(124, tag=b"L")
        _save(c, pool, "m/tp0", chain[:60], 4096)
        _save(c, pool, "m/tp0", chain[61:], 4096)  # a gap at block 60, then more present keys
        leases_before = c.stats()["leases"]
        trips = c.round_trips
        total, leases = c.lookup_prefix_leased("m/tp0", chain)
        assert total == 60
        assert c.round_trips - trips <= 2  # one burst (plus the release of the leases past the gap)
        assert c.stats()["leases"] == leases_before + len(leases)  # only the prefix's leases are held
        assert c.release(leases) == len(leases)
        trips = c.round_trips
        assert c.lookup_prefix("m/tp0", chain[:60]) == 60
        assert c.round_trips - trips == 1
        assert c.lookup_prefix("m/tp0", [b"absent" + bytes(26)] + chain[:60]) == 0
        c.close()
        pool.close()
