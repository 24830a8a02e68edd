/*
 * cufile.h: the cuFile API as libp2pdma's libcufile.so.0 implements it.
 *
 * Written for this project from NVIDIA's documented cuFile API (the cuFile
 * API Reference Guide and the libcufile-dev manual pages): the types have
 * the documented layouts (x86_64 and aarch64 Linux, LP64), the error and
 * flag numbers their documented values, and the functions the documented
 * prototypes, so that a program built against NVIDIA's header runs with
 * this library and the other way round. It needs no CUDA header.
 *
 * Return conventions:
 *  - most calls return a CUfileError_t by value: .err is CU_FILE_SUCCESS
 *    or a CUfileOpError, .cu_err the CUresult when .err is
 *    CU_FILE_CUDA_DRIVER_ERROR;
 *  - cuFileRead/cuFileWrite return the bytes moved, -1 with errno set for
 *    storage and system errors, or -CUfileOpError (IS_CUFILE_ERR);
 *  - a batch event's ret is the bytes moved, or for CUFILE_FAILED the
 *    negated error (-errno or -CUfileOpError) in a size_t;
 *  - a stream operation's byte count is the bytes moved, -1 for a storage
 *    error, or -CUfileOpError.
 *
 * Every call is thread-safe.
 */
#ifndef P2PDMA_CUFILE_H
#define P2PDMA_CUFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* CUDA's types, by their ABI: a stream is an opaque pointer, a CUresult an
 * int-sized enumeration. Include <cuda.h> before this header to use its
 * definitions instead. */
#ifndef __cuda_cuda_h__
typedef struct CUstream_st *CUstream;
typedef int CUresult;
#endif

/* ---------------------------------------------------------------- errors */

#define CUFILEOP_BASE_ERR 5000

typedef enum CUfileOpError {
  CU_FILE_SUCCESS = 0,
  CU_FILE_DRIVER_NOT_INITIALIZED = 5001,
  CU_FILE_DRIVER_INVALID_PROPS = 5002,
  CU_FILE_DRIVER_UNSUPPORTED_LIMIT = 5003,
  CU_FILE_DRIVER_VERSION_MISMATCH = 5004,
  CU_FILE_DRIVER_VERSION_READ_ERROR = 5005,
  CU_FILE_DRIVER_CLOSING = 5006,
  CU_FILE_PLATFORM_NOT_SUPPORTED = 5007,
  CU_FILE_IO_NOT_SUPPORTED = 5008,
  CU_FILE_DEVICE_NOT_SUPPORTED = 5009,
  CU_FILE_NVFS_DRIVER_ERROR = 5010,
  CU_FILE_CUDA_DRIVER_ERROR = 5011,
  CU_FILE_CUDA_POINTER_INVALID = 5012,
  CU_FILE_CUDA_MEMORY_TYPE_INVALID = 5013,
  CU_FILE_CUDA_POINTER_RANGE_ERROR = 5014,
  CU_FILE_CUDA_CONTEXT_MISMATCH = 5015,
  CU_FILE_INVALID_MAPPING_SIZE = 5016,
  CU_FILE_INVALID_MAPPING_RANGE = 5017,
  CU_FILE_INVALID_FILE_TYPE = 5018,
  CU_FILE_INVALID_FILE_OPEN_FLAG = 5019,
  CU_FILE_DIO_NOT_SET = 5020,
  CU_FILE_INVALID_VALUE = 5022,
  CU_FILE_MEMORY_ALREADY_REGISTERED = 5023,
  CU_FILE_MEMORY_NOT_REGISTERED = 5024,
  CU_FILE_PERMISSION_DENIED = 5025,
  CU_FILE_DRIVER_ALREADY_OPEN = 5026,
  CU_FILE_HANDLE_NOT_REGISTERED = 5027,
  CU_FILE_HANDLE_ALREADY_REGISTERED = 5028,
  CU_FILE_DEVICE_NOT_FOUND = 5029,
  CU_FILE_INTERNAL_ERROR = 5030,
  CU_FILE_GETNEWFD_FAILED = 5031,
  CU_FILE_NVFS_SETUP_ERROR = 5033,
  CU_FILE_IO_DISABLED = 5034,
  CU_FILE_BATCH_SUBMIT_FAILED = 5035,
  CU_FILE_GPU_MEMORY_PINNING_FAILED = 5036,
  CU_FILE_BATCH_FULL = 5037,
  CU_FILE_ASYNC_NOT_SUPPORTED = 5038,
  CU_FILE_INTERNAL_BATCH_SETUP_ERROR = 5039,
  CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR = 5040,
  CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR = 5041,
  CU_FILE_INTERNAL_BATCH_CANCEL_ERROR = 5042,
  CU_FILE_NOMEM_ERROR = 5043,
  CU_FILE_IO_ERROR = 5044,
  CU_FILE_INTERNAL_BUF_REGISTER_ERROR = 5045,
  CU_FILE_HASH_OPR_ERROR = 5046,
  CU_FILE_INVALID_CONTEXT_ERROR = 5047,
  CU_FILE_NVFS_INTERNAL_DRIVER_ERROR = 5048,
  CU_FILE_BATCH_NOCOMPAT_ERROR = 5049,
  /* A sentinel whose value differs between cuFile versions: do not rely
   * on it. */
  CU_FILE_IO_MAX_ERROR = 5050
} CUfileOpError;

