"""Rules that relate several parts of a manifest, each reported against the field it is about."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from belugactl.model.manifest_schema import GPU_BLOCK_SIZES, MAX_HOSTS, Manifest, MemdevPick, RegionSource
from belugactl.model.manifest_yaml import Path_
from belugactl.units import format_size


@dataclass
class RuleProblem:
    path: Path_
    message: str
    hint: str | None = None
    at_key: bool = False  # point at the key rather than its value (e.g. a whole list is wrong)


def check_rules(m: Manifest) -> list[RuleProblem]:
    problems: list[RuleProblem] = []
    problems += _host_rules(m)
    problems += _address_rules(m)
    problems += _pool_rules(m)
    problems += _layout_rules(m)
    problems += _capacity_rules(m)
    problems += _serve_rules(m)
    problems += _tenant_rules(m)
    problems += etcd_candidate_problems(m)
    if not problems:
        problems += _fit_rules(m)
    return problems


def _host_rules(m: Manifest) -> list[RuleProblem]:
    out: list[RuleProblem] = []
    if not m.hosts:
        out.append(RuleProblem(("hosts",), "list at least one host", at_key=True))
        return out
    if len(m.hosts) > MAX_HOSTS:
        out.append(
            RuleProblem(
                ("hosts", MAX_HOSTS),
                f"{len(m.hosts)} hosts listed; one CXL switch domain holds at most {MAX_HOSTS}",
                "split the rack into one manifest per switch domain",
            )
        )
    seen_names: dict[str, int] = {}
    seen_addresses: dict[str, int] = {}
    for i, host in enumerate(m.hosts):
        if host.name in seen_names:
            out.append(
                RuleProblem(
                    ("hosts", i, "name"), f"host name {host.name!r} is already used by hosts[{seen_names[host.name]}]"
                )
            )
        else:
            seen_names[host.name] = i
        if host.address in seen_addresses:
            out.append(
                RuleProblem(
                    ("hosts", i, "address"),
                    f"address {host.address!r} is already used by hosts[{seen_addresses[host.address]}]",
                )
            )
        else:
            seen_addresses[host.address] = i
    reported: set[Path_] = set()
    for i, host in enumerate(m.hosts):
        tuning = m.tuning_for(host)
        nodes = host.numa.cpu_nodes + host.numa.cxl_nodes
        if tuning.hugepages is not None:
            for node in tuning.hugepages.per_node:
                if node >= nodes:
                    where = ("hosts", i, "tuning", "hugepages", "per_node", node)
                    if host.tuning is None or host.tuning.hugepages is None:
                        where = ("tuning", "hugepages", "per_node", node)
                    if where in reported:
                        continue
                    reported.add(where)
                    out.append(
                        RuleProblem(
                            where,
                            f"NUMA node {node} does not exist on {host.name}, which lists {nodes} node(s)",
                            "node ids run from 0 to cpu_nodes + cxl_nodes - 1",
                            at_key=True,
                        )
                    )
    metadata = [i for i, h in enumerate(m.hosts) if "metadata" in h.roles]
    if not metadata:
        out.append(
            RuleProblem(
                ("hosts",),
                "no host has the metadata role; exactly one must",
                "add `metadata` to one host's roles",
                at_key=True,
            )
        )
    for i in metadata[1:]:
        out.append(
            RuleProblem(
                ("hosts", i, "roles"),
                f"a second metadata host (hosts[{metadata[0]}] already has the role); "
                "exactly one host runs the metadata server",
            )
        )
    return out


# An IPv6 scope id names an interface (or is its index): what `ip link` allows, minus '/' and ':',
# and at most IFNAMSIZ - 1 bytes. Anything else (spaces, quotes, newlines) would end up in
# HAProxy's config, vLLM's argv and URLs, where it splits a line or a word.
_SCOPE_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,15}")


def address_problem(value: str) -> str | None:
    """Why `value` (an address or bind from the manifest) cannot be written into configs and URLs."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        ip = None  # a DNS name: the schema allows letters, digits, '-' and '.' only
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None and not _SCOPE_ID_RE.fullmatch(ip.scope_id):
        return f"the scope id {ip.scope_id!r} of {value!r} is not an interface name"
    if any(c.isspace() or not c.isprintable() for c in value):
        return f"address {value!r} holds a space or a control character"
    return None


