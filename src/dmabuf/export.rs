//! Export: memfd ranges of a region as one dma-buf through `/dev/udmabuf`, and the table that
//! answers which region bytes a dma-buf is.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use userdma_sys::dmabuf::{
    udmabuf_create, udmabuf_create_item, udmabuf_create_list, UDMABUF_FLAGS_CLOEXEC, UDMABUF_PATH,
};

use super::{kernel_release, major_minor, raw, DmaBuf, Error};
use crate::memory::{base_page_size, PageSize, Region};

/// The most ranges one export takes (udmabuf's default `list_limit`).
const MAX_RANGES: usize = 1024;
/// The first kernel whose udmabuf maps huge pages into the kernel at the right offset
/// ("udmabuf: fix vmap missed offset page").
const VMAP_FIXED: (u32, u32) = (6, 17);
/// Where the transparent hugepage settings live.
const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// Who will use an exported dma-buf, which decides what memory may be exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Importers {
    /// Any importer, including those that map the buffer into the kernel (V4L2 capture writes
    /// frames through such a mapping). Memory in huge pages is refused on kernels whose udmabuf
    /// gets that mapping wrong (before 6.17).
    #[default]
    Any,
    /// Importers that only DMA through the buffer's scatter list (a NIC, a GPU, a device
    /// driver's DMA engine): huge pages are fine on every kernel.
    DmaOnly,
}

/// A dma-buf made of ranges of a region, and the region it keeps alive.
#[derive(Debug)]
pub struct Export {
    buf: DmaBuf,
    origin: Origin,
}

impl Export {
    /// The dma-buf.
    pub fn dmabuf(&self) -> &DmaBuf {
        &self.buf
    }

    /// The dma-buf, owned (the region stays alive through the kernel's reference to its memfd;
    /// [`origin`] still finds it while the region is alive in this process).
    pub fn into_dmabuf(self) -> DmaBuf {
        self.buf
    }

    /// Where its bytes are.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The region offset of byte `offset` of the dma-buf.
    pub fn region_offset(&self, offset: usize) -> Option<usize> {
        self.origin.region_offset(offset)
    }
}

/// Which bytes of which region a userdma dma-buf is: its ranges, in dma-buf order.
#[derive(Debug, Clone)]
pub struct Origin {
    /// The region.
    pub region: Arc<Region>,
    /// `(offset in the region, length)` of each range, in the order the dma-buf holds them.
    pub ranges: Vec<(usize, usize)>,
}

impl Origin {
    /// The region offset of byte `offset` of the dma-buf, `None` past its end.
    pub fn region_offset(&self, offset: usize) -> Option<usize> {
        let mut start = 0usize;
        for &(at, len) in &self.ranges {
            if offset < start + len {
                return Some(at + (offset - start));
            }
            start += len;
        }
        None
    }

    /// The one range, when the dma-buf is one contiguous run of the region.
    pub fn contiguous(&self) -> Option<(usize, usize)> {
        let (first, rest) = self.ranges.split_first()?;
        let mut end = first.0 + first.1;
        for &(at, len) in rest {
            if at != end {
                return None;
            }
            end += len;
        }
        Some((first.0, end - first.0))
    }
}

/// What the table keeps per export: the region weakly (the dma-buf may outlive it here).
#[derive(Debug)]
struct Entry {
    region: Weak<Region>,
    ranges: Vec<(usize, usize)>,
}

/// Exports of this process, by dma-buf inode (unique: the kernel numbers dma-bufs from a 64-bit
/// counter and never reuses a number).
static EXPORTS: Mutex<Option<HashMap<u64, Entry>>> = Mutex::new(None);

fn exports() -> MutexGuard<'static, Option<HashMap<u64, Entry>>> {
    // A panic while holding the lock leaves the table consistent (every change is one insert
    // or one retain), so a poisoned lock is still usable.
    EXPORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Which region bytes `buf` is, if this process exported it and the region is still alive: the
