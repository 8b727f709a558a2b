use super::*;
use crate::error::{udma_status, Fail};
use crate::handle::{Key, Kind};
use crate::sync::{model, thread, Arc, AtomicU64, Ordering};

/// Eight slots, two a segment: small enough for loom, and growth is exercised.
/// Eight slots, two a segment.
type Small<T> = Table<T, 1, 4>;

fn table() -> Small<u64> {
    Small::new(Kind::Buffer)
}

fn busy(n: u64) -> Fail {
    Fail::new(udma_status::UDMA_ERR_BUSY, format!("{n} pins"))
}

fn take(t: &Small<u64>, k: Key) -> Option<u64> {
    t.lock(k, 0, busy).ok().map(|g| g.remove(None))
}

#[test]
fn of_two_frees_of_one_handle_one_wins_and_the_value_goes_once() {
    model(|| {
        let t = Arc::new(table());
        let k = t.insert(7, None).expect("room");
        let other = Arc::clone(&t);
        let theirs = thread::spawn(move || take(&other, k));
        let mine = take(&t, k);
        let theirs = theirs.join().expect("no panic");
        assert!(mine.is_some() != theirs.is_some(), "{mine:?} {theirs:?}");
        assert_eq!(mine.or(theirs), Some(7));
        let stale = t.lock(k, 0, busy).expect_err("freed");
        assert_eq!(stale.status, udma_status::UDMA_ERR_INVALID_HANDLE);
    });
}

