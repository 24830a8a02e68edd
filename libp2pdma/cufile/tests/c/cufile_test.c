/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * cufile_test: libp2pdma's libcufile.so.0 from C, loaded the way KvikIO
 * loads cuFile: dlopen("libcufile.so.0", RTLD_LAZY | RTLD_LOCAL) and one
 * dlsym per function, cuFileDriverClose by the header's macro name (which
 * is cuFileDriverClose_v2). Written against include/cufile.h only.
 *
 *   cufile_test DIR [--cuda LIBCUDA]
 *
 * DIR is a scratch directory on a filesystem with O_DIRECT. The program
 * writes a file there from its own reference generator, then reads and
 * writes it through cuFile in every way the API has (synchronous, batches,
 * streams; registered and unregistered buffers, aligned and not, across
 * the end of the file), checks every byte against the reference, and every
 * error case it knows. With --cuda, it also dlopens that CUDA driver (the
 * same library libcufile uses, named by P2PDMA_CUDA_DRIVER), allocates
 * device memory with cuMemAlloc and moves data into and out of it through
 * cuFile, checking the bytes with cuMemcpyDtoH.
 *
 * One "ok"/"FAIL" line per check, then "cufile: N passed, M failed"; the
 * exit status is 1 when any check failed, 2 when the test cannot run.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cufile.h"

/* ------------------------------------------------------------------ checks */

static int passed, failed;

