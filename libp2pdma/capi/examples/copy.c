/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * copy: reads a whole file into accelerator memory with libp2pdma, checks the
 * bytes that landed against a plain read() of the file, and writes them back
 * out to a second file.
 *
 *     copy SRC DST [MEM_OFFSET]
 *
 * The memory is the first accelerator's BAR memory when /dev/p2pdma exists
 * and the module has an accelerator, and the host-memory device otherwise.
 * The file lands at MEM_OFFSET in the memory (default 4097, deliberately
 * unaligned). DST is created or truncated. The engine is AUTO: it prints the
 * path it chose and why, then each transfer's report and the engine's
 * counters. Exits 0 when every byte matched, 1 on any failure or mismatch,
 * 2 on bad usage.
 *
 * Build: cc copy.c $(pkg-config --cflags --libs p2pdma) -o copy
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "p2pdma.h"

static const char *path_name(int path)
{
	switch (path) {
	case P2PDMA_PATH_P2P:
		return "p2p";
	case P2PDMA_PATH_BOUNCE:
		return "bounce";
	case P2PDMA_PATH_NVME_CMD:
		return "nvme-cmd";
	case P2PDMA_PATH_QUEUES:
		return "queues";
	case P2PDMA_PATH_DIRECT:
		return "direct";
	default:
		return "unknown";
	}
}

/* Reports a failed libp2pdma call and returns 1, for `return fail(...)`: the
 * end of the file has its own code, and an NVMe controller's error status is
 * there to print beside the errno (-ENODATA for a medium error). */
static int fail(const char *what, int rc)
{
	uint32_t nvme = p2pdma_last_nvme_status();

	if (rc == P2PDMA_ERR_EOF)
		fprintf(stderr, "copy: %s failed: past the end of the file (%s)\n", what,
			p2pdma_last_error());
	else if (nvme)
		fprintf(stderr, "copy: %s failed: %s, NVMe status 0x%03" PRIx32 " (%s)\n", what,
			strerror(-rc), nvme & 0x7ff, p2pdma_last_error());
	else
		fprintf(stderr, "copy: %s failed: %s (%s)\n", what, strerror(-rc),
			p2pdma_last_error());
	return 1;
}

