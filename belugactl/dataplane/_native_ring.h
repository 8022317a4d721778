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

static inline void publish(char *slot, uint64_t seq, uint32_t epoch, uint16_t op, uint16_t code, const char *payload,
                    size_t n, uint64_t status, int flush) {
    struct slot_hdr *h = (struct slot_hdr *)slot;
    memcpy(slot + HDR, payload, n);
    h->seq = seq; h->magic = RPC_MAGIC; h->epoch = epoch; h->op = op; h->code = code; h->length = (uint32_t)n;
    if (flush) { flush_range(slot, HDR + n, 0); full_fence(); }
    else __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h->status, status, __ATOMIC_RELEASE);
    if (flush) { flush_range(slot, 8, 0); full_fence(); }
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
