//! The loopback device's operations, byte for byte: every opcode, the checks on every
//! descriptor field (each bad descriptor gets its own error code and touches nothing), device
//! memory bounds, unmapped host addresses, the register map, and the counters.

use userdma::device::Device;
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::{regs, Opcode, StatusCode, Wait};

mod loopback_common;

use loopback_common::{device_bytes, host_bytes, host_memory, pattern, run, MEMORY, TIMEOUT};

fn cmd(op: Opcode, src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode: op as u8,
        src,
        dst,
        len,
        ..Command::default()
    }
}

/// The compute transform, as documented on `Opcode::Compute`.
fn transform(bytes: &[u8], xor: u32, add: u32) -> (Vec<u8>, u64) {
    let mut out = Vec::with_capacity(bytes.len());
    let mut sum = 0u64;
    for word in bytes.chunks_exact(4) {
        let w = u32::from_le_bytes(word.try_into().unwrap());
        let r = (w ^ xor).wrapping_add(add);
        sum = sum.wrapping_add(u64::from(r));
        out.extend_from_slice(&r.to_le_bytes());
    }
    (out, sum)
}

#[test]
fn register_map_identifies_the_device() {
    let device = loopback_common::device(2);
    assert_eq!(device.get(regs::ID).unwrap(), regs::DEVICE_ID);
    assert_eq!(device.get(regs::VERSION).unwrap(), regs::VERSION_2);
    assert_eq!(device.get(regs::QUEUES).unwrap(), 2);
    assert_eq!(device.get(regs::MEMORY_SIZE).unwrap(), MEMORY as u64);
    assert_eq!(device.get(regs::MAX_DEPTH).unwrap(), 4096);
    assert_eq!(device.get(regs::DMA_MASK_BITS).unwrap(), 48);
    assert!(device
        .get(regs::STATUS)
        .unwrap()
        .contains(regs::DeviceStatus::READY));
    // A write to a read-only register is dropped, as hardware drops it.
    device.registers().write::<u32>(0, 0xdead_beef).unwrap();
    assert_eq!(device.get(regs::ID).unwrap(), regs::DEVICE_ID);
    assert!(device
        .registers()
        .read::<u32>(regs::REGISTER_BAR_SIZE)
        .is_err());
    // BAR 2 is the device memory, through mmio.
    let bar2 = device.bar(regs::MEMORY_BAR).unwrap();
    assert_eq!(bar2.len(), MEMORY);
    bar2.write::<u64>(0x40, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(
        device.device_memory().read::<u64>(0x40).unwrap(),
        0x1122_3344_5566_7788
    );
    assert!(device.bar(1).is_err());
    assert_eq!(device.identity().kind, userdma::device::Kind::Simulated);
}

#[test]
fn every_operation_byte_for_byte() {
    let device = loopback_common::device(2);
    let host = host_memory(&device, 64 << 10);
    let mut queue = device
        .open_queue::<()>(ring::Config::new(64).with_context(7), Wait::Interrupt)
        .unwrap();
    let data = pattern(20_003, 1);
    host.slice().write_from(5, &data).unwrap();
    let with_context = |mut c: Command| {
        c.context = 7;
        c
    };

    // Host -> device, at unaligned offsets on both sides.
    let to_device = with_context(cmd(
        Opcode::ToDevice,
        host.iova(5).unwrap().raw(),
        1001,
        20_003,
    ));
    let status = run(&mut queue, to_device);
    assert_eq!(
        (status.code(), status.result),
        (StatusCode::Success as u16, 20_003)
    );
    assert_eq!(device_bytes(&device, 1001, 20_003), data);
    assert_eq!(device_bytes(&device, 1000, 1), [0]);
    assert_eq!(device_bytes(&device, 21_004, 1), [0]);

    // Device -> device, overlapping forwards (memmove semantics).
    let mut model = device_bytes(&device, 0, 64 << 10);
    let status = run(
        &mut queue,
        with_context(cmd(Opcode::DeviceCopy, 1001, 1501, 10_000)),
    );
    assert!(status.is_success());
    model.copy_within(1001..11_001, 1501);
    assert_eq!(device_bytes(&device, 0, 64 << 10), model);

    // Fill.
    let mut fill = with_context(cmd(Opcode::Fill, 0, 30_001, 333));
    fill.args[0] = 0xa5;
    assert!(run(&mut queue, fill).is_success());
    model[30_001..30_334].fill(0xa5);
    assert_eq!(device_bytes(&device, 0, 64 << 10), model);

    // Compute, in place and to another place.
    let mut compute = with_context(cmd(Opcode::Compute, 1000, 40_000, 8_000));
    compute.args[0] = 0x5a5a_1234;
    compute.args[1] = 0x0101_0101;
    let status = run(&mut queue, compute);
    let (out, sum) = transform(&model[1000..9000], 0x5a5a_1234, 0x0101_0101);
    assert_eq!((status.code(), status.result), (0, sum));
    model[40_000..48_000].copy_from_slice(&out);
    compute.src = 40_000;
    let status = run(&mut queue, compute);
    let (out, sum) = transform(&model[40_000..48_000], 0x5a5a_1234, 0x0101_0101);
    assert_eq!(status.result, sum);
    model[40_000..48_000].copy_from_slice(&out);
    assert_eq!(device_bytes(&device, 0, 64 << 10), model);

    // Device -> host.
    let before = host_bytes(&host);
    let to_host = with_context(cmd(
        Opcode::ToHost,
        40_000,
        host.iova(30_003).unwrap().raw(),
        8_000,
    ));
    let status = run(&mut queue, to_host);
    assert_eq!((status.code(), status.result), (0, 8_000));
    let mut expect = before;
    expect[30_003..38_003].copy_from_slice(&model[40_000..48_000]);
    assert_eq!(host_bytes(&host), expect);

    // Nop.
    let status = run(&mut queue, with_context(Command::default()));
    assert_eq!((status.code(), status.result), (0, 0));

    let counters = device.counters().unwrap();
    assert_eq!(counters.descriptors, 7);
    assert_eq!(counters.errors, 0);
    assert_eq!(
        counters.bytes,
        20_003 + 10_000 + 333 + 8_000 + 8_000 + 8_000
    );
    assert_eq!(counters.queues[0].completed, 7);
    assert_eq!(counters.context_switches, 0);
}

#[test]
fn unmapped_host_addresses_fail_and_touch_nothing() {
    let device = loopback_common::device(2);
    let mut queue = device
        .open_queue::<()>(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    let host = host_memory(&device, 16 << 10);
    let gone = host_memory(&device, 16 << 10);
    let gone_iova = gone.iova(0).unwrap();
    drop(gone);
    device.device_memory().fill(0x3c);
    host.slice().write_from(0, &pattern(16 << 10, 9)).unwrap();
    let host_before = host_bytes(&host);
    let device_before = device_bytes(&device, 0, MEMORY);
    let end = host.iova(0).unwrap() + (16 << 10);
    let cases = [
        // Past the end of the mapping, straddling its end, an unmapped mapping, page 0.
        cmd(Opcode::ToDevice, end.raw(), 0, 8),
        cmd(Opcode::ToDevice, (end - 4).raw(), 0, 8),
        cmd(Opcode::ToDevice, gone_iova.raw(), 0, 8),
        cmd(Opcode::ToDevice, 0, 0, 1),
        cmd(Opcode::ToHost, 0, (end - 1).raw(), 2),
        cmd(Opcode::ToHost, 0, (gone_iova + 100).raw(), 100),
        cmd(Opcode::ToHost, 0, 1 << 40, 4096),
    ];
    for case in cases {
        let status = run(&mut queue, case);
        let iova = if case.opcode == Opcode::ToDevice as u8 {
            case.src
        } else {
            case.dst
        };
        assert_eq!(
            (status.code(), status.result),
            (StatusCode::HostUnmapped as u16, iova),
            "{case:?}"
        );
    }
    assert_eq!(host_bytes(&host), host_before, "host memory changed");
    assert_eq!(
        device_bytes(&device, 0, MEMORY),
        device_before,
        "device memory changed"
    );
    let counters = device.counters().unwrap();
    assert_eq!((counters.errors, counters.bytes), (cases.len() as u64, 0));
    assert_eq!(counters.queues[0].errors, cases.len() as u64);
}

#[test]
fn device_memory_bounds_and_overflow() {
    let device = loopback_common::device(2);
    let host = host_memory(&device, 8 << 10);
    let iova = host.iova(0).unwrap();
    let mut queue = device
        .open_queue::<()>(ring::Config::new(16), Wait::Poll)
        .unwrap();
    let size = MEMORY as u64;
    let fits = run(&mut queue, cmd(Opcode::ToDevice, iova.raw(), size - 8, 8));
    assert!(fits.is_success());
    let cases = [
        (
            cmd(Opcode::ToDevice, iova.raw(), size - 4, 8),
            StatusCode::DeviceOutOfBounds,
            size - 4,
        ),
        (
            cmd(Opcode::ToDevice, iova.raw(), size, 1),
            StatusCode::DeviceOutOfBounds,
            size,
        ),
        (
            cmd(Opcode::ToHost, size - 1, iova.raw(), 2),
            StatusCode::DeviceOutOfBounds,
            size - 1,
        ),
        (
            cmd(Opcode::DeviceCopy, 0, size - 2, 4),
            StatusCode::DeviceOutOfBounds,
            size - 2,
        ),
        (
            cmd(Opcode::DeviceCopy, u64::MAX - 1, 0, 1),
            StatusCode::DeviceOutOfBounds,
            u64::MAX - 1,
        ),
        (
            cmd(Opcode::DeviceCopy, u64::MAX, 0, 1),
            StatusCode::AddressOverflow,
            u64::MAX,
        ),
        (
            cmd(Opcode::ToDevice, iova.raw(), u64::MAX - 1, 4),
            StatusCode::AddressOverflow,
            u64::MAX - 1,
        ),
        (
            cmd(Opcode::ToHost, 0, u64::MAX - 7, 9),
            StatusCode::AddressOverflow,
            u64::MAX - 7,
        ),
    ];
    let before = device_bytes(&device, 0, MEMORY);
    for (case, code, result) in cases {
        let status = run(&mut queue, case);
        assert_eq!(
            (status.code(), status.result),
            (code as u16, result),
            "{case:?}"
        );
    }
    let mut fill = cmd(Opcode::Fill, 0, size - 16, 17);
    fill.args[0] = 1;
    assert_eq!(
        run(&mut queue, fill).code(),
        StatusCode::DeviceOutOfBounds as u16
    );
    assert_eq!(device_bytes(&device, 0, MEMORY), before);
}

#[test]
fn malformed_descriptors_get_their_code_and_change_nothing() {
    let device = loopback_common::device(2);
    let host = host_memory(&device, 8 << 10);
    let iova = host.iova(0).unwrap();
    host.slice().write_from(0, &pattern(8 << 10, 3)).unwrap();
    let mut queue = device
        .open_queue::<()>(ring::Config::new(32).with_context(2), Wait::Interrupt)
        .unwrap();
    let good = Command {
        context: 2,
        ..cmd(Opcode::ToDevice, iova.raw(), 0, 64)
    };
    let with = |f: &dyn Fn(&mut Command)| {
        let mut c = good;
        f(&mut c);
        c
    };
    let cases: Vec<(Command, StatusCode)> = vec![
        (with(&|c| c.opcode = 0x40), StatusCode::BadOpcode),
        (with(&|c| c.opcode = 0xff), StatusCode::BadOpcode),
        (with(&|c| c.flags = 0x80), StatusCode::BadFlags),
        (with(&|c| c.context = 3), StatusCode::BadContext),
        (with(&|c| c.args[2] = 1), StatusCode::BadArgs),
        (with(&|c| c.len = 0), StatusCode::BadLength),
        (
            with(&|c| {
                c.opcode = Opcode::Fill as u8;
                c.src = 0;
                c.args[0] = 0x100;
            }),
            StatusCode::BadArgs,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Fill as u8;
                c.args[0] = 1;
            }),
            StatusCode::BadArgs,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Compute as u8;
                c.src = 0;
                c.args[0] = 1 << 32;
            }),
            StatusCode::BadArgs,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Compute as u8;
                c.src = 2;
            }),
            StatusCode::Misaligned,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Compute as u8;
                c.src = 0;
                c.len = 6;
            }),
            StatusCode::Misaligned,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Nop as u8;
                c.src = 0;
                c.dst = 0;
            }),
            StatusCode::BadLength,
        ),
        (
            with(&|c| {
                c.opcode = Opcode::Nop as u8;
                c.len = 0;
            }),
            StatusCode::BadArgs,
        ),
    ];
    let device_before = device_bytes(&device, 0, MEMORY);
    for (case, code) in &cases {
        let status = run(&mut queue, *case);
        assert_eq!(status.code(), *code as u16, "{case:?}");
    }
    assert_eq!(device_bytes(&device, 0, MEMORY), device_before);
    // The good descriptor still works after all that.
    assert!(run(&mut queue, good).is_success());
    let counters = device.counters().unwrap();
    assert_eq!(counters.errors, cases.len() as u64);
    assert_eq!(counters.descriptors, cases.len() as u64 + 1);
}

