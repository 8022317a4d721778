/* CXL-RPC slot operations (the hot path; see rpc/slots.py for the Python twins). */
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

/* rpc_post(buf, off, seq, epoch, op, payload, flush) */
PyObject *py_rpc_post(PyObject *self, PyObject *args) {
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
#define CALL_MANY_HELD_NS 200000ull
#define CALL_MANY_SLEEP_AFTER_NS 300000ull
#define CALL_MANY_NAP_NS 20000L
#define BURST_OK 0
#define BURST_TIMEOUT 1
#define BURST_SLOT_BUSY 2
#define BURST_MALFORMED 3

/* The burst loop of rpc_call_many and rpc_get_many: request i (src[i], src_len[i] bytes, each at
 * most maxp) goes out as sequence seq0 + i in slot offs[(seq0 + i) % S], at most `window` in flight;
 * reply i's header lands in hdrs[i] and its payload at out + i * maxp; the first `posted0` requests
 * were posted already (rpc_get_many_post: only their replies are taken). Called with the GIL held; it
 * keeps it for the first CALL_MANY_HELD_NS of waiting and hands it back once for the rest. */
static int run_burst(char *base, const int64_t *offs, Py_ssize_t S, uint64_t seq0, uint32_t epoch32, uint16_t op,
                     const char *const *src, const Py_ssize_t *src_len, Py_ssize_t n, Py_ssize_t maxp,
                     Py_ssize_t window, uint64_t timeout_ns, int flush, struct slot_hdr *hdrs, char *out,
                     Py_ssize_t posted0, Py_ssize_t *posted_out, Py_ssize_t *taken_out) {
    Py_ssize_t posted = posted0, taken = 0;
    int state = BURST_OK;
    PyThreadState *ts = NULL;
    uint64_t t0 = now_ns(), last = t0;
    unsigned spins = 0;
    while (taken < n) {
        while (posted < n && posted - taken < window) {
            char *slot = base + offs[(seq0 + (uint64_t)posted) % (uint64_t)S];
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) { state = BURST_SLOT_BUSY; break; }
            publish(slot, seq0 + (uint64_t)posted, epoch32, op, 0, src[posted], (size_t)src_len[posted], ST_REQ, flush);
            posted++;
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
                    struct timespec nap = {0, CALL_MANY_NAP_NS};
                    nanosleep(&nap, NULL);
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
    *posted_out = posted; *taken_out = taken;
    return state;
}

/* Checks a ring's slot offsets against the mapping (8-byte aligned, a whole slot inside it). */
static int check_ring(Py_buffer *v, Py_buffer *ov, Py_ssize_t maxp, Py_ssize_t window) {
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
static PyObject *burst_failure(int state, Py_ssize_t posted, Py_ssize_t taken, struct slot_hdr *hdrs, uint64_t seq0) {
    if (state == BURST_TIMEOUT) Py_RETURN_NONE;
    if (state == BURST_SLOT_BUSY) {
        if (posted == taken) return Py_BuildValue("(in)", -2, posted);
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
    Py_ssize_t posted, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, epoch32, (uint16_t)op, src, src_len,
                          n, maxp, window, timeout_ns, flush, hdrs, out, 0, &posted, &taken);
    if (state) { r = burst_failure(state, posted, taken, hdrs, seq0); goto done; }
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

/* One block of a GET_MANY reply (protocol.py: u64 lease, u64 nbytes, u16 extent count, u16
 * checksum kind, u32 checksum, extent count x (u64 offset, u64 length)) at d + *pos, as the vLLM
 * connector's location tuple (extents, lease id, nbytes, checksum | None), or None where the lease
 * is 0 (absent). Every length is checked against `size` before it is read. Returns a new reference;
 * NULL with ValueError set for a block past the reply's end or an unknown checksum kind. */
static PyObject *decode_get_many_block(const unsigned char *d, Py_ssize_t size, Py_ssize_t *pos, Py_ssize_t i,
                                       unsigned count) {
    if (size - *pos < 24) {
        PyErr_Format(PyExc_ValueError, "GET_MANY reply: block %zd of %u starts past its %zd bytes", i, count, size);
        return NULL;
    }
    uint64_t lease, nbytes; uint16_t n, kind; uint32_t crc;
    const unsigned char *p = d + *pos;
    memcpy(&lease, p, 8); memcpy(&nbytes, p + 8, 8); memcpy(&n, p + 16, 2); memcpy(&kind, p + 18, 2); memcpy(&crc, p + 20, 4);
    *pos += 24;
    if ((Py_ssize_t)n * 16 > size - *pos) {
        PyErr_Format(PyExc_ValueError, "GET_MANY reply: block %zd's %u extents run past its %zd bytes", i, n, size);
        return NULL;
    }
    if (kind > 1) {
        PyErr_Format(PyExc_ValueError, "GET_MANY reply: unknown checksum kind %u", kind);
        return NULL;
    }
    if (lease == 0) {
        *pos += (Py_ssize_t)n * 16;
        Py_RETURN_NONE;
    }
    PyObject *ext = PyList_New(n);
    if (ext == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t off, len;
        memcpy(&off, d + *pos, 8); memcpy(&len, d + *pos + 8, 8);
        *pos += 16;
        PyObject *e = Py_BuildValue("(KK)", (unsigned long long)off, (unsigned long long)len);
        if (e == NULL) { Py_DECREF(ext); return NULL; }
        PyList_SET_ITEM(ext, j, e);
    }
    PyObject *cs;
    if (kind == 1) cs = PyLong_FromUnsignedLong(crc);
    else { cs = Py_None; Py_INCREF(cs); }
    if (cs == NULL) { Py_DECREF(ext); return NULL; }
    return Py_BuildValue("(NKKN)", ext, (unsigned long long)lease, (unsigned long long)nbytes, cs);
}

/* rpc_get_many(buf, slot_offsets_int64[S], seq0, epoch32, ns, keys, per_message, max_payload, window, timeout_ns, flush)
 *   -> (0, [location | None per key], [index of a key no reply answered, ...])
 *    | (code, message index): the server refused that message (the first one it refused)
 *    | (-3, why): a reply whose payload is not a GET_MANY answer; (-4, why): a reply answering
 *      none of its keys, or more than it was asked (the ring is in step after both)
 *    | (-2, done) | None on timeout | ValueError, as rpc_call_many
 *    | TypeError, before anything is sent, for keys that are not bytes of one length or do not fit
 * The vLLM scheduler's pool-hit lookup in one call: the GET_MANY messages for `keys` (all of one
 * length, `per_message` to a message) are encoded here, sent as one pipelined burst, and their
 * replies decoded straight into location tuples (decode_get_many_block). In Python the encoding,
 * the chunking and the decode loop cost about 0.25 ms for a 125-block prompt after an idle spell,
 * which is when a pool hit's lookup runs; here they are a few microseconds. A reply that could not
 * carry all of its message's keys answers a prefix: the rest are listed for the caller to ask again. */
/* The GET_MANY messages for `keys` (bytes of one length, `per_msg` to a message) encoded into one
 * private buffer: message i at src[i], src_len[i] bytes. Returns the message count, or -1 with
 * TypeError (keys that are not bytes of one length, or do not fit a slot) or MemoryError set. */
static Py_ssize_t encode_get_many(PyObject *keys, unsigned int ns, Py_ssize_t per_msg, Py_ssize_t maxp, char **req,
                                  const char ***src, Py_ssize_t **src_len) {
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    PyObject *k0 = PyTuple_GET_ITEM(keys, 0);
    if (!PyBytes_Check(k0)) { PyErr_SetString(PyExc_TypeError, "keys must be bytes"); return -1; }
    Py_ssize_t klen = PyBytes_GET_SIZE(k0);
    if (klen < 1 || klen > 0xFFFF || per_msg < 1 || per_msg > 0xFFFF || 8 + per_msg * klen > maxp) {
        PyErr_SetString(PyExc_TypeError, "rpc_get_many: key length or keys per message do not fit a slot");
        return -1;
    }
    Py_ssize_t m = (nkeys + per_msg - 1) / per_msg;
    if ((size_t)m > ((size_t)1 << 30) / ((size_t)maxp + 1)) { PyErr_SetString(PyExc_ValueError, "burst too large (over 1 GiB of replies): split it"); return -1; }
    Py_ssize_t stride = 8 + per_msg * klen;
    *src = PyMem_Malloc(sizeof **src * (size_t)m);
    *src_len = PyMem_Malloc(sizeof **src_len * (size_t)m);
    *req = PyMem_Malloc((size_t)m * (size_t)stride);
    if (!*src || !*src_len || !*req) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t first = i * per_msg, cnt = nkeys - first < per_msg ? nkeys - first : per_msg;
        char *q = *req + (size_t)i * (size_t)stride;
        uint32_t ns32 = ns; uint16_t c16 = (uint16_t)cnt, k16 = (uint16_t)klen;
        memcpy(q, &ns32, 4); memcpy(q + 4, &c16, 2); memcpy(q + 6, &k16, 2);
        for (Py_ssize_t j = 0; j < cnt; j++) {
            PyObject *k = PyTuple_GET_ITEM(keys, first + j);
            if (!PyBytes_Check(k) || PyBytes_GET_SIZE(k) != klen) {
                PyErr_SetString(PyExc_TypeError, "all keys of one GET_MANY must be bytes of the same length");
                return -1;
            }
            memcpy(q + 8 + j * klen, PyBytes_AS_STRING(k), (size_t)klen);
        }
        (*src)[i] = q; (*src_len)[i] = 8 + cnt * klen;
    }
    return m;
}

/* The m replies of a GET_MANY burst for `nkeys` keys (`per_msg` to a message; reply i's header in
 * hdrs[i], its payload at out + i * maxp) as rpc_get_many's result (see there). */
static PyObject *decode_get_many_replies(const struct slot_hdr *hdrs, const char *out, Py_ssize_t m, Py_ssize_t nkeys,
                                         Py_ssize_t per_msg, Py_ssize_t maxp) {
    PyObject *r = NULL, *locs = NULL, *left = NULL;
    for (Py_ssize_t i = 0; i < m; i++) {
        if (hdrs[i].code) return Py_BuildValue("(in)", (int)hdrs[i].code, i);
    }
    locs = PyList_New(nkeys);
    left = PyList_New(0);
    if (locs == NULL || left == NULL) goto done;
    for (Py_ssize_t i = 0; i < nkeys; i++) { Py_INCREF(Py_None); PyList_SET_ITEM(locs, i, Py_None); }
    for (Py_ssize_t i = 0; i < m; i++) {
        const unsigned char *d = (const unsigned char *)out + (size_t)i * (size_t)maxp;
        Py_ssize_t size = hdrs[i].length, first = i * per_msg;
        Py_ssize_t cnt = nkeys - first < per_msg ? nkeys - first : per_msg;
        uint16_t count;
        if (size < 4) { r = Py_BuildValue("(is)", -3, "GET_MANY reply: shorter than its 4-byte head"); goto done; }
        memcpy(&count, d, 2);
        if (count == 0 || count > cnt) {
            r = Py_BuildValue("(iN)", -4, PyUnicode_FromFormat("GET_MANY answered %u of %zd keys", (unsigned)count, cnt));
            goto done;
        }
        Py_ssize_t pos = 4;
        for (Py_ssize_t j = 0; j < count; j++) {
            PyObject *item = decode_get_many_block(d, size, &pos, j, count);
            if (item == NULL) {
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                PyObject *why = ev != NULL ? PyObject_Str(ev) : NULL;
                Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
                if (why == NULL) goto done;
                r = Py_BuildValue("(iN)", -3, why);
                goto done;
            }
            PyList_SetItem(locs, first + j, item); /* steals; drops the None */
        }
        for (Py_ssize_t j = count; j < cnt; j++) {
            PyObject *x = PyLong_FromSsize_t(first + j);
            if (x == NULL || PyList_Append(left, x) < 0) { Py_XDECREF(x); goto done; }
            Py_DECREF(x);
        }
    }
    r = Py_BuildValue("(iOO)", 0, locs, left);
done:
    Py_XDECREF(locs); Py_XDECREF(left);
    return r;
}

/* rpc_get_many(buf, slot_offsets_int64[S], seq0, epoch32, ns, keys, per_message, max_payload, window, timeout_ns, flush)
 *   -> (0, [location | None per key], [index of a key no reply answered, ...])
 *    | (code, message index): the server refused that message (the first one it refused)
 *    | (-3, why): a reply whose payload is not a GET_MANY answer; (-4, why): a reply answering
 *      none of its keys, or more than it was asked (the ring is in step after both)
 *    | (-2, done) | None on timeout | ValueError, as rpc_call_many
 *    | TypeError, before anything is sent, for keys that are not bytes of one length or do not fit
 * The vLLM scheduler's pool-hit lookup in one call: the GET_MANY messages for `keys` (all of one
 * length, `per_message` to a message) are encoded here, sent as one pipelined burst, and their
 * replies decoded straight into location tuples (decode_get_many_block). In Python the encoding,
 * the chunking and the decode loop cost about 0.25 ms for a 125-block prompt after an idle spell,
 * which is when a pool hit's lookup runs; here they are a few microseconds. A reply that could not
 * carry all of its message's keys answers a prefix: the rest are listed for the caller to ask again. */
PyObject *py_rpc_get_many(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0, timeout_ns; unsigned int epoch32, ns; PyObject *keys_obj;
    Py_ssize_t per_msg, maxp, window; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*KIIOnnnKp", &v, &ov, &seq0, &epoch32, &ns, &keys_obj, &per_msg, &maxp, &window,
                          &timeout_ns, &flush))
        return NULL;
    PyObject *r = NULL, *keys = NULL;
    const char **src = NULL; Py_ssize_t *src_len = NULL;
    char *req = NULL, *out = NULL; struct slot_hdr *hdrs = NULL;
    if (check_ring(&v, &ov, maxp, window) < 0) goto done;
    keys = PySequence_Tuple(keys_obj);
    if (keys == NULL) goto done;
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    if (nkeys == 0) { r = Py_BuildValue("(iNN)", 0, PyList_New(0), PyList_New(0)); goto done; }
    Py_ssize_t m = encode_get_many(keys, ns, per_msg, maxp, &req, &src, &src_len);
    if (m < 0) goto done;
    hdrs = PyMem_Malloc(sizeof *hdrs * (size_t)m);
    out = PyMem_Malloc((size_t)m * (size_t)(maxp ? maxp : 1));
    if (!hdrs || !out) { PyErr_NoMemory(); goto done; }
    Py_ssize_t posted, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, epoch32, OP_GET_MANY, src, src_len,
                          m, maxp, window, timeout_ns, flush, hdrs, out, 0, &posted, &taken);
    if (state) { r = burst_failure(state, posted, taken, hdrs, seq0); goto done; }
    r = decode_get_many_replies(hdrs, out, m, nkeys, per_msg, maxp);
done:
    PyMem_Free(src); PyMem_Free(src_len); PyMem_Free(hdrs); PyMem_Free(req); PyMem_Free(out);
    Py_XDECREF(keys);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_get_many_post(buf, slot_offsets_int64[S], seq0, epoch32, ns, keys, per_message, max_payload, window, flush)
 *   -> m (the messages posted, as sequences seq0 .. seq0 + m - 1) | (-2, posted) | None
 *    | TypeError, before anything is sent, as rpc_get_many
 * The first half of rpc_get_many: the messages encoded and published, their replies left in flight
 * for rpc_get_many_collect. The vLLM scheduler posts a request's lookup when the request arrives
 * and takes the answer when it schedules it, so the server's wake-up and work overlap the engine's
 * own bookkeeping in between. None: more messages than `window` (nothing sent). (-2, posted): a
 * slot still busy from an abandoned request stopped the posting there. */
PyObject *py_rpc_get_many_post(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0; unsigned int epoch32, ns; PyObject *keys_obj;
    Py_ssize_t per_msg, maxp, window; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*KIIOnnnp", &v, &ov, &seq0, &epoch32, &ns, &keys_obj, &per_msg, &maxp, &window,
                          &flush))
        return NULL;
    PyObject *r = NULL, *keys = NULL;
    const char **src = NULL; Py_ssize_t *src_len = NULL; char *req = NULL;
    if (check_ring(&v, &ov, maxp, window) < 0) goto done;
    keys = PySequence_Tuple(keys_obj);
    if (keys == NULL) goto done;
    if (PyTuple_GET_SIZE(keys) == 0) { r = PyLong_FromLong(0); goto done; }
    Py_ssize_t m = encode_get_many(keys, ns, per_msg, maxp, &req, &src, &src_len);
    if (m < 0) goto done;
    if (m > window) { r = Py_None; Py_INCREF(r); goto done; }
    Py_ssize_t S = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    Py_ssize_t posted = 0;
    for (; posted < m; posted++) {
        char *slot = (char *)v.buf + offs[(seq0 + (uint64_t)posted) % (uint64_t)S];
        if (flush) { flush_range(slot, 8, 1); full_fence(); }
        if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) break;
        publish(slot, seq0 + (uint64_t)posted, epoch32, OP_GET_MANY, 0, src[posted], (size_t)src_len[posted], ST_REQ, flush);
    }
    r = posted == m ? PyLong_FromSsize_t(m) : Py_BuildValue("(in)", -2, posted);
