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

mod decision;
mod shape;

use std::time::{Duration, Instant};

use self::decision::{Search, Status};
use self::shape::Shape;
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
    // The search's tables hold every pair of blocks live together (and each block once per
    // section it spans): past MAX_PAIRS the incumbent stands, unproven, rather than the
    // tables taking gigabytes.
    let (deadline, mut nodes_left) = match budget {
        Budget::Time(d) => (start.checked_add(d), u64::MAX),
        Budget::Nodes(n) => (None, n),
    };
    // Past the deadline already (the heuristics took the budget): not even the tables are
    // built.
    if outcome.optimal
        || deadline.is_some_and(|d| Instant::now() >= d)
        || overlapping_pairs(items) > MAX_PAIRS
    {
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
