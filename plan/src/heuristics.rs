//! The heuristic strategies: greedy colouring into shared buffers, TFLite's greedy by size,
//! first fit and online best fit. Each takes the blocks and returns one offset per block;
//! pre-placed blocks keep their offsets and are obstacles for the rest.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use super::problem::{align_up, Item};
use super::timeline::Timeline;

/// No offset (yet): never a real one, as every block ends at or below `u64::MAX`.
const NONE: u64 = u64::MAX;

/// A heuristic that is given a deadline looks at the clock once per this many blocks, and
/// gives up (`None`) once it has passed.
const CLOCK_EVERY: usize = 64;

fn late(deadline: Option<Instant>, k: usize) -> bool {
    k % CLOCK_EVERY == CLOCK_EVERY - 1 && deadline.is_some_and(|d| Instant::now() >= d)
}

/// Offsets placing every block: fixed blocks first, the others in `order`, each at the offset
/// `choose` picks among the gaps left by the already-placed blocks that overlap it in time.
/// `None` if `deadline` passes first.
///
/// The blocks a block overlaps come from a [`Timeline`] (a cost of about their number), unless
/// most blocks overlap most others: then a scan of the placed blocks, kept in offset order,
/// is cheaper than the tree walk and a sort. Either way the time grows with the number of pairs
/// of blocks live together, n² / 2 at worst.
fn place_in_order(
    items: &[Item],
    order: &[usize],
    choose: impl Fn(&mut dyn Iterator<Item = (u64, u64)>, u64) -> u64,
    deadline: Option<Instant>,
) -> Option<Vec<u64>> {
    let mut offsets = vec![NONE; items.len()];
    let mut timeline = Timeline::empty(items, |_| true);
    let dense = dense(items, &timeline);
    // Dense only: the placed blocks, sorted by offset: (offset, end, first, last).
    let mut placed: Vec<(u64, u64, u32, u32)> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        if let Some(o) = it.fixed {
            offsets[i] = o;
            timeline.add(items, i);
            if dense {
                placed.push((o, o + it.size, it.first, it.last));
            }
        }
    }
    placed.sort_unstable();
    let mut busy: Vec<(u64, u64)> = Vec::new();
    let mut stack = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if late(deadline, k) {
            return None;
        }
        let it = &items[i];
        if it.fixed.is_some() {
            continue;
        }
        busy.clear();
        if dense {
            busy.extend(
                placed
                    .iter()
                    .filter(|&&(_, _, first, last)| first <= it.last && it.first <= last)
                    .map(|&(o, e, _, _)| (o, e)),
            );
        } else {
            timeline.each(it.first, it.last, &mut stack, |j| {
                busy.push((offsets[j], offsets[j] + items[j].size));
            });
            busy.sort_unstable();
        }
        let offset = choose(&mut gaps(&busy), it.size);
        offsets[i] = offset;
        timeline.add(items, i);
        if dense {
            let block = (offset, offset + it.size, it.first, it.last);
            let at = placed.partition_point(|p| *p < block);
            placed.insert(at, block);
        }
    }
    Some(offsets)
}

/// Whether most blocks are live with most others (more than n² / 8 pairs): then a plain scan
/// of the placed blocks beats walking `timeline` (of every block) for them.
fn dense(items: &[Item], timeline: &Timeline) -> bool {
    let pairs: u64 = items
        .iter()
        .map(|it| timeline.count(it.first, it.last) as u64)
        .sum();
    let n = items.len() as u64;
    pairs.saturating_mul(8) > n.saturating_mul(n)
}

/// The gaps between `busy` ranges (sorted by start) as `(start, length)`, the last one
/// unbounded (`u64::MAX`).
fn gaps(busy: &[(u64, u64)]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut prev = 0u64;
    let mut done = false;
    let mut k = 0;
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        if k == busy.len() {
            done = true;
            return Some((prev, u64::MAX));
        }
        let (o, e) = busy[k];
        k += 1;
        let gap = (o > prev).then(|| (prev, o - prev));
        prev = prev.max(e);
        if gap.is_some() {
            return gap;
        }
    })
}

