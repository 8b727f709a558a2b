//! Video capture through V4L2 into dma-bufs the caller supplies (`V4L2_MEMORY_DMABUF`), for the
//! cases that use `vivid`, the kernel's V4L2 test driver (the iommufd boot loads it with one
//! single-planar capture node, `/dev/video0`: `tests/guest/init`).
//!
//! [`Capture`] is the safe part: it opens a capture node, sets a YUYV format and a frame rate,
//! and captures a number of frames into the caller's dma-bufs, requeueing them as it goes; it
//! stops streaming and frees the driver's buffers whatever happens. The frames land in the
//! dma-bufs' memory, which the driver writes behind the program's back: read it through volatile
//! accesses (`userdma::dma::Slice`), never through a `&`/`&mut` to the mapping.
//!
//! The kernel ABI below is written from `<linux/videodev2.h>`, only what a single-planar capture
//! needs. Every struct's size, alignment and field offsets, and every ioctl number, are asserted
//! at compile time; the values were checked against videodev2.h on x86_64 by compiling a C
//! program that prints `sizeof`, `_Alignof` and `offsetof` of each (and the `VIDIOC_*` numbers),
//! once with Linux 6.1's uapi header and once with Debian 13's 6.12 one: both gave the values
//! asserted here.

#![allow(non_camel_case_types)]

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::mem::{align_of, offset_of, size_of};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use userdma::sys::ioctl::{ior, iow, iowr, Ioctl};

// ---- the kernel ABI (<linux/videodev2.h>) ----

/// `v4l2_fourcc(a, b, c, d)`: a pixel format code.
pub(crate) const fn fourcc(code: &[u8; 4]) -> u32 {
    u32::from_le_bytes(*code)
}

/// `V4L2_PIX_FMT_YUYV`: packed YUV 4:2:2, two bytes a pixel (Y0 U Y1 V).
pub(crate) const V4L2_PIX_FMT_YUYV: u32 = fourcc(b"YUYV");
/// `V4L2_BUF_TYPE_VIDEO_CAPTURE` (`enum v4l2_buf_type`): single-planar video capture.
pub(crate) const V4L2_BUF_TYPE_VIDEO_CAPTURE: u32 = 1;
/// `V4L2_MEMORY_DMABUF` (`enum v4l2_memory`): buffers are dma-bufs the application passes by fd.
pub(crate) const V4L2_MEMORY_DMABUF: u32 = 4;
/// `V4L2_FIELD_NONE` (`enum v4l2_field`): progressive frames.
pub(crate) const V4L2_FIELD_NONE: u32 = 1;

/// `v4l2_capability` flag: a single-planar video capture device.
pub(crate) const V4L2_CAP_VIDEO_CAPTURE: u32 = 0x0000_0001;
/// `v4l2_capability` flag: a multi-planar video capture device.
pub(crate) const V4L2_CAP_VIDEO_CAPTURE_MPLANE: u32 = 0x0000_1000;
/// `v4l2_capability` flag: the streaming I/O ioctls (REQBUFS, QBUF, DQBUF, ...).
pub(crate) const V4L2_CAP_STREAMING: u32 = 0x0400_0000;
/// `v4l2_capability` flag: `device_caps` is filled in (it describes this node; `capabilities`
/// the whole device).
pub(crate) const V4L2_CAP_DEVICE_CAPS: u32 = 0x8000_0000;
/// `v4l2_captureparm.capability` flag: `timeperframe` can be set.
pub(crate) const V4L2_CAP_TIMEPERFRAME: u32 = 0x1000;

/// `v4l2_buffer.flags`: the driver hit an error filling the buffer; its data may be corrupt.
pub(crate) const V4L2_BUF_FLAG_ERROR: u32 = 0x0000_0040;
/// `v4l2_buffer.flags`: the bits that say which clock the timestamp is on.
pub(crate) const V4L2_BUF_FLAG_TIMESTAMP_MASK: u32 = 0x0000_e000;
/// `v4l2_buffer.flags`: the timestamp is on `CLOCK_MONOTONIC`.
pub(crate) const V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC: u32 = 0x0000_2000;

/// `struct v4l2_capability`: what `VIDIOC_QUERYCAP` answers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct v4l2_capability {
    /// The driver's name (NUL-terminated).
    pub(crate) driver: [u8; 16],
    /// The device's name (NUL-terminated).
    pub(crate) card: [u8; 32],
    /// Where the device is (`platform:vivid-000`; NUL-terminated).
    pub(crate) bus_info: [u8; 32],
    /// `KERNEL_VERSION` of the driver.
    pub(crate) version: u32,
    /// `V4L2_CAP_*` of the whole device.
    pub(crate) capabilities: u32,
    /// `V4L2_CAP_*` of this node (with [`V4L2_CAP_DEVICE_CAPS`] in `capabilities`).
    pub(crate) device_caps: u32,
    /// Zero.
    pub(crate) reserved: [u32; 3],
}

