/* Cache-line flushes and copies: plain, non-temporal, gathers of many pieces. */
#include "_native.h"

/* Non-temporal copy of a 64-byte-aligned destination body of `n` bytes (a multiple of 64).
 * Like glibc's large-copy path: four 4 KiB pages are streamed side by side (one DRAM page
 * opened per stream, and the hardware prefetcher sees four steady streams instead of restarting
 * at every page) with a software prefetch a few lines ahead of each: faster than a plain
 * one-stream loop for pieces of a few pages (glibc does the same for one big copy, so without it
 * a gather of pieces cannot keep up with one memcpy of the same bytes; docs/measurements.md). */
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

void nt_memcpy(char *dst, const char *src, size_t n) {
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
        COUNT(COUNT_NT, d, body);
        if (nt_avx2) nt_body_avx2(d, s, body);
        else nt_body_sse2(d, s, body);
    }
    size_t tail = n - head - body;
    if (tail) { memcpy(d + body, s + body, tail); flush_range(d + body, tail, 0); }
#else
    memcpy(dst, src, n);
#endif
}

PyObject *py_flush(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off, n; int for_read = 0; char *p;
    if (!PyArg_ParseTuple(args, "y*nn|p", &v, &off, &n, &for_read)) return NULL;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    flush_range(p, (size_t)n, for_read);
    full_fence();
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

PyObject *py_fence(PyObject *self, PyObject *noargs) {
    full_fence();
    Py_RETURN_NONE;
}

PyObject *py_copy(PyObject *self, PyObject *args) {
    Py_buffer d, s; Py_ssize_t doff, soff, n; int nt = 0; char *dp, *sp;
    if (!PyArg_ParseTuple(args, "w*ny*nn|p", &d, &doff, &s, &soff, &n, &nt)) return NULL;
    if (get_range(&d, doff, n, &dp) < 0 || get_range(&s, soff, n, &sp) < 0) {
        PyBuffer_Release(&d); PyBuffer_Release(&s); return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    COUNT(COUNT_READ, sp, n); COUNT(COUNT_WRITE, dp, n);
    if (nt) { nt_memcpy(dp, sp, (size_t)n); store_fence(); }
    else memmove(dp, sp, (size_t)n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&d); PyBuffer_Release(&s);
    Py_RETURN_NONE;
}

/* pieces: a buffer of int64 (src_off, dst_off, len) triples (array('q'), numpy int64). */
PyObject *py_gather(PyObject *self, PyObject *args) {
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
        COUNT(COUNT_READ, sp, t[3 * i + 2]); COUNT(COUNT_WRITE, dp, t[3 * i + 2]);
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

PyObject *py_gather_blocks(PyObject *self, PyObject *args) {
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
        COUNT(COUNT_READ, pieces[i].src, pieces[i].n); COUNT(COUNT_WRITE, pieces[i].dst, pieces[i].n);
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
