/*
 * belugactl.dataplane._native: the few instructions Python cannot issue.
 *
 * CXL 2.0 gives no coherence between hosts, so software publishes data by writing it with
 * non-temporal stores (or flushing the lines it wrote) and fencing before it flips a status
 * word, and consumes it by flushing the lines before loading them. This module provides exactly
 * that, plus 64-bit atomics on mapped memory, bounded spin-waits on a status word, and a
 * gather/scatter copy of many pieces in one call.
 *
 * Every function takes a Python buffer (an mmap, a memoryview, a bytearray) and byte offsets,
 * and bounds-checks them: a bad offset raises ValueError, it never touches memory outside the
 * buffer. Long operations release the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>

#if defined(__x86_64__) || defined(__i386__)
#define BELUGA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define BELUGA_X86 0
#endif

#define LINE 64

static int have_clflushopt = 0;
static int have_clwb = 0;
static int have_sse2 = 0;
static int have_avx2 = 0;
static int have_clflush = 0;
/* The non-temporal copy's kernel: AVX2 where cpuid has it, unless BELUGACTL_NATIVE_AVX2=0 (tests
 * of the SSE2 kernel on an AVX2 machine). */
static int nt_avx2 = 0;

static void detect_cpu(void) {
#if BELUGA_X86
    unsigned int a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        have_clflush = (d >> 19) & 1;
        have_sse2 = (d >> 26) & 1;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        have_avx2 = (b >> 5) & 1;
        have_clflushopt = (b >> 23) & 1;
        have_clwb = (b >> 24) & 1;
    }
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* After this long spinning, yield the CPU between polls: on a machine with more runnable
 * threads than cores, the peer we wait for may need our core to answer at all. */
#define SPIN_BEFORE_YIELD_NS 20000ull

static inline void cpu_relax(void) {
#if BELUGA_X86
    _mm_pause();
#endif
}

static inline void full_fence(void) {
#if BELUGA_X86
    _mm_mfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static inline void store_fence(void) {
#if BELUGA_X86
    _mm_sfence();
#else
    __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

/* Write back (and for readers, invalidate) every line of [p, p+n). clwb keeps the line cached,
 * which is right for a writer; a reader must evict the line, so it never uses clwb. */
static void flush_range(const char *p, size_t n, int for_read) {
#if BELUGA_X86
    if (n == 0) return;
    uintptr_t start = (uintptr_t)p & ~(uintptr_t)(LINE - 1);
    uintptr_t end = (uintptr_t)p + n;
    if (!for_read && have_clwb) {
        for (uintptr_t a = start; a < end; a += LINE) __asm__ volatile("clwb %0" : "+m"(*(volatile char *)a));
    } else if (have_clflushopt) {
        for (uintptr_t a = start; a < end; a += LINE) __asm__ volatile("clflushopt %0" : "+m"(*(volatile char *)a));
    } else if (have_clflush) {
        for (uintptr_t a = start; a < end; a += LINE) __asm__ volatile("clflush %0" : "+m"(*(volatile char *)a));
    }
#else
    (void)p; (void)n; (void)for_read;
#endif
}

/* Non-temporal copy of a 64-byte-aligned destination body of `n` bytes (a multiple of 64).
 * Like glibc's large-copy path: four 4 KiB pages are streamed side by side (one DRAM page
 * opened per stream, and the hardware prefetcher sees four steady streams instead of restarting
 * at every page) with a software prefetch a few lines ahead of each. On this machine that is
 * 1.3 to 1.4x a plain one-stream loop for 32 KiB pieces (glibc does the same for one big copy,
 * so without it a gather of pieces cannot keep up with one memcpy of the same bytes). */
#define NT_PAGE 4096
#define NT_GROUP (4 * NT_PAGE)
#if BELUGA_X86
__attribute__((target("avx2"))) static void nt_body_avx2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + NT_GROUP <= n; i += NT_GROUP) {
        for (size_t o = 0; o < NT_PAGE; o += 128) {
            for (int p = 0; p < 4; p++) {
                const char *ss = s + i + (size_t)p * NT_PAGE + o;
                char *dd = d + i + (size_t)p * NT_PAGE + o;
                _mm_prefetch(ss + 256, _MM_HINT_T0);
                _mm_prefetch(ss + 320, _MM_HINT_T0);
                __m256i x0 = _mm256_loadu_si256((const __m256i *)ss);
                __m256i x1 = _mm256_loadu_si256((const __m256i *)(ss + 32));
                __m256i x2 = _mm256_loadu_si256((const __m256i *)(ss + 64));
                __m256i x3 = _mm256_loadu_si256((const __m256i *)(ss + 96));
                _mm256_stream_si256((__m256i *)dd, x0);
                _mm256_stream_si256((__m256i *)(dd + 32), x1);
                _mm256_stream_si256((__m256i *)(dd + 64), x2);
                _mm256_stream_si256((__m256i *)(dd + 96), x3);
            }
        }
    }
    for (; i < n; i += 64) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), x0);
        _mm256_stream_si256((__m256i *)(d + i + 32), x1);
    }
}

static inline void nt_line_sse2(char *d, const char *s) {
    __m128i x0 = _mm_loadu_si128((const __m128i *)s);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, x0);
    _mm_stream_si128((__m128i *)(d + 16), x1);
    _mm_stream_si128((__m128i *)(d + 32), x2);
    _mm_stream_si128((__m128i *)(d + 48), x3);
}

static void nt_body_sse2(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + NT_GROUP <= n; i += NT_GROUP) {
        for (size_t o = 0; o < NT_PAGE; o += 64) {
            for (int p = 0; p < 4; p++) {
                const char *ss = s + i + (size_t)p * NT_PAGE + o;
                _mm_prefetch(ss + 256, _MM_HINT_T0);
                nt_line_sse2(d + i + (size_t)p * NT_PAGE + o, ss);
            }
        }
    }
    for (; i < n; i += 64) nt_line_sse2(d + i, s + i);
}
#endif

