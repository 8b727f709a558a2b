//! dma-buf (`<linux/dma-buf.h>`), udmabuf (`<linux/udmabuf.h>`) and the dma-heaps
//! (`<linux/dma-heap.h>`): buffers shared between drivers by file descriptor.
//!
//! A dma-buf is a file whose size is the buffer's (`lseek(fd, 0, SEEK_END)`); an importer (V4L2,
//! DRM, an RDMA NIC) attaches to it and gets the pages' DMA addresses; a CPU user may `mmap` it and
//! brackets its accesses with [`DMA_BUF_IOCTL_SYNC`]. `/dev/udmabuf` (Linux 4.20,
//! `CONFIG_UDMABUF`) makes a dma-buf of ranges of a memfd sealed with `F_SEAL_SHRINK` (and not
//! `F_SEAL_WRITE`): [`UDMABUF_CREATE`] for one range, [`UDMABUF_CREATE_LIST`] for several;
//! offsets and sizes must be page-aligned. `/dev/dma_heap/<heap>` (Linux 5.6) allocates new
//! dma-bufs ([`DMA_HEAP_IOCTL_ALLOC`]).
//!
//! Structs are written here from the headers (no bindings crate carries them); the layout of each
//! is asserted below and compared against the headers by `tests/kernel_abi.rs`.

use crate::ioctl::{iow, iowr, Ioctl};

/// The udmabuf device node.
pub const UDMABUF_PATH: &str = "/dev/udmabuf";
/// The directory of the dma-heap device nodes (`system`, and `linux,cma` where configured).
pub const DMA_HEAP_DIR: &str = "/dev/dma_heap";

/// `f_type` of the dma-buf pseudo-filesystem (`fstatfs` of a dma-buf fd), `<linux/magic.h>`.
pub const DMA_BUF_MAGIC: i64 = 0x444d_4142;

/// `udmabuf_create.flags`: the new dma-buf fd is close-on-exec.
pub const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;

/// [`UDMABUF_CREATE`]'s argument: one range of a memfd.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct udmabuf_create {
    /// The memfd.
    pub memfd: u32,
    /// [`UDMABUF_FLAGS_CLOEXEC`] or 0.
    pub flags: u32,
    /// Byte offset in the memfd (page-aligned).
    pub offset: u64,
    /// Bytes (page-aligned, nonzero).
    pub size: u64,
}

/// One range of a [`udmabuf_create_list`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct udmabuf_create_item {
    /// The memfd.
    pub memfd: u32,
    /// Zero.
    pub __pad: u32,
    /// Byte offset in the memfd (page-aligned).
    pub offset: u64,
    /// Bytes (page-aligned, nonzero).
    pub size: u64,
}

/// [`UDMABUF_CREATE_LIST`]'s argument header; `count` [`udmabuf_create_item`]s follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct udmabuf_create_list {
    /// [`UDMABUF_FLAGS_CLOEXEC`] or 0.
    pub flags: u32,
    /// How many items follow (at most the module's `list_limit`, 1024 by default).
    pub count: u32,
    /// The items (a flexible array member in C).
    pub list: [udmabuf_create_item; 0],
}

/// Makes a dma-buf of one memfd range, from a [`udmabuf_create`]; returns the new fd.
pub const UDMABUF_CREATE: Ioctl = iow::<udmabuf_create>(b'u', 0x42);
/// Makes a dma-buf of several memfd ranges, from a [`udmabuf_create_list`] and its items; returns
/// the new fd.
pub const UDMABUF_CREATE_LIST: Ioctl = iow::<udmabuf_create_list>(b'u', 0x43);

/// `dma_buf_sync.flags`: the CPU reads.
pub const DMA_BUF_SYNC_READ: u64 = 1;
/// `dma_buf_sync.flags`: the CPU writes.
pub const DMA_BUF_SYNC_WRITE: u64 = 2;
/// `dma_buf_sync.flags`: reads and writes.
pub const DMA_BUF_SYNC_RW: u64 = DMA_BUF_SYNC_READ | DMA_BUF_SYNC_WRITE;
/// `dma_buf_sync.flags`: a CPU access begins.
pub const DMA_BUF_SYNC_START: u64 = 0;
/// `dma_buf_sync.flags`: a CPU access ends.
pub const DMA_BUF_SYNC_END: u64 = 1 << 2;
/// Every flag [`DMA_BUF_IOCTL_SYNC`] accepts.
pub const DMA_BUF_SYNC_VALID_FLAGS_MASK: u64 = DMA_BUF_SYNC_RW | DMA_BUF_SYNC_END;
/// The dma-buf ioctl type.
pub const DMA_BUF_BASE: u8 = b'b';