def _address_rules(m: Manifest) -> list[RuleProblem]:
    hint = "a scope id is an interface name (letters, digits, '_', '.', '-'; at most 15), e.g. fe80::1%eth0"
    fields: list[tuple[Path_, str]] = [(("hosts", i, "address"), h.address) for i, h in enumerate(m.hosts)]
    if m.serve is not None:
        fields += [
            (("serve", "metadata", "admin_bind"), m.serve.metadata.admin_bind),
            (("serve", "metadata", "rpc_bind"), m.serve.metadata.rpc_bind),
        ]
        if m.serve.router is not None and m.serve.router.bind != "address":
            fields.append((("serve", "router", "bind"), m.serve.router.bind))
    return [RuleProblem(path, why, hint) for path, value in fields if (why := address_problem(value)) is not None]


def _pool_rules(m: Manifest) -> list[RuleProblem]:
    out: list[RuleProblem] = []
    pool = m.pool
    if pool.size % pool.align:
        out.append(
            RuleProblem(
                ("pool", "size"),
                f"{format_size(pool.size)} is not a multiple of the devdax align {format_size(pool.align)}",
                "use the dax device's size as `daxctl list` reports it",
            )
        )
    il = pool.interleave
    if isinstance(pool.source, RegionSource):
        if pool.source.region_size is not None and pool.source.region_size < pool.size:
            out.append(
                RuleProblem(
                    ("pool", "source", "region_size"),
                    f"region {format_size(pool.source.region_size)} is smaller than the usable pool size "
                    f"{format_size(pool.size)}",
                )
            )
        if il.mode == "hardware" and isinstance(pool.source.memdevs, list) and len(pool.source.memdevs) != il.ways:
            out.append(
                RuleProblem(
                    ("pool", "interleave", "ways"),
                    f"{il.ways} interleave ways but {len(pool.source.memdevs)} memdevs listed; a region interleaves "
                    "across exactly its memdevs",
                )
            )
        count = pool.source.memdevs.count if isinstance(pool.source.memdevs, MemdevPick) else None
        if il.mode == "hardware" and count is not None and count != il.ways:
            ways_written = "interleave" in pool.model_fields_set and "ways" in il.model_fields_set
            ways = f"{il.ways} interleave way{'s' if il.ways != 1 else ''}{'' if ways_written else ' (the default)'}"
            out.append(
                RuleProblem(
                    # the default of 1 way is nowhere in the file: point at the count instead
                    ("pool", "interleave", "ways") if ways_written else ("pool", "source", "memdevs", "count"),
                    f"{ways} but memdevs.count is {count}; a region interleaves across exactly its memdevs",
                    f"set pool.interleave.ways: {count}, or memdevs.count: {il.ways}",
                )
            )
    elif il.mode == "hardware" and il.ways != 1:
        out.append(
            RuleProblem(
                ("pool", "interleave", "mode"),
                "an existing dax device's hardware interleave was set by firmware; describe only software interleave",
                "use mode: software, or drop the interleave block",
            )
        )
    if il.mode == "software":
        granularity = il.granularity if il.granularity is not None else pool.align
        if granularity % pool.align:
            out.append(
                RuleProblem(
                    ("pool", "interleave", "granularity"),
                    f"software interleave granularity must be a multiple of the devdax align {format_size(pool.align)}",
                )
            )
        elif pool.size % (il.ways * granularity):
            out.append(
                RuleProblem(
                    ("pool", "size"),
                    f"{format_size(pool.size)} does not split into {il.ways} equal devices of whole "
                    f"{format_size(granularity)} stripes",
                )
            )
    return out


def _layout_rules(m: Manifest) -> list[RuleProblem]:
    out: list[RuleProblem] = []
    align = m.pool.align
    lay = m.layout

    def aligned(path: Path_, value: int, what: str) -> None:
        if value <= 0:
            out.append(RuleProblem(path, f"{what} must be larger than zero"))
        elif value % align:
            out.append(
                RuleProblem(
                    path,
                    f"{what} {format_size(value)} is not a multiple of the devdax align {format_size(align)}",
                    f"use {format_size((value + align - 1) // align * align)}",
                )
            )

    aligned(("layout", "header"), lay.header, "the header region")
    aligned(("layout", "metadata", "journal"), lay.metadata.journal, "the journal")
    if isinstance(lay.shared_kv, int):
        aligned(("layout", "shared_kv"), lay.shared_kv, "the shared KV area")
    if isinstance(lay.partition_size, int):
        aligned(("layout", "partition_size"), lay.partition_size, "a partition")
    for i, host in enumerate(m.hosts):
        if host.partition_size is not None:
            aligned(("hosts", i, "partition_size"), host.partition_size, "a partition")
    if lay.shared_kv == "rest" and lay.partition_size == "equal" and any(h.partition_size is None for h in m.hosts):
        out.append(
            RuleProblem(
                ("layout", "shared_kv"),
                "shared_kv is 'rest' and partition_size is 'equal': only one of them can take what remains",
                "give shared_kv or partition_size (or every host's partition_size) a size",
            )
        )
    return out


