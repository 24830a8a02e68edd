/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * What the C test programs share: CHECK(cond) prints one "ok" or "FAIL"
 * line per check (with p2pdma_last_error() on failure) and counts the
 * failures; file_bytes() reads the start of a file or exits with 2.
 */
#ifndef P2PDMA_TEST_CHECK_H
#define P2PDMA_TEST_CHECK_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "p2pdma.h"

static int failures;

#define CHECK(cond)                                                                       \
	do {                                                                              \
		if (cond) {                                                               \
			printf("ok   %s\n", #cond);                                           \
		} else {                                                                  \
			printf("FAIL %s (line %d; last error: %s)\n", #cond, __LINE__,        \
			       p2pdma_last_error());                                          \
			failures++;                                                       \
		}                                                                         \
	} while (0)

/* The first `len` bytes of the file at `path`, in memory from malloc(). */
static inline unsigned char *file_bytes(const char *path, size_t len)
{
	unsigned char *buf = malloc(len);
	int fd = open(path, O_RDONLY);
	if (!buf || fd < 0 || pread(fd, buf, len, 0) != (ssize_t)len) {
		fprintf(stderr, "cannot read %zu bytes of %s\n", len, path);
		exit(2);
	}
	close(fd);
	return buf;
}

#endif
