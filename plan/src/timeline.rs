//! Which blocks are live during a span of steps ([`Timeline`]), found without scanning every
//! block: the heuristics ask this once per block they place.

use super::problem::Item;

/// The blocks in order of their first step, with a tree of the largest last step over each
/// range of that order. The blocks live during `[first, last]` are those among the ones
/// starting by `last` that end at or after `first`: a query walks down only into subtrees
/// holding such a block, so it costs about the number of blocks found, times the tree's
/// height.
#[derive(Debug)]
pub(crate) struct Timeline {
    /// Block indices by (first step, index).
    order: Vec<usize>,
    /// The first step of each, in that order.
    firsts: Vec<u32>,
    /// Every block's last step, sorted: counts a query's blocks without visiting them.
    lasts: Vec<u32>,
    /// Leaves at `leaves..2 * leaves`: a block's last step plus one (0 for no block); each
    /// inner node the largest of its two children.
    tree: Vec<u64>,
    leaves: usize,
}

impl Timeline {
    /// The blocks of `items` for which `keep` holds, all of them found by [`Timeline::each`].
    pub(crate) fn new(items: &[Item], keep: impl Fn(&Item) -> bool) -> Self {
        let mut timeline = Self::empty(items, keep);
        for (k, &i) in timeline.order.iter().enumerate() {
            timeline.tree[timeline.leaves + k] = u64::from(items[i].last) + 1;
        }
        for node in (1..timeline.leaves).rev() {
            timeline.tree[node] = timeline.tree[2 * node].max(timeline.tree[2 * node + 1]);
        }
        timeline
    }

    /// The blocks of `items` for which `keep` holds, none of them found by [`Timeline::each`]
    /// until [`Timeline::add`]ed ([`Timeline::count`] counts them all).
    pub(crate) fn empty(items: &[Item], keep: impl Fn(&Item) -> bool) -> Self {
        let mut order: Vec<usize> = (0..items.len()).filter(|&i| keep(&items[i])).collect();
        order.sort_unstable_by_key(|&i| (items[i].first, i));
        let firsts = order.iter().map(|&i| items[i].first).collect();
        let mut lasts: Vec<u32> = order.iter().map(|&i| items[i].last).collect();
        lasts.sort_unstable();
        let leaves = order.len().next_power_of_two();
        Self {
            order,
            firsts,
            lasts,
            tree: vec![0u64; 2 * leaves],
            leaves,
        }
    }

    /// Lets [`Timeline::each`] find block `i` of `items` (one of those kept), in O(log n).
    pub(crate) fn add(&mut self, items: &[Item], i: usize) {
        let it = &items[i];
        // Its position: among the blocks with its first step, by index.
        let from = self.firsts.partition_point(|&f| f < it.first);
        let to = self.firsts.partition_point(|&f| f <= it.first);
        let Ok(k) = self.order[from..to].binary_search(&i) else {
            return;
        };
        let mut node = self.leaves + from + k;
        self.tree[node] = u64::from(it.last) + 1;
        while node > 1 {
            node /= 2;
            self.tree[node] = self.tree[2 * node].max(self.tree[2 * node + 1]);
        }
    }

    /// How many blocks are live at some step of `[first, last]`, in O(log n).
    pub(crate) fn count(&self, first: u32, last: u32) -> usize {
        // The blocks ending before `first` all start before it too, so are among the ones
        // starting by `last`.
        let starting = self.firsts.partition_point(|&f| f <= last);
        starting - self.lasts.partition_point(|&l| l < first)
    }

    /// Calls `found` with every block live at some step of `[first, last]`, in no particular
    /// order. `stack` is scratch space, kept by the caller so queries do not allocate.
    pub(crate) fn each(
        &self,
        first: u32,
        last: u32,
        stack: &mut Vec<(usize, usize, usize)>,
        mut found: impl FnMut(usize),
    ) {
        let starting = self.firsts.partition_point(|&f| f <= last);
        stack.clear();
        // (node, the first position it covers, how many it covers)
        stack.push((1, 0, self.leaves));
        while let Some((node, lo, width)) = stack.pop() {
            if lo >= starting || self.tree[node] <= u64::from(first) {
                continue;
            }
            if width == 1 {
                found(self.order[lo]);
            } else {
                let half = width / 2;
                stack.push((2 * node + 1, lo + half, half));
                stack.push((2 * node, lo, half));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_blocks_live_in_a_span() {
        let spans = [(0, 3), (2, 2), (5, 9), (1, 1), (4, 6), (7, 7), (0, 0)];
        let items: Vec<Item> = spans
            .iter()
            .map(|&(first, last)| Item {
                size: 1,
                first,
                last,
                fixed: None,
            })
            .collect();
        let timeline = Timeline::new(&items, |_| true);
        let mut stack = Vec::new();
        for first in 0..11 {
            for last in first..11 {
                let mut got = Vec::new();
                timeline.each(first, last, &mut stack, |i| got.push(i));
                got.sort_unstable();
                let want: Vec<usize> = (0..items.len())
                    .filter(|&i| items[i].first <= last && first <= items[i].last)
                    .collect();
                assert_eq!(got, want, "[{first}, {last}]");
                assert_eq!(timeline.count(first, last), want.len());
            }
        }
        let mut some = Timeline::empty(&items, |_| true);
        for i in [4, 0, 6] {
            some.add(&items, i);
        }
        let mut got = Vec::new();
        some.each(2, 5, &mut stack, |i| got.push(i));
        got.sort_unstable();
        assert_eq!(got, [0, 4]);
        let none = Timeline::new(&items, |_| false);
        assert_eq!(none.count(0, 10), 0);
        none.each(0, 10, &mut stack, |i| {
            panic!("found {i} in an empty timeline")
        });
    }
}
