//! Fault injection: making the loopback device misbehave on purpose, so the host's detection
//! and recovery paths can be tested (and soaked) on a machine with no accelerator.
//!
//! A queue is given an [`Injection`]: which [`Kind`]s of fault to inject and a [`Trigger`]
//! (the next N descriptors of the queue, or each descriptor with a probability, drawn from a
//! seeded generator so the same descriptors get the same faults). The host programs it
//! through the fault registers of BAR 0 ([`regs::FaultRegs`]), so injection works the same
//! whether the engine is a thread or a device process ([`Mode`](super::Mode));
//! [`Loopback::inject`] does the register writes. The device counts every fault it injects,
//! per queue and kind, in registers the host reads ([`Loopback::injected`]), so a test
//! reconciles what was injected with what the host detected.
//!
//! What each kind does to the descriptor it hits (the engine's side is in `engine.rs`):
//!
//! | kind | the device |
//! |---|---|
//! | [`Kind::Stall`] | stops serving the queue before reading the descriptor (its SQ head stays there), until the queue is stopped or the device reset |
//! | [`Kind::DropCompletion`] | executes it and writes no completion |
//! | [`Kind::CompleteTwice`] | executes it and writes its completion twice (only when the CQ has room for both; otherwise it injects nothing and the trigger is not used up) |
//! | [`Kind::WrongId`] | executes it and completes it with another command id: the newest announced command's when at least two are announced after it (an id in flight, not the next one), else the queue's depth (an id no command of the queue can have) |
//! | [`Kind::ErrorStatus`] | completes it with [`StatusCode::Injected`](super::StatusCode::Injected) without touching memory |
//! | [`Kind::CorruptDescriptor`] | reads a copy with bit 31 of the context flipped, which the context check rejects: a [`StatusCode::BadContext`](super::StatusCode::BadContext) completion, no memory touched |
//! | [`Kind::Slow`] | waits [`Injection::delay`] before executing it |
//!
//! A reset keeps the injections programmed and the counts (they are the device's record of
//! what it did), and ends a stall (the queue is torn down). With no injection programmed on a
//! queue the engine pays one predictable branch per burst for it: a bit of a mask read once
//! when the burst starts.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub mod soak;

use super::regs::{self, FaultControl};
use super::Loopback;
use userdma::device::Error as DeviceError;
use userdma::ring;

/// A kind of fault the device injects (the raw value is the kind's bit index in the
/// `fault_kinds` register and its slot in the `fault_injected` window).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum Kind {
    /// The queue stops being served (until the queue is stopped or the device reset).
    Stall = 1,
    /// The descriptor executes; no completion is written.
    DropCompletion = 2,
    /// The completion is written twice.
    CompleteTwice = 3,
    /// The completion names another command id.
    WrongId = 4,
    /// The completion carries [`StatusCode::Injected`](super::StatusCode::Injected); nothing is executed.
    ErrorStatus = 5,
    /// The device reads a corrupted copy of the descriptor, which its checks reject.
    CorruptDescriptor = 6,
    /// The descriptor executes late ([`Injection::delay`]).
    Slow = 7,
}

impl Kind {
    /// Every kind, in raw order.
    pub const ALL: [Kind; 7] = [
        Kind::Stall,
        Kind::DropCompletion,
        Kind::CompleteTwice,
        Kind::WrongId,
        Kind::ErrorStatus,
        Kind::CorruptDescriptor,
        Kind::Slow,
    ];

    /// The kind of a raw value.
    pub fn from_raw(raw: u32) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u32 == raw)
    }

    /// The kind's bit in the `fault_kinds` register.
    pub fn bit(self) -> u32 {
        1 << self as u32
    }

    /// The short name the command line uses (`stall`, `drop`, `twice`, `wrong-id`, `error`,
    /// `corrupt`, `slow`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Stall => "stall",
            Kind::DropCompletion => "drop",
            Kind::CompleteTwice => "twice",
            Kind::WrongId => "wrong-id",
            Kind::ErrorStatus => "error",
            Kind::CorruptDescriptor => "corrupt",
            Kind::Slow => "slow",
        }
    }

    /// The kind of a short name ([`Kind::name`]).
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A kind serialises as its short name ([`Kind::name`]).
#[cfg(feature = "serde")]
impl serde::Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// When an [`Injection`] hits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// The next `n` descriptors the queue serves.
    Next(u32),
    /// Each descriptor with probability `probability` (0 to 1, in steps of 2^-32), drawn
    /// from a generator seeded with `seed`: the same seed and the same descriptors give the
    /// same faults.
    Random {
        /// The probability per descriptor.
        probability: f64,
        /// The generator's seed.
        seed: u64,
    },
}