typedef struct CUfileError {
  CUfileOpError err; /* CU_FILE_SUCCESS or the error */
  CUresult cu_err;   /* with CU_FILE_CUDA_DRIVER_ERROR: the CUDA status */
} CUfileError_t;

/* A few words on a CUfileOpError. Ours, not NVIDIA's wording. */
static inline const char *cufileop_status_error(CUfileOpError status)
{
  switch (status) {
  case CU_FILE_SUCCESS: return "success";
  case CU_FILE_DRIVER_NOT_INITIALIZED: return "the cuFile driver is not initialized";
  case CU_FILE_DRIVER_INVALID_PROPS: return "invalid driver property";
  case CU_FILE_DRIVER_UNSUPPORTED_LIMIT: return "driver property out of range";
  case CU_FILE_DRIVER_VERSION_MISMATCH: return "driver version mismatch";
  case CU_FILE_DRIVER_VERSION_READ_ERROR: return "cannot read the driver version";
  case CU_FILE_DRIVER_CLOSING: return "the driver is closing";
  case CU_FILE_PLATFORM_NOT_SUPPORTED: return "platform not supported";
  case CU_FILE_IO_NOT_SUPPORTED: return "I/O not supported on this file";
  case CU_FILE_DEVICE_NOT_SUPPORTED: return "GPU not supported";
  case CU_FILE_NVFS_DRIVER_ERROR: return "kernel driver error";
  case CU_FILE_CUDA_DRIVER_ERROR: return "CUDA driver error";
  case CU_FILE_CUDA_POINTER_INVALID: return "invalid device pointer";
  case CU_FILE_CUDA_MEMORY_TYPE_INVALID: return "memory type not supported";
  case CU_FILE_CUDA_POINTER_RANGE_ERROR: return "range leaves the pointer's allocation";
  case CU_FILE_CUDA_CONTEXT_MISMATCH: return "CUDA context mismatch";
  case CU_FILE_INVALID_MAPPING_SIZE: return "beyond the largest pinned size";
  case CU_FILE_INVALID_MAPPING_RANGE: return "beyond the mapped size";
  case CU_FILE_INVALID_FILE_TYPE: return "file type not supported";
  case CU_FILE_INVALID_FILE_OPEN_FLAG: return "file open flags not supported";
  case CU_FILE_DIO_NOT_SET: return "file not opened with O_DIRECT";
  case CU_FILE_INVALID_VALUE: return "invalid argument";
  case CU_FILE_MEMORY_ALREADY_REGISTERED: return "memory already registered";
  case CU_FILE_MEMORY_NOT_REGISTERED: return "memory not registered";
  case CU_FILE_PERMISSION_DENIED: return "permission denied";
  case CU_FILE_DRIVER_ALREADY_OPEN: return "driver already open";
  case CU_FILE_HANDLE_NOT_REGISTERED: return "file handle not registered";
  case CU_FILE_HANDLE_ALREADY_REGISTERED: return "file descriptor already registered";
  case CU_FILE_DEVICE_NOT_FOUND: return "GPU not found";
  case CU_FILE_INTERNAL_ERROR: return "internal error";
  case CU_FILE_GETNEWFD_FAILED: return "no new file descriptor";
  case CU_FILE_NVFS_SETUP_ERROR: return "kernel driver setup failed";
  case CU_FILE_IO_DISABLED: return "I/O disabled on this file by configuration";
  case CU_FILE_BATCH_SUBMIT_FAILED: return "batch submission failed";
  case CU_FILE_GPU_MEMORY_PINNING_FAILED: return "GPU memory pinning failed";
  case CU_FILE_BATCH_FULL: return "batch full";
  case CU_FILE_ASYNC_NOT_SUPPORTED: return "stream operations not supported";
  case CU_FILE_INTERNAL_BATCH_SETUP_ERROR: return "batch setup failed, try again";
  case CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR: return "batch submission failed, try again";
  case CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR: return "batch status failed, try again";
  case CU_FILE_INTERNAL_BATCH_CANCEL_ERROR: return "batch cancel failed, try again";
  case CU_FILE_NOMEM_ERROR: return "out of memory, try again";
  case CU_FILE_IO_ERROR: return "I/O error";
  case CU_FILE_INTERNAL_BUF_REGISTER_ERROR: return "buffer registration failed";
  case CU_FILE_HASH_OPR_ERROR: return "hash table error";
  case CU_FILE_INVALID_CONTEXT_ERROR: return "invalid context";
  case CU_FILE_NVFS_INTERNAL_DRIVER_ERROR: return "kernel driver internal error";
  case CU_FILE_BATCH_NOCOMPAT_ERROR: return "batch needs compatibility mode";
  case CU_FILE_IO_MAX_ERROR: break;
  }
  return "unknown cuFile error";
}

