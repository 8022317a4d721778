"""belugactl's own setup and doctor on the ram path: 3 guests, a CXL switch, 2 volatile devices each.

Every guest runs `belugactl setup -f examples/lab-ram-rack.yaml` (auto-online policy first, then a
2-way ram region with targets by serial, devdax, the pool header), then again (no changes), then
`belugactl doctor` (green, same pool uuid and layout hash everywhere). Then lab-1 writes into every
host's partition and into the shared KV area, lab-2 and lab-3 read each back, and each write is found
in the backing file the region's geometry names, and `rack doctor --transport lab` shows the 3 x 3
cross-host probe matrix all ok. Then the rack moves to a capacity layout (`setup --force` once, the
dry run first saying it is destructive), lab-1 writes into the shared KV area, and lab-3 joins with
an edited manifest: its setup records the membership in place (a `header.members` step, no --force),
the bytes are still there on every host, doctor is green on all three with the new manifest and
names the stale one. Phase times are printed (run with -s).
Without the Debian packages (no network) the test fails in CI (CI=true) and is skipped elsewhere.
"""

import json
import os
import secrets
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from belugactl.lab import prereqs, ramregion
from belugactl.lab.channel import GuestChannel
from belugactl.lab.paths import STATE_ENV
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest
from tests.support.lab import REPO, our_qemus, run_cli, unavailable

pytestmark = [pytest.mark.lab, pytest.mark.lab_ram, pytest.mark.timeout(900)]

LAB = "pytest-ram-rack"
MANIFEST = REPO / "examples" / "lab-ram-rack.yaml"
HOSTS = ("lab-1", "lab-2", "lab-3")
DAXPOKE = str(REPO / "belugactl" / "lab" / "guest" / "daxpoke.py")
GRANULARITY, WAYS = 4096, 2
CHUNK_BYTES = 16


def _belugactl(ch: GuestChannel, *args: str, timeout: float = 300, manifest: Path = MANIFEST) -> tuple[int, dict, str]:
    # This checkout's code, whatever `belugactl` on the guest's PATH points at.
    argv = [sys.executable, "-m", "belugactl", *args, "-f", str(manifest), "--host", ch.name, "--json"]
    r = ch.run(argv, timeout=timeout, cwd=str(REPO), env={"PYTHONPATH": str(REPO)})
    out, err = r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")
    try:
        doc = json.loads(out)
    except ValueError:
        pytest.fail(f"{ch.name}: belugactl {args[0]} printed no JSON (exit {r.returncode}):\n"
                    f"{out[-2000:]}\n{err[-3000:]}")
    return r.returncode, doc, err


def _poke(ch: GuestChannel, *args: str) -> str:
    r = ch.run(["python3", "-I", "-S", DAXPOKE, *args], timeout=60)
    assert r.returncode == 0, f"{ch.name}: daxpoke {args} failed: {r.stderr.decode(errors='replace')}"
    return r.stdout.decode().strip()


def _on_all(chans: list[GuestChannel], fn, *args):  # noqa: ANN001, ANN202 - a test helper
    with ThreadPoolExecutor(len(chans)) as pool:
        return dict(zip((c.name for c in chans), pool.map(lambda c: fn(c, *args), chans), strict=True))


def _step_ids(doc: dict) -> list[str]:
    return [s["step"]["id"] for s in doc.get("applied", [])]


