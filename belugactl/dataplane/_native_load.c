/* The one-call load (load_blocks_checked): a vLLM worker's CPU pool hit copied out of the pool,
 * each block's CRC32C compared with its writer's, and the load's lease release sent without
 * waiting, all in one native call with no Python between the copy and the release. It uses the
 * CRC copy of _native_crc.c (check_gather, copy_blocks_crc) and the no-wait release of
 * _native_messages.c (release_nowait_*). */
#include "_native.h"

/* load_blocks_checked(pool, tensors, template, blocks, expected, nontemporal=False, release=None, deadline=0.0)
 *   -> (bad, release_result, release_ns)
 * A pool hit's load in one call: gather_blocks_crc32c pool -> tensors, each block's CRC compared
 * with `expected` (int64 per block, -1: not known) and the indices of the blocks that differ
 * returned in `bad`; then, with `release` (rpc_release_nowait's arguments as a tuple), the load's
 * lease release sent while CLOCK_MONOTONIC (Python's time.monotonic) is still before
 * `deadline`, the time until which the leases are certainly live. release_result is what
 * rpc_release_nowait returns, or None when nothing was asked or the copy ended too late (then the
 * caller releases the usual way and learns how many leases were still live). release_ns: the
 * release's own time.
 * Why one call: after a large copy each first touch of a Python function or object is a cache
 * miss; a CRC list compared in Python and the release's layers of calls were most of the hit's
 * connector time after its copy. The release's arguments
 * are parsed and checked before any byte moves, so a bad one raises with nothing copied. */
PyObject *py_load_blocks_checked(PyObject *self, PyObject *args) {
    Py_buffer pool, ten, tv, bv, ev; int nt = 0; PyObject *rel = Py_None; double deadline = 0.0;
    if (!PyArg_ParseTuple(args, "w*w*y*y*y*|pOd", &pool, &ten, &tv, &bv, &ev, &nt, &rel, &deadline)) return NULL;
    PyObject *out = NULL, *bad = NULL, *rr = NULL;
    uint32_t *crcs = NULL;
    struct nowait_release pr;
    int have_pr = 0, state = 0, tried = 0;
    Py_ssize_t nseg, nblk, sent = 0;
    long long rel_ns = 0;
    memset(&pr, 0, sizeof pr);
    if (check_gather(&pool, &ten, &tv, &bv, &nseg, &nblk) < 0) goto done;
    if (ev.len != nblk * 8) {
        PyErr_SetString(PyExc_ValueError, "load_blocks_checked: expected holds one int64 CRC (or -1) per block");
        goto done;
    }
    if (rel != Py_None) {
        if (!PyTuple_Check(rel)) { PyErr_SetString(PyExc_TypeError, "load_blocks_checked: release must be a tuple"); goto done; }
        have_pr = 1;
        if (release_nowait_parse(rel, &pr) < 0) goto done;
    }
    crcs = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(nblk ? nblk : 1));
    if (!crcs) { PyErr_NoMemory(); goto done; }
    crc_init();
    Py_BEGIN_ALLOW_THREADS
    copy_blocks_crc(&pool, &ten, (const int64_t *)tv.buf, nseg, (const int64_t *)bv.buf, nblk, 0, nt, crcs);
    if (have_pr) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if ((double)t0.tv_sec + (double)t0.tv_nsec * 1e-9 < deadline) {
            state = release_nowait_send(&pr, &sent);
            tried = 1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            rel_ns = (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
        }
    }
    Py_END_ALLOW_THREADS
    bad = PyList_New(0);
    if (!bad) goto done;
    const int64_t *want = (const int64_t *)ev.buf;
    for (Py_ssize_t i = 0; i < nblk; i++) {
        if (want[i] < 0 || (uint64_t)want[i] == (uint64_t)crcs[i]) continue;
        PyObject *x = PyLong_FromSsize_t(i);
        if (!x || PyList_Append(bad, x) < 0) { Py_XDECREF(x); goto done; }
        Py_DECREF(x);
    }
    if (tried) {
        rr = release_nowait_result(&pr, state, sent);
        if (!rr) goto done;
    } else {
        rr = Py_None; Py_INCREF(rr);
    }
    out = Py_BuildValue("(OOL)", bad, rr, rel_ns);
done:
    free(crcs);
    Py_XDECREF(bad); Py_XDECREF(rr);
    if (have_pr) release_nowait_free(&pr);
    PyBuffer_Release(&pool); PyBuffer_Release(&ten); PyBuffer_Release(&tv); PyBuffer_Release(&bv); PyBuffer_Release(&ev);
    return out;
}
