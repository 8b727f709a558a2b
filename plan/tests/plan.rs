//! Integration tests of the static buffer planner: known answers, bad input, the MiniMalloc
//! instances. The `userdma plan` command is tested with the tool (cli/tests/plan_cli.rs).

use std::path::{Path, PathBuf};

use userdma_plan::{self as plan, format, Budget, Error, Kind, Options, Strategy, Tensor};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn bytes_only() -> Options {
    Options {
        align: 1,
        ..Options::default()
    }
}

fn records(list: &[(u64, u32, u32)]) -> Vec<Tensor> {
    list.iter()
        .enumerate()
        .map(|(i, &(bytes, first, last))| Tensor::new(i as u64, bytes, first, last))
        .collect()
}

const BUDGET: Budget = Budget::Nodes(200_000);

fn run(tensors: &[Tensor], options: &Options, strategy: Strategy) -> plan::Plan {
    let plan = plan::plan(tensors, options, strategy, BUDGET).unwrap();
    plan.validate(tensors).unwrap();
    assert!(plan.arena_bytes >= plan.lower_bound.bytes);
    plan
}

/// Pisarchyk & Lee 2020, "Efficient Memory Management for Deep Neural Net Inference", the
/// eight-record example: offset planning reaches 124 bytes, the lower bound.
#[test]
fn pisarchyk_lee_eight_records() {
    let tensors = records(&[
        (32, 0, 1),
        (28, 1, 4),
        (36, 2, 5),
        (16, 3, 5),
        (8, 4, 5),
        (64, 5, 7),
        (10, 6, 8),
        (40, 7, 8),
    ]);
    let greedy = run(&tensors, &bytes_only(), Strategy::GreedySize);
    assert_eq!(greedy.lower_bound.bytes, 124);
    assert_eq!(greedy.lower_bound.step, 5);
    assert_eq!(greedy.arena_bytes, 124);
    assert!(greedy.optimal);
    let auto = run(&tensors, &bytes_only(), Strategy::Auto);
    assert_eq!(auto.arena_bytes, 124);
    let colour = run(&tensors, &bytes_only(), Strategy::Colour);
    assert!(colour.arena_bytes > 124, "{}", colour.arena_bytes);
    assert_eq!(colour.buffers.iter().sum::<u64>(), colour.arena_bytes);
}

/// TFLite GPU delegate's `ComplexRecords` (memory_management_test.cc): lower bound 96, which
/// greedy by size reaches.
#[test]
fn tflite_complex_records() {
    let tensors = records(&[
        (32, 0, 1),
        (32, 1, 4),
        (8, 2, 5),
        (16, 3, 5),
        (8, 4, 5),
        (64, 5, 7),
        (8, 6, 8),
        (8, 7, 8),
        (16, 8, 9),
    ]);
    for s in Strategy::ALL {
        let p = run(&tensors, &bytes_only(), s);
        assert_eq!(p.lower_bound.bytes, 96, "{s}");
        if s != Strategy::Colour {
            assert!(p.arena_bytes <= 104, "{s}: {}", p.arena_bytes);
        }
    }
    let greedy = run(&tensors, &bytes_only(), Strategy::GreedySize);
    let offsets: Vec<u64> = greedy.placements.iter().map(|p| p.offset).collect();
    assert_eq!(offsets, [0, 32, 80, 64, 88, 0, 64, 72, 0]);
    assert_eq!(greedy.arena_bytes, 96);
}

