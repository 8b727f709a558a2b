//! Blocking until a buffer is freed: the futex calls behind `Exhaustion::Wait`.
//!
//! The futex word lives in the pool's metadata, so for a shared pool it is in shared memory and
//! the non-private futex operations let a free in one process wake a waiter in another. Under
//! loom there is no kernel: waiting is a yield, and the waiter's loop re-checks.

use std::time::Duration;

use crate::sync::AtomicU32;

/// Sleeps while `*word == expected`, for at most `timeout`. Returns early on a wake-up, on a
/// signal, or if the word no longer holds `expected`; callers loop and re-check their condition,
/// so every outcome is fine and none is reported.
#[cfg(not(loom))]
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration, shared: bool) {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9, so it fits every `c_long`.
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    let op = if shared {
        libc::FUTEX_WAIT
    } else {
        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (alive for the call, only accessed
    // atomically) and the timespec (alive for the call); it writes nothing of ours. EAGAIN,
    // ETIMEDOUT and EINTR are all expected outcomes (see above).
    let _ = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            op,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// Wakes every thread (of any process, for a shared pool) sleeping in [`wait`] on `word`.
#[cfg(not(loom))]
pub(crate) fn wake_all(word: &AtomicU32, shared: bool) {
    let op = if shared {
        libc::FUTEX_WAKE
    } else {
        libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG
    };
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key; it reads and writes no
    // memory of ours. Its only failure (EFAULT) is impossible for a live reference.
    let _ = unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, i32::MAX) };
}

/// Loom build: yields instead of sleeping.
#[cfg(loom)]
pub(crate) fn wait(_word: &AtomicU32, _expected: u32, _timeout: Duration, _shared: bool) {
    crate::sync::thread::yield_now();
}

/// Loom build: nothing sleeps, nothing to wake.
#[cfg(loom)]
pub(crate) fn wake_all(_word: &AtomicU32, _shared: bool) {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    #[test]
    fn wait_times_out_and_returns_on_mismatch() {
        let word = AtomicU32::new(5);
        let start = Instant::now();
        wait(&word, 5, Duration::from_millis(20), false);
        assert!(start.elapsed() >= Duration::from_millis(15));
        let start = Instant::now();
        wait(&word, 6, Duration::from_secs(5), false);
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn wake_releases_a_waiter() {
        let word = std::sync::Arc::new(AtomicU32::new(0));
        let w = word.clone();
        let start = Instant::now();
        let t = std::thread::spawn(move || {
            while w.load(Ordering::Acquire) == 0 {
                wait(&w, 0, Duration::from_secs(10), false);
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        word.store(1, Ordering::Release);
        wake_all(&word, false);
        t.join().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
