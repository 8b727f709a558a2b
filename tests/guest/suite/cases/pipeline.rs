//! A short inference pipeline on a real device: edu's DMA engine moves each frame's input into
//! the device and its result back out, and the host runs the model's layers over the result as
//! a stand-in for the compute edu does not have.
//!
//! `pipeline::Pipeline` speaks the loopback device's descriptor rings, which edu does not have
//! (one register-driven DMA engine), so this case builds its own pipeline from the same parts:
//! a `Runtime` that owns the VFIO device, a `pool::Pool` in its DMA space, and the loopback
//! device's layer transform (`device::loopback::reference::layer`).
//!
//! Two slots (double buffering), each owning an input and a result buffer from the pool,
//! allocated and mapped before the first frame, and each using its own half of edu's 4 KiB
//! buffer. Per frame: preprocess writes the input into the slot's input buffer; edu copies it
//! into the slot's half of its buffer, then back out into the slot's result buffer; the host
//! runs two layers over the result and checks the output byte for byte against what the frame
//! number gives. While the host computes and checks frame `n`, edu already runs frame `n + 1`'s
//! first transfer. A slot belongs to the engine from the transfer's start to its interrupt.
//!
//! What edu cannot do: it has one engine that runs one transfer at a time and ignores writes to
//! its DMA registers while one runs, so no frame's transfer overlaps another's (frame `n + 1`
//! cannot go in while frame `n` comes out), and a timer ends each transfer about 100 ms after it
//! starts: the engine, not the host, sets the rate (about 5 frames a second).

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::vfio::IrqKind;
use userdma::device::Device;
use userdma::irq::EventFd;
use userdma::memory::PageSize;
use userdma::pool::{Config, OwnedBuffer, Pool};
use userdma_infer::stats;
use userdma_loopback::reference;

use super::{compare, vfio, CANARY};
use crate::edu::{self, Direction, Edu, Transfer};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// Frames through the pipeline.
const FRAMES: u32 = 64;
/// Slots: frames in flight at most.
const DEPTH: usize = 2;
/// How many frames ahead a freed slot is refilled: [`DEPTH`], as a frame number.
const AHEAD: u32 = 2;
/// Each slot's buffers, and its share of edu's 4096-byte buffer.
const SLOT: usize = 2048;
/// The longest frame: a multiple of the layer's 4-byte word that keeps the last slot's
/// transfers off the device buffer's last byte (see `edu::MAX_TRANSFER`).
const FRAME_MAX: usize = 2044;
// Every slot's frames fit its buffers and its half of edu's buffer, the last slot's too.
const _: () = assert!(FRAME_MAX % 4 == 0 && FRAME_MAX <= SLOT);
const _: () = assert!((DEPTH - 1) * SLOT + FRAME_MAX <= edu::MAX_TRANSFER);
/// The seeds of the model's two layers.
const LAYER_SEEDS: [u32; 2] = [0x5eed_0001, 0x5eed_0002];
/// The pool's memory: two 2 MiB hugepages.
const POOL_LEN: usize = 4 << 20;

/// The length of frame `n`: 2044 bytes down to 1564, in steps of 32, so that a count register
/// left from an earlier transfer would show.
fn frame_len(n: u32) -> usize {
    let shorter = 32 * (n % 16);
    FRAME_MAX - usize::try_from(shorter).expect("below 512")
}

