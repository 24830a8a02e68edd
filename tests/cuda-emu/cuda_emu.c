/*
 * cuda_emu.c: a host-memory stand-in for the CUDA driver (libcuda.so.1).
 *
 * The tests of libp2pdma's CUDA backend load this library in place of
 * NVIDIA's driver on machines without a GPU. It implements the part of the
 * CUDA 12.8 driver API the backend, cudarc's safe layer and KvikIO use, under the
 * names cudarc resolves with dlsym (cuMemAlloc_v2, cuMemcpyHtoDAsync_v2,
 * ...), with "device" memory kept in host memory:
 *
 * - Each device's memory is a memfd, sealed against shrinking so that
 *   /dev/udmabuf can export parts of it as dma-bufs, and mapped once for the
 *   emulator's own copies. Device pointers are addresses inside a separate
 *   PROT_NONE reservation of the same size: the CPU cannot dereference them,
 *   as with a real GPU.
 * - Each stream has a worker thread running a FIFO of operations, each one
 *   CUEMU_DELAY_US microseconds after it comes up, so that a caller reading
 *   a destination without synchronizing sees stale bytes.
 *
 * Deliberately strict, so that a caller's mistakes fail here and not first
 * on a real GPU:
 * - everything but cuDriverGetVersion, the error strings and the
 *   statistics needs cuInit(0);
 * - allocations, copies, memsets, stream calls, event creation and
 *   recording, host allocation and registration, dma-buf export and
 *   cuMemGetAddressRange need a current context on the calling thread
 *   (contexts are current per thread, as in CUDA): a worker thread the
 *   caller forgot to bind gets CUDA_ERROR_INVALID_CONTEXT;
 * - releasing the last reference to a primary context destroys it: its
 *   streams, its device memory and its non-portable page-locked memory go;
 * - a context from cuCtxCreate owns the memory and streams made in it, which
 *   cuCtxDestroy frees; the device's NULL stream serves each of its contexts;
 * - cuMemcpyBatchAsync checks every copy before it queues any, and refuses
 *   the legacy NULL stream, as documented;
 * - fresh device memory is filled with 0xA5, never zeroed;
 * - a device range must lie inside one live allocation (or page-locked host
 *   memory, which unified addressing maps for the device) for its whole
 *   length, and a host range must not touch device addresses, else
 *   CUDA_ERROR_INVALID_VALUE: nothing is ever written outside;
 * - cuMemsetD8 and cuMemcpyDtoD return before the work is done: as NVIDIA
 *   documents, they are asynchronous with respect to the host (they run on
 *   the legacy NULL stream);
 * - async copies run later, unless their host side is pageable memory: then
 *   the call returns once the copy is done, as documented;
 * - the legacy NULL stream waits for the blocking streams of its context and
 *   they wait for it; non-blocking streams wait for nothing (the per-thread
 *   default stream handle is taken as the legacy NULL stream);
 * - work queued on a stream of another context than the current one is
 *   refused (CUDA_ERROR_INVALID_HANDLE);
 * - host functions run on the stream's worker, and a CUDA call made from one
 *   fails with CUDA_ERROR_NOT_PERMITTED (CUDA forbids them);
 * - cuDeviceGetPCIBusId writes hex digits in upper case, as the driver does;
 * - only status codes of CUDA 12.8's cudaError_enum are returned (cudarc
 *   maps them to a Rust enum).
 *
 * Configuration, read by the first cuInit:
 *   CUEMU_DEVICES   number of devices, 0 to 8 (default 1; 0: cuInit fails
 *                   with CUDA_ERROR_NO_DEVICE)
 *   CUEMU_MEM_MIB   memory per device in MiB (default 256)
 *   CUEMU_PCI       comma-separated PCI addresses dddd:bb:dd.f, one per
 *                   device (default 0000:e1:00.0, 0000:e2:00.0, ...)
 *   CUEMU_DELAY_US  delay before each queued operation runs (default 200)
 *   CUEMU_PEER      0: no device reaches another's memory
 *                   (cuDeviceCanAccessPeer says 0, cuCtxEnablePeerAccess
 *                   fails); default 1, every pair of devices can
 *   CUEMU_UDMABUF   the udmabuf device (default /dev/udmabuf); dma-buf
 *                   export is CUDA_ERROR_NOT_SUPPORTED where it cannot be
 *                   opened
 *
 * Statistics for the tests: cuemuGetStats and cuemuResetStats, with the
 * layout of struct cuemu_stats below (mirrored by src/lib.rs).
 */

#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<linux/udmabuf.h>)
#include <linux/udmabuf.h>
#endif
#endif

#ifndef UDMABUF_CREATE
/* The kernel's UAPI (linux/udmabuf.h), for systems without its headers. */
#define UDMABUF_FLAGS_CLOEXEC 0x01
struct udmabuf_create {
	uint32_t memfd;
	uint32_t flags;
	uint64_t offset;
	uint64_t size;
};
#define UDMABUF_CREATE _IOW('u', 0x42, struct udmabuf_create)
#endif

_Static_assert(sizeof(struct udmabuf_create) == 24, "udmabuf_create layout");
_Static_assert(UDMABUF_CREATE == 0x40187542u, "UDMABUF_CREATE is _IOW('u', 0x42, 24 bytes)");

#define CUEMU_API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* The CUDA driver ABI (cuda.h, CUDA 12.8)                                  */
/* ------------------------------------------------------------------------ */

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct cuemu_ctx *CUcontext;
typedef struct cuemu_stream *CUstream;
typedef struct cuemu_event *CUevent;
typedef void (*CUhostFn)(void *user_data);
typedef struct {
	char bytes[16];
} CUuuid;

typedef enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_DEINITIALIZED = 4,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
	CUDA_ERROR_OPERATING_SYSTEM = 304,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
	CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_NOT_PERMITTED = 800,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
} CUresult;

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

enum {
	CU_STREAM_NON_BLOCKING = 0x1,
	CU_EVENT_FLAGS = 0x7, /* BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS */
	CU_MEMHOSTALLOC_PORTABLE = 0x1,
	CU_MEMHOSTALLOC_FLAGS = 0x7, /* PORTABLE | DEVICEMAP | WRITECOMBINED */
	CU_MEMHOSTREGISTER_FLAGS = 0xf, /* ... | IOMEMORY | READ_ONLY */
	CU_MEMORYTYPE_HOST = 1,
	CU_MEMORYTYPE_DEVICE = 2,
	CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
	CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 0x1,
	CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST = 0x1,
};

enum pointer_attribute {
	CU_POINTER_ATTRIBUTE_CONTEXT = 1,
	CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
	CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
	CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
	CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
	CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
	CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
	CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
	CU_POINTER_ATTRIBUTE_MAPPED = 13,
	CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
};

