"""The layers in docs/architecture.md, enforced: every import of every module, and no import cycles.

The rule is the `layers` block next to the table in docs/architecture.md (read here, so the doc and
the test cannot drift). Imports count at module level and inside functions; `from . import x` is
resolved. Imports under `if TYPE_CHECKING:` are exempt from both checks: they never run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PLUGIN = "plugins/vllm_beluga/vllm_beluga"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (a submodule when `from pkg import sub` names one), dotted
    path: str  # the importing file, relative to the root walked
    line: int
    in_function: bool


@dataclass(frozen=True)
class Rules:
    leaf: frozenset[str]
    allowed: dict[str, frozenset[str]]  # layer -> the layers (or single modules) it may import
    module_level: dict[str, frozenset[str]]  # layer -> what it may import at module level (cli: --help speed)
    plugin: frozenset[str]

    def layer_of(self, module: str) -> str | None:
        found = [layer for layer in self.allowed if module == layer or module.startswith(layer + ".")]
        return max(found, key=len) if found else None

    def may_import(self, layer: str, target: str, allowed: frozenset[str]) -> bool:
        if target in self.leaf or self.layer_of(target) == layer:
            return True
        for entry in allowed:
            if entry in self.allowed:  # a layer: the target's own layer must be it, not a layer inside it
                if self.layer_of(target) == entry:
                    return True
            elif target == entry or target.startswith(entry + "."):  # a single module (dataplane.native)
                return True
        return False


def parse_rules(text: str) -> Rules:
    found = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert found, f"{ARCHITECTURE}: no ```layers block next to the layer table"
    leaf: frozenset[str] = frozenset()
    allowed: dict[str, frozenset[str]] = {}
    module_level: dict[str, frozenset[str]] = {}
    plugin: frozenset[str] = frozenset()
    for raw in found.group(1).splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        key, _, rest = raw.partition(":")
        names = frozenset(rest.split())
        if key == "leaf modules":
            leaf = names
        elif key == PLUGIN:
            plugin = names
        elif key.endswith(" at module level"):
            module_level[key.removesuffix(" at module level")] = names
        else:
            allowed[key] = names
    return Rules(leaf, allowed, module_level, plugin)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module under root/package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_edges(root: Path, package: str) -> Iterator[Import]:
    """Every import of a module under root/package, except those under `if TYPE_CHECKING:`."""
    known = modules(root, package)
    for name, path in known.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        rel = str(path.relative_to(root))

        def visit(node: ast.AST, in_function: bool, name: str = name, here: list[str] = here, rel: str = rel):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for other in child.orelse:
                        yield from visit_one(other, in_function)
                    continue
                yield from visit_one(child, in_function)

        def visit_one(node: ast.AST, in_function: bool, name: str = name, here: list[str] = here, rel: str = rel):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(name, alias.name, rel, node.lineno, in_function)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    yield Import(name, sub if sub in known else module, rel, node.lineno, in_function)
            else:
                inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                yield from visit(node, inner)

        yield from visit(ast.parse(path.read_text(encoding="utf-8"), filename=rel), False)


def layer_violations(edges: Iterable[Import], rules: Rules) -> list[str]:
    problems: list[str] = []
    for e in edges:
        if e.source == e.target or (e.target != "belugactl" and not e.target.startswith("belugactl.")):
            continue
        layer = "leaf modules" if e.source in rules.leaf else rules.layer_of(e.source)
        if layer is None:
            problems.append(f"{e.path}:{e.line}: {e.source} is in no layer of {ARCHITECTURE.name}'s layers block")
            continue
        allowed = rules.allowed.get(layer, frozenset())
        if not rules.may_import(layer, e.target, allowed):
            where = "inside a function" if e.in_function else "at module level"
            shown = " ".join(sorted(allowed)) or "nothing"
            problems.append(f"{e.path}:{e.line}: {e.source} imports {e.target} ({where}); "
                            f"the rule `{layer}: {shown}` (plus itself and the leaf modules) does not allow it")
            continue
        at_top = rules.module_level.get(layer)
        if at_top is not None and not e.in_function and not rules.may_import(layer, e.target, at_top):
            problems.append(f"{e.path}:{e.line}: {e.source} imports {e.target} at module level; the rule "
                            f"`{layer} at module level: {' '.join(sorted(at_top))}` wants it inside the function")
    return list(dict.fromkeys(problems))  # `from m import a, b` is one problem, not two


def cycles(edges: Iterable[Import]) -> list[str]:
    """Each set of modules that import each other (a strongly connected component), with its imports."""
    graph: dict[str, dict[str, Import]] = {}
    for e in edges:
        if e.source != e.target:
            graph.setdefault(e.source, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    reports = []
    for component in sorted(found):
        members = set(component)
        lines = [
            f"  {e.path}:{e.line}: {e.source} -> {e.target}{' (inside a function)' if e.in_function else ''}"
            for v in component for w, e in sorted(graph[v].items()) if w in members
        ]
        reports.append("import cycle between " + ", ".join(component) + ":\n" + "\n".join(lines))
    return reports


def _rules() -> Rules:
    return parse_rules(ARCHITECTURE.read_text(encoding="utf-8"))


def test_every_import_in_belugactl_follows_the_layer_table():
    problems = layer_violations(import_edges(REPO, "belugactl"), _rules())
    assert not problems, "upward imports (docs/architecture.md, Layers):\n" + "\n".join(problems)


def test_no_module_in_belugactl_is_part_of_an_import_cycle():
    found = cycles(import_edges(REPO, "belugactl"))
    assert not found, "\n".join(found)


def test_the_plugin_imports_only_the_dataplane_the_pool_and_leaf_modules():
    rules = _rules()
    problems = []
    for e in import_edges(REPO / "plugins" / "vllm_beluga", "vllm_beluga"):
        if (e.target == "belugactl" or e.target.startswith("belugactl.")) and not (
            e.target in rules.leaf or any(e.target == a or e.target.startswith(a + ".") for a in rules.plugin)
        ):
            problems.append(f"plugins/vllm_beluga/{e.path}:{e.line}: {e.source} imports {e.target}; the rule "
                            f"`{PLUGIN}: {' '.join(sorted(rules.plugin))}` (plus the leaf modules) does not allow it")
    assert rules.plugin, "the layers block has no plugin line"
    assert not problems, "\n".join(problems)


def test_the_layers_block_and_the_table_name_the_same_layers_and_cover_every_package():
    rules = _rules()
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = {
        "belugactl." + m.group(1).strip("/").replace("/", ".")
        for m in re.finditer(r"^\| `([a-z_/]+/)` \|", text, re.M)
    }
    packages = {layer for layer in rules.allowed if (REPO / layer.replace(".", "/")).is_dir()}
    assert table == packages, f"the table's layers {sorted(table)} differ from the block's {sorted(packages)}"
    top = {f"belugactl.{p.parent.name}" for p in (REPO / "belugactl").glob("*/__init__.py")}
    assert top <= packages, f"packages with no layer: {sorted(top - packages)}"


# --- the checker itself, on a made-up package --------------------------------------------------
RULES_TEXT = """
```layers
leaf modules: pkg.errors
pkg.cli: pkg.low
pkg.cli at module level: pkg.cli
pkg.low:
```
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _rename(edges: Iterable[Import]) -> list[Import]:  # the made-up package is `pkg`, checked as if belugactl
    return [Import(e.source.replace("pkg", "belugactl", 1), e.target.replace("pkg", "belugactl", 1), e.path,
                   e.line, e.in_function) for e in edges]


