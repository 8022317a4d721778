"""Worker-side block moves against a real metadata server and a real file pool (no vLLM needed):
saves become visible only after commit, loads put the same bytes back, failures become recomputes."""

from __future__ import annotations

import json
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.stats import ConnectorStats
from vllm_beluga.transfer import PoolTransfer

from belugactl.dataplane.kvcopy import KVBlockLayout, KVCopyEngine, TensorView, buffer_address
from belugactl.pool.mapping import PoolMapping
from tests.support.blocks import zeros_crc

REPO = Path(__file__).resolve().parents[3]
NS = "test@layout@tp0of1"
BLOCKS = 8
PIECE = 4096


@pytest.fixture
def tensors() -> Iterator[tuple[list[mmap.mmap], KVBlockLayout]]:
    """Three 'layers', each [BLOCKS, PIECE] bytes (a CPU-backend-like layout), random contents."""
    bufs = [mmap.mmap(-1, BLOCKS * PIECE) for _ in range(3)]
    for b in bufs:
        b[:] = os.urandom(len(b))
    views = [
        TensorView(f"l{i}", buffer_address(b), (BLOCKS, PIECE), (PIECE, 1), 1, "uint8") for i, b in enumerate(bufs)
    ]
    yield bufs, KVBlockLayout.from_views(views)
    for b in bufs:
        b.close()


# The scheduler and workers of these tests are one engine's: a worker may release its scheduler's leases.
ENGINE = 0xE17E


def _block(bufs: list[mmap.mmap], block: int) -> bytes:
    return b"".join(b[block * PIECE : (block + 1) * PIECE] for b in bufs)


def _transfer(address: str, pool: PoolMapping, layout: KVBlockLayout, stats: ConnectorStats) -> PoolTransfer:
    index = BestEffortIndex(address, stats=stats, timeout_s=1.0, retry_s=0.2, handover_group=ENGINE)
    return PoolTransfer(index, KVCopyEngine(layout, pool.buf), NS, stats)


def _present(index: BestEffortIndex, keys: list[bytes]) -> int:
    """How many leading `keys` the pool has, asked on the index's own client without taking leases."""
    assert index.connect_now()
    return index._client.lookup_prefix(NS, keys)


def test_saved_blocks_load_back_into_other_slots_byte_for_byte(server, tensors, tmp_path) -> None:
    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    stats = ConnectorStats(str(tmp_path / "stats"), role="worker0")
    writer = _transfer(server.tcp, pool, layout, stats)
    keys = [f"key{i}".encode() for i in range(3)]
    assert _present(writer.index, keys) == 0
    assert writer.save([1, 2, 3], keys) == 3
    assert _present(writer.index, keys) == 3
    assert writer.save([1], keys[:1]) == 0  # present already: skipped, counted
    assert stats.get("save_skipped_exists") == 1
    want = [_block(bufs, b) for b in (1, 2, 3)]

    reader = _transfer(server.tcp, pool, layout, ConnectorStats(None, role="worker1"))
    assert reader.load([5, 6, 7], keys) == []
    assert [_block(bufs, b) for b in (5, 6, 7)] == want
    assert reader.stats.get("loaded_blocks") == 3
    stats.flush()
    doc = json.loads((tmp_path / "stats.worker0.json").read_text())
    assert doc["counters"]["saved_blocks"] == 3
    writer.index.close()
    reader.index.close()


def test_a_block_gone_from_the_pool_is_reported_failed_not_loaded(server, tensors) -> None:
    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    t = _transfer(server.tcp, pool, layout, ConnectorStats(None, role="worker0"))
    assert t.save([0, 1], [b"a", b"b"]) == 2
    assert t.index.connect_now()
    t.index._client.delete(NS, b"b")  # evicted between the scheduler's lookup and the load
    before = _block(bufs, 7)
    assert t.load([6, 7], [b"a", b"b"]) == [7]
    assert _block(bufs, 7) == before  # untouched: vLLM recomputes it
    assert _block(bufs, 6) == _block(bufs, 0)
    assert t.stats.get("load_errors") == 1
    t.index.close()


def test_server_down_means_misses_and_skipped_saves(server, tensors, tmp_path) -> None:
    _, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    stats = ConnectorStats(str(tmp_path / "s"), role="scheduler")
    t = _transfer(server.tcp, pool, layout, stats)
    assert t.save([0], [b"k0"]) == 1
    server.proc.terminate()
    server.proc.wait(timeout=20)
    assert t.index.lookup_prefix_leased(NS, [b"k0"]) == (0, [])  # unreachable: a miss, not an exception
    assert t.save([1], [b"k1"]) == 0
    assert t.load([2], [b"k0"]) == [2]
    assert stats.get("server_unavailable") >= 1
    assert t.index.healthy is False
    stats.flush()
    assert json.loads((tmp_path / "s.scheduler.json").read_text())["healthy"] is False


