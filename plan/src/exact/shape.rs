//! What the exact search knows about an instance, independent of capacity and preorder
//! ([`Shape`]): the sections of time where the set of live blocks is constant, which blocks
//! overlap, and the fixed blocks each free block must go around.

use crate::problem::Item;

/// What the search knows about the instance, independent of capacity and preorder.
#[derive(Debug)]
pub(super) struct Shape {
    pub(super) sec_lo: Vec<usize>,
    pub(super) sec_hi: Vec<usize>,
    pub(super) section_items: Vec<Vec<usize>>,
    pub(super) overlaps: Vec<Vec<usize>>,
    /// The initial sum of sizes per section.
    pub(super) totals: Vec<u64>,
    /// Each block's size, packed for the scans.
    pub(super) size: Vec<u64>,
    /// Per block, the fixed blocks live with it, as `(offset, size)` in offset order: it
    /// must go around them.
    pub(super) obstacles: Vec<Vec<(u64, u64)>>,
}

impl Shape {
    pub(super) fn new(items: &[Item], obstacles: Vec<Vec<(u64, u64)>>) -> Self {
        let mut points: Vec<u64> = items
            .iter()
            .flat_map(|it| [u64::from(it.first), u64::from(it.last) + 1])
            .collect();
        points.sort_unstable();
        points.dedup();
        let sections = points.len().saturating_sub(1);
        let at = |t: u64| points.partition_point(|&p| p < t);
        let sec_lo: Vec<usize> = items.iter().map(|it| at(u64::from(it.first))).collect();
        let sec_hi: Vec<usize> = items.iter().map(|it| at(u64::from(it.last) + 1)).collect();
        let mut section_items = vec![Vec::new(); sections];
        let mut totals = vec![0u64; sections];
        for (i, it) in items.iter().enumerate() {
            for s in sec_lo[i]..sec_hi[i] {
                section_items[s].push(i);
                totals[s] += it.size;
            }
        }
        let mut overlaps = vec![Vec::new(); items.len()];
        let mut by_first: Vec<usize> = (0..items.len()).collect();
        by_first.sort_by_key(|&i| (items[i].first, i));
        for (k, &i) in by_first.iter().enumerate() {
            for &j in &by_first[k + 1..] {
                if items[j].first > items[i].last {
                    break;
                }
                overlaps[i].push(j);
                overlaps[j].push(i);
            }
        }
        Self {
            sec_lo,
            sec_hi,
            section_items,
            overlaps,
            totals,
            size: items.iter().map(|it| it.size).collect(),
            obstacles,
        }
    }

    /// The least offset at or above `at` where block `i` clears every fixed block it is live
    /// with.
    #[inline]
    pub(super) fn clear_of_fixed(&self, i: usize, mut at: u64) -> u64 {
        let size = self.size[i];
        // In offset order, an obstacle ending at or below `at` stays below it as `at` rises.
        for &(offset, len) in &self.obstacles[i] {
            if offset >= at + size {
                break;
            }
            if offset + len > at {
                at = offset + len;
            }
        }
        at
    }
}
