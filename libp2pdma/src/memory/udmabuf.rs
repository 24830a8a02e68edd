//! Host memory as a dma-buf, through `/dev/udmabuf`: a source for
//! [`Module::dmabuf_import`](crate::Module::dmabuf_import) on machines
//! without a GPU driver that exports one.

use std::{
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use rustix::fs::{
    fcntl_add_seals, ftruncate, memfd_create, open, MemfdFlags, Mode, OFlags, SealFlags,
};

use crate::{sys, Error, Result};

/// Default path of the udmabuf device node.
pub const UDMABUF_NODE: &str = "/dev/udmabuf";

/// A dma-buf over a sealed memfd.
#[derive(Debug)]
pub struct Udmabuf {
    memfd: OwnedFd,
    dmabuf: OwnedFd,
    size: u64,
}

impl Udmabuf {
    /// Creates a `size`-byte dma-buf (a whole number of pages) through
    /// [`UDMABUF_NODE`].
    pub fn create(size: u64) -> Result<Self> {
        Self::create_with(UDMABUF_NODE, size)
    }

    /// Creates a `size`-byte dma-buf through the udmabuf node at `node`:
    /// `memfd_create`, seal against shrinking, size it, `UDMABUF_CREATE`.
    pub fn create_with(node: impl AsRef<Path>, size: u64) -> Result<Self> {
        let node = node.as_ref();
        let dev = open(node, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(|source| {
            Error::Open {
                path: PathBuf::from(node),
                source,
            }
        })?;
        let memfd = memfd_create(
            "p2pdma-udmabuf",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(Error::sys("memfd_create"))?;
        fcntl_add_seals(&memfd, SealFlags::SHRINK)
            .map_err(Error::sys("F_ADD_SEALS F_SEAL_SHRINK"))?;
        ftruncate(&memfd, size).map_err(Error::sys("ftruncate of the memfd"))?;
        let dmabuf =
            sys::udmabuf_create(&dev, &memfd, 0, size).map_err(Error::ioctl("UDMABUF_CREATE"))?;
        Ok(Self {
            memfd,
            dmabuf,
            size,
        })
    }

    /// The dma-buf's file descriptor.
    pub fn dmabuf(&self) -> BorrowedFd<'_> {
        self.dmabuf.as_fd()
    }

    /// The memfd behind it (not a dma-buf).
    pub fn memfd(&self) -> BorrowedFd<'_> {
        self.memfd.as_fd()
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_node_names_itself() {
        let e = Udmabuf::create_with("/nonexistent/udmabuf", 4096).unwrap_err();
        assert_eq!(e.errno(), Some(rustix::io::Errno::NOENT));
        assert!(e.to_string().contains("/nonexistent/udmabuf"), "{e}");
    }
}
