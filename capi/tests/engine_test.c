/* Engines written in C (udma_engine_ops): a pipeline on one, every result checked, with its
 * steps on the host; streams over it and the loopback device in one run; bad tables refused
 * by name; an engine that breaks its contract (completions out of order, a failed op, a full
 * queue) reported as errors, never a crash; the engine's destroy called once, last. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "check.h"
#include "../../examples/c/memory_engine.h"

enum { BYTES = 256 };

static udma_model *model(void)
{
	udma_model *m = NULL;
	OK(udma_model_create_chain(3, BYTES, &m));
	return m;
}

static void input_of(uint32_t stream, uint64_t frame, uint8_t *in)
{
	for (int i = 0; i < BYTES; i++)
		in[i] = (uint8_t)(i * 3 + (int)stream * 101 + (int)(frame % 2) * 17);
}

struct seen {
	uint8_t expected[2][2][BYTES]; /* [stream][frame % 2] */
	uint64_t right[2];
	int bad;
	uint32_t status;
};

static void take(void *user, const udma_frame_output *out)
{
	struct seen *s = user;
	uint8_t got[BYTES];
	if (out->status != 0) {
		s->status = out->status;
		s->bad++;
		return;
	}
	if (udma_frame_output_read(out, 0, got, sizeof got) != UDMA_OK ||
	    memcmp(got, s->expected[0][out->frame % 2], BYTES) != 0)
		s->bad++;
	else
		s->right[0]++;
}

static void expect(udma_model *m, struct seen *s)
{
	for (uint32_t stream = 0; stream < 2; stream++)
		for (uint64_t f = 0; f < 2; f++) {
			uint8_t in[BYTES];
			input_of(stream, f, in);
			OK(udma_model_expected(m, in, BYTES, s->expected[stream][f], BYTES));
		}
}

static void test_bad_tables(void)
{
	struct memory_engine e;
	memory_engine_init(&e);
	udma_engine *engine = NULL;
	udma_engine_ops ops = memory_engine_ops(0);
	ops.poll = NULL;
	FAILS(udma_engine_create(NULL, &ops, &e, &engine), UDMA_ERR_INVALID_ARGUMENT,
	      "ops->poll is NULL");
	ops = memory_engine_ops(0);
	ops.flags = 1u << 20;
	FAILS(udma_engine_create(NULL, &ops, &e, &engine), UDMA_ERR_INVALID_ARGUMENT,
	      "not UDMA_ENGINE_* flags");
	ops = memory_engine_ops(0);
	ops.queues = 0;
	FAILS(udma_engine_create(NULL, &ops, &e, &engine), UDMA_ERR_INVALID_ARGUMENT,
	      "ops->queues is 0");
	ops = memory_engine_ops(0);
	ops.size = 4;
	FAILS(udma_engine_create(NULL, &ops, &e, &engine), UDMA_ERR_INVALID_ARGUMENT,
	      "ops->size is 4");
	FAILS(udma_engine_create(NULL, NULL, &e, &engine), UDMA_ERR_INVALID_ARGUMENT, "ops is NULL");
	ops = memory_engine_ops(0);
	FAILS(udma_engine_create(NULL, &ops, &e, NULL), UDMA_ERR_INVALID_ARGUMENT,
	      "engine is NULL");
	CHECK(e.destroyed == 0); /* nothing was made: nothing to release */
	FAILS(udma_engine_destroy(NULL), UDMA_ERR_INVALID_HANDLE, "");
}

