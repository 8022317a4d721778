"""`belugactl doctor`: every named check, one line each with ✓ ! ✗ -, the fixes, and a summary."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import typer

from belugactl.cli.options import file_option, hidden_alias, host_option, ignore_option

# The last line on a host without CXL: the run exits 3, a health check that checked nothing is no pass.
NO_CXL_LINE = (
    "- no CXL memory devices found: nothing to check{ran}; exit 3 (--allow-no-cxl: exit 0 where no CXL is meant)"
)
STYLES = {"ok": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_command(
        file: Path | None = file_option("Rack manifest: check this host against its entry.", required=False),
        manifest: Path | None = hidden_alias("--manifest"),
        host_name: str | None = host_option(
            "The manifest's host entry to check against (default: the one matching the hostname)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout (stable keys)."),
        ignore: list[str] = ignore_option(
            "Downgrade this check's failure to a warning (repeat, or comma list; `all`)."
        ),
        root: Path | None = typer.Option(
            None,
            "--root",
            metavar="DIR|FILE.tar.gz",
            help="Check a captured or fixture host instead of this machine (directory or FILE.tar.gz).",
        ),
        list_checks: bool = typer.Option(False, "--list", help="List every check id and title, then exit."),
        verbose: bool = typer.Option(
            False, "-v", "--verbose", help="Also show each check's title and the facts behind it."
        ),
        allow_no_cxl: bool = typer.Option(
            False,
            "--allow-no-cxl",
            help="Exit 0, not 3, on a host without CXL when nothing failed (CI images, build hosts).",
        ),
        perf: bool = typer.Option(
            False,
            "--perf",
            help="Also measure the pool (a short read-only bench pool) against the manifest's pool.expect.",
        ),
        push_poison: str | None = typer.Option(
            None,
            "--push-poison",
            metavar="URL",
            help="After the checks, POST the report to URL/poison (the metadata server's admin port): it "
            "quarantines the poisoned lines now. Signed with the rack secret beyond loopback.",
        ),
    ) -> None:
        """Run the named health checks (ok / warn / fail / skip, each with its fix). Reads only; changes nothing.

        --perf also runs a short read-only bench of the pool and compares it with pool.expect (warnings only).

        --push-poison URL posts the report to the metadata server's URL/poison (its admin port, e.g.
        http://127.0.0.1:9470) and prints the ranges it queued; an admin port beyond loopback needs the rack
        secret (the manifest's serve.metadata.secret_file, else $BELUGA_KEY_FILE). Not reaching it: exit 3.

        Exit 0 when no check failed, 1 when one did, 2 for bad flags, a bad manifest or a --root that is
        not a host tree, 3 when the host has no CXL at all (nothing to check; --allow-no-cxl: 0)."""
        import contextlib

        from belugactl.cli.options import checked_ignores
        from belugactl.errors import UsageError
        from belugactl.host.host import Host
        from belugactl.workflows.doctor import builtin_registry, run_doctor

        registry = builtin_registry()
        if list_checks:
            _print_list(registry, as_json)
            return
        ignores = checked_ignores(ignore)  # before any slow work: a typo should fail fast
        source = file or manifest
        if host_name is not None and source is None:
            raise UsageError("--host needs a manifest", fix="pass -f rack.yaml together with --host NAME")
        rack = None
        if source is not None:
            from belugactl.cli.load_rack import rack_context

            rack = rack_context(source, host=host_name)
        if root is not None:
            from belugactl.host.capture import open_root

            opened: Any = open_root(root)
        else:
            opened = contextlib.nullcontext(Host.local())
        push = PoisonPush.prepare(push_poison, rack) if push_poison else None  # a bad URL fails before the checks
        probe = perf_probe(rack, root) if perf else None
        with opened as host:
            if root is not None:
                require_host_tree(host, root)
            report = run_doctor(host, rack=rack, ignore=ignores, registry=registry, perf=probe)
        if as_json:
            from belugactl.cli.render import print_json

            print_json(report.to_dict())
        else:
            render_report(report, verbose=verbose, allow_no_cxl=allow_no_cxl)
        if push is not None:
            push.send(report.to_dict(), to_stderr=as_json)  # after doctor's own output: a failure loses none of it
        raise typer.Exit(code=report.exit_code_for(allow_no_cxl=allow_no_cxl))


PUSH_TIMEOUT_S = 10.0  # connect and answer, each: the admin port answers within a loop tick


class PoisonPush:
    """`--push-poison URL`: the report to URL/poison (dataplane/mds/admin.py), signed when needed."""

    def __init__(self, url: str, key: bytes | None) -> None:
        self.url = url
        self.key = key

    @classmethod
    def prepare(cls, base: str, rack: Any) -> PoisonPush:
        from urllib.parse import urlsplit

        from belugactl.dataplane.rpc import auth
        from belugactl.errors import EnvironmentProblem, UsageError

        parts = urlsplit(base.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise UsageError(
                f"--push-poison {base!r} is not an admin URL",
                fix="give the metadata server's admin address, e.g. --push-poison http://127.0.0.1:9470",
            )
        url = base.strip().rstrip("/") + "/poison"
        key = None
        path = auth.secret_path(rack.manifest) if rack is not None else None
        try:
            if path is not None and Path(path).exists():
                key = auth.read_key_file(path, what="rack secret").key
            else:
                cred = auth.client_credential()
                key = cred.key if cred is not None and cred.tenant is None else None
        except EnvironmentProblem:
            if not auth.is_loopback(parts.hostname):
                raise
        if key is None and not auth.is_loopback(parts.hostname):
            raise EnvironmentProblem(
                f"--push-poison {base}: an admin port beyond loopback takes only writes signed with the rack "
                "secret, and none was found",
                fix="pass -f rack.yaml (its serve.metadata.secret_file) or set $BELUGA_KEY_FILE to the rack "
                "secret (mode 0600); or run doctor on the metadata host with http://127.0.0.1:PORT",
            )
        return cls(url, key)

    def body(self, report: dict[str, Any]) -> bytes:
        """The report as JSON; when over the server's body cap, only the poison check (all it reads)."""
        import json

        from belugactl.dataplane.mds.poison import DOCTOR_CHECK, MAX_BODY

        data = json.dumps(report, default=str).encode()
        if len(data) > MAX_BODY:
            checks = [c for c in report.get("checks", []) if isinstance(c, dict) and c.get("id") == DOCTOR_CHECK]
            data = json.dumps({"checks": checks}, default=str).encode()
        return data

    def send(self, report: dict[str, Any], *, to_stderr: bool = False) -> dict[str, Any]:
        import json
        import sys
        import urllib.error
        import urllib.request

        from belugactl.dataplane.rpc import auth
        from belugactl.errors import EnvironmentProblem

        body = self.body(report)
        headers = {"Content-Type": "application/json"}
        if self.key is not None:
            from urllib.parse import urlsplit

            headers[auth.ADMIN_HEADER] = auth.sign_admin_request(self.key, "POST", urlsplit(self.url).path, body)
        req = urllib.request.Request(self.url, data=body, method="POST", headers=headers)  # noqa: S310
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
        try:
            with opener.open(req, timeout=PUSH_TIMEOUT_S) as r:
                status, raw = r.status, r.read(1 << 16)
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read(1 << 16)
        except (OSError, ValueError) as exc:
            raise EnvironmentProblem(
                f"--push-poison: cannot reach {self.url}: {getattr(exc, 'reason', None) or exc}",
                why="the checks above ran; their report was not handed to the metadata server",
                fix="check the admin address (`belugactl status`) and that the server runs, then run again",
            ) from None
        try:
            answer = json.loads(raw or b"{}")
        except ValueError:
            answer = {}
        if not isinstance(answer, dict):
            answer = {}
        if status != 200:
            why = answer.get("error") or raw[:200].decode("utf-8", "replace")
            raise EnvironmentProblem(
                f"--push-poison: {self.url} answered {status}: {why}",
                why="the checks above ran; the metadata server did not take their report",
                fix="401: sign with the rack secret (-f rack.yaml or $BELUGA_KEY_FILE); 403: push from the "
                "metadata host (loopback) or give its admin port the rack secret",
            )
        line = f"pushed the poison report to {self.url}: the server queued {answer.get('queued', 0)} range(s)"
        print(line, file=sys.stderr if to_stderr else sys.stdout)
        return answer


def perf_probe(rack: Any, root: Path | None) -> Any:
    """`--perf`'s probe: the pool by the rack context's rule, or why there is nothing to measure."""
    from belugactl.errors import BelugaError
    from belugactl.workflows.doctor.checks.perf import PerfProbe

    if root is not None:
        return PerfProbe(unavailable="--root: a capture or fixture tree, nothing to measure")
    if rack is None:
        return PerfProbe(unavailable="no manifest: pass -f rack.yaml (it names the pool and pool.expect)")
    try:
        return PerfProbe(pool=rack.pool_path())
    except BelugaError as exc:
        return PerfProbe(unavailable=f"no pool to measure: {exc.what}")


def require_host_tree(host: Any, root: Path) -> None:
    """Refuse a --root that is not a host tree (no sys/, no proc/): every check would skip or guess."""
    from belugactl.errors import UsageError

    if not (host.path("/sys").is_dir() or host.path("/proc").is_dir()):
        raise UsageError(
            f"--root {root} is not a host tree: it has no sys/ and no proc/",
            why="doctor reads a machine's /sys and /proc under --root; in this folder there is nothing to check",
            fix="give a fixture tree (tests/fixtures/beluga-intel) or a bundle from "
            "`belugactl discover --capture bundle.tar.gz`",
        )


def _print_list(registry: Any, as_json: bool) -> None:
    if as_json:
        from belugactl.cli.render import print_json

        # a document, not a bare list, so that it carries schema_version like every other
        print_json({"checks": [{"id": c.id, "title": c.title, "severity": c.severity.value} for c in registry]})
        return
    width = max(len(c.id) for c in registry)
    for check in registry:
        note = "  (warning only)" if check.severity.value == "warning" else ""
        print(f"{check.id:<{width}}  {check.title}{note}")


# Where the reason starts is where its continuation lines start, unless that leaves too little room.
MIN_REASON_COLUMNS = 40
FIX_LABEL = "      fix: "
COMMAND_INDENT = len(FIX_LABEL) + 2


def render_report(report: Any, *, verbose: bool = False, allow_no_cxl: bool = False) -> None:
    """Human output in the manner of flutter doctor and kubeadm preflight.

    The symbols carry the meaning; colour only decorates. Reasons and fixes wrap at the terminal's
    width (80 when piped) with a hanging indent; the shell commands in a fix stay whole, one a line,
    so they can be pasted."""
    from rich.text import Text

    from belugactl.cli.render import stdout_console, text_width, wrap_hanging

    console = stdout_console()
    console.soft_wrap = True  # lines are wrapped here, never again by rich
    columns = text_width()
    head = f"belugactl doctor on {report.hostname}"
    if report.host_entry:
        head += f" (as {report.host_entry} in {report.manifest})"
    for i, line in enumerate(wrap_hanging(head, columns, first=0, indent=2)):
        console.print(Text(line, style="bold" if i == 0 else ""))
    for note in report.notes:
        _print_wrapped(console, f"  • {note}", columns, indent=4, style="dim")
    width = max((len(o.id) for o in report.outcomes), default=0)
    reason_at = 2 + 3 + 1 + width + 2
    hang = reason_at if columns - reason_at >= MIN_REASON_COLUMNS else 6
    topic = None
    for outcome in report.outcomes:
        if outcome.topic != topic:
            topic = outcome.topic
            console.print(Text(f"\n{topic}", style="bold"))
        status = outcome.status.value
        reason = wrap_hanging(outcome.result.reason, columns, first=reason_at, indent=hang)
        style = "dim" if status == "skip" else ""
        line = Text("  ")
        line.append(f"[{outcome.status.symbol}]", style=STYLES[status])
        line.append(f" {outcome.id:<{width}}  ")
        line.append(reason[0], style=style)
        console.print(line)
        for rest in reason[1:]:
            console.print(Text(rest, style=style))
        if outcome.result.fix and status in ("fail", "warn"):
            for i, fix_line in enumerate(fix_lines(outcome.result.fix, columns)):
                text = Text(fix_line)
                if i == 0:
                    text.stylize("bold", 0, len(FIX_LABEL))
                console.print(text)
        if verbose:
            import json

            _print_wrapped(console, f"      checks: {outcome.title}", columns, indent=14, style="dim")
            if outcome.result.details:
                facts = json.dumps(outcome.result.details, sort_keys=True, default=str)
                _print_wrapped(console, f"      facts: {facts}", columns, indent=13, style="dim")
    summary = report.summary()
    console.print()
    console.print(
        Text(
            f"Summary: {summary['ok']} ok, {summary['warn']} warning(s), {summary['fail']} failed, "
            f"{summary['skip']} skipped ({len(report.outcomes)} checks)",
            style="bold",
        )
    )
    failed = [o.id for o in report.outcomes if o.status.value == "fail"]
    ignored = [o.id for o in report.outcomes if o.ignored]
    if ignored:
        _print_wrapped(
            console, f"! failures downgraded by --ignore: {', '.join(ignored)}", columns, indent=2, style="yellow"
        )
    if failed:
        _print_wrapped(console, _failed_hint(report, failed), columns, indent=2, style="red")
    elif summary["warn"]:
        console.print(Text("! No failures; see the warnings above.", style="yellow"))
        if not report.has_cxl and not allow_no_cxl:
            _print_wrapped(console, NO_CXL_LINE.format(ran=""), columns, indent=2, style="yellow")
    elif any(o.status.value == "skip" for o in report.outcomes):
        _print_unchecked(console, report, allow_no_cxl=allow_no_cxl)
    else:
        console.print(Text("✓ No issues found.", style="green"))


def _failed_hint(report: Any, failed: list[str]) -> str:
    """The closing line after failures: `--ignore` is offered only for a check that does not guard data."""
    head = f"✗ {len(failed)} check(s) failed. Apply the fixes above"
    ignorable = [o.id for o in report.outcomes if o.status.value == "fail" and not o.guards_data]
    if ignorable:
        return f"{head}, or, if you know what you are doing, make one non-fatal with --ignore {ignorable[0]}"
    return f"{head}: they guard the pool's data, so do not --ignore them"


def _print_wrapped(console: Any, text: str, columns: int, *, indent: int, style: str = "") -> None:
    from rich.text import Text

    from belugactl.cli.render import wrap_hanging

    lead = len(text) - len(text.lstrip(" "))
    lines = wrap_hanging(text.lstrip(" "), columns, first=lead, indent=indent)
    console.print(Text(" " * lead + lines[0], style=style))
    for line in lines[1:]:
        console.print(Text(line, style=style))


# A fix's parts that are shell commands (pasted as they are) rather than prose.
_COMMAND = re.compile(
    r"(?:sudo )?(?:setpci|echo|daxctl|ndctl|cxl|modprobe|sysctl|systemctl|belugactl|numactl|chown|chmod|"
    r"mkdir|rm|mount|umount|udevadm|grubby|update-grub|nvidia-smi|lspci)\b"
)
# Where prose hands over to a command inside one part: "as root: echo ...", "..., then daxctl ...".
_LEADS = (": ", ", then ", "then ")


def fix_parts(fix: str) -> list[tuple[str, str]]:
    """The fix as ("prose", text) and ("command", text) parts, in order.

    It is split at its top-level "; " (outside parentheses, quotes and backticks); a part holding a
    command after a lead-in ("as root: echo ...") gives the lead-in as prose, then the command, then a
    trailing parenthesis ("(lost at reboot; ...)") as prose again."""
    parts: list[tuple[str, str]] = []
    for segment in _split_top_level(fix, "; "):
        lead, command, tail = _find_command(segment)
        if lead:
            parts.append(("prose", lead))
        if command:
            parts.append(("command", command))
        if tail:
            parts.append(("prose", tail))
    return parts


def fix_lines(fix: str, columns: int) -> list[str]:
    """The fix laid out for `columns`: "fix: " then prose wrapped under itself, each command alone on
    its line (continued with a backslash where one is longer than the line)."""
    from belugactl.cli.render import shell_lines, wrap_hanging

    lines: list[str] = []
    prose: list[str] = []

    def flush() -> None:
        if not prose:
            return
        text = "; ".join(prose).replace(":; ", ": ")
        first = len(FIX_LABEL)
        wrapped = wrap_hanging(text, columns, first=first, indent=first)
        lead = FIX_LABEL if not lines else " " * first
        lines.append(lead + wrapped[0])
        lines.extend(wrapped[1:])
        prose.clear()

    for kind, text in fix_parts(fix):
        if kind == "prose":
            prose.append(text)
            continue
        flush()
        if not lines:
            lines.append(FIX_LABEL.rstrip())
        lines.extend(shell_lines(text, columns, indent=COMMAND_INDENT))
    flush()
    return lines


def _split_top_level(text: str, sep: str) -> list[str]:
    out: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0 and text.startswith(sep, i):
            out.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    out.append(text[start:])
    return [part for part in out if part]


def _find_command(segment: str) -> tuple[str, str, str]:
    """(prose before, the command, prose after) of one part; the command is "" when there is none."""
    start = None
    if _COMMAND.match(segment):
        start = 0
    else:
        for lead in _LEADS:
            at = segment.find(lead)
            while at != -1:
                after = at + len(lead)
                if (lead != "then " or at == 0) and _COMMAND.match(segment, after):
                    start = after
                    break
                at = segment.find(lead, at + 1)
            if start is not None:
                break
    if start is None:
        return segment, "", ""
    lead_text = segment[:start].rstrip()
    rest = segment[start:]
    # the command ends where a top-level parenthesis (its comment) begins
    pieces = _split_top_level(rest, " (")
    command = pieces[0]
    tail = rest[len(command) :].strip()
    return lead_text, command, tail


def _print_unchecked(console: Any, report: Any, *, allow_no_cxl: bool = False) -> None:
    """No failure, but checks were skipped: say what that means instead of a bare "No issues found"."""
    from collections import Counter

    from belugactl.cli.render import text_width

    columns = text_width()
    skipped = [o for o in report.outcomes if o.status.value == "skip"]
    ran = len(report.outcomes) - len(skipped)
    if any(note.startswith("no CXL") for note in report.notes):
        _print_wrapped(
            console,
            "- No CXL found on this host (no CXL bus, memory devices or adapters): nothing CXL could be "
            "checked, so this says nothing about serving a pool here.",
            columns,
            indent=2,
            style="yellow",
        )
    topics = Counter(o.topic for o in skipped)
    _print_wrapped(
        console,
        f"  not checked: {', '.join(f'{t} ({n})' for t, n in topics.items())}",
        columns,
        indent=4,
        style="dim",
    )
    if report.manifest is None:
        _print_wrapped(
            console,
            "  no manifest: pass -f rack.yaml --host H to check this host against its entry",
            columns,
            indent=4,
            style="dim",
        )
    if not report.has_cxl and not allow_no_cxl:
        _print_wrapped(
            console,
            NO_CXL_LINE.format(ran=f" ({ran} generic checks passed, {len(skipped)} skipped)"),
            columns,
            indent=2,
            style="yellow",
        )
        return
    _print_wrapped(
        console,
        f"✓ No issues found in the {ran} checks that ran ({len(skipped)} skipped).",
        columns,
        indent=2,
        style="green",
    )
