/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * p2pdma.h: the C API of libp2pdma. Moves data between files or NVMe
 * namespaces and accelerator memory, by PCI peer-to-peer DMA where the
 * topology allows it and through a pipelined host bounce ring otherwise.
 *
 * Every function returns 0 (or a count, or a path) on success and a negative
 * errno on failure; p2pdma_last_error() then describes the failure, and
 * p2pdma_last_nvme_status() gives an NVMe controller's status when one failed
 * a command. A read past the end of a file is P2PDMA_ERR_EOF (-ERANGE), not a
 * medium error (-ENODATA). Link with -lp2pdma (pkg-config --libs p2pdma).
 */

#ifndef P2PDMA_H
#define P2PDMA_H

/* Generated from libp2pdma/capi/src by cbindgen (libp2pdma/capi/build.rs); do not edit. */

#include <stddef.h>
#include <stdint.h>

/**
 * The most dimensions a strided shape has.
 */
#define P2PDMA_MAX_DIMS 3

/**
 * The most hops a route report describes one by one.
 */
#define P2PDMA_ROUTE_MAX_HOPS 8

/**
 * The library's own return codes, beside negative errnos.
 */
typedef enum p2pdma_error_code {
    /**
     * A read reaches past the end of the file: the file is shorter than
     * `file_offset + len` when the read runs (or became shorter while it
     * ran). Equal to `-ERANGE`, which no storage I/O returns, so it is never
     * confused with a medium error (`-ENODATA`) or another device error.
     * Nothing partial is reported as success.
     */
    P2PDMA_ERR_EOF = -34,
    /**
     * The library hit an internal error (a bug) and caught it before it
     * reached the caller; equal to `-ENOTRECOVERABLE`. The handles passed
     * to that call remain valid, and p2pdma_last_error() says what
     * happened.
     */
    P2PDMA_ERR_INTERNAL = -131,
} p2pdma_error_code;

/**
 * A transfer path, as p2pdma_path_choice() returns it and as
 * `p2pdma_report.path` and p2pdma_stats() use it.
 */
typedef enum p2pdma_path {
    /**
     * Storage DMAs straight into accelerator memory (PCI peer-to-peer),
     * through the block layer (`O_DIRECT` on P2P pages).
     */
    P2PDMA_PATH_P2P = 1,
    /**
     * Staged through a pinned host bounce ring, pipelined.
     */
    P2PDMA_PATH_BOUNCE = 2,
    /**
     * NVMe commands built by the library and sent through the namespace's
     * generic character device, with the accelerator's bus addresses.
     */
    P2PDMA_PATH_NVME_CMD = 3,
    /**
     * NVMe commands in queues in accelerator memory, on a controller this
     * process drives through VFIO: no kernel in the I/O path.
     */
    P2PDMA_PATH_QUEUES = 4,
    /**
     * Not a path: for p2pdma_stats() only, the bytes reads copied out of
     * the page cache (whatever the path chosen) instead of moving them
     * from the device again.
     */
    P2PDMA_PATH_PAGE_CACHE = 5,
    /**
     * The storage DMAs straight into (or out of) host memory by
     * `O_DIRECT`, with no staging copy: how host memory is read and
     * written.
     */
    P2PDMA_PATH_DIRECT = 6,
} p2pdma_path;

/**
 * Where a strided read puts its runs in memory.
 */
typedef enum p2pdma_layout {
    /**
     * Back to back from the memory offset, in file order.
     */
    P2PDMA_LAYOUT_PACKED = 0,
    /**
     * Each run at the memory offset plus its distance from the first
     * run's start: the memory mirrors the file's range.
     */
    P2PDMA_LAYOUT_STRIDED = 1,
} p2pdma_layout;

/**
 * How a strided read moves its runs (see `docs/transfer.md`).
 */
typedef enum p2pdma_strided_mode {
    /**
     * Chosen by the library's cost model; the reason says why.
     */
    P2PDMA_STRIDED_AUTO = 0,
    /**
     * One read of the whole range, gaps included (strided layout only).
     */
    P2PDMA_STRIDED_RC = 1,
    /**
     * One read per run.
     */
    P2PDMA_STRIDED_SC = 2,
    /**
     * The range through host memory, packed there, then copied.
     */
    P2PDMA_STRIDED_TAT = 3,
} p2pdma_strided_mode;

/**
 * Which way a strided transfer in a `struct p2pdma_strided_op` moves.
 */
typedef enum p2pdma_direction {
    /**
     * From the file into the memory.
     */
    P2PDMA_DIR_READ = 0,
    /**
     * From the memory into the file.
     */
    P2PDMA_DIR_WRITE = 1,
} p2pdma_direction;

/**
 * What a place of a route is (`p2pdma_place.kind`).
 */
typedef enum p2pdma_place_kind {
    /**
     * A file or block device (`file`), from byte `offset` on. Only as the
     * source or the destination.
     */
    P2PDMA_PLACE_STORAGE = 1,
    /**
     * Memory (`mem`): an accelerator's, or the host-memory device. As an
     * end, from byte `offset` on; as a staging place, the `len` bytes
     * from `offset`.
     */
    P2PDMA_PLACE_MEMORY = 2,
    /**
     * Pinned host memory the library stages through (staging only).
     */
    P2PDMA_PLACE_HOST = 3,
} p2pdma_place_kind;

/**
 * The transfer engine: configuration, pooled io_uring rings and bounce
 * buffers, and per-path counters.
 */