/// What to inject into a queue: the kinds (one is drawn per hit, from the same generator,
/// when there are several) and the trigger.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injection {
    kinds: u32,
    /// Descriptors to hit by count.
    count: u32,
    /// The probability per descriptor in 2^-32.
    rate: u32,
    seed: u64,
    delay: Duration,
    /// A probability outside 0 to 1 given (its bits), refused when programmed.
    bad_probability: Option<u64>,
}

impl Injection {
    /// `kind` for the next `n` descriptors of the queue.
    pub fn next(kind: Kind, n: u32) -> Injection {
        Injection {
            kinds: kind.bit(),
            count: n,
            rate: 0,
            seed: 0,
            delay: Duration::from_micros(100),
            bad_probability: None,
        }
    }

    /// One of `kinds` (drawn per hit) into each descriptor with probability `probability`
    /// (0 to 1, in steps of 2^-32), from a generator seeded with `seed`: the same seed and the
    /// same descriptors give the same faults.
    pub fn random(kinds: &[Kind], probability: f64, seed: u64) -> Injection {
        let valid = (0.0..=1.0).contains(&probability);
        Injection {
            kinds: kinds.iter().fold(0, |mask, k| mask | k.bit()),
            count: 0,
            rate: if valid { rate_of(probability) } else { 0 },
            seed,
            delay: Duration::from_micros(100),
            bad_probability: (!valid).then(|| probability.to_bits()),
        }
    }

    /// How long [`Kind::Slow`] delays a descriptor (default 100 µs; whole microseconds, at
    /// most `u32::MAX` of them).
    #[must_use]
    pub fn delay(mut self, delay: Duration) -> Injection {
        self.delay = delay;
        self
    }

    /// The kinds, as a set.
    pub fn kinds(&self) -> impl Iterator<Item = Kind> + '_ {
        Kind::ALL.into_iter().filter(|k| self.kinds & k.bit() != 0)
    }

    /// The trigger.
    pub fn trigger(&self) -> Trigger {
        if self.rate == 0 && self.bad_probability.is_none() {
            return Trigger::Next(self.count);
        }
        Trigger::Random {
            probability: self
                .bad_probability
                .map_or(f64::from(self.rate) / 4_294_967_296.0, f64::from_bits),
            seed: self.seed,
        }
    }

    /// The register values of the programme: (kinds mask, count, rate in 2^-32, seed, delay
    /// in µs), or what is wrong with it.
    pub(super) fn registers(&self) -> Result<(u32, u32, u32, u64, u32), DeviceError> {
        let bad = |field, value: u64, expected| {
            Err(super::Error::Config {
                field,
                value,
                expected,
            }
            .into())
        };
        if self.kinds == 0 {
            return bad("injection kinds", 0, "at least one fault kind");
        }
        if let Some(bits) = self.bad_probability {
            return bad(
                "injection probability (f64 bits)",
                bits,
                "a probability from 0 to 1",
            );
        }
        let Ok(delay) = u32::try_from(self.delay.as_micros()) else {
            return bad(
                "injection delay (µs)",
                u64::try_from(self.delay.as_micros()).unwrap_or(u64::MAX),
                "at most u32::MAX microseconds",
            );
        };
        Ok((self.kinds, self.count, self.rate, self.seed, delay))
    }

    /// The engine's programme of it (`None`: it hits nothing).
    pub(super) fn programme(&self) -> Result<Option<Programme>, DeviceError> {
        let (kinds, count, rate, seed, delay) = self.registers()?;
        Ok(Programme::new(kinds, count, rate, seed, delay, 0))
    }
}

/// A probability as the `fault_rate` register's fraction of 2^32 (1 saturates just below).
pub(super) fn rate_of(probability: f64) -> u32 {
    // A float-to-int `as` saturates: 1.0 gives u32::MAX. Truncation below that on purpose.
    (probability * 4_294_967_296.0) as u32
}

/// Faults the device injected into one queue, per kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Counts {
    /// [`Kind::Stall`].
    pub stall: u64,
    /// [`Kind::DropCompletion`].
    pub drop_completion: u64,
    /// [`Kind::CompleteTwice`].
    pub complete_twice: u64,
    /// [`Kind::WrongId`].
    pub wrong_id: u64,
    /// [`Kind::ErrorStatus`].
    pub error_status: u64,
    /// [`Kind::CorruptDescriptor`].
    pub corrupt_descriptor: u64,
    /// [`Kind::Slow`].
    pub slow: u64,
}

