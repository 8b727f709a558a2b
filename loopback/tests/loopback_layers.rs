//! A small model on the loopback device, layer by layer: an input copied in, three `Layer`
//! descriptors at hand-picked device offsets, a `Compact` of the last layer's records, and the
//! compacted result copied back, checked against the host reference (`loopback::reference`)
//! tensor by tensor. And the reason the ops exist: a wrong placement (a layer writing over a
//! tensor a later layer still reads) completes without an error but gives output different
//! from the reference.

use std::sync::Arc;

use userdma::dma::{DeviceOffset, Mapping};
use userdma::ring;
use userdma_loopback::reference::{self, Compact};
use userdma_loopback::{Descriptor, Loopback, LoopbackStatus, StatusCode, Wait};

mod loopback_common;

use loopback_common::{device_bytes, pattern, run, MEMORY};

/// The model's tensors, in bytes: input `x`, `a = L1(x)`, `b = L2(a)` (half as long, so it
/// repeats in layer 3), `c = L3(b, x, a)` read as 64 records of 64 bytes.
const X: usize = 4096;
const A: usize = 4096;
const B: usize = 2048;
const C: usize = 4096;
const SEEDS: [u32; 3] = [0x1111_0001, 0x2222_0002, 0x3333_0003];
const RECORD: u32 = 64;
const COMPACT: Compact = Compact {
    record: RECORD,
    score_at: 12,
    threshold: 0x4000_0000,
    capacity: 16,
};

/// Where each tensor lives in device memory: a plan.
#[derive(Clone, Copy, Debug)]
struct Placement {
    x: u64,
    a: u64,
    b: u64,
    c: u64,
    out: u64,
}

/// A correct plan: no two tensors that are live at once share a byte.
const GOOD: Placement = Placement {
    x: 0x0000,
    a: 0x2000,
    b: 0x4000,
    c: 0x6000,
    out: 0x8000,
};

/// The model on the host: each tensor and each descriptor's expected result.
struct Expected {
    a: Vec<u8>,
    b: Vec<u8>,
    c: Vec<u8>,
    out: Vec<u8>,
    results: [u64; 4],
}

fn reference_model(x: &[u8]) -> Expected {
    let mut a = vec![0; A];
    let mut b = vec![0; B];
    let mut c = vec![0; C];
    let mut out = vec![0; COMPACT.output_len() as usize];
    let results = [
        reference::layer(SEEDS[0], &[x], &mut a).unwrap(),
        reference::layer(SEEDS[1], &[&a], &mut b).unwrap(),
        reference::layer(SEEDS[2], &[&b, x, &a], &mut c).unwrap(),
        reference::compact(&c, COMPACT, &mut out).unwrap(),
    ];
    Expected {
        a,
        b,
        c,
        out,
        results,
    }
}

/// What the device computed with the tensors at `at`: the host bytes of the compacted output,
/// after checking every descriptor succeeded.
fn run_model(
    device: &Arc<Loopback>,
    host: &Mapping,
    x: &[u8],
    at: Placement,
) -> (Vec<u8>, [u64; 4]) {
    let mut queue = device
        .open_queue::<()>(ring::Config::new(16), Wait::Interrupt)
        .unwrap();
    host.slice().write_from(0, x).unwrap();
    let out_len = COMPACT.output_len();
    let back = 0x2000;
    let d = DeviceOffset;
    let layer = |inputs: &[(u64, usize)], out: u64, len: usize, seed: u32| {
        let inputs: Vec<_> = inputs.iter().map(|&(o, l)| (d(o), l as u64)).collect();
        Descriptor::layer(&inputs, d(out), len as u64, seed)
            .expect("1 to 3 inputs")
            .build()
    };
    let steps = [
        Descriptor::to_device(host.iova(0).unwrap(), d(at.x), X as u64).build(),
        layer(&[(at.x, X)], at.a, A, SEEDS[0]),
        layer(&[(at.a, A)], at.b, B, SEEDS[1]),
        layer(&[(at.b, B), (at.x, X), (at.a, A)], at.c, C, SEEDS[2]),
        Descriptor::compact(
            d(at.c),
            C as u64,
            COMPACT.record,
            COMPACT.score_at,
            COMPACT.threshold,
            d(at.out),
            COMPACT.capacity,
        )
        .build(),
        Descriptor::to_host(d(at.out), host.iova(back).unwrap(), out_len).build(),
    ];
    let mut results = [0; 6];
    for (step, result) in steps.into_iter().zip(&mut results) {
        let status = run(&mut queue, step);
        assert_eq!(status.loopback_code(), Ok(StatusCode::Success), "{step:?}");
        *result = status.result;
    }
    assert_eq!(results[0], X as u64);
    assert_eq!(results[5], out_len);
    let mut out = vec![0; out_len as usize];
    host.slice().read_into(back, &mut out).unwrap();
    (out, [results[1], results[2], results[3], results[4]])
}