static void nt_memcpy(char *dst, const char *src, size_t n) {
#if BELUGA_X86
    /* Plain stores up to a cache-line boundary, streaming stores for the body, plain stores for
     * the tail; the plain parts are then written back so no line of the range lingers dirty. */
    size_t head = (LINE - ((uintptr_t)dst & (LINE - 1))) & (LINE - 1);
    if (head > n) head = n;
    if (head) { memcpy(dst, src, head); flush_range(dst, head, 0); }
    char *d = dst + head;
    const char *s = src + head;
    size_t body = (n - head) & ~(size_t)(LINE - 1);
    if (body) {
        if (nt_avx2) nt_body_avx2(d, s, body);
        else nt_body_sse2(d, s, body);
    }
    size_t tail = n - head - body;
    if (tail) { memcpy(d + body, s + body, tail); flush_range(d + body, tail, 0); }
#else
    memcpy(dst, src, n);
#endif
}

/* ---- argument helpers ------------------------------------------------------------------- */

static int get_range(Py_buffer *view, Py_ssize_t off, Py_ssize_t n, char **out) {
    if (off < 0 || n < 0 || off > view->len || n > view->len - off) {
        PyErr_Format(PyExc_ValueError, "range [%zd, +%zd) outside a buffer of %zd bytes", off, n, view->len);
        return -1;
    }
    *out = (char *)view->buf + off;
    return 0;
}

static int get_word(Py_buffer *view, Py_ssize_t off, uint64_t **out) {
    char *p;
    if (get_range(view, off, 8, &p) < 0) return -1;
    if (((uintptr_t)p & 7) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not 8-byte aligned in memory", off);
        return -1;
    }
    *out = (uint64_t *)p;
    return 0;
}

/* ---- functions -------------------------------------------------------------------------- */

static PyObject *py_features(PyObject *self, PyObject *noargs) {
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O,s:O,s:s,s:s}",
        "x86", BELUGA_X86 ? Py_True : Py_False,
        "clflush", have_clflush ? Py_True : Py_False,
        "clflushopt", have_clflushopt ? Py_True : Py_False,
        "clwb", have_clwb ? Py_True : Py_False,
        "sse2", have_sse2 ? Py_True : Py_False,
        "avx2", have_avx2 ? Py_True : Py_False,
        "flush", !BELUGA_X86 ? "none" : have_clwb ? "clwb" : have_clflushopt ? "clflushopt" : have_clflush ? "clflush" : "none",
        "nt_copy", !BELUGA_X86 ? "memcpy" : nt_avx2 ? "avx2" : "sse2");
}

