//! This thread's part of the pool and buffer tables (its free buffer slots and its quiescence
//! record, given back when the thread ends), and holding a pool for one call: inside this
//! thread's section on the fast path, pinned on the slow one.

use std::cell::{Cell, RefCell};
use std::ptr::null;
use std::sync::Arc;

use super::tables::{udma_pool, PoolEntry, BUFFERS, POOLS, SECTIONS};
use crate::error::Fail;
use crate::handle::{self, Key, Kind};
use crate::quiesce::{Quiesce, Record};
use crate::slots::{LocalList, Pin};

/// This thread's part: its free buffer slots (most allocations and frees take an index from
/// here and give one back, without the table's lock) and its quiescence record. No `Drop`, so
/// reaching it costs no check of whether the thread is ending: its [`Keeper`] gives the list
/// and the record back when it does.
struct Local {
    slots: LocalList,
    /// The record's address: null before the thread's first allocation and once it ends.
    record: Cell<*const Record>,
    /// [`FRESH`], [`KEPT`] or [`ENDED`].
    state: Cell<u8>,
}

/// No keeper registered yet: neither the list nor a record has been used.
const FRESH: u8 = 0;
/// The thread's keeper is registered: the list may hold indices.
const KEPT: u8 = 1;
/// The keeper ran (the thread is ending): the table's own list serves from now on.
const ENDED: u8 = 2;

/// Gives the thread's free slots and its record back when the thread ends.
struct Keeper {
    record: RefCell<Option<Arc<Record>>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        LOCAL.with(|l| {
            l.state.set(ENDED);
            l.record.set(null());
            BUFFERS.return_list(&l.slots);
        });
        if let Some(record) = self.record.get_mut().take() {
            Quiesce::release(&record);
        }
    }
}

thread_local! {
    static LOCAL: Local = const {
        Local {
            slots: LocalList::new(),
            record: Cell::new(null()),
            state: Cell::new(FRESH),
        }
    };
    static KEEPER: Keeper = const { Keeper { record: RefCell::new(None) } };
}

impl Local {
    /// This thread's free slots: `None` once the thread is ending.
    #[inline(always)]
    fn list(&self) -> Option<&LocalList> {
        if self.state.get() == KEPT {
            Some(&self.slots)
        } else {
            self.keep()
        }
    }

    /// Registers the keeper (its first use does) unless the thread is ending.
    #[cold]
    #[inline(never)]
    fn keep(&self) -> Option<&LocalList> {
        if self.state.get() == FRESH {
            let state = if KEEPER.try_with(|_| ()).is_ok() {
                KEPT
            } else {
                ENDED
            };
            self.state.set(state);
        }
        (self.state.get() == KEPT).then_some(&self.slots)
    }

    /// This thread's quiescence record, registered at its first use; `None` once the thread
    /// is ending. While it is `Some`, [`Local::slots`] is the thread's list too.
    #[inline(always)]
    fn record(&self) -> Option<&'static Record> {
        let r = self.record.get();
        if r.is_null() {
            return self.register();
        }
        // SAFETY: non-null: the address of the record the keeper holds (an `Arc`, so the
        // record does not move), which lives as long as the registry (never freed: the
        // registry keeps a clone); nulled when the keeper gives it back.
        Some(unsafe { &*r })
    }

    #[cold]
    #[inline(never)]
    fn register(&self) -> Option<&'static Record> {
        self.keep()?;
        let r = KEEPER
            .try_with(|k| {
                let mut slot = k.record.try_borrow_mut().ok()?;
                let record = slot.get_or_insert_with(|| SECTIONS.register());
                Some(Arc::as_ptr(record))
            })
            .ok()
            .flatten()?;
        self.record.set(r);
        // SAFETY: as in `record`.
        Some(unsafe { &*r })
    }
}

/// A pool held for one call: read inside this thread's section (left when this is dropped,
/// a panic's unwinding included), or pinned (the slow path). Not `Send` (its raw pointers):
/// it holds this thread's section and free-slot list.
pub(super) struct Held {
    pub(super) key: Key,
    entry: *const PoolEntry,
    /// This thread's free buffer slots, or null (the table's own list serves).
    local: *const LocalList,
    section: Option<&'static Record>,
    _pin: Option<Pin<'static, PoolEntry>>,
}

impl Held {
    /// The pool's entry.
    #[inline(always)]
    pub(super) fn entry(&self) -> &PoolEntry {
        // SAFETY: read inside the section `self` holds (left only when it drops; the entry's
        // remover waits for that) or pinned by `self._pin`; either way the entry stays as
        // long as `self`.
        unsafe { &*self.entry }
    }

    /// This thread's free buffer slots, if it may use them.
    #[inline(always)]
    pub(super) fn local(&self) -> Option<&LocalList> {
        // SAFETY: null, or this thread's list, which lives as long as the thread (its
        // thread-local has no destructor), so longer than this call's `Held`.
        unsafe { self.local.as_ref() }
    }
}

impl Drop for Held {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(record) = self.section {
            Quiesce::exit(record);
        }
    }
}

/// Holds the live pool `ptr` names for one call: inside a section on the fast path; pinned,
/// after waiting for a destroy in progress to decide, on the slow one (a thread being torn
/// down, a pool whose slot is locked, a bad handle).
#[inline(always)]
pub(super) fn hold_pool(ptr: *const udma_pool) -> Result<Held, Fail> {
    let key = handle::decode(Kind::Pool, ptr)?;
    let value = ptr.addr() as u64;
    // (`try_with`, not `with`: the same for a thread-local without `Drop`, but inlined.)
    let fast = LOCAL.try_with(|l| {
        let record = l.record()?;
        SECTIONS.enter(record, value);
        // SAFETY: inside the section for this pool's handle value, which the `Held` made
        // here leaves when it drops, after its last read of the entry; `udma_pool_destroy`
        // locks the pool's slot and waits the sections out before it removes the entry.
        match unsafe { POOLS.peek_ptr(key) } {
            Some(entry) => Some(Held {
                key,
                entry,
                local: &l.slots,
                section: Some(record),
                _pin: None,
            }),
            None => {
                Quiesce::exit(record);
                None
            }
        }
    });
    match fast {
        Ok(Some(held)) => Ok(held),
        _ => hold_pool_slow(key, value),
    }
}

#[cold]
#[inline(never)]
fn hold_pool_slow(key: Key, value: u64) -> Result<Held, Fail> {
    // A destroy in progress holds the slot locked: it either removes the pool (the pin then
    // fails: stale) or gives up (the pin succeeds).
    let pin = POOLS.pin_unlocked(key, value)?;
    let entry = pin.with(std::ptr::from_ref);
    Ok(Held {
        key,
        entry,
        local: null(),
        section: None,
        _pin: Some(pin),
    })
}

/// Runs `f` with this thread's free buffer slots (none while the thread is being torn down:
/// then the table's own list serves).
#[inline(always)]
pub(super) fn with_local<R>(f: impl FnOnce(Option<&LocalList>) -> R) -> R {
    let mut f = Some(f);
    match LOCAL.try_with(|l| (f.take().expect("taken once"))(l.list())) {
        Ok(done) => done,
        Err(_) => (f.take().expect("not taken"))(None),
    }
}
