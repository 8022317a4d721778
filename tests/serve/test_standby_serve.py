"""serve's supervisor with a real `metadata-server --standby` while another member leads (a real etcd
on loopback): the start waits for "ready or a standby naming its leader", and `status` says it stands by
and who leads; its /metrics says it does not lead."""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path

import pytest

from belugactl.workflows.serve.control import status
from belugactl.workflows.serve.launch_plan import ProcessSpec, ServePlan
from belugactl.workflows.serve.supervisor import Supervisor, readiness
from tests.dataplane.test_standby_process import CPU_DEMO, members, rack
from tests.support.etcd import _free_port

pytestmark = pytest.mark.process


def test_serve_takes_a_real_standby_as_started_and_status_names_its_leader(tmp_path: Path) -> None:
    with rack() as (etcd, pool, tmp), members(etcd, pool, tmp, ("mds-a", 2)) as (a,):
        port = _free_port()
        admin = f"http://127.0.0.1:{port}"
        argv = (sys.executable, "-m", "belugactl", "metadata-server", "-f", str(CPU_DEMO), "--pool", str(pool),
                "--rpc-port", "0", "--admin-port", str(port), "--standby", "--etcd", etcd.url, "--member", "mds-b",
                "--leader-ttl", "2")  # fmt: skip
        spec = ProcessSpec(
            name="metadata-server",
            kind="metadata",
            argv=argv,
            env={},
            log_file=str(tmp_path / "logs" / "metadata-server.log"),
            port=port,
            health_url=f"{admin}/readyz",
            ready_timeout_s=60.0,
            standby_ok=True,
        )
        plan = ServePlan("cpu-demo", "cpu-demo", str(CPU_DEMO), str(tmp_path), str(pool), [spec])
        plan.metadata_admin_url = admin
        said: list[str] = []
        sup = Supervisor(plan, say=said.append, poll_s=0.05)
        sup.start()
        try:
            assert any("metadata-server is a standby (standby: mds-a leads)" in s for s in said), said
            assert readiness(f"{a.admin}/readyz", standby_ok=True) == "ready"
            doc = status(tmp_path)
            (proc,) = doc["processes"]
            assert proc["healthy"] and proc["role"] == "standby"
            pool_doc = doc["pool"]
            assert (pool_doc["member"], pool_doc["leading"], pool_doc["leader"]) == ("mds-b", False, "mds-a")
            with urllib.request.urlopen(f"{admin}/metrics", timeout=5) as r:  # noqa: S310 - loopback
                text = r.read().decode()
            assert 'beluga_mds_leader{member="mds-b"} 0.0' in text
            assert 'beluga_mds_leader_since_seconds{leader="mds-a"}' in text
            assert "beluga_mds_leader_term_start_seconds 0.0" in text  # a standby holds no term
        finally:
            sup.stop()
