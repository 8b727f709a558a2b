/* The C API's tests, against the loopback device: every call's success path and every error
 * path the header documents, each error checked for its status and its message. Built with
 * -std=c11 -Wall -Wextra -Wpedantic -Werror; run under ASan+UBSan and under Valgrind
 * (scripts/capi-test.sh). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/kcmp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "check.h"


static udma_buffer_info info_of(const udma_buffer *b)
{
	udma_buffer_info info = {.size = sizeof info};
	OK(udma_buffer_get_info(b, &info));
	return info;
}

/* ---- versions, statuses ------------------------------------------------------------- */

static void test_version(void)
{
	CHECK(udma_version() == UDMA_VERSION);
	CHECK(UDMA_VERSION == ((UDMA_VERSION_MAJOR << 16) | (UDMA_VERSION_MINOR << 8) |
			       UDMA_VERSION_PATCH));
	char text[32];
	snprintf(text, sizeof text, "%d.%d.%d", UDMA_VERSION_MAJOR, UDMA_VERSION_MINOR,
		 UDMA_VERSION_PATCH);
	CHECK(strcmp(udma_version_string(), text) == 0);
	CHECK(strcmp(udma_status_name(UDMA_OK), "UDMA_OK") == 0);
	CHECK(strcmp(udma_status_name(UDMA_ERR_INTERNAL), "UDMA_ERR_INTERNAL") == 0);
	CHECK(strcmp(udma_status_name(12345), "UDMA_ERR_UNKNOWN") == 0);
	CHECK(strcmp(udma_op_status_name(9), "host-unmapped") == 0);
	CHECK(strcmp(udma_op_status_name(999), "unknown") == 0);
	CHECK(UDMA_ERR_INVALID_ARGUMENT == 1 && UDMA_ERR_SYSTEM == 9);
}

/* ---- devices ------------------------------------------------------------------------ */

static void test_device_loopback(void)
{
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(NULL, &dev)); /* the defaults: the NPU cost model */
	udma_device_info info = {.size = sizeof info};
	OK(udma_device_get_info(dev, &info));
	CHECK(info.kind == UDMA_DEVICE_LOOPBACK);
	CHECK(info.vectors == 4);
	CHECK(info.memory_bytes == 64u << 20);
	CHECK(info.numa_node == -1);
	CHECK(strcmp(info.name, "loopback0") == 0);
	OK(udma_device_close(dev));
	FAILS(udma_device_close(dev), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	FAILS(udma_device_get_info(dev, &info), UDMA_ERR_INVALID_HANDLE, "destroyed already");

	udma_loopback_options o = {.size = sizeof o, .cost_model = UDMA_COST_ZERO, .queues = 2,
				   .memory_bytes = 1 << 20};
	OK(udma_device_open_loopback(&o, &dev));
	OK(udma_device_get_info(dev, &info));
	CHECK(info.vectors == 2 && info.memory_bytes == 1 << 20);
	int fd = -1;
	OK(udma_device_interrupt_fd(dev, 1, &fd));
	CHECK(fd >= 0);
	if (fd >= 0)
		close(fd);
	FAILS(udma_device_interrupt_fd(dev, 7, &fd), UDMA_ERR_NOT_FOUND, "loopback0");
	FAILS(udma_device_interrupt_fd(dev, 0, NULL), UDMA_ERR_INVALID_ARGUMENT, "fd is NULL");
	OK(udma_device_close(dev));
}

