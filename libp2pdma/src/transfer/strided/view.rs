//! The strided face of an engine ([`Engine::strided`]): the calls of this
//! folder, on the engine's [`Core`].
//!
//! [`Engine::strided`]: crate::transfer::Engine::strided

use crate::transfer::core::Core;

/// An engine's strided transfers: reads and writes of the runs of a
/// [`Shape`](super::Shape) ([`run`](super::run)), copies between a host
/// buffer and memory in the same shapes ([`host`](super::host)), and the
/// cost model's constants ([`constants`](super::constants)).
///
/// The memory side of a transfer is a [`MemRange`](crate::memory::MemRange)
/// the runs are laid out in from its start: how many of its bytes they
/// cover is the [`Layout`](super::Layout)'s to say (the packed bytes or the
/// bounding range), and a range shorter than that is
/// [`Error::OutOfBounds`](crate::Error::OutOfBounds), before any I/O.
#[derive(Clone, Copy, Debug)]
pub struct Strided<'e> {
    pub(crate) core: &'e Core,
}

impl<'e> Strided<'e> {
    /// The strided transfers on `core`.
    pub(crate) fn new(core: &'e Core) -> Self {
        Self { core }
    }
}
