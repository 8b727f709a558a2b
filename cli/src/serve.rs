//! `userdma serve`: the device owner on the loopback NPU, for client processes to share
//! (`userdma_owner`); and the hidden `owner-client` the case study runs through it.
//!
//! ```text
//! userdma serve --socket /run/userdma/owner.sock --allow-uid 1000 --model chain=chain:2:16384
//! ```
//!
//! The owner listens until SIGINT or SIGTERM (or `--seconds`), then tells its clients it is
//! going, lets the frames on the device finish and prints what it did: clients served and
//! refused, frames, context switches, resets.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use nix::sys::signal::Signal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{zoo, Config as PipelineConfig, Model, WorkingSet};
use userdma_infer::sched::Policy;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};
use userdma_owner::proto::OwnerFigures;
use userdma_owner::server::{
    Access, Config, CounterSource, Entry, Limits, LoopbackCounters, Owner,
};

use crate::pipeline::Error;

/// A model the owner serves, as `--model NAME=SPEC` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ModelArg {
    name: String,
    spec: ModelSpec,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ModelSpec {
    /// The YOLOv5s-like model of the case study (its working set declared for the SRAM model).
    Yolo,
    /// A chain of `layers` steps over tensors of `bytes`.
    Chain { layers: u32, bytes: u64 },
}

/// Parses `NAME=yolov5s` or `NAME=chain:LAYERS:BYTES`.
fn parse_model(text: &str) -> Result<ModelArg, String> {
    let form = "give NAME=yolov5s or NAME=chain:LAYERS:BYTES, e.g. chain=chain:2:16384";
    let (name, spec) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} has no '=': {form}"))?;
    if name.is_empty() || name.len() > 32 {
        return Err(format!("model name {name:?}: 1 to 32 bytes"));
    }
    let spec = match spec.split(':').collect::<Vec<_>>().as_slice() {
        ["yolov5s"] => ModelSpec::Yolo,
        ["chain", layers, bytes] => ModelSpec::Chain {
            layers: layers
                .parse()
                .map_err(|_| format!("layers {layers:?}: a number ({form})"))?,
            bytes: bytes
                .parse()
                .map_err(|_| format!("bytes {bytes:?}: a number ({form})"))?,
        },
        _ => return Err(format!("model {spec:?}: {form}")),
    };
    Ok(ModelArg {
        name: name.into(),
        spec,
    })
}

/// The scheduling policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum PolicyArg {
    /// Priority with batch switching (`--k`).
    Batch,
    /// Strict priority.
    Strict,
    /// Round-robin.
    RoundRobin,
}

/// `userdma serve`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeArgs {
    /// The loopback NPU (the only device the tool can drive frames on; a program gives
    /// `userdma_owner::server::Owner::bind` the engine of any other device).
    #[arg(long, default_value_t = true)]
    loopback: bool,
    /// A PCI device by BDF: refused with what to do (the tool has no engine for it).
    #[arg(long, value_name = "BDF", conflicts_with = "loopback")]
    bdf: Option<String>,
    /// The socket's path (default: $USERDMA_OWNER_SOCKET or /run/userdma/owner.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The socket file's mode, in octal (`660` or `0o660`), at most 777 and with read and
    /// write for the owner.
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    mode: u32,
    /// A user id allowed to connect (repeated; default: this process's user only).
    #[arg(long = "allow-uid", value_name = "UID", value_parser = parse_uid)]
    allow_uids: Vec<u32>,
    /// A group id allowed to connect (repeated).
    #[arg(long = "allow-gid", value_name = "GID", value_parser = parse_gid)]
    allow_gids: Vec<u32>,
    /// The policy over every client's streams.
    #[arg(long, value_enum, default_value_t = PolicyArg::Batch)]
    policy: PolicyArg,
    /// Frames per batch under `--policy batch`.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    k: u32,
    /// Frames on the device at once (1: the stated wait bounds hold).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    in_flight: u64,
    /// Clients at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    max_clients: u32,
    /// MiB of one client's pool at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    max_pool_mib: u64,
    /// Streams per client.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_streams: u32,
    /// Frames one client may have out.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_frames: u32,
    /// A model clients may name: NAME=yolov5s or NAME=chain:LAYERS:BYTES (repeated; default
    /// yolov5s=yolov5s and chain=chain:2:16384).
    #[arg(long = "model", value_name = "NAME=SPEC", value_parser = parse_model)]
    models: Vec<ModelArg>,
    /// Queues of the loopback device (three per stream).
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u16).range(3..=32))]
    queues: u16,
    /// The loopback device's cost model.
    #[arg(long, value_enum, default_value_t = CostArg::Npu)]
    cost: CostArg,
    /// Stop after this many seconds, from 0.1 to 31536000 (a year) (default: at SIGINT or
    /// SIGTERM).
    #[arg(long, value_parser = parse_seconds)]
    seconds: Option<Duration>,
}