/* Whether a cuFileRead/cuFileWrite result is a cuFile error (rather than
 * -1 with errno, or a byte count). */
#define IS_CUFILE_ERR(err) (abs((err)) > CUFILEOP_BASE_ERR)
#define CUFILE_ERRSTR(err) cufileop_status_error((CUfileOpError)abs((err)))
#define IS_CUDA_ERR(status) ((status).err == CU_FILE_CUDA_DRIVER_ERROR)
#define CU_FILE_CUDA_ERR(status) ((status).cu_err)

/* ---------------------------------------------------------------- driver */

/* Bit numbers in CUfileDrvProps_t.nvfs.dstatusflags. */
typedef enum CUfileDriverStatusFlags {
  CU_FILE_LUSTRE_SUPPORTED = 0,
  CU_FILE_WEKAFS_SUPPORTED = 1,
  CU_FILE_NFS_SUPPORTED = 2,
  CU_FILE_GPFS_SUPPORTED = 3,
  CU_FILE_NVME_SUPPORTED = 4,
  CU_FILE_NVMEOF_SUPPORTED = 5,
  CU_FILE_SCSI_SUPPORTED = 6,
  CU_FILE_SCALEFLUX_CSD_SUPPORTED = 7,
  CU_FILE_NVMESH_SUPPORTED = 8,
  CU_FILE_BEEGFS_SUPPORTED = 9,
  CU_FILE_NVME_P2P_SUPPORTED = 11, /* deprecated */
  CU_FILE_SCATEFS_SUPPORTED = 12,
  CU_FILE_VIRTIOFS_SUPPORTED = 13,
  CU_FILE_MAX_TARGET_TYPES /* one past the last */
} CUfileDriverStatusFlags_t;

/* Bit numbers in CUfileDrvProps_t.nvfs.dcontrolflags. */
typedef enum CUfileDriverControlFlags {
  CU_FILE_USE_POLL_MODE = 0,
  CU_FILE_ALLOW_COMPAT_MODE = 1,
  CU_FILE_POSIX_IO_MODE = 2,
  CU_FILE_FALLBACK_IO_MODE = 4
} CUfileDriverControlFlags_t;