/// `struct v4l2_pix_format`: a single-planar image format.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct v4l2_pix_format {
    /// Pixels a line.
    pub(crate) width: u32,
    /// Lines (of a frame; of a field with interlaced formats).
    pub(crate) height: u32,
    /// `V4L2_PIX_FMT_*` (a [`fourcc`]).
    pub(crate) pixelformat: u32,
    /// `enum v4l2_field`.
    pub(crate) field: u32,
    /// Bytes a line, padding included.
    pub(crate) bytesperline: u32,
    /// Bytes a buffer must have for one image.
    pub(crate) sizeimage: u32,
    /// `enum v4l2_colorspace`.
    pub(crate) colorspace: u32,
    /// Private to the pixel format (`V4L2_PIX_FMT_PRIV_MAGIC` enables `flags`).
    pub(crate) priv_: u32,
    /// `V4L2_PIX_FMT_FLAG_*`.
    pub(crate) flags: u32,
    /// `enum v4l2_ycbcr_encoding` (a union with `hsv_enc` in the header).
    pub(crate) ycbcr_enc: u32,
    /// `enum v4l2_quantization`.
    pub(crate) quantization: u32,
    /// `enum v4l2_xfer_func`.
    pub(crate) xfer_func: u32,
}

/// `v4l2_format.fmt`, a union of 200 bytes in the header (aligned to 8 by the pointers of its
/// `v4l2_window` member), spelled here as the one member this module uses, `pix`, followed by
/// the rest of its bytes: the same layout, and no union to read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct v4l2_format_fmt {
    /// `fmt.pix`: the format of `V4L2_BUF_TYPE_VIDEO_CAPTURE`.
    pub(crate) pix: v4l2_pix_format,
    /// The rest of `fmt.raw_data[200]`.
    pub(crate) rest: [u8; 152],
    /// The union's alignment.
    pub(crate) _align: [u64; 0],
}

/// `struct v4l2_format`: the argument of `VIDIOC_S_FMT` and `VIDIOC_G_FMT`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct v4l2_format {
    /// `enum v4l2_buf_type`: which member of `fmt` counts.
    pub(crate) type_: u32,
    /// The format.
    pub(crate) fmt: v4l2_format_fmt,
}

impl Default for v4l2_format {
    fn default() -> Self {
        v4l2_format {
            type_: 0,
            fmt: v4l2_format_fmt {
                pix: v4l2_pix_format::default(),
                rest: [0; 152],
                _align: [],
            },
        }
    }
}

/// `struct v4l2_fract`: a fraction (a frame interval in seconds).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct v4l2_fract {
    /// Numerator.
    pub(crate) numerator: u32,
    /// Denominator.
    pub(crate) denominator: u32,
}

/// `struct v4l2_captureparm`: the streaming parameters of a capture queue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct v4l2_captureparm {
    /// What can be set ([`V4L2_CAP_TIMEPERFRAME`]).
    pub(crate) capability: u32,
    /// `V4L2_MODE_HIGHQUALITY` or 0.
    pub(crate) capturemode: u32,
    /// Seconds a frame.
    pub(crate) timeperframe: v4l2_fract,
    /// Driver-specific.
    pub(crate) extendedmode: u32,
    /// Buffers of the read() I/O method.
    pub(crate) readbuffers: u32,
    /// Zero.
    pub(crate) reserved: [u32; 4],
}

/// `v4l2_streamparm.parm`, a union of 200 bytes (aligned to 4), spelled as its `capture`
/// member followed by the rest of its bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct v4l2_streamparm_parm {
    /// `parm.capture`: the parameters of a capture queue.
    pub(crate) capture: v4l2_captureparm,
    /// The rest of `parm.raw_data[200]`.
    pub(crate) rest: [u8; 160],
}

/// `struct v4l2_streamparm`: the argument of `VIDIOC_S_PARM` and `VIDIOC_G_PARM`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct v4l2_streamparm {
    /// `enum v4l2_buf_type`.
    pub(crate) type_: u32,
    /// The parameters.
    pub(crate) parm: v4l2_streamparm_parm,
}

impl Default for v4l2_streamparm {
    fn default() -> Self {
        v4l2_streamparm {
            type_: 0,
            parm: v4l2_streamparm_parm {
                capture: v4l2_captureparm::default(),
                rest: [0; 160],
            },
        }
    }
}

/// `struct v4l2_requestbuffers`: the argument of `VIDIOC_REQBUFS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct v4l2_requestbuffers {
    /// Buffers asked for; the driver answers how many it made (0 frees them all).
    pub(crate) count: u32,
    /// `enum v4l2_buf_type`.
    pub(crate) type_: u32,
    /// `enum v4l2_memory`.
    pub(crate) memory: u32,
    /// Out: `V4L2_BUF_CAP_*` of the queue.
    pub(crate) capabilities: u32,
    /// `V4L2_MEMORY_FLAG_*`.
    pub(crate) flags: u8,
    /// Zero.
    pub(crate) reserved: [u8; 3],
}

/// `struct v4l2_timecode`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct v4l2_timecode {
    /// `V4L2_TC_TYPE_*`.
    pub(crate) type_: u32,
    /// `V4L2_TC_FLAG_*`.
    pub(crate) flags: u32,
    /// Frames.
    pub(crate) frames: u8,
    /// Seconds.
    pub(crate) seconds: u8,
    /// Minutes.
    pub(crate) minutes: u8,
    /// Hours.
    pub(crate) hours: u8,
    /// User bits.
    pub(crate) userbits: [u8; 4],
}

