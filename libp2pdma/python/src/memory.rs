//! Accelerator memory as a Python object.
//!
//! A [`Memory`] is accelerator BAR memory from the module, CUDA device
//! memory, or the host-memory device where there is no accelerator. It
//! says where it lives through DLPack: the host-memory device is `kDLCPU`;
//! BAR memory is `kDLExtDev` with the accelerator's index, because it is
//! not host memory and only this library moves data into it; CUDA memory
//! is `kDLCUDA` with the device's ordinal (and has
//! `__cuda_array_interface__`), so torch and CuPy take it as their own.
//! Where the CPU can map the memory (BAR memory is mapped write-combined,
//! gdrcopy-style), `view()` gives a [`MemoryView`] that is `kDLCPU`: numpy
//! and torch can read and write it through the mapping; a view of CUDA
//! memory is a range on the device (`kDLCUDA`).

use std::sync::Arc;

use dlpark::{
    ffi::{DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned},
    metadata::Fixed,
    python::{export_dlpack, DlpackExporter, ExportRequest},
    DlpackFlags, Managed, ManagedTensorBase,
};
use p2pdma::{
    memory::{self, CudaMemory, MemoryKind},
    DeviceMemory, HostMemory, ModuleMemory,
};
use pyo3::{exceptions::PyAttributeError, prelude::*, types::PyDict};

pub use crate::buffers::{Memory, MemoryView};
use crate::{
    buffers::{self, Access},
    engine, errors,
};

/// Where the memory lives, as DLPack says it.
fn device_of(mem: &dyn DeviceMemory) -> DLDevice {
    match mem.kind() {
        MemoryKind::Host => DLDevice::CPU,
        MemoryKind::ModuleBar { index, .. } => DLDevice {
            device_type: DLDeviceType::EXTDEV,
            device_id: index as i32,
        },
        MemoryKind::Cuda { ordinal, .. } => DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: ordinal,
        },
        MemoryKind::Dmabuf => DLDevice {
            device_type: DLDeviceType::EXTDEV,
            device_id: 0,
        },
    }
}

/// The memory's CPU mapping, if it has one: its first byte and length.
fn cpu_mapping(mem: &dyn DeviceMemory) -> Option<(*mut u8, usize)> {
    mem.dma()?.dma_target().map(|t| (t.ptr, t.len))
}

/// A one-dimensional `uint8` CUDA array interface (version 3) of `len`
/// bytes at device address `ptr`. No stream: the memory has no work
/// pending, every copy into it having been waited for.
fn cuda_interface(py: Python<'_>, ptr: usize, len: usize) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (ptr, false))?;
    d.set_item("strides", py.None())?;
    d.set_item("stream", py.None())?;
    d.set_item("version", 3)?;
    Ok(d)
}

#[pymethods]
impl Memory {
    /// `size` bytes of zeroed, page-aligned host memory standing in for an
    /// accelerator (the host-memory device).
    #[staticmethod]
    fn host(py: Python<'_>, size: usize) -> PyResult<Self> {
        if size == 0 {
            return Err(errors::invalid(py, "size is 0"));
        }
        let mem = py
            .detach(|| HostMemory::new(size))
            .map_err(|e| errors::to_py(py, &e, None, None))?;
        Ok(Self {
            mem: Arc::new(mem),
            device_ptr: None,
        })
    }

    /// `size` bytes of accelerator `index`'s memory from the p2pdma
    /// module, its bus address aligned to `align` (0: a page). The bytes
    /// are zeroed.
    #[staticmethod]
    #[pyo3(signature = (size, index = 0, align = 0))]
    fn accelerator(py: Python<'_>, size: u64, index: u32, align: u64) -> PyResult<Self> {
        let module = engine::module(py)?;
        let mem = py
            .detach(|| ModuleMemory::alloc(module, index, size, align))
            .map_err(|e| errors::to_py(py, &e, None, None))?;
        Ok(Self {
            mem: Arc::new(mem),
            device_ptr: None,
        })
    }

    /// `size` bytes of zeroed device memory on CUDA device `ordinal`
    /// (`cuMemAlloc` in the device's primary context, the one torch and
    /// CuPy use). Raises `CudaUnavailableError` where there is no CUDA
    /// driver or device.
    #[staticmethod]
    #[pyo3(signature = (size, ordinal = 0))]
    fn cuda(py: Python<'_>, size: usize, ordinal: i32) -> PyResult<Self> {
        if size == 0 {
            return Err(errors::invalid(py, "size is 0"));
        }
        let mem = py
            .detach(|| CudaMemory::alloc(ordinal, size))
            .map_err(|e| errors::to_py(py, &e, None, None))?;
        Ok(Self {
            device_ptr: Some(mem.device_ptr()),
            mem: Arc::new(mem),
        })
    }

