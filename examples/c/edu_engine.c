/* An engine written in C over QEMU's edu device (1234:11e8) through VFIO, and the library's
 * pipeline on it: a small model's frames through edu's DMA engine, the model's steps run by
 * the library on the host between edu's transfers, every result checked against the model
 * run on the host.
 *
 *   cc -std=c11 edu_engine.c $(pkg-config --cflags --libs userdma)
 *   userdma bind 0000:00:03.0 --driver vfio-pci && ./a.out 0000:00:03.0 [--allow-noiommu]
 *
 * Prints one line, "edu-engine: BDF ok: ...", and exits 0; on a failed call it prints the
 * library's message (and the engine's own note, when it has one) and exits 1; 2 for bad
 * arguments; 3 when a result, a count or a frame came back wrong.
 *
 * edu (QEMU docs/specs/edu.rst; examples/c/edu_dma.c drives the same registers) has one DMA
 * engine that moves bytes between host memory, by the address the device uses (an IOVA
 * behind an IOMMU), and a 4 KiB buffer at 0x40000 in its own address space, one transfer at a
 * time, each ending about 100 ms after it starts; its DMA mask is 28 bits. It has no compute
 * and no memory the host can reach, so the engine declares UDMA_ENGINE_READ_IN_PLACE only:
 *
 *   - Arenas are host memory: buffers of a pool of the device's on one 2 MiB hugepage
 *     (contiguous for the device even without an IOMMU, below the 28-bit mask the device was
 *     opened with), each named by its IOVA. read_arena and write_arena copy through the buffer
 *     calls; the library runs the model's steps on the host over them.
 *   - A TO_DEVICE or TO_HOST op copies host memory to host memory through edu's buffer: a
 *     chunk of up to 4095 bytes at a time (QEMU 7.2 aborts on a transfer that reaches the
 *     buffer's last byte), each chunk one transfer into the buffer and one out of it.
 *   - One queue: flush starts the first transfer, every poll moves the ops on (a transfer
 *     that has ended is followed by the next at once), ops complete in order with their tags.
 *     An op whose arena range is in no arena, or whose host buffer reaches past the mask,
 *     completes with a status of the engine's and never reaches edu.
 *   - edu cannot abort a transfer: stop_queue and reset wait until the one under way ended.
 *
 * The library calls the engine's functions one at a time, so the engine takes no lock.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <userdma.h>

/* edu's registers (offsets in BAR 0). */
enum {
	EDU_ID = 0x00,
	EDU_IRQ_STATUS = 0x24,
	EDU_IRQ_ACK = 0x64,
	EDU_DMA_SRC = 0x80,
	EDU_DMA_DST = 0x88,
	EDU_DMA_COUNT = 0x90,
	EDU_DMA_CMD = 0x98,
};
enum {
	DMA_START = 1,  /* set while a transfer runs */
	DMA_TO_RAM = 2, /* direction: edu's buffer to host memory */
};
static const uint64_t EDU_BUFFER = 0x40000;
enum { DMA_MASK_BITS = 28, MAX_TRANSFER = 4095 };
/* How long a stop or a reset waits for the transfer under way (it ends about 100 ms after it
 * started; the margin covers software emulation). */
enum { STOP_TIMEOUT_MS = 10000 };
/* A poll looks at edu's command register at most this often while a transfer runs: the
 * library polls a queue in a loop, and a transfer takes about 100 ms. */
static const uint64_t LOOK_NS = 1000000;

/* Status codes of the engine's completions (status_name names them). */
enum {
	EDU_UNSUPPORTED = 1,   /* a model step or a wait: edu only copies, on one queue */
	EDU_OUTSIDE_ARENA = 2, /* the arena range is in no arena; result: the arena address */
	EDU_BEYOND_MASK = 3,   /* the host buffer reaches past the mask; result: its IOVA */
};

enum { ARENAS = 16 };