/// [`DMA_BUF_IOCTL_SYNC`]'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dma_buf_sync {
    /// `DMA_BUF_SYNC_*`.
    pub flags: u64,
}

/// Brackets CPU access to an mmap of a dma-buf (start before, end after), from a
/// [`dma_buf_sync`].
pub const DMA_BUF_IOCTL_SYNC: Ioctl = iow::<dma_buf_sync>(DMA_BUF_BASE, 0);

/// Names a dma-buf (shown as `name:` in its `/proc/<pid>/fdinfo`): the argument is a pointer to
/// a NUL-terminated string of at most [`DMA_BUF_NAME_LEN`] bytes with the NUL (the 64-bit
/// number, `DMA_BUF_SET_NAME_B`).
pub const DMA_BUF_SET_NAME: Ioctl = iow::<u64>(DMA_BUF_BASE, 1);
/// The longest dma-buf name, with its NUL.
pub const DMA_BUF_NAME_LEN: usize = 32;

/// [`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`]'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dma_buf_export_sync_file {
    /// [`DMA_BUF_SYNC_READ`] (the fences a reader waits for: writers), [`DMA_BUF_SYNC_WRITE`]
    /// (a writer waits for every access), or both.
    pub flags: u32,
    /// Out: a `sync_file` fd, readable (`POLLIN`) once those fences have signalled.
    pub fd: i32,
}

/// Exports the dma-buf's current fences as a `sync_file` (Linux 6.0), from a
/// [`dma_buf_export_sync_file`].
pub const DMA_BUF_IOCTL_EXPORT_SYNC_FILE: Ioctl = iowr::<dma_buf_export_sync_file>(DMA_BUF_BASE, 2);

/// [`DMA_HEAP_IOCTL_ALLOC`]'s argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct dma_heap_allocation_data {
    /// Bytes (rounded up to a page by the heap).
    pub len: u64,
    /// Out: the new dma-buf fd.
    pub fd: u32,
    /// Flags of the new fd: [`DMA_HEAP_VALID_FD_FLAGS`] (`O_RDWR | O_CLOEXEC`).
    pub fd_flags: u32,
    /// Heap-specific flags (none are defined).
    pub heap_flags: u64,
}

/// The fd flags a heap accepts: `O_CLOEXEC | O_ACCMODE`.
pub const DMA_HEAP_VALID_FD_FLAGS: u32 = (libc::O_CLOEXEC | libc::O_ACCMODE) as u32;
/// The heap flags a heap accepts (none).
pub const DMA_HEAP_VALID_HEAP_FLAGS: u64 = 0;
/// The dma-heap ioctl type.
pub const DMA_HEAP_IOC_MAGIC: u8 = b'H';
/// Allocates a dma-buf from a heap, from a [`dma_heap_allocation_data`].
pub const DMA_HEAP_IOCTL_ALLOC: Ioctl = iowr::<dma_heap_allocation_data>(DMA_HEAP_IOC_MAGIC, 0x0);

// ---- layout proof (x86_64 / every LP64 target) ----

assert_layout! {
    udmabuf_create { size: 24, align: 8 }
    fields { memfd: 0, flags: 4, offset: 8, size: 16 }
}
assert_layout! {
    udmabuf_create_item { size: 24, align: 8 }
    fields { memfd: 0, __pad: 4, offset: 8, size: 16 }
}
assert_layout! {
    udmabuf_create_list { size: 8, align: 8 }
    fields { flags: 0, count: 4, list: 8 }
}
assert_layout! {
    dma_buf_sync { size: 8, align: 8 }
    fields { flags: 0 }
}
assert_layout! {
    dma_buf_export_sync_file { size: 8, align: 4 }
    fields { flags: 0, fd: 4 }
}
assert_layout! {
    dma_heap_allocation_data { size: 24, align: 8 }
    fields { len: 0, fd: 8, fd_flags: 12, heap_flags: 16 }
}