/// `struct timeval` as `v4l2_buffer` has it on a 64-bit target: two `long`s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct timeval {
    /// Seconds.
    pub(crate) tv_sec: libc::c_long,
    /// Microseconds.
    pub(crate) tv_usec: libc::c_long,
}

/// `v4l2_buffer.m`: where the buffer's memory is, by `memory` type (the header's `planes`
/// pointer, for multi-planar buffers, is left out: `userptr` has its size).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union v4l2_buffer_m {
    /// `V4L2_MEMORY_MMAP`: the offset to mmap the buffer at.
    pub(crate) offset: u32,
    /// `V4L2_MEMORY_USERPTR`: the buffer's address.
    pub(crate) userptr: libc::c_ulong,
    /// [`V4L2_MEMORY_DMABUF`]: the dma-buf's fd.
    pub(crate) fd: i32,
}

impl Default for v4l2_buffer_m {
    fn default() -> Self {
        // The widest member: every byte zero.
        v4l2_buffer_m { userptr: 0 }
    }
}

impl fmt::Debug for v4l2_buffer_m {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("v4l2_buffer_m { .. }")
    }
}

/// `struct v4l2_buffer`: the argument of `VIDIOC_QBUF`, `VIDIOC_DQBUF` and `VIDIOC_QUERYBUF`
/// (88 bytes on x86_64, with its 16-byte `timeval`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct v4l2_buffer {
    /// The buffer's number in the queue.
    pub(crate) index: u32,
    /// `enum v4l2_buf_type`.
    pub(crate) type_: u32,
    /// Bytes of data in the buffer (set by the driver for capture).
    pub(crate) bytesused: u32,
    /// `V4L2_BUF_FLAG_*`.
    pub(crate) flags: u32,
    /// `enum v4l2_field` of the data.
    pub(crate) field: u32,
    /// When the frame was captured (the clock is in `flags`).
    pub(crate) timestamp: timeval,
    /// Timecode (with `V4L2_BUF_FLAG_TIMECODE`).
    pub(crate) timecode: v4l2_timecode,
    /// The frame's number, counted by the driver from the start of streaming.
    pub(crate) sequence: u32,
    /// `enum v4l2_memory`.
    pub(crate) memory: u32,
    /// Where the memory is.
    pub(crate) m: v4l2_buffer_m,
    /// The buffer's size in bytes (for DMABUF: how much of the dma-buf to use).
    pub(crate) length: u32,
    /// Zero.
    pub(crate) reserved2: u32,
    /// A request fd (with `V4L2_BUF_FLAG_REQUEST_FD`; a union with `reserved` in the header).
    pub(crate) request_fd: i32,
}

/// The V4L2 ioctl type.
const V: u8 = b'V';
/// `VIDIOC_QUERYCAP`: what the device is and can do.
pub(crate) const VIDIOC_QUERYCAP: Ioctl = ior::<v4l2_capability>(V, 0);
/// `VIDIOC_S_FMT`: sets the format; the driver answers with what it chose.
pub(crate) const VIDIOC_S_FMT: Ioctl = iowr::<v4l2_format>(V, 5);
/// `VIDIOC_REQBUFS`: allocates (or with count 0 frees) the queue's buffers.
pub(crate) const VIDIOC_REQBUFS: Ioctl = iowr::<v4l2_requestbuffers>(V, 8);
/// `VIDIOC_QBUF`: gives a buffer to the driver.
pub(crate) const VIDIOC_QBUF: Ioctl = iowr::<v4l2_buffer>(V, 15);
/// `VIDIOC_DQBUF`: takes a filled buffer back (`EAGAIN` on a non-blocking fd when none is).
pub(crate) const VIDIOC_DQBUF: Ioctl = iowr::<v4l2_buffer>(V, 17);
/// `VIDIOC_STREAMON`: starts streaming (the argument: an `int`, the buffer type).
pub(crate) const VIDIOC_STREAMON: Ioctl = iow::<libc::c_int>(V, 18);
/// `VIDIOC_STREAMOFF`: stops streaming and returns every buffer to the application.
pub(crate) const VIDIOC_STREAMOFF: Ioctl = iow::<libc::c_int>(V, 19);
/// `VIDIOC_S_PARM`: sets streaming parameters (the frame interval).
pub(crate) const VIDIOC_S_PARM: Ioctl = iowr::<v4l2_streamparm>(V, 22);

// ---- layout proof (x86_64), the values of the header (see the top of the file) ----

/// Asserts a struct's size, alignment and the offset of each field, and that the list names
/// every field.
macro_rules! assert_layout {
    ($ty:ident { size: $size:expr, align: $align:expr } fields { $($field:ident : $off:expr),+ $(,)? }) => {
        const _: () = assert!(size_of::<$ty>() == $size, concat!("size of ", stringify!($ty)));
        const _: () = assert!(align_of::<$ty>() == $align, concat!("alignment of ", stringify!($ty)));
        $(const _: () = assert!(
            offset_of!($ty, $field) == $off,
            concat!("offset of ", stringify!($ty), ".", stringify!($field)),
        );)+
        const _: () = {
            // Fails to compile if `$ty` has a field the list does not name.
            fn _every_field_listed(value: &$ty) {
                let $ty { $($field: _),+ } = value;
            }
        };
    };
}

