//! The device's activity records (`activity`, the register block `regs::ActivityRegs`), in a
//! thread and in a device process: a record per completed descriptor, in each queue's order
//! with its completion's command id and status; a unit's records never overlap and, with a cost
//! model, each lasts exactly what the model charged; the switch flags add up to the units'
//! switch counters and the SRAM fields to the queues' SRAM counters; a ring that wraps counts
//! its lost records exactly; records off write nothing; a reset turns them off; and a buffer the
//! device cannot write faults the records, never the host.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use userdma::device::Device;
use userdma::dma::{Access, DeviceOffset, Iova, Mapping, Slice};
use userdma::memory::{PageSize, Region};
use userdma::ring;
use userdma_loopback::activity::{self, Log, Record};
use userdma_loopback::regs::{self, ActivityControl, ActivityFault, ActivityStatus};
use userdma_loopback::{
    Config, Cost, Descriptor, Error, Loopback, Mode, Opcode, Program, Queue, StatusCode, Unit,
    Wait, Work,
};

#[path = "common/device_process.rs"]
mod device_process;

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(20));
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The device-process program: this test binary (tests/common/device_process.rs), or
/// `USERDMA_LOOPBACK_PROGRAM`.
fn program() -> Program {
    match std::env::var_os("USERDMA_LOOPBACK_PROGRAM") {
        Some(path) => Program::new(path),
        None => device_process::program(),
    }
}

/// Small costs, a context switch, and an SRAM.
fn cost() -> Cost {
    Cost {
        dma_bytes_per_sec: 4_000_000_000,
        descriptor_ns: 2_000,
        compute_bytes_per_sec: 4_000_000_000,
        context_switch_ns: 5_000,
        sram_bytes: MIB,
        dram_bytes_per_sec: 1_000_000_000,
        fence_ns: 1_000,
        ..Cost::zero()
    }
}

fn device(cost: Cost, mode: Mode) -> Arc<Loopback> {
    let config = Config::default()
        .cost(cost)
        .memory_size(4 * MIB as usize)
        .queues(4)
        .mode(mode);
    Arc::new(Loopback::new(config).expect("loopback device"))
}

fn host_memory(device: &Loopback, len: usize) -> Mapping {
    userdma::runtime::map_memory(device.dma_space().as_ref(), len, PageSize::Base)
        .expect("host memory mapped into the device's DMA space")
}

fn open(device: &Arc<Loopback>, id: u16, context: u32, unit: Unit) -> Queue<()> {
    device
        .open_queue_on(
            ring::Config::new(64).with_id(id).with_context(context),
            Wait::Interrupt,
            unit,
        )
        .expect("queue opened")
}

/// Waits for `count` completions of `queue`: their (command id, status code), in order.
fn complete(queue: &mut Queue<()>, count: usize) -> Vec<(u16, u16)> {
    (0..count)
        .map(|_| {
            let done = queue.wait(TIMEOUT).expect("a completion");
            (done.entry.command_id, done.entry.code())
        })
        .collect()
}

/// Everything the log has, and what the drain counted.
fn drain(log: &mut Log) -> (Vec<Record>, activity::Drained) {
    let mut records = Vec::new();
    let drained = log.drain(&mut |r| records.push(*r));
    (records, drained)
}

/// Records by unit, in the unit's order (its sequence numbers, consecutive from `first`).
fn by_unit(records: &[Record]) -> BTreeMap<u8, Vec<Record>> {
    let mut units: BTreeMap<u8, Vec<Record>> = BTreeMap::new();
    for r in records {
        units.entry(r.unit).or_default().push(*r);
    }
    for list in units.values() {
        for pair in list.windows(2) {
            assert_eq!(pair[1].sequence, pair[0].sequence + 1, "{pair:?}");
        }
    }
    units
}

/// A unit's records never overlap, and none ends before it starts.
fn assert_no_overlap(records: &[Record]) {
    for list in by_unit(records).values() {
        for r in list {
            assert!(r.start_ns <= r.end_ns, "{r:?}");
        }
        for pair in list.windows(2) {
            assert!(pair[0].end_ns <= pair[1].start_ns, "overlap: {pair:?}");
        }
    }
}

