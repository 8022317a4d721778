from pathlib import Path

import pytest

from belugactl.lab import qemu


def _spec(tmp_path: Path, name: str = "lab-1", index: int = 1, **kw) -> qemu.GuestSpec:
    g = tmp_path / "guests" / name
    return qemu.GuestSpec(
        name=name, index=index, kernel=tmp_path / "vmlinuz", initramfs=tmp_path / "initrd",
        pool=tmp_path / "pool.raw", pool_size=512 << 20, lsa=g / "lsa.raw", spool=g / "spool",
        console=g / "console.log", **kw,
    )


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_two_root_ports_under_the_host_bridge_and_the_device_on_one_of_them(tmp_path):
    argv = qemu.argv(_spec(tmp_path))
    devices = _values(argv, "-device")
    bridges = [d for d in devices if d.startswith("pxb-cxl,")]
    assert len(bridges) == 1
    bridge_id = dict(kv.split("=") for kv in bridges[0].split(",")[1:])["id"]
    ports = [dict(kv.split("=") for kv in d.split(",")[1:]) for d in devices if d.startswith("cxl-rp,")]
    # One root port makes QEMU 7.2 drop every write to the region: this must never regress.
    assert len(ports) == 2 and {p["bus"] for p in ports} == {bridge_id}
    assert len({p["port"] for p in ports}) == 2
    t3 = [dict(kv.split("=") for kv in d.split(",")[1:]) for d in devices if d.startswith("cxl-type3,")]
    assert len(t3) == 1 and t3[0]["bus"] in {p["id"] for p in ports}
    assert any(m.startswith(f"cxl-fmw.0.targets.0={bridge_id}") for m in _values(argv, "-M"))


def test_guests_share_the_pool_file_but_not_the_label_area_or_serial(tmp_path):
    a = qemu.argv(_spec(tmp_path, "lab-1", 1))
    b = qemu.argv(_spec(tmp_path, "lab-2", 2))
    pool_a = [o for o in _values(a, "-object") if "id=cxl-mem1" in o][0]
    pool_b = [o for o in _values(b, "-object") if "id=cxl-mem1" in o][0]
    assert pool_a == pool_b and "share=on" in pool_a and f"mem-path={tmp_path / 'pool.raw'}" in pool_a
    lsa_a = [o for o in _values(a, "-object") if "id=cxl-lsa1" in o][0]
    lsa_b = [o for o in _values(b, "-object") if "id=cxl-lsa1" in o][0]
    assert lsa_a != lsa_b and "share=on" in lsa_a
    sn = [[d for d in _values(x, "-device") if d.startswith("cxl-type3")][0].rsplit("sn=", 1)[1] for x in (a, b)]
    assert sn[0] != sn[1]


def test_host_root_is_read_only_and_the_spool_writable(tmp_path):
    argv = qemu.argv(_spec(tmp_path, repo=tmp_path / "repo"))
    fsdevs = {f.split(",")[1]: f for f in _values(argv, "-fsdev")}
    assert "readonly=on" in fsdevs["id=hostroot"] and "path=/," in fsdevs["id=hostroot"]
    assert "readonly=on" in fsdevs["id=repo"]
    assert "readonly" not in fsdevs["id=spool"]


def test_tcg_by_default_and_kvm_only_when_asked(tmp_path):
    assert "tcg,thread=multi" in _values(qemu.argv(_spec(tmp_path)), "-accel")
    assert _values(qemu.argv(_spec(tmp_path, accel="kvm")), "-accel") == ["kvm"]
    with pytest.raises(ValueError):
        qemu.argv(_spec(tmp_path, accel="hvf"))


def test_is_guest_process_needs_qemu_and_this_guests_directory(tmp_path):
    spec = _spec(tmp_path)
    argv = qemu.argv(spec)
    gdir = spec.console.parent
    assert qemu.is_guest_process(argv, gdir)
    assert not qemu.is_guest_process(argv, gdir.parent / "lab-2")
    assert not qemu.is_guest_process(["sleep", "100", f"path={gdir}/console.log"], gdir)
    assert not qemu.is_guest_process(None, gdir)
    # A sibling whose name merely starts the same (lab-1 vs lab-10) is not this guest.
    other = qemu.argv(_spec(tmp_path, "lab-10", 10))
    assert not qemu.is_guest_process(other, gdir)


def test_commas_in_paths_are_escaped_for_qemu(tmp_path):
    spec = _spec(tmp_path / "a,b")
    pool = [o for o in _values(qemu.argv(spec), "-object") if "id=cxl-mem1" in o][0]
    assert f"mem-path={tmp_path}/a,,b/pool.raw," in pool


def test_one_root_port_only_when_asked_for(tmp_path):
    devices = _values(qemu.argv(_spec(tmp_path, root_ports=1)), "-device")
    assert len([d for d in devices if d.startswith("cxl-rp,")]) == 1
