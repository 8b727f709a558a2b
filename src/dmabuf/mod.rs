//! dma-bufs: buffers shared with the rest of Linux by file descriptor.
//!
//! A video decoder, a camera (V4L2), a GPU (DRM) or an RDMA NIC hands buffers to other drivers as
//! dma-bufs. This module makes the memory a device's pool lives in one of them, and takes theirs
//! in:
//!
//! - **Export** ([`export`]): page-aligned ranges of a [`Region`] that lives
//!   in a memfd (every region [`Runtime::pool`](crate::Runtime::pool) and `map_memory` make) become
//!   one dma-buf through `/dev/udmabuf`: an importer writes frames straight into the pool's
//!   buffers. The reverse lookup ([`origin`], [`Export::region_offset`]) says which bytes of which
//!   region a dma-buf (or an offset in it) is, so the buffer an importer hands back is known.
//!   Memory in huge pages (hugetlb, shmem THP) is refused for importers that map the buffer into
//!   the kernel ([`Importers`]): udmabuf's kernel mapping of huge pages is wrong before Linux 6.17.
//! - **Import** ([`import`]): another exporter's dma-buf (the system dma-heap, a udmabuf, a
//!   V4L2 `EXPBUF`) mapped into a device's DMA space where the kernel can pin it, and a clear error
//!   naming the kernel feature where it cannot. See [`Via`] for the three ways.
//! - **CPU access and fences**: [`DmaBuf::cpu_view`] maps a dma-buf for the CPU, bracketed by
//!   [`DmaBuf::sync`]; [`DmaBuf::fence`] exports the fences of other drivers' work on it as a
//!   `sync_file` ([`crate::fence::Fence`]) to wait for.
//!
//! The guide is `docs/interop.md`.

mod export;
mod import;

use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use userdma_sys::dmabuf::{
    dma_buf_export_sync_file, dma_buf_sync, DMA_BUF_MAGIC, DMA_BUF_NAME_LEN, DMA_BUF_SYNC_END,
    DMA_BUF_SYNC_READ, DMA_BUF_SYNC_START, DMA_BUF_SYNC_WRITE,
};

pub use self::export::{export, export_range, origin, Export, Importers, Origin};
pub use self::import::{import, Imported, Via};

use crate::dma;
use crate::fence::Fence;
use crate::memory::{self, Region};

mod raw {
    use userdma_sys::dmabuf::{
        dma_buf_export_sync_file, dma_buf_sync, udmabuf_create, udmabuf_create_list,
        DMA_BUF_IOCTL_EXPORT_SYNC_FILE, DMA_BUF_IOCTL_SYNC, DMA_BUF_SET_NAME, UDMABUF_CREATE,
        UDMABUF_CREATE_LIST,
    };

    nix::ioctl_write_ptr_bad!(dma_buf_sync, DMA_BUF_IOCTL_SYNC, dma_buf_sync);
    nix::ioctl_write_ptr_bad!(dma_buf_set_name, DMA_BUF_SET_NAME, libc::c_char);
    nix::ioctl_readwrite_bad!(
        dma_buf_export_sync_file,
        DMA_BUF_IOCTL_EXPORT_SYNC_FILE,
        dma_buf_export_sync_file
    );
    nix::ioctl_write_ptr_bad!(udmabuf_create, UDMABUF_CREATE, udmabuf_create);
    nix::ioctl_write_ptr_bad!(
        udmabuf_create_list,
        UDMABUF_CREATE_LIST,
        udmabuf_create_list
    );
}

/// A dma-buf: the file descriptor (owned, closed on drop) and its size. Any exporter's.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    len: usize,
    inode: u64,
}

/// Which CPU accesses a [`DmaBuf::sync`] brackets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuAccess {
    /// The CPU reads.
    Read,
    /// The CPU writes.
    Write,
    /// Both.
    ReadWrite,
}

impl CpuAccess {
    fn flags(self) -> u64 {
        match self {
            CpuAccess::Read => DMA_BUF_SYNC_READ,
            CpuAccess::Write => DMA_BUF_SYNC_WRITE,
            CpuAccess::ReadWrite => DMA_BUF_SYNC_READ | DMA_BUF_SYNC_WRITE,
        }
    }
}

