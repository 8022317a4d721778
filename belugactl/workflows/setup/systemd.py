"""The boot units: re-apply what a reboot resets, then serve.

`belugactl-setup.service`: the region, namespace and header live on the device and in its label
area, so they survive; the rest (hugepages, THP, DDIO, MTRR, permissions) is kernel state that starts
from defaults at every boot. Like nvidia-mig-manager's unit, it is a oneshot that runs the same
idempotent `setup`, limited to those topics.

`belugactl-serve.service`: `belugactl serve` in the foreground (the supervisor), after the pool unit
and only if it succeeded. KillMode=mixed: systemd signals the supervisor alone, which stops its
children in order (the router drains, vLLM next, the metadata server last); whatever is left after
TimeoutStopSec is killed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from belugactl.errors import InputError
from belugactl.workflows.setup.topics import boot_topic_ids

UNIT_NAME = "belugactl-setup.service"
SERVE_UNIT_NAME = "belugactl-serve.service"
# The router's drain (30 s by default), vLLM's 20 s each, the metadata server's: with room to spare.
SERVE_STOP_TIMEOUT_S = 180
# How long the boot unit waits for the manifest's memory devices before setup runs (they can
# appear seconds after boot); a device missing after that fails the unit, so serve does not start.
BOOT_WAIT_DEVICES_S = 60

# A word systemd reads as itself: no quotes, specifiers (%), variables ($), escapes or spaces.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_+=:,./-]+")
# ExecStart's prefixes (systemd.service(5)): a first word starting with one of these is quoted.
_EXEC_PREFIXES = "@-:+!|"


def _no_control(value: str) -> str:
    """A value with a newline (or another control byte) would end the directive and start another."""
    if any(not c.isprintable() for c in value):
        raise InputError(
            f"cannot write {value!r} into a systemd unit: it holds a newline or another control character",
            why="a unit file is one directive per line; the rest of the value would become a directive of its own",
            fix="move the manifest (or the program given with --command) to a path without control characters",
        )
    return value


def unit_value(value: str) -> str:
    """A value for a directive that expands specifiers (Description=, Condition*=): `%` becomes `%%`."""
    return _no_control(value).replace("%", "%%")


def exec_word(word: str, *, first: bool = False) -> str:
    """One ExecStart word, as systemd.service(5) reads it: plain, or double-quoted with C escapes;
    `%` (specifiers) and `$` (environment variables) are doubled either way, since systemd expands
    both inside quotes too."""
    _no_control(word)
    if _PLAIN_WORD.fullmatch(word) and not (first and word[0] in _EXEC_PREFIXES):
        return word
    quoted = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{quoted}"'


def exec_line(argv: Sequence[str]) -> str:
    return " ".join(exec_word(a, first=i == 0) for i, a in enumerate(argv))


def unit_text(manifest_path: str, host: str, command: Sequence[str], topics: Sequence[str] | None = None) -> str:
    topics = boot_topic_ids() if topics is None else topics
    argv = [*command, "setup", "-f", manifest_path, "--host", host, "--only", ",".join(topics), "--yes"]
    argv += ["--wait-devices", str(BOOT_WAIT_DEVICES_S)]
    exec_start = exec_line(argv)
    return (
        "# Written by `belugactl export systemd`. Re-applies the pool host settings a reboot resets.\n"
        "[Unit]\n"
        f"Description=belugactl: re-apply {', '.join(topics)} for the CXL pool on {host}\n"
        "After=local-fs.target systemd-modules-load.service systemd-udevd.service\n"
        "Wants=systemd-modules-load.service\n"
        f"Before={SERVE_UNIT_NAME}\n"
        "ConditionPathExists=" + unit_value(manifest_path) + "\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={exec_start}\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def serve_unit_text(
    manifest_path: str, host: str, command: Sequence[str], *, run_dir: str = "/run/belugactl/serve"
) -> str:
    argv = [*command, "serve", "-f", manifest_path, "--host", host, "--run-dir", run_dir]
    exec_start = exec_line(argv)
    return (
        "# Written by `belugactl export systemd`. Serves this host's part of the rack after the pool unit.\n"
        "[Unit]\n"
        f"Description=belugactl: metadata server, vLLM workers and router of this rack on {host}\n"
        "After=network-online.target " + UNIT_NAME + "\n"
        "Wants=network-online.target\n"
        f"Requires={UNIT_NAME}\n"
        "ConditionPathExists=" + unit_value(manifest_path) + "\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        "KillMode=mixed\n"
        f"TimeoutStopSec={SERVE_STOP_TIMEOUT_S}\n"
        "Restart=on-failure\n"
        "RestartSec=10\n"
        "RuntimeDirectory=belugactl\n"
        "LimitNOFILE=65536\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


# --- the etcd member (serve.metadata.etcd; issue 32 item 2) ------------------------------------------
ETCD_UNIT_NAME = "belugactl-etcd.service"
ETCD_BINARY = "/usr/bin/etcd"  # Debian's etcd-server (it also creates the `etcd` user the unit runs as)
ETCD_STATE_DIR = "belugactl-etcd"  # under /var/lib; systemd creates it, owned by the unit's user


def etcd_members(manifest: object) -> list[tuple[str, str | None, str, str]]:
    """(member name, manifest host or None, client URL, peer URL) for each of serve.metadata.etcd.endpoints.

    A member is named after the manifest host whose name or address is the endpoint's host (else the
    endpoint's host itself), with `-PORT` added where two endpoints share a host; its peer port is the
    client port + 1 (2379 -> 2380, etcd's defaults)."""
    from urllib.parse import urlsplit

    conf = manifest.serve.metadata.etcd  # type: ignore[attr-defined]
    hosts = manifest.hosts  # type: ignore[attr-defined]
    rows = []
    for url in conf.endpoints:
        parts = urlsplit(url)
        addr = parts.hostname or ""
        port = parts.port or 2379
        host = next((h.name for h in hosts if addr in (h.name, h.address)), None)
        netloc = f"[{addr}]" if ":" in addr else addr
        rows.append(
            (host or addr, host, port, f"{parts.scheme}://{netloc}:{port}", f"{parts.scheme}://{netloc}:{port + 1}")
        )
    bases = [r[0] for r in rows]
    return [
        (base if bases.count(base) == 1 else f"{base}-{port}", host, client, peer)
        for base, host, port, client, peer in rows
    ]


def etcd_argv(manifest: object, member: str, *, binary: str = ETCD_BINARY, data_dir: str | None = None) -> list[str]:
    """The etcd command line of one member of etcd_members(): listen URLs are the endpoint's address
    when that is an IP (etcd binds IPs only), else every address (0.0.0.0); the client URL also listens
    on loopback, for `doctor` and tools on the host. `--initial-cluster-state new` is read on the first
    start only (an empty data dir): replacing a member later is `etcdctl member add` and a start with
    `existing` (docs/dataplane.md, "Operating etcd")."""
    import ipaddress
    from urllib.parse import urlsplit

    members = etcd_members(manifest)
    name, _, client, peer = next(m for m in members if m[0] == member)
    rack = manifest.name  # type: ignore[attr-defined]

    def listen(url: str, loopback: bool) -> str:
        parts = urlsplit(url)
        try:
            ip = ipaddress.ip_address(parts.hostname or "")
        except ValueError:
            return f"http://0.0.0.0:{parts.port}"
        urls = [url]
        if loopback and not ip.is_loopback:
            urls.append(f"http://127.0.0.1:{parts.port}")
        return ",".join(urls)

    return [
        binary, "--name", name, "--data-dir", data_dir or f"/var/lib/{ETCD_STATE_DIR}/{rack}",
        "--listen-client-urls", listen(client, True), "--advertise-client-urls", client,
        "--listen-peer-urls", listen(peer, False), "--initial-advertise-peer-urls", peer,
        "--initial-cluster", ",".join(f"{n}={p}" for n, _, _, p in members),
        "--initial-cluster-state", "new", "--initial-cluster-token", f"belugactl-{rack}",
    ]  # fmt: skip


def etcd_unit_text(manifest: object, host: str, *, binary: str = ETCD_BINARY) -> tuple[str | None, str]:
    """The etcd unit of `host` (None when the manifest makes it no member) and a note saying why or what."""
    conf = getattr(getattr(getattr(manifest, "serve", None), "metadata", None), "etcd", None)
    if conf is None:
        return None, "no serve.metadata.etcd in the manifest: no etcd unit"
    members = etcd_members(manifest)
    mine = [m for m in members if m[1] == host]
    if not mine:
        return None, f"{host} is no member of serve.metadata.etcd.endpoints ({', '.join(conf.endpoints)}): no etcd unit"
    if any(url.startswith("https://") for _, _, url, _ in members):
        return None, "https etcd endpoints: give etcd its certificates in a unit of your own (no etcd unit written)"
    rack = manifest.name  # type: ignore[attr-defined]
    if rack.strip(".") == "":
        return None, f"rack name {rack!r} cannot name a data directory: no etcd unit"
    name, _, client, _ = mine[0]
    argv = etcd_argv(manifest, name, binary=binary)
    more = f"; {len(mine) - 1} more member(s) on this host get no unit (one etcd per host)" if len(mine) > 1 else ""
    text = (
        "# Written by `belugactl export systemd`. One member of the etcd cluster that elects this rack's\n"
        "# metadata leader (serve.metadata.etcd). Plain HTTP, no authentication: keep its ports on the rack\n"
        "# network. Debian's own etcd.service is stopped while this one runs (Conflicts=).\n"
        "[Unit]\n"
        f"Description=etcd member {unit_value(name)} of rack {unit_value(rack)} (elects the metadata leader)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        f"Before={SERVE_UNIT_NAME}\n"
        "Conflicts=etcd.service\n"
        "\n"
        "[Service]\n"
        "Type=notify\n"
        "User=etcd\n"
        f"StateDirectory={ETCD_STATE_DIR}\n"
        "StateDirectoryMode=0700\n"
        f"ExecStart={exec_line(argv)}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "LimitNOFILE=65536\n"
        "NoNewPrivileges=yes\n"
        "ProtectSystem=strict\n"
        "ProtectHome=yes\n"
        "PrivateTmp=yes\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
    return text, f"{host} is etcd member {name} ({client}) of {len(members)}{more}"
