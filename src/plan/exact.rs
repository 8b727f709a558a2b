//! The exact strategy: a branch and bound over canonical placements, in the spirit of
//! MiniMalloc (Moffitt, ASPLOS 2023).
//!
//! The search answers a decision question, "does every block fit below `capacity`?", and an
//! outer loop turns it into minimisation: it starts from the best heuristic arena (the
//! incumbent) and the lower bound, asks at the lower bound first (a yes there is proven
//! optimal), then bisects between what is proven infeasible and the best arena found, with a
//! node limit per question that grows by 4× each round, until the two meet or the
//! [`Budget`] runs out.
//!
//! The decision search (facts from the MiniMalloc paper, not its code):
//! * **Canonical placements.** Every block goes at its *minimal offset*: the top of the placed
//!   blocks that overlap it in time. Blocks are placed in non-decreasing offset order (ties by
//!   a static preorder), so each solution is reached once.
//! * **Dominance.** A candidate whose minimal offset is at or above the lowest height any
//!   unplaced block could reach (`min_offset + size`) would leave a gap that block fills; it is
//!   skipped (and so are all after it, as candidates are sorted by offset).
//! * **Cross-section inference.** Time is cut into sections where the set of live blocks is
//!   constant. In each, the unplaced blocks all overlap one another, so they stack: the
//!   section's floor (the top of its placed blocks, at least the current offset and at least
//!   the least minimal offset of its unplaced blocks) plus the sum of its unplaced sizes must
//!   fit in the capacity, or the branch is cut.
//! * **Ordering.** Candidates in order of minimal offset, ties by a static preorder; three
//!   preorders (by section total, size and area in three orders) take turns at each node limit.
//!
//! Deterministic: the same input and a [`Budget::Nodes`] budget give the same plan. A
//! [`Budget::Time`] budget cuts the search where the clock says.
//!
//! Pre-placed (fixed) blocks break the canonical argument; a problem with any is not searched
//! (the incumbent is returned, optimal only if it meets the lower bound).

use std::time::{Duration, Instant};

use super::heuristics::arena;
use super::problem::Item;

/// How long the search may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Wall-clock time from the start of planning.
    Time(Duration),
    /// Search nodes in all; reproducible on any machine.
    Nodes(u64),
}

impl Default for Budget {
    /// One second.
    fn default() -> Self {
        Self::Time(Duration::from_secs(1))
    }
}

/// The search's answer.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) offsets: Vec<u64>,
    pub(crate) arena: u64,
    /// Proven: no arena below `arena` exists.
    pub(crate) optimal: bool,
    /// Whether the search found a better arena than the incumbent.
    pub(crate) improved: bool,
    /// Search nodes visited.
    pub(crate) nodes: u64,
}

const NONE: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Aborted,
}

/// What the search knows about the instance, independent of capacity and preorder.
#[derive(Debug)]
struct Shape {
    sec_lo: Vec<usize>,
    sec_hi: Vec<usize>,
    section_items: Vec<Vec<usize>>,
    overlaps: Vec<Vec<usize>>,
    /// The initial sum of sizes per section.
    totals: Vec<u64>,
}

impl Shape {
    fn new(items: &[Item]) -> Self {
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
        }
    }

    /// The three static preorders (MiniMalloc's letters: T total, Z size, A area).
    fn preorders(&self, items: &[Item]) -> [Vec<usize>; 3] {
        let total: Vec<u64> = (0..items.len())
            .map(|i| {
                (self.sec_lo[i]..self.sec_hi[i])
                    .map(|s| self.totals[s])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let area =
            |i: usize| u128::from(items[i].size) * u128::from(items[i].last - items[i].first + 1);
        let base: Vec<usize> = (0..items.len()).collect();
        let mut zat = base.clone();
        zat.sort_by_key(|&i| {
            (
                std::cmp::Reverse(items[i].size),
                std::cmp::Reverse(area(i)),
                std::cmp::Reverse(total[i]),
                i,
            )
        });
        let mut taz = base.clone();
        taz.sort_by_key(|&i| {
            (
                std::cmp::Reverse(total[i]),
                std::cmp::Reverse(area(i)),
                std::cmp::Reverse(items[i].size),
                i,
            )
        });
        let mut tza = base;
        tza.sort_by_key(|&i| {
            (
                std::cmp::Reverse(total[i]),
                std::cmp::Reverse(items[i].size),
                std::cmp::Reverse(area(i)),
                i,
            )
        });
        [zat, taz, tza]
    }
}

/// One decision search: a capacity, a preorder, a node limit.
#[derive(Debug)]
struct Search<'a> {
    items: &'a [Item],
    shape: &'a Shape,
    capacity: u64,
    /// Preorder position to block.
    pre: &'a [usize],
    offset: Vec<u64>,
    min_offset: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    undo_min: Vec<(usize, u64)>,
    undo_floor: Vec<(usize, u64)>,
    stamp: Vec<u32>,
    generation: u32,
    affected: Vec<usize>,
    nodes: u64,
    limit: u64,
    deadline: Option<Instant>,
    deadline_hit: bool,
}

