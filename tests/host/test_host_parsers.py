"""The small text formats discovery parses: kernel lists, meminfo, THP choices, MTRR, cpuinfo, lockdown."""

from __future__ import annotations

from belugactl.host.read_cpu import parse_cpuinfo
from belugactl.host.read_kernel import parse_lockdown
from belugactl.host.read_mtrr import parse_mtrr
from belugactl.host.read_numa import parse_choice, parse_list, parse_meminfo
from belugactl.host.read_pci import classify, pci_chain, root_port_of


def test_kernel_lists() -> None:
    assert parse_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_list("\n") == []
    assert parse_list("0-x") is None
    assert parse_list(None) is None


def test_meminfo_units() -> None:
    text = "Node 0 MemTotal:        5204184 kB\nNode 0 MemFree:  1000 kB\nNode 0 HugePages_Total:     7\n"
    assert parse_meminfo(text) == {"MemTotal": 5204184 * 1024, "MemFree": 1000 * 1024, "HugePages_Total": 7}


def test_bracketed_choice() -> None:
    assert parse_choice("always [madvise] never") == ("madvise", ["always", "madvise", "never"])
    assert parse_choice("always defer defer+madvise [madvise] never")[0] == "madvise"
    assert parse_choice("") == (None, [])


def test_mtrr_lines() -> None:
    text = (
        "reg00: base=0x000000000 (    0MB), size= 2048MB, count=1: write-back\n"
        "reg01: base=0x0c0000000 ( 3072MB), size=  512KB, count=2: uncachable\n"
        "reg02: base=0x2080000000 (133120MB), size=65536MB, count=1: write-combining\n"
        "this is not an mtrr line\n"
    )
    entries, bad = parse_mtrr(text)
    assert [(e.reg, e.base, e.size, e.type, e.count) for e in entries] == [
        (0, 0, 2048 << 20, "write-back", 1),
        (1, 0xC0000000, 512 << 10, "uncachable", 2),
        (2, 0x2080000000, 65536 << 20, "write-combining", 1),
    ]
    assert bad == ["this is not an mtrr line"]


def test_cpuinfo_without_physical_id_is_one_socket() -> None:
    text = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nflags\t\t: fpu clwb\n\n"
    cpu = parse_cpuinfo(text)
    assert (cpu.vendor, cpu.family, cpu.model, cpu.sockets, cpu.cpus) == ("GenuineIntel", 6, 85, 1, 1)
    assert cpu.flags == frozenset({"fpu", "clwb"}) and cpu.hypervisor is False
    assert parse_cpuinfo("").vendor is None


def test_lockdown() -> None:
    assert parse_lockdown("none [integrity] confidentiality") == (
        "integrity", ["none", "integrity", "confidentiality"],
    )
    assert parse_lockdown(None) == (None, [])


def test_pci_paths_and_classes() -> None:
    path = "/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0"
    assert pci_chain(path) == ["0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0"]
    assert root_port_of(path) == "0000:15:01.0"
    assert root_port_of("/sys/devices/pci0000:00/0000:00:03.0") is None  # on the root complex itself
    assert root_port_of(None) is None
    assert classify(0x030200, 0x10DE) == "gpu"
    assert classify(0x030000, 0x1002) == "gpu"
    assert classify(0x030000, 0x1A03) == "other"  # a BMC's VGA
    assert classify(0x050210, 0x8086) == "cxl"
    assert classify(0x010802, 0x144D) == "nvme"
    assert classify(0x020000, 0x15B3) == "nic"
    assert classify(0x060400, 0x8086) is None
    assert classify(None, None) is None


def test_udev_is_only_asked_on_the_live_root() -> None:
    from belugactl.host.read_udev import dax_devnames, has_udev_db
    from tests.support.fixture_trees import host

    problems: list[str] = []
    fixture = host("beluga-intel")
    assert has_udev_db(fixture) is True
    # A tree's udev database is not this machine's: the sysfs defaults stand.
    assert dax_devnames(fixture, problems) is None
    assert problems == []
    assert has_udev_db(host("lab-guest")) is False


def test_cpuinfo_physical_address_width() -> None:
    from belugactl.host.read_cpu import parse_cpuinfo

    text = "processor\t: 0\nvendor_id\t: GenuineIntel\naddress sizes\t: 46 bits physical, 57 bits virtual\n"
    assert parse_cpuinfo(text).phys_address_bits == 46
    assert parse_cpuinfo("processor\t: 0\n").phys_address_bits is None
    assert parse_cpuinfo("processor\t: 0\naddress sizes\t: garbage\n").phys_address_bits is None
