//! The device owner on a real device: `userdma_owner::server::Owner` opens edu through VFIO
//! ([`EduEngine`] with a queue per stream, taking turns on edu's one DMA engine) in a thread
//! of the suite and runs the streams of two client processes under its one scheduler. The
//! clients are this program run again (`guest_suite --child owner-client …`): each connects
//! over the owner's Unix socket, gets a pool the owner mapped for edu (`Accelerator::map_host`)
//! and rings of its own, declares a stream of another priority (one periodic, one as fast as
//! possible with a maximum wait), submits frames by buffer offset for [`RUN`], checks every
//! result against the model run on the host (`Model::expected`) and prints what it saw and
//! what the owner's stats say about its stream.
//!
//! Each frame is the input into the arena through edu's buffer (two transfers), the model's
//! steps on the host, and the result copied back to the client's buffer (two more): about
//! 400 ms of QEMU's timer, so the few frames of the run are the device's whole time.
//!
//! Checked: both clients ran frames and every frame they submitted came back right (none
//! failed, refused or lost); each stream's longest wait is within the bound the owner states
//! for it (and there is one); edu ran exactly the transfers the frames need, one MSI each; and
//! once both clients left, the owner holds nothing (no client, stream, mapped byte or frame in
//! flight) and the engine knows no client region any more.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use userdma::device::vfio::IrqKind;
use userdma::device::Device;
use userdma_infer::accel::Accelerator;
use userdma_infer::pipeline::{Config as PipelineConfig, Model};
use userdma_owner::proto::{OwnerFigures, StreamFigures};
use userdma_owner::server::{Config, Entry, Owner};
use userdma_owner::{chan, Client, Options, StreamDecl};

use super::pipeline::fill;
use super::{cause, vfio};
use crate::edu_engine::queue::transfers_for;
use crate::edu_engine::EduEngine;
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};
use crate::program;

/// The case's name, in its report lines.
const CASE: &str = "owner-edu-two-clients";
/// The role that runs a client (`guest_suite --child owner-client …`).
pub(crate) const CLIENT_ROLE: &str = "owner-client";
/// The model, as the owner names it: two layers over 2 KiB tensors (one chunk of edu's buffer
/// each way).
const MODEL: &str = "chain";
const LAYERS: u32 = 2;
const BYTES: u64 = 2048;
/// Queues of the engine: one per stream.
const QUEUES: u16 = 2;
/// Each client's pool.
const POOL_BYTES: u64 = 4 << 20;
/// How long each client submits frames (then waits for the ones out).
const RUN: Duration = Duration::from_secs(2);
/// The longest a client process may take, and a client's wait for one completion.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(20);
/// How long the owner may take to let go of both clients once they exited.
const SETTLE: Duration = Duration::from_secs(10);

/// One client process's settings.
#[derive(Debug, Clone, Copy)]
struct Spec {
    name: &'static str,
    /// The stream's seed for its inputs (`pipeline::fill`).
    seed: u32,
    priority: u8,
    /// 0: as fast as possible.
    period_ms: u64,
    /// 0: none.
    max_wait_ms: u64,
}

impl Spec {
    fn args(&self, socket: &Path) -> Vec<String> {
        vec![
            "--child".into(),
            CLIENT_ROLE.into(),
            socket.display().to_string(),
            self.name.into(),
            self.seed.to_string(),
            self.priority.to_string(),
            self.period_ms.to_string(),
            self.max_wait_ms.to_string(),
            RUN.as_millis().to_string(),
        ]
    }
}

/// A periodic stream of the higher priority, and one as fast as possible of the lower with a
/// maximum wait.
const CLIENTS: [Spec; 2] = [
    Spec {
        name: "live",
        seed: 1,
        priority: 1,
        period_ms: 600,
        max_wait_ms: 0,
    },
    Spec {
        name: "batch",
        seed: 2,
        priority: 0,
        period_ms: 0,
        max_wait_ms: 3000,
    },
];

fn model() -> Result<Model, Failure> {
    Model::chain(LAYERS, BYTES)
        .map_err(userdma_infer::Error::from)
        .context(|| format!("a {LAYERS}-layer chain of {BYTES}-byte tensors"))
}

