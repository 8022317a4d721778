/* Shared by the native helper's C files (one extension, several translation units): includes,
 * CPU features, fences, cache-line flushes, clocks and the bounds-checked argument helpers.
 * Small hot helpers are static inline here so every file gets them inlined. */
#ifndef BELUGA_NATIVE_H
#define BELUGA_NATIVE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>
#include <errno.h>
#include <poll.h>
#include <sys/prctl.h>

#if defined(__x86_64__) || defined(__i386__)
#define BELUGA_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define BELUGA_X86 0
#endif

#define LINE 64

#define HIDDEN __attribute__((visibility("hidden")))

/* The counting build (`_native_counting`, setup.py compiles the same sources with
 * -DBELUGA_COUNT_FLUSHES): every flush, non-temporal store, fence, and the pool copies' reads and
 * plain writes, append a record (_native_count.c) that tests read to prove each written line is made
 * visible and each read line invalidated first. The normal build compiles the hooks away. */
#define COUNT_WB 1     /* a line written back for a writer (clwb, or clflushopt/clflush) */
#define COUNT_INV 2    /* a line evicted for a reader (clflushopt/clflush) */
#define COUNT_NT 3     /* bytes stored non-temporally */
#define COUNT_FENCE 4  /* sfence or mfence */
#define COUNT_READ 5   /* bytes a copy reads (copy's source) */
#define COUNT_WRITE 6  /* bytes a copy stores (plain or streaming) */
#ifdef BELUGA_COUNT_FLUSHES
void count_record(int kind, const void *p, size_t n) __attribute__((visibility("hidden")));
#define COUNT(kind, p, n) count_record((kind), (const void *)(p), (size_t)(n))
#else
#define COUNT(kind, p, n) ((void)0)
#endif

/* CPU features, set once by detect_cpu() at import (_native_module.c). */
extern HIDDEN int have_clflushopt, have_clwb, have_sse2, have_avx2, have_clflush, nt_avx2;

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
    COUNT(COUNT_FENCE, NULL, 0);
#if BELUGA_X86
    _mm_mfence();
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

static inline void store_fence(void) {
    COUNT(COUNT_FENCE, NULL, 0);
#if BELUGA_X86
    _mm_sfence();
#else
    __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

/* Write back (and for readers, invalidate) every line of [p, p+n). clwb keeps the line cached,
 * which is right for a writer; a reader must evict the line, so it never uses clwb. */
static inline void flush_range(const char *p, size_t n, int for_read) {
#if BELUGA_X86
    if (n == 0) return;
    COUNT(for_read ? COUNT_INV : COUNT_WB, p, n);
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

/* Poll the 64-bit word at `w` until it equals `value` or `timeout_ns` passes; return the last
 * value seen. Checks the clock every 64 polls and yields once the wait grows long. With `flush`,
 * evict the line before each load (a reader on a non-coherent pool). `spins` carries on a count
 * the caller already started. Call with the GIL released. */
static inline uint64_t spin_wait_u64(uint64_t *w, uint64_t value, int flush, uint64_t timeout_ns, unsigned spins) {
    uint64_t x, t0 = now_ns(), deadline = t0 + timeout_ns;
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
    return x;
}

/* One step of an idle wait, for a waiter that must not hold a core: sleep `sleep_ns`, or until
 * `pfd->fd` (when not -1) is readable. Returns 0 after the sleep, 1 when the fd is readable, 2 when it is not open,
 * -1 when a signal ended it (the caller returns at once, so Python's handlers run). Call with the
 * GIL released, inside idle_slack_begin/idle_slack_end. */
static inline int idle_step(struct pollfd *pfd, uint64_t sleep_ns) {
    struct timespec pause = {(time_t)(sleep_ns / 1000000000ull), (long)(sleep_ns % 1000000000ull)};
    if (pfd->fd < 0) return nanosleep(&pause, NULL) < 0 && errno == EINTR ? -1 : 0;
    int n = ppoll(pfd, 1, &pause, NULL);
    if (n < 0) return errno == EINTR ? -1 : 0;
    if (n == 0) return 0;
    return (pfd->revents & POLLNVAL) ? 2 : 1;
}

/* Idle waits sleep with a 1 us timer slack: Linux's default 50 us would stretch a 0.25 ms sleep by a fifth.
 * Returns the slack to restore (idle_slack_end). */
static inline int idle_slack_begin(void) {
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    return slack;
}

static inline void idle_slack_end(int slack) {
    if (slack > 1000) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}

/* ---- argument helpers ------------------------------------------------------------------- */

static inline int get_range(Py_buffer *view, Py_ssize_t off, Py_ssize_t n, char **out) {
    if (off < 0 || n < 0 || off > view->len || n > view->len - off) {
        PyErr_Format(PyExc_ValueError, "range [%zd, +%zd) outside a buffer of %zd bytes", off, n, view->len);
        return -1;
    }
    *out = (char *)view->buf + off;
    return 0;
}

static inline int get_word(Py_buffer *view, Py_ssize_t off, uint64_t **out) {
    char *p;
    if (get_range(view, off, 8, &p) < 0) return -1;
    if (((uintptr_t)p & 7) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not 8-byte aligned in memory", off);
        return -1;
    }
    *out = (uint64_t *)p;
    return 0;
}

/* Non-temporal copy (_native_copy.c). */
HIDDEN void nt_memcpy(char *dst, const char *src, size_t n);

/* The offset of a plain object slot that member descriptor `d` reads, when `d` belongs to `tp` or a
 * class `tp` derives from and the slot lies inside a `tp` instance; else -1. What lets the restore's
 * helpers fill and read a __slots__ class's fields without getattr (_native_restore.c, _native_fastpath.c). */
static inline Py_ssize_t member_slot_offset(PyTypeObject *tp, PyObject *d) {
    if (!Py_IS_TYPE(d, &PyMemberDescr_Type) || !PyType_IsSubtype(tp, PyDescr_TYPE(d))) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READ_RESTRICTED) || m->offset < (Py_ssize_t)sizeof(PyObject) ||
        m->offset + (Py_ssize_t)sizeof(PyObject *) > tp->tp_basicsize)
        return -1;
    return m->offset;
}

