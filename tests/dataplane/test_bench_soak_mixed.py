"""`bench soak --mixed` without a server: its bounds, and the judge of its goals on made-up figures (a
bound exceeded, an attack that never took place, a p99 ratio over --p99-ratio-max). The run itself:
tests/hostile/test_soak_mixed.py."""

from __future__ import annotations

from belugactl.cli.app import run
from belugactl.workflows.bench.soak_mixed import MixedConfig, _judge


def test_mixed_soak_refuses_bad_bounds() -> None:
    assert run(["bench", "soak", "--mixed", "--seconds", "2"]) == 2
    assert run(["bench", "soak", "--mixed", "--attackers", "lease-flood,bogus"]) == 2
    assert run(["bench", "soak", "--mixed", "--p99-ratio-max", "0"]) == 2


def _made_up(**attackers) -> dict:
    """A result as _report builds it, for _judge alone: every figure within bounds unless overridden."""
    tenant = {
        "limits": {"live_leases": 1024, "reserved_bytes": 32 << 20, "namespaces": 32, "connections": 16},
        "refused": {},
    }
    figures = {"leases": 0, "bytes_reserved": 0, "namespaces": 0, "connections": 0}
    kinds = ("lease-flood", "reserve-flood", "namespace-churn", "connection-flood")
    got = {
        "lease-flood": {"requests": 9, "keys_found": 900, "leases_per_message_max": 1, "live_leases_max": 9},
        "reserve-flood": {"requests": 9, "held_bytes_max": 32 << 20},
        "namespace-churn": {"requests": 9},
        "connection-flood": {"requests": 9, "opened": 16},
    }
    for kind, changes in attackers.items():
        got[kind.replace("_", "-")].update(changes)
    return {
        "wrong_bytes_served": 0, "wrong_reads": 0, "reads_verified": 1, "corrupt_detected": 0,
        "forgetful": {"attempts": 3, "refused_no_checksum": 3, "accepted": 0},
        "attackers": got, "probe": {"served": 3, "connect_failed": 0, "namespace_failed": 0},
        "latency": {"lookup tcp": {"samples_attacked": 5}}, "p99_ratio_worst": 1.5,
        "server": {
            "high_attacked": dict(figures), "tenants": dict.fromkeys(kinds, tenant),
            "tenant_high_attacked": {k: dict(figures) for k in kinds}, "stats_polls": {"attacked": 3},
            "tcp_limits": {"max_connections": 64}, "bytes_capacity": 512 << 20, "quotas": {},
        },
    }  # fmt: skip


def _judged(r: dict, **cfg) -> list[str]:
    _judge(MixedConfig(seconds=16, kv_mib=512, **cfg), r)
    return r["failed"]


def test_the_judge_fails_each_goal_it_should() -> None:
    assert _judged(_made_up()) == []
    r = _made_up()
    r["wrong_bytes_served"], r["wrong_reads"] = 4096, 1
    assert _judged(r) == ["wrong bytes served"]
    r = _made_up()
    r["forgetful"]["accepted"], r["forgetful"]["refused_no_checksum"] = 1, 2
    assert _judged(r) == ["forgetful commits"]
    assert _judged(_made_up(lease_flood={"leases_per_message_max": 102})) == ["lease-flood attacker"]
    # What the attacker itself counted as held at once (granted within a TTL of the request) over its quota.
    assert _judged(_made_up(lease_flood={"live_leases_max": 1025})) == ["lease-flood attacker"]
    assert _judged(_made_up(reserve_flood={"held_bytes_max": 34 << 20})) == ["reserve-flood attacker"]
    r = _made_up()
    r["server"]["tenant_high_attacked"]["reserve-flood"]["bytes_reserved"] = 33 << 20
    assert _judged(r) == ["reserve-flood attacker"]
    r = _made_up()
    r["probe"]["namespace_failed"] = 1
    assert _judged(r) == ["namespace-churn attacker"]
    r = _made_up()
    r["probe"]["connect_failed"] = 1
    assert _judged(r) == ["connection-flood attacker"]
    assert _judged(_made_up(lease_flood={"keys_found": 0})) == ["lease-flood attacker"]  # no attack took place
    r = _made_up()
    r["server"]["stats_polls"]["attacked"] = 0
    assert len(_judged(r)) == 4  # nothing to judge the attackers by
    r = _made_up()
    r["latency"]["lookup tcp"]["samples_attacked"] = 0
    assert _judged(r) == ["honest tenants served while attacked"]
    assert _judged(_made_up(), p99_ratio_max=1.2) == ["honest p99, attacked / quiet"]
    assert _judged(_made_up(), p99_ratio_max=2.0) == []
    # Without tenants: the per-client caps and the server's totals, less what honest clients hold.
    r = _made_up()
    r["server"]["quotas"] = {"limits": {"live_leases": 32768, "reserved_bytes": 256 << 20, "namespaces": 512}}
    r["server"]["high_attacked"]["bytes_reserved"] = 280 << 20
    assert _judged(r, tenants=False) == []  # within the cap and the honest writers' allowance
    r["server"]["high_attacked"]["bytes_reserved"] = 400 << 20
    assert _judged(r, tenants=False) == ["reserve-flood attacker"]