static void test_device_options(void)
{
	udma_device *dev = NULL;
	FAILS(udma_device_open_loopback(NULL, NULL), UDMA_ERR_INVALID_ARGUMENT, "device is NULL");
	udma_loopback_options o = {.size = 0};
	FAILS(udma_device_open_loopback(&o, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "set it to sizeof(udma_loopback_options)");
	o = (udma_loopback_options){.size = sizeof o, .cost_model = 7};
	FAILS(udma_device_open_loopback(&o, &dev), UDMA_ERR_INVALID_ARGUMENT, "cost_model 7");
	o = (udma_loopback_options){.size = sizeof o, .queues = 1000};
	FAILS(udma_device_open_loopback(&o, &dev), UDMA_ERR_INVALID_ARGUMENT, "1000");
	o = (udma_loopback_options){.size = sizeof o, .flags = 0x80};
	FAILS(udma_device_open_loopback(&o, &dev), UDMA_ERR_INVALID_ARGUMENT, "flags 0x80");

	/* A program built against an older, smaller struct: only `size` and `memory_bytes`. */
	struct {
		size_t size;
		uint64_t memory_bytes;
	} old = {sizeof old, 2 << 20};
	OK(udma_device_open_loopback((const udma_loopback_options *)(const void *)&old, &dev));
	udma_device_info info = {.size = sizeof info};
	OK(udma_device_get_info(dev, &info));
	CHECK(info.memory_bytes == 2 << 20 && info.vectors == 4);
	/* An older, smaller info struct gets its prefix only. */
	struct {
		size_t size;
		uint64_t memory_bytes;
		uint32_t kind;
		uint32_t sentinel;
	} small = {offsetof(udma_device_info, vectors), 0, 99, 0xabcdu};
	OK(udma_device_get_info(dev, (udma_device_info *)(void *)&small));
	CHECK(small.memory_bytes == 2 << 20 && small.kind == UDMA_DEVICE_LOOPBACK);
	CHECK(small.sentinel == 0xabcdu);
	OK(udma_device_close(dev));

	/* A newer, larger struct: unknown bytes at zero are fine, set ones are refused. */
	struct {
		udma_loopback_options current;
		uint64_t newer;
	} big = {{.size = sizeof big, .cost_model = UDMA_COST_ZERO}, 0};
	OK(udma_device_open_loopback(&big.current, &dev));
	OK(udma_device_close(dev));
	big.newer = 1;
	FAILS(udma_device_open_loopback(&big.current, &dev), UDMA_ERR_UNSUPPORTED,
	      "knows its first 40 bytes only");
}

static void test_device_pci(void)
{
	udma_device *dev = NULL;
	FAILS(udma_device_open_pci(NULL, NULL, &dev), UDMA_ERR_INVALID_ARGUMENT, "bdf is NULL");
	FAILS(udma_device_open_pci("not-a-bdf", NULL, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "is not a PCI address");
	/* No such function on any machine (bus 0xff, device 0x1f, function 7 of domain 0xfffe). */
	FAILS(udma_device_open_pci("fffe:ff:1f.7", NULL, &dev), UDMA_ERR_NOT_FOUND, "fffe:ff:1f.7");
	udma_pci_options o = {.size = sizeof o, .backend = 9};
	FAILS(udma_device_open_pci("fffe:ff:1f.7", &o, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "backend 9");
	o = (udma_pci_options){.size = sizeof o, .backend = UDMA_PCI_UIO,
			       .flags = UDMA_PCI_ALLOW_NOIOMMU};
	FAILS(udma_device_open_pci("fffe:ff:1f.7", &o, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "UIO takes no flags");
	o = (udma_pci_options){.size = sizeof o, .flags = 0x40};
	FAILS(udma_device_open_pci("fffe:ff:1f.7", &o, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "flags 0x40");
	o = (udma_pci_options){.size = sizeof o, .backend = UDMA_PCI_VFIO, .irq_kind = 8};
	FAILS(udma_device_open_pci("fffe:ff:1f.7", &o, &dev), UDMA_ERR_INVALID_ARGUMENT,
	      "irq_kind 8");
}

static void test_handles(void)
{
	udma_device_info info = {.size = sizeof info};
	FAILS(udma_device_get_info(NULL, &info), UDMA_ERR_INVALID_HANDLE, "device handle is NULL");
	int local = 0;
	const udma_device *foreign = (const udma_device *)(const void *)&local;
	FAILS(udma_device_get_info(foreign, &info), UDMA_ERR_INVALID_HANDLE,
	      "not a device handle made by this library");
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	/* A handle of one kind passed as another. */
	FAILS(udma_device_get_info((const udma_device *)(const void *)pool, &info),
	      UDMA_ERR_INVALID_HANDLE, "is a pool handle, not a device handle");
	FAILS(udma_device_get_info(dev, NULL), UDMA_ERR_INVALID_ARGUMENT, "info is NULL");
	/* Closing the device first is fine: the pool keeps what it needs. */
	OK(udma_device_close(dev));
	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 100, &b));
	OK(udma_pool_free(pool, b));
	OK(udma_pool_destroy(pool));
	FAILS(udma_pool_destroy(pool), UDMA_ERR_INVALID_HANDLE, "pool handle");
}

/* ---- memory ------------------------------------------------------------------------- */

static void test_mapping(void)
{
	udma_device *dev = loopback();
	udma_mapping *m = NULL;
	OK(udma_memory_map(dev, 60000, UDMA_PAGE_BASE, &m));
	udma_mapping_info info = {.size = sizeof info};
	OK(udma_mapping_get_info(m, &info));
	CHECK(info.len == 61440); /* whole 4 KiB pages */
	CHECK(info.host != NULL && info.contiguous >= 4096 && info.contiguous <= info.len);
	memset(info.host, 0x5a, (size_t)info.len);
	uint64_t iova = 0, contiguous = 0;
	OK(udma_mapping_iova(m, 4096, &iova, &contiguous));
	CHECK(contiguous >= 1 && contiguous <= info.len - 4096);
	OK(udma_mapping_iova(m, 0, &iova, NULL));
	CHECK(iova == info.iova);
	FAILS(udma_mapping_iova(m, info.len, &iova, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "past the end of the 61440-byte mapping on loopback0");
	FAILS(udma_memory_map(dev, 0, UDMA_PAGE_BASE, &m), UDMA_ERR_INVALID_ARGUMENT, "bytes is 0");
	FAILS(udma_memory_map(dev, 4096, 7, &m), UDMA_ERR_INVALID_ARGUMENT, "page size 7");
	OK(udma_mapping_destroy(m));
	FAILS(udma_mapping_destroy(m), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	/* Hugepages: mapped if the machine has them reserved, otherwise a message saying so. */
	enum udma_status s = udma_memory_map(dev, 2 << 20, UDMA_PAGE_2M, &m);
	if (s == UDMA_OK) {
		OK(udma_mapping_get_info(m, &info));
		CHECK(info.len == 2 << 20 && info.contiguous == info.len);
		OK(udma_mapping_destroy(m));
	} else {
		CHECK(s == UDMA_ERR_EXHAUSTED || s == UDMA_ERR_REFUSED || s == UDMA_ERR_SYSTEM);
		CHECK(strstr(udma_last_error(), "udma_memory_map: loopback0") != NULL);
	}
	OK(udma_device_close(dev));
}

static void test_pool(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 4000, &b));
	udma_buffer_info info = info_of(b);
	CHECK(info.len == 4000 && info.capacity == 4096 && info.state == UDMA_BUFFER_HOST);
	CHECK(info.host != NULL && info.iova % 256 == 0);
	/* Through the host address (zero-copy) and through the library. */
	memset(info.host, 0xab, 4000);
	const char text[] = "through the library";
	OK(udma_buffer_write(b, 100, text, sizeof text));
	char back[sizeof text];
	OK(udma_buffer_read(b, 100, back, sizeof back));
	CHECK(memcmp(back, text, sizeof text) == 0);
	CHECK(((unsigned char *)info.host)[99] == 0xab);
	FAILS(udma_buffer_write(b, 3990, text, sizeof text), UDMA_ERR_INVALID_ARGUMENT,
	      "run past the buffer's 4000 bytes");
	FAILS(udma_buffer_read(b, UINT64_MAX, back, 2), UDMA_ERR_INVALID_ARGUMENT, "run past");
	FAILS(udma_buffer_read(b, 0, NULL, 2), UDMA_ERR_INVALID_ARGUMENT, "dst is NULL");

	/* Sizes out of range. */
	udma_buffer *none = NULL;
	FAILS(udma_pool_alloc(pool, 0, &none), UDMA_ERR_INVALID_ARGUMENT, "len 0 is out of range");
	FAILS(udma_pool_alloc(pool, 1ull << 40, &none), UDMA_ERR_INVALID_ARGUMENT,
	      "ask for 1 to");
	FAILS(udma_pool_alloc(pool, 64, NULL), UDMA_ERR_INVALID_ARGUMENT, "buffer is NULL");
	CHECK(none == NULL);

	/* Freed twice; freed into another pool. */
	udma_pool *other = pool_of(dev, 4 << 20);
	FAILS(udma_pool_free(other, b), UDMA_ERR_INVALID_ARGUMENT, "belongs to another pool");
	FAILS(udma_pool_destroy(pool), UDMA_ERR_BUSY, "has 1 buffers out");
	OK(udma_pool_free(pool, b));
	FAILS(udma_pool_free(pool, b), UDMA_ERR_INVALID_HANDLE, "freed already");
	FAILS(udma_buffer_get_info(b, &info), UDMA_ERR_INVALID_HANDLE, "freed already");
	FAILS(udma_pool_free(pool, NULL), UDMA_ERR_INVALID_HANDLE, "buffer handle is NULL");

	/* Bulk: all or nothing. */
	udma_buffer *many[16] = {0};
	OK(udma_pool_alloc_bulk(pool, 1024, 16, many));
	for (int i = 0; i < 16; i++) {
		CHECK(many[i] != NULL);
		for (int j = 0; j < i; j++)
			CHECK(info_of(many[i]).iova != info_of(many[j]).iova);
	}
	udma_buffer *twice[3] = {many[0], many[1], many[0]};
	FAILS(udma_pool_free_bulk(pool, twice, 3), UDMA_ERR_INVALID_ARGUMENT,
	      "buffers[2]: buffer");
	CHECK(strstr(udma_last_error(), "listed twice") != NULL);
	CHECK(info_of(many[0]).state == UDMA_BUFFER_HOST); /* nothing was freed */
	udma_pool_stats stats = {.size = sizeof stats};
	OK(udma_pool_get_stats(pool, &stats));
	CHECK(stats.handles == 16 && stats.in_use == 16);
	CHECK(stats.allocs == 17 && stats.frees == 1);
	CHECK(stats.arena_bytes > 0 && stats.max_len >= stats.chunk_bytes);
	OK(udma_pool_free_bulk(pool, many, 16));
	FAILS(udma_pool_free_bulk(pool, many, 1), UDMA_ERR_INVALID_HANDLE, "buffers[0]");
	FAILS(udma_pool_alloc_bulk(pool, 0, 4, many), UDMA_ERR_INVALID_ARGUMENT, "buffer 0 of 4");
	OK(udma_pool_get_stats(pool, &stats));
	CHECK(stats.handles == 0 && stats.in_use == 0);

	/* Exhaustion: a small pool runs out, with a message; the batch that failed took nothing. */
	udma_buffer *big[128] = {0};
	FAILS(udma_pool_alloc_bulk(other, 64 << 10, 128, big), UDMA_ERR_EXHAUSTED, "");
	CHECK(big[0] == NULL);
	OK(udma_pool_get_stats(other, &stats));
	CHECK(stats.handles == 0);
	FAILS(udma_pool_create(dev, NULL, &other), UDMA_ERR_INVALID_ARGUMENT, "options is NULL");
	udma_pool_options zero = {.size = sizeof zero};
	FAILS(udma_pool_create(dev, &zero, &other), UDMA_ERR_INVALID_ARGUMENT,
	      "options->bytes is 0");
	udma_pool_options bad_flags = {.size = sizeof bad_flags, .bytes = 4 << 20, .flags = 6};
	FAILS(udma_pool_create(dev, &bad_flags, &other), UDMA_ERR_INVALID_ARGUMENT,
	      "not UDMA_POOL_* flags");
	OK(udma_pool_destroy(other));

	/* Cache colouring: 4 KiB buffers 256-byte aligned, whole and disjoint, at 15 offsets
	 * within a page (a 64 KiB chunk of base pages holds 15 of them 4352 bytes apart); 2 KiB
	 * ones still aligned to their size. */
	udma_pool_options coloured_o = {.size = sizeof coloured_o, .bytes = 4 << 20,
					.flags = UDMA_POOL_COLOURED};
	udma_pool *coloured = NULL;
	OK(udma_pool_create(dev, &coloured_o, &coloured));
	enum { COLOURED = 32 };
	udma_buffer *col[COLOURED] = {0};
	OK(udma_pool_alloc_bulk(coloured, 4096, COLOURED, col));
	unsigned offsets = 0; /* bit k: a buffer starts k * 256 bytes into a page */
	for (int i = 0; i < COLOURED; i++) {
		udma_buffer_info bi = info_of(col[i]);
		CHECK(bi.capacity == 4096 && bi.iova % 256 == 0);
		offsets |= 1u << ((bi.iova % 4096) / 256);
		memset(bi.host, i, 4096);
	}
	CHECK(offsets == 0x7fff);
	bool intact = true;
	for (int i = 0; i < COLOURED; i++) {
		const unsigned char *p = info_of(col[i]).host;
		for (size_t k = 0; k < 4096; k++)
			intact = intact && p[k] == (unsigned char)i;
	}
	CHECK(intact);
	OK(udma_pool_free_bulk(coloured, col, COLOURED));
	udma_buffer *half = NULL;
	OK(udma_pool_alloc(coloured, 2048, &half));
	CHECK(info_of(half).iova % 2048 == 0);
	OK(udma_pool_free(coloured, half));
	OK(udma_pool_destroy(coloured));

	/* No flag: the layout the device's alignment calls for. The loopback NPU takes 256-byte
	 * aligned buffers, so its pools are coloured (4 KiB buffers at several page offsets);
	 * UDMA_POOL_PAGE_ALIGNED asks for page-aligned ones on it; both flags at once are refused. */
	udma_pool_options layouts[2] = {{.size = sizeof layouts[0], .bytes = 4 << 20},
					{.size = sizeof layouts[1], .bytes = 4 << 20,
					 .flags = UDMA_POOL_PAGE_ALIGNED}};
	for (int l = 0; l < 2; l++) {
		udma_pool *p = NULL;
		OK(udma_pool_create(dev, &layouts[l], &p));
		udma_buffer *b[COLOURED] = {0};
		OK(udma_pool_alloc_bulk(p, 4096, COLOURED, b));
		unsigned seen = 0;
		for (int i = 0; i < COLOURED; i++) {
			uint64_t iova = info_of(b[i]).iova;
			CHECK(iova % 256 == 0);
			seen |= 1u << ((iova % 4096) / 256);
		}
		CHECK(l == 0 ? seen == 0x7fff : seen == 1);
		OK(udma_pool_free_bulk(p, b, COLOURED));
		OK(udma_pool_destroy(p));
	}
	udma_pool_options both = {.size = sizeof both, .bytes = 4 << 20,
				  .flags = UDMA_POOL_COLOURED | UDMA_POOL_PAGE_ALIGNED};
	FAILS(udma_pool_create(dev, &both, &other), UDMA_ERR_INVALID_ARGUMENT, "pick one");
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

/* ---- transfers ---------------------------------------------------------------------- */

static void fill_pattern(udma_buffer *b, size_t len, unsigned seed)
{
	unsigned char *p = info_of(b).host;
	for (size_t i = 0; i < len; i++)
		p[i] = (unsigned char)(i * 31u + seed);
}

static void test_round_trip(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	enum { LEN = 65536 };
	udma_buffer *out = NULL, *in = NULL;
	OK(udma_pool_alloc(pool, LEN, &out));
	OK(udma_pool_alloc(pool, LEN, &in));
	fill_pattern(out, LEN, 7);
	memset(info_of(in).host, 0, LEN);

	udma_op h2d = {.size = sizeof h2d, .opcode = UDMA_OP_TO_DEVICE, .buffer = out,
		       .device_offset = 4096, .len = LEN, .user_data = 11};
	OK(udma_queue_submit(q, &h2d));
	/* The device owns it now: not freed, read, written or submitted again. */
	CHECK(info_of(out).state == UDMA_BUFFER_IN_QUEUE);
	FAILS(udma_pool_free(pool, out), UDMA_ERR_BUSY, "loopback0 queue 0, which the device owns");
	char byte;
	FAILS(udma_buffer_read(out, 0, &byte, 1), UDMA_ERR_BUSY, "the device owns it");
	FAILS(udma_queue_submit(q, &h2d), UDMA_ERR_BUSY, "is in loopback0 queue 0 already");
	udma_buffer *pair[2] = {in, out};
	FAILS(udma_pool_free_bulk(pool, pair, 2), UDMA_ERR_BUSY, "buffers[1]");
	CHECK(info_of(in).state == UDMA_BUFFER_HOST);

	udma_completion c = {.size = sizeof c};
	OK(udma_queue_wait(q, 5 * SECOND, &c));
	CHECK(c.status == 0 && c.user_data == 11 && c.buffer == out);
	CHECK(info_of(out).state == UDMA_BUFFER_HOST);

	udma_op d2h = {.size = sizeof d2h, .opcode = UDMA_OP_TO_HOST, .buffer = in,
		       .device_offset = 4096, .len = LEN, .user_data = 12};
	OK(udma_queue_push(q, &d2h));
	OK(udma_queue_flush(q));
	OK(udma_queue_wait(q, 5 * SECOND, &c));
	CHECK(c.status == 0 && c.user_data == 12 && c.buffer == in);
	CHECK(memcmp(info_of(in).host, info_of(out).host, LEN) == 0);

	udma_queue_info qi = {.size = sizeof qi};
	OK(udma_queue_get_info(q, &qi));
	CHECK(qi.submitted == 2 && qi.completed == 2 && qi.in_flight == 0 && qi.depth == 64);

	/* Nothing in flight: poll says so, a wait times out with a message. */
	bool ready = true;
	OK(udma_queue_poll(q, &c, &ready));
	CHECK(!ready);
	FAILS(udma_queue_wait(q, 2000000, &c), UDMA_ERR_TIMEOUT, "queue 0");
	FAILS(udma_queue_poll(q, &c, NULL), UDMA_ERR_INVALID_ARGUMENT, "ready is NULL");
	udma_completion bad = {.size = 0};
	FAILS(udma_queue_wait(q, 0, &bad), UDMA_ERR_INVALID_ARGUMENT, "completion->size is 0");

	OK(udma_pool_free(pool, out));
	OK(udma_pool_free(pool, in));
	OK(udma_queue_destroy(q));
	FAILS(udma_queue_flush(q), UDMA_ERR_INVALID_HANDLE, "queue handle");
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

static void test_submit_errors(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *q = NULL;
	udma_queue_options qo = {.size = sizeof qo, .index = 1, .depth = 8};
	OK(udma_queue_create(dev, &qo, &q));
	udma_queue *again = NULL;
	FAILS(udma_queue_create(dev, &qo, &again), UDMA_ERR_BUSY, "queue 1");
	qo.index = 99;
	FAILS(udma_queue_create(dev, &qo, &again), UDMA_ERR_NOT_FOUND, "loopback0 queue 99");
	qo = (udma_queue_options){.size = sizeof qo, .index = 2, .depth = 3};
	FAILS(udma_queue_create(dev, &qo, &again), UDMA_ERR_INVALID_ARGUMENT, "3");
	qo = (udma_queue_options){.size = sizeof qo, .index = 2, .unit = 5};
	FAILS(udma_queue_create(dev, &qo, &again), UDMA_ERR_INVALID_ARGUMENT, "unit 5");
	qo = (udma_queue_options){.size = sizeof qo, .index = 2, .reserved = 1};
	FAILS(udma_queue_create(dev, &qo, &again), UDMA_ERR_INVALID_ARGUMENT, "reserved");

	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 512, &b));
	udma_op op = {.size = sizeof op, .opcode = UDMA_OP_TO_DEVICE, .buffer = b, .len = 513};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT,
	      "513 bytes at offset 0 run past buffer");
	op.len = 16;
	op.buffer_offset = UINT64_MAX;
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "run past");
	CHECK(info_of(b).state == UDMA_BUFFER_HOST);
	op = (udma_op){.size = sizeof op, .opcode = UDMA_OP_TO_HOST, .len = 16};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "op->buffer is NULL");
	op = (udma_op){.size = sizeof op, .opcode = UDMA_OP_NOP, .buffer = b};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "names no host memory");
	op = (udma_op){.size = sizeof op, .opcode = 99};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "opcode 99");
	op = (udma_op){.size = sizeof op, .opcode = UDMA_OP_FILL, .len = 4, .arg0 = 256};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "above 0xff");
	FAILS(udma_queue_submit(q, NULL), UDMA_ERR_INVALID_ARGUMENT, "op is NULL");
	/* A buffer freed already, in an op. */
	udma_buffer *gone = NULL;
	OK(udma_pool_alloc(pool, 64, &gone));
	OK(udma_pool_free(pool, gone));
	op = (udma_op){.size = sizeof op, .opcode = UDMA_OP_TO_DEVICE, .buffer = gone, .len = 8};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_HANDLE, "freed already");
	/* A buffer of another device's pool: its IOVA names other memory on this device (both
	 * hand out the same IOVAs), so it is refused, and nothing of either device moves. */
	udma_device *other = loopback();
	udma_pool *theirs = pool_of(other, 4 << 20);
	udma_buffer *foreign = NULL;
	OK(udma_pool_alloc(theirs, 4096, &foreign));
	uint8_t mark[16];
	memset(mark, 0xbb, sizeof mark);
	OK(udma_buffer_write(foreign, 0, mark, sizeof mark));
	op = (udma_op){.size = sizeof op, .opcode = UDMA_OP_TO_HOST, .buffer = foreign, .len = 16};
	FAILS(udma_queue_submit(q, &op), UDMA_ERR_INVALID_ARGUMENT, "on another device");
	FAILS(udma_queue_push(q, &op), UDMA_ERR_INVALID_ARGUMENT, "pool of the queue's device");
	CHECK(info_of(foreign).state == UDMA_BUFFER_HOST);
	uint8_t back[16] = {0};
	OK(udma_buffer_read(foreign, 0, back, sizeof back));
	CHECK(memcmp(back, mark, sizeof back) == 0);
	OK(udma_pool_free(theirs, foreign));
	OK(udma_pool_destroy(theirs));
	OK(udma_device_close(other));

	/* The ring is full: depth 8 takes 8 commands, the ninth is refused with a message and
	 * its buffer stays the caller's. */
	udma_buffer *bs[9];
	OK(udma_pool_alloc_bulk(pool, 64, 9, bs));
	int pushed = 0;
	enum udma_status s = UDMA_OK;
	for (int i = 0; i < 9 && s == UDMA_OK; i++) {
		udma_op o = {.size = sizeof o, .opcode = UDMA_OP_TO_DEVICE, .buffer = bs[i],
			     .len = 64, .user_data = (uint64_t)i};
		s = udma_queue_push(q, &o);
		if (s == UDMA_OK)
			pushed++;
	}
	CHECK(s == UDMA_ERR_EXHAUSTED && pushed >= 1 && pushed <= 8);
	CHECK(strstr(udma_last_error(), "loopback0 queue 1") != NULL);
	/* What to do, in C's words: the calls that take completions, no Rust API's names. */
	CHECK(strstr(udma_last_error(), "udma_queue_poll") != NULL);
	CHECK(strstr(udma_last_error(), "::") == NULL);
	CHECK(info_of(bs[pushed]).state == UDMA_BUFFER_HOST);
	OK(udma_queue_flush(q));
	for (int i = 0; i < pushed; i++) {
		udma_completion c = {.size = sizeof c};
		OK(udma_queue_wait(q, 5 * SECOND, &c));
		CHECK(c.user_data == (uint64_t)i && c.buffer == bs[i] && c.status == 0);
	}
	OK(udma_pool_free_bulk(pool, bs, 9));
	OK(udma_pool_free(pool, b));
	OK(udma_queue_destroy(q));
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

