// SPDX-License-Identifier: GPL-2.0

//! How many of the module's DMA mappings cover each page, bounded.
//!
//! The kernel's DMA-API debugging (`kernel/dma/debug.c`) enters every
//! mapping a device may write (any direction but `DMA_TO_DEVICE`) in one
//! tree keyed by physical cacheline, for all devices together: the first
//! cacheline of each mapped segment, with a count of the mappings that
//! overlap it. It counts 7 overlaps at most (`ACTIVE_CACHELINE_MAX_OVERLAP`)
//! and warns at the next one. The same pages reach the module through many
//! doors: one memfd's pages are pinned by several files and processes and
//! imported through several udmabufs, and one allocation is mapped again
//! and again. So the module counts, for each page frame, the mappings it
//! made of it that a peer may write (one per peer: a multipath device's
//! paths count one each), over all files, processes and dma-bufs, and
//! refuses the next one past [`MAX`] with `ETOOMANYREFS`. The kernel's own
//! I/O on the same pages (`O_DIRECT`, `BLOCK_IO`) keeps the rest of the
//! DMA API's room.
//!
//! Pages the module maps itself (allocation memory, pinned user pages) are
//! counted before they are mapped. A dma-buf's pages are known only from
//! its exporter's table, once mapped: imports are counted right after, one
//! at a time, so at most one mapping more than [`MAX`] stands for a moment.
//! An exporter's table without pages (device memory without `struct page`,
//! or a table stripped for importers) is counted by buffer instead.

use kernel::{
    dma::DataDirection,
    prelude::*,
    rbtree::{
        RBTree,
        RBTreeNode, //
    },
};

use crate::{
    ffi::{
        dma::SgMap,
        mm::PfnRuns, //
    },
    uapi,
};

/// Most mappings made by the module that may cover one page at once.
pub(crate) const MAX: u32 = uapi::P2PDMA_MAX_PIN_OVERLAP;

/// A point where counted intervals start or end.
#[derive(Clone, Copy)]
struct Point {
    /// How many intervals start or end here.
    ends: u32,
    /// How many intervals cover the numbers from here to the next point.
    depth: u32,
}

/// Intervals of numbers (page frames, or dma-buf names), counted: how many
/// cover each number.
///
/// # Invariants
///
/// The depth at a number is the `depth` of the greatest point at or below
/// it (0 below the first point); every point has `ends > 0`. A number where
/// no interval starts or ends has the depth of the number before it, so a
/// point whose `ends` drops to 0 goes, and removing an interval never
/// allocates.
struct Cover {
    points: RBTree<u64, Point>,
}

impl Cover {
    fn new() -> Self {
        Self {
            points: RBTree::new(),
        }
    }

    /// The depth at `x`.
    fn depth_at(&self, x: u64) -> u32 {
        match self.points.cursor_lower_bound(&x) {
            Some(c) if *c.current().0 == x => c.current().1.depth,
            Some(c) => c.peek_prev().map_or(0, |(_, p)| p.depth),
            None => self.points.cursor_back().map_or(0, |c| c.current().1.depth),
        }
    }

    /// Counts one more interval starting or ending at `x`.
    fn mark(&mut self, x: u64) -> Result {
        if let Some(p) = self.points.get_mut(&x) {
            p.ends += 1;
            return Ok(());
        }
        let depth = self.depth_at(x);
        self.points
            .insert(RBTreeNode::new(x, Point { ends: 1, depth }, GFP_KERNEL)?);
        Ok(())
    }

    /// Counts one interval starting or ending at `x` less.
    fn unmark(&mut self, x: u64) {
        if let Some(p) = self.points.get_mut(&x) {
            p.ends -= 1;
            if p.ends == 0 {
                self.points.remove(&x);
            }
        }
    }

    /// Adds 1 (or takes 1 away) from the depth of the points in `[s, e)`;
    /// the greatest depth among them afterwards.
    fn step(&mut self, s: u64, e: u64, up: bool) -> u32 {
        let mut deepest = 0;
        let mut cursor = self.points.cursor_lower_bound_mut(&s);
        while let Some(mut c) = cursor {
            let (&at, p) = c.current_mut();
            if at >= e {
                break;
            }
            p.depth = if up {
                p.depth + 1
            } else {
                p.depth.saturating_sub(1)
            };
            deepest = deepest.max(p.depth);
            cursor = c.move_next();
        }
        deepest
    }

    /// Counts `[s, e)`; the greatest depth in it afterwards.
    fn add(&mut self, s: u64, e: u64) -> Result<u32> {
        self.mark(s)?;
        if let Err(err) = self.mark(e) {
            self.unmark(s);
            return Err(err);
        }
        Ok(self.step(s, e, true))
    }

