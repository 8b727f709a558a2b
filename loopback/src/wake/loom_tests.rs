//! Loom models of the two wake-up handshakes, as the loopback device runs them: the host (or
//! the other unit) notifying a unit that is going to sleep, and a unit waiting for the other
//! unit's completed counter. Run with `RUSTFLAGS="--cfg loom" cargo test --release --lib wake::`
//! (preemptions are bounded to 3 unless `LOOM_MAX_PREEMPTIONS` says otherwise).
//!
//! The futex is [`Kernel`]: a loom mutex and condition variable, so that "sleep only while the
//! word still holds the value" is one step with respect to a wake-up, as in the kernel. A
//! sleeper that sleeps through its wake-up never returns, which loom reports as a deadlock.
//! Device memory is a loom `UnsafeCell`: reading it without a happens-before edge from its
//! writer is reported as a data race.
//!
//! Loom treats SeqCst loads and stores as AcqRel, except that a SeqCst load never reads a
//! SeqCst store older than another SeqCst store to the same word. Every word here is therefore
//! given its initial value again by a SeqCst store before the threads start (an atomic's
//! initial value is not a SeqCst store to loom), so the doorbell handshake's four SeqCst
//! accesses behave in these models as the memory model says; without that, loom reports a
//! wake-up lost that no execution allows. For the same reason each unit here sleeps at most
//! once: loom would let a waker's SeqCst load read the Relaxed clear of `sleeping` that ends a
//! first sleep even after the sleeper's SeqCst store of 1 that begins the second, which the
//! memory model forbids (the clear precedes that store in the word's modification order, so a
//! SeqCst load reading it precedes the store in the total order).
//!
//! The run loop's first read of the futex word (Acquire, before looking for work) and the
//! completing unit's Release store of its counter are the engine's own lines
//! (`Unit::run`, `Unit::burst`), repeated here with their orderings.

use super::*;
use crate::sync::{thread, Arc, Condvar, Mutex, UnsafeCell};

/// Runs `f` under loom with a default preemption bound of three.
fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// The kernel's futex for one sleeper's word: `wait` compares under the lock `wake` takes.
#[derive(Debug, Default)]
struct Kernel {
    bucket: Mutex<()>,
    sleepers: Condvar,
}

impl Futex for Kernel {
    fn wait(&self, word: &AtomicU32, expected: u32) {
        let bucket = self.bucket.lock().expect("futex lock");
        // Relaxed: the lock orders it. A waker changed the word before it takes the lock in
        // `wake`; if it took it first, this thread's lock acquires its change.
        if word.load(Ordering::Relaxed) == expected {
            drop(self.sleepers.wait(bucket).expect("futex lock"));
        }
    }

    fn wake(&self, _word: &AtomicU32) {
        let _bucket = self.bucket.lock().expect("futex lock");
        self.sleepers.notify_all();
    }
}

/// A unit's wake-up words and its futex.
#[derive(Debug)]
struct Sleeper {
    seq: AtomicU32,
    sleeping: AtomicU32,
    futex: Kernel,
}

impl Sleeper {
    fn new() -> Sleeper {
        let sleeper = Sleeper {
            seq: AtomicU32::new(0),
            sleeping: AtomicU32::new(0),
            futex: Kernel::default(),
        };
        // SeqCst: the initial values as SeqCst stores, for loom's SeqCst loads (module docs).
        sleeper.seq.store(0, Ordering::SeqCst);
        sleeper.sleeping.store(0, Ordering::SeqCst);
        sleeper
    }

    fn words(&self) -> Words<'_> {
        Words::new(&self.seq, &self.sleeping)
    }

    /// The futex value the run loop reads before it looks for work.
    fn seen(&self) -> u32 {
        // Acquire: as in `Unit::run`.
        self.seq.load(Ordering::Acquire)
    }

    fn notify(&self) {
        self.words().notify(&self.futex);
    }

    fn sleep(&self, seen: u32, stop: impl FnOnce() -> bool) {
        self.words().sleep(seen, stop, &self.futex);
    }
}

/// A unit's queue: its completed counter and the device memory its descriptors write.
#[derive(Debug)]
struct Queue {
    completed: AtomicU64,
    memory: UnsafeCell<u64>,
}

impl Queue {
    fn new() -> Queue {
        Queue {
            completed: AtomicU64::new(0),
            memory: UnsafeCell::new(0),
        }
    }

    /// Completes descriptor `n`: writes its result into device memory, then the counter.
    fn complete(&self, n: u64) {
        // SAFETY: only this queue's unit writes its memory; a reader waits for the counter
        // below (the model checks that it does).
        self.memory.with_mut(|p| unsafe { *p = result_of(n) });
        // Release: as in `Unit::burst` (`RegisterFile::set64`), after the descriptor's writes.
        self.completed.store(n, Ordering::Release);
    }

