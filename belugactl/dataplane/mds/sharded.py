"""Maps that never stop the server loop to grow (issue 31 item 1): a CPython dict doubles its table,
copying every entry, when it passes 2/3 of its size; at millions of entries that one insert takes
hundreds of milliseconds (the index's dicts all doubled at the same commit: docs/measurements.md).

- `ShardedMap` spreads its keys over `SHARDS` small dicts. A shard holds a few thousandths of the keys,
  so its doubling copies that much. The shards get unequal shares of the keys (log-uniform over one
  octave, rotated per map), so they pass their thresholds at different sizes: one insert pays for at
  most a shard or two, never for all of them at once (keys spread evenly, e.g. sequential entry ids,
  would otherwise fill equal shards in step).
- `IdMap` (entry id -> entry) keeps a restore's consecutive ids in one list and later ids in a ShardedMap.
- `GenerationLRU` is an exact LRU (cold end first) in generations of at most `GENERATION` entries:
  each entry records its generation (`Entry.gen`), a touch moves it to the newest one, and
  neighbouring generations that have thinned out are merged (at most half a generation copied).
  It replaces an OrderedDict, whose table doubled like a dict's.

Iteration order of a `ShardedMap` is not insertion order (nothing in the index relies on it).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from belugactl.dataplane import native

SHARDS = 128
SPLIT_AT = 4096  # a map holds one dict until it has this many keys (thousands of namespaces stay small)
_BUCKET_BITS = 16  # a key's bucket: the top bits of a multiplicative hash; buckets map to shards
_BUCKETS = 1 << _BUCKET_BITS
_MIX = 0x9E3779B97F4A7C15  # 2^64 / golden ratio: spreads sequential ints and block offsets alike
_M64 = (1 << 64) - 1
_SHIFT = 64 - _BUCKET_BITS
GENERATION = 1 << 15

_maps = itertools.count()


def _bucket_table() -> list[int]:
    """Bucket -> shard, shard s owning a share proportional to 2^(s/SHARDS): no two shares alike, so no
    two shards pass a doubling threshold at the same size (with 2^16 buckets the shares stay distinct
    after rounding to whole buckets)."""
    weights = [2 ** (s / SHARDS) for s in range(SHARDS)]
    total = sum(weights)
    table: list[int] = []
    acc = 0.0
    for s, w in enumerate(weights):
        acc += w * _BUCKETS / total
        table.extend([s] * (round(acc) - len(table)))
    table.extend([SHARDS - 1] * (_BUCKETS - len(table)))
    return table


_TABLE = _bucket_table()
_TABLE_BYTES = bytes(_TABLE)  # the same, for the native many-at-once put
# Many puts in one native call (_native_sharded.c: the same shards, without Python's big-int
# arithmetic a key); None without the native helper, and the loops below do it.
_native_put = native.optional("sharded_put")


class ShardedMap:
    """A dict-like map over SHARDS dicts (see the module's docstring). The operations the index uses.

    Until SPLIT_AT keys it is one dict (every shard slot names it); the insert that passes it spreads
    the keys over the shards, once. Each map rotates the shard order (`_rot`), so two maps of the same
    keys (entries and their LRU, say) do not double shards of the same share at the same insert."""

    __slots__ = ("_dicts", "_rot", "_small", "_rotation")

    def __init__(self) -> None:
        one: dict = {}
        self._dicts: list[dict] = [one]
        self._rot: list[dict] = [one] * SHARDS
        self._small = True
        self._rotation = (next(_maps) * 37) % SHARDS

    def _split(self) -> None:
        (one,) = self._dicts
        dicts = [{} for _ in range(SHARDS)]
        self._rot = dicts[self._rotation :] + dicts[: self._rotation]
        self._dicts, self._small = dicts, False
        for k, v in one.items():
            self[k] = v

    # Each operation picks its shard inline (the same expression every time): a helper call would
    # cost as much again on the index's hottest paths.
    def __getitem__(self, k: Any) -> Any:
        return self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]][k]

    def get(self, k: Any, default: Any = None) -> Any:
        return self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]].get(k, default)

    def __setitem__(self, k: Any, v: Any) -> None:
        d = self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]]
        d[k] = v
        if self._small and len(d) > SPLIT_AT:
            self._split()

    def setdefault(self, k: Any, v: Any) -> Any:
        """`v` stored under `k` unless `k` is there already; what `k` holds afterwards (one hash)."""
        d = self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]]
        old = d.setdefault(k, v)
        if old is v and self._small and len(d) > SPLIT_AT:
            self._split()
        return old

    def _room_for(self, n: int) -> None:
        """Split now if `n` more keys could take the one dict past SPLIT_AT (a batch splits once, first)."""
        if self._small and len(self._dicts[0]) + n > SPLIT_AT:
            self._split()

    def put_new(self, keys: Sequence[Any], values: Sequence[Any]) -> list[Any]:
        """Each value stored under its key unless the key is there already (the first one stays); the
        values stored, in order. One call for many keys: a restart stores millions."""
        self._room_for(len(keys))
        if _native_put is not None:
            return _native_put(self._rot, _TABLE_BYTES, keys, values, True)  # type: ignore[no-any-return]
        rot, table = self._rot, _TABLE
        return [
            v
            for k, v in zip(keys, values, strict=True)
            if rot[table[((hash(k) * _MIX) & _M64) >> _SHIFT]].setdefault(k, v) is v
        ]

    def put_many(self, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """`self[k] = v` for each pair, in one call."""
        self._room_for(len(keys))
        if _native_put is not None:
            _native_put(self._rot, _TABLE_BYTES, keys, values, False)
            return
        rot, table = self._rot, _TABLE
        for k, v in zip(keys, values, strict=True):
            rot[table[((hash(k) * _MIX) & _M64) >> _SHIFT]][k] = v

    def __delitem__(self, k: Any) -> None:
        del self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]][k]

    def pop(self, k: Any, *default: Any) -> Any:
        return self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]].pop(k, *default)

    def __contains__(self, k: Any) -> bool:
        return k in self._rot[_TABLE[((hash(k) * _MIX) & _M64) >> _SHIFT]]

    def __len__(self) -> int:
        return sum(map(len, self._dicts))

    def __bool__(self) -> bool:
        return any(self._dicts)

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(self._dicts)

    def values(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(d.values() for d in self._dicts)

    def items(self) -> Iterator[tuple[Any, Any]]:
        return itertools.chain.from_iterable(d.items() for d in self._dicts)

    def clear(self) -> None:
        for d in self._dicts:
            d.clear()

    def parts(self) -> list[dict]:
        """The dicts under the map, for a caller that empties a map it no longer uses a few items at
        a time (`popitem`), so that what they hold is freed in steps too, not all at its end."""
        return list(self._dicts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ShardedMap | dict):
            return len(self) == len(other) and all(k in other and other[k] == v for k, v in self.items())
        return NotImplemented

    def __repr__(self) -> str:
        return f"ShardedMap({len(self)} entries)"


class IdMap:
    """Entry id -> entry (the index's `by_id`). A restore hands out consecutive ids to millions of
    entries at once: those are kept in one list indexed by id - first (8 bytes an entry, made without
    a hash per key; the ShardedMap cost about 50 bytes and 0.4 us an entry), every id handed out later
    in a ShardedMap. A removed id of the run leaves None in its place; the list goes once all have."""

    __slots__ = ("_first", "_run", "_run_live", "_map")

    def __init__(self) -> None:
        self._first = 0
        self._run: list[Any] = []
        self._run_live = 0
        self._map = ShardedMap()

    def put_run(self, first: int, values: list[Any]) -> None:
        """`values[i]` under id `first + i`, ids no one has had (the list is kept, not copied). One run
        at a time: while one holds entries, another goes to the map."""
        if self._run_live or not values:
            self._map.put_many(range(first, first + len(values)), values)
            return
        self._first, self._run, self._run_live = first, values, len(values)

    def put_many(self, keys: Sequence[int], values: Sequence[Any]) -> None:
        """`self[k] = v` for each pair, in one call (ids not from one run)."""
        lo, hi = self._first, self._first + len(self._run)
        if self._run and any(lo <= k < hi for k in keys):  # not expected (ids only grow): the run answers them
            for k, v in zip(keys, values, strict=True):
                self[k] = v
            return
        self._map.put_many(keys, values)

    def get(self, k: int, default: Any = None) -> Any:
        j = k - self._first
        if 0 <= j < len(self._run):
            e = self._run[j]
            return default if e is None else e
        return self._map.get(k, default)

    def __getitem__(self, k: int) -> Any:  # a lease burst reads one an entry: no call to get()
        j = k - self._first
        run = self._run
        if 0 <= j < len(run):
            e = run[j]
            if e is None:
                raise KeyError(k)
            return e
        return self._map[k]

    def __setitem__(self, k: int, v: Any) -> None:
        j = k - self._first
        if 0 <= j < len(self._run):
            if self._run[j] is None:
                self._run_live += 1
            self._run[j] = v
            return
        self._map[k] = v

    def pop(self, k: int, *default: Any) -> Any:
        j = k - self._first
        if 0 <= j < len(self._run) and self._run[j] is not None:
            e, self._run[j] = self._run[j], None
            self._run_live -= 1
            if not self._run_live:
                self._run = []  # every restored entry is gone: the list's 8 bytes an entry too
            return e
        return self._map.pop(k, *default)

    def __contains__(self, k: int) -> bool:
        return self.get(k) is not None

    def __len__(self) -> int:
        return self._run_live + len(self._map)

    def values(self) -> Iterator[Any]:
        return itertools.chain((e for e in self._run if e is not None), self._map.values())


class _Gen(dict):
    """One generation: key -> entry in the order they were last used; `seq` orders generations."""

    __slots__ = ("seq",)


def _seq(g: _Gen) -> int:
    return g.seq


class GenerationLRU:
    """key -> entry, cold end first, for entries with a `gen` attribute (see the module's docstring).

    `add(e)` puts `e` (keyed by `e.key`) at the hot end; `touch(e)` moves it there; `discard(e)`
    takes it out (False when it was not in). `values()` walks cold to hot; it must not be changed
    while walked (as with an OrderedDict)."""

    __slots__ = ("_gens", "_cur", "_n", "_next_seq")

    def __init__(self) -> None:
        self._n = 0
        self._next_seq = 0
        self._gens: list[_Gen] = []  # oldest first (ascending seq)
        self._cur = self._new_gen()

    def _new_gen(self) -> _Gen:
        g = _Gen()
        g.seq = self._next_seq
        self._next_seq += 1
        self._gens.append(g)
        self._cur = g
        return g

    def add(self, e: Any) -> None:
        cur = self._cur
        if len(cur) >= GENERATION:
            cur = self._new_gen()
        cur[e.key] = e
        e.gen = cur
        self._n += 1

    def add_many(self, es: Sequence[Any]) -> None:
        """`add(e)` for each entry in order, in one call (a restart adds millions)."""
        i, n = 0, len(es)
        while i < n:
            cur = self._cur
            room = GENERATION - len(cur)
            if room <= 0:
                cur, room = self._new_gen(), GENERATION
            part = es[i : i + room]
            cur.update(zip([e.key for e in part], part, strict=True))
            for e in part:
                e.gen = cur
            i += len(part)
        self._n += n

    def touch(self, e: Any) -> None:
        g = e.gen
        if g is None:
            return
        cur = self._cur
        if g is cur:
            del cur[e.key]  # to the hot end of the newest generation
            cur[e.key] = e
            return
        del g[e.key]
        if len(cur) >= GENERATION:
            cur = self._new_gen()
        cur[e.key] = e
        e.gen = cur
        self._thinned(g)

    def discard(self, e: Any) -> bool:
        g = e.gen
        if g is None:
            return False
        del g[e.key]
        e.gen = None
        self._n -= 1
        if g is not self._cur:
            self._thinned(g)
        return True

    def _thinned(self, g: _Gen) -> None:
        """An older generation lost an entry. Under a quarter full it is dropped when empty, merged
        with a neighbour when the two fit half a generation, or else rebuilt at each power of two
        (a dict never gives its table back): generations stay few (at most about 8 n / GENERATION),
        their tables in proportion to what they hold, and no step copies more than half a generation."""
        n = len(g)
        if n >= GENERATION // 4:
            return
        i = bisect.bisect_left(self._gens, g.seq, key=_seq)
        if not n:
            del self._gens[i]
            return
        half = GENERATION // 2
        if i > 0 and len(self._gens[i - 1]) + n <= half:
            self._merge(i - 1)
        elif len(self._gens[i + 1]) + n <= half:  # g is not the newest: it has a newer neighbour
            self._merge(i)
        elif n & (n - 1) == 0:
            self._place(i, _Gen(g), g.seq)

    def _merge(self, i: int) -> None:
        """Generations i and i+1 become one, in i+1's place (the older one's entries first)."""
        older, newer = self._gens[i], self._gens[i + 1]
        merged = _Gen(older)
        merged.update(newer)
        self._place(i + 1, merged, newer.seq)
        del self._gens[i]

    def _place(self, i: int, g: _Gen, seq: int) -> None:
        g.seq = seq
        for e in g.values():
            e.gen = g
        if self._gens[i] is self._cur:
            self._cur = g
        self._gens[i] = g

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def values(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(g.values() for g in self._gens)

    def __iter__(self) -> Iterator[Any]:
        return itertools.chain.from_iterable(self._gens)

    @property
    def generations(self) -> int:
        return len(self._gens)
