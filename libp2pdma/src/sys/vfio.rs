//! The little of VFIO it takes to drive a PCI function from user space:
//! moving it between drivers through sysfs, a container with the no-IOMMU
//! backend, its group and device, config space through the config region,
//! BAR0 mapped for MMIO, and a BAR exported as a dma-buf.
//!
//! Plain ioctls through rustix (see `docs/decisions.md`). The `unsafe` here
//! is the VFIO ioctls and the volatile accesses to the BAR mapping. The
//! functions are safe to call except the two that hand out a BAR mapping
//! ([`Device::map_bar`], [`Function::open_noiommu`]): register writes
//! program the device's DMA, which the caller must keep to memory it owns.
//! Errors are sentences naming the device.
#![allow(unsafe_code)]

use std::{
    ffi::{c_void, CStr, CString},
    fs,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
    ptr::{self, NonNull},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use rustix::{
    fs::{open, Mode, OFlags},
    io::{pread, pwrite},
    ioctl::{ioctl, opcode, Ioctl, IoctlOutput, Opcode, Setter, Updater},
    mm::{mmap, munmap, MapFlags, ProtFlags},
};

/// `VFIO_TYPE` of `<linux/vfio.h>`: every VFIO ioctl is `_IO(';', 100 + n)`.
const VFIO_TYPE: u8 = b';';
const VFIO_GET_API_VERSION: Opcode = opcode::none(VFIO_TYPE, 100);
const VFIO_CHECK_EXTENSION: Opcode = opcode::none(VFIO_TYPE, 101);
const VFIO_SET_IOMMU: Opcode = opcode::none(VFIO_TYPE, 102);
const VFIO_GROUP_GET_STATUS: Opcode = opcode::none(VFIO_TYPE, 103);
const VFIO_GROUP_SET_CONTAINER: Opcode = opcode::none(VFIO_TYPE, 104);
const VFIO_GROUP_GET_DEVICE_FD: Opcode = opcode::none(VFIO_TYPE, 106);
const VFIO_DEVICE_GET_REGION_INFO: Opcode = opcode::none(VFIO_TYPE, 108);
const VFIO_DEVICE_GET_IRQ_INFO: Opcode = opcode::none(VFIO_TYPE, 109);
const VFIO_DEVICE_SET_IRQS: Opcode = opcode::none(VFIO_TYPE, 110);
const VFIO_DEVICE_RESET: Opcode = opcode::none(VFIO_TYPE, 111);
const VFIO_DEVICE_FEATURE: Opcode = opcode::none(VFIO_TYPE, 117);

/// `VFIO_DEVICE_FEATURE_GET`: the feature's data is read out of the device.
const VFIO_DEVICE_FEATURE_GET: u32 = 1 << 16;
/// `VFIO_DEVICE_FEATURE_DMA_BUF`: export ranges of a BAR as a dma-buf.
const VFIO_DEVICE_FEATURE_DMA_BUF: u32 = 11;

/// `VFIO_API_VERSION`.
const VFIO_API_VERSION: i32 = 0;
/// `VFIO_NOIOMMU_IOMMU`: DMA addresses are bus addresses, nothing is
/// translated or isolated.
pub const VFIO_NOIOMMU_IOMMU: u32 = 8;
/// `VFIO_GROUP_FLAGS_VIABLE`: every device of the group is bound to a VFIO
/// driver (or to none).
pub const VFIO_GROUP_FLAGS_VIABLE: u32 = 1 << 0;
/// `VFIO_PCI_CONFIG_REGION_INDEX`.
pub const VFIO_PCI_CONFIG_REGION_INDEX: u32 = 7;
/// `VFIO_PCI_MSIX_IRQ_INDEX`.
pub const VFIO_PCI_MSIX_IRQ_INDEX: u32 = 2;
/// `VFIO_PCI_REQ_IRQ_INDEX`: vfio-pci asks for the device back (its
/// driver is being unbound, and the unbind waits for the device's release).
pub const VFIO_PCI_REQ_IRQ_INDEX: u32 = 4;
/// `VFIO_IRQ_SET_DATA_NONE`, `VFIO_IRQ_SET_DATA_EVENTFD` and
/// `VFIO_IRQ_SET_ACTION_TRIGGER`.
const VFIO_IRQ_SET_DATA_NONE: u32 = 1 << 0;
const VFIO_IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
const VFIO_IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;
/// `VFIO_REGION_INFO_FLAG_MMAP`.
const VFIO_REGION_INFO_FLAG_MMAP: u32 = 1 << 2;

/// `PCI_COMMAND` in config space, and its bits.
pub const PCI_COMMAND: u64 = 0x04;
/// `PCI_COMMAND_MEMORY`: the function answers memory cycles (its BARs).
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// `PCI_COMMAND_MASTER`: the function may master the bus (DMA).
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// `PCI_COMMAND_INTX_DISABLE`: no legacy interrupts.
pub const PCI_COMMAND_INTX_DISABLE: u16 = 1 << 10;

/// `struct vfio_group_status`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct VfioGroupStatus {
    argsz: u32,
    flags: u32,
}

