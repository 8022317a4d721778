/* A restart's millions of Python objects, made in C (docs/measurements.md, 2026-12-08):
 *
 * - the allocator's (mds/allocator.py, Allocator.restore): the records that are one whole chunk,
 *   checked and made into Allocation objects without a Python step each. A restart of millions of
 *   2 MiB blocks spent 1.6 s in the Python loop. This does what that loop does for such a record, in
 *   the same order of checks and with the same message; every other record (a smaller block, several
 *   blocks, an older version's class) is left to the loop.
 * - the index's (mds/index.py, KVIndex.restore_columns): one Entry per restored block, as the Python
 *   comprehension makes them (400 ns an entry there).
 *
 * Both fill a __slots__ class's fields directly: the offsets come from the class's own member
 * descriptors, checked to be object slots, so a class that changes shape is refused, not misread.
 *
 *   alloc_restore_chunks(one, state, cls, base, start, end, chunk, ways, zone_size, zone_used)
 *       -> (restored, rest, used, requested)
 *   make_entries(cls, ns_ids, ns_of, keys, allocs, checksums, first_id, first_slot) -> [entries]
 */
#include "_native.h"

/* Where instances of `cls` keep the __slots__ member `name` (an object slot of `cls` or of a class it
 * derives from, inside the instance), or -1 (exception set). */
static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (!d) return -1;
    Py_ssize_t off = member_slot_offset((PyTypeObject *)cls, d);
    if (off < 0) PyErr_Format(PyExc_TypeError, "%s is not an object slot of the class", name);
    Py_DECREF(d);
    return off;
}

static inline uint64_t rd64a(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

/* alloc_restore_chunks(one, state, cls, base, start, end, chunk, ways, zone_size, zone_used):
 * `one` holds a u64 triple (nbytes, size, offset) per record (mds/allocator.py PackedShapes). Each
 * record of size `chunk` must start a chunk of the area [start, end) (`base`: where chunks are
 * counted from) that `state` (a byte per chunk from start's chunk number) has free: it is marked 255
 * and becomes cls.one(offset, chunk, nbytes); a record that does not is a ValueError (`state` and
 * `zone_used` may then be changed: the caller drops them). With ways > 1 its chunk is added to
 * zone_used[zone] (int64, one per zone of zone_size bytes from start). Returns (restored: a list with
 * the Allocation at each such record's place and None at the others, rest: the other places, used and
 * requested: the bytes of the records restored here). */
PyObject *py_alloc_restore_chunks(PyObject *self, PyObject *args) {
    Py_buffer one, st, zu;
    PyObject *cls;
    unsigned long long base, start, end, chunk, zone_size;
    Py_ssize_t ways;
    if (!PyArg_ParseTuple(args, "y*w*O!KKKKnKw*", &one, &st, &PyType_Type, &cls, &base, &start, &end, &chunk, &ways,
                          &zone_size, &zu))
        return NULL;
    PyObject *restored = NULL, *rest = NULL, *size_obj = NULL, *last_n = NULL, *out = NULL;
    PyTypeObject *tp = (PyTypeObject *)cls;
    Py_ssize_t o_nbytes = slot_offset(cls, "nbytes"), o_a = -1, o_b = -1;
    if (o_nbytes < 0 || (o_a = slot_offset(cls, "_a")) < 0 || (o_b = slot_offset(cls, "_b")) < 0) goto done;
    if (one.len % 24 || chunk == 0 || (chunk & (chunk - 1)) || start > end || ways < 1 ||
        (ways > 1 && zu.len < ways * 8)) {
        PyErr_SetString(PyExc_ValueError, "alloc_restore_chunks: bad arguments");
        goto done;
    }
    Py_ssize_t n = one.len / 24;
    const unsigned char *p = (const unsigned char *)one.buf;
    unsigned char *state = (unsigned char *)st.buf;
    int64_t *zone_used = (int64_t *)zu.buf;
    uint64_t first = start / chunk, used = 0, requested = 0;
    if (!(restored = PyList_New(n)) || !(rest = PyList_New(0)) || !(size_obj = PyLong_FromUnsignedLongLong(chunk)))
        goto done;
    unsigned long long last_v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t nbytes = rd64a(p + 24 * i), size = rd64a(p + 24 * i + 8), off = rd64a(p + 24 * i + 16);
        if (size != chunk) { /* the Python loop's */
            PyObject *at = PyLong_FromSsize_t(i);
            if (!at || PyList_Append(rest, at) < 0) { Py_XDECREF(at); goto done; }
            Py_DECREF(at);
            Py_INCREF(Py_None);
            PyList_SET_ITEM(restored, i, Py_None);
            continue;
        }
        uint64_t req;
        if (__builtin_add_overflow(requested, nbytes, &req)) { /* past 64 bits: Python's ints add it */
            PyObject *at = PyLong_FromSsize_t(i);
            if (!at || PyList_Append(rest, at) < 0) { Py_XDECREF(at); goto done; }
            Py_DECREF(at);
            PyList_SET_ITEM(restored, i, Py_NewRef(Py_None));
            continue;
        }
        uint64_t c = off / chunk - first; /* off >> CHUNK_SHIFT, less the zones' first chunk number */
        if (off < start || off >= end || (off - base) % chunk || c >= (uint64_t)st.len || state[c]) {
            PyErr_Format(PyExc_ValueError, "block (%llu, 0x%llx) is outside the area, misaligned or duplicated",
                         (unsigned long long)size, (unsigned long long)off);
            goto done;
        }
        state[c] = 255;
        if (ways > 1) {
            uint64_t z = zone_size ? (off - start) / zone_size : 0;
            zone_used[z < (uint64_t)ways - 1 ? z : (uint64_t)ways - 1] += (int64_t)chunk;
        }
        used += chunk;
        requested = req;
        PyObject *a = tp->tp_alloc(tp, 0);
        if (!a) goto done;
        PyList_SET_ITEM(restored, i, a);
        PyObject *offv = PyLong_FromUnsignedLongLong(off);
        if (!offv) goto done;
        if (!last_n || nbytes != last_v) { /* blocks of one size share their nbytes int */
            PyObject *v = PyLong_FromUnsignedLongLong(nbytes);
            if (!v) { Py_DECREF(offv); goto done; }
            Py_XSETREF(last_n, v);
            last_v = nbytes;
        }
        *(PyObject **)((char *)a + o_nbytes) = Py_NewRef(last_n);
        *(PyObject **)((char *)a + o_a) = offv;
        *(PyObject **)((char *)a + o_b) = Py_NewRef(size_obj);
    }
    out = Py_BuildValue("(OOKK)", restored, rest, (unsigned long long)used, (unsigned long long)requested);
done:
    Py_XDECREF(restored); Py_XDECREF(rest); Py_XDECREF(size_obj); Py_XDECREF(last_n);
    PyBuffer_Release(&one); PyBuffer_Release(&st); PyBuffer_Release(&zu);
    return out;
}

