//! What the IOMMU does with edu's DMA: the iommufd path against the type1 one, a fault in the
//! middle of a stream of good transfers (refused, reported in the kernel log, and harmless to
//! the transfers after it), a device-read-only mapping edu reads and may not write, and every
//! mapping kept under edu's 28-bit DMA mask.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::vfio::Mode;
use userdma::device::Device;
use userdma::dma::{self, IovaRange, Mapping, Slice};
use userdma::memory::PageSize;
use userdma::pci::faults::{Access, IommuFault, KernelLog};
use userdma::pool::{Config, OwnedBuffer};
use userdma::ring;

use super::vfio::{open, options, runtime};
use super::{cause, check_canary, pattern, region, round_trip, Buffer, CANARY, GUARD, TRANSFER};
use crate::edu::{self, Direction};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

const HUGE: usize = 2 << 20;
/// The pool's region: 2 MiB chunks enough for a slab of each size class the cases use (a class
/// keeps whole chunks for its slabs) and a whole-chunk buffer.
const POOL_LEN: usize = 6 * HUGE;
/// Round trips in the fault stream after the bad transfers (and at least as many before).
const AFTER: u32 = 4;
/// How long the stream runs before its first bad transfer: longer than the window of the Intel
/// driver's rate limit on fault messages (`dmar_fault`: ten messages in five seconds, for all
/// units together, and each fault takes three), so that the faults of an earlier case cannot
/// have used it up and this case's own are printed.
const QUIET: Duration = Duration::from_millis(5500);
/// How long the kernel may take to log a fault.
const FAULT_LOG_TIMEOUT: Duration = Duration::from_secs(5);

