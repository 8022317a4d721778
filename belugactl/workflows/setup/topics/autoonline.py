"""The memory auto-online policy, set before a ram region exists (the auto-online trap).

With the kernel's default policy (auto_online_blocks = online, CONFIG_MHP_DEFAULT_ONLINE_TYPE_ONLINE_AUTO
in Debian's 6.12) and kmem loaded (udev loads it for every new dax device), a new ram region's dax
device becomes System RAM in ZONE_NORMAL at once: the kernel claims and zeroes the shared pool, and
getting it back means offlining ZONE_NORMAL memory, which fails once pages are in use (reproduced
in the ram lab, docs/lab-ram.md). So for a ram-region pool this topic, planned first:

- now: `echo offline > /sys/devices/system/memory/auto_online_blocks` (kmem then adds the memory
  offline and `daxctl reconfigure-device --mode=devdax` converts it cleanly). A reboot resets it;
  the boot unit applies it again.
- persisted: `blacklist kmem` in /etc/modprobe.d, so udev's modalias load never hands a new dax
  device to kmem, even before the boot unit runs. An explicit `modprobe kmem` still works.
  Chosen over editing the kernel command line, which setup cannot do portably (grub, systemd-boot,
  a PXE config); a host whose command line already says memhp_default_state=offline needs neither,
  and a kernel with kmem built in can only be fixed there: the plan says so.
"""

from __future__ import annotations

import re

from belugactl.host.host import Host
from belugactl.model.setup_plan import RemoveFile, Step, WriteAttr, WriteFile
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.target import SetupTarget
from belugactl.workflows.setup.topic import Planned, SetupTopic, State, record_created

ID = "autoonline"
AUTO_ONLINE = "/sys/devices/system/memory/auto_online_blocks"
BLACKLIST_FILE = "/etc/modprobe.d/belugactl-kmem.conf"
BLACKLIST_TEXT = (
    "# Written by belugactl setup: keep udev from loading kmem for a new CXL dax device, which would\n"
    "# online the shared pool as System RAM (the auto-online trap). `modprobe kmem` still works.\n"
    "blacklist kmem\n"
)
CMDLINE_OFFLINE = "memhp_default_state=offline"


def _ram_region(target: SetupTarget) -> bool:
    pool = target.pool
    return pool.source == "cxl-region" and pool.region_type == "ram"


def observe(host: Host, target: SetupTarget, facts: SetupFacts) -> None:
    if not _ram_region(target):
        return
    release = facts.snapshot.kernel.release or ""
    moddir = f"/lib/modules/{release}"
    dep = host.read_text(f"{moddir}/modules.dep") or ""
    builtin = host.read_text(f"{moddir}/modules.builtin") or ""
    facts.extra[ID] = {
        "kmem_loaded": host.exists("/sys/module/kmem")
        or any(d.driver == "kmem" for d in facts.snapshot.dax),
        "kmem_module": bool(re.search(r"(^|/)kmem\.ko(\.\w+)?:", dep, re.M)),
        "kmem_builtin": bool(re.search(r"(^|/)kmem\.ko$", builtin, re.M)),
        "blacklist": host.read_text(BLACKLIST_FILE),
    }


def plan(target: SetupTarget, facts: SetupFacts) -> Planned:
    if not _ram_region(target):
        return Planned()  # pmem regions and firmware dax devices: nothing to say on every plan
    seen = facts.extra.get(ID, {})
    cmdline = facts.snapshot.kernel.cmdline or ""
    policy = facts.snapshot.memory.auto_online_blocks
    steps: list[Step] = []
    notes: list[str] = []
    if policy is not None and policy.startswith("online"):
        steps.append(Step(
            id="autoonline.policy",
            topic=ID,
            summary="hot-added memory stays offline, so a ram region never becomes System RAM",
            actions=(WriteAttr(AUTO_ONLINE, "offline"),),
            before=f"auto_online_blocks {policy}: a new ram region would become System RAM in ZONE_NORMAL",
            after="offline",
            note="a reboot resets it: the boot unit applies it again",
        ))
    if CMDLINE_OFFLINE not in cmdline.split():
        if seen.get("kmem_builtin"):
            notes.append(f"kmem is built into this kernel and cannot be blacklisted: add {CMDLINE_OFFLINE} "
                         "to the kernel command line so the pool is never onlined before setup runs")
        elif (seen.get("kmem_module") or seen.get("kmem_loaded")) and seen.get("blacklist") != BLACKLIST_TEXT:
            steps.append(Step(
                id="autoonline.kmem-blacklist",
                topic=ID,
                summary="keep udev from loading kmem for new dax devices (persisted)",
                actions=(WriteFile(BLACKLIST_FILE, BLACKLIST_TEXT),),
                before="kmem " + ("loaded" if seen.get("kmem_loaded") else "loadable") + f", no {BLACKLIST_FILE}",
                after=f"{BLACKLIST_FILE}: blacklist kmem",
                note="kmem stays loaded until reboot if it is loaded now; the offline policy covers that"
                if seen.get("kmem_loaded") else None,
            ))
    return Planned(steps=steps, notes=notes)


def teardown(target: SetupTarget, facts: SetupFacts) -> Planned:
    if not facts.state.get("created", {}).get("kmem_blacklist") or facts.extra.get(ID, {}).get("blacklist") is None:
        return Planned()
    return Planned(steps=[
        Step(
            id="autoonline.kmem-blacklist",
            topic=ID,
            summary="remove belugactl's kmem blacklist",
            actions=(RemoveFile(BLACKLIST_FILE),),
            note="auto_online_blocks stays offline until reboot",
        )
    ])


def record(step: Step, target: SetupTarget, facts: SetupFacts, state: State, verb: str) -> None:
    if step.id == "autoonline.kmem-blacklist":
        wrote = any(isinstance(a, WriteFile) for a in step.actions)
        record_created(state, verb, "kmem_blacklist", lambda: BLACKLIST_FILE if wrote else None)


def check_write(action: WriteAttr, back: str | None) -> str:
    return f"auto_online_blocks {(back or '?').strip()}"


TOPIC = SetupTopic(
    id=ID,
    order=5,
    summary="the memory auto-online policy, before a ram region exists (kmem blacklist, offline)",
    plan=plan,
    teardown=teardown,
    observe=observe,
    record=record,
    check_write=check_write,
    changes=frozenset({"memory"}),
)
