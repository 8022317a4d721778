"""`belugactl pd-proxy`: the prefill/decode front door (serve starts it where serve.router says)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("pd-proxy")(pd_proxy)


def pd_proxy(
    prefill: list[str] = typer.Option(
        ..., "--prefill", metavar="URL", help="A producer instance, http://HOST:PORT (repeatable)."
    ),
    decode: list[str] = typer.Option(
        ..., "--decode", metavar="URL", help="A consumer instance, http://HOST:PORT (repeatable)."
    ),
    bind: str = typer.Option(
        "127.0.0.1", "--bind", metavar="HOST", help="Address to listen on (loopback unless you open it)."
    ),
    port: int = typer.Option(8090, "--port", metavar="PORT", min=1, max=65535, help="Port to listen on."),
) -> None:
    """Send each completion to a producer (prompt only, its KV saved to the pool), then to a consumer
    (loads the KV, decodes); the consumer's answer is the client's. Runs until SIGTERM (exit 0) or Ctrl-C (exit 130)."""
    import signal
    import sys
    import threading

    from belugactl.cli.bind_address import checked_bind
    from belugactl.errors import EnvironmentProblem, UsageError
    from belugactl.workflows.serve.pd_proxy import PdProxy, make_server

    bind = checked_bind(bind) or bind  # a bad address is a usage error, not a busy port
    try:
        proxy = PdProxy(prefill, decode)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        server = make_server(proxy, bind, port)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot listen on {bind}:{port}: {exc.strerror or exc}", fix="pick a free serve.router.port"
        ) from None

    def stop(_signum: int, _frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    interrupted = False
    try:  # the start line inside: a Ctrl-C right after it is still this interrupt, with its state
        print(
            f"pd-proxy on {bind}:{port}: prefill {', '.join(prefill)}; decode {', '.join(decode)}",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        server.server_close()
    if interrupted:
        from belugactl.cli.interrupt import exit_interrupted

        exit_interrupted(f"stopped listening on {bind}:{port}; requests in flight were cut off")
