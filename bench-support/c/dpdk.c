/*
 * The DPDK side of userdma's benchmarks: the same loops as the Rust cases in benches/pool.rs and
 * benches/ring.rs, over DPDK's rte_mempool and rte_ring, timed the same way (CLOCK_MONOTONIC,
 * from the first get or enqueue to the consumer having taken the last object).
 *
 * Conventions shared with the Rust cases:
 *  - every 4 KiB buffer taken from a pool gets 8 bytes written at offset 0 (its sequence
 *    number); in the two-thread pipeline the consumer reads them back before putting it back;
 *  - the producer (host) is lcore 0 = CPU 0, the consumer (device) lcore 1 = CPU 1;
 *  - the pipeline ring has 1024 slots, the handoff ring 256 (the Rust cases' depths);
 *  - waits spin with the pause instruction; the pipeline's waits yield after 256 spins, like
 *    its Rust counterpart's.
 *
 * Everything here is single-producer/single-consumer by construction: one udb_pair has one
 * producer (the caller of udb_pair_run, on lcore 0) and one consumer (lcore 1).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>
#include <rte_version.h>

#include "dpdk.h"

#define MAXB 32
#define LINE 128

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int udb_eal_init(int huge)
{
	char *argv[] = {
		"userdma-bench",
		"-l",
		"0-1",
		"--no-pci",
		"--no-telemetry",
		"--log-level=lib.eal:warning",
		"-m",
		"512",
		huge ? "--in-memory" : "--no-huge",
		huge ? NULL : "--no-shconf",
		NULL,
	};
	int argc = huge ? 9 : 10;
	if (rte_eal_init(argc, argv) < 0)
		return -1;
	if (rte_lcore_count() < 2 || !rte_lcore_is_enabled(1) || rte_get_main_lcore() != 0) {
		rte_errno = EINVAL;
		return -1;
	}
	return 0;
}

int udb_errno(void)
{
	return rte_errno;
}

const char *udb_strerror(int error)
{
	return rte_strerror(error);
}

const char *udb_version(void)
{
	return rte_version();
}

struct rte_mempool *udb_mempool_create(const char *name, unsigned count, unsigned size,
				       unsigned cache, int no_spread)
{
	return rte_mempool_create(name, count, size, cache, 0, NULL, NULL, NULL, NULL,
				  SOCKET_ID_ANY, no_spread ? RTE_MEMPOOL_F_NO_SPREAD : 0);
}

unsigned udb_mempool_stride(const struct rte_mempool *mp)
{
	return mp->header_size + mp->elt_size + mp->trailer_size;
}

void udb_mempool_free(struct rte_mempool *mp)
{
	rte_mempool_free(mp);
}

const char *udb_mempool_ops(const struct rte_mempool *mp)
{
	return rte_mempool_get_ops(mp->ops_index)->name;
}

/* The get/put loop itself, inlined into one copy per code placement below. */
static inline __attribute__((always_inline)) uint64_t get_put(struct rte_mempool *mp,
							      uint64_t iters, unsigned bulk)
{
	void *objs[MAXB];
	uint64_t t0 = now_ns();
	if (bulk == 1) {
		for (uint64_t i = 0; i < iters; i++) {
			void *obj;
			if (unlikely(rte_mempool_get(mp, &obj) != 0))
				return 0;
			*(volatile uint64_t *)obj = i;
			rte_mempool_put(mp, obj);
		}
	} else {
		if (bulk > MAXB)
			return 0;
		for (uint64_t i = 0; i < iters; i++) {
			if (unlikely(rte_mempool_get_bulk(mp, objs, bulk) != 0))
				return 0;
			for (unsigned k = 0; k < bulk; k++)
				*(volatile uint64_t *)objs[k] = i;
			rte_mempool_put_bulk(mp, objs, bulk);
		}
	}
	return now_ns() - t0;
}

/*
 * Where the loop's code starts within a 64-byte line: `.balign 64` pads (with nops, run once
 * per call) to the next boundary and makes the function's section 64-byte aligned, then `pad`
 * more nops move what follows 0, 16, 32 or 48 bytes into the line. The same offsets as the Rust
 * cases' `place::<AT>()` (bench-support's PLACEMENTS). Where a linker happens to put a loop
 * changed its time by up to 1.5x on this machine, for DPDK's loop and for ours alike, so each
 * side is timed at every placement (and, from the Rust side, at several stack depths:
 * bench-support's `on_stack`) and the table keeps each side's fastest layout.
 */
#if defined(__x86_64__)
#define UDB_PLACE(pad) asm volatile(".balign 64, 0x90\n\t" pad)
#else
#define UDB_PLACE(pad) ((void)0)
#endif

