//! Who frees a pool's state: its handle, or the last [`OwnedBuffer`](super::OwnedBuffer) out.
//!
//! An owned buffer has no lifetime, so it must keep the pool's state (the `Core`: arena,
//! mapping, caches) alive after the [`Pool`](super::Pool) handle is dropped. A reference count
//! per buffer would do it at the price of an atomic read-modify-write on a shared cache line
//! per allocation and per free (1.3x DPDK's get + put on one thread, 1.8x across cores, where
//! a borrowed buffer was 0.75x). Here the count costs what the thread cache already does:
//!
//! - **Leases counted per thread.** An owned allocation adds one to its thread's cache slot
//!   (`Slot::owned`), an owned free takes one from the freeing thread's slot: a plain load and
//!   store on a line only that thread writes (the same word carries the free's busy mark, so
//!   the free's count costs no store of its own). Threads without a slot use one shared atomic
//!   (`direct`), on their slow path anyway. The buffers out are the sum, which only the
//!   handle's drop ever takes.
//! - **Retirement.** The handle's drop (`retire`) raises `retired`, runs a heavy barrier, waits
//!   for the owned frees under way, sums the counts, and adds the sum to `remaining`. A free
//!   that sees `retired` puts its block back on the shared level and takes one from
//!   `remaining`; whoever brings `remaining` to zero (the handle with nothing out, or the last
//!   such free) frees the state.
//!
//! The race between the two is a Dekker handshake with asymmetric barriers, as in the pool's
//! reclaim and the C API's quiescence:
//!
//! ```text
//! owned free (frequent)                    handle drop (once)
//! slot.busy = 1 (store)                    retired = true (store)
//! light barrier (compiler only)            heavy barrier (membarrier: a fence on every CPU)
//! retired? (load)                          wait while any slot.busy (Acquire)
//!   no:  free as usual; slot.owned -= 1    wait while sections (Acquire)
//!        and slot.busy = 0 (Release)       out = sum of slot.owned + direct
//!   yes: slot.busy = 0, then the slow path remaining += out (AcqRel): zero -> free the state
//! ```
//!
//! Either the handle sees the slot busy (and waits for the free to finish, whose count it then
//! reads), or the free sees `retired` (and counts itself out of `remaining` instead). A free
//! without a slot of its own does the same with `sections`, an atomic it increments (then a
//! full fence) before its check and decrements (Release) after. `remaining` starts at zero and frees that
//! see `retired` may take from it before the handle adds the sum: it goes below zero
//! (wrapping), never to zero from above before the sum is in, so exactly one party sees it
//! reach zero. The AcqRel read-modify-writes order every free's use of the state before the
//! party that frees it.
//!
//! **What it costs, and what less would take.** On one thread, in `benches/pool.rs`'s tightest
//! loop (get + put of 4 KiB, the same run), an owned buffer takes 1.16x a borrowed one: the
//! allocation's count (one add on the slot), and the free's count, busy mark and retirement
//! check. Measured by taking parts out of a build that is then wrong (not kept): without the
//! busy store 1.10x; without the busy store and the check, the counts alone, 1.08x; without
//! the counts, the busy mark and the check alone, 1.07x; with the check alone, 1.03x. So no
//! single part is what keeps it above 1.05x, and taking one out does not bring it there; the
//! check alone is what the two changes below together would leave. Cheaper would need both of
//! - the count folded into a word the magazine writes anyway (its length: a pop that subtracts
//!   one from the length and adds one to an owned count in the same word's other half costs
//!   what a borrowed pop does), and
//! - a free with no store before its check: the count given back last, after everything the
//!   free does to the pool, so that a handle seeing it may free the state at once. The free's
//!   last read of the pool is the waiting-allocations word after its push (`cache` module),
//!   which is in the pool's metadata (for a shared pool in the shared mapping); it would have
//!   to move where the state's freeing cannot take it (the thread's own slot), and whoever
//!   sees `retired` after giving its count back would have to sum the counts again itself
//!   (with its own heavy barrier), the state freed by the one whose sum reaches zero. A
//!   restartable sequence (`rseq`, with `membarrier`'s RSEQ command on the handle's side) is
//!   the other way to a free with no store before its check.
//!
//! Borrowed buffers need none of this: their borrows end before the handle's drop. A buffer
//! forgotten (`mem::forget`) never comes back: a forgotten owned buffer keeps the state alive
//! until the process exits (as a leaked reference count did); forgotten borrowed buffers make
//! the state's drop keep the mapping mapped, as before (`leaked_mappings`).

#[cfg(all(test, loom))]
use super::cache;
use super::cache::{OwnedSlot, Slots};
use crate::sync::{asymmetric, fence, thread, AtomicBool, AtomicU64, Ordering};

/// The state's retirement and the leases counted outside the thread caches (see the module
/// docs).
#[derive(Debug)]
pub(crate) struct Leases {
    /// Raised once, by the handle's drop.
    retired: AtomicBool,
    /// Owned frees under way on the slow path (a thread without a slot of its own).
    sections: AtomicU64,
    /// Owned buffers allocated minus freed by threads without a cache slot (wrapping).
    direct: AtomicU64,
    /// After retirement: owned buffers still out, less those freed since (wrapping).
    remaining: AtomicU64,
}

impl Leases {
    /// A live pool's: not retired, nothing out.
    pub(crate) fn new() -> Self {
        Self {
            retired: AtomicBool::new(false),
            sections: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            remaining: AtomicU64::new(0),
        }
    }

