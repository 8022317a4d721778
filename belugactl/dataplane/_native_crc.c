/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78, init and final xor 0xFFFFFFFF), and a copy
 * that computes it in the same pass, so a KV block can be checksummed while it is copied into or
 * out of the pool.
 *
 * Kernel: SSE4.2's crc32 instruction (8 bytes per instruction, 3-cycle latency, one per cycle
 * issue). One dependent chain therefore runs at a third of the instruction's throughput, so long
 * buffers are cut into three equal lanes checksummed side by side, and the lanes' CRCs are joined
 * with the standard shift: crc(A || B) = crc(A) * x^(8|B|) mod P  xor  crc(B) (on raw registers,
 * B's started from 0). The shift by a fixed lane length is four table lookups (tables built once
 * at import for each lane length used). Without SSE4.2 (checked at run time with cpuid, or on a
 * non-x86 build) a byte-at-a-time table does the same arithmetic.
 *
 * Python API (all offsets bounds-checked like `copy`; the GIL is released for the work):
 *   crc32c(buf, off=0, n=-1, crc=0) -> int          chained like zlib.crc32: pass the last result
 *   copy_crc32c(dst, doff, src, soff, n, crc=0, nontemporal=False) -> int   CRC of the bytes copied
 *   gather_blocks_crc32c(pool, tensors, template, block_pairs, save, nontemporal=False) -> list[int]
 *       gather_blocks with each block's CRC32C (pool order) computed while copying, either way
 */
#include "_native.h"

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc_table[256];
/* Lane lengths the 3-way kernel uses, longest first, and their shift tables. */
#define NLANES 3
static const size_t lane_len[NLANES] = {32768, 4096, 512};
static uint32_t shift_tab[NLANES][4][256];
static int crc_ready = 0;
static int have_sse42 = 0;

/* a * b mod P on reflected polynomials (zlib's multmodp). */
static uint32_t multmodp(uint32_t a, uint32_t b) {
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return p;
}

/* x^(8 n) mod P: the operator that appends n zero bytes to a raw CRC register. */
static uint32_t x8nmodp(size_t n) {
    uint32_t p = 1u << 31; /* x^0 */
    uint32_t sq = 1u << 23; /* x^8 */
    while (n) {
        if (n & 1) p = multmodp(sq, p);
        sq = multmodp(sq, sq);
        n >>= 1;
    }
    return p;
}

/* Tables and kernel choice; run once at import (PyInit__native, GIL held), and defensively on use. */
void crc_init(void) {
    if (crc_ready) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc_table[i] = c;
    }
    for (int l = 0; l < NLANES; l++) {
        uint32_t op = x8nmodp(lane_len[l]);
        for (int k = 0; k < 4; k++)
            for (uint32_t b = 0; b < 256; b++) shift_tab[l][k][b] = multmodp(op, b << (8 * k));
    }
#if BELUGA_X86
    __builtin_cpu_init();
    have_sse42 = __builtin_cpu_supports("sse4.2");
    const char *env = getenv("BELUGACTL_NATIVE_SSE42");
    if (env && strcmp(env, "0") == 0) have_sse42 = 0; /* tests of the table kernel */
#endif
    crc_ready = 1;
}

static inline uint32_t shift_by(int l, uint32_t c) {
    return shift_tab[l][0][c & 0xff] ^ shift_tab[l][1][(c >> 8) & 0xff] ^ shift_tab[l][2][(c >> 16) & 0xff] ^
           shift_tab[l][3][c >> 24];
}

