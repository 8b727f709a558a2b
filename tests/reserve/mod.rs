//! The hugepage tests' shared setup: one test at a time per binary (they share the kernel's
//! pools), and reserving what a test needs for as long as it runs.

#![allow(dead_code)]

use std::fs;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use userdma::memory::hugepages::Guard;
use userdma::memory::{Error, PageSize, SYSFS_ROOT};

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests of one file (they share the kernel's pools).
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes `count` pages of `size` available until the guard drops; fails the test, saying why,
/// when that is impossible (not root, memory too fragmented).
///
/// When the kernel grants fewer pages than asked (free memory is there but not contiguous), the
/// test asks it once to compact memory and tries again: a 1 GiB page needs a whole free,
/// aligned GiB, which a busy machine rarely has until compaction moves pages out of the way.
pub(crate) fn reserve(count: u64, size: PageSize) -> Guard {
    let root = Path::new(SYSFS_ROOT);
    let first = Guard::ensure_available(root, count, size, None);
    let result = match first {
        Err(Error::ReserveShort { .. }) => {
            // The failed attempt's guard has already put the pool back. Dropping clean caches
            // (the page cache, and the dentry and inode slabs a build leaves spread over
            // memory) and compaction are requests to the kernel, harmless on a test machine; if
            // they cannot be asked, the retry reports the same shortfall.
            let _ = fs::write("/proc/sys/vm/drop_caches", "3");
            let _ = fs::write("/proc/sys/vm/compact_memory", "1");
            Guard::ensure_available(root, count, size, None)
        }
        other => other,
    };
    result.unwrap_or_else(|err| {
        panic!("this test needs {count} free {size} hugepages and root to reserve them: {err}")
    })
}
