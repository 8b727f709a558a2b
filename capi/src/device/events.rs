//! A device's events (`udma_event`: a removal, errors): the next one this handle has not
//! seen, an fd for the caller's own loop, whether the device was removed, and removing the
//! loopback device to test that path.

use std::ffi::c_int;
use std::os::fd::{AsFd, IntoRawFd};

use userdma_loopback::LoopbackRuntime as _;
use zerocopy::{FromBytes, Immutable, IntoBytes};

// `device`: the handle lookup and (through the parent's import) `udma::device`.
use super::{device, timeout, udma_device};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};

/// What happened to a device (`udma_event.kind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_event_kind {
    /// Nothing new (the wait timed out).
    UDMA_EVENT_NONE = 0,
    /// The device was removed (hot-unplugged, unbound, asked back by the kernel): its queues
    /// stopped, every call that needs it fails with `UDMA_ERR_REMOVED`; destroy what uses it
    /// (buffers in flight come back as the queues are destroyed).
    UDMA_EVENT_REMOVAL = 1,
    /// The device reported errors (PCIe AER error interrupts): `count` new, `total` in all.
    UDMA_EVENT_ERROR = 2,
}

/// One event of a device (`udma_device_next_event`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable)]
pub struct udma_event {
    /// `sizeof(udma_event)`.
    pub size: usize,
    /// A `udma_event_kind`.
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
    /// `UDMA_EVENT_ERROR`: errors new since the handle's last event.
    pub count: u64,
    /// `UDMA_EVENT_ERROR`: errors since the device was opened.
    pub total: u64,
}

abi::sized!(udma_event);

/// The next event of the device this handle has not seen, waiting up to `timeout_ns`
/// nanoseconds (0: just look; `UDMA_TIMEOUT_INFINITE`: until one comes). A removal is reported
/// once per handle, before later errors; `event->kind` is `UDMA_EVENT_NONE` when the time ran
/// out. No callbacks: call it from the caller's own loop, or poll `udma_device_events_fd`.
///
/// # Safety
/// `event` points to `event->size` writable bytes (set `event->size = sizeof *event`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_next_event(
    device: *const udma_device,
    timeout_ns: u64,
    event: *mut udma_event,
) -> udma_status {
    call("udma_device_next_event", || {
        let d = self::device(device)?;
        // Checked before waiting, so that a bad struct does not use up the event.
        // SAFETY: per this function's contract.
        unsafe {
            abi::declared(
                event.cast_const(),
                "event",
                <udma_event as abi::Sized>::NAME,
            )
        }?;
        let next = d
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .wait(timeout(timeout_ns))
            .map_err(|e| lib(e).context(&d.name))?;
        let (kind, count, total) = match next {
            None => (udma_event_kind::UDMA_EVENT_NONE, 0, 0),
            Some(device::Event::Removal) => (udma_event_kind::UDMA_EVENT_REMOVAL, 0, 0),
            Some(device::Event::Error { count, total }) => {
                (udma_event_kind::UDMA_EVENT_ERROR, count, total)
            }
            Some(_) => (udma_event_kind::UDMA_EVENT_NONE, 0, 0),
        };
        let value = udma_event {
            size: 0,
            kind: kind as u32,
            reserved: 0,
            count,
            total,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(event, "event", value) }
    })
}

/// A new file descriptor, readable while an event of the device is unread by this handle
/// (until `udma_device_next_event` returns it), for the caller's own epoll loop; the caller
/// closes it.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_events_fd(
    device: *const udma_device,
    fd: *mut c_int,
) -> udma_status {
    call("udma_device_events_fd", || {
        let out = abi::out(fd, "fd")?;
        let d = self::device(device)?;
        let events = d
            .events
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let owned = events.as_fd().try_clone_to_owned().map_err(|e| {
            Fail::new(
                udma_status::UDMA_ERR_SYSTEM,
                format!("{}: duplicating the events eventfd: {e}", d.name),
            )
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(owned.into_raw_fd()) };
        Ok(())
    })
}

/// Whether the device was removed, in `*removed` (1 or 0).
///
/// # Safety
/// `removed` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_is_removed(
    device: *const udma_device,
    removed: *mut c_int,
) -> udma_status {
    call("udma_device_is_removed", || {
        let out = abi::out(removed, "removed")?;
        let d = self::device(device)?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(c_int::from(d.runtime.device().is_removed())) };
        Ok(())
    })
}

/// Takes the loopback device away, as a hot-unplug takes a PCI device (its engine stops, its
/// registers read all-ones, the removal is reported): for testing an SDK's removal path
/// without hardware.
///
/// Errors: `UDMA_ERR_UNSUPPORTED` for a PCI device (unplug it, or `echo 1 >
/// /sys/bus/pci/devices/BDF/remove`).
#[no_mangle]
pub extern "C" fn udma_device_remove_loopback(device: *const udma_device) -> udma_status {
    call("udma_device_remove_loopback", || {
        let d = self::device(device)?;
        let loopback = d.runtime.loopback_device().ok_or_else(|| {
            Fail::new(
                udma_status::UDMA_ERR_UNSUPPORTED,
                format!(
                    "{} is a PCI device: remove it by unplugging it, or with `echo 1 > /sys/bus/pci/devices/{}/remove`",
                    d.name, d.name
                ),
            )
        })?;
        loopback.remove();
        Ok(())
    })
}
