"""`belugactl lab coldstart`: boot a lab for a manifest, set up and check every guest, print the phases."""

from __future__ import annotations

import sys

import typer

from belugactl.cli.options import file_option, hidden_alias


def register(lab: typer.Typer) -> None:
    @lab.command("coldstart")
    def coldstart_cmd(
        file: str | None = file_option(
            "The rack manifest (YAML); default: this checkout's examples/lab-ram.yaml.", required=False
        ),
        manifest: str | None = hidden_alias("--manifest"),  # the old spelling, kept one release
        name: str = typer.Option("coldstart", "--name", metavar="NAME", help="Lab name (must not exist yet)."),
        profile: str = typer.Option("ram", "--profile", metavar="ram|pmem", help="ram (QEMU 10, kernel 6.12) or pmem."),
        devices: int = typer.Option(2, "--devices", metavar="N", help="ram: volatile devices per guest."),
        switch: bool = typer.Option(True, "--switch/--no-switch", help="ram: devices behind a CXL switch."),
        keep: bool = typer.Option(False, "--keep", help="Leave the lab running afterwards."),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """From nothing to every host's doctor green: boot one guest per manifest host, run `setup` and
        then `doctor` in all of them at once, and print how long each phase took. Exits 1 unless every
        setup and doctor passed. BELUGACTL_LAB_WARM=0 measures without the guests' resident belugactl."""
        from pathlib import Path

        import belugactl
        from belugactl.cli.load_rack import rack_context
        from belugactl.cli.render import print_json
        from belugactl.lab import coldstart

        manifest = (
            file or manifest or str(Path(belugactl.__file__).resolve().parent.parent / "examples" / "lab-ram.yaml")
        )
        if profile == "pmem":
            devices, switch = 1, False
        # The lab knows guests, not manifests: the CLI reads the hosts and the pool's size for it.
        loaded = rack_context(manifest).manifest
        report = coldstart.run(
            manifest,
            hosts=[h.name for h in loaded.hosts],
            pool_size=int(loaded.pool.size),
            name=name,
            profile=profile,
            devices=devices,
            switch=switch,
            keep=keep,
            progress=lambda m: print(f"lab: {m}", file=sys.stderr, flush=True),
        )
        if as_json:
            print_json(report.to_dict())
        else:
            shape = f"{report.devices} device(s){' behind a switch' if report.switch else ''}"
            print(f"cold start of lab {report.lab}: {report.hosts} guests, profile {report.profile}, {shape}")
            for phase, seconds in report.phases:
                print(f"  {seconds:7.1f} s  {phase}")
            print(
                f"  {report.total_s:7.1f} s  total (target {coldstart.TARGET_S:.0f} s: "
                f"{'met' if report.total_s <= coldstart.TARGET_S else 'not met'})"
            )
            for r in report.runs:
                print(
                    f"  {r.host} {r.command:<6} exit {r.rc}  {r.seconds:6.1f} s  "
                    f"{'resident' if r.resident else 'spawned'}  {r.summary}"
                )
            print("all doctors green" if report.green else "NOT green: see the failed runs above")
        if not report.green:
            raise typer.Exit(1)
