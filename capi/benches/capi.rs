//! The C API against the Rust API, in the same run: what the boundary (handles, status
//! codes, the panic guard, the checks) costs on the two hot paths.
//!
//! | group | what one iteration is |
//! |---|---|
//! | `alloc_free/4KiB` | one 4 KiB buffer allocated from a pool and freed |
//! | `submit_complete/64B` | one 64-byte host-to-device transfer submitted (doorbell rung) and its completion waited for, the buffer moving into the queue and back |
//!
//! Each has `c`, the exported `udma_*` functions called as a C program calls them (the
//! crate's sources are compiled into this benchmark, so the calls are the library's own code,
//! without the dynamic linker's indirection), and `rust`, the same work through userdma's Rust
//! API: `Pool::alloc_owned` and dropping the `OwnedBuffer` (what a C buffer handle holds; the
//! borrowed `Pool::alloc` is shown too), and `loopback::Queue::push`, `flush` and `wait` with
//! the buffer as the payload. Both run on one zero-cost loopback device: their own pools of
//! the same size, their own queues of the same depth, waiting the same way (the interrupt,
//! after the adaptive spin). Each side's iteration is a function the loop calls (never
//! inlined into it), and a C status is checked inline with its failure out of line, as
//! `expect` is: the two sides are compiled alike.
//!
//! After criterion's report, alternating short rounds of each print the ratio C ÷ Rust per
//! path (the target: at most 1.1), the median of the rounds' ratios and their range: both
//! sides see the same machine, so a burst of load from another process hits both. Run only
//! the ratios with `cargo bench -p userdma-capi -- ratios-only` (a filter no criterion
//! benchmark matches).
//!
//! ```text
//! taskset -c 0 cargo bench -p userdma-capi
//! taskset -c 0 cargo bench -p userdma-capi -- ratios-only
//! ```
#![allow(non_camel_case_types)]
// The C API's modules, as its lib.rs declares them (the crate builds no rlib to link against:
// its file would collide with userdma's). Each is compiled here whole, its unused parts too.
#![allow(dead_code, unreachable_pub, missing_docs, unused_imports)]

#[path = "../src/abi.rs"]
mod abi;
#[path = "../src/device.rs"]
mod device;
#[path = "../src/engine.rs"]
#[allow(dead_code)]
mod engine;
#[path = "../src/error.rs"]
mod error;
#[path = "../src/handle.rs"]
mod handle;
#[path = "../src/interop.rs"]
mod interop;
#[path = "../src/memory.rs"]
mod memory;
#[path = "../src/pipeline.rs"]
mod pipeline;
#[path = "../src/plan.rs"]
mod plan;
#[path = "../src/queue.rs"]
mod queue;
#[path = "../src/quiesce.rs"]
mod quiesce;
#[path = "../src/slots.rs"]
mod slots;
#[path = "../src/streams.rs"]
mod streams;
#[path = "../src/sync.rs"]
mod sync;

use std::hint::black_box;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use udma::device::Wait;
use udma::dma::DeviceOffset;
use udma::memory::PageSize;
use udma::pool::{OwnedBuffer, Pool};
use udma::ring;
use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime};

use device::{
    udma_cost_model, udma_device, udma_device_close, udma_device_open_loopback,
    udma_loopback_options, UDMA_TIMEOUT_INFINITE,
};
use error::udma_status;
use memory::{
    udma_buffer, udma_pool, udma_pool_alloc, udma_pool_create, udma_pool_destroy, udma_pool_free,
    udma_pool_options,
};
use queue::{
    udma_completion, udma_op, udma_opcode, udma_queue, udma_queue_create, udma_queue_destroy,
    udma_queue_options, udma_queue_submit, udma_queue_wait,
};

const KIB4: u64 = 4 << 10;
const OP_BYTES: u64 = 64;
const POOL_BYTES: u64 = 4 << 20;
const DEPTH: u32 = 64;

/// Checks a status, as a C caller does after every call: inline, with the failure out of
/// line (as `expect` is on the Rust side), so the check costs both sides the same.
#[inline(always)]
fn ok(status: udma_status, what: &str) {
    if status != udma_status::UDMA_OK {
        failed(status, what);
    }
}

#[cold]
#[inline(never)]
fn failed(status: udma_status, what: &str) {
    // SAFETY: `udma_last_error` returns a NUL-terminated string valid until the next failing
    // call on this thread; it is copied at once.
    let message = unsafe { std::ffi::CStr::from_ptr(error::udma_last_error()) };
    panic!("{what}: {status:?}: {}", message.to_string_lossy());
}

