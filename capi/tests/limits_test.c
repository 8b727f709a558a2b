/* What a new user hit through the C API, each a test that failed before its fix:
 *   - a queue filled with ops, its completions all taken, refused the next push for a while;
 *   - a small pool starved a thread whose freed buffers sat in another thread's cache;
 *   - an absurd size aborted the process instead of returning a status;
 *   - a queue depth above the device's largest was reported as a device fault and left the
 *     queue faulted. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include <sched.h>
#include <stdlib.h>

#include "check.h"

/* Under Valgrind (scripts/capi-test.sh sets UDMA_TEST_VALGRIND), which runs one thread at a
 * time and every instruction some fifty times slower, the loops run a few rounds: what they
 * check there is memory safety, which a few rounds show as well as many. */
static int rounds(int full, int valgrind)
{
	return getenv("UDMA_TEST_VALGRIND") ? valgrind : full;
}

/* A loopback device whose queues take at most `max_depth` entries. */
static udma_device *device_with_depth(uint32_t max_depth)
{
	udma_loopback_options o = {.size = sizeof o, .cost_model = UDMA_COST_ZERO,
				   .memory_bytes = 1 << 20, .queues = 4, .max_depth = max_depth};
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(&o, &dev));
	return dev;
}

/* Fills a queue of every depth with no-ops, rings once, takes every completion: the next push
 * must be taken at once, every cycle. */
static void test_full_ring_takes_the_next_push_at_once(void)
{
	udma_device *dev = device_with_depth(4096);
	const uint32_t depths[] = {2, 8, 64, 256};
	for (size_t d = 0; d < sizeof depths / sizeof depths[0]; d++) {
		udma_queue_options qo = {.size = sizeof qo, .index = 1, .depth = depths[d]};
		udma_queue *q = NULL;
		OK(udma_queue_create(dev, &qo, &q));
		int refused = 0;
		const int cycles = rounds(100, 3);
		for (int cycle = 0; cycle < cycles && !refused; cycle++) {
			for (uint32_t i = 0; i < depths[d]; i++) {
				udma_op op = {.size = sizeof op, .opcode = UDMA_OP_NOP, .user_data = i};
				enum udma_status s = udma_queue_push(q, &op);
				if (s != UDMA_OK) {
					fprintf(stderr, "depth %u, cycle %d, push %u: %s: %s\n", depths[d],
						cycle, i, udma_status_name(s), udma_last_error());
					refused = 1;
					break;
				}
			}
			if (refused)
				break;
			OK(udma_queue_flush(q));
			for (uint32_t i = 0; i < depths[d]; i++) {
				udma_completion c = {.size = sizeof c};
				OK(udma_queue_wait(q, 5 * SECOND, &c));
				CHECK(c.status == 0 && c.user_data == i);
			}
			udma_queue_info info = {.size = sizeof info};
			OK(udma_queue_get_info(q, &info));
			CHECK(info.in_flight == 0);
		}
		CHECK(!refused);
		OK(udma_queue_destroy(q));
	}
	OK(udma_device_close(dev));
}

/* The handoff: this thread allocates 64 B to 16 KiB from a 4 MiB pool and hands every fourth
 * buffer to another thread, which frees it. Fewer than 40 are ever out: no allocation may
 * fail. */
struct handoff {
	udma_pool *pool;
	udma_buffer *slots[16];
	_Atomic int head, tail;
	_Atomic int done;
};

static void *freer(void *arg)
{
	struct handoff *h = arg;
	for (;;) {
		int t = atomic_load(&h->tail);
		if (t == atomic_load(&h->head)) {
			if (atomic_load(&h->done))
				return NULL;
			sched_yield();
			continue;
		}
		udma_pool_free(h->pool, h->slots[t % 16]);
		atomic_store(&h->tail, t + 1);
	}
}