/// Word `index` of frame `n`'s input: a hash of both, so that no two frames agree and a stale
/// result (the slot's previous frame) fails the check.
fn input_word(n: u32, index: u32) -> u32 {
    let mut h = n.wrapping_mul(0x9e37_79b9) ^ index.wrapping_mul(0x85eb_ca6b) ^ 0x1f2e_3d4c;
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

/// Words in `len` bytes (a frame length, far below `u32::MAX`).
fn words(len: usize) -> u32 {
    u32::try_from(len / 4).unwrap_or(u32::MAX)
}

/// One slot: its buffers, its half of edu's buffer, and the frame it holds.
#[derive(Debug)]
struct Slot {
    /// Which slot (0 or 1).
    index: usize,
    /// What preprocessing writes and edu reads.
    input: OwnedBuffer,
    /// What edu writes and the host computes over.
    result: OwnedBuffer,
    /// Where in edu's buffer the slot's frame goes.
    offset: usize,
    /// The frame it holds.
    frame: u32,
    /// That frame's length.
    len: usize,
}

impl Slot {
    /// Slot `index` with two buffers from `pool`, checked to be usable by edu whole.
    fn new(pool: &Arc<Pool>, index: usize) -> Result<Slot, Failure> {
        let buffer = |what: &str| -> Result<OwnedBuffer, Failure> {
            let buffer = pool
                .alloc_owned(SLOT)
                .context(|| format!("allocate slot {index}'s {what} buffer ({SLOT} bytes)"))?;
            ensure!(
                buffer.as_buffer().contiguous_len() >= SLOT
                    && (buffer.iova().raw() + SLOT as u64 - 1) >> edu::DMA_MASK_BITS == 0,
                "slot {index}'s {what} buffer at {:#x}: not contiguous for the device, or past edu's {}-bit mask",
                buffer.iova().raw(),
                edu::DMA_MASK_BITS
            );
            Ok(buffer)
        };
        Ok(Slot {
            index,
            input: buffer("input")?,
            result: buffer("result")?,
            offset: index * SLOT,
            frame: 0,
            len: 0,
        })
    }

    /// Makes the slot hold frame `n`: its input written straight into the input buffer, one
    /// word at a time, and the result buffer filled with [`CANARY`] (so that a byte edu did not
    /// write shows).
    fn preprocess(&mut self, n: u32) -> Result<(), Failure> {
        self.frame = n;
        self.len = frame_len(n);
        let input = self.input.slice();
        for k in 0..words(self.len) {
            input
                .write::<u32>(4 * k as usize, input_word(n, k).to_le())
                .context(|| format!("frame {n}: write input word {k}"))?;
        }
        self.result.slice().fill(CANARY);
        Ok(())
    }

    /// The transfer edu does for the slot in `direction`.
    fn start(&self, edu: &Edu, direction: Direction) -> Result<Transfer, Failure> {
        let buffer = match direction {
            Direction::ToDevice => &self.input,
            Direction::FromDevice => &self.result,
        };
        edu.start(direction, buffer.iova().raw(), self.offset, self.len, true)
    }
}

/// A slot whose transfer edu runs: the engine holds it until the transfer's interrupt.
#[derive(Debug)]
struct InFlight {
    slot: Slot,
    transfer: Transfer,
}

/// What the frames measured.
#[derive(Debug, Default)]
struct Tally {
    /// Time in host-to-device transfers (start to interrupt), all frames.
    to_device: Duration,
    /// Time in device-to-host transfers.
    from_device: Duration,
    /// The host's compute stand-in (reading the result, two layers).
    compute: Duration,
    /// Computing the expected output from the frame number and comparing.
    check: Duration,
    /// Writing inputs and filling result buffers.
    preprocess: Duration,
    /// The engine idle between one transfer's interrupt and the next transfer's start.
    idle: Duration,
    /// Transfers done.
    transfers: u64,
    /// The eventfd counts of their interrupts.
    interrupts: u64,
    /// Most frames in flight (held by the host's compute or by the engine) at once.
    most_in_flight: usize,
    /// Frames computed and checked while edu ran the next frame's transfer.
    overlapped: u32,
    /// Of those, how many ended with the engine still busy.
    busy_after: u32,
    /// Frames checked.
    checked: u32,
}

/// edu's engine, with the interrupt vector its transfers end on and what they measured.
#[derive(Debug)]
struct Engine<'a> {
    edu: &'a Edu,
    vector: &'a EventFd,
    tally: Tally,
    /// When the last transfer's interrupt arrived.
    last_end: Option<Instant>,
}