/// Two contexts on each unit, copies on the copy engine and computes on the compute unit,
/// an error and a cross-queue wait among them: every descriptor has its record, matching its
/// completion, and the records add up to the device's counters.
fn mixed(cost: Cost, mode: Mode) {
    const FRAMES: usize = 10;
    const COPY: u64 = 16 * KIB;
    const COMPUTE: u64 = 64 * KIB;
    let dev = device(cost, mode);
    // 256 KiB each on 1 MiB of SRAM: four computes of each context refill it, the rest hit.
    dev.set_working_set(2, 256 * KIB, 0, 0).unwrap();
    dev.set_working_set(3, 256 * KIB, 0, 0).unwrap();
    let host = host_memory(&dev, FRAMES * 2 * COPY as usize);
    let mut log = Log::start(Arc::clone(&dev), 256).expect("activity records on");
    let mut queues = [
        open(&dev, 0, 1, Unit::Copy),
        open(&dev, 1, 2, Unit::Copy),
        open(&dev, 2, 1, Unit::Compute),
        open(&dev, 3, 2, Unit::Compute),
    ];
    let before = dev.counters().unwrap();
    let since = Instant::now();
    // What each queue was given: (opcode, bytes the record should say).
    let mut given: [Vec<(Opcode, u64)>; 4] = Default::default();
    // The compute queue of context 1 first waits for three of the copy queue's descriptors.
    queues[2]
        .submit(Descriptor::wait(0, 3).context(1).build(), ())
        .unwrap();
    given[2].push((Opcode::Wait, 0));
    for i in 0..FRAMES as u64 {
        let to_device = Descriptor::to_device(
            host.iova((i * COPY) as usize).unwrap(),
            DeviceOffset(i * COPY),
            COPY,
        );
        queues[0].submit(to_device.context(1).build(), ()).unwrap();
        given[0].push((Opcode::ToDevice, COPY));
        let back = host.iova(((FRAMES as u64 + i) * COPY) as usize).unwrap();
        let to_host = Descriptor::to_host(DeviceOffset(MIB + i * COPY), back, COPY);
        queues[1].submit(to_host.context(2).build(), ()).unwrap();
        given[1].push((Opcode::ToHost, COPY));
        if i == 4 {
            // Host memory nobody mapped: an error completion, and a record of it.
            let nowhere = Descriptor::to_host(DeviceOffset(0), Iova(0x7000_0000_0000), COPY);
            queues[1].submit(nowhere.context(2).build(), ()).unwrap();
            given[1].push((Opcode::ToHost, 0));
        }
        for (q, at) in [(2usize, 2 * MIB), (3, 3 * MIB)] {
            let at = DeviceOffset(at + (i % 4) * COMPUTE);
            let compute = Descriptor::compute(at, at, COMPUTE, 0x5a5a_5a5a, 1);
            queues[q]
                .submit(compute.context(q as u32 - 1).build(), ())
                .unwrap();
            given[q].push((Opcode::Compute, COMPUTE));
        }
    }
    let completions: Vec<Vec<(u16, u16)>> = queues
        .iter_mut()
        .zip(&given)
        .map(|(queue, given)| complete(queue, given.len()))
        .collect();
    let until = Instant::now();
    let after = dev.counters().unwrap();
    let (records, drained) = drain(&mut log);
    let total: usize = given.iter().map(Vec::len).sum();
    assert_eq!(
        drained,
        activity::Drained {
            records: total as u64,
            ..Default::default()
        }
    );
    assert_eq!(records.len(), total);
    assert_no_overlap(&records);
    let (from, to) = (activity::monotonic_ns(since), activity::monotonic_ns(until));
    for r in &records {
        assert!(
            r.start_ns + 100_000 >= from && r.end_ns <= to + 100_000,
            "{r:?}"
        );
    }
    // Each queue's records, in its order: its completions' ids and codes, what it was given.
    for (q, completed) in completions.iter().enumerate() {
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| usize::from(r.queue) == q)
            .collect();
        assert_eq!(mine.len(), completed.len(), "queue {q}");
        let unit = if q < 2 { Unit::Copy } else { Unit::Compute };
        for (k, (r, &(id, code))) in mine.iter().zip(completed).enumerate() {
            assert_eq!((r.command, r.status), (id, code), "queue {q} #{k}");
            assert_eq!(r.unit(), Some(unit));
            assert_eq!(r.context, [1, 2, 1, 2][q]);
            let (opcode, bytes) = given[q][k];
            assert_eq!(r.opcode(), Some(opcode), "queue {q} #{k}");
            assert_eq!(r.bytes, bytes, "queue {q} #{k}: {r:?}");
        }
        for pair in mine.windows(2) {
            assert!(pair[0].sequence < pair[1].sequence);
        }
        // Its SRAM counters moved by what its records say.
        let (b, a) = (&before.queues[q], &after.queues[q]);
        let touched: u64 = mine.iter().map(|r| r.sram_touched).sum();
        let hits: u64 = mine.iter().map(|r| r.sram_touched - r.sram_missed).sum();
        assert_eq!(touched, a.sram_touched - b.sram_touched, "queue {q}");
        assert_eq!(hits, a.sram_hits - b.sram_hits, "queue {q}");
    }
    let failed = records
        .iter()
        .filter(|r| r.status_code() == Some(StatusCode::HostUnmapped))
        .count();
    assert_eq!(failed, 1);
    // The switch flags are the units' switch counts.
    for unit in Unit::ALL {
        let switched = records
            .iter()
            .filter(|r| r.unit() == Some(unit) && r.switched())
            .count() as u64;
        let counted = after.units[unit as usize].context_switches
            - before.units[unit as usize].context_switches;
        assert_eq!(switched, counted, "{unit:?}");
        assert_eq!(
            dev.activity_written(unit).unwrap(),
            records.iter().filter(|r| r.unit() == Some(unit)).count() as u64
        );
    }
    if cost.is_zero() {
        // The SRAM model is the cost model's.
        assert!(records
            .iter()
            .all(|r| r.sram_touched == 0 && r.sram_missed == 0));
        return;
    }
    assert!(
        records.iter().any(|r| r.switched()),
        "the contexts alternate"
    );
    let missed: u64 = records.iter().map(|r| r.sram_missed).sum();
    let touched: u64 = records.iter().map(|r| r.sram_touched).sum();
    assert_eq!(
        (missed, touched),
        (2 * 256 * KIB, 2 * FRAMES as u64 * COMPUTE)
    );
    // With a cost model, each record lasts exactly what the model charged its descriptor.
    for r in &records {
        let compute = r.opcode() == Some(Opcode::Compute);
        let work = Work {
            dma_bytes: if compute { 0 } else { r.bytes },
            compute_bytes: if compute { r.bytes } else { 0 },
            missed_bytes: r.sram_missed,
            switch: r.switched(),
            fence: r.opcode() == Some(Opcode::Wait),
        };
        let charged = u64::try_from(cost.charge_work(work).as_nanos()).unwrap();
        assert_eq!(r.duration_ns(), charged, "{r:?}");
    }
    // In modelled time a wait ends no earlier than the completion it waited for: queue 2's
    // wait for queue 0's third descriptor (the pipeline's traces check the same per frame).
    let third = records.iter().filter(|r| r.queue == 0).nth(2).unwrap();
    let wait = records
        .iter()
        .find(|r| r.queue == 2 && r.opcode() == Some(Opcode::Wait))
        .unwrap();
    assert!(wait.start_ns >= third.end_ns, "{wait:?} before {third:?}");
    log.stop().expect("records off");
    for unit in Unit::ALL {
        assert_eq!(
            dev.activity_status(unit).unwrap(),
            (ActivityStatus::empty(), None)
        );
    }
}

