"""The README and the CLI agree (issue 34 item 9), and the CLI's help says what every value is.

Every `belugactl ...` line of README.md's code blocks and command table parses with the real Typer
app (parsed, never run); every inline `belugactl ...` names a real command and real flags; every
visible command appears in the README. Walking the whole command tree: every option has help, every
value a metavar that says what it is (not Typer's `<str | None>`), one metavar per flag name, the
manifest's `-f` reads $BELUGA_MANIFEST everywhere, and no example is printed twice in --help.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from belugactl.cli.app import build_app
from tests.support.paths import CPU_DEMO

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
TYPER_DEFAULTS = re.compile(r"<[^>]*>|^(TEXT|STR|INTEGER|INT|FLOAT|BOOLEAN|PATH_TYPE)$")


@cache
def cli() -> Any:
    return typer.main.get_command(build_app())


def commands(cmd: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(path, command) of every visible leaf command, e.g. ("pool show", <command>)."""
    cmd = cmd or cli()
    subs = getattr(cmd, "commands", None)
    if subs is None:
        yield " ".join(path), cmd
        return
    for name, sub in subs.items():
        if not sub.hidden:
            yield from commands(sub, (*path, name))


def visible_params(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if not getattr(p, "hidden", False)]


def parse(words: list[str]) -> str:
    """The command path `words` name, after parsing them as `belugactl` would (without running).

    Raises the parser's own error for an unknown flag, a missing value or a bad one."""
    root = cli()
    if "-h" in words or "--help" in words:  # eager: would print and exit; check the rest leniently
        words = [w for w in words if w not in ("-h", "--help")]
        ctx = root.make_context("belugactl", words, resilient_parsing=True)
    else:
        ctx = root.make_context("belugactl", words)
    cmd, path = root, []
    while hasattr(cmd, "commands"):
        args = [*ctx._protected_args, *ctx.args]
        name, cmd, rest = cmd.resolve_command(ctx, args)
        path.append(name)
        ctx = cmd.make_context(name, rest, parent=ctx, resilient_parsing=ctx.resilient_parsing)
    return " ".join(path)


def shell_commands(line: str) -> Iterator[list[str]]:
    """The `belugactl` words of each simple command in a shell line (comments, `&&`, `|`, `>` cut).

    Lines of a code block that run no belugactl (YAML, output, other tools) give nothing."""
    if not re.search(r"(^|[;&|(]|--)\s*belugactl\s", line):
        return
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    try:
        tokens = [*lexer, ";"]
    except ValueError as exc:  # an unclosed quote: a reader could not paste it either
        yield ["<unparsable>", line, str(exc)]
        return
    for token in tokens:
        if token and set(token) <= set(";&|<>()"):
            if words[:1] == ["belugactl"]:
                yield [unbracket(w) for w in words[1:]]
            words = []
            if token in (">", "<", ">>"):
                words = ["<redirect>"]  # its target is not a command
        else:
            words.append(token)


def unbracket(word: str) -> str:
    """A synopsis's `[--json]` as `--json`; a node set such as `lab-[1-2]` stays as it is."""
    word = word.removeprefix("[") if word.startswith("[-") else word
    return word[:-1] if word.count("]") > word.count("[") else word


def code_block_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command line) in fenced blocks; `$ ` prompts dropped, `\\` continuations joined."""
    inside, pending, start = False, "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        line = raw.removeprefix("$ ")
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def expand(words: list[str]) -> Iterator[list[str]]:
    """A command-table synopsis as command lines: `[--json]` is `--json`, `doctor\\|setup` is each."""
    node = cli()
    for i, word in enumerate(words):
        subs = getattr(node, "commands", None)
        if subs is None:
            break
        names = word.split("|")
        if len(names) > 1 and all(n in subs for n in names):
            for name in names:
                yield from expand([*words[:i], name, *words[i + 1 :]])
            return
        node = subs.get(word)
        if node is None:
            break
    yield words


def table_synopses(text: str) -> Iterator[tuple[int, list[str]]]:
    """The first column of the README's command table, as word lists."""
    for number, line in enumerate(text.splitlines(), 1):
        cell = re.match(r"\| `(belugactl [^`]+)` \|", line)
        if cell:
            plain = cell.group(1).replace("\\|", "|").replace("[", "").replace("]", "")
            for words in expand(plain.split()[1:]):
                yield number, words


def inline_spans(text: str) -> Iterator[tuple[int, list[str]]]:
    """`belugactl ...` spans in prose (outside code blocks and the command table)."""
    inside = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
            continue
        if inside or line.startswith("| `belugactl"):
            continue
        for span in re.findall(r"`(belugactl [^`]*)`", line):
            yield number, span.split()[1:]


def command_of(words: list[str]) -> tuple[str, Any]:
    """The longest command path at the front of `words`, and its command."""
    node, path = cli(), []
    for word in words:
        subs = getattr(node, "commands", None)
        if subs is None or word not in subs:
            break
        node = subs[word]
        path.append(word)
    return " ".join(path), node


