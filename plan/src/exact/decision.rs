//! One decision search of the exact strategy ([`Search`]): does every block fit below a
//! capacity? A depth-first search over canonical placements with dominance, cross-section
//! inference, hatless pruning and dynamic decomposition (see the [parent module](super)).

use std::time::Instant;

use super::shape::Shape;
use crate::problem::Item;

const NONE: u64 = u64::MAX;
/// No block (a section with no hint).
const EMPTY: usize = usize::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Found,
    NotFound,
    Aborted,
}

/// One decision search: a capacity, a preorder heuristic, a node limit.
#[derive(Debug)]
pub(super) struct Search<'a> {
    items: &'a [Item],
    shape: &'a Shape,
    capacity: u64,
    /// Which preorder (0: width, area, total; 1: total, area, width; 2: total, width, area).
    heuristic: usize,
    offset: Vec<u64>,
    pub(super) solution: Vec<u64>,
    min_offset: Vec<u64>,
    /// `min_offset` of unplaced blocks, `NONE` for placed ones: one load per block in a rescan.
    live: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// Unplaced blocks crossing the boundary between section `s` and `s + 1`.
    cuts: Vec<u32>,
    undo_min: Vec<(usize, u64)>,
    undo_floor: Vec<(usize, u64)>,
    /// Per section, the unplaced block a scan last found low enough for the section's unplaced
    /// blocks to fit above it: tried first next time. Only a hint (any such block settles the
    /// question), so it is not undone.
    hint: Vec<usize>,
    /// Candidate buffers, one per depth, reused so the search does not allocate per node.
    spare: Vec<Vec<(u64, usize)>>,
    pub(super) nodes: u64,
    limit: u64,
    deadline: Option<Instant>,
    pub(super) deadline_hit: bool,
}

impl<'a> Search<'a> {
    pub(super) fn new(
        items: &'a [Item],
        shape: &'a Shape,
        heuristic: usize,
        capacity: u64,
        limit: u64,
        deadline: Option<Instant>,
    ) -> Self {
        let sections = shape.totals.len();
        let mut cuts = vec![0u32; sections.saturating_sub(1)];
        for i in 0..items.len() {
            for c in &mut cuts[shape.sec_lo[i]..shape.sec_hi[i] - 1] {
                *c += 1;
            }
        }
        Self {
            items,
            shape,
            capacity,
            heuristic,
            offset: vec![NONE; items.len()],
            solution: vec![NONE; items.len()],
            min_offset: (0..items.len())
                .map(|i| shape.clear_of_fixed(i, 0))
                .collect(),
            live: (0..items.len())
                .map(|i| shape.clear_of_fixed(i, 0))
                .collect(),
            floor: vec![0; sections],
            total: shape.totals.clone(),
            cuts,
            undo_min: Vec::new(),
            undo_floor: Vec::new(),
            hint: shape
                .section_items
                .iter()
                .map(|v| v.first().copied().unwrap_or(EMPTY))
                .collect(),
            spare: Vec::new(),
            nodes: 0,
            limit,
            deadline,
            deadline_hit: false,
        }
    }

    pub(super) fn run(&mut self) -> Status {
        let all: Vec<usize> = (0..self.items.len()).collect();
        let sections = self.shape.totals.len();
        if !self.check((0, sections), 0) {
            return Status::NotFound;
        }
        let mut cutpoints = vec![0];
        cutpoints.extend(
            (0..self.cuts.len())
                .filter(|&s| self.cuts[s] == 0)
                .map(|s| s + 1),
        );
        cutpoints.push(sections);
        self.split(&all, &cutpoints)
    }

    /// Solves the unplaced blocks of `blocks` in each range between consecutive cutpoints,
    /// independently.
    fn split(&mut self, blocks: &[usize], cutpoints: &[usize]) -> Status {
        for w in cutpoints.windows(2) {
            let (a, b) = (w[0], w[1]);
            let sub: Vec<usize> = blocks
                .iter()
                .copied()
                .filter(|&j| {
                    self.offset[j] == NONE && self.shape.sec_lo[j] < b && a < self.shape.sec_hi[j]
                })
                .collect();
            if sub.is_empty() {
                continue;
            }
            let status = self.solve_partition(sub, (a, b));
            if status != Status::Found {
                return status;
            }
        }
        Status::Found
    }

