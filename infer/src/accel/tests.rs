//! [`HostSteps`] over a scripted engine whose ops complete some polls after they were flushed:
//! a host step runs only once every op before it on the queue completed (so it computes over
//! what the device wrote), the ops after it reach the device only then, completions come back
//! in push order with their tags, and a shutdown hands back what completed and aborts the rest.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;
use crate::pipeline::Step;

/// How many polls an op takes after its flush.
const LATENCY: u32 = 3;

#[derive(Debug, Default)]
struct Shared {
    arena: Vec<u8>,
    /// What happened, in order: `dev <tag>` when a device op completed, `host` for each read
    /// of the arena for a step.
    log: Vec<String>,
    /// The bytes the last `ToHost` brought back.
    out: Vec<u8>,
}

#[derive(Debug)]
struct Scripted {
    shared: Arc<Mutex<Shared>>,
}

struct ScriptedQueue {
    shared: Arc<Mutex<Shared>>,
    queued: VecDeque<(Op, u64)>,
    flushed: VecDeque<(Op, u64, u32)>,
}

impl Accelerator for Scripted {
    fn identity(&self) -> String {
        "scripted".to_owned()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "scripted",
            compute: false,
            filter: false,
            separate_units: false,
            cross_queue_order: false,
            device_memory: true,
            read_in_place: true,
            contexts: false,
            interrupts: false,
            queues: 1,
        }
    }
    fn host_pool(&self, _: usize) -> Result<Arc<Pool>, crate::Error> {
        unreachable!("the tests make no pipeline")
    }
    fn alloc_arena(&self, _: u64, _: u64) -> Result<Arena, crate::Error> {
        unreachable!("the tests make no pipeline")
    }
    fn read_arena(&self, at: u64, dst: &mut [u8]) -> Result<(), crate::Error> {
        let mut s = self.shared.lock().unwrap();
        s.log.push("host".to_owned());
        let at = at as usize;
        dst.copy_from_slice(&s.arena[at..at + dst.len()]);
        Ok(())
    }
    fn write_arena(&self, at: u64, src: &[u8]) -> Result<(), crate::Error> {
        let mut s = self.shared.lock().unwrap();
        let at = at as usize;
        s.arena[at..at + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn open_queue(&self, _: QueueSpec) -> Result<Box<dyn Queue>, crate::Error> {
        Ok(Box::new(ScriptedQueue {
            shared: Arc::clone(&self.shared),
            queued: VecDeque::new(),
            flushed: VecDeque::new(),
        }))
    }
    fn reset(&self) -> Result<(), crate::Error> {
        Ok(())
    }
}

impl Queue for ScriptedQueue {
    fn id(&self) -> u16 {
        0
    }
    fn push(&mut self, op: Op, tag: u64) -> Result<(), crate::Error> {
        assert!(
            !matches!(op, Op::Step { .. }),
            "a step reached a device without compute"
        );
        self.queued.push_back((op, tag));
        Ok(())
    }
    fn flush(&mut self) -> Result<(), crate::Error> {
        self.flushed
            .extend(self.queued.drain(..).map(|(op, tag)| (op, tag, LATENCY)));
        Ok(())
    }
    fn poll(&mut self) -> Result<Option<Completion>, crate::Error> {
        let Some(front) = self.flushed.front_mut() else {
            return Ok(None);
        };
        if front.2 > 0 {
            front.2 -= 1;
            return Ok(None);
        }
        let (op, tag, _) = self.flushed.pop_front().expect("the front");
        let mut s = self.shared.lock().unwrap();
        match op {
            // The "device" writes words 1, 2, 3, ... where the input goes.
            Op::ToDevice { to, from } => {
                for w in 0..(from.len / 4) as usize {
                    let at = to as usize + 4 * w;
                    s.arena[at..at + 4].copy_from_slice(&(w as u32 + 1).to_le_bytes());
                }
            }
            Op::ToHost { from, to } => {
                let at = from as usize;
                s.out = s.arena[at..at + to.len as usize].to_vec();
            }
            _ => {}
        }
        s.log.push(format!("dev {tag}"));
        Ok(Some(Completion {
            tag,
            status: 0,
            result: 0,
            queue: 0,
            command: tag as u16,
        }))
    }
    fn overdue(&self, waited: Duration) -> crate::Error {
        userdma::ring::Error::Timeout {
            queue: 0,
            waited,
            in_flight: self.flushed.len(),
            oldest: None,
        }
        .into()
    }
    fn shutdown(self: Box<Self>) -> Result<Stopped, crate::Error> {
        Ok(Stopped {
            completed: Vec::new(),
            aborted: self
                .flushed
                .iter()
                .map(|&(_, tag, _)| tag)
                .chain(self.queued.iter().map(|&(_, tag)| tag))
                .collect(),
        })
    }
}

fn span(len: u64) -> HostSpan {
    HostSpan {
        iova: userdma::dma::Iova(0x1000),
        ptr: std::ptr::NonNull::dangling(),
        len,
    }
}

fn open(shared: &Arc<Mutex<Shared>>) -> HostSteps {
    let device: Arc<dyn Accelerator> = Arc::new(Scripted {
        shared: Arc::clone(shared),
    });
    HostSteps::open(
        device,
        QueueSpec {
            id: 0,
            depth: 16,
            context: 0,
            unit: Unit::Copy,
            wait: userdma::device::Wait::Poll,
            arena_bytes: 64,
        },
    )
    .unwrap()
}

/// Input at 0..16, one compute step 0..16 → 16..32, result 16..32.
fn frame(q: &mut HostSteps, base: u64) {
    q.push(
        Op::ToDevice {
            from: span(16),
            to: 0,
        },
        base,
    )
    .unwrap();
    q.push(
        Op::Step {
            arena: 0,
            step: Step::Compute {
                src: 0,
                dst: 16,
                len: 16,
                xor: 0xff,
                add: 1,
            },
        },
        base + 1,
    )
    .unwrap();
    q.push(
        Op::ToHost {
            from: 16,
            to: span(16),
        },
        base + 2,
    )
    .unwrap();
}

#[test]
fn a_host_step_waits_for_the_device_and_completions_keep_their_order() {
    let shared = Arc::new(Mutex::new(Shared {
        arena: vec![0; 64],
        ..Shared::default()
    }));
    let mut q = open(&shared);
    frame(&mut q, 10);
    frame(&mut q, 20);
    q.flush().unwrap();
    let mut tags = Vec::new();
    for _ in 0..100 {
        if let Some(done) = q.poll().unwrap() {
            assert_eq!(done.status, 0);
            tags.push(done.tag);
        }
    }
    assert_eq!(tags, vec![10, 11, 12, 20, 21, 22]);
    assert_eq!(q.steps_run(), 2);
    let s = shared.lock().unwrap();
    // Each host step read the arena (its input, then its output's range) only after the H2D
    // before it completed, and the D2H after it reached the device only then.
    assert_eq!(
        s.log,
        vec!["dev 10", "host", "host", "dev 12", "dev 20", "host", "host", "dev 22"]
    );
    let expected: Vec<u8> = (1..=4u32)
        .flat_map(|w| ((w ^ 0xff) + 1).to_le_bytes())
        .collect();
    assert_eq!(
        s.out, expected,
        "the step computed over what the device wrote"
    );
}

#[test]
fn wait_runs_host_steps_and_a_shutdown_aborts_what_is_held() {
    let shared = Arc::new(Mutex::new(Shared {
        arena: vec![0; 64],
        ..Shared::default()
    }));
    let mut q = open(&shared);
    frame(&mut q, 0);
    q.flush().unwrap();
    assert_eq!(q.wait(Duration::from_secs(5)).unwrap().tag, 0);
    assert_eq!(q.wait(Duration::from_secs(5)).unwrap().tag, 1);
    assert_eq!(q.wait(Duration::from_secs(5)).unwrap().tag, 2);
    // Nothing in flight: a wait says so at once.
    let err = q.wait(Duration::from_secs(5)).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Timeout);
    // A frame whose H2D is at the device and whose step and D2H are held: shut down, the
    // step and the D2H are aborted with the H2D (the engine aborts what it has).
    frame(&mut q, 7);
    q.flush().unwrap();
    let stopped = Box::new(q).shutdown().unwrap();
    assert!(stopped.completed.is_empty());
    let mut aborted = stopped.aborted;
    aborted.sort_unstable();
    assert_eq!(aborted, vec![7, 8, 9]);
}

