//! A lock-free LIFO of `u32` indices (a Treiber stack) whose links live in a table.
//!
//! The head is one `AtomicU64`: the index of the top node in the low 32 bits and a 32-bit tag in
//! the high bits. Nodes are indices into a table of `AtomicU32` links ([`Links`]), so the same
//! code serves the per-class free lists (nodes are 256-byte units of the arena, links a side
//! table), the depot's full and empty magazine stacks (nodes are magazine numbers, each link in
//! its magazine's first cache line, next to the count a taker reads anyway), and works
//! unchanged when head and links are in memory shared by two processes: nothing in it is a
//! pointer.
//!
//! **ABA defence.** Every successful compare-and-swap on the head increments the tag. A thread
//! that read head `(t, A)` and `next(A) = B` cannot install `B` if, in the meantime, `A` was
//! popped and pushed back (with a different `next`): the head is then `(t + k, A)` with `k >= 2`
//! and the CAS fails. The defence fails only if exactly `2^32` head updates happen between one
//! thread's load and its CAS, which at tens of nanoseconds per update means the thread was
//! descheduled for minutes in the middle of a pop.
//!
//! **Races on links.** A popper reads `next(top)` with a relaxed load while another thread may be
//! rewriting it (after popping and re-pushing `top`); both sides are atomic, so this is not a
//! data race, and the stale value is never used because the CAS that would install it fails.
//! A value read this way may be any index, so walks check bounds and length before following it.

use super::meta::DepotMagazine;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// A table of nodes' links: node `i`'s successor is in `link(i)`.
pub(crate) trait Links {
    /// Node `i`'s link, or `None` if `i` is outside the table.
    fn link(&self, i: u32) -> Option<&AtomicU32>;
}

impl Links for [AtomicU32] {
    #[inline(always)]
    fn link(&self, i: u32) -> Option<&AtomicU32> {
        self.get(i as usize)
    }
}

impl Links for [DepotMagazine] {
    #[inline(always)]
    fn link(&self, i: u32) -> Option<&AtomicU32> {
        self.get(i as usize).map(|m| &m.next)
    }
}

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

/// Packs a tag and a node index into a head word.
#[inline(always)]
pub(crate) fn pack(tag: u32, index: u32) -> u64 {
    (u64::from(tag) << 32) | u64::from(index)
}

/// Splits a head word into `(tag, index)`.
#[inline(always)]
pub(crate) fn unpack(word: u64) -> (u32, u32) {
    // Truncations are the point: the high and low halves of our own packed word.
    ((word >> 32) as u32, word as u32)
}

/// The head word of an empty stack.
pub(crate) const EMPTY: u64 = NIL as u64;

/// A view of one stack: its head word and the link table its nodes index.
#[derive(Debug)]
pub(crate) struct Stack<'a, L: ?Sized> {
    head: &'a AtomicU64,
    links: &'a L,
}

impl<L: ?Sized> Clone for Stack<'_, L> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<L: ?Sized> Copy for Stack<'_, L> {}

impl<'a, L: Links + ?Sized> Stack<'a, L> {
    /// The stack whose head is `head` and whose node `i` stores its successor in
    /// `links.link(i)`.
    pub(crate) fn new(head: &'a AtomicU64, links: &'a L) -> Self {
        Self { head, links }
    }

