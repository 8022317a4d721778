"""Good paths: the shipped examples, defaults, units, and the loader's own edge cases."""

import pytest

from belugactl.errors import ExitCode, ManifestError
from belugactl.model.manifest import format_path, load_manifest, load_manifest_text
from belugactl.units import GiB, MiB, TiB
from tests.support.manifests import EXAMPLES, MINIMAL


def test_lab_example_describes_the_emulated_lab():
    m = load_manifest(EXAMPLES / "lab.yaml")
    assert m.host_names() == ["lab-1", "lab-2"]
    assert m.pool.source.kind == "cxl-region"
    assert m.pool.source.memdevs == "all"
    assert m.pool.source.type == "pmem"
    assert m.pool.interleave.ways == 1
    # the layout is built on the dax device (510 MiB), not the 512 MiB region under it
    assert m.pool.source.region_size == 512 * MiB
    assert m.pool.size == 510 * MiB
    assert m.pool.align == 2 * MiB
    assert m.pool.namespace is not None and m.pool.namespace.map == "mem"
    assert all(h.platform == "cpu" for h in m.hosts)
    assert [m.block_size_on(h) for h in m.hosts] == [32, 32]


def test_beluga_example_is_the_papers_rack():
    m = load_manifest(EXAMPLES / "beluga-rack.yaml")
    assert len(m.hosts) == 16
    assert m.pool.size == 8 * TiB
    assert all(h.numa.cpu_nodes == 2 and h.numa.cxl_nodes == 2 and h.gpus.count == 8 for h in m.hosts)
    assert m.metadata_host() is not None and m.metadata_host().name == "beluga-00"
    assert m.pool.source.kind == "dax-device" and m.pool.source.device == "dax0.0"
    assert m.pool.interleave.mode == "software" and m.pool.interleave.granularity == 2 * MiB
    assert m.caching.ddio == "disabled" and m.caching.pool_memory_type == "uncachable"
    assert m.serve is not None and m.serve.vllm.prefix_caching_hash_algo == "sha256_cbor"
    assert sum(m.instances_on(h) for h in m.hosts) == 128


@pytest.mark.parametrize("name", ["lab.yaml", "single-host.yaml", "beluga-rack.yaml"])
def test_every_example_pins_a_namespace(name):
    m = load_manifest(EXAMPLES / name)
    assert m.pool.namespace is not None
    assert len(m.pool.namespace.uuid) == 36 and m.pool.namespace.name


def test_sizes_accept_units_and_integers():
    a = load_manifest_text(MINIMAL)
    b = load_manifest_text(MINIMAL.replace("size: 510MiB", f"size: {510 * MiB}"))
    assert a.pool.size == b.pool.size == 510 * MiB


def test_block_size_is_per_platform_and_per_host():
    text = MINIMAL.replace(
        "  - name: h2\n    address: 10.0.0.2\n    platform: cpu\n",
        "  - name: h2\n    address: 10.0.0.2\n    platform: gpu\n    gpus: {count: 1}\n"
        "  - name: h3\n    address: 10.0.0.3\n    platform: cpu\n    block_size: 64\n",
    )
    text += "serve:\n  vllm:\n    model: m\n    block_size: {gpu: 32, cpu: 128}\n"
    m = load_manifest_text(text)
    assert [m.block_size_on(h) for h in m.hosts] == [128, 32, 64]


def test_hash_seed_is_normalized_to_a_string():
    m = load_manifest_text(MINIMAL + "serve:\n  vllm:\n    model: m\n    hash_seed: 42\n")
    assert m.serve.vllm.hash_seed == "42"


def test_host_tuning_overrides_rack_tuning():
    first_host_end = "    platform: cpu\n  - name: h2"
    text = MINIMAL.replace(first_host_end, "    platform: cpu\n    tuning: {thp: never}\n  - name: h2")
    text += "tuning:\n  thp: always\n  hugepages: {page_size: 2MiB, per_node: {0: 16}}\n"
    m = load_manifest_text(text)
    assert m.tuning_for(m.hosts[0]).thp == "never"
    assert m.tuning_for(m.hosts[0]).hugepages.per_node == {0: 16}
    assert m.tuning_for(m.hosts[1]).thp == "always"


def test_percent_shared_kv():
    m = load_manifest_text(MINIMAL.replace("shared_kv: 254MiB", "shared_kv: 50%"))
    assert m.layout.shared_kv == "50%"


def test_missing_file_is_a_manifest_error(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "nope.yaml")
    assert info.value.exit_code == ExitCode.USAGE
    assert "file not found" in info.value.why


