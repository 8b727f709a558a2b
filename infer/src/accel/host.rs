//! Steps the device cannot run, run on the host ([`HostSteps`]): a queue adapter that keeps a
//! frame's order. A host step waits until every op before it on the queue has completed,
//! then reads the step's ranges out of the arena, computes them, and writes the output back;
//! the ops after it reach the device only then. Its completion is handed back in its place in
//! the queue's order, so the pipeline sees one in-order queue as from any device.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    Accelerator, Capabilities, Completion, Op, Queue, QueueSpec, Stopped, HOST_STEP_FAILED,
};
use crate::pipeline::{ModelError, Step};
use userdma::ring;

/// The command id a host step's [`Completion`] carries (no device command ran it).
pub const HOST_COMMAND: u16 = u16::MAX;

/// A queue whose device runs some steps, with the others run on the host (see the module
/// docs). Allocates nothing after it was opened.
pub struct HostSteps {
    inner: Box<dyn Queue>,
    device: Arc<dyn Accelerator>,
    caps: Capabilities,
    id: u16,
    /// Ops held back behind a host step, in order, with their tags.
    held: VecDeque<(Op, u64)>,
    /// The most ops held at once (the queue's depth).
    capacity: usize,
    /// Completions of host steps, to hand back before anything the device still has.
    ready: VecDeque<Completion>,
    /// Ops given to the device and not yet handed back.
    outstanding: usize,
    /// The host's copy of the arena a step runs over (only its ranges are read and written).
    scratch: Vec<u8>,
    /// Steps run on the host so far.
    steps_run: u64,
}

impl std::fmt::Debug for HostSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSteps")
            .field("id", &self.id)
            .field("held", &self.held.len())
            .field("ready", &self.ready.len())
            .field("outstanding", &self.outstanding)
            .field("steps_run", &self.steps_run)
            .finish()
    }
}

impl HostSteps {
    /// Opens queue `spec` of `device`, with the steps it cannot run run on the host.
    ///
    /// # Errors
    /// What opening the queue fails with; no host memory for the copy of the arena.
    pub fn open(device: Arc<dyn Accelerator>, spec: QueueSpec) -> Result<HostSteps, crate::Error> {
        let inner = device.open_queue(spec)?;
        let len = usize::try_from(spec.arena_bytes).unwrap_or(usize::MAX);
        let mut scratch = Vec::new();
        scratch.try_reserve_exact(len).map_err(|_| {
            crate::Error::from(ModelError::NoHostMemory {
                what: "the host's copy of the arena (for steps run on the host)",
                bytes: spec.arena_bytes,
            })
        })?;
        scratch.resize(len, 0);
        let capacity = spec.depth as usize;
        Ok(HostSteps {
            caps: device.capabilities(),
            inner,
            device,
            id: spec.id,
            held: VecDeque::with_capacity(capacity),
            capacity,
            ready: VecDeque::with_capacity(capacity),
            outstanding: 0,
            scratch,
            steps_run: 0,
        })
    }

    /// Steps run on the host so far.
    pub fn steps_run(&self) -> u64 {
        self.steps_run
    }

    fn on_host(&self, op: &Op) -> bool {
        matches!(op, Op::Step { step, .. } if !self.caps.runs(step))
    }

    /// Moves held ops on: device ops to the device, and a host step once everything before
    /// it has completed.
    fn advance(&mut self) -> Result<(), crate::Error> {
        let mut pushed = false;
        while let Some(&(op, tag)) = self.held.front() {
            if let Op::Step { arena, step } = op {
                if !self.caps.runs(&step) {
                    if self.outstanding > 0 {
                        break;
                    }
                    let status = match self.run(arena, &step) {
                        Ok(()) => 0,
                        Err(_) => HOST_STEP_FAILED,
                    };
                    self.steps_run += 1;
                    self.ready.push_back(Completion {
                        tag,
                        status,
                        result: 0,
                        queue: self.id,
                        command: HOST_COMMAND,
                    });
                    self.held.pop_front();
                    continue;
                }
            }
            self.inner.push(op, tag)?;
            self.outstanding += 1;
            pushed = true;
            self.held.pop_front();
        }
        if pushed {
            self.inner.flush()?;
        }
        Ok(())
    }