/// Counts its drops, so a model can check a value goes exactly once.
struct Counted(Arc<AtomicU64>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn the_split_paths_free_once_and_a_refill_is_not_reached_by_the_old_handle() {
    // The hot paths' pieces: `claim` + `fill` (an allocation), `lock` + `discard`
    // + `release` (a free), raced by a second free of the same handle and then a
    // new occupant of the same slot.
    model(|| {
        let drops = Arc::new(AtomicU64::new(0));
        let t: Arc<Small<Counted>> = Arc::new(Small::new(Kind::Buffer));
        let local = LocalList::new();
        let index = t.claim(Some(&local)).expect("room");
        let k = t.fill(index, Counted(Arc::clone(&drops))).expect("claimed");
        let free = move |t: &Small<Counted>, local: &LocalList| {
            let g = t.lock(k, 0, busy).ok()?;
            let index = g.discard_with(drop);
            t.release(index, Some(local));
            Some(index)
        };
        let other = Arc::clone(&t);
        let theirs = thread::spawn(move || {
            let local = LocalList::new();
            free(&other, &local)
        });
        let mine = free(&t, &local);
        let theirs = theirs.join().expect("no panic");
        assert!(mine.is_some() != theirs.is_some(), "{mine:?} {theirs:?}");
        assert_eq!(drops.load(Ordering::Relaxed), 1, "the value went once");
        // A new occupant (of this slot when this thread freed it): the old handle is
        // stale, the new one live.
        let index = t.claim(Some(&local)).expect("room");
        let new = t.fill(index, Counted(Arc::clone(&drops))).expect("claimed");
        assert_ne!(new, k);
        let stale = t.lock(k, 0, busy).expect_err("freed");
        assert_eq!(stale.status, udma_status::UDMA_ERR_INVALID_HANDLE);
        let g = t.lock(new, 0, busy).expect("live");
        t.release(g.discard_with(drop), Some(&local));
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    });
}

#[test]
fn a_stale_handle_never_reaches_the_slots_next_occupant() {
    model(|| {
        let t = Arc::new(table());
        let old = t.insert(7, None).expect("room");
        let other = Arc::clone(&t);
        let reader =
            thread::spawn(move || other.lock(old, 0, busy).ok().map(|mut g| g.with(|v| *v)));
        assert_eq!(take(&t, old), Some(7));
        let new = t.insert(8, None).expect("room");
        // The freed slot is reused, under a new generation.
        assert_eq!(new.index(), old.index());
        assert_ne!(new.generation(), old.generation());
        let seen = reader.join().expect("no panic");
        assert!(seen.is_none() || seen == Some(7), "{seen:?}");
        assert_eq!(
            t.lock(new, 0, busy).ok().map(|mut g| g.with(|v| *v)),
            Some(8)
        );
    });
}

#[test]
fn a_lock_waits_for_the_holder_and_sees_its_writes() {
    model(|| {
        let t = Arc::new(table());
        let k = t.insert(1, None).expect("room");
        let other = Arc::clone(&t);
        let writer = thread::spawn(move || {
            let mut g = other.lock(k, 0, busy).expect("live");
            g.with(|v| *v += 10);
        });
        let seen = t.lock(k, 0, busy).expect("live").with(|v| {
            *v += 100;
            *v
        });
        writer.join().expect("no panic");
        assert!(seen == 101 || seen == 111, "{seen}");
        assert_eq!(take(&t, k), Some(111));
    });
}

#[test]
fn a_pinned_slot_is_not_removed_and_a_removed_one_is_not_pinned() {
    model(|| {
        let t = Arc::new(table());
        let k = t.insert(5, None).expect("room");
        let other = Arc::clone(&t);
        let reader = thread::spawn(move || other.pin(k, 0).ok().map(|p| p.with(|v| *v)));
        let removed = t.lock(k, 0, busy).map(|g| g.remove(None));
        let read = reader.join().expect("no panic");
        match removed {
            // Removed first, or after the reader's pin went: it read the value or nothing.
            Ok(v) => {
                assert_eq!(v, 5);
                assert!(read.is_none() || read == Some(5));
            }
            // The reader held its pin: the value is still there.
            Err(e) => {
                assert_eq!(e.status, udma_status::UDMA_ERR_BUSY);
                assert_eq!(read, Some(5));
                assert_eq!(take(&t, k), Some(5));
            }
        }
    });
}

#[test]
fn slots_made_on_two_threads_at_once_are_distinct_and_seen_by_both() {
    model(|| {
        let t = Arc::new(table());
        // Slot 0 made, so the next two are in the first and second segments.
        let first = t.insert(0, None).expect("room");
        let other = Arc::clone(&t);
        let theirs = thread::spawn(move || other.insert(1, None).expect("room"));
        let mine = t.insert(2, None).expect("room");
        let theirs = theirs.join().expect("no panic");
        assert_ne!(mine.index(), theirs.index());
        assert_eq!(take(&t, theirs), Some(1));
        assert_eq!(take(&t, mine), Some(2));
        assert_eq!(take(&t, first), Some(0));
    });
}

#[test]
fn a_pin_waits_for_a_locker_that_gives_up_and_fails_once_it_removes() {
    model(|| {
        let t = Arc::new(table());
        let k = t.insert(4, None).expect("room");
        let other = Arc::clone(&t);
        // A destroy that finds the slot busy and unlocks, then one that removes it.
        let locker = thread::spawn(move || {
            drop(other.lock(k, 0, busy));
            take(&other, k)
        });
        let seen = t.pin_unlocked(k, 0).ok().map(|p| p.with(|v| *v));
        let taken = locker.join().expect("no panic");
        // Pinned before the removal (which then may have found it busy), or refused as
        // stale only once it was removed; never refused while it was live.
        match (seen, taken) {
            (Some(4), Some(4)) | (Some(4), None) => {}
            (None, Some(4)) => {}
            other => panic!("{other:?}"),
        }
        if taken.is_none() {
            assert_eq!(take(&t, k), Some(4));
        }
    });
}

#[test]
fn pins_make_the_remover_busy_until_dropped() {
    model(|| {
        let t = table();
        let k = t.insert(3, None).expect("room");
        let first = t.pin(k, 0).expect("live");
        let p = t.pin(k, 0).expect("live");
        assert_eq!(p.count(), 2);
        drop(p);
        let e = t.lock(k, 0, busy).expect_err("pinned");
        assert_eq!(e.message, "1 pins");
        drop(first);
        assert_eq!(take(&t, k), Some(3));
        assert!(t.pin(k, 0).is_err());
    });
}

#[test]
fn counting_locks_each_live_slot_and_peeking_sees_only_live_unlocked_ones() {
    model(|| {
        let t = table();
        let keys: Vec<Key> = (0..5).map(|v| t.insert(v, None).expect("room")).collect();
        assert_eq!(take(&t, keys[1]), Some(1));
        assert_eq!(t.count(|v| v % 2 == 0), 3);
        assert_eq!(t.count(|_| true), 4);
        // SAFETY: no remover runs in this test.
        assert_eq!(unsafe { t.peek_ptr(keys[2]).map(|v| *v) }, Some(2));
        // SAFETY: as above.
        assert_eq!(unsafe { t.peek_ptr(keys[1]).map(|v| *v) }, None);
        let g = t.lock(keys[3], 0, busy).expect("live");
        // SAFETY: as above (the lock is ours and held by this thread only).
        assert_eq!(unsafe { t.peek_ptr(keys[3]).map(|v| *v) }, None);
        drop(g);
        assert_eq!(t.pin_unlocked(keys[3], 0).expect("live").with(|v| *v), 3);
        assert!(t.pin_unlocked(keys[1], 0).is_err());
        // SAFETY: as above.
        assert_eq!(unsafe { t.peek_ptr(keys[3]).map(|v| *v) }, Some(3));
    });
}

#[test]
fn local_lists_refill_and_spill_in_batches_and_the_table_fills_up() {
    model(|| {
        let t = table();
        let local = LocalList::new();
        let keys: Vec<Key> = (0..8)
            .map(|v| t.insert(v, Some(&local)).expect("room"))
            .collect();
        let full = t.insert(9, Some(&local)).expect_err("full");
        assert_eq!(full.status, udma_status::UDMA_ERR_EXHAUSTED);
        assert!(
            full.message.contains("8 live buffer handles"),
            "{}",
            full.message
        );
        for (v, k) in keys.into_iter().enumerate() {
            let g = t.lock(k, 0, busy).expect("live");
            assert_eq!(g.remove(Some(&local)), v as u64);
        }
        assert_eq!(local.len(), 8);
        t.return_list(&local);
        assert_eq!(local.len(), 0);
        assert_eq!(t.live().len(), 0);
        let again = t.insert(1, Some(&local)).expect("room");
        assert_eq!(t.live(), vec![again]);
    });
}

#[test]
fn keys_the_table_never_made_are_refused() {
    model(|| {
        let t = table();
        let k = t.insert(1, None).expect("room");
        let past = Key::new(100, 1);
        let e = t.lock(past, 0x1234, busy).expect_err("foreign");
        assert!(
            e.message.contains("not a live buffer handle"),
            "{}",
            e.message
        );
        let unmade = Key::new(1, 1);
        assert!(t.lock(unmade, 0, busy).is_err());
        let wrong = Key::new(k.index(), k.generation() + 1);
        assert!(t.pin(wrong, 0).is_err());
        assert_eq!(take(&t, k), Some(1));
    });
}