#[test]
fn a_three_layer_model_matches_the_host_reference() {
    let device = loopback_common::device(4);
    let host = loopback_common::host_memory(&device, 16 << 10);
    let x = pattern(X, 7);
    let expected = reference_model(&x);
    let (out, results) = run_model(&device, &host, &x, GOOD);

    // Every intermediate tensor, then the result the host got back.
    // (`assert!` on the byte vectors: a diff of 4 KiB tells nothing.)
    assert!(
        device_bytes(&device, GOOD.a, A) == expected.a,
        "layer 1's output"
    );
    assert!(
        device_bytes(&device, GOOD.b, B) == expected.b,
        "layer 2's output"
    );
    assert!(
        device_bytes(&device, GOOD.c, C) == expected.c,
        "layer 3's output"
    );
    assert_eq!(results, expected.results);
    assert!(out == expected.out, "the compacted output");

    // The compact overflowed its capacity: more survivors than room, the first 16 kept.
    let word = |i: usize| u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap());
    let found = expected.results[3];
    assert!(found > u64::from(COMPACT.capacity), "{found} survivors");
    assert!(found < (C / RECORD as usize) as u64, "{found} survivors");
    assert_eq!((word(0), u64::from(word(1))), (COMPACT.capacity, found));
    // Each record kept is one of `c`'s, in order, with a passing score.
    let records: Vec<&[u8]> = expected.c.chunks(RECORD as usize).collect();
    let mut from = 0;
    for kept in out[8..].chunks(RECORD as usize) {
        let at = from + records[from..].iter().position(|r| *r == kept).unwrap();
        let score = u32::from_le_bytes(kept[12..16].try_into().unwrap());
        assert!(score >= COMPACT.threshold);
        from = at + 1;
    }
    // Nothing else in device memory was written: past the output, still zero.
    let end = GOOD.out + COMPACT.output_len();
    assert!(device_bytes(&device, end, MEMORY - end as usize)
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn a_wrong_placement_shows_as_wrong_output() {
    let device = loopback_common::device(4);
    let host = loopback_common::host_memory(&device, 16 << 10);
    let x = pattern(X, 7);
    let expected = reference_model(&x);
    // Layer 2 writes `b` over the start of `x`, which layer 3 still reads: a planner that
    // ended `x`'s life after layer 1. No descriptor overlaps its own inputs, so the device
    // runs them all; only the output tells.
    let wrong = Placement { b: GOOD.x, ..GOOD };
    let (out, results) = run_model(&device, &host, &x, wrong);
    assert_eq!(
        results[..2],
        expected.results[..2],
        "layers 1 and 2 are right"
    );
    assert!(
        device_bytes(&device, wrong.b, B) == expected.b,
        "layer 2's output"
    );
    assert_ne!(results[2], expected.results[2]);
    assert!(
        device_bytes(&device, wrong.c, C) != expected.c,
        "layer 3's output"
    );
    assert!(out != expected.out, "the compacted output");

    // The same wrong plan for layer 3's own inputs is refused: its output over `a`.
    let mut queue = device
        .open_queue::<()>(ring::Config::new(4), Wait::Interrupt)
        .unwrap();
    let over = Descriptor::layer(
        &[
            (DeviceOffset(GOOD.b), B as u64),
            (DeviceOffset(GOOD.a), A as u64),
        ],
        DeviceOffset(GOOD.a + 4),
        4,
        1,
    )
    .unwrap()
    .build();
    let status = run(&mut queue, over);
    assert_eq!(
        (status.loopback_code(), status.result),
        (Ok(StatusCode::Overlap), GOOD.a)
    );
}
