//! The inference pipeline against the naive per-frame path, in one run: frames/s and the
//! driving thread's CPU time per frame, with the zero-cost and the npu cost models, printed as
//! one table with the ratios; then results copied back against read in place through the
//! device-memory BAR by result size (and what `Results::Auto` picks); the pipeline traced
//! against untraced (the trace's overhead); then criterion timings of one frame each way.
//!
//! ```text
//! cargo bench --bench pipeline             # the table (2000 frames per cell) and the timings
//! cargo bench --bench pipeline -- --test   # quick: 50 frames per cell, each bench once
//! cargo bench --bench pipeline -- trace-only  # only traced vs untraced
//! ```
//!
//! The model is a chain of 2 layers over 16 KiB tensors. The pipeline runs split across the
//! loopback device's copy engine and compute unit; the naive path allocates, maps and copies
//! per frame and runs synchronously. Results are not checked here (the tests do that).

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use userdma::Runtime;
use userdma_infer::pipeline::{naive, Config, Model, Pipeline, Results};
use userdma_infer::trace::Trace;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Frames/s and CPU µs per frame of `frames` pipeline frames at `depth`.
fn pipelined(rt: &Runtime, model: &Model, depth: usize, frames: u64) -> (f64, f64) {
    let config = Config {
        depth,
        ..Config::default()
    };
    let (fps, cpu, _, _) = pipelined_with(rt, model, config, frames);
    (fps, cpu)
}

/// Frames/s, CPU µs per frame, mean µs from preprocessing to the result read, and whether
/// results were read in place, of `frames` frames of a pipeline built with `config`.
fn pipelined_with(
    rt: &Runtime,
    model: &Model,
    config: Config,
    frames: u64,
) -> (f64, f64, f64, bool) {
    pipelined_traced(rt, model, config, frames, None)
}

/// [`pipelined_with`], its frames recorded into `trace` if one is given.
fn pipelined_traced(
    rt: &Runtime,
    model: &Model,
    config: Config,
    frames: u64,
    trace: Option<&Arc<Trace>>,
) -> (f64, f64, f64, bool) {
    let mut p = Pipeline::new(rt, model.clone(), config).expect("pipeline");
    if let Some(trace) = trace {
        let stream = trace.stream("bench");
        p.set_trace(Arc::clone(trace), stream);
    }
    let in_place = p.result_path().in_place;
    let latency = std::cell::Cell::new(Duration::ZERO);
    let input = vec![7u8; model.input().bytes as usize];
    let mut out = vec![0u8; model.result().bytes as usize];
    let mut run = |p: &mut Pipeline, n| {
        p.run(
            n,
            |_, i| i.write(0, &input),
            |d| {
                if let Ok(o) = d.result {
                    o.read(0, &mut out).expect("read");
                }
                latency.set(latency.get() + d.times.preprocess.elapsed());
            },
        )
        .expect("run");
    };
    run(&mut p, config.depth as u64 * 4);
    latency.set(Duration::ZERO);
    let (t, c) = (Instant::now(), thread_cpu());
    run(&mut p, frames);
    let (wall, cpu) = (t.elapsed(), thread_cpu() - c);
    p.shutdown(|_| {}).expect("shutdown");
    (
        frames as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / frames as f64,
        latency.get().as_secs_f64() * 1e6 / frames as f64,
        in_place,
    )
}

/// The same for the naive path.
fn naive_run(rt: &Runtime, model: &Model, frames: u64) -> (f64, f64) {
    let (t, c) = (Instant::now(), thread_cpu());
    naive::run(
        rt,
        model,
        3,
        frames,
        Duration::from_secs(30),
        |_, i| i.fill(7),
        |_, r, _| {
            std::hint::black_box(r.is_ok());
        },
    )
    .expect("naive");
    let (wall, cpu) = (t.elapsed(), thread_cpu() - c);
    (
        frames as f64 / wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / frames as f64,
    )
}

fn runtime(cost: Cost) -> Runtime {
    // Queues 0-2 for the pipeline, 3 for the naive path.
    Runtime::loopback(loopback::Config::default().cost(cost)).expect("loopback device")
}

fn table(frames: u64) {
    let model = Model::chain(2, 16 << 10).expect("model");
    println!("pipeline vs naive, {frames} frames per cell, 2 layers over 16 KiB tensors");
    println!(
        "{:<6} {:<12} {:>10} {:>12} {:>14} {:>16}",
        "cost", "path", "frames/s", "cpu us/frame", "fps / naive", "cpu / naive"
    );
    for (name, cost) in [("zero", Cost::zero()), ("npu", Cost::npu())] {
        let rt = runtime(cost);
        let (nf, nc) = naive_run(&rt, &model, frames);
        for depth in [1, 2, 3] {
            let (f, c) = pipelined(&rt, &model, depth, frames);
            println!(
                "{name:<6} {:<12} {f:>10.0} {c:>12.1} {:>14.2} {:>16.2}",
                format!("depth {depth}"),
                f / nf,
                c / nc
            );
        }
        println!(
            "{name:<6} {:<12} {nf:>10.0} {nc:>12.1} {:>14.2} {:>16.2}",
            "naive", 1.0, 1.0
        );
    }
}

