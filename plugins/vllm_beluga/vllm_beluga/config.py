"""The connector's settings (from `kv_connector_extra_config`) and the fleet-wide pins it enforces.

Everything here is plain Python so it can be tested without vLLM.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Algorithms whose block hashes are the same on every host: canonical CBOR, not pickle.
PINNED_HASH_ALGOS = ("sha256_cbor", "xxhash_cbor")


class ConnectorConfigError(ValueError):
    """A setting that would make the connector serve wrong blocks; vLLM refuses to start on it."""


@dataclass(frozen=True)
class BelugaConfig:
    metadata_address: str  # tcp://host:port or cxl://<pool path>#<ring>
    pool_path: str | None = None  # the pool device or file this host maps
    namespace: str = "beluga"  # rack + model; the layout id and TP rank are appended
    model_id: str | None = None  # the model's fleet-wide name (paths differ between hosts)
    scheduler_address: str | None = None  # overrides metadata_address for the scheduler's client
    worker_address: str | None = None  # overrides metadata_address for the workers' clients
    host: str | None = None
    partition: tuple[int, int] | None = None  # this host's partition (offset, size): informational
    hash_seed: str | None = None  # PYTHONHASHSEED every instance of the fleet must have
    hash_algo: str = "sha256_cbor"
    coherence: str = "none"  # "flush" when the pool is write-back memory shared by several hosts
    timeout_s: float = 1.0
    retry_s: float = 5.0  # after the server was unreachable, try again this much later
    stats_path: str | None = None  # JSON counters, rewritten as they change
    instance: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> BelugaConfig:
        data = dict(extra)
        address = data.pop("metadata_address", None)
        if not address or not isinstance(address, str):
            raise ConnectorConfigError(
                "kv_connector_extra_config.metadata_address is required (tcp://HOST:PORT or cxl://POOL#RING); "
                "`belugactl serve` fills it in from the rack manifest"
            )
        partition = data.pop("partition", None)
        known = {f for f in cls.__dataclass_fields__ if f not in ("metadata_address", "partition", "extra")}
        kwargs: dict[str, Any] = {k: data.pop(k) for k in list(data) if k in known}
        if "hash_seed" in kwargs and kwargs["hash_seed"] is not None:
            kwargs["hash_seed"] = str(kwargs["hash_seed"])
        if "timeout_s" in kwargs:
            kwargs["timeout_s"] = float(kwargs["timeout_s"])
        if "retry_s" in kwargs:
            kwargs["retry_s"] = float(kwargs["retry_s"])
        if kwargs.get("coherence", "none") not in ("none", "flush"):
            raise ConnectorConfigError(f"coherence must be 'none' or 'flush', not {kwargs['coherence']!r}")
        part = None
        if partition is not None:
            if isinstance(partition, Mapping):
                part = (int(partition["offset"]), int(partition["size"]))
            else:
                off, size = partition
                part = (int(off), int(size))
        return cls(metadata_address=address, partition=part, extra=data, **kwargs)

    def address_for(self, role: str) -> str:
        if role == "scheduler" and self.scheduler_address:
            return self.scheduler_address
        if role == "worker" and self.worker_address:
            return self.worker_address
        return self.metadata_address


def check_hash_pins(config: BelugaConfig, *, algo_in_use: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse to run unless block hashes are reproducible on every host of the fleet.

    vLLM seeds its first block hash from PYTHONHASHSEED (random bytes when unset) and hashes with
    the configured algorithm; a pickle-based algorithm differs across Python and vLLM versions. Keys
    from an unpinned instance would never match another's, or worse, match by accident.
    """
    env = os.environ if env is None else env
    seed = env.get("PYTHONHASHSEED")
    if seed is None or not seed.isdigit():
        raise ConnectorConfigError(
            f"PYTHONHASHSEED is {'unset' if seed is None else repr(seed)}: block hashes would differ per process. "
            "Set it to the fleet's fixed integer (the manifest's serve.vllm.hash_seed; `belugactl serve` does this)"
        )
    if config.hash_seed is not None and seed != config.hash_seed:
        raise ConnectorConfigError(
            f"PYTHONHASHSEED={seed} but the fleet pins {config.hash_seed}: "
            "this instance's block hashes would match no one's"
        )
    if algo_in_use not in PINNED_HASH_ALGOS:
        raise ConnectorConfigError(
            f"--prefix-caching-hash-algo is {algo_in_use}, which hashes pickled objects (not stable across hosts); "
            "start vLLM with --prefix-caching-hash-algo sha256_cbor"
        )
    if algo_in_use != config.hash_algo:
        raise ConnectorConfigError(
            f"--prefix-caching-hash-algo is {algo_in_use} but the fleet pins {config.hash_algo}"
        )


def layout_id(facts: Mapping[str, Any]) -> str:
    """A short fingerprint of everything that decides a block's bytes (model, dtype, shapes, block size,
    platform layout, weights): two instances exchange blocks only when theirs are equal."""
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def namespace_for(base: str, layout: str, tp_rank: int, tp_size: int) -> str:
    """The metadata-server namespace of one tensor-parallel rank's blocks."""
    name = f"{base}@{layout}@tp{tp_rank}of{tp_size}"
    if len(name.encode()) > 255:
        raise ConnectorConfigError(
            f"namespace {name!r} is longer than 255 bytes; shorten the manifest's rack/model names"
        )
    return name


class HybridModelRefused(ConnectorConfigError):
    """A model whose KV cache has several groups (hybrid attention, Mamba layers) reached the connector."""


def refuse_hybrid(kv_cache_config: Any) -> None:
    """Refuse a KV cache of several groups: block ids of groups other than the first would be
    loaded and saved at the wrong places."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) > 1:
        kinds = ", ".join(sorted({type(g.kv_cache_spec).__name__ for g in groups}))
        raise HybridModelRefused(
            f"BelugaConnector handles one KV-cache group; this model has {len(groups)} ({kinds}). "
            "Hybrid models with sliding-window layers run with --disable-hybrid-kv-cache-manager "
            "(vLLM does that by itself for this connector unless it is forced on); models with Mamba/SSM "
            "layers cannot use the Beluga pool yet: serve them without kv_transfer_config."
        )