/// `--seconds`: a finite number of seconds a run can last (a `Duration` added to now).
fn parse_seconds(text: &str) -> Result<Duration, String> {
    crate::parse_seconds_in(
        text,
        0.1..=31_536_000.0,
        "give the seconds to serve, from 0.1 to 31536000 (a year), or leave --seconds out to \
         serve until SIGINT or SIGTERM",
    )
}

/// The loopback device's cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CostArg {
    /// The modelled NPU.
    Npu,
    /// No modelled cost: the host's speed.
    Zero,
}

/// `--mode`: octal permission bits, `660` or `0o660`. Bits above 0o777 (setuid, setgid,
/// sticky, file type) are refused, and so is a mode without read and write for the owner:
/// connecting to a Unix socket needs write permission on its file, so without it only root could
/// connect, not the owner's own user.
fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let mode = u32::from_str_radix(digits, 8)
        .ok()
        .filter(|&m| m <= 0o777 && !digits.starts_with('+'))
        .ok_or_else(|| {
            format!("mode {text:?}: give octal permission bits from 000 to 777, e.g. 660")
        })?;
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "mode {text:?} ({mode:03o}) gives the socket's owner no read and write: only root \
             could connect, not the owner's own user; give the owner rw, e.g. 600 (the owner's \
             user only) or 660 (and its group)"
        ));
    }
    Ok(mode)
}

/// `--allow-uid`: a user id, not `(uid_t)-1` (4294967295), which the kernel uses for "no user"
/// and no peer ever has.
fn parse_uid(text: &str) -> Result<u32, String> {
    parse_id(text, "user", "UID", "id -u USER")
}

/// `--allow-gid`: a group id, not `(gid_t)-1` (4294967295), which the kernel uses for "no
/// group" and no peer ever has.
fn parse_gid(text: &str) -> Result<u32, String> {
    parse_id(text, "group", "GID", "getent group GROUP")
}

fn parse_id(text: &str, kind: &str, flag: &str, lookup: &str) -> Result<u32, String> {
    let id: u32 = text.parse().map_err(|_| {
        format!("{flag} {text:?}: give a numeric {kind} id from 0 to 4294967294 (see `{lookup}`)")
    })?;
    if id == u32::MAX {
        return Err(format!(
            "{flag} {id} is (-1), which the kernel uses for \"no {kind}\": no peer ever has it, \
             so allowing it admits no one; give the numeric id of a real {kind} (see `{lookup}`)"
        ));
    }
    Ok(id)
}

/// What `serve` prints when it stops.
#[derive(Debug, Serialize)]
struct ServeReport {
    socket: PathBuf,
    seconds: f64,
    clients_left: u64,
    clients_vanished: u64,
    clients_closed: u64,
    clients_refused: u64,
    frames: u64,
    switches: u64,
    resets: u64,
}

/// The model of `spec` and its pipelines' settings.
fn entry(arg: &ModelArg) -> Result<Entry, Error> {
    let (model, pipeline) = match arg.spec {
        ModelSpec::Yolo => (
            zoo::yolov5s_like(300)?,
            PipelineConfig {
                depth: 2,
                working_set: Some(WorkingSet {
                    private: 2_400_000,
                    shared: zoo::YOLOV5S_WEIGHTS,
                    key: 0,
                }),
                ..PipelineConfig::default()
            },
        ),
        ModelSpec::Chain { layers, bytes } => (
            Model::chain(layers, bytes)?,
            PipelineConfig {
                depth: 2,
                ..PipelineConfig::default()
            },
        ),
    };
    Ok(Entry {
        name: arg.name.clone(),
        model,
        pipeline,
    })
}

/// The owner's configuration from `args`.
fn config(args: &ServeArgs, socket: PathBuf) -> Result<Config, Error> {
    let models = if args.models.is_empty() {
        vec![
            parse_model("yolov5s=yolov5s").map_err(Error::Owner)?,
            parse_model("chain=chain:2:16384").map_err(Error::Owner)?,
        ]
    } else {
        args.models.clone()
    };
    let mut config = Config::new(socket);
    for m in &models {
        if config.models.iter().any(|e| e.name == m.name) {
            return Err(Error::Usage(format!(
                "model {:?} given twice: name each model once",
                m.name
            )));
        }
        config = config.model(entry(m)?);
    }
    config.mode = args.mode;
    if !args.allow_uids.is_empty() || !args.allow_gids.is_empty() {
        config.access = Access {
            uids: args.allow_uids.clone(),
            gids: args.allow_gids.clone(),
        };
    }
    config.policy = match args.policy {
        PolicyArg::Batch => Policy::Batch { k: args.k },
        PolicyArg::Strict => Policy::StrictPriority,
        PolicyArg::RoundRobin => Policy::RoundRobin,
    };
    config.in_flight = args.in_flight as usize;
    config.limits = Limits {
        clients: args.max_clients,
        pool_bytes: args.max_pool_mib << 20,
        streams: args.max_streams,
        in_flight: args.max_frames,
    };
    Ok(config)
}