static PyObject *py_flush(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n; int for_read = 0; char *p;
    if (!PyArg_ParseTuple(args, "y*nn|p", &v, &off, &n, &for_read)) return NULL;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    flush_range(p, (size_t)n, for_read);
    full_fence();
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *py_fence(PyObject *self, PyObject *noargs) {
    full_fence();
    Py_RETURN_NONE;
}

static PyObject *py_copy(PyObject *self, PyObject *args) {
    Py_buffer d, s; Py_ssize_t doff, soff, n; int nt = 0; char *dp, *sp;
    if (!PyArg_ParseTuple(args, "w*ny*nn|p", &d, &doff, &s, &soff, &n, &nt)) return NULL;
    if (get_range(&d, doff, n, &dp) < 0 || get_range(&s, soff, n, &sp) < 0) {
        PyBuffer_Release(&d); PyBuffer_Release(&s); return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (nt) { nt_memcpy(dp, sp, (size_t)n); store_fence(); }
    else memmove(dp, sp, (size_t)n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&d); PyBuffer_Release(&s);
    Py_RETURN_NONE;
}

/* pieces: a buffer of int64 (src_off, dst_off, len) triples (array('q'), numpy int64). */
static PyObject *py_gather(PyObject *self, PyObject *args) {
    Py_buffer d, s, pv; int nt = 0;
    if (!PyArg_ParseTuple(args, "w*y*y*|p", &d, &s, &pv, &nt)) return NULL;
    PyObject *result = NULL;
    if (pv.len % 24 != 0) {
        PyErr_SetString(PyExc_ValueError, "pieces must be int64 triples (src_off, dst_off, len)");
        goto done;
    }
    Py_ssize_t count = pv.len / 24;
    const int64_t *t = (const int64_t *)pv.buf;
    long long total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t so = t[3 * i], dof = t[3 * i + 1], n = t[3 * i + 2];
        if (so < 0 || dof < 0 || n < 0 || so > s.len || n > s.len - so || dof > d.len || n > d.len - dof) {
            PyErr_Format(PyExc_ValueError, "piece %zd (%lld, %lld, %lld) is outside the buffers", i,
                         (long long)so, (long long)dof, (long long)n);
            goto done;
        }
        total += n;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        char *dp = (char *)d.buf + t[3 * i + 1];
        const char *sp = (const char *)s.buf + t[3 * i];
        if (nt) nt_memcpy(dp, sp, (size_t)t[3 * i + 2]);
        else memcpy(dp, sp, (size_t)t[3 * i + 2]);
    }
    if (nt) store_fence();
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(total);
done:
    PyBuffer_Release(&d); PyBuffer_Release(&s); PyBuffer_Release(&pv);
    return result;
}

/* gather_blocks(pool, tensors, template, blocks, save, nontemporal) -> bytes copied.
 * The KV copy engine's batch in one call, planned here rather than in Python (planning 128
 * pieces per block in Python cost a fifth of the copy time). template: int64 triples per piece
 * of a block (offset of block 0's piece in `tensors`, bytes from one block's piece to the next,
 * length); a block is its pieces back to back in the pool. blocks: int64 pairs (block id, pool
 * offset). save copies tensors -> pool, else pool -> tensors. Every piece is bounds-checked
 * before any byte moves; pieces that continue the previous one in both buffers are copied as
 * one. */
typedef struct { char *dst; const char *src; size_t n; } piece_t;

static PyObject *py_gather_blocks(PyObject *self, PyObject *args) {
    Py_buffer pool, ten, tv, bv; int save = 0, nt = 0;
    if (!PyArg_ParseTuple(args, "w*w*y*y*pp", &pool, &ten, &tv, &bv, &save, &nt)) return NULL;
    PyObject *result = NULL;
    piece_t *pieces = NULL;
    if (tv.len % 24 != 0 || bv.len % 16 != 0) {
        PyErr_SetString(PyExc_ValueError, "template must be int64 triples and blocks int64 pairs");
        goto done;
    }
    Py_ssize_t nseg = tv.len / 24, nblk = bv.len / 16;
    const int64_t *tpl = (const int64_t *)tv.buf, *blk = (const int64_t *)bv.buf;
    int64_t block_nbytes = 0;
    for (Py_ssize_t k = 0; k < nseg; k++) {
        if (tpl[3 * k] < 0 || tpl[3 * k + 1] < 0 || tpl[3 * k + 2] < 0 ||
            __builtin_add_overflow(block_nbytes, tpl[3 * k + 2], &block_nbytes)) {
            PyErr_Format(PyExc_ValueError, "template piece %zd is negative or too long", k);
            goto done;
        }
    }
    if (nseg && nblk > PY_SSIZE_T_MAX / nseg / (Py_ssize_t)sizeof(piece_t)) { PyErr_NoMemory(); goto done; }
    pieces = PyMem_Malloc((size_t)(nseg * nblk > 0 ? nseg * nblk : 1) * sizeof(piece_t));
    if (!pieces) { PyErr_NoMemory(); goto done; }
    Py_ssize_t count = 0;
    long long total = 0;
    for (Py_ssize_t b = 0; b < nblk; b++) {
        int64_t id = blk[2 * b], poff = blk[2 * b + 1], end;
        if (id < 0 || poff < 0 || __builtin_add_overflow(poff, block_nbytes, &end) || end > pool.len) {
            PyErr_Format(PyExc_ValueError, "block %lld at pool offset %lld (%lld bytes) is outside the pool of %zd bytes",
                         (long long)id, (long long)poff, (long long)block_nbytes, pool.len);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nseg; k++) {
            int64_t toff, tend, n = tpl[3 * k + 2];
            if (__builtin_mul_overflow(id, tpl[3 * k + 1], &toff) || __builtin_add_overflow(toff, tpl[3 * k], &toff) ||
                __builtin_add_overflow(toff, n, &tend) || tend > ten.len) {
                PyErr_Format(PyExc_ValueError, "block %lld piece %zd is outside the tensors (%zd bytes)",
                             (long long)id, k, ten.len);
                goto done;
            }
            char *tp = (char *)ten.buf + toff, *pp = (char *)pool.buf + poff;
            char *dp = save ? pp : tp;
            const char *sp = save ? tp : pp;
            poff += n;
            total += n;
            if (n == 0) continue;
            if (count && pieces[count - 1].dst + pieces[count - 1].n == dp && pieces[count - 1].src + pieces[count - 1].n == sp) {
                pieces[count - 1].n += (size_t)n;
                continue;
            }
            pieces[count].dst = dp; pieces[count].src = sp; pieces[count].n = (size_t)n;
            count++;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        if (nt) nt_memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
        else memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
    }
    if (nt) store_fence();
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(total);
done:
    PyMem_Free(pieces);
    PyBuffer_Release(&pool); PyBuffer_Release(&ten); PyBuffer_Release(&tv); PyBuffer_Release(&bv);
    return result;
}

static PyObject *py_load64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; uint64_t *w;
    if (!PyArg_ParseTuple(args, "y*n", &v, &off)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t x = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(x);
}

static PyObject *py_store64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long x; int flush = 0; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nK|p", &v, &off, &x, &flush)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    __atomic_store_n(w, (uint64_t)x, __ATOMIC_RELEASE);
    if (flush) { flush_range((char *)w, 8, 0); full_fence(); }
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *py_cas64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long expected, desired; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nKK", &v, &off, &expected, &desired)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t e = expected;
    __atomic_compare_exchange_n(w, &e, (uint64_t)desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(e); /* the value seen: equals `expected` on success */
}

static PyObject *py_fetch_add64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long add; uint64_t *w;
    if (!PyArg_ParseTuple(args, "w*nK", &v, &off, &add)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t old = __atomic_fetch_add(w, (uint64_t)add, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(old);
}

/* Spin until the word at `off` equals `value` or `timeout_ns` passes; return the last value
 * seen. With `flush`, evict the line before each load (a reader on a non-coherent pool). */
static PyObject *py_wait64(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off; unsigned long long value, timeout_ns; int flush = 0; uint64_t *w;
    if (!PyArg_ParseTuple(args, "y*nKK|p", &v, &off, &value, &timeout_ns, &flush)) return NULL;
    if (get_word(&v, off, &w) < 0) { PyBuffer_Release(&v); return NULL; }
    uint64_t x;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns(), deadline = t0 + timeout_ns;
    unsigned spins = 0;
    for (;;) {
        if (flush) { flush_range((char *)w, 8, 1); full_fence(); }
        x = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        if (x == value) break;
        if ((++spins & 63) == 0) {
            uint64_t t = now_ns();
            if (t >= deadline) break;
            if (t - t0 > SPIN_BEFORE_YIELD_NS) sched_yield();
        }
        cpu_relax();
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLongLong(x);
}

/* Spin over a set of word offsets (int64 buffer) until one equals `value`; return its index,
 * or -1 after `timeout_ns`. The metadata server keeps one offset per ring (its cursor slot). */
static PyObject *py_wait_any(PyObject *self, PyObject *args) {
    Py_buffer v, ov; unsigned long long value, timeout_ns; int flush = 0;
    if (!PyArg_ParseTuple(args, "y*y*KK|p", &v, &ov, &value, &timeout_ns, &flush)) return NULL;
    PyObject *result = NULL;
    if (ov.len % 8 != 0) { PyErr_SetString(PyExc_ValueError, "offsets must be int64"); goto done; }
    Py_ssize_t count = ov.len / 8;
    const int64_t *offs = (const int64_t *)ov.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (offs[i] < 0 || offs[i] > v.len - 8 || (((uintptr_t)v.buf + offs[i]) & 7)) {
            PyErr_Format(PyExc_ValueError, "word offset %lld is outside the buffer or unaligned", (long long)offs[i]);
            goto done;
        }
    }
    Py_ssize_t found = -1;
    Py_BEGIN_ALLOW_THREADS
    uint64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        for (Py_ssize_t i = 0; i < count; i++) {
            uint64_t *w = (uint64_t *)((char *)v.buf + offs[i]);
            if (flush) { flush_range((char *)w, 8, 1); full_fence(); }
            if (__atomic_load_n(w, __ATOMIC_ACQUIRE) == value) { found = i; break; }
        }
        if (found >= 0 || now_ns() >= deadline) break;
        cpu_relax();
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(found);
done:
    PyBuffer_Release(&v); PyBuffer_Release(&ov);
    return result;
}

/* ---- CXL-RPC slot operations (the hot path; see rpc/slots.py for the Python twins) -------
 * Slot header, little-endian: u64 status, u64 seq, u32 magic, u32 epoch, u16 op, u16 code,
 * u32 length, then the payload. */

#define HDR 32
#define ST_FREE 0
#define ST_REQ 1
#define ST_RESP 2
#define RPC_MAGIC 0x554C4542u

struct slot_hdr { uint64_t status; uint64_t seq; uint32_t magic; uint32_t epoch; uint16_t op; uint16_t code; uint32_t length; };

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
        uint64_t t0 = now_ns(), deadline = t0 + timeout_ns;
        for (;;) {
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            st = __atomic_load_n(&h->status, __ATOMIC_ACQUIRE);
            if (st == ST_RESP) break;
            if ((++spins & 63) == 0) {
                uint64_t t = now_ns();
                if (t >= deadline) break;
                if (t - t0 > SPIN_BEFORE_YIELD_NS) sched_yield();
            }
            cpu_relax();
        }
        Py_END_ALLOW_THREADS
    }
    return st;
}

static void publish(char *slot, uint64_t seq, uint32_t epoch, uint16_t op, uint16_t code, const char *payload,
                    size_t n, uint64_t status, int flush) {
    struct slot_hdr *h = (struct slot_hdr *)slot;
    memcpy(slot + HDR, payload, n);
    h->seq = seq; h->magic = RPC_MAGIC; h->epoch = epoch; h->op = op; h->code = code; h->length = (uint32_t)n;
    if (flush) { flush_range(slot, HDR + n, 0); full_fence(); }
    else __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h->status, status, __ATOMIC_RELEASE);
    if (flush) { flush_range(slot, 8, 0); full_fence(); }
}

