"""The rack secret (docs/dataplane.md, Authentication): the key TCP RPC clients and admin writes prove
when the metadata server binds beyond loopback.

On the metadata server's host setup creates it (32 random bytes, mode 0600, owned by the pool's
owner, the user that runs the server, when setup runs as root), narrows a mode or owner that is
wrong, and never replaces an existing one without --force: a new secret cuts every client that
holds the old one (a file that is no key file, or a link, is replaced only with --force).
Teardown leaves it: a rack's clients may still hold it.

`SetupTarget.secret` (`target.py:secret_target`) says where it lives, when the manifest opens an
endpoint beyond loopback; a target without one (every endpoint on loopback) plans nothing here.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import ClassVar

from belugactl.dataplane.rpc.auth import KEY_BYTES, key_file_text, parse_key_file
from belugactl.errors import BelugaError, UsageError
from belugactl.host.host import Host
from belugactl.host.write_secret import secure_secret, write_secret
from belugactl.host.write_udev import lookup_uid
from belugactl.model.setup_plan import Step
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SecretTarget, SetupTarget, secret_target
from belugactl.workflows.setup.topic import ApplyContext, Planned, SetupTopic

ID = "secret"


@dataclass(frozen=True)
class CreateSecret:
    kind: ClassVar[str] = "create-secret"
    path: str
    owner: str
    replace: bool = False

    def display(self) -> str:
        verb = "replace" if self.replace else "create"
        return f"{verb} {self.path}: {KEY_BYTES} random bytes, mode 0600, owner {self.owner} (when run as root)"


@dataclass(frozen=True)
class SecureSecret:
    kind: ClassVar[str] = "secure-secret"
    path: str
    owner: str

    def display(self) -> str:
        return f"chmod 0600 {self.path} && chown {self.owner} {self.path} (when run as root)"


@dataclass(frozen=True)
class SecretFile:
    """What is at the secret's path now."""

    exists: bool
    link: bool = False
    regular: bool = True
    mode: int = 0
    uid: int = -1
    valid: bool = False
    want_uid: int | None = None  # who should own it: the pool's owner as root, else this user


def observe(host: Host, target: SetupTarget, facts: SetupFacts) -> None:
    want = _want(target)
    if want is None:
        return
    link = host.readlink(want.path) is not None
    st = host.stat(want.path)
    if os.geteuid() == 0:
        want_uid = int(want.owner) if want.owner.isdigit() else lookup_uid(host, want.owner)
    else:
        want_uid = os.geteuid()
    if st is None and not link:
        facts.extra[ID] = SecretFile(False, want_uid=want_uid)
        return
    valid = False
    if st is not None and stat.S_ISREG(st.st_mode) and not link:
        text = host.read_text(want.path)
        try:
            valid = text is not None and len(parse_key_file(text, want.path).key) >= 16
        except BelugaError:
            valid = False
    facts.extra[ID] = SecretFile(
        True,
        link=link,
        regular=st is not None and stat.S_ISREG(st.st_mode),
        mode=stat.S_IMODE(st.st_mode) if st is not None else 0,
        uid=st.st_uid if st is not None else -1,
        valid=valid,
        want_uid=want_uid,
    )


def _want(target: SetupTarget) -> SecretTarget | None:
    want = getattr(target, "secret", None)
    if not isinstance(want, SecretTarget) or want.server_host != target.host:
        return None
    return want


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    want = _want(target)
    if want is None:
        if getattr(target, "secret", None) is None:
            return Planned()
        return Planned(notes=[f"secret: the rack secret lives on the metadata server's host only; copy it, or a "
                              f"tenant's key, to {target.host} if its instances dial TCP beyond loopback"])  # fmt: skip
    now = facts.extra.get(ID)
    if not isinstance(now, SecretFile):
        return Planned()
    create = CreateSecret(want.path, want.owner)
    if not now.exists:
        return Planned(steps=[Step(
            id="secret.create", topic=ID, summary=f"rack secret {want.path} (clients beyond loopback prove it)",
            actions=(create,), before="missing", after=f"mode 0600, owner {want.owner}",
        )])  # fmt: skip
    if now.link or not now.regular or not now.valid:
        what = "a link" if now.link else ("not a regular file" if not now.regular else "not a key file")
        replace = CreateSecret(want.path, want.owner, replace=True)
        forced = Step(
            id="secret.replace", topic=ID, summary=f"replace {want.path} ({what}) with a new rack secret",
            actions=(replace,), destroys_data=True, before=what, after="a new secret: every client needs it",
        )  # fmt: skip
        return Planned(steps=[Step(
            id="secret.replace", topic=ID, summary=f"{want.path} is {what}", destroys_data=True, before=what,
            note="replacing the rack secret cuts every client that holds the old one",
            refusal=UsageError(
                f"{want.path} is {what}, not the rack secret setup expects",
                why="replacing it cuts every client that holds the old one",
                fix="move it away, or rerun with --force to replace it with a new secret",
            ),
            forced=forced,
        )])  # fmt: skip
    wrong_mode = bool(now.mode & 0o077)
    wrong_owner = now.want_uid is not None and now.uid != now.want_uid
    root = os.geteuid() == 0
    if wrong_mode or (root and wrong_owner):
        return Planned(steps=[Step(
            id="secret.secure", topic=ID, summary=f"{want.path} readable by its owner ({want.owner}) only",
            actions=(SecureSecret(want.path, want.owner),), before=f"uid {now.uid}, mode {now.mode:04o}",
            after="mode 0600",
        )])  # fmt: skip
    if wrong_owner:
        return Planned(notes=[f"secret: {want.path} is owned by uid {now.uid}, not by this user: the server refuses "
                              f"it; run setup as root (it gives the file to {want.owner})"])  # fmt: skip
    return Planned()


def _create(ctx: ApplyContext, action: CreateSecret) -> str:
    rack = getattr(getattr(ctx.target, "secret", None), "rack", None)
    write_secret(ctx.host, action.path, key_file_text(os.urandom(KEY_BYTES), rack=rack), action.owner,
                 replace=action.replace)  # fmt: skip
    return f"{action.path}: new rack secret, mode 0600"


def _secure(ctx: ApplyContext, action: SecureSecret) -> str:
    secure_secret(ctx.host, action.path, action.owner)
    return f"{action.path}: mode 0600"


def _record(step: Step, target: SetupTarget, facts: SetupFacts, state: dict, verb: str) -> None:
    if verb == "setup" and step.id in ("secret.create", "secret.replace"):
        state.setdefault("created", {})[ID] = getattr(getattr(target, "secret", None), "path", None)


TOPIC = SetupTopic(
    id=ID,
    order=90,  # after the host is set up: it depends on no other topic
    summary="the rack secret TCP RPC clients and admin writes prove beyond loopback (metadata host)",
    plan=plan,
    survives_reboot=True,
    observe=observe,
    changes=frozenset(),
    executors={CreateSecret: _create, SecureSecret: _secure},
    record=_record,
)


__all__ = ["TOPIC", "SecretTarget", "secret_target"]
