/* A plain C test harness: CHECK records a failure and goes on; each test is a function;
 * main prints "N passed, N failed". And the fixtures the test files share. */
#ifndef UDMA_CHECK_H
#define UDMA_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "userdma.h"

static int check_failures;

#define CHECK(cond)                                                                    \
	do {                                                                               \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__,     \
				__LINE__, #cond, udma_last_error());                                   \
			check_failures++;                                                          \
		}                                                                              \
	} while (0)

/* A call that must succeed. */
#define OK(call)                                                                       \
	do {                                                                               \
		enum udma_status ok_status_ = (call);                                          \
		if (ok_status_ != UDMA_OK) {                                                   \
			fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,  \
				udma_status_name(ok_status_), udma_last_error());                      \
			check_failures++;                                                          \
		}                                                                              \
	} while (0)

/* A call that must fail with `status` and a message containing `text`. */
#define FAILS(call, status, text)                                                      \
	do {                                                                               \
		enum udma_status fails_status_ = (call);                                       \
		if (fails_status_ != (status)) {                                               \
			fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n",   \
				__FILE__, __LINE__, #call, udma_status_name(fails_status_),            \
				udma_status_name(status), udma_last_error());                          \
			check_failures++;                                                          \
		} else if (strstr(udma_last_error(), (text)) == NULL) {                        \
			fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", __FILE__,      \
				__LINE__, #call, udma_last_error(), (text));                           \
			check_failures++;                                                          \
		}                                                                              \
	} while (0)

/* A nanosecond timeout of one second. */
static const uint64_t SECOND = 1000000000ull;

/* The tests' device: a zero-cost loopback device with 1 MiB of memory and four queues. */
static inline udma_device *loopback(void)
{
	udma_loopback_options o = {.size = sizeof o, .cost_model = UDMA_COST_ZERO,
				   .memory_bytes = 1 << 20, .queues = 4};
	udma_device *dev = NULL;
	OK(udma_device_open_loopback(&o, &dev));
	return dev;
}

/* A pool of `bytes` on `dev`. */
static inline udma_pool *pool_of(udma_device *dev, uint64_t bytes)
{
	udma_pool_options o = {.size = sizeof o, .bytes = bytes};
	udma_pool *pool = NULL;
	OK(udma_pool_create(dev, &o, &pool));
	return pool;
}

/* One test: its name and its function. */
struct check_test {
	const char *name;
	void (*run)(void);
};

/* Runs every test, printing "ok NAME" or "FAILED NAME" for each and then "N passed, N failed";
 * returns the exit status for main. */
static int check_run(const struct check_test *tests, size_t count)
{
	int passed = 0, failed = 0;
	for (size_t i = 0; i < count; i++) {
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

#endif
