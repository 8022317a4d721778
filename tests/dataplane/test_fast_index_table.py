"""The native lookup mirror's table (_native_fastpath.c) grows without a pause: a growth maps an empty
table and moves the old one into it a few slots per put and delete, so every key stays findable in
exactly one of the two while the move goes on (the whole table used to be rehashed inside one put:
1.2 to 5.5 s at 2,097,152 keys)."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

from belugactl.dataplane import native

pytestmark = pytest.mark.native


def _n():
    return native._native


def key(i: int) -> bytes:
    return i.to_bytes(8, "little") * 4


def check(fi, model: dict[tuple[int, bytes], int], absent: list[tuple[int, bytes]]) -> None:
    n = _n()
    assert n.fi_len(fi) == len(model)
    for (ns, k), v in model.items():
        assert n.fi_id(fi, ns, k) == v
    for ns, k in absent:
        if (ns, k) not in model:
            assert n.fi_id(fi, ns, k) == -1


def test_every_key_is_found_while_the_table_moves() -> None:
    n = _n()
    fi = n.fi_new()
    model: dict[tuple[int, bytes], int] = {}
    gone: list[tuple[int, bytes]] = []
    rng = random.Random(7)
    checked_mid_move = 0
    moves_seen = set()
    for step in range(120_000):
        ns, k = rng.randrange(3), key(rng.randrange(60_000))
        r = rng.random()
        if r < 0.6:
            n.fi_put(fi, ns, k, step, b"\0" * 40 if step % 2 else b"")
            model[(ns, k)] = step
        elif r < 0.95:
            assert n.fi_del(fi, ns, k) == ((ns, k) in model)
            if model.pop((ns, k), None) is not None:
                gone.append((ns, k))
        else:
            assert n.fi_id(fi, ns, k) == model.get((ns, k), -1)
        cap, live, _tombs, oldcap, moved, _ents = n.fi_shape(fi)
        assert live == len(model) and (live + _tombs) * 2 <= cap
        if oldcap:
            moves_seen.add(oldcap)
            assert moved < oldcap
            if step % 997 == 0:  # in the middle of a move: both tables are looked in
                check(fi, model, gone[-200:])
                checked_mid_move += 1
    check(fi, model, gone)
    assert checked_mid_move >= 5 and len(moves_seen) >= 3  # several growths, checked while moving


def test_a_move_finishes_before_the_next_growth_and_gives_the_old_table_back() -> None:
    n = _n()
    fi = n.fi_new()
    growths = 0
    last_cap, moving = n.fi_shape(fi)[0], 0
    for i in range(300_000):
        assert n.fi_put(fi, 1, key(i), i)
        cap, _live, _tombs, oldcap, moved, _ents = n.fi_shape(fi)
        if cap != last_cap:
            growths += 1
            assert moving == 0  # puts alone finished the last move before this growth
            assert oldcap == last_cap and moved <= 16  # a growth moves nothing at once
            last_cap = cap
        moving = oldcap
    assert growths >= 5  # 1,024 slots, 2x a growth, to 1,048,576
    for i in range(0, 300_000, 7):
        assert n.fi_id(fi, 1, key(i)) == i


def test_deletes_alone_also_move_the_table() -> None:
    n = _n()
    fi = n.fi_new()
    i = 0
    while not n.fi_shape(fi)[3]:  # fill until a growth starts a move
        n.fi_put(fi, 2, key(i), i)
        i += 1
    for j in range(i):  # delete everything: each delete moves old slots too
        assert n.fi_del(fi, 2, key(j))
    assert n.fi_shape(fi)[1] == 0 and n.fi_shape(fi)[3] == 0
    assert all(n.fi_id(fi, 2, key(j)) == -1 for j in range(i))


M64 = (1 << 64) - 1


def fi_hash(ns: int, k: bytes) -> int:
    """_native_fastpath.c's fi_hash: Python's (seeded) hash of the key, mixed with the namespace."""
    h = (hash(k) & M64) ^ ((ns * 0x9E3779B97F4A7C15) & M64)
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    return h | 1


def test_the_tables_hash_is_the_one_documented() -> None:
    rng = random.Random(3)
    for _ in range(200):
        ns, k = rng.randrange(1 << 32), rng.randbytes(rng.randrange(1, 65))
        assert _n().fi_hash(ns, k) == fi_hash(ns, k)


def test_keys_past_a_given_back_part_of_the_old_table_are_found() -> None:
    # The moved part of an old table is given back 2 MiB at a time and reads as zeros (empty slots)
    # from then on. 80 keys whose home slots lie just before that edge form a cluster across it; when
    # the first 2 MiB are given back, those of them not moved yet must still be found (a probe that
    # starts in the given-back part goes on where the move is).
    n = _n()
    fi = n.fi_new()
    slot_bytes = 8  # a table slot is one word naming an entry
    edge = (2 << 20) // slot_bytes  # the first slot past the first 2 MiB
    size = 2 * edge  # the table the cluster is put in, and then moved out of
    crafted: list[bytes] = []
    c = 0
    while len(crafted) < 80:
        k = (c << 8 | 0x5A).to_bytes(32, "little")
        c += 1
        if edge - 24 <= n.fi_hash(9, k) & (size - 1) < edge - 4:
            crafted.append(k)
    i = 0
    while n.fi_shape(fi)[0] < size:
        n.fi_put(fi, 9, key(i), i)
        i += 1
    for j, k in enumerate(crafted):  # into the table of `size` slots: a cluster across the edge
        n.fi_put(fi, 9, k, 10_000_000 + j)
    checked = False
    while not checked:
        n.fi_put(fi, 9, key(i), i)
        i += 1
        cap, _live, _tombs, oldcap, moved, _ents = n.fi_shape(fi)
        if oldcap == size and moved * slot_bytes >= 2 << 20:
            assert moved < edge + 40  # some of the cluster is still in the old table
            lost = [j for j, k in enumerate(crafted) if n.fi_id(fi, 9, k) != 10_000_000 + j]
            assert not lost, f"{len(lost)} keys not found once the first 2 MiB of the old table were given back"
            checked = True
        assert cap <= 2 * size and i < 400_000
    assert all(n.fi_id(fi, 9, key(j)) == j for j in range(0, i, 13))


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_mirrored_key_costs_its_entry_and_a_few_table_words() -> None:
    """Issue 31 item 2: entries sit in segments that never move and the table holds 8-byte words, so
    200,000 keys with a 40-byte GET reply each take under 160 resident bytes a key (64 for the entry,
    16 to 32 of table, the reply's allocation). A table of whole entries, grown 4x at a time, took 586."""
    n = _n()
    keys = [key(i) for i in range(200_000)]
    reply = bytes(range(40))
    fi = n.fi_new()
    before = _resident_bytes()
    for i, k in enumerate(keys):
        n.fi_put(fi, 1, k, i, reply)
    per = (_resident_bytes() - before) / len(keys)
    assert per < 160, f"{per:.0f} resident bytes a mirrored key"
    cap, live, _tombs, _oldcap, _moved, ents = n.fi_shape(fi)
    assert live == ents == len(keys) and live * 2 <= cap <= 4 * live + 4
    for i in range(0, len(keys), 2):  # freed entries are handed out again before new ones
        assert n.fi_del(fi, 1, keys[i])
    for i in range(0, len(keys), 2):
        assert n.fi_put(fi, 2, keys[i], -i)
    assert n.fi_shape(fi)[5] == len(keys)
    assert all(n.fi_id(fi, 2, keys[i]) == -i and n.fi_id(fi, 1, keys[i + 1]) == i + 1 for i in range(0, len(keys), 2))


def test_keys_of_every_length_are_kept_whole_inline_or_not() -> None:
    """Keys up to 32 bytes live in their entry, longer ones (to 64) in an allocation of their own; puts,
    re-puts and deletes of both, reusing freed entries, never mix two keys up."""
    n = _n()
    fi = n.fi_new()
    rng = random.Random(11)
    pool = [rng.randbytes(length) for length in range(1, 65) for _ in range(30)]
    pool += [k[:-1] + bytes([k[-1] ^ 1]) for k in pool[::7]]  # near twins: same length, one bit apart
    model: dict[tuple[int, bytes], int] = {}
    for step in range(40_000):
        ns, k = rng.randrange(1, 3), rng.choice(pool)
        if rng.random() < 0.6:
            assert n.fi_put(fi, ns, k, step, bytes(40) if step % 3 else b"")
            model[(ns, k)] = step
        else:
            assert n.fi_del(fi, ns, k) == ((ns, k) in model)
            model.pop((ns, k), None)
    check(fi, model, [(ns, k) for ns in (1, 2) for k in pool])
    assert not n.fi_put(fi, 1, bytes(65), 1) and n.fi_id(fi, 1, bytes(65)) == -1  # too long to mirror


@pytest.mark.process
def test_the_tables_hash_is_seeded_per_process() -> None:
    # A client that could compute the table's hash could send keys that all land in one probe
    # cluster, and every lookup would walk it. The hash takes CPython's per-process secret: the
    # same key hashes differently under another secret.
    code = "import sys; from belugactl.dataplane import native; print(native._native.fi_hash(9, bytes(range(32))))"
    seen = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)  # noqa: S603
        seen.add(int(out.stdout))
    assert len(seen) == 3


