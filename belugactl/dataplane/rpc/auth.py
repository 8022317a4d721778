"""Credentials for endpoints that bind beyond loopback: the rack secret, tenant keys, the TCP RPC
handshake and the admin HTTP request signature (docs/dataplane.md, Authentication).

- The **rack secret** is 32 random bytes in a file (`serve.metadata.secret_file`, default
  `/etc/belugactl/<rack>.secret`), mode 0600, owned by the user that runs the server. `setup`
  creates it (topic `secret`), or the metadata server when it must authenticate and the file is
  missing. A file readable by anyone else, or owned by another user, is refused (exit 2).
- A **tenant key** is HMAC-SHA256(rack secret, "tenant:" + name): an instance handed only its
  tenant's key (a key file with a `tenant` line) proves that tenant and nothing more.
- The **handshake** (TCP RPC): before any other frame the client sends HELLO with a fresh nonce
  Nc and the tenant name (or none: the rack secret itself), the server answers its own fresh
  nonce Ns and MAC_K("server", Nc, Ns, tenant), the client checks it (a fake server on the port
  knows no K) and answers MAC_K("client", Nc, Ns, tenant), and the server says OK or closes. Each
  side's proof covers the other's fresh nonce, so a recorded handshake replays to nothing. The
  frames use the TCP framing with their own magic (`AUTH_MAGIC`): a server that does not know
  them answers BAD_MAGIC, which a client holding a key refuses like any server that cannot
  prove itself. After the handshake frames travel as before, unprotected (see the docs).
- An **admin write** (any method but GET/HEAD) carries `Authorization: Beluga-HMAC
  ts=<unix s>,nonce=<hex>,mac=<hex>` over the method, path, timestamp, nonce and the body's
  sha256; the server accepts a timestamp within `ADMIN_WINDOW_S` and each nonce once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import os
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from belugactl.errors import EnvironmentProblem, UsageError

KEY_BYTES = 32
NONCE_BYTES = 32
MAC_BYTES = 32
DEFAULT_SECRET_DIR = "/etc/belugactl"
ENV_KEY_FILE = "BELUGA_KEY_FILE"  # a client's key file (the rack secret, or a tenant key)
MAX_TENANT = 64

AUTH_MAGIC = 0x48545541  # b"AUTH" read little-endian: never a protocol frame's MAGIC
VERSION = 1
# Handshake phases (the header's op field) and answers (its code field).
HELLO, CHALLENGE, PROOF, DONE = 1, 2, 3, 4
OK, REFUSED, REQUIRED, UNAVAILABLE, BAD = 0, 1, 2, 3, 4
ANSWERS = {
    REFUSED: "the server refused this key",
    REQUIRED: "the server requires a credential before any request",
    UNAVAILABLE: "the server has no rack secret and cannot prove itself",
    BAD: "the server could not read the handshake",
}
_HELLO = struct.Struct("<BB")  # version, tenant length; then Nc, then the tenant's name
HELLO_MAX = _HELLO.size + NONCE_BYTES + MAX_TENANT
AUTH_MAX_FRAME = 32 + HELLO_MAX  # the protocol header (32 bytes) and the longest handshake payload

ADMIN_HEADER = "Authorization"
ADMIN_SCHEME = "Beluga-HMAC"
ADMIN_WINDOW_S = 60.0


# --- the decision ---------------------------------------------------------------------------------
def is_loopback(bind: str) -> bool:
    """True when an address to bind is this host only (127.0.0.0/8, ::1, localhost)."""
    text = bind.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def default_secret_path(rack: str) -> str:
    return f"{DEFAULT_SECRET_DIR}/{rack}.secret"


def secret_path(manifest: object) -> str:
    """The rack secret's path: `serve.metadata.secret_file`, else the default for the rack's name."""
    serve = getattr(manifest, "serve", None)
    meta = getattr(serve, "metadata", None)
    chosen = getattr(meta, "secret_file", None)
    return str(chosen) if chosen else default_secret_path(str(getattr(manifest, "name", "rack")))


# --- keys and key files ---------------------------------------------------------------------------
def tenant_key(rack_secret: bytes, tenant: str) -> bytes:
    return hmac.new(rack_secret, b"tenant:" + tenant.encode(), hashlib.sha256).digest()


@dataclass(frozen=True)
class Credential:
    """A key and whom it proves: the rack (tenant None, the rack secret) or one tenant."""

    key: bytes
    tenant: str | None = None
    path: str | None = None

    def for_tenant(self, tenant: str | None) -> bytes | None:
        """The key a peer proving `tenant` must hold (None: this credential cannot check it)."""
        if not tenant:
            return self.key if self.tenant is None else None
        if self.tenant is None:
            return tenant_key(self.key, tenant)
        return self.key if tenant == self.tenant else None


def key_file_text(key: bytes, tenant: str | None = None, rack: str | None = None) -> str:
    what = f"tenant {tenant}'s key" if tenant else "rack secret"
    where = f" of rack {rack}" if rack else ""
    lines = [f"# belugactl {what}{where}: mode 0600, never share it; replacing it cuts every client"]
    if tenant:
        lines.append(f"tenant {tenant}")
    lines.append(f"key {key.hex()}")
    return "\n".join(lines) + "\n"


def parse_key_file(text: str, path: str) -> Credential:
    key: bytes | None = None
    tenant: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, value = line.partition(" ")
        value = value.strip()
        try:
            if word == "key":
                key = bytes.fromhex(value)
            elif word == "tenant" and 0 < len(value.encode()) <= MAX_TENANT:
                tenant = value
            elif not value and len(word) == 2 * KEY_BYTES:
                key = bytes.fromhex(word)  # a bare hex line (`openssl rand -hex 32`)
            else:
                key = None
                break
        except ValueError:
            key = None
            break
    if key is None or len(key) < 16:
        raise UsageError(
            f"{path}: not a belugactl key file",
            why="a key file is a line `key <hex>` (at least 16 bytes), optionally with `tenant <name>`",
            fix="recreate the rack secret with `belugactl setup --only secret --force` (this cuts every client) "
            "or copy the right file here",
        )
    return Credential(key, tenant, path)


def _checked_open(path: str, *, what: str) -> int:
    """Open a key file for reading without following a link, and refuse one others could read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot read the {what} {path}: {exc.strerror or exc}",
            why="it must be a regular file (not a link) that the user running this can read",
            fix=f"run as the user that owns {path}, or point serve.metadata.secret_file at this user's file",
        ) from None
    try:
        st = os.fstat(fd)
        problem = secret_mode_problem(st)
        if problem:
            raise UsageError(
                f"{what} {path} {problem}",
                why="anyone who reads it can call the metadata server as any tenant, or impersonate it",
                fix=f"chmod 0600 {path} && chown {os.geteuid()} {path} (or recreate it: "
                "`belugactl setup --only secret`)",
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def secret_mode_problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a key file's stat is not acceptable, or None: a regular file, mode 0600 or less, ours."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return f"has mode {mode:04o}: it must be 0600 or narrower (only its owner may read it)"
    want = os.geteuid() if uid is None else uid
    if st.st_uid != want:
        return f"is owned by uid {st.st_uid}, not by uid {want} that runs this"
    return None


def read_key_file(path: str, *, what: str = "key file") -> Credential:
    fd = _checked_open(path, what=what)
    with os.fdopen(fd, "r") as fh:
        text = fh.read(4096)
    return parse_key_file(text, path)


def create_secret(path: str, rack: str | None = None, *, replace: bool = False) -> Credential:
    """Write a fresh rack secret, mode 0600, never through a link; an existing file only when `replace`."""
    key = os.urandom(KEY_BYTES)
    text = key_file_text(key, rack=rack).encode()
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp if replace else target, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)
    if replace:
        os.replace(tmp, target)
    return Credential(key, None, path)