assert_layout! {
    v4l2_capability { size: 104, align: 4 }
    fields { driver: 0, card: 16, bus_info: 48, version: 80, capabilities: 84, device_caps: 88, reserved: 92 }
}
assert_layout! {
    v4l2_pix_format { size: 48, align: 4 }
    fields {
        width: 0, height: 4, pixelformat: 8, field: 12, bytesperline: 16, sizeimage: 20,
        colorspace: 24, priv_: 28, flags: 32, ycbcr_enc: 36, quantization: 40, xfer_func: 44,
    }
}
// The union `fmt`: 200 bytes, aligned to 8, at offset 8; `fmt.pix` at 8.
assert_layout! {
    v4l2_format_fmt { size: 200, align: 8 }
    fields { pix: 0, rest: 48, _align: 200 }
}
assert_layout! {
    v4l2_format { size: 208, align: 8 }
    fields { type_: 0, fmt: 8 }
}
const _: () = assert!(offset_of!(v4l2_format, fmt.pix) == 8);
assert_layout! {
    v4l2_fract { size: 8, align: 4 }
    fields { numerator: 0, denominator: 4 }
}
assert_layout! {
    v4l2_captureparm { size: 40, align: 4 }
    fields { capability: 0, capturemode: 4, timeperframe: 8, extendedmode: 16, readbuffers: 20, reserved: 24 }
}
// The union `parm`: 200 bytes, aligned to 4, at offset 4; `parm.capture` at 4.
assert_layout! {
    v4l2_streamparm_parm { size: 200, align: 4 }
    fields { capture: 0, rest: 40 }
}
assert_layout! {
    v4l2_streamparm { size: 204, align: 4 }
    fields { type_: 0, parm: 4 }
}
const _: () = assert!(offset_of!(v4l2_streamparm, parm.capture) == 4);
assert_layout! {
    v4l2_requestbuffers { size: 20, align: 4 }
    fields { count: 0, type_: 4, memory: 8, capabilities: 12, flags: 16, reserved: 17 }
}
assert_layout! {
    v4l2_timecode { size: 16, align: 4 }
    fields { type_: 0, flags: 4, frames: 8, seconds: 9, minutes: 10, hours: 11, userbits: 12 }
}
assert_layout! {
    timeval { size: 16, align: 8 }
    fields { tv_sec: 0, tv_usec: 8 }
}
// The union `m`: 8 bytes, aligned to 8; every member at its start.
const _: () = assert!(size_of::<v4l2_buffer_m>() == 8);
const _: () = assert!(align_of::<v4l2_buffer_m>() == 8);
const _: () = assert!(offset_of!(v4l2_buffer_m, offset) == 0);
const _: () = assert!(offset_of!(v4l2_buffer_m, userptr) == 0);
const _: () = assert!(offset_of!(v4l2_buffer_m, fd) == 0);
assert_layout! {
    v4l2_buffer { size: 88, align: 8 }
    fields {
        index: 0, type_: 4, bytesused: 8, flags: 12, field: 16, timestamp: 24, timecode: 40,
        sequence: 56, memory: 60, m: 64, length: 72, reserved2: 76, request_fd: 80,
    }
}
const _: () = assert!(offset_of!(v4l2_buffer, m.fd) == 64);

// The ioctl numbers as the header expands them on x86_64.
const _: () = assert!(VIDIOC_QUERYCAP == 0x8068_5600);
const _: () = assert!(VIDIOC_S_FMT == 0xc0d0_5605);
const _: () = assert!(VIDIOC_REQBUFS == 0xc014_5608);
const _: () = assert!(VIDIOC_QBUF == 0xc058_560f);
const _: () = assert!(VIDIOC_DQBUF == 0xc058_5611);
const _: () = assert!(VIDIOC_STREAMON == 0x4004_5612);
const _: () = assert!(VIDIOC_STREAMOFF == 0x4004_5613);
const _: () = assert!(VIDIOC_S_PARM == 0xc0cc_5616);
const _: () = assert!(V4L2_PIX_FMT_YUYV == 0x5659_5559);

/// `ioctl(fd, request, arg)`, again while a signal interrupts it.
///
/// # Safety
///
/// `request` must be an ioctl that takes a pointer to one `T` (its size field is
/// `size_of::<T>()`), reads and writes nothing else through it, and writes only values that
/// are valid for `T` (here: `#[repr(C)]` structs of integers, for which every bit pattern is).
unsafe fn ioctl<T>(fd: BorrowedFd<'_>, request: Ioctl, arg: &mut T) -> io::Result<()> {
    let arg: *mut T = arg;
    loop {
        // SAFETY: `arg` points to a `T` this call borrows exclusively for its whole duration; by
        // the caller's promise the kernel accesses only that `T` and leaves a valid value.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
        if rc >= 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The symbolic name of an errno value the V4L2 calls here can return.
fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ENOTTY => "ENOTTY",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::ENOLINK => "ENOLINK",
        libc::ETIMEDOUT => "ETIMEDOUT",
        _ => "errno",
    }
}