static void check(int ok, int line, const char *fmt, ...)
{
	va_list ap;

	printf(ok ? "ok   " : "FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	if (!ok)
		printf(" (line %d)", line);
	printf("\n");
	fflush(stdout);
	if (ok)
		passed++;
	else
		failed++;
}

#define CHECK(cond, ...) check(!!(cond), __LINE__, __VA_ARGS__)

/* A cuFile call that returns CUfileError_t, with the error it must give. */
#define CHECK_ERR(call, want, what)                                                        \
	do {                                                                               \
		CUfileError_t e_ = (call);                                                 \
		CHECK(e_.err == (want), "%s: %d (%s), want %d", what, (int)e_.err,         \
		      cufileop_status_error(e_.err), (int)(want));                         \
	} while (0)

#define CHECK_OK(call, what) CHECK_ERR(call, CU_FILE_SUCCESS, what)

static void die(const char *what)
{
	fprintf(stderr, "cufile_test: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* --------------------------------------------------------------- reference */

/* Byte `off` of stream `seed`: every 8-byte word is a hash of its index, so
 * a shifted, dropped or repeated block shows. */
static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static unsigned char ref(uint64_t seed, uint64_t off)
{
	return (unsigned char)(mix(seed * 0x100000001b3ull + off / 8) >> (off % 8 * 8));
}

static void fill(unsigned char *p, uint64_t seed, uint64_t off, size_t len)
{
	for (size_t i = 0; i < len; i++)
		p[i] = ref(seed, off + i);
}

/* Index of the first byte of `p` that differs from stream `seed` at `off`,
 * or -1. */
static long differs(const unsigned char *p, uint64_t seed, uint64_t off, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != ref(seed, off + i))
			return (long)i;
	return -1;
}

/* The file everything reads: FSIZE bytes of stream DATA_SEED. */
#define DATA_SEED 1
#define FSIZE ((4u << 20) + 12345u)
#define MIB (1u << 20)

/* The file writes go to, and what it must hold: `shadow`. */
#define RW_SEED 2
#define RW_MAX (FSIZE + MIB)
static unsigned char *shadow;
static size_t shadow_len;

static void shadow_write(const unsigned char *src, uint64_t off, size_t len)
{
	memcpy(shadow + off, src, len);
	if (off + len > shadow_len)
		shadow_len = off + len;
}

/* Whether the file at `path` holds exactly `shadow`. */
static int file_matches_shadow(const char *path)
{
	struct stat st;
	unsigned char *buf;
	int fd = open(path, O_RDONLY);
	int same;

	if (fd < 0 || fstat(fd, &st) != 0)
		die("open the written file");
	if ((size_t)st.st_size != shadow_len) {
		printf("     %s holds %lld bytes, %zu expected\n", path, (long long)st.st_size,
		       shadow_len);
		close(fd);
		return 0;
	}
	buf = malloc(shadow_len);
	if (!buf || pread(fd, buf, shadow_len, 0) != (ssize_t)shadow_len)
		die("read the written file");
	same = memcmp(buf, shadow, shadow_len) == 0;
	for (size_t i = 0; !same && i < shadow_len; i++)
		if (buf[i] != shadow[i]) {
			printf("     first difference at byte %zu\n", i);
			break;
		}
	free(buf);
	close(fd);
	return same;
}

/* ------------------------------------------------------------- the library */

#define STR2(x) #x
#define STR(x) STR2(x)

/* One pointer per function, typed by the header's prototype. */
#define FN(name) static __typeof__(&name) p_##name
FN(cuFileDriverOpen);
FN(cuFileDriverClose); /* cuFileDriverClose_v2, by the header's macro */
FN(cuFileUseCount);
FN(cuFileDriverGetProperties);
FN(cuFileDriverSetPollMode);
FN(cuFileDriverSetMaxDirectIOSize);
FN(cuFileDriverSetMaxCacheSize);
FN(cuFileDriverSetMaxPinnedMemSize);
FN(cuFileGetVersion);
FN(cuFileHandleRegister);
FN(cuFileHandleDeregister);
FN(cuFileBufRegister);
FN(cuFileBufDeregister);
FN(cuFileRead);
FN(cuFileWrite);
FN(cuFileBatchIOSetUp);
FN(cuFileBatchIOSubmit);
FN(cuFileBatchIOGetStatus);
FN(cuFileBatchIOCancel);
FN(cuFileBatchIODestroy);
FN(cuFileReadAsync);
FN(cuFileWriteAsync);
FN(cuFileStreamRegister);
FN(cuFileStreamDeregister);
/* cuFile 1.14 to 1.20. */
FN(cuFileGetParameterSizeT);
FN(cuFileGetParameterBool);
FN(cuFileGetParameterString);
FN(cuFileGetParameterMinMaxValue);
FN(cuFileSetParameterSizeT);
FN(cuFileSetParameterBool);
FN(cuFileSetParameterString);
FN(cuFileSetParameterPosixPoolSlabArray);
FN(cuFileGetParameterPosixPoolSlabArray);
FN(cuFileSetParameterGpuBounceBufferSlabArray);
FN(cuFileGetParameterGpuBounceBufferSlabArray);
FN(cuFileSetStatsLevel);
FN(cuFileGetStatsLevel);
FN(cuFileStatsStart);
FN(cuFileStatsStop);
FN(cuFileStatsReset);
FN(cuFileGetStatsL1);
FN(cuFileGetStatsL2);
FN(cuFileGetStatsL3);
FN(cuFileDriverGetP2PFlags);
FN(cuFileDriverSetP2PFlags);
FN(cuFileGetBARSizeInKB);
FN(cuFileExportPCIeTopology);
FN(cuFileReadv);
FN(cuFileWritev);
/* The legacy symbol, as ctypes and cudarc look it up. */
static CUfileError_t (*p_legacy_close)(void);

static void *lib;

static void *symbol(void *handle, const char *name)
{
	void *s;

	dlerror();
	s = dlsym(handle, name);
	CHECK(s != NULL, "dlsym %s", name);
	return s;
}

/* Looks `name` up after macro expansion, as KvikIO's stringify does. */
#define LOAD(name)                                                                         \
	do {                                                                               \
		void *s_ = symbol(lib, STR(name));                                         \
		memcpy(&p_##name, &s_, sizeof(s_));                                        \
	} while (0)

static void load(void)
{
	void *s;

	lib = dlopen("libcufile.so.0", RTLD_LAZY | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "cufile_test: dlopen libcufile.so.0: %s\n", dlerror());
		exit(2);
	}
	LOAD(cuFileDriverOpen);
	LOAD(cuFileDriverClose);
	LOAD(cuFileUseCount);
	LOAD(cuFileDriverGetProperties);
	LOAD(cuFileDriverSetPollMode);
	LOAD(cuFileDriverSetMaxDirectIOSize);
	LOAD(cuFileDriverSetMaxCacheSize);
	LOAD(cuFileDriverSetMaxPinnedMemSize);
	LOAD(cuFileGetVersion);
	LOAD(cuFileHandleRegister);
	LOAD(cuFileHandleDeregister);
	LOAD(cuFileBufRegister);
	LOAD(cuFileBufDeregister);
	LOAD(cuFileRead);
	LOAD(cuFileWrite);
	LOAD(cuFileBatchIOSetUp);
	LOAD(cuFileBatchIOSubmit);
	LOAD(cuFileBatchIOGetStatus);
	LOAD(cuFileBatchIOCancel);
	LOAD(cuFileBatchIODestroy);
	LOAD(cuFileReadAsync);
	LOAD(cuFileWriteAsync);
	LOAD(cuFileStreamRegister);
	LOAD(cuFileStreamDeregister);
	LOAD(cuFileGetParameterSizeT);
	LOAD(cuFileGetParameterBool);
	LOAD(cuFileGetParameterString);
	LOAD(cuFileGetParameterMinMaxValue);
	LOAD(cuFileSetParameterSizeT);
	LOAD(cuFileSetParameterBool);
	LOAD(cuFileSetParameterString);
	LOAD(cuFileSetParameterPosixPoolSlabArray);
	LOAD(cuFileGetParameterPosixPoolSlabArray);
	LOAD(cuFileSetParameterGpuBounceBufferSlabArray);
	LOAD(cuFileGetParameterGpuBounceBufferSlabArray);
	LOAD(cuFileSetStatsLevel);
	LOAD(cuFileGetStatsLevel);
	LOAD(cuFileStatsStart);
	LOAD(cuFileStatsStop);
	LOAD(cuFileStatsReset);
	LOAD(cuFileGetStatsL1);
	LOAD(cuFileGetStatsL2);
	LOAD(cuFileGetStatsL3);
	LOAD(cuFileDriverGetP2PFlags);
	LOAD(cuFileDriverSetP2PFlags);
	LOAD(cuFileGetBARSizeInKB);
	LOAD(cuFileExportPCIeTopology);
	LOAD(cuFileReadv);
	LOAD(cuFileWritev);
	CHECK(strcmp(STR(cuFileDriverClose), "cuFileDriverClose_v2") == 0,
	      "the header maps cuFileDriverClose to cuFileDriverClose_v2");
	s = symbol(lib, "cuFileDriverClose");
	memcpy(&p_legacy_close, &s, sizeof(s));
	if (failed) {
		fprintf(stderr, "cufile_test: symbols are missing\n");
		exit(1);
	}
}

/* --------------------------------------------------------- layouts, errors */

_Static_assert(sizeof(CUfileError_t) == 8, "CUfileError_t");
_Static_assert(sizeof(CUfileDescr_t) == 24, "CUfileDescr_t");
_Static_assert(offsetof(CUfileDescr_t, fs_ops) == 16, "CUfileDescr_t.fs_ops");
_Static_assert(sizeof(CUfileDrvProps_t) == 56, "CUfileDrvProps_t");
_Static_assert(offsetof(CUfileDrvProps_t, fflags) == 32, "CUfileDrvProps_t.fflags");
_Static_assert(offsetof(CUfileDrvProps_t, max_batch_io_size) == 48, "max_batch_io_size");
_Static_assert(sizeof(CUfileIOParams_t) == 64, "CUfileIOParams_t");
_Static_assert(offsetof(CUfileIOParams_t, u.batch.size) == 32, "CUfileIOParams_t.size");
_Static_assert(offsetof(CUfileIOParams_t, fh) == 40, "CUfileIOParams_t.fh");
_Static_assert(offsetof(CUfileIOParams_t, opcode) == 48, "CUfileIOParams_t.opcode");
_Static_assert(offsetof(CUfileIOParams_t, cookie) == 56, "CUfileIOParams_t.cookie");
_Static_assert(sizeof(CUfileIOEvents_t) == 24, "CUfileIOEvents_t");
_Static_assert(offsetof(CUfileIOEvents_t, ret) == 16, "CUfileIOEvents_t.ret");
_Static_assert(sizeof(CUfileIOVec_t) == 16 && offsetof(CUfileIOVec_t, len) == 8, "CUfileIOVec_t");
_Static_assert(sizeof(CUfileStatsLevel1_t) == 512, "CUfileStatsLevel1_t");
_Static_assert(offsetof(CUfileStatsLevel1_t, read_bytes) == 96, "read_bytes");
_Static_assert(offsetof(CUfileStatsLevel1_t, batch_submit_ops) == 176, "batch_submit_ops");
_Static_assert(offsetof(CUfileStatsLevel1_t, last_batch_write_bytes) == 504, "last_batch_write");
_Static_assert(sizeof(CUfileStatsLevel2_t) == 1024, "CUfileStatsLevel2_t");
_Static_assert(offsetof(CUfileStatsLevel2_t, write_size_kb_hist) == 768, "write hist");
_Static_assert(sizeof(CUfilePerGpuStats_t) == 248, "CUfilePerGpuStats_t");
_Static_assert(offsetof(CUfilePerGpuStats_t, reg_bytes) == 240, "reg_bytes");
_Static_assert(sizeof(CUfileStatsLevel3_t) == 5000, "CUfileStatsLevel3_t");
_Static_assert(offsetof(CUfileStatsLevel3_t, per_gpu_stats) == 1032, "per_gpu_stats");
_Static_assert(CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS == 11 &&
		       CUFILE_PARAM_STREAM_MEMOPS_BYPASS == 11 && CUFILE_PARAM_LOG_DIR == 2 &&
		       CUFILE_PARAM_GPU_BOUNCE_BUFFER_SLAB_COUNT == 3 &&
		       CU_FILE_MAX_TARGET_TYPES == 14 && CU_FILE_P2P_FLAG_C2C == 8,
	       "cuFile 1.20 enumerations");
_Static_assert(CU_FILE_INVALID_VALUE == 5022 && CU_FILE_HANDLE_NOT_REGISTERED == 5027 &&
		       CU_FILE_ASYNC_NOT_SUPPORTED == 5038 && CU_FILE_BATCH_FULL == 5037,
	       "CUfileOpError values");

static void test_header(void)
{
	CHECK(IS_CUFILE_ERR(-CU_FILE_HANDLE_NOT_REGISTERED) && !IS_CUFILE_ERR(-1) &&
		      !IS_CUFILE_ERR(4096),
	      "IS_CUFILE_ERR tells cuFile errors from -1 and byte counts");
	CHECK(strcmp(CUFILE_ERRSTR(-CU_FILE_INVALID_VALUE), "invalid argument") == 0,
	      "CUFILE_ERRSTR(-CU_FILE_INVALID_VALUE) is \"%s\"",
	      CUFILE_ERRSTR(-CU_FILE_INVALID_VALUE));
	CHECK(strcmp(cufileop_status_error((CUfileOpError)4242), "unknown cuFile error") == 0,
	      "an unknown error has a message too");
}

/* ------------------------------------------------------------------ driver */

static void test_driver(void)
{
	CUfileDrvProps_t props;
	int version = 0;

	CHECK(p_cuFileUseCount() == 0, "the driver starts closed (use count %ld)",
	      p_cuFileUseCount());
	CHECK_OK(p_cuFileDriverOpen(), "cuFileDriverOpen");
	CHECK_OK(p_cuFileDriverOpen(), "cuFileDriverOpen again");
	CHECK(p_cuFileUseCount() == 2, "two opens count 2 (%ld)", p_cuFileUseCount());
	CHECK_OK(p_cuFileDriverClose(), "cuFileDriverClose_v2");
	CHECK(p_cuFileUseCount() == 1, "one close leaves 1 (%ld)", p_cuFileUseCount());
	CHECK_OK(p_cuFileDriverClose(), "cuFileDriverClose_v2 again");
	CHECK(p_cuFileUseCount() == 0, "closed (%ld)", p_cuFileUseCount());
	CHECK_ERR(p_cuFileDriverClose(), CU_FILE_DRIVER_NOT_INITIALIZED, "close when closed");
	CHECK_OK(p_cuFileDriverOpen(), "open");
	CHECK_OK(p_cuFileDriverOpen(), "open");
	CHECK_OK(p_legacy_close(), "the legacy cuFileDriverClose");
	CHECK(p_cuFileUseCount() == 0, "the legacy close ends every open (%ld)",
	      p_cuFileUseCount());
	CHECK_ERR(p_legacy_close(), CU_FILE_DRIVER_NOT_INITIALIZED, "legacy close when closed");

	CHECK_OK(p_cuFileGetVersion(&version), "cuFileGetVersion");
	CHECK(version == 1200, "version %d: cuFile 1.20's API", version);
	CHECK_ERR(p_cuFileGetVersion(NULL), CU_FILE_INVALID_VALUE, "cuFileGetVersion(NULL)");

	/* Everything below runs with the driver closed: it starts on first
	 * use, as KvikIO expects. */
	memset(&props, 0, sizeof(props));
	CHECK_OK(p_cuFileDriverGetProperties(&props), "cuFileDriverGetProperties");
	CHECK(props.nvfs.major_version || props.nvfs.minor_version, "nvfs version %u.%u",
	      props.nvfs.major_version, props.nvfs.minor_version);
	CHECK(props.fflags & (1u << CU_FILE_BATCH_IO_SUPPORTED), "batch I/O supported");
	CHECK(props.fflags & (1u << CU_FILE_STREAMS_SUPPORTED), "streams supported");
	CHECK(props.max_batch_io_size >= 16, "max_batch_io_size %u", props.max_batch_io_size);
	CHECK(props.nvfs.max_direct_io_size > 0 && props.per_buffer_cache_size > 0 &&
		      props.max_device_cache_size > 0 && props.max_device_pinned_mem_size > 0,
	      "sizes in KB: direct I/O %zu, cache %u, per buffer %u, pinned %u",
	      props.nvfs.max_direct_io_size, props.max_device_cache_size,
	      props.per_buffer_cache_size, props.max_device_pinned_mem_size);
	CHECK_ERR(p_cuFileDriverGetProperties(NULL), CU_FILE_INVALID_VALUE,
		  "cuFileDriverGetProperties(NULL)");

	CHECK_OK(p_cuFileDriverSetPollMode(true, 64), "cuFileDriverSetPollMode(true, 64)");
	CHECK_OK(p_cuFileDriverSetMaxDirectIOSize(8192), "cuFileDriverSetMaxDirectIOSize(8192)");
	CHECK_OK(p_cuFileDriverSetMaxCacheSize(65536), "cuFileDriverSetMaxCacheSize(65536)");
	CHECK_OK(p_cuFileDriverSetMaxPinnedMemSize(1 << 20), "cuFileDriverSetMaxPinnedMemSize");
	CHECK_OK(p_cuFileDriverGetProperties(&props), "properties again");
	CHECK(props.nvfs.dcontrolflags & (1u << CU_FILE_USE_POLL_MODE) &&
		      props.nvfs.poll_thresh_size == 64,
	      "poll mode reads back (flags %#x, threshold %zu)", props.nvfs.dcontrolflags,
	      props.nvfs.poll_thresh_size);
	CHECK(props.nvfs.max_direct_io_size == 8192 && props.max_device_cache_size == 65536 &&
		      props.max_device_pinned_mem_size == 1u << 20,
	      "sizes read back");
	CHECK_OK(p_cuFileDriverSetPollMode(false, 4), "poll mode off");
	CHECK_ERR(p_cuFileDriverSetMaxDirectIOSize(0), CU_FILE_DRIVER_UNSUPPORTED_LIMIT,
		  "a direct I/O size of 0");
	CHECK_ERR(p_cuFileDriverSetMaxCacheSize(3), CU_FILE_DRIVER_UNSUPPORTED_LIMIT,
		  "a cache size of 3 KB");
	CHECK_ERR(p_cuFileDriverSetMaxPinnedMemSize((size_t)1 << 40),
		  CU_FILE_DRIVER_UNSUPPORTED_LIMIT, "a pinned size past 32 bits of KB");
	CHECK(p_cuFileUseCount() == 0, "first use did not count as an open");
}


/* -------------------------------------------------------------- parameters */

static size_t get_size(CUFileSizeTConfigParameter_t p)
{
	size_t v = (size_t)-1;
	CHECK_OK(p_cuFileGetParameterSizeT(p, &v), "cuFileGetParameterSizeT");
	return v;
}

static bool get_bool(CUFileBoolConfigParameter_t p)
{
	bool v = false;
	CHECK_OK(p_cuFileGetParameterBool(p, &v), "cuFileGetParameterBool");
	return v;
}

/* Before anything opens the driver: defaults, ranges, staging, refusals. */
static void test_params_staged(const char *dir)
{
	size_t lo, hi, sz[4], ct[4];
	char str[64], log_path[4200];
	bool b;
	int level = -1;

	CHECK(get_size(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB) == 16384 &&
		      get_size(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE) == 128 &&
		      get_size(CUFILE_PARAM_PROFILE_STATS) == 0 &&
		      get_size(CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB) == 4,
	      "size parameters start at cuFile's defaults");
	CHECK(get_bool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE) &&
		      !get_bool(CUFILE_PARAM_FORCE_COMPAT_MODE) &&
		      !get_bool(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE) &&
		      get_bool(CUFILE_PARAM_USE_PCIP2PDMA),
	      "bool parameters start at the defaults");
	CHECK_OK(p_cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, str, sizeof(str)),
		 "get the logging level");
	CHECK(strcmp(str, "ERROR") == 0, "the logging level starts at ERROR (%s)", str);
	for (int p = CUFILE_PARAM_PROFILE_STATS; p <= CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS;
	     p++) {
		size_t v = get_size((CUFileSizeTConfigParameter_t)p);
		CHECK_OK(p_cuFileGetParameterMinMaxValue((CUFileSizeTConfigParameter_t)p, &lo, &hi),
			 "cuFileGetParameterMinMaxValue");
		CHECK(lo <= v && v <= hi, "parameter %d: %zu in [%zu, %zu]", p, v, lo, hi);
	}

	/* Bad arguments: documented errors, no crash. */
	CHECK_ERR(p_cuFileGetParameterSizeT((CUFileSizeTConfigParameter_t)12, &lo),
		  CU_FILE_INVALID_VALUE, "an unknown size parameter");
	CHECK_ERR(p_cuFileGetParameterSizeT((CUFileSizeTConfigParameter_t)-1, &lo),
		  CU_FILE_INVALID_VALUE, "a negative size parameter");
	CHECK_ERR(p_cuFileGetParameterSizeT(CUFILE_PARAM_PROFILE_STATS, NULL),
		  CU_FILE_INVALID_VALUE, "cuFileGetParameterSizeT(NULL)");
	CHECK_ERR(p_cuFileGetParameterBool((CUFileBoolConfigParameter_t)12, &b),
		  CU_FILE_INVALID_VALUE, "an unknown bool parameter");
	CHECK_ERR(p_cuFileGetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, NULL),
		  CU_FILE_INVALID_VALUE, "cuFileGetParameterBool(NULL)");
	CHECK_ERR(p_cuFileGetParameterString((CUFileStringConfigParameter_t)3, str, sizeof(str)),
		  CU_FILE_INVALID_VALUE, "an unknown string parameter");
	CHECK_ERR(p_cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, str, 5),
		  CU_FILE_INVALID_VALUE, "a buffer without room for the NUL");
	CHECK_ERR(p_cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, NULL, 10),
		  CU_FILE_INVALID_VALUE, "cuFileGetParameterString(NULL)");
	CHECK_ERR(p_cuFileGetParameterMinMaxValue(CUFILE_PARAM_PROFILE_STATS, NULL, &hi),
		  CU_FILE_INVALID_VALUE, "cuFileGetParameterMinMaxValue(NULL)");
	CHECK_ERR(p_cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB, 6),
		  CU_FILE_INVALID_VALUE, "a direct I/O size that is not a multiple of 4 KB");
	CHECK_ERR(p_cuFileSetParameterSizeT(CUFILE_PARAM_PROFILE_STATS, 4), CU_FILE_INVALID_VALUE,
		  "a statistics level past 3");
	CHECK_ERR(p_cuFileSetParameterSizeT((CUFileSizeTConfigParameter_t)99, 1),
		  CU_FILE_INVALID_VALUE, "setting an unknown parameter");
	CHECK_ERR(p_cuFileSetParameterString(CUFILE_PARAM_LOGGING_LEVEL, "LOUD"),
		  CU_FILE_INVALID_VALUE, "an unknown logging level");
	CHECK_ERR(p_cuFileSetParameterString(CUFILE_PARAM_LOG_DIR, NULL), CU_FILE_INVALID_VALUE,
		  "cuFileSetParameterString(NULL)");
	CHECK(get_size(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB) == 16384,
	      "a refused value leaves the parameter as it was");

	/* Staged: the engine starts with these (checked in its log below). */
	CHECK_OK(p_cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB, 256),
		 "stage a 256 KB direct I/O size (the engine's chunk)");
	CHECK_OK(p_cuFileSetParameterSizeT(CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH, 3),
		 "stage a queue depth of 3");
	CHECK_OK(p_cuFileSetParameterSizeT(CUFILE_PARAM_EXECUTION_MAX_IO_THREADS, 2),
		 "stage 2 I/O threads");
	CHECK_OK(p_cuFileSetParameterSizeT(CUFILE_PARAM_PROFILE_STATS, 2), "stage stats level 2");
	CHECK_OK(p_cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE, true),
		 "stage poll mode");
	CHECK_OK(p_cuFileSetParameterString(CUFILE_PARAM_LOGGING_LEVEL, "info"),
		 "stage logging level info");
	snprintf(log_path, sizeof(log_path), "%s/cufile.log", dir);
	CHECK_OK(p_cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH, log_path),
		 "stage the log file");
	CHECK(get_size(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB) == 256 &&
		      get_size(CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH) == 3 &&
		      get_size(CUFILE_PARAM_EXECUTION_MAX_IO_THREADS) == 2 &&
		      get_bool(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE),
	      "staged values read back");
	CHECK_OK(p_cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, str, sizeof(str)),
		 "get the logging level");
	CHECK(strcmp(str, "INFO") == 0, "the level reads back as INFO (%s)", str);
	CHECK_OK(p_cuFileGetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH, log_path, sizeof(log_path)),
		 "get the log file");
	CHECK(strstr(log_path, "/cufile.log") != NULL, "it reads back (%s)", log_path);

	/* Slab arrays. */
	CHECK_OK(p_cuFileGetParameterPosixPoolSlabArray(sz, ct, 3), "the default POSIX slabs");
	CHECK(sz[0] == 4 && sz[1] == 1024 && sz[2] == 16384 && ct[0] == 128 && ct[1] == 64 &&
		      ct[2] == 64,
	      "cuFile's default POSIX pool: 4 KB x128, 1 MB x64, 16 MB x64");
	CHECK_ERR(p_cuFileGetParameterPosixPoolSlabArray(sz, ct, 2), CU_FILE_INVALID_VALUE,
		  "a length that is not the number of slabs");
	{
		size_t s2[2] = { 64, 2048 }, c2[2] = { 8, 4 }, bad[2] = { 2048, 64 };
		size_t odd[1] = { 6 }, zero[1] = { 0 };
		CHECK_OK(p_cuFileSetParameterPosixPoolSlabArray(s2, c2, 2), "stage 2 POSIX slabs");
		memset(sz, 0, sizeof(sz));
		CHECK_OK(p_cuFileGetParameterPosixPoolSlabArray(sz, ct, 2), "read them");
		CHECK(sz[0] == 64 && sz[1] == 2048 && ct[0] == 8 && ct[1] == 4,
		      "POSIX slabs read back");
		CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(bad, c2, 2), CU_FILE_INVALID_VALUE,
			  "slabs out of order");
		CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(odd, c2, 1), CU_FILE_INVALID_VALUE,
			  "a slab that is not a multiple of 4 KB");
		CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(s2, zero, 1), CU_FILE_INVALID_VALUE,
			  "a slab count of 0");
		CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(NULL, c2, 2), CU_FILE_INVALID_VALUE,
			  "NULL sizes");
		CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(s2, c2, 0), CU_FILE_INVALID_VALUE,
			  "no slabs");
		CHECK_ERR(p_cuFileSetParameterGpuBounceBufferSlabArray(s2, c2, -1),
			  CU_FILE_INVALID_VALUE, "a negative length");
		CHECK_OK(p_cuFileGetParameterGpuBounceBufferSlabArray(sz, ct, 1),
			 "the default GPU bounce slabs");
		CHECK(sz[0] == 1024 && ct[0] == 64, "1 MB x64 (%zu x%zu)", sz[0], ct[0]);
		CHECK_OK(p_cuFileSetParameterGpuBounceBufferSlabArray(s2, c2, 2),
			 "stage 2 GPU bounce slabs");
		CHECK_OK(p_cuFileGetParameterGpuBounceBufferSlabArray(sz, ct, 2), "read them");
		CHECK(sz[1] == 2048 && ct[1] == 4, "GPU bounce slabs read back");
		CHECK_ERR(p_cuFileGetParameterGpuBounceBufferSlabArray(NULL, ct, 2),
			  CU_FILE_INVALID_VALUE, "cuFileGetParameterGpuBounceBufferSlabArray(NULL)");
	}

	/* The statistics level's own calls. */
	CHECK_ERR(p_cuFileSetStatsLevel(4), CU_FILE_INVALID_VALUE, "cuFileSetStatsLevel(4)");
	CHECK_ERR(p_cuFileSetStatsLevel(-1), CU_FILE_INVALID_VALUE, "cuFileSetStatsLevel(-1)");
	CHECK_ERR(p_cuFileGetStatsLevel(NULL), CU_FILE_INVALID_VALUE, "cuFileGetStatsLevel(NULL)");
	CHECK_OK(p_cuFileGetStatsLevel(&level), "cuFileGetStatsLevel");
	CHECK(level == 0, "statistics start off (level %d)", level);
}

