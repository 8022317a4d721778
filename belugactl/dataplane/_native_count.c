/* The counting build's record of flushes, non-temporal stores, fences and pool copies
 * (`_native_counting`, compiled with -DBELUGA_COUNT_FLUSHES; empty in the normal build).
 *
 * Every hook in _native.h (COUNT) appends one record: kind, address, length. A record equal to the
 * one before it (a spin-wait flushing the same status word) only bumps that record's repeat count,
 * so a wait does not fill the buffer. The buffer is bounded; records past the end are counted as
 * lost and the tests refuse a recording that lost any. A mutex orders records from threads that
 * run with the GIL released (a server thread replying while a client waits).
 *
 * Python API (the counting module only):
 *   count_reset()                    forget every record
 *   count_records(buf) -> list        (kind, offset, length, repeats) of the records whose range
 *                                     meets `buf` (offsets relative to it, clipped to it), in order;
 *                                     fences are kept (offset 0, length 0) so order can be checked
 *   count_lost() -> int               records dropped because the buffer was full
 */
#include "_native.h"

#ifdef BELUGA_COUNT_FLUSHES
#include <pthread.h>

#define COUNT_CAP (1 << 16)

struct count_rec { uintptr_t addr; size_t n; uint32_t kind; uint32_t repeats; };

static struct count_rec records[COUNT_CAP];
static size_t nrecords = 0;
static unsigned long long lost = 0;
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;

void count_record(int kind, const void *p, size_t n) {
    pthread_mutex_lock(&count_lock);
    struct count_rec *last = nrecords ? &records[nrecords - 1] : NULL;
    if (last && last->kind == (uint32_t)kind && last->addr == (uintptr_t)p && last->n == n) {
        last->repeats++;
    } else if (nrecords < COUNT_CAP) {
        records[nrecords].addr = (uintptr_t)p;
        records[nrecords].n = n;
        records[nrecords].kind = (uint32_t)kind;
        records[nrecords].repeats = 1;
        nrecords++;
    } else {
        lost++;
    }
    pthread_mutex_unlock(&count_lock);
}

PyObject *py_count_reset(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&count_lock);
    nrecords = 0;
    lost = 0;
    pthread_mutex_unlock(&count_lock);
    Py_RETURN_NONE;
}

PyObject *py_count_lost(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&count_lock);
    unsigned long long v = lost;
    pthread_mutex_unlock(&count_lock);
    return PyLong_FromUnsignedLongLong(v);
}

PyObject *py_count_records(PyObject *self, PyObject *args) {
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "y*", &v)) return NULL;
    uintptr_t lo = (uintptr_t)v.buf, hi = lo + (uintptr_t)v.len;
    PyObject *out = PyList_New(0);
    if (!out) { PyBuffer_Release(&v); return NULL; }
    /* Copy under the lock, build Python objects after: a thread of ours may be recording. */
    pthread_mutex_lock(&count_lock);
    size_t count = nrecords;
    struct count_rec *copy = (struct count_rec *)malloc(sizeof(struct count_rec) * (count ? count : 1));
    if (copy) memcpy(copy, records, sizeof(struct count_rec) * count);
    pthread_mutex_unlock(&count_lock);
    if (!copy) { Py_DECREF(out); PyBuffer_Release(&v); return PyErr_NoMemory(); }
    for (size_t i = 0; i < count; i++) {
        struct count_rec *r = &copy[i];
        uintptr_t a = r->addr, e = r->addr + r->n;
        if (r->kind != COUNT_FENCE) {
            if (e <= lo || a >= hi) continue;
            if (a < lo) a = lo;
            if (e > hi) e = hi;
            a -= lo; e -= lo;
        } else {
            a = e = 0;
        }
        PyObject *t = Py_BuildValue("(IKKI)", r->kind, (unsigned long long)a, (unsigned long long)(e - a), r->repeats);
        if (!t || PyList_Append(out, t) < 0) { Py_XDECREF(t); Py_CLEAR(out); break; }
        Py_DECREF(t);
    }
    free(copy);
    PyBuffer_Release(&v);
    return out;
}
#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int beluga_count_unused;
#endif
