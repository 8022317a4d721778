"""The scheduler's pool-hit lookup posted when the request arrives and taken when it is scheduled
(`post_get_many` / `take_get_many`) against the same lookup asked at scheduling (`get_many_tuples`),
alternating round by round in one process against a real server that naps when idle (the CPU
demo's `--spin-after-ms 0`).

Each round: an idle spell (`--pause`), a 12 MiB copy (the engine's last forward pass pushing the
interpreter out of the caches), then what vLLM's engine core does for an arriving request: add it
(`on_new_request`: the posted way sends its lookup here), `--gap-us` of its own bookkeeping (about
270 us measured between the two calls in the CPU demo's engine), and schedule it (the lookup: taken
or asked). The figures are the lookup's own time, as the connector counts it (post plus take, or the
one call), and the wall time from the request's arrival to the answer in hand.

Run from the repository root:
PYTHONPATH=. python scripts/measure-posted-lookup.py [--pause 0.1] [--rounds 30] [--gap-us 270]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins" / "vllm_beluga"))

from tests.support.mds_process import plugin_reader, print_quartiles  # noqa: E402

NS = "measure"
HIT_BYTES = 12 << 20


def busy(us: float) -> None:
    """The engine's own work between a request's arrival and its scheduling (Python, one core)."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pause", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--gap-us", type=float, default=270.0)
    args = ap.parse_args()
    if args.pause < 0 or args.rounds < 1 or args.gap_us < 0:
        sys.exit("--pause and --gap-us are >= 0, --rounds >= 1")
    src, dst = bytes(HIT_BYTES), bytearray(HIT_BYTES)
    with plugin_reader("scheduler", "--spin-after-ms", "0", namespace=NS) as (index, keys):
        own: dict[str, list[float]] = {"posted (post + take)": [], "asked at scheduling": []}
        wall: dict[str, list[float]] = {"posted": [], "asked at scheduling": []}
        for i in range(2 * args.rounds):
            posted = i % 2 == 0
            time.sleep(args.pause)
            dst[:] = src
            arrived = time.perf_counter_ns()
            spent = 0
            ticket = None
            if posted:
                ticket = index.post_get_many(NS, keys)
                spent += time.perf_counter_ns() - arrived
                if ticket is None:
                    sys.exit("the lookup could not be posted (no native helper? bash scripts/bootstrap)")
            busy(args.gap_us)
            t0 = time.perf_counter_ns()
            located = index.take_get_many(ticket) if posted else index.get_many_tuples(NS, keys)
            done = time.perf_counter_ns()
            spent += done - t0
            assert located is not None and all(loc is not None for loc in located), "a block went missing"
            own["posted (post + take)" if posted else "asked at scheduling"].append(spent / 1e3)
            wall["posted" if posted else "asked at scheduling"].append((done - arrived) / 1e3)
            index.release([loc[1] for loc in located])
        print(f"125-block lookup, {args.pause * 1e3:.0f} ms idle and a 12 MiB copy before each request,")
        print(f"{args.gap_us:.0f} us of the engine's own work between arrival and scheduling:")
        print(" the lookup's own time (what the connector counts as metadata):")
        print_quartiles(own, 26)
        print(" arrival to answer in hand (wall):")
        print_quartiles(wall, 26)


if __name__ == "__main__":
    main()