    /// A static preorder of `blocks` (MiniMalloc's letters: W lifetime width, A area, T the
    /// largest section total it spans), then the search.
    fn solve_partition(&mut self, mut blocks: Vec<usize>, range: (usize, usize)) -> Status {
        let items = self.items;
        let shape = self.shape;
        let total = |i: usize| {
            (shape.sec_lo[i]..shape.sec_hi[i])
                .map(|s| self.total[s])
                .max()
                .unwrap_or(0)
        };
        let key = |i: usize| {
            let w = u128::from(items[i].last - items[i].first + 1);
            let a = u128::from(items[i].size) * w;
            let t = u128::from(total(i));
            let (k0, k1, k2) = match self.heuristic {
                0 => (w, a, t),
                1 => (t, a, w),
                _ => (t, w, a),
            };
            (
                std::cmp::Reverse(k0),
                std::cmp::Reverse(k1),
                std::cmp::Reverse(k2),
                i,
            )
        };
        blocks.sort_by_cached_key(|&i| key(i));
        self.dfs(&blocks, range, 0, 0)
    }

    /// Cross-section inference over the sections of `range`, with `offset` the offset of the
    /// last placement (every later one is at or above it).
    fn check(&mut self, range: (usize, usize), offset: u64) -> bool {
        (range.0..range.1).all(|s| self.section_fits(s, offset))
    }

    /// Whether the unplaced blocks of section `s` can still stack below the capacity: above the
    /// placed blocks and `offset`, and above the least minimal offset among them. The least is
    /// not kept up to date: a section passes as soon as one unplaced block sits low enough (its
    /// hint first), so a full scan runs only when the hint has been placed or has risen too high.
    fn section_fits(&mut self, s: usize, offset: u64) -> bool {
        let total = self.total[s];
        if total == 0 {
            return true;
        }
        let Some(room) = self.capacity.checked_sub(total) else {
            return false;
        };
        if self.floor[s].max(offset) > room {
            return false;
        }
        // `live` is NONE for a placed block, which is never at or below `room`.
        if self.live.get(self.hint[s]).is_some_and(|&m| m <= room) {
            return true;
        }
        match self.shape.section_items[s]
            .iter()
            .copied()
            .find(|&j| self.live[j] <= room)
        {
            Some(j) => {
                self.hint[s] = j;
                true
            }
            None => false,
        }
    }

    fn dfs(
        &mut self,
        pre: &[usize],
        range: (usize, usize),
        last_offset: u64,
        last_rank: usize,
    ) -> Status {
        self.nodes += 1;
        if self.nodes > self.limit {
            return Status::Aborted;
        }
        if self.nodes % 256 == 0 {
            if let Some(d) = self.deadline {
                if Instant::now() >= d {
                    self.deadline_hit = true;
                    return Status::Aborted;
                }
            }
        }
        // One pass: the least height any unplaced block can reach, and the blocks that may go
        // next (canonical: non-decreasing offsets, ties in preorder; below the capacity).
        let mut candidates = self.spare.pop().unwrap_or_default();
        candidates.clear();
        let mut min_height = NONE;
        let size = &self.shape.size;
        for (r, &i) in pre.iter().enumerate() {
            let offset = self.live[i];
            if offset == NONE {
                continue;
            }
            let height = offset + size[i];
            min_height = min_height.min(height);
            if (offset > last_offset || (offset == last_offset && r >= last_rank))
                && height <= self.capacity
            {
                candidates.push((offset, r));
            }
        }
        if min_height == NONE {
            self.spare.push(candidates);
            return Status::Found;
        }
        // Dominance: a block at or above `min_height` leaves a gap another block fills.
        candidates.retain(|&(offset, _)| offset < min_height);
        // Only the candidates that can be tried are sorted.
        candidates.sort_unstable();
        let status = self.branch(pre, range, &candidates);
        self.spare.push(candidates);
        status
    }