impl Engine<'_> {
    /// Starts the slot's transfer in `direction`; the engine holds the slot until [`complete`].
    ///
    /// [`complete`]: Engine::complete
    fn submit(&mut self, slot: Slot, direction: Direction) -> Result<InFlight, Failure> {
        let transfer = slot
            .start(self.edu, direction)
            .map_err(|f| f.during(|| format!("frame {}, start {direction:?}", slot.frame)))?;
        if let Some(end) = self.last_end {
            self.tally.idle += transfer.started.saturating_duration_since(end);
        }
        Ok(InFlight { slot, transfer })
    }

    /// Waits for the transfer's interrupt, checks and acknowledges it, and hands the slot back.
    fn complete(&mut self, flight: InFlight) -> Result<Slot, Failure> {
        let InFlight { slot, transfer } = flight;
        let during = || {
            format!(
                "frame {} (slot {}, {} bytes), {:?}",
                slot.frame, slot.index, slot.len, transfer.direction
            )
        };
        let (end, fired) = self
            .edu
            .wait_irq(&transfer, self.vector)
            .map_err(|f| f.during(during))?;
        let status = self.edu.irq_status().map_err(|f| f.during(during))?;
        if status & edu::IRQ_DMA == 0 {
            return Err(Failure::Check(format!(
                "{}: an interrupt arrived, but edu's interrupt status is {status:#x}, without the DMA bit {:#x}",
                during(),
                edu::IRQ_DMA
            )));
        }
        self.edu
            .ack_irq(edu::IRQ_DMA)
            .map_err(|f| f.during(during))?;
        if self.edu.busy().map_err(|f| f.during(during))? {
            return Err(Failure::Check(format!(
                "{}: the DMA interrupt arrived while the engine still runs",
                during()
            )));
        }
        let took = end.saturating_duration_since(transfer.started);
        match transfer.direction {
            Direction::ToDevice => self.tally.to_device += took,
            Direction::FromDevice => self.tally.from_device += took,
        }
        self.tally.transfers += 1;
        self.tally.interrupts += fired;
        self.last_end = Some(end);
        Ok(slot)
    }
}

/// Host memory for the compute stand-in and the check, allocated once.
#[derive(Debug)]
struct Host {
    got: Vec<u8>,
    hidden: Vec<u8>,
    out: Vec<u8>,
    want_in: Vec<u8>,
    want_hidden: Vec<u8>,
    want_out: Vec<u8>,
    tail: Vec<u8>,
}

impl Host {
    fn new() -> Host {
        let buffer = || vec![0_u8; SLOT];
        Host {
            got: buffer(),
            hidden: buffer(),
            out: buffer(),
            want_in: buffer(),
            want_hidden: buffer(),
            want_out: buffer(),
            tail: buffer(),
        }
    }

    /// The compute stand-in: the slot's result copied out of its DMA buffer, and the model's
    /// two layers run over it.
    fn compute(&mut self, slot: &Slot) -> Result<(), Failure> {
        let (n, len) = (slot.frame, slot.len);
        slot.result
            .read(0, &mut self.got[..len])
            .context(|| format!("frame {n}: read the result buffer"))?;
        layers(
            &self.got[..len],
            &mut self.hidden[..len],
            &mut self.out[..len],
        )
        .map_err(|why| Failure::Check(format!("frame {n}: the compute stand-in: {why}")))
    }

    /// The check: the output equals the model run on the host over the input the frame number
    /// gives, and edu wrote nothing in the result buffer past the frame.
    fn check(&mut self, slot: &Slot) -> Result<(), Failure> {
        let (n, len) = (slot.frame, slot.len);
        for (k, word) in (0_u32..).zip(self.want_in[..len].chunks_exact_mut(4)) {
            word.copy_from_slice(&input_word(n, k).to_le_bytes());
        }
        layers(
            &self.want_in[..len],
            &mut self.want_hidden[..len],
            &mut self.want_out[..len],
        )
        .map_err(|why| Failure::Check(format!("frame {n}: the host's expected output: {why}")))?;
        if let Err(why) = compare(&self.want_out[..len], &self.out[..len]) {
            let brought = match compare(&self.want_in[..len], &self.got[..len]) {
                Ok(()) => "the bytes edu brought back are the input".to_owned(),
                Err(dma) => format!("of the bytes edu brought back, {dma}"),
            };
            return Err(Failure::Check(format!(
                "frame {n} ({len} bytes, slot {} at device offset {:#x}): the output is wrong: {why}; {brought}",
                slot.index, slot.offset
            )));
        }
        let tail = &mut self.tail[..SLOT - len];
        slot.result
            .read(len, tail)
            .context(|| format!("frame {n}: read the result buffer past the frame"))?;
        if let Some(at) = tail.iter().position(|&b| b != CANARY) {
            return Err(Failure::Check(format!(
                "frame {n}: edu wrote byte {} of the result buffer, past the frame's {len} bytes",
                len + at
            )));
        }
        Ok(())
    }
}

/// The model: two of the loopback device's layers, `input` to `hidden` to `out`.
fn layers(input: &[u8], hidden: &mut [u8], out: &mut [u8]) -> Result<(), reference::Error> {
    reference::layer(LAYER_SEEDS[0], &[input], hidden)?;
    reference::layer(LAYER_SEEDS[1], &[hidden], out)?;
    Ok(())
}

