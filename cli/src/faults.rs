//! `userdma faults [--transfers N] [--rate R] [--kinds K,...] [--seed S] [--json]`: the fault
//! soak on the loopback device (`userdma_loopback::fault::soak`): random round trips
//! with faults of the chosen kinds injected at random, every byte checked, every fault
//! detected on the host and recovered from; prints the accounting table. Progress goes to
//! stderr about once a second on long runs.
//!
//! Kinds: `stall`, `drop`, `twice`, `wrong-id`, `error`, `corrupt`, `slow` (default: all).
//!
//! JSON (`--json`): `{"plan": {"transfers", "rate", "kinds", "seed", "burst", "slow_us",
//! "timeout_us"}, "clean", "transfers", "verified", "failed", "kinds": [{"kind", "injected",
//! "detected", "masked", "recovered"}], "late_without_injection",
//! "timeouts_without_injection", "corrupted_bytes", "leaked_buffers", "recoveries",
//! "recovery_mean_us", "unreconciled", "seconds"}`. The exit code is 1 when the run was not
//! clean (corruption, a leak, a fault not accounted for).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma_infer::trace::{Event, Trace};
use userdma_loopback::fault::soak::{self, Plan, Report};
use userdma_loopback::fault::Kind;

use crate::exit;

/// Arguments of `userdma faults`.
#[derive(Debug, clap::Args)]
pub(crate) struct FaultsArgs {
    /// Round trips (host → device → host, 1 to 512 bytes each).
    #[arg(long, value_name = "N", default_value_t = 1_000_000)]
    transfers: u64,
    /// Probability of a fault per descriptor (0 to 1).
    #[arg(long, value_name = "R", default_value_t = 1e-4)]
    rate: f64,
    /// Fault kinds to inject, comma-separated: stall, drop, twice, wrong-id, error, corrupt,
    /// slow.
    #[arg(long, value_name = "K,...", value_delimiter = ',', value_parser = parse_kind)]
    kinds: Option<Vec<Kind>>,
    /// Seed of the transfers and of the device's fault generator: the same seed gives the same
    /// transfers and the same faults on the same descriptors. What depends on the threads'
    /// timing can differ from run to run: the faults masked by a recovery (the device goes on
    /// until its reset), bursts late with no slow fault, timeouts on a loaded machine.
    #[arg(long, value_name = "S", default_value_t = 1)]
    seed: u64,
    /// Write a trace of the soak to this file (Chrome trace-event JSON: open it in Perfetto's
    /// UI, ui.perfetto.dev, or chrome://tracing): each burst from its doorbell to its last
    /// completion, each recovery, each fault detected on a track of its kind.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
}

/// A kind by its name, for clap.
fn parse_kind(text: &str) -> Result<Kind, String> {
    Kind::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault kind {text:?}: use {}", names.join(", "))
    })
}

