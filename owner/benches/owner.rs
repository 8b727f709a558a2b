//! What the device owner costs a frame: the same model on the same kind of device, run by the
//! application itself (a `Pipeline` in its process) and through an owner in another process
//! (this binary run again as the owner; the client in the bench thread), in the same run.
//!
//! - **one at a time** (depth 1): submit a frame, wait for it, read its result; the
//!   difference per frame is what the owner adds to a frame's latency (its socket-free path:
//!   the submission ring, the owner's loop, the completion ring, and the doorbells when either
//!   side sleeps). Target: at most 10 µs more per frame.
//! - **four in flight** (depth 4): frames/s with four frames out at once, both ways. Target:
//!   the owner's within 2 % of the application's own.
//!
//! Both sides run the model the same way: one pipeline of depth 4, results copied back, split
//! across the loopback device's copy engine and compute unit, completions by interrupt; each
//! frame's 16 KiB input is written into a DMA buffer (the pipeline's slot, or the client's
//! buffer in the pool the owner made for it) and its 16 KiB result read out of one. The
//! owner's pipeline reads and writes the client's buffers in place (no copy in the owner).
//!
//! Each cell is the median of 11 rounds of 2000 frames (with its range), a round of each side
//! in turn so that both see the same machine, for the zero-cost device model (the software
//! path alone) and the npu model (device time as an NPU would take it). Where the process may
//! use CPUs 0 and 1, the device's engine runs on CPU 1 and everything else (the application,
//! the client, the owner's loop) on CPU 0; the load average is printed before and after.
//! Then criterion timings of one frame each way (zero cost, depth 1).
//!
//! ```text
//! cargo bench -p userdma-owner --features server --bench owner               # the table and the timings
//! cargo bench -p userdma-owner --features server --bench owner -- --test     # quick: 50 frames, one round, each bench once
//! cargo bench -p userdma-owner --features server --bench owner -- table-only # the table alone (a filter no criterion bench matches)
//! ```

use std::os::raw::c_int;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use userdma::Runtime;
use userdma_infer::accel::{Accelerator, LoopbackEngine};
use userdma_infer::pipeline::{Config as PipelineConfig, Model, Pipeline, Results};
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};
use userdma_owner::server::{Config, Entry, Owner};
use userdma_owner::{chan, Client, Options, Stream, StreamDecl};

/// Set in the owner process's environment (its value: the cost model).
const ROLE: &str = "USERDMA_OWNER_BENCH_OWNER";
/// The owner's socket, in its environment.
const SOCKET: &str = "USERDMA_OWNER_BENCH_SOCKET";
/// "1" when the owner pins its threads.
const PINNED: &str = "USERDMA_OWNER_BENCH_PINNED";
const HOST_CPU: usize = 0;
const ENGINE_CPU: usize = 1;
/// Frames out at once in the throughput rows.
const DEPTH: usize = 4;
const WAIT: Duration = Duration::from_secs(20);

fn model() -> Model {
    Model::chain(2, 16 << 10).expect("model")
}

/// The pipeline both sides run: depth 4, results copied back, the rest as by default.
fn pipeline_config() -> PipelineConfig {
    PipelineConfig {
        depth: DEPTH,
        results: Results::Copy,
        ..PipelineConfig::default()
    }
}

fn cost(name: &str) -> Cost {
    match name {
        "zero" => Cost::zero(),
        "npu" => Cost::npu(),
        other => panic!("no cost model {other:?}"),
    }
}

/// Whether this process may use CPUs 0 and 1.
fn two_cpus() -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it in; CPU_ISSET reads
    // bits 0 and 1, inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
            && libc::CPU_ISSET(HOST_CPU, &set)
            && libc::CPU_ISSET(ENGINE_CPU, &set)
    }
}

