"""Metric families of the metadata server's journal and loop, for admin.py's collector (kept apart
so admin.py gains only two lines): `beluga_mds_journal_*` (stopped, lost at start, how full) and
`beluga_mds_loop_*` (mds/loop_stats.py: turn durations, the longest, one ring pass)."""

from __future__ import annotations

from typing import Any


def journal_metrics(snap: dict[str, Any]):  # -> Iterator[Metric]
    """The journal (restart policy "journal"): stopped, lost at start, how full its half is."""
    from prometheus_client.core import GaugeMetricFamily

    j = snap.get("journal") or {}
    journaled = snap.get("restart_policy") == "journal"
    for name, help_, value in (
        (
            "beluga_mds_journal_stopped",
            "1 when journaling had to stop (full, a write failed): the index will not survive a restart",
            1 if journaled and j.get("stopped") else 0,
        ),
        (
            "beluga_mds_journal_lost_at_start",
            "1 when this start restored nothing because the previous server's journal had stopped",
            1 if journaled and j.get("previous_stop") else 0,
        ),
        ("beluga_mds_journal_active", "1 while commits and removals are journaled", 1 if j.get("active") else 0),
        (
            "beluga_mds_journal_restored_entries",
            "Blocks restored from the journal at start",
            j.get("restored_entries", 0),
        ),
        ("beluga_mds_journal_half_bytes", "Bytes in one half of the journal area", j.get("half_bytes", 0)),
        ("beluga_mds_journal_used_bytes", "Bytes used in the active half of the journal", j.get("used_bytes", 0)),
    ):
        g = GaugeMetricFamily(name, help_)
        g.add_metric([], value)
        yield g


def loop_metrics(snap: dict[str, Any]):  # -> Iterator[Metric]
    """The loop's own pauses (mds/loop_stats.py): turn durations, the longest, one ring pass."""
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

    loop = snap.get("loop")
    if not loop:
        return
    h = loop["turn_seconds"]
    hist = HistogramMetricFamily(
        "beluga_mds_loop_turn_seconds", "How long each turn of the server loop kept it from its rings"
    )
    cumulative = 0
    buckets = []
    for bound, n in zip(h["buckets"], h["counts"], strict=False):
        cumulative += n
        buckets.append((repr(bound), cumulative))
    buckets.append(("+Inf", h["count"]))
    hist.add_metric([], buckets, h["sum"])
    yield hist
    for name, help_, value in (
        ("beluga_mds_loop_longest_turn_seconds", "The loop's longest turn since start", loop["longest_turn_us"]),
        (
            "beluga_mds_loop_longest_turn_recent_seconds",
            f"The loop's longest turn over the last {loop['recent_window_s']:g} s",
            loop["longest_turn_recent_us"],
        ),
        ("beluga_mds_loop_ring_pass_seconds", "The last look at every ring that found nothing", loop["ring_pass_us"]),
        ("beluga_mds_loop_ring_pass_mean_seconds", "The mean of those looks", loop["ring_pass_mean_us"]),
    ):
        if value is None:
            continue
        g = GaugeMetricFamily(name, help_)
        g.add_metric([], value / 1e6)
        yield g


def term_metrics(snap: dict[str, Any]):  # -> Iterator[Metric]
    """This server's own terms as the elected leader (snapshot "leadership", mds/leadership.py): when the
    term it holds began (Unix time; 0 while it does not lead) and how many terms it won since it started.
    Beside mds/standby.py's `beluga_mds_leader*` (who leads, since when, changes seen); nothing for a
    server not elected."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    lead = snap.get("leadership")
    if not isinstance(lead, dict):
        return
    leading = bool(lead.get("leading")) and lead.get("leader") == lead.get("member")
    g = GaugeMetricFamily(
        "beluga_mds_leader_term_start_seconds", "When this server's current term as leader began (0: not leading)"
    )
    g.add_metric([], float(lead.get("leader_since") or 0) if leading else 0.0)
    yield g
    c = CounterMetricFamily("beluga_mds_leader_terms_won", "Elections this server won since it started")
    c.add_metric([], lead.get("terms_won") or 0)
    yield c