enum device_attribute {
	CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
	CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
	CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
	CU_DEVICE_ATTRIBUTE_INTEGRATED = 18,
	CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
	CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
	CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
	CU_DEVICE_ATTRIBUTE_TCC_DRIVER = 35,
	CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
	CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
	CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
	CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
	CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
	CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS = 88,
	CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
	CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM = 91,
	CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99,
	CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
	CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110,
	CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 113,
	CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS = 117,
	CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING = 118,
	CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

/* ------------------------------------------------------------------------ */
/* Statistics (mirrored by src/lib.rs: keep the two in step)                */
/* ------------------------------------------------------------------------ */

/*
 * Copies in one direction. "sync" are the synchronous calls (cuMemcpyHtoD,
 * cuMemcpyDtoD, cuMemcpy...), "async" the async calls whose host side is
 * page-locked (or that have none: device to device), "pageable" the async
 * calls whose host side is pageable memory. Zero-byte copies are not
 * counted.
 */
struct cuemu_copy_stats {
	uint64_t sync_calls;
	uint64_t sync_bytes;
	uint64_t async_calls;
	uint64_t async_bytes;
	uint64_t pageable_calls;
	uint64_t pageable_bytes;
};

/*
 * All fields are 64-bit, in this order, 264 bytes; the caller of
 * cuemuGetStats sets size first (see there). cuemuResetStats zeroes
 * the counters; live_device_allocs and live_registered are gauges of the
 * present state and are kept.
 */
struct cuemu_stats {
	uint64_t size; /* sizeof(struct cuemu_stats), set by the caller */
	struct cuemu_copy_stats htod;
	struct cuemu_copy_stats dtoh;
	struct cuemu_copy_stats dtod;
	uint64_t host_alloc;         /* successful cuMemHostAlloc/cuMemAllocHost */
	uint64_t host_register;      /* successful cuMemHostRegister */
	uint64_t host_unregister;    /* successful cuMemHostUnregister */
	uint64_t live_device_allocs; /* gauge */
	uint64_t live_registered;    /* gauge: registered host ranges */
	uint64_t dmabuf_exports;     /* successful cuMemGetHandleForAddressRange */
	uint64_t no_context;         /* calls refused for want of a context */
	/*
	 * Copies between two devices by cuMemcpyPeer(Async): "sync" and
	 * "async" as above, "pageable" those made while the destination's
	 * context had not enabled access to the source's device (the driver
	 * stages them through host memory).
	 */
	struct cuemu_copy_stats peer;
	uint64_t peer_enables; /* successful cuCtxEnablePeerAccess */
};

_Static_assert(sizeof(struct cuemu_stats) == 264, "cuemu_stats layout");

/* ------------------------------------------------------------------------ */
/* State                                                                    */
/* ------------------------------------------------------------------------ */

#define MAX_DEVICES 8
#define CTX_STACK_MAX 32
#define SMALL_ALIGN ((uint64_t)4096)
#define HUGE_ALIGN ((uint64_t)2 << 20)
#define FRESH_BYTE 0xA5

struct pci {
	unsigned domain, bus, dev, fn;
};

/*
 * A context: each device's primary one, or one cuCtxCreate made (kept,
 * destroyed, on g.created so that a stale handle reads as destroyed).
 */
struct cuemu_ctx {
	int ordinal;
	unsigned peers; /* devices whose memory it reaches (cuCtxEnablePeerAccess) */
	unsigned refs;  /* retains; 0: not created, or destroyed */
	bool created;  /* by cuCtxCreate, not a primary context */
	struct cuemu_ctx *next;
};

/* A free range of a device's memory; the free list is sorted by offset. */
struct extent {
	uint64_t off, len;
	struct extent *next;
};

/* A live device allocation: size as asked for, len as reserved. */
struct dalloc {
	uint64_t off, size, len, id;
	unsigned sync_memops;
	struct cuemu_ctx *ctx; /* the context it was made in, which owns it */
	struct dalloc *next;
};

struct device {
	struct cuemu_ctx ctx;
	struct pci pci;
	int memfd;
	unsigned char *host; /* the memfd, mapped for the emulator's copies */
	uintptr_t base;      /* the PROT_NONE reservation device pointers use */
	uint64_t size;
	struct extent *free;
	struct dalloc *allocs;
	struct cuemu_stream *null_stream;
};

/* Page-locked host memory: from cuMemHostAlloc, or registered. */
struct hrange {
	uintptr_t start;
	size_t size, map_len;
	unsigned flags;
	bool registered;
	struct cuemu_ctx *ctx;
	uint64_t id;
	struct hrange *next;
};

enum op_kind { OP_COPY, OP_SET, OP_HOSTFN, OP_MARK };

/* Work done when stream `stream` has completed operation `seq`. */
struct dep {
	uint64_t stream, seq;
};

struct op {
	enum op_kind kind;
	unsigned char *dst;
	const unsigned char *src;
	size_t n;
	unsigned char value;
	CUhostFn fn;
	void *data;
	uint64_t seq;
	struct dep *deps;
	size_t ndeps;
	struct op *next;
};

struct cuemu_stream {
	uint64_t id;
	struct cuemu_ctx *ctx;
	unsigned flags;
	bool legacy;    /* the device's NULL stream */
	bool destroyed; /* no new work; the worker exits once drained */
	pthread_cond_t wake;
	struct op *head, *tail;
	uint64_t enqueued, completed;
	struct cuemu_stream *next;
};

struct cuemu_event {
	unsigned flags;
	bool recorded;
	struct dep at;
	struct cuemu_event *next;
};

static struct {
	pthread_mutex_t lock;    /* guards everything below */
	pthread_cond_t progress; /* broadcast when a stream completes work */
	bool init_done, initialized;
	CUresult init_result;
	int ndev;
	struct device dev[MAX_DEVICES];
	unsigned delay_us;
	bool peer; /* devices may enable access to each other's memory */
	bool udmabuf;
	char udmabuf_path[256];
	struct hrange *hosts;
	struct cuemu_ctx *created; /* contexts from cuCtxCreate, live or destroyed */
	struct cuemu_stream *streams;
	struct cuemu_event *events;
	uint64_t next_id;
	struct cuemu_stats stats;
} g = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.progress = PTHREAD_COND_INITIALIZER,
};

/* The calling thread's context stack; whether it is a stream worker. */
static _Thread_local struct {
	struct cuemu_ctx *v[CTX_STACK_MAX];
	int depth;
} tls_ctx;
static _Thread_local bool tls_worker;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void lock(void)
{
	pthread_mutex_lock(&g.lock);
}

static void unlock(void)
{
	pthread_mutex_unlock(&g.lock);
}

static CUresult leave(CUresult rc)
{
	unlock();
	return rc;
}

static void wait_progress(void)
{
	pthread_cond_wait(&g.progress, &g.lock);
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static bool add_overflows(uintptr_t a, size_t n)
{
	return n > UINTPTR_MAX - a;
}

static bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
	return a < b + bn && b < a + an;
}

static size_t page_size(void)
{
	return (size_t)sysconf(_SC_PAGESIZE);
}

