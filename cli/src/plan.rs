//! `userdma plan FILE [--format json|csv|onnx] [--dim NAME=VALUE]... [--strategy S] [--align N]
//! [--inplace] [--budget 1s] [--svg FILE]`: static buffer planning of one model's tensors into
//! one arena. An ONNX model's activations are read with their shapes inferred
//! (`userdma_infer::plan::onnx`); `--dim N=1` pins a named (dynamic) dimension.
//!
//! The text summary shows the tensors, the naive size, the lower bound, the arena, arena ÷
//! lower bound, the saving against naive, every strategy's result from the same run with its
//! time, and the total time. The chosen strategy runs to the end; the others (and for `exact`
//! and `auto`, the heuristics the search starts from, but best fit) run only while a time
//! `--budget` lasts, and one it cuts short is listed as skipped. `--svg FILE` draws the arena
//! (step across, offset up, one rectangle per tensor, the lower-bound step marked).
//!
//! JSON (`--json`): exactly `{"arena_bytes", "lower_bound_bytes", "naive_bytes", "strategy",
//! "optimal", "seconds", "tensors": [{"id", "offset", "bytes", "inplace_of"}]}` for the
//! chosen strategy (`inplace_of`: the id whose memory the tensor took, or null); only that
//! strategy runs.
//!
//! Bad input (unreadable file, a file larger than [`RECORDS_LIMIT`] or
//! [`plan::onnx::MAX_MODEL_BYTES`], malformed or truncated record, zero size, `first > last`,
//! duplicate or unknown ids, colliding fixed offsets, overflowing sizes) exits with 2 and a
//! message naming the record.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma_infer::plan::{self, format, Budget, Options, Plan, Problem, Strategy};

use crate::{bounded, exit};

/// The most of a tensor-record file (JSON or CSV) `userdma plan` reads: 256 MiB. A record is
/// some 100 bytes, so this is millions of tensors, far beyond any real graph; more is not a
/// model's records but `/dev/zero`, an endless pipe or the wrong file, which would otherwise be
/// read until the machine runs out of memory.
pub(crate) const RECORDS_LIMIT: u64 = 256 << 20;

/// Arguments of `userdma plan`.
#[derive(Debug, clap::Args)]
pub(crate) struct PlanArgs {
    /// The tensors: tensor-usage JSON, MiniMalloc CSV, or an ONNX model.
    file: PathBuf,

    /// The input format: json, csv or onnx (default: from the file's extension).
    #[arg(long, value_name = "FORMAT", value_parser = parse_format)]
    format: Option<Input>,

    /// Pins a named dimension of an ONNX model's inputs (e.g. `--dim N=1`); repeatable.
    #[arg(long = "dim", value_name = "NAME=VALUE", value_parser = parse_dim)]
    dims: Vec<(String, u64)>,

    /// colour, greedy-size, first-fit, best-fit, exact or auto.
    #[arg(long, value_name = "S", default_value = "auto", value_parser = parse_strategy)]
    strategy: Strategy,

    /// Arena alignment in bytes (a power of two).
    #[arg(long, value_name = "N", default_value_t = plan::DEFAULT_ALIGN)]
    align: u64,

    /// Let element-wise ops write their output over a dying input.
    #[arg(long)]
    inplace: bool,

    /// How long the exact search may run: `1s`, `250ms`, or a node count `100000n`. A time
    /// budget also bounds the comparison: strategies other than the chosen one that do not
    /// finish within it are skipped.
    #[arg(long, value_name = "TIME", default_value = "1s", value_parser = parse_budget)]
    budget: Budget,

    /// Also draw the arena as an SVG picture into FILE.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
}

/// What the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// Tensor records in a text format.
    Records(format::FileFormat),
    /// An ONNX model.
    Onnx,
}

impl Input {
    fn of(path: &Path) -> Option<Input> {
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
        {
            return Some(Input::Onnx);
        }
        format::FileFormat::from_extension(path).map(Input::Records)
    }
}

