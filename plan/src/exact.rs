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
//! A node's candidates are tried in offset order, and the cost of a try is kept to what it
//! changed: an offset above the capacity less the largest unplaced section total ends the node
//! (every later candidate is higher), and after a placement only the sections whose unplaced
//! blocks moved or left are checked again.
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
//! Pre-placed (fixed) blocks are obstacles: a block's minimal offset is the least one at or
//! above the top of the placed blocks where it clears every fixed block it is live with. The
//! canonical argument still holds in the form "no block can move to a lower free position",
//! where a block may rest on a fixed block or jump into a gap below one. The inference ignores
//! the room fixed blocks take (a weaker bound, still a bound).

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
/// No block (a section with no hint).
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
    /// Each block's size, packed for the scans.
    size: Vec<u64>,
    /// Per block, the fixed blocks live with it, as `(offset, size)` in offset order: it
    /// must go around them.
    obstacles: Vec<Vec<(u64, u64)>>,
}

impl Shape {
    fn new(items: &[Item], obstacles: Vec<Vec<(u64, u64)>>) -> Self {
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
    fn clear_of_fixed(&self, i: usize, mut at: u64) -> u64 {
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
    /// Per section, the unplaced block a scan last found low enough for the section's unplaced
    /// blocks to fit above it: tried first next time. Only a hint (any such block settles the
    /// question), so it is not undone.
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

/// Improves on `incumbent` (offsets of a valid plan) until the arena meets `lower` or the budget
/// runs out.
/// The most pairs of blocks live together a problem may have for the exact search to run:
/// its tables grow with them (a pair costs two indices, 16 bytes).
pub(crate) const MAX_PAIRS: u64 = 8 << 20;

/// How many pairs of `items` are live at a common step, counted in O(n log n) without
/// building them (stopping once past [`MAX_PAIRS`]).
pub(crate) fn overlapping_pairs(items: &[Item]) -> u64 {
    let mut firsts: Vec<u32> = items.iter().map(|it| it.first).collect();
    firsts.sort_unstable();
    let mut pairs = 0u64;
    for it in items {
        // Items that start within this one's life, after it in the order (or equal): each
        // overlapping pair is counted once, by the one that starts first (ties both ways,
        // so up to twice: an upper bound is all that is needed).
        let from = firsts.partition_point(|&f| f < it.first);
        let to = firsts.partition_point(|&f| f <= it.last);
        pairs = pairs.saturating_add((to - from).saturating_sub(1) as u64);
        if pairs > MAX_PAIRS {
            break;
        }
    }
    pairs
}

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
    // The search's tables hold every pair of blocks live together (and each block once per
    // section it spans): past MAX_PAIRS the incumbent stands, unproven, rather than the
    // tables taking gigabytes.
    if outcome.optimal || overlapping_pairs(items) > MAX_PAIRS {
        return outcome;
    }
    // The search places the free blocks; fixed ones are obstacles they go around.
    let free: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].fixed.is_none())
        .collect();
    let fixed: Vec<(u64, Item)> = items
        .iter()
        .filter_map(|it| it.fixed.map(|o| (o, *it)))
        .collect();
    let sub: Vec<Item> = free.iter().map(|&i| items[i]).collect();
    let obstacles = sub
        .iter()
        .map(|it| {
            let mut v: Vec<(u64, u64)> = fixed
                .iter()
                .filter(|(_, f)| f.overlaps(it))
                .map(|&(o, f)| (o, f.size))
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    let fixed_top = fixed.iter().map(|(o, f)| o + f.size).max().unwrap_or(0);
    let with = |solution: &[u64]| -> Vec<u64> {
        let mut offsets: Vec<u64> = items.iter().map(|it| it.fixed.unwrap_or(0)).collect();
        for (k, &i) in free.iter().enumerate() {
            offsets[i] = solution[k];
        }
        offsets
    };
    let (deadline, mut nodes_left) = match budget {
        Budget::Time(d) => (Some(start + d), u64::MAX),
        Budget::Nodes(n) => (None, n),
    };
    let shape = Shape::new(&sub, obstacles);
    // No arena ends below a fixed block's end.
    let mut proven = lower.max(fixed_top).div_ceil(align) * align;
    let mut limit = (2 * sub.len() as u64).max(256);
    // The bisection's tentative bottom within a round: above `proven` once a question there ran
    // out of nodes.
    let mut lo = proven;
    'rounds: while proven < best_arena {
        // Each round: the question at the proven bound with the round's limit, then two
        // bisection steps between the tentative bottom and the best arena with half of it
        // (they mostly improve the incumbent when the bound is out of reach). The limit doubles
        // each round, as in MiniMalloc's round robin, and the tentative bottom falls back to
        // the proven bound: a question that ran out of nodes in one round may not in the next,
        // and keeping it raised made the later rounds creep down by a few alignment steps.
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
                (limit / 2).max(64)
            };
            let mut answer = Status::Aborted;
            for heuristic in 0..3 {
                let mut s = Search::new(
                    &sub,
                    &shape,
                    heuristic,
                    capacity,
                    attempt_limit.min(nodes_left),
                    deadline,
                );
                let status = s.run();
                if std::env::var_os("PLAN_TRACE").is_some() {
                    eprintln!("step {step} cap {capacity} h {heuristic} limit {} -> {:?} nodes {} best {best_arena} t {:?}", attempt_limit.min(nodes_left), status, s.nodes, start.elapsed());
                }
                nodes_left -= s.nodes.min(nodes_left);
                outcome.nodes += s.nodes;
                if status == Status::Found {
                    outcome.offsets = with(&s.solution);
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
        lo = proven;
        limit = limit.saturating_mul(2);
    }
    outcome.arena = best_arena;
    outcome.optimal = proven >= best_arena;
    outcome
}
