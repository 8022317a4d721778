/* The pool's own speed (`belugactl bench pool`): a dependent pointer chase for load latency, a read
 * with each line invalidated first, and a non-temporal write, each over one range of a buffer.
 *
 * Python API (offsets bounds-checked; the GIL is released while timing, so threads run side by side):
 *   bench_chase(buf, off, n, steps, seed=1, chunk=0, stride=0, readonly=False) -> ns per load
 *       writable: a random cycle through every line of the range, one pointer stored in each line
 *       (it overwrites the range: scratch space only); readonly: a hashed chase that writes nothing,
 *       each load's address computed from the value the previous load returned, over a pseudo-random
 *       permutation of the range's first 2^k lines (a read-only mapping of a pool in use).
 *   bench_read(buf, off, n, flush=False, chunk=0, stride=0) -> ns
 *       one pass of 8-byte loads (after clflushopt of every line with flush); reads only
 *   bench_write_nt(buf, off, n, chunk=0, stride=0) -> ns
 *       one pass of non-temporal stores of zeros, then sfence (overwrites: scratch space only)
 *
 * chunk/stride: touch only the first `chunk` bytes of every `stride` bytes of the range (one memory
 * device of a hardware-interleaved region: granularity and ways x granularity); 0/0 touches all of it.
 * Both are multiples of 64 with chunk <= stride, and n a multiple of stride.
 */
#include "_native.h"

/* The range as chunks: `count` chunks of `chunk` bytes, `stride` apart, from p. */
typedef struct { char *p; size_t chunk, stride, count; } span_t;

static int get_span(Py_buffer *v, Py_ssize_t off, Py_ssize_t n, Py_ssize_t chunk, Py_ssize_t stride, span_t *s) {
    char *p;
    if (get_range(v, off, n, &p) < 0) return -1;
    if (chunk == 0 && stride == 0) {  /* the whole range, any length */
        s->p = p; s->chunk = s->stride = (size_t)n; s->count = n > 0;
        return 0;
    }
    if (chunk <= 0 || stride <= 0 || chunk > stride || chunk % LINE || stride % LINE || n % stride) {
        PyErr_SetString(PyExc_ValueError, "bench: chunk and stride multiples of 64, chunk <= stride, n a multiple of stride");
        return -1;
    }
    s->p = p; s->chunk = (size_t)chunk; s->stride = (size_t)stride; s->count = (size_t)(n / stride);
    return 0;
}

static inline char *line_at(const span_t *s, size_t i) {
    size_t per = s->chunk / LINE;
    return s->p + (i / per) * s->stride + (i % per) * LINE;
}

static void flush_span(const span_t *s, int for_read) {
    for (size_t c = 0; c < s->count; c++) flush_range(s->p + c * s->stride, s->chunk, for_read);
}

/* A bijection of [0, 2^bits): odd multiplies and xor-shifts, each invertible modulo 2^bits. */
static inline uint64_t permute(uint64_t x, unsigned bits, uint64_t mask) {
    x = (x * 0x9E3779B97F4A7C15ull) & mask;
    x ^= x >> ((bits + 1) / 2);
    x = (x * 0xBF58476D1CE4E5B9ull) & mask;
    x ^= x >> ((bits + 2) / 3);
    return x & mask;
}

static volatile uint64_t bench_zero = 0;  /* a 0 the compiler cannot see: the load's value feeds the next address */

