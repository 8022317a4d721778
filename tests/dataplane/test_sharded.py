"""The index's maps that grow without a pause (mds/sharded.py): a ShardedMap answers as a dict does and
its shards never double all at once; a GenerationLRU keeps exactly an OrderedDict's order while its
generations stay few and small. Model-based: the same random operations on both, compared."""

from __future__ import annotations

import random
import sys
from collections import OrderedDict

import pytest

from belugactl.dataplane.mds import sharded
from belugactl.dataplane.mds.sharded import SHARDS, SPLIT_AT, GenerationLRU, ShardedMap


def test_a_sharded_map_answers_as_a_dict_does() -> None:
    rng = random.Random(7)
    m, d = ShardedMap(), {}
    keys = [(rng.randrange(4), rng.randbytes(8)) for _ in range(300)] + list(range(0, 300 << 21, 1 << 21))
    for _ in range(20_000):
        k = rng.choice(keys)
        op = rng.randrange(5)
        if op == 0:
            m[k] = d[k] = rng.random()
        elif op == 1:
            assert m.pop(k, None) == d.pop(k, None)
        elif op == 2:
            assert m.get(k) == d.get(k) and (k in m) == (k in d)
        elif op == 3 and k in d:
            del m[k], d[k]
        else:
            assert len(m) == len(d) and bool(m) == bool(d)
    assert m == d and dict(m.items()) == d and sorted(m.values()) == sorted(d.values()) and set(m) == set(d)
    with pytest.raises(KeyError):
        m[("absent", b"")]
    m.clear()
    assert not m and len(m) == 0


def test_setdefault_stores_once_and_splits_as_inserts_do() -> None:
    m = ShardedMap()
    for i in range(SPLIT_AT + 5):  # past the size at which one dict becomes the shards
        assert m.setdefault(i, str(i)) == str(i)
        assert m.setdefault(i, "again") == str(i)
    assert len(m) == SPLIT_AT + 5 and all(m[i] == str(i) for i in range(SPLIT_AT + 5))
    assert len(m._dicts) == SHARDS  # split


@pytest.mark.parametrize("keys", ["sequential ids", "2 MiB offsets", "block keys"])
def test_keys_spread_over_every_shard_in_their_shares(keys: str) -> None:
    n = 200_000
    make = {
        "sequential ids": lambda i: i + 1,
        "2 MiB offsets": lambda i: i << 21,
        "block keys": lambda i: (3, i.to_bytes(8, "little") * 4),
    }[keys]
    m = ShardedMap()
    for i in range(n):
        m[make(i)] = i
        if i == SPLIT_AT - 1:
            assert len(m._dicts) == 1  # one dict until SPLIT_AT keys
    assert len(m._dicts) == SHARDS and len(m) == n
    sizes = [len(d) for d in m._dicts]
    assert max(sizes) <= 2.2 * n / SHARDS and min(sizes) >= 0.4 * n / SHARDS, (keys, min(sizes), max(sizes))
    assert all(m[make(i)] == i for i in range(0, n, 997))


def test_a_batch_of_inserts_copies_a_few_percent_of_the_map_at_most() -> None:
    """Batches of 500 inserts (a COMMIT_MANY) of sequential entry ids, evenly spread keys: shards of
    equal shares would all double in the same batch (copying the whole map, as one dict does); the
    staggered shares spread the doublings out. What a batch's doublings copy, against the map's size."""
    m = ShardedMap()
    sizes = [sys.getsizeof(d) for d in m._dicts]
    worst = 0.0
    for start in range(0, 400_000, 500):
        for i in range(start, start + 500):
            m[i] = i
        now = [sys.getsizeof(d) for d in m._dicts]
        if len(now) == len(sizes) and start >= 50_000:
            copied = sum(len(d) for d, a, b in zip(m._dicts, now, sizes, strict=True) if a != b)
            worst = max(worst, copied / len(m))
        sizes = now
    assert worst <= 0.06, worst


