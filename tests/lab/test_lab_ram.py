"""The ram profile for real: 2 guests, each with a CXL switch and 2 volatile devices, one 2-way region.

Each guest creates a ram region across its two devices (targets ordered by serial), makes it devdax;
then one guest writes a pattern into every interleave chunk of the first stripes and the other reads
the same dax offsets, and each chunk is found in the backing file that the geometry (`cxl list`'s
granularity and ways) says. The lab is always taken down. Phase times are printed (run with -s).
Without the Debian packages (no network) the test fails in CI (CI=true) and is skipped elsewhere.
"""

import json
import os
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from belugactl.lab import debstack, prereqs, ramregion
from belugactl.lab.channel import GuestChannel
from belugactl.lab.paths import STATE_ENV, cache_root
from tests.support.lab import REPO, our_qemus, run_cli, unavailable

pytestmark = [pytest.mark.lab, pytest.mark.lab_ram, pytest.mark.timeout(420)]

LAB = "pytest-ram"
DAXPOKE = str(REPO / "belugactl" / "lab" / "guest" / "daxpoke.py")
CHUNK_BYTES = 16


def _poke(ch: GuestChannel, *args: str) -> str:
    r = ch.run(["python3", "-I", "-S", DAXPOKE, *args], timeout=60)
    assert r.returncode == 0, f"{ch.name}: daxpoke {args} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode().strip()


def test_two_hosts_share_an_interleaved_ram_region_behind_a_switch(tmp_path):
    if prereqs.find_program("busybox") is None:
        unavailable("busybox not found (Debian package busybox-static)")
    phases: dict[str, float] = {}
    state = tmp_path / "labstate"
    env = dict(os.environ, **{STATE_ENV: str(state)})
    t0 = time.monotonic()
    prep = run_cli(env, "lab", "prepare", "--profile", "ram", "--json", timeout=900)
    if prep.returncode != 0:
        unavailable(f"`belugactl lab prepare --profile ram` failed: {prep.stderr.strip()[-500:]}")
    phases["prepare"] = time.monotonic() - t0
    assert debstack.load(cache_root()) is not None
    try:
        t0 = time.monotonic()
        up = run_cli(env, "lab", "up", "--name", LAB, "--profile", "ram", "--switch", "--devices", "2",
                     "--hosts", "2", "--pool-size", "512MiB", "--boot-timeout", "180", "--json", timeout=240)
        assert up.returncode == 0, f"lab up failed:\n{up.stderr}"
        phases["up (2 guests, parallel)"] = time.monotonic() - t0
        doc = json.loads(up.stdout)["lab"]
        assert doc["profile"] == "ram" and doc["switch"] and doc["devices"] == 2
        files = [Path(p) for p in doc["backing"]]
        assert [f.name for f in files] == ["pool-0.raw", "pool-1.raw"]
        assert all(f.stat().st_size == 256 << 20 for f in files)
        chans = [GuestChannel(Path(g["spool"]), name=g["name"]) for g in doc["guests"]]
        for ch in chans:
            info = ch.ready_info()
            assert info is not None and info["kernel"].startswith("6.12"), info

        # Region + devdax in both guests at once.
        t0 = time.monotonic()
        with ThreadPoolExecutor(len(chans)) as pool:
            regions = list(pool.map(ramregion.provision, chans))
        phases["region + devdax (both guests)"] = time.monotonic() - t0
        for r in regions:
            print(f"{r.guest}: {r.region} {r.size >> 20} MiB, {r.ways}-way, granularity {r.granularity}, "
                  f"targets {[(m.name, hex(m.serial)) for m in r.targets]}, {r.dax} {r.dax_mode}, "
                  f"guest side {r.seconds} s")
            assert (r.ways, r.granularity, r.size) == (2, 4096, 512 << 20)
            assert r.dax_mode == "devdax"
            # Position p holds the device with the p-th smallest serial: device p, backed by file p.
            assert [m.serial for m in r.targets] == [0x10, 0x11]
            assert r.positions == {p: m.name for p, m in enumerate(r.targets)}

        # Writer on guest 1, reader on guest 2, every chunk of the first two stripes plus one far out.
        t0 = time.monotonic()
        writer, reader = chans
        geometry = regions[0]
        offsets = [c * geometry.granularity + 8 for c in range(2 * geometry.ways)] + [geometry.size - 4096]
        written = {off: secrets.token_bytes(CHUNK_BYTES) for off in offsets}
        dax = f"/dev/{geometry.dax}"
        for off, data in written.items():
            _poke(writer, "write", dax, hex(off), data.hex())
        for off, data in written.items():
            assert _poke(reader, "read", f"/dev/{regions[1].dax}", hex(off), str(CHUNK_BYTES)) == data.hex(), (
                f"{reader.name} does not see {writer.name}'s bytes at dax offset {off:#x}")
            position, file_off = ramregion.backing_position(off, geometry.ways, geometry.granularity)
            with open(files[position], "rb") as fh:
                fh.seek(file_off)
                assert fh.read(CHUNK_BYTES) == data, f"dax {off:#x} not at {files[position].name}@{file_off:#x}"
            print(f"dax {off:#x} -> {files[position].name}@{file_off:#x}: ok on both hosts")
        phases["write/read/backing checks"] = time.monotonic() - t0
    finally:
        t0 = time.monotonic()
        run_cli(env, "lab", "down", "--name", LAB, timeout=120)
        phases["down"] = time.monotonic() - t0
        for pid in our_qemus(state):  # last resort, still only our own QEMU processes
            os.kill(pid, signal.SIGKILL)
        print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))
