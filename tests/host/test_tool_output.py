"""Tool JSON in every documented shape, and tool output that is broken: parsed or reported, never a crash."""

from __future__ import annotations

import json

import pytest

from belugactl.errors import ExitCode, ToolOutputError
from belugactl.host.command_runner import CommandResult, RecordedRunner
from belugactl.host.host import Host
from belugactl.host.read_cxl import parse_cxl_list
from belugactl.host.read_dax import parse_daxctl_list
from belugactl.host.read_nd import NDCTL_LIST, parse_ndctl_list, read_nd
from belugactl.host.read_tools import as_hex, as_size, parse_list_output, parse_version
from belugactl.workflows.discover import discover
from tests.support.fixture_trees import tree

MiB = 1 << 20


def result(stdout: str, rc: int = 0, stderr: str = "", argv: tuple[str, ...] = ("cxl", "list")) -> CommandResult:
    return CommandResult(argv, rc, stdout, stderr)


# --- the strict parse ----------------------------------------------------------------------


@pytest.mark.parametrize("stdout", ["", "\n", "[\n]\n"])
def test_empty_outputs_mean_no_objects(stdout: str) -> None:
    assert parse_list_output(result(stdout, stderr="  Warning: no matching devices found\n")) == []


def test_bare_object_from_human_mode_is_one_element() -> None:
    assert parse_list_output(result('{"memdev":"mem0"}')) == [{"memdev": "mem0"}]


@pytest.mark.parametrize(
    ("stdout", "why"),
    [("Error: libcxl init failed", "not JSON"), ('[{"memdev": "mem0"', "not JSON"), ("42", "unexpected shape"),
     ('"mem0"', "unexpected shape")],
)
def test_broken_output_raises_tool_output_error(stdout: str, why: str) -> None:
    with pytest.raises(ToolOutputError) as info:
        parse_list_output(result(stdout))
    assert why in info.value.what
    assert info.value.exit_code == ExitCode.USAGE
    assert info.value.fix


def test_failing_command_names_the_errno() -> None:
    with pytest.raises(ToolOutputError) as info:
        parse_list_output(result("", rc=237, stderr="cxl list: no such device\n"))
    assert "ENODEV" in (info.value.why or "")


# --- value forms -------------------------------------------------------------------------------


def test_value_forms() -> None:
    assert as_hex(-6382611090938810793) == 0xA76C6907811FAE57  # the documented iset_id pair
    assert as_hex("0xa76c6907811fae57") == 0xA76C6907811FAE57
    assert as_size(268435456) == 256 * MiB
    assert as_size("256.00 MiB (268.44 MB)") == 256 * MiB
    assert as_size("7.86 GiB (8.44 GB)") == round(7.86 * (1 << 30))
    assert as_size(None) is None and as_size(True) is None and as_size("lots") is None
    assert parse_version("76.1\n") == ("76.1", 76, 1)
    assert parse_version("setpci version 3.9.0") == ("3.9.0", 3, 9)
    assert parse_version("v78") == ("78", 78, None)
    assert parse_version("unknown") == (None, None, None)


# --- cxl list shapes ---------------------------------------------------------------------------


def test_cxl_list_wrapped_shape_from_a_qemu_guest() -> None:
    # Documented `cxl list` (default: regions + memdevs) in a QEMU 8 guest: two wrapper objects.
    data = [
        {"memdevs": [{"memdev": "mem0", "pmem_size": 268435456, "serial": 0, "host": "0000:0d:00.0"}]},
        {"regions": [{"region": "region0", "resource": 45365592064, "size": 268435456, "type": "pmem",
                      "interleave_ways": 1, "interleave_granularity": 1024, "decode_state": "commit"}]},
    ]
    listing = parse_cxl_list(data)
    [mem] = listing.memdevs
    assert (mem.name, mem.pmem_size, mem.ram_size, mem.host_bdf) == ("mem0", 256 * MiB, 0, "0000:0d:00.0")
    [region] = listing.regions
    assert (region.resource, region.type, region.interleave_granularity) == (45365592064, "pmem", 1024)


