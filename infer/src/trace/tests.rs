use super::*;
use crate::accel::{ActivityKind, Unit};
use serde_json::Value;

fn op(frame: u64, queue: u16, command: u16, step: OpStep, at: u64, done: u64) -> Event {
    Event::Op(OpSeen {
        device: 0,
        stream: 0,
        frame,
        queue,
        command,
        step,
        status: 0,
        announced_ns: at,
        done_ns: done,
    })
}

// One record, every field a test varies given in the order of the record.
#[allow(clippy::too_many_arguments)]
fn activity(
    unit: Unit,
    queue: u16,
    command: u16,
    context: u32,
    kind: ActivityKind,
    span: (u64, u64),
    switched: bool,
    missed: u64,
) -> Activity {
    Activity {
        unit,
        queue,
        command,
        context,
        kind,
        status: 0,
        start_ns: span.0,
        end_ns: span.1,
        bytes: 4096,
        switched,
        sram_touched: if kind == ActivityKind::Compute {
            1000
        } else {
            0
        },
        sram_missed: missed,
    }
}

fn json_of(trace: &Trace) -> (Value, Summary) {
    let mut out = Vec::new();
    let summary = trace.write_json(&mut out).unwrap();
    (serde_json::from_slice(&out).unwrap(), summary)
}

fn events_named<'a>(v: &'a Value, ph: &str) -> Vec<&'a Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == ph)
        .collect()
}

#[test]
fn a_full_ring_drops_the_oldest_and_counts_them() {
    let trace = Trace::new(4);
    for i in 0..6u64 {
        trace.record(Event::PoolOut {
            pool: 0,
            at_ns: i,
            buffers: i,
        });
    }
    assert_eq!(trace.dropped(), 2);
    let held: Vec<u64> = trace.events().iter().map(Event::at_ns).collect();
    assert_eq!(held, [2, 3, 4, 5]);
    let (v, summary) = json_of(&trace);
    assert_eq!(
        (summary.events, summary.recorded, summary.dropped),
        (4, 6, 2)
    );
    assert_eq!(v["otherData"]["dropped"], 2);
    assert_eq!(Trace::new(0).capacity(), 1);
}

#[test]
fn streams_are_numbered_once_by_name() {
    let trace = Trace::new(8);
    assert_eq!(trace.stream("live"), 0);
    assert_eq!(trace.stream("playback"), 1);
    assert_eq!(trace.stream("live"), 0);
}

#[test]
fn activity_is_matched_to_ops_by_queue_and_command_in_order() {
    let trace = Trace::new(64);
    let live = trace.stream("live");
    assert_eq!(live, 0);
    // Queue 0 (copy): frame 0's input, then frame 1's; queue 1 (compute): frame 0's step.
    trace.record(op(0, 0, 7, OpStep::ToDevice, 100, 2_000));
    trace.record(op(0, 1, 3, OpStep::Step(1), 100, 5_000));
    trace.record(op(1, 0, 8, OpStep::ToDevice, 2_500, 6_000));
    let a = [
        activity(
            Unit::Copy,
            0,
            7,
            0,
            ActivityKind::ToDevice,
            (200, 1_900),
            false,
            0,
        ),
        // A record no traced op made (a probe): named by its kind.
        activity(
            Unit::Copy,
            0,
            99,
            0,
            ActivityKind::Other,
            (1_950, 1_960),
            false,
            0,
        ),
        activity(
            Unit::Copy,
            0,
            8,
            0,
            ActivityKind::ToDevice,
            (2_600, 5_900),
            false,
            0,
        ),
        activity(
            Unit::Compute,
            1,
            3,
            1,
            ActivityKind::Compute,
            (2_000, 4_900),
            true,
            400,
        ),
    ];
    for activity in a {
        trace.record(Event::Activity {
            device: 0,
            activity,
        });
    }
    let (v, summary) = json_of(&trace);
    assert_eq!(
        (summary.ops, summary.ops_matched, summary.activity),
        (3, 3, 4)
    );
    let slices = events_named(&v, "X");
    let names: Vec<(&str, u64)> = slices
        .iter()
        .filter(|e| e["pid"] == 10 && e["tid"].as_u64().unwrap() < 100)
        .map(|e| (e["name"].as_str().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    assert!(names.contains(&("to_device live #0", 1)), "{names:?}");
    assert!(names.contains(&("to_device live #1", 1)), "{names:?}");
    assert!(names.contains(&("other", 1)), "{names:?}");
    assert!(names.contains(&("step 1 live #0", 2)), "{names:?}");
    // The host's view of queue 0: frame 1's input could not start before frame 0's ended.
    let q0: Vec<(f64, f64)> = slices
        .iter()
        .filter(|e| e["tid"] == 100)
        .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap()))
        .collect();
    assert_eq!(q0, [(0.1, 1.9), (2.5, 3.5)]);
    // The switch, with the refill that followed it.
    let instants = events_named(&v, "i");
    let switch = instants
        .iter()
        .find(|e| e["name"] == "switch to context 1")
        .expect("switch instant");
    assert_eq!(switch["args"]["refill_bytes"], 400);
    assert_eq!(summary.switches, [1]);
    // The hit rate: 600 of 1000 bytes.
    let counters = events_named(&v, "C");
    let hit = counters
        .iter()
        .find(|e| e["name"] == "SRAM hit % (context 1)")
        .expect("hit counter");
    assert_eq!(hit["args"]["value"], 60.0);
    // Queue 0's depth: 1, then 2 once frame 1's op is announced, back to 0.
    let depth: Vec<f64> = counters
        .iter()
        .filter(|e| e["name"] == "queue 0 depth")
        .map(|e| e["args"]["value"].as_f64().unwrap())
        .collect();
    assert_eq!(depth, [1.0, 0.0, 1.0, 0.0]);
}

