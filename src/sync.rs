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
        Arc, Condvar, Mutex,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use std::{
    hint,
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use self::cell::UnsafeCell;

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
