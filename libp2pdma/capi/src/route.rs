//! Routes: a copy between any two places (a file or namespace, memory) by
//! way of staging places, every hop busy at once on different chunks.

use std::ffi::{c_char, c_int};

use p2pdma::{
    transfer::{End, RouteOptions, Via},
    MemRange,
};

use crate::{
    error::{status, Failure},
    p2pdma_engine, p2pdma_file, p2pdma_mem, raw,
};

/// What a place of a route is (`p2pdma_place.kind`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum p2pdma_place_kind {
    /// A file or block device (`file`), from byte `offset` on. Only as the
    /// source or the destination.
    P2PDMA_PLACE_STORAGE = 1,
    /// Memory (`mem`): an accelerator's, or the host-memory device. As an
    /// end, from byte `offset` on; as a staging place, the `len` bytes
    /// from `offset`.
    P2PDMA_PLACE_MEMORY = 2,
    /// Pinned host memory the library stages through (staging only).
    P2PDMA_PLACE_HOST = 3,
}

/// A place on a route.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct p2pdma_place {
    /// A `P2PDMA_PLACE_*` value.
    pub kind: c_int,
    /// The file, for `P2PDMA_PLACE_STORAGE`; else NULL.
    pub file: *const p2pdma_file,
    /// The memory, for `P2PDMA_PLACE_MEMORY`; else NULL.
    pub mem: *const p2pdma_mem,
    /// Where the route's bytes (or the staging region) start.
    pub offset: u64,
    /// The staging region's length, for memory between the ends.
    pub len: u64,
}

/// The most hops a route report describes one by one.
pub const P2PDMA_ROUTE_MAX_HOPS: usize = 8;

/// What a copy along a route did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct p2pdma_route_report {
    /// Bytes moved (the length asked for).
    pub bytes: u64,
    /// Hops of the route.
    pub hops: u32,
    /// Chunks the copy was cut into.
    pub chunks: u32,
    /// Bytes per chunk.
    pub chunk: u64,
    /// The whole copy's time, in nanoseconds.
    pub elapsed_ns: u64,
    /// Each hop's time moving chunks, in nanoseconds (the first
    /// `P2PDMA_ROUTE_MAX_HOPS` hops).
    pub hop_busy_ns: [u64; P2PDMA_ROUTE_MAX_HOPS],
}

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A place as the library takes it.
///
/// # Safety
///
/// `p.file` and `p.mem` must be NULL or live handles.
unsafe fn place<'a>(p: &p2pdma_place, end: bool) -> Result<Result<End<'a>, Via<'a>>, Failure> {
    let kind = p.kind;
    match kind {
        k if k == p2pdma_place_kind::P2PDMA_PLACE_STORAGE as c_int && end => {
            // SAFETY: The caller passes NULL or a live handle.
            let f = unsafe { raw::handle(p.file, "place.file") }?;
            Ok(Ok(End::Storage {
                file: &f.file,
                offset: p.offset,
            }))
        }
        k if k == p2pdma_place_kind::P2PDMA_PLACE_MEMORY as c_int => {
            // SAFETY: The caller passes NULL or a live handle.
            let m = unsafe { raw::handle(p.mem, "place.mem") }?;
            let offset = usize::try_from(p.offset)
                .map_err(|_| Failure::invalid("place.offset too large"))?;
            if end {
                return Ok(Ok(End::Memory {
                    mem: &*m.mem,
                    offset,
                }));
            }
            let len =
                usize::try_from(p.len).map_err(|_| Failure::invalid("place.len too large"))?;
            Ok(Err(Via::Memory(MemRange::new(&*m.mem, offset, len)?)))
        }
        k if k == p2pdma_place_kind::P2PDMA_PLACE_HOST as c_int && !end => Ok(Err(Via::Host)),
        k => Err(Failure::invalid(format!(
            "place kind {k} cannot be {}",
            if end {
                "an end of a route"
            } else {
                "a staging place"
            }
        ))),
    }
}

