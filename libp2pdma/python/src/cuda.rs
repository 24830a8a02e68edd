//! CUDA device memory that Python objects lend, and the stream order
//! around it.
//!
//! A torch or CuPy tensor on the GPU, or any object with
//! `__cuda_array_interface__` or a `kDLCUDA` DLPack export, becomes a
//! [`CudaMemory`] lent together with what keeps it alive ([`lend`]). The
//! driver is asked what the pointer is, so host memory passed off as
//! device memory is refused, and a process without a driver gets
//! `CudaUnavailableError`.
//!
//! The producer's work on the memory may still be queued on one of its
//! streams (a kernel that fills a tensor about to be written to a file, or
//! one that still reads a tensor about to be overwritten). The engine's
//! copies run on streams of their own that do not wait for anyone else's,
//! so once the memory is lent, and before a transfer uses it, the
//! producer's stream is waited for: the stream the interface names,
//! torch's current stream, or for DLPack the legacy default stream, which
//! the producer is asked to order its work before ([`ConsumerStream`]).
//! When a transfer returns, the data has landed: every copy of the
//! engine's is synchronized.

use std::{
    cell::Cell,
    ffi::c_void,
    sync::{Arc, Condvar, Mutex},
    time::Duration,
};

use dlpark::{
    ffi::{DLDevice, DLDeviceType},
    python::{consumer::stream, DlpackStream, StreamArg},
};
use p2pdma::{memory::CudaMemory, sys::cuda as driver, BorrowedHost, DeviceMemory};
use pyo3::{
    exceptions::{PyAttributeError, PyTypeError},
    intern,
    prelude::*,
    types::{PyDict, PyTuple},
};

use crate::errors;

/// The stream to wait for before lending memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Nothing to wait for (the producer said so, or the data is ready).
    Ready,
    /// The work queued so far on this `CUstream` (0: the legacy default
    /// stream; 2: the calling thread's per-thread default stream).
    Stream(usize),
}

/// `len` bytes of CUDA device memory at `ptr`, lent to the engine with
/// `keep` (the object, or its DLPack tensor) holding them alive, once
/// `order` is waited for. Zero bytes need no memory and no driver.
///
/// # Safety
///
/// As for [`CudaMemory::lend`]: `[ptr, ptr + len)` is device memory the
/// object owns and lends for transfers to write, allocated as long as
/// `keep` lives.
pub unsafe fn lend(
    py: Python<'_>,
    ptr: u64,
    len: usize,
    order: Order,
    keep: impl Send + Sync + 'static,
) -> PyResult<Arc<dyn DeviceMemory>> {
    if len == 0 {
        return Ok(Arc::new(empty()));
    }
    let mem = py
        // SAFETY: The caller's promise, passed on.
        .detach(|| unsafe { CudaMemory::lend(ptr, len, keep) })
        .map_err(|e| errors::to_py(py, &e, None, None))?;
    if let Order::Stream(s) = order {
        wait_for_stream(py, mem.ordinal(), s)?;
    }
    Ok(Arc::new(mem))
}

/// A loan of no bytes.
fn empty() -> BorrowedHost {
    // SAFETY: Zero bytes: nothing is ever read or written through the
    // (dangling, aligned, non-null) pointer.
    unsafe {
        BorrowedHost::new(
            std::ptr::NonNull::dangling().as_ptr(),
            0,
            true,
            Box::new(()),
        )
    }
}

/// Set by the driver's thread once a stream has reached the point
/// [`wait_for_stream`] marked.
#[derive(Default)]
struct Signal {
    done: Mutex<bool>,
    cv: Condvar,
}

/// Runs on a driver thread when the stream reaches it; calls no CUDA.
unsafe extern "C" fn signal(data: *mut c_void) {
    // SAFETY: `data` is the reference `wait_for_stream` leaked for this
    // call, taken back exactly once, here.
    let s = unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) };
    *s.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
    s.cv.notify_all();
}

/// How long a wait sleeps between looks for a signal (Ctrl-C).
const SLICE: Duration = Duration::from_millis(50);

