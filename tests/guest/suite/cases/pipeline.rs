//! The library's inference pipeline on a real device: `Pipeline::on` over edu opened through
//! VFIO ([`EduEngine`]), with the settings the device can carry out (`Config::for_device`: one
//! in-order queue, waits on edu's MSI), the model's steps run on the host between edu's
//! transfers (edu has no compute: `accel::HostSteps`), and each result copied back by edu.
//!
//! Per frame of a two-layer chain of 2 KiB tensors: preprocessing writes the input straight
//! into the slot's pool buffer; edu copies it into the slot's arena (host memory mapped for
//! it), in two transfers through its own buffer; the host runs the two layers over the arena;
//! edu copies the result out to the slot's result buffer, in two more. Each transfer ends on
//! QEMU's timer about 100 ms after it starts, so the engine sets the rate (about 2.5 frames a
//! second); the host's part is microseconds.
//!
//! Checked: every frame's result equals the model run on the host over that frame's input
//! (`Model::reference`), frames come back in order and none fails, every step ran on the
//! host, edu ran exactly the transfers the frames need (two per chunk each way) and raised one
//! MSI for each; and after a few frames of warm-up, the frames made no heap allocation, no DMA
//! map or unmap and no pool allocation or free.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::vfio::IrqKind;
use userdma::device::Device;
use userdma::device::Wait;
use userdma::pool::Pool;
use userdma_infer::accel::{Accelerator, ComputeAt};
use userdma_infer::pipeline::{Config, Finished, Input, Model, Pipeline, Results, Summary};
use userdma_infer::stats;

use super::{compare, vfio};
use crate::edu_engine::queue::transfers_for;
use crate::edu_engine::EduEngine;
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// The model's layers, and the bytes of each of its tensors (the input and the result too):
/// one chunk of edu's buffer each way.
const LAYERS: u32 = 2;
const BYTES: u64 = 2048;
/// Frames before the counters are read (the steady state starts after them).
const WARMUP: u64 = 2;
/// Frames in the steady state: about 10 s of edu's transfers.
const FRAMES: u64 = 24;
/// Slots (double buffering).
const DEPTH: usize = 2;
/// How long the interrupts of the last transfers may take to be counted.
const SETTLE: Duration = Duration::from_secs(1);

/// Word `index` of stream `stream`'s frame `n`: a hash of all three, so that no two frames
/// agree and a stale result (the slot's previous frame) fails the check.
fn input_word(stream: u32, n: u64, index: u32) -> u32 {
    let n = (n as u32) ^ ((n >> 32) as u32).rotate_left(7) ^ stream.wrapping_mul(0x2545_f491);
    let mut h = n.wrapping_mul(0x9e37_79b9) ^ index.wrapping_mul(0x85eb_ca6b) ^ 0x1f2e_3d4c;
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

/// Stream `stream`'s frame `n`, written into `input` (a whole number of words).
pub(super) fn fill(stream: u32, n: u64, input: &mut [u8]) {
    for (k, word) in (0_u32..).zip(input.chunks_exact_mut(4)) {
        word.copy_from_slice(&input_word(stream, n, k).to_le_bytes());
    }
}

/// Checks each finished frame of one stream against the model run on the host, with buffers
/// allocated once (the check allocates nothing unless a frame is wrong).
#[derive(Debug)]
pub(super) struct Check {
    model: Model,
    stream: u32,
    input: Vec<u8>,
    arena: Vec<u8>,
    want: Vec<u8>,
    got: Vec<u8>,
    /// The frame due next.
    next: u64,
    /// Frames checked right.
    pub(super) right: u64,
    /// The first thing that was wrong.
    pub(super) failure: Option<String>,
    /// Per frame, summed: from the doorbell to the input in the arena, from there to the
    /// model's last step done, from there to the result back (zero when read in place).
    pub(super) to_device: Duration,
    pub(super) compute: Duration,
    pub(super) to_host: Duration,
}

impl Check {
    /// A check of stream `stream`'s frames of `model`.
    pub(super) fn new(model: &Model, stream: u32) -> Check {
        let bytes = |n: u64| vec![0_u8; usize::try_from(n).expect("a small model")];
        Check {
            model: model.clone(),
            stream,
            input: bytes(model.input().bytes),
            arena: bytes(model.arena_bytes()),
            want: bytes(model.result().bytes),
            got: bytes(model.result().bytes),
            next: 0,
            right: 0,
            failure: None,
            to_device: Duration::ZERO,
            compute: Duration::ZERO,
            to_host: Duration::ZERO,
        }
    }

    /// Checks `done`: the frame due, no device error, the result the model gives on the host.
    pub(super) fn take(&mut self, done: Finished<'_>) {
        let n = done.frame;
        let t = done.times;
        self.to_device += t.to_device.saturating_duration_since(t.submitted);
        self.compute += t.computed.saturating_duration_since(t.to_device);
        self.to_host += t.to_host.saturating_duration_since(t.computed);
        let due = self.next;
        self.next = n + 1;
        if self.failure.is_some() {
            return;
        }
        if n != due {
            self.failure = Some(format!("frame {n} came back where frame {due} was due"));
            return;
        }
        let out = match done.result {
            Ok(out) => out,
            Err(e) => {
                self.failure = Some(format!("frame {n} failed: {e}"));
                return;
            }
        };
        if let Err(e) = out.read(0, &mut self.got) {
            self.failure = Some(format!("frame {n}: reading the result failed: {e}"));
            return;
        }
        fill(self.stream, n, &mut self.input);
        self.model
            .reference(&self.input, &mut self.arena, &mut self.want);
        match compare(&self.want, &self.got) {
            Ok(()) => self.right += 1,
            Err(why) => {
                self.failure = Some(format!(
                    "frame {n} ({} bytes, result {}): the result is not the model's: {why}",
                    self.model.result().bytes,
                    if out.in_place() {
                        "read in place"
                    } else {
                        "copied back"
                    }
                ));
            }
        }
    }
}

/// Runs `frames` frames of stream 0 through `pipeline`, each input written by `fill` from
/// `scratch`, each result checked by `check`.
fn run(
    pipeline: &mut Pipeline,
    frames: u64,
    scratch: &mut [u8],
    check: &mut Check,
) -> Result<Summary, userdma_infer::Error> {
    pipeline.run(
        frames,
        |n, input: &Input<'_>| {
            fill(0, n, scratch);
            input.write(0, scratch)
        },
        |done| check.take(done),
    )
}

