"""The rack manifest's schema: one CXL switch domain, its pool, its hosts, and how they serve.

Pydantic v2 models with `extra="forbid"`, so an unknown key is an error (the loader adds the
did-you-mean). Rules that involve one field live here as validators; rules that relate several
parts of the document (partitions fit, one metadata host, ports do not collide) live in
`manifest_rules.py`, so each failure can name the field it is about.
"""

from __future__ import annotations

import ipaddress
import re
import uuid as uuid_mod
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainValidator,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from belugactl.units import KiB, MiB, SizeParseError, is_power_of_two, parse_size

SUPPORTED_VERSIONS = (1,)
MAX_HOSTS = 16  # one CXL switch domain in Beluga
HOST_NAME_MAX = 47  # the on-media host table keeps names in 48 NUL-padded bytes
CACHE_LINE = 64
DEVDAX_ALIGNS = (2 * MiB, 1 << 30)  # devdax aligns that keep 2 MiB-aligned mmap lengths valid
HW_INTERLEAVE_WAYS = (1, 2, 3, 4, 6, 8, 12, 16)  # what CXL decoders can program
HW_INTERLEAVE_GRANULARITIES = tuple(256 << i for i in range(7))  # 256 B .. 16 KiB
GPU_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM's --block-size choices on CUDA

_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_NAMESPACE_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


# Offsets into the pool are signed 64-bit on the way to the kernel (off_t, mmap, pread), and the
# on-media header stores them as 64-bit words: a size past this cannot be addressed at all.
MAX_OFFSET = (1 << 63) - 1


def _fits_offsets(value: int, given: Any) -> int:
    if value > MAX_OFFSET:
        raise ValueError(
            f"{given} is past the 64-bit offset space (offsets are signed 64-bit, so at most 8 EiB); "
            "a CXL pool is a few TiB"
        )
    return value


def _size(value: Any) -> int:
    try:
        return _fits_offsets(parse_size(value), value)
    except SizeParseError as exc:
        raise ValueError(str(exc)) from None


Size = Annotated[int, BeforeValidator(_size, json_schema_input_type=int | str)]


def _size_or(word: str, *, percent: bool = False) -> Any:
    def check(value: Any) -> int | str:
        if value == word:
            return word
        if percent and isinstance(value, str) and value.strip().endswith("%"):
            number = value.strip()[:-1].strip()
            if not number.isdigit() or not 1 <= int(number) <= 100:
                raise ValueError(f"a percentage is a whole number from 1% to 100%, got {value!r}")
            return f"{int(number)}%"
        try:
            return _fits_offsets(parse_size(value), value)
        except SizeParseError as exc:
            also = ", a percentage such as 50%" if percent else ""
            raise ValueError(f"expected {word!r}{also} or a size: {exc}") from None

    return check


# shared_kv: a size, "N%" of what follows the metadata area, or "rest" (what the partitions leave)
SizeOrRest = Annotated[int | str, PlainValidator(_size_or("rest", percent=True), json_schema_input_type=int | str)]
SizeOrEqual = Annotated[int | str, PlainValidator(_size_or("equal"), json_schema_input_type=int | str)]


def _memdev_list(value: Any) -> str | list[str]:
    if value == "all":
        return "all"
    if not isinstance(value, list) or not all(isinstance(x, str | int) and not isinstance(x, bool) for x in value):
        raise ValueError(
            'expected "all", a list of memdev serial numbers, or a mapping such as {switch: any, count: 2}'
        )
    if not value:
        raise ValueError('list at least one memdev serial, or write "all"')
    serials = [str(x) for x in value]
    if len(set(serials)) != len(serials):
        raise ValueError("a memdev serial is listed twice")
    return serials


def _strict_int(value: Any) -> Any:
    # YAML's `yes`/`true` would otherwise pass as 1
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


Int = Annotated[int, BeforeValidator(_strict_int)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=False)


_BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


