//! A caller's own list of free slot indices (a thread's, for buffers), refilled from and
//! spilled to its table's list in batches.

use std::cell::Cell;

use super::BATCH;

/// A caller's own free indices (a thread's, for buffers): at most `2 * BATCH`, in cells, so
/// a thread-local list is used through a shared reference, with no borrow flag to check.
/// Not `Sync`: one thread's.
pub(crate) struct LocalList {
    len: Cell<usize>,
    items: [Cell<u32>; 2 * BATCH],
}

impl LocalList {
    /// An empty list.
    pub(crate) const fn new() -> LocalList {
        LocalList {
            len: Cell::new(0),
            items: [const { Cell::new(0) }; 2 * BATCH],
        }
    }

    /// How many indices it holds.
    pub(crate) fn len(&self) -> usize {
        self.len.get()
    }

    #[inline(always)]
    pub(super) fn pop(&self) -> Option<u32> {
        let n = self.len.get().checked_sub(1)?;
        self.len.set(n);
        self.items.get(n).map(Cell::get)
    }

    /// Pushes `index`; false (and nothing pushed) when full.
    #[inline(always)]
    pub(super) fn push(&self, index: u32) -> bool {
        let n = self.len.get();
        match self.items.get(n) {
            Some(item) => {
                item.set(index);
                self.len.set(n + 1);
                true
            }
            None => false,
        }
    }

    /// Moves the last `n` (or all) indices into `to`.
    pub(super) fn drain_into(&self, n: usize, to: &mut Vec<u32>) {
        let len = self.len.get();
        let at = len.saturating_sub(n);
        to.extend(self.items[at..len].iter().map(Cell::get));
        self.len.set(at);
    }
}
