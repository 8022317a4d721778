/* The CXL-RPC ring's mechanics, for a client and for the server: a request or reply written into
 * its slot and published, a reply waited for and taken, one round trip (rpc_call), a pipelined
 * burst (rpc_call_many; its loop, run_burst, is shared with the message calls of
 * _native_messages.c), and the benchmarks' load generator (rpc_burst). What goes inside a message
 * is _native_messages.c's. rpc/slots.py holds the Python twins of the slot operations. */
#include "_native_ring.h"

/* Wait for a slot's RESP_READY: spin briefly with the GIL held (the common, fast answer), then
 * release the GIL and poll until the deadline, yielding once the wait grows long. Returns the
 * last status seen (ST_RESP, or anything else on timeout). Called with the GIL held. */
static uint64_t wait_for_reply(struct slot_hdr *h, char *slot, int flush, unsigned long long timeout_ns) {
    uint64_t st;
    unsigned spins = 0;
    for (;;) {
        if (flush) { flush_range(slot, 8, 1); full_fence(); }
        st = __atomic_load_n(&h->status, __ATOMIC_ACQUIRE);
        if (st == ST_RESP || ++spins > 2000) break;
        cpu_relax();
    }
    if (st != ST_RESP) {
        Py_BEGIN_ALLOW_THREADS
        st = spin_wait_u64(&h->status, ST_RESP, flush, timeout_ns, spins);  /* status is the slot's first word */
        Py_END_ALLOW_THREADS
    }
    return st;
}

static int get_slot(Py_buffer *v, Py_ssize_t off, Py_ssize_t need, char **out) {
    if (get_range(v, off, need, out) < 0) return -1;
    if (((uintptr_t)*out & 7) != 0) { PyErr_SetString(PyExc_ValueError, "slot is not 8-byte aligned"); return -1; }
    return 0;
}

/* The client's side of a reply, shared by rpc_wait_reply and rpc_call: wait for RESP_READY,
 * check the header belongs to request `seq`, copy out (code, epoch, payload) and free the slot.
 * Returns a new reference: None on timeout, NULL (ValueError set, slot freed) on a malformed reply.
 * `code` is a uint16 field, so it builds the same non-negative int as rpc_call's -1/-2 tuples. */
static PyObject *take_reply(char *slot, uint64_t seq, Py_ssize_t maxp, uint64_t timeout_ns, int flush) {
    struct slot_hdr *h = (struct slot_hdr *)slot;
    if (wait_for_reply(h, slot, flush, timeout_ns) != ST_RESP) Py_RETURN_NONE;
    if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
    if (h->magic != RPC_MAGIC || h->seq != seq || h->length > (uint64_t)maxp) {
        PyErr_Format(PyExc_ValueError, "malformed reply (magic %#x, seq %llu for %llu, length %u)", h->magic,
                     (unsigned long long)h->seq, (unsigned long long)seq, h->length);
        __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
        return NULL;
    }
    PyObject *r = Py_BuildValue("(iIy#)", (int)h->code, (unsigned)h->epoch, slot + HDR, (Py_ssize_t)h->length);
    __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
    if (flush) { flush_range(slot, 8, 0); full_fence(); }
    return r;
}

/* rpc_send(buf, off, seq, epoch, op, payload, flush) */
PyObject *py_rpc_send(PyObject *self, PyObject *args) {
    Py_buffer v, pl; Py_ssize_t off; unsigned long long seq; unsigned int epoch, op; int flush = 0; char *slot;
    if (!PyArg_ParseTuple(args, "w*nKIIy*|p", &v, &off, &seq, &epoch, &op, &pl, &flush)) return NULL;
    PyObject *r = NULL;
    if (get_slot(&v, off, HDR + pl.len, &slot) == 0) {
        publish(slot, seq, epoch, (uint16_t)op, 0, pl.buf, (size_t)pl.len, ST_REQ, flush);
        r = Py_None; Py_INCREF(r);
    }
    PyBuffer_Release(&v); PyBuffer_Release(&pl);
    return r;
}

/* rpc_wait_reply(buf, off, seq, max_payload, timeout_ns, flush) -> (code, epoch, payload) | None */
PyObject *py_rpc_wait_reply(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, maxp; unsigned long long seq, timeout_ns; int flush = 0; char *slot;
    if (!PyArg_ParseTuple(args, "w*nKnK|p", &v, &off, &seq, &maxp, &timeout_ns, &flush)) return NULL;
    PyObject *r = NULL;
    if (maxp < 0 || get_slot(&v, off, HDR + maxp, &slot) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative max_payload");
        goto done;
    }
    r = take_reply(slot, seq, maxp, timeout_ns, flush);
done:
    PyBuffer_Release(&v);
    return r;
}

