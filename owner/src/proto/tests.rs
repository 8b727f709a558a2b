use super::wire::payload_len;
use super::*;

fn round(msg: Msg) {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = encode(&msg, &mut buf);
    assert_eq!(decode(&buf[..n]).unwrap(), msg);
    // Every shorter or longer message is refused.
    assert!(decode(&buf[..n - 1]).is_err());
    if n < MAX_MESSAGE {
        assert!(decode(&buf[..n + 1]).is_err());
    }
}

#[test]
fn every_kind_round_trips() {
    let name = Name::new("live").unwrap();
    round(Msg::Hello {
        pool_bytes: 8 << 20,
        name,
    });
    round(Msg::Welcome {
        client: 3,
        pool_bytes: 1 << 24,
        sq_entries: 64,
        cq_entries: 64,
        max_streams: 4,
        max_in_flight: 64,
    });
    round(Msg::Declare {
        priority: 200,
        period_ns: 40_000_000,
        max_wait_ns: 0,
        name,
        model: Name::new("yolov5s").unwrap(),
    });
    round(Msg::Declared {
        stream: 1,
        input_bytes: 1228800,
        result_bytes: 4096,
    });
    round(Msg::Close { stream: 7 });
    round(Msg::Closed { stream: 7 });
    round(Msg::Stats);
    round(Msg::StreamStats(StreamFigures {
        stream: 2,
        client: 9,
        name,
        frames: 10,
        bound_ns: 5,
        ..StreamFigures::default()
    }));
    round(Msg::ClientStats(ClientFigures {
        client: 1,
        pid: 77,
        uid: 0,
        name: Name::new("camera service").unwrap(),
        ..ClientFigures::default()
    }));
    round(Msg::DeviceStats(DeviceFigures {
        device: Name::lossy("loopback NPU owner0"),
        clock_ns: 1_500_000_000,
        counters: Some(DeviceCounters {
            copy: UnitFigures {
                busy_ns: 3,
                descriptors: 4,
                ..UnitFigures::default()
            },
            compute: UnitFigures {
                errors: 1,
                context_switches: u64::MAX,
                ..UnitFigures::default()
            },
            sram_hits: 7,
            sram_touched: 8,
        }),
    }));
    round(Msg::DeviceStats(DeviceFigures {
        device: Name::default(),
        clock_ns: 1,
        counters: None,
    }));
    round(Msg::OwnerStats(OwnerFigures {
        clients: 2,
        resets: 1,
        ..OwnerFigures::default()
    }));
    round(Msg::Event {
        kind: EventKind::Reset,
        detail: 9,
    });
    round(Msg::Error {
        code: 3,
        fatal: true,
        text: "uid 1000 is not allowed".into(),
    });
}

#[test]
fn every_kind_fits_the_longest_message() {
    for kind in 1..=K_DEVICE_STATS {
        let len = payload_len(kind).expect("a kind");
        assert!(HEADER + len <= MAX_MESSAGE, "kind {kind}: {len} bytes");
    }
    assert_eq!(payload_len(K_DEVICE_STATS + 1), None);
}

#[test]
fn names_are_cut_to_fit_and_keep_their_text() {
    let long = "é".repeat(20); // 40 bytes
    let n = Name::lossy(&long);
    assert_eq!(n.as_str(), "é".repeat(16));
    assert_eq!(Name::lossy("a\0b").as_str(), "ab");
    assert_eq!(format!("{:?}", Name::new("x").unwrap()), "\"x\"");
    assert_eq!(Name::default().as_str(), "");
}

#[test]
fn device_counters_are_present_or_all_zero() {
    let mut buf = [0u8; MAX_MESSAGE];
    let figures = DeviceFigures {
        device: Name::new("npu").unwrap(),
        clock_ns: 5,
        counters: None,
    };
    let n = encode(&Msg::DeviceStats(figures), &mut buf);
    let known = HEADER + NAME + 8;
    // A flag that is neither 0 nor 1.
    buf[known] = 2;
    assert!(matches!(
        decode(&buf[..n]),
        Err(ProtoError::Field {
            field: "counters",
            value: 2,
            ..
        })
    ));
    // Absent, with a counter word that is not zero: refused (it would not encode back).
    buf[known] = 0;
    buf[known + 8 + 3] = 1;
    assert!(matches!(
        decode(&buf[..n]),
        Err(ProtoError::Field {
            field: "counters",
            value: 0,
            ..
        })
    ));
    // Present: any counts.
    buf[known] = 1;
    let Ok(Msg::DeviceStats(d)) = decode(&buf[..n]) else {
        panic!("device figures")
    };
    assert_eq!(d.counters.unwrap().copy.busy_ns, 1 << 24);
    // The device's name is checked as every name.
    buf[HEADER + 5] = b'x';
    assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
}

#[test]
fn another_version_is_refused_with_both_numbers() {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = encode(&Msg::Stats, &mut buf);
    buf[4] = 1;
    let e = decode(&buf[..n]).unwrap_err();
    assert_eq!(e, ProtoError::Version { found: 1 });
    assert!(
        e.to_string().contains("version 1, this build speaks 2"),
        "{e}"
    );
}

#[test]
fn hostile_fields_are_refused() {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = encode(&Msg::Close { stream: 1 }, &mut buf);
    buf[HEADER + 4] = 1; // stream above u32
    assert!(matches!(decode(&buf[..n]), Err(ProtoError::Field { .. })));
    let n = encode(
        &Msg::Hello {
            pool_bytes: 1,
            name: Name::new("a").unwrap(),
        },
        &mut buf,
    );
    buf[HEADER + 8 + 2] = b'x'; // text after the padding
    assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
    buf[HEADER + 8] = 0xFF; // not UTF-8
    buf[HEADER + 8 + 2] = 0;
    assert!(matches!(decode(&buf[..n]), Err(ProtoError::Name { .. })));
    buf[6] = 99;
    assert_eq!(decode(&buf[..n]), Err(ProtoError::Kind { kind: 99 }));
    buf[0] = 0;
    assert!(matches!(decode(&buf[..n]), Err(ProtoError::Magic { .. })));
    assert!(matches!(decode(&[1, 2]), Err(ProtoError::Short { len: 2 })));
    assert!(Name::new(&"x".repeat(33)).is_err());
    // An error text cut mid-character still encodes and decodes.
    let long = "é".repeat(200);
    let n = encode(
        &Msg::Error {
            code: 1,
            fatal: false,
            text: long,
        },
        &mut buf,
    );
    assert!(matches!(decode(&buf[..n]), Ok(Msg::Error { .. })));
    // Bytes that are not UTF-8 decode to replacement characters cut to what the wire
    // holds: the message encodes back to itself.
    buf[HEADER + 8..HEADER + 8 + TEXT].fill(0xFF);
    let Ok(m @ Msg::Error { .. }) = decode(&buf[..n]) else {
        panic!("an error message")
    };
    let mut again = [0u8; MAX_MESSAGE];
    let k = encode(&m, &mut again);
    assert_eq!(decode(&again[..k]).unwrap(), m);
}
