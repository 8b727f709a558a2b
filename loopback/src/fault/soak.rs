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
//! | a completion with [`StatusCode::Injected`](crate::StatusCode::Injected) | [`Kind::ErrorStatus`] | the transfer fails, the queue goes on |
//! | a completion with [`StatusCode::BadContext`](crate::StatusCode::BadContext) (the host sent the right context) | [`Kind::CorruptDescriptor`] | the same |
//! | [`ring::Error::LostCompletion`] | [`Kind::DropCompletion`] | recovery |
//! | [`ring::Error::DuplicateCompletion`] | [`Kind::CompleteTwice`] | recovery |
//! | [`ring::Error::WrongCommand`] naming a command of the burst `p` (2 or more) past the oldest in flight, not the newest | `p` × [`Kind::DropCompletion`] (the device read those `p` and completed none) | recovery |
//! | [`ring::Error::WrongCommand`] naming the burst's newest command `p` (2 or more) past the oldest | [`Kind::WrongId`] if one was injected into the burst, else `p` × [`Kind::DropCompletion`] (see below) | recovery |
//! | [`ring::Error::WrongCommand`] naming no command of the burst in flight | [`Kind::WrongId`] | recovery |
//! | a timeout, the device past the oldest command ([`ring::Error::Stalled`] `read`) | [`Kind::DropCompletion`] (of the burst's last) | recovery |
//! | a timeout, the device not past it | [`Kind::Stall`] | recovery |
//! | the burst's last completion [`Plan::slow`] or more after the doorbell | [`Kind::Slow`] (completed late) | — |
//!
//! A run of dropped completions followed by a completion looks to an in-order queue like a
//! wrong id when the run is two or more long (it reports only one lost completion, the next
//! command's arriving, as [`ring::Error::LostCompletion`]). The device's wrong id names the
//! burst's newest command or an id not in flight ([`Kind::WrongId`]), so a completion naming
//! another command of the burst is the end of such a run. One naming the newest command is
//! either: the burst's injected counters tell which (with no wrong id injected into the
//! burst, nothing else can have named it).
//!
//! After the burst's completions the host polls once more, for a duplicate of the last; one
//! the device writes only after that poll is met by the next burst (and reconciled there).
//!
//! Recovery is [`Loopback::recover`] (reset, then the queue's shutdown hands every payload
//! back) and a new queue; then the device's fault generator is programmed anew, seeded from
//! the plan's seed and the next burst's number (until the reset the device went on serving
//! the burst, and drawing faults for it, as far as the threads' timing let it: programmed
//! anew, the same seed hits the same descriptors in every run). A transfer counts as
//! verified when both its completions succeeded: its destination must then hold exactly its
//! source bytes. Every destination slot, verified or not, must still hold the canary outside
//! the transferred range. Both are counted in [`Report::corrupted_bytes`].
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
use crate::{Config, Cost, Loopback, Queue, Wait};
use userdma::device::{Device, Error as DeviceError};
use userdma::dma::Mapping;
use userdma::memory::PageSize;
use userdma::ring;

mod accounting;
mod burst;

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
    /// The seed of the transfers and of the device's fault generator (programmed anew from
    /// it after each recovery): the same seed gives the same transfers and the same faults on
    /// the same descriptors. The faults a recovery masks, bursts late with no slow fault and
    /// timeouts no fault explains depend on the threads' timing.
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

/// What the soak did, burst by burst, for a trace of the run ([`run_observed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The burst's number (from 0).
    pub burst: u64,
    /// Its round trips.
    pub transfers: u32,
    /// Of them, those that failed (a fault, or not completed before a recovery).
    pub failed: u32,
    /// Its descriptors were announced (one doorbell).
    pub announced: Instant,
    /// Its completions were taken, or a fault stopped the taking.
    pub taken: Instant,
    /// The injected faults the host detected in it, per kind, as the report counts them (a
    /// timeout no injection explains is not one).
    pub detected: Counts,
    /// Its last completion came [`Plan::slow`] or more after its doorbell.
    pub late: bool,
    /// The recovery it needed (reset, queue shut down, a new queue): from and to.
    pub recovery: Option<(Instant, Instant)>,
}

/// Runs `plan`, calling `progress` with the transfers done after every burst.
///
/// # Errors
/// [`Error::Plan`] for a plan out of range; device, memory and unexpected queue errors (a
/// detected fault is never an error: it is counted).
pub fn run(plan: &Plan, progress: impl FnMut(u64)) -> Result<Report, Error> {
    run_observed(plan, progress, |_| {})
}

/// [`run`], handing `observe` what each burst did as soon as it is done.
///
/// # Errors
/// As [`run`].
pub fn run_observed(
    plan: &Plan,
    mut progress: impl FnMut(u64),
    mut observe: impl FnMut(&Observed),
) -> Result<Report, Error> {
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
        observed: None,
    };
    soak.program_faults(0)?;
    let start = Instant::now();
    let mut queue = soak.open()?;
    let mut burst = 0u64;
    while soak.report.transfers < plan.transfers {
        let n = (plan.transfers - soak.report.transfers).min(plan.burst as u64) as usize;
        queue = soak.burst(queue, burst, n)?;
        if let Some(seen) = soak.observed.take() {
            observe(&seen);
        }
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
    /// What the last burst did, for [`run_observed`]'s observer.
    observed: Option<Observed>,
}

/// What the host saw of a burst.
#[derive(Debug, Default)]
struct Seen {
    detected: Counts,
    /// Of `detected.drop_completion`, the timeouts with the device past the oldest command
    /// (not a completion seen missing): a drop, or an engine thread descheduled between
    /// reading a descriptor and completing it.
    read_timeouts: u64,
    /// A completion naming the burst's newest command with this many (2 or more) before it
    /// in flight: the device's wrong id for the oldest (or for a later one, the completions
    /// before it lost), or every completion before it lost. The burst's injected counters
    /// tell which: with no wrong id injected into the burst it is the newest command's own
    /// completion. 0: none.
    lost_or_wrong: u64,
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

    /// Programs the device's fault generator for the bursts from `burst` on: seeded with the
    /// plan's seed for the first, and after each recovery anew with a seed drawn from the
    /// plan's and the burst's number. Between a protocol fault and the reset the device serves
    /// (and draws faults for) as many of the burst's remaining descriptors as the threads'
    /// timing lets it; programmed anew, the generator hits the same descriptors in every run
    /// of a seed.
    fn program_faults(&self, burst: u64) -> Result<(), Error> {
        if self.plan.rate > 0.0 {
            let seed = match burst {
                0 => self.plan.seed,
                // splitmix64's output, a bijection of its state: a seed per burst.
                _ => super::Prng::new(self.plan.seed ^ burst.rotate_left(32)).next(),
            };
            let injection =
                Injection::random(&self.plan.kinds, self.plan.rate, seed).delay(self.plan.slow);
            self.device.inject(QUEUE, &injection)?;
        }
        Ok(())
    }

    fn src(&self, i: usize) -> usize {
        i * SLOT
    }

    fn dst(&self, i: usize) -> usize {
        (32 + i) * SLOT
    }
}

/// `time` in whole nanoseconds, saturating.
fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