/* rpc_take(buf, offsets_int64, start, max_payload, timeout_ns, flush)
 *   -> (index, seq, magic, epoch, op, length, payload | None) | None */
PyObject *py_rpc_take(PyObject *self, PyObject *args) {
    Py_buffer v, ov; Py_ssize_t start, maxp; unsigned long long timeout_ns; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*nnK|p", &v, &ov, &start, &maxp, &timeout_ns, &flush)) return NULL;
    PyObject *r = NULL;
    if (ov.len % 8 != 0 || maxp < 0) { PyErr_SetString(PyExc_ValueError, "bad offsets or max_payload"); goto done; }
    Py_ssize_t count = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offs[i] < 0 || offs[i] > v.len - HDR - maxp || (((uintptr_t)v.buf + offs[i]) & 7)) {
            PyErr_Format(PyExc_ValueError, "slot offset %lld is outside the buffer or unaligned", (long long)offs[i]);
            goto done;
        }
    }
    if (count == 0) { r = Py_None; Py_INCREF(r); goto done; }
    if (start < 0 || start >= count) start = 0;
    Py_ssize_t found = -1;
    unsigned spins = 0;
    uint64_t deadline = 0, t0 = 0;
    int released = 0;
    PyThreadState *ts = NULL;
    for (;;) {
        for (Py_ssize_t j = 0; j < count; j++) {
            Py_ssize_t i = start + j; if (i >= count) i -= count;
            char *slot = (char *)v.buf + offs[i];
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) { found = i; break; }
        }
        if (found >= 0) break;
        ++spins;
        if (spins == 256 && !released) { ts = PyEval_SaveThread(); released = 1; t0 = now_ns(); deadline = t0 + timeout_ns; }
        if (released && (spins & 15) == 0) {
            uint64_t t = now_ns();
            if (t >= deadline) break;
            if (t - t0 > SPIN_BEFORE_YIELD_NS) sched_yield();
        }
        if (!released && timeout_ns == 0) break;
        cpu_relax();
    }
    if (released) PyEval_RestoreThread(ts);
    if (found < 0) { r = Py_None; Py_INCREF(r); goto done; }
    char *slot = (char *)v.buf + offs[found];
    if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
    struct slot_hdr h;
    memcpy(&h, slot, sizeof h); /* one snapshot: the client could scribble while we read */
    if (h.length <= (uint64_t)maxp)
        r = Py_BuildValue("(nKIIIIy#)", found, (unsigned long long)h.seq, h.magic, h.epoch, (unsigned)h.op,
                          h.length, slot + HDR, (Py_ssize_t)h.length);
    else
        r = Py_BuildValue("(nKIIIIO)", found, (unsigned long long)h.seq, h.magic, h.epoch, (unsigned)h.op,
                          h.length, Py_None);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_reply(buf, off, seq, epoch, op, code, payload, flush) */
PyObject *py_rpc_reply(PyObject *self, PyObject *args) {
    Py_buffer v, pl; Py_ssize_t off; unsigned long long seq; unsigned int epoch, op, code; int flush = 0; char *slot;
    if (!PyArg_ParseTuple(args, "w*nKIIIy*|p", &v, &off, &seq, &epoch, &op, &code, &pl, &flush)) return NULL;
    PyObject *r = NULL;
    if (get_slot(&v, off, HDR + pl.len, &slot) == 0) {
        publish(slot, seq, epoch, (uint16_t)op, (uint16_t)code, pl.buf, (size_t)pl.len, ST_RESP, flush);
        r = Py_None; Py_INCREF(r);
    }
    PyBuffer_Release(&v); PyBuffer_Release(&pl);
    return r;
}

/* rpc_call(buf, off, seq, epoch32, op, payload, max_payload, timeout_ns, flush, epoch_off, expected_epoch)
 *   -> (code, epoch, payload) | None on timeout
 * The client's whole QD1 round trip in one call. With epoch_off >= 0, first compare the pool
 * header's epoch word with expected_epoch and return code -1 without sending if it moved (the
 * server restarted: fenced). Code -2: the slot is still REQ_READY from an abandoned request. */
