//! dma-bufs with a real kernel (Debian 13's 6.12, the iommufd boot: udmabuf and the system
//! dma-heap built in, vivid loaded by `init`):
//!
//! - `dmabuf-vivid-capture`: pool buffers of edu's runtime exported through udmabuf, V4L2's
//!   vivid capturing frames straight into them, edu reading a captured frame in place (no copy
//!   on the host), the reverse lookup naming each dequeued buffer, nothing written outside the
//!   buffers.
//! - `dmabuf-refusals`: hugetlb memory refused for a vmap-ing importer on this kernel and
//!   exported for DMA-only ones; a system-heap dma-buf refused by iommufd and by VFIO type1
//!   with the kernel feature named; a userdma export imported as its own memory and used by
//!   edu.
//! - `dmabuf-loopback-import`: a system-heap dma-buf imported into the loopback NPU's software
//!   IOMMU, the NPU writing into it, the bytes read back through the dma-buf's own mapping;
//!   its sync_file fence.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use userdma::device::vfio::Mode;
use userdma::dma::{Access, Slice};
use userdma::dmabuf::{self, CpuAccess, DmaBuf, Importers, Via};
use userdma::memory::PageSize;
use userdma::pool::{OwnedBuffer, Pool};
use userdma::Runtime;

use super::vfio::{open, options, runtime};
use super::{cause, pattern, Buffer, CANARY, TRANSFER};
use crate::edu::{Direction, Edu, MAX_TRANSFER};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::v4l2::{
    Capture, V4L2_BUF_FLAG_ERROR, V4L2_BUF_FLAG_TIMESTAMP_MASK, V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC,
};

const VIDEO: &str = "/dev/video0";
const WIDTH: u32 = 640;
const HEIGHT: u32 = 360;
const BUFFERS: usize = 4;
const FRAMES: usize = 8;
const POOL_LEN: usize = 8 << 20;

/// A system-heap dma-buf of `len` bytes.
pub(super) fn heap_buffer(len: usize) -> Result<DmaBuf, Failure> {
    use userdma::sys::dmabuf::{dma_heap_allocation_data, DMA_HEAP_IOCTL_ALLOC};
    let heap = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/dma_heap/system")
        .context(|| "open /dev/dma_heap/system".to_owned())?;
    let mut alloc = dma_heap_allocation_data {
        len: len as u64,
        fd: 0,
        fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
        heap_flags: 0,
    };
    // SAFETY: the kernel reads and writes one complete `dma_heap_allocation_data`.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&heap),
            DMA_HEAP_IOCTL_ALLOC as _,
            &mut alloc,
        )
    };
    if rc < 0 {
        return Err(cause(
            "DMA_HEAP_IOCTL_ALLOC",
            &std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel just installed this descriptor for this process.
    let fd =
        unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(alloc.fd as i32) };
    DmaBuf::from_fd(fd).map_err(|e| cause("take the heap's dma-buf", &e))
}

/// A pool buffer's whole block (its capacity: what its export covers).
fn frame_block<'p>(pool: &'p Pool, buffer: &OwnedBuffer) -> Result<Slice<'p>, Failure> {
    pool.mapping()
        .slice_at(buffer.as_buffer().offset(), buffer.capacity())
        .map_err(|e| cause("the frame buffer's block", &e))
}

/// `len` bytes at `offset` of a dma-buf, read through its own CPU mapping between
/// `DMA_BUF_IOCTL_SYNC` brackets.
fn read_back(buf: &DmaBuf, offset: usize, len: usize) -> Result<Vec<u8>, Failure> {
    let view = buf
        .cpu_view()
        .map_err(|e| cause("map the dma-buf for the CPU", &e))?;
    buf.sync(CpuAccess::Read, true)
        .map_err(|e| cause("sync", &e))?;
    let mut got = vec![0u8; len];
    let read = Slice::from_region(&view).read_into(offset, &mut got);
    buf.sync(CpuAccess::Read, false)
        .map_err(|e| cause("sync", &e))?;
    read.context(|| "read the dma-buf".to_owned())?;
    Ok(got)
}