typedef struct p2pdma_engine p2pdma_engine;

/**
 * A file, or a raw block device such as an NVMe namespace, opened for
 * transfers (with `O_DIRECT`).
 */
typedef struct p2pdma_file p2pdma_file;

/**
 * Accelerator memory: BAR memory allocated from the module, or the
 * host-memory device standing in for an accelerator. It is only reached
 * through explicit copies (p2pdma_mem_write(), p2pdma_mem_read()) and
 * transfers.
 */
typedef struct p2pdma_mem p2pdma_mem;

/**
 * An open handle on the p2pdma kernel module (`/dev/p2pdma`). It may be
 * closed before the memory allocated from it is freed: each allocation
 * keeps what it needs.
 */
typedef struct p2pdma_module p2pdma_module;

/**
 * A read started by p2pdma_store_prefetch(), consumed by
 * p2pdma_store_consume().
 */
typedef struct p2pdma_prefetch p2pdma_prefetch;

/**
 * An object store: objects on a file or device, their map kept through
 * crashes.
 */
typedef struct p2pdma_store p2pdma_store;

/**
 * A strided transfer running in the background, from
 * p2pdma_submit_strided(): ask whether it is done with
 * p2pdma_ticket_done(), wait for its result with p2pdma_ticket_wait(),
 * free it with p2pdma_ticket_free().
 */
typedef struct p2pdma_ticket p2pdma_ticket;

/**
 * What one transfer did.
 */
typedef struct p2pdma_report {
    /**
     * Bytes moved: always the length asked for.
     */
    uint64_t bytes;
    /**
     * The path that moved them (a `P2PDMA_PATH_*` value).
     */
    int path;
    /**
     * 1 when the P2P or NVMe-command path failed and the bounce path redid
     * the transfer, else 0.
     */
    int retried;
} p2pdma_report;

/**
 * One dimension of a strided shape: `count` steps of `stride` bytes.
 */
typedef struct p2pdma_dim {
    /**
     * Bytes between the starts of consecutive steps.
     */
    uint64_t stride;
    /**
     * Steps (at least 1).
     */
    uint64_t count;
} p2pdma_dim;

/**
 * What one strided read did.
 */
typedef struct p2pdma_strided_report {
    /**
     * Bytes of interest moved: the runs' total.
     */
    uint64_t bytes;
    /**
     * Bytes read from storage, with each read's block rounding.
     */
    uint64_t storage_bytes;
    /**
     * Transfers issued.
     */
    uint64_t calls;
    /**
     * The mode that moved the runs (a `P2PDMA_STRIDED_*` value, never
     * AUTO).
     */
    int mode;
    /**
     * 1 when a transfer was redone on the bounce path, else 0.
     */
    int retried;
} p2pdma_strided_report;

/**
 * One strided transfer, for p2pdma_submit_strided() and
 * p2pdma_submit_strided_batch(): the arguments of p2pdma_read_strided()
 * or p2pdma_write_strided() in a struct.
 */
typedef struct p2pdma_strided_op {
    /**
     * `P2PDMA_DIR_READ` or `P2PDMA_DIR_WRITE`.
     */
    int dir;
    /**
     * The file (open for writing, to write).
     */
    const struct p2pdma_file *file;
    /**
     * The first run's file offset.
     */
    uint64_t base;
    /**
     * Bytes per run.
     */
    uint64_t run;
    /**
     * The dimensions, innermost first; the first `ndims` are used.
     */
    struct p2pdma_dim dims[P2PDMA_MAX_DIMS];
    /**
     * How many dimensions (0 to `P2PDMA_MAX_DIMS`).
     */
    size_t ndims;
    /**
     * The memory.
     */
    const struct p2pdma_mem *mem;
    /**
     * Offset in the memory where the layout starts.
     */
    size_t mem_offset;
    /**
     * A `P2PDMA_LAYOUT_*` value.
     */
    int layout;
    /**
     * A `P2PDMA_STRIDED_*` value.
     */
    int mode;
} p2pdma_strided_op;

/**
 * The counters of one path of an engine, since it was created.
 */
typedef struct p2pdma_path_stats {
    /**
     * Bytes moved by completed transfers.
     */
    uint64_t bytes;
    /**
     * Completed transfers.
     */
    uint64_t transfers;
    /**
     * Storage I/Os issued.
     */
    uint64_t ios;
    /**
     * Transfers that failed on this path and were redone on the bounce
     * path.
     */
    uint64_t retries;
    /**
     * Nanoseconds spent waiting for storage.
     */
    uint64_t storage_ns;
    /**
     * Nanoseconds spent copying between host and device memory.
     */
    uint64_t copy_ns;
    /**
     * Wall-clock nanoseconds of completed transfers.
     */
    uint64_t total_ns;
} p2pdma_path_stats;

/**
 * A place on a route.
 */
typedef struct p2pdma_place {
    /**
     * A `P2PDMA_PLACE_*` value.
     */
    int kind;
    /**
     * The file, for `P2PDMA_PLACE_STORAGE`; else NULL.
     */
    const struct p2pdma_file *file;
    /**
     * The memory, for `P2PDMA_PLACE_MEMORY`; else NULL.
     */
    const struct p2pdma_mem *mem;
    /**
     * Where the route's bytes (or the staging region) start.
     */
    uint64_t offset;
    /**
     * The staging region's length, for memory between the ends.
     */
    uint64_t len;
} p2pdma_place;

/**
 * What a copy along a route did.
 */
