//! Asymmetric quiescence: readers that cost a store, for a remover that pays for both.
//!
//! A pool handle is read on every `udma_pool_alloc`, by any thread, and removed once, by
//! `udma_pool_destroy`. A pin (an atomic read-modify-write on the pool's slot, taken and
//! dropped by every call) made the hot path pay for the rare removal, and made every thread
//! allocating from one pool write one cache line. Here a reader writes only its own
//! thread's [`Record`]:
//!
//! ```text
//! reader                                    remover
//! enter: record.active = handle (store)     lock the slot (its state says LOCKED)
//!        light barrier                      heavy barrier
//! load the slot's state                     for every record: wait while active == handle
//! LIVE and not LOCKED: read the value       remove the value (or unlock)
//! exit:  record.active = 0 (Release)
//! ```
//!
//! The barriers make the two middle steps a Dekker handshake: either the remover sees the
//! reader's `active` (and waits until it leaves), or the reader sees LOCKED (and takes its slow
//! path, outside any section). The heavy barrier is `membarrier(MEMBARRIER_CMD_PRIVATE_
//! EXPEDITED)`, which runs a full memory barrier on every CPU running a thread of this
//! process, so the light one needs only to keep the compiler from moving the state's load
//! above the store (`compiler_fence`). Where the kernel refuses the registration, both are
//! `fence(SeqCst)` (what C++'s `asymmetric_thread_fence_light/heavy` reduce to without it),
//! and so they are under Miri.
//! Under loom both are an AcqRel read-modify-write of one word, which orders them the same
//! way in loom's model.
//!
//! Records live in a registry, one per thread that ever read (reused once their thread
//! ends, never freed). The remover holds the registry's mutex from the heavy barrier to the
//! end of its scan, so a thread that registers later acquires it after the lock and sees
//! LOCKED, and one registered earlier is in the scan.

use crate::error::Fail;
use crate::slots::backoff;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// One thread's section: the handle value it is reading, or 0.
#[derive(Debug)]
pub(crate) struct Record {
    active: AtomicU64,
    /// A thread holds this record (cleared when it ends, so another can take it).
    owned: AtomicBool,
}

/// The records of every thread that ever read through this registry.
#[derive(Debug)]
pub(crate) struct Quiesce {
    records: Mutex<Vec<Arc<Record>>>,
    /// Loom's stand-in for both barriers (see the module docs).
    #[cfg(loom)]
    word: AtomicU64,
}

impl Quiesce {
    /// An empty registry.
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Quiesce {
        Quiesce {
            records: Mutex::new(Vec::new()),
        }
    }

