//! The exact strategy: a branch and bound over canonical placements, in the spirit of
//! MiniMalloc (Moffitt, ASPLOS 2023).
//!
//! The search answers a decision question, "does every block fit below `capacity`?", and an
//! outer loop turns it into minimisation: it starts from the best heuristic arena (the
//! incumbent) and the lower bound, asks at the lower bound first (a yes there is proven
//! optimal), then takes two bisection steps between the bound and the best arena found, with
//! a node limit per question that doubles each round, until the two meet or the [`Budget`]
//! runs out.
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
//! * **Hatless pruning.** If nothing unplaced overlaps the block just placed and the rest
//!   fails, it fails with any other candidate first too: no alternatives are tried.
//! * **Dynamic decomposition.** Once no unplaced block crosses a section boundary, the two
//!   sides are independent problems and are solved one after the other (each with its own
//!   canonical order), instead of searching their interleavings.
//! * **Ordering.** Candidates in order of minimal offset, ties by a static preorder; three
//!   preorders (MiniMalloc's WAT, TAW, TWA: lifetime width, area, largest section total) take
//!   turns at each node limit.
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
/// A section witness meaning no unplaced block is left there.
const EMPTY: usize = usize::MAX;

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
}

/// One decision search: a capacity, a preorder heuristic, a node limit.
#[derive(Debug)]
struct Search<'a> {
    items: &'a [Item],
    shape: &'a Shape,
    capacity: u64,
    /// Which preorder (0: width, area, total; 1: total, area, width; 2: total, width, area).
    heuristic: usize,
    offset: Vec<u64>,
    solution: Vec<u64>,
    min_offset: Vec<u64>,
    /// `min_offset` of unplaced blocks, `NONE` for placed ones: one load per block in a rescan.
    live: Vec<u64>,
    floor: Vec<u64>,
    total: Vec<u64>,
    /// Unplaced blocks crossing the boundary between section `s` and `s + 1`.
    cuts: Vec<u32>,
    undo_min: Vec<(usize, u64)>,
    undo_floor: Vec<(usize, u64)>,
    /// Per section, an unplaced block with the least minimal offset there, as of some state on
    /// the current path ([`EMPTY`] once none is left), and that offset. Along a path minimal
    /// offsets only rise and blocks only leave, so while the witness is unplaced at the same
    /// offset it is still the least and the section need not be rescanned.
    witness: Vec<(usize, u64)>,
    undo_witness: Vec<(usize, (usize, u64))>,
    /// Per section, the block a rescan last found at or below the floor: tried first next time.
    /// Only a hint (any unplaced block at or below the floor settles the question), so it is
    /// not undone.
    hint: Vec<usize>,
    /// Candidate buffers, one per depth, reused so the search does not allocate per node.
    spare: Vec<Vec<(u64, usize)>>,
    nodes: u64,
    limit: u64,
    deadline: Option<Instant>,
    deadline_hit: bool,
}

