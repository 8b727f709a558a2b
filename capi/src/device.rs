//! Devices: the loopback device (with its cost model) and PCI functions by BDF (VFIO or UIO),
//! each owned by a `userdma::Runtime` behind a `udma_device` handle.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::os::fd::{AsFd, IntoRawFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use udma::device::{self, vfio, DeviceMemory, Range};
use udma::mmio::DynBlock;
use udma::{pci, Runtime};
use userdma_loopback as loopback;

use crate::abi;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};
use userdma_loopback::LoopbackRuntime as _;

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

/// The loopback device's cost model (`udma_loopback_options.cost_model`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_cost_model {
    /// A small NPU behind PCIe (the default): 12 GB/s DMA, 1 µs a descriptor, 6 GB/s compute,
    /// 20 µs a context switch; the engine holds each completion back until its modelled time.
    UDMA_COST_NPU = 0,
    /// No cost: the engine runs as fast as the host can and never waits (tests).
    UDMA_COST_ZERO = 1,
}

/// `udma_loopback_options.flags`: pin the engine to `engine_cpu`.
pub const UDMA_LOOPBACK_PIN_ENGINE: u32 = 1;

/// How to start the loopback device. Zero is the default for every field: a zeroed struct with
/// `size` set is the default device.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_loopback_options {
    /// `sizeof(udma_loopback_options)`.
    pub size: usize,
    /// Bytes of device memory (BAR 2); 0: 64 MiB.
    pub memory_bytes: u64,
    /// Queues (and interrupt vectors), 1 to 64; 0: 4.
    pub queues: u32,
    /// A `udma_cost_model`; 0: `UDMA_COST_NPU`.
    pub cost_model: u32,
    /// The largest queue depth the device accepts (a power of two); 0: 4096.
    pub max_depth: u32,
    /// The device's DMA mask width, 12 to 64; 0: 48.
    pub dma_mask_bits: u32,
    /// `UDMA_LOOPBACK_PIN_ENGINE` or 0.
    pub flags: u32,
    /// With `UDMA_LOOPBACK_PIN_ENGINE`: the CPU the engine runs on.
    pub engine_cpu: u32,
}

// SAFETY: `repr(C)`, integers only, 8 + 8 + 6 * 4 = 40 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_loopback_options {
    const NAME: &'static str = "udma_loopback_options";
}

/// `udma_pci_options.backend`: which kernel driver's interface to use.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_pci_backend {
    /// The one the function is bound to: vfio-pci or uio_pci_generic (the default).
    UDMA_PCI_AUTO = 0,
    /// vfio-pci.
    UDMA_PCI_VFIO = 1,
    /// uio_pci_generic (no IOMMU: physical addresses, pinned memory).
    UDMA_PCI_UIO = 2,
}

/// `udma_pci_options.irq_kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_irq_kind {
    /// No interrupts enabled at open (the default).
    UDMA_IRQ_NONE = 0,
    /// Legacy INTx (one vector).
    UDMA_IRQ_INTX = 1,
    /// MSI (up to 32 vectors).
    UDMA_IRQ_MSI = 2,
    /// MSI-X (up to 2048 vectors).
    UDMA_IRQ_MSIX = 3,
}

/// `udma_pci_options.flags`: allow VFIO's no-IOMMU mode (no isolation; the device reaches
/// physical addresses). Off by default; the kernel must allow it too
/// (`enable_unsafe_noiommu_mode`).
pub const UDMA_PCI_ALLOW_NOIOMMU: u32 = 1;
/// `udma_pci_options.flags`: use VFIO's container interface even where iommufd exists.
pub const UDMA_PCI_NO_IOMMUFD: u32 = 2;

/// How to open a PCI function. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct udma_pci_options {
    /// `sizeof(udma_pci_options)`.
    pub size: usize,
    /// A `udma_pci_backend`; 0: `UDMA_PCI_AUTO`.
    pub backend: u32,
    /// `UDMA_PCI_ALLOW_NOIOMMU`, `UDMA_PCI_NO_IOMMUFD` (VFIO only), or 0.
    pub flags: u32,
    /// The device's DMA mask width (QEMU's edu: 28); 0: 64 for VFIO, 32 for UIO.
    pub dma_mask_bits: u32,
    /// A `udma_irq_kind` to enable at open (VFIO only); 0: none.
    pub irq_kind: u32,
    /// How many vectors of `irq_kind`.
    pub irq_count: u32,
    /// Zero.
    pub reserved: u32,
}

