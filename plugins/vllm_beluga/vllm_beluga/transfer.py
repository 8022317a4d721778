"""Moving blocks between the paged KV tensors and the pool, with the metadata server's bookkeeping.

Free of vLLM on purpose: the worker side of the connector delegates here, and tests drive it with
real tensors-in-memory, a real pool and a real metadata server.

load: look each key up (the lookup grants a read lease, so the block cannot be evicted or
overwritten while we copy), copy all found blocks in one batch, release the leases. A block that is
gone, or a copy that fails, is returned as failed: vLLM recomputes it, it is never served wrong.
save: reserve extents for every block in one burst (RESERVE_MANY), copy the batch, commit it in one
burst (COMMIT_MANY); a block already present (another instance saved it first), a full pool or an
unreachable server skip the save and count it.

Checksums (docs/dataplane.md, "Checksums"): each save commits the CRC32C of the block's bytes, and
each load checks it, because a writer that stalled past its deadline can still overwrite extents
that were reclaimed and handed to the block being loaded. A mismatch is a load error (recomputed),
counted as `load_checksum_mismatch`, and the key is deleted so later readers miss instead.
- CPU tensors: the checksum is computed in the copy itself (`gather_blocks_crc32c`: each word is
  checksummed as it moves), on save of the bytes stored and on load of the bytes that landed in the
  tensors. Blocks split over several extents, and non-coherent (flush) pools, go through the
  engine and are checksummed in the pool right after the copy, as for CUDA.
- CUDA tensors: the CPU cannot see the bytes in flight, so the checksum is of the pool's bytes once
  the copy has completed: on save before the commit, on load before the block is accepted. The
  load check is sound because an overwrite that changed bytes we copied leaves them changed in
  the pool, where the check after the copy sees them; one after the check cannot change what was
  copied. The save check leaves a window (between the copy and the checksum) that only the
  writer's own fence (its deadline) covers.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from belugactl.dataplane.rpc.protocol import LocationTuple
from vllm_beluga.index_client import BestEffortIndex
from vllm_beluga.stats import ConnectorStats

log = logging.getLogger("vllm.beluga")


@functools.cache
def monotonic_clock_id() -> str:
    """Which CLOCK_MONOTONIC this process reads: the kernel's boot id and its time namespace. Two
    processes with the same id read the same clock, so a deadline one took from time.monotonic()
    means the same instant to the other (the vLLM scheduler hands lease deadlines to its workers,
    which may be on another host); "" when it cannot be told (no deadline is trusted then)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return ""
    try:
        ns = os.stat("/proc/self/ns/time").st_ino  # a time namespace can offset the monotonic clock
    except OSError:
        ns = 0  # a kernel without time namespaces: one monotonic clock per boot
    return f"{boot}/{ns}" if boot else ""


def locate_many(index: BestEffortIndex, namespace: str, keys: Sequence[bytes]) -> list[LocationTuple | None]:
    """Where each committed block is, with a read lease on it (None: absent, or the server is away),
    in one GET_MANY burst (as few round trips as the transport allows); keys of mixed lengths (never
    the connector's) go one by one. The client's tuples are used as they come: no object or int()
    per block."""
    if len({len(k) for k in keys}) > 1:
        return [index.get_many_tuples(namespace, [key])[0] for key in keys]
    return index.get_many_tuples(namespace, keys)


@dataclass
class LoadBatch:
    """A load between its lookup and its check: what to copy, and what to release afterwards."""

    leases: list[int]
    granted_elsewhere: bool  # the scheduler's leases, passed to this worker
    failed: list[int] = field(default_factory=list)
    # Leases the scheduler took on blocks this load does not copy (found beyond what vLLM allocated,
    # or the block holding the last token): handed back in the same burst as the load's own.
    spare: list[int] = field(default_factory=list)
    blocks: list[tuple[int, list[tuple[int, int]]]] = field(default_factory=list)
    checksums: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    # Until when (this process's time.monotonic) every lease above is certainly live: a copy that
    # ended before it trusts its bytes without RELEASE's live count, and sends the release without
    # waiting for its reply. None: unknown (an older server, or a deadline from another clock).
    trusted_until: float | None = None
    # leases + spare, non-zero, packed as uint64 when the batch is made: the release after the copy
    # then touches one small buffer instead of a Python int per lease (each out of the CPU caches by then).
    release_ids: array | None = None
    # Each copied block's expected CRC32C as int64, for the one-call load's check.
    expected: array | None = None


def _checksum_of(location: Sequence[Any]) -> int | None:
    return location[3] if len(location) > 3 else None


