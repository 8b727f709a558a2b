//! [`File`]: a file opened for staging, with O_DIRECT where its file system supports it and the
//! alignment direct I/O needs there, or buffered (and the reason).

use std::fmt;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{shim, Error};

/// Whether to use direct I/O (O_DIRECT: the storage device DMAs into the buffer, no page cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direct {
    /// Buffered I/O through the page cache (one kernel copy, none in user space).
    Off,
    /// Direct I/O where the file system supports it and its alignment is known, else buffered.
    #[default]
    Prefer,
    /// Direct I/O or an error ([`Error::DirectUnsupported`]).
    Require,
}

/// Which path a file's requests take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// O_DIRECT.
    Direct,
    /// Through the page cache.
    Buffered,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Direct => "direct",
            Mode::Buffered => "buffered",
        })
    }
}

/// What a direct-I/O request must be aligned to (both 1 for buffered I/O).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Alignment {
    /// Of the buffer's address.
    pub memory: u32,
    /// Of the file offset and the length.
    pub offset: u32,
}

impl Alignment {
    /// No constraint.
    pub const NONE: Alignment = Alignment {
        memory: 1,
        offset: 1,
    };

    /// The first of (file offset, length, buffer address) that is not aligned, as
    /// `(what, value, alignment)`.
    pub fn check(&self, offset: u64, len: usize, addr: usize) -> Option<(&'static str, u64, u32)> {
        let off = u64::from(self.offset.max(1));
        let mem = self.memory.max(1) as usize;
        if offset % off != 0 {
            Some(("file offset", offset, self.offset))
        } else if len as u64 % off != 0 {
            Some(("length", len as u64, self.offset))
        } else if addr % mem != 0 {
            Some(("buffer address", addr as u64, self.memory))
        } else {
            None
        }
    }
}

#[derive(Debug)]
struct Inner {
    file: std::fs::File,
    path: PathBuf,
    mode: Mode,
    align: Alignment,
    fallback: Option<&'static str>,
    writable: bool,
    /// A regular file (short reads are resumed); else a pipe, FIFO or device, where a short
    /// read is simply what was there.
    regular: bool,
}

/// A file opened for a [`Stager`](super::Stager). Cloning shares the open file (a stager keeps
/// a clone for each request in flight, so the descriptor stays valid until its completion).
#[derive(Debug, Clone)]
pub struct File {
    inner: Arc<Inner>,
}

impl File {
    /// Opens `path` read-only.
    ///
    /// # Errors
    /// [`Error::Open`] / [`Error::Stat`], and [`Error::DirectUnsupported`] with
    /// [`Direct::Require`] where direct I/O is not available.
    pub fn open(path: impl AsRef<Path>, direct: Direct) -> Result<File, Error> {
        File::open_with(path.as_ref(), direct, false)
    }

    /// Creates (or truncates) `path` for reading and writing.
    ///
    /// # Errors
    /// As [`File::open`].
    pub fn create(path: impl AsRef<Path>, direct: Direct) -> Result<File, Error> {
        File::open_with(path.as_ref(), direct, true)
    }

    /// A connected stream — a TCP or Unix stream socket, a pipe — for
    /// [`Stager::recv`](super::Stager::recv) (and writes): buffered, readable and writable,
    /// named `name` in errors. Give it a blocking descriptor (io_uring waits for data itself;
    /// on an `O_NONBLOCK` one a receive with nothing to read fails with `EAGAIN`).
    pub fn from_stream(fd: impl Into<OwnedFd>, name: impl Into<PathBuf>) -> File {
        let file = std::fs::File::from(fd.into());
        File::wrap(
            file,
            &name.into(),
            Mode::Buffered,
            Alignment::NONE,
            None,
            true,
        )
    }

