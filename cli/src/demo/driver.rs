//! One queue's host side: each transfer's input made and its expected bytes computed on the
//! host, its three descriptors written in batches, and every byte that comes back checked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use userdma::device::Range;
use userdma::pool::{self, OwnedBuffer, Pool};
use userdma::{ring, Runtime};
use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime, Wait};

use super::report::histogram;
use super::{DemoArgs, DemoError};

/// The compute pass every transfer goes through.
const XOR: u32 = 0x5a5a_5a5a;
const ADD: u32 = 0x0101_0101;
/// How long any single wait may take before the demo gives up.
const TIMEOUT: Option<Duration> = Some(Duration::from_secs(30));

/// What rides with each descriptor, with the number of its transfer.
enum Payload {
    /// The source buffer (host to device), held until the device has read it.
    Source(#[allow(dead_code)] OwnedBuffer, u64),
    /// Nothing host-side (the compute pass).
    Compute(u64),
    /// The destination buffer, the transfer's slot, and its batch's doorbell time.
    Destination(OwnedBuffer, u64, usize, Instant),
}

impl Payload {
    /// The transfer the descriptor belongs to.
    fn transfer(&self) -> u64 {
        match *self {
            Payload::Source(_, n) | Payload::Compute(n) | Payload::Destination(_, n, _, _) => n,
        }
    }
}

/// The input of the layer kernel that makes the demo's data (any constant will do; 4 KiB, so
/// the kernel's runs between wraps of it are long).
static PATTERN: [u8; 4096] = [0; 4096];

/// Deterministic input bytes of transfer `n` (`bytes` a positive multiple of 4 long): word `j`
/// is the layer mixing function of `n` and `j` ([`loopback::reference::mix`]), different for
/// every transfer and every word, made by the host's vectorised layer kernel.
pub(super) fn input(n: u64, bytes: &mut [u8]) -> Result<(), DemoError> {
    // Transfers 2^32 apart share a pattern: far beyond any run's count.
    let seed = n as u32 ^ (n >> 32) as u32;
    loopback::reference::layer(seed, &[&PATTERN[..]], bytes)
        .map(drop)
        .map_err(DemoError::Reference)
}

/// Into `out`, the bytes the device must give back for `input` (the compute pass), by the
/// host's reference of the device's kernel.
pub(super) fn expected(input: &[u8], out: &mut [u8]) -> Result<(), DemoError> {
    loopback::reference::compute(XOR, ADD, input, out)
        .map(drop)
        .map_err(DemoError::Reference)
}

/// One queue's host side: its ring, its slots of device memory (one per transfer in flight,
/// `depth` groups of `batch`), and the bytes each slot's transfer must come back as.
struct Driver<'a> {
    q: u16,
    context: u32,
    size: usize,
    batch: usize,
    depth: usize,
    pool: &'a Arc<Pool>,
    queue: loopback::Queue<Payload>,
    window: Range,
    scratch: Vec<u8>,
    /// Per slot: what its transfer must come back as (computed while the device works).
    want: Vec<Vec<u8>>,
}

