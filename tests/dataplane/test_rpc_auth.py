"""rpc/auth.py without a server: key files and their modes, tenant keys, the handshake's proofs
(a wrong key, a replayed proof, a reflected proof) and admin write signatures."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from belugactl.dataplane.rpc import auth
from belugactl.errors import EnvironmentProblem, UsageError


def test_the_created_secret_is_0600_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "rack.secret"
    made = auth.load_rack_secret(str(path), create=True, rack="r")
    assert made is not None and len(made.key) == auth.KEY_BYTES and made.tenant is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.load_rack_secret(str(path), create=True).key == made.key  # never replaced once there


def test_a_missing_secret_is_not_created_unless_asked(tmp_path: Path) -> None:
    assert auth.load_rack_secret(str(tmp_path / "none"), create=False) is None
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_secret_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "rack.secret"
    auth.create_secret(str(path))
    os.chmod(path, mode)
    with pytest.raises(UsageError, match=f"mode {mode:04o}") as err:
        auth.load_rack_secret(str(path), create=True)
    assert err.value.exit_code == 2 and "chmod 0600" in (err.value.fix or "")


def test_a_secret_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rack.secret"
    auth.create_secret(str(path))
    st = path.stat()
    assert auth.secret_mode_problem(st) is None
    assert "owned by uid" in (auth.secret_mode_problem(st, uid=st.st_uid + 1) or "")


def test_a_link_to_a_secret_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    auth.create_secret(str(real))
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(EnvironmentProblem, match="cannot read"):
        auth.read_key_file(str(tmp_path / "link"))


def test_garbage_is_no_key_file(tmp_path: Path) -> None:
    path = tmp_path / "k"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"password123\n")
    os.close(fd)
    with pytest.raises(UsageError, match="not a belugactl key file"):
        auth.read_key_file(str(path))


def test_a_tenant_key_file_proves_that_tenant_only(tmp_path: Path) -> None:
    rack = auth.create_secret(str(tmp_path / "rack.secret"))
    auth.write_key_file(str(tmp_path / "a.key"), rack, "alice")
    alice = auth.read_key_file(str(tmp_path / "a.key"))
    assert alice.tenant == "alice" and alice.key == auth.tenant_key(rack.key, "alice") != rack.key
    assert stat.S_IMODE((tmp_path / "a.key").stat().st_mode) == 0o600
    assert rack.for_tenant("alice") == alice.key  # the server derives it
    assert alice.for_tenant("bob") is None and alice.for_tenant(None) is None


def _handshake(server_cred: auth.Credential | None, client: auth.Credential) -> tuple[auth.ServerHandshake, bool]:
    nc = os.urandom(auth.NONCE_BYTES)
    shake = auth.ServerHandshake(server_cred)
    answer, challenge = shake.on_hello(auth.hello_payload(nc, client.tenant))
    if answer != auth.OK:
        return shake, False
    proof = auth.check_challenge(client, nc, challenge)
    return shake, proof is not None and shake.on_proof(proof)


def test_the_same_key_passes_both_ways() -> None:
    rack = auth.Credential(os.urandom(32))
    assert _handshake(rack, rack)[1]
    alice = auth.Credential(auth.tenant_key(rack.key, "alice"), "alice")
    shake, ok = _handshake(rack, alice)
    assert ok and shake.tenant == "alice"


def test_a_wrong_key_fails_and_a_server_without_the_key_cannot_prove_itself() -> None:
    rack = auth.Credential(os.urandom(32))
    assert not _handshake(rack, auth.Credential(os.urandom(32)))[1]
    # a client holding alice's key claiming to be bob
    forged = auth.Credential(auth.tenant_key(rack.key, "alice"), "bob")
    assert not _handshake(rack, forged)[1]
    # the client checks the server's proof: a server with another key is refused by the client
    nc = os.urandom(auth.NONCE_BYTES)
    _answer, challenge = auth.ServerHandshake(auth.Credential(os.urandom(32))).on_hello(auth.hello_payload(nc, None))
    assert auth.check_challenge(rack, nc, challenge) is None
    assert auth.ServerHandshake(None).on_hello(auth.hello_payload(nc, None))[0] == auth.UNAVAILABLE


def test_a_recorded_handshake_does_not_replay() -> None:
    rack = auth.Credential(os.urandom(32))
    nc = os.urandom(auth.NONCE_BYTES)
    first = auth.ServerHandshake(rack)
    _a, challenge = first.on_hello(auth.hello_payload(nc, None))
    proof = auth.check_challenge(rack, nc, challenge)
    assert proof is not None and first.on_proof(proof)
    # the attacker replays the recorded HELLO and PROOF to a new connection: the server's nonce differs
    again = auth.ServerHandshake(rack)
    again.on_hello(auth.hello_payload(nc, None))
    assert not again.on_proof(proof)
    # a fake server replays the recorded CHALLENGE to a client: the client's nonce differs
    assert auth.check_challenge(rack, os.urandom(auth.NONCE_BYTES), challenge) is None
    # and the server's own proof reflected back as the client's is refused
    third = auth.ServerHandshake(rack)
    _a, ch3 = third.on_hello(auth.hello_payload(nc, None))
    assert not third.on_proof(ch3[auth.NONCE_BYTES :])


def test_malformed_hellos_are_refused() -> None:
    shake = auth.ServerHandshake(auth.Credential(os.urandom(32)))
    bad = (b"", b"\x01", b"\x02\x00" + bytes(32), b"\x01\x05" + bytes(32) + b"ab",
           b"\x01\x02" + bytes(32) + b"\xff\xfe")
    for payload in bad:
        assert shake.on_hello(payload)[0] == auth.BAD


def test_admin_signatures() -> None:
    key = os.urandom(32)
    verifier = auth.AdminVerifier(key, window_s=60)
    body = b'{"ranges": []}'
    header = auth.sign_admin_request(key, "POST", "/poison", body, now=1000)
    assert verifier.check(header, "POST", "/poison", body, now=1001) is None
    assert "replayed" in (verifier.check(header, "POST", "/poison", body, now=1002) or "")
    fresh = auth.sign_admin_request(key, "POST", "/poison", body, now=1000)
    assert verifier.check(fresh, "POST", "/poison", body + b" ", now=1000) == "bad signature"
    assert verifier.check(fresh, "POST", "/other", body, now=1000) == "bad signature"
    assert "timestamp" in (verifier.check(fresh, "POST", "/poison", body, now=1100) or "")
    other = auth.sign_admin_request(os.urandom(32), "POST", "/poison", body, now=1000)
    assert verifier.check(other, "POST", "/poison", body, now=1000) == "bad signature"
    assert verifier.check(None, "POST", "/poison", body) is not None
    assert verifier.check("Basic abc", "POST", "/poison", body) is not None


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.1", False), ("192.0.2.2", False), ("fe80::1%eth0", False)],
)  # fmt: skip
def test_what_is_beyond_loopback(bind: str, loopback: bool) -> None:
    assert auth.is_loopback(bind) is loopback
