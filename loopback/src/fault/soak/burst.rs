//! One burst of the soak (see the [`soak`](super) module docs): its transfers written and
//! announced by one doorbell, their completions taken, each fault they show detected, and the
//! queue recovered after a protocol fault or a timeout.

use std::time::Instant;

use super::{Error, Seen, Soak, Token, Transfer, CANARY, MAX_LEN, MAX_OFFSET, QUEUE, SLOT};
use crate::fault::Kind;
use crate::LoopbackStatus as _;
use crate::{Descriptor, Queue, StatusCode};
use userdma::dma::DeviceOffset;
use userdma::ring::{self, Status};

impl Soak {
    /// Runs one burst of `n` transfers on `queue`; returns the queue to go on with (a new one
    /// after a recovery).
    pub(super) fn burst(
        &mut self,
        mut queue: Queue<Token>,
        burst: u64,
        n: usize,
    ) -> Result<Queue<Token>, Error> {
        let mut transfers = [Transfer::default(); 32];
        // The command ids of the burst's descriptors, in the order they were pushed.
        let mut ids = [0u16; 64];
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
                match queue.push(desc, Token { transfer, to_host }) {
                    Ok(id) => ids[2 * i + usize::from(to_host)] = id,
                    Err(rejected) => {
                        return Err(Error::Ring {
                            burst,
                            source: rejected.error,
                        })
                    }
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
                    detect(&mut seen, error, &ids[..2 * n])
                        .map_err(|source| Error::Ring { burst, source })?;
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
                Err(error) => detect(&mut seen, error, &ids[..2 * n])
                    .map_err(|source| Error::Ring { burst, source })?,
            }
        }
        let taken = Instant::now();
        seen.late = taken.duration_since(flushed) >= self.plan.slow;
        let mut recovery = None;
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
            recovery = Some((began, Instant::now()));
            self.program_faults(burst + 1)?;
        }
        self.observed = Some(super::Observed {
            burst,
            transfers: n as u32,
            failed: transfers[..n]
                .iter()
                .filter(|t| t.failed || t.succeeded < 2)
                .count() as u32,
            announced: flushed,
            taken,
            detected: seen.detected,
            late: seen.late,
            recovery,
        });
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
}

/// Counts the fault `error` shows and marks the burst for recovery; an error no injected
/// fault explains is handed back. `ids` are the burst's command ids in the order they were
/// pushed (and announced, by one doorbell).
fn detect(seen: &mut Seen, error: ring::Error, ids: &[u16]) -> Result<(), ring::Error> {
    let kind = match error {
        ring::Error::LostCompletion { .. } => Kind::DropCompletion,
        ring::Error::Stalled { read: true, .. } => {
            seen.read_timeouts += 1;
            Kind::DropCompletion
        }
        ring::Error::DuplicateCompletion { .. } => Kind::CompleteTwice,
        ring::Error::WrongCommand { expected, got, .. } => match skipped(ids, expected, got) {
            // A completion of a command of the burst with `lost` (2 or more) before it in
            // flight: the device read those and wrote no completion for any of them — a run
            // of dropped completions, which the ring reports as a wrong command id (only the
            // next command's completion is a `LostCompletion` to it). The device's wrong id
            // names the burst's newest command or none in flight (`fault::Kind::WrongId`),
            // so only a completion naming the newest can be either.
            Some(lost) if ids.last() == Some(&got) => {
                seen.lost_or_wrong = lost;
                seen.recover = true;
                return Ok(());
            }
            Some(lost) => {
                *seen.detected.get_mut(Kind::DropCompletion) += lost;
                seen.recover = true;
                return Ok(());
            }
            None => Kind::WrongId,
        },
        ring::Error::Stalled { read: false, .. } => Kind::Stall,
        other => return Err(other),
    };
    *seen.detected.get_mut(kind) += 1;
    seen.recover = true;
    Ok(())
}

/// How many commands a completion naming `got` passed over when `expected` was the oldest in
/// flight, if both are commands of the burst (`ids`, in announced order) and it passed over
/// two or more (one is a [`ring::Error::LostCompletion`]).
fn skipped(ids: &[u16], expected: Option<u16>, got: u16) -> Option<u64> {
    let at = |id| ids.iter().position(|&x| x == id);
    let (expected, got) = (at(expected?)?, at(got)?);
    let lost = got.checked_sub(expected).filter(|&lost| lost >= 2)?;
    u64::try_from(lost).ok()
}
