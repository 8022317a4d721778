#include "_native_ring.h"
#include <sys/mman.h>

/* The metadata server's lookup fast path.
 * A C mirror of the index's visible keys ((namespace id, key) -> entry id), kept in step by the
 * Python index on every commit and removal, lets `fast_serve` answer LOOKUP_PREFIX and PING
 * requests straight from the rings without entering Python. Anything else (another opcode, a
 * reconnecting client, a malformed slot, a key longer than FI_KEY) stops the burst and is handed
 * back to the Python server, which answers it the slow, general way. Leases granted here are
 * appended to a log the Python index applies before it does anything else, so eviction always
 * sees them. */

#define FI_KEY 64

#define FI_INLINE 32 /* a key this long or shorter (vLLM's sha256 block hashes) is kept in its entry */

/* One mirrored key, what fast_serve reads: 64 bytes, one cache line. Entries live in segments of
 * FI_SEG that never move; the hash table holds 8-byte words pointing at them, so a growth moves
 * words, not entries, and a key costs its entry plus 16 to 32 bytes of table (the table's slots held
 * 104-byte entries themselves before, a quarter to an eighth full: 400+ bytes a key). */
typedef struct {
    uint64_t hash;
    int64_t id; /* the entry id; a free entry: the next free position + 1 (0: none) */
    uint32_t ns;
    uint16_t get_len;
    uint8_t klen;
    uint8_t state; /* 0 free, 1 used */
    union {
        uint8_t key[FI_INLINE]; /* klen <= FI_INLINE */
        uint8_t *long_key; /* klen > FI_INLINE: its own allocation */
    };
    uint8_t *get_reply; /* the GET reply payload (lease id at bytes 0..8 patched per request), or NULL */
} fi_slot;

_Static_assert(sizeof(fi_slot) == 64, "a mirrored key's entry is one cache line");

static inline const uint8_t *fi_key(const fi_slot *s) { return s->klen <= FI_INLINE ? s->key : s->long_key; }

#define FI_SEG_BITS 16
#define FI_SEG ((size_t)1 << FI_SEG_BITS)
#define FI_SEGS ((size_t)1 << 16)
#define FI_MAX_ENTS (FI_SEGS * FI_SEG - 2) /* a word keeps position + 2 in 32 bits */

/* A table word: 0 empty, 1 deleted (a tombstone), else the top 32 bits of the key's hash (a probe
 * compares them before it reads the entry) and the entry's position + 2. */
#define FI_WORD(h, pos) (((h) & 0xffffffff00000000ull) | (uint64_t)((pos) + 2))
#define FI_POS(w) ((size_t)(uint32_t)(w) - 2)

typedef struct {
    uint64_t *slots;
    size_t cap; /* power of two */
    size_t used; /* live keys, in both tables while growing */
    size_t tombs; /* deleted slots of `slots` */
    /* While growing: the table before, moved into `slots` FI_MOVE slots per put and per delete
     * (fi_move), so no call rehashes the whole table (at millions of keys that stopped the server
     * for seconds). A key is in exactly one of the two; lookups look in `slots`, then here. */
    uint64_t *old;
    size_t oldcap;
    size_t moved; /* old slots [0, moved) are moved (or were empty): no key there, never read again */
    size_t released; /* bytes at the start of `old` given back to the kernel */
    fi_slot **segs; /* FI_SEGS segment pointers, each mapped when first needed */
    size_t nents; /* entry positions handed out so far */
    size_t free_head; /* a freed entry's position + 1, 0: none */
    /* Lease room (fi_set_room): how many more leases each ring and each tenant may get. room[r] for
     * ring r, room[ring_slot[r]] for its tenant; a grant takes one of each. A ring without room gets
     * a miss, answered here (a lookup: count 0, no lease; a GET_MANY: the keys past the room as
     * absent), counted in room[ring_slot[r] + tenants] (the tenant's refusals); a GET is left to
     * Python. No room set: no cap (old servers, tests). */
    Py_buffer room_buf;
    int64_t *room;
    Py_ssize_t room_len, tenants;
    int64_t *ring_slot;
    Py_ssize_t nrings;
    /* With tenants: ns_slot[ns] is the tenant cell of namespace ns (-1: none). A request naming a
     * namespace that is not its ring's tenant's is left to Python (UNKNOWN_NS). NULL: no check. */
    Py_buffer ns_buf;
    int64_t *ns_slot;
    Py_ssize_t ns_len;
} FastIndex;

/* The key's hash: CPython's own hash of the bytes (SipHash under the per-process random secret, so a
 * client cannot choose keys whose probe chains collide: with an unseeded hash, colliding keys made
 * each lookup walk the cluster), mixed with the namespace. The same as hash(key) in Python. */
static uint64_t fi_hash(uint32_t ns, const uint8_t *k, size_t n) {
    uint64_t h = (uint64_t)_Py_HashBytes(k, (Py_ssize_t)n) ^ ((uint64_t)ns * 0x9e3779b97f4a7c15ull);
    h ^= h >> 33; h *= 0xff51afd7ed558ccdull; h ^= h >> 33;
    return h | 1; /* never 0 */
}

static inline fi_slot *fi_ent(const FastIndex *fi, size_t pos) {
    return &fi->segs[pos >> FI_SEG_BITS][pos & (FI_SEG - 1)];
}

/* The slot of `slots` whose word names the key, or NULL. Slots below `from` hold no key (an old
 * table's moved part, whose pages may be given back and read as zeros): a probe that reaches them
 * goes on at `from`. */
static uint64_t *fi_find_in(const FastIndex *fi, uint64_t *slots, size_t cap, size_t from, uint32_t ns,
                            const uint8_t *k, size_t n, uint64_t h) {
    size_t mask = cap - 1, i = h & mask;
    uint64_t tag = h & 0xffffffff00000000ull;
    for (size_t probes = 0; probes < cap; i = (i + 1) & mask, probes++) {
        if (i < from) {
            probes += from - i;
            if (probes >= cap) break;
            i = from;
        }
        uint64_t w = slots[i];
        if (w == 0) return NULL;
        if (w > 1 && (w & 0xffffffff00000000ull) == tag) {
            const fi_slot *s = fi_ent(fi, FI_POS(w));
            if (s->hash == h && s->ns == ns && s->klen == n && memcmp(fi_key(s), k, n) == 0) return &slots[i];
        }
    }
    return NULL;
}

