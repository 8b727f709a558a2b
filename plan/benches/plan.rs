//! Static buffer planning on the MiniMalloc challenging instances A–K (tests/data/minimalloc)
//! and on the model-zoo ONNX graphs (`scripts/onnx-models.sh`; `USERDMA_ONNX_MODELS`, or the
//! script is run): every strategy's arena ÷ lower bound and planning time, printed as tables
//! from one run, then criterion timings of the heuristics.
//!
//! ```text
//! cargo bench --bench plan                 # the tables (search budget 1 s) and the timings
//! cargo bench --bench plan -- --test       # quick: search budget 20,000 nodes, each bench once
//! ```
//!
//! The search's time is its own measurement (it stops at the lower bound or the budget), so
//! it is in the table, not a criterion group. For A–K the table also says how soon the search
//! gets within the known capacity: the least budget of a ladder at which it does.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::Criterion;
use userdma_plan::{self as plan, format, onnx, Budget, Options, Problem, Strategy, Tensor};

#[path = "../tests/onnx_models/mod.rs"]
mod onnx_models;

const INSTANCES: [&str; 11] = ["A", "B", "C", "D", "E", "F", "G", "H", "I", "J", "K"];
const CAPACITY: u64 = 1_048_576;

fn instance(name: &str) -> Vec<Tensor> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/minimalloc")
        .join(format!("{name}.csv"));
    let text = std::fs::read_to_string(&path).expect("instance file");
    format::read_csv(&text).expect("instance parses")
}

/// The model-zoo graphs the ONNX table reads, by file stem.
const MODELS: [&str; 9] = [
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
];

/// The search budgets tried, least first, for the "fits at" column.
fn ladder(quick: bool) -> Vec<Budget> {
    if quick {
        [5_000, 20_000, 100_000].map(Budget::Nodes).to_vec()
    } else {
        [50, 100, 250, 500, 1000]
            .map(|ms| Budget::Time(Duration::from_millis(ms)))
            .to_vec()
    }
}

fn header(first: &str, extra: &str) {
    print!("{first:<20} {:>8} {:>12}", "tensors", "lb B");
    for s in Strategy::ALL {
        print!(" {:>20}", s.name());
    }
    println!(" {extra}");
}

/// One row: arena ÷ lower bound and milliseconds per strategy, each plan validated.
fn row(name: &str, tensors: &[Tensor], options: &Options, budget: Budget) {
    let problem = Problem::new(tensors, options).expect("valid");
    let plans = plan::compare(&problem, budget);
    print!(
        "{name:<20} {:>8} {:>12}",
        tensors.len(),
        problem.lower_bound().bytes
    );
    for p in &plans {
        p.validate(tensors).expect("valid plan");
        let cell = format!(
            "{:.4}x{} {:.1}ms",
            p.ratio(),
            if p.optimal { "*" } else { " " },
            p.elapsed.as_secs_f64() * 1e3
        );
        print!(" {cell:>20}");
    }
}

/// One row per MiniMalloc instance, and the least budget of the ladder at which `auto` fits
/// the capacity.
fn minimalloc_table(budget: Budget, quick: bool) {
    println!("MiniMalloc A-K, capacity {CAPACITY} B, search budget {budget:?}");
    header("inst", "fits at");
    for name in INSTANCES {
        let tensors = instance(name);
        row(name, &tensors, &Options::default(), budget);
        let fits = ladder(quick).into_iter().find(|&b| {
            plan::plan(&tensors, &Options::default(), Strategy::Auto, b)
                .expect("valid")
                .arena_bytes
                <= CAPACITY
        });
        match fits {
            Some(b) => println!(" {b:?}"),
            None => println!(" not within the ladder"),
        }
    }
    println!("(arena / lower bound, * proven optimal; exact and auto share one search)");
}

/// One row per model-zoo graph, without and with in-place reuse.
fn onnx_table(budget: Budget) {
    let dir = onnx_models::models_dir();
    println!(
        "ONNX model-zoo graphs ({}), search budget {budget:?}",
        dir.display()
    );
    header("model", "");
    for inplace in [false, true] {
        let options = Options {
            inplace,
            ..Options::default()
        };
        for name in MODELS {
            let path = dir.join(format!("{name}.onnx"));
            let tensors = onnx::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let label = format!(
                "{}{}",
                name.trim_start_matches("light_"),
                if inplace { " +inplace" } else { "" }
            );
            row(&label, &tensors, &options, budget);
            println!();
        }
    }
    println!(
        "(arena / lower bound, * proven optimal; lb with --inplace is the bound of that problem)"
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let budget = if quick {
        Budget::Nodes(20_000)
    } else {
        Budget::Time(Duration::from_secs(1))
    };
    minimalloc_table(budget, quick);
    println!();
    onnx_table(budget);
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