static void test_pipeline_on_engine(void)
{
	struct memory_engine e;
	memory_engine_init(&e);
	udma_engine_ops ops = memory_engine_ops(0);
	udma_engine *engine = NULL;
	OK(udma_engine_create(NULL, &ops, &e, &engine));
	udma_model *m = model();
	static struct seen s;
	memset(&s, 0, sizeof s);
	expect(m, &s);

	/* What the engine cannot do is refused by name. */
	udma_pipeline *p = NULL;
	udma_pipeline_options o = {.size = sizeof o, .queue = 4};
	FAILS(udma_pipeline_create_on_engine(engine, m, &o, &p), UDMA_ERR_NOT_FOUND, "queue");

	for (uint32_t results = 0; results < 3; results++) {
		o = (udma_pipeline_options){.size = sizeof o, .depth = 2, .results = results};
		OK(udma_pipeline_create_on_engine(engine, m, &o, &p));
		uint64_t frames = 0;
		while (frames < 8) {
			uint8_t in[BYTES];
			input_of(0, frames, in);
			enum udma_status st = udma_pipeline_submit(p, in, BYTES, NULL);
			if (st == UDMA_OK)
				frames++;
			else if (st == UDMA_ERR_BUSY)
				OK(udma_pipeline_wait(p, take, &s, NULL));
			else
				OK(st);
		}
		udma_pipeline_info info = {.size = sizeof info};
		do {
			OK(udma_pipeline_wait(p, take, &s, NULL));
			OK(udma_pipeline_get_info(p, &info));
		} while (info.in_flight > 0 && check_failures == 0);
		CHECK(info.frames == 8 && info.failed == 0);
		CHECK(info.compute == UDMA_COMPUTE_HOST && info.host_steps == 8 * 3);
		if (results != UDMA_RESULTS_AUTO)
			CHECK(info.in_place == (results == UDMA_RESULTS_IN_PLACE));
		OK(udma_pipeline_destroy(p));
	}
	CHECK(s.bad == 0 && s.right[0] == 24);

	/* Without READ_IN_PLACE, in-place results are refused, naming the capability. */
	udma_engine *copy_only = NULL;
	struct memory_engine e2;
	memory_engine_init(&e2);
	ops = memory_engine_ops(0);
	ops.flags = 0;
	OK(udma_engine_create(NULL, &ops, &e2, &copy_only));
	o = (udma_pipeline_options){.size = sizeof o, .results = UDMA_RESULTS_IN_PLACE};
	FAILS(udma_pipeline_create_on_engine(copy_only, m, &o, &p), UDMA_ERR_INVALID_ARGUMENT,
	      "arena the host can read in place");
	OK(udma_engine_destroy(copy_only));
	CHECK(e2.destroyed == 1);

	/* A failed op fails its frame only. */
	o = (udma_pipeline_options){.size = sizeof o, .depth = 1, .results = UDMA_RESULTS_COPY};
	OK(udma_pipeline_create_on_engine(engine, m, &o, &p));
	e.fail_op = e.ops_run + 1;
	uint8_t in[BYTES];
	input_of(0, 0, in);
	OK(udma_pipeline_submit(p, in, BYTES, NULL));
	OK(udma_pipeline_wait(p, take, &s, NULL));
	CHECK(s.bad == 1 && s.status == MEMORY_ENGINE_INJECTED);
	input_of(0, 1, in); /* frame 1 */
	OK(udma_pipeline_submit(p, in, BYTES, NULL));
	OK(udma_pipeline_wait(p, take, &s, NULL));
	CHECK(s.bad == 1 && s.right[0] == 25);

	/* A full queue is the engine's UDMA_ERR_EXHAUSTED, with its name. */
	e.submit_full = 1;
	FAILS(udma_pipeline_submit(p, in, BYTES, NULL), UDMA_ERR_EXHAUSTED,
	      "memory-engine: the engine's submit returned 5");
	e.submit_full = 0;

	/* Completions out of order break the queue: an error, never a crash. */
	e.misorder = 1;
	OK(udma_pipeline_submit(p, in, BYTES, NULL));
	FAILS(udma_pipeline_wait(p, take, &s, NULL), UDMA_ERR_DEVICE, "a queue completes in order");
	e.misorder = 0;
	/* Destroying drains what is in flight, which the broken queue cannot: it says so, and
	 * the handle is gone all the same. */
	FAILS(udma_pipeline_destroy(p), UDMA_ERR_DEVICE, "a queue completes in order");
	FAILS(udma_pipeline_destroy(p), UDMA_ERR_INVALID_HANDLE, "destroyed already");

	OK(udma_engine_destroy(engine));
	FAILS(udma_engine_destroy(engine), UDMA_ERR_INVALID_HANDLE, "destroyed already");
	CHECK(e.destroyed == 1);
	OK(udma_model_destroy(m));
}

struct mix {
	uint8_t expected[2][BYTES];
	uint64_t frames[2];
	int bad;
};

static void mix_in(void *user, uint32_t stream, uint64_t frame, udma_frame_input *in)
{
	(void)user;
	(void)frame;
	uint8_t bytes[BYTES];
	input_of(stream, 0, bytes);
	OK(udma_frame_input_write(in, 0, bytes, BYTES));
}