def load_rack_secret(path: str, *, create: bool, rack: str | None = None) -> Credential | None:
    """The rack secret from `path`; a missing file is created when `create`, else None."""
    try:
        return read_key_file(path, what="rack secret")
    except FileNotFoundError:
        pass
    if not create:
        return None
    try:
        return create_secret(path, rack)
    except FileExistsError:  # another process created it between our two looks
        return read_key_file(path, what="rack secret")
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot create the rack secret {path}: {exc.strerror or exc}",
            why="a server bound beyond loopback authenticates its clients with it",
            fix="create it as the server's user: `belugactl setup --only secret` (as root it is given to the "
            "pool's owner), or set serve.metadata.secret_file to a path that user can write",
        ) from None


_ENV_CACHE: dict[tuple[str, int, int], Credential] = {}
_ENV_LOCK = threading.Lock()


def client_credential(path: str | None = None) -> Credential | None:
    """The credential a client holds: `path`, else `$BELUGA_KEY_FILE`, else none (loopback as today)."""
    chosen = path or os.environ.get(ENV_KEY_FILE) or None
    if chosen is None:
        return None
    try:
        st = os.stat(chosen)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot read the key file {chosen}: {exc.strerror or exc}",
            fix=f"copy the rack secret or the tenant's key there (mode 0600), or unset ${ENV_KEY_FILE}",
        ) from None
    cache_key = (chosen, st.st_ino, st.st_mtime_ns)
    with _ENV_LOCK:
        found = _ENV_CACHE.get(cache_key)
    if found is None:
        found = read_key_file(chosen)
        with _ENV_LOCK:
            _ENV_CACHE[cache_key] = found
    return found


