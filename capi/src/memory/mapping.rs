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

struct MappingEntry {
    mapping: dma::Mapping,
    device: String,
}

static MAPPINGS: Registry<Arc<MappingEntry>> = Registry::new(Kind::Mapping);

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

// SAFETY: `repr(C)`, a pointer and integers, 8 * 5 = 40 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_mapping_info {
    const NAME: &'static str = "udma_mapping_info";
}

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
    call("udma_memory_map_user", || {
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
            .map(Arc::new(region))
            .map_err(|e| crate::error::lib(e).context(&d.name))?;
        register(m, &d.name, out)
    })
}

/// Registers `mapping` (of device `device`) as a handle, written to `out`.
fn register(mapping: dma::Mapping, device: &str, out: *mut *mut udma_mapping) -> Result<(), Fail> {
    let key = MAPPINGS.insert(Arc::new(MappingEntry {
        mapping,
        device: device.to_owned(),
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
            host: m.mapping.as_ptr().as_ptr().cast(),
            len: m.mapping.len() as u64,
            iova: m.mapping.iova(0).map_or(0, |i| i.raw()),
            contiguous: m.mapping.contiguous_len(0) as u64,
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
            .and_then(|o| m.mapping.iova(o).map(|i| (o, i)));
        let Some((o, i)) = at else {
            return Err(Fail::invalid(format!(
                "offset {offset} is past the end of the {}-byte mapping on {}",
                m.mapping.len(),
                m.device
            )));
        };
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(i.raw()) };
        if !contiguous.is_null() {
            // SAFETY: non-null; writable per this function's contract.
            unsafe { contiguous.write(m.mapping.contiguous_len(o) as u64) };
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
