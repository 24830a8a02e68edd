//! The NVMe-command path on regular files, through the public API.
//!
//! On any host: what `StorageFile` says about a file, and that
//! `PathPref::NvmeCmd` is refused with the reason when the file is not on an
//! NVMe namespace. With `P2PDMA_TEST_NVME_DIR` naming a directory on ext4 or
//! XFS on an NVMe namespace (and access to its `/dev/ngXnY`): transfers
//! through NVMe commands on files, checked byte for byte, including holes,
//! unwritten extents, unsynced buffered writes and the page cache after a
//! write. Host memory stands in for the accelerator: the controller DMAs into
//! it the same way.

use std::{
    fs::File,
    io::Write,
    os::unix::fs::{FileExt, MetadataExt},
    path::Path,
};

mod common;

use common::{mem_bytes, pattern};
use p2pdma::{
    memory::{DeviceMemory, HostMemory},
    transfer::{Engine, PathPref, StorageFile, TransferPath},
    Error, MemRange,
};

fn write_file(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn engine(path: PathPref) -> Engine {
    common::engine(path, Some(256 << 10), Some(4))
}

/// The partition start sysfs gives for the device holding `path`.
fn sysfs_partition_start(path: &Path) -> u64 {
    let dev = std::fs::metadata(path).unwrap().dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/start"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(0, |s| s * 512)
}

#[test]
fn a_file_says_what_it_is_and_nvme_commands_need_a_namespace() {
    let dir = common::scratch_dir("nvme-files");
    let path = dir.path().join("plain.bin");
    write_file(&path, &pattern(1, 0, 65536));
    let file = StorageFile::open(&path).unwrap();
    assert!(file.is_file());
    assert_eq!(file.partition_offset(), sysfs_partition_start(&path));
    let mem = HostMemory::new(65536).unwrap();
    match file.nvme_namespace() {
        None => {
            let e = engine(PathPref::NvmeCmd);
            match e.choose(&file, &mem) {
                Err(Error::PathUnavailable {
                    path: "nvme-cmd",
                    reason,
                }) => {
                    assert!(reason.contains("not on an NVMe namespace"), "{reason}")
                }
                other => panic!("expected nvme-cmd to be unavailable, got {other:?}"),
            }
            // AUTO is not affected by the NVMe-command path: host memory
            // goes direct.
            assert_eq!(
                engine(PathPref::Auto).choose(&file, &mem).unwrap().path,
                TransferPath::Direct
            );
        }
        Some(ns) => {
            println!(
                "this host's temp dir is on NVMe namespace {} ({})",
                ns.nsid,
                ns.generic.display()
            );
            assert!(ns.generic.to_string_lossy().starts_with("/dev/ng"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The directory to test files on NVMe in, or `None` (said why).
fn nvme_dir(test: &str) -> Option<tempfile::TempDir> {
    match std::env::var_os("P2PDMA_TEST_NVME_DIR") {
        Some(d) => Some(
            tempfile::Builder::new()
                .prefix(&format!("p2pdma-nvme-files-{test}-"))
                .tempdir_in(d)
                .unwrap(),
        ),
        None => {
            println!("{test}: skipped: set P2PDMA_TEST_NVME_DIR to a directory on ext4 or XFS on an NVMe namespace");
            None
        }
    }
}

/// Opens `path` and checks the NVMe-command path is chosen for it.
fn open_on_nvme(path: &Path, rw: bool, e: &Engine, mem: &dyn DeviceMemory) -> StorageFile {
    let file = if rw {
        StorageFile::open_rw(path)
    } else {
        StorageFile::open(path)
    }
    .unwrap();
    assert!(file.is_file());
    assert!(
        file.nvme_namespace().is_some(),
        "{} is not on an NVMe namespace",
        path.display()
    );
    let choice = e.choose(&file, mem).unwrap();
    assert_eq!(choice.path, TransferPath::NvmeCmd);
    assert!(choice.reason.contains("FIEMAP"), "{}", choice.reason);
    file
}

/// (file offset, memory offset, length): aligned, unaligned ends, inside
/// one block, many chunks.
const CASES: &[(u64, usize, usize)] = &[
    (0, 0, 1 << 20),
    (4096, 8192, 3 << 20),
    (1, 1, 1),
    (100, 100, 4000),
    (123_457, 123_457, 2_500_001),
    (7 << 20, 0, 1 << 20),
];

#[test]
fn reads_of_written_sparse_and_unsynced_files_by_nvme_commands() {
    let Some(dir) = nvme_dir("reads") else { return };
    let e = engine(PathPref::NvmeCmd);
    // A written file.
    let data = pattern(2, 0, 8 << 20);
    let path = dir.path().join("written.bin");
    write_file(&path, &data);
    let mem = HostMemory::new(8 << 20).unwrap();
    let file = open_on_nvme(&path, false, &e, &mem);
    for &(foff, moff, len) in CASES {
        mem.write_at(0, &vec![0xEE; mem.len()]).unwrap();
        let r = e
            .read(&file, foff, MemRange::new(&mem, moff, len).unwrap())
            .unwrap();
        assert_eq!(
            (r.path, r.retried),
            (TransferPath::NvmeCmd, false),
            "read {foff}+{len}"
        );
        assert!(
            mem_bytes(&mem, moff, len) == data[foff as usize..foff as usize + len],
            "read {foff}+{len}"
        );
        assert!(
            mem_bytes(&mem, 0, moff).iter().all(|&b| b == 0xEE),
            "wrote before the range"
        );
    }
    // A sparse file: data, a hole, an fallocated (unwritten) range, data.
    let path = dir.path().join("sparse.bin");
    let f = File::create(&path).unwrap();
    let (a, b) = (pattern(3, 0, 1 << 20), pattern(4, 3 << 20, 1 << 20));
    // Size first: writes that extend a file leave XFS's speculative
    // preallocation (delayed allocation, no data) in what becomes the hole.
    f.set_len(4 << 20).unwrap();
    f.write_all_at(&a, 0).unwrap();
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 2 << 20, 1 << 20).unwrap();
    f.write_all_at(&b, 3 << 20).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut want = vec![0u8; 4 << 20];
    want[..1 << 20].copy_from_slice(&a);
    want[3 << 20..].copy_from_slice(&b);
    let file = open_on_nvme(&path, false, &e, &mem);
    mem.write_at(0, &vec![0xEE; mem.len()]).unwrap();
    let r = e
        .read(&file, 0, MemRange::new(&mem, 0, 4 << 20).unwrap())
        .unwrap();
    assert_eq!((r.path, r.retried), (TransferPath::NvmeCmd, false));
    assert!(mem_bytes(&mem, 0, 4 << 20) == want, "sparse read");
    // Buffered writes never synced are seen (FIEMAP_FLAG_SYNC).
    let path = dir.path().join("unsynced.bin");
    let fresh = pattern(5, 0, 2 << 20);
    std::fs::write(&path, &fresh).unwrap();
    let file = open_on_nvme(&path, false, &e, &mem);
    let r = e
        .read(&file, 0, MemRange::new(&mem, 0, 2 << 20).unwrap())
        .unwrap();
    assert_eq!((r.path, r.retried), (TransferPath::NvmeCmd, false));
    assert!(mem_bytes(&mem, 0, 2 << 20) == fresh, "unsynced data read");
    let s = e.stats().nvme_cmd.snapshot();
    assert_eq!(s.retries, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvme_commands_never_write_files_the_bounce_path_does() {
    let Some(dir) = nvme_dir("writes") else {
        return;
    };
    let e = engine(PathPref::NvmeCmd);
    let size = 6 << 20;
    let orig = pattern(6, 0, size);
    let path = dir.path().join("overwrite.bin");
    write_file(&path, &orig);
    let mem = HostMemory::new(size).unwrap();
    let file = open_on_nvme(&path, true, &e, &mem);
    // Fill the page cache, so a stale copy would show after the write.
    assert!(std::fs::read(&path).unwrap() == orig);
    let mut expect = orig.clone();
    let mut n = 0;
    for (i, &(foff, moff, len)) in CASES.iter().enumerate() {
        if foff as usize + len > size {
            continue;
        }
        let src = pattern(100 + i as u64, 0, moff + len);
        mem.write_at(0, &src).unwrap();
        let r = e
            .write(&file, foff, MemRange::new(&mem, moff, len).unwrap())
            .unwrap();
        // Refused before anything moved (nothing holds the layout during a
        // write), redone on the bounce path and counted.
        assert_eq!(
            (r.path, r.retried),
            (TransferPath::Bounce, true),
            "write {foff}+{len}"
        );
        n += 1;
        assert_eq!(e.stats().nvme_cmd.snapshot().retries, n);
        expect[foff as usize..foff as usize + len].copy_from_slice(&src[moff..moff + len]);
        assert!(
            std::fs::read(&path).unwrap() == expect,
            "buffered read after write {foff}+{len}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
