"""The plugin in a real vLLM: the entry point registers the connector, and the module path works alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = """
import importlib.metadata as md
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.config.kv_transfer import KVTransferConfig

eps = [e for e in md.entry_points(group="vllm.general_plugins") if e.value.startswith("vllm_beluga")]
assert eps, "no vllm.general_plugins entry point from vllm_beluga"
assert "BelugaConnector" not in KVConnectorFactory._registry
from vllm.plugins import load_general_plugins
load_general_plugins()
load_general_plugins()  # a second load in one process must not raise
by_name = KVConnectorFactory.get_connector_class(KVTransferConfig(kv_connector="BelugaConnector", kv_role="kv_both"))
by_path = KVConnectorFactory.get_connector_class(
    KVTransferConfig(
        kv_connector="BelugaConnector", kv_connector_module_path="vllm_beluga.connector", kv_role="kv_both"
    )
)
assert by_name is by_path, (by_name, by_path)
assert issubclass(by_name, KVConnectorBase_V1) and not issubclass(by_name, SupportsHMA)
# Without SupportsHMA vLLM turns its hybrid allocator off for this connector (one KV-cache group).
assert not KVConnectorFactory.supports_hma_config(KVTransferConfig(kv_connector="BelugaConnector", kv_role="kv_both"))
print("ok", by_name.__module__, by_name.__name__)
"""


def test_entry_point_and_module_path_resolve_the_same_connector(vllm_python: Path) -> None:
    out = subprocess.run(  # noqa: S603 - fixed argv
        [str(vllm_python), "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok vllm_beluga.connector BelugaConnector" in out.stdout