def flags_of(cmd: Any) -> set[str]:
    names = {"-h", "--help"}
    for p in cmd.params:
        names.update(getattr(p, "opts", []))
        names.update(getattr(p, "secondary_opts", []))
    return names


def readme_entries() -> list[tuple[str, int, list[str]]]:
    text = README.read_text()
    entries = [("code", n, w) for n, line in code_block_lines(text) for w in shell_commands(line)]
    entries += [("table", n, w) for n, w in table_synopses(text)]
    return entries


def problems_parsing(entries: list[tuple[str, int, list[str]]], where: str) -> list[str]:
    bad = []
    for _kind, number, words in entries:
        try:
            parse(words)
        except Exception as exc:  # the parser's usage errors: what a user would have been told
            message = exc.format_message() if hasattr(exc, "format_message") else repr(exc)
            bad.append(f"{where}:{number}: belugactl {shlex.join(words)}: {message}")
    return bad


@pytest.fixture(autouse=True)
def _no_manifest_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BELUGA_MANIFEST", raising=False)


def test_the_readme_finds_its_commands():
    # The extractors themselves: a README reshuffle that hid every command would pass the tests below.
    kinds = {kind for kind, _, _ in readme_entries()}
    assert kinds == {"code", "table"}
    assert len(readme_entries()) > 40


def test_every_readme_command_line_parses():
    assert problems_parsing(readme_entries(), "README.md") == []


def test_every_docs_command_line_parses():
    bad = []
    for doc in DOCS:
        entries = [("code", n, w) for n, line in code_block_lines(doc.read_text()) for w in shell_commands(line)]
        bad += problems_parsing(entries, str(doc.relative_to(ROOT)))
    assert bad == []


def test_inline_readme_commands_name_real_commands_and_flags():
    bad = []
    for number, words in inline_spans(README.read_text()):
        path, cmd = command_of(words)
        rest = words[len(path.split()) if path else 0 :]
        if hasattr(cmd, "commands") and rest and not rest[0].startswith("-"):
            bad.append(f"README.md:{number}: no command `belugactl {path} {rest[0]}`")
        unknown = [w for w in rest if w.startswith("-") and w != "--" and w.split("=")[0] not in flags_of(cmd)]
        if unknown:
            bad.append(f"README.md:{number}: `belugactl {path}` has no {', '.join(unknown)}")
    assert bad == []


def test_every_command_appears_in_the_readme():
    text = README.read_text()
    named = {parse(w) for _, _, w in readme_entries()}
    named |= {command_of(w)[0] for _, w in inline_spans(text)}
    assert sorted(path for path, _ in commands() if path not in named) == []


def test_the_parser_checks_rejects_what_the_cli_rejects():
    # The two papercuts the issue found: the test's parser must reject them as the CLI did before.
    with pytest.raises(Exception, match="No such option"):
        parse(["lab", "status", "-f", "rack.yaml"])
    assert problems_parsing([("code", 1, ["serve", "--no-such-flag"])], "x") != []
    assert list(expand(["rack", "doctor|setup", "-f", "r.yaml"])) == [
        ["rack", "doctor", "-f", "r.yaml"],
        ["rack", "setup", "-f", "r.yaml"],
    ]


def test_status_and_export_grafana_take_the_manifest():
    assert parse(["status", "-f", "rack.yaml"]) == "status"
    assert parse(["stop", "-f", "rack.yaml"]) == "stop"
    assert parse(["export", "grafana", "-f", "rack.yaml"]) == "export grafana"


def test_every_value_has_a_metavar_that_says_what_it_is():
    bad = set()
    for path, cmd in commands():
        for p in visible_params(cmd):
            if getattr(p, "is_flag", False) or getattr(p, "count", False):
                continue
            if p.metavar is None or TYPER_DEFAULTS.search(p.metavar):
                bad.add((path, p.opts[0] if p.param_type_name == "argument" else p.opts[-1]))
    assert sorted(bad) == []


def test_every_option_and_argument_has_help():
    bad = {(path, p.opts[-1]) for path, cmd in commands() for p in visible_params(cmd) if not (p.help or "").strip()}
    assert sorted(bad) == []


NUMBERS = {"N", "PORT", "SECONDS", "MS", "FRACTION", "MIB"}


def value_kind(option: Any) -> str:
    """What an option's value is: a number, or a word (a path, a name, a node set); Typer's own
    type when no metavar says it (a rack option today)."""
    if option.metavar is None:
        number = re.fullmatch(r"(int|float)( \| None)?", str(option.type_descriptor.annotation))
        return "number" if number else "word"
    return "number" if option.metavar in NUMBERS else "word"


