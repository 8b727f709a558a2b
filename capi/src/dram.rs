//! Device memory as ranges: `userdma::device::DeviceMemory` over a BAR of a device, from C.
//! A range comes back as a plain `udma_range` (its BAR, offset and length, and an id); the
//! device handle keeps the `Range` itself, by id, so a range freed twice, one whose fields
//! were changed, or one of another device is refused instead of freeing what it does not own.
//!
//! The loopback device's memory (BAR 2) is the runtime's own allocator, the one its pipelines
//! and arenas take their ranges from, so C ranges and theirs never overlap; its register BAR 0
//! is refused (a range there would name BAR 2's memory in an op). Any BAR of another device
//! gets an allocator over all of it on first use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{MutexGuard, PoisonError};

use udma::device::{DeviceMemory, Range};
use udma::dma::DeviceOffset;
use userdma_loopback::{self as loopback, LoopbackRuntime};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::device::{bar_slot, device, udma_device, Device};
use crate::error::{call, lib, udma_status, Fail};

/// The ranges `d` has out, locked.
fn ranges(d: &Device) -> MutexGuard<'_, HashMap<u64, Range>> {
    // Every change to the map is one insert or remove: a panic elsewhere leaves it whole.
    d.ranges.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The BAR of `range` as C numbers it (an index below 6, taken from a `u32`).
fn bar_of(range: &Range) -> u32 {
    u32::try_from(range.bar()).unwrap_or(u32::MAX)
}

/// Range ids, unique in the process (a range of one device never matches another's).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A range of device memory (`udma_device_memory_alloc`): where it is, and the id the device
/// handle knows it by. Pass it back unchanged to `udma_device_memory_free`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_range {
    /// `sizeof(udma_range)`.
    pub size: usize,
    /// The library's id of the range (never 0).
    pub id: u64,
    /// The BAR the range is in.
    pub bar: u32,
    /// Zero.
    pub reserved: u32,
    /// The first byte's offset in the BAR (the `device_offset` / `device_src` of an op).
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

abi::sized!(udma_range);

/// A BAR's device memory (`udma_device_memory_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_device_memory_info {
    /// `sizeof(udma_device_memory_info)`.
    pub size: usize,
    /// Bytes of device memory in all (the BAR's length).
    pub bytes: u64,
    /// Bytes free now.
    pub free: u64,
    /// The largest free range now (what one allocation can get at most).
    pub largest_free: u64,
    /// Ranges this device handle has out.
    pub ranges: u64,
}

abi::sized!(udma_device_memory_info);

/// The allocator over BAR `bar` of `d`.
fn allocator(d: &Device, bar: u32) -> Result<&DeviceMemory, Fail> {
    let (i, slot) = bar_slot(d, &d.memories, bar)?;
    if let Some(memory) = slot.get() {
        return Ok(memory);
    }
    let loopback = d.runtime.loopback_device().is_some();
    let memory = if loopback && i == loopback::regs::MEMORY_BAR {
        // The runtime's own: what its pipelines and arenas allocate from.
        d.runtime.device_memory().map_err(Fail::from)?.clone()
    } else if loopback {
        // A BAR it does not have is that error; the one it has holds registers: a range
        // there would be used as a device address, which on the loopback always means its
        // memory, and overlap ranges of BAR 2.
        d.runtime
            .device()
            .bar(i)
            .map_err(|e| lib(e).context(&d.name))?;
        return Err(Fail::new(
            udma_status::UDMA_ERR_INVALID_ARGUMENT,
            format!(
                "{} BAR {bar} holds the device's registers, not memory: allocate from BAR {}, \
                 its device memory",
                d.name,
                loopback::regs::MEMORY_BAR
            ),
        ));
    } else {
        DeviceMemory::of_bar(d.runtime.device().as_ref(), i).map_err(|e| lib(e).context(&d.name))?
    };
    // Another thread may have made one first: keep the one stored.
    Ok(slot.get_or_init(|| memory))
}

/// Records `range` and writes it to the caller's `out`.
///
/// # Safety
/// `out` points to `out->size` writable bytes (checked non-null and sized by the caller).
unsafe fn hand_out(d: &Device, range: Range, out: *mut udma_range) -> Result<(), Fail> {
    // Relaxed: the counter only has to hand out distinct values; nothing is published
    // through it (the range itself is recorded under the device's mutex).
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let value = udma_range {
        size: 0,
        id,
        bar: bar_of(&range),
        reserved: 0,
        offset: range.offset().raw(),
        len: range.len(),
    };
    // Written before it is recorded: a write that fails leaves nothing allocated (the range
    // drops here, back to the allocator).
    // SAFETY: per the caller's contract.
    unsafe { abi::write(out, "range", value)? };
    ranges(d).insert(id, range);
    Ok(())
}

