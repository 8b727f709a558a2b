//! BAR access: a device's registers (and memory windows) from C, through the library's
//! `mmio` layer. Every access is checked against the BAR's length and the access width's
//! alignment before anything is touched, and is one volatile access of exactly that width (or
//! one `pread`/`pwrite` of it where the kernel serves the BAR through the device file).
//!
//! A device handle keeps each BAR's register block from its first use on, so a BAR it has
//! used keeps its length after the device is removed: reads of it then give all-ones (what a
//! PCIe read of a device that is gone returns), and writes are refused (`UDMA_ERR_REMOVED`).

use udma::mmio::{DynBlock, Raw, Width};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::device::{bar_slot, device, udma_device, Device};
use crate::error::{call, lib, udma_status, Fail};

/// A BAR of a device (`udma_device_get_bar`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable)]
pub struct udma_bar_info {
    /// `sizeof(udma_bar_info)`.
    pub size: usize,
    /// Bytes of the BAR: offsets `0 .. len - width` are valid for an access of `width` bytes.
    pub len: u64,
    /// The BAR's index.
    pub index: u32,
    /// Zero.
    pub reserved: u32,
}

abi::sized!(udma_bar_info);

/// The removal error of `d`, for an operation on BAR `index`.
fn removed(d: &Device, what: String) -> Fail {
    Fail::new(
        udma_status::UDMA_ERR_REMOVED,
        format!(
            "{} was removed: {what} reaches no device; destroy what uses it and open it again \
             once it is back",
            d.name
        ),
    )
}

/// BAR `index` of `d`: the block the handle used before, or the device's now.
fn block(d: &Device, index: u32) -> Result<&DynBlock, Fail> {
    let (i, slot) = bar_slot(d, &d.bars, index)?;
    if let Some(block) = slot.get() {
        return Ok(block);
    }
    let dev = d.runtime.device();
    // The loopback device hands out its blocks after a removal too; every device refuses a
    // BAR first asked for after it, as VFIO and UIO do.
    if dev.is_removed() {
        return Err(removed(d, format!("BAR {index}")));
    }
    let fresh = dev.bar(i).map_err(|e| lib(e).context(&d.name))?;
    // Another thread may have stored its block first: both are the same registers.
    Ok(slot.get_or_init(|| fresh))
}

/// Checks an access of `width` at `offset` of BAR `index` (`len` bytes) and returns the
/// offset as an index.
fn check(d: &Device, index: u32, len: usize, offset: u64, width: Width) -> Result<usize, Fail> {
    let bytes = width.bytes();
    let a = if width == Width::U8 { "an" } else { "a" };
    let fits = usize::try_from(offset)
        .ok()
        .filter(|&at| at.checked_add(bytes).is_some_and(|end| end <= len));
    let Some(at) = fits else {
        return Err(Fail::invalid(format!(
            "{} BAR {index} is {len:#x} bytes: {a} {width} access at offset {offset:#x} runs past \
             its end (the last {bytes}-byte register is at {:#x})",
            d.name,
            len.saturating_sub(bytes)
        )));
    };
    if at % bytes != 0 {
        return Err(Fail::invalid(format!(
            "{} BAR {index} ({len:#x} bytes): offset {offset:#x} is not a multiple of {bytes}: \
             {a} {width} access must be aligned to its width",
            d.name
        )));
    }
    Ok(at)
}

/// Reads the `R`-wide register at `offset` of BAR `index`.
fn read<R: Raw>(device_ptr: *const udma_device, index: u32, offset: u64) -> Result<R, Fail> {
    let d = device(device_ptr)?;
    let block = block(&d, index)?;
    let at = check(&d, index, block.len(), offset, R::WIDTH)?;
    if d.runtime.device().is_removed() {
        // What a PCIe read of a device that is gone returns.
        return Ok(R::from_u64(u64::MAX));
    }
    block.read::<R>(at).map_err(|e| {
        Fail::new(
            udma_status::UDMA_ERR_SYSTEM,
            format!("{} BAR {index}: {e}", d.name),
        )
    })
}

/// Writes the `R`-wide register at `offset` of BAR `index`.
fn write<R: Raw>(
    device_ptr: *const udma_device,
    index: u32,
    offset: u64,
    value: R,
) -> Result<(), Fail> {
    let d = device(device_ptr)?;
    let block = block(&d, index)?;
    let at = check(&d, index, block.len(), offset, R::WIDTH)?;
    if d.runtime.device().is_removed() {
        return Err(removed(
            &d,
            format!("a write to BAR {index} at offset {offset:#x}"),
        ));
    }
    block.write::<R>(at, value).map_err(|e| {
        Fail::new(
            udma_status::UDMA_ERR_SYSTEM,
            format!("{} BAR {index}: {e}", d.name),
        )
    })
}

