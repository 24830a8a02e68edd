/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The C API's contract from C: NULL and bad arguments give -EINVAL and a
 * message instead of a crash, reads past the end of a file fail with their
 * own code (P2PDMA_ERR_EOF, not a medium error's -ENODATA) instead of
 * returning partial data, messages and NVMe statuses are per thread, every
 * path preference moves the right bytes, and one engine serves several
 * threads.
 *
 *     errors FILE      (FILE: at least 1 MiB, on a filesystem with O_DIRECT)
 *
 * Prints one line per check and exits non-zero if any failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"


static int last_error_has(const char *word)
{
	return strstr(p2pdma_last_error(), word) != NULL;
}

static void *fresh_thread_error(void *arg)
{
	(void)arg;
	return (void *)(uintptr_t)(p2pdma_last_error()[0] == '\0' && p2pdma_last_nvme_status() == 0);
}

struct worker {
	const struct p2pdma_engine *engine;
	const struct p2pdma_file *file;
	const struct p2pdma_mem *mem;
	const unsigned char *want;
	size_t offset, len;
	int ok;
};

/* Reads its slice of the file into its own region of the shared memory and
 * checks it. */
static void *worker(void *arg)
{
	struct worker *w = arg;
	unsigned char *got = malloc(w->len);
	w->ok = got && p2pdma_read(w->engine, w->file, w->offset, w->mem, w->offset, w->len, NULL) == 0 &&
		p2pdma_mem_read(w->mem, w->offset, got, w->len) == 0 &&
		memcmp(got, w->want + w->offset, w->len) == 0;
	free(got);
	return NULL;
}

int main(int argc, char **argv)
{
	struct p2pdma_module *module = (void *)1;
	struct p2pdma_mem *mem = (void *)1;
	struct p2pdma_file *file = (void *)1;
	struct p2pdma_engine *engine = (void *)1;
	struct p2pdma_report report;
	struct p2pdma_path_stats stats;
	char reason[16], small[4];
	unsigned char buf[64];
	const size_t len = 1 << 20;

	if (argc != 2) {
		fprintf(stderr, "usage: %s FILE\n", argv[0]);
		return 2;
	}
	unsigned char *want = file_bytes(argv[1], len);

	/* NULL everywhere. */
	CHECK(p2pdma_last_error() != NULL && p2pdma_last_error()[0] == '\0');
	CHECK(p2pdma_last_nvme_status() == 0);
	CHECK(p2pdma_module_open(NULL) == -EINVAL && last_error_has("`out` is NULL"));
	CHECK(p2pdma_module_num_accelerators(NULL) == -EINVAL);
	CHECK(p2pdma_module_accelerator_index(NULL, 0, NULL) == -EINVAL);
	CHECK(p2pdma_mem_host_new(4096, NULL) == -EINVAL);
	CHECK(p2pdma_mem_host_new(0, &mem) == -EINVAL && mem == NULL);
	CHECK(p2pdma_mem_module_alloc(NULL, 0, 4096, 0, &mem) == -EINVAL && mem == NULL);
	CHECK(p2pdma_mem_size(NULL) == 0);
	CHECK(p2pdma_mem_write(NULL, 0, buf, 1) == -EINVAL);
	CHECK(p2pdma_mem_read(NULL, 0, buf, 1) == -EINVAL);
	CHECK(p2pdma_file_open(NULL, 0, &file) == -EINVAL && file == NULL);
	CHECK(p2pdma_file_open(argv[1], 0, NULL) == -EINVAL);
	CHECK(p2pdma_file_size(NULL) == -EINVAL);
	CHECK(p2pdma_engine_new("auto", 0, 0, NULL, NULL) == -EINVAL);
	CHECK(p2pdma_path_choice(NULL, NULL, NULL, NULL, 0) == -EINVAL);
	CHECK(p2pdma_read(NULL, NULL, 0, NULL, 0, 1, NULL) == -EINVAL);
	CHECK(p2pdma_write(NULL, NULL, 0, NULL, 0, 1, NULL) == -EINVAL);
	memset(&report, 0xff, sizeof(report));
	CHECK(p2pdma_read(NULL, NULL, 0, NULL, 0, 1, &report) == -EINVAL && report.bytes == 0 &&
	      report.path == 0);
	CHECK(p2pdma_stats(NULL, P2PDMA_PATH_BOUNCE, &stats) == -EINVAL);
	p2pdma_module_close(NULL);
	p2pdma_mem_free(NULL);
	p2pdma_file_close(NULL);
	p2pdma_engine_free(NULL);

	/* Messages are per thread: a new thread has none. */
	pthread_t t;
	void *fresh = NULL;
	CHECK(pthread_create(&t, NULL, fresh_thread_error, NULL) == 0 && pthread_join(t, &fresh) == 0 &&
	      fresh == (void *)1);
	CHECK(p2pdma_last_error()[0] != '\0');

	/* Bad arguments. */
	CHECK(p2pdma_file_open("/nonexistent/p2pdma-file", 0, &file) == -ENOENT && file == NULL &&
	      last_error_has("/nonexistent/p2pdma-file"));
	CHECK(p2pdma_engine_new("sideways", 0, 0, NULL, &engine) == -EINVAL && engine == NULL &&
	      last_error_has("unknown path"));
	CHECK(p2pdma_engine_new("bounce", 1, 0, NULL, &engine) == -EINVAL && engine == NULL &&
	      last_error_has("chunk"));
	CHECK(p2pdma_engine_new("bounce", 0, 1000, NULL, &engine) == -EINVAL && engine == NULL &&
	      last_error_has("depth"));

	CHECK(p2pdma_mem_host_new(2 * len, &mem) == 0 && mem != NULL);
	CHECK(p2pdma_mem_size(mem) == 2 * len);
	CHECK(p2pdma_mem_write(mem, 0, NULL, 1) == -EINVAL);
	CHECK(p2pdma_mem_read(mem, 0, NULL, 1) == -EINVAL);
	CHECK(p2pdma_mem_write(mem, 2 * len - 1, buf, 2) == -EINVAL && last_error_has("outside"));
	CHECK(p2pdma_mem_read(mem, SIZE_MAX, buf, 2) == -EINVAL);
	CHECK(p2pdma_file_open(argv[1], 0, &file) == 0 && file != NULL);
	CHECK(p2pdma_file_size(file) >= (int64_t)len);
	/* Settings by name: the counters below are the bounce path's, so reads
	 * move every byte on it, even what the page cache holds. */
	const char *keys[] = {"path", "page_cache"}, *values[] = {"auto", "direct"};
	const char *bad_keys[] = {"page_cache"}, *bad_values[] = {"sometimes"};
	const char *no_keys[] = {"sideways"};
	CHECK(p2pdma_engine_new_with(keys, values, 2, NULL, NULL) == -EINVAL);
	CHECK(p2pdma_engine_new_with(NULL, values, 1, NULL, &engine) == -EINVAL && engine == NULL);
	CHECK(p2pdma_engine_new_with(bad_keys, bad_values, 1, NULL, &engine) == -EINVAL &&
	      engine == NULL && last_error_has("page-cache use"));
	CHECK(p2pdma_engine_new_with(no_keys, values, 1, NULL, &engine) == -EINVAL && engine == NULL &&
	      last_error_has("sideways"));
	CHECK(p2pdma_engine_new_with(keys, values, 2, NULL, &engine) == 0 && engine != NULL);

	/* AUTO on host memory is the direct path (O_DIRECT into it, no
	 * staging copy), and says why; the reason is truncated and
	 * terminated. */
	memset(reason, 'x', sizeof(reason));
	CHECK(p2pdma_path_choice(engine, file, mem, reason, sizeof(reason)) == P2PDMA_PATH_DIRECT);
	CHECK(strlen(reason) == sizeof(reason) - 1);
	CHECK(p2pdma_path_choice(engine, file, mem, NULL, 0) == P2PDMA_PATH_DIRECT);
	memset(small, 'x', sizeof(small));
	CHECK(p2pdma_path_choice(engine, file, mem, small, 1) == P2PDMA_PATH_DIRECT && small[0] == '\0' &&
	      small[1] == 'x');
	CHECK(p2pdma_stats(engine, 0, &stats) == -EINVAL && last_error_has("unknown path"));
	CHECK(p2pdma_stats(engine, P2PDMA_PATH_BOUNCE, NULL) == -EINVAL);

	/* A read past the end of the file fails with its own code, not a
	 * medium error's, says so, moves nothing it reports, and zeroes the
	 * report. It carries no NVMe status. */
	int64_t size = p2pdma_file_size(file);
	memset(&report, 0xff, sizeof(report));
	int rc = p2pdma_read(engine, file, (uint64_t)size - 10, mem, 0, 20, &report);
	CHECK(rc == P2PDMA_ERR_EOF && rc == -ERANGE && rc != -ENODATA &&
	      last_error_has("past its end"));
	CHECK(p2pdma_last_nvme_status() == 0);
	CHECK(report.bytes == 0 && report.path == 0 && report.retried == 0);
	CHECK(p2pdma_read(engine, file, (uint64_t)size, mem, 0, 1, NULL) == P2PDMA_ERR_EOF);
	CHECK(p2pdma_read(engine, file, (uint64_t)size + 4096, mem, 0, 4096, NULL) ==
	      P2PDMA_ERR_EOF);
	CHECK(p2pdma_read(engine, file, 0, mem, 0, (size_t)size + 1, NULL) == P2PDMA_ERR_EOF);
	CHECK(p2pdma_read(engine, file, 0, mem, 2 * len - 10, 20, &report) == -EINVAL &&
	      last_error_has("outside"));
	CHECK(p2pdma_write(engine, file, 0, mem, 0, 4096, &report) == -EBADF);
	CHECK(p2pdma_stats(engine, P2PDMA_PATH_BOUNCE, &stats) == 0 && stats.transfers == 0 &&
	      stats.bytes == 0);

	/* A good read, and the counters that follow it: file and memory
	 * offsets that cannot align together to the block take the bounce
	 * pipeline, at once. */
	CHECK(p2pdma_read(engine, file, 3, mem, 5, len - 3, &report) == 0 && report.bytes == len - 3 &&
	      report.path == P2PDMA_PATH_BOUNCE && report.retried == 0);
	unsigned char *got = malloc(len);
	CHECK(got && p2pdma_mem_read(mem, 5, got, len - 3) == 0 && memcmp(got, want + 3, len - 3) == 0);
	CHECK(p2pdma_stats(engine, P2PDMA_PATH_BOUNCE, &stats) == 0 && stats.transfers == 1 &&
	      stats.bytes == len - 3 && stats.ios > 0 && stats.total_ns > 0);
	CHECK(p2pdma_stats(engine, P2PDMA_PATH_P2P, &stats) == 0 && stats.transfers == 0);
	/* Offsets that align together go direct. */
	CHECK(p2pdma_read(engine, file, 4099, mem, 3, len - 4099, &report) == 0 &&
	      report.bytes == len - 4099 && report.path == P2PDMA_PATH_DIRECT && report.retried == 0);
	CHECK(p2pdma_mem_read(mem, 3, got, len - 4099) == 0 &&
	      memcmp(got, want + 4099, len - 4099) == 0);
	CHECK(p2pdma_stats(engine, P2PDMA_PATH_DIRECT, &stats) == 0 && stats.transfers == 1 &&
	      stats.bytes == len - 4099 && stats.retries == 0);
	/* Up to the last byte is not past the end. */
	CHECK(p2pdma_read(engine, file, (uint64_t)size - 1, mem, 0, 1, &report) == 0 &&
	      report.bytes == 1);
	unsigned char last_byte = 0;
	int fd = open(argv[1], O_RDONLY);
	CHECK(fd >= 0 && pread(fd, &last_byte, 1, size - 1) == 1);
	if (fd >= 0)
		close(fd);
	CHECK(p2pdma_mem_read(mem, 0, buf, 1) == 0 && buf[0] == last_byte);

	/* Every path preference that can serve host memory moves the same
	 * bytes; the NVMe-command path cannot serve a regular file, and says
	 * so. */
	const char *prefs[] = { "bounce", "p2p", NULL };
	for (const char **pref = prefs; *pref; pref++) {
		struct p2pdma_engine *e = NULL;
		printf("path preference %s\n", *pref);
		CHECK(p2pdma_engine_new(*pref, 64 << 10, 3, NULL, &e) == 0);
		memset(got, 0, len);
		CHECK(p2pdma_mem_write(mem, 1, got, len) == 0);
		CHECK(p2pdma_read(e, file, 7, mem, 1, len - 7, &report) == 0 &&
		      report.bytes == len - 7);
		CHECK(p2pdma_mem_read(mem, 1, got, len - 7) == 0 && memcmp(got, want + 7, len - 7) == 0);
		p2pdma_engine_free(e);
	}
	/* An engine that takes what the page cache holds: the file was just
	 * read through the page cache, so every byte comes from there, and
	 * the page-cache counters say so. */
	struct p2pdma_engine *warm = NULL;
	const char *auto_keys[] = {"page_cache"}, *auto_values[] = {"auto"};
	CHECK(p2pdma_engine_new_with(auto_keys, auto_values, 1, NULL, &warm) == 0);
	fd = open(argv[1], O_RDONLY);
	CHECK(fd >= 0 && pread(fd, got, len, 0) == (ssize_t)len);
	if (fd >= 0)
		close(fd);
	memset(got, 0, len);
	CHECK(p2pdma_mem_write(mem, 0, got, len) == 0);
	CHECK(p2pdma_read(warm, file, 9, mem, 0, len - 9, &report) == 0 && report.bytes == len - 9);
	CHECK(p2pdma_mem_read(mem, 0, got, len - 9) == 0 && memcmp(got, want + 9, len - 9) == 0);
	CHECK(p2pdma_stats(warm, P2PDMA_PATH_PAGE_CACHE, &stats) == 0 && stats.bytes == len - 9);
	CHECK(p2pdma_stats(warm, P2PDMA_PATH_BOUNCE, &stats) == 0 && stats.bytes == 0);
	CHECK(p2pdma_stats(warm, P2PDMA_PATH_DIRECT, &stats) == 0 && stats.bytes == 0);
	p2pdma_engine_free(warm);

	struct p2pdma_engine *nvme = NULL;
	CHECK(p2pdma_engine_new("nvme-cmd", 0, 0, NULL, &nvme) == 0);
	CHECK(p2pdma_path_choice(nvme, file, mem, reason, sizeof(reason)) == -EOPNOTSUPP &&
	      last_error_has("nvme-cmd"));
	CHECK(p2pdma_read(nvme, file, 0, mem, 0, 4096, &report) == -EOPNOTSUPP);
	p2pdma_engine_free(nvme);

	/* One engine, file and memory, four threads. */
	struct worker workers[4];
	pthread_t threads[4];
	for (int i = 0; i < 4; i++) {
		workers[i] = (struct worker){ engine, file, mem, want, (size_t)i * (len / 4) + 1,
					      len / 4 - 1, 0 };
		CHECK(pthread_create(&threads[i], NULL, worker, &workers[i]) == 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(threads[i], NULL);
		CHECK(workers[i].ok);
	}

	/* The module: absent here, or usable. */
	module = NULL;
	rc = p2pdma_module_open(&module);
	if (access("/dev/p2pdma", F_OK) != 0)
		CHECK(rc == -ENOENT && module == NULL && last_error_has("/dev/p2pdma"));
	else if (rc == 0)
		CHECK(p2pdma_module_num_accelerators(module) >= 0);
	p2pdma_module_close(module);

	free(got);
	p2pdma_engine_free(engine);
	p2pdma_file_close(file);
	p2pdma_mem_free(mem);
	free(want);
	printf("errors: %d failed\n", failures);
	return failures ? 1 : 0;
}
