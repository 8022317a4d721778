/* The CXL-RPC slot: its header struct, checked against the generated wire offsets, the publish
 * step the client calls and the server's fast path use, the burst loop the ring mechanics
 * (_native_ring.c) share with the message calls (_native_messages.c), and the lease id codec. */
#ifndef BELUGA_NATIVE_RING_H
#define BELUGA_NATIVE_RING_H
#include <stddef.h>
#include "_native.h"
#include "_native_wire.h"

/* Slot header, little-endian: u64 status, u64 seq, u32 magic, u32 epoch, u16 op, u16 code,
 * u32 length, then the payload. */
struct slot_hdr { uint64_t status; uint64_t seq; uint32_t magic; uint32_t epoch; uint16_t op; uint16_t code; uint32_t length; };
_Static_assert(sizeof(struct slot_hdr) == HDR, "slot header size differs from protocol.HEADER_SIZE");
_Static_assert(offsetof(struct slot_hdr, status) == HDR_OFF_STATUS, "status offset");
_Static_assert(offsetof(struct slot_hdr, seq) == HDR_OFF_SEQ, "seq offset");
_Static_assert(offsetof(struct slot_hdr, magic) == HDR_OFF_MAGIC, "magic offset");
_Static_assert(offsetof(struct slot_hdr, epoch) == HDR_OFF_EPOCH, "epoch offset");
_Static_assert(offsetof(struct slot_hdr, op) == HDR_OFF_OP, "op offset");
_Static_assert(offsetof(struct slot_hdr, code) == HDR_OFF_CODE, "code offset");
_Static_assert(offsetof(struct slot_hdr, length) == HDR_OFF_LENGTH, "length offset");

/* ---- Doorbells (docs/pool-format.md, "Doorbells") -----------------------------------------
 * One byte per ring in the header region's doorbell area, 64 rings to a cache line. A client
 * bumps its ring's byte (an atomic add within its host; written back under flush) after it
 * published a request; the server keeps a private copy of the area and looks only at the rings
 * whose byte moved since (bells_next below), plus a slow sweep of every ring. The server never
 * writes the area, so a non-coherent pool cannot lose a bump to the server's write-back.
 *
 * The client side needs no argument: this process's rings are registered (bell_register, by the
 * CXL transport when it opens its ring) with the address range of their slots, and publish()
 * finds the doorbell of a request's slot there, so every path that publishes a request (this
 * file's calls, _native_messages.c's, the load's release) rings it. An unregistered slot (a
 * client without the registry: an old one, a test writing the slot by hand) rings nothing and is
 * answered by the sweep. */
struct bell_entry { uintptr_t lo, hi; uint8_t *bell; int refs; /* refs: under the GIL only */ };
#define BELL_TABLE 4096
extern HIDDEN struct bell_entry bell_table[BELL_TABLE];
extern HIDDEN int bell_used;

/* Bumps the doorbell of the ring holding `slot`, if this process registered it; returns whether it did.
 * Under flush the bell's line is written back but not fenced here: the caller's one fence after it
 * waits for both write-backs (the status line's and this one), and the locked add orders them (an
 * earlier clwb/clflushopt is ordered before a locked read-modify-write, Intel SDM), so the server can
 * never see the bell before the request. */
static inline int ring_bell(const char *slot, int flush) {
    int n = __atomic_load_n(&bell_used, __ATOMIC_ACQUIRE);
    uintptr_t a = (uintptr_t)slot;
    for (int i = n - 1; i >= 0; i--) { /* the newest registration of a range wins */
        struct bell_entry *e = &bell_table[i];
        if (a < __atomic_load_n(&e->lo, __ATOMIC_RELAXED) || a >= __atomic_load_n(&e->hi, __ATOMIC_RELAXED)) continue;
        uint8_t *b = __atomic_load_n(&e->bell, __ATOMIC_ACQUIRE);
        if (b == NULL) continue; /* unregistered */
        __atomic_fetch_add(b, (uint8_t)1, __ATOMIC_SEQ_CST); /* after the status store (a locked add orders it) */
        if (flush) flush_range((const char *)b, 1, 0);
        return 1;
    }
    return 0;
}

