//! The loopback device's two units — the copy engine and the compute unit, each its own thread
//! with its own modelled clock — and the `Wait` opcode that orders one queue after another:
//! copying and computing overlap (and do not on one unit), a compute queue that waits for the
//! copy queue sees the data it delivered, bad `Wait`s and a bad `unit` register are refused, a
//! `Wait` that is never satisfied holds only its own queue (and no core) until its queue stops
//! or the device resets, and the counters add up per queue and per unit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::dma::{DeviceOffset, Iova, Mapping};
use userdma::memory::PageSize;
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{
    regs, Config, Cost, Counters, Descriptor, Fault, Loopback, LoopbackStatus, Mode, Program,
    QueueCounters, StatusCode, Unit, Wait,
};

#[path = "common/device_process.rs"]
mod device_process;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(20));

/// The device-process program: this test binary (tests/common/device_process.rs), or
/// `USERDMA_LOOPBACK_PROGRAM`.
fn program() -> Program {
    match std::env::var_os("USERDMA_LOOPBACK_PROGRAM") {
        Some(path) => Program::new(path),
        None => device_process::program(),
    }
}

fn device(config: Config) -> Arc<Loopback> {
    Arc::new(Loopback::new(config).expect("loopback device"))
}

fn host_memory(device: &Loopback, len: usize) -> Mapping {
    userdma::runtime::map_memory(device.dma_space().as_ref(), len, PageSize::Base)
        .expect("host memory mapped into the device's DMA space")
}

fn open(
    device: &Arc<Loopback>,
    id: u16,
    depth: u32,
    context: u32,
    unit: Unit,
) -> Queue<Command, Status, ()> {
    device
        .open_queue_on(
            ring::Config::new(depth).with_id(id).with_context(context),
            Wait::Interrupt,
            unit,
        )
        .expect("queue opened")
}

/// Waits for `count` completions of `queue`, asserting each succeeded; returns them.
fn complete(queue: &mut Queue<Command, Status, ()>, count: usize) -> Vec<Status> {
    (0..count)
        .map(|_| {
            let done = queue.wait(TIMEOUT).expect("a completion").entry;
            assert_eq!(done.loopback_code(), Ok(StatusCode::Success), "{done:?}");
            done
        })
        .collect()
}

fn run(queue: &mut Queue<Command, Status, ()>, command: Command) -> Status {
    queue.submit(command, ()).expect("submitted");
    queue.wait(TIMEOUT).expect("completed").entry
}

/// The transform of `Opcode::Compute` on little-endian words.
fn transform(bytes: &[u8], xor: u32, add: u32) -> Vec<u8> {
    bytes
        .chunks_exact(4)
        .flat_map(|w| {
            let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            ((w ^ xor).wrapping_add(add)).to_le_bytes()
        })
        .collect()
}

/// Frames of `FRAME` bytes: a ToDevice each on the copy queue (0), and on the compute queue (1)
/// for each a Wait for the copy queue's count of that frame, then a Compute in place. `units`
/// are the two queues' units. Returns the wall time from the first submission to the last
/// completion.
fn pipeline(device: &Arc<Loopback>, units: [Unit; 2], frames: usize, frame: usize) -> Duration {
    let host = host_memory(device, frames * frame);
    let mut copy = open(device, 0, 64, 0, units[0]);
    let mut compute = open(device, 1, 64, 0, units[1]);
    let start = Instant::now();
    // The compute side first: its Waits must hold it until the copies land.
    for i in 0..frames {
        let at = DeviceOffset((i * frame) as u64);
        compute
            .submit(Descriptor::wait(0, i as u64 + 1).build(), ())
            .unwrap();
        compute
            .submit(
                Descriptor::compute(at, at, frame as u64, 0x5a5a_5a5a, 3).build(),
                (),
            )
            .unwrap();
    }
    for i in 0..frames {
        let src = host.iova(i * frame).unwrap();
        let to_device = Descriptor::to_device(src, DeviceOffset((i * frame) as u64), frame as u64);
        copy.submit(to_device.build(), ()).unwrap();
    }
    complete(&mut copy, frames);
    complete(&mut compute, 2 * frames);
    start.elapsed()
}