fn parse_format(text: &str) -> Result<Input, String> {
    match text {
        "json" => Ok(Input::Records(format::FileFormat::Json)),
        "csv" => Ok(Input::Records(format::FileFormat::Csv)),
        "onnx" => Ok(Input::Onnx),
        _ => Err(format!("unknown format {text:?} (json, csv, onnx)")),
    }
}

fn parse_dim(text: &str) -> Result<(String, u64), String> {
    let bad = || {
        format!("bad dimension {text:?}: use NAME=VALUE with VALUE a positive integer, e.g. N=1")
    };
    let (name, value) = text.split_once('=').ok_or_else(bad)?;
    let value: u64 = value.trim().parse().map_err(|_| bad())?;
    if name.trim().is_empty() || value == 0 {
        return Err(bad());
    }
    Ok((name.trim().to_owned(), value))
}

fn parse_strategy(text: &str) -> Result<Strategy, String> {
    text.parse()
        .map_err(|e: plan::UnknownStrategy| e.to_string())
}

/// `1s`, `1.5s`, `250ms`, `100000n`.
pub(crate) fn parse_budget(text: &str) -> Result<Budget, String> {
    let bad = || format!("bad budget {text:?}: use e.g. 1s, 250ms or 100000n (search nodes)");
    if let Some(n) = text.strip_suffix('n') {
        return n.parse().map(Budget::Nodes).map_err(|_| bad());
    }
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    Duration::try_from_secs_f64(value * scale)
        .map(Budget::Time)
        .map_err(|_| bad())
}

/// Why `userdma plan` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is larger than the tool reads of its kind ([`RECORDS_LIMIT`], [`plan::onnx::MAX_MODEL_BYTES`]).
    #[error(
        "{path} is larger than {limit} bytes ({mib} MiB), the most `userdma plan` reads of {what}",
        mib = limit >> 20,
        what = if *onnx {
            "an ONNX model (protobuf's limit): save the model with its weights as external data \
             (onnx.save_model(model, PATH, save_as_external_data=True)); the planner reads only \
             the graph"
        } else {
            "tensor records (millions of tensors): give the JSON or CSV records of one model, \
             not a device, an endless pipe or another file"
        }
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
        /// Whether it was read as an ONNX model.
        onnx: bool,
    },
    /// The file's first byte starts no protobuf field, so no ONNX model (`/dev/zero`, text).
    #[error(
        "{path} is not an ONNX model: its first byte, {byte:#04x}, starts no protobuf field \
         (give an .onnx file, or --format json|csv for tensor records)"
    )]
    NotOnnx {
        /// The file.
        path: PathBuf,
        /// Its first byte.
        byte: u8,
    },
    /// No `--format` and the extension says nothing.
    #[error("{path}: cannot tell the format from the extension: give --format json|csv|onnx")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The file is malformed.
    #[error("{path}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        #[source]
        source: format::Error,
    },
    /// The ONNX model cannot be read.
    #[error("{path}")]
    Onnx {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the tensor or node.
        #[source]
        source: plan::onnx::Error,
    },
    /// A record is invalid.
    #[error("{path}")]
    Plan {
        /// The file.
        path: PathBuf,
        /// Which record, and why.
        #[source]
        source: plan::Error,
    },
    /// The plan failed its own check (a planner bug).
    #[error("the {strategy} plan is invalid (a planner bug)")]
    Invalid {
        /// The strategy.
        strategy: Strategy,
        /// The violation.
        #[source]
        source: plan::Invalid,
    },
    /// Writing the SVG file failed.
    #[error("cannot write {path}")]
    Svg {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl Error {
    /// The error of a failed bounded read of the records at `path`.
    fn reading(path: &Path, e: bounded::Error) -> Self {
        match e {
            bounded::Error::Io(source) => Error::Read {
                path: path.to_owned(),
                source,
            },
            bounded::Error::TooLarge { limit } => Error::TooLarge {
                path: path.to_owned(),
                limit,
                onnx: false,
            },
        }
    }

    /// The error of a model at `path` that the planner's ONNX reader refused: the reading
    /// failures as for records, the rest as what is wrong with the model.
    fn onnx(path: &Path, e: plan::onnx::Error) -> Self {
        let path = path.to_owned();
        match e {
            plan::onnx::Error::Io { source, .. } => Error::Read { path, source },
            plan::onnx::Error::TooLarge { limit, .. } => Error::TooLarge {
                path,
                limit,
                onnx: true,
            },
            plan::onnx::Error::NotAModel { byte, .. } => Error::NotOnnx { path, byte },
            source => Error::Onnx { path, source },
        }
    }

    /// The documented exit code for this failure.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Read { .. }
            | Error::TooLarge { .. }
            | Error::NotOnnx { .. }
            | Error::UnknownFormat { .. }
            | Error::Format { .. }
            | Error::Onnx { .. }
            | Error::Plan { .. } => exit::USAGE,
            _ => exit::FAILURE,
        }
    }
}