/// What the steady state must not change: the DMA space's maps and unmaps, the pool's
/// allocations and frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counters {
    maps: u64,
    unmaps: u64,
    pool_allocs: u64,
    pool_frees: u64,
}

impl Counters {
    fn read(runtime: &userdma::Runtime, pool: &Pool) -> Counters {
        let space = runtime.dma_space().stats();
        let pool = pool.stats();
        Counters {
            maps: space.maps,
            unmaps: space.unmaps,
            pool_allocs: pool.classes.iter().map(|c| c.allocs).sum::<u64>() + pool.large.allocs,
            pool_frees: pool.classes.iter().map(|c| c.frees).sum::<u64>() + pool.large.frees,
        }
    }
}

/// Milliseconds, for the report.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The library's pipeline on edu, opened through VFIO with one MSI vector.
pub(crate) fn edu_vfio(env: &Env) -> Result<(), Failure> {
    let options = vfio::options(env).interrupts(IrqKind::Msi, 1);
    let (bound, vfio, device) = vfio::open(env, &options)?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let runtime = vfio::runtime(&vfio);
    let engine = Arc::new(EduEngine::new(runtime.clone(), device, Some(vector))?);
    let model = Model::chain(LAYERS, BYTES)
        .map_err(userdma_infer::Error::from)
        .context(|| format!("a {LAYERS}-layer chain of {BYTES}-byte tensors"))?;
    let config = Config {
        depth: DEPTH,
        // edu copies each result back (what the case is about), instead of the measurement
        // `Results::Auto` makes, which picks reading the arena in place (host memory).
        results: Results::Copy,
        ..Config::for_device(engine.as_ref(), &model)
    };
    let device: Arc<dyn Accelerator> = Arc::clone(&engine) as Arc<dyn Accelerator>;
    let mut pipeline = Pipeline::on(device, model.clone(), config)
        .context(|| "build the pipeline on edu (Pipeline::on)".to_owned())?;
    ensure!(
        pipeline.compute() == ComputeAt::Host
            && !pipeline.config().split
            && pipeline.config().wait == Wait::Interrupt
            && !pipeline.result_path().in_place,
        "the pipeline on edu: compute {:?}, split {}, wait {:?}, results in place {}; want the host's compute, one queue, waits on the MSI, results copied",
        pipeline.compute(),
        pipeline.config().split,
        pipeline.config().wait,
        pipeline.result_path().in_place
    );
    let per_frame = transfers_for(model.input().bytes) + transfers_for(model.result().bytes);
    let steps = model.steps().len() as u64;
    let mut scratch = vec![0_u8; usize::try_from(model.input().bytes).expect("a small model")];
    let mut check = Check::new(&model, 0);

    run(&mut pipeline, WARMUP, &mut scratch, &mut check)
        .context(|| format!("run {WARMUP} frames of warm-up"))?;
    let pool = Arc::clone(pipeline.pool());
    let before = Counters::read(&runtime, &pool);
    let engine_before = engine.stats();
    let heap = stats::allocations();
    let start = Instant::now();
    let ran = run(&mut pipeline, FRAMES, &mut scratch, &mut check);
    let wall = start.elapsed();
    let heap = stats::allocations() - heap;
    let engine_after = engine.stats();
    let after = Counters::read(&runtime, &pool);
    let summary = ran.context(|| format!("run {FRAMES} frames"))?;

    if let Some(failure) = check.failure.take() {
        return Err(Failure::Check(failure));
    }
    let total = WARMUP + FRAMES;
    ensure!(
        check.right == total && summary.frames == total && summary.failed == 0,
        "{} frames checked right, the pipeline finished {} ({} failed); want {total}",
        check.right,
        summary.frames,
        summary.failed
    );
    ensure!(
        summary.host_steps == total * steps,
        "{} steps ran on the host, want {} ({steps} a frame)",
        summary.host_steps,
        total * steps
    );
    let transfers = engine_after.transfers - engine_before.transfers;
    ensure!(
        transfers == FRAMES * per_frame && engine_after.transfers == total * per_frame,
        "edu ran {transfers} transfers for {FRAMES} frames ({} in all for {total}); want {per_frame} a frame",
        engine_after.transfers
    );
    let settled = engine.settle_interrupts(SETTLE)?;
    ensure!(
        settled.interrupts == settled.transfers,
        "{} interrupts for {} transfers: want one each",
        settled.interrupts,
        settled.transfers
    );
    ensure!(
        after == before && heap == 0,
        "the steady-state frames changed the counters: DMA maps {} -> {}, unmaps {} -> {}, pool allocations {} -> {}, frees {} -> {}, {heap} heap allocations; want no change",
        before.maps,
        after.maps,
        before.unmaps,
        after.unmaps,
        before.pool_allocs,
        after.pool_allocs,
        before.pool_frees,
        after.pool_frees
    );

    let frames = FRAMES as f64;
    let engine_busy = Duration::from_nanos(engine_after.seen_ns - engine_before.seen_ns);
    let per = |d: Duration| ms(d) / total as f64;
    println!(
        "INFO pipeline-edu-vfio: Pipeline::on({}) with Config::for_device: a {LAYERS}-layer chain of {BYTES}-byte tensors ({}-byte arenas of host memory at IOVAs {}), depth {DEPTH}, one queue, waits on the MSI, compute on the host, results copied back by edu; {FRAMES} frames after {WARMUP} of warm-up in {:.2} s: {:.2} frames/s (edu's transfers alone: {:.2} frames/s)",
        engine.identity(),
        model.arena_bytes(),
        arenas(&engine),
        wall.as_secs_f64(),
        frames / wall.as_secs_f64(),
        frames / engine_busy.as_secs_f64().max(1e-9)
    );
    println!(
        "INFO pipeline-edu-vfio: per frame: from its doorbell to the input in the arena {:.1} ms (behind the frame before it on the one queue), {steps} steps on the host {:.3} ms, the result back {:.1} ms; {per_frame} transfers a frame ({} in all, {} bytes through edu's buffer), {} interrupts",
        per(check.to_device),
        per(check.compute),
        per(check.to_host),
        settled.transfers,
        settled.bytes,
        settled.interrupts
    );
    println!(
        "INFO pipeline-edu-vfio: during the {FRAMES} steady-state frames: {} DMA maps, {} unmaps, {} pool allocations, {} frees, {heap} heap allocations",
        after.maps - before.maps,
        after.unmaps - before.unmaps,
        after.pool_allocs - before.pool_allocs,
        after.pool_frees - before.pool_frees
    );
    println!(
        "INFO pipeline-edu-vfio: not possible on edu: compute (every step runs on the host), two transfers at once (one DMA engine), a transfer between host memory and host memory (each copy goes through edu's 4 KiB buffer, twice as many transfers), so the engine's timer (about 100 ms a transfer) sets the rate"
    );

    pipeline
        .shutdown(|_| {})
        .context(|| "shut the pipeline down".to_owned())?;
    drop(pool);
    drop(engine);
    vfio.disable_interrupts()
        .context(|| "disable interrupts".to_owned())?;
    drop(runtime);
    drop(vfio);
    bound.release()
}