static void pause_us(unsigned us)
{
	struct timespec ts = { us / 1000000, (long)(us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static CUresult os_error(const char *what)
{
	fprintf(stderr, "cuda-emu: %s: %s\n", what, strerror(errno));
	return CUDA_ERROR_OPERATING_SYSTEM;
}

static struct device *ctx_device(const struct cuemu_ctx *ctx)
{
	return &g.dev[ctx->ordinal];
}

/* The context behind a handle the caller passed, or NULL. */
static struct cuemu_ctx *ctx_check(CUcontext c)
{
	for (int i = 0; i < g.ndev; i++)
		if (c == &g.dev[i].ctx)
			return c;
	for (struct cuemu_ctx *x = g.created; x; x = x->next)
		if (c == x)
			return c;
	return NULL;
}

/* ------------------------------------------------------------------------ */
/* Entering a call: initialization, callbacks, the current context          */
/* ------------------------------------------------------------------------ */

static CUresult current_ctx(struct cuemu_ctx **out)
{
	struct cuemu_ctx *c = tls_ctx.depth ? tls_ctx.v[tls_ctx.depth - 1] : NULL;

	if (!c || !c->refs) {
		g.stats.no_context++;
		return c ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_CONTEXT;
	}
	*out = c;
	return CUDA_SUCCESS;
}

enum need { NEED_INIT, NEED_CTX };

/*
 * Checks what a call needs and takes the lock; on an error the lock is not
 * held. With NEED_CTX, *ctx is the calling thread's current context.
 */
static CUresult enter(enum need need, struct cuemu_ctx **ctx)
{
	CUresult rc;

	if (tls_worker)
		return CUDA_ERROR_NOT_PERMITTED;
	lock();
	rc = g.initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
	if (rc == CUDA_SUCCESS && need == NEED_CTX)
		rc = current_ctx(ctx);
	if (rc != CUDA_SUCCESS)
		unlock();
	return rc;
}

static CUresult enter_device(CUdevice dev, struct device **d)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (dev < 0 || dev >= g.ndev)
		return leave(CUDA_ERROR_INVALID_DEVICE);
	*d = &g.dev[dev];
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Device memory: a first-fit allocator over each device's memfd            */
/* ------------------------------------------------------------------------ */

static bool heap_take(struct device *d, uint64_t len, uint64_t align, uint64_t *off)
{
	struct extent *prev = NULL;

	for (struct extent *e = d->free; e; prev = e, e = e->next) {
		uint64_t start = align_up(e->off, align), end = e->off + e->len;

		if (start > end || end - start < len)
			continue;
		uint64_t head = start - e->off, tail = end - start - len;
		if (head && tail) {
			struct extent *t = malloc(sizeof(*t));
			if (!t)
				return false;
			*t = (struct extent){ start + len, tail, e->next };
			e->len = head;
			e->next = t;
		} else if (head) {
			e->len = head;
		} else if (tail) {
			e->off = start + len;
			e->len = tail;
		} else {
			*(prev ? &prev->next : &d->free) = e->next;
			free(e);
		}
		*off = start;
		return true;
	}
	return false;
}

/* Returns a range to the free list, merged with its neighbours. */
static void heap_give(struct device *d, uint64_t off, uint64_t len)
{
	struct extent *prev = NULL, *next = d->free;

	while (next && next->off < off) {
		prev = next;
		next = next->next;
	}
	if (prev && prev->off + prev->len == off) {
		prev->len += len;
		if (next && prev->off + prev->len == next->off) {
			prev->len += next->len;
			prev->next = next->next;
			free(next);
		}
		return;
	}
	if (next && off + len == next->off) {
		next->off = off;
		next->len += len;
		return;
	}
	struct extent *e = malloc(sizeof(*e));
	if (!e)
		return; /* The range is lost; malloc fails only when all is lost. */
	*e = (struct extent){ off, len, next };
	*(prev ? &prev->next : &d->free) = e;
}

static uint64_t heap_free_bytes(const struct device *d)
{
	uint64_t n = 0;

	for (const struct extent *e = d->free; e; e = e->next)
		n += e->len;
	return n;
}

/* Allocates; *len: the bytes reserved (the asked size rounded up). */
static CUresult alloc_device(struct device *d, struct cuemu_ctx *ctx, size_t size, CUdeviceptr *out,
			     uint64_t *len)
{
	uint64_t align = size >= HUGE_ALIGN ? HUGE_ALIGN : SMALL_ALIGN;
	struct dalloc *a;
	uint64_t off;

	if (size > d->size)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a = malloc(sizeof(*a));
	if (!a)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*a = (struct dalloc){ .size = size, .len = align_up(size, align), .ctx = ctx };
	if (!heap_take(d, a->len, align, &off)) {
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->off = off;
	a->id = ++g.next_id;
	a->next = d->allocs;
	d->allocs = a;
	g.stats.live_device_allocs++;
	*out = d->base + off;
	*len = a->len;
	return CUDA_SUCCESS;
}

static void alloc_release(struct device *d, struct dalloc *a)
{
	struct dalloc **pp = &d->allocs;

	while (*pp != a)
		pp = &(*pp)->next;
	*pp = a->next;
	heap_give(d, a->off, a->len);
	g.stats.live_device_allocs--;
	free(a);
}

/* ------------------------------------------------------------------------ */
/* Address lookups                                                          */
/* ------------------------------------------------------------------------ */

static struct device *device_at(uintptr_t a)
{
	for (int i = 0; i < g.ndev; i++)
		if (a - g.dev[i].base < g.dev[i].size)
			return &g.dev[i];
	return NULL;
}

static bool touches_device(uintptr_t a, size_t n)
{
	for (int i = 0; i < g.ndev; i++)
		if (overlaps(a, n, g.dev[i].base, g.dev[i].size))
			return true;
	return false;
}

/* The live allocation holding device offset `off` (within its asked size). */
static struct dalloc *alloc_at(const struct device *d, uint64_t off)
{
	for (struct dalloc *a = d->allocs; a; a = a->next)
		if (off - a->off < a->size)
			return a;
	return NULL;
}

/* The page-locked host range holding all of [a, a + n), or NULL. */
static struct hrange *host_find(uintptr_t a, size_t n)
{
	for (struct hrange *h = g.hosts; h; h = h->next)
		if (a >= h->start && a + n <= h->start + h->size)
			return h;
	return NULL;
}

static bool host_overlaps(uintptr_t a, size_t n)
{
	for (struct hrange *h = g.hosts; h; h = h->next)
		if (overlaps(a, n, h->start, h->size))
			return true;
	return false;
}

/*
 * The emulator's address for a device-side range: inside one live device
 * allocation, or inside page-locked host memory (mapped for every device
 * under unified addressing).
 */
static CUresult resolve_device(CUdeviceptr p, size_t n, unsigned char **out)
{
	uintptr_t a = (uintptr_t)p;
	struct device *d;

	if (add_overflows(a, n))
		return CUDA_ERROR_INVALID_VALUE;
	d = device_at(a);
	if (d) {
		uint64_t off = a - d->base;
		struct dalloc *al = alloc_at(d, off);
		if (!al || off + n > al->off + al->size)
			return CUDA_ERROR_INVALID_VALUE;
		*out = d->host + off;
		return CUDA_SUCCESS;
	}
	if (!host_find(a, n))
		return CUDA_ERROR_INVALID_VALUE;
	*out = (unsigned char *)a;
	return CUDA_SUCCESS;
}

/* Checks a host-side range; *locked: whether it is page-locked. */
static CUresult resolve_host(uintptr_t a, size_t n, bool *locked)
{
	if (!a || add_overflows(a, n) || touches_device(a, n))
		return CUDA_ERROR_INVALID_VALUE;
	*locked = host_find(a, n) != NULL;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Streams: a worker thread each, running a FIFO of operations              */
/* ------------------------------------------------------------------------ */

struct deplist {
	struct dep *v;
	size_t n, cap;
};

static bool deplist_push(struct deplist *l, struct dep d)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 4;
		struct dep *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return false;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = d;
	return true;
}

static bool pending(const struct cuemu_stream *s)
{
	return s->enqueued > s->completed;
}

static bool blocking(const struct cuemu_stream *s)
{
	return !s->legacy && !(s->flags & CU_STREAM_NON_BLOCKING);
}

/* Adds "all of s's work so far" to l, unless it is done already. */
static bool deplist_add(struct deplist *l, const struct cuemu_stream *s)
{
	return !pending(s) || deplist_push(l, (struct dep){ s->id, s->enqueued });
}

static struct cuemu_stream *stream_by_id(uint64_t id)
{
	for (struct cuemu_stream *s = g.streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* A stream that is gone has finished all its work. */
static bool deps_done(const struct dep *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct cuemu_stream *s = stream_by_id(v[i].stream);
		if (s && s->completed < v[i].seq)
			return false;
	}
	return true;
}

static void wait_deps(const struct dep *v, size_t n)
{
	while (!deps_done(v, n))
		wait_progress();
}

/*
 * What new work on s waits for besides s's own earlier work: the legacy
 * NULL stream waits for the blocking streams of its context, and they wait
 * for it.
 */
static bool implicit_deps(const struct cuemu_stream *s, struct deplist *l)
{
	if (s->legacy) {
		for (struct cuemu_stream *t = g.streams; t; t = t->next)
			if (t->ctx == s->ctx && blocking(t) && !deplist_add(l, t))
				return false;
		return true;
	}
	if (blocking(s))
		return deplist_add(l, ctx_device(s->ctx)->null_stream);
	return true;
}

static void op_run(const struct op *op)
{
	switch (op->kind) {
	case OP_COPY:
		memmove(op->dst, op->src, op->n);
		break;
	case OP_SET:
		memset(op->dst, op->value, op->n);
		break;
	case OP_HOSTFN:
		op->fn(op->data);
		break;
	case OP_MARK:
		break;
	}
}

static void op_free(struct op *op)
{
	free(op->deps);
	free(op);
}

static void stream_unlink(struct cuemu_stream *s)
{
	struct cuemu_stream **pp = &g.streams;

	while (*pp != s)
		pp = &(*pp)->next;
	*pp = s->next;
}

static void *stream_main(void *arg)
{
	struct cuemu_stream *s = arg;

	tls_worker = true;
	lock();
	for (;;) {
		while (!s->head && !s->destroyed)
			pthread_cond_wait(&s->wake, &g.lock);
		struct op *op = s->head;
		if (!op)
			break;
		wait_deps(op->deps, op->ndeps);
		unlock();
		if (op->kind != OP_MARK)
			pause_us(g.delay_us);
		op_run(op);
		lock();
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		s->completed = op->seq;
		op_free(op);
		pthread_cond_broadcast(&g.progress);
	}
	stream_unlink(s);
	pthread_cond_broadcast(&g.progress);
	unlock();
	pthread_cond_destroy(&s->wake);
	free(s);
	return NULL;
}

static struct cuemu_stream *stream_new(struct cuemu_ctx *ctx, unsigned flags, bool legacy)
{
	struct cuemu_stream *s = calloc(1, sizeof(*s));
	pthread_attr_t attr;
	pthread_t thread;
	int err;

	if (!s)
		return NULL;
	*s = (struct cuemu_stream){ .id = ++g.next_id, .ctx = ctx, .flags = flags, .legacy = legacy };
	pthread_cond_init(&s->wake, NULL);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&thread, &attr, stream_main, s);
	pthread_attr_destroy(&attr);
	if (err) {
		pthread_cond_destroy(&s->wake);
		free(s);
		return NULL;
	}
	s->next = g.streams;
	g.streams = s;
	return s;
}

static struct op *op_new(enum op_kind kind)
{
	struct op *op = calloc(1, sizeof(*op));

	if (op)
		op->kind = kind;
	return op;
}

/* Queues op (owned from here on) on s, after `extra` if not NULL. */
static CUresult enqueue(struct cuemu_stream *s, struct op *op, const struct dep *extra)
{
	struct deplist l = { 0 };

	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!implicit_deps(s, &l) || (extra && !deplist_push(&l, *extra))) {
		free(l.v);
		free(op);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	op->deps = l.v;
	op->ndeps = l.n;
	op->seq = ++s->enqueued;
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	pthread_cond_signal(&s->wake);
	return CUDA_SUCCESS;
}

static void wait_stream(const struct cuemu_stream *s)
{
	struct dep d = { s->id, s->enqueued };

	wait_deps(&d, 1);
}

/* Waits for all the work queued so far on the streams of ctx. */
static CUresult wait_ctx(const struct cuemu_ctx *ctx)
{
	struct deplist l = { 0 };
	bool ok = true;

	for (struct cuemu_stream *s = g.streams; s && ok; s = s->next)
		if (s->ctx == ctx)
			ok = deplist_add(&l, s);
	if (ok)
		wait_deps(l.v, l.n);
	free(l.v);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Waits for what a synchronous call on the legacy NULL stream waits for. */
static CUresult wait_legacy(const struct cuemu_ctx *ctx)
{
	struct cuemu_stream *n = ctx_device(ctx)->null_stream;
	struct deplist l = { 0 };
	bool ok = implicit_deps(n, &l) && deplist_add(&l, n);

	if (ok)
		wait_deps(l.v, l.n);
	free(l.v);
	return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The stream behind a handle: NULL, LEGACY and PER_THREAD are the NULL stream. */
static CUresult stream_get(struct cuemu_ctx *ctx, CUstream h, struct cuemu_stream **out)
{
	if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		*out = ctx_device(ctx)->null_stream;
		return CUDA_SUCCESS;
	}
	for (struct cuemu_stream *s = g.streams; s; s = s->next) {
		if (s == h && !s->destroyed) {
			*out = s;
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_HANDLE;
}

/* A stream to queue work on: it must be one of the current context's. */
static CUresult stream_for_work(struct cuemu_ctx *ctx, CUstream h, struct cuemu_stream **out)
{
	CUresult rc = stream_get(ctx, h, out);

	/* The device's NULL stream serves each of its contexts. */
	if (rc == CUDA_SUCCESS && (*out)->ctx != ctx &&
	    !((*out)->legacy && ctx_device((*out)->ctx) == ctx_device(ctx)))
		rc = CUDA_ERROR_INVALID_HANDLE;
	return rc;
}

/* ------------------------------------------------------------------------ */
/* Initialization and configuration                                         */
/* ------------------------------------------------------------------------ */

struct config {
	unsigned long long devices, mem_mib, delay_us, peer;
	struct pci pci[MAX_DEVICES];
	const char *udmabuf;
};

static bool env_uint(const char *name, unsigned long long def, unsigned long long min,
		     unsigned long long max, unsigned long long *out)
{
	const char *s = getenv(name);
	char *end;

	*out = def;
	if (!s || !*s)
		return true;
	errno = 0;
	*out = strtoull(s, &end, 10);
	if (*s >= '0' && *s <= '9' && !errno && !*end && *out >= min && *out <= max)
		return true;
	fprintf(stderr, "cuda-emu: %s=%s: expected an integer from %llu to %llu\n", name, s, min,
		max);
	return false;
}

static bool parse_pci(const char *s, struct pci *p)
{
	int used = -1;

	if (sscanf(s, "%4x:%2x:%2x.%1x%n", &p->domain, &p->bus, &p->dev, &p->fn, &used) != 4)
		return false;
	return used >= 0 && s[used] == '\0' && p->dev <= 0x1f && p->fn <= 7;
}

/* CUEMU_PCI: one address per device, defaults for devices it leaves out. */
static bool config_pci(struct config *c)
{
	const char *env = getenv("CUEMU_PCI");
	char *copy, *save = NULL, *tok;
	unsigned i = 0;
	bool ok = true;

	for (unsigned k = 0; k < MAX_DEVICES; k++)
		c->pci[k] = (struct pci){ 0, 0xe1 + k, 0, 0 };
	if (!env || !*env)
		return true;
	copy = strdup(env);
	if (!copy)
		return false;
	for (tok = strtok_r(copy, ",", &save); tok && ok && i < MAX_DEVICES;
	     tok = strtok_r(NULL, ",", &save))
		ok = parse_pci(tok, &c->pci[i++]);
	if (!ok)
		fprintf(stderr, "cuda-emu: CUEMU_PCI=%s: expected dddd:bb:dd.f[,...]\n", env);
	free(copy);
	return ok;
}

static bool config_read(struct config *c)
{
	c->udmabuf = getenv("CUEMU_UDMABUF");
	if (!c->udmabuf || !*c->udmabuf)
		c->udmabuf = "/dev/udmabuf";
	return env_uint("CUEMU_DEVICES", 1, 0, MAX_DEVICES, &c->devices) &&
	       env_uint("CUEMU_MEM_MIB", 256, 1, 1 << 16, &c->mem_mib) &&
	       env_uint("CUEMU_DELAY_US", 200, 0, 10000000, &c->delay_us) &&
	       env_uint("CUEMU_PEER", 1, 0, 1, &c->peer) && config_pci(c);
}

/* A PROT_NONE reservation of size bytes, 2 MiB aligned; 0 on failure. */
static uintptr_t reserve(uint64_t size)
{
	size_t span = size + HUGE_ALIGN;
	void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	uintptr_t start, head, tail;

	if (p == MAP_FAILED)
		return 0;
	start = align_up((uintptr_t)p, HUGE_ALIGN);
	head = start - (uintptr_t)p;
	tail = span - head - size;
	if (head)
		munmap(p, head);
	if (tail)
		munmap((void *)(start + size), tail);
	return start;
}

static CUresult device_setup(struct device *d, int ordinal, const struct config *c)
{
	char name[32];

	snprintf(name, sizeof(name), "cuemu-device%d", ordinal);
	d->ctx = (struct cuemu_ctx){ .ordinal = ordinal };
	d->pci = c->pci[ordinal];
	d->size = (uint64_t)c->mem_mib << 20;
	d->memfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (d->memfd < 0)
		return os_error("memfd_create");
	if (ftruncate(d->memfd, (off_t)d->size) != 0)
		return os_error("ftruncate");
	/* udmabuf insists on F_SEAL_SHRINK (and refuses F_SEAL_WRITE). */
	if (fcntl(d->memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
		return os_error("F_ADD_SEALS");
	d->host = mmap(NULL, d->size, PROT_READ | PROT_WRITE, MAP_SHARED, d->memfd, 0);
	if (d->host == MAP_FAILED)
		return os_error("mmap of the device memfd");
	d->base = reserve(d->size);
	if (!d->base)
		return os_error("mmap of the device address range");
	d->free = malloc(sizeof(*d->free));
	if (!d->free)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*d->free = (struct extent){ 0, d->size, NULL };
	d->null_stream = stream_new(&d->ctx, 0, true);
	return d->null_stream ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static bool udmabuf_opens(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	if (fd < 0)
		return false;
	close(fd);
	return true;
}

static CUresult init_all(void)
{
	struct config c;
	CUresult rc = CUDA_SUCCESS;

	if (!config_read(&c))
		return CUDA_ERROR_INVALID_VALUE;
	if (c.devices == 0)
		return CUDA_ERROR_NO_DEVICE;
	snprintf(g.udmabuf_path, sizeof(g.udmabuf_path), "%s", c.udmabuf);
	g.udmabuf = udmabuf_opens(g.udmabuf_path);
	g.delay_us = (unsigned)c.delay_us;
	g.peer = c.peer != 0;
	for (int i = 0; i < (int)c.devices && rc == CUDA_SUCCESS; i++) {
		rc = device_setup(&g.dev[i], i, &c);
		g.ndev = i + 1;
	}
	return rc;
}

CUEMU_API CUresult cuInit(unsigned int flags)
{
	CUresult rc;

	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (tls_worker)
		return CUDA_ERROR_NOT_PERMITTED;
	lock();
	if (!g.init_done) {
		g.init_result = init_all();
		g.initialized = g.init_result == CUDA_SUCCESS;
		g.init_done = true;
	}
	rc = g.init_result;
	return leave(rc);
}

CUEMU_API CUresult cuDriverGetVersion(int *version)
{
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	*version = 12080;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Error names                                                              */
/* ------------------------------------------------------------------------ */

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered" },
	{ CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed" },
	{ CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped" },
	{ CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region" },
	{ CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static CUresult error_lookup(CUresult code, const char **out, bool name)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
		if (errors[i].code == code) {
			*out = name ? errors[i].name : errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*out = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUEMU_API CUresult cuGetErrorName(CUresult error, const char **name)
{
	return error_lookup(error, name, true);
}

CUEMU_API CUresult cuGetErrorString(CUresult error, const char **text)
{
	return error_lookup(error, text, false);
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                  */
/* ------------------------------------------------------------------------ */

CUEMU_API CUresult cuDeviceGetCount(int *count)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!count)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*count = g.ndev;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	struct device *d;
	CUresult rc = enter_device(ordinal, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!device)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*device = ordinal;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!name || len <= 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	snprintf(name, (size_t)len, "CUDA emulator (host memory) #%d", dev);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!uuid)
		return leave(CUDA_ERROR_INVALID_VALUE);
	memcpy(uuid->bytes, "cuda-emu-device", 15);
	uuid->bytes[15] = (char)('0' + dev);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!bytes)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*bytes = d->size;
	return leave(CUDA_SUCCESS);
}

static bool device_attribute(const struct device *d, int attr, int *v)
{
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 1; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = (int)d->pci.bus; break;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = (int)d->pci.dev; break;
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = (int)d->pci.domain; break;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *v = 2; break;
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
	case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: *v = 1; break;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
		*v = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
		break;
	case CU_DEVICE_ATTRIBUTE_INTEGRATED:
	case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
	case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: *v = 0; break;
	case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *v = g.udmabuf; break;
	default: return false;
	}
	return true;
}

CUEMU_API CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!value || !device_attribute(d, attr, value))
		return leave(CUDA_ERROR_INVALID_VALUE);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!bus_id || len <= 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	snprintf(bus_id, (size_t)len, "%04X:%02X:%02X.%X", d->pci.domain, d->pci.bus, d->pci.dev,
		 d->pci.fn);
	return leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * A primary context's last release resets it: its streams end once drained,
 * its device memory and its non-portable page-locked memory are freed.
 */
static void ctx_teardown(struct cuemu_ctx *ctx)
{
	struct device *d = ctx_device(ctx);
	struct hrange **pp = &g.hosts;

	for (struct cuemu_stream *s = g.streams; s; s = s->next) {
		if (s->ctx == ctx && !s->legacy && !s->destroyed) {
			s->destroyed = true;
			pthread_cond_signal(&s->wake);
		}
	}
	wait_ctx(ctx);
	for (struct dalloc *a = d->allocs, *next; a; a = next) {
		next = a->next;
		if (a->ctx == ctx)
			alloc_release(d, a);
	}
	while (*pp) {
		struct hrange *h = *pp;
		if (h->ctx != ctx || (h->flags & CU_MEMHOSTALLOC_PORTABLE)) {
			pp = &h->next;
			continue;
		}
		*pp = h->next;
		if (h->registered)
			g.stats.live_registered--;
		else
			munmap((void *)h->start, h->map_len);
		free(h);
	}
}

CUEMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!pctx)
		return leave(CUDA_ERROR_INVALID_VALUE);
	d->ctx.refs++;
	*pctx = &d->ctx;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!d->ctx.refs)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (--d->ctx.refs == 0) {
		ctx_teardown(&d->ctx);
		d->ctx.peers = 0;
	}
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!flags || !active)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*flags = 0;
	*active = d->ctx.refs > 0;
	return leave(CUDA_SUCCESS);
}

/* Replaces the top of the stack; NULL pops (nothing if the stack is empty). */
CUEMU_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!ctx) {
		if (tls_ctx.depth)
			tls_ctx.depth--;
		return leave(CUDA_SUCCESS);
	}
	if (!ctx_check(ctx))
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (!tls_ctx.depth)
		tls_ctx.depth = 1;
	tls_ctx.v[tls_ctx.depth - 1] = ctx;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!pctx)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*pctx = tls_ctx.depth ? tls_ctx.v[tls_ctx.depth - 1] : NULL;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!ctx_check(ctx))
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (tls_ctx.depth == CTX_STACK_MAX)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	tls_ctx.v[tls_ctx.depth++] = ctx;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!tls_ctx.depth)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	tls_ctx.depth--;
	if (pctx)
		*pctx = tls_ctx.v[tls_ctx.depth];
	return leave(CUDA_SUCCESS);
}

/*
 * A new context on dev, current on the calling thread (pushed), with its
 * own streams and memory, which cuCtxDestroy frees.
 */
CUEMU_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct device *d;
	struct cuemu_ctx *c;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	/* CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX */
	if (!pctx || (flags & ~0x1fu))
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (tls_ctx.depth == CTX_STACK_MAX)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	c = calloc(1, sizeof(*c));
	if (!c)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	*c = (struct cuemu_ctx){ .ordinal = d->ctx.ordinal, .refs = 1, .created = true,
				 .next = g.created };
	g.created = c;
	tls_ctx.v[tls_ctx.depth++] = c;
	*pctx = c;
	return leave(CUDA_SUCCESS);
}

/*
 * Destroys a context cuCtxCreate made: waits for its streams, frees its
 * memory, and takes it off the calling thread's stack. A primary context is
 * CUDA_ERROR_INVALID_CONTEXT (it goes with its last release).
 */
CUEMU_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct cuemu_ctx *c;
	CUresult rc = enter(NEED_INIT, NULL);
	int i, j;

	if (rc != CUDA_SUCCESS)
		return rc;
	c = ctx_check(ctx);
	if (!c || !c->created)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (!c->refs)
		return leave(CUDA_ERROR_CONTEXT_IS_DESTROYED);
	ctx_teardown(c);
	c->refs = 0;
	for (i = j = 0; i < tls_ctx.depth; i++)
		if (tls_ctx.v[i] != c)
			tls_ctx.v[j++] = tls_ctx.v[i];
	tls_ctx.depth = j;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuCtxGetDevice(CUdevice *device)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!device)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*device = ctx->ordinal;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuCtxSynchronize(void)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	return leave(wait_ctx(ctx));
}

