/* The journal's restart in C (mds/journal.py): replay one half's records into the live set, and copy
 * the live records into the other half under a new generation.
 *
 * At millions of blocks the Python replay (a dict of (namespace, key) tuples, one parse per record)
 * and the start-up compaction (one record packed per entry) were half of a restart
 * (docs/measurements.md). Here the scan, the crc check, the parse and the last-record-wins merge
 * run over the mapping without the GIL; Python objects are made only for the records that stay live.
 *
 * The journal's bytes are hostile input: every length is checked against the record and the half
 * before it is used, and a record that does not parse ends the replay exactly where the Python
 * replay (journal.parse) would end it. The merge's table is keyed with Python's own randomized
 * bytes hash, so keys chosen to collide cannot make a restart quadratic, and each rehash drops the
 * records removed since, so neither can COMMIT/REMOVE churn over a small live set.
 *
 *   journal_replay(buf, base, size, seed, flush, scan_flush, chunk)
 *       -> (end, order | None, names, ns_ids, keys, one, multi, checksums, spans, unchecked, odd)
 *   journal_copy(buf, src_base, src_size, spans, dst_base, room, seed, flush) -> bytes written | -1
 */
#include "_native.h"
#include <sys/mman.h>

#define J_COMMIT 1
#define J_REMOVE 2
#define J_ORDER 3
#define J_CRC32C 1 /* the checksum trailer's kind (rpc/protocol.py's CHECKSUM_CRC32C) */

/* ---- zlib's crc32 (IEEE, reflected 0xEDB88320), slice by 8: the journal's record check ----------- */

static uint32_t crc_t[8][256];
static int crc_t_ready;

static void crc_ieee_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_t[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++) crc_t[t][i] = (crc_t[t - 1][i] >> 8) ^ crc_t[0][crc_t[t - 1][i] & 0xff];
    crc_t_ready = 1;
}

/* zlib.crc32(bytes, crc): chained the same way (pass the previous result). */
static uint32_t crc_ieee(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) { crc = crc_t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8); n--; }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_t[7][w & 0xff] ^ crc_t[6][(w >> 8) & 0xff] ^ crc_t[5][(w >> 16) & 0xff] ^ crc_t[4][(w >> 24) & 0xff] ^
              crc_t[3][(w >> 32) & 0xff] ^ crc_t[2][(w >> 40) & 0xff] ^ crc_t[1][(w >> 48) & 0xff] ^ crc_t[0][w >> 56];
        p += 8; n -= 8;
    }
    while (n--) crc = crc_t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static inline uint16_t rd16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void wr32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }

/* ---- the live set -------------------------------------------------------------------------------- */

/* One COMMIT that was live when it was read: where its body is and what the parse found. A later
 * COMMIT of the same key replaces it in place (the key keeps its first place, as a dict does); a
 * REMOVE marks it dead. */
typedef struct {
    uint64_t pos;      /* the body's offset in the half */
    uint64_t nbytes;
    uint64_t hash;     /* of the (namespace, key) span: body[1 .. 5 + ns_len + key_len) */
    uint32_t len;      /* the body's length */
    uint32_t crc;      /* the block's CRC32C, when has_crc */
    uint32_t ns;       /* the namespace's number (names, in first-seen order) */
    uint16_t ns_len, key_len, nblocks;
    uint8_t has_crc, live;
} jrec;

typedef struct {
    jrec *recs;
    size_t n, cap;
    /* 0 empty, TOMB deleted, else the record index + 1 with the top half of its hash above it: a probe
     * passes another key's slot without reading its record (a cache miss at millions) */
    uint64_t *slots;
    size_t mask, used; /* used: live slots plus tombstones */
    /* namespaces: the span body[1 .. 3 + ns_len) of the record that named each first */
    uint64_t *ns_pos;
    uint16_t *ns_len;
    uint64_t *ns_hash;
    size_t nns, ns_cap;
    uint32_t *ns_slots;
    size_t ns_mask;
} jlive;

#define TOMB 0xffffffffu
#define TAG 0xffffffff00000000ull

static uint64_t span_hash(const unsigned char *p, size_t n) {
    return (uint64_t)_Py_HashBytes(p, (Py_ssize_t)n);
}

/* A zeroed table of `cap` words. One of megabytes is asked for in huge pages where the kernel gives
 * them on request (transparent huge pages "madvise"): its probes land at random, and with 4 KiB pages
 * most of them also missed the TLB. */
