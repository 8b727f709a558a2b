//! vivid capturing into dma-bufs of the system dma-heap (`/dev/dma_heap/system`, built into
//! Debian 13's kernel) through [`crate::v4l2::Capture`]: four heap dma-bufs, each filled with a
//! canary through the library's CPU view of it, are given to vivid's capture node
//! (`/dev/video0`, loaded by `init` in the iommufd boot with the vmalloc allocator) as
//! `V4L2_MEMORY_DMABUF` buffers; after 8 frames (the first 4 requeued, the last 4 kept) each
//! kept buffer's first `sizeimage` bytes must no longer be all canary, and the bytes after
//! them must be. Before that, a capture given an fd that is no dma-buf must fail at its
//! `VIDIOC_QBUF` and leave the driver holding none of the dma-bufs (their file counts in
//! `/proc/self/fdinfo` are back where they were), and so must the capture that works.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::Path;
use std::time::Duration;

use userdma::dma::Slice;
use userdma::dmabuf::{CpuAccess, DmaBuf};
use userdma::memory::Region;

use super::dmabuf::heap_buffer;
use super::{cause, CANARY};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::v4l2::{Capture, V4L2_BUF_FLAG_ERROR};

/// vivid's capture node (`n_devs=1 node_types=0x1`: the only one).
const NODE: &str = "/dev/video0";
const WIDTH: u32 = 640;
const HEIGHT: u32 = 360;
const FPS: u32 = 30;
/// Buffers given to the driver.
const BUFFERS: usize = 4;
/// Frames captured: the first `FRAMES - BUFFERS` are requeued, the last `BUFFERS` kept.
const FRAMES: usize = 8;
/// How long one frame may take to arrive (30 frames a second asked; software emulation).
const FRAME_TIMEOUT: Duration = Duration::from_secs(5);
const PAGE: usize = 4096;

/// A dma-buf from the system dma-heap, and the CPU's view of it.
struct HeapBuffer {
    buf: DmaBuf,
    view: Region,
}

impl HeapBuffer {
    /// `len` bytes (a multiple of the page size) from the system heap, mapped.
    fn allocate(len: usize) -> Result<HeapBuffer, Failure> {
        let buf = heap_buffer(len)?;
        ensure!(
            buf.len() == len,
            "a heap dma-buf of {len} bytes asked for has {}",
            buf.len()
        );
        let view = buf
            .cpu_view()
            .map_err(|e| cause("map a heap dma-buf for the CPU", &e))?;
        Ok(HeapBuffer { buf, view })
    }

    /// The mapping. The driver writes it behind the program's back: only volatile accesses.
    fn slice(&self) -> Slice<'_> {
        Slice::from_region(&self.view)
    }

    /// `DMA_BUF_IOCTL_SYNC`: a CPU access of `access` starts (`start`) or ends.
    fn sync(&self, access: CpuAccess, start: bool) -> Result<(), Failure> {
        self.buf
            .sync(access, start)
            .map_err(|e| cause("DMA_BUF_IOCTL_SYNC", &e))
    }
}

