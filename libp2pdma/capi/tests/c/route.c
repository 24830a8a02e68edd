/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Routes from C: a file into memory along the planned route and through
 * staging places given by the caller, memory to memory, memory to a file;
 * every byte compared with the source, the rest with the poison or the
 * file's old bytes; bad places refused with nothing moved.
 *
 *     route SRC DST   (SRC: at least 4 MiB to read; DST: a file of 4 MiB
 *                      to overwrite; both on a filesystem with O_DIRECT)
 *
 * Prints one line per check and exits non-zero if any failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"


#define POISON 0xA5
#define MEM_LEN (4u << 20)

static void poison(struct p2pdma_mem *m)
{
	unsigned char *p = malloc(MEM_LEN);
	memset(p, POISON, MEM_LEN);
	p2pdma_mem_write(m, 0, p, MEM_LEN);
	free(p);
}

/* Whether `m` holds `want[0..len)` at `at` and the poison elsewhere. */
static int holds(struct p2pdma_mem *m, size_t at, const unsigned char *want, size_t len)
{
	unsigned char *have = malloc(MEM_LEN);
	int ok = p2pdma_mem_read(m, 0, have, MEM_LEN) == 0 && memcmp(have + at, want, len) == 0;
	for (size_t i = 0; ok && i < MEM_LEN; i++)
		if ((i < at || i >= at + len) && have[i] != POISON)
			ok = 0;
	free(have);
	return ok;
}