static uint64_t *table64(size_t cap) {
    size_t bytes = cap * sizeof(uint64_t), huge = (size_t)2 << 20;
    if (bytes < huge) return calloc(cap, sizeof(uint64_t));
    void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
    if (!p) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE); /* a hint: refused or unsupported, the table works the same */
    memset(p, 0, bytes);
    return (uint64_t *)p;
}

static int grow_table(uint32_t **slots, size_t *mask, size_t want) {
    size_t cap = 16;
    while (cap < want) cap <<= 1;
    uint32_t *s = calloc(cap, sizeof(uint32_t));
    if (!s) return -1;
    free(*slots);
    *slots = s;
    *mask = cap - 1;
    return 0;
}

/* Rehash the records still live into a table at most half full (merge rehashes at three quarters: with
 * the tags a probe passes other keys a word each, so fuller tables cost little), dropping the dead ones from
 * `recs` (the live keep their order): a rehash then costs what was added since the last one, not
 * every record ever read, so COMMIT/REMOVE churn over a small live set cannot make a replay
 * quadratic. */
static int rehash(jlive *L, size_t live) {
    size_t cap = 16;
    while (cap < (live + 1) * 2) cap <<= 1;
    uint64_t *s = table64(cap);
    if (!s) return -1;
    free(L->slots);
    L->slots = s;
    L->mask = cap - 1;
    size_t w = 0;
    for (size_t r = 0; r < L->n; r++) {
        if (!L->recs[r].live) continue;
        if (w != r) L->recs[w] = L->recs[r];
        size_t i = L->recs[w].hash & L->mask;
        while (L->slots[i]) i = (i + 1) & L->mask;
        L->slots[i] = (L->recs[w].hash & TAG) | (uint32_t)(w + 1);
        w++;
    }
    L->n = L->used = w;
    return 0;
}

/* The namespace number of body[1 .. 3 + n) (its u16 length and its bytes), added when new. */
static long ns_number(jlive *L, const unsigned char *half, uint64_t pos, uint16_t n) {
    const unsigned char *p = half + pos + 1;
    uint64_t h = span_hash(p, (size_t)n + 2);
    size_t i = h & L->ns_mask;
    for (uint32_t s; (s = L->ns_slots[i]); i = (i + 1) & L->ns_mask) {
        size_t j = s - 1;
        if (L->ns_hash[j] == h && L->ns_len[j] == n && memcmp(half + L->ns_pos[j] + 1, p, (size_t)n + 2) == 0)
            return (long)j;
    }
    if (L->nns == L->ns_cap) {
        size_t cap = L->ns_cap * 2;
        uint64_t *a = realloc(L->ns_pos, cap * sizeof(uint64_t));
        if (!a) return -1;
        L->ns_pos = a;
        uint64_t *c = realloc(L->ns_hash, cap * sizeof(uint64_t));
        if (!c) return -1;
        L->ns_hash = c;
        uint16_t *b = realloc(L->ns_len, cap * sizeof(uint16_t));
        if (!b) return -1;
        L->ns_len = b;
        L->ns_cap = cap;
    }
    if ((L->nns + 1) * 2 > L->ns_mask + 1) {
        if (grow_table(&L->ns_slots, &L->ns_mask, (L->nns + 1) * 4) < 0) return -1;
        for (size_t j = 0; j < L->nns; j++) {
            size_t k = L->ns_hash[j] & L->ns_mask;
            while (L->ns_slots[k]) k = (k + 1) & L->ns_mask;
            L->ns_slots[k] = (uint32_t)(j + 1);
        }
        i = h & L->ns_mask;
        while (L->ns_slots[i]) i = (i + 1) & L->ns_mask;
    }
    size_t j = L->nns++;
    L->ns_pos[j] = pos; L->ns_len[j] = n; L->ns_hash[j] = h;
    L->ns_slots[i] = (uint32_t)(j + 1);
    return (long)j;
}

