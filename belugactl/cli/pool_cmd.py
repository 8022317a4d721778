"""`belugactl pool show|inspect|create-file|members`: the manifest's pool map, the pool as it is on media, a
file pool, and a capacity pool's membership."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from belugactl.cli.options import file_option, json_option

BAR_WIDTH = 72


def register(app: typer.Typer) -> None:
    pool = typer.Typer(help="The shared pool's layout.", no_args_is_help=True)

    @pool.command("show")
    def show(
        file: Path = file_option(),
        as_json: bool = json_option(),
        svg_arg: str | None = typer.Option(
            None, "--svg", metavar="FILE", help="Also write the map as a standalone SVG file (its directory exists)."
        ),
    ) -> None:
        """Print the pool map derived from FILE: every region's offset, end, size and owner."""
        from belugactl.cli.load_rack import rack_context
        from belugactl.cli.output_path import output_file, write_output

        svg = output_file(svg_arg, option="--svg", stdout_ok=False) if svg_arg is not None else None
        rack = rack_context(file, as_json=as_json)
        m, layout = rack.manifest, rack.layout
        if svg is not None:
            from belugactl.workflows.pool_svg import render_svg

            write_output(svg, render_svg(layout, title=f"belugactl pool map: {m.name}"))
        if as_json:
            from belugactl.cli.render import print_json

            document: dict[str, Any] = {"rack": m.name, **layout.to_dict()}
            if m.tenants:
                from belugactl.model.tenants import tenant_rows

                document["tenants"] = tenant_rows(m, layout)
            if svg is not None:
                document["svg"] = str(svg)
            print_json(document)
            return
        from belugactl.cli.render import stderr_console, stdout_console

        console = stdout_console()
        render_layout_table(console, layout, title=f"pool map: {m.name} (layout {layout.layout_hash[:12]})")
        render_ring_owners(console, layout)
        render_tenants(console, m, layout)
        if svg is not None:
            stderr_console().print(f"wrote {svg}")

    @pool.command("create-file")
    def create_file(
        path: Path = typer.Argument(
            ..., metavar="PATH", help="The pool file to create (sparse, the manifest's pool size)."
        ),
        file: Path = file_option(),
        exist_ok: bool = typer.Option(False, "--exist-ok", help="Keep an existing pool file whose header matches."),
        yes: bool = typer.Option(
            False, "--yes", help="Create the pool even when it is larger than its file system's free space."
        ),
        as_json: bool = json_option(),
    ) -> None:
        """Create a file-backed pool with a valid header, for development, CI and benchmarks.

        The file is created new (never through a symlink) with mode 0600, or the manifest's
        pool.permissions.mode. Put it in a directory only you can write, not a shared /tmp.
        """
        from belugactl.cli.load_rack import rack_context
        from belugactl.errors import UsageError
        from belugactl.pool.file_pool import create_file_pool
        from belugactl.pool.mapping import PoolMapping

        rack = rack_context(file)
        manifest = rack.manifest
        if path.is_symlink():
            raise UsageError(
                f"{path} is a symbolic link; refusing to create or open a pool through it",
                why="a link at a pool path would send every tenant's KV bytes wherever it points",
                fix="remove the link, or pass a path in a directory only you can write",
            )
        if path.exists() and not exist_ok:
            raise UsageError(
                f"{path} already exists",
                why="creating a pool file over an existing one would discard its contents",
                fix="choose another path, remove it yourself, or pass --exist-ok to keep a matching pool",
            )
        if not path.exists():
            _check_free_space(path, rack.layout.pool_size, yes=yes)
        # An existing file is only ever verified here, never rewritten: a mismatch is an error (exit 2).
        created = path if path.exists() else create_file_pool(path, manifest)
        with PoolMapping.open(created, manifest, writable=False) as mapping:
            info = {"path": str(created), "size": mapping.size, "layout_hash": mapping.header.layout_hash}
        if as_json:
            from belugactl.cli.render import print_json

            print_json(info)
        else:
            from belugactl.units import format_size

            print(f"pool file {created}: {format_size(info['size'])}, layout {info['layout_hash'][:12]}")

    @pool.command("inspect")
    def inspect(
        path: Path = typer.Argument(
            ..., metavar="POOL", help="The pool: a devdax device (/dev/daxX.Y) or a pool file."
        ),
        file: Path | None = file_option(
            "The rack manifest (YAML): ring owners, and a check of the header against it.", required=False
        ),
        admin: str | None = typer.Option(
            None,
            "--admin",
            metavar="URL",
            help="The metadata server's admin URL (default: the manifest's, else 127.0.0.1:9470).",
        ),
        as_json: bool = json_option(),
    ) -> None:
        """What is on the pool now: header, epoch, claim word, hosts, rings, journal, shared-area usage.

        Read-only. `pool show` is the manifest's view of the same pool."""
        from belugactl.workflows.pool_inspect import inspect_pool

        manifest = None
        if file is not None:
            from belugactl.cli.load_rack import rack_context

            manifest = rack_context(file, as_json=as_json).manifest
            if not path.exists():  # the fix names this manifest's file (the inspection itself maps without it)
                from belugactl.pool.mapping import pool_missing

                raise pool_missing(path, manifest)
        doc = inspect_pool(path, manifest, admin_url=admin)
        if as_json:
            from belugactl.cli.render import print_json

            print_json(doc)
        else:
            from belugactl.cli.render import stdout_console

            render_inspection(stdout_console(), doc)
        # The header differs from the manifest: the pool is not the one this manifest describes.
        if doc["manifest"] is not None and not doc["manifest"]["matches"]:
            raise typer.Exit(code=1)

    @pool.command("members")
    def members_cmd(
        path: Path = typer.Argument(..., metavar="POOL", help="The pool file."),
        file: Path = file_option(),
        dry_run: bool = typer.Option(False, "--dry-run", help="Show the change; write nothing."),
        force: bool = typer.Option(False, "--force", help="Also move hosts whose partition slot changes."),
        as_json: bool = json_option(),
    ) -> None:
        """Record FILE's hosts in a pool file laid out with layout.capacity, in place: every cached
        block stays. (`belugactl setup` does this for a device pool.)"""
        from belugactl.cli.load_rack import rack_context
        from belugactl.workflows.pool_members import record_file_members

        rack = rack_context(file, as_json=as_json)
        outcome = record_file_members(path, rack, dry_run=dry_run, force=force)
        if as_json:
            from belugactl.cli.render import print_json

            print_json(outcome.to_dict())
            return
        if outcome.change is None:
            print(f"pool {path}: its membership is this manifest's already")
            return
        verb = "would record" if outcome.written is None else "recorded"
        version = outcome.change.version + 1
        print(f"pool {path}: {verb} membership version {version}, keeping every cached KV block:")
        for line in outcome.change.lines():
            print(f"  {line}")
        if outcome.written is None and outcome.change.moves_partitions and not force:
            print("  a host changes slot: recording it needs --force (or pin it with `slot: N`)")

    app.add_typer(pool, name="pool")


