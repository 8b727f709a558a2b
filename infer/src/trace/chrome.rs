//! The Chrome trace-event JSON format, as Perfetto's UI (ui.perfetto.dev) and
//! `chrome://tracing` open it: `{"traceEvents": [...], "displayTimeUnit": "ns", "otherData":
//! {...}}`, times in microseconds (with nanosecond fractions) since the trace's epoch.
//!
//! | process (`pid`) | thread (`tid`) | what |
//! |---|---|---|
//! | 1 `streams` | 1 + stream | each frame as an async slice `NAME #N` from its arrival (or preprocessing) to its result, with `queued` (arrival to dispatch) and `on device` (announced to result) nested in it |
//! | 1 `streams` | — | counters `pool P buffers out` |
//! | 2 `host` | 1 + track | the program's own spans ([`Event::Span`]), `TRACK #ID` |
//! | 10 + device | 1 `copy unit`, 2 `compute unit` | the device's activity records as slices (`to_device live #12`, `step 3 live #12`; a record no op of a traced frame matches is named by its kind), context switches as instants `switch to context C` with the SRAM refill that followed (`refill_bytes`: bytes the new context's compute read from DRAM until the unit's next switch) |
//! | 10 + device | 3 `scheduler` | decisions as instants `decide NAME` (`forced`, `switch`) |
//! | 10 + device | 4 `faults` | faults, resets, removals and recoveries as instants |
//! | 10 + device | 100 + queue | each op from when it could start (announced, and the queue's previous op completed) to when the host saw its completion: the host's view, the only one of a device that keeps no activity records |
//! | 10 + device | — | counters `frames in flight`, `queue Q depth`, `SRAM hit % (context C)` |
//!
//! An activity record is matched to the op it ran by its queue and command id, in order
//! (both come in the queue's order); [`Summary::ops_matched`] counts the ops that found one.

use std::collections::HashMap;
use std::io::Write;

use serde_json::{json, Value};

use super::{Event, FaultKind, Names, OpSeen};
use crate::accel::{Activity, ActivityKind, Unit};

/// The streams' process id.
const STREAMS_PID: u32 = 1;
/// The host's own tracks' process id.
const HOST_PID: u32 = 2;
/// Device `d`'s process id is this plus `d`.
const DEVICE_PID: u32 = 10;
const COPY_TID: u32 = 1;
const COMPUTE_TID: u32 = 2;
const SCHEDULER_TID: u32 = 3;
const FAULTS_TID: u32 = 4;
/// Queue `q`'s track is this plus `q`.
const QUEUE_TID: u32 = 100;
/// How far after the host saw an op's completion the device's record of it may end: the two
/// clocks are put on one by anchors read a moment apart.
const CLOCK_SLACK_NS: u64 = 100_000;

/// What [`write`] was given.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    pub(crate) events: &'a [Event],
    pub(crate) names: &'a Names,
    pub(crate) dropped: u64,
    pub(crate) recorded: u64,
    pub(crate) activity_lost: u64,
    pub(crate) activity_bad: u64,
}

/// What a written trace holds (also in its `otherData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Events the trace held.
    pub events: u64,
    /// Events recorded over the run (held plus dropped).
    pub recorded: u64,
    /// Events dropped when the ring was full (the oldest).
    pub dropped: u64,
    /// JSON trace events written.
    pub written: u64,
    /// Ops the host saw complete.
    pub ops: u64,
    /// Of them, those matched with the device's activity record.
    pub ops_matched: u64,
    /// Frames handed to postprocessing.
    pub frames: u64,
    /// Scheduler decisions.
    pub decisions: u64,
    /// Device activity records held.
    pub activity: u64,
    /// Activity records the devices overwrote before they were drained.
    pub activity_lost: u64,
    /// Activity records refused as malformed.
    pub activity_bad: u64,
    /// Per device (in [`Trace::device`](super::Trace::device) order): context switches in its
    /// activity records.
    pub switches: Vec<u64>,
    /// Per device: why it has no unit tracks (it keeps no activity records), or `None`.
    pub no_activity: Vec<Option<String>>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn unit_tid(unit: Unit) -> u32 {
    match unit {
        Unit::Copy => COPY_TID,
        Unit::Compute => COMPUTE_TID,
    }
}

