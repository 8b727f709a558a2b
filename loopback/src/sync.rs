//! The concurrency facade of the simulated device: loom's atomics and primitives under
//! `cfg(loom)`, std's otherwise, so the wake-up handshakes in [`wake`](crate::wake) are
//! model-checked by loom (`RUSTFLAGS="--cfg loom" cargo test --release -p userdma-loopback
//! --lib -- wake::`) in the same text the device runs. (The driver has its own facade for its
//! pool and rings; this one covers what the device's threads use.)

#![allow(unused_imports, unreachable_pub)]

#[cfg(loom)]
pub(crate) use loom::{
    cell::UnsafeCell,
    sync::{
        atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    thread,
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering},
    Condvar, Mutex,
};