def test_one_flag_name_names_one_kind_of_value():
    # `--hosts` was a count in `lab up` and a node set in `rack`: a flag name is a number everywhere or nowhere.
    seen: dict[str, dict[str, str]] = {}
    for path, cmd in commands():
        for p in visible_params(cmd):
            if p.param_type_name != "option" or getattr(p, "is_flag", False):
                continue
            for opt in p.opts:
                if opt.startswith("--"):
                    seen.setdefault(opt, {})[value_kind(p)] = path
    assert {opt: kinds for opt, kinds in seen.items() if len(kinds) > 1} == {}


def test_every_manifest_flag_reads_beluga_manifest():
    bad = []
    for path, cmd in commands():
        for p in cmd.params:
            opts = getattr(p, "opts", [])
            if "-f" in opts and ("--file" not in opts or p.envvar != "BELUGA_MANIFEST"):
                bad.append(f"{path}: {'/'.join(opts)} envvar={p.envvar}")
    assert bad == []


def test_beluga_manifest_is_the_manifest_when_f_is_absent(cli, monkeypatch):
    monkeypatch.setenv("BELUGA_MANIFEST", str(CPU_DEMO))
    result = cli("manifest", "check", "--json")
    assert result.code == 0, result.stderr
    assert str(CPU_DEMO) in result.stdout or CPU_DEMO.name in result.stdout


def help_text(path: str) -> str:
    """What `belugactl PATH --help` prints, rendered from the app built once (a build per command is slow)."""
    node = cli()
    ctx = node.make_context("belugactl", path.split(), resilient_parsing=True)
    for name in path.split():
        node = node.commands[name]
        ctx = node.make_context(name, [], parent=ctx, resilient_parsing=True)
    return node.get_help(ctx)


def test_help_text_is_what_the_cli_prints():
    from tests.cli.conftest import invoke

    assert help_text("pool show") == invoke("pool", "show", "--help").stdout.rstrip("\n")


@pytest.mark.parametrize("path", [path for path, _ in commands()])
def test_help_prints_each_example_once(path):
    text = help_text(path)
    assert len(re.findall(r"^\s*Examples?:", text, flags=re.M)) <= 1, text
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("belugactl ")]
    assert len(examples) == len(set(examples)), text


def test_setup_help_lists_every_topic():
    from belugactl.workflows.setup.topics import topic_ids

    for path in ("setup", "plan"):
        text = " ".join(help_text(path).split())
        missing = [t for t in topic_ids() if not re.search(rf"\b{re.escape(t)}\b", text)]
        assert missing == [], f"{path} --help lacks {missing}"


def test_lab_up_counts_guests_with_count_and_warns_on_the_old_hosts(capsys):
    from belugactl.cli import app as app_module
    from belugactl.cli.lab_cmd import _guest_count

    assert _guest_count(None, None) == 2
    assert _guest_count(3, None) == 3
    assert capsys.readouterr().err == ""
    assert _guest_count(None, 3) == 3  # the old spelling still works for one release
    assert "--hosts 3 is deprecated" in capsys.readouterr().err
    assert app_module.run(["lab", "up", "--count", "2", "--hosts", "2"]) == 2
    assert "both given" in capsys.readouterr().err
    assert app_module.run(["lab", "up", "--count", "17"]) == 2
    assert "--count must be between 1 and 16" in capsys.readouterr().err
    assert "--hosts" not in help_text("lab up")


def test_lab_coldstart_takes_the_manifest_as_f_file_and_keeps_manifest_hidden():
    params = {p.name: p for p in dict(commands())["lab coldstart"].params}
    assert params["file"].opts == ["-f", "--file"] and params["file"].envvar == "BELUGA_MANIFEST"
    assert params["manifest"].hidden and params["manifest"].opts == ["--manifest"]
    assert parse(["lab", "coldstart", "--manifest", "x.yaml"]) == "lab coldstart"
    assert "--manifest" not in help_text("lab coldstart")


@pytest.mark.parametrize("verb", ["status", "stop"])
def test_status_and_stop_with_f_refuse_another_racks_serve(verb, cli, tmp_path):
    import json

    from belugactl.workflows.serve.control import STATE_FILE

    (tmp_path / STATE_FILE).write_text(json.dumps({"rack": "other-rack", "state": "stopped", "processes": []}))
    wrong = cli(verb, "-f", str(CPU_DEMO), "--run-dir", str(tmp_path))
    assert wrong.code == 2
    assert "rack 'other-rack', not 'cpu-demo'" in wrong.stderr
    assert cli(verb, "--run-dir", str(tmp_path)).code == 0  # without -f: as before


def test_export_grafana_with_f_opens_on_the_rack(cli):
    import json

    doc = json.loads(cli("export", "grafana", "-f", str(CPU_DEMO)).stdout)
    assert doc["title"].endswith("(cpu-demo)")
    rack = next(v for v in doc["templating"]["list"] if v["name"] == "rack")
    assert rack["current"]["value"] == ["cpu-demo"]
    plain = json.loads(cli("export", "grafana").stdout)
    assert "cpu-demo" not in json.dumps(plain)