/* The Python entry points, one group per file; the method table is in _native_module.c. */
#define PYFN(name) HIDDEN PyObject *name(PyObject *self, PyObject *args)
PYFN(py_flush); PYFN(py_fence); PYFN(py_copy); PYFN(py_gather); PYFN(py_gather_blocks);          /* copy */
PYFN(py_load64); PYFN(py_store64); PYFN(py_cas64); PYFN(py_fetch_add64); PYFN(py_wait64);
PYFN(py_wait_any); PYFN(py_idle_wait_any);                                                                               /* atomics */
PYFN(py_rpc_send); PYFN(py_rpc_wait_reply); PYFN(py_rpc_take); PYFN(py_rpc_reply); PYFN(py_rpc_call);
PYFN(py_rpc_burst); PYFN(py_rpc_call_many);                                                       /* ring */
PYFN(py_bell_register); PYFN(py_bell_unregister); PYFN(py_bells_new); PYFN(py_bells_take); PYFN(py_bells_wait);
PYFN(py_bells_stats); PYFN(py_bells_pend_all);                                                  /* ring: doorbells */
PYFN(py_lease_encode); PYFN(py_lease_decode_many); PYFN(py_get_many_decode); PYFN(py_rpc_get_many);
PYFN(py_rpc_get_many_start); PYFN(py_rpc_get_many_finish); PYFN(py_rpc_release_nowait);          /* messages */
PYFN(py_crc32c); PYFN(py_copy_crc32c); PYFN(py_gather_blocks_crc32c);                             /* crc */
HIDDEN PyObject *py_crc32c_kernel(PyObject *self, PyObject *noargs);
PYFN(py_load_blocks_checked);                                                                     /* load */

/* The CRC copy of whole KV blocks (_native_crc.c), which the one-call load (_native_load.c) shares:
 * the checks made before a byte moves, and the copy itself (GIL released by the caller). */
HIDDEN int check_gather(Py_buffer *pool, Py_buffer *ten, Py_buffer *tv, Py_buffer *bv, Py_ssize_t *nseg_out,
                        Py_ssize_t *nblk_out);
HIDDEN void copy_blocks_crc(Py_buffer *pool, Py_buffer *ten, const int64_t *tpl, Py_ssize_t nseg, const int64_t *blk,
                            Py_ssize_t nblk, int save, int nt, uint32_t *crcs);

/* A no-wait lease release (rpc_release_nowait's arguments, parsed and checked), sent by
 * rpc_release_nowait or right after load_blocks_checked's copy (_native_messages.c). */
struct nowait_release {
    Py_buffer v, ov; int have_bufs;
    unsigned long long seq0, expected; unsigned int epoch32, flags;
    Py_ssize_t per_msg, maxp, epoch_off, k; int flush;
    uint64_t *vals; char *msg; uint64_t *epoch_word;
};
HIDDEN int release_nowait_parse(PyObject *args, struct nowait_release *pr);
HIDDEN int release_nowait_send(struct nowait_release *pr, Py_ssize_t *sent);
HIDDEN PyObject *release_nowait_result(const struct nowait_release *pr, int state, Py_ssize_t sent);
HIDDEN void release_nowait_free(struct nowait_release *pr);
HIDDEN uint32_t beluga_crc32c(uint32_t crc, const void *p, size_t n);
HIDDEN void crc_init(void);
#ifdef BELUGA_COUNT_FLUSHES
PYFN(py_count_records); HIDDEN PyObject *py_count_reset(PyObject *self, PyObject *noargs);
HIDDEN PyObject *py_count_lost(PyObject *self, PyObject *noargs);                               /* count */
#endif
PYFN(py_bench_chase); PYFN(py_bench_read); PYFN(py_bench_write_nt);                            /* bench */
PYFN(py_sharded_put); PYFN(py_fi_new); PYFN(py_fi_put); PYFN(py_fi_put_entries); PYFN(py_fi_reply); PYFN(py_fi_del); PYFN(py_fi_len); PYFN(py_fi_id); PYFN(py_fi_hash); PYFN(py_fi_shape); PYFN(py_fast_serve);         /* fast path */
PYFN(py_fi_set_room); /* fast path: the lease room (tenants, quotas) */
PYFN(py_journal_replay); PYFN(py_journal_copy);                                                   /* journal */
PYFN(py_alloc_restore_chunks); PYFN(py_make_entries);                                              /* restore */

#endif