PyObject *py_rpc_call(PyObject *self, PyObject *args) {
    Py_buffer v, pl; Py_ssize_t off, maxp, epoch_off; unsigned long long seq, timeout_ns, expected;
    unsigned int epoch32, op; int flush = 0; char *slot;
    if (!PyArg_ParseTuple(args, "w*nKIIy*nKpnK", &v, &off, &seq, &epoch32, &op, &pl, &maxp, &timeout_ns, &flush,
                          &epoch_off, &expected))
        return NULL;
    PyObject *r = NULL;
    if (maxp < 0 || pl.len > maxp) { PyErr_SetString(PyExc_ValueError, "payload larger than the slot"); goto done; }
    if (get_slot(&v, off, HDR + maxp, &slot) < 0) goto done;
    if (epoch_off >= 0) {
        uint64_t *ew;
        if (get_word(&v, epoch_off, &ew) < 0) goto done;
        if (flush) { flush_range((char *)ew, 8, 1); full_fence(); }
        if (__atomic_load_n(ew, __ATOMIC_ACQUIRE) != expected) { r = Py_BuildValue("(iIy#)", -1, 0u, "", (Py_ssize_t)0); goto done; }
    }
    if (__atomic_load_n(&((struct slot_hdr *)slot)->status, __ATOMIC_ACQUIRE) == ST_REQ) {
        r = Py_BuildValue("(iIy#)", -2, 0u, "", (Py_ssize_t)0);
        goto done;
    }
    publish(slot, seq, epoch32, (uint16_t)op, 0, pl.buf, (size_t)pl.len, ST_REQ, flush);
    r = take_reply(slot, seq, maxp, timeout_ns, flush);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&pl);
    return r;
}

/* How rpc_call_many (below) and the message calls waiting on a burst wait: the GIL held for the
 * first CALL_MANY_HELD_NS, then released; past CALL_MANY_SLEEP_AFTER_NS without progress, a sleep
 * of CALL_MANY_SLEEP_NS between looks instead of a spin. */
#define CALL_MANY_HELD_NS 200000ull
#define CALL_MANY_SLEEP_AFTER_NS 300000ull
#define CALL_MANY_SLEEP_NS 20000L

/* The burst loop of rpc_call_many and rpc_get_many: request i (src[i], src_len[i] bytes, each at
 * most maxp) goes out as sequence seq0 + i in slot offs[(seq0 + i) % S], at most `window` in flight;
 * reply i's header lands in hdrs[i] and its payload at out + i * maxp; the first `sent0` requests
 * were sent already (rpc_get_many_start: only their replies are taken). Called with the GIL held; it
 * keeps it for the first CALL_MANY_HELD_NS of waiting and hands it back once for the rest. */
HIDDEN int run_burst(char *base, const int64_t *offs, Py_ssize_t S, uint64_t seq0, uint32_t epoch32, uint16_t op,
                     const char *const *src, const Py_ssize_t *src_len, Py_ssize_t n, Py_ssize_t maxp,
                     Py_ssize_t window, uint64_t timeout_ns, int flush, struct slot_hdr *hdrs, char *out,
                     Py_ssize_t sent0, Py_ssize_t *sent_out, Py_ssize_t *taken_out) {
    Py_ssize_t sent = sent0, taken = 0;
    int state = BURST_OK;
    PyThreadState *ts = NULL;
    uint64_t t0 = now_ns(), last = t0;
    unsigned spins = 0;
    while (taken < n) {
        while (sent < n && sent - taken < window) {
            char *slot = base + offs[(seq0 + (uint64_t)sent) % (uint64_t)S];
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) { state = BURST_SLOT_BUSY; break; }
            publish(slot, seq0 + (uint64_t)sent, epoch32, op, 0, src[sent], (size_t)src_len[sent], ST_REQ, flush);
            sent++;
        }
        if (state) break;
        uint64_t seq = seq0 + (uint64_t)taken;
        char *slot = base + offs[seq % (uint64_t)S];
        struct slot_hdr *h = (struct slot_hdr *)slot;
        if (flush) { flush_range(slot, 8, 1); full_fence(); }
        if (__atomic_load_n(&h->status, __ATOMIC_ACQUIRE) != ST_RESP) {
            if ((++spins & 63) == 0) {
                uint64_t t = now_ns();
                if (t - last > timeout_ns) { state = BURST_TIMEOUT; break; }
                if (ts == NULL && t - t0 > CALL_MANY_HELD_NS) ts = PyEval_SaveThread();
                if (ts != NULL && t - last > CALL_MANY_SLEEP_AFTER_NS) {
                    /* A slow answer: the server is asleep or waits for a core. Sleep between looks
                     * rather than yield-spin, so this client does not take the core it waits on
                     * (or the forward pass's, beside it). */
                    struct timespec pause = {0, CALL_MANY_SLEEP_NS};
                    nanosleep(&pause, NULL);
                } else if (ts != NULL && t - last > SPIN_BEFORE_YIELD_NS) sched_yield();
            }
            cpu_relax();
            continue;
        }
        if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
        memcpy(&hdrs[taken], slot, sizeof hdrs[taken]);
        if (hdrs[taken].magic != RPC_MAGIC || hdrs[taken].seq != seq || hdrs[taken].length > (uint64_t)maxp) {
            state = BURST_MALFORMED;
            __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
            break;
        }
        memcpy(out + (size_t)taken * (size_t)maxp, slot + HDR, hdrs[taken].length);
        __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
        if (flush) { flush_range(slot, 8, 0); full_fence(); }
        taken++;
        last = now_ns();
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    *sent_out = sent; *taken_out = taken;
    return state;
}

