//! Zero-copy with the rest of Linux from C: dma-buf export and import, the reverse lookup,
//! fences as file descriptors, and passing descriptors to another process.
//!
//! Descriptors cross this API as plain `int`s. One this library returns is the caller's to
//! close; one the caller passes in stays the caller's (the library takes its own copy where it
//! keeps one).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use udma::dmabuf::{self, DmaBuf, Importers};
use udma::fence::Fence;
use udma::memory::PageSize;
use udma::share::{self, Received, Record};

use crate::abi;
use crate::device::{device, udma_device};
use crate::error::{call, lib, udma_status, Fail};
use crate::memory::{udma_buffer, udma_mapping, MAPPINGS};
use crate::pipeline::udma_pipeline;

/// `udma_dmabuf_export_*` flag: every importer only DMAs through the buffer (a NIC, a GPU, a
/// device's DMA engine), none maps it into the kernel; allows memory in huge pages on kernels
/// whose udmabuf maps huge pages into the kernel wrongly (before 6.17).
pub const UDMA_DMABUF_DMA_ONLY: u32 = 1;

/// A descriptor argument: non-negative and open.
fn borrowed(fd: i32, what: &str) -> Result<BorrowedFd<'static>, Fail> {
    if fd < 0 {
        return Err(Fail::invalid(format!(
            "{what} {fd} is not a file descriptor"
        )));
    }
    // SAFETY: F_GETFD reads only the descriptor table; a closed number is EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(Fail::invalid(format!(
            "{what} {fd} is not an open file descriptor"
        )));
    }
    // SAFETY: open, checked just now; the caller keeps it open for the call (every function
    // here uses it only during the call).
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

fn importers(flags: u32) -> Result<Importers, Fail> {
    match flags {
        0 => Ok(Importers::Any),
        UDMA_DMABUF_DMA_ONLY => Ok(Importers::DmaOnly),
        other => Err(Fail::invalid(format!(
            "flags {other:#x}: the only flag is UDMA_DMABUF_DMA_ONLY (1)"
        ))),
    }
}

fn system(what: &str, error: std::io::Error) -> Fail {
    Fail::new(udma_status::UDMA_ERR_SYSTEM, format!("{what}: {error}"))
}

/// Makes a dma-buf of `bytes` at `offset` of a mapping's memory (page-aligned; the memory of
/// `udma_memory_map`, which lives in a memfd) through `/dev/udmabuf`, and sets `*fd` to it
/// (the caller closes it). `flags`: 0, or `UDMA_DMABUF_DMA_ONLY`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range not page-aligned or outside the mapping,
/// or memory not in a memfd (`udma_memory_map_user`'s); `UDMA_ERR_REFUSED` for memory in huge
/// pages without `UDMA_DMABUF_DMA_ONLY` on a kernel that maps them wrongly;
/// `UDMA_ERR_UNSUPPORTED` for a kernel without udmabuf.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_dmabuf_export_mapping(
    mapping: *const udma_mapping,
    offset: u64,
    bytes: u64,
    flags: u32,
    fd: *mut i32,
) -> udma_status {
    call("udma_dmabuf_export_mapping", || {
        let out = abi::out(fd, "fd")?;
        let importers = importers(flags)?;
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let (offset, len) = match (usize::try_from(offset), usize::try_from(bytes)) {
            (Ok(o), Ok(l)) => (o, l),
            _ => return Err(Fail::invalid("offset or bytes is too large")),
        };
        let export =
            dmabuf::export_range(m.mapping.region(), offset, len, importers).map_err(lib)?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(export.into_dmabuf().into_fd().into_raw_fd()) };
        Ok(())
    })
}

