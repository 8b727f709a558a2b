//! The hugepage tests' shared setup: one test at a time per binary (they share the kernel's
//! pools), and reserving what a test needs for as long as it runs.

#![allow(dead_code)]

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use userdma::memory::hugepages::Guard;
use userdma::memory::{PageSize, SYSFS_ROOT};

static SERIAL: Mutex<()> = Mutex::new(());

/// Serialises the tests of one file (they share the kernel's pools).
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes `count` pages of `size` available until the guard drops; fails the test, saying why,
/// when that is impossible (not root, memory too fragmented).
pub(crate) fn reserve(count: u64, size: PageSize) -> Guard {
    Guard::ensure_available(Path::new(SYSFS_ROOT), count, size, None).unwrap_or_else(|err| {
        panic!("this test needs {count} free {size} hugepages and root to reserve them: {err}")
    })
}
