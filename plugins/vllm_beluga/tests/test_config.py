"""The connector's settings and the fleet-wide pins, without vLLM."""

from __future__ import annotations

import pytest
from vllm_beluga.config import (
    BelugaConfig,
    ConnectorConfigError,
    check_hash_pins,
    layerwise_loads_for,
    layout_id,
    namespace_for,
)


def _cfg(**extra: object) -> BelugaConfig:
    return BelugaConfig.from_extra({"metadata_address": "tcp://127.0.0.1:9471", **extra})


def test_extra_config_is_parsed_and_unknown_keys_kept_apart() -> None:
    cfg = _cfg(
        pool_path="/dev/dax0.0",
        hash_seed=0,
        partition={"offset": 4096, "size": 8192},
        timeout_s="0.5",
        worker_address="tcp://10.0.0.1:9471",
        future_knob=1,
    )
    assert cfg.hash_seed == "0"
    assert cfg.partition == (4096, 8192)
    assert cfg.timeout_s == 0.5
    assert cfg.extra == {"future_knob": 1}
    assert cfg.address_for("worker") == "tcp://10.0.0.1:9471"
    assert cfg.address_for("scheduler") == "tcp://127.0.0.1:9471"


def test_missing_server_address_or_bad_coherence_is_refused() -> None:
    with pytest.raises(ConnectorConfigError, match="metadata_address is required"):
        BelugaConfig.from_extra({"pool_path": "/dev/dax0.0"})
    with pytest.raises(ConnectorConfigError, match="coherence"):
        _cfg(coherence="sometimes")


@pytest.mark.parametrize(
    ("value", "setting"),
    [(True, "on"), ("on", "on"), ("TRUE", "on"), (False, "off"), ("off", "off"), ("false", "off"), ("auto", "auto"),
     (None, "auto")],
)  # fmt: skip
def test_layerwise_loads_takes_json_booleans_and_auto(value: object, setting: str) -> None:
    assert _cfg(layerwise_loads=value).layerwise_loads == setting
    assert "layerwise_loads" not in _cfg(layerwise_loads=value).extra


@pytest.mark.parametrize("value", ["sometimes", 1, 0, "", [True]])
def test_a_layerwise_loads_that_is_no_switch_is_refused(value: object) -> None:
    # 0 and 1 are refused, not read as booleans: a typo must not pick the mode silently.
    with pytest.raises(ConnectorConfigError, match='layerwise_loads is true, false or "auto"'):
        _cfg(layerwise_loads=value)


def test_auto_copies_whole_on_cpu_engines_and_by_layer_elsewhere() -> None:
    assert _cfg().layerwise_loads == "auto"
    assert layerwise_loads_for("auto", "cpu") is False  # the copy would take the forward pass's cores
    assert layerwise_loads_for("auto", "cuda") is True
    assert layerwise_loads_for("on", "cpu") is True
    assert layerwise_loads_for("off", "cuda") is False


@pytest.mark.parametrize(
    ("env", "algo", "message"),
    [
        ({}, "sha256_cbor", "PYTHONHASHSEED is unset"),
        ({"PYTHONHASHSEED": "random"}, "sha256_cbor", "PYTHONHASHSEED is 'random'"),
        ({"PYTHONHASHSEED": "7"}, "sha256_cbor", "fleet pins 0"),
        ({"PYTHONHASHSEED": "0"}, "sha256", "pickled objects"),
        ({"PYTHONHASHSEED": "0"}, "xxhash_cbor", "fleet pins sha256_cbor"),
    ],
)
def test_unpinned_hashing_refuses_to_start(env: dict[str, str], algo: str, message: str) -> None:
    with pytest.raises(ConnectorConfigError, match=message):
        check_hash_pins(_cfg(hash_seed="0"), algo_in_use=algo, env=env)


