//! edu through `vfio-pci`: BAR0 from the device fd, DMA through a type1 container
//! (`dma::Type1`), the IOMMU refusing what is not mapped, and no-IOMMU mode (`dma::Physical`).

use std::os::fd::AsFd;

use userdma::dma::{IovaRange, Physical, Space, Type1};
use userdma::memory::PageSize;
use userdma::pci::Driver;
use userdma::pool::{Config, Pool};

use super::{
    check_canary, compare, group_number, pattern, region, round_trip, Buffer, CANARY, GUARD,
    TRANSFER,
};
use crate::edu::{self, Direction};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::vfio::{self, Model};

const HUGE: usize = 2 << 20;
const HALF: usize = HUGE / 2;
/// The pool's region: four 2 MiB chunks, enough for a slab of each of two small classes (a
/// class keeps whole chunks for its slabs) and a whole-chunk buffer.
const POOL_LEN: usize = 4 * HUGE;

fn model(env: &Env) -> Model {
    if env.boot.has_iommu() {
        Model::Type1v2
    } else {
        Model::NoIommu
    }
}

/// BAR0 mapped from the VFIO device fd answers as edu's registers do.
pub(crate) fn bar0(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let number = group_number(env, env.edu)?;
    let (_container, attached) = vfio::open(env.edu, number, model(env))?;
    let edu = vfio::map_edu(attached.device.as_fd())?;
    let id = edu.check_registers()?;
    println!("INFO vfio-bar0: group {number}, ID register {id:#010x}");
    drop(edu);
    drop(attached);
    bound.release()
}

/// DMA through a type1 container: hugepage and base-page regions mapped with `dma::Type1` at
/// IOVAs under edu's 28-bit mask; edu copies RAM -> device -> RAM by IOVA; unmapping reports
/// success and leaves nothing mapped.
pub(crate) fn type1_dma(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let number = group_number(env, env.edu)?;
    let (container, attached) = vfio::open(env.edu, number, Model::Type1v2)?;
    let space = Type1::new(container, edu::DMA_MASK_BITS)
        .context(|| "make a type1 DMA space of the container".to_owned())?;
    let ranges = space.usable_ranges();
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    ensure!(
        !ranges.is_empty() && ranges.iter().all(|r| r.last < limit),
        "usable IOVA ranges {ranges:?} should be non-empty and under the 28-bit mask"
    );
    let device = vfio::map_edu(attached.device.as_fd())?;
    vfio::enable_bus_master(attached.device.as_fd())?;

    let huge = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "map a 2 MiB hugepage region".to_owned())?;
    let range = huge
        .iova_range()
        .ok_or_else(|| Failure::Check("a type1 mapping should be one IOVA range".to_owned()))?;
    ensure!(
        range.start % (HUGE as u64) == 0 && range.last < limit,
        "hugepage mapping at IOVA {range}: want 2 MiB aligned and under the mask"
    );
    // Within one mapping: its first half to its second half, then odd offsets up to its end.
    round_trip(
        &device,
        &Buffer::at(&huge, 0, TRANSFER)?,
        &Buffer::at(&huge, HALF, TRANSFER + GUARD)?,
        1,
    )?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0x3001, TRANSFER)?,
        &Buffer::at(&huge, HUGE - TRANSFER - GUARD, TRANSFER + GUARD)?,
        2,
    )?;

    // Across two mappings: base pages (the IOMMU maps 4 KiB pages too) to the hugepage region.
    let small = space
        .map(region(64 << 10, PageSize::Base)?)
        .context(|| "map a 64 KiB base-page region".to_owned())?;
    let small_range = small.iova_range().ok_or_else(|| {
        Failure::Check("a type1 mapping of base pages should be one IOVA range".to_owned())
    })?;
    ensure!(
        !overlaps(&small_range, &range) && small_range.last < limit,
        "second mapping at {small_range} overlaps the first at {range} or passes the mask"
    );
    round_trip(
        &device,
        &Buffer::at(&small, 0x1000, TRANSFER)?,
        &Buffer::at(&huge, 0x8000, TRANSFER + GUARD)?,
        3,
    )?;
    round_trip(
        &device,
        &Buffer::at(&huge, 0x10000, TRANSFER)?,
        &Buffer::at(&small, 0x2000, TRANSFER + GUARD)?,
        4,
    )?;

    let stats = space.stats();
    ensure!(
        stats.maps == 2 && stats.live_bytes == (HUGE + (64 << 10)) as u64,
        "after two maps the space reports {stats:?}"
    );
    small.unmap().context(|| format!("unmap {small_range}"))?;
    huge.unmap().context(|| format!("unmap {range}"))?;
    let stats = space.stats();
    ensure!(
        stats.unmaps == 2 && stats.unmap_errors == 0 && stats.live_bytes == 0,
        "after unmapping both the space reports {stats:?}"
    );
    println!("INFO vfio-type1-dma: mappings at {range} and {small_range}; usable {ranges:?}");
    drop(device);
    drop(space);
    drop(attached);
    bound.release()
}

