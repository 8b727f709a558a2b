use super::*;
use userdma::mmio::Backend;

#[test]
fn host_writes_are_filtered_and_mask_bits_set_and_clear() {
    let file = Arc::new(RegisterFile::new().unwrap());
    let bar = HostBar::new(Arc::clone(&file));
    let seq = file.wake_seq(Unit::Copy).load(Ordering::SeqCst);
    let compute_seq = file.wake_seq(Unit::Compute).load(Ordering::SeqCst);
    bar.write(regs::ID.offset(), Width::U32, 7).unwrap();
    assert_eq!(bar.read(regs::ID.offset(), Width::U32).unwrap(), 0);
    assert_eq!(
        file.wake_seq(Unit::Copy).load(Ordering::SeqCst),
        seq,
        "dropped writes wake nobody"
    );
    bar.write(regs::IRQ_MASK_SET.offset(), Width::U32, 0b101)
        .unwrap();
    bar.write(regs::IRQ_MASK_SET.offset(), Width::U32, 0b010)
        .unwrap();
    bar.write(regs::IRQ_MASK_CLEAR.offset(), Width::U32, 0b001)
        .unwrap();
    assert_eq!(
        bar.read(regs::IRQ_MASK.offset(), Width::U32).unwrap(),
        0b110
    );
    let doorbell = regs::queue_field(regs::Q_SQ_TAIL, 2).unwrap().offset();
    bar.write(doorbell, Width::U32, 9).unwrap();
    assert_eq!(file.get32(doorbell), 9);
    assert_eq!(
        file.wake_seq(Unit::Copy).load(Ordering::SeqCst),
        seq.wrapping_add(4)
    );
    assert_eq!(
        file.wake_seq(Unit::Compute).load(Ordering::SeqCst),
        compute_seq.wrapping_add(3),
        "a doorbell of a copy queue wakes only the copy engine"
    );
    file.set_owner(2, Unit::Compute);
    bar.write(doorbell, Width::U32, 10).unwrap();
    assert_eq!(
        file.wake_seq(Unit::Compute).load(Ordering::SeqCst),
        compute_seq.wrapping_add(4),
        "a compute queue's doorbell wakes the compute unit"
    );
    assert_eq!(
        file.wake_seq(Unit::Copy).load(Ordering::SeqCst),
        seq.wrapping_add(4)
    );
    assert_eq!(
        file.control_seq().load(Ordering::SeqCst),
        3,
        "the doorbell is not control"
    );
    let base = regs::queue_field(regs::Q_RING_BASE, 1).unwrap().offset();
    bar.write(base, Width::U64, 0x1_2345_6780).unwrap();
    assert_eq!(file.get64(base), 0x1_2345_6780);
    assert!(bar.write(base + 2, Width::U32, 0).is_err(), "misaligned");
    assert!(
        bar.read(REGISTER_BAR_SIZE, Width::U32).is_err(),
        "private page unreachable"
    );
}

#[test]
fn sub_word_accesses_merge() {
    let file = Arc::new(RegisterFile::new().unwrap());
    let bar = DeviceBar::new(Arc::clone(&file));
    bar.write(0x40, Width::U32, 0xaabb_ccdd).unwrap();
    bar.write(0x41, Width::U8, 0x11).unwrap();
    bar.write(0x42, Width::U16, 0x2233).unwrap();
    assert_eq!(bar.read(0x40, Width::U32).unwrap(), 0x2233_11dd);
    assert_eq!(bar.read(0x43, Width::U8).unwrap(), 0x22);
}

#[test]
fn doorbell_offsets() {
    for q in [0, 2, 5, 31] {
        for field in [regs::Q_SQ_TAIL, regs::Q_CQ_HEAD] {
            let at = regs::queue_field(field, q).unwrap().offset();
            assert!(is_doorbell(at), "queue {q}: {at:#x}");
            assert!(!is_doorbell(at + 1));
        }
    }
    assert!(!is_doorbell(regs::CONTROL.offset()));
    for field in [regs::Q_CONTROL.offset(), regs::Q_COMPLETED.offset()] {
        assert!(!is_doorbell(field));
    }
    assert!(!is_doorbell(
        regs::queue_field(regs::Q_CONTROL, 5).unwrap().offset()
    ));
    // No doorbell shares a cache line with a register the device writes per descriptor.
    for q in 0..regs::MAX_QUEUES {
        let doorbell = regs::queue_field(regs::Q_SQ_TAIL, q).unwrap().offset() / 64;
        for r in 0..regs::MAX_QUEUES {
            for counter in [regs::Q_COMPLETED.offset(), regs::Q_ERRORS.offset()] {
                let line = (counter + usize::from(r) * regs::QUEUE_STRIDE) / 64;
                assert_ne!(doorbell, line, "queue {q}'s doorbell, queue {r}'s counter");
            }
        }
    }
}