/// One zero-cost loopback device with a pool and a queue for each side.
struct Rig {
    device: *mut udma_device,
    c_pool: *mut udma_pool,
    c_queue: *mut udma_queue,
    /// The C side's buffer for transfers (on the host between iterations).
    c_buffer: *mut udma_buffer,
    rust_pool: Arc<Pool>,
    rust_queue: loopback::Queue<OwnedBuffer>,
    /// The Rust side's buffer for transfers (in the queue during an iteration).
    rust_buffer: Option<OwnedBuffer>,
}

impl Rig {
    fn new() -> Rig {
        let options = udma_loopback_options {
            size: size_of::<udma_loopback_options>(),
            cost_model: udma_cost_model::UDMA_COST_ZERO as u32,
            memory_bytes: 1 << 20,
            queues: 2,
            ..udma_loopback_options::default()
        };
        let mut device = null_mut();
        // SAFETY: `options` is a whole `udma_loopback_options`; `device` a writable pointer.
        ok(
            unsafe { udma_device_open_loopback(&options, &mut device) },
            "udma_device_open_loopback",
        );
        let pool_options = udma_pool_options {
            size: size_of::<udma_pool_options>(),
            bytes: POOL_BYTES,
            ..udma_pool_options::default()
        };
        let mut c_pool = null_mut();
        // SAFETY: as above.
        ok(
            unsafe { udma_pool_create(device, &pool_options, &mut c_pool) },
            "udma_pool_create",
        );
        let queue_options = udma_queue_options {
            size: size_of::<udma_queue_options>(),
            depth: DEPTH,
            index: 0,
            ..udma_queue_options::default()
        };
        let mut c_queue = null_mut();
        // SAFETY: as above.
        ok(
            unsafe { udma_queue_create(device, &queue_options, &mut c_queue) },
            "udma_queue_create",
        );
        let mut c_buffer = null_mut();
        // SAFETY: a writable pointer.
        ok(
            unsafe { udma_pool_alloc(c_pool, KIB4, &mut c_buffer) },
            "udma_pool_alloc",
        );
        // The Rust side on the same device (its runtime, as the C handle holds it).
        let runtime = device::device(device)
            .expect("the device handle")
            .runtime
            .clone();
        let rust_pool = runtime
            .pool(POOL_BYTES as usize, PageSize::Base)
            .expect("a pool");
        let rust_queue = runtime
            .queue_on(
                ring::Config::new(DEPTH).with_id(1),
                Wait::Interrupt,
                loopback::Unit::Copy,
            )
            .expect("queue 1");
        let rust_buffer = Some(rust_pool.alloc_owned(KIB4 as usize).expect("a buffer"));
        Rig {
            device,
            c_pool,
            c_queue,
            c_buffer,
            rust_pool,
            rust_queue,
            rust_buffer,
        }
    }

    #[inline(never)]
    fn c_alloc_free(&self) {
        let mut buffer = null_mut();
        // SAFETY: `buffer` is a writable pointer; the pool handle is live.
        let status = unsafe { udma_pool_alloc(self.c_pool, KIB4, &mut buffer) };
        ok(black_box(status), "udma_pool_alloc");
        // SAFETY: handles only (checked, never dereferenced).
        ok(
            unsafe { udma_pool_free(self.c_pool, black_box(buffer)) },
            "udma_pool_free",
        );
    }

    #[inline(never)]
    fn rust_alloc_free_owned(&self) {
        let buffer = self.rust_pool.alloc_owned(KIB4 as usize).expect("a buffer");
        drop(black_box(buffer));
    }

    #[inline(never)]
    fn rust_alloc_free_borrowed(&self) {
        let buffer = self.rust_pool.alloc(KIB4 as usize).expect("a buffer");
        drop(black_box(buffer));
    }

    fn c_submit_complete(&self) {
        let op = udma_op {
            size: size_of::<udma_op>(),
            opcode: udma_opcode::UDMA_OP_TO_DEVICE as u32,
            buffer: self.c_buffer,
            len: OP_BYTES,
            user_data: 7,
            ..udma_op::default()
        };
        // SAFETY: `op` is a whole `udma_op`.
        ok(
            unsafe { udma_queue_submit(self.c_queue, &op) },
            "udma_queue_submit",
        );
        let mut done = udma_completion {
            size: size_of::<udma_completion>(),
            user_data: 0,
            buffer: null_mut(),
            result: 0,
            status: 0,
            command_id: 0,
        };
        // SAFETY: `done` is a whole, writable `udma_completion`.
        ok(
            unsafe { udma_queue_wait(self.c_queue, UDMA_TIMEOUT_INFINITE, &mut done) },
            "udma_queue_wait",
        );
        assert!(done.status == 0 && done.buffer == self.c_buffer && done.user_data == 7);
    }