    /// An empty registry.
    #[cfg(loom)]
    pub(crate) fn new() -> Quiesce {
        Quiesce {
            records: Mutex::new(Vec::new()),
            word: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> crate::sync::MutexGuard<'_, Vec<Arc<Record>>> {
        // A panic while it was held left it consistent: each change is one push or store.
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A record for the calling thread: a free one, or a new one. Give it back with
    /// [`Quiesce::release`] when the thread ends.
    pub(crate) fn register(&self) -> Arc<Record> {
        barriers::init();
        let mut records = self.lock();
        for r in records.iter() {
            // Acquire: pairs with `release`'s Release store (which takes no mutex), so the
            // old thread's last `exit` happens before our first `enter`.
            if r.owned
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Arc::clone(r);
            }
        }
        let r = Arc::new(Record {
            active: AtomicU64::new(0),
            owned: AtomicBool::new(true),
        });
        records.push(Arc::clone(&r));
        r
    }

    /// Gives back a record whose thread ends (outside any section).
    pub(crate) fn release(record: &Record) {
        // Release: this thread's last `exit` happens before the next owner's `register`
        // (Acquire CAS), so the record is never seen active on behalf of two threads.
        record.owned.store(false, Ordering::Release);
    }

    /// Enters a section reading the handle `value` (not 0): from here until [`Quiesce::exit`],
    /// a remover that locked the handle's slot waits in [`Quiesce::wait_out`] before touching
    /// its value. Load the slot's state after this, and read the value only if that load saw
    /// it live and unlocked.
    #[inline(always)]
    pub(crate) fn enter(&self, record: &Record, value: u64) {
        debug_assert_ne!(value, 0);
        // Relaxed: the light barrier below (with the remover's heavy one) orders this store
        // before our load of the slot's state, as a SeqCst fence pair would.
        record.active.store(value, Ordering::Relaxed);
        self.light();
    }

    /// Leaves the section.
    #[inline(always)]
    pub(crate) fn exit(record: &Record) {
        // Release: every read of the value in the section happens before the remover's
        // Acquire load of 0 in `wait_out`, and so before it removes the value.
        record.active.store(0, Ordering::Release);
    }

    /// Waits until no thread is inside a section for `value` that began before the slot was
    /// locked. Call it holding the slot's lock; sections entered after it see LOCKED.
    ///
    /// # Errors
    /// `UDMA_ERR_INTERNAL` if the kernel refuses the barrier it accepted at registration.
    pub(crate) fn wait_out(&self, value: u64) -> Result<(), Fail> {
        let records = self.lock();
        self.heavy()?;
        for r in records.iter() {
            let mut spins = 0u32;
            // Acquire: pairs with `exit`'s Release (see there).
            while r.active.load(Ordering::Acquire) == value {
                backoff(&mut spins);
            }
        }
        Ok(())
    }

    #[cfg(not(loom))]
    #[inline(always)]
    fn light(&self) {
        barriers::light();
    }

    #[cfg(not(loom))]
    fn heavy(&self) -> Result<(), Fail> {
        barriers::heavy()
    }

    #[cfg(loom)]
    fn light(&self) {
        self.word.fetch_add(1, Ordering::AcqRel);
    }

    #[cfg(loom)]
    #[allow(clippy::unnecessary_wraps)]
    fn heavy(&self) -> Result<(), Fail> {
        self.word.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// The process's barrier pair, chosen once (see the module docs).
mod barriers {
    use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};
    use std::sync::Once;

    use crate::error::{udma_status, Fail};

    /// `membarrier(2)` commands (linux/membarrier.h).
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    const UNSET: u8 = 0;
    const MEMBARRIER: u8 = 1;
    const FENCES: u8 = 2;

    /// Which pair is in use: set once, by `init`, before the first record exists (so before
    /// any reader's light barrier).
    static MODE: AtomicU8 = AtomicU8::new(UNSET);
    static INIT: Once = Once::new();

    fn membarrier(cmd: libc::c_int) -> std::io::Result<()> {
        // Miri has no membarrier: it checks the fence pair, as on a kernel that refuses it.
        if cfg!(miri) {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
        }
        // SAFETY: membarrier takes two integers and touches no memory of ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Registers the process for expedited private barriers, or falls back to fences.
    pub(super) fn init() {
        INIT.call_once(|| {
            let mode = if membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED).is_ok() {
                MEMBARRIER
            } else {
                FENCES
            };
            // Relaxed: `Once` orders this store before every `call_once` that returns, and
            // every reader calls `init` (through `register`) before its first `light`.
            MODE.store(mode, Ordering::Relaxed);
        });
    }

    #[inline(always)]
    pub(super) fn light() {
        // Relaxed: set before this thread's record was made (see `init`).
        if MODE.load(Ordering::Relaxed) == MEMBARRIER {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }

    pub(super) fn heavy() -> Result<(), Fail> {
        init();
        if MODE.load(Ordering::Relaxed) == MEMBARRIER {
            membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED).map_err(|e| {
                Fail::new(
                    udma_status::UDMA_ERR_INTERNAL,
                    format!(
                        "membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after the \
                         process registered for it: {e}"
                    ),
                )
            })?;
        }
        fence(Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{model, thread, Arc, AtomicU64, Ordering, UnsafeCell};

    const LIVE: u64 = 1;
    const LOCKED: u64 = 2;

    /// A slot as the pool table has one: a state word and a value a remover takes.
    struct Slot {
        state: AtomicU64,
        value: UnsafeCell<Option<u64>>,
    }

    // SAFETY: the value is accessed only as the module's protocol allows (what loom checks).
    unsafe impl Sync for Slot {}

    fn slot() -> Slot {
        Slot {
            state: AtomicU64::new(LIVE),
            value: UnsafeCell::new(Some(7)),
        }
    }

    /// A reader's whole section: the value if the slot was live and unlocked.
    fn read(q: &Quiesce, record: &Record, s: &Slot) -> Option<u64> {
        q.enter(record, 42);
        let seen = if s.state.load(Ordering::Acquire) == LIVE {
            // SAFETY: inside a section that saw the slot live and unlocked: the remover
            // waits for our exit before it writes the value.
            Some(
                s.value
                    .with(|v| unsafe { (*v).expect("a live slot holds a value") }),
            )
        } else {
            None
        };
        Quiesce::exit(record);
        seen
    }

    /// The remover: locks, waits readers out, takes the value.
    fn remove(q: &Quiesce, s: &Slot) -> Option<u64> {
        s.state.store(LIVE | LOCKED, Ordering::Relaxed);
        // The real remover locks with an Acquire CAS; loom's barrier word orders the rest.
        q.wait_out(42).expect("barrier");
        // SAFETY: locked and waited out: no reader is inside, and later ones see LOCKED.
        let v = s.value.with_mut(|v| unsafe { (*v).take() });
        s.state.store(0, Ordering::Release);
        v
    }

    #[cfg(loom)]
    fn bounded(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.check(f);
    }

    #[cfg(not(loom))]
    fn bounded(f: impl Fn() + Sync + Send + 'static) {
        model(f);
    }

    #[test]
    fn a_remover_waits_out_a_reader_inside_and_a_reader_after_sees_it_going() {
        model(|| {
            let q = Arc::new(Quiesce::new());
            let s = Arc::new(slot());
            let (q2, s2) = (Arc::clone(&q), Arc::clone(&s));
            let reader = thread::spawn(move || {
                let record = q2.register();
                let first = read(&q2, &record, &s2);
                let second = read(&q2, &record, &s2);
                Quiesce::release(&record);
                (first, second)
            });
            let taken = remove(&q, &s);
            let (first, second) = reader.join().expect("no panic");
            assert_eq!(taken, Some(7));
            // Once a reader sees it going, later reads do too.
            assert!(
                !(first.is_none() && second.is_some()),
                "{first:?} {second:?}"
            );
            for seen in [first, second].into_iter().flatten() {
                assert_eq!(seen, 7);
            }
        });
    }

    #[test]
    fn every_record_is_waited_out() {
        bounded(|| {
            let q = Arc::new(Quiesce::new());
            let s = Arc::new(slot());
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let (q, s) = (Arc::clone(&q), Arc::clone(&s));
                    thread::spawn(move || {
                        let record = q.register();
                        let seen = read(&q, &record, &s);
                        Quiesce::release(&record);
                        seen
                    })
                })
                .collect();
            assert_eq!(remove(&q, &s), Some(7));
            for r in readers {
                let seen = r.join().expect("no panic");
                assert!(seen.is_none() || seen == Some(7), "{seen:?}");
            }
        });
    }

    #[test]
    fn records_are_reused_once_their_thread_gives_them_back() {
        model(|| {
            let q = Quiesce::new();
            let a = q.register();
            let b = q.register();
            assert!(!Arc::ptr_eq(&a, &b));
            Quiesce::release(&a);
            let c = q.register();
            assert!(Arc::ptr_eq(&a, &c));
            assert_eq!(q.lock().len(), 2);
        });
    }

    #[test]
    fn waiting_with_no_reader_inside_returns() {
        model(|| {
            let q = Quiesce::new();
            let r = q.register();
            q.enter(&r, 5);
            Quiesce::exit(&r);
            q.wait_out(5).expect("barrier");
            // A reader inside another handle's section is not waited for.
            q.enter(&r, 6);
            q.wait_out(5).expect("barrier");
            Quiesce::exit(&r);
        });
    }
}
