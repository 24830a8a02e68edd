//! A Python object as memory the engine moves data into or out of.
//!
//! In order of preference:
//! 1. a [`Memory`] (accelerator memory or the host-memory device) or a
//!    [`MemoryView`] of one: the engine sees the memory itself, so P2P is
//!    possible;
//! 2. an object with the buffer protocol (`bytearray`, `memoryview`, numpy
//!    arrays): host memory lent for the transfer;
//! 3. an object with DLPack (`__dlpack__`: torch tensors, and anything else
//!    that speaks it) whose memory the CPU addresses: host memory lent the
//!    same way.
//!
//! Lent memory travels with what keeps it alive (the `Py_buffer`, the
//! DLPack capsule's tensor), so a transfer still in flight when the caller
//! lets go of the object writes into live memory.

use std::sync::{Arc, Mutex};

use dlpark::{ffi::DLDeviceType, python::ImportedDlpack};
use p2pdma::{BorrowedHost, DeviceMemory};
use pyo3::{buffer::PyUntypedBuffer, exceptions::PyTypeError, prelude::*};

use crate::{
    errors,
    memory::{Memory, MemoryView},
};

/// Which way the transfer moves data relative to the object.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The transfer writes into it (a read from storage).
    Write,
    /// The transfer only reads it (a write to storage).
    Read,
}

/// Memory for one transfer: `len` bytes from `offset` of `mem`.
pub struct Target {
    pub mem: Arc<dyn DeviceMemory>,
    pub offset: usize,
    pub len: usize,
}

impl Target {
    /// The range a call asks for: `size` bytes (all that is left when
    /// `None`) from `at` within the target, as an offset in `mem` and a
    /// length.
    pub fn span(&self, py: Python<'_>, at: usize, size: Option<usize>) -> PyResult<(usize, usize)> {
        if at > self.len {
            return Err(errors::invalid(
                py,
                format!("buffer offset {at} is past the buffer's {} bytes", self.len),
            ));
        }
        let len = size.unwrap_or(self.len - at);
        if len > self.len - at {
            return Err(errors::invalid(
                py,
                format!(
                    "{len} bytes from offset {at} do not fit in the buffer's {} bytes",
                    self.len
                ),
            ));
        }
        Ok((self.offset + at, len))
    }
}

/// `obj` as memory a transfer may use with `access`.
pub fn target(py: Python<'_>, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Target> {
    if let Ok(m) = obj.cast::<Memory>() {
        let mem = m.get().mem.clone();
        let len = mem.len();
        return Ok(Target {
            mem,
            offset: 0,
            len,
        });
    }
    if let Ok(v) = obj.cast::<MemoryView>() {
        let v = v.get();
        return Ok(Target {
            mem: v.mem.clone(),
            offset: v.offset,
            len: v.len,
        });
    }
    // Some exporters (ctypes arrays) give no strides; a memoryview of them
    // does.
    let buffer = PyUntypedBuffer::get(obj).or_else(|e| {
        match py
            .import("builtins")
            .and_then(|b| b.getattr("memoryview"))
            .and_then(|mv| mv.call1((obj,)))
        {
            Ok(view) => PyUntypedBuffer::get(&view),
            Err(_) => Err(e),
        }
    });
    match buffer {
        Ok(buf) => return lend_buffer(py, buf, access),
        Err(e) if !has_dlpack(obj) => {
            return Err(PyTypeError::new_err(format!(
                "a {} is not memory p2pdma can use: it has neither the buffer protocol nor DLPack ({e})",
                type_name(obj)
            )))
        }
        Err(_) => {}
    }
    lend_dlpack(py, obj, access)
}

fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr("__dlpack__").unwrap_or(false)
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}