/* ---- table kernels (raw registers: no pre/post inversion here) --------------------------- */
static uint32_t sw_crc(uint32_t c, const unsigned char *p, size_t n) {
    while (n--) c = crc_table[(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

static uint32_t sw_copy_crc(uint32_t c, unsigned char *d, const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char b = s[i];
        d[i] = b;
        c = crc_table[(c ^ b) & 0xff] ^ (c >> 8);
    }
    return c;
}

#if BELUGA_X86
/* ---- SSE4.2 kernels ---------------------------------------------------------------------- */
__attribute__((target("sse4.2"))) static uint32_t hw_crc(uint32_t c, const unsigned char *p, size_t n) {
    uint64_t c64;
    while (n && ((uintptr_t)p & 7)) { c = _mm_crc32_u8(c, *p++); n--; }
    for (int l = 0; l < NLANES; l++) {
        size_t L = lane_len[l];
        while (n >= 3 * L) {
            uint64_t a = c, b = 0, e = 0;
            const unsigned char *p1 = p + L, *p2 = p + 2 * L;
            for (size_t i = 0; i < L; i += 8) {
                uint64_t x, y, z;
                memcpy(&x, p + i, 8); memcpy(&y, p1 + i, 8); memcpy(&z, p2 + i, 8);
                a = _mm_crc32_u64(a, x);
                b = _mm_crc32_u64(b, y);
                e = _mm_crc32_u64(e, z);
            }
            c = shift_by(l, shift_by(l, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)e;
            p += 3 * L; n -= 3 * L;
        }
    }
    c64 = c;
    for (; n >= 8; n -= 8, p += 8) { uint64_t x; memcpy(&x, p, 8); c64 = _mm_crc32_u64(c64, x); }
    c = (uint32_t)c64;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}

/* Copy while checksumming: each 8-byte word is loaded once, fed to the CRC and stored (plain or
 * non-temporal movnti). Same three-lane structure as hw_crc. */
__attribute__((target("sse4.2"))) static uint32_t hw_copy_crc(uint32_t c, unsigned char *d, const unsigned char *s,
                                                             size_t n, int nt) {
    uint64_t c64;
    while (n && ((uintptr_t)s & 7)) { unsigned char b = *s++; *d++ = b; c = _mm_crc32_u8(c, b); n--; }
    if ((uintptr_t)d & 7) nt = 0; /* movnti needs an aligned destination: plain stores (flushed by the caller) */
    for (int l = 0; l < NLANES; l++) {
        size_t L = lane_len[l];
        while (n >= 3 * L) {
            uint64_t a = c, b = 0, e = 0;
            const unsigned char *s1 = s + L, *s2 = s + 2 * L;
            unsigned char *d1 = d + L, *d2 = d + 2 * L;
            if (nt) {
                COUNT(COUNT_NT, d, 3 * L);
                for (size_t i = 0; i < L; i += 8) {
                    uint64_t x, y, z;
                    memcpy(&x, s + i, 8); memcpy(&y, s1 + i, 8); memcpy(&z, s2 + i, 8);
                    a = _mm_crc32_u64(a, x); b = _mm_crc32_u64(b, y); e = _mm_crc32_u64(e, z);
                    _mm_stream_si64((long long *)(d + i), (long long)x);
                    _mm_stream_si64((long long *)(d1 + i), (long long)y);
                    _mm_stream_si64((long long *)(d2 + i), (long long)z);
                }
            } else {
                for (size_t i = 0; i < L; i += 8) {
                    uint64_t x, y, z;
                    memcpy(&x, s + i, 8); memcpy(&y, s1 + i, 8); memcpy(&z, s2 + i, 8);
                    a = _mm_crc32_u64(a, x); b = _mm_crc32_u64(b, y); e = _mm_crc32_u64(e, z);
                    memcpy(d + i, &x, 8); memcpy(d1 + i, &y, 8); memcpy(d2 + i, &z, 8);
                }
            }
            c = shift_by(l, shift_by(l, (uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)e;
            s += 3 * L; d += 3 * L; n -= 3 * L;
        }
    }
    c64 = c;
    for (; n >= 8; n -= 8, s += 8, d += 8) {
        uint64_t x; memcpy(&x, s, 8); c64 = _mm_crc32_u64(c64, x); memcpy(d, &x, 8);
    }
    c = (uint32_t)c64;
    while (n--) { unsigned char b = *s++; *d++ = b; c = _mm_crc32_u8(c, b); }
    return c;
}
#endif

/* Raw-register entry points (callers invert before and after). */
static uint32_t crc_raw(uint32_t c, const unsigned char *p, size_t n) {
#if BELUGA_X86
    if (have_sse42) return hw_crc(c, p, n);
#endif
    return sw_crc(c, p, n);
}

/* With `nt` (publishing to a non-coherent pool) the bulk goes out with non-temporal stores and
 * the whole range is then written back, which covers the bytes stored plainly (head, tail, a
 * misaligned destination); the caller fences. */
static uint32_t copy_crc_raw(uint32_t c, unsigned char *d, const unsigned char *s, size_t n, int nt) {
    COUNT(COUNT_READ, s, n); COUNT(COUNT_WRITE, d, n);
#if BELUGA_X86
    if (have_sse42) c = hw_copy_crc(c, d, s, n, nt);
    else
#endif
        c = sw_copy_crc(c, d, s, n);
    if (nt) flush_range((const char *)d, n, 0);
    return c;
}

HIDDEN uint32_t beluga_crc32c(uint32_t crc, const void *p, size_t n) {
    crc_init();
    return ~crc_raw(~crc, (const unsigned char *)p, n);
}

static int parse_crc(PyObject *o, uint32_t *out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    if (v > 0xFFFFFFFFull) { PyErr_SetString(PyExc_ValueError, "crc must be a 32-bit value"); return -1; }
    *out = (uint32_t)v;
    return 0;
}

PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer v; Py_ssize_t off = 0, n = -1; PyObject *crc_o = NULL; uint32_t crc = 0; char *p;
    if (!PyArg_ParseTuple(args, "y*|nnO", &v, &off, &n, &crc_o)) return NULL;
    if (crc_o && parse_crc(crc_o, &crc) < 0) { PyBuffer_Release(&v); return NULL; }
    if (n == -1) n = off >= 0 && off <= v.len ? v.len - off : -1;
    if (get_range(&v, off, n, &p) < 0) { PyBuffer_Release(&v); return NULL; }
    crc_init();
    uint32_t c = ~crc;
    if (n >= 4096) {
        Py_BEGIN_ALLOW_THREADS
        c = crc_raw(c, (const unsigned char *)p, (size_t)n);
        Py_END_ALLOW_THREADS
    } else {
        c = crc_raw(c, (const unsigned char *)p, (size_t)n);
    }
    PyBuffer_Release(&v);
    return PyLong_FromUnsignedLong(~c);
}

PyObject *py_copy_crc32c(PyObject *self, PyObject *args) {
    Py_buffer d, s; Py_ssize_t doff, soff, n; PyObject *crc_o = NULL; int nt = 0; uint32_t crc = 0; char *dp, *sp;
    if (!PyArg_ParseTuple(args, "w*ny*nn|Op", &d, &doff, &s, &soff, &n, &crc_o, &nt)) return NULL;
    if ((crc_o && parse_crc(crc_o, &crc) < 0) || get_range(&d, doff, n, &dp) < 0 || get_range(&s, soff, n, &sp) < 0) {
        PyBuffer_Release(&d); PyBuffer_Release(&s); return NULL;
    }
    crc_init();
    uint32_t c = ~crc;
    /* Overlapping ranges (the same buffer both ways) would checksum bytes already overwritten. */
    if (dp < sp + n && sp < dp + n && n > 0) {
        PyBuffer_Release(&d); PyBuffer_Release(&s);
        PyErr_SetString(PyExc_ValueError, "copy_crc32c: source and destination overlap");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    c = copy_crc_raw(c, (unsigned char *)dp, (const unsigned char *)sp, (size_t)n, nt);
    if (nt) store_fence();
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&d); PyBuffer_Release(&s);
    return PyLong_FromUnsignedLong(~c);
}

/* gather_blocks plus one CRC per block of the bytes moved (save: tensors -> pool, else back): template = int64 (offset of block 0's piece in
 * tensors, stride between blocks, length) triples in pool order; blocks = int64 (block id, pool
 * offset) pairs, each block's pieces back to back from its pool offset. Everything is checked
 * before any byte moves. */
/* Everything gather_blocks_crc32c and load_blocks_checked check before a byte moves: the
 * template's pieces, and every block's pool range and tensor pieces. */
HIDDEN int check_gather(Py_buffer *pool, Py_buffer *ten, Py_buffer *tv, Py_buffer *bv, Py_ssize_t *nseg_out,
                        Py_ssize_t *nblk_out) {
    if (tv->len % 24 || bv->len % 16) {
        PyErr_SetString(PyExc_ValueError, "template must be int64 triples and blocks int64 pairs");
        return -1;
    }
    Py_ssize_t nseg = tv->len / 24, nblk = bv->len / 16;
    const int64_t *tpl = (const int64_t *)tv->buf, *blk = (const int64_t *)bv->buf;
    int64_t need = 0;
    for (Py_ssize_t k = 0; k < nseg; k++) {
        if (tpl[3 * k] < 0 || tpl[3 * k + 1] < 0 || tpl[3 * k + 2] < 0 || tpl[3 * k + 2] > pool->len) {
            PyErr_Format(PyExc_ValueError, "template piece %zd is out of range", k);
            return -1;
        }
        need += tpl[3 * k + 2];
        if (need > pool->len) { PyErr_SetString(PyExc_ValueError, "a block is larger than the pool"); return -1; }
    }
    for (Py_ssize_t i = 0; i < nblk; i++) {
        int64_t id = blk[2 * i], off = blk[2 * i + 1];
        if (id < 0 || off < 0 || need > pool->len || off > pool->len - need) {
            PyErr_Format(PyExc_ValueError, "block %lld at pool offset %lld (%lld bytes) is outside the pool",
                         (long long)id, (long long)off, (long long)need);
            return -1;
        }
        for (Py_ssize_t k = 0; k < nseg; k++) {
            int64_t base = tpl[3 * k], stride = tpl[3 * k + 1], len = tpl[3 * k + 2];
            if (stride && id > (INT64_MAX - base) / stride) { PyErr_SetString(PyExc_ValueError, "piece offset overflows"); return -1; }
            int64_t t = base + id * stride;
            if (t > ten->len || len > ten->len - t) {
                PyErr_Format(PyExc_ValueError, "block %lld piece %zd is outside the tensors (%zd bytes)",
                             (long long)id, k, ten->len);
                return -1;
            }
        }
    }
    *nseg_out = nseg;
    *nblk_out = nblk;
    return 0;
}

/* The copy itself (GIL released by the caller): each block's pieces, its CRC32C in crcs[i]. */
HIDDEN void copy_blocks_crc(Py_buffer *pool, Py_buffer *ten, const int64_t *tpl, Py_ssize_t nseg, const int64_t *blk,
                            Py_ssize_t nblk, int save, int nt, uint32_t *crcs) {
    for (Py_ssize_t i = 0; i < nblk; i++) {
        int64_t id = blk[2 * i], off = blk[2 * i + 1];
        uint32_t c = 0xFFFFFFFFu;
        for (Py_ssize_t k = 0; k < nseg; k++) {
            int64_t len = tpl[3 * k + 2];
            unsigned char *pp = (unsigned char *)pool->buf + off;
            unsigned char *tp = (unsigned char *)ten->buf + tpl[3 * k] + id * tpl[3 * k + 1];
            c = save ? copy_crc_raw(c, pp, tp, (size_t)len, nt) : copy_crc_raw(c, tp, pp, (size_t)len, nt);
            off += len;
        }
        crcs[i] = ~c;
    }
    if (nt) store_fence();
}

PyObject *py_gather_blocks_crc32c(PyObject *self, PyObject *args) {
    Py_buffer pool, ten, tv, bv; int save = 1, nt = 0;
    if (!PyArg_ParseTuple(args, "w*w*y*y*p|p", &pool, &ten, &tv, &bv, &save, &nt)) return NULL;
    PyObject *out = NULL;
    uint32_t *crcs = NULL;
    Py_ssize_t nseg, nblk;
    if (check_gather(&pool, &ten, &tv, &bv, &nseg, &nblk) < 0) goto done;
    crcs = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(nblk ? nblk : 1));
    if (!crcs) { PyErr_NoMemory(); goto done; }
    crc_init();
    Py_BEGIN_ALLOW_THREADS
    copy_blocks_crc(&pool, &ten, (const int64_t *)tv.buf, nseg, (const int64_t *)bv.buf, nblk, save, nt, crcs);
    Py_END_ALLOW_THREADS
    out = PyList_New(nblk);
    if (!out) goto done;
    for (Py_ssize_t i = 0; i < nblk; i++) {
        PyObject *v = PyLong_FromUnsignedLong(crcs[i]);
        if (!v) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, v);
    }
done:
    free(crcs);
    PyBuffer_Release(&pool); PyBuffer_Release(&ten); PyBuffer_Release(&tv); PyBuffer_Release(&bv);
    return out;
}

PyObject *py_crc32c_kernel(PyObject *self, PyObject *noargs) {
    crc_init();
    return PyUnicode_FromString(have_sse42 ? "sse4.2-3way" : "table");
}