/* The table slot naming the key, in either table (`*in_new` says which), or NULL. */
static uint64_t *fi_locate(FastIndex *fi, uint32_t ns, const uint8_t *k, size_t n, uint64_t h, int *in_new) {
    uint64_t *w = fi_find_in(fi, fi->slots, fi->cap, 0, ns, k, n, h);
    *in_new = w != NULL;
    if (!w && fi->old) w = fi_find_in(fi, fi->old, fi->oldcap, fi->moved, ns, k, n, h);
    return w;
}

static fi_slot *fi_find(FastIndex *fi, uint32_t ns, const uint8_t *k, size_t n, uint64_t h) {
    int in_new;
    uint64_t *w = fi_locate(fi, ns, k, n, h, &in_new);
    return w ? fi_ent(fi, FI_POS(*w)) : NULL;
}

/* Each table and each segment is an anonymous mapping of its own (zero pages until touched), so the
 * moved part of an old table is given back as the move goes (madvise) and its end unmaps almost
 * nothing: unmapping 400 MB of touched pages at once took 50 ms. */
static void *fi_map(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static uint64_t *fi_table(size_t cap) { return (uint64_t *)fi_map(cap * sizeof(uint64_t)); }

static void fi_table_free(uint64_t *t, size_t cap) {
    if (t) munmap(t, cap * sizeof(uint64_t));
}

/* A free entry position (a freed one first), its segment mapped; (size_t)-1 when none is left. */
static size_t fi_ent_new(FastIndex *fi) {
    if (fi->free_head) {
        size_t pos = fi->free_head - 1;
        fi->free_head = (size_t)fi_ent(fi, pos)->id;
        return pos;
    }
    if (fi->nents >= FI_MAX_ENTS) return (size_t)-1;
    size_t seg = fi->nents >> FI_SEG_BITS;
    if (!fi->segs[seg] && !(fi->segs[seg] = fi_map(FI_SEG * sizeof(fi_slot)))) return (size_t)-1;
    return fi->nents++;
}

static void fi_ent_free(FastIndex *fi, size_t pos) {
    fi_slot *s = fi_ent(fi, pos);
    free(s->get_reply);
    if (s->klen > FI_INLINE) free(s->long_key);
    s->get_reply = NULL; s->get_len = 0; s->state = 0; s->klen = 0;
    s->id = (int64_t)fi->free_head;
    fi->free_head = pos + 1;
}

#define FI_RELEASE ((size_t)2 << 20) /* bytes of moved slots given back at a time */

/* Old slots moved per put and per delete while growing. A growth leaves the new table about a
 * quarter full and the next one comes at half, so about cap/4 puts lie between two growths: 16 a
 * call moves the old table (half the new one, or a table of the same size whose rehash only drops
 * tombstones) in cap/32 to cap/16 calls. */
#define FI_MOVE 16

/* Move up to `budget` old slots into the new table; frees the old table once it is empty. */
static void fi_move(FastIndex *fi, size_t budget) {
    if (!fi->old) return;
    size_t mask = fi->cap - 1;
    for (; budget && fi->moved < fi->oldcap; budget--, fi->moved++) {
        uint64_t w = fi->old[fi->moved];
        if (w < 2) continue;
        size_t j = fi_ent(fi, FI_POS(w))->hash & mask;
        while (fi->slots[j] > 1) j = (j + 1) & mask;
        if (fi->slots[j] == 1) fi->tombs--;
        fi->slots[j] = w; /* the key is in no other slot of the new table: one home per key */
        fi->old[fi->moved] = 1; /* a tombstone keeps the old probe chains whole for the keys still there */
    }
    if (fi->moved == fi->oldcap) {
        fi_table_free(fi->old, fi->oldcap);
        fi->old = NULL; fi->oldcap = 0; fi->moved = 0; fi->released = 0;
        return;
    }
    size_t upto = fi->moved * sizeof(uint64_t) / FI_RELEASE * FI_RELEASE;
    if (upto > fi->released) {
        madvise((char *)fi->old + fi->released, upto - fi->released, MADV_DONTNEED);
        fi->released = upto;
    }
}

/* A new, empty table of `cap` slots; the current one becomes `old`, moved a few slots per call.
 * A fresh mapping's pages are zero until touched, so this costs nothing in proportion to `cap`. */
static int fi_grow(FastIndex *fi, size_t cap, int huge) {
    if (fi->old) fi_move(fi, (size_t)-1); /* the previous growth unfinished (not expected): finish it */
    uint64_t *fresh = fi_table(cap);
    if (!fresh) return -1;
    /* A restore's table, filled at random by the batch that made it: in huge pages where the kernel
     * gives them on request, or its probes also miss the TLB. A hint (refused: nothing changes). Only
     * here, where the batch itself touches every page: a huge page's first touch may compact memory
     * (transparent_hugepage/defrag "madvise"), which must not happen inside a served request. */
    if (huge && cap * sizeof(uint64_t) >= ((size_t)2 << 20)) madvise(fresh, cap * sizeof(uint64_t), MADV_HUGEPAGE);
    fi->old = fi->slots; fi->oldcap = fi->cap; fi->moved = 0; fi->released = 0;
    fi->slots = fresh; fi->cap = cap; fi->tombs = 0;
    return 0;
}

static void fi_free(PyObject *cap) {
    FastIndex *fi = PyCapsule_GetPointer(cap, "belugactl.fastindex");
    if (fi) {
        for (size_t pos = 0; pos < fi->nents; pos++) {
            fi_slot *s = fi_ent(fi, pos);
            if (s->state == 1) {
                free(s->get_reply);
                if (s->klen > FI_INLINE) free(s->long_key);
            }
        }
        for (size_t seg = 0; seg < FI_SEGS && fi->segs[seg]; seg++) munmap(fi->segs[seg], FI_SEG * sizeof(fi_slot));
        free(fi->segs);
        fi_table_free(fi->slots, fi->cap);
        fi_table_free(fi->old, fi->oldcap);
        if (fi->room) PyBuffer_Release(&fi->room_buf);
        if (fi->ns_slot) PyBuffer_Release(&fi->ns_buf);
        free(fi->ring_slot);
        free(fi);
    }
}

static FastIndex *fi_get(PyObject *cap) {
    return (FastIndex *)PyCapsule_GetPointer(cap, "belugactl.fastindex");
}

PyObject *py_fi_new(PyObject *self, PyObject *noargs) {
    FastIndex *fi = calloc(1, sizeof(FastIndex));
    if (!fi) return PyErr_NoMemory();
    fi->cap = 1024;
    fi->slots = fi_table(fi->cap);
    fi->segs = calloc(FI_SEGS, sizeof(fi_slot *));
    if (!fi->slots || !fi->segs) {
        fi_table_free(fi->slots, fi->cap);
        free(fi->segs);
        free(fi);
        return PyErr_NoMemory();
    }
    return PyCapsule_New(fi, "belugactl.fastindex", fi_free);
}

/* Put one key: 1 put, 0 a key too long (or empty) to mirror, -1 an error (exception set).
 * g/glen: the GET reply payload for this entry (its first 8 bytes, the lease id, are patched per
 * request); none, or longer than a fast reply can be, means GETs of it go to Python. */
static int fi_put_raw(FastIndex *fi, unsigned int ns, const uint8_t *k, Py_ssize_t klen, long long id,
                      const uint8_t *g, Py_ssize_t glen) {
    if (klen <= 0 || klen > FI_KEY) return 0;
    uint8_t *blob = NULL;
    if (g && glen >= 8 && glen <= FAST_REPLY_MAX) {
        if (!(blob = malloc((size_t)glen))) { PyErr_NoMemory(); return -1; }
        memcpy(blob, g, (size_t)glen);
    }
    fi_move(fi, FI_MOVE);
    if ((fi->used + fi->tombs + 1) * 2 > fi->cap) {
        size_t want = fi->cap;
        while (fi->used * 4 > want) want *= 2; /* about a quarter full after growth: doubles at half */
        if (fi_grow(fi, want, 0) < 0) { free(blob); PyErr_NoMemory(); return -1; }
    }
    uint64_t h = fi_hash(ns, k, (size_t)klen);
    fi_slot *s = fi_find(fi, ns, k, (size_t)klen, h); /* in either table: a re-put stays where it is */
    if (s) {
        free(s->get_reply); /* a re-put replaces the old entry (same key: its bytes stay) */
    } else {
        uint8_t *long_key = NULL;
        if (klen > FI_INLINE) {
            if (!(long_key = malloc((size_t)klen))) { free(blob); PyErr_NoMemory(); return -1; }
            memcpy(long_key, k, (size_t)klen);
        }
        size_t pos = fi_ent_new(fi);
        if (pos == (size_t)-1) { free(long_key); free(blob); PyErr_NoMemory(); return -1; }
        size_t mask = fi->cap - 1, i = h & mask;
        while (fi->slots[i] > 1) i = (i + 1) & mask;
        if (fi->slots[i] == 1) fi->tombs--;
        fi->slots[i] = FI_WORD(h, pos);
        fi->used++;
        s = fi_ent(fi, pos);
        s->hash = h; s->ns = ns; s->klen = (uint8_t)klen;
        if (long_key) s->long_key = long_key;
        else memcpy(s->key, k, (size_t)klen);
    }
    s->state = 1; s->id = id;
    s->get_reply = blob; s->get_len = blob ? (uint16_t)glen : 0;
    return 1;
}

/* fi_put(fi, ns, key, id, get_reply=b"") -> True, or False for a key too long to mirror. */
PyObject *py_fi_put(PyObject *self, PyObject *args) {
    PyObject *cap; unsigned int ns; Py_buffer k; long long id; Py_buffer g = {0};
    if (!PyArg_ParseTuple(args, "OIy*L|y*", &cap, &ns, &k, &id, &g)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    if (fi) {
        int put = fi_put_raw(fi, ns, k.buf, k.len, id, g.buf, g.buf ? g.len : 0);
        if (put >= 0) r = PyBool_FromLong(put);
    }
    PyBuffer_Release(&k);
    if (g.buf) PyBuffer_Release(&g);
    return r;
}

static inline void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* A field read the way getattr reads it, straight from the object's __slots__ cell when the object
 * is exactly of the class the cell's offset came from (a restore reads seven fields of millions of
 * entries; the attribute lookups were a third of its mirror's time). */
typedef struct {
    PyTypeObject *tp; /* NULL: always getattr */
    Py_ssize_t off;
    PyObject *name;
} fieldref;

/* Where `tp` keeps `name` when it is a plain object slot read by the generic getattr, else f->tp NULL. */
static void field_for(fieldref *f, PyTypeObject *tp, PyObject *name) {
    f->tp = NULL; f->off = 0; f->name = name;
    if (tp->tp_getattro != PyObject_GenericGetAttr) return;
    PyObject *d = PyObject_GetAttr((PyObject *)tp, name);
    if (!d) { PyErr_Clear(); return; }
    Py_ssize_t off = member_slot_offset(tp, d);
    if (off >= 0) { f->tp = tp; f->off = off; }
    Py_DECREF(d);
}

static PyObject *field_get(PyObject *o, const fieldref *f) {
    if (f->tp && Py_TYPE(o) == f->tp) {
        PyObject *v = *(PyObject **)((char *)o + f->off);
        if (v) return Py_NewRef(v);
    }
    return PyObject_GetAttr(o, f->name); /* another class, or an empty slot: getattr says what it says */
}

/* An int field of `o` as a long long, or -1 with *ok cleared (not an int, out of range: the
 * caller makes the reply the general way). */
static long long attr_ll(PyObject *o, const fieldref *f, int *ok) {
    PyObject *v = field_get(o, f);
    if (!v) { *ok = -1; return -1; }
    long long x = -1;
    if (PyLong_CheckExact(v)) {
        x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) { PyErr_Clear(); *ok = 0; }
    } else {
        *ok = 0;
    }
    Py_DECREF(v);
    return x;
}

/* fi_put_entries(fi, entries, get_reply, pack_one) -> keys put.
 * The mirror's puts of many index entries at once (a restart restores millions; a call per entry with
 * its reply made in Python was a fifth of the start). Each entry is read as mds/index.py's `Entry`:
 * key (namespace id, key bytes), id, checksum, alloc. With pack_one, an entry of one block with a u32
 * checksum (alloc._a the offset, alloc._b the class size, mds/allocator.py) gets the one-extent GET
 * reply built here: lease 0, nbytes, 1 extent, CRC32C, the checksum, offset, min(size, nbytes), as
 * protocol.encode_get_reply_one packs it; every other entry's reply is get_reply(entry). A key too long
 * to mirror is skipped, as fi_put does. */
PyObject *py_fi_put_entries(PyObject *self, PyObject *args) {
    PyObject *cap, *seq, *fallback; int pack_one;
    if (!PyArg_ParseTuple(args, "OOOp", &cap, &seq, &fallback, &pack_one)) return NULL;
    FastIndex *fi = fi_get(cap);
    if (!fi) return NULL;
    static PyObject *names[7]; /* key, id, alloc, checksum, _a, _b, nbytes: made once, all or none */
    if (!names[6]) {
        static const char *const text[7] = {"key", "id", "alloc", "checksum", "_a", "_b", "nbytes"};
        PyObject *made[7];
        for (int j = 0; j < 7; j++) {
            if (!(made[j] = PyUnicode_InternFromString(text[j]))) {
                while (j--) Py_DECREF(made[j]);
                return NULL;
            }
        }
        memcpy(names, made, sizeof(names));
    }
    PyObject *s_key = names[0], *s_id = names[1], *s_alloc = names[2], *s_checksum = names[3];
    PyObject *s_a = names[4], *s_b = names[5], *s_nbytes = names[6];
    /* A tuple of the entries: get_reply runs Python code, which could change a list under us. */
    PyObject *fast = PySequence_Tuple(seq);
    if (!fast) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(fast), done = 0;
    /* The fields as the first entry's class and the first allocation's class keep them. */
    fieldref f_key, f_id, f_alloc, f_checksum, f_a = {NULL, 0, s_a}, f_b = {NULL, 0, s_b}, f_nbytes = {NULL, 0, s_nbytes};
    PyTypeObject *etp = n ? Py_TYPE(PyTuple_GET_ITEM(fast, 0)) : &PyBaseObject_Type;
    Py_INCREF(etp); /* held for the call, as alloc_tp: Python code in get_reply could change fast[0]'s class */
    field_for(&f_key, etp, s_key); field_for(&f_id, etp, s_id);
    field_for(&f_alloc, etp, s_alloc); field_for(&f_checksum, etp, s_checksum);
    PyObject *alloc_tp = NULL; /* the class f_a, f_b and f_nbytes were taken from, held for the call */
    if ((size_t)n >= fi->used && (fi->used + fi->tombs + (size_t)n) * 2 > fi->cap) {
        /* As many new keys as the table holds, or more (a restore): the table they need made once,
         * at most half full after them, and the few keys there now moved at once (no more than the
         * puts cost), instead of growing by doubling through the batch with every miss probing both
         * tables. */
        size_t want = fi->cap;
        while ((fi->used + (size_t)n) * 2 > want) want *= 2;
        /* Huge pages only for a table that doubled for this batch: then the batch's keys (n >= used,
         * used + n > want / 4, so n > want / 8) land all over it and touch every 2 MiB now. A same-size
         * table that only drops tombstones may hold a few keys, its pages first touched when served. */
        if (fi_grow(fi, want, want > fi->cap) < 0) { Py_DECREF(fast); Py_DECREF(etp); return PyErr_NoMemory(); }
        fi_move(fi, (size_t)-1);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(fast, i), *key = NULL, *alloc = NULL, *reply = NULL;
        int ok = 1, put = -1;
        uint8_t packed[40];
        const uint8_t *g = NULL; Py_ssize_t glen = 0;
        if (!(key = field_get(e, &f_key))) goto fail;
        if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(key, 1))) {
            PyErr_SetString(PyExc_TypeError, "fi_put_entries: an entry's key is not (namespace id, bytes)");
            goto fail;
        }
        unsigned long ns = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(key, 0));
        if (ns == (unsigned long)-1 && PyErr_Occurred()) goto fail;
        if (ns > 0xffffffffUL) { PyErr_SetString(PyExc_OverflowError, "fi_put_entries: namespace id above 32 bits"); goto fail; }
        long long id = attr_ll(e, &f_id, &ok);
        if (ok < 0) goto fail;
        if (!ok) { PyErr_SetString(PyExc_TypeError, "fi_put_entries: an entry's id is not an int of 64 bits"); goto fail; }
        int packable = 0;
        if (pack_one) {
            if (!(alloc = field_get(e, &f_alloc))) goto fail;
            if (!alloc_tp) {
                alloc_tp = Py_NewRef((PyObject *)Py_TYPE(alloc));
                field_for(&f_a, Py_TYPE(alloc), s_a); field_for(&f_b, Py_TYPE(alloc), s_b);
                field_for(&f_nbytes, Py_TYPE(alloc), s_nbytes);
            }
            int good = 1;
            long long crc = attr_ll(e, &f_checksum, &good);
            long long off = good > 0 ? attr_ll(alloc, &f_a, &good) : -1;
            long long size = good > 0 ? attr_ll(alloc, &f_b, &good) : -1;
            long long nbytes = good > 0 ? attr_ll(alloc, &f_nbytes, &good) : -1;
            if (good < 0) goto fail;
            if (good && crc >= 0 && crc <= 0xffffffffLL && off >= 0 && size > 0 && nbytes >= 0) {
                put_le(packed, 0, 8);
                put_le(packed + 8, (uint64_t)nbytes, 8);
                put_le(packed + 16, 1, 2);
                put_le(packed + 18, 1, 2); /* CHECKSUM_CRC32C */
                put_le(packed + 20, (uint64_t)crc, 4);
                put_le(packed + 24, (uint64_t)off, 8);
                put_le(packed + 32, (uint64_t)(size < nbytes ? size : nbytes), 8);
                g = packed; glen = sizeof(packed); packable = 1;
            }
        }
        if (!packable) {
            if (!(reply = PyObject_CallOneArg(fallback, e))) goto fail;
            if (!PyBytes_Check(reply)) { PyErr_SetString(PyExc_TypeError, "fi_put_entries: get_reply gave no bytes"); goto fail; }
            g = (const uint8_t *)PyBytes_AS_STRING(reply); glen = PyBytes_GET_SIZE(reply);
        }
        PyObject *kb = PyTuple_GET_ITEM(key, 1);
        put = fi_put_raw(fi, (unsigned int)ns, (const uint8_t *)PyBytes_AS_STRING(kb), PyBytes_GET_SIZE(kb), id, g, glen);
    fail:
        Py_XDECREF(key); Py_XDECREF(alloc); Py_XDECREF(reply);
        if (put < 0) { Py_DECREF(fast); Py_DECREF(etp); Py_XDECREF(alloc_tp); return NULL; }
        done += put;
    }
    Py_DECREF(fast);
    Py_DECREF(etp);
    Py_XDECREF(alloc_tp);
    return PyLong_FromSsize_t(done);
}