static void mix_out(void *user, uint32_t stream, const udma_frame_output *out)
{
	struct mix *x = user;
	uint8_t got[BYTES];
	if (stream > 1 || out->status != 0 ||
	    udma_frame_output_read(out, 0, got, sizeof got) != UDMA_OK ||
	    memcmp(got, x->expected[stream], BYTES) != 0) {
		x->bad++;
		return;
	}
	x->frames[stream]++;
}

static void test_streams_over_an_engine_and_the_loopback_device(void)
{
	udma_device *dev = loopback();
	struct memory_engine e;
	memory_engine_init(&e);
	udma_engine_ops ops = memory_engine_ops(0);
	udma_engine *engine = NULL;
	OK(udma_engine_create(NULL, &ops, &e, &engine));
	udma_model *m = model();
	struct mix x = {0};
	for (uint32_t stream = 0; stream < 2; stream++) {
		uint8_t in[BYTES];
		input_of(stream, 0, in);
		OK(udma_model_expected(m, in, BYTES, x.expected[stream], BYTES));
	}
	udma_pipeline *p[2] = {NULL, NULL};
	udma_pipeline_options o = {.size = sizeof o, .context = 1};
	OK(udma_pipeline_create(dev, m, &o, &p[0]));
	o.context = 2;
	OK(udma_pipeline_create_on_engine(engine, m, &o, &p[1]));
	udma_stream_options so[2] = {
		{.size = sizeof(udma_stream_options), .name = "npu", .pipeline = p[0]},
		{.size = sizeof(udma_stream_options), .name = "engine", .pipeline = p[1]},
	};
	udma_streams_options opts = {.size = sizeof opts, .policy = UDMA_POLICY_ROUND_ROBIN};
	udma_streams *st = NULL;
	OK(udma_streams_create(&opts, so, 2, &st));
	udma_stream_report rep[2] = {{.size = sizeof(udma_stream_report)},
				     {.size = sizeof(udma_stream_report)}};
	udma_run_report run = {.size = sizeof run};
	OK(udma_streams_run(st, 200000000, mix_in, mix_out, &x, rep, 2, &run));
	CHECK(x.bad == 0 && x.frames[0] > 0 && x.frames[1] > 0);
	CHECK(rep[0].frames == x.frames[0] && rep[1].frames == x.frames[1]);
	OK(udma_streams_destroy(st));
	OK(udma_engine_destroy(engine));
	CHECK(e.destroyed == 1);
	OK(udma_model_destroy(m));
	OK(udma_device_close(dev));
}

/* An allocator that hands out an arena ending past 2^64 (256-byte aligned), or an unaligned
 * one: what the next call gets is in `bad_at`. */
static uint64_t bad_at;

static int bad_alloc_arena(void *user, uint64_t bytes, uint64_t align, uint64_t *at)
{
	(void)user;
	(void)bytes;
	(void)align;
	*at = bad_at;
	return 0;
}

static void test_an_arena_past_2_64_or_unaligned_is_the_engines_error(void)
{
	struct memory_engine e;
	memory_engine_init(&e);
	udma_engine_ops ops = memory_engine_ops(0);
	ops.alloc_arena = bad_alloc_arena;
	udma_engine *engine = NULL;
	OK(udma_engine_create(NULL, &ops, &e, &engine));
	udma_model *m = model();
	udma_pipeline *p = NULL;
	udma_pipeline_options o = {.size = sizeof o, .depth = 2};
	bad_at = UINT64_MAX - 255;
	FAILS(udma_pipeline_create_on_engine(engine, m, &o, &p), UDMA_ERR_DEVICE,
	      "no room for");
	bad_at = 3;
	FAILS(udma_pipeline_create_on_engine(engine, m, &o, &p), UDMA_ERR_DEVICE,
	      "not aligned to 256 bytes");
	CHECK(p == NULL);
	OK(udma_model_destroy(m));
	OK(udma_engine_destroy(engine));
	CHECK(e.destroyed == 1);
}

int main(void)
{
	static const struct check_test tests[] = {
		{"bad_tables", test_bad_tables},
		{"an_arena_past_2_64_or_unaligned_is_the_engines_error",
		 test_an_arena_past_2_64_or_unaligned_is_the_engines_error},
		{"pipeline_on_engine", test_pipeline_on_engine},
		{"streams_over_an_engine_and_the_loopback_device",
		 test_streams_over_an_engine_and_the_loopback_device},
	};
	return check_run(tests, sizeof tests / sizeof tests[0]);
}
