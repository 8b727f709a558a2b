//! The fault soak: random host → device → host round trips through a loopback device that
//! injects faults of chosen kinds at random, with every fault detected on the host, every
//! buffer handed back, every byte checked, and the device recovered and used again after each
//! protocol fault. `tests/fault_soak.rs` runs it in CI and `userdma faults` from the command
//! line.
//!
//! # One burst
//!
//! Up to [`Plan::burst`] transfers, each a random length (1 to [`MAX_LEN`] bytes) at a random
//! offset of its own slot: random bytes written into its source slot in host memory, its
//! destination slot filled with a canary byte, then a `ToDevice` and a `ToHost` descriptor,
//! all announced by one doorbell. The host then takes the burst's completions one by one
//! (each wait at most [`Plan::timeout`]):
//!
//! | the host sees | detected as | then |
//! |---|---|---|
//! | a completion with [`StatusCode::Injected`] | [`Kind::ErrorStatus`] | the transfer fails, the queue goes on |
//! | a completion with [`StatusCode::BadContext`] (the host sent the right context) | [`Kind::CorruptDescriptor`] | the same |
//! | [`ring::Error::LostCompletion`] | [`Kind::DropCompletion`] | recovery |
//! | [`ring::Error::DuplicateCompletion`] | [`Kind::CompleteTwice`] | recovery |
//! | [`ring::Error::WrongCommand`] | [`Kind::WrongId`] | recovery |
//! | a timeout, the device past the oldest command ([`ring::Error::Stalled`] `read`) | [`Kind::DropCompletion`] (of the burst's last) | recovery |
//! | a timeout, the device not past it | [`Kind::Stall`] | recovery |
//! | the burst's last completion [`Plan::slow`] or more after the doorbell | [`Kind::Slow`] (completed late) | — |
//!
//! After the burst's completions the host polls once more, for a duplicate of the last; one
//! the device writes only after that poll is met by the next burst (and reconciled there).
//!
//! Recovery is [`Loopback::recover`] (reset, then the queue's shutdown hands every payload
//! back) and a new queue. A transfer counts as verified when both its completions succeeded:
//! its destination must then hold exactly its source bytes. Every destination slot, verified
//! or not, must still hold the canary outside the transferred range. Both are counted in
//! [`Report::corrupted_bytes`].
//!
//! # Accounting
//!
//! After every burst the device's injected counters ([`Loopback::injected`]) are read and the
//! burst's injections compared with its detections, kind by kind: in a burst that needed no
//! recovery they must be equal; in a recovered burst a fault injected into a descriptor after
//! the one that broke the protocol is never seen (the host does not read a CQ it cannot
//! trust) and is counted as [`Report::masked`]. A [`Kind::Slow`] injection is detected when
//! its burst was late; a late burst with no slow injection (the host or engine thread was
//! descheduled) is counted in [`Report::late_without_injection`], not as a detection. A wait
//! that timed out with the device not past the oldest command and no stall injected, or past
//! it and no drop injected (the engine thread was descheduled for longer than the timeout,
//! before reading the descriptor or between reading and completing it: a loaded machine), is
//! recovered from like a stall and counted in [`Report::timeouts_without_injection`].

use std::time::{Duration, Instant};

use super::{Counts, Injection, Kind};
use crate::LoopbackStatus as _;
use crate::{Config, Cost, Descriptor, Loopback, Queue, StatusCode, Wait};
use userdma::device::{Device, Error as DeviceError};
use userdma::dma::{DeviceOffset, Mapping};
use userdma::memory::PageSize;
use userdma::ring::{self, Status};

/// The longest transfer.
pub const MAX_LEN: usize = 512;
/// Bytes of one slot: the longest transfer at the largest offset.
const SLOT: usize = 640;
/// The largest offset of a transfer in its slot.
const MAX_OFFSET: usize = SLOT - MAX_LEN;
/// The canary byte destination slots are filled with.
const CANARY: u8 = 0xa5;
/// The queue the soak uses.
const QUEUE: u16 = 0;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Round trips.
    pub transfers: u64,
    /// The probability per descriptor of a fault.
    pub rate: f64,
    /// The kinds injected (one drawn per fault).
    pub kinds: Vec<Kind>,
    /// The seed of the transfers and of the device's fault generator.
    pub seed: u64,
    /// Transfers per burst (1 to 32).
    pub burst: usize,
    /// How long [`Kind::Slow`] delays a descriptor, and how late a burst must be to count as
    /// completed late.
    pub slow: Duration,
    /// The longest wait for one completion before the queue counts as stalled.
    pub timeout: Duration,
}