/* Bit numbers in CUfileDrvProps_t.fflags. */
typedef enum CUfileFeatureFlags {
  CU_FILE_DYN_ROUTING_SUPPORTED = 0,
  CU_FILE_BATCH_IO_SUPPORTED = 1,
  CU_FILE_STREAMS_SUPPORTED = 2,
  CU_FILE_PARALLEL_IO_SUPPORTED = 3,
  CU_FILE_P2P_SUPPORTED = 4 /* PCI P2PDMA */
} CUfileFeatureFlags_t;

/* Bit numbers of the P2P modes cuFileDriverGetP2PFlags reports per
 * filesystem or device type, and the masks cuFileDriverSetP2PFlags takes. */
typedef enum CUfileP2PFlags {
  CUFILE_P2PDMA = 0,        /* PCI P2PDMA */
  CUFILE_NVFS = 1,          /* nvidia-fs (never, in this library) */
  CUFILE_DMABUF = 2,        /* dma-buf */
  CUFILE_C2C = 3,           /* chip to chip (aarch64) */
  CUFILE_NVIDIA_PEERMEM = 4 /* IBM Spectrum Scale and WekaFS only */
} CUfileP2PFlags_t;

#define CU_FILE_P2P_FLAG_PCI_P2PDMA ((CUfileP2PFlags_t)(1 << CUFILE_P2PDMA))
#define CU_FILE_P2P_FLAG_NVFS ((CUfileP2PFlags_t)(1 << CUFILE_NVFS))
#define CU_FILE_P2P_FLAG_DMABUF ((CUfileP2PFlags_t)(1 << CUFILE_DMABUF))
#define CU_FILE_P2P_FLAG_C2C ((CUfileP2PFlags_t)(1 << CUFILE_C2C))

typedef struct CUfileDrvProps {
  struct {
    unsigned int major_version;
    unsigned int minor_version;
    size_t poll_thresh_size;   /* KB */
    size_t max_direct_io_size; /* KB */
    unsigned int dstatusflags;
    unsigned int dcontrolflags;
  } nvfs;
  unsigned int fflags;
  unsigned int max_device_cache_size;      /* KB */
  unsigned int per_buffer_cache_size;      /* KB */
  unsigned int max_device_pinned_mem_size; /* KB */
  unsigned int max_batch_io_size;
  unsigned int max_batch_io_timeout_msecs;
} CUfileDrvProps_t;

/* Opens the driver; counted, each open wants one close. Optional: the
 * first handle or buffer registration, read or write starts it too. */
CUfileError_t cuFileDriverOpen(void);
/* Ends one open. Programs built against this header call it by the name
 * cuFileDriverClose; the library also exports the legacy
 * cuFileDriverClose, which ends every open at once. */
CUfileError_t cuFileDriverClose_v2(void);
#define cuFileDriverClose cuFileDriverClose_v2
/* Opens not closed yet. */
long cuFileUseCount(void);
CUfileError_t cuFileDriverGetProperties(CUfileDrvProps_t *props);
CUfileError_t cuFileDriverSetPollMode(bool poll, size_t poll_threshold_size);
CUfileError_t cuFileDriverSetMaxDirectIOSize(size_t max_direct_io_size);
CUfileError_t cuFileDriverSetMaxCacheSize(size_t max_cache_size);
CUfileError_t cuFileDriverSetMaxPinnedMemSize(size_t max_pinned_size);
/* 1000 * major + 10 * minor of the cuFile API implemented. */
CUfileError_t cuFileGetVersion(int *version);

/* The P2P modes of a filesystem or device type: CU_FILE_P2P_FLAG_PCI_P2PDMA
 * for NVMe (CU_FILE_NVME_SUPPORTED, CU_FILE_NVMEOF_SUPPORTED) unless
 * cleared, nothing for the others. Setting takes
 * CU_FILE_P2P_FLAG_PCI_P2PDMA (x86_64) or CU_FILE_P2P_FLAG_C2C (aarch64)
 * or 0; other flags are CU_FILE_INVALID_VALUE. */
CUfileError_t cuFileDriverGetP2PFlags(CUfileDriverStatusFlags_t status_flag,
                                      CUfileP2PFlags_t *p2p_flags);
CUfileError_t cuFileDriverSetP2PFlags(CUfileDriverStatusFlags_t status_flag,
                                      CUfileP2PFlags_t p2p_flags);