/// The lowest gap that fits.
fn lowest(gaps: &mut dyn Iterator<Item = (u64, u64)>, size: u64) -> u64 {
    for (o, len) in gaps {
        if len >= size {
            return o;
        }
    }
    0
}

/// The smallest bounded gap that fits (the lowest among equals), else the top.
fn smallest(gaps: &mut dyn Iterator<Item = (u64, u64)>, size: u64) -> u64 {
    let mut best: Option<(u64, u64)> = None;
    let mut top = 0;
    for (o, len) in gaps {
        if len == u64::MAX {
            top = o;
        } else if len >= size && best.is_none_or(|(_, l)| len < l) {
            best = Some((o, len));
        }
    }
    best.map_or(top, |(o, _)| o)
}

/// The free memory among the blocks live at one step, for a sweep in time order: the bounded
/// gaps between them (start to end) and the top, above which everything is free.
#[derive(Debug, Default)]
struct Free {
    gaps: BTreeMap<u64, u64>,
    top: u64,
}

impl Free {
    /// Marks `[offset, end)` used: it lies in a gap or at or above the top.
    fn take(&mut self, offset: u64, end: u64) {
        if offset >= self.top {
            if offset > self.top {
                self.gaps.insert(self.top, offset);
            }
            self.top = end;
            return;
        }
        let Some((&start, &stop)) = self.gaps.range(..=offset).next_back() else {
            return;
        };
        debug_assert!(end <= stop, "a block placed over a live one");
        self.gaps.remove(&start);
        if start < offset {
            self.gaps.insert(start, offset);
        }
        if end < stop {
            self.gaps.insert(end, stop);
        }
    }

    /// Marks `[offset, end)` free again, merged with the free memory on either side.
    fn give(&mut self, offset: u64, end: u64) {
        let mut start = offset;
        if let Some((&a, &b)) = self.gaps.range(..offset).next_back() {
            if b == offset {
                self.gaps.remove(&a);
                start = a;
            }
        }
        if end == self.top {
            self.top = start;
            return;
        }
        let stop = self.gaps.remove(&end).unwrap_or(end);
        self.gaps.insert(start, stop);
    }

    /// The gaps as [`gaps`] gives them, `(start, length)`, the top last and unbounded.
    fn each(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.gaps
            .iter()
            .map(|(&a, &b)| (a, b - a))
            .chain(std::iter::once((self.top, u64::MAX)))
    }

    /// The used ranges below the top, in offset order.
    fn used(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let mut at = 0;
        self.gaps
            .iter()
            .map(|(&a, &b)| (a, b))
            .chain(std::iter::once((self.top, self.top)))
            .filter_map(move |(a, b)| {
                let run = (at < a).then_some((at, a));
                at = b;
                run
            })
    }
}

/// Places the blocks in time order, each where `choose` picks among the gaps left by the
/// blocks live with it. The blocks placed before one that it overlaps are the ones still live
/// when it starts (and fixed blocks starting later), so a sweep keeps the gaps among the live
/// blocks as blocks come and go: a block costs a look at the gaps, not at every live block.
/// The same offsets as `place_in_order` with the same order and choice.
fn sweep(
    items: &[Item],
    choose: impl Fn(&mut dyn Iterator<Item = (u64, u64)>, u64) -> u64,
    deadline: Option<Instant>,
) -> Option<Vec<u64>> {
    let mut offsets = vec![NONE; items.len()];
    let fixed = Timeline::new(items, |it| it.fixed.is_some());
    let any_fixed = items.iter().any(|it| it.fixed.is_some());
    let mut started = vec![false; items.len()];
    let mut free = Free::default();
    // The live blocks, the one that ends first on top: (last step, offset, end).
    let mut live: BinaryHeap<Reverse<(u32, u64, u64)>> = BinaryHeap::new();
    let mut ahead: Vec<(u64, u64)> = Vec::new();
    let mut busy: Vec<(u64, u64)> = Vec::new();
    let mut stack = Vec::new();
    for (k, i) in time_order(items).into_iter().enumerate() {
        if late(deadline, k) {
            return None;
        }
        let it = &items[i];
        while let Some(&Reverse((last, offset, end))) = live.peek() {
            if last >= it.first {
                break;
            }
            live.pop();
            free.give(offset, end);
        }
        // Fixed blocks live with this one that have not started yet: around them too.
        ahead.clear();
        if any_fixed && it.fixed.is_none() {
            fixed.each(it.first, it.last, &mut stack, |j| {
                if !started[j] {
                    let o = items[j].fixed.unwrap_or(0);
                    ahead.push((o, o + items[j].size));
                }
            });
        }
        let offset = match it.fixed {
            Some(o) => o,
            None if ahead.is_empty() => choose(&mut free.each(), it.size),
            None => {
                busy.clear();
                busy.extend(free.used());
                busy.extend_from_slice(&ahead);
                busy.sort_unstable();
                choose(&mut gaps(&busy), it.size)
            }
        };
        offsets[i] = offset;
        started[i] = true;
        free.take(offset, offset + it.size);
        live.push(Reverse((it.last, offset, offset + it.size)));
    }
    Some(offsets)
}

