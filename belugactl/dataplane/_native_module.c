/*
 * belugactl.dataplane._native: the few instructions Python cannot issue.
 *
 * CXL 2.0 gives no coherence between hosts, so software publishes data by writing it with
 * non-temporal stores (or flushing the lines it wrote) and fencing before it flips a status
 * word, and consumes it by flushing the lines before loading them. This module provides exactly
 * that, plus 64-bit atomics on mapped memory, bounded spin-waits on a status word, and a
 * gather/scatter copy of many pieces in one call.
 *
 * The sources, by concern: _native_copy.c (flushes, non-temporal and gather copies),
 * _native_atomics.c (64-bit atomics and waits), _native_ring.c (the CXL-RPC ring's mechanics:
 * slots, sequences, waiting), _native_messages.c (what the ring calls encode and decode:
 * GET_MANY, the no-wait RELEASE, lease ids), _native_fastpath.c (the server's lookup mirror and
 * fast path), _native_crc.c (CRC32C, and copies that compute it as they go), _native_load.c (the
 * one-call load: copy, CRC check and lease release), _native_journal.c (the journal's replay and
 * start-up copy at a restart), _native_bench.c (the pool's speed: pointer
 * chase, read and non-temporal write); _native_wire.h is generated from
 * rpc/protocol.py.
 *
 * Every function takes a Python buffer (an mmap, a memoryview, a bytearray) and byte offsets,
 * and bounds-checks them: a bad offset raises ValueError, it never touches memory outside the
 * buffer. Long operations release the GIL.
 */
#include "_native.h"

int have_clflushopt = 0;
int have_clwb = 0;
int have_sse2 = 0;
int have_avx2 = 0;
int have_clflush = 0;
/* The non-temporal copy's kernel: AVX2 where cpuid has it, unless BELUGACTL_NATIVE_AVX2=0 (tests
 * of the SSE2 kernel on an AVX2 machine). */
int nt_avx2 = 0;

static void detect_cpu(void) {
#if BELUGA_X86
    unsigned int a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        have_clflush = (d >> 19) & 1;
        have_sse2 = (d >> 26) & 1;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        have_avx2 = (b >> 5) & 1;
        have_clflushopt = (b >> 23) & 1;
        have_clwb = (b >> 24) & 1;
    }
#endif
}

static PyObject *py_features(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:s,s:s}",
        "x86", BELUGA_X86 ? Py_True : Py_False,
        "clflush", have_clflush ? Py_True : Py_False,
        "clflushopt", have_clflushopt ? Py_True : Py_False,
        "clwb", have_clwb ? Py_True : Py_False,
        "sse2", have_sse2 ? Py_True : Py_False,
        "avx2", have_avx2 ? Py_True : Py_False,
        "flush", !BELUGA_X86 ? "none" : have_clwb ? "clwb" : have_clflushopt ? "clflushopt" : have_clflush ? "clflush" : "none",
        "nt_copy", !BELUGA_X86 ? "memcpy" : nt_avx2 ? "avx2" : "sse2");
}