/* The size of GPU gpuIndex's BAR1 aperture (the one P2P DMA reaches), KB. */
CUfileError_t cuFileGetBARSizeInKB(int gpuIndex, size_t *barSize);
/* Writes the PCIe topology the library sees, as JSON, to filename. */
CUfileError_t cuFileExportPCIeTopology(const char *filename);

/* ------------------------------------------------------------ parameters */

/* Set before the driver opens (CU_FILE_DRIVER_ALREADY_OPEN after: the
 * driver opens on cuFileDriverOpen or on first use), read at any time: the
 * staged value before the open, the value in force after. */
typedef enum CUFileSizeTConfigParameter_t {
  CUFILE_PARAM_PROFILE_STATS,                  /* the statistics level, 0-3 */
  CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH,   /* chunks in flight */
  CUFILE_PARAM_EXECUTION_MAX_IO_THREADS,       /* copy threads */
  CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB,
  CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM,
  CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB, /* the chunk, per I/O */
  CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB,
  CUFILE_PARAM_PROPERTIES_PER_BUFFER_CACHE_SIZE_KB,
  CUFILE_PARAM_PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB,
  CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE,        /* most entries per batch */
  CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB,
  CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS
} CUFileSizeTConfigParameter_t;

typedef enum CUFileBoolConfigParameter_t {
  CUFILE_PARAM_PROPERTIES_USE_POLL_MODE,
  CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, /* false: P2P or fail */
  CUFILE_PARAM_FORCE_COMPAT_MODE,            /* true: always through host memory */
  CUFILE_PARAM_FS_MISC_API_CHECK_AGGRESSIVE,
  CUFILE_PARAM_EXECUTION_PARALLEL_IO,
  CUFILE_PARAM_PROFILE_NVTX, /* deprecated */
  CUFILE_PARAM_PROPERTIES_ALLOW_SYSTEM_MEMORY,
  CUFILE_PARAM_USE_PCIP2PDMA,
  CUFILE_PARAM_PREFER_IO_URING,
  CUFILE_PARAM_FORCE_ODIRECT_MODE,
  CUFILE_PARAM_SKIP_TOPOLOGY_DETECTION,
  CUFILE_PARAM_STREAM_MEMOPS_BYPASS
} CUFileBoolConfigParameter_t;

typedef enum CUFileStringConfigParameter_t {
  CUFILE_PARAM_LOGGING_LEVEL, /* ERROR, WARN, NOTICE, INFO, DEBUG or TRACE */
  CUFILE_PARAM_ENV_LOGFILE_PATH,
  CUFILE_PARAM_LOG_DIR
} CUFileStringConfigParameter_t;

typedef enum CUFileArrayConfigParameter_t {
  CUFILE_PARAM_POSIX_POOL_SLAB_SIZE_KB,
  CUFILE_PARAM_POSIX_POOL_SLAB_COUNT,
  CUFILE_PARAM_GPU_BOUNCE_BUFFER_SLAB_SIZE_KB,
  CUFILE_PARAM_GPU_BOUNCE_BUFFER_SLAB_COUNT
} CUFileArrayConfigParameter_t;

CUfileError_t cuFileGetParameterSizeT(CUFileSizeTConfigParameter_t param,
                                      size_t *value);
CUfileError_t cuFileGetParameterBool(CUFileBoolConfigParameter_t param,
                                     bool *value);
/* Copies the value with its NUL into desc_str if len holds it, else
 * CU_FILE_INVALID_VALUE. */
CUfileError_t cuFileGetParameterString(CUFileStringConfigParameter_t param,
                                       char *desc_str, int len);
CUfileError_t cuFileGetParameterMinMaxValue(CUFileSizeTConfigParameter_t param,
                                            size_t *min_value,
                                            size_t *max_value);
CUfileError_t cuFileSetParameterSizeT(CUFileSizeTConfigParameter_t param,
                                      size_t value);
CUfileError_t cuFileSetParameterBool(CUFileBoolConfigParameter_t param,
                                     bool value);
CUfileError_t cuFileSetParameterString(CUFileStringConfigParameter_t param,
                                       const char *desc_str);
