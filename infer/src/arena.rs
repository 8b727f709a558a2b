//! A planned model bound to memory: every tensor of a [`Plan`] at its address in one arena
//! that is allocated (and, for host memory, DMA-mapped) once, when the model is set up.
//!
//! - [`DeviceArena`]: the arena as one [`Range`] of the device's own memory (the loopback
//!   device's BAR 2, an NPU's DRAM); each tensor gets its [`DeviceOffset`].
//! - [`HostArena`]: the arena as host memory mapped once into the device's DMA space; each
//!   tensor gets its host address and [`Iova`].
//!
//! Looking a tensor up allocates nothing and maps nothing: running a planned model touches
//! no allocator.
//!
//! ```text
//! let arena = DeviceArena::new(runtime.device_memory()?, &plan)?;   // device memory
//! let host = HostArena::new(&runtime, &plan, PageSize::Base)?;      // host memory, DMA-mapped
//! ```

use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;

use crate::plan::Plan;
use userdma::device::{DeviceMemory, Range};
use userdma::dma::{self, DeviceOffset, Iova, Slice};
use userdma::memory::PageSize;
use userdma::Runtime;

use crate::Error;

/// Where each tensor of a plan sits in its arena, by id.
#[derive(Debug, Clone)]
struct Offsets {
    /// Tensor id -> (offset in the arena, bytes).
    by_id: HashMap<u64, (u64, u64)>,
    /// The arena's size (at least one alignment unit).
    len: u64,
    align: u64,
}

impl Offsets {
    fn of(plan: &Plan) -> Offsets {
        Offsets {
            by_id: plan
                .placements
                .iter()
                .map(|p| (p.id, (p.offset, p.bytes)))
                .collect(),
            len: plan.arena_bytes.max(plan.align.max(1)),
            align: plan.align.max(1),
        }
    }
}

/// A plan's arena in device memory.
pub struct DeviceArena {
    range: Range,
    offsets: Offsets,
}

impl fmt::Debug for DeviceArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceArena")
            .field("range", &self.range)
            .field("tensors", &self.offsets.by_id.len())
            .finish()
    }
}

/// A tensor in device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTensor {
    /// Its first byte in device memory.
    pub offset: DeviceOffset,
    /// Its size.
    pub bytes: u64,
}

impl DeviceArena {
    /// Takes `plan.arena_bytes` of `memory`, aligned to the plan's alignment, for `plan`.
    ///
    /// # Errors
    /// [`Error::Driver`] (a device error) if the device memory has no free range that large.
    pub fn new(memory: &DeviceMemory, plan: &Plan) -> Result<DeviceArena, Error> {
        let offsets = Offsets::of(plan);
        let range = memory.alloc(offsets.len, offsets.align)?;
        Ok(DeviceArena { range, offsets })
    }

    /// Where tensor `id` lives, or `None` for an id the plan does not have.
    pub fn tensor(&self, id: u64) -> Option<DeviceTensor> {
        let &(offset, bytes) = self.offsets.by_id.get(&id)?;
        Some(DeviceTensor {
            offset: self.range.at(offset)?,
            bytes,
        })
    }

    /// The range the arena occupies.
    pub fn range(&self) -> &Range {
        &self.range
    }
}

/// A plan's arena in host memory mapped into the device's DMA space.
#[derive(Debug)]
pub struct HostArena {
    mapping: dma::Mapping,
    offsets: Offsets,
}

/// A tensor in host DMA memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostTensor {
    /// The address the device uses for its first byte.
    pub iova: Iova,
    /// Its host address (raw: the device writes it; never make a reference from it).
    pub ptr: NonNull<u8>,
    /// Offset of its first byte in the arena's mapping.
    pub offset: usize,
    /// Its size.
    pub bytes: u64,
}

impl HostArena {
    /// Maps `plan.arena_bytes` of fresh `page_size` memory into `runtime`'s DMA space, once.
    ///
    /// # Errors
    /// As [`Runtime::map_memory`]; [`Error::Driver`] (a DMA error) if the mapping is not one IOVA range (the
    /// tensors would not be reachable by one address each).
    pub fn new(runtime: &Runtime, plan: &Plan, page_size: PageSize) -> Result<HostArena, Error> {
        let offsets = Offsets::of(plan);
        let len = usize::try_from(offsets.len).map_err(|_| dma::Error::OutOfBounds {
            offset: 0,
            len: usize::MAX,
            size: 0,
        })?;
        let mapping = runtime.map_memory(len, page_size)?;
        Ok(HostArena { mapping, offsets })
    }

    /// Where tensor `id` lives, or `None` for an id the plan does not have (or whose bytes are
    /// not IOVA-contiguous in this mapping: map with hugepages for a large arena).
    pub fn tensor(&self, id: u64) -> Option<HostTensor> {
        let &(offset, bytes) = self.offsets.by_id.get(&id)?;
        let offset = usize::try_from(offset).ok()?;
        let len = usize::try_from(bytes).ok()?;
        if self.mapping.contiguous_len(offset) < len {
            return None;
        }
        let iova = self.mapping.iova(offset)?;
        // SAFETY: `offset` is inside the mapping (`iova` answered for it), so the pointer
        // stays inside the mapped region.
        let ptr = unsafe { self.mapping.as_ptr().add(offset) };
        Some(HostTensor {
            iova,
            ptr,
            offset,
            bytes,
        })
    }

    /// A volatile view of tensor `id`'s bytes.
    pub fn slice(&self, id: u64) -> Option<Slice<'_>> {
        let t = self.tensor(id)?;
        self.mapping
            .slice_at(t.offset, usize::try_from(t.bytes).ok()?)
            .ok()
    }

    /// The mapping that holds the arena.
    pub fn mapping(&self) -> &dma::Mapping {
        &self.mapping
    }
}