/* An op in the queue. */
struct edu_slot {
	udma_engine_op op;
	uint64_t tag;
	/* Decided at submit: 0 for a copy edu runs, otherwise why it does not. */
	uint32_t status;
	uint64_t result;
};

struct edu_queue {
	int open;
	uint32_t depth;
	struct edu_slot *slots;
	/* Free-running counts: polled <= done <= announced <= submitted, at most depth apart.
	 * The op at `done` (while done < announced) is the one edu works on. */
	uint64_t polled, done, announced, submitted;
	uint64_t across; /* its bytes that are across */
	uint32_t chunk;  /* the bytes of its current chunk */
	int staged;      /* the chunk is in edu's buffer (its first transfer ended) */
	int running;     /* a transfer of it runs */
};

struct edu_engine {
	udma_device *dev;
	udma_pool *pool; /* the arenas' memory */
	struct {
		udma_buffer *buffer; /* NULL: a free entry */
		uint64_t at, bytes;
	} arenas[ARENAS];
	struct edu_queue queue;
	uint64_t next_look_ns;
	/* Transfers edu ran, bytes it moved host to host, resets. */
	uint64_t transfers, bytes, resets;
	int destroyed;
	/* Why the last function that failed did (the library reports only its code). */
	char why[512];
};

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void sleep_ms(long ms)
{
	struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* Records why a function of the engine fails with `status`, and returns `status`. */
static int edu_fail(struct edu_engine *e, int status, const char *format, ...)
{
	va_list args;
	va_start(args, format);
	vsnprintf(e->why, sizeof e->why, format, args);
	va_end(args);
	return status;
}

/* A register call of the engine's that failed: its status, with the library's message kept. */
static int edu_call_failed(struct edu_engine *e, enum udma_status s, const char *what)
{
	return edu_fail(e, (int)s, "%s: %s: %s", what, udma_status_name(s), udma_last_error());
}

/* Whether `len` bytes at `addr` reach past edu's DMA mask. */
static int beyond_mask(uint64_t addr, uint64_t len)
{
	return len > UINT64_MAX - addr || ((addr + len - 1) >> DMA_MASK_BITS) != 0;
}

/* The arena holding `len` bytes at `at`, or -1. */
static int edu_arena(const struct edu_engine *e, uint64_t at, uint64_t len)
{
	for (int i = 0; i < ARENAS; i++) {
		const uint64_t base = e->arenas[i].at, bytes = e->arenas[i].bytes;
		if (e->arenas[i].buffer != NULL && at >= base && len <= bytes &&
		    at - base <= bytes - len)
			return i;
	}
	return -1;
}

/* Arenas not freed. */
static int edu_arenas_left(const struct edu_engine *e)
{
	int left = 0;
	for (int i = 0; i < ARENAS; i++)
		left += e->arenas[i].buffer != NULL;
	return left;
}

/* Reads edu's DMA command register: `*running` says whether a transfer runs. */
static int edu_look(struct edu_engine *e, int *running)
{
	uint64_t cmd = 0;
	enum udma_status s = udma_device_read64(e->dev, 0, EDU_DMA_CMD, &cmd);
	if (s != UDMA_OK)
		return edu_call_failed(e, s, "reading edu's DMA command register");
	if (cmd == UINT64_MAX) {
		/* What a device that is gone reads (edu never sets the command's upper bits). */
		int removed = 0;
		if (udma_device_is_removed(e->dev, &removed) == UDMA_OK && removed)
			return edu_fail(e, UDMA_ERR_REMOVED, "edu was removed");
		return edu_fail(e, UDMA_ERR_DEVICE, "edu's DMA command register reads all-ones");
	}
	*running = (cmd & DMA_START) != 0;
	return 0;
}

/* Waits until no transfer runs (edu cannot abort one). */
static int edu_wait_idle(struct edu_engine *e, const char *when)
{
	const uint64_t start = now_ns();
	for (;;) {
		int running = 0;
		int s = edu_look(e, &running);
		if (s != 0)
			return s;
		if (!running) {
			/* What the transfer wrote is read after the load that saw it end. */
			atomic_thread_fence(memory_order_acquire);
			return 0;
		}
		if (now_ns() - start > (uint64_t)STOP_TIMEOUT_MS * 1000000u)
			return edu_fail(e, UDMA_ERR_TIMEOUT, "edu's DMA engine is still busy %s after %d ms",
					when, STOP_TIMEOUT_MS);
		sleep_ms(1);
	}
}

/* Starts a transfer of `len` bytes between the start of edu's buffer and `addr`. */
static int edu_start(struct edu_engine *e, int to_ram, uint64_t addr, uint32_t len)
{
	int running = 0;
	int s = edu_look(e, &running);
	if (s != 0)
		return s;
	if (running)
		/* edu would ignore the writes below: a transfer nobody waits for is not ours. */
		return edu_fail(e, UDMA_ERR_BUSY,
				"edu's DMA engine runs a transfer the engine did not start: another "
				"user of the device?");
	const uint64_t src = to_ram ? EDU_BUFFER : addr, dst = to_ram ? addr : EDU_BUFFER;
	enum udma_status r = udma_device_write64(e->dev, 0, EDU_DMA_SRC, src);
	if (r == UDMA_OK)
		r = udma_device_write64(e->dev, 0, EDU_DMA_DST, dst);
	if (r == UDMA_OK)
		r = udma_device_write64(e->dev, 0, EDU_DMA_COUNT, len);
	/* The bytes edu reads (a host buffer the library filled, an arena the host steps wrote)
	 * were stored before the write that starts it. */
	atomic_thread_fence(memory_order_release);
	if (r == UDMA_OK)
		r = udma_device_write64(e->dev, 0, EDU_DMA_CMD, DMA_START | (to_ram ? DMA_TO_RAM : 0));
	if (r != UDMA_OK)
		return edu_call_failed(e, r, "programming edu's DMA engine");
	return 0;
}

/* Moves the queue on: a transfer that has ended is counted and the next one started at once,
 * and every op whose bytes are across (or that was refused) completes on the way. Returns
 * with a transfer under way, or with no op left to run. */
static int edu_advance(struct edu_engine *e, struct edu_queue *q)
{
	for (;;) {
		if (q->running) {
			const uint64_t now = now_ns();
			if (now < e->next_look_ns)
				return 0;
			e->next_look_ns = now + LOOK_NS;
			int running = 0;
			int s = edu_look(e, &running);
			if (s != 0)
				return s;
			if (running)
				return 0;
			/* What the transfer wrote is read (by the next transfer, by the host) after
			 * the load that saw it end. */
			atomic_thread_fence(memory_order_acquire);
			q->running = 0;
			e->transfers++;
			if (q->staged) {
				q->staged = 0;
				q->across += q->chunk;
				e->bytes += q->chunk;
			} else {
				q->staged = 1;
			}
		}
		if (q->done == q->announced)
			return 0;
		const struct edu_slot *slot = &q->slots[q->done % q->depth];
		const udma_engine_op *op = &slot->op;
		if (slot->status == 0 && q->across < op->len) {
			const int to_device = op->kind == UDMA_ENGINE_OP_TO_DEVICE;
			const uint64_t from = (to_device ? op->host_iova : op->arena_at) + q->across;
			const uint64_t to = (to_device ? op->arena_at : op->host_iova) + q->across;
			int s;
			if (q->staged) {
				s = edu_start(e, 1, to, q->chunk);
			} else {
				const uint64_t left = op->len - q->across;
				q->chunk = left < MAX_TRANSFER ? (uint32_t)left : MAX_TRANSFER;
				s = edu_start(e, 0, from, q->chunk);
			}
			if (s != 0)
				return s;
			q->running = 1;
			e->next_look_ns = now_ns() + LOOK_NS;
			return 0;
		}
		/* Every byte across, or refused: complete. */
		q->done++;
		q->across = 0;
	}
}

/* Why edu does not run `op` (0: it does), with the address at fault in `*result`. */
static uint32_t edu_refusal(const struct edu_engine *e, const udma_engine_op *op,
			    uint64_t *result)
{
	*result = 0;
	if (op->kind != UDMA_ENGINE_OP_TO_DEVICE && op->kind != UDMA_ENGINE_OP_TO_HOST)
		return EDU_UNSUPPORTED;
	if (op->len == 0)
		return 0;
	if (edu_arena(e, op->arena_at, op->len) < 0) {
		*result = op->arena_at;
		return EDU_OUTSIDE_ARENA;
	}
	/* The arenas lie below the mask (alloc_arena checks); the host buffer is the library's. */
	if (beyond_mask(op->host_iova, op->len)) {
		*result = op->host_iova;
		return EDU_BEYOND_MASK;
	}
	return 0;
}

static int edu_open_queue(void *user, uint32_t queue, uint32_t depth, uint32_t context,
			  uint32_t unit, void **q)
{
	struct edu_engine *e = user;
	(void)context;
	if (queue != 0)
		return edu_fail(e, UDMA_ERR_NOT_FOUND, "queue %" PRIu32 ": edu has one (0)", queue);
	if (unit != 0)
		return edu_fail(e, UDMA_ERR_UNSUPPORTED, "unit %" PRIu32 ": edu only copies", unit);
	struct edu_queue *eq = &e->queue;
	if (eq->open)
		return edu_fail(e, UDMA_ERR_BUSY, "queue 0 is open already");
	if (depth == 0)
		return edu_fail(e, UDMA_ERR_INVALID_ARGUMENT, "a queue of depth 0");
	struct edu_slot *slots = calloc(depth, sizeof *slots);
	if (slots == NULL)
		return edu_fail(e, UDMA_ERR_EXHAUSTED, "no memory for a queue of %" PRIu32, depth);
	memset(eq, 0, sizeof *eq);
	eq->open = 1;
	eq->depth = depth;
	eq->slots = slots;
	*q = eq;
	return 0;
}

static int edu_submit(void *user, void *qp, const udma_engine_op *op, uint64_t tag)
{
	struct edu_engine *e = user;
	struct edu_queue *q = qp;
	if (q->submitted - q->polled >= q->depth)
		return edu_fail(e, UDMA_ERR_EXHAUSTED, "queue 0 holds %" PRIu32 " ops", q->depth);
	struct edu_slot *slot = &q->slots[q->submitted % q->depth];
	slot->op = *op;
	slot->tag = tag;
	slot->status = edu_refusal(e, op, &slot->result);
	q->submitted++;
	return 0;
}

static int edu_flush(void *user, void *qp)
{
	struct edu_queue *q = qp;
	q->announced = q->submitted;
	return edu_advance(user, q);
}

static int edu_poll(void *user, void *qp, udma_engine_completion *out)
{
	struct edu_queue *q = qp;
	int s = edu_advance(user, q);
	if (q->polled == q->done)
		return s != 0 ? -s : 0;
	/* What completed before a failure is handed back first; the failure comes next. */
	const struct edu_slot *slot = &q->slots[q->polled % q->depth];
	out->tag = slot->tag;
	out->status = slot->status;
	out->command = (uint32_t)q->polled;
	out->result = slot->result;
	q->polled++;
	return 1;
}

static int edu_stop_queue(void *user, void *qp)
{
	struct edu_engine *e = user;
	struct edu_queue *q = qp;
	if (q->running) {
		int s = edu_wait_idle(e, "for a queue's stop");
		/* A device that is gone reaches no memory any more. */
		if (s != 0 && s != UDMA_ERR_REMOVED)
			return s; /* the queue stays open: its buffers may still be written */
	}
	free(q->slots);
	memset(q, 0, sizeof *q);
	return 0;
}

static int edu_alloc_arena(void *user, uint64_t bytes, uint64_t align, uint64_t *at)
{
	struct edu_engine *e = user;
	int i = 0;
	while (i < ARENAS && e->arenas[i].buffer != NULL)
		i++;
	if (i == ARENAS)
		return edu_fail(e, UDMA_ERR_EXHAUSTED, "the engine keeps %d arenas at most", ARENAS);
	udma_buffer *buffer;
	enum udma_status s = udma_pool_alloc(e->pool, bytes, &buffer);
	if (s != UDMA_OK)
		return edu_call_failed(e, s, "allocating an arena from the pool");
	udma_buffer_info info = {.size = sizeof info};
	s = udma_buffer_get_info(buffer, &info);
	int rc = 0;
	if (s != UDMA_OK)
		rc = edu_call_failed(e, s, "reading an arena buffer's addresses");
	else if (align > 1 && info.iova % align != 0)
		rc = edu_fail(e, UDMA_ERR_INVALID_ARGUMENT,
			      "an arena at IOVA %#" PRIx64 " is not aligned to %" PRIu64, info.iova,
			      align);
	else if (beyond_mask(info.iova, bytes))
		rc = edu_fail(e, UDMA_ERR_EXHAUSTED,
			      "an arena at IOVA %#" PRIx64 " reaches past edu's %d-bit DMA mask",
			      info.iova, DMA_MASK_BITS);
	if (rc != 0) {
		udma_pool_free(e->pool, buffer);
		return rc;
	}
	memset(info.host, 0, (size_t)bytes);
	e->arenas[i].buffer = buffer;
	e->arenas[i].at = info.iova;
	e->arenas[i].bytes = bytes;
	*at = info.iova;
	return 0;
}

static void edu_free_arena(void *user, uint64_t at)
{
	struct edu_engine *e = user;
	for (int i = 0; i < ARENAS; i++)
		if (e->arenas[i].buffer != NULL && e->arenas[i].at == at) {
			enum udma_status s = udma_pool_free(e->pool, e->arenas[i].buffer);
			if (s != UDMA_OK) /* nothing to return it to: kept for the program to see */
				edu_call_failed(e, s, "freeing an arena");
			e->arenas[i].buffer = NULL;
		}
}

static int edu_read_arena(void *user, uint64_t at, void *dst, size_t len)
{
	struct edu_engine *e = user;
	int i = edu_arena(e, at, len);
	if (i < 0)
		return edu_fail(e, UDMA_ERR_INVALID_ARGUMENT,
				"read_arena: %zu bytes at %#" PRIx64 " are in no arena", len, at);
	enum udma_status s = udma_buffer_read(e->arenas[i].buffer, at - e->arenas[i].at, dst, len);
	return s == UDMA_OK ? 0 : edu_call_failed(e, s, "reading an arena");
}

static int edu_write_arena(void *user, uint64_t at, const void *src, size_t len)
{
	struct edu_engine *e = user;
	int i = edu_arena(e, at, len);
	if (i < 0)
		return edu_fail(e, UDMA_ERR_INVALID_ARGUMENT,
				"write_arena: %zu bytes at %#" PRIx64 " are in no arena", len, at);
	enum udma_status s =
		udma_buffer_write(e->arenas[i].buffer, at - e->arenas[i].at, src, len);
	return s == UDMA_OK ? 0 : edu_call_failed(e, s, "writing an arena");
}

/* edu has no reset the library offers: waits for the transfer under way, acknowledges what
 * edu has pending, checks that it still answers, and drops every op not completed (the
 * library aborts them when it shuts the queue down; completed ones can still be polled). */
static int edu_reset(void *user)
{
	struct edu_engine *e = user;
	int s = edu_wait_idle(e, "for a reset");
	if (s != 0)
		return s;
	uint32_t pending = 0, id = 0;
	enum udma_status r = udma_device_read32(e->dev, 0, EDU_IRQ_STATUS, &pending);
	if (r == UDMA_OK && pending != 0)
		r = udma_device_write32(e->dev, 0, EDU_IRQ_ACK, pending);
	if (r == UDMA_OK)
		r = udma_device_read32(e->dev, 0, EDU_ID, &id);
	if (r != UDMA_OK)
		return edu_call_failed(e, r, "resetting edu");
	if (id == UINT32_MAX)
		return edu_fail(e, UDMA_ERR_REMOVED, "edu's ID register reads all-ones: it is gone");
	struct edu_queue *q = &e->queue;
	if (q->open) {
		q->running = 0;
		q->staged = 0;
		q->across = 0;
		q->announced = q->submitted = q->done;
	}
	e->resets++;
	return 0;
}

static const char *edu_status_name(void *user, uint32_t status)
{
	(void)user;
	switch (status) {
	case EDU_UNSUPPORTED:
		return "unsupported (edu only copies, on one queue)";
	case EDU_OUTSIDE_ARENA:
		return "outside every arena of the edu engine";
	case EDU_BEYOND_MASK:
		return "beyond edu's 28-bit DMA mask";
	default:
		return NULL;
	}
}

static void edu_destroy(void *user)
{
	struct edu_engine *e = user;
	e->destroyed++;
}

/* The engine over `dev` (opened with edu's 28-bit mask): its arenas' pool, on one 2 MiB
 * hugepage. edu's DMA engine must be idle: each transfer it runs from here on is the
 * engine's. */
static int edu_engine_init(struct edu_engine *e, udma_device *dev)
{
	memset(e, 0, sizeof *e);
	e->dev = dev;
	int running = 0;
	int s = edu_look(e, &running);
	if (s != 0)
		return s;
	if (running)
		return edu_fail(e, UDMA_ERR_BUSY, "edu's DMA engine is running a transfer: another "
						  "user of the device?");
	udma_pool_options o = {.size = sizeof o, .bytes = 2 << 20, .page_size = UDMA_PAGE_2M};
	enum udma_status r = udma_pool_create(dev, &o, &e->pool);
	return r == UDMA_OK ? 0 : edu_call_failed(e, r, "making the arenas' pool");
}

static udma_engine_ops edu_engine_ops(void)
{
	udma_engine_ops ops = {
		.size = sizeof ops,
		.name = "edu",
		.flags = UDMA_ENGINE_READ_IN_PLACE,
		.queues = 1,
		.open_queue = edu_open_queue,
		.submit = edu_submit,
		.flush = edu_flush,
		.poll = edu_poll,
		.stop_queue = edu_stop_queue,
		.alloc_arena = edu_alloc_arena,
		.free_arena = edu_free_arena,
		.read_arena = edu_read_arena,
		.write_arena = edu_write_arena,
		.reset = edu_reset,
		.status_name = edu_status_name,
		.destroy = edu_destroy,
	};
	return ops;
}

/* ---- the program: a pipeline on the engine ------------------------------------------------ */

/* A two-layer chain of 2 KiB tensors, two slots, 16 frames: four transfers of about 100 ms a
 * frame (the input in, the result out, each through edu's buffer), about 7 s. */
enum { LAYERS = 2, BYTES = 2048, DEPTH = 2, FRAMES = 16, PATTERNS = 4 };
enum { EXIT_CALL = 1, EXIT_USAGE = 2, EXIT_DATA = 3 };

static struct edu_engine state;

/* Exits with the library's message (and the engine's note) when `call` failed. */
static void check_call(int s, const char *call)
{
	if (s == UDMA_OK)
		return;
	fprintf(stderr, "edu-engine: %s failed: %s: %s\n", call, udma_status_name(s),
		udma_last_error());
	if (state.why[0] != '\0')
		fprintf(stderr, "edu-engine: the engine: %s\n", state.why);
	exit(EXIT_CALL);
}

#define TRY(call) check_call((call), #call)

static void fail(int code, const char *what)
{
	fprintf(stderr, "edu-engine: %s\n", what);
	exit(code);
}

struct check {
	uint8_t expected[PATTERNS][BYTES];
	uint64_t next, right, wrong;
	char first[256]; /* the first wrong frame */
};

static void input_of(uint64_t frame, uint8_t *in)
{
	for (int i = 0; i < BYTES; i++)
		in[i] = (uint8_t)(i * 13 + (int)(frame % PATTERNS) * 71 + (i >> 8));
}

static void take(void *user, const udma_frame_output *out)
{
	struct check *c = user;
	uint8_t got[BYTES];
	const char *why = NULL;
	if (out->frame != c->next)
		why = "out of order";
	else if (out->status != 0)
		why = "failed";
	else if (udma_frame_output_read(out, 0, got, sizeof got) != UDMA_OK)
		why = "unreadable";
	else if (memcmp(got, c->expected[out->frame % PATTERNS], BYTES) != 0)
		why = "not the model run on the host";
	c->next = out->frame + 1;
	if (why == NULL) {
		c->right++;
		return;
	}
	if (c->wrong++ == 0)
		snprintf(c->first, sizeof c->first,
			 "frame %" PRIu64 " %s (status %" PRIu32 " at step %" PRIu32 ", fault %#" PRIx64
			 ")",
			 out->frame, why, out->status, out->step, out->fault);
}

/* Transfers edu runs to copy `len` bytes: two per chunk. */
static uint64_t transfers_for(uint64_t len)
{
	return 2 * ((len + MAX_TRANSFER - 1) / MAX_TRANSFER);
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--allow-noiommu") != 0)) {
		fprintf(stderr, "usage: %s BDF [--allow-noiommu]\n", argv[0]);
		return EXIT_USAGE;
	}
	const char *bdf = argv[1];
	if (udma_version() >> 16 != UDMA_VERSION_MAJOR)
		fail(EXIT_CALL, "the library's major version is not the header's");

	udma_pci_options po = {.size = sizeof po, .backend = UDMA_PCI_VFIO,
			       .dma_mask_bits = DMA_MASK_BITS,
			       .flags = argc == 3 ? UDMA_PCI_ALLOW_NOIOMMU : 0};
	udma_device *dev;
	TRY(udma_device_open_pci(bdf, &po, &dev));
	uint32_t id = 0;
	TRY(udma_device_read32(dev, 0, EDU_ID, &id));
	if ((id & 0xff) != 0xed)
		fail(EXIT_CALL, "the ID register's low byte is not 0xed: is this edu?");

	int init = edu_engine_init(&state, dev);
	if (init != 0) {
		/* The engine's own note says why (with the library's message of a failed call). */
		fprintf(stderr, "edu-engine: %s: %s\n", udma_status_name(init), state.why);
		return EXIT_CALL;
	}
	udma_engine_ops ops = edu_engine_ops();
	udma_engine *engine;
	TRY(udma_engine_create(dev, &ops, &state, &engine));

	udma_model *model;
	TRY(udma_model_create_chain(LAYERS, BYTES, &model));
	udma_model_info mi = {.size = sizeof mi};
	TRY(udma_model_get_info(model, &mi));
	if (mi.input_bytes != BYTES || mi.result_bytes != BYTES)
		fail(EXIT_DATA, "the chain's input or result is not BYTES long");
	static struct check c;
	for (int k = 0; k < PATTERNS; k++) {
		uint8_t in[BYTES];
		input_of((uint64_t)k, in);
		TRY(udma_model_expected(model, in, BYTES, c.expected[k], BYTES));
	}
	/* Results copied back (TO_HOST ops through edu), not read in place. */
	udma_pipeline_options o = {.size = sizeof o, .depth = DEPTH, .results = UDMA_RESULTS_COPY};
	udma_pipeline *p;
	TRY(udma_pipeline_create_on_engine(engine, model, &o, &p));
	TRY(udma_engine_destroy(engine)); /* the pipeline keeps it */

	const uint64_t start = now_ns();
	for (uint64_t n = 0; n < FRAMES;) {
		uint8_t in[BYTES];
		input_of(n, in);
		enum udma_status s = udma_pipeline_submit(p, in, BYTES, NULL);
		if (s == UDMA_ERR_BUSY) {
			/* Every slot in flight: take a finished frame first. */
			TRY(udma_pipeline_wait(p, take, &c, NULL));
			continue;
		}
		check_call(s, "udma_pipeline_submit(p, in, BYTES, NULL)");
		n++;
	}
	for (size_t finished = 1; finished > 0 && c.right + c.wrong < FRAMES;)
		TRY(udma_pipeline_wait(p, take, &c, &finished));
	const uint64_t elapsed_ms = (now_ns() - start) / 1000000u;
	udma_pipeline_info info = {.size = sizeof info};
	TRY(udma_pipeline_get_info(p, &info));
	TRY(udma_pipeline_destroy(p));
	TRY(udma_model_destroy(model));

	/* Everything right: every frame, where the steps ran, what edu did. */
	char why[512] = "";
	const uint64_t transfers = FRAMES * (transfers_for(mi.input_bytes) +
					     transfers_for(mi.result_bytes));
	if (c.wrong != 0)
		snprintf(why, sizeof why, "%" PRIu64 " of %d frames right; the first wrong: %s", c.right,
			 FRAMES, c.first);
	else if (c.right != FRAMES)
		snprintf(why, sizeof why, "%" PRIu64 " of %d frames came back", c.right, FRAMES);
	else if (info.frames != FRAMES || info.failed != 0)
		snprintf(why, sizeof why, "the pipeline counts %" PRIu64 " frames, %" PRIu64 " failed",
			 info.frames, info.failed);
	else if (info.compute != UDMA_COMPUTE_HOST ||
		 info.host_steps != (uint64_t)FRAMES * mi.steps)
		snprintf(why, sizeof why,
			 "compute %" PRIu32 " with %" PRIu64 " steps on the host, want %d (the host) "
			 "with %" PRIu64,
			 info.compute, info.host_steps, UDMA_COMPUTE_HOST,
			 (uint64_t)FRAMES * mi.steps);
	else if (info.in_place != 0)
		snprintf(why, sizeof why, "results were read in place, not copied back through edu");
	else if (state.transfers != transfers ||
		 state.bytes != FRAMES * (mi.input_bytes + mi.result_bytes))
		snprintf(why, sizeof why,
			 "edu ran %" PRIu64 " transfers moving %" PRIu64 " bytes, want %" PRIu64
			 " moving %" PRIu64,
			 state.transfers, state.bytes, transfers,
			 (uint64_t)FRAMES * (mi.input_bytes + mi.result_bytes));
	else if (state.destroyed != 1 || state.queue.open || edu_arenas_left(&state) != 0 ||
		 state.resets != 0)
		snprintf(why, sizeof why,
			 "after the pipeline: engine released %d time(s), queue %s, %d arena(s) left, "
			 "%" PRIu64 " reset(s)",
			 state.destroyed, state.queue.open ? "open" : "stopped",
			 edu_arenas_left(&state), state.resets);
	if (why[0] != '\0')
		fail(EXIT_DATA, why);

	TRY(udma_pool_destroy(state.pool));
	TRY(udma_device_close(dev));
	printf("edu-engine: %s ok: %d frames of a %d-layer chain of %d bytes through the "
	       "library's pipeline, every result right; %" PRIu64 " steps on the host; %" PRIu64
	       " edu transfers, %" PRIu64 " bytes through its buffer, %" PRIu64 " ms; ID %#010" PRIx32
	       "\n",
	       bdf, FRAMES, LAYERS, BYTES, info.host_steps, state.transfers, state.bytes,
	       elapsed_ms, id);
	return EXIT_SUCCESS;
}