fn kind_name(kind: ActivityKind) -> &'static str {
    match kind {
        ActivityKind::ToDevice => "to_device",
        ActivityKind::ToHost => "to_host",
        ActivityKind::Compute => "compute",
        ActivityKind::Wait => "wait",
        ActivityKind::Other => "other",
    }
}

/// The JSON writer: one event at a time, comma-separated.
struct Out<'a> {
    out: &'a mut dyn Write,
    written: u64,
}

impl Out<'_> {
    fn event(&mut self, value: &Value) -> std::io::Result<()> {
        if self.written > 0 {
            self.out.write_all(b",\n")?;
        }
        serde_json::to_writer(&mut *self.out, value)?;
        self.written += 1;
        Ok(())
    }

    fn name(&mut self, what: &str, pid: u32, tid: Option<u32>, name: &str) -> std::io::Result<()> {
        let mut v = json!({"ph": "M", "name": what, "pid": pid, "args": {"name": name}});
        if let Some(tid) = tid {
            v["tid"] = json!(tid);
        }
        self.event(&v)
    }

    fn counter(&mut self, pid: u32, name: &str, at_ns: u64, value: f64) -> std::io::Result<()> {
        self.event(&json!({
            "ph": "C", "name": name, "pid": pid, "ts": us(at_ns), "args": {"value": value}
        }))
    }
}

/// Emits a counter that steps by `deltas` (time, change), sorted by time.
fn step_counter(
    out: &mut Out<'_>,
    pid: u32,
    name: &str,
    mut deltas: Vec<(u64, i64)>,
) -> std::io::Result<()> {
    deltas.sort_by_key(|&(t, d)| (t, d));
    let mut value = 0i64;
    let mut i = 0;
    while i < deltas.len() {
        let at = deltas[i].0;
        while i < deltas.len() && deltas[i].0 == at {
            value += deltas[i].1;
            i += 1;
        }
        out.counter(pid, name, at, value.max(0) as f64)?;
    }
    Ok(())
}