/// What a client printed on its `CLIENT` line: `key=value` pairs.
#[derive(Debug, Default)]
struct Seen {
    fields: Vec<(String, u64)>,
}

impl Seen {
    /// The `CLIENT` line of `stdout`.
    fn parse(stdout: &str) -> Option<Seen> {
        let line = stdout.lines().find_map(|l| l.strip_prefix("CLIENT "))?;
        let fields = line
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_owned(), v.parse().ok()?))
            })
            .collect();
        Some(Seen { fields })
    }

    fn get(&self, key: &str) -> Result<u64, Failure> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|&(_, v)| v)
            .ok_or_else(|| Failure::Check(format!("no {key}= on the client's line")))
    }
}

/// The owner in a thread: stopped and joined when dropped (also when the case fails early),
/// so that nothing of it uses edu once the case tears the device down.
struct Running {
    stop: Arc<AtomicBool>,
    figures: Arc<Mutex<OwnerFigures>>,
    thread: Option<thread::JoinHandle<Result<OwnerFigures, String>>>,
}

impl Running {
    /// Binds an owner of `config` on `device` in a thread and runs it until stopped.
    fn start(device: Arc<dyn Accelerator>, config: Config) -> Result<Running, Failure> {
        let stop = Arc::new(AtomicBool::new(false));
        let figures = Arc::new(Mutex::new(OwnerFigures::default()));
        let (tx, rx) = mpsc::channel();
        let (stop2, figures2) = (Arc::clone(&stop), Arc::clone(&figures));
        let thread = thread::spawn(move || {
            let mut owner = match Owner::bind(device, config) {
                Ok(owner) => owner,
                Err(e) => {
                    let _ = tx.send(Err(cause("bind the owner's socket", &e)));
                    return Err("not started".to_owned());
                }
            };
            let _ = tx.send(Ok(()));
            let failed = |e: userdma_owner::server::Error| cause("the owner's loop", &e).chain();
            while !stop2.load(Ordering::Relaxed) {
                owner.turn(Duration::from_millis(20)).map_err(failed)?;
                *figures2.lock().unwrap_or_else(PoisonError::into_inner) = owner.figures();
            }
            // Its shutdown: the clients told, the device drained, every connection closed.
            owner.run(&AtomicBool::new(true)).map_err(failed)?;
            Ok(owner.figures())
        });
        let running = Running {
            stop,
            figures,
            thread: Some(thread),
        };
        match rx.recv_timeout(WAIT) {
            Ok(Ok(())) => Ok(running),
            Ok(Err(failure)) => Err(failure),
            Err(_) => Err(Failure::Check(format!(
                "the owner did not start within {WAIT:?}"
            ))),
        }
    }