/// What BAR `index` of the device is: its length. (Accesses need no call before them: the
/// reads and writes find the BAR themselves.)
///
/// Errors: `UDMA_ERR_NOT_FOUND` for a BAR the device does not have (the loopback device has
/// BAR 0, its registers, and BAR 2, its memory); `UDMA_ERR_REMOVED` once the device was
/// removed.
///
/// # Safety
/// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_get_bar(
    device: *const udma_device,
    index: u32,
    info: *mut udma_bar_info,
) -> udma_status {
    call("udma_device_get_bar", || {
        let d = self::device(device)?;
        // SAFETY: per this function's contract.
        unsafe { abi::declared(info.cast_const(), "info", "udma_bar_info") }?;
        if d.runtime.device().is_removed() {
            return Err(removed(&d, format!("BAR {index}")));
        }
        let block = block(&d, index)?;
        let value = udma_bar_info {
            size: 0,
            len: block.len() as u64,
            index,
            reserved: 0,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// [`read`] into the caller's `*value`.
///
/// # Safety
/// `value` is NULL or points to a writable `R`.
unsafe fn read_out<R: Raw>(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: *mut R,
) -> Result<(), Fail> {
    let out = abi::out(value, "value")?;
    let got = read::<R>(device, bar, offset)?;
    // SAFETY: checked non-null; writable per the caller's contract.
    unsafe { out.write(got) };
    Ok(())
}

/// Reads the 8-bit register at `offset` of BAR `bar` into `*value`: one volatile
/// 8-bit load (or one `pread` of it where the kernel serves the BAR through the device
/// file). A register with read side effects has them.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
/// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
/// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
/// returns for a device that is gone: check `udma_device_is_removed` when a register reads
/// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
///
/// # Safety
/// `value` points to a writable `uint8_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_read8(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: *mut u8,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_device_read8", || unsafe {
        read_out(device, bar, offset, value)
    })
}

/// Writes `value` to the 8-bit register at `offset` of BAR `bar`: one volatile 8-bit
/// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
/// device to read memory the program filled (a doorbell, a DMA start) needs
/// `atomic_thread_fence(memory_order_release)` before it.
///
/// Errors: as `udma_device_read8`, and `UDMA_ERR_REMOVED` once the device was removed
/// (nothing is written).
#[no_mangle]
pub extern "C" fn udma_device_write8(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: u8,
) -> udma_status {
    call("udma_device_write8", || write(device, bar, offset, value))
}

/// Reads the 16-bit register at `offset` of BAR `bar` into `*value`: one volatile
/// 16-bit load (or one `pread` of it where the kernel serves the BAR through the device
/// file). A register with read side effects has them.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
/// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
/// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
/// returns for a device that is gone: check `udma_device_is_removed` when a register reads
/// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
///
/// # Safety
/// `value` points to a writable `uint16_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_read16(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: *mut u16,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_device_read16", || unsafe {
        read_out(device, bar, offset, value)
    })
}

/// Writes `value` to the 16-bit register at `offset` of BAR `bar`: one volatile 16-bit
/// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
/// device to read memory the program filled (a doorbell, a DMA start) needs
/// `atomic_thread_fence(memory_order_release)` before it.
///
/// Errors: as `udma_device_read16`, and `UDMA_ERR_REMOVED` once the device was removed
/// (nothing is written).
#[no_mangle]
pub extern "C" fn udma_device_write16(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: u16,
) -> udma_status {
    call("udma_device_write16", || write(device, bar, offset, value))
}

/// Reads the 32-bit register at `offset` of BAR `bar` into `*value`: one volatile
/// 32-bit load (or one `pread` of it where the kernel serves the BAR through the device
/// file). A register with read side effects has them.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
/// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
/// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
/// returns for a device that is gone: check `udma_device_is_removed` when a register reads
/// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
///
/// # Safety
/// `value` points to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_read32(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: *mut u32,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_device_read32", || unsafe {
        read_out(device, bar, offset, value)
    })
}

/// Writes `value` to the 32-bit register at `offset` of BAR `bar`: one volatile 32-bit
/// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
/// device to read memory the program filled (a doorbell, a DMA start) needs
/// `atomic_thread_fence(memory_order_release)` before it.
///
/// Errors: as `udma_device_read32`, and `UDMA_ERR_REMOVED` once the device was removed
/// (nothing is written).
#[no_mangle]
pub extern "C" fn udma_device_write32(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: u32,
) -> udma_status {
    call("udma_device_write32", || write(device, bar, offset, value))
}

/// Reads the 64-bit register at `offset` of BAR `bar` into `*value`: one volatile
/// 64-bit load (or one `pread` of it where the kernel serves the BAR through the device
/// file). A register with read side effects has them.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset past the BAR's end or not a multiple of
/// the width (the message names the BAR, its length and the offset); `UDMA_ERR_NOT_FOUND` for
/// no such BAR. On a removed device a BAR the handle used before reads all-ones (what PCIe
/// returns for a device that is gone: check `udma_device_is_removed` when a register reads
/// all-ones), and one first used after the removal is `UDMA_ERR_REMOVED`.
///
/// # Safety
/// `value` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_read64(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: *mut u64,
) -> udma_status {
    // SAFETY: per this function's contract.
    call("udma_device_read64", || unsafe {
        read_out(device, bar, offset, value)
    })
}

/// Writes `value` to the 64-bit register at `offset` of BAR `bar`: one volatile 64-bit
/// store (or one `pwrite` of it). A register write is not a fence: a write that tells the
/// device to read memory the program filled (a doorbell, a DMA start) needs
/// `atomic_thread_fence(memory_order_release)` before it.
///
/// Errors: as `udma_device_read64`, and `UDMA_ERR_REMOVED` once the device was removed
/// (nothing is written).
#[no_mangle]
pub extern "C" fn udma_device_write64(
    device: *const udma_device,
    bar: u32,
    offset: u64,
    value: u64,
) -> udma_status {
    call("udma_device_write64", || write(device, bar, offset, value))
}
