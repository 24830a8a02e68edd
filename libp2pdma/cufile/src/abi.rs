//! The cuFile ABI: the structures C passes in and gets back, with the
//! layouts of `include/cufile.h` (x86_64 and aarch64 Linux, LP64), and the
//! numbers of its enumerations.
//!
//! Every enumeration that arrives from C is an integer here, never a Rust
//! `enum`: a value C makes up must be an error, not undefined behaviour.
//! The layout tests at the bottom pin every size and offset to the header's.

use std::ffi::{c_int, c_uint, c_void};

use libc::{off_t, size_t};

/// `CUfileOpError` values (`CU_FILE_*`): 0 for success, 5001 and up for
/// cuFile's own errors.
pub mod op {
    /// Success.
    pub const SUCCESS: u32 = 0;
    /// The driver could not be initialized.
    pub const DRIVER_NOT_INITIALIZED: u32 = 5001;
    /// A driver property is invalid.
    pub const DRIVER_INVALID_PROPS: u32 = 5002;
    /// A driver property is out of range.
    pub const DRIVER_UNSUPPORTED_LIMIT: u32 = 5003;
    /// Driver version mismatch.
    pub const DRIVER_VERSION_MISMATCH: u32 = 5004;
    /// The driver's version could not be read.
    pub const DRIVER_VERSION_READ_ERROR: u32 = 5005;
    /// The driver is shutting down.
    pub const DRIVER_CLOSING: u32 = 5006;
    /// The platform is not supported.
    pub const PLATFORM_NOT_SUPPORTED: u32 = 5007;
    /// I/O is not supported on this file.
    pub const IO_NOT_SUPPORTED: u32 = 5008;
    /// The GPU is not supported.
    pub const DEVICE_NOT_SUPPORTED: u32 = 5009;
    /// The kernel driver failed.
    pub const NVFS_DRIVER_ERROR: u32 = 5010;
    /// A CUDA driver call failed; `cu_err` holds its `CUresult`.
    pub const CUDA_DRIVER_ERROR: u32 = 5011;
    /// An invalid device pointer.
    pub const CUDA_POINTER_INVALID: u32 = 5012;
    /// A pointer of a memory type that cannot be used.
    pub const CUDA_MEMORY_TYPE_INVALID: u32 = 5013;
    /// The range reaches past the pointer's allocation.
    pub const CUDA_POINTER_RANGE_ERROR: u32 = 5014;
    /// The pointer belongs to another context.
    pub const CUDA_CONTEXT_MISMATCH: u32 = 5015;
    /// Beyond the largest size that can be pinned.
    pub const INVALID_MAPPING_SIZE: u32 = 5016;
    /// Beyond the mapped size.
    pub const INVALID_MAPPING_RANGE: u32 = 5017;
    /// An unsupported file type.
    pub const INVALID_FILE_TYPE: u32 = 5018;
    /// Unsupported open flags on the file.
    pub const INVALID_FILE_OPEN_FLAG: u32 = 5019;
    /// The file is not open with `O_DIRECT`.
    pub const DIO_NOT_SET: u32 = 5020;
    /// An invalid argument.
    pub const INVALID_VALUE: u32 = 5022;
    /// The memory is already registered.
    pub const MEMORY_ALREADY_REGISTERED: u32 = 5023;
    /// The memory is not registered.
    pub const MEMORY_NOT_REGISTERED: u32 = 5024;
    /// Permission denied.
    pub const PERMISSION_DENIED: u32 = 5025;
    /// The driver is already open.
    pub const DRIVER_ALREADY_OPEN: u32 = 5026;
    /// The file handle is not registered.
    pub const HANDLE_NOT_REGISTERED: u32 = 5027;
    /// The file descriptor is already registered.
    pub const HANDLE_ALREADY_REGISTERED: u32 = 5028;
    /// No such GPU.
    pub const DEVICE_NOT_FOUND: u32 = 5029;
    /// An internal error.
    pub const INTERNAL_ERROR: u32 = 5030;
    /// No new file descriptor could be had.
    pub const GETNEWFD_FAILED: u32 = 5031;
    /// The kernel driver could not be set up.
    pub const NVFS_SETUP_ERROR: u32 = 5033;
    /// I/O disabled by configuration for this file.
    pub const IO_DISABLED: u32 = 5034;
    /// A batch could not be submitted.
    pub const BATCH_SUBMIT_FAILED: u32 = 5035;
    /// GPU memory could not be pinned.
    pub const GPU_MEMORY_PINNING_FAILED: u32 = 5036;
    /// The batch is full.
    pub const BATCH_FULL: u32 = 5037;
    /// Stream operations are not supported.
    pub const ASYNC_NOT_SUPPORTED: u32 = 5038;
    /// An internal error of a batch's setup.
    pub const INTERNAL_BATCH_SETUP_ERROR: u32 = 5039;
    /// The last value of the 13.x header (a sentinel, not an error).
    pub const IO_MAX_ERROR: u32 = 5050;
}