def _entries() -> list:
    """Index entries of every shape the mirror is fed: one block with a checksum (packed natively),
    without one, several blocks, a class block larger than the bytes in it, keys inline, long, too long
    to mirror, and one key twice (the later put wins, as with fi_put one by one)."""
    from belugactl.dataplane.mds.allocator import CHUNK, Allocation
    from belugactl.dataplane.mds.index import Entry

    one = Allocation.one
    shapes = [
        (one(4 * CHUNK, CHUNK, CHUNK), 0xDEADBEEF),
        (one(5 * CHUNK + 65536, 65536, 40000), 0),  # a 64 KiB block holding 40,000 bytes
        (one(6 * CHUNK, CHUNK, CHUNK), None),  # no checksum: the general reply
        (one(6 * CHUNK, CHUNK, CHUNK), 0xFFFFFFFF),
        (
            Allocation(
                [(7 * CHUNK, 2 * CHUNK), (10 * CHUNK, 4096)],
                [(CHUNK, 7 * CHUNK), (CHUNK, 8 * CHUNK), (4096, 10 * CHUNK)],
                2 * CHUNK + 4096,
            ),
            7,
        ),
    ]
    keys = [key(1), b"k" * 40, b"x" * 64, b"y" * 65, bytes(32)]
    out = []
    for i in range(60):
        alloc, crc = shapes[i % len(shapes)]
        k = keys[i % len(keys)] + bytes([i]) if i % 7 else keys[i % len(keys)]
        out.append(Entry((i % 3, k), alloc, id=100 + i, checksum=crc))
    out.append(Entry((0, key(1)), shapes[0][0], id=999, checksum=5))  # key(1) of namespace 0 again: this one wins
    return out


