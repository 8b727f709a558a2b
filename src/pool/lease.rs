//! Who frees a pool's state: its handle, or the last [`OwnedBuffer`](super::OwnedBuffer) out.
//!
//! An owned buffer has no lifetime, so it must keep the pool's state (the `Core`: arena,
//! mapping, caches) alive after the [`Pool`](super::Pool) handle is dropped. A reference count
//! per buffer would do it at the price of an atomic read-modify-write on a shared cache line
//! per allocation and per free (1.3x DPDK's get + put on one thread, 1.8x across cores, where
//! a borrowed buffer was 0.75x). Here the count costs what the thread cache already does:
//!
//! - **Leases counted per thread.** An owned allocation adds one to the count in its
//!   thread's cache of the buffer's class, an owned free takes one from the freeing thread's:
//!   the count is the high half of the magazine's length word (`ClassCache::len`), so it
//!   rides in the store of the length the pop or push makes anyway, on a line only that
//!   thread writes. Allocations on the slow path count there too (a load and a store), and
//!   threads without a slot use one shared atomic (`direct`), on their slow path anyway. The
//!   buffers out are the sum, modulo 2^32 (exact: a pool has fewer blocks), which only the
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
//!   no:  push, its count -1 in the same    wait while sections (Acquire)
//!        store; slot.busy = 0 (Release)    out = sum of the caches' counts + direct
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
//! **What it costs.** On one thread, in `benches/pool.rs`'s tightest loop (get + put of
//! 4 KiB, the same run), an owned buffer takes 1.05x a borrowed one: the free's busy mark (a
//! store of a constant before the check and one after) and its retirement check (a load and
//! a branch); the counts cost no instruction of their own. How it got there, measured on the
//! development VM: with the counts in the slot's busy word (an allocation's load and store of
//! it, the free's load of it to mark itself busy and its store of the count and the cleared
//! mark), 1.16x (our reading: one more chain of stores and loads, through that word, beside
//! the magazine's); in a word of each class cache, still a load and a store per allocation
//! and per free, 1.12x (tried, not kept); folded into the length word, 1.05x. Builds with
//! parts taken out (wrong, not kept) put the check alone at 1.03x: what is left above it is
//! the busy mark's two stores. A free with no store before its check would need the count
//! given back last, after everything the free does to the pool, so that a handle seeing it
//! may free the state at once: the waiting-allocations word the free reads after its push
//! (`cache` module), which is in the pool's metadata (for a shared pool in the shared
//! mapping), would have to move where freeing the state cannot take it, and whoever sees
//! `retired` after giving its count back would sum the counts again itself (with its own
//! heavy barrier), the state freed by the one whose sum reaches zero.
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
        mine.enter_owned();
        let done = if self.is_retired() { None } else { live(mine) };
        mine.leave_owned();
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

    /// The handle's drop: retires the pool (whose slots have `classes` classes) and returns
    /// whether the caller frees the state now (no owned buffer out). Otherwise the free that
    /// returns the last one does ([`Leases::settle`]).
    pub(crate) fn retire(&self, slots: &Slots, classes: usize) -> bool {
        // SeqCst, then the heavy barrier: every owned free either has its busy mark visible
        // to the loads below, or sees this store (see the module docs).
        self.retired.store(true, Ordering::SeqCst);
        asymmetric::heavy();
        for slot in slots.iter() {
            while slot.is_freeing_owned() {
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
        // The caches count modulo 2^32, as does the sum: exact, as fewer blocks than that are
        // out.
        let in_slots = slots
            .iter()
            .fold(0u32, |sum, slot| sum.wrapping_add(slot.owned_out(classes)));
        // Relaxed: ordered by the waits above. Truncated: modulo 2^32 as well.
        let direct = self.direct.load(Ordering::Relaxed) as u32;
        let out = u64::from(in_slots.wrapping_add(direct));
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