    /// Size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.mem.len()
    }

    fn __len__(&self) -> usize {
        self.mem.len()
    }

    /// What the memory is, in words.
    #[getter]
    fn kind(&self) -> String {
        self.mem.kind().to_string()
    }

    /// `"cpu"` for the host-memory device, `"accel:N"` for accelerator N,
    /// `"cuda:N"` for CUDA device N.
    #[getter]
    fn device(&self) -> String {
        match self.mem.kind() {
            MemoryKind::Host => "cpu".into(),
            MemoryKind::ModuleBar { index, .. } => format!("accel:{index}"),
            MemoryKind::Cuda { ordinal, .. } => format!("cuda:{ordinal}"),
            MemoryKind::Dmabuf => "dmabuf".into(),
        }
    }

    /// Copies `buf` (any buffer or tensor, on the CPU or a CUDA device)
    /// into the memory at `offset`.
    #[pyo3(signature = (buf, offset = 0))]
    fn write(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, offset: usize) -> PyResult<usize> {
        let src = buffers::target(py, buf, Access::Read)?;
        copy(py, &*src.mem, src.offset, &*self.mem, offset, src.len)
    }

    /// Copies the memory at `offset` into `buf`, filling it.
    #[pyo3(signature = (buf, offset = 0))]
    fn read(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, offset: usize) -> PyResult<usize> {
        let dst = buffers::target(py, buf, Access::Write)?;
        copy(py, &*self.mem, offset, &*dst.mem, dst.offset, dst.len)
    }

    /// `size` bytes from `offset` as `bytes` (a copy).
    #[pyo3(signature = (offset = 0, size = None))]
    fn to_bytes(&self, py: Python<'_>, offset: usize, size: Option<usize>) -> PyResult<Vec<u8>> {
        let size = size.unwrap_or(self.mem.len().saturating_sub(offset));
        let mut out = vec![0u8; size];
        let mem = self.mem.clone();
        py.detach(|| mem.read_at(offset, &mut out))
            .map_err(|e| errors::to_py(py, &e, None, None))?;
        Ok(out)
    }

    /// A view of `size` bytes from `offset`: through the CPU mapping, for
    /// numpy and torch (`numpy.from_dlpack(mem.view())`), where reads and
    /// writes are CPU loads and stores on the memory; for CUDA memory, a
    /// range on the device (`torch.from_dlpack(mem.view(...))` is a CUDA
    /// tensor). Also a target for transfers, like the memory itself.
    #[pyo3(signature = (offset = 0, size = None))]
    fn view(&self, py: Python<'_>, offset: usize, size: Option<usize>) -> PyResult<MemoryView> {
        MemoryView::new(py, self.mem.clone(), self.device_ptr, offset, size)
    }

    /// CUDA memory as a one-dimensional `uint8` array of the CUDA array
    /// interface (CuPy, numba); other memory has none (`AttributeError`).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.device_ptr {
            Some(ptr) => cuda_interface(py, ptr as usize, self.mem.len()),
            None => Err(PyAttributeError::new_err(format!(
                "{} is not CUDA memory: it has no __cuda_array_interface__",
                self.mem.kind()
            ))),
        }
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        device_of(&*self.mem).into()
    }

    /// The whole memory as a one-dimensional `uint8` DLPack tensor on its
    /// own device (see `__dlpack_device__`).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let view = MemoryView::new(py, self.mem.clone(), self.device_ptr, 0, None)?;
        let export = Export {
            view: &view,
            device: device_of(&*self.mem),
        };
        let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
        export_dlpack(&export, py, request)
    }

    fn __repr__(&self) -> String {
        format!(
            "<p2pdma.Memory {} bytes of {}>",
            self.mem.len(),
            self.mem.kind()
        )
    }
}

fn copy(
    py: Python<'_>,
    from: &dyn DeviceMemory,
    from_offset: usize,
    to: &dyn DeviceMemory,
    to_offset: usize,
    len: usize,
) -> PyResult<usize> {
    py.detach(|| memory::copy(from, from_offset, to, to_offset, len))
        .map_err(|e| errors::to_py(py, &e, None, None))?;
    Ok(len)
}