/// `CUFILEOP_BASE_ERR`: cuFile errors are above it.
pub const BASE_ERR: u32 = 5000;

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`: a Linux file descriptor.
pub const HANDLE_TYPE_OPAQUE_FD: u32 = 1;
/// `CU_FILE_HANDLE_TYPE_OPAQUE_WIN32`: a Windows handle (unsupported).
pub const HANDLE_TYPE_OPAQUE_WIN32: u32 = 2;
/// `CU_FILE_HANDLE_TYPE_USERSPACE_FS`: a user-space filesystem (unsupported).
pub const HANDLE_TYPE_USERSPACE_FS: u32 = 3;

/// `CU_FILE_RDMA_REGISTER`: a buffer registration flag (accepted, no effect).
pub const RDMA_REGISTER: c_int = 1;
/// `CU_FILE_RDMA_RELAXED_ORDERING`: a buffer registration flag (accepted,
/// no effect).
pub const RDMA_RELAXED_ORDERING: c_int = 1 << 1;

/// `CUFILE_READ`.
pub const OPCODE_READ: u32 = 0;
/// `CUFILE_WRITE`.
pub const OPCODE_WRITE: u32 = 1;

/// `CUFILE_BATCH`: the only batch mode.
pub const BATCH_MODE: u32 = 1;

/// `CUfileStatus_t` values of batch events.
pub mod status {
    /// Not submitted yet.
    pub const WAITING: u32 = 0x01;
    /// Submitted, not complete.
    pub const PENDING: u32 = 0x02;
    /// Ill-formed.
    pub const INVALID: u32 = 0x04;
    /// Canceled.
    pub const CANCELED: u32 = 0x08;
    /// Complete: `ret` holds the bytes moved.
    pub const COMPLETE: u32 = 0x10;
    /// Timed out.
    pub const TIMEOUT: u32 = 0x20;
    /// Failed: `ret` holds the negated error.
    pub const FAILED: u32 = 0x40;
}

/// `cuFileStreamRegister` flags (`CU_FILE_STREAM_*`), all hints.
pub mod stream_flags {
    /// The buffer offset does not change between submission and execution.
    pub const FIXED_BUF_OFFSET: u32 = 1;
    /// The file offset does not change.
    pub const FIXED_FILE_OFFSET: u32 = 2;
    /// The size does not change.
    pub const FIXED_FILE_SIZE: u32 = 4;
    /// Every input is page aligned.
    pub const PAGE_ALIGNED_INPUTS: u32 = 8;
    /// Every flag.
    pub const ALL: u32 =
        FIXED_BUF_OFFSET | FIXED_FILE_OFFSET | FIXED_FILE_SIZE | PAGE_ALIGNED_INPUTS;
}

/// Bit numbers of `CUfileDrvProps_t.nvfs.dstatusflags`, also the
/// filesystem and device types of the P2P flags
/// (`CUfileDriverStatusFlags_t`).
pub mod dstatus {
    /// `CU_FILE_NVME_SUPPORTED`.
    pub const NVME: u32 = 4;
    /// `CU_FILE_NVMEOF_SUPPORTED`.
    pub const NVMEOF: u32 = 5;
    /// `CU_FILE_NVME_P2P_SUPPORTED`, deprecated.
    pub const NVME_P2P: u32 = 11;
    /// `CU_FILE_MAX_TARGET_TYPES`: one past the last type.
    pub const MAX_TARGET_TYPES: u32 = 14;
}

/// Bit numbers of `CUfileP2PFlags_t` (the `CU_FILE_P2P_FLAG_*` masks are
/// `1 << n`).
pub mod p2p {
    /// `CUFILE_P2PDMA`: PCI P2PDMA.
    pub const P2PDMA: u32 = 0;
    /// `CUFILE_NVFS`: nvidia-fs.
    pub const NVFS: u32 = 1;
    /// `CUFILE_DMABUF`: dma-buf.
    pub const DMABUF: u32 = 2;
    /// `CUFILE_C2C`: chip to chip.
    pub const C2C: u32 = 3;
    /// `CUFILE_NVIDIA_PEERMEM`.
    pub const NVIDIA_PEERMEM: u32 = 4;
}

/// Bit numbers of `CUfileDrvProps_t.nvfs.dcontrolflags`.
pub mod dcontrol {
    /// `CU_FILE_USE_POLL_MODE`.
    pub const USE_POLL_MODE: u32 = 0;
    /// `CU_FILE_ALLOW_COMPAT_MODE`.
    pub const ALLOW_COMPAT_MODE: u32 = 1;
}

/// Bit numbers of `CUfileDrvProps_t.fflags`.
pub mod feature {
    /// `CU_FILE_BATCH_IO_SUPPORTED`.
    pub const BATCH_IO: u32 = 1;
    /// `CU_FILE_STREAMS_SUPPORTED`.
    pub const STREAMS: u32 = 2;
    /// `CU_FILE_P2P_SUPPORTED`: PCI P2PDMA.
    pub const P2P: u32 = 4;
}

/// `CUfileError_t`: returned by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CUfileError {
    /// A `CUfileOpError`.
    pub err: u32,
    /// The `CUresult` when `err` is [`op::CUDA_DRIVER_ERROR`], else 0.
    pub cu_err: c_int,
}

impl CUfileError {
    /// Success.
    pub const SUCCESS: Self = Self::of(op::SUCCESS);

    /// The error `err`, with no CUDA status.
    pub const fn of(err: u32) -> Self {
        Self { err, cu_err: 0 }
    }
}

/// The handle union of `CUfileDescr_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union DescrHandle {
    /// A file descriptor, for [`HANDLE_TYPE_OPAQUE_FD`].
    pub fd: c_int,
    /// Any other handle.
    pub handle: *mut c_void,
}