class _E:
    __slots__ = ("key", "gen")

    def __init__(self, key: int) -> None:
        self.key, self.gen = key, None


@pytest.fixture
def small_generations(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sharded, "GENERATION", 16)
    return 16


def test_a_generation_lru_keeps_an_ordered_dicts_order(small_generations: int) -> None:
    rng = random.Random(11)
    lru, model = GenerationLRU(), OrderedDict()
    live: dict[int, _E] = {}
    for step in range(40_000):
        op = rng.randrange(10)
        k = rng.randrange(2_000)
        if op < 4 and k not in live:
            e = live[k] = _E(k)
            lru.add(e)
            model[k] = e
        elif op < 7 and k in live:
            lru.touch(live[k])
            model.move_to_end(k)
        elif op < 9 and k in live:
            assert lru.discard(live.pop(k))
            del model[k]
        elif k not in live:
            assert not lru.discard(_E(k))
        if step % 997 == 0:
            assert [e.key for e in lru.values()] == list(model) and list(lru) == list(model)
        assert len(lru) == len(model)
    assert [e.key for e in lru.values()] == list(model)
    # Few generations for what they hold: neighbours that would fit half a generation were merged.
    assert lru.generations <= 8 * len(model) / small_generations + 2, (lru.generations, len(model))


def test_a_cold_straggler_per_generation_does_not_pile_up_generations(small_generations: int) -> None:
    """The adversarial pattern: every generation left with one cold entry, the rest touched away."""
    lru = GenerationLRU()
    entries = [_E(k) for k in range(small_generations * 200)]
    for e in entries:
        lru.add(e)
    for i, e in enumerate(entries):
        if i % small_generations:
            lru.touch(e)  # all but one of each generation move to the hot end
    cold = [e.key for e in entries[:: small_generations]]
    assert [e.key for e in lru.values()][: len(cold)] == cold  # still exactly in LRU order
    for i, e in enumerate(entries):
        if i % small_generations:
            assert lru.discard(e)
    assert [e.key for e in lru.values()] == cold and len(lru) == len(cold)
    # 200 stragglers, one per generation they were added in: merged, not 200 generations of one.
    assert lru.generations <= 8 * len(lru) / small_generations + 2, lru.generations


def test_put_new_and_put_many_store_as_a_dict_does_across_the_split() -> None:
    """The restart's one-call inserts: put_new keeps the first value of a key (given twice in the batch
    or already there) and returns what it stored, in order; put_many overwrites, as `m[k] = v`."""
    m, d = ShardedMap(), {}
    m[3] = d[3] = "before"
    keys = [*range(SPLIT_AT + 10), 5, 3]  # a key twice in the batch, and one already in the map
    vals = [f"v{k}" for k in keys[:-2]] + ["dup", "again"]
    stored = m.put_new(keys, vals)
    for k, v in zip(keys, vals, strict=True):
        d.setdefault(k, v)
    assert m == d and len(m._dicts) == SHARDS  # split before the batch went in
    assert stored == [v for k, v in zip(keys, vals, strict=True) if k != 3][: SPLIT_AT + 9]
    m.put_many([1, 2, 10**9], ["x", "y", "z"])
    d.update({1: "x", 2: "y", 10**9: "z"})
    assert m == d and m[1] == "x"
    small = ShardedMap()
    small.put_many([1, 2], ["a", "b"])
    assert len(small._dicts) == 1 and dict(small.items()) == {1: "a", 2: "b"}  # stays one dict below SPLIT_AT
    with pytest.raises(ValueError):
        small.put_many([1], [])


def test_add_many_keeps_the_order_and_generations_of_adds_one_by_one(small_generations: int) -> None:
    one, many = GenerationLRU(), GenerationLRU()
    a = [_E(k) for k in range(10 * small_generations + 3)]
    b = [_E(k) for k in range(10 * small_generations + 3)]
    for e in a[:5]:
        one.add(e)
    for e in a[5:]:
        one.add(e)
    many.add_many(b[:5])  # a partly filled generation first, then batches across several
    many.add_many(b[5:])
    assert [e.key for e in many.values()] == [e.key for e in one.values()] and len(many) == len(one)
    assert many.generations == one.generations
    assert [len(e.gen) for e in b] == [len(e.gen) for e in a]  # each entry knows its own generation
    many.touch(b[0])
    assert [e.key for e in many.values()][-1] == 0 and len(many) == len(b)