/* Reads all of `path` with plain read(2) into a new buffer of `*len` bytes. */
static unsigned char *slurp(const char *path, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "copy: open %s: %s\n", path, strerror(errno));
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	unsigned char *buf = malloc(cap);
	for (;;) {
		if (!buf) {
			fprintf(stderr, "copy: out of memory reading %s\n", path);
			close(fd);
			return NULL;
		}
		if (n == cap) {
			unsigned char *bigger = realloc(buf, cap * 2);
			if (!bigger)
				free(buf);
			buf = bigger;
			cap *= 2;
			continue;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			fprintf(stderr, "copy: read %s: %s\n", path, strerror(errno));
			free(buf);
			close(fd);
			return NULL;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	*len = n;
	return buf;
}

/* Compares `got` with `want`; prints the first difference. 0 when equal. */
static int compare(const char *what, const unsigned char *got, size_t got_len,
		   const unsigned char *want, size_t want_len)
{
	if (got_len != want_len) {
		fprintf(stderr, "copy: MISMATCH: %s has %zu bytes, expected %zu\n", what, got_len,
			want_len);
		return 1;
	}
	for (size_t i = 0; i < want_len; i++) {
		if (got[i] != want[i]) {
			fprintf(stderr, "copy: MISMATCH: %s byte %zu is 0x%02x, expected 0x%02x\n",
				what, i, got[i], want[i]);
			return 1;
		}
	}
	printf("verified: %s, %zu bytes\n", what, want_len);
	return 0;
}

static void print_report(const char *what, const struct p2pdma_report *r)
{
	printf("%s: %" PRIu64 " bytes on the %s path%s\n", what, r->bytes, path_name(r->path),
	       r->retried ? " (retried after the fast path failed)" : "");
}

/* Opens the module and allocates `size` bytes of its first accelerator's
 * memory; NULL (and the host-memory device is used) when there is none. */
static struct p2pdma_mem *accelerator_memory(struct p2pdma_module **module, size_t size)
{
	struct p2pdma_mem *mem = NULL;
	uint32_t index;
	int rc;

	if (access("/dev/p2pdma", F_OK) != 0)
		return NULL;
	rc = p2pdma_module_open(module);
	if (rc < 0) {
		printf("memory: cannot use the p2pdma module: %s\n", p2pdma_last_error());
		return NULL;
	}
	rc = p2pdma_module_num_accelerators(*module);
	if (rc <= 0) {
		printf("memory: the p2pdma module has no accelerator\n");
		return NULL;
	}
	rc = p2pdma_module_accelerator_index(*module, 0, &index);
	if (rc == 0)
		rc = p2pdma_mem_module_alloc(*module, index, size, 0, &mem);
	if (rc < 0) {
		printf("memory: cannot allocate accelerator memory: %s\n", p2pdma_last_error());
		return NULL;
	}
	printf("memory: %zu bytes of accelerator %" PRIu32 "'s BAR memory\n", size, index);
	return mem;
}

int main(int argc, char **argv)
{
	struct p2pdma_module *module = NULL;
	struct p2pdma_file *src = NULL, *dst = NULL;
	struct p2pdma_mem *mem = NULL;
	struct p2pdma_engine *engine = NULL;
	struct p2pdma_report report;
	struct p2pdma_path_stats stats;
	unsigned char *want = NULL, *got = NULL, *written = NULL;
	size_t want_len = 0, written_len = 0, mem_offset = 4097;
	char reason[512];
	int status = 1, rc, fd;

	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: %s SRC DST [MEM_OFFSET]\n", argv[0]);
		return 2;
	}
	if (argc == 4) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(argv[3], &end, 0);
		if (errno || *end || end == argv[3] || v > SIZE_MAX / 2) {
			fprintf(stderr, "copy: bad MEM_OFFSET '%s'\n", argv[3]);
			return 2;
		}
		mem_offset = (size_t)v;
	}
	printf("libp2pdma %s\n", p2pdma_version());

	rc = p2pdma_file_open(argv[1], 0, &src);
	if (rc < 0)
		return fail("p2pdma_file_open(SRC)", rc);
	int64_t size = p2pdma_file_size(src);
	if (size < 0) {
		fail("p2pdma_file_size", (int)size);
		goto out;
	}
	size_t len = (size_t)size;

	/* Room for the file at `mem_offset`, and at least one byte. */
	size_t mem_size = mem_offset + len + 1;
	mem = accelerator_memory(&module, mem_size);
	if (!mem) {
		rc = p2pdma_mem_host_new(mem_size, &mem);
		if (rc < 0) {
			fail("p2pdma_mem_host_new", rc);
			goto out;
		}
		printf("memory: %zu bytes of the host-memory device\n", mem_size);
	}

	rc = p2pdma_engine_new("auto", 0, 0, module, &engine);
	if (rc < 0) {
		fail("p2pdma_engine_new", rc);
		goto out;
	}
	rc = p2pdma_path_choice(engine, src, mem, reason, sizeof(reason));
	if (rc < 0) {
		fail("p2pdma_path_choice", rc);
		goto out;
	}
	printf("path: %s\nreason: %s\n", path_name(rc), reason);

	/* The file into the memory, then the memory back to the host. */
	rc = p2pdma_read(engine, src, 0, mem, mem_offset, len, &report);
	if (rc < 0) {
		fail("p2pdma_read", rc);
		goto out;
	}
	print_report("read", &report);
	got = malloc(len ? len : 1);
	if (!got) {
		fprintf(stderr, "copy: out of memory\n");
		goto out;
	}
	rc = p2pdma_mem_read(mem, mem_offset, got, len);
	if (rc < 0) {
		fail("p2pdma_mem_read", rc);
		goto out;
	}
	want = slurp(argv[1], &want_len);
	if (!want || compare("memory against SRC", got, len, want, want_len))
		goto out;

	/* The memory out to a new file, checked the same way. */
	fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "copy: create %s: %s\n", argv[2], strerror(errno));
		goto out;
	}
	close(fd);
	rc = p2pdma_file_open(argv[2], 1, &dst);
	if (rc < 0) {
		fail("p2pdma_file_open(DST)", rc);
		goto out;
	}
	rc = p2pdma_write(engine, dst, 0, mem, mem_offset, len, &report);
	if (rc < 0) {
		fail("p2pdma_write", rc);
		goto out;
	}
	print_report("write", &report);
	written = slurp(argv[2], &written_len);
	if (!written || compare("DST against SRC", written, written_len, want, want_len))
		goto out;

	static const int paths[] = { P2PDMA_PATH_P2P, P2PDMA_PATH_BOUNCE, P2PDMA_PATH_NVME_CMD,
				     P2PDMA_PATH_DIRECT };
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		int path = paths[i];
		rc = p2pdma_stats(engine, path, &stats);
		if (rc < 0) {
			fail("p2pdma_stats", rc);
			goto out;
		}
		printf("stats %s: %" PRIu64 " bytes, %" PRIu64 " transfers, %" PRIu64
		       " I/Os, %" PRIu64 " retries, %" PRIu64 " ns storage, %" PRIu64
		       " ns copy, %" PRIu64 " ns total\n",
		       path_name(path), stats.bytes, stats.transfers, stats.ios, stats.retries,
		       stats.storage_ns, stats.copy_ns, stats.total_ns);
	}
	printf("copy: ok\n");
	status = 0;
out:
	free(written);
	free(want);
	free(got);
	p2pdma_file_close(dst);
	p2pdma_engine_free(engine);
	p2pdma_mem_free(mem);
	p2pdma_module_close(module);
	p2pdma_file_close(src);
	return status;
}