    /// Whether the handle is gone. Read by an owned free after marking its slot busy and a
    /// light barrier ([`OwnedSlot::enter_owned`]).
    #[inline(always)]
    fn is_retired(&self) -> bool {
        // Relaxed: what decides is the order of this load against the slot's busy store on one
        // side and the handle's store of `retired` on the other, which the barriers give.
        self.retired.load(Ordering::Relaxed)
    }

    /// Frees an owned buffer of the pool whose arena has id `id`: the two halves below, as a
    /// pool's `OwnedBuffer` drop runs them (which splits them itself, to keep the slow half
    /// out of line). Returns whether the caller frees the pool's state now (the last owned
    /// buffer of a retired pool), which it must do after this returns, holding no reference
    /// to it.
    #[cfg(all(test, loom))]
    pub(crate) fn free(
        &self,
        id: u64,
        live: impl FnOnce(Option<OwnedSlot<'_>>),
        retired: impl FnOnce(),
    ) -> bool {
        let mut live = Some(live);
        if let Some(slot) = cache::fast_slot(id) {
            // SAFETY: as in `OwnedBuffer`'s drop: a slot of this thread's fast table.
            let mine = unsafe { OwnedSlot::new(slot.as_ref()) };
            let freed = self.free_cached(mine, |mine| live.take().map(|live| live(Some(mine))));
            if freed.is_some() {
                return false;
            }
        }
        self.free_uncached(
            || {
                if let Some(live) = live.take() {
                    live(None);
                }
            },
            retired,
        )
    }

    /// The fast half of an owned free, on this thread's slot (`mine`) of the pool: if the pool
    /// is live, runs `live`, which returns the block into `mine` as usual (`Some`) or leaves
    /// it alone (`None`: no room), and counts the lease back if it took it. Returns what
    /// `live` did, `None` as well when the pool is retired; on `None` the lease is still
    /// out, and the caller runs [`Leases::free_uncached`].
    #[inline(always)]
    pub(crate) fn free_cached<R>(
        &self,
        mine: OwnedSlot<'_>,
        live: impl FnOnce(OwnedSlot<'_>) -> Option<R>,
    ) -> Option<R> {
        let word = mine.enter_owned();
        let done = if self.is_retired() { None } else { live(mine) };
        mine.leave_owned(word, done.is_some());
        done
    }

    /// The slow half of an owned free, without this thread's slot at hand or of a retired
    /// pool: `live` returns the block as usual while the pool has a handle; once it is
    /// retired, `retired` puts it back on the shared level (no thread cache) and the free
    /// counts itself out. Returns whether the caller frees the pool's state now (the last
    /// owned buffer of a retired pool), which it must do after this returns, holding no
    /// reference to it.
    pub(crate) fn free_uncached(&self, live: impl FnOnce(), retired: impl FnOnce()) -> bool {
        if self.enter() {
            self.count_direct(u64::MAX);
            live();
            self.leave();
            return false;
        }
        self.leave();
        retired();
        self.settle()
    }

    /// A slow-path owned free (no slot of its own) begins: `true` if the pool is live, and the
    /// free may use it as usual until [`Leases::leave`]. Called in either case; `leave` after.
    fn enter(&self) -> bool {
        // The store-load pair of the handshake, against `retire`'s store and heavy barrier:
        // the count, a full fence, then the flag (a fence on this side too, as this path is
        // rare; fence to fence is also what loom models exactly).
        self.sections.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fences.
        !self.retired.load(Ordering::Relaxed)
    }

    /// A slow-path owned free ends (see [`Leases::enter`]).
    fn leave(&self) {
        // Release: the free's use of the pool happens before `retire` sees the count drop.
        self.sections.fetch_sub(1, Ordering::Release);
    }

    /// Counts `delta` (wrapping: `u64::MAX` for minus one) owned buffers out by a thread with
    /// no cache slot.
    pub(crate) fn count_direct(&self, delta: u64) {
        // Relaxed: read only by `retire`, after the allocations (ordered by the handle's
        // drop) and the frees (ordered by `leave`).
        self.direct.fetch_add(delta, Ordering::Relaxed);
    }

    /// The handle's drop: retires the pool and returns whether the caller frees the state now
    /// (no owned buffer out). Otherwise the free that returns the last one does
    /// ([`Leases::settle`]).
    pub(crate) fn retire(&self, slots: &Slots) -> bool {
        // SeqCst, then the heavy barrier: every owned free either has its busy mark visible
        // to the loads below, or sees this store (see the module docs).
        self.retired.store(true, Ordering::SeqCst);
        asymmetric::heavy();
        for slot in slots.iter() {
            while slot.owned_busy() {
                thread::yield_now();
            }
        }
        // Acquire: pairs with `leave`'s Release.
        while self.sections.load(Ordering::Acquire) != 0 {
            thread::yield_now();
        }
        // Every count is final now: the allocations happened before the handle's drop, the
        // frees that did not see `retired` have ended (the waits above acquired their ends),
        // and the frees that saw it count themselves in `remaining`.
        // The slots count in twos (the low bit is their busy mark): their sum is even, and
        // half of it is their share (the total out is far below 2^63).
        let slots_twice = slots
            .iter()
            .fold(0u64, |sum, slot| sum.wrapping_add(slot.owned_twice()));
        // Relaxed: ordered by the waits above.
        let out = (slots_twice >> 1).wrapping_add(self.direct.load(Ordering::Relaxed));
        // AcqRel: acquires the frees that settled before this (their use of the state
        // happens before whoever frees it); releases this thread's, for the last free.
        let before = self.remaining.fetch_add(out, Ordering::AcqRel);
        before.wrapping_add(out) == 0
    }

    /// A free of a retired pool's owned buffer, after its block went back: whether the caller
    /// frees the state now (the last one out).
    fn settle(&self) -> bool {
        // AcqRel: as in `retire`.
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }
}