def test_three_hosts_setup_doctor_and_share_a_ram_region_behind_a_switch(tmp_path):
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
    try:
        t0 = time.monotonic()
        up = run_cli(env, "lab", "up", "--name", LAB, "--profile", "ram", "--switch", "--devices", "2",
                     "--hosts", "3", "--pool-size", "512MiB", "--boot-timeout", "240", "--json", timeout=300)
        assert up.returncode == 0, f"lab up failed:\n{up.stderr}"
        phases["up (3 guests)"] = time.monotonic() - t0
        doc = json.loads(up.stdout)["lab"]
        files = [Path(p) for p in doc["backing"]]
        chans = [GuestChannel(Path(g["spool"]), name=g["name"]) for g in doc["guests"]]
        assert [c.name for c in chans] == list(HOSTS)

        t0 = time.monotonic()
        setups = _on_all(chans, _belugactl, "setup")
        phases["setup (3 in parallel)"] = time.monotonic() - t0
        for host, (rc, report, err) in setups.items():
            assert rc == 0, f"{host}: setup failed:\n{json.dumps(report)[-3000:]}\n{err[-2000:]}"
            ids = _step_ids(report)
            print(f"{host}: setup applied {ids}")
            # The policy before the region: a fresh 6.12 guest has auto_online_blocks = online.
            assert ids.index("autoonline.policy") < ids.index("region.create"), ids
        regions = _on_all(chans, lambda c: json.loads(c.run(["cxl", "list", "-R"], timeout=60).stdout or b"[]"))
        for host, listed in regions.items():
            (region,) = listed
            print(f"{host}: {region['region']} {region['type']} {region['size'] >> 20} MiB, "
                  f"{region['interleave_ways']}-way, granularity {region['interleave_granularity']}")
            assert (region["type"], region["interleave_ways"], region["interleave_granularity"]) == (
                "ram", WAYS, GRANULARITY)

        t0 = time.monotonic()
        reruns = _on_all(chans, _belugactl, "setup")
        phases["setup rerun (3 in parallel)"] = time.monotonic() - t0
        for host, (rc, report, err) in reruns.items():
            assert rc == 0 and _step_ids(report) == [], f"{host}: a rerun changed something: {report}\n{err[-2000:]}"

        t0 = time.monotonic()
        doctors = _on_all(chans, _belugactl, "doctor")
        phases["doctor (3 in parallel)"] = time.monotonic() - t0
        headers = {}
        for host, (rc, report, _err) in doctors.items():
            failed = [c["id"] for c in report["checks"] if c["status"] == "fail"]
            assert rc == 0 and not failed, f"{host}: doctor failed {failed}"
            (header,) = [c for c in report["checks"] if c["id"] == "pool.header"]
            assert header["status"] == "ok"
            headers[host] = (header["details"]["header"]["pool_uuid"], header["details"]["header"]["layout_hash"])
            print(f"{host}: doctor green, pool {headers[host][0]}, layout {headers[host][1][:12]}")
        assert len(set(headers.values())) == 1, headers

        # The rack view: rack doctor over the lab transport, with the cross-host probe matrix (each
        # host writes a nonce at its partition offset; every host reads every host's).
        t0 = time.monotonic()
        r = run_cli(env, "rack", "doctor", "-f", str(MANIFEST), "--transport", "lab", "--lab-name", LAB,
                    "--remote-belugactl", f"env PYTHONPATH={REPO} belugactl", "--json", timeout=600)
        phases["rack doctor + probe matrix"] = time.monotonic() - t0
        try:
            rack_doc = json.loads(r.stdout)
        except ValueError:
            pytest.fail(f"rack doctor printed no JSON (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
        failing = {c: {h: x["status"] for h, x in cells.items()} for c, cells in rack_doc.get("checks", {}).items()
                   if any(x["status"] == "fail" for x in cells.values())}
        assert r.returncode == 0 and rack_doc["failed_hosts"] == [], (
            rack_doc["failed_hosts"], failing, rack_doc.get("unreachable_or_broken"), rack_doc.get("probe"),
            r.stderr[-2000:])
        matrix = rack_doc["probe"]["matrix"]
        assert rack_doc["probe"]["errors"] == {}
        cells = {(rd, w): c["status"] for rd, row in matrix.items() for w, c in row.items()}
        assert cells == {(rd, w): "ok" for rd in HOSTS for w in HOSTS}, cells
        print("probe matrix (reader x writer): " + ", ".join(f"{rd}<-{w} {st}" for (rd, w), st in cells.items()))

        # lab-1 writes into each host's partition and the shared KV area; lab-2 and lab-3 read.
        t0 = time.monotonic()
        layout = resolve_layout(load_manifest(str(MANIFEST)))
        offsets = {f"partition {h}": layout.partition_for(h).offset + 64 for h in HOSTS}
        offsets["shared-kv"] = layout.shared_kv.offset + GRANULARITY + 64  # the second device's chunk
        written = {name: (off, secrets.token_bytes(CHUNK_BYTES)) for name, off in offsets.items()}
        writer, *readers = chans
        for _name, (off, data) in written.items():
            _poke(writer, "write", "/dev/dax0.0", hex(off), data.hex())
        for name, (off, data) in written.items():
            for reader in readers:
                got = _poke(reader, "read", "/dev/dax0.0", hex(off), str(CHUNK_BYTES))
                assert got == data.hex(), f"{reader.name} does not see {writer.name}'s bytes in {name} at {off:#x}"
            position, file_off = ramregion.backing_position(off, WAYS, GRANULARITY)
            with open(files[position], "rb") as fh:
                fh.seek(file_off)
                assert fh.read(CHUNK_BYTES) == data, f"{name} {off:#x} not at {files[position].name}@{file_off:#x}"
            print(f"{name}: dax {off:#x} -> {files[position].name}@{file_off:#x}, read on lab-2 and lab-3")
        phases["1 writer, 2 readers, backing checks"] = time.monotonic() - t0

        t0 = time.monotonic()
        _membership_phase(chans, tmp_path)
        phases["capacity layout, lab-3 joins"] = time.monotonic() - t0
    finally:
        t0 = time.monotonic()
        run_cli(env, "lab", "down", "--name", LAB, timeout=120)
        phases["down"] = time.monotonic() - t0
        for pid in our_qemus(state):  # last resort, still only our own QEMU processes
            os.kill(pid, signal.SIGKILL)
        print("phases: " + ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()))


