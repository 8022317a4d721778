"""`belugactl export systemd|prometheus|grafana`: configuration for the tools that run next to belugactl."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from belugactl.cli.options import file_option, host_option
from belugactl.cli.output_path import STDOUT, is_dir_path, output_dir, output_file, write_output


def register(app: typer.Typer) -> None:
    export = typer.Typer(
        help="Export configuration for other tools (systemd, Prometheus, Grafana).", no_args_is_help=True
    )

    @export.command("systemd")
    def systemd_cmd(
        file: Path = file_option(),
        host: str | None = host_option("The manifest host (default: this hostname's)."),
        output: str | None = typer.Option(
            None,
            "-o",
            "--output",
            metavar="DIR/|FILE.service|-",
            help="An existing directory for both units, or the setup unit's path, FILE.service (the serve "
            "unit goes beside it). Default, or `-`: both on stdout.",
        ),
        command: str | None = typer.Option(
            None,
            "--command",
            metavar="COMMAND",
            help="How the unit starts belugactl (default: this interpreter with -m belugactl).",
        ),
    ) -> None:
        """Write the boot units: belugactl-setup.service re-applies hugepages, THP, DDIO, MTRR and device
        permissions; belugactl-serve.service runs `belugactl serve` after it; on a host that is a member of
        serve.metadata.etcd's endpoints, belugactl-etcd.service runs that etcd member.

        Install:  belugactl export systemd -f /etc/belugactl/rack.yaml -o /etc/systemd/system/
                  systemctl daemon-reload && systemctl enable belugactl-setup.service belugactl-serve.service"""
        import shlex

        from belugactl.cli.load_rack import rack_context
        from belugactl.errors import UsageError
        from belugactl.workflows.setup.systemd import SERVE_UNIT_NAME, UNIT_NAME, serve_unit_text, unit_text

        rack = rack_context(file, host=host)
        name = rack.host_name
        argv = shlex.split(command) if command else [sys.executable, "-m", "belugactl"]
        manifest_path = str(file.resolve())
        setup_text = unit_text(manifest_path, name, argv)
        serve_text = serve_unit_text(manifest_path, name, argv)
        from belugactl.workflows.setup.systemd import ETCD_UNIT_NAME, etcd_unit_text

        etcd_text, etcd_note = etcd_unit_text(rack.manifest, name)
        if etcd_text is None and "no serve.metadata.etcd" not in etcd_note:
            print(f"export systemd: {etcd_note}", file=sys.stderr)
        # Every target is checked before the first byte is written.
        if output is None or output == STDOUT:
            sys.stdout.write(f"# ---- {UNIT_NAME}\n{setup_text}\n# ---- {SERVE_UNIT_NAME}\n{serve_text}")
            if etcd_text is not None:
                sys.stdout.write(f"\n# ---- {ETCD_UNIT_NAME}\n{etcd_text}")
            return
        if is_dir_path(output):
            setup_path = output_file(str(output_dir(output, option="-o") / UNIT_NAME), option="-o")
        else:
            setup_path = output_file(output, option="-o")
            if setup_path is not None and not setup_path.name.endswith(".service"):
                raise UsageError(
                    f"-o {output}: neither an existing directory nor a unit file name (FILE.service)",
                    why="systemd reads only unit files named NAME.service",
                    fix=f"create the directory and pass -o {output}/, or name the file, e.g. -o {output}.service",
                )
        assert setup_path is not None
        serve_path = output_file(str(setup_path.parent / SERVE_UNIT_NAME), option="-o")
        assert serve_path is not None
        etcd_path = output_file(str(setup_path.parent / ETCD_UNIT_NAME), option="-o") if etcd_text else None
        write_output(setup_path, setup_text)
        write_output(serve_path, serve_text)
        if etcd_path is not None and etcd_text is not None:
            write_output(etcd_path, etcd_text)
            print(f"wrote {etcd_path} ({etcd_note}); start the members of all hosts together", file=sys.stderr)
        print(
            f"wrote {setup_path} and {serve_path}; enable with: systemctl daemon-reload && "
            f"systemctl enable {setup_path.name} {serve_path.name}" + (f" {ETCD_UNIT_NAME}" if etcd_path else ""),
            file=sys.stderr,
        )

    @export.command("prometheus")
    def prometheus_cmd(
        file: Path = file_option(),
        output: str | None = typer.Option(
            None, "-o", "--output", metavar="FILE|-", help="Write prometheus.yml here (default, or `-`: stdout)."
        ),
        interval: str = typer.Option(
            "15s", "--scrape-interval", metavar="DURATION", help="Prometheus scrape interval, e.g. 15s."
        ),
    ) -> None:
        """A Prometheus scrape config for every metadata server, vLLM instance and router of the rack.

        The dashboard that reads these targets: `belugactl export grafana` (import it in Grafana)."""
        import re

        from belugactl.cli.load_rack import rack_context
        from belugactl.errors import UsageError
        from belugactl.workflows.export_prometheus import render_yaml, scrape_config

        if not re.fullmatch(r"[1-9][0-9]*(ms|s|m|h)", interval):
            raise UsageError(f"--scrape-interval {interval!r} is not a duration", fix="e.g. 15s, 1m, 500ms")
        target = output_file(output, option="-o") if output is not None else None
        manifest = rack_context(file).manifest
        doc, warnings = scrape_config(manifest, interval=interval)
        for warning in warnings:
            print(f"export prometheus: warning: {warning}", file=sys.stderr)
        _write(render_yaml(doc, manifest.name), target, "start Prometheus with --config.file " + str(target))

    @export.command("grafana")
    def grafana_cmd(
        file: Path | None = file_option("The rack manifest: the dashboard opens on this rack.", required=False),
        output: str | None = typer.Option(
            None, "-o", "--output", metavar="FILE|-", help="Write the dashboard here (default, or `-`: stdout)."
        ),
    ) -> None:
        """The Grafana dashboard for `export prometheus`'s targets: pool, hit ratio, RPC latency, TTFT per instance."""
        from importlib.resources import files

        target = output_file(output, option="-o") if output is not None else None
        text = files("belugactl").joinpath("data/grafana/belugactl.json").read_text()
        if file is not None:
            from belugactl.cli.load_rack import rack_context

            text = _for_rack(text, rack_context(file).manifest.name)
        _write(text, target, "import it in Grafana (Dashboards > New > Import) and pick the Prometheus data source")

    app.add_typer(export, name="export")


def _for_rack(text: str, rack: str) -> str:
    """The dashboard with its `rack` variable set to this rack (others stay selectable) and its name in the title."""
    import json

    doc = json.loads(text)
    doc["title"] = f"{doc['title']} ({rack})"
    for var in doc.get("templating", {}).get("list", []):
        if var.get("name") == "rack":
            var["current"] = {"text": [rack], "value": [rack]}
    return json.dumps(doc, indent=2) + "\n"


def _write(text: str, output: Path | None, next_step: str) -> None:
    write_output(output, text)
    if output is None:
        return
    print(f"wrote {output}; {next_step}", file=sys.stderr)
