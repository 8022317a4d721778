/* The pool's own speed (`belugactl bench pool`): a dependent pointer chase for load latency, a read
 * with each line invalidated first, and a non-temporal write, each over one range of a buffer.
 * They overwrite the bytes they measure: the caller gives them scratch space only.
 *
 * Python API (offsets bounds-checked; the GIL is released while timing, so threads run side by side):
 *   bench_chase(buf, off, n, steps, seed) -> ns per load    a random cycle through every line of the range
 *   bench_read(buf, off, n, flush) -> ns                    one pass of 8-byte loads (after clflushopt per line with flush)
 *   bench_write_nt(buf, off, n) -> ns                       one pass of non-temporal stores, then sfence
 */
#include "_native.h"

PyObject *py_bench_chase(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n, steps; unsigned long long seed = 1; char *p;
    if (!PyArg_ParseTuple(args, "w*nnn|K", &v, &off, &n, &steps, &seed)) return NULL;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    if (((uintptr_t)p & (LINE - 1)) || n < 2 * LINE || steps < 1) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "bench_chase: a line-aligned range of at least two lines, and steps >= 1");
        return NULL;
    }
    size_t lines = (size_t)n / LINE;
    size_t *order = (size_t *)malloc(lines * sizeof(size_t));
    if (!order) { PyBuffer_Release(&v); return PyErr_NoMemory(); }
    uint64_t ns = 0;
    Py_BEGIN_ALLOW_THREADS
    /* A random cyclic order (Sattolo), so neither the prefetcher nor the next line predicts a load. */
    for (size_t i = 0; i < lines; i++) order[i] = i;
    uint64_t x = seed ? seed : 1;
    for (size_t i = lines - 1; i > 0; i--) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t j = (size_t)(x % i);
        size_t t = order[i]; order[i] = order[j]; order[j] = t;
    }
    for (size_t i = 0; i < lines; i++) *(char **)(p + order[i] * LINE) = p + order[(i + 1) % lines] * LINE;
    flush_range(p, (size_t)n, 0);
    full_fence();
    char *cur = p;
    uint64_t t0 = now_ns();
    for (Py_ssize_t s = 0; s < steps; s++) cur = *(char *volatile *)cur;
    ns = now_ns() - t0;
    __asm__ volatile("" : : "r"(cur));
    Py_END_ALLOW_THREADS
    free(order);
    PyBuffer_Release(&v);
    return PyFloat_FromDouble((double)ns / (double)steps);
}

PyObject *py_bench_read(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n; int flush = 0; char *p;
    if (!PyArg_ParseTuple(args, "y*nn|p", &v, &off, &n, &flush)) return NULL;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t sum = 0, ns;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns();
    if (flush) { flush_range(p, (size_t)n, 1); full_fence(); }
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < (size_t)n / 8; i++) sum += ((const volatile uint64_t *)w)[i];
    ns = now_ns() - t0;
    Py_END_ALLOW_THREADS
    __asm__ volatile("" : : "r"(sum));
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(ns);
}

PyObject *py_bench_write_nt(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n; char *p;
    if (!PyArg_ParseTuple(args, "w*nn", &v, &off, &n)) return NULL;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    static const char zeros[4096];
    uint64_t ns;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns();
    for (Py_ssize_t done = 0; done < n; done += 4096) {
        size_t k = (size_t)(n - done < 4096 ? n - done : 4096);
        nt_memcpy(p + done, zeros, k);
    }
    store_fence();
    ns = now_ns() - t0;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(ns);
}
