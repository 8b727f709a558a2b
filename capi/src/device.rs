//! Devices: the loopback device (with its cost model) and PCI functions by BDF (VFIO or UIO),
//! each owned by a `userdma::Runtime` behind a `udma_device` handle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use udma::device::{self, DeviceMemory, Range};
use udma::mmio::DynBlock;
use udma::Runtime;

use crate::error::{lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

// cbindgen writes the header's declarations in the order it reads them, modules in the order
// they are declared: these are declared (a group each, which rustfmt keeps) in the order of
// their `udma_*` items in the header.
#[path = "device/loopback.rs"]
mod loopback;

#[path = "device/pci.rs"]
mod pci;

#[path = "device/info.rs"]
mod info;

#[path = "device/events.rs"]
mod events;

#[path = "device/timeout.rs"]
mod timeout;

pub use events::{
    udma_device_events_fd, udma_device_is_removed, udma_device_next_event,
    udma_device_remove_loopback, udma_event, udma_event_kind,
};
pub use info::{
    udma_device_close, udma_device_get_info, udma_device_info, udma_device_interrupt_fd,
    udma_device_kind,
};
pub use loopback::{
    udma_cost_model, udma_device_open_loopback, udma_loopback_options, UDMA_LOOPBACK_PIN_ENGINE,
};
pub use pci::{
    udma_device_open_pci, udma_irq_kind, udma_pci_backend, udma_pci_options,
    UDMA_PCI_ALLOW_NOIOMMU, UDMA_PCI_NO_IOMMUFD,
};
pub(crate) use timeout::timeout;
pub use timeout::UDMA_TIMEOUT_INFINITE;

/// A device: the loopback device or a PCI function, with everything the library maps for it.
/// Made by `udma_device_open_loopback` or `udma_device_open_pci`, destroyed by
/// `udma_device_close`.
#[derive(Debug)]
pub struct udma_device {
    _opaque: [u8; 0],
}

/// Slot `index` of one of `d`'s per-BAR tables (`bars`, `memories`), with the index as a
/// `usize`; `UDMA_ERR_NOT_FOUND` for an index past the six BARs.
pub(crate) fn bar_slot<'t, T>(
    d: &Device,
    slots: &'t [OnceLock<T>; BARS],
    index: u32,
) -> Result<(usize, &'t OnceLock<T>), Fail> {
    usize::try_from(index)
        .ok()
        .and_then(|i| Some((i, slots.get(i)?)))
        .ok_or_else(|| {
            Fail::new(
                udma_status::UDMA_ERR_NOT_FOUND,
                format!("{} has no BAR {index}: BARs are numbered 0 to 5", d.name),
            )
        })
}

/// What a `udma_device` handle holds.
pub(crate) struct Device {
    pub(crate) runtime: Runtime,
    /// The device's name, for messages (`loopback0`, `0000:01:00.0`).
    pub(crate) name: String,
    /// The handle's subscriber to the device's events (`udma_device_next_event`).
    pub(crate) events: std::sync::Mutex<device::Events>,
    /// The register blocks the handle has used, by BAR index (`udma_device_read32` and the
    /// others, in `bar.rs`).
    pub(crate) bars: [OnceLock<DynBlock>; BARS],
    /// The device-memory allocators the handle has used, by BAR index (`dram.rs`).
    pub(crate) memories: [OnceLock<DeviceMemory>; BARS],
    /// The device-memory ranges the handle has out, by id (`dram.rs`).
    pub(crate) ranges: Mutex<HashMap<u64, Range>>,
}

/// BARs a PCI function can have (0 to 5); the loopback device has 0 and 2.
pub(crate) const BARS: usize = 6;

pub(crate) static DEVICES: Registry<Arc<Device>> = Registry::new(Kind::Device);

/// The device `ptr` names.
pub(crate) fn device(ptr: *const udma_device) -> Result<Arc<Device>, Fail> {
    DEVICES.with(ptr, |_, d| Ok(Arc::clone(d)))
}

fn register(runtime: Runtime, out: *mut *mut udma_device) -> Result<(), Fail> {
    let identity = runtime.device().identity();
    let name = identity
        .bdf
        .map_or_else(|| identity.name.clone(), |bdf| bdf.to_string());
    let events = runtime
        .device()
        .events()
        .map_err(|e| lib(e).context(&name))?;
    let key = DEVICES.insert(Arc::new(Device {
        runtime,
        name,
        events: std::sync::Mutex::new(events),
        bars: Default::default(),
        memories: Default::default(),
        ranges: Mutex::default(),
    }))?;
    // SAFETY: `out` was checked non-null by the caller; C promises it is writable.
    unsafe { out.write(key.to_ptr(Kind::Device)) };
    Ok(())
}