    /// Reads the device memory the `n`th descriptor wrote, checking it.
    fn read(&self, n: u64) {
        // SAFETY: called once the counter read (Acquire) reached `n`, after which the unit
        // writes no more (the model checks there is a happens-before edge).
        let value = self.memory.with(|p| unsafe { *p });
        assert_eq!(value, result_of(n), "stale device memory");
    }
}

fn result_of(n: u64) -> u64 {
    0x5eed_0000 + n
}

/// One unit of the two: its words and `waiting` flag, and its queue.
#[derive(Debug)]
struct Unit {
    sleeper: Sleeper,
    waiting: AtomicBool,
    queue: Queue,
}

impl Unit {
    fn new() -> Unit {
        Unit {
            sleeper: Sleeper::new(),
            waiting: AtomicBool::new(false),
            queue: Queue::new(),
        }
    }

    /// A `Wait` for `other`'s counter to reach `target`, as the engine runs it: the run loop
    /// reads its futex word, `check_wait` raises the flag and reads the counter, and the idle
    /// unit sleeps on the value read first. Returns once the count is reached, having read
    /// `other`'s data.
    fn wait_for(&self, other: &Unit, target: u64) {
        loop {
            let seen = self.sleeper.seen();
            if check_progress(&self.waiting, &other.queue.completed) >= target {
                other.queue.read(target);
                return;
            }
            self.sleeper.sleep(seen, || false);
        }
    }

    /// Completes descriptor `n` and wakes `other` if it waits, as `Unit::burst` and
    /// `wake_waiter` do.
    fn complete(&self, n: u64, other: &Unit) {
        self.queue.complete(n);
        if waiter_raised(&other.waiting) {
            other.sleeper.notify();
        }
    }
}

/// The host rings a doorbell (a register store, then the notify) while the unit, having found
/// nothing to do, goes to sleep: the unit never sleeps through the doorbell, and once awake it
/// sees the register.
#[test]
fn loom_doorbell_never_slept_through() {
    check(|| {
        let unit = Arc::new(Sleeper::new());
        let doorbell = Arc::new(AtomicU32::new(0));
        let engine = {
            let (unit, doorbell) = (Arc::clone(&unit), Arc::clone(&doorbell));
            thread::spawn(move || loop {
                let seen = unit.seen();
                // Acquire: a register read (`RegisterFile::get32`).
                if doorbell.load(Ordering::Acquire) == 1 {
                    return;
                }
                unit.sleep(seen, || false);
            })
        };
        // Release: a host register write (`RegisterFile::set32`), then the wake-up.
        doorbell.store(1, Ordering::Release);
        unit.notify();
        engine.join().expect("engine thread");
    });
}

/// A shutdown request (the flag, then the notify) races the unit going to sleep with the
/// shutdown check inside `sleep`: the unit always ends.
#[test]
fn loom_shutdown_ends_a_sleeping_unit() {
    check(|| {
        let unit = Arc::new(Sleeper::new());
        let shutdown = Arc::new(AtomicU32::new(0));
        let engine = {
            let (unit, shutdown) = (Arc::clone(&unit), Arc::clone(&shutdown));
            thread::spawn(move || {
                // Acquire (both): as `RegisterFile::shutting_down`.
                let stopping = || shutdown.load(Ordering::Acquire) != 0;
                while !stopping() {
                    let seen = unit.seen();
                    unit.sleep(seen, stopping);
                }
            })
        };
        // Release: as `RegisterFile::request_shutdown`, which then wakes the units.
        shutdown.store(1, Ordering::Release);
        unit.notify();
        engine.join().expect("engine thread");
    });
}

/// Unit A completes a descriptor (device memory, then its counter) while unit B's `Wait` for
/// that count checks it and goes to sleep: B is never left asleep, and it reads A's data.
#[test]
fn loom_wait_sees_completion_and_its_data() {
    check(|| {
        let a = Arc::new(Unit::new());
        let b = Arc::new(Unit::new());
        let copy = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || a.complete(1, &b))
        };
        b.wait_for(&a, 1);
        copy.join().expect("unit A");
    });
}

/// Each unit waits for the other in turn: A completes one descriptor and then waits for B's
/// first; B waits for A's first and then completes its own. Both flags, both directions of
/// the wake-up, each unit a waker and a sleeper at once.
#[test]
fn loom_units_wait_for_each_other() {
    check(|| {
        let a = Arc::new(Unit::new());
        let b = Arc::new(Unit::new());
        let copy = {
            let (a, b) = (Arc::clone(&a), Arc::clone(&b));
            thread::spawn(move || {
                a.complete(1, &b);
                a.wait_for(&b, 1);
            })
        };
        b.wait_for(&a, 1);
        b.complete(1, &a);
        copy.join().expect("unit A");
    });
}
