"""Tenants: who owns which vLLM instances, with what quotas and what share of the pool.

The manifest's `tenants:` list (manifest_schema.Tenant) names each tenant's instances with
selectors: `HOST` (every instance on that host) or `HOST:N` (its instance N, counted from 0). With
tenants declared, every instance of the rack belongs to exactly one (manifest_rules reports the
rest with file:line). Without them there is one implicit tenant that owns everything: the layout,
its hash and the server's behaviour are what they were (tenants are not part of the layout).

The metadata server (dataplane/mds) takes `tenant_plan`: plain data, so the data plane never
imports the model. A CXL ring's tenant is its instance's (the layout's clients); a TCP client
names its tenant in HELLO (`serve` passes each instance its tenant: `tenant_of_instance`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # manifest_schema calls tenant_plan: no import at run time (no cycle)
    from belugactl.model.manifest_schema import Manifest, Tenant


def parse_selector(selector: str) -> tuple[str, int | None]:
    """"HOST" -> (HOST, None); "HOST:N" -> (HOST, N). ValueError for a malformed one."""
    host, sep, rest = selector.partition(":")
    if not host:
        raise ValueError(f"{selector!r} names no host")
    if not sep:
        return host, None
    if not rest.isdigit() or len(rest) > 4:
        raise ValueError(f"{selector!r}: the instance after ':' is a number from 0")
    return host, int(rest)


def selected_instances(manifest: Manifest, tenant: Tenant) -> list[tuple[str, int]]:
    """The (host, instance) pairs a tenant's selectors name (malformed or unknown ones skipped)."""
    hosts = {h.name: h for h in manifest.hosts}
    out: list[tuple[str, int]] = []
    for sel in tenant.instances:
        try:
            host, instance = parse_selector(sel)
        except ValueError:
            continue
        h = hosts.get(host)
        if h is None:
            continue
        count = manifest.instances_on(h)
        for i in range(count) if instance is None else [instance] if instance < count else []:
            if (host, i) not in out:
                out.append((host, i))
    return out


def tenant_of_instance(manifest: Manifest, host: str, instance: int) -> str | None:
    """The tenant that owns `host`'s vLLM instance `instance` (None: no tenants declared, or none names it)."""
    for tenant in manifest.tenants:
        if (host, instance) in selected_instances(manifest, tenant):
            return tenant.name
    return None


def tenant_specs(manifest: Manifest) -> list[dict[str, Any]]:
    """Each tenant's name, weight and quotas as the metadata server's TenantSpec fields (0: no limit)."""
    out = []
    for t in manifest.tenants:
        q = t.quotas
        out.append(
            {
                "name": t.name,
                "weight": t.weight,
                "live_leases": q.live_leases or 0,
                "reserved_bytes": q.reserved_bytes or 0,
                "stored_bytes": q.stored_bytes or 0,
                "connections": q.connections or 0,
                "namespaces": q.namespaces or 0,
            }
        )
    return out


def ring_tenants(manifest: Manifest, layout: Any) -> dict[int, str]:
    """ring -> tenant name for every ring of an instance some tenant owns (spare rings: none)."""
    owner: dict[tuple[str, int], str] = {}
    for tenant in manifest.tenants:
        for pair in selected_instances(manifest, tenant):
            owner.setdefault(pair, tenant.name)
    return {c.ring: owner[(c.host, c.instance)] for c in layout.clients if (c.host, c.instance) in owner}


def tenant_plan(manifest: Manifest, layout: Any) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """What the metadata server needs: the tenants' specs and ring -> tenant."""
    return tenant_specs(manifest), ring_tenants(manifest, layout)


def tenant_problems(manifest: Manifest) -> list[tuple[tuple[Any, ...], str, str | None]]:
    """(path, message, hint) for each tenant rule broken: names unique, selectors well formed and
    naming a host and instance of the rack, each instance in exactly one tenant."""
    out: list[tuple[tuple[Any, ...], str, str | None]] = []
    if not manifest.tenants:
        return out
    hosts = {h.name: h for h in manifest.hosts}
    seen: dict[str, int] = {}
    owner: dict[tuple[str, int], int] = {}
    for i, tenant in enumerate(manifest.tenants):
        if tenant.name in seen:
            used = f"tenant name {tenant.name!r} is already used by tenants[{seen[tenant.name]}]"
            out.append((("tenants", i, "name"), used, None))
        else:
            seen[tenant.name] = i
        if not tenant.instances:
            hint = "e.g. [beluga-01, beluga-02:1]"
            out.append((("tenants", i, "instances"), "list the instances this tenant owns", hint))
        for j, sel in enumerate(tenant.instances):
            path = ("tenants", i, "instances", j)
            try:
                host, instance = parse_selector(sel)
            except ValueError as exc:
                out.append((path, str(exc), "write HOST (every instance on it) or HOST:N (its instance N, from 0)"))
                continue
            h = hosts.get(host)
            if h is None:
                out.append((path, f"no host named {host!r}", f"hosts: {', '.join(hosts)}"))
                continue
            count = manifest.instances_on(h)
            if instance is not None and instance >= count:
                out.append((path, f"{host} runs {count} vLLM instance(s): 0 to {count - 1}", None))
                continue
            for k in range(count) if instance is None else [instance]:
                if (host, k) in owner and owner[(host, k)] != i:
                    other = manifest.tenants[owner[(host, k)]].name
                    out.append((path, f"{host}:{k} already belongs to tenant {other!r}", "an instance has one tenant"))
                else:
                    owner[(host, k)] = i
    for h in manifest.hosts:
        for k in range(manifest.instances_on(h)):
            if (h.name, k) not in owner:
                out.append(
                    (
                        ("tenants",),
                        f"{h.name}:{k} belongs to no tenant",
                        f"add {h.name}:{k} (or {h.name}) to one tenant's instances",
                    )
                )
                break  # one line per host is enough
    return out


def tenant_rows(manifest: Manifest, layout: Any) -> list[dict[str, Any]]:
    """One row per tenant for `pool show` and `manifest check`: its instances, rings, weight and quotas."""
    rings = ring_tenants(manifest, layout)
    rows = []
    for t, spec in zip(manifest.tenants, tenant_specs(manifest), strict=True):
        rows.append(
            {
                "name": t.name,
                "weight": t.weight,
                "instances": [f"{h}:{i}" for h, i in selected_instances(manifest, t)],
                "rings": sorted(r for r, name in rings.items() if name == t.name),
                "quotas": {k: (v or None) for k, v in spec.items() if k not in ("name", "weight")},
            }
        )
    return rows