done:
    PyMem_Free(src); PyMem_Free(src_len); PyMem_Free(req);
    Py_XDECREF(keys);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_get_many_collect(buf, slot_offsets_int64[S], seq0, nkeys, per_message, max_payload, timeout_ns, flush)
 *   -> what rpc_get_many returns, for the burst rpc_get_many_post sent as seq0 onwards
 * The second half: the replies of the `nkeys`-key lookup posted earlier, taken in order (waiting as
 * rpc_call_many waits) and decoded. The caller takes nothing else from the ring in between. */
PyObject *py_rpc_get_many_collect(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0, timeout_ns; Py_ssize_t nkeys, per_msg, maxp; int flush = 0;
    if (!PyArg_ParseTuple(args, "w*y*KnnnKp", &v, &ov, &seq0, &nkeys, &per_msg, &maxp, &timeout_ns, &flush))
        return NULL;
    PyObject *r = NULL;
    char *out = NULL; struct slot_hdr *hdrs = NULL;
    if (nkeys < 1 || per_msg < 1 || per_msg > 0xFFFF) { PyErr_SetString(PyExc_ValueError, "rpc_get_many_collect: bad key count"); goto done; }
    Py_ssize_t m = (nkeys + per_msg - 1) / per_msg;
    if (check_ring(&v, &ov, maxp, m) < 0) goto done;
    hdrs = PyMem_Malloc(sizeof *hdrs * (size_t)m);
    out = PyMem_Malloc((size_t)m * (size_t)(maxp ? maxp : 1));
    if (!hdrs || !out) { PyErr_NoMemory(); goto done; }
    Py_ssize_t posted, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, 0, OP_GET_MANY, NULL, NULL,
                          m, maxp, m, timeout_ns, flush, hdrs, out, m, &posted, &taken);
    if (state) { r = burst_failure(state, posted, taken, hdrs, seq0); goto done; }
    r = decode_get_many_replies(hdrs, out, m, nkeys, per_msg, maxp);