static void test_device_ops(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	udma_buffer *b = NULL;
	OK(udma_pool_alloc(pool, 256, &b));
	udma_op ops[] = {
		{.size = sizeof(udma_op), .opcode = UDMA_OP_FILL, .device_offset = 0, .len = 256,
		 .arg0 = 0x11},
		{.size = sizeof(udma_op), .opcode = UDMA_OP_DEVICE_COPY, .device_src = 0,
		 .device_offset = 1024, .len = 256},
		{.size = sizeof(udma_op), .opcode = UDMA_OP_COMPUTE, .device_src = 1024,
		 .device_offset = 2048, .len = 256, .arg0 = 0x01010101, .arg1 = 1},
		{.size = sizeof(udma_op), .opcode = UDMA_OP_NOP},
		{.size = sizeof(udma_op), .opcode = UDMA_OP_TO_HOST, .buffer = b,
		 .device_offset = 2048, .len = 256},
	};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
		OK(udma_queue_push(q, &ops[i]));
	OK(udma_queue_flush(q));
	uint64_t sum = 0;
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		udma_completion c = {.size = sizeof c};
		OK(udma_queue_wait(q, 5 * SECOND, &c));
		CHECK(c.status == 0);
		if (i == 2)
			sum = c.result;
	}
	/* Each word 0x11111111 ^ 0x01010101 = 0x10101010, plus 1. */
	uint32_t words[64];
	OK(udma_buffer_read(b, 0, words, sizeof words));
	for (int i = 0; i < 64; i++)
		CHECK(words[i] == 0x10101011u);
	CHECK(sum == 64ull * 0x10101011u);

	/* The device refuses what is out of its memory: an error completion, never a stray write;
	 * the buffer still comes back. */
	udma_op far = {.size = sizeof far, .opcode = UDMA_OP_TO_HOST, .buffer = b,
		       .device_offset = 1 << 20, .len = 256};
	OK(udma_queue_submit(q, &far));
	udma_completion c = {.size = sizeof c};
	OK(udma_queue_wait(q, 5 * SECOND, &c));
	CHECK(c.status != 0 && c.buffer == b);
	CHECK(strcmp(udma_op_status_name(c.status), "device-out-of-bounds") == 0);
	CHECK(info_of(b).state == UDMA_BUFFER_HOST);
	OK(udma_pool_free(pool, b));
	OK(udma_queue_destroy(q));
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