/* Whether the file at `path` holds `text`. */
static int file_has(const char *path, const char *text)
{
	char buf[65536];
	FILE *fp = fopen(path, "r");
	size_t n;

	if (!fp)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	return strstr(buf, text) != NULL;
}

/* Once the driver is open: values in force, and every setter refused. */
static void test_params_open(const char *dir)
{
	CUfileDrvProps_t props;
	char path[4200];
	size_t one[1] = { 4 };
	int level = -1;

	CHECK(p_cuFileUseCount() == 0, "(the driver opened through use)");
	CHECK_ERR(p_cuFileSetParameterSizeT(CUFILE_PARAM_EXECUTION_MAX_IO_THREADS, 4),
		  CU_FILE_DRIVER_ALREADY_OPEN, "a size parameter once the driver is open");
	CHECK_ERR(p_cuFileSetParameterBool(CUFILE_PARAM_FORCE_COMPAT_MODE, true),
		  CU_FILE_DRIVER_ALREADY_OPEN, "a bool parameter once open");
	CHECK_ERR(p_cuFileSetParameterString(CUFILE_PARAM_LOGGING_LEVEL, "ERROR"),
		  CU_FILE_DRIVER_ALREADY_OPEN, "a string parameter once open");
	CHECK_ERR(p_cuFileSetParameterPosixPoolSlabArray(one, one, 1), CU_FILE_DRIVER_ALREADY_OPEN,
		  "POSIX slabs once open");
	CHECK_ERR(p_cuFileSetParameterGpuBounceBufferSlabArray(one, one, 1),
		  CU_FILE_DRIVER_ALREADY_OPEN, "GPU bounce slabs once open");
	CHECK(get_size(CUFILE_PARAM_EXECUTION_MAX_IO_THREADS) == 2 &&
		      !get_bool(CUFILE_PARAM_FORCE_COMPAT_MODE),
	      "a refused setter changes nothing");

	/* The values in force: the driver's setters change them at run time. */
	CHECK_OK(p_cuFileDriverGetProperties(&props), "properties");
	CHECK(get_size(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB) == props.nvfs.max_direct_io_size &&
		      get_size(CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB) == props.nvfs.poll_thresh_size &&
		      get_size(CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB) ==
			      props.max_device_cache_size &&
		      get_bool(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE) ==
			      !!(props.nvfs.dcontrolflags & (1u << CU_FILE_USE_POLL_MODE)),
	      "parameters and properties agree (direct I/O %zu KB)", props.nvfs.max_direct_io_size);
	CHECK(props.fflags & (1u << CU_FILE_P2P_SUPPORTED), "PCI P2PDMA is a feature");
	CHECK(get_size(CUFILE_PARAM_PROFILE_STATS) == 2, "the staged statistics level is in force");
	CHECK_OK(p_cuFileGetStatsLevel(&level), "cuFileGetStatsLevel");
	CHECK(level == 2, "statistics at level %d", level);

	/* The engine started with the staged settings, as its log says. */
	snprintf(path, sizeof(path), "%s/cufile.log", dir);
	CHECK(file_has(path, "driver open: path auto chunk 262144 depth 3 copy threads 2"),
	      "the engine runs with the staged chunk, depth and threads (%s)", path);
}

/* ---------------------------------------------------------- P2P, BAR, PCIe */

static void test_platform(const char *dir, int gpus)
{
	CUfileP2PFlags_t fl = (CUfileP2PFlags_t)-7;
	size_t bar = 0;
	char path[4200];
	CUfileError_t e;

	CHECK_OK(p_cuFileDriverGetP2PFlags(CU_FILE_NVME_SUPPORTED, &fl), "NVMe's P2P flags");
	CHECK(fl == CU_FILE_P2P_FLAG_PCI_P2PDMA, "NVMe: PCI P2PDMA (%#x)", (unsigned)fl);
	CHECK_OK(p_cuFileDriverGetP2PFlags(CU_FILE_LUSTRE_SUPPORTED, &fl), "Lustre's P2P flags");
	CHECK(fl == 0, "Lustre: none (%#x)", (unsigned)fl);
	CHECK_ERR(p_cuFileDriverGetP2PFlags(CU_FILE_MAX_TARGET_TYPES, &fl), CU_FILE_INVALID_VALUE,
		  "P2P flags of CU_FILE_MAX_TARGET_TYPES");
	CHECK_ERR(p_cuFileDriverGetP2PFlags(CU_FILE_NVME_SUPPORTED, NULL), CU_FILE_INVALID_VALUE,
		  "cuFileDriverGetP2PFlags(NULL)");
	CHECK_ERR(p_cuFileDriverSetP2PFlags(CU_FILE_NVME_SUPPORTED, CU_FILE_P2P_FLAG_NVFS),
		  CU_FILE_INVALID_VALUE, "NVFS cannot be set");
	CHECK_ERR(p_cuFileDriverSetP2PFlags(CU_FILE_NVME_SUPPORTED, CU_FILE_P2P_FLAG_DMABUF),
		  CU_FILE_INVALID_VALUE, "DMABUF cannot be set");
	CHECK_ERR(p_cuFileDriverSetP2PFlags((CUfileDriverStatusFlags_t)-1,
					    CU_FILE_P2P_FLAG_PCI_P2PDMA),
		  CU_FILE_INVALID_VALUE, "an unknown type");
#if defined(__aarch64__)
	const CUfileP2PFlags_t mine = CU_FILE_P2P_FLAG_C2C;
#else
	const CUfileP2PFlags_t mine = CU_FILE_P2P_FLAG_PCI_P2PDMA;
#endif
	CHECK_OK(p_cuFileDriverSetP2PFlags(CU_FILE_LUSTRE_SUPPORTED, mine),
		 "set the architecture's P2P flag on Lustre");
	CHECK_OK(p_cuFileDriverGetP2PFlags(CU_FILE_LUSTRE_SUPPORTED, &fl), "read it back");
	CHECK(fl == mine, "Lustre's flags read back (%#x)", (unsigned)fl);
	CHECK_OK(p_cuFileDriverSetP2PFlags(CU_FILE_LUSTRE_SUPPORTED, (CUfileP2PFlags_t)0),
		 "clear them");

	CHECK_ERR(p_cuFileGetBARSizeInKB(0, NULL), CU_FILE_INVALID_VALUE,
		  "cuFileGetBARSizeInKB(NULL)");
	CHECK_ERR(p_cuFileGetBARSizeInKB(-1, &bar), CU_FILE_INVALID_VALUE, "GPU -1");
	CHECK_ERR(p_cuFileGetBARSizeInKB(gpus, &bar), CU_FILE_INVALID_VALUE,
		  "the GPU after the last");
	if (gpus > 0) {
		/* A real GPU's BAR1 is in sysfs; an emulated one's is not. */
		e = p_cuFileGetBARSizeInKB(0, &bar);
		CHECK((e.err == CU_FILE_SUCCESS && bar > 0 && bar % 4 == 0) ||
			      e.err == CU_FILE_INVALID_VALUE,
		      "GPU 0's BAR1: %d, %zu KB", (int)e.err, bar);
	}

	snprintf(path, sizeof(path), "%s/topology.json", dir);
	CHECK_OK(p_cuFileExportPCIeTopology(path), "cuFileExportPCIeTopology");
	CHECK(file_has(path, "\"pci_devices\": [") && file_has(path, "\"gpus\": [") &&
		      file_has(path, "\"nvme\": ["),
	      "the topology is written as JSON");
	CHECK_ERR(p_cuFileExportPCIeTopology(NULL), CU_FILE_INVALID_VALUE,
		  "cuFileExportPCIeTopology(NULL)");
	CHECK_ERR(p_cuFileExportPCIeTopology(""), CU_FILE_INVALID_VALUE, "an empty file name");
	CHECK_ERR(p_cuFileExportPCIeTopology("/nonexistent/dir/topology.json"),
		  CU_FILE_INVALID_VALUE, "a file that cannot be written");
}

/* ------------------------------------------------------------------- files */

static CUfileError_t reg_fd(CUfileHandle_t *fh, int type, int fd)
{
	CUfileDescr_t d;

	memset(&d, 0, sizeof(d));
	d.type = (enum CUfileFileHandleType)type;
	d.handle.fd = fd;
	return p_cuFileHandleRegister(fh, &d);
}

struct files {
	int direct_fd, plain_fd, rw_fd;
	CUfileHandle_t direct, plain, rw;
	char data_path[4096], rw_path[4096];
};