static int get_slot(Py_buffer *v, Py_ssize_t off, Py_ssize_t need, char **out) {
    if (get_range(v, off, need, out) < 0) return -1;
    if (((uintptr_t)*out & 7) != 0) { PyErr_SetString(PyExc_ValueError, "slot is not 8-byte aligned"); return -1; }
    return 0;
}

/* rpc_post(buf, off, seq, epoch, op, payload, flush) */
static PyObject *py_rpc_post(PyObject *self, PyObject *args) {
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
static PyObject *py_rpc_wait_reply(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, maxp; unsigned long long seq, timeout_ns; int flush = 0; char *slot;
    if (!PyArg_ParseTuple(args, "w*nKnK|p", &v, &off, &seq, &maxp, &timeout_ns, &flush)) return NULL;
    PyObject *r = NULL;
    if (maxp < 0 || get_slot(&v, off, HDR + maxp, &slot) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative max_payload");
        goto done;
    }
    struct slot_hdr *h = (struct slot_hdr *)slot;
    uint64_t st = wait_for_reply(h, slot, flush, timeout_ns);
    if (st != ST_RESP) { r = Py_None; Py_INCREF(r); goto done; }
    if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
    if (h->magic != RPC_MAGIC || h->seq != seq || h->length > (uint64_t)maxp) {
        PyErr_Format(PyExc_ValueError, "malformed reply (magic %#x, seq %llu for %llu, length %u)", h->magic,
                     (unsigned long long)h->seq, seq, h->length);
        __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
        goto done;
    }
    r = Py_BuildValue("(IIy#)", (unsigned)h->code, (unsigned)h->epoch, slot + HDR, (Py_ssize_t)h->length);
    __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
    if (flush) { flush_range(slot, 8, 0); full_fence(); }
done:
    PyBuffer_Release(&v);
    return r;
}

/* rpc_take(buf, offsets_int64, start, max_payload, timeout_ns, flush)
 *   -> (index, seq, magic, epoch, op, length, payload | None) | None */
static PyObject *py_rpc_take(PyObject *self, PyObject *args) {
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
static PyObject *py_rpc_reply(PyObject *self, PyObject *args) {
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

/* ---- the metadata server's lookup fast path ---------------------------------------------
 * A C mirror of the index's visible keys ((namespace id, key) -> entry id), kept in step by the
 * Python index on every commit and removal, lets `fast_serve` answer LOOKUP_PREFIX and PING
 * requests straight from the rings without entering Python. Anything else (another opcode, a
 * reconnecting client, a malformed slot, a key longer than FI_KEY) stops the burst and is handed
 * back to the Python server, which answers it the slow, general way. Leases granted here are
 * appended to a log the Python index applies before it does anything else, so eviction always
 * sees them. */

#define FI_KEY 64

typedef struct {
    uint64_t hash;
    int64_t id;
    uint32_t ns;
    uint16_t klen;
    uint8_t state; /* 0 empty, 1 used, 2 deleted */
    uint8_t key[FI_KEY];
    uint8_t *get_reply; /* the GET reply payload (lease id at bytes 0..8 patched per request), or NULL */
    uint32_t get_len;
} fi_slot;

typedef struct {
    fi_slot *slots;
    size_t cap; /* power of two */
    size_t used;
    size_t tombs;
} FastIndex;

static uint64_t fi_hash(uint32_t ns, const uint8_t *k, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull ^ ns;
    for (size_t i = 0; i < n; i++) { h ^= k[i]; h *= 0x100000001b3ull; }
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h | 1; /* never 0 */
}

static fi_slot *fi_find(FastIndex *fi, uint32_t ns, const uint8_t *k, size_t n, uint64_t h) {
    size_t mask = fi->cap - 1;
    for (size_t i = h & mask, probes = 0; probes < fi->cap; i = (i + 1) & mask, probes++) {
        fi_slot *s = &fi->slots[i];
        if (s->state == 0) return NULL;
        if (s->state == 1 && s->hash == h && s->ns == ns && s->klen == n && memcmp(s->key, k, n) == 0) return s;
    }
    return NULL;
}

static int fi_grow(FastIndex *fi, size_t cap) {
    fi_slot *old = fi->slots;
    size_t oldcap = fi->cap;
    fi_slot *fresh = calloc(cap, sizeof(fi_slot));
    if (!fresh) return -1;
    fi->slots = fresh; fi->cap = cap; fi->used = 0; fi->tombs = 0;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i].state != 1) continue;
        size_t mask = cap - 1, j = old[i].hash & mask;
        while (fresh[j].state) j = (j + 1) & mask;
        fresh[j] = old[i];
        fi->used++;
    }
    free(old);
    return 0;
}