/* ------------------------------------------------------------------------ */
/* Device memory                                                            */
/* ------------------------------------------------------------------------ */

CUEMU_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
	struct cuemu_ctx *ctx;
	struct device *d;
	uint64_t len;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!dptr || !size)
		return leave(CUDA_ERROR_INVALID_VALUE);
	d = ctx_device(ctx);
	rc = alloc_device(d, ctx, size, dptr, &len);
	unlock();
	/* Only the caller knows the new pointer: fill it without the lock. */
	if (rc == CUDA_SUCCESS)
		memset(d->host + (*dptr - d->base), FRESH_BYTE, len);
	return rc;
}

CUEMU_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct cuemu_ctx *ctx;
	struct device *d;
	struct dalloc *a = NULL;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	d = device_at((uintptr_t)dptr);
	if (d)
		a = alloc_at(d, dptr - d->base);
	if (!a || d->base + a->off != dptr)
		return leave(CUDA_ERROR_INVALID_VALUE);
	alloc_release(d, a);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
	struct cuemu_ctx *ctx;
	struct device *d;
	struct dalloc *a = NULL;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	d = device_at((uintptr_t)dptr);
	if (d)
		a = alloc_at(d, dptr - d->base);
	if (!a)
		return leave(CUDA_ERROR_NOT_FOUND);
	if (base)
		*base = d->base + a->off;
	if (size)
		*size = a->size;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!free_bytes || !total)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*free_bytes = heap_free_bytes(ctx_device(ctx));
	*total = ctx_device(ctx)->size;
	return leave(CUDA_SUCCESS);
}

