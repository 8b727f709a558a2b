//! The pool on real 2 MiB hugepages (needs root: each test tops the kernel's pool up for what it
//! needs, and a guard puts the pool back afterwards, also when the test fails). Tests in this
//! file run one at a time, since they resize the same pool.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use userdma::dma::{Physical, SoftIommu, Space};
use userdma::memory::hugepages::Guard;
use userdma::memory::{PageSize, Region, SYSFS_ROOT};
use userdma::pool::{Config, Exhaustion, Pool, MIN_ALIGN};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes `count` 2 MiB pages available until the guard drops; fails the test, saying why, when
/// that is impossible (not root, memory too fragmented).
fn reserve(count: u64) -> Guard {
    Guard::ensure_available(Path::new(SYSFS_ROOT), count, PageSize::Huge2M, None).unwrap_or_else(
        |err| {
            panic!("this test needs {count} free 2 MiB hugepages and root to reserve them: {err}")
        },
    )
}

const MIB: usize = 1 << 20;

#[test]
fn every_class_is_aligned_to_its_size_on_hugepages() {
    let _serial = serial();
    // Thirteen classes take a 2 MiB slab each; the large buffer needs four aligned chunks more.
    let _pages = reserve(32);
    let region = Arc::new(
        Region::builder(64 * MIB)
            .build()
            .expect("64 MiB of 2 MiB pages"),
    );
    let mapping = SoftIommu::new(48).unwrap().map(region).unwrap();
    let pool = Pool::new(mapping, Config::default()).unwrap();
    assert_eq!(
        pool.arena_offset(),
        0,
        "a hugepage mapping is already 2 MiB aligned"
    );
    let mut held = Vec::new();
    let mut size = MIN_ALIGN;
    while size <= MIB {
        for len in [size / 2 + 1, size] {
            let buffer = pool.alloc(len).unwrap();
            assert_eq!(buffer.capacity(), size.max(MIN_ALIGN));
            assert_eq!(
                buffer.iova() % size as u64,
                0,
                "{len}-byte buffer IOVA alignment"
            );
            assert_eq!(
                buffer.as_ptr().as_ptr() as usize % size,
                0,
                "host alignment"
            );
            buffer.write(len - 1, &[0x5a]).unwrap();
            held.push(buffer);
        }
        size *= 2;
    }
    // Above the largest class: whole chunks from the buddy allocator.
    let large = pool.alloc(4 * MIB + 1).unwrap();
    assert_eq!(large.capacity(), 8 * MIB);
    assert_eq!(large.iova() % (2 * MIB) as u64, 0);
    assert_eq!(large.contiguous_len(), large.capacity());
    large.write(4 * MIB + 1 - 8, &[1; 8]).unwrap();
    let stats = pool.stats();
    assert!(stats.large.splits >= 2);
    drop(large);
    drop(held);
    pool.flush_thread_cache();
    let stats = pool.stats();
    assert_eq!(stats.large.in_use_bytes, 0);
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
}

#[test]
fn physical_addresses_are_taken_per_hugepage_hugepages() {
    let _serial = serial();
    let _pages = reserve(8);
    let region = Arc::new(
        Region::builder(16 * MIB)
            .build()
            .expect("16 MiB of 2 MiB pages"),
    );
    let space = Physical::new(64).expect("a physical DMA space (needs root for pagemap)");
    let mapping = space
        .map(region)
        .expect("physical addresses (needs CAP_SYS_ADMIN)");
    let pool = Pool::new(mapping, Config::default()).unwrap();
    // Enough 64 KiB buffers to cover every chunk: each must carry its own page's address.
    let mut held = Vec::new();
    while let Ok(buffer) = pool.alloc(64 << 10) {
        let expected = pool.mapping().iova(buffer.offset()).unwrap();
        assert_eq!(
            buffer.iova(),
            expected,
            "buffer at offset {:#x}",
            buffer.offset()
        );
        assert_eq!(buffer.iova() % (64 << 10), 0);
        assert_eq!(buffer.contiguous_len(), 64 << 10);
        held.push(buffer);
    }
    assert_eq!(
        held.len(),
        16 * MIB / (64 << 10),
        "the whole region, one class"
    );
    drop(held);
    pool.flush_thread_cache();
    // The 64 KiB class took every chunk as slabs: a fresh pool for the buddy allocator. A large
    // buffer is contiguous at least over its first chunk (more if the pages happen to be
    // physically adjacent), and says so.
    drop(pool);
    let region = Arc::new(
        Region::builder(16 * MIB)
            .build()
            .expect("16 MiB of 2 MiB pages"),
    );
    let pool = Pool::new(space.map(region).unwrap(), Config::default()).unwrap();
    let large = pool.alloc(4 * MIB).unwrap();
    let contiguous = large.contiguous_len();
    assert!((2 * MIB..=4 * MIB).contains(&contiguous), "{contiguous:#x}");
    assert_eq!(
        contiguous,
        pool.mapping().contiguous_len(large.offset()).min(4 * MIB)
    );
    assert_eq!(
        large.iova_at(2 * MIB),
        pool.mapping().iova(large.offset() + 2 * MIB)
    );
}

#[test]
fn shared_pool_on_a_hugetlb_memfd_mapped_twice_hugepages() {
    let _serial = serial();
    let _pages = reserve(8);
    let region = Region::builder(16 * MIB)
        .memfd()
        .build()
        .expect("a 16 MiB hugetlb memfd");
    let fd: OwnedFd = region.fd().unwrap().as_fd().try_clone_to_owned().unwrap();
    // A second, independent mapping of the same file: what another process would do.
    let again = Region::from_fd(fd, 16 * MIB, PageSize::Huge2M).expect("map the memfd again");
    let space = SoftIommu::new(48).unwrap();
    let creator =
        Pool::create_shared(space.map(Arc::new(region)).unwrap(), Config::default()).unwrap();
    let opener = Pool::open_shared(space.map(Arc::new(again)).unwrap(), Exhaustion::Fail).unwrap();
    assert_eq!(
        creator.arena_offset(),
        2 * MIB,
        "metadata takes the first hugepage"
    );
    assert_ne!(creator.mapping().as_ptr(), opener.mapping().as_ptr());
    let a = creator.alloc(MIB).unwrap();
    let b = opener.alloc(MIB).unwrap();
    assert_ne!(a.offset(), b.offset());
    a.write(0, b"creator").unwrap();
    let mut seen = [0u8; 7];
    opener
        .mapping()
        .slice()
        .read_into(a.offset(), &mut seen)
        .unwrap();
    assert_eq!(
        &seen, b"creator",
        "the opener's mapping shows the creator's write"
    );
    let large = opener.alloc(4 * MIB).unwrap();
    assert_eq!(
        creator.stats().large.in_use_bytes,
        4 * MIB as u64,
        "shared buddy counters"
    );
    drop((a, b, large));
    creator.flush_thread_cache();
    opener.flush_thread_cache();
    let stats = creator.stats();
    for class in &stats.classes {
        assert_eq!(class.outstanding, 0);
    }
    assert_eq!(stats.accounted_bytes(), stats.arena_bytes);
}