done:
    PyMem_Free(hdrs); PyMem_Free(out);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_post_release(buf, slot_offsets_int64[S], seq0, epoch32, lease_ids, flags, per_message, max_payload,
 *                  flush=False, epoch_off=-1, expected_epoch=0)
 *   -> [ids in each message posted] | (-2, [ids in each message posted before the busy slot])
 *    | (-1, []): fenced, nothing posted
 * A reader's lease release posted without waiting for its replies (KVIndexClient.post_release):
 * the non-zero ids, `per_message` to a RELEASE message (u16 count, u16 flags, u32 0, u64 ids),
 * published as sequences seq0, seq0 + 1, ... The vLLM worker posts this right after its copy,
 * when the interpreter is cold: in Python the encoding and the submits took 80 to 180 us for a
 * 125-block hit, and after a copy every Python object or function touched first costs 20 to 60 us
 * on the 2-vCPU test VM. So `lease_ids` may be a buffer of native uint64 (an array('Q') packed
 * while the ids were warm) as well as a sequence of ints, and with epoch_off >= 0 the pool
 * header's epoch word is compared with expected_epoch first (as rpc_call does): moved, nothing is
 * posted (-1). A slot still busy from an abandoned request stops the posting there (-2). Ids that
 * are not integers of 64 bits raise (nothing posted); the caller checks the window. */