/* The slot whose record names the same (namespace, key) span as `p`, or the empty slot to take. */
static size_t find_key(const jlive *L, const unsigned char *half, const unsigned char *p, size_t n, uint64_t h, int *found) {
    size_t i = h & L->mask, first_tomb = (size_t)-1;
    for (uint64_t w; (w = L->slots[i]); i = (i + 1) & L->mask) {
        uint32_t s = (uint32_t)w;
        if (s == TOMB) {
            if (first_tomb == (size_t)-1) first_tomb = i;
            continue;
        }
        if ((w & TAG) != (h & TAG)) continue;
        const jrec *r = &L->recs[s - 1];
        if (r->hash == h && (size_t)r->ns_len + r->key_len + 4 == n && memcmp(half + r->pos + 1, p, n) == 0) {
            *found = 1;
            return i;
        }
    }
    *found = 0;
    return first_tomb != (size_t)-1 ? first_tomb : i;
}

#define PREFETCH_AHEAD 8

/* Prefetch the merge-table slot where a COMMIT's or REMOVE's (namespace, key) span would start its
 * probe, as merge hashes it; anything that does not parse is skipped (merge will say so). */
static inline void prefetch_slot(const jlive *L, const unsigned char *b, uint32_t len) {
    if ((b[0] != J_COMMIT && b[0] != J_REMOVE) || len < 5) return;
    uint16_t ns_len = rd16(b + 1);
    if ((uint64_t)ns_len + 5 > len) return;
    uint16_t key_len = rd16(b + 3 + ns_len);
    size_t span = (size_t)ns_len + key_len + 4;
    if (span + 1 > len) return;
    __builtin_prefetch(&L->slots[span_hash(b + 1, span) & L->mask]);
}

/* Parse one crc-checked body and merge it. 1: merged; 0: it does not parse (the replay ends at it,
 * as journal.parse's error ends the Python replay); -1: out of memory. */
static int merge(jlive *L, const unsigned char *half, uint64_t pos, uint32_t len, uint64_t order[2], int *have_order,
                 size_t *live) {
    const unsigned char *b = half + pos;
    unsigned kind = b[0];
    if (kind == J_ORDER) {
        if (len < 17) return 0;
        uint32_t ways = rd32(b + 5);
        uint64_t gran = rd64(b + 9);
        if (ways < 1 || gran < 1) return 0;
        order[0] = ways; order[1] = gran; *have_order = 1;
        return 1;
    }
    if (kind != J_COMMIT && kind != J_REMOVE) return 0;
    if (len < 3) return 0;
    uint16_t ns_len = rd16(b + 1);
    if ((uint64_t)ns_len + 5 > len) return 0;
    uint16_t key_len = rd16(b + 3 + ns_len);
    uint64_t at = (uint64_t)ns_len + 5 + key_len; /* where the COMMIT's nbytes start */
    if (at > len) return 0;
    jrec r = {.pos = pos, .len = len, .ns_len = ns_len, .key_len = key_len, .live = 1};
    if (kind == J_COMMIT) {
        if (at + 10 > len) return 0;
        r.nbytes = rd64(b + at);
        r.nblocks = rd16(b + at + 8);
        uint64_t tail = at + 10 + (uint64_t)r.nblocks * 16;
        if (tail > len) return 0;
        if (tail + 6 <= len) {
            if (rd16(b + tail) != J_CRC32C) return 0;
            r.crc = rd32(b + tail + 2);
            r.has_crc = 1;
        }
    }
    long ns = ns_number(L, half, pos, ns_len);
    if (ns < 0) return -1;
    r.ns = (uint32_t)ns;
    size_t span = (size_t)ns_len + key_len + 4;
    r.hash = span_hash(b + 1, span);
    int found;
    size_t i = find_key(L, half, b + 1, span, r.hash, &found);
    if (kind == J_REMOVE) {
        if (found) {
            L->recs[(uint32_t)L->slots[i] - 1].live = 0;
            L->slots[i] = TOMB;
            (*live)--;
        }
        return 1;
    }
    if (found) {
        L->recs[(uint32_t)L->slots[i] - 1] = r; /* the same key: the same hash, so the same tag */
        return 1;
    }
    if (L->n == L->cap) {
        size_t cap = L->cap * 2;
        jrec *a = realloc(L->recs, cap * sizeof(jrec));
        if (!a) return -1;
        L->recs = a;
        L->cap = cap;
    }
    if (L->n >= TOMB - 1) return -1;
    if (L->slots[i] == 0) L->used++;
    L->recs[L->n] = r;
    L->slots[i] = (r.hash & TAG) | (uint32_t)(++L->n);
    (*live)++;
    if (L->used * 4 > (L->mask + 1) * 3 && rehash(L, *live) < 0) return -1;
    return 1;
}