impl Default for Plan {
    /// 10^6 transfers, every kind at 10^-4, seed 1, bursts of 32, slow by 100 µs, 5 ms
    /// timeouts.
    fn default() -> Plan {
        Plan {
            transfers: 1_000_000,
            rate: 1e-4,
            kinds: Kind::ALL.to_vec(),
            seed: 1,
            burst: 32,
            slow: Duration::from_micros(100),
            timeout: Duration::from_millis(5),
        }
    }
}

/// What a soak found.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Report {
    /// Round trips run.
    pub transfers: u64,
    /// Round trips both of whose descriptors succeeded, their bytes checked.
    pub verified: u64,
    /// Round trips that failed (a fault hit them or their burst was recovered).
    pub failed: u64,
    /// Faults the device injected, per kind (its counters).
    pub injected: Counts,
    /// Faults the host detected, per kind.
    pub detected: Counts,
    /// Faults injected after the fault that made their burst recover, never seen by the host.
    pub masked: Counts,
    /// Detected faults after which a later transfer was verified (the device usable again).
    pub recovered: Counts,
    /// Bursts late with no slow injection (host or engine descheduled).
    pub late_without_injection: u64,
    /// Waits that timed out with no stall injected (host or engine descheduled for longer
    /// than [`Plan::timeout`]): recovered from like a stall, not counted as a detection.
    pub timeouts_without_injection: u64,
    /// Bytes wrong: in a verified destination, or a canary outside any transferred range.
    pub corrupted_bytes: u64,
    /// Payloads (buffers) not handed back, and queues the ring leaked.
    pub leaked_buffers: u64,
    /// Recoveries (reset, shutdown, new queue).
    pub recoveries: u64,
    /// Their mean duration in nanoseconds.
    pub recovery_mean_ns: u64,
    /// Bursts whose injections and detections did not reconcile, with what differed (empty
    /// in a good run).
    pub unreconciled: Vec<String>,
    /// How long the soak took, in nanoseconds.
    pub elapsed_ns: u64,
}

impl Report {
    /// Whether the run was clean: no corruption, no leak, every injection detected or (in a
    /// recovered burst) masked, every burst reconciled.
    pub fn is_clean(&self) -> bool {
        self.corrupted_bytes == 0
            && self.leaked_buffers == 0
            && self.unreconciled.is_empty()
            && Kind::ALL
                .iter()
                .all(|&k| self.injected.get(k) == self.detected.get(k) + self.masked.get(k))
    }

    /// One line: the counts that matter.
    pub fn summary(&self) -> String {
        format!(
            "{} transfers ({} verified, {} failed) in {:.1} s: {} faults injected, {} detected, {} masked by a recovery; {} recoveries (mean {:.0} µs, {} after timeouts with no stall injected); {} corrupted bytes, {} leaked buffers{}",
            self.transfers,
            self.verified,
            self.failed,
            self.elapsed_ns as f64 / 1e9,
            self.injected.total(),
            self.detected.total(),
            self.masked.total(),
            self.recoveries,
            self.recovery_mean_ns as f64 / 1e3,
            self.timeouts_without_injection,
            self.corrupted_bytes,
            self.leaked_buffers,
            if self.unreconciled.is_empty() {
                String::new()
            } else {
                format!(", {} bursts unreconciled", self.unreconciled.len())
            }
        )
    }
}

