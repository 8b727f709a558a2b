//! The loopback engine's activity records: each op of a frame comes back as the device ran it
//! (its unit, queue, command id, kind, bytes), the units' ops never overlap and lie inside the
//! host's window on the same clock, a reset keeps the records on (counting those it lost), and
//! a size the device does not take is refused.

use std::time::{Duration, Instant};

use userdma::device::Wait;
use userdma::pool::OwnedBuffer;
use userdma::{Code, Runtime};
use userdma_loopback::Cost;

use super::*;
use crate::accel::{monotonic_ns, HostSpan};

const LEN: u64 = 16 << 10;
const TIMEOUT: Duration = Duration::from_secs(20);

fn engine(cost: Cost) -> LoopbackEngine {
    let config = lb::Config::default()
        .cost(cost)
        .queues(2)
        .memory_size(4 << 20);
    let runtime = Runtime::loopback(config).expect("loopback device");
    LoopbackEngine::new(&runtime).expect("its engine")
}

fn spec(id: u16, unit: Unit) -> QueueSpec {
    QueueSpec {
        id,
        depth: 16,
        context: 1,
        unit,
        wait: Wait::Interrupt,
        arena_bytes: LEN,
    }
}

fn span(buffer: &OwnedBuffer) -> HostSpan {
    HostSpan {
        iova: buffer.iova(),
        ptr: buffer.as_ptr(),
        len: LEN,
    }
}

/// What a frame's run needs: the two queues (copy, compute), the host buffers, the arena.
struct Rig {
    copy: Box<dyn Queue>,
    compute: Box<dyn Queue>,
    input: OwnedBuffer,
    output: OwnedBuffer,
    arena: Arena,
}

fn rig(engine: &LoopbackEngine) -> Rig {
    let pool = engine.host_pool(4 << 20).unwrap();
    Rig {
        copy: engine.open_queue(spec(0, Unit::Copy)).unwrap(),
        compute: engine.open_queue(spec(1, Unit::Compute)).unwrap(),
        input: pool.alloc_owned(LEN as usize).unwrap(),
        output: pool.alloc_owned(LEN as usize).unwrap(),
        arena: engine.alloc_arena(LEN, 64).unwrap(),
    }
}

/// Frame `f` since the queues were opened: H2D, then (after it) a compute step, then (after
/// that) D2H. Returns the completions: the copy queue's three, then the compute queue's two.
fn frame(rig: &mut Rig, f: u64) -> (Vec<Completion>, Vec<Completion>) {
    let at = rig.arena.at;
    let step = Step::Compute {
        src: 0,
        dst: 0,
        len: LEN,
        xor: 0x5a5a_5a5a,
        add: 1,
    };
    let ops = [
        Op::ToDevice {
            from: span(&rig.input),
            to: at,
        },
        Op::After {
            queue: 1,
            count: 2 * f + 2,
        },
        Op::ToHost {
            from: at,
            to: span(&rig.output),
        },
    ];
    for (k, op) in ops.into_iter().enumerate() {
        rig.copy.push(op, k as u64).unwrap();
    }
    rig.compute
        .push(
            Op::After {
                queue: 0,
                count: 3 * f + 1,
            },
            10,
        )
        .unwrap();
    rig.compute.push(Op::Step { arena: at, step }, 11).unwrap();
    rig.compute.flush().unwrap();
    rig.copy.flush().unwrap();
    let copy: Vec<Completion> = (0..3).map(|_| rig.copy.wait(TIMEOUT).unwrap()).collect();
    let compute: Vec<Completion> = (0..2).map(|_| rig.compute.wait(TIMEOUT).unwrap()).collect();
    for done in copy.iter().chain(&compute) {
        assert_eq!(done.status, 0, "{done:?}");
    }
    (copy, compute)
}

