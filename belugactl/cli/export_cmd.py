"""`belugactl export systemd`: a boot unit that re-applies what a reboot resets."""

from __future__ import annotations

import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    export = typer.Typer(help="Export configuration for other tools (systemd).", no_args_is_help=True)

    @export.command("systemd")
    def systemd_cmd(
        file: Path = typer.Option(..., "-f", "--file", help="The rack manifest (YAML)."),
        host: str | None = typer.Option(None, "--host", help="The manifest host (default: this hostname's)."),
        output: Path | None = typer.Option(None, "-o", "--output", help="Write the unit here (default: stdout)."),
        command: str | None = typer.Option(
            None, "--command", help="How the unit starts belugactl (default: this interpreter with -m belugactl)."
        ),
    ) -> None:
        """Write a systemd unit that re-applies hugepages, THP, DDIO, MTRR and device permissions at boot.

        Install:  belugactl export systemd -f /etc/belugactl/rack.yaml -o /etc/systemd/system/belugactl-setup.service
                  systemctl daemon-reload && systemctl enable belugactl-setup.service"""
        import shlex

        from belugactl.model.manifest import load_manifest
        from belugactl.workflows.setup.systemd import unit_text
        from belugactl.workflows.setup.target import default_host_name

        manifest = load_manifest(file)
        name = host
        if name is None:
            name = default_host_name(manifest)
        elif name not in [h.name for h in manifest.hosts]:
            from belugactl.errors import UsageError

            raise UsageError(f"no host named {name!r} in the manifest", fix="pass --host with a manifest host name")
        argv = shlex.split(command) if command else [sys.executable, "-m", "belugactl"]
        text = unit_text(str(file.resolve()), name, argv)
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text)
            print(f"wrote {output}; enable with: systemctl daemon-reload && systemctl enable {output.name}",
                  file=sys.stderr)

    app.add_typer(export, name="export")