    fn open_with(path: &Path, direct: Direct, write: bool) -> Result<File, Error> {
        let open = |flags: i32| {
            let mut options = OpenOptions::new();
            options.read(true).custom_flags(flags);
            if write {
                options.write(true).create(true).truncate(true);
            }
            options.open(path).map_err(|source| Error::Open {
                path: path.to_owned(),
                source,
            })
        };
        let buffered = |fallback: Option<&'static str>| -> Result<File, Error> {
            if direct == Direct::Require {
                return Err(Error::DirectUnsupported {
                    path: path.to_owned(),
                    reason: fallback.unwrap_or("not asked for"),
                });
            }
            Ok(File::wrap(
                open(0)?,
                path,
                Mode::Buffered,
                Alignment::NONE,
                fallback,
                write,
            ))
        };
        if direct == Direct::Off {
            return buffered(None);
        }
        let file = match open(libc::O_DIRECT) {
            Ok(file) => file,
            Err(Error::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                return buffered(Some("the file system refuses O_DIRECT"));
            }
            Err(e) => return Err(e),
        };
        let stat = shim::statx(file.as_fd()).map_err(|source| Error::Stat {
            path: path.to_owned(),
            source,
        })?;
        let align = match stat.dio {
            Some((memory, offset)) if memory != 0 && offset != 0 => Alignment { memory, offset },
            Some(_) => return buffered(Some("statx reports no direct I/O for this file")),
            None => {
                // A block device node: the device's own logical block size, not that of the
                // file system holding the node (for kernels that report no STATX_DIOALIGN).
                match shim::logical_block_size(stat.block.unwrap_or(stat.dev)) {
                    Some(size) => Alignment {
                        memory: size,
                        offset: size,
                    },
                    None => return buffered(Some(
                        "the file system reports no direct-I/O alignment and has no block device \
                         (tmpfs, network or fuse)",
                    )),
                }
            }
        };
        Ok(File::wrap(file, path, Mode::Direct, align, None, write))
    }

    fn wrap(
        file: std::fs::File,
        path: &Path,
        mode: Mode,
        align: Alignment,
        fallback: Option<&'static str>,
        writable: bool,
    ) -> File {
        let regular = file.metadata().is_ok_and(|m| m.file_type().is_file());
        File {
            inner: Arc::new(Inner {
                regular,
                file,
                path: path.to_owned(),
                mode,
                align,
                fallback,
                writable,
            }),
        }
    }

    /// The path the requests take.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// Why direct I/O was asked for but is not used (`None`: it is, or was not asked for).
    pub fn fallback(&self) -> Option<&'static str> {
        self.inner.fallback
    }

    /// What requests must be aligned to ([`Alignment::NONE`] when buffered).
    pub fn alignment(&self) -> Alignment {
        self.inner.align
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether it was opened for writing.
    pub fn is_writable(&self) -> bool {
        self.inner.writable
    }

    /// The file's current size in bytes.
    ///
    /// # Errors
    /// [`Error::Stat`].
    pub fn size(&self) -> Result<u64, Error> {
        shim::statx(self.inner.file.as_fd())
            .map(|stat| stat.size)
            .map_err(|source| Error::Stat {
                path: self.inner.path.clone(),
                source,
            })
    }

    /// The standard file (for `set_len`, `sync_all`, plain reads).
    pub fn std(&self) -> &std::fs::File {
        &self.inner.file
    }

    /// Whether it is a regular file (a short read of anything else is not resumed).
    pub fn is_regular(&self) -> bool {
        self.inner.regular
    }

    pub(super) fn raw_fd(&self) -> RawFd {
        self.inner.file.as_raw_fd()
    }

    /// Refuses a misaligned direct request.
    pub(super) fn check(&self, offset: u64, len: usize, addr: usize) -> Result<(), Error> {
        match self.inner.align.check(offset, len, addr) {
            None => Ok(()),
            Some((what, value, align)) => Err(Error::Misaligned {
                path: self.inner.path.clone(),
                what,
                value,
                align,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_names_the_first_misaligned_value() {
        let a = Alignment {
            memory: 512,
            offset: 4096,
        };
        assert_eq!(a.check(8192, 4096, 1024), None);
        assert_eq!(a.check(100, 4096, 1024), Some(("file offset", 100, 4096)));
        assert_eq!(a.check(0, 10, 1024), Some(("length", 10, 4096)));
        assert_eq!(a.check(0, 4096, 256), Some(("buffer address", 256, 512)));
        assert_eq!(Alignment::NONE.check(3, 5, 7), None);
        let zero = Alignment {
            memory: 0,
            offset: 0,
        };
        assert_eq!(
            zero.check(3, 5, 7),
            None,
            "zero is treated as no constraint"
        );
    }
}