#[test]
fn batches_on_two_queues_complete_in_order() {
    let device = loopback_common::device(2);
    let host = host_memory(&device, 256 << 10);
    let data = pattern(128 << 10, 77);
    host.slice().write_from(0, &data).unwrap();
    let mut queues: Vec<Queue<Command, Status, usize>> = (0..2)
        .map(|q| {
            device
                .open_queue(ring::Config::new(64).with_id(q), Wait::Interrupt)
                .unwrap()
        })
        .collect();
    // Each queue copies its half in 64 pieces of 1 KiB, to device and back to the upper half.
    for (q, queue) in queues.iter_mut().enumerate() {
        for i in 0..64usize {
            let offset = q * (64 << 10) + i * 1024;
            let desc = cmd(
                Opcode::ToDevice,
                host.iova(offset).unwrap().raw(),
                offset as u64,
                1024,
            );
            queue.push(desc, i).unwrap();
        }
        queue.flush().unwrap();
    }
    for queue in &mut queues {
        let mut next = 0;
        while next < 64 {
            let done = queue.wait(TIMEOUT).unwrap();
            assert!(done.entry.is_success());
            assert_eq!(done.payload, next, "completions in submission order");
            next += 1;
        }
    }
    assert_eq!(device_bytes(&device, 0, 128 << 10), data);
    for queue in &mut queues {
        let q = usize::from(queue.id());
        let desc = cmd(
            Opcode::ToHost,
            (q * (64 << 10)) as u64,
            host.iova((128 << 10) + q * (64 << 10)).unwrap().raw(),
            64 << 10,
        );
        queue.submit(desc, 0).unwrap();
        assert!(queue.wait(TIMEOUT).unwrap().entry.is_success());
    }
    let back = host_bytes(&host);
    assert_eq!(&back[128 << 10..], &data[..]);
    let counters = device.counters().unwrap();
    assert_eq!(counters.queues[0].completed, 65);
    assert_eq!(counters.queues[1].completed, 65);
    // Same context on both queues: moving between them is no context switch.
    assert_eq!(counters.context_switches, 0);
}
