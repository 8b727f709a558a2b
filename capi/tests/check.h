/* A plain C test harness: CHECK records a failure and goes on; each test is a function;
 * main prints "N passed, N failed". */
#ifndef UDMA_CHECK_H
#define UDMA_CHECK_H

#include <stdio.h>
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

#endif