/// `struct vfio_region_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RegionInfo {
    argsz: u32,
    /// `VFIO_REGION_INFO_FLAG_*`.
    pub flags: u32,
    /// The region's index (`VFIO_PCI_*_REGION_INDEX`).
    pub index: u32,
    cap_offset: u32,
    /// Size in bytes.
    pub size: u64,
    /// Offset of the region in the device file (for `pread`/`mmap`).
    pub offset: u64,
}

/// `struct vfio_irq_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IrqInfo {
    argsz: u32,
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    /// The interrupt index (`VFIO_PCI_*_IRQ_INDEX`).
    pub index: u32,
    /// Vectors of that index.
    pub count: u32,
}

/// `VFIO_DEVICE_SET_IRQS`: `struct vfio_irq_set` (`argsz`, `flags`,
/// `index`, `start`, `count`) and its data, encoded by [`irq_set`].
struct SetIrqs {
    arg: Vec<u8>,
}

// SAFETY: The pointer names `arg`, owned by `self` for the whole call, whose
// first field `argsz` is its exact length; the kernel only reads it.
unsafe impl Ioctl for SetIrqs {
    type Output = ();

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        VFIO_DEVICE_SET_IRQS
    }

    fn as_ptr(&mut self) -> *mut c_void {
        self.arg.as_mut_ptr().cast()
    }

    unsafe fn output_from_ptr(_out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<()> {
        Ok(())
    }
}

/// The argument of `VFIO_DEVICE_SET_IRQS` that triggers `fds` (one
/// descriptor per vector from 0) for `index`, or turns it off when empty.
fn irq_set(index: u32, fds: &[i32]) -> Vec<u8> {
    let data = if fds.is_empty() {
        VFIO_IRQ_SET_DATA_NONE
    } else {
        VFIO_IRQ_SET_DATA_EVENTFD
    };
    let len = 20 + 4 * fds.len();
    let mut v = Vec::with_capacity(len);
    for w in [
        len as u32,
        data | VFIO_IRQ_SET_ACTION_TRIGGER,
        index,
        0,
        fds.len() as u32,
    ] {
        v.extend_from_slice(&w.to_ne_bytes());
    }
    for fd in fds {
        v.extend_from_slice(&fd.to_ne_bytes());
    }
    v
}

/// A VFIO ioctl whose argument is an integer, not a pointer; its output is
/// the call's return value.
struct IntArg {
    opcode: Opcode,
    value: usize,
}

// SAFETY: Only used with `VFIO_GET_API_VERSION` and `VFIO_DEVICE_RESET`
// (no argument), `VFIO_CHECK_EXTENSION` and `VFIO_SET_IOMMU` (an IOMMU type
// number): the kernel treats the argument as a number and touches no memory
// of this process.
unsafe impl Ioctl for IntArg {
    type Output = IoctlOutput;

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        self.opcode
    }

    fn as_ptr(&mut self) -> *mut c_void {
        ptr::without_provenance_mut(self.value)
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _ptr: *mut c_void,
    ) -> rustix::io::Result<IoctlOutput> {
        Ok(out)
    }
}

/// `VFIO_DEVICE_FEATURE` with `VFIO_DEVICE_FEATURE_GET |
/// VFIO_DEVICE_FEATURE_DMA_BUF`: the encoded argument (see
/// [`dma_buf_feature`]) in, a new dma-buf descriptor out.
struct GetDmaBuf {
    arg: Vec<u8>,
}

// SAFETY: The pointer names `arg`, owned by `self` for the whole call, whose
// first field `argsz` is its exact length, so the kernel reads no further;
// it only reads it. A successful call returns a new descriptor that nothing
// else owns.
unsafe impl Ioctl for GetDmaBuf {
    type Output = OwnedFd;

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        VFIO_DEVICE_FEATURE
    }

    fn as_ptr(&mut self) -> *mut c_void {
        self.arg.as_mut_ptr().cast()
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<OwnedFd> {
        // SAFETY: A successful call returned a new descriptor, owned by no one.
        Ok(unsafe { OwnedFd::from_raw_fd(out) })
    }
}

