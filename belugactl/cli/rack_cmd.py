"""`belugactl rack ...`: setup, doctor, serve, status and stop on every host of the manifest at once."""

from __future__ import annotations

import sys
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
    from belugactl.workflows.rack.fanout import CommandTransport, SshTransport
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
        tr = CommandTransport(prefix=[sys.executable, "-m", "belugactl", "lab", "exec", "--name", lab_name,
                                      "--timeout", str(timeout), "{host}", "--"])
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


_SYMBOL = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-", None: "?"}


def _render_doctor(report: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from belugactl.cli.render import stdout_console
    from belugactl.workflows.rack.fanout import fold

    console = stdout_console()
    hosts = report.hosts
    table = Table(title="rack doctor: hosts x checks", show_lines=False)
    table.add_column("check")
    for h in hosts:
        table.add_column(h, justify="center")
    row = ["version.skew"] + [_SYMBOL.get(report.skew.get(h, {}).get("status"), "?") for h in hosts]
    table.add_row(*row)
    for check_id, cells in report.checks.items():
        table.add_row(check_id, *[_cell(cells.get(h)) for h in hosts])
    console.print(table)

    if report.probe is not None:
        probe = Table(title="pool probe: row reads the probe written by column")
        probe.add_column("reader \\ writer")
        for h in hosts:
            probe.add_column(h, justify="center")
        for reader in hosts:
            row_cells = report.probe.get(reader)
            if row_cells is None:
                probe.add_row(reader, *["?" for _ in hosts])
                continue
            probe.add_row(reader, *[_SYMBOL["ok"] if row_cells.get(w, {}).get("status") == "ok" else
                                    _SYMBOL["fail"] for w in hosts])
        console.print(probe)

    problems: dict[tuple[str, str, str], list[str]] = {}
    for host, text in report.host_errors.items():
        problems.setdefault(("host", text, ""), []).append(host)
    for host, row in report.skew.items():
        if row.get("status") != "ok":
            problems.setdefault(("version.skew", row.get("reason") or "", row.get("fix") or ""), []).append(host)
    for check_id, cells in report.checks.items():
        for host, c in cells.items():
            if c["status"] in ("fail", "warn"):
                problems.setdefault((check_id, f"{c['status']}: {c['reason']}", c.get("fix") or ""), []).append(host)
    for host, text in report.probe_errors.items():
        problems.setdefault(("probe", text, ""), []).append(host)
    if report.probe:
        for reader, cells in report.probe.items():
            for writer, cell in cells.items():
                if cell["status"] != "ok":
                    key = ("probe", f"{cell['status']} reading {writer}'s probe: {cell['detail']}",
                           "check that this host maps the same device and namespace as the others "
                           "(belugactl doctor; belugactl pool show)")
                    problems.setdefault(key, []).append(reader)
    for (what, text, fix), hs in problems.items():
        console.print(f"[bold]{fold(hs)}[/bold] {escape(what)}: {escape(text)}")
        if fix:
            console.print(f"    fix: {escape(fix)}")
    if report.timings:
        console.print("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in report.timings.items()))
    failed = report.failed_hosts
    if failed:
        console.print(f"\n✗ {len(failed)} of {len(hosts)} host(s) need attention: {fold(failed)}")
    else:
        console.print(f"\n✓ all {len(hosts)} host(s) healthy, same belugactl and manifest, pool probe all green")


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "?"
    symbol = _SYMBOL.get(cell.get("status"), "?")
    return symbol + ("*" if cell.get("ignored") else "")


def _render_run(run: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from belugactl.cli.render import stdout_console
    from belugactl.workflows.rack.fanout import fold, group_identical

    console = stdout_console()
    console.print(f"order: {' -> '.join(fold(p) for p in run.order)}")
    if run.verb == "setup":
        table = Table(title="rack setup: hosts x steps")
        table.add_column("step")
        for h in run.hosts:
            table.add_column(h, justify="center")
        steps: dict[str, dict[str, str]] = {}
        for host, doc in run.documents.items():
            report = doc.get("report", doc) if isinstance(doc, dict) else {}
            for item in report.get("applied", []):
                steps.setdefault(item["step"]["id"], {})[host] = "applied"
            for item in report.get("remaining", []):
                steps.setdefault(item["id"], {})[host] = "planned" if report.get("dry_run") else "not done"
            if report.get("failed"):
                steps.setdefault(report["failed"], {})[host] = "FAILED"
            if not report.get("applied") and not report.get("remaining") and not report.get("failed"):
                steps.setdefault("(no changes)", {})[host] = "✓"
        for step_id, cells in steps.items():
            table.add_row(step_id, *[cells.get(h, "") for h in run.hosts])
        console.print(table)
    groups = group_identical({h: r for h, r in run.results.items() if not r.ok})
    for hosts, res in groups:
        console.print(f"[bold]{fold(hosts)}[/bold] exit {res.returncode}: {escape(run.problems.get(hosts[0], ''))}")
        for line in res.stderr.strip().splitlines()[-6:]:
            console.print(f"    {escape(line)}")
    if run.not_run:
        console.print(f"not run (an earlier phase failed): {fold(run.not_run)}")
    ok = [h for h in run.hosts if h not in run.failed_hosts]
    console.print(f"{'✗' if run.failed else '✓'} {run.verb}: {len(ok)}/{len(run.hosts)} host(s) ok"
                  + (f"; failed: {fold(run.failed_hosts)}" if run.failed else ""))


def register(app: typer.Typer) -> None:
    rack = typer.Typer(
        help="Run setup, doctor, serve, status or stop on every host of the manifest at once (ClusterShell).",
        no_args_is_help=True,
    )

    def common(
        manifest: str = file_option(),
        hosts: str | None = typer.Option(
            None, "--hosts", help="Node set to act on, e.g. lab-[1-2] (default: all).", autocompletion=complete_host
        ),
        transport: str = typer.Option("ssh", "--transport", help=TRANSPORT_HELP),
        fanout: int = typer.Option(16, "--fanout", help="Hosts at once."),
        timeout: float = typer.Option(600.0, "--timeout", help="Seconds per host command."),
        lab_name: str = typer.Option("default", "--lab-name", help="With --transport lab: which lab."),
        remote_belugactl: str | None = typer.Option(None, "--remote-belugactl", help="belugactl on the hosts."),
        remote_manifest: str | None = typer.Option(
            None, "--remote-manifest", help="The manifest's path on the hosts (default: the same absolute path)."
        ),
        ssh_config: str | None = typer.Option(None, "--ssh-config", help="ssh -F FILE."),
        ssh_user: str | None = typer.Option(None, "--ssh-user"),
        identity: str | None = typer.Option(None, "--identity", help="ssh -i KEY."),
        connect_timeout: int = typer.Option(10, "--connect-timeout", help="ssh connect timeout, seconds."),
        pool: str | None = typer.Option(None, "--pool", help="Pool device or file on the hosts (default: discovered)."),
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
        "as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
        default=typer.Option(False, "--json", help="One JSON document on stdout."),
    )

    def split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = {p.name for p in common_params}
        return {k: v for k, v in kwargs.items() if k in names}, {k: v for k, v in kwargs.items() if k not in names}

    def finish(run_or_report: Any, as_json: bool, render) -> None:
        from belugactl.cli.render import print_json

        if as_json:
            print_json(run_or_report.to_dict())
        else:
            render(run_or_report)
        raise typer.Exit(1 if run_or_report.failed else 0)

    @rack.command("doctor")
    @with_common([
        json_param,
        inspect.Parameter("ignore", inspect.Parameter.KEYWORD_ONLY, annotation=list[str],
                          default=ignore_option("Downgrade a check on every host (repeat, or a comma list).")),
        inspect.Parameter("probe", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(True, "--probe/--no-probe", help="Run the cross-host pool probe.")),
    ])
    def doctor(**kwargs: Any) -> None:
        """Doctor on every host, version skew, and the cross-host pool probe matrix.

        Example: belugactl rack doctor -f examples/lab.yaml --transport lab
        """
        from belugactl.cli.options import checked_ignores
        from belugactl.workflows.rack.orchestrate import rack_doctor

        opts, rest = split(kwargs)
        ignores = sorted(checked_ignores(rest["ignore"]))  # a typo fails here, not on every host
        report = rack_doctor(build(opts), ignore=ignores, probe=rest["probe"])
        finish(report, rest["as_json"], _render_doctor)

    @rack.command("setup")
    @with_common([
        json_param,
        inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--dry-run", help="Plan on every host; change nothing.")),
        inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--force", help="Allow steps that destroy pool data.")),
    ])
    def setup(**kwargs: Any) -> None:
        """Setup on the first host (it writes the pool header), then on the rest in parallel.

        Example: belugactl rack setup -f rack.yaml --hosts 'gpu[01-16]' --dry-run
        """
        from belugactl.workflows.rack.orchestrate import rack_setup

        opts, rest = split(kwargs)
        finish(rack_setup(build(opts), dry_run=rest["dry_run"], force=rest["force"]), rest["as_json"], _render_run)

    @rack.command("serve")
    @with_common([
        json_param,
        inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                          default=typer.Option(False, "--dry-run", help="Print every host's command lines.")),
    ])
    def serve(**kwargs: Any) -> None:
        """Serve (detached) on the metadata server's host first, then on every other host.

        Example: belugactl rack serve -f examples/lab.yaml --transport lab --dry-run
        """
        from belugactl.workflows.rack.orchestrate import rack_serve

        opts, rest = split(kwargs)
        finish(rack_serve(build(opts), dry_run=rest["dry_run"]), rest["as_json"], _render_run)

    @rack.command("status")
    @with_common([json_param])
    def status(**kwargs: Any) -> None:
        """What serve runs on every host. Example: belugactl rack status -f rack.yaml"""
        from belugactl.workflows.rack.orchestrate import rack_status

        opts, rest = split(kwargs)
        finish(rack_status(build(opts)), rest["as_json"], _render_run)

    @rack.command("stop")
    @with_common([json_param])
    def stop(**kwargs: Any) -> None:
        """Stop serving everywhere; the metadata server's host last. Example: belugactl rack stop -f rack.yaml"""
        from belugactl.workflows.rack.orchestrate import rack_stop

        opts, rest = split(kwargs)
        finish(rack_stop(build(opts)), rest["as_json"], _render_run)

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
