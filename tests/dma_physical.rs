//! The physical-address space over base pages: each 4 KiB page is its own contiguous piece
//! (as root), and the refusal without CAP_SYS_ADMIN (in a child process that drops it).

use std::process::Command;
use std::sync::Arc;

use userdma::device::{self, Device, Identity};
use userdma::dma::{Error, Physical, Space};
use userdma::irq::EventFd;
use userdma::memory::{self, PageSize, Region};
use userdma::mmio::DynBlock;
use userdma::Runtime;
use userdma_loopback::{self as loopback, Loopback};

/// Set in a child process started by a test: names the role it plays.
const CHILD_ROLE: &str = "USERDMA_TEST_CHILD_ROLE";
mod caps;

use caps::{drop_capability, CAP_SYS_ADMIN};

fn base_region(pages: usize) -> Arc<Region> {
    Arc::new(
        Region::builder(pages * 4096)
            .page_size(PageSize::Base)
            .build()
            .expect("a small locked base-page region"),
    )
}

#[test]
fn base_pages_map_one_piece_per_physical_run_as_root() {
    let region = base_region(16);
    let pages = region.physical_pages().unwrap_or_else(|err| {
        panic!("this test needs root (CAP_SYS_ADMIN) for physical addresses: {err}")
    });
    let space = Physical::new(64).unwrap();
    let mapping = space.map(region).unwrap();
    for page in 0..16 {
        let offset = page * 4096 + 17;
        assert_eq!(mapping.iova(offset).map(|i| i.raw()), pages.addr_of(offset));
        let len = mapping.contiguous_len(offset);
        assert!(len >= 4096 - 17, "page {page}: {len}");
        // Contiguous means contiguous: every byte of the run is at start + distance.
        let end = offset + len - 1;
        assert_eq!(
            mapping.iova(end),
            Some(mapping.iova(offset).unwrap() + (len - 1) as u64)
        );
    }
    let pieces = mapping.segments().count();
    let runs = 1 + pages
        .as_slice()
        .windows(2)
        .filter(|pair| pair[0] + 4096 != pair[1])
        .count();
    assert_eq!(pieces, runs);
}

#[test]
fn bad_mask_is_an_error() {
    assert!(matches!(
        Physical::new(0),
        Err(Error::InvalidDmaMask { bits: 0 })
    ));
}

/// Child: without CAP_SYS_ADMIN, mapping must be refused, saying why.
fn no_admin_child() {
    drop_capability(CAP_SYS_ADMIN).unwrap();
    let space = Physical::new(64).unwrap();
    let err = space.map(base_region(4)).unwrap_err();
    match &err {
        Error::Physical {
            source: memory::Error::PhysicalAddressHidden,
        } => {}
        other => panic!("expected hidden physical addresses, got {other:?}"),
    }
    let source = std::error::Error::source(&err).unwrap();
    println!("CHILD-ERROR: {err}: {source}");
}

#[test]
fn physical_space_without_cap_sys_admin_is_refused() {
    if std::env::var(CHILD_ROLE).as_deref() == Ok("no-admin") {
        return no_admin_child();
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "physical_space_without_cap_sys_admin_is_refused",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ROLE, "no-admin")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find(|line| line.starts_with("CHILD-ERROR: "))
        .unwrap_or_else(|| panic!("child printed no error: {stdout}"));
    assert!(line.contains("physical-address DMA"), "{line}");
    assert!(line.contains("CAP_SYS_ADMIN"), "{line}");
}

/// The loopback device seen through a physical-address space, as a device bound to UIO (or
/// no-IOMMU VFIO) gives one: what [`Runtime`] maps for it is addressed by physical address.
#[derive(Debug)]
struct PhysicalDevice {
    loopback: Loopback,
    space: Physical,
}

impl Device for PhysicalDevice {
    fn identity(&self) -> &Identity {
        self.loopback.identity()
    }
    fn bar(&self, index: usize) -> Result<DynBlock, device::Error> {
        self.loopback.bar(index)
    }
    fn dma_space(&self) -> Arc<dyn Space> {
        Arc::new(self.space.clone())
    }
    fn vectors(&self) -> u32 {
        self.loopback.vectors()
    }
    fn interrupt(&self, vector: u32) -> Result<EventFd, device::Error> {
        self.loopback.interrupt(vector)
    }
    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), device::Error> {
        self.loopback.set_masked(vector, masked)
    }
    fn reset(&self) -> Result<(), device::Error> {
        self.loopback.reset()
    }
}

/// `Runtime::pool` on base pages in a physical-address space: the pages are contiguous one by
/// one, so the pool's chunk and largest class are a page (the default 64 KiB chunk and 1 MiB
/// class could not be cut from it), and every buffer's device addresses are its pages'
/// physical addresses, page by page, including a 64 KiB buffer that spans 16 pages.
#[test]
fn a_runtime_pool_over_physical_base_pages_is_cut_per_page_as_root() {
    let device = PhysicalDevice {
        loopback: Loopback::new(loopback::Config::default()).unwrap(),
        space: Physical::new(64).unwrap(),
    };
    let rt = Runtime::from_device(Arc::new(device));
    let pool = rt
        .pool(4 << 20, PageSize::Base)
        .unwrap_or_else(|err| panic!("a pool over physical base pages (needs root): {err}"));
    let pages = pool.mapping().region().physical_pages().unwrap();
    let mut held = Vec::new();
    for len in [256, 1000, 4096, 8192, 64 << 10] {
        for _ in 0..3 {
            let buffer = pool
                .alloc_owned(len)
                .unwrap_or_else(|err| panic!("{len} B: {err}"));
            let start = buffer.as_buffer().offset();
            assert_eq!(Some(buffer.iova().raw()), pages.addr_of(start), "{len} B");
            let mut at = 0;
            while at < buffer.capacity() {
                let contiguous = pool
                    .mapping()
                    .contiguous_len(start + at)
                    .min(buffer.capacity() - at);
                assert!(contiguous > 0, "{len} B at {at}");
                for probe in [at, at + contiguous - 1] {
                    assert_eq!(
                        buffer.iova_at(probe).map(|iova| iova.raw()),
                        pages.addr_of(start + probe),
                        "{len} B: byte {probe}"
                    );
                }
                at += contiguous;
            }
            held.push(buffer);
        }
    }
    assert!(held.iter().all(|b| b.capacity() >= b.len()));
}