/// Restricts the calling thread to `cpus` (best effort).
fn set_affinity(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes bits 0 or 1 inside it;
    // the kernel only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// A loopback device of `cost`, its engine on [`ENGINE_CPU`] when `pinned`; the calling thread
/// ends on [`HOST_CPU`] then (the device is made while both are allowed, so that its engine
/// may move to its own).
fn device(cost: Cost, pinned: bool) -> Runtime {
    let mut config = loopback::Config::default().cost(cost);
    if pinned {
        set_affinity(&[HOST_CPU, ENGINE_CPU]);
        config = config.engine_cpu(ENGINE_CPU as u32);
    }
    let rt = Runtime::loopback(config).expect("loopback device");
    if pinned {
        set_affinity(&[HOST_CPU]);
    }
    rt
}

// ---- the owner process ----

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// This binary run as the owner: serves the model until SIGTERM (or its parent's death).
fn owner_process(cost_name: &str) -> ! {
    // SAFETY: prctl with constant arguments: the kernel sends SIGTERM when the parent dies.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t) };
    let socket = PathBuf::from(std::env::var_os(SOCKET).expect("the socket's path"));
    let pinned = std::env::var(PINNED).is_ok_and(|v| v == "1");
    let rt = device(cost(cost_name), pinned);
    let engine: Arc<dyn Accelerator> = Arc::new(LoopbackEngine::new(&rt).expect("engine"));
    let config = Config {
        in_flight: DEPTH,
        ..Config::new(&socket)
    }
    .model(Entry {
        name: "chain".into(),
        model: model(),
        pipeline: pipeline_config(),
    });
    let mut owner = Owner::bind(engine, config).expect("bind");
    owner.run(&STOP).expect("the owner's loop");
    drop(owner);
    drop(rt);
    std::process::exit(0);
}

/// An owner process of one cost model, stopped when dropped.
struct OwnerProcess {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl OwnerProcess {
    fn start(cost_name: &str, pinned: bool) -> OwnerProcess {
        let dir = tempfile::tempdir().expect("a directory for the socket");
        let socket = dir.path().join("owner.sock");
        let child = Command::new(std::env::current_exe().expect("this binary"))
            .env(ROLE, cost_name)
            .env(SOCKET, &socket)
            .env(PINNED, if pinned { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("the owner process");
        OwnerProcess {
            child,
            socket,
            _dir: dir,
        }
    }

    fn connect(&self) -> Client {
        let options = Options {
            pool_bytes: 16 << 20,
            name: "bench".into(),
        };
        Client::connect_wait(&self.socket, &options, WAIT).expect("connect to the owner")
    }
}

impl Drop for OwnerProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the two ways ----

/// Runs `frames` frames in the application's own pipeline, at most `depth` out at once;
/// returns the time taken.
fn in_process(
    p: &mut Pipeline,
    depth: usize,
    frames: u64,
    input: &[u8],
    out: &mut [u8],
) -> Duration {
    let start = Instant::now();
    let (mut submitted, mut done) = (0u64, 0u64);
    while done < frames {
        while submitted < frames && p.in_flight() < depth {
            match p.try_submit(|_, i| i.write(0, input)).expect("submit") {
                Some(_) => submitted += 1,
                None => break,
            }
        }
        p.flush().expect("flush");
        done += p
            .wait(|d| {
                let o = d.result.expect("the frame ran");
                o.read(0, out).expect("read the result");
            })
            .expect("wait") as u64;
    }
    start.elapsed()
}

/// The same through the owner: `frames` frames of `stream`, at most `depth` out at once.
fn through_owner(
    client: &mut Client,
    stream: &Stream,
    depth: usize,
    frames: u64,
    input: &[u8],
    out: &mut [u8],
) -> Duration {
    let pool = Arc::clone(client.pool());
    let buffers: Vec<_> = (0..depth)
        .map(|_| {
            (
                pool.alloc(stream.input_bytes as usize)
                    .expect("input buffer"),
                pool.alloc(stream.result_bytes as usize)
                    .expect("result buffer"),
            )
        })
        .collect();
    let mut free: Vec<usize> = (0..depth).collect();
    let start = Instant::now();
    let (mut submitted, mut done) = (0u64, 0u64);
    while done < frames {
        while submitted < frames {
            let Some(b) = free.pop() else { break };
            let (i, r) = &buffers[b];
            i.write(0, input).expect("write the input");
            client.submit(stream, i, r, b as u64).expect("submit");
            submitted += 1;
        }
        let c = client.wait(Some(WAIT)).expect("a completion");
        assert_eq!(c.status, chan::STATUS_OK, "{c:?}");
        let b = c.tag as usize;
        buffers[b].1.read(0, out).expect("read the result");
        free.push(b);
        done += 1;
    }
    start.elapsed()
}

/// One cost model's pair: its own device and pipeline here, an owner process with a client
/// and a stream.
struct Rig {
    _rt: Runtime,
    pipeline: Pipeline,
    _owner: OwnerProcess,
    client: Client,
    stream: Stream,
    input: Vec<u8>,
    out: Vec<u8>,
}

impl Rig {
    fn new(cost_name: &str, pinned: bool) -> Rig {
        let owner = OwnerProcess::start(cost_name, pinned);
        let rt = device(cost(cost_name), pinned);
        let model = model();
        let pipeline = Pipeline::new(&rt, model.clone(), pipeline_config()).expect("pipeline");
        let mut client = owner.connect();
        let stream = client
            .declare(&StreamDecl::new("bench", "chain"))
            .expect("declare");
        let input: Vec<u8> = (0..model.input().bytes).map(|i| (i * 13) as u8).collect();
        let out = vec![0u8; model.result().bytes as usize];
        Rig {
            _rt: rt,
            pipeline,
            _owner: owner,
            client,
            stream,
            input,
            out,
        }
    }

    fn local(&mut self, depth: usize, frames: u64) -> Duration {
        in_process(
            &mut self.pipeline,
            depth,
            frames,
            &self.input,
            &mut self.out,
        )
    }

    fn remote(&mut self, depth: usize, frames: u64) -> Duration {
        through_owner(
            &mut self.client,
            &self.stream,
            depth,
            frames,
            &self.input,
            &mut self.out,
        )
    }
}

// ---- the table ----

/// The median of `v` and its range.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn table(frames: u64, rounds: usize, pinned: bool) {
    println!(
        "owner vs in-process, a chain of 2 layers over 16 KiB tensors, {frames} frames per round, \
         median of {rounds} round(s) each way (range in brackets); {}; load average {} before",
        if pinned {
            "device engine on CPU 1, application, client and owner loop on CPU 0"
        } else {
            "not pinned (CPUs 0 and 1 not both available)"
        },
        loadavg()
    );
    println!(
        "{:<5} {:<7} {:>22} {:>22} {:>22} {:>10} {:>10} {:>22}",
        "cost",
        "depth",
        "in-process us/frame",
        "owner us/frame",
        "diff us (<= 10)",
        "in fps",
        "owner fps",
        "fps ratio (>= 0.98)"
    );
    for cost_name in ["zero", "npu"] {
        let mut rig = Rig::new(cost_name, pinned);
        for depth in [1, DEPTH] {
            // Warm both ways up: caches, the owner's scheduler, the device's idle spin.
            rig.local(depth, frames / 4 + 4);
            rig.remote(depth, frames / 4 + 4);
            let (mut local, mut remote, mut diff, mut ratio) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                let l = rig.local(depth, frames).as_secs_f64() * 1e6 / frames as f64;
                let r = rig.remote(depth, frames).as_secs_f64() * 1e6 / frames as f64;
                local.push(l);
                remote.push(r);
                diff.push(r - l);
                ratio.push(l / r);
            }
            let (l, l0, l1) = spread(&mut local);
            let (r, r0, r1) = spread(&mut remote);
            let (d, d0, d1) = spread(&mut diff);
            let (q, q0, q1) = spread(&mut ratio);
            println!(
                "{cost_name:<5} {depth:<7} {:>22} {:>22} {:>22} {:>10.0} {:>10.0} {:>22}",
                format!("{l:.1} [{l0:.1}-{l1:.1}]"),
                format!("{r:.1} [{r0:.1}-{r1:.1}]"),
                format!("{d:+.1} [{d0:+.1} to {d1:+.1}]"),
                1e6 / l,
                1e6 / r,
                format!("{q:.3} [{q0:.3}-{q1:.3}]"),
            );
        }
    }
    println!(
        "(depth 1: one frame submitted and waited for at a time, us/frame its latency; depth {DEPTH}: \
         {DEPTH} frames out at once, us/frame = 1/throughput; fps ratio = owner fps / in-process fps, \
         the median of the rounds' ratios; load average {} after)",
        loadavg()
    );
}

fn main() {
    if let Ok(cost_name) = std::env::var(ROLE) {
        owner_process(&cost_name);
    }
    let quick = std::env::args().any(|a| a == "--test");
    let pinned = two_cpus();
    if quick {
        println!("(test mode: 50 frames, one round, to check the table runs; not a measurement)");
        table(50, 1, pinned);
    } else {
        table(2000, 11, pinned);
    }
    if std::env::args().any(|a| a == "table-only") {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut rig = Rig::new("zero", pinned);
    let mut g = c.benchmark_group("owner/frame");
    g.bench_function("in-process", |b| b.iter_custom(|n| rig.local(1, n.max(1))));
    g.bench_function("owner", |b| b.iter_custom(|n| rig.remote(1, n.max(1))));
    g.finish();
    drop(rig);
    c.final_summary();
}
