//! Lock-free handle slots, for the kinds on the hot path: buffers (allocated, freed and
//! submitted many times a second) and the pools they come from.
//!
//! A [`Registry`](crate::handle::Registry) takes one mutex per call; a [`Table`] takes none
//! on the hot path. Its handles are the same tagged, generation-checked keys, and every check
//! holds as before (NULL, another kind, foreign, stale, freed twice). Each slot is a state
//! word and a value:
//!
//! ```text
//! state = generation << 32 | pins << 2 | LOCKED << 1 | LIVE
//! ```
//!
//! - `LIVE`: the slot holds occupant `generation`'s value. A free slot carries the
//!   generation its next occupant gets: removing bumps it, so every copy of an old handle
//!   stops matching (until 2^32 reuses of one slot).
//! - `LOCKED`: one caller holds the slot exclusively ([`Table::lock`]); only it reads or
//!   writes the value, and it unlocks (a store) or removes the value. Other lockers wait.
//! - pins: callers that read the value shared ([`Table::pin`]). A slot with pins is not
//!   locked (its remover gets "busy"), and a locked one is not pinned, so a pinned value
//!   neither changes nor goes.
//!
//! The pool table's hot path reads without a pin, inside a quiescence section
//! ([`crate::quiesce`], [`Table::peek_ptr`]): its remover locks the slot and waits the sections
//! out before it touches the value.
//!
//! Every transition of a live slot is one compare-and-swap on its state from a value that
//! names the generation, which is the ABA defence: a slot freed and reused between a load
//! and the CAS has another generation, and the CAS fails.
//!
//! Free slot indices go to a caller's own list first (a thread's cache, for buffers), then
//! to the table's list under a mutex, in batches of [`BATCH`]; a new slot is made under that
//! mutex too. Slots live in segments of `2^B`, made when first needed and never
//! freed while the table lives, so a slot's address is stable and a lookup is one load.

use std::mem::MaybeUninit;

use crate::sync::{hint, thread, AtomicU64, UnsafeCell};

// By path, as `tests`: the fuzz targets and the benches include this file by path too.
#[path = "slots/guard.rs"]
mod guard;
#[path = "slots/local.rs"]
mod local;
#[path = "slots/lock.rs"]
mod lock;
#[path = "slots/table.rs"]
mod table;

pub(crate) use guard::{Guard, Pin};
pub(crate) use local::LocalList;
pub(crate) use table::Table;

const LIVE: u64 = 1;
const LOCKED: u64 = 2;
const PIN_SHIFT: u32 = 2;
const PIN: u64 = 1 << PIN_SHIFT;
const MAX_PINS: u64 = (1 << (32 - PIN_SHIFT)) - 1;
/// Free indices moved between a caller's list and the table's at once.
pub(crate) const BATCH: usize = 32;

fn generation(state: u64) -> u32 {
    (state >> 32) as u32
}

fn pins(state: u64) -> u64 {
    (state >> PIN_SHIFT) & MAX_PINS
}

/// The state of a live, unlocked, unpinned slot of occupant `generation`.
fn live(generation: u32) -> u64 {
    u64::from(generation) << 32 | LIVE
}

/// The state of a free slot whose next occupant gets `generation`.
fn free(generation: u32) -> u64 {
    u64::from(generation) << 32
}

/// The generation after `g` (never 0: a handle's value is never its tag alone).
fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1).max(1)
}

/// One cache line a slot (for buffers: the state and two words of value), so that filling a
/// slot never writes across two lines, and threads using neighbouring slots do not share one.
#[repr(align(64))]
struct Slot<T> {
    state: AtomicU64,
    /// Initialised exactly while `state` has LIVE (so a fill can write it field by field,
    /// in place, and nothing reads a tag to know it is there).
    value: UnsafeCell<MaybeUninit<T>>,
}

/// Waits a little for a locked slot: spins, then lets other threads run.
pub(crate) fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

// By path: the fuzz targets and the benches include this file by path too.
#[cfg(test)]
#[path = "slots/tests.rs"]
mod tests;