// SAFETY: `repr(C)`, integers only, 8 + 6 * 4 = 32 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_pci_options {
    const NAME: &'static str = "udma_pci_options";
}

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
#[derive(Debug, Clone, Copy)]
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

// SAFETY: `repr(C)`, integers and a byte array, 8 + 8 + 4 * 4 + 64 = 96 bytes with no padding,
// `size` first.
unsafe impl abi::Sized for udma_device_info {
    const NAME: &'static str = "udma_device_info";
}

fn loopback_config(o: &udma_loopback_options) -> Result<loopback::Config, Fail> {
    let mut config = loopback::Config::default();
    if o.memory_bytes != 0 {
        let bytes = usize::try_from(o.memory_bytes)
            .map_err(|_| Fail::invalid(format!("memory_bytes {} is too large", o.memory_bytes)))?;
        config = config.memory_size(bytes);
    }
    if o.queues != 0 {
        let queues = u16::try_from(o.queues)
            .map_err(|_| Fail::invalid(format!("queues {} is above 64", o.queues)))?;
        config = config.queues(queues);
    }
    config = match o.cost_model {
        x if x == udma_cost_model::UDMA_COST_NPU as u32 => config.cost(loopback::Cost::npu()),
        x if x == udma_cost_model::UDMA_COST_ZERO as u32 => config.cost(loopback::Cost::zero()),
        other => {
            return Err(Fail::invalid(format!(
                "cost_model {other} is not a udma_cost_model (UDMA_COST_NPU 0, UDMA_COST_ZERO 1)"
            )))
        }
    };
    if o.max_depth != 0 {
        config = config.max_depth(o.max_depth);
    }
    if o.dma_mask_bits != 0 {
        config = config.dma_mask_bits(o.dma_mask_bits);
    }
    if o.flags & !UDMA_LOOPBACK_PIN_ENGINE != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_LOOPBACK_* flags",
            o.flags
        )));
    }
    if o.flags & UDMA_LOOPBACK_PIN_ENGINE != 0 {
        config = config.engine_cpu(o.engine_cpu);
    }
    Ok(config)
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

/// Starts a loopback device (`options` may be NULL: the defaults) and returns it in `*device`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range (the message names it),
/// `UDMA_ERR_SYSTEM` if the engine does not start.
///
/// # Safety
/// `options` is NULL or points to `options->size` readable bytes; `device` points to a
/// writable `udma_device *`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_open_loopback(
    options: *const udma_loopback_options,
    device: *mut *mut udma_device,
) -> udma_status {
    call("udma_device_open_loopback", || {
        let out = abi::out(device, "device")?;
        let options = if options.is_null() {
            udma_loopback_options::default()
        } else {
            // SAFETY: non-null, and readable per this function's contract.
            unsafe { abi::read(options, "options", udma_loopback_options::default())? }
        };
        let config = loopback_config(&options)?;
        let runtime = Runtime::loopback(config).map_err(Fail::from)?;
        register(runtime, out)
    })
}

fn vfio_options(o: &udma_pci_options) -> Result<vfio::Options, Fail> {
    let mut options = vfio::Options::new()
        .allow_noiommu(o.flags & UDMA_PCI_ALLOW_NOIOMMU != 0)
        .iommufd(o.flags & UDMA_PCI_NO_IOMMUFD == 0);
    if o.dma_mask_bits != 0 {
        options = options.dma_mask_bits(o.dma_mask_bits);
    }
    let kind = match o.irq_kind {
        0 => None,
        1 => Some(vfio::IrqKind::Intx),
        2 => Some(vfio::IrqKind::Msi),
        3 => Some(vfio::IrqKind::MsiX),
        other => {
            return Err(Fail::invalid(format!(
                "irq_kind {other} is not a udma_irq_kind (0 to 3)"
            )))
        }
    };
    if let Some(kind) = kind {
        options = options.interrupts(kind, o.irq_count.max(1));
    }
    Ok(options)
}

