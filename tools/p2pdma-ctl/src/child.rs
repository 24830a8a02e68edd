//! Helper processes of the sanity suite, run as `p2pdma-ctl __child ...`
//! by re-executing `/proc/self/exe`. Each prints one line of `key=value`
//! words for the parent to check (an errno as its number, 0 for success).

use std::{
    collections::HashMap,
    io::{BufRead, Write},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    process::ExitCode,
};

use clap::Subcommand;
use p2pdma::{
    sys::{self, HostBuffer, RawMapping, Sharing},
    Allocation, DeviceMapping, Module, PciAddress, Peer, Udmabuf,
};
use p2pdma_abi as abi;
use rustix::{
    fs::{open, seek, Mode, OFlags, SeekFrom},
    io::Errno,
    net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags},
    process::{geteuid, getuid},
    thread::{set_thread_gid, set_thread_groups, set_thread_uid},
};

use crate::util::pattern;

/// The uid and gid an unprivileged helper drops to (`nobody`).
pub const NOBODY: u32 = 65534;

#[derive(Subcommand)]
pub enum ChildCmd {
    /// Receive a `/dev/p2pdma` descriptor over the unix socket on stdin
    /// (SCM_RIGHTS), then try to mmap `size` bytes at `offset` of it and to
    /// allocate from device `dev`. Prints `mmap=E alloc=E`.
    RecvFd {
        #[arg(long)]
        dev: u32,
        #[arg(long)]
        size: u64,
        #[arg(long)]
        offset: u64,
    },
    /// Allocate and map 1 MiB of device `dev`, read the NVMe namespace into
    /// it with O_DIRECT, print `first=ok match=0|1` or `first=err errno=E`,
    /// then keep reading until killed.
    IoLoop {
        #[arg(long)]
        dev: u32,
        #[arg(long)]
        nvme: String,
    },
    /// Open the module, allocate, prepare a host buffer and a udmabuf, drop
    /// to uid/gid 65534 with no groups, then try DMA_MAP, PIN_USER and
    /// DMABUF_IMPORT. Prints `uid=U euid=U dma_map=E pin_user=E
    /// dmabuf_import=E|skip`.
    Unprivileged {
        #[arg(long)]
        dev: u32,
        /// The peer's block device; without it, the accelerator itself.
        #[arg(long)]
        nvme: Option<String>,
    },
    /// Allocate, map and fill 1 MiB of device `dev`, print `ready`, wait for
    /// a line on stdin, then read the mapping back. Prints `survived
    /// data_ok=0|1` if that read returns.
    TouchLater {
        #[arg(long)]
        dev: u32,
    },
    /// Allocate `size` bytes of device `dev`, map them, fill them with
    /// `byte`, print `filled handle=H size=S`, and exit without freeing or
    /// unmapping anything.
    FillExit {
        #[arg(long)]
        dev: u32,
        #[arg(long)]
        size: u64,
        #[arg(long)]
        byte: u8,
    },
    /// Keep CAP_SYS_RAWIO but drop CAP_IPC_LOCK, set RLIMIT_MEMLOCK to
    /// 64 KiB, then PIN_USER 128 KiB, then three buffers of 32 KiB, UNMAP
    /// the first and pin a fourth. Prints `caps=0|1 big=E first=E second=E
    /// third=E unmap=E again=E`.
    Memlock {
        #[arg(long)]
        dev: u32,
        /// The peer's block device; without it, the accelerator itself.
        #[arg(long)]
        nvme: Option<String>,
    },
    /// Open the module twice, drop to uid/gid 65534 (no CAP_SYS_ADMIN),
    /// then allocate against the per-user share of device `dev`, `share`
    /// bytes: one page more than the share, the whole share, and the
    /// share split over both files plus one page more on each. Prints
    /// `uid=U over=E whole=E split_a=E split_b=E beyond_a=E beyond_b=E`.
    PoolShare {
        #[arg(long)]
        dev: u32,
        #[arg(long)]
        share: u64,
    },
}

/// An errno as the number the helpers print: 0 for success.
pub fn code<T>(r: &Result<T, Errno>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error(),
    }
}

/// The errno behind a library result, as [`code`] prints it.
fn lib_code<T>(r: &p2pdma::Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno().map_or(-1, |e| e.raw_os_error()),
    }
}

