"""Bringing a lab rack up, reporting on it, and taking it down.

A lab is a state directory (see `belugactl.lab.paths`): lab.json, the pool file, and one folder per
guest with its LSA file, console log, pid file and spool. Guests are QEMU processes that this code
starts in their own sessions and later stops by pid, after checking that the pid is still that
guest's QEMU. Nothing is ever killed by name.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import belugactl
from belugactl.errors import EnvironmentProblem, StepFailed, UsageError
from belugactl.lab import accel as accel_mod
from belugactl.lab import debstack, prereqs, proc, qemu
from belugactl.lab import initramfs as initramfs_mod
from belugactl.lab import kernel as kernel_mod
from belugactl.lab import ssh as ssh_mod
from belugactl.lab.channel import GuestChannel
from belugactl.lab.paths import GuestPaths, LabPaths, cache_root, guest_name, state_root, valid_lab_name
from belugactl.lab.topology import MAX_DEVICES, RamTopology
from belugactl.units import format_size

DEFAULT_NAME = "default"
DEFAULT_HOSTS = 2
DEFAULT_POOL = 512 * 1024 * 1024
MAX_HOSTS = 16
# CXL HDM decoders work in 256 MiB units; the pool must fit the 4 GiB fixed memory window.
POOL_UNIT = 256 * 1024 * 1024
POOL_MAX = 4 * 1024 * 1024 * 1024
DEFAULT_BOOT_TIMEOUT_S = 240.0
# Loaded in every guest at boot (no udev there to load them on demand).
GUEST_MODULES = ("cxl_acpi", "cxl_pci", "cxl_mem", "cxl_pmem", "nd_pmem", "dax_pmem", "device_dax", "kmem")
# Profile ram: no kmem, so a new ram region's dax device stays driverless (not onlined as System RAM,
# see trap 2 in qemu-cxl-lab-v2.md) until `daxctl reconfigure-device --mode=devdax` binds device_dax.
RAM_GUEST_MODULES = ("cxl_acpi", "cxl_pci", "cxl_mem", "cxl_pmem", "dax_cxl", "device_dax")
PROFILES = qemu.PROFILES
DEFAULT_PROFILE = "ram"  # the production path: volatile devices, a ram region, devdax
# The topology each profile gets when --devices / --switch are not given: ram mirrors a Beluga host
# (two devices behind a switch); pmem (QEMU 7.2) can only emulate one persistent device per guest.
DEFAULT_TOPOLOGY = {"ram": (2, True), "pmem": (1, False)}
HEARTBEAT_STALE_S = 30.0
RESIDENT_CLI_ENV = "BELUGACTL_LAB_WARM"  # public: the name predates "resident CLI"

Progress = Callable[[str], None]


@dataclass
class GuestRecord:
    name: str
    index: int
    pid: int | None = None
    started_at: float | None = None  # epoch seconds
    boot_s: float | None = None  # QEMU start to agent ready, wall clock
    guest_uptime_at_ready_s: float | None = None
    ssh_port: int | None = None  # 127.0.0.1:ssh_port reaches this guest's sshd (lab up --ssh)


@dataclass
class LabRecord:
    name: str
    hosts: int
    pool_size: int
    memory_mib: int
    accel: str
    kernel: dict[str, str]
    initramfs: str
    created_at: float
    repo: str
    venv: str
    guests: list[GuestRecord] = field(default_factory=list)
    root_ports: int = 2
    ssh: bool = False
    profile: str = "pmem"
    devices: int = 1  # ram: volatile type-3 devices per guest, each backed by its own shared file
    switch: bool = False  # ram: the devices sit behind an emulated CXL switch
    backing: list[str] = field(default_factory=list)  # ram: the device files, device 0 first
    host_ports: list[int] = field(default_factory=list)  # guests reach 127.0.0.1:PORT at qemu.HOST_ALIAS:PORT

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LabRecord:
        guests = [GuestRecord(**g) for g in data.get("guests", [])]
        fields = {k: v for k, v in data.items() if k != "guests"}
        return cls(**fields, guests=guests)


@dataclass
class GuestStatus:
    name: str
    state: str  # running | booting | unresponsive | crashed | stopped
    pid: int | None
    detail: str
    console: str
    spool: str
    share: str
    boot_s: float | None
    console_tail: list[str] = field(default_factory=list)
    ssh_port: int | None = None


@dataclass
class LabStatus:
    name: str
    state: str  # up | degraded | down
    dir: str
    pool: str | None
    pool_size: int | None
    kernel: dict[str, str] | None
    accel: str | None
    guests: list[GuestStatus]
    ssh_config: str | None = None  # ssh -F THIS lab-1, when the lab was brought up with --ssh
    profile: str = "pmem"
    devices: int = 1
    switch: bool = False
    backing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class UpReport:
    status: LabStatus
    boot_wall_s: float
    accel: accel_mod.AccelReport
    kernel_prepared_s: float

    def to_dict(self) -> dict[str, object]:
        return {
            "lab": self.status.to_dict(),
            "boot_wall_s": round(self.boot_wall_s, 2),
            "accel": self.accel.to_dict(),
            "prepare_s": round(self.kernel_prepared_s, 2),
        }


@dataclass
class DownReport:
    name: str
    existed: bool
    stopped: list[str]
    already_gone: list[str]
    refused: list[str]  # pids that are no longer our QEMU, left alone
    removed: str | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _quiet(_: str) -> None:
    pass


def lab_paths(name: str = DEFAULT_NAME) -> LabPaths:
    if not valid_lab_name(name):
        raise UsageError(f"invalid lab name {name!r}", fix="use letters, digits, '.', '_' or '-' (at most 32)")
    return LabPaths(state_root(), name)


def load(paths: LabPaths) -> LabRecord | None:
    try:
        return LabRecord.from_dict(json.loads(paths.state_file.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise EnvironmentProblem(
            f"unreadable lab state {paths.state_file}", why=str(exc), fix=f"belugactl lab down --name {paths.name}"
        ) from exc


def _save(paths: LabPaths, record: LabRecord) -> None:
    tmp = paths.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(record.to_dict(), indent=1) + "\n")
    os.replace(tmp, paths.state_file)


@contextmanager
def _locked(paths: LabPaths) -> Iterator[None]:
    """One `up` or `down` of a lab at a time."""
    paths.root.mkdir(parents=True, exist_ok=True)
    lock = paths.root / f".{paths.name}.lock"
    with open(lock, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise EnvironmentProblem(
                f"another belugactl is bringing lab {paths.name!r} up or down", fix="wait for it to finish"
            ) from exc
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)


# --- prepare -----------------------------------------------------------------------------------
def prepare(
    *, install: bool = False, refresh: bool = False, profile: str = DEFAULT_PROFILE, progress: Progress = _quiet
) -> dict[str, object]:
    """Packages (checked, or installed with `install`), the guest kernel and the initramfs, cached."""
    if profile not in PROFILES:
        raise UsageError(f"--profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if profile == "ram":
        return prepare_ram(refresh=refresh, progress=progress)
    installed: list[str] = []
    if install:
        from belugactl.host.command_runner import SubprocessRunner

        installed = prereqs.install(SubprocessRunner())
    prereqs.require()
    cache = cache_root()
    start = time.monotonic()
    kernel = kernel_mod.find(cache) if not refresh else None
    if kernel is None:
        progress(f"downloading the guest kernel into {cache}")
        kernel = kernel_mod.prepare(cache, refresh=refresh)
    image = initramfs_mod.build(kernel, cache)
    boot = kernel_mod.boot_image(kernel)
    return {
        "boot_image": str(boot),
        "installed_packages": installed,
        "cache": str(cache),
        "kernel": kernel.to_dict(),
        "initramfs": str(image.path),
        "initramfs_size": image.size,
        "seconds": round(time.monotonic() - start, 2),
    }


def ram_tools(stack: debstack.RamStack) -> initramfs_mod.RamTools:
    return initramfs_mod.RamTools(stack.tree / "usr" / "bin", stack.libdir)


def prepare_ram(*, refresh: bool = False, progress: Progress = _quiet) -> dict[str, object]:
    """The ram profile: QEMU 10, seabios, kernel 6.12 and the CXL tools 81 unpacked from Debian packages."""
    busybox = prereqs.find_program("busybox")
    if busybox is None or not prereqs.is_static_elf(busybox.resolve()):
        raise EnvironmentProblem("a static busybox is needed for the guests' initramfs",
                                 fix="apt-get install -y busybox-static")
    cache = cache_root()
    start = time.monotonic()
    stack = debstack.load(cache) if not refresh else None
    if stack is None:
        progress(f"fetching the ram profile's Debian packages into {debstack.stack_dir(cache)}")
        stack = debstack.prepare(cache, refresh=refresh, progress=progress)
    image = initramfs_mod.build(stack.kernel, cache, busybox, tools=ram_tools(stack))
    boot = kernel_mod.boot_image(stack.kernel)
    return {
        "profile": "ram",
        "boot_image": str(boot),
        "installed_packages": [],
        "cache": str(cache),
        "kernel": stack.kernel.to_dict(),
        "qemu": str(stack.qemu),
        "firmware": str(stack.firmware),
        "packages": stack.to_dict()["packages"],
        "download_bytes": stack.to_dict()["download_bytes"],
        "tree_bytes": stack.tree_size(),
        "initramfs": str(image.path),
        "initramfs_size": image.size,
        "seconds": round(time.monotonic() - start, 2),
    }


# --- up ----------------------------------------------------------------------------------------
def _guest_path(venv: Path, profile: str = "pmem") -> str:
    tools = f"{initramfs_mod.GUEST_TOOLS}/bin:" if profile == "ram" else ""
    return f"{tools}{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _guest_env(
    kernel: kernel_mod.GuestKernel,
    name: str,
    venv: Path,
    repo: Path,
    root_cache: str,
    ssh: bool = False,
    profile: str = "pmem",
    net: bool = False,
) -> str:
    agent = (Path(__file__).parent / "guest" / "agent.py").resolve()  # run as a script: see lab/guest/
    net = net or ssh
    modules = (RAM_GUEST_MODULES if profile == "ram" else GUEST_MODULES) + (ssh_mod.NET_MODULES if net else ())
    values = {
        "LAB_HOSTNAME": name,
        "LAB_KERNEL_VERSION": kernel.version,
        "LAB_MODULES_DIR": str(kernel.modules_dir.resolve()),
        "LAB_MODULES": " ".join(modules),
        "LAB_PYTHON": os.path.realpath(sys.executable),
        "LAB_AGENT": str(agent),
        "LAB_ROOT_CACHE": root_cache,
        "LAB_REPO": str(repo),
        "LAB_VENV": str(venv),
        "LAB_PATH": _guest_path(venv, profile),
        "LAB_SSH": "1" if ssh else "",
        "LAB_NET": "1" if net else "",
        # A resident belugactl in the guest that forks per command (belugactl.lab.guest.resident_cli):
        # BELUGACTL_LAB_WARM=0 turns it off, to measure or to debug the plain path.
        "LAB_RESIDENT_PYTHON": str(venv / "bin" / "python") if os.environ.get(RESIDENT_CLI_ENV, "1") != "0" else "",
    }
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())


def _make_sparse(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)


def _spawn(argv: list[str], guest: GuestPaths) -> int:
    with open(guest.qemu_log, "wb") as log:
        child = subprocess.Popen(  # noqa: S603 - argv list, no shell
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    # Not waited for here: the guest outlives this process. proc.alive() reaps it if we are its parent.
    child.returncode = 0  # keeps Popen.__del__ from warning about a child it was never meant to wait for
    guest.pidfile.write_text(f"{child.pid}\n")
    return child.pid


def validate(
    hosts: int,
    pool_size: int,
    memory_mib: int,
    root_ports: int = 2,
    profile: str = DEFAULT_PROFILE,
    devices: int = 1,
    switch: bool = False,
) -> None:
    if profile not in PROFILES:
        raise UsageError(f"--profile must be one of {', '.join(PROFILES)}, not {profile!r}")
    if profile == "pmem" and (devices != 1 or switch):
        raise UsageError("--devices and --switch need --profile ram",
                         why="the pmem profile (QEMU 7.2) emulates one persistent device per guest",
                         fix="belugactl lab up --profile ram --devices N [--switch]")
    if not 1 <= devices <= MAX_DEVICES:
        raise UsageError(f"--devices must be between 1 and {MAX_DEVICES}, not {devices}")
    if profile == "ram" and pool_size % (devices * POOL_UNIT):
        raise UsageError(
            f"--pool-size {format_size(pool_size)} does not split into {devices} devices of a multiple of 256 MiB",
            why="each device gets pool-size / devices, and CXL decoders map memory in 256 MiB units",
            fix=f"e.g. --pool-size {format_size(devices * POOL_UNIT)}",
        )
    if not 1 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be between 1 and {MAX_HOSTS}, not {hosts}")
    if pool_size % POOL_UNIT or not POOL_UNIT <= pool_size <= POOL_MAX:
        raise UsageError(
            f"--pool-size {format_size(pool_size)} is not a multiple of 256 MiB between 256 MiB and 4 GiB",
            why="CXL decoders map memory in 256 MiB units and the lab's fixed memory window is 4 GiB",
            fix="e.g. --pool-size 512MiB",
        )
    if memory_mib < 256:
        raise UsageError("--memory must be at least 256 MiB")
    if root_ports not in (1, 2):
        raise UsageError("--root-ports must be 1 or 2")


def up(
    *,
    name: str = DEFAULT_NAME,
    hosts: int = DEFAULT_HOSTS,
    pool_size: int = DEFAULT_POOL,
    memory_mib: int = 1024,
    accel: str = "auto",
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S,
    root_cache: str = "loose",
    root_ports: int = 2,
    ssh: bool = False,
    profile: str = DEFAULT_PROFILE,
    devices: int | None = None,
    switch: bool | None = None,
    progress: Progress = _quiet,
    host_ports: tuple[int, ...] = (),
) -> UpReport:
    default_devices, default_switch = DEFAULT_TOPOLOGY.get(profile, (1, False))
    devices = default_devices if devices is None else devices
    switch = default_switch if switch is None else switch
    validate(hosts, pool_size, memory_mib, root_ports, profile, devices, switch)
    if ssh and profile != "pmem":
        raise UsageError("--ssh is only built for the pmem profile so far",
                         why="the ram profile's kernel 6.12 boots without the network modules sshd needs",
                         fix="belugactl lab up --profile pmem --ssh, or use `belugactl lab exec` on the ram profile")
    if host_ports and profile != "pmem":
        raise UsageError("--host-port is only built for the pmem profile so far",
                         why="the ram profile's kernel 6.12 boots without the network modules it needs",
                         fix="belugactl lab up --profile pmem --host-port PORT")
    if bad := [p for p in host_ports if not 1 <= p <= 65535]:
        raise UsageError(f"--host-port {bad[0]} is not a TCP port", fix="give a port between 1 and 65535")
    host_ports = tuple(dict.fromkeys(host_ports))  # a port named twice is one forward (QEMU refuses two)
    paths = lab_paths(name)
    if profile == "pmem":
        prereqs.require()
    keygen = ssh_mod.require()[1] if ssh else None
    with _locked(paths):
        existing = load(paths)
        if existing is not None or paths.dir.exists():
            st = status(name)
            raise UsageError(
                f"lab {name!r} already exists ({st.state})",
                why=f"its state is in {paths.dir}",
                fix=f"belugactl lab status --name {name}; belugactl lab down --name {name}",
            )
        t0 = time.monotonic()
        prep = prepare(profile=profile, progress=progress)
        prepared_s = time.monotonic() - t0
        cache = cache_root()
        stack = debstack.load(cache) if profile == "ram" else None
        kernel = stack.kernel if stack is not None else kernel_mod.find(cache)
        assert kernel is not None  # prepare() made it
        ram: RamTopology | None = None
        if profile == "ram":
            ram = RamTopology(tuple(paths.dir / f"pool-{i}.raw" for i in range(devices)), pool_size // devices, switch)
        image = Path(str(prep["initramfs"]))
        boot_image = Path(str(prep["boot_image"]))
        chosen = accel_mod.choose(accel)
        venv = Path(sys.prefix)
        repo = Path(belugactl.__file__).resolve().parent.parent
        record = LabRecord(
            name=name,
            hosts=hosts,
            pool_size=pool_size,
            memory_mib=memory_mib,
            accel=chosen.chosen,
            kernel=kernel.to_dict(),
            initramfs=str(image),
            created_at=time.time(),
            repo=str(repo),
            venv=str(venv),
            root_ports=root_ports,
            ssh=ssh,
            profile=profile,
            devices=devices,
            switch=switch,
            backing=[str(p) for p in ram.backing] if ram else [],
            host_ports=list(host_ports),
        )
        paths.dir.mkdir(parents=True)
        if ram is None:
            _make_sparse(paths.pool, pool_size)
        else:
            for path in ram.backing:
                _make_sparse(path, ram.device_size)
        ssh_files = ssh_mod.SshFiles(paths.ssh_dir)
        ports: dict[str, int] = {}
        if keygen is not None:
            ssh_mod.make_keys(ssh_files, name, keygen)
        specs = []
        for i in range(1, hosts + 1):
            gname = guest_name(i)
            g = paths.guest(gname)
            for d in (g.dir, g.spool, g.share, g.spool / "req", g.spool / "out", g.spool / "cancel"):
                d.mkdir(parents=True, exist_ok=True)
            if ram is None:
                _make_sparse(g.lsa, qemu.LSA_SIZE)
            (g.spool / "guest.env").write_text(
                _guest_env(kernel, gname, venv, repo, root_cache, ssh, profile, net=bool(host_ports))
            )
            if keygen is not None:
                ports[gname] = _unused_port(ports.values())
                ssh_mod.install_guest(ssh_files, g.spool, f"{initramfs_mod.GUEST_SPOOL}/{ssh_mod.GUEST_SSH_DIR}",
                                      {"PATH": _guest_path(venv, profile), **guest_env(name, gname)})
            specs.append(
                (g, qemu.GuestSpec(gname, i, boot_image, image, paths.pool, pool_size, g.lsa, g.spool,
                                   g.console, memory_mib, chosen.chosen, repo=repo,
                                   root_ports=root_ports, ssh_port=ports.get(gname), host_ports=tuple(host_ports),
                                   profile=profile, ram=ram,
                                   firmware=stack.firmware if stack else None))
            )
            record.guests.append(GuestRecord(gname, i, ssh_port=ports.get(gname)))
        if ports:
            ssh_mod.write_client_files(ssh_files, paths.ssh_config, ports)
        _save(paths, record)
        progress(f"booting {hosts} guest{'s' if hosts > 1 else ''} ({chosen.chosen}) from {paths.dir}")
        boot_start = time.monotonic()
        for (g, spec), grec in zip(specs, record.guests, strict=True):
            grec.pid = _spawn(qemu.argv(spec, str(stack.qemu) if stack else qemu.QEMU), g)
            grec.started_at = time.time()
        _save(paths, record)
        try:
            _wait_ready(paths, record, boot_start, boot_timeout_s, progress)
        except KeyboardInterrupt:
            # Interrupted mid-boot: stop what was started; the files stay until `lab down`.
            for grec in record.guests:
                if grec.pid is not None and _is_ours(grec.pid, paths.guest(grec.name)):
                    proc.terminate(grec.pid)
            raise
        finally:
            _save(paths, record)
        boot_wall = time.monotonic() - boot_start
    return UpReport(status(name), boot_wall, chosen, prepared_s)


def _unused_port(taken) -> int:
    while True:
        port = ssh_mod.free_port()
        if port not in taken:
            return port


def _wait_ready(paths: LabPaths, record: LabRecord, start: float, timeout_s: float, progress: Progress) -> None:
    pending = {g.name: g for g in record.guests}
    while pending:
        for gname, grec in list(pending.items()):
            g = paths.guest(gname)
            info = GuestChannel(g.spool, name=gname).ready_info()
            if info is not None:
                grec.boot_s = round(time.monotonic() - start, 2)
                grec.guest_uptime_at_ready_s = float(info.get("uptime_s", -1))
                if info.get("hostname") != gname:
                    _fail_boot(paths, record, gname, f"its hostname is {info.get('hostname')!r}")
                progress(f"{gname} ready in {grec.boot_s:.1f} s (guest uptime {grec.guest_uptime_at_ready_s:.1f} s)")
                del pending[gname]
            elif grec.pid is None or not _is_ours(grec.pid, g):
                _fail_boot(paths, record, gname, "its QEMU exited during boot")
        if pending and time.monotonic() - start > timeout_s:
            _fail_boot(paths, record, sorted(pending)[0], f"no agent after {timeout_s:g} s")
        time.sleep(0.1)


def _fail_boot(paths: LabPaths, record: LabRecord, gname: str, why: str) -> None:
    g = paths.guest(gname)
    tail = _tail(g.console, 15) + [f"qemu: {line}" for line in _tail(g.qemu_log, 5)]
    # Stop the other guests too: half a rack is not what was asked for. Files stay for a look.
    for grec in record.guests:
        if grec.pid is not None and _is_ours(grec.pid, paths.guest(grec.name)):
            proc.terminate(grec.pid)
    if tail:
        detail = "last console lines:\n" + "\n".join(tail)
    else:
        detail = f"{g.console} is empty: the guest never reached the kernel"
        if record.accel == "kvm":
            detail += " (KVM with QEMU 7.2 was seen hanging in firmware on this machine kind; drop --accel kvm)"
    raise StepFailed(
        f"lab guest {gname} failed to boot: {why}",
        why=detail,
        fix=f"read {g.console} and {g.qemu_log}; then belugactl lab down --name {paths.name}",
    )


def _tail(path: Path, lines: int) -> list[str]:
    try:
        data = path.read_bytes()[-16384:]
    except OSError:
        return []
    return [line for line in data.decode(errors="replace").splitlines() if line.strip()][-lines:]


def _read_pid(g: GuestPaths) -> int | None:
    try:
        return int(g.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def _is_ours(pid: int, g: GuestPaths) -> bool:
    return proc.alive(pid) and qemu.is_guest_process(proc.settled_cmdline(pid), g.dir)


# --- restart -----------------------------------------------------------------------------------
@dataclass
class RestartReport:
    name: str
    host: str
    was: str  # the guest's state before: crashed | stopped
    pid: int
    boot_s: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def restart(
    name: str,
    host: str,
    *,
    boot_timeout_s: float = DEFAULT_BOOT_TIMEOUT_S,
    progress: Progress = _quiet,
) -> RestartReport:
    """Boot a crashed (or stopped) guest of an existing lab again, with the SAME pool file and LSA file.

    What a power cycle of one host of a rack is: the pool and this host's namespace labels survive,
    everything in the guest's memory is gone. The guest's QEMU command line is rebuilt from lab.json,
    so it is the one `up` used. A guest whose QEMU still runs is refused (stop nothing by surprise).
    """
    paths = lab_paths(name)
    with _locked(paths):
        record = load(paths)
        if record is None:
            raise EnvironmentProblem(f"lab {name!r} is not up", fix=f"belugactl lab up --name {name}")
        grec = next((g for g in record.guests if g.name == host), None)
        if grec is None:
            known = ", ".join(g.name for g in record.guests)
            raise UsageError(f"lab {name!r} has no host {host!r}", fix=f"one of: {known}")
        g = paths.guest(host)
        before = _guest_status(g, grec.boot_s)
        if before.state not in ("crashed", "stopped"):
            raise UsageError(
                f"{host} is {before.state}: only a crashed or stopped guest is restarted",
                why=before.detail,
                fix=f"belugactl lab status --name {name}",
            )
        files = [Path(p) for p in record.backing] if record.profile == "ram" else [paths.pool, g.lsa]
        if not files or not all(f.is_file() for f in files):
            raise EnvironmentProblem(
                f"the pool file(s) or {host}'s label file is missing under {paths.dir}",
                fix=f"belugactl lab down --name {name} && belugactl lab up --name {name}",
            )
        spec = _restart_spec(record, paths, grec)
        _reset_spool(g)
        # Keep the crashed boot's console for a look; the new boot gets a fresh one.
        for log in (g.console, g.qemu_log):
            if log.exists():
                os.replace(log, log.with_name(log.stem + ".prev" + log.suffix))
        progress(f"booting {host} again ({record.accel}) with {', '.join(str(f) for f in files)}")
        start = time.monotonic()
        grec.pid = _spawn(qemu.argv(spec, _qemu_binary(record)), g)
        grec.started_at = time.time()
        grec.boot_s = None
        _save(paths, record)
        others = LabRecord.from_dict(record.to_dict())
        others.guests = [grec]
        try:
            _wait_ready(paths, others, start, boot_timeout_s, progress)
        finally:
            _save(paths, record)
        return RestartReport(name, host, before.state, grec.pid, grec.boot_s or 0.0)


def _qemu_binary(record: LabRecord) -> str:
    if record.profile != "ram":
        return qemu.QEMU
    stack = debstack.load(cache_root())
    if stack is None:
        raise EnvironmentProblem("the ram profile's QEMU is no longer in the cache",
                                 fix="belugactl lab prepare --profile ram, then belugactl lab restart again")
    return str(stack.qemu)


def _restart_spec(record: LabRecord, paths: LabPaths, grec: GuestRecord) -> qemu.GuestSpec:
    version = record.kernel.get("version")
    stack = debstack.load(cache_root()) if record.profile == "ram" else None
    kernels = [stack.kernel] if stack is not None else kernel_mod.cached(cache_root())
    kernel = next((k for k in kernels if k.version == version), None)
    initramfs = Path(record.initramfs)
    if kernel is None or not initramfs.is_file():
        raise EnvironmentProblem(
            f"the kernel {version} or the initramfs {initramfs} this lab booted is no longer cached",
            fix=f"belugactl lab down --name {record.name} && belugactl lab up --name {record.name}",
        )
    g = paths.guest(grec.name)
    ram = None
    if stack is not None:
        ram = RamTopology(tuple(Path(p) for p in record.backing), record.pool_size // record.devices, record.switch)
    return qemu.GuestSpec(grec.name, grec.index, kernel_mod.boot_image(kernel), initramfs, paths.pool,
                          record.pool_size, g.lsa, g.spool, g.console, record.memory_mib, record.accel,
                          repo=Path(record.repo), root_ports=record.root_ports, ssh_port=grec.ssh_port,
                          host_ports=tuple(record.host_ports), profile=record.profile, ram=ram,
                          firmware=stack.firmware if stack else None)


def _reset_spool(g: GuestPaths) -> None:
    """Forget the dead guest's agent: its ready/heartbeat files and any request it never finished
    (a request still queued would otherwise run again in the new guest)."""
    for fname in ("ready", "heartbeat"):
        (g.spool / fname).unlink(missing_ok=True)
    for sub in ("req", "out", "cancel"):
        folder = g.spool / sub
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        folder.mkdir(parents=True, exist_ok=True)


# --- status ------------------------------------------------------------------------------------
def status(name: str = DEFAULT_NAME) -> LabStatus:
    paths = lab_paths(name)
    record = load(paths)
    if record is None and not paths.dir.exists():
        return LabStatus(name, "down", str(paths.dir), None, None, None, None, [])
    guests: list[GuestStatus] = []
    names = [g.name for g in record.guests] if record else sorted(p.name for p in (paths.dir / "guests").glob("*"))
    boot = {g.name: g.boot_s for g in record.guests} if record else {}
    ports = {g.name: g.ssh_port for g in record.guests} if record else {}
    for gname in names:
        gs = _guest_status(paths.guest(gname), boot.get(gname))
        gs.ssh_port = ports.get(gname)
        guests.append(gs)
    states = {g.state for g in guests}
    lab_state = "up" if states == {"running"} else "degraded"
    return LabStatus(
        name,
        lab_state,
        str(paths.dir),
        str(paths.pool) if paths.pool.exists() else None,
        record.pool_size if record else None,
        record.kernel if record else None,
        record.accel if record else None,
        guests,
        str(paths.ssh_config) if record and record.ssh and paths.ssh_config.is_file() else None,
        record.profile if record else "pmem",
        record.devices if record else 1,
        record.switch if record else False,
        list(record.backing) if record else [],
    )


def _guest_status(g: GuestPaths, boot_s: float | None) -> GuestStatus:
    pid = _read_pid(g)
    channel = GuestChannel(g.spool, name=g.name)
    tail: list[str] = []
    if pid is None:
        state, detail = "stopped", "no pid file (never started, or stopped)"
    elif not proc.alive(pid):
        state, detail = "crashed", f"QEMU pid {pid} is gone"
        tail = _tail(g.console, 8) + [f"qemu: {line}" for line in _tail(g.qemu_log, 3)]
    elif not qemu.is_guest_process(proc.settled_cmdline(pid), g.dir):
        state, detail = "crashed", f"pid {pid} now belongs to another program; this guest's QEMU is gone"
    elif channel.ready_info() is None:
        state, detail = "booting", f"QEMU pid {pid} runs; the agent has not announced itself yet"
    else:
        age = channel.heartbeat_age()
        if age is not None and age > HEARTBEAT_STALE_S:
            state, detail = "unresponsive", f"QEMU pid {pid} runs, but the agent's last heartbeat is {age:.0f} s old"
        else:
            state, detail = "running", f"QEMU pid {pid}"
    return GuestStatus(g.name, state, pid, detail, str(g.console), str(g.spool), str(g.share), boot_s, tail)


# --- down --------------------------------------------------------------------------------------
def down(name: str = DEFAULT_NAME, *, progress: Progress = _quiet) -> DownReport:
    paths = lab_paths(name)
    report = DownReport(name, paths.dir.exists(), [], [], [], None)
    if not paths.dir.exists():
        return report
    with _locked(paths):
        for gdir in sorted((paths.dir / "guests").glob("*")):
            g = paths.guest(gdir.name)
            pid = _read_pid(g)
            if pid is None or not proc.alive(pid):
                report.already_gone.append(g.name)
            elif not qemu.is_guest_process(proc.settled_cmdline(pid), g.dir):
                report.refused.append(f"{g.name}: pid {pid} is not this guest's QEMU any more")
            elif proc.terminate(pid):
                report.stopped.append(g.name)
                progress(f"stopped {g.name} (pid {pid})")
            else:
                raise EnvironmentProblem(f"could not stop {g.name} (pid {pid})", fix=f"kill -9 {pid}")
        shutil.rmtree(paths.dir)
        report.removed = str(paths.dir)
    # Leave no empty folders of ours behind either (rmdir refuses anything not empty).
    for folder in (paths.root, paths.root.parent):
        if folder.name in ("lab", "belugactl"):
            try:
                folder.rmdir()
            except OSError:
                break
    return report


# --- access ------------------------------------------------------------------------------------
def channel(name: str, host: str) -> GuestChannel:
    """The exec channel of guest `host` in lab `name`, checked to be running."""
    paths = lab_paths(name)
    record = load(paths)
    if record is None:
        raise EnvironmentProblem(f"lab {name!r} is not up", fix="belugactl lab up")
    known = [g.name for g in record.guests]
    if host not in known:
        raise UsageError(f"lab {name!r} has no host {host!r}", fix=f"one of: {', '.join(known)}")
    g = paths.guest(host)
    st = _guest_status(g, None)
    if st.state not in ("running", "unresponsive"):
        raise EnvironmentProblem(
            f"{host} is {st.state}", why=st.detail, fix=f"belugactl lab status --name {name}"
        )
    pid = st.pid
    assert pid is not None

    def alive() -> bool:
        return _is_ours(pid, g)

    return GuestChannel(g.spool, name=host, alive=alive)


def ssh_config(name: str = DEFAULT_NAME) -> tuple[Path, str]:
    """The lab's OpenSSH client config (path and text); the lab must have been brought up with --ssh."""
    paths = lab_paths(name)
    record = load(paths)
    if record is None:
        raise EnvironmentProblem(f"lab {name!r} is not up", fix=f"belugactl lab up --ssh --name {name}")
    if not record.ssh or not paths.ssh_config.is_file():
        raise UsageError(
            f"lab {name!r} was brought up without ssh",
            fix=f"belugactl lab down --name {name} && belugactl lab up --ssh --name {name}",
        )
    return paths.ssh_config, paths.ssh_config.read_text()


def guest_env(name: str, host: str) -> dict[str, str]:
    """Environment added to every command run in a guest."""
    return {
        "BELUGACTL_LAB": name,
        "BELUGACTL_LAB_HOST": host,
        "BELUGACTL_LAB_SHARE": f"{initramfs_mod.GUEST_SPOOL}/share",
    }