/// `CUfileDescr_t`: what `cuFileHandleRegister` registers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUfileDescr {
    /// A `CUfileFileHandleType`.
    pub type_: u32,
    /// The descriptor or handle.
    pub handle: DescrHandle,
    /// `const CUfileFSOps_t *`, for user-space filesystems (unused).
    pub fs_ops: *const c_void,
}

/// `CUfileDrvProps_t.nvfs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvfsProps {
    /// Interface major version.
    pub major_version: c_uint,
    /// Interface minor version.
    pub minor_version: c_uint,
    /// Poll-mode threshold, KB.
    pub poll_thresh_size: size_t,
    /// Largest direct I/O, KB.
    pub max_direct_io_size: size_t,
    /// Bit i: `CUfileDriverStatusFlags_t` value i.
    pub dstatusflags: c_uint,
    /// Bit i: `CUfileDriverControlFlags_t` value i.
    pub dcontrolflags: c_uint,
}

/// `CUfileDrvProps_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileDrvProps {
    /// The driver's part.
    pub nvfs: NvfsProps,
    /// Bit i: `CUfileFeatureFlags_t` value i.
    pub fflags: c_uint,
    /// Device cache, KB.
    pub max_device_cache_size: c_uint,
    /// Cache per buffer, KB.
    pub per_buffer_cache_size: c_uint,
    /// Pinned device memory, KB.
    pub max_device_pinned_mem_size: c_uint,
    /// Most entries of one batch.
    pub max_batch_io_size: c_uint,
    /// Batch timeout, ms.
    pub max_batch_io_timeout_msecs: c_uint,
}

/// `CUfileIOParams_t.u.batch`, the union's only member.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BatchParams {
    /// The buffer (`devPtr_base`).
    pub buf_base: *mut c_void,
    /// Offset in the file.
    pub file_offset: off_t,
    /// Offset in the buffer (`devPtr_offset`).
    pub buf_offset: off_t,
    /// Bytes.
    pub size: size_t,
}