typedef struct p2pdma_route_report {
    /**
     * Bytes moved (the length asked for).
     */
    uint64_t bytes;
    /**
     * Hops of the route.
     */
    uint32_t hops;
    /**
     * Chunks the copy was cut into.
     */
    uint32_t chunks;
    /**
     * Bytes per chunk.
     */
    uint64_t chunk;
    /**
     * The whole copy's time, in nanoseconds.
     */
    uint64_t elapsed_ns;
    /**
     * Each hop's time moving chunks, in nanoseconds (the first
     * `P2PDMA_ROUTE_MAX_HOPS` hops).
     */
    uint64_t hop_busy_ns[P2PDMA_ROUTE_MAX_HOPS];
} p2pdma_route_report;

/**
 * One object of the store's map.
 */
typedef struct p2pdma_object {
    /**
     * The object's id.
     */
    uint64_t id;
    /**
     * Its first 4 KiB block on the device.
     */
    uint64_t start_block;
    /**
     * Its size in bytes.
     */
    uint64_t size;
} p2pdma_object;

/**
 * Counters of a store's page cache, on one accelerator or summed over all.
 */
typedef struct p2pdma_cache_stats {
    /**
     * Page accesses served from a frame of the accessing accelerator.
     */
    uint64_t hits;
    /**
     * Page accesses that fetched the page first.
     */
    uint64_t misses;
    /**
     * Of the misses, those filled from another accelerator's copy.
     */
    uint64_t remote;
    /**
     * Copies dropped because another accelerator wrote their page.
     */
    uint64_t invalidations;
    /**
     * Frames.
     */
    uint64_t frames;
    /**
     * Frames holding a page now.
     */
    uint64_t cached;
    /**
     * Of those, written since they were last written back.
     */
    uint64_t dirty;
} p2pdma_cache_stats;

/**
 * One NVMe command a prefetch submitted: its I/O queue and its command
 * identifier there.
 */
typedef struct p2pdma_command_id {
    /**
     * The I/O queue's id.
     */
    uint16_t queue;
    /**
     * The command identifier (CID).
     */
    uint16_t cid;
} p2pdma_command_id;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The library's version, such as "0.1.0" (a static string).
 */
const char *p2pdma_version(void);

/**
 * The message of the calling thread's last failure, NUL-terminated; an
 * empty string before the first. Successful calls leave it unchanged. The
 * string belongs to the library and stays valid until the thread's next
 * failing call or its exit.
 */
const char *p2pdma_last_error(void);

/**
 * The NVMe status of the calling thread's last failure, when an NVMe
 * controller failed a command of that call (the NVMe-command path); 0 when
 * the last failure was anything else, and before the first. Successful
 * calls leave it unchanged, as they leave p2pdma_last_error().
 *
 * The call itself returned the errno the kernel's block layer gives the
 * same status, so a failure reads the same on every path: -ENODATA for a
 * medium error (Write Fault, Unrecovered Read Error, Deallocated or
 * Unwritten Logical Block...), -EILSEQ for end-to-end protection errors,
 * -EIO for most others. p2pdma_last_error() names the status in words,
 * e.g. "Unrecovered Read Error (SCT 0x2, SC 0x81)".
 *
 * The value is the status field of the completion queue entry without its
 * phase tag, as the kernel passes it: Status Code `status & 0xff`, Status
 * Code Type `(status >> 8) & 0x7`, Command Retry Delay
 * `(status >> 11) & 0x3`, More `status & 0x2000`, Do Not Retry
 * `status & 0x4000`. An Unrecovered Read Error is `(status & 0x7ff) ==
 * 0x281`.
 */
uint32_t p2pdma_last_nvme_status(void);

/**
 * Opens the p2pdma kernel module (`/dev/p2pdma`) and checks that its ABI
 * is compatible; stores the handle in `*out`.
 *
 * Returns 0, or a negative errno: -EINVAL when `out` is NULL, -ENOENT when
 * the module is not loaded, -EACCES without permission to its device node,
 * -EPROTO when its ABI is incompatible. On failure `*out` is NULL.
 *
 * # Safety
 *
 * `out` must be NULL or point to writable storage for a pointer.
 */
int p2pdma_module_open(struct p2pdma_module **out);

/**
 * Closes a module handle. Memory allocated from it stays valid until it is
 * freed, and engines created with it keep working. NULL is ignored.
 *
 * # Safety
 *
 * `module` must be NULL or a handle from p2pdma_module_open() that is not
 * closed yet and that no other thread uses any more.
 */
void p2pdma_module_close(struct p2pdma_module *module);

/**
 * The number of accelerators bound to the module, or a negative errno.
 *
 * # Safety
 *
 * `module` must be NULL or a live handle from p2pdma_module_open().
 */
int p2pdma_module_num_accelerators(const struct p2pdma_module *module);

/**
 * Stores in `*index` the stable index of the `n`-th accelerator (counting
 * from 0, below p2pdma_module_num_accelerators()), the index that
 * p2pdma_mem_module_alloc() takes. Indices need not be contiguous.
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments, -ENODEV when
 * there is no `n`-th accelerator.
 *
 * # Safety
 *
 * `module` must be NULL or a live handle from p2pdma_module_open(); `index`
 * must be NULL or point to a writable `uint32_t`.
 */
int p2pdma_module_accelerator_index(const struct p2pdma_module *module, size_t n, uint32_t *index);