/* Queues a memset on stream h (lock held, context checked). */
static CUresult memset_queue(struct cuemu_ctx *ctx, CUstream h, CUdeviceptr p, unsigned char v,
			     size_t n)
{
	struct cuemu_stream *s;
	struct op *op;
	unsigned char *dst;
	CUresult rc = stream_for_work(ctx, h, &s);

	if (rc != CUDA_SUCCESS || !n)
		return rc;
	rc = resolve_device(p, n, &dst);
	if (rc != CUDA_SUCCESS)
		return rc;
	op = op_new(OP_SET);
	if (op) {
		op->dst = dst;
		op->n = n;
		op->value = v;
	}
	return enqueue(s, op, NULL);
}

/* Asynchronous with respect to the host, as documented: on the NULL stream. */
CUEMU_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	return leave(memset_queue(ctx, NULL, dst, value, n));
}

CUEMU_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream h)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	return leave(memset_queue(ctx, h, dst, value, n));
}

/* ------------------------------------------------------------------------ */
/* Page-locked host memory                                                  */
/* ------------------------------------------------------------------------ */

static CUresult host_add(struct cuemu_ctx *ctx, uintptr_t start, size_t size, size_t map_len,
			 unsigned flags, bool registered)
{
	struct hrange *h = malloc(sizeof(*h));

	if (!h)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*h = (struct hrange){ start, size, map_len, flags, registered, ctx, ++g.next_id, g.hosts };
	g.hosts = h;
	return CUDA_SUCCESS;
}

/* Unlinks the range of kind `registered` starting exactly at a. */
static struct hrange *host_take(uintptr_t a, bool registered)
{
	for (struct hrange **pp = &g.hosts; *pp; pp = &(*pp)->next) {
		struct hrange *h = *pp;
		if (h->start == a && h->registered == registered) {
			*pp = h->next;
			return h;
		}
	}
	return NULL;
}

static CUresult host_alloc(void **pp, size_t size, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	size_t len;
	void *p;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!pp || !size || (flags & ~CU_MEMHOSTALLOC_FLAGS) || size > SIZE_MAX / 2)
		return leave(CUDA_ERROR_INVALID_VALUE);
	len = align_up(size, page_size());
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	rc = host_add(ctx, (uintptr_t)p, size, len, flags, false);
	if (rc != CUDA_SUCCESS) {
		munmap(p, len);
		return leave(rc);
	}
	g.stats.host_alloc++;
	*pp = p;
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	return host_alloc(pp, size, flags);
}

CUEMU_API CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
	return host_alloc(pp, size, 0);
}

