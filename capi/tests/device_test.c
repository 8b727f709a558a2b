/* The C API's device-level tests, against the loopback device: BAR access (its BAR 0
 * registers and BAR 2 memory), the loopback device's layer and compact ops, device-memory
 * ranges, and memory the program owns mapped for the device; each success checked for its result and each error path for its status and its
 * message. Built and run as capi_test.c is (scripts/capi-test.sh). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "check.h"

/* The loopback device's BAR 0 (src/device/loopback/regs.rs). */
enum {
	REG_ID = 0x00,
	REG_VERSION = 0x04,
	REG_QUEUES = 0x08,
	REG_MEMORY_SIZE = 0x20,
	REG_IRQ_MASK = 0x28,
	REG_IRQ_MASK_SET = 0x2c,
	REG_IRQ_MASK_CLEAR = 0x30,
	QUEUE_BASE = 0x100,
	QUEUE_STRIDE = 0x60,
	/* Queue 3's ring_base (64-bit) and context (32-bit): read-write while it is disabled. */
	Q3_RING_BASE = QUEUE_BASE + 3 * QUEUE_STRIDE,
	Q3_CONTEXT = Q3_RING_BASE + 12,
	REGISTER_BAR_LEN = 0x1000,
};

/* "UDLB" in little-endian ASCII. */
static const uint32_t LOOPBACK_ID = 0x424c4455u;


/* ---- BAR access --------------------------------------------------------------------- */

static void test_bar_registers(void)
{
	udma_device *dev = loopback();
	udma_bar_info bar = {.size = sizeof bar};
	OK(udma_device_get_bar(dev, 0, &bar));
	CHECK(bar.len == REGISTER_BAR_LEN && bar.index == 0);
	OK(udma_device_get_bar(dev, 2, &bar));
	CHECK(bar.len == 1 << 20 && bar.index == 2);

	/* Read-only identity registers, at every width. */
	uint8_t b = 0;
	uint16_t h = 0;
	uint32_t w = 0;
	uint64_t q = 0;
	OK(udma_device_read32(dev, 0, REG_ID, &w));
	CHECK(w == LOOPBACK_ID);
	OK(udma_device_read8(dev, 0, REG_ID + 1, &b));
	CHECK(b == 'D');
	OK(udma_device_read16(dev, 0, REG_ID + 2, &h));
	CHECK(h == 0x424c); /* "LB" */
	OK(udma_device_read32(dev, 0, REG_VERSION, &w));
	CHECK(w == 2); /* the register map's version: 2, the doorbells in their own block */
	OK(udma_device_read32(dev, 0, REG_QUEUES, &w));
	CHECK(w == 4);
	OK(udma_device_read64(dev, 0, REG_MEMORY_SIZE, &q));
	CHECK(q == 1 << 20);
	/* A write to a read-only register is dropped, as a device drops it. */
	OK(udma_device_write32(dev, 0, REG_ID, 0x12345678u));
	OK(udma_device_read32(dev, 0, REG_ID, &w));
	CHECK(w == LOOPBACK_ID);

	/* Read-write registers: 64-, 32-, 16- and 8-bit writes land where they should. */
	OK(udma_device_write64(dev, 0, Q3_RING_BASE, 0x1122334455667788ull));
	OK(udma_device_read64(dev, 0, Q3_RING_BASE, &q));
	CHECK(q == 0x1122334455667788ull);
	OK(udma_device_write16(dev, 0, Q3_RING_BASE + 2, 0xbeef));
	OK(udma_device_write8(dev, 0, Q3_RING_BASE + 7, 0x99));
	OK(udma_device_read64(dev, 0, Q3_RING_BASE, &q));
	CHECK(q == 0x99223344beef7788ull);
	OK(udma_device_write32(dev, 0, Q3_CONTEXT, 0xc0ffee));
	OK(udma_device_read32(dev, 0, Q3_CONTEXT, &w));
	CHECK(w == 0xc0ffee);
	/* Registers with an effect: the interrupt mask's set and clear registers. */
	OK(udma_device_write32(dev, 0, REG_IRQ_MASK_SET, 0x5));
	OK(udma_device_read32(dev, 0, REG_IRQ_MASK, &w));
	CHECK(w == 0x5);
	OK(udma_device_write32(dev, 0, REG_IRQ_MASK_CLEAR, 0x1));
	OK(udma_device_read32(dev, 0, REG_IRQ_MASK, &w));
	CHECK(w == 0x4);
	OK(udma_device_write32(dev, 0, REG_IRQ_MASK_CLEAR, 0x4));

	/* An older, smaller info struct gets its prefix only. */
	struct {
		size_t size;
		uint64_t len;
		uint32_t sentinel;
	} small = {offsetof(udma_bar_info, index), 0, 0xabcdu};
	OK(udma_device_get_bar(dev, 0, (udma_bar_info *)(void *)&small));
	CHECK(small.len == REGISTER_BAR_LEN && small.sentinel == 0xabcdu);
	OK(udma_device_close(dev));
}

