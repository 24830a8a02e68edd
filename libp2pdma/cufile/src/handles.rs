//! File handles: a registered file descriptor becomes a
//! [`StorageFile`], opened again through `/proc/self/fd/N` so that the
//! engine has its own `O_DIRECT` and buffered descriptors of the same file,
//! read-only when the caller's descriptor is, read-write otherwise.
//!
//! A `CUfileHandle_t` is a number in the table, not an address: a handle C
//! made up, or one already deregistered, is found missing
//! (`CU_FILE_HANDLE_NOT_REGISTERED`), never dereferenced.

use std::{
    collections::HashMap,
    ffi::{c_int, c_void},
    os::fd::RawFd,
    sync::{Arc, RwLock},
};

use p2pdma::StorageFile;

use crate::{
    abi::{
        op, CUfileDescr, CUfileError, HANDLE_TYPE_OPAQUE_FD, HANDLE_TYPE_OPAQUE_WIN32,
        HANDLE_TYPE_USERSPACE_FS,
    },
    driver,
    errors::{guard, guard_value, Fail, Res},
    stats,
};

/// A registered file.
#[derive(Debug)]
pub struct FileEntry {
    /// The file as the engine opened it.
    pub file: Arc<StorageFile>,
    /// The caller's descriptor.
    pub fd: RawFd,
}

#[derive(Default)]
struct Table {
    by_handle: HashMap<usize, Arc<FileEntry>>,
    by_fd: HashMap<RawFd, usize>,
    last: usize,
}

static FILES: RwLock<Option<Table>> = RwLock::new(None);

/// The registered file behind `fh`: `CU_FILE_INVALID_VALUE` for NULL,
/// `CU_FILE_HANDLE_NOT_REGISTERED` for a handle not in the table.
pub fn lookup(fh: *mut c_void) -> Res<Arc<FileEntry>> {
    if fh.is_null() {
        return Err(Fail::INVALID);
    }
    let files = FILES.read().unwrap_or_else(|p| p.into_inner());
    files
        .as_ref()
        .and_then(|t| t.by_handle.get(&(fh as usize)))
        .cloned()
        .ok_or(Fail::cu(op::HANDLE_NOT_REGISTERED))
}

/// What the descriptor is, and whether it was opened for writing.
fn inspect(fd: RawFd) -> Res<bool> {
    // SAFETY: F_GETFL reads the descriptor's flags; a bad descriptor is
    // EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Fail::INVALID);
    }
    // SAFETY: `st` is written by fstat before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: A live out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Fail::INVALID);
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFBLK {
        // A pipe, a socket, a directory: nothing to transfer with.
        return Err(Fail::cu(op::INVALID_FILE_TYPE));
    }
    if flags & libc::O_PATH != 0 {
        return Err(Fail::cu(op::INVALID_FILE_OPEN_FLAG));
    }
    Ok(flags & libc::O_ACCMODE != libc::O_RDONLY)
}

/// Registers `fd`, returning its handle.
fn register(type_: u32, fd: c_int) -> Res<usize> {
    match type_ {
        HANDLE_TYPE_OPAQUE_FD => {}
        HANDLE_TYPE_OPAQUE_WIN32 | HANDLE_TYPE_USERSPACE_FS => {
            return Err(Fail::cu(op::INVALID_FILE_TYPE))
        }
        _ => return Err(Fail::INVALID),
    }
    if fd < 0 {
        return Err(Fail::INVALID);
    }
    driver::engine()?;
    let registered = |t: &Option<Table>| t.as_ref().is_some_and(|t| t.by_fd.contains_key(&fd));
    if registered(&FILES.read().unwrap_or_else(|p| p.into_inner())) {
        return Err(Fail::cu(op::HANDLE_ALREADY_REGISTERED));
    }
    let writable = inspect(fd)?;
    let path = format!("/proc/self/fd/{fd}");
    let file = if writable {
        StorageFile::open_rw(&path)
    } else {
        StorageFile::open(&path)
    }
    .map_err(Fail::from)?;

    let mut files = FILES.write().unwrap_or_else(|p| p.into_inner());
    if registered(&files) {
        return Err(Fail::cu(op::HANDLE_ALREADY_REGISTERED));
    }
    let t = files.get_or_insert_with(Table::default);
    t.last += 1;
    let handle = t.last;
    t.by_handle.insert(
        handle,
        Arc::new(FileEntry {
            file: Arc::new(file),
            fd,
        }),
    );
    t.by_fd.insert(fd, handle);
    Ok(handle)
}