/// Copies `len` bytes at `from` through edu into `to`, and returns how long edu took.
fn through_edu(edu: &Edu, from: u64, to: u64, len: usize) -> Result<Duration, Failure> {
    let a = edu.dma(Direction::ToDevice, from, len)?;
    let b = edu.dma(Direction::FromDevice, to, len)?;
    Ok(a + b)
}

pub(crate) fn vivid_capture(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, edu) = open(env, &options(env))?;
    let rt = runtime(&vfio);
    let pool = rt
        .pool(POOL_LEN, PageSize::Base)
        .context(|| format!("a {POOL_LEN:#x}-byte pool of base pages"))?;
    let mut capture = Capture::open(Path::new(VIDEO), WIDTH, HEIGHT, 30)
        .map_err(|e| Failure::Check(format!("open {VIDEO}: {e}")))?;
    let size = capture.size_image() as usize;
    ensure!(
        pool.max_len() >= size,
        "the pool's largest buffer is {} bytes, a frame {size}",
        pool.max_len()
    );
    let mut buffers = Vec::new();
    let mut exports = Vec::new();
    for i in 0..BUFFERS {
        let buffer = pool
            .alloc_owned(size)
            .context(|| format!("allocate frame buffer {i} of {size} bytes"))?;
        // The whole block, past the frame too: the slack must stay untouched.
        frame_block(&pool, &buffer)?.fill(CANARY);
        let export = dmabuf::export_range(
            pool.mapping().region(),
            buffer.as_buffer().offset(),
            buffer.capacity(),
            Importers::Any,
        )
        .map_err(|e| cause(&format!("export frame buffer {i}"), &e))?;
        let buf = export.dmabuf();
        ensure!(
            buf.len() == buffer.capacity() && buf.exporter().as_deref() == Some("udmabuf"),
            "export {i}: {} bytes from {:?}, want {} from udmabuf",
            buf.len(),
            buf.exporter(),
            buffer.capacity()
        );
        ensure!(
            buf.name().as_deref() == Some("userdma"),
            "export {i} is named {:?}",
            buf.name()
        );
        buffers.push(buffer);
        exports.push(export);
    }
    // A guard buffer between and after them, canary-filled: vivid must not reach it.
    let guard = pool
        .alloc_owned(1 << 20)
        .context(|| "a guard buffer".to_owned())?;
    guard.as_buffer().slice().fill(CANARY);

    let fds: Vec<_> = exports
        .iter()
        .map(|e| (e.dmabuf().fd(), e.dmabuf().len() as u32))
        .collect();
    let dequeued = capture
        .capture_into(&fds, FRAMES, Duration::from_secs(20))
        .map_err(|e| Failure::Check(format!("capture {FRAMES} frames into the exports: {e}")))?;
    ensure!(
        dequeued.len() == FRAMES,
        "{} frames dequeued, want {FRAMES}",
        dequeued.len()
    );
    for d in &dequeued {
        ensure!(
            d.bytesused as usize == size
                && d.flags & V4L2_BUF_FLAG_ERROR == 0
                && d.flags & V4L2_BUF_FLAG_TIMESTAMP_MASK == V4L2_BUF_FLAG_TIMESTAMP_MONOTONIC,
            "frame {} in buffer {}: {} bytes, flags {:#x}; want {size} bytes, no error, a monotonic timestamp",
            d.sequence,
            d.index,
            d.bytesused,
            d.flags
        );
    }
    // edu moves each captured frame by its pool buffer's IOVA (where vivid wrote it) into an
    // output buffer, before the program touches a byte of the frames: the device gets the
    // camera's bytes with no copy on the CPU. edu's engine takes at most 4095 bytes a
    // transfer and each transfer about 100 ms (a timer in QEMU's model), so it moves two
    // windows of each frame, its first and its last 4095 bytes.
    let windows = [0, size - MAX_TRANSFER];
    let out = pool
        .alloc_owned(BUFFERS * windows.len() * 4096)
        .context(|| "an output buffer".to_owned())?;
    out.as_buffer().slice().fill(0);
    let mut took = Duration::ZERO;
    for (i, frame) in buffers.iter().enumerate() {
        for (w, &at) in windows.iter().enumerate() {
            let to = out.iova().raw() + ((i * windows.len() + w) * 4096) as u64;
            took += through_edu(&edu, frame.iova().raw() + at as u64, to, MAX_TRANSFER)?;
        }
    }
    // Now the CPU looks: each buffer's last frame is in it (the frame's bytes changed, the
    // slack after the frame to the buffer's capacity did not), and edu's output equals it.
    let mut changed = 0usize;
    for (i, buffer) in buffers.iter().enumerate() {
        let mut bytes = vec![0u8; buffer.capacity()];
        frame_block(&pool, buffer)?
            .read_into(0, &mut bytes)
            .context(|| format!("read frame buffer {i}"))?;
        let frame = bytes[..size].iter().filter(|&&b| b != CANARY).count();
        ensure!(
            frame > size / 2,
            "frame buffer {i}: only {frame} of {size} bytes changed: vivid's frame did not land in the pool buffer"
        );
        let slack = bytes[size..].iter().filter(|&&b| b != CANARY).count();
        ensure!(
            slack == 0,
            "frame buffer {i}: {slack} bytes past the frame changed"
        );
        changed += frame;
        for (w, &at) in windows.iter().enumerate() {
            let mut moved = vec![0u8; MAX_TRANSFER];
            out.as_buffer()
                .slice()
                .read_into((i * windows.len() + w) * 4096, &mut moved)
                .context(|| "read edu's output".to_owned())?;
            ensure!(
                moved == bytes[at..at + MAX_TRANSFER],
                "frame buffer {i}: edu's copy of bytes {at}..+{MAX_TRANSFER} differs from the frame"
            );
        }
    }
    super::check_canary(
        &guard.as_buffer().slice(),
        "the guard buffer after the capture",
    )?;

    // The reverse lookup: the dma-buf of each dequeued index is its pool buffer.
    for d in &dequeued {
        let index = d.index as usize;
        ensure!(index < BUFFERS, "DQBUF index {index}");
        let origin = dmabuf::origin(exports[index].dmabuf())
            .ok_or_else(|| Failure::Check(format!("no origin for export {index}")))?;
        ensure!(
            Arc::ptr_eq(&origin.region, pool.mapping().region())
                && origin.region_offset(0) == Some(buffers[index].as_buffer().offset()),
            "export {index} looks up to offset {:?}, its buffer is at {}",
            origin.region_offset(0),
            buffers[index].as_buffer().offset()
        );
    }

    println!(
        "INFO dmabuf-vivid-capture: {FRAMES} frames of {size} bytes ({WIDTH}x{HEIGHT} YUYV, sequences {:?}) captured by vivid into {BUFFERS} pool buffers exported through udmabuf ({} bytes each); {changed} frame bytes written, 0 outside the frames; edu moved {} windows of {MAX_TRANSFER} bytes of the kept frames by their IOVAs before any CPU access ({took:?}), each equal to the frame",
        dequeued.iter().map(|d| d.sequence).collect::<Vec<_>>(),
        buffers[0].capacity(),
        BUFFERS * windows.len()
    );
    drop(capture);
    drop(exports);
    drop(buffers);
    drop((guard, out, pool, edu, rt, vfio));
    bound.release()
}

