//! The "after" run again with every stream in a process of its own, through the device owner
//! (`userdma_owner`): the owner runs on a loopback NPU like the in-process run's, under the
//! same policy, each stream a client process (`userdma owner-client`) that fills its inputs in
//! its own pool, submits through its rings at its rate, checks every frame's detections against
//! the host and reports; printed beside the in-process "after" run.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{zoo, Config as PipelineConfig, Model};
use userdma_infer::sched::Policy;
use userdma_owner::server::{Config, Entry, Limits, Owner};
use userdma_owner::{chan, Client, Options, StreamDecl};

use super::mix::{working_set, Frames, Mix};
use super::CaseArgs;
use crate::pipeline::Error;

/// What one client process reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OwnerStream {
    pub(crate) name: String,
    pub(crate) frames: u64,
    pub(crate) wrong: u64,
    /// Frames not run: refused, lost, failed.
    pub(crate) other: u64,
    /// Periodic frames whose time came while every buffer of the client was out.
    pub(crate) dropped: u64,
    pub(crate) fps: f64,
    pub(crate) latency_mean_ms: f64,
    pub(crate) latency_p99_ms: f64,
    /// As the owner counts it, and the bound it states.
    pub(crate) longest_head_wait_ms: f64,
    pub(crate) stated_wait_bound_ms: Option<f64>,
}

/// The run through the owner beside the in-process "after".
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OwnerRun {
    pub(crate) seconds: f64,
    pub(crate) streams: Vec<OwnerStream>,
    pub(crate) total_fps: f64,
    /// The in-process "after" run's total, and owner ÷ in-process.
    pub(crate) in_process_total_fps: f64,
    pub(crate) ratio: f64,
    pub(crate) switches_per_sec: f64,
    /// Clients whose frames the owner lost track of (0: every one left cleanly).
    pub(crate) vanished: u64,
}

/// `userdma owner-client`: one stream of the case study through the owner.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct OwnerClientArgs {
    #[arg(long)]
    socket: PathBuf,
    #[arg(long)]
    name: String,
    /// Its index in the mix (which input patterns its frames cycle through).
    #[arg(long)]
    index: usize,
    #[arg(long)]
    priority: u8,
    #[arg(long)]
    fps: Option<u32>,
    #[arg(long)]
    max_wait_ms: Option<u64>,
    #[arg(long)]
    seconds: u64,
    /// The frames' patterns and expected results, as the case wrote them.
    #[arg(long)]
    frames: PathBuf,
}