fn open_pci(bdf: pci::Bdf, o: &udma_pci_options) -> Result<Runtime, Fail> {
    if o.flags & !(UDMA_PCI_ALLOW_NOIOMMU | UDMA_PCI_NO_IOMMUFD) != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_PCI_* flags",
            o.flags
        )));
    }
    let uio = |o: &udma_pci_options| -> Result<Runtime, Fail> {
        if o.flags != 0 || o.irq_kind != 0 {
            return Err(Fail::invalid(
                "UIO takes no flags and no irq_kind (those are VFIO's): clear them, or bind \
                 the function to vfio-pci",
            ));
        }
        let bits = if o.dma_mask_bits == 0 {
            32
        } else {
            o.dma_mask_bits
        };
        let uio = device::Uio::open_with(bdf, bits).map_err(lib)?;
        Ok(Runtime::from_device(Arc::new(uio)))
    };
    match o.backend {
        0 => {
            let driver = pci::Sysfs::system()
                .driver(bdf)
                .map_err(|e| lib(device::Error::Sysfs { bdf, source: e }))?;
            match driver.as_deref() {
                Some(d) if d == pci::Driver::VfioPci.name() || d.ends_with("vfio_pci") => {
                    Runtime::open_vfio(bdf, &vfio_options(o)?).map_err(Fail::from)
                }
                Some(d) if d == pci::Driver::UioPciGeneric.name() => uio(o),
                // Unbound, another driver, no such function: the library's own message.
                _ => Runtime::open(bdf).map_err(Fail::from),
            }
        }
        1 => Runtime::open_vfio(bdf, &vfio_options(o)?).map_err(Fail::from),
        2 => uio(o),
        other => Err(Fail::invalid(format!(
            "backend {other} is not a udma_pci_backend (UDMA_PCI_AUTO 0, UDMA_PCI_VFIO 1, \
             UDMA_PCI_UIO 2)"
        ))),
    }
}

/// Opens the PCI function at `bdf` (`"0000:01:00.0"`, or `"01:00.0"` in domain 0) through
/// VFIO or UIO (`options` may be NULL: the driver it is bound to, VFIO's defaults, no
/// no-IOMMU). The function must be bound to vfio-pci or uio_pci_generic first
/// (`userdma bind`).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a malformed BDF or options; `UDMA_ERR_NOT_FOUND`
/// for no such function, or one bound to no driver or another one (the message names the
/// `userdma bind` command); `UDMA_ERR_REFUSED` for no-IOMMU mode not allowed, an IOMMU group
/// not viable, or permission; `UDMA_ERR_BUSY` for a device (its IOMMU group) another process
/// or a VM holds.
///
/// # Safety
/// `bdf` is a NUL-terminated string; `options` is NULL or points to `options->size` readable
/// bytes; `device` points to a writable `udma_device *`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_open_pci(
    bdf: *const c_char,
    options: *const udma_pci_options,
    device: *mut *mut udma_device,
) -> udma_status {
    call("udma_device_open_pci", || {
        let out = abi::out(device, "device")?;
        if bdf.is_null() {
            return Err(Fail::null("bdf"));
        }
        // SAFETY: non-null and NUL-terminated per this function's contract.
        let text = unsafe { CStr::from_ptr(bdf) }.to_string_lossy();
        let parsed: pci::Bdf = text.parse().map_err(|e| {
            Fail::invalid(format!(
                "{text:?} is not a PCI address ({e}): write it as 0000:01:00.0"
            ))
        })?;
        let options = if options.is_null() {
            udma_pci_options::default()
        } else {
            // SAFETY: non-null, and readable per this function's contract.
            unsafe { abi::read(options, "options", udma_pci_options::default())? }
        };
        let runtime = open_pci(parsed, &options).map_err(|f| f.context(parsed))?;
        register(runtime, out)
    })
}

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
#[derive(Debug, Clone, Copy)]
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

// SAFETY: `repr(C)`, integers only, 8 + 4 + 4 + 8 + 8 = 32 bytes with no padding, `size` first.
unsafe impl abi::Sized for udma_event {
    const NAME: &'static str = "udma_event";
}

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

/// A timeout that never passes.
pub const UDMA_TIMEOUT_INFINITE: u64 = u64::MAX;

/// A timeout in nanoseconds as a `Duration`, `UDMA_TIMEOUT_INFINITE` as `None`.
pub(crate) fn timeout(ns: u64) -> Option<Duration> {
    (ns != UDMA_TIMEOUT_INFINITE).then(|| Duration::from_nanos(ns))
}