/* The three steps of a posted release, shared by rpc_post_release and load_blocks_checked (which
 * posts its release right after its copy, inside the same call). */
HIDDEN int posted_release_parse(PyObject *args, struct posted_release *pr) {
    PyObject *ids_obj; Py_buffer ib; int have_ib = 0;
    memset(pr, 0, sizeof *pr);
    pr->epoch_off = -1;
    if (!PyArg_ParseTuple(args, "w*y*KIOInn|pnK", &pr->v, &pr->ov, &pr->seq0, &pr->epoch32, &ids_obj, &pr->flags,
                          &pr->per_msg, &pr->maxp, &pr->flush, &pr->epoch_off, &pr->expected))
        return -1;
    pr->have_bufs = 1;
    PyObject *ids = NULL;
    int rc = -1;
    if (check_ring(&pr->v, &pr->ov, pr->maxp, 1) < 0) goto done;
    if (pr->per_msg < 1 || pr->per_msg > 0xFFFF || 8 + pr->per_msg * 8 > pr->maxp || pr->flags > 0xFFFF) {
        PyErr_SetString(PyExc_ValueError, "rpc_post_release: ids per message or flags do not fit a slot");
        goto done;
    }
    Py_ssize_t n;
    if (!PyList_Check(ids_obj) && !PyTuple_Check(ids_obj) && PyObject_CheckBuffer(ids_obj)) {
        if (PyObject_GetBuffer(ids_obj, &ib, PyBUF_SIMPLE) < 0) goto done;
        have_ib = 1;
        if (ib.len % 8 != 0) { PyErr_SetString(PyExc_ValueError, "rpc_post_release: a buffer of lease ids holds 8-byte words"); goto done; }
        n = ib.len / 8;
    } else {
        ids = PySequence_Fast(ids_obj, "lease ids must be a sequence or a buffer of uint64");
        if (ids == NULL) goto done;
        n = PySequence_Fast_GET_SIZE(ids);
    }
    pr->vals = PyMem_Malloc(sizeof *pr->vals * (size_t)(n ? n : 1));
    pr->msg = PyMem_Malloc((size_t)(8 + pr->per_msg * 8));
    if (!pr->vals || !pr->msg) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t x;
        if (have_ib) memcpy(&x, (const char *)ib.buf + 8 * i, 8);
        else {
            x = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(ids, i));
            if (x == (uint64_t)-1 && PyErr_Occurred()) goto done;
        }
        if (x) pr->vals[pr->k++] = x;
    }
    if (pr->epoch_off >= 0 && get_word(&pr->v, pr->epoch_off, &pr->epoch_word) < 0) goto done;
    rc = 0;
