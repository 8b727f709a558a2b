/* The C API's client of a device owner, against the real owner: the userdma tool's `serve`
 * (its path in USERDMA_TOOL), started and stopped by this program on a socket of its own,
 * serving the model `chain` (two layers of 16 KiB tensors) on the loopback NPU. Every frame
 * submitted completes with its tag, and its result is written (and the same for the same
 * input); a span outside the pool and an undeclared stream are refused in their completions;
 * a buffer in flight cannot be freed; bad arguments get clean errors; two forked processes,
 * each its own client, run frames at once; the owner's figures count them; and once the owner
 * is sent SIGTERM, a client hears its shutdown and its wait fails saying the owner is gone.
 * Built and run as capi_test.c is (scripts/capi-test.sh). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* The owner process and its socket. */
static pid_t owner_pid = -1;
static char dir[64];
static char socket_path[96];

/* The model the owner serves and its tensors' bytes. */
#define MODEL "chain"
#define TENSOR 16384
/* What a result buffer holds before the device writes it. */
#define FILL 0xa5

/* Starts `$USERDMA_TOOL serve` on a socket in a new directory; false if it cannot start. */
static bool start_owner(void)
{
	const char *tool = getenv("USERDMA_TOOL");
	if (tool == NULL || *tool == '\0') {
		fprintf(stderr, "owner_test: set USERDMA_TOOL to the userdma tool's path "
				"(cargo build -p userdma-cli; USERDMA_TOOL=target/debug/userdma)\n");
		return false;
	}
	snprintf(dir, sizeof dir, "/tmp/udma-owner-test-XXXXXX");
	if (mkdtemp(dir) == NULL) {
		perror("owner_test: mkdtemp");
		return false;
	}
	snprintf(socket_path, sizeof socket_path, "%s/owner.sock", dir);
	fflush(NULL);
	owner_pid = fork();
	if (owner_pid < 0) {
		perror("owner_test: fork");
		return false;
	}
	if (owner_pid == 0) {
		/* The owner goes with this program, however it ends. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		execl(tool, tool, "serve", "--loopback", "--socket", socket_path, "--model",
		      MODEL "=chain:2:16384", (char *)NULL);
		perror("owner_test: exec of USERDMA_TOOL");
		_exit(127);
	}
	return true;
}

/* Sends the owner SIGTERM and reaps it; true if it exited with status 0. */
static bool stop_owner(void)
{
	if (owner_pid <= 0)
		return true;
	kill(owner_pid, SIGTERM);
	int status = 0;
	pid_t got;
	do
		got = waitpid(owner_pid, &status, 0);
	while (got < 0 && errno == EINTR);
	owner_pid = -1;
	unlink(socket_path);
	rmdir(dir);
	return got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* A client of the owner, waiting up to 30 s for it to listen. */
static udma_owner_client *connect_owner(const char *name)
{
	udma_owner_options o = {.size = sizeof o, .pool_bytes = 4 << 20, .name = name,
				.wait_ns = 30 * SECOND};
	udma_owner_client *c = NULL;
	OK(udma_owner_connect(socket_path, &o, &c));
	return c;
}

/* Declares a stream of the model; its info in `*info`. */
static void declare(udma_owner_client *c, const char *name, udma_owner_stream_info *info)
{
	udma_owner_stream_options s = {.size = sizeof s, .name = name, .model = MODEL};
	*info = (udma_owner_stream_info){.size = sizeof *info};
	OK(udma_owner_declare(c, &s, info));
}

static udma_owner_buffer alloc(udma_owner_client *c, size_t len)
{
	udma_owner_buffer b = {.size = sizeof b};
	OK(udma_owner_alloc(c, len, &b));
	return b;
}

static void fill_input(const udma_owner_buffer *b, unsigned seed)
{
	uint8_t *p = b->host;
	for (size_t i = 0; i < b->len; i++)
		p[i] = (uint8_t)(i * 7 + seed * 13 + 1);
}

static void fill_result(const udma_owner_buffer *b)
{
	memset(b->host, FILL, b->len);
}

/* Whether the device wrote the result buffer (it no longer holds only the fill). */
static bool written(const udma_owner_buffer *b)
{
	const uint8_t *p = b->host;
	for (size_t i = 0; i < b->len; i++)
		if (p[i] != FILL)
			return true;
	return false;
}

/* Waits for a completion; status and tag in the out-parameters. */
static enum udma_status wait_one(udma_owner_client *c, udma_owner_completion *done)
{
	*done = (udma_owner_completion){.size = sizeof *done};
	return udma_owner_wait(c, 30 * SECOND, done);
}

static void test_arguments(void)
{
	udma_owner_client *c = NULL;
	FAILS(udma_owner_connect(socket_path, NULL, NULL), UDMA_ERR_INVALID_ARGUMENT, "client is NULL");
	FAILS(udma_owner_connect(NULL, NULL, &c), UDMA_ERR_INVALID_ARGUMENT, "socket is NULL");
	FAILS(udma_owner_connect("", NULL, &c), UDMA_ERR_INVALID_ARGUMENT, "path of 0 bytes");
	char longer[200];
	memset(longer, 'x', sizeof longer - 1);
	longer[sizeof longer - 1] = '\0';
	FAILS(udma_owner_connect(longer, NULL, &c), UDMA_ERR_INVALID_ARGUMENT, "path of 199 bytes");
	FAILS(udma_owner_connect("/nonexistent/udma-owner.sock", NULL, &c), UDMA_ERR_NOT_FOUND,
	      "cannot connect to a device owner at /nonexistent/udma-owner.sock");
	udma_owner_options o = {.size = sizeof o, .name = "a name longer than thirty-two bytes"};
	FAILS(udma_owner_connect(socket_path, &o, &c), UDMA_ERR_INVALID_ARGUMENT, "1 to 32 bytes");
	o = (udma_owner_options){.size = 3};
	FAILS(udma_owner_connect(socket_path, &o, &c), UDMA_ERR_INVALID_ARGUMENT, "options->size is 3");
	CHECK(c == NULL);

	/* Handles the library never made, or of another kind. */
	udma_owner_completion done = {.size = sizeof done};
	FAILS(udma_owner_wait(NULL, 0, &done), UDMA_ERR_INVALID_HANDLE, "client handle is NULL: pass one made by udma_owner_connect");
	FAILS(udma_owner_submit((udma_owner_client *)(uintptr_t)0x1234, 0, 0, 0, 0),
	      UDMA_ERR_INVALID_HANDLE, "not a client handle");
	udma_device *dev = loopback();
	FAILS(udma_owner_free((udma_owner_client *)dev, 0), UDMA_ERR_INVALID_HANDLE,
	      "is a device handle, not a client handle");
	OK(udma_device_close(dev));
	FAILS(udma_owner_disconnect(NULL), UDMA_ERR_INVALID_HANDLE, "NULL");

	CHECK(strcmp(udma_owner_status_name(UDMA_OWNER_STATUS_OK), "ok") == 0);
	CHECK(strncmp(udma_owner_status_name(UDMA_OWNER_STATUS_REFUSED), "refused", 7) == 0);
	CHECK(strcmp(udma_owner_status_name(77), "unknown status") == 0);
}

static void test_frames(void)
{
	udma_owner_client *c = connect_owner("owner_test");
	udma_owner_info info = {.size = sizeof info};
	OK(udma_owner_get_info(c, &info));
	CHECK(info.pool_bytes > 0 && info.pool_bytes <= 4 << 20);
	CHECK(info.in_flight == 0 && info.max_in_flight > 0 && info.gone == 0);

	udma_owner_stream_info s;
	declare(c, "camera0", &s);
	CHECK(s.input_bytes == TENSOR && s.result_bytes == TENSOR);

	/* Declarations the library or the owner refuses. */
	udma_owner_stream_options bad = {.size = sizeof bad, .name = NULL, .model = MODEL};
	udma_owner_stream_info unused = {.size = sizeof unused};
	FAILS(udma_owner_declare(c, &bad, &unused), UDMA_ERR_INVALID_ARGUMENT, "stream->name is NULL");
	bad.name = "";
	FAILS(udma_owner_declare(c, &bad, &unused), UDMA_ERR_INVALID_ARGUMENT, "0 bytes long");
	bad.name = "camera1";
	bad.priority = 256;
	FAILS(udma_owner_declare(c, &bad, &unused), UDMA_ERR_INVALID_ARGUMENT, "priority is 256");
	bad.priority = 0;
	bad.model = "no-such-model";
	CHECK(udma_owner_declare(c, &bad, &unused) != UDMA_OK);
	CHECK(strstr(udma_last_error(), "no-such-model") != NULL);
	FAILS(udma_owner_declare(c, &bad, NULL), UDMA_ERR_INVALID_ARGUMENT, "info is NULL");

	/* Frames: every one completes with its tag and a written result; equal inputs give
	 * equal results, another input another. */
	enum { FRAMES = 6 };
	udma_owner_buffer in[FRAMES], out[FRAMES];
	for (int i = 0; i < FRAMES; i++) {
		in[i] = alloc(c, s.input_bytes);
		out[i] = alloc(c, s.result_bytes);
		CHECK(in[i].len == TENSOR && in[i].host != NULL);
		fill_input(&in[i], i == 1 ? 0 : (unsigned)i); /* frames 0 and 1: the same input */
		fill_result(&out[i]);
		OK(udma_owner_submit(c, s.stream, in[i].offset, out[i].offset, 100 + (uint64_t)i));
	}
	/* The device may read or write them: they cannot be freed until their completions. */
	FAILS(udma_owner_free(c, in[0].offset), UDMA_ERR_BUSY, "frame in flight");
	FAILS(udma_owner_free(c, out[FRAMES - 1].offset), UDMA_ERR_BUSY, "frame in flight");
	bool seen[FRAMES] = {false};
	for (int i = 0; i < FRAMES; i++) {
		udma_owner_completion done;
		OK(wait_one(c, &done));
		CHECK(done.status == UDMA_OWNER_STATUS_OK);
		CHECK(done.stream == s.stream);
		CHECK(done.tag >= 100 && done.tag < 100 + FRAMES && !seen[done.tag - 100]);
		if (done.tag >= 100 && done.tag < 100 + FRAMES)
			seen[done.tag - 100] = true;
		CHECK(done.latency_ns >= done.wait_ns);
	}
	for (int i = 0; i < FRAMES; i++)
		CHECK(written(&out[i]));
	CHECK(memcmp(out[0].host, out[1].host, TENSOR) == 0);
	CHECK(memcmp(out[0].host, out[2].host, TENSOR) != 0);

	/* Nothing left: poll says so, a short wait times out. */
	udma_owner_completion done = {.size = sizeof done};
	bool ready = true;
	OK(udma_owner_poll(c, &done, &ready));
	CHECK(!ready);
	FAILS(udma_owner_wait(c, 1000000, &done), UDMA_ERR_TIMEOUT, "nothing from the owner");
	FAILS(udma_owner_poll(c, &done, NULL), UDMA_ERR_INVALID_ARGUMENT, "ready is NULL");
	FAILS(udma_owner_poll(c, NULL, &ready), UDMA_ERR_INVALID_ARGUMENT, "completion is NULL");

	/* Polling takes a completion without sleeping. */
	OK(udma_owner_submit(c, s.stream, in[0].offset, out[0].offset, 7));
	ready = false;
	for (int spins = 0; !ready && spins < 30000; spins++) {
		OK(udma_owner_poll(c, &done, &ready));
		if (!ready)
			usleep(1000);
	}
	CHECK(ready && done.tag == 7 && done.status == UDMA_OWNER_STATUS_OK);

	/* Spans outside the pool and streams this client does not have are refused, in their
	 * completions, and touch nothing. */
	fill_result(&out[0]);
	OK(udma_owner_submit(c, s.stream, info.pool_bytes, out[0].offset, 201));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 201);
	OK(udma_owner_submit(c, s.stream, in[0].offset, UINT64_MAX - 8, 202));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 202);
	OK(udma_owner_submit(c, s.stream + 999, in[0].offset, out[0].offset, 203));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 203);
	CHECK(!written(&out[0]));

	/* Buffers too short for the stream, an offset inside a buffer, and a freed buffer are
	 * refused too, and nothing beyond them is written: not the buffer after a short one. */
	udma_owner_buffer shorty = alloc(c, 100);
	udma_owner_buffer victim = alloc(c, 4 * s.result_bytes);
	fill_result(&shorty);
	fill_result(&victim);
	OK(udma_owner_submit(c, s.stream, in[0].offset, shorty.offset, 204));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 204);
	OK(udma_owner_submit(c, s.stream, shorty.offset, out[0].offset, 205));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 205);
	OK(udma_owner_submit(c, s.stream, in[0].offset, victim.offset + 256, 206));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 206);
	CHECK(!written(&shorty) && !written(&victim) && !written(&out[0]));
	udma_owner_buffer gone = alloc(c, s.result_bytes);
	uint64_t gone_at = gone.offset;
	OK(udma_owner_free(c, gone.offset));
	OK(udma_owner_submit(c, s.stream, in[0].offset, gone_at, 207));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 207);
	OK(udma_owner_free(c, shorty.offset));
	OK(udma_owner_free(c, victim.offset));

	/* The client's limit of frames in flight. */
	OK(udma_owner_get_info(c, &info));
	for (uint32_t i = 0; i < info.max_in_flight; i++)
		OK(udma_owner_submit(c, s.stream, in[0].offset, out[0].offset, 1000 + i));
	FAILS(udma_owner_submit(c, s.stream, in[0].offset, out[0].offset, 0), UDMA_ERR_BUSY, "full");
	OK(udma_owner_get_info(c, &info));
	CHECK(info.in_flight == info.max_in_flight);
	for (uint32_t i = 0; i < info.max_in_flight; i++) {
		OK(wait_one(c, &done));
		CHECK(done.status == UDMA_OWNER_STATUS_OK);
	}

	/* The owner's figures. */
	size_t count = 99;
	OK(udma_owner_get_stats(c, NULL, 0, &count, NULL));
	CHECK(count == 1);
	udma_owner_stream_figures streams[2] = {{.size = sizeof streams[0]}, {.size = sizeof streams[1]}};
	udma_owner_figures owner = {.size = sizeof owner};
	OK(udma_owner_get_stats(c, streams, 2, &count, &owner));
	CHECK(count == 1);
	CHECK(streams[0].stream == s.stream);
	CHECK(streams[0].frames >= FRAMES + 1 + info.max_in_flight);
	CHECK(streams[0].failed == 0 && streams[0].lost == 0);
	CHECK(streams[0].latency_max_ns >= streams[0].latency_p50_ns && streams[0].latency_p50_ns > 0);
	CHECK(owner.frames >= streams[0].frames && owner.clients >= 1 && owner.streams >= 1);
	FAILS(udma_owner_get_stats(c, NULL, 1, &count, NULL), UDMA_ERR_INVALID_ARGUMENT, "streams is NULL");
	FAILS(udma_owner_get_stats(c, streams, 2, NULL, NULL), UDMA_ERR_INVALID_ARGUMENT, "count is NULL");

	udma_owner_event event = {.size = sizeof event};
	OK(udma_owner_next_event(c, &event));
	CHECK(event.kind == UDMA_OWNER_EVENT_NONE);

	/* Buffers: freed once, by the offset they were given. */
	for (int i = 0; i < FRAMES; i++) {
		OK(udma_owner_free(c, in[i].offset));
		OK(udma_owner_free(c, out[i].offset));
	}
	FAILS(udma_owner_free(c, in[0].offset), UDMA_ERR_INVALID_ARGUMENT, "no buffer");
	FAILS(udma_owner_alloc(c, 0, &in[0]), UDMA_ERR_INVALID_ARGUMENT, "len 0");
	FAILS(udma_owner_alloc(c, SIZE_MAX, &in[0]), UDMA_ERR_INVALID_ARGUMENT, "out of range");
	FAILS(udma_owner_alloc(c, 64, NULL), UDMA_ERR_INVALID_ARGUMENT, "buffer is NULL");

	/* A closed stream takes no more frames. */
	OK(udma_owner_close_stream(c, s.stream));
	FAILS(udma_owner_close_stream(c, s.stream), UDMA_ERR_INVALID_ARGUMENT, "not one of this client's");
	udma_owner_buffer a = alloc(c, TENSOR), b = alloc(c, TENSOR);
	OK(udma_owner_submit(c, s.stream, a.offset, b.offset, 300));
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_REFUSED && done.tag == 300);

	/* Disconnecting frees what is left; the handle is gone with it. */
	OK(udma_owner_disconnect(c));
	FAILS(udma_owner_get_info(c, &info), UDMA_ERR_INVALID_HANDLE, "disconnected already");
	FAILS(udma_owner_disconnect(c), UDMA_ERR_INVALID_HANDLE, "disconnected already");
}

