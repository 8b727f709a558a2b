/* A pipeline on an engine written in C (memory_engine.h: one copy engine over host memory, no
 * compute): the library gives it pools, slots, the frame loop and the host steps; every
 * result is checked against the model run on the host.
 *
 *   cc -std=c11 memory_engine.c $(pkg-config --cflags --libs userdma) && ./a.out [frames]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory_engine.h"

#define TRY(call)                                                                          \
	do {                                                                                   \
		enum udma_status s_ = (call);                                                      \
		if (s_ != UDMA_OK) {                                                               \
			fprintf(stderr, "%s: %s\n", udma_status_name(s_), udma_last_error());          \
			return EXIT_FAILURE;                                                           \
		}                                                                                  \
	} while (0)

enum { BYTES = 4096, PATTERNS = 4 };

struct check {
	uint8_t expected[PATTERNS][BYTES];
	uint64_t right, wrong;
};

static void input_of(uint64_t frame, uint8_t *in)
{
	for (int i = 0; i < BYTES; i++)
		in[i] = (uint8_t)(i * 7 + (int)(frame % PATTERNS) * 31);
}

static void take(void *user, const udma_frame_output *out)
{
	struct check *c = user;
	uint8_t got[BYTES];
	if (out->status == 0 && udma_frame_output_read(out, 0, got, sizeof got) == UDMA_OK &&
	    memcmp(got, c->expected[out->frame % PATTERNS], BYTES) == 0)
		c->right++;
	else
		c->wrong++;
}

int main(int argc, char **argv)
{
	uint64_t frames = argc > 1 ? strtoull(argv[1], NULL, 10) : 64;
	struct memory_engine state;
	memory_engine_init(&state);
	udma_engine_ops ops = memory_engine_ops(0);
	udma_engine *engine;
	TRY(udma_engine_create(NULL, &ops, &state, &engine));
	udma_model *model;
	TRY(udma_model_create_chain(3, BYTES, &model));
	static struct check c;
	for (int k = 0; k < PATTERNS; k++) {
		uint8_t in[BYTES];
		input_of((uint64_t)k, in);
		TRY(udma_model_expected(model, in, BYTES, c.expected[k], BYTES));
	}
	udma_pipeline_options o = {.size = sizeof o, .depth = 3, .batch = 2};
	udma_pipeline *p;
	TRY(udma_pipeline_create_on_engine(engine, model, &o, &p));
	TRY(udma_engine_destroy(engine)); /* the pipeline keeps it */
	for (uint64_t n = 0; n < frames;) {
		uint8_t in[BYTES];
		input_of(n, in);
		enum udma_status s = udma_pipeline_submit(p, in, BYTES, NULL);
		if (s == UDMA_OK) {
			n++;
			continue;
		}
		if (s != UDMA_ERR_BUSY)
			TRY(s);
		TRY(udma_pipeline_wait(p, take, &c, NULL));
	}
	while (c.right + c.wrong < frames)
		TRY(udma_pipeline_wait(p, take, &c, NULL));
	udma_pipeline_info info = {.size = sizeof info};
	TRY(udma_pipeline_get_info(p, &info));
	TRY(udma_pipeline_destroy(p));
	TRY(udma_model_destroy(model));
	printf("memory engine: %llu frames, %llu right, %llu wrong; compute %s, %llu steps on the "
	       "host; engine released %d time(s)\n",
	       (unsigned long long)frames, (unsigned long long)c.right, (unsigned long long)c.wrong,
	       info.compute == UDMA_COMPUTE_HOST ? "on the host" : "on the device",
	       (unsigned long long)info.host_steps, state.destroyed);
	return c.wrong == 0 && c.right == frames && state.destroyed == 1 ? EXIT_SUCCESS
									   : EXIT_FAILURE;
}
