//! The cases, in the order they run, and what several of them share: test patterns, the edu
//! DMA round trip, and canary checks.

use std::sync::Arc;

use userdma::dma::{Mapping, Slice};
use userdma::memory::{PageSize, Region};

use crate::edu::{Direction, Edu};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::Boot;

mod capi;
mod cli;
mod dmabuf;
mod hotplug;
mod iommu;
mod map_cost;
mod numa;
mod nvme;
mod owner;
mod pci;
mod pipeline;
mod removal;
mod stage;
mod streams;
mod uio;
mod v4l2_capture;
mod vfio;

/// One case: a name (what the harness reports), the boots it runs in, and the code.
#[derive(Debug)]
pub(crate) struct Case {
    /// `[a-z0-9-]+`, unique within a boot.
    pub(crate) name: &'static str,
    /// The boots the case runs in.
    pub(crate) boots: &'static [Boot],
    /// The case. It leaves every device unbound when it returns.
    pub(crate) run: fn(&Env) -> Result<(), Failure>,
}

const EVERY: &[Boot] = &Boot::ALL;
const IOMMU: &[Boot] = &[Boot::IommuPt, Boot::IommuStrict, Boot::Iommufd];
/// The boots whose IOMMU translates every device's DMA.
const TRANSLATED: &[Boot] = &[Boot::IommuStrict, Boot::Iommufd];
const UNTRANSLATED: &[Boot] = &[Boot::IommuPt, Boot::NoIommu];

/// Every case, in run order. `pci-discovery` comes first: it checks the devices as the guest
/// booted, before any case binds them.
pub(crate) const ALL: &[Case] = &[
    Case {
        name: "pci-discovery",
        boots: EVERY,
        run: pci::discovery,
    },
    Case {
        name: "pci-bind-vfio",
        boots: EVERY,
        run: pci::bind_vfio,
    },
    Case {
        name: "pci-unbind",
        boots: EVERY,
        run: pci::unbind,
    },
    Case {
        name: "pci-bind-uio",
        boots: EVERY,
        run: pci::bind_uio,
    },
    Case {
        name: "device-open",
        boots: EVERY,
        run: vfio::device_open,
    },
    Case {
        name: "vfio-open",
        boots: EVERY,
        run: vfio::open_and_info,
    },
    Case {
        name: "vfio-type1-dma",
        boots: IOMMU,
        run: vfio::type1_dma,
    },
    Case {
        name: "vfio-pool-dma",
        boots: EVERY,
        run: vfio::pool_dma,
    },
    Case {
        name: "vfio-msi",
        boots: EVERY,
        run: vfio::msi,
    },
    Case {
        name: "vfio-intx",
        boots: EVERY,
        run: vfio::intx,
    },
    Case {
        name: "vfio-reset",
        boots: EVERY,
        run: vfio::reset,
    },
    Case {
        name: "vfio-reset-nvme",
        boots: EVERY,
        run: vfio::reset_nvme,
    },
    Case {
        name: "vfio-shared-container",
        boots: IOMMU,
        run: vfio::shared_container,
    },
    Case {
        name: "vfio-isolation",
        boots: IOMMU,
        run: vfio::isolation,
    },
    Case {
        name: "vfio-fault-stream",
        boots: IOMMU,
        run: iommu::fault_stream,
    },
    Case {
        name: "vfio-read-only-mapping",
        boots: IOMMU,
        run: iommu::read_only_mapping,
    },
    Case {
        name: "vfio-dma-mask",
        boots: IOMMU,
        run: iommu::dma_mask,
    },
    Case {
        name: "vfio-iommufd",
        boots: &[Boot::Iommufd],
        run: iommu::iommufd,
    },
    Case {
        name: "vfio-noiommu-dma",
        boots: &[Boot::NoIommu],
        run: vfio::noiommu_dma,
    },
    Case {
        name: "vfio-map-cost",
        boots: EVERY,
        run: map_cost::map_unmap,
    },
    Case {
        name: "pipeline-edu-vfio",
        boots: EVERY,
        run: pipeline::edu_vfio,
    },
    Case {
        name: "streams-edu-loopback",
        boots: EVERY,
        run: streams::edu_and_loopback,
    },
    // Behind an IOMMU: a client's pool is a memfd of base pages, whose physical addresses (what
    // a no-IOMMU space gives the device) the kernel may change by migrating them.
    Case {
        name: "owner-edu-two-clients",
        boots: IOMMU,
        run: owner::edu_two_clients,
    },
    Case {
        name: "c-edu-vfio",
        boots: EVERY,
        run: capi::edu_vfio,
    },
    Case {
        name: "c-engine-edu-vfio",
        boots: EVERY,
        run: capi::engine_edu_vfio,
    },
    Case {
        name: "uio-bar0-map",
        boots: EVERY,
        run: uio::bar0_map,
    },
    Case {
        name: "uio-physical-dma",
        boots: UNTRANSLATED,
        run: uio::physical_dma,
    },
    Case {
        name: "uio-dma-blocked",
        boots: TRANSLATED,
        run: uio::dma_blocked,
    },
    Case {
        name: "uio-intx",
        boots: EVERY,
        run: uio::intx,
    },
    Case {
        name: "cli-info-vfio",
        boots: EVERY,
        run: cli::info_vfio,
    },
    Case {
        name: "nvme-vfio",
        boots: IOMMU,
        run: nvme::nvme_vfio,
    },
    Case {
        name: "vfio-hot-unplug",
        boots: &[Boot::IommuStrict],
        run: hotplug::hot_unplug,
    },
    Case {
        name: "numa-placement",
        boots: &[Boot::IommuPt],
        run: numa::placement,
    },
    Case {
        name: "vfio-unbind-while-open",
        boots: EVERY,
        run: removal::vfio_unbind_while_open,
    },
    Case {
        name: "uio-unbind-while-open",
        boots: EVERY,
        run: removal::uio_unbind_while_open,
    },
    Case {
        name: "vfio-bus-reset",
        boots: &[Boot::IommuPt],
        run: removal::vfio_bus_reset,
    },
    // dma-bufs, on Debian 13's kernel (udmabuf, the system dma-heap; vivid loaded by init).
    Case {
        name: "dmabuf-heap-capture",
        boots: &[Boot::Iommufd],
        run: v4l2_capture::heap_capture,
    },
    Case {
        name: "dmabuf-vivid-capture",
        boots: &[Boot::Iommufd],
        run: dmabuf::vivid_capture,
    },
    Case {
        name: "dmabuf-refusals",
        boots: &[Boot::Iommufd],
        run: dmabuf::refusals,
    },
    Case {
        name: "dmabuf-loopback-import",
        boots: &[Boot::Iommufd],
        run: dmabuf::loopback_import,
    },
    // Last: it loads the kernel's nvme driver (and unloads it), which would claim the NVMe
    // controller whenever an earlier case returned it to no driver.
    Case {
        name: "stage-nvme-edu",
        boots: IOMMU,
        run: stage::nvme_disk_to_edu,
    },
];

