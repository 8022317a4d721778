"""The connector says its instance's tenant in HELLO: serve puts it in kv_connector_extra_config."""

from __future__ import annotations

from vllm_beluga.config import BelugaConfig
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.stats import ConnectorStats


def test_the_tenant_from_the_config_reaches_connect() -> None:
    cfg = BelugaConfig.from_extra({"metadata_address": "tcp://127.0.0.1:1", "tenant": "search"})
    assert cfg.tenant == "search" and "tenant" not in cfg.extra
    seen: dict = {}

    def connect(address: str, **kwargs):  # noqa: ANN202 - a stand-in for dataplane.client.connect
        seen.update(kwargs, address=address)
        raise ConnectionError("no server here")

    index = BestEffortIndex(cfg.metadata_address, stats=ConnectorStats(None, role="scheduler"), connect=connect,
                            tenant=cfg.tenant)  # fmt: skip
    assert index.lookup_prefix_leased("ns", [b"k" * 32]) == (0, [])  # a miss: no server
    assert seen["tenant"] == "search" and seen["address"] == "tcp://127.0.0.1:1"
    assert BelugaConfig.from_extra({"metadata_address": "tcp://127.0.0.1:1"}).tenant == ""