static void test_handles(const char *dir, struct files *f)
{
	CUfileHandle_t h = NULL;
	CUfileDescr_t d;
	int fds[2], dfd;

	f->direct_fd = open(f->data_path, O_RDONLY | O_DIRECT);
	f->plain_fd = open(f->data_path, O_RDONLY);
	f->rw_fd = open(f->rw_path, O_RDWR);
	if (f->direct_fd < 0 || f->plain_fd < 0 || f->rw_fd < 0)
		die("open the test files");
	CHECK_OK(reg_fd(&f->direct, CU_FILE_HANDLE_TYPE_OPAQUE_FD, f->direct_fd),
		 "register an O_DIRECT fd");
	CHECK_OK(reg_fd(&f->plain, CU_FILE_HANDLE_TYPE_OPAQUE_FD, f->plain_fd),
		 "register a plain fd of the same file");
	CHECK_OK(reg_fd(&f->rw, CU_FILE_HANDLE_TYPE_OPAQUE_FD, f->rw_fd),
		 "register a read-write fd");
	CHECK(f->direct && f->plain && f->rw && f->direct != f->plain,
	      "three distinct handles");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, f->direct_fd),
		  CU_FILE_HANDLE_ALREADY_REGISTERED, "the same fd twice");

	memset(&d, 0, sizeof(d));
	d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = f->plain_fd;
	CHECK_ERR(p_cuFileHandleRegister(NULL, &d), CU_FILE_INVALID_VALUE, "NULL handle pointer");
	CHECK_ERR(p_cuFileHandleRegister(&h, NULL), CU_FILE_INVALID_VALUE, "NULL descriptor");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_WIN32, 0), CU_FILE_INVALID_FILE_TYPE,
		  "a Windows handle");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_USERSPACE_FS, 0), CU_FILE_INVALID_FILE_TYPE,
		  "a user-space filesystem");
	CHECK_ERR(reg_fd(&h, 0, f->plain_fd), CU_FILE_INVALID_VALUE, "handle type 0");
	CHECK_ERR(reg_fd(&h, 42, f->plain_fd), CU_FILE_INVALID_VALUE, "handle type 42");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, -1), CU_FILE_INVALID_VALUE, "fd -1");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, 1000), CU_FILE_INVALID_VALUE,
		  "a closed fd");
	if (pipe(fds) != 0)
		die("pipe");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, fds[0]), CU_FILE_INVALID_FILE_TYPE,
		  "a pipe");
	close(fds[0]);
	close(fds[1]);
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	if (dfd < 0)
		die("open the directory");
	CHECK_ERR(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, dfd), CU_FILE_INVALID_FILE_TYPE,
		  "a directory");
	close(dfd);
	p_cuFileHandleDeregister((CUfileHandle_t)(uintptr_t)0x5eed);
	p_cuFileHandleDeregister(NULL);
	CHECK(1, "deregistering unknown handles is harmless");
}

/* ----------------------------------------------------------------- buffers */

/* Host buffers: one from posix_memalign, registered; one from malloc at an
 * odd address, registered; one unregistered. */
struct bufs {
	unsigned char *aligned; /* 4 MiB, registered */
	unsigned char *odd_mem, *odd; /* odd = odd_mem + 1, 1 MiB, registered */
	unsigned char *loose_mem, *loose; /* loose = loose_mem + 3, 4 MiB, unregistered */
};

#define ALIGNED_LEN (4u * MIB)
#define ODD_LEN MIB
#define LOOSE_LEN (4u * MIB)

static void test_buffers(struct bufs *b)
{
	unsigned char *other;

	if (posix_memalign((void **)&b->aligned, 4096, ALIGNED_LEN) != 0)
		die("posix_memalign");
	b->odd_mem = malloc(ODD_LEN + 1);
	b->loose_mem = malloc(LOOSE_LEN + 3);
	other = malloc(4096);
	if (!b->odd_mem || !b->loose_mem || !other)
		die("malloc");
	b->odd = b->odd_mem + 1;
	b->loose = b->loose_mem + 3;

	CHECK_OK(p_cuFileBufRegister(b->aligned, ALIGNED_LEN, 0), "register an aligned buffer");
	CHECK_OK(p_cuFileBufRegister(b->odd, ODD_LEN, 0), "register malloc'd memory at an odd address");
	CHECK_ERR(p_cuFileBufRegister(b->aligned, ALIGNED_LEN, 0), CU_FILE_MEMORY_ALREADY_REGISTERED,
		  "the same buffer twice");
	CHECK_ERR(p_cuFileBufRegister(b->aligned + 4096, 100, 0),
		  CU_FILE_MEMORY_ALREADY_REGISTERED, "a range inside a registered buffer");
	CHECK_ERR(p_cuFileBufRegister(b->odd - 1, 2, 0), CU_FILE_MEMORY_ALREADY_REGISTERED,
		  "a range reaching into a registered buffer");
	CHECK_ERR(p_cuFileBufRegister(NULL, 4096, 0), CU_FILE_INVALID_VALUE, "a NULL buffer");
	CHECK_ERR(p_cuFileBufRegister(other, 0, 0), CU_FILE_INVALID_VALUE, "a length of 0");
	CHECK_ERR(p_cuFileBufRegister(other, 4096, 0x100), CU_FILE_INVALID_VALUE, "unknown flags");
	CHECK_OK(p_cuFileBufRegister(other, 4096, CU_FILE_RDMA_REGISTER),
		 "CU_FILE_RDMA_REGISTER is accepted");
	CHECK_OK(p_cuFileBufDeregister(other), "deregister it");
	CHECK_ERR(p_cuFileBufDeregister(other), CU_FILE_MEMORY_NOT_REGISTERED,
		  "deregister it twice");
	CHECK_ERR(p_cuFileBufDeregister(b->loose), CU_FILE_MEMORY_NOT_REGISTERED,
		  "deregister an unknown buffer");
	CHECK_ERR(p_cuFileBufDeregister(b->aligned + 1), CU_FILE_MEMORY_NOT_REGISTERED,
		  "deregister a pointer inside a buffer");
	CHECK_ERR(p_cuFileBufDeregister(NULL), CU_FILE_INVALID_VALUE, "deregister NULL");
	free(other);
}

/* ---------------------------------------------------------- synchronous I/O */

/* Reads `len` at `off` through `fh` into base + boff, and checks the
 * result (the bytes up to the end of the file) and every byte; the bytes
 * past what the read returns must be untouched. */
static void read_and_check(const char *what, CUfileHandle_t fh, unsigned char *base, off_t boff,
			   size_t len, off_t off)
{
	size_t want = off >= (off_t)FSIZE ? 0 : FSIZE - (size_t)off < len ? FSIZE - (size_t)off : len;
	size_t guard = 64;
	ssize_t got;
	long at;

	memset(base + boff, 0xee, len);
	got = p_cuFileRead(fh, base, len, off, boff);
	at = got == (ssize_t)want ? differs(base + boff, DATA_SEED, (uint64_t)off, want) : -2;
	if (guard > len - want)
		guard = len - want;
	for (size_t i = 0; at == -1 && i < guard; i++)
		if (base[boff + want + i] != 0xee)
			at = (long)(want + i);
	CHECK(at == -1, "%s: %zu at %lld into +%lld: %zd of %zu bytes%s", what, len, (long long)off,
	      (long long)boff, got, want, at == -1 ? "" : ", wrong bytes");
}

static void test_reads(struct files *f, struct bufs *b)
{
	read_and_check("O_DIRECT fd, registered, aligned", f->direct, b->aligned, 0, MIB, 0);
	read_and_check("O_DIRECT fd, registered, 4 MiB", f->direct, b->aligned, 0, 4 * MIB, 0);
	read_and_check("plain fd, registered, aligned", f->plain, b->aligned, 8192, 65536, 1 << 20);
	read_and_check("O_DIRECT fd, unaligned everything", f->direct, b->aligned, 777, 12345, 4097);
	read_and_check("plain fd, unaligned everything", f->plain, b->aligned, 3, 100001, 999999);
	read_and_check("one byte", f->direct, b->aligned, 5, 1, 3);
	read_and_check("odd registered buffer", f->direct, b->odd, 0, 65536, 8192);
	read_and_check("odd registered buffer, offsets", f->plain, b->odd, 11, ODD_LEN - 11, 13);
	read_and_check("unregistered, odd address", f->direct, b->loose, 0, 3 * MIB + 5, 17);
	read_and_check("unregistered, aligned offsets", f->plain, b->loose, 4093, 1 << 20, 4096);
	read_and_check("interior of a registered buffer", f->direct, b->aligned + 4096, 100, 5000, 1);
	read_and_check("across the end of the file", f->direct, b->aligned, 0, 20000, FSIZE - 1000);
	read_and_check("across the end, unaligned", f->plain, b->loose, 1, 3 * MIB, FSIZE - MIB - 7);
	read_and_check("the last byte", f->plain, b->aligned, 0, 4096, FSIZE - 1);
	read_and_check("at the end of the file", f->direct, b->aligned, 0, 4096, FSIZE);
	read_and_check("past the end of the file", f->plain, b->aligned, 0, 4096, FSIZE + 12345);
	CHECK(p_cuFileRead(f->direct, b->aligned, 0, 0, 0) == 0, "a read of 0 bytes is 0");
}

