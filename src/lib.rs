//! userdma: drive PCIe accelerators from Linux user space.
//!
//! The crate opens a device through VFIO or UIO (or a software loopback device with the same
//! contract), maps its BARs and pinned hugepage memory into the process, hands out DMA-capable
//! buffers, and moves data through descriptor rings.
//!
//! Start with the [`Runtime`]: one owner of a device, its DMA space, the memory mapped into
//! it, its buffer pools, its device memory and its queues, handing out `'static`, `Send`
//! handles ([`pool::OwnedBuffer`], [`device::loopback::Queue`], [`device::Range`]):
//!
//! ```
//! use std::time::Duration;
//! use userdma::device::loopback::{self, Descriptor};
//! use userdma::memory::PageSize;
//! use userdma::{ring, Runtime};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let runtime = Runtime::loopback(loopback::Config::default())?; // or Runtime::open(bdf)
//! let pool = runtime.pool(4 << 20, PageSize::Base)?;
//! let window = runtime.device_memory()?.alloc(4096, 256)?;
//! let mut queue = runtime.queue(ring::Config::new(64))?;
//!
//! let buffer = pool.alloc_owned(4096)?;
//! buffer.write(0, b"hello, device")?;
//! let (iova, at) = (buffer.iova(), window.offset());
//! queue.push(Descriptor::to_device(iova, at, 13).build(), buffer)?;
//! let back = pool.alloc_owned(4096)?;
//! queue.push(Descriptor::to_host(at, back.iova(), 13).build(), back)?;
//! queue.flush()?;
//! let timeout = Some(Duration::from_secs(5));
//! assert!(queue.wait(timeout)?.entry.is_success());
//! let done = queue.wait(timeout)?;
//! let mut text = [0u8; 13];
//! done.payload.read(0, &mut text)?;
//! assert_eq!(&text, b"hello, device");
//! # Ok(())
//! # }
//! ```
//!
//! Each module's error gives its own stable [`Code`] next to its enum (a `code()` naming every
//! variant, so a new one cannot silently become [`Code::System`]) and converts into the crate's
//! [`Error`], whose [`Error::code`] is the wrapped error's code. This file is the table of
//! contents; each module documents one concept.
//!
//! | module | owns |
//! |---|---|
//! | [`runtime`] | one owner of a device's resources; owned handles for the layers above |
//! | [`pci`] | PCI addresses (BDF), sysfs discovery, IOMMU groups, driver binding |
//! | [`dma`] | DMA address spaces (VFIO type1, iommufd, physical, loopback), the IOVA allocator, mappings, volatile handles to device-visible memory, address types ([`dma::Iova`], [`dma::DeviceOffset`]) |
//! | [`memory`] | pinned host memory: hugepage regions, page sizes, mlock, NUMA placement, physical addresses, hugepage pools |
//! | [`mmio`] | typed, bounds-checked register access to BARs through swappable backends (mapped, pread/pwrite, shared memory, recording) |
//! | [`irq`] | interrupts as eventfds; waiting on many at once (io_uring, epoll fallback) |
//! | [`device`] | the `Device` trait (BARs, DMA space, interrupt vectors, reset, queue stop), queue formats and [`device::open_queue`], device memory ranges, and the backends: VFIO, UIO and the software loopback device (register map, descriptors, DMA engine, cost model, in-thread or out-of-process) |
//! | [`ring`] | descriptor rings: submission/completion queues in DMA memory, doorbells, phase-bit completions, ownership of in-flight buffers, waiting (poll, interrupt, future) |
//! | [`plan`] | static buffer planning: tensor lifetimes to offsets in one arena, in-place reuse, an exact solver; tensor-usage JSON, MiniMalloc CSV and ONNX readers (the `userdma-plan` package, re-exported) |
//! | [`pipeline`] | the N-deep inference pipeline: slots of host buffers and device arenas made once, frames through H2D, a planned model's layers, on-device filtering and D2H across the loopback device's copy engine and compute unit; the naive per-frame path to compare |
//! | [`sched`] | several streams on one device: round-robin, strict priority, priority with batch switching (K), a maximum wait (W), context affinity, the stated bound on a frame's wait, switch counting; a simulator that checks the bounds |
//! | [`stats`] | counters, latency histograms per stage, the time split, DMA/compute overlap, slot occupancy; JSON, Prometheus text and SVG plots |
//! | [`stage`] | zero-copy staging: files read into and written from pool buffers with io_uring fixed buffers, O_DIRECT where the file system supports it, many requests in flight |
//! | [`pool`] | the DMA buffer pool: size classes, buddy blocks, per-thread caches, lock-free shared lists, borrowed and owned buffers, sharing between processes |
//!
//! **Layering** (a module uses only those to its left): `sys` ← `memory`, `mmio`, `irq`,
//! `pci` ← `dma` ← `pool`, `ring` ← `device` ← `runtime` ← `pipeline`, `stage` (on `pool`); `stats`
//! stands alone, and `plan` is a package of its own below them all (`userdma-plan`, which
//! depends on nothing here); [`Error`] sits beside them all.
//!
//! The kernel ABI (structs, ioctl numbers, constants) lives in the `userdma-sys` crate,
//! re-exported as [`sys`].

pub use userdma_sys as sys;

#[cfg(not(loom))]
pub mod device;
pub mod dma;
pub mod irq;
pub mod memory;
pub mod mmio;
pub mod pci;
#[cfg(not(loom))]
pub mod pipeline;
/// Static buffer planning: the [`userdma-plan`](userdma_plan) package, re-exported.
pub use userdma_plan as plan;
pub mod pool;
pub mod ring;
#[cfg(not(loom))]
pub mod runtime;
pub mod sched;
#[cfg(not(loom))]
pub mod stage;
pub mod stats;

mod error;
mod keep;
mod sync;
mod wake;

pub use self::error::Code;
#[cfg(not(loom))]
pub use self::error::Error;
#[cfg(not(loom))]
pub use self::runtime::Runtime;