/// Checks the out-parameter and that the device is there, before anything is allocated.
///
/// # Safety
/// `range` is NULL or points to at least `size_of::<usize>()` readable bytes.
unsafe fn before_alloc(d: &Device, range: *mut udma_range) -> Result<(), Fail> {
    // SAFETY: per the caller's contract.
    unsafe { abi::declared(range.cast_const(), "range", "udma_range") }?;
    if d.runtime.device().is_removed() {
        return Err(Fail::new(
            udma_status::UDMA_ERR_REMOVED,
            format!(
                "{} was removed: its memory holds nothing any more; free its ranges, destroy \
                 what uses it and open it again once it is back",
                d.name
            ),
        ));
    }
    Ok(())
}

/// `len` bytes of BAR `bar`'s device memory at the lowest free offset that is a multiple of
/// `align` (a power of two; 0 is taken as 1), into `*range`. The loopback device's memory is
/// BAR 2.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0, an alignment that is not a power of
/// two, or the loopback device's register BAR 0; `UDMA_ERR_EXHAUSTED` when no free range
/// holds it (the message gives the free bytes and the largest free range);
/// `UDMA_ERR_NOT_FOUND` for no such BAR; `UDMA_ERR_REMOVED` once the device was removed.
///
/// # Safety
/// `range` points to `range->size` writable bytes (set `range->size = sizeof *range`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_memory_alloc(
    device: *const udma_device,
    bar: u32,
    len: u64,
    align: u64,
    range: *mut udma_range,
) -> udma_status {
    call("udma_device_memory_alloc", || {
        let d = self::device(device)?;
        // SAFETY: per this function's contract.
        unsafe { before_alloc(&d, range)? };
        let memory = allocator(&d, bar)?;
        let got = memory
            .alloc(len, align.max(1))
            .map_err(|e| lib(e).context(format!("{} BAR {bar}", d.name)))?;
        // SAFETY: per this function's contract (checked by `before_alloc`).
        unsafe { hand_out(&d, got, range) }
    })
}

/// The `len` bytes at `offset` of BAR `bar`'s device memory exactly (a buffer placed by hand),
/// into `*range`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0, a range that ends past the memory, or one
/// that is partly in use; otherwise as `udma_device_memory_alloc`.
///
/// # Safety
/// `range` points to `range->size` writable bytes (set `range->size = sizeof *range`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_memory_alloc_at(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    len: u64,
    range: *mut udma_range,
) -> udma_status {
    call("udma_device_memory_alloc_at", || {
        let d = self::device(device)?;
        // SAFETY: per this function's contract.
        unsafe { before_alloc(&d, range)? };
        let memory = allocator(&d, bar)?;
        let got = memory
            .alloc_at(DeviceOffset(offset), len)
            .map_err(|e| lib(e).context(format!("{} BAR {bar}", d.name)))?;
        // SAFETY: per this function's contract (checked by `before_alloc`).
        unsafe { hand_out(&d, got, range) }
    })
}

/// Returns a range to the device memory it came from. `*range` must be what
/// `udma_device_memory_alloc` or `_alloc_at` filled in, on this device, not freed yet. What a
/// descriptor in flight still reads or writes there is the caller's to finish first.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a range freed already, one of another device (or
/// never allocated), or one whose BAR, offset or length were changed; nothing is freed then.
///
/// # Safety
/// `range` points to `range->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_device_memory_free(
    device: *const udma_device,
    range: *const udma_range,
) -> udma_status {
    call("udma_device_memory_free", || {
        let d = self::device(device)?;
        // SAFETY: per this function's contract.
        let r = unsafe { abi::read(range, "range", udma_range::default())? };
        let mut ranges = ranges(&d);
        let Some(held) = ranges.get(&r.id) else {
            return Err(Fail::invalid(format!(
                "range {} (BAR {} {:#x}+{:#x}) is not allocated on {}: it was freed already, \
                 or allocated on another device",
                r.id, r.bar, r.offset, r.len, d.name
            )));
        };
        let (bar, offset, len) = (bar_of(held), held.offset().raw(), held.len());
        if (r.bar, r.offset, r.len) != (bar, offset, len) {
            return Err(Fail::invalid(format!(
                "range {} is BAR {bar} {offset:#x}+{len:#x} on {}, but the struct passed says \
                 BAR {} {:#x}+{:#x}: pass the udma_range the allocation filled in, unchanged",
                r.id, d.name, r.bar, r.offset, r.len
            )));
        }
        // Dropping the range returns it to its allocator.
        drop(ranges.remove(&r.id));
        Ok(())
    })
}

/// BAR `bar`'s device memory: its size, the bytes free, the largest free range, and the
/// ranges this handle has out.
///
/// Errors: `UDMA_ERR_NOT_FOUND` for no such BAR.
///
/// # Safety
/// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_memory_get_info(
    device: *const udma_device,
    bar: u32,
    info: *mut udma_device_memory_info,
) -> udma_status {
    call("udma_device_memory_get_info", || {
        let d = self::device(device)?;
        // SAFETY: per this function's contract.
        unsafe { abi::declared(info.cast_const(), "info", "udma_device_memory_info") }?;
        let memory = allocator(&d, bar)?;
        let ranges = ranges(&d).values().filter(|r| bar_of(r) == bar).count();
        let value = udma_device_memory_info {
            size: 0,
            bytes: memory.size(),
            free: memory.free_bytes(),
            largest_free: memory.largest_free(),
            ranges: ranges as u64,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}
