/* The allocator's restart in C (mds/allocator.py, Allocator.restore): the records that are one whole
 * chunk, checked and made into Allocation objects without a Python step each.
 *
 * A restart of millions of 2 MiB blocks spent 1.6 s in the Python loop (docs/measurements.md). This
 * does what that loop does for such a record, in the same order of checks and with the same message;
 * every other record (a smaller block, several blocks, an older version's class) is left to the loop.
 *
 *   alloc_restore_chunks(one, state, cls, base, start, end, chunk, ways, zone_size, zone_used)
 *       -> (restored, rest, used, requested)
 */
#include "_native.h"
#include <structmember.h>

/* Where instances of `cls` keep the __slots__ member `name` (an object slot), or -1 (exception set). */
static Py_ssize_t slot_offset(PyObject *cls, const char *name) {
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (!d) return -1;
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX)
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    else
        PyErr_Format(PyExc_TypeError, "%s is not an object slot of the class", name);
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
        requested += nbytes;
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
