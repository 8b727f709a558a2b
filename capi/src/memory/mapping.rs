//! Mappings (`udma_mapping`): pinned host memory mapped into a device's DMA space, made by
//! `udma_memory_map`, its addresses, and its destroy.

use std::ffi::c_void;
use std::sync::Arc;

use udma::dma;

use super::{bytes, page_size};
use crate::abi;
use crate::device::{device, udma_device};
use crate::error::{call, udma_status, Fail};
use crate::handle::{Kind, Registry};

/// Pinned host memory mapped into a device's DMA space, made by `udma_memory_map`, destroyed
/// (unmapped) by `udma_mapping_destroy`.
#[derive(Debug)]
pub struct udma_mapping {
    _opaque: [u8; 0],
}

pub(crate) struct MappingEntry {
    pub(crate) mapping: dma::Mapping,
    device: String,
    /// The bytes of `mapping` the handle stands for: all of it, or an imported dma-buf's part
    /// of the region behind it.
    offset: usize,
    len: usize,
}

pub(crate) static MAPPINGS: Registry<Arc<MappingEntry>> = Registry::new(Kind::Mapping);

/// A mapping's addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_mapping_info {
    /// `sizeof(udma_mapping_info)`.
    pub size: usize,
    /// The host address of byte 0 (the device writes this memory: treat it as volatile).
    pub host: *mut c_void,
    /// Its length in bytes (the request rounded up to whole pages).
    pub len: u64,
    /// The IOVA (device address) of byte 0.
    pub iova: u64,
    /// Bytes from byte 0 that are contiguous in IOVA space (the whole length on hugepages
    /// or behind an IOMMU; at least one page). `udma_mapping_iova` gives the IOVA of any byte.
    pub contiguous: u64,
}

// SAFETY: `repr(C)`, a raw pointer (any bit pattern is a valid raw pointer value) and
// integers, 8 * 5 = 40 bytes with no padding.
unsafe impl abi::Bytes for udma_mapping_info {}
abi::sized!(udma_mapping_info);

/// Maps `bytes` of fresh pinned memory (rounded up to whole pages of `page_size`, a
/// `udma_page_size`) into the device's DMA space, on the device's NUMA node when it has one.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for 0 bytes or a bad page size; `UDMA_ERR_EXHAUSTED`
/// for too few hugepages (the message says how many to reserve) or IOVA space;
/// `UDMA_ERR_REFUSED` for the memory-lock limit.
///
/// # Safety
/// `mapping` points to a writable `udma_mapping *`.
#[no_mangle]
pub unsafe extern "C" fn udma_memory_map(
    device: *const udma_device,
    bytes: u64,
    page_size: u32,
    mapping: *mut *mut udma_mapping,
) -> udma_status {
    call("udma_memory_map", || {
        let out = abi::out(mapping, "mapping")?;
        let d = self::device(device)?;
        let len = self::bytes(bytes, "bytes")?;
        let page = self::page_size(page_size)?;
        let m = d
            .runtime
            .map_memory(len, page)
            .map_err(|e| Fail::from(e).context(&d.name))?;
        register(m, &d.name, out)
    })
}

/// Maps memory the caller owns, `[addr, addr + bytes)`, into the device's DMA space: any
/// range the process mapped writable (anonymous, a shared file, hugetlb), `addr` aligned to
/// `page_size` (a `udma_page_size`: the size of the pages behind it) and `bytes` a multiple of
/// it. Every page is faulted in now; `udma_mapping_destroy` unmaps it from the device and
/// leaves it mapped in the process, with its contents.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL or unaligned `addr`, a length that is not
/// whole pages, or a range not all mapped in the process; `UDMA_ERR_REFUSED` for memory that
/// cannot be faulted in for writing (read-only, `PROT_NONE`, a device mapping); as
/// `udma_memory_map` for the DMA space.
///
/// # Safety
/// The range stays mapped until `udma_mapping_destroy` of the mapping returned, and is not
/// written by the program while a device may write it; `mapping` points to a writable
/// `udma_mapping *`.
#[no_mangle]
pub unsafe extern "C" fn udma_memory_map_user(
    device: *const udma_device,
    addr: *mut c_void,
    bytes: u64,
    page_size: u32,
    mapping: *mut *mut udma_mapping,
) -> udma_status {
    // SAFETY: forwarded under this function's contract, which is the callee's.
    unsafe {
        udma_memory_map_user_access(
            device,
            addr,
            bytes,
            page_size,
            udma_access::UDMA_ACCESS_READ_WRITE as u32,
            mapping,
        )
    }
}

