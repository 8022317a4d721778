"""The rack's front door: HAProxy, least-connections over every vLLM instance of the rack.

With one shared pool every instance reaches every KV block at the same cost, so ordinary load
balancing is the right policy: no cache-aware routing is needed. `serve.router` in the manifest
names the host(s) that run it; the config below is derived from the manifest alone (a pure function,
printed by `serve --dry-run`), written into the run dir and run as a supervised child like the others.

- balance leastconn; health checks are vLLM's own `GET /health` (2 failures: down, 2 passes: up);
- a request whose connection to an instance fails is retried on another instance (`redispatch`), so
  an instance that dies between two health checks costs a retry, not an error;
- stop drains: SIGUSR1 is HAProxy's soft stop (close the listeners, let in-flight requests finish),
  `hard-stop-after` bounds it by `serve.router.drain_timeout_s`;
- a second frontend on `stats_port` answers `/healthz` (the supervisor's readiness), `/metrics`
  (HAProxy's built-in Prometheus exporter) and `/stats`.
"""

from __future__ import annotations

import ipaddress
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Host, Manifest, RouterServe
    from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan

CONFIG_NAME = "haproxy.cfg"
BACKEND = "vllm"
# Requests can generate for minutes; a timeout shorter than the longest generation would cut answers.
SERVER_TIMEOUT_S = 600


@dataclass(frozen=True)
class Backend:
    host: str  # the manifest host it runs on
    name: str  # "<host>-vllm-<i>": unique across the rack, shown in HAProxy's stats and metrics
    address: str
    port: int
    kv_role: str = "kv_both"  # prefill/decode disaggregation: kv_producer, kv_consumer or both

    @property
    def url(self) -> str:
        return f"http://{_hostport(self.address, self.port)}"


def router_hosts(manifest: Manifest) -> list[str]:
    """The hosts that run the router: as named, else the metadata server's host, else the first host."""
    serve = manifest.serve
    if serve is None or serve.router is None:
        return []
    if serve.router.hosts:
        return list(serve.router.hosts)
    meta = serve.metadata.host or next((h.name for h in manifest.hosts if "metadata" in h.roles), None)
    return [meta or manifest.hosts[0].name]


def backends(manifest: Manifest) -> list[Backend]:
    """Every vLLM instance of the rack, in manifest order (the same list on every router host)."""
    assert manifest.serve is not None
    out = []
    for host in manifest.hosts:
        for i in range(manifest.instances_on(host)):
            out.append(
                Backend(
                    host.name,
                    f"{host.name}-vllm-{i}",
                    host.address,
                    manifest.serve.vllm.port_base + i,
                    manifest.serve.vllm.kv_role(i),
                )
            )
    return out


def local_address(bind: str) -> str:
    """Where this host reaches a listener bound to `bind` (a wildcard is reached on loopback)."""
    if bind in ("0.0.0.0", "::"):
        return "127.0.0.1" if bind == "0.0.0.0" else "::1"
    return bind


def _hostport(address: str, port: int) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass  # a DNS name
    return f"{address}:{port}"


def haproxy_config(manifest: Manifest, run_dir: str | Path, host: Host | None = None) -> str:
    """The HAProxy configuration for this rack (on `host`, when serve.router.bind is `address`): same
    manifest, same text (tests pin it)."""
    assert manifest.serve is not None and manifest.serve.router is not None
    router: RouterServe = manifest.serve.router
    bind = router.bind_on(host or manifest.host(router_hosts(manifest)[0]))
    run = Path(run_dir)
    inter = router.check_interval_ms
    lines = [
        f"# Written by belugactl serve from the manifest of rack {manifest.name}; regenerated at every start.",
        "global",
        "    maxconn 4096",
        f"    stats socket {run / 'haproxy.sock'} mode 600 level admin",
        f"    hard-stop-after {router.drain_timeout_s}s",
        # To stderr, which the supervisor keeps in logs/router.log; with dontlog-normal below only
        # requests that failed, were retried or redispatched are logged (one line each, with the
        # termination state that says why).
        "    log stderr format raw daemon info",
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlognull",
        "    option dontlog-normal",
        "    timeout connect 5s",
        f"    timeout client {SERVER_TIMEOUT_S}s",
        f"    timeout server {SERVER_TIMEOUT_S}s",
        "    timeout http-request 30s",
        "    timeout queue 60s",
        # A busy engine can answer /health slower than the check interval: without this the read
        # timeout of a check is `inter`, and a loaded instance flaps DOWN while it is serving.
        "    timeout check 2s",
        # An instance that died since the last check refuses the connection, or (killed while the
        # kernel still completed handshakes for its listening socket) resets it after the request
        # was sent: try another one. L7 retries replay the request from HAProxy's buffer, so wait
        # for the whole request before connecting.
        "    retries 3",
        "    option redispatch 1",
        "    option http-buffer-request",
        "    retry-on conn-failure empty-response junk-response 503",
        "",
        "frontend beluga",
        f"    bind {_hostport(bind, router.port)}",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance leastconn",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        f"    default-server inter {inter}ms fastinter {max(inter // 4, 100)}ms fall 2 rise 2 init-addr last,libc,none",
    ]
    for b in backends(manifest):
        lines.append(f"    server {b.name} {_hostport(b.address, b.port)} check")
    lines += [
        "",
        "frontend stats",
        f"    bind {_hostport(bind, router.stats_port)}",
        "    http-request return status 200 content-type text/plain string ok if { path /healthz }",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 5s",
        "",
    ]
    return "\n".join(lines)


def find_haproxy() -> str:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).exists()), "haproxy"
    )