/* One forked client: connects and declares, says so on `ready_fd` and waits at `go_fd` until
 * both have (so each sees the other connected), runs `frames` frames, says so and waits
 * again (so each sees the other's frames counted), exits 0 if every frame succeeded. */
static void child(int index, int ready_fd, int go_fd, int frames)
{
	char name[16];
	snprintf(name, sizeof name, "child%d", index);
	udma_owner_client *c = connect_owner(name);
	udma_owner_stream_info s;
	declare(c, name, &s);
	udma_owner_buffer in = alloc(c, s.input_bytes), out = alloc(c, s.result_bytes);
	fill_input(&in, (unsigned)index);
	char go;
	CHECK(write(ready_fd, "r", 1) == 1);
	CHECK(read(go_fd, &go, 1) == 1);
	size_t count = 0;
	udma_owner_stream_figures figures = {.size = sizeof figures};
	udma_owner_figures owner = {.size = sizeof owner};
	OK(udma_owner_get_stats(c, &figures, 1, &count, &owner));
	CHECK(owner.clients >= 2 && owner.streams >= 2); /* the other child's too */
	for (int i = 0; i < frames; i++) {
		fill_result(&out);
		OK(udma_owner_submit(c, s.stream, in.offset, out.offset, (uint64_t)i));
		udma_owner_completion done;
		OK(wait_one(c, &done));
		CHECK(done.status == UDMA_OWNER_STATUS_OK && done.tag == (uint64_t)i);
		CHECK(written(&out));
	}
	CHECK(write(ready_fd, "d", 1) == 1);
	CHECK(read(go_fd, &go, 1) == 1);
	OK(udma_owner_get_stats(c, &figures, 1, &count, &owner));
	CHECK(count == 1 && figures.stream == s.stream && figures.frames == (uint64_t)frames);
	CHECK(owner.frames >= 2 * (uint64_t)frames); /* the other child's frames are done too */
	OK(udma_owner_free(c, in.offset));
	OK(udma_owner_free(c, out.offset));
	OK(udma_owner_disconnect(c));
	exit(check_failures == 0 ? 0 : 1);
}