/// What a device may do with a mapping (`udma_memory_map_user_access`, `udma_dmabuf_import`).
/// The IOMMU enforces it (VFIO type1 and iommufd; the loopback NPU's table); a device without
/// an IOMMU refuses all but read-write.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_access {
    /// The device reads and writes the memory.
    UDMA_ACCESS_READ_WRITE = 0,
    /// The device only reads it: its writes are refused and the memory is unchanged.
    UDMA_ACCESS_DEVICE_READS = 1,
    /// The device only writes it: its reads are refused.
    UDMA_ACCESS_DEVICE_WRITES = 2,
}

/// A `udma_access` as the library's.
pub(crate) fn access(raw: u32) -> Result<dma::Access, Fail> {
    match raw {
        0 => Ok(dma::Access::ReadWrite),
        1 => Ok(dma::Access::ReadOnly),
        2 => Ok(dma::Access::WriteOnly),
        other => Err(Fail::invalid(format!(
            "access {other} is not a udma_access (UDMA_ACCESS_READ_WRITE 0, \
             UDMA_ACCESS_DEVICE_READS 1, UDMA_ACCESS_DEVICE_WRITES 2)"
        ))),
    }
}

/// `udma_memory_map_user` with what the device may do with the memory (a `udma_access`).
///
/// Errors: as `udma_memory_map_user`; `UDMA_ERR_INVALID_ARGUMENT` for an unknown `access`;
/// `UDMA_ERR_UNSUPPORTED` for a mode the device's DMA space cannot enforce (no IOMMU).
///
/// # Safety
/// As `udma_memory_map_user`.
#[no_mangle]
pub unsafe extern "C" fn udma_memory_map_user_access(
    device: *const udma_device,
    addr: *mut c_void,
    bytes: u64,
    page_size: u32,
    access: u32,
    mapping: *mut *mut udma_mapping,
) -> udma_status {
    call("udma_memory_map_user_access", || {
        let access = self::access(access)?;
        let out = abi::out(mapping, "mapping")?;
        let d = self::device(device)?;
        let len = self::bytes(bytes, "bytes")?;
        let page = self::page_size(page_size)?;
        let ptr = std::ptr::NonNull::new(addr.cast::<u8>()).ok_or_else(|| Fail::null("addr"))?;
        // SAFETY: the caller's promise: the range stays mapped until the mapping (which holds
        // the region) is destroyed, and this library reaches it only through raw pointers.
        let region = unsafe { udma::memory::Region::borrowed(ptr, len, page) }
            .map_err(|e| crate::error::lib(e).context(&d.name))?;
        let m = d
            .runtime
            .dma_space()
            .map_with(Arc::new(region), access)
            .map_err(|e| crate::error::lib(e).context(&d.name))?;
        register(m, &d.name, out)
    })
}

/// Registers `mapping` (of device `device`) as a handle, written to `out`.
pub(crate) fn register(
    mapping: dma::Mapping,
    device: &str,
    out: *mut *mut udma_mapping,
) -> Result<(), Fail> {
    let len = mapping.len();
    register_part(mapping, 0, len, device, out)
}

