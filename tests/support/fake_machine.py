"""A stand-in machine for setup tests: a sysfs/procfs tree plus a kernel and tools that react.

This is the hardware boundary and nothing above it: discovery's real readers read the tree and
the tool output; setup's real writers write into the tree. What stands in for the kernel is only
what a plain file cannot do (the /proc/mtrr control protocol, hugepage allocation that may fall
short, THP's bracketed choice); what stands in for cxl/ndctl/daxctl answers their list commands
from a small state that their create/destroy commands change, in the JSON shapes the tools print
(reference/cxl-tooling.md 1).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import uuid as uuid_mod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from belugactl.host.command_runner import RC_NOT_FOUND, CommandResult
from belugactl.host.host import Host
from belugactl.model.layout import resolve_layout
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.setup.target import SetupTarget, target_from_manifest

MiB = 1 << 20
GiB = 1 << 30
ENOSPC_RC = 256 - errno.ENOSPC
EBUSY_RC = 256 - errno.EBUSY

CPUINFO = {
    "intel-clx": ("GenuineIntel", 6, 85),
    "intel-icx": ("GenuineIntel", 6, 106),
    "amd": ("AuthenticAMD", 25, 1),
}


@dataclass
class FakeState:
    version: str = "76.1"
    memdevs: list[dict[str, Any]] = field(default_factory=list)
    root_decoder: dict[str, Any] = field(default_factory=dict)
    regions: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[dict[str, Any]] = field(default_factory=list)
    fail: dict[str, tuple[int, str]] = field(default_factory=dict)  # verb -> (rc, stderr)


class FakeMachine:
    """One host: a tree under `root`, a kernel stand-in, tools stand-in. Pool bytes in `pool_file`."""

    def __init__(
        self,
        root: Path,
        pool_file: Path,
        *,
        hostname: str = "lab-1",
        cpu: str = "intel-clx",
        hugepage_limit: int = 1 << 20,
        variable_mtrrs: int = 8,
        pool_bytes: int = 512 * MiB,
    ) -> None:
        self.root = root
        self.pool_file = pool_file
        self.hugepage_limit = hugepage_limit
        self.variable_mtrrs = variable_mtrrs
        self.state = FakeState(
            memdevs=[{"memdev": "mem0", "pmem_size": pool_bytes, "serial": 0, "host": "0000:0d:00.0"}],
            root_decoder={
                "decoder": "decoder0.0",
                "resource": 0x290000000,
                "size": 4 * GiB,
                "interleave_ways": 1,
                "max_available_extent": 4 * GiB,
                "pmem_capable": True,
                "volatile_capable": True,
                "nr_targets": 1,
            },
        )
        self.mtrr: dict[int, tuple[int, int, str, int]] = {0: (0xC0000000, 1 * GiB, "uncachable", 1)}
        vendor, family, model = CPUINFO[cpu]
        files = {
            "proc/sys/kernel/osrelease": "6.1.0-28-amd64\n",
            "proc/sys/kernel/hostname": hostname + "\n",
            "proc/sys/kernel/random/boot_id": "0b0e7c1e-0000-4000-8000-000000000001\n",
            "proc/cpuinfo": (
                f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                "model name\t: test cpu\nstepping\t: 7\nphysical id\t: 0\nflags\t\t: fpu sse2 clflushopt clwb\n\n"
            ),
            "sys/devices/system/node/online": "0\n",
            "sys/devices/system/node/possible": "0\n",
            "sys/devices/system/node/has_cpu": "0\n",
            "sys/devices/system/node/has_memory": "0\n",
            "sys/devices/system/node/node0/cpulist": "0-1\n",
            "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: 2048000 kB\nNode 0 MemFree: 1024000 kB\n",
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages": "0\n",
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages": "0\n",
            "sys/devices/system/node/node0/hugepages/hugepages-2048kB/surplus_hugepages": "0\n",
            "sys/kernel/mm/transparent_hugepage/enabled": "[always] madvise never\n",
            "etc/passwd": "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n",
            "etc/group": "root:x:0:\ndaemon:x:1:\n",
        }
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        msr = root / "dev/cpu/0/msr"
        msr.parent.mkdir(parents=True, exist_ok=True)
        with open(msr, "wb") as fh:
            fh.seek(0xFE)
            fh.write(variable_mtrrs.to_bytes(8, "little"))
        self._render_mtrr()
        (root / "dev").mkdir(exist_ok=True)
        if not pool_file.exists():
            with open(pool_file, "wb") as fh:
                fh.truncate(pool_bytes - 2 * MiB)
        self.host = KernelHost(self)

    # --- the kernel: /proc/mtrr ---------------------------------------------------------------
    def _render_mtrr(self) -> None:
        lines = []
        for reg, (base, size, kind, count) in sorted(self.mtrr.items()):
            unit, value = ("K", size >> 10) if size < MiB else ("M", size >> 20)
            lines.append(
                f"reg{reg:02d}: base=0x{base >> 12:06x}000 ({base >> 20:5d}MB), size={value:5d}{unit}B, "
                f"count={count}: {kind}"
            )
        (self.root / "proc/mtrr").write_text("".join(line + "\n" for line in lines))

    def mtrr_write(self, text: str) -> None:
        line = text.strip()
        m = re.fullmatch(r"disable=(\d+)", line)
        if m:
            reg = int(m[1])
            if reg not in self.mtrr:
                raise OSError(errno.EINVAL, "no such register")
            base, size, kind, count = self.mtrr[reg]
            if count > 1:
                self.mtrr[reg] = (base, size, kind, count - 1)
            else:
                del self.mtrr[reg]
            self._render_mtrr()
            return
        m = re.fullmatch(r"base=0x([0-9a-f]+) size=0x([0-9a-f]+) type=([a-z-]+)", line)
        if not m:
            raise OSError(errno.EINVAL, "bad control line")
        base, size, kind = int(m[1], 16), int(m[2], 16), m[3]
        if base % 4096 or size % 4096 or size & (size - 1) or base % size:
            raise OSError(errno.EINVAL, "misaligned")
        for reg, (b, s, k, count) in self.mtrr.items():
            if (b, s, k) == (base, size, kind):
                self.mtrr[reg] = (b, s, k, count + 1)
                self._render_mtrr()
                return
        free = [r for r in range(self.variable_mtrrs) if r not in self.mtrr]
        if not free:
            raise OSError(errno.ENOSPC, "no more MTRRs available")
        self.mtrr[free[0]] = (base, size, kind, 1)
        self._render_mtrr()

    # --- the tools ------------------------------------------------------------------------------
    def run(self, argv: tuple[str, ...]) -> CommandResult:
        prog, args = os.path.basename(argv[0]), list(argv[1:])
        if prog not in ("cxl", "ndctl", "daxctl"):
            return CommandResult(argv, RC_NOT_FOUND, "", f"{prog}: not found", not_found=True)
        verb = args[0] if args else ""
        if f"{prog} {verb}" in self.state.fail:
            rc, err = self.state.fail[f"{prog} {verb}"]
            return CommandResult(argv, rc, "", err)
        if verb == "version":
            return CommandResult(argv, 0, self.state.version + "\n")
        handler = getattr(self, f"_{prog}_{verb.replace('-', '_')}", None)
        if handler is None:
            return CommandResult(argv, 129, "", f"unexpected command: {shlex.join(argv)}")
        return handler(argv, args[1:])

    def _json(self, argv: tuple[str, ...], data: Any) -> CommandResult:
        return CommandResult(argv, 0, json.dumps(data) + "\n")

    def _cxl_list(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        if "-M" in args:
            return self._json(argv, self.state.memdevs)
        if "-D" in args and "root" in args:
            used = sum(r["size"] for r in self.state.regions)
            dec = dict(self.state.root_decoder, max_available_extent=self.state.root_decoder["size"] - used)
            return self._json(argv, [dec])
        if "-D" in args:
            return self._json(argv, [])
        if "-R" in args:
            return self._json(argv, self.state.regions)
        return self._json(argv, [])

    def _cxl_create_region(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        opts, memdevs = _options(args, flags={"-m"})
        used = sum(r["size"] for r in self.state.regions)
        size = int(opts.get("-s", self.state.memdevs[0]["pmem_size"]))
        if size > self.state.root_decoder["size"] - used:
            return CommandResult(argv, ENOSPC_RC, "", "region size exceeds max available space")
        n = len(self.state.regions)
        region = {
            "region": f"region{n}",
            "resource": self.state.root_decoder["resource"] + used,
            "size": size,
            "interleave_ways": int(opts.get("-w", 1)),
            "interleave_granularity": 256,
            "decode_state": "commit",
            "mappings": [{"position": i, "memdev": m, "decoder": f"decoder2.{i}"} for i, m in enumerate(memdevs)],
        }
        self.state.regions.append(region)
        return CommandResult(argv, 0, json.dumps(region) + "\n", "cxl region: cmd_create_region: created 1 region\n")

    def _cxl_destroy_region(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        name = args[-1]
        before = len(self.state.regions)
        self.state.regions = [r for r in self.state.regions if r["region"] != name]
        if len(self.state.regions) == before:
            return CommandResult(argv, 256 - errno.ENXIO, "", f"{name}: not found")
        return CommandResult(argv, 0, "", "destroyed 1 region\n")

    def _ndctl_list(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        regions = []
        for i, r in enumerate(self.state.regions):
            nd = {"dev": f"region{i}", "size": r["size"], "align": 16 * MiB, "type": "pmem"}
            spaces = [n for n in self.state.namespaces if n["_region"] == nd["dev"]]
            if spaces:
                nd["namespaces"] = [{k: v for k, v in n.items() if not k.startswith("_")} for n in spaces]
            regions.append(nd)
        if not regions:
            return CommandResult(argv, 0, "")
        return self._json(argv, [{"provider": "CXL", "dev": "ndbus0", "regions": regions}])

    def _ndctl_create_namespace(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        opts, _ = _options(args, flags={"-f"})
        region = opts.get("-r")
        if "-e" in opts:
            old = next(n for n in self.state.namespaces if n["dev"] == opts["-e"])
            region = old["_region"]
            self.state.namespaces.remove(old)
        nd = next((i for i, _ in enumerate(self.state.regions) if f"region{i}" == region), None)
        if nd is None:
            return CommandResult(argv, ENOSPC_RC, "", "failed to create namespace: No space left on device")
        size = self.state.regions[nd]["size"] - 2 * MiB  # map=mem: the first 2 MiB hold the info block
        ns = {
            "dev": f"namespace{nd}.0",
            "mode": opts.get("-m", "fsdax"),
            "map": opts.get("-M", "dev"),
            "size": size,
            # As the lab's ndctl 76 shows: a devdax namespace's "uuid" is its info block's (random);
            # the label uuid given with -u is in sysfs (and in `ndctl list -v` as raw_uuid).
            "uuid": str(uuid_mod.uuid4()),
            "name": opts.get("-n"),
            "align": 2 * MiB,
            "chardev": f"dax{nd}.0",
            "_region": region,
        }
        self.state.namespaces.append(ns)
        self.write(f"sys/bus/nd/devices/{ns['dev']}/uuid", f"{opts.get('-u')}\n")
        self._make_dax(f"dax{nd}.0", size, self.state.regions[nd]["resource"] + 2 * MiB)
        return CommandResult(argv, 0, json.dumps({k: v for k, v in ns.items() if not k.startswith("_")}) + "\n")

    def _ndctl_destroy_namespace(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        name = args[-1]
        ns = next((n for n in self.state.namespaces if n["dev"] == name), None)
        if ns is None:
            return CommandResult(argv, 256 - errno.ENXIO, "", f"{name}: not found")
        self.state.namespaces.remove(ns)
        (self.root / f"sys/bus/nd/devices/{name}/uuid").unlink()
        (self.root / f"sys/bus/nd/devices/{name}").rmdir()
        dev = self.root / "dev" / ns["chardev"]
        dev.unlink(missing_ok=True)
        sysdir = self.root / "sys/bus/dax/devices" / ns["chardev"]
        for child in sysdir.iterdir():
            child.unlink()
        sysdir.rmdir()
        return CommandResult(argv, 0, "", "destroyed 1 namespace\n")

    def _daxctl_list(self, argv: tuple[str, ...], args: list[str]) -> CommandResult:
        devices = [
            {"chardev": n["chardev"], "size": n["size"], "target_node": 0, "align": 2 * MiB, "mode": "devdax"}
            for n in self.state.namespaces
        ]
        if not devices:
            return CommandResult(argv, 0, "")
        return self._json(argv, [{"id": 0, "size": devices[0]["size"], "align": 2 * MiB, "devices": devices}])

    def _make_dax(self, name: str, size: int, resource: int) -> None:
        sysdir = self.root / "sys/bus/dax/devices" / name
        sysdir.mkdir(parents=True, exist_ok=True)
        (sysdir / "size").write_text(f"{size}\n")
        (sysdir / "align").write_text(f"{2 * MiB}\n")
        (sysdir / "resource").write_text(f"{resource:#x}\n")
        dev = self.root / "dev" / name
        dev.unlink(missing_ok=True)
        dev.symlink_to(self.pool_file)  # every host's device maps the same pool bytes
        os.chmod(self.pool_file, 0o600)
        os.chown(self.pool_file, 0, 0)

    # --- what tests look at -------------------------------------------------------------------
    def read(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _options(args: list[str], flags: set[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in flags:
            opts[a] = ""
            i += 1
        elif a.startswith("-"):
            opts[a] = args[i + 1]
            i += 2
        else:
            rest.append(a)
            i += 1
    return opts, rest


class KernelHost(Host):
    """Host over the fake tree whose writes to kernel control files behave like the kernel's."""

    HUGEPAGES = re.compile(r"/sys/devices/system/node/node(\d+)/hugepages/hugepages-(\d+)kB/nr_hugepages")

    def __init__(self, machine: FakeMachine) -> None:
        super().__init__(machine.root, _Runner(machine))
        self.machine = machine

    def write_text(self, p: str, text: str) -> None:
        if p == "/proc/mtrr":
            self.machine.mtrr_write(text)
            return
        m = self.HUGEPAGES.fullmatch(p)
        if m:
            # The kernel takes the request and reserves what free memory allows, silently.
            got = min(int(text.strip()), self.machine.hugepage_limit)
            super().write_text(p, f"{got}\n")
            super().write_text(p.replace("nr_hugepages", "free_hugepages"), f"{got}\n")
            return
        if p.endswith("transparent_hugepage/enabled"):
            choice = text.strip()
            choices = ["always", "madvise", "never"]
            if choice not in choices:
                raise OSError(errno.EINVAL, "invalid argument")
            super().write_text(p, " ".join(f"[{c}]" if c == choice else c for c in choices) + "\n")
            return
        super().write_text(p, text)


class _Runner:
    def __init__(self, machine: FakeMachine) -> None:
        self.machine = machine
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Any, *, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        args = tuple(str(a) for a in argv)
        self.calls.append(args)
        return self.machine.run(args)


LAB = Path(__file__).resolve().parents[2] / "examples" / "lab.yaml"


def lab_target(host: str = "lab-1", *, edit: dict[str, str] | None = None) -> SetupTarget:
    """The lab example manifest, optionally with text replacements (each must apply)."""
    text = LAB.read_text()
    for old, new in (edit or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    manifest = load_manifest_text(text, file="lab.yaml")
    return target_from_manifest(manifest, host, layout=resolve_layout(manifest))