/// Waits, with the GIL released, until the work queued so far on `stream`
/// of device `ordinal` has finished (`cuLaunchHostFunc`, which the calling
/// thread enqueues, so the per-thread default stream is this thread's).
pub fn wait_for_stream(py: Python<'_>, ordinal: i32, stream: usize) -> PyResult<()> {
    let fail = |e: p2pdma::Error| errors::to_py(py, &e, None, None);
    let ctx = driver::Context::primary(ordinal).map_err(fail)?;
    let s = Arc::new(Signal::default());
    {
        let entered = ctx.enter().map_err(fail)?;
        // An idle stream (the common case: the producer synchronized, or
        // queued nothing) costs one query, not a host function and a wait.
        // SAFETY: As for `launch_host_func` below.
        if unsafe { driver::stream_idle(&entered, stream as *mut c_void) }.map_err(fail)? {
            return Ok(());
        }
        let data = Arc::into_raw(s.clone()).cast_mut().cast::<c_void>();
        // SAFETY: `stream` is a stream of this device's primary context
        // (the producer's: torch and CuPy use primary contexts) or a
        // default-stream handle; `data` stays valid until `signal` takes
        // it back, and `signal` calls no CUDA.
        let launched =
            unsafe { driver::launch_host_func(&entered, stream as *mut c_void, signal, data) };
        if let Err(e) = launched {
            // SAFETY: Not launched: the leaked reference is still ours.
            drop(unsafe { Arc::from_raw(data.cast_const().cast::<Signal>()) });
            return Err(fail(e));
        }
    }
    loop {
        let done = py.detach(|| {
            let done = s.done.lock().unwrap_or_else(|p| p.into_inner());
            let (done, _) =
                s.cv.wait_timeout_while(done, SLICE, |d| !*d)
                    .unwrap_or_else(|p| p.into_inner());
            *done
        });
        if done {
            return Ok(());
        }
        py.check_signals()?;
    }
}

/// The consumer's side of a `kDLCUDA` DLPack import: it asks the producer
/// to order its work before the legacy default stream (`stream=1`), or,
/// through the DLPack C exchange API, is told the producer's stream; the
/// stream to wait for is then [`ConsumerStream::order`].
#[derive(Default)]
pub struct ConsumerStream {
    producer: Cell<Option<usize>>,
}

impl ConsumerStream {
    /// What to wait for once the tensor is imported.
    pub fn order(&self) -> Order {
        Order::Stream(self.producer.get().unwrap_or(0))
    }
}

// SAFETY: The argument is the legacy default stream's sentinel (1), valid
// for any CUDA device at any time, and nothing for other devices.
unsafe impl DlpackStream for ConsumerStream {
    fn as_python_arg(&self, _py: Python<'_>, device: DLDevice) -> PyResult<StreamArg> {
        Ok(match device.device_type {
            DLDeviceType::CUDA => stream::cuda(std::ptr::null_mut()),
            _ => stream::none(),
        })
    }

    unsafe fn wait_for_producer(&self, _device: DLDevice, producer: *mut c_void) -> PyResult<bool> {
        // The wait itself comes after the import, with the GIL released.
        self.producer.set(Some(producer as usize));
        Ok(true)
    }
}