/// Relu over a dying input: in place it needs one buffer, not two.
#[test]
fn inplace_changes_the_answer() {
    let tensors = vec![
        Tensor::new(0, 1024, 0, 1).op("Conv", []),
        Tensor::new(1, 1024, 1, 2).op("Relu", [0]),
        Tensor::new(2, 1024, 2, 3).op("Sigmoid", [1]),
    ];
    let without = run(&tensors, &Options::default(), Strategy::Auto);
    assert_eq!(without.arena_bytes, 2048);
    let with = Options {
        inplace: true,
        ..Options::default()
    };
    let inplace = run(&tensors, &with, Strategy::Auto);
    assert_eq!(inplace.arena_bytes, 1024);
    assert_eq!(inplace.placements[1].inplace_of, Some(0));
    assert_eq!(inplace.placements[2].inplace_of, Some(1));
    // The per-tensor override forbids it...
    let mut forbid = tensors.clone();
    forbid[1].inplace = Some(false);
    let p = run(&forbid, &with, Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, None);
    assert_eq!(p.arena_bytes, 2048);
    // ...or allows it for an op the table does not know.
    let mut allow = tensors.clone();
    allow[1].op = Some("MyOp".into());
    let p = run(&allow, &with, Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, None);
    allow[1].inplace = Some(true);
    let p = run(&allow, &with, Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, Some(0));
    // A convolution never, and neither over a graph input nor an input read later.
    let conv = vec![
        Tensor::new(0, 1024, 0, 1).kind(Kind::Input),
        Tensor::new(1, 1024, 1, 2).op("Relu", [0]),
        Tensor::new(2, 1024, 2, 3).op("Conv", [1]),
    ];
    let p = run(&conv, &with, Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, None);
    assert_eq!(p.placements[2].inplace_of, None);
    let later = vec![
        Tensor::new(0, 1024, 0, 3),
        Tensor::new(1, 1024, 1, 2).op("Relu", [0]),
    ];
    let p = run(&later, &with, Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, None);
    assert_eq!(p.arena_bytes, 2048);
}

/// A Reshape shares its input's memory even while both are live.
#[test]
fn alias_changes_the_answer() {
    let tensors = vec![
        Tensor::new(0, 4096, 0, 3).op("Conv", []),
        Tensor::new(1, 4096, 1, 4).op("Reshape", [0]),
        Tensor::new(2, 512, 2, 4).op("Conv", [0]),
    ];
    let p = run(&tensors, &Options::default(), Strategy::Auto);
    assert_eq!(p.placements[1].inplace_of, Some(0));
    assert_eq!(p.placements[1].offset, p.placements[0].offset);
    assert_eq!(p.arena_bytes, 4096 + 512);
    let no_alias = Options {
        alias: false,
        ..Options::default()
    };
    let p = run(&tensors, &no_alias, Strategy::Auto);
    assert_eq!(p.arena_bytes, 2 * 4096 + 512);
}

#[test]
fn fixed_offsets_are_honoured() {
    let tensors = vec![
        Tensor::new(0, 1000, 0, 5).fixed(4096),
        Tensor::new(1, 1000, 0, 2),
        Tensor::new(2, 3000, 3, 5),
    ];
    for s in Strategy::ALL {
        let p = run(&tensors, &Options::default(), s);
        assert_eq!(p.placements[0].offset, 4096, "{s}");
    }
}