/// The `--json` document: exactly these keys.
#[derive(Debug, Serialize)]
struct Report<'a> {
    arena_bytes: u64,
    lower_bound_bytes: u64,
    naive_bytes: u64,
    strategy: &'static str,
    optimal: bool,
    seconds: f64,
    tensors: &'a [plan::Placement],
}

/// Runs `userdma plan`.
pub(crate) fn run(args: &PlanArgs, json: bool) -> Result<(), Error> {
    let start = Instant::now();
    let path = &args.file;
    let input = match args.format {
        Some(f) => f,
        None => Input::of(path).ok_or_else(|| Error::UnknownFormat { path: path.clone() })?,
    };
    let tensors = match input {
        Input::Records(format) => {
            let text = bounded::read_to_string(path, RECORDS_LIMIT)
                .map_err(|e| Error::reading(path, e))?;
            format.read(&text).map_err(|source| Error::Format {
                path: path.clone(),
                source,
            })?
        }
        Input::Onnx => {
            let options = args
                .dims
                .iter()
                .fold(plan::onnx::Options::default(), |o, (name, value)| {
                    o.dim(name.clone(), *value)
                });
            // Bounded by the reader itself: at most 2 GiB, and a file whose first byte
            // starts no protobuf field refused after that byte.
            plan::onnx::read_with(path, &options).map_err(|e| Error::onnx(path, e))?
        }
    };
    let options = Options {
        align: args.align,
        inplace: args.inplace,
        ..Options::default()
    };
    let problem = Problem::new(&tensors, &options).map_err(|source| Error::Plan {
        path: path.clone(),
        source,
    })?;
    let index = Strategy::ALL
        .iter()
        .position(|&s| s == args.strategy)
        .unwrap_or(Strategy::ALL.len() - 1);
    // JSON reports the chosen strategy alone, so only it runs; the summary compares them all.
    let mut plans = if json {
        vec![None; Strategy::ALL.len()]
    } else {
        plan::compare_within(&problem, args.strategy, args.budget)
    };
    // `compare_within` always runs the chosen strategy.
    let chosen = plans[index]
        .take()
        .unwrap_or_else(|| plan::plan_problem(&problem, args.strategy, args.budget));
    for p in plans.iter().flatten().chain([&chosen]) {
        p.validate(&tensors).map_err(|source| Error::Invalid {
            strategy: p.strategy,
            source,
        })?;
    }
    let chosen = &chosen;
    if let Some(svg) = &args.svg {
        std::fs::write(svg, render_svg(&tensors, chosen)).map_err(|source| Error::Svg {
            path: svg.clone(),
            source,
        })?;
    }
    let text = if json {
        let report = Report {
            arena_bytes: chosen.arena_bytes,
            lower_bound_bytes: chosen.lower_bound.bytes,
            naive_bytes: chosen.naive_bytes,
            strategy: chosen.strategy.name(),
            optimal: chosen.optimal,
            seconds: chosen.elapsed.as_secs_f64(),
            tensors: &chosen.placements,
        };
        let mut text = serde_json::to_string_pretty(&report).map_err(Error::Json)?;
        text.push('\n');
        text
    } else {
        summary(path, &problem, &plans, chosen, index, start.elapsed())
    };
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Error::Output)
}