def _check_free_space(path: Path, size: int, *, yes: bool) -> None:
    """A sparse pool larger than the free space fails later, on a write (SIGBUS in a mapping): say so now."""
    import sys

    from belugactl.errors import UsageError
    from belugactl.pool.file_pool import free_bytes
    from belugactl.units import format_size

    directory = path.absolute().parent
    free = free_bytes(directory)
    if free is None or size <= free:
        return
    what = (
        f"the pool ({format_size(size)}) is larger than the free space on the file system of {directory} "
        f"({format_size(free)})"
    )
    if not yes:
        raise UsageError(
            what,
            why="the file is sparse: it is created, but writing KV blocks into it fails once the disk is full",
            fix="choose a file system with room (df -h), a manifest with a smaller pool, or pass --yes",
        )
    print(f"pool create-file: warning: {what}; creating it anyway (--yes)", file=sys.stderr)


def render_inspection(console: Any, doc: dict[str, Any]) -> None:
    from datetime import UTC, datetime

    from rich import box
    from rich.table import Table

    from belugactl.units import format_size

    def say(text: str) -> None:  # never wrapped or cut (piped output is 80 columns), no markup in names
        console.print(text, soft_wrap=True, markup=False)

    h = doc["header"]
    created = datetime.fromtimestamp(h["created_time"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    kind = "devdax" if doc["devdax"] else "file"
    say(f"pool {doc['path']} ({kind}, {format_size(doc['size'])})")
    say(f"  header      v{h['format_version']}, uuid {h['pool_uuid']}, written by {h['created_by']} {created}")
    against = doc["manifest"]
    verdict = ""
    if against is not None:
        n = len(against["differences"])
        rack = against["rack"]
        verdict = f" (matches {rack})" if against["matches"] else f" (DIFFERS from {rack}: {n} field(s))"
    say(f"  layout      {doc['layout_hash']}{verdict}")
    if "members_version" in h:  # a capacity layout: its host table is the membership
        say(f"  membership  version {h['members_version']}, written at epoch {h['members_epoch']}")
    for d in (against or {}).get("differences", [])[:12]:
        say(f"                {d['field']}: manifest {d['manifest']!r}, pool {d['pool']!r}")
    claim = doc["claim"]
    holder = f" ({claim['holder']})" if claim["holder"] else ""
    say(f"  epoch       {doc['epoch']}")
    say(f"  claim word  {claim['word']:#018x}{holder}")

    hosts = Table(title="hosts", title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (("#", "right"), ("host", "left"), ("offset", "right"), ("end", "right"), ("size", "right")):
        hosts.add_column(name, justify=justify, no_wrap=True)
    for e in doc["hosts"]:
        hosts.add_row(str(e["index"]), e["name"], f"{e['offset']:#x}", f"{e['end']:#x}", format_size(e["size"]))
    console.print(hosts)

    rings = Table(title="RPC rings (used)", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("ring", "owner", "last seq", "slot", "state", "epoch", "waiting"):
        rings.add_column(name, no_wrap=True, justify="left" if name in ("owner", "state") else "right")
    used = [r for r in doc["rings"] if r["used"]]
    for r in used:
        rings.add_row(
            str(r["ring"]),
            r["owner"] or "-",
            str(r["last_seq"]),
            str(r["last_slot"]),
            r["last_state"],
            str(r["last_epoch"]) + ("" if r["current_epoch"] else " (old)"),
            str(r["requests_waiting"]),
        )
    if used:
        console.print(rings)
    idle = len(doc["rings"]) - len(used)
    say(f"  rings       {len(doc['rings'])}, {len(used)} used, {idle} never used")
    if (doc.get("rings_summary") or {}).get("problem"):  # a header whose ring count is bounded, not read
        say(f"  rings       NOT ALL READ: {doc['rings_summary']['problem']}")

    j = doc["journal"]
    if j["state"] == "active":
        text = (
            f"active, generation {j['generation']}, half {j['active_half']}, "
            f"{format_size(j['bytes_used'])} of {format_size(j['half_size'])} used, "
            f"{j['commits']} commit(s), {j['removes']} removal(s)"
        )
    else:
        text = f"{j['state']}: {j['note']}"
    say(f"  journal     {text}")

    kv = doc["shared_kv"]
    say(f"  shared KV   {format_size(kv['size'])} at {kv['offset']:#x}")
    say(f"  metadata    {kv['server']} ({kv['admin_url']})")
    usage = kv.get("usage")
    if usage:
        cap = usage.get("bytes_capacity") or 0
        pct = f" ({100 * usage['bytes_used'] / cap:.1f}%)" if cap else ""
        say(
            f"  usage       used {format_size(usage.get('bytes_used') or 0)} of {format_size(cap)}{pct}, "
            f"{usage.get('entries')} entries, {usage.get('evictions')} evictions"
        )


def render_ring_owners(console: Any, layout: Any) -> None:
    """Who owns which CXL-RPC ring: one row per vLLM instance (its scheduler's and workers' rings),
    then the spare rings."""
    from rich import box
    from rich.table import Table

    table = Table(title="CXL-RPC rings (one per vLLM process)", title_justify="left", box=box.SIMPLE_HEAD)
    for name, justify in (("rings", "right"), ("host", "left"), ("instance", "left"), ("process: ring", "left")):
        table.add_column(name, justify=justify, no_wrap=name != "process: ring")
    rows: dict[tuple[str, int], list[Any]] = {}
    for client in layout.clients:
        rows.setdefault((client.host, client.instance), []).append(client)
    for (host, instance), clients in rows.items():
        first, last = clients[0].ring, clients[-1].ring
        span = str(first) if first == last else f"{first}-{last}"
        owned = ", ".join(f"{c.process}: {c.ring}" for c in clients)
        table.add_row(span, host, f"vllm-{instance}", owned)
    spare = layout.spare_rings
    if len(spare):
        span = str(spare[0]) if len(spare) == 1 else f"{spare[0]}-{spare[-1]}"
        table.add_row(span, "-", "-", f"spare ({len(spare)}): tools and probes")
    console.print(table)


def render_tenants(console: Any, manifest: Any, layout: Any) -> None:
    """Which tenant owns which instances and rings, with its weight and quotas (nothing without tenants)."""
    if not manifest.tenants:
        return
    from rich import box
    from rich.table import Table

    from belugactl.model.tenants import tenant_rows
    from belugactl.units import format_size

    table = Table(title="tenants (docs/manifest.md)", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("tenant", "weight", "instances", "rings", "quotas"):
        table.add_column(name, justify="right" if name == "weight" else "left")
    for row in tenant_rows(manifest, layout):
        quotas = ", ".join(
            f"{k} {format_size(v) if k.endswith('bytes') else v}" for k, v in row["quotas"].items() if v is not None
        )
        rings = row["rings"]
        table.add_row(
            row["name"], str(row["weight"]), ", ".join(row["instances"]),
            ", ".join(str(r) for r in rings) or "-", quotas or "no limits",
        )  # fmt: skip
    console.print(table)


def render_layout_table(console: Any, layout: Any, *, title: str) -> None:
    """A rich table of regions plus a proportional bar; shared with `manifest check`."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from belugactl.units import format_size
    from belugactl.workflows.pool_svg import proportional_widths, region_color

    regions = list(layout.regions())
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # The numbers never wrap (an address cut in two misleads); the words do, so no column is ever
    # dropped to fit a narrow terminal.
    for name, justify in (("region", "left"), ("offset", "right"), ("end", "right"), ("size", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("owner", overflow="fold")
    table.add_column("detail", overflow="fold", ratio=1)
    colors = []
    partition_index = 0
    for region in regions:
        color = region_color(region, partition_index)
        partition_index += region.kind == "partition"
        colors.append(color)
        cells = [
            Text(region.kind if region.kind == "partition" else region.name, style=color),
            f"{region.offset:#x}",
            f"{region.end:#x}",
            format_size(region.size),
            region.owner,
        ]
        table.add_row(*cells, region.detail)
    console.print(table)
    bar = Text()
    for width, color in zip(proportional_widths([r.size for r in regions], BAR_WIDTH), colors, strict=True):
        bar.append("█" * width, style=color)
    console.print(bar)
    console.print(
        f"pool {format_size(layout.pool_size)}, used {format_size(layout.used)}, "
        f"unused {format_size(layout.unused)}, align {format_size(layout.align)}"
    )
