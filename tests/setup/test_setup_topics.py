"""The topic registry, the one --force gate, and the shape of the setup package (no import cycle)."""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

import pytest

from belugactl.errors import InputError
from belugactl.model.setup_plan import Step, WriteAttr
from belugactl.workflows.setup import force, topics
from belugactl.workflows.setup.applier import run_setup, run_teardown
from belugactl.workflows.setup.force import ForceRequired
from tests.support.fake_machine import lab_target

SETUP = Path(topics.__file__).resolve().parents[1]


def test_topic_ids_in_planning_order_and_the_boot_units_share():
    assert topics.topic_ids() == (
        "autoonline", "region", "devdax", "permissions", "header", "hugepages", "thp", "ddio", "mtrr", "secret"
    )
    assert topics.boot_topic_ids() == ("autoonline", "permissions", "hugepages", "thp", "ddio", "mtrr")
    assert topics.persistent_topic_ids() == ("region", "devdax", "header", "secret")
    from belugactl.workflows.setup.systemd import unit_text

    assert "--only autoonline,permissions,hugepages,thp,ddio,mtrr " in unit_text("/m.yaml", "h1", ["belugactl"])


def test_each_topic_module_is_named_after_its_topic_and_plans_steps_of_it(lab1):
    for topic in topics.all_topics():
        module = sys.modules[f"{topics.__name__}.{topic.id}"]
        assert module.TOPIC is topic
    plan = run_setup(lab1.host, lab_target(), dry_run=True).initial
    assert plan.steps and all(s.topic == s.id.split(".")[0] for s in plan.steps)


# --- adding a topic is adding a module ------------------------------------------------------------------
NEW_TOPIC = '''
from dataclasses import dataclass
from typing import ClassVar

from belugactl.model.setup_plan import Step, WriteAttr
from belugactl.workflows.setup.topic import Planned, SetupTopic

PATH = "/proc/sys/vm/demo_knob"


@dataclass(frozen=True)
class Poke:  # an action type of the topic's own, with its executor below
    kind: ClassVar[str] = "demo-poke"
    path: str

    def display(self):
        return f"poke {self.path}"


def poke(ctx, action):
    ctx.host.write_text(action.path, "poked\\n")
    return "poked"


def observe(host, target, facts):
    facts.extra["zdemo"] = (host.read_text(PATH) or "").strip()


def plan(target, facts):
    if facts.extra["zdemo"] == "7":
        return Planned()
    return Planned(steps=[Step(id="zdemo.knob", topic="zdemo", summary="demo knob to 7",
                               actions=(WriteAttr(PATH, "7"), Poke("/run/demo")), subject="knob")])


def check_write(action, back):
    return f"knob reads {back.strip()}"


def record(step, target, facts, state, verb):
    state.setdefault("created", {})["zdemo"] = step.subject if verb == "setup" else None


TOPIC = SetupTopic(id="zdemo", order=45, summary="a demo", plan=plan, observe=observe, check_write=check_write,
                   record=record, executors={Poke: poke})
'''


@pytest.fixture
def extra_topic(tmp_path):
    folder = tmp_path / "more_topics"
    folder.mkdir()
    (folder / "zdemo.py").write_text(textwrap.dedent(NEW_TOPIC))
    topics.__path__.append(str(folder))
    topics.all_topics.cache_clear()
    yield
    topics.__path__.remove(str(folder))
    sys.modules.pop(f"{topics.__name__}.zdemo", None)
    topics.all_topics.cache_clear()


