//! What a DMA map and unmap cost on a real kernel: regions mapped into edu's DMA space and
//! unmapped again, many times, timed step by step through the crate's public API
//! (`memory::Region`, `dma::Space::map`, `dma::Mapping::unmap`).
//!
//! Two memory kinds, each [`ROUNDS`] times after [`WARMUP`] rounds that are not timed: 1 MiB of
//! 4 KiB base pages (256 pages, wherever the kernel put them: each physically contiguous run of
//! them is one IOMMU call, so the case prints how many runs there were), and one 2 MiB hugepage
//! (the smallest hugepage region). Each is measured twice:
//!
//! - **mapped again**: one region, built once, mapped and unmapped every round: what the space
//!   charges per map and per unmap;
//! - **per frame**: every round builds the region (mmap, fault in, mlock), maps it, unmaps it and
//!   frees it (munmap): what a path that allocates and maps a buffer for every frame pays.
//!
//! What a map does depends on the boot. With an IOMMU the space is VFIO type1:
//! `VFIO_IOMMU_MAP_DMA` pins the pages (`pin_user_pages`) and writes the IOMMU's page table,
//! and `VFIO_IOMMU_UNMAP_DMA` clears it, flushes the IOTLB and unpins. Without one (no-IOMMU
//! VFIO) the space is physical: a map reads the pages' addresses from `/proc/self/pagemap` and
//! an unmap only counts; nothing is pinned (the region is locked) or programmed.
//!
//! The guests run under QEMU, by default with software emulation (TCG), and QEMU's Intel IOMMU
//! runs in caching mode (the guest flushes the IOTLB on map as well as on unmap, which hardware
//! IOMMUs do not ask for): the figures are this guest's, slower than on hardware, and each line
//! says which accelerator ran it. The case fails if a map or unmap fails, or if the space's counters
//! disagree with the rounds done.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use userdma::device::Device;
use userdma::dma::{self, Space, Stats};
use userdma::memory::{PageSize, Region};

use super::{region, vfio};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// Timed rounds of each measurement.
const ROUNDS: u32 = 200;
/// Rounds before the timed ones (caches, the IOVA allocator, the hugepage pool settle).
const WARMUP: u32 = 20;
/// The base-page region: 1 MiB.
const BASE_LEN: usize = 1 << 20;
/// The hugepage region: one 2 MiB hugepage.
const HUGE_LEN: usize = 2 << 20;
/// The unit the per-page figures are given in, whatever the region's page size.
const PAGE: usize = 4096;
/// The kernel command line parameter `tests/guest/run.sh` names the accelerator with.
const ACCEL_PARAM: &str = "userdma.accel=";
/// The Intel IOMMU's capability register, as the kernel shows it (hex).
const DMAR_CAP: &str = "/sys/class/iommu/dmar0/intel-iommu/cap";
/// Capability register bits: caching mode (CM) and 2 MiB second-level pages (SLLPS bit 0).
const CAP_CM: u64 = 1 << 7;
const CAP_SLLPS_2M: u64 = 1 << 34;

/// Times of one step over the timed rounds, in nanoseconds.
#[derive(Debug)]
struct Samples {
    histogram: Histogram<u64>,
}

impl Samples {
    fn new() -> Samples {
        // 3 significant figures up to a minute: far more than one step takes.
        let histogram = Histogram::new_with_max(60_000_000_000, 3)
            .expect("valid histogram bounds (3 figures, max above 2)");
        Samples { histogram }
    }

    fn record(&mut self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(ns);
    }

    /// `(min, median, p90, max)` in nanoseconds.
    fn quantiles(&self) -> (u64, u64, u64, u64) {
        let h = &self.histogram;
        (
            h.min(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.9),
            h.max(),
        )
    }

    fn median(&self) -> u64 {
        self.histogram.value_at_quantile(0.5)
    }

    /// `median M us (p90 P, min A, max B) = X us a 4 KiB page` for a region of `len` bytes.
    fn summary(&self, len: usize) -> String {
        let (min, median, p90, max) = self.quantiles();
        format!(
            "median {} us (p90 {}, min {}, max {}) = {} us a 4 KiB page",
            us(median),
            us(p90),
            us(min),
            us(max),
            per_page(median, len)
        )
    }
}

/// Nanoseconds as microseconds, one decimal.
fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// `ns` for `len` bytes, per 4 KiB, in microseconds with three decimals.
fn per_page(ns: u64, len: usize) -> String {
    let pages = (len / PAGE).max(1);
    format!("{:.3}", ns as f64 / 1e3 / pages as f64)
}

/// `ns` for `len` bytes, per MiB, in microseconds with one decimal.
fn per_mib(ns: u64, len: usize) -> String {
    format!("{:.1}", ns as f64 / 1e3 * (1 << 20) as f64 / len as f64)
}

