"""`belugactl discover`: what this host has, as tables or one JSON document; `--capture` packs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    @app.command("discover")
    def discover_command(
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout (stable keys)."),
        root: Path | None = typer.Option(
            None,
            "--root",
            metavar="DIR|FILE.tar.gz",
            help="Read a captured or fixture host instead of this machine: a directory or a FILE.tar.gz.",
        ),
        capture: str | None = typer.Option(
            None,
            "--capture",
            metavar="FILE.tar.gz|DIR",
            help="Also write everything read (sysfs/procfs files, tool outputs) to FILE.tar.gz "
            "(or a new or empty directory, whose parent exists): a support bundle that --root reads back.",
        ),
    ) -> None:
        """Show the host's CXL memdevs, decoders, regions, dax devices, NUMA nodes, hugepages, THP,
        PCI root ports and GPUs, CPU and kernel facts. Reads only; changes nothing."""
        import contextlib
        import sys

        from belugactl.cli.render import print_json
        from belugactl.host.capture import open_root
        from belugactl.host.host import Host
        from belugactl.workflows.discover import capture as capture_host
        from belugactl.workflows.discover import discover

        if capture is not None:
            check_capture_target(capture)
        with open_root(root) if root is not None else contextlib.nullcontext(Host.local()) as host:
            if capture is not None:
                result = capture_host(host, capture)
                snapshot = result.snapshot
                print(
                    f"captured {result.files} files, {result.links} links and {result.commands} command outputs "
                    f"to {result.path}; read it back with `belugactl discover --root {result.path}`",
                    file=sys.stderr,
                )
            else:
                snapshot = discover(host)
        if root is not None:
            import dataclasses

            # A bundle is unpacked into a temporary directory; name what the operator gave instead.
            snapshot = dataclasses.replace(snapshot, root=str(root))
        if as_json:
            print_json(snapshot.to_dict())
        else:
            render_snapshot(snapshot)


def check_capture_target(value: str) -> None:
    """Refuse a bundle path before anything is read or written (the output-path rule, cli/output_path.py)."""
    from belugactl.cli.output_path import new_directory, output_file
    from belugactl.host.capture import bundle_is_tarball

    if bundle_is_tarball(Path(value).name):
        output_file(value, option="--capture", stdout_ok=False)
    else:
        new_directory(value, option="--capture")


# --- human output ---------------------------------------------------------------------------


def _size(n: int | None) -> str:
    from belugactl.units import format_size

    return format_size(n) if n is not None else "?"


def _hex(n: int | None) -> str:
    return f"{n:#x}" if n is not None else "?"


def _opt(value: Any) -> str:
    return "?" if value is None else str(value)


def compact_list(values: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> "0-3,8" (the kernel's own list format)."""
    if not values:
        return "-"
    values = sorted(values)
    parts = []
    start = prev = values[0]
    for v in values[1:] + [None]:  # type: ignore[list-item]
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if v is not None:
            start = prev = v
    return ",".join(parts)


