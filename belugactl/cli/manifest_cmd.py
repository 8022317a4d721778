"""`belugactl manifest check -f FILE`: validate a rack manifest and print the layout it resolves to."""

from __future__ import annotations

from pathlib import Path

import typer

from belugactl.cli.options import file_option, json_option


def register(app: typer.Typer) -> None:
    manifest = typer.Typer(help="Validate rack manifests.", no_args_is_help=True)

    @manifest.command("check")
    def check(
        file: Path = file_option(),
        as_json: bool = json_option(),
    ) -> None:
        """Validate FILE (every problem with file:line:column) and print the resolved pool layout."""
        from belugactl.cli.load_rack import rack_context
        from belugactl.cli.pool_cmd import render_layout_table
        from belugactl.cli.render import print_json

        rack = rack_context(file, as_json=as_json)
        m, layout = rack.manifest, rack.layout
        if as_json:
            document = {"ok": True, "file": str(file), "manifest": summary(m), "layout": layout.to_dict()}
            if m.tenants:
                from belugactl.model.tenants import tenant_rows

                document["tenants"] = tenant_rows(m, layout)
            print_json(document)
            return
        from belugactl.cli.render import stdout_console
        from belugactl.units import format_size

        console = stdout_console()
        s = summary(m)
        console.print(
            f"[green]ok[/green] {file}: rack [bold]{m.name}[/bold], {len(m.hosts)} host(s), "
            f"pool {format_size(m.pool.size)} (align {format_size(m.pool.align)}), "
            f"{s['clients']} vLLM instance(s), metadata on {s['metadata_host']}"
        )
        console.print(f"pool source: {describe_source(m.pool)}", markup=False, highlight=False)
        render_layout_table(console, layout, title=f"pool layout {layout.layout_hash[:12]}")
        from belugactl.cli.pool_cmd import render_tenants

        render_tenants(console, m, layout)

    @manifest.command("schema")
    def schema() -> None:
        """Print the manifest's JSON Schema (for editors: yaml-language-server, VS Code)."""
        from belugactl.cli.render import print_json
        from belugactl.model.manifest_schema import Manifest

        document = Manifest.model_json_schema(mode="validation")
        document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        document["title"] = "belugactl rack manifest"
        print_json(document)

    app.add_typer(manifest, name="manifest")


def describe_source(pool) -> str:  # pool: manifest_schema.Pool (imported lazily)
    """Where the pool comes from, in one line: the region's type, memdevs and interleave, or the dax device."""
    from belugactl.units import format_size
    from belugactl.workflows.memdev_choice import MemdevWant

    src, il = pool.source, pool.interleave
    granularity = f" x {format_size(il.granularity)}" if il.granularity else ""
    interleave = f"{il.mode} interleave, {il.ways} way{'s' if il.ways > 1 else ''}{granularity}"
    if src.kind != "cxl-region":
        return f"the existing dax device {src.device}" + (f"; {interleave}" if il.ways > 1 else "")
    memdevs = MemdevWant.from_manifest(src.memdevs).describe()
    return f"a {src.type} CXL region on memdevs: {memdevs}; {interleave}"


def summary(m) -> dict[str, object]:  # m: Manifest (imported lazily)
    meta = m.metadata_host()
    return {
        "name": m.name,
        "version": m.version,
        "hosts": [
            {
                "name": h.name,
                "address": h.address,
                "roles": list(h.roles),
                "platform": h.platform,
                "instances": m.instances_on(h),
                "block_size": m.block_size_on(h),
                "gpus": h.gpus.count,
            }
            for h in m.hosts
        ],
        "metadata_host": meta.name if meta else None,
        "clients": sum(m.instances_on(h) for h in m.hosts),
        "pool": m.pool.model_dump(mode="json"),
    }