/* BAR 2 is the device memory the engine reads and writes: what the host stores through the
 * BAR a transfer reads, and what a fill op writes the BAR reads. */
static void test_bar_memory(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *queue = NULL;
	OK(udma_queue_create(dev, NULL, &queue));
	for (uint32_t i = 0; i < 64; i++)
		OK(udma_device_write32(dev, 2, 0x800 + 4 * i, 0xa5000000u | i));
	udma_buffer *buf = NULL;
	OK(udma_pool_alloc(pool, 256, &buf));
	udma_op to_host = {.size = sizeof to_host, .opcode = UDMA_OP_TO_HOST, .buffer = buf,
			   .device_offset = 0x800, .len = 256};
	OK(udma_queue_submit(queue, &to_host));
	udma_completion c = {.size = sizeof c};
	OK(udma_queue_wait(queue, 5 * SECOND, &c));
	CHECK(c.status == 0 && c.buffer == buf);
	uint32_t words[64];
	OK(udma_buffer_read(buf, 0, words, sizeof words));
	for (uint32_t i = 0; i < 64; i++)
		CHECK(words[i] == (0xa5000000u | i));

	udma_op fill = {.size = sizeof fill, .opcode = UDMA_OP_FILL, .device_offset = 0x2000,
			.len = 64, .arg0 = 0x3c};
	OK(udma_queue_submit(queue, &fill));
	OK(udma_queue_wait(queue, 5 * SECOND, &c));
	CHECK(c.status == 0);
	uint64_t q = 0;
	OK(udma_device_read64(dev, 2, 0x2038, &q));
	CHECK(q == 0x3c3c3c3c3c3c3c3cull);
	uint8_t after = 0xff;
	OK(udma_device_read8(dev, 2, 0x2040, &after));
	CHECK(after == 0);
	/* The last register of the BAR, at each width. */
	OK(udma_device_write64(dev, 2, (1 << 20) - 8, 0x0102030405060708ull));
	uint8_t last = 0;
	OK(udma_device_read8(dev, 2, (1 << 20) - 1, &last));
	CHECK(last == 0x01);

	OK(udma_pool_free(pool, buf));
	OK(udma_queue_destroy(queue));
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

static void test_bar_errors(void)
{
	udma_device *dev = loopback();
	uint8_t b;
	uint16_t h;
	uint32_t w = 7;
	uint64_t q;
	/* Past the end: at the end, straddling it, and an offset that overflows. */
	FAILS(udma_device_read32(dev, 0, REGISTER_BAR_LEN, &w), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 0 is 0x1000 bytes: a 32-bit access at offset 0x1000 runs past its "
	      "end (the last 4-byte register is at 0xffc)");
	CHECK(w == 7); /* nothing written on failure */
	FAILS(udma_device_read64(dev, 0, 0xffc, &q), UDMA_ERR_INVALID_ARGUMENT,
	      "a 64-bit access at offset 0xffc runs past its end");
	FAILS(udma_device_write8(dev, 0, UINT64_MAX, 1), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 0 is 0x1000 bytes: an 8-bit access at offset 0xffffffffffffffff");
	FAILS(udma_device_write64(dev, 2, 1 << 20, 1), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 2 is 0x100000 bytes");
	/* Misaligned, at each width that has an alignment. */
	FAILS(udma_device_read32(dev, 0, 0x2, &w), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 0 (0x1000 bytes): offset 0x2 is not a multiple of 4");
	FAILS(udma_device_read16(dev, 0, 0x3, &h), UDMA_ERR_INVALID_ARGUMENT,
	      "offset 0x3 is not a multiple of 2");
	FAILS(udma_device_write64(dev, 2, 0x104, 0), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 2 (0x100000 bytes): offset 0x104 is not a multiple of 8: a 64-bit "
	      "access must be aligned to its width");
	FAILS(udma_device_write32(dev, 0, 0x101, 0), UDMA_ERR_INVALID_ARGUMENT,
	      "offset 0x101 is not a multiple of 4");
	/* BARs the device does not have. */
	FAILS(udma_device_read32(dev, 1, 0, &w), UDMA_ERR_NOT_FOUND, "the device has no BAR 1");
	FAILS(udma_device_write32(dev, 6, 0, 0), UDMA_ERR_NOT_FOUND,
	      "loopback0 has no BAR 6: BARs are numbered 0 to 5");
	udma_bar_info bar = {.size = sizeof bar};
	FAILS(udma_device_get_bar(dev, 4, &bar), UDMA_ERR_NOT_FOUND, "no BAR 4");
	FAILS(udma_device_get_bar(dev, UINT32_MAX, &bar), UDMA_ERR_NOT_FOUND, "no BAR 4294967295");
	/* Out-parameters. */
	FAILS(udma_device_read8(dev, 0, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "value is NULL");
	FAILS(udma_device_read64(dev, 0, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "value is NULL");
	FAILS(udma_device_get_bar(dev, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "info is NULL");
	udma_bar_info zero = {.size = 0};
	FAILS(udma_device_get_bar(dev, 0, &zero), UDMA_ERR_INVALID_ARGUMENT,
	      "set it to sizeof(udma_bar_info)");
	/* Handles. */
	FAILS(udma_device_read32(NULL, 0, 0, &w), UDMA_ERR_INVALID_HANDLE, "device handle is NULL");
	FAILS(udma_device_write16(NULL, 0, 0, 0), UDMA_ERR_INVALID_HANDLE, "device handle is NULL");
	udma_pool *pool = pool_of(dev, 4 << 20);
	FAILS(udma_device_read8((const udma_device *)(const void *)pool, 0, 0, &b),
	      UDMA_ERR_INVALID_HANDLE, "is a pool handle, not a device handle");
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
	FAILS(udma_device_read32(dev, 0, 0, &w), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	FAILS(udma_device_get_bar(dev, 0, &bar), UDMA_ERR_INVALID_HANDLE, "destroyed already");
}

/* A removed device: a BAR the handle used reads all-ones (what PCIe returns for a device that
 * is gone) and keeps its bounds checks; writes, a BAR not used before and the BAR's info are
 * refused with UDMA_ERR_REMOVED. */
static void test_bar_removed(void)
{
	udma_device *dev = loopback();
	uint32_t w = 0;
	uint64_t q = 0;
	OK(udma_device_read32(dev, 0, REG_ID, &w));
	CHECK(w == LOOPBACK_ID);
	OK(udma_device_remove_loopback(dev));
	w = 0;
	OK(udma_device_read32(dev, 0, REG_ID, &w));
	CHECK(w == UINT32_MAX);
	OK(udma_device_read64(dev, 0, REG_MEMORY_SIZE, &q));
	CHECK(q == UINT64_MAX);
	uint8_t b = 0;
	OK(udma_device_read8(dev, 0, REG_VERSION, &b));
	CHECK(b == 0xff);
	FAILS(udma_device_read32(dev, 0, REGISTER_BAR_LEN, &w), UDMA_ERR_INVALID_ARGUMENT,
	      "runs past its end");
	FAILS(udma_device_write32(dev, 0, REG_IRQ_MASK_SET, 1), UDMA_ERR_REMOVED,
	      "loopback0 was removed: a write to BAR 0 at offset 0x2c reaches no device");
	FAILS(udma_device_read32(dev, 2, 0, &w), UDMA_ERR_REMOVED,
	      "loopback0 was removed: BAR 2 reaches no device");
	udma_bar_info bar = {.size = sizeof bar};
	FAILS(udma_device_get_bar(dev, 0, &bar), UDMA_ERR_REMOVED, "loopback0 was removed");
	OK(udma_device_close(dev));
}

/* ---- the loopback device's layer and compact ops ------------------------------------ */

/* userdma::device::loopback::reference::mix, written again from its definition. */
static uint32_t mix(uint32_t seed, uint64_t index, const uint32_t *words, size_t n)
{
	uint32_t h = seed ^ ((uint32_t)index * 0x9e3779b9u);
	for (size_t k = 0; k < n; k++) {
		h = (h ^ words[k]) * 0x85ebca6bu;
		h = (h << 13) | (h >> 19);
	}
	return h;
}

/* Writes `n` words to device memory at `at` through BAR 2. */
static void put_words(udma_device *dev, uint64_t at, const uint32_t *words, size_t n)
{
	for (size_t i = 0; i < n; i++)
		OK(udma_device_write32(dev, 2, at + 4 * i, words[i]));
}

static uint32_t get_word(udma_device *dev, uint64_t at)
{
	uint32_t w = 0;
	OK(udma_device_read32(dev, 2, at, &w));
	return w;
}

/* Submits `op` and waits for its completion. */
static udma_completion run_op(udma_queue *q, const udma_op *op)
{
	udma_completion c = {.size = sizeof c};
	OK(udma_queue_submit(q, op));
	OK(udma_queue_wait(q, 5 * SECOND, &c));
	return c;
}

static void test_layer(void)
{
	udma_device *dev = loopback();
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	/* Input 0: 16 words; input 1: 4 words (repeats); input 2: 1 word (a bias). */
	enum { IN0 = 0x0, IN1 = 0x100, IN2 = 0x200, OUT = 0x1000, OUT_WORDS = 32 };
	uint32_t in0[16], in1[4], in2[1] = {0xdeadbeefu};
	for (uint32_t i = 0; i < 16; i++)
		in0[i] = i * 2654435761u + 1;
	for (uint32_t i = 0; i < 4; i++)
		in1[i] = 0x01000000u * (i + 1) + i;
	put_words(dev, IN0, in0, 16);
	put_words(dev, IN1, in1, 4);
	put_words(dev, IN2, in2, 1);
	const uint32_t seed = 0xabcd1234u;

	for (size_t inputs = 1; inputs <= 3; inputs++) {
		udma_op op = {.size = sizeof op, .opcode = UDMA_OP_LAYER, .device_src = IN0,
			      .arg0 = sizeof in0, .device_offset = OUT, .len = 4 * OUT_WORDS,
			      .arg5 = seed};
		if (inputs >= 2) {
			op.arg1 = IN1;
			op.arg2 = sizeof in1;
		}
		if (inputs == 3) {
			op.arg3 = IN2;
			op.arg4 = sizeof in2;
		}
		udma_completion c = run_op(q, &op);
		CHECK(c.status == 0);
		uint64_t sum = 0;
		int wrong = 0;
		for (uint64_t j = 0; j < OUT_WORDS; j++) {
			uint32_t words[3] = {in0[j % 16], in1[j % 4], in2[0]};
			uint32_t want = mix(seed, j, words, inputs);
			sum += want;
			wrong += get_word(dev, OUT + 4 * j) != want;
		}
		CHECK(wrong == 0);
		CHECK(c.result == sum);
	}

	/* Shapes the format cannot say: refused at submit, nothing queued. */
	udma_op bad = {.size = sizeof bad, .opcode = UDMA_OP_LAYER, .device_src = IN0,
		       .arg0 = 0, .device_offset = OUT, .len = 64};
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "input 0 (device_src, arg0) has length 0: a layer needs input 0");
	bad.arg0 = 64;
	bad.arg1 = IN1;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "input 1 (arg1, arg2) has length 0 (absent) but offset 0x100");
	bad.arg1 = 0;
	bad.arg3 = IN2;
	bad.arg4 = 4;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "input 2 (arg3, arg4) is given without input 1");
	bad.arg3 = bad.arg4 = 0;
	bad.arg0 = 1ull << 32;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "layer input 0 is 4294967296 bytes: expected 1 to u32::MAX");
	bad.arg0 = 64;
	bad.arg5 = 1ull << 32;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "seed (arg5) 0x100000000 does not fit 32 bits");
	bad.arg5 = 0;
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 64, &b));
	bad.buffer = b;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT, "names no host memory");
	bad.buffer = NULL;
	udma_queue_info qi = {.size = sizeof qi};
	OK(udma_queue_get_info(q, &qi));
	CHECK(qi.submitted == 3);

	/* Shapes the device refuses: an error completion, nothing written. */
	udma_op dev_bad = {.size = sizeof dev_bad, .opcode = UDMA_OP_LAYER, .device_src = IN0 + 2,
			   .arg0 = 64, .device_offset = OUT, .len = 64};
	udma_completion c = run_op(q, &dev_bad);
	CHECK(strcmp(udma_op_status_name(c.status), "misaligned") == 0);
	dev_bad.device_src = IN0;
	dev_bad.device_offset = IN0 + 32;
	c = run_op(q, &dev_bad);
	CHECK(strcmp(udma_op_status_name(c.status), "overlap") == 0);
	dev_bad.device_offset = 1 << 20;
	c = run_op(q, &dev_bad);
	CHECK(strcmp(udma_op_status_name(c.status), "device-out-of-bounds") == 0);
	dev_bad.device_offset = OUT;
	dev_bad.len = 0;
	c = run_op(q, &dev_bad);
	CHECK(strcmp(udma_op_status_name(c.status), "bad-length") == 0);

	/* A program built before udma_op had arg2 to arg5: its 80-byte op still works. */
	udma_op old = {.size = offsetof(udma_op, arg2), .opcode = UDMA_OP_FILL,
		       .device_offset = OUT, .len = 4, .arg0 = 0x5a};
	CHECK(offsetof(udma_op, arg2) == 80);
	c = run_op(q, &old);
	CHECK(c.status == 0 && get_word(dev, OUT) == 0x5a5a5a5au);

	OK(udma_pool_free(pool, b));
	OK(udma_pool_destroy(pool));
	OK(udma_queue_destroy(q));
	OK(udma_device_close(dev));
}