/// Registers the part `offset..+len` of `mapping` as a handle, written to `out`.
pub(crate) fn register_part(
    mapping: dma::Mapping,
    offset: usize,
    len: usize,
    device: &str,
    out: *mut *mut udma_mapping,
) -> Result<(), Fail> {
    let key = MAPPINGS.insert(Arc::new(MappingEntry {
        mapping,
        device: device.to_owned(),
        offset,
        len,
    }))?;
    // SAFETY: `out` was checked non-null by the caller (`abi::out`), and is writable per its
    // function's contract.
    unsafe { out.write(key.to_ptr(Kind::Mapping)) };
    Ok(())
}

/// The mapping's host address, length and IOVA.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_get_info(
    mapping: *const udma_mapping,
    info: *mut udma_mapping_info,
) -> udma_status {
    call("udma_mapping_get_info", || {
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let value = udma_mapping_info {
            size: 0,
            host: m.mapping.as_ptr().as_ptr().wrapping_add(m.offset).cast(),
            len: m.len as u64,
            iova: m.mapping.iova(m.offset).map_or(0, |i| i.raw()),
            contiguous: (m.mapping.contiguous_len(m.offset) as u64).min(m.len as u64),
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// The IOVA of byte `offset` of the mapping, and how many bytes from there are contiguous in
/// IOVA space (`contiguous` may be NULL).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the end.
///
/// # Safety
/// `iova` points to a writable `uint64_t`; `contiguous` is NULL or does.
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_iova(
    mapping: *const udma_mapping,
    offset: u64,
    iova: *mut u64,
    contiguous: *mut u64,
) -> udma_status {
    call("udma_mapping_iova", || {
        let out = abi::out(iova, "iova")?;
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let at = usize::try_from(offset)
            .ok()
            .filter(|&o| o < m.len)
            .and_then(|o| m.mapping.iova(m.offset + o).map(|i| (o, i)));
        let Some((o, i)) = at else {
            return Err(Fail::invalid(format!(
                "offset {offset} is past the end of the {}-byte mapping on {}",
                m.len, m.device
            )));
        };
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(i.raw()) };
        if !contiguous.is_null() {
            let run = m.mapping.contiguous_len(m.offset + o).min(m.len - o);
            // SAFETY: non-null; writable per this function's contract.
            unsafe { contiguous.write(run as u64) };
        }
        Ok(())
    })
}

/// Unmaps the memory from the device's DMA space and frees it (memory the caller owns,
/// `udma_memory_map_user`, stays mapped in the process). The device must not be using it any
/// more (this library submits only pool buffers, which a mapping is not).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_destroy(mapping: *mut udma_mapping) -> udma_status {
    call("udma_mapping_destroy", || {
        drop(MAPPINGS.remove_if(mapping, |_| Ok(()))?);
        Ok(())
    })
}

/// A new descriptor (the caller closes it) of the file behind the mapping's memory (the memfd
/// of `udma_memory_map`'s memory; an imported dma-buf's own), to pass to another process
/// (`udma_share_send`) or to make a dma-buf of (`udma_dmabuf_export_mapping` does that).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for memory with no file (the caller's own,
/// `udma_memory_map_user`); `UDMA_ERR_SYSTEM` when out of descriptors.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_mapping_fd(
    mapping: *const udma_mapping,
    fd: *mut i32,
) -> udma_status {
    call("udma_mapping_fd", || {
        let out = abi::out(fd, "fd")?;
        let m = MAPPINGS.with(mapping, |_, m| Ok(Arc::clone(m)))?;
        let region = m.mapping.region();
        let file = region.fd().ok_or_else(|| {
            Fail::invalid(format!(
                "the {}-byte mapping on {} is the caller's memory, with no file behind it",
                m.len, m.device
            ))
        })?;
        let dup = file.try_clone_to_owned().map_err(|e| {
            Fail::new(
                udma_status::UDMA_ERR_SYSTEM,
                format!("dup of the mapping's file: {e}"),
            )
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(std::os::fd::IntoRawFd::into_raw_fd(dup)) };
        Ok(())
    })
}
