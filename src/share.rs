//! Passing memory, dma-bufs and fences to another process over a Unix socket (`SCM_RIGHTS`).
//!
//! One message carries up to [`MAX_ITEMS`] items, each a file descriptor and what the receiver
//! needs to use it: a [`Region`]'s memfd with its length and page size (a pool made with
//! [`Pool::create_shared`](crate::pool::Pool::create_shared) is opened from it on the other
//! side with [`Pool::open_shared`](crate::pool::Pool::open_shared)), a [`DmaBuf`] with its
//! length, a [`Fence`]. The bytes are a fixed header and a fixed record per item, little-endian:
//!
//! ```text
//! header  magic "UDMS" (4) | version 1 (u16) | item count (u16)
//! item    kind (u8: 1 region, 2 dma-buf, 3 fence) | page size log2 (u8) | zero (u16)
//!         | zero (u32) | length (u64)
//! ```
//!
//! The receiver checks everything (magic, version, count against the descriptors that came,
//! kinds, lengths, page sizes, the descriptors' types) and on any error closes every descriptor
//! it received and says what was wrong: a malformed message from another process is an error,
//! never a panic or a leak. Use a `SOCK_SEQPACKET` (or datagram) socket, so that a message
//! arrives whole; on a stream socket a short read is reported as [`Error::Truncated`].

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::dmabuf::{self, DmaBuf};
use crate::fence::Fence;
use crate::memory::{self, PageSize, Region};

/// The most items one message carries.
pub const MAX_ITEMS: usize = 16;
const MAGIC: [u8; 4] = *b"UDMS";
const VERSION: u16 = 1;
const HEADER: usize = 8;
const ITEM: usize = 16;
/// The largest message: the header and [`MAX_ITEMS`] items.
pub const MAX_MESSAGE: usize = HEADER + ITEM * MAX_ITEMS;

/// The most descriptors the kernel passes in one message (`SCM_MAX_FD`).
const SCM_MAX_FD: usize = 253;

/// [`Record::kind`] of a region.
pub const KIND_REGION: u8 = 1;
/// [`Record::kind`] of a dma-buf.
pub const KIND_DMABUF: u8 = 2;
/// [`Record::kind`] of a fence.
pub const KIND_FENCE: u8 = 3;

/// One thing to send.
#[derive(Debug, Clone, Copy)]
pub enum Item<'a> {
    /// A region's memory (its memfd or hugetlbfs file): the receiver maps the same pages.
    Region(&'a Region),
    /// A dma-buf.
    DmaBuf(&'a DmaBuf),
    /// A fence.
    Fence(&'a Fence),
}

/// One thing received, its descriptor owned by the receiver.
#[derive(Debug)]
pub enum Received {
    /// A region's file: map it with [`Received::into_region`] (or `Region::from_fd`).
    Region {
        /// The memfd or hugetlbfs file.
        fd: OwnedFd,
        /// The region's length.
        len: usize,
        /// Its page size.
        page_size: PageSize,
    },
    /// A dma-buf, checked to be one and of the length the sender said.
    DmaBuf(DmaBuf),
    /// A fence.
    Fence(Fence),
}

impl Received {
    /// Maps a received region (the same pages as the sender's).
    ///
    /// # Errors
    /// [`Error::Kind`] for an item that is not a region; the mapping's errors.
    pub fn into_region(self) -> Result<Region, Error> {
        match self {
            Received::Region { fd, len, page_size } => {
                Region::from_fd(fd, len, page_size).map_err(|source| Error::Region { source })
            }
            other => Err(Error::Kind {
                expected: "a region",
                got: other.kind_name(),
            }),
        }
    }

    fn kind_name(&self) -> &'static str {
        match self {
            Received::Region { .. } => "a region",
            Received::DmaBuf(_) => "a dma-buf",
            Received::Fence(_) => "a fence",
        }
    }
}

/// A record as decoded, before its descriptor is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// 1 region, 2 dma-buf, 3 fence.
    pub kind: u8,
    /// The page size (regions; 0 otherwise).
    pub page_size: Option<PageSize>,
    /// The length (regions and dma-bufs; 0 for fences).
    pub len: u64,
}