#[test]
fn copying_and_computing_overlap_on_two_units_and_not_on_one() {
    // A ToDevice of FRAME bytes and a Compute of FRAME bytes each take t; a Wait costs
    // descriptor_ns (1 µs).
    const FRAME: usize = 64 << 10;
    const FRAMES: usize = 8;
    // The modelled time t of each operation must dwarf the host's real work for it (a debug or
    // sanitized build copies and transforms 64 KiB slowly, a loaded machine slower still), or
    // the real work, not the model, decides what overlaps. So the real work is measured first,
    // with no modelled time, on one unit (every operation in turn), and t made ten times it.
    let real = pipeline(
        &device(
            Config::default()
                .cost(Cost::zero())
                .memory_size(FRAMES * FRAME),
        ),
        [Unit::Copy, Unit::Copy],
        FRAMES,
        FRAME,
    );
    let t = (real / (2 * FRAMES as u32) * 10).max(Duration::from_millis(5));
    let rate = (FRAME as u128 * 1_000_000_000 / t.as_nanos()) as u64;
    let cost = Cost {
        dma_bytes_per_sec: rate,
        descriptor_ns: 1_000,
        compute_bytes_per_sec: rate,
        context_switch_ns: 0,
        ..Cost::zero()
    };
    let config = || Config::default().cost(cost).memory_size(FRAMES * FRAME);
    let serial = 2 * FRAMES as u32 * t;
    // The copies back to back, then the last frame's compute.
    let parallel = (FRAMES as u32 + 1) * t;

    let two = pipeline(
        &device(config()),
        [Unit::Copy, Unit::Compute],
        FRAMES,
        FRAME,
    );
    assert!(
        two < serial.mul_f64(0.8),
        "two units took {two:?}; serial {serial:?}: they did not overlap"
    );
    assert!(
        two >= parallel,
        "two units took {two:?}, less than the modelled {parallel:?}"
    );

    let one = pipeline(&device(config()), [Unit::Copy, Unit::Copy], FRAMES, FRAME);
    assert!(
        one >= serial,
        "one unit took {one:?}, less than the serial {serial:?}"
    );
    let one = pipeline(
        &device(config()),
        [Unit::Compute, Unit::Compute],
        FRAMES,
        FRAME,
    );
    assert!(
        one >= serial,
        "the compute unit alone took {one:?}, less than the serial {serial:?}"
    );
}

/// Frames through both units: the copy queue (0) brings each frame in; the compute queue (1)
/// waits for it, computes it into an output area and copies the result out. Checks every
/// output against the input.
fn data_visibility(device: &Arc<Loopback>, frames: usize, frame: usize) {
    let input = host_memory(device, frames * frame);
    let output = host_memory(device, frames * frame);
    let bytes: Vec<u8> = (0..frames * frame)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    input.slice().write_from(0, &bytes).unwrap();
    let mut copy = open(device, 0, 128, 1, Unit::Copy);
    let mut compute = open(device, 1, 128, 2, Unit::Compute);
    // The copy queue's counter counts on from an earlier run of the queue.
    let base = device
        .get(regs::queue_field(regs::Q_COMPLETED, 0).unwrap())
        .unwrap();
    let out_base = (frames * frame) as u64;
    const BATCH: usize = 32;
    let (xor, add) = (0x0f0f_1234, 77);
    for batch in (0..frames).step_by(BATCH) {
        let end = (batch + BATCH).min(frames);
        // The compute side of the batch first, so its Waits usually find the data not there
        // yet.
        for i in batch..end {
            let src = DeviceOffset((i * frame) as u64);
            let dst = DeviceOffset(out_base + (i * frame) as u64);
            let host: Iova = output.iova(i * frame).unwrap();
            for d in [
                Descriptor::wait(0, base + i as u64 + 1),
                Descriptor::compute(src, dst, frame as u64, xor, add),
                Descriptor::to_host(dst, host, frame as u64),
            ] {
                compute.submit(d.context(2).build(), ()).unwrap();
            }
        }
        for i in batch..end {
            let src = input.iova(i * frame).unwrap();
            let d = Descriptor::to_device(src, DeviceOffset((i * frame) as u64), frame as u64);
            copy.submit(d.context(1).build(), ()).unwrap();
        }
        complete(&mut copy, end - batch);
        for (k, done) in complete(&mut compute, 3 * (end - batch))
            .into_iter()
            .enumerate()
        {
            if k % 3 == 0 {
                let target = base + (batch + k / 3) as u64 + 1;
                assert!(done.result >= target, "a Wait completed at {}", done.result);
            }
        }
    }
    let mut out = vec![0u8; frames * frame];
    output.slice().read_into(0, &mut out).unwrap();
    for i in 0..frames {
        let range = i * frame..(i + 1) * frame;
        assert_eq!(
            out[range.clone()],
            transform(&bytes[range], xor, add)[..],
            "frame {i}: the compute unit did not see what the copy engine delivered"
        );
    }
}