static void test_read_errors(struct files *f, struct bufs *b)
{
	CUfileHandle_t gone = NULL;
	int fd;
	ssize_t r;

	CHECK(p_cuFileRead((CUfileHandle_t)(uintptr_t)0x1234, b->aligned, 4096, 0, 0) ==
		      -CU_FILE_HANDLE_NOT_REGISTERED,
	      "read with an unregistered handle: -CU_FILE_HANDLE_NOT_REGISTERED");
	CHECK(p_cuFileWrite((CUfileHandle_t)(uintptr_t)0x1234, b->aligned, 4096, 0, 0) ==
		      -CU_FILE_HANDLE_NOT_REGISTERED,
	      "write with an unregistered handle: -CU_FILE_HANDLE_NOT_REGISTERED");
	CHECK(p_cuFileRead(NULL, b->aligned, 4096, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "read with a NULL handle: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileRead(f->direct, NULL, 4096, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "read into NULL: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileWrite(f->rw, NULL, 4096, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "write from NULL: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileRead(f->direct, b->aligned, 4096, -1, 0) == -CU_FILE_INVALID_VALUE,
	      "a negative file offset: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileRead(f->direct, b->aligned, 4096, 0, -4096) == -CU_FILE_INVALID_VALUE,
	      "a negative buffer offset: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileRead(f->direct, b->aligned, 4096, 0, ALIGNED_LEN - 4095) ==
		      -CU_FILE_INVALID_VALUE,
	      "a read past the registered buffer: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileRead(f->direct, b->odd, ODD_LEN + 1, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "a read one byte longer than the buffer: -CU_FILE_INVALID_VALUE");

	/* A storage error: -1 with errno. The O_DIRECT fd is read-only. */
	errno = 0;
	r = p_cuFileWrite(f->direct, b->aligned, 4096, 0, 0);
	CHECK(r == -1 && errno == EBADF, "a write through a read-only fd: %zd, errno %d (%s)", r,
	      errno, strerror(errno));

	/* A handle stops working when it is deregistered. */
	fd = open(f->data_path, O_RDONLY);
	if (fd < 0)
		die("open");
	CHECK_OK(reg_fd(&gone, CU_FILE_HANDLE_TYPE_OPAQUE_FD, fd), "register another fd");
	CHECK(p_cuFileRead(gone, b->aligned, 100, 0, 0) == 100, "read through it");
	p_cuFileHandleDeregister(gone);
	CHECK(p_cuFileRead(gone, b->aligned, 100, 0, 0) == -CU_FILE_HANDLE_NOT_REGISTERED,
	      "a deregistered handle: -CU_FILE_HANDLE_NOT_REGISTERED");
	CHECK_OK(reg_fd(&gone, CU_FILE_HANDLE_TYPE_OPAQUE_FD, fd), "the fd registers again");
	p_cuFileHandleDeregister(gone);
	close(fd);
}

/* Writes `len` bytes of stream `seed` (its bytes from `seed_off`) placed at
 * base + boff, to `off` of the read-write file, and checks the result. */
static void write_and_check(const char *what, struct files *f, unsigned char *base, off_t boff,
			    size_t len, off_t off, uint64_t seed, uint64_t seed_off)
{
	ssize_t got;

	fill(base + boff, seed, seed_off, len);
	got = p_cuFileWrite(f->rw, base, len, off, boff);
	CHECK(got == (ssize_t)len, "%s: %zu at %lld from +%lld: %zd", what, len, (long long)off,
	      (long long)boff, got);
	if (got == (ssize_t)len)
		shadow_write(base + boff, (uint64_t)off, len);
}

static void test_writes(struct files *f, struct bufs *b)
{
	write_and_check("registered, aligned", f, b->aligned, 0, MIB, 0, 10, 0);
	write_and_check("registered, unaligned", f, b->aligned, 4097, 77777, 1234567, 11, 5);
	write_and_check("odd registered buffer", f, b->odd, 1, 100000, 2 * MIB + 3, 12, 0);
	write_and_check("unregistered, odd address", f, b->loose, 0, 3 * MIB / 2, 3 * MIB - 17, 13, 9);
	write_and_check("one byte", f, b->loose, 5, 1, 7, 14, 0);
	write_and_check("growing the file", f, b->aligned, 0, 300001, FSIZE + 4096, 15, 0);
	CHECK(p_cuFileWrite(f->rw, b->aligned, 0, 0, 0) == 0, "a write of 0 bytes is 0");
	CHECK(file_matches_shadow(f->rw_path), "the file holds every write (pread)");
	read_and_check("the data file is unchanged by the writes", f->plain, b->aligned, 0, MIB, 0);
}

/* ------------------------------------------------------------------ threads */

struct worker {
	CUfileHandle_t fh;
	unsigned char *buf; /* NULL: allocate one */
	size_t buf_len;
	unsigned seed;
	int bad;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	unsigned char *own = NULL, *buf = w->buf;
	unsigned s = w->seed;

	if (!buf) {
		own = malloc(w->buf_len);
		buf = own;
		if (!buf) {
			w->bad++;
			return NULL;
		}
	}
	for (int i = 0; i < 24; i++) {
		size_t len, boff;
		off_t off;
		ssize_t got;

		s = s * 1103515245u + 12345u;
		len = 1 + (s >> 8) % (w->buf_len / 2);
		s = s * 1103515245u + 12345u;
		boff = (s >> 8) % (w->buf_len - len);
		s = s * 1103515245u + 12345u;
		off = (off_t)((s >> 4) % (FSIZE + 1000));
		got = p_cuFileRead(w->fh, buf, len, off, (off_t)boff);
		if (got < 0 || (size_t)got > len ||
		    differs(buf + boff, DATA_SEED, (uint64_t)off, (size_t)got) != -1)
			w->bad++;
		else if ((size_t)got < len && (uint64_t)off + (uint64_t)got != FSIZE)
			w->bad++;
	}
	free(own);
	return NULL;
}

static void test_threads(struct files *f, struct bufs *b)
{
	pthread_t t[8];
	struct worker w[8];

	for (int i = 0; i < 8; i++) {
		w[i] = (struct worker){
			.fh = i % 2 ? f->direct : f->plain,
			/* Four share the registered buffer, each in its own quarter. */
			.buf = i < 4 ? b->aligned + (size_t)i * MIB : NULL,
			.buf_len = i < 4 ? MIB : 2 * MIB,
			.seed = 77u + (unsigned)i,
		};
		if (pthread_create(&t[i], NULL, worker_main, &w[i]) != 0)
			die("pthread_create");
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].bad == 0, "thread %d: 24 reads through one shared handle, %d wrong", i,
		      w[i].bad);
	}
}

/* ----------------------------------------------------------------- batches */

struct expect {
	int write;
	size_t ret;
	unsigned char *dst; /* reads: where the bytes landed */
	uint64_t off;
	int seen;
};

/* Collects `n` events of `batch` (any order), checking each against
 * `want[cookie - 0x1000]`. */
static void collect(const char *what, CUfileBatchHandle_t batch, unsigned n, struct expect *want,
		    unsigned min_nr)
{
	CUfileIOEvents_t ev[64];
	unsigned got = 0, calls = 0, bad = 0;

	while (got < n && calls < 1000) {
		unsigned nr = 64;
		struct timespec t = { 10, 0 };
		CUfileError_t e = p_cuFileBatchIOGetStatus(batch, min_nr < n - got ? min_nr : n - got,
							   &nr, ev, &t);
		calls++;
		if (e.err != CU_FILE_SUCCESS) {
			bad++;
			break;
		}
		if (calls == 1 && nr < (min_nr < n ? min_nr : n))
			bad++;
		for (unsigned i = 0; i < nr; i++) {
			uintptr_t c = (uintptr_t)ev[i].cookie;
			struct expect *x = c >= 0x1000 && c < 0x1000 + 64 ? &want[c - 0x1000] : NULL;

			if (!x || x->seen++ || ev[i].status != CUFILE_COMPLETE || ev[i].ret != x->ret) {
				printf("     event cookie %#lx status %#x ret %zd\n", (unsigned long)c,
				       ev[i].status, (ssize_t)ev[i].ret);
				bad++;
				continue;
			}
			if (!x->write && differs(x->dst, DATA_SEED, x->off, x->ret) != -1)
				bad++;
		}
		got += nr;
	}
	CHECK(got == n && bad == 0, "%s: %u of %u events in %u calls, %u wrong", what, got, n, calls,
	      bad);
}

static void entry(CUfileIOParams_t *p, CUfileHandle_t fh, int write, void *buf, off_t boff,
		  size_t size, off_t off, unsigned cookie)
{
	memset(p, 0, sizeof(*p));
	p->mode = CUFILE_BATCH;
	p->fh = fh;
	p->opcode = write ? CUFILE_WRITE : CUFILE_READ;
	p->u.batch.devPtr_base = buf;
	p->u.batch.devPtr_offset = boff;
	p->u.batch.size = size;
	p->u.batch.file_offset = off;
	p->cookie = (void *)(uintptr_t)(0x1000 + cookie);
}

/* 16 entries, ten reads into `rbuf` (registered or not) and six writes from
 * `wbuf`, at odd places; one read crosses the end of the file and one
 * starts after it. Fills `want`. Write sources get stream `seed`. */
static void mixed(CUfileIOParams_t *io, struct expect *want, struct files *f, unsigned char *rbuf,
		  unsigned char *wbuf, uint64_t seed, off_t wbase)
{
	for (unsigned i = 0; i < 16; i++) {
		if (i < 10) {
			off_t off = (off_t)i * 262144 + i * 7;
			size_t size = 65536 + i * 1000 + 3;
			off_t boff = (off_t)i * 262144 + 5;

			if (i == 8) {
				off = FSIZE - 5000;
				size = 20000;
			}
			if (i == 9)
				off = FSIZE + 100;
			entry(&io[i], i % 2 ? f->direct : f->plain, 0, rbuf, boff, size, off, i);
			memset(rbuf + boff, 0xee, size);
			want[i] = (struct expect){ 0, i == 9 ? 0 : i == 8 ? 5000 : size, rbuf + boff,
						   (uint64_t)off, 0 };
		} else {
			off_t off = wbase + (off_t)(i - 10) * 300000 + 11;
			size_t size = 50000 + i;
			off_t boff = (off_t)(i - 10) * 60000 + 1;

			fill(wbuf + boff, seed, (uint64_t)off, size);
			entry(&io[i], f->rw, 1, wbuf, boff, size, off, i);
			want[i] = (struct expect){ 1, size, NULL, (uint64_t)off, 0 };
		}
	}
}

static void shadow_mixed(const CUfileIOParams_t *io, const unsigned char *wbuf)
{
	for (unsigned i = 10; i < 16; i++)
		shadow_write(wbuf + io[i].u.batch.devPtr_offset, (uint64_t)io[i].u.batch.file_offset,
			     io[i].u.batch.size);
}

static void test_batch(struct files *f, struct bufs *b)
{
	CUfileBatchHandle_t batch = NULL, other = NULL;
	CUfileIOParams_t io[17], bad[16];
	CUfileIOEvents_t ev[16];
	struct expect want[17];
	struct timespec zero = { 0, 0 };
	CUfileDrvProps_t props;
	unsigned nr;

	CHECK_OK(p_cuFileDriverGetProperties(&props), "properties");
	CHECK_ERR(p_cuFileBatchIOSetUp(&other, 0), CU_FILE_INVALID_VALUE, "a batch of 0");
	CHECK_ERR(p_cuFileBatchIOSetUp(&other, props.max_batch_io_size + 1), CU_FILE_INVALID_VALUE,
		  "a batch over max_batch_io_size");
	CHECK_ERR(p_cuFileBatchIOSetUp(NULL, 16), CU_FILE_INVALID_VALUE, "a NULL batch pointer");
	CHECK_OK(p_cuFileBatchIOSetUp(&batch, 16), "a batch of 16");

	/* Registered reads, unregistered writes. */
	mixed(io, want, f, b->aligned, b->loose, 20, 0);
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 16, io, 0), "submit 16 mixed entries");
	collect("16 mixed entries, all at once", batch, 16, want, 16);
	shadow_mixed(io, b->loose);

	/* Unregistered reads, registered writes, collected four at least at a
	 * time. */
	mixed(io, want, f, b->loose, b->aligned, 21, 100000);
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 16, io, 0), "submit 16 more");
	collect("16 more, at least 4 per call", batch, 16, want, 4);
	shadow_mixed(io, b->aligned);
	CHECK(file_matches_shadow(f->rw_path), "the batch writes are in the file");

	/* Every entry is checked before any starts. */
	mixed(bad, want, f, b->aligned, b->loose, 22, 50000);
	bad[7].opcode = (CUfileOpcode_t)5;
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 16, bad, 0), CU_FILE_INVALID_VALUE,
		  "an entry with opcode 5");
	mixed(bad, want, f, b->aligned, b->loose, 22, 50000);
	bad[12].mode = (CUfileBatchMode_t)0;
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 16, bad, 0), CU_FILE_INVALID_VALUE,
		  "an entry with mode 0");
	mixed(bad, want, f, b->aligned, b->loose, 22, 50000);
	bad[15].fh = (CUfileHandle_t)(uintptr_t)0x4321;
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 16, bad, 0), CU_FILE_HANDLE_NOT_REGISTERED,
		  "an entry with an unregistered handle");
	mixed(bad, want, f, b->aligned, b->loose, 22, 50000);
	bad[3].u.batch.devPtr_offset = -1;
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 16, bad, 0), CU_FILE_INVALID_VALUE,
		  "an entry with a negative buffer offset");
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 16, io, 1), CU_FILE_INVALID_VALUE, "flags 1");
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 0, io, 0), CU_FILE_INVALID_VALUE, "0 entries");
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 17, io, 0), CU_FILE_INVALID_VALUE,
		  "more entries than the batch was set up for");
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 1, NULL, 0), CU_FILE_INVALID_VALUE, "NULL entries");
	CHECK_ERR(p_cuFileBatchIOSubmit((CUfileBatchHandle_t)(uintptr_t)0x999, 1, io, 0),
		  CU_FILE_INVALID_VALUE, "an unknown batch");
	nr = 16;
	CHECK_OK(p_cuFileBatchIOGetStatus(batch, 0, &nr, ev, &zero), "status with nothing submitted");
	CHECK(nr == 0, "no event came of the refused submissions (%u)", nr);
	CHECK(file_matches_shadow(f->rw_path), "no refused write reached the file");

	/* Full: 16 not yet returned, one more is refused. */
	mixed(io, want, f, b->aligned, b->loose, 23, 200000);
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 10, io, 0), "submit 10 reads");
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 6, io + 10, 0), "submit 6 writes");
	entry(&io[16], f->plain, 0, b->odd, 0, 100, 0, 16);
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 1, io + 16, 0), CU_FILE_BATCH_FULL,
		  "a 17th entry before any is returned");
	nr = 2;
	CHECK_ERR(p_cuFileBatchIOGetStatus(batch, 3, &nr, ev, NULL), CU_FILE_INVALID_VALUE,
		  "min_nr above *nr");
	CHECK_ERR(p_cuFileBatchIOGetStatus(batch, 0, NULL, ev, NULL), CU_FILE_INVALID_VALUE,
		  "a NULL nr");
	collect("the 16 that filled the batch", batch, 16, want, 16);
	shadow_mixed(io, b->loose);

	/* A failed entry says how: a write through the read-only fd. */
	entry(&io[0], f->direct, 1, b->odd, 0, 4096, 0, 0);
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 1, io, 0), "submit a write to a read-only fd");
	nr = 1;
	CHECK_OK(p_cuFileBatchIOGetStatus(batch, 1, &nr, ev, NULL), "wait for it");
	CHECK(nr == 1 && ev[0].status == CUFILE_FAILED && (ssize_t)ev[0].ret == -EBADF &&
		      ev[0].cookie == (void *)0x1000,
	      "it failed with -EBADF in ret (status %#x, ret %zd)", ev[0].status, (ssize_t)ev[0].ret);

	/* Cancel waits for what runs; the events stay. */
	mixed(io, want, f, b->aligned, b->loose, 24, 0);
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 10, io, 0), "submit 10 reads");
	CHECK_OK(p_cuFileBatchIOCancel(batch), "cancel");
	nr = 16;
	CHECK_OK(p_cuFileBatchIOGetStatus(batch, 0, &nr, ev, &zero), "status after cancel");
	CHECK(nr == 10, "every entry had ended when cancel returned (%u events)", nr);

	/* A timeout returns what has ended. */
	nr = 16;
	CHECK_OK(p_cuFileBatchIOGetStatus(batch, 1, &nr, ev, &zero), "status with a zero timeout");
	CHECK(nr == 0, "nothing left (%u)", nr);

	p_cuFileBatchIODestroy(batch);
	CHECK_ERR(p_cuFileBatchIOSubmit(batch, 1, io, 0), CU_FILE_INVALID_VALUE,
		  "a destroyed batch is unknown");
	CHECK_ERR(p_cuFileBatchIOCancel(batch), CU_FILE_INVALID_VALUE, "cancel a destroyed batch");
	p_cuFileBatchIODestroy(batch);
	CHECK(file_matches_shadow(f->rw_path), "the file after the batches");
}

