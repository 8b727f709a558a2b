//! Sleeping on a futex word without sleeping through a wake-up: the two flag-and-fence
//! (Dekker) handshakes of the loopback device's threads, written once over the crate's
//! [`sync`](crate::sync) atomics, so that the loom models in `loom_tests.rs` check the text
//! production runs. The device keeps the words in its register file and its units' shared
//! state; this module owns only the steps and the reasons for their orderings.
//!
//! # A waker and a sleeper ([`Words`])
//!
//! A sleeper has two words: `seq`, the futex word, which every waker increments, and
//! `sleeping`, 1 while the sleeper sleeps or is about to. The sleeper reads `seq` (Acquire)
//! *before* it looks for work; finding none, it calls [`Words::sleep`] with that value. A waker
//! publishes its work first, then calls [`Words::notify`]:
//!
//! | waker ([`Words::notify`]) | sleeper ([`Words::sleep`]) |
//! |---|---|
//! | `seq.fetch_add(1, SeqCst)` | `sleeping.store(1, SeqCst)` |
//! | `sleeping.load(SeqCst)`; if 1, wake `seq` | `seq.load(SeqCst)`; if still `seen`, wait on `seq` while it is `seen` |
//!
//! The four SeqCst operations are in one total order that agrees with each thread's program
//! order: either the waker's load of `sleeping` comes after the sleeper's store, and reads it
//! (so the waker makes the wake-up system call), or the sleeper's load of `seq` comes after the
//! increment, and reads it (so the sleeper does not sleep). The futex compares the word with
//! `seen` atomically with respect to wake-ups (the kernel does it under its hash-bucket lock),
//! so a sleeper that read `seq` before the increment is either asleep when the wake-up comes
//! or finds the word changed and returns. A waker that finds `sleeping` 0 makes no system call.
//!
//! # A unit waiting for another's progress ([`check_progress`], [`waiter_raised`])
//!
//! A thread (the waiting unit) waits for a counter that another thread (the completing unit)
//! advances, sleeping on its own [`Words`] meanwhile. Its `waiting` flag says it has such a
//! wait pending; only the waiting unit writes it.
//!
//! | completing unit | waiting unit ([`check_progress`]) |
//! |---|---|
//! | `counter.store(n, Release)` | `waiting.store(true, Relaxed)` |
//! | `fence(SeqCst)` ([`waiter_raised`]) | `fence(SeqCst)` |
//! | `waiting.load(Relaxed)`; if set, [`Words::notify`] the waiting unit | `counter.load(Acquire)`; if short, [`Words::sleep`] |
//!
//! Of the two SeqCst fences one precedes the other in the single total order. If the waiting
//! unit's fence is first, the completing unit's load (after its own fence) reads the raised
//! flag and notifies; if the completing unit's fence is first, the waiting unit's counter load
//! reads `n` or a later value. The Acquire load pairs with the Release store, so what the
//! completing unit wrote before the store (device memory) is visible to the waiting unit once
//! it sees the count. The waiting unit reads the `seq` it sleeps on before it raises its flag,
//! so an increment made after the completing unit saw the flag is never part of it.

use crate::sync::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(all(test, loom))]
mod loom_tests;

/// A futex: sleeping on a 32-bit word while it holds a value, and waking those sleepers.
pub(crate) trait Futex {
    /// Sleeps while `*word == expected`. The comparison and falling asleep are one step with
    /// respect to [`wake`](Futex::wake), as in the kernel's `FUTEX_WAIT`: a wake-up that
    /// follows a change of the word is never missed. May also return early (a signal, a
    /// spurious wake-up); callers re-check their condition.
    fn wait(&self, word: &AtomicU32, expected: u32);

    /// Wakes every thread sleeping in [`wait`](Futex::wait) on `word`.
    fn wake(&self, word: &AtomicU32);
}

/// One sleeper's wake-up words: its futex word (wake-ups so far) and its sleeping flag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Words<'a> {
    seq: &'a AtomicU32,
    sleeping: &'a AtomicU32,
}

impl<'a> Words<'a> {
    /// The sleeper whose futex word is `seq` and whose sleeping flag is `sleeping`.
    pub(crate) fn new(seq: &'a AtomicU32, sleeping: &'a AtomicU32) -> Words<'a> {
        Words { seq, sleeping }
    }

    /// Waker: tells the sleeper something changed, after the change is published, and wakes
    /// it if it sleeps or is about to.
    pub(crate) fn notify(&self, futex: &impl Futex) {
        // SeqCst (both): the waker's half of the handshake with `sleep` (see the module docs):
        // this increment and the load of `sleeping` below are in the single total order with
        // the sleeper's store of `sleeping` and load of `seq`, so one side sees the other's
        // store. The increment also releases what the waker published before it to a sleeper
        // that reads it.
        self.seq.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) != 0 {
            futex.wake(self.seq);
        }
    }

    /// Sleeper: sleeps until a [`notify`](Words::notify) after the sleeper read `seen` from the
    /// futex word (before it looked for work), unless one happened already or `stop` says not
    /// to. Only the sleeper's own thread calls this, so `sleeping` has one writer.
    pub(crate) fn sleep(&self, seen: u32, stop: impl FnOnce() -> bool, futex: &impl Futex) {
        // SeqCst (both): the sleeper's half of the handshake in `notify`. The load also
        // acquires what a waker published before an increment it reads.
        self.sleeping.store(1, Ordering::SeqCst);
        if self.seq.load(Ordering::SeqCst) == seen && !stop() {
            futex.wait(self.seq, seen);
        }
        // Relaxed: for the waker a hint only (while it reads 0 it skips the wake-up call). A
        // waker cannot read this 0 once the next `sleep` has stored 1 before its load in the
        // total order: the 0 precedes that 1 in `sleeping`'s modification order, so a SeqCst
        // load reading it comes before the 1 in the total order.
        self.sleeping.store(0, Ordering::Relaxed);
    }
}

/// Waiting unit: raises its `waiting` flag, then reads the `counter` it waits for (returned).
/// If the count is short, the caller sleeps on its [`Words`] with the futex value it read
/// before calling this; a completing unit that advances the counter afterwards sees the flag
/// ([`waiter_raised`]) and notifies it.
pub(crate) fn check_progress(waiting: &AtomicBool, counter: &AtomicU64) -> u64 {
    // Relaxed store, then fence(SeqCst): the waiting side of the handshake with
    // `waiter_raised` (the fence orders the store before the counter load below; see the
    // module docs).
    waiting.store(true, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    // Acquire: pairs with the completing unit's Release store of the counter, made after its
    // writes (to device memory): what the waiting unit does once it sees the count sees them.
    counter.load(Ordering::Acquire)
}

/// Completing unit, after its Release stores of the counters it advanced: whether the other
/// unit has a wait pending (raised in [`check_progress`]), so it must be notified.
pub(crate) fn waiter_raised(waiting: &AtomicBool) -> bool {
    // fence(SeqCst): the completing side of the handshake with `check_progress`: orders the
    // counter stores before the flag load below (see the module docs).
    fence(Ordering::SeqCst);
    // Relaxed: ordered by the fence above.
    waiting.load(Ordering::Relaxed)
}