#[test]
fn a_wait_sees_the_data_the_other_unit_delivered() {
    let device = device(Config::default().cost(Cost::zero()).memory_size(1 << 20));
    data_visibility(&device, 4000, 16);
    data_visibility(&device, 500, 256);
}

#[test]
fn a_wait_sees_the_data_the_other_unit_delivered_in_a_device_process() {
    let device = device(
        Config::default()
            .cost(Cost::zero())
            .memory_size(1 << 20)
            .mode(Mode::Process(program())),
    );
    data_visibility(&device, 2000, 16);
}

#[test]
fn bad_waits_and_a_bad_unit_are_refused() {
    let device = device(Config::default().cost(Cost::zero()).queues(3));
    let mut queue = open(&device, 1, 16, 0, Unit::Compute);
    let code = |queue: &mut Queue<Command, Status, ()>, command: Command| {
        run(queue, command).loopback_code()
    };
    assert_eq!(
        code(&mut queue, Descriptor::wait(1, 0).build()),
        Ok(StatusCode::BadArgs),
        "its own queue"
    );
    assert_eq!(
        code(&mut queue, Descriptor::wait(3, 0).build()),
        Ok(StatusCode::BadArgs),
        "past the queues"
    );
    assert_eq!(
        code(&mut queue, Descriptor::wait(1000, 0).build()),
        Ok(StatusCode::BadArgs)
    );
    let mut c = Descriptor::wait(0, 0).build();
    c.src = 8;
    assert_eq!(code(&mut queue, c), Ok(StatusCode::BadArgs), "src");
    let mut c = Descriptor::wait(0, 0).build();
    c.dst = 8;
    assert_eq!(code(&mut queue, c), Ok(StatusCode::BadArgs), "dst");
    let mut c = Descriptor::wait(0, 0).build();
    c.args[2] = 1;
    assert_eq!(
        code(&mut queue, c),
        Ok(StatusCode::BadArgs),
        "a reserved word"
    );
    let mut c = Descriptor::wait(0, 0).build();
    c.len = 4;
    assert_eq!(code(&mut queue, c), Ok(StatusCode::BadLength), "len");
    // A good one on an idle queue: its counter is 0.
    let done = run(&mut queue, Descriptor::wait(2, 0).build());
    assert_eq!(
        (done.loopback_code(), done.result),
        (Ok(StatusCode::Success), 0)
    );
    let counters = device.counters().unwrap();
    assert_eq!(counters.units[Unit::Compute as usize].errors, 7);
    assert_eq!(counters.units[Unit::Copy as usize].descriptors, 0);

    // A unit register naming no unit faults the queue at enable.
    let q = 2;
    let field = |f| regs::queue_field(f, q).unwrap();
    let control = regs::queue_field(regs::Q_CONTROL, q).unwrap();
    let status = regs::queue_field(regs::Q_STATUS, q).unwrap();
    device.set(field(regs::Q_UNIT), 2).unwrap();
    device.set(control, regs::QueueControl::ENABLE).unwrap();
    let start = Instant::now();
    while !device
        .get(status)
        .unwrap()
        .contains(regs::QueueStatus::FAULT)
    {
        assert!(start.elapsed() < Duration::from_secs(10), "no fault");
        std::thread::yield_now();
    }
    let fault = device
        .get(regs::queue_field(regs::Q_FAULT, q).unwrap())
        .unwrap();
    assert_eq!(Fault::from_raw(fault), Some(Fault::BadUnit));
    device.set(control, regs::QueueControl::empty()).unwrap();
    while !device.get(status).unwrap().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "fault not cleared"
        );
        std::thread::yield_now();
    }
    // The queue works once the unit register is right.
    let mut fixed = open(&device, q, 16, 0, Unit::Compute);
    assert_eq!(
        run(&mut fixed, Descriptor::nop().build()).loopback_code(),
        Ok(StatusCode::Success)
    );
}