def _capacity_rules(m: Manifest) -> list[RuleProblem]:
    """layout.capacity: every host in a slot of its own, every host's processes within its rings."""
    from belugactl.model.layout import instance_processes

    cap = m.layout.capacity
    out: list[RuleProblem] = []
    if cap is None:
        out += [
            RuleProblem(("hosts", i, "slot"), "a slot needs layout.capacity", "add layout.capacity or remove slot")
            for i, h in enumerate(m.hosts)
            if h.slot is not None
        ]
        return out
    if len(m.hosts) > cap.hosts:
        out.append(RuleProblem(("layout", "capacity", "hosts"), f"{len(m.hosts)} hosts do not fit {cap.hosts} slots",
                               "raise capacity.hosts (a new layout: setup --force) or remove hosts"))
    if m.layout.partition_size == "equal":
        out.append(RuleProblem(("layout", "partition_size"), "with layout.capacity partitions are one size per slot",
                               "give partition_size a size (or leave it out: one pool.align unit per slot)"))
    taken: dict[int, str] = {}
    for i, host in enumerate(m.hosts):
        if host.partition_size is not None:
            out.append(RuleProblem(("hosts", i, "partition_size"), "with layout.capacity every slot has the layout's "
                                   "partition_size", "remove it here; set layout.partition_size"))
        slot = m.slot_of(host)
        if not 0 <= slot < cap.hosts:
            out.append(RuleProblem(("hosts", i, "slot"), f"slot {slot} is outside capacity.hosts ({cap.hosts})",
                                   f"use a slot from 0 to {cap.hosts - 1}"))
        elif slot in taken:
            out.append(RuleProblem(("hosts", i, "slot"), f"slot {slot} is already {taken[slot]}'s",
                                   "give each host a slot of its own (a host without `slot` takes its place in the "
                                   "list)"))
        else:
            taken[slot] = host.name
        need = m.instances_on(host) * len(instance_processes(m, host))
        if need > cap.rings_per_host:
            out.append(RuleProblem(("hosts", i), f"{host.name} runs {need} vLLM processes (instances x (scheduler + "
                                   f"workers)), more than capacity.rings_per_host ({cap.rings_per_host})",
                                   "run fewer instances or workers here, or raise capacity.rings_per_host (a new "
                                   "layout: setup --force)"))
    return out


def _serve_rules(m: Manifest) -> list[RuleProblem]:
    out: list[RuleProblem] = []
    if m.serve is None:
        return out
    vllm = m.serve.vllm
    md = m.serve.metadata
    if md.host is not None:
        names = m.host_names()
        if md.host not in names:
            out.append(
                RuleProblem(("serve", "metadata", "host"), f"{md.host!r} is not one of the hosts: {', '.join(names)}")
            )
        elif "metadata" not in m.host(md.host).roles:
            out.append(RuleProblem(("serve", "metadata", "host"), f"host {md.host!r} does not have the metadata role"))
    if md.admin_port == md.rpc_port:
        out.append(RuleProblem(("serve", "metadata", "rpc_port"), "the RPC port and the admin port must differ"))
    if not any("worker" in h.roles for h in m.hosts):
        out.append(RuleProblem(("hosts",), "no host has the worker role; nothing would run vLLM", at_key=True))
    out += _disaggregation_rules(m)
    out += _process_count_rules(m)
    meta_host = m.metadata_host()
    for i, host in enumerate(m.hosts):
        instances = m.instances_on(host)
        if host.instances is not None and not 0 <= host.instances <= 64:
            out.append(RuleProblem(("hosts", i, "instances"), "instances is between 0 and 64"))
            continue
        if host.block_size is not None:
            if host.platform == "cpu" and (host.block_size <= 0 or host.block_size % 32):
                out.append(
                    RuleProblem(
                        ("hosts", i, "block_size"), "vLLM's CPU backend needs a block size that is a multiple of 32"
                    )
                )
            if host.platform == "gpu" and host.block_size not in GPU_BLOCK_SIZES:
                out.append(
                    RuleProblem(
                        ("hosts", i, "block_size"),
                        f"on GPUs vLLM's block size is one of {', '.join(map(str, GPU_BLOCK_SIZES))}",
                    )
                )
        if host.platform == "gpu" and instances:
            needed = instances * vllm.gpus_per_instance
            if needed > host.gpus.count:
                out.append(
                    RuleProblem(
                        ("hosts", i, "gpus", "count") if host.gpus.count else ("hosts", i, "name"),
                        f"{instances} instance(s) x {vllm.gpus_per_instance} GPU(s) need {needed} GPUs; "
                        f"host {host.name} lists {host.gpus.count}",
                        "lower serve.vllm.instances_per_host (or this host's instances), or use platform: cpu",
                    )
                )
        last_port = vllm.port_base + instances - 1
        if instances and last_port > 65535:
            out.append(RuleProblem(("serve", "vllm", "port_base"), f"host {host.name} would need port {last_port}"))
        elif host is meta_host and instances and vllm.port_base <= md.admin_port <= last_port:
            out.append(
                RuleProblem(
                    ("serve", "metadata", "admin_port"),
                    f"port {md.admin_port} collides with vLLM ports {vllm.port_base}-{last_port} on {host.name}",
                )
            )
        elif host is meta_host and instances and vllm.port_base <= md.rpc_port <= last_port:
            out.append(
                RuleProblem(
                    ("serve", "metadata", "rpc_port"),
                    f"port {md.rpc_port} collides with vLLM ports {vllm.port_base}-{last_port} on {host.name}",
                )
            )
    return out