/// Results copied back against read in place through the BAR, by result size, under the npu
/// model (1 µs per 8-byte BAR read), and what `Results::Auto` measured and chose.
fn results_table(frames: u64) {
    println!();
    println!("results copied back vs read in place, npu cost, depth 2, {frames} frames per cell, one layer");
    println!(
        "{:>9} {:>11} {:>11} {:>13} {:>13} {:>10} {:>9}",
        "result B", "copy fps", "place fps", "copy lat us", "place lat us", "auto", "auto fps"
    );
    let rt = runtime(Cost::npu());
    for bytes in [8u64, 64, 512, 4096, 32 << 10] {
        let model = Model::chain(1, bytes).expect("model");
        let run = |results| {
            let config = Config {
                results,
                ..Config::default()
            };
            pipelined_with(&rt, &model, config, frames)
        };
        let (cf, _, cl, _) = run(Results::Copy);
        let (pf, _, pl, _) = run(Results::InPlace);
        let (af, _, _, in_place) = run(Results::Auto);
        println!(
            "{bytes:>9} {cf:>11.0} {pf:>11.0} {cl:>13.1} {pl:>13.1} {:>10} {af:>9.0}",
            if in_place { "in place" } else { "copy" }
        );
    }
}

/// The pipeline traced ([`Pipeline::set_trace`], the device keeping activity records) against
/// the same pipeline untraced, in alternating rounds on one device: frames/s and the driving
/// thread's CPU per frame, medians of `rounds`, as ratios traced ÷ untraced.
fn trace_table(frames: u64, rounds: usize) {
    println!();
    println!(
        "traced vs untraced, depth 2, 2 layers over 16 KiB tensors, {frames} frames per round, median of {rounds} alternating rounds"
    );
    println!(
        "{:<6} {:>14} {:>14} {:>12} {:>12} {:>10} {:>10}",
        "cost", "untraced fps", "traced fps", "untraced us", "traced us", "fps ratio", "cpu ratio"
    );
    let model = Model::chain(2, 16 << 10).expect("model");
    for (name, cost) in [("zero", Cost::zero()), ("npu", Cost::npu())] {
        let rt = runtime(cost);
        let config = Config {
            depth: 2,
            ..Config::default()
        };
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            // Large enough to hold every round's events: nothing is dropped.
            let trace = Trace::new(frames as usize * 16 + 4096);
            let (f, c, _, _) = pipelined_traced(&rt, &model, config, frames, None);
            off.push((f, c));
            let (f, c, _, _) = pipelined_traced(&rt, &model, config, frames, Some(&trace));
            on.push((f, c));
            trace.finish();
        }
        let median = |v: &mut Vec<(f64, f64)>, i: usize| {
            let mut x: Vec<f64> = v.iter().map(|p| if i == 0 { p.0 } else { p.1 }).collect();
            x.sort_by(f64::total_cmp);
            x[x.len() / 2]
        };
        let (of, oc) = (median(&mut off, 0), median(&mut off, 1));
        let (nf, nc) = (median(&mut on, 0), median(&mut on, 1));
        println!(
            "{name:<6} {of:>14.0} {nf:>14.0} {oc:>12.1} {nc:>12.1} {:>10.3} {:>10.3}",
            of / nf,
            nc / oc
        );
    }
    println!("fps ratio: untraced ÷ traced frames/s (time per frame traced ÷ untraced); cpu ratio: traced ÷ untraced");
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    if std::env::args().any(|a| a == "trace-only") {
        trace_table(2000, 7);
        return;
    }
    table(if quick { 50 } else { 2000 });
    trace_table(if quick { 50 } else { 2000 }, if quick { 1 } else { 7 });
    results_table(if quick { 20 } else { 1000 });
    let mut c = Criterion::default().configure_from_args();
    let rt = runtime(Cost::zero());
    let model = Model::chain(2, 16 << 10).expect("model");
    let mut g = c.benchmark_group("pipeline/frame");
    g.bench_function("depth2", |b| {
        b.iter_custom(|n| {
            let (f, _) = pipelined(&rt, &model, 2, n.max(1));
            Duration::from_secs_f64(n as f64 / f)
        })
    });
    g.bench_function("naive", |b| {
        b.iter_custom(|n| {
            let (f, _) = naive_run(&rt, &model, n.max(1));
            Duration::from_secs_f64(n as f64 / f)
        })
    });
    g.finish();
    c.final_summary();
}