/// The argument of `VFIO_DEVICE_FEATURE_DMA_BUF`: `struct
/// vfio_device_feature` (`argsz`, `flags`), then `struct
/// vfio_device_feature_dma_buf` (`region_index`, `open_flags`, `flags` = 0,
/// `nr_ranges`) and its `struct vfio_region_dma_range`s (`offset`,
/// `length`), native-endian as the kernel reads them.
fn dma_buf_feature(region_index: u32, open_flags: u32, ranges: &[(u64, u64)]) -> Vec<u8> {
    let len = 24 + 16 * ranges.len();
    let mut v = Vec::with_capacity(len);
    for w in [
        len as u32,
        VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_BUF,
        region_index,
        open_flags,
        0,
        ranges.len() as u32,
    ] {
        v.extend_from_slice(&w.to_ne_bytes());
    }
    for &(offset, length) in ranges {
        v.extend_from_slice(&offset.to_ne_bytes());
        v.extend_from_slice(&length.to_ne_bytes());
    }
    v
}

/// `VFIO_GROUP_GET_DEVICE_FD`: a NUL-terminated device name in, a new
/// descriptor out.
struct GetDeviceFd<'a> {
    name: &'a CStr,
}

// SAFETY: The kernel only reads the NUL-terminated string the pointer
// names, which lives as long as `self`; a successful call returns a new
// descriptor that nothing else owns.
unsafe impl Ioctl for GetDeviceFd<'_> {
    type Output = OwnedFd;

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        VFIO_GROUP_GET_DEVICE_FD
    }

    fn as_ptr(&mut self) -> *mut c_void {
        self.name.as_ptr().cast_mut().cast()
    }

    unsafe fn output_from_ptr(out: IoctlOutput, _ptr: *mut c_void) -> rustix::io::Result<OwnedFd> {
        // SAFETY: A successful call returned a new descriptor, owned by no one.
        Ok(unsafe { OwnedFd::from_raw_fd(out) })
    }
}

/// A VFIO container (`/dev/vfio/vfio`).
#[derive(Debug)]
pub struct Container {
    fd: OwnedFd,
}

impl Container {
    /// Opens `/dev/vfio/vfio` and checks the API version.
    pub fn open() -> Result<Self, String> {
        let path = "/dev/vfio/vfio";
        let fd = open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("{path}: {e}"))?;
        let c = Self { fd };
        let v = c.int_ioctl(VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")?;
        if v != VFIO_API_VERSION {
            return Err(format!(
                "VFIO API version {v}, this program knows {VFIO_API_VERSION}"
            ));
        }
        Ok(c)
    }

    fn int_ioctl(&self, opcode: Opcode, value: usize, what: &str) -> Result<i32, String> {
        // SAFETY: See the `Ioctl` implementation of `IntArg`: the opcodes
        // passed here take a number.
        unsafe { ioctl(&self.fd, IntArg { opcode, value }) }.map_err(|e| format!("{what}: {e}"))
    }

    /// Whether the container supports the IOMMU backend `iommu_type`.
    #[doc(alias = "VFIO_CHECK_EXTENSION")]
    pub fn check_extension(&self, iommu_type: u32) -> Result<bool, String> {
        Ok(self.int_ioctl(
            VFIO_CHECK_EXTENSION,
            iommu_type as usize,
            "VFIO_CHECK_EXTENSION",
        )? > 0)
    }

    /// Selects the IOMMU backend (after a group was added).
    #[doc(alias = "VFIO_SET_IOMMU")]
    pub fn set_iommu(&self, iommu_type: u32) -> Result<(), String> {
        self.int_ioctl(VFIO_SET_IOMMU, iommu_type as usize, "VFIO_SET_IOMMU")
            .map(|_| ())
    }
}

/// A VFIO group (`/dev/vfio/N`, or `/dev/vfio/noiommu-N`).
#[derive(Debug)]
pub struct Group {
    fd: OwnedFd,
    path: PathBuf,
}

impl Group {
    /// Opens the group node at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, String> {
        let path = path.as_ref().to_path_buf();
        let fd = open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self { fd, path })
    }

    /// The group's `VFIO_GROUP_FLAGS_*`.
    #[doc(alias = "VFIO_GROUP_GET_STATUS")]
    pub fn status(&self) -> Result<u32, String> {
        let mut s = VfioGroupStatus {
            argsz: size_of::<VfioGroupStatus>() as u32,
            flags: 0,
        };
        // SAFETY: The ioctl reads and rewrites exactly a
        // `struct vfio_group_status`, plain integers.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<VFIO_GROUP_GET_STATUS, VfioGroupStatus>::new(&mut s),
            )
        }
        .map_err(|e| format!("VFIO_GROUP_GET_STATUS on {}: {e}", self.path.display()))?;
        Ok(s.flags)
    }

    /// Adds the group to `container`.
    #[doc(alias = "VFIO_GROUP_SET_CONTAINER")]
    pub fn set_container(&self, container: &Container) -> Result<(), String> {
        // SAFETY: The ioctl reads one `int` (the container's descriptor)
        // from the pointer, which points at the setter's copy of it.
        unsafe {
            ioctl(
                &self.fd,
                Setter::<VFIO_GROUP_SET_CONTAINER, i32>::new(container.fd.as_raw_fd()),
            )
        }
        .map_err(|e| format!("VFIO_GROUP_SET_CONTAINER on {}: {e}", self.path.display()))
    }

    /// Opens the device `name` (a PCI address) of the group. vfio-pci
    /// resets the function on the first open.
    #[doc(alias = "VFIO_GROUP_GET_DEVICE_FD")]
    pub fn device(&self, name: &str) -> Result<Device, String> {
        let cname = CString::new(name).map_err(|e| format!("device name {name:?}: {e}"))?;
        // SAFETY: See the `Ioctl` implementation of `GetDeviceFd`.
        let fd = unsafe { ioctl(&self.fd, GetDeviceFd { name: &cname }) }
            .map_err(|e| format!("VFIO_GROUP_GET_DEVICE_FD {name}: {e}"))?;
        Ok(Device {
            fd,
            name: name.to_string(),
        })
    }
}