/// The memory of one measurement.
#[derive(Debug, Clone, Copy)]
struct Memory {
    page_size: PageSize,
    len: usize,
}

impl Memory {
    const BASE: Memory = Memory {
        page_size: PageSize::Base,
        len: BASE_LEN,
    };
    const HUGE: Memory = Memory {
        page_size: PageSize::Huge2M,
        len: HUGE_LEN,
    };

    /// `1 MiB of 4 KiB pages (256)` or `one 2 MiB hugepage`.
    fn label(self) -> String {
        if self.page_size.is_huge() {
            format!("{} of {} hugepages", mib(self.len), self.page_size)
        } else {
            format!(
                "{} of {} KiB pages ({})",
                mib(self.len),
                self.page_size.bytes() >> 10,
                self.len / self.page_size.bytes()
            )
        }
    }
}

fn mib(len: usize) -> String {
    format!("{} MiB", len >> 20)
}

/// Map and unmap of one region, built once.
#[derive(Debug)]
struct Again {
    map: Samples,
    unmap: Samples,
    /// The region's physically contiguous runs.
    runs: usize,
}

/// Every step of a per-frame buffer: build, map, unmap, free, and all four.
#[derive(Debug)]
struct PerFrame {
    region: Samples,
    map: Samples,
    unmap: Samples,
    free: Samples,
    total: Samples,
    /// Each timed round's physically contiguous runs.
    runs: Vec<usize>,
}

/// How many physically contiguous runs the pages at `addrs` (each `page` bytes, in region
/// order) form: type1 pins and maps each run with one IOMMU call, so a map of base pages costs
/// per run as well as per page.
fn runs(addrs: &[u64], page: u64) -> usize {
    let breaks = addrs
        .windows(2)
        .filter(|pair| pair[0].checked_add(page) != Some(pair[1]))
        .count();
    if addrs.is_empty() {
        0
    } else {
        breaks + 1
    }
}

/// The physically contiguous runs of `region` (read from `/proc/self/pagemap`, untimed).
fn runs_of(region: &Region) -> Result<usize, Failure> {
    let pages = region
        .physical_pages()
        .context(|| "read the region's physical pages".to_owned())?;
    let page = u64::try_from(region.page_size().bytes()).unwrap_or(u64::MAX);
    Ok(runs(pages.as_slice(), page))
}