/// TFLite's arena planner ("greedy by size"): blocks in non-increasing size (ties: earlier
/// first step, then index), each in the smallest gap among the time-overlapping blocks
/// already placed, else above them.
pub(crate) fn greedy_size(items: &[Item], deadline: Option<Instant>) -> Option<Vec<u64>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (Reverse(items[i].size), items[i].first, i));
    place_in_order(items, &order, smallest, deadline)
}

/// In the order they are produced (ties: larger first), each at the lowest offset where it
/// fits.
pub(crate) fn first_fit(items: &[Item], deadline: Option<Instant>) -> Option<Vec<u64>> {
    sweep(items, lowest, deadline)
}

/// ONNX Runtime's memory-pattern style online planner: in the order they are produced, each in
/// the smallest free gap among the live blocks, else at the top of the live blocks.
pub(crate) fn best_fit(items: &[Item], deadline: Option<Instant>) -> Option<Vec<u64>> {
    sweep(items, smallest, deadline)
}

fn time_order(items: &[Item]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].first, Reverse(items[i].size), i));
    order
}

/// Greedy colouring of the conflict graph: blocks in non-increasing size (ties by index) each
/// join the shared buffer with no time-overlapping member whose size wastes the least (or
/// grows the least), else open a new buffer. Buffers are laid out one after another above the
/// fixed blocks. Returns the offsets and the buffer sizes, or `None` if `deadline` passes
/// first. A block costs a look at the blocks it overlaps and at every buffer.
pub(crate) fn colour(
    items: &[Item],
    align: u64,
    deadline: Option<Instant>,
) -> Option<(Vec<u64>, Vec<u64>)> {
    let mut order: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none())
        .collect();
    order.sort_by_key(|&i| (Reverse(items[i].size), items[i].first, i));
    let mut timeline = Timeline::empty(items, |it| it.fixed.is_none());
    let dense = dense(items, &timeline);
    // Dense only: the coloured blocks, (first, last, colour).
    let mut coloured: Vec<(u32, u32, usize)> = Vec::new();
    let mut stack = Vec::new();
    let mut buffers: Vec<u64> = Vec::new();
    // Per buffer, the last block that found a member of it live with itself.
    let mut taken_for: Vec<usize> = Vec::new();
    let mut colour_of = vec![usize::MAX; items.len()];
    for (k, &i) in order.iter().enumerate() {
        if late(deadline, k) {
            return None;
        }
        let it = &items[i];
        if dense {
            for &(first, last, c) in &coloured {
                if first <= it.last && it.first <= last {
                    taken_for[c] = i;
                }
            }
        } else {
            timeline.each(it.first, it.last, &mut stack, |j| {
                taken_for[colour_of[j]] = i;
            });
        }
        let mut best: Option<(u64, usize)> = None;
        for (c, &size) in buffers.iter().enumerate() {
            if taken_for[c] == i {
                continue;
            }
            let cost = size.abs_diff(it.size);
            if best.is_none_or(|(b, _)| cost < b) {
                best = Some((cost, c));
            }
        }
        let c = match best {
            Some((_, c)) => c,
            None => {
                buffers.push(0);
                taken_for.push(usize::MAX);
                buffers.len() - 1
            }
        };
        buffers[c] = buffers[c].max(it.size);
        colour_of[i] = c;
        if dense {
            coloured.push((it.first, it.last, c));
        } else {
            timeline.add(items, i);
        }
    }
    let base = items
        .iter()
        .filter_map(|it| it.fixed.map(|o| o + it.size))
        .max()
        .unwrap_or(0);
    // `Problem::new` refused inputs whose fixed ends plus every size overflow, so these sums
    // cannot.
    let mut starts = Vec::with_capacity(buffers.len());
    let mut at = align_up(base, align).unwrap_or(base);
    for size in &buffers {
        starts.push(at);
        at += size;
    }
    let offsets = items
        .iter()
        .enumerate()
        .map(|(i, it)| it.fixed.unwrap_or_else(|| starts[colour_of[i]]))
        .collect();
    Some((offsets, buffers))
}