done:
    Py_XDECREF(ids);
    if (have_ib) PyBuffer_Release(&ib);
    return rc;
}

/* No Python objects: runs with the GIL released. 0: every message posted; -1: the pool's epoch
 * moved (nothing posted); -2: a slot still busy from an abandoned request stopped the posting.
 * `*posted` says how many messages went out. */
HIDDEN int posted_release_send(struct posted_release *pr, Py_ssize_t *posted) {
    *posted = 0;
    if (pr->epoch_word != NULL) {
        if (pr->flush) { flush_range((char *)pr->epoch_word, 8, 1); full_fence(); }
        if (__atomic_load_n(pr->epoch_word, __ATOMIC_ACQUIRE) != pr->expected) return -1;
    }
    Py_ssize_t S = pr->ov.len / 8;
    const int64_t *offs = (const int64_t *)pr->ov.buf;
    for (Py_ssize_t first = 0, i = 0; first < pr->k; first += pr->per_msg, i++) {
        char *slot = (char *)pr->v.buf + offs[(pr->seq0 + (uint64_t)i) % (uint64_t)S];
        if (pr->flush) { flush_range(slot, 8, 1); full_fence(); }
        if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) return -2;
        uint16_t cnt = (uint16_t)(pr->k - first < pr->per_msg ? pr->k - first : pr->per_msg), f16 = (uint16_t)pr->flags;
        uint32_t pad = 0;
        memcpy(pr->msg, &cnt, 2); memcpy(pr->msg + 2, &f16, 2); memcpy(pr->msg + 4, &pad, 4);
        memcpy(pr->msg + 8, pr->vals + first, (size_t)cnt * 8);
        publish(slot, pr->seq0 + (uint64_t)i, pr->epoch32, OP_RELEASE, 0, pr->msg, 8 + (size_t)cnt * 8, ST_REQ, pr->flush);
        *posted = i + 1;
    }
    return 0;
}

