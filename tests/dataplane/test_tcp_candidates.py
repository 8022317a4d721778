"""TCP clients given the rack's metadata servers as candidates (`tcp://a:9471,b:9471`, issue 32):
bad lists refused with what is wrong (exit 2), a client given only dead servers gives up within its
failover deadline naming every one, and the manifest's etcd candidates become that address."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from belugactl.dataplane.client import connect
from belugactl.dataplane.metadata_errors import MetadataUnavailable
from belugactl.dataplane.rpc.transport_tcp import MAX_CANDIDATES, TcpTransport, parse_tcp_candidates
from belugactl.errors import ExitCode, InputError, ManifestError, UsageError
from belugactl.model.manifest import load_manifest_text
from belugactl.workflows.leader_candidates import candidates_address
from tests.support.etcd import _free_port

REPO = Path(__file__).resolve().parents[2]
ANCHOR = "    host: lab-1\n"


def test_a_list_parses_in_order_with_ipv6_and_repeated_schemes() -> None:
    got = parse_tcp_candidates("tcp://10.0.0.1:9471, tcp://[::1]:9472,b:1")
    assert got == [("10.0.0.1", 9471), ("::1", 9472), ("b", 1)]
    assert parse_tcp_candidates("tcp://h:9471") == [("h", 9471)]


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("tcp://a:1,", "empty entry"),
        ("tcp://a:1,,b:2", "empty entry"),
        ("tcp://a:1,a:1", "twice"),
        ("tcp://a:1,b", "bad entry 'b'"),
        ("tcp://a:1,b:99999", "bad entry"),
        ("tcp://a:1,b:2/x", "a host and port only"),
        ("tcp://a:1,u@b:2", "a host and port only"),
        ("http://a:1,b:2", "bad TCP address"),
        ("tcp://" + ",".join(f"h{i}:1" for i in range(MAX_CANDIDATES + 1)), f"at most {MAX_CANDIDATES}"),
    ],
)
def test_a_bad_list_is_refused_with_what_is_wrong(address: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as err:
        parse_tcp_candidates(address)
    assert err.value.exit_code == ExitCode.USAGE == 2
    with pytest.raises(UsageError):  # connect() refuses it too, before any connection
        connect(address, timeout_s=0.1)


def test_sixteen_candidates_are_accepted() -> None:
    assert len(parse_tcp_candidates("tcp://" + ",".join(f"h{i}:1" for i in range(MAX_CANDIDATES)))) == MAX_CANDIDATES


def test_only_dead_servers_fail_within_the_deadline_naming_each() -> None:
    a, b = _free_port(), _free_port()  # nothing listens there
    with pytest.raises(MetadataUnavailable) as err:
        connect(f"tcp://127.0.0.1:{a},127.0.0.1:{b}", timeout_s=0.2, failover_s=0.3)
    why = err.value.why or ""
    assert f"127.0.0.1:{a}" in why and f"127.0.0.1:{b}" in why and "none of the 2" in why
    assert "gave up after" in why  # it tried again (bounded backoff) before giving up, and did give up


def test_the_transport_starts_at_the_next_candidate_after_advance() -> None:
    a, b = _free_port(), _free_port()
    t = TcpTransport.__new__(TcpTransport)  # no connection: only the rotation
    t.address, t.candidates, t._at, t.broken = ("127.0.0.1", a), [("127.0.0.1", a), ("127.0.0.1", b)], 0, False
    t.advance()
    assert t._at == 1 and t.broken
    t.advance()
    assert t._at == 0


def _lab(candidates: list[str], bind: str = "0.0.0.0"):  # noqa: S104 - the manifest's text, not a bind here
    text = (REPO / "examples" / "lab.yaml").read_text()
    assert text.count(ANCHOR) == 1
    conf = json.dumps({"endpoints": ["http://10.0.0.9:2379"], "candidates": candidates})
    text = text.replace(ANCHOR, f"{ANCHOR}    rpc_bind: {bind}\n    etcd: {conf}\n")
    return load_manifest_text(text, file="rack.yaml")


def test_the_manifest_candidates_become_one_address_per_client_host() -> None:
    m = _lab(["lab-1", "lab-2"])
    assert candidates_address(m, m.host("lab-2")) == "tcp://10.0.2.15:9471,127.0.0.1:9471"
    assert candidates_address(m, m.host("lab-1")) == "tcp://127.0.0.1:9471,10.0.2.16:9471"
    parse_tcp_candidates(candidates_address(m, m.host("lab-1")) or "")
    plain = load_manifest_text((REPO / "examples" / "lab.yaml").read_text(), file="rack.yaml")
    assert candidates_address(plain, plain.host("lab-1")) is None  # one server: the single address stays


def test_a_candidate_that_cannot_be_dialled_is_refused_at_the_manifest() -> None:
    with pytest.raises(ManifestError) as refused:
        _lab(["lab-1", "lab-9"])  # manifest check's rule, with the line
    (problem,) = refused.value.problems
    assert "'lab-9' is not one of the hosts" in problem.message and refused.value.exit_code == 2
    m = _lab(["lab-1", "lab-2"])
    m.serve.metadata.etcd.candidates[1] = "lab-9"  # a manifest changed after its check: refused here too
    with pytest.raises(InputError, match="'lab-9', which is not a host") as err:
        candidates_address(m, m.host("lab-1"))
    assert err.value.exit_code == 2
    loop = _lab(["lab-1", "lab-2"], bind="127.0.0.1")
    with pytest.raises(InputError, match="candidate lab-2"):
        candidates_address(loop, loop.host("lab-1"))