/// The median of `values` (0 for none).
fn median(values: &mut [usize]) -> usize {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Maps one region of `memory` and unmaps it, [`WARMUP`] + [`ROUNDS`] times.
fn mapped_again(space: &dyn Space, memory: Memory) -> Result<Again, Failure> {
    let Memory { page_size, len } = memory;
    let region = region(len, page_size)?;
    let mut again = Again {
        map: Samples::new(),
        unmap: Samples::new(),
        runs: runs_of(&region)?,
    };
    for round in 0..WARMUP + ROUNDS {
        let start = Instant::now();
        let (mapped, unmapped) = map_and_unmap(space, &region, memory, round)?;
        if round >= WARMUP {
            again.map.record(mapped - start);
            again.unmap.record(unmapped - mapped);
        }
    }
    Ok(again)
}

/// Maps `region` (of `memory`) into `space` and unmaps it again: when each ended.
fn map_and_unmap(
    space: &dyn Space,
    region: &Arc<Region>,
    memory: Memory,
    round: u32,
) -> Result<(Instant, Instant), Failure> {
    let Memory { page_size, len } = memory;
    let mapping = space
        .map(Arc::clone(region))
        .context(|| format!("round {round}: map {len:#x} bytes of {page_size} pages"))?;
    let mapped = Instant::now();
    mapping
        .unmap()
        .context(|| format!("round {round}: unmap {len:#x} bytes of {page_size} pages"))?;
    Ok((mapped, Instant::now()))
}

/// Builds a region of `memory`, maps, unmaps and frees it, [`WARMUP`] + [`ROUNDS`] times.
fn per_frame(space: &dyn Space, memory: Memory) -> Result<PerFrame, Failure> {
    let Memory { page_size, len } = memory;
    let mut frame = PerFrame {
        region: Samples::new(),
        map: Samples::new(),
        unmap: Samples::new(),
        free: Samples::new(),
        total: Samples::new(),
        runs: Vec::with_capacity(usize::try_from(ROUNDS).unwrap_or(0)),
    };
    for round in 0..WARMUP + ROUNDS {
        let start = Instant::now();
        let region = region(len, page_size).map_err(|f| f.during(|| format!("round {round}")))?;
        let built = Instant::now();
        let (mapped, unmapped) = map_and_unmap(space, &region, memory, round)?;
        // Untimed, after the unmap (so that its page-table walk warms nothing the map or the
        // unmap does) and before the free.
        let runs = runs_of(&region).map_err(|f| f.during(|| format!("round {round}")))?;
        let free_start = Instant::now();
        // The mapping held the only other reference: this drop unmaps the memory.
        let region = Arc::into_inner(region).ok_or_else(|| {
            Failure::Check(format!(
                "round {round}: the region is still referenced after its mapping was undone"
            ))
        })?;
        drop(region);
        let freed = Instant::now();
        if round >= WARMUP {
            frame.region.record(built - start);
            frame.map.record(mapped - built);
            frame.unmap.record(unmapped - mapped);
            frame.free.record(freed - free_start);
            frame
                .total
                .record((unmapped - start) + (freed - free_start));
            frame.runs.push(runs);
        }
    }
    Ok(frame)
}

/// Checks that the space counted `rounds` maps and as many unmaps between `before` and `after`,
/// no failure, and nothing left mapped.
fn check_counters(before: &Stats, after: &Stats, rounds: u64, what: &str) -> Result<(), Failure> {
    let maps = after.maps - before.maps;
    let unmaps = after.unmaps - before.unmaps;
    let map_errors = after.map_errors - before.map_errors;
    let unmap_errors = after.unmap_errors - before.unmap_errors;
    ensure!(
        maps == rounds
            && unmaps == rounds
            && map_errors == 0
            && unmap_errors == 0
            && after.live_bytes == before.live_bytes,
        "{what}: {rounds} rounds done, but the space counted {maps} maps, {unmaps} unmaps, \
         {map_errors} failed maps, {unmap_errors} failed unmaps, and {} bytes mapped after (want \
         {rounds}, {rounds}, 0, 0 and {}); last unmap error: {:?}",
        after.live_bytes,
        before.live_bytes,
        after.last_unmap_error
    );
    Ok(())
}

/// The accelerator named on the kernel command line (`tcg`, `kvm`), if any.
fn accelerator(cmdline: &str) -> Option<&str> {
    cmdline
        .split_whitespace()
        .find_map(|word| word.strip_prefix(ACCEL_PARAM))
}

/// What the accelerator means for the figures.
fn accelerator_note(accel: Option<&str>) -> String {
    match accel {
        Some("tcg") => {
            "QEMU TCG (software emulation: the guest's code is translated, its devices and IOMMU \
             emulated), so slower than on hardware"
                .to_owned()
        }
        Some("kvm") => {
            "QEMU with KVM (the devices and the IOMMU are still QEMU's emulated ones)".to_owned()
        }
        Some(other) => format!("QEMU with accelerator {other:?}"),
        None => format!("QEMU, accelerator not named ({ACCEL_PARAM} is not on the command line)"),
    }
}

/// The IOMMU as the figures depend on it: caching mode and 2 MiB pages, from the capability
/// register in sysfs.
fn iommu_note() -> String {
    let cap = std::fs::read_to_string(DMAR_CAP)
        .ok()
        .and_then(|text| u64::from_str_radix(text.trim(), 16).ok());
    match cap {
        Some(cap) => format!(
            "Intel IOMMU cap {cap:#x}: caching mode {} (with it the guest flushes the IOTLB on \
             map too), 2 MiB IOMMU pages {}",
            if cap & CAP_CM != 0 { "on" } else { "off" },
            if cap & CAP_SLLPS_2M != 0 {
                "supported"
            } else {
                "not supported"
            }
        ),
        None => format!("no IOMMU capability register ({DMAR_CAP} unreadable)"),
    }
}

/// What a map and an unmap do in a space of `kind`.
fn what_maps(kind: dma::Kind) -> &'static str {
    match kind {
        dma::Kind::Type1 => {
            "map = VFIO_IOMMU_MAP_DMA (pin the pages, write the IOMMU page table), unmap = \
             VFIO_IOMMU_UNMAP_DMA (clear it, flush the IOTLB, unpin)"
        }
        dma::Kind::Iommufd => {
            "map = IOMMU_IOAS_MAP (pin the pages, write the IOMMU page table), unmap = \
             IOMMU_IOAS_UNMAP (clear it, flush the IOTLB, unpin)"
        }
        dma::Kind::Physical => {
            "map = read the pages' physical addresses from /proc/self/pagemap, unmap = count it; \
             no pinning, no IOMMU"
        }
        _ => "another kind of space",
    }
}

