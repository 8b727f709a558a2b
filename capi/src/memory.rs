//! Memory: regions mapped into a device's DMA space (`udma_mapping`), buffer pools
//! (`udma_pool`) and their buffers (`udma_buffer`).
//!
//! A buffer handle names a slot that holds either the buffer (on the host: the caller may read
//! and write it, free it, submit it) or the queue it was submitted to (the device owns it: it
//! cannot be freed, read or written through the library until its completion hands it back,
//! under the same handle).
//!
//! Buffers and pools are in lock-free handle tables ([`crate::slots`]). An allocation takes
//! no lock and no atomic read-modify-write: it reads the pool's slot inside a quiescence
//! section ([`crate::quiesce`]: a store to this thread's record) and fills a buffer slot from
//! this thread's own list of free ones. A free is one compare-and-swap, on the buffer's slot.
//! A buffer holds its pool by a plain reference ([`HostBuffer`]); `udma_pool_destroy` keeps
//! that reference valid: it locks the pool's slot, waits out the allocations in progress, and
//! removes the pool only if no buffer slot names it.

use udma::memory::PageSize;

use crate::error::Fail;

// cbindgen writes the header's declarations in the order it reads them, modules in the order
// they are declared: the modules with `udma_*` functions are declared (a group each, which
// rustfmt keeps) in the order of those functions in the header.
#[path = "memory/mapping.rs"]
mod mapping;

#[path = "memory/pool.rs"]
mod pool;

#[path = "memory/alloc.rs"]
mod alloc;

#[path = "memory/stats.rs"]
mod stats;

#[path = "memory/buffer.rs"]
mod buffer;

#[path = "memory/local.rs"]
mod local;
#[path = "memory/queued.rs"]
mod queued;
#[path = "memory/tables.rs"]
mod tables;

pub use alloc::{udma_pool_alloc, udma_pool_alloc_bulk, udma_pool_free, udma_pool_free_bulk};
pub(crate) use buffer::with_host_buffer;
pub use buffer::{
    udma_buffer_get_info, udma_buffer_info, udma_buffer_read, udma_buffer_state, udma_buffer_write,
};
pub(crate) use mapping::{access, register_part, MAPPINGS};
pub use mapping::{
    udma_access, udma_mapping, udma_mapping_destroy, udma_mapping_fd, udma_mapping_get_info,
    udma_mapping_info, udma_mapping_iova, udma_memory_map, udma_memory_map_user,
    udma_memory_map_user_access,
};
pub use pool::{
    udma_pool_create, udma_pool_destroy, udma_pool_options, UDMA_POOL_COLOURED,
    UDMA_POOL_PAGE_ALIGNED,
};
pub(crate) use queued::{forget_queued, give_back, take_for_queue};
pub use stats::{udma_pool_get_stats, udma_pool_stats};
pub(crate) use tables::HostBuffer;
pub use tables::{udma_buffer, udma_pool};

/// `udma_memory_map`'s and `udma_pool_options`' page size.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_page_size {
    /// The CPU's base pages (4 KiB): no hugepages needed, IOVA-contiguous per page only.
    UDMA_PAGE_BASE = 0,
    /// 2 MiB hugepages (reserve them first: `userdma hugepages`).
    UDMA_PAGE_2M = 1,
    /// 1 GiB hugepages.
    UDMA_PAGE_1G = 2,
}

/// A `udma_page_size` as the library's.
pub(crate) fn page_size_of(raw: u32) -> Result<PageSize, Fail> {
    page_size(raw)
}

fn page_size(raw: u32) -> Result<PageSize, Fail> {
    match raw {
        0 => Ok(PageSize::Base),
        1 => Ok(PageSize::Huge2M),
        2 => Ok(PageSize::Huge1G),
        other => Err(Fail::invalid(format!(
            "page size {other} is not a udma_page_size (UDMA_PAGE_BASE 0, UDMA_PAGE_2M 1, \
             UDMA_PAGE_1G 2)"
        ))),
    }
}

fn bytes(raw: u64, what: &str) -> Result<usize, Fail> {
    if raw == 0 {
        return Err(Fail::invalid(format!(
            "{what} is 0: ask for at least one byte"
        )));
    }
    usize::try_from(raw).map_err(|_| Fail::invalid(format!("{what} {raw} is too large")))
}