@pytest.mark.skipif(sharded._native_put is None, reason="no native helper")
def test_the_native_batch_put_places_every_key_where_the_map_looks_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Keys of every kind the index uses (ints, negative hashes, block offsets, bytes, (namespace, key)
    # tuples): the native put and the Python loop give the same shards, and each key is found.
    keys: list = [*range(-500, 5000), *(i << 21 for i in range(3000)), *(i.to_bytes(32, "little") for i in range(3000))]
    keys += [(i % 7, i.to_bytes(8, "big")) for i in range(3000)] + [2**63, -(2**63), 2**61 - 1, -(2**61)]
    keys = list(dict.fromkeys(keys))  # each once (0 is in two of the ranges)
    values = [object() for _ in keys]
    native_map, python_map = ShardedMap(), ShardedMap()
    python_map._rotation = native_map._rotation  # the same rotation, so the same shard order
    again = [object() for _ in range(10)]
    stored = native_map.put_new(keys + keys[:10], values + again)
    assert stored == values  # the second of a key is not stored
    monkeypatch.setattr(sharded, "_native_put", None)
    assert python_map.put_new(keys + keys[:10], values + again) == values
    assert [sorted(map(repr, d)) for d in native_map._rot] == [sorted(map(repr, d)) for d in python_map._rot]
    assert all(native_map[k] is v and k in native_map for k, v in zip(keys, values, strict=True))
    monkeypatch.undo()
    native_map.put_many(keys[:100], values[100:200])
    assert all(native_map.get(k) is v for k, v in zip(keys[:100], values[100:200], strict=True))
    with pytest.raises(TypeError):
        native_map.put_many([[1]], [0])  # an unhashable key: refused, as a dict refuses it
    with pytest.raises(ValueError):
        native_map.put_many([1, 2], [0])


def test_an_id_map_answers_as_a_dict_does_with_a_run_and_later_ids() -> None:
    # A restore's run of consecutive ids, then commits' later ids, removals from both, a second run
    # while the first still holds entries: the same answers as a dict, and the run's list goes once
    # every id of it is removed.
    m, d = sharded.IdMap(), {}
    run = [f"r{i}" for i in range(1000)]
    m.put_run(100, run)
    d.update(zip(range(100, 1100), run, strict=True))
    m.put_run(5000, ["s0", "s1"])  # the first run still holds entries: these go to the map
    d.update({5000: "s0", 5001: "s1"})
    rng = random.Random(3)
    next_id = 6000
    for _ in range(5000):
        r = rng.random()
        k = rng.randrange(0, 7000)
        if r < 0.3:
            m[next_id] = d[next_id] = f"c{next_id}"
            next_id += 1
        elif r < 0.7:
            assert m.pop(k, None) == d.pop(k, None)
        else:
            assert m.get(k) == d.get(k) and (k in m) == (k in d)
            if k in d:
                assert m[k] == d[k]
            else:
                with pytest.raises(KeyError):
                    m[k]  # noqa: B018 - the lookup is the test
        assert len(m) == len(d)
    assert sorted(m.values()) == sorted(d.values())  # the run with holes in it
    m.put_many([150, 7000], ["again", "later"])  # an id inside the run's range is answered by the run
    d.update({150: "again", 7000: "later"})
    assert m[150] == "again" and m.get(7000) == "later" and len(m) == len(d)
    for k in range(100, 1100):
        m.pop(k, None)
        d.pop(k, None)
    assert m._run == [] and len(m) == len(d)  # the run's list is given back
    assert sorted(m.values()) == sorted(d.values())
    assert all(m[k] == v for k, v in d.items())
    with pytest.raises(KeyError):
        m.pop(150)