static void fi_free(PyObject *cap) {
    FastIndex *fi = PyCapsule_GetPointer(cap, "belugactl.fastindex");
    if (fi) {
        for (size_t i = 0; i < fi->cap; i++) free(fi->slots[i].get_reply);
        free(fi->slots);
        free(fi);
    }
}

static FastIndex *fi_get(PyObject *cap) {
    return (FastIndex *)PyCapsule_GetPointer(cap, "belugactl.fastindex");
}

static PyObject *py_fi_new(PyObject *self, PyObject *noargs) {
    FastIndex *fi = calloc(1, sizeof(FastIndex));
    if (!fi) return PyErr_NoMemory();
    fi->cap = 1024;
    fi->slots = calloc(fi->cap, sizeof(fi_slot));
    if (!fi->slots) { free(fi); return PyErr_NoMemory(); }
    return PyCapsule_New(fi, "belugactl.fastindex", fi_free);
}

/* fi_put(fi, ns, key, id, get_reply=b"") -> True, or False for a key too long to mirror.
 * get_reply: the GET reply payload for this entry (its first 8 bytes, the lease id, are patched
 * per request); empty means GETs of it go to Python. */
static PyObject *py_fi_put(PyObject *self, PyObject *args) {
    PyObject *cap; unsigned int ns; Py_buffer k; long long id; Py_buffer g = {0};
    if (!PyArg_ParseTuple(args, "OIy*L|y*", &cap, &ns, &k, &id, &g)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    uint8_t *blob = NULL;
    if (!fi) goto done;
    if (k.len <= 0 || k.len > FI_KEY) { r = Py_False; Py_INCREF(r); goto done; }
    if (g.buf && g.len >= 8) {
        blob = malloc((size_t)g.len);
        if (!blob) { PyErr_NoMemory(); goto done; }
        memcpy(blob, g.buf, (size_t)g.len);
    }
    if ((fi->used + fi->tombs + 1) * 2 > fi->cap) {
        size_t want = fi->cap;
        while ((fi->used + 1) * 2 > want / 2) want *= 2; /* keep the load under a quarter after growth */
        if (fi_grow(fi, want) < 0) { PyErr_NoMemory(); goto done; }
    }
    uint64_t h = fi_hash(ns, k.buf, (size_t)k.len);
    fi_slot *s = fi_find(fi, ns, k.buf, (size_t)k.len, h);
    if (!s) {
        size_t mask = fi->cap - 1, i = h & mask;
        while (fi->slots[i].state == 1) i = (i + 1) & mask;
        s = &fi->slots[i];
        if (s->state == 2) fi->tombs--;
        fi->used++;
    }
    if (s->state == 1) free(s->get_reply); /* a re-put replaces the old entry */
    s->state = 1; s->hash = h; s->ns = ns; s->klen = (uint16_t)k.len; s->id = id;
    memcpy(s->key, k.buf, (size_t)k.len);
    s->get_reply = blob; s->get_len = blob ? (uint32_t)g.len : 0;
    blob = NULL;
    r = Py_True; Py_INCREF(r);
done:
    free(blob);
    PyBuffer_Release(&k);
    if (g.buf) PyBuffer_Release(&g);
    return r;
}

static PyObject *py_fi_del(PyObject *self, PyObject *args) {
    PyObject *cap; unsigned int ns; Py_buffer k;
    if (!PyArg_ParseTuple(args, "OIy*", &cap, &ns, &k)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    if (fi) {
        fi_slot *s = (k.len > 0 && k.len <= FI_KEY) ? fi_find(fi, ns, k.buf, (size_t)k.len, fi_hash(ns, k.buf, (size_t)k.len)) : NULL;
        if (s) { s->state = 2; free(s->get_reply); s->get_reply = NULL; s->get_len = 0; fi->used--; fi->tombs++; }
        r = PyBool_FromLong(s != NULL);
    }
    PyBuffer_Release(&k);
    return r;
}

static PyObject *py_fi_len(PyObject *self, PyObject *cap) {
    FastIndex *fi = fi_get(cap);
    if (!fi) return NULL;
    return PyLong_FromSize_t(fi->used);
}

struct logbuf { int64_t *v; size_t n, cap; };

static int log_push(struct logbuf *l, int64_t x) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        int64_t *v = realloc(l->v, cap * sizeof(int64_t));
        if (!v) return -1;
        l->v = v; l->cap = cap;
    }
    l->v[l->n++] = x;
    return 0;
}