/// `CUfileIOParams_t`: one entry of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOParams {
    /// A `CUfileBatchMode_t`; must be [`BATCH_MODE`].
    pub mode: u32,
    /// The transfer.
    pub u: BatchParams,
    /// The registered file handle.
    pub fh: *mut c_void,
    /// A `CUfileOpcode_t`.
    pub opcode: u32,
    /// Returned with the entry's event.
    pub cookie: *mut c_void,
}

/// `CUfileIOEvents_t`: one completed entry of a batch.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOEvents {
    /// The entry's cookie.
    pub cookie: *mut c_void,
    /// A `CUfileStatus_t`.
    pub status: u32,
    /// Bytes moved, or the negated error.
    pub ret: size_t,
}

/// `CUfileIOVec_t`: one buffer of `cuFileReadv`/`cuFileWritev`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUfileIOVec {
    /// Device or host memory.
    pub base: *mut c_void,
    /// Bytes.
    pub len: size_t,
}

/// `CUfileOpCounter_t`: successes and failures of one kind of call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileOpCounter {
    /// Calls that succeeded.
    pub ok: u64,
    /// Calls that failed.
    pub err: u64,
}

/// `CUfileStatsLevel1_t`: counters of calls and bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[expect(missing_docs, reason = "the fields are the header's, named as there")]
pub struct CUfileStatsLevel1 {
    pub read_ops: CUfileOpCounter,
    pub write_ops: CUfileOpCounter,
    pub hdl_register_ops: CUfileOpCounter,
    pub hdl_deregister_ops: CUfileOpCounter,
    pub buf_register_ops: CUfileOpCounter,
    pub buf_deregister_ops: CUfileOpCounter,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_bw_bytes_per_sec: u64,
    pub write_bw_bytes_per_sec: u64,
    pub read_lat_avg_us: u64,
    pub write_lat_avg_us: u64,
    pub read_ops_per_sec: u64,
    pub write_ops_per_sec: u64,
    pub read_lat_sum_us: u64,
    pub write_lat_sum_us: u64,
    pub batch_submit_ops: CUfileOpCounter,
    pub batch_complete_ops: CUfileOpCounter,
    pub batch_setup_ops: CUfileOpCounter,
    pub batch_cancel_ops: CUfileOpCounter,
    pub batch_destroy_ops: CUfileOpCounter,
    pub batch_enqueued_ops: CUfileOpCounter,
    pub batch_posix_enqueued_ops: CUfileOpCounter,
    pub batch_processed_ops: CUfileOpCounter,
    pub batch_posix_processed_ops: CUfileOpCounter,
    pub batch_nvfs_submit_ops: CUfileOpCounter,
    pub batch_p2p_submit_ops: CUfileOpCounter,
    pub batch_aio_submit_ops: CUfileOpCounter,
    pub batch_iouring_submit_ops: CUfileOpCounter,
    pub batch_mixed_io_submit_ops: CUfileOpCounter,
    pub batch_total_submit_ops: CUfileOpCounter,
    pub batch_read_bytes: u64,
    pub batch_write_bytes: u64,
    pub batch_read_bw_bytes: u64,
    pub batch_write_bw_bytes: u64,
    pub batch_submit_lat_avg_us: u64,
    pub batch_completion_lat_avg_us: u64,
    pub batch_submit_ops_per_sec: u64,
    pub batch_complete_ops_per_sec: u64,
    pub batch_submit_lat_sum_us: u64,
    pub batch_completion_lat_sum_us: u64,
    pub last_batch_read_bytes: u64,
    pub last_batch_write_bytes: u64,
}

/// Buckets of the size histograms of [`CUfileStatsLevel2`].
pub const HIST_BUCKETS: usize = 32;

/// `CUfileStatsLevel2_t`: level 1 and the transfer sizes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileStatsLevel2 {
    /// Level 1.
    pub basic: CUfileStatsLevel1,
    /// Reads by size: bucket i counts `[2^i, 2^(i+1))` KB.
    pub read_size_kb_hist: [u64; HIST_BUCKETS],
    /// Writes by size.
    pub write_size_kb_hist: [u64; HIST_BUCKETS],
}