def test_cxl_list_decoder_wrappers_give_the_kind() -> None:
    data = [
        {"root decoders": [{"decoder": "decoder0.0", "size": 4 << 30, "pmem_capable": True, "nr_targets": 1}]},
        {"port decoders": [{"decoder": "decoder1.0", "interleave_ways": 1, "nr_targets": 1}]},
        {"endpoint decoders": [{"decoder": "decoder2.0", "interleave_ways": 1, "state": "disabled"}]},
        {"anon memdevs": [{"memdev": "mem1", "ram_size": 1 << 30, "state": "disabled", "host": "cxl_mem.1"}]},
    ]
    listing = parse_cxl_list(data)
    assert [(d.name, d.kind) for d in listing.decoders] == [
        ("decoder0.0", "root"), ("decoder1.0", "switch"), ("decoder2.0", "endpoint"),
    ]
    root, _switch, endpoint = listing.decoders
    assert root.volatile_capable is False  # absent on a root decoder means "not capable"
    assert endpoint.state == "disabled" and endpoint.size == 0 and endpoint.mode == "none"
    [mem] = listing.memdevs
    assert mem.state == "disabled"
    assert mem.host_bdf is None  # cxl_test hosts are not PCI functions


def test_cxl_list_verbose_nested_shape() -> None:
    # The shape of `cxl list -v` on real hardware (single-device.rst), trimmed to what matters.
    data = [{
        "bus": "root0", "provider": "ACPI.CXL",
        "ports:root0": [{
            "port": "port1", "host": "pci0000:d2", "depth": 1,
            "endpoints:port1": [{
                "endpoint": "endpoint5", "host": "mem0", "depth": 2,
                "memdev": {"memdev": "mem0", "ram_size": 137438953472, "serial": 0, "numa_node": 0,
                           "host": "0000:d3:00.0"},
                "decoders:endpoint5": [{"decoder": "decoder5.0", "resource": 825975898112,
                                        "size": 137438953472, "interleave_ways": 1, "region": "region0",
                                        "dpa_resource": 0, "dpa_size": 137438953472, "mode": "ram"}],
            }],
            "decoders:port1": [{"decoder": "decoder1.0", "resource": 825975898112, "size": 137438953472,
                                "interleave_ways": 1, "region": "region0", "nr_targets": 1}],
        }],
        "decoders:root0": [{
            "decoder": "decoder0.0", "resource": 825975898112, "size": 137438953472, "interleave_ways": 1,
            "max_available_extent": 0, "volatile_capable": True, "nr_targets": 1,
            "targets": [{"target": "pci0000:d2", "alias": "ACPI0016:01", "position": 0, "id": 210}],
            "regions:decoder0.0": [{"region": "region0", "resource": 825975898112, "size": 137438953472,
                                    "type": "ram", "interleave_ways": 1, "interleave_granularity": 256,
                                    "decode_state": "commit",
                                    "mappings": [{"position": 0, "memdev": "mem0", "decoder": "decoder5.0"}]}],
        }],
    }]
    listing = parse_cxl_list(data)
    assert listing.buses == ["root0"]
    assert listing.ports == ["port1", "endpoint5"]
    [mem] = listing.memdevs
    assert (mem.name, mem.endpoint, mem.numa_node, mem.ram_size) == ("mem0", "endpoint5", 0, 128 << 30)
    kinds = {d.name: d.kind for d in listing.decoders}
    assert kinds == {"decoder5.0": "endpoint", "decoder1.0": "switch", "decoder0.0": "root"}
    root = next(d for d in listing.decoders if d.name == "decoder0.0")
    assert root.target_list == ["pci0000:d2"] and root.pmem_capable is False
    [region] = listing.regions
    assert (region.root_decoder, region.memdevs, region.endpoint_decoders) == (
        "decoder0.0", ["mem0"], ["decoder5.0"],
    )


def test_cxl_list_ignores_junk_inside_a_valid_array() -> None:
    listing = parse_cxl_list([17, "x", None, {"unrelated": 1}, {"memdev": 5}, {"memdev": "mem0"}])
    assert [m.name for m in listing.memdevs] == ["mem0"]


# --- ndctl / daxctl shapes ----------------------------------------------------------------


