"""`belugactl lab ...`: an emulated CXL rack of QEMU guests on this machine (see belugactl.lab)."""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from belugactl.cli.options import hidden_alias, warn_deprecated

NAME_HELP = "Lab name: several labs can coexist, each under its own state directory."
PROFILE_HELP = (
    "ram (the default): see below. pmem: Debian 12's QEMU 7.2 + kernel 6.1, one persistent device per guest. "
    "ram: QEMU 10 + kernel 6.12 + cxl 81 from Debian packages (unpacked into the cache, never installed), "
    "volatile devices, optionally behind a switch."
)


def name_option() -> Any:
    return typer.Option("default", "--name", metavar="NAME", help=NAME_HELP)


def profile_option() -> Any:
    return typer.Option("ram", "--profile", metavar="ram|pmem", help=PROFILE_HELP)


def _guest_count(count: int | None, old_hosts: int | None) -> int:
    """`--count N`, or the old `--hosts N` with a warning; both at once is ambiguous."""
    from belugactl.errors import UsageError
    from belugactl.lab.emulated_rack import MAX_HOSTS

    if old_hosts is not None and count is not None:
        raise UsageError(
            f"lab up: --count {count} and --hosts {old_hosts} both given",
            fix=f"drop --hosts (the old spelling): belugactl lab up --count {count}",
        )
    if old_hosts is not None:
        warn_deprecated(f"lab up --hosts {old_hosts}", f"--count {old_hosts}", "--hosts names a node set in `rack`")
    n = 2 if count is None and old_hosts is None else (count if count is not None else old_hosts)
    assert n is not None
    if not 1 <= n <= MAX_HOSTS:
        raise UsageError(f"lab up: --count must be between 1 and {MAX_HOSTS}, not {n}", fix="e.g. --count 3")
    return n


