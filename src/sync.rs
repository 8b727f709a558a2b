//! The concurrency facade: loom's atomics and cells under `cfg(loom)`, std's otherwise.
//!
//! Every concurrent structure in the crate imports its atomics, `UnsafeCell`, `Arc` and thread
//! primitives from here, never from `std::sync` directly, so that the same algorithm text is
//! model-checked by loom (`RUSTFLAGS="--cfg loom" cargo test --release loom`) and compiled for
//! production without loom. The `UnsafeCell` has loom's closure API (`with` / `with_mut`) in both
//! builds, so no access to shared state can bypass loom's tracking.

#![allow(dead_code, unused_imports, unreachable_pub)]

#[cfg(loom)]
pub(crate) use loom::{
    cell::UnsafeCell,
    hint,
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use std::{
    hint,
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use self::cell::UnsafeCell;

pub(crate) mod asymmetric;

#[cfg(not(loom))]
mod cell {
    /// `std::cell::UnsafeCell` with loom's closure-based API, so code compiles unchanged
    /// under both builds.
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        /// Wraps `value`.
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a shared raw pointer to the contents; the caller upholds aliasing.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with a mutable raw pointer to the contents; the caller upholds aliasing.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }

        /// Consumes the cell and returns the value.
        pub(crate) fn into_inner(self) -> T {
            self.0.into_inner()
        }
    }
}

/// Runs `f` under loom's model checker (`cfg(loom)`) or once, directly, otherwise, so a test
/// written against the facade is both a loom model and an ordinary test.
#[cfg(test)]
pub(crate) fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(loom)]
    loom::model(f);
    #[cfg(not(loom))]
    f();
}

/// ThreadSanitizer and fences.
///
/// ThreadSanitizer models what atomic operations order, but not fences: a `fence(Release)`
/// before a Relaxed store and a `fence(Acquire)` after the Relaxed load that saw it order the
/// plain accesses around them for the CPU and the compiler, not for the sanitizer, which then
/// reports the ring's entries and the DMA buffers handed over through them as races. In the
/// build that runs under it (`--cfg userdma_sanitize="thread"`, scripts/sanitize.sh) the edges
/// are named to it two ways. Through a word of the ring memory (a CQ entry's phase, the SQ
/// head): that word's load and store become Acquire and Release ([`WORD_LOAD`],
/// [`WORD_STORE`]). Through a doorbell, which is a register, not ring memory (the SQ tail, the
/// CQ head): [`tsan_release`] next to the `fence(Release)` before the doorbell write and
/// [`tsan_acquire`] next to the `fence(Acquire)` after its read, on a key address both sides
/// compute (the first byte of the SQ, of the CQ: `ring::Memory::tsan_release`). In every
/// other build all of this compiles to Relaxed and nothing. Store-load (SeqCst) fences need
/// neither: what they order is atomic words only, which the sanitizer does not report.
#[inline(always)]
pub(crate) fn tsan_release(key: *const u8) {
    #[cfg(all(userdma_sanitize = "thread", not(loom)))]
    // SAFETY: the ThreadSanitizer runtime, linked into every `-Zsanitizer=thread` build, records
    // a release on the sync object keyed by the address; it never dereferences it.
    unsafe {
        tsan::__tsan_release(key.cast_mut().cast())
    };
    #[cfg(not(all(userdma_sanitize = "thread", not(loom))))]
    let _ = key;
}

/// The acquiring side of [`tsan_release`]: call it after the `fence(Acquire)`, with the key
/// the releasing side used.
#[inline(always)]
pub(crate) fn tsan_acquire(key: *const u8) {
    #[cfg(all(userdma_sanitize = "thread", not(loom)))]
    // SAFETY: as in `tsan_release`: the address is only a key.
    unsafe {
        tsan::__tsan_acquire(key.cast_mut().cast())
    };
    #[cfg(not(all(userdma_sanitize = "thread", not(loom))))]
    let _ = key;
}

/// The ordering of a ring word's polled load ([`Ordering::Relaxed`]: the ring fences around
/// it), except under ThreadSanitizer, which gets [`Ordering::Acquire`]: besides the fences it
/// does not model, an entry is read whole after its phase word was seen, and that plain read
/// overlaps the word the device stored; acquiring through the word itself orders the store
/// before the read for the sanitizer. The same as the fence for the CPU.
pub(crate) const WORD_LOAD: Ordering = if cfg!(userdma_sanitize = "thread") {
    Ordering::Acquire
} else {
    Ordering::Relaxed
};

/// The store side of [`WORD_LOAD`]: Relaxed, or Release under ThreadSanitizer.
pub(crate) const WORD_STORE: Ordering = if cfg!(userdma_sanitize = "thread") {
    Ordering::Release
} else {
    Ordering::Relaxed
};

#[cfg(all(userdma_sanitize = "thread", not(loom)))]
mod tsan {
    // The annotation entry points of compiler-rt's ThreadSanitizer runtime
    // (sanitizer/tsan_interface.h).
    extern "C" {
        pub(super) fn __tsan_acquire(addr: *mut std::ffi::c_void);
        pub(super) fn __tsan_release(addr: *mut std::ffi::c_void);
    }
}
