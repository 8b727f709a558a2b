use std::sync::Arc;

use super::*;
use crate::regs::Opcode;
use userdma::dma;
use userdma::memory::Region;

fn cmd(opcode: Opcode, src: u64, dst: u64, len: u64) -> Command {
    Command {
        opcode: opcode as u8,
        src,
        dst,
        len,
        ..Command::default()
    }
}

#[test]
fn fields_are_checked_in_order() {
    let size = 0x1000;
    let bad_op = Command {
        opcode: 99,
        flags: 1,
        ..Command::default()
    };
    assert_eq!(check(&bad_op, 0, size), Err((StatusCode::BadOpcode, 0)));
    let mut c = cmd(Opcode::ToDevice, 0, 0, 8);
    c.flags = 1;
    c.context = 5;
    assert_eq!(check(&c, 0, size), Err((StatusCode::BadFlags, 0)));
    c.flags = 0;
    assert_eq!(check(&c, 0, size), Err((StatusCode::BadContext, 0)));
    assert!(check(&c, 5, size).is_ok());
    c.args[3] = 1;
    assert_eq!(check(&c, 5, size), Err((StatusCode::BadArgs, 0)));
    assert_eq!(
        check(&cmd(Opcode::ToDevice, 0, 0, 0), 0, size),
        Err((StatusCode::BadLength, 0))
    );
    assert_eq!(
        check(&cmd(Opcode::Nop, 0, 0, 1), 0, size),
        Err((StatusCode::BadLength, 0))
    );
    assert_eq!(
        check(&cmd(Opcode::Nop, 4, 0, 0), 0, size),
        Err((StatusCode::BadArgs, 0))
    );
    assert_eq!(check(&cmd(Opcode::Nop, 0, 0, 0), 0, size), Ok(Plan::Nop));
    assert_eq!(
        check(&cmd(Opcode::ToHost, u64::MAX - 3, 0, 8), 0, size),
        Err((StatusCode::AddressOverflow, u64::MAX - 3))
    );
    assert_eq!(
        check(&cmd(Opcode::ToHost, 0, u64::MAX, 8), 0, size),
        Err((StatusCode::AddressOverflow, u64::MAX))
    );
    assert_eq!(
        check(&cmd(Opcode::Compute, 2, 0, 8), 0, size),
        Err((StatusCode::Misaligned, 0))
    );
    assert_eq!(
        check(&cmd(Opcode::ToDevice, 0, 0xff9, 8), 0, size),
        Err((StatusCode::DeviceOutOfBounds, 0xff9))
    );
    assert_eq!(
        check(&cmd(Opcode::ToDevice, 0, 0xff8, 8), 0, size),
        Ok(Plan::ToDevice {
            iova: 0,
            dst: 0xff8,
            len: 8
        })
    );
    assert_eq!(
        check(&cmd(Opcode::DeviceCopy, 0x1000, 0, 1), 0, size),
        Err((StatusCode::DeviceOutOfBounds, 0x1000))
    );
}

#[test]
fn wait_fields() {
    let size = 0x1000;
    let mut w = cmd(Opcode::Wait, 0, 0, 0);
    w.args = [3, 9, 0, 0];
    assert_eq!(
        check(&w, 0, size),
        Ok(Plan::Wait {
            queue: 3,
            target: 9
        })
    );
    w.args[3] = 1;
    assert_eq!(check(&w, 0, size), Err((StatusCode::BadArgs, 0)));
    w.args[3] = 0;
    w.src = 4;
    assert_eq!(check(&w, 0, size), Err((StatusCode::BadArgs, 0)));
    w.src = 0;
    w.len = 4;
    assert_eq!(check(&w, 0, size), Err((StatusCode::BadLength, 0)));
}

