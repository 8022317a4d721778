"""The server loop's own pause figures: how long a turn kept the loop from looking at its rings, and
what one look (a pass over the rings) costs. `/stats` carries them under `loop`, `/metrics` as
`beluga_mds_loop_turn_seconds` (a histogram), `beluga_mds_loop_longest_turn_seconds` and
`beluga_mds_loop_ring_pass_seconds`.

A **turn** here is a stretch of the loop during which no ring is looked at and no one is being
answered from a ring in the meantime:
- one request answered in Python (`serve_taken`: a RESERVE and whatever it evicts, a COMMIT,
  an OPEN_NS, ...), from its take to its reply;
- the loop's own work between two looks at the rings (TCP requests from the selector, a step of a
  clear or of the watermark sweep, the housekeeping, the snapshot), less the loop's deliberate waits
  (the idle poll's sleep, the selector's timeout), which are not pauses: nothing was there to answer.
The native fast path's own answers (lookups while it spins) are not turns: the loop is answering.

`longest_turn_us` is the longest since start; `longest_turn_recent_us` the longest over the last
`WINDOW_S` seconds (two half windows: the current one and the one before). `ring_pass_us` is the
last look of the loop with nothing to answer (a `serve(0)`, which the idle loop makes before each
idle wait, that served nothing: one pass over the rings plus the call's own cost, about a
microsecond), and `ring_pass_mean_us` their mean. A busy loop (spinning) measures none.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left

# Turn durations in seconds (10 us .. 10 s): a request is tens of microseconds, a pause seconds.
TURN_BUCKETS: tuple[float, ...] = (
    1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 1e-1, 5e-1, 1.0, 5.0, 10.0,
)  # fmt: skip
WINDOW_S = 10.0


class LoopStats:
    """Plain numbers the loop updates (no locks: the admin thread reads the snapshot's copy)."""

    def __init__(self, clock=time.monotonic) -> None:  # noqa: ANN001 - a clock for tests
        self.clock = clock
        self.bounds = TURN_BUCKETS
        self.counts = array("q", [0] * (len(TURN_BUCKETS) + 1))
        self.total_s = 0.0
        self.turns = 0
        self.longest_s = 0.0
        self.longest_what = ""
        self._window_start = clock()
        self._window_max = 0.0  # the current half window
        self._previous_max = 0.0  # the half window before it
        self.pass_last_s: float | None = None
        self.pass_total_s = 0.0
        self.passes = 0

    def turn(self, seconds: float, what: str = "loop") -> None:
        """One turn of `seconds`; `what` says what it was (kept for the longest)."""
        if seconds < 0:
            seconds = 0.0
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds
        self.turns += 1
        if seconds > self.longest_s:
            self.longest_s = seconds
            self.longest_what = what
        if seconds > self._window_max:
            self._window_max = seconds

    def ring_pass(self, seconds: float) -> None:
        self.pass_last_s = seconds
        self.pass_total_s += seconds
        self.passes += 1

    def _roll(self) -> None:
        now = self.clock()
        half = WINDOW_S / 2
        if now - self._window_start >= half:
            # A whole half window with nothing in it clears the older one too.
            self._previous_max = self._window_max if now - self._window_start < 2 * half else 0.0
            self._window_max = 0.0
            self._window_start = now

    def stats(self) -> dict[str, object]:
        self._roll()
        return {
            "longest_turn_us": round(self.longest_s * 1e6, 1),
            "longest_turn_what": self.longest_what,
            "longest_turn_recent_us": round(max(self._window_max, self._previous_max) * 1e6, 1),
            "recent_window_s": WINDOW_S,
            "turns": self.turns,
            "turn_mean_us": round(self.total_s / self.turns * 1e6, 2) if self.turns else None,
            "ring_pass_us": None if self.pass_last_s is None else round(self.pass_last_s * 1e6, 2),
            "ring_pass_mean_us": round(self.pass_total_s / self.passes * 1e6, 2) if self.passes else None,
            "ring_passes_measured": self.passes,
            "turn_seconds": {
                "buckets": list(self.bounds),
                "counts": list(self.counts),
                "sum": self.total_s,
                "count": self.turns,
            },
        }