/// `CUFILE_GPU_UUID_LEN`.
pub const GPU_UUID_LEN: usize = 16;
/// GPUs of [`CUfileStatsLevel3`].
pub const MAX_GPUS: usize = 16;

/// `CUfilePerGpuStats_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[expect(missing_docs, reason = "the fields are the header's, named as there")]
pub struct CUfilePerGpuStats {
    pub uuid: [u8; GPU_UUID_LEN],
    pub read_bytes: u64,
    pub read_bw_bytes_per_sec: u64,
    pub read_utilization: u64,
    pub read_duration_us: u64,
    pub n_total_reads: u64,
    pub n_p2p_reads: u64,
    pub n_nvfs_reads: u64,
    pub n_posix_reads: u64,
    pub n_unaligned_reads: u64,
    pub n_dr_reads: u64,
    pub n_sparse_regions: u64,
    pub n_inline_regions: u64,
    pub n_reads_err: u64,
    pub writes_bytes: u64,
    pub write_bw_bytes_per_sec: u64,
    pub write_utilization: u64,
    pub write_duration_us: u64,
    pub n_total_writes: u64,
    pub n_p2p_writes: u64,
    pub n_nvfs_writes: u64,
    pub n_posix_writes: u64,
    pub n_unaligned_writes: u64,
    pub n_dr_writes: u64,
    pub n_writes_err: u64,
    pub n_mmap: u64,
    pub n_mmap_ok: u64,
    pub n_mmap_err: u64,
    pub n_mmap_free: u64,
    pub reg_bytes: u64,
}