/// A loopback runtime with room for `streams` streams of the largest of `models`.
fn runtime(config: &Config, queues: u16, cost: Cost) -> Result<Runtime, Error> {
    let arena = config
        .models
        .iter()
        .map(|e| (e.model.arena_bytes() + (1 << 20)) * e.pipeline.depth as u64)
        .max()
        .unwrap_or(0);
    let streams = u64::from(queues / 3).max(1);
    let memory = usize::try_from(arena * streams).unwrap_or(usize::MAX) + (64 << 20);
    Ok(Runtime::loopback(
        loopback::Config::default()
            .name("owner0")
            .cost(cost)
            .queues(queues)
            .memory_size(memory),
    )?)
}

pub(crate) fn run(args: &ServeArgs, json: bool) -> Result<(), Error> {
    if let Some(bdf) = &args.bdf {
        if let Err(e) = bdf.parse::<userdma::pci::Bdf>() {
            return Err(Error::Usage(format!("--bdf {bdf:?}: {e}")));
        }
        return Err(Error::Usage(format!(
            "{bdf}: the tool runs frames only on the loopback NPU; a device's own engine \
             (userdma_infer::accel::Accelerator) goes to userdma_owner::server::Owner::bind from \
             a program of yours"
        )));
    }
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(userdma_owner::client::default_socket);
    let mut config = config(args, socket.clone())?;
    let cost = match args.cost {
        CostArg::Npu => Cost::npu(),
        CostArg::Zero => Cost::zero(),
    };
    let rt = runtime(&config, args.queues, cost)?;
    // The device's counters in the stats clients ask for (`userdma top` shows them).
    config.counters = rt
        .loopback_device()
        .map(|d| Arc::new(LoopbackCounters::new(Arc::clone(d))) as Arc<dyn CounterSource>);
    let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt)?);
    let names: Vec<String> = config.models.iter().map(|e| e.name.clone()).collect();
    let mut owner = Owner::bind(engine, config).map_err(|e| Error::Owner(e.to_string()))?;
    crate::signals::catch(&[Signal::SIGINT, Signal::SIGTERM])
        .map_err(|e| Error::Owner(format!("sigaction: {e}")))?;
    let start = Instant::now();
    // The line scripts wait for.
    println!(
        "userdma serve: listening on {} (loopback NPU, models {})",
        socket.display(),
        names.join(", ")
    );
    let deadline = args.seconds.map(|s| start + s);
    while !crate::signals::stopped() && deadline.is_none_or(|d| Instant::now() < d) {
        owner
            .turn(Duration::from_millis(100))
            .map_err(|e| Error::Owner(e.to_string()))?;
    }
    owner
        .run(&AtomicBool::new(true))
        .map_err(|e| Error::Owner(e.to_string()))?;
    let f: OwnerFigures = owner.figures();
    let report = ServeReport {
        socket,
        seconds: start.elapsed().as_secs_f64(),
        clients_left: f.left,
        clients_vanished: f.vanished,
        clients_closed: f.closed,
        clients_refused: f.refused,
        frames: f.frames,
        switches: f.switches,
        resets: f.resets,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "userdma serve: stopped after {:.1} s: {} frames, {} context switches, {} resets; \
             clients: {} left, {} vanished, {} closed for bad messages, {} refused",
            report.seconds,
            report.frames,
            report.switches,
            report.resets,
            report.clients_left,
            report.clients_vanished,
            report.clients_closed,
            report.clients_refused
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_the_owner_can_use_parse() {
        for (text, mode) in [
            ("660", 0o660),
            ("0660", 0o660),
            ("0o660", 0o660),
            ("600", 0o600),
            ("666", 0o666),
            ("777", 0o777),
        ] {
            assert_eq!(parse_mode(text), Ok(mode), "{text}");
        }
        for bad in [
            "0", "0o077", "066", "460", "200", "1660", "999", "", "0o", "+660", "rw",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_parse_but_not_the_kernels_no_id() {
        assert_eq!(parse_uid("0"), Ok(0));
        assert_eq!(parse_uid("1000"), Ok(1000));
        assert_eq!(parse_gid("4294967294"), Ok(u32::MAX - 1));
        for bad in ["4294967295", "-1", "4294967296", "alice"] {
            assert!(parse_uid(bad).is_err(), "{bad}");
            assert!(parse_gid(bad).is_err(), "{bad}");
        }
    }
}