def test_pinned_hashing_passes() -> None:
    check_hash_pins(_cfg(hash_seed="0"), algo_in_use="sha256_cbor", env={"PYTHONHASHSEED": "0"})
    # without a fleet seed in the config any fixed integer will do
    check_hash_pins(_cfg(), algo_in_use="sha256_cbor", env={"PYTHONHASHSEED": "42"})


def test_namespace_separates_layouts_and_ranks() -> None:
    a = layout_id({"model": "m", "block_size": 16, "platform": "cuda"})
    b = layout_id({"model": "m", "block_size": 32, "platform": "cpu"})
    assert a != b and len(a) == 16
    assert layout_id({"block_size": 16, "model": "m", "platform": "cuda"}) == a  # key order does not matter
    assert namespace_for("rack", a, 1, 2) == f"rack@{a}@tp1of2"
    with pytest.raises(ConnectorConfigError, match="longer than 255"):
        namespace_for("r" * 250, a, 0, 1)


def test_a_kv_cache_of_several_groups_is_refused_by_name() -> None:
    from types import SimpleNamespace

    from vllm_beluga.config import HybridModelRefused, refuse_hybrid

    class FullAttentionSpec:
        pass

    class MambaSpec:
        pass

    one = SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=FullAttentionSpec())])
    refuse_hybrid(one)  # one group: the connector's case
    refuse_hybrid(None)  # the scheduler may get no KV-cache config
    two = SimpleNamespace(kv_cache_groups=[*one.kv_cache_groups, SimpleNamespace(kv_cache_spec=MambaSpec())])
    with pytest.raises(HybridModelRefused, match=r"has 2 \(FullAttentionSpec, MambaSpec\).*Mamba/SSM"):
        refuse_hybrid(two)


# --- a ring per process: which address each process gets ------------------------------------------
RINGS = {
    "transport": "cxl",
    "scheduler_address": "cxl:///dev/dax0.0#4",
    "worker_addresses": {"0": "cxl:///dev/dax0.0#5", "1": "cxl:///dev/dax0.0#6"},
}


def test_each_process_gets_its_own_ring_by_rank() -> None:
    cfg = _cfg(**RINGS)
    assert cfg.worker_addresses == {0: "cxl:///dev/dax0.0#5", 1: "cxl:///dev/dax0.0#6"}
    assert cfg.address_for("scheduler") == "cxl:///dev/dax0.0#4"
    assert cfg.address_for("worker", 0) == "cxl:///dev/dax0.0#5"
    assert cfg.address_for("worker", 1) == "cxl:///dev/dax0.0#6"
    # a rank the plan gave no ring gets no server at all: not another process's ring, not TCP
    assert cfg.address_for("worker", 2) is None
    with pytest.raises(ValueError, match="role"):
        cfg.address_for("router")


def test_without_a_transport_the_old_settings_keep_their_meaning() -> None:
    cfg = _cfg(scheduler_address="cxl:///p#0", worker_addresses={"0": "cxl:///p#1"})
    assert cfg.transport is None
    assert cfg.address_for("worker", 0) == "cxl:///p#1"
    assert cfg.address_for("worker", 3) == "tcp://127.0.0.1:9471"  # not chosen as cxl: the default address
    tcp = _cfg(transport="tcp")
    assert tcp.address_for("scheduler") == tcp.address_for("worker", 1) == "tcp://127.0.0.1:9471"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"worker_addresses": ["cxl:///p#1"]}, "maps a tensor-parallel rank"),
        ({"worker_addresses": {"first": "cxl:///p#1"}}, "is not a rank"),
        ({"worker_addresses": {"0": ""}}, "is not a rank"),
        ({"transport": "rdma"}, "transport must be"),
        ({**RINGS, "worker_addresses": {"0": "tcp://10.0.0.1:9471"}}, r"worker_addresses\[0\] is 'tcp://"),
        ({**RINGS, "scheduler_address": "tcp://10.0.0.1:9471"}, "scheduler_address is 'tcp://"),
    ],
)
def test_bad_ring_settings_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(ConnectorConfigError, match=message):
        _cfg(**extra)
