"""`belugactl export systemd`: a boot unit that re-applies what a reboot resets."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from belugactl.cli.options import file_option, host_option


def register(app: typer.Typer) -> None:
    export = typer.Typer(help="Export configuration for other tools (systemd).", no_args_is_help=True)

    @export.command("systemd")
    def systemd_cmd(
        file: Path = file_option(),
        host: str | None = host_option("The manifest host (default: this hostname's)."),
        output: Path | None = typer.Option(None, "-o", "--output", help="Write the unit here (default: stdout)."),
        command: str | None = typer.Option(
            None, "--command", help="How the unit starts belugactl (default: this interpreter with -m belugactl)."
        ),
    ) -> None:
        """Write a systemd unit that re-applies hugepages, THP, DDIO, MTRR and device permissions at boot.

        Install:  belugactl export systemd -f /etc/belugactl/rack.yaml -o /etc/systemd/system/belugactl-setup.service
                  systemctl daemon-reload && systemctl enable belugactl-setup.service"""
        import shlex

        from belugactl.cli.load_rack import rack_context
        from belugactl.workflows.setup.systemd import unit_text

        name = rack_context(file, host=host).host_name
        argv = shlex.split(command) if command else [sys.executable, "-m", "belugactl"]
        text = unit_text(str(file.resolve()), name, argv)
        if output is None:
            sys.stdout.write(text)
        else:
            output.write_text(text)
            print(f"wrote {output}; enable with: systemctl daemon-reload && systemctl enable {output.name}",
                  file=sys.stderr)

    app.add_typer(export, name="export")