static void jlive_free(jlive *L) {
    free(L->recs); free(L->slots); free(L->ns_pos); free(L->ns_len); free(L->ns_hash); free(L->ns_slots);
}

/* The Python objects of the live set (the GIL held). */
static PyObject *live_result(const jlive *L, const unsigned char *half, uint64_t end, const uint64_t order[2],
                             int have_order, size_t live, uint64_t chunk) {
    PyObject *names = NULL, *ns_ids = NULL, *keys = NULL, *one = NULL, *multi = NULL, *sums = NULL, *spans = NULL;
    PyObject *out = NULL;
    size_t kept = 0, unchecked = 0, odd = 0;
    for (size_t r = 0; r < L->n; r++)
        if (L->recs[r].live) { if (L->recs[r].has_crc) kept++; else unchecked++; }
    (void)live;
    if (!(names = PyList_New((Py_ssize_t)L->nns))) goto fail;
    for (size_t j = 0; j < L->nns; j++) {
        PyObject *s = PyBytes_FromStringAndSize((const char *)half + L->ns_pos[j] + 3, L->ns_len[j]);
        if (!s) goto fail;
        PyList_SET_ITEM(names, (Py_ssize_t)j, s);
    }
    if (!(ns_ids = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(kept * 4)))) goto fail;
    if (!(spans = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(kept * 16)))) goto fail;
    if (!(one = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(kept * 24)))) goto fail;
    if (!(keys = PyList_New((Py_ssize_t)kept)) || !(multi = PyList_New(0)) ||
        !(sums = PyList_New((Py_ssize_t)kept)))
        goto fail;
    uint32_t *ids = (uint32_t *)PyBytes_AS_STRING(ns_ids);
    uint64_t *sp = (uint64_t *)PyBytes_AS_STRING(spans);
    uint64_t *tri = (uint64_t *)PyBytes_AS_STRING(one);
    size_t k = 0, m = 0;
    for (size_t r = 0; r < L->n; r++) {
        const jrec *e = &L->recs[r];
        if (!e->live || !e->has_crc) continue;
        const unsigned char *b = half + e->pos;
        ids[k] = e->ns;
        sp[2 * k] = e->pos; sp[2 * k + 1] = e->len;
        PyObject *key = PyBytes_FromStringAndSize((const char *)b + 5 + e->ns_len, e->key_len);
        if (!key) goto fail;
        PyList_SET_ITEM(keys, (Py_ssize_t)k, key);
        PyObject *crc = PyLong_FromUnsignedLong(e->crc);
        if (!crc) goto fail;
        PyList_SET_ITEM(sums, (Py_ssize_t)k, crc);
        const unsigned char *q = b + 5 + e->ns_len + e->key_len + 10;
        tri[3 * k] = e->nbytes;
        if (e->nblocks == 1 && rd64(q) != 0) { /* most records: (nbytes, size, offset), no Python objects */
            uint64_t size = rd64(q), off = rd64(q + 8);
            if (size > chunk / 2 && size < chunk) odd++;
            tri[3 * k + 1] = size; tri[3 * k + 2] = off;
        } else { /* size 0 (never a block's: one of size 0 goes here too), and the record's place in `multi` */
            PyObject *blocks = PyList_New(e->nblocks);
            if (!blocks) goto fail;
            if (PyList_Append(multi, blocks) < 0) { Py_DECREF(blocks); goto fail; }
            Py_DECREF(blocks); /* `multi` holds it; the items are set below */
            for (uint16_t i = 0; i < e->nblocks; i++, q += 16) {
                uint64_t size = rd64(q), off = rd64(q + 8);
                if (size > chunk / 2 && size < chunk) odd++;
                PyObject *t = Py_BuildValue("(KK)", (unsigned long long)size, (unsigned long long)off);
                if (!t) goto fail;
                PyList_SET_ITEM(blocks, i, t);
            }
            tri[3 * k + 1] = 0; tri[3 * k + 2] = m++;
        }
        k++;
    }
    PyObject *ord = have_order ? Py_BuildValue("(KK)", (unsigned long long)order[0], (unsigned long long)order[1])
                               : Py_NewRef(Py_None);
    if (!ord) goto fail;
    out = Py_BuildValue("(KNNNNNNNNnn)", (unsigned long long)end, ord, names, ns_ids, keys, one, multi, sums, spans,
                        (Py_ssize_t)unchecked, (Py_ssize_t)odd);
    return out; /* Py_BuildValue's N took the references, also on failure */