/// `CUfileStatsLevel3_t`: level 2 and each GPU's.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CUfileStatsLevel3 {
    /// Level 2.
    pub detailed: CUfileStatsLevel2,
    /// GPUs the CUDA driver sees (at most [`MAX_GPUS`] are reported).
    pub num_gpus: u32,
    /// By device ordinal.
    pub per_gpu_stats: [CUfilePerGpuStats; MAX_GPUS],
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    #[test]
    fn layouts_match_the_header() {
        assert_eq!(size_of::<CUfileError>(), 8);
        assert_eq!(offset_of!(CUfileError, cu_err), 4);

        assert_eq!(size_of::<CUfileDescr>(), 24);
        assert_eq!(offset_of!(CUfileDescr, handle), 8);
        assert_eq!(offset_of!(CUfileDescr, fs_ops), 16);

        assert_eq!(size_of::<CUfileDrvProps>(), 56);
        assert_eq!(offset_of!(CUfileDrvProps, nvfs), 0);
        assert_eq!(offset_of!(NvfsProps, poll_thresh_size), 8);
        assert_eq!(offset_of!(NvfsProps, max_direct_io_size), 16);
        assert_eq!(offset_of!(NvfsProps, dstatusflags), 24);
        assert_eq!(offset_of!(NvfsProps, dcontrolflags), 28);
        assert_eq!(offset_of!(CUfileDrvProps, fflags), 32);
        assert_eq!(offset_of!(CUfileDrvProps, max_device_cache_size), 36);
        assert_eq!(offset_of!(CUfileDrvProps, per_buffer_cache_size), 40);
        assert_eq!(offset_of!(CUfileDrvProps, max_device_pinned_mem_size), 44);
        assert_eq!(offset_of!(CUfileDrvProps, max_batch_io_size), 48);
        assert_eq!(offset_of!(CUfileDrvProps, max_batch_io_timeout_msecs), 52);

        assert_eq!(size_of::<CUfileIOParams>(), 64);
        assert_eq!(offset_of!(CUfileIOParams, u), 8);
        assert_eq!(size_of::<BatchParams>(), 32);
        assert_eq!(
            offset_of!(CUfileIOParams, u) + offset_of!(BatchParams, file_offset),
            16
        );
        assert_eq!(
            offset_of!(CUfileIOParams, u) + offset_of!(BatchParams, buf_offset),
            24
        );
        assert_eq!(
            offset_of!(CUfileIOParams, u) + offset_of!(BatchParams, size),
            32
        );
        assert_eq!(offset_of!(CUfileIOParams, fh), 40);
        assert_eq!(offset_of!(CUfileIOParams, opcode), 48);
        assert_eq!(offset_of!(CUfileIOParams, cookie), 56);

        assert_eq!(size_of::<CUfileIOEvents>(), 24);
        assert_eq!(offset_of!(CUfileIOEvents, status), 8);
        assert_eq!(offset_of!(CUfileIOEvents, ret), 16);

        for a in [
            align_of::<CUfileDescr>(),
            align_of::<CUfileDrvProps>(),
            align_of::<CUfileIOParams>(),
            align_of::<CUfileIOEvents>(),
        ] {
            assert_eq!(a, 8);
        }
        assert_eq!(align_of::<CUfileError>(), 4);

        // cuFile 1.14 to 1.20: scatter and gather, statistics.
        assert_eq!(size_of::<CUfileIOVec>(), 16);
        assert_eq!(offset_of!(CUfileIOVec, len), 8);
        assert_eq!(size_of::<CUfileOpCounter>(), 16);
        assert_eq!(size_of::<CUfileStatsLevel1>(), 512);
        assert_eq!(offset_of!(CUfileStatsLevel1, read_bytes), 96);
        assert_eq!(offset_of!(CUfileStatsLevel1, batch_submit_ops), 176);
        assert_eq!(offset_of!(CUfileStatsLevel1, batch_total_submit_ops), 400);
        assert_eq!(offset_of!(CUfileStatsLevel1, batch_read_bytes), 416);
        assert_eq!(offset_of!(CUfileStatsLevel1, last_batch_write_bytes), 504);
        assert_eq!(size_of::<CUfileStatsLevel2>(), 1024);
        assert_eq!(offset_of!(CUfileStatsLevel2, read_size_kb_hist), 512);
        assert_eq!(offset_of!(CUfileStatsLevel2, write_size_kb_hist), 768);
        assert_eq!(size_of::<CUfilePerGpuStats>(), 248);
        assert_eq!(offset_of!(CUfilePerGpuStats, read_bytes), 16);
        assert_eq!(offset_of!(CUfilePerGpuStats, writes_bytes), 120);
        assert_eq!(offset_of!(CUfilePerGpuStats, reg_bytes), 240);
        assert_eq!(size_of::<CUfileStatsLevel3>(), 5000);
        assert_eq!(offset_of!(CUfileStatsLevel3, num_gpus), 1024);
        assert_eq!(offset_of!(CUfileStatsLevel3, per_gpu_stats), 1032);
        assert_eq!(align_of::<CUfileStatsLevel3>(), 8);
    }

    #[test]
    fn error_numbers_are_the_documented_ones() {
        // Stable since CUDA 11.4 up to 5038; pinned here so that a typo in
        // this file or the header shows (the C program checks the header's).
        let table = [
            (op::SUCCESS, 0),
            (op::DRIVER_NOT_INITIALIZED, 5001),
            (op::PLATFORM_NOT_SUPPORTED, 5007),
            (op::IO_NOT_SUPPORTED, 5008),
            (op::CUDA_DRIVER_ERROR, 5011),
            (op::CUDA_POINTER_RANGE_ERROR, 5014),
            (op::INVALID_FILE_TYPE, 5018),
            (op::DIO_NOT_SET, 5020),
            (op::INVALID_VALUE, 5022),
            (op::MEMORY_ALREADY_REGISTERED, 5023),
            (op::MEMORY_NOT_REGISTERED, 5024),
            (op::PERMISSION_DENIED, 5025),
            (op::HANDLE_NOT_REGISTERED, 5027),
            (op::HANDLE_ALREADY_REGISTERED, 5028),
            (op::INTERNAL_ERROR, 5030),
            (op::GETNEWFD_FAILED, 5031),
            (op::NVFS_SETUP_ERROR, 5033),
            (op::BATCH_SUBMIT_FAILED, 5035),
            (op::BATCH_FULL, 5037),
            (op::ASYNC_NOT_SUPPORTED, 5038),
            (op::IO_MAX_ERROR, 5050),
        ];
        for (value, want) in table {
            assert_eq!(value, want);
            assert!(value == 0 || value > BASE_ERR);
        }
        assert_eq!(stream_flags::ALL, 15);
        assert_eq!(
            (status::COMPLETE, status::FAILED, status::CANCELED),
            (0x10, 0x40, 0x08)
        );
    }
}