/* Slab arrays: len pairs of a size in KB (multiples of 4, ascending) and
 * a count; the getters want len equal to the number of slabs set. */
CUfileError_t cuFileSetParameterPosixPoolSlabArray(const size_t *size_values,
                                                   const size_t *count_values,
                                                   int len);
CUfileError_t cuFileGetParameterPosixPoolSlabArray(size_t *size_values,
                                                   size_t *count_values,
                                                   int len);
CUfileError_t cuFileSetParameterGpuBounceBufferSlabArray(
    const size_t *size_values, const size_t *count_values, int len);
CUfileError_t cuFileGetParameterGpuBounceBufferSlabArray(size_t *size_values,
                                                         size_t *count_values,
                                                         int len);

/* ------------------------------------------------------------ statistics */

/* 0 (off, the default), 1 (counters), 2 (and size histograms), 3 (and per
 * GPU). Counting runs from the level's setting, or cuFileStatsStart, to
 * cuFileStatsStop. */
CUfileError_t cuFileSetStatsLevel(int level);
CUfileError_t cuFileGetStatsLevel(int *level);
CUfileError_t cuFileStatsStart(void);
CUfileError_t cuFileStatsStop(void);
CUfileError_t cuFileStatsReset(void);

#define CUFILE_GPU_UUID_LEN 16

typedef struct CUfileOpCounter {
  uint64_t ok;
  uint64_t err;
} CUfileOpCounter_t;

typedef struct CUfileStatsLevel1 {
  CUfileOpCounter_t read_ops;
  CUfileOpCounter_t write_ops;
  CUfileOpCounter_t hdl_register_ops;
  CUfileOpCounter_t hdl_deregister_ops;
  CUfileOpCounter_t buf_register_ops;
  CUfileOpCounter_t buf_deregister_ops;
  uint64_t read_bytes;
  uint64_t write_bytes;
  uint64_t read_bw_bytes_per_sec;
  uint64_t write_bw_bytes_per_sec;
  uint64_t read_lat_avg_us;
  uint64_t write_lat_avg_us;
  uint64_t read_ops_per_sec;
  uint64_t write_ops_per_sec;
  uint64_t read_lat_sum_us;
  uint64_t write_lat_sum_us;
  CUfileOpCounter_t batch_submit_ops;
  CUfileOpCounter_t batch_complete_ops;
  CUfileOpCounter_t batch_setup_ops;
  CUfileOpCounter_t batch_cancel_ops;
  CUfileOpCounter_t batch_destroy_ops;
  CUfileOpCounter_t batch_enqueued_ops;
  CUfileOpCounter_t batch_posix_enqueued_ops;
  CUfileOpCounter_t batch_processed_ops;
  CUfileOpCounter_t batch_posix_processed_ops;
  CUfileOpCounter_t batch_nvfs_submit_ops;
  CUfileOpCounter_t batch_p2p_submit_ops;
  CUfileOpCounter_t batch_aio_submit_ops;
  CUfileOpCounter_t batch_iouring_submit_ops;
  CUfileOpCounter_t batch_mixed_io_submit_ops;
  CUfileOpCounter_t batch_total_submit_ops;
  uint64_t batch_read_bytes;
  uint64_t batch_write_bytes;
  uint64_t batch_read_bw_bytes;
  uint64_t batch_write_bw_bytes;
  uint64_t batch_submit_lat_avg_us;
  uint64_t batch_completion_lat_avg_us;
  uint64_t batch_submit_ops_per_sec;
  uint64_t batch_complete_ops_per_sec;
  uint64_t batch_submit_lat_sum_us;
  uint64_t batch_completion_lat_sum_us;
  uint64_t last_batch_read_bytes;
  uint64_t last_batch_write_bytes;
} CUfileStatsLevel1_t;

/* Bucket i of a histogram counts transfers of [2^i, 2^(i+1)) KB (bucket 0
 * also those under 1 KB, bucket 31 everything from 2^31 KB). */
typedef struct CUfileStatsLevel2 {
  CUfileStatsLevel1_t basic;
  uint64_t read_size_kb_hist[32];
  uint64_t write_size_kb_hist[32];
} CUfileStatsLevel2_t;

