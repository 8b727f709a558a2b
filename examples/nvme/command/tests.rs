use super::*;

#[test]
fn read_write_encode_lba_and_count() {
    let data = DataPointer {
        prp1: 0x1000,
        prp2: 0x2000,
    };
    let sqe = Sqe::rw(nvm::WRITE, 1, 0x1_2345_6789, 8, data).expect("8 blocks");
    assert_eq!(sqe.opcode, 0x01);
    assert_eq!(sqe.nsid, 1);
    assert_eq!((sqe.prp1, sqe.prp2), (0x1000, 0x2000));
    assert_eq!(sqe.cdw[0..3], [0x2345_6789, 0x1, 7]);
    assert!(Sqe::rw(nvm::READ, 1, 0, 0, data).is_none());
    assert!(Sqe::rw(nvm::READ, 1, 0, 65537, data).is_none());
    assert_eq!(
        Sqe::rw(nvm::READ, 1, 0, 65536, data).map(|s| s.cdw[2]),
        Some(0xffff)
    );
}

#[test]
fn admin_commands_encode_their_fields() {
    let cq = Sqe::create_io_cq(1, 64, 0xabc000, 1);
    assert_eq!(cq.opcode, admin::CREATE_IO_CQ);
    assert_eq!(cq.prp1, 0xabc000);
    assert_eq!(cq.cdw[0], (63 << 16) | 1);
    assert_eq!(cq.cdw[1], (1 << 16) | 0b11);
    let sq = Sqe::create_io_sq(1, 64, 0xdef000, 1);
    assert_eq!(sq.opcode, admin::CREATE_IO_SQ);
    assert_eq!(sq.cdw[0], (63 << 16) | 1);
    assert_eq!(sq.cdw[1], (1 << 16) | 1);
    let count = Sqe::set_queue_count(1, 1);
    assert_eq!((count.cdw[0], count.cdw[1]), (0x07, 0));
    assert_eq!(Sqe::set_queue_count(4, 2).cdw[1], (1 << 16) | 3);
    let id = Sqe::identify(cns::NAMESPACE, 1, 0x5000);
    assert_eq!(
        (id.opcode, id.nsid, id.prp1, id.cdw[0]),
        (0x06, 1, 0x5000, 0)
    );
    assert_eq!(Sqe::delete_io_sq(3).cdw[0], 3);
    assert_eq!(Sqe::delete_io_cq(3).opcode, admin::DELETE_IO_CQ);
}

#[test]
fn the_command_id_is_bytes_2_and_3() {
    let mut sqe = Sqe::flush(1);
    sqe.set_command_id(0xbeef);
    let bytes = sqe.as_bytes();
    assert_eq!(bytes.len(), 64);
    assert_eq!(bytes[2..4], [0xef, 0xbe]);
}

#[test]
fn the_phase_tag_is_dw3_bit_16() {
    let cqe = Cqe {
        status: 1,
        command_id: 7,
        ..Cqe::default()
    };
    let bytes = cqe.as_bytes();
    let dw3 = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    assert_eq!(dw3 & Cqe::PHASE_BIT, Cqe::PHASE_BIT);
    assert_eq!(dw3 & 0xffff, 7);
    assert!(cqe.status().is_success());
}

#[test]
fn status_decodes() {
    // SCT 1 SC 0x01, DNR: status field 0x4101, shifted left past the phase tag.
    let cqe = Cqe {
        status: 0x4101 << 1 | 1,
        ..Cqe::default()
    };
    let status = cqe.status();
    assert_eq!((status.code_type(), status.code()), (1, 0x01));
    assert!(status.do_not_retry());
    assert!(!status.is_success());
    assert_eq!(
        status.to_string(),
        "invalid queue identifier (SCT 1, SC 0x01, DNR)"
    );
    assert_eq!(
        Status(0x0080).to_string(),
        "LBA out of range (SCT 0, SC 0x80)"
    );
}

fn identify_page() -> Box<[u8; IDENTIFY_LEN]> {
    Box::new([0; IDENTIFY_LEN])
}

#[test]
fn identify_controller_fields() {
    let mut data = identify_page();
    data[0..2].copy_from_slice(&0x1b36_u16.to_le_bytes());
    data[4..24].copy_from_slice(b"userdma0            ");
    data[24..64].copy_from_slice(b"QEMU NVMe Ctrl                          ");
    data[64..72].copy_from_slice(b"7.2.0   ");
    data[77] = 7;
    data[516..520].copy_from_slice(&256_u32.to_le_bytes());
    let id = ControllerId::parse(&data);
    assert_eq!(id.vendor, 0x1b36);
    assert_eq!(id.serial, "userdma0");
    assert_eq!(id.model, "QEMU NVMe Ctrl");
    assert_eq!(id.firmware, "7.2.0");
    assert_eq!(id.namespaces, 256);
    assert_eq!(id.max_transfer(4096), Some(512 << 10));
    data[77] = 0;
    assert_eq!(ControllerId::parse(&data).max_transfer(4096), None);
}

#[test]
fn identify_namespace_picks_the_format_in_use() {
    let mut data = identify_page();
    data[0..8].copy_from_slice(&2048_u64.to_le_bytes());
    data[8..16].copy_from_slice(&2048_u64.to_le_bytes());
    data[25] = 1; // two formats
    data[26] = 1; // the second
    data[128..132].copy_from_slice(&(9_u32 << 16).to_le_bytes());
    data[132..136].copy_from_slice(&((12_u32 << 16) | 8).to_le_bytes());
    let ns = NamespaceId::parse(1, &data).expect("valid");
    assert_eq!(
        (ns.blocks, ns.lba_size, ns.metadata, ns.format),
        (2048, 4096, 8, 1)
    );
    data[26] = 0;
    assert_eq!(NamespaceId::parse(1, &data).expect("valid").lba_size, 512);
    data[26] = 2; // past NLBAF
    assert!(matches!(
        NamespaceId::parse(1, &data),
        Err(Error::Format {
            index: 2,
            count: 2,
            ..
        })
    ));
    data[26] = 0;
    data[128..132].copy_from_slice(&(8_u32 << 16).to_le_bytes());
    assert!(matches!(
        NamespaceId::parse(1, &data),
        Err(Error::LbaSize { lbads: 8, .. })
    ));
    data[0..8].copy_from_slice(&0_u64.to_le_bytes());
    assert!(matches!(
        NamespaceId::parse(1, &data),
        Err(Error::Empty { nsid: 1 })
    ));
}
