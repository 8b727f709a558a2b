//! Values kept alive for the rest of the process, on purpose ([`keep_until_exit`]).
//!
//! When a device may still read or write some memory (a queue it would not stop, a pool with
//! buffers still out), that memory must never be unmapped or reused, so the code keeps it
//! instead of dropping it. Keeping is not `mem::forget`: the value moves to the heap and its
//! address goes into a list reachable from a static, so leak checkers (LeakSanitizer, which the
//! sanitizer run of the tests enables, and Valgrind, which the C tests run under) see it as
//! still reachable rather than lost, and report only real leaks. The counts callers keep
//! (`ring::leaked`, `pool::leaked_mappings`) say how often it happened.

use std::sync::Mutex;

/// The addresses of every kept value, as integers: a leak checker scans reachable memory for
/// words that look like pointers, so an address stored as `usize` keeps its block reachable.
static KEPT: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Keeps `value` alive until the process exits: it is never dropped, and every allocation it
/// owns stays reachable. For the rare paths above (one small allocation each), never a hot one.
pub fn keep_until_exit<T>(value: T) {
    let address = Box::into_raw(Box::new(value)) as usize;
    // A poisoned lock (a panic while pushing) leaves a valid Vec: keep using it.
    KEPT.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(address);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: keeps a value until the process exits on purpose, which Miri's leak check reports"
    )]
    fn a_kept_value_is_never_dropped() {
        let value = Arc::new(7u64);
        super::keep_until_exit(Arc::clone(&value));
        assert_eq!(Arc::strong_count(&value), 2);
        drop(value);
        let kept = super::KEPT.lock().unwrap();
        assert!(!kept.is_empty());
    }
}