static void test_wait_many_and_epoll(void)
{
	udma_device *dev = loopback();
	udma_queue *q[2] = {NULL, NULL};
	for (uint32_t i = 0; i < 2; i++) {
		udma_queue_options o = {.size = sizeof o, .index = i};
		OK(udma_queue_create(dev, &o, &q[i]));
	}
	udma_op nop = {.size = sizeof nop, .opcode = UDMA_OP_NOP, .user_data = 5};
	OK(udma_queue_submit(q[1], &nop));
	size_t ready = 99;
	OK(udma_queue_wait_any(q, 2, 5 * SECOND, &ready));
	CHECK(ready == 1);
	udma_completion c = {.size = sizeof c};
	bool got = false;
	OK(udma_queue_poll(q[1], &c, &got));
	CHECK(got && c.user_data == 5 && c.buffer == NULL);
	FAILS(udma_queue_wait_any(q, 2, 1000000, &ready), UDMA_ERR_TIMEOUT,
	      "none of the 2 queues");
	udma_queue *same[2] = {q[0], q[0]};
	FAILS(udma_queue_wait_any(same, 2, 0, &ready), UDMA_ERR_INVALID_ARGUMENT,
	      "queues[1] is listed twice");
	FAILS(udma_queue_wait_any(q, 0, 0, &ready), UDMA_ERR_INVALID_ARGUMENT, "count is 0");
	udma_queue *polled = NULL;
	udma_queue_options po = {.size = sizeof po, .index = 2, .flags = UDMA_QUEUE_POLL};
	OK(udma_queue_create(dev, &po, &polled));
	udma_queue *mixed[2] = {q[0], polled};
	FAILS(udma_queue_wait_any(mixed, 2, 0, &ready), UDMA_ERR_UNSUPPORTED, "UDMA_QUEUE_POLL");
	int fd = -1;
	FAILS(udma_queue_interrupt_fd(polled, &fd), UDMA_ERR_UNSUPPORTED, "no interrupt");
	OK(udma_queue_submit(polled, &nop));
	OK(udma_queue_wait(polled, 5 * SECOND, &c)); /* polls */
	CHECK(c.user_data == 5);

	/* The caller's own epoll loop on queue 0's interrupt. */
	OK(udma_queue_interrupt_fd(q[0], &fd));
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data = {.u64 = 0}};
	CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);
	bool armed_ready = true;
	OK(udma_queue_arm(q[0], &armed_ready));
	CHECK(!armed_ready);
	OK(udma_queue_submit(q[0], &nop));
	int n = epoll_wait(ep, &ev, 1, 5000);
	CHECK(n == 1);
	OK(udma_queue_disarm(q[0]));
	OK(udma_queue_poll(q[0], &c, &got));
	CHECK(got && c.user_data == 5);
	close(ep);

	OK(udma_queue_destroy(polled));
	OK(udma_queue_destroy(q[0]));
	OK(udma_queue_destroy(q[1]));
	OK(udma_device_close(dev));
}

/* udma_queue_interrupt_fd lends a descriptor of its own, a duplicate of the queue's eventfd
 * (same counter, same readiness), the same number on every call. A caller that closes it
 * anyway breaks nothing: udma_queue_destroy leaves alone the file that took the number since
 * (here /dev/null), and does not abort when the number is closed. Where the kernel has
 * kcmp(2) (to tell whether the number is still the library's), the next call lends a new
 * number, and a number the caller left open is closed by udma_queue_destroy (elsewhere the
 * number stays as it is, the documented leak, which this test does not accept: it needs
 * kcmp). */
static void interrupt_fires(udma_queue *q, int fd)
{
	bool ready = true;
	OK(udma_queue_arm(q, &ready));
	CHECK(!ready);
	udma_op nop = {.size = sizeof nop, .opcode = UDMA_OP_NOP, .user_data = 9};
	OK(udma_queue_submit(q, &nop));
	struct pollfd p = {.fd = fd, .events = POLLIN};
	CHECK(poll(&p, 1, 5000) == 1 && (p.revents & POLLIN));
	OK(udma_queue_disarm(q));
	udma_completion c = {.size = sizeof c};
	bool got = false;
	OK(udma_queue_poll(q, &c, &got));
	CHECK(got && c.user_data == 9);
}

static bool is_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

static void test_queue_interrupt_fd_closed_by_caller(void)
{
	udma_device *dev = loopback();
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	int fd = -1, again = -1;
	OK(udma_queue_interrupt_fd(q, &fd));
	OK(udma_queue_interrupt_fd(q, &again));
	CHECK(fd >= 0 && again == fd);
	interrupt_fires(q, fd);
	pid_t me = getpid();
	errno = 0;
	/* What is checked below needs kcmp(2): without it the library leaves lent numbers as
	 * they are, and this test cannot tell its give-back works. */
	bool have_kcmp = syscall(SYS_kcmp, me, me, KCMP_FILE, fd, fd) == 0;
	if (!have_kcmp)
		fprintf(stderr, "kcmp(2) refused here (%s): this test needs it\n", strerror(errno));
	CHECK(have_kcmp);

	/* Closed by the caller, its number taken by another file: the next call lends a new
	 * number, and destroy leaves that file open. */
	CHECK(close(fd) == 0);
	int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
	CHECK(other >= 0);
	if (other >= 0 && other != fd) { /* a lower number was free: move it onto the lent one */
		CHECK(dup2(other, fd) == fd);
		CHECK(close(other) == 0);
		other = fd;
	}
	OK(udma_queue_interrupt_fd(q, &again));
	CHECK(again != fd && is_open(again));
	interrupt_fires(q, again);
	OK(udma_queue_destroy(q));
	CHECK(is_open(other));
	CHECK(close(other) == 0);
	CHECK(!is_open(again));

	/* Closed by the caller and left closed: destroy does not abort. */
	OK(udma_queue_create(dev, NULL, &q));
	OK(udma_queue_interrupt_fd(q, &fd));
	CHECK(close(fd) == 0);
	OK(udma_queue_destroy(q));

	/* Left open: destroy closes it. */
	OK(udma_queue_create(dev, NULL, &q));
	OK(udma_queue_interrupt_fd(q, &fd));
	OK(udma_queue_destroy(q));
	CHECK(!is_open(fd));
	OK(udma_device_close(dev));
}

static void test_destroy_with_work_in_flight(void)
{
	/* The NPU cost model holds each completion back: the ops are in flight when the queue is
	 * destroyed, and their buffers come back to the host under their handles. */
	udma_loopback_options o = {.size = sizeof o, .memory_bytes = 1 << 20};
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(&o, &dev));
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	udma_buffer *bs[4];
	OK(udma_pool_alloc_bulk(pool, 4096, 4, bs));
	for (int i = 0; i < 4; i++) {
		udma_op op = {.size = sizeof op, .opcode = UDMA_OP_TO_DEVICE, .buffer = bs[i],
			      .len = 4096};
		OK(udma_queue_submit(q, &op));
	}
	OK(udma_queue_destroy(q));
	for (int i = 0; i < 4; i++)
		CHECK(info_of(bs[i]).state == UDMA_BUFFER_HOST);
	OK(udma_pool_free_bulk(pool, bs, 4));
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

/* A device taken away with work in flight: the handle's event says so (once, also on its
 * fd), waits fail with UDMA_ERR_REMOVED instead of timing out, the buffers come back as the
 * queue is destroyed, and everything that needs the device says it was removed. */
static void test_device_removal(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_queue *q = NULL;
	OK(udma_queue_create(dev, NULL, &q));
	udma_event ev = {.size = sizeof ev};
	OK(udma_device_next_event(dev, 0, &ev));
	CHECK(ev.kind == UDMA_EVENT_NONE);
	int removed = -1;
	OK(udma_device_is_removed(dev, &removed));
	CHECK(removed == 0);
	int efd = -1;
	OK(udma_device_events_fd(dev, &efd));
	struct pollfd pfd = {.fd = efd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 0) == 0);

	/* Queue 0 waits for queue 3 to complete a million ops: what follows stays in flight. */
	udma_buffer *bs[3];
	OK(udma_pool_alloc_bulk(pool, 4096, 3, bs));
	udma_op hold = {.size = sizeof hold, .opcode = UDMA_OP_WAIT, .arg0 = 3, .arg1 = 1000000};
	OK(udma_queue_submit(q, &hold));
	for (int i = 0; i < 3; i++) {
		udma_op op = {.size = sizeof op, .opcode = UDMA_OP_TO_DEVICE, .buffer = bs[i],
			      .len = 4096};
		OK(udma_queue_submit(q, &op));
	}
	udma_completion c = {.size = sizeof c};
	FAILS(udma_queue_wait(q, 1000000, &c), UDMA_ERR_TIMEOUT, "queue 0");

	OK(udma_device_remove_loopback(dev));
	CHECK(poll(&pfd, 1, 5000) == 1);
	OK(udma_device_next_event(dev, 5 * SECOND, &ev));
	CHECK(ev.kind == UDMA_EVENT_REMOVAL);
	OK(udma_device_next_event(dev, 0, &ev));
	CHECK(ev.kind == UDMA_EVENT_NONE);
	CHECK(poll(&pfd, 1, 0) == 0);
	OK(udma_device_is_removed(dev, &removed));
	CHECK(removed == 1);
	FAILS(udma_queue_wait(q, 5 * SECOND, &c), UDMA_ERR_REMOVED, "removed");
	CHECK(strcmp(udma_status_name(UDMA_ERR_REMOVED), "UDMA_ERR_REMOVED") == 0);
	/* Nothing more is queued on a removed device, and the buffer stays the caller's. */
	udma_buffer *late = NULL;
	OK(udma_pool_alloc(pool, 64, &late));
	udma_op after = {.size = sizeof after, .opcode = UDMA_OP_TO_DEVICE, .buffer = late,
			 .len = 64};
	FAILS(udma_queue_submit(q, &after), UDMA_ERR_REMOVED, "nothing queued");
	FAILS(udma_queue_push(q, &after), UDMA_ERR_REMOVED, "destroy the queue");
	CHECK(info_of(late).state == UDMA_BUFFER_HOST);
	OK(udma_pool_free(pool, late));
	for (int i = 0; i < 3; i++)
		CHECK(info_of(bs[i]).state == UDMA_BUFFER_IN_QUEUE);
	OK(udma_queue_destroy(q));
	for (int i = 0; i < 3; i++)
		CHECK(info_of(bs[i]).state == UDMA_BUFFER_HOST);
	udma_queue *again = NULL;
	FAILS(udma_queue_create(dev, NULL, &again), UDMA_ERR_REMOVED, "removed");
	OK(udma_device_remove_loopback(dev));
	udma_event small = {.size = 4};
	FAILS(udma_device_next_event(dev, 0, &small), UDMA_ERR_INVALID_ARGUMENT, "event->size");
	OK(udma_pool_free_bulk(pool, bs, 3));
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
	close(efd);
}

