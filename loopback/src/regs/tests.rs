use super::*;

#[test]
fn queue_fields_step_by_the_stride() {
    assert_eq!(queue_field(Q_SQ_TAIL, 0).unwrap().offset(), 0xf00);
    assert_eq!(queue_field(Q_SQ_TAIL, 1).unwrap().offset(), 0xf08);
    assert_eq!(queue_field(Q_CQ_HEAD, 31).unwrap().offset(), 0xffc);
    assert_eq!(queue_field(Q_STATUS, 1).unwrap().offset(), 0x174);
    assert_eq!(
        queue_field(Q_RING_BASE, 31).unwrap().offset(),
        0x100 + 31 * 0x60
    );
    assert!(queue_field(Q_SQ_TAIL, MAX_QUEUES).is_none());
}

#[test]
fn only_host_registers_are_writable() {
    for field in [Q_SQ_TAIL, Q_CQ_HEAD] {
        assert!(host_writable(queue_field(field, 3).unwrap().offset()));
    }
    assert!(host_writable(queue_field(Q_RING_BASE, 0).unwrap().offset()));
    assert!(host_writable(
        queue_field(Q_RING_BASE, 0).unwrap().offset() + 4
    ));
    assert!(host_writable(queue_field(Q_CONTROL, 2).unwrap().offset()));
    assert!(host_writable(CONTROL.offset()));
    assert!(host_writable(IRQ_MASK_SET.offset()));
    for ro in [
        ID.offset(),
        STATUS.offset(),
        IRQ_MASK.offset(),
        IRQ_PENDING.offset(),
    ] {
        assert!(!host_writable(ro), "{ro:#x}");
    }
    assert!(!host_writable(queue_field(Q_STATUS, 0).unwrap().offset()));
    assert!(!host_writable(
        queue_field(Q_COMPLETED, 0).unwrap().offset()
    ));
    for rw in [Q_WS_PRIVATE, Q_WS_SHARED] {
        assert!(host_writable(queue_field(rw, 5).unwrap().offset()));
        assert!(host_writable(queue_field(rw, 5).unwrap().offset() + 4));
    }
    assert!(host_writable(queue_field(Q_SHARE_KEY, 5).unwrap().offset()));
    for ro in [Q_SRAM_HITS, Q_SRAM_TOUCHED] {
        assert!(!host_writable(queue_field(ro, 5).unwrap().offset()));
    }
    // Past the last queue's doorbells, and between the activity block and the doorbells.
    assert!(!host_writable(REGISTER_BAR_SIZE));
    assert!(!host_writable(DOORBELL_BASE - 4));
    // The queue block's old doorbell words are reserved now.
    assert!(!host_writable(QUEUE_BASE + 0x18));
    assert!(!host_writable(QUEUE_BASE + 0x1c));
}

#[test]
fn raw_values_round_trip() {
    for raw in 0..=7 {
        assert_eq!(Opcode::from_raw(raw).map(|op| op as u8), Some(raw));
    }
    assert_eq!(Opcode::from_raw(0x40), None);
    for raw in 0..=12 {
        assert_eq!(StatusCode::from_raw(raw).map(|c| c as u16), Some(raw));
    }
    assert_eq!(StatusCode::from_raw(13), None);
    for raw in 0..=5 {
        assert_eq!(Fault::from_raw(raw).map(|f| f as u32), Some(raw));
    }
    assert_eq!(DEVICE_ID.to_le_bytes(), *b"UDLB");
    assert_eq!(Opcode::from_raw(8), Some(Opcode::Wait));
    assert_eq!(Fault::from_raw(6), Some(Fault::BadUnit));
    assert_eq!(Unit::from_raw(1), Some(Unit::Compute));
    assert_eq!(Unit::from_raw(2), None);
}

#[test]
fn fault_registers() {
    assert_eq!(FAULT_QUEUE.offset(), 0xd00);
    assert_eq!(FAULT_SEED.offset(), 0xd10);
    assert!(host_writable(FAULT_QUEUE.offset()));
    assert!(host_writable(FAULT_SEED.offset() + 4));
    assert!(host_writable(FAULT_CONTROL.offset()));
    assert!(!host_writable(FAULT_APPLIED.offset()));
    assert!(!host_writable(FAULT_INJECTED.offset()));
    assert_eq!(
        fault_injected(super::super::fault::Kind::Slow).offset(),
        0xd28 + 7 * 8
    );
}

#[test]
fn unit_registers() {
    assert!(host_writable(queue_field(Q_UNIT, 3).unwrap().offset()));
    assert_eq!(unit_field(DESCRIPTORS, Unit::Copy).offset(), 0x38);
    assert_eq!(unit_field(DESCRIPTORS, Unit::Compute).offset(), 0x70);
    assert_eq!(unit_field(INTERRUPTS, Unit::Compute).offset(), 0x98);
    assert_eq!(unit_field(MODELLED_NS, Unit::Compute).offset(), 0xa0);
    assert!(!host_writable(unit_field(BUSY_NS, Unit::Compute).offset()));
    assert!(!host_writable(unit_field(MODELLED_NS, Unit::Copy).offset()));
}

#[test]
fn activity_registers() {
    assert_eq!(ACTIVITY_BUFFER.offset(), 0xe00);
    assert_eq!(ACTIVITY_RECORDS.offset(), 0xe08);
    assert_eq!(ACTIVITY_CONTROL.offset(), 0xe0c);
    assert_eq!(activity_field(ACTIVITY_WRITTEN, Unit::Copy).offset(), 0xe10);
    assert_eq!(activity_field(ACTIVITY_STATUS, Unit::Copy).offset(), 0xe18);
    assert_eq!(activity_field(ACTIVITY_FAULT, Unit::Copy).offset(), 0xe1c);
    assert_eq!(
        activity_field(ACTIVITY_WRITTEN, Unit::Compute).offset(),
        0xe20
    );
    assert_eq!(
        activity_field(ACTIVITY_FAULT, Unit::Compute).offset(),
        0xe2c
    );
    for rw in [
        ACTIVITY_BUFFER.offset(),
        ACTIVITY_BUFFER.offset() + 4,
        ACTIVITY_RECORDS.offset(),
        ACTIVITY_CONTROL.offset(),
    ] {
        assert!(host_writable(rw), "{rw:#x}");
    }
    for unit in Unit::ALL {
        for ro in [ACTIVITY_WRITTEN.offset(), ACTIVITY_WRITTEN.offset() + 4] {
            assert!(!host_writable(ro + unit as usize * ACTIVITY_UNIT_STRIDE));
        }
        assert!(!host_writable(
            activity_field(ACTIVITY_STATUS, unit).offset()
        ));
        assert!(!host_writable(
            activity_field(ACTIVITY_FAULT, unit).offset()
        ));
    }
    for raw in 0..=4 {
        assert_eq!(ActivityFault::from_raw(raw).map(|f| f as u32), Some(raw));
    }
    assert_eq!(ActivityFault::from_raw(5), None);
}