static int log_reserve(struct logbuf *l, size_t extra) {
    if (l->n + extra <= l->cap) return 0;
    size_t cap = l->cap ? l->cap : 256;
    while (cap < l->n + extra) cap *= 2;
    int64_t *v = realloc(l->v, cap * sizeof(int64_t));
    if (!v) return -1;
    l->v = v; l->cap = cap;
    return 0;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* From a lease log ((lease, n, ids...) records), the distinct entry ids with how many leases each
 * got: (id, count) pairs. The Python index then touches each entry once per burst. */
static int aggregate_log(const struct logbuf *log, struct logbuf *out) {
    size_t total = 0;
    for (size_t i = 0; i + 1 < log->n; i += 2 + (size_t)log->v[i + 1]) total += (size_t)log->v[i + 1];
    if (total == 0) return 0;
    int64_t *ids = malloc(total * sizeof(int64_t));
    if (!ids) return -1;
    size_t k = 0;
    for (size_t i = 0; i + 1 < log->n; i += 2 + (size_t)log->v[i + 1])
        for (int64_t q = 0; q < log->v[i + 1]; q++) ids[k++] = log->v[i + 2 + q];
    qsort(ids, total, sizeof(int64_t), cmp_i64);
    int bad = 0;
    for (size_t i = 0; i < total && !bad;) {
        size_t j = i;
        while (j < total && ids[j] == ids[i]) j++;
        bad = log_push(out, ids[i]) || log_push(out, (int64_t)(j - i));
        i = j;
    }
    free(ids);
    return bad ? -1 : 0;
}

#define OP_LOOKUP 3
#define FAST_LINGER_NS 50000ull
#define OP_PING 12
#define OP_GET 4

/* Answers LOOKUP_PREFIX, GET (hits) and PING.
 * fast_serve(fi, buf, offs, cursors, slots_per_ring, slot_size, epoch32, ns_count, flush, timeout_ns,
 *            start, lease_next, max_n, bounds_ns, hist)
 *   -> (served, stop_index, lease_next, lease_log bytes, lookups, hits, lookup service ns,
 *       per-entry lease counts: (entry id, count) int64 pairs, GETs served)
 * offs: int64[2R] (cursor slot of each ring, then slot 0 of each ring), updated as cursors move;
 * cursors: int64[R]; bounds_ns/hist: service-time histogram (hist has len(bounds)+1 counters).
 * stop_index >= 0: a ready slot this path does not handle (Python serves it); -1: timed out. */
static PyObject *py_fast_serve(PyObject *self, PyObject *args) {
    PyObject *cap; Py_buffer v, ov, cv, bv, hv;
    Py_ssize_t S, slot_size, start, max_n; unsigned int epoch32, ns_count; int flush;
    unsigned long long timeout_ns, lease_next;
    if (!PyArg_ParseTuple(args, "Ow*w*w*nnIIpKnKny*w*", &cap, &v, &ov, &cv, &S, &slot_size, &epoch32, &ns_count,
                          &flush, &timeout_ns, &start, &lease_next, &max_n, &bv, &hv))
        return NULL;
    PyObject *result = NULL;
    FastIndex *fi = fi_get(cap);
    struct logbuf log = {0}, agg = {0};
    int agg_failed = 0;
    if (!fi) goto done;
    Py_ssize_t R = cv.len / 8;
    Py_ssize_t nb = bv.len / 8;
    if (ov.len != 2 * R * 8 || R == 0 || S <= 0 || slot_size < HDR + 16 || hv.len != (nb + 1) * 8) {
        PyErr_SetString(PyExc_ValueError, "fast_serve: inconsistent ring arrays");
        goto done;
    }
    int64_t *offs = (int64_t *)ov.buf, *cursors = (int64_t *)cv.buf, *hist = (int64_t *)hv.buf;
    const int64_t *bounds = (const int64_t *)bv.buf;
    for (Py_ssize_t i = 0; i < 2 * R; i++) {
        if (offs[i] < 0 || offs[i] > v.len - slot_size || ((uintptr_t)v.buf + offs[i]) & 7) {
            PyErr_SetString(PyExc_ValueError, "fast_serve: slot offset outside the pool"); goto done;
        }
    }
    for (Py_ssize_t r = 0; r < R; r++) {
        if (cursors[r] < 0 || cursors[r] >= S || offs[R + r] + (S - 1) * slot_size > v.len - slot_size) {
            PyErr_SetString(PyExc_ValueError, "fast_serve: cursor outside the ring"); goto done;
        }
    }
    if (start < 0 || start >= R) start = 0;
    Py_ssize_t served = 0, stop = -1, lookups = 0, hits = 0, gets = 0;
    size_t maxp = (size_t)(slot_size - HDR);
    int64_t ids[256];
    uint64_t sum_ns = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t t0 = now_ns(), deadline = t0 + timeout_ns, last_served = t0;
    unsigned spins = 0;
    for (;;) {
        Py_ssize_t found = -1;
        for (Py_ssize_t j = 0; j < 2 * R; j++) {
            Py_ssize_t i = start + j; if (i >= 2 * R) i -= 2 * R;
            char *slot = (char *)v.buf + offs[i];
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) { found = i; break; }
        }
        if (found < 0) {
            if ((++spins & 15) == 0) {
                uint64_t t = now_ns();
                /* After serving, linger a little for the next request (a QD1 client is about to
                 * send it) before going back to Python for its bookkeeping, TCP and timers. */
                if (t >= deadline || (served > 0 && t - last_served > FAST_LINGER_NS)) break;
                if (t - t0 > SPIN_BEFORE_YIELD_NS && (served == 0 || t - last_served > SPIN_BEFORE_YIELD_NS)) sched_yield();
            }
            cpu_relax();
            continue;
        }
        if (found >= R) { stop = found; break; } /* a (re)connecting client: Python's job */
        uint64_t ts = now_ns();
        char *slot = (char *)v.buf + offs[found];
        if (flush) { flush_range(slot, slot_size, 1); full_fence(); }
        struct slot_hdr h;
        memcpy(&h, slot, sizeof h);
        if (h.magic != RPC_MAGIC || (int64_t)(h.seq % (uint64_t)S) != cursors[found] || h.epoch != epoch32 ||
            h.length > maxp || (h.op != OP_LOOKUP && h.op != OP_PING && h.op != OP_GET)) { stop = found; break; }
        uint8_t reply[16];
        size_t rlen;
        char *pl = slot + HDR;
        if (h.op == OP_GET) {
            /* Hits only: a miss, or an entry without a stored reply, is Python's (it counts NOT_FOUND). */
            if (h.length < 6) { stop = found; break; }
            uint32_t ns; uint16_t klen;
            memcpy(&ns, pl, 4); memcpy(&klen, pl + 4, 2);
            if (ns == 0 || ns > ns_count || klen == 0 || klen > FI_KEY || 6 + (size_t)klen > h.length) { stop = found; break; }
            uint8_t key[FI_KEY];
            memcpy(key, pl + 6, klen);
            fi_slot *e = fi_find(fi, ns, key, klen, fi_hash(ns, key, klen));
            if (!e || !e->get_reply || e->get_len > maxp || e->get_len > 4096) { stop = found; break; }
            if (log_reserve(&log, 3) < 0) { stop = found; break; }
            uint64_t lease = lease_next++;
            log_push(&log, (int64_t)lease); log_push(&log, 1); log_push(&log, e->id);
            uint8_t tmp[4096];
            memcpy(tmp, e->get_reply, e->get_len);
            memcpy(tmp, &lease, 8);
            publish(slot, h.seq, epoch32, OP_GET, 0, (const char *)tmp, e->get_len, ST_RESP, flush);
            gets++;
        } else if (h.op == OP_PING) {
            uint8_t tmp[4096];
            if (h.length > sizeof tmp) { stop = found; break; }
            memcpy(tmp, pl, h.length);
            publish(slot, h.seq, epoch32, OP_PING, 0, (const char *)tmp, h.length, ST_RESP, flush);
        } else {
            if (h.length < 8) { stop = found; break; }
            uint32_t ns; uint16_t count, klen;
            memcpy(&ns, pl, 4); memcpy(&count, pl + 4, 2); memcpy(&klen, pl + 6, 2);
            if (ns == 0 || ns > ns_count || count == 0 || count > 256 || klen == 0 || klen > FI_KEY ||
                8 + (size_t)count * klen > h.length) { stop = found; break; }
            uint8_t keys[4096];
            size_t kbytes = (size_t)count * klen;
            if (kbytes > sizeof keys) { stop = found; break; }
            memcpy(keys, pl + 8, kbytes); /* one snapshot: the client could scribble while we read */
            uint32_t n = 0;
            for (; n < count; n++) {
                const uint8_t *k = keys + (size_t)n * klen;
                fi_slot *e = fi_find(fi, ns, k, klen, fi_hash(ns, k, klen));
                if (!e) break;
                ids[n] = e->id;
            }
            uint64_t lease = 0;
            if (n && log_reserve(&log, 2 + (size_t)n) < 0) { stop = found; break; } /* out of memory: Python's */
            lookups++;
            if (n) {
                lease = lease_next++;
                hits++;
                log_push(&log, (int64_t)lease); log_push(&log, (int64_t)n);
                for (uint32_t q = 0; q < n; q++) log_push(&log, ids[q]);
            }
            uint32_t zero = 0;
            memcpy(reply, &n, 4); memcpy(reply + 4, &zero, 4); memcpy(reply + 8, &lease, 8);
            rlen = 16;
            publish(slot, h.seq, epoch32, OP_LOOKUP, 0, (const char *)reply, rlen, ST_RESP, flush);
        }
        int64_t c = cursors[found] + 1;
        if (c >= S) c = 0;
        cursors[found] = c;
        offs[found] = offs[R + found] + c * slot_size;
        uint64_t te = now_ns(); /* one clock read serves the histogram and the linger timer */
        if (h.op == OP_LOOKUP) {
            uint64_t dt = te - ts;
            Py_ssize_t b = 0;
            while (b < nb && (int64_t)dt > bounds[b]) b++;
            hist[b]++;
            sum_ns += dt;
        }
        served++;
        start = found;
        last_served = te;
        if (served >= max_n || te >= deadline) break;
    }
    agg_failed = aggregate_log(&log, &agg);
    Py_END_ALLOW_THREADS
    if (agg_failed) { PyErr_NoMemory(); goto done; }
    {
        PyObject *logb = PyBytes_FromStringAndSize((const char *)log.v, (Py_ssize_t)(log.n * sizeof(int64_t)));
        PyObject *aggb = PyBytes_FromStringAndSize((const char *)agg.v, (Py_ssize_t)(agg.n * sizeof(int64_t)));
        if (logb && aggb)
            result = Py_BuildValue("(nnKNnnKNn)", served, stop, lease_next, logb, lookups, hits,
                                   (unsigned long long)sum_ns, aggb, gets);
        else { Py_XDECREF(logb); Py_XDECREF(aggb); }
    }
done:
    free(log.v);
    free(agg.v);
    PyBuffer_Release(&v); PyBuffer_Release(&ov); PyBuffer_Release(&cv); PyBuffer_Release(&bv); PyBuffer_Release(&hv);
    return result;
}