def test_nothing_is_copied_without_a_pool(tensors) -> None:
    stats = ConnectorStats(None, role="worker0")
    t = PoolTransfer(BestEffortIndex("tcp://127.0.0.1:1", stats=stats), None, NS, stats)
    assert t.load([1, 2], [b"x", b"y"]) == [1, 2]
    assert t.save([1], [b"x"]) == 0


def test_locations_found_by_the_scheduler_are_loaded_and_their_leases_released(server, tensors) -> None:
    from vllm_beluga.transfer import locate_many

    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    worker = _transfer(server.tcp, pool, layout, ConnectorStats(None, role="worker0"))
    assert worker.save([0, 1], [b"p", b"q"]) == 2
    scheduler = BestEffortIndex(server.tcp, stats=ConnectorStats(None, role="scheduler"), handover_group=ENGINE)
    locations = [locate_many(scheduler, NS, [k])[0] for k in (b"p", b"zz", b"q")]
    assert locations[1] is None and locations[0] is not None
    assert scheduler.connect_now()
    leases_held = scheduler._client.stats()["leases"]
    assert leases_held >= 2
    # the third block id has no location at all (a short list): it fails too
    assert set(worker.load([4, 5, 6, 7], [b"p", b"zz", b"q", b"r"], locations)) == {5, 7}
    assert _block(bufs, 4) == _block(bufs, 0) and _block(bufs, 6) == _block(bufs, 1)
    assert scheduler._client.stats()["leases"] == leases_held - 2
    scheduler.close()
    worker.index.close()


def test_spare_leases_are_released_with_the_loads_own_in_one_burst(server, tensors) -> None:
    # The scheduler located more blocks than the load copies (the block holding the last token): the
    # worker releases those leases in its own release burst, and only the load's own say whether the
    # copied bytes can be trusted.
    from vllm_beluga.transfer import locate_many

    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    worker = _transfer(server.tcp, pool, layout, ConnectorStats(None, role="worker0"))
    assert worker.save([0, 1, 2], [b"a", b"b", b"c"]) == 3
    scheduler = BestEffortIndex(server.tcp, stats=ConnectorStats(None, role="scheduler"), handover_group=ENGINE)
    located = locate_many(scheduler, NS, [b"a", b"b", b"c"])
    assert scheduler._client.stats()["leases"] == 3
    trips = worker.index.round_trips
    assert worker.load([4, 5], [b"a", b"b"], located[:2], [located[2][1]]) == []
    assert worker.index.round_trips - trips == 1  # the release: one burst for both sets
    assert _block(bufs, 4) == _block(bufs, 0) and _block(bufs, 5) == _block(bufs, 1)
    assert scheduler._client.stats()["leases"] == 0
    assert worker.stats.counters.get("leases_expired_in_load", 0) == 0
    # A spare lease that already ended does not make the load's good bytes suspect.
    again = locate_many(scheduler, NS, [b"a", b"b"])
    assert scheduler.release([again[1][1]]) == 1
    assert worker.load([6], [b"a"], again[:1], [again[1][1]]) == []
    assert worker.stats.counters.get("leases_expired_in_load", 0) == 0
    scheduler.close()
    worker.index.close()


def test_release_groups_counts_each_set_apart(server) -> None:
    from belugactl.dataplane.client import connect

    c = connect(server.tcp, timeout_s=5)
    try:
        for key in (b"k1", b"k2", b"k3"):
            c.commit(c.reserve(NS, key, 64).token, zeros_crc(64))
        leases = [c.get(NS, k).lease_id for k in (b"k1", b"k2", b"k3")]
        assert c.release([leases[2]]) == 1
        trips = c.round_trips
        assert c.release_groups([[leases[0]], [], [leases[1], leases[2]], [0]]) == [1, 0, 1, 0]
        assert c.round_trips - trips == 1
        assert c.release_groups([[], []]) == [0, 0]
    finally:
        c.close()


class _SplitEngine(KVCopyEngine):
    """Plans every batch piece by piece (as for blocks split over extents), so the transfer takes
    the engine's copy and checksums the pool bytes after it, instead of the copy that checksums
    in flight."""

    def block_pairs(self, blocks):  # noqa: ANN001, ANN202 - the engine's own signature
        super().block_pairs(blocks)  # its checks still run
        return None


