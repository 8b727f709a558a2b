//! Static buffer planning on the MiniMalloc challenging instances A–K (tests/data/minimalloc):
//! every strategy's arena ÷ lower bound and planning time, printed as one table from one run,
//! then criterion timings of the heuristics.
//!
//! ```text
//! cargo bench --bench plan                 # the table (search budget 1 s) and the timings
//! cargo bench --bench plan -- --test       # quick: search budget 20,000 nodes, each bench once
//! ```
//!
//! The search's time is its own measurement (it stops at the lower bound or the budget), so
//! it is in the table, not a criterion group.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::Criterion;
use userdma::plan::{self, format, Budget, Options, Problem, Strategy, Tensor};

const INSTANCES: [&str; 11] = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];
const CAPACITY: u64 = 1_048_576;

fn instance(name: &str) -> Vec<Tensor> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/minimalloc")
        .join(format!("{name}.csv"));
    let text = std::fs::read_to_string(&path).expect("instance file");
    format::read_csv(&text).expect("instance parses")
}

/// One row per instance: arena ÷ lower bound and milliseconds per strategy.
fn table(budget: Budget) {
    println!("MiniMalloc A-K, capacity {CAPACITY} B, search budget {budget:?}");
    print!("{:<4} {:>8} {:>9}", "inst", "tensors", "lb/cap");
    for s in Strategy::ALL {
        print!(" {:>20}", s.name());
    }
    println!();
    for name in INSTANCES {
        let tensors = instance(name);
        let problem = Problem::new(&tensors, &Options::default()).expect("valid");
        let plans = plan::compare(&problem, budget);
        print!(
            "{name:<4} {:>8} {:>9.4}",
            tensors.len(),
            problem.lower_bound().bytes as f64 / CAPACITY as f64
        );
        for p in &plans {
            p.validate(&tensors).expect("valid plan");
            let cell = format!(
                "{:.4}x{} {:.1}ms",
                p.ratio(),
                if p.optimal { "*" } else { " " },
                p.elapsed.as_secs_f64() * 1e3
            );
            print!(" {cell:>20}");
        }
        println!();
    }
    println!("(arena / lower bound, * proven optimal; exact and auto share one search)");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    table(if quick {
        Budget::Nodes(20_000)
    } else {
        Budget::Time(Duration::from_secs(1))
    });
    let mut c = Criterion::default().configure_from_args();
    for name in ["A", "K"] {
        let problem = Problem::new(&instance(name), &Options::default()).expect("valid");
        let mut g = c.benchmark_group(format!("plan/{name}"));
        for s in [
            Strategy::Colour,
            Strategy::GreedySize,
            Strategy::FirstFit,
            Strategy::BestFit,
        ] {
            g.bench_function(s.name(), |b| {
                b.iter(|| plan::plan_problem(black_box(&problem), s, Budget::Nodes(0)))
            });
        }
        g.finish();
    }
    c.final_summary();
}
