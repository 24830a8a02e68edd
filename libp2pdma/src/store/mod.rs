//! Objects on NVMe: the store an accelerator program calls
//! (`initialize`, `get_object_map`, `pcreate`, `pread`, `pwrite`,
//! `pread_prefetch`, `consume_prefetch_pread`, `flush`), over the transfer
//! engine, so it runs on every path and in every memory.
//!
//! - [`layout`]: the blocks on the device and the superblock;
//! - [`map`]: the object map and its allocator;
//! - [`backing`]: what a store lives on ([`EngineBacking`]: a file, block
//!   device or namespace through the engine);
//! - [`objects`]: the [`Store`] itself.
//!
//! The map survives crashes by shadow paging: two superblock slots and two
//! map regions, a commit writing the next generation's map where the last
//! commit's superblock does not point, then its superblock, each followed by
//! a flush (`docs/store.md` states the invariant).

pub mod backing;
pub mod cache;
pub mod layout;
pub mod map;
pub mod objects;
#[cfg(test)]
mod tests;

pub use backing::{Backing, EngineBacking, Started, CLAIM_WAIT};
pub use cache::{CacheStats, PageCache, WritePolicy};
pub use map::ObjectInfo;
pub use objects::{Prefetch, Store};
