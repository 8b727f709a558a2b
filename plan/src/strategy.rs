//! The strategies, one entry point ([`plan`]) and a comparison of all of them in one run
//! ([`compare`]).

use std::fmt;
use std::str::FromStr;
use std::time::Instant;

use super::arena::{Placement, Plan};
use super::exact::{self, Budget};
use super::heuristics::{self, arena};
use super::problem::{Options, Problem};
use super::{Error, Tensor};

/// How to place the tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Conflict graph and greedy colouring: tensors share whole buffers.
    Colour,
    /// TFLite's arena planner: non-increasing size, smallest fitting gap.
    GreedySize,
    /// In production order, the lowest fitting offset.
    FirstFit,
    /// Online best fit (ONNX Runtime's memory-pattern style).
    BestFit,
    /// Branch and bound from the best heuristic, to the lower bound or the budget.
    Exact,
    /// Every heuristic, then the search; the plan names the winner.
    #[default]
    Auto,
}

impl Strategy {
    /// Every strategy, in the order [`compare`] runs them.
    pub const ALL: [Strategy; 6] = [
        Strategy::Colour,
        Strategy::GreedySize,
        Strategy::FirstFit,
        Strategy::BestFit,
        Strategy::Exact,
        Strategy::Auto,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Colour => "colour",
            Strategy::GreedySize => "greedy-size",
            Strategy::FirstFit => "first-fit",
            Strategy::BestFit => "best-fit",
            Strategy::Exact => "exact",
            Strategy::Auto => "auto",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown strategy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown strategy {0:?} (colour, greedy-size, first-fit, best-fit, exact, auto)")]
pub struct UnknownStrategy(pub String);

impl FromStr for Strategy {
    type Err = UnknownStrategy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "colour" | "color" => Strategy::Colour,
            "greedy-size" => Strategy::GreedySize,
            "first-fit" => Strategy::FirstFit,
            "best-fit" => Strategy::BestFit,
            "exact" => Strategy::Exact,
            "auto" => Strategy::Auto,
            _ => return Err(UnknownStrategy(s.to_owned())),
        })
    }
}

/// Offsets per block from one strategy, with the colour buffers.
#[derive(Debug, Clone)]
struct Raw {
    strategy: Strategy,
    offsets: Vec<u64>,
    buffers: Vec<u64>,
    optimal: bool,
}

/// One heuristic's offsets, or `None` if `deadline` passed first.
fn heuristic(problem: &Problem, strategy: Strategy, deadline: Option<Instant>) -> Option<Raw> {
    let items = &problem.items;
    let (offsets, buffers) = match strategy {
        Strategy::Colour => heuristics::colour(items, problem.align, deadline)?,
        Strategy::GreedySize => (heuristics::greedy_size(items, deadline)?, Vec::new()),
        Strategy::FirstFit => (heuristics::first_fit(items, deadline)?, Vec::new()),
        _ => (heuristics::best_fit(items, deadline)?, Vec::new()),
    };
    let optimal = arena(items, &offsets) <= problem.lower_bound.bytes;
    Some(Raw {
        strategy,
        offsets,
        buffers,
        optimal,
    })
}

/// The heuristics in tie-break order: the first of equal arenas wins.
const HEURISTICS: [Strategy; 4] = [
    Strategy::GreedySize,
    Strategy::BestFit,
    Strategy::FirstFit,
    Strategy::Colour,
];

/// The heuristic the search always waits for, so it has a plan to start from: best fit
/// sweeps the blocks in time order, its cost growing with the gaps among the live blocks
/// rather than with every pair of them. The others may give up at the search's deadline (they
/// take up to n² / 2 steps when every block is live with every other).
const FALLBACK: Strategy = Strategy::BestFit;

/// When a time budget runs out, if it can be told.
fn deadline(budget: Budget, start: Instant) -> Option<Instant> {
    match budget {
        Budget::Time(d) => start.checked_add(d),
        Budget::Nodes(_) => None,
    }
}

/// The search from the best of `heuristics` (in [`HEURISTICS`] order, the first of equal
/// arenas), named `Exact` if `strategy` is, or if it improved on them.
fn search_from(
    problem: &Problem,
    strategy: Strategy,
    heuristics: &[&Raw],
    budget: Budget,
    start: Instant,
) -> Option<Raw> {
    let items = &problem.items;
    let best = heuristics
        .iter()
        .copied()
        .min_by_key(|raw| arena(items, &raw.offsets))?;
    let out = exact::search(
        items,
        problem.align,
        problem.lower_bound.bytes,
        best.offsets.clone(),
        budget,
        start,
    );
    let winner = if strategy == Strategy::Exact || out.improved {
        Strategy::Exact
    } else {
        best.strategy
    };
    Some(Raw {
        strategy: winner,
        offsets: out.offsets,
        buffers: if winner == Strategy::Colour {
            best.buffers.clone()
        } else {
            Vec::new()
        },
        optimal: out.optimal,
    })
}

/// The heuristics, then the search from the best of them (strategy `Exact`, or the winner for
/// `Auto`). Every heuristic but [`FALLBACK`] gives up at the budget's deadline.
fn searched(problem: &Problem, strategy: Strategy, budget: Budget, start: Instant) -> Raw {
    let deadline = deadline(budget, start);
    let raws: Vec<Raw> = HEURISTICS
        .iter()
        .filter_map(|&h| heuristic(problem, h, if h == FALLBACK { None } else { deadline }))
        .collect();
    let refs: Vec<&Raw> = raws.iter().collect();
    match search_from(problem, strategy, &refs, budget, start) {
        Some(raw) => raw,
        // Unreachable: the fallback always finishes. Its plan, should that ever change.
        None => heuristic(problem, FALLBACK, None).unwrap_or(Raw {
            strategy,
            offsets: Vec::new(),
            buffers: Vec::new(),
            optimal: false,
        }),
    }
}