/// Buffers from a `pool::Pool` over a type1 mapping: small-class, mid-class and large (buddy)
/// buffers carry IOVAs edu can use; dropping the pool unmaps its region.
pub(crate) fn type1_pool_dma(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let number = group_number(env, env.edu)?;
    let (container, attached) = vfio::open(env.edu, number, Model::Type1v2)?;
    let space = Type1::new(container, edu::DMA_MASK_BITS)
        .context(|| "make a type1 DMA space of the container".to_owned())?;
    let device = vfio::map_edu(attached.device.as_fd())?;
    vfio::enable_bus_master(attached.device.as_fd())?;
    let mapping = space
        .map(region(POOL_LEN, PageSize::Huge2M)?)
        .context(|| format!("map a {POOL_LEN:#x}-byte hugepage region"))?;
    let pool = Pool::new(mapping, Config::default())
        .context(|| format!("make a pool over the {POOL_LEN:#x}-byte mapping"))?;
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let small = pool
        .alloc(TRANSFER)
        .context(|| format!("allocate {TRANSFER} bytes"))?;
    let mid = pool
        .alloc(64 << 10)
        .context(|| "allocate 64 KiB".to_owned())?;
    let large = pool
        .alloc(HUGE)
        .context(|| "allocate 2 MiB (a whole chunk)".to_owned())?;
    let mut seen: Vec<IovaRange> = Vec::new();
    for (name, buffer) in [("small", &small), ("64 KiB", &mid), ("2 MiB", &large)] {
        let len = buffer.capacity() as u64;
        let range = IovaRange::from_len(buffer.iova(), len).ok_or_else(|| {
            Failure::Check(format!(
                "{name} buffer: IOVA {:#x} + {len:#x} wraps",
                buffer.iova()
            ))
        })?;
        ensure!(
            range.last < limit && buffer.contiguous_len() >= buffer.len(),
            "{name} buffer at IOVA {range}: past the mask or not contiguous"
        );
        ensure!(
            seen.iter().all(|other| !overlaps(other, &range)),
            "{name} buffer at IOVA {range} overlaps another buffer"
        );
        seen.push(range);
    }
    ensure!(
        mid.len() >= TRANSFER + GUARD && large.len() >= TRANSFER + GUARD,
        "buffers shorter than asked"
    );
    round_trip(
        &device,
        &Buffer::in_pool(&small, 0, TRANSFER)?,
        &Buffer::in_pool(&mid, 0, TRANSFER + GUARD)?,
        31,
    )?;
    round_trip(
        &device,
        &Buffer::in_pool(&mid, 0x8000, TRANSFER)?,
        &Buffer::in_pool(&large, HUGE - TRANSFER - GUARD, TRANSFER + GUARD)?,
        32,
    )?;
    let seen: Vec<String> = seen.iter().map(ToString::to_string).collect();
    println!(
        "INFO vfio-type1-pool-dma: buffers at IOVAs {}",
        seen.join(", ")
    );
    drop(small);
    drop(mid);
    drop(large);
    drop(pool);
    let stats = space.stats();
    ensure!(
        stats.maps == 1 && stats.unmaps == 1 && stats.unmap_errors == 0 && stats.live_bytes == 0,
        "dropping the pool should unmap its region: the space reports {stats:?}"
    );
    drop(device);
    drop(space);
    drop(attached);
    bound.release()
}

fn overlaps(a: &IovaRange, b: &IovaRange) -> bool {
    a.start <= b.last && b.start <= a.last
}