/// Parses a helper's `key=value` line.
pub fn parse_kv(line: &str) -> HashMap<String, String> {
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn run(node: &str, cmd: &ChildCmd) -> ExitCode {
    let r = match cmd {
        ChildCmd::RecvFd { dev, size, offset } => recv_fd_child(*dev, *size, *offset),
        ChildCmd::IoLoop { dev, nvme } => io_loop(node, *dev, nvme),
        ChildCmd::Unprivileged { dev, nvme } => unprivileged(node, *dev, nvme.as_deref()),
        ChildCmd::TouchLater { dev } => touch_later(node, *dev),
        ChildCmd::FillExit { dev, size, byte } => fill_exit(node, *dev, *size, *byte),
        ChildCmd::Memlock { dev, nvme } => memlock(node, *dev, nvme.as_deref()),
        ChildCmd::PoolShare { dev, share } => pool_share(node, *dev, *share),
    };
    let _ = std::io::stdout().flush();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("error={}", e.replace(char::is_whitespace, "_"));
            eprintln!("p2pdma-ctl __child: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Receives one descriptor sent with SCM_RIGHTS on `sock`.
pub fn recv_fd(sock: BorrowedFd<'_>) -> Result<OwnedFd, String> {
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    recvmsg(sock, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|e| format!("recvmsg: {e}"))?;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = msg {
            if let Some(fd) = fds.next() {
                return Ok(fd);
            }
        }
    }
    Err("no descriptor arrived".into())
}

fn recv_fd_child(dev: u32, size: u64, offset: u64) -> Result<(), String> {
    let stdin = std::io::stdin();
    let fd = recv_fd(stdin.as_fd())?;
    let len = usize::try_from(size).map_err(|_| "size too large")?;
    // SAFETY: The parent's test allocation, a pattern reached through
    // copies only; this child writes nothing through the mapping, it only
    // reports the module's answer.
    #[allow(unsafe_code)]
    let mmap = unsafe { RawMapping::map(&fd, len, offset, Sharing::Shared) };
    let mut arg = abi::P2pdmaAlloc {
        dev_index: dev,
        size: 4096,
        ..Default::default()
    };
    let alloc = sys::alloc(&fd, &mut arg);
    println!("mmap={} alloc={}", code(&mmap), code(&alloc));
    Ok(())
}

/// Allocates `size` bytes of accelerator `dev`'s memory and maps them.
fn alloc_mapped(
    module: &Module,
    dev: u32,
    size: u64,
) -> Result<(Allocation<'_>, DeviceMapping), String> {
    let a = module.alloc(dev, size, 0).map_err(|e| e.to_string())?;
    let map = a.map().map_err(|e| e.to_string())?;
    Ok((a, map))
}

fn io_loop(node: &str, dev: u32, nvme: &str) -> Result<(), String> {
    const LEN: usize = 1 << 20;
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let (_a, map) = alloc_mapped(&module, dev, LEN as u64)?;
    let disk = open(
        nvme,
        OFlags::RDONLY | OFlags::DIRECT | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open {nvme} with O_DIRECT: {e}"))?;
    let disk_size = seek(&disk, SeekFrom::End(0)).map_err(|e| format!("size of {nvme}: {e}"))?;
    if disk_size < 2 * LEN as u64 {
        return Err(format!("{nvme} is only {disk_size} bytes"));
    }
    let chunks = disk_size / LEN as u64;
    let first = LEN as u64;
    let host = HostBuffer::new(LEN).map_err(|e| format!("host buffer: {e}"))?;
    let n = host
        .pread_from(&disk, first, 0, LEN)
        .map_err(|e| format!("O_DIRECT read into host memory: {e}"))?;
    let mut host_bytes = vec![0u8; LEN];
    host.read_raw(0, &mut host_bytes)
        .map_err(|e| format!("host buffer: {e}"))?;
    if n != LEN {
        return Err(format!("short O_DIRECT read into host memory: {n} bytes"));
    }
    match map.read_from_file(&disk, first, 0, LEN) {
        Ok(n) => {
            let mut back = vec![0u8; LEN];
            map.read_at(0, &mut back).map_err(|e| e.to_string())?;
            let ok = n == LEN && back == host_bytes;
            println!("first=ok bytes={n} match={}", u8::from(ok));
        }
        Err(e) => println!(
            "first=err errno={}",
            e.errno().map_or(-1, |e| e.raw_os_error())
        ),
    }
    let _ = std::io::stdout().flush();
    let mut i = 0u64;
    loop {
        i = i.wrapping_add(1);
        let off = (i % chunks) * LEN as u64;
        let _ = map.read_from_file(&disk, off, 0, LEN);
    }
}

fn unprivileged(node: &str, dev: u32, nvme: Option<&str>) -> Result<(), String> {
    const LEN: u64 = 64 << 10;
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let accel = module.accelerator(dev).map_err(|e| e.to_string())?;
    let a = module.alloc(dev, LEN, 0).map_err(|e| e.to_string())?;
    let host = HostBuffer::new(LEN as usize).map_err(|e| format!("host buffer: {e}"))?;
    let udmabuf = match Udmabuf::create(LEN) {
        Ok(b) => Some(b),
        Err(e) if e.errno() == Some(Errno::NOENT) => None,
        Err(e) => return Err(e.to_string()),
    };
    let disk = match nvme {
        Some(path) => Some(
            open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                .map_err(|e| format!("open {path}: {e}"))?,
        ),
        None => None,
    };
    let peer = match &disk {
        Some(fd) => Peer::Fd(fd.as_fd()),
        None => Peer::Pci(accel.pci),
    };

    set_thread_groups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    set_thread_gid(rustix::process::Gid::from_raw(NOBODY)).map_err(|e| format!("setgid: {e}"))?;
    set_thread_uid(rustix::process::Uid::from_raw(NOBODY)).map_err(|e| format!("setuid: {e}"))?;

    let dma_map = module.dma_map(a.handle(), 0, LEN, peer);
    let pin_user = module.pin_user(host.addr(), LEN, peer);
    let dmabuf = udmabuf
        .as_ref()
        .map(|b| lib_code(&module.dmabuf_import(b.dmabuf(), peer)).to_string());
    println!(
        "uid={} euid={} dma_map={} pin_user={} dmabuf_import={}",
        getuid().as_raw(),
        geteuid().as_raw(),
        lib_code(&dma_map),
        lib_code(&pin_user),
        dmabuf.unwrap_or_else(|| "skip".into())
    );
    Ok(())
}

fn touch_later(node: &str, dev: u32) -> Result<(), String> {
    const LEN: usize = 1 << 20;
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let (a, map) = alloc_mapped(&module, dev, LEN as u64)?;
    let data = pattern(0x70c4, 0, LEN);
    map.write_at(0, &data).map_err(|e| e.to_string())?;
    println!("ready handle={}", a.handle());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| format!("stdin: {e}"))?;
    let mut back = vec![0u8; LEN];
    map.read_at(0, &mut back).map_err(|e| e.to_string())?;
    println!("survived data_ok={}", u8::from(back == data));
    // The module may already have dropped the allocation with the device.
    let _ = a.into_handle();
    Ok(())
}

fn fill_exit(node: &str, dev: u32, size: u64, byte: u8) -> Result<(), String> {
    const CHUNK: usize = 1 << 20;
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let (a, map) = alloc_mapped(&module, dev, size)?;
    let fill = vec![byte; CHUNK];
    let mut off = 0;
    while off < map.len() {
        let n = CHUNK.min(map.len() - off);
        map.write_at(off, &fill[..n]).map_err(|e| e.to_string())?;
        off += n;
    }
    let mut last = [0u8; 1];
    map.read_at(map.len() - 1, &mut last)
        .map_err(|e| e.to_string())?;
    if last[0] != byte {
        return Err(format!("the last byte reads {:#x} after the fill", last[0]));
    }
    println!("filled handle={} size={}", a.handle(), a.size());
    let _ = std::io::stdout().flush();
    // Exit holding everything: the module must clean up after the process.
    std::process::exit(0)
}

/// The peer of the helpers' mappings: `nvme` opened, or the accelerator.
fn open_peer(nvme: Option<&str>) -> Result<Option<OwnedFd>, String> {
    nvme.map(|path| {
        open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("open {path}: {e}"))
    })
    .transpose()
}

fn memlock(node: &str, dev: u32, nvme: Option<&str>) -> Result<(), String> {
    use rustix::{
        process::{setrlimit, Resource, Rlimit},
        thread::{capabilities, set_capabilities, CapabilitySet},
    };
    const LIMIT: u64 = 64 << 10;
    const SMALL: u64 = 32 << 10;
    let module = Module::open_path(node).map_err(|e| e.to_string())?;
    let accel = module.accelerator(dev).map_err(|e| e.to_string())?;
    let disk = open_peer(nvme)?;
    let peer = match &disk {
        Some(fd) => Peer::Fd(fd.as_fd()),
        None => Peer::Pci(accel.pci),
    };
    let buf = |len: u64| -> Result<HostBuffer, String> {
        let b = HostBuffer::new(len as usize).map_err(|e| format!("host buffer: {e}"))?;
        b.fill(0x3c);
        Ok(b)
    };
    let big = buf(2 * LIMIT)?;
    let small = [buf(SMALL)?, buf(SMALL)?, buf(SMALL)?, buf(SMALL)?];

    // This process has one thread, so the thread's sets are the process's.
    let mut sets = capabilities(None).map_err(|e| format!("capget: {e}"))?;
    sets.effective.remove(CapabilitySet::IPC_LOCK);
    sets.permitted.remove(CapabilitySet::IPC_LOCK);
    sets.inheritable.remove(CapabilitySet::IPC_LOCK);
    set_capabilities(None, sets).map_err(|e| format!("capset: {e}"))?;
    let now = capabilities(None).map_err(|e| format!("capget: {e}"))?;
    let caps_ok = !now.effective.contains(CapabilitySet::IPC_LOCK)
        && now.effective.contains(CapabilitySet::SYS_RAWIO);
    setrlimit(
        Resource::Memlock,
        Rlimit {
            current: Some(LIMIT),
            maximum: Some(LIMIT),
        },
    )
    .map_err(|e| format!("setrlimit RLIMIT_MEMLOCK: {e}"))?;

    let pin = |b: &HostBuffer, len: u64| module.pin_user(b.addr(), len, peer);
    let big_r = pin(&big, 2 * LIMIT);
    let first = pin(&small[0], SMALL);
    let second = pin(&small[1], SMALL);
    let third = pin(&small[2], SMALL);
    let first_code = lib_code(&first);
    let unmap = match first {
        Ok(m) => lib_code(&module.unmap(m)),
        Err(_) => -1,
    };
    let again = pin(&small[3], SMALL);
    println!(
        "caps={} big={} first={} second={} third={} unmap={unmap} again={}",
        u8::from(caps_ok),
        lib_code(&big_r),
        first_code,
        lib_code(&second),
        lib_code(&third),
        lib_code(&again)
    );
    Ok(())
}

fn pool_share(node: &str, dev: u32, share: u64) -> Result<(), String> {
    const PAGE: u64 = 4096;
    let one = Module::open_path(node).map_err(|e| e.to_string())?;
    let two = Module::open_path(node).map_err(|e| e.to_string())?;
    set_thread_groups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    set_thread_gid(rustix::process::Gid::from_raw(NOBODY)).map_err(|e| format!("setgid: {e}"))?;
    set_thread_uid(rustix::process::Uid::from_raw(NOBODY)).map_err(|e| format!("setuid: {e}"))?;

    let over = one.alloc(dev, share + PAGE, 0);
    let over_code = lib_code(&over);
    drop(over);
    let whole = one.alloc(dev, share, 0);
    let whole_code = lib_code(&whole);
    drop(whole);
    let half = (share / 2) & !(PAGE - 1);
    let split_a = one.alloc(dev, half, 0);
    let split_b = two.alloc(dev, share - half, 0);
    let beyond_a = one.alloc(dev, PAGE, 0);
    let beyond_b = two.alloc(dev, PAGE, 0);
    println!(
        "uid={} over={over_code} whole={whole_code} split_a={} split_b={} beyond_a={} beyond_b={}",
        getuid().as_raw(),
        lib_code(&split_a),
        lib_code(&split_b),
        lib_code(&beyond_a),
        lib_code(&beyond_b)
    );
    Ok(())
}

/// The PCI function of a block device, from its sysfs path (the last path
/// component that reads as a PCI address).
pub fn block_device_pci(dev_path: &str) -> Option<PciAddress> {
    let name = std::path::Path::new(dev_path).file_name()?.to_str()?;
    let sys = std::fs::canonicalize(format!("/sys/class/block/{name}")).ok()?;
    sys.components()
        .filter_map(|c| c.as_os_str().to_str()?.parse::<PciAddress>().ok())
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_lines_parse() {
        let kv = parse_kv("mmap=1 alloc=0 junk x=");
        assert_eq!(kv["mmap"], "1");
        assert_eq!(kv["alloc"], "0");
        assert_eq!(kv["x"], "");
        assert!(!kv.contains_key("junk"));
        assert_eq!(code::<()>(&Err(Errno::PERM)), 1);
        assert_eq!(code(&Ok(5)), 0);
    }
}