class PoolTransfer:
    def __init__(self, index: BestEffortIndex, engine: Any, namespace: str, stats: ConnectorStats) -> None:
        self.index = index
        self.engine = engine  # KVCopyEngine (CPU) or CudaKVCopyEngine; None: no pool mapped
        self.namespace = namespace
        self.stats = stats
        # One client speaks for this process on its ring (or socket): loads on the forward path and
        # saves on the background thread take turns on it, a whole burst at a time.
        self.index_lock = threading.RLock()

    def load(
        self,
        block_ids: Sequence[int],
        keys: Sequence[bytes],
        locations: Sequence[LocationTuple | None] | None = None,
        spare: Sequence[int] = (),
        trusted_until: float | None = None,
        clock: str = "",
    ) -> list[int]:
        """Fill `block_ids` from the pool blocks under `keys`; returns the block ids NOT loaded.

        `locations` (extents, lease id, nbytes) per key, when the scheduler looked them up already
        (holding their leases); else each key is looked up here. Block ids without a key are failed.
        `spare`: more of the scheduler's leases, released with the load's own. `trusted_until`:
        until when the scheduler's leases are certainly live, on the monotonic clock `clock`
        (monotonic_clock_id) it read.
        """
        batch = self.prepare_load(block_ids, keys, locations, spare, trusted_until, clock)
        if batch is None:
            return list(block_ids)
        not_loaded = self._load_one_call(batch)
        if not_loaded is not None:
            return not_loaded
        started = time.perf_counter()
        crcs: list[int | None] | None = None
        error: Exception | None = None
        try:
            if batch.blocks:
                crcs = list(self.copy(batch.blocks, save=False))
        except Exception as exc:  # noqa: BLE001 - a bad extent must cost a recompute, never a wrong answer
            error = exc
        return self.finish_load(batch, crcs, error, started)

    def _load_one_call(self, batch: LoadBatch) -> list[int] | None:
        """A CPU load in one native call (`load_blocks_checked`): the copy, its checksum check and,
        while the scheduler's leases are certainly live, their release sent right after the copy,
        with no Python between (after a copy every function or object touched first is out of the
        CPU caches, and each such touch is slow). Returns the block ids not loaded, as `load` does;
        None when this batch cannot go that way (no native helper, another engine, a flushed pool,
        a block split over extents): then the copy and the release run as separate steps.

        The index lock is held across the copy so that no save burst takes the ring's next
        sequence between the release being made ready and sent: a save waits at most one copy."""
        from belugactl.dataplane import native
        from belugactl.dataplane.kvcopy import KVCopyEngine

        load_checked = native.load_blocks_checked
        engine = self.engine
        if load_checked is None or not batch.blocks:
            return None
        if not isinstance(engine, KVCopyEngine) or engine.coherence == "flush":
            return None
        try:
            pairs = engine.block_pairs(batch.blocks)
        except ValueError:
            return None  # the separate copy raises it again, and the batch is recomputed
        if pairs is None:
            return None
        started = time.perf_counter()
        nontemporal = engine.nontemporal_for(batch.blocks)
        with self.index_lock:
            deadline = batch.trusted_until
            release = None
            if deadline is not None and batch.release_ids is not None and len(batch.release_ids):
                release = self.index.release_with_copy(batch.release_ids, granted_elsewhere=batch.granted_elsewhere)
            release_s = time.perf_counter() - started
            try:
                bad, result, release_ns = load_checked(
                    engine.pool, engine.tensors, engine.template, pairs, batch.expected, nontemporal,
                    None if release is None else release.args, deadline or 0.0,
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - checked before any byte moved: nothing copied or sent
                if release is not None:
                    release.done(None)  # gives back what it booked: the ring goes on in step
                return self.finish_load(batch, None, exc, started)
            copied = time.perf_counter()
            sent = release is not None and release.done(result)
            release_s += time.perf_counter() - copied + release_ns / 1e9
        return self.finish_load(batch, None, None, started, bad=bad, released=sent, release_s=release_s)

    def prepare_load(
        self,
        block_ids: Sequence[int],
        keys: Sequence[bytes],
        locations: Sequence[LocationTuple | None] | None = None,
        spare: Sequence[int] = (),
        trusted_until: float | None = None,
        clock: str = "",
    ) -> LoadBatch | None:
        """The metadata half of a load: find the blocks (unless the scheduler did), keep those whose
        size fits these tensors. None when there is nothing to copy into (no pool mapped): every
        block failed, leases released."""
        granted_elsewhere = locations is not None  # the scheduler's leases, passed to us
        if granted_elsewhere and (not clock or clock != monotonic_clock_id()):
            trusted_until = None  # the scheduler read another clock: its deadline means nothing here
        if locations is None:
            with self.index_lock:
                trips, started_meta = self.index.round_trips, time.perf_counter()
                asked = time.monotonic()
                locations = locate_many(self.index, self.namespace, keys)
                trusted_until = self.index.lease_trusted_until(asked)
                self.stats.add("load_metadata_round_trips", self.index.round_trips - trips)
                self.stats.add("load_metadata_us", int((time.perf_counter() - started_meta) * 1e6))
        leases = [loc[1] for loc in locations if loc is not None]
        if self.engine is None:
            with self.index_lock:
                self.index.release([*leases, *spare], granted_elsewhere=granted_elsewhere)
            self.stats.add("load_errors", len(block_ids))
            return None
        batch = LoadBatch(
            leases=leases,
            granted_elsewhere=granted_elsewhere,
            failed=list(block_ids[len(locations) :]),
            spare=list(spare),
            trusted_until=trusted_until,
        )
        need = self.engine.layout.block_nbytes
        for block_id, key, location in zip(block_ids, keys, locations, strict=False):
            if location is None or int(location[2]) != need or _checksum_of(location) is None:
                # Gone, the same key in another layout (never copy bytes that do not fit these
                # tensors), or no checksum to verify it by (every commit carries one: not trusted).
                batch.failed.append(block_id)
                continue
            batch.blocks.append((block_id, location[0]))
            batch.checksums.append(int(location[3]))
            batch.keys.append(key)
        batch.release_ids = array("Q", [x for x in (*leases, *batch.spare) if x])
        batch.expected = array("q", batch.checksums)  # every one known: checked just above
        return batch

    def finish_load(
        self,
        batch: LoadBatch,
        crcs: Sequence[int | None] | None,
        error: Exception | None,
        started: float,
        *,
        bad: Sequence[int] | None = None,
        released: bool = False,
        release_s: float = 0.0,
    ) -> list[int]:
        """The checking half of a load, once its copy ended: compare checksums, release the leases,
        count. `crcs` per copied block (None: the copy did not complete, `error` says why), or
        `bad`: the indices of the blocks whose checksum differed, compared already (the one-call
        load). `released`: the leases were released already, in `release_s` seconds.
        Returns the block ids NOT loaded."""
        failed = batch.failed
        blocks = batch.blocks
        need = self.engine.layout.block_nbytes if self.engine is not None else 0
        if error is not None or (blocks and crcs is None and bad is None):
            log.warning("Beluga: loading %d blocks failed: %s", len(blocks), error)
            failed.extend(b for b, _ in blocks if b not in failed)
            blocks = []
        elif blocks:
            if bad is None:  # not compared in the copy call: compare here
                bad = [i for i, (want, got) in enumerate(zip(batch.checksums, crcs, strict=True)) if want != got]
            if bad:
                # Overwritten after its commit (a stalled writer): recompute, and drop the key so
                # later readers miss instead of finding the same bad bytes.
                log.warning("Beluga: %d blocks failed their checksum: recomputed, keys deleted", len(bad))
                self.stats.add("load_checksum_mismatch", len(bad))
                with self.index_lock:
                    for i in sorted(bad):
                        failed.append(blocks[i][0])
                        self.index.delete(self.namespace, batch.keys[i])
                gone = set(bad)
                blocks = [b for i, b in enumerate(blocks) if i not in gone]
            self.stats.add("loaded_blocks", len(blocks))
            self.stats.add("loaded_bytes", len(blocks) * need)
        live = None
        if released:
            self.stats.add("load_releases_posted")
        else:
            releasing = time.perf_counter()
            live = self._release(batch)
            release_s += time.perf_counter() - releasing
        self.stats.add("load_release_us", int(release_s * 1e6))
        if live is not None and live < len([x for x in batch.leases if x]) and blocks:
            # A lease ended before we released it: its block may have been evicted and its extents
            # written by someone else while we copied. Recompute the batch rather than trust it.
            expired = len(batch.leases) - live
            log.warning("Beluga: %d leases expired during a load: %d blocks recomputed", expired, len(blocks))
            self.stats.add("leases_expired_in_load", expired)
            failed.extend(b for b, _ in blocks if b not in failed)
        self.stats.add("load_us", int((time.perf_counter() - started) * 1e6))
        if failed:
            log.warning("Beluga: %d blocks not loaded (gone from the pool, or a failed copy): recomputed", len(failed))
            self.stats.add("load_errors", len(failed))
        return failed

    def _release(self, batch: LoadBatch) -> int | None:
        """Hand the load's leases back; how many of its own were still live (None: not asked).

        The count matters only if a lease may have ended during the copy. A copy that ended while
        its leases were certainly live (`trusted_until`, from the TTL the server announced) sends
        its release and does not wait for the reply: the wait was a round trip on the critical path
        of every pool hit, against a server the forward pass leaves little CPU to."""
        with self.index_lock:
            trusted = batch.trusted_until is not None and time.monotonic() < batch.trusted_until
            ids = batch.release_ids if batch.release_ids is not None else [*batch.leases, *batch.spare]
            if trusted and self.index.release_nowait(ids, granted_elsewhere=batch.granted_elsewhere):
                self.stats.add("load_releases_posted")
                return None
            if batch.spare:
                groups = [batch.leases, batch.spare]
                counts = self.index.release_groups(groups, granted_elsewhere=batch.granted_elsewhere)
                return None if counts is None else counts[0]
            return self.index.release(batch.leases, granted_elsewhere=batch.granted_elsewhere)

    def pool_checksums(self, blocks: Sequence[tuple[int, Sequence[tuple[int, int]]]]) -> list[int]:
        """Each block's CRC32C over its pool bytes (after a copy that could not checksum in flight)."""
        from belugactl.dataplane import native

        need = self.engine.layout.block_nbytes
        return [native.extents_crc32c(self.engine.pool, list(extents), need) for _, extents in blocks]

    def save(self, block_ids: Sequence[int], keys: Sequence[bytes]) -> int:
        """Store the blocks under their keys; returns how many were committed.

        Two metadata bursts whatever the block count: one RESERVE_MANY burst for every key, one
        COMMIT_MANY burst committing what was copied (and aborting what was not). Counted per save
        as `save_requests`, `save_metadata_round_trips`, `save_metadata_messages`, `save_metadata_us`.
        """
        if self.engine is None:
            return 0
        started = time.perf_counter()
        index = self.index
        nbytes = self.engine.layout.block_nbytes
        # Round trips are counted inside the lock: a load on another thread may use the index between
        # this save's two bursts, and its trips are not this save's.
        with self.index_lock:
            trips, messages = index.round_trips, index.messages
            results = index.reserve_many(self.namespace, keys, nbytes)
            trips, messages = index.round_trips - trips, index.messages - messages
        meta_s = time.perf_counter() - started
        reserved = [
            (r, block_id, [(int(o), int(n)) for o, n in r.extents])
            for block_id, r in zip(block_ids, results, strict=True)
            if r is not None
        ]
        # Fencing: write only into reservations whose deadline has not passed under the same epoch;
        # the others may belong to someone else by now (docs/dataplane.md, "Fencing").
        writable = [index.writable(r) for r, _, _ in reserved]
        fresh = [x for x, ok in zip(reserved, writable, strict=True) if ok]
        aborts = [r.token for (r, _, _), ok in zip(reserved, writable, strict=True) if not ok]
        if aborts:
            self.stats.add("save_skipped_fenced", len(aborts))
        commits: list[tuple[Any, int]] = []
        if fresh:
            try:
                crcs = self.copy([(block_id, extents) for _, block_id, extents in fresh], save=True)
            except Exception as exc:  # noqa: BLE001
                log.warning("Beluga: saving %d blocks failed: %s", len(fresh), exc)
                aborts.extend(r.token for r, _, _ in fresh)
                self.stats.add("save_errors", len(fresh))
            else:
                commits = [(r.token, crc) for (r, _, _), crc in zip(fresh, crcs, strict=True)]
        committed = 0
        if commits or aborts:
            t = time.perf_counter()
            with self.index_lock:
                before = index.round_trips, index.messages
                committed = sum(index.finish_many(commits, aborts))
                trips += index.round_trips - before[0]
                messages += index.messages - before[1]
            meta_s += time.perf_counter() - t
        if commits:
            self.stats.add("saved_blocks", committed)
            self.stats.add("saved_bytes", committed * nbytes)
        self.stats.add("save_requests")
        self.stats.add("save_metadata_round_trips", trips)
        self.stats.add("save_metadata_messages", messages)
        self.stats.add("save_metadata_us", int(meta_s * 1e6))
        self.stats.add("save_us", int((time.perf_counter() - started) * 1e6))
        return committed

    def copy(self, blocks: list[tuple[int, list[tuple[int, int]]]], *, save: bool) -> list[int]:
        """Copy a batch (save: tensors -> pool, else back) and return each block's CRC32C (see the
        module's "Checksums"): computed in the copy for CPU tensors in whole extents, else computed
        over the pool bytes once the copy has completed."""
        from belugactl.dataplane import native
        from belugactl.dataplane.kvcopy import KVCopyEngine

        engine = self.engine
        if isinstance(engine, KVCopyEngine) and engine.coherence != "flush":
            pairs = engine.block_pairs(blocks)
            if pairs is not None:
                return native.gather_blocks_crc32c(
                    engine.pool,
                    engine.tensors,
                    engine.template,
                    pairs,
                    save=save,
                    nontemporal=save and engine.nontemporal_for(blocks),
                )
        if save:
            engine.save(blocks)
        else:
            engine.load(blocks)
        need = engine.layout.block_nbytes
        # Engines return after their copy completed (the CUDA one synchronizes its stream).
        return [native.extents_crc32c(engine.pool, extents, need) for _, extents in blocks]