/* Checks a ring's slot offsets against the mapping (8-byte aligned, a whole slot inside it). */
HIDDEN int check_ring(Py_buffer *v, Py_buffer *ov, Py_ssize_t maxp, Py_ssize_t window) {
    Py_ssize_t S = ov->len / 8;
    const int64_t *offs = (const int64_t *)ov->buf;
    if (ov->len % 8 != 0 || S == 0 || window < 1 || window > S || maxp < 0) {
        PyErr_SetString(PyExc_ValueError, "bad ring, window or max_payload");
        return -1;
    }
    for (Py_ssize_t i = 0; i < S; i++) {
        if (offs[i] < 0 || offs[i] > v->len - HDR - maxp || (((uintptr_t)v->buf + offs[i]) & 7)) {
            PyErr_Format(PyExc_ValueError, "slot offset %lld is outside the buffer or unaligned", (long long)offs[i]);
            return -1;
        }
    }
    return 0;
}

/* The Python value for a burst that did not complete: None (timeout), (-2, done) (a slot still
 * busy from an abandoned request, nothing from `done` on sent), or NULL with ValueError set. */
HIDDEN PyObject *burst_failure(int state, Py_ssize_t sent, Py_ssize_t taken, struct slot_hdr *hdrs, uint64_t seq0) {
    if (state == BURST_TIMEOUT) Py_RETURN_NONE;
    if (state == BURST_SLOT_BUSY) {
        if (sent == taken) return Py_BuildValue("(in)", -2, sent);
        PyErr_SetString(PyExc_ValueError, "ring slot still busy from an abandoned request in mid-burst");
        return NULL;
    }
    struct slot_hdr *b = &hdrs[taken];
    PyErr_Format(PyExc_ValueError, "malformed reply (magic %#x, seq %llu for %llu, length %u)", b->magic,
                 (unsigned long long)b->seq, (unsigned long long)(seq0 + (uint64_t)taken), b->length);
    return NULL;
}

/* rpc_call_many(buf, slot_offsets_int64[S], seq0, epoch32, op, payloads, max_payload, window, timeout_ns, flush)
 *   -> [(code, epoch, payload), ...] | (-2, done) | None on timeout
 * A client's pipelined burst in one call: request i goes out as sequence seq0 + i in slot
 * (seq0 + i) % S, at most `window` in flight, and the replies come back in order. Why native:
 * a Python loop takes the GIL back after every reply it waited for, and beside a busy thread in the
 * same process (vLLM's engine core: sockets, the load thread) each take can cost milliseconds.
 * Here the GIL is held for a short first spin (a busy-polling server answers a whole burst within
 * it), then released once for the rest and taken back once; past 0.3 ms without progress the wait
 * sleeps 20 us between looks instead of spinning. Replies are copied out of their slots
 * into private memory as they arrive, so a slot is free for the next request at once.
 * (-2, done): the slot for request `done` still held REQ_READY from an abandoned request (nothing
 * from `done` on was sent). A malformed reply raises ValueError. */
PyObject *py_rpc_call_many(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0, timeout_ns; unsigned int epoch32, op; PyObject *seq_obj;
    Py_ssize_t maxp, window; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*KIIOnnKp", &v, &ov, &seq0, &epoch32, &op, &seq_obj, &maxp, &window, &timeout_ns, &flush))
        return NULL;
    PyObject *r = NULL, *items = NULL;
    const char **src = NULL; Py_ssize_t *src_len = NULL;
    char *out = NULL; struct slot_hdr *hdrs = NULL;
    if (check_ring(&v, &ov, maxp, window) < 0) goto done;
    /* A private tuple of the payloads: the caller's list could change while the GIL is released,
     * the bytes objects it holds cannot. */
    items = PySequence_Tuple(seq_obj);
    if (items == NULL) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n == 0) { r = PyList_New(0); goto done; }
    if ((size_t)n > ((size_t)1 << 30) / ((size_t)maxp + 1)) { PyErr_SetString(PyExc_ValueError, "burst too large (over 1 GiB of replies): split it"); goto done; }
    src = PyMem_Malloc(sizeof *src * (size_t)n);
    src_len = PyMem_Malloc(sizeof *src_len * (size_t)n);
    hdrs = PyMem_Malloc(sizeof *hdrs * (size_t)n);
    out = PyMem_Malloc((size_t)n * (size_t)(maxp ? maxp : 1));
    if (!src || !src_len || !hdrs || !out) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *b = PyTuple_GET_ITEM(items, i);
        if (!PyBytes_Check(b)) { PyErr_SetString(PyExc_TypeError, "payloads must be bytes"); goto done; }
        src[i] = PyBytes_AS_STRING(b); src_len[i] = PyBytes_GET_SIZE(b);
        if (src_len[i] > maxp) { PyErr_SetString(PyExc_ValueError, "payload larger than the slot"); goto done; }
    }
    Py_ssize_t sent, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, epoch32, (uint16_t)op, src, src_len,
                          n, maxp, window, timeout_ns, flush, hdrs, out, 0, &sent, &taken);
    if (state) { r = burst_failure(state, sent, taken, hdrs, seq0); goto done; }
    r = PyList_New(n);
    if (r == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = Py_BuildValue("(iIy#)", (int)hdrs[i].code, (unsigned)hdrs[i].epoch, out + (size_t)i * (size_t)maxp,
                                    (Py_ssize_t)hdrs[i].length);
        if (t == NULL) { Py_CLEAR(r); goto done; }
        PyList_SET_ITEM(r, i, t);
    }