pub(crate) fn refusals(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, edu) = open(env, &options(env))?;
    ensure!(
        vfio.mode() == Mode::Iommufd,
        "edu opened in {:?}",
        vfio.mode()
    );
    let rt = runtime(&vfio);

    // Huge pages: refused for vmap-ing importers on this kernel, exported for DMA-only ones.
    let huge = rt
        .map_memory(2 << 20, PageSize::Huge2M)
        .context(|| "2 MiB of hugepages".to_owned())?;
    let err = dmabuf::export_range(huge.region(), 4096, 8192, Importers::Any)
        .err()
        .ok_or_else(|| {
            Failure::Check("a hugetlb export for any importer was made on 6.12".into())
        })?;
    ensure!(
        matches!(err, dmabuf::Error::HugePages { .. }) && err.to_string().contains("6.17"),
        "hugetlb export: {err}"
    );
    let dma_only = dmabuf::export_range(huge.region(), 4096, 8192, Importers::DmaOnly)
        .map_err(|e| cause("export hugetlb memory for DMA-only importers", &e))?;
    ensure!(
        dma_only.dmabuf().len() == 8192,
        "{} bytes",
        dma_only.dmabuf().len()
    );

    // Another exporter's dma-buf into iommufd: refused, naming the kernel feature.
    let heap = heap_buffer(64 << 10)?;
    let err = dmabuf::import(rt.dma_space().as_ref(), &heap, Access::ReadWrite)
        .err()
        .ok_or_else(|| {
            Failure::Check("a system-heap dma-buf imported into iommufd on 6.12".into())
        })?;
    ensure!(
        matches!(err, dmabuf::Error::NotImportable { .. }) && err.to_string().contains("6.19"),
        "heap import into iommufd: {err}"
    );
    let iommufd_says = format!("{err}");

    // A userdma export imports as its own memory, and edu uses it.
    let mapping = rt
        .map_memory(64 << 10, PageSize::Base)
        .context(|| "64 KiB of base pages".to_owned())?;
    let export = dmabuf::export_range(mapping.region(), 16 << 10, 16 << 10, Importers::Any)
        .map_err(|e| cause("export 16 KiB", &e))?;
    let imported = dmabuf::import(rt.dma_space().as_ref(), export.dmabuf(), Access::ReadWrite)
        .map_err(|e| cause("import userdma's own export", &e))?;
    ensure!(
        imported.via() == Via::Origin,
        "imported via {:?}",
        imported.via()
    );
    let slice = imported
        .slice()
        .map_err(|e| cause("the import's bytes", &e))?;
    let src = Buffer::at(&mapping, 0, TRANSFER)?;
    src.host
        .write_from(0, &pattern(901, TRANSFER))
        .context(|| "fill the source".to_owned())?;
    slice.fill(0);
    through_edu(&edu, src.addr, imported.iova().raw(), TRANSFER)?;
    let mut got = vec![0u8; TRANSFER];
    slice
        .read_into(0, &mut got)
        .context(|| "read the import".to_owned())?;
    ensure!(
        got == pattern(901, TRANSFER),
        "edu's write into the import differs"
    );
    // The same bytes through the exported region: the import was no copy.
    let mut through_region = vec![0u8; TRANSFER];
    Slice::from_region(mapping.region())
        .read_into(16 << 10, &mut through_region)
        .context(|| "read the region".to_owned())?;
    ensure!(
        through_region == got,
        "the region does not hold what edu wrote into the import"
    );
    drop((imported, export, dma_only, huge, mapping, rt, edu, vfio));
    bound.release()?;

    // VFIO type1 refuses a heap dma-buf's mapping too (ordinary pages behind VM_PFNMAP).
    let (bound, vfio, edu) = open(env, &options(env).iommufd(false))?;
    ensure!(
        vfio.mode() == Mode::Type1,
        "edu opened in {:?}",
        vfio.mode()
    );
    let rt = runtime(&vfio);
    let type1_says = match dmabuf::import(rt.dma_space().as_ref(), &heap, Access::ReadWrite) {
        Err(err) => {
            ensure!(
                matches!(err, dmabuf::Error::NotImportable { .. }),
                "heap import into type1: {err}"
            );
            format!("{err}")
        }
        Ok(imported) => {
            // A kernel whose type1 pins it: then it must work, by the data.
            let src = rt
                .map_memory(64 << 10, PageSize::Base)
                .context(|| "64 KiB".to_owned())?;
            let b = Buffer::at(&src, 0, TRANSFER)?;
            b.host
                .write_from(0, &pattern(902, TRANSFER))
                .context(|| "fill".to_owned())?;
            through_edu(&edu, b.addr, imported.iova().raw(), TRANSFER)?;
            let got = read_back(&heap, 0, TRANSFER)?;
            ensure!(
                got == pattern(902, TRANSFER),
                "edu's write into the heap buffer differs"
            );
            "type1 pinned it and edu wrote it".to_owned()
        }
    };
    drop((rt, edu, vfio));
    bound.release()?;
    println!(
        "INFO dmabuf-refusals: hugetlb export refused for vmap-ing importers, made for DMA-only ones; heap dma-buf into iommufd: {iommufd_says}; into type1: {type1_says}; userdma's own export imported by origin and written by edu"
    );
    Ok(())
}