    /// Tries each candidate `(minimal offset, rank)` of a node in turn, in sorted order.
    fn branch(
        &mut self,
        pre: &[usize],
        range: (usize, usize),
        candidates: &[(u64, usize)],
    ) -> Status {
        // Every later placement is at or above the next one's offset, so every section's
        // unplaced blocks stack above it: an offset above `cap - the largest unplaced total`
        // fails, and so does every candidate after it (sorted by offset). This also covers the
        // sections under the placed block (its top plus their remaining total is the same sum).
        let largest = self.total[range.0..range.1]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let Some(highest) = self.capacity.checked_sub(largest) else {
            return Status::NotFound;
        };
        for &(offset, r) in candidates {
            if offset > highest {
                break;
            }
            let i = pre[r];
            let marks = (self.undo_min.len(), self.undo_floor.len());
            let changed = self.place(i, offset);
            let (lo, hi) = (changed.0.max(range.0), changed.1.min(range.1));
            // Only the sections whose blocks moved or left can have stopped fitting.
            let status = if (lo..hi).all(|s| self.section_fits(s, offset)) {
                self.decompose(pre, range, offset, r, i)
            } else {
                Status::NotFound
            };
            self.unplace(i, marks);
            if status != Status::NotFound {
                return status;
            }
            // Nothing unplaced overlaps it: if the rest fails with it here, it fails with any
            // other candidate first, too ("hatless" pruning). Asked only on failure, after the
            // undo, when the same blocks as during the try are placed but for `i` itself.
            if self.shape.overlaps[i].iter().all(|&j| self.live[j] == NONE) {
                return status;
            }
        }
        Status::NotFound
    }

    /// After placing `i`: where no unplaced block crosses a section boundary any more, the two
    /// sides are independent problems, each solved on its own (dynamic decomposition).
    fn decompose(
        &mut self,
        pre: &[usize],
        range: (usize, usize),
        offset: u64,
        r: usize,
        i: usize,
    ) -> Status {
        self.solution[i] = offset;
        let (lo, hi) = (self.shape.sec_lo[i], self.shape.sec_hi[i]);
        let mut cut = false;
        for c in &mut self.cuts[lo..hi - 1] {
            *c -= 1;
            cut |= *c == 0;
        }
        // Most nodes cut nothing: only those that do build the list of cutpoints.
        let status = if cut {
            let mut cutpoints = vec![range.0];
            cutpoints.extend((lo..hi - 1).filter(|&s| self.cuts[s] == 0).map(|s| s + 1));
            cutpoints.push(range.1);
            self.split(pre, &cutpoints)
        } else {
            self.dfs(pre, range, offset, r)
        };
        for c in &mut self.cuts[lo..hi - 1] {
            *c += 1;
        }
        status
    }

    /// Places `i` at `offset`. Returns a range of sections holding every section whose unplaced
    /// blocks changed (it left, or their minimal offsets rose).
    fn place(&mut self, i: usize, offset: u64) -> (usize, usize) {
        let shape = self.shape;
        let size = self.items[i].size;
        let height = offset + size;
        self.offset[i] = offset;
        self.live[i] = NONE;
        let (mut lo, mut hi) = (shape.sec_lo[i], shape.sec_hi[i]);
        for &j in &shape.overlaps[i] {
            // `live` is NONE for a placed block.
            if self.live[j] < height {
                let m = if shape.obstacles[j].is_empty() {
                    height
                } else {
                    shape.clear_of_fixed(j, height)
                };
                self.undo_min.push((j, self.min_offset[j]));
                self.min_offset[j] = m;
                self.live[j] = m;
                lo = lo.min(shape.sec_lo[j]);
                hi = hi.max(shape.sec_hi[j]);
            }
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.undo_floor.push((s, self.floor[s]));
            self.floor[s] = height;
            self.total[s] -= size;
        }
        (lo, hi)
    }

    fn unplace(&mut self, i: usize, marks: (usize, usize)) {
        let shape = self.shape;
        let size = self.items[i].size;
        let (min_mark, floor_mark) = marks;
        while self.undo_floor.len() > floor_mark {
            let (s, f) = self.undo_floor.pop().expect("non-empty");
            self.floor[s] = f;
        }
        while self.undo_min.len() > min_mark {
            let (j, m) = self.undo_min.pop().expect("non-empty");
            self.min_offset[j] = m;
            self.live[j] = m;
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.total[s] += size;
        }
        self.offset[i] = NONE;
        self.live[i] = self.min_offset[i];
    }
}