/* ----------------------------------------------------------------- streams */

static void test_async_null_stream(struct files *f, struct bufs *b)
{
	size_t size = 100000;
	off_t off = 12345, boff = 7;
	ssize_t bytes = 0;
	void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);

	memset(b->aligned, 0xee, size + 7);
	CHECK_OK(p_cuFileReadAsync(f->direct, b->aligned, &size, &off, &boff, &bytes, NULL),
		 "cuFileReadAsync on the NULL stream");
	CHECK(bytes == (ssize_t)size && differs(b->aligned + 7, DATA_SEED, 12345, size) == -1,
	      "it read before returning (%zd bytes)", bytes);

	off = FSIZE - 10;
	bytes = 0;
	CHECK_OK(p_cuFileReadAsync(f->plain, b->loose, &size, &off, &boff, &bytes, NULL),
		 "cuFileReadAsync across the end of the file");
	CHECK(bytes == 10 && differs(b->loose + 7, DATA_SEED, FSIZE - 10, 10) == -1,
	      "it read the 10 bytes to the end (%zd)", bytes);

	size = 54321;
	off = 777777;
	boff = 3;
	bytes = 0;
	fill(b->odd + 3, 30, 0, size);
	CHECK_OK(p_cuFileWriteAsync(f->rw, b->odd, &size, &off, &boff, &bytes, NULL),
		 "cuFileWriteAsync on the NULL stream");
	CHECK(bytes == (ssize_t)size, "it wrote %zd bytes", bytes);
	if (bytes == (ssize_t)size)
		shadow_write(b->odd + 3, 777777, size);
	CHECK(file_matches_shadow(f->rw_path), "the async write is in the file");

	off = -5;
	bytes = 0;
	CHECK_OK(p_cuFileReadAsync(f->direct, b->aligned, &size, &off, &boff, &bytes, NULL),
		 "a read whose offset turns out negative is submitted");
	CHECK(bytes == -CU_FILE_INVALID_VALUE, "its result is -CU_FILE_INVALID_VALUE (%zd)", bytes);
	CHECK_ERR(p_cuFileReadAsync((CUfileHandle_t)(uintptr_t)0x77, b->aligned, &size, &off, &boff,
				    &bytes, NULL),
		  CU_FILE_HANDLE_NOT_REGISTERED, "cuFileReadAsync with an unregistered handle");
	CHECK_ERR(p_cuFileReadAsync(f->direct, b->aligned, NULL, &off, &boff, &bytes, NULL),
		  CU_FILE_INVALID_VALUE, "a NULL size pointer");
	CHECK_ERR(p_cuFileWriteAsync(f->rw, b->aligned, &size, &off, &boff, NULL, NULL),
		  CU_FILE_INVALID_VALUE, "a NULL byte-count pointer");

	CHECK_OK(p_cuFileStreamRegister(NULL, CU_FILE_STREAM_FIXED_BUF_OFFSET |
							  CU_FILE_STREAM_FIXED_FILE_OFFSET |
							  CU_FILE_STREAM_FIXED_FILE_SIZE |
							  CU_FILE_STREAM_PAGE_ALIGNED_INPUTS),
		 "register the NULL stream with every flag");
	CHECK_ERR(p_cuFileStreamRegister(NULL, 16), CU_FILE_INVALID_VALUE, "an unknown stream flag");
	CHECK_OK(p_cuFileStreamDeregister(NULL), "deregister it");
	CHECK_ERR(p_cuFileStreamDeregister(NULL), CU_FILE_INVALID_VALUE,
		  "deregister it twice");
	if (!libcuda) {
		CUstream s = (CUstream)(uintptr_t)0x5000;

		CHECK_ERR(p_cuFileReadAsync(f->direct, b->aligned, &size, &off, &boff, &bytes, s),
			  CU_FILE_ASYNC_NOT_SUPPORTED, "a stream without a CUDA driver");
		CHECK_ERR(p_cuFileStreamRegister(s, 0), CU_FILE_ASYNC_NOT_SUPPORTED,
			  "register a stream without a CUDA driver");
	}
}


/* ------------------------------------------------ scatter, gather, stats */

