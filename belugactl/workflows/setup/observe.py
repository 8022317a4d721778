"""Read a host into SetupFacts: discovery (only the parts the topics need), then each topic's own reads."""

from __future__ import annotations

from typing import Any

from belugactl.host.host import Host
from belugactl.host.snapshot import HostSnapshot
from belugactl.workflows.setup.facts import Discover, SetupFacts
from belugactl.workflows.setup.topics import all_topics

# Discovery topics setup reads only when a setup topic asks for them (the PCI walk, tool versions);
# the rest is sysfs files and the three listings setup cannot do without.
ON_REQUEST = frozenset({"pci", "tools"})


def discovery_topics(target: Any, state: dict[str, Any] | None = None) -> frozenset[str]:
    """What setup reads of a host for `target`: the common part plus what each topic asks for."""
    from belugactl.workflows.discover import TOPICS

    wanted = set(TOPICS - ON_REQUEST)
    for topic in all_topics():
        if topic.discovery is not None:
            wanted |= topic.discovery(target, state or {})
    return frozenset(wanted & TOPICS)


def default_discover(host: Host, target: Any = None, state: dict[str, Any] | None = None) -> HostSnapshot:
    from belugactl.workflows.discover import discover

    return discover(host, discovery_topics(target, state) if target is not None else None)


def observe(host: Host, target: Any, state: dict[str, Any], *, discover: Discover | None = None) -> SetupFacts:
    snapshot = discover(host) if discover is not None else default_discover(host, target, state)
    facts = SetupFacts(snapshot=snapshot, state=state)
    for topic in all_topics():
        if topic.observe is not None:
            topic.observe(host, target, facts)
    return facts


def find_pool_device(host: Host, manifest: Any, host_name: str) -> str | None:
    """The pool's dax device name ("dax0.0") on `host` once setup has made it, else None.

    Setup's own finder (the manifest's namespace, region or device), exposed so that the pool
    device rule (`belugactl.pool.device.pool_device`) and setup never disagree.
    """
    from belugactl.workflows.setup.pool_lookup import pool_dax_device
    from belugactl.workflows.setup.target import target_from_manifest

    target = target_from_manifest(manifest, host_name)  # no header spec: the finder needs none
    return pool_dax_device(target, observe(host, target, {}))