def _disaggregation_rules(m: Manifest) -> list[RuleProblem]:
    """Prefill/decode roles must leave the rack able to answer: some instance that prefills and saves,
    some that loads and decodes, and a front door that sends each request through both."""
    assert m.serve is not None
    vllm = m.serve.vllm
    if not vllm.disaggregated:
        return []
    out: list[RuleProblem] = []
    at = ("serve", "vllm", "kv_roles")
    most = max((m.instances_on(h) for h in m.hosts if "worker" in h.roles), default=0)
    if len(vllm.kv_roles) > most:
        out.append(
            RuleProblem(
                (*at, most) if most else at,
                f"{len(vllm.kv_roles)} roles listed, but no host runs more than {most} instance(s)",
                "list one role per instance (instance i of every host takes kv_roles[i])",
            )
        )
    roles = {vllm.kv_role(i) for h in m.hosts if "worker" in h.roles for i in range(m.instances_on(h))}
    for needed, does in (("kv_producer", "prefills and saves"), ("kv_consumer", "loads and decodes")):
        if needed not in roles and "kv_both" not in roles:
            out.append(
                RuleProblem(
                    at,
                    f"no instance is {needed} (or kv_both): nothing {does}",
                    "give at least one instance each of kv_producer and kv_consumer",
                    at_key=True,
                )
            )
    if m.serve.router is None:
        out.append(
            RuleProblem(
                at,
                "prefill/decode roles need the front door: a request must go to a producer, then to a consumer",
                'add serve.router (docs/serving.md, "Prefill/decode disaggregation")',
                at_key=True,
            )
        )
    return out


def _process_count_rules(m: Manifest) -> list[RuleProblem]:
    """extra_args that would run more vLLM processes than the layout allots CXL-RPC rings for."""
    from belugactl.model.layout import workers_per_instance
    from belugactl.model.vllm_args import PROCESS_COUNT_FLAGS, parallel_args

    assert m.serve is not None
    out: list[RuleProblem] = []
    for arg in parallel_args(m.serve.vllm.extra_args):
        where = ("serve", "vllm", "extra_args", arg.value_index)
        if arg.value is None or arg.value < 1:
            out.append(RuleProblem(where, f"{arg.flag} needs a positive integer"))
            continue
        if arg.flag == "--tensor-parallel-size":
            wrong = [(h, n) for h in m.hosts if m.instances_on(h) and (n := workers_per_instance(m, h)) != arg.value]
            if wrong:
                host, n = wrong[0]
                fix = (
                    f"remove {arg.flag} from extra_args and set serve.vllm.gpus_per_instance: {arg.value} "
                    "(serve passes --tensor-parallel-size itself)"
                    if host.platform == "gpu"
                    else f"remove {arg.flag} from extra_args: serve runs one worker per instance on a CPU host "
                    "(raise the instance count for more)"
                )
                out.append(
                    RuleProblem(
                        ("serve", "vllm", "extra_args", arg.index),
                        f"{arg.flag} {arg.value} would run {arg.value} workers per instance, but the pool layout "
                        f"allots CXL-RPC rings for {n} on {host.name} (a ring per vLLM process, counted from "
                        "serve.vllm.gpus_per_instance on GPU hosts, one worker on CPU hosts)",
                        fix,
                    )
                )
        elif arg.value > 1:
            out.append(
                RuleProblem(
                    ("serve", "vllm", "extra_args", arg.index),
                    f"{arg.flag} {arg.value} multiplies an instance's {PROCESS_COUNT_FLAGS[arg.flag]}; the pool "
                    "layout allots CXL-RPC rings for one scheduler and gpus_per_instance workers per instance, so "
                    "processes would share a ring",
                    "remove it from extra_args: for more replicas raise serve.vllm.instances_per_host (every "
                    "instance gets its own rings); pipeline and context parallelism are not supported with the "
                    "Beluga connector",
                )
            )
    return out