#[test]
fn every_descriptor_has_its_record_in_a_thread() {
    mixed(cost(), Mode::Thread);
}

#[test]
fn every_descriptor_has_its_record_in_a_device_process() {
    mixed(cost(), Mode::Process(program()));
}

#[test]
fn without_a_cost_model_records_measure_the_work() {
    mixed(Cost::zero(), Mode::Thread);
}

/// `n` 4 KiB copies on `queue` (context 0); their command ids, in order.
fn copies(queue: &mut Queue<()>, host: &Mapping, n: usize) -> Vec<u16> {
    for i in 0..n {
        let src = host.iova((i % 4) * 4096).unwrap();
        let d = Descriptor::to_device(src, DeviceOffset((i as u64 % 4) * 4096), 4096);
        queue.submit(d.build(), ()).unwrap();
    }
    complete(queue, n)
        .into_iter()
        .map(|(id, code)| {
            assert_eq!(code, StatusCode::Success as u16);
            id
        })
        .collect()
}

#[test]
fn a_ring_that_wraps_counts_its_lost_records_exactly() {
    let dev = device(Cost::zero(), Mode::Thread);
    let host = host_memory(&dev, 16 * 4096);
    let mut log = Log::start(Arc::clone(&dev), 8).unwrap();
    let mut queue = open(&dev, 0, 0, Unit::Copy);
    let ids = copies(&mut queue, &host, 20);
    let (records, drained) = drain(&mut log);
    // 20 written into 8 slots: the newest 7 are safe to read (the slot of the 8th newest is
    // the next one the device writes), 13 lost.
    assert_eq!((drained.records, drained.lost, drained.bad), (7, 13, 0));
    let got: Vec<u16> = records.iter().map(|r| r.command).collect();
    assert_eq!(got, ids[13..]);
    assert_eq!(records[0].sequence, 13);
    // Keeping up loses nothing.
    let ids = copies(&mut queue, &host, 5);
    let (records, drained) = drain(&mut log);
    assert_eq!((drained.records, drained.lost), (5, 0));
    assert_eq!(records.iter().map(|r| r.command).collect::<Vec<_>>(), ids);
    assert_eq!(dev.activity_written(Unit::Copy).unwrap(), 25);
    assert_eq!(dev.activity_written(Unit::Compute).unwrap(), 0);
}

