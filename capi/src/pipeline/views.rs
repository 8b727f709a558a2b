//! Where the frame views live: the `udma_frame_input` / `udma_frame_output` a callback gets
//! points into a [`Block`], memory the library allocates once and never frees, so a pointer
//! a program keeps past its callback (or past its thread) still points to memory that is
//! there. Each thread holds one block per callback nesting depth while it lives, and gives
//! them back to a process-wide spare list when it exits, for the next thread to take.
//!
//! The library never reads a view through a pointer into a block: the running callback's
//! own view is recognised by its address (the thread's record, in `callback`), and any other
//! pointer into a block ([`is_library_view`]) is refused unread. That is why no atomics are
//! needed here: a block's contents are only ever touched by the thread that holds it (and by
//! the C callback that thread runs).

use std::cell::{RefCell, UnsafeCell};
use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use super::callback::{udma_frame_input, udma_frame_output};

/// One nesting depth's views of one thread. Leaked (`&'static`), never freed.
#[repr(C)]
pub(super) struct Block {
    /// A fill or preprocess callback's view.
    pub(super) input: UnsafeCell<udma_frame_input>,
    /// A result or postprocess callback's view.
    pub(super) output: UnsafeCell<udma_frame_output>,
}

// SAFETY: a block's contents are read and written only by the thread that holds it: a thread
// takes a block out of `BLOCKS.spare` (under its mutex) into its own `THREAD_BLOCKS` or a
// `Lease::Spare`, and puts it back under the same mutex, which orders the previous holder's
// writes before the next holder's. Other threads only compare addresses with a block's
// (`is_library_view`), never dereference one. So sharing `&Block` between threads (which is
// what keeping `&'static Block` in a static needs) makes no concurrent access to its cells.
unsafe impl Sync for Block {}

impl Block {
    /// A new block for the process, recorded in `all` (the caller holds `BLOCKS`' lock).
    fn leak(all: &mut BTreeSet<usize>) -> &'static Block {
        let block: &'static Block = Box::leak(Box::new(Block {
            input: UnsafeCell::new(udma_frame_input {
                size: 0,
                frame: 0,
                len: 0,
                token: 0,
            }),
            output: UnsafeCell::new(udma_frame_output {
                size: 0,
                frame: 0,
                len: 0,
                latency_ns: 0,
                fault: 0,
                status: 0,
                step: 0,
                token: 0,
            }),
        }));
        all.insert(std::ptr::from_ref(block).addr());
        block
    }
}

/// Every block of the process, and those no thread holds.
struct Blocks {
    /// The address of every block ever made (none is freed), for `is_library_view`.
    all: BTreeSet<usize>,
    /// Blocks given back by threads that exited.
    spare: Vec<&'static Block>,
}

static BLOCKS: Mutex<Blocks> = Mutex::new(Blocks {
    all: BTreeSet::new(),
    spare: Vec::new(),
});

fn blocks() -> std::sync::MutexGuard<'static, Blocks> {
    // A panic while holding the lock leaves both fields consistent (each change is one
    // insert or one push/pop), so a poisoned lock is used as it is.
    BLOCKS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spare block, or a new one.
fn take() -> &'static Block {
    let mut b = blocks();
    match b.spare.pop() {
        Some(block) => block,
        None => Block::leak(&mut b.all),
    }
}

/// This thread's blocks, one per nesting depth (index `depth - 1`); given back to the spare
/// list when the thread exits.
struct ThreadBlocks(RefCell<Vec<&'static Block>>);

impl Drop for ThreadBlocks {
    fn drop(&mut self) {
        blocks().spare.append(self.0.get_mut());
    }
}

thread_local! {
    static THREAD_BLOCKS: ThreadBlocks = const { ThreadBlocks(RefCell::new(Vec::new())) };
}

/// The block a callback at nesting depth `depth` (1 for the outermost) uses; held until it
/// returns.
pub(super) enum Lease {
    /// One of the thread's blocks (it keeps it for its next callback at that depth).
    Thread(&'static Block),
    /// A spare block, for a callback run while the thread's storage is being torn down (from
    /// another thread-local's destructor): back to the spare list when the callback returns.
    Spare(&'static Block),
}

impl Lease {
    /// The block for a callback at `depth` (from 1) on this thread.
    pub(super) fn at(depth: u32) -> Lease {
        let index = usize::try_from(depth.saturating_sub(1)).unwrap_or(usize::MAX);
        THREAD_BLOCKS
            .try_with(|t| {
                let mut held = t.0.borrow_mut();
                // Depths go up by one, so this adds at most one block.
                while held.len() <= index {
                    held.push(take());
                }
                Lease::Thread(held[index])
            })
            .unwrap_or_else(|_| Lease::Spare(take()))
    }

    pub(super) fn block(&self) -> &'static Block {
        match self {
            Lease::Thread(block) | Lease::Spare(block) => block,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Lease::Spare(block) = *self {
            blocks().spare.push(block);
        }
    }
}

/// Whether any of the `len` bytes at `ptr` lie in a block: a view pointer the library handed
/// out (to this thread's callback or another's, now or earlier), which must not be read
/// (another thread may be writing it). Takes the blocks' lock: only a call that is not on the
/// running callback's own view gets here.
pub(super) fn is_library_view(ptr: *const u8, len: usize) -> bool {
    let start = ptr.addr();
    let end = start.saturating_add(len);
    let b = blocks();
    // The last block starting before `end` is the only one that can overlap [start, end):
    // blocks do not overlap each other, and any earlier one ends before that one starts.
    b.all
        .range(..end)
        .next_back()
        .is_some_and(|&block| block.saturating_add(std::mem::size_of::<Block>()) > start)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spare list is the process's: these tests take turns with it.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn addr(block: &'static Block) -> usize {
        std::ptr::from_ref(block).addr()
    }

    #[test]
    fn a_thread_keeps_its_block_per_depth_and_gives_them_back_when_it_exits() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let (outer, inner) = std::thread::spawn(|| {
            let outer = addr(Lease::at(1).block());
            let inner = addr(Lease::at(2).block());
            assert_ne!(outer, inner);
            assert_eq!(
                addr(Lease::at(1).block()),
                outer,
                "kept for the next callback"
            );
            (outer, inner)
        })
        .join()
        .expect("the thread ran");
        let spare: Vec<usize> = blocks().spare.iter().map(|b| addr(b)).collect();
        assert!(spare.contains(&outer) && spare.contains(&inner));
        assert!(is_library_view(std::ptr::without_provenance(outer), 1));
    }

    #[test]
    fn any_byte_of_a_block_is_a_library_view_and_nothing_else_is() {
        let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = Lease::at(1);
        let block = std::ptr::from_ref(lease.block()).cast::<u8>();
        let size = std::mem::size_of::<Block>();
        assert!(is_library_view(block, 1));
        assert!(is_library_view(
            lease.block().output.get().cast_const().cast(),
            8
        ));
        assert!(is_library_view(block.wrapping_add(size - 1), 1));
        assert!(
            is_library_view(block.wrapping_sub(4), 8),
            "overlaps its first bytes"
        );
        let local = 0u64;
        assert!(!is_library_view(std::ptr::from_ref(&local).cast(), 8));
        assert!(!is_library_view(std::ptr::null(), 8));
    }
}