/* make_entries(cls, ns_ids, ns_of, keys, allocs, checksums, first_id, first_slot) -> entries:
 * entry i is cls(key=(ns_ids[ns_of[i]], keys[i]), alloc=allocs[i], leases=0, dead=False,
 * id=first_id + i, checksum=checksums[i] (None when checksums is None), slot=first_slot + i, gen=None),
 * made without calling cls. ns_of: u32 each (a buffer); keys: bytes; the columns of equal length, and
 * every ns_of inside ns_ids, or an error (nothing made). */
PyObject *py_make_entries(PyObject *self, PyObject *args) {
    PyObject *cls, *ns_ids, *keys, *allocs, *sums;
    Py_buffer nsb;
    long long first_id, first_slot;
    if (!PyArg_ParseTuple(args, "O!O!y*O!O!OLL", &PyType_Type, &cls, &PyList_Type, &ns_ids, &nsb, &PyList_Type, &keys,
                          &PyList_Type, &allocs, &sums, &first_id, &first_slot))
        return NULL;
    static const char *const fields[8] = {"key", "alloc", "leases", "dead", "id", "checksum", "slot", "gen"};
    Py_ssize_t off[8];
    PyObject *out = NULL, *zero = NULL;
    for (int f = 0; f < 8; f++)
        if ((off[f] = slot_offset(cls, fields[f])) < 0) goto done;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (sums != Py_None && !PyList_Check(sums)) {
        PyErr_SetString(PyExc_TypeError, "make_entries: checksums is neither a list nor None");
        goto done;
    }
    if (n > PY_SSIZE_T_MAX / 4 || nsb.len != n * 4 || first_id < 0 || first_slot < 0 || first_id > LLONG_MAX - n ||
        first_slot > LLONG_MAX - n)
        goto unequal;
    if (!(zero = PyLong_FromLong(0)) || !(out = PyList_New(n))) goto done;
    const uint32_t *ns_of = (const uint32_t *)nsb.buf;
    PyTypeObject *tp = (PyTypeObject *)cls;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Everything made first, then checked and read with no allocation between: an allocation may
         * run the cyclic GC, and with it Python code that could change the lists. */
        PyObject *key = PyTuple_New(2), *id = PyLong_FromLongLong(first_id + i);
        PyObject *slot = PyLong_FromLongLong(first_slot + i), *e = tp->tp_alloc(tp, 0);
        if (!key || !id || !slot || !e) {
            Py_XDECREF(key); Py_XDECREF(id); Py_XDECREF(slot); Py_XDECREF(e);
            goto fail;
        }
        if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(allocs) != n ||
            (sums != Py_None && PyList_GET_SIZE(sums) != n) || (Py_ssize_t)ns_of[i] >= PyList_GET_SIZE(ns_ids) ||
            !PyBytes_CheckExact(PyList_GET_ITEM(keys, i))) {
            Py_DECREF(key); Py_DECREF(id); Py_DECREF(slot); Py_DECREF(e);
            PyErr_Format(PyExc_ValueError,
                         "make_entries: entry %zd names namespace %u of %zd, its key is not bytes, or a column "
                         "changed length", i, ns_of[i], PyList_GET_SIZE(ns_ids));
            goto fail;
        }
        PyTuple_SET_ITEM(key, 0, Py_NewRef(PyList_GET_ITEM(ns_ids, ns_of[i])));
        PyTuple_SET_ITEM(key, 1, Py_NewRef(PyList_GET_ITEM(keys, i)));
        char *b = (char *)e;
        *(PyObject **)(b + off[0]) = key;
        *(PyObject **)(b + off[1]) = Py_NewRef(PyList_GET_ITEM(allocs, i));
        *(PyObject **)(b + off[2]) = Py_NewRef(zero);
        *(PyObject **)(b + off[3]) = Py_NewRef(Py_False);
        *(PyObject **)(b + off[4]) = id;
        *(PyObject **)(b + off[5]) = Py_NewRef(sums == Py_None ? Py_None : PyList_GET_ITEM(sums, i));
        *(PyObject **)(b + off[6]) = slot;
        *(PyObject **)(b + off[7]) = Py_NewRef(Py_None);
        PyList_SET_ITEM(out, i, e);
    }
    goto done;
unequal:
    PyErr_Format(PyExc_ValueError, "make_entries: columns of unequal length (or ids out of range) for %zd entries", n);
    goto done;
fail:
    Py_CLEAR(out);
done:
    Py_XDECREF(zero);
    PyBuffer_Release(&nsb);
    return out;
}