/// An object's `__cuda_array_interface__`, if it has one.
pub fn interface_of<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(intern!(obj.py(), "__cuda_array_interface__")) {
        Ok(i) => Ok(Some(i)),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What a `__cuda_array_interface__` describes.
#[derive(Debug)]
pub struct Interface {
    /// The device address of the first byte.
    pub ptr: u64,
    /// The bytes of the array.
    pub len: usize,
    /// Whether the producer says the array must not be written.
    pub readonly: bool,
    /// What to wait for before using it.
    pub order: Order,
}

/// Reads a `__cuda_array_interface__` (versions 2 and 3) of `what` (the
/// object's type, for messages): contiguous arrays only, not masked.
pub fn interface(py: Python<'_>, what: &str, cai: &Bound<'_, PyAny>) -> PyResult<Interface> {
    let d = cai.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "the {what}'s __cuda_array_interface__ is a {}, not a dict",
            type_name(cai)
        ))
    })?;
    let bad =
        |msg: String| errors::invalid(py, format!("the {what}'s __cuda_array_interface__: {msg}"));
    let item = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        d.get_item(key)?
            .ok_or_else(|| bad(format!("it has no \"{key}\"")))
    };
    let version: i64 = item("version")?
        .extract()
        .map_err(|_| bad("\"version\" is not an integer".into()))?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!(
            "version {version} is not one this binding reads (2 or 3)"
        )));
    }
    let shape: Vec<usize> = item("shape")?
        .extract()
        .map_err(|_| bad("\"shape\" is not a tuple of non-negative integers".into()))?;
    let typestr: String = item("typestr")?
        .extract()
        .map_err(|_| bad("\"typestr\" is not a string".into()))?;
    let itemsize = itemsize(&typestr).map_err(|m| {
        if m.contains("objects") {
            PyTypeError::new_err(format!("the {what}'s CUDA array {m}"))
        } else {
            bad(m)
        }
    })?;
    let data = item("data")?;
    let data = data
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 2)
        .ok_or_else(|| bad("\"data\" is not a tuple (pointer, read-only)".into()))?;
    let ptr: u64 = data
        .get_item(0)?
        .extract()
        .map_err(|_| bad("the data pointer is not a non-negative integer".into()))?;
    let readonly = data.get_item(1)?.is_truthy()?;
    if d.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(bad(
            "the array is masked: only plain arrays can be read into or written from".into(),
        ));
    }
    let len = shape
        .iter()
        .try_fold(itemsize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            bad(format!(
                "shape {shape:?} of {itemsize}-byte items is too large"
            ))
        })?;
    if let Some(strides) = d.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = strides
            .extract()
            .map_err(|_| bad("\"strides\" is neither None nor a tuple of integers".into()))?;
        if strides.len() != shape.len() {
            return Err(bad(format!(
                "{} strides for {} dimensions",
                strides.len(),
                shape.len()
            )));
        }
        if len != 0 && !c_contiguous(&shape, &strides, itemsize) {
            return Err(errors::invalid(
                py,
                format!(
                    "the {what}'s CUDA array is not contiguous (strides {strides:?} for shape {shape:?}): pass a contiguous array"
                ),
            ));
        }
    }
    let order = match d.get_item("stream")?.filter(|s| !s.is_none()) {
        None => Order::Ready,
        Some(s) => match s.extract::<i64>() {
            // The interface's sentinels: 1 the legacy default stream (the
            // driver's null stream), 2 the per-thread default stream.
            Ok(1) => Order::Stream(0),
            Ok(s) if s >= 2 => Order::Stream(s as usize),
            Ok(0) => {
                return Err(bad(
                    "stream 0 is ambiguous and the interface disallows it (1: the legacy default stream, 2: the per-thread default stream)".into(),
                ))
            }
            _ => {
                return Err(bad(
                    "\"stream\" is neither None nor a stream handle".into(),
                ))
            }
        },
    };
    Ok(Interface {
        ptr,
        len,
        readonly,
        order,
    })
}

/// The size of one item of `typestr` (`"<f4"`, `"|u1"`, ...), or why not.
fn itemsize(typestr: &str) -> Result<usize, String> {
    let b = typestr.as_bytes();
    if b.len() < 3 {
        return Err(format!(
            "typestr {typestr:?} is not <byte order><kind><size>"
        ));
    }
    let (order, kind, digits) = (b[0], b[1], &b[2..]);
    if !b"<>|=".contains(&order) {
        return Err(format!(
            "typestr {typestr:?} has no byte order (<, >, | or =)"
        ));
    }
    if kind == b'O' {
        return Err(format!(
            "holds Python objects (typestr {typestr:?}): raw bytes cannot be read into or written from it"
        ));
    }
    if !b"biufcmMV".contains(&kind) {
        return Err(format!("typestr {typestr:?} has an unknown kind"));
    }
    std::str::from_utf8(digits)
        .ok()
        .filter(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|d| d.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("typestr {typestr:?} has no item size"))
}

/// Whether `strides` (in bytes) lay `shape` out densely in C order.
fn c_contiguous(shape: &[usize], strides: &[i64], itemsize: usize) -> bool {
    let mut expected = itemsize as i64;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(n as i64);
    }
    true
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".into())
}