enum { RECORD_WORDS = 4, RECORDS = 8, SCORE_WORD = 1 };

/* userdma::device::loopback::reference::compact, written again from its definition: the
 * output's words for `capacity` slots. Returns the survivors found. */
static uint64_t compact_ref(const uint32_t *records, uint32_t threshold, uint32_t capacity,
			    uint32_t *out)
{
	uint32_t written = 0, found = 0;
	memset(out, 0, (2 + (size_t)capacity * RECORD_WORDS) * 4);
	for (uint32_t r = 0; r < RECORDS; r++) {
		const uint32_t *rec = records + r * RECORD_WORDS;
		if (rec[SCORE_WORD] < threshold)
			continue;
		found++;
		if (written < capacity) {
			memcpy(out + 2 + written * RECORD_WORDS, rec, RECORD_WORDS * 4);
			written++;
		}
	}
	out[0] = written;
	out[1] = found;
	return found;
}

static void test_compact(void)
{
	udma_device *dev = loopback();
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	enum { SRC = 0x4000, DST = 0x5000 };
	const uint32_t scores[RECORDS] = {5, 50, 7, 90, 50, 1, 100, 49};
	uint32_t records[RECORDS * RECORD_WORDS];
	for (uint32_t r = 0; r < RECORDS; r++)
		for (uint32_t w = 0; w < RECORD_WORDS; w++)
			records[r * RECORD_WORDS + w] = w == SCORE_WORD ? scores[r] : r * 100 + w;
	put_words(dev, SRC, records, RECORDS * RECORD_WORDS);

	/* Fewer slots than survivors, then more (the leftover slots are zeroed). */
	const uint32_t capacities[] = {3, 6};
	for (size_t k = 0; k < 2; k++) {
		uint32_t cap = capacities[k];
		udma_op fill = {.size = sizeof fill, .opcode = UDMA_OP_FILL, .device_offset = DST,
				.len = 0x400, .arg0 = 0xff};
		CHECK(run_op(q, &fill).status == 0);
		udma_op op = {.size = sizeof op, .opcode = UDMA_OP_COMPACT, .device_src = SRC,
			      .len = sizeof records, .arg0 = RECORD_WORDS * 4,
			      .arg1 = SCORE_WORD * 4, .arg2 = 50, .arg3 = cap,
			      .device_offset = DST};
		udma_completion c = run_op(q, &op);
		CHECK(c.status == 0);
		uint32_t want[2 + 6 * RECORD_WORDS];
		uint64_t found = compact_ref(records, 50, cap, want);
		CHECK(found == 4 && c.result == found);
		int wrong = 0;
		for (size_t i = 0; i < 2 + (size_t)cap * RECORD_WORDS; i++)
			wrong += get_word(dev, DST + 4 * i) != want[i];
		CHECK(wrong == 0);
		/* Nothing past the output. */
		CHECK(get_word(dev, DST + 4 * (2 + (uint64_t)cap * RECORD_WORDS)) == 0xffffffffu);
	}

	/* Arguments that do not fit their 32 bits: refused at submit. */
	udma_op bad = {.size = sizeof bad, .opcode = UDMA_OP_COMPACT, .device_src = SRC,
		       .len = sizeof records, .arg0 = 16, .arg1 = 4, .arg2 = 50, .arg3 = 2,
		       .device_offset = DST};
	bad.arg0 = 1ull << 32;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "record size (arg0) 0x100000000 does not fit 32 bits");
	bad.arg0 = 16;
	bad.arg1 = UINT64_MAX;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "score offset (arg1) 0xffffffffffffffff does not fit 32 bits");
	bad.arg1 = 4;
	bad.arg2 = 1ull << 40;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "threshold (arg2) 0x10000000000 does not fit 32 bits");
	bad.arg2 = 50;
	bad.arg3 = 1ull << 33;
	FAILS(udma_queue_submit(q, &bad), UDMA_ERR_INVALID_ARGUMENT,
	      "capacity (arg3) 0x200000000 does not fit 32 bits");
	bad.arg3 = 2;

	/* Shapes the device refuses: an error completion. */
	struct {
		uint64_t record, score_at, len, src, dst;
		const char *status;
	} refused[] = {
		{8192, 4, 8192, SRC, DST, "bad-args"},             /* a record over 4096 bytes */
		{16, 16, sizeof records, SRC, DST, "bad-args"},    /* the score outside the record */
		{16, 4, 24, SRC, DST, "bad-length"},               /* not whole records */
		{16, 4, sizeof records, SRC + 2, DST, "misaligned"},
		{16, 4, sizeof records, SRC, SRC + 16, "overlap"}, /* the output over the input */
		{16, 4, sizeof records, SRC, 1 << 20, "device-out-of-bounds"},
	};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		udma_op op = bad;
		op.arg0 = refused[i].record;
		op.arg1 = refused[i].score_at;
		op.len = refused[i].len;
		op.device_src = refused[i].src;
		op.device_offset = refused[i].dst;
		udma_completion c = run_op(q, &op);
		if (strcmp(udma_op_status_name(c.status), refused[i].status) != 0) {
			fprintf(stderr, "compact refused[%zu]: status %s, want %s\n", i,
				udma_op_status_name(c.status), refused[i].status);
			check_failures++;
		}
	}
	OK(udma_queue_destroy(q));
	OK(udma_device_close(dev));
}