/// Runs the mix's streams as client processes of an owner for `args.seconds`.
pub(super) fn through_owner(
    args: &CaseArgs,
    mix: &Mix,
    model: &Model,
    frames: &Frames,
    in_process_total_fps: f64,
) -> Result<OwnerRun, Error> {
    if args.devices != 1 {
        return Err(Error::Owner(
            "the run through the device owner takes one device (--devices 1)".into(),
        ));
    }
    let rts = mix.runtimes(model)?;
    let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rts[0])?);
    let dir = std::env::temp_dir().join(format!("userdma-case-{}", std::process::id()));
    let socket = dir.join("owner.sock");
    std::fs::create_dir_all(&dir)?;
    let frames_path = dir.join("frames.bin");
    frames.save(&frames_path)?;
    let mut config = Config::new(&socket).model(Entry {
        name: "yolov5s".into(),
        model: model.clone(),
        pipeline: PipelineConfig {
            depth: 2,
            working_set: Some(working_set(args)),
            ..PipelineConfig::default()
        },
    });
    config.policy = Policy::Batch { k: args.k };
    config.in_flight = 1;
    config.limits = Limits {
        clients: 16,
        pool_bytes: 64 << 20,
        streams: 1,
        in_flight: 8,
    };
    let mut owner = Owner::bind(engine, config).map_err(|e| Error::Owner(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let exe = std::env::current_exe()?;
    let owner_thread = std::thread::spawn(move || -> Result<_, String> {
        while !stop2.load(Ordering::Relaxed) {
            owner
                .turn(Duration::from_millis(50))
                .map_err(|e| e.to_string())?;
        }
        owner
            .run(&AtomicBool::new(true))
            .map_err(|e| e.to_string())?;
        Ok(owner.figures())
    });
    let spawned: Result<Vec<Child>, Error> = (0..mix.len())
        .map(|i| {
            let s = &mix.streams[i];
            let mut cmd = Command::new(&exe);
            cmd.args(["owner-client", "--socket"])
                .arg(&socket)
                .args(["--name", &s.name, "--index", &i.to_string()])
                .args(["--priority", &s.priority.to_string()])
                .args(["--seconds", &args.seconds.to_string()])
                .arg("--frames")
                .arg(&frames_path);
            if let Some(fps) = s.fps {
                cmd.args(["--fps", &fps.to_string()]);
            }
            if let Some(w) = mix.max_wait_ms(i) {
                cmd.args(["--max-wait-ms", &w.to_string()]);
            }
            Ok(cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?)
        })
        .collect();
    let result = spawned.and_then(|mut children| drive(&mut children));
    stop.store(true, Ordering::Relaxed);
    let figures = owner_thread
        .join()
        .map_err(|_| Error::Owner("the owner's thread panicked".into()))?
        .map_err(Error::Owner)?;
    let _ = std::fs::remove_dir_all(&dir);
    let (streams, seconds) = result?;
    let total: u64 = streams.iter().map(|s| s.frames).sum();
    let total_fps = total as f64 / seconds.max(1e-9);
    Ok(OwnerRun {
        seconds,
        total_fps,
        in_process_total_fps,
        ratio: total_fps / in_process_total_fps.max(1e-9),
        switches_per_sec: figures.switches as f64 / seconds.max(1e-9),
        vanished: figures.vanished,
        streams,
    })
}

/// Waits for every client to be ready, starts them at once, and collects their reports.
fn drive(children: &mut [Child]) -> Result<(Vec<OwnerStream>, f64), Error> {
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("piped")))
        .collect();
    let line_with =
        |out: &mut BufReader<std::process::ChildStdout>, prefix: &str| -> Result<String, Error> {
            let mut line = String::new();
            loop {
                line.clear();
                if out.read_line(&mut line)? == 0 {
                    return Err(Error::Owner(format!(
                        "a client of the owner ended before its {prefix} line (its error is above)"
                    )));
                }
                if let Some(rest) = line.strip_prefix(prefix) {
                    return Ok(rest.trim().to_owned());
                }
            }
        };
    for out in &mut outs {
        line_with(out, "READY")?;
    }
    let start = Instant::now();
    for c in children.iter_mut() {
        let mut stdin = c.stdin.take().expect("piped");
        stdin.write_all(b"GO\n")?;
    }
    let mut streams = Vec::new();
    for out in &mut outs {
        let json = line_with(out, "RESULT")?;
        streams.push(serde_json::from_str::<OwnerStream>(&json)?);
    }
    let seconds = start.elapsed().as_secs_f64();
    for c in children.iter_mut() {
        let status = c.wait()?;
        if !status.success() {
            return Err(Error::Owner(format!(
                "a client of the owner failed: {status}"
            )));
        }
    }
    Ok((streams, seconds))
}