/* The server's view of the doorbells: the copy of the area it last read, the rings it still has to
 * look at (pend, a ring once: mark), where its turn-about starts (rot), and the sweep that puts
 * every ring in pend once per R * sweep_ns, whatever the doorbells say. */
struct bells {
    int64_t area_off;
    Py_ssize_t R, nbytes;
    uint8_t *seen, *mark;
    int64_t *pend;
    Py_ssize_t npend, rot, sweep_pos;
    uint64_t sweep_ns, sweep_t;
    uint64_t polls, rung, swept, looks, found;
};
HIDDEN struct bells *bells_get(PyObject *cap);
/* Checks the doorbell area and the 2R slot offsets (each ring's cursor slot, then its slot 0, as
 * fast_serve takes them) against the mapping; 0, or -1 with ValueError set. */
HIDDEN int bells_check(struct bells *b, Py_buffer *v, Py_ssize_t noffs);
/* One look for a ready request: the doorbell lines read (invalidated first under flush), the rings
 * whose byte moved and the sweep's due rings put in pend, then pend looked at from where the last
 * found one left off (fairness): the index into offs of a slot holding REQ_READY (r: ring r's cursor
 * slot, R + r: its slot 0), or -1. A ring leaves pend when neither slot is ready. Cost: the
 * doorbell lines, plus one look per ring pending, rung or swept: never a pass over every ring. */
HIDDEN Py_ssize_t bells_next(struct bells *b, char *base, const int64_t *offs, int flush);

static inline void publish(char *slot, uint64_t seq, uint32_t epoch, uint16_t op, uint16_t code, const char *payload,
                    size_t n, uint64_t status, int flush) {
    struct slot_hdr *h = (struct slot_hdr *)slot;
    memcpy(slot + HDR, payload, n);
    h->seq = seq; h->magic = RPC_MAGIC; h->epoch = epoch; h->op = op; h->code = code; h->length = (uint32_t)n;
    if (flush) { flush_range(slot, HDR + n, 0); full_fence(); }
    else __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h->status, status, __ATOMIC_RELEASE);
    if (flush) flush_range(slot, 8, 0);
    if (status == ST_REQ) ring_bell(slot, flush);
    if (flush) full_fence(); /* the status line's write-back, and the doorbell's */
}

/* A pipelined burst (_native_ring.c): run_burst's outcome, and the checks and Python value
 * around it. */
#define BURST_OK 0
#define BURST_TIMEOUT 1
#define BURST_SLOT_BUSY 2
#define BURST_MALFORMED 3
HIDDEN int run_burst(char *base, const int64_t *offs, Py_ssize_t S, uint64_t seq0, uint32_t epoch32, uint16_t op,
                     const char *const *src, const Py_ssize_t *src_len, Py_ssize_t n, Py_ssize_t maxp,
                     Py_ssize_t window, uint64_t timeout_ns, int flush, struct slot_hdr *hdrs, char *out,
                     Py_ssize_t sent0, Py_ssize_t *sent_out, Py_ssize_t *taken_out);
HIDDEN int check_ring(Py_buffer *v, Py_buffer *ov, Py_ssize_t maxp, Py_ssize_t window);
HIDDEN PyObject *burst_failure(int state, Py_ssize_t sent, Py_ssize_t taken, struct slot_hdr *hdrs, uint64_t seq0);

/* Lease ids: a keyed 4-round Feistel permutation of (sequence << LEASE_OWNER_BITS | owner), so
 * ids are not guessable from one another and carry the ring/connection that got them. The
 * Python twin is mds/ownership.py:LeaseCodec (a test checks they agree). */
static inline uint32_t lease_round(uint32_t x, uint32_t k) {
    x ^= k; x ^= x >> 16; x *= 0x85EBCA6Bu; x ^= x >> 13; x *= 0xC2B2AE35u; x ^= x >> 16;
    return x;
}

static inline uint64_t lease_encode(const uint32_t keys[4], uint64_t seq, uint64_t owner) {
    uint64_t v = (seq << LEASE_OWNER_BITS) | (owner & ((1ull << LEASE_OWNER_BITS) - 1));
    uint32_t l = (uint32_t)(v >> 32), r = (uint32_t)v;
    for (int i = 0; i < 4; i++) { uint32_t t = r; r = l ^ lease_round(r, keys[i]); l = t; }
    return ((uint64_t)l << 32) | r;
}

#endif