/* ---- device-memory ranges ---------------------------------------------------------- */

static udma_device_memory_info memory_info(const udma_device *dev, uint32_t bar)
{
	udma_device_memory_info info = {.size = sizeof info};
	OK(udma_device_memory_get_info(dev, bar, &info));
	return info;
}

static void test_device_memory(void)
{
	udma_device *dev = loopback();
	udma_device_memory_info info = memory_info(dev, 2);
	CHECK(info.bytes == 1 << 20 && info.free == 1 << 20 && info.largest_free == 1 << 20);
	CHECK(info.ranges == 0);

	udma_range a = {.size = sizeof a}, b = {.size = sizeof b}, fixed = {.size = sizeof fixed};
	OK(udma_device_memory_alloc(dev, 2, 4096, 256, &a));
	CHECK(a.id != 0 && a.bar == 2 && a.offset == 0 && a.len == 4096);
	OK(udma_device_memory_alloc(dev, 2, 100, 4096, &b));
	CHECK(b.offset == 4096 && b.len == 100 && b.id != a.id);
	OK(udma_device_memory_alloc_at(dev, 2, 0x80000, 0x1000, &fixed));
	CHECK(fixed.offset == 0x80000 && fixed.len == 0x1000);
	udma_range none = {.size = sizeof none};
	OK(udma_device_memory_alloc(dev, 2, 64, 0, &none)); /* alignment 0: any */
	CHECK(none.offset == 4096 + 100);
	OK(udma_device_memory_free(dev, &none));
	info = memory_info(dev, 2);
	CHECK(info.free == (1 << 20) - 4096 - 100 - 0x1000 && info.ranges == 3);
	CHECK(info.largest_free == (1 << 20) - 0x81000);

	/* A range is where ops and BAR accesses go. */
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	udma_op fill = {.size = sizeof fill, .opcode = UDMA_OP_FILL, .device_offset = fixed.offset,
			.len = fixed.len, .arg0 = 0x77};
	CHECK(run_op(q, &fill).status == 0);
	CHECK(get_word(dev, fixed.offset + fixed.len - 4) == 0x77777777u);
	OK(udma_queue_destroy(q));

	/* Requests that can never be met, and one that cannot be met now. */
	udma_range r = {.size = sizeof r};
	FAILS(udma_device_memory_alloc(dev, 2, 0, 1, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 2: device memory range 0x0+0x0 (alignment 1) cannot be allocated: "
	      "the length is zero");
	FAILS(udma_device_memory_alloc(dev, 2, 64, 3, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "the alignment is not a power of two");
	FAILS(udma_device_memory_alloc(dev, 2, 2 << 20, 1, &r), UDMA_ERR_EXHAUSTED,
	      "no free range of device memory holds 2097152 bytes aligned to 1");
	FAILS(udma_device_memory_alloc_at(dev, 2, 0x80800, 0x1000, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "part of it is in use");
	FAILS(udma_device_memory_alloc_at(dev, 2, (1 << 20) - 8, 16, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "it ends past the device memory");
	FAILS(udma_device_memory_alloc_at(dev, 2, UINT64_MAX, 2, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "it ends past the device memory");
	FAILS(udma_device_memory_alloc_at(dev, 2, 0x90000, 0, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "the length is zero");
	FAILS(udma_device_memory_alloc(dev, 1, 64, 1, &r), UDMA_ERR_NOT_FOUND,
	      "the device has no BAR 1");
	/* The register BAR is not memory: a range there would overlap BAR 2's. */
	FAILS(udma_device_memory_alloc(dev, 0, 64, 1, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 0 holds the device's registers, not memory: allocate from BAR 2");
	FAILS(udma_device_memory_alloc_at(dev, 0, 0, 64, &r), UDMA_ERR_INVALID_ARGUMENT,
	      "BAR 0 holds the device's registers");
	FAILS(udma_device_memory_alloc(dev, 9, 64, 1, &r), UDMA_ERR_NOT_FOUND,
	      "loopback0 has no BAR 9: BARs are numbered 0 to 5");
	FAILS(udma_device_memory_get_info(dev, 9, &info), UDMA_ERR_NOT_FOUND, "no BAR 9");
	FAILS(udma_device_memory_alloc(dev, 2, 64, 1, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "range is NULL");
	udma_range unsized = {.size = 0};
	FAILS(udma_device_memory_alloc(dev, 2, 64, 1, &unsized), UDMA_ERR_INVALID_ARGUMENT,
	      "set it to sizeof(udma_range)");
	FAILS(udma_device_memory_get_info(dev, 2, NULL), UDMA_ERR_INVALID_ARGUMENT, "info is NULL");
	FAILS(udma_device_memory_alloc(NULL, 2, 64, 1, &r), UDMA_ERR_INVALID_HANDLE,
	      "device handle is NULL");
	CHECK(memory_info(dev, 2).ranges == 3); /* none of those took anything */

	/* Freed twice, changed, never allocated, of another device: refused, nothing freed. */
	OK(udma_device_memory_free(dev, &a));
	FAILS(udma_device_memory_free(dev, &a), UDMA_ERR_INVALID_ARGUMENT,
	      "is not allocated on loopback0: it was freed already, or allocated on another device");
	udma_range changed = b;
	changed.len = 4096;
	FAILS(udma_device_memory_free(dev, &changed), UDMA_ERR_INVALID_ARGUMENT,
	      "but the struct passed says BAR 2 0x1000+0x1000: pass the udma_range the allocation "
	      "filled in, unchanged");
	changed = b;
	changed.bar = 0;
	FAILS(udma_device_memory_free(dev, &changed), UDMA_ERR_INVALID_ARGUMENT,
	      "the struct passed says BAR 0");
	udma_range made_up = {.size = sizeof made_up, .id = 0, .bar = 2, .offset = 0, .len = 4096};
	FAILS(udma_device_memory_free(dev, &made_up), UDMA_ERR_INVALID_ARGUMENT, "not allocated");
	udma_device *other = loopback();
	udma_range theirs = {.size = sizeof theirs};
	OK(udma_device_memory_alloc(other, 2, 4096, 1, &theirs));
	FAILS(udma_device_memory_free(dev, &theirs), UDMA_ERR_INVALID_ARGUMENT,
	      "or allocated on another device");
	CHECK(memory_info(other, 2).ranges == 1);
	FAILS(udma_device_memory_free(dev, NULL), UDMA_ERR_INVALID_ARGUMENT, "range is NULL");
	CHECK(memory_info(dev, 2).ranges == 2);

	/* The loopback's register BAR is not memory: its ranges would be device addresses that
	 * mean BAR 2's memory, overlapping the ranges allocated there. */
	udma_range reg = {.size = sizeof reg};
	FAILS(udma_device_memory_alloc(dev, 0, 0x1000, 1, &reg), UDMA_ERR_INVALID_ARGUMENT,
	      "loopback0 BAR 0 holds the device's registers, not memory: allocate from BAR 2");
	FAILS(udma_device_memory_get_info(dev, 0, &info), UDMA_ERR_INVALID_ARGUMENT,
	      "BAR 0 holds the device's registers");
	CHECK(memory_info(dev, 2).ranges == 2);

	/* Every range back: one free range again, the neighbours merged. */
	OK(udma_device_memory_free(dev, &b));
	OK(udma_device_memory_free(dev, &fixed));
	info = memory_info(dev, 2);
	CHECK(info.free == 1 << 20 && info.largest_free == 1 << 20 && info.ranges == 0);

	/* After a removal nothing new is allocated; what is out can still be freed. */
	udma_range kept = {.size = sizeof kept};
	OK(udma_device_memory_alloc(dev, 2, 512, 1, &kept));
	OK(udma_device_remove_loopback(dev));
	FAILS(udma_device_memory_alloc(dev, 2, 512, 1, &r), UDMA_ERR_REMOVED, "loopback0 was removed");
	OK(udma_device_memory_free(dev, &kept));
	CHECK(memory_info(dev, 2).free == 1 << 20);

	/* A range left out when its device closes goes with it (Valgrind sees no leak). */
	OK(udma_device_close(other));
	OK(udma_device_close(dev));
}

/* Memory the program owns, mapped into the device's DMA space (udma_memory_map_user): its
 * addresses reported as given, refusals with what to do, and the memory left mapped, with its
 * bytes, once the mapping is destroyed. */
static void test_memory_the_caller_owns(void)
{
	udma_device *dev = loopback();
	const size_t page = 4096, len = 2 * page;
	unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	memset(p, 0x5a, len);
	udma_mapping *m = NULL;
	OK(udma_memory_map_user(dev, p, len, UDMA_PAGE_BASE, &m));
	udma_mapping_info info = {.size = sizeof info};
	OK(udma_mapping_get_info(m, &info));
	CHECK(info.host == p && info.len == len && info.iova != 0 && info.contiguous == len);
	uint64_t iova = 0;
	OK(udma_mapping_iova(m, page + 8, &iova, NULL));
	CHECK(iova == info.iova + page + 8);
	OK(udma_mapping_destroy(m));
	CHECK(p[0] == 0x5a && p[len - 1] == 0x5a); /* still the program's, as it was */

	FAILS(udma_memory_map_user(dev, p + 64, page, UDMA_PAGE_BASE, &m), UDMA_ERR_INVALID_ARGUMENT,
	      "does not start on a");
	FAILS(udma_memory_map_user(dev, p, page + 1, UDMA_PAGE_BASE, &m), UDMA_ERR_INVALID_ARGUMENT,
	      "multiple");
	FAILS(udma_memory_map_user(dev, NULL, page, UDMA_PAGE_BASE, &m), UDMA_ERR_INVALID_ARGUMENT,
	      "addr is NULL");
	CHECK(mprotect(p, len, PROT_READ) == 0);
	FAILS(udma_memory_map_user(dev, p, len, UDMA_PAGE_BASE, &m), UDMA_ERR_REFUSED, "writable");
	CHECK(munmap(p + page, page) == 0);
	FAILS(udma_memory_map_user(dev, p, len, UDMA_PAGE_BASE, &m), UDMA_ERR_INVALID_ARGUMENT,
	      "not all mapped");
	CHECK(munmap(p, page) == 0);
	OK(udma_device_close(dev));
}

int main(void)
{
	static const struct check_test tests[] = {
		{"memory_the_caller_owns", test_memory_the_caller_owns},
		{"bar_registers", test_bar_registers},
		{"bar_memory", test_bar_memory},
		{"bar_errors", test_bar_errors},
		{"bar_removed", test_bar_removed},
		{"layer", test_layer},
		{"compact", test_compact},
		{"device_memory", test_device_memory},
	};
	return check_run(tests, sizeof tests / sizeof tests[0]);
}
