/* A plain C test harness: CHECK records a failure and goes on; each test is a function;
 * main prints "N passed, N failed". */
#ifndef UDMA_CHECK_H
#define UDMA_CHECK_H

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