/// Copies `len` bytes from `src` to `dst` along a route: through the
/// `nvia` staging places `via`, in order, or, when `nvia` is 0, along the
/// route the library plans (storage straight into an accelerator by P2P
/// where the kernel allows it, through host memory otherwise; one
/// accelerator to another through host memory). Each hop is a stage of one
/// pipeline: the copy is cut into chunks of `chunk` bytes (0: chosen by the
/// library) and every hop works on a different chunk at once. When `report`
/// is not NULL it receives what the copy did; when `reason_buf` is not
/// NULL, up to `reason_len` bytes of the hops and why (NUL-terminated).
///
/// Returns 0 once every byte is in place, or a negative errno, with
/// `*report` zeroed: -EINVAL for NULL handles, unknown place kinds, storage
/// as a staging place or host memory as an end, two accelerators' memories
/// or two storage places side by side, staging too small for a chunk, or
/// ends too small for `len`; `P2PDMA_ERR_EOF` when the source ends early;
/// -EIO and others from storage.
///
/// # Safety
///
/// `engine` must be NULL or a live handle; `src` and `dst` NULL or valid
/// places; `via` NULL or `nvia` valid places; the handles inside them NULL
/// or live; `report` NULL or writable; `reason_buf` NULL or valid for
/// writing `reason_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn p2pdma_copy_route(
    engine: *const p2pdma_engine,
    src: *const p2pdma_place,
    via: *const p2pdma_place,
    nvia: usize,
    dst: *const p2pdma_place,
    len: u64,
    chunk: u64,
    report: *mut p2pdma_route_report,
    reason_buf: *mut c_char,
    reason_len: usize,
) -> c_int {
    status("p2pdma_copy_route", || {
        // SAFETY: The caller passes NULL or a writable report.
        let report = unsafe { raw::out_report(report, "report") }?;
        // SAFETY: The caller passes NULL or valid pointers and handles.
        let (e, src, dst, via) = unsafe {
            (
                raw::handle(engine, "engine")?,
                raw::handle(src, "src")?,
                raw::handle(dst, "dst")?,
                raw::structs(via, nvia, "via")?,
            )
        };
        // SAFETY: As above, for the handles inside the places.
        let (src, dst) = unsafe { (place(src, true)?, place(dst, true)?) };
        let (Ok(src), Ok(dst)) = (src, dst) else {
            return Err(Failure::invalid("an end of a route is storage or memory"));
        };
        let mut vias = Vec::with_capacity(via.len());
        for v in via {
            // SAFETY: As above.
            match unsafe { place(v, false) }? {
                Err(v) => vias.push(v),
                Ok(_) => return Err(Failure::invalid("a staging place is memory or host")),
            }
        }
        let routes = e.engine.routes();
        let route = match vias.is_empty() {
            true => routes.plan(src, dst),
            false => routes.plan_through(src, &vias, dst),
        }?;
        let len = usize::try_from(len).map_err(|_| Failure::invalid("len too large"))?;
        let opts = RouteOptions {
            chunk: match chunk {
                0 => None,
                c => Some(usize::try_from(c).map_err(|_| Failure::invalid("chunk too large"))?),
            },
            ..RouteOptions::default()
        };
        let done = routes
            .copy(&route, len, &opts)
            .map_err(Failure::from_read)?;
        let hops: Vec<String> = done.hops.iter().map(|h| h.to_string()).collect();
        let reason = format!("{}; why: {}", hops.join(", "), route.reason());
        // SAFETY: The caller passes NULL or `reason_len` writable bytes.
        unsafe { raw::copy_str(&reason, reason_buf, reason_len) }?;
        if let Some(out) = report {
            let mut busy = [0u64; P2PDMA_ROUTE_MAX_HOPS];
            for (b, d) in busy.iter_mut().zip(&done.busy) {
                *b = ns(*d);
            }
            *out = p2pdma_route_report {
                bytes: done.bytes,
                hops: done.hops.len() as u32,
                chunks: done.chunks as u32,
                chunk: done.chunk as u64,
                elapsed_ns: ns(done.elapsed),
                hop_busy_ns: busy,
            };
        }
        Ok(0)
    })
}