#[test]
fn records_off_write_nothing() {
    let dev = device(Cost::zero(), Mode::Thread);
    let host = host_memory(&dev, 16 * 4096);
    let mut queue = open(&dev, 0, 0, Unit::Copy);
    copies(&mut queue, &host, 10);
    for unit in Unit::ALL {
        assert_eq!(dev.activity_written(unit).unwrap(), 0);
        assert_eq!(
            dev.activity_status(unit).unwrap(),
            (ActivityStatus::empty(), None)
        );
    }
    let mut log = Log::start(Arc::clone(&dev), 16).unwrap();
    let ids = copies(&mut queue, &host, 3);
    let (records, _) = drain(&mut log);
    assert_eq!(records.iter().map(|r| r.command).collect::<Vec<_>>(), ids);
    log.stop().unwrap();
    copies(&mut queue, &host, 6);
    assert_eq!(dev.activity_written(Unit::Copy).unwrap(), 3);
}

#[test]
fn a_reset_turns_records_off_and_a_restart_brings_them_back() {
    let dev = device(Cost::zero(), Mode::Thread);
    let host = host_memory(&dev, 16 * 4096);
    let mut log = Log::start(Arc::clone(&dev), 16).unwrap();
    let mut queue = open(&dev, 0, 0, Unit::Copy);
    copies(&mut queue, &host, 2);
    drop(queue);
    log.note_reset();
    Device::reset(dev.as_ref()).unwrap();
    for unit in Unit::ALL {
        assert_eq!(dev.activity_written(unit).unwrap(), 0);
        assert_eq!(
            dev.activity_status(unit).unwrap(),
            (ActivityStatus::empty(), None)
        );
    }
    assert_eq!(dev.get(regs::ACTIVITY_BUFFER).unwrap(), 0);
    assert!(dev.get(regs::ACTIVITY_CONTROL).unwrap().is_empty());
    log.restart().unwrap();
    let mut queue = open(&dev, 0, 0, Unit::Copy);
    let ids = copies(&mut queue, &host, 3);
    let (records, drained) = drain(&mut log);
    // The two records not drained before the reset are reported lost.
    assert_eq!((drained.records, drained.lost), (3, 2));
    assert_eq!(records.iter().map(|r| r.command).collect::<Vec<_>>(), ids);
    assert_eq!(records[0].sequence, 0);
}

