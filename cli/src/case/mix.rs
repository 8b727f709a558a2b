//! The streams of a run and where each runs (device, queues, NUMA node), the frames' input
//! patterns with their expected results, and each context's working set.

use std::path::Path;

use userdma::memory::numa;
use userdma::Runtime;
use userdma_infer::pipeline::{zoo, Model, WorkingSet};
use userdma_infer::sched::streams::Arrivals;
use userdma_infer::sched::StreamSpec;
use userdma_loopback::{self as loopback, Cost, LoopbackRuntime};

use super::{CaseArgs, StreamArg};
use crate::pipeline::Error;

/// Input patterns the frames cycle through (each one's detections computed once).
const PATTERNS: u64 = 4;
/// Hot activations per context besides the weights.
const ACTIVATIONS: u64 = 2_400_000;
/// Streams one device takes: three queues each, of the loopback device's 32.
const STREAMS_PER_DEVICE: usize = 10;

fn pattern(p: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (((i as u64).wrapping_mul(2_654_435_761) >> 7) ^ (p * 0x9d)) as u8)
        .collect()
}

pub(super) struct Frames {
    pub(super) inputs: Vec<Vec<u8>>,
    pub(super) expected: Vec<Vec<u8>>,
}

impl Frames {
    pub(super) fn new(model: &Model) -> Frames {
        let inputs: Vec<Vec<u8>> = (0..PATTERNS)
            .map(|p| pattern(p, model.input().bytes as usize))
            .collect();
        let expected = inputs.iter().map(|input| model.expected(input)).collect();
        Frames { inputs, expected }
    }

    /// Writes the patterns and their expected results to `path`, for the client processes
    /// of the run through the owner (each pattern: its input's length and bytes, then its
    /// result's, lengths as little-endian u64).
    pub(super) fn save(&self, path: &Path) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        for (input, expected) in self.inputs.iter().zip(&self.expected) {
            for part in [input, expected] {
                bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
                bytes.extend_from_slice(part);
            }
        }
        std::fs::write(path, bytes)
    }

    /// Reads what [`Frames::save`] wrote, checked against `model`'s sizes, and no more than
    /// the patterns take: a wrong `--frames` path (a device, a pipe, a huge file) is refused,
    /// not read until memory runs out.
    pub(super) fn load(path: &Path, model: &Model) -> std::io::Result<Frames> {
        let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not the case's frames");
        let size = (model.input().bytes)
            .checked_add(model.result().bytes)
            .and_then(|b| b.checked_add(16))
            .and_then(|b| b.checked_mul(PATTERNS))
            .ok_or_else(bad)?;
        let bytes = crate::bounded::read(path, size).map_err(|e| match e {
            crate::bounded::Error::Io(e) => e,
            crate::bounded::Error::TooLarge { .. } => bad(),
        })?;
        let mut at = 0usize;
        let mut take = |want: u64| -> std::io::Result<Vec<u8>> {
            let len = bytes
                .get(at..at + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(bad)?;
            if len != want {
                return Err(bad());
            }
            let part = bytes.get(at + 8..at + 8 + len as usize).ok_or_else(bad)?;
            at += 8 + len as usize;
            Ok(part.to_vec())
        };
        let (mut inputs, mut expected) = (Vec::new(), Vec::new());
        for _ in 0..PATTERNS {
            inputs.push(take(model.input().bytes)?);
            expected.push(take(model.result().bytes)?);
        }
        Ok(Frames { inputs, expected })
    }

    pub(super) fn of(stream: usize, frame: u64) -> usize {
        ((stream as u64 + frame) % PATTERNS) as usize
    }
}

/// The streams of a run and where each runs.
pub(super) struct Mix {
    pub(super) streams: Vec<StreamArg>,
    /// Per stream: its device, and its first queue on that device.
    pub(super) device: Vec<usize>,
    pub(super) queue: Vec<u16>,
    /// Streams per device.
    pub(super) on_device: Vec<usize>,
    top: u8,
    max_wait_ms: u64,
    /// The machine's NUMA nodes with memory (`None`: sysfs does not say).
    nodes: Option<numa::NodeList>,
}