/**
 * Creates the host-memory device: `size` bytes (more than 0) of zeroed,
 * page-aligned host memory standing in for an accelerator, so that every
 * function works on machines without one. AUTO moves data to and from it
 * on the bounce path. Stores the handle in `*out`.
 *
 * Returns 0, or a negative errno: -EINVAL when `out` is NULL or `size` is
 * 0, -ENOMEM. On failure `*out` is NULL.
 *
 * # Safety
 *
 * `out` must be NULL or point to writable storage for a pointer.
 */
int p2pdma_mem_host_new(size_t size, struct p2pdma_mem **out);

/**
 * Allocates `size` bytes of accelerator `accel_index`'s BAR memory, its bus
 * address aligned to `align` (0 for a page), and maps it; stores the
 * handle in `*out`. The memory keeps the module open: `module` may be
 * closed before it is freed.
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments, a bad size or
 * alignment, or an unknown accelerator, -ENOMEM when the BAR has no room.
 * On failure `*out` is NULL.
 *
 * # Safety
 *
 * `module` must be NULL or a live handle from p2pdma_module_open(); `out`
 * must be NULL or point to writable storage for a pointer.
 */
int p2pdma_mem_module_alloc(const struct p2pdma_module *module,
                            uint32_t accel_index,
                            uint64_t size,
                            uint64_t align,
                            struct p2pdma_mem **out);

/**
 * Frees memory from p2pdma_mem_host_new() or p2pdma_mem_module_alloc().
 * NULL is ignored.
 *
 * # Safety
 *
 * `mem` must be NULL or a handle that is not freed yet and that no other
 * thread uses any more.
 */
void p2pdma_mem_free(struct p2pdma_mem *mem);

/**
 * The memory's size in bytes; 0 only when `mem` is NULL (memory is never
 * empty).
 *
 * # Safety
 *
 * `mem` must be NULL or a live memory handle.
 */
size_t p2pdma_mem_size(const struct p2pdma_mem *mem);

/**
 * Copies `len` bytes from `src` into the memory at `offset` (host to
 * device).
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments or a range
 * outside the memory (nothing is copied then).
 *
 * # Safety
 *
 * `mem` must be NULL or a live memory handle; `src` must be NULL or
 * readable for `len` bytes.
 */
int p2pdma_mem_write(const struct p2pdma_mem *mem, size_t offset, const void *src, size_t len);

/**
 * Copies `len` bytes of the memory at `offset` into `dst` (device to
 * host).
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments or a range
 * outside the memory (nothing is copied then).
 *
 * # Safety
 *
 * `mem` must be NULL or a live memory handle; `dst` must be NULL or
 * writable for `len` bytes.
 */
int p2pdma_mem_read(const struct p2pdma_mem *mem, size_t offset, void *dst, size_t len);

/**
 * Opens a file or block device for transfers, read-only, or for reading
 * and writing when `writable` is not 0. The file must exist (create it
 * first to write a new one); it is opened with `O_DIRECT`, so it must be
 * on a filesystem that supports it (tmpfs does not). Stores the handle in
 * `*out`.
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments or a
 * filesystem without `O_DIRECT`, -ENOENT, -EACCES, and so on. On failure
 * `*out` is NULL.
 *
 * # Safety
 *
 * `path` must be NULL or a NUL-terminated string; `out` must be NULL or
 * point to writable storage for a pointer.
 */
int p2pdma_file_open(const char *path, int writable, struct p2pdma_file **out);

/**
 * Closes a file from p2pdma_file_open(). NULL is ignored.
 *
 * # Safety
 *
 * `file` must be NULL or a handle that is not closed yet and that no other
 * thread uses any more.
 */
void p2pdma_file_close(struct p2pdma_file *file);

/**
 * The file's size in bytes when it was opened, or a negative errno
 * (-EINVAL when `file` is NULL).
 *
 * # Safety
 *
 * `file` must be NULL or a live file handle.
 */
int64_t p2pdma_file_size(const struct p2pdma_file *file);

/**
 * Creates a transfer engine with `count` settings, `keys[i]` set to
 * `values[i]` over the defaults, as in a `P2PDMA_CONFIG` file (`path`,
 * `page_cache` (auto, direct or buffered), `chunk`, `depth`, `p2p_submit`,
 * `copy_threads`, `cache_dir`, the strided constants); stores the handle
 * in `*out`. Neither the configuration file nor the environment is read.
 * `module` may be NULL: AUTO then always chooses the bounce path.
 *
 * Returns 0, or a negative errno: -EINVAL for a NULL `out`, NULL arrays
 * with `count` > 0, a NULL or non-UTF-8 string, an unknown key or a bad
 * value (p2pdma_last_error() says which). On failure `*out` is NULL.
 *
 * # Safety
 *
 * `keys` and `values` must be NULL or point to `count` pointers each, each
 * NULL or a NUL-terminated string; `module` must be NULL or a live module
 * handle; `out` must be NULL or point to writable storage for a pointer.
 */
int p2pdma_engine_new_with(const char *const *keys,
                           const char *const *values,
                           size_t count,
                           const struct p2pdma_module *module,
                           struct p2pdma_engine **out);