/// Runs this program as a child process of a case (`guest_suite --child ROLE ARGS…`): its
/// output goes to the case, which checks it. Failure is a line `ERROR <reason>` and status 1.
pub(crate) fn child(role: &str, args: &[&str]) -> std::process::ExitCode {
    let result = match role {
        owner::CLIENT_ROLE => owner::client(args),
        other => Err(Failure::Check(format!("no child role {other:?}"))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(failure) => {
            println!("ERROR {}", failure.chain());
            std::process::ExitCode::FAILURE
        }
    }
}

/// The cases of `boot`, in run order.
pub(crate) fn for_boot(boot: Boot) -> impl Iterator<Item = &'static Case> {
    ALL.iter().filter(move |case| case.boots.contains(&boot))
}

/// Bytes transferred by the round trips (edu's buffer holds up to 4095, see `edu`).
pub(crate) const TRANSFER: usize = 2048;
/// Bytes after a destination that a round trip checks were not written.
pub(crate) const GUARD: usize = 256;
/// The byte canary memory is filled with.
pub(crate) const CANARY: u8 = 0xc3;

/// `len` bytes of a pattern that differs for every `seed`, with no long runs of one value.
pub(crate) fn pattern(seed: u32, len: usize) -> Vec<u8> {
    // xorshift32 (never 0 from a non-zero state).
    let mut state = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state.to_le_bytes()[1]
        })
        .collect()
}

/// Where a round trip reads or writes: host memory (the CPU's view) and the address the device
/// uses for its first byte.
#[derive(Debug)]
pub(crate) struct Buffer<'a> {
    /// The CPU's view.
    pub(crate) host: Slice<'a>,
    /// The device's address of `host`'s first byte.
    pub(crate) addr: u64,
}

impl Buffer<'_> {
    /// `len` bytes at `offset` of `mapping`, which must be contiguous in the device's view.
    pub(crate) fn at(mapping: &Mapping, offset: usize, len: usize) -> Result<Buffer<'_>, Failure> {
        let host = mapping
            .slice_at(offset, len)
            .context(|| format!("{len} bytes at offset {offset:#x} of the mapping"))?;
        let addr = mapping.iova(offset).ok_or_else(|| {
            Failure::Check(format!("the mapping has no address for offset {offset:#x}"))
        })?;
        ensure!(
            mapping.contiguous_len(offset) >= len,
            "{len} bytes at offset {offset:#x} are not contiguous in the device's view"
        );
        Ok(Buffer {
            host,
            addr: addr.raw(),
        })
    }

    /// `len` bytes at `offset` of a pool buffer.
    pub(crate) fn in_pool<'a>(
        buffer: &'a userdma::pool::Buffer<'_>,
        offset: usize,
        len: usize,
    ) -> Result<Buffer<'a>, Failure> {
        let host = buffer
            .slice()
            .subslice(offset, len)
            .context(|| format!("{len} bytes at offset {offset:#x} of a pool buffer"))?;
        let addr = buffer
            .iova_at(offset)
            .ok_or_else(|| Failure::Check(format!("the pool buffer has no IOVA at {offset:#x}")))?;
        Ok(Buffer {
            host,
            addr: addr.raw(),
        })
    }
}