/// `"<op> failed: EINVAL (Invalid argument (os error 22))[: <hint>]"`; the hint is what the
/// error usually means for that call, where that is known.
fn failed(op: &str, err: &io::Error, hint: impl Fn(i32) -> Option<&'static str>) -> String {
    let errno = err.raw_os_error().unwrap_or(0);
    let mut text = format!("{op} failed: {} ({err})", errno_name(errno));
    if let Some(hint) = hint(errno) {
        text.push_str(": ");
        text.push_str(hint);
    }
    text
}

/// A NUL-terminated byte array as text.
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// The four characters of a pixel format code.
fn fourcc_text(code: u32) -> String {
    code.to_le_bytes()
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '?'
            }
        })
        .collect()
}

// ---- the safe API ----

/// An open single-planar V4L2 video capture node, set to a YUYV format and a frame rate.
#[derive(Debug)]
pub(crate) struct Capture {
    fd: OwnedFd,
    /// `VIDIOC_QUERYCAP`'s answer.
    cap: v4l2_capability,
    /// `VIDIOC_S_FMT`'s answer.
    pix: v4l2_pix_format,
    /// `VIDIOC_S_PARM`'s answer.
    time_per_frame: v4l2_fract,
}

/// What one `VIDIOC_DQBUF` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dequeued {
    /// The buffer: an index into the slice given to [`Capture::capture_into`].
    pub(crate) index: u32,
    /// Bytes of the frame in the buffer.
    pub(crate) bytesused: u32,
    /// The frame's number, counted by the driver from the start of streaming.
    pub(crate) sequence: u32,
    /// `V4L2_BUF_FLAG_*` ([`V4L2_BUF_FLAG_ERROR`]: the frame may be corrupt).
    pub(crate) flags: u32,
    /// When the frame was captured, on the clock `flags` names (`CLOCK_MONOTONIC` for vivid).
    pub(crate) timestamp: Duration,
}