/// Encodes `items` as a message's bytes and the descriptors to send with them, in order.
///
/// # Errors
/// [`Error::Count`] for none or more than [`MAX_ITEMS`]; [`Error::NoFile`] for a region with no
/// file (anonymous or the caller's memory cannot be shared).
pub fn encode<'a>(items: &[Item<'a>]) -> Result<(Vec<u8>, Vec<BorrowedFd<'a>>), Error> {
    let mut records = Vec::with_capacity(items.len());
    let mut fds = Vec::with_capacity(items.len());
    for item in items {
        let (record, fd) = match *item {
            Item::Region(region) => (
                Record {
                    kind: KIND_REGION,
                    page_size: Some(region.page_size()),
                    len: region.len() as u64,
                },
                region.fd().ok_or(Error::NoFile)?,
            ),
            Item::DmaBuf(buf) => (
                Record {
                    kind: KIND_DMABUF,
                    page_size: None,
                    len: buf.len() as u64,
                },
                buf.fd(),
            ),
            Item::Fence(fence) => (
                Record {
                    kind: KIND_FENCE,
                    page_size: None,
                    len: 0,
                },
                fence.fd(),
            ),
        };
        records.push(record);
        fds.push(fd);
    }
    Ok((encode_records(&records)?, fds))
}

/// The message bytes of `records`: the header, then one item each.
///
/// # Errors
/// [`Error::Count`] for none or more than [`MAX_ITEMS`].
fn encode_records(records: &[Record]) -> Result<Vec<u8>, Error> {
    if records.is_empty() || records.len() > MAX_ITEMS {
        return Err(Error::Count {
            count: records.len(),
        });
    }
    let mut bytes = Vec::with_capacity(HEADER + ITEM * records.len());
    bytes.extend_from_slice(&MAGIC);
    bytes.extend_from_slice(&VERSION.to_le_bytes());
    // At most MAX_ITEMS, checked above.
    bytes.extend_from_slice(&(records.len() as u16).to_le_bytes());
    for record in records {
        let page_log2 = record
            .page_size
            .map_or(0, |page| page.bytes().trailing_zeros() as u8);
        bytes.extend_from_slice(&[record.kind, page_log2, 0, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&record.len.to_le_bytes());
    }
    Ok(bytes)
}

/// Decodes a message's bytes into records, checking everything but the descriptors: magic,
/// version, count (against `fds`, the descriptors that came with it), kinds, zero padding,
/// lengths (positive and a multiple of the page size for regions, positive for dma-bufs, 0 for
/// fences) and page sizes.
///
/// # Errors
/// The first thing wrong, as an [`Error`] saying what.
pub fn decode_records(bytes: &[u8], fds: usize) -> Result<Vec<Record>, Error> {
    if bytes.len() < HEADER {
        return Err(Error::Truncated { got: bytes.len() });
    }
    if bytes[..4] != MAGIC {
        return Err(Error::Malformed {
            what: "the magic is not \"UDMS\" (not a userdma message)",
        });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(Error::Version { version });
    }
    let count = usize::from(u16::from_le_bytes([bytes[6], bytes[7]]));
    if count == 0 || count > MAX_ITEMS {
        return Err(Error::Count { count });
    }
    let expected = HEADER + ITEM * count;
    if bytes.len() < expected {
        return Err(Error::Truncated { got: bytes.len() });
    }
    if bytes.len() > expected {
        return Err(Error::Malformed {
            what: "bytes follow the last item",
        });
    }
    if fds != count {
        return Err(Error::Descriptors { items: count, fds });
    }
    let mut records = Vec::with_capacity(count);
    for chunk in bytes[HEADER..].chunks_exact(ITEM) {
        let kind = chunk[0];
        let page_log2 = chunk[1];
        if chunk[2..8].iter().any(|&b| b != 0) {
            return Err(Error::Malformed {
                what: "an item's reserved bytes are not zero",
            });
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&chunk[8..16]);
        let len = u64::from_le_bytes(len);
        let record = match kind {
            KIND_REGION => {
                let page_size = match page_log2 {
                    12 => PageSize::Base,
                    21 => PageSize::Huge2M,
                    30 => PageSize::Huge1G,
                    _ => {
                        return Err(Error::Malformed {
                            what: "a region's page size is not 4 KiB, 2 MiB or 1 GiB",
                        })
                    }
                };
                let page = page_size.bytes() as u64;
                if len == 0 || len % page != 0 || usize::try_from(len).is_err() {
                    return Err(Error::Malformed {
                        what: "a region's length is not a positive multiple of its page size",
                    });
                }
                Record {
                    kind,
                    page_size: Some(page_size),
                    len,
                }
            }
            KIND_DMABUF | KIND_FENCE => {
                if page_log2 != 0 {
                    return Err(Error::Malformed {
                        what: "a dma-buf or fence item has a page size",
                    });
                }
                let bad_len = if kind == KIND_DMABUF {
                    len == 0 || usize::try_from(len).is_err()
                } else {
                    len != 0
                };
                if bad_len {
                    return Err(Error::Malformed {
                        what: "a dma-buf's length is zero or a fence's is not",
                    });
                }
                Record {
                    kind,
                    page_size: None,
                    len,
                }
            }
            _ => {
                return Err(Error::Malformed {
                    what: "an item's kind is not 1 (region), 2 (dma-buf) or 3 (fence)",
                })
            }
        };
        records.push(record);
    }
    Ok(records)
}

/// Decodes a message and takes ownership of its descriptors: each record with its descriptor,
/// dma-bufs checked to be dma-bufs of the length said. On error every descriptor is closed.
///
/// # Errors
/// As [`decode_records`]; [`Error::DmaBuf`] for a dma-buf item whose descriptor is not one, or
/// [`Error::Length`] when its length is not what the message says.
pub fn decode(bytes: &[u8], fds: Vec<OwnedFd>) -> Result<Vec<Received>, Error> {
    let records = decode_records(bytes, fds.len())?;
    let mut received = Vec::with_capacity(records.len());
    for (record, fd) in records.into_iter().zip(fds) {
        received.push(match record.kind {
            KIND_REGION => Received::Region {
                fd,
                // Checked to fit by decode_records.
                len: record.len as usize,
                page_size: record.page_size.unwrap_or(PageSize::Base),
            },
            KIND_DMABUF => {
                let buf = DmaBuf::from_fd(fd).map_err(|source| Error::DmaBuf { source })?;
                if buf.len() as u64 != record.len {
                    return Err(Error::Length {
                        said: record.len,
                        actual: buf.len() as u64,
                    });
                }
                Received::DmaBuf(buf)
            }
            _ => Received::Fence(Fence::from_fd(fd)),
        });
    }
    Ok(received)
}

/// Sends `items` as one message on `socket`.
///
/// # Errors
/// As [`encode`]; [`Error::Send`] when the socket refuses.
pub fn send(socket: BorrowedFd<'_>, items: &[Item<'_>]) -> Result<(), Error> {
    let (bytes, fds) = encode(items)?;
    send_bytes(socket, &bytes, &fds)
}