pub(crate) fn loopback_import(_env: &Env) -> Result<(), Failure> {
    use userdma::ring;
    use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime};

    let rt = Runtime::loopback(loopback::Config::default())
        .map_err(|e| cause("open the loopback NPU", &e))?;
    let heap = heap_buffer(64 << 10)?;
    let imported = dmabuf::import(rt.dma_space().as_ref(), &heap, Access::WriteOnly)
        .map_err(|e| cause("import a heap dma-buf into the software IOMMU", &e))?;
    ensure!(
        imported.via() == Via::Address,
        "imported via {:?}",
        imported.via()
    );
    let pool = rt
        .pool(4 << 20, PageSize::Base)
        .map_err(|e| cause("a pool", &e))?;
    let window = rt
        .device_memory()
        .and_then(|m| Ok(m.alloc(TRANSFER as u64, 256)?))
        .map_err(|e| cause("device memory", &e))?;
    let mut queue = rt
        .queue(ring::Config::new(16))
        .map_err(|e| cause("a queue", &e))?;
    let src = pool.alloc_owned(TRANSFER).map_err(|e| cause("alloc", &e))?;
    src.write(0, &pattern(903, TRANSFER))
        .map_err(|e| cause("write", &e))?;
    let at = window.offset();
    queue
        .push(
            Descriptor::to_device(src.iova(), at, TRANSFER as u64).build(),
            src,
        )
        .map_err(|e| cause("push", &e.error))?;
    let target = imported
        .iova_at(4096)
        .ok_or_else(|| Failure::Check("no IOVA".into()))?;
    queue
        .push(
            Descriptor::to_host(at, target, TRANSFER as u64).build(),
            pool.alloc_owned(1).map_err(|e| cause("alloc", &e))?,
        )
        .map_err(|e| cause("push", &e.error))?;
    queue.flush().map_err(|e| cause("flush", &e))?;
    for _ in 0..2 {
        let done = queue
            .wait(Some(Duration::from_secs(10)))
            .map_err(|e| cause("wait", &e))?;
        ensure!(
            done.entry.is_success(),
            "the NPU's copy failed: {:?}",
            done.entry
        );
    }
    // The NPU's write is in the heap buffer, read through the dma-buf's own mapping.
    let got = read_back(&heap, 4096, TRANSFER)?;
    ensure!(
        got == pattern(903, TRANSFER),
        "the heap buffer does not hold the NPU's write"
    );
    // No other driver has work queued on it: its fence is signalled.
    let fence = heap
        .fence(CpuAccess::Write)
        .map_err(|e| cause("export the heap buffer's fence", &e))?;
    ensure!(
        fence
            .is_signalled()
            .map_err(|e| cause("poll the fence", &e))?,
        "an idle heap buffer's sync_file is not signalled"
    );
    println!(
        "INFO dmabuf-loopback-import: a {}-byte system-heap dma-buf ({:?}) imported into the software IOMMU by address, device-write-only; the NPU wrote {TRANSFER} bytes into it, read back through its mmap; its sync_file fence signalled",
        heap.len(),
        heap.exporter()
    );
    Ok(())
}