def render_snapshot(snap: Any) -> None:
    from rich.table import Table
    from rich.text import Text
    from rich.tree import Tree

    from belugactl.cli.render import stdout_console

    # Markup and emoji off: device names such as 0000:ab:00.0 or "[none]" must print as they are.
    console = stdout_console(markup=False)  # wide when piped, cells fold: never `0x1000000…`

    def heading(text: str, rest: str = "") -> Text:
        return Text.assemble((text, "bold"), rest)

    cpu, kernel = snap.cpu, snap.kernel
    where = "" if snap.root == "/" else f"  (from {snap.root})"
    console.print(heading(snap.hostname or "host", where))
    console.print(
        f"  CPU: {cpu.vendor or '?'} {cpu.model_name or ''} (family {_opt(cpu.family)}, model "
        f"{_hex(cpu.model) if cpu.model is not None else '?'}), {_opt(cpu.sockets)} socket(s), {_opt(cpu.cpus)} CPUs"
    )
    console.print(
        f"  kernel {kernel.release or '?'}, lockdown {kernel.lockdown or 'not available'}"
        f"{', in a container' if kernel.in_container else ''}; udev database: {'yes' if snap.udev_db else 'no'}"
    )

    tools = Table(title="Tools", title_justify="left", box=None, pad_edge=False)
    for col in ("tool", "version", "path"):
        tools.add_column(col)
    for tool in snap.tools.values():
        tools.add_row(tool.name, tool.version or ("error" if tool.error else "-"), tool.path or "not installed")
    console.print(tools)

    cxl = snap.cxl
    if not cxl.bus_present and not cxl.memdevs:
        console.print(
            heading("CXL", ": none on this host (/sys/bus/cxl is absent: no CXL hardware or cxl_core not loaded)")
        )
    else:
        tree = Tree(heading("CXL", f" (from {cxl.source or '?'})"))
        mem = tree.add(f"memdevs ({len(cxl.memdevs)})")
        for m in cxl.memdevs:
            mem.add(
                f"{m.name}: pmem {_size(m.pmem_size)}, ram {_size(m.ram_size)}, adapter {m.host_bdf or '?'} "
                f"under root port {m.root_port or '?'}"
                + (f" behind switch {m.switch}" if m.switch else "")
                + f", numa {_opt(m.numa_node)}, serial {_hex(m.serial)}, {m.state}"
            )
        dec = tree.add(f"root decoders ({len(cxl.root_decoders)})")
        for d in cxl.root_decoders:
            caps = ",".join(c for c, on in (("pmem", d.pmem_capable), ("ram", d.volatile_capable)) if on) or "none"
            dec.add(
                f"{d.name}: {_size(d.size)} at {_hex(d.resource)}, capable: {caps}, free extent "
                f"{_size(d.max_available_extent)}, ways {_opt(d.interleave_ways)}"
                + (f", region {d.region}" if d.region else "")
            )
        reg = tree.add(f"regions ({len(cxl.regions)})")
        for r in cxl.regions:
            reg.add(
                f"{r.name}: {r.type or '?'} {_size(r.size)} at {_hex(r.resource)}, {r.interleave_ways}-way "
                f"x {_opt(r.interleave_granularity)} B, {r.decode_state or '?'}, memdevs {','.join(r.memdevs) or '?'}"
            )
        console.print(tree)

    if snap.nd.namespaces:
        ns = Table(title="Namespaces (ndctl)", title_justify="left", box=None, pad_edge=False)
        for col in ("namespace", "region", "mode", "map", "size", "align", "dax", "name", "uuid"):
            ns.add_column(col)
        for n in snap.nd.namespaces:
            ns.add_row(
                n.dev,
                _opt(n.region),
                _opt(n.mode),
                _opt(n.map),
                _size(n.size),
                _size(n.align),
                n.chardev or "-",
                n.name or "-",
                n.uuid or "-",
            )
        console.print(ns)

    if snap.dax:
        dax = Table(title="Device-dax", title_justify="left", box=None, pad_edge=False)
        for col in ("device", "mode", "size", "align", "target node", "numa node", "resource", "/dev node"):
            dax.add_column(col)
        for d in snap.dax:
            mode = oct(d.dev_mode) if d.dev_mode is not None else "?"
            node = f"{d.dev_owner or d.dev_uid}:{d.dev_group or d.dev_gid} {mode}" if d.dev_exists else "missing"
            dax.add_row(
                d.name,
                _opt(d.mode),
                _size(d.size),
                _size(d.align),
                _opt(d.target_node),
                _opt(d.numa_node),
                _hex(d.resource),
                node,
            )
        console.print(dax)
    else:
        console.print(heading("Device-dax", ": none"))

    numa = Table(title="NUMA nodes", title_justify="left", box=None, pad_edge=False)
    for col in ("node", "cpus", "memory", "free", "hugepages (total/free)"):
        numa.add_column(col)
    for n in snap.numa:
        pages = ", ".join(f"{_size(size)}: {_opt(c.total)}/{_opt(c.free)}" for size, c in sorted(n.hugepages.items()))
        numa.add_row(
            str(n.id),
            compact_list(n.cpus) if n.cpus else "none (memory only)",
            _size(n.mem_total),
            _size(n.mem_free),
            pages or "-",
        )
    console.print(numa)
    console.print(
        f"  THP enabled={snap.thp.enabled or '?'} defrag={snap.thp.defrag or '?'}; memory auto-online: "
        f"{snap.memory.auto_online_blocks or '?'}, block size {_size(snap.memory.memory_block_size)}"
    )

    devices = [d for d in snap.pci if d.kind in ("gpu", "cxl")]
    if devices:
        pci = Table(title="GPUs and CXL adapters", title_justify="left", box=None, pad_edge=False)
        for col in ("device", "kind", "vendor:device", "numa", "root port", "link", "driver"):
            pci.add_column(col)
        for d in devices:
            link = f"{d.link_speed or '?'} x{_opt(d.link_width)}" if d.link_speed or d.link_width else "-"
            pci.add_row(
                d.bdf,
                d.kind,
                f"{d.vendor or 0:04x}:{d.device or 0:04x}",
                _opt(d.numa_node),
                d.root_port or "-",
                link,
                d.driver or "-",
            )
        console.print(pci)
    else:
        console.print(heading("GPUs and CXL adapters", ": none on PCI"))
    if snap.root_ports:
        ports = Table(title="Root ports above them", title_justify="left", box=None, pad_edge=False)
        for col in ("root port", "vendor:device", "perfctrlsts_0 (0x180)", "byte 0x185", "below"):
            ports.add_column(col)
        for p in snap.root_ports:
            ports.add_row(
                p.bdf,
                f"{p.vendor or 0:04x}:{p.device or 0:04x}",
                _hex(p.perfctrlsts_0) if p.config_readable else "not readable",
                _hex(p.perfctrlsts_1) if p.config_readable else "-",
                ", ".join(p.devices),
            )
        console.print(ports)

    if snap.mtrr is None:
        console.print(heading("MTRR", ": /proc/mtrr absent"))
    else:
        console.print(heading("MTRR", f": {len(snap.mtrr)} variable range(s) in use"))
        for m in snap.mtrr:
            console.print(f"  reg{m.reg:02d}: {_size(m.size)} at {_hex(m.base)} {m.type}")

    if snap.problems:
        console.print(Text(f"Could not read everything ({len(snap.problems)}):", style="yellow"))
        for problem in snap.problems:
            console.print(f"  ! {problem}")
