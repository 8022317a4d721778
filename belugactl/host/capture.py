"""Support bundles: everything discovery read, packed so `--root` reads it back as a host.

`belugactl.workflows.discover.capture()` runs discovery on a TracingHost, then `write_bundle`
copies exactly the paths it touched (files read, directories listed, links followed) into a
tree: sysfs symlinks become relative links inside the tree so `Host.resolve` gives the same answers, tool outputs go to
`.belugactl/commands.json`, and `/dev/dax*` nodes are recorded as metadata in
`.belugactl/devnodes.json`, never as device files. Nothing outside those paths is read, so no
unrelated file (keys, configs, logs) can end up in a bundle. Of what is read, the kernel command
line can carry secrets (a LUKS key, an installer password, a token for a provisioning URL): the
bundle keeps every parameter but replaces such values with "<redacted>" (`redact_cmdline`).

`open_root()` is the way back: a directory or a `.tar.gz` becomes a Host over that tree.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from belugactl import __version__
from belugactl.errors import InputError, UsageError
from belugactl.host.command_runner import RecordingRunner
from belugactl.host.host import CAPTURE_COMMANDS, CAPTURE_META, Host
from belugactl.host.read_dax import DEVNODES_FILE
from belugactl.host.snapshot import HostSnapshot

# A sysfs attribute is at most a page; PCI config space is 4 KiB. Anything bigger is not ours.
MAX_FILE_BYTES = 1 << 20
_MAX_LINK_DEPTH = 40
_TARBALL_SUFFIXES = (".tar.gz", ".tgz")
_OTHER_ARCHIVE_SUFFIXES = (".tar", ".tbz", ".tbz2", ".txz", ".zip", ".gz", ".bz2", ".xz", ".zst", ".7z")

# Files whose values may be secrets, and the redaction applied to each in a bundle.
CMDLINE = "/proc/cmdline"
REDACTED = "<redacted>"
# A parameter is secret when a part of its name (split at . _ -) ends with one of _SECRET_ENDINGS
# (rd.luks.key, rootpassword, api_token, cryptkey; "hotkey" too, harmlessly) or is one of
# _SECRET_PARTS (short words that end ordinary names: spec_store_bypass_disable, usbcore.authorized_default).
_SECRET_ENDINGS = ("password", "passwd", "passphrase", "secret", "token", "key", "credential", "credentials")
_SECRET_PARTS = ("pass", "pwd", "pw", "auth", "psk")
_TOKEN_RE = re.compile(r'(?:[^\s"]+|"[^"]*")+')  # a parameter; double quotes may hold spaces
_URL_USERINFO_RE = re.compile(r"(://[^/\s:@\"]+):[^/\s@\"]+@")  # scheme://user:password@host


def _secret_name(name: str) -> bool:
    parts = [p for p in re.split(r"[._-]", name.lower()) if p]
    return any(part in _SECRET_PARTS or part.endswith(_SECRET_ENDINGS) for part in parts)


def redact_cmdline(text: str) -> str:
    """The command line with secret-looking values replaced; names, order and spacing kept.

    `key=value` whose key looks secret becomes `key=<redacted>`; a password inside a URL
    (`://user:pw@`) becomes `://user:<redacted>@`. Flags and ordinary parameters stay as they are.
    """

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        name, sep, value = token.partition("=")
        if sep and value and _secret_name(name.strip('"')):
            return f"{name}={REDACTED}"
        return _URL_USERINFO_RE.sub(rf"\1:{REDACTED}@", token)

    return _TOKEN_RE.sub(one, text)


class TracingHost(Host):
    """A Host that also remembers the directories it listed and the links it read or followed."""

    def __init__(self, root: Path | str, runner: RecordingRunner) -> None:
        super().__init__(root, runner, trace=True)
        self.recorder = runner
        self.dirs_listed: set[str] = set()
        self.links_read: set[str] = set()
        self.paths_resolved: set[str] = set()
        self.paths_probed: set[str] = set()

    @staticmethod
    def _abs(p: str) -> str:
        return "/" + p.lstrip("/")

    def listdir(self, p: str) -> list[str]:
        self.dirs_listed.add(self._abs(p))
        return super().listdir(p)

    def readlink(self, p: str) -> str | None:
        self.links_read.add(self._abs(p))
        return super().readlink(p)

    def resolve(self, p: str) -> str | None:
        self.paths_resolved.add(self._abs(p))
        return super().resolve(p)

    def exists(self, p: str) -> bool:
        self.paths_probed.add(self._abs(p))
        return super().exists(p)

    def is_dir(self, p: str) -> bool:
        self.paths_probed.add(self._abs(p))
        return super().is_dir(p)


@dataclass
class _Tree:
    """The entries of a bundle, keyed by machine path ("/sys/bus/cxl/devices/mem0")."""

    source: Path
    dirs: set[str] = field(default_factory=set)
    links: dict[str, str] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _memo: dict[str, str | None] = field(default_factory=dict)

    def src(self, p: str) -> str:
        return os.path.join(str(self.source), p.lstrip("/"))

    def add_dir(self, p: str) -> None:
        if p != "/" and p not in self.links:
            self.dirs.add(p)

    def add_link(self, p: str, target: str) -> None:
        if target.startswith("/"):
            # Keep the bundle self-contained: an absolute target becomes relative to the link.
            target = posixpath.relpath(target, posixpath.dirname(p))
        self.links[p] = target
        self.dirs.discard(p)

    def real(self, p: str, depth: int = 0) -> str | None:
        """Record every link and directory on the way to `p`; return its real machine path.

        `p` is absolute and free of "..": discovery asks for plain paths, and link targets are
        joined to an already resolved directory before they are normalised.
        """
        if p == "/":
            return "/"
        if p in self._memo:
            return self._memo[p]
        result: str | None = None
        parent = self.real(posixpath.dirname(p), depth)
        if parent is not None and depth <= _MAX_LINK_DEPTH:
            self.add_dir(parent)
            here = posixpath.join(parent, posixpath.basename(p))
            src = self.src(here)
            if os.path.islink(src):
                target = os.readlink(src)
                self.add_link(here, target)
                result = self.real(posixpath.normpath(posixpath.join(parent, target)), depth + 1)
            elif os.path.lexists(src):
                result = here
        self._memo[p] = result
        return result

    def add_file(self, p: str) -> None:
        real = self.real(p)
        if real is None:
            return
        src = self.src(real)
        if os.path.isdir(src):
            self.add_dir(real)
            return
        if not os.path.isfile(src):
            return
        try:
            with open(src, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except OSError:
            return
        if len(data) > MAX_FILE_BYTES:
            self.skipped.append(p)
            return
        if real == CMDLINE:
            data = redact_cmdline(data.decode(errors="replace")).encode()
        self.files[real] = data

    def add_listing(self, p: str) -> None:
        real = self.real(p)
        if real is None or not os.path.isdir(self.src(real)):
            return
        self.add_dir(real)
        try:
            entries = os.listdir(self.src(real))
        except OSError:
            return
        for entry in entries:
            child = posixpath.join(real, entry)
            src = self.src(child)
            # Links are recorded, not followed: the tree stays as small as what was read.
            if os.path.islink(src):
                self.add_link(child, os.readlink(src))
            elif os.path.isdir(src):
                self.add_dir(child)


def _is_internal(p: str) -> bool:
    return p.startswith("/.belugactl/") or p.startswith("/dev/")


def collect(host: TracingHost) -> _Tree:
    tree = _Tree(source=Path(host.root))
    for p in sorted(host.dirs_listed):
        if not _is_internal(p):
            tree.add_listing(p)
    for p in sorted(host.files_read | host.paths_probed):
        if not _is_internal(p):
            tree.add_file(p)
    for p in sorted(host.paths_resolved):
        if not _is_internal(p):
            real = tree.real(p)
            if real is not None and os.path.isdir(tree.src(real)):
                tree.add_dir(real)
    for p in sorted(host.links_read):
        if _is_internal(p):
            continue
        parent = tree.real(posixpath.dirname(p))
        if parent is None:
            continue
        link = posixpath.join(parent, posixpath.basename(p))
        if os.path.islink(tree.src(link)):
            tree.add_dir(parent)
            tree.add_link(link, os.readlink(tree.src(link)))
    return tree


def _devnodes(snapshot: HostSnapshot) -> dict[str, dict[str, object]]:
    nodes: dict[str, dict[str, object]] = {}
    for dax in snapshot.dax:
        if dax.dev_exists and dax.dev_path:
            nodes[dax.dev_path] = {
                "mode": dax.dev_mode,
                "uid": dax.dev_uid,
                "gid": dax.dev_gid,
                "owner": dax.dev_owner,
                "group": dax.dev_group,
                "is_char": True,
            }
    return nodes


def _metadata(host: TracingHost, snapshot: HostSnapshot, tree: _Tree) -> dict[str, bytes]:
    meta = {
        "format": 1,
        "belugactl_version": __version__,
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": snapshot.hostname,
        "source_root": str(host.root),
        "files": len(tree.files),
        "skipped_large_files": tree.skipped,
        "tool_paths": {name: tool.path for name, tool in snapshot.tools.items() if tool.path},
    }
    commands = {"commands": [r.to_dict() for r in host.recorder.results]}
    return {
        "/" + CAPTURE_META: (json.dumps(meta, indent=1) + "\n").encode(),
        "/" + CAPTURE_COMMANDS: (json.dumps(commands, indent=1) + "\n").encode(),
        "/" + DEVNODES_FILE: (json.dumps(_devnodes(snapshot), indent=1, sort_keys=True) + "\n").encode(),
    }


@dataclass(frozen=True)
class CaptureResult:
    path: Path
    snapshot: HostSnapshot
    files: int
    links: int
    commands: int


def tracing_host(source: Host) -> TracingHost:
    """A Host over the same root and runner that records what is read through it."""
    return TracingHost(source.root, RecordingRunner(source.runner))


def write_bundle(tracing: TracingHost, snapshot: HostSnapshot, dest: Path | str) -> CaptureResult:
    """Write what `tracing` read (while discovering `snapshot`) to `dest`: a .tar.gz, else a directory."""
    dest = Path(dest)
    is_tarball = bundle_is_tarball(dest.name)
    tree = collect(tracing)
    extra = _metadata(tracing, snapshot, tree)
    if is_tarball:
        _write_tarball(tree, extra, dest)
    else:
        _write_directory(tree, extra, dest)
    return CaptureResult(dest, snapshot, len(tree.files), len(tree.links), len(tracing.recorder.results))


def bundle_is_tarball(name: str) -> bool:
    """FILE.tar.gz / FILE.tgz: a tarball; a plain name: a directory; any other archive name is refused.

    A name like `s.tar` or `s.zip` would otherwise become a directory of that name."""
    if name.endswith(_TARBALL_SUFFIXES):
        return True
    lowered = name.lower()
    if lowered.endswith(_OTHER_ARCHIVE_SUFFIXES) or ".tar." in lowered:
        raise UsageError(
            f"{name}: a support bundle is a gzip-compressed tarball or a directory, not this archive kind",
            fix=f"name it {name.split('.')[0] or 'support'}.tar.gz, or give a directory name without a suffix",
        )
    return False


def _write_tarball(tree: _Tree, extra: dict[str, bytes], dest: Path) -> None:
    mtime = int(time.time())
    # A fresh, unpredictable file (O_EXCL, 0600): a link planted at `dest.part` in a shared
    # directory must not redirect what we write. os.replace then swaps the name itself, never a link's target.
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    tmp = Path(tmp_name)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
        for p in sorted(tree.dirs | {posixpath.dirname(k) for k in extra}):
            info = tarfile.TarInfo(p.lstrip("/"))
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
            tar.addfile(info)
        for p, data in sorted({**tree.files, **extra}.items()):
            info = tarfile.TarInfo(p.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
        for p, target in sorted(tree.links.items()):
            info = tarfile.TarInfo(p.lstrip("/"))
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, mtime
            tar.addfile(info)
    os.replace(tmp, dest)


def _write_directory(tree: _Tree, extra: dict[str, bytes], dest: Path) -> None:
    if dest.exists() and any(dest.iterdir()):
        raise UsageError(
            f"{dest} exists and is not empty",
            fix="capture into a new directory, or into FILE.tar.gz",
        )
    dest.mkdir(exist_ok=True)  # the bundle's own directory only; its parent must exist
    for p in sorted(tree.dirs):
        (dest / p.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for p, data in {**tree.files, **extra}.items():
        target = dest / p.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for p, link in sorted(tree.links.items()):
        target = dest / p.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, target)


@contextmanager
def open_root(path: Path | str) -> Iterator[Host]:
    """A Host over a fixture tree, a captured directory or a captured .tar.gz (unpacked, then removed)."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"--root {path}: no such file or directory", fix="give a directory or a FILE.tar.gz")
    if path.is_dir():
        yield Host.from_tree(path)
        return
    if not path.name.endswith(_TARBALL_SUFFIXES):
        raise UsageError(f"--root {path}: not a directory or a .tar.gz bundle")
    workdir = tempfile.mkdtemp(prefix="belugactl-root-")
    try:
        try:
            with tarfile.open(path, "r:gz") as tar:
                _extract_bounded(tar, path, workdir)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(
                f"--root {path}: cannot unpack the bundle",
                why=str(exc),
                fix="re-create it with `belugactl discover --capture FILE.tar.gz`",
            ) from exc
        yield Host.from_tree(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# What a bundle may unpack to. A capture of a 16-host-class machine is a few thousand small files
# (sysfs attributes, tool JSON); the caps stop a gzip bomb or a hostile archive from filling the disk.
MAX_BUNDLE_MEMBERS = 100_000
MAX_BUNDLE_BYTES = 256 << 20
MAX_BUNDLE_MEMBER_BYTES = 64 << 20


def _bundle_refused(path: Path, why: str) -> InputError:
    return InputError(
        f"--root {path}: refusing to unpack the bundle",
        why=why,
        fix="re-create it with `belugactl discover --capture FILE.tar.gz` (a bundle holds only what discovery read)",
    )


def _extract_bounded(tar: tarfile.TarFile, path: Path, workdir: str) -> None:
    """Unpack member by member (streaming), refusing before any cap is passed or anything leaves the root."""
    total = 0
    for count, member in enumerate(tar, start=1):
        if count > MAX_BUNDLE_MEMBERS:
            raise _bundle_refused(path, f"more than {MAX_BUNDLE_MEMBERS} members")
        if not (member.isdir() or member.isreg() or member.issym()):
            raise _bundle_refused(path, f"{member.name}: only files, directories and symlinks belong in a bundle")
        name = posixpath.normpath(member.name)
        if name.startswith(("/", "../")) or name == "..":
            raise _bundle_refused(path, f"{member.name}: a path outside the bundle's root")
        if member.issym():
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
                raise _bundle_refused(path, f"{member.name} -> {member.linkname}: a link out of the bundle's root")
        if member.size > MAX_BUNDLE_MEMBER_BYTES:
            raise _bundle_refused(path, f"{member.name}: {member.size} bytes (at most {MAX_BUNDLE_MEMBER_BYTES})")
        total += member.size
        if total > MAX_BUNDLE_BYTES:
            raise _bundle_refused(path, f"more than {MAX_BUNDLE_BYTES} bytes unpacked")
        # The "data" filter is the second guard: absolute paths, links out of the tree, device files.
        tar.extract(member, workdir, filter="data")


def is_bundle_path(path: Path | str) -> bool:
    return str(path).endswith(_TARBALL_SUFFIXES)


