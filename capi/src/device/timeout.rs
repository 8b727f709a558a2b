//! Timeouts as the C API takes them: nanoseconds, with one value for "never".

use std::time::Duration;

/// A timeout that never passes.
pub const UDMA_TIMEOUT_INFINITE: u64 = u64::MAX;

/// A timeout in nanoseconds as a `Duration`, `UDMA_TIMEOUT_INFINITE` as `None`.
pub(crate) fn timeout(ns: u64) -> Option<Duration> {
    (ns != UDMA_TIMEOUT_INFINITE).then(|| Duration::from_nanos(ns))
}