/* Waits for all queued work first: it may still use the memory. */
CUEMU_API CUresult cuMemFreeHost(void *p)
{
	struct cuemu_ctx *ctx;
	struct hrange *h;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	h = host_take((uintptr_t)p, false);
	if (!h)
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (int i = 0; i < g.ndev; i++)
		wait_ctx(&g.dev[i].ctx);
	munmap((void *)h->start, h->map_len);
	free(h);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	uintptr_t a = (uintptr_t)p;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!p || !size || (flags & ~CU_MEMHOSTREGISTER_FLAGS) || add_overflows(a, size) ||
	    touches_device(a, size))
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (host_overlaps(a, size))
		return leave(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	rc = host_add(ctx, a, size, 0, flags, true);
	if (rc == CUDA_SUCCESS) {
		g.stats.host_register++;
		g.stats.live_registered++;
	}
	return leave(rc);
}

CUEMU_API CUresult cuMemHostUnregister(void *p)
{
	struct cuemu_ctx *ctx;
	struct hrange *h;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	h = host_take((uintptr_t)p, true);
	if (!h)
		return leave(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	free(h);
	g.stats.host_unregister++;
	g.stats.live_registered--;
	return leave(CUDA_SUCCESS);
}

/* Under unified addressing the device uses the host address itself. */
CUEMU_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!pdptr || flags != 0 || !host_find((uintptr_t)p, 1))
		return leave(CUDA_ERROR_INVALID_VALUE);
	*pdptr = (CUdeviceptr)(uintptr_t)p;
	return leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* Copies                                                                   */
/* ------------------------------------------------------------------------ */

enum dir { HTOD, DTOH, DTOD, HTOH, PEER };
enum mode { SYNC, ASYNC, PAGEABLE };

struct copy {
	enum dir dir;
	unsigned char *dst;
	const unsigned char *src;
	size_t n;
	bool pageable; /* the host side is pageable memory */
};

static void count_copy(const struct copy *c, enum mode mode)
{
	struct cuemu_copy_stats *s;

	switch (c->dir) {
	case HTOD: s = &g.stats.htod; break;
	case DTOH: s = &g.stats.dtoh; break;
	case DTOD: s = &g.stats.dtod; break;
	case PEER: s = &g.stats.peer; break;
	default: return;
	}
	switch (mode) {
	case SYNC: s->sync_calls++; s->sync_bytes += c->n; break;
	case ASYNC: s->async_calls++; s->async_bytes += c->n; break;
	case PAGEABLE: s->pageable_calls++; s->pageable_bytes += c->n; break;
	}
}

/* Unified addressing: which side is device memory, by the emulator's tables. */
static enum dir classify(CUdeviceptr dst, CUdeviceptr src)
{
	bool d = device_at((uintptr_t)dst) != NULL, s = device_at((uintptr_t)src) != NULL;

	return d ? (s ? DTOD : HTOD) : (s ? DTOH : HTOH);
}

static CUresult copy_host_side(uintptr_t a, size_t n, bool *pageable)
{
	bool locked = false;
	CUresult rc = resolve_host(a, n, &locked);

	*pageable = !locked;
	return rc;
}

/* Checks both ends of c (c->dir and c->n set). */
static CUresult copy_resolve(struct copy *c, CUdeviceptr dst, CUdeviceptr src)
{
	unsigned char *d = (unsigned char *)(uintptr_t)dst, *s = (unsigned char *)(uintptr_t)src;
	bool unused;
	CUresult rc = CUDA_SUCCESS;

	switch (c->dir) {
	case HTOD:
		rc = resolve_device(dst, c->n, &d);
		if (rc == CUDA_SUCCESS)
			rc = copy_host_side(src, c->n, &c->pageable);
		break;
	case DTOH:
		rc = resolve_device(src, c->n, &s);
		if (rc == CUDA_SUCCESS)
			rc = copy_host_side(dst, c->n, &c->pageable);
		break;
	case DTOD:
	case PEER:
		rc = resolve_device(dst, c->n, &d);
		if (rc == CUDA_SUCCESS)
			rc = resolve_device(src, c->n, &s);
		break;
	case HTOH:
		rc = copy_host_side(dst, c->n, &unused);
		if (rc == CUDA_SUCCESS)
			rc = copy_host_side(src, c->n, &c->pageable);
		break;
	}
	c->dst = d;
	c->src = s;
	return rc;
}

/* Copies on the calling thread, after the NULL stream's earlier work. */
static CUresult copy_now(struct cuemu_ctx *ctx, const struct copy *c)
{
	CUresult rc = wait_legacy(ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	unlock();
	memmove(c->dst, c->src, c->n);
	lock();
	count_copy(c, SYNC);
	return CUDA_SUCCESS;
}

/* Queues c on s; pageable host memory makes it synchronous. */
static CUresult copy_queue(struct cuemu_stream *s, const struct copy *c, enum mode mode)
{
	struct op *op = op_new(OP_COPY);
	struct dep done;
	CUresult rc;

	if (op) {
		op->dst = c->dst;
		op->src = c->src;
		op->n = c->n;
	}
	rc = enqueue(s, op, NULL);
	if (rc != CUDA_SUCCESS)
		return rc;
	count_copy(c, mode);
	done = (struct dep){ s->id, s->enqueued };
	if (mode == PAGEABLE)
		wait_deps(&done, 1);
	return CUDA_SUCCESS;
}

/*
 * A synchronous copy. Device to device returns before the copy is done, as
 * documented: it is queued on the NULL stream.
 */
static CUresult copy_sync(CUdeviceptr dst, CUdeviceptr src, size_t n, int dir)
{
	struct cuemu_ctx *ctx;
	struct copy c = { .n = n };
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!n)
		return leave(CUDA_SUCCESS);
	c.dir = dir < 0 ? classify(dst, src) : (enum dir)dir;
	rc = copy_resolve(&c, dst, src);
	if (rc != CUDA_SUCCESS)
		return leave(rc);
	if (c.dir == DTOD)
		return leave(copy_queue(ctx_device(ctx)->null_stream, &c, SYNC));
	return leave(copy_now(ctx, &c));
}

static CUresult copy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, int dir, CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	struct copy c = { .n = n };
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	rc = stream_for_work(ctx, h, &s);
	if (rc != CUDA_SUCCESS || !n)
		return leave(rc);
	c.dir = dir < 0 ? classify(dst, src) : (enum dir)dir;
	rc = copy_resolve(&c, dst, src);
	if (rc != CUDA_SUCCESS)
		return leave(rc);
	return leave(copy_queue(s, &c, c.pageable && c.dir != DTOD ? PAGEABLE : ASYNC));
}

/*
 * A copy from src in sctx's device memory to dst in dctx's, by
 * cuMemcpyPeer (sync: after the current context's NULL stream's work, and
 * before returning, as documented for copies between devices) or
 * cuMemcpyPeerAsync on h. Each range must lie in its own context's device:
 * a pointer of another device is CUDA_ERROR_INVALID_VALUE, as is a
 * destroyed or unknown context. Counted as "pageable" when dctx has not
 * enabled access to sctx's device (the driver stages the copy).
 */
static CUresult copy_peer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
			  size_t n, bool async, CUstream h)
{
	struct cuemu_ctx *ctx, *dc, *sc;
	struct cuemu_stream *s = NULL;
	struct copy c = { .n = n, .dir = PEER };
	struct device *dd, *sd;
	enum mode mode;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	dc = ctx_check(dctx);
	sc = ctx_check(sctx);
	if (!dc || !sc || !dc->refs || !sc->refs)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (async) {
		rc = stream_for_work(ctx, h, &s);
		if (rc != CUDA_SUCCESS)
			return leave(rc);
	}
	if (!n)
		return leave(CUDA_SUCCESS);
	dd = device_at((uintptr_t)dst);
	sd = device_at((uintptr_t)src);
	if (dd != ctx_device(dc) || sd != ctx_device(sc))
		return leave(CUDA_ERROR_INVALID_VALUE);
	rc = copy_resolve(&c, dst, src);
	if (rc != CUDA_SUCCESS)
		return leave(rc);
	mode = (dc->ordinal == sc->ordinal || dc->peers & (1u << sc->ordinal))
		       ? (async ? ASYNC : SYNC)
		       : PAGEABLE;
	if (async)
		return leave(copy_queue(s, &c, mode));
	rc = copy_queue(ctx_device(ctx)->null_stream, &c, mode);
	if (rc == CUDA_SUCCESS) {
		struct dep done = { ctx_device(ctx)->null_stream->id,
				    ctx_device(ctx)->null_stream->enqueued };
		wait_deps(&done, 1);
	}
	return leave(rc);
}

CUEMU_API CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx,
				size_t n)
{
	return copy_peer(dst, dctx, src, sctx, n, false, NULL);
}

CUEMU_API CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src,
				     CUcontext sctx, size_t n, CUstream h)
{
	return copy_peer(dst, dctx, src, sctx, n, true, h);
}