done:
    PyMem_Free(src); PyMem_Free(src_len); PyMem_Free(hdrs); PyMem_Free(out);
    Py_XDECREF(items);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_burst(buf, slot_offsets_int64[S], seq_start, epoch32, op, payload, qd, total, timeout_ns, flush)
 *   -> (completed, elapsed_ns)
 * A load generator in C: keeps `qd` requests in flight on one ring until `total` completed, to
 * measure what the server sustains without a Python client in the way (bench rpc). */
PyObject *py_rpc_burst(PyObject *self, PyObject *args) {
    Py_buffer v, ov, pl; unsigned long long seq0, timeout_ns; unsigned int epoch32, op; Py_ssize_t qd, total; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*KIIy*nnKp", &v, &ov, &seq0, &epoch32, &op, &pl, &qd, &total, &timeout_ns, &flush))
        return NULL;
    PyObject *r = NULL;
    Py_ssize_t S = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    if (S == 0 || qd < 1 || qd > S || total < 0) { PyErr_SetString(PyExc_ValueError, "bad ring or queue depth"); goto done; }
    for (Py_ssize_t i = 0; i < S; i++) {
        if (offs[i] < 0 || offs[i] > v.len - HDR - pl.len || (((uintptr_t)v.buf + offs[i]) & 7)) {
            PyErr_SetString(PyExc_ValueError, "slot offset outside the buffer"); goto done;
        }
    }
    Py_ssize_t done_n = 0, sent = 0, failed = 0;
    uint64_t t_start, t_end;
    Py_BEGIN_ALLOW_THREADS
    t_start = now_ns();
    uint64_t last_progress = t_start;
    while (done_n < total && !failed) {
        while (sent < total && sent - done_n < qd) {
            uint64_t seq = seq0 + (uint64_t)sent;
            publish((char *)v.buf + offs[seq % (uint64_t)S], seq, epoch32, (uint16_t)op, 0, pl.buf, (size_t)pl.len, ST_REQ, flush);
            sent++;
        }
        uint64_t seq = seq0 + (uint64_t)done_n;
        struct slot_hdr *h = (struct slot_hdr *)((char *)v.buf + offs[seq % (uint64_t)S]);
        unsigned spins = 0;
        for (;;) {
            if (flush) { flush_range((char *)h, 8, 1); full_fence(); }
            if (__atomic_load_n(&h->status, __ATOMIC_ACQUIRE) == ST_RESP) break;
            if ((++spins & 63) == 0) {
                uint64_t t = now_ns();
                if (t - last_progress > timeout_ns) { failed = 1; break; }
                if (t - last_progress > SPIN_BEFORE_YIELD_NS) sched_yield();
            }
            cpu_relax();
        }
        if (failed) break;
        if (h->seq != seq || h->code != 0) failed = 2;
        __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
        done_n++;
        last_progress = now_ns();
    }
    t_end = now_ns();
    Py_END_ALLOW_THREADS
    if (failed == 1) { PyErr_SetString(PyExc_TimeoutError, "no reply within the timeout"); goto done; }
    if (failed == 2) { PyErr_SetString(PyExc_RuntimeError, "a reply carried an error code or the wrong sequence"); goto done; }
    r = Py_BuildValue("(nK)", done_n, (unsigned long long)(t_end - t_start));
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov); PyBuffer_Release(&pl);
    return r;
}

/* ---- Doorbells (_native_ring.h; docs/pool-format.md, "Doorbells") ------------------------ */

HIDDEN struct bell_entry bell_table[BELL_TABLE];
HIDDEN int bell_used = 0;

/* bell_register(buf, ring_off, ring_len, bell_off) -> handle | -1 (table full: the ring rings nothing)
 * From now on a request published in [ring_off, ring_off + ring_len) of this mapping bumps the byte
 * at bell_off. The caller unregisters before the mapping goes (bell_unregister). Called with the GIL
 * held (it serialises registrations); publishers read the table without it. */