/// Why `userdma faults` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// An argument is out of range.
    #[error("{0}")]
    Usage(String),
    /// The soak could not run.
    #[error(transparent)]
    Soak(#[from] soak::Error),
    /// It ran, and found corruption, a leak or a fault not accounted for.
    #[error("the fault soak was not clean: {0}")]
    NotClean(String),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] std::io::Error),
    /// The trace could not be written.
    #[error(transparent)]
    Trace(Box<userdma_infer::Error>),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl Error {
    /// The exit code (see the tool's exit-code table).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Soak(soak::Error::Plan { .. }) => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}

/// One kind's row.
#[derive(Debug, Serialize)]
struct Row {
    kind: Kind,
    injected: u64,
    detected: u64,
    masked: u64,
    recovered: u64,
}

/// The plan as printed.
#[derive(Debug, Serialize)]
struct PlanOut {
    transfers: u64,
    rate: f64,
    kinds: Vec<Kind>,
    seed: u64,
    burst: usize,
    slow_us: u128,
    timeout_us: u128,
}

/// The JSON document.
#[derive(Debug, Serialize)]
struct Output {
    plan: PlanOut,
    clean: bool,
    transfers: u64,
    verified: u64,
    failed: u64,
    kinds: Vec<Row>,
    late_without_injection: u64,
    timeouts_without_injection: u64,
    corrupted_bytes: u64,
    leaked_buffers: u64,
    recoveries: u64,
    recovery_mean_us: f64,
    unreconciled: Vec<String>,
    seconds: f64,
    /// The trace (`--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<userdma_infer::trace::Summary>,
}

/// Runs `userdma faults`.
pub(crate) fn run(args: &FaultsArgs, json: bool) -> Result<(), Error> {
    if !(0.0..=1.0).contains(&args.rate) {
        return Err(Error::Usage(format!(
            "--rate {} is not a probability: use 0 to 1 (e.g. 1e-4)",
            args.rate
        )));
    }
    if args.transfers == 0 {
        return Err(Error::Usage("--transfers 0: run at least one".into()));
    }
    let mut kinds = args.kinds.clone().unwrap_or_else(|| Kind::ALL.to_vec());
    kinds.sort();
    kinds.dedup();
    let plan = Plan {
        transfers: args.transfers,
        rate: args.rate,
        kinds,
        seed: args.seed,
        ..Plan::default()
    };
    // With --trace: a track for the bursts, one for recoveries, one per kind detected.
    let trace = args.trace.as_ref().map(|_| {
        let bursts = plan.transfers.div_ceil(plan.burst as u64);
        Trace::new(
            usize::try_from(bursts.saturating_mul(3).saturating_add(1024)).unwrap_or(usize::MAX),
        )
    });
    let tracks = trace.as_ref().map(|t| {
        (
            t.track("bursts"),
            t.track("recoveries"),
            Kind::ALL.map(|k| t.track(&format!("detected: {}", k.name()))),
        )
    });
    let start = Instant::now();
    let mut last = start;
    let observe = |seen: &soak::Observed| {
        let (Some(t), Some((bursts, recoveries, kinds))) = (&trace, &tracks) else {
            return;
        };
        t.record(Event::Span {
            track: *bursts,
            id: seen.burst,
            start_ns: t.ns(seen.announced),
            end_ns: t.ns(seen.taken),
            bytes: 0,
            ok: seen.failed == 0,
        });
        for (k, &kind) in Kind::ALL.iter().enumerate() {
            for _ in 0..seen.detected.get(kind) {
                t.record(Event::Span {
                    track: kinds[k],
                    id: seen.burst,
                    start_ns: t.ns(seen.taken),
                    end_ns: t.ns(seen.taken),
                    bytes: 0,
                    ok: true,
                });
            }
        }
        if let Some((from, to)) = seen.recovery {
            t.record(Event::Span {
                track: *recoveries,
                id: seen.burst,
                start_ns: t.ns(from),
                end_ns: t.ns(to),
                bytes: 0,
                ok: true,
            });
        }
    };
    let report = soak::run_observed(
        &plan,
        |done| {
            if last.elapsed() >= Duration::from_secs(1) {
                last = Instant::now();
                eprintln!(
                    "userdma faults: {done} of {} transfers ({:.0} s)",
                    plan.transfers,
                    start.elapsed().as_secs_f64()
                );
            }
        },
        observe,
    )?;
    let trace = match (&trace, &args.trace) {
        (Some(t), Some(path)) => Some(t.save(path).map_err(|e| Error::Trace(Box::new(e)))?),
        _ => None,
    };
    let text = if json {
        let mut output = output(&plan, &report);
        output.trace = trace;
        let mut text = serde_json::to_string_pretty(&output).map_err(Error::Json)?;
        text.push('\n');
        text
    } else {
        let mut text = table(&plan, &report);
        if let (Some(t), Some(path)) = (&trace, &args.trace) {
            text.push_str(&crate::pipeline::trace_line(path, t));
        }
        text
    };
    crate::print(&text).map_err(|e| match e {
        exit::Failure::Output(e) => Error::Output(e),
        other => Error::NotClean(other.to_string()),
    })?;
    if !report.is_clean() {
        return Err(Error::NotClean(report.summary()));
    }
    Ok(())
}

fn rows(report: &Report) -> Vec<Row> {
    Kind::ALL
        .iter()
        .map(|&kind| Row {
            kind,
            injected: report.injected.get(kind),
            detected: report.detected.get(kind),
            masked: report.masked.get(kind),
            recovered: report.recovered.get(kind),
        })
        .collect()
}

fn output(plan: &Plan, report: &Report) -> Output {
    Output {
        plan: PlanOut {
            transfers: plan.transfers,
            rate: plan.rate,
            kinds: plan.kinds.clone(),
            seed: plan.seed,
            burst: plan.burst,
            slow_us: plan.slow.as_micros(),
            timeout_us: plan.timeout.as_micros(),
        },
        clean: report.is_clean(),
        transfers: report.transfers,
        verified: report.verified,
        failed: report.failed,
        kinds: rows(report),
        late_without_injection: report.late_without_injection,
        timeouts_without_injection: report.timeouts_without_injection,
        corrupted_bytes: report.corrupted_bytes,
        leaked_buffers: report.leaked_buffers,
        recoveries: report.recoveries,
        recovery_mean_us: report.recovery_mean_ns as f64 / 1e3,
        unreconciled: report.unreconciled.clone(),
        seconds: report.elapsed_ns as f64 / 1e9,
        trace: None,
    }
}

fn table(plan: &Plan, report: &Report) -> String {
    let mut out = String::new();
    let kinds: Vec<&str> = plan.kinds.iter().map(|k| k.name()).collect();
    let _ = writeln!(
        out,
        "fault soak on the loopback device: {} round trips, faults at {} per descriptor ({}), seed {}",
        plan.transfers,
        plan.rate,
        kinds.join(","),
        plan.seed
    );
    let _ = writeln!(
        out,
        "\n{:<10} {:>9} {:>9} {:>7} {:>10}",
        "kind", "injected", "detected", "masked", "recovered"
    );
    for row in rows(report) {
        let _ = writeln!(
            out,
            "{:<10} {:>9} {:>9} {:>7} {:>10}",
            row.kind.name(),
            row.injected,
            row.detected,
            row.masked,
            row.recovered
        );
    }
    let _ = writeln!(
        out,
        "{:<10} {:>9} {:>9} {:>7} {:>10}",
        "total",
        report.injected.total(),
        report.detected.total(),
        report.masked.total(),
        report.recovered.total()
    );
    let _ = writeln!(
        out,
        "\ntransfers: {} verified byte for byte, {} failed by a fault",
        report.verified, report.failed
    );
    let _ = writeln!(out, "corrupted bytes: {}", report.corrupted_bytes);
    let _ = writeln!(out, "leaked buffers: {}", report.leaked_buffers);
    let _ = writeln!(
        out,
        "recoveries: {} (reset, shutdown, new queue), mean {:.0} µs",
        report.recoveries,
        report.recovery_mean_ns as f64 / 1e3
    );
    let _ = writeln!(
        out,
        "late bursts with no slow injected: {}; timeouts with no stall injected: {} (a loaded machine)",
        report.late_without_injection, report.timeouts_without_injection
    );
    for line in &report.unreconciled {
        let _ = writeln!(out, "unreconciled: {line}");
    }
    let _ = writeln!(
        out,
        "{} in {:.1} s",
        if report.is_clean() {
            "clean"
        } else {
            "NOT CLEAN"
        },
        report.elapsed_ns as f64 / 1e9
    );
    out
}
