"""The native lookup mirror's table (_native_fastpath.c) grows without a pause: a growth maps an empty
table and moves the old one into it a few slots per put and delete, so every key stays findable in
exactly one of the two while the move goes on (the whole table used to be rehashed inside one put:
1.2 to 5.5 s at 2,097,152 keys)."""

from __future__ import annotations

import random

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
        cap, live, _tombs, oldcap, moved = n.fi_shape(fi)
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
        cap, _live, _tombs, oldcap, moved = n.fi_shape(fi)
        if cap != last_cap:
            growths += 1
            assert moving == 0  # puts alone finished the last move before this growth
            assert oldcap == last_cap and moved <= 16  # a growth moves nothing at once
            last_cap = cap
        moving = oldcap
    assert growths >= 5  # 1,024 slots, 4x a growth, to 1,048,576
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
    """_native_fastpath.c's fi_hash, to place keys at chosen slots."""
    h = 0xCBF29CE484222325 ^ ns
    for b in k:
        h = ((h ^ b) * 0x100000001B3) & M64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M64
    h ^= h >> 33
    return h | 1


def test_keys_past_a_given_back_part_of_the_old_table_are_found() -> None:
    # The moved part of an old table is given back 2 MiB at a time and reads as zeros (empty slots)
    # from then on. 80 keys whose home slots lie just before that edge form a cluster across it; when
    # the first 2 MiB are given back, those of them not moved yet must still be found (a probe that
    # starts in the given-back part goes on where the move is).
    n = _n()
    fi = n.fi_new()
    slot_bytes = 104  # sizeof(fi_slot)
    edge = (2 << 20) // slot_bytes  # the first slot whose state byte is past the first 2 MiB
    rng = random.Random(5)
    crafted: list[bytes] = []
    while len(crafted) < 80:
        k = rng.randbytes(32)
        if edge - 24 <= fi_hash(9, k) & 65535 < edge - 4:
            crafted.append(k)
    i = 0
    while n.fi_shape(fi)[0] < 65536:
        n.fi_put(fi, 9, key(i), i)
        i += 1
    for j, k in enumerate(crafted):  # into the 65,536-slot table: a cluster across the edge
        n.fi_put(fi, 9, k, 10_000_000 + j)
    checked = False
    while not checked:
        n.fi_put(fi, 9, key(i), i)
        i += 1
        cap, _live, _tombs, oldcap, moved = n.fi_shape(fi)
        if oldcap == 65536 and moved * slot_bytes >= 2 << 20:
            assert moved < edge + 40  # some of the cluster is still in the old table
            lost = [j for j, k in enumerate(crafted) if n.fi_id(fi, 9, k) != 10_000_000 + j]
            assert not lost, f"{len(lost)} keys not found once the first 2 MiB of the old table were given back"
            checked = True
        assert cap <= 262144 and i < 200_000
    assert all(n.fi_id(fi, 9, key(j)) == j for j in range(0, i, 13))
