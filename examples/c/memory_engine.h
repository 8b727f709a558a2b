/* A small engine written against udma_engine_ops: a device with one copy engine and no
 * compute, over host memory. Its arenas are host allocations (an arena's address is its
 * pointer); it copies by the host addresses the ops carry; its queues run their ops, in order,
 * when flushed, and hand completions back in order. The library runs the model's steps on the
 * host between its copies (it declares no UDMA_ENGINE_COMPUTE).
 *
 * Include it in one C file; `memory_engine_ops()` gives the table, `memory_engine_init()` the
 * engine's state. A vendor's engine has the same shape: open_queue/submit/flush/poll over the
 * device's rings or registers, arenas in device memory, read_arena/write_arena through a BAR.
 *
 * Knobs for tests (set them on the state): `fail_op` fails the op of that number (counted
 * from 1 over every queue) with status MEMORY_ENGINE_INJECTED; `misorder` hands completions
 * back with the wrong tag; `submit_full` makes submit refuse as a full queue.
 */
#ifndef MEMORY_ENGINE_H
#define MEMORY_ENGINE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <userdma.h>

enum {
	MEMORY_ENGINE_QUEUES = 4,
	MEMORY_ENGINE_ARENAS = 64,
	/* Status codes of its completions. */
	MEMORY_ENGINE_OUTSIDE = 1,
	MEMORY_ENGINE_INJECTED = 2,
	MEMORY_ENGINE_UNSUPPORTED = 3,
};

struct memory_queue {
	int open;
	uint32_t depth;
	struct memory_op {
		udma_engine_op op;
		uint64_t tag;
		uint32_t status;
	} *ops;
	/* Free-running counts: polled <= run <= announced <= submitted, at most depth apart. */
	uint64_t polled, run, announced, submitted;
};

struct memory_engine {
	struct memory_queue queues[MEMORY_ENGINE_QUEUES];
	struct {
		unsigned char *at;
		uint64_t bytes;
	} arenas[MEMORY_ENGINE_ARENAS];
	uint64_t ops_run, fail_op;
	int misorder, submit_full, destroyed;
};

static inline void memory_engine_init(struct memory_engine *e)
{
	memset(e, 0, sizeof *e);
}

/* The arena holding [at, at + len), or NULL. */
static unsigned char *memory_engine_arena(struct memory_engine *e, uint64_t at, uint64_t len)
{
	for (int i = 0; i < MEMORY_ENGINE_ARENAS; i++) {
		uint64_t base = (uint64_t)(uintptr_t)e->arenas[i].at;
		if (e->arenas[i].at != NULL && at >= base && len <= e->arenas[i].bytes &&
		    at - base <= e->arenas[i].bytes - len)
			return e->arenas[i].at + (at - base);
	}
	return NULL;
}

static int memory_open_queue(void *user, uint32_t queue, uint32_t depth, uint32_t context,
			     uint32_t unit, void **q)
{
	struct memory_engine *e = user;
	(void)context;
	if (queue >= MEMORY_ENGINE_QUEUES || unit != 0)
		return UDMA_ERR_NOT_FOUND;
	struct memory_queue *mq = &e->queues[queue];
	if (mq->open)
		return UDMA_ERR_BUSY;
	mq->ops = calloc(depth, sizeof *mq->ops);
	if (mq->ops == NULL)
		return UDMA_ERR_EXHAUSTED;
	mq->open = 1;
	mq->depth = depth;
	mq->polled = mq->run = mq->announced = mq->submitted = 0;
	*q = mq;
	return 0;
}

static int memory_submit(void *user, void *q, const udma_engine_op *op, uint64_t tag)
{
	struct memory_engine *e = user;
	struct memory_queue *mq = q;
	if (e->submit_full || mq->submitted - mq->polled >= mq->depth)
		return UDMA_ERR_EXHAUSTED;
	struct memory_op *slot = &mq->ops[mq->submitted % mq->depth];
	slot->op = *op;
	slot->tag = tag;
	mq->submitted++;
	return 0;
}

/* Runs one op: a copy between a host buffer and an arena, by their addresses. */
static uint32_t memory_run(struct memory_engine *e, const udma_engine_op *op)
{
	if (++e->ops_run == e->fail_op)
		return MEMORY_ENGINE_INJECTED;
	if (op->kind != UDMA_ENGINE_OP_TO_DEVICE && op->kind != UDMA_ENGINE_OP_TO_HOST)
		return MEMORY_ENGINE_UNSUPPORTED;
	unsigned char *arena = memory_engine_arena(e, op->arena_at, op->len);
	if (arena == NULL || op->host == NULL)
		return MEMORY_ENGINE_OUTSIDE;
	if (op->kind == UDMA_ENGINE_OP_TO_DEVICE)
		memcpy(arena, op->host, (size_t)op->len);
	else
		memcpy(op->host, arena, (size_t)op->len);
	return 0;
}

