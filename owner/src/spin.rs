//! An adaptive spin before sleeping, for the owner's loop and a client's wait, as the device
//! queues' own waits do: a frame that finishes within a few microseconds is taken without the
//! two wake-ups a sleep costs, and spinning that does not pay is cut back.

use std::time::{Duration, Instant};

/// How often (in spin iterations) the clock is read.
const CLOCK_EVERY: u32 = 4;

/// A spin budget between 0 and its maximum.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spin {
    budget: Duration,
    max: Duration,
}

impl Spin {
    /// Spins up to `max` at first.
    pub(crate) const fn new(max: Duration) -> Spin {
        Spin { budget: max, max }
    }

    /// Spins while `ready` says no, up to the budget. Returns whether it said yes; a yes after
    /// `w` makes the next budget at least `2 w`.
    pub(crate) fn spin(&mut self, mut ready: impl FnMut() -> bool) -> bool {
        if self.budget.is_zero() {
            return false;
        }
        let start = Instant::now();
        let mut n = 0u32;
        loop {
            if ready() {
                self.succeeded(start.elapsed());
                return true;
            }
            n = n.wrapping_add(1);
            if n % CLOCK_EVERY == 0 && start.elapsed() >= self.budget {
                return false;
            }
            // The other side (a client, the owner, the device's engine) may share this CPU:
            // give it the CPU rather than spin against it.
            std::thread::yield_now();
        }
    }

    /// What was awaited came `waited` after the spin gave up and the caller slept: had the
    /// spin lasted that long, it would have caught it (spin that long next time, within the
    /// maximum); if not, spinning did not pay (halve it).
    pub(crate) fn slept(&mut self, waited: Duration) {
        if waited < self.max {
            self.succeeded(waited);
        } else {
            self.budget /= 2;
            if self.budget < Duration::from_micros(1) {
                self.budget = Duration::ZERO;
            }
        }
    }

    fn succeeded(&mut self, waited: Duration) {
        self.budget = (waited * 2)
            .max(Duration::from_micros(1))
            .max(self.budget)
            .min(self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_adapts_within_its_bounds() {
        let mut s = Spin::new(Duration::from_micros(20));
        assert!(s.spin(|| true));
        let mut k = 0;
        assert!(s.spin(|| {
            k += 1;
            k > 3
        }));
        assert!(!s.spin(|| false));
        for _ in 0..10 {
            s.slept(Duration::from_millis(5));
        }
        assert_eq!(s.budget, Duration::ZERO, "halved down to nothing");
        assert!(!s.spin(|| true), "no spin at all on a zero budget");
        s.slept(Duration::from_micros(3));
        assert_eq!(s.budget, Duration::from_micros(6));
        s.slept(Duration::from_micros(15));
        assert_eq!(s.budget, Duration::from_micros(20), "at most the maximum");
    }
}