/// The arena a set of offsets needs.
pub(crate) fn arena(items: &[Item], offsets: &[u64]) -> u64 {
    items
        .iter()
        .zip(offsets)
        .map(|(it, &o)| o + it.size)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(size: u64, first: u32, last: u32) -> Item {
        Item {
            size,
            first,
            last,
            fixed: None,
        }
    }

    /// TFLite GPU delegate's `ComplexRecords` (memory_management_test.cc): greedy by size gives
    /// these offsets and a 96-byte arena.
    #[test]
    fn tflite_complex_records() {
        let records = [
            (32, 0, 1),
            (32, 1, 4),
            (8, 2, 5),
            (16, 3, 5),
            (8, 4, 5),
            (64, 5, 7),
            (8, 6, 8),
            (8, 7, 8),
            (16, 8, 9),
        ];
        let items: Vec<Item> = records.iter().map(|&(s, f, l)| item(s, f, l)).collect();
        let offsets = greedy_size(&items, None).unwrap();
        assert_eq!(offsets, [0, 32, 80, 64, 88, 0, 64, 72, 0]);
        assert_eq!(arena(&items, &offsets), 96);
    }

    #[test]
    fn gaps_and_choices() {
        let busy = [(0, 10), (20, 30), (35, 40)];
        let g: Vec<_> = gaps(&busy).collect();
        assert_eq!(g, [(10, 10), (30, 5), (40, u64::MAX)]);
        assert_eq!(lowest(&mut gaps(&busy), 5), 10);
        assert_eq!(smallest(&mut gaps(&busy), 5), 30);
        assert_eq!(smallest(&mut gaps(&busy), 11), 40);
        assert_eq!(lowest(&mut gaps(&[]), 5), 0);
    }

    type Choose = fn(&mut dyn Iterator<Item = (u64, u64)>, u64) -> u64;

    /// The sweep gives first fit and best fit the offsets a scan of every placed block gives,
    /// fixed blocks included.
    #[test]
    fn the_sweep_matches_a_scan_of_the_placed_blocks() {
        let mut seed = 12345u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        // Under Miri (scripts/miri.sh) the first 4 of the same rounds (each takes seconds).
        let rounds = if cfg!(miri) { 4 } else { 200 };
        for round in 0..rounds {
            let n = 1 + next(40) as usize;
            let mut items: Vec<Item> = (0..n)
                .map(|_| {
                    let first = next(30) as u32;
                    item(1 + next(8) * 16, first, first + next(10) as u32)
                })
                .collect();
            // A few fixed blocks, each in its own range so none collide.
            for (k, it) in items.iter_mut().enumerate() {
                if round % 2 == 1 && next(6) == 0 {
                    it.fixed = Some(256 * k as u64);
                }
            }
            let order = time_order(&items);
            let choices: [Choose; 2] = [lowest, smallest];
            for choose in choices {
                let scan = place_in_order(&items, &order, choose, None).unwrap();
                assert_eq!(sweep(&items, choose, None).unwrap(), scan, "{items:?}");
            }
        }
    }

    #[test]
    fn colour_shares_buffers_between_disjoint_lifetimes() {
        let items = [item(64, 0, 1), item(32, 2, 3), item(64, 1, 2)];
        let (offsets, buffers) = colour(&items, 1, None).unwrap();
        assert_eq!(buffers, [64, 64]);
        assert_eq!(offsets[0], offsets[1]);
        assert_eq!(arena(&items, &offsets), 128);
    }
}