typedef struct CUfilePerGpuStats {
  char uuid[CUFILE_GPU_UUID_LEN];
  uint64_t read_bytes;
  uint64_t read_bw_bytes_per_sec;
  uint64_t read_utilization;
  uint64_t read_duration_us;
  uint64_t n_total_reads;
  uint64_t n_p2p_reads;
  uint64_t n_nvfs_reads;
  uint64_t n_posix_reads;
  uint64_t n_unaligned_reads;
  uint64_t n_dr_reads;
  uint64_t n_sparse_regions;
  uint64_t n_inline_regions;
  uint64_t n_reads_err;
  uint64_t writes_bytes;
  uint64_t write_bw_bytes_per_sec;
  uint64_t write_utilization;
  uint64_t write_duration_us;
  uint64_t n_total_writes;
  uint64_t n_p2p_writes;
  uint64_t n_nvfs_writes;
  uint64_t n_posix_writes;
  uint64_t n_unaligned_writes;
  uint64_t n_dr_writes;
  uint64_t n_writes_err;
  uint64_t n_mmap;
  uint64_t n_mmap_ok;
  uint64_t n_mmap_err;
  uint64_t n_mmap_free;
  uint64_t reg_bytes;
} CUfilePerGpuStats_t;

typedef struct CUfileStatsLevel3 {
  CUfileStatsLevel2_t detailed;
  uint32_t num_gpus;
  CUfilePerGpuStats_t per_gpu_stats[16];
} CUfileStatsLevel3_t;

/* CU_FILE_INVALID_VALUE for NULL or a level below the structure's. */
CUfileError_t cuFileGetStatsL1(CUfileStatsLevel1_t *stats);
CUfileError_t cuFileGetStatsL2(CUfileStatsLevel2_t *stats);
CUfileError_t cuFileGetStatsL3(CUfileStatsLevel3_t *stats);

/* ----------------------------------------------------------------- files */

typedef void *CUfileHandle_t;

enum CUfileFileHandleType {
  CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1,    /* a Linux file descriptor */
  CU_FILE_HANDLE_TYPE_OPAQUE_WIN32 = 2, /* not supported */
  CU_FILE_HANDLE_TYPE_USERSPACE_FS = 3  /* not supported */
};

struct sockaddr;
typedef struct sockaddr sockaddr_t;

typedef struct cufileRDMAInfo {
  int version;
  int desc_len;
  const char *desc_str;
} cufileRDMAInfo_t;

/* For user-space filesystems, which this library does not support. The
 * offsets are loff_t, spelled __loff_t (what glibc's <sys/types.h> defines
 * it as) so that strict C builds have it too. */
typedef struct CUfileFSOps {
  const char *(*fs_type)(const void *handle);
  int (*getRDMADeviceList)(const void *handle, sockaddr_t **hostaddrs);
  int (*getRDMADevicePriority)(const void *handle, char *, size_t, __loff_t,
                               const sockaddr_t *hostaddr);
  ssize_t (*read)(const void *handle, char *, size_t, __loff_t,
                  const cufileRDMAInfo_t *);
  ssize_t (*write)(const void *handle, const char *, size_t, __loff_t,
                   const cufileRDMAInfo_t *);
} CUfileFSOps_t;

typedef struct CUfileDescr_t {
  enum CUfileFileHandleType type;
  union {
    int fd;
    void *handle;
  } handle;
  const CUfileFSOps_t *fs_ops; /* NULL */
} CUfileDescr_t;

CUfileError_t cuFileHandleRegister(CUfileHandle_t *fh, CUfileDescr_t *descr);
void cuFileHandleDeregister(CUfileHandle_t fh);

/* --------------------------------------------------------------- buffers */

/* cuFileBufRegister flags (accepted, no effect). */
#define CU_FILE_RDMA_REGISTER 1
#define CU_FILE_RDMA_RELAXED_ORDERING (1 << 1)

CUfileError_t cuFileBufRegister(const void *bufPtr_base, size_t length,
                                int flags);
CUfileError_t cuFileBufDeregister(const void *bufPtr_base);

/* ------------------------------------------------------- synchronous I/O */

ssize_t cuFileRead(CUfileHandle_t fh, void *bufPtr_base, size_t size,
                   off_t file_offset, off_t bufPtr_offset);