impl Mix {
    pub(super) fn new(args: &CaseArgs) -> Result<Mix, Error> {
        let streams = if args.streams.is_empty() {
            let mut s = vec![StreamArg {
                name: "live".into(),
                priority: 1,
                fps: Some(args.live_fps),
                max_wait_ms: None,
            }];
            s.extend((0..args.playback).map(|p| StreamArg {
                name: format!("playback{}", p + 1),
                priority: 0,
                fps: (args.playback_fps > 0).then_some(args.playback_fps),
                max_wait_ms: None,
            }));
            s
        } else {
            args.streams.clone()
        };
        for (i, s) in streams.iter().enumerate() {
            if streams[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::DuplicateStream {
                    name: s.name.clone(),
                });
            }
        }
        // Checked before anything runs (the before run's scheduler would refuse them only
        // once the other runs' setup is done).
        if streams.len() > userdma_infer::sched::MAX_STREAMS {
            return Err(Error::TooManyStreams {
                count: streams.len(),
                max: userdma_infer::sched::MAX_STREAMS,
            });
        }
        let devices = usize::from(args.devices);
        let device: Vec<usize> = (0..streams.len()).map(|i| i % devices).collect();
        let mut on_device = vec![0usize; devices];
        let mut queue = Vec::with_capacity(streams.len());
        for &d in &device {
            queue.push(u16::try_from(3 * on_device[d]).unwrap_or(u16::MAX));
            on_device[d] += 1;
        }
        if let Some(&count) = on_device.iter().find(|&&n| n > STREAMS_PER_DEVICE) {
            return Err(Error::StreamsPerDevice {
                count,
                max: STREAMS_PER_DEVICE,
            });
        }
        let top = streams.iter().map(|s| s.priority).max().unwrap_or(0);
        Ok(Mix {
            streams,
            device,
            queue,
            on_device,
            top,
            max_wait_ms: args.max_wait_ms,
            nodes: numa::with_memory(Path::new("/sys"))
                .ok()
                .filter(|n| !n.as_slice().is_empty()),
        })
    }

    pub(super) fn len(&self) -> usize {
        self.streams.len()
    }

    /// Stream `i`'s maximum wait in the "after" runs.
    pub(super) fn max_wait_ms(&self, i: usize) -> Option<u64> {
        let s = &self.streams[i];
        s.max_wait_ms
            .or((s.priority < self.top).then_some(self.max_wait_ms))
    }

    /// Stream `i`'s scheduling parameters (context i + 1), with its maximum wait if `wait`.
    pub(super) fn spec(&self, i: usize, wait: bool) -> StreamSpec {
        let s = &self.streams[i];
        let spec = StreamSpec::new(s.name.clone(), s.priority, i as u32 + 1);
        match self.max_wait_ms(i).filter(|_| wait) {
            Some(w) => spec.with_max_wait(w * 1_000_000),
            None => spec,
        }
    }

    pub(super) fn arrivals(&self, i: usize) -> Arrivals {
        match self.streams[i].fps {
            Some(fps) => Arrivals::Periodic {
                period: 1_000_000_000 / u64::from(fps),
            },
            None => Arrivals::Asap,
        }
    }

    /// The NUMA node of device `d`: the machine's nodes with memory in turn, as NPUs spread
    /// over the sockets of a machine would be (`None` where sysfs does not say).
    pub(super) fn node(&self, d: usize) -> Option<u32> {
        let nodes = self.nodes.as_ref()?;
        nodes
            .as_slice()
            .get(d % nodes.as_slice().len().max(1))
            .copied()
    }

    /// One loopback device per `--devices`, each with room for its streams, its memory on its
    /// NUMA node.
    pub(super) fn runtimes(&self, model: &Model) -> Result<Vec<Runtime>, Error> {
        self.on_device
            .iter()
            .enumerate()
            .map(|(d, &n)| {
                let n = n.max(1);
                let memory = usize::try_from((model.arena_bytes() + (1 << 20)) * 4 * n as u64)
                    .unwrap_or(usize::MAX)
                    + (64 << 20);
                let config = loopback::Config::default()
                    .cost(Cost::npu())
                    .queues(u16::try_from(3 * n).unwrap_or(u16::MAX).min(32))
                    .memory_size(memory)
                    .numa_node(self.node(d));
                Ok(Runtime::loopback(config)?)
            })
            .collect()
    }

    /// Room for every frame a run of `seconds` can finish (preallocated: recording allocates
    /// nothing during the run).
    pub(super) fn timeline_capacity(&self, seconds: u64) -> usize {
        usize::try_from(seconds).unwrap_or(3600) * 200 * self.on_device.len() + 1024
    }
}

pub(super) fn working_set(args: &CaseArgs) -> WorkingSet {
    WorkingSet {
        private: ACTIVATIONS,
        shared: zoo::YOLOV5S_WEIGHTS,
        key: u32::from(args.share_weights),
    }
}