@pytest.mark.parametrize("engine_cls", [KVCopyEngine, _SplitEngine], ids=["checksum-in-copy", "pool-side"])
def test_a_block_overwritten_after_its_commit_is_a_load_error_counted_and_deleted(
    server, tensors, engine_cls, monkeypatch
) -> None:
    from belugactl.dataplane import native

    bufs, layout = tensors
    pool = PoolMapping.open(server.pool_path)
    stats = ConnectorStats(None, role="worker0")
    index = BestEffortIndex(server.tcp, stats=stats, timeout_s=1.0, retry_s=0.2)
    t = PoolTransfer(index, engine_cls(layout, pool.buf), NS, stats)
    if engine_cls is _SplitEngine:
        monkeypatch.setattr(native, "gather_blocks_crc32c", _refuse)
        monkeypatch.setattr(native._native or native, "gather_blocks_crc32c", _refuse, raising=False)
    assert t.save([0, 1], [b"a", b"b"]) == 2
    assert stats.get("saved_blocks") == 2
    loc = t.index.get_many_tuples(NS, [b"b"])[0]
    assert loc[3] == native.crc32c(_block(bufs, 1))  # the saver committed the bytes' CRC32C
    t.index.release([loc[1]])
    # A stalled writer stores into b's extents after b's commit (its reservation was reclaimed).
    off, n = loc[0][0]
    pool.write(off + n // 2, b"\x5a" * 64)
    assert t.load([6, 7], [b"a", b"b"]) == [7]  # block 7 holds the bad bytes: vLLM recomputes it
    assert _block(bufs, 6) == _block(bufs, 0)
    assert stats.get("load_checksum_mismatch") == 1 and stats.get("load_errors") == 1
    assert stats.get("loaded_blocks") == 1
    assert _present(t.index, [b"b"]) == 0  # deleted: later readers miss instead of re-reading it
    t.index.close()


def _refuse(*_a: object, **_k: object) -> list[int]:
    raise AssertionError("the pool-side path must not checksum in the copy")


@pytest.fixture
def tensors64() -> Iterator[tuple[list[mmap.mmap], KVBlockLayout]]:
    """Like `tensors`, with 64 blocks: room for a 2000-token request's 62 blocks."""
    blocks = 64
    bufs = [mmap.mmap(-1, blocks * PIECE) for _ in range(3)]
    for b in bufs:
        b[:] = os.urandom(len(b))
    views = [
        TensorView(f"l{i}", buffer_address(b), (blocks, PIECE), (PIECE, 1), 1, "uint8") for i, b in enumerate(bufs)
    ]
    yield bufs, KVBlockLayout.from_views(views)
    for b in bufs:
        b.close()


@pytest.mark.parametrize("transport", ["tcp", "cxl"])
def test_a_requests_save_costs_the_same_metadata_round_trips_for_2_and_62_blocks(
    server, tensors64, transport
) -> None:
    import hashlib

    bufs, layout = tensors64
    pool = PoolMapping.open(server.pool_path)
    address = server.tcp if transport == "tcp" else f"cxl://{server.pool_path}#1"
    stats = ConnectorStats(None, role="worker0")
    t = _transfer(address, pool, layout, stats)
    assert _present(t.index, [b"first"]) == 0  # connects and opens the namespace: once per connection
    cost = {}
    load_cost = {}
    for blocks in (2, 62):
        keys = [hashlib.sha256(f"{blocks}-{i}".encode()).digest() for i in range(blocks)]  # vLLM-like hashes
        before = {k: stats.get(k) for k in ("save_requests", "save_metadata_round_trips", "save_metadata_messages")}
        assert t.save(list(range(blocks)), keys) == blocks
        after = {k: stats.get(k) - v for k, v in before.items()}
        assert after["save_requests"] == 1
        cost[blocks] = (after["save_metadata_round_trips"], after["save_metadata_messages"])
        assert _present(t.index, keys) == blocks
        # loaded back byte for byte (over scrambled tensors), checksums verified on the way
        want = [_block(bufs, b) for b in range(blocks)]
        for b in bufs:
            b[:] = os.urandom(len(b))
        trips = stats.get("load_metadata_round_trips")
        assert t.load(list(range(blocks)), keys) == []
        load_cost[blocks] = stats.get("load_metadata_round_trips") - trips
        assert [_block(bufs, b) for b in range(blocks)] == want
    # A load finds a request's blocks in one GET_MANY burst, whatever their number.
    assert load_cost == {2: 1, 62: 1}, load_cost
    if transport == "tcp":
        assert cost == {2: (2, 2), 62: (2, 2)}  # one RESERVE_MANY, one COMMIT_MANY
    else:
        # A slot carries as many reservations or commits as fit (the CPU demo's 8 KiB: all 62; 256 B
        # slots: 5 and 13, tests/dataplane/test_batched_puts.py): more messages, still one burst each way.
        from belugactl.dataplane.rpc import protocol as p

        payload = pool.geometry.slot_size - p.HEADER_SIZE
        msgs = -(-62 // p.reserve_many_capacity(payload, 32)) + -(-62 // p.commit_many_capacity(payload))
        assert cost == {2: (2, 2), 62: (2, msgs)}
    assert stats.get("saved_blocks") == 64 and stats.get("load_checksum_mismatch") == 0
    assert stats.get("save_metadata_us") > 0
    t.index.close()


def _scheduler_hit(scheduler: BestEffortIndex, keys: list[bytes]):  # noqa: ANN202 - (locations, trusted_until)
    from vllm_beluga.transfer import locate_many

    asked = time.monotonic()
    located = locate_many(scheduler, NS, keys)
    return located, scheduler.lease_trusted_until(asked)


def _saved_and_hit(server, layout: KVBlockLayout, keys: list[bytes]):  # noqa: ANN001, ANN202
    """A worker on ring 2 that saved `keys` into blocks 0.., and a scheduler on ring 1 that found
    them: (worker, scheduler, locations with their leases, trusted_until)."""
    pool = PoolMapping.open(server.pool_path)
    worker = _transfer(server.cxl(2), pool, layout, ConnectorStats(None, role="worker0"))
    assert worker.save(list(range(len(keys))), keys) == len(keys)
    scheduler = BestEffortIndex(server.cxl(1), stats=ConnectorStats(None, role="scheduler"), handover_group=ENGINE)
    located, trusted = _scheduler_hit(scheduler, keys)
    return worker, scheduler, located, trusted


def _found_then_released(index: BestEffortIndex, keys: list[bytes]) -> int:
    """The index's own lookup (it takes earlier pending replies first, and counts what they said),
    its leases released at once."""
    found, leases = index.lookup_prefix_leased(NS, keys)
    index.release(leases)
    return found


def _leases_held(scheduler: BestEffortIndex, timeout_s: float = 5.0) -> int:
    """Leases the server still holds once releases sent without waiting had time to arrive."""
    deadline = time.monotonic() + timeout_s
    while scheduler._client.stats()["leases"] and time.monotonic() < deadline:
        time.sleep(0.01)
    return scheduler._client.stats()["leases"]


def _count_one_call_loads(monkeypatch, *, enabled: bool) -> list[int]:
    """Calls of the one-call load (copy, check, release sent without waiting: `load_blocks_checked`); with
    `enabled` False the worker has no such helper and runs the steps separately."""
    from belugactl.dataplane import native

    calls: list[int] = []
    real = native.load_blocks_checked
    if not enabled or real is None:
        monkeypatch.setattr(native, "load_blocks_checked", None)
        return calls

    def spy(*args):  # noqa: ANN002, ANN202
        calls.append(len(args))
        return real(*args)

    monkeypatch.setattr(native, "load_blocks_checked", spy)
    return calls


@pytest.mark.parametrize(
    "one_call",
    [pytest.param(True, id="one-native-call", marks=pytest.mark.native), pytest.param(False, id="separate-steps")],
)
def test_a_load_within_the_lease_window_sends_its_release_without_waiting_and_loads_the_same_bytes(
    server, tensors, one_call, monkeypatch
) -> None:
    from vllm_beluga.transfer import monotonic_clock_id

    calls = _count_one_call_loads(monkeypatch, enabled=one_call)
    bufs, layout = tensors
    worker, scheduler, located, trusted = _saved_and_hit(server, layout, [b"a", b"b", b"c"])
    assert trusted is not None and trusted > time.monotonic()
    assert scheduler._client.stats()["leases"] == 3
    trips = worker.index.round_trips
    assert worker.load([4, 5], [b"a", b"b"], located[:2], [located[2][1]], trusted, monotonic_clock_id()) == []
    assert worker.index.round_trips == trips  # the release was sent: no wait on the load's path
    assert worker.stats.get("load_releases_posted") == 1 and len(calls) == int(one_call)
    assert worker.stats.get("load_release_us") > 0
    assert _block(bufs, 4) == _block(bufs, 0) and _block(bufs, 5) == _block(bufs, 1)
    assert _leases_held(scheduler) == 0  # all three, the spare one too
    # The worker's next request takes the pending reply first and works as usual.
    assert _found_then_released(worker.index, [b"a", b"b"]) == 2
    assert worker.index._client.replies_pending == 0 and worker.stats.get("posted_release_leases_ended") == 0
    scheduler.close()
    worker.index.close()


@pytest.mark.native
def test_a_one_call_load_that_raises_gives_its_booked_release_back(server, tensors, monkeypatch) -> None:
    """The release is booked on the ring before the copy; a native call that raises (its arguments
    are checked before a byte moves) sent nothing: the booking is undone, the batch recomputed,
    the leases released the usual way, and the worker's ring stays in step."""
    from vllm_beluga.transfer import monotonic_clock_id

    from belugactl.dataplane import native

    def refuse(*args):  # noqa: ANN002, ANN202
        raise ValueError("block 4 piece 0 is outside the tensors")

    bufs, layout = tensors
    worker, scheduler, located, trusted = _saved_and_hit(server, layout, [b"u", b"v"])
    before = bytes(_block(bufs, 4))
    monkeypatch.setattr(native, "load_blocks_checked", refuse)
    assert sorted(worker.load([4, 5], [b"u", b"v"], located, [], trusted, monotonic_clock_id())) == [4, 5]
    assert _block(bufs, 4) == before
    assert _leases_held(scheduler) == 0  # released the usual way (the window is still open)
    assert _found_then_released(worker.index, [b"u", b"v"]) == 2  # the ring is in step
    assert worker.index._client.replies_pending == 0 and worker.stats.get("server_unavailable") == 0
    assert worker.stats.get("posted_release_leases_ended") == 0 and worker.stats.get("release_failed") == 0
    scheduler.close()
    worker.index.close()


@pytest.mark.parametrize("why", ["window-passed", "other-clock", "no-deadline"])
def test_outside_the_lease_window_a_load_waits_for_the_live_count(server, tensors, why, monkeypatch) -> None:
    from vllm_beluga.transfer import monotonic_clock_id

    calls = _count_one_call_loads(monkeypatch, enabled=True)
    bufs, layout = tensors
    worker, scheduler, located, trusted = _saved_and_hit(server, layout, [b"p", b"q"])
    clock = monotonic_clock_id()
    if why == "window-passed":
        trusted = time.monotonic() - 0.001  # the copy ended after the window (a stalled worker)
    elif why == "other-clock":
        clock = "another-host/0"  # a deadline read on another host's monotonic clock means nothing here
    else:
        trusted = None  # an older server said no TTL
    trips = worker.index.round_trips
    assert worker.load([4, 5], [b"p", b"q"], located, [], trusted, clock) == []
    assert worker.index.round_trips - trips == 1  # the release, waited for: its count is checked
    assert worker.stats.get("load_releases_posted") == 0
    # The one-call load copied (and, with a deadline, sent no release: it had passed or meant nothing).
    from belugactl.dataplane import native

    assert len(calls) == (1 if native.load_blocks_checked is not None else 0)
    assert scheduler._client.stats()["leases"] == 0
    assert _block(bufs, 4) == _block(bufs, 0) and _block(bufs, 5) == _block(bufs, 1)
    scheduler.close()
    worker.index.close()


def test_leases_that_expired_during_a_slow_load_are_still_caught(tmp_path, tensors) -> None:
    # A short lease TTL and a load that outlives it: the trust window has passed, so the worker
    # waits for the release's count, sees the ended leases, and recomputes instead of trusting.
    from vllm_beluga.transfer import monotonic_clock_id

    from tests.support.mds_process import cpu_demo_mds

    bufs, layout = tensors
    with cpu_demo_mds(tmp_path, "--lease-ttl", "0.3") as server:
        pool = PoolMapping.open(server.pool_path)
        worker = _transfer(server.cxl(2), pool, layout, ConnectorStats(None, role="worker0"))
        assert worker.save([0, 1], [b"s", b"t"]) == 2
        scheduler = BestEffortIndex(server.cxl(1), stats=ConnectorStats(None, role="scheduler"), handover_group=ENGINE)
        located, trusted = _scheduler_hit(scheduler, [b"s", b"t"])
        assert trusted is not None
        time.sleep(0.8)  # past the TTL: the server ended both leases
        failed = worker.load([4, 5], [b"s", b"t"], located, [], trusted, monotonic_clock_id())
        assert sorted(failed) == [4, 5]
        assert worker.stats.get("leases_expired_in_load") == 2 and worker.stats.get("load_releases_posted") == 0
        scheduler.close()
        worker.index.close()
        pool.close()