/// The share of `naive` that `arena` saves, as text. Nothing when there is nothing to place;
/// no percentage when fixed offsets put the arena above the naive size (a negative "saving"
/// that can run to 19 digits says nothing).
fn saving(arena: u64, naive: u64) -> String {
    if naive == 0 {
        String::new()
    } else if arena > naive {
        ", larger than naive (fixed offsets)".to_owned()
    } else {
        let saved = 100.0 * (naive - arena) as f64 / naive as f64;
        format!(", {saved:.1}% saved against naive")
    }
}

/// The text report.
fn summary(
    path: &Path,
    problem: &Problem,
    plans: &[Option<Plan>],
    chosen: &Plan,
    index: usize,
    total: Duration,
) -> String {
    let lb = chosen.lower_bound;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "{}: {} tensors in {} blocks, alignment {} B",
        path.display(),
        problem.len(),
        problem.blocks(),
        problem.align()
    );
    let _ = writeln!(t, "naive        {:>12} B", chosen.naive_bytes);
    let _ = writeln!(
        t,
        "lower bound  {:>12} B (peak at step {})",
        lb.bytes, lb.step
    );
    if problem.is_empty() {
        let _ = writeln!(t, "arena        {:>12} B (no tensors to place)", 0);
    } else {
        let _ = writeln!(
            t,
            "arena        {:>12} B = {:.4} x lower bound{}",
            chosen.arena_bytes,
            chosen.ratio(),
            saving(chosen.arena_bytes, chosen.naive_bytes)
        );
    }
    let _ = writeln!(
        t,
        "strategy     {} ({}{}), {:.3} ms",
        Strategy::ALL[index],
        if Strategy::ALL[index] == Strategy::Auto {
            format!("won by {}, ", chosen.strategy)
        } else {
            String::new()
        },
        if chosen.optimal {
            "proven optimal"
        } else {
            "not proven optimal"
        },
        chosen.elapsed.as_secs_f64() * 1e3
    );
    if !chosen.buffers.is_empty() {
        let _ = writeln!(
            t,
            "buffers      {} shared buffers, {} B in all",
            chosen.buffers.len(),
            chosen.buffers.iter().sum::<u64>()
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<18} {:>12} {:>8} {:>8} {:>11}",
        "strategy", "arena B", "x lower", "optimal", "time ms"
    );
    let mut skipped = false;
    for (k, (p, s)) in plans.iter().zip(Strategy::ALL).enumerate() {
        let p = if k == index { Some(chosen) } else { p.as_ref() };
        let Some(p) = p else {
            skipped = true;
            let _ = writeln!(t, "{:<18} skipped: the budget ran out first", s.to_string());
            continue;
        };
        let name = if s == Strategy::Auto {
            format!("auto:{}", p.strategy)
        } else {
            s.to_string()
        };
        let extra = if s == Strategy::Colour {
            format!("  ({} buffers)", p.buffers.len())
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "{:<18} {:>12} {:>8.4} {:>8} {:>11.3}{extra}",
            name,
            p.arena_bytes,
            p.ratio(),
            if p.optimal { "yes" } else { "no" },
            p.elapsed.as_secs_f64() * 1e3
        );
    }
    if skipped {
        let _ = writeln!(
            t,
            "(a longer --budget lets the skipped strategies finish; every pair of tensors live \
             together costs them a step)"
        );
    }
    let _ = writeln!(t, "total time {:.3} ms", total.as_secs_f64() * 1e3);
    t
}