def test_ndctl_flat_namespace_with_daxregion() -> None:
    # `ndctl create-namespace` output (famfs docs, humanized because it ran on a terminal).
    data = [{"dev": "namespace0.0", "mode": "devdax", "map": "dev", "size": "7.86 GiB (8.44 GB)",
             "uuid": "8c28", "daxregion": {"id": 0, "size": "7.86 GiB (8.44 GB)", "align": 2097152,
                                           "devices": [{"chardev": "dax0.0", "size": "7.86 GiB (8.44 GB)"}]},
             "align": 2097152}]
    regions, namespaces = parse_ndctl_list(data)
    assert regions == []
    [ns] = namespaces
    assert (ns.mode, ns.map, ns.chardev, ns.align, ns.region) == ("devdax", "dev", "dax0.0", 2 * MiB, None)


def test_ndctl_regions_without_bus() -> None:
    data = [{"dev": "region1", "size": 1 << 30, "align": 16 * MiB, "type": "pmem",
             "namespaces": [{"dev": "namespace1.0", "mode": "fsdax", "map": "dev", "size": 1 << 30,
                             "blockdev": "pmem1", "align": 2 * MiB}]}]
    regions, namespaces = parse_ndctl_list(data)
    assert [(r.dev, r.provider) for r in regions] == [("region1", None)]
    assert [(n.dev, n.region, n.blockdev) for n in namespaces] == [("namespace1.0", "region1", "pmem1")]


# `ndctl list -v` on a devdax namespace: "uuid" is the info block's, "raw_uuid" the label's (pinned with -u).
VERBOSE_DEVDAX = {"dev": "namespace0.0", "mode": "devdax", "map": "mem", "size": 510 * MiB,
                  "uuid": "a1b2c3d4-0000-4000-8000-00000000beef", "raw_uuid": "5B0C6E2A-7D41-4F38-9A1E-2C7F3D9B8E01",
                  "chardev": "dax0.0", "align": 2 * MiB, "name": "beluga-lab"}


def test_ndctl_raw_uuid_is_the_label_uuid() -> None:
    _, [ns] = parse_ndctl_list([VERBOSE_DEVDAX])
    assert ns.uuid == "a1b2c3d4-0000-4000-8000-00000000beef"
    assert ns.label_uuid == "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"
    _, [plain] = parse_ndctl_list([{k: v for k, v in VERBOSE_DEVDAX.items() if k != "raw_uuid"}])
    assert plain.label_uuid is None  # never guessed from the info-block uuid


@pytest.mark.parametrize(
    ("sysfs", "want"),
    [
        ("0a0b0c0d-1111-4222-8333-444455556666\n", "0a0b0c0d-1111-4222-8333-444455556666"),  # sysfs wins
        ("00000000-0000-0000-0000-000000000000\n", "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"),  # label-less: raw_uuid
        (None, "5b0c6e2a-7d41-4f38-9a1e-2c7f3d9b8e01"),  # not readable: raw_uuid
    ],
)
def test_label_uuid_from_sysfs(tmp_path, sysfs: str | None, want: str) -> None:
    if sysfs is not None:
        attr = tmp_path / "sys/bus/nd/devices/namespace0.0/uuid"
        attr.parent.mkdir(parents=True)
        attr.write_text(sysfs)
    runner = RecordedRunner()
    runner.add(CommandResult(NDCTL_LIST, 0, json.dumps([VERBOSE_DEVDAX]), ""))
    problems: list[str] = []
    [ns] = read_nd(Host(tmp_path, runner), problems).namespaces
    assert (ns.label_uuid, problems) == (want, [])


def test_daxctl_flat_devices() -> None:
    data = [{"chardev": "dax0.0", "size": 16777216000, "target_node": 2, "mode": "system-ram"}]
    [dev] = parse_daxctl_list(data)
    assert (dev.name, dev.size, dev.target_node, dev.mode, dev.region_id) == (
        "dax0.0", 16777216000, 2, "system-ram", None,
    )


# --- broken output inside discovery: recorded as problems, nothing crashes -------------------