def test_many_entries_put_at_once_mirror_as_one_put_each_with_the_same_replies() -> None:
    from belugactl.dataplane.mds.listener_cxl import mirror_entries, mirror_reply

    n = _n()
    es = _entries()
    one_by_one, at_once = n.fi_new(), n.fi_new()
    put = sum(bool(n.fi_put(one_by_one, e.key[0], e.key[1], e.id, mirror_reply(e))) for e in es)
    asked: list = []

    def reply(e):  # noqa: ANN001, ANN202
        asked.append(e)
        return mirror_reply(e)

    assert mirror_entries(at_once, es, reply) == put == len(es) - sum(len(e.key[1]) > 64 for e in es)
    assert n.fi_len(at_once) == n.fi_len(one_by_one)
    for e in es:
        ns, k = e.key
        assert n.fi_id(at_once, ns, k) == n.fi_id(one_by_one, ns, k)
        assert n.fi_reply(at_once, ns, k) == n.fi_reply(one_by_one, ns, k)
    assert n.fi_reply(at_once, 0, key(1)) == mirror_reply(es[-1]) and n.fi_id(at_once, 0, key(1)) == 999
    assert n.fi_reply(at_once, 1, b"y" * 65) is None  # too long to mirror
    # Only the entries that are not one block with a checksum were asked for their reply.
    assert {e.id for e in asked} == {e.id for e in es if e.checksum is None or e.alloc.single is None}


