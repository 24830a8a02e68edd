//! Where the queues live in the controller's accelerator allocation, and
//! which interrupt vector each queue gets.

use crate::nvme::PAGE;

/// Admin queue entries.
pub(super) const ADMIN_ENTRIES: u16 = 16;

/// The MSI-X vector of each I/O queue to create, for `queues` queues
/// granted and `vectors` vectors enabled (vector 0 is the admin queue's):
/// a vector of its own for each, and fewer queues where there are fewer
/// vectors, since a poller that clears a shared vector's eventfd would take
/// another queue's wake-up; no vector for any where there is none to spare.
pub(super) fn vector_plan(queues: usize, vectors: usize) -> Vec<Option<usize>> {
    if vectors < 2 {
        return vec![None; queues];
    }
    (1..vectors).take(queues).map(Some).collect()
}

/// Where the queues live in the accelerator allocation.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout {
    pub(super) entries: u16,
    pub(super) queues: u16,
}

impl Layout {
    pub(super) fn admin_sq() -> usize {
        0
    }
    pub(super) fn admin_cq() -> usize {
        PAGE
    }
    pub(super) fn admin_lists() -> usize {
        2 * PAGE
    }
    pub(super) fn identify() -> usize {
        (2 + usize::from(ADMIN_ENTRIES) - 1) * PAGE
    }
    pub(super) fn queue_bytes(&self) -> usize {
        let e = usize::from(self.entries);
        round_page(64 * e) + round_page(16 * e) + (e - 1) * PAGE
    }
    /// The submission queue, completion queue and list pages of I/O queue
    /// `i` (0-based).
    pub(super) fn queue(&self, i: usize) -> (usize, usize, usize) {
        let e = usize::from(self.entries);
        let sq = Self::identify() + PAGE + i * self.queue_bytes();
        let cq = sq + round_page(64 * e);
        (sq, cq, cq + round_page(16 * e))
    }
    pub(super) fn total(&self) -> usize {
        Self::identify() + PAGE + usize::from(self.queues) * self.queue_bytes()
    }
}

pub(super) fn round_page(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}
