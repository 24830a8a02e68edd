//! Resetting, enabling and shutting down a controller through its
//! registers (NVMe base specification, 3.5).

use std::{
    thread,
    time::{Duration, Instant},
};

use crate::{
    nvme::spec::{reg, Caps, PAGE},
    sys::vfio::Bar,
};

pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut done: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not done after {timeout:?}"));
        }
        thread::sleep(Duration::from_micros(200));
    }
}

/// Resets the controller behind `bar` (`CC.EN` = 0), points it at admin
/// queues of `entries` entries at bus addresses `asq` and `acq`, and enables
/// it with 4 KiB pages and the NVM command set; waits for `CSTS.RDY` within
/// the time `CAP.TO` allows. Returns what `CAP` says. A controller that does
/// not become ready is left disabled, not pointing at the caller's memory.
pub fn enable(bar: &Bar, entries: u16, asq: u64, acq: u64) -> Result<Caps, String> {
    let caps = Caps::decode(bar.read64(reg::CAP)?);
    if !caps.nvm || caps.mps_min > PAGE {
        return Err(format!(
            "CAP: NVM command set {}, smallest page {} bytes",
            caps.nvm, caps.mps_min
        ));
    }
    if entries < 2 || u32::from(entries) > caps.mqes.min(4096) {
        return Err(format!(
            "an admin queue of {entries} entries (the controller takes 2 to {})",
            caps.mqes.min(4096)
        ));
    }
    disable(bar, caps.timeout)?;
    let n = u32::from(entries) - 1;
    bar.write32(reg::AQA, n << 16 | n)?;
    bar.write64(reg::ASQ, asq)?;
    bar.write64(reg::ACQ, acq)?;
    // IOCQES 16 bytes, IOSQES 64 bytes, MPS 4 KiB, NVM, enable.
    bar.write32(reg::CC, 4 << 20 | 6 << 16 | 1)?;
    if let Err(e) = wait_ready(bar, true, caps.timeout) {
        let _ = disable(bar, caps.timeout);
        return Err(e);
    }
    Ok(caps)
}

fn wait_ready(bar: &Bar, ready: bool, timeout: Duration) -> Result<(), String> {
    let what = if ready {
        "CSTS.RDY = 1"
    } else {
        "CSTS.RDY = 0"
    };
    wait_until(what, timeout, || {
        let csts = bar.read32(reg::CSTS)?;
        if csts == u32::MAX || (ready && csts & 2 != 0) {
            return Err(format!("{what}: CSTS {csts:#x} (controller fatal status)"));
        }
        Ok((csts & 1 != 0) == ready)
    })
}

/// Clears `CC.EN` and waits up to `timeout` for the controller to stop,
/// which deletes every queue and ends all its DMA. A controller still
/// becoming ready (`CC.EN` = 1, `CSTS.RDY` = 0) is first given `timeout`
/// to get there: the specification leaves clearing `CC.EN` before then
/// undefined.
pub fn disable(bar: &Bar, timeout: Duration) -> Result<(), String> {
    let cc = bar.read32(reg::CC)?;
    if cc & 1 != 0 {
        let csts = bar.read32(reg::CSTS)?;
        if csts != u32::MAX && csts & 3 == 0 {
            // Whether it got there or not, it is disabled next.
            let _ = wait_ready(bar, true, timeout);
        }
        bar.write32(reg::CC, cc & !1)?;
    }
    wait_ready(bar, false, timeout)
}

/// Normal shutdown (`CC.SHN` = 01, then `CSTS.SHST` = 10 within
/// `shutdown_time`, the controller's RTD3 entry latency where it gives
/// one), then disable within `ready_timeout`.
pub fn shutdown(bar: &Bar, shutdown_time: Duration, ready_timeout: Duration) -> Result<(), String> {
    let cc = bar.read32(reg::CC)?;
    bar.write32(reg::CC, (cc & !(3 << 14)) | 1 << 14)?;
    let shut = wait_until("CSTS.SHST = complete", shutdown_time, || {
        Ok((bar.read32(reg::CSTS)? >> 2) & 3 == 2)
    });
    // Disabled even when the shutdown did not complete.
    let disabled = disable(bar, ready_timeout);
    shut.and(disabled)
}