PyObject *py_bell_register(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t ring_off, ring_len, bell_off; char *ring, *bell;
    if (!PyArg_ParseTuple(args, "w*nnn", &v, &ring_off, &ring_len, &bell_off)) return NULL;
    PyObject *r = NULL;
    if (ring_len <= 0 || get_range(&v, ring_off, ring_len, &ring) < 0 || get_range(&v, bell_off, 1, &bell) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "empty ring range");
        goto done;
    }
    uintptr_t lo = (uintptr_t)ring, hi = lo + (uintptr_t)ring_len;
    int n = bell_used, slot = -1;
    for (int i = 0; i < n; i++) {
        struct bell_entry *e = &bell_table[i];
        if (e->refs > 0 && e->lo == lo && e->hi == hi && e->bell == (uint8_t *)bell) { /* the same ring again */
            e->refs++;
            r = PyLong_FromLong(i);
            goto done;
        }
    }
    for (int i = 0; i < n && slot < 0; i++)
        if (bell_table[i].refs == 0) slot = i;
    if (slot < 0 && n < BELL_TABLE) slot = n;
    if (slot >= 0) {
        struct bell_entry *e = &bell_table[slot];
        /* A publisher racing with a reuse may bump this entry's new byte once: a doorbell without
         * a request, one look. */
        __atomic_store_n(&e->bell, (uint8_t *)NULL, __ATOMIC_RELEASE);
        __atomic_store_n(&e->lo, lo, __ATOMIC_RELAXED);
        __atomic_store_n(&e->hi, hi, __ATOMIC_RELAXED);
        __atomic_store_n(&e->bell, (uint8_t *)bell, __ATOMIC_RELEASE);
        e->refs = 1;
        if (slot == n) __atomic_store_n(&bell_used, n + 1, __ATOMIC_RELEASE);
    }
    r = PyLong_FromLong(slot);
done:
    PyBuffer_Release(&v);
    return r;
}