static void test_two_processes(void)
{
	int frames = getenv("UDMA_TEST_VALGRIND") ? 10 : 40;
	int ready[2], go[2][2];
	CHECK(pipe(ready) == 0 && pipe(go[0]) == 0 && pipe(go[1]) == 0);
	pid_t kids[2];
	fflush(NULL);
	for (int i = 0; i < 2; i++) {
		kids[i] = fork();
		CHECK(kids[i] >= 0);
		if (kids[i] == 0)
			child(i, ready[1], go[i][0], frames);
	}
	/* Twice: both connected and declared, let them run at once; both done, let them look
	 * at the figures and leave. */
	for (int round = 0; round < 2; round++) {
		char r;
		for (int i = 0; i < 2; i++)
			CHECK(read(ready[0], &r, 1) == 1);
		for (int i = 0; i < 2; i++)
			CHECK(write(go[i][1], "g", 1) == 1);
	}
	for (int i = 0; i < 2; i++) {
		int status = 0;
		CHECK(kids[i] > 0 && waitpid(kids[i], &status, 0) == kids[i]);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "child%d ended with status %#x\n", i, (unsigned)status);
			check_failures++;
		}
	}
	close(ready[0]);
	close(ready[1]);
	for (int i = 0; i < 2; i++) {
		close(go[i][0]);
		close(go[i][1]);
	}
}