# --- the handshake ---------------------------------------------------------------------------------
def _mac(key: bytes, role: bytes, nc: bytes, ns: bytes, tenant: bytes) -> bytes:
    msg = b"beluga-rpc-v1 " + role + b"\0" + nc + ns + bytes([len(tenant)]) + tenant
    return hmac.new(key, msg, hashlib.sha256).digest()


def hello_payload(nonce: bytes, tenant: str | None) -> bytes:
    name = (tenant or "").encode()
    return _HELLO.pack(VERSION, len(name)) + nonce + name


def parse_hello(payload: bytes) -> tuple[bytes, str] | None:
    """(Nc, tenant) from a HELLO, or None when it is not one."""
    if len(payload) < _HELLO.size + NONCE_BYTES:
        return None
    version, n = _HELLO.unpack_from(payload, 0)
    body = payload[_HELLO.size :]
    if version != VERSION or len(body) != NONCE_BYTES + n or n > MAX_TENANT:
        return None
    try:
        return body[:NONCE_BYTES], body[NONCE_BYTES:].decode()
    except UnicodeDecodeError:
        return None


def server_proof(key: bytes, nc: bytes, ns: bytes, tenant: str) -> bytes:
    return _mac(key, b"server", nc, ns, tenant.encode())


def client_proof(key: bytes, nc: bytes, ns: bytes, tenant: str) -> bytes:
    return _mac(key, b"client", nc, ns, tenant.encode())


@dataclass
class ServerHandshake:
    """One connection's handshake on the server: HELLO in, CHALLENGE out, PROOF in, DONE out."""

    credential: Credential | None
    nc: bytes = b""
    ns: bytes = b""
    tenant: str = ""
    key: bytes | None = None

    def on_hello(self, payload: bytes) -> tuple[int, bytes]:
        """(answer, payload to send): CHALLENGE's payload when answer is OK, else the DONE code."""
        got = parse_hello(payload)
        if got is None:
            return BAD, b""
        if self.credential is None:
            return UNAVAILABLE, b""
        self.nc, self.tenant = got
        self.key = self.credential.for_tenant(self.tenant)
        self.ns = os.urandom(NONCE_BYTES)
        # A tenant this server cannot derive a key for still gets a challenge (a MAC under a random
        # key): the answer never tells a prober which tenants exist.
        key = self.key if self.key is not None else os.urandom(KEY_BYTES)
        return OK, self.ns + server_proof(key, self.nc, self.ns, self.tenant)

    def on_proof(self, payload: bytes) -> bool:
        if self.key is None or not self.ns or len(payload) != MAC_BYTES:
            return False
        return hmac.compare_digest(payload, client_proof(self.key, self.nc, self.ns, self.tenant))