    fn figures(&self) -> OwnerFigures {
        *self.figures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops the owner; its last figures.
    fn stop(mut self) -> Result<OwnerFigures, Failure> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("joined once");
        match thread.join() {
            Ok(result) => result.map_err(Failure::Check),
            Err(_) => Err(Failure::Check("the owner's thread panicked".to_owned())),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The owner on edu through VFIO, with two client processes.
pub(crate) fn edu_two_clients(env: &Env) -> Result<(), Failure> {
    let options = vfio::options(env).interrupts(IrqKind::Msi, 1);
    let (bound, vfio, device) = vfio::open(env, &options)?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let runtime = vfio::runtime(&vfio);
    let engine = Arc::new(EduEngine::with_queues(
        runtime.clone(),
        device,
        Some(vector),
        QUEUES,
    )?);
    let model = model()?;
    let dir = tempfile::tempdir().context(|| "a directory for the owner's socket".to_owned())?;
    let socket = dir.path().join("owner.sock");
    let edu: Arc<dyn Accelerator> = Arc::clone(&engine) as Arc<dyn Accelerator>;
    let config = Config::new(&socket).model(Entry {
        name: MODEL.into(),
        model: model.clone(),
        pipeline: PipelineConfig::for_device(edu.as_ref(), &model),
    });
    // The owner's own default: batch switching (a stream keeps the device for a few frames
    // while another waits), whose bounds it states.
    let policy = config.policy;
    let before = engine.stats();
    let owner = Running::start(edu, config)?;

    let exe = std::env::current_exe().context(|| "this program's path".to_owned())?;
    let exe = exe.display().to_string();
    let start = Instant::now();
    let runs: Vec<Result<program::Run, Failure>> = thread::scope(|scope| {
        let children: Vec<_> = CLIENTS
            .iter()
            .map(|spec| {
                let (exe, args) = (&exe, spec.args(&socket));
                scope.spawn(move || program::run(exe, CASE, spec.name, &args, CLIENT_TIMEOUT))
            })
            .collect();
        children
            .into_iter()
            .map(|child| {
                child
                    .join()
                    .unwrap_or_else(|_| Err(Failure::Check("a client's thread panicked".into())))
            })
            .collect()
    });
    let clients_ms = start.elapsed().as_millis();

    let mut seen = Vec::with_capacity(CLIENTS.len());
    for (spec, run) in CLIENTS.iter().zip(runs) {
        let run = run?;
        ensure!(
            run.status.success(),
            "client {} ended with {}: {}",
            spec.name,
            run.status,
            run.stdout
                .lines()
                .chain(run.stderr.lines())
                .find(|l| l.starts_with("ERROR") || l.contains("panicked"))
                .unwrap_or("(no error line)")
        );
        let s = Seen::parse(&run.stdout).ok_or_else(|| {
            Failure::Check(format!("client {} printed no CLIENT line", spec.name))
        })?;
        seen.push(s);
    }

    // Both left: the owner lets go of everything of theirs.
    let deadline = Instant::now() + SETTLE;
    let settled = loop {
        let f = owner.figures();
        if f.clients == 0 && f.streams == 0 && f.mapped_bytes == 0 && f.in_flight == 0 {
            break f;
        }
        ensure!(
            Instant::now() < deadline,
            "{SETTLE:?} after both clients exited the owner still holds {} clients, {} streams, {} mapped bytes, {} frames in flight",
            f.clients,
            f.streams,
            f.mapped_bytes,
            f.in_flight
        );
        thread::sleep(Duration::from_millis(10));
    };
    let last = owner.stop()?;
    let after = engine.settle_interrupts(Duration::from_secs(1))?;

    let mut frames = 0;
    for (spec, s) in CLIENTS.iter().zip(&seen) {
        let (done, submitted) = (s.get("frames")?, s.get("submitted")?);
        let (wait, stated) = (s.get("max_head_wait")?, s.get("bound")?);
        ensure!(
            done > 0 && done == submitted && s.get("wrong")? == 0 && s.get("other")? == 0,
            "client {}: {done} of {submitted} frames came back right, {} wrong, {} not run",
            spec.name,
            s.get("wrong")?,
            s.get("other")?
        );
        ensure!(
            s.get("owner_frames")? == done,
            "client {}: the owner counts {} frames of its stream, the client {done}",
            spec.name,
            s.get("owner_frames")?
        );
        ensure!(
            stated > 0 && wait <= stated,
            "client {}: its longest wait was {:.1} ms, the bound the owner states {:.1} ms (0: none)",
            spec.name,
            wait as f64 / 1e6,
            stated as f64 / 1e6
        );
        frames += done;
        println!(
            "INFO {CASE}: client {} (priority {}, {}): {done} of {submitted} frames right; longest head wait {:.1} ms <= stated bound {:.1} ms; longest frame {:.1} ms, latency max {:.1} ms",
            spec.name,
            spec.priority,
            match (spec.period_ms, spec.max_wait_ms) {
                (0, 0) => "as fast as possible".to_owned(),
                (0, w) => format!("as fast as possible, max wait {w} ms"),
                (p, _) => format!("every {p} ms"),
            },
            wait as f64 / 1e6,
            stated as f64 / 1e6,
            s.get("frame_ns")? as f64 / 1e6,
            s.get("latency_max")? as f64 / 1e6
        );
    }
    ensure!(
        last.frames == frames && last.vanished == 0 && last.resets == 0 && last.left == 2,
        "the owner: {} frames (the clients saw {frames}), {} clients vanished, {} left, {} resets; want every frame, both left on their own, no reset",
        last.frames,
        last.vanished,
        last.left,
        last.resets
    );
    let per_frame = transfers_for(model.input().bytes) + transfers_for(model.result().bytes);
    let transfers = after.transfers - before.transfers;
    ensure!(
        transfers == frames * per_frame,
        "edu ran {transfers} transfers for {frames} frames: want {per_frame} a frame (the input in, the result back)"
    );
    ensure!(
        after.interrupts - before.interrupts == transfers,
        "{} interrupts for {transfers} transfers: want one each",
        after.interrupts - before.interrupts
    );
    ensure!(
        engine.mapped_regions() == 0,
        "the engine still knows {} client regions after both left",
        engine.mapped_regions()
    );
    println!(
        "INFO {CASE}: owner ({policy}): {frames} frames of 2 clients in {clients_ms} ms, {} context switches, edu {transfers} transfers ({per_frame} a frame), {} MSIs; after both left: {} clients, {} streams, {} mapped bytes, {} in flight",
        last.switches,
        after.interrupts - before.interrupts,
        settled.clients,
        settled.streams,
        settled.mapped_bytes,
        settled.in_flight
    );

    drop(engine);
    vfio.disable_interrupts()
        .context(|| "disable interrupts".to_owned())?;
    drop(runtime);
    drop(vfio);
    drop(dir);
    bound.release()
}

/// A client process (`guest_suite --child owner-client SOCKET NAME SEED PRIORITY PERIOD_MS
/// MAX_WAIT_MS RUN_MS`): one stream, frames for RUN_MS, every result checked; prints
/// `CLIENT key=value…` with what it saw and what the owner's stats say.
pub(crate) fn client(args: &[&str]) -> Result<(), Failure> {
    let [socket, name, seed, priority, period_ms, max_wait_ms, run_ms] = args else {
        return Err(Failure::Check(format!(
            "{CLIENT_ROLE} takes SOCKET NAME SEED PRIORITY PERIOD_MS MAX_WAIT_MS RUN_MS, not {args:?}"
        )));
    };
    let num = |what: &str, text: &str| {
        text.parse::<u64>()
            .map_err(|_| Failure::Check(format!("{what} {text:?} is not a number")))
    };
    let seed = u32::try_from(num("SEED", seed)?).unwrap_or(0);
    let priority = u8::try_from(num("PRIORITY", priority)?).unwrap_or(u8::MAX);
    let (period, max_wait, run) = (
        num("PERIOD_MS", period_ms)?,
        num("MAX_WAIT_MS", max_wait_ms)?,
        num("RUN_MS", run_ms)?,
    );
    let options = Options {
        pool_bytes: POOL_BYTES,
        name: (*name).to_owned(),
    };
    let mut client = Client::connect(socket, &options)
        .map_err(|e| cause(&format!("connect to the owner at {socket}"), &e))?;
    let mut decl = StreamDecl::new(name, MODEL).priority(priority);
    if period > 0 {
        decl = decl.period(Duration::from_millis(period));
    }
    if max_wait > 0 {
        decl = decl.max_wait(Duration::from_millis(max_wait));
    }
    let stream = client
        .declare(&decl)
        .map_err(|e| cause("declare the stream", &e))?;
    let model = model()?;
    ensure!(
        stream.input_bytes == model.input().bytes && stream.result_bytes == model.result().bytes,
        "the owner's {MODEL} takes {} bytes and gives {}; this client's model {} and {}",
        stream.input_bytes,
        stream.result_bytes,
        model.input().bytes,
        model.result().bytes
    );
    let pool = Arc::clone(client.pool());
    // A periodic stream keeps a few frames' buffers (a late completion does not hold up the
    // next period); one as fast as possible two (one on the device, one waiting).
    let depth = if period > 0 { 4 } else { 2 };
    let buffers = |bytes: u64| {
        (0..depth)
            .map(|_| pool.alloc(bytes as usize))
            .collect::<Result<Vec<_>, _>>()
            .context(|| format!("{depth} buffers of {bytes} bytes from the pool"))
    };
    let inputs = buffers(stream.input_bytes)?;
    let results = buffers(stream.result_bytes)?;
    let mut scratch = vec![0_u8; stream.input_bytes as usize];
    let mut got = vec![0_u8; stream.result_bytes as usize];
    let mut free: Vec<usize> = (0..depth).collect();
    let mut frame_of = vec![0_u64; depth];
    let (mut n, mut done, mut wrong, mut other) = (0_u64, 0_u64, 0_u64, 0_u64);
    let mut first_wrong = None;
    let mut latency_max = 0;
    let start = Instant::now();
    let end = start + Duration::from_millis(run);
    let mut next = start;
    loop {
        let now = Instant::now();
        let open = now < end;
        if open && (period == 0 || now >= next) {
            if let Some(b) = free.pop() {
                fill(seed, n, &mut scratch);
                inputs[b]
                    .write(0, &scratch)
                    .context(|| format!("write frame {n}'s input"))?;
                client
                    .submit(&stream, &inputs[b], &results[b], b as u64)
                    .map_err(|e| cause(&format!("submit frame {n}"), &e))?;
                frame_of[b] = n;
                n += 1;
                if period > 0 {
                    next += Duration::from_millis(period);
                }
                continue;
            }
        }
        if !open && free.len() == depth {
            break;
        }
        let timeout = if period > 0 && open && !free.is_empty() {
            next.saturating_duration_since(Instant::now())
        } else {
            WAIT
        };
        let c = match client.wait(Some(timeout.max(Duration::from_micros(100)))) {
            Ok(c) => c,
            // A period's start, not a completion, was due.
            Err(userdma_owner::Error::Timeout(_)) if timeout < WAIT => continue,
            Err(e) => return Err(cause("wait for a completion", &e)),
        };
        let b = usize::try_from(c.tag).unwrap_or(usize::MAX);
        ensure!(
            b < depth && !free.contains(&b),
            "a completion with tag {}, which names no buffer out",
            c.tag
        );
        if c.status == chan::STATUS_OK {
            results[b]
                .read(0, &mut got)
                .context(|| format!("read frame {}'s result", frame_of[b]))?;
            fill(seed, frame_of[b], &mut scratch);
            if got != model.expected(&scratch) {
                wrong += 1;
                first_wrong.get_or_insert(frame_of[b]);
            }
            done += 1;
            latency_max = latency_max.max(c.latency_ns);
        } else {
            println!("frame {} completed with status {}", frame_of[b], c.status);
            other += 1;
        }
        free.push(b);
    }
    if let Some(frame) = first_wrong {
        println!("frame {frame} came back wrong (the first of {wrong})");
    }
    let stats = client.stats().map_err(|e| cause("the owner's stats", &e))?;
    let s: StreamFigures = stats
        .streams
        .iter()
        .copied()
        .find(|s| s.stream == stream.id)
        .ok_or_else(|| Failure::Check(format!("no figures of stream {}", stream.id)))?;
    println!(
        "CLIENT frames={done} submitted={n} wrong={wrong} other={other} owner_frames={} \
         max_head_wait={} bound={} frame_ns={} latency_max={latency_max} ms={}",
        s.frames,
        s.max_head_wait_ns,
        s.bound_ns,
        s.frame_ns,
        start.elapsed().as_millis()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_line_parses_into_its_numbers() {
        let seen = Seen::parse("hello\nCLIENT frames=4 submitted=4 bound=12\nbye\n").unwrap();
        assert_eq!(seen.get("frames").unwrap(), 4);
        assert_eq!(seen.get("bound").unwrap(), 12);
        assert!(seen.get("wrong").is_err());
        assert!(Seen::parse("no line here").is_none());
    }

    #[test]
    fn a_client_is_given_every_argument_it_reads() {
        let args = CLIENTS[1].args(Path::new("/tmp/x/owner.sock"));
        assert_eq!(args[..3], ["--child", CLIENT_ROLE, "/tmp/x/owner.sock"]);
        assert_eq!(args.len(), 3 + 6);
        // What `client` reads after the socket.
        assert_eq!(args[3..], ["batch", "2", "0", "0", "3000", "2000"]);
    }

    #[test]
    fn an_edu_frame_is_four_transfers() {
        let model = model().unwrap();
        assert_eq!(
            transfers_for(model.input().bytes) + transfers_for(model.result().bytes),
            4
        );
    }
}
