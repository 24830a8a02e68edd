//! The queues path: a transfer with a namespace of a controller this
//! process drives, whose commands go into queues in accelerator memory
//! with no system call per I/O ([`Namespace`]).

use std::time::Instant;

use crate::{
    memory::DeviceMemory,
    queues::Namespace,
    transfer::{stats::PathStats, xfer::Direction},
    Result,
};

/// Moves `len` bytes between byte `file_offset` of `ns` and `mem` at
/// `mem_offset`, counting the commands and the time in `stats`.
pub fn run(
    ns: &Namespace,
    dir: Direction,
    file_offset: u64,
    mem: &dyn DeviceMemory,
    mem_offset: usize,
    len: usize,
    stats: &PathStats,
) -> Result<()> {
    ns.check(file_offset, mem, mem_offset, len)?;
    let start = Instant::now();
    let cmds = ns.transfer(
        dir == Direction::Write,
        file_offset,
        mem,
        mem_offset,
        len,
        None,
    )?;
    stats.record_ios(cmds);
    stats.record_storage(start.elapsed());
    stats.record_transfer(len as u64, start.elapsed());
    Ok(())
}