/// reverse lookup, for a dma-buf an importer (or another process) hands back.
pub fn origin(buf: &DmaBuf) -> Option<Origin> {
    let guard = exports();
    let entry = guard.as_ref()?.get(&buf.inode())?;
    let region = entry.region.upgrade()?;
    let len: usize = entry.ranges.iter().map(|&(_, len)| len).sum();
    (len == buf.len()).then(|| Origin {
        region,
        ranges: entry.ranges.clone(),
    })
}

/// [`export`] of one range.
///
/// # Errors
/// As [`export`].
pub fn export_range(
    region: &Arc<Region>,
    offset: usize,
    len: usize,
    importers: Importers,
) -> Result<Export, Error> {
    export(region, &[(offset, len)], importers)
}

/// Makes one dma-buf of `ranges` (`(offset, length)` in `region`, page-aligned, in the order the
/// dma-buf holds them; at most 1,024) through `/dev/udmabuf`. The region must live in a memfd.
/// The dma-buf is named `userdma` (shown in `/proc/<pid>/fdinfo`) and recorded for [`origin`].
///
/// # Errors
/// [`Error::RangeCount`], [`Error::Range`] for bad ranges; [`Error::NotMemfd`] for memory not in a
/// memfd; [`Error::HugePages`] for huge-page memory and [`Importers::Any`] on a kernel that maps
/// it wrong; [`Error::NoUdmabuf`] when the kernel has no udmabuf; [`Error::Create`] when it
/// refuses.
pub fn export(
    region: &Arc<Region>,
    ranges: &[(usize, usize)],
    importers: Importers,
) -> Result<Export, Error> {
    if ranges.is_empty() || ranges.len() > MAX_RANGES {
        return Err(Error::RangeCount {
            count: ranges.len(),
            max: MAX_RANGES,
        });
    }
    let page = base_page_size();
    for &(offset, len) in ranges {
        let inside = offset
            .checked_add(len)
            .is_some_and(|end| end <= region.len());
        if len == 0 || offset % page != 0 || len % page != 0 || !inside {
            return Err(Error::Range {
                offset,
                len,
                region_len: region.len(),
                page,
            });
        }
    }
    let memfd = region.fd().ok_or(Error::NotMemfd {
        what: if region.is_owned() {
            "anonymous memory"
        } else {
            "the caller's memory"
        },
    })?;
    if importers == Importers::Any {
        check_page_size(region.page_size(), Path::new(THP_DIR))?;
    }
    let udmabuf = OpenOptions::new()
        .read(true)
        .write(true)
        .open(UDMABUF_PATH)
        .map_err(|source| Error::NoUdmabuf { source })?;
    let total: usize = ranges.iter().map(|&(_, len)| len).sum();
    let memfd_raw = u32::try_from(memfd.as_raw_fd()).map_err(|_| Error::Stat {
        source: io::Error::from_raw_os_error(libc::EBADF),
    })?;
    let created = if let [(offset, len)] = ranges {
        let create = udmabuf_create {
            memfd: memfd_raw,
            flags: UDMABUF_FLAGS_CLOEXEC,
            offset: *offset as u64,
            size: *len as u64,
        };
        // SAFETY: the kernel reads one complete `udmabuf_create`.
        unsafe { raw::udmabuf_create(udmabuf.as_raw_fd(), &create) }
    } else {
        let list = CreateList::new(memfd_raw, ranges);
        // SAFETY: `list` is a header followed by `count` items in one allocation that outlives
        // the call; the kernel reads exactly that.
        unsafe { raw::udmabuf_create_list(udmabuf.as_raw_fd(), list.as_ptr()) }
    };
    let fd = created.map_err(|e| Error::Create {
        len: total,
        source: e.into(),
    })?;
    // SAFETY: the kernel just installed this descriptor (the new dma-buf) for the caller, who
    // now owns it.
    let buf = DmaBuf::from_fd(unsafe { OwnedFd::from_raw_fd(fd) })?;
    // The name is for people reading fdinfo; a kernel that refuses it changes nothing else.
    let _ = buf.set_name("userdma");
    let mut table = exports();
    let table = table.get_or_insert_with(HashMap::new);
    table.retain(|_, entry| entry.region.strong_count() > 0);
    table.insert(
        buf.inode(),
        Entry {
            region: Arc::downgrade(region),
            ranges: ranges.to_vec(),
        },
    );
    Ok(Export {
        buf,
        origin: Origin {
            region: Arc::clone(region),
            ranges: ranges.to_vec(),
        },
    })
}