def test_a_new_module_is_a_new_topic_planned_applied_and_recorded(extra_topic, lab1):
    import json

    assert topics.topic_ids()[5] == "zdemo"  # order 45: after the header, before hugepages
    lab1.write("proc/sys/vm/demo_knob", "0\n")
    report = run_setup(lab1.host, lab_target(), only=["zdemo"])
    assert [(o.step.id, o.detail) for o in report.applied] == [("zdemo.knob", "knob reads 7; poked")]
    assert report.to_dict()["plan"]["steps"][0]["actions"][1] == {
        "kind": "demo-poke", "display": "poke /run/demo", "path": "/run/demo"}
    assert lab1.read("run/demo") == "poked\n"
    assert json.loads(lab1.read("var/lib/belugactl/state.json"))["created"]["zdemo"] == "knob"
    assert lab1.read("proc/sys/vm/demo_knob").strip() == "7"
    assert run_setup(lab1.host, lab_target(), only=["zdemo"]).applied == []
    assert "zdemo" in topics.boot_topic_ids()


# --- the --force gate ---------------------------------------------------------------------------------
def _step(id: str, **kw) -> Step:
    return Step(id=id, topic="t", summary=f"do {id}", actions=(WriteAttr("/x", "1"),), **kw)


def test_force_resolve_raises_refusals_and_takes_replacements():
    refused = _step("a", destroys_data=True, refusal=InputError("no: a would destroy b"))
    with pytest.raises(InputError, match="would destroy b"):
        force.resolve([_step("ok"), refused], force=False)
    assert force.resolve([refused], force=True) == [refused]
    take = _step("take", destroys_data=True)
    wait = _step("wait", forced=take)
    assert force.resolve([wait], force=False) == [wait]
    assert force.resolve([wait], force=True) == [take]


def test_refuse_without_force_names_every_destroying_step():
    steps = [_step("keep"), _step("gone", destroys_data=True, note="it holds the pool"),
             _step("also", destroys_data=True)]
    with pytest.raises(ForceRequired) as err:
        force.refuse_without_force(steps, force=False)
    assert err.value.what == "2 step(s) would destroy data; nothing was changed"
    assert err.value.why == "gone: do gone (it holds the pool)\nalso: do also"
    force.refuse_without_force(steps, force=True)


def test_teardown_asks_topics_in_reverse_order(lab1):
    run_setup(lab1.host, lab_target())
    plan = run_teardown(lab1.host, lab_target(), dry_run=True).initial
    order = [topics.topic_ids().index(s.topic) for s in plan.steps]
    assert order == sorted(order, reverse=True) and len(order) == 5


# --- the package's shape ------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """Modules of workflows.setup that `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n.startswith("belugactl.workflows.setup.") and _module_file(n)}
    return found


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[3:])
    for candidate in (SETUP / f"{rel}.py", SETUP / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_no_import_cycle_in_setup():
    graph = {}
    for path in SETUP.rglob("*.py"):
        rel = path.relative_to(SETUP).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        graph["belugactl.workflows.setup" + "".join("." + p for p in parts)] = _imports(path)
    # The registry imports topic modules by discovery, not by name: add those edges too.
    graph["belugactl.workflows.setup.topics"] |= {f"belugactl.workflows.setup.topics.{t}" for t in topics.topic_ids()}
    visiting, done = [], set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, " -> ".join([*visiting[visiting.index(node):], node])
        visiting.append(node)
        for dep in graph.get(node, ()):
            visit(dep)
        visiting.pop()
        done.add(node)

    for node in graph:
        visit(node)
    # The base modules know no topic: that is what keeps a topic to its own module.
    for base in ("target", "facts", "topic", "force", "pool_lookup"):
        assert graph[f"belugactl.workflows.setup.{base}"] <= {
            "belugactl.workflows.setup.facts", "belugactl.workflows.setup.target"}, base


@pytest.mark.process
def test_importing_each_module_first_works():
    """Each module imported first, in a fresh interpreter's module table (a cycle shows up as an ImportError)."""
    import subprocess

    script = textwrap.dedent("""
        import importlib, sys
        for name in ("target", "facts", "topics.header", "topics.ddio", "observe", "planner", "applier", "systemd"):
            for mod in [m for m in sys.modules if m.startswith("belugactl.workflows.setup")]:
                del sys.modules[mod]
            importlib.import_module("belugactl.workflows.setup." + name)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
