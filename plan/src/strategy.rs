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
struct Raw {
    strategy: Strategy,
    offsets: Vec<u64>,
    buffers: Vec<u64>,
    optimal: bool,
}

fn heuristic(problem: &Problem, strategy: Strategy) -> Raw {
    let items = &problem.items;
    let (offsets, buffers) = match strategy {
        Strategy::Colour => heuristics::colour(items, problem.align),
        Strategy::GreedySize => (heuristics::greedy_size(items), Vec::new()),
        Strategy::FirstFit => (heuristics::first_fit(items), Vec::new()),
        _ => (heuristics::best_fit(items), Vec::new()),
    };
    let optimal = arena(items, &offsets) <= problem.lower_bound.bytes;
    Raw {
        strategy,
        offsets,
        buffers,
        optimal,
    }
}

/// The heuristics in tie-break order: the first of equal arenas wins.
const HEURISTICS: [Strategy; 4] = [
    Strategy::GreedySize,
    Strategy::BestFit,
    Strategy::FirstFit,
    Strategy::Colour,
];

/// The best heuristic, then the search (strategy `Exact`, or the winner for `Auto`).
fn searched(problem: &Problem, strategy: Strategy, budget: Budget, start: Instant) -> Raw {
    let items = &problem.items;
    let mut best: Option<Raw> = None;
    for h in HEURISTICS {
        let raw = heuristic(problem, h);
        let better = best
            .as_ref()
            .is_none_or(|b| arena(items, &raw.offsets) < arena(items, &b.offsets));
        if better {
            best = Some(raw);
        }
    }
    let best = best.expect("four heuristics ran");
    let out = exact::search(
        items,
        problem.align,
        problem.lower_bound.bytes,
        best.offsets,
        budget,
        start,
    );
    let winner = if strategy == Strategy::Exact || out.improved {
        Strategy::Exact
    } else {
        best.strategy
    };
    Raw {
        strategy: winner,
        offsets: out.offsets,
        buffers: if winner == Strategy::Colour {
            best.buffers
        } else {
            Vec::new()
        },
        optimal: out.optimal,
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

/// Plans an already validated problem with one strategy.
pub fn plan_problem(problem: &Problem, strategy: Strategy, budget: Budget) -> Plan {
    let start = Instant::now();
    let raw = match strategy {
        Strategy::Exact | Strategy::Auto => searched(problem, strategy, budget, start),
        h => heuristic(problem, h),
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
/// name they report.
pub fn compare(problem: &Problem, budget: Budget) -> Vec<Plan> {
    let mut plans = Vec::with_capacity(Strategy::ALL.len());
    let mut raws = Vec::with_capacity(4);
    for h in &Strategy::ALL[..4] {
        let start = Instant::now();
        let raw = heuristic(problem, *h);
        let offsets = raw.offsets.clone();
        plans.push(finish(problem, raw, start));
        raws.push((*h, offsets));
    }
    let heuristics_time: std::time::Duration = plans.iter().map(|p| p.elapsed).sum();
    let best = HEURISTICS
        .iter()
        .map(|h| plans.iter().position(|p| p.strategy == *h).expect("ran"))
        .fold(None::<usize>, |b, k| match b {
            Some(b) if plans[b].arena_bytes <= plans[k].arena_bytes => Some(b),
            _ => Some(k),
        })
        .expect("four heuristics");
    let start = Instant::now();
    let out = exact::search(
        &problem.items,
        problem.align,
        problem.lower_bound.bytes,
        raws[best].1.clone(),
        budget,
        start,
    );
    let winner = if out.improved {
        Strategy::Exact
    } else {
        plans[best].strategy
    };
    for strategy in [Strategy::Exact, winner] {
        let raw = Raw {
            strategy,
            offsets: out.offsets.clone(),
            buffers: if strategy == Strategy::Colour {
                plans[best].buffers.clone()
            } else {
                Vec::new()
            },
            optimal: out.optimal,
        };
        let mut plan = finish(problem, raw, start);
        plan.elapsed += heuristics_time;
        plans.push(plan);
    }
    plans
}