    /// Node `i`'s link; panics (a bug in the caller, who owns the node) if `i` is outside the
    /// table.
    #[inline(always)]
    fn owned_link(&self, i: u32) -> &'a AtomicU32 {
        match self.links.link(i) {
            Some(link) => link,
            None => panic!("stack node {i} is outside its link table"),
        }
    }

    /// Whether the stack looked empty at some instant during the call.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn is_empty(&self) -> bool {
        // Relaxed: a hint for callers choosing where to look first; nothing is read through it.
        unpack(self.head.load(Ordering::Relaxed)).1 == NIL
    }

    /// Pushes the chain `first -> ... -> last` (already linked through the link table by the
    /// caller, who owns every node in it) as one unit.
    ///
    /// Panics (a bug in the caller, not bad input) if `last` is outside the link table.
    pub(crate) fn push_chain(&self, first: u32, last: u32) {
        let link = self.owned_link(last);
        // Relaxed: the value is only a CAS expectation; the CAS below re-validates it.
        let mut current = self.head.load(Ordering::Relaxed);
        loop {
            let (tag, top) = unpack(current);
            // Relaxed: published by the Release CAS below, which a popper acquires.
            link.store(top, Ordering::Relaxed);
            // ABA: the tag is bumped on every successful update (see the module docs).
            // Release: pairs with the Acquire loads/CAS in `pop_chain`, making the links written
            // by this thread (this one and the chain's inner ones) visible to whoever pops them.
            // Every later head update is a read-modify-write, so it continues this release
            // sequence: a popper acquiring any later head value also sees these links.
            match self.head.compare_exchange_weak(
                current,
                pack(tag.wrapping_add(1), first),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }

    /// Pushes one node.
    pub(crate) fn push(&self, node: u32) {
        self.push_chain(node, node);
    }

    /// Pops up to `max` (>= 1) nodes as one chain. Returns `(first, count)`; the caller owns the
    /// chain and walks it with [`Stack::next`] (`count - 1` steps).
    pub(crate) fn pop_chain(&self, max: u32) -> Option<(u32, u32)> {
        // Acquire: pairs with the Release CAS of the push that made this head (and, through the
        // release sequence, every earlier push), so the links we walk are the pushers' values.
        let mut current = self.head.load(Ordering::Acquire);
        'retry: loop {
            let (tag, top) = unpack(current);
            // A head outside the table only happens if shared memory was overwritten by
            // something other than this code; never hand such a node out.
            let top_link = self.links.link(top)?;
            let mut count = 1;
            // Relaxed: ordered by the Acquire above; a stale value fails the CAS below.
            let mut next = top_link.load(Ordering::Relaxed);
            while count < max && next != NIL {
                match self.links.link(next) {
                    Some(link) => next = link.load(Ordering::Relaxed),
                    None => {
                        // A link outside the table was rewritten behind our back (the head has
                        // moved on: start again) or, if the head is unchanged, the table was
                        // overwritten from outside: end the chain there rather than follow it.
                        let reloaded = self.head.load(Ordering::Acquire);
                        if reloaded != current {
                            current = reloaded;
                            continue 'retry;
                        }
                        next = NIL;
                        break;
                    }
                }
                count += 1;
            }
            if next != NIL && self.links.link(next).is_none() {
                // Same defence for the link of the last node taken.
                next = NIL;
            }
            // ABA: the CAS compares the tag as well as the index (see the module docs).
            // Acquire on success: as for the load above, for the nodes we now own.
            // Acquire on failure: the reloaded head is walked next.
            match self.head.compare_exchange_weak(
                current,
                pack(tag.wrapping_add(1), next),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some((top, count)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Pops one node.
    pub(crate) fn pop(&self) -> Option<u32> {
        self.pop_chain(1).map(|(node, _)| node)
    }

    /// The successor of `node` in a chain the caller owns (popped, or being built).
    #[inline]
    pub(crate) fn next(&self, node: u32) -> u32 {
        // Relaxed: the caller owns the chain; its links were made visible by the Acquire that
        // transferred ownership (or were written by this thread).
        self.owned_link(node).load(Ordering::Relaxed)
    }

    /// Links `node -> next` in a chain the caller owns.
    #[inline]
    pub(crate) fn link(&self, node: u32, next: u32) {
        // Relaxed: published by the Release CAS of the push that hands the chain over.
        self.owned_link(node).store(next, Ordering::Relaxed);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn table(n: usize) -> (AtomicU64, Vec<AtomicU32>) {
        (
            AtomicU64::new(EMPTY),
            (0..n).map(|_| AtomicU32::new(NIL)).collect(),
        )
    }

    #[test]
    fn pack_roundtrip() {
        assert_eq!(unpack(pack(7, 9)), (7, 9));
        assert_eq!(unpack(pack(u32::MAX, NIL)), (u32::MAX, NIL));
        assert_eq!(unpack(EMPTY), (0, NIL));
    }

    #[test]
    fn lifo_and_chains() {
        let (head, links) = table(8);
        let s = Stack::new(&head, &links[..]);
        assert!(s.is_empty());
        assert_eq!(s.pop(), None);
        s.push(3);
        s.link(5, 6);
        s.push_chain(5, 6);
        s.push(1);
        assert!(!s.is_empty());
        assert_eq!(s.pop(), Some(1));
        let (first, count) = s.pop_chain(2).unwrap();
        assert_eq!((first, count), (5, 2));
        assert_eq!(s.next(first), 6);
        assert_eq!(s.pop_chain(10), Some((3, 1)));
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn tag_changes_on_every_update() {
        let (head, links) = table(4);
        let s = Stack::new(&head, &links[..]);
        s.push(2);
        let before = head.load(Ordering::Relaxed);
        assert_eq!(s.pop(), Some(2));
        s.push(2);
        let after = head.load(Ordering::Relaxed);
        assert_eq!(unpack(before).1, unpack(after).1);
        assert_ne!(before, after, "same top, different tag");
    }

    #[test]
    fn overwritten_links_are_never_followed_out_of_the_table() {
        let (head, links) = table(4);
        let s = Stack::new(&head, &links[..]);
        s.push(0);
        s.push(1);
        // Memory overwritten from outside: 1 -> 1000. The chain ends at 1; nothing outside the
        // table is handed out.
        links[1].store(1000, Ordering::Relaxed);
        assert_eq!(s.pop_chain(4), Some((1, 1)));
        assert_eq!(s.pop(), None);
        s.push(2);
        links[2].store(1000, Ordering::Relaxed);
        assert_eq!(s.pop(), Some(2));
        assert_eq!(s.pop(), None);
        head.store(pack(9, 77), Ordering::Relaxed);
        assert_eq!(s.pop(), None);
    }
}