static void test_a_small_pool_never_starves_a_thread_handing_buffers_over(void)
{
	udma_device *dev = device_with_depth(4096);
	struct handoff h = {.pool = pool_of(dev, 4 << 20)};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, freer, &h) == 0);
	uint32_t x = 12345;
	udma_buffer *held[8] = {0};
	int failures = 0;
	const int allocations = rounds(50000, 2000);
	for (int i = 0; i < allocations; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		uint64_t len = 64 + x % (16 << 10);
		udma_buffer *b = NULL;
		enum udma_status s = udma_pool_alloc(h.pool, len, &b);
		if (s != UDMA_OK) {
			if (failures++ == 0)
				fprintf(stderr, "allocation %d of %lu bytes: %s: %s\n", i,
					(unsigned long)len, udma_status_name(s), udma_last_error());
			continue;
		}
		if (i % 4 == 0) {
			while (atomic_load(&h.head) - atomic_load(&h.tail) >= 16)
				sched_yield();
			int head = atomic_load(&h.head);
			h.slots[head % 16] = b;
			atomic_store(&h.head, head + 1);
		} else {
			if (held[i % 8])
				OK(udma_pool_free(h.pool, held[i % 8]));
			held[i % 8] = b;
		}
	}
	atomic_store(&h.done, 1);
	CHECK(pthread_join(t, NULL) == 0);
	for (int i = 0; i < 8; i++)
		if (held[i])
			OK(udma_pool_free(h.pool, held[i]));
	CHECK(failures == 0);
	OK(udma_pool_destroy(h.pool));
	OK(udma_device_close(dev));
}

/* Sizes no host can hold are refused with a status and a message naming the limit; nothing
 * aborts, nothing is left behind. */
