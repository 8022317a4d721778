"""The worker's pool prefault: started only where it pays, reported in the stats, stoppable."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from vllm_beluga.config import BelugaConfig, ConnectorConfigError
from vllm_beluga.prefault import PoolPrefault
from vllm_beluga.stats import ConnectorStats

from belugactl.model.manifest import load_manifest
from belugactl.pool.file_pool import create_file_pool
from belugactl.pool.mapping import PoolMapping

REPO = Path(__file__).resolve().parents[3]


def _stand_in(*, devdax: bool = False, size: int = 1 << 30) -> SimpleNamespace:
    """The pool's two facts the decision reads (a devdax device cannot be made here)."""
    return SimpleNamespace(is_devdax=devdax, size=size)


def test_devdax_large_or_switched_off_pools_are_left_alone_and_say_why() -> None:
    stats = ConnectorStats(None, role="worker0")
    assert not PoolPrefault(_stand_in(devdax=True), stats).start()
    assert "devdax" in stats.state["pool_prefault"]
    assert not PoolPrefault(_stand_in(size=32 << 30), stats).start()
    assert "over prefault_max_bytes" in stats.state["pool_prefault"]
    assert not PoolPrefault(_stand_in(), stats, max_bytes=0).start()
    assert stats.state["pool_prefault"].startswith("off")


def test_a_file_pool_is_prefaulted_on_a_thread_and_the_stats_say_so(tmp_path: Path) -> None:
    pool_path = create_file_pool(tmp_path / "pool", load_manifest(REPO / "examples" / "cpu-demo.yaml"))
    stats = ConnectorStats(None, role="worker0")
    with PoolMapping.open(pool_path) as pool:
        job = PoolPrefault(pool, stats)
        assert job.start()
        assert job._thread is not None and job._thread.name == "beluga-prefault"
        job._thread.join(60)
        job.stop()
    state = stats.state["pool_prefault"]
    assert state.startswith("done: 1024 MiB in ") or state.startswith("failed: "), state


def test_a_failed_prefault_is_reported_not_raised() -> None:
    class Refusing:
        is_devdax, size = False, 1 << 20

        def prefault(self, stop: threading.Event) -> int:
            raise OSError(22, "Invalid argument")

    stats = ConnectorStats(None, role="worker0")
    job = PoolPrefault(Refusing(), stats)
    job.run()
    assert stats.state["pool_prefault"].startswith("failed: [Errno 22] Invalid argument")


def test_prefault_max_bytes_is_a_byte_count() -> None:
    def cfg(value: object) -> BelugaConfig:
        return BelugaConfig.from_extra({"metadata_address": "tcp://127.0.0.1:1", "prefault_max_bytes": value})

    assert cfg(0).prefault_max_bytes == 0
    assert BelugaConfig.from_extra({"metadata_address": "tcp://127.0.0.1:1"}).prefault_max_bytes == 16 << 30
    for bad in (-1, "1G", True, 1.5):
        try:
            cfg(bad)
        except ConnectorConfigError as exc:
            assert "prefault_max_bytes" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was taken")