impl<'a> Search<'a> {
    fn new(
        items: &'a [Item],
        shape: &'a Shape,
        pre: &'a [usize],
        capacity: u64,
        limit: u64,
        deadline: Option<Instant>,
    ) -> Self {
        Self {
            items,
            shape,
            capacity,
            pre,
            offset: vec![NONE; items.len()],
            min_offset: vec![0; items.len()],
            floor: vec![0; shape.totals.len()],
            total: shape.totals.clone(),
            undo_min: Vec::new(),
            undo_floor: Vec::new(),
            stamp: vec![0; shape.totals.len()],
            generation: 0,
            affected: Vec::new(),
            nodes: 0,
            limit,
            deadline,
            deadline_hit: false,
        }
    }

    fn run(&mut self) -> Status {
        if self.check(0) {
            self.dfs(0, 0, self.items.len())
        } else {
            Status::NotFound
        }
    }

    fn check(&self, offset: u64) -> bool {
        self.floor
            .iter()
            .zip(&self.total)
            .all(|(&f, &t)| f.max(offset) + t <= self.capacity)
    }

    fn dfs(&mut self, last_offset: u64, last_rank: usize, remaining: usize) -> Status {
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
        if remaining == 0 {
            return Status::Found;
        }
        let mut candidates: Vec<(u64, usize)> = self
            .pre
            .iter()
            .enumerate()
            .filter(|&(_, &i)| self.offset[i] == NONE)
            .map(|(r, &i)| (self.min_offset[i], r))
            .collect();
        candidates.sort_unstable();
        let min_height = candidates
            .iter()
            .map(|&(o, r)| o + self.items[self.pre[r]].size)
            .min()
            .unwrap_or(NONE);
        for &(offset, r) in &candidates {
            if offset >= min_height {
                break;
            }
            if offset < last_offset || (offset == last_offset && r < last_rank) {
                continue;
            }
            let i = self.pre[r];
            let height = offset + self.items[i].size;
            if height > self.capacity {
                continue;
            }
            let (min_mark, floor_mark) = (self.undo_min.len(), self.undo_floor.len());
            self.place(i, offset);
            // Nothing above it had to move: if the rest fails with it here, it fails with any
            // other candidate first, too ("hatless" pruning).
            let hatless = self.undo_min.len() == min_mark;
            let status = if self.check(offset) {
                self.dfs(offset, r, remaining - 1)
            } else {
                Status::NotFound
            };
            if status == Status::Found {
                return status;
            }
            self.unplace(i, min_mark, floor_mark);
            if status == Status::Aborted || hatless {
                return status;
            }
        }
        Status::NotFound
    }

