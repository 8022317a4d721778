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
    metadata_address: str  # tcp://host:port[,host:port...] (candidates: the leader is found) or cxl://<pool>#<ring>
    pool_path: str | None = None  # the pool device or file this host maps
    namespace: str = "beluga"  # rack + model; the layout id and TP rank are appended
    model_id: str | None = None  # the model's fleet-wide name (paths differ between hosts)
    scheduler_address: str | None = None  # overrides metadata_address for the scheduler's client
    worker_address: str | None = None  # overrides metadata_address for the workers' clients
    # Per tensor-parallel rank: each worker's own CXL-RPC ring ({"0": "cxl://POOL#7", ...}).
    worker_addresses: dict[int, str] = field(default_factory=dict)
    # "cxl": every process uses its own ring (scheduler_address, worker_addresses) and never
    # metadata_address: a process without a ring gets no server (misses), not a silent TCP client.
    # "tcp", or unset: the addresses above where given, else metadata_address.
    transport: str | None = None
    host: str | None = None
    partition: tuple[int, int] | None = None  # this host's partition (offset, size): informational
    hash_seed: str | None = None  # PYTHONHASHSEED every instance of the fleet must have
    hash_algo: str = "sha256_cbor"
    coherence: str = "none"  # "flush" when the pool is write-back memory shared by several hosts
    timeout_s: float = 1.0
    retry_s: float = 5.0  # after the server was unreachable, try again this much later
    stats_path: str | None = None  # JSON counters, rewritten as they change
    # Layer-wise loads (overlap.py): "auto", "on" or "off"; see `layerwise_loads_for`.
    layerwise_loads: str = "auto"
    # A file pool up to this size has its page tables filled at start-up (prefault.py); 0: never.
    prefault_max_bytes: int = 16 << 30
    instance: str = ""
    tenant: str = ""  # the manifest tenant this instance is of (said in HELLO; `serve` fills it in)
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
        if "worker_addresses" in kwargs:
            kwargs["worker_addresses"] = _worker_addresses(kwargs["worker_addresses"])
        if kwargs.get("transport") not in (None, "cxl", "tcp"):
            raise ConnectorConfigError(f"transport must be 'cxl' or 'tcp', not {kwargs['transport']!r}")
        if kwargs.get("transport") == "cxl":
            rings = {"scheduler_address": kwargs.get("scheduler_address")}
            rings.update({f"worker_addresses[{r}]": a for r, a in kwargs.get("worker_addresses", {}).items()})
            for name, value in rings.items():
                if value is not None and not str(value).startswith("cxl://"):
                    raise ConnectorConfigError(f"transport is 'cxl' but {name} is {value!r}, not a cxl:// ring")
        if "prefault_max_bytes" in kwargs:
            value = kwargs["prefault_max_bytes"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConnectorConfigError(f"prefault_max_bytes is a byte count (0: off), not {value!r}")
        if "layerwise_loads" in kwargs:
            kwargs["layerwise_loads"] = _on_off_auto("layerwise_loads", kwargs["layerwise_loads"])
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

    def address_for(self, role: str, rank: int = 0) -> str | None:
        """The server address of the scheduler's client (role "scheduler") or of tensor-parallel
        rank `rank`'s worker (role "worker"). None under transport "cxl" when this process was given
        no ring: it must not share another process's ring nor fall back to TCP unseen."""
        if role == "scheduler":
            if self.scheduler_address:
                return self.scheduler_address
        elif role == "worker":
            if rank in self.worker_addresses:
                return self.worker_addresses[rank]
            if self.worker_address:
                return self.worker_address
        else:
            raise ValueError(f"role is 'scheduler' or 'worker', not {role!r}")
        return None if self.transport == "cxl" else self.metadata_address


def _on_off_auto(name: str, value: Any) -> str:
    """A three-way switch from JSON: true/false (or "on"/"off") and "auto"; anything else refused."""
    if value is True or (isinstance(value, str) and value.lower() in ("on", "true")):
        return "on"
    if value is False or (isinstance(value, str) and value.lower() in ("off", "false")):
        return "off"
    if value is None or (isinstance(value, str) and value.lower() == "auto"):
        return "auto"
    raise ConnectorConfigError(f"{name} is true, false or \"auto\", not {value!r}")


def layerwise_loads_for(setting: str, device: str) -> bool:
    """Whether loads go layer by layer beside the forward pass, for KV tensors on `device`.

    "auto" says no on a CPU engine: the copy thread would run on the very cores the forward pass's
    threads are bound to, and every core it takes stalls the whole forward (its threads meet at a
    barrier after each operation). Measured on the 2-core CPU demo (docs/measurements.md): the pool hit
    was slower layer-wise than copied before the forward pass. Elsewhere the copy is the device's
    (DMA), and "auto" says yes where the engine can copy by layer."""
    if setting == "on":
        return True
    if setting == "off":
        return False
    return device != "cpu"


def _worker_addresses(value: Any) -> dict[int, str]:
    """{"0": "cxl://...#7", ...} (JSON keys are strings) -> {0: "cxl://...#7", ...}."""
    if not isinstance(value, Mapping):
        raise ConnectorConfigError(f"worker_addresses maps a tensor-parallel rank to an address, not {value!r}")
    out: dict[int, str] = {}
    for rank, address in value.items():
        if not str(rank).isdigit() or not isinstance(address, str) or not address:
            raise ConnectorConfigError(
                f"worker_addresses: {rank!r}: {address!r} is not a rank (0, 1, ...) and an address"
            )
        out[int(rank)] = address
    return out


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