class MemdevPick(Strict):
    """Memdevs chosen by where they sit and how many, not by serial.

    switch: the PCI address of a CXL switch's upstream port as this host sees it ("0000:0d:00.0"),
    or "any": the one switch the host's memdevs sit behind. count: the first N by serial of the
    memdevs chosen (by the switch, or every memdev with capacity of the region's type).
    Interleave position follows serial order either way.
    """

    switch: str | None = None
    count: Int | None = None

    @field_validator("switch", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        if value is None or value == "any":
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            # YAML 1.1 reads 0000:10:00.0 as a base-60 number (600.0); 0000:0d:00.0 stays a string.
            raise ValueError(
                f"a PCI address written bare can read as a YAML base-60 number (got {value!r}); "
                'quote it: switch: "0000:10:00.0"'
            )
        match = _BDF_RE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(
                f'expected "any" or the PCI address of the switch\'s upstream port such as 0000:0d:00.0, got {value!r}'
            )
        domain, bus, device, function = match.groups()
        # lspci leaves out domain 0000; sysfs (and discovery) always print it, in lower case
        return f"{domain or '0000'}:{bus}:{device}.{function}".lower()

    @field_validator("count")
    @classmethod
    def _count(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= max(HW_INTERLEAVE_WAYS):
            raise ValueError(f"count is the number of memdevs in the region: 1 to {max(HW_INTERLEAVE_WAYS)}")
        return value

    @model_validator(mode="after")
    def _something(self) -> MemdevPick:
        if self.switch is None and self.count is None:
            raise ValueError('give switch (a PCI address, or "any"), count, or both; or write memdevs: all')
        return self


def _memdev_form(value: Any) -> str:
    if isinstance(value, dict | MemdevPick):
        return "pick"
    return "serials"


MemdevSelection = Annotated[
    Annotated[
        str | list[str],
        PlainValidator(_memdev_list, json_schema_input_type=Literal["all"] | list[str | int]),
        Tag("serials"),
    ]
    | Annotated[MemdevPick, Tag("pick")],
    Discriminator(_memdev_form),
]


# ---- pool -----------------------------------------------------------------------------------


class Interleave(Strict):
    """How the pool is spread over memory devices.

    hardware: the CXL decoders interleave (`cxl create-region -w WAYS -g GRANULARITY`).
    software: the data plane stripes extents over `ways` devices in `granularity` units
    (Beluga's 2 MiB software interleave across a firmware-provisioned range).
    """

    mode: Literal["hardware", "software"] = "hardware"
    ways: Int = 1
    granularity: Size | None = None

    @model_validator(mode="after")
    def _check(self) -> Interleave:
        if self.mode == "hardware":
            if self.ways not in HW_INTERLEAVE_WAYS:
                raise ValueError(f"hardware interleave ways must be one of {', '.join(map(str, HW_INTERLEAVE_WAYS))}")
            if self.granularity is not None and self.granularity not in HW_INTERLEAVE_GRANULARITIES:
                raise ValueError("hardware interleave granularity must be one of 256B, 512B, 1KiB ... 16KiB")
        else:
            if self.ways < 1:
                raise ValueError("software interleave needs at least 1 way")
        return self


class RegionSource(Strict):
    """Build a CXL region from memory devices (the lab, or hosts without firmware provisioning)."""

    kind: Literal["cxl-region"]
    memdevs: MemdevSelection = "all"
    type: Literal["pmem", "ram"] = "pmem"
    decoder: str | None = None  # root decoder, e.g. decoder0.0; discovered when absent
    region_size: Size | None = None  # raw region size before the namespace takes its share


class DaxSource(Strict):
    """Use a dax device that already exists (firmware-provisioned memory, as in Beluga)."""

    kind: Literal["dax-device"]
    device: str  # e.g. dax0.0 or /dev/dax0.0

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        name = value.removeprefix("/dev/")
        if not re.fullmatch(r"dax\d+\.\d+", name):
            raise ValueError(f"expected a dax device such as dax0.0 or /dev/dax0.0, got {value!r}")
        return name


class Namespace(Strict):
    """The devdax namespace every host must create identically (same uuid, name, map, align)."""

    uuid: str
    name: str
    map: Literal["mem", "dev"] = "mem"

    @field_validator("uuid", mode="before")
    @classmethod
    def _uuid(cls, value: Any) -> str:
        try:
            return str(uuid_mod.UUID(str(value)))
        except ValueError:
            raise ValueError(f"expected a uuid such as 6f1d2c3a-...-... (uuidgen prints one), got {value!r}") from None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAMESPACE_NAME_RE.fullmatch(value):
            raise ValueError("a namespace name is 1 to 63 characters of letters, digits, '.', '_' or '-'")
        return value

    @field_validator("map")
    @classmethod
    def _map(cls, value: str) -> str:
        if value != "mem":
            # map=dev keeps per-page metadata on the pool media itself; every host would write its own
            # copy into the same bytes (reference/qemu-cxl-lab.md).
            raise ValueError("a shared pool needs map: mem (map: dev stores page metadata on the shared media)")
        return value


_ACCOUNT_RE = re.compile(r"^([a-z_][a-z0-9_-]{0,31}|[0-9]{1,10})$")  # a user/group name, or a numeric id


class Permissions(Strict):
    """Owner, group and mode of the pool's /dev/daxX.Y node (setup's udev rule; doctor compares).

    `mode` is an octal string ("0660") or an integer: YAML reads an unquoted 0660 as octal (432).
    It is kept as a four-digit octal string.
    """

    owner: str = "root"
    group: str = "root"
    mode: str = "0660"

    @field_validator("owner", "group", mode="before")
    @classmethod
    def _account(cls, value: Any) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not _ACCOUNT_RE.fullmatch(text):
            raise ValueError(f"expected a user/group name such as beluga, or a numeric id, got {value!r}")
        return text

    @field_validator("mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> str:
        if isinstance(value, bool):
            raise ValueError(f"expected an octal mode such as \"0660\", got {value!r}")
        if isinstance(value, int):
            if not 0 <= value <= 0o777:
                # `mode: 660` (no leading 0) is decimal 660 to YAML, not octal 660.
                raise ValueError(f"mode {value} is not a permission value; write it quoted, as octal: \"0660\"")
            bits = value
        elif isinstance(value, str) and re.fullmatch(r"(0o)?[0-7]{3,4}", value.strip()):
            bits = int(value.strip().removeprefix("0o"), 8)
            if bits > 0o777:
                raise ValueError(f"mode {value!r}: setuid/setgid/sticky bits mean nothing on a device node")
        else:
            raise ValueError(f"expected an octal mode such as \"0660\", got {value!r}")
        if bits & 0o002:
            raise ValueError(
                f"mode {bits:04o} is world-writable: any local user could overwrite every host's KV blocks"
            )
        return f"{bits:04o}"

    @property
    def mode_bits(self) -> int:
        return int(self.mode, 8)


class PoolExpect(Strict):
    """What the pool's memory devices should measure (`belugactl doctor --perf`, `bench pool -f`): the
    vendor's or the seeds' figures (about 750 ns, 22.5 GB/s per device). Unset fields are not compared.
    A figure worse than expected by more than `margin_percent` is a warning, never a failure."""

    load_latency_ns: float | None = Field(default=None, gt=0)  # one dependent load, one device
    read_gbps_per_device: float | None = Field(default=None, gt=0)  # GB/s (10^9 bytes), invalidated reads
    write_gbps_per_device: float | None = Field(default=None, gt=0)  # GB/s, non-temporal stores
    margin_percent: float = Field(default=25.0, ge=0, lt=100)


class Pool(Strict):
    source: RegionSource | DaxSource = Field(discriminator="kind")
    size: Size  # usable bytes: the dax device size, which the layout is built on
    align: Size = 2 * MiB
    interleave: Interleave = Interleave()
    namespace: Namespace | None = None
    permissions: Permissions = Permissions()  # of the pool's /dev node on every host
    expect: PoolExpect | None = None  # measured speed to compare against (doctor --perf)

    @field_validator("align")
    @classmethod
    def _align(cls, value: int) -> int:
        if value not in DEVDAX_ALIGNS:
            raise ValueError("devdax align must be 2MiB or 1GiB")
        return value

    @field_validator("size")
    @classmethod
    def _pool_size(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("the pool size must be positive")
        return value


# ---- layout ---------------------------------------------------------------------------------


class Metadata(Strict):
    slots_per_ring: Int = 64
    slot_size: Size = 256
    spare_rings: Int = 4
    # Unset: sized to cover the pool at min_block (Manifest._default_journal, model/journal_sizing.py),
    # at least 4 MiB, which is what every pool up to ~36 GiB gets (and got before the rule).
    journal: Size = 4 * MiB
    # The smallest KV block the journal must cover a full pool of (manifest_rules refuses a journal that
    # cannot). Not part of the layout: raising it never moves a region. Unset: 2 MiB, one allocator chunk.
    min_block: Size | None = None

    @field_validator("min_block")
    @classmethod
    def _min_block(cls, value: int | None) -> int | None:
        if value is not None and (value < 4 * KiB or value % (4 * KiB) or value > 1 << 30):
            raise ValueError("min_block is a multiple of 4 KiB between 4KiB and 1GiB")
        return value

    @field_validator("slots_per_ring")
    @classmethod
    def _slots(cls, value: int) -> int:
        if not is_power_of_two(value) or value > 65536:
            raise ValueError("slots_per_ring must be a power of two between 1 and 65536")
        return value

    @field_validator("slot_size")
    @classmethod
    def _slot_size(cls, value: int) -> int:
        if value < 2 * CACHE_LINE or value % CACHE_LINE:
            raise ValueError("slot_size must be a multiple of 64 B (one cache line) and at least 128 B")
        if value > 1 * MiB:
            raise ValueError("slot_size above 1MiB is not a control message; move bulk data through the KV area")
        return value

    @field_validator("spare_rings")
    @classmethod
    def _spare(cls, value: int) -> int:
        if not 0 <= value <= 4096:
            raise ValueError("spare_rings must be between 0 and 4096")
        return value


class Capacity(Strict):
    """What the pool is laid out for, whoever uses it now: host partition slots and CXL-RPC rings per
    slot. With it, hosts, instance counts and tensor-parallel sizes change within these numbers
    without moving a region (a membership change, docs/serving.md "Day two"); without it the layout
    is sized to today's hosts and processes and any change of them is a new layout."""

    hosts: Int
    rings_per_host: Int

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: int) -> int:
        if not 1 <= value <= MAX_HOSTS:
            raise ValueError(f"capacity.hosts is between 1 and {MAX_HOSTS} (one CXL switch domain)")
        return value

    @field_validator("rings_per_host")
    @classmethod
    def _rings(cls, value: int) -> int:
        if not 1 <= value <= 1024:
            raise ValueError("capacity.rings_per_host is between 1 and 1024")
        return value


class Layout(Strict):
    header: Size = 2 * MiB
    metadata: Metadata = Metadata()
    # The shared area takes what the partitions leave, and a partition is, unless the manifest says
    # otherwise, one `pool.align` unit: enough for belugactl's per-host records (the rack probe). KV
    # blocks live in the shared area, where every host reaches them at the same cost (docs/pool-format.md,
    # "Per-host partitions").
    shared_kv: SizeOrRest = "rest"
    partition_size: SizeOrEqual | None = None  # None: one pool.align unit per host
    capacity: Capacity | None = None  # None: sized to today's hosts and processes


# ---- hosts ----------------------------------------------------------------------------------


class Numa(Strict):
    """What `numactl --hardware` should show; the CXL node number itself is never pinned."""

    cpu_nodes: Int = 1
    cxl_nodes: Int = 1
    cxl_node_cpuless: bool = True

    @field_validator("cpu_nodes", "cxl_nodes")
    @classmethod
    def _nodes(cls, value: int) -> int:
        if not 0 <= value <= 64:
            raise ValueError("a node count is between 0 and 64")
        return value


class Gpus(Strict):
    count: Int = 0
    model: str | None = None

    @field_validator("count")
    @classmethod
    def _count(cls, value: int) -> int:
        if not 0 <= value <= 64:
            raise ValueError("a GPU count is between 0 and 64")
        return value


class Hugepages(Strict):
    page_size: Size = 2 * MiB
    per_node: dict[Int, Int] = {}

    @field_validator("page_size")
    @classmethod
    def _page(cls, value: int) -> int:
        if value not in (2 * MiB, 1 << 30):
            raise ValueError("hugepage size must be 2MiB or 1GiB")
        return value

    @field_validator("per_node")
    @classmethod
    def _per_node(cls, value: dict[int, int]) -> dict[int, int]:
        for node, count in value.items():
            if node < 0 or count < 0:
                raise ValueError("NUMA node ids and page counts are non-negative")
        return value


class Tuning(Strict):
    hugepages: Hugepages | None = None
    thp: Literal["always", "madvise", "never"] | None = None


class Host(Strict):
    name: str
    address: str
    roles: list[Literal["metadata", "worker"]] = ["worker"]
    platform: Literal["gpu", "cpu"] = "gpu"
    numa: Numa = Numa()
    gpus: Gpus = Gpus()
    partition_size: Size | None = None
    slot: Int | None = None  # with layout.capacity: its partition slot (default: its place in the list)
    instances: Int | None = None  # overrides serve.vllm.instances_per_host
    block_size: Int | None = None  # overrides serve.vllm.block_size for this host's platform
    metadata_transport: Literal["cxl", "tcp"] | None = None  # overrides serve.metadata.transport for this host
    tuning: Tuning | None = None  # overrides the rack-wide tuning

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value.encode()) > HOST_NAME_MAX or not _HOST_NAME_RE.fullmatch(value):
            raise ValueError(
                f"a host name is 1 to {HOST_NAME_MAX} characters of letters, digits, '.', '_' or '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            pass
        labels = value.split(".")
        if len(value) > 253 or not all(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", x) for x in labels):
            raise ValueError(f"expected an IP address or a DNS name, got {value!r}")
        return value

    @field_validator("roles")
    @classmethod
    def _roles(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("a host needs at least one role: metadata or worker")
        if len(set(value)) != len(value):
            raise ValueError("a role is listed twice")
        return value


# ---- caching and serving --------------------------------------------------------------------


MemoryType = Literal["uncachable", "write-back"]
# Named per-area choices: seeds = the KV area uncachable (GPU copies, DDIO off), the control areas
# (header, epoch word, rings, journal: what the CPU polls or writes small) write-back.
MEMORY_TYPE_PRESETS: dict[str, dict[str, str]] = {"seeds": {"kv": "uncachable", "control": "write-back"}}
# A CPU has 8 to 10 variable MTRRs (IA32_MTRRCAP) and firmware keeps some; a split's KV area may
# take at most this many (caching.kv_mtrrs).
MAX_KV_MTRRS = 8


class CachingAreas(Strict):
    kv: MemoryType = "write-back"
    control: MemoryType = "write-back"


class Caching(Strict):
    ddio: Literal["disabled", "enabled", "unmanaged"] = "disabled"
    # The whole pool's memory type. With a split (KV uncachable, control write-back) it reads as the
    # control areas' type, the one the CPU's paths (mapping, rings, copies) flush for.
    pool_memory_type: MemoryType = "write-back"
    # The memory type per area (areas) or a named preset of them (memory_types); at most one of
    # pool_memory_type, areas and memory_types is written.
    areas: CachingAreas | None = None
    memory_types: Literal["seeds"] | None = None
    # With a split: the variable MTRRs the KV area may take (the layout aligns it to fit; fewer
    # leave more of the pool unused below it). Ignored without a split.
    kv_mtrrs: Int = 4

    @field_validator("kv_mtrrs")
    @classmethod
    def _kv_mtrrs(cls, value: int) -> int:
        if not 1 <= value <= MAX_KV_MTRRS:
            raise ValueError(
                f"kv_mtrrs is 1 to {MAX_KV_MTRRS}: a CPU has 8 to 10 variable MTRRs and firmware keeps some; "
                "to need fewer, make the pool (and shared_kv) a power of two aligned to its size"
            )
        return value

    @model_validator(mode="after")
    def _one_way(self) -> Caching:
        if self.areas is not None and self.memory_types is not None:
            raise ValueError("write areas or memory_types, not both: they both set the memory type per area")
        kinds = self.area_types()
        explicit = "pool_memory_type" in self.model_fields_set
        if explicit and self.pool_memory_type != kinds["control"]:
            raise ValueError(
                f"pool_memory_type {self.pool_memory_type} contradicts the per-area types "
                f"(kv {kinds['kv']}, control {kinds['control']}): write only one of them"
            )
        if kinds["kv"] == "write-back" and kinds["control"] == "uncachable":
            raise ValueError(
                "an uncachable control area beside a write-back KV area is refused: the CPU polls the rings and "
                "writes the journal small, which uncachable memory makes slow (a 16 KB store 281.56 us instead of "
                "2.41 us with non-temporal stores); use memory_types: seeds (KV uncachable, control write-back)"
            )
        # The rest of belugactl reads pool_memory_type: the whole pool's type, or with a split the
        # control areas' (header, rings, journal: the CPU's paths flush for write-back).
        object.__setattr__(self, "pool_memory_type", kinds["control"])
        return self

    def area_types(self) -> dict[str, str]:
        """The memory type of each area, kv and control, whichever way the manifest says it."""
        if self.memory_types is not None:
            return dict(MEMORY_TYPE_PRESETS[self.memory_types])
        if self.areas is not None:
            return {"kv": self.areas.kv, "control": self.areas.control}
        return {"kv": self.pool_memory_type, "control": self.pool_memory_type}

    @property
    def split(self) -> bool:
        """The KV area uncachable and the control areas write-back: the layout aligns the KV area for
        MTRRs of its own (model/layout.py)."""
        kinds = self.area_types()
        return kinds["kv"] != kinds["control"]


def _port(value: int) -> int:
    if not 1 <= value <= 65535:
        raise ValueError(f"a TCP port is between 1 and 65535, got {value}")
    return value


TCP_LIMIT_RANGES: dict[str, tuple[int, int]] = {
    "tcp_max_connections": (1, 65536),
    "tcp_idle_timeout_s": (1, 86400),
    "tcp_max_buffered": (4 * KiB, 64 * MiB),
    "tcp_accept_backoff_ms": (1, 60000),
}


class MetadataEtcd(Strict):
    """serve.metadata.etcd: the metadata servers elect their leader through etcd (issue 32;
    dataplane/mds/leadership.py). `metadata-server --standby` reads these when its flags are absent."""

    # The etcd cluster's client URLs (http://HOST:PORT; three members on three hosts in production).
    endpoints: list[str] = Field(min_length=1, max_length=16)
    # The hosts that run a metadata server: the first leads when the rack starts, the others stand by.
    candidates: list[str] = Field(default_factory=list, max_length=16)
    # The leader's etcd lease, whole seconds: a dead leader is replaced about this long after it died.
    leader_ttl_s: Int = Field(default=5, ge=2, le=60)
    # serve runs this rack's etcd: a member on each host an endpoint names, its data under the run dir,
    # started before the metadata server and stopped after it. false: an etcd cluster you run (its
    # units from `export systemd`, or your own).
    run: bool = False
    # warm: each standby keeps a copy of the leader's index in step with the journal (a takeover without a
    # rebuild; the memory of a second index); cold: none (the takeover rebuilds from the journal).
    standby: Literal["warm", "cold"] = "warm"

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        for url in value:
            if not re.fullmatch(r"https?://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(:[0-9]{1,5})?", url):
                raise ValueError(f"{url!r} is not an etcd client URL (http://HOST:PORT)")
        return value


class MetadataServe(Strict):
    host: str | None = None  # defaults to the host with the metadata role
    admin_bind: str = "127.0.0.1"
    admin_port: Int = 9470
    rpc_port: Int = 9471
    # The RPC TCP listener (clients outside the pool's rings: workers on other hosts). Loopback by
    # default, so nothing listens on the rack network unless the manifest says so.
    rpc_bind: str = "127.0.0.1"
    # How vLLM processes reach the server: cxl, each process over its own CXL-RPC ring in the pool
    # (the layout allots one per process); tcp, over the RPC TCP listener (hosts outside the CXL
    # domain, a file pool that other machines cannot map). hosts[].metadata_transport overrides it.
    transport: Literal["cxl", "tcp"] = "cxl"
    # Namespaces (model/layout/rank) the index keeps open; at the cap idle empty ones are dropped,
    # then OPEN_NS answers NS_LIMIT (a client cannot grow the server's memory without bound).
    max_namespaces: Int = 4096
    # Live read leases one client (a CXL ring or a TCP connection) may hold at once; past it its lookups
    # answer misses (docs/dataplane.md "Quotas"). A reader releases each lease after its copy.
    client_live_leases: Int = Field(32768, ge=1, le=1 << 31)
    # After a request the server busy-polls the CXL-RPC rings this long (a request then waits
    # microseconds), then looks every 0.1 ms for 50 ms, then every 0.25 ms. The poll takes a core:
    # right on a GPU server, where cores are spare; on a host whose few cores run the model (CPU
    # serving) it slows the forward pass it waits beside, so such a host sets 0: no busy-poll and
    # no 0.1 ms looks, only a look every 0.25 ms.
    spin_after_ms: Int = 50
    # Zero a block's bytes when it is freed, so space handed to a new key never still holds another
    # instance's KV data. None (unset): on when more than one vLLM instance shares the pool
    # (Manifest.zero_on_free); true/false: as written.
    zero_on_free: bool | None = None
    # The rack secret (docs/dataplane.md, Authentication): TCP RPC clients and admin writes must
    # prove it when rpc_bind or admin_bind is beyond loopback. Mode 0600, owned by the server's
    # user; `setup` creates it (or the server, when it needs it and the file is missing).
    # None: /etc/belugactl/<rack name>.secret.
    secret_file: str | None = None
    # Seconds between the server's reads of its pool device's poison lists (`cxl list -R -L`, what
    # doctor's cxl.media-errors reads): poisoned lines are quarantined and the blocks on them
    # dropped (dataplane/mds/poison.py). 0: never (POST /poison on the admin port still works).
    # A file pool has no poison list to read.
    poison_check_s: Int = Field(default=60, ge=0, le=86400)
    # A leader elected through etcd and its standbys (None: one server, no standby).
    etcd: MetadataEtcd | None = None
    # What a restart of the server keeps: journal, the index rebuilt from the journal in the pool;
    # start-empty, nothing. None: journal on a device pool or with etcd, start-empty on a file pool
    # (metadata-server --restart-policy). A file pool that a rolling restart must keep warm says journal.
    restart_policy: Literal["journal", "start-empty"] | None = None

    @field_validator("spin_after_ms")
    @classmethod
    def _spin_after(cls, value: int) -> int:
        if not 0 <= value <= 60_000:
            raise ValueError("spin_after_ms must be between 0 and 60000 (milliseconds)")
        return value

    @field_validator("max_namespaces")
    @classmethod
    def _max_ns(cls, value: int) -> int:
        if not 1 <= value <= 1 << 20:
            raise ValueError("max_namespaces must be between 1 and 1048576")
        return value

    # TCP listener limits (a client cannot make the server run out of memory or descriptors).
    tcp_max_connections: Int = 256
    tcp_idle_timeout_s: Int = 300
    tcp_max_buffered: Size = 256 * KiB  # per connection: one frame's bytes, so also the TCP max payload
    tcp_accept_backoff_ms: Int = 200  # accept() failing with EMFILE/ENFILE: pause accepting this long

    @field_validator("tcp_max_connections", "tcp_idle_timeout_s", "tcp_max_buffered", "tcp_accept_backoff_ms")
    @classmethod
    def _tcp_limits(cls, value: int, info: ValidationInfo) -> int:
        lo, hi = TCP_LIMIT_RANGES[info.field_name]
        if not lo <= value <= hi:
            raise ValueError(f"{info.field_name} must be between {lo} and {hi}, got {value}")
        return value

    @field_validator("secret_file")
    @classmethod
    def _secret_file(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("/") or any(c in value for c in "\0\n")):
            raise ValueError(f"secret_file must be an absolute path, got {value!r}")
        return value

    @field_validator("admin_bind", "rpc_bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"expected an IP address to bind, such as 127.0.0.1, got {value!r}") from None
        return value

    @field_validator("admin_port", "rpc_port")
    @classmethod
    def _ports(cls, value: int) -> int:
        return _port(value)


class BlockSize(Strict):
    gpu: Int = 16
    cpu: Int = 32

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: int) -> int:
        if value not in GPU_BLOCK_SIZES:
            raise ValueError(f"on GPUs vLLM's block size is one of {', '.join(map(str, GPU_BLOCK_SIZES))}")
        return value

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: int) -> int:
        if value <= 0 or value % 32:
            raise ValueError("vLLM's CPU attention backend needs a block size that is a multiple of 32")
        return value


class Vllm(Strict):
    model: str
    instances_per_host: Int = 1
    gpus_per_instance: Int = 1
    block_size: BlockSize = BlockSize()
    port_base: Int = 8000
    extra_args: list[str] = []
    env: dict[str, str] = {}
    hash_seed: str = "0"
    prefix_caching_hash_algo: Literal["sha256_cbor", "xxhash_cbor", "sha256", "xxhash"] = "sha256_cbor"
    # Prefill/decode disaggregation: instance i of every host takes kv_roles[i] (vLLM's kv_role names);
    # instances past the list are kv_both. Producers prefill and save, consumers load and decode; the
    # front door (serve.router) then sends each request to a producer, then to a consumer.
    kv_roles: list[Literal["kv_both", "kv_producer", "kv_consumer"]] = []
    # The connector's pool hits: copied layer by layer beside the forward pass (true), whole before
    # it (false), or "auto": whole on CPU engines, whose forward pass needs every core the copy
    # would take (docs/serving.md, "Loads: layer-wise or before the forward pass"). A boolean, not
    # on/off strings: YAML reads a bare `on` as true anyway.
    layerwise_loads: bool | Literal["auto"] = "auto"

    def kv_role(self, instance: int) -> str:
        return self.kv_roles[instance] if instance < len(self.kv_roles) else "kv_both"

    @property
    def disaggregated(self) -> bool:
        return any(r != "kv_both" for r in self.kv_roles)

    @field_validator("layerwise_loads", mode="before")
    @classmethod
    def _layerwise(cls, value: object) -> object:
        # One message for the one field (the union alone reports each of its members' refusals).
        if value is True or value is False or value == "auto":
            return value
        raise ValueError(f"expected true, false or 'auto', got {value!r}")

    @field_validator("instances_per_host")
    @classmethod
    def _instances(cls, value: int) -> int:
        if not 0 <= value <= 64:
            raise ValueError("instances_per_host is between 0 and 64")
        return value

    @field_validator("gpus_per_instance")
    @classmethod
    def _gpi(cls, value: int) -> int:
        if not 0 <= value <= 64:
            raise ValueError("gpus_per_instance is between 0 and 64")
        return value

    @field_validator("port_base")
    @classmethod
    def _port_base(cls, value: int) -> int:
        return _port(value)

    @field_validator("hash_seed", mode="before")
    @classmethod
    def _seed(cls, value: Any) -> str:
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not text.isdigit() or int(text) > 4294967295:
            # PYTHONHASHSEED=random would give every worker different block hashes
            raise ValueError("hash_seed must be a fixed integer 0..4294967295 (PYTHONHASHSEED), the same fleet-wide")
        return str(int(text))

    @field_validator("prefix_caching_hash_algo")
    @classmethod
    def _algo(cls, value: str) -> str:
        if not value.endswith("_cbor"):
            raise ValueError(
                f"{value} hashes pickled Python objects, which differ across Python and vLLM versions; "
                "use sha256_cbor (or xxhash_cbor) so every host computes the same block keys"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        if "PYTHONHASHSEED" in value:
            raise ValueError("set PYTHONHASHSEED through serve.vllm.hash_seed, which is pinned fleet-wide")
        for key in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value


HOST_ADDRESS = "address"  # serve.router.bind: each router host binds its own hosts[].address


class RouterServe(Strict):
    """The front door: HAProxy, least-connections over every vLLM instance of the rack (workflows/serve/router.py)."""

    hosts: list[str] = []  # where it runs; empty: the metadata server's host, else the first host
    # loopback unless the manifest opens it to the network; `address`: each router host binds its own
    # hosts[].address (two front doors, so that a rolling restart always leaves one answering)
    bind: str = "127.0.0.1"
    port: Int = 8090
    stats_port: Int = 8404  # on `bind`: /metrics (Prometheus), /stats (HAProxy's page), /healthz
    check_interval_ms: Int = 2000  # GET /health on every instance this often; 2 failures mark it down
    drain_timeout_s: Int = 30  # on stop: in-flight requests get this long before the hard stop

    @field_validator("bind")
    @classmethod
    def _bind(cls, value: str) -> str:
        return value if value == HOST_ADDRESS else MetadataServe._bind(value)

    def bind_on(self, host: Host) -> str:
        """Where the router on `host` listens: `bind`, or with `address` the host's own address."""
        return host.address if self.bind == HOST_ADDRESS else self.bind

    @field_validator("port", "stats_port")
    @classmethod
    def _ports(cls, value: int) -> int:
        return _port(value)

    @field_validator("check_interval_ms", "drain_timeout_s")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be a positive integer")
        return value


class Serve(Strict):
    metadata: MetadataServe = MetadataServe()
    vllm: Vllm
    router: RouterServe | None = None  # absent: no front door


_TENANT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class TenantQuotas(Strict):
    """What one tenant's clients may hold at once, summed over them (absent: no tenant limit; the
    per-client caps of docs/dataplane.md still apply)."""

    live_leases: Int | None = None
    reserved_bytes: Size | None = None
    stored_bytes: Size | None = None
    connections: Int | None = None
    namespaces: Int | None = None

    @field_validator("live_leases", "reserved_bytes", "stored_bytes", "connections", "namespaces")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("must be positive (leave it out for no limit)")
        return value


class Tenant(Strict):
    """One tenant of the pool (docs/manifest.md, "tenants"): its vLLM instances, its quotas and its
    fair share (weight) of the shared KV area under pressure."""

    name: str
    instances: list[str]  # "HOST" (every instance on it) or "HOST:N" (its instance N, from 0)
    weight: Int = 1
    quotas: TenantQuotas = TenantQuotas()

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _TENANT_NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a tenant name: 1 to 63 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: int) -> int:
        if not 1 <= value <= 1000:
            raise ValueError(
                "a weight is a whole number from 1 to 1000 (its share of the area is weight / sum of weights)"
            )
        return value


class Manifest(Strict):
    version: int
    name: str
    pool: Pool
    layout: Layout = Layout()
    hosts: list[Host]
    tuning: Tuning = Tuning()
    caching: Caching = Caching()
    serve: Serve | None = None
    tenants: list[Tenant] = []  # none: one implicit tenant owns everything (docs/manifest.md, "tenants")

    def tenant_plan(self, layout: Any) -> tuple[list[dict[str, Any]], dict[int, str]]:
        """The tenants as the metadata server takes them, and ring -> tenant (model/tenants.py)."""
        from belugactl.model.tenants import tenant_plan

        return tenant_plan(self, layout)

    @model_validator(mode="before")
    @classmethod
    def _default_journal(cls, data: Any) -> Any:
        """No layout.metadata.journal: one that covers the pool at min_block (model/journal_sizing.py)."""
        from belugactl.model.journal_sizing import DEFAULT_MIN_BLOCK, default_journal, namespace_bytes

        try:
            layout = data.get("layout") or {}
            metadata = layout.get("metadata") or {}
            if "journal" in metadata:
                return data
            pool = data["pool"]
            min_block = parse_size(metadata.get("min_block") or DEFAULT_MIN_BLOCK)
            tp = int(((data.get("serve") or {}).get("vllm") or {}).get("gpus_per_instance", 1))
            journal = default_journal(
                parse_size(pool["size"]),
                min_block,
                namespace_bytes(str(data["name"]), tp),
                parse_size(pool.get("align") or 2 * MiB),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return data  # the schema's own validation reports what is wrong
        if journal == 4 * MiB:
            return data
        return {**data, "layout": {**layout, "metadata": {**metadata, "journal": journal}}}

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value not in SUPPORTED_VERSIONS:
            supported = ", ".join(map(str, SUPPORTED_VERSIONS))
            raise ValueError(f"unknown manifest version {value!r}; this belugactl reads version {supported}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _HOST_NAME_RE.fullmatch(value) or len(value) > 63:
            raise ValueError("a rack name is 1 to 63 characters of letters, digits, '.', '_' or '-'")
        return value

    # -- convenient views used by layout, plan and serve ------------------------------------
    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    def metadata_host(self) -> Host | None:
        found = [h for h in self.hosts if "metadata" in h.roles]
        return found[0] if len(found) == 1 else None

    def slot_of(self, host: Host) -> int:
        """A host's partition slot with layout.capacity: `slot`, else its place in the host list."""
        return host.slot if host.slot is not None else self.hosts.index(host)

    def instances_on(self, host: Host) -> int:
        """vLLM instances (CXL-RPC clients) a host runs: workers only."""
        if "worker" not in host.roles:
            return 0
        if host.instances is not None:
            return host.instances
        return self.serve.vllm.instances_per_host if self.serve is not None else 1

    def zero_on_free(self) -> bool:
        """Whether the metadata server zeroes freed blocks: the manifest's serve.metadata.zero_on_free,
        else on when the rack runs more than one vLLM instance (they share one pool)."""
        written = self.serve.metadata.zero_on_free if self.serve is not None else None
        if written is not None:
            return written
        return sum(self.instances_on(h) for h in self.hosts) > 1

    def metadata_transport_on(self, host: Host) -> Literal["cxl", "tcp"]:
        """How this host's vLLM processes reach the metadata server: its own setting, else the rack's."""
        if host.metadata_transport is not None:
            return host.metadata_transport
        return self.serve.metadata.transport if self.serve is not None else "cxl"

    def block_size_on(self, host: Host) -> int:
        if host.block_size is not None:
            return host.block_size
        sizes = self.serve.vllm.block_size if self.serve is not None else BlockSize()
        return sizes.gpu if host.platform == "gpu" else sizes.cpu

    def tuning_for(self, host: Host) -> Tuning:
        if host.tuning is None:
            return self.tuning
        return Tuning(
            hugepages=host.tuning.hugepages if host.tuning.hugepages is not None else self.tuning.hugepages,
            thp=host.tuning.thp if host.tuning.thp is not None else self.tuning.thp,
        )
