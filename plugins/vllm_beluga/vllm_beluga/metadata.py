"""What the connector's scheduler side sends its workers each step (vLLM's KV connector metadata).

Both sides import this module: the scheduler builds a `BelugaConnectorMetadata` per step in
`build_connector_meta`, vLLM hands it to every worker, and the workers load and save what it lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from belugactl.dataplane.rpc.protocol import LocationTuple


@dataclass
class BlockTransfer:
    req_id: str
    block_ids: list[int]
    keys: list[bytes]
    # Loads: where each key's bytes are (extents, lease id, nbytes, checksum), looked up by the
    # scheduler over its CXL-RPC ring right after allocation, the lease holding the block until the
    # worker copied it; None for a key that vanished (reported as a load error). None for the whole
    # list: the worker looks up.
    locations: list[LocationTuple | None] | None = None
    # The scheduler's leases on blocks this load does not copy: the worker releases them in the
    # same burst as the load's own (no round trip of the scheduler's for them).
    spare_leases: list[int] = field(default_factory=list)
    # Until when (time.monotonic on the clock `clock` names) the scheduler's leases are certainly
    # live: a worker reading the same clock that copied within it sends its release without waiting.
    leases_trusted_until: float | None = None
    clock: str = ""

    def load_args(self) -> tuple[Any, ...]:
        """PoolTransfer.load's (and prepare_load's) arguments for this transfer, in order."""
        return (self.block_ids, self.keys, self.locations, self.spare_leases, self.leases_trusted_until, self.clock)


@dataclass
class BelugaConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)
    # Requests vLLM preempted this step: their blocks may be given out again before the forward
    # pass, so their asynchronous saves must finish first (handle_preemptions).
    preempted: set[str] = field(default_factory=set)