int main(int argc, char **argv)
{
	struct p2pdma_file *src, *dst;
	struct p2pdma_mem *a, *b, *staging;
	struct p2pdma_engine *engine;
	struct p2pdma_route_report rep;
	char why[512];

	if (argc != 3) {
		fprintf(stderr, "usage: route SRC DST\n");
		return 2;
	}
	if (p2pdma_file_open(argv[1], 0, &src) != 0 || p2pdma_file_open(argv[2], 1, &dst) != 0 ||
	    p2pdma_mem_host_new(MEM_LEN, &a) != 0 || p2pdma_mem_host_new(MEM_LEN, &b) != 0 ||
	    p2pdma_mem_host_new(1 << 20, &staging) != 0 ||
	    p2pdma_engine_new("auto", 0, 0, NULL, &engine) != 0) {
		fprintf(stderr, "route: setup: %s\n", p2pdma_last_error());
		return 2;
	}
	unsigned char *data = file_bytes(argv[1], MEM_LEN);
	unsigned char *old = file_bytes(argv[2], MEM_LEN);

	struct p2pdma_place fsrc = { P2PDMA_PLACE_STORAGE, src, NULL, 12345, 0 };
	struct p2pdma_place ma = { P2PDMA_PLACE_MEMORY, NULL, a, 777, 0 };
	struct p2pdma_place mb = { P2PDMA_PLACE_MEMORY, NULL, b, 4096, 0 };
	struct p2pdma_place host = { P2PDMA_PLACE_HOST, NULL, NULL, 0, 0 };
	struct p2pdma_place stage = { P2PDMA_PLACE_MEMORY, NULL, staging, 100, (1 << 20) - 100 };
	size_t len = (3u << 20) + 333;

	/* The planned route: the file straight into host memory. */
	poison(a);
	CHECK(p2pdma_copy_route(engine, &fsrc, NULL, 0, &ma, len, 0, &rep, why, sizeof why) == 0);
	CHECK(rep.bytes == len && rep.hops == 1 && rep.chunks >= 1);
	CHECK(holds(a, 777, data + 12345, len));
	printf("     %s\n", why);

	/* Through host memory, staging memory and host memory again, in
	 * chunks of 64 KiB: four hops, all busy. */
	poison(b);
	struct p2pdma_place via[3] = { host, stage, host };
	CHECK(p2pdma_copy_route(engine, &fsrc, via, 3, &mb, len, 64 << 10, &rep, why, sizeof why) ==
	      0);
	CHECK(rep.hops == 4 && rep.chunk == (64u << 10) && rep.chunks >= 48);
	CHECK(rep.hop_busy_ns[0] > 0 && rep.hop_busy_ns[3] > 0 && rep.elapsed_ns > 0);
	CHECK(holds(b, 4096, data + 12345, len));
	printf("     %s\n", why);

	/* Memory to memory through host memory. */
	poison(b);
	struct p2pdma_place mb2 = { P2PDMA_PLACE_MEMORY, NULL, b, 3, 0 };
	CHECK(p2pdma_copy_route(engine, &ma, &host, 1, &mb2, len, 0, &rep, NULL, 0) == 0);
	CHECK(rep.hops == 2);
	CHECK(holds(b, 3, data + 12345, len));

	/* Memory to a file: exactly the range changes. */
	struct p2pdma_place fdst = { P2PDMA_PLACE_STORAGE, dst, NULL, 5000, 0 };
	CHECK(p2pdma_copy_route(engine, &ma, &host, 1, &fdst, len, 128 << 10, &rep, NULL, 0) == 0);
	unsigned char *now = file_bytes(argv[2], MEM_LEN);
	CHECK(memcmp(now + 5000, data + 12345, len) == 0);
	CHECK(memcmp(now, old, 5000) == 0);
	CHECK(memcmp(now + 5000 + len, old + 5000 + len, MEM_LEN - 5000 - len) == 0);
	free(now);

	/* Refusals: nothing moves, the report is zeroed. */
	poison(b);
	memset(&rep, 0xFF, sizeof rep);
	CHECK(p2pdma_copy_route(NULL, &fsrc, NULL, 0, &mb, len, 0, &rep, NULL, 0) == -EINVAL);
	CHECK(rep.bytes == 0 && rep.hops == 0);
	CHECK(p2pdma_copy_route(engine, NULL, NULL, 0, &mb, len, 0, NULL, NULL, 0) == -EINVAL);
	CHECK(p2pdma_copy_route(engine, &host, NULL, 0, &mb, len, 0, NULL, NULL, 0) == -EINVAL);
	CHECK(p2pdma_copy_route(engine, &fsrc, &fsrc, 1, &mb, len, 0, NULL, NULL, 0) == -EINVAL);
	struct p2pdma_place bad = { 42, NULL, NULL, 0, 0 };
	CHECK(p2pdma_copy_route(engine, &fsrc, &bad, 1, &mb, len, 0, NULL, NULL, 0) == -EINVAL);
	CHECK(p2pdma_copy_route(engine, &fsrc, NULL, 2, &mb, len, 0, NULL, NULL, 0) == -EINVAL);
	/* Staging too small for one chunk, a destination too small. */
	struct p2pdma_place tiny = { P2PDMA_PLACE_MEMORY, NULL, staging, 0, 4096 };
	CHECK(p2pdma_copy_route(engine, &fsrc, &tiny, 1, &mb, len, 64 << 10, NULL, NULL, 0) ==
	      -EINVAL);
	struct p2pdma_place late = { P2PDMA_PLACE_MEMORY, NULL, b, MEM_LEN - 10, 0 };
	CHECK(p2pdma_copy_route(engine, &fsrc, NULL, 0, &late, len, 0, NULL, NULL, 0) == -EINVAL);
	CHECK(holds(b, 0, NULL, 0));
	/* A source shorter than the copy: the end of the file, not success. */
	struct p2pdma_place tail = { P2PDMA_PLACE_STORAGE, src, NULL, MEM_LEN - 100, 0 };
	CHECK(p2pdma_copy_route(engine, &tail, &host, 1, &mb, 4096, 0, NULL, NULL, 0) ==
	      P2PDMA_ERR_EOF);

	p2pdma_engine_free(engine);
	p2pdma_mem_free(staging);
	p2pdma_mem_free(b);
	p2pdma_mem_free(a);
	p2pdma_file_close(dst);
	p2pdma_file_close(src);
	free(old);
	free(data);
	printf("route: %d failed\n", failures);
	return failures != 0;
}