def check_challenge(credential: Credential, nc: bytes, payload: bytes) -> bytes | None:
    """The client's PROOF payload when the server's CHALLENGE proves the key, else None."""
    if len(payload) != NONCE_BYTES + MAC_BYTES:
        return None
    ns, mac = payload[:NONCE_BYTES], payload[NONCE_BYTES:]
    tenant = credential.tenant or ""
    if ns == nc or not hmac.compare_digest(mac, server_proof(credential.key, nc, ns, tenant)):
        return None
    return client_proof(credential.key, nc, ns, tenant)


# --- admin HTTP writes -----------------------------------------------------------------------------
def _admin_mac(key: bytes, method: str, path: str, ts: int, nonce: str, body: bytes) -> str:
    msg = f"beluga-admin-v1\n{method.upper()}\n{path}\n{ts}\n{nonce}\n{hashlib.sha256(body).hexdigest()}"
    return hmac.new(key, msg.encode(), hashlib.sha256).hexdigest()


def sign_admin_request(key: bytes, method: str, path: str, body: bytes, now: float | None = None) -> str:
    """The Authorization header's value for an admin write (CLI tools and tests call this)."""
    ts = int(time.time() if now is None else now)
    nonce = os.urandom(16).hex()
    return f"{ADMIN_SCHEME} ts={ts},nonce={nonce},mac={_admin_mac(key, method, path, ts, nonce, body)}"


class AdminVerifier:
    """Checks admin write signatures: the key, a timestamp within the window, each nonce once."""

    max_nonces = 65536

    def __init__(self, key: bytes, window_s: float = ADMIN_WINDOW_S) -> None:
        self.key = key
        self.window_s = window_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None, method: str, path: str, body: bytes, now: float | None = None) -> str | None:
        """None when the request is signed with the key, else why not (for a 401's body)."""
        if not header:
            return "this admin endpoint is bound beyond loopback: sign the request (Authorization: Beluga-HMAC)"
        scheme, _, rest = header.strip().partition(" ")
        fields = dict(part.partition("=")[::2] for part in rest.split(","))
        try:
            ts = int(fields.get("ts", ""))
        except ValueError:
            return "malformed Authorization header"
        nonce, mac = fields.get("nonce", ""), fields.get("mac", "")
        if scheme != ADMIN_SCHEME or not 16 <= len(nonce) <= 64 or len(mac) != 64:
            return "malformed Authorization header"
        t = time.time() if now is None else now
        if abs(t - ts) > self.window_s:
            return f"the signature's timestamp is more than {self.window_s:g} s from the server's clock"
        if not hmac.compare_digest(mac, _admin_mac(self.key, method, path, ts, nonce, body)):
            return "bad signature"
        with self._lock:
            if nonce in self._seen:
                return "replayed request (its nonce was used before)"
            if len(self._seen) >= self.max_nonces:
                for old in [n for n, when in self._seen.items() if t - when > 2 * self.window_s]:
                    del self._seen[old]
                if len(self._seen) >= self.max_nonces:
                    return "too many signed requests in the window: retry shortly"
            self._seen[nonce] = t
        return None


def tenant_key_file_text(secret_file: str, tenant: str) -> str:
    """A key file's text for `tenant`, derived from the rack secret at `secret_file` (checked as ever)."""
    try:
        rack = read_key_file(secret_file, what="rack secret")
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"no rack secret {secret_file} on this host to derive tenant {tenant}'s key from",
            why="an instance dialling the metadata server beyond loopback proves its tenant's key",
            fix="copy the rack secret from the metadata server's host (mode 0600), or start serve there first",
        ) from None
    if rack.tenant is not None:
        raise UsageError(f"{secret_file} is tenant {rack.tenant}'s key, not the rack secret",
                         fix="point serve.metadata.secret_file at the rack secret")  # fmt: skip
    return key_file_text(tenant_key(rack.key, tenant), tenant)


def write_key_file(path: str, credential: Credential, tenant: str | None = None) -> None:
    """A key file for a client: the rack secret, or (given `tenant`) only that tenant's key."""
    key = tenant_key(credential.key, tenant) if tenant else credential.key
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with contextlib.closing(os.fdopen(fd, "w")) as fh:
        os.fchmod(fd, 0o600)
        fh.write(key_file_text(key, tenant))
