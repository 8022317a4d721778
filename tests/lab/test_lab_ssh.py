"""`lab up --ssh` without booting anything: the QEMU network options, the guest's sshd config, the
client config, known_hosts, and the /init steps. The guests themselves: tests/rack/test_rack_lab.py."""

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from belugactl.lab import emulated_rack, initramfs, qemu, ssh
from belugactl.lab.paths import LabPaths
from tests.support.lab import unavailable


def _spec(tmp_path: Path, **kw) -> qemu.GuestSpec:
    g = tmp_path / "guests" / "lab-1"
    return qemu.GuestSpec(
        name="lab-1", index=1, kernel=tmp_path / "vmlinuz", initramfs=tmp_path / "initrd",
        pool=tmp_path / "pool.raw", pool_size=512 << 20, lsa=g / "lsa.raw", spool=g / "spool",
        console=g / "console.log", **kw,
    )  # fmt: skip


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_no_network_unless_asked(tmp_path):
    argv = qemu.argv(_spec(tmp_path))
    assert _values(argv, "-netdev") == []
    assert not any(d.startswith("virtio-net") for d in _values(argv, "-device"))


def test_the_only_way_in_is_one_forward_bound_to_loopback(tmp_path):
    argv = qemu.argv(_spec(tmp_path, ssh_port=40022))
    (netdev,) = _values(argv, "-netdev")
    opts = netdev.split(",")
    assert opts[0] == "user" and "restrict=on" in opts
    forwards = [o for o in opts if o.startswith("hostfwd=")]
    assert forwards == ["hostfwd=tcp:127.0.0.1:40022-:22"]
    net_id = next(o for o in opts if o.startswith("id=")).split("=")[1]
    assert f"virtio-net-pci,netdev={net_id}" in _values(argv, "-device")


def test_a_host_port_is_the_only_way_out_and_needs_no_ssh(tmp_path):
    argv = qemu.argv(_spec(tmp_path, host_ports=(2379, 40000)))
    (netdev,) = _values(argv, "-netdev")
    opts = netdev.split(",")
    assert opts[0] == "user" and "restrict=on" in opts and not any(o.startswith("hostfwd=") for o in opts)
    forwards = [o for o in opts if o.startswith("guestfwd=")]
    assert [f.split("-cmd:")[0] for f in forwards] == [
        f"guestfwd=tcp:{qemu.HOST_ALIAS}:2379", f"guestfwd=tcp:{qemu.HOST_ALIAS}:40000"]
    # per connection, the helper (a script of the standard library) joins the guest to 127.0.0.1:PORT
    words = shlex.split(forwards[0].split("-cmd:")[1])
    assert words[1:3] == ["-I", "-S"] and words[3].endswith("belugactl/lab/host_forward.py") and words[4] == "2379"
    both = _values(qemu.argv(_spec(tmp_path, ssh_port=40022, host_ports=(2379,))), "-netdev")[0].split(",")
    assert "hostfwd=tcp:127.0.0.1:40022-:22" in both
    assert any(o.startswith(f"guestfwd=tcp:{qemu.HOST_ALIAS}:2379-cmd:") for o in both)


@pytest.mark.process
def test_the_host_forward_helper_joins_a_connection_to_a_loopback_service():
    """What QEMU runs per guest connection: stdin/stdout the guest's socket, bytes both ways."""
    import socket
    import sys
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def echo_upper() -> None:
        conn, _ = server.accept()
        with conn:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            conn.sendall(data.upper())

    threading.Thread(target=echo_upper, daemon=True).start()
    guest, qemu_end = socket.socketpair()
    helper = Path(qemu.__file__).with_name("host_forward.py")
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(helper), str(port)], stdin=qemu_end, stdout=qemu_end)
    qemu_end.close()
    guest.sendall(b"hello etcd " * 1000)
    guest.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := guest.recv(65536):
        got += chunk
    assert got == b"HELLO ETCD " * 1000 and proc.wait(timeout=10) == 0
    server.close()
    nobody = subprocess.run([sys.executable, "-I", "-S", str(helper), str(port)], stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=20)  # fmt: skip
    assert nobody.returncode == 1  # nothing listens any more: the guest's connection is just closed