/* Whether device dev can reach peer's memory: any two devices, unless
 * CUEMU_PEER=0; never a device itself. */
CUEMU_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	struct device *d;
	CUresult rc = enter_device(dev, &d);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (peer < 0 || peer >= g.ndev)
		return leave(CUDA_ERROR_INVALID_DEVICE);
	if (!can)
		return leave(CUDA_ERROR_INVALID_VALUE);
	*can = g.peer && dev != peer;
	return leave(CUDA_SUCCESS);
}

/* The current context reaches peer's device memory from now on. */
CUEMU_API CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	struct cuemu_ctx *ctx, *p;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	p = ctx_check(peer);
	if (!p || !p->refs)
		return leave(CUDA_ERROR_INVALID_CONTEXT);
	if (flags)
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (p->ordinal == ctx->ordinal)
		return leave(CUDA_ERROR_INVALID_DEVICE);
	if (!g.peer)
		return leave(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
	if (ctx->peers & (1u << p->ordinal))
		return leave(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	ctx->peers |= 1u << p->ordinal;
	g.stats.peer_enables++;
	return leave(CUDA_SUCCESS);
}

/* CUmemcpyAttributes (CUDA 12.8): the order the source may be read in, and
 * location hints. */
typedef struct {
	int type, id;
} CUmemLocation;

typedef struct {
	int srcAccessOrder; /* 1 STREAM, 2 DURING_API_CALL, 3 ANY; 0 is invalid */
	CUmemLocation srcLocHint, dstLocHint;
	unsigned int flags; /* CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE */
} CUmemcpyAttributes;

_Static_assert(sizeof(CUmemcpyAttributes) == 24, "CUmemcpyAttributes");

/*
 * count copies queued on h in order, each as cuMemcpyAsync would queue it
 * (the direction from the addresses). Every argument and every range is
 * checked before any copy is queued: on an error nothing is, and *fail_idx
 * is the copy at fault, or SIZE_MAX for an error of the call as a whole.
 * The attributes apply from attrs_idxs[i] to the next one; the first must
 * start at copy 0, as documented. The legacy NULL stream is refused.
 */
static CUresult copy_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
			   CUmemcpyAttributes *attrs, size_t *attrs_idxs, size_t num_attrs,
			   size_t *fail_idx, CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	struct copy *c;
	CUresult rc;

	if (fail_idx)
		*fail_idx = SIZE_MAX;
	rc = enter(NEED_CTX, &ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (!dsts || !srcs || !sizes || !count || !attrs || !attrs_idxs || !num_attrs ||
	    num_attrs > count || attrs_idxs[0] != 0 || !h || h == CU_STREAM_LEGACY)
		return leave(CUDA_ERROR_INVALID_VALUE);
	for (size_t i = 0; i < num_attrs; i++) {
		if ((i && attrs_idxs[i] <= attrs_idxs[i - 1]) || attrs_idxs[i] >= count ||
		    attrs[i].srcAccessOrder < 1 || attrs[i].srcAccessOrder > 3 || attrs[i].flags > 1)
			return leave(CUDA_ERROR_INVALID_VALUE);
	}
	rc = stream_for_work(ctx, h, &s);
	if (rc != CUDA_SUCCESS)
		return leave(rc);
	c = calloc(count, sizeof(*c));
	if (!c)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	for (size_t i = 0; i < count; i++) {
		c[i].n = sizes[i];
		if (!sizes[i])
			continue;
		c[i].dir = classify(dsts[i], srcs[i]);
		rc = copy_resolve(&c[i], dsts[i], srcs[i]);
		if (rc != CUDA_SUCCESS) {
			if (fail_idx)
				*fail_idx = i;
			free(c);
			return leave(rc);
		}
	}
	for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++)
		if (c[i].n)
			rc = copy_queue(s, &c[i],
					c[i].pageable && c[i].dir != DTOD ? PAGEABLE : ASYNC);
	free(c);
	return leave(rc);
}

/* CUDA 12.8's signature, the one KvikIO's CUDA 12 build looks up. */
CUEMU_API CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
				      size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
				      size_t numAttrs, size_t *failIdx, CUstream hStream)
{
	return copy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, failIdx, hStream);
}

/* CUDA 13's, without the failing index. */
CUEMU_API CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
					 size_t count, CUmemcpyAttributes *attrs,
					 size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
	return copy_batch(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs, NULL, hStream);
}

#define UNIFIED (-1)

static CUdeviceptr host_ptr(const void *p)
{
	return (CUdeviceptr)(uintptr_t)p;
}

CUEMU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	return copy_sync(dst, host_ptr(src), n, HTOD);
}

CUEMU_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	return copy_sync(host_ptr(dst), src, n, DTOH);
}

CUEMU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_sync(dst, src, n, DTOD);
}

CUEMU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_sync(dst, src, n, UNIFIED);
}

CUEMU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream h)
{
	return copy_async(dst, host_ptr(src), n, HTOD, h);
}

CUEMU_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream h)
{
	return copy_async(host_ptr(dst), src, n, DTOH, h);
}

CUEMU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h)
{
	return copy_async(dst, src, n, DTOD, h);
}

CUEMU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h)
{
	return copy_async(dst, src, n, UNIFIED, h);
}

/* ------------------------------------------------------------------------ */
/* Stream and event calls                                                   */
/* ------------------------------------------------------------------------ */

CUEMU_API CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return leave(CUDA_ERROR_INVALID_VALUE);
	*ph = stream_new(ctx, flags, false);
	return leave(*ph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

/* Returns at once; the stream's queued work still runs, then it goes. */
CUEMU_API CUresult cuStreamDestroy_v2(CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	rc = stream_get(ctx, h, &s);
	if (rc == CUDA_SUCCESS && s->legacy)
		rc = CUDA_ERROR_INVALID_HANDLE;
	if (rc == CUDA_SUCCESS) {
		s->destroyed = true;
		pthread_cond_signal(&s->wake);
	}
	return leave(rc);
}

CUEMU_API CUresult cuStreamSynchronize(CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	rc = stream_get(ctx, h, &s);
	if (rc == CUDA_SUCCESS)
		wait_stream(s);
	return leave(rc);
}

CUEMU_API CUresult cuStreamQuery(CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	rc = stream_get(ctx, h, &s);
	if (rc == CUDA_SUCCESS && pending(s))
		rc = CUDA_ERROR_NOT_READY;
	return leave(rc);
}

CUEMU_API CUresult cuStreamGetFlags(CUstream h, unsigned int *flags)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!flags)
		return leave(CUDA_ERROR_INVALID_VALUE);
	rc = stream_get(ctx, h, &s);
	if (rc == CUDA_SUCCESS)
		*flags = s->flags;
	return leave(rc);
}

CUEMU_API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void *data)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	struct op *op;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!fn)
		return leave(CUDA_ERROR_INVALID_VALUE);
	rc = stream_for_work(ctx, h, &s);
	if (rc != CUDA_SUCCESS)
		return leave(rc);
	op = op_new(OP_HOSTFN);
	if (op) {
		op->fn = fn;
		op->data = data;
	}
	return leave(enqueue(s, op, NULL));
}

static struct cuemu_event *event_check(CUevent e)
{
	for (struct cuemu_event *v = g.events; v; v = v->next)
		if (v == e)
			return v;
	return NULL;
}

static bool event_done(const struct cuemu_event *e)
{
	return !e->recorded || deps_done(&e->at, 1);
}

CUEMU_API CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	struct cuemu_event *e;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!pe || (flags & ~(unsigned)CU_EVENT_FLAGS))
		return leave(CUDA_ERROR_INVALID_VALUE);
	e = calloc(1, sizeof(*e));
	if (!e)
		return leave(CUDA_ERROR_OUT_OF_MEMORY);
	e->flags = flags;
	e->next = g.events;
	g.events = e;
	*pe = e;
	return leave(CUDA_SUCCESS);
}

/* The event completes when the stream reaches a marker queued now. */
CUEMU_API CUresult cuEventRecord(CUevent ev, CUstream h)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	struct cuemu_event *e;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	e = event_check(ev);
	if (!e)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	rc = stream_for_work(ctx, h, &s);
	if (rc == CUDA_SUCCESS)
		rc = enqueue(s, op_new(OP_MARK), NULL);
	if (rc == CUDA_SUCCESS) {
		e->recorded = true;
		e->at = (struct dep){ s->id, s->enqueued };
	}
	return leave(rc);
}

