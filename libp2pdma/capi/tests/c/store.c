/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The object store from C: format a store on a file, create objects, write
 * and read them (plainly and by prefetch), resize and delete, list the map,
 * reopen and find everything again; bad ids and ranges refused. Then the
 * store with a page cache over two accelerators' memories (host memory
 * here): a page both hold, written on one, is what the other reads next.
 *
 *     store FILE   (a file of at least 16 MiB on a filesystem with O_DIRECT,
 *                   overwritten)
 *
 * Prints one line per check and exits non-zero if any failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define OBJ 300000u

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31u + seed * 7u + (i >> 9));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: store FILE\n");
		return 2;
	}
	struct p2pdma_engine *engine = NULL;
	struct p2pdma_file *file = NULL;
	struct p2pdma_mem *mem = NULL;
	struct p2pdma_store *store = NULL;
	CHECK(p2pdma_engine_new(NULL, 0, 0, NULL, &engine) == 0);
	CHECK(p2pdma_file_open(argv[1], 1, &file) == 0);
	CHECK(p2pdma_mem_host_new(OBJ, &mem) == 0);
	CHECK(p2pdma_store_open(engine, file, 1, 64, &store) == 0);
	if (!store)
		return 1;

	unsigned char *want = malloc(OBJ), *have = malloc(OBJ);
	uint64_t a = 0, b = 0;
	CHECK(p2pdma_store_create(store, OBJ, &a) == 0);
	CHECK(p2pdma_store_create(store, 5000, &b) == 0);
	CHECK(a != b);
	CHECK(p2pdma_store_size(store, a) == OBJ);

	fill(want, OBJ, 1);
	CHECK(p2pdma_mem_write(mem, 0, want, OBJ) == 0);
	CHECK(p2pdma_store_write(store, a, 0, OBJ, mem, 0) == (int64_t)OBJ);
	CHECK(p2pdma_store_flush(store) == 0);

	memset(have, 0, OBJ);
	CHECK(p2pdma_mem_write(mem, 0, have, OBJ) == 0);
	CHECK(p2pdma_store_read(store, a, 100, OBJ - 100, mem, 0) == (int64_t)(OBJ - 100));
	CHECK(p2pdma_mem_read(mem, 0, have, OBJ - 100) == 0);
	CHECK(memcmp(have, want + 100, OBJ - 100) == 0);

	struct p2pdma_prefetch *p = NULL;
	CHECK(p2pdma_store_prefetch(store, a, 4096, 8192, &p) == 0);
	CHECK(p2pdma_store_consume(store, p, mem, 0, 8192) == 8192);
	CHECK(p2pdma_mem_read(mem, 0, have, 8192) == 0);
	CHECK(memcmp(have, want + 4096, 8192) == 0);

	/* On a file, a prefetch names no NVMe commands. */
	struct p2pdma_command_id ids[4];
	CHECK(p2pdma_store_prefetch(store, a, 0, 4096, &p) == 0);
	CHECK(p2pdma_prefetch_commands(p, ids, 4) == 0);
	CHECK(p2pdma_prefetch_commands(NULL, ids, 4) == -EINVAL);
	CHECK(p2pdma_store_consume(store, p, mem, 0, 4096) == 4096);

	/* A prefetch into the buffer itself, consumed there. */
	memset(have, 0, 8192);
	CHECK(p2pdma_mem_write(mem, 0, have, 8192) == 0);
	CHECK(p2pdma_store_prefetch_into(store, a, 1000, 8192, mem, 0, &p) == 0);
	CHECK(p2pdma_store_consume(store, p, mem, 0, 8192) == 8192);
	CHECK(p2pdma_mem_read(mem, 0, have, 8192) == 0);
	CHECK(memcmp(have, want + 1000, 8192) == 0);
	CHECK(p2pdma_store_prefetch_into(store, a, 0, 8192, mem, OBJ - 100, &p) == -EINVAL);

	/* Past the end, a missing id, NULL handles: errors, nothing moved. */
	CHECK(p2pdma_store_read(store, b, 4999, 2, mem, 0) == -ERANGE);
	CHECK(p2pdma_store_read(store, 999, 0, 1, mem, 0) == -EINVAL);
	CHECK(p2pdma_store_read(NULL, a, 0, 1, mem, 0) == -EINVAL);
	CHECK(p2pdma_store_write(store, a, 0, 1, NULL, 0) == -EINVAL);

	/* A grown object reads zeros past its old end. */
	CHECK(p2pdma_store_resize(store, b, 9000) == 0);
	CHECK(p2pdma_store_read(store, b, 5000, 4000, mem, 0) == 4000);
	CHECK(p2pdma_mem_read(mem, 0, have, 4000) == 0);
	unsigned char zero[4000] = { 0 };
	CHECK(memcmp(have, zero, 4000) == 0);

	struct p2pdma_object objs[4];
	CHECK(p2pdma_store_object_map(store, objs, 4) == 2);
	CHECK(objs[0].id == a && objs[0].size == OBJ && objs[1].id == b && objs[1].size == 9000);
	CHECK(p2pdma_store_object_map(store, NULL, 0) == 2);

	CHECK(p2pdma_store_delete(store, b) == 0);
	CHECK(p2pdma_store_delete(store, b) == -EINVAL);
	p2pdma_store_close(store);
	store = NULL;

	/* Reopened: the map and the flushed bytes are there. */
	CHECK(p2pdma_store_open(engine, file, 0, 0, &store) == 0);
	CHECK(p2pdma_store_object_map(store, objs, 4) == 1);
	CHECK(objs[0].id == a);
	CHECK(p2pdma_store_read(store, a, 0, OBJ, mem, 0) == (int64_t)OBJ);
	CHECK(p2pdma_mem_read(mem, 0, have, OBJ) == 0);
	CHECK(memcmp(have, want, OBJ) == 0);

	p2pdma_store_close(store);
	store = NULL;

	/* A cache of 4 KiB pages over two memories, eight frames each. */
	struct p2pdma_mem *frames[2] = { NULL, NULL };
	CHECK(p2pdma_mem_host_new(8 * 4096, &frames[0]) == 0);
	CHECK(p2pdma_mem_host_new(8 * 4096, &frames[1]) == 0);
	const struct p2pdma_mem *const cmems[2] = { frames[0], frames[1] };
	CHECK(p2pdma_store_open_cached(engine, file, 0, 0, cmems, 0, 4096, 0, &store) == -EINVAL);
	CHECK(store == NULL);
	CHECK(p2pdma_store_open_cached(engine, file, 0, 0, cmems, 2, 3000, 0, &store) == -EINVAL);
	CHECK(p2pdma_store_open_cached(engine, file, 0, 0, cmems, 2, 4096, 0, &store) == 0);
	struct p2pdma_cache_stats st;
	CHECK(p2pdma_store_read_on(store, 0, a, 0, 8192, mem, 0) == 8192);
	CHECK(p2pdma_store_read_on(store, 1, a, 0, 8192, mem, 0) == 8192);
	CHECK(p2pdma_store_cache_stats(store, 1, &st) == 0);
	CHECK(st.misses == 2 && st.remote == 2);
	unsigned char page[4096];
	fill(page, sizeof(page), 9);
	CHECK(p2pdma_mem_write(mem, 0, page, sizeof(page)) == 0);
	CHECK(p2pdma_store_write_on(store, 0, a, 4096, 4096, mem, 0) == 4096);
	CHECK(p2pdma_mem_write(mem, 0, zero, 4000) == 0);
	CHECK(p2pdma_store_read_on(store, 1, a, 4096, 4096, mem, 0) == 4096);
	CHECK(p2pdma_mem_read(mem, 0, have, 4096) == 0);
	CHECK(memcmp(have, page, 4096) == 0);
	CHECK(p2pdma_store_cache_stats(store, -1, &st) == 0);
	CHECK(st.invalidations == 1 && st.frames == 16);
	CHECK(p2pdma_store_read_on(store, 2, a, 0, 1, mem, 0) == -EINVAL);
	CHECK(p2pdma_store_cache_stats(store, 2, &st) == -EINVAL);
	CHECK(p2pdma_store_flush(store) == 0);
	p2pdma_store_close(store);

	/* Flushed: the written page is on the file. */
	CHECK(p2pdma_store_open(engine, file, 0, 0, &store) == 0);
	CHECK(p2pdma_store_cache_stats(store, -1, &st) == -EINVAL);
	CHECK(p2pdma_store_read(store, a, 4096, 4096, mem, 0) == 4096);
	CHECK(p2pdma_mem_read(mem, 0, have, 4096) == 0);
	CHECK(memcmp(have, page, 4096) == 0);
	p2pdma_store_close(store);

	/* Object counts whose map size overflows: refused, the store kept. */
	const uint64_t huge[] = { 1ull << 59, (1ull << 59) + 1, 3ull << 59, UINT64_MAX };
	for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
		store = NULL;
		CHECK(p2pdma_store_open(engine, file, 1, huge[i], &store) == -EINVAL);
		CHECK(store == NULL);
	}
	CHECK(p2pdma_store_open(engine, file, 0, 0, &store) == 0);
	CHECK(p2pdma_store_size(store, a) == OBJ);
	p2pdma_store_close(store);
	p2pdma_mem_free(frames[0]);
	p2pdma_mem_free(frames[1]);
	p2pdma_mem_free(mem);
	p2pdma_file_close(file);
	p2pdma_engine_free(engine);
	free(want);
	free(have);
	printf("store: %d failed\n", failures);
	return failures != 0;
}
