"""The `vllm.general_plugins` entry point: makes `"kv_connector": "BelugaConnector"` resolvable.

vLLM runs every general plugin in every process it starts (API server, engine core, workers), so
registration must be idempotent. `kv_connector_module_path: "vllm_beluga.connector"` works without
this plugin too.
"""

from __future__ import annotations

CONNECTOR_NAME = "BelugaConnector"
MODULE_PATH = "vllm_beluga.connector"


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    # The registry is a class attribute; a second plugin load in one process must not raise.
    if CONNECTOR_NAME in KVConnectorFactory._registry:
        return
    KVConnectorFactory.register_connector(CONNECTOR_NAME, MODULE_PATH, CONNECTOR_NAME)
