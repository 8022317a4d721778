/* Per-message encoding and decoding, for the ring calls that know what their messages hold:
 * GET_MANY in one call (rpc_get_many), or started now and finished later (rpc_get_many_start,
 * rpc_get_many_finish), and a reply Python took (get_many_decode); RELEASE sent without waiting
 * (rpc_release_nowait, whose steps the one-call load in _native_load.c shares); the lease id
 * codec (lease_encode, lease_decode_many). The ring mechanics they use (run_burst, check_ring,
 * burst_failure) are _native_ring.c's. */
#include "_native_ring.h"

/* One block of a GET_MANY reply (protocol.py: u64 lease, u64 nbytes, u16 extent count, u16
 * checksum kind, u32 checksum, extent count x (u64 offset, u64 length)) at d + *pos, as the vLLM
 * connector's location tuple (extents, lease id, nbytes, checksum | None), or None where the lease
 * is 0 (absent). Every length is checked against `size` before it is read, and every extent of a
 * located block against [lo, hi), the shared KV area of the pool header (a reply that names bytes
 * elsewhere, e.g. from a fake server, is refused before anything reads them). Returns a new
 * reference; NULL with ValueError set for a block past the reply's end, an extent outside the area
 * or an unknown checksum kind. */
static PyObject *decode_get_many_block(const unsigned char *d, Py_ssize_t size, Py_ssize_t *pos, Py_ssize_t i,
                                       unsigned count, uint64_t lo, uint64_t hi) {
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
        if ((lo | ~hi) && (off < lo || off > hi || len > hi - off)) { /* [0, 2**64-1): no area given */
            PyErr_Format(PyExc_ValueError, "GET_MANY reply: block %zd's extent (%llu, %llu) lies outside the shared KV "
                         "area [%llu, %llu)", i, (unsigned long long)off, (unsigned long long)len,
                         (unsigned long long)lo, (unsigned long long)hi);
            Py_DECREF(ext);
            return NULL;
        }
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
                                         Py_ssize_t per_msg, Py_ssize_t maxp, uint64_t lo, uint64_t hi) {
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
            PyObject *item = decode_get_many_block(d, size, &pos, j, count, lo, hi);
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

/* rpc_get_many(buf, slot_offsets_int64[S], seq0, epoch32, ns, keys, per_message, max_payload, window, timeout_ns, flush,
 *              area_lo=0, area_hi=2**64-1)
 *   -> (0, [location | None per key], [index of a key no reply answered, ...])
 *    | (code, message index): the server refused that message (the first one it refused)
 *    | (-3, why): a reply whose payload is not a GET_MANY answer (or names an extent outside
 *      [area_lo, area_hi), the shared KV area); (-4, why): a reply answering
 *      none of its keys, or more than it was asked (the ring is in step after both)
 *    | (-2, done) | None on timeout | ValueError, as rpc_call_many
 *    | TypeError, before anything is sent, for keys that are not bytes of one length or do not fit
 * The vLLM scheduler's pool-hit lookup in one call: the GET_MANY messages for `keys` (all of one
 * length, `per_message` to a message) are encoded here, sent as one pipelined burst, and their
 * replies decoded straight into location tuples (decode_get_many_block). In Python the encoding,
 * the chunking and the decode loop run on a pool hit's critical path, after an idle spell when
 * little of the interpreter is in the CPU caches. A reply that could not carry all of its
 * message's keys answers a prefix: the rest are listed for the caller to ask again. */
PyObject *py_rpc_get_many(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0, timeout_ns; unsigned int epoch32, ns; PyObject *keys_obj;
    Py_ssize_t per_msg, maxp, window; int flush = 0; unsigned long long lo = 0, hi = UINT64_MAX;
    if (!PyArg_ParseTuple(args, "w*y*KIIOnnnKp|KK", &v, &ov, &seq0, &epoch32, &ns, &keys_obj, &per_msg, &maxp, &window,
                          &timeout_ns, &flush, &lo, &hi))
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
    Py_ssize_t sent, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, epoch32, OP_GET_MANY, src, src_len,
                          m, maxp, window, timeout_ns, flush, hdrs, out, 0, &sent, &taken);
    if (state) { r = burst_failure(state, sent, taken, hdrs, seq0); goto done; }
    r = decode_get_many_replies(hdrs, out, m, nkeys, per_msg, maxp, lo, hi);
done:
    PyMem_Free(src); PyMem_Free(src_len); PyMem_Free(hdrs); PyMem_Free(req); PyMem_Free(out);
    Py_XDECREF(keys);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_get_many_start(buf, slot_offsets_int64[S], seq0, epoch32, ns, keys, per_message, max_payload, window, flush)
 *   -> m (the messages sent, as sequences seq0 .. seq0 + m - 1) | (-2, sent) | None
 *    | TypeError, before anything is sent, as rpc_get_many
 * The first half of rpc_get_many: the messages encoded and published, their replies left in flight
 * for rpc_get_many_finish. The vLLM scheduler starts a request's lookup when the request arrives
 * and takes the answer when it schedules it, so the server's wake-up and work overlap the engine's
 * own bookkeeping in between. None: more messages than `window` (nothing sent). (-2, sent): a
 * slot still busy from an abandoned request stopped the sending there. */
PyObject *py_rpc_get_many_start(PyObject *self, PyObject *args) {
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
    Py_ssize_t sent = 0;
    for (; sent < m; sent++) {
        char *slot = (char *)v.buf + offs[(seq0 + (uint64_t)sent) % (uint64_t)S];
        if (flush) { flush_range(slot, 8, 1); full_fence(); }
        if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) break;
        publish(slot, seq0 + (uint64_t)sent, epoch32, OP_GET_MANY, 0, src[sent], (size_t)src_len[sent], ST_REQ, flush);
    }
    r = sent == m ? PyLong_FromSsize_t(m) : Py_BuildValue("(in)", -2, sent);
done:
    PyMem_Free(src); PyMem_Free(src_len); PyMem_Free(req);
    Py_XDECREF(keys);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_get_many_finish(buf, slot_offsets_int64[S], seq0, nkeys, per_message, max_payload, timeout_ns, flush,
 *                     area_lo=0, area_hi=2**64-1)
 *   -> what rpc_get_many returns, for the burst rpc_get_many_start sent as seq0 onwards
 * The second half: the replies of the `nkeys`-key lookup started earlier, taken in order (waiting as
 * rpc_call_many waits) and decoded. The caller takes nothing else from the ring in between. */
PyObject *py_rpc_get_many_finish(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long seq0, timeout_ns; Py_ssize_t nkeys, per_msg, maxp; int flush = 0;
    unsigned long long lo = 0, hi = UINT64_MAX;
    if (!PyArg_ParseTuple(args, "w*y*KnnnKp|KK", &v, &ov, &seq0, &nkeys, &per_msg, &maxp, &timeout_ns, &flush, &lo, &hi))
        return NULL;
    PyObject *r = NULL;
    char *out = NULL; struct slot_hdr *hdrs = NULL;
    if (nkeys < 1 || per_msg < 1 || per_msg > 0xFFFF) { PyErr_SetString(PyExc_ValueError, "rpc_get_many_finish: bad key count"); goto done; }
    Py_ssize_t m = (nkeys + per_msg - 1) / per_msg;
    if (check_ring(&v, &ov, maxp, m) < 0) goto done;
    hdrs = PyMem_Malloc(sizeof *hdrs * (size_t)m);
    out = PyMem_Malloc((size_t)m * (size_t)(maxp ? maxp : 1));
    if (!hdrs || !out) { PyErr_NoMemory(); goto done; }
    Py_ssize_t sent, taken;
    int state = run_burst((char *)v.buf, (const int64_t *)ov.buf, ov.len / 8, seq0, 0, OP_GET_MANY, NULL, NULL,
                          m, maxp, m, timeout_ns, flush, hdrs, out, m, &sent, &taken);
    if (state) { r = burst_failure(state, sent, taken, hdrs, seq0); goto done; }
    r = decode_get_many_replies(hdrs, out, m, nkeys, per_msg, maxp, lo, hi);
done:
    PyMem_Free(hdrs); PyMem_Free(out);
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return r;
}

/* rpc_release_nowait(buf, slot_offsets_int64[S], seq0, epoch32, lease_ids, flags, per_message, max_payload,
 *                  flush=False, epoch_off=-1, expected_epoch=0)
 *   -> [ids in each message sent] | (-2, [ids in each message sent before the busy slot])
 *    | (-1, []): fenced, nothing sent
 * A reader's lease release sent without waiting for its replies (KVIndexClient.release_nowait):
 * the non-zero ids, `per_message` to a RELEASE message (u16 count, u16 flags, u32 0, u64 ids),
 * published as sequences seq0, seq0 + 1, ... The vLLM worker sends this right after its copy,
 * when nothing of the interpreter is in the CPU caches: encoding and submitting in Python would
 * touch many objects, and after a large copy each first touch is a cache miss. So `lease_ids`
 * may be a buffer of native uint64 (an array('Q') packed while the ids were still cached) as well
 * as a sequence of ints, and with epoch_off >= 0 the pool header's epoch word is compared with
 * expected_epoch first (as rpc_call does): moved, nothing is sent (-1). A slot still busy from an
 * abandoned request stops the sending there (-2). Ids that are not integers of 64 bits raise
 * (nothing sent); the caller checks the window. */
/* The three steps of a no-wait release, shared by rpc_release_nowait and load_blocks_checked (which
 * sends its release right after its copy, inside the same call). */
HIDDEN int release_nowait_parse(PyObject *args, struct nowait_release *pr) {
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
        PyErr_SetString(PyExc_ValueError, "rpc_release_nowait: ids per message or flags do not fit a slot");
        goto done;
    }
    Py_ssize_t n;
    if (!PyList_Check(ids_obj) && !PyTuple_Check(ids_obj) && PyObject_CheckBuffer(ids_obj)) {
        if (PyObject_GetBuffer(ids_obj, &ib, PyBUF_SIMPLE) < 0) goto done;
        have_ib = 1;
        if (ib.len % 8 != 0) { PyErr_SetString(PyExc_ValueError, "rpc_release_nowait: a buffer of lease ids holds 8-byte words"); goto done; }
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

/* No Python objects: runs with the GIL released. 0: every message sent; -1: the pool's epoch
 * moved (nothing sent); -2: a slot still busy from an abandoned request stopped the sending.
 * `*sent` says how many messages went out. */
HIDDEN int release_nowait_send(struct nowait_release *pr, Py_ssize_t *sent) {
    *sent = 0;
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
        *sent = i + 1;
    }
    return 0;
}

/* rpc_release_nowait's value for a send's outcome: [ids in each message sent], (-1, []) or
 * (-2, [ids in each message sent before the busy slot]). */
HIDDEN PyObject *release_nowait_result(const struct nowait_release *pr, int state, Py_ssize_t sent) {
    PyObject *counts = PyList_New(sent);
    if (counts == NULL) return NULL;
    for (Py_ssize_t i = 0; i < sent; i++) {
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

HIDDEN void release_nowait_free(struct nowait_release *pr) {
    PyMem_Free(pr->vals); PyMem_Free(pr->msg);
    pr->vals = NULL; pr->msg = NULL;
    if (pr->have_bufs) { PyBuffer_Release(&pr->v); PyBuffer_Release(&pr->ov); pr->have_bufs = 0; }
}

PyObject *py_rpc_release_nowait(PyObject *self, PyObject *args) {
    struct nowait_release pr;
    PyObject *r = NULL;
    if (release_nowait_parse(args, &pr) == 0) {
        Py_ssize_t sent;
        int state = release_nowait_send(&pr, &sent);
        r = release_nowait_result(&pr, state, sent);
    }
    release_nowait_free(&pr);
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
 * than `owner` (in Python the 4-round permutation per id was most of a release's time). */
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

/* get_many_decode(reply, area_lo=0, area_hi=2**64-1) -> [(extents, lease id, nbytes, checksum | None) | None, ...]
 * A GET_MANY reply (protocol.py: u16 count, u16 pad, then per block u64 lease, u64 nbytes, u16
 * extent count, u16 checksum kind, u32 checksum, extent count x (u64 offset, u64 length)) decoded
 * straight into the vLLM connector's location tuples, None where the lease is 0 (absent). The
 * scheduler decodes a long prompt's reply on a pool hit's critical path, a Python loop per block
 * there. Every length is checked against the reply before it is read;
 * ValueError on a short reply, a count or extent count past its end, an extent outside
 * [area_lo, area_hi) (the shared KV area), or an unknown checksum kind. */
PyObject *py_get_many_decode(PyObject *self, PyObject *args) {
    Py_buffer b; unsigned long long lo = 0, hi = UINT64_MAX;
    if (!PyArg_ParseTuple(args, "y*|KK", &b, &lo, &hi)) return NULL;
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
        PyObject *item = decode_get_many_block(d, size, &pos, i, count, lo, hi);
        if (item == NULL) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, item);
    }
done:
    PyBuffer_Release(&b);
    return out;
}