static void test_vectored(struct files *f, struct bufs *b)
{
	CUfileIOVec_t iov[3];
	size_t lens[3] = { 1000, 3 * 4096 + 7, 50000 }, total = 0;
	unsigned char *bases[3] = { b->loose, b->odd + 5, b->aligned + 4096 };
	off_t at = 12345;
	ssize_t got;
	int same = 1;

	for (int i = 0; i < 3; i++) {
		memset(bases[i], 0, lens[i]);
		iov[i] = (CUfileIOVec_t){ bases[i], lens[i] };
		total += lens[i];
	}
	got = p_cuFileReadv(f->direct, iov, 3, at, 0);
	for (int i = 0; i < 3; i++) {
		same &= differs(bases[i], DATA_SEED, (uint64_t)at, lens[i]) == -1;
		at += (off_t)lens[i];
	}
	CHECK(got == (ssize_t)total && same,
	      "cuFileReadv: 3 buffers (registered, not, inside one) from 12345: %zd of %zu bytes",
	      got, total);

	/* preadv's end of file: the last buffer half full, then nothing. */
	iov[0] = (CUfileIOVec_t){ b->loose, 4000 };
	iov[1] = (CUfileIOVec_t){ b->odd, 4000 };
	got = p_cuFileReadv(f->plain, iov, 2, FSIZE - 5000, 0);
	CHECK(got == 5000 && differs(b->loose, DATA_SEED, FSIZE - 5000, 4000) == -1 &&
		      differs(b->odd, DATA_SEED, FSIZE - 1000, 1000) == -1,
	      "cuFileReadv across the end of the file: %zd of 5000", got);
	CHECK(p_cuFileReadv(f->plain, iov, 2, FSIZE, 0) == 0, "cuFileReadv at the end: 0");
	CHECK(p_cuFileReadv(f->plain, iov, 0, 0, 0) == 0, "cuFileReadv of no buffers: 0");
	CHECK(p_cuFileReadv(f->plain, iov, 2, 0, 1) == -CU_FILE_INVALID_VALUE,
	      "cuFileReadv with flags: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileReadv(f->plain, NULL, 2, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "cuFileReadv(NULL): -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileReadv(f->plain, iov, 2, -1, 0) == -CU_FILE_INVALID_VALUE,
	      "cuFileReadv at a negative offset: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileReadv((CUfileHandle_t)(uintptr_t)0x4242, iov, 2, 0, 0) ==
		      -CU_FILE_HANDLE_NOT_REGISTERED,
	      "cuFileReadv on an unknown handle: -CU_FILE_HANDLE_NOT_REGISTERED");
	iov[1].base = NULL;
	CHECK(p_cuFileReadv(f->plain, iov, 2, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "cuFileReadv into a NULL buffer: -CU_FILE_INVALID_VALUE");

	/* Writes land in order, contiguously. */
	fill(b->loose, 77, 0, 3000);
	fill(b->odd, 78, 0, 70000);
	iov[0] = (CUfileIOVec_t){ b->loose, 3000 };
	iov[1] = (CUfileIOVec_t){ b->odd, 70000 };
	got = p_cuFileWritev(f->rw, iov, 2, 3 * MIB + 11, 0);
	shadow_write(b->loose, 3 * MIB + 11, 3000);
	shadow_write(b->odd, 3 * MIB + 11 + 3000, 70000);
	CHECK(got == 73000, "cuFileWritev: 2 buffers, %zd of 73000 bytes", got);
	CHECK(file_matches_shadow(f->rw_path), "the file holds the gathered write");
	CHECK(p_cuFileWritev(f->rw, iov, 2, 0, 7) == -CU_FILE_INVALID_VALUE,
	      "cuFileWritev with flags: -CU_FILE_INVALID_VALUE");
	CHECK(p_cuFileWritev(f->plain, NULL, 1, 0, 0) == -CU_FILE_INVALID_VALUE,
	      "cuFileWritev(NULL): -CU_FILE_INVALID_VALUE");
}

static void test_stats(const char *dir, struct files *f, struct bufs *b, int gpus)
{
	CUfileStatsLevel1_t l1;
	CUfileStatsLevel2_t l2;
	static CUfileStatsLevel3_t l3;
	CUfileIOVec_t iov[2] = { { b->loose, 70000 }, { b->odd, 30000 } };
	CUfileIOParams_t io[2];
	struct expect want[2];
	CUfileBatchHandle_t batch;
	CUfileHandle_t h;
	char path[4200];
	int fd;

	CHECK_ERR(p_cuFileGetStatsL3(&l3), CU_FILE_INVALID_VALUE, "level 3 statistics at level 2");
	CHECK_ERR(p_cuFileGetStatsL1(NULL), CU_FILE_INVALID_VALUE, "cuFileGetStatsL1(NULL)");
	CHECK_OK(p_cuFileStatsReset(), "cuFileStatsReset");
	CHECK_OK(p_cuFileGetStatsL1(&l1), "cuFileGetStatsL1");
	CHECK(l1.read_ops.ok == 0 && l1.read_bytes == 0 && l1.write_bytes == 0 &&
		      l1.batch_submit_ops.ok == 0,
	      "a reset counts from zero");

	/* Known transfers, and what they must add. */
	CHECK(p_cuFileRead(f->direct, b->loose, 100000, 7, 0) == 100000, "read 100000 bytes");
	CHECK(p_cuFileRead(f->plain, b->loose, 5000, FSIZE - 1000, 0) == 1000,
	      "read 1000 bytes at the end");
	CHECK(p_cuFileReadv(f->plain, iov, 2, 0, 0) == 100000, "readv 100000 bytes");
	CHECK(p_cuFileRead((CUfileHandle_t)(uintptr_t)0x4242, b->loose, 10, 0, 0) ==
		      -CU_FILE_HANDLE_NOT_REGISTERED,
	      "a failing read");
	fill(b->loose, 79, 0, 50000);
	CHECK(p_cuFileWrite(f->rw, b->loose, 50000, 123, 0) == 50000, "write 50000 bytes");
	shadow_write(b->loose, 123, 50000);
	fd = dup(f->plain_fd);
	CHECK_OK(reg_fd(&h, CU_FILE_HANDLE_TYPE_OPAQUE_FD, fd), "register a handle");
	p_cuFileHandleDeregister(h);
	close(fd);
	CHECK_OK(p_cuFileBufRegister(b->loose_mem, 8192, 0), "register a buffer");
	CHECK_OK(p_cuFileBufDeregister(b->loose_mem), "deregister it");
	CHECK_OK(p_cuFileBatchIOSetUp(&batch, 2), "set up a batch");
	entry(&io[0], f->direct, 0, b->loose, 0, 8192, 4096, 0);
	entry(&io[1], f->plain, 0, b->odd, 0, 3000, 777, 1);
	want[0] = (struct expect){ 0, 8192, b->loose, 4096, 0 };
	want[1] = (struct expect){ 0, 3000, b->odd, 777, 0 };
	CHECK_OK(p_cuFileBatchIOSubmit(batch, 2, io, 0), "submit 2 reads");
	collect("the counted batch", batch, 2, want, 2);
	p_cuFileBatchIODestroy(batch);

	CHECK_OK(p_cuFileGetStatsL2(&l2), "cuFileGetStatsL2");
	l1 = l2.basic;
	CHECK(l1.read_ops.ok == 3 && l1.read_ops.err == 1, "read calls: %llu ok, %llu failed",
	      (unsigned long long)l1.read_ops.ok, (unsigned long long)l1.read_ops.err);
	CHECK(l1.read_bytes == 201000, "read bytes: %llu of 201000",
	      (unsigned long long)l1.read_bytes);
	CHECK(l1.write_ops.ok == 1 && l1.write_bytes == 50000, "written: %llu calls, %llu bytes",
	      (unsigned long long)l1.write_ops.ok, (unsigned long long)l1.write_bytes);
	CHECK(l1.hdl_register_ops.ok == 1 && l1.hdl_deregister_ops.ok == 1 &&
		      l1.buf_register_ops.ok == 1 && l1.buf_deregister_ops.ok == 1,
	      "one handle and one buffer registered and deregistered");
	CHECK(l1.batch_setup_ops.ok == 1 && l1.batch_submit_ops.ok == 1 &&
		      l1.batch_enqueued_ops.ok == 2 && l1.batch_complete_ops.ok == 2 &&
		      l1.batch_destroy_ops.ok == 1,
	      "the batch: set up, submitted, 2 entries complete, destroyed");
	CHECK(l1.batch_read_bytes == 11192 && l1.last_batch_read_bytes == 11192,
	      "batch bytes: %llu", (unsigned long long)l1.batch_read_bytes);
	CHECK(l1.read_lat_avg_us * 4 <= l1.read_lat_sum_us + 4 && l1.read_ops_per_sec > 0,
	      "averages and rates from the sums");
	/* 100000 bytes = 97 KB: bucket 6 [64, 128); the readv's 100000 too;
	 * 1000 (asked 5000: 4 KB) bucket 2. */
	CHECK(l2.read_size_kb_hist[6] == 2 && l2.read_size_kb_hist[2] == 1 &&
		      l2.write_size_kb_hist[5] == 1,
	      "size histograms: reads [6]=%llu [2]=%llu, writes [5]=%llu",
	      (unsigned long long)l2.read_size_kb_hist[6], (unsigned long long)l2.read_size_kb_hist[2],
	      (unsigned long long)l2.write_size_kb_hist[5]);

	/* Stopped, nothing counts; started again, it does. */
	CHECK_OK(p_cuFileStatsStop(), "cuFileStatsStop");
	CHECK(p_cuFileRead(f->direct, b->loose, 4096, 0, 0) == 4096, "a read while stopped");
	CHECK_OK(p_cuFileStatsStart(), "cuFileStatsStart");
	CHECK(p_cuFileRead(f->direct, b->loose, 4096, 0, 0) == 4096, "a read once started");
	CHECK_OK(p_cuFileGetStatsL1(&l1), "cuFileGetStatsL1");
	CHECK(l1.read_ops.ok == 4 && l1.read_bytes == 205096,
	      "only the read after the start counted (%llu calls, %llu bytes)",
	      (unsigned long long)l1.read_ops.ok, (unsigned long long)l1.read_bytes);

	CHECK_OK(p_cuFileSetStatsLevel(3), "statistics level 3");
	CHECK_OK(p_cuFileGetStatsL3(&l3), "cuFileGetStatsL3");
	CHECK(l3.num_gpus == (uint32_t)gpus && l3.detailed.basic.read_bytes == 205096,
	      "level 3: %u GPUs, the same counters", l3.num_gpus);
	CHECK(file_matches_shadow(f->rw_path), "the file holds the counted write");
	snprintf(path, sizeof(path), "%s/cufile.log", dir);
	CHECK(!file_has(path, "ERROR"), "nothing logged an error");
}

/* --------------------------------------------------------------------- CUDA */

typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void (*CUhostFn)(void *);

static struct {
	CUresult (*init)(unsigned);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*primary_retain)(CUcontext *, CUdevice);
	CUresult (*set_current)(CUcontext);
	CUresult (*alloc)(CUdeviceptr *, size_t);
	CUresult (*free)(CUdeviceptr);
	CUresult (*htod)(CUdeviceptr, const void *, size_t);
	CUresult (*dtoh)(void *, CUdeviceptr, size_t);
	CUresult (*htod_async)(CUdeviceptr, const void *, size_t, CUstream);
	CUresult (*dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
	CUresult (*alloc_host)(void **, size_t);
	CUresult (*free_host)(void *);
	CUresult (*stream_create)(CUstream *, unsigned);
	CUresult (*stream_sync)(CUstream);
	CUresult (*stream_destroy)(CUstream);
	CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
	int (*stats)(void *);
} cu;

/* struct cuemu_stats of the emulator, where the driver is one. */
struct copy_stats {
	uint64_t sync_calls, sync_bytes, async_calls, async_bytes, pageable_calls, pageable_bytes;
};
struct emu_stats {
	uint64_t size;
	struct copy_stats htod, dtoh, dtod;
	uint64_t host_alloc, host_register, host_unregister, live_device_allocs, live_registered,
		dmabuf_exports, no_context;
	struct copy_stats peer;
	uint64_t peer_enables;
};
_Static_assert(sizeof(struct emu_stats) == 264, "struct cuemu_stats");

#define CU(call)                                                                           \
	do {                                                                               \
		CUresult r_ = (call);                                                      \
		if (r_ != 0) {                                                             \
			fprintf(stderr, "cufile_test: %s: CUresult %d\n", #call, r_);      \
			exit(2);                                                           \
		}                                                                          \
	} while (0)

static void load_cuda(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	void *s;

	if (!h) {
		fprintf(stderr, "cufile_test: dlopen %s: %s\n", path, dlerror());
		exit(2);
	}
#define CUSYM(field, name)                                                                 \
	do {                                                                               \
		s = dlsym(h, name);                                                        \
		if (!s) {                                                                  \
			fprintf(stderr, "cufile_test: %s has no %s\n", path, name);        \
			exit(2);                                                           \
		}                                                                          \
		memcpy(&cu.field, &s, sizeof(s));                                          \
	} while (0)
	CUSYM(init, "cuInit");
	CUSYM(device_get, "cuDeviceGet");
	CUSYM(primary_retain, "cuDevicePrimaryCtxRetain");
	CUSYM(set_current, "cuCtxSetCurrent");
	CUSYM(alloc, "cuMemAlloc_v2");
	CUSYM(free, "cuMemFree_v2");
	CUSYM(htod, "cuMemcpyHtoD_v2");
	CUSYM(dtoh, "cuMemcpyDtoH_v2");
	CUSYM(htod_async, "cuMemcpyHtoDAsync_v2");
	CUSYM(dtoh_async, "cuMemcpyDtoHAsync_v2");
	CUSYM(alloc_host, "cuMemAllocHost_v2");
	CUSYM(free_host, "cuMemFreeHost");
	CUSYM(stream_create, "cuStreamCreate");
	CUSYM(stream_sync, "cuStreamSynchronize");
	CUSYM(stream_destroy, "cuStreamDestroy_v2");
	CUSYM(launch_host_func, "cuLaunchHostFunc");
#undef CUSYM
	s = dlsym(h, "cuemuGetStats");
	memcpy(&cu.stats, &s, sizeof(s));
}

static int emu_stats(struct emu_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	return cu.stats && cu.stats(st) == 0 && st->size == sizeof(*st);
}

/* Whether `len` bytes of device memory at `d` are stream `seed` from `off`. */
static int device_holds(CUdeviceptr d, uint64_t seed, uint64_t off, size_t len)
{
	unsigned char *h = malloc(len ? len : 1);
	long at;

	if (!h)
		die("malloc");
	CU(cu.dtoh(h, d, len));
	at = differs(h, seed, off, len);
	if (at != -1)
		printf("     device memory differs at byte %ld\n", at);
	free(h);
	return at == -1;
}

static void device_read(const char *what, CUfileHandle_t fh, CUdeviceptr base, off_t boff,
			size_t len, off_t off)
{
	size_t want = off >= (off_t)FSIZE ? 0 : FSIZE - (size_t)off < len ? FSIZE - (size_t)off : len;
	ssize_t got = p_cuFileRead(fh, (void *)(uintptr_t)base, len, off, boff);

	CHECK(got == (ssize_t)want && device_holds(base + (CUdeviceptr)boff, DATA_SEED,
						   (uint64_t)off, want),
	      "device: %s: %zu at %lld into +%lld: %zd of %zu bytes", what, len, (long long)off,
	      (long long)boff, got, want);
}

struct device_worker {
	CUfileHandle_t fh;
	CUdeviceptr d;
	size_t slice;
	int index;
	ssize_t got;
};

/* A thread with no current CUDA context reads into device memory. */
static void *device_worker_main(void *arg)
{
	struct device_worker *w = arg;

	w->got = p_cuFileRead(w->fh, (void *)(uintptr_t)w->d, w->slice,
			      (off_t)w->index * (off_t)w->slice + 3, (off_t)w->index * (off_t)w->slice);
	return NULL;
}

struct params {
	size_t *size;
	off_t *off, *boff;
};

/* Runs on the stream before the read: sets the parameters the read must
 * use. */
static void set_params(void *arg)
{
	struct params *p = arg;

	*p->size = 250000;
	*p->off = 4097;
	*p->boff = 33;
}

static void test_cuda(struct files *f, const char *libcuda)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr d1, d2;
	CUstream s;
	unsigned char *h, *pinned;
	struct emu_stats before, after;
	int stats;

	load_cuda(libcuda);
	CU(cu.init(0));
	CU(cu.device_get(&dev, 0));
	CU(cu.primary_retain(&ctx, dev));
	CU(cu.set_current(ctx));
	CU(cu.alloc(&d1, 4 * MIB));
	CU(cu.alloc(&d2, MIB));
	stats = emu_stats(&before);

	CHECK_OK(p_cuFileBufRegister((void *)(uintptr_t)d1, 4 * MIB, 0),
		 "register 4 MiB of device memory");
	CHECK_ERR(p_cuFileBufRegister((void *)(uintptr_t)d1, 4 * MIB, 0),
		  CU_FILE_MEMORY_ALREADY_REGISTERED, "register it twice");
	CHECK_ERR(p_cuFileBufRegister((void *)(uintptr_t)(d1 + 4096), 4096, 0),
		  CU_FILE_MEMORY_ALREADY_REGISTERED, "register a part of it");

	device_read("registered, aligned", f->direct, d1, 0, MIB, 0);
	device_read("registered, 4 MiB", f->plain, d1, 0, 4 * MIB, 0);
	device_read("registered, unaligned", f->direct, d1, 4099, 12345, 777);
	device_read("registered, across the end", f->plain, d1, 5, 100000, FSIZE - 3333);
	device_read("registered, at the end", f->plain, d1, 0, 4096, FSIZE);
	device_read("unregistered", f->direct, d2, 11, 300000, 5);
	device_read("unregistered, interior pointer", f->plain, d2 + 100, 0, 65536, 8191);
	CHECK(p_cuFileRead(f->direct, (void *)(uintptr_t)d2, 100, 0, MIB - 10) ==
		      -CU_FILE_CUDA_POINTER_RANGE_ERROR,
	      "device: a read leaving its allocation: -CU_FILE_CUDA_POINTER_RANGE_ERROR");
	CHECK(p_cuFileRead(f->direct, (void *)(uintptr_t)d1, 100, 0, 4 * MIB - 10) ==
		      -CU_FILE_INVALID_VALUE,
	      "device: a read leaving the registered buffer: -CU_FILE_INVALID_VALUE");

	/* Writes from device memory. */
	h = malloc(MIB);
	if (!h)
		die("malloc");
	fill(h, 40, 0, 200000);
	CU(cu.htod(d2, h, 200000));
	CHECK(p_cuFileWrite(f->rw, (void *)(uintptr_t)d2, 200000, 999, 0) == 200000,
	      "device: write 200000 bytes from unregistered device memory");
	shadow_write(h, 999, 200000);
	fill(h, 41, 0, 70000);
	CU(cu.htod(d1 + 12345, h, 70000));
	CHECK(p_cuFileWrite(f->rw, (void *)(uintptr_t)d1, 70000, FSIZE + 50, 12345) == 70000,
	      "device: write 70000 bytes from registered device memory, past the end");
	shadow_write(h, FSIZE + 50, 70000);
	CHECK(file_matches_shadow(f->rw_path), "device: the writes are in the file");

	/* Threads with no current context. */
	{
		pthread_t t[4];
		struct device_worker w[4];
		int ok = 1;

		for (int i = 0; i < 4; i++) {
			w[i] = (struct device_worker){ f->plain, d1, MIB, i, 0 };
			if (pthread_create(&t[i], NULL, device_worker_main, &w[i]) != 0)
				die("pthread_create");
		}
		for (int i = 0; i < 4; i++) {
			pthread_join(t[i], NULL);
			ok &= w[i].got == (ssize_t)MIB &&
			      device_holds(d1 + (CUdeviceptr)i * MIB, DATA_SEED,
					   (uint64_t)i * MIB + 3, MIB);
		}
		CHECK(ok, "device: four threads without a CUDA context read 1 MiB each");
	}

	/* A batch into and out of device memory. */
	{
		CUfileBatchHandle_t batch;
		CUfileIOParams_t io[12];
		CUfileIOEvents_t ev[12];
		unsigned nr, got = 0, good = 0;

		CHECK_OK(p_cuFileBatchIOSetUp(&batch, 12), "device: a batch of 12");
		for (unsigned i = 0; i < 8; i++)
			entry(&io[i], i % 2 ? f->direct : f->plain, 0, (void *)(uintptr_t)d1,
			      (off_t)i * 300000 + 1, 200000 + i, (off_t)i * 500000 + i, i);
		fill(h, 42, 0, 4 * 100000);
		CU(cu.htod(d2, h, 4 * 100000));
		for (unsigned i = 8; i < 12; i++)
			entry(&io[i], f->rw, 1, (void *)(uintptr_t)d2, (off_t)(i - 8) * 100000,
			      100000, 3 * MIB + (off_t)(i - 8) * 100001, i);
		CHECK_OK(p_cuFileBatchIOSubmit(batch, 12, io, 0), "device: submit 8 reads, 4 writes");
		while (got < 12) {
			nr = 12;
			if (p_cuFileBatchIOGetStatus(batch, 12 - got, &nr, ev, NULL).err)
				break;
			for (unsigned k = 0; k < nr; k++) {
				unsigned i = (unsigned)((uintptr_t)ev[k].cookie - 0x1000);

				good += i < 12 && ev[k].status == CUFILE_COMPLETE &&
					ev[k].ret == io[i].u.batch.size;
			}
			got += nr;
		}
		CHECK(got == 12 && good == 12, "device: 12 events, %u complete with every byte", good);
		for (unsigned i = 0; i < 8; i++)
			CHECK(device_holds(d1 + (CUdeviceptr)io[i].u.batch.devPtr_offset, DATA_SEED,
					   (uint64_t)io[i].u.batch.file_offset, io[i].u.batch.size),
			      "device: batch read %u landed", i);
		for (unsigned i = 8; i < 12; i++)
			shadow_write(h + (i - 8) * 100000, (uint64_t)io[i].u.batch.file_offset,
				     100000);
		CHECK(file_matches_shadow(f->rw_path), "device: the batch writes are in the file");
		p_cuFileBatchIODestroy(batch);
	}

	/* Streams: the transfer runs in stream order, with the parameters as
	 * they are when the stream reaches it. */
	CU(cu.stream_create(&s, 0));
	CU(cu.alloc_host((void **)&pinned, MIB));
	CHECK_OK(p_cuFileStreamRegister(s, CU_FILE_STREAM_FIXED_BUF_OFFSET), "register a stream");
	{
		size_t size = 0;
		off_t off = -1, boff = -1;
		ssize_t bytes = 0;
		struct params p = { &size, &off, &boff };

		memset(pinned, 0xee, MIB);
		CU(cu.launch_host_func(s, set_params, &p));
		CHECK_OK(p_cuFileReadAsync(f->direct, (void *)(uintptr_t)d1, &size, &off, &boff,
					   &bytes, s),
			 "device: cuFileReadAsync on a stream");
		CU(cu.dtoh_async(pinned, d1 + 33, 250000, s));
		CU(cu.stream_sync(s));
		CHECK(bytes == 250000 && differs(pinned, DATA_SEED, 4097, 250000) == -1,
		      "device: the read used the parameters set on the stream before it, and "
		      "the copy after it saw its bytes (%zd)",
		      bytes);

		size = 150000;
		off = 2 * MIB + 1;
		boff = 0;
		bytes = 0;
		fill(pinned, 43, 0, size);
		CU(cu.htod_async(d2, pinned, size, s));
		CHECK_OK(p_cuFileWriteAsync(f->rw, (void *)(uintptr_t)d2, &size, &off, &boff,
					    &bytes, s),
			 "device: cuFileWriteAsync on a stream");
		CU(cu.stream_sync(s));
		CHECK(bytes == 150000, "device: the async write wrote %zd bytes", bytes);
		shadow_write(pinned, 2 * MIB + 1, 150000);
		CHECK(file_matches_shadow(f->rw_path),
		      "device: it wrote what the copy before it put in device memory");

		size = 5000;
		off = 100;
		boff = 1;
		bytes = 0;
		memset(h, 0xee, 6000);
		CHECK_OK(p_cuFileReadAsync(f->plain, h, &size, &off, &boff, &bytes, s),
			 "device: cuFileReadAsync into host memory on a stream");
		CU(cu.stream_sync(s));
		CHECK(bytes == 5000 && differs(h + 1, DATA_SEED, 100, 5000) == -1,
		      "device: host memory on a stream (%zd)", bytes);

		off = -1;
		bytes = 0;
		CHECK_OK(p_cuFileReadAsync(f->plain, (void *)(uintptr_t)d1, &size, &off, &boff,
					   &bytes, s),
			 "device: a read whose offset is negative when it runs");
		CU(cu.stream_sync(s));
		CHECK(bytes == -CU_FILE_INVALID_VALUE, "device: its result is %zd", bytes);
	}
	CHECK_OK(p_cuFileStreamDeregister(s), "deregister the stream");
	CU(cu.stream_destroy(s));

	/* Scatter into device memory, counted on GPU 0. */
	{
		CUfileIOVec_t iov[2] = { { (void *)(uintptr_t)d2, 5000 },
					 { (void *)(uintptr_t)(d2 + 8192), 70000 } };
		static CUfileStatsLevel3_t l3;
		ssize_t got;

		CHECK_OK(p_cuFileStatsReset(), "reset the statistics");
		got = p_cuFileReadv(f->direct, iov, 2, 999, 0);
		CHECK(got == 75000 && device_holds(d2, DATA_SEED, 999, 5000) &&
			      device_holds(d2 + 8192, DATA_SEED, 5999, 70000),
		      "device: cuFileReadv into two device ranges: %zd of 75000", got);
		CHECK_OK(p_cuFileGetStatsL3(&l3), "cuFileGetStatsL3");
		CHECK(l3.num_gpus == 1 && l3.per_gpu_stats[0].read_bytes == 75000 &&
			      l3.per_gpu_stats[0].n_total_reads == 1 &&
			      l3.per_gpu_stats[0].n_p2p_reads + l3.per_gpu_stats[0].n_posix_reads == 1 &&
			      l3.detailed.basic.read_bytes == 75000,
		      "device: GPU 0 counted the read (%llu bytes, %llu P2P, %llu through host memory)",
		      (unsigned long long)l3.per_gpu_stats[0].read_bytes,
		      (unsigned long long)l3.per_gpu_stats[0].n_p2p_reads,
		      (unsigned long long)l3.per_gpu_stats[0].n_posix_reads);
	}

	if (stats && emu_stats(&after)) {
		CHECK(after.htod.async_bytes + after.htod.sync_bytes >
			      before.htod.async_bytes + before.htod.sync_bytes + 8 * MIB,
		      "the emulated driver copied the reads into device memory (%llu bytes before, %llu after)",
		      (unsigned long long)(before.htod.async_bytes + before.htod.sync_bytes),
		      (unsigned long long)(after.htod.async_bytes + after.htod.sync_bytes));
		CHECK(after.no_context == before.no_context,
		      "no driver call lacked a current context (%llu refused)",
		      (unsigned long long)(after.no_context - before.no_context));
	}
	CHECK_OK(p_cuFileBufDeregister((void *)(uintptr_t)d1), "deregister the device buffer");
	CHECK_ERR(p_cuFileBufDeregister((void *)(uintptr_t)d1), CU_FILE_MEMORY_NOT_REGISTERED,
		  "deregister it twice");
	CU(cu.free_host(pinned));
	CU(cu.free(d1));
	CU(cu.free(d2));
	free(h);
}

/* With compatibility mode disallowed before the open, the engine runs P2P
 * only: the properties say so, its log says so, and a read into device
 * memory this machine cannot do by P2P fails instead of going through host
 * memory; host memory still takes direct I/O. */
static void test_no_compat(const char *dir, const char *data_path, const char *libcuda)
{
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr dptr;
	CUfileDrvProps_t props;
	CUfileDescr_t d;
	CUfileHandle_t fh;
	char path[4200];
	unsigned char *buf = malloc(MIB);
	int fd = open(data_path, O_RDONLY);
	ssize_t got;

	if (!buf || fd < 0)
		die("set up the no-compat test");
	snprintf(path, sizeof(path), "%s/cufile.log", dir);
	CHECK_OK(p_cuFileSetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, false),
		 "disallow compatibility mode");
	CHECK_OK(p_cuFileSetParameterString(CUFILE_PARAM_LOGGING_LEVEL, "INFO"), "log at INFO");
	CHECK_OK(p_cuFileSetParameterString(CUFILE_PARAM_ENV_LOGFILE_PATH, path), "the log file");
	CHECK_OK(p_cuFileDriverOpen(), "open");
	CHECK_OK(p_cuFileDriverGetProperties(&props), "properties");
	CHECK(!(props.nvfs.dcontrolflags & (1u << CU_FILE_ALLOW_COMPAT_MODE)),
	      "the properties do not allow compatibility mode (%#x)", props.nvfs.dcontrolflags);
	CHECK(file_has(path, "driver open: path p2p"), "the engine runs P2P only");
	memset(&d, 0, sizeof(d));
	d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
	d.handle.fd = fd;
	CHECK_OK(p_cuFileHandleRegister(&fh, &d), "register the file");
	load_cuda(libcuda);
	CU(cu.init(0));
	CU(cu.device_get(&dev, 0));
	CU(cu.primary_retain(&ctx, dev));
	CU(cu.set_current(ctx));
	CU(cu.alloc(&dptr, MIB));
	memset(buf, 0x5a, MIB);
	CU(cu.htod(dptr, buf, MIB));
	got = p_cuFileRead(fh, (void *)(uintptr_t)dptr, MIB, 0, 0);
	CU(cu.dtoh(buf, dptr, MIB));
	CHECK(got < 0 && buf[0] == 0x5a && buf[MIB - 1] == 0x5a,
	      "device: a read P2P cannot serve fails (%zd), nothing lands", got);
	got = p_cuFileRead(fh, buf, MIB, 0, 0);
	CHECK(got == (ssize_t)MIB && differs(buf, DATA_SEED, 0, MIB) == -1,
	      "host memory still reads by direct I/O (%zd)", got);
	CU(cu.free(dptr));
	p_cuFileHandleDeregister(fh);
	CHECK_OK(p_cuFileDriverClose(), "close");
	close(fd);
	free(buf);
}

