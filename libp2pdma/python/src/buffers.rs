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
//!    same way; or whose memory is CUDA device memory (`kDLCUDA`): device
//!    memory lent ([`cuda`](crate::cuda));
//! 4. an object with `__cuda_array_interface__` (CuPy, numba): device
//!    memory lent the same way.
//!
//! torch tensors on the CPU or a CUDA device are read directly (`data_ptr`,
//! `nbytes`), which costs less than DLPack per call.
//!
//! Lent memory travels with what keeps it alive (the `Py_buffer`, the
//! DLPack capsule's tensor, the object), so a transfer still in flight
//! when the caller lets go of the object writes into live memory.

use std::sync::{Arc, Mutex};

use dlpark::{
    ffi::DLDeviceType,
    python::{DlpackStream, ImportRequest, ImportedDlpack},
};
use p2pdma::{BorrowedHost, DeviceMemory};
use pyo3::{
    buffer::PyUntypedBuffer, exceptions::PyTypeError, ffi, intern, prelude::*, sync::PyOnceLock,
    types::PyType,
};

use crate::{
    cuda::{self, ConsumerStream, Order},
    errors,
};

/// Accelerator memory, CUDA device memory or the host-memory device; its
/// Python methods are in `memory`.
#[pyclass(frozen, module = "p2pdma")]
pub struct Memory {
    pub mem: Arc<dyn DeviceMemory>,
    /// The device address of byte 0 of CUDA memory, which has no CPU
    /// address: what its DLPack export points at.
    pub device_ptr: Option<u64>,
}

/// A range of a [`Memory`]: through its CPU mapping (`kDLCPU`), or on the
/// device for CUDA memory (`kDLCUDA`); its Python methods are in `memory`.
#[pyclass(frozen, module = "p2pdma")]
pub struct MemoryView {
    pub mem: Arc<dyn DeviceMemory>,
    pub offset: usize,
    pub len: usize,
    /// The address of its first byte: the CPU's, or the device's for CUDA
    /// memory.
    pub ptr: usize,
    /// The CUDA device whose address `ptr` is; `None`: a CPU address.
    pub cuda: Option<i32>,
}

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
    /// The range a call asks for ([`span`]).
    pub fn span(&self, py: Python<'_>, at: usize, size: Option<usize>) -> PyResult<(usize, usize)> {
        span(py, self.offset, self.len, at, size)
    }
}

/// Memory for one transfer made while the caller waits: borrowed for the
/// call only, so lending it allocates nothing.
pub struct Lent<'a> {
    pub mem: &'a dyn DeviceMemory,
    pub offset: usize,
    pub len: usize,
}

impl Lent<'_> {
    /// The range a call asks for ([`span`]).
    pub fn span(&self, py: Python<'_>, at: usize, size: Option<usize>) -> PyResult<(usize, usize)> {
        span(py, self.offset, self.len, at, size)
    }
}

/// The range a call asks for: `size` bytes (all that is left when `None`)
/// from `at` within a target of `len` bytes at `offset` of its memory, as
/// an offset in the memory and a length.
fn span(
    py: Python<'_>,
    offset: usize,
    len: usize,
    at: usize,
    size: Option<usize>,
) -> PyResult<(usize, usize)> {
    if at > len {
        return Err(errors::invalid(
            py,
            format!("buffer offset {at} is past the buffer's {len} bytes"),
        ));
    }
    let n = size.unwrap_or(len - at);
    if n > len - at {
        return Err(errors::invalid(
            py,
            format!("{n} bytes from offset {at} do not fit in the buffer's {len} bytes"),
        ));
    }
    Ok((offset + at, n))
}