    fn rust_submit_complete(&mut self) {
        let buffer = self.rust_buffer.take().expect("on the host");
        let command = Descriptor::to_device(buffer.iova(), DeviceOffset(0), OP_BYTES).build();
        if self.rust_queue.push(command, buffer).is_err() {
            panic!("push refused");
        }
        self.rust_queue.flush().expect("doorbell");
        let done = self.rust_queue.wait(None).expect("a completion");
        assert!(done.entry.is_success());
        self.rust_buffer = Some(done.payload);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // SAFETY: handles only.
        unsafe {
            ok(udma_queue_destroy(self.c_queue), "udma_queue_destroy");
            ok(udma_pool_free(self.c_pool, self.c_buffer), "udma_pool_free");
            ok(udma_pool_destroy(self.c_pool), "udma_pool_destroy");
            ok(udma_device_close(self.device), "udma_device_close");
        }
    }
}

fn alloc_free(c: &mut Criterion, rig: &Rig) {
    let mut group = c.benchmark_group("alloc_free/4KiB");
    group.bench_function("c", |b| b.iter(|| rig.c_alloc_free()));
    group.bench_function("rust", |b| b.iter(|| rig.rust_alloc_free_owned()));
    group.bench_function("rust_borrowed", |b| {
        b.iter(|| rig.rust_alloc_free_borrowed())
    });
    group.finish();
}

fn submit_complete(c: &mut Criterion, rig: &mut Rig) {
    let mut group = c.benchmark_group("submit_complete/64B");
    group.bench_function("c", |b| b.iter(|| rig.c_submit_complete()));
    group.bench_function("rust", |b| b.iter(|| rig.rust_submit_complete()));
    group.finish();
}

/// Nanoseconds per call of `f` over `calls` calls.
fn per_call(calls: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(calls)
}

/// The median and range of the ratios `c / rust` over `rounds` alternating rounds, with the
/// medians of each side's times.
fn ratio(
    rounds: usize,
    calls: u32,
    mut c: impl FnMut(),
    mut rust: impl FnMut(),
) -> (f64, f64, f64, f64, f64) {
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut ratios, mut cs, mut rs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        // Which side goes first alternates too: neither always follows the other.
        let (tc, tr) = if ratios.len() % 2 == 0 {
            let tc = per_call(calls, &mut c);
            (tc, per_call(calls, &mut rust))
        } else {
            let tr = per_call(calls, &mut rust);
            (per_call(calls, &mut c), tr)
        };
        ratios.push(tc / tr);
        cs.push(tc);
        rs.push(tr);
    }
    let (lo, hi) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    (
        median(&mut ratios),
        lo,
        hi,
        median(&mut cs),
        median(&mut rs),
    )
}

fn ratios(rig: &mut Rig) {
    let test = std::env::args().any(|arg| arg == "--test");
    if test {
        println!("\n(test mode: one short round each, to check the table runs; not a measurement)");
    }
    // Rounds of about 20 ms each side; one tiny round in criterion's test mode.
    let (rounds, alloc_calls, op_calls) = if test {
        (1, 100, 10)
    } else {
        (41, 200_000, 2_000)
    };
    println!("\nC API ÷ Rust API, {rounds} alternating rounds, median [min .. max] of the rounds' ratios:");
    for _ in 0..if test { 0 } else { 1000 } {
        rig.c_alloc_free();
        rig.rust_alloc_free_owned();
    }
    let (m, lo, hi, tc, tr) = ratio(
        rounds,
        alloc_calls,
        || rig.c_alloc_free(),
        || rig.rust_alloc_free_owned(),
    );
    println!(
        "  alloc_free/4KiB       {m:.2} [{lo:.2} .. {hi:.2}]  (C {tc:.1} ns, Rust owned {tr:.1} ns)"
    );
    let (m, lo, hi, _, tb) = ratio(
        rounds,
        alloc_calls,
        || rig.c_alloc_free(),
        || rig.rust_alloc_free_borrowed(),
    );
    println!("    against borrowed    {m:.2} [{lo:.2} .. {hi:.2}]  (Rust borrowed {tb:.1} ns)");
    let rig = std::cell::RefCell::new(rig);
    let (m, lo, hi, tc, tr) = ratio(
        rounds,
        op_calls,
        || rig.borrow().c_submit_complete(),
        || rig.borrow_mut().rust_submit_complete(),
    );
    println!(
        "  submit_complete/64B   {m:.2} [{lo:.2} .. {hi:.2}]  (C {:.2} µs, Rust {:.2} µs)",
        tc / 1e3,
        tr / 1e3
    );
}

fn main() {
    let mut rig = Rig::new();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
        .configure_from_args();
    alloc_free(&mut criterion, &rig);
    submit_complete(&mut criterion, &mut rig);
    criterion.final_summary();
    ratios(&mut rig);
}