    /// Takes back `[s, e)`, counted by [`Cover::add`].
    fn remove(&mut self, s: u64, e: u64) {
        self.step(s, e, false);
        self.unmark(s);
        self.unmark(e);
    }
}

/// The counts: page frames, and dma-bufs whose tables have no pages.
pub(crate) struct Counts {
    pages: Cover,
    bufs: Cover,
}

kernel::sync::global_lock! {
    // SAFETY: Initialized by the module initializer before the PCI driver or
    // the misc device are registered, so before any use.
    pub(crate) unsafe(uninit) static COUNTS: Mutex<Option<Counts>> = None;
}

/// What one mapping counted, given back on drop.
///
/// # Invariants
///
/// Each of `pages` and `buf` was added to [`COUNTS`] once, for this object.
pub(crate) struct Ticket {
    pages: PfnRuns,
    buf: Option<usize>,
}

impl Ticket {
    /// Counts a mapping of `pages` (and of the dma-buf `buf`, when given)
    /// for a peer that accesses them with `dir`; `ETOOMANYREFS` if a page
    /// (or the buffer) would then be covered by more than [`MAX`] of them.
    /// Mappings the peer only reads are not counted, as the DMA API does
    /// not count them.
    pub(crate) fn take(pages: PfnRuns, buf: Option<usize>, dir: DataDirection) -> Result<Self> {
        if matches!(dir, DataDirection::ToDevice) {
            return Ok(Self {
                pages: PfnRuns::new(),
                buf: None,
            });
        }
        let mut guard = COUNTS.lock();
        let counts = guard.get_or_insert_with(|| Counts {
            pages: Cover::new(),
            bufs: Cover::new(),
        });
        let mut added = 0;
        let mut r = Ok(());
        for (s, e) in pages.iter() {
            match counts.pages.add(s, e) {
                Ok(d) => {
                    added += 1;
                    if d > MAX {
                        r = Err(ETOOMANYREFS);
                        break;
                    }
                }
                Err(err) => {
                    r = Err(err);
                    break;
                }
            }
        }
        if r.is_ok() {
            if let Some(b) = buf {
                let b = b as u64;
                r = match counts.bufs.add(b, b + 1) {
                    Ok(d) if d > MAX => {
                        counts.bufs.remove(b, b + 1);
                        Err(ETOOMANYREFS)
                    }
                    Ok(_) => Ok(()),
                    Err(err) => Err(err),
                };
            }
        }
        if let Err(err) = r {
            for (s, e) in pages.iter().take(added) {
                counts.pages.remove(s, e);
            }
            return Err(err);
        }
        // INVARIANT: `pages` and `buf` were added above.
        Ok(Self { pages, buf })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut guard = COUNTS.lock();
        let Some(counts) = guard.as_mut() else {
            return;
        };
        for (s, e) in self.pages.iter() {
            counts.pages.remove(s, e);
        }
        if let Some(b) = self.buf {
            let b = b as u64;
            counts.bufs.remove(b, b + 1);
        }
    }
}

/// A mapping for one peer, counted. The mapping goes before its count
/// does: the DMA API never holds more than was counted.
pub(crate) struct Counted {
    // Fields drop in declaration order.
    map: SgMap,
    _ticket: Ticket,
}

impl Counted {
    /// `map`, counted by `ticket` (taken before it was made).
    pub(crate) fn new(map: SgMap, ticket: Ticket) -> Self {
        Self {
            map,
            _ticket: ticket,
        }
    }

    /// Makes a dma-buf import with `import` and counts it by the pages its
    /// exporter's table gives (by `buf`, a name of the buffer, where the
    /// table has none); torn down again with `ETOOMANYREFS` if that passes
    /// [`MAX`]. Imports are made and counted one at a time, so at most one
    /// uncounted import stands at any moment.
    pub(crate) fn import(
        buf: usize,
        dir: DataDirection,
        import: impl FnOnce() -> Result<SgMap>,
    ) -> Result<Self> {
        let _one = IMPORTS.lock();
        let map = import()?;
        let (pages, pageless) = map.imported_pages().ok_or(EINVAL)??;
        let ticket = Ticket::take(pages, pageless.then_some(buf), dir)?;
        Ok(Self::new(map, ticket))
    }

    /// The mapping.
    pub(crate) fn map(&self) -> &SgMap {
        &self.map
    }
}

kernel::sync::global_lock! {
    // SAFETY: Initialized by the module initializer before the PCI driver or
    // the misc device are registered, so before any use.
    pub(crate) unsafe(uninit) static IMPORTS: Mutex<()> = ();
}

/// Frees the counts' storage when the module goes (a static is never
/// dropped); by then every mapping, and so every ticket, is gone.
pub(crate) struct CountsCleanup;

impl Drop for CountsCleanup {
    fn drop(&mut self) {
        drop(COUNTS.lock().take());
    }
}