/// The least arena below `limit` of a small instance by exhaustive search, if there is one. In
/// a plan where no block can
/// move to a lower free position, each free block rests on 0, on a fixed block or on a
/// chain of free blocks, so its offset is a fixed block's end (or 0) plus a sum of other free
/// blocks' sizes: those are the only offsets tried.
fn brute_force_below(tensors: &[Tensor], limit: u64) -> Option<u64> {
    fn live_together(a: &Tensor, b: &Tensor) -> bool {
        a.first <= b.last && b.first <= a.last
    }
    fn go(
        tensors: &[Tensor],
        bases: &[Vec<u64>],
        k: usize,
        at: &mut Vec<u64>,
        top: u64,
        best: &mut u64,
    ) {
        if top >= *best {
            return;
        }
        if k == tensors.len() {
            *best = top;
            return;
        }
        for &o in &bases[k] {
            let t = &tensors[k];
            let clear = (0..k).all(|j| {
                !live_together(t, &tensors[j])
                    || o + t.bytes <= at[j]
                    || at[j] + tensors[j].bytes <= o
            });
            if clear {
                at.push(o);
                go(tensors, bases, k + 1, at, top.max(o + t.bytes), best);
                at.pop();
            }
        }
    }
    // Fixed tensors first: their offsets are given.
    let mut order: Vec<Tensor> = tensors.to_vec();
    order.sort_by_key(|t| t.offset.is_none());
    let floors: Vec<u64> = std::iter::once(0)
        .chain(order.iter().filter_map(|t| t.offset.map(|o| o + t.bytes)))
        .collect();
    let bases: Vec<Vec<u64>> = order
        .iter()
        .enumerate()
        .map(|(k, t)| {
            if let Some(o) = t.offset {
                return vec![o];
            }
            let others: Vec<u64> = order
                .iter()
                .enumerate()
                .filter(|&(j, u)| j != k && u.offset.is_none())
                .map(|(_, u)| u.bytes)
                .collect();
            let mut sums = vec![0u64];
            for b in others {
                let more: Vec<u64> = sums.iter().map(|s| s + b).collect();
                sums.extend(more);
            }
            let mut v: Vec<u64> = floors
                .iter()
                .flat_map(|f| sums.iter().map(move |s| f + s))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let mut best = limit;
    go(&order, &bases, 0, &mut Vec::new(), 0, &mut best);
    (best < limit).then_some(best)
}

/// The exact search against exhaustive search on small random instances, some with fixed
/// tensors: it proves every one optimal, and no arena below its own exists.
#[test]
fn exact_matches_exhaustive_search_on_small_instances() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    // Instances whose least arena is above the lower bound: only the search proves those.
    let (mut checked, mut with_fixed, mut above_bound) = (0, 0, 0);
    while checked < 1500 {
        let n = 3 + next(4) as usize;
        let mut tensors: Vec<Tensor> = (0..n)
            .map(|i| {
                let first = next(6) as u32;
                Tensor::new(i as u64, 1 + next(6), first, first + next(4) as u32)
            })
            .collect();
        if next(3) == 0 {
            tensors[0].offset = Some(next(8));
        }
        let Ok(plan) = plan::plan(&tensors, &bytes_only(), Strategy::Exact, BUDGET) else {
            continue; // colliding fixed offsets
        };
        plan.validate(&tensors).unwrap();
        assert!(plan.optimal, "not proven: {tensors:?}");
        let better = brute_force_below(&tensors, plan.arena_bytes);
        assert_eq!(better, None, "{tensors:?}");
        checked += 1;
        with_fixed += usize::from(tensors[0].offset.is_some());
        above_bound += usize::from(plan.arena_bytes > plan.lower_bound.bytes);
    }
    eprintln!(
        "{checked} instances, {with_fixed} with a fixed tensor, {above_bound} above the bound"
    );
    assert!(with_fixed > 300, "{with_fixed}");
    assert!(above_bound > 100, "{above_bound}");
}

fn error(tensors: &[Tensor]) -> Error {
    plan::plan(tensors, &Options::default(), Strategy::Auto, BUDGET).unwrap_err()
}

#[test]
fn every_bad_input_is_an_error_naming_the_record() {
    let e = error(&[Tensor::new(3, 0, 0, 1).name("x")]);
    assert_eq!(e.to_string(), "tensor 3 (\"x\"): size is zero");
    let e = error(&[Tensor::new(4, 1, 2, 1)]);
    assert!(matches!(e, Error::Interval { .. }), "{e}");
    assert!(e.to_string().starts_with("tensor 4:"), "{e}");
    let e = error(&[Tensor::new(5, 1, 0, 1), Tensor::new(5, 1, 0, 1)]);
    assert!(matches!(e, Error::DuplicateId { id: 5, .. }), "{e}");
    let e = error(&[Tensor::new(6, 1, 0, 1).op("Relu", [9])]);
    assert!(matches!(e, Error::UnknownInput { input: 9, .. }), "{e}");
    let e = error(&[Tensor::new(7, 1, 0, 1).fixed(100)]);
    assert!(matches!(e, Error::Misaligned { offset: 100, .. }), "{e}");
    let e = error(&[
        Tensor::new(8, 1000, 0, 3).fixed(0),
        Tensor::new(9, 10, 3, 4).fixed(768),
    ]);
    assert!(matches!(e, Error::FixedCollision { .. }), "{e}");
    assert!(e.to_string().contains("tensor 9") && e.to_string().contains("tensor 8"));
    let e = error(&[
        Tensor::new(10, u64::MAX / 2, 0, 1),
        Tensor::new(11, u64::MAX / 2, 0, 1),
    ]);
    assert!(matches!(e, Error::Overflow { .. }), "{e}");
    let e = error(&[Tensor::new(12, u64::MAX, 0, 1)]);
    assert!(matches!(e, Error::Overflow { .. }), "{e}");
    let e = error(&[Tensor::new(13, 256, 0, 1).fixed(u64::MAX - 255)]);
    assert!(matches!(e, Error::Overflow { .. }), "{e}");
    let bad_align = Options {
        align: 48,
        ..Options::default()
    };
    let e = plan::plan(&[], &bad_align, Strategy::Auto, BUDGET).unwrap_err();
    assert!(matches!(e, Error::Alignment { align: 48 }), "{e}");
}

#[test]
fn empty_input_is_an_empty_plan() {
    let p = run(&[], &Options::default(), Strategy::Auto);
    assert_eq!(
        (p.arena_bytes, p.lower_bound.bytes, p.naive_bytes),
        (0, 0, 0)
    );
    assert!(p.optimal);
}

#[test]
fn the_validator_catches_broken_plans() {
    let tensors = records(&[(100, 0, 2), (100, 1, 3)]);
    let good = run(&tensors, &Options::default(), Strategy::GreedySize);
    let mut bad = good.clone();
    bad.placements[1].offset = 0;
    assert!(matches!(
        bad.validate(&tensors),
        Err(plan::Invalid::Overlap { .. })
    ));
    let mut bad = good.clone();
    bad.placements[1].offset = 128;
    assert!(matches!(
        bad.validate(&tensors),
        Err(plan::Invalid::Misaligned { .. })
    ));
    let mut bad = good.clone();
    bad.arena_bytes = 256;
    assert!(matches!(
        bad.validate(&tensors),
        Err(plan::Invalid::OutsideArena { .. })
    ));
    let mut bad = good.clone();
    bad.placements.pop();
    assert!(matches!(
        bad.validate(&tensors),
        Err(plan::Invalid::Mismatch { .. })
    ));
    let mut bad = good;
    bad.placements[1].inplace_of = Some(0);
    assert!(matches!(
        bad.validate(&tensors),
        Err(plan::Invalid::Share { .. })
    ));
}

#[test]
fn minimalloc_csv_reads() {
    let text = std::fs::read_to_string(data("minimalloc/A.csv")).unwrap();
    let tensors = format::read_csv(&text).unwrap();
    assert_eq!(tensors.len(), 154);
    let greedy = run(&tensors, &Options::default(), Strategy::GreedySize);
    assert_eq!(greedy.lower_bound.bytes, 1_048_576);
}

const CAPACITY: u64 = 1_048_576;
const INSTANCES: [&str; 11] = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];