/// Why a soak could not run (a fault it detects is never one of these).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A plan the soak cannot run.
    #[error("fault soak: {what}")]
    Plan {
        /// What is wrong.
        what: String,
    },
    /// The device failed outside any injected fault.
    #[error("fault soak: the loopback device failed")]
    Device(#[from] DeviceError),
    /// Host memory could not be had.
    #[error("fault soak: host memory could not be mapped")]
    Memory(#[source] Box<userdma::Error>),
    /// Host memory could not be accessed.
    #[error("fault soak: host memory access failed")]
    Host(#[from] userdma::dma::Error),
    /// The queue failed in a way no injected fault explains.
    #[error("fault soak: burst {burst}: unexpected queue error")]
    Ring {
        /// The burst.
        burst: u64,
        /// The error.
        #[source]
        source: ring::Error,
    },
}

/// The payload of each descriptor: its transfer's index in the burst and which half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Token {
    transfer: u8,
    to_host: bool,
}

/// One transfer of a burst.
#[derive(Debug, Clone, Copy, Default)]
struct Transfer {
    offset: usize,
    len: usize,
    /// Completions that succeeded (0 to 2).
    succeeded: u8,
    failed: bool,
}

/// xorshift64*: the transfers' generator.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Runs `plan`, calling `progress` with the transfers done after every burst.
///
/// # Errors
/// [`Error::Plan`] for a plan out of range; device, memory and unexpected queue errors (a
/// detected fault is never an error: it is counted).
pub fn run(plan: &Plan, mut progress: impl FnMut(u64)) -> Result<Report, Error> {
    if !(1..=32).contains(&plan.burst) {
        return Err(Error::Plan {
            what: format!("a burst of {} transfers: use 1 to 32", plan.burst),
        });
    }
    if plan.kinds.is_empty() && plan.rate > 0.0 {
        return Err(Error::Plan {
            what: "no fault kinds to inject: name at least one".into(),
        });
    }
    let device = std::sync::Arc::new(Loopback::new(
        Config::default()
            .name("loopback-faults")
            .queues(1)
            .cost(Cost::zero())
            .memory_size(64 << 10),
    )?);
    if plan.rate > 0.0 {
        let injection = Injection::random(&plan.kinds, plan.rate, plan.seed).delay(plan.slow);
        device.inject(QUEUE, &injection)?;
    }
    let leaks_before = ring::leaks();
    let host =
        userdma::runtime::map_memory(device.dma_space().as_ref(), 2 * 32 * SLOT, PageSize::Base)
            .map_err(|e| Error::Memory(Box::new(e)))?;
    let mut soak = Soak {
        device,
        host,
        plan: plan.clone(),
        rng: Rng(plan.seed | 1),
        report: Report::default(),
        recovery_total: Duration::ZERO,
        unconfirmed: Counts::default(),
        injected: Counts::default(),
        carried: Counts::default(),
    };
    let start = Instant::now();
    let mut queue = soak.open()?;
    let mut burst = 0u64;
    while soak.report.transfers < plan.transfers {
        let n = (plan.transfers - soak.report.transfers).min(plan.burst as u64) as usize;
        queue = soak.burst(queue, burst, n)?;
        burst += 1;
        progress(soak.report.transfers);
    }
    if soak.carried.total() > 0 {
        soak.report
            .unreconciled
            .push("the last burst: a duplicate completion never seen".into());
    }
    let shutdown = queue
        .shutdown(plan.timeout)
        .map_err(|source| Error::Ring { burst, source })?;
    let left = shutdown.completed.len() + shutdown.aborted.len();
    soak.report.leaked_buffers += left as u64;
    let leaks = ring::leaks();
    soak.report.leaked_buffers +=
        (leaks.payloads - leaks_before.payloads) + (leaks.queues - leaks_before.queues);
    let mut report = soak.report;
    report.elapsed_ns = nanos(start.elapsed());
    report.recovery_mean_ns = nanos(soak.recovery_total)
        .checked_div(report.recoveries)
        .unwrap_or(0);
    Ok(report)
}

/// The soak's state.
#[derive(Debug)]
struct Soak {
    device: std::sync::Arc<Loopback>,
    /// Host memory: 32 source slots, then 32 destination slots.
    host: Mapping,
    plan: Plan,
    rng: Rng,
    report: Report,
    recovery_total: Duration,
    /// Detections not yet followed by a verified transfer.
    unconfirmed: Counts,
    /// The device's injected counters as last read.
    injected: Counts,
    /// Injections of the last burst still to be seen in the next (a duplicate completion
    /// written after the host had taken the burst's last one).
    carried: Counts,
}

/// What the host saw of a burst.
#[derive(Debug, Default)]
struct Seen {
    detected: Counts,
    /// Of `detected.drop_completion`, the timeouts with the device past the oldest command
    /// (not a completion seen missing): a drop, or an engine thread descheduled between
    /// reading a descriptor and completing it.
    read_timeouts: u64,
    /// A protocol fault or a timeout: the queue must be recovered.
    recover: bool,
    late: bool,
}

impl Soak {
    fn open(&self) -> Result<Queue<Token>, Error> {
        Ok(self
            .device
            .open_queue(ring::Config::new(128).with_id(QUEUE), Wait::Interrupt)?)
    }

    fn src(&self, i: usize) -> usize {
        i * SLOT
    }

    fn dst(&self, i: usize) -> usize {
        (32 + i) * SLOT
    }

    /// Runs one burst of `n` transfers on `queue`; returns the queue to go on with (a new one
    /// after a recovery).
    fn burst(
        &mut self,
        mut queue: Queue<Token>,
        burst: u64,
        n: usize,
    ) -> Result<Queue<Token>, Error> {
        let mut transfers = [Transfer::default(); 32];
        let mut bytes = [0u8; SLOT];
        let slice = self.host.slice();
        let iova = |offset: usize| self.host.iova(offset).expect("inside the mapping");
        for (i, t) in transfers.iter_mut().enumerate().take(n) {
            t.len = 1 + self.rng.below(MAX_LEN);
            t.offset = self.rng.below(MAX_OFFSET + 1);
            for chunk in bytes[..t.len].chunks_mut(8) {
                let word = self.rng.next().to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
            let (src, dst) = (self.src(i) + t.offset, self.dst(i) + t.offset);
            slice.write_from(src, &bytes[..t.len])?;
            slice.write_from(self.dst(i), &[CANARY; SLOT])?;
            let device_at = DeviceOffset((i * SLOT) as u64);
            let len = t.len as u64;
            let transfer = i as u8;
            let halves = [
                (
                    Descriptor::to_device(iova(src), device_at, len).build(),
                    false,
                ),
                (Descriptor::to_host(device_at, iova(dst), len).build(), true),
            ];
            for (desc, to_host) in halves {
                if let Err(rejected) = queue.push(desc, Token { transfer, to_host }) {
                    return Err(Error::Ring {
                        burst,
                        source: rejected.error,
                    });
                }
            }
        }
        let flushed = Instant::now();
        queue
            .flush()
            .map_err(|source| Error::Ring { burst, source })?;
        let mut seen = Seen::default();
        let mut left = 2 * n;
        while left > 0 {
            match queue.wait(Some(self.plan.timeout)) {
                Ok(done) => {
                    left -= 1;
                    self.completed(&mut transfers, &mut seen, &done);
                }
                Err(error) => {
                    let error = queue.explain(error);
                    detect(&mut seen, error).map_err(|source| Error::Ring { burst, source })?;
                    break;
                }
            }
        }
        if !seen.recover {
            // A duplicate of the burst's last completion follows it: look once more (if the
            // device has not written it yet, the next burst meets it).
            match queue.poll_one() {
                Ok(None) => {}
                Ok(Some(_)) => {
                    return Err(Error::Ring {
                        burst,
                        source: ring::Error::UnknownCommand {
                            queue: QUEUE,
                            id: u16::MAX,
                        },
                    })
                }
                Err(error) => {
                    detect(&mut seen, error).map_err(|source| Error::Ring { burst, source })?
                }
            }
        }
        seen.late = flushed.elapsed() >= self.plan.slow;
        if seen.recover {
            let began = Instant::now();
            let shutdown = self.device.recover(queue)?;
            for done in &shutdown.completed {
                self.completed(&mut transfers, &mut Seen::default(), done);
            }
            self.recovery_total += began.elapsed();
            self.report.recoveries += 1;
            // Every transfer of the burst not verified already failed: its completions
            // were not all taken.
            queue = self.open()?;
        }
        self.check(&mut transfers[..n])?;
        self.reconcile(burst, &seen)?;
        self.report.transfers += n as u64;
        Ok(queue)
    }

    /// Counts a completion handed out.
    fn completed(
        &self,
        transfers: &mut [Transfer],
        seen: &mut Seen,
        done: &ring::Done<Status, Token>,
    ) {
        let t = &mut transfers[usize::from(done.payload.transfer)];
        match done.entry.loopback_code() {
            Ok(StatusCode::Success) => t.succeeded += 1,
            Ok(StatusCode::Injected) => {
                *seen.detected.get_mut(Kind::ErrorStatus) += 1;
                t.failed = true;
            }
            Ok(StatusCode::BadContext) => {
                // The host sent the queue's context: the device read something else.
                *seen.detected.get_mut(Kind::CorruptDescriptor) += 1;
                t.failed = true;
            }
            _ => t.failed = true,
        }
    }

    /// Checks the burst's destinations: verified transfers byte for byte, every canary.
    fn check(&mut self, transfers: &mut [Transfer]) -> Result<(), Error> {
        let slice = self.host.slice();
        let mut src = [0u8; SLOT];
        let mut dst = [0u8; SLOT];
        let mut any_verified = false;
        for (i, t) in transfers.iter_mut().enumerate() {
            slice.read_into(self.dst(i), &mut dst)?;
            let range = t.offset..t.offset + t.len;
            let verified = t.succeeded == 2 && !t.failed;
            if verified {
                slice.read_into(self.src(i) + t.offset, &mut src[..t.len])?;
                if dst[range.clone()] != src[..t.len] {
                    let wrong = dst[range.clone()]
                        .iter()
                        .zip(&src[..t.len])
                        .filter(|(a, b)| a != b)
                        .count();
                    self.report.corrupted_bytes += wrong as u64;
                }
                self.report.verified += 1;
                any_verified = true;
            } else {
                self.report.failed += 1;
            }
            // Outside the range the device must not have written, whatever happened.
            let outside = [&dst[..range.start], &dst[range.end..]];
            for part in outside {
                if part.iter().any(|&b| b != CANARY) {
                    let bad = part.iter().filter(|&&b| b != CANARY).count();
                    self.report.corrupted_bytes += bad as u64;
                }
            }
        }
        if any_verified {
            self.report.recovered = self.report.recovered.plus(&self.unconfirmed);
            self.unconfirmed = Counts::default();
        }
        Ok(())
    }

    /// Compares the burst's injections (the device's counters) with its detections.
    fn reconcile(&mut self, burst: u64, seen: &Seen) -> Result<(), Error> {
        let now = self.device.injected()?.total();
        let mut injected = Counts::default();
        for k in Kind::ALL {
            *injected.get_mut(k) = now.get(k) - self.injected.get(k);
        }
        self.injected = now;
        self.report.injected = now;
        // A duplicate of the previous burst's last completion it did not see yet.
        injected = injected.plus(&self.carried);
        self.carried = Counts::default();
        let mut detected = seen.detected;
        // A slow injection is seen as a late burst.
        if injected.slow > 0 && seen.late {
            detected.slow = injected.slow;
        } else if injected.slow == 0 && seen.late {
            self.report.late_without_injection += 1;
        }
        // A timeout with no stall injected is the scheduler's, not the device's; so is one
        // with the device past the oldest command and no drop injected (its engine thread
        // descheduled between reading a descriptor and completing it).
        if detected.stall > injected.stall {
            self.report.timeouts_without_injection += detected.stall - injected.stall;
            detected.stall = injected.stall;
        }
        let drops = Kind::DropCompletion;
        let spurious = detected
            .get(drops)
            .saturating_sub(injected.get(drops))
            .min(seen.read_timeouts);
        if spurious > 0 {
            self.report.timeouts_without_injection += spurious;
            *detected.get_mut(drops) -= spurious;
        }
        let twice = Kind::CompleteTwice;
        if !seen.recover && injected.get(twice) > detected.get(twice) {
            self.carried.complete_twice = injected.get(twice) - detected.get(twice);
            *injected.get_mut(twice) = detected.get(twice);
        }
        let mut differs = Vec::new();
        for k in Kind::ALL {
            let (i, d) = (injected.get(k), detected.get(k));
            if d > i || (d < i && !seen.recover) {
                differs.push(format!("{k}: {i} injected, {d} detected"));
            }
            if seen.recover {
                *self.report.masked.get_mut(k) += i.saturating_sub(d);
            }
            *self.report.detected.get_mut(k) += d.min(i);
        }
        self.unconfirmed = self.unconfirmed.plus(&detected);
        if !differs.is_empty() {
            self.report.unreconciled.push(format!(
                "burst {burst}{}: {}",
                if seen.recover { " (recovered)" } else { "" },
                differs.join(", ")
            ));
        }
        Ok(())
    }
}

/// Counts the fault `error` shows and marks the burst for recovery; an error no injected
/// fault explains is handed back.
fn detect(seen: &mut Seen, error: ring::Error) -> Result<(), ring::Error> {
    let kind = match error {
        ring::Error::LostCompletion { .. } => Kind::DropCompletion,
        ring::Error::Stalled { read: true, .. } => {
            seen.read_timeouts += 1;
            Kind::DropCompletion
        }
        ring::Error::DuplicateCompletion { .. } => Kind::CompleteTwice,
        ring::Error::WrongCommand { .. } => Kind::WrongId,
        ring::Error::Stalled { read: false, .. } => Kind::Stall,
        other => return Err(other),
    };
    *seen.detected.get_mut(kind) += 1;
    seen.recover = true;
    Ok(())
}

/// `time` in whole nanoseconds, saturating.
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}