def pd_proxy_process(
    manifest: Manifest, run_dir: str | Path, *, belugactl: tuple[str, ...] | None = None, host: Host | None = None
) -> ProcessSpec:
    """With prefill/decode roles the front door is belugactl's own proxy (workflows/serve/pd_proxy.py):
    each request goes to a producer, then to a consumer, which HAProxy cannot sequence."""
    from belugactl.workflows.serve.launch_plan import ProcessSpec, default_belugactl

    assert manifest.serve is not None and manifest.serve.router is not None
    router = manifest.serve.router
    bind = router.bind_on(host or manifest.host(router_hosts(manifest)[0]))
    argv = [*(belugactl or default_belugactl()), "pd-proxy", "--bind", bind, "--port", str(router.port)]
    for b in backends(manifest):
        if b.kv_role in ("kv_producer", "kv_both"):
            argv += ["--prefill", b.url]
    for b in backends(manifest):
        if b.kv_role in ("kv_consumer", "kv_both"):
            argv += ["--decode", b.url]
    return ProcessSpec(
        name="router",
        kind="router",
        argv=tuple(argv),
        env={},
        log_file=str(Path(run_dir) / "logs" / "router.log"),
        port=router.port,
        health_url=f"http://{_hostport(local_address(bind), router.port)}/healthz",
        ready_timeout_s=30.0,
    )


def router_process(manifest: Manifest, host: Host, run_dir: str | Path, *, haproxy: str | None = None) -> ProcessSpec:
    from belugactl.workflows.serve.launch_plan import ProcessSpec

    assert manifest.serve is not None and manifest.serve.router is not None
    if manifest.serve.vllm.disaggregated:
        return pd_proxy_process(manifest, run_dir, host=host)
    router = manifest.serve.router
    bind = router.bind_on(host)
    run = Path(run_dir)
    config = run / CONFIG_NAME
    return ProcessSpec(
        name="router",
        kind="router",
        # -db: foreground, so the supervisor owns it; -f: the file written just before the start.
        argv=(haproxy or find_haproxy(), "-db", "-f", str(config)),
        env={},
        log_file=str(run / "logs" / "router.log"),
        port=router.port,
        health_url=f"http://{_hostport(local_address(bind), router.stats_port)}/healthz",
        ready_timeout_s=30.0,
        files=((str(config), haproxy_config(manifest, run, host)),),
        stop_signal="SIGUSR1",
        stop_grace_s=float(router.drain_timeout_s + 5),
    )


def add_router(plan: ServePlan, manifest: Manifest, *, haproxy: str | None = None) -> None:
    """Add the router to this host's plan when the manifest puts one here; problems become blockers."""
    if manifest.serve is None or manifest.serve.router is None:
        return
    names = manifest.host_names()
    hosts = router_hosts(manifest)
    unknown = [h for h in hosts if h not in names]
    if unknown:
        plan.blockers.append(
            f"serve.router.hosts names {', '.join(unknown)}, not a host of this manifest ({', '.join(names)}); "
            "fix: name hosts from hosts[].name"
        )
        return
    if plan.host not in hosts:
        return
    router = manifest.serve.router
    if not backends(manifest):
        plan.blockers.append("serve.router is set but no host runs a vLLM instance: nothing to route to")
    taken = {p.port: p.name for p in plan.processes if p.port is not None}
    taken.update(
        {manifest.serve.vllm.port_base + i: f"vllm-{i}" for i in range(manifest.instances_on(manifest.host(plan.host)))}
    )
    if manifest.serve.metadata.rpc_port:
        taken.setdefault(manifest.serve.metadata.rpc_port, "metadata-server rpc")
    for field, port in (("port", router.port), ("stats_port", router.stats_port)):
        if port in taken:
            plan.blockers.append(
                f"serve.router.{field} {port} is also {taken[port]}'s port; fix: pick another serve.router.{field}"
            )
    if router.port == router.stats_port:
        plan.blockers.append("serve.router.port and stats_port are the same; fix: pick two ports")
    remote = [b for b in backends(manifest) if b.host != plan.host]
    loopback_vllm = any(a in ("--host=127.0.0.1", "--host=localhost") for a in manifest.serve.vllm.extra_args)
    if remote and loopback_vllm:
        plan.notes.append(
            f"the router on {plan.host} reaches instances on other hosts, but serve.vllm.extra_args binds vLLM "
            "to 127.0.0.1: those instances will be marked down"
        )
    plan.processes.append(router_process(manifest, manifest.host(plan.host), plan.run_dir, haproxy=haproxy))


def check_router(plan: ServePlan) -> None:
    """Before anything starts: HAProxy is installed, the stats port is free (the main port is checked with the rest)."""
    from belugactl.errors import EnvironmentProblem
    from belugactl.workflows.serve import preflight

    for spec in plan.processes:
        if spec.kind != "router" or "pd-proxy" in spec.argv:
            continue  # the prefill/decode front door is belugactl itself
        program = spec.argv[0]
        if not (Path(program).is_absolute() and Path(program).exists()) and shutil.which(program) is None:
            raise EnvironmentProblem(
                f"HAProxy is not installed: {program} not found",
                why="serve.router in the manifest puts the rack's front door on this host",
                fix="apt-get install haproxy (scripts/bootstrap installs it), or remove serve.router",
            )
        stats = spec.health_url.rsplit(":", 1)[1].split("/", 1)[0] if spec.health_url else None
        if stats:
            preflight.check_ports([("router stats", int(stats), preflight.listen_address(spec.health_url))])
