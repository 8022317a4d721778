"""`belugactl rack ...`: setup, doctor, serve, status and stop on every host of the manifest at once."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer

from belugactl.cli.completion import complete_host
from belugactl.cli.options import file_option, host_option, ignore_option

TRANSPORT_HELP = (
    "How hosts are reached: ssh (OpenSSH, BatchMode), lab (`belugactl lab exec` into the emulated rack), "
    "local (run each host's command on this machine: single-box demos and tests)."
)


def _target(
    manifest: str,
    hosts: str | None,
    transport: str,
    fanout: int,
    timeout: float,
    lab_name: str,
    remote_belugactl: str | None,
    remote_manifest: str | None,
    ssh_config: str | None,
    ssh_user: str | None,
    identity: str | None,
    connect_timeout: int,
    pool: str | None,
):
    import os
    import shlex

    from belugactl.cli.load_rack import rack_context
    from belugactl.errors import UsageError
    from belugactl.workflows.rack.fanout import CommandTransport, LabTransport, SshTransport
    from belugactl.workflows.rack.orchestrate import RackTarget, select_hosts

    rack = rack_context(manifest)
    loaded = rack.manifest
    selected = select_hosts(loaded, hosts)
    remote_manifest = remote_manifest or os.path.abspath(manifest)
    if transport == "ssh":
        tr: Any = SshTransport(
            config_file=ssh_config,
            user=ssh_user,
            identity_file=identity,
            connect_timeout_s=connect_timeout,
            # With an ssh config file the host names are its Host aliases; otherwise dial the manifest's addresses.
            addresses={} if ssh_config else {h.name: h.address for h in loaded.hosts},
        )
        remote = shlex.split(remote_belugactl) if remote_belugactl else ["belugactl"]
    elif transport == "lab":
        tr = LabTransport(
            prefix=[
                sys.executable,
                "-m",
                "belugactl",
                "lab",
                "exec",
                "--name",
                lab_name,
                "--timeout",
                str(timeout),
                "{host}",
                "--",
            ],
            lab_name=lab_name,
        )
        remote = shlex.split(remote_belugactl) if remote_belugactl else ["belugactl"]
    elif transport == "local":
        tr = CommandTransport(prefix=[])
        remote = shlex.split(remote_belugactl) if remote_belugactl else [sys.executable, "-m", "belugactl"]
    else:
        raise UsageError(f"unknown transport {transport!r}", fix="use --transport ssh, lab or local")
    if fanout < 1:
        raise UsageError("--fanout must be at least 1")
    return RackTarget(
        rack=rack,
        hosts=selected,
        transport=tr,
        remote_belugactl=remote,
        remote_manifest=remote_manifest,
        fanout=fanout,
        timeout_s=timeout,
        pool=pool,
    )


EXIT_HELP = (
    "Exit status: 0 when every host is ok; 1 when a host fails (a check, version skew, the pool probe, or its "
    "command); else 3 when a host could not be reached (nothing was checked there); 2 on bad usage."
)


def register(app: typer.Typer) -> None:
    rack = typer.Typer(
        help="Run setup, doctor, serve, status or stop on every host of the manifest at once (ClusterShell).",
        no_args_is_help=True,
    )

    def common(
        manifest: str = file_option(),
        hosts: str | None = typer.Option(
            None,
            "--hosts",
            metavar="NODESET",
            help="Node set to act on, e.g. lab-[1-2] (default: all).",
            autocompletion=complete_host,
        ),
        transport: str = typer.Option("ssh", "--transport", metavar="ssh|lab|local", help=TRANSPORT_HELP),
        fanout: int = typer.Option(16, "--fanout", metavar="N", help="Hosts at once."),
        timeout: float = typer.Option(600.0, "--timeout", metavar="SECONDS", help="Seconds per host command."),
        lab_name: str = typer.Option("default", "--lab-name", metavar="NAME", help="With --transport lab: which lab."),
        remote_belugactl: str | None = typer.Option(
            None, "--remote-belugactl", metavar="COMMAND", help="belugactl on the hosts (a command line)."
        ),
        remote_manifest: str | None = typer.Option(
            None,
            "--remote-manifest",
            metavar="PATH",
            help="The manifest's path on the hosts (default: the same absolute path).",
        ),
        ssh_config: str | None = typer.Option(None, "--ssh-config", metavar="FILE", help="ssh -F FILE."),
        ssh_user: str | None = typer.Option(
            None, "--ssh-user", metavar="USER", help="ssh -l USER (default: ssh's own: the config, or you)."
        ),
        identity: str | None = typer.Option(None, "--identity", metavar="KEY", help="ssh -i KEY."),
        connect_timeout: int = typer.Option(
            10, "--connect-timeout", metavar="SECONDS", help="ssh connect timeout, seconds."
        ),
        pool: str | None = typer.Option(
            None, "--pool", metavar="PATH", help="Pool device or file on the hosts (default: discovered)."
        ),
    ) -> dict[str, Any]:
        return dict(locals())

    def build(opts: dict[str, Any]):
        return _target(**opts)

    import inspect

    common_params = list(inspect.signature(common).parameters.values())

    def with_common(extra: list[inspect.Parameter]):
        def deco(fn):
            fn.__signature__ = inspect.Signature(common_params + extra)
            return fn

        return deco

    json_param = inspect.Parameter(
        "as_json",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=bool,
        default=typer.Option(False, "--json", help="One JSON document on stdout."),
    )

    def split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = {p.name for p in common_params}
        return {k: v for k, v in kwargs.items() if k in names}, {k: v for k, v in kwargs.items() if k not in names}

    matrix_param = inspect.Parameter(
        "matrix",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=bool | None,
        default=typer.Option(
            None,
            "--matrix/--no-matrix",
            help="The hosts x checks (or steps) matrix: always, or never (default: when it fits).",
        ),
    )

    def execute(verb: str, kwargs: dict[str, Any], workflow: Callable[[Any, dict[str, Any]], Any]) -> None:
        """Build the target, run `workflow` with progress on stderr, print the report or --json, exit."""
        from belugactl.cli import rack_render
        from belugactl.cli.rack_progress import progress
        from belugactl.cli.render import print_json

        opts, rest = split(kwargs)
        target = build(opts)
        with progress(verb) as shown:
            target.progress = shown
            result = workflow(target, rest)
        if rest["as_json"]:
            print_json(result.to_dict())
        elif verb == "doctor":
            rack_render.render_doctor(result, matrix=rest.get("matrix"))
        else:
            rack_render.render_run(result, matrix=rest.get("matrix"))
        raise typer.Exit(result.summary().exit_code)

    @rack.command("doctor", epilog=EXIT_HELP)
    @with_common(
        [
            json_param,
            matrix_param,
            inspect.Parameter(
                "ignore",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=list[str],
                default=ignore_option("Downgrade a check on every host (repeat, or a comma list)."),
            ),
            inspect.Parameter(
                "probe",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=bool,
                default=typer.Option(True, "--probe/--no-probe", help="Run the cross-host pool probe."),
            ),
        ]
    )
    def doctor(**kwargs: Any) -> None:
        """Doctor on every host, version skew and the cross-host pool probe, summed up by node set.

        Example: belugactl rack doctor -f examples/lab.yaml --transport lab
        """
        from belugactl.cli.options import checked_ignores
        from belugactl.workflows.rack.orchestrate import rack_doctor

        ignores = sorted(checked_ignores(kwargs["ignore"]))  # a typo fails here, not on every host
        execute("doctor", kwargs, lambda target, rest: rack_doctor(target, ignore=ignores, probe=rest["probe"]))

    @rack.command("setup", epilog=EXIT_HELP)
    @with_common(
        [
            json_param,
            matrix_param,
            inspect.Parameter(
                "dry_run",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=bool,
                default=typer.Option(False, "--dry-run", help="Plan on every host; change nothing."),
            ),
            inspect.Parameter(
                "force",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=bool,
                default=typer.Option(False, "--force", help="Allow steps that destroy pool data."),
            ),
        ]
    )
    def setup(**kwargs: Any) -> None:
        """Setup on the first host (it writes the pool header), then on the rest in parallel.

        Example: belugactl rack setup -f rack.yaml --hosts 'gpu[01-16]' --dry-run
        """
        from belugactl.workflows.rack.orchestrate import rack_setup

        execute("setup", kwargs, lambda target, rest: rack_setup(target, dry_run=rest["dry_run"], force=rest["force"]))

    @rack.command("serve", epilog=EXIT_HELP)
    @with_common(
        [
            json_param,
            inspect.Parameter(
                "dry_run",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=bool,
                default=typer.Option(False, "--dry-run", help="Print every host's command lines."),
            ),
            inspect.Parameter(
                "rolling",
                inspect.Parameter.KEYWORD_ONLY,
                annotation=bool,
                default=typer.Option(
                    False,
                    "--rolling",
                    help="Restart a serving rack one host at a time (stop, serve, ready, next): the leading "
                    "metadata server's host and then the front door's last; the pool and its index stay.",
                ),
            ),
        ]
    )
    def serve(**kwargs: Any) -> None:
        """Serve (detached) on the metadata server's host first, then on every other host.

        With --rolling: restart (or upgrade) a serving rack one host at a time.

        Example: belugactl rack serve -f examples/lab.yaml --transport lab --dry-run
        """
        from belugactl.workflows.rack.orchestrate import rack_serve, rack_serve_rolling

        def go(target: Any, rest: dict[str, Any]) -> Any:
            if rest["rolling"]:
                return rack_serve_rolling(target, dry_run=rest["dry_run"])
            return rack_serve(target, dry_run=rest["dry_run"])

        execute("serve", kwargs, go)

    @rack.command("status", epilog=EXIT_HELP)
    @with_common([json_param])
    def status(**kwargs: Any) -> None:
        """What serve runs on every host. Example: belugactl rack status -f rack.yaml"""
        from belugactl.workflows.rack.orchestrate import rack_status

        execute("status", kwargs, lambda target, rest: rack_status(target))

    @rack.command("stop", epilog=EXIT_HELP)
    @with_common([json_param])
    def stop(**kwargs: Any) -> None:
        """Stop serving everywhere; the metadata server's host last. Example: belugactl rack stop -f rack.yaml"""
        from belugactl.workflows.rack.orchestrate import rack_stop

        execute("stop", kwargs, lambda target, rest: rack_stop(target))

    agent = typer.Typer(help="What `rack` runs on each host (facts and the pool probe).", hidden=True)

    @agent.command("info")
    def info(
        manifest: str = file_option(),
        host: str | None = host_option(),
        as_json: bool = typer.Option(True, "--json/--text"),
    ) -> None:
        from belugactl.cli.load_rack import rack_context
        from belugactl.cli.render import print_json
        from belugactl.workflows.rack.host_tasks import host_info

        print_json(host_info(rack_context(manifest, host=host)))

    def probe_command(verb: str, doc: str) -> None:
        def command(
            manifest: str = file_option(),
            host: str | None = host_option(),
            nonce: int = typer.Option(..., "--nonce"),
            pool: str | None = typer.Option(None, "--pool"),
            as_json: bool = typer.Option(True, "--json/--text"),
        ) -> None:
            from belugactl.cli.load_rack import rack_context
            from belugactl.cli.render import print_json
            from belugactl.workflows.rack import host_tasks

            run = host_tasks.probe_write if verb == "probe-write" else host_tasks.probe_read
            print_json(run(rack_context(manifest, host=host, pool=pool), nonce))

        command.__doc__ = doc
        agent.command(verb)(command)

    probe_command("probe-write", "Write this host's probe record into the first line of its partition.")
    probe_command("probe-read", "Read every host's probe record at the offsets this host's layout gives.")

    rack.add_typer(agent, name="agent")
    app.add_typer(rack, name="rack")