fn drain(engine: &LoopbackEngine) -> (Vec<Activity>, ActivityDrained) {
    let mut got = Vec::new();
    let drained = engine.drain_activity(&mut |a| got.push(*a)).unwrap();
    (got, drained)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: runs the loopback device's engine thread, minutes per test under the interpreter"
)]
fn each_op_comes_back_as_the_device_ran_it() {
    let cost = Cost {
        dma_bytes_per_sec: 4_000_000_000,
        descriptor_ns: 2_000,
        compute_bytes_per_sec: 2_000_000_000,
        fence_ns: 1_000,
        ..Cost::zero()
    };
    let engine = engine(cost);
    engine.record_activity(64).unwrap();
    let mut rig = rig(&engine);
    let since = Instant::now();
    let (copy, compute) = frame(&mut rig, 0);
    let (copy2, compute2) = frame(&mut rig, 1);
    let until = Instant::now();
    let (got, drained) = drain(&engine);
    assert_eq!(
        drained,
        ActivityDrained {
            records: 10,
            lost: 0,
            bad: 0
        }
    );
    let of = |queue: u16| got.iter().filter(move |a| a.queue == queue);
    let expected_copy = [
        (ActivityKind::ToDevice, LEN),
        (ActivityKind::Wait, 0),
        (ActivityKind::ToHost, LEN),
    ];
    for (a, (done, (kind, bytes))) in of(0).zip(
        copy.iter()
            .chain(&copy2)
            .zip(expected_copy.iter().chain(&expected_copy)),
    ) {
        assert_eq!(
            (a.unit, a.command, a.kind, a.bytes),
            (Unit::Copy, done.command, *kind, *bytes)
        );
    }
    let expected_compute = [(ActivityKind::Wait, 0), (ActivityKind::Compute, LEN)];
    for (a, (done, (kind, bytes))) in of(1).zip(
        compute
            .iter()
            .chain(&compute2)
            .zip(expected_compute.iter().chain(&expected_compute)),
    ) {
        assert_eq!(
            (a.unit, a.command, a.kind, a.bytes),
            (Unit::Compute, done.command, *kind, *bytes)
        );
    }
    assert_eq!(of(0).count(), 6);
    assert_eq!(of(1).count(), 4);
    let (from, to) = (monotonic_ns(since), monotonic_ns(until));
    for a in &got {
        assert_eq!((a.status, a.context, a.switched), (0, 1, false), "{a:?}");
        assert!(a.start_ns <= a.end_ns, "{a:?}");
        assert!(
            a.start_ns + 100_000 >= from && a.end_ns <= to + 100_000,
            "{a:?}"
        );
    }
    for unit in [Unit::Copy, Unit::Compute] {
        let mine: Vec<&Activity> = got.iter().filter(|a| a.unit == unit).collect();
        for pair in mine.windows(2) {
            assert!(pair[0].end_ns <= pair[1].start_ns, "{pair:?}");
        }
    }
    // The modelled time of the H2D copy: 2 µs plus 16 KiB at 4 GB/s.
    let h2d = of(0).next().unwrap();
    assert_eq!(h2d.end_ns - h2d.start_ns, 2_000 + 4_096);
    // The step ran after the H2D copy ended, and the D2H copy after the step.
    let step = of(1).nth(1).unwrap();
    let d2h = of(0).nth(2).unwrap();
    assert!(h2d.end_ns <= step.start_ns && step.end_ns <= d2h.start_ns);
    // Nothing more until more runs.
    let (got, drained) = drain(&engine);
    assert!(got.is_empty());
    assert_eq!(drained, ActivityDrained::default());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: runs the loopback device's engine thread, minutes per test under the interpreter"
)]
fn a_reset_keeps_the_records_on_and_counts_those_it_lost() {
    let engine = engine(Cost::zero());
    engine.record_activity(64).unwrap();
    let mut rig = rig(&engine);
    frame(&mut rig, 0);
    engine.reset().unwrap();
    let Rig {
        copy,
        compute,
        input,
        output,
        arena,
    } = rig;
    copy.shutdown().unwrap();
    compute.shutdown().unwrap();
    let mut rig = Rig {
        copy: engine.open_queue(spec(0, Unit::Copy)).unwrap(),
        compute: engine.open_queue(spec(1, Unit::Compute)).unwrap(),
        input,
        output,
        arena,
    };
    let (copy, _) = frame(&mut rig, 0);
    let (got, drained) = drain(&engine);
    assert_eq!(
        drained,
        ActivityDrained {
            records: 5,
            lost: 5,
            bad: 0
        }
    );
    let commands: Vec<u16> = got
        .iter()
        .filter(|a| a.queue == 0)
        .map(|a| a.command)
        .collect();
    assert_eq!(commands, copy.iter().map(|c| c.command).collect::<Vec<_>>());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: runs the loopback device's engine thread, minutes per test under the interpreter"
)]
fn records_start_stop_and_refuse_a_size_the_device_does_not_take() {
    let engine = engine(Cost::zero());
    // Nothing recorded yet: nothing to drain.
    assert_eq!(drain(&engine).1, ActivityDrained::default());
    let err = engine.record_activity(3).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    engine.record_activity(8).unwrap();
    // Starting again replaces the records.
    engine.record_activity(16).unwrap();
    let mut rig = rig(&engine);
    frame(&mut rig, 0);
    assert_eq!(drain(&engine).1.records, 5);
    engine.stop_activity();
    frame(&mut rig, 1);
    assert_eq!(drain(&engine).1, ActivityDrained::default());
    // Stopping twice does nothing more.
    engine.stop_activity();
}