/// CPU time process `pid` has used (user + system, from `/proc/<pid>/stat`).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name (which ends with the last ')'): state is field 3,
    // utime 14, stime 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Duration::from_millis(ticks * 1000 / hz.max(1) as u64)
}

#[test]
fn an_unsatisfied_wait_holds_only_its_queue_until_stopped_or_reset() {
    // In a device process, so its CPU time is the units' alone.
    let device = device(
        Config::default()
            .cost(Cost::zero())
            .queues(4)
            .mode(Mode::Process(program())),
    );
    let pid = device.process_id().unwrap();
    let mut copy = open(&device, 0, 64, 0, Unit::Copy);
    let mut waiting = open(&device, 1, 64, 0, Unit::Compute);
    let mut other = open(&device, 2, 64, 0, Unit::Compute);
    waiting
        .submit(Descriptor::wait(0, 1_000_000).build(), ())
        .unwrap();
    waiting.submit(Descriptor::nop().build(), ()).unwrap();
    // Both units go on with their other queues.
    for _ in 0..100 {
        assert_eq!(
            run(&mut copy, Descriptor::nop().build()).loopback_code(),
            Ok(StatusCode::Success)
        );
        assert_eq!(
            run(&mut other, Descriptor::nop().build()).loopback_code(),
            Ok(StatusCode::Success)
        );
    }
    assert!(
        waiting.poll_one().unwrap().is_none(),
        "the Wait or the Nop after it completed"
    );
    // The waiting unit idles (and sleeps) like an idle one: no core spun.
    std::thread::sleep(Duration::from_millis(20));
    let (cpu, wall) = (cpu_time(pid), Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_time(pid) - cpu;
    let elapsed = wall.elapsed();
    assert!(
        used < elapsed / 4,
        "{used:?} of CPU in {elapsed:?} while a Wait is pending"
    );
    assert!(waiting.poll_one().unwrap().is_none());
    let q1 = regs::queue_field(regs::Q_COMPLETED, 1).unwrap();
    assert_eq!(device.get(q1).unwrap(), 0);

    // Stopping the queue releases the Wait: nothing of it completes, and the queue can be
    // opened again.
    let stopped = waiting.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        stopped.completed.is_empty(),
        "{:?}",
        stopped.completed.len()
    );
    assert_eq!(stopped.aborted.len(), 2);
    assert_eq!(device.get(q1).unwrap(), 0);
    let mut again = open(&device, 1, 64, 0, Unit::Compute);
    assert_eq!(
        run(&mut again, Descriptor::nop().build()).loopback_code(),
        Ok(StatusCode::Success)
    );

    // So does a reset.
    again
        .submit(Descriptor::wait(0, 1_000_000).build(), ())
        .unwrap();
    let mut on_copy = open(&device, 3, 16, 0, Unit::Copy);
    on_copy
        .submit(Descriptor::wait(2, 1_000_000).build(), ())
        .unwrap();
    std::thread::sleep(Duration::from_millis(10));
    let before = device.get(regs::RESET_COUNT).unwrap();
    device
        .reset()
        .expect("reset with Waits pending on both units");
    assert_eq!(device.get(regs::RESET_COUNT).unwrap(), before + 1);
    for q in 0..4 {
        let status = regs::queue_field(regs::Q_STATUS, q).unwrap();
        assert!(
            device.get(status).unwrap().is_empty(),
            "queue {q} after reset"
        );
    }
    assert_eq!(device.counters().unwrap(), zero_counters(4));
    drop((copy, other, again, on_copy));
    // Both units serve again after the reset.
    let mut copy = open(&device, 0, 16, 0, Unit::Copy);
    let mut compute = open(&device, 1, 16, 0, Unit::Compute);
    assert_eq!(
        run(&mut copy, Descriptor::nop().build()).loopback_code(),
        Ok(StatusCode::Success)
    );
    let done = run(&mut compute, Descriptor::wait(0, 1).build());
    assert_eq!(
        (done.loopback_code(), done.result),
        (Ok(StatusCode::Success), 1)
    );
}

