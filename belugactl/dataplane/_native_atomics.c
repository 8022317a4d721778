/* 64-bit atomics on mapped memory and bounded spin-waits on status words. */
#include "_native.h"

PyObject *py_load64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; uint64_t *w;
    if (!PyArg_ParseTuple(args, "y*n", &v, &off)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t x = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(x);
}

PyObject *py_store64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long x; int flush = 0; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nK|p", &v, &off, &x, &flush)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    __atomic_store_n(w, (uint64_t)x, __ATOMIC_RELEASE);
    if (flush) { flush_range((char *)w, 8, 0); full_fence(); }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

PyObject *py_cas64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long expected, desired; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nKK", &v, &off, &expected, &desired)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t e = expected;
    __atomic_compare_exchange_n(w, &e, (uint64_t)desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(e); /* the value seen: equals `expected` on success */
}

PyObject *py_fetch_add64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long add; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nK", &v, &off, &add)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t old = __atomic_fetch_add(w, (uint64_t)add, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(old);
}

/* Spin until the word at `off` equals `value` or `timeout_ns` passes; return the last value
 * seen. With `flush`, evict the line before each load (a reader on a non-coherent pool). */
PyObject *py_wait64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long value, timeout_ns; int flush = 0; uint64_t *w;
    if (!PyArg_ParseTuple(args, "y*nKK|p", &v, &off, &value, &timeout_ns, &flush)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t x;
    Py_BEGIN_ALLOW_THREADS
    x = spin_wait_u64(w, value, flush, timeout_ns, 0);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(x);
}

/* Checks a set of word offsets (int64 buffer) against the buffer: each 8-byte aligned and inside. */
static int check_words(Py_buffer *v, Py_buffer *ov) {
    if (ov->len % 8 != 0) { PyErr_SetString(PyExc_ValueError, "offsets must be int64"); return -1; }
    const int64_t *offs = (const int64_t *)ov->buf;
    for (Py_ssize_t i = 0; i < ov->len / 8; i++) {
        if (offs[i] < 0 || offs[i] > v->len - 8 || (((uintptr_t)v->buf + offs[i]) & 7)) {
            PyErr_Format(PyExc_ValueError, "word offset %lld is outside the buffer or unaligned", (long long)offs[i]);
            return -1;
        }
    }
    return 0;
}

/* The index of the first word at `offs` that holds `value`, or -1 (one look at each). */
static Py_ssize_t first_equal(char *base, const int64_t *offs, Py_ssize_t count, uint64_t value, int flush) {
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t *w = (uint64_t *)(base + offs[i]);
        if (flush) { flush_range((char *)w, 8, 1); full_fence(); }
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == value) return i;
    }
    return -1;
}

/* Spin over a set of word offsets (int64 buffer) until one equals `value`; return its index,
 * or -1 after `timeout_ns`. The metadata server keeps one offset per ring (its cursor slot). */
PyObject *py_wait_any(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long value, timeout_ns; int flush = 0;
    if (!PyArg_ParseTuple(args, "y*y*KK|p", &v, &ov, &value, &timeout_ns, &flush)) return NULL;
    PyObject *result = NULL;
    if (check_words(&v, &ov) < 0) goto done;
    Py_ssize_t count = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    Py_ssize_t found = -1;
    Py_BEGIN_ALLOW_THREADS
    uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        found = first_equal((char *)v.buf, offs, count, value, flush);
        if (found >= 0 || now_ns() >= deadline) break;
        cpu_relax();
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(found);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return result;
}

/* idle_wait_any(buf, offsets_int64, value, timeout_ns, sleep_ns, flush=False, fd=-1) -> index, -1 or -2
 * wait_any for a waiter that must not hold a core: look at every word, then sleep `sleep_ns`, until
 * one equals `value` (its index), `fd` (when not -1) is readable (-2), or `timeout_ns` passed (-1,
 * after one last look; also when a signal arrives). The metadata server's idle wait, with its
 * socket selector's epoll fd as `fd`: rings looked at every `sleep_ns` in C (a look costs far less
 * than a turn of its Python loop), a TCP connection or request answered at once. The sleeps run
 * with a 1 us timer slack (restored after): Linux's default 50 us would stretch a 0.5 ms sleep by
 * a tenth and a 0.1 ms one by half. */
PyObject *py_idle_wait_any(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long value, timeout_ns, sleep_ns; int flush = 0, fd = -1;
    if (!PyArg_ParseTuple(args, "y*y*KKK|pi", &v, &ov, &value, &timeout_ns, &sleep_ns, &flush, &fd)) return NULL;
    PyObject *result = NULL;
    if (check_words(&v, &ov) < 0) goto done;
    if (sleep_ns == 0 || sleep_ns > 1000000000ull) { PyErr_SetString(PyExc_ValueError, "sleep_ns must be in (0, 1 s]"); goto done; }
    if (fd < -1) { PyErr_SetString(PyExc_ValueError, "fd must be a file descriptor or -1"); goto done; }
    Py_ssize_t count = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    Py_ssize_t found = -1;
    int bad_fd = 0;
    Py_BEGIN_ALLOW_THREADS
    int slack = idle_slack_begin();
    uint64_t deadline = now_ns() + timeout_ns;
    struct pollfd pfd = {fd, POLLIN, 0};
    for (;;) {
        found = first_equal((char *)v.buf, offs, count, value, flush);
        if (found >= 0 || now_ns() >= deadline) break;
        int got = idle_step(&pfd, sleep_ns);
        if (got < 0) break; /* a signal ends the wait (as a timeout): the caller's handlers run at once */
        if (got > 0) { bad_fd = got == 2; found = -2; break; }
    }
    idle_slack_end(slack);
    Py_END_ALLOW_THREADS
    if (bad_fd) { PyErr_Format(PyExc_ValueError, "fd %d is not open", fd); goto done; }
    result = PyLong_FromSsize_t(found);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return result;
}
