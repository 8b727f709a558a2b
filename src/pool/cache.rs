//! Per-thread caches: magazines of block units, one per size class, per (thread, pool).
//!
//! A pool owns a fixed set of cache [`Slot`]s (`Config::max_threads`), allocated at creation
//! as zeroed memory ([`Slots::new`]): a slot's magazines take room (memory the process
//! touches) only in the classes its thread uses, each sized by the pool's geometry the first
//! time ([`OwnedSlot::enable`]). A thread claims a slot the first time it uses a pool (one CAS) and
//! records it in its thread-local table: `WAYS` entries of `(pool id, slot)`, the pool's *home* entry being
//! `id % WAYS` (a hit elsewhere swaps the entry home). The table has two halves: [`FastTable`], what
//! the fast path reads, has no destructor, so reaching it is a plain `%fs`-relative access with
//! no "initialized?" check; [`OwnerTable`] owns the slots and has the destructor that flushes them
//! at thread exit. The fast path is that one thread-local access, one compare of the home
//! entry's id, and a pop or push on the class's magazine: plain loads and stores, no atomic
//! read-modify-write. Pool ids are never reused, so an entry left behind by a dropped pool can
//! never match a live one. With more than `WAYS` pools in use, a thread evicts (flushes) the
//! entry of the pool it used least recently at the home position.
//!
//! **Lifetimes.** The slots are shared by the pool and the threads that claimed one of them
//! through an `Arc` ([`SlotRef`]), and each slot's `state` word arbitrates who may touch the
//! pool through it:
//!
//! ```text
//!   FREE --claim (thread, CAS)--> ACTIVE --release (thread exit / eviction, CAS)--> FLUSHING
//!     ^                              |                                                  |
//!     +--------------- flushed into the pool's shared lists, store --------------------+
//!   FREE or ACTIVE --pool drop (CAS)--> GONE   (the pool drains an ACTIVE slot's magazines)
//! ```
//!
//! A thread flushes its slot back to the shared lists when it exits (`OwnerTable`'s destructor, which
//! also empties `FastTable`, so a buffer freed later in the thread's teardown goes to the shared
//! lists) or evicts the entry; the pool's `Drop` waits while a slot is `FLUSHING`, so a flushing thread
//! always flushes into a live pool, and marks every slot `GONE`, after which the thread only
//! drops its `SlotRef`. The pool can drain an `ACTIVE` slot in its `Drop` because dropping a pool
//! requires that no `&Pool` or `Buffer` borrow is alive, so no thread is inside a pool call, and
//! the end of those borrows on other threads was synchronized (join, channel) as it must be for
//! any `Sync` type. A dropped pool therefore neither leaks blocks into a cache nor leaves a
//! dangling pointer in one.
//!
//! If all slots are claimed, further threads run uncached: correct, slower (every operation goes
//! to the shared lists). That decision is remembered per thread (an entry with no slot).
//!
//! **Reclaiming.** Blocks in a thread's magazine are free, and an allocation must not fail
//! while a free block of its class is anywhere in the process, however large the caches and
//! whether their threads are busy or idle. When a class's shared level is dry, the allocating
//! thread becomes the class's *reclaimer* (`Arena::reclaim`, under the class's lock): it claims
//! every owned slot's cached blocks of the class from the bottom of the magazine (moving its
//! `top`), runs a heavy barrier (`crate::sync::asymmetric`: `membarrier`), reads each
//! magazine's length again and takes what the owner did not pop meanwhile. The owner's pop
//! reads `top` after lowering `len` and a compiler barrier; its push needs nothing (see
//! [`ClassCache`]): one load per pop is all the fast path pays, because the reclaimer's
//! barrier makes every CPU running an owner execute the fence. Blocks an owner is moving
//! between its magazine and the shared level (a refill or a flush) are in neither place for a
//! moment: the owner marks such moves ([`OwnedSlot::moving`]) and a reclaimer that finds nothing
//! looks again while one is under way. A free reads the count of waiting allocations after its
//! push ([`fast_push`]): a waiter counts itself in and then reclaims, so either it finds the
//! block in the cache or the free hands the class's blocks over.

use super::arena::Arena;
use super::geometry::{Geometry, BATCH_MAX, MAG_MAX, MAX_CLASSES};
use crate::sync::{asymmetric, thread, Arc, AtomicU32, AtomicU64, Mutex, Ordering};

/// Slot state: claimable.
const FREE: u32 = 0;
/// Slot state: owned by a thread.
const ACTIVE: u32 = 1;
/// Slot state: its thread is flushing it into the pool.
const FLUSHING: u32 = 2;
/// Slot state: the pool is gone.
const GONE: u32 = 3;

/// Entries in a thread's table: the pools a thread can use concurrently without evictions.
const WAYS: usize = 8;

mod magazine;
mod slot;
mod slots;
mod table;

pub(crate) use self::magazine::ClassCache;
pub(crate) use self::slot::{OwnedSlot, Slot};
pub(crate) use self::slots::{SlotRef, Slots};
pub(crate) use self::table::{
    fast_pop, fast_pop_array, fast_push, fast_push_array, fast_slot, release_current,
    someone_waits_after_push, with_fast_slot, with_slot,
};
