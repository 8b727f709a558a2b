//! The physical-address space over base pages: each 4 KiB page is its own contiguous piece
//! (as root), and the refusal without CAP_SYS_ADMIN (in a child process that drops it).

use std::process::Command;
use std::sync::Arc;

use userdma::dma::{Error, Physical, Space};
use userdma::memory::{self, PageSize, Region};

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
