"""A host dies in the middle of setup, boots again with the same pool and labels, and setup converges.

Real kernel 6.1 and cxl/ndctl 76.1 in a TCG guest (`belugactl lab`), one guest, its own lab name and
state directory, so it never touches another lab. Marked `lab`; run:
    .venv/bin/pytest -m lab tests/setup/test_setup_crash_lab.py -s

1. `setup` runs in lab-1; the moment it starts the namespace step (the region is committed), lab-1's
   QEMU gets SIGKILL: a power cut between `cxl create-region` and `ndctl create-namespace`.
2. `lab restart lab-1` boots it again on the same pool file and LSA file; setup must converge.
3. A crash inside `ndctl create-namespace -m devdax`, between its label writes and its info block:
   made exactly by putting the namespace back in mode raw (same uuid and name) and panicking the
   guest's kernel (sysrq c; `panic=-1 -no-reboot` ends QEMU). After the reboot setup must finish
   the namespace without --force, and the pool header written in 2 must still verify.
4. A power cut inside the header step: the pool is left as a setup killed between its claim
   compare-and-swap and the magic leaves it (zero record, lab-1's claim word; the real window is a
   0.2 s settle, too short to hit with a kill from outside, so the bytes are put there by the test
   while the guest is dead). After the reboot setup must take its own stale claim over, WITHOUT
   --force, instead of waiting for a writer that no longer exists.
5. A further setup plans zero steps and doctor passes.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from belugactl.pool import header as hdr
from tests.support.lab import BELUGACTL, REPO, our_qemus, run_cli, unavailable

pytestmark = pytest.mark.lab

LAB_NAME = "setup-crash"
HOST = "lab-1"
MANIFEST = "examples/lab.yaml"
NS_UUID = "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"  # examples/lab.yaml pool.namespace
NS_NAME = "beluga-lab"
# Byte 0 of the devdax device is byte 2 MiB of the pool file (docs/lab.md); checked below on a real header.
DAX_START_IN_POOL = 2 << 20


class CrashLab:
    def __init__(self, env: dict[str, str], state_dir: Path, pool: Path) -> None:
        self.env, self.state_dir, self.pool = env, state_dir, pool

    def lab(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return run_cli(self.env, "lab", *args, timeout=timeout)

    def sh(self, *argv: str, timeout: float = 400) -> subprocess.CompletedProcess:
        return self.lab("exec", "--name", LAB_NAME, "--timeout", str(timeout), HOST, "--", *argv,
                        timeout=timeout + 60)

    def setup(self, *extra: str) -> subprocess.CompletedProcess:
        return self.sh("belugactl", "setup", "-f", MANIFEST, "--host", HOST, "--yes", "--json", *extra)

    def kill_guest(self) -> int:
        """SIGKILL lab-1's QEMU (a power cut), after checking the pid is this lab's QEMU."""
        pid = int((self.state_dir / "guests" / HOST / "qemu.pid").read_text())
        # A guest that panicked is already gone (QEMU runs with -no-reboot).
        assert pid in our_qemus(self.state_dir), f"pid {pid} is not this lab's QEMU"
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid in our_qemus(self.state_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid not in our_qemus(self.state_dir)
        return pid

    def restart(self) -> float:
        t0 = time.monotonic()
        st = self.lab("status", "--name", LAB_NAME, "--json")
        assert json.loads(st.stdout)["guests"][0]["state"] == "crashed", st.stdout
        again = self.lab("restart", "--name", LAB_NAME, HOST, "--json")
        assert again.returncode == 0, again.stderr[-3000:]
        assert json.loads(again.stdout)["was"] == "crashed"
        return time.monotonic() - t0

    def observe(self) -> dict[str, object]:
        """What the kernel shows after a boot: regions (cxl) and namespaces (ndctl), as JSON."""
        out = self.sh("sh", "-c", "echo '#R'; cxl list -R; echo '#N'; ndctl list -N -v; echo '#E'")
        assert out.returncode == 0, out.stderr
        text = out.stdout
        regions_txt = text.split("#R", 1)[1].split("#N", 1)[0].strip()
        ns_txt = text.split("#N", 1)[1].split("#E", 1)[0].strip()
        found = {"regions": json.loads(regions_txt or "[]"), "namespaces": json.loads(ns_txt or "[]")}
        return {k: v if isinstance(v, list) else [v] for k, v in found.items()}  # one object: not a list


@pytest.fixture(scope="module")
def crash_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashLab]:
    if shutil.which("qemu-system-x86_64") is None:
        unavailable("qemu-system-x86_64 is not installed (belugactl lab prepare --install)")
    state_root = tmp_path_factory.mktemp("crash-lab-state")
    env = {**os.environ, "BELUGACTL_LAB_STATE": str(state_root)}
    lab = CrashLab(env, state_root / LAB_NAME, state_root / LAB_NAME / "pool.raw")
    try:
        up = lab.lab("up", "--profile", "pmem", "--name", LAB_NAME, "--hosts", "1", "--json")
        if up.returncode != 0:
            if "missing" in up.stderr or "not installed" in up.stderr:
                unavailable(up.stderr.strip()[-500:])
            pytest.fail(f"lab up failed: {up.stderr[-3000:]}")
        info = json.loads(up.stdout)["lab"]
        lab.state_dir, lab.pool = Path(info["dir"]), Path(info["pool"])
        yield lab
    finally:
        run_cli(env, "lab", "down", "--name", LAB_NAME, timeout=120)


def _setup_until(lab: CrashLab, step_started: str, timeout: float = 400) -> tuple[list[str], str]:
    """Run setup in the guest, reading its progress; SIGKILL the guest when `step_started` begins.
    Returns the steps that had completed ("ok") and the output seen."""
    argv = [*BELUGACTL, "lab", "exec", "--name", LAB_NAME, HOST, "--",
            "belugactl", "setup", "-f", MANIFEST, "--host", HOST, "--yes"]
    child = subprocess.Popen(argv, env=lab.env, cwd=REPO, stdout=subprocess.PIPE,  # noqa: S603
                             stderr=subprocess.PIPE, text=True, bufsize=1)
    assert child.stderr is not None
    seen: list[str] = []
    done: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([child.stderr], [], [], 1.0)
            if not ready:
                assert child.poll() is None, f"setup ended before {step_started}: {''.join(seen)[-2000:]}"
                continue
            line = child.stderr.readline()
            if not line:
                break
            seen.append(line)
            words = line.split()
            if words[:1] == ["ok"]:
                done.append(words[1].rstrip(":"))
            if words[:2] == ["...", f"{step_started}:"]:
                lab.kill_guest()
                break
        else:
            pytest.fail(f"setup did not reach {step_started} in {timeout:g} s: {''.join(seen)[-2000:]}")
        rc = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert rc == 3, f"lab exec should report the guest's death (exit 3), got {rc}: {''.join(seen)[-2000:]}"
    return done, "".join(seen)


def _applied(result: subprocess.CompletedProcess) -> list[dict]:
    if result.returncode != 0:
        pytest.fail(f"setup exited {result.returncode}:\n{result.stderr[-3000:]}\n{result.stdout[-1500:]}")
    return json.loads(result.stdout)["applied"]


def test_a_guest_killed_mid_setup_reboots_and_setup_converges(crash_lab: CrashLab) -> None:
    lab = crash_lab
    timings: dict[str, float] = {}
    t_all = time.monotonic()

    # 1. Power cut once the region is committed, as the namespace step starts.
    t0 = time.monotonic()
    done, _ = _setup_until(lab, "devdax.create")
    timings["setup until the kill"] = time.monotonic() - t0
    assert done == ["region.create"], done
    timings["restart 1"] = lab.restart()
    after_boot_1 = lab.observe()
    print(f"\nkilled after {done}; after reboot: {json.dumps(after_boot_1)}")

    # 2. Setup converges from whatever the reboot left (a region is never silently reused twice).
    t0 = time.monotonic()
    applied = _applied(lab.setup())
    timings["setup after crash 1"] = time.monotonic() - t0
    ids = [a["step"]["id"] for a in applied]
    print(f"setup after crash 1 applied: {ids}")
    assert "header.write" in ids and "region.create" in ids, ids
    regions = lab.observe()["regions"]
    assert len(regions) == 1, regions  # no second region left behind
    with open(lab.pool, "rb") as fh:
        fh.seek(DAX_START_IN_POOL)
        assert fh.read(len(hdr.MAGIC)) == hdr.MAGIC  # the header is where the test expects it

    # 3. Crash inside ndctl create-namespace: labels (uuid, name) written, no devdax info block.
    raw = lab.sh("sh", "-c", f"ndctl destroy-namespace -f namespace0.0 && ndctl create-namespace -m raw "
                 f"-u {NS_UUID} -n {NS_NAME} -r region0 >/dev/null && ndctl list -N")
    assert raw.returncode == 0 and '"mode":"raw"' in raw.stdout, (raw.stdout, raw.stderr)
    panic = lab.sh("sh", "-c", "echo 1 > /proc/sys/kernel/sysrq; echo c > /proc/sysrq-trigger", timeout=60)
    assert panic.returncode == 3, panic.stderr  # lab exec: the guest died under the command
    timings["restart after panic"] = lab.restart()
    t0 = time.monotonic()
    applied = _applied(lab.setup())  # no --force
    timings["setup after the ndctl crash"] = time.monotonic() - t0
    ids = [a["step"]["id"] for a in applied]
    print(f"setup after a crash inside ndctl create-namespace applied: {ids}")
    assert ids[:2] == ["region.create", "devdax.reconfigure"] and "header.write" not in ids, ids
    namespaces = lab.observe()["namespaces"]
    assert [n["mode"] for n in namespaces] == ["devdax"], namespaces

    # 4. Power cut inside the header step: zero record, lab-1's claim word set, no magic.
    lab.kill_guest()
    stale = hdr.claim_nonce(HOST)
    with open(lab.pool, "r+b") as fh:
        fh.seek(DAX_START_IN_POOL)
        fh.write(bytes(hdr.MAX_HEADER_SIZE))
        fh.seek(DAX_START_IN_POOL + hdr.CLAIM_OFFSET)
        fh.write(stale.to_bytes(8, "little"))
    timings["restart 2"] = lab.restart()
    after_boot_2 = lab.observe()
    print(f"after reboot 2: {json.dumps(after_boot_2)}")
    t0 = time.monotonic()
    applied = _applied(lab.setup())  # no --force: the stale claim is this host's own
    timings["setup after crash 2"] = time.monotonic() - t0
    header = [a for a in applied if a["step"]["id"] == "header.write"]
    assert header and "took over" in header[0]["detail"] and f"{stale:#018x}" in header[0]["detail"], applied
    with open(lab.pool, "rb") as fh:
        fh.seek(DAX_START_IN_POOL)
        record = fh.read(hdr.MAX_HEADER_SIZE)
    assert record[: len(hdr.MAGIC)] == hdr.MAGIC and hdr.claimed_by(hdr.read_claim(record), HOST)
    assert hdr.read_claim(record) != stale

    # 5. Converged: zero steps, doctor passes.
    again = json.loads(lab.setup().stdout)
    assert again["applied"] == [] and again["plan"]["converged"], again
    doctor = lab.sh("belugactl", "doctor", "--json", "-f", MANIFEST, "--host", HOST)
    assert doctor.returncode == 0, doctor.stdout[-3000:]
    timings["whole test"] = time.monotonic() - t_all
    print("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