/**
 * Creates a transfer engine; stores the handle in `*out`.
 *
 * `path_pref` is "auto" (P2P where the module, the memory and the PCIe
 * topology allow it, the bounce path otherwise), "p2p", "bounce",
 * "nvme-cmd" or "queues"; NULL takes the configuration from `$P2PDMA_CONFIG` (or
 * `/etc/p2pdma.conf`) and the environment (`P2PDMA_PATH`,
 * `P2PDMA_PAGE_CACHE`, `P2PDMA_CHUNK`, `P2PDMA_DEPTH`,
 * `P2PDMA_COPY_THREADS`, `P2PDMA_CACHE_DIR`), and lets the
 * engine keep the chunk size and depth it learns per storage device in the
 * user's cache (`docs/transfer.md`); a named path learns nothing. `chunk`
 * (bytes per pipeline chunk, 4 KiB to 64 MiB) and `depth` (chunks in
 * flight, 1 to 256) override it when not 0; 0 chooses automatically. `module` may be NULL: AUTO then always chooses the bounce
 * path. The engine keeps the module open.
 *
 * Returns 0, or a negative errno: -EINVAL for a NULL `out`, an unknown
 * path, or a chunk or depth out of range. On failure `*out` is NULL.
 *
 * # Safety
 *
 * `path_pref` must be NULL or a NUL-terminated string; `module` must be
 * NULL or a live module handle; `out` must be NULL or point to writable
 * storage for a pointer.
 */
int p2pdma_engine_new(const char *path_pref,
                      size_t chunk,
                      size_t depth,
                      const struct p2pdma_module *module,
                      struct p2pdma_engine **out);

/**
 * Frees an engine. NULL is ignored.
 *
 * # Safety
 *
 * `engine` must be NULL or a handle that is not freed yet and that no other
 * thread uses any more.
 */
void p2pdma_engine_free(struct p2pdma_engine *engine);

/**
 * The path transfers between `file` and `mem` take, and why: returns
 * a `P2PDMA_PATH_*` value, and
 * copies the reason into `reason_buf` (truncated to `reason_len` bytes and
 * always NUL-terminated; `reason_buf` may be NULL). Each transfer chooses
 * the same way, on its own call.
 *
 * Returns the path, or a negative errno: -EINVAL for NULL handles,
 * -EOPNOTSUPP when the configured path cannot serve this pair (the
 * reason is then in p2pdma_last_error()).
 *
 * # Safety
 *
 * `engine`, `file` and `mem` must be NULL or live handles; `reason_buf`
 * must be NULL or writable for `reason_len` bytes.
 */
int p2pdma_path_choice(const struct p2pdma_engine *engine,
                       const struct p2pdma_file *file,
                       const struct p2pdma_mem *mem,
                       char *reason_buf,
                       size_t reason_len);

/**
 * Reads `len` bytes at `file_offset` of `file` into `mem` at `mem_offset`,
 * on the path p2pdma_path_choice() reports. Offsets and lengths need no
 * alignment. When `report` is not NULL, it receives what the transfer did.
 *
 * Returns 0 once every byte has landed, or a negative errno, with `*report`
 * zeroed: -EINVAL for NULL handles or a range outside the memory,
 * `P2PDMA_ERR_EOF` when the range runs past the end of the file (nothing
 * partial is reported as success), -ENODATA for a medium error, -EIO and
 * others from storage. When an NVMe controller failed a command,
 * p2pdma_last_nvme_status() gives its status.
 *
 * # Safety
 *
 * `engine`, `file` and `mem` must be NULL or live handles; `report` must be
 * NULL or point to a writable `struct p2pdma_report`.
 */
int p2pdma_read(const struct p2pdma_engine *engine,
                const struct p2pdma_file *file,
                uint64_t file_offset,
                const struct p2pdma_mem *mem,
                size_t mem_offset,
                size_t len,
                struct p2pdma_report *report);

/**
 * Writes `len` bytes of `mem` at `mem_offset` to `file` at `file_offset`
 * (the file must be open for writing). Bytes outside the range are never
 * changed, and a regular file grows only to the end of the data written.
 * When `report` is not NULL, it receives what the transfer did.
 *
 * Returns 0 once every byte is written, or a negative errno, with `*report`
 * zeroed: -EINVAL for NULL handles or a range outside the memory, -EBADF
 * when the file is read-only, -ENOSPC, -ENODATA for a medium error
 * (Write Fault), -EIO and others from storage. When an NVMe controller
 * failed a command, p2pdma_last_nvme_status() gives its status.
 *
 * # Safety
 *
 * `engine`, `file` and `mem` must be NULL or live handles; `report` must be
 * NULL or point to a writable `struct p2pdma_report`.
 */
int p2pdma_write(const struct p2pdma_engine *engine,
                 const struct p2pdma_file *file,
                 uint64_t file_offset,
                 const struct p2pdma_mem *mem,
                 size_t mem_offset,
                 size_t len,
                 struct p2pdma_report *report);

/**
 * Reads runs of `run` bytes of `file`, the first at `base`, the others
 * found by stepping through `ndims` (at most 3) dimensions `dims`,
 * innermost first, into `mem` from `mem_offset`, laid out as `layout` (a
 * `P2PDMA_LAYOUT_*` value), moved as `mode` (a `P2PDMA_STRIDED_*` value)
 * says. A column range of a row-major table is `base` = its first byte,
 * `run` = its width, and one dimension `{row pitch, rows}`. When `report`
 * is not NULL it receives what the read did; when `reason_buf` is not NULL,
 * up to `reason_len` bytes of why that mode (NUL-terminated).
 *
 * Returns 0 once every run has landed, or a negative errno, with
 * `*report` zeroed: -EINVAL for NULL handles, a bad shape (a zero run or
 * count, more than 3 dimensions, a stride below what it steps over,
 * overflow), an unknown layout or mode, RC with the packed layout, or
 * memory that cannot hold the layout; `P2PDMA_ERR_EOF` when a run lies
 * past the end of the file; -ENODATA, -EIO and others from storage.
 * Nothing is read before the arguments are checked.
 *
 * # Safety
 *
 * `engine`, `file` and `mem` must be NULL or live handles; `dims` must be
 * NULL or point to `ndims` `struct p2pdma_dim`; `report` must be NULL or
 * point to a writable `struct p2pdma_strided_report`; `reason_buf` must be
 * NULL or valid for writing `reason_len` bytes.
 */