/// A locked region of `len` bytes of `page_size` pages.
/// A library error without a [`Failure`] variant of its own, with its chain of causes.
pub(crate) fn cause(op: &str, err: &dyn std::error::Error) -> Failure {
    let mut text = format!("{op}: {err}");
    let mut source = err.source();
    while let Some(next) = source {
        text.push_str(&format!(": {next}"));
        source = next.source();
    }
    Failure::Check(text)
}

pub(crate) fn region(len: usize, page_size: PageSize) -> Result<Arc<Region>, Failure> {
    let region = Region::builder(len)
        .page_size(page_size)
        .build()
        .context(|| format!("build a {len:#x}-byte region of {page_size} pages"))?;
    Ok(Arc::new(region))
}

/// Copies a fresh pattern from `src` into the device and back out to `dst`, and checks that
/// `dst` holds the pattern and that the [`GUARD`] bytes after it were not touched. `dst.host`
/// must be at least `TRANSFER + GUARD` bytes, `src.host` at least `TRANSFER`.
pub(crate) fn round_trip(
    edu: &Edu,
    src: &Buffer<'_>,
    dst: &Buffer<'_>,
    seed: u32,
) -> Result<(), Failure> {
    let data = pattern(seed, TRANSFER);
    src.host
        .write_from(0, &data)
        .context(|| format!("fill the source buffer (addr {:#x})", src.addr))?;
    dst.host.fill(CANARY);
    let to = edu.dma(Direction::ToDevice, src.addr, TRANSFER)?;
    let from = edu.dma(Direction::FromDevice, dst.addr, TRANSFER)?;
    let mut back = vec![0_u8; TRANSFER + GUARD];
    dst.host
        .read_into(0, &mut back)
        .context(|| format!("read the destination buffer (addr {:#x})", dst.addr))?;
    let (body, guard) = back.split_at(TRANSFER);
    compare(&data, body).map_err(|why| {
        Failure::Check(format!(
            "{TRANSFER} bytes from {:#x} through the device to {:#x}: {why}",
            src.addr, dst.addr
        ))
    })?;
    ensure!(
        guard.iter().all(|&b| b == CANARY),
        "the device wrote past the {TRANSFER} bytes at {:#x}",
        dst.addr
    );
    println!(
        "INFO round trip {:#x} -> device -> {:#x}: {TRANSFER} bytes ok ({} ms + {} ms)",
        src.addr,
        dst.addr,
        to.as_millis(),
        from.as_millis()
    );
    Ok(())
}

/// Where `got` differs from `want`, as text.
pub(crate) fn compare(want: &[u8], got: &[u8]) -> Result<(), String> {
    if want == got {
        return Ok(());
    }
    if want.len() != got.len() {
        return Err(format!("{} bytes, want {}", got.len(), want.len()));
    }
    let differ = want.iter().zip(got).filter(|(a, b)| a != b).count();
    let first = want.iter().zip(got).position(|(a, b)| a != b).unwrap_or(0);
    Err(format!(
        "{differ} of {} bytes differ, the first at byte {first} (want {:#04x}, got {:#04x})",
        want.len(),
        want.get(first).copied().unwrap_or(0),
        got.get(first).copied().unwrap_or(0)
    ))
}

/// Checks that every byte of `host` still holds [`CANARY`].
pub(crate) fn check_canary(host: &Slice<'_>, what: &str) -> Result<(), Failure> {
    let mut bytes = vec![0_u8; host.len()];
    host.read_into(0, &mut bytes)
        .context(|| format!("read {what}"))?;
    let changed = bytes.iter().filter(|&&b| b != CANARY).count();
    ensure!(
        changed == 0,
        "{changed} bytes of {what} changed (the first at byte {})",
        bytes.iter().position(|&b| b != CANARY).unwrap_or(0)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_have_no_long_runs() {
        let a = pattern(1, TRANSFER);
        let b = pattern(2, TRANSFER);
        assert_eq!(a.len(), TRANSFER);
        assert_ne!(a, b);
        assert_eq!(a, pattern(1, TRANSFER));
        let longest_run = a
            .windows(8)
            .filter(|w| w.iter().all(|&x| x == w[0]))
            .count();
        assert_eq!(longest_run, 0);
    }

    #[test]
    fn compare_names_the_first_difference() {
        assert!(compare(&[1, 2, 3], &[1, 2, 3]).is_ok());
        assert_eq!(
            compare(&[1, 2, 3], &[1, 9, 8]).unwrap_err(),
            "2 of 3 bytes differ, the first at byte 1 (want 0x02, got 0x09)"
        );
        assert_eq!(compare(&[1], &[1, 2]).unwrap_err(), "2 bytes, want 1");
    }
}