def register(app: typer.Typer) -> None:
    lab = typer.Typer(
        help="An emulated CXL rack: QEMU guests with a real kernel sharing one pool file.",
        no_args_is_help=True,
    )

    @lab.command("prepare")
    def prepare_cmd(
        install: bool = typer.Option(False, "--install", help="apt-get install missing packages (root)."),
        refresh: bool = typer.Option(False, "--refresh", help="Download the kernel again even if cached."),
        profile: str = profile_option(),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Check/install packages, download and unpack the guest kernel, build the initramfs (cached)."""
        from belugactl.cli.render import print_json
        from belugactl.lab import emulated_rack

        result = emulated_rack.prepare(install=install, refresh=refresh, profile=profile, progress=_progress)
        if as_json:
            print_json(result)
            return
        if profile == "ram":
            _print_ram_prepare(result)
            return
        kernel = result["kernel"]
        assert isinstance(kernel, dict)
        if result["installed_packages"]:
            print(f"installed: {' '.join(result['installed_packages'])}")  # type: ignore[arg-type]
        print(f"kernel     {kernel['version']}  {kernel['vmlinuz']}")
        print(f"boots      {result['boot_image']}")
        print(f"initramfs  {result['initramfs']}  ({int(result['initramfs_size']) // 1024} KiB)")  # type: ignore[call-overload]
        print(f"cache      {result['cache']}  (ready in {result['seconds']} s)")

    @lab.command("up")
    def up_cmd(
        count: int | None = typer.Option(
            None,
            "-n",
            "--count",
            metavar="N",
            show_default=False,
            help="Number of guests, lab-1 ... lab-N (default 2).",
        ),
        # `--hosts` is a node set in `rack`; here it was the count (kept one release, with a warning)
        hosts_count: int | None = hidden_alias("--hosts"),
        pool_size: str = typer.Option(
            "512MiB", "--pool-size", metavar="SIZE", help="Shared pool size, a multiple of 256 MiB."
        ),
        name: str = name_option(),
        memory: str = typer.Option("1GiB", "--memory", metavar="SIZE", help="RAM per guest."),
        accel: str = typer.Option(
            "auto", "--accel", metavar="auto|tcg|kvm", help="auto (= tcg, KVM only reported), tcg or kvm."
        ),
        boot_timeout: float = typer.Option(
            240.0, "--boot-timeout", metavar="SECONDS", help="Seconds to wait for every guest."
        ),
        install: bool = typer.Option(False, "--install", help="apt-get install missing packages first (root)."),
        root_ports: int = typer.Option(
            2, "--root-ports", hidden=True, help="1 reproduces QEMU 7.2 dropping writes (selftest must fail)."
        ),
        ssh: bool = typer.Option(
            False, "--ssh", help="Give each guest sshd behind a forward from 127.0.0.1 (see `lab ssh-config`)."
        ),
        host_ports: list[int] = typer.Option(
            [],
            "--host-port",
            metavar="PORT",
            help="pmem: let each guest reach 127.0.0.1:PORT on this machine at 10.0.2.100:PORT (repeatable; "
            "e.g. an etcd for a metadata-server election between guests). Nothing else leaves a guest.",
        ),
        profile: str = profile_option(),
        devices: int | None = typer.Option(
            None,
            "--devices",
            metavar="N",
            show_default=False,
            help="ram: volatile type-3 devices per guest (default 2); each gets pool-size/N, shared by all guests.",
        ),
        switch: bool | None = typer.Option(
            None,
            "--switch/--no-switch",
            show_default=False,
            help="ram: put the devices behind an emulated CXL switch (default: yes).",
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Boot N guests in parallel. pmem: each with a CXL host bridge, two root ports and one type-3
        device backed by the same pool file. ram: --devices volatile devices per guest (under root ports,
        or behind a switch with --switch), device i backed by file i for every guest.
        Guests come up bare (no region): `lab selftest` or `setup` go next."""
        from belugactl.cli.render import print_json
        from belugactl.errors import UsageError
        from belugactl.lab import emulated_rack
        from belugactl.units import parse_size

        hosts = _guest_count(count, hosts_count)
        if accel not in ("auto", "tcg", "kvm"):
            raise UsageError(f"--accel must be auto, tcg or kvm, not {accel!r}")
        try:
            size = parse_size(pool_size)
            mem = parse_size(memory)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        if install:
            emulated_rack.prepare(install=True, profile=profile, progress=_progress)
        report = emulated_rack.up(
            name=name,
            hosts=hosts,
            pool_size=size,
            memory_mib=mem // (1024 * 1024),
            accel=accel,
            boot_timeout_s=boot_timeout,
            root_ports=root_ports,
            ssh=ssh,
            profile=profile,
            devices=devices,
            switch=switch,
            progress=_progress,
            host_ports=tuple(host_ports),
        )
        if as_json:
            print_json(report.to_dict())
            return
        st = report.status
        print(
            f"lab {st.name}: {len(st.guests)} guest{'s' if len(st.guests) != 1 else ''} up in "
            f"{report.boot_wall_s:.1f} s (booted in parallel; accel {report.accel.chosen}; "
            f"kvm: {report.accel.kvm_detail})"
        )
        _print_lab(st)

    @lab.command("status")
    def status_cmd(
        name: str = name_option(),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Guests and their state (running, booting, unresponsive, crashed), the pool file, the kernel.
        Exits 1 when the lab exists but not every guest runs."""
        from belugactl.cli.render import print_json
        from belugactl.lab import emulated_rack

        st = emulated_rack.status(name)
        if as_json:
            print_json(st.to_dict())
        elif st.state == "down":
            print(f"lab {name}: down (nothing under {st.dir})")
        else:
            print(f"lab {st.name}: {st.state}")
            _print_lab(st)
        if st.state == "degraded":
            raise typer.Exit(1)

    @lab.command("exec", context_settings={"allow_interspersed_args": False})
    def exec_cmd(
        host: str = typer.Argument(..., metavar="GUEST", help="Guest name, e.g. lab-1."),
        command: list[str] = typer.Argument(
            ..., metavar="COMMAND...", help="The command and its arguments (after --)."
        ),
        name: str = name_option(),
        timeout: float = typer.Option(
            600.0, "--timeout", metavar="SECONDS", help="Kill the command after this many seconds."
        ),
        stdin: bool = typer.Option(False, "--stdin", help="Send this process's stdin to the command."),
    ) -> None:
        """Run a command in a guest as root, in the same directory as here; its output and exit status
        come back as if it ran locally (124 after --timeout). `belugactl` there is this checkout's.
        Options go before GUEST: everything after GUEST belongs to the command."""
        from belugactl.errors import UsageError
        from belugactl.lab import emulated_rack

        if command and command[0] == "--":
            command = command[1:]  # interspersed args are off, so click hands `--` through
        if not command:
            raise UsageError("no command given", fix=f"belugactl lab exec {host} -- CMD [ARGS...]")
        channel = emulated_rack.channel(name, host)
        cwd = os.getcwd()
        data = sys.stdin.buffer.read() if stdin else None
        result = channel.run(
            command,
            timeout=timeout,
            cwd=cwd,
            env=emulated_rack.guest_env(name, host),
            stdin=data,
            stdout=sys.stdout.buffer,
            stderr=sys.stderr.buffer,
        )
        if result.timed_out:
            print(f"belugactl lab exec: {host}: killed after {timeout:g} s", file=sys.stderr)
        raise typer.Exit(result.returncode)

    @lab.command("selftest")
    def selftest_cmd(
        name: str = name_option(),
        keep: bool = typer.Option(False, "--keep", help="Leave the region (and namespace) it made in place."),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Create a region and devdax namespace in every guest with the real tools, write a pattern
        from each guest and find it in the others and in the pool file. Cleans up unless --keep.
        ram profile: a ram region across every device (targets by serial) made devdax, or the one
        `setup` made, used as is; every interleave position checked in its backing file."""
        from belugactl.cli.render import print_json
        from belugactl.errors import StepFailed
        from belugactl.lab import selftest, selftest_ram
        from belugactl.pool.device import device_path

        report = selftest.run(name, keep=keep)
        if as_json:
            print_json(report.to_dict())
        elif isinstance(report, selftest_ram.RamSelftestReport):
            for line in selftest_ram.render_lines(report, keep=keep):
                print(line)
        else:
            for p in report.provisioned:
                print(
                    f"{p.guest}: cxl {p.region} -> nd {p.nd_region} -> {p.namespace} -> {device_path(p.dax)} "
                    f"({p.dax_size // (1024 * 1024)} MiB, pool file offset {p.file_offset:#x})"
                )
            for c in report.checks:
                print(f"  [{'ok' if c.ok else 'FAIL'}] {c.what}: {c.detail}")
            cleanup = "torn down" if report.cleaned_up else ("kept (--keep)" if keep else "cleanup FAILED")
            print(f"region and namespace: {cleanup}; {len(report.steps)} guest commands in {report.seconds} s")
        if not report.ok:
            failed = [c.what for c in report.checks if not c.ok]
            raise StepFailed(
                "lab selftest FAILED: the guests do not share the pool as expected",
                why=report.error or "; ".join(failed) or "no checks ran",
                fix=(
                    "see the lines above; guests disagreeing on positions were given targets by name, not serial"
                    if isinstance(report, selftest_ram.RamSelftestReport)
                    else "see the lines above; a topology with one root port per host bridge drops writes on QEMU 7.2"
                ),
            )

    @lab.command("ssh-config")
    def ssh_config_cmd(
        name: str = name_option(),
    ) -> None:
        """Print the OpenSSH client config of a lab brought up with --ssh (also in STATE/NAME/ssh_config):
        Host lab-1 ... on 127.0.0.1, with the lab's own key and known_hosts."""
        from belugactl.lab import emulated_rack

        path, text = emulated_rack.ssh_config(name)
        print(f"# {path}")
        sys.stdout.write(text)

    @lab.command("restart")
    def restart_cmd(
        host: str = typer.Argument(..., metavar="GUEST", help="The crashed guest, e.g. lab-1."),
        name: str = name_option(),
        boot_timeout: float = typer.Option(
            240.0, "--boot-timeout", metavar="SECONDS", help="Seconds to wait for the guest."
        ),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Boot a crashed or stopped guest again with the same pool file and label (LSA) file: a power
        cycle of one host. A guest whose QEMU still runs is refused."""
        from belugactl.cli.render import print_json
        from belugactl.lab import emulated_rack

        report = emulated_rack.restart(name, host, boot_timeout_s=boot_timeout, progress=_progress)
        if as_json:
            print_json(report.to_dict())
        else:
            print(f"lab {name}: {host} ({report.was}) booted again in {report.boot_s:.1f} s, QEMU pid {report.pid}")

    @lab.command("down")
    def down_cmd(
        name: str = name_option(),
        as_json: bool = typer.Option(False, "--json", help="JSON on stdout."),
    ) -> None:
        """Stop every guest (by pid, after checking it is still our QEMU) and remove the lab's files."""
        from belugactl.cli.render import print_json
        from belugactl.lab import emulated_rack

        report = emulated_rack.down(name, progress=_progress)
        if as_json:
            print_json(report.to_dict())
        elif not report.existed:
            print(f"lab {name}: nothing to take down")
        else:
            gone = f"; already gone: {', '.join(report.already_gone)}" if report.already_gone else ""
            print(f"lab {name}: stopped {', '.join(report.stopped) or 'no guest'}{gone}; removed {report.removed}")
            for line in report.refused:
                print(f"  left alone: {line}", file=sys.stderr)

    from belugactl.cli.lab_coldstart_cmd import register as register_coldstart

    register_coldstart(lab)
    app.add_typer(lab, name="lab")


def _progress(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


def _print_ram_prepare(result: dict) -> None:
    from belugactl.units import format_size

    for p in result["packages"]:
        print(f"fetched    {p['package']:<44} {p['version']:<32} {p['suite']:<18} {format_size(p['size']):>10}")
    print(
        f"download   {len(result['packages'])} packages, {format_size(result['download_bytes'])}; "
        f"unpacked tree {format_size(result['tree_bytes'])}"
    )
    print(f"qemu       {result['qemu']}  (-L {result['firmware']})")
    print(f"kernel     {result['kernel']['version']}  {result['kernel']['vmlinuz']}")
    print(f"boots      {result['boot_image']}")
    print(f"initramfs  {result['initramfs']}  ({int(result['initramfs_size']) // 1024} KiB)")
    print(f"cache      {result['cache']}  (ready in {result['seconds']} s)")


def _print_lab(st) -> None:  # st: belugactl.lab.emulated_rack.LabStatus
    if st.kernel:
        print(f"  kernel  {st.kernel.get('version')}  ({st.kernel.get('vmlinuz')})")
    print(f"  state   {st.dir}")
    if st.pool:
        size = f"{st.pool_size // (1024 * 1024)} MiB, " if st.pool_size else ""
        print(f"  pool    {st.pool}  ({size}one backing file for every guest's CXL device)")
    if st.backing:
        where = "behind a CXL switch" if st.switch else "under root ports"
        print(f"  devices {st.devices} volatile ({st.profile} profile, {where}); device i of every guest is file i:")
        for path in st.backing:
            print(f"          {path}")
    if st.ssh_config:
        print(f"  ssh     ssh -F {st.ssh_config} GUEST  (each guest's sshd behind 127.0.0.1:PORT)")
    for g in st.guests:
        boot = f"  booted in {g.boot_s:.1f} s" if g.boot_s is not None else ""
        print(f"  {g.name:<7} {g.state:<12} {g.detail}{boot}")
        print(f"          console {g.console}")
        if g.ssh_port is not None:
            print(f"          ssh     127.0.0.1:{g.ssh_port} -> {g.name}:22")
        print(f"          share   {g.share}  (in the guest: /run/belugactl-lab/share)")
        for line in g.console_tail:
            print(f"          | {line}")