/// Runs the frames through the two slots and returns what they measured. The slots end in
/// `retired` (allocated by the caller: the frames allocate nothing), so that the pool sees no
/// free during the frames.
fn run(
    edu: &Edu,
    vector: &EventFd,
    slots: [Slot; DEPTH],
    host: &mut Host,
    retired: &mut Vec<Slot>,
) -> Result<Tally, Failure> {
    let mut engine = Engine {
        edu,
        vector,
        tally: Tally::default(),
        last_end: None,
    };
    let [mut first, mut second] = slots;
    let mark = Instant::now();
    first.preprocess(0)?;
    second.preprocess(1)?;
    engine.tally.preprocess += mark.elapsed();
    let mut next = Some(second);
    let mut flight = Some(engine.submit(first, Direction::ToDevice)?);
    for n in 0..FRAMES {
        let Some(to_device) = flight.take() else {
            return Err(Failure::Check(format!(
                "frame {n} was never started (a pipeline bug)"
            )));
        };
        let slot = engine.complete(to_device)?;
        let from_device = engine.submit(slot, Direction::FromDevice)?;
        let mut slot = engine.complete(from_device)?;
        ensure!(
            slot.frame == n,
            "frame {} came back where frame {n} was due",
            slot.frame
        );
        // The engine takes the next frame before the host looks at this one.
        flight = match next.take() {
            Some(waiting) => Some(engine.submit(waiting, Direction::ToDevice)?),
            None => None,
        };
        let in_flight = 1 + usize::from(flight.is_some());
        engine.tally.most_in_flight = engine.tally.most_in_flight.max(in_flight);
        let mark = Instant::now();
        host.compute(&slot)?;
        let computed = Instant::now();
        host.check(&slot)?;
        engine.tally.compute += computed - mark;
        engine.tally.check += computed.elapsed();
        engine.tally.checked += 1;
        if flight.is_some() {
            engine.tally.overlapped += 1;
            if edu.busy()? {
                engine.tally.busy_after += 1;
            }
        }
        if n + AHEAD < FRAMES {
            let mark = Instant::now();
            slot.preprocess(n + AHEAD)?;
            engine.tally.preprocess += mark.elapsed();
            next = Some(slot);
        } else {
            retired.push(slot);
        }
    }
    Ok(engine.tally)
}

/// What the steady state must not change: the DMA space's maps and unmaps, the pool's
/// allocations and frees, and the process's heap allocations.
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

