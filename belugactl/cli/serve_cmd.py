"""`belugactl serve`, `status`, `stop`: the metadata server and vLLM instances of this host."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import typer

from belugactl.cli.options import file_option, hidden_alias, host_option, ignore_option


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
    app.command("status")(status)
    app.command("stop")(stop)


def serve(
    manifest: str = file_option(),
    host: str = host_option(),
    pool: str = typer.Option(
        None,
        "--pool",
        metavar="PATH",
        help="Pool device or file (default: the manifest's dax device, or the region pool's device setup made; "
        "a file for development).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every command line and environment; start nothing."),
    detach: bool = typer.Option(False, "--detach", help="Return once everything is ready; `status`/`stop` later."),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
    run_dir: str = typer.Option(
        None, "--run-dir", metavar="DIR", help="Logs and state (default: $BELUGACTL_RUN_DIR or a state dir)."
    ),
    vllm: str = typer.Option(
        None, "--vllm", metavar="PROGRAM", help="The vllm program (default: .venv-vllm/bin/vllm, else PATH)."
    ),
    ignore: list[str] = ignore_option("Serve despite this failed doctor check (repeat, or a comma list)."),
    ignore_check: list[str] = hidden_alias("--ignore-check", default=[]),
    skip_doctor: bool = typer.Option(False, "--skip-doctor", help="Do not run doctor before starting."),
    max_restarts: int = typer.Option(
        3, "--max-restarts", metavar="N", help="Restarts of a crashed process before giving up."
    ),
    create_pool: bool = typer.Option(
        False, "--create-pool", help="Create the --pool FILE (sparse, with a header) if missing (development)."
    ),
) -> None:
    """Start the metadata server (where assigned) and one vLLM per GPU group, supervised."""
    import os
    import subprocess
    import sys
    import time

    from belugactl.cli.load_rack import rack_context
    from belugactl.cli.options import checked_ignores
    from belugactl.cli.render import print_json
    from belugactl.workflows.serve.control import prepare, read_state
    from belugactl.workflows.serve.supervisor import Supervisor

    ignores = checked_ignores(ignore, ignore_check)  # a typo fails before anything slow
    rack = rack_context(manifest, host=host, pool=pool)
    prepared = prepare(
        rack,
        run_dir=run_dir,
        vllm=vllm,
        check=not dry_run,
        ignore_checks=ignores,
        skip_doctor=skip_doctor,
        create_pool=create_pool,
    )
    plan = prepared.plan
    if dry_run:
        if as_json:
            print_json(plan.to_dict())
        else:
            _print_plan(plan)
        return
    for note in plan.notes:
        print(f"serve: note: {note}", file=sys.stderr)
    if prepared.doctor_ignored:
        print(f"serve: ignoring failed doctor checks: {', '.join(prepared.doctor_ignored)}", file=sys.stderr)

    if detach:
        # Re-run ourselves without --detach in a new session; wait for the state file to say ready.
        argv = [sys.executable, "-m", "belugactl", "serve", "-f", str(rack.path), "--run-dir", plan.run_dir]
        argv += ["--host", plan.host, "--pool", plan.pool_path, "--max-restarts", str(max_restarts), "--skip-doctor"]
        if vllm:
            argv += ["--vllm", vllm]
        os.makedirs(plan.run_dir, exist_ok=True)
        log_path = os.path.join(plan.run_dir, "supervisor.log")
        with open(log_path, "ab") as log:
            child = subprocess.Popen(  # noqa: S603 - our own interpreter and argv
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        while True:
            time.sleep(0.5)
            state = read_state(plan.run_dir) or {}
            code = child.poll()
            if state.get("supervisor_pid") == child.pid and state.get("state") == "ready":
                break
            if code is not None:
                from belugactl.errors import StepFailed
                from belugactl.workflows.serve.supervisor import exit_why

                raise StepFailed(
                    f"serve did not start (supervisor exited with status {code})",
                    why=exit_why(f"the supervisor exited with status {code}", log_path, 20),
                    fix=f"read {log_path} and the logs under {plan.run_dir}/logs",
                )
        if as_json:
            print_json(state)
        else:
            print(f"serve: ready; supervisor pid {child.pid}; `belugactl status` / `belugactl stop`", file=sys.stderr)
        return

    sup = Supervisor(plan, max_restarts=max_restarts)
    sup.install_signal_handlers()
    with _noting_sigint() as interrupted:
        sup.start()
        if as_json:
            print_json({"state": "ready", **plan.to_dict(), "connectors": sup.connectors})
            sys.stdout.flush()
        else:
            print("serve: all ready; Ctrl-C stops everything", file=sys.stderr)
        sup.run()
    if interrupted:
        # Ctrl-C is an interrupt (exit 130, one line); SIGTERM is a service manager's stop (exit 0).
        from belugactl.cli.interrupt import exit_interrupted

        names = ", ".join(p.name for p in plan.processes)
        exit_interrupted(f"serve stopped everything it started ({names}); state {plan.run_dir} says stopped")


@contextmanager
def _noting_sigint() -> Iterator[list[int]]:
    """Record a SIGINT while still calling the supervisor's own handler (which asks it to stop);
    the supervisor's handler is back afterwards."""
    import signal

    seen: list[int] = []
    supervisor_handler = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)
        if callable(supervisor_handler):
            supervisor_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _print_plan(plan) -> None:  # type: ignore[no-untyped-def]
    import shlex

    print(f"# rack {plan.rack}, host {plan.host}, pool {plan.pool_path}, run dir {plan.run_dir}")
    for p in plan.processes:
        print(f"\n# {p.name}: log {p.log_file}" + (f", ready when {p.health_url} answers 200" if p.health_url else ""))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(p.env.items()))
        print((f"env {env} " if env else "") + shlex.join(p.argv))
        for path, text in p.files:  # written just before the start, e.g. the router's HAProxy config
            body = "\n".join(f"#   {line}" if line else "#" for line in text.splitlines())
            print(f"# {path} (written at start):\n{body}")
    for note in plan.notes:
        print(f"\n# note: {note}")
    for blocker in plan.blockers:
        print(f"\n# WILL NOT START: {blocker}")