/* rpc_call(buf, off, seq, epoch32, op, payload, max_payload, timeout_ns, flush, epoch_off, expected_epoch)
 *   -> (code, epoch, payload) | None on timeout
 * The client's whole QD1 round trip in one call. With epoch_off >= 0, first compare the pool
 * header's epoch word with expected_epoch and return code -1 without sending if it moved (the
 * server restarted: fenced). Code -2: the slot is still REQ_READY from an abandoned request. */
static PyObject *py_rpc_call(PyObject *self, PyObject *args) {
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
    struct slot_hdr *h = (struct slot_hdr *)slot;
    if (__atomic_load_n(&h->status, __ATOMIC_ACQUIRE) == ST_REQ) { r = Py_BuildValue("(iIy#)", -2, 0u, "", (Py_ssize_t)0); goto done; }
    publish(slot, seq, epoch32, (uint16_t)op, 0, pl.buf, (size_t)pl.len, ST_REQ, flush);
    uint64_t st = wait_for_reply(h, slot, flush, timeout_ns);
    if (st != ST_RESP) { r = Py_None; Py_INCREF(r); goto done; }
    if (flush) { flush_range(slot, HDR + maxp, 1); full_fence(); }
    if (h->magic != RPC_MAGIC || h->seq != seq || h->length > (uint64_t)maxp) {
        PyErr_Format(PyExc_ValueError, "malformed reply (magic %#x, seq %llu for %llu, length %u)", h->magic,
                     (unsigned long long)h->seq, seq, h->length);
        __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
        goto done;
    }
    r = Py_BuildValue("(iIy#)", (int)h->code, (unsigned)h->epoch, slot + HDR, (Py_ssize_t)h->length);
    __atomic_store_n(&h->status, (uint64_t)ST_FREE, __ATOMIC_RELEASE);
    if (flush) { flush_range(slot, 8, 0); full_fence(); }
done:
    PyBuffer_Release(&v); PyBuffer_Release(&pl);
    return r;
}