/// Makes a dma-buf of a pool buffer's whole block (its capacity) and sets `*fd` to it (the
/// caller closes it): for an importer that fills the buffer (V4L2 capture into it). The
/// buffer must be on the host, start on a page and hold whole pages (a buffer of a page or
/// more from a pool without colouring). `flags` as `udma_dmabuf_export_mapping`'s.
///
/// Errors: as `udma_dmabuf_export_mapping`; `UDMA_ERR_BUSY` for a buffer in a queue.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_dmabuf_export_buffer(
    buffer: *const udma_buffer,
    flags: u32,
    fd: *mut i32,
) -> udma_status {
    call("udma_dmabuf_export_buffer", || {
        let out = abi::out(fd, "fd")?;
        let importers = importers(flags)?;
        let export = crate::memory::with_host_buffer(buffer, |owned| {
            let region = owned.mapping().region();
            dmabuf::export_range(region, owned.offset(), owned.capacity(), importers).map_err(lib)
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(export.into_dmabuf().into_fd().into_raw_fd()) };
        Ok(())
    })
}

/// Maps another exporter's dma-buf `fd` (the caller keeps `fd`; the library takes its own
/// copy) into the device's DMA space for the device to use as `access` (a `udma_access`) says,
/// as a mapping (`udma_mapping_get_info` gives its IOVA; its host address is valid where the
/// exporter allows a CPU mapping). A dma-buf this library exported maps as its own memory.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an `fd` that is not a dma-buf;
/// `UDMA_ERR_UNSUPPORTED` when the kernel cannot pin this dma-buf for this kind of DMA space
/// (the message names the kernel feature and release that would).
///
/// # Safety
/// `mapping` points to a writable `udma_mapping *`.
#[no_mangle]
pub unsafe extern "C" fn udma_dmabuf_import(
    device: *const udma_device,
    fd: i32,
    access: u32,
    mapping: *mut *mut udma_mapping,
) -> udma_status {
    call("udma_dmabuf_import", || {
        let out = abi::out(mapping, "mapping")?;
        let access = crate::memory::access(access)?;
        let d = self::device(device)?;
        let own = borrowed(fd, "fd")?
            .try_clone_to_owned()
            .map_err(|e| system("dup of the dma-buf", e))?;
        let buf = DmaBuf::from_fd(own).map_err(lib)?;
        let imported = dmabuf::import(d.runtime.dma_space().as_ref(), &buf, access)
            .map_err(|e| lib(e).context(&d.name))?;
        let (offset, len) = (imported.offset(), imported.len());
        let m = imported.into_mapping();
        crate::memory::register_part(m, offset, len, &d.name, out)
    })
}

/// The reverse lookup: if dma-buf `fd` is one this process exported and its memory is still
/// mapped, sets `*host` to the host address of its first byte (compare it with
/// `udma_buffer_info.host` or a mapping's) and `*len` to its length.
///
/// Errors: `UDMA_ERR_NOT_FOUND` for a dma-buf this process did not export (or whose memory is
/// gone); `UDMA_ERR_INVALID_ARGUMENT` for an `fd` that is not a dma-buf.
///
/// # Safety
/// `host` points to a writable `void *`; `len` to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_dmabuf_origin(
    fd: i32,
    host: *mut *mut c_void,
    len: *mut u64,
) -> udma_status {
    call("udma_dmabuf_origin", || {
        let host_out = abi::out(host, "host")?;
        let len_out = abi::out(len, "len")?;
        let own = borrowed(fd, "fd")?
            .try_clone_to_owned()
            .map_err(|e| system("dup of the dma-buf", e))?;
        let buf = DmaBuf::from_fd(own).map_err(lib)?;
        let found = dmabuf::origin(&buf).and_then(|o| {
            let (offset, bytes) = o.contiguous()?;
            Some((o.region.as_ptr().as_ptr().wrapping_add(offset), bytes))
        });
        let Some((ptr, bytes)) = found else {
            return Err(Fail::new(
                udma_status::UDMA_ERR_NOT_FOUND,
                format!(
                    "dma-buf {fd} ({} bytes, from {}) is not one this process exported from \
                     memory it still holds",
                    buf.len(),
                    buf.exporter()
                        .unwrap_or_else(|| "an unknown exporter".into())
                ),
            ));
        };
        // SAFETY: both checked non-null; writable per this function's contract.
        unsafe {
            host_out.write(ptr.cast());
            len_out.write(bytes as u64);
        }
        Ok(())
    })
}

/// A new fence (an eventfd), unsignalled; `*fd` is the caller's to close, poll, or pass to
/// another process.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_fence_create(fd: *mut i32) -> udma_status {
    call("udma_fence_create", || {
        let out = abi::out(fd, "fd")?;
        let fence = Fence::new().map_err(lib)?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(fence.into_fd().into_raw_fd()) };
        Ok(())
    })
}

