//! userdma: drive PCIe accelerators from Linux user space.
//!
//! The crate opens a device through VFIO or UIO (or a software loopback device with the same
//! contract), maps its BARs and pinned hugepage memory into the process, hands out DMA-capable
//! buffers, and moves data through descriptor rings. This file is the table of contents; each
//! module documents one concept.
//!
//! | module | owns |
//! |---|---|
//! | [`pci`] | PCI addresses (BDF), sysfs discovery, IOMMU groups, driver binding |
//! | [`dma`] | DMA address spaces (VFIO type1, iommufd, physical, loopback), the IOVA allocator, mappings, volatile handles to device-visible memory |
//! | [`memory`] | pinned host memory: hugepage regions, page sizes, mlock, NUMA placement, physical addresses, hugepage pools |
//! | [`mmio`] | typed, bounds-checked register access to BARs through swappable backends (mapped, pread/pwrite, shared memory, recording) |
//! | [`irq`] | interrupts as eventfds; waiting on many at once (io_uring, epoll fallback) |
//! | [`device`] | the `Device` trait (BARs, DMA space, interrupt vectors, reset, queue stop) and the software loopback device with the hardware contract: register map, DMA engine, cost model, in-thread or out-of-process |
//! | [`ring`] | descriptor rings: submission/completion queues in DMA memory, doorbells, phase-bit completions, ownership of in-flight buffers, waiting (poll, interrupt, future) |
//! | [`pool`] | the DMA buffer pool: size classes, buddy blocks, per-thread caches, lock-free shared lists, `Buffer`, sharing between processes |
//! | [`plan`] | static buffer planning: tensor lifetimes to offsets in one arena, in-place reuse, an exact solver |
//!
//! The kernel ABI (structs, ioctl numbers, constants) lives in the `userdma-sys` crate, re-exported
//! as [`sys`].

pub use userdma_sys as sys;

#[cfg(not(loom))]
pub mod device;
pub mod dma;
pub mod irq;
pub mod memory;
pub mod mmio;
pub mod pci;
pub mod plan;
pub mod pool;
pub mod ring;

mod sync;
