"""Who may COMMIT, ABORT and RELEASE what: owners, unguessable tokens and lease ids.

Every request reaches the service with an owner: the ring index for CXL-RPC (a ring belongs to one
client: one vLLM process, its scheduler or a worker), or a connection number for TCP (numbers start
above the ring count, so the two never collide). A reservation token is 64 random bits stored with
its owner. A lease id is a keyed permutation (a 4-round Feistel network over two 32-bit halves,
keys drawn at start) of `sequence << LEASE_OWNER_BITS | owner`: ids do not follow one another, and
decoding one gives back the owner it was granted to, with no table, which the native fast path
needs (it grants leases in C and only logs their sequence numbers). The C twin is `lease_encode` in
`_native_ring.h`; a test checks they agree.

What this buys: an off-by-one or a stale id from another client is refused with NOT_OWNER (and
counted) instead of committing or releasing somebody else's block. It is not cryptography: the
permutation's keys are secret and per server start, which is enough against guessing, not
against a client that can read the server's memory.
"""

from __future__ import annotations

import secrets
import struct

from belugactl.dataplane import native
from belugactl.dataplane.rpc.protocol import LEASE_OWNER_BITS

_decode_many = native.optional("lease_decode_many")

M32 = 0xFFFFFFFF
OWNER_MASK = (1 << LEASE_OWNER_BITS) - 1
MAX_SEQ = (1 << (64 - LEASE_OWNER_BITS)) - 1


def _round(x: int, k: int) -> int:
    x ^= k
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


class LeaseCodec:
    """lease id <-> (sequence number, owner)."""

    def __init__(self, keys: tuple[int, int, int, int] | None = None) -> None:
        self.keys = keys or tuple(secrets.randbits(32) for _ in range(4))  # type: ignore[assignment]
        self.key_bytes = struct.pack("<4I", *self.keys)  # what the native fast path takes

    def encode(self, seq: int, owner: int) -> int:
        v = (seq << LEASE_OWNER_BITS) | (owner & OWNER_MASK)
        left, right = v >> 32, v & M32
        for k in self.keys:
            left, right = right, left ^ _round(right, k)
        return (left << 32) | right

    def decode(self, lease_id: int) -> tuple[int, int]:
        left, right = (lease_id >> 32) & M32, lease_id & M32
        for k in reversed(self.keys):
            left, right = right ^ _round(left, k), left
        v = (left << 32) | right
        return v >> LEASE_OWNER_BITS, v & OWNER_MASK

    def decode_many(self, ids: bytes, owner: int) -> tuple[list[int], int]:
        """Little-endian u64 lease ids -> (their sequence numbers, how many were granted to an owner
        other than `owner`). Native when built: a RELEASE of a long prompt's leases spent most of its
        time in the Python permutation."""
        if _decode_many is not None:
            return _decode_many(self.key_bytes, ids, owner)
        seqs = []
        foreign = 0
        for (lease_id,) in struct.iter_unpack("<Q", ids):
            seq, lease_owner = self.decode(lease_id)
            foreign += lease_owner != owner
            seqs.append(seq)
        return seqs, foreign


def new_token(live: dict[int, object]) -> int:
    """A reservation token: 64 random bits, never 0, not one in use."""
    while True:
        token = secrets.randbits(64)
        if token and token not in live:
            return token


class TcpOwners:
    """Owner numbers for TCP connections: above the ring numbers, wrapping within the id's owner bits."""

    def __init__(self, ring_count: int) -> None:
        # Rings are owners 0..ring_count-1 (a ring per vLLM process: at most 16 hosts x 64 instances x
        # 65 processes + 4096 spare, about 71k, far below the 2**20 owner ids a lease id carries).
        if not 0 <= ring_count < OWNER_MASK:
            raise ValueError(f"{ring_count} rings leave no owner ids for TCP connections (at most {OWNER_MASK - 1})")
        self.base = ring_count
        self.span = OWNER_MASK + 1 - ring_count
        self._next = 0

    def next(self) -> int:
        owner = self.base + self._next
        self._next = (self._next + 1) % self.span
        return owner


class HandoverGroups:
    """Which owners may release each other's leases: those that said the same hand-over group in
    HELLO (a 64-bit secret the processes of one vLLM instance share; 0 joins none).

    The vLLM scheduler looks blocks up under its leases and a worker of the same instance copies
    them and releases them (RELEASE_GRANTED_ELSEWHERE). A lease id names the owner it was granted
    to; the release is accepted only when that owner is in the releaser's group, so a client that
    merely learned an id cannot free another reader's block. A group holds at most MAX_MEMBERS
    owners (an instance has a scheduler and one worker per rank); a HELLO past that joins none.
    """

    MAX_MEMBERS = 256

    def __init__(self) -> None:
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.refused_joins = 0  # HELLOs naming a full group

    def join(self, owner: int, group: int) -> None:
        """`owner` said `group` in its HELLO (a new HELLO replaces what it said before)."""
        self.forget(owner)
        if not group:
            return
        members = self.members.setdefault(group, [])
        if len(members) >= self.MAX_MEMBERS:
            self.refused_joins += 1
            return
        members.append(owner)
        self.group_of[owner] = group

    def forget(self, owner: int) -> None:
        """`owner` left (its connection closed, or it said another group)."""
        group = self.group_of.pop(owner, 0)
        if group:
            members = self.members[group]
            members.remove(owner)
            if not members:
                del self.members[group]

    def granted_within(self, codec: LeaseCodec, ids: bytes, owner: int, foreign: int) -> bool:
        """Were all `foreign` ids of `ids` (those not granted to `owner`) granted to members of
        `owner`'s group? One native decode per member tried, the last granter first: the ids a worker
        releases all come from its scheduler."""
        group = self.group_of.get(owner, 0)
        if not group:
            return False
        members = self.members[group]
        n = len(ids) // 8
        left = foreign
        for i, member in enumerate(members):
            if member == owner:
                continue
            left -= n - codec.decode_many(ids, member)[1]
            if left <= 0:
                if i:
                    members.insert(0, members.pop(i))  # the granter first next time
                return left == 0
        return False