/// A device opened through its VFIO group.
#[derive(Debug)]
pub struct Device {
    fd: OwnedFd,
    name: String,
}

impl Device {
    /// Renumbers the device's descriptor above `other`'s.
    ///
    /// A process that dies closes its descriptors in ascending order, and
    /// the kernel runs the releases of the files whose last reference that
    /// dropped in the reverse order (task work is a stack). A device
    /// numbered above the p2pdma module's descriptor is therefore released
    /// first: vfio-pci turns its bus mastering off and resets it before the
    /// module frees the memory its commands may still write.
    pub fn keep_above(&mut self, other: BorrowedFd<'_>) -> Result<(), String> {
        let min = other.as_raw_fd() + 1;
        if self.fd.as_raw_fd() >= min {
            return Ok(());
        }
        let fd = rustix::io::fcntl_dupfd_cloexec(&self.fd, min)
            .map_err(|e| format!("F_DUPFD_CLOEXEC of the VFIO device above {min}: {e}"))?;
        self.fd = fd;
        Ok(())
    }

    /// Describes region `index`.
    #[doc(alias = "VFIO_DEVICE_GET_REGION_INFO")]
    pub fn region(&self, index: u32) -> Result<RegionInfo, String> {
        let mut info = RegionInfo {
            argsz: size_of::<RegionInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: The ioctl reads and rewrites exactly a
        // `struct vfio_region_info` (the size `argsz` says), plain integers.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<VFIO_DEVICE_GET_REGION_INFO, RegionInfo>::new(&mut info),
            )
        }
        .map_err(|e| format!("VFIO_DEVICE_GET_REGION_INFO {index} of {}: {e}", self.name))?;
        Ok(info)
    }

    /// Describes interrupt index `index`.
    #[doc(alias = "VFIO_DEVICE_GET_IRQ_INFO")]
    pub fn irq(&self, index: u32) -> Result<IrqInfo, String> {
        let mut info = IrqInfo {
            argsz: size_of::<IrqInfo>() as u32,
            index,
            ..Default::default()
        };
        // SAFETY: The ioctl reads and rewrites exactly a
        // `struct vfio_irq_info` (the size `argsz` says), plain integers.
        unsafe {
            ioctl(
                &self.fd,
                Updater::<VFIO_DEVICE_GET_IRQ_INFO, IrqInfo>::new(&mut info),
            )
        }
        .map_err(|e| format!("VFIO_DEVICE_GET_IRQ_INFO {index} of {}: {e}", self.name))?;
        Ok(info)
    }

    /// Has vfio-pci signal `eventfd` when it asks for the device back (an
    /// unbind of vfio-pci waits until every descriptor and mapping of the
    /// device is closed, signalling it every few seconds meanwhile).
    #[doc(alias = "VFIO_DEVICE_SET_IRQS")]
    pub fn set_request(&self, eventfd: BorrowedFd<'_>) -> Result<(), String> {
        let arg = irq_set(VFIO_PCI_REQ_IRQ_INDEX, &[eventfd.as_raw_fd()]);
        // SAFETY: See the `Ioctl` implementation of `SetIrqs`; the
        // descriptor is open for the call, and the kernel takes its own
        // reference.
        unsafe { ioctl(&self.fd, SetIrqs { arg }) }
            .map_err(|e| format!("VFIO_DEVICE_SET_IRQS request of {}: {e}", self.name))
    }

    /// Gives the device back to vfio-pci: its descriptor is made to name
    /// `/dev/null`, so the device's file is released once nothing else
    /// holds it (its BAR mapping holds it too: see [`Bar::let_go`]), and
    /// vfio-pci resets the device then. Every later call on it fails.
    pub fn let_go(&self) -> Result<(), String> {
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("/dev/null: {e}"))?;
        // SAFETY: `dup3` replaces the file behind this descriptor number in
        // one step; the `OwnedFd` still owns the number (closed on drop),
        // and the temporary `OwnedFd` is never dropped, so nothing closes
        // it twice.
        let mut target =
            std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(self.fd.as_raw_fd()) });
        rustix::io::dup3(&null, &mut target, rustix::io::DupFlags::CLOEXEC)
            .map_err(|e| format!("giving {} back: {e}", self.name))
    }

    /// Enables MSI-X with one vector per descriptor of `eventfds` (vector
    /// `i` signals `eventfds[i]`), or disables it when empty.
    #[doc(alias = "VFIO_DEVICE_SET_IRQS")]
    pub fn set_msix(&self, eventfds: &[BorrowedFd<'_>]) -> Result<(), String> {
        let fds: Vec<i32> = eventfds.iter().map(|f| f.as_raw_fd()).collect();
        let arg = irq_set(VFIO_PCI_MSIX_IRQ_INDEX, &fds);
        // SAFETY: See the `Ioctl` implementation of `SetIrqs`; the
        // descriptors are open for the call (borrowed), and the kernel takes
        // its own references to them.
        unsafe { ioctl(&self.fd, SetIrqs { arg }) }.map_err(|e| {
            format!(
                "VFIO_DEVICE_SET_IRQS MSI-X with {} vectors of {}: {e}",
                fds.len(),
                self.name
            )
        })
    }

    /// Reads the 16-bit config register at `offset`.
    pub fn config_read16(&self, offset: u64) -> Result<u16, String> {
        let cfg = self.region(VFIO_PCI_CONFIG_REGION_INDEX)?;
        let mut b = [0u8; 2];
        match pread(&self.fd, &mut b, cfg.offset + offset) {
            Ok(2) => Ok(u16::from_le_bytes(b)),
            Ok(n) => Err(format!("config read at {offset:#x}: {n} bytes")),
            Err(e) => Err(format!("config read at {offset:#x} of {}: {e}", self.name)),
        }
    }

    /// Writes the 16-bit config register at `offset`.
    pub fn config_write16(&self, offset: u64, value: u16) -> Result<(), String> {
        let cfg = self.region(VFIO_PCI_CONFIG_REGION_INDEX)?;
        match pwrite(&self.fd, &value.to_le_bytes(), cfg.offset + offset) {
            Ok(2) => Ok(()),
            Ok(n) => Err(format!("config write at {offset:#x}: {n} bytes")),
            Err(e) => Err(format!("config write at {offset:#x} of {}: {e}", self.name)),
        }
    }

    /// Turns the function's bus mastering off, so that it can issue no more
    /// DMA, and checks that the bit reads back clear.
    pub fn stop_bus_master(&self) -> Result<(), String> {
        let cmd = self.config_read16(PCI_COMMAND)?;
        self.config_write16(PCI_COMMAND, cmd & !PCI_COMMAND_MASTER)?;
        let now = self.config_read16(PCI_COMMAND)?;
        if now & PCI_COMMAND_MASTER != 0 {
            return Err(format!(
                "PCI_COMMAND of {} still has bus mastering on ({now:#06x})",
                self.name
            ));
        }
        Ok(())
    }

    /// Resets the function (a function-level reset or whatever reset
    /// vfio-pci has for it), which ends all its DMA.
    #[doc(alias = "VFIO_DEVICE_RESET")]
    pub fn reset(&self) -> Result<(), String> {
        // SAFETY: See the `Ioctl` implementation of `IntArg`.
        unsafe {
            ioctl(
                &self.fd,
                IntArg {
                    opcode: VFIO_DEVICE_RESET,
                    value: 0,
                },
            )
        }
        .map(|_| ())
        .map_err(|e| format!("VFIO_DEVICE_RESET of {}: {e}", self.name))
    }

    /// Exports `ranges` (`(offset, length)`, page aligned) of BAR `bar` as
    /// one dma-buf, opened read-write and close-on-exec. vfio-pci hands it
    /// only to importers that allow peer-to-peer and can be revoked, and
    /// revokes it while the device's memory decoding is off.
    #[doc(alias = "VFIO_DEVICE_FEATURE_DMA_BUF")]
    pub fn export_dma_buf(&self, bar: u32, ranges: &[(u64, u64)]) -> Result<OwnedFd, String> {
        let open_flags = (OFlags::RDWR | OFlags::CLOEXEC).bits();
        let arg = dma_buf_feature(bar, open_flags, ranges);
        // SAFETY: See the `Ioctl` implementation of `GetDmaBuf`.
        unsafe { ioctl(&self.fd, GetDmaBuf { arg }) }.map_err(|e| {
            format!(
                "VFIO_DEVICE_FEATURE_DMA_BUF of BAR {bar} {ranges:#x?} of {}: {e}",
                self.name
            )
        })
    }

    /// Maps BAR `index` (a memory BAR that VFIO lets user space map).
    ///
    /// # Safety
    ///
    /// Writes to the mapping program the device, which then DMAs wherever
    /// its registers and the commands they point at say (with no IOMMU, to
    /// any memory of the machine). The caller gives the device only the bus
    /// addresses of memory mapped for it that the caller owns, which no
    /// Rust reference reaches and nothing else trusts (see
    /// [`DmaMemory`](crate::memory::DmaMemory)), and stops the device before
    /// releasing that memory.
    pub unsafe fn map_bar(&self, index: u32) -> Result<Bar, String> {
        let info = self.region(index)?;
        if info.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || info.size == 0 {
            return Err(format!(
                "BAR {index} of {} cannot be mapped (flags {:#x}, size {})",
                self.name, info.flags, info.size
            ));
        }
        let len = usize::try_from(info.size).map_err(|e| e.to_string())?;
        // SAFETY: A NULL hint lets the kernel choose the address, so the
        // new mapping overlaps nothing Rust uses.
        let ptr = unsafe {
            mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &self.fd,
                info.offset,
            )
        }
        .map_err(|e| format!("mmap of BAR {index} of {}: {e}", self.name))?;
        Ok(Bar {
            ptr: NonNull::new(ptr.cast()).ok_or("mmap returned NULL")?,
            len,
        })
    }
}

