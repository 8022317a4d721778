"""External tools: which are installed, their versions, and their JSON output made safe to use.

The ndctl family prints JSON whose details vary (see reference cxl-tooling.md section 1.0): an
empty stdout means "nothing", sizes are integers or human strings, hex values are integers that
may print as negative int64, and `-u` with one element prints a bare object instead of an array.
The helpers here absorb all of that so readers see plain Python values.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Sequence
from typing import Any

from belugactl.errors import EnvironmentProblem, ToolOutputError
from belugactl.host.command_runner import CommandResult
from belugactl.host.host import CAPTURE_META, Host
from belugactl.host.snapshot import ToolInfo

# Seconds a listing may take; `cxl list` on a large rack walks many sysfs files.
LIST_TIMEOUT_S = 20.0
VERSION_TIMEOUT_S = 30.0  # `cxl version` took over 10 s in a TCG guest on a loaded 2-core host

# argv that prints the version, per tool discovery reports on.
VERSION_ARGV: dict[str, tuple[str, ...]] = {
    "cxl": ("cxl", "version"),
    "ndctl": ("ndctl", "version"),
    "daxctl": ("daxctl", "version"),
    "setpci": ("setpci", "--version"),
}

# Where a captured or fixture tree may hold program files (used only when the host is not live).
_BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")

_VERSION_RE = re.compile(r"(\d+)(?:\.(\d+))?")
_U64 = 1 << 64


# Versions read on this machine in this process, keyed by argv and the binary's identity (path,
# inode, mtime, size), so an upgrade in between is noticed. Setup discovers again after every step.
_VERSION_CACHE: dict[tuple[object, ...], ToolInfo] = {}
_CACHE_LOCK = threading.Lock()


def read_tools(host: Host, problems: list[str]) -> dict[str, ToolInfo]:
    return {name: read_tool(host, name, argv, problems) for name, argv in VERSION_ARGV.items()}


def _cache_key(host: Host, name: str, argv: Sequence[str]) -> tuple[object, ...] | None:
    # Only the live machine; never while tracing (a support bundle must record the version runs).
    if not host.is_live or host.trace:
        return None
    path = shutil.which(name)
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (tuple(argv), path, st.st_ino, st.st_mtime_ns, st.st_size)


def cached_tool(host: Host, name: str) -> ToolInfo | None:
    """The version already read for `name` on this host in this process, if the binary is unchanged."""
    key = _cache_key(host, name, VERSION_ARGV[name])
    if key is None:
        return None
    with _CACHE_LOCK:
        return _VERSION_CACHE.get(key)


def read_tool(host: Host, name: str, argv: Sequence[str], problems: list[str]) -> ToolInfo:
    key = _cache_key(host, name, argv)
    if key is not None:
        with _CACHE_LOCK:
            cached = _VERSION_CACHE.get(key)
        if cached is not None:
            return cached
    info = _read_tool(host, name, argv, problems)
    if key is not None and info.error is None and info.installed:
        with _CACHE_LOCK:
            _VERSION_CACHE[key] = info
    return info


def _read_tool(host: Host, name: str, argv: Sequence[str], problems: list[str]) -> ToolInfo:
    result = host.run(list(argv), timeout=VERSION_TIMEOUT_S)
    if result.not_found:
        return ToolInfo(name=name)
    # Recorded runs replay without a real binary; the tool was there when they were recorded.
    path = _which(host, name) or name
    if not result.ok:
        problem = f"{name}: version query failed: {result.describe()}"
        problems.append(problem)
        return ToolInfo(name=name, path=path, error=problem)
    version, major, minor = parse_version(result.stdout)
    if version is None:
        problem = f"{name}: cannot read a version from {result.stdout.strip()[:80]!r}"
        problems.append(problem)
        return ToolInfo(name=name, path=path, error=problem)
    return ToolInfo(name=name, path=path, version=version, major=major, minor=minor)


def parse_version(text: str) -> tuple[str | None, int | None, int | None]:
    """`76.1` -> ("76.1", 76, 1); `setpci version 3.9.0` -> ("3.9.0", 3, 9)."""
    for token in text.split():
        token = token.lstrip("v")
        match = _VERSION_RE.match(token)
        if match:
            minor = int(match.group(2)) if match.group(2) is not None else None
            return token, int(match.group(1)), minor
    return None, None, None


def _which(host: Host, name: str) -> str | None:
    if host.is_live:
        return shutil.which(name)
    for directory in _BIN_DIRS:
        candidate = f"{directory}/{name}"
        if host.exists(candidate):
            return candidate
    # A captured tree holds no binaries; the bundle's metadata says where they were.
    meta = host.read_text(CAPTURE_META)
    try:
        paths = json.loads(meta).get("tool_paths", {}) if meta else {}
    except (json.JSONDecodeError, AttributeError):
        return None
    found = paths.get(name) if isinstance(paths, dict) else None
    return found if isinstance(found, str) else None


# --- JSON from the ndctl family --------------------------------------------------------------


def run_json(host: Host, argv: Sequence[str], problems: list[str]) -> list[Any] | None:
    """Run a listing command and return its top-level array; None when it did not give one.

    Never raises: a missing tool returns None quietly (the tools table says so), anything else
    that goes wrong is appended to `problems` with the command line, so the doctor can show it.
    """
    result = host.run(list(argv), timeout=LIST_TIMEOUT_S)
    if result.not_found:
        return None
    try:
        return parse_list_output(result)
    except ToolOutputError as exc:
        problems.append(f"{exc.what}: {exc.why}" if exc.why else exc.what)
        return None


def run_json_strict(host: Host, argv: Sequence[str], *, timeout: float = LIST_TIMEOUT_S) -> list[Any]:
    """For callers that need the data: the top-level array, or a typed error to show the operator.

    A missing program raises EnvironmentProblem (exit 3); a failure or unusable output raises
    ToolOutputError (exit 2), both naming the command and, for the ndctl family, the errno.
    """
    result = host.run(list(argv), timeout=timeout)
    if result.not_found:
        package = "ndctl" if result.program in ("cxl", "ndctl") else result.program
        raise EnvironmentProblem(
            f"`{result.program}` is not installed",
            why=f"`{' '.join(result.argv)}` could not be run",
            fix=f"install it (Debian/Ubuntu: apt-get install {package}; RHEL: dnf install {package})",
        )
    return parse_list_output(result)


def parse_list_output(result: CommandResult) -> list[Any]:
    """The strict parse: the command's top-level array, or ToolOutputError saying what was wrong."""
    command = " ".join(result.argv)
    if not result.ok:
        raise ToolOutputError(
            f"`{command}` failed",
            why=result.describe(),
            fix="run the command by hand to see the full error; check the kernel log (dmesg) for cxl/nd/dax messages",
        )
    text = result.stdout.strip()
    if not text:
        # Human mode and daxctl print nothing at all when there is nothing to list.
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolOutputError(
            f"`{command}` printed something that is not JSON",
            why=f"{exc.msg} at line {exc.lineno} column {exc.colno}: {text[:80]!r}",
            fix="upgrade or reinstall ndctl/daxctl; attach `belugactl discover --capture` output to a bug report",
        ) from exc
    if isinstance(data, dict):
        # `-u` with exactly one element prints the bare object.
        return [data]
    if not isinstance(data, list):
        raise ToolOutputError(
            f"`{command}` printed JSON of an unexpected shape",
            why=f"expected an array of objects, got {type(data).__name__}",
            fix="attach `belugactl discover --capture` output to a bug report",
        )
    return data


def as_int(value: Any) -> int | None:
    """An integer field as the tools print it: int, "0x..." hex, decimal string, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text, 0)
        except ValueError:
            return None
    return None


def as_hex(value: Any) -> int | None:
    """Hex-ish fields (serial, resource, iset_id): printed as int64, so a negative value wraps."""
    number = as_int(value)
    if number is not None and number < 0:
        return number + _U64
    return number


def as_size(value: Any) -> int | None:
    """A size: raw integer, or the human form "256.00 MiB (268.44 MB)" (approximate, best effort)."""
    number = as_int(value)
    if number is not None:
        return number
    if isinstance(value, str):
        from belugactl.units import SizeParseError, parse_size

        head = value.split("(")[0].replace(" ", "")
        try:
            return parse_size(head)
        except SizeParseError:
            # "7.86GiB" is not a whole number of bytes; round like the tool did.
            match = re.match(r"^(\d+(?:\.\d+)?)([KMGTP]i?B)$", head)
            if match:
                factor = parse_size("1" + match.group(2))
                return round(float(match.group(1)) * factor)
    return None


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None