/* Two threads, each with its own queue, sharing one pool and one device. */
struct worker {
	udma_device *dev;
	udma_pool *pool;
	uint32_t index;
	int failures;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	udma_queue_options o = {.size = sizeof o, .index = w->index};
	udma_queue *q = NULL;
	if (udma_queue_create(w->dev, &o, &q) != UDMA_OK)
		return (w->failures++, NULL);
	for (int i = 0; i < 200; i++) {
		udma_buffer *b = NULL;
		if (udma_pool_alloc(w->pool, 512, &b) != UDMA_OK) {
			w->failures++;
			break;
		}
		fill_pattern(b, 512, (unsigned)i);
		udma_op op = {.size = sizeof op, .opcode = UDMA_OP_TO_DEVICE, .buffer = b,
			      .device_offset = (uint64_t)w->index * 4096, .len = 512};
		udma_completion c = {.size = sizeof c};
		if (udma_queue_submit(q, &op) != UDMA_OK ||
		    udma_queue_wait(q, 5 * SECOND, &c) != UDMA_OK || c.status != 0 ||
		    c.buffer != b || udma_pool_free(w->pool, b) != UDMA_OK)
			w->failures++;
	}
	if (udma_queue_destroy(q) != UDMA_OK)
		w->failures++;
	/* A failure on this thread does not change the other thread's last error. */
	udma_device_info info = {.size = sizeof info};
	if (udma_device_get_info(NULL, &info) != UDMA_ERR_INVALID_HANDLE ||
	    strstr(udma_last_error(), "NULL") == NULL)
		w->failures++;
	return NULL;
}

static void test_threads(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	FAILS(udma_pool_free(pool, NULL), UDMA_ERR_INVALID_HANDLE, "buffer handle is NULL");
	struct worker w[2] = {{dev, pool, 0, 0}, {dev, pool, 1, 0}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, work, &w[i]) == 0);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].failures == 0);
	}
	CHECK(strstr(udma_last_error(), "udma_pool_free: the buffer handle is NULL") != NULL);
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));
}

/* A thread allocating and freeing from a pool until the pool is destroyed under it. */
struct racer {
	udma_pool *pool;
	atomic_long allocs;
	long refused, bad;
};

static void *race_alloc(void *arg)
{
	struct racer *r = arg;
	for (;;) {
		udma_buffer *b = NULL;
		udma_status s = udma_pool_alloc(r->pool, 4096, &b);
		if (s == UDMA_OK) {
			/* Now and then the buffer stays out a while, so a destroy finds it. */
			if (atomic_fetch_add(&r->allocs, 1) % 8 == 0)
				sched_yield();
			s = udma_pool_free(r->pool, b);
			if (s != UDMA_OK) {
				fprintf(stderr, "race_alloc: free: %s: %s\n", udma_status_name(s),
					udma_last_error());
				r->bad++;
			}
		} else if (s == UDMA_ERR_INVALID_HANDLE &&
			   strstr(udma_last_error(), "pool handle") != NULL &&
			   strstr(udma_last_error(), "destroyed already") != NULL) {
			/* Destroyed: every later call is refused too. */
			r->refused++;
			s = udma_pool_alloc(r->pool, 4096, &b);
			if (s != UDMA_ERR_INVALID_HANDLE) {
				fprintf(stderr, "race_alloc: after the destroy: %s: %s\n",
					udma_status_name(s), udma_last_error());
				r->bad++;
			}
			return NULL;
		} else {
			fprintf(stderr, "race_alloc: %s: %s\n", udma_status_name(s), udma_last_error());
			r->bad++;
			return NULL;
		}
	}
}

static double seconds_since(const struct timespec *start)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - start->tv_sec) + (double)(now.tv_nsec - start->tv_nsec) / 1e9;
}

/* Destroying a pool while other threads allocate from it: each attempt is refused as busy
 * (a buffer out, or a call holding the pool) or succeeds; once it has, every allocation
 * fails with a stale handle, and nothing is touched after it is gone (AddressSanitizer and
 * Valgrind watch). */
static void test_destroy_racing_alloc(void)
{
	udma_device *dev = loopback();
	udma_pool *pool = pool_of(dev, 4 << 20);
	struct racer r[2] = {{.pool = pool}, {.pool = pool}};
	for (int i = 0; i < 2; i++)
		atomic_init(&r[i].allocs, 0);
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&t[i], NULL, race_alloc, &r[i]) == 0);
	/* Both threads allocating before the destroy begins. */
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	while ((atomic_load(&r[0].allocs) < 100 || atomic_load(&r[1].allocs) < 100) &&
	       seconds_since(&start) < 60)
		sched_yield();
	CHECK(atomic_load(&r[0].allocs) >= 100 && atomic_load(&r[1].allocs) >= 100);
	long busy = 0, other = 0;
	udma_status s;
	while ((s = udma_pool_destroy(pool)) != UDMA_OK && seconds_since(&start) < 60) {
		if (s == UDMA_ERR_BUSY && (strstr(udma_last_error(), "buffers out") != NULL ||
					   strstr(udma_last_error(), "calls on it") != NULL))
			busy++;
		else
			other++;
	}
	CHECK(s == UDMA_OK && other == 0);
	for (int i = 0; i < 2; i++) {
		pthread_join(t[i], NULL);
		CHECK(r[i].bad == 0 && r[i].refused == 1);
	}
	FAILS(udma_pool_destroy(pool), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	printf("  (destroy refused as busy %ld times first)\n", busy);
	OK(udma_device_close(dev));
}

/* ---- planning ----------------------------------------------------------------------- */

/* The tensor layout of a header before in-place reuse (48 bytes: up to `flags`). */
struct tensor_v1 {
	size_t size;
	uint64_t id, bytes, offset;
	uint32_t first, last, kind, flags;
};