/// Writes `input` as Chrome trace-event JSON.
pub(crate) fn write(out: &mut dyn Write, input: &Input<'_>) -> std::io::Result<Summary> {
    let names = input.names;
    let stream_name = |s: u32| {
        names
            .streams
            .get(s as usize)
            .cloned()
            .unwrap_or_else(|| format!("stream {s}"))
    };
    let mut summary = Summary {
        events: input.events.len() as u64,
        recorded: input.recorded,
        dropped: input.dropped,
        activity_lost: input.activity_lost,
        activity_bad: input.activity_bad,
        switches: vec![0; names.devices.len()],
        no_activity: names
            .devices
            .iter()
            .map(|d| d.no_activity.clone())
            .collect(),
        ..Summary::default()
    };

    // Sort the events out.
    let mut ops: HashMap<(u16, u16), Vec<OpSeen>> = HashMap::new();
    let mut activity: HashMap<(u16, u16), Vec<Activity>> = HashMap::new();
    let mut units: HashMap<(u16, u32), Vec<usize>> = HashMap::new();
    let mut all_activity: Vec<(u16, Activity)> = Vec::new();
    let mut waited: HashMap<(u32, u64), (u64, u64)> = HashMap::new();
    for e in input.events {
        match *e {
            Event::Op(op) => {
                summary.ops += 1;
                ops.entry((op.device, op.queue)).or_default().push(op);
            }
            Event::Activity {
                device,
                activity: a,
            } => {
                summary.activity += 1;
                activity.entry((device, a.queue)).or_default().push(a);
                units
                    .entry((device, unit_tid(a.unit)))
                    .or_default()
                    .push(all_activity.len());
                all_activity.push((device, a));
            }
            Event::Waited {
                stream,
                frame,
                arrived_ns,
                dispatched_ns,
                ..
            } => {
                waited.insert((stream, frame), (arrived_ns, dispatched_ns));
            }
            Event::Frame { .. } => summary.frames += 1,
            Event::Decision { .. } => summary.decisions += 1,
            Event::PoolOut { .. } | Event::Fault { .. } | Event::Span { .. } => {}
        }
    }

    // Match each queue's activity records with its ops, in order.
    let mut matched: HashMap<(u16, u16, usize), OpSeen> = HashMap::new();
    for (&(device, queue), acts) in &activity {
        let Some(seen) = ops.get(&(device, queue)) else {
            continue;
        };
        let (mut i, mut j) = (0, 0);
        while i < seen.len() && j < acts.len() {
            let (op, act) = (&seen[i], &acts[j]);
            if act.end_ns > op.done_ns.saturating_add(CLOCK_SLACK_NS) {
                // The device ended this record after the host saw the op: the op's own record
                // is missing (lost, or before the trace).
                i += 1;
            } else if act.command == op.command {
                matched.insert((device, queue, j), *op);
                summary.ops_matched += 1;
                i += 1;
                j += 1;
            } else {
                // A record of an op no traced frame made (a probe, a reset's drain).
                j += 1;
            }
        }
    }

    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut w = Out { out, written: 0 };

    // Names of processes and tracks.
    w.name("process_name", STREAMS_PID, None, "streams")?;
    w.event(&json!({"ph": "M", "name": "process_sort_index", "pid": STREAMS_PID, "args": {"sort_index": 0}}))?;
    for (s, name) in names.streams.iter().enumerate() {
        w.name("thread_name", STREAMS_PID, Some(1 + s as u32), name)?;
    }
    if !names.tracks.is_empty() {
        w.name("process_name", HOST_PID, None, "host")?;
        for (t, name) in names.tracks.iter().enumerate() {
            w.name("thread_name", HOST_PID, Some(1 + t as u32), name)?;
        }
    }
    for (d, info) in names.devices.iter().enumerate() {
        let pid = DEVICE_PID + d as u32;
        w.name(
            "process_name",
            pid,
            None,
            &format!("device {d}: {}", info.name),
        )?;
        w.event(&json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": 1 + d}}))?;
        w.name("thread_name", pid, Some(COPY_TID), "copy unit")?;
        w.name("thread_name", pid, Some(COMPUTE_TID), "compute unit")?;
        w.name("thread_name", pid, Some(SCHEDULER_TID), "scheduler")?;
        w.name("thread_name", pid, Some(FAULTS_TID), "faults")?;
        for spec in &info.queues {
            let unit = match spec.unit {
                Unit::Copy => "copy",
                Unit::Compute => "compute",
            };
            w.name(
                "thread_name",
                pid,
                Some(QUEUE_TID + u32::from(spec.id)),
                &format!(
                    "queue {} ({unit}, context {}): host view",
                    spec.id, spec.context
                ),
            )?;
        }
    }

    // The units' slices, switches (with the refill after them) and SRAM hit rates.
    let mut unit_keys: Vec<_> = units.keys().copied().collect();
    unit_keys.sort_unstable();
    for key in unit_keys {
        let (device, tid) = key;
        let pid = DEVICE_PID + u32::from(device);
        let mut order = units[&key].clone();
        order.sort_by_key(|&i| (all_activity[i].1.start_ns, all_activity[i].1.end_ns));
        // Position of each record within its queue's list, to find its match.
        let mut switches: Vec<(Activity, u32, u64)> = Vec::new();
        let mut last_context: Option<u32> = None;
        for &i in &order {
            let a = all_activity[i].1;
            if a.switched {
                let d = usize::from(device);
                if summary.switches.len() <= d {
                    summary.switches.resize(d + 1, 0);
                }
                summary.switches[d] += 1;
                switches.push((a, last_context.unwrap_or(a.context), 0));
            }
            if let Some(s) = switches.last_mut() {
                s.2 += a.sram_missed;
            }
            last_context = Some(a.context);
        }
        for (a, from, refill) in switches {
            w.event(&json!({
                "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": us(a.start_ns),
                "name": format!("switch to context {}", a.context),
                "args": {"from_context": from, "to_context": a.context, "refill_bytes": refill},
            }))?;
        }
    }
    let mut keys: Vec<_> = activity.keys().copied().collect();
    keys.sort_unstable();
    let mut hits: HashMap<(u16, u32), (u64, u64)> = HashMap::new();
    let mut hit_samples: Vec<(u16, u32, u64, f64)> = Vec::new();
    for (device, queue) in keys {
        let pid = DEVICE_PID + u32::from(device);
        for (j, a) in activity[&(device, queue)].iter().enumerate() {
            let op = matched.get(&(device, queue, j));
            let mut name = match op {
                Some(op) => format!(
                    "{} {} #{}",
                    op.step.name(),
                    stream_name(op.stream),
                    op.frame
                ),
                None => kind_name(a.kind).to_owned(),
            };
            if a.status != 0 {
                name.push_str(" (failed)");
            }
            let mut args = json!({
                "queue": a.queue, "command": a.command, "context": a.context,
                "kind": kind_name(a.kind), "bytes": a.bytes, "status": a.status,
                "sram_touched": a.sram_touched, "sram_missed": a.sram_missed,
            });
            if let Some(op) = op {
                args["stream"] = json!(stream_name(op.stream));
                args["frame"] = json!(op.frame);
                args["step"] = json!(op.step.name());
            }
            w.event(&json!({
                "ph": "X", "pid": pid, "tid": unit_tid(a.unit), "name": name,
                "ts": us(a.start_ns), "dur": us(a.end_ns.saturating_sub(a.start_ns)),
                "args": args,
            }))?;
            if a.sram_touched > 0 {
                let h = hits.entry((device, a.context)).or_default();
                h.0 += a.sram_touched.saturating_sub(a.sram_missed);
                h.1 += a.sram_touched;
                hit_samples.push((device, a.context, a.end_ns, h.0 as f64 * 100.0 / h.1 as f64));
            }
        }
    }
    hit_samples.sort_by_key(|s| s.2);
    for (device, context, at, rate) in hit_samples {
        let name = format!("SRAM hit % (context {context})");
        w.counter(DEVICE_PID + u32::from(device), &name, at, rate)?;
    }

    // The queues as the host saw them, and their depth.
    let mut keys: Vec<_> = ops.keys().copied().collect();
    keys.sort_unstable();
    for (device, queue) in keys {
        let pid = DEVICE_PID + u32::from(device);
        let mut seen = ops[&(device, queue)].clone();
        seen.sort_by_key(|o| o.done_ns);
        let mut depth = Vec::with_capacity(2 * seen.len());
        let mut previous = 0u64;
        for op in &seen {
            let start = op.announced_ns.max(previous).min(op.done_ns);
            previous = op.done_ns;
            depth.push((op.announced_ns, 1));
            depth.push((op.done_ns, -1));
            let mut name = format!(
                "{} {} #{}",
                op.step.name(),
                stream_name(op.stream),
                op.frame
            );
            if op.status != 0 {
                name.push_str(" (failed)");
            }
            w.event(&json!({
                "ph": "X", "pid": pid, "tid": QUEUE_TID + u32::from(op.queue), "name": name,
                "ts": us(start), "dur": us(op.done_ns - start),
                "args": {
                    "stream": stream_name(op.stream), "frame": op.frame, "queue": op.queue,
                    "command": op.command, "status": op.status, "device": op.device,
                    "announced_us": us(op.announced_ns),
                },
            }))?;
        }
        step_counter(&mut w, pid, &format!("queue {queue} depth"), depth)?;
    }

    // Frames, decisions, faults, pools.
    let mut in_flight: HashMap<u16, Vec<(u64, i64)>> = HashMap::new();
    for e in input.events {
        match *e {
            Event::Frame {
                device,
                stream,
                frame,
                preprocess_ns,
                submitted_ns,
                done_ns,
                ok,
            } => {
                let flight = in_flight.entry(device).or_default();
                flight.push((submitted_ns, 1));
                flight.push((done_ns, -1));
                let name = format!("{} #{frame}", stream_name(stream));
                let id = format!("{stream}:{frame}");
                let tid = 1 + stream;
                let (arrived, dispatched) = waited
                    .get(&(stream, frame))
                    .copied()
                    .unwrap_or((preprocess_ns, preprocess_ns));
                let begin = arrived.min(preprocess_ns);
                let args = json!({
                    "stream": stream_name(stream), "frame": frame, "ok": ok, "device": device,
                    "latency_ms": (done_ns.saturating_sub(begin)) as f64 / 1e6,
                    "arrived_us": us(arrived), "dispatched_us": us(dispatched),
                    "submitted_us": us(submitted_ns), "done_us": us(done_ns),
                });
                let async_event = |ph: &str, name: &str, at: u64, args: Option<&Value>| {
                    let mut v = json!({
                        "ph": ph, "cat": "frame", "id": id, "name": name,
                        "pid": STREAMS_PID, "tid": tid, "ts": us(at),
                    });
                    if let Some(args) = args {
                        v["args"] = args.clone();
                    }
                    v
                };
                w.event(&async_event("b", &name, begin, Some(&args)))?;
                if dispatched > arrived {
                    w.event(&async_event("b", "queued", arrived, None))?;
                    w.event(&async_event("e", "queued", dispatched, None))?;
                }
                w.event(&async_event(
                    "b",
                    "on device",
                    submitted_ns.max(begin),
                    None,
                ))?;
                w.event(&async_event("e", "on device", done_ns, None))?;
                w.event(&async_event("e", &name, done_ns, None))?;
            }
            Event::Decision {
                device,
                stream,
                at_ns,
                forced,
                switch,
            } => {
                w.event(&json!({
                    "ph": "i", "s": "t", "pid": DEVICE_PID + u32::from(device),
                    "tid": SCHEDULER_TID, "ts": us(at_ns),
                    "name": format!("decide {}", stream_name(stream)),
                    "args": {"stream": stream_name(stream), "forced": forced, "switch": switch},
                }))?;
            }
            Event::Fault {
                device,
                at_ns,
                what,
            } => {
                let name = match what {
                    FaultKind::Detected { code } => format!("fault (code {code})"),
                    FaultKind::Reset => "reset".to_owned(),
                    FaultKind::Removed => "removed".to_owned(),
                    FaultKind::Recovered { lost, finished } => {
                        format!("recovered: {finished} finished, {lost} lost")
                    }
                };
                w.event(&json!({
                    "ph": "i", "s": "p", "pid": DEVICE_PID + u32::from(device),
                    "tid": FAULTS_TID, "ts": us(at_ns), "name": name,
                    "args": {"what": what},
                }))?;
            }
            Event::PoolOut {
                pool,
                at_ns,
                buffers,
            } => {
                w.counter(
                    STREAMS_PID,
                    &format!("pool {pool} buffers out"),
                    at_ns,
                    buffers as f64,
                )?;
            }
            Event::Span {
                track,
                id,
                start_ns,
                end_ns,
                bytes,
                ok,
            } => {
                let track_name = names
                    .tracks
                    .get(usize::from(track))
                    .cloned()
                    .unwrap_or_else(|| format!("track {track}"));
                let mut name = format!("{track_name} #{id}");
                if !ok {
                    name.push_str(" (failed)");
                }
                w.event(&json!({
                    "ph": "X", "pid": HOST_PID, "tid": 1 + u32::from(track), "name": name,
                    "ts": us(start_ns), "dur": us(end_ns.saturating_sub(start_ns)),
                    "args": {"id": id, "bytes": bytes, "ok": ok},
                }))?;
            }
            Event::Op(_) | Event::Waited { .. } | Event::Activity { .. } => {}
        }
    }
    let mut devices: Vec<_> = in_flight.into_iter().collect();
    devices.sort_by_key(|(d, _)| *d);
    for (device, deltas) in devices {
        step_counter(
            &mut w,
            DEVICE_PID + u32::from(device),
            "frames in flight",
            deltas,
        )?;
    }

    let written = w.written;
    summary.written = written;
    let other = serde_json::to_string(&summary)?;
    write!(
        out,
        "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{other}}}\n"
    )?;
    Ok(summary)
}