/// Signals fence `fd` (an eventfd: one `udma_fence_create` made, or another process's): every
/// waiter in every process sees it signalled from now on.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a descriptor that is not open or not an eventfd
/// (another driver's `sync_file` signals itself).
///
/// # Safety
/// None (the descriptor is checked).
#[no_mangle]
pub unsafe extern "C" fn udma_fence_signal(fd: i32) -> udma_status {
    call("udma_fence_signal", || {
        borrowed_fence(fd)?.signal().map_err(lib)
    })
}

/// Waits until fence `fd` (an eventfd, a `sync_file`, any descriptor that becomes readable)
/// is signalled, at most `timeout_ns` nanoseconds (`UINT64_MAX`: no limit; 0: just look).
///
/// Errors: `UDMA_ERR_TIMEOUT` when it is not signalled in time; `UDMA_ERR_INVALID_ARGUMENT`
/// for a descriptor that is not open.
///
/// # Safety
/// None (the descriptor is checked).
#[no_mangle]
pub unsafe extern "C" fn udma_fence_wait(fd: i32, timeout_ns: u64) -> udma_status {
    call("udma_fence_wait", || {
        let timeout = (timeout_ns != u64::MAX).then(|| Duration::from_nanos(timeout_ns));
        borrowed_fence(fd)?.wait(timeout).map_err(lib)
    })
}

/// A `Fence` over the caller's descriptor, which the caller keeps: never dropped, so the
/// descriptor is not closed, whatever happens during the call.
fn borrowed_fence(fd: i32) -> Result<ManuallyDrop<Fence>, Fail> {
    let fd = borrowed(fd, "fd")?.as_raw_fd();
    // SAFETY: open (checked); the Fence is never dropped (ManuallyDrop), so this OwnedFd never
    // closes the caller's descriptor.
    Ok(ManuallyDrop::new(Fence::from_fd(unsafe {
        OwnedFd::from_raw_fd(fd)
    })))
}

/// A fence that signals when frame `frame` of the pipeline is done (handed to postprocessing,
/// or lost in a recovery); signalled already for a frame that is. `*fd` is the caller's.
///
/// Errors: `UDMA_ERR_BUSY` inside a callback; `UDMA_ERR_SYSTEM` when out of descriptors.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_pipeline_fence(
    pipeline: *mut udma_pipeline,
    frame: u64,
    fd: *mut i32,
) -> udma_status {
    call("udma_pipeline_fence", || {
        let out = abi::out(fd, "fd")?;
        let fence =
            crate::pipeline::with_pipeline(pipeline, |p| p.fence(frame).map_err(Fail::from))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(fence.into_fd().into_raw_fd()) };
        Ok(())
    })
}

/// What a `udma_share_item` is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_share_kind {
    /// A region's memfd (`udma_mapping_fd`): `len` bytes of `page_size` pages.
    UDMA_SHARE_REGION = 1,
    /// A dma-buf of `len` bytes.
    UDMA_SHARE_DMABUF = 2,
    /// A fence.
    UDMA_SHARE_FENCE = 3,
}

/// One descriptor passed to or from another process, and what it is.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_share_item {
    /// A `udma_share_kind`.
    pub kind: u32,
    /// The descriptor (sent: the caller's, kept; received: the caller's to close).
    pub fd: i32,
    /// Bytes (regions and dma-bufs; 0 for fences).
    pub len: u64,
    /// A `udma_page_size` (regions; 0 otherwise).
    pub page_size: u32,
    /// Zero.
    pub reserved: u32,
}

/// The most items one message carries.
pub const UDMA_SHARE_MAX_ITEMS: usize = 16;
const _: () = assert!(UDMA_SHARE_MAX_ITEMS == share::MAX_ITEMS);