/// A device's memory BAR mapped into this process: registers, reached only
/// by volatile 32-bit accesses. Unmapped on drop.
#[derive(Debug)]
pub struct Bar {
    ptr: NonNull<u8>,
    len: usize,
}

impl Bar {
    /// Anonymous memory standing in for a BAR, for tests of code that
    /// writes registers.
    #[cfg(test)]
    pub(crate) fn anonymous(len: usize) -> Self {
        // SAFETY: A NULL hint: the new mapping overlaps nothing.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .expect("anonymous mapping");
        Self {
            ptr: NonNull::new(ptr.cast()).expect("non-NULL mapping"),
            len,
        }
    }

    /// Replaces the mapping with anonymous memory at the same address: the
    /// device's file is no longer held by it, and later register accesses
    /// (a failed controller's, racing this) reach memory that no device
    /// decodes instead of a hole.
    pub fn let_go(&self) -> Result<(), String> {
        // SAFETY: Exactly this mapping, which no reference points into
        // (registers are reached by volatile accesses only).
        unsafe { super::mapping::replace_with_anonymous(self.ptr.as_ptr(), self.len) }
            .map_err(|e| format!("replacing the BAR mapping: {e}"))
    }

    fn reg(&self, offset: usize) -> Result<*mut u32, String> {
        if !offset.is_multiple_of(4) || offset.checked_add(4).is_none_or(|end| end > self.len) {
            return Err(format!(
                "register {offset:#x} is not a dword of the {}-byte BAR",
                self.len
            ));
        }
        // SAFETY: In bounds of the mapping (checked above).
        Ok(unsafe { self.ptr.as_ptr().add(offset) }.cast())
    }

