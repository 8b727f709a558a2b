//! The heuristic strategies: greedy colouring into shared buffers, TFLite's greedy by size,
//! first fit and online best fit. Each takes the blocks and returns one offset per block;
//! pre-placed blocks keep their offsets and are obstacles for the rest.

use super::problem::Item;

/// Offsets placing every block: fixed blocks first, the others in `order`, each at the offset
/// `choose` picks among the gaps left by the already-placed blocks that overlap it in time.
fn place_in_order(
    items: &[Item],
    order: &[usize],
    choose: impl Fn(&[(u64, u64)], u64) -> u64,
) -> Vec<u64> {
    let mut offsets = vec![u64::MAX; items.len()];
    // Placed blocks, sorted by offset: (offset, end, index).
    let mut placed: Vec<(u64, u64, usize)> = Vec::with_capacity(items.len());
    for (i, it) in items.iter().enumerate() {
        if let Some(o) = it.fixed {
            offsets[i] = o;
            placed.push((o, o + it.size, i));
        }
    }
    placed.sort_unstable();
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        let it = &items[i];
        if it.fixed.is_some() {
            continue;
        }
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|&&(_, _, j)| items[j].overlaps(it))
                .map(|&(o, e, _)| (o, e)),
        );
        let offset = choose(&busy, it.size);
        offsets[i] = offset;
        let at = placed.partition_point(|&(o, _, j)| (o, j) < (offset, i));
        placed.insert(at, (offset, offset + it.size, i));
    }
    offsets
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
fn lowest(busy: &[(u64, u64)], size: u64) -> u64 {
    gaps(busy)
        .find(|&(_, len)| len >= size)
        .map_or(0, |(o, _)| o)
}

/// The smallest bounded gap that fits (the lowest among equals), else the top.
fn smallest(busy: &[(u64, u64)], size: u64) -> u64 {
    let mut best: Option<(u64, u64)> = None;
    let mut top = 0;
    for (o, len) in gaps(busy) {
        if len == u64::MAX {
            top = o;
        } else if len >= size && best.is_none_or(|(_, l)| len < l) {
            best = Some((o, len));
        }
    }
    best.map_or(top, |(o, _)| o)
}

/// TFLite's arena planner ("greedy by size"): blocks in non-increasing size (ties: earlier
/// first step, then index), each in the smallest gap among the time-overlapping blocks
/// already placed, else above them.
pub(crate) fn greedy_size(items: &[Item]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].size), items[i].first, i));
    place_in_order(items, &order, smallest)
}

/// In the order they are produced (ties: larger first), each at the lowest offset where it
/// fits.
pub(crate) fn first_fit(items: &[Item]) -> Vec<u64> {
    place_in_order(items, &time_order(items), lowest)
}

/// ONNX Runtime's memory-pattern style online planner: in the order they are produced, each in
/// the smallest free gap among the live blocks, else at the top of the live blocks.
pub(crate) fn best_fit(items: &[Item]) -> Vec<u64> {
    place_in_order(items, &time_order(items), smallest)
}

fn time_order(items: &[Item]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (items[i].first, std::cmp::Reverse(items[i].size), i));
    order
}

/// Greedy colouring of the conflict graph: blocks in non-increasing size (ties by index) each
/// join the shared buffer with no time-overlapping member whose size wastes the least (or
/// grows the least), else open a new buffer. Buffers are laid out one after another above the
/// fixed blocks. Returns the offsets and the buffer sizes.
pub(crate) fn colour(items: &[Item], align: u64) -> (Vec<u64>, Vec<u64>) {
    let mut order: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none())
        .collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].size), items[i].first, i));
    let mut buffers: Vec<(u64, Vec<usize>)> = Vec::new();
    let mut colour_of = vec![usize::MAX; items.len()];
    for &i in &order {
        let it = &items[i];
        let mut best: Option<(u64, usize)> = None;
        for (c, (size, members)) in buffers.iter().enumerate() {
            if members.iter().any(|&j| items[j].overlaps(it)) {
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
                buffers.push((0, Vec::new()));
                buffers.len() - 1
            }
        };
        buffers[c].0 = buffers[c].0.max(it.size);
        buffers[c].1.push(i);
        colour_of[i] = c;
    }
    let base = items
        .iter()
        .filter_map(|it| it.fixed.map(|o| o + it.size))
        .max()
        .unwrap_or(0);
    let mut starts = Vec::with_capacity(buffers.len());
    let mut at = super::problem::align_up(base, align).unwrap_or(base);
    for (size, _) in &buffers {
        starts.push(at);
        at += size;
    }
    let offsets = items
        .iter()
        .enumerate()
        .map(|(i, it)| it.fixed.unwrap_or_else(|| starts[colour_of[i]]))
        .collect();
    (offsets, buffers.iter().map(|b| b.0).collect())
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
        let offsets = greedy_size(&items);
        assert_eq!(offsets, [0, 32, 80, 64, 88, 0, 64, 72, 0]);
        assert_eq!(arena(&items, &offsets), 96);
    }

    #[test]
    fn gaps_and_choices() {
        let busy = [(0, 10), (20, 30), (35, 40)];
        let g: Vec<_> = gaps(&busy).collect();
        assert_eq!(g, [(10, 10), (30, 5), (40, u64::MAX)]);
        assert_eq!(lowest(&busy, 5), 10);
        assert_eq!(smallest(&busy, 5), 30);
        assert_eq!(smallest(&busy, 11), 40);
        assert_eq!(lowest(&[], 5), 0);
    }

    #[test]
    fn colour_shares_buffers_between_disjoint_lifetimes() {
        let items = [item(64, 0, 1), item(32, 2, 3), item(64, 1, 2)];
        let (offsets, buffers) = colour(&items, 1);
        assert_eq!(buffers, [64, 64]);
        assert_eq!(offsets[0], offsets[1]);
        assert_eq!(arena(&items, &offsets), 128);
    }
}