#[test]
fn a_record_missing_for_an_op_does_not_shift_the_others() {
    let trace = Trace::new(64);
    trace.stream("s");
    // Ops with commands 1, 2, 3; the device's record of command 2 was lost. Command ids
    // repeat (2 again later), so matching must also look at the times.
    trace.record(op(0, 0, 1, OpStep::ToDevice, 0, 1_000_000));
    trace.record(op(1, 0, 2, OpStep::ToDevice, 0, 2_000_000));
    trace.record(op(2, 0, 3, OpStep::ToDevice, 0, 3_000_000));
    trace.record(op(3, 0, 2, OpStep::ToDevice, 0, 4_000_000));
    for (command, span) in [
        (1, (0, 900_000)),
        (3, (2_100_000, 2_900_000)),
        (2, (3_100_000, 3_900_000)),
    ] {
        trace.record(Event::Activity {
            device: 0,
            activity: activity(
                Unit::Copy,
                0,
                command,
                0,
                ActivityKind::ToDevice,
                span,
                false,
                0,
            ),
        });
    }
    let (v, summary) = json_of(&trace);
    assert_eq!(summary.ops_matched, 3);
    let names: Vec<&str> = events_named(&v, "X")
        .iter()
        .filter(|e| e["tid"] == 1)
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["to_device s #0", "to_device s #2", "to_device s #3"]
    );
}

#[test]
fn frames_decisions_and_faults_have_their_tracks() {
    let trace = Trace::new(64);
    let s = trace.stream("live");
    trace.record(Event::Waited {
        device: 0,
        stream: s,
        frame: 4,
        arrived_ns: 1_000,
        dispatched_ns: 3_000,
    });
    trace.record(Event::Frame {
        device: 0,
        stream: s,
        frame: 4,
        preprocess_ns: 3_000,
        submitted_ns: 3_500,
        done_ns: 10_000,
        ok: true,
    });
    trace.record(Event::Decision {
        device: 0,
        stream: s,
        at_ns: 3_000,
        forced: false,
        switch: true,
    });
    trace.record(Event::Fault {
        device: 0,
        at_ns: 20_000,
        what: FaultKind::Recovered {
            lost: 2,
            finished: 1,
        },
    });
    let (v, summary) = json_of(&trace);
    assert_eq!((summary.frames, summary.decisions), (1, 1));
    let begins = events_named(&v, "b");
    let frame = begins.iter().find(|e| e["name"] == "live #4").unwrap();
    assert_eq!(frame["ts"], 1.0);
    assert_eq!(frame["args"]["latency_ms"], 0.009);
    assert!(begins.iter().any(|e| e["name"] == "queued"));
    assert_eq!(events_named(&v, "e").len(), begins.len());
    let instants = events_named(&v, "i");
    assert!(instants
        .iter()
        .any(|e| e["name"] == "decide live" && e["args"]["switch"] == true));
    assert!(instants
        .iter()
        .any(|e| e["name"] == "recovered: 1 finished, 2 lost"));
    let in_flight: Vec<f64> = events_named(&v, "C")
        .iter()
        .filter(|e| e["name"] == "frames in flight")
        .map(|e| e["args"]["value"].as_f64().unwrap())
        .collect();
    assert_eq!(in_flight, [1.0, 0.0]);
}

#[test]
fn saving_to_a_missing_directory_says_which_file() {
    let trace = Trace::new(4);
    let err = trace
        .save("/nonexistent-directory/run.json")
        .expect_err("no such directory");
    let text = err.to_string();
    assert!(text.contains("/nonexistent-directory/run.json"), "{text}");
    assert_eq!(err.code(), userdma::Code::System);
}