/*
 * The 16 and 48 placements also hold 24 bytes more in the frame, as the Rust loops do
 * (bench-support's `frame_pad`): where the loop's `objs` array lands, 0 or 8 bytes into a
 * 16-byte step, can change how fast stores to it forward to the loads that read it back, and
 * the caller's stack offsets move the frame only by whole 16-byte steps.
 */
#define UDB_GET_PUT_AT(at, pad, words)                                                  \
	static __attribute__((noinline)) uint64_t get_put_##at(struct rte_mempool *mp,   \
							       uint64_t iters, unsigned bulk) \
	{                                                                               \
		UDB_PLACE(pad);                                                         \
		volatile uint64_t frame_pad[words];                                     \
		frame_pad[0] = 0;                                                       \
		uint64_t t = get_put(mp, iters, bulk);                                  \
		(void)frame_pad[0];                                                     \
		return t;                                                               \
	}

UDB_GET_PUT_AT(0, "", 1)
UDB_GET_PUT_AT(16, ".skip 16, 0x90", 4)
UDB_GET_PUT_AT(32, ".skip 32, 0x90", 1)
UDB_GET_PUT_AT(48, ".skip 48, 0x90", 4)

uint64_t udb_mempool_get_put(struct rte_mempool *mp, uint64_t iters, unsigned bulk,
			     unsigned placement)
{
	switch (placement) {
	case 0:
		return get_put_0(mp, iters, bulk);
	case 1:
		return get_put_16(mp, iters, bulk);
	case 2:
		return get_put_32(mp, iters, bulk);
	case 3:
		return get_put_48(mp, iters, bulk);
	default:
		return 0;
	}
}

/* ---------------------------------------------------------------------------------------- */
/* two threads                                                                              */

struct udb_pair {
	/* Written by the consumer, read by the producer. */
	_Alignas(LINE) _Atomic uint64_t consumed;
	/* Written by the producer, read by the consumer. */
	_Alignas(LINE) _Atomic int stop;
	_Alignas(LINE) int kind;
	unsigned burst;
	unsigned esize;
	struct rte_ring *ring;
	struct rte_mempool *mp;
	uint64_t seq;
	uint64_t sum;
	int launched;
};

static inline void spin_or_yield(unsigned *spins)
{
	if (*spins < 256) {
		(*spins)++;
		rte_pause();
	} else {
		sched_yield();
	}
}

/* 64-byte descriptor: the Rust `ring::Command` layout's first fields (src, dst, len). */
struct desc64 {
	uint64_t src;
	uint64_t dst;
	uint32_t len;
	uint32_t flags;
	uint64_t pad[5];
};
_Static_assert(sizeof(struct desc64) == 64, "desc64");

static int consume_pipeline(struct udb_pair *p)
{
	void *objs[MAXB];
	uint64_t sum = 0;
	unsigned spins = 0;
	while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
		unsigned k = rte_ring_sc_dequeue_burst(p->ring, objs, p->burst, NULL);
		if (k == 0) {
			spin_or_yield(&spins);
			continue;
		}
		spins = 0;
		for (unsigned j = 0; j < k; j++)
			sum += *(volatile uint64_t *)objs[j];
		rte_mempool_put_bulk(p->mp, objs, k);
		/* release: the producer's acquire load sees the puts before the count */
		atomic_fetch_add_explicit(&p->consumed, k, memory_order_release);
	}
	p->sum = sum;
	return 0;
}

static int consume_handoff(struct udb_pair *p)
{
	struct desc64 d[MAXB];
	uint64_t sum = 0;
	while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
		unsigned k = rte_ring_sc_dequeue_burst_elem(p->ring, d, p->esize, MAXB, NULL);
		if (k == 0) {
			rte_pause();
			continue;
		}
		if (p->esize == 8) {
			const uint64_t *v = (const uint64_t *)d;
			for (unsigned j = 0; j < k; j++)
				sum += v[j];
		} else {
			for (unsigned j = 0; j < k; j++)
				sum += d[j].src;
		}
		atomic_fetch_add_explicit(&p->consumed, k, memory_order_release);
	}
	p->sum = sum;
	return 0;
}

static int consumer_entry(void *arg)
{
	struct udb_pair *p = arg;
	return p->kind == UDB_PIPELINE ? consume_pipeline(p) : consume_handoff(p);
}