impl DmaBuf {
    /// Takes a dma-buf fd (from an exporter, a Unix socket, [`export`]); checks it is one and
    /// reads its size.
    ///
    /// # Errors
    /// [`Error::NotDmaBuf`] for any other file; [`Error::Stat`] when it cannot be examined.
    pub fn from_fd(fd: OwnedFd) -> Result<DmaBuf, Error> {
        let statfs =
            nix::sys::statfs::fstatfs(&fd).map_err(|e| Error::Stat { source: e.into() })?;
        // `__fsword_t` is i64 on 64-bit targets, i32 on 32-bit ones.
        #[allow(clippy::useless_conversion)]
        let magic = i64::from(statfs.filesystem_type().0);
        if magic != DMA_BUF_MAGIC {
            return Err(Error::NotDmaBuf { magic });
        }
        let stat = nix::sys::stat::fstat(&fd).map_err(|e| Error::Stat { source: e.into() })?;
        // A dma-buf's size is what seeking to its end says (its inode's size on the kernels that
        // set one); the position is put back to 0.
        let end = nix::unistd::lseek(&fd, 0, nix::unistd::Whence::SeekEnd)
            .map_err(|e| Error::Stat { source: e.into() })?;
        let _ = nix::unistd::lseek(&fd, 0, nix::unistd::Whence::SeekSet);
        let len = usize::try_from(end).map_err(|_| Error::Stat {
            source: io::Error::from_raw_os_error(libc::EOVERFLOW),
        })?;
        Ok(DmaBuf {
            fd,
            len,
            inode: stat.st_ino,
        })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (no exporter makes one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file descriptor, to hand to an importer (V4L2 `QBUF`'s `m.fd`, DRM PRIME import).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The file descriptor, owned: the caller closes it.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Another descriptor of the same dma-buf (`dup`).
    ///
    /// # Errors
    /// [`Error::Stat`] when the process is out of descriptors.
    pub fn try_clone(&self) -> Result<DmaBuf, Error> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|source| Error::Stat { source })?;
        Ok(DmaBuf {
            fd,
            len: self.len,
            inode: self.inode,
        })
    }

    /// The dma-buf's inode number: unique among the dma-bufs alive (the kernel numbers them from
    /// a 64-bit counter), and the same in every process holding it.
    pub fn inode(&self) -> u64 {
        self.inode
    }

    /// The exporter's name (`udmabuf`, `system`, a driver's), from `/proc/self/fdinfo`.
    pub fn exporter(&self) -> Option<String> {
        self.fdinfo("exp_name")
    }

    /// The name set on it ([`DmaBuf::set_name`]), if any.
    pub fn name(&self) -> Option<String> {
        self.fdinfo("name").filter(|name| !name.is_empty())
    }

    fn fdinfo(&self, key: &str) -> Option<String> {
        let text = fs::read_to_string(format!("/proc/self/fdinfo/{}", self.fd.as_raw_fd())).ok()?;
        text.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_owned())
        })
    }

    /// Names the dma-buf (what `/proc/<pid>/fdinfo` and the kernel's debugfs show), at most
    /// 31 bytes; a longer name is cut at a character boundary.
    ///
    /// # Errors
    /// [`Error::Name`] for a name with a NUL, or when the kernel refuses (`EBUSY` once an
    /// importer attached, on kernels before 6.7).
    pub fn set_name(&self, name: &str) -> Result<(), Error> {
        let mut end = name.len().min(DMA_BUF_NAME_LEN - 1);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let name = std::ffi::CString::new(&name[..end]).map_err(|_| Error::Name {
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: the kernel copies at most DMA_BUF_NAME_LEN bytes of the NUL-terminated string,
        // which outlives the call.
        unsafe { raw::dma_buf_set_name(self.fd.as_raw_fd(), name.as_ptr()) }
            .map(drop)
            .map_err(|e| Error::Name { source: e.into() })
    }

    /// Brackets CPU access to a [`DmaBuf::cpu_view`]: `start` before the CPU touches the
    /// bytes, then `start == false` after (`DMA_BUF_IOCTL_SYNC`), so caches are kept coherent
    /// with the devices that share the buffer.
    ///
    /// # Errors
    /// [`Error::Sync`] when the exporter refuses.
    pub fn sync(&self, access: CpuAccess, start: bool) -> Result<(), Error> {
        let when = if start {
            DMA_BUF_SYNC_START
        } else {
            DMA_BUF_SYNC_END
        };
        let sync = dma_buf_sync {
            flags: access.flags() | when,
        };
        // SAFETY: the kernel reads one complete `dma_buf_sync`.
        unsafe { raw::dma_buf_sync(self.fd.as_raw_fd(), &sync) }
            .map(drop)
            .map_err(|e| Error::Sync { source: e.into() })
    }

    /// Maps all of it for the CPU, as a region of base pages (shared: the exporter's bytes).
    /// Bracket accesses with [`DmaBuf::sync`].
    ///
    /// # Errors
    /// [`Error::View`] when the exporter refuses the mapping (some exporters have no CPU
    /// mapping at all); [`Error::Stat`] when out of descriptors.
    pub fn cpu_view(&self) -> Result<Region, Error> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|source| Error::Stat { source })?;
        Region::of_exported_file(fd, self.len).map_err(|source| Error::View { source })
    }

    /// The fences of the work other drivers have queued on this buffer, as a `sync_file`
    /// [`Fence`] that signals once they are done (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`, Linux 6.0):
    /// for `access` [`CpuAccess::Read`], the writers'; otherwise every access's. An exporter that
    /// tracks no work gives a fence that is already signalled.
    ///
    /// # Errors
    /// [`Error::Fence`] when the kernel refuses (`ENOTTY` before Linux 6.0).
    pub fn fence(&self, access: CpuAccess) -> Result<Fence, Error> {
        let mut arg = dma_buf_export_sync_file {
            flags: u32::try_from(access.flags()).unwrap_or(0),
            fd: -1,
        };
        // SAFETY: the kernel reads and writes one complete `dma_buf_export_sync_file`.
        unsafe { raw::dma_buf_export_sync_file(self.fd.as_raw_fd(), &mut arg) }
            .map_err(|e| Error::Fence { source: e.into() })?;
        if arg.fd < 0 {
            return Err(Error::Fence {
                source: io::Error::from_raw_os_error(libc::EBADF),
            });
        }
        // SAFETY: the kernel just installed this descriptor for the caller, who now owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(arg.fd) };
        Ok(Fence::from_fd(fd))
    }
}

