//! An open device handle: closing it, what the device is (`udma_device_info`,
//! `udma_device_kind`), and a new eventfd for one of its interrupt vectors.

use std::ffi::{c_char, c_int};
use std::os::fd::{AsFd, IntoRawFd};

use userdma_loopback::LoopbackRuntime as _;
use zerocopy::{FromBytes, Immutable, IntoBytes};

// `device`: the handle lookup and (through the parent's import) `udma::device`.
use super::{device, udma_device, DEVICES};
use crate::abi;
use crate::error::{call, lib, udma_status, Fail};

/// `udma_device_info.kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_device_kind {
    /// The software loopback device.
    UDMA_DEVICE_LOOPBACK = 0,
    /// A PCI function bound to vfio-pci.
    UDMA_DEVICE_VFIO = 1,
    /// A PCI function bound to uio_pci_generic.
    UDMA_DEVICE_UIO = 2,
}

/// What a device is (`udma_device_get_info`).
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, Immutable)]
pub struct udma_device_info {
    /// `sizeof(udma_device_info)`.
    pub size: usize,
    /// Bytes of device memory the library knows of (the loopback device's BAR 2; 0 for a PCI
    /// function).
    pub memory_bytes: u64,
    /// A `udma_device_kind`.
    pub kind: u32,
    /// Interrupt vectors (one per queue).
    pub vectors: u32,
    /// The NUMA node the library places the device's memory on, or -1 for none.
    pub numa_node: i32,
    /// Zero.
    pub reserved: u32,
    /// The device's name (`loopback0`, the PCI address), NUL-terminated, truncated to fit.
    pub name: [c_char; 64],
}

abi::sized!(udma_device_info);

/// Closes a device handle. What was made from it (mappings, pools, queues, buffers) keeps the
/// device open until it is destroyed too: each handle holds what it needs, in any order.
///
/// Errors: `UDMA_ERR_INVALID_HANDLE` for a handle that is NULL, closed already or not a
/// device.
///
/// # Safety
/// None beyond passing a value that was a `udma_device *` (any value is checked, none is
/// dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_device_close(device: *mut udma_device) -> udma_status {
    call("udma_device_close", || {
        let device = DEVICES.remove_if(device, |_| Ok(()))?;
        drop(device);
        Ok(())
    })
}

/// What the device is.
///
/// # Safety
/// `info` points to `info->size` writable bytes (set `info->size = sizeof *info`).
#[no_mangle]
pub unsafe extern "C" fn udma_device_get_info(
    device: *const udma_device,
    info: *mut udma_device_info,
) -> udma_status {
    call("udma_device_get_info", || {
        let d = self::device(device)?;
        let dev = d.runtime.device();
        let kind = match dev.identity().kind {
            device::Kind::Simulated => udma_device_kind::UDMA_DEVICE_LOOPBACK,
            device::Kind::Vfio => udma_device_kind::UDMA_DEVICE_VFIO,
            device::Kind::Uio => udma_device_kind::UDMA_DEVICE_UIO,
        };
        let mut name = [0 as c_char; 64];
        for (to, from) in name.iter_mut().zip(d.name.bytes().take(63)) {
            *to = from as c_char;
        }
        let value = udma_device_info {
            size: 0,
            memory_bytes: d
                .runtime
                .loopback_device()
                .map_or(0, |l| l.config().memory_bytes() as u64),
            kind: kind as u32,
            vectors: dev.vectors(),
            numa_node: d.runtime.numa_node().map_or(-1, |n| n as i32),
            reserved: 0,
            name,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// A new file descriptor for interrupt vector `vector` of the device (an eventfd, readable
/// when the vector fires), for the caller's own epoll loop; the caller closes it. A queue's
/// own interrupt is `udma_queue_interrupt_fd` (armed by `udma_queue_arm`).
///
/// Errors: `UDMA_ERR_NOT_FOUND` for a vector the device does not have.
///
/// # Safety
/// `fd` points to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_interrupt_fd(
    device: *const udma_device,
    vector: u32,
    fd: *mut c_int,
) -> udma_status {
    call("udma_device_interrupt_fd", || {
        let out = abi::out(fd, "fd")?;
        let d = self::device(device)?;
        let irq = d
            .runtime
            .device()
            .interrupt(vector)
            .map_err(|e| lib(e).context(&d.name))?;
        let owned = irq.as_fd().try_clone_to_owned().map_err(|e| {
            Fail::new(
                udma_status::UDMA_ERR_SYSTEM,
                format!("{}: duplicating vector {vector}'s eventfd: {e}", d.name),
            )
        })?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(owned.into_raw_fd()) };
        Ok(())
    })
}