struct udb_pair *udb_pair_start(int kind, unsigned burst, unsigned esize, struct rte_mempool *mp)
{
	static _Atomic unsigned serial;
	char name[RTE_RING_NAMESIZE];
	if (burst == 0 || burst > MAXB || (kind == UDB_HANDOFF && esize != 8 && esize != 64) ||
	    (kind == UDB_PIPELINE && mp == NULL)) {
		rte_errno = EINVAL;
		return NULL;
	}
	struct udb_pair *p = aligned_alloc(LINE, sizeof(*p));
	if (p == NULL) {
		rte_errno = ENOMEM;
		return NULL;
	}
	memset(p, 0, sizeof(*p));
	p->kind = kind;
	p->burst = burst;
	p->esize = kind == UDB_PIPELINE ? sizeof(void *) : esize;
	p->mp = mp;
	snprintf(name, sizeof(name), "udb%u", atomic_fetch_add(&serial, 1));
	unsigned slots = kind == UDB_PIPELINE ? 1024 : 256;
	p->ring = rte_ring_create_elem(name, p->esize, slots, SOCKET_ID_ANY,
				       RING_F_SP_ENQ | RING_F_SC_DEQ | RING_F_EXACT_SZ);
	if (p->ring == NULL) {
		free(p);
		return NULL;
	}
	if (rte_eal_remote_launch(consumer_entry, p, 1) != 0) {
		rte_ring_free(p->ring);
		free(p);
		rte_errno = EBUSY;
		return NULL;
	}
	p->launched = 1;
	return p;
}

static int produce_pipeline(struct udb_pair *p, uint64_t objects)
{
	void *objs[MAXB];
	uint64_t seq = p->seq, left = objects;
	while (left > 0) {
		unsigned n = left < p->burst ? (unsigned)left : p->burst;
		unsigned spins = 0;
		while (rte_ring_free_count(p->ring) < n)
			spin_or_yield(&spins);
		if (n == 1) {
			if (unlikely(rte_mempool_get(p->mp, objs) != 0))
				return -1;
		} else if (unlikely(rte_mempool_get_bulk(p->mp, objs, n) != 0)) {
			return -1;
		}
		for (unsigned k = 0; k < n; k++)
			*(volatile uint64_t *)objs[k] = seq + k;
		/* room was checked and this is the only producer: the enqueue takes all n */
		rte_ring_sp_enqueue_bulk(p->ring, objs, n, NULL);
		seq += n;
		left -= n;
	}
	p->seq = seq;
	return 0;
}

static void produce_handoff(struct udb_pair *p, uint64_t objects)
{
	struct desc64 d[MAXB];
	uint64_t v[MAXB];
	uint64_t seq = p->seq, left = objects;
	memset(d, 0, sizeof(d));
	while (left > 0) {
		unsigned n = left < p->burst ? (unsigned)left : p->burst;
		void *src;
		if (p->esize == 8) {
			for (unsigned k = 0; k < n; k++)
				v[k] = seq + k;
			src = v;
		} else {
			for (unsigned k = 0; k < n; k++) {
				d[k].src = seq + k;
				d[k].dst = seq + k;
				d[k].len = 64;
			}
			src = d;
		}
		if (n == 1) {
			while (rte_ring_sp_enqueue_elem(p->ring, src, p->esize) != 0)
				rte_pause();
		} else {
			/* like the Rust cases: wait for room for the whole burst, then write it */
			while (rte_ring_free_count(p->ring) < n)
				rte_pause();
			rte_ring_sp_enqueue_bulk_elem(p->ring, src, p->esize, n, NULL);
		}
		seq += n;
		left -= n;
	}
	p->seq = seq;
}

uint64_t udb_pair_run(struct udb_pair *p, uint64_t objects)
{
	uint64_t target = atomic_load_explicit(&p->consumed, memory_order_acquire) + objects;
	uint64_t t0 = now_ns();
	if (p->kind == UDB_PIPELINE) {
		if (produce_pipeline(p, objects) != 0)
			return 0;
	} else {
		produce_handoff(p, objects);
	}
	unsigned spins = 0;
	while (atomic_load_explicit(&p->consumed, memory_order_acquire) < target) {
		if (p->kind == UDB_PIPELINE)
			spin_or_yield(&spins);
		else
			rte_pause();
	}
	return now_ns() - t0;
}

uint64_t udb_pair_stop(struct udb_pair *p)
{
	atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
	if (p->launched)
		rte_eal_wait_lcore(1);
	uint64_t sum = p->sum;
	/* drain what the consumer left (nothing, after a completed run) back to the pool */
	if (p->kind == UDB_PIPELINE) {
		void *obj;
		while (rte_ring_sc_dequeue(p->ring, &obj) == 0)
			rte_mempool_put(p->mp, obj);
	}
	rte_ring_free(p->ring);
	free(p);
	return sum;
}

unsigned udb_lcore(void)
{
	return rte_lcore_id();
}
