//! `userdma stage FILE [--direct] [--depth N] [--size N] [--json]`: reads a file into pool
//! buffers on the loopback device's DMA space through io_uring fixed buffers, and prints the
//! throughput, the path used (direct / buffered, and why) and the CPU time per GB.
//!
//! With `--direct` the file is read with O_DIRECT where its file system supports it (else the
//! buffered path, and the reason is printed); without it, buffered. Progress goes to stderr
//! about once a second on long runs.
//!
//! JSON (`--json`): `{"file", "path" ("direct" | "buffered"), "fallback" (string | null),
//! "alignment": {"memory", "offset"}, "bytes", "requests", "request_bytes", "depth",
//! "fixed_buffers", "seconds", "gb_per_s", "cpu_seconds", "cpu_seconds_per_gb"}`.

use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::memory::PageSize;
use userdma::Runtime;
use userdma_infer::stage::{self, Direct, File, Mode, Stager};
use userdma_infer::trace::{Event, Trace};
use userdma_loopback::{self as loopback, LoopbackRuntime};

use crate::exit;

/// Arguments of `userdma stage`.
#[derive(Debug, clap::Args)]
pub(crate) struct StageArgs {
    /// The file to read.
    file: PathBuf,
    /// Read with O_DIRECT where the file system supports it (the storage device DMAs straight
    /// into the pool buffers).
    #[arg(long)]
    direct: bool,
    /// Requests in flight (1 to 4096).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(stage::MAX_DEPTH)))]
    depth: u32,
    /// Bytes per request (a pool buffer each; a multiple of the direct-I/O alignment).
    #[arg(long, value_name = "N", default_value_t = 1 << 20)]
    size: usize,
    /// Write a trace of the reads to this file (Chrome trace-event JSON: open it in
    /// Perfetto's UI, ui.perfetto.dev, or chrome://tracing): each request from submission to
    /// completion on the track of the slot it held (at most --depth at once), and the pool's
    /// buffers out.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// Why `userdma stage` failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// Setting up the loopback runtime or its pool failed.
    #[error(transparent)]
    Runtime(#[from] userdma_infer::Error),
    /// Opening, registering or reading failed.
    #[error(transparent)]
    Stage(#[from] stage::Error),
    /// An argument is out of range.
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed.
    #[error("cannot write the output")]
    Output(#[source] io::Error),
    /// Encoding JSON failed.
    #[error("cannot encode the output as JSON")]
    Json(#[source] serde_json::Error),
}

impl From<userdma::Error> for Error {
    fn from(e: userdma::Error) -> Error {
        Error::Runtime(e.into())
    }
}

impl From<stage::Refused> for Error {
    fn from(refused: stage::Refused) -> Self {
        Error::Stage(refused.error)
    }
}

impl Error {
    /// The exit code (see the tool's exit-code table).
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) => exit::USAGE,
            Error::Stage(stage::Error::Open { source, .. })
                if source.kind() == io::ErrorKind::NotFound =>
            {
                exit::NOT_FOUND
            }
            Error::Stage(
                stage::Error::Misaligned { .. } | stage::Error::Depth { .. } | stage::Error::Empty,
            ) => exit::USAGE,
            Error::Stage(
                stage::Error::Disabled { .. }
                | stage::Error::MemlockLimit { .. }
                | stage::Error::Register { .. },
            ) => exit::REFUSED,
            _ => exit::FAILURE,
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    file: String,
    path: Mode,
    fallback: Option<&'static str>,
    alignment: stage::Alignment,
    bytes: u64,
    requests: u64,
    request_bytes: usize,
    depth: u32,
    fixed_buffers: u32,
    seconds: f64,
    gb_per_s: f64,
    cpu_seconds: f64,
    cpu_seconds_per_gb: f64,
    /// The trace (`--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    trace: Option<userdma_infer::trace::Summary>,
}

/// Runs `userdma stage`.
pub(crate) fn run(args: &StageArgs, json: bool) -> Result<(), Error> {
    if args.size == 0 || args.size > 1 << 30 {
        return Err(Error::Usage(format!(
            "--size {} is out of range: use 1 byte to 1 GiB",
            args.size
        )));
    }
    let file = File::open(
        &args.file,
        if args.direct {
            Direct::Prefer
        } else {
            Direct::Off
        },
    )?;
    let size = file.size()?;
    let align = u64::from(file.alignment().offset.max(1));
    let request = (args.size as u64).next_multiple_of(align) as usize;
    if request != args.size {
        return Err(Error::Usage(format!(
            "--size {} is not a multiple of the file's direct-I/O alignment ({align} bytes): \
             use {request}",
            args.size
        )));
    }
    let runtime = Runtime::loopback(loopback::Config::default())?;
    // Depth buffers, each rounded up to its size class, plus room for the pool's alignment.
    let class = request.next_power_of_two().max(4096);
    let pool_bytes = (class * args.depth as usize + (4 << 20)).next_multiple_of(2 << 20);
    let pool = runtime.pool(pool_bytes, PageSize::Base)?;
    let mut stager = Stager::new(pool.clone(), stage::Config::default().depth(args.depth))?;

    // With --trace: one track per request in flight (a slot: the ticket it holds and when it
    // was submitted), set up before the clock starts.
    let requests_max = size.div_ceil(request as u64).saturating_add(1);
    let trace = args.trace.as_ref().map(|_| {
        let trace =
            Trace::new(usize::try_from(requests_max.saturating_add(1 << 16)).unwrap_or(usize::MAX));
        trace.pool(&pool);
        trace
    });
    let tracks: Vec<u16> = match &trace {
        Some(t) => (0..args.depth)
            .map(|k| t.track(&format!("read slot {k}")))
            .collect(),
        None => Vec::new(),
    };
    let mut slots: Vec<Option<(u64, Instant)>> = vec![None; tracks.len()];
    let start = Instant::now();
    let cpu_start = stage::process_cpu_time();
    let mut last_report = start;
    let (mut next, mut bytes, mut requests) = (0u64, 0u64, 0u64);
    let mut eof = false;
    loop {
        while !eof && next < size && (stager.in_flight() as u32) < stager.depth() {
            let buffer = pool.alloc_owned(request).map_err(userdma::Error::from)?;
            let submitted = Instant::now();
            let ticket = stager.read(&file, next, buffer)?;
            if let Some(slot) = slots.iter_mut().find(|s| s.is_none()) {
                *slot = Some((ticket.raw(), submitted));
            }
            next += request as u64;
        }
        let done = match stager.wait() {
            Ok(done) => done,
            Err(stage::Error::Idle) => break,
            Err(e) => return Err(e.into()),
        };
        if let Some(t) = &trace {
            let k = slots
                .iter()
                .position(|s| s.is_some_and(|(ticket, _)| ticket == done.ticket.raw()));
            if let Some(k) = k {
                if let Some((_, submitted)) = slots[k].take() {
                    t.record(Event::Span {
                        track: tracks[k],
                        id: done.offset / request as u64,
                        start_ns: t.ns(submitted),
                        end_ns: t.ns(Instant::now()),
                        bytes: done.result.as_ref().map_or(0, |r| r.bytes as u64),
                        ok: done.result.is_ok(),
                    });
                }
            }
            t.tick();
        }
        let transfer = done.result?;
        if transfer.is_short() {
            eof = true;
        }
        bytes += transfer.bytes as u64;
        requests += 1;
        if !json && last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            eprintln!(
                "userdma stage: {:.1} of {:.1} MiB, {:.2} GB/s",
                bytes as f64 / f64::from(1 << 20),
                size as f64 / f64::from(1 << 20),
                bytes as f64 / start.elapsed().as_secs_f64() / 1e9
            );
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu = (stage::process_cpu_time().saturating_sub(cpu_start)).as_secs_f64();
    let gb = bytes as f64 / 1e9;
    let trace = match (&trace, &args.trace) {
        (Some(t), Some(path)) => Some(t.save(path)?),
        _ => None,
    };
    let report = Report {
        file: args.file.display().to_string(),
        path: file.mode(),
        fallback: file.fallback(),
        alignment: file.alignment(),
        bytes,
        requests,
        request_bytes: request,
        depth: args.depth,
        fixed_buffers: stager.layout().count(),
        seconds,
        gb_per_s: if seconds > 0.0 { gb / seconds } else { 0.0 },
        cpu_seconds: cpu,
        cpu_seconds_per_gb: if gb > 0.0 { cpu / gb } else { 0.0 },
        trace,
    };
    let text = if json {
        let mut text = serde_json::to_string_pretty(&report).map_err(Error::Json)?;
        text.push('\n');
        text
    } else {
        let mut text = format!(
            "{}: {} bytes in {} requests of {} bytes, depth {}\npath: {}",
            report.file, bytes, requests, request, args.depth, report.path
        );
        if let Some(why) = report.fallback {
            text.push_str(&format!(" (O_DIRECT not used: {why})"));
        } else if report.path == Mode::Direct {
            text.push_str(&format!(
                " (alignment: offset {} B, memory {} B)",
                report.alignment.offset, report.alignment.memory
            ));
        }
        text.push_str(&format!(
            "\nthroughput: {:.3} GB/s ({:.3} s)\ncpu: {:.3} s, {:.3} s per GB\n",
            report.gb_per_s, seconds, cpu, report.cpu_seconds_per_gb
        ));
        if let (Some(t), Some(path)) = (&report.trace, &args.trace) {
            text.push_str(&crate::pipeline::trace_line(path, t));
        }
        text
    };
    crate::print(&text).map_err(|e| match e {
        crate::exit::Failure::Output(e) => Error::Output(e),
        other => Error::Output(io::Error::other(other.to_string())),
    })
}