def _fit_rules(m: Manifest) -> list[RuleProblem]:
    """Resolve the layout; a layout that does not fit is reported against the field to change."""
    from belugactl.model.layout import LayoutDoesNotFit, resolve_layout

    try:
        layout = resolve_layout(m)
    except LayoutDoesNotFit as exc:
        return [RuleProblem(exc.path, exc.message, exc.hint)]
    return _journal_rules(m, layout.shared_kv.size, layout.journal.size)


def _journal_rules(m: Manifest, kv_bytes: int, journal: int) -> list[RuleProblem]:
    """The journal covers a full shared KV area of the smallest blocks (model/journal_sizing.py)."""
    from belugactl.model.journal_sizing import (
        DEFAULT_MIN_BLOCK,
        blocks_covered,
        covering_min_block,
        journal_bytes,
        namespace_bytes,
    )

    md = m.layout.metadata
    min_block = md.min_block or DEFAULT_MIN_BLOCK
    tp = m.serve.vllm.gpus_per_instance if m.serve is not None else 1
    ns = namespace_bytes(m.name, tp)
    need = journal_bytes(kv_bytes, min_block, ns)
    if journal >= need:
        return []
    align = m.pool.align
    fix = f"use journal: {format_size(-(-need // align) * align)}"
    block = covering_min_block(journal, kv_bytes, ns)
    if block is not None:
        fix += f", or, if no KV block is ever smaller, min_block: {format_size(block)}"
    return [
        RuleProblem(
            ("layout", "metadata", "journal"),
            f"the journal ({format_size(journal)}) holds {blocks_covered(journal, ns):,} blocks, but the shared KV "
            f"area ({format_size(kv_bytes)}) holds {kv_bytes // min_block:,} blocks of min_block "
            f"{format_size(min_block)}: "
            "a full pool would stop journaling (and the next restart would start empty)",
            fix,
        )
    ]


def _tenant_rules(m: Manifest) -> list[RuleProblem]:
    """tenants: unique names, selectors naming real instances, each instance in exactly one (model/tenants.py)."""
    from belugactl.model.tenants import tenant_problems

    return [RuleProblem(path, msg, hint, at_key=path == ("tenants",)) for path, msg, hint in tenant_problems(m)]


def etcd_candidate_problems(m: Manifest) -> list[RuleProblem]:
    """serve.metadata.etcd.candidates that are not hosts of the manifest, or named twice (serve runs a
    metadata server on each candidate host, `--member HOST`): `manifest check` refuses them, and so does
    serve (workflows/serve/launch_plan.py) for a manifest it was handed already loaded."""
    conf = m.serve.metadata.etcd if m.serve is not None else None
    if conf is None:
        return []
    names = m.host_names()
    out: list[RuleProblem] = []
    if m.serve is not None and m.serve.metadata.restart_policy == "start-empty":
        out.append(
            RuleProblem(
                ("serve", "metadata", "restart_policy"),
                "start-empty with etcd: a standby takes over with the index the journal keeps",
                "drop restart_policy (journal is implied with etcd), or drop serve.metadata.etcd",
            )
        )
    seen: set[str] = set()
    for i, name in enumerate(conf.candidates):
        path: Path_ = ("serve", "metadata", "etcd", "candidates", i)
        if name not in names:
            out.append(
                RuleProblem(path, f"{name!r} is not one of the hosts: {', '.join(names)}", "list hosts[].name values")
            )
        elif name in seen:
            out.append(RuleProblem(path, f"{name!r} is listed twice"))
        seen.add(name)
    return out