impl MemoryView {
    /// A view of `mem` through its CPU mapping, or on the device at
    /// `device_ptr` for CUDA memory without one.
    fn new(
        py: Python<'_>,
        mem: Arc<dyn DeviceMemory>,
        device_ptr: Option<u64>,
        offset: usize,
        size: Option<usize>,
    ) -> PyResult<Self> {
        let (base, mapped, cuda) = match (cpu_mapping(&*mem), device_ptr, mem.kind()) {
            (Some((base, mapped)), _, _) => (base as usize, mapped, None),
            (None, Some(ptr), MemoryKind::Cuda { ordinal, .. }) => {
                (ptr as usize, mem.len(), Some(ordinal))
            }
            _ => {
                return Err(errors::invalid(
                    py,
                    format!("{} has no CPU mapping to view", mem.kind()),
                ))
            }
        };
        let len = size.unwrap_or(mapped.saturating_sub(offset));
        if offset.checked_add(len).is_none_or(|end| end > mapped) {
            return Err(errors::invalid(
                py,
                format!("{len} bytes at offset {offset} are outside the {mapped}-byte memory"),
            ));
        }
        Ok(Self {
            mem,
            offset,
            len,
            ptr: base + offset,
            cuda,
        })
    }
}

#[pymethods]
impl MemoryView {
    /// Size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.len
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// The viewed memory's offset.
    #[getter]
    fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the mapping is write-combined (accelerator BAR memory): CPU
    /// stores stream, CPU loads are uncached and slow.
    #[getter]
    fn write_combined(&self) -> bool {
        matches!(self.mem.kind(), MemoryKind::ModuleBar { .. })
    }

    /// The view as numpy's array interface (a `uint8` vector at its CPU
    /// address), for consumers that take that instead of DLPack, and for
    /// tools that need the address (ctypes, `/proc/self/pagemap`). A view
    /// of CUDA memory has none (`AttributeError`).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.cuda.is_some() {
            return Err(PyAttributeError::new_err(
                "a view of CUDA memory has no CPU address: use __cuda_array_interface__ or DLPack",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", (self.len,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }

    /// A view of CUDA memory as a one-dimensional `uint8` array of the CUDA
    /// array interface (CuPy, numba, and for the device address); views
    /// through the CPU mapping have none (`AttributeError`).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.cuda.is_none() {
            return Err(PyAttributeError::new_err(
                "a view through the CPU mapping has no __cuda_array_interface__: use __array_interface__ or DLPack",
            ));
        }
        cuda_interface(py, self.ptr, self.len)
    }

    fn __dlpack_device__(&self) -> (u32, i32) {
        self.device().into()
    }

    /// The range as a one-dimensional `uint8` DLPack tensor: on the CPU, or
    /// on the CUDA device for a view of CUDA memory.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let export = Export {
            view: self,
            device: self.device(),
        };
        let request = ExportRequest::parse(stream, max_version, dl_device, copy)?;
        export_dlpack(&export, py, request)
    }

    fn __repr__(&self) -> String {
        format!(
            "<p2pdma.MemoryView {} bytes at offset {} of {}>",
            self.len,
            self.offset,
            self.mem.kind()
        )
    }
}

impl MemoryView {
    /// Where the view's address lives, as DLPack says it.
    fn device(&self) -> DLDevice {
        match self.cuda {
            Some(ordinal) => DLDevice {
                device_type: DLDeviceType::CUDA,
                device_id: ordinal,
            },
            None => DLDevice::CPU,
        }
    }
}

/// One DLPack export of a view, on `device`.
struct Export<'a> {
    view: &'a MemoryView,
    device: DLDevice,
}

impl Export<'_> {
    fn tensor<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let len = i64::try_from(self.view.len)
            .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("the view is too large"))?;
        let keep = Box::new(self.view.mem.clone());
        let mut t = Fixed::new([len], [1])
            .prepare_as::<M>()
            .map_err(|e| pyo3::exceptions::PyMemoryError::new_err(e.to_string()))?
            .initialize(keep);
        t.set_data(self.view.ptr as *mut std::ffi::c_void)
            .set_dtype(DLDataType::U8)
            .set_device(self.device);
        // SAFETY: The data pointer is the mapping (or, on a CUDA device,
        // the device address) of `len` bytes the context (the memory's
        // Arc) keeps alive; shape and strides
        // describe exactly those bytes; no flags are claimed.
        #[allow(unsafe_code)]
        Ok(unsafe { t.finish() })
    }
}

impl DlpackExporter for Export<'_> {
    fn device(&self) -> DLDevice {
        self.device
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }

    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        if self.device.device_type == DLDeviceType::CUDA {
            // The consumer's stream needs no wait: nothing is pending on
            // the memory. The argument is still checked (0 is refused).
            request.cuda_stream()?;
        }
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.tensor()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.tensor()
    }
}