impl Counts {
    /// The count of `kind`.
    pub fn get(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Stall => self.stall,
            Kind::DropCompletion => self.drop_completion,
            Kind::CompleteTwice => self.complete_twice,
            Kind::WrongId => self.wrong_id,
            Kind::ErrorStatus => self.error_status,
            Kind::CorruptDescriptor => self.corrupt_descriptor,
            Kind::Slow => self.slow,
        }
    }

    /// The count of `kind`, to change.
    pub fn get_mut(&mut self, kind: Kind) -> &mut u64 {
        match kind {
            Kind::Stall => &mut self.stall,
            Kind::DropCompletion => &mut self.drop_completion,
            Kind::CompleteTwice => &mut self.complete_twice,
            Kind::WrongId => &mut self.wrong_id,
            Kind::ErrorStatus => &mut self.error_status,
            Kind::CorruptDescriptor => &mut self.corrupt_descriptor,
            Kind::Slow => &mut self.slow,
        }
    }

    /// Every kind's count added up.
    pub fn total(&self) -> u64 {
        Kind::ALL.iter().map(|&k| self.get(k)).sum()
    }

    /// `self + other`, kind by kind.
    #[must_use]
    pub fn plus(mut self, other: &Counts) -> Counts {
        for k in Kind::ALL {
            *self.get_mut(k) += other.get(k);
        }
        self
    }
}

/// What the device injected, per queue ([`Loopback::injected`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct InjectedCounts {
    /// Per queue, by queue index.
    pub queues: Vec<Counts>,
}

impl InjectedCounts {
    /// The sums over the queues.
    pub fn total(&self) -> Counts {
        self.queues
            .iter()
            .fold(Counts::default(), |sum, q| sum.plus(q))
    }
}

/// splitmix64: the engine's cheap deterministic generator (one add, three multiplies and
/// shifts per draw; every seed, 0 included, gives a full-period sequence).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Prng(u64);

impl Prng {
    pub(super) fn new(seed: u64) -> Prng {
        Prng(seed)
    }

    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One queue's injection as the engine runs it: the registers' programme and the state it
/// moves (the count left, the generator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Programme {
    /// Kinds to draw from (bit `k` for kind `k`).
    kinds: u32,
    /// Descriptors still to hit by count.
    count: u32,
    /// Probability per descriptor in 2^-32 (0: none).
    rate: u32,
    prng: Prng,
    /// The delay of [`Kind::Slow`].
    pub(super) delay: Duration,
    /// Which programming of the queue this is (state is written back only to the same one).
    pub(super) generation: u32,
}

impl Programme {
    /// The programme of the register values, or `None` if it injects nothing.
    pub(super) fn new(
        kinds: u32,
        count: u32,
        rate: u32,
        seed: u64,
        delay_us: u32,
        generation: u32,
    ) -> Option<Programme> {
        let kinds = kinds & Kind::ALL.iter().fold(0, |m, k| m | k.bit());
        if kinds == 0 || (count == 0 && rate == 0) {
            return None;
        }
        Some(Programme {
            kinds,
            count,
            rate,
            prng: Prng::new(seed),
            delay: Duration::from_micros(u64::from(delay_us)),
            generation,
        })
    }

    /// Whether the next descriptor is hit, and by what: by count first, then by the rate.
    /// A count hit draws the kind only; a rate hit draws the decision and then the kind.
    pub(super) fn decide(&mut self) -> Option<Kind> {
        if self.count > 0 {
            self.count -= 1;
            return Some(self.draw_kind());
        }
        if self.rate == 0 {
            return None;
        }
        // The top 32 bits against the rate: a hit with probability rate / 2^32.
        if ((self.prng.next() >> 32) as u32) < self.rate {
            return Some(self.draw_kind());
        }
        None
    }

    /// Gives back a count hit the engine could not inject (no CQ room for a second
    /// completion).
    pub(super) fn refund(&mut self) {
        if self.rate == 0 {
            self.count += 1;
        }
    }

    /// Whether the programme can still hit anything.
    pub(super) fn is_spent(&self) -> bool {
        self.count == 0 && self.rate == 0
    }

    fn draw_kind(&mut self) -> Kind {
        let n = self.kinds.count_ones();
        let pick = if n == 1 {
            0
        } else {
            (self.prng.next() % u64::from(n)) as u32
        };
        // The `pick`-th set bit of `kinds` (a nonzero mask of kind bits).
        let mut mask = self.kinds;
        for _ in 0..pick {
            mask &= mask - 1;
        }
        Kind::from_raw(mask.trailing_zeros()).unwrap_or(Kind::ErrorStatus)
    }
}

/// One host programs the fault registers at a time (they are a shared window: select the
/// queue, write the programme, apply).
static PROGRAMMING: Mutex<()> = Mutex::new(());

