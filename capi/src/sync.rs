//! The concurrency facade: loom's atomics, cells and threads under `cfg(loom)`, std's
//! otherwise, so the lock-free handle slots ([`crate::slots`]) are one text, model-checked by
//! loom (`RUSTFLAGS="--cfg loom" cargo test -p userdma-capi --release --lib slots`) and
//! compiled for production without it. The `UnsafeCell` has loom's closure API (`with` /
//! `with_mut`) in both builds, so no access to a slot's value bypasses loom's tracking.

#![allow(dead_code, unused_imports)]

#[cfg(loom)]
pub(crate) use loom::{
    cell::UnsafeCell,
    hint,
    sync::{
        atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use std::{
    hint,
    sync::{
        atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use self::cell::UnsafeCell;

#[cfg(not(loom))]
mod cell {
    /// `std::cell::UnsafeCell` with loom's closure-based API.
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
