/* The C API's device-level tests, against the loopback device: BAR access (its BAR 0
 * registers and BAR 2 memory); each success checked for its result and each error path for
 * its status and its message. Built and run as capi_test.c is (scripts/capi-test.sh). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

static const uint64_t SECOND = 1000000000ull;

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

static udma_device *loopback(void)
{
	udma_loopback_options o = {.size = sizeof o, .cost_model = UDMA_COST_ZERO,
				   .memory_bytes = 1 << 20, .queues = 4};
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(&o, &dev));
	return dev;
}

static udma_pool *pool_of(udma_device *dev, uint64_t bytes)
{
	udma_pool_options o = {.size = sizeof o, .bytes = bytes};
	udma_pool *pool = NULL;
	OK(udma_pool_create(dev, &o, &pool));
	return pool;
}

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
	CHECK(w == 1);
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

int main(void)
{
	struct {
		const char *name;
		void (*run)(void);
	} tests[] = {
		{"bar_registers", test_bar_registers},
		{"bar_memory", test_bar_memory},
		{"bar_errors", test_bar_errors},
		{"bar_removed", test_bar_removed},
	};
	int passed = 0, failed = 0;
	for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
		int before = check_failures;
		tests[i].run();
		if (check_failures == before) {
			passed++;
			printf("ok %s\n", tests[i].name);
		} else {
			failed++;
			printf("FAILED %s\n", tests[i].name);
		}
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