/// The IOMMU refuses a transfer to an IOVA that is not mapped: edu is told to write its buffer
/// to the physical address of a canary hugepage that is not mapped in the container (the place
/// the bytes would land without translation), and no byte of the canary changes; a read from
/// there does not fetch the canary. The device still works afterwards.
pub(crate) fn isolation(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let number = group_number(env, env.edu)?;
    let (container, attached) = vfio::open(env.edu, number, Model::Type1v2)?;
    let space = Type1::new(container, edu::DMA_MASK_BITS)
        .context(|| "make a type1 DMA space of the container".to_owned())?;
    let device = vfio::map_edu(attached.device.as_fd())?;
    vfio::enable_bus_master(attached.device.as_fd())?;

    let mapped = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "map a 2 MiB hugepage region".to_owned())?;
    let range = mapped
        .iova_range()
        .ok_or_else(|| Failure::Check("a type1 mapping should be one IOVA range".to_owned()))?;
    let canary = region(HUGE, PageSize::Huge2M)?;
    let canary_view = userdma::dma::Slice::from_region(&canary);
    canary_view.fill(CANARY);
    let phys = canary
        .physical_pages()
        .context(|| "read the canary's physical address".to_owned())?;
    let canary_phys = phys
        .addr_of(0)
        .ok_or_else(|| Failure::Check("the canary region has no physical page".to_owned()))?;
    // The canary's physical address, unless the container happens to map that IOVA: then the
    // first 2 MiB past the mapping (unmapped too, but no longer the canary's address).
    let limit = 1_u64 << edu::DMA_MASK_BITS;
    let fits = |iova: u64| {
        IovaRange::from_len(iova, HUGE as u64)
            .is_some_and(|r| r.last < limit && !overlaps(&r, &range))
    };
    let (target, at_canary) = if fits(canary_phys) {
        (canary_phys, true)
    } else {
        let next = range.last.saturating_add(1);
        ensure!(
            fits(next),
            "no unmapped 2 MiB under the mask next to the mapping {range} (canary at {canary_phys:#x})"
        );
        (next, false)
    };

    // Load a pattern into the device from mapped memory, then aim it at the unmapped IOVA.
    let data = pattern(7, TRANSFER);
    let src = Buffer::at(&mapped, 0, TRANSFER)?;
    src.host
        .write_from(0, &data)
        .context(|| "fill the source buffer".to_owned())?;
    let dst = Buffer::at(&mapped, HALF, HALF)?;
    dst.host.fill(CANARY);
    device.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    device.dma(Direction::FromDevice, target, TRANSFER)?;
    check_canary(&canary_view, "the unmapped canary hugepage")?;
    check_canary(&dst.host, "the mapped region's second half")?;

    // The device had the data and can still reach mapped memory.
    device.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    let mut back = vec![0_u8; TRANSFER];
    dst.host
        .read_into(0, &mut back)
        .context(|| "read the destination buffer".to_owned())?;
    compare(&data, &back).map_err(|why| {
        Failure::Check(format!(
            "after the refused write, device -> mapped IOVA {:#x}: {why}",
            dst.addr
        ))
    })?;

    // A read from the unmapped IOVA must not fetch the canary's bytes.
    if at_canary {
        device.dma(Direction::ToDevice, target, TRANSFER)?;
        let probe = Buffer::at(&mapped, HALF + 0x10000, TRANSFER)?;
        probe.host.fill(0);
        device.dma(Direction::FromDevice, probe.addr, TRANSFER)?;
        let mut fetched = vec![0_u8; TRANSFER];
        probe
            .host
            .read_into(0, &mut fetched)
            .context(|| "read what the device fetched".to_owned())?;
        ensure!(
            fetched.iter().any(|&b| b != CANARY),
            "a DMA read from unmapped IOVA {target:#x} fetched the canary at that physical address"
        );
    }
    println!(
        "INFO vfio-isolation: write to unmapped IOVA {target:#x} ({}) refused, canary intact; mapping at {range}",
        if at_canary {
            "the canary's physical address"
        } else {
            "next to the mapping"
        }
    );
    drop(mapped);
    drop(device);
    drop(space);
    drop(attached);
    bound.release()
}

/// No-IOMMU VFIO: the device fd works as with an IOMMU, and DMA uses the physical addresses
/// `dma::Physical` reads from pagemap.
pub(crate) fn noiommu_dma(env: &Env) -> Result<(), Failure> {
    let bound = env.bind(env.edu, Driver::VfioPci)?;
    let number = group_number(env, env.edu)?;
    let (container, attached) = vfio::open(env.edu, number, Model::NoIommu)?;
    let device = vfio::map_edu(attached.device.as_fd())?;
    vfio::enable_bus_master(attached.device.as_fd())?;
    let space =
        Physical::new(edu::DMA_MASK_BITS).context(|| "make a physical DMA space".to_owned())?;
    let mapped = space
        .map(region(HUGE, PageSize::Huge2M)?)
        .context(|| "look up the physical address of a hugepage region".to_owned())?;
    let range = mapped
        .iova_range()
        .ok_or_else(|| Failure::Check("a hugepage should be physically contiguous".to_owned()))?;
    round_trip(
        &device,
        &Buffer::at(&mapped, 0, TRANSFER)?,
        &Buffer::at(&mapped, HALF, TRANSFER + GUARD)?,
        5,
    )?;
    println!("INFO vfio-noiommu-dma: hugepage at physical {range}");
    drop(mapped);
    drop(device);
    drop(attached);
    drop(container);
    bound.release()
}
