"""The boot-time unit: re-apply what a reboot resets (hugepages, THP, DDIO, MTRR, permissions).

The region, namespace and header live on the device and in its label area, so they survive; the
rest is kernel state that starts from defaults at every boot. Like nvidia-mig-manager's unit, the
service is a oneshot that runs the same idempotent `setup`, limited to those topics.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from belugactl.workflows.setup.topics import boot_topic_ids

UNIT_NAME = "belugactl-setup.service"


def unit_text(manifest_path: str, host: str, command: Sequence[str], topics: Sequence[str] | None = None) -> str:
    topics = boot_topic_ids() if topics is None else topics
    argv = [*command, "setup", "-f", manifest_path, "--host", host, "--only", ",".join(topics), "--yes"]
    # systemd splits ExecStart like a shell would, but expands nothing else; quote each word.
    exec_start = " ".join(shlex.quote(a) for a in argv)
    return (
        "# Written by `belugactl export systemd`. Re-applies the pool host settings a reboot resets.\n"
        "[Unit]\n"
        f"Description=belugactl: re-apply {', '.join(topics)} for the CXL pool on {host}\n"
        "Documentation=man:belugactl(1)\n"
        "After=local-fs.target systemd-modules-load.service systemd-udevd.service\n"
        "Wants=systemd-modules-load.service\n"
        "Before=belugactl-serve.service\n"
        "ConditionPathExists=" + manifest_path + "\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "RemainAfterExit=yes\n"
        f"ExecStart={exec_start}\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