impl Capture {
    /// Opens `path` (non-blocking), checks it is a video capture node with streaming I/O, sets
    /// `width`x`height` YUYV with no fields and `1/fps` seconds a frame, and checks the driver
    /// took each as asked.
    pub(crate) fn open(path: &Path, width: u32, height: u32, fps: u32) -> Result<Capture, String> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|err| {
                failed(&format!("open {}", path.display()), &err, |errno| {
                    (errno == libc::ENOENT)
                        .then_some("no such node (is the driver, e.g. vivid, loaded?)")
                })
            })?;
        let fd = OwnedFd::from(file);

        let mut cap = v4l2_capability::default();
        // SAFETY: VIDIOC_QUERYCAP takes a `v4l2_capability` (the number is composed from its
        // size) and fills it with integers and bytes.
        unsafe { ioctl(fd.as_fd(), VIDIOC_QUERYCAP, &mut cap) }.map_err(|err| {
            failed(
                &format!("VIDIOC_QUERYCAP on {}", path.display()),
                &err,
                |errno| (errno == libc::ENOTTY).then_some("not a V4L2 device"),
            )
        })?;
        let caps = if cap.capabilities & V4L2_CAP_DEVICE_CAPS != 0 {
            cap.device_caps
        } else {
            cap.capabilities
        };
        let what = format!(
            "{} ({}, driver {}, {})",
            path.display(),
            c_string(&cap.card),
            c_string(&cap.driver),
            c_string(&cap.bus_info)
        );
        if caps & V4L2_CAP_VIDEO_CAPTURE == 0 {
            let mplane = if caps & V4L2_CAP_VIDEO_CAPTURE_MPLANE != 0 {
                " (it is a multi-planar one: load vivid with multiplanar=1)"
            } else {
                ""
            };
            return Err(format!(
                "{what} is not a single-planar video capture node (capabilities {caps:#010x}){mplane}"
            ));
        }
        if caps & V4L2_CAP_STREAMING == 0 {
            return Err(format!(
                "{what} has no streaming I/O (capabilities {caps:#010x})"
            ));
        }

        let mut format = v4l2_format {
            type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
            ..v4l2_format::default()
        };
        format.fmt.pix = v4l2_pix_format {
            width,
            height,
            pixelformat: V4L2_PIX_FMT_YUYV,
            field: V4L2_FIELD_NONE,
            ..v4l2_pix_format::default()
        };
        // SAFETY: VIDIOC_S_FMT takes a `v4l2_format` (the number is composed from its size)
        // and writes back the format chosen, integers only.
        unsafe { ioctl(fd.as_fd(), VIDIOC_S_FMT, &mut format) }.map_err(|err| {
            failed(
                &format!("VIDIOC_S_FMT {width}x{height} YUYV, field none, on {what}"),
                &err,
                |errno| match errno {
                    libc::EBUSY => {
                        Some("the queue is busy: another open file has buffers or streams")
                    }
                    libc::EINVAL => Some("the driver does not take single-planar capture formats"),
                    _ => None,
                },
            )
        })?;
        let pix = format.fmt.pix;
        if (pix.width, pix.height, pix.pixelformat, pix.field)
            != (width, height, V4L2_PIX_FMT_YUYV, V4L2_FIELD_NONE)
        {
            return Err(format!(
                "VIDIOC_S_FMT on {what}: asked for {width}x{height} YUYV, field {V4L2_FIELD_NONE}; the driver chose {}x{} {}, field {}",
                pix.width,
                pix.height,
                fourcc_text(pix.pixelformat),
                pix.field
            ));
        }
        let min_line = u64::from(width) * 2;
        if u64::from(pix.bytesperline) < min_line
            || u64::from(pix.sizeimage) < u64::from(pix.bytesperline) * u64::from(height)
        {
            return Err(format!(
                "VIDIOC_S_FMT on {what}: {width}x{height} YUYV answered with bytesperline {} and sizeimage {}, too small for the image",
                pix.bytesperline, pix.sizeimage
            ));
        }

        if fps == 0 {
            return Err("a frame rate of 0 frames a second".to_owned());
        }
        let want = v4l2_fract {
            numerator: 1,
            denominator: fps,
        };
        let mut parm = v4l2_streamparm {
            type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
            ..v4l2_streamparm::default()
        };
        parm.parm.capture.timeperframe = want;
        // SAFETY: VIDIOC_S_PARM takes a `v4l2_streamparm` (the number is composed from its
        // size) and writes back the parameters chosen, integers only.
        unsafe { ioctl(fd.as_fd(), VIDIOC_S_PARM, &mut parm) }.map_err(|err| {
            failed(
                &format!("VIDIOC_S_PARM 1/{fps} s a frame on {what}"),
                &err,
                |errno| {
                    (errno == libc::ENOTTY).then_some("the driver has no settable frame interval")
                },
            )
        })?;
        let capture = parm.parm.capture;
        if capture.capability & V4L2_CAP_TIMEPERFRAME == 0 || capture.timeperframe != want {
            return Err(format!(
                "VIDIOC_S_PARM on {what}: asked for 1/{fps} s a frame; the driver answered {}/{} s (capability {:#x}{})",
                capture.timeperframe.numerator,
                capture.timeperframe.denominator,
                capture.capability,
                if capture.capability & V4L2_CAP_TIMEPERFRAME == 0 {
                    ", without V4L2_CAP_TIMEPERFRAME"
                } else {
                    ""
                }
            ));
        }
        Ok(Capture {
            fd,
            cap,
            pix,
            time_per_frame: capture.timeperframe,
        })
    }

    /// Bytes a buffer needs for one frame (`sizeimage` of `VIDIOC_S_FMT`'s answer).
    pub(crate) fn size_image(&self) -> u32 {
        self.pix.sizeimage
    }

    /// Bytes a line, padding included (`bytesperline` of `VIDIOC_S_FMT`'s answer).
    pub(crate) fn bytes_per_line(&self) -> u32 {
        self.pix.bytesperline
    }

    /// Seconds a frame, as `(numerator, denominator)`.
    pub(crate) fn time_per_frame(&self) -> (u32, u32) {
        (
            self.time_per_frame.numerator,
            self.time_per_frame.denominator,
        )
    }

    /// The device's name (`card`).
    pub(crate) fn card(&self) -> String {
        c_string(&self.cap.card)
    }

    /// The driver's name.
    pub(crate) fn driver(&self) -> String {
        c_string(&self.cap.driver)
    }

    /// Where the device is (`bus_info`).
    pub(crate) fn bus_info(&self) -> String {
        c_string(&self.cap.bus_info)
    }

    /// Captures `frames` frames into the dma-bufs `bufs` (each a dma-buf fd and the bytes of it
    /// to use, at least [`Capture::size_image`]): `VIDIOC_REQBUFS` of `bufs.len()` DMABUF
    /// buffers, `VIDIOC_QBUF` of each (buffer `i` is `bufs[i]`), `VIDIOC_STREAMON`, then
    /// `VIDIOC_DQBUF` of `frames` frames, each buffer given back to the driver after it is
    /// dequeued except the last `bufs.len()` dequeued (those keep their frames), then
    /// `VIDIOC_STREAMOFF` and `VIDIOC_REQBUFS` of 0. Each frame is waited for (`poll`) at most
    /// `timeout`. Returns what each `VIDIOC_DQBUF` said, in order.
    ///
    /// On any error streaming is stopped and the buffers freed before it returns; the driver
    /// then holds no reference to any of the dma-bufs.
    pub(crate) fn capture_into(
        &mut self,
        bufs: &[(BorrowedFd<'_>, u32)],
        frames: usize,
        timeout: Duration,
    ) -> Result<Vec<Dequeued>, String> {
        if bufs.is_empty() || frames == 0 {
            return Err(format!(
                "capture_into: {} buffers, {frames} frames: both must be at least 1",
                bufs.len()
            ));
        }
        let count = u32::try_from(bufs.len())
            .map_err(|_| format!("capture_into: {} buffers is too many", bufs.len()))?;
        if let Some((i, (fd, len))) = bufs
            .iter()
            .enumerate()
            .find(|(_, (_, len))| *len < self.pix.sizeimage)
        {
            return Err(format!(
                "capture_into: buffer {i} (dma-buf fd {}) is {len} bytes, less than the {} of a frame (sizeimage)",
                fd.as_raw_fd(),
                self.pix.sizeimage
            ));
        }

        let mut session = Session {
            fd: self.fd.as_fd(),
            allocated: false,
            streaming: false,
        };
        let mut req = v4l2_requestbuffers {
            count,
            type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
            memory: V4L2_MEMORY_DMABUF,
            ..v4l2_requestbuffers::default()
        };
        // The driver may hold buffers (count 0 frees them) even when the call fails.
        session.allocated = true;
        // SAFETY: VIDIOC_REQBUFS takes a `v4l2_requestbuffers` (the number is composed from its
        // size) and writes back the count and capabilities, integers only.
        unsafe { ioctl(session.fd, VIDIOC_REQBUFS, &mut req) }.map_err(|err| {
            failed(
                &format!("VIDIOC_REQBUFS of {count} DMABUF capture buffers"),
                &err,
                |errno| match errno {
                    libc::EINVAL => {
                        Some("the queue takes no DMABUF buffers, or has buffers of another kind")
                    }
                    libc::EBUSY => Some("the queue is busy: buffers are still queued or mapped"),
                    _ => None,
                },
            )
        })?;
        if req.count != count {
            return Err(format!(
                "VIDIOC_REQBUFS of {count} DMABUF capture buffers made {} (capabilities {:#x}): the driver wants another number; give it that many",
                req.count, req.capabilities
            ));
        }

        for (i, &(fd, len)) in bufs.iter().enumerate() {
            // `i < count`, a u32.
            session.queue(i as u32, fd, len)?;
        }
        let mut buf_type: libc::c_int = V4L2_BUF_TYPE_VIDEO_CAPTURE as libc::c_int;
        // SAFETY: VIDIOC_STREAMON takes an `int` (the buffer type), which it only reads.
        unsafe { ioctl(session.fd, VIDIOC_STREAMON, &mut buf_type) }.map_err(|err| {
            failed("VIDIOC_STREAMON", &err, |errno| match errno {
                libc::EINVAL => Some("no buffers allocated, or not a capture queue"),
                libc::ENOLINK => Some("the media pipeline is not set up"),
                libc::EPIPE => Some("the pipeline's formats do not match"),
                _ => None,
            })
        })?;
        session.streaming = true;

        let mut dequeued = Vec::with_capacity(frames);
        let keep_from = frames.saturating_sub(bufs.len());
        for k in 0..frames {
            let buf = session
                .dequeue(timeout)
                .map_err(|why| format!("frame {} of {frames}: {why}", k + 1))?;
            let Some(&(fd, len)) = bufs.get(buf.index as usize) else {
                return Err(format!(
                    "frame {} of {frames}: VIDIOC_DQBUF gave buffer {}, but there are {count}",
                    k + 1,
                    buf.index
                ));
            };
            dequeued.push(Dequeued {
                index: buf.index,
                bytesused: buf.bytesused,
                sequence: buf.sequence,
                flags: buf.flags,
                timestamp: Duration::new(
                    u64::try_from(buf.timestamp.tv_sec).unwrap_or(0),
                    u32::try_from(buf.timestamp.tv_usec).unwrap_or(0) * 1000,
                ),
            });
            if k < keep_from {
                session.queue(buf.index, fd, len).map_err(|why| {
                    format!("requeueing after frame {} of {frames}: {why}", k + 1)
                })?;
            }
        }
        session.stop()?;
        Ok(dequeued)
    }
}

/// A capture under way on a queue: stops streaming and frees the buffers when dropped, so that
/// an error anywhere leaves the driver holding none of the caller's dma-bufs.
struct Session<'a> {
    fd: BorrowedFd<'a>,
    /// Buffers may be allocated (`VIDIOC_REQBUFS` was called with a non-zero count).
    allocated: bool,
    /// `VIDIOC_STREAMON` succeeded.
    streaming: bool,
}