int p2pdma_read_strided(const struct p2pdma_engine *engine,
                        const struct p2pdma_file *file,
                        uint64_t base,
                        uint64_t run,
                        const struct p2pdma_dim *dims,
                        size_t ndims,
                        const struct p2pdma_mem *mem,
                        size_t mem_offset,
                        int layout,
                        int mode,
                        struct p2pdma_strided_report *report,
                        char *reason_buf,
                        size_t reason_len);

/**
 * Writes the runs of the shape (`base`, `run`, `dims`, as for
 * p2pdma_read_strided()) from `mem`, laid out as `layout` from
 * `mem_offset`, to `file` (open for writing). Exactly the runs' bytes of
 * the file change: writes are one per run (`P2PDMA_STRIDED_SC`; AUTO
 * means SC), and RC and TaT, which would write the gaps or need a
 * contiguous file side, are refused. When `report` is not NULL it
 * receives what the write did; `reason_buf` as for p2pdma_read_strided().
 *
 * Returns 0 once every run is written, or a negative errno, with
 * `*report` zeroed: -EINVAL for NULL handles, a bad shape, an unknown
 * layout or mode, RC or TaT, or memory that does not hold the layout;
 * -EBADF when the file is read-only, -ENOSPC, -EIO and others from
 * storage. Nothing is written before the arguments are checked; after a
 * storage error, runs already written stay written.
 *
 * # Safety
 *
 * As for p2pdma_read_strided().
 */
int p2pdma_write_strided(const struct p2pdma_engine *engine,
                         const struct p2pdma_file *file,
                         uint64_t base,
                         uint64_t run,
                         const struct p2pdma_dim *dims,
                         size_t ndims,
                         const struct p2pdma_mem *mem,
                         size_t mem_offset,
                         int layout,
                         int mode,
                         struct p2pdma_strided_report *report,
                         char *reason_buf,
                         size_t reason_len);

/**
 * Starts the strided transfer `op` on the engine's worker threads and
 * returns at once, storing a ticket for it in `*out`. The transfer holds
 * its file and memory: they may be closed and freed while it runs, and
 * freeing the ticket does not stop it.
 *
 * Returns 0, or a negative errno, with `*out` NULL and nothing started:
 * -EINVAL for NULL arguments, an unknown direction, layout or mode, or a
 * bad shape. What the transfer itself returns (everything
 * p2pdma_read_strided() and p2pdma_write_strided() return) comes from
 * p2pdma_ticket_wait().
 *
 * # Safety
 *
 * `engine` must be NULL or a live engine; `op` must be NULL or point to a
 * `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
 * handles; `out` must be NULL or point to writable storage for a pointer.
 */
int p2pdma_submit_strided(const struct p2pdma_engine *engine,
                          const struct p2pdma_strided_op *op,
                          struct p2pdma_ticket **out);

/**
 * Starts `n` strided transfers at once (they run in parallel on the
 * engine's worker threads) and stores a ticket for `ops[i]` in
 * `tickets[i]`. Every op is checked before any starts: one bad op fails
 * the call with nothing started.
 *
 * Returns 0, or a negative errno, with every `tickets[i]` NULL: -EINVAL
 * for NULL arguments or a bad op (p2pdma_last_error() names it, as
 * `ops[i]`).
 *
 * # Safety
 *
 * `engine` must be NULL or a live engine; `ops` must be NULL or point to
 * `n` `struct p2pdma_strided_op` whose `file` and `mem` are NULL or live
 * handles; `tickets` must be NULL or point to `n` writable pointers.
 */
int p2pdma_submit_strided_batch(const struct p2pdma_engine *engine,
                                const struct p2pdma_strided_op *ops,
                                size_t n,
                                struct p2pdma_ticket **tickets);

/**
 * Whether the ticket's transfer has finished: 1 when it has (its result
 * waits for p2pdma_ticket_wait(), which then returns at once), 0 while it
 * runs, -EINVAL when `ticket` is NULL.
 *
 * # Safety
 *
 * `ticket` must be NULL or a live ticket.
 */
int p2pdma_ticket_done(const struct p2pdma_ticket *ticket);

/**
 * Waits until the ticket's transfer has finished and returns what
 * p2pdma_read_strided() or p2pdma_write_strided() would have returned,
 * storing the report and the reason the same way. The result is handed
 * out once: a second wait on the same ticket returns -EINVAL.
 *
 * # Safety
 *
 * `ticket` must be NULL or a live ticket; `report` must be NULL or point
 * to a writable `struct p2pdma_strided_report`; `reason_buf` must be NULL
 * or valid for writing `reason_len` bytes.
 */
int p2pdma_ticket_wait(const struct p2pdma_ticket *ticket,
                       struct p2pdma_strided_report *report,
                       char *reason_buf,
                       size_t reason_len);