/* rpc_burst(buf, slot_offsets_int64[S], seq_start, epoch32, op, payload, qd, total, timeout_ns, flush)
 *   -> (completed, elapsed_ns)
 * A load generator in C: keeps `qd` requests in flight on one ring until `total` completed, to
 * measure what the server sustains without a Python client in the way (bench rpc). */
static PyObject *py_rpc_burst(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"features", py_features, METH_NOARGS, "CPU features detected with cpuid, and the flush instruction in use."},
    {"flush", py_flush, METH_VARARGS, "flush(buf, off, n, for_read=False): write back/evict the lines of a range, then mfence."},
    {"fence", py_fence, METH_NOARGS, "mfence."},
    {"copy", py_copy, METH_VARARGS, "copy(dst, dst_off, src, src_off, n, nontemporal=False)."},
    {"gather", py_gather, METH_VARARGS, "gather(dst, src, pieces_int64_triples, nontemporal=False) -> bytes copied."},
    {"gather_blocks", py_gather_blocks, METH_VARARGS, "gather_blocks(pool, tensors, template_triples, block_pairs, save, nontemporal) -> bytes copied."},
    {"load64", py_load64, METH_VARARGS, "load64(buf, off) -> int (acquire)."},
    {"store64", py_store64, METH_VARARGS, "store64(buf, off, value, flush=False) (release; optional line flush + fence)."},
    {"cas64", py_cas64, METH_VARARGS, "cas64(buf, off, expected, desired) -> value seen (== expected on success)."},
    {"fetch_add64", py_fetch_add64, METH_VARARGS, "fetch_add64(buf, off, add) -> old value."},
    {"wait64", py_wait64, METH_VARARGS, "wait64(buf, off, value, timeout_ns, flush=False) -> last value seen."},
    {"wait_any", py_wait_any, METH_VARARGS, "wait_any(buf, offsets_int64, value, timeout_ns, flush=False) -> index or -1."},
    {"rpc_post", py_rpc_post, METH_VARARGS, "rpc_post(buf, off, seq, epoch, op, payload, flush=False): write a request, publish REQ_READY."},
    {"rpc_wait_reply", py_rpc_wait_reply, METH_VARARGS, "rpc_wait_reply(buf, off, seq, max_payload, timeout_ns, flush=False) -> (code, epoch, payload) | None."},
    {"rpc_take", py_rpc_take, METH_VARARGS, "rpc_take(buf, offsets, start, max_payload, timeout_ns, flush=False) -> (i, seq, magic, epoch, op, length, payload|None) | None."},
    {"rpc_reply", py_rpc_reply, METH_VARARGS, "rpc_reply(buf, off, seq, epoch, op, code, payload, flush=False): write a reply, publish RESP_READY."},
    {"rpc_call", py_rpc_call, METH_VARARGS, "rpc_call(...): a client's whole QD1 round trip; see the source."},
    {"rpc_burst", py_rpc_burst, METH_VARARGS, "rpc_burst(...): C load generator for bench rpc; see the source."},
    {"fi_new", py_fi_new, METH_NOARGS, "fi_new() -> a C mirror of the index's visible keys."},
    {"fi_put", py_fi_put, METH_VARARGS, "fi_put(fi, ns, key, entry_id) -> False if the key is too long to mirror."},
    {"fi_del", py_fi_del, METH_VARARGS, "fi_del(fi, ns, key) -> whether it was there."},
    {"fi_len", py_fi_len, METH_O, "fi_len(fi) -> keys mirrored."},
    {"fast_serve", py_fast_serve, METH_VARARGS, "fast_serve(...): answer LOOKUP_PREFIX/PING from the rings in C; see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Coherence helpers for a CXL pool.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    detect_cpu();
    const char *avx2_env = getenv("BELUGACTL_NATIVE_AVX2");
    nt_avx2 = have_avx2 && !(avx2_env && strcmp(avx2_env, "0") == 0);
    return PyModule_Create(&module);
}