RUNNING_HELP = "The rack manifest: refuse if what runs here was started for another rack."


def _check_rack(manifest: str | None, state: dict | None, verb: str) -> None:
    """With -f, the serve found in the run dir must be this manifest's rack (a mix-up is exit 2)."""
    if manifest is None or not state or not state.get("rack"):
        return
    from belugactl.cli.load_rack import rack_context
    from belugactl.errors import UsageError

    name = rack_context(manifest).manifest.name
    if state["rack"] != name:
        started = state.get("manifest")
        raise UsageError(
            f"{verb} -f {manifest}: the serve running here is rack {state['rack']!r}, not {name!r}",
            why=f"its state file names rack {state['rack']!r}" + (f", started from {started}" if started else ""),
            fix=(f"belugactl {verb} -f {started}" if started else f"pass rack {state['rack']!r}'s manifest")
            + f", or --run-dir with the run dir of rack {name!r}'s serve",
        )


def status(
    manifest: str | None = file_option(RUNNING_HELP, required=False),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
    run_dir: str = typer.Option(None, "--run-dir", metavar="DIR", help="The run dir serve used."),
) -> int:
    """What serve started: processes, health, ports, connector counters, pool usage.

    Exit status: 0, also when nothing is running ("nothing is running"); 1 when a supervisor died
    without stopping its processes (`belugactl stop` cleans up).
    """
    from belugactl.cli.render import print_json
    from belugactl.workflows.serve.control import status as read

    doc = read(run_dir)
    _check_rack(manifest, doc, "status")
    if as_json:
        print_json(doc)
    elif doc["state"] == "not started":
        print(f"serve: nothing is running (no serve state in {doc['run_dir']})")
    else:
        print(f"serve: {doc['state']} (run dir {doc['run_dir']})")
        for p in doc["processes"]:
            health = "healthy" if p["healthy"] else ("alive" if p["alive"] else "down")
            line = f"  {p['name']:<16} {p['status']:<10} {health:<8} pid {p['pid']}  port {p['port']}"
            line += f"  restarts {p['restarts']}"
            if p.get("kind") == "vllm":
                from belugactl.workflows.serve.connector_report import describe

                line += "  pool: " + (describe(p["cache"]) if p.get("cache") else "connection unknown")
            print(line)
        pool = doc.get("pool")
        if isinstance(pool, dict):
            from belugactl.units import format_size

            print(
                f"  pool (epoch {pool['epoch']}): {pool['entries']} blocks, {format_size(pool['bytes_used'] or 0)} of "
                f"{format_size(pool['bytes_capacity'] or 0)} used, {pool['evictions']} evictions"
            )
            if pool.get("leader"):
                print(f"  metadata leader: {pool['leader']} ({pool.get('leader_changes') or 0} leader changes seen)")
    # 1 only when something should be serving and is not: a supervisor that died without stopping.
    return 1 if doc["state"] == "supervisor gone" else 0


def stop(
    manifest: str | None = file_option(RUNNING_HELP, required=False),
    as_json: bool = typer.Option(False, "--json", help="Machine output on stdout."),
    run_dir: str = typer.Option(None, "--run-dir", metavar="DIR", help="The run dir serve used."),
) -> None:
    """Stop what serve started: vLLM instances first, then the metadata server.

    Only processes whose recorded identity (pid, start time, command line) still matches are
    signalled. Exit status: 0 when everything is stopped, also when nothing was running
    ("nothing is running"); 3 when the supervisor does not stop.
    """
    from belugactl.cli.render import print_json
    from belugactl.workflows.serve.control import default_run_dir, read_state
    from belugactl.workflows.serve.control import stop as do_stop

    _check_rack(manifest, read_state(run_dir or default_run_dir()), "stop")  # before anything is signalled
    doc = do_stop(run_dir)
    if as_json:
        print_json(doc)
    else:
        print(f"stopped: {', '.join(doc['stopped'])}" if doc["stopped"] else "stop: nothing is running")
        for entry in doc.get("skipped", []):
            print(f"stop: not signalled, no recorded identity (an older state file): {entry}; check it yourself")