    /// Reads the 32-bit register at `offset`.
    pub fn read32(&self, offset: usize) -> Result<u32, String> {
        let p = self.reg(offset)?;
        // SAFETY: An aligned dword inside the live mapping; device
        // registers are read with one volatile access and no reference.
        Ok(unsafe { ptr::read_volatile(p) })
    }

    /// Writes the 32-bit register at `offset`.
    pub fn write32(&self, offset: usize, value: u32) -> Result<(), String> {
        let p = self.reg(offset)?;
        // SAFETY: As in `read32`.
        unsafe { ptr::write_volatile(p, value) };
        Ok(())
    }

    /// Reads a 64-bit register as two dwords, low first.
    pub fn read64(&self, offset: usize) -> Result<u64, String> {
        let lo = self.read32(offset)?;
        let hi = self.read32(offset + 4)?;
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }

    /// Writes a 64-bit register as two dwords, low first.
    pub fn write64(&self, offset: usize, value: u64) -> Result<(), String> {
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }
}

// SAFETY: The mapping is device registers reached only by volatile dword
// accesses, which any thread may make; it is unmapped once, on drop.
unsafe impl Send for Bar {}
// SAFETY: As for `Send`: no method hands out a reference into the mapping.
unsafe impl Sync for Bar {}

impl Drop for Bar {
    fn drop(&mut self) {
        // SAFETY: Exactly the mapping `map_bar` made; no reference into it
        // exists.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A PCI function opened through VFIO's no-IOMMU backend: its container,
/// group and device, memory decoding and bus mastering on, legacy
/// interrupts off, and BAR0 mapped. Closing it (drop) lets vfio-pci reset
/// the function and turn its bus mastering off.
#[derive(Debug)]
pub struct Function {
    /// BAR0, mapped.
    pub bar: Arc<Bar>,
    /// The device.
    pub device: Arc<Device>,
    /// The group node it was opened by.
    pub node: PathBuf,
    group: Group,
    container: Container,
}

impl Function {
    /// Opens `bdf`, bound to vfio-pci, in a no-IOMMU container. vfio-pci
    /// resets the function on the first open.
    ///
    /// # Safety
    ///
    /// The function's BAR0 is mapped ([`Function::bar`]) and its bus
    /// mastering on: as for [`Device::map_bar`], the caller gives the device
    /// only addresses of memory it owns for the device, and stops the
    /// device before releasing that memory.
    pub unsafe fn open_noiommu(bdf: &str) -> Result<Self, String> {
        let node = group_node(bdf)?;
        if !node.to_string_lossy().contains("noiommu-") {
            return Err(format!(
                "{} is not a no-IOMMU group: this needs vfio.enable_unsafe_noiommu_mode=1 and no IOMMU",
                node.display()
            ));
        }
        let container = Container::open()?;
        if !container.check_extension(VFIO_NOIOMMU_IOMMU)? {
            return Err("the VFIO container has no no-IOMMU backend".into());
        }
        let group = Group::open(&node)?;
        let flags = group.status()?;
        if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(format!(
                "{} is not viable (flags {flags:#x})",
                node.display()
            ));
        }
        group.set_container(&container)?;
        container.set_iommu(VFIO_NOIOMMU_IOMMU)?;
        let device = group.device(bdf)?;
        // Memory space on, bus mastering on (without it the function's DMA
        // is dropped), legacy interrupts off: completions are polled.
        let cmd = device.config_read16(PCI_COMMAND)?;
        let want = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE;
        device.config_write16(PCI_COMMAND, cmd | want)?;
        let now = device.config_read16(PCI_COMMAND)?;
        if now & want != want {
            return Err(format!(
                "PCI_COMMAND is {now:#06x} after setting {want:#06x}"
            ));
        }
        // SAFETY: The caller's promise, passed on.
        let bar = Arc::new(unsafe { device.map_bar(0) }?);
        Ok(Self {
            bar,
            device: Arc::new(device),
            node,
            group,
            container,
        })
    }

    /// Renumbers the device's descriptor above `other`'s (see
    /// [`Device::keep_above`]); before the device is shared.
    pub fn keep_above(&mut self, other: BorrowedFd<'_>) -> Result<(), String> {
        Arc::get_mut(&mut self.device)
            .ok_or_else(|| "the VFIO device is already shared".to_string())?
            .keep_above(other)
    }

    /// The group and container, kept open as long as the device.
    pub fn parts(&self) -> (&Group, &Container) {
        (&self.group, &self.container)
    }
}

fn pci_dev(bdf: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(bdf)
}

/// The start and size of BAR `bar` in a PCI function's sysfs `resource`
/// file (one `start end flags` line per resource, in hex).
fn parse_resource(text: &str, bar: usize) -> Result<(u64, u64), String> {
    let line = text
        .lines()
        .nth(bar)
        .ok_or_else(|| format!("no line for BAR {bar}"))?;
    let hex = |w: Option<&str>| {
        w.and_then(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
            .ok_or_else(|| format!("BAR {bar}: {line:?} is not 'start end flags'"))
    };
    let mut words = line.split_whitespace();
    let (start, end) = (hex(words.next())?, hex(words.next())?);
    if start == 0 || end < start {
        return Err(format!("BAR {bar} is not assigned: {line:?}"));
    }
    Ok((start, end - start + 1))
}

/// The CPU address and size of BAR `bar` of PCI function `bdf`, as the
/// PCI core assigned it (sysfs `resource`), read independently of VFIO.
pub fn bar_resource(bdf: &str, bar: usize) -> Result<(u64, u64), String> {
    let path = pci_dev(bdf).join("resource");
    let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_resource(&text, bar).map_err(|e| format!("{}: {e}", path.display()))
}

/// The driver bound to PCI function `bdf`, if any.
pub fn driver_of(bdf: &str) -> Option<String> {
    fs::read_link(pci_dev(bdf).join("driver"))
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
}

fn sysfs_write(path: impl AsRef<Path>, value: &str) -> Result<(), String> {
    let path = path.as_ref();
    fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

/// Waits up to `timeout` for `bdf` to be bound to `want` (any driver for
/// `None`).
fn wait_driver(bdf: &str, want: Option<&str>, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match (driver_of(bdf), want) {
            (Some(d), None) => return Ok(d),
            (Some(d), Some(w)) if d == w => return Ok(d),
            (now, _) if Instant::now() >= deadline => {
                return Err(format!(
                    "{bdf} is bound to {} after {timeout:?}, not {}",
                    now.as_deref().unwrap_or("no driver"),
                    want.unwrap_or("a driver")
                ))
            }
            _ => thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Moves PCI function `bdf` to `driver` (e.g. `vfio-pci`): unbinds it from
/// its driver, sets `driver_override` and asks the PCI core to probe it.
pub fn bind_to(bdf: &str, driver: &str) -> Result<(), String> {
    let dev = pci_dev(bdf);
    if let Some(old) = driver_of(bdf) {
        if old == driver {
            return Ok(());
        }
        sysfs_write(dev.join("driver/unbind"), bdf)?;
    }
    sysfs_write(dev.join("driver_override"), driver)?;
    sysfs_write("/sys/bus/pci/drivers_probe", bdf)?;
    wait_driver(bdf, Some(driver), Duration::from_secs(10)).map(|_| ())
}

/// Gives PCI function `bdf` back to its default driver: unbinds it, clears
/// `driver_override` and probes it again. Returns the driver it got.
pub fn bind_default(bdf: &str) -> Result<String, String> {
    let dev = pci_dev(bdf);
    if driver_of(bdf).is_some() {
        sysfs_write(dev.join("driver/unbind"), bdf)?;
    }
    sysfs_write(dev.join("driver_override"), "\n")?;
    sysfs_write("/sys/bus/pci/drivers_probe", bdf)?;
    wait_driver(bdf, None, Duration::from_secs(10))
}

/// The VFIO group node of PCI function `bdf`: `/dev/vfio/noiommu-N` for a
/// no-IOMMU group, else `/dev/vfio/N`.
pub fn group_node(bdf: &str) -> Result<PathBuf, String> {
    let link = pci_dev(bdf).join("iommu_group");
    let group = fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
    let n = group
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| format!("{} names no group", link.display()))?;
    let noiommu = PathBuf::from(format!("/dev/vfio/noiommu-{n}"));
    if noiommu.exists() {
        Ok(noiommu)
    } else {
        Ok(PathBuf::from(format!("/dev/vfio/{n}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_codes_match_the_kernel_header() {
        // `_IO(VFIO_TYPE, VFIO_BASE + n)` of <linux/vfio.h>.
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_SET_IOMMU, 0x3b66);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_GET_REGION_INFO, 0x3b6c);
        assert_eq!(VFIO_DEVICE_GET_IRQ_INFO, 0x3b6d);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(VFIO_DEVICE_RESET, 0x3b6f);
        assert_eq!(VFIO_DEVICE_FEATURE, 0x3b75);
        assert_eq!(size_of::<RegionInfo>(), 32);
        assert_eq!(size_of::<IrqInfo>(), 16);
        assert_eq!(size_of::<VfioGroupStatus>(), 8);
    }

    #[test]
    fn the_dma_buf_feature_is_laid_out_as_the_kernel_reads_it() {
        let v = dma_buf_feature(0, 0o2_000_002, &[(0x1000, 0x2000), (0x8000, 0x1000)]);
        let word = |i: usize| u32::from_ne_bytes(v[i..i + 4].try_into().unwrap());
        let dword = |i: usize| u64::from_ne_bytes(v[i..i + 8].try_into().unwrap());
        assert_eq!(v.len(), 56);
        assert_eq!(word(0), 56, "argsz is the whole argument");
        assert_eq!(word(4), 0x1_000b, "GET | DMA_BUF");
        assert_eq!(
            (word(8), word(12), word(16), word(20)),
            (0, 0o2_000_002, 0, 2)
        );
        assert_eq!((dword(24), dword(32)), (0x1000, 0x2000));
        assert_eq!((dword(40), dword(48)), (0x8000, 0x1000));
    }

    #[test]
    fn the_irq_set_is_laid_out_as_the_kernel_reads_it() {
        let word = |v: &[u8], i: usize| u32::from_ne_bytes(v[i..i + 4].try_into().unwrap());
        let v = irq_set(VFIO_PCI_MSIX_IRQ_INDEX, &[7, 9, 11]);
        assert_eq!(v.len(), 32);
        assert_eq!(word(&v, 0), 32, "argsz is the whole argument");
        assert_eq!(word(&v, 4), 0x24, "DATA_EVENTFD | ACTION_TRIGGER");
        assert_eq!((word(&v, 8), word(&v, 12), word(&v, 16)), (2, 0, 3));
        assert_eq!((word(&v, 20), word(&v, 24), word(&v, 28)), (7, 9, 11));
        let off = irq_set(VFIO_PCI_MSIX_IRQ_INDEX, &[]);
        assert_eq!(off.len(), 20);
        assert_eq!(
            (word(&off, 4), word(&off, 16)),
            (0x21, 0),
            "DATA_NONE, count 0"
        );
    }

    #[test]
    fn resources_give_start_and_size() {
        let text = "0x00000000fe800000 0x00000000fe803fff 0x0000000000140204\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        assert_eq!(parse_resource(text, 0), Ok((0xfe80_0000, 0x4000)));
        assert!(parse_resource(text, 1)
            .unwrap_err()
            .contains("not assigned"));
        assert!(parse_resource(text, 6).is_err());
        assert!(parse_resource("junk\n", 0).is_err());
    }
}