/// One client: connect, declare, wait for GO, run frames at its rate for its seconds with
/// every result checked, print its report.
pub(crate) fn owner_client(args: &OwnerClientArgs) -> Result<(), Error> {
    let model = zoo::yolov5s_like(300)?;
    let frames = Frames::load(&args.frames, &model)?;
    let options = Options {
        pool_bytes: 32 << 20,
        name: args.name.clone(),
    };
    let mut client = Client::connect_wait(&args.socket, &options, Duration::from_secs(10))?;
    let mut decl = StreamDecl::new(&args.name, "yolov5s").priority(args.priority);
    let period = args
        .fps
        .map(|f| Duration::from_nanos(1_000_000_000 / u64::from(f.max(1))));
    if let Some(p) = period {
        decl = decl.period(p);
    }
    if let Some(w) = args.max_wait_ms {
        decl = decl.max_wait(Duration::from_millis(w));
    }
    let stream = client.declare(&decl)?;
    let pool = Arc::clone(client.pool());
    // A periodic stream keeps a few frames' buffers (its frames queue while the device runs
    // another stream's batch); one as fast as it can keeps two, double-buffered.
    let depth = if period.is_some() { 4 } else { 2 };
    let mut inputs = Vec::with_capacity(depth);
    let mut results = Vec::with_capacity(depth);
    for _ in 0..depth {
        inputs.push(pool.alloc(stream.input_bytes as usize)?);
        results.push(pool.alloc(stream.result_bytes as usize)?);
    }
    let mut got = vec![0u8; stream.result_bytes as usize];
    println!("READY");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let mut latency =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    let mut free: Vec<usize> = (0..depth).collect();
    let mut frame_of = vec![0u64; depth];
    let mut since = vec![Instant::now(); depth];
    let (mut n, mut done, mut wrong, mut other, mut dropped) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let end = start + Duration::from_secs(args.seconds);
    let mut next = start;
    loop {
        let now = Instant::now();
        let open = now < end;
        let due = period.is_none() || now >= next;
        if open && due {
            if let Some(b) = free.pop() {
                let pattern = Frames::of(args.index, n);
                inputs[b].write(0, &frames.inputs[pattern])?;
                client.submit(&stream, &inputs[b], &results[b], b as u64)?;
                frame_of[b] = n;
                // Latency counts from the frame's arrival: its time in the period, or now.
                since[b] = if period.is_some() { next } else { now };
                n += 1;
                if let Some(p) = period {
                    next += p;
                }
                continue;
            } else if let Some(p) = period {
                // Its time came with every buffer out: the frame is dropped, as a camera's.
                dropped += 1;
                n += 1;
                next += p;
                continue;
            }
        }
        if !open && free.len() == depth {
            break;
        }
        let wait = match period {
            Some(_) if open => next.saturating_duration_since(Instant::now()),
            _ => Duration::from_secs(20),
        };
        let c = match client.wait(Some(wait.max(Duration::from_micros(50)))) {
            Ok(c) => c,
            Err(userdma_owner::Error::Timeout(_)) if open => continue,
            Err(e) => return Err(e.into()),
        };
        let b = usize::try_from(c.tag).unwrap_or(usize::MAX);
        if b >= depth || free.contains(&b) {
            return Err(Error::Owner(format!(
                "a completion with tag {} not out",
                c.tag
            )));
        }
        if c.status == chan::STATUS_OK {
            results[b].read(0, &mut got)?;
            let pattern = Frames::of(args.index, frame_of[b]);
            wrong += u64::from(got != frames.expected[pattern]);
            done += 1;
            let ns = u64::try_from(since[b].elapsed().as_nanos()).unwrap_or(u64::MAX);
            let _ = latency.record(ns.max(1));
        } else {
            other += 1;
        }
        free.push(b);
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = client.stats()?;
    let s = stats.streams.first().copied().unwrap_or_default();
    let report = OwnerStream {
        name: args.name.clone(),
        frames: done,
        wrong,
        other,
        dropped,
        fps: done as f64 / seconds.max(1e-9),
        latency_mean_ms: latency.mean() / 1e6,
        latency_p99_ms: latency.value_at_quantile(0.99) as f64 / 1e6,
        longest_head_wait_ms: s.max_head_wait_ns as f64 / 1e6,
        stated_wait_bound_ms: (s.bound_ns > 0).then_some(s.bound_ns as f64 / 1e6),
    };
    println!("RESULT {}", serde_json::to_string(&report)?);
    Ok(())
}

/// The text beside the in-process run.
pub(super) fn print_owner(run: &OwnerRun, after: &super::figures::RunFigures) {
    println!();
    println!(
        "through the device owner (each stream a process of its own, {:.1} s), beside \"after\" in one process:",
        run.seconds
    );
    println!(
        "  {:<12} {:>14} {:>11} {:>16} {:>16} {:>22}",
        "stream",
        "in-process fps",
        "owner fps",
        "p99 ms (in-proc)",
        "p99 ms (owner)",
        "longest wait / bound"
    );
    for s in &run.streams {
        let inproc = after.streams.iter().find(|x| x.name == s.name);
        let bound = s
            .stated_wait_bound_ms
            .map_or("none".to_string(), |b| format!("{b:.1} ms"));
        println!(
            "  {:<12} {:>14} {:>11.1} {:>16} {:>16.1} {:>22}",
            s.name,
            inproc.map_or("-".into(), |x| format!("{:.1}", x.fps)),
            s.fps,
            inproc.map_or("-".into(), |x| format!("{:.1}", x.latency_p99_ms)),
            s.latency_p99_ms,
            format!("{:.1} ms / {bound}", s.longest_head_wait_ms),
        );
    }
    let wrong: u64 = run.streams.iter().map(|s| s.wrong).sum();
    let frames: u64 = run.streams.iter().map(|s| s.frames).sum();
    println!(
        "  total: {:.1} frames/s through the owner, {:.1} in one process: {:.3} of it; {:.1} switches/s; {} of {} frames wrong",
        run.total_fps, run.in_process_total_fps, run.ratio, run.switches_per_sec, wrong, frames
    );
}