/// The counters of a device with `queues` queues that did nothing.
fn zero_counters(queues: usize) -> Counters {
    Counters {
        queues: vec![QueueCounters::default(); queues],
        ..Counters::default()
    }
}

#[test]
fn counters_add_up_per_queue_and_per_unit() {
    let device = device(Config::default().cost(Cost::zero()).queues(4));
    // The copy engine serves queues 0 (context 1) and 2 (context 2); the compute unit queue
    // 1 (context 3) and 3 (context 3).
    let mut q0 = open(&device, 0, 256, 1, Unit::Copy);
    let mut q1 = open(&device, 1, 256, 3, Unit::Compute);
    let mut q2 = open(&device, 2, 16, 2, Unit::Copy);
    let mut q3 = open(&device, 3, 256, 3, Unit::Compute);
    let host = host_memory(&device, 64 << 10);
    let iova = host.iova(0).unwrap();
    // Context switches on the copy engine only, one at a time: 1 -> 2 -> 1 -> 2 -> 1.
    for _ in 0..2 {
        for (queue, context) in [(&mut q0, 1), (&mut q2, 2)] {
            let d = Descriptor::nop().context(context).build();
            assert_eq!(run(queue, d).loopback_code(), Ok(StatusCode::Success));
        }
    }
    assert_eq!(
        run(&mut q0, Descriptor::nop().context(1).build()).loopback_code(),
        Ok(StatusCode::Success)
    );
    // Then both units busy at once: 200 copies on queue 0, 200 computes on queues 1 and 3
    // each, with one bad descriptor each on 0 and 1.
    const N: usize = 200;
    let bad = Command {
        opcode: 0xee,
        ..Command::default()
    };
    for i in 0..N {
        let d = Descriptor::to_device(iova + (i * 64) as u64, DeviceOffset(0), 64).context(1);
        q0.submit(d.build(), ()).unwrap();
        for (queue, at) in [(&mut q1, 0x10000u64), (&mut q3, 0x20000)] {
            let d = Descriptor::compute(DeviceOffset(at), DeviceOffset(at), 64, 1, 2).context(3);
            queue.submit(d.build(), ()).unwrap();
        }
    }
    q0.submit(bad, ()).unwrap();
    q1.submit(Command { context: 3, ..bad }, ()).unwrap();
    let drain = |queue: &mut Queue<Command, Status, ()>, count: usize| {
        let mut errors = 0;
        for _ in 0..count {
            let done = queue.wait(TIMEOUT).unwrap().entry;
            errors += usize::from(done.loopback_code() != Ok(StatusCode::Success));
        }
        errors
    };
    assert_eq!(drain(&mut q0, N + 1), 1);
    assert_eq!(drain(&mut q1, N + 1), 1);
    assert_eq!(drain(&mut q3, N), 0);

    let c = device.counters().unwrap();
    let copy = c.units[Unit::Copy as usize];
    let compute = c.units[Unit::Compute as usize];
    let completed: Vec<u64> = c.queues.iter().map(|q| q.completed).collect();
    assert_eq!(completed, [3 + N as u64 + 1, N as u64 + 1, 2, N as u64]);
    assert_eq!(copy.descriptors, 5 + N as u64 + 1);
    assert_eq!(compute.descriptors, 2 * N as u64 + 1);
    assert_eq!(c.descriptors, completed.iter().sum::<u64>());
    assert_eq!((copy.errors, compute.errors, c.errors), (1, 1, 2));
    assert_eq!(
        (c.queues[0].errors, c.queues[1].errors, c.queues[3].errors),
        (1, 1, 0)
    );
    assert_eq!(copy.bytes, 64 * N as u64);
    assert_eq!(compute.bytes, 2 * 64 * N as u64);
    assert_eq!(c.bytes, 3 * 64 * N as u64);
    // One unit saw contexts 1, 2, 1, 2, 1 then only 1; the other only 3.
    assert_eq!((copy.context_switches, compute.context_switches), (4, 0));
    assert_eq!(c.context_switches, 4);
    assert!(
        copy.busy_ns > 0 && compute.busy_ns > 0,
        "{copy:?} {compute:?}"
    );
    assert_eq!(c.busy_ns, copy.busy_ns + compute.busy_ns);
    assert_eq!(c.interrupts, copy.interrupts + compute.interrupts);
}