/**
 * Frees a ticket. A transfer still running goes on to the end in the
 * background (with its result dropped). NULL is ignored.
 *
 * # Safety
 *
 * `ticket` must be NULL or a ticket that is not freed yet and that no
 * other thread uses any more.
 */
void p2pdma_ticket_free(struct p2pdma_ticket *ticket);

/**
 * Copies the counters of `path` (a `P2PDMA_PATH_*` value) of `engine`
 * into `*out`.
 *
 * Returns 0, or -EINVAL for NULL arguments or an unknown path.
 *
 * # Safety
 *
 * `engine` must be NULL or a live engine handle; `out` must be NULL or
 * point to a writable `struct p2pdma_path_stats`.
 */
int p2pdma_stats(const struct p2pdma_engine *engine, int path, struct p2pdma_path_stats *out);

/**
 * Copies `len` bytes from `src` to `dst` along a route: through the
 * `nvia` staging places `via`, in order, or, when `nvia` is 0, along the
 * route the library plans (storage straight into an accelerator by P2P
 * where the kernel allows it, through host memory otherwise; one
 * accelerator to another through host memory). Each hop is a stage of one
 * pipeline: the copy is cut into chunks of `chunk` bytes (0: chosen by the
 * library) and every hop works on a different chunk at once. When `report`
 * is not NULL it receives what the copy did; when `reason_buf` is not
 * NULL, up to `reason_len` bytes of the hops and why (NUL-terminated).
 *
 * Returns 0 once every byte is in place, or a negative errno, with
 * `*report` zeroed: -EINVAL for NULL handles, unknown place kinds, storage
 * as a staging place or host memory as an end, two accelerators' memories
 * or two storage places side by side, staging too small for a chunk, or
 * ends too small for `len`; `P2PDMA_ERR_EOF` when the source ends early;
 * -EIO and others from storage.
 *
 * # Safety
 *
 * `engine` must be NULL or a live handle; `src` and `dst` NULL or valid
 * places; `via` NULL or `nvia` valid places; the handles inside them NULL
 * or live; `report` NULL or writable; `reason_buf` NULL or valid for
 * writing `reason_len` bytes.
 */
int p2pdma_copy_route(const struct p2pdma_engine *engine,
                      const struct p2pdma_place *src,
                      const struct p2pdma_place *via,
                      size_t nvia,
                      const struct p2pdma_place *dst,
                      uint64_t len,
                      uint64_t chunk,
                      struct p2pdma_route_report *report,
                      char *reason_buf,
                      size_t reason_len);

/**
 * The store of `file` (opened writable) moved by `engine`: a new, empty
 * one with room for `max_objects` objects when `format` is not 0 (what was
 * on the file is gone), else the one on it. Stores the handle in `*out`.
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments, a file with
 * no store on it, or one too small. On failure `*out` is NULL.
 *
 * # Safety
 *
 * `engine` and `file` must be NULL or live handles; `out` must be NULL or
 * point to writable storage for a pointer.
 */
int p2pdma_store_open(const struct p2pdma_engine *engine,
                      const struct p2pdma_file *file,
                      int format,
                      uint64_t max_objects,
                      struct p2pdma_store **out);

/**
 * p2pdma_store_open() with a page cache of `page`-byte pages (a power of
 * two from 4096 to 2 MiB) over the memories `mems[0..n_mems]`, one per
 * accelerator, each holding at least two pages: accelerator `i`'s copies
 * live in `mems[i]`, every page is homed on one accelerator, and a write
 * on one accelerator drops the others' copies. Written pages stay in the
 * cache until evicted or flushed, or also go to the device at once when
 * `write_through` is not 0.
 *
 * Returns 0, or a negative errno: -EINVAL for NULL arguments, no memory
 * (`n_mems` 0) or more than 64, a bad page size, or the errors of
 * p2pdma_store_open(). On failure `*out` is NULL.
 *
 * # Safety
 *
 * `engine` and `file` must be NULL or live handles; `mems` must be NULL or
 * point to `n_mems` pointers, each NULL or a live handle; `out` must be
 * NULL or point to writable storage for a pointer.
 */
int p2pdma_store_open_cached(const struct p2pdma_engine *engine,
                             const struct p2pdma_file *file,
                             int format,
                             uint64_t max_objects,
                             const struct p2pdma_mem *const *mems,
                             size_t n_mems,
                             size_t page,
                             int write_through,
                             struct p2pdma_store **out);

/**
 * Closes a store (its cached writes go back to the device, not durably:
 * call p2pdma_store_flush() first). NULL is ignored.
 *
 * # Safety
 *
 * `store` must be NULL or a handle that is not closed yet and that no
 * other thread uses any more.
 */
void p2pdma_store_close(struct p2pdma_store *store);

/**
 * Creates an object of `n_bytes` zero bytes and stores its id in `*id`;
 * committed when it returns. Returns 0 or a negative errno (-EINVAL when
 * the store has no room).
 *
 * # Safety
 *
 * `store` must be NULL or a live handle; `id` NULL or writable.
 */
int p2pdma_store_create(const struct p2pdma_store *store, uint64_t n_bytes, uint64_t *id);

/**
 * Deletes object `id`; committed when it returns. Returns 0 or a negative
 * errno (-EINVAL for an id the store does not hold).
 *
 * # Safety
 *
 * `store` must be NULL or a live handle.
 */
int p2pdma_store_delete(const struct p2pdma_store *store, uint64_t id);

/**
 * Resizes object `id` to `n_bytes` (new bytes read as zeros); committed
 * when it returns. Returns 0 or a negative errno.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle.
 */
