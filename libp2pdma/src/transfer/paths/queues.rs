//! The queues path: a transfer with a namespace of a controller this
//! process drives, whose commands go into queues in accelerator memory
//! with no system call per I/O ([`Namespace`](crate::queues::Namespace)),
//! or with a [`Volume`] striped over several.

use std::time::Instant;

use crate::{
    memory::MemRange,
    transfer::{stats::PathStats, xfer::Direction, Volume},
    Result,
};

/// Moves the bytes of `range` between byte `file_offset` of `ns` (a
/// namespace or a striped volume) and the memory, counting the commands
/// and the time in `stats`.
pub fn run(
    ns: &Volume,
    dir: Direction,
    file_offset: u64,
    range: MemRange<'_>,
    stats: &PathStats,
) -> Result<()> {
    ns.check(file_offset, range.len())?;
    let start = Instant::now();
    let cmds = ns.transfer(dir == Direction::Write, file_offset, range, None)?;
    stats.record_ios(cmds);
    stats.record_storage(start.elapsed());
    stats.record_transfer(range.len() as u64, start.elapsed());
    Ok(())
}
