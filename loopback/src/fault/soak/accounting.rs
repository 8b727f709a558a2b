//! The soak's accounting after each burst (see the [`soak`](super) module docs): the
//! destinations checked byte for byte and every canary, and the burst's injections, read from
//! the device's counters, reconciled with what the host detected.

use super::{Error, Seen, Soak, Transfer, CANARY, SLOT};
use crate::fault::{Counts, Kind};

impl Soak {
    /// Checks the burst's destinations: verified transfers byte for byte, every canary.
    pub(super) fn check(&mut self, transfers: &mut [Transfer]) -> Result<(), Error> {
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
    pub(super) fn reconcile(&mut self, burst: u64, seen: &Seen) -> Result<(), Error> {
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
        // A completion naming the burst's newest command past two or more in flight: the
        // device's wrong id if it injected one into the burst, else (nothing else names it)
        // the newest command's own, the completions before it lost.
        if seen.lost_or_wrong > 0 {
            if injected.wrong_id > detected.wrong_id {
                detected.wrong_id += 1;
            } else {
                detected.drop_completion += seen.lost_or_wrong;
            }
        }
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
        let mut counted = Counts::default();
        for k in Kind::ALL {
            *counted.get_mut(k) = detected.get(k).min(injected.get(k));
            let (i, d) = (injected.get(k), detected.get(k));
            if d > i || (d < i && !seen.recover) {
                differs.push(format!("{k}: {i} injected, {d} detected"));
            }
            if seen.recover {
                *self.report.masked.get_mut(k) += i.saturating_sub(d);
            }
            *self.report.detected.get_mut(k) += d.min(i);
        }
        if let Some(observed) = self.observed.as_mut() {
            observed.detected = counted;
            observed.late = seen.late;
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