/// Maps and unmaps 1 MiB of base pages and a 2 MiB hugepage in edu's DMA space many times, and
/// prints what each step costs; see the module's documentation.
pub(crate) fn map_unmap(env: &Env) -> Result<(), Failure> {
    let (bound, vfio, device) = vfio::open(env, &vfio::options(env))?;
    let space = vfio.dma_space();
    let want = env.boot.dma_kind();
    ensure!(
        space.kind() == want,
        "edu's DMA space is {}, want {want} in this boot",
        space.kind()
    );
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").context(|| "read /proc/cmdline".to_owned())?;
    let accel = accelerator_note(accelerator(&cmdline));
    let iommu = if env.boot.has_iommu() {
        iommu_note()
    } else {
        "no IOMMU".to_owned()
    };
    println!(
        "INFO vfio-map-cost: {} space; {}; {ROUNDS} rounds after {WARMUP} untimed; under {accel}; {iommu}",
        space.kind(),
        what_maps(space.kind())
    );
    let rounds = u64::from(WARMUP + ROUNDS);
    let mut totals = Vec::new();
    for memory in [Memory::BASE, Memory::HUGE] {
        let label = memory.label();
        let before = space.stats();
        let again = mapped_again(&*space, memory)?;
        let between = space.stats();
        check_counters(&before, &between, rounds, &format!("{label}, mapped again"))?;
        let mut frame = per_frame(&*space, memory)?;
        check_counters(
            &between,
            &space.stats(),
            rounds,
            &format!("{label}, per frame"),
        )?;
        let len = memory.len;
        println!(
            "INFO vfio-map-cost: {label}, mapped again (one region; physically contiguous runs: {}): map {}; unmap {}",
            again.runs,
            again.map.summary(len),
            again.unmap.summary(len)
        );
        println!(
            "INFO vfio-map-cost: {label}, per frame (region + map + unmap + free; a new region each round; physically contiguous runs, median: {}): region {}; map {}; unmap {}; free {}; total {}",
            median(&mut frame.runs),
            frame.region.summary(len),
            frame.map.summary(len),
            frame.unmap.summary(len),
            frame.free.summary(len),
            frame.total.summary(len)
        );
        totals.push(format!(
            "{} pages: map {} us, unmap {} us (mapped again), per frame {} us",
            memory.page_size,
            per_mib(again.map.median(), len),
            per_mib(again.unmap.median(), len),
            per_mib(frame.total.median(), len)
        ));
    }
    println!(
        "INFO vfio-map-cost: per MiB (medians; {} space, under {}): {}",
        space.kind(),
        accelerator(&cmdline).unwrap_or("an unnamed accelerator"),
        totals.join("; ")
    );
    drop(device);
    drop(space);
    drop(vfio);
    bound.release()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_page_and_per_mib_scale_by_the_region() {
        // 1 MiB in 256 us: 1 us a 4 KiB page, 256 us a MiB.
        assert_eq!(per_page(256_000, 1 << 20), "1.000");
        assert_eq!(per_mib(256_000, 1 << 20), "256.0");
        // 2 MiB in 100 us: 512 pages, 50 us a MiB.
        assert_eq!(per_page(100_000, 2 << 20), "0.195");
        assert_eq!(per_mib(100_000, 2 << 20), "50.0");
        assert_eq!(us(1_260), "1.3");
    }

    #[test]
    fn samples_give_quantiles_of_what_was_recorded() {
        let mut samples = Samples::new();
        for micros in 1..=100 {
            samples.record(Duration::from_micros(micros));
        }
        let (min, median, p90, max) = samples.quantiles();
        // Three significant figures: within 0.1 % of the exact values.
        let near = |got: u64, want: u64| got.abs_diff(want) * 1000 <= want;
        assert!(near(min, 1_000), "{min}");
        assert!(near(median, 50_000), "{median}");
        assert!(near(p90, 90_000), "{p90}");
        assert!(near(max, 100_000), "{max}");
    }

    #[test]
    fn runs_break_where_pages_are_not_adjacent() {
        let page = 0x1000;
        assert_eq!(runs(&[], page), 0);
        assert_eq!(runs(&[0x5000], page), 1);
        assert_eq!(runs(&[0x5000, 0x6000, 0x7000], page), 1);
        assert_eq!(runs(&[0x5000, 0x6000, 0x9000, 0xa000, 0x4000], page), 3);
        assert_eq!(runs(&[u64::MAX - 0xfff, 0], page), 2);
        assert_eq!(median(&mut [5, 1, 3]), 3);
        assert_eq!(median(&mut []), 0);
    }

    #[test]
    fn the_accelerator_comes_from_the_command_line() {
        assert_eq!(
            accelerator("console=ttyS0 userdma.boot=iommu-pt userdma.accel=tcg quiet"),
            Some("tcg")
        );
        assert_eq!(accelerator("console=ttyS0"), None);
        assert!(accelerator_note(Some("tcg")).contains("software emulation"));
    }

    #[test]
    fn labels_name_the_page_size() {
        assert_eq!(Memory::BASE.label(), "1 MiB of 4 KiB pages (256)");
        assert_eq!(Memory::HUGE.label(), "2 MiB of 2 MiB hugepages");
    }
}