/// The pipeline through edu, opened through VFIO with one MSI vector.
pub(crate) fn edu_vfio(env: &Env) -> Result<(), Failure> {
    let options = vfio::options(env).interrupts(IrqKind::Msi, 1);
    let (bound, vfio, device) = vfio::open(env, &options)?;
    let vector = vfio
        .interrupt(0)
        .context(|| "the MSI vector's eventfd".to_owned())?;
    let runtime = vfio::runtime(&vfio);
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    let slots = [Slot::new(&pool, 0)?, Slot::new(&pool, 1)?];
    let addresses = format!(
        "inputs at {:#x} and {:#x}, results at {:#x} and {:#x}",
        slots[0].input.iova().raw(),
        slots[1].input.iova().raw(),
        slots[0].result.iova().raw(),
        slots[1].result.iova().raw()
    );
    // Nothing pending from an earlier case: each interrupt counted below is a transfer's.
    let pending = device.irq_status()?;
    if pending != 0 {
        device.ack_irq(pending)?;
    }
    vector
        .try_read()
        .context(|| "drain the MSI eventfd".to_owned())?;
    let mut host = Host::new();
    let mut retired = Vec::with_capacity(DEPTH);

    let before = Counters::read(&runtime, &pool);
    let heap = stats::allocations();
    let start = Instant::now();
    let ran = run(&device, &vector, slots, &mut host, &mut retired);
    let wall = start.elapsed();
    let heap = stats::allocations() - heap;
    let after = Counters::read(&runtime, &pool);
    let tally = ran?;

    let transfers = 2 * u64::from(FRAMES);
    ensure!(
        tally.checked == FRAMES && tally.transfers == transfers,
        "{} frames checked and {} transfers done, want {FRAMES} and {transfers}",
        tally.checked,
        tally.transfers
    );
    ensure!(
        tally.interrupts == tally.transfers,
        "{} interrupts for {} transfers: want one each",
        tally.interrupts,
        tally.transfers
    );
    ensure!(
        tally.most_in_flight == DEPTH && tally.overlapped == FRAMES - 1,
        "at most {} frames in flight and {} of {FRAMES} frames computed while edu ran the next: want {DEPTH} and {}",
        tally.most_in_flight,
        tally.overlapped,
        FRAMES - 1
    );
    ensure!(
        after == before && heap == 0,
        "the frames changed the counters: DMA maps {} -> {}, unmaps {} -> {}, pool allocations {} -> {}, frees {} -> {}, {heap} heap allocations; want no change",
        before.maps,
        after.maps,
        before.unmaps,
        after.unmaps,
        before.pool_allocs,
        after.pool_allocs,
        before.pool_frees,
        after.pool_frees
    );

    let frames = f64::from(FRAMES);
    let dma = tally.to_device + tally.from_device;
    let us = |d: Duration| 1e3 * ms(d) / frames;
    println!(
        "INFO pipeline-edu-vfio: {FRAMES} frames of {}..={FRAME_MAX} bytes, {DEPTH} slots of {SLOT} bytes at edu buffer offsets 0x0 and {SLOT:#x} ({addresses}), in {:.2} s: {:.2} frames/s (the engine's own bound: {:.2} frames/s)",
        frame_len(15),
        wall.as_secs_f64(),
        frames / wall.as_secs_f64(),
        frames / dma.as_secs_f64()
    );
    println!(
        "INFO pipeline-edu-vfio: per frame: DMA {:.1} ms (to device {:.1} ms, from device {:.1} ms); host compute {:.1} us, check {:.1} us, preprocess {:.1} us; engine idle between transfers {:.1} us a transfer",
        ms(dma) / frames,
        ms(tally.to_device) / frames,
        ms(tally.from_device) / frames,
        us(tally.compute),
        us(tally.check),
        us(tally.preprocess),
        1e3 * ms(tally.idle) / (tally.transfers - 1).max(1) as f64
    );
    println!(
        "INFO pipeline-edu-vfio: in flight: {} frames; {} of {FRAMES} frames computed and checked while edu ran the next frame's transfer (still running when the check ended: {}); {} interrupts for {} transfers; during the frames: {} DMA maps, {} unmaps, {} pool allocations, {} heap allocations",
        tally.most_in_flight,
        tally.overlapped,
        tally.busy_after,
        tally.interrupts,
        tally.transfers,
        after.maps - before.maps,
        after.unmaps - before.unmaps,
        after.pool_allocs - before.pool_allocs,
        heap
    );
    println!(
        "INFO pipeline-edu-vfio: not possible on edu: two transfers at once (it has one DMA engine, which ignores its DMA registers while a transfer runs), so frame n+1 cannot go in while frame n comes out; each transfer ends on a timer about 100 ms after it starts, so the engine sets the rate; the compute is the host's (edu has none)"
    );

    drop(retired);
    drop(pool);
    vfio.disable_interrupts()
        .context(|| "disable interrupts".to_owned())?;
    drop(vector);
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_fit_their_slot_and_edu_buffer() {
        for n in 0..FRAMES {
            let len = frame_len(n);
            assert!(
                len % 4 == 0 && len > 0 && len <= FRAME_MAX,
                "frame {n}: {len}"
            );
        }
        assert_eq!(frame_len(0), FRAME_MAX);
        assert_eq!(usize::try_from(AHEAD).unwrap(), DEPTH);
    }

    #[test]
    fn inputs_differ_between_frames_and_words() {
        let frame = |n| (0..words(FRAME_MAX)).map(move |k| input_word(n, k));
        for n in 0..FRAMES {
            for m in (n + 1)..FRAMES {
                let same = frame(n).zip(frame(m)).filter(|(a, b)| a == b).count();
                assert!(same < 4, "frames {n} and {m} agree in {same} words");
            }
        }
        let first: Vec<u32> = frame(0).collect();
        let mut sorted = first.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert!(sorted.len() > first.len() - 4);
    }

    #[test]
    fn a_wrong_input_word_shows_in_the_output() {
        let input: Vec<u8> = (0..words(FRAME_MAX))
            .flat_map(|k| input_word(3, k).to_le_bytes())
            .collect();
        let (mut hidden, mut out) = (vec![0; FRAME_MAX], vec![0; FRAME_MAX]);
        layers(&input, &mut hidden, &mut out).unwrap();
        let mut flipped = input.clone();
        flipped[100] ^= 1;
        let mut out2 = vec![0; FRAME_MAX];
        layers(&flipped, &mut hidden, &mut out2).unwrap();
        assert_ne!(out[100..104], out2[100..104]);
    }
}