int p2pdma_store_resize(const struct p2pdma_store *store, uint64_t id, uint64_t n_bytes);

/**
 * Object `id`'s size in bytes, or a negative errno.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle.
 */
int64_t p2pdma_store_size(const struct p2pdma_store *store, uint64_t id);

/**
 * Stores up to `cap` objects of the map in `out`, by id; returns how many
 * the map holds (more than `cap` when `out` was too short), or a negative
 * errno.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle; `out` NULL (with `cap` 0) or
 * writable for `cap` objects.
 */
int64_t p2pdma_store_object_map(const struct p2pdma_store *store,
                                struct p2pdma_object *out,
                                size_t cap);

/**
 * Reads `n` bytes at `offset` of object `id` into `mem` at `mem_offset`;
 * returns `n`, or a negative errno (-EINVAL for an unknown id, -ERANGE
 * past the object's end; nothing is read then).
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles.
 */
int64_t p2pdma_store_read(const struct p2pdma_store *store,
                          uint64_t id,
                          uint64_t offset,
                          size_t n,
                          const struct p2pdma_mem *mem,
                          size_t mem_offset);

/**
 * Writes `n` bytes of `mem` at `mem_offset` to `offset` of object `id`;
 * returns `n`, or a negative errno. Durable after p2pdma_store_flush().
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles.
 */
int64_t p2pdma_store_write(const struct p2pdma_store *store,
                           uint64_t id,
                           uint64_t offset,
                           size_t n,
                           const struct p2pdma_mem *mem,
                           size_t mem_offset);

/**
 * p2pdma_store_read() through accelerator `accel`'s copies of the cache
 * (p2pdma_store_read() picks the accelerator whose memory `mem` is).
 * Returns `n`, or a negative errno (-EINVAL also for an accelerator the
 * cache does not span).
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles.
 */
int64_t p2pdma_store_read_on(const struct p2pdma_store *store,
                             uint32_t accel,
                             uint64_t id,
                             uint64_t offset,
                             size_t n,
                             const struct p2pdma_mem *mem,
                             size_t mem_offset);

/**
 * p2pdma_store_write() into accelerator `accel`'s copy of the cache; every
 * other accelerator's copy of the pages written is dropped. Returns `n`,
 * or a negative errno.
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles.
 */
int64_t p2pdma_store_write_on(const struct p2pdma_store *store,
                              uint32_t accel,
                              uint64_t id,
                              uint64_t offset,
                              size_t n,
                              const struct p2pdma_mem *mem,
                              size_t mem_offset);

/**
 * The cache's counters on accelerator `accel` (summed over all when
 * `accel` is -1) into `*out`. Returns 0, or a negative errno: -EINVAL for
 * NULL arguments, a store without a cache, or an accelerator it does not
 * span.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle; `out` NULL or writable.
 */
int p2pdma_store_cache_stats(const struct p2pdma_store *store,
                             int32_t accel,
                             struct p2pdma_cache_stats *out);

/**
 * Starts reading `n` bytes at `offset` of object `id`; stores the
 * prefetch in `*out`, for p2pdma_store_consume(). Returns 0 or a negative
 * errno.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle; `out` NULL or writable.
 */
int p2pdma_store_prefetch(const struct p2pdma_store *store,
                          uint64_t id,
                          uint64_t offset,
                          size_t n,
                          struct p2pdma_prefetch **out);

/**
 * p2pdma_store_prefetch(), the read landing in `mem` at `mem_offset`
 * itself (by P2P where the engine can): p2pdma_store_consume() into the
 * same place then copies nothing. Returns 0 or a negative errno (-EINVAL
 * when the range does not fit in `mem`, -ERANGE past the object's end).
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles; `out` NULL or writable.
 */
int p2pdma_store_prefetch_into(const struct p2pdma_store *store,
                               uint64_t id,
                               uint64_t offset,
                               size_t n,
                               const struct p2pdma_mem *mem,
                               size_t mem_offset,
                               struct p2pdma_prefetch **out);

/**
 * The NVMe commands `prefetch` has submitted so far, where the store's
 * device is a namespace the library drives (the queues path; none
 * elsewhere): up to `n` of them into `out`. Returns how many there are
 * (more than `n` when `out` is too short), or a negative errno.
 *
 * # Safety
 *
 * `prefetch` must be NULL or a live prefetch; `out` NULL (with `n` 0) or
 * writable for `n` entries.
 */
int64_t p2pdma_prefetch_commands(const struct p2pdma_prefetch *prefetch,
                                 struct p2pdma_command_id *out,
                                 size_t n);

/**
 * Waits for `prefetch` and copies its first `n` bytes into `mem` at
 * `mem_offset`; frees the prefetch either way. Returns `n` or a negative
 * errno.
 *
 * # Safety
 *
 * `store` and `mem` must be NULL or live handles; `prefetch` NULL or a
 * prefetch of that store not consumed or freed yet, used by no other
 * thread.
 */
int64_t p2pdma_store_consume(const struct p2pdma_store *store,
                             struct p2pdma_prefetch *prefetch,
                             const struct p2pdma_mem *mem,
                             size_t mem_offset,
                             size_t n);

/**
 * Makes every write to the store durable. Returns 0 or a negative errno.
 *
 * # Safety
 *
 * `store` must be NULL or a live handle.
 */
int p2pdma_store_flush(const struct p2pdma_store *store);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* P2PDMA_H */