/// iommufd against type1 (the iommufd boot): with the default options edu opens through
/// `/dev/iommu` and its device cdev (`/dev/vfio/devices/vfioN`, named in sysfs `vfio-dev/`), in
/// mode `Iommufd` with an iommufd space, and DMA round trips through it work; with
/// `Options::iommufd(false)` the same device opens through its group and a type1 container.
pub(crate) fn iommufd(env: &Env) -> Result<(), Failure> {
    ensure!(
        Path::new("/dev/iommu").exists(),
        "no /dev/iommu: is the iommufd module loaded?"
    );
    let (bound, vfio, device) = open(env, &options(env))?;
    let cdev_dir = env.device_file(env.edu, "vfio-dev");
    let cdev = std::fs::read_dir(&cdev_dir)
        .context(|| format!("list {}", cdev_dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|n| n.starts_with("vfio"))
        .ok_or_else(|| Failure::Check(format!("no vfioN in {}", cdev_dir.display())))?;
    let node = Path::new("/dev/vfio/devices").join(&cdev);
    ensure!(node.exists(), "no device cdev {}", node.display());
    ensure!(
        vfio.mode() == Mode::Iommufd,
        "with the default options edu opened in mode {:?}, want Iommufd (/dev/iommu and {} exist)",
        vfio.mode(),
        node.display()
    );
    let rt = runtime(&vfio);
    let kind = rt.dma_space().kind();
    ensure!(
        kind == dma::Kind::Iommufd,
        "the iommufd device's space is {kind}"
    );
    let mapping = rt
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages into the IOAS".to_owned())?;
    let range = mapping
        .iova_range()
        .ok_or_else(|| Failure::Check("an IOAS mapping should be one IOVA range".to_owned()))?;
    round_trip(
        &device,
        &Buffer::at(&mapping, 0, TRANSFER)?,
        &Buffer::at(&mapping, HUGE / 2, TRANSFER + GUARD)?,
        61,
    )?;
    drop(mapping);
    drop(device);
    drop(rt);
    drop(vfio);

    let (vfio, device) = open_again(env, &options(env).iommufd(false))?;
    ensure!(
        vfio.mode() == Mode::Type1,
        "with Options::iommufd(false) edu opened in mode {:?}, want Type1",
        vfio.mode()
    );
    let group = vfio.group();
    let rt = runtime(&vfio);
    let kind = rt.dma_space().kind();
    ensure!(kind == dma::Kind::Type1, "the group's space is {kind}");
    let mapping = rt
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages into the type1 container".to_owned())?;
    round_trip(
        &device,
        &Buffer::at(&mapping, 0, TRANSFER)?,
        &Buffer::at(&mapping, HUGE / 2, TRANSFER + GUARD)?,
        62,
    )?;
    println!(
        "INFO vfio-iommufd: default options: iommufd through {} (mapping at {range}); iommufd(false): type1, group {group:?}",
        node.display()
    );
    drop(mapping);
    drop(device);
    drop(rt);
    drop(vfio);
    bound.release()
}

/// Waits for the kernel to log a DMA fault of `kind` by edu at `target` (the page the fault
/// names), and returns it.
fn expect_fault(
    log: &mut KernelLog,
    env: &Env,
    target: u64,
    kind: Access,
) -> Result<IommuFault, Failure> {
    let (found, others) = log
        .wait_for(FAULT_LOG_TIMEOUT, |f| {
            f.bdf == env.edu && f.addr & !0xfff == target && f.kind == kind
        })
        .map_err(|e| cause("read the kernel log", &e))?;
    found.ok_or_else(|| {
        Failure::Check(format!(
            "no {kind:?} fault for {} at {target:#x} in the kernel log within {FAULT_LOG_TIMEOUT:?}; other faults: {others:?}",
            env.edu
        ))
    })
}

/// edu, still bound by an earlier `open`, opened again with `options`.
fn open_again(
    env: &Env,
    options: &userdma::device::vfio::Options,
) -> Result<(Arc<userdma::device::Vfio>, edu::Edu), Failure> {
    let vfio = userdma::device::Vfio::open_with(env.edu, options)
        .context(|| format!("open {} through VFIO again", env.edu))?;
    let bar = vfio.bar(0).context(|| "BAR0 of edu".to_owned())?;
    Ok((Arc::new(vfio), edu::Edu::new(bar)?))
}

/// An IOMMU fault in the middle of a stream: edu makes round trips through pool buffers (for
/// [`QUIET`], at least [`AFTER`] of them), and then it is told to write to an IOVA nothing is mapped at (the physical address
/// of a canary hugepage, where the bytes would land untranslated), and after one more round
/// trip to read from there. The canary does not change, nor does a pool buffer no transfer
/// uses; what the refused read left in the device is not the canary; the kernel logs a DMA
/// fault naming edu at that address for each access, write and read; and the round trips after
/// each ([`AFTER`] after the read) check byte for byte.
pub(crate) fn fault_stream(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let runtime = runtime(&vfio);
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    let mapped = pool
        .mapping()
        .iova_range()
        .ok_or_else(|| Failure::Check("the pool's mapping should be one IOVA range".to_owned()))?;
    let alloc = |len: usize| {
        pool.alloc_owned(len)
            .context(|| format!("allocate {len} bytes from the pool"))
    };
    let srcs = [alloc(TRANSFER)?, alloc(TRANSFER)?];
    let dsts = [alloc(TRANSFER + GUARD)?, alloc(TRANSFER + GUARD)?];
    let bystander = alloc(64 << 10)?;
    bystander.slice().fill(CANARY);

    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let unmapped = |iova: u64| {
        IovaRange::from_len(iova, HUGE as u64)
            .is_some_and(|r| r.last < limit && (r.last < mapped.start || r.start > mapped.last))
    };
    // The canary: a hugepage whose physical address no IOVA of edu's space maps (the kernel
    // may hand out a page whose physical address is one the pool's IOVAs cover: then another
    // is taken, the earlier ones kept so it differs).
    let mut tried = Vec::new();
    let (canary, canary_phys) = loop {
        let candidate = region(HUGE, PageSize::Huge2M)?;
        let phys = candidate
            .physical_pages()
            .context(|| "read the canary's physical address".to_owned())?
            .addr_of(0)
            .ok_or_else(|| Failure::Check("the canary region has no physical page".to_owned()))?;
        if unmapped(phys) {
            break (candidate, phys);
        }
        tried.push((candidate, phys));
        ensure!(
            tried.len() < 4,
            "no hugepage of 4 has a physical address outside edu's space ({mapped}) and under its mask: {:x?}",
            tried.iter().map(|(_, p)| *p).collect::<Vec<_>>()
        );
    };
    drop(tried);
    let canary_view = Slice::from_region(&canary);
    canary_view.fill(CANARY);
    let target = canary_phys;

    let mut log = KernelLog::open().map_err(|e| cause("open the kernel log", &e))?;
    let trip = |i: u32| -> Result<(), Failure> {
        let k = usize::try_from(i % 2).unwrap_or(0);
        round_trip(
            &device,
            &Buffer::in_pool(srcs[k].as_buffer(), 0, TRANSFER)?,
            &Buffer::in_pool(dsts[k].as_buffer(), 0, TRANSFER + GUARD)?,
            700 + i,
        )
        .map_err(|f| f.during(|| format!("round trip {i}")))
    };
    let start = Instant::now();
    let mut i = 0;
    while i < AFTER || start.elapsed() < QUIET {
        trip(i)?;
        i += 1;
    }
    let before = i;

    // The bad write: the device's buffer holds a fresh pattern, sent to the unmapped IOVA.
    let mut reported = Vec::new();
    let src = Buffer::in_pool(srcs[0].as_buffer(), 0, TRANSFER)?;
    src.host
        .write_from(0, &pattern(790, TRANSFER))
        .context(|| "fill the source buffer".to_owned())?;
    device.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, target, TRANSFER)?;
    check_canary(
        &canary_view,
        "the unmapped canary hugepage after the refused write",
    )?;
    // The report comes before the next fault: QEMU's IOMMU drops a device's fault while the
    // record of its last one is still pending (it collapses them, as VT-d recommends).
    reported.push(expect_fault(&mut log, env, target, Access::Write)?);
    trip(before)?;
    // The bad read: from the unmapped IOVA into the device's buffer, then out to a good buffer.
    device.dma(Direction::ToDevice, target, TRANSFER)?;
    let dst = Buffer::in_pool(dsts[0].as_buffer(), 0, TRANSFER + GUARD)?;
    dst.host.fill(0);
    device.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    let mut fetched = vec![0_u8; TRANSFER];
    dst.host
        .read_into(0, &mut fetched)
        .context(|| "read what the refused read left in the device".to_owned())?;
    ensure!(
        fetched.iter().any(|&b| b != CANARY),
        "a DMA read from unmapped IOVA {target:#x} fetched the canary at that physical address"
    );
    reported.push(expect_fault(&mut log, env, target, Access::Read)?);

    for i in before + 1..=before + AFTER {
        trip(i)?;
    }
    check_canary(&canary_view, "the unmapped canary hugepage")?;
    check_canary(&bystander.slice(), "a pool buffer no transfer used")?;
    for fault in &reported {
        println!(
            "INFO vfio-fault-stream: the kernel reported {} {:?} at {:#x}: {}",
            fault.bdf, fault.kind, fault.addr, fault.reason
        );
    }
    println!(
        "INFO vfio-fault-stream: {} round trips through pool buffers at {mapped}, a refused write at {target:#x} after {before} of them and a refused read after one more; canary and an unused pool buffer intact",
        before + 1 + AFTER
    );
    drop((srcs, dsts, bystander));
    drop(pool);
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// Every mapping the library makes for edu (opened with a 28-bit DMA mask) lies below 2^28: a
/// hugepage mapping, base pages, the memory of a 1024-entry ring, and a pool's region and its
/// buffers. Mapping one hugepage again and again fills the space under the mask and then fails
/// with `IovaExhausted` naming the mask, never with a mapping above it; after unmapping, a
/// mapping works again.
pub(crate) fn dma_mask(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let runtime = runtime(&vfio);
    let space = Arc::clone(runtime.dma_space());
    let bits = edu::DMA_MASK_BITS;
    ensure!(
        space.dma_mask_bits() == bits,
        "the space has a {}-bit mask, want {bits}",
        space.dma_mask_bits()
    );
    let limit = 1_u64 << bits;
    let under = |what: &str, range: IovaRange| -> Result<(), Failure> {
        ensure!(
            range.last < limit,
            "{what} at IOVA {range} reaches past edu's {bits}-bit mask"
        );
        Ok(())
    };
    let range_of = |what: &str, mapping: &Mapping| -> Result<IovaRange, Failure> {
        let range = mapping
            .iova_range()
            .ok_or_else(|| Failure::Check(format!("{what}: not one IOVA range")))?;
        under(what, range)?;
        Ok(range)
    };
    let ring_bytes = ring::Layout::new::<ring::Command, ring::Status>(1024)
        .map_err(|e| cause("the layout of a 1024-entry ring", &e))?
        .size()
        .next_multiple_of(4096);
    let huge = runtime
        .map_memory(HUGE, PageSize::Huge2M)
        .context(|| "map 2 MiB of hugepages".to_owned())?;
    let base = runtime
        .map_memory(256 << 10, PageSize::Base)
        .context(|| "map 256 KiB of base pages".to_owned())?;
    let ring_memory = runtime
        .map_memory(ring_bytes, PageSize::Base)
        .context(|| format!("map {ring_bytes} bytes for a ring"))?;
    let mut report = Vec::new();
    for (what, mapping) in [
        ("a 2 MiB hugepage mapping", &huge),
        ("a 256 KiB base-page mapping", &base),
        ("a 1024-entry ring's memory", &ring_memory),
    ] {
        report.push(format!("{what} {}", range_of(what, mapping)?));
    }
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    report.push(format!(
        "the pool's region {}",
        range_of("the pool's region", pool.mapping())?
    ));
    let buffers: Vec<OwnedBuffer> = [64, TRANSFER, 64 << 10, HUGE]
        .into_iter()
        .map(|len| {
            pool.alloc_owned(len)
                .context(|| format!("allocate {len} bytes from the pool"))
        })
        .collect::<Result<_, _>>()?;
    for buffer in &buffers {
        let len = buffer.capacity() as u64;
        let range = IovaRange::from_len(buffer.iova().raw(), len).ok_or_else(|| {
            Failure::Check(format!("a pool buffer's IOVA {} wraps", buffer.iova()))
        })?;
        under("a pool buffer", range)?;
    }
    // The device reaches the top of what it was given.
    round_trip(
        &device,
        &Buffer::in_pool(buffers[1].as_buffer(), 0, TRANSFER)?,
        &Buffer::in_pool(
            buffers[3].as_buffer(),
            HUGE - TRANSFER - GUARD,
            TRANSFER + GUARD,
        )?,
        81,
    )?;

    // Fill the space under the mask with one hugepage mapped again and again.
    let page = region(HUGE, PageSize::Huge2M)?;
    let most = usize::try_from(limit / HUGE as u64).unwrap_or(usize::MAX) + 1;
    let mut filled = Vec::new();
    let refusal = loop {
        match space.map(Arc::clone(&page)) {
            Ok(mapping) => {
                range_of("a repeated hugepage mapping", &mapping)?;
                filled.push(mapping);
                ensure!(
                    filled.len() <= most,
                    "{} mappings of 2 MiB fit under a {bits}-bit mask: some must be above it",
                    filled.len()
                );
            }
            Err(err) => break err,
        }
    };
    match &refusal {
        dma::Error::IovaExhausted { mask_bits, .. } if *mask_bits == bits => {}
        other => {
            return Err(Failure::Check(format!(
                "after {} more mappings the space failed with {other:?}; want IovaExhausted under the {bits}-bit mask",
                filled.len()
            )))
        }
    }
    let mapped_bytes = (filled.len() * HUGE) as u64;
    ensure!(
        mapped_bytes <= limit,
        "{mapped_bytes:#x} bytes mapped under a {limit:#x}-byte mask"
    );
    let count = filled.len();
    drop(filled);
    let again = space
        .map(Arc::clone(&page))
        .context(|| "map a hugepage after unmapping the repeated ones".to_owned())?;
    range_of("a mapping after the space was freed", &again)?;
    println!(
        "INFO vfio-dma-mask: {} space, {bits}-bit mask; {}; the pool's buffers under the mask; {count} more 2 MiB mappings filled the space, then: {refusal}",
        space.kind(),
        report.join(", ")
    );
    drop(again);
    drop(buffers);
    drop(pool);
    drop((huge, base, ring_memory));
    drop(device);
    drop(space);
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// A device-read-only mapping (`Space::map_with(.., Access::ReadOnly)`, which type1 and iommufd
/// map without the write flag): edu reads it (its bytes come out of the device intact), and when
/// told to write into it the IOMMU refuses: the kernel logs a write fault naming edu at that
/// IOVA, every byte of the mapping is unchanged, and a round trip through pool buffers after it
/// checks byte for byte.
pub(crate) fn read_only_mapping(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = open(env, &options(env))?;
    let runtime = runtime(&vfio);
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    let alloc = |len: usize| {
        pool.alloc_owned(len)
            .context(|| format!("allocate {len} bytes from the pool"))
    };
    let (src, dst) = (alloc(TRANSFER)?, alloc(TRANSFER + GUARD)?);
    let weights = region(HUGE, PageSize::Huge2M)?;
    Slice::from_region(&weights).fill(CANARY);
    let read_only = runtime
        .dma_space()
        .map_with(Arc::clone(&weights), dma::Access::ReadOnly)
        .map_err(|e| cause("map a hugepage device-read-only", &e))?;
    ensure!(
        read_only.access() == dma::Access::ReadOnly,
        "the mapping says {}, not device-read-only",
        read_only.access()
    );
    let target = read_only
        .iova(0)
        .ok_or_else(|| Failure::Check("the read-only mapping has no IOVA".to_owned()))?
        .raw();

    // The device reads it: its bytes go through edu into a pool buffer unchanged.
    device.dma(Direction::ToDevice, target, TRANSFER)?;
    let out = Buffer::in_pool(dst.as_buffer(), 0, TRANSFER + GUARD)?;
    out.host.fill(0);
    device.dma(Direction::FromDevice, out.addr, TRANSFER)?;
    let mut read = vec![0_u8; TRANSFER];
    out.host
        .read_into(0, &mut read)
        .context(|| "read what edu read from the read-only mapping".to_owned())?;
    ensure!(
        read.iter().all(|&b| b == CANARY),
        "edu read the read-only mapping, but {} of the bytes it brought out are not the mapping's",
        read.iter().filter(|&&b| b != CANARY).count()
    );

    // The write: a fresh pattern into edu's buffer, sent to the read-only IOVA.
    let mut log = KernelLog::open().map_err(|e| cause("open the kernel log", &e))?;
    let from = Buffer::in_pool(src.as_buffer(), 0, TRANSFER)?;
    from.host
        .write_from(0, &pattern(811, TRANSFER))
        .context(|| "fill the source buffer".to_owned())?;
    device.dma(Direction::ToDevice, from.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, target, TRANSFER)?;
    // The write must not have landed. (Whether the refusal is logged is the IOMMU's: QEMU's
    // VT-d drops a write that lacks permission without a fault record, as a not-present page
    // gets one; the log is read and what it holds reported.)
    check_canary(
        &Slice::from_region(&weights),
        "the device-read-only hugepage after edu's refused write",
    )?;
    let logged = log
        .wait_for(Duration::from_secs(1), |f| {
            f.bdf == env.edu && f.addr & !0xfff == target & !0xfff
        })
        .map_err(|e| cause("read the kernel log", &e))?
        .0;
    round_trip(
        &device,
        &Buffer::in_pool(src.as_buffer(), 0, TRANSFER)?,
        &Buffer::in_pool(dst.as_buffer(), 0, TRANSFER + GUARD)?,
        812,
    )
    .map_err(|f| f.during(|| "the round trip after the refused write".to_owned()))?;
    let logged = logged.map_or_else(
        || "no fault record in the kernel log".to_owned(),
        |f| format!("{} {:?} fault: {}", f.bdf, f.kind, f.reason),
    );
    println!(
        "INFO vfio-read-only-mapping: edu read {TRANSFER} bytes of a device-read-only mapping at {target:#x}; its write there was refused ({logged}), the {HUGE}-byte mapping unchanged, the next round trip right"
    );
    drop(read_only);
    drop(pool);
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()
}