#[test]
fn fill_and_compute_arguments() {
    let size = 0x100;
    let mut fill = cmd(Opcode::Fill, 0, 0x10, 4);
    fill.args[0] = 0x100;
    assert_eq!(check(&fill, 0, size), Err((StatusCode::BadArgs, 0)));
    fill.args[0] = 0xab;
    assert_eq!(
        check(&fill, 0, size),
        Ok(Plan::Fill {
            dst: 0x10,
            len: 4,
            byte: 0xab
        })
    );
    fill.src = 4;
    assert_eq!(check(&fill, 0, size), Err((StatusCode::BadArgs, 0)));
    let mut compute = cmd(Opcode::Compute, 0, 0, 8);
    compute.args[1] = 1 << 32;
    assert_eq!(check(&compute, 0, size), Err((StatusCode::BadArgs, 0)));
    compute.args = [u64::from(u32::MAX), 7, 0, 0];
    assert!(check(&compute, 0, size).is_ok());
}

#[test]
fn the_translation_cache_follows_the_table() {
    use userdma::dma::Space;
    use userdma::memory::PageSize;

    let mut backing = vec![0u64; 8];
    let dram = Dram {
        ptr: NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap(),
        len: 64,
    };
    let space = dma::SoftIommu::new(32).unwrap();
    let mut host = Host::new(Arc::new(space.clone()));
    let region = Region::builder(8 << 10)
        .page_size(PageSize::Base)
        .memfd()
        .lock(false)
        .build()
        .unwrap();
    let mapping = space.map(Arc::new(region)).unwrap();
    mapping.slice().fill(0x77);
    let iova = mapping.iova(0x100).unwrap();
    let copy = cmd(Opcode::ToDevice, iova.raw(), 0, 16);
    assert_eq!(execute(&copy, 0, dram, &mut host).code, StatusCode::Success);
    // A hit in the cached piece; and a range running past it is still refused.
    let tail = cmd(
        Opcode::ToDevice,
        mapping.iova((8 << 10) - 8).unwrap().raw(),
        16,
        8,
    );
    assert_eq!(execute(&tail, 0, dram, &mut host).code, StatusCode::Success);
    let across = cmd(
        Opcode::ToDevice,
        mapping.iova((8 << 10) - 8).unwrap().raw(),
        16,
        9,
    );
    assert_eq!(
        execute(&across, 0, dram, &mut host).code,
        StatusCode::HostUnmapped
    );
    drop(mapping);
    // Unmapped since the piece was cached: the device must not reach it any more.
    let out = execute(&copy, 0, dram, &mut host);
    assert_eq!(
        (out.code, out.result),
        (StatusCode::HostUnmapped, iova.raw())
    );
    drop(host);
    let bytes: Vec<u8> = backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(&bytes[..24], &[0x77u8; 24]);
    assert_eq!(&bytes[24..], &[0u8; 40]);
}

#[test]
fn device_memory_operations() {
    let mut backing = vec![0u64; 8];
    let dram = Dram {
        ptr: NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap(),
        len: 64,
    };
    let table = dma::SoftIommu::new(32).unwrap();
    let mut table = Host::new(Arc::new(table));
    let mut fill = cmd(Opcode::Fill, 0, 0, 16);
    fill.args[0] = 0x01;
    assert_eq!(
        execute(&fill, 0, dram, &mut table).code,
        StatusCode::Success
    );
    let mut compute = cmd(Opcode::Compute, 0, 16, 16);
    compute.args = [0xff, 2, 0, 0];
    let out = execute(&compute, 0, dram, &mut table);
    let word = reference::transform(0x0101_0101, 0xff, 2);
    assert_eq!(out.result, 4 * u64::from(word));
    assert_eq!(out.compute_bytes, 16);
    let copy = cmd(Opcode::DeviceCopy, 16, 20, 16);
    assert_eq!(execute(&copy, 0, dram, &mut table).dma_bytes, 32);
    let unmapped = cmd(Opcode::ToDevice, 0x10_0000, 0, 8);
    let out = execute(&unmapped, 0, dram, &mut table);
    assert_eq!(
        (out.code, out.result),
        (StatusCode::HostUnmapped, 0x10_0000)
    );
    drop(table);
    let bytes: Vec<u8> = backing.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(&bytes[..16], &[1u8; 16]);
    assert_eq!(&bytes[16..20], &word.to_le_bytes());
    for chunk in bytes[20..36].chunks(4) {
        assert_eq!(chunk, &word.to_le_bytes());
    }
    assert_eq!(&bytes[36..], &[0u8; 28]);
}

