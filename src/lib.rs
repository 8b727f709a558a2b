//! userdma: drive PCIe accelerators from Linux user space.
//!
//! The crate opens a device through VFIO or UIO, maps its BARs and pinned hugepage memory into
//! the process, hands out DMA-capable buffers, and moves data through descriptor rings. A
//! device simulated in software implements the same [`device::Device`] trait from its own
//! package: the loopback NPU (`userdma-loopback`) keeps the hardware contract, so every path
//! runs without an accelerator.
//!
//! Start with the [`Runtime`]: one owner of a device, its DMA space, the memory mapped into
//! it, its buffer pools, its device memory and its queues, handing out `'static`, `Send`
//! handles ([`pool::OwnedBuffer`], [`ring::Queue`], [`device::Range`]). Here on the loopback
//! NPU, whose package adds `Runtime::loopback` and its queue format (`runtime.queue`):
//!
//! ```
//! use std::time::Duration;
//! use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime};
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
//! | [`dmabuf`] | dma-bufs: pool and region memory exported through udmabuf (with the reverse lookup), other exporters' dma-bufs imported into a DMA space, CPU access brackets |
//! | [`fence`] | completions as file descriptors other processes poll (eventfd), other drivers' fences (sync_file) to wait for, timelines of them |
//! | [`share`] | regions (pools), dma-bufs and fences passed to another process over a Unix socket (`SCM_RIGHTS`), every received message checked |
//! | [`pool`] | the DMA buffer pool: size classes, buddy blocks, per-thread caches, lock-free shared lists, borrowed and owned buffers, sharing between processes |
//!
//! **Layering** (a module uses only those to its left): `sys` ← `memory`, `mmio`, `irq`,
//! `pci` ← `dma` ← `pool`, `ring` ← `device` ← `runtime`; [`Error`] sits beside them all. The
//! inference layer (pipelines, stream scheduling, staging, statistics, planned arenas) is the
//! `userdma-infer` package, on this one and the planner (`userdma-plan`).
//!
//! **Features** (all off by default): `serde` (Serialize for the driver's plain data),
//! `io-uring` (the io_uring backend of [`irq::Waiter`]; epoll otherwise), `tracing` (`tracing`
//! spans at device open, DMA map and unmap, pool and queue creation and the runtime, events
//! for removals, error interrupts, IOMMU errors, ring protocol faults and resets; nothing on
//! the submit and complete paths: docs/tracing-events.md).
//!
//! The kernel ABI (structs, ioctl numbers, constants) lives in the `userdma-sys` crate,
//! re-exported as [`sys`].

pub use userdma_sys as sys;
/// The `zerocopy` this crate's [`Pod`](dma::Pod) is built on, for deriving descriptor types
/// without a direct dependency (`#[zerocopy(crate = "userdma::zerocopy")]`).
pub use zerocopy;

#[cfg(not(loom))]
pub mod device;
pub mod dma;
pub mod dmabuf;
pub mod fence;
pub mod irq;
pub mod memory;
pub mod mmio;
pub mod pci;
pub mod pool;
pub mod ring;
#[cfg(not(loom))]
pub mod runtime;
pub mod share;

mod error;
mod sync;

pub use self::error::Code;
#[cfg(not(loom))]
pub use self::error::Error;
#[cfg(not(loom))]
pub use self::runtime::Runtime;
