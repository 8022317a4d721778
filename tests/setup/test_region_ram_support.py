"""Setup refuses a ram region only on what it knows: no cxl tool, an old one, an old kernel.

A `cxl version` that timed out (seen in a TCG guest on a loaded host) is not an old tool.
"""

import pytest

from belugactl.errors import EnvironmentProblem
from belugactl.host.snapshot import HostSnapshot, KernelInfo, ToolInfo
from belugactl.workflows.setup.facts import SetupFacts
from belugactl.workflows.setup.topics.region import _require_ram_support


def _facts(cxl: ToolInfo, release: str = "6.12.117+deb13-amd64") -> SetupFacts:
    return SetupFacts(snapshot=HostSnapshot(tools={"cxl": cxl}, kernel=KernelInfo(release=release)), state={})


def test_a_new_tool_and_kernel_pass():
    _require_ram_support(_facts(ToolInfo("cxl", "/usr/bin/cxl", "81", 81, None)))


def test_a_version_query_that_failed_is_not_an_old_tool():
    failed = ToolInfo("cxl", "/usr/bin/cxl", error="cxl: version query failed: timed out after 30 s")
    _require_ram_support(_facts(failed))


@pytest.mark.parametrize(
    ("cxl", "release", "said"),
    [
        (ToolInfo("cxl", "/usr/bin/cxl", "76.1", 76, 1), "6.12.0", "cxl 76.1"),
        (ToolInfo("cxl"), "6.12.0", "cxl missing"),
        (ToolInfo("cxl", "/usr/bin/cxl", "81", 81, None), "6.1.0-28-amd64", "kernel 6.1.0-28-amd64"),
        (ToolInfo("cxl", "/usr/bin/cxl", error="cxl: version query failed"), "6.1.0-28-amd64", "kernel 6.1.0"),
    ],
)
def test_what_is_known_to_be_too_old_is_refused(cxl, release, said):
    with pytest.raises(EnvironmentProblem) as err:
        _require_ram_support(_facts(cxl, release))
    assert said in (err.value.why or "")
