//! The loopback device honours its cost model: when each descriptor's modelled time clearly
//! exceeds the engine's own work at host speed (here 2 ms of modelled time for work of the
//! order of 10 µs), the busy time each unit measures is within 5 % of the modelled time it was
//! charged, for each unit and for the device as a whole. Totals over many descriptors are
//! compared, never a single one's timing, so a loaded machine that wakes an engine thread a
//! little late does not fail it.

use std::sync::Arc;
use std::time::Duration;

use userdma::device::loopback::{Code, Config, Cost, Descriptor, Loopback, Unit, Wait};
use userdma::dma::DeviceOffset;
use userdma::ring::{self, Command, Queue, Status};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(20));
/// Bytes each descriptor moves or computes over.
const LEN: u64 = 256 << 10;
/// Modelled time of one descriptor.
const PER_DESCRIPTOR: Duration = Duration::from_millis(2);
/// Descriptors per unit: 80 ms of modelled time each.
const COUNT: usize = 40;

/// Rates at which `LEN` bytes cost `PER_DESCRIPTOR`, and nothing else is charged: a device copy
/// moves `2 * LEN` DMA bytes, an in-place compute `LEN` compute bytes.
fn cost() -> Cost {
    let per_sec = |bytes: u64| bytes * 1_000_000_000 / PER_DESCRIPTOR.as_nanos() as u64;
    Cost {
        dma_bytes_per_sec: per_sec(2 * LEN),
        compute_bytes_per_sec: per_sec(LEN),
        ..Cost::zero()
    }
}

fn open(device: &Arc<Loopback>, id: u16, unit: Unit) -> Queue<Command, Status, ()> {
    device
        .open_queue_on(
            ring::Config::new(64).with_id(id).with_context(1),
            Wait::Interrupt,
            unit,
        )
        .expect("queue opened")
}

/// Submits `descriptors` with one doorbell and waits for every completion, each a success.
fn run_all(queue: &mut Queue<Command, Status, ()>, descriptors: &[Command]) {
    for &d in descriptors {
        queue.push(d, ()).expect("room in the ring");
    }
    queue.flush().expect("doorbell");
    for _ in descriptors {
        let done = queue.wait(TIMEOUT).expect("a completion").entry;
        assert_eq!(done.loopback_code(), Ok(Code::Success), "{done:?}");
    }
}

/// `busy / modelled`, both in nanoseconds.
fn ratio(busy_ns: u64, modelled_ns: u64) -> f64 {
    busy_ns as f64 / modelled_ns as f64
}

#[test]
fn busy_time_is_within_5_percent_of_modelled_when_the_model_is_slower_than_the_host() {
    let config = Config::default()
        .cost(cost())
        .queues(2)
        .memory_size(4 * LEN as usize);
    let device = Arc::new(Loopback::new(config).expect("loopback device"));
    let mut copy = open(&device, 0, Unit::Copy);
    let mut compute = open(&device, 1, Unit::Compute);
    // The copy queue moves the first quarter of device memory to the second, the compute
    // queue computes in place over the third: the units overlap, and nothing they touch does.
    let copies = vec![
        Descriptor::device_copy(DeviceOffset(0), DeviceOffset(LEN), LEN)
            .context(1)
            .build();
        COUNT
    ];
    let computes =
        vec![
            Descriptor::compute(DeviceOffset(2 * LEN), DeviceOffset(2 * LEN), LEN, 0x5a, 1)
                .context(1)
                .build();
            COUNT
        ];
    std::thread::scope(|scope| {
        scope.spawn(|| run_all(&mut copy, &copies));
        run_all(&mut compute, &computes);
    });

    let c = device.counters().expect("counters");
    let modelled = PER_DESCRIPTOR.as_nanos() as u64 * COUNT as u64;
    for unit in [Unit::Copy, Unit::Compute] {
        let u = c.units[unit as usize];
        assert_eq!(u.descriptors, COUNT as u64, "{unit:?}: {u:?}");
        // The charge is exactly what the rates say.
        assert_eq!(u.modelled_ns, modelled, "{unit:?}: {u:?}");
        // Measured never undercuts modelled (the engine holds each completion back until its
        // modelled end), and the host's work, far shorter, adds no more than 5 %.
        let r = ratio(u.busy_ns, u.modelled_ns);
        eprintln!("{unit:?}: busy/modelled {r:.4}");
        assert!(
            u.busy_ns >= u.modelled_ns && r <= 1.05,
            "{unit:?}: busy {} ns against {} ns modelled (ratio {r:.3}): {u:?}",
            u.busy_ns,
            u.modelled_ns
        );
    }
    assert_eq!(c.modelled_ns, 2 * modelled);
    let r = ratio(c.busy_ns, c.modelled_ns);
    assert!(
        (1.0..=1.05).contains(&r),
        "device: busy {} ns against {} ns modelled (ratio {r:.3})",
        c.busy_ns,
        c.modelled_ns
    );
}