/// Runs `f` on `obj` as memory for a transfer the caller waits for. A
/// contiguous buffer is exported for the call only and released after it,
/// with no allocation; other objects go through [`target`].
pub fn with_lent<R>(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    access: Access,
    f: impl FnOnce(Lent<'_>) -> PyResult<R>,
) -> PyResult<R> {
    if !obj.is_instance_of::<Memory>()
        && !obj.is_instance_of::<MemoryView>()
        && !is_torch_tensor(py, obj)
    {
        let mut view = ffi::Py_buffer::new();
        if take_contiguous(obj, access, &mut view) {
            let export = Released(&mut view);
            let (ptr, len) = (export.0.buf.cast::<u8>(), export.0.len as usize);
            // SAFETY: The exporter keeps `len` contiguous bytes at `ptr`
            // (writable unless read-only) until the release, which comes
            // after the loan is dropped, at the end of this block.
            let mem = unsafe { BorrowedHost::new(ptr, len, export.0.readonly == 0, Box::new(())) };
            let r = f(Lent {
                mem: &mem,
                offset: 0,
                len,
            });
            drop(mem);
            drop(export);
            return r;
        }
    }
    let t = target(py, obj, access)?;
    f(Lent {
        mem: &*t.mem,
        offset: t.offset,
        len: t.len,
    })
}

/// Releases a buffer export when dropped (the GIL is held wherever one
/// is).
struct Released<'a>(&'a mut ffi::Py_buffer);

impl Drop for Released<'_> {
    fn drop(&mut self) {
        // SAFETY: The export was taken and not released yet; this runs
        // where the export was taken, with the GIL held.
        unsafe { ffi::PyBuffer_Release(self.0) };
    }
}

/// Takes a contiguous export of `obj` into `view` (writable for
/// `Access::Write`), with no shape or strides, which keeps the call cheap
/// (numpy builds no buffer description). Says whether it did; an export
/// of Python objects is released and refused (the full export says why).
fn take_contiguous(obj: &Bound<'_, PyAny>, access: Access, view: &mut ffi::Py_buffer) -> bool {
    let flags = ffi::PyBUF_FORMAT
        | match access {
            Access::Write => ffi::PyBUF_WRITABLE,
            Access::Read => ffi::PyBUF_SIMPLE,
        };
    // SAFETY: `obj` is a live object and the GIL is held (through `obj`);
    // `view` is writable storage for one export.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view, flags) } != 0 {
        // The full export raises the error that says why.
        // SAFETY: The GIL is held; the failed call set an error.
        unsafe { ffi::PyErr_Clear() };
        return false;
    }
    // SAFETY: A format the exporter gives is a NUL-terminated string that
    // lives as long as the export.
    let holds_objects = !view.format.is_null()
        && unsafe { std::ffi::CStr::from_ptr(view.format) }
            .to_bytes()
            .contains(&b'O');
    if holds_objects {
        drop(Released(view));
    }
    !holds_objects
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
    if is_torch_tensor(py, obj) {
        return lend_torch(py, obj, access);
    }
    if let Some(export) = Export::contiguous(obj, access) {
        return Ok(export.lend());
    }
    if learn_torch(py, obj) {
        return lend_torch(py, obj, access);
    }
    // The export with every detail, for the exporters the quick one does
    // not serve and to say what is wrong. Some (ctypes arrays) give no
    // strides; a memoryview of them does.
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
    let e = match buffer {
        Ok(buf) => return lend_buffer(py, buf, access),
        Err(e) => e,
    };
    if has_dlpack(obj) {
        return lend_dlpack(py, obj, access);
    }
    if let Some(cai) = cuda::interface_of(obj)? {
        return lend_cuda_interface(py, obj, &cai, access);
    }
    Err(PyTypeError::new_err(format!(
        "a {} is not memory p2pdma can use: it has neither the buffer protocol, DLPack nor __cuda_array_interface__ ({e})",
        type_name(obj)
    )))
}

/// `torch.Tensor`, once a tensor has been seen (torch is never imported
/// here).
static TORCH_TENSOR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn is_torch_tensor(py: Python<'_>, obj: &Bound<'_, PyAny>) -> bool {
    TORCH_TENSOR
        .get(py)
        .is_some_and(|t| obj.is_instance(t.bind(py)).unwrap_or(false))
}

