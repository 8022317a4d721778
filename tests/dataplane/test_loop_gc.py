"""The cyclic GC while the server serves: off inside requests, run between turns on the young
objects alone once GC_YOUNG have piled up, survivors frozen; back as it was when the loop ends."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

from belugactl.dataplane.mds.server import GC_YOUNG
from tests.dataplane.test_slots import make_server


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic GC frees it


def test_between_turns_collects_young_cycles_and_freezes_what_survives(pool_path: Path) -> None:
    pool, srv = make_server(pool_path)
    was = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        first = Node()
        gone = weakref.ref(first)
        del first
        kept = [Node() for _ in range(GC_YOUNG)]  # alive: frozen, not freed
        frozen = gc.get_freeze_count()
        srv.between_turns()
        assert gone() is None  # the cycle that died was collected between turns
        assert gc.get_count()[0] < GC_YOUNG // 10 and gc.get_freeze_count() >= frozen + len(kept)
        small = Node()
        still = weakref.ref(small)
        del small
        srv.between_turns()
        assert still() is not None  # under GC_YOUNG young objects: nothing walked yet
    finally:
        gc.unfreeze()
        if was:
            gc.enable()
        srv.close()
        pool.close()


def test_the_loop_turns_the_automatic_gc_off_and_back_on(pool_path: Path) -> None:
    pool, srv = make_server(pool_path)
    assert gc.isenabled()
    seen: list[bool] = []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not seen:
            time.sleep(0.05)
            if srv.loop.turns:
                seen.append(gc.isenabled())
    finally:
        srv.stop()
        t.join(10)
        pool.close()
    assert seen == [False] and not t.is_alive() and gc.isenabled()
    gc.unfreeze()
