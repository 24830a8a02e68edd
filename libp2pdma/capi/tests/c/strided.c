/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Strided transfers from C: reads and writes, synchronous, submitted one
 * at a time and in batches, every byte compared with what plain indexing
 * of the file says; bad arguments refused with nothing moved.
 *
 *     strided SRC RW   (SRC: at least 4 MiB to read; RW: a copy of it to
 *                       write; both on a filesystem with O_DIRECT)
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
#define FILE_LEN (4u << 20)

/* The file offset of run k of a shape, by plain indexing. */
static uint64_t run_at(const struct p2pdma_strided_op *op, uint64_t k)
{
	uint64_t off = op->base;
	for (size_t d = 0; d < op->ndims; d++) {
		off += (k % op->dims[d].count) * op->dims[d].stride;
		k /= op->dims[d].count;
	}
	return off;
}

static uint64_t runs_of(const struct p2pdma_strided_op *op)
{
	uint64_t n = 1;
	for (size_t d = 0; d < op->ndims; d++)
		n *= op->dims[d].count;
	return n;
}

/* Where run k lies in memory under the op's layout. */
static size_t mem_at(const struct p2pdma_strided_op *op, uint64_t k)
{
	if (op->layout == P2PDMA_LAYOUT_PACKED)
		return op->mem_offset + k * op->run;
	return op->mem_offset + (run_at(op, k) - op->base);
}

/* Whether the memory holds the file's runs where the layout puts them. */
static int runs_landed(const struct p2pdma_strided_op *op, const unsigned char *file)
{
	unsigned char *got = malloc(op->run);
	int ok = got != NULL;
	for (uint64_t k = 0; ok && k < runs_of(op); k++)
		ok = p2pdma_mem_read(op->mem, mem_at(op, k), got, op->run) == 0 &&
		     memcmp(got, file + run_at(op, k), op->run) == 0;
	free(got);
	return ok;
}

/* Whether the memory still holds the poison outside [from, to). */
static int poison_outside(const struct p2pdma_mem *mem, size_t from, size_t to)
{
	size_t len = p2pdma_mem_size(mem);
	unsigned char *all = malloc(len);
	int ok = all && p2pdma_mem_read(mem, 0, all, len) == 0;
	for (size_t i = 0; ok && i < len; i++)
		if ((i < from || i >= to) && all[i] != POISON)
			ok = 0;
	free(all);
	return ok;
}