fail:
    Py_XDECREF(names); Py_XDECREF(ns_ids); Py_XDECREF(keys); Py_XDECREF(one); Py_XDECREF(multi); Py_XDECREF(sums);
    Py_XDECREF(spans);
    return NULL;
}

/* journal_replay(buf, base, size, seed, flush, scan_flush, chunk): the half [base, base + size) of
 * `buf`, scanned from its start with records checked against crc seed `seed` (zlib.crc32 of the
 * generation's u64), invalidated `scan_flush` bytes ahead at a time when `flush`. Returns
 *   (end, order, names, ns_ids, keys, one, multi, checksums, spans, unchecked, odd):
 * end: where the replay stopped (the first record that does not check out or parse); order: the last
 * ORDER's (ways, granularity), or None; names: every namespace named, as bytes, in first-seen order;
 * then for each live COMMIT with a checksum, in the order a dict would hold them: ns_ids (u32 each,
 * into names), keys (bytes), one (u64 nbytes, u64 block size, u64 block offset; for a record of
 * several blocks, or of one of size 0, size 0 and its place in multi), multi (their [(size, offset), ...] lists), checksums
 * (int) and spans (u64 body offset in the half, u64 body length); unchecked: live COMMITs without a checksum (left
 * out); odd: blocks of a size above half of `chunk` and below it (an older version's class). */
PyObject *py_journal_replay(PyObject *self, PyObject *args) {
    Py_buffer v;
    Py_ssize_t base, size, scan_flush;
    unsigned long seed;
    int flush;
    unsigned long long chunk;
    if (!PyArg_ParseTuple(args, "y*nnkpnK", &v, &base, &size, &seed, &flush, &scan_flush, &chunk)) return NULL;
    char *half;
    if (get_range(&v, base, size, &half) < 0) { PyBuffer_Release(&v); return NULL; }
    if (!crc_t_ready) crc_ieee_init();
    if (scan_flush < LINE) scan_flush = LINE;
    jlive L = {0};
    L.cap = 1024; L.ns_cap = 16;
    L.recs = malloc(L.cap * sizeof(jrec));
    L.ns_pos = malloc(L.ns_cap * sizeof(uint64_t));
    L.ns_len = malloc(L.ns_cap * sizeof(uint16_t));
    L.ns_hash = malloc(L.ns_cap * sizeof(uint64_t));
    L.slots = calloc(4096, sizeof(uint64_t));
    L.mask = 4095;
    if (!L.recs || !L.slots || !L.ns_pos || !L.ns_len || !L.ns_hash ||
        grow_table(&L.ns_slots, &L.ns_mask, 64) < 0) {
        jlive_free(&L);
        PyBuffer_Release(&v);
        return PyErr_NoMemory();
    }
    const unsigned char *h = (const unsigned char *)half;
    uint64_t end = (uint64_t)size, pos = 0, flushed = 0, order[2] = {0, 0};
    int have_order = 0, bad = 0;
    size_t live = 0;
    uint64_t ahead = 0; /* the next record whose merge-table slot is not yet prefetched */
    unsigned lead = 0;  /* records from pos to ahead */
    Py_BEGIN_ALLOW_THREADS
    while (pos + 8 <= end) {
        /* Each merge probes the table at a random place: at millions of records a cache miss (most of
         * the replay's time). The slot of the record PREFETCH_AHEAD on is asked for now, so it is
         * there by its turn. A hint only: the merge parses and hashes the record again, checked; on
         * a pool that needs flushes nothing is read ahead of the flushed part. */
        while (!flush && lead < PREFETCH_AHEAD && ahead + 8 <= end) {
            uint32_t alen = rd32(h + ahead);
            if (alen == 0 || ahead + 8 + alen > end) { ahead = end; break; }
            prefetch_slot(&L, h + ahead + 8, alen);
            ahead += 8 + (uint64_t)alen;
            lead++;
        }
        if (flush && flushed < pos + 8) {
            uint64_t top = flushed + (uint64_t)scan_flush > pos + 8 ? flushed + (uint64_t)scan_flush : pos + 8;
            if (top > end) top = end;
            flush_range(half + flushed, top - flushed, 1); full_fence();
            flushed = top;
        }
        uint32_t len = rd32(h + pos), crc = rd32(h + pos + 4);
        uint64_t stop = pos + 8 + len;
        if (len == 0 || stop > end) break;
        if (flush && flushed < stop) {
            uint64_t top = flushed + (uint64_t)scan_flush > stop ? flushed + (uint64_t)scan_flush : stop;
            if (top > end) top = end;
            flush_range(half + flushed, top - flushed, 1); full_fence();
            flushed = top;
        }
        if (crc_ieee((uint32_t)seed, h + pos + 8, len) != crc) break;
        int m = merge(&L, h, pos + 8, len, order, &have_order, &live);
        if (m < 0) { bad = 1; break; }
        if (m == 0) break;
        pos = stop;
        if (lead) lead--;
        if (ahead < pos) { ahead = pos; lead = 0; }
    }
    Py_END_ALLOW_THREADS
    PyObject *out = bad ? PyErr_NoMemory() : live_result(&L, h, pos, order, have_order, live, chunk);
    jlive_free(&L);
    PyBuffer_Release(&v);
    return out;
}