    fn place(&mut self, i: usize, offset: u64) {
        let shape = self.shape;
        let size = self.items[i].size;
        let height = offset + size;
        self.offset[i] = offset;
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.generation = 1;
        }
        self.affected.clear();
        for &j in &shape.overlaps[i] {
            if self.offset[j] == NONE && self.min_offset[j] < height {
                self.undo_min.push((j, self.min_offset[j]));
                self.min_offset[j] = height;
                for s in shape.sec_lo[j]..shape.sec_hi[j] {
                    if self.stamp[s] != self.generation {
                        self.stamp[s] = self.generation;
                        self.affected.push(s);
                    }
                }
            }
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.undo_floor.push((s, self.floor[s]));
            self.floor[s] = height;
            self.total[s] -= size;
        }
        // The floor of a section is at least the least minimal offset of its unplaced blocks.
        for k in 0..self.affected.len() {
            let s = self.affected[k];
            let least = shape.section_items[s]
                .iter()
                .filter(|&&j| self.offset[j] == NONE)
                .map(|&j| self.min_offset[j])
                .min();
            if let Some(least) = least {
                if self.floor[s] < least {
                    self.undo_floor.push((s, self.floor[s]));
                    self.floor[s] = least;
                }
            }
        }
    }

    fn unplace(&mut self, i: usize, min_mark: usize, floor_mark: usize) {
        let shape = self.shape;
        let size = self.items[i].size;
        while self.undo_floor.len() > floor_mark {
            let (s, f) = self.undo_floor.pop().expect("non-empty");
            self.floor[s] = f;
        }
        while self.undo_min.len() > min_mark {
            let (j, m) = self.undo_min.pop().expect("non-empty");
            self.min_offset[j] = m;
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.total[s] += size;
        }
        self.offset[i] = NONE;
    }
}

/// Test hook: one decision search at `capacity` with preorder `which` (0..3); returns
/// (found, nodes).
#[doc(hidden)]
pub fn probe(
    tensors: &[super::Tensor],
    capacity: u64,
    which: usize,
    limit: u64,
) -> (Option<bool>, u64) {
    let problem = super::Problem::new(tensors, &super::Options::default()).expect("valid");
    let items = &problem.items;
    let shape = Shape::new(items);
    let pre = shape.preorders(items);
    let mut s = Search::new(items, &shape, &pre[which], capacity, limit, None);
    let status = s.run();
    let found = match status {
        Status::Found => Some(true),
        Status::NotFound => Some(false),
        Status::Aborted => None,
    };
    (found, s.nodes)
}

/// Improves on `incumbent` (offsets of a valid plan) until the arena meets `lower` or the budget
/// runs out.
pub(crate) fn search(
    items: &[Item],
    align: u64,
    lower: u64,
    incumbent: Vec<u64>,
    budget: Budget,
    start: Instant,
) -> Outcome {
    let mut best_arena = arena(items, &incumbent);
    let mut outcome = Outcome {
        offsets: incumbent,
        arena: best_arena,
        optimal: best_arena <= lower,
        improved: false,
        nodes: 0,
    };
    if outcome.optimal || items.iter().any(|it| it.fixed.is_some()) {
        return outcome;
    }
    let (deadline, mut nodes_left) = match budget {
        Budget::Time(d) => (Some(start + d), u64::MAX),
        Budget::Nodes(n) => (None, n),
    };
    let shape = Shape::new(items);
    let preorders = shape.preorders(items);
    let mut proven = lower.div_ceil(align) * align;
    let mut limit = (4 * items.len() as u64).max(1024);
    'rounds: while proven < best_arena {
        let (mut lo, mut hi) = (proven, best_arena);
        let mut first = true;
        while lo < hi {
            let capacity = if first {
                lo
            } else {
                lo + (hi - lo) / align / 2 * align
            };
            first = false;
            let mut answer = Status::Aborted;
            for pre in &preorders {
                let mut s = Search::new(
                    items,
                    &shape,
                    pre,
                    capacity,
                    limit.min(nodes_left),
                    deadline,
                );
                let status = s.run();
                nodes_left -= s.nodes.min(nodes_left);
                outcome.nodes += s.nodes;
                if status == Status::Found {
                    outcome.offsets.clone_from(&s.offset);
                    best_arena = arena(items, &outcome.offsets);
                    outcome.improved = true;
                    answer = status;
                    break;
                }
                if status == Status::NotFound {
                    answer = status;
                    break;
                }
                if s.deadline_hit || nodes_left == 0 {
                    break 'rounds;
                }
            }
            match answer {
                Status::Found => hi = best_arena,
                Status::NotFound => {
                    lo = capacity + align;
                    proven = proven.max(lo);
                }
                Status::Aborted => lo = capacity + align,
            }
        }
        limit = limit.saturating_mul(4);
    }
    outcome.arena = best_arena;
    outcome.optimal = proven >= best_arena;
    outcome
}
