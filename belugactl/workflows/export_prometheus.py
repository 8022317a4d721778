"""`export prometheus`: a Prometheus scrape config for every metrics endpoint of the rack, from the manifest.

Three jobs, one target per process, each labelled with the rack, its manifest host and its name
(`beluga_instance`), which the shipped Grafana dashboard (belugactl/data/grafana/belugactl.json)
groups by:
- `beluga-metadata`: the metadata server's admin HTTP `/metrics` (pool bytes, evictions, RPC latency);
- `beluga-vllm`: every vLLM instance's `/metrics` (TTFT, prompt tokens by source, connector hits);
- `beluga-router`: HAProxy's built-in exporter on the router's stats port, where `serve.router` is set
  (with prefill/decode roles, the P/D proxy's own /metrics on the router's port).

A listener bound to loopback is only reachable from its own host: the target is then 127.0.0.1 when
the whole rack is one host, else the host's address with a warning (bind it to the rack address).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from belugactl.model.manifest_schema import Host, Manifest

JOBS = ("beluga-metadata", "beluga-vllm", "beluga-router")


@dataclass(frozen=True)
class Target:
    job: str
    address: str  # host:port
    host: str  # the manifest host
    name: str  # beluga_instance: metadata-server, <host>-vllm-<i>, <host>-router


def _target_address(bind: str, host: Host, port: int, *, single_host: bool, warnings: list[str], what: str) -> str:
    """Where Prometheus reaches a listener bound to `bind` on `host`."""
    ip = ipaddress.ip_address(bind)
    if ip.is_unspecified:
        address = host.address
    elif ip.is_loopback:
        if single_host or _is_loopback(host.address):
            address = bind  # Prometheus runs on this one host
        else:
            address = host.address
            warnings.append(
                f"{what} on {host.name} binds {bind}: only a Prometheus on {host.name} itself can scrape it; "
                "bind it to the rack address in the manifest to scrape it from elsewhere"
            )
    else:
        address = bind
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def _vllm_bind(extra_args: list[str]) -> str:
    """vLLM's --host from the manifest's extra args (vLLM's default: every address)."""
    for i, arg in enumerate(extra_args):
        if arg.startswith("--host="):
            return arg.split("=", 1)[1]
        if arg == "--host" and i + 1 < len(extra_args):
            return extra_args[i + 1]
    return "0.0.0.0"


def scrape_targets(manifest: Manifest) -> tuple[list[Target], list[str]]:
    """Every metrics endpoint of the rack, and warnings about the ones a remote Prometheus cannot reach."""
    from belugactl.errors import InputError
    from belugactl.workflows.serve.launch_plan import metadata_host
    from belugactl.workflows.serve.router import router_hosts

    if manifest.serve is None:
        raise InputError(
            "the manifest has no serve section: nothing serves metrics",
            fix="add serve.vllm (and the metadata role on a host); see docs/serving.md",
        )
    serve = manifest.serve
    warnings: list[str] = []
    targets: list[Target] = []
    single = len(manifest.hosts) == 1

    def add(job: str, bind: str, host: Host, port: int, what: str, instance: str) -> None:
        address = _target_address(bind, host, port, warnings=warnings, what=what, single_host=single)
        targets.append(Target(job, address, host.name, instance))

    mds = metadata_host(manifest)
    if mds is not None:
        add("beluga-metadata", serve.metadata.admin_bind, mds, serve.metadata.admin_port,
            "the metadata server's admin HTTP", "metadata-server")  # fmt: skip
    bind = _vllm_bind(list(serve.vllm.extra_args))
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        bind = "0.0.0.0" if bind in ("", "*") else ("127.0.0.1" if bind == "localhost" else bind)
    for host in manifest.hosts:
        for i in range(manifest.instances_on(host)):
            port = serve.vllm.port_base + i
            try:
                address = _target_address(bind, host, port, warnings=warnings, what="vLLM", single_host=single)
            except ValueError:  # --host with a DNS name: scrape it by that name
                address = f"{bind}:{port}"
            targets.append(Target("beluga-vllm", address, host.name, f"{host.name}-vllm-{i}"))
    if serve.router is not None:
        # With prefill/decode roles the front door is belugactl's P/D proxy: /metrics on its one port.
        port = serve.router.port if serve.vllm.disaggregated else serve.router.stats_port
        for name in router_hosts(manifest):
            add("beluga-router", serve.router.bind_on(manifest.host(name)), manifest.host(name), port,
                "the router's stats", f"{name}-router")  # fmt: skip
    return targets, list(dict.fromkeys(warnings))  # one per listener kind and host


def scrape_config(manifest: Manifest, *, interval: str = "15s") -> tuple[dict[str, Any], list[str]]:
    """A complete prometheus.yml document (global + scrape_configs) and the reachability warnings."""
    targets, warnings = scrape_targets(manifest)
    jobs = []
    for job in JOBS:
        mine = [t for t in targets if t.job == job]
        if not mine:
            continue
        jobs.append(
            {
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [
                    {
                        "targets": [t.address],
                        "labels": {"rack": manifest.name, "host": t.host, "beluga_instance": t.name},
                    }
                    for t in mine
                ],
            }
        )
    doc = {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}
    return doc, warnings


def render_yaml(doc: dict[str, Any], manifest_name: str) -> str:
    import yaml

    header = (
        f"# Written by `belugactl export prometheus` for rack {manifest_name}: every metadata server, vLLM\n"
        "# instance and router of the rack. Dashboard: belugactl/data/grafana/belugactl.json.\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