static void test_absurd_sizes_are_refused_with_a_status(void)
{
	udma_model *m = NULL;
	FAILS(udma_model_create_chain(UINT32_MAX, 4096, &m), UDMA_ERR_INVALID_ARGUMENT, "4096");
	FAILS(udma_model_create_chain(5000, 4096, &m), UDMA_ERR_INVALID_ARGUMENT, "steps");
	FAILS(udma_model_create_chain(1, UINT64_MAX, &m), UDMA_ERR_INVALID_ARGUMENT, "1099511627776");
	FAILS(udma_model_create_chain(3, 1ull << 62, &m), UDMA_ERR_INVALID_ARGUMENT, "a tensor");
	FAILS(udma_model_create_yolov5s(UINT32_MAX, &m), UDMA_ERR_INVALID_ARGUMENT, "25200");
	CHECK(m == NULL);
	/* The largest of each still works. */
	OK(udma_model_create_yolov5s(25200, &m));
	OK(udma_model_destroy(m));

	/* A tensor list longer than a plan takes: refused before the list is read past its
	 * first element. */
	udma_tensor one = {.size = sizeof one, .id = 1, .bytes = 64, .first = 0, .last = 0};
	udma_plan *plan = NULL;
	FAILS(udma_plan_create(&one, (size_t)1 << 40, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "1048576");
	FAILS(udma_plan_create(&one, SIZE_MAX, NULL, &plan), UDMA_ERR_INVALID_ARGUMENT,
	      "more than a plan takes");

	udma_device *dev = device_with_depth(4096);
	udma_pool *pool = pool_of(dev, 4 << 20);
	udma_buffer *b = NULL;
	/* More buffers than the pool could ever hold. */
	FAILS(udma_pool_alloc_bulk(pool, 4096, 1 << 20, &b), UDMA_ERR_EXHAUSTED, "can hold");
	FAILS(udma_pool_alloc_bulk(pool, 64, (size_t)1 << 40, &b), UDMA_ERR_INVALID_ARGUMENT,
	      "most live buffer handles");
	/* Lists longer than could ever be valid, refused before they are read. */
	FAILS(udma_pool_free_bulk(pool, &b, (size_t)1 << 40), UDMA_ERR_INVALID_ARGUMENT,
	      "more buffers than can be alive");
	udma_queue *q = NULL;
	udma_queue_options qo = {.size = sizeof qo, .index = 0, .depth = 8};
	OK(udma_queue_create(dev, &qo, &q));
	size_t ready = 0;
	FAILS(udma_queue_wait_any(&q, (size_t)1 << 32, 0, &ready), UDMA_ERR_INVALID_ARGUMENT,
	      "at most 4096");
	OK(udma_queue_destroy(q));
	/* A pool larger than the host has memory for: a status, not the OOM killer. */
	udma_pool_options po = {.size = sizeof po, .bytes = 1ull << 50};
	udma_pool *huge = NULL;
	enum udma_status s = udma_pool_create(dev, &po, &huge);
	CHECK(s == UDMA_ERR_EXHAUSTED || s == UDMA_ERR_INVALID_ARGUMENT);
	CHECK(huge == NULL);
	/* Lengths no memory has (SIZE_MAX): refused, or only the model's own sizes used, and
	 * never made into a slice. */
	udma_model *chain = NULL;
	OK(udma_model_create_chain(2, 4096, &chain));
	udma_pipeline *pl = NULL;
	OK(udma_pipeline_create(dev, chain, NULL, &pl));
	static uint8_t in[4096], out[4096], want[4096];
	memset(in, 7, sizeof in);
	FAILS(udma_pipeline_submit(pl, in, SIZE_MAX, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "longer than the model's 4096-byte input");
	OK(udma_model_expected(chain, in, sizeof in, want, sizeof want));
	OK(udma_model_expected(chain, in, SIZE_MAX, out, SIZE_MAX));
	CHECK(memcmp(out, want, sizeof out) == 0);
	OK(udma_pipeline_destroy(pl));
	OK(udma_model_destroy(chain));
	/* A struct declaring more bytes than any version of it has. */
	udma_queue_options qhuge = {.size = SIZE_MAX, .index = 0, .depth = 8};
	FAILS(udma_queue_create(dev, &qhuge, &q), UDMA_ERR_INVALID_ARGUMENT, "set it to sizeof");
	qhuge.size = 4097;
	FAILS(udma_queue_create(dev, &qhuge, &q), UDMA_ERR_INVALID_ARGUMENT, "set it to sizeof");
	OK(udma_pool_destroy(pool));
	OK(udma_device_close(dev));

	/* A loopback device with more device memory than the host has. */
	udma_loopback_options lo = {.size = sizeof lo, .cost_model = UDMA_COST_ZERO,
				    .memory_bytes = 1ull << 50};
	udma_device *big = NULL;
	s = udma_device_open_loopback(&lo, &big);
	CHECK(s == UDMA_ERR_EXHAUSTED || s == UDMA_ERR_INVALID_ARGUMENT);
	CHECK(big == NULL);
}

/* A depth above the device's largest is the caller's error, found before the device is
 * touched: a retry at the largest depth works at once. */
static void test_a_depth_above_the_devices_largest_is_an_invalid_argument(void)
{
	udma_device *dev = device_with_depth(1024);
	udma_queue *q = NULL;
	udma_queue_options qo = {.size = sizeof qo, .index = 3, .depth = 2048};
	FAILS(udma_queue_create(dev, &qo, &q), UDMA_ERR_INVALID_ARGUMENT, "1024");
	qo.depth = 8192;
	FAILS(udma_queue_create(dev, &qo, &q), UDMA_ERR_INVALID_ARGUMENT, "largest");
	CHECK(q == NULL);
	qo.depth = 1024;
	OK(udma_queue_create(dev, &qo, &q));
	udma_op op = {.size = sizeof op, .opcode = UDMA_OP_NOP};
	OK(udma_queue_submit(q, &op));
	udma_completion c = {.size = sizeof c};
	OK(udma_queue_wait(q, 5 * SECOND, &c));
	CHECK(c.status == 0);
	OK(udma_queue_destroy(q));
	OK(udma_device_close(dev));
}

int main(void)
{
	static const struct check_test tests[] = {
		{"full_ring_takes_the_next_push_at_once", test_full_ring_takes_the_next_push_at_once},
		{"a_small_pool_never_starves_a_thread_handing_buffers_over",
		 test_a_small_pool_never_starves_a_thread_handing_buffers_over},
		{"absurd_sizes_are_refused_with_a_status", test_absurd_sizes_are_refused_with_a_status},
		{"a_depth_above_the_devices_largest_is_an_invalid_argument",
		 test_a_depth_above_the_devices_largest_is_an_invalid_argument},
	};
	return check_run(tests, sizeof tests / sizeof tests[0]);
}