impl Session<'_> {
    /// `VIDIOC_QBUF` of buffer `index` backed by the dma-buf `fd`, `len` bytes of it.
    fn queue(&self, index: u32, fd: BorrowedFd<'_>, len: u32) -> Result<(), String> {
        let mut buf = v4l2_buffer {
            index,
            type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
            memory: V4L2_MEMORY_DMABUF,
            length: len,
            ..v4l2_buffer::default()
        };
        buf.m.fd = fd.as_raw_fd();
        // SAFETY: VIDIOC_QBUF takes a `v4l2_buffer` (the number is composed from its size) and
        // writes back the buffer's state, integers only. It reads the dma-buf fd and takes its
        // own reference to the dma-buf; `fd` stays open for this call.
        unsafe { ioctl(self.fd, VIDIOC_QBUF, &mut buf) }.map_err(|err| {
            failed(
                &format!(
                    "VIDIOC_QBUF of buffer {index} (dma-buf fd {}, length {len})",
                    fd.as_raw_fd()
                ),
                &err,
                |errno| match errno {
                    libc::EINVAL => Some(
                        "the fd is no dma-buf, the dma-buf is smaller than the length, or the length is under sizeimage",
                    ),
                    libc::EFAULT => Some(
                        "the driver's allocator could not use the dma-buf's memory (videobuf2-dma-contig wants it physically contiguous)",
                    ),
                    libc::EBADF => Some("the fd is not open"),
                    _ => None,
                },
            )
        })
    }

    /// `VIDIOC_DQBUF` of the next filled buffer, waiting (`poll`) at most `timeout` for it.
    fn dequeue(&self, timeout: Duration) -> Result<v4l2_buffer, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut buf = v4l2_buffer {
                type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
                memory: V4L2_MEMORY_DMABUF,
                ..v4l2_buffer::default()
            };
            // SAFETY: VIDIOC_DQBUF takes a `v4l2_buffer` (the number is composed from its
            // size) and fills it with the dequeued buffer's state, integers only (for DMABUF
            // it leaves `m.fd` as the application gave it).
            match unsafe { ioctl(self.fd, VIDIOC_DQBUF, &mut buf) } {
                Ok(()) => return Ok(buf),
                Err(err) if err.raw_os_error() == Some(libc::EAGAIN) => {}
                Err(err) => {
                    return Err(failed("VIDIOC_DQBUF", &err, |errno| match errno {
                        libc::EIO => Some("the driver reported an error on the queue"),
                        libc::EPIPE => Some("the driver has stopped: its last buffer was dequeued"),
                        libc::EINVAL => Some("the queue is not streaming"),
                        _ => None,
                    }))
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "no frame within {} ms (VIDIOC_DQBUF: EAGAIN)",
                    timeout.as_millis()
                ));
            }
            let ms = libc::c_int::try_from(left.as_nanos().div_ceil(1_000_000))
                .unwrap_or(libc::c_int::MAX);
            let mut pollfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid `pollfd`, which poll writes `revents` of during the call.
            let rc = unsafe { libc::poll(&mut pollfd, 1, ms) };
            if rc < 0 {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(failed("poll on the capture node", &err, |_| None));
                }
            } else if rc > 0 && pollfd.revents & libc::POLLERR != 0 {
                return Err(
                    "poll on the capture node: POLLERR (the queue is not streaming, has no buffer queued, or reported an error)".to_owned(),
                );
            }
        }
    }

    /// `VIDIOC_STREAMOFF` (when streaming), then `VIDIOC_REQBUFS` of 0 (when buffers may be
    /// allocated); both are tried. The first error, if any.
    fn stop(&mut self) -> Result<(), String> {
        let mut first = None;
        if self.streaming {
            self.streaming = false;
            let mut buf_type: libc::c_int = V4L2_BUF_TYPE_VIDEO_CAPTURE as libc::c_int;
            // SAFETY: VIDIOC_STREAMOFF takes an `int` (the buffer type), which it only reads.
            if let Err(err) = unsafe { ioctl(self.fd, VIDIOC_STREAMOFF, &mut buf_type) } {
                first = Some(failed("VIDIOC_STREAMOFF", &err, |_| None));
            }
        }
        if self.allocated {
            self.allocated = false;
            let mut req = v4l2_requestbuffers {
                count: 0,
                type_: V4L2_BUF_TYPE_VIDEO_CAPTURE,
                memory: V4L2_MEMORY_DMABUF,
                ..v4l2_requestbuffers::default()
            };
            // SAFETY: as for VIDIOC_REQBUFS in `capture_into`: a `v4l2_requestbuffers`,
            // integers only.
            if let Err(err) = unsafe { ioctl(self.fd, VIDIOC_REQBUFS, &mut req) } {
                first.get_or_insert_with(|| {
                    failed("VIDIOC_REQBUFS of 0 (freeing the buffers)", &err, |_| None)
                });
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        // Only after an error (a finished capture has stopped already): that error is the one
        // reported.
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fourcc_and_names() {
        assert_eq!(fourcc_text(V4L2_PIX_FMT_YUYV), "YUYV");
        assert_eq!(fourcc_text(0x0001_5559), "YU??");
        assert_eq!(c_string(b"vivid\0\0\0"), "vivid");
        assert_eq!(c_string(b"full"), "full");
        assert_eq!(errno_name(libc::EFAULT), "EFAULT");
    }

    #[test]
    fn errors_name_the_call_the_errno_and_the_meaning() {
        let err = io::Error::from_raw_os_error(libc::EINVAL);
        let text = failed("VIDIOC_QBUF of buffer 2", &err, |errno| {
            (errno == libc::EINVAL).then_some("too small")
        });
        assert!(
            text.starts_with("VIDIOC_QBUF of buffer 2 failed: EINVAL (")
                && text.ends_with("os error 22)): too small"),
            "{text}"
        );
    }

    #[test]
    fn a_node_that_is_not_v4l2_is_refused_with_the_reason() {
        let err = Capture::open(Path::new("/dev/null"), 640, 360, 30).unwrap_err();
        assert!(
            err.starts_with("VIDIOC_QUERYCAP on /dev/null failed: ENOTTY")
                && err.ends_with("not a V4L2 device"),
            "{err}"
        );
        let err = Capture::open(Path::new("/nonexistent/video9"), 640, 360, 30).unwrap_err();
        assert!(err.contains("ENOENT"), "{err}");
    }
}
