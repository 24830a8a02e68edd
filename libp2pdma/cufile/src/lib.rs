//! `libcufile.so.0` over libp2pdma: a drop-in replacement for NVIDIA's
//! cuFile library that programs written for GPUDirect Storage (KvikIO,
//! DALI, C and C++ of their own) load instead, and whose every call runs
//! on libp2pdma's transfer engine: P2P DMA where the kernel allows it, the
//! pipelined bounce path through host memory otherwise.
//!
//! The C API is `include/cufile.h`, written from NVIDIA's documented API;
//! `README.md` says how to use the library and what it implements. The
//! exports, by concept:
//!
//! - [`driver`]: open, close, properties, settings, version;
//! - [`handles`]: file descriptors registered as files of the engine;
//! - [`buffers`]: device and host memory, registered or not;
//! - [`io`]: synchronous reads and writes, plain and vectored;
//! - [`params`]: the configuration parameters, staged until the open;
//! - [`stats`]: the statistics calls and their counters;
//! - [`platform`]: P2P flags, a GPU's BAR size, the PCIe topology;
//! - [`batch`]: batches of transfers in the background;
//! - [`stream`]: transfers ordered on CUDA streams.
//!
//! [`abi`] has the structures and numbers, [`errors`] the ways a failure
//! reaches C. No export lets a panic unwind into C.
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![expect(
    non_snake_case,
    reason = "the exports' parameters carry cuFile's names"
)]

pub mod abi;
pub mod batch;
pub mod buffers;
pub mod driver;
pub mod errors;
pub mod handles;
pub mod io;
pub mod params;
pub mod platform;
pub mod stats;
pub mod stream;

pub use batch::{
    cuFileBatchIOCancel, cuFileBatchIODestroy, cuFileBatchIOGetStatus, cuFileBatchIOSetUp,
    cuFileBatchIOSubmit,
};
pub use buffers::{cuFileBufDeregister, cuFileBufRegister};
pub use driver::{
    cuFileDriverClose, cuFileDriverClose_v2, cuFileDriverGetProperties, cuFileDriverOpen,
    cuFileDriverSetMaxCacheSize, cuFileDriverSetMaxDirectIOSize, cuFileDriverSetMaxPinnedMemSize,
    cuFileDriverSetPollMode, cuFileGetVersion, cuFileUseCount,
};
pub use handles::{cuFileHandleDeregister, cuFileHandleRegister};
pub use io::{cuFileRead, cuFileReadv, cuFileWrite, cuFileWritev};
pub use params::{
    cuFileGetParameterBool, cuFileGetParameterGpuBounceBufferSlabArray,
    cuFileGetParameterMinMaxValue, cuFileGetParameterPosixPoolSlabArray, cuFileGetParameterSizeT,
    cuFileGetParameterString, cuFileSetParameterBool, cuFileSetParameterGpuBounceBufferSlabArray,
    cuFileSetParameterPosixPoolSlabArray, cuFileSetParameterSizeT, cuFileSetParameterString,
};
pub use platform::{
    cuFileDriverGetP2PFlags, cuFileDriverSetP2PFlags, cuFileExportPCIeTopology,
    cuFileGetBARSizeInKB,
};
pub use stats::{
    cuFileGetStatsL1, cuFileGetStatsL2, cuFileGetStatsL3, cuFileGetStatsLevel, cuFileSetStatsLevel,
    cuFileStatsReset, cuFileStatsStart, cuFileStatsStop,
};
pub use stream::{cuFileReadAsync, cuFileStreamDeregister, cuFileStreamRegister, cuFileWriteAsync};