/* bell_unregister(handle): once every registration of that ring is gone, its requests ring nothing. */
PyObject *py_bell_unregister(PyObject *self, PyObject *args) {
    int h;
    if (!PyArg_ParseTuple(args, "i", &h)) return NULL;
    if (h >= 0 && h < bell_used && bell_table[h].refs > 0 && --bell_table[h].refs == 0)
        __atomic_store_n(&bell_table[h].bell, (uint8_t *)NULL, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static void bells_free(PyObject *cap) {
    struct bells *b = PyCapsule_GetPointer(cap, "belugactl.bells");
    if (b == NULL) return;
    free(b->seen); free(b->mark); free(b->pend); free(b);
}

HIDDEN struct bells *bells_get(PyObject *cap) {
    return PyCapsule_GetPointer(cap, "belugactl.bells");
}

static inline void bells_push(struct bells *b, Py_ssize_t r) {
    if (!b->mark[r]) { b->mark[r] = 1; b->pend[b->npend++] = r; }
}

/* bells_new(ring_count, bell_off, sweep_ns) -> state: a server's doorbell state; every ring starts
 * pending (one look each), and the sweep adds one ring every sweep_ns. */
PyObject *py_bells_new(PyObject *self, PyObject *args) {
    Py_ssize_t R; long long off; unsigned long long sweep_ns;
    if (!PyArg_ParseTuple(args, "nLK", &R, &off, &sweep_ns)) return NULL;
    if (R <= 0 || off < 0 || (off & (LINE - 1)) || sweep_ns == 0) {
        PyErr_SetString(PyExc_ValueError, "bells_new: ring count, doorbell offset (line-aligned) or sweep_ns");
        return NULL;
    }
    struct bells *b = calloc(1, sizeof *b);
    if (b == NULL) return PyErr_NoMemory();
    b->R = R; b->nbytes = (R + LINE - 1) / LINE * LINE; b->area_off = off; b->sweep_ns = sweep_ns;
    b->seen = calloc((size_t)b->nbytes, 1); b->mark = calloc((size_t)R, 1); b->pend = calloc((size_t)R, sizeof(int64_t));
    if (!b->seen || !b->mark || !b->pend) { free(b->seen); free(b->mark); free(b->pend); free(b); return PyErr_NoMemory(); }
    for (Py_ssize_t r = 0; r < R; r++) bells_push(b, r);
    b->sweep_t = now_ns();
    PyObject *cap = PyCapsule_New(b, "belugactl.bells", bells_free);
    if (cap == NULL) { free(b->seen); free(b->mark); free(b->pend); free(b); }
    return cap;
}

HIDDEN int bells_check(struct bells *b, Py_buffer *v, Py_ssize_t noffs) {
    if (noffs != 2 * b->R) { PyErr_SetString(PyExc_ValueError, "doorbells: offsets are not 2 per ring"); return -1; }
    if (b->area_off > v->len - b->nbytes || (((uintptr_t)v->buf + (uintptr_t)b->area_off) & 7)) {
        PyErr_SetString(PyExc_ValueError, "doorbells: the doorbell area is outside the mapping or unaligned");
        return -1;
    }
    return 0;
}

static inline int slot_ready(char *slot, int flush) {
    if (flush) { flush_range(slot, 8, 1); full_fence(); }
    return __atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ;
}

HIDDEN Py_ssize_t bells_next(struct bells *b, char *base, const int64_t *offs, int flush) {
    Py_ssize_t R = b->R;
    const char *area = base + b->area_off;
    b->polls++;
    /* 1. The doorbell lines: one invalidate pass and one fence for all of them, then the loads. */
    if (flush) { flush_range(area, (size_t)b->nbytes, 1); full_fence(); }
    for (Py_ssize_t line = 0; line < b->nbytes; line += LINE) {
        uint64_t w[LINE / 8];
        for (int k = 0; k < LINE / 8; k++) w[k] = __atomic_load_n((const uint64_t *)(area + line) + k, __ATOMIC_RELAXED);
        if (memcmp(w, b->seen + line, LINE) == 0) continue;
        const uint8_t *nb = (const uint8_t *)w;
        Py_ssize_t end = line + LINE < R ? line + LINE : R;
        for (Py_ssize_t i = line; i < end; i++)
            if (nb[i - line] != b->seen[i]) { b->rung++; bells_push(b, i); }
        memcpy(b->seen + line, w, LINE); /* bytes past the last ring too: garbage there costs nothing twice */
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the slots are read after the doorbells */
    /* 2. The sweep: whatever the doorbells say, every ring once per R * sweep_ns. */
    uint64_t t = now_ns();
    if (t - b->sweep_t >= b->sweep_ns) {
        uint64_t due = (t - b->sweep_t) / b->sweep_ns;
        if (due >= (uint64_t)R) { due = (uint64_t)R; b->sweep_t = t; }
        else b->sweep_t += due * b->sweep_ns;
        for (uint64_t k = 0; k < due; k++) {
            bells_push(b, b->sweep_pos);
            if (++b->sweep_pos >= R) b->sweep_pos = 0;
        }
        b->swept += due;
    }
    /* 3. The pending rings, from where the last found one left off. */
    Py_ssize_t budget = 2 * b->npend;
    Py_ssize_t q = b->npend ? b->rot % b->npend : 0;
    while (b->npend > 0 && budget-- > 0) {
        if (q >= b->npend) q = 0;
        Py_ssize_t r = b->pend[q];
        b->looks++;
        if (slot_ready(base + offs[r], flush)) { b->rot = q + 1; b->found++; return r; }
        if (offs[R + r] != offs[r] && slot_ready(base + offs[R + r], flush)) { b->rot = q + 1; b->found++; return R + r; }
        b->mark[r] = 0;
        b->pend[q] = b->pend[--b->npend]; /* q now holds the last one, looked at next */
    }
    return -1;
}

/* The slot at offs[i] as rpc_take returns it: (i, seq, magic, epoch, op, length, payload | None). */
static PyObject *taken_tuple(char *base, const int64_t *offs, Py_ssize_t i, Py_ssize_t maxp, int flush) {
    char *slot = base + offs[i];
    if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
    struct slot_hdr h;
    memcpy(&h, slot, sizeof h); /* one snapshot: the client could scribble while we read */
    if (h.length <= (uint64_t)maxp)
        return Py_BuildValue("(nKIIIIy#)", i, (unsigned long long)h.seq, h.magic, h.epoch, (unsigned)h.op, h.length,
                             slot + HDR, (Py_ssize_t)h.length);
    return Py_BuildValue("(nKIIIIO)", i, (unsigned long long)h.seq, h.magic, h.epoch, (unsigned)h.op, h.length, Py_None);
}

static int bells_args(PyObject *cap, Py_buffer *v, Py_buffer *ov, Py_ssize_t maxp, struct bells **out) {
    struct bells *b = bells_get(cap);
    if (b == NULL) return -1;
    if (ov->len % 8 != 0 || maxp < 0 || bells_check(b, v, ov->len / 8) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad offsets or max_payload");
        return -1;
    }
    const int64_t *offs = (const int64_t *)ov->buf;
    for (Py_ssize_t i = 0; i < ov->len / 8; i++) {
        if (offs[i] < 0 || offs[i] > v->len - HDR - maxp || (((uintptr_t)v->buf + offs[i]) & 7)) {
            PyErr_Format(PyExc_ValueError, "slot offset %lld is outside the buffer or unaligned", (long long)offs[i]);
            return -1;
        }
    }
    *out = b;
    return 0;
}

/* bells_take(buf, offs, state, max_payload, timeout_ns, flush) -> as rpc_take | None
 * rpc_take led by the doorbells: offs is the listener's 2R array (each ring's cursor slot, then
 * its slot 0); looks (bells_next) until a slot is ready or timeout_ns passed (one look at 0). */
PyObject *py_bells_take(PyObject *self, PyObject *args) {
    Py_buffer v, ov; PyObject *cap; Py_ssize_t maxp; unsigned long long timeout_ns; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*OnK|p", &v, &ov, &cap, &maxp, &timeout_ns, &flush)) return NULL;
    PyObject *r = NULL;
    struct bells *b;
    if (bells_args(cap, &v, &ov, maxp, &b) < 0) goto done;
    const int64_t *offs = (const int64_t *)ov.buf;
    Py_ssize_t found = bells_next(b, (char *)v.buf, offs, flush);
    if (found < 0 && timeout_ns > 0) {
        Py_BEGIN_ALLOW_THREADS
        uint64_t t0 = now_ns();
        unsigned spins = 0;
        while ((found = bells_next(b, (char *)v.buf, offs, flush)) < 0) {
            uint64_t t = now_ns();
            if (t - t0 >= timeout_ns) break;
            if (t - t0 > SPIN_BEFORE_YIELD_NS && (++spins & 15) == 0) sched_yield();
            cpu_relax();
        }
        Py_END_ALLOW_THREADS
    }
    if (found < 0) { r = Py_None; Py_INCREF(r); }
    else r = taken_tuple((char *)v.buf, offs, found, maxp, flush);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* bells_wait(buf, offs, state, timeout_ns, sleep_ns, flush=False, fd=-1) -> index, -1 (timeout) or -2 (fd)
 * idle_wait_any led by the doorbells: a look every sleep_ns, without the GIL and without a core. */
PyObject *py_bells_wait(PyObject *self, PyObject *args) {
    Py_buffer v, ov; PyObject *cap; unsigned long long timeout_ns, sleep_ns; int flush = 0, fd = -1;
    if (!PyArg_ParseTuple(args, "w*y*OKK|pi", &v, &ov, &cap, &timeout_ns, &sleep_ns, &flush, &fd)) return NULL;
    PyObject *r = NULL;
    struct bells *b;
    if (sleep_ns == 0 || sleep_ns > 1000000000ull || fd < -1) {
        PyErr_SetString(PyExc_ValueError, "bells_wait: sleep_ns must be 1 ns to 1 s, fd a file descriptor or -1");
        goto done;
    }
    if (bells_args(cap, &v, &ov, 0, &b) < 0) goto done;
    const int64_t *offs = (const int64_t *)ov.buf;
    Py_ssize_t found;
    int bad_fd = 0;
    Py_BEGIN_ALLOW_THREADS
    int slack = idle_slack_begin();
    struct pollfd pfd = {fd, POLLIN, 0};
    uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        found = bells_next(b, (char *)v.buf, offs, flush);
        if (found >= 0 || now_ns() >= deadline) break;
        int got = idle_step(&pfd, sleep_ns);
        if (got < 0) break;
        if (got > 0) { bad_fd = got == 2; found = -2; break; }
    }
    idle_slack_end(slack);
    Py_END_ALLOW_THREADS
    if (bad_fd) PyErr_Format(PyExc_ValueError, "fd %d is not open", fd);
    else r = PyLong_FromSsize_t(found);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* bells_stats(state) -> {polls, rung, swept, looks, found, pending} */
PyObject *py_bells_stats(PyObject *self, PyObject *args) {
    PyObject *cap;
    if (!PyArg_ParseTuple(args, "O", &cap)) return NULL;
    struct bells *b = bells_get(cap);
    if (b == NULL) return NULL;
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:n}", "polls", (unsigned long long)b->polls, "rung",
                         (unsigned long long)b->rung, "swept", (unsigned long long)b->swept, "looks",
                         (unsigned long long)b->looks, "found", (unsigned long long)b->found, "pending", b->npend);
}

/* bells_pend_all(state, ring=-1): every ring (or that one) looked at once more (after a restart,
 * or a resync that moved a ring's cursor). */
PyObject *py_bells_pend_all(PyObject *self, PyObject *args) {
    PyObject *cap; Py_ssize_t ring = -1;
    if (!PyArg_ParseTuple(args, "O|n", &cap, &ring)) return NULL;
    struct bells *b = bells_get(cap);
    if (b == NULL) return NULL;
    if (ring >= b->R) { PyErr_SetString(PyExc_ValueError, "bells_pend_all: no such ring"); return NULL; }
    for (Py_ssize_t r = ring < 0 ? 0 : ring; r < (ring < 0 ? b->R : ring + 1); r++) bells_push(b, r);
    Py_RETURN_NONE;
}
