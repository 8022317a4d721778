"""Run inside the vLLM venv by test_observability.py: the stats class and the KV-event bookkeeping with
vLLM's real types (KVConnectorStats, KVConnectorPromMetrics on a private Prometheus registry,
BlockStored/BlockRemoved), no engine. Each check asserts; prints `RESULT {"passed": [...]}`."""

from __future__ import annotations

import functools
import json
import pickle
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as ext  # how vLLM publishes hashes
from vllm_beluga.kv_events import MAX_WAITING_STEPS, BelugaKVEvents, CommitObserver, SchedulerEvents, worker_events
from vllm_beluga.stats import ConnectorStats
from vllm_beluga.vllm_metrics import BelugaKVConnectorStats, BelugaPromMetrics

from belugactl.dataplane.client import Removal, Removals

passed: list[str] = []


def check(fn):
    fn()
    passed.append(fn.__name__)
    return fn


@check
def stats_interval_and_aggregate() -> None:
    sched, w0, w1 = (ConnectorStats(None, role=r) for r in ("scheduler", "worker0", "worker1"))
    assert BelugaKVConnectorStats.from_connector_stats(sched).is_empty()
    sched.add("lookups")
    sched.add("lookup_us", 40)
    sched.add("hit_requests")
    sched.add("hit_blocks", 7)
    for w, n in ((w0, 7), (w1, 7)):
        w.add("loaded_blocks", n)
        w.add("loaded_bytes", n * 4096)
        w.add("load_errors", 1)
        w.add("save_skipped_exists", 2)
        w.add("save_skipped_poolfull", 1)
        w.add("save_metadata_us", 100)
        w.add("save_metadata_us", 300)
        w.add("save_metadata_round_trips", 2)
    s = BelugaKVConnectorStats.from_connector_stats(sched, lookup_round_trips=3)
    a = BelugaKVConnectorStats.from_connector_stats(w0)
    b = BelugaKVConnectorStats.from_connector_stats(w1)
    assert BelugaKVConnectorStats.from_connector_stats(w0).is_empty()  # taken: the next interval is empty
    assert sched.get("hit_blocks") == 7  # the file counters are cumulative, untouched
    total = a.aggregate(b).aggregate(s)
    c = total.data["counters"]
    assert (c["hit_requests"], c["hit_blocks"], c["lookup_requests"]) == (1, 7, 1)
    assert (c["loaded_blocks"], c["loaded_bytes"], c["load_errors"]) == (14, 14 * 4096, 2)
    assert c["save_skipped"] == 6 and c["lookup_round_trips"] == 3 and c["save_metadata_round_trips"] == 4
    assert total.data["latency_us"]["save_metadata"] == [100, 300, 100, 300]
    assert total.data["latency_us"]["lookup"] == [40]
    r = total.reduce()
    assert r["Hit blocks"] == 7 and r["Load errors"] == 2 and r["Avg save metadata (us)"] == 200.0
    assert r["Metadata round trips"] == 7 and r["Loaded MiB"] == round(14 * 4096 / 2**20, 3)
    # Across processes: to_dict, pickled, rebuilt by the class method vLLM calls in the front end.
    again = BelugaKVConnectorStats(data=pickle.loads(pickle.dumps(total.to_dict())))
    assert again.data == total.data and not again.is_empty()
    assert total.aggregate(BelugaKVConnectorStats()).data == again.data  # an empty one adds nothing
    total.reset()
    assert total.is_empty()
    odd = BelugaKVConnectorStats(data={"counters": {"hit_blocks": 2, "from_the_future": 9}})
    assert odd.data["counters"]["hit_blocks"] == 2 and "from_the_future" not in odd.data["counters"]


@check
def prometheus_counters_and_histograms() -> None:
    reg = CollectorRegistry()
    types = {cls: functools.partial(cls, registry=reg) for cls in (Counter, Gauge, Histogram)}
    cfg = SimpleNamespace(kv_transfer_config=None)
    prom = BelugaPromMetrics(cfg, types, ["model_name", "engine"], {0: ["m", "0"], 1: ["m", "1"]})
    w = ConnectorStats(None, role="worker0")
    w.add("loaded_bytes", 5 * 8192)
    w.add("hit_blocks", 5)
    w.add("load_metadata_us", 250)
    data = BelugaKVConnectorStats.from_connector_stats(w).to_dict()
    prom.observe(data, engine_idx=1)
    prom.observe(data, engine_idx=1)

    def value(name: str, engine: str = "1") -> float | None:
        return reg.get_sample_value(name, {"model_name": "m", "engine": engine})

    assert value("vllm:beluga_loaded_bytes_total") == 2 * 5 * 8192
    assert value("vllm:beluga_hit_blocks_total") == 10
    assert value("vllm:beluga_loaded_bytes_total", "0") == 0
    assert value("vllm:beluga_load_metadata_seconds_count") == 2
    assert abs(value("vllm:beluga_load_metadata_seconds_sum") - 2 * 250e-6) < 1e-9


class FakeIndex:
    """The best-effort index as CommitObserver and SchedulerEvents use it."""

    def __init__(self) -> None:
        self.round_trips = 17
        self.answers: list = []
        self.asked: list = []

    def reserve_many(self, namespace, keys, nbytes):
        return [None if k.startswith(b"x") else SimpleNamespace(token=i + 100) for i, k in enumerate(keys)]

    def finish_many(self, commits, aborts):
        return [token != 101 for token, _crc in commits]  # the second reservation's commit fails

    def removals_since(self, namespace, cursor, epoch):
        self.asked.append((cursor, epoch))
        return self.answers.pop(0) if self.answers else None