def test_a_bad_entry_or_reply_is_an_error_and_the_entries_before_it_stay() -> None:
    from belugactl.dataplane.mds.allocator import CHUNK, Allocation
    from belugactl.dataplane.mds.index import Entry

    n = _n()
    fi = n.fi_new()
    good = Entry((0, key(1)), Allocation.one(CHUNK, CHUNK, CHUNK), id=1, checksum=1)
    for bad, reply, error in [
        (Entry((0, "text"), good.alloc, id=2, checksum=1), bytes, TypeError),  # a key that is no bytes
        (Entry((1 << 40, key(2)), good.alloc, id=2, checksum=1), bytes, OverflowError),  # a namespace past 32 bits
        (Entry((0, key(2)), good.alloc, id=2, checksum=None), lambda e: "no bytes", TypeError),
        (Entry((0, key(2)), good.alloc, id=2, checksum=None), lambda e: 1 / 0, ZeroDivisionError),
    ]:
        after = Entry((0, key(3)), good.alloc, id=3, checksum=1)
        with pytest.raises(error):
            n.fi_put_entries(fi, [good, bad, after], reply, True)
        assert n.fi_len(fi) == 1 and n.fi_id(fi, 0, key(2)) == n.fi_id(fi, 0, key(3)) == -1  # none after it
    # The entries are read from a copy: a reply that empties the list it was given changes nothing.
    es = [Entry((0, key(10 + i)), good.alloc, id=10 + i, checksum=None) for i in range(4)]
    n.fi_put_entries(fi, es, lambda e: (es.clear(), b"\0" * 40)[1], True)
    assert all(n.fi_id(fi, 0, key(10 + i)) == 10 + i for i in range(4))


def test_a_batch_at_least_as_large_as_the_table_sizes_it_once_and_keeps_every_key() -> None:
    # A restore's batch makes the table it needs up front (at most half full after it), moving what
    # was there at once: no growth, no move left over, and every key, old or new, still found.
    from belugactl.dataplane.mds.allocator import CHUNK, Allocation
    from belugactl.dataplane.mds.index import Entry

    n = _n()
    fi = n.fi_new()
    alloc = Allocation.one(CHUNK, CHUNK, CHUNK)
    model: dict[tuple[int, bytes], int] = {}
    i = 0
    while not n.fi_shape(fi)[3] or i < 1500:  # grown more than once, a move under way when the batch comes
        n.fi_put(fi, 0, key(i), i)
        model[(0, key(i))] = i
        i += 1
    for j in range(0, i, 300):  # and a few tombstones
        n.fi_del(fi, 0, key(j))
        del model[(0, key(j))]
    assert n.fi_shape(fi)[3]  # an old table still moving
    # Every 100th without a checksum: its reply is asked of Python, which looks at the table then.
    batch = [Entry((1, key(i)), alloc, id=10_000 + i, checksum=None if i % 100 == 0 else 7) for i in range(5000)]
    batch.append(Entry((0, key(1)), alloc, id=99_999, checksum=7))  # a key already there: replaced
    seen = []
    assert n.fi_put_entries(fi, batch, lambda e: seen.append(n.fi_shape(fi)[:4:3]) or b"", True) == len(batch)
    model.update({e.key: e.id for e in batch})
    cap, live, _tombs, oldcap, _moved, _ents = n.fi_shape(fi)
    assert oldcap == 0 and live == len(model) and live * 2 <= cap < live * 4
    assert len(seen) == 50 and set(seen) == {(cap, 0)}  # one size, and nothing left to move, all through the batch
    check(fi, model, [(0, key(j)) for j in range(0, i, 300)])
    small = [Entry((2, key(i)), alloc, id=20_000 + i, checksum=7) for i in range(10)]
    assert (
        n.fi_put_entries(fi, small, lambda e: b"", True) == 10 and n.fi_shape(fi)[0] == cap
    )  # a small batch: as before