impl AsFd for DmaBuf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What went wrong in this module. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The fd is not a dma-buf.
    #[error(
        "the file is not a dma-buf (its filesystem's magic is {magic:#x}, a dma-buf's is \
         0x444d4142): pass a descriptor an exporter gave (udmabuf, /dev/dma_heap/*, V4L2 \
         VIDIOC_EXPBUF, DRM PRIME, userdma's export)"
    )]
    NotDmaBuf {
        /// `f_type` of the file's filesystem.
        magic: i64,
    },

    /// `fstat`, `fstatfs`, `lseek` or `dup` on the fd failed.
    #[error("cannot examine the dma-buf descriptor")]
    Stat {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `/dev/udmabuf` cannot be opened.
    #[error(
        "cannot open /dev/udmabuf ({source}): exporting needs a kernel with CONFIG_UDMABUF \
         (Linux 4.20; Debian 13's kernel has it built in) and read-write access to the node"
    )]
    NoUdmabuf {
        /// The kernel's answer.
        source: io::Error,
    },

    /// The memory to export is not in a memfd.
    #[error(
        "only memory in a memfd can be exported (udmabuf takes memfd ranges); this region is \
         {what}: build it with memory::Backing::Memfd (Runtime::pool and map_memory do)"
    )]
    NotMemfd {
        /// What backs the region instead.
        what: &'static str,
    },

    /// A range that is empty, not page-aligned or outside the region.
    #[error(
        "cannot export {len:#x} bytes at offset {offset:#x} of a {region_len:#x}-byte region: \
         a range must be nonzero, inside the region, and start and end on a {page:#x}-byte \
         page (for pool buffers: buffers of a page or more from a pool without colouring)"
    )]
    Range {
        /// Start of the range in the region.
        offset: usize,
        /// Its length.
        len: usize,
        /// The region's length.
        region_len: usize,
        /// The page size the range must align to.
        page: usize,
    },

    /// More ranges than one export takes, or none.
    #[error("an export takes 1 to {max} ranges, not {count}")]
    RangeCount {
        /// How many were given.
        count: usize,
        /// The most one export takes.
        max: usize,
    },

    /// Memory in huge pages, for importers that may map it into the kernel.
    #[error(
        "refusing to export {backing} for importers that map the buffer into the kernel (V4L2 \
         capture, anything that vmaps it) on Linux {kernel}: before Linux 6.17 udmabuf's kernel \
         mapping of a huge page ignores the offset in it, so such an importer reads and writes \
         the wrong bytes, outside the buffer too; export base-page memory (PageSize::Base, \
         with shmem transparent hugepages off), or pass Importers::DmaOnly when every importer \
         only DMAs through the buffer's scatter list"
    )]
    HugePages {
        /// What the memory is in.
        backing: &'static str,
        /// The running kernel's release.
        kernel: String,
    },

    /// `UDMABUF_CREATE` or `UDMABUF_CREATE_LIST` failed.
    #[error(
        "udmabuf refused to export {len:#x} bytes ({source}): it needs page-aligned ranges of \
         a memfd sealed against shrinking and not against writing, and limits one buffer to its \
         size_limit_mb parameter (64 MiB by default; /sys/module/udmabuf/parameters)"
    )]
    Create {
        /// Total bytes asked for.
        len: usize,
        /// The kernel's answer.
        source: io::Error,
    },

    /// `DMA_BUF_SET_NAME` failed.
    #[error("cannot name the dma-buf")]
    Name {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `DMA_BUF_IOCTL_SYNC` failed.
    #[error("the exporter refused a CPU access bracket (DMA_BUF_IOCTL_SYNC)")]
    Sync {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE` failed.
    #[error("cannot export the dma-buf's fences as a sync_file (Linux 6.0 has the ioctl)")]
    Fence {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },

    /// The dma-buf cannot be mapped for the CPU.
    #[error("cannot map the dma-buf for the CPU")]
    View {
        /// The mapping's failure.
        #[source]
        source: memory::Error,
    },

    /// The dma-buf cannot be put in this DMA space.
    #[error(
        "cannot import a {len:#x}-byte dma-buf from {exporter} into this {space} space: {why}"
    )]
    NotImportable {
        /// The space.
        space: dma::Kind,
        /// The exporter's name.
        exporter: String,
        /// Its size.
        len: usize,
        /// Why, and what would work.
        why: &'static str,
        /// The refusal of the way tried, if one was.
        #[source]
        source: Option<Box<dma::Error>>,
    },

    /// Mapping the memory behind a userdma export failed.
    #[error(transparent)]
    Dma(Box<dma::Error>),
}

impl From<dma::Error> for Error {
    fn from(source: dma::Error) -> Error {
        Error::Dma(Box::new(source))
    }
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive: a new variant must
    /// say its code here.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::NotDmaBuf { .. }
            | Error::NotMemfd { .. }
            | Error::Range { .. }
            | Error::RangeCount { .. } => Code::InvalidArgument,
            Error::NoUdmabuf { .. } | Error::NotImportable { .. } => Code::Unsupported,
            Error::HugePages { .. } => Code::Refused,
            Error::Stat { .. }
            | Error::Create { .. }
            | Error::Name { .. }
            | Error::Sync { .. }
            | Error::Fence { .. } => Code::System,
            Error::View { source } => source.code(),
            Error::Dma(source) => source.code(),
        }
    }
}

/// The running kernel's release (`uname -r`), `unknown` if it cannot be read.
fn kernel_release() -> String {
    nix::sys::utsname::uname()
        .ok()
        .and_then(|name| name.release().to_str().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `(major, minor)` of a release string like `6.12.118+deb13-amd64`.
fn major_minor(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(all(test, not(loom)))]
mod tests;