/// Refuses memory in huge pages when this kernel's udmabuf maps them into the kernel wrongly.
pub(super) fn check_page_size(page_size: PageSize, thp_dir: &Path) -> Result<(), Error> {
    let kernel = kernel_release();
    if major_minor(&kernel).is_some_and(|version| version >= VMAP_FIXED) {
        return Ok(());
    }
    let backing = if page_size.is_huge() {
        "memory in hugetlb pages"
    } else if shmem_thp_possible(thp_dir) {
        "shmem memory while shmem transparent hugepages are on (shmem_enabled)"
    } else {
        return Ok(());
    };
    Err(Error::HugePages { backing, kernel })
}

/// Whether a memfd's pages may be transparent huge pages: `shmem_enabled` (or a per-size
/// `hugepages-*/shmem_enabled`) set to a policy that gives them without `madvise`.
pub(super) fn shmem_thp_possible(thp_dir: &Path) -> bool {
    let selected = |path: &Path| -> Option<String> {
        let text = fs::read_to_string(path).ok()?;
        let start = text.find('[')?;
        let end = text[start..].find(']')? + start;
        Some(text[start + 1..end].to_owned())
    };
    let gives = |policy: &str| matches!(policy, "always" | "within_size" | "force");
    let top = selected(&thp_dir.join("shmem_enabled"));
    if top.as_deref().is_some_and(gives) {
        return true;
    }
    let Ok(sizes) = fs::read_dir(thp_dir) else {
        return false;
    };
    sizes.flatten().any(|entry| {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("hugepages-") {
            return false;
        }
        match selected(&entry.path().join("shmem_enabled")).as_deref() {
            Some("inherit") => top.as_deref().is_some_and(gives),
            Some(policy) => gives(policy),
            None => false,
        }
    })
}

/// A `udmabuf_create_list` header and its items in one allocation of `u64`s (the struct's
/// alignment).
pub(super) struct CreateList {
    words: Vec<u64>,
}

impl CreateList {
    pub(super) fn new(memfd: u32, ranges: &[(usize, usize)]) -> CreateList {
        const HEADER: usize = size_of::<udmabuf_create_list>() / 8;
        const ITEM: usize = size_of::<udmabuf_create_item>() / 8;
        let mut words = vec![0u64; HEADER + ITEM * ranges.len()];
        let header = udmabuf_create_list {
            flags: UDMABUF_FLAGS_CLOEXEC,
            // At most MAX_RANGES, checked by the caller.
            count: ranges.len() as u32,
            list: [],
        };
        // SAFETY: `words` holds HEADER words, 8-aligned, and `header` is plain data of that
        // size; the write stays inside the allocation.
        unsafe {
            words
                .as_mut_ptr()
                .cast::<udmabuf_create_list>()
                .write(header)
        };
        for (index, &(offset, len)) in ranges.iter().enumerate() {
            let item = udmabuf_create_item {
                memfd,
                __pad: 0,
                offset: offset as u64,
                size: len as u64,
            };
            // SAFETY: item `index` occupies words HEADER + index * ITEM .. + ITEM, inside the
            // allocation sized for every item, 8-aligned as the struct needs.
            unsafe {
                words
                    .as_mut_ptr()
                    .add(HEADER + index * ITEM)
                    .cast::<udmabuf_create_item>()
                    .write(item)
            };
        }
        CreateList { words }
    }

    pub(super) fn as_ptr(&self) -> *const udmabuf_create_list {
        self.words.as_ptr().cast()
    }
}