/// The unit's refusal `enable_activity` reports.
fn refusal(result: Result<(), userdma::device::Error>) -> (Unit, ActivityFault) {
    let err = result.expect_err("the device refuses the buffer");
    match Error::of(&err) {
        Some(&Error::ActivityFault { unit, fault }) => (unit, fault),
        _ => panic!("not an activity fault: {err:?}"),
    }
}

/// Waits until `unit` reports a status other than `ENABLED` and empty: its fault.
fn fault_of(dev: &Loopback, unit: Unit) -> Option<ActivityFault> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let (status, fault) = dev.activity_status(unit).unwrap();
        if status.contains(ActivityStatus::FAULT) {
            return fault;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("{unit:?} reported no fault");
}

#[test]
fn a_buffer_the_device_cannot_write_faults_the_records_not_the_host() {
    let dev = device(Cost::zero(), Mode::Thread);
    // Nothing mapped there.
    assert_eq!(
        refusal(dev.enable_activity(Iova(0x7000_0000_0000), 4)),
        (Unit::Copy, ActivityFault::Unmapped)
    );
    let buffer = host_memory(&dev, 4096);
    let iova = buffer.iova(0).unwrap();
    // Not 64-byte aligned.
    assert_eq!(
        refusal(dev.enable_activity(Iova(iova.raw() + 8), 4)),
        (Unit::Copy, ActivityFault::Misaligned)
    );
    // The copy engine's ring inside the mapping, the compute unit's past its end.
    assert_eq!(
        refusal(dev.enable_activity(Iova(iova.raw() + 4096 - 256), 4)),
        (Unit::Compute, ActivityFault::Unmapped)
    );
    for unit in Unit::ALL {
        assert_eq!(
            dev.activity_status(unit).unwrap(),
            (ActivityStatus::empty(), None)
        );
    }
    // A size the host API refuses, written to the registers directly.
    dev.set(regs::ACTIVITY_BUFFER, iova.raw()).unwrap();
    dev.set(regs::ACTIVITY_RECORDS, 3).unwrap();
    dev.set(regs::ACTIVITY_CONTROL, ActivityControl::ENABLE)
        .unwrap();
    assert_eq!(fault_of(&dev, Unit::Copy), Some(ActivityFault::BadRecords));
    assert_eq!(
        fault_of(&dev, Unit::Compute),
        Some(ActivityFault::BadRecords)
    );
    dev.disable_activity().unwrap();
    // A mapping the device may only read.
    let region = Region::builder(4096)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    let read_only = dev
        .dma_space()
        .map_with(Arc::new(region), Access::ReadOnly)
        .unwrap();
    assert_eq!(
        refusal(dev.enable_activity(read_only.iova(0).unwrap(), 4)),
        (Unit::Copy, ActivityFault::NotWritable)
    );
    drop(buffer);
    // Unmapped while the records are on: the next record faults them, the descriptor still
    // completes, and nothing was written into the memory (which this test still holds).
    let region = Arc::new(
        Region::builder(4096)
            .page_size(PageSize::Base)
            .build()
            .unwrap(),
    );
    let buffer = dev.dma_space().map(Arc::clone(&region)).unwrap();
    Slice::from_region(&region).fill(0xa5);
    dev.enable_activity(buffer.iova(0).unwrap(), 4).unwrap();
    drop(buffer);
    let host = host_memory(&dev, 16 * 4096);
    let mut queue = open(&dev, 0, 0, Unit::Copy);
    copies(&mut queue, &host, 2);
    assert_eq!(fault_of(&dev, Unit::Copy), Some(ActivityFault::Unmapped));
    assert_eq!(dev.activity_written(Unit::Copy).unwrap(), 0);
    let mut after = vec![0u8; 4096];
    Slice::from_region(&region)
        .read_into(0, &mut after)
        .unwrap();
    assert!(after.iter().all(|&b| b == 0xa5));
    dev.disable_activity().unwrap();
    assert_eq!(
        dev.activity_status(Unit::Copy).unwrap(),
        (ActivityStatus::empty(), None)
    );
}
