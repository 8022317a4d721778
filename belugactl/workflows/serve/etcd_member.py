"""The etcd member serve runs on this host when the manifest says `serve.metadata.etcd.run: true`
(issue 32 item 2): the same command line `export systemd` writes into belugactl-etcd.service
(setup/systemd.py `etcd_argv`), its data under the run dir, started before the metadata server and
stopped after it. Three members on three hosts is the production shape; one member is a lab's."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan


def etcd_process(manifest: Any, host: str, run: Path, etcd_binary: str | None, plan: ServePlan) -> ProcessSpec | None:
    """This host's etcd member, or None (with a note or a blocker in `plan` saying why)."""
    from urllib.parse import urlsplit

    from belugactl.workflows.serve.launch_plan import ProcessSpec
    from belugactl.workflows.setup.systemd import etcd_argv, etcd_members

    conf = manifest.serve.metadata.etcd
    if conf is None or not conf.run:
        return None
    members = etcd_members(manifest)
    mine = [m for m in members if m[1] == host]
    if not mine:
        plan.notes.append(f"etcd: no member on {host} (serve.metadata.etcd.endpoints name other hosts)")
        return None
    if any(url.startswith("https://") for _, _, url, _ in members):
        plan.blockers.append(
            "etcd: https endpoints need certificates serve does not have: run that etcd yourself "
            "(serve.metadata.etcd.run: false)"
        )
        return None
    if etcd_binary is None:
        plan.blockers.append(
            "etcd: serve.metadata.etcd.run asks serve to run an etcd member here, and no `etcd` is on PATH "
            "(Debian: apt install etcd-server)"
        )
        return None
    name, _, client, _ = mine[0]
    port = urlsplit(client).port or 2379
    argv = etcd_argv(manifest, name, binary=etcd_binary, data_dir=str(run / "etcd"))
    more = f"; {len(mine) - 1} more member(s) named on this host are not run (one per host)" if len(mine) > 1 else ""
    plan.notes.append(
        f"etcd: member {name} ({client}) of {len(members)}, data in {run / 'etcd'}, started before the "
        f"metadata server and stopped after it{more}"
    )
    return ProcessSpec(
        name="etcd",
        kind="etcd",
        argv=tuple(argv),
        env={},
        log_file=str(run / "logs" / "etcd.log"),
        port=port,
        # Up and answering; the cluster's quorum needs the other members (doctor's etcd.quorum checks it).
        health_url=f"http://127.0.0.1:{port}/version",
        ready_timeout_s=60.0,
    )