/// Heap dma-bufs filled with a canary → vivid's frames (V4L2 DMABUF) → the frames are there.
pub(crate) fn heap_capture(_env: &Env) -> Result<(), Failure> {
    // Any descriptor that is not a dma-buf, for the failing capture below.
    let not_dmabuf = std::fs::File::open("/dev/null").context(|| "open /dev/null".to_owned())?;

    let mut capture = Capture::open(Path::new(NODE), WIDTH, HEIGHT, FPS)
        .map_err(|why| Failure::Check(format!("vivid: {why}")))?;
    let size_image = capture.size_image() as usize;
    println!(
        "INFO dmabuf-heap-capture: {NODE} is {} (driver {}, {}): {WIDTH}x{HEIGHT} YUYV, bytesperline {}, sizeimage {size_image}, {}/{} s a frame",
        capture.card(),
        capture.driver(),
        capture.bus_info(),
        capture.bytes_per_line(),
        capture.time_per_frame().0,
        capture.time_per_frame().1,
    );
    ensure!(
        capture.bytes_per_line() >= WIDTH * 2 && size_image >= (WIDTH * 2 * HEIGHT) as usize,
        "bytesperline {} and sizeimage {size_image} are too small for {WIDTH}x{HEIGHT} YUYV",
        capture.bytes_per_line()
    );

    let len = size_image.div_ceil(PAGE) * PAGE;
    let buffers = (0..BUFFERS)
        .map(|_| HeapBuffer::allocate(len))
        .collect::<Result<Vec<_>, _>>()?;
    for buffer in &buffers {
        buffer.sync(CpuAccess::Write, true)?;
        buffer.slice().fill(CANARY);
        buffer.sync(CpuAccess::Write, false)?;
    }

    let bufs: Vec<(BorrowedFd<'_>, u32)> =
        buffers.iter().map(|b| (b.buf.fd(), len as u32)).collect();
    let refs_before = bufs
        .iter()
        .map(|&(fd, _)| dmabuf_refs(fd))
        .collect::<Result<Vec<_>, _>>()?;
    // That the count counts references: each dma-buf has its fd, its view's fd and the view's
    // mapping.
    ensure!(
        refs_before.iter().all(|&n| n == 3),
        "the dma-bufs' file counts are {refs_before:?}, want 3 each (the fd, the view's fd and its mapping)"
    );

    // A failed capture first: buffer 1 is /dev/null, no dma-buf, so its VIDIOC_QBUF fails
    // after buffer 0's succeeded. The capture must say so, and stop and free the buffers: the
    // driver then holds no reference to buffer 0's dma-buf.
    let mut wrong = bufs.clone();
    wrong[1].0 = not_dmabuf.as_fd();
    match capture.capture_into(&wrong, FRAMES, FRAME_TIMEOUT) {
        Ok(frames) => {
            return Err(Failure::Check(format!(
                "vivid: a capture with a buffer that is no dma-buf gave {} frames",
                frames.len()
            )))
        }
        Err(why) => {
            ensure!(
                why.starts_with("VIDIOC_QBUF of buffer 1 "),
                "vivid: a capture with buffer 1 no dma-buf failed with: {why}"
            );
            println!("INFO dmabuf-heap-capture: buffer 1 no dma-buf (as meant): {why}");
        }
    }
    let refs_after_error = bufs
        .iter()
        .map(|&(fd, _)| dmabuf_refs(fd))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        refs_after_error == refs_before,
        "after the failed capture the dma-bufs' file counts are {refs_after_error:?}, before it {refs_before:?}: the driver still holds some"
    );

    let frames = capture
        .capture_into(&bufs, FRAMES, FRAME_TIMEOUT)
        .map_err(|why| Failure::Check(format!("vivid: {why}")))?;

    ensure!(
        frames.len() == FRAMES,
        "{} frames dequeued, want {FRAMES}",
        frames.len()
    );
    for (k, frame) in frames.iter().enumerate() {
        ensure!(
            frame.bytesused as usize == size_image && frame.flags & V4L2_BUF_FLAG_ERROR == 0,
            "frame {k} (buffer {}): bytesused {}, flags {:#x}; want {size_image} and no error flag",
            frame.index,
            frame.bytesused,
            frame.flags
        );
    }
    // Non-decreasing, not increasing: when vivid's thread runs late (software emulation) it
    // may go round its loop again at once and fill the next buffer with the same sequence
    // number (vivid-kthread-cap.c counts frames from the time, rounded).
    ensure!(
        frames.windows(2).all(|w| w[1].sequence >= w[0].sequence),
        "the frames' sequence numbers go back: {:?}",
        frames.iter().map(|f| f.sequence).collect::<Vec<_>>()
    );
    let kept = &frames[FRAMES - BUFFERS..];
    let mut kept_indices: Vec<u32> = kept.iter().map(|f| f.index).collect();
    kept_indices.sort_unstable();
    ensure!(
        kept_indices == (0..BUFFERS as u32).collect::<Vec<_>>(),
        "the last {BUFFERS} frames are in buffers {kept_indices:?}, want each buffer once"
    );

    let mut changed = Vec::new();
    for frame in kept {
        let buffer = &buffers[frame.index as usize];
        let mut bytes = vec![0_u8; len];
        buffer.sync(CpuAccess::Read, true)?;
        let read = buffer.slice().read_into(0, &mut bytes);
        buffer.sync(CpuAccess::Read, false)?;
        read.context(|| format!("read buffer {}", frame.index))?;
        let (image, tail) = bytes.split_at(size_image);
        let n = image.iter().filter(|&&b| b != CANARY).count();
        ensure!(
            n > 0,
            "buffer {} (frame {}) still holds the canary in all {size_image} bytes of the frame",
            frame.index,
            frame.sequence
        );
        let past = tail.iter().filter(|&&b| b != CANARY).count();
        ensure!(
            past == 0,
            "buffer {} (frame {}): {past} of the {} bytes after sizeimage changed",
            frame.index,
            frame.sequence,
            tail.len()
        );
        changed.push(format!(
            "buffer {} frame {}: {n}/{size_image}",
            frame.index, frame.sequence
        ));
    }
    let refs_after = bufs
        .iter()
        .map(|&(fd, _)| dmabuf_refs(fd))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        refs_after == refs_before,
        "after the capture the dma-bufs' file counts are {refs_after:?}, before it {refs_before:?}: the driver still holds some"
    );
    let first = frames[0].timestamp;
    let last = frames[FRAMES - 1].timestamp;
    let fps = if last > first {
        (FRAMES - 1) as f64 / (last - first).as_secs_f64()
    } else {
        0.0
    };
    println!(
        "INFO dmabuf-heap-capture: {FRAMES} frames into {BUFFERS} system-heap dma-bufs of {len} bytes (buffers {:?}, sequences {:?}, flags {:#x}, ms after the first {:?}, {fps:.1} frames/s by their timestamps); bytes no longer the canary: {}; the {} bytes past sizeimage untouched",
        frames.iter().map(|f| f.index).collect::<Vec<_>>(),
        frames.iter().map(|f| f.sequence).collect::<Vec<_>>(),
        frames[0].flags,
        frames
            .iter()
            .map(|f| f.timestamp.saturating_sub(first).as_millis())
            .collect::<Vec<_>>(),
        changed.join(", "),
        len - size_image
    );
    println!(
        "INFO dmabuf-heap-capture: the dma-bufs' file counts (/proc/self/fdinfo) {refs_before:?} before, after the failed capture and after the capture: the driver let go of them each time"
    );
    Ok(())
}

/// The number of references to the dma-buf file `fd` (`count:` of its `/proc/self/fdinfo`,
/// which leaves out the one reading it takes): this process's fd and mapping, and one for each
/// importer that holds it (V4L2 takes one for each queued buffer).
fn dmabuf_refs(fd: BorrowedFd<'_>) -> Result<u64, Failure> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    let text = std::fs::read_to_string(&path).context(|| format!("read {path}"))?;
    text.lines()
        .find_map(|line| line.strip_prefix("count:"))
        .and_then(|count| count.trim().parse().ok())
        .ok_or_else(|| Failure::Check(format!("{path} has no count: line: {text:?}")))
}
