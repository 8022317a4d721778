"""What the scheduler drivers (run inside the vLLM venv by test_scheduler.py) build from vLLM: an
engine config with the Beluga connector, requests with vLLM's real block hasher, and the block ids
`update_state_after_alloc` reads. Imported by the driver scripts, which sit in this directory."""

from __future__ import annotations

from typing import Any

from vllm.config import KVTransferConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.request import Request

BS = 32


def engine_config(model: str, address: str, algo: str = "sha256_cbor", **extra: Any) -> Any:
    """vLLM's config for `model` (dummy weights) with the connector talking to `address`."""
    kv = KVTransferConfig(
        kv_connector="BelugaConnector",
        kv_connector_module_path="vllm_beluga.connector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"metadata_address": address, "hash_seed": "0", "namespace": "driver", **extra},
    )
    args = EngineArgs(model=model, load_format="dummy", skip_tokenizer_init=True, block_size=BS,
                      prefix_caching_hash_algo=algo, enable_prefix_caching=False,
                      kv_transfer_config=kv)  # fmt: skip
    return args.create_engine_config()


_hasher: list[Any] = []


def request(rid: str, tokens: list[int], params: dict | None = None) -> Request:
    """A one-token request whose block hashes vLLM computes (sha256_cbor), with optional
    kv_transfer_params. The hasher is made at the first call: vLLM seeds it from PYTHONHASHSEED
    as it is then (the drivers set it before their first request)."""
    if not _hasher:
        fn = get_hash_fn_by_name("sha256_cbor")
        init_none_hash(fn)
        _hasher.append(get_request_block_hasher(BS, fn))
    sp = SamplingParams(max_tokens=1, extra_args={"kv_transfer_params": params} if params else None)
    return Request(rid, tokens, sp, None, block_hasher=_hasher[0])


class Blocks:  # what update_state_after_alloc reads of vLLM's KVCacheBlocks: one group's block ids
    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def get_block_ids(self) -> tuple[list[int]]:
        return (self.ids,)