static int memory_flush(void *user, void *q)
{
	struct memory_engine *e = user;
	struct memory_queue *mq = q;
	mq->announced = mq->submitted;
	for (; mq->run < mq->announced; mq->run++) {
		struct memory_op *slot = &mq->ops[mq->run % mq->depth];
		slot->status = memory_run(e, &slot->op);
	}
	return 0;
}

static int memory_poll(void *user, void *q, udma_engine_completion *out)
{
	struct memory_engine *e = user;
	struct memory_queue *mq = q;
	if (mq->polled == mq->run)
		return 0;
	struct memory_op *slot = &mq->ops[mq->polled % mq->depth];
	out->tag = e->misorder ? slot->tag + 1 : slot->tag;
	out->status = slot->status;
	out->command = (uint32_t)mq->polled;
	out->result = 0;
	mq->polled++;
	return 1;
}

static int memory_stop_queue(void *user, void *q)
{
	(void)user;
	struct memory_queue *mq = q;
	/* Ops run only inside flush, on the caller's thread: nothing runs after this. */
	free(mq->ops);
	mq->ops = NULL;
	mq->open = 0;
	return 0;
}

static int memory_alloc_arena(void *user, uint64_t bytes, uint64_t align, uint64_t *at)
{
	struct memory_engine *e = user;
	if (align < sizeof(void *))
		align = sizeof(void *);
	for (int i = 0; i < MEMORY_ENGINE_ARENAS; i++) {
		if (e->arenas[i].at != NULL)
			continue;
		/* aligned_alloc wants a size that is a multiple of the alignment. */
		uint64_t rounded = (bytes + align - 1) / align * align;
		unsigned char *p = aligned_alloc((size_t)align, (size_t)rounded);
		if (p == NULL)
			return UDMA_ERR_EXHAUSTED;
		memset(p, 0, (size_t)rounded);
		e->arenas[i].at = p;
		e->arenas[i].bytes = bytes;
		*at = (uint64_t)(uintptr_t)p;
		return 0;
	}
	return UDMA_ERR_EXHAUSTED;
}

static void memory_free_arena(void *user, uint64_t at)
{
	struct memory_engine *e = user;
	for (int i = 0; i < MEMORY_ENGINE_ARENAS; i++) {
		if ((uint64_t)(uintptr_t)e->arenas[i].at == at) {
			free(e->arenas[i].at);
			e->arenas[i].at = NULL;
		}
	}
}

static int memory_read_arena(void *user, uint64_t at, void *dst, size_t len)
{
	unsigned char *p = memory_engine_arena(user, at, len);
	if (p == NULL)
		return UDMA_ERR_INVALID_ARGUMENT;
	memcpy(dst, p, len);
	return 0;
}

static int memory_write_arena(void *user, uint64_t at, const void *src, size_t len)
{
	unsigned char *p = memory_engine_arena(user, at, len);
	if (p == NULL)
		return UDMA_ERR_INVALID_ARGUMENT;
	memcpy(p, src, len);
	return 0;
}

static int memory_reset(void *user)
{
	struct memory_engine *e = user;
	/* Nothing runs outside flush: a reset drops what was announced and not run. */
	for (int i = 0; i < MEMORY_ENGINE_QUEUES; i++)
		if (e->queues[i].open)
			e->queues[i].announced = e->queues[i].submitted = e->queues[i].run;
	return 0;
}

static const char *memory_status_name(void *user, uint32_t status)
{
	(void)user;
	switch (status) {
	case MEMORY_ENGINE_OUTSIDE:
		return "outside every arena";
	case MEMORY_ENGINE_INJECTED:
		return "injected";
	case MEMORY_ENGINE_UNSUPPORTED:
		return "unsupported (this engine only copies)";
	default:
		return NULL;
	}
}

static void memory_destroy(void *user)
{
	struct memory_engine *e = user;
	e->destroyed++;
}

/* The engine's table; `flags` adds capabilities to what it declares by itself. */
static inline udma_engine_ops memory_engine_ops(uint32_t flags)
{
	udma_engine_ops ops = {
		.size = sizeof ops,
		.name = "memory-engine",
		.flags = UDMA_ENGINE_READ_IN_PLACE | flags,
		.queues = MEMORY_ENGINE_QUEUES,
		.open_queue = memory_open_queue,
		.submit = memory_submit,
		.flush = memory_flush,
		.poll = memory_poll,
		.stop_queue = memory_stop_queue,
		.alloc_arena = memory_alloc_arena,
		.free_arena = memory_free_arena,
		.read_arena = memory_read_arena,
		.write_arena = memory_write_arena,
		.reset = memory_reset,
		.status_name = memory_status_name,
		.destroy = memory_destroy,
	};
	return ops;
}

#endif
