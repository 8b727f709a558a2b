//! `Recorder::record` does not allocate once the recorder is built: a counting global
//! allocator (this test binary's own) sees no allocation over 10,000 records.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use userdma_infer::stats::{Frame, Recorder, Stage};

/// Counts allocations (and reallocations) made on a thread that has switched counting on,
/// so the test harness's own threads do not disturb the count.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees are `Counting`'s; counting touches only an atomic and a
// thread-local `Cell` with a const initialiser and no destructor, which do not allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded unchanged; `ptr` and `layout` come from this allocator, which
        // is `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn frame(n: u64) -> Frame {
    let mut f = Frame::new(n, (n % 4) as u32);
    let t = n * 1_000;
    // Durations from 1 ns to past the histograms' one-hour top, and some missing stages.
    let long = if n % 1_000 == 999 {
        u64::MAX / 2
    } else {
        n * 37 % 5_000_000
    };
    f.set(Stage::ToDevice, t, t + 100 + n % 7);
    f.set(Stage::Compute, t + 200, t + 200 + long);
    if n % 3 != 0 {
        f.set(Stage::QueueWait, t + 100, t + 200);
        f.set(Stage::ToHost, t + 300, t + 301);
    }
    if n % 5 == 0 {
        f.ok = false;
    }
    f
}

#[test]
fn record_does_not_allocate() {
    let mut recorder = Recorder::new(Instant::now(), 256);
    // The first few records, uncounted.
    for n in 0..4 {
        recorder.record(&frame(n));
    }
    let frames: Vec<Frame> = (4..10_004).map(frame).collect();

    COUNTING.with(|c| c.set(true));
    // Check the counter works: this must count.
    drop(std::hint::black_box(Vec::<u8>::with_capacity(16)));
    let probe = ALLOCATIONS.load(Ordering::Relaxed);
    for f in &frames {
        recorder.record(f);
        recorder.counters.frames += 1;
    }
    COUNTING.with(|c| c.set(false));
    let during = ALLOCATIONS.load(Ordering::Relaxed) - probe;

    assert_eq!(
        probe, 1,
        "the counting allocator did not see a known allocation"
    );
    assert_eq!(
        during, 0,
        "Recorder::record allocated {during} times over 10,000 frames"
    );
    // And the records were made: every frame, the ring wrapped, values past an hour clamped.
    assert_eq!(recorder.frames(), 10_004);
    assert_eq!(recorder.histogram(Stage::Compute).len(), 10_004);
    assert_eq!(recorder.failed(), 10_004 / 5 + 1);
    assert_eq!(
        recorder.timeline().next().map(|f| f.frame),
        Some(10_004 - 256)
    );
    assert!(recorder.histogram(Stage::Compute).max() >= 3_600_000_000_000);
}