PyObject *py_bench_chase(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n, steps, chunk = 0, stride = 0; unsigned long long seed = 1; int readonly = 0;
    span_t s;
    if (!PyArg_ParseTuple(args, "y*nnn|Knnp", &v, &off, &n, &steps, &seed, &chunk, &stride, &readonly)) return NULL;
    if (get_span(&v, off, n, chunk, stride, &s) < 0) { PyBuffer_Release(&v); return NULL; }
    size_t lines = s.count * (s.chunk / LINE);  /* a whole range's tail shorter than a line is left out */
    if (((uintptr_t)s.p & (LINE - 1)) || lines < 2 || steps < 1) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "bench_chase: a line-aligned range of at least two lines, and steps >= 1");
        return NULL;
    }
    if (!readonly && v.readonly) {
        PyBuffer_Release(&v);
        PyErr_SetString(PyExc_ValueError, "bench_chase: a read-only buffer needs readonly=True (the hashed chase)");
        return NULL;
    }
    size_t *order = NULL;
    if (!readonly) {
        order = (size_t *)malloc(lines * sizeof(size_t));
        if (!order) { PyBuffer_Release(&v); return PyErr_NoMemory(); }
    }
    uint64_t ns = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!readonly) {
        /* A random cyclic order (Sattolo), so neither the prefetcher nor the next line predicts a load. */
        for (size_t i = 0; i < lines; i++) order[i] = i;
        uint64_t x = seed ? seed : 1;
        for (size_t i = lines - 1; i > 0; i--) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t j = (size_t)(x % i);
            size_t t = order[i]; order[i] = order[j]; order[j] = t;
        }
        for (size_t i = 0; i < lines; i++) *(char **)line_at(&s, order[i]) = line_at(&s, order[(i + 1) % lines]);
        flush_span(&s, 0);
        full_fence();
        char *cur = line_at(&s, order[0]);
        uint64_t t0 = now_ns();
        for (Py_ssize_t k = 0; k < steps; k++) cur = *(char *volatile *)cur;
        ns = now_ns() - t0;
        __asm__ volatile("" : : "r"(cur));
    } else {
        unsigned bits = 0;
        while (bits < 63 && ((size_t)1 << (bits + 1)) <= lines) bits++;
        uint64_t mask = ((uint64_t)1 << bits) - 1, zero = bench_zero, k = seed, val = 0;
        flush_span(&s, 1);
        full_fence();
        uint64_t t0 = now_ns();
        for (Py_ssize_t i = 0; i < steps; i++) {
            k = k + 1 + (val & zero);  /* depends on the last load: no two loads overlap */
            val = *(const volatile uint64_t *)line_at(&s, (size_t)permute(k & mask, bits, mask));
        }
        ns = now_ns() - t0;
        __asm__ volatile("" : : "r"(val));
    }
    Py_END_ALLOW_THREADS
    free(order);
    PyBuffer_Release(&v);
    return PyFloat_FromDouble((double)ns / (double)steps);
}

PyObject *py_bench_read(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n, chunk = 0, stride = 0; int flush = 0; span_t s;
    if (!PyArg_ParseTuple(args, "y*nn|pnn", &v, &off, &n, &flush, &chunk, &stride)) return NULL;
    if (get_span(&v, off, n, chunk, stride, &s) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t sum = 0, ns;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns();
    if (flush) { flush_span(&s, 1); full_fence(); }
    for (size_t c = 0; c < s.count; c++) {
        const volatile uint64_t *w = (const volatile uint64_t *)(s.p + c * s.stride);
        for (size_t i = 0; i < s.chunk / 8; i++) sum += w[i];
    }
    ns = now_ns() - t0;
    Py_END_ALLOW_THREADS
    __asm__ volatile("" : : "r"(sum));
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(ns);
}

PyObject *py_bench_write_nt(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n, chunk = 0, stride = 0; span_t s;
    if (!PyArg_ParseTuple(args, "w*nn|nn", &v, &off, &n, &chunk, &stride)) return NULL;
    if (get_span(&v, off, n, chunk, stride, &s) < 0) { PyBuffer_Release(&v); return NULL; }
    static const char zeros[4096];
    uint64_t ns;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns();
    for (size_t c = 0; c < s.count; c++) {
        char *q = s.p + c * s.stride;
        for (size_t done = 0; done < s.chunk; done += 4096) {
            size_t k = s.chunk - done < 4096 ? s.chunk - done : 4096;
            nt_memcpy(q + done, zeros, k);
        }
    }
    store_fence();
    ns = now_ns() - t0;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(ns);
}