def _host_with(base: str, replacements: dict[tuple[str, ...], CommandResult]) -> Host:
    fixture = Host.from_tree(tree(base))
    runner = fixture.runner
    assert isinstance(runner, RecordedRunner)
    for res in replacements.values():
        runner.add(res)
    return fixture


def test_discovery_survives_garbage_from_every_tool() -> None:
    garbage = {
        argv: CommandResult(argv, 0, "Segmentation fault? {{{", "")
        for argv in (("cxl", "list", "-M", "-i"), ("cxl", "list", "-R", "-T", "-i"),
                     ("ndctl", "list", "-B", "-R", "-N"), ("daxctl", "list", "-R", "-D"))
    }
    garbage[("cxl", "list", "-D", "-d", "root")] = CommandResult(("cxl", "list", "-D", "-d", "root"), 0,
                                                                   json.dumps({"a": 1}) + "x", "")
    snap = discover(_host_with("lab-guest", garbage))
    assert len(snap.problems) == 5
    assert all("not JSON" in p for p in snap.problems)
    assert any("`cxl list -M -i`" in p for p in snap.problems)
    # sysfs still tells what the tool could not: the memdev, region and dax device are all there.
    assert [m.name for m in snap.cxl.memdevs] == ["mem0"]
    assert snap.cxl.regions[0].memdevs == ["mem0"]
    assert snap.cxl.source == "cxl list+sysfs"  # the endpoint decoder listing still parsed
    assert [d.name for d in snap.dax] == ["dax0.0"]
    assert snap.nd.namespaces == []  # ndctl is the only source for namespaces


def test_discovery_reports_a_failing_tool_with_its_errno() -> None:
    failing = {("daxctl", "list", "-R", "-D"): CommandResult(("daxctl", "list", "-R", "-D"), 250, "",
                                                              "daxctl: failed to list\n")}
    snap = discover(_host_with("amd-host", failing))
    [problem] = snap.problems
    assert "ENXIO" in problem and "daxctl list -R -D" in problem
    # devdax mode still comes from sysfs (the device_dax driver).
    assert snap.dax[0].mode == "devdax"


def test_wrong_json_shape_is_a_problem_not_a_crash() -> None:
    shapes = {("cxl", "list", "-M", "-i"): CommandResult(("cxl", "list", "-M", "-i"), 0, '"mem0"\n', "")}
    snap = discover(_host_with("beluga-intel", shapes))
    assert any("unexpected shape" in p for p in snap.problems)
    assert [m.name for m in snap.cxl.memdevs] == ["mem0", "mem1"]


def test_version_that_cannot_be_read() -> None:
    odd = {("cxl", "version"): CommandResult(("cxl", "version"), 0, "unknown\n", "")}
    snap = discover(_host_with("nocxl", odd))
    assert snap.tools["cxl"].version is None and snap.tools["cxl"].error
    assert snap.tools["cxl"].installed
    assert any(p.startswith("cxl: cannot read a version") for p in snap.problems)


def test_missing_tools_are_not_installed_and_not_problems() -> None:
    bare = Host(tree("nocxl"), RecordedRunner())
    snap = discover(bare)
    assert not any(t.installed for t in snap.tools.values())
    assert snap.problems == []
    assert snap.cxl.source is None


def test_strict_listing_for_callers_that_need_the_data() -> None:
    from belugactl.errors import EnvironmentProblem
    from belugactl.host.read_tools import run_json_strict

    lab = Host.from_tree(tree("lab-guest"))
    [memdev] = run_json_strict(lab, ["cxl", "list", "-M", "-i"])
    assert memdev["memdev"] == "mem0"
    with pytest.raises(EnvironmentProblem) as info:
        run_json_strict(Host(tree("lab-guest"), RecordedRunner()), ["daxctl", "list", "-R", "-D"])
    assert info.value.exit_code == ExitCode.ENVIRONMENT and "apt-get install daxctl" in (info.value.fix or "")
    broken = _host_with("nocxl", {("cxl", "list", "-M", "-i"): CommandResult(("cxl", "list", "-M", "-i"), 0, "{", "")})
    with pytest.raises(ToolOutputError):
        run_json_strict(broken, ["cxl", "list", "-M", "-i"])