ssize_t cuFileWrite(CUfileHandle_t fh, const void *bufPtr_base, size_t size,
                    off_t file_offset, off_t bufPtr_offset);

/* --------------------------------------------------------------- batches */

typedef void *CUfileBatchHandle_t;

typedef enum CUfileOpcode { CUFILE_READ = 0, CUFILE_WRITE = 1 } CUfileOpcode_t;

typedef enum CUFILEStatus_enum {
  CUFILE_WAITING = 0x01,
  CUFILE_PENDING = 0x02,
  CUFILE_INVALID = 0x04,
  CUFILE_CANCELED = 0x08,
  CUFILE_COMPLETE = 0x10,
  CUFILE_TIMEOUT = 0x20,
  CUFILE_FAILED = 0x40
} CUfileStatus_t;

typedef enum cufileBatchMode { CUFILE_BATCH = 1 } CUfileBatchMode_t;

typedef struct CUfileIOParams {
  CUfileBatchMode_t mode; /* first, always CUFILE_BATCH */
  union {
    struct {
      void *devPtr_base; /* the buffer, device or host memory */
      off_t file_offset;
      off_t devPtr_offset;
      size_t size;
    } batch;
  } u;
  CUfileHandle_t fh;
  CUfileOpcode_t opcode;
  void *cookie;
} CUfileIOParams_t;

typedef struct CUfileIOEvents {
  void *cookie;
  CUfileStatus_t status;
  size_t ret; /* bytes moved, or the negated error */
} CUfileIOEvents_t;

CUfileError_t cuFileBatchIOSetUp(CUfileBatchHandle_t *batch_idp, unsigned nr);
CUfileError_t cuFileBatchIOSubmit(CUfileBatchHandle_t batch_idp, unsigned nr,
                                  CUfileIOParams_t *iocbp, unsigned int flags);
CUfileError_t cuFileBatchIOGetStatus(CUfileBatchHandle_t batch_idp,
                                     unsigned min_nr, unsigned *nr,
                                     CUfileIOEvents_t *iocbp,
                                     struct timespec *timeout);
CUfileError_t cuFileBatchIOCancel(CUfileBatchHandle_t batch_idp);
void cuFileBatchIODestroy(CUfileBatchHandle_t batch_idp);

/* --------------------------------------------------------------- streams */

/* cuFileStreamRegister flags: promises that parameters do not change
 * (accepted; this library reads them when the stream runs in any case). */
#define CU_FILE_STREAM_FIXED_BUF_OFFSET 1
#define CU_FILE_STREAM_FIXED_FILE_OFFSET 2
#define CU_FILE_STREAM_FIXED_FILE_SIZE 4
#define CU_FILE_STREAM_PAGE_ALIGNED_INPUTS 8

CUfileError_t cuFileReadAsync(CUfileHandle_t fh, void *bufPtr_base,
                              size_t *size_p, off_t *file_offset_p,
                              off_t *bufPtr_offset_p, ssize_t *bytes_read_p,
                              CUstream stream);
CUfileError_t cuFileWriteAsync(CUfileHandle_t fh, void *bufPtr_base,
                               size_t *size_p, off_t *file_offset_p,
                               off_t *bufPtr_offset_p,
                               ssize_t *bytes_written_p, CUstream stream);
CUfileError_t cuFileStreamRegister(CUstream stream, unsigned flags);
CUfileError_t cuFileStreamDeregister(CUstream stream);

/* ----------------------------------------------------- scatter and gather */

typedef struct CUfileIOVec {
  void *base; /* device or host memory */
  size_t len;
} CUfileIOVec_t;

/* preadv/pwritev on a registered handle: the buffers in order, from
 * file_offset on; flags must be 0. Returns as cuFileRead/cuFileWrite. */
ssize_t cuFileReadv(CUfileHandle_t fh, const CUfileIOVec_t *iov, size_t iovcnt,
                    off_t file_offset, unsigned flags);
ssize_t cuFileWritev(CUfileHandle_t fh, const CUfileIOVec_t *iov,
                     size_t iovcnt, off_t file_offset, unsigned flags);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif /* P2PDMA_CUFILE_H */