/// Sends `count` items (1 to `UDMA_SHARE_MAX_ITEMS`) as one message on Unix socket `socket`
/// (a `SOCK_SEQPACKET` or datagram socket keeps messages whole). The message is checked as
/// the receiver will check it before it is sent.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a bad count, kind, length or page size, a closed
/// descriptor, or a dma-buf item whose descriptor is not a dma-buf of that length; `UDMA_ERR_SYSTEM` when the socket refuses.
///
/// # Safety
/// `items` points to `count` readable items.
#[no_mangle]
pub unsafe extern "C" fn udma_share_send(
    socket: i32,
    items: *const udma_share_item,
    count: usize,
) -> udma_status {
    call("udma_share_send", || {
        if items.is_null() {
            return Err(Fail::null("items"));
        }
        if count == 0 || count > share::MAX_ITEMS {
            return Err(Fail::invalid(format!(
                "count {count}: a message carries 1 to {} items",
                share::MAX_ITEMS
            )));
        }
        let socket = borrowed(socket, "socket")?;
        // SAFETY: non-null, `count` readable items per this function's contract.
        let items = unsafe { std::slice::from_raw_parts(items, count) };
        let mut records = Vec::with_capacity(count);
        for (i, item) in items.iter().enumerate() {
            let kind = match item.kind {
                1 => share::KIND_REGION,
                2 => share::KIND_DMABUF,
                3 => share::KIND_FENCE,
                other => {
                    return Err(Fail::invalid(format!(
                        "items[{i}].kind {other} is not a udma_share_kind (1 region, 2 \
                         dma-buf, 3 fence)"
                    )))
                }
            };
            let page_size = if kind == share::KIND_REGION {
                Some(crate::memory::page_size_of(item.page_size)?)
            } else {
                None
            };
            let fd = borrowed(item.fd, &format!("items[{i}].fd"))?;
            records.push((
                Record {
                    kind,
                    page_size,
                    len: item.len,
                },
                fd,
            ));
        }
        share::send_records(socket, &records).map_err(lib)
    })
}

/// Receives one message from Unix socket `socket` into `items` (room for `capacity`) and sets
/// `*count`; every received descriptor is the caller's to close. Blocks as the socket does.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a capacity of 0 (nothing is read), a malformed
/// message (every descriptor it brought is closed) or one with more items than `capacity`
/// (the same); `UDMA_ERR_NOT_FOUND` when the
/// peer closed the socket; `UDMA_ERR_SYSTEM` when the socket fails.
///
/// # Safety
/// `items` points to `capacity` writable items; `count` to a writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_share_recv(
    socket: i32,
    items: *mut udma_share_item,
    capacity: usize,
    count: *mut usize,
) -> udma_status {
    call("udma_share_recv", || {
        let items = abi::out(items, "items")?;
        let count = abi::out(count, "count")?;
        // Refused before the socket is read: no message fits, and one taken would be lost.
        if capacity == 0 {
            return Err(Fail::invalid(
                "capacity is 0: pass room for up to UDMA_SHARE_MAX_ITEMS items",
            ));
        }
        let socket = borrowed(socket, "socket")?;
        let received = share::recv(socket).map_err(lib)?;
        if received.len() > capacity {
            return Err(Fail::invalid(format!(
                "the message carries {} items, more than the {capacity} there is room for \
                 (its descriptors were closed)",
                received.len()
            )));
        }
        let n = received.len();
        for (i, item) in received.into_iter().enumerate() {
            let value = match item {
                Received::Region { fd, len, page_size } => udma_share_item {
                    kind: udma_share_kind::UDMA_SHARE_REGION as u32,
                    fd: fd.into_raw_fd(),
                    len: len as u64,
                    page_size: match page_size {
                        PageSize::Base => 0,
                        PageSize::Huge2M => 1,
                        PageSize::Huge1G => 2,
                    },
                    reserved: 0,
                },
                Received::DmaBuf(buf) => udma_share_item {
                    kind: udma_share_kind::UDMA_SHARE_DMABUF as u32,
                    len: buf.len() as u64,
                    fd: buf.into_fd().into_raw_fd(),
                    page_size: 0,
                    reserved: 0,
                },
                Received::Fence(fence) => udma_share_item {
                    kind: udma_share_kind::UDMA_SHARE_FENCE as u32,
                    fd: fence.into_fd().into_raw_fd(),
                    len: 0,
                    page_size: 0,
                    reserved: 0,
                },
            };
            // SAFETY: `i < n <= capacity`, inside the caller's array per this contract.
            unsafe { items.add(i).write(value) };
        }
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { count.write(n) };
        Ok(())
    })
}