def test_free_port_is_bindable_on_loopback():
    import socket

    port = ssh.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_sshd_config_allows_root_by_key_only_and_sets_the_lab_path():
    text = ssh.sshd_config("/run/belugactl-lab/ssh", {"PATH": "/repo/.venv/bin:/usr/bin", "BELUGACTL_LAB": "x"})
    lines = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in text.splitlines() if line and line[0] != "#"}
    assert lines["PermitRootLogin"] == "prohibit-password"
    assert lines["PasswordAuthentication"] == "no" and lines["KbdInteractiveAuthentication"] == "no"
    assert lines["UsePAM"] == "no" and lines["Port"] == "22"
    assert lines["AuthorizedKeysFile"] == "/run/belugactl-lab/ssh/authorized_keys"
    assert lines["HostKey"].startswith("/run/belugactl-lab/ssh/")
    assert lines["SetEnv"] == '"PATH=/repo/.venv/bin:/usr/bin" "BELUGACTL_LAB=x"'


@pytest.mark.process
def test_keys_configs_and_known_hosts_live_in_the_lab_state(tmp_path):
    if shutil.which("ssh-keygen") is None or shutil.which("ssh") is None:
        unavailable("no ssh-keygen / ssh (Debian package openssh-client)")
    paths = LabPaths(tmp_path, "t")
    files = ssh.SshFiles(paths.ssh_dir)
    ssh.make_keys(files, "t", Path(shutil.which("ssh-keygen") or "ssh-keygen"))
    ports = {"lab-1": 40001, "lab-2": 40002}
    ssh.write_client_files(files, paths.ssh_config, ports)
    spool = tmp_path / "spool"
    spool.mkdir()
    ssh.install_guest(files, spool, "/run/belugactl-lab/ssh", {"PATH": "/bin"})
    guest_key = spool / "ssh" / files.host_key.name
    assert guest_key.read_bytes() == files.host_key.read_bytes() and guest_key.stat().st_mode & 0o077 == 0
    assert (spool / "ssh" / "authorized_keys").read_text() == files.client_key.with_suffix(".pub").read_text()
    host_pub = files.host_key.with_suffix(".pub").read_text().split()
    assert files.known_hosts.read_text().splitlines() == [
        f"[127.0.0.1]:{p} {host_pub[0]} {host_pub[1]}" for p in ports.values()
    ]
    # OpenSSH itself reads the client config: each alias resolves to its loopback port and our files.
    for name, port in ports.items():
        out = subprocess.run(
            ["ssh", "-G", "-F", str(paths.ssh_config), name], capture_output=True, text=True, check=True
        ).stdout  # fmt: skip
        opts = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        assert (opts["hostname"], opts["port"], opts["user"]) == ("127.0.0.1", str(port), "root")
        assert opts["batchmode"] == "yes" and opts["stricthostkeychecking"] == "true"
        assert opts["identityfile"] == str(files.client_key)
        assert opts["userknownhostsfile"] == str(files.known_hosts)
    assert str(Path.home() / ".ssh") not in paths.ssh_config.read_text()


def test_guest_env_loads_the_network_module_and_turns_ssh_on_only_when_asked(tmp_path):
    class K:
        version = "6.1.0-test-amd64"
        modules_dir = tmp_path

    def env(ssh_on: bool) -> dict[str, str]:
        text = emulated_rack._guest_env(K(), "lab-1", tmp_path / ".venv", tmp_path, "loose", ssh_on)  # type: ignore[arg-type]
        return dict(line.split("=", 1) for line in text.splitlines())

    on, off = env(True), env(False)
    assert "virtio_net" in on["LAB_MODULES"] and "virtio_net" not in off["LAB_MODULES"]
    assert on["LAB_SSH"] == "1" and off["LAB_SSH"] == "''"


def test_init_starts_sshd_only_for_ssh_labs_after_the_network():
    script = initramfs.init_script()
    block = script[script.index('if [ -n "$LAB_SSH" ]'):script.index("starting the agent")]
    assert "ip addr add 10.0.2.15/24 dev eth0" in block and "ip route add default via 10.0.2.2" in block
    assert block.index("ip link set eth0 up") < block.index("/usr/sbin/sshd -f /run/belugactl-lab/ssh/sshd_config")
    assert "mkdir -p $R/run/sshd" in block  # sshd's privilege separation directory, on the guest's /run


def test_a_host_port_lab_brings_eth0_up_without_sshd(tmp_path):
    class K:
        version = "6.1.0-test-amd64"
        modules_dir = tmp_path

    text = emulated_rack._guest_env(K(), "lab-1", tmp_path / ".venv", tmp_path, "loose", False, "pmem", net=True)  # type: ignore[arg-type]
    env = dict(line.split("=", 1) for line in text.splitlines())
    assert "virtio_net" in env["LAB_MODULES"] and env["LAB_NET"] == "1" and env["LAB_SSH"] == "''"
    script = initramfs.init_script()
    block = script[script.index('if [ -n "$LAB_NET" ] && [ -z "$LAB_SSH" ]'):script.index('if [ -n "$LAB_SSH" ]; then')]
    assert "ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0" in block and "sshd" not in block