impl Loopback {
    /// Programs `injection` into queue `queue` (replacing what it had) and waits until the
    /// device has taken it: the descriptors the queue serves from then on are subject to it.
    ///
    /// # Errors
    /// [`DeviceError::NoSuchQueue`]; [`Error::Config`](super::Error::Config) for an injection
    /// with no kind, a probability outside 0 to 1 or a delay too long; register and timeout
    /// errors if the device does not answer.
    pub fn inject(&self, queue: u16, injection: &Injection) -> Result<(), DeviceError> {
        let (kinds, count, rate, seed, delay) = injection.registers()?;
        self.program(queue, FaultControl::APPLY, |d| {
            d.set(regs::FAULT_KINDS, kinds)?;
            d.set(regs::FAULT_COUNT, count)?;
            d.set(regs::FAULT_RATE, rate)?;
            d.set(regs::FAULT_SEED, seed)?;
            d.set(regs::FAULT_DELAY_US, delay)
        })
    }

    /// Removes queue `queue`'s injection (a stall already injected lasts until the queue is
    /// stopped or the device reset).
    ///
    /// # Errors
    /// As [`Loopback::inject`].
    pub fn clear_injection(&self, queue: u16) -> Result<(), DeviceError> {
        self.program(queue, FaultControl::CLEAR, |_| Ok(()))
    }

    /// Selects `queue`, writes the programme with `write`, writes `control` and waits for the
    /// device's acknowledgement (`fault_applied` moves).
    fn program(
        &self,
        queue: u16,
        control: FaultControl,
        write: impl FnOnce(&Loopback) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        self.check_queue(queue)?;
        let _one = PROGRAMMING.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.get(regs::FAULT_APPLIED)?;
        self.set(regs::FAULT_QUEUE, u32::from(queue))?;
        write(self)?;
        self.set(regs::FAULT_CONTROL, control)?;
        let start = Instant::now();
        let mut step = Duration::from_micros(1);
        loop {
            if self.get(regs::FAULT_APPLIED)? != before {
                return Ok(());
            }
            if !self.is_running() {
                return Err(super::Error::Stopped { exit: None }.into());
            }
            let waited = start.elapsed();
            if waited >= self.config.ack_timeout {
                return Err(DeviceError::Timeout {
                    operation: "program a fault injection",
                    waited,
                });
            }
            std::thread::sleep(step);
            step = (step * 2).min(Duration::from_millis(1));
        }
    }

    /// The faults the device injected so far, per queue and kind (kept across resets).
    ///
    /// # Errors
    /// Register access errors.
    pub fn injected(&self) -> Result<InjectedCounts, DeviceError> {
        let _one = PROGRAMMING.lock().unwrap_or_else(|p| p.into_inner());
        let queues = (0..self.config.queues)
            .map(|q| {
                // A register write costs the engine a look at its control registers: only
                // when the selection changes.
                if self.get(regs::FAULT_QUEUE)? != u32::from(q) {
                    self.set(regs::FAULT_QUEUE, u32::from(q))?;
                }
                let mut counts = Counts::default();
                for kind in Kind::ALL {
                    *counts.get_mut(kind) = self.get(regs::fault_injected(kind))?;
                }
                Ok(counts)
            })
            .collect::<Result<Vec<_>, DeviceError>>()?;
        Ok(InjectedCounts { queues })
    }

    /// Recovers from a fault on `queue` (a protocol error, a timeout): resets the device —
    /// every queue stops, and once the reset returns the device touches no host memory — then
    /// shuts the queue down at once, which hands back every payload: the completions taken
    /// before the fault, and the rest as aborted, now that the device can no longer write the
    /// buffers they name. Open a new queue to go on (the reset stopped every queue of the
    /// device: shut the others down the same way, with `shutdown(Duration::ZERO)`).
    ///
    /// # Errors
    /// The reset's errors (the queue is then dropped: its drop stops the device queue or
    /// leaks its buffers, never frees them under the device), and [`DeviceError::Ring`] if
    /// the shutdown fails.
    pub fn recover<T: Send>(
        &self,
        queue: super::Queue<T>,
    ) -> Result<ring::Shutdown<ring::Status, T>, DeviceError> {
        use userdma::device::Device;
        let id = queue.id();
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!(
            "loopback.recover",
            device = %self.identity,
            queue = id,
            in_flight = queue.in_flight()
        )
        .entered();
        self.reset()?;
        queue
            .shutdown(Duration::ZERO)
            .map_err(|source| DeviceError::Ring { queue: id, source })
    }

    /// [`DeviceError::NoSuchQueue`] unless the device has queue `queue`.
    fn check_queue(&self, queue: u16) -> Result<(), DeviceError> {
        if queue >= self.config.queues {
            return Err(DeviceError::NoSuchQueue {
                index: queue.into(),
                count: self.config.queues.into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