def _capacity_manifests(tmp_path: Path) -> tuple[Path, Path]:
    """The example with layout.capacity (4 slots of 62 MiB, 4 rings each): lab-1 and lab-2, then all three."""
    text = MANIFEST.read_text().replace(
        "  partition_size: equal     # what remains, split equally between the three hosts\n",
        "  partition_size: 62MiB\n  capacity: {hosts: 4, rings_per_host: 4}\n",
    )
    two = text[: text.index("  - name: lab-3")] + "\n" + text[text.index("tuning:") :]
    paths = tmp_path / "two-hosts.yaml", tmp_path / "three-hosts.yaml"
    paths[0].write_text(two)
    paths[1].write_text(text)
    return paths


def _membership_phase(chans: list[GuestChannel], tmp_path: Path) -> None:
    two, three = _capacity_manifests(tmp_path)
    lab1, lab2, lab3 = chans
    # Moving to a capacity layout is a new layout: the dry run says it destroys, --force does it once.
    rc, refused, err = _belugactl(lab1, "setup", "--dry-run", manifest=two)
    assert rc == 1 and "moving to one is itself a new layout" in json.dumps(refused), (rc, refused, err[-2000:])
    rc, plan, err = _belugactl(lab1, "setup", "--dry-run", "--force", manifest=two)
    steps = {s["id"]: s for s in plan["plan"]["steps"]}
    assert "header.rewrite" in steps and steps["header.rewrite"]["destroys_data"], (rc, plan, err[-2000:])
    rc, report, err = _belugactl(lab1, "setup", "--force", "--yes", manifest=two)
    assert rc == 0 and "header.rewrite" in _step_ids(report), (report, err[-2000:])
    rc, report, err = _belugactl(lab2, "setup", manifest=two)
    assert rc == 0 and "header.rewrite" not in _step_ids(report), (report, err[-2000:])

    layout = resolve_layout(load_manifest(str(three)))
    off, data = layout.shared_kv.offset + 8 * GRANULARITY + 64, secrets.token_bytes(CHUNK_BYTES)
    _poke(lab1, "write", "/dev/dax0.0", hex(off), data.hex())

    # lab-3 joins: its dry run shows a membership step that keeps the cache, then setup records it.
    rc, plan, err = _belugactl(lab3, "setup", "--dry-run", manifest=three)
    steps = {s["id"]: s for s in plan["plan"]["steps"]}
    assert "header.members" in steps and not steps["header.members"]["destroys_data"], (rc, plan, err[-2000:])
    assert "host lab-3 joins in slot 2" in steps["header.members"]["summary"]
    rc, report, err = _belugactl(lab3, "setup", manifest=three)
    assert rc == 0 and "header.members" in _step_ids(report), (report, err[-2000:])
    for ch in chans:
        assert _poke(ch, "read", "/dev/dax0.0", hex(off), str(CHUNK_BYTES)) == data.hex(), ch.name
    doctors = _on_all(chans, lambda c: _belugactl(c, "doctor", manifest=three))
    for host, (rc, report, _err) in doctors.items():
        failed = [c["id"] for c in report["checks"] if c["status"] == "fail"]
        assert rc == 0 and not failed, f"{host}: doctor failed {failed} with the grown rack's manifest"
    # two instances on lab-2 (4 processes, its slot's 4 rings): nothing on media changes, doctor is green
    more = tmp_path / "more-instances.yaml"
    more.write_text(three.read_text().replace("  - name: lab-2\n", "  - name: lab-2\n    instances: 2\n", 1))
    rc, report, _err = _belugactl(lab2, "doctor", manifest=more)
    (header,) = [c for c in report["checks"] if c["id"] == "pool.header"]
    assert header["status"] == "ok", header
    assert resolve_layout(load_manifest(str(more))).ring_for("lab-2", 1, "worker0") == 7  # slot 1: rings 4..7
    rc, report, _err = _belugactl(lab2, "doctor", manifest=two)  # the stale manifest is named as such
    (header,) = [c for c in report["checks"] if c["id"] == "pool.header"]
    assert header["status"] == "fail" and "another membership" in header["reason"], header
    assert "setup" in header["fix"] and header["details"]["members_change"]["removed"] == [{"host": "lab-3", "slot": 2}]
    print(f"capacity layout {layout.layout_hash[:12]}: lab-3 joined in slot 2, shared KV bytes kept on all hosts")
