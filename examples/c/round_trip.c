/* A transfer round trip through the C API on the loopback device: a pool, a queue, a buffer
 * of known bytes to device memory and back into a second buffer, every byte checked.
 *
 *   cc -std=c11 round_trip.c $(pkg-config --cflags --libs userdma) && ./a.out
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <userdma.h>

#define TRY(call)                                                                          \
	do {                                                                                   \
		enum udma_status s_ = (call);                                                      \
		if (s_ != UDMA_OK) {                                                               \
			fprintf(stderr, "%s: %s\n", udma_status_name(s_), udma_last_error());          \
			return EXIT_FAILURE;                                                           \
		}                                                                                  \
	} while (0)

enum { LEN = 1 << 20, ROUNDS = 8 };

int main(void)
{
	if (udma_version() >> 16 != UDMA_VERSION_MAJOR) {
		fprintf(stderr, "built against userdma %d.x, running with %s\n", UDMA_VERSION_MAJOR,
			udma_version_string());
		return EXIT_FAILURE;
	}
	udma_loopback_options lo = {.size = sizeof lo, .cost_model = UDMA_COST_NPU};
	udma_device *dev;
	TRY(udma_device_open_loopback(&lo, &dev));
	udma_pool_options po = {.size = sizeof po, .bytes = 8 << 20};
	udma_pool *pool;
	TRY(udma_pool_create(dev, &po, &pool));
	udma_queue *queue;
	TRY(udma_queue_create(dev, NULL, &queue));

	udma_buffer *out, *in;
	TRY(udma_pool_alloc(pool, LEN, &out));
	TRY(udma_pool_alloc(pool, LEN, &in));
	udma_buffer_info oi = {.size = sizeof oi}, ii = {.size = sizeof ii};
	TRY(udma_buffer_get_info(out, &oi));
	TRY(udma_buffer_get_info(in, &ii));

	size_t checked = 0;
	for (unsigned round = 0; round < ROUNDS; round++) {
		unsigned char *src = oi.host, *dst = ii.host;
		for (size_t i = 0; i < LEN; i++)
			src[i] = (unsigned char)(i * 131u + round);
		memset(dst, 0, LEN);
		/* Both ops in one batch, one doorbell: the queue runs them in order. */
		udma_op h2d = {.size = sizeof h2d, .opcode = UDMA_OP_TO_DEVICE, .buffer = out,
			       .device_offset = 0, .len = LEN, .user_data = 1};
		udma_op d2h = {.size = sizeof d2h, .opcode = UDMA_OP_TO_HOST, .buffer = in,
			       .device_offset = 0, .len = LEN, .user_data = 2};
		TRY(udma_queue_push(queue, &h2d));
		TRY(udma_queue_push(queue, &d2h));
		TRY(udma_queue_flush(queue));
		/* The buffers are the device's until their completions hand them back. */
		for (int n = 0; n < 2; n++) {
			udma_completion c = {.size = sizeof c};
			TRY(udma_queue_wait(queue, 5000000000ull, &c));
			if (c.status != 0) {
				fprintf(stderr, "op %llu failed on the device: %s\n",
					(unsigned long long)c.user_data, udma_op_status_name(c.status));
				return EXIT_FAILURE;
			}
		}
		for (size_t i = 0; i < LEN; i++) {
			if (dst[i] != (unsigned char)(i * 131u + round)) {
				fprintf(stderr, "round %u: byte %zu is %u\n", round, i, dst[i]);
				return EXIT_FAILURE;
			}
		}
		checked += LEN;
	}
	udma_pool_stats st = {.size = sizeof st};
	TRY(udma_pool_get_stats(pool, &st));
	printf("userdma %s: %u round trips of %d bytes through %s queue 0, %zu bytes checked, "
	       "%llu buffers in use\n",
	       udma_version_string(), ROUNDS, LEN, "loopback0", checked,
	       (unsigned long long)st.in_use);

	TRY(udma_pool_free(pool, out));
	TRY(udma_pool_free(pool, in));
	TRY(udma_queue_destroy(queue));
	TRY(udma_pool_destroy(pool));
	TRY(udma_device_close(dev));
	return EXIT_SUCCESS;
}
