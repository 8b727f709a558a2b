//! A pool dropped while some of its buffers are still out (only possible through
//! `mem::forget`, as a ring does with buffers a device never gave back) must not unmap memory
//! the device may still write: it leaks its mapping on purpose and counts it. A pool dropped
//! with every buffer back unmaps as usual.
//!
//! One test function on purpose: it checks whether an address range is mapped, which another
//! test of the same binary, mapping memory on another thread, could disturb.

use std::sync::Arc;

use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{leaked_mappings, Config, Pool};

const REGION: usize = 16 << 20;

fn new_pool() -> Pool {
    let region = Region::builder(REGION)
        .page_size(PageSize::Base)
        .build()
        .expect("16 MiB of locked base pages (raise RLIMIT_MEMLOCK or run as root)");
    let space = SoftIommu::new(48).expect("loopback DMA space");
    let mapping = space.map(Arc::new(region)).expect("loopback mapping");
    Pool::new(mapping, Config::default()).expect("pool over the mapping")
}

/// Whether `[addr, addr + len)` is mapped in this process: `msync` fails with `ENOMEM` on an
/// unmapped range and has no other effect on anonymous memory.
fn is_mapped(addr: usize, len: usize) -> bool {
    // SAFETY: `msync` only inspects the range; `addr` is page-aligned (a mapping's start).
    let rc = unsafe { libc::msync(addr as *mut libc::c_void, len, libc::MS_ASYNC) };
    if rc == 0 {
        return true;
    }
    let err = std::io::Error::last_os_error();
    assert_eq!(err.raw_os_error(), Some(libc::ENOMEM), "msync: {err}");
    false
}

/// Reads `len` bytes at `addr` with volatile loads.
fn peek(addr: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            // SAFETY: the caller checked that the range is mapped (the leaked mapping, which
            // nothing unmaps or writes any more).
            unsafe { std::ptr::read_volatile((addr + i) as *const u8) }
        })
        .collect()
}

#[test]
fn dropping_a_pool_with_buffers_out_leaks_its_mapping_instead_of_unmapping_it() {
    let before = leaked_mappings();

    // Every buffer back (some in this thread's cache, one freed by another thread): unmapped.
    let pool = new_pool();
    let base = pool.mapping().as_ptr().as_ptr() as usize;
    let len = pool.mapping().len();
    {
        let kept: Vec<_> = (0..8)
            .map(|_| pool.alloc(4096).expect("a buffer"))
            .collect();
        let large = pool.alloc(4 << 20).expect("a large buffer");
        let elsewhere = pool.alloc(512).expect("a buffer");
        std::thread::scope(|s| {
            s.spawn(move || drop(elsewhere));
        });
        drop(large);
        drop(kept);
    }
    assert_eq!(
        pool.stats().classes.iter().map(|c| c.in_use).sum::<u64>(),
        0
    );
    assert!(is_mapped(base, len));
    drop(pool);
    assert_eq!(leaked_mappings(), before, "nothing was out: nothing leaked");
    assert!(!is_mapped(base, len), "a clean drop unmaps the region");

    // A small buffer forgotten: the mapping stays, with the device-visible contents intact.
    let pool = new_pool();
    let base = pool.mapping().as_ptr().as_ptr() as usize;
    let len = pool.mapping().len();
    let others: Vec<_> = (0..4)
        .map(|_| pool.alloc(4096).expect("a buffer"))
        .collect();
    let buffer = pool.alloc(4096).expect("a buffer");
    buffer.write(0, b"device still owns this").expect("write");
    let addr = buffer.as_ptr().as_ptr() as usize;
    std::mem::forget(buffer);
    drop(others);
    drop(pool);
    assert_eq!(leaked_mappings(), before + 1, "the leak is counted");
    assert!(is_mapped(base, len), "the whole region stays mapped");
    assert_eq!(peek(addr, 22), b"device still owns this");

    // A large (buddy) buffer forgotten, after small ones came and went: leaked too.
    let pool = new_pool();
    let base = pool.mapping().as_ptr().as_ptr() as usize;
    let len = pool.mapping().len();
    drop(pool.alloc(256).expect("a buffer"));
    let large = pool.alloc(3 << 20).expect("a large buffer");
    large.write(0, b"large").expect("write");
    let addr = large.as_ptr().as_ptr() as usize;
    std::mem::forget(large);
    drop(pool);
    assert_eq!(leaked_mappings(), before + 2);
    assert!(is_mapped(base, len));
    assert_eq!(peek(addr, 5), b"large");
}
