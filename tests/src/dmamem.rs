//! Memory that the p2pdma module mapped for a device, as [`DmaMem`]: a
//! range of accelerator memory (an allocation's mapping and its `DMA_MAP`
//! segments), host memory pinned with `PIN_USER`, and a udmabuf imported
//! with `DMABUF_IMPORT`. The device is given only the addresses the module
//! returned; the CPU reaches the same bytes through the allocation's mmap,
//! the host buffer, or the memfd behind the udmabuf.

use p2pdma::{DeviceMapping, DmaMapping, HostBuffer, Udmabuf};
use rustix::io::{pread, pwrite};

use crate::nvme::{seg_run, DmaMem, PAGE};

/// A mapping's segments as `address+length`, space separated.
pub fn segments_text(m: &DmaMapping) -> String {
    let segs: Vec<String> = m
        .segs
        .iter()
        .map(|(a, l)| format!("{a:#x}+{l:#x}"))
        .collect();
    segs.join(" ")
}

/// Checks a mapping the module returned for `length` bytes: the segments
/// cover exactly that many bytes and start on page boundaries. Returns
/// them in words.
pub fn describe(m: &DmaMapping, length: u64) -> Result<String, String> {
    let text = format!(
        "map type {}, {} segment(s): {}",
        m.map_type,
        m.segs.len(),
        segments_text(m)
    );
    if m.length != length || m.total_len() != length {
        return Err(format!(
            "{length} bytes asked, {} mapped, segments total {}: {text}",
            m.length,
            m.total_len()
        ));
    }
    if let Some((a, _)) = m.segs.iter().find(|(a, _)| a % PAGE as u64 != 0) {
        return Err(format!("segment at {a:#x} is not page aligned: {text}"));
    }
    Ok(text)
}

fn in_range(len: usize, offset: usize, n: usize) -> Result<(), String> {
    match offset.checked_add(n) {
        Some(end) if end <= len => Ok(()),
        _ => Err(format!("{n} bytes at {offset} of {len}")),
    }
}

/// `DMA_MAP`ped accelerator memory: `dma.length` bytes from `base` of the
/// allocation; offsets here count from `base`.
pub struct AccelMem {
    /// The whole allocation, mapped.
    pub map: DeviceMapping,
    /// Where the DMA mapping starts in the allocation.
    pub base: usize,
    /// What `DMA_MAP` returned.
    pub dma: DmaMapping,
}

impl DmaMem for AccelMem {
    fn len(&self) -> usize {
        self.dma.length as usize
    }

    fn dma_run(&self, offset: usize) -> Option<(u64, usize)> {
        seg_run(&self.dma.segs, offset as u64).map(|(a, n)| (a, n as usize))
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        in_range(self.len(), offset, src.len())?;
        self.map
            .write_at(self.base + offset, src)
            .map_err(|e| e.to_string())
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        in_range(self.len(), offset, dst.len())?;
        self.map
            .read_at(self.base + offset, dst)
            .map_err(|e| e.to_string())
    }
}

/// Host memory pinned and mapped with `PIN_USER`.
pub struct PinnedHost {
    /// The buffer.
    pub buf: HostBuffer,
    /// What `PIN_USER` returned.
    pub dma: DmaMapping,
}

impl DmaMem for PinnedHost {
    fn len(&self) -> usize {
        self.buf.len()
    }

    fn dma_run(&self, offset: usize) -> Option<(u64, usize)> {
        seg_run(&self.dma.segs, offset as u64).map(|(a, n)| (a, n as usize))
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        self.buf
            .write_raw(offset, src)
            .map_err(|e| format!("{} bytes at {offset} of the host buffer: {e}", src.len()))
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        self.buf
            .read_raw(offset, dst)
            .map_err(|e| format!("{} bytes at {offset} of the host buffer: {e}", dst.len()))
    }
}

/// A udmabuf imported with `DMABUF_IMPORT`; the CPU goes through its memfd.
pub struct ImportedDmabuf {
    /// The dma-buf and its memfd.
    pub buf: Udmabuf,
    /// What `DMABUF_IMPORT` returned.
    pub dma: DmaMapping,
}

impl DmaMem for ImportedDmabuf {
    fn len(&self) -> usize {
        self.buf.size() as usize
    }

    fn dma_run(&self, offset: usize) -> Option<(u64, usize)> {
        seg_run(&self.dma.segs, offset as u64).map(|(a, n)| (a, n as usize))
    }

    fn write(&self, offset: usize, src: &[u8]) -> Result<(), String> {
        in_range(self.len(), offset, src.len())?;
        let mut done = 0;
        while done < src.len() {
            match pwrite(self.buf.memfd(), &src[done..], (offset + done) as u64) {
                Ok(0) => return Err(format!("memfd write at {}: 0 bytes", offset + done)),
                Ok(n) => done += n,
                Err(e) => return Err(format!("memfd write at {}: {e}", offset + done)),
            }
        }
        Ok(())
    }

    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), String> {
        in_range(self.len(), offset, dst.len())?;
        let mut done = 0;
        while done < dst.len() {
            match pread(self.buf.memfd(), &mut dst[done..], (offset + done) as u64) {
                Ok(0) => return Err(format!("memfd read at {}: 0 bytes", offset + done)),
                Ok(n) => done += n,
                Err(e) => return Err(format!("memfd read at {}: {e}", offset + done)),
            }
        }
        Ok(())
    }
}