def test_binary_file_is_rejected(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    assert "not UTF-8" in info.value.why


def test_scalar_document_is_rejected():
    with pytest.raises(ManifestError) as info:
        load_manifest_text("just a string\n", file="x.yaml")
    (problem,) = info.value.problems
    assert (problem.location.line, problem.location.column) == (1, 1)
    assert "expected a mapping" in problem.message


def test_yes_is_not_a_version():
    with pytest.raises(ManifestError) as info:
        load_manifest_text(MINIMAL.replace("version: 1", "version: yes"))
    assert info.value.problems[0].path == "version"


def test_unknown_key_deep_in_a_list_has_did_you_mean():
    with pytest.raises(ManifestError) as info:
        load_manifest_text(MINIMAL.replace("    address: 10.0.0.2", "    adress: 10.0.0.2"), file="m.yaml")
    problems = {p.path: p for p in info.value.problems}
    assert problems["hosts[1].adress"].hint == "did you mean 'address'?"
    assert problems["hosts[1].address"].message == "missing required key 'address'"


def test_manifest_error_json_carries_positions():
    with pytest.raises(ManifestError) as info:
        load_manifest_text(MINIMAL.replace("size: 510MiB", "size: 3 parsecs"), file="m.yaml")
    data = info.value.to_dict()
    assert data["problems"][0]["file"] == "m.yaml"
    assert (data["problems"][0]["line"], data["problems"][0]["column"]) == (7, 9)
    assert data["problems"][0]["path"] == "pool.size"


def test_format_path():
    assert format_path(("hosts", 3, "name")) == "hosts[3].name"
    assert format_path(()) == ""


def test_equal_split_needs_a_fixed_shared_area():
    with pytest.raises(ManifestError) as info:
        load_manifest_text(MINIMAL.replace("shared_kv: 254MiB", "shared_kv: rest"))
    assert info.value.problems[0].path == "layout.shared_kv"


def test_explicit_partitions_with_rest_for_shared_kv():
    text = MINIMAL.replace("shared_kv: 254MiB\n  partition_size: equal", "shared_kv: rest\n  partition_size: 100MiB")
    m = load_manifest_text(text)
    assert m.layout.partition_size == 100 * MiB


def test_large_pool_sizes():
    m = load_manifest_text(MINIMAL.replace("size: 510MiB", "size: 2TiB"))
    assert m.pool.size == 2048 * GiB


# --- pool.permissions ---------------------------------------------------------------------------

PERMISSIONS_AT = "  namespace:\n"


def _with_permissions(block: str) -> str:
    return MINIMAL.replace(PERMISSIONS_AT, f"  permissions: {block}\n{PERMISSIONS_AT}")


def test_pool_permissions_default_to_root_root_0660():
    perms = load_manifest_text(MINIMAL).pool.permissions
    assert (perms.owner, perms.group, perms.mode, perms.mode_bits) == ("root", "root", "0660", 0o660)


@pytest.mark.parametrize(
    ("written", "mode"),
    [
        ('"0640"', "0640"),
        ('"640"', "0640"),
        ('"0o600"', "0600"),
        ("0660", "0660"),  # unquoted: YAML 1.1 reads a leading 0 as octal (432)
        ("416", "0640"),  # a plain integer is the permission value itself (416 == 0o640)
    ],
)
def test_pool_permissions_mode_forms(written: str, mode: str):
    perms = load_manifest_text(_with_permissions(f"{{owner: root, group: beluga, mode: {written}}}")).pool.permissions
    assert (perms.owner, perms.group, perms.mode) == ("root", "beluga", mode)


def test_pool_permissions_numeric_ids():
    perms = load_manifest_text(_with_permissions("{owner: 0, group: 990}")).pool.permissions
    assert (perms.owner, perms.group, perms.mode) == ("0", "990", "0660")


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ('{mode: "0666"}', "world-writable"),
        ("{mode: 0666}", "world-writable"),
        ("{mode: 660}", 'write it quoted, as octal: "0660"'),  # decimal 660 is not octal 660
        ('{mode: "rw-rw----"}', "expected an octal mode"),
        ('{mode: "4660"}', "setuid/setgid/sticky"),
        ("{mode: true}", "expected an octal mode"),
        ('{owner: "Bad Name"}', "user/group name"),
        ("{group: [a]}", "user/group name"),
        ("{user: root}", "user"),  # unknown key
    ],
)
def test_pool_permissions_are_validated(block: str, message: str):
    with pytest.raises(ManifestError) as info:
        load_manifest_text(_with_permissions(block))
    [problem] = info.value.problems
    assert problem.path.startswith("pool.permissions") and message in str(problem)