/// Whether `obj` is a torch tensor, remembering `torch.Tensor` if so.
fn learn_torch(py: Python<'_>, obj: &Bound<'_, PyAny>) -> bool {
    let from_torch = obj.get_type().module().is_ok_and(|m| {
        m.to_str()
            .is_ok_and(|m| m == "torch" || m.starts_with("torch."))
    });
    if !from_torch {
        return false;
    }
    let Ok(tensor) = py
        .import("torch")
        .and_then(|t| t.getattr("Tensor"))
        .and_then(|t| Ok(t.cast_into::<PyType>()?))
    else {
        return false;
    };
    let _ = TORCH_TENSOR.set(py, tensor.unbind());
    is_torch_tensor(py, obj)
}

/// A torch tensor's memory, read from the tensor itself (`data_ptr`,
/// `nbytes`): DLPack gives the same answer at several times the cost per
/// call. Only dense CPU tensors (pinned ones included) and dense CUDA
/// tensors qualify; others go to DLPack, which says what is wrong.
fn lend_torch(py: Python<'_>, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Target> {
    let on_cpu = obj.getattr(intern!(py, "is_cpu"))?.is_truthy()?;
    let on_cuda = !on_cpu && obj.getattr(intern!(py, "is_cuda"))?.is_truthy()?;
    let dense = (on_cpu || on_cuda)
        && !obj.getattr(intern!(py, "is_sparse"))?.is_truthy()?
        && obj
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?;
    if !dense {
        return lend_dlpack(py, obj, access);
    }
    let ptr: usize = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    let len: usize = obj.getattr(intern!(py, "nbytes"))?.extract()?;
    let keep = obj.clone().unbind();
    if on_cuda {
        // The tensor's pending work is on torch's current stream of its
        // device; `cuda_stream` is 0 for the default (legacy) stream.
        let ordinal: i32 = obj
            .getattr(intern!(py, "device"))?
            .getattr(intern!(py, "index"))?
            .extract()?;
        let stream: usize = py
            .import(intern!(py, "torch.cuda"))?
            .call_method1(intern!(py, "current_stream"), (ordinal,))?
            .getattr(intern!(py, "cuda_stream"))?
            .extract()?;
        // SAFETY: A dense contiguous CUDA tensor's `nbytes` bytes at
        // `data_ptr()` stay allocated while the tensor lives, which the loan
        // ensures by holding it; the caller hands the tensor over for the
        // transfer.
        #[allow(unsafe_code)]
        let mem = unsafe { cuda::lend(py, ptr as u64, len, Order::Stream(stream), keep) }?;
        return Ok(Target {
            mem,
            offset: 0,
            len,
        });
    }
    // SAFETY: A dense contiguous CPU tensor's `nbytes` bytes at
    // `data_ptr()` stay allocated while the tensor lives, which the loan
    // ensures by holding it; torch tensors are writable.
    let mem = unsafe { BorrowedHost::new(ptr as *mut u8, len, true, Box::new(keep)) };
    Ok(Target {
        mem: Arc::new(mem),
        offset: 0,
        len,
    })
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

/// A contiguous buffer export ([`take_contiguous`]) that a transfer in the
/// background owns.
struct Export(Box<ffi::Py_buffer>);

// SAFETY: The export is plain data describing memory the exporter keeps
// until the release, which takes the GIL (below).
unsafe impl Send for Export {}
// SAFETY: As for `Send`; nothing mutates the export after it is taken.
unsafe impl Sync for Export {}

impl Export {
    fn contiguous(obj: &Bound<'_, PyAny>, access: Access) -> Option<Self> {
        let mut view = Box::new(ffi::Py_buffer::new());
        take_contiguous(obj, access, &mut view).then(|| Self(view))
    }

    fn lend(self) -> Target {
        let (ptr, len) = (self.0.buf.cast::<u8>(), self.0.len as usize);
        let writable = self.0.readonly == 0;
        // SAFETY: The exporter keeps `len` contiguous bytes at `ptr` (and
        // writable ones when not read-only) until the export is released,
        // which happens when the loan, which owns it, is dropped.
        let mem = unsafe { BorrowedHost::new(ptr, len, writable, Box::new(self)) };
        Target {
            mem: Arc::new(mem),
            offset: 0,
            len,
        }
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        // SAFETY: The export was taken and not yet released; the GIL is
        // held for the release.
        Python::attach(|_| unsafe { ffi::PyBuffer_Release(&mut *self.0) });
    }
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

/// Refuses memory that is neither addressed by the CPU nor CUDA device
/// memory, before asking for the tensor.
fn check_device(py: Python<'_>, obj: &Bound<'_, PyAny>, (kind, id): (u32, i32)) -> PyResult<()> {
    let kind = DLDeviceType(kind);
    if [
        DLDeviceType::CPU,
        DLDeviceType::CUDAHOST,
        DLDeviceType::CUDA,
    ]
    .contains(&kind)
    {
        return Ok(());
    }
    let what = type_name(obj);
    if kind == DLDeviceType::CUDAMANAGED {
        return Err(errors::invalid(
            py,
            format!(
                "the {what} is CUDA managed memory (kDLCUDAManaged, device {id}), which p2pdma does not take: the driver moves its pages between the host and the GPU; pass device memory (kDLCUDA) or host memory"
            ),
        ));
    }
    Err(errors::invalid(
        py,
        format!(
            "the {what} lives on DLPack device type {} (id {id}), which this build cannot reach: only memory the CPU addresses (kDLCPU, kDLCUDAHost), CUDA device memory (kDLCUDA) and p2pdma.Memory are supported",
            kind.0,
        ),
    ))
}

fn lend_dlpack(py: Python<'_>, obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Target> {
    let request = ImportRequest::new(obj.as_borrowed())?;
    // Capsules and producers without __dlpack_device__ say it on import.
    let device = request.device().ok();
    if let Some(d) = device {
        check_device(py, obj, (d.device_type.0, d.device_id))?;
    }
    let on_cuda = device.is_some_and(|d| d.device_type == DLDeviceType::CUDA);
    let consumer = ConsumerStream::default();
    let imported = request.import(on_cuda.then_some(&consumer as &dyn DlpackStream), None)?;
    let (ptr, len, read_only, on_cuda) = {
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
        let read_only = imported.flags().contains(dlpark::DlpackFlags::READ_ONLY);
        let on_cuda = device.device_type == DLDeviceType::CUDA;
        let ptr = if on_cuda {
            // A device address: never dereferenced here.
            (t.data_ptr() as u64).wrapping_add(t.byte_offset()) as *mut u8
        } else {
            // SAFETY: The descriptor was validated; the pointer is only
            // used as an address for the loan below.
            #[allow(unsafe_code)]
            let ptr = unsafe { t.offset_bytes_ptr() }
                .map_err(|e| errors::invalid(py, format!("the DLPack tensor's data: {e}")))?;
            ptr.cast_mut()
        };
        (ptr, t.num_bytes(), read_only, on_cuda)
    };
    if access == Access::Write && read_only {
        return Err(errors::invalid(
            py,
            "the tensor is read-only: nothing can be read into it",
        ));
    }
    if on_cuda {
        let keep = Held {
            _tensor: Mutex::new(imported),
        };
        // SAFETY: The producer keeps the tensor's `len` bytes at `ptr`
        // until the managed tensor, which the loan owns, is deleted; the
        // device memory is contiguous (checked) and writable unless
        // read-only (checked against the access above).
        #[allow(unsafe_code)]
        let mem = unsafe { cuda::lend(py, ptr as u64, len, consumer.order(), keep) }?;
        return Ok(Target {
            mem,
            offset: 0,
            len,
        });
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

/// An object's `__cuda_array_interface__` memory, lent with the object.
fn lend_cuda_interface(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    access: Access,
) -> PyResult<Target> {
    let what = type_name(obj);
    let i = cuda::interface(py, &what, cai)?;
    if access == Access::Write && i.readonly {
        return Err(errors::invalid(
            py,
            format!("the {what}'s CUDA array is read-only: nothing can be read into it"),
        ));
    }
    // SAFETY: The CUDA array interface's `len` bytes at `ptr` are the
    // object's, allocated as long as it lives, which the loan ensures by
    // holding it; a read-only array is refused for writes (above).
    #[allow(unsafe_code)]
    let mem = unsafe { cuda::lend(py, i.ptr, i.len, i.order, obj.clone().unbind()) }?;
    Ok(Target {
        mem,
        offset: 0,
        len: i.len,
    })
}