impl Driver<'_> {
    fn ring_error(&self, source: ring::Error) -> DemoError {
        DemoError::Ring {
            queue: self.q,
            source,
        }
    }

    /// Writes batch number `b` (transfers `transfers`) into the ring, in slot group
    /// `b % depth` (free: the batch that used it last has completed), and rings the doorbell
    /// once. Returns its descriptor count.
    fn submit(&mut self, b: usize, transfers: &[u64]) -> Result<usize, DemoError> {
        let (size, context) = (self.size, self.context);
        let group = (b % self.depth) * self.batch;
        let mut holding = Vec::with_capacity(3 * transfers.len());
        for (i, &n) in transfers.iter().enumerate() {
            let slot = group + i;
            input(n, &mut self.scratch)?;
            let source = self.pool.alloc_owned(size)?;
            source.write(0, &self.scratch)?;
            expected(&self.scratch, &mut self.want[slot])?;
            let destination = self.pool.alloc_owned(size)?;
            let at = self
                .window
                .at((slot * size) as u64)
                .expect("inside the window");
            let len = size as u64;
            let to_device = Descriptor::to_device(source.iova(), at, len).context(context);
            let compute = Descriptor::compute(at, at, len, XOR, ADD).context(context);
            let to_host = Descriptor::to_host(at, destination.iova(), len).context(context);
            holding.push((to_device.build(), Payload::Source(source, n)));
            holding.push((compute.build(), Payload::Compute(n)));
            let done = Payload::Destination(destination, n, slot, Instant::now());
            holding.push((to_host.build(), done));
        }
        // The clock starts at the doorbell, once the batch is written.
        let rung = Instant::now();
        let descriptors = holding.len();
        for (descriptor, payload) in holding {
            let payload = match payload {
                Payload::Destination(buffer, n, slot, _) => {
                    Payload::Destination(buffer, n, slot, rung)
                }
                other => other,
            };
            self.queue
                .push_wait(descriptor, payload, TIMEOUT)
                .map_err(|rejected| self.ring_error(rejected.error))?;
        }
        self.queue.flush().map_err(|e| self.ring_error(e))?;
        Ok(descriptors)
    }

    /// Takes the next completion; for a transfer's last descriptor, checks every byte that
    /// came back and returns its latency.
    fn complete(&mut self, check: &mut [u8]) -> Result<Option<u64>, DemoError> {
        let done = self.queue.wait(TIMEOUT).map_err(|e| self.ring_error(e))?;
        if !done.entry.is_success() {
            return Err(DemoError::Failed {
                queue: self.q,
                transfer: done.payload.transfer(),
                code: done.entry.code(),
            });
        }
        let Payload::Destination(buffer, n, slot, rung) = done.payload else {
            return Ok(None);
        };
        let latency = u64::try_from(rung.elapsed().as_nanos()).unwrap_or(u64::MAX);
        buffer.read(0, check)?;
        let want = &self.want[slot];
        if check != &want[..] {
            let offset = check.iter().zip(want).position(|(a, b)| a != b);
            return Err(DemoError::Corrupted {
                queue: self.q,
                transfer: n,
                offset: offset.unwrap_or(0),
            });
        }
        Ok(Some(latency))
    }
}

/// Drives queue `q`: transfers `first, first + stride, ...` below `count`, `--depth` batches
/// in flight (the next written while the host checks what came back). Returns the latencies
/// of its transfers. Nothing it keeps grows with `--count`.
pub(super) fn drive(
    runtime: &Runtime,
    pool: &Arc<Pool>,
    args: &DemoArgs,
    q: u16,
) -> Result<Histogram<u64>, DemoError> {
    let context = u32::from(q) + 1;
    let (size, batch, depth) = (args.size, args.batch as usize, args.depth as usize);
    // Room for every descriptor in flight (three a transfer).
    let entries = u32::try_from(3 * batch * depth)
        .unwrap_or(u32::MAX)
        .next_power_of_two()
        .max(64);
    let config = ring::Config::new(entries).with_id(q).with_context(context);
    let window = runtime
        .device_memory()?
        .alloc((depth * batch * size) as u64, pool::MIN_ALIGN as u64)?;
    let mut driver = Driver {
        q,
        context,
        size,
        batch,
        depth,
        pool,
        queue: runtime.queue_with(config, Wait::Interrupt)?,
        window,
        scratch: vec![0u8; size],
        want: vec![vec![0u8; size]; depth * batch],
    };
    let mut check = vec![0u8; size];
    let mut latencies = histogram();
    // This queue's transfers: q, q + queues, ... below count; batch b holds the b-th run of
    // `batch` of them, made when it is submitted.
    let (first, stride) = (u64::from(q), u64::from(args.queues));
    let mine = args.count.saturating_sub(first).div_ceil(stride);
    let batches = mine.div_ceil(batch as u64);
    let mut ids = Vec::with_capacity(batch);
    let mut submit = |driver: &mut Driver<'_>, b: u64| {
        ids.clear();
        let from = b * batch as u64;
        ids.extend((from..mine.min(from + batch as u64)).map(|k| first + k * stride));
        // `b` counts batches of this queue, at most `count`: it fits a usize here (the
        // driver uses it modulo the depth).
        driver.submit(b as usize, &ids)
    };
    // Descriptors still to complete of each batch in flight, oldest first (a queue completes
    // in order).
    let mut open = std::collections::VecDeque::with_capacity(depth);
    let mut next = 0u64;
    while next < batches && open.len() < depth {
        open.push_back(submit(&mut driver, next)?);
        next += 1;
    }
    while let Some(left) = open.front_mut() {
        *left -= 1;
        let last_of_batch = *left == 0;
        if let Some(ns) = driver.complete(&mut check)? {
            let _ = latencies.record(ns.max(1));
        }
        if last_of_batch {
            open.pop_front();
            if next < batches {
                open.push_back(submit(&mut driver, next)?);
                next += 1;
            }
        }
    }
    Ok(latencies)
}