/* -------------------------------------------------------------------- main */

static void make_file(const char *path, uint64_t seed, size_t len)
{
	unsigned char *buf = malloc(len);
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);

	if (!buf || fd < 0)
		die("create a test file");
	fill(buf, seed, 0, len);
	if (write(fd, buf, len) != (ssize_t)len || fsync(fd) != 0)
		die("write a test file");
	close(fd);
	free(buf);
}

int main(int argc, char **argv)
{
	struct files f;
	struct bufs b;
	const char *libcuda = NULL;

	if (argc == 4 && strcmp(argv[2], "--cuda") == 0)
		libcuda = argv[3];
	else if (argc == 4 && strcmp(argv[2], "--no-compat") == 0) {
		snprintf(f.data_path, sizeof(f.data_path), "%s/data", argv[1]);
		make_file(f.data_path, DATA_SEED, MIB);
		load();
		test_no_compat(argv[1], f.data_path, argv[3]);
		printf("cufile: %d passed, %d failed\n", passed, failed);
		return failed ? 1 : 0;
	} else if (argc != 2) {
		fprintf(stderr, "usage: cufile_test DIR [--cuda LIBCUDA | --no-compat LIBCUDA]\n");
		return 2;
	}
	memset(&f, 0, sizeof(f));
	snprintf(f.data_path, sizeof(f.data_path), "%s/data", argv[1]);
	snprintf(f.rw_path, sizeof(f.rw_path), "%s/rw", argv[1]);
	make_file(f.data_path, DATA_SEED, FSIZE);
	make_file(f.rw_path, RW_SEED, FSIZE);
	/* Zeroed: a write past the end leaves a hole that reads as zeros. */
	shadow = calloc(1, RW_MAX);
	if (!shadow)
		die("malloc");
	fill(shadow, RW_SEED, 0, FSIZE);
	shadow_len = FSIZE;

	load();
	test_header();
	test_params_staged(argv[1]);
	test_driver();
	test_params_open(argv[1]);
	test_platform(argv[1], libcuda ? 1 : 0);
	test_handles(argv[1], &f);
	test_buffers(&b);
	test_reads(&f, &b);
	test_read_errors(&f, &b);
	test_writes(&f, &b);
	test_threads(&f, &b);
	test_batch(&f, &b);
	test_vectored(&f, &b);
	/* Host memory only, the GPUs the library counts are the machine's:
	 * none, unless CUFILE_TEST_GPUS says how many the driver has. */
	const char *host_gpus = getenv("CUFILE_TEST_GPUS");
	test_stats(argv[1], &f, &b, libcuda ? 1 : host_gpus ? atoi(host_gpus) : 0);
	test_async_null_stream(&f, &b);
	if (libcuda)
		test_cuda(&f, libcuda);

	CHECK_OK(p_cuFileBufDeregister(b.aligned), "deregister the aligned buffer");
	CHECK_OK(p_cuFileBufDeregister(b.odd), "deregister the odd buffer");
	p_cuFileHandleDeregister(f.direct);
	p_cuFileHandleDeregister(f.plain);
	p_cuFileHandleDeregister(f.rw);
	CHECK(p_cuFileRead(f.plain, b.aligned, 10, 0, 0) == -CU_FILE_HANDLE_NOT_REGISTERED,
	      "handles are gone after deregistering");
	CHECK_OK(p_cuFileDriverOpen(), "open at the end");
	CHECK_OK(p_cuFileDriverClose(), "close at the end");
	CHECK(p_cuFileUseCount() == 0, "use count 0 at the end");
	close(f.direct_fd);
	close(f.plain_fd);
	close(f.rw_fd);
	free(b.aligned);
	free(b.odd_mem);
	free(b.loose_mem);
	free(shadow);

	printf("cufile: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