    /// Runs `step` over the arena at `arena`: its ranges read into the host copy, computed,
    /// its output written back.
    fn run(&mut self, arena: u64, step: &Step) -> Result<(), crate::Error> {
        let (reads, write) = step.ranges();
        let len = self.scratch.len() as u64;
        let outside = |at: u64, bytes: u64| at.checked_add(bytes).is_none_or(|end| end > len);
        for span in reads.iter().flatten().chain(std::iter::once(&write)) {
            if outside(span.offset, span.bytes) {
                return Err(ModelError::OutOfArena {
                    what: "a range of a step run on the host".to_owned(),
                    offset: span.offset,
                    bytes: span.bytes,
                    arena: len,
                }
                .into());
            }
            let range = span.offset as usize..(span.offset + span.bytes) as usize;
            self.device
                .read_arena(arena + span.offset, &mut self.scratch[range])?;
        }
        step.apply(&mut self.scratch)?;
        let range = write.offset as usize..(write.offset + write.bytes) as usize;
        self.device
            .write_arena(arena + write.offset, &self.scratch[range])
    }
}

impl Queue for HostSteps {
    fn id(&self) -> u16 {
        self.id
    }

    fn push(&mut self, op: Op, tag: u64) -> Result<(), crate::Error> {
        if self.held.is_empty() && !self.on_host(&op) {
            self.inner.push(op, tag)?;
            self.outstanding += 1;
            return Ok(());
        }
        if self.held.len() >= self.capacity {
            return Err(ring::Error::Full {
                queue: self.id,
                depth: self.capacity as u32,
            }
            .into());
        }
        self.held.push_back((op, tag));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), crate::Error> {
        self.inner.flush()?;
        self.advance()
    }

    fn poll(&mut self) -> Result<Option<Completion>, crate::Error> {
        if let Some(done) = self.ready.pop_front() {
            return Ok(Some(done));
        }
        if self.outstanding > 0 {
            let done = self.inner.poll()?;
            if done.is_some() {
                self.outstanding -= 1;
            }
            return Ok(done);
        }
        if self.held.is_empty() {
            return Ok(None);
        }
        self.advance()?;
        Ok(self.ready.pop_front())
    }

    fn wait(&mut self, timeout: Duration) -> Result<Completion, crate::Error> {
        let start = Instant::now();
        loop {
            if let Some(done) = self.poll()? {
                return Ok(done);
            }
            if self.outstanding > 0 {
                let left = timeout.saturating_sub(start.elapsed());
                let done = self.inner.wait(left)?;
                self.outstanding -= 1;
                return Ok(done);
            }
            if self.held.is_empty() {
                // Nothing in flight: nothing will come.
                return Err(self.overdue(start.elapsed()));
            }
        }
    }

    fn waitable(&mut self) -> Option<&mut dyn ring::Waitable> {
        if !self.ready.is_empty() || (self.outstanding == 0 && !self.held.is_empty()) {
            // Work for the host right now: poll, do not sleep.
            return None;
        }
        self.inner.waitable()
    }

    fn interrupt(&self) -> Option<&userdma::irq::EventFd> {
        self.inner.interrupt()
    }

    fn overdue(&self, waited: Duration) -> crate::Error {
        self.inner.overdue(waited)
    }

    fn shutdown(self: Box<Self>) -> Result<Stopped, crate::Error> {
        let HostSteps {
            inner, ready, held, ..
        } = *self;
        let stopped = inner.shutdown()?;
        let mut completed: Vec<Completion> = ready.into_iter().collect();
        completed.extend(stopped.completed);
        let mut aborted = stopped.aborted;
        aborted.extend(held.into_iter().map(|(_, tag)| tag));
        Ok(Stopped { completed, aborted })
    }
}