static void test_plan_inplace(void)
{
	/* A (intermediate, dies at step 1) and B = Relu(A), born at step 1: B may take A's
	 * memory when in-place reuse is on. */
	uint64_t from_a[1] = {1};
	udma_tensor t[2] = {
		{.size = sizeof(udma_tensor), .id = 1, .bytes = 1024, .first = 0, .last = 1},
		{.size = sizeof(udma_tensor), .id = 2, .bytes = 1024, .first = 1, .last = 2,
		 .op = "Relu", .inputs = from_a, .input_count = 1},
	};
	udma_plan *plan = NULL;
	udma_plan_report r = {.size = sizeof r};
	uint64_t offsets[2];
	OK(udma_plan_create(t, 2, NULL, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 2048);
	OK(udma_plan_destroy(plan));

	udma_plan_options o = {.size = sizeof o, .flags = UDMA_PLAN_INPLACE};
	OK(udma_plan_create(t, 2, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	OK(udma_plan_offsets(plan, offsets, 2));
	CHECK(r.arena_bytes == 1024 && offsets[0] == offsets[1]);
	OK(udma_plan_destroy(plan));

	/* Forbidden for this tensor: apart again. */
	t[1].inplace = UDMA_INPLACE_FORBID;
	OK(udma_plan_create(t, 2, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 2048);
	OK(udma_plan_destroy(plan));

	/* An op the table does not know stays apart unless allowed. */
	t[1].op = "Conv";
	t[1].inplace = UDMA_INPLACE_TABLE;
	OK(udma_plan_create(t, 2, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 2048);
	OK(udma_plan_destroy(plan));
	t[1].inplace = UDMA_INPLACE_ALLOW;
	OK(udma_plan_create(t, 2, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 1024);
	OK(udma_plan_destroy(plan));

	/* Refused shapes, each named. */
	t[1].inplace = 7;
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "tensors[1]: inplace 7 is not a udma_tensor_inplace");
	t[1].inplace = UDMA_INPLACE_TABLE;
	t[1].inputs = NULL;
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "inputs is NULL with input_count 1");
	t[1].inputs = from_a;
	t[1].input_count = 5000;
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "input_count 5000 is above UDMA_TENSOR_MAX_INPUTS");
	t[1].input_count = 1;
	t[1].op = "\xff";
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT, "op is not UTF-8");
	t[1].op = NULL;
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "inputs are given but op is NULL");
	t[1].op = "Relu";
	o.flags = 0x10;
	FAILS(udma_plan_create(t, 2, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "flags 0x10 has bits that are not UDMA_PLAN_* flags");

	/* A program built against the older, 48-byte tensor plans as before. */
	struct tensor_v1 old[2] = {
		{.size = sizeof(struct tensor_v1), .id = 1, .bytes = 1024, .first = 0, .last = 1},
		{.size = sizeof(struct tensor_v1), .id = 2, .bytes = 1024, .first = 1, .last = 2},
	};
	CHECK(sizeof(struct tensor_v1) == 48);
	o.flags = UDMA_PLAN_INPLACE;
	OK(udma_plan_create((const udma_tensor *)(const void *)old, 2, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 2048 && r.tensors == 2);
	OK(udma_plan_destroy(plan));
}

static void test_plan(void)
{
	udma_tensor t[3] = {
		{.size = sizeof(udma_tensor), .id = 10, .bytes = 1000, .first = 0, .last = 1,
		 .kind = UDMA_TENSOR_INPUT},
		{.size = sizeof(udma_tensor), .id = 11, .bytes = 500, .first = 1, .last = 2},
		{.size = sizeof(udma_tensor), .id = 12, .bytes = 1000, .first = 2, .last = 3,
		 .kind = UDMA_TENSOR_OUTPUT},
	};
	udma_plan *plan = NULL;
	OK(udma_plan_create(t, 3, NULL, &plan));
	udma_plan_report r = {.size = sizeof r};
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.arena_bytes == 1536 && r.lower_bound_bytes == 1536 && r.optimal == 1);
	CHECK(r.naive_bytes == 1024 + 512 + 1024 && r.align == 256 && r.tensors == 3);
	uint64_t offsets[3];
	OK(udma_plan_offsets(plan, offsets, 3));
	CHECK(offsets[0] != offsets[1] && offsets[1] != offsets[2]);
	uint64_t at = 1;
	OK(udma_plan_offset(plan, 11, &at));
	CHECK(at == offsets[1]);
	FAILS(udma_plan_offset(plan, 99, &at), UDMA_ERR_NOT_FOUND, "no tensor 99");
	FAILS(udma_plan_offsets(plan, offsets, 2), UDMA_ERR_INVALID_ARGUMENT, "has 3 tensors");
	OK(udma_plan_destroy(plan));
	FAILS(udma_plan_destroy(plan), UDMA_ERR_INVALID_HANDLE, "destroyed already");

	udma_plan_options o = {.size = sizeof o, .strategy = UDMA_PLAN_FIRST_FIT, .align = 64};
	OK(udma_plan_create(t, 3, &o, &plan));
	OK(udma_plan_get_report(plan, &r));
	CHECK(r.strategy == UDMA_PLAN_FIRST_FIT && r.align == 64);
	OK(udma_plan_destroy(plan));

	o.strategy = 42;
	FAILS(udma_plan_create(t, 3, &o, &plan), UDMA_ERR_INVALID_ARGUMENT, "strategy 42");
	o = (udma_plan_options){.size = sizeof o, .align = 100};
	FAILS(udma_plan_create(t, 3, &o, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "alignment 100 is not a power of two");
	t[1].bytes = 0;
	FAILS(udma_plan_create(t, 3, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "tensor 11: size is zero");
	t[1].bytes = 500;
	t[2].id = 10;
	FAILS(udma_plan_create(t, 3, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT, "used twice");
	t[2].id = 12;
	t[2].size = 8;
	FAILS(udma_plan_create(t, 3, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "tensors[2].size is 8");
	t[2].size = sizeof(udma_tensor);
	t[0].kind = 9;
	FAILS(udma_plan_create(t, 3, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT, "tensors[0]: kind 9");
	t[0].kind = 0;
	FAILS(udma_plan_create(t, 0, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT, "count is 0");
	FAILS(udma_plan_create(NULL, 3, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "tensors[0] is NULL");
	/* A fixed tensor sits where it is pinned. */
	t[0].flags = UDMA_TENSOR_FIXED;
	t[0].offset = 4096;
	OK(udma_plan_create(t, 3, NULL, &plan));
	OK(udma_plan_offset(plan, 10, &at));
	CHECK(at == 4096);
	OK(udma_plan_destroy(plan));
}

/* ---- models, pipelines, streams ----------------------------------------------------- */

enum { CHAIN_BYTES = 256 };

static udma_model *chain(void)
{
	udma_model *m = NULL;
	OK(udma_model_create_chain(3, CHAIN_BYTES, &m));
	return m;
}

static void test_model(void)
{
	udma_model *m = chain();
	udma_model_info info = {.size = sizeof info};
	OK(udma_model_get_info(m, &info));
	CHECK(info.input_bytes == CHAIN_BYTES && info.result_bytes == CHAIN_BYTES);
	CHECK(info.steps == 3 && info.arena_bytes >= 2 * CHAIN_BYTES && info.compute_bytes > 0);

	uint8_t in[CHAIN_BYTES], out[CHAIN_BYTES], again[CHAIN_BYTES];
	for (int i = 0; i < CHAIN_BYTES; i++)
		in[i] = (uint8_t)(i * 7);
	OK(udma_model_expected(m, in, sizeof in, out, sizeof out));
	OK(udma_model_expected(m, in, sizeof in, again, sizeof again));
	CHECK(memcmp(out, again, sizeof out) == 0 && memcmp(out, in, sizeof out) != 0);
	FAILS(udma_model_expected(m, in, 10, out, sizeof out), UDMA_ERR_INVALID_ARGUMENT,
	      "input_len 10 is shorter than the model's 256-byte input");
	FAILS(udma_model_expected(m, in, sizeof in, out, 8), UDMA_ERR_INVALID_ARGUMENT,
	      "result_len 8 is shorter");
	FAILS(udma_model_expected(m, NULL, 0, out, sizeof out), UDMA_ERR_INVALID_ARGUMENT,
	      "input is NULL");
	FAILS(udma_model_expected(m, in, sizeof in, NULL, 0), UDMA_ERR_INVALID_ARGUMENT,
	      "result is NULL");

	udma_model *bad = NULL;
	FAILS(udma_model_create_chain(0, 64, &bad), UDMA_ERR_INVALID_ARGUMENT, "at least 1 layer");
	FAILS(udma_model_create_chain(2, 0, &bad), UDMA_ERR_INVALID_ARGUMENT, "at least 1 layer");
	FAILS(udma_model_create_chain(2, 64, NULL), UDMA_ERR_INVALID_ARGUMENT, "model is NULL");
	FAILS(udma_model_create_yolov5s(0, &bad), UDMA_ERR_INVALID_ARGUMENT, "max_detections is 0");
	FAILS(udma_model_create_yolov5s(300, NULL), UDMA_ERR_INVALID_ARGUMENT, "model is NULL");
	CHECK(bad == NULL);

	udma_model *yolo = NULL;
	OK(udma_model_create_yolov5s(300, &yolo));
	OK(udma_model_get_info(yolo, &info));
	CHECK(info.input_bytes == 640 * 640 * 3 && info.result_bytes == 8 + 300 * 32);
	CHECK(info.steps > 50);
	OK(udma_model_destroy(yolo));

	OK(udma_model_destroy(m));
	FAILS(udma_model_destroy(m), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	FAILS(udma_model_get_info(m, &info), UDMA_ERR_INVALID_HANDLE, "model handle");
	FAILS(udma_model_get_info(NULL, &info), UDMA_ERR_INVALID_HANDLE,
	      "udma_model_create_chain or udma_model_create_yolov5s");
}

/* What the pipeline tests' callbacks saw. */
struct frames {
	udma_model *model;
	udma_pipeline *pipeline;
	uint8_t expected[2][CHAIN_BYTES];
	int finished, bad, reentered, past_end;
	udma_frame_input kept_input;
	udma_frame_output kept_output;
};

static void input_of(uint64_t frame, uint8_t *in)
{
	for (int i = 0; i < CHAIN_BYTES; i++)
		in[i] = (uint8_t)(frame % 2 == 0 ? i : 255 - i);
}

static void take_frame(void *user, const udma_frame_output *out)
{
	struct frames *f = user;
	uint8_t got[CHAIN_BYTES];
	f->kept_output = *out;
	if (out->status != 0 || out->len != CHAIN_BYTES ||
	    udma_frame_output_read(out, 0, got, sizeof got) != UDMA_OK ||
	    memcmp(got, f->expected[out->frame % 2], sizeof got) != 0)
		f->bad++;
	if (udma_frame_output_read(out, 200, got, 100) == UDMA_ERR_INVALID_ARGUMENT &&
	    strstr(udma_last_error(), "run past the frame's 256-byte result") != NULL)
		f->past_end++;
	size_t n = 0;
	if (udma_pipeline_poll(f->pipeline, take_frame, user, &n) == UDMA_ERR_BUSY &&
	    strstr(udma_last_error(), "inside a fill, result") != NULL)
		f->reentered++;
	f->finished++;
}

static void fill_frame(void *user, uint64_t frame, udma_frame_input *in)
{
	struct frames *f = user;
	uint8_t bytes[CHAIN_BYTES];
	input_of(frame, bytes);
	f->kept_input = *in;
	if (in->len != CHAIN_BYTES || in->frame != frame ||
	    udma_frame_input_write(in, 0, bytes, 100) != UDMA_OK ||
	    udma_frame_input_write(in, 100, bytes + 100, CHAIN_BYTES - 100) != UDMA_OK)
		f->bad++;
	if (udma_frame_input_write(in, 250, bytes, 10) == UDMA_ERR_INVALID_ARGUMENT &&
	    strstr(udma_last_error(), "run past the frame's 256-byte input") != NULL)
		f->past_end++;
	uint64_t n;
	if (udma_pipeline_submit(f->pipeline, bytes, sizeof bytes, &n) == UDMA_ERR_BUSY &&
	    strstr(udma_last_error(), "from inside a fill") != NULL)
		f->reentered++;
}

static void test_pipeline(void)
{
	udma_device *dev = loopback();
	struct frames f = {.model = chain()};
	uint8_t in[2][CHAIN_BYTES];
	for (int k = 0; k < 2; k++) {
		input_of((uint64_t)k, in[k]);
		OK(udma_model_expected(f.model, in[k], CHAIN_BYTES, f.expected[k], CHAIN_BYTES));
	}

	udma_pipeline_options o = {.size = sizeof o, .flags = 0x80};
	FAILS(udma_pipeline_create(dev, f.model, &o, &f.pipeline), UDMA_ERR_INVALID_ARGUMENT,
	      "flags 0x80");
	o = (udma_pipeline_options){.size = sizeof o, .results = 7};
	FAILS(udma_pipeline_create(dev, f.model, &o, &f.pipeline), UDMA_ERR_INVALID_ARGUMENT,
	      "results 7 is not a udma_results");
	o = (udma_pipeline_options){.size = sizeof o, .depth = 5000};
	FAILS(udma_pipeline_create(dev, f.model, &o, &f.pipeline), UDMA_ERR_INVALID_ARGUMENT,
	      "depth 5000");
	o = (udma_pipeline_options){.size = sizeof o, .queue = 3};
	FAILS(udma_pipeline_create(dev, f.model, &o, &f.pipeline), UDMA_ERR_NOT_FOUND,
	      "the pipeline on loopback0 queue 3");
	udma_pool *pool = pool_of(dev, 4 << 20);
	FAILS(udma_pipeline_create(dev, (const udma_model *)(const void *)pool, NULL, &f.pipeline),
	      UDMA_ERR_INVALID_HANDLE, "is a pool handle, not a model handle");
	OK(udma_pool_destroy(pool));
	FAILS(udma_pipeline_create(dev, f.model, NULL, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "pipeline is NULL");

	o = (udma_pipeline_options){.size = sizeof o, .results = UDMA_RESULTS_COPY};
	OK(udma_pipeline_create(dev, f.model, &o, &f.pipeline));
	udma_pipeline *second = NULL;
	FAILS(udma_pipeline_create(dev, f.model, NULL, &second), UDMA_ERR_BUSY, "queue 0");

	/* Copy-in: two frames fill both slots; a third is refused until one is taken. */
	uint64_t frame = 99;
	OK(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES, &frame));
	CHECK(frame == 0);
	OK(udma_pipeline_submit(f.pipeline, in[1], CHAIN_BYTES, &frame));
	CHECK(frame == 1);
	FAILS(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES, &frame), UDMA_ERR_BUSY,
	      "all 2 slots are in flight");
	size_t n = 0, total = 0;
	while (total < 2) {
		OK(udma_pipeline_wait(f.pipeline, take_frame, &f, &n));
		total += n;
	}
	CHECK(f.finished == 2 && f.bad == 0 && f.past_end == 2 && f.reentered == 2);
	FAILS(udma_frame_output_read(&f.kept_output, 0, in[0], 1), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");
	FAILS(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES + 1, NULL),
	      UDMA_ERR_INVALID_ARGUMENT, "longer than the model's 256-byte input");
	FAILS(udma_pipeline_submit(f.pipeline, NULL, 4, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "input is NULL");

	/* Through the fill callback, then poll until done. */
	OK(udma_pipeline_submit_with(f.pipeline, fill_frame, &f, &frame));
	CHECK(frame == 2 && f.bad == 0 && f.past_end == 3 && f.reentered == 3);
	FAILS(udma_frame_input_write(&f.kept_input, 0, in[0], 1), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");
	OK(udma_pipeline_submit_with(f.pipeline, fill_frame, &f, NULL));
	OK(udma_pipeline_flush(f.pipeline));
	/* Poll, never block: the device thread finishes the frames in its own time, which
	 * under a sanitizer on a loaded machine can be long, so the bound is a minute of
	 * wall time, not a count of polls. */
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		OK(udma_pipeline_poll(f.pipeline, take_frame, &f, NULL));
		if (f.finished < 4)
			sched_yield();
	} while (f.finished < 4 && seconds_since(&start) < 60);
	CHECK(f.finished == 4 && f.bad == 0);
	FAILS(udma_pipeline_submit_with(f.pipeline, NULL, &f, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "fill is NULL");
	FAILS(udma_pipeline_poll(f.pipeline, NULL, &f, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "result is NULL");
	FAILS(udma_pipeline_wait(f.pipeline, NULL, &f, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "result is NULL");
	FAILS(udma_frame_input_write(NULL, 0, in[0], 1), UDMA_ERR_INVALID_ARGUMENT, "input is NULL");
	FAILS(udma_frame_output_read(NULL, 0, in[0], 1), UDMA_ERR_INVALID_ARGUMENT,
	      "output is NULL");
	OK(udma_pipeline_wait(f.pipeline, take_frame, &f, &n));
	CHECK(n == 0); /* nothing in flight */

	udma_pipeline_info info = {.size = sizeof info};
	OK(udma_pipeline_get_info(f.pipeline, &info));
	CHECK(info.frames == 4 && info.failed == 0 && info.in_flight == 0 && info.depth == 2);
	CHECK(info.in_place == 0 && info.bytes_to_device == 4 * CHAIN_BYTES);
	CHECK(info.bytes_to_host == 4 * CHAIN_BYTES && info.doorbells > 0);

	/* Destroying drains what is in flight. */
	OK(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES, NULL));
	OK(udma_pipeline_destroy(f.pipeline));
	FAILS(udma_pipeline_destroy(f.pipeline), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	FAILS(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES, NULL), UDMA_ERR_INVALID_HANDLE,
	      "pipeline handle");
	FAILS(udma_pipeline_get_info(f.pipeline, &info), UDMA_ERR_INVALID_HANDLE, "pipeline");

	/* The queues are free again; one queue, results in place, polling. */
	o = (udma_pipeline_options){.size = sizeof o, .depth = 1, .results = UDMA_RESULTS_IN_PLACE,
				    .flags = UDMA_PIPELINE_ONE_QUEUE | UDMA_PIPELINE_POLL};
	OK(udma_pipeline_create(dev, f.model, &o, &f.pipeline));
	OK(udma_model_destroy(f.model)); /* the pipeline keeps its own copy */
	OK(udma_pipeline_submit(f.pipeline, in[0], CHAIN_BYTES, NULL));
	OK(udma_pipeline_wait(f.pipeline, take_frame, &f, &n));
	CHECK(n == 1 && f.bad == 0);
	OK(udma_pipeline_get_info(f.pipeline, &info));
	CHECK(info.in_place == 1 && info.depth == 1);
	OK(udma_pipeline_destroy(f.pipeline));
	OK(udma_device_close(dev));
}

/* Callbacks' view pointers kept past their callbacks (a program's bug): using one later is
 * refused, and the check reads only memory the library keeps for its views, never a stack
 * frame that has returned (Valgrind checks that) nor a thread's that has exited. */
struct kept {
	udma_pipeline *pipeline;
	const udma_frame_input *input;
	const udma_frame_output *output;
	int written, taken;
};

static void keep_input(void *user, uint64_t frame, udma_frame_input *in)
{
	struct kept *k = user;
	uint8_t bytes[CHAIN_BYTES];
	input_of(frame, bytes);
	if (udma_frame_input_write(in, 0, bytes, sizeof bytes) == UDMA_OK)
		k->written++;
	k->input = in;
}

static void keep_output(void *user, const udma_frame_output *out)
{
	struct kept *k = user;
	uint8_t got[CHAIN_BYTES];
	if (udma_frame_output_read(out, 0, got, sizeof got) == UDMA_OK)
		k->taken++;
	k->output = out;
}

static void *submit_keeping(void *arg)
{
	struct kept *k = arg;
	OK(udma_pipeline_submit_with(k->pipeline, keep_input, k, NULL));
	return NULL;
}

/* Two threads inside fill callbacks at once (of a pipeline each), each trying the other's
 * live view with its own. */
struct crossing {
	udma_pipeline *pipeline[2];
	const udma_frame_input *view[2];
	atomic_int inside, tried;
	int refused[2], own[2];
};

struct crossing_thread {
	struct crossing *c;
	int me;
};

static void cross_fill(void *user, uint64_t frame, udma_frame_input *in)
{
	struct crossing_thread *t = user;
	struct crossing *c = t->c;
	(void)frame;
	c->view[t->me] = in;
	atomic_fetch_add(&c->inside, 1); /* publishes view[me] */
	while (atomic_load(&c->inside) < 2)
		sched_yield();
	uint8_t byte = 7;
	if (udma_frame_input_write(c->view[1 - t->me], 0, &byte, 1) == UDMA_ERR_INVALID_ARGUMENT &&
	    strstr(udma_last_error(), "not the view of the running callback") != NULL)
		c->refused[t->me]++;
	if (udma_frame_input_write(in, 0, &byte, 1) == UDMA_OK)
		c->own[t->me]++;
	/* Both views stay live until both threads have tried. */
	atomic_fetch_add(&c->tried, 1);
	while (atomic_load(&c->tried) < 2)
		sched_yield();
}

static void *cross_thread(void *arg)
{
	struct crossing_thread *t = arg;
	OK(udma_pipeline_submit_with(t->c->pipeline[t->me], cross_fill, t, NULL));
	return NULL;
}

static void discard_output(void *user, const udma_frame_output *out)
{
	(void)user;
	(void)out;
}

static void test_pipeline_kept_view_pointers(void)
{
	udma_device *dev = loopback();
	udma_model *m = chain();
	struct kept k = {0};
	OK(udma_pipeline_create(dev, m, NULL, &k.pipeline));
	uint8_t byte = 1, got[CHAIN_BYTES];
	size_t n = 0;

	/* This thread's own pointers, after their callbacks returned. */
	OK(udma_pipeline_submit_with(k.pipeline, keep_input, &k, NULL));
	CHECK(k.written == 1 && k.input != NULL);
	FAILS(udma_frame_input_write(k.input, 0, &byte, 1), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");
	OK(udma_pipeline_wait(k.pipeline, keep_output, &k, &n));
	CHECK(n == 1 && k.taken == 1 && k.output != NULL);
	FAILS(udma_frame_output_read(k.output, 0, got, sizeof got), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");
	FAILS(udma_frame_output_read(k.output, 0, got, 0), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");

	/* A pointer from a thread that has exited since. */
	pthread_t t;
	CHECK(pthread_create(&t, NULL, submit_keeping, &k) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(k.written == 2);
	FAILS(udma_frame_input_write(k.input, 0, &byte, 1), UDMA_ERR_INVALID_ARGUMENT,
	      "not the view of the running callback");
	OK(udma_pipeline_wait(k.pipeline, keep_output, &k, &n));
	CHECK(n == 1 && k.taken == 2);
	OK(udma_pipeline_destroy(k.pipeline));

	/* Two threads in callbacks at once: neither can use the other's live view, each its own. */
	struct crossing c = {.view = {NULL, NULL}};
	atomic_init(&c.inside, 0);
	atomic_init(&c.tried, 0);
	for (uint32_t i = 0; i < 2; i++) {
		udma_pipeline_options o = {.size = sizeof o, .depth = 1, .queue = i,
					   .flags = UDMA_PIPELINE_ONE_QUEUE};
		OK(udma_pipeline_create(dev, m, &o, &c.pipeline[i]));
	}
	pthread_t ts[2];
	struct crossing_thread args[2] = {{&c, 0}, {&c, 1}};
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&ts[i], NULL, cross_thread, &args[i]) == 0);
	for (int i = 0; i < 2; i++)
		CHECK(pthread_join(ts[i], NULL) == 0);
	CHECK(c.refused[0] == 1 && c.refused[1] == 1);
	CHECK(c.own[0] == 1 && c.own[1] == 1);
	for (int i = 0; i < 2; i++) {
		OK(udma_pipeline_wait(c.pipeline[i], discard_output, NULL, &n));
		OK(udma_pipeline_destroy(c.pipeline[i]));
	}
	OK(udma_model_destroy(m));
	OK(udma_device_close(dev));
}

/* What the streams test's callbacks saw. */
struct run {
	udma_streams *streams;
	uint8_t expected[2][CHAIN_BYTES];
	uint64_t frames[2];
	int bad, reentered;
};

static void stream_input(uint32_t stream, uint8_t *in)
{
	for (int i = 0; i < CHAIN_BYTES; i++)
		in[i] = (uint8_t)(stream == 0 ? i ^ 0x5a : i * 3);
}

static void preprocess(void *user, uint32_t stream, uint64_t frame, udma_frame_input *in)
{
	struct run *r = user;
	uint8_t bytes[CHAIN_BYTES];
	stream_input(stream, bytes);
	if (stream > 1 || in->frame != frame ||
	    udma_frame_input_write(in, 0, bytes, sizeof bytes) != UDMA_OK)
		r->bad++;
}

static void postprocess(void *user, uint32_t stream, const udma_frame_output *out)
{
	struct run *r = user;
	uint8_t got[CHAIN_BYTES];
	if (stream > 1 || out->status != 0 || out->len != CHAIN_BYTES ||
	    udma_frame_output_read(out, 0, got, sizeof got) != UDMA_OK ||
	    memcmp(got, r->expected[stream], sizeof got) != 0) {
		r->bad++;
		return;
	}
	r->frames[stream]++;
	if (udma_streams_run(r->streams, 1000, NULL, NULL, NULL, NULL, 0, NULL) == UDMA_ERR_BUSY)
		r->reentered++;
}

static void test_streams(void)
{
	udma_loopback_options lo = {.size = sizeof lo, .cost_model = UDMA_COST_ZERO,
				    .memory_bytes = 4 << 20, .queues = 6};
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(&lo, &dev));
	udma_model *m = chain();
	struct run r = {0};
	for (uint32_t s = 0; s < 2; s++) {
		uint8_t in[CHAIN_BYTES];
		stream_input(s, in);
		OK(udma_model_expected(m, in, CHAIN_BYTES, r.expected[s], CHAIN_BYTES));
	}
	udma_pipeline *p[2] = {NULL, NULL};
	for (uint32_t s = 0; s < 2; s++) {
		udma_pipeline_options o = {.size = sizeof o, .queue = 3 * s, .context = s + 1};
		OK(udma_pipeline_create(dev, m, &o, &p[s]));
	}
	udma_stream_options so[2] = {
		{.size = sizeof(udma_stream_options), .name = "live", .pipeline = p[0],
		 .period_ns = 5000000, .priority = 1},
		{.size = sizeof(udma_stream_options), .name = "playback", .pipeline = p[1],
		 .max_wait_ns = 50000000},
	};
	udma_streams_options opts = {.size = sizeof opts, .policy = UDMA_POLICY_BATCH, .batch_k = 2};
	udma_streams *st = NULL;

	FAILS(udma_streams_create(&opts, so, 0, &st), UDMA_ERR_INVALID_ARGUMENT, "count is 0");
	FAILS(udma_streams_create(&opts, so, 65, &st), UDMA_ERR_INVALID_ARGUMENT, "count is 65");
	FAILS(udma_streams_create(&opts, NULL, 2, &st), UDMA_ERR_INVALID_ARGUMENT, "streams is NULL");
	FAILS(udma_streams_create(&opts, so, 2, NULL), UDMA_ERR_INVALID_ARGUMENT, "out is NULL");
	so[1].name = "live";
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[0] and streams[1] are both named \"live\"");
	so[1].name = NULL;
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[1].name is NULL");
	so[1].name = "";
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[1].name is empty");
	so[1].name = "playback";
	so[1].priority = 300;
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[1].priority is 300");
	so[1].priority = 0;
	so[1].pipeline = p[0];
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[1].pipeline is listed twice");
	so[1].pipeline = (udma_pipeline *)(void *)m;
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_HANDLE,
	      "streams[1].pipeline: ");
	so[1].pipeline = p[1];
	so[0].size = 4;
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT,
	      "streams[0].size is 4");
	so[0].size = sizeof(udma_stream_options);
	udma_streams_options bad = {.size = sizeof bad, .policy = 9};
	FAILS(udma_streams_create(&bad, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT, "policy 9");
	bad = (udma_streams_options){.size = sizeof bad, .policy = UDMA_POLICY_BATCH};
	FAILS(udma_streams_create(&bad, so, 2, &st), UDMA_ERR_INVALID_ARGUMENT, "batch_k 0");
	uint8_t in[CHAIN_BYTES];
	stream_input(0, in);
	OK(udma_pipeline_submit(p[0], in, sizeof in, NULL));
	FAILS(udma_streams_create(&opts, so, 2, &st), UDMA_ERR_BUSY,
	      "streams[0]: the pipeline on loopback0 queue 0 has 1 frames in flight");
	size_t n = 0;
	struct frames f = {.pipeline = p[0]};
	memcpy(f.expected[0], r.expected[0], CHAIN_BYTES);
	OK(udma_pipeline_wait(p[0], take_frame, &f, &n));
	CHECK(n == 1);
	/* Refused: the pipelines are still the caller's. */
	udma_pipeline_info pi = {.size = sizeof pi};
	OK(udma_pipeline_get_info(p[1], &pi));

	OK(udma_streams_create(&opts, so, 2, &st));
	r.streams = st;
	FAILS(udma_pipeline_get_info(p[0], &pi), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	FAILS(udma_pipeline_destroy(p[1]), UDMA_ERR_INVALID_HANDLE, "destroyed already");

	udma_stream_report rep[2] = {{.size = sizeof(udma_stream_report)},
				     {.size = sizeof(udma_stream_report)}};
	udma_run_report run = {.size = sizeof run};
	OK(udma_streams_run(st, 200000000, preprocess, postprocess, &r, rep, 2, &run));
	CHECK(r.bad == 0);
	CHECK(rep[0].frames == r.frames[0] && rep[1].frames == r.frames[1]);
	/* At most 40 at 5 ms over 200 ms (plus one at 0); Valgrind may run far fewer. */
	CHECK(rep[0].frames >= 1 && rep[0].frames <= 41);
	CHECK(rep[1].frames > 0 && rep[0].failed == 0 && rep[1].failed == 0);
	CHECK(rep[0].fps > 0 && rep[0].latency_p99_ns >= rep[0].latency_p50_ns);
	CHECK(rep[0].latency_max_ns >= rep[0].latency_p99_ns && rep[0].max_wait_ns > 0);
	CHECK(run.seconds >= 0.2 && run.decisions == rep[0].frames + rep[1].frames);
	CHECK(run.faults == 0 && run.removals == 0 && run.quarantines == 0 && rep[0].lost == 0 && rep[1].lost == 0);
	CHECK(r.reentered == (int)(r.frames[0] + r.frames[1]));
	FAILS(udma_streams_run(st, 1000, NULL, NULL, NULL, rep, 1, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "count is 1 but there are 2 streams");
	FAILS(udma_streams_run(st, 1000, NULL, NULL, NULL, NULL, 2, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "reports is NULL");
	rep[1].size = 2;
	FAILS(udma_streams_run(st, 1000, NULL, NULL, NULL, rep, 2, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "reports[1]");
	/* No callbacks, no reports: the frames run on whatever the slots hold. */
	OK(udma_streams_run(st, 10000000, NULL, NULL, NULL, NULL, 0, NULL));
	FAILS(udma_streams_run(NULL, 1000, NULL, NULL, NULL, NULL, 0, NULL), UDMA_ERR_INVALID_HANDLE,
	      "udma_streams_create");
	OK(udma_streams_destroy(st));
	FAILS(udma_streams_destroy(st), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	OK(udma_model_destroy(m));
	OK(udma_device_close(dev));
}

int main(void)
{
	static const struct check_test tests[] = {
		{"version", test_version},
		{"device_loopback", test_device_loopback},
		{"device_options", test_device_options},
		{"device_pci", test_device_pci},
		{"handles", test_handles},
		{"mapping", test_mapping},
		{"pool", test_pool},
		{"round_trip", test_round_trip},
		{"submit_errors", test_submit_errors},
		{"device_ops", test_device_ops},
		{"wait_many_and_epoll", test_wait_many_and_epoll},
		{"queue_interrupt_fd_closed_by_caller", test_queue_interrupt_fd_closed_by_caller},
		{"destroy_with_work_in_flight", test_destroy_with_work_in_flight},
		{"device_removal", test_device_removal},
		{"threads", test_threads},
		{"destroy_racing_alloc", test_destroy_racing_alloc},
		{"plan", test_plan},
		{"plan_inplace", test_plan_inplace},
		{"model", test_model},
		{"pipeline", test_pipeline},
		{"pipeline_kept_view_pointers", test_pipeline_kept_view_pointers},
		{"streams", test_streams},
	};
	return check_run(tests, sizeof tests / sizeof tests[0]);
}
