"""Writes to kernel attributes (sysfs, procfs), each read back, because the kernel may accept less.

Writing `nr_hugepages` is the classic case: the kernel takes the number, allocates what it can and
says nothing about the rest. Every write here returns what the attribute says afterwards, and the
workflow decides whether that is good enough.
"""

from __future__ import annotations

import errno

from belugactl.errors import EnvironmentProblem, StepFailed
from belugactl.host.host import Host

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def node_hugepages_path(node: int, page_size: int) -> str:
    """The per-node persistent pool of one page size (hugetlbpage.rst)."""
    return f"/sys/devices/system/node/node{node}/hugepages/hugepages-{page_size // 1024}kB/nr_hugepages"


def bracketed_choice(text: str | None) -> str | None:
    """`always [madvise] never` -> `madvise` (the kernel marks the active choice with brackets)."""
    if text is None:
        return None
    for token in text.split():
        if token.startswith("[") and token.endswith("]"):
            return token[1:-1]
    return None


# The host, not the value, is at fault: (reason, fix) for the errors setup cannot get past itself.
_CANNOT_WRITE: dict[type[OSError], tuple[str, str]] = {
    PermissionError: ("permission denied", "run belugactl setup as root (it changes kernel settings)"),
    FileNotFoundError: (
        "the kernel does not provide it",
        "check that the kernel has the feature (CONFIG option, loaded module) this setting needs",
    ),
}


def write_attr(host: Host, path: str, value: str) -> str | None:
    """Write `value` to a kernel attribute; return what it reads back (None when unreadable)."""
    try:
        host.write_text(path, value + "\n")
    except (PermissionError, FileNotFoundError) as exc:
        reason, fix = next(v for t, v in _CANNOT_WRITE.items() if isinstance(exc, t))
        raise EnvironmentProblem(f"cannot write {path}: {reason}", why=str(exc), fix=fix) from exc
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        raise StepFailed(f"the kernel refused `{value}` for {path} ({name})", why=str(exc)) from exc
    return host.read_str(path)
