"""The etcd member serve runs on this host when the manifest says `serve.metadata.etcd.run: true`
(issue 32 item 2): the same command line `export systemd` writes into belugactl-etcd.service
(setup/systemd.py `etcd_argv`), its data under the run dir, started before the metadata server and
stopped after it. Three members on three hosts is the production shape; one member is a lab's.
launch_plan.py turns the answer into a process of the plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EtcdMember:
    """What serve runs here (`argv`, its client `port`), or why not: `blocker` (the plan cannot run)
    or only a `note` (no member here)."""

    argv: tuple[str, ...] = ()
    port: int = 0
    note: str = ""
    blocker: str = ""


def etcd_member(manifest: Any, host: str, run: Path, etcd_binary: str | None) -> EtcdMember | None:
    """This host's etcd member under serve.metadata.etcd.run; None when serve runs no etcd at all."""
    from urllib.parse import urlsplit

    from belugactl.workflows.setup.systemd import etcd_argv, etcd_members

    conf = manifest.serve.metadata.etcd
    if conf is None or not conf.run:
        return None
    members = etcd_members(manifest)
    mine = [m for m in members if m[1] == host]
    if not mine:
        return EtcdMember(note=f"etcd: no member on {host} (serve.metadata.etcd.endpoints name other hosts)")
    if any(url.startswith("https://") for _, _, url, _ in members):
        return EtcdMember(
            blocker="etcd: https endpoints need certificates serve does not have: run that etcd yourself "
            "(serve.metadata.etcd.run: false)"
        )
    if etcd_binary is None:
        return EtcdMember(
            blocker="etcd: serve.metadata.etcd.run asks serve to run an etcd member here, and no `etcd` is on "
            "PATH (Debian: apt install etcd-server)"
        )
    name, _, client, _ = mine[0]
    more = f"; {len(mine) - 1} more member(s) named on this host are not run (one per host)" if len(mine) > 1 else ""
    return EtcdMember(
        argv=tuple(etcd_argv(manifest, name, binary=etcd_binary, data_dir=str(run / "etcd"))),
        port=urlsplit(client).port or 2379,
        note=f"etcd: member {name} ({client}) of {len(members)}, data in {run / 'etcd'}, started before the "
        f"metadata server and stopped after it{more}",
    )