@check
def commit_observer_reports_only_committed_keys() -> None:
    index = FakeIndex()
    obs = CommitObserver(index)
    assert obs.round_trips == 17  # everything else passes through
    got = obs.reserve_many("ns", [b"a", b"b", b"xc", b"d"], 4096)
    assert obs.finish_many([(got[0].token, 1), (got[1].token, 2)], [got[3].token]) == [True, False]
    assert obs.take_committed() == [b"a"] and obs.take_committed() == []
    events = worker_events(obs, 32, "CXL")
    assert events is None
    obs.committed = [b"k1", b"k2"]
    events = worker_events(obs, 32, "CXL")
    assert events and [e.block_hashes for e in events.get_all_events()] == [[b"k1"], [b"k2"]]
    assert not BelugaKVEvents() and pickle.loads(pickle.dumps(events)).get_all_events() == events.get_all_events()
    off = CommitObserver(index, enabled=False)
    got = off.reserve_many("ns", [b"a"], 1)
    off.finish_many([(got[0].token, 3)], [])
    assert off.take_committed() == []


def worker_events_of(keys: list[bytes]) -> list[BlockStored]:
    obs = CommitObserver(FakeIndex())
    obs.committed = list(keys)
    got = worker_events(obs, 4, "CXL")
    return got.get_all_events() if got else []


def _request(req_id: str, keys: list[bytes], bs: int):
    tokens = list(range(len(keys) * bs + 3))
    return SimpleNamespace(request_id=req_id, all_token_ids=tokens, lora_request=None, block_hashes=keys,
                           mm_features=[], cache_salt=None, prompt_embeds=None)  # fmt: skip


@check
def stored_events_wait_for_every_rank_and_carry_tokens() -> None:
    bs = 4
    keys = [bytes([i]) * 32 for i in range(5)]
    req = _request("r1", keys, bs)
    ev = SchedulerEvents(index=FakeIndex(), namespace="ns", block_size=bs, ranks=2,
                         stats=ConnectorStats(None, role="scheduler"), medium="CXL", poll_s=1e9)  # fmt: skip
    ev._next_poll = float("inf")  # stores only in this check
    saves = [SimpleNamespace(req_id="r1", keys=keys[1:4], block_ids=[7, 8, 9])]
    ev.note_saves(saves, {"r1": SimpleNamespace(request=req)}, lambda r: list(r.block_hashes))
    one_rank = BelugaKVEvents(worker_events_of(keys[1:4]))
    ev.absorb(one_rank)
    assert ev.take() == []  # rank 1 has not committed yet
    ev.absorb(BelugaKVEvents(worker_events_of(keys[1:3])))
    out = ev.take()
    assert len(out) == 1 and isinstance(out[0], BlockStored)
    e = out[0]
    assert (e.block_hashes, e.parent_block_hash, e.medium) == ([ext(k) for k in keys[1:3]], ext(keys[0]), "CXL"), e
    assert e.token_ids == list(range(bs, 3 * bs)) and e.block_size == bs
    # keys[3]: one rank only; forgotten after MAX_WAITING_STEPS steps, never published half-stored.
    for _ in range(MAX_WAITING_STEPS + 70):
        assert ev.take() == []
    assert not ev._confirmed and keys[3] not in ev._notes
    # A commit nobody planned (or planned too long ago) says nothing rather than something wrong.
    ev.absorb(BelugaKVEvents(worker_events_of([b"z" * 32]) * 2))
    assert ev.take() == []


@check
def removals_follow_the_cursor_and_restart_with_the_server() -> None:
    index = FakeIndex()
    clock = [0.0]
    ev = SchedulerEvents(index=index, namespace="ns", block_size=4, ranks=1, stats=ConnectorStats(None, role="s"),
                         medium="CXL", poll_s=1.0, clock=lambda: clock[0])  # fmt: skip

    def page(items, nxt, head, lost=0, epoch=7):
        return Removals([Removal(1, k, "evicted") for k in items], nxt, head, lost, epoch)

    index.answers = [(page([], 1, 40), True), (page([b"a" * 32, b"b" * 32], 42, 42), False)]
    out = ev.take()
    assert index.asked == [(0, 0), (40, 7)]  # a head query first: follow from the server's present (head 40)
    assert len(out) == 1 and isinstance(out[0], BlockRemoved)
    assert out[0].block_hashes == [ext(b"a" * 32), ext(b"b" * 32)] and out[0].medium == "CXL"
    assert ev.take() == [] and len(index.asked) == 2  # not before poll_s
    clock[0] = 1.5
    # Behind: MAX_POLL_CALLS pages this step, the rest at the very next step.
    index.answers = [(page([bytes([i]) * 32], 43 + i, 100), False) for i in range(8)]
    assert len(ev.take()[0].block_hashes) == 8
    index.answers = [(page([b"c" * 32], 100, 100, lost=3), False)]
    assert ev.take()[0].block_hashes == [ext(b"c" * 32)] and ev.stats.get("removals_lost") == 3
    clock[0] = 3.0
    index.answers = [(page([], 1, 5, epoch=8), True), (page([], 5, 5, epoch=8), False)]
    assert ev.take() == [] and index.asked[-2:] == [(100, 7), (5, 8)]
    assert ev.stats.get("removal_epoch_changes") == 1
    clock[0] = 4.5
    index.answers = []  # the server is away: nothing, and the cursor is kept
    assert ev.take() == [] and index.asked[-1] == (5, 8)


print("RESULT " + json.dumps({"passed": passed}))