/// `auto` places every MiniMalloc challenging instance (tests/data/minimalloc, Apache-2.0)
/// within its known capacity of 1,048,576 bytes, which greedy by size misses by 25-41 %. The
/// budget is in search nodes (300,000 each: every instance fits within it; about 3 s for all
/// eleven in release here, most of it D and J), so the result is the same on any machine; the
/// time is printed, not asserted (benches/plan.rs measures it).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "minutes in a debug build: scripts/test.sh runs it with --release"
)]
fn minimalloc_instances_fit_their_capacity() {
    for name in INSTANCES {
        let text = std::fs::read_to_string(data(&format!("minimalloc/{name}.csv"))).unwrap();
        let tensors = format::read_csv(&text).unwrap();
        let plan = plan::plan(
            &tensors,
            &Options::default(),
            Strategy::Auto,
            Budget::Nodes(300_000),
        )
        .unwrap();
        plan.validate(&tensors).unwrap();
        eprintln!(
            "{name}: arena {} lower bound {} ({:.4}x) won by {}, optimal {}, {:.3} s",
            plan.arena_bytes,
            plan.lower_bound.bytes,
            plan.ratio(),
            plan.strategy,
            plan.optimal,
            plan.elapsed.as_secs_f64()
        );
        assert!(plan.arena_bytes <= CAPACITY, "{name}: {}", plan.arena_bytes);
    }
}