static PyMethodDef methods[] = {
    {"features", py_features, METH_NOARGS, "CPU features detected with cpuid, and the flush instruction in use."},
    {"flush", py_flush, METH_VARARGS, "flush(buf, off, n, for_read=False): write back/evict the lines of a range, then mfence."},
    {"fence", py_fence, METH_NOARGS, "mfence."},
    {"copy", py_copy, METH_VARARGS, "copy(dst, dst_off, src, src_off, n, nontemporal=False)."},
    {"gather", py_gather, METH_VARARGS, "gather(dst, src, pieces_int64_triples, nontemporal=False) -> bytes copied."},
    {"gather_blocks", py_gather_blocks, METH_VARARGS, "gather_blocks(pool, tensors, template_triples, block_pairs, save, nontemporal) -> bytes copied."},
    {"load64", py_load64, METH_VARARGS, "load64(buf, off) -> int (acquire)."},
    {"store64", py_store64, METH_VARARGS, "store64(buf, off, value, flush=False) (release; optional line flush + fence)."},
    {"cas64", py_cas64, METH_VARARGS, "cas64(buf, off, expected, desired) -> value seen (== expected on success)."},
    {"fetch_add64", py_fetch_add64, METH_VARARGS, "fetch_add64(buf, off, add) -> old value."},
    {"wait64", py_wait64, METH_VARARGS, "wait64(buf, off, value, timeout_ns, flush=False) -> last value seen."},
    {"idle_wait_any", py_idle_wait_any, METH_VARARGS, "idle_wait_any(buf, offsets_int64, value, timeout_ns, sleep_ns, flush=False, fd=-1) -> index, -1 (timeout) or -2 (fd readable)."},
    {"wait_any", py_wait_any, METH_VARARGS, "wait_any(buf, offsets_int64, value, timeout_ns, flush=False) -> index or -1."},
    {"rpc_send", py_rpc_send, METH_VARARGS, "rpc_send(buf, off, seq, epoch, op, payload, flush=False): write a request, publish REQ_READY."},
    {"rpc_wait_reply", py_rpc_wait_reply, METH_VARARGS, "rpc_wait_reply(buf, off, seq, max_payload, timeout_ns, flush=False) -> (code, epoch, payload) | None."},
    {"rpc_take", py_rpc_take, METH_VARARGS, "rpc_take(buf, offsets, start, max_payload, timeout_ns, flush=False) -> (i, seq, magic, epoch, op, length, payload|None) | None."},
    {"rpc_reply", py_rpc_reply, METH_VARARGS, "rpc_reply(buf, off, seq, epoch, op, code, payload, flush=False): write a reply, publish RESP_READY."},
    {"rpc_call", py_rpc_call, METH_VARARGS, "rpc_call(...): a client's whole QD1 round trip; see the source."},
    {"rpc_call_many", py_rpc_call_many, METH_VARARGS, "rpc_call_many(...): a client's pipelined burst, replies in order; see the source."},
    {"lease_decode_many", py_lease_decode_many, METH_VARARGS, "lease_decode_many(keys16, ids, owner) -> ([seq, ...], foreign)."},
    {"rpc_get_many", py_rpc_get_many, METH_VARARGS, "rpc_get_many(...): a GET_MANY lookup encoded, sent and decoded in one call; see the source."},
    {"get_many_decode", py_get_many_decode, METH_VARARGS, "get_many_decode(reply) -> [(extents, lease, nbytes, checksum) | None, ...]."},
    {"bell_register", py_bell_register, METH_VARARGS, "bell_register(buf, ring_off, ring_len, bell_off) -> handle | -1: a request published in that ring bumps that doorbell byte."},
    {"bell_unregister", py_bell_unregister, METH_VARARGS, "bell_unregister(handle): the ring rings nothing any more."},
    {"bells_new", py_bells_new, METH_VARARGS, "bells_new(ring_count, bell_off, sweep_ns) -> state: a server's doorbell state (every ring pending once)."},
    {"bells_take", py_bells_take, METH_VARARGS, "bells_take(buf, offs, state, max_payload, timeout_ns, flush=False) -> as rpc_take, led by the doorbells."},
    {"bells_wait", py_bells_wait, METH_VARARGS, "bells_wait(buf, offs, state, timeout_ns, sleep_ns, flush=False, fd=-1) -> index, -1 or -2: idle_wait_any led by the doorbells."},
    {"bells_stats", py_bells_stats, METH_VARARGS, "bells_stats(state) -> {polls, rung, swept, looks, found, pending}."},
    {"bells_pend_all", py_bells_pend_all, METH_VARARGS, "bells_pend_all(state, ring=-1): every ring (or that one) looked at once more."},
    {"rpc_burst", py_rpc_burst, METH_VARARGS, "rpc_burst(...): C load generator for bench rpc; see the source."},
    {"lease_encode", py_lease_encode, METH_VARARGS, "lease_encode(keys16, seq, owner) -> lease id (the fast path's)."},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(buf, off=0, n=-1, crc=0) -> CRC32C of buf[off:off+n], chained from crc."},
    {"copy_crc32c", py_copy_crc32c, METH_VARARGS, "copy_crc32c(dst, doff, src, soff, n, crc=0, nontemporal=False) -> CRC32C of the bytes copied."},
    {"gather_blocks_crc32c", py_gather_blocks_crc32c, METH_VARARGS, "gather_blocks_crc32c(pool, tensors, template, blocks, save, nontemporal=False) -> [CRC32C per block]."},
    {"load_blocks_checked", py_load_blocks_checked, METH_VARARGS, "load_blocks_checked(pool, tensors, template, blocks, expected, nontemporal=False, release=None, deadline=0.0) -> (bad block indices, rpc_release_nowait result | None, release ns): a load, its CRC check and its no-wait lease release in one call (the one-call load)."},
    {"crc32c_kernel", py_crc32c_kernel, METH_NOARGS, "The CRC32C kernel in use: sse4.2-3way or table."},
    {"sharded_put", py_sharded_put, METH_VARARGS, "sharded_put(dicts, table, keys, values, keep_first) -> values stored | None: many puts into a ShardedMap (_native_sharded.c)."},
    {"fi_new", py_fi_new, METH_NOARGS, "fi_new() -> a C mirror of the index's visible keys."},
    {"fi_put", py_fi_put, METH_VARARGS, "fi_put(fi, ns, key, entry_id) -> False if the key is too long to mirror."},
    {"fi_put_entries", py_fi_put_entries, METH_VARARGS, "fi_put_entries(fi, entries, get_reply, pack_one) -> keys put: the index's entries mirrored in one call (_native_fastpath.c)."},
    {"fi_reply", py_fi_reply, METH_VARARGS, "fi_reply(fi, ns, key) -> the GET reply mirrored for the key (b\"\" for none), or None when it is not mirrored."},
    {"fi_del", py_fi_del, METH_VARARGS, "fi_del(fi, ns, key) -> whether it was there."},
    {"fi_len", py_fi_len, METH_O, "fi_len(fi) -> keys mirrored."},
    {"fi_id", py_fi_id, METH_VARARGS, "fi_id(fi, ns, key) -> the mirrored entry id, or -1."},
    {"fi_hash", py_fi_hash, METH_VARARGS, "fi_hash(ns, key) -> the mirror table's hash of the key."},
    {"fi_shape", py_fi_shape, METH_O, "fi_shape(fi) -> (slots, keys, tombstones, old slots, moved, entries)."},
    {"fi_set_room", py_fi_set_room, METH_VARARGS, "fi_set_room(fi, room, ring_slot): the lease room the fast path takes from."},
    {"rpc_get_many_start", py_rpc_get_many_start, METH_VARARGS, "rpc_get_many_start(buf, offsets, seq0, epoch32, ns, keys, per_message, max_payload, window, flush) -> messages | (-2, sent) | None: a GET_MANY lookup sent, replies left in flight."},
    {"rpc_get_many_finish", py_rpc_get_many_finish, METH_VARARGS, "rpc_get_many_finish(buf, offsets, seq0, nkeys, per_message, max_payload, timeout_ns, flush) -> as rpc_get_many: the replies of rpc_get_many_start's burst."},
    {"rpc_release_nowait", py_rpc_release_nowait, METH_VARARGS, "rpc_release_nowait(buf, offsets, seq0, epoch32, lease_ids, flags, per_message, max_payload, flush) -> [ids per message] | (-2, [...]): RELEASE messages sent without waiting."},
    {"fast_serve", py_fast_serve, METH_VARARGS, "fast_serve(...): answer LOOKUP_PREFIX/PING from the rings in C; see the source."},
    {"journal_replay", py_journal_replay, METH_VARARGS, "journal_replay(buf, base, size, seed, flush, scan_flush, chunk) -> the live set of a journal half (_native_journal.c)."},
    {"journal_copy", py_journal_copy, METH_VARARGS, "journal_copy(buf, src_base, src_size, spans, dst_base, room, seed, flush) -> bytes written, or -1 when they do not fit."},
    {"alloc_restore_chunks", py_alloc_restore_chunks, METH_VARARGS, "alloc_restore_chunks(one, state, cls, base, start, end, chunk, ways, zone_size, zone_used) -> (restored, rest, used, requested): the whole-chunk records of a restore (_native_restore.c)."},
    {"make_entries", py_make_entries, METH_VARARGS, "make_entries(cls, ns_names, ns_of, keys, allocs, checksums, first_id, first_slot) -> a restore's index entries (_native_restore.c)."},
    {"bench_chase", py_bench_chase, METH_VARARGS, "bench_chase(buf, off, n, steps, seed=1) -> ns per dependent load (_native_bench.c)."},
    {"bench_read", py_bench_read, METH_VARARGS, "bench_read(buf, off, n, flush=False) -> ns for one pass of loads (invalidated first with flush)."},
    {"bench_write_nt", py_bench_write_nt, METH_VARARGS, "bench_write_nt(buf, off, n) -> ns for one pass of non-temporal stores and a fence."},
#ifdef BELUGA_COUNT_FLUSHES
    {"count_reset", py_count_reset, METH_NOARGS, "count_reset(): forget the recorded flushes (counting build)."},
    {"count_records", py_count_records, METH_VARARGS, "count_records(buf) -> [(kind, off, len, repeats)] meeting buf (counting build; _native_count.c)."},
    {"count_lost", py_count_lost, METH_NOARGS, "count_lost() -> records dropped because the buffer was full (counting build)."},
#endif
    {NULL, NULL, 0, NULL},
};

/* The counting build is the same code under another name (setup.py, _native_count.c). */
#ifdef BELUGA_COUNT_FLUSHES
#define MODULE_NAME "_native_counting"
#define MODULE_INIT PyInit__native_counting
#else
#define MODULE_NAME "_native"
#define MODULE_INIT PyInit__native
#endif

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, MODULE_NAME, "Coherence helpers for a CXL pool.", -1, methods};

PyMODINIT_FUNC MODULE_INIT(void) {
    detect_cpu();
    const char *avx2_env = getenv("BELUGACTL_NATIVE_AVX2");
    nt_avx2 = have_avx2 && !(avx2_env && strcmp(avx2_env, "0") == 0);
    crc_init();
    PyObject *m = PyModule_Create(&module);
    /* fast_serve takes the doorbell state as its last argument (mds/listener_cxl.py looks for this) */
    if (m != NULL && PyModule_AddIntConstant(m, "FAST_SERVE_BELLS", 1) < 0) { Py_DECREF(m); return NULL; }
    return m;
}