fn lend_buffer(py: Python<'_>, buf: PyUntypedBuffer, access: Access) -> PyResult<Target> {
    let format = buf.format().to_bytes();
    if format.contains(&b'O') {
        return Err(PyTypeError::new_err(
            "the buffer holds Python objects (format 'O'): raw bytes cannot be read into or written from it",
        ));
    }
    if !buf.is_c_contiguous() {
        return Err(errors::invalid(
            py,
            "the buffer is not C-contiguous: pass a contiguous array, or describe the layout with a Shape",
        ));
    }
    if access == Access::Write && buf.readonly() {
        return Err(errors::invalid(
            py,
            "the buffer is read-only: nothing can be read into it",
        ));
    }
    let len = buf.len_bytes();
    let ptr = buf.buf_ptr().cast::<u8>();
    let writable = !buf.readonly();
    // SAFETY: The exporter keeps `len` bytes at `ptr` valid (and writable,
    // unless read-only) until the buffer is released, which happens when
    // the loan, which owns it, is dropped. Contiguity is checked above.
    #[allow(unsafe_code)]
    let mem = unsafe { BorrowedHost::new(ptr, len, writable, Box::new(buf)) };
    Ok(Target {
        mem: Arc::new(mem),
        offset: 0,
        len,
    })
}

/// A DLPack tensor, held so its producer keeps the memory.
struct Held {
    _tensor: Mutex<ImportedDlpack>,
}

/// Refuses memory the CPU does not address, before asking for the tensor.
fn check_device(py: Python<'_>, obj: &Bound<'_, PyAny>, (kind, id): (u32, i32)) -> PyResult<()> {
    if kind == DLDeviceType::CPU.0 || kind == DLDeviceType::CUDAHOST.0 {
        return Ok(());
    }
    Err(errors::invalid(
        py,
        format!(
            "the {} lives on DLPack device type {kind} (id {id}), which this build cannot reach: only memory the CPU addresses (kDLCPU, kDLCUDAHost) and p2pdma.Memory are supported",
            type_name(obj),
        ),
    ))
}

fn lend_dlpack(py: Python<'_>, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Target> {
    if let Ok(device) = obj.call_method0("__dlpack_device__") {
        check_device(py, obj, device.extract()?)?;
    }
    let imported = dlpark::python::from_dlpack(obj.as_borrowed(), None, None)?;
    let (ptr, len, read_only) = {
        let t = imported
            .validate()
            .map_err(|e| errors::invalid(py, format!("the DLPack tensor is not valid: {e}")))?;
        let device = t.device();
        check_device(py, obj, (device.device_type.0, device.device_id))?;
        let compact = t
            .is_compact()
            .map_err(|e| errors::invalid(py, format!("the DLPack tensor's layout: {e}")))?;
        if !compact {
            return Err(errors::invalid(
                py,
                "the tensor is not contiguous: pass a contiguous tensor, or describe the layout with a Shape",
            ));
        }
        // SAFETY: The descriptor was validated; the pointer is only used
        // as an address for the loan below.
        #[allow(unsafe_code)]
        let ptr = unsafe { t.offset_bytes_ptr() }
            .map_err(|e| errors::invalid(py, format!("the DLPack tensor's data: {e}")))?;
        let read_only = imported.flags().contains(dlpark::DlpackFlags::READ_ONLY);
        (ptr.cast_mut(), t.num_bytes(), read_only)
    };
    if access == Access::Write && read_only {
        return Err(errors::invalid(
            py,
            "the tensor is read-only: nothing can be read into it",
        ));
    }
    // SAFETY: The producer keeps the tensor's `len` bytes at `ptr` until
    // the managed tensor is deleted, which happens when the loan, which
    // owns it, is dropped. The CPU addresses the memory (device checked),
    // and it is contiguous (checked).
    #[allow(unsafe_code)]
    let mem = unsafe {
        BorrowedHost::new(
            ptr,
            len,
            !read_only,
            Box::new(Held {
                _tensor: Mutex::new(imported),
            }),
        )
    };
    Ok(Target {
        mem: Arc::new(mem),
        offset: 0,
        len,
    })
}