static void poison(const struct p2pdma_mem *mem)
{
	size_t len = p2pdma_mem_size(mem);
	unsigned char *p = malloc(len);
	memset(p, POISON, len);
	p2pdma_mem_write(mem, 0, p, len);
	free(p);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: strided SRC RW\n");
		return 2;
	}
	unsigned char *want = file_bytes(argv[1], FILE_LEN);
	struct p2pdma_file *src = NULL, *rw = NULL;
	struct p2pdma_mem *mem = NULL, *mem2 = NULL;
	struct p2pdma_engine *engine = NULL;
	if (p2pdma_file_open(argv[1], 0, &src) != 0 || p2pdma_file_open(argv[2], 1, &rw) != 0 ||
	    p2pdma_mem_host_new(1 << 20, &mem) != 0 || p2pdma_mem_host_new(1 << 20, &mem2) != 0 ||
	    p2pdma_engine_new("bounce", 0, 0, NULL, &engine) != 0) {
		fprintf(stderr, "strided: setup failed: %s\n", p2pdma_last_error());
		return 2;
	}
	struct p2pdma_strided_report rep;
	char reason[512];

	/* A synchronous read: columns 100..130 of 1000-byte rows, 8 rows, in
	 * 3 slices 100000 apart, packed from offset 10. */
	struct p2pdma_strided_op cols = {
		.dir = P2PDMA_DIR_READ, .file = src, .base = 100, .run = 30,
		.dims = { { 1000, 8 }, { 100000, 3 } }, .ndims = 2, .mem = mem, .mem_offset = 10,
		.layout = P2PDMA_LAYOUT_PACKED, .mode = P2PDMA_STRIDED_AUTO,
	};
	poison(mem);
	CHECK(p2pdma_read_strided(engine, src, cols.base, cols.run, cols.dims, cols.ndims, mem,
				  cols.mem_offset, cols.layout, cols.mode, &rep, reason,
				  sizeof(reason)) == 0);
	CHECK(rep.bytes == 24 * 30 && rep.mode != P2PDMA_STRIDED_AUTO);
	CHECK(strstr(reason, "by estimate") != NULL);
	CHECK(runs_landed(&cols, want));
	CHECK(poison_outside(mem, 10, 10 + 24 * 30));

	/* A synchronous write, strided layout: the runs of memory filled with
	 * a counter go to the file; the gaps keep the file's bytes. */
	struct p2pdma_strided_op wr = {
		.dir = P2PDMA_DIR_WRITE, .file = rw, .base = (1 << 20) + 333, .run = 700,
		.dims = { { 5000, 40 } }, .ndims = 1, .mem = mem, .mem_offset = 4096,
		.layout = P2PDMA_LAYOUT_STRIDED, .mode = P2PDMA_STRIDED_SC,
	};
	unsigned char *fill = malloc(1 << 20);
	for (size_t i = 0; i < 1 << 20; i++)
		fill[i] = (unsigned char)(i * 7 + 3);
	p2pdma_mem_write(mem, 0, fill, 1 << 20);
	unsigned char *expect = malloc(FILE_LEN);
	memcpy(expect, want, FILE_LEN);
	for (uint64_t k = 0; k < runs_of(&wr); k++)
		memcpy(expect + run_at(&wr, k), fill + mem_at(&wr, k), wr.run);
	CHECK(p2pdma_write_strided(engine, rw, wr.base, wr.run, wr.dims, wr.ndims, mem,
				   wr.mem_offset, wr.layout, wr.mode, &rep, NULL, 0) == 0);
	CHECK(rep.bytes == 40 * 700 && rep.calls == 40 && rep.mode == P2PDMA_STRIDED_SC);
	/* RC and TaT writes would touch the gaps: refused, nothing written. */
	CHECK(p2pdma_write_strided(engine, rw, 0, 10, wr.dims, 1, mem, 0, P2PDMA_LAYOUT_STRIDED,
				   P2PDMA_STRIDED_RC, &rep, NULL, 0) == -EINVAL);
	CHECK(rep.bytes == 0);
	CHECK(p2pdma_write_strided(engine, rw, 0, 10, wr.dims, 1, mem, 0, P2PDMA_LAYOUT_PACKED,
				   P2PDMA_STRIDED_TAT, NULL, NULL, 0) == -EINVAL);
	unsigned char *now = file_bytes(argv[2], FILE_LEN);
	CHECK(memcmp(now, expect, FILE_LEN) == 0);
	free(now);

	/* A batch: two reads (TaT packed, RC strided) into separate memories,
	 * and a write of a packed region to another part of the file. */
	struct p2pdma_strided_op ops[3] = {
		{ .dir = P2PDMA_DIR_READ, .file = src, .base = 4095, .run = 4097,
		  .dims = { { 65536, 12 } }, .ndims = 1, .mem = mem, .mem_offset = 1,
		  .layout = P2PDMA_LAYOUT_PACKED, .mode = P2PDMA_STRIDED_TAT },
		{ .dir = P2PDMA_DIR_READ, .file = src, .base = (2 << 20) + 5, .run = 64,
		  .dims = { { 100, 10 }, { 1024, 4 }, { 300000, 2 } }, .ndims = 3, .mem = mem2,
		  .mem_offset = 7, .layout = P2PDMA_LAYOUT_STRIDED, .mode = P2PDMA_STRIDED_RC },
		{ .dir = P2PDMA_DIR_WRITE, .file = rw, .base = 3 << 20, .run = 512,
		  .dims = { { 2048, 16 } }, .ndims = 1, .mem = NULL, .mem_offset = 0,
		  .layout = P2PDMA_LAYOUT_PACKED, .mode = P2PDMA_STRIDED_AUTO },
	};
	struct p2pdma_mem *wmem = NULL;
	CHECK(p2pdma_mem_host_new(8192, &wmem) == 0);
	p2pdma_mem_write(wmem, 0, fill + 99, 8192);
	ops[2].mem = wmem;
	for (uint64_t k = 0; k < runs_of(&ops[2]); k++)
		memcpy(expect + run_at(&ops[2], k), fill + 99 + k * 512, 512);
	poison(mem);
	poison(mem2);
	struct p2pdma_ticket *tickets[3] = { NULL, NULL, NULL };
	CHECK(p2pdma_submit_strided_batch(engine, ops, 3, tickets) == 0);
	CHECK(tickets[0] && tickets[1] && tickets[2]);
	/* The write's memory handle may go while the write runs. */
	p2pdma_mem_free(wmem);
	for (int i = 0; i < 3; i++) {
		CHECK(p2pdma_ticket_wait(tickets[i], &rep, reason, sizeof(reason)) == 0);
		CHECK(rep.bytes == ops[i].run * runs_of(&ops[i]));
		CHECK(p2pdma_ticket_done(tickets[i]) == 1);
		/* The result is handed out once. */
		CHECK(p2pdma_ticket_wait(tickets[i], &rep, NULL, 0) == -EINVAL && rep.bytes == 0);
		p2pdma_ticket_free(tickets[i]);
	}
	CHECK(runs_landed(&ops[0], want));
	CHECK(poison_outside(mem, 1, 1 + 12 * 4097));
	/* RC fills the gaps with the file's bytes: the whole range matches. */
	{
		size_t len = 300000 + 3 * 1024 + 9 * 100 + 64;
		unsigned char *got = malloc(len);
		CHECK(p2pdma_mem_read(mem2, 7, got, len) == 0 &&
		      memcmp(got, want + ops[1].base, len) == 0);
		CHECK(poison_outside(mem2, 7, 7 + len));
		free(got);
	}
	now = file_bytes(argv[2], FILE_LEN);
	CHECK(memcmp(now, expect, FILE_LEN) == 0);
	free(now);

	/* One submitted read, its file handle closed while it runs. */
	struct p2pdma_file *src2 = NULL;
	CHECK(p2pdma_file_open(argv[1], 0, &src2) == 0);
	struct p2pdma_strided_op one = cols;
	one.file = src2;
	one.mode = P2PDMA_STRIDED_SC;
	struct p2pdma_ticket *t = NULL;
	poison(mem);
	CHECK(p2pdma_submit_strided(engine, &one, &t) == 0 && t != NULL);
	p2pdma_file_close(src2);
	CHECK(p2pdma_ticket_wait(t, &rep, NULL, 0) == 0 && rep.mode == P2PDMA_STRIDED_SC);
	p2pdma_ticket_free(t);
	CHECK(runs_landed(&cols, want));

	/* Bad ops: nothing starts, every ticket NULL, the op named. */
	struct p2pdma_strided_op bad[2] = { cols, cols };
	bad[1].dims[0].count = 0;
	tickets[0] = tickets[1] = (struct p2pdma_ticket *)&bad;
	CHECK(p2pdma_submit_strided_batch(engine, bad, 2, tickets) == -EINVAL);
	CHECK(tickets[0] == NULL && tickets[1] == NULL);
	CHECK(strstr(p2pdma_last_error(), "ops[1]") != NULL);
	bad[1] = cols;
	bad[1].dir = 7;
	CHECK(p2pdma_submit_strided_batch(engine, bad, 2, tickets) == -EINVAL);
	bad[1] = cols;
	bad[1].ndims = 4;
	CHECK(p2pdma_submit_strided_batch(engine, bad, 2, tickets) == -EINVAL);
	bad[1] = cols;
	bad[1].mem = NULL;
	CHECK(p2pdma_submit_strided_batch(engine, bad, 2, tickets) == -EINVAL);
	CHECK(p2pdma_submit_strided_batch(engine, NULL, 2, tickets) == -EINVAL);
	CHECK(p2pdma_submit_strided_batch(engine, bad, 2, NULL) == -EINVAL);
	CHECK(p2pdma_submit_strided_batch(engine, NULL, 0, NULL) == 0);
	t = (struct p2pdma_ticket *)&bad;
	CHECK(p2pdma_submit_strided(NULL, &cols, &t) == -EINVAL && t == NULL);
	CHECK(p2pdma_submit_strided(engine, NULL, &t) == -EINVAL);
	CHECK(p2pdma_ticket_done(NULL) == -EINVAL);
	CHECK(p2pdma_ticket_wait(NULL, &rep, NULL, 0) == -EINVAL);
	p2pdma_ticket_free(NULL);
	/* A submitted read past the end of the file fails as the read would. */
	struct p2pdma_strided_op past = cols;
	past.dims[1].stride = 3 << 20;
	CHECK(p2pdma_submit_strided(engine, &past, &t) == 0);
	CHECK(p2pdma_ticket_wait(t, &rep, NULL, 0) == P2PDMA_ERR_EOF);
	p2pdma_ticket_free(t);

	p2pdma_engine_free(engine);
	p2pdma_mem_free(mem);
	p2pdma_mem_free(mem2);
	p2pdma_file_close(src);
	p2pdma_file_close(rw);
	free(fill);
	free(expect);
	free(want);
	printf("strided: %d failed\n", failures);
	return failures != 0;
}