/// A small pseudo-random generator, so the random tests are the same on every run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, m: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % m
    }
}

#[test]
fn the_validator_finds_an_overlap_exactly_when_a_pairwise_check_does() {
    // The validator sweeps in time instead of comparing every pair live together.
    let mut rng = Lcg(7);
    let mut found = 0;
    for _ in 0..2_000 {
        let n = 1 + rng.below(12) as usize;
        let tensors: Vec<Tensor> = (0..n as u64)
            .map(|i| {
                let first = rng.below(8) as u32;
                Tensor::new(
                    i,
                    1 + rng.below(3) * 100,
                    first,
                    first + rng.below(4) as u32,
                )
            })
            .collect();
        let mut plan = run(&tensors, &bytes_only(), Strategy::FirstFit);
        for p in &mut plan.placements {
            if rng.below(3) == 0 {
                p.offset = rng.below(6) * 100;
            }
        }
        plan.arena_bytes = u64::MAX;
        let pairwise = (0..n).any(|i| {
            (i + 1..n).any(|j| {
                let (a, b) = (&plan.placements[i], &plan.placements[j]);
                tensors[i].overlaps(&tensors[j])
                    && a.offset < b.offset + b.bytes
                    && b.offset < a.offset + a.bytes
            })
        });
        let verdict = plan.validate(&tensors);
        assert_eq!(
            matches!(verdict, Err(plan::Invalid::Overlap { .. })),
            pairwise,
            "{verdict:?} {tensors:?} {:?}",
            plan.placements
        );
        found += usize::from(pairwise);
    }
    assert!(found > 100, "only {found} plans with an overlap");
}

#[test]
fn sizes_that_could_place_a_tensor_past_2_pow_64_are_refused() {
    // One tensor fixed at 2^63 and a free one of 2^63 - 1 bytes: every planner would place the
    // free one above the fixed one, past 2^64.
    let tensors = [
        Tensor::new(0, 100, 0, 1).fixed(1 << 63),
        Tensor::new(1, (1 << 63) - 1, 0, 1),
    ];
    let e = error(&tensors);
    assert!(matches!(e, Error::Overflow { .. }), "{e}");
    assert!(e.to_string().starts_with("tensor 0:"), "{e}");
    // A fixed tensor alone near the top of the range is fine.
    let tensors = [Tensor::new(0, 100, 0, 1).fixed(u64::MAX - 511)];
    let plan = run(&tensors, &Options::default(), Strategy::Auto);
    assert_eq!(plan.arena_bytes, u64::MAX - 255);
}

#[test]
fn the_comparison_keeps_to_a_time_budget() {
    // Every tensor live with every other: the heuristics but best fit cost n² / 2 steps. With
    // the budget spent before they start, only the chosen strategy runs (and best fit, for
    // the search's incumbent).
    let tensors: Vec<Tensor> = (0..2_000u64)
        .map(|i| Tensor::new(i, 256 + (i % 7) * 64, 0, 1))
        .collect();
    let problem = plan::Problem::new(&tensors, &Options::default()).unwrap();
    let none = Budget::Time(std::time::Duration::ZERO);
    let ran = |chosen| -> Vec<Strategy> {
        plan::compare_within(&problem, chosen, none)
            .iter()
            .zip(Strategy::ALL)
            .filter_map(|(p, s)| p.as_ref().map(|_| s))
            .collect()
    };
    assert_eq!(ran(Strategy::GreedySize), [Strategy::GreedySize]);
    assert_eq!(ran(Strategy::Colour), [Strategy::Colour]);
    assert_eq!(
        ran(Strategy::Auto),
        [Strategy::BestFit, Strategy::Exact, Strategy::Auto]
    );
    // A node budget has no clock: everything runs, as `compare` does.
    let all = plan::compare_within(&problem, Strategy::GreedySize, Budget::Nodes(1));
    assert!(all.iter().all(Option::is_some));
    for p in all.iter().flatten() {
        p.validate(&tensors).unwrap();
    }
}