CUEMU_API CUresult cuEventQuery(CUevent ev)
{
	struct cuemu_event *e;
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	e = event_check(ev);
	if (!e)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	return leave(event_done(e) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

CUEMU_API CUresult cuEventSynchronize(CUevent ev)
{
	struct cuemu_event *e;
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	e = event_check(ev);
	if (!e)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	if (e->recorded)
		wait_deps(&e->at, 1);
	return leave(CUDA_SUCCESS);
}

CUEMU_API CUresult cuEventDestroy_v2(CUevent ev)
{
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	for (struct cuemu_event **pp = &g.events; *pp; pp = &(*pp)->next) {
		if (*pp == ev) {
			*pp = ev->next;
			free(ev);
			return leave(CUDA_SUCCESS);
		}
	}
	return leave(CUDA_ERROR_INVALID_HANDLE);
}

/* Work queued on h after this waits for the event's work. */
CUEMU_API CUresult cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
	struct cuemu_ctx *ctx;
	struct cuemu_stream *s;
	struct cuemu_event *e;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	e = event_check(ev);
	if (!e)
		return leave(CUDA_ERROR_INVALID_HANDLE);
	if (flags != 0)
		return leave(CUDA_ERROR_INVALID_VALUE);
	rc = stream_for_work(ctx, h, &s);
	if (rc == CUDA_SUCCESS && e->recorded)
		rc = enqueue(s, op_new(OP_MARK), &e->at);
	return leave(rc);
}

/* ------------------------------------------------------------------------ */
/* Pointer attributes                                                       */
/* ------------------------------------------------------------------------ */

/* What the emulator knows of an address; the defaults for an unknown one. */
struct ptr_info {
	unsigned type;
	struct cuemu_ctx *ctx;
	int ordinal;
	CUdeviceptr dev_ptr, start;
	void *host_ptr;
	size_t size;
	uint64_t id;
	unsigned sync_memops;
	struct dalloc *alloc;
};

static bool ptr_lookup(CUdeviceptr p, struct ptr_info *pi)
{
	uintptr_t a = (uintptr_t)p;
	struct device *d = device_at(a);
	struct hrange *h;

	*pi = (struct ptr_info){ .ordinal = -2 };
	if (d) {
		struct dalloc *al = alloc_at(d, a - d->base);
		if (!al)
			return false;
		*pi = (struct ptr_info){ CU_MEMORYTYPE_DEVICE, al->ctx, d->ctx.ordinal, p,
					 d->base + al->off, NULL, al->size, al->id, al->sync_memops, al };
		return true;
	}
	h = host_find(a, 1);
	if (!h)
		return false;
	*pi = (struct ptr_info){ CU_MEMORYTYPE_HOST, h->ctx, h->ctx->ordinal, p, h->start,
				 (void *)a, h->size, h->id, 0, NULL };
	return true;
}

/* Writes one attribute; the sizes are those cuda.h documents. */
static CUresult ptr_attr(const struct ptr_info *pi, int attr, void *data)
{
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = pi->ctx; break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = pi->type; break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = pi->dev_ptr; break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER: *(void **)data = pi->host_ptr; break;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *(unsigned *)data = pi->sync_memops; break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = pi->id; break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data = 0; break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = pi->ordinal; break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = pi->start; break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = pi->size; break;
	case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned *)data = pi->type != 0; break;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		*(unsigned *)data = pi->type == CU_MEMORYTYPE_DEVICE;
		break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

/* No context needed: with unified addressing the pointer says which. */
CUEMU_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
	struct ptr_info pi;
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!data || !ptr_lookup(p, &pi))
		return leave(CUDA_ERROR_INVALID_VALUE);
	if (attr == CU_POINTER_ATTRIBUTE_HOST_POINTER && !pi.host_ptr)
		return leave(CUDA_ERROR_INVALID_VALUE);
	return leave(ptr_attr(&pi, attr, data));
}

/*
 * As documented, an address the driver does not know is no error here: the
 * attributes get their defaults (NULL, 0, ordinal -2).
 */
CUEMU_API CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr p)
{
	struct ptr_info pi;
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!n || !attrs || !data)
		return leave(CUDA_ERROR_INVALID_VALUE);
	ptr_lookup(p, &pi);
	for (unsigned i = 0; i < n && rc == CUDA_SUCCESS; i++)
		if (data[i])
			rc = ptr_attr(&pi, attrs[i], data[i]);
	return leave(rc);
}

CUEMU_API CUresult cuPointerSetAttribute(const void *value, int attr, CUdeviceptr p)
{
	struct ptr_info pi;
	CUresult rc = enter(NEED_INIT, NULL);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!value || attr != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS || !ptr_lookup(p, &pi) || !pi.alloc)
		return leave(CUDA_ERROR_INVALID_VALUE);
	pi.alloc->sync_memops = *(const unsigned *)value != 0;
	return leave(CUDA_SUCCESS);
}

/* ------------------------------------------------------------------------ */
/* dma-buf export through /dev/udmabuf                                      */
/* ------------------------------------------------------------------------ */

/*
 * [dptr, dptr + size) must be page aligned and inside one live allocation
 * (its reserved, page-rounded extent: the pages are the allocation's alone).
 */
static CUresult dmabuf_range(CUdeviceptr dptr, size_t size, struct device **dev, uint64_t *off)
{
	size_t page = page_size();
	struct device *d = device_at((uintptr_t)dptr);
	struct dalloc *a;

	if (!d || !size || dptr % page || size % page)
		return CUDA_ERROR_INVALID_VALUE;
	*off = dptr - d->base;
	a = alloc_at(d, *off);
	if (!a || size > a->len || *off + size > a->off + a->len)
		return CUDA_ERROR_INVALID_VALUE;
	*dev = d;
	return CUDA_SUCCESS;
}

/*
 * The dma-buf is over the device's memfd pages themselves, so what a DMA
 * writes through it the copies read, and the other way round. udmabuf's
 * size_limit_mb (64 MiB by default) bounds one export.
 */
static CUresult dmabuf_create(const struct device *d, uint64_t off, size_t size, int *fd)
{
	struct udmabuf_create req = {
		.memfd = (uint32_t)d->memfd,
		.flags = UDMABUF_FLAGS_CLOEXEC,
		.offset = off,
		.size = size,
	};
	int dev = open(g.udmabuf_path, O_RDWR | O_CLOEXEC);
	int ret;

	if (dev < 0)
		return CUDA_ERROR_NOT_SUPPORTED;
	ret = ioctl(dev, UDMABUF_CREATE, &req);
	if (ret < 0)
		os_error("UDMABUF_CREATE");
	close(dev);
	if (ret < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	*fd = ret;
	return CUDA_SUCCESS;
}

CUEMU_API CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
						  int type, unsigned long long flags)
{
	struct cuemu_ctx *ctx;
	struct device *d;
	uint64_t off;
	CUresult rc = enter(NEED_CTX, &ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD ||
	    (flags & ~(unsigned long long)CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE))
		return leave(CUDA_ERROR_INVALID_VALUE);
	rc = dmabuf_range(dptr, size, &d, &off);
	if (rc == CUDA_SUCCESS && !g.udmabuf)
		rc = CUDA_ERROR_NOT_SUPPORTED;
	if (rc == CUDA_SUCCESS)
		rc = dmabuf_create(d, off, size, handle);
	if (rc == CUDA_SUCCESS)
		g.stats.dmabuf_exports++;
	return leave(rc);
}

/* ------------------------------------------------------------------------ */
/* Statistics                                                               */
/* ------------------------------------------------------------------------ */

/*
 * The caller sets out->size to the size of its struct: when that is not
 * this library's, only out->size is written (with this library's size) and
 * the call fails, so that a caller built against another layout learns it
 * without the counters running past the end of its buffer.
 */
CUEMU_API int cuemuGetStats(struct cuemu_stats *out)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (out->size != sizeof(*out)) {
		out->size = sizeof(*out);
		return CUDA_ERROR_INVALID_VALUE;
	}
	lock();
	*out = g.stats;
	unlock();
	out->size = sizeof(*out);
	return CUDA_SUCCESS;
}

CUEMU_API void cuemuResetStats(void)
{
	lock();
	g.stats = (struct cuemu_stats){
		.live_device_allocs = g.stats.live_device_allocs,
		.live_registered = g.stats.live_registered,
	};
	unlock();
}

/* ------------------------------------------------------------------------ */
/* Older names with the same signatures                                     */
/* ------------------------------------------------------------------------ */

/*
 * Only where the unsuffixed function has the _v2 signature: cuMemAlloc,
 * cuMemcpyHtoD and the like take 32-bit sizes or pointers in their first
 * version, and cuda.h maps every caller to the _v2 names anyway.
 */
#define ALIAS(name, target, ...) \
	CUEMU_API CUresult name(__VA_ARGS__) __attribute__((alias(#target)))

ALIAS(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, CUdevice);
ALIAS(cuCtxPushCurrent, cuCtxPushCurrent_v2, CUcontext);
ALIAS(cuCtxPopCurrent, cuCtxPopCurrent_v2, CUcontext *);
ALIAS(cuStreamDestroy, cuStreamDestroy_v2, CUstream);
ALIAS(cuEventDestroy, cuEventDestroy_v2, CUevent);
ALIAS(cuDeviceGetUuid, cuDeviceGetUuid_v2, CUuuid *, CUdevice);