/// Sends records the caller describes, each with its descriptor: for callers that hold plain
/// descriptors (the C API). The message is checked as a receiver would check it before it is
/// sent.
///
/// # Errors
/// [`Error::Count`], [`Error::Malformed`] for records a receiver would refuse;
/// [`Error::DmaBuf`] for a dma-buf record whose descriptor is not one, [`Error::Length`] for
/// one whose length is not the buffer's (what [`decode`] refuses); [`Error::Send`] when the
/// socket refuses.
pub fn send_records(
    socket: BorrowedFd<'_>,
    items: &[(Record, BorrowedFd<'_>)],
) -> Result<(), Error> {
    let records: Vec<Record> = items.iter().map(|&(record, _)| record).collect();
    let bytes = encode_records(&records)?;
    decode_records(&bytes, items.len())?;
    // The receiver's dma-buf checks, on a duplicate (closed after): a message it would refuse
    // is not sent.
    for (record, fd) in items {
        if record.kind != KIND_DMABUF {
            continue;
        }
        let dup = fd
            .try_clone_to_owned()
            .map_err(|source| Error::Send { source })?;
        let buf = DmaBuf::from_fd(dup).map_err(|source| Error::DmaBuf { source })?;
        if buf.len() as u64 != record.len {
            return Err(Error::Length {
                said: record.len,
                actual: buf.len() as u64,
            });
        }
    }
    let fds: Vec<BorrowedFd<'_>> = items.iter().map(|&(_, fd)| fd).collect();
    send_bytes(socket, &bytes, &fds)
}

fn send_bytes(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(bytes)];
    let sent = sendmsg::<()>(
        socket.as_raw_fd(),
        &iov,
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| Error::Send { source: e.into() })?;
    if sent != bytes.len() {
        return Err(Error::Send {
            source: std::io::Error::from_raw_os_error(libc::EMSGSIZE),
        });
    }
    Ok(())
}

/// Receives one message from `socket` (blocking as the socket does), its descriptors
/// close-on-exec.
///
/// # Errors
/// [`Error::Recv`] when the socket fails; [`Error::Closed`] at end of stream;
/// [`Error::Malformed`] for a message longer than any userdma message; as [`decode`] (more
/// descriptors than items is [`Error::Descriptors`]; all of them are closed).
pub fn recv(socket: BorrowedFd<'_>) -> Result<Vec<Received>, Error> {
    let mut bytes = [0u8; MAX_MESSAGE + 1];
    // Room for the most descriptors one message can carry (the kernel's SCM_MAX_FD), so that
    // the kernel never truncates them: a truncated control message cannot be read back (nix
    // refuses to iterate it), and the descriptors it did install would leak.
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let (got, fds, truncated) = {
        let mut iov = [IoSliceMut::new(&mut bytes)];
        let msg = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| Error::Recv { source: e.into() })?;
        let mut fds = Vec::new();
        let cmsgs = msg.cmsgs().map_err(|e| Error::Recv { source: e.into() })?;
        {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(raw) = cmsg {
                    for fd in raw {
                        // SAFETY: the kernel installed these descriptors for this process just
                        // now; each is owned once, here.
                        fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
        }
        let truncated = msg
            .flags
            .intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC);
        (msg.bytes, fds, truncated)
    };
    if got == 0 && fds.is_empty() {
        return Err(Error::Closed);
    }
    if truncated {
        return Err(Error::Malformed {
            what: "the message or its descriptors were larger than a userdma message may be",
        });
    }
    decode(&bytes[..got], fds)
}

/// What went wrong passing things between processes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No items, or more than one message carries.
    #[error("a message carries 1 to {MAX_ITEMS} items, not {count}")]
    Count {
        /// How many.
        count: usize,
    },
    /// A region with no file behind it.
    #[error("only a region in a memfd or hugetlbfs file can be shared (build it with memory::Backing::Memfd)")]
    NoFile,
    /// Fewer bytes than the header and items.
    #[error("the message is {got} bytes, shorter than its header and items: use a SOCK_SEQPACKET or datagram socket, which keeps messages whole")]
    Truncated {
        /// Bytes received.
        got: usize,
    },
    /// The bytes are not a valid message.
    #[error("malformed message: {what}")]
    Malformed {
        /// What is wrong.
        what: &'static str,
    },
    /// A version this library does not speak.
    #[error("message version {version}: this library speaks version 1 (update the older side)")]
    Version {
        /// The version received.
        version: u16,
    },
    /// The items and the descriptors that came do not match.
    #[error("the message has {items} items but {fds} descriptors came with it")]
    Descriptors {
        /// Items said.
        items: usize,
        /// Descriptors received.
        fds: usize,
    },
    /// A dma-buf item whose descriptor is not a dma-buf.
    #[error("a dma-buf item's descriptor is not a usable dma-buf")]
    DmaBuf {
        /// Why.
        #[source]
        source: dmabuf::Error,
    },
    /// A dma-buf whose length is not what the message says.
    #[error("a dma-buf item says {said} bytes but the dma-buf is {actual}")]
    Length {
        /// The message's length.
        said: u64,
        /// The dma-buf's.
        actual: u64,
    },
    /// A received region could not be mapped.
    #[error("cannot map the received region")]
    Region {
        /// Why.
        #[source]
        source: memory::Error,
    },
    /// An item of another kind than asked for.
    #[error("expected {expected}, got {got}")]
    Kind {
        /// What was asked for.
        expected: &'static str,
        /// What it is.
        got: &'static str,
    },
    /// `sendmsg` failed.
    #[error("cannot send the message")]
    Send {
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// `recvmsg` failed.
    #[error("cannot receive a message")]
    Recv {
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// The peer closed the socket.
    #[error("the peer closed the socket")]
    Closed,
}

impl Error {
    /// The kind of failure, as a stable [`Code`](crate::Code). Exhaustive.
    pub fn code(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::Count { .. }
            | Error::NoFile
            | Error::Kind { .. }
            | Error::Truncated { .. }
            | Error::Malformed { .. }
            | Error::Version { .. }
            | Error::Descriptors { .. }
            | Error::Length { .. } => Code::InvalidArgument,
            Error::DmaBuf { source } => source.code(),
            Error::Region { source } => source.code(),
            Error::Send { .. } | Error::Recv { .. } => Code::System,
            Error::Closed => Code::NotFound,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