#[test]
fn a_step_outside_the_arena_fails_its_op_only() {
    let shared = Arc::new(Mutex::new(Shared {
        arena: vec![0; 64],
        ..Shared::default()
    }));
    let mut q = open(&shared);
    q.push(
        Op::Step {
            arena: 0,
            step: Step::Compute {
                src: 0,
                dst: 60,
                len: 16,
                xor: 0,
                add: 0,
            },
        },
        5,
    )
    .unwrap();
    frame(&mut q, 10);
    q.flush().unwrap();
    let mut done = Vec::new();
    for _ in 0..100 {
        if let Some(c) = q.poll().unwrap() {
            done.push((c.tag, c.status));
        }
    }
    assert_eq!(
        done,
        vec![(5, HOST_STEP_FAILED), (10, 0), (11, 0), (12, 0)],
        "the bad step failed, the frame after it ran"
    );
}

/// A device without activity records says so when asked to keep them, and hands out none.
#[test]
fn an_engine_without_activity_records_says_so() {
    let engine = MemoryEngine::new(2).unwrap();
    let err = engine.record_activity(64).unwrap_err();
    assert_eq!(err.code(), userdma::Code::Unsupported, "{err}");
    assert!(
        err.to_string().contains("keeps no activity records"),
        "{err}"
    );
    let mut handed = 0;
    let drained = engine.drain_activity(&mut |_| handed += 1).unwrap();
    assert_eq!((drained, handed), (ActivityDrained::default(), 0));
    engine.stop_activity();
}