/// Registers the file descriptor `descr` describes
/// (`CU_FILE_HANDLE_TYPE_OPAQUE_FD`, a regular file or block device,
/// opened with or without `O_DIRECT`) and writes its handle to `fh`.
///
/// Errors: `CU_FILE_INVALID_VALUE` for NULL pointers, an unknown type or a
/// bad descriptor; `CU_FILE_INVALID_FILE_TYPE` for Windows handles,
/// user-space filesystems and descriptors of anything but files and block
/// devices; `CU_FILE_HANDLE_ALREADY_REGISTERED` for a descriptor already
/// registered; `CU_FILE_IO_NOT_SUPPORTED` for a file whose filesystem
/// refuses `O_DIRECT` (the engine needs it); `CU_FILE_PERMISSION_DENIED`
/// when the file cannot be opened again with the descriptor's mode.
///
/// # Safety
/// `fh` and `descr` are NULL or valid: `fh` writable for a handle, `descr`
/// readable for a `CUfileDescr_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(
    fh: *mut *mut c_void,
    descr: *mut CUfileDescr,
) -> CUfileError {
    let status = guard(|| {
        if fh.is_null() || descr.is_null() {
            return Err(Fail::INVALID);
        }
        // SAFETY: Non-null and readable by the caller's contract.
        let d = unsafe { descr.read_unaligned() };
        // SAFETY: Every bit pattern is an int; it is only the fd when the
        // type says so, which `register` checks before using it.
        let fd = unsafe { d.handle.fd };
        let handle = register(d.type_, fd)?;
        // SAFETY: Non-null and writable by the caller's contract.
        unsafe { fh.write_unaligned(handle as *mut c_void) };
        Ok(())
    });
    stats::call(stats::Call::HandleRegister, status.err == op::SUCCESS);
    status
}

/// Forgets a registered file. Transfers already running with it finish;
/// an unknown handle is ignored.
#[no_mangle]
pub extern "C" fn cuFileHandleDeregister(fh: *mut c_void) {
    guard_value((), || {
        let mut files = FILES.write().unwrap_or_else(|p| p.into_inner());
        let gone = files
            .as_mut()
            .and_then(|t| Some((t.by_handle.remove(&(fh as usize))?, t)))
            .map(|(e, t)| t.by_fd.remove(&e.fd));
        drop(files);
        stats::call(stats::Call::HandleDeregister, gone.is_some());
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn handles_are_looked_up_never_dereferenced() {
        assert_eq!(lookup(std::ptr::null_mut()).unwrap_err(), Fail::INVALID);
        assert_eq!(
            lookup(0xdead_beef as *mut c_void).unwrap_err(),
            Fail::cu(op::HANDLE_NOT_REGISTERED)
        );
        assert_eq!(register(0, 0).unwrap_err(), Fail::INVALID);
        assert_eq!(register(7, 0).unwrap_err(), Fail::INVALID);
        assert_eq!(
            register(HANDLE_TYPE_OPAQUE_WIN32, 0).unwrap_err(),
            Fail::cu(op::INVALID_FILE_TYPE)
        );
        assert_eq!(
            register(HANDLE_TYPE_OPAQUE_FD, -1).unwrap_err(),
            Fail::INVALID
        );
    }

    #[test]
    fn a_pipe_is_not_a_file() {
        let mut fds = [0; 2];
        // SAFETY: Out-array of two ints.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        assert_eq!(
            inspect(fds[0]).unwrap_err(),
            Fail::cu(op::INVALID_FILE_TYPE)
        );
        for fd in fds {
            // SAFETY: Ours.
            unsafe { libc::close(fd) };
        }
        let f = tempfile::tempfile().unwrap();
        assert_eq!(inspect(f.as_raw_fd()), Ok(true));
    }
}