/* rpc_post_release's value for a send's outcome: [ids in each message posted], (-1, []) or
 * (-2, [ids in each message posted before the busy slot]). */
HIDDEN PyObject *posted_release_result(const struct posted_release *pr, int state, Py_ssize_t posted) {
    PyObject *counts = PyList_New(posted);
    if (counts == NULL) return NULL;
    for (Py_ssize_t i = 0; i < posted; i++) {
        Py_ssize_t first = i * pr->per_msg;
        PyObject *c = PyLong_FromSsize_t(pr->k - first < pr->per_msg ? pr->k - first : pr->per_msg);
        if (c == NULL) { Py_DECREF(counts); return NULL; }
        PyList_SET_ITEM(counts, i, c);
    }
    if (state == 0) return counts;
    PyObject *r = Py_BuildValue("(iO)", state, counts);
    Py_DECREF(counts);
    return r;
}

HIDDEN void posted_release_free(struct posted_release *pr) {
    PyMem_Free(pr->vals); PyMem_Free(pr->msg);
    pr->vals = NULL; pr->msg = NULL;
    if (pr->have_bufs) { PyBuffer_Release(&pr->v); PyBuffer_Release(&pr->ov); pr->have_bufs = 0; }
}

PyObject *py_rpc_post_release(PyObject *self, PyObject *args) {
    struct posted_release pr;
    PyObject *r = NULL;
    if (posted_release_parse(args, &pr) == 0) {
        Py_ssize_t posted;
        int state = posted_release_send(&pr, &posted);
        r = posted_release_result(&pr, state, posted);
    }
    posted_release_free(&pr);
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
    Py_ssize_t done_n = 0, posted = 0, failed = 0;
    uint64_t t_start, t_end;
    Py_BEGIN_ALLOW_THREADS
    t_start = now_ns();
    uint64_t last_progress = t_start;
    while (done_n < total && !failed) {
        while (posted < total && posted - done_n < qd) {
            uint64_t seq = seq0 + (uint64_t)posted;
            publish((char *)v.buf + offs[seq % (uint64_t)S], seq, epoch32, (uint16_t)op, 0, pl.buf, (size_t)pl.len, ST_REQ, flush);
            posted++;
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

/* lease_encode(keys16, seq, owner) -> the lease id the fast path hands out (tests compare it with
 * the Python codec). */
PyObject *py_lease_encode(PyObject *self, PyObject *args) {
    Py_buffer kv; unsigned long long seq, owner;
    if (!PyArg_ParseTuple(args, "y*KK", &kv, &seq, &owner)) return NULL;
    PyObject *r = NULL;
    if (kv.len != 16) PyErr_SetString(PyExc_ValueError, "lease keys must be 16 bytes");
    else {
        uint32_t keys[4];
        memcpy(keys, kv.buf, 16);
        r = PyLong_FromUnsignedLongLong(lease_encode(keys, seq, owner));
    }
    PyBuffer_Release(&kv);
    return r;
}

/* lease_decode_many(keys16, ids_le_u64, owner) -> ([sequence, ...], foreign)
 * The server's RELEASE: undo lease_encode for every id and count the ids granted to an owner other
 * than `owner` (in Python the 4-round permutation cost ~3 us an id, most of a release's time). */
PyObject *py_lease_decode_many(PyObject *self, PyObject *args) {
    Py_buffer kv, iv; unsigned long long owner;
    if (!PyArg_ParseTuple(args, "y*y*K", &kv, &iv, &owner)) return NULL;
    PyObject *r = NULL, *seqs = NULL;
    if (kv.len != 16 || iv.len % 8 != 0) { PyErr_SetString(PyExc_ValueError, "lease keys must be 16 bytes, ids 8 each"); goto done; }
    uint32_t keys[4];
    memcpy(keys, kv.buf, 16);
    Py_ssize_t n = iv.len / 8;
    seqs = PyList_New(n);
    if (seqs == NULL) goto done;
    Py_ssize_t foreign = 0;
    const uint64_t mask = (1ull << LEASE_OWNER_BITS) - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t id;
        memcpy(&id, (const char *)iv.buf + 8 * i, 8);
        uint32_t l = (uint32_t)(id >> 32), rr = (uint32_t)id;
        for (int k = 3; k >= 0; k--) { uint32_t t = l; l = rr ^ lease_round(l, keys[k]); rr = t; }
        uint64_t v = ((uint64_t)l << 32) | rr;
        if ((v & mask) != (owner & mask)) foreign++;
        PyObject *x = PyLong_FromUnsignedLongLong(v >> LEASE_OWNER_BITS);
        if (x == NULL) goto done;
        PyList_SET_ITEM(seqs, i, x);
    }
    r = Py_BuildValue("(On)", seqs, foreign);
done:
    Py_XDECREF(seqs);
    PyBuffer_Release(&kv); PyBuffer_Release(&iv);
    return r;
}

/* get_many_decode(reply) -> [(extents, lease id, nbytes, checksum | None) | None, ...]
 * A GET_MANY reply (protocol.py: u16 count, u16 pad, then per block u64 lease, u64 nbytes, u16
 * extent count, u16 checksum kind, u32 checksum, extent count x (u64 offset, u64 length)) decoded
 * straight into the vLLM connector's location tuples, None where the lease is 0 (absent). The
 * scheduler decodes a long prompt's reply on a pool hit's critical path: about 1 us a block in
 * Python, a few hundred ns here. Every length is checked against the reply before it is read;
 * ValueError on a short reply, a count or extent count past its end, or an unknown checksum kind. */
PyObject *py_get_many_decode(PyObject *self, PyObject *args) {
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    PyObject *out = NULL;
    const unsigned char *d = (const unsigned char *)b.buf;
    const Py_ssize_t size = b.len;
    if (size < 4) { PyErr_SetString(PyExc_ValueError, "GET_MANY reply: shorter than its 4-byte head"); goto done; }
    uint16_t count;
    memcpy(&count, d, 2);
    out = PyList_New(count);
    if (out == NULL) goto done;
    Py_ssize_t pos = 4;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = decode_get_many_block(d, size, &pos, i, count);
        if (item == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, item);
    }
done:
    PyBuffer_Release(&b);
    return out;
}