def test_the_checker_finds_an_upward_import_inside_a_function_and_names_file_line_and_rule(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "", "pkg/errors.py": "", "pkg/cli/__init__.py": "", "pkg/low/__init__.py": "",
        "pkg/cli/app.py": "from pkg.cli import options\nfrom pkg import errors\n\n"
                          "def main():\n    from pkg.low import a\n",
        "pkg/cli/options.py": "",
        "pkg/low/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.cli import app\n\n"
                        "def f():\n    from ..cli import app\n    return app\n",
    })  # fmt: skip
    rules = parse_rules(RULES_TEXT.replace("pkg", "belugactl"))
    problems = layer_violations(_rename(import_edges(tmp_path, "pkg")), rules)
    assert problems == [
        "pkg/low/a.py:6: belugactl.low.a imports belugactl.cli.app (inside a function); "
        "the rule `belugactl.low: nothing` (plus itself and the leaf modules) does not allow it"
    ]


def test_the_checker_wants_cli_imports_inside_the_function(tmp_path):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/cli/__init__.py": "", "pkg/low/__init__.py": "", "pkg/low/a.py": "",
                      "pkg/cli/app.py": "import pkg.low.a\n"})
    rules = parse_rules(RULES_TEXT.replace("pkg", "belugactl"))
    problems = layer_violations(_rename(import_edges(tmp_path, "pkg")), rules)
    assert len(problems) == 1
    assert problems[0].startswith("pkg/cli/app.py:1: belugactl.cli.app imports belugactl.low.a at module level")


def test_the_checker_finds_a_cycle_hidden_inside_functions_but_not_one_under_type_checking(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "def f():\n    from pkg import b\n",
        "pkg/b.py": "def g():\n    from . import a\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg/d.py": "import pkg.c\n",
    })  # fmt: skip
    found = cycles(import_edges(tmp_path, "pkg"))
    assert found == [
        "import cycle between pkg.a, pkg.b:\n"
        "  pkg/a.py:2: pkg.a -> pkg.b (inside a function)\n"
        "  pkg/b.py:2: pkg.b -> pkg.a (inside a function)"
    ]
