/* Two video streams on one NPU through the C API, the way an SDK wires them: a live camera at
 * 25 FPS with high priority and a recorded video played back as fast as the device allows,
 * both running the YOLOv5s-like model through double-buffered pipelines, each in its own
 * device context, under priority scheduling with batch switching (K = 4) and a maximum wait
 * for the live stream. Every frame's result is checked against the model's expected output,
 * computed on the host. On the loopback device with its NPU cost model.
 *
 *   cc two_streams.c $(pkg-config --cflags --libs userdma) && ./a.out [milliseconds]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userdma.h"

#define TRY(call)                                                                          \
	do {                                                                                   \
		enum udma_status try_status_ = (call);                                             \
		if (try_status_ != UDMA_OK) {                                                      \
			fprintf(stderr, "%s: %s\n", udma_status_name(try_status_), udma_last_error()); \
			exit(EXIT_FAILURE);                                                            \
		}                                                                                  \
	} while (0)

enum { STREAMS = 2 };

struct app {
	uint64_t input_bytes, result_bytes;
	uint8_t *input[STREAMS];    /* each stream's frame (a camera or decoder would fill it) */
	uint8_t *expected[STREAMS]; /* the model's output for it */
	uint8_t *result;            /* a frame's result, read back */
	uint64_t checked[STREAMS], wrong, detections;
};

static void preprocess(void *user, uint32_t stream, uint64_t frame, udma_frame_input *in)
{
	struct app *a = user;
	(void)frame;
	/* Straight into the slot's DMA buffer. */
	if (udma_frame_input_write(in, 0, a->input[stream], a->input_bytes) != UDMA_OK)
		a->wrong++;
}

static void postprocess(void *user, uint32_t stream, const udma_frame_output *out)
{
	struct app *a = user;
	if (out->status != 0) {
		fprintf(stderr, "stream %" PRIu32 " frame %" PRIu64 ": step %" PRIu32 " failed: %s\n",
			stream, out->frame, out->step, udma_op_status_name(out->status));
		a->wrong++;
		return;
	}
	if (out->len != a->result_bytes ||
	    udma_frame_output_read(out, 0, a->result, a->result_bytes) != UDMA_OK ||
	    memcmp(a->result, a->expected[stream], a->result_bytes) != 0) {
		fprintf(stderr, "stream %" PRIu32 " frame %" PRIu64 ": result differs\n", stream,
			out->frame);
		a->wrong++;
		return;
	}
	uint32_t count;
	memcpy(&count, a->result, sizeof count); /* the filter's count header */
	a->detections += count;
	a->checked[stream]++;
}

int main(int argc, char **argv)
{
	uint64_t ms = argc > 1 ? strtoull(argv[1], NULL, 10) : 1500;
	udma_loopback_options lo = {.size = sizeof lo, .cost_model = UDMA_COST_NPU, .queues = 6,
				    .memory_bytes = 64 << 20};
	udma_device *dev = NULL;
	TRY(udma_device_open_loopback(&lo, &dev));
	udma_model *model = NULL;
	TRY(udma_model_create_yolov5s(300, &model));
	udma_model_info mi = {.size = sizeof mi};
	TRY(udma_model_get_info(model, &mi));

	struct app a = {.input_bytes = mi.input_bytes, .result_bytes = mi.result_bytes};
	a.result = malloc(mi.result_bytes);
	for (int s = 0; s < STREAMS; s++) {
		a.input[s] = malloc(mi.input_bytes);
		a.expected[s] = malloc(mi.result_bytes);
		if (!a.result || !a.input[s] || !a.expected[s])
			return EXIT_FAILURE;
		for (uint64_t i = 0; i < mi.input_bytes; i++)
			a.input[s][i] = (uint8_t)((i * (s ? 131u : 31u)) >> 3);
		TRY(udma_model_expected(model, a.input[s], mi.input_bytes, a.expected[s],
					mi.result_bytes));
	}

	/* Each stream: its own three queues in its own context, with its working set in device
	 * SRAM (the shared weights and about 2.4 MB of hot activations). */
	const char *names[STREAMS] = {"live", "playback"};
	udma_stream_options so[STREAMS];
	for (uint32_t s = 0; s < STREAMS; s++) {
		udma_pipeline_options po = {.size = sizeof po, .depth = 2, .queue = 3 * s,
					    .context = s + 1, .working_set_private = 2400000,
					    .working_set_shared = 7225885};
		udma_pipeline *p = NULL;
		TRY(udma_pipeline_create(dev, model, &po, &p));
		so[s] = (udma_stream_options){.size = sizeof so[s], .name = names[s], .pipeline = p};
	}
	so[0].priority = 1;
	so[0].period_ns = 40000000;     /* 25 FPS */
	so[0].max_wait_ns = 100000000;  /* a live frame waits at most 100 ms for the device */
	so[1].period_ns = 0;            /* as fast as possible */
	udma_streams_options opts = {.size = sizeof opts, .policy = UDMA_POLICY_BATCH, .batch_k = 4};
	udma_streams *streams = NULL;
	TRY(udma_streams_create(&opts, so, STREAMS, &streams));

	udma_stream_report rep[STREAMS];
	for (int s = 0; s < STREAMS; s++)
		rep[s] = (udma_stream_report){.size = sizeof rep[s]};
	udma_run_report run = {.size = sizeof run};
	TRY(udma_streams_run(streams, ms * 1000000, preprocess, postprocess, &a, rep, STREAMS, &run));

	printf("userdma %s: batch K=4, %.2f s, %" PRIu64 " switches, %" PRIu64 " detections\n",
	       udma_version_string(), run.seconds, run.switches, a.detections);
	for (int s = 0; s < STREAMS; s++)
		printf("  %-9s %5.1f FPS  latency mean %6.1f ms  p99 %6.1f ms  longest wait %6.1f ms"
		       "  %" PRIu64 " frames checked\n",
		       names[s], rep[s].fps, rep[s].latency_mean_ns / 1e6,
		       (double)rep[s].latency_p99_ns / 1e6, (double)rep[s].max_wait_ns / 1e6,
		       a.checked[s]);
	int ok = a.wrong == 0;
	for (int s = 0; s < STREAMS; s++)
		ok = ok && rep[s].frames > 0 && rep[s].failed == 0 && a.checked[s] == rep[s].frames;
	TRY(udma_streams_destroy(streams));
	TRY(udma_model_destroy(model));
	TRY(udma_device_close(dev));
	for (int s = 0; s < STREAMS; s++) {
		free(a.input[s]);
		free(a.expected[s]);
	}
	free(a.result);
	if (!ok) {
		fprintf(stderr, "%" PRIu64 " frames wrong\n", a.wrong);
		return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}