/* journal_copy(buf, src_base, src_size, spans, dst_base, room, seed, flush): each body `spans` names
 * (u64 offset in the source half [src_base, +src_size), u64 length) written as a record (u32 length,
 * u32 crc32 under `seed`, the body) one after the other from dst_base, with the lines written back
 * and a fence at the end when `flush`. Returns the bytes written, or -1 (nothing written) when they
 * would not fit in `room`. A span outside the source half, or a destination outside the buffer or
 * overlapping the source, is a ValueError. */
PyObject *py_journal_copy(PyObject *self, PyObject *args) {
    Py_buffer v, s;
    Py_ssize_t src_base, src_size, dst_base, room;
    unsigned long seed;
    int flush;
    if (!PyArg_ParseTuple(args, "w*nny*nnkp", &v, &src_base, &src_size, &s, &dst_base, &room, &seed, &flush)) return NULL;
    PyObject *out = NULL;
    char *src, *dst;
    unsigned char *sp = NULL; /* the spans, copied: checked and used from one copy */
    if (s.len % 16) {
        PyErr_SetString(PyExc_ValueError, "spans must be (u64 offset, u64 length) pairs");
        goto done;
    }
    if (get_range(&v, src_base, src_size, &src) < 0 || get_range(&v, dst_base, room, &dst) < 0) goto done;
    if (dst_base < src_base + src_size && src_base < dst_base + room) {
        PyErr_SetString(PyExc_ValueError, "the destination overlaps the source half");
        goto done;
    }
    if (!crc_t_ready) crc_ieee_init();
    Py_ssize_t n = s.len / 16;
    /* `spans` may be a buffer that changes while the GIL is released (another thread's, or one
     * inside the destination): what is checked must be what is used. */
    if (!(sp = PyMem_Malloc(s.len ? (size_t)s.len : 1))) { PyErr_NoMemory(); goto done; }
    memcpy(sp, s.buf, (size_t)s.len);
    uint64_t need = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t pos = rd64(sp + 16 * i), len = rd64(sp + 16 * i + 8);
        if (len == 0 || len > 0xffffffffull || pos > (uint64_t)src_size || len > (uint64_t)src_size - pos) {
            PyErr_Format(PyExc_ValueError, "span %zd (%llu, +%llu) is outside the source half", i,
                         (unsigned long long)pos, (unsigned long long)len);
            goto done;
        }
        need += 8 + len;
    }
    if (need > (uint64_t)room) { out = PyLong_FromLong(-1); goto done; }
    Py_BEGIN_ALLOW_THREADS
    unsigned char *d = (unsigned char *)dst;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t pos = rd64(sp + 16 * i), len = rd64(sp + 16 * i + 8);
        memcpy(d + 8, src + pos, len);
        wr32(d, (uint32_t)len);
        wr32(d + 4, crc_ieee((uint32_t)seed, d + 8, len)); /* of the bytes written, not re-read */
        d += 8 + len;
    }
    if (flush && need) { flush_range(dst, need, 0); store_fence(); }
    Py_END_ALLOW_THREADS
    out = PyLong_FromUnsignedLongLong(need);
done:
    PyMem_Free(sp);
    PyBuffer_Release(&s);
    PyBuffer_Release(&v);
    return out;
}