/// A Layer command: `inputs` as `(offset, len)` (up to 3), the output at `dst`.
fn layer(inputs: &[(u64, u64)], dst: u64, len: u64, seed: u32) -> Command {
    let mut all = [(0, 0); 3];
    all[..inputs.len()].copy_from_slice(inputs);
    let mut c = cmd(Opcode::Layer, all[0].0, dst, len);
    c.args = [
        all[1].0,
        all[2].0,
        all[0].1 | all[1].1 << 32,
        all[2].1 | u64::from(seed) << 32,
    ];
    c
}

fn compact(src: u64, len: u64, args: [u64; 4], dst: u64) -> Command {
    Command {
        args,
        ..cmd(Opcode::Compact, src, dst, len)
    }
}

/// Runs `c` on `dram` (its bytes as the device memory) and returns the outcome.
fn run_on(dram: &mut [u8], c: &Command) -> Outcome {
    let memory = Dram {
        ptr: NonNull::new(dram.as_mut_ptr()).unwrap(),
        len: dram.len(),
    };
    let mut host = Host::new(Arc::new(dma::SoftIommu::new(32).unwrap()));
    execute(c, 0, memory, &mut host)
}

fn words(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn layer_writes_the_reference_and_charges_reads_and_writes() {
    let mut dram = vec![0u8; 256];
    dram[..16].copy_from_slice(&words(&[1, 2, 3, 4]));
    dram[16..20].copy_from_slice(&words(&[0xdead_beef]));
    dram[32..40].copy_from_slice(&words(&[10, 20]));
    // Known answer, by hand: word j of a one-input layer, seed 0.
    let out = run_on(&mut dram, &layer(&[(0, 16)], 64, 8, 0));
    assert_eq!(out.code, StatusCode::Success);
    let by_hand = |j: u32, w: u32| {
        (j.wrapping_mul(0x9e37_79b9) ^ w)
            .wrapping_mul(0x85eb_ca6b)
            .rotate_left(13)
    };
    assert_eq!(&dram[64..72], &words(&[by_hand(0, 1), by_hand(1, 2)])[..]);
    assert_eq!(
        out.result,
        u64::from(by_hand(0, 1)) + u64::from(by_hand(1, 2))
    );
    assert_eq!((out.bytes, out.compute_bytes, out.dma_bytes), (8, 8 + 8, 0));
    // Three inputs, two of them repeating, input 1 absent and input 2 present.
    let c = layer(&[(0, 16), (0, 0), (32, 8)], 128, 32, 99);
    assert_eq!(run_on(&mut dram, &c).code, StatusCode::Success);
    let c = layer(&[(0, 16), (16, 4), (32, 8)], 96, 32, 7);
    let out = run_on(&mut dram, &c);
    let mut expect = [0u8; 32];
    let sum =
        reference::layer(7, &[&dram[..16], &dram[16..20], &dram[32..40]], &mut expect).unwrap();
    assert_eq!((out.code, out.result), (StatusCode::Success, sum));
    assert_eq!(&dram[96..128], &expect);
    assert_eq!(out.compute_bytes, 16 + 4 + 8 + 32);
    let mut absent = [0u8; 32];
    reference::layer(99, &[&dram[..16], &dram[32..40]], &mut absent).unwrap();
    assert_eq!(&dram[128..160], &absent);
    assert_eq!(&dram[160..], &[0u8; 96]);
}

#[test]
fn layer_checks_every_field_and_touches_nothing_on_failure() {
    let size = 0x1000;
    let good = layer(&[(0, 16), (16, 8)], 64, 16, 1);
    assert!(check(&good, 0, size).is_ok());
    let with = |f: &dyn Fn(&mut Command)| {
        let mut c = good;
        f(&mut c);
        check(&c, 0, size)
    };
    // An absent input names no memory; input 0 must be present.
    assert_eq!(with(&|c| c.args[1] = 32), Err((StatusCode::BadArgs, 0)));
    assert_eq!(
        with(&|c| {
            c.src = 4;
            c.args[2] = 8 << 32;
        }),
        Err((StatusCode::BadArgs, 0)),
        "input 0 absent but its offset set"
    );
    assert_eq!(
        with(&|c| {
            c.src = 0;
            c.args[2] &= !0xffff_ffff;
        }),
        Err((StatusCode::BadLength, 0))
    );
    assert_eq!(with(&|c| c.len = 0), Err((StatusCode::BadLength, 0)));
    // Overflow of an input range, then of the output range.
    assert_eq!(
        with(&|c| c.args[0] = u64::MAX - 3),
        Err((StatusCode::AddressOverflow, u64::MAX - 3))
    );
    assert_eq!(
        with(&|c| c.dst = u64::MAX - 7),
        Err((StatusCode::AddressOverflow, u64::MAX - 7))
    );
    // Every offset and length.
    for f in [
        &|c: &mut Command| c.src = 2,
        &|c: &mut Command| c.dst = 66,
        &|c: &mut Command| c.len = 14,
        &|c: &mut Command| c.args[0] = 17,
        &|c: &mut Command| c.args[2] = 15 | 8 << 32,
        &|c: &mut Command| c.args[2] = 16 | 9 << 32,
        &|c: &mut Command| {
            c.args[1] = 128;
            c.args[3] = 6;
        },
    ] as [&dyn Fn(&mut Command); 7]
    {
        assert_eq!(with(f), Err((StatusCode::Misaligned, 0)));
    }
    // Bounds: each input, then the output.
    assert_eq!(
        with(&|c| c.args[0] = size - 4),
        Err((StatusCode::DeviceOutOfBounds, size - 4))
    );
    assert_eq!(
        with(&|c| {
            c.args[1] = size;
            c.args[3] = 4;
        }),
        Err((StatusCode::DeviceOutOfBounds, size))
    );
    assert_eq!(
        with(&|c| c.dst = size - 12),
        Err((StatusCode::DeviceOutOfBounds, size - 12))
    );
    // The output may touch an input's end but not overlap it; the first one it overlaps
    // is named.
    assert!(with(&|c| c.dst = 24).is_ok());
    assert_eq!(with(&|c| c.dst = 20), Err((StatusCode::Overlap, 16)));
    assert_eq!(with(&|c| c.dst = 12), Err((StatusCode::Overlap, 0)));
    assert_eq!(
        with(&|c| {
            c.args[1] = 256;
            c.args[3] = 16;
            c.dst = 248;
        }),
        Err((StatusCode::Overlap, 256))
    );
    // A failing layer writes nothing.
    let mut dram: Vec<u8> = (0..=255).collect();
    let before = dram.clone();
    let out = run_on(&mut dram, &layer(&[(0, 16)], 8, 16, 1));
    assert_eq!(
        (out.code, out.result, out.compute_bytes),
        (StatusCode::Overlap, 0, 0)
    );
    assert_eq!(dram, before);
}

#[test]
fn compact_writes_the_reference_and_counts_past_the_capacity() {
    let mut dram = vec![0xeeu8; 256];
    // Four 8-byte records (score, id): scores 3, 8, 1, 9.
    dram[..32].copy_from_slice(&words(&[3, 100, 8, 101, 1, 102, 9, 103]));
    let out = run_on(&mut dram, &compact(0, 32, [8, 0, 3, 4], 64));
    assert_eq!((out.code, out.result), (StatusCode::Success, 3));
    // Known answer: 3 written, 3 found, records 0, 1, 3, then a zeroed slot.
    assert_eq!(
        &dram[64..104],
        &words(&[3, 3, 3, 100, 8, 101, 9, 103, 0, 0])[..]
    );
    assert_eq!(&dram[104..], &[0xeeu8; 152]);
    assert_eq!((out.bytes, out.compute_bytes), (32, 32 + 40));
    // Capacity 1: only the first survivor, the total still 3.
    let out = run_on(&mut dram, &compact(0, 32, [8, 0, 3, 1], 128));
    assert_eq!((out.code, out.result), (StatusCode::Success, 3));
    assert_eq!(&dram[128..144], &words(&[1, 3, 3, 100])[..]);
    // The score at byte 4 (the id): ids 102 and 103 pass 102.
    let out = run_on(&mut dram, &compact(0, 32, [8, 4, 102, 2], 160));
    assert_eq!(out.result, 2);
    let mut expect = [0u8; 24];
    let params = Compact {
        record: 8,
        score_at: 4,
        threshold: 102,
        capacity: 2,
    };
    assert_eq!(reference::compact(&dram[..32], params, &mut expect), Ok(2));
    assert_eq!(&dram[160..184], &expect);
    // Capacity 0 only counts.
    let out = run_on(&mut dram, &compact(0, 32, [8, 0, 0, 0], 200));
    assert_eq!((out.code, out.result), (StatusCode::Success, 4));
    assert_eq!(&dram[200..208], &words(&[0, 4])[..]);
    assert_eq!(&dram[208..], &[0xeeu8; 48]);
}

#[test]
fn compact_checks_every_field_and_touches_nothing_on_failure() {
    let size = 0x1000;
    let good = compact(0, 64, [16, 4, 10, 2], 0x100);
    assert!(check(&good, 0, size).is_ok());
    let with = |f: &dyn Fn(&mut Command)| {
        let mut c = good;
        f(&mut c);
        check(&c, 0, size)
    };
    for f in [
        &|c: &mut Command| c.args[0] = 0,
        &|c: &mut Command| c.args[0] = 4100,
        &|c: &mut Command| c.args[1] = 16,
        &|c: &mut Command| c.args[1] = 13,
        &|c: &mut Command| c.args[2] = 1 << 32,
        &|c: &mut Command| c.args[3] = 1 << 32,
    ] as [&dyn Fn(&mut Command); 6]
    {
        assert_eq!(with(f), Err((StatusCode::BadArgs, 0)));
    }
    assert_eq!(with(&|c| c.len = 0), Err((StatusCode::BadLength, 0)));
    assert_eq!(with(&|c| c.len = 40), Err((StatusCode::BadLength, 0)));
    assert_eq!(
        with(&|c| c.src = u64::MAX - 60),
        Err((StatusCode::AddressOverflow, u64::MAX - 60))
    );
    // The output is 8 + 2 * 16 = 40 bytes.
    assert_eq!(
        with(&|c| c.dst = u64::MAX - 36),
        Err((StatusCode::AddressOverflow, u64::MAX - 36))
    );
    for f in [
        &|c: &mut Command| c.src = 2,
        &|c: &mut Command| c.dst = 0x101,
        &|c: &mut Command| {
            c.args[0] = 18;
            c.len = 72;
        },
        &|c: &mut Command| c.args[1] = 2,
    ] as [&dyn Fn(&mut Command); 4]
    {
        assert_eq!(with(f), Err((StatusCode::Misaligned, 0)));
    }
    assert_eq!(
        with(&|c| c.src = size - 32),
        Err((StatusCode::DeviceOutOfBounds, size - 32))
    );
    assert!(with(&|c| c.dst = size - 40).is_ok());
    assert_eq!(
        with(&|c| c.dst = size - 36),
        Err((StatusCode::DeviceOutOfBounds, size - 36))
    );
    assert!(with(&|c| c.dst = 64).is_ok());
    assert_eq!(with(&|c| c.dst = 60), Err((StatusCode::Overlap, 0)));
    assert_eq!(
        with(&|c| {
            c.src = 0x110;
            c.dst = 0xec;
        }),
        Err((StatusCode::Overlap, 0x110))
    );
    let mut dram: Vec<u8> = (0..=255).collect();
    let before = dram.clone();
    let out = run_on(&mut dram, &compact(0, 64, [16, 4, 0, 2], 32));
    assert_eq!((out.code, out.result), (StatusCode::Overlap, 0));
    assert_eq!(dram, before);
}