PyObject *py_fi_del(PyObject *self, PyObject *args) {
    PyObject *cap; unsigned int ns; Py_buffer k;
    if (!PyArg_ParseTuple(args, "OIy*", &cap, &ns, &k)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    if (fi) {
        fi_move(fi, FI_MOVE);
        int in_new = 0;
        uint64_t *w = (k.len > 0 && k.len <= FI_KEY)
            ? fi_locate(fi, ns, k.buf, (size_t)k.len, fi_hash(ns, k.buf, (size_t)k.len), &in_new) : NULL;
        if (w) {
            fi_ent_free(fi, FI_POS(*w));
            *w = 1;
            fi->used--;
            if (in_new) fi->tombs++; /* an old table's tombstones go with it */
        }
        r = PyBool_FromLong(w != NULL);
    }
    PyBuffer_Release(&k);
    return r;
}

PyObject *py_fi_len(PyObject *self, PyObject *cap) {
    FastIndex *fi = fi_get(cap);
    if (!fi) return NULL;
    return PyLong_FromSize_t(fi->used);
}

/* What is mirrored for (ns, key): its entry id (fi_id: -1 when not mirrored) or its GET reply (fi_reply:
 * b"" for none, None when not mirrored; what fast_serve answers a GET with, lease id 0). Tests check
 * the table with them. */
static PyObject *fi_look(PyObject *args, int want_reply) {
    PyObject *cap; unsigned int ns; Py_buffer k;
    if (!PyArg_ParseTuple(args, "OIy*", &cap, &ns, &k)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    if (fi) {
        fi_slot *s = (k.len > 0 && k.len <= FI_KEY) ? fi_find(fi, ns, k.buf, (size_t)k.len, fi_hash(ns, k.buf, (size_t)k.len)) : NULL;
        if (!want_reply) r = PyLong_FromLongLong(s ? s->id : -1);
        else if (!s) { r = Py_None; Py_INCREF(r); }
        else r = PyBytes_FromStringAndSize((const char *)s->get_reply, s->get_reply ? s->get_len : 0);
    }
    PyBuffer_Release(&k);
    return r;
}

PyObject *py_fi_id(PyObject *self, PyObject *args) { return fi_look(args, 0); }

PyObject *py_fi_reply(PyObject *self, PyObject *args) { return fi_look(args, 1); }

/* fi_hash(ns, key) -> the table's hash of a key (tests place keys at chosen slots with it). */
PyObject *py_fi_hash(PyObject *self, PyObject *args) {
    unsigned int ns; Py_buffer k;
    if (!PyArg_ParseTuple(args, "Iy*", &ns, &k)) return NULL;
    uint64_t h = fi_hash(ns, k.buf, (size_t)k.len);
    PyBuffer_Release(&k);
    return PyLong_FromUnsignedLongLong(h);
}

/* fi_shape(fi) -> (slots, live keys, tombstones, slots of the table being moved, of them moved,
 * entry positions handed out). */
PyObject *py_fi_shape(PyObject *self, PyObject *cap) {
    FastIndex *fi = fi_get(cap);
    if (!fi) return NULL;
    return Py_BuildValue("(nnnnnn)", (Py_ssize_t)fi->cap, (Py_ssize_t)fi->used, (Py_ssize_t)fi->tombs,
                         (Py_ssize_t)fi->oldcap, (Py_ssize_t)fi->moved, (Py_ssize_t)fi->nents);
}

/* fi_set_room(fi, room, ring_slot, ns_slot=None): the lease room the fast path takes from, and with
 * tenants each namespace's tenant cell (see FastIndex; ns_slot: a writable int64 array, kept exported
 * like room; the index sets it again when it needs a larger one). room:
 * a writable int64 array (kept exported, so it cannot be resized under us): a cell per ring, one per
 * tenant, then one per tenant for its refusals (len = rings + 2 x tenants); ring_slot: int64 per
 * ring, the cell of its tenant (>= the ring count, < rings + tenants). */
PyObject *py_fi_set_room(PyObject *self, PyObject *args) {
    PyObject *cap, *room, *nsobj = Py_None; Py_buffer sl;
    if (!PyArg_ParseTuple(args, "OOy*|O", &cap, &room, &sl, &nsobj)) return NULL;
    FastIndex *fi = fi_get(cap);
    PyObject *r = NULL;
    Py_buffer rb, nb = {0};
    if (!fi) goto done;
    if (nsobj != Py_None) {
        if (PyObject_GetBuffer(nsobj, &nb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) goto done;
        if (nb.len % 8 || nb.itemsize != 8 || ((uintptr_t)nb.buf & 7)) {
            PyBuffer_Release(&nb);
            PyErr_SetString(PyExc_ValueError, "fi_set_room: ns_slot must be int64 cells");
            goto done;
        }
    }
    if (PyObject_GetBuffer(room, &rb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        if (nb.buf) PyBuffer_Release(&nb);
        goto done;
    }
    Py_ssize_t n = sl.len / 8, len = rb.len / 8;
    const int64_t *slots = (const int64_t *)sl.buf;
    int bad = sl.len % 8 || rb.len % 8 || rb.itemsize != 8 || ((uintptr_t)rb.buf & 7) || len < n || (len - n) % 2;
    Py_ssize_t tenants = bad ? 0 : (len - n) / 2;
    for (Py_ssize_t i = 0; i < n && !bad; i++) bad = slots[i] < n || slots[i] >= n + tenants;
    int64_t *copy = bad ? NULL : malloc((size_t)(n ? n : 1) * 8);
    if (bad || !copy) {
        PyBuffer_Release(&rb);
        if (nb.buf) PyBuffer_Release(&nb);
        if (bad) PyErr_SetString(PyExc_ValueError, "fi_set_room: room must be int64 cells, ring_slot cells past the rings");
        else PyErr_NoMemory();
        goto done;
    }
    if (n) memcpy(copy, slots, (size_t)n * 8);
    if (fi->room) PyBuffer_Release(&fi->room_buf);
    free(fi->ring_slot);
    fi->room_buf = rb; fi->room = (int64_t *)rb.buf; fi->room_len = len; fi->tenants = tenants;
    fi->ring_slot = copy; fi->nrings = n;
    if (fi->ns_slot) PyBuffer_Release(&fi->ns_buf);
    fi->ns_slot = NULL; fi->ns_len = 0;
    if (nb.buf) { fi->ns_buf = nb; fi->ns_slot = (int64_t *)nb.buf; fi->ns_len = nb.len / 8; }
    r = Py_None; Py_INCREF(r);
done:
    PyBuffer_Release(&sl);
    return r;
}

/* Whether `ring` may use namespace `ns` here: with tenants, only its own tenant's (else Python
 * answers, UNKNOWN_NS). */
static int ns_mine(const FastIndex *fi, uint64_t ring, uint32_t ns) {
    if (!fi->ns_slot) return 1;
    return (Py_ssize_t)ns < fi->ns_len && (Py_ssize_t)ring < fi->nrings && fi->ns_slot[ns] == fi->ring_slot[ring];
}

/* Take one lease's room for `ring` (ring and tenant); 0 when there is none (nothing taken, the
 * refusal counted). */
static int room_take(FastIndex *fi, uint64_t ring) {
    if (!fi->room) return 1;
    if ((Py_ssize_t)ring >= fi->nrings) return 0;
    int64_t *own = &fi->room[ring], *ten = &fi->room[fi->ring_slot[ring]];
    if (*own < 1 || *ten < 1) { fi->room[fi->ring_slot[ring] + fi->tenants]++; return 0; }
    *own -= 1; *ten -= 1;
    return 1;
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


/* A lease log record is (lease, n | ring << LOG_RING_SHIFT, n entry ids): the ring it was granted to
 * rides in the count word, so the Python index credits the right ring and tenant when it ends. */
#define LOG_RING_SHIFT 16
#define LOG_N(w) ((size_t)((w) & 0xFFFF))

/* From a lease log, the distinct entry ids with how many leases each got: (id, count) pairs, then
 * per ring the leases it got: (-1 - ring, count) pairs. The Python index then touches each entry
 * once per burst, and each ring's quota once. */
struct counted { int64_t v, n; };

static int cmp_counted(const void *a, const void *b) {
    int64_t x = ((const struct counted *)a)->v, y = ((const struct counted *)b)->v;
    return (x > y) - (x < y);
}

/* Pushes the distinct values of c[0..m) (each with a count) with their summed counts, ascending,
 * a value written as sign * v + bias (the ring pairs' -1 - ring). c is first collapsed where
 * neighbours are equal (a burst's leases mostly come from one ring, and a hot key repeats), so
 * the sort is over what is left, and skipped when that is already ascending. */
static int push_counted(struct counted *c, size_t m, int64_t sign, int64_t bias, struct logbuf *out) {
    size_t r = 0;
    for (size_t i = 0; i < m; i++) {
        if (r && c[r - 1].v == c[i].v) c[r - 1].n += c[i].n;
        else c[r++] = c[i];
    }
    int sorted = 1;
    for (size_t i = 1; i < r && sorted; i++) sorted = c[i - 1].v < c[i].v;
    if (!sorted) qsort(c, r, sizeof *c, cmp_counted);
    for (size_t i = 0; i < r;) {
        size_t j = i + 1;
        int64_t n = c[i].n;
        while (j < r && c[j].v == c[i].v) n += c[j++].n;
        if (log_push(out, sign * c[i].v + bias) || log_push(out, n)) return -1;
        i = j;
    }
    return 0;
}

static int aggregate_log(const struct logbuf *log, struct logbuf *out) {
    size_t total = 0, records = 0;
    for (size_t i = 0; i + 1 < log->n; i += 2 + LOG_N(log->v[i + 1])) { total += LOG_N(log->v[i + 1]); records++; }
    if (total == 0) return 0;
    struct counted *ids = malloc((total + records) * sizeof *ids);
    if (!ids) return -1;
    struct counted *rings = ids + total;
    size_t k = 0, m = 0;
    for (size_t i = 0; i + 1 < log->n; i += 2 + LOG_N(log->v[i + 1])) {
        for (size_t q = 0; q < LOG_N(log->v[i + 1]); q++) ids[k++] = (struct counted){log->v[i + 2 + q], 1};
        rings[m++] = (struct counted){log->v[i + 1] >> LOG_RING_SHIFT, 1};
    }
    int bad = push_counted(ids, total, 1, 0, out) || push_counted(rings, records, -1, -1, out);
    free(ids);
    return bad ? -1 : 0;
}

/* What one fast_serve burst shares with the per-opcode handlers below. */
struct fast_ctx {
    FastIndex *fi;
    struct logbuf *log;
    const uint32_t *lkeys;
    unsigned long long *lease_next;
    uint32_t epoch32, ns_count;
    size_t maxp;
    uint64_t ring; /* the owner of the leases granted */
    int flush;
};

/* GET, hits only: a miss, or an entry without a stored reply, is Python's (it counts NOT_FOUND).
 * 0: answered; -1: Python's. */
static int fast_get(struct fast_ctx *c, char *slot, const struct slot_hdr *h) {
    const char *pl = slot + HDR;
    if (h->length < 6) return -1;
    uint32_t ns; uint16_t klen;
    memcpy(&ns, pl, 4); memcpy(&klen, pl + 4, 2);
    if (ns == 0 || ns > c->ns_count || klen == 0 || klen > FI_KEY || 6 + (size_t)klen > h->length) return -1;
    if (!ns_mine(c->fi, c->ring, ns)) return -1;
    uint8_t key[FI_KEY];
    memcpy(key, pl + 6, klen);
    fi_slot *e = fi_find(c->fi, ns, key, klen, fi_hash(ns, key, klen));
    if (!e || !e->get_reply || e->get_len > c->maxp || e->get_len > 4096) return -1;
    if (log_reserve(c->log, 3) < 0 || !room_take(c->fi, c->ring)) return -1;
    uint64_t lseq = (*c->lease_next)++, lease = lease_encode(c->lkeys, lseq, c->ring);
    log_push(c->log, (int64_t)lseq); log_push(c->log, 1 | (int64_t)(c->ring << LOG_RING_SHIFT)); log_push(c->log, e->id);
    uint8_t tmp[4096];
    memcpy(tmp, e->get_reply, e->get_len);
    memcpy(tmp, &lease, 8);
    publish(slot, h->seq, c->epoch32, OP_GET, 0, (const char *)tmp, e->get_len, ST_RESP, c->flush);
    return 0;
}

/* A LOOKUP_PREFIX/GET_MANY request (u32 namespace, u16 count, u16 key length, the keys), checked
 * and its keys copied out in one snapshot (the client could scribble while we read).
 * 0: *ns, *count, *klen and keys (4096 bytes) filled; -1: malformed or too large, Python's. */
static int read_key_list(const struct fast_ctx *c, const char *slot, const struct slot_hdr *h, uint8_t *keys,
                         uint32_t *ns, uint16_t *count, uint16_t *klen) {
    const char *pl = slot + HDR;
    if (h->length < 8) return -1;
    memcpy(ns, pl, 4); memcpy(count, pl + 4, 2); memcpy(klen, pl + 6, 2);
    if (*ns == 0 || *ns > c->ns_count || *count == 0 || *count > 256 || *klen == 0 || *klen > FI_KEY ||
        8 + (size_t)*count * *klen > h->length || (size_t)*count * *klen > 4096) return -1;
    if (!ns_mine(c->fi, c->ring, *ns)) return -1; /* another tenant's namespace: Python says UNKNOWN_NS */
    memcpy(keys, pl + 8, (size_t)*count * *klen);
    return 0;
}

/* GET_MANY (the LOOKUP_PREFIX request layout): each key's stored GET reply with a lease of its own
 * in front, or a zero item for a miss, as many items as fit one reply (the client asks again for the
 * rest, as of Python's answer). Nothing is granted before the reply is known to fit.
 * -1: Python's (a malformed request, an entry without a stored reply, not one item fits); else the
 * keys answered, the hits among them in *hits. */
#define MANY_ITEM 24 /* <QQHHI: lease, nbytes, extent count, checksum kind, checksum */
static int fast_get_many(struct fast_ctx *c, char *slot, const struct slot_hdr *h, uint32_t *hits) {
    uint32_t ns; uint16_t count, klen;
    uint8_t keys[4096];
    if (read_key_list(c, slot, h, keys, &ns, &count, &klen) < 0) return -1;
    fi_slot *found[256];
    size_t size = 4, cap = c->maxp < FAST_REPLY_MAX ? c->maxp : FAST_REPLY_MAX;
    uint32_t n = 0, got = 0;
    for (; n < count; n++) {
        const uint8_t *k = keys + (size_t)n * klen;
        fi_slot *e = fi_find(c->fi, ns, k, klen, fi_hash(ns, k, klen));
        size_t len = MANY_ITEM;
        if (e) {
            if (!e->get_reply || e->get_len < MANY_ITEM || e->get_len > 4096) return -1;
            len = e->get_len;
        }
        if (size + len > cap) break;
        found[n] = e;
        size += len;
        got += e != NULL;
    }
    if (n == 0) return -1;
    if (got && log_reserve(c->log, 3 * (size_t)got) < 0) return -1; /* out of memory: Python's */
    uint8_t reply[FAST_REPLY_MAX];
    uint16_t answered = (uint16_t)n, pad = 0;
    memcpy(reply, &answered, 2); memcpy(reply + 2, &pad, 2);
    size_t pos = 4;
    for (uint32_t q = 0; q < n; q++) {
        fi_slot *e = found[q];
        /* A lease per hit, each taken from the ring's and its tenant's room: past it the key is
         * answered absent (a GET_MANY naming one key 256 times holds no more than the quota). */
        if (e && !room_take(c->fi, c->ring)) { e = NULL; got--; }
        if (!e) { memset(reply + pos, 0, MANY_ITEM); pos += MANY_ITEM; continue; }
        uint64_t lseq = (*c->lease_next)++, lease = lease_encode(c->lkeys, lseq, c->ring);
        log_push(c->log, (int64_t)lseq); log_push(c->log, 1 | (int64_t)(c->ring << LOG_RING_SHIFT));
        log_push(c->log, e->id);
        memcpy(reply + pos, e->get_reply, e->get_len);
        memcpy(reply + pos, &lease, 8);
        pos += e->get_len;
    }
    publish(slot, h->seq, c->epoch32, OP_GET_MANY, 0, (const char *)reply, pos, ST_RESP, c->flush);
    *hits = got;
    return (int)n;
}

static int fast_ping(struct fast_ctx *c, char *slot, const struct slot_hdr *h) {
    uint8_t tmp[4096];
    if (h->length > sizeof tmp) return -1;
    memcpy(tmp, slot + HDR, h->length);
    publish(slot, h->seq, c->epoch32, OP_PING, 0, (const char *)tmp, h->length, ST_RESP, c->flush);
    return 0;
}

/* LOOKUP_PREFIX: -1 Python's; else how many leading keys are present (a lease granted if > 0). */
static int fast_lookup(struct fast_ctx *c, char *slot, const struct slot_hdr *h, int64_t *ids) {
    uint32_t ns; uint16_t count, klen;
    uint8_t keys[4096];
    if (read_key_list(c, slot, h, keys, &ns, &count, &klen) < 0) return -1;
    uint32_t n = 0;
    for (; n < count; n++) {
        const uint8_t *k = keys + (size_t)n * klen;
        fi_slot *e = fi_find(c->fi, ns, k, klen, fi_hash(ns, k, klen));
        if (!e) break;
        ids[n] = e->id;
    }
    uint64_t lease = 0;
    if (n && log_reserve(c->log, 2 + (size_t)n) < 0) return -1; /* out of memory: Python's */
    if (n && !room_take(c->fi, c->ring)) n = 0; /* over the quota: a miss, as Python answers it */
    if (n) {
        uint64_t lseq = (*c->lease_next)++;
        lease = lease_encode(c->lkeys, lseq, c->ring);
        log_push(c->log, (int64_t)lseq); log_push(c->log, (int64_t)n | (int64_t)(c->ring << LOG_RING_SHIFT));
        for (uint32_t q = 0; q < n; q++) log_push(c->log, ids[q]);
    }
    uint8_t reply[16];
    uint32_t zero = 0;
    memcpy(reply, &n, 4); memcpy(reply + 4, &zero, 4); memcpy(reply + 8, &lease, 8);
    publish(slot, h->seq, c->epoch32, OP_LOOKUP_PREFIX, 0, (const char *)reply, sizeof reply, ST_RESP, c->flush);
    return (int)n;
}

#define FAST_LINGER_NS 50000ull

/* Answers LOOKUP_PREFIX, GET (hits), GET_MANY and PING.
 * fast_serve(fi, buf, offs, cursors, slots_per_ring, slot_size, epoch32, ns_count, flush, timeout_ns,
 *            start, lease_next, max_n, bounds_ns, hist, lease_keys)
 *   -> (served, stop_index, lease_next, lease_log bytes, lookups, hits, lookup service ns,
 *       per-entry lease counts: (entry id, count) int64 pairs, GETs served, GET_MANY requests
 *       served, keys they answered, hits among those keys)
 * offs: int64[2R] (cursor slot of each ring, then slot 0 of each ring), updated as cursors move;
 * cursors: int64[R]; bounds_ns/hist: service-time histogram (hist has len(bounds)+1 counters).
 * stop_index >= 0: a ready slot this path does not handle (Python serves it); -1: timed out.
 * lease_keys: 16 bytes, the four round keys of the lease id permutation (see _native_ring.h); the
 * lease log records sequence numbers, the replies carry lease_encode(seq, ring); each record's count
 * word carries the ring (LOG_RING_SHIFT), and the per-entry pairs end with (-1 - ring, leases) pairs.
 * With a lease room (fi_set_room) a grant past a ring's or its tenant's room is left to Python.
 * sleep_ns > 0 (optional, with fd, optional): the idle server's idle wait and its answer in one
 * call. Between looks it sleeps sleep_ns (or until fd is readable: stop_index -2) instead of
 * spinning, and it returns as soon as nothing more is ready once it served something. A request
 * that arrives during the idle wait is answered here, the moment its sleep ends, rather than
 * after a turn of the server's Python loop (slow on a cold core, which is when an idle server's
 * first request arrives). A signal ends the call as a timeout does. */
PyObject *py_fast_serve(PyObject *self, PyObject *args) {
    PyObject *cap; Py_buffer v, ov, cv, bv, hv, kv;
    Py_ssize_t S, slot_size, start, max_n; unsigned int epoch32, ns_count; int flush;
    unsigned long long timeout_ns, lease_next, sleep_ns = 0; int fd = -1; PyObject *bcap = Py_None;
    if (!PyArg_ParseTuple(args, "Ow*w*w*nnIIpKnKny*w*y*|KiO", &cap, &v, &ov, &cv, &S, &slot_size, &epoch32, &ns_count,
                          &flush, &timeout_ns, &start, &lease_next, &max_n, &bv, &hv, &kv, &sleep_ns, &fd, &bcap))
        return NULL;
    struct bells *bells = NULL;
    uint32_t lkeys[4] = {0, 0, 0, 0};
    if (kv.len == 16) memcpy(lkeys, kv.buf, 16);
    PyObject *result = NULL;
    FastIndex *fi = fi_get(cap);
    struct logbuf log = {0}, agg = {0};
    int agg_failed = 0;
    if (!fi) goto done;
    Py_ssize_t R = cv.len / 8;
    Py_ssize_t nb = bv.len / 8;
    if (ov.len != 2 * R * 8 || R == 0 || S <= 0 || slot_size < HDR + 16 || hv.len != (nb + 1) * 8 || kv.len != 16) {
        PyErr_SetString(PyExc_ValueError, "fast_serve: inconsistent ring arrays");
        goto done;
    }
    if (sleep_ns > 1000000000ull || fd < -1) {
        PyErr_SetString(PyExc_ValueError, "fast_serve: sleep_ns must be at most 1 s, fd a file descriptor or -1");
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
    if (bcap != Py_None && ((bells = bells_get(bcap)) == NULL || bells_check(bells, &v, 2 * R) < 0)) goto done;
    if (start < 0 || start >= R) start = 0;
    Py_ssize_t served = 0, stop = -1, lookups = 0, hits = 0, gets = 0, manys = 0, many_keys = 0, many_hits = 0;
    size_t maxp = (size_t)(slot_size - HDR);
    int64_t ids[256];
    uint64_t sum_ns = 0;
    int bad_fd = 0;
    Py_BEGIN_ALLOW_THREADS
    int slack = sleep_ns ? idle_slack_begin() : 0;
    struct pollfd pfd = {fd, POLLIN, 0};
    uint64_t t0 = now_ns(), deadline = t0 + timeout_ns, last_served = t0;
    unsigned spins = 0;
    for (;;) {
        Py_ssize_t found = -1;
        if (bells) found = bells_next(bells, (char *)v.buf, offs, flush); /* the doorbells lead the look */
        else for (Py_ssize_t j = 0; j < 2 * R; j++) {
            Py_ssize_t i = start + j; if (i >= 2 * R) i -= 2 * R;
            char *slot = (char *)v.buf + offs[i];
            if (flush) { flush_range(slot, 8, 1); full_fence(); }
            if (__atomic_load_n((uint64_t *)slot, __ATOMIC_ACQUIRE) == ST_REQ) { found = i; break; }
        }
        if (found < 0 && sleep_ns) {
            /* Idle wait: back to Python once a run of requests is answered (its bookkeeping), at
             * the deadline (after this last look), on the fd, or on a signal. */
            if (served > 0 || now_ns() >= deadline) break;
            int got = idle_step(&pfd, sleep_ns);
            if (got < 0) break;
            if (got > 0) { bad_fd = got == 2; stop = -2; break; }
            continue;
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
            h.length > maxp || (h.op != OP_LOOKUP_PREFIX && h.op != OP_PING && h.op != OP_GET && h.op != OP_GET_MANY)) {
            stop = found; break;
        }
            /* Each handler answers the slot, or returns -1 to leave it to Python (nothing written). */
        struct fast_ctx ctx = {fi, &log, lkeys, &lease_next, epoch32, ns_count, maxp, (uint64_t)found, flush};
        int rc;
        if (h.op == OP_GET) { rc = fast_get(&ctx, slot, &h); gets += rc == 0; }
        else if (h.op == OP_GET_MANY) {
            uint32_t mh = 0;
            rc = fast_get_many(&ctx, slot, &h, &mh);
            if (rc > 0) { manys++; many_keys += rc; many_hits += mh; }
        }
        else if (h.op == OP_PING) rc = fast_ping(&ctx, slot, &h);
        else { rc = fast_lookup(&ctx, slot, &h, ids); lookups += rc >= 0; hits += rc > 0; }
        if (rc < 0) { stop = found; break; }
        int64_t c = cursors[found] + 1;
        if (c >= S) c = 0;
        cursors[found] = c;
        offs[found] = offs[R + found] + c * slot_size;
        uint64_t te = now_ns(); /* one clock read serves the histogram and the linger timer */
        if (h.op == OP_LOOKUP_PREFIX) {
            uint64_t dt = te - ts;
            Py_ssize_t b = 0;
            while (b < nb && (int64_t)dt > bounds[b]) b++;
            hist[b]++;
            sum_ns += dt;
        }
        served++;
        start = found;
        last_served = te;
        /* The deadline bounds the wait for a request, not a run of ready ones: an idle server
         * (timeout 0) still answers a client's whole burst in this one call, not one request per
         * trip through Python. max_n bounds the run. */
        if (served >= max_n) break;
    }
    agg_failed = aggregate_log(&log, &agg);
    if (sleep_ns) idle_slack_end(slack);
    Py_END_ALLOW_THREADS
    if (agg_failed) { PyErr_NoMemory(); goto done; }
    if (bad_fd) { PyErr_Format(PyExc_ValueError, "fd %d is not open", fd); goto done; }
    {
        PyObject *logb = PyBytes_FromStringAndSize((const char *)log.v, (Py_ssize_t)(log.n * sizeof(int64_t)));
        PyObject *aggb = PyBytes_FromStringAndSize((const char *)agg.v, (Py_ssize_t)(agg.n * sizeof(int64_t)));
        if (logb && aggb)
            result = Py_BuildValue("(nnKNnnKNnnnn)", served, stop, lease_next, logb, lookups, hits,
                                   (unsigned long long)sum_ns, aggb, gets, manys, many_keys, many_hits);
        else { Py_XDECREF(logb); Py_XDECREF(aggb); }
    }
done:
    free(log.v);
    free(agg.v);
    PyBuffer_Release(&v); PyBuffer_Release(&ov); PyBuffer_Release(&cv); PyBuffer_Release(&bv); PyBuffer_Release(&hv);
    PyBuffer_Release(&kv);
    return result;
}
