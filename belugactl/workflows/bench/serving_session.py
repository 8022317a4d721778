"""The engines around one `bench serve`: the serve already running, or one started per engine
setting (stopped before the next), plus the ExampleConnector instance where asked for."""

from __future__ import annotations

import secrets
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from belugactl.errors import UsageError
from belugactl.workflows.bench import serving as bench_serve
from belugactl.workflows.bench import serving_engines as engines
from belugactl.workflows.bench.serving_baselines import ExampleInstance

if TYPE_CHECKING:
    from belugactl.workflows.rack_context import RackContext
    from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan


@dataclass(frozen=True)
class BenchOptions:
    lengths: list[int]
    rounds: int = 3
    via_router: bool = False
    example_connector: bool = False
    concurrent: int = 0
    run_dir: str | None = None
    vllm: str | None = None
    create_pool: bool = False


def _vllm_specs(plan: ServePlan) -> list[ProcessSpec]:
    return [p for p in plan.processes if p.kind == "vllm" and p.port is not None]


class _ExampleEngine:
    """vLLM with the ExampleConnector on B's argv, supervised apart (its own run dir and state file),
    its KV files in a directory removed afterwards."""

    def __init__(self, plan: ServePlan, b: ProcessSpec, setting: str, run_dir: Path, say: Callable[[str], None]):
        from belugactl.workflows.serve.supervisor import Supervisor

        home = run_dir / "bench-example"
        self.storage = home / f"kv-{setting}-{secrets.token_hex(3)}"
        port = engines.free_port()
        log = run_dir / "logs" / f"vllm-example-{setting}.log"
        spec = engines.example_connector_spec(b, port=port, storage=self.storage, log_file=log)
        self.supervisor = Supervisor(engines.example_plan(plan, spec, home), say=say, max_restarts=0)
        self.instance = ExampleInstance(port=port, log_file=str(log))
        self.error: BaseException | None = None
        say(f"bench serve: starting vLLM with the ExampleConnector on port {port} (B's argv; log {log})")

    def start(self) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        try:
            self.supervisor.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            self.error = exc

    def abort(self) -> None:
        self.supervisor._stop_requested = True  # its start gives up at its next readiness poll

    def stop(self) -> None:
        self.supervisor.stop()
        shutil.rmtree(self.storage, ignore_errors=True)


def _label(setting: str | None) -> str:
    return engines.describe(setting) if setting else "as running"


def run_sessions(
    rack: RackContext,
    current: dict[str, Any],
    settings: list[str] | None,
    options: BenchOptions,
    *,
    say: Callable[[str], None],
    on_doc: Callable[[dict[str, Any]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """One document per engine setting (one, as running, when serve was already up); `on_doc` gets
    each as soon as its setting is measured (a table printed before the next setting's minutes)."""
    from belugactl.workflows.serve.control import prepare

    loaded = rack.manifest
    block = loaded.block_size_on(loaded.hosts[0]) if len(loaded.hosts) == 1 else 16
    if current["running"]:
        say(f"bench serve: using the serve running in {current['run_dir']}")
        procs = [p for p in current["processes"] if p["kind"] == "vllm"]
        routers = [p["port"] for p in current["processes"] if p["kind"] == "router"]
        plan = prepare(rack, run_dir=current["run_dir"], vllm=options.vllm, check=False).plan
        specs = _vllm_specs(plan)
        if not procs or not specs:
            raise UsageError("the manifest runs no vLLM instance on this host")
        b_spec = specs[1] if len(specs) > 1 else specs[0]
        stats = [p.get("stats_prefix") for p in procs]
        example = None
        if options.example_connector:
            example = _ExampleEngine(plan, b_spec, "running", Path(current["run_dir"]), say)
            example.start()
        try:
            if example is not None and example.error is not None:
                raise example.error
            doc = _measure(
                [p["port"] for p in procs],
                stats,
                routers,
                None,
                example,
                options,
                block,
                say,
                local_hit=engines.prefix_caching_on(b_spec.argv),
            )
        finally:
            if example is not None:
                example.stop()
        on_doc(doc)
        return [doc]
    prepared = prepare(rack, run_dir=options.run_dir, vllm=options.vllm, create_pool=options.create_pool)
    base = prepared.plan
    specs = _vllm_specs(base)
    if not specs:
        raise UsageError("the manifest runs no vLLM instance on this host")
    one = len(specs) == 1
    b_name = None if one else specs[1].name  # with one instance A is B: its cache must stay off
    docs = []
    for setting in settings or ["default"]:
        plan = engines.plan_for_setting(base, setting, local_cache_on=b_name)
        docs.append(_serve_and_measure(plan, setting, options, block, say, local_hit=not one))
        on_doc(docs[-1])
    return docs


def _serve_and_measure(
    plan: ServePlan,
    setting: str,
    options: BenchOptions,
    block: int,
    say: Callable[[str], None],
    *,
    local_hit: bool,
) -> dict[str, Any]:
    from belugactl.workflows.serve.supervisor import Supervisor

    specs = _vllm_specs(plan)
    routers = [p.port for p in plan.processes if p.kind == "router" and p.port is not None]
    supervisor = Supervisor(plan, say=say)
    say(f"bench serve: {_label(setting)}: starting the metadata server and vLLM (engine start takes a while on CPU)")
    supervisor.install_signal_handlers()
    b_spec = specs[1] if len(specs) > 1 else specs[0]
    example = _ExampleEngine(plan, b_spec, setting, Path(plan.run_dir), say) if options.example_connector else None
    # The ExampleConnector's engine needs no metadata server: it starts beside serve's (the starts,
    # minutes each on CPU, overlap instead of adding up).
    beside = threading.Thread(target=example.start, daemon=True) if example is not None else None
    try:
        if beside is not None:
            beside.start()
        try:
            supervisor.start()
        except BaseException:
            if example is not None:
                example.abort()  # do not wait minutes for an engine no one will use
            raise
        finally:
            if beside is not None:
                beside.join()
        if example is not None and example.error is not None:
            raise example.error
        return _measure(
            [p.port for p in specs],
            [p.stats_prefix for p in specs],
            routers,
            setting,
            example,
            options,
            block,
            say,
            local_hit=local_hit,
        )
    finally:
        if example is not None:
            example.stop()
        supervisor.stop()


def _measure(
    ports: list[Any],
    stats: list[Any],
    routers: list[Any],
    setting: str | None,
    example: _ExampleEngine | None,
    options: BenchOptions,
    block: int,
    say: Callable[[str], None],
    *,
    local_hit: bool,
) -> dict[str, Any]:
    if not ports:
        raise UsageError("the manifest runs no vLLM instance on this host")
    port_a, port_b = ports[0], ports[1] if len(ports) > 1 else ports[0]
    stats_a, stats_b = stats[0], stats[1] if len(stats) > 1 else stats[0]
    if port_a == port_b:
        say("bench serve: one instance only: A and B are the same instance (the hit still comes from the pool)")
        local_hit = False
    if options.via_router and not routers:
        raise UsageError(
            "--via-router: no router runs on this host", fix="add serve.router to the manifest (docs/serving.md)"
        )
    doc = bench_serve.run(
        port_a,
        port_b,
        lengths=options.lengths,
        rounds=options.rounds,
        block_size=block,
        router_port=routers[0] if options.via_router else None,
        say=say,
        local_hit=local_hit,
        stats_a=stats_a,
        stats_b=stats_b,
        example=example.instance if example is not None else None,
        concurrent=options.concurrent,
        engine_setting=setting,
    )
    doc["engine_setting_label"] = _label(setting)
    return doc