impl<'a> Search<'a> {
    fn new(
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
            min_offset: vec![0; items.len()],
            live: vec![0; items.len()],
            floor: vec![0; sections],
            total: shape.totals.clone(),
            cuts,
            undo_min: Vec::new(),
            undo_floor: Vec::new(),
            witness: shape
                .section_items
                .iter()
                .map(|v| (v.first().copied().unwrap_or(EMPTY), 0))
                .collect(),
            undo_witness: Vec::new(),
            hint: vec![EMPTY; sections],
            spare: Vec::new(),
            nodes: 0,
            limit,
            deadline,
            deadline_hit: false,
        }
    }

    fn run(&mut self) -> Status {
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

    fn check(&self, range: (usize, usize), offset: u64) -> bool {
        self.floor[range.0..range.1]
            .iter()
            .zip(&self.total[range.0..range.1])
            .all(|(&f, &t)| f.max(offset) + t <= self.capacity)
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
        let unplaced = pre.iter().copied().filter(|&i| self.offset[i] == NONE);
        let Some(min_height) = unplaced
            .map(|i| self.min_offset[i] + self.items[i].size)
            .min()
        else {
            return Status::Found;
        };
        // Only the candidates that can be tried are sorted.
        let mut candidates = self.spare.pop().unwrap_or_default();
        candidates.clear();
        candidates.extend(
            pre.iter()
                .enumerate()
                .filter(|&(r, &i)| {
                    let offset = self.min_offset[i];
                    self.offset[i] == NONE
                        // Dominance: a block at or above `min_height` leaves a gap another
                        // block fills.
                        && offset < min_height
                        // Canonical: non-decreasing offsets, ties in preorder.
                        && (offset > last_offset || (offset == last_offset && r >= last_rank))
                        && offset + self.items[i].size <= self.capacity
                })
                .map(|(r, &i)| (self.min_offset[i], r)),
        );
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
        for &(offset, r) in candidates {
            let i = pre[r];
            let marks = (
                self.undo_min.len(),
                self.undo_floor.len(),
                self.undo_witness.len(),
            );
            self.place(i, offset);
            // Nothing above it had to move: if the rest fails with it here, it fails with any
            // other candidate first, too ("hatless" pruning).
            let hatless = self.shape.overlaps[i]
                .iter()
                .all(|&j| self.offset[j] != NONE);
            let status = if self.check(range, offset) {
                self.decompose(pre, range, offset, r, i)
            } else {
                Status::NotFound
            };
            self.unplace(i, marks);
            if status != Status::NotFound || hatless {
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

    fn place(&mut self, i: usize, offset: u64) {
        let shape = self.shape;
        let size = self.items[i].size;
        let height = offset + size;
        self.offset[i] = offset;
        self.live[i] = NONE;
        // The sections whose floor may rise: the span of the blocks whose minimal offset rose
        // (a superset of their union; the inference holds for any section).
        let (mut lo, mut hi) = (usize::MAX, 0);
        for &j in &shape.overlaps[i] {
            if self.offset[j] == NONE && self.min_offset[j] < height {
                self.undo_min.push((j, self.min_offset[j]));
                self.min_offset[j] = height;
                self.live[j] = height;
                lo = lo.min(shape.sec_lo[j]);
                hi = hi.max(shape.sec_hi[j]);
            }
        }
        for s in shape.sec_lo[i]..shape.sec_hi[i] {
            self.undo_floor.push((s, self.floor[s]));
            self.floor[s] = height;
            self.total[s] -= size;
        }
        // The floor of a section is at least the least minimal offset of its unplaced blocks.
        for s in lo..hi {
            self.raise_floor(s);
        }
    }

    /// Raises the floor of section `s` to the least minimal offset of its unplaced blocks (if
    /// below it). Rescans the section only when its witness has been placed or has risen above
    /// the floor, and stops a rescan at the first unplaced block at or below the floor or at the
    /// old least.
    fn raise_floor(&mut self, s: usize) {
        let (w, at) = self.witness[s];
        if w == EMPTY {
            return;
        }
        let floor = self.floor[s];
        let least = if self.live[w] == at {
            at
        } else if self.live[w] <= floor {
            // `w` is unplaced at or below the floor: so is the least.
            return;
        } else if self.live.get(self.hint[s]).is_some_and(|&m| m <= floor) {
            return;
        } else {
            let mut best = (EMPTY, NONE);
            for &j in &self.shape.section_items[s] {
                let m = self.live[j];
                if m <= floor {
                    self.hint[s] = j;
                    return;
                }
                if m < best.1 {
                    best = (j, m);
                    // The old least is a lower bound (offsets only rose since): it is the least.
                    if m == at {
                        break;
                    }
                }
            }
            self.undo_witness.push((s, (w, at)));
            self.witness[s] = best;
            if best.0 == EMPTY {
                return;
            }
            best.1
        };
        if floor < least {
            self.undo_floor.push((s, floor));
            self.floor[s] = least;
        }
    }

    fn unplace(&mut self, i: usize, marks: (usize, usize, usize)) {
        let shape = self.shape;
        let size = self.items[i].size;
        let (min_mark, floor_mark, witness_mark) = marks;
        while self.undo_witness.len() > witness_mark {
            let (s, w) = self.undo_witness.pop().expect("non-empty");
            self.witness[s] = w;
        }
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
    let mut proven = lower.div_ceil(align) * align;
    let mut limit = (2 * items.len() as u64).max(256);
    // The bisection's tentative bottom: above `proven` once a question there ran out of nodes.
    let mut lo = proven;
    'rounds: while proven < best_arena {
        // Each round: the question at the proven bound with the round's limit, then two
        // bisection steps between the tentative bottom and the best arena with a quarter of it
        // (they mostly improve the incumbent when the bound is out of reach). The limit doubles
        // each round, as in MiniMalloc's round robin.
        for step in 0..3 {
            let capacity = if step == 0 {
                proven
            } else if lo < best_arena {
                lo + (best_arena - lo) / align / 2 * align
            } else {
                break;
            };
            let attempt_limit = if step == 0 {
                limit
            } else {
                (limit / 4).max(64)
            };
            let mut answer = Status::Aborted;
            for heuristic in 0..3 {
                let mut s = Search::new(
                    items,
                    &shape,
                    heuristic,
                    capacity,
                    attempt_limit.min(nodes_left),
                    deadline,
                );
                let status = s.run();
                nodes_left -= s.nodes.min(nodes_left);
                outcome.nodes += s.nodes;
                if status == Status::Found {
                    outcome.offsets.clone_from(&s.solution);
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
                Status::Found => {}
                Status::NotFound => {
                    proven = proven.max(capacity + align);
                    lo = lo.max(proven);
                }
                Status::Aborted => lo = lo.max(capacity + align),
            }
            if proven >= best_arena {
                break 'rounds;
            }
        }
        if lo >= best_arena {
            lo = proven;
        }
        limit = limit.saturating_mul(2);
    }
    outcome.arena = best_arena;
    outcome.optimal = proven >= best_arena;
    outcome
}
