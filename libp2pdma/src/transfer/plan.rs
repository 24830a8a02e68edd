//! The path rule: which way data moves between storage and accelerator
//! memory, decided as a pure function of facts ([`decide`]). The engine
//! gathers the facts of a file and a memory and decides with it; the doctor
//! gathers them from the topology and reports the same decision.
//!
//! - [`path`]: the paths, the caller's preference and a choice;
//! - [`facts`]: what the rule decides on;
//! - [`p2p`]: the P2P part, the kernel's answers;
//! - [`cache`]: which bytes of a read the page cache serves;
//! - [`rule`]: the rule, [`decide`].

pub mod cache;
pub mod facts;
pub mod p2p;
pub mod path;
pub mod rule;
#[cfg(test)]
mod tests;

pub use cache::{ask_first, PageCache, Residency, Source};
pub use facts::{
    ArrayFacts, DrivenFacts, DrivenMember, Facts, MemoryFacts, NamespaceFacts, StorageFacts,
};
pub(crate) use p2p::{allowed, EVERY_MEMBER, EVERY_PATH};
pub use p2p::{p2p_refusal, query_paths, P2pRefusal};
pub use path::{P2pSubmit, PathChoice, PathPref, TransferPath};
pub(crate) use rule::by_module;
pub use rule::decide;