fn finish(problem: &Problem, raw: Raw, start: Instant) -> Plan {
    let placements = (0..problem.len())
        .map(|t| Placement {
            id: problem.ids[t],
            offset: raw.offsets[problem.item_of[t]],
            bytes: problem.bytes[t],
            inplace_of: problem.inplace_of[t],
        })
        .collect();
    Plan {
        strategy: raw.strategy,
        align: problem.align,
        arena_bytes: arena(&problem.items, &raw.offsets),
        lower_bound: problem.lower_bound,
        naive_bytes: problem.naive,
        optimal: raw.optimal,
        elapsed: start.elapsed(),
        placements,
        buffers: raw.buffers,
    }
}

/// Plans an already validated problem with one strategy. `Exact` and `Auto` run the
/// heuristics first and keep to the budget (every heuristic but best fit gives up at its
/// deadline, so the search has a plan to start from); a heuristic asked for by name
/// runs to the end.
pub fn plan_problem(problem: &Problem, strategy: Strategy, budget: Budget) -> Plan {
    let start = Instant::now();
    let raw = match strategy {
        Strategy::Exact | Strategy::Auto => searched(problem, strategy, budget, start),
        h => match heuristic(problem, h, None) {
            Some(raw) => raw,
            // Unreachable: without a deadline every heuristic finishes.
            None => searched(problem, strategy, budget, start),
        },
    };
    finish(problem, raw, start)
}

/// Validates `tensors` and places them with `strategy`.
///
/// The same input, options and a [`Budget::Nodes`] budget always give the same plan.
///
/// # Errors
///
/// Bad input: see [`Error`].
pub fn plan(
    tensors: &[Tensor],
    options: &Options,
    strategy: Strategy,
    budget: Budget,
) -> Result<Plan, Error> {
    let start = Instant::now();
    let problem = Problem::new(tensors, options)?;
    let mut plan = plan_problem(&problem, strategy, budget);
    plan.elapsed = start.elapsed();
    Ok(plan)
}

/// Every strategy on one problem, in [`Strategy::ALL`] order, each with its own time. The
/// heuristics run once each and the search once, from the best of them: `exact` and `auto`
/// share that search (and its time, which includes the heuristics'), differing only in the
/// name they report. Every strategy runs to the end, so a problem where every block is live
/// with every other costs n² / 2 steps: [`compare_within`] keeps to the budget instead.
pub fn compare(problem: &Problem, budget: Budget) -> Vec<Plan> {
    run_all(problem, budget, |_| true)
        .into_iter()
        .flatten()
        .collect()
}

/// [`compare`], keeping to a time budget: `chosen` runs to the end, the other strategies only
/// while the budget lasts, from the start of the call. One the budget cuts short is `None`
/// (skipped), as are `exact` and `auto` if the budget has run out before the search starts
/// and `chosen` is a heuristic. For `exact` and `auto` the search starts from the best
/// heuristic that finished (best fit always does). A [`Budget::Nodes`] budget has no clock:
/// then every strategy runs, as in [`compare`].
pub fn compare_within(problem: &Problem, chosen: Strategy, budget: Budget) -> Vec<Option<Plan>> {
    let searching = matches!(chosen, Strategy::Exact | Strategy::Auto);
    run_all(problem, budget, |s| {
        s == chosen || (searching && s == FALLBACK)
    })
}

/// Every strategy in [`Strategy::ALL`] order; those `must` does not name give up at the
/// budget's deadline (`None`).
fn run_all(
    problem: &Problem,
    budget: Budget,
    must: impl Fn(Strategy) -> bool,
) -> Vec<Option<Plan>> {
    let start = Instant::now();
    let deadline = deadline(budget, start);
    let mut plans: Vec<Option<Plan>> = vec![None; Strategy::ALL.len()];
    let mut raws = Vec::with_capacity(4);
    // Those that must finish first, then the others cheapest first, so a budget cut skips as
    // few as it can (colour and greedy by size cost the most when many blocks are live at once).
    let mut run_order = [
        Strategy::BestFit,
        Strategy::FirstFit,
        Strategy::GreedySize,
        Strategy::Colour,
    ];
    run_order.sort_by_key(|&h| !must(h));
    for h in run_order {
        let began = Instant::now();
        let raw = heuristic(problem, h, if must(h) { None } else { deadline });
        if let Some(k) = Strategy::ALL.iter().position(|&s| s == h) {
            plans[k] = raw.as_ref().map(|raw| finish(problem, raw.clone(), began));
        }
        raws.extend(raw);
    }
    let searching = must(Strategy::Exact) || must(Strategy::Auto);
    let in_time = deadline.is_none_or(|d| Instant::now() < d);
    let ranked: Vec<&Raw> = HEURISTICS
        .iter()
        .filter_map(|&h| raws.iter().find(|raw| raw.strategy == h))
        .collect();
    let searched = if searching || in_time {
        search_from(problem, Strategy::Auto, &ranked, budget, start)
    } else {
        None
    };
    // `exact` and `auto`, the last two of `ALL`, share the search.
    for (k, &strategy) in Strategy::ALL.iter().enumerate().skip(4) {
        plans[k] = searched.as_ref().map(|raw| {
            let name = if strategy == Strategy::Exact {
                Strategy::Exact
            } else {
                raw.strategy
            };
            let raw = Raw {
                strategy: name,
                buffers: if name == Strategy::Colour {
                    raw.buffers.clone()
                } else {
                    Vec::new()
                },
                ..raw.clone()
            };
            finish(problem, raw, start)
        });
    }
    plans
}