static void test_owner_gone(void)
{
	udma_owner_client *c = connect_owner("owner_test_gone");
	udma_owner_stream_info s;
	declare(c, "last", &s);
	udma_owner_buffer in = alloc(c, s.input_bytes), out = alloc(c, s.result_bytes);
	fill_input(&in, 3);
	OK(udma_owner_submit(c, s.stream, in.offset, out.offset, 1));
	udma_owner_completion done;
	OK(wait_one(c, &done));
	CHECK(done.status == UDMA_OWNER_STATUS_OK);

	CHECK(stop_owner()); /* exits cleanly on SIGTERM */
	FAILS(wait_one(c, &done), UDMA_ERR_NOT_FOUND, "the device owner closed the connection");
	udma_owner_event event = {.size = sizeof event};
	OK(udma_owner_next_event(c, &event));
	CHECK(event.kind == UDMA_OWNER_EVENT_SHUTDOWN);
	OK(udma_owner_next_event(c, &event));
	CHECK(event.kind == UDMA_OWNER_EVENT_NONE);
	udma_owner_info info = {.size = sizeof info};
	OK(udma_owner_get_info(c, &info));
	CHECK(info.gone == 1);
	bool ready = true;
	FAILS(udma_owner_poll(c, &done, &ready), UDMA_ERR_NOT_FOUND, "device owner closed");
	FAILS(udma_owner_submit(c, s.stream, in.offset, out.offset, 2), UDMA_ERR_NOT_FOUND,
	      "device owner closed");
	OK(udma_owner_free(c, in.offset));
	OK(udma_owner_disconnect(c));
}

int main(void)
{
	if (!start_owner())
		return EXIT_FAILURE;
	static const struct check_test tests[] = {
		{"arguments", test_arguments},
		{"frames", test_frames},
		{"two_processes", test_two_processes},
		{"owner_gone", test_owner_gone},
	};
	int status = check_run(tests, sizeof tests / sizeof tests[0]);
	if (!stop_owner())
		status = EXIT_FAILURE;
	return status;
}