/// The arena as an SVG picture: steps across, offsets up, one rectangle per tensor, the
/// lower-bound step marked. Hand-written SVG: rectangles, a line and a few labels.
pub(crate) fn render_svg(tensors: &[plan::Tensor], plan: &Plan) -> String {
    const W: f64 = 960.0;
    const H: f64 = 540.0;
    const M: f64 = 60.0;
    let steps = tensors
        .iter()
        .map(|t| u64::from(t.last) + 1)
        .max()
        .unwrap_or(1)
        .max(1);
    let top = plan.arena_bytes.max(1);
    let x = |s: u64| M + (W - 2.0 * M) * s as f64 / steps as f64;
    let y = |o: u64| H - M - (H - 2.0 * M) * o as f64 / top as f64;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{M}" y="24" font-size="14">{} arena {} B, lower bound {} B ({:.4}x), {} tensors</text>"#,
        plan.strategy,
        plan.arena_bytes,
        plan.lower_bound.bytes,
        plan.ratio(),
        tensors.len()
    );
    for (i, (t, p)) in tensors.iter().zip(&plan.placements).enumerate() {
        let size = t.bytes.div_ceil(plan.align.max(1)) * plan.align.max(1);
        let (x0, x1) = (x(u64::from(t.first)), x(u64::from(t.last) + 1));
        let (y0, y1) = (y(p.offset + size), y(p.offset));
        let hue = (i * 137) % 360;
        let _ = writeln!(
            svg,
            r#"<rect x="{x0:.2}" y="{y0:.2}" width="{:.2}" height="{:.2}" fill="hsl({hue},60%,70%)" stroke="black" stroke-width="0.5"><title>{} offset {} bytes {} steps {}..={}</title></rect>"#,
            (x1 - x0).max(0.5),
            (y1 - y0).max(0.5),
            escape(&t.label()),
            p.offset,
            t.bytes,
            t.first,
            t.last
        );
    }
    let lx = x(u64::from(plan.lower_bound.step));
    let _ = writeln!(
        svg,
        r#"<line x1="{lx:.2}" y1="{:.2}" x2="{lx:.2}" y2="{:.2}" stroke="red" stroke-dasharray="4 3"/><text x="{lx:.2}" y="{:.2}" fill="red" text-anchor="middle">peak: step {}</text>"#,
        M - 10.0,
        H - M,
        H - M + 16.0,
        plan.lower_bound.step
    );
    let lb = y(plan.lower_bound.bytes);
    let _ = writeln!(
        svg,
        r#"<line x1="{M}" y1="{lb:.2}" x2="{:.2}" y2="{lb:.2}" stroke="red" stroke-width="0.5"/>"#,
        W - M
    );
    let _ = writeln!(
        svg,
        r#"<rect x="{M}" y="{M}" width="{:.2}" height="{:.2}" fill="none" stroke="black"/><text x="{:.2}" y="{:.2}" text-anchor="middle">step</text><text x="20" y="{:.2}" transform="rotate(-90 20 {:.2})" text-anchor="middle">offset (0 .. {} B)</text>"#,
        W - 2.0 * M,
        H - 2.0 * M,
        W / 2.0,
        H - 20.0,
        H / 2.0,
        H / 2.0,
        plan.arena_bytes
    );
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse() {
        assert_eq!(parse_budget("1s"), Ok(Budget::Time(Duration::from_secs(1))));
        assert_eq!(
            parse_budget("250ms"),
            Ok(Budget::Time(Duration::from_millis(250)))
        );
        assert_eq!(parse_budget("1000n"), Ok(Budget::Nodes(1000)));
        assert!(parse_budget("fast").is_err());
        assert!(parse_budget("-1s").is_err());
    }
}
