//! CPU pinning for two-thread benchmarks (host on CPU 0, device on CPU 1) and the floor they are
//! compared with: one value bounced between the two CPUs through a cache line each way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The CPU the host (producer) side runs on.
pub const HOST: usize = 0;
/// The CPU the device (consumer) side runs on.
pub const DEVICE: usize = 1;

/// A value on cache lines of its own (128 bytes: the pair of lines x86 cores prefetch
/// together), so that no other shared word sits next to it.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Line<T>(pub T);

impl<T> std::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Restricts the calling thread to `cpus`. Best effort: on a machine without them (or a
/// restricted mask) the thread stays where it was.
pub fn set_affinity(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it (each CPU is
    // below CPU_SETSIZE for the CPUs this crate names); the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Pins the calling thread to `cpu`.
pub fn pin(cpu: usize) {
    set_affinity(&[cpu]);
}

/// Spawns `f` on [`DEVICE`] and leaves the caller on [`HOST`]. The new thread starts with its
/// parent's CPU mask, so the parent widens it first: a thread that could only start on the
/// host CPU would wait behind a spinning parent (for ever under a real-time class).
pub fn spawn_device<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    set_affinity(&[HOST, DEVICE]);
    let handle = thread::spawn(move || {
        pin(DEVICE);
        f()
    });
    pin(HOST);
    handle
}

/// [`spawn_device`] inside a scope.
pub fn spawn_device_scoped<'scope, T: Send + 'scope>(
    scope: &'scope thread::Scope<'scope, '_>,
    f: impl FnOnce() -> T + Send + 'scope,
) -> thread::ScopedJoinHandle<'scope, T> {
    set_affinity(&[HOST, DEVICE]);
    let handle = scope.spawn(move || {
        pin(DEVICE);
        f()
    });
    pin(HOST);
    handle
}

/// The cache-line ping-pong between [`HOST`] and [`DEVICE`]: nanoseconds per round trip (the
/// host stores a value, the device echoes it on a line of its own, the host sees it), the
/// median of rounds of about `time` each, over about `3 * time`.
///
/// This is the figure that tells which state a VM's cross-core traffic is in (on the 2-vCPU
/// development VM: about 125-130 ns in one, 470-480 ns in the other); compare two-thread
/// figures only between runs whose ping-pong agrees.
pub fn pingpong(time: Duration) -> f64 {
    let ping = Arc::new(Line(AtomicU64::new(0)));
    let pong = Arc::new(Line(AtomicU64::new(0)));
    let stop = Arc::new(Line(AtomicBool::new(false)));
    let device = {
        let (ping, pong, stop) = (Arc::clone(&ping), Arc::clone(&pong), Arc::clone(&stop));
        spawn_device(move || {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                // Acquire/Release: a value and its echo, each published by the other side.
                let v = ping.load(Ordering::Acquire);
                if v != last {
                    last = v;
                    pong.store(v, Ordering::Release);
                } else {
                    std::hint::spin_loop();
                }
            }
        })
    };
    let mut next = 0u64;
    let mut trip = |n: u64| {
        let start = Instant::now();
        for _ in 0..n {
            next += 1;
            ping.store(next, Ordering::Release);
            while pong.load(Ordering::Acquire) != next {
                std::hint::spin_loop();
            }
        }
        start.elapsed()
    };
    trip(1000);
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let (mut total, mut n) = (Duration::ZERO, 0u64);
        while total < time {
            total += trip(256);
            n += 256;
        }
        rounds.push(total.as_nanos() as f64 / n as f64);
    }
    stop.store(true, Ordering::Relaxed);
    device.join().expect("ping-pong device thread");
    rounds.sort_by(f64::total_cmp);
    rounds[1]
}