/// The engine's arenas' addresses, for the report.
fn arenas(engine: &EduEngine) -> String {
    let at: Vec<String> = engine.arenas().iter().map(|a| format!("{a:#x}")).collect();
    at.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_differ_between_frames_streams_and_words() {
        let words = |s: u32, n: u64| (0..512).map(move |k| input_word(s, n, k));
        for (s, n, t, m) in [(0, 0, 0, 1), (0, 5, 1, 5), (1, 0, 0, 1 << 32), (0, 7, 0, 8)] {
            let same = words(s, n).zip(words(t, m)).filter(|(a, b)| a == b).count();
            assert!(
                same < 4,
                "stream {s} frame {n} and stream {t} frame {m}: {same}"
            );
        }
        let first: Vec<u32> = words(0, 0).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert!(sorted.len() > first.len() - 4);
    }

    #[test]
    fn a_wrong_input_word_shows_in_the_result() {
        let model = Model::chain(LAYERS, BYTES).unwrap();
        let mut check = Check::new(&model, 0);
        fill(0, 3, &mut check.input);
        model.reference(&check.input, &mut check.arena, &mut check.want);
        let right = check.want.clone();
        check.input[100] ^= 1;
        model.reference(&check.input, &mut check.arena, &mut check.want);
        assert_ne!(right, check.want);
    }

    #[test]
    fn a_frame_is_a_few_transfers() {
        let model = Model::chain(LAYERS, BYTES).unwrap();
        let per_frame = transfers_for(model.input().bytes) + transfers_for(model.result().bytes);
        assert_eq!(per_frame, 4);
        // About 100 ms a transfer: the frames stay near 10 s.
        assert!((WARMUP + FRAMES) * per_frame <= 110);
    }
}