def test_entries_of_other_classes_are_read_through_their_attributes() -> None:
    # The batch reads an Entry's fields from its slots; an entry of another class (here one whose
    # checksum is a property, and a plain object) is read through getattr, with the same result.
    from types import SimpleNamespace

    from belugactl.dataplane.mds.allocator import CHUNK, Allocation
    from belugactl.dataplane.mds.index import Entry
    from belugactl.dataplane.mds.listener_cxl import mirror_reply

    class Sub(Entry):  # a class of its own: not read from Entry's cells
        __slots__ = ()

    class Duck:  # the fields as properties
        key, id, alloc = property(lambda s: (0, key(3))), property(lambda s: 3), property(lambda s: alloc)
        checksum = property(lambda s: 0xABCD)

    n = _n()
    alloc = Allocation.one(3 * CHUNK, CHUNK, CHUNK - 5)
    es = [
        Entry((0, key(1)), alloc, id=1, checksum=11),
        SimpleNamespace(key=(0, key(2)), id=2, alloc=alloc, checksum=22),
        Duck(),
        Sub((0, key(5)), alloc, id=5, checksum=55),
        Entry((0, key(4)), SimpleNamespace(_a=5 * CHUNK, _b=CHUNK, nbytes=7), id=4, checksum=44),
    ]
    fi = n.fi_new()
    assert n.fi_put_entries(fi, es, mirror_reply, True) == 5
    crcs = {1: 11, 2: 22, 3: 0xABCD, 4: 44, 5: 55}
    for e in es:
        got = n.fi_reply(fi, 0, e.key[1])
        assert got[20:24] == crcs[e.id].to_bytes(4, "little") and n.fi_id(fi, 0, e.key[1]) == e.id
    assert n.fi_reply(fi, 0, key(4))[24:40] == (5 * CHUNK).to_bytes(8, "little") + (7).to_bytes(8, "little")


def _huge_mappings() -> int:
    """Mappings of this process madvised for huge pages (VmFlags "hg" in /proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        return sum(1 for line in f if line.startswith("VmFlags:") and " hg" in line)


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage"), reason="no transparent huge pages")
def test_only_a_table_a_batch_doubles_and_fills_asks_for_huge_pages() -> None:
    # A huge page's first touch may compact memory; only a table the batch itself fills may ask for
    # them. A table rebuilt at the same size to drop tombstones holds a few keys: served puts touch it.
    from belugactl.dataplane.mds.allocator import CHUNK, Allocation
    from belugactl.dataplane.mds.index import Entry

    n = _n()
    alloc = Allocation.one(CHUNK, CHUNK, CHUNK)
    fi = n.fi_new()
    i = 0
    while True:  # a table of megabytes grown on 4 KiB pages, filled to just below where it grows
        cap, live, tombs, oldcap = n.fi_shape(fi)[:4]
        if cap >= 1 << 19 and not oldcap and (live + tombs + 2) * 2 > cap:
            break
        n.fi_put(fi, 0, key(i), i)
        i += 1
    for j in range(1, i):  # all but one key deleted: tombstones
        n.fi_del(fi, 0, key(j))
    before, (cap, live, tombs) = _huge_mappings(), n.fi_shape(fi)[:3]
    assert live == 1 and (live + tombs + 2) * 2 > cap  # a batch of two rebuilds the table, at its size
    two = [Entry((2, key(j)), alloc, id=j, checksum=1) for j in (1, 2)]
    assert n.fi_put_entries(fi, two, lambda e: b"", True) == 2
    assert n.fi_shape(fi)[:3] == (cap, live + 2, 0)
    assert _huge_mappings() == before  # rebuilt to drop tombstones: no huge pages
    big = n.fi_new()
    batch = [Entry((0, key(j)), alloc, id=j, checksum=1) for j in range(300_000)]
    assert n.fi_put_entries(big, batch, lambda e: b"", True) == len(batch)
    assert _huge_mappings() == before + 1  # a restore's table: asked for
