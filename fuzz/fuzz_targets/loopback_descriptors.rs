//! Arbitrary descriptors fed to the loopback device's engine, against a model: every
//! descriptor completes (no panic, no hang) with the status code and result the model predicts
//! from the documented checks, and after each one the host memory mapped for the device, the
//! device memory, and a guard region the device never had mapped hold exactly what the model
//! says — so a bad descriptor changed nothing, and a good one changed only its destination.
//!
//! One device (zero-cost model, engine thread) is kept for the whole run; each input is a
//! sequence of descriptors, some built from fields aimed at the interesting addresses (inside,
//! across and past the mapping, an unmapped IOVA, device-memory bounds), some raw bytes, and
//! remaps of the host memory between them (the device must stop reaching the old IOVAs at
//! once, whatever it cached). `Layer` and `Compact` descriptors are also built from tensor
//! and record fields, mostly valid, each skewed on demand (misaligned, absent input with an
//! offset, overlapping, out of bounds, overflowing); the model checks their fields on its own
//! and takes a success's output from `loopback::reference`, so the device memory must hold
//! exactly what the reference computes. `Wait` descriptors name the device's second queue,
//! whose completed counter stands at `OTHER_COMPLETED` (their targets are kept at or below
//! it, so none blocks forever), or a bad queue.

#![no_main]

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use userdma::device::Device;
use userdma::dma::{DeviceOffset, Mapping};
use userdma::memory::{PageSize, Region};
use userdma::ring::{self, Command, Queue, Status};
use userdma_loopback::reference::{self, Compact};
use userdma_loopback::{Config, Cost, Descriptor, Loopback, Opcode, StatusCode, Unit, Wait};

const HOST: usize = 16 << 10;
const DRAM: usize = 64 << 10;
const CONTEXT: u32 = 5;
/// Descriptors the second queue (1) completed at set-up: what a `Wait` on it sees.
const OTHER_COMPLETED: u64 = 3;
/// Raw opcodes drawn: every opcode (up to `Wait`, 8) and two that are not defined.
const OPCODES: u8 = 11;

#[derive(Debug, Arbitrary)]
enum Addr {
    /// An offset in the mapped host memory (maybe past its end).
    Host(u16),
    /// A device-memory offset (maybe past its end).
    Device(u32),
    /// Inside an IOVA range that was mapped and is not any more.
    Gone(u16),
    /// Anything.
    Raw(u64),
}

#[derive(Debug, Arbitrary)]
enum Len {
    Small(u8),
    Medium(u16),
    Raw(u64),
}

/// A device tensor: `4 * at` bytes in (maybe past the device memory's end), `4 * (len + 1)`
/// bytes long.
#[derive(Debug, Arbitrary, Clone, Copy)]
struct Tensor {
    at: u16,
    len: u8,
}

impl Tensor {
    fn offset(self) -> u64 {
        4 * u64::from(self.at)
    }
    fn len(self) -> u64 {
        4 * (u64::from(self.len) + 1)
    }
}

#[derive(Debug, Arbitrary)]
enum Desc {
    Fields {
        opcode: u8,
        flags: u8,
        other_context: bool,
        src: Addr,
        dst: Addr,
        len: Len,
        args: [u64; 4],
        /// Which args words to keep (bit i: keep `args[i]`, else 0).
        keep_args: u8,
    },
    Raw([u8; 64]),
    /// A `Layer`: input `k` present if bit `k` of `present` (input 0 always, unless `skew`
    /// bit 7 drops it); `skew` bits make one field wrong.
    Layer {
        inputs: [Tensor; 3],
        present: u8,
        out: Tensor,
        seed: u32,
        skew: u8,
    },
    /// A `Compact` of `records + 1` records of `4 * (words % 32 + 1)` bytes, the score at word
    /// `score % words`; `skew` bits make one field wrong.
    Compact {
        src: u16,
        records: u8,
        words: u8,
        score: u8,
        threshold: u32,
        dst: u16,
        capacity: u8,
        skew: u8,
    },
    /// Not a descriptor: the host memory moves to a new mapping (same bytes, new IOVAs) and
    /// the old one is unmapped, so the device's cached translation of it must go.
    Remap,
}

struct Fixture {
    device: Arc<Loopback>,
    queue: Queue<Command, Status, ()>,
    /// Queue 1, on the compute unit, idle after `OTHER_COMPLETED` Nops.
    _other: Queue<Command, Status, ()>,
    host: Mapping,
    /// Host memory never mapped into the device's space.
    guard: Region,
    gone: u64,
    /// The first and last IOVA of the ring memory's mapping.
    ring: (u64, u64),
    model_host: Vec<u8>,
    model_dram: Vec<u8>,
}

fn region(len: usize) -> Region {
    Region::builder(len)
        .page_size(PageSize::Base)
        .memfd()
        .lock(false)
        .build()
        .expect("region")
}

fn fixture() -> &'static Mutex<Fixture> {
    static FIXTURE: OnceLock<Mutex<Fixture>> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let config = Config::default()
            .cost(Cost::zero())
            .queues(2)
            .memory_size(DRAM)
            .idle_spin(Duration::from_micros(200));
        let device = Arc::new(Loopback::new(config).expect("device"));
        let queue = device
            .open_queue(ring::Config::new(64).with_context(CONTEXT), Wait::Poll)
            .expect("queue");
        let mut other = device
            .open_queue_on(ring::Config::new(16).with_id(1), Wait::Poll, Unit::Compute)
            .expect("queue 1");
        for _ in 0..OTHER_COMPLETED {
            other
                .submit(userdma_loopback::Descriptor::nop().build(), ())
                .expect("submitted");
            let done = other.wait(Some(Duration::from_secs(10))).expect("done");
            assert_eq!(done.entry.code(), StatusCode::Success as u16);
        }
        // The ring memory is mapped in whole base pages, and the device may reach all of the
        // mapping, the padding past the ring included: that is the range to keep clear of.
        // Both queues' rings (queue 1's is mapped after queue 0's) are kept clear of.
        let last = |memory: &ring::Memory| {
            memory.iova().raw() + (memory.len() as u64).next_multiple_of(4096) - 1
        };
        let ring_start = queue.memory().iova().raw().min(other.memory().iova().raw());
        let ring = (ring_start, last(queue.memory()).max(last(other.memory())));
        let space = device.dma_space();
        let host = space.map(Arc::new(region(HOST))).expect("mapped");
        let gone = {
            let mapping = space.map(Arc::new(region(8192))).expect("mapped");
            mapping.iova(0).expect("iova").raw()
        };
        let guard = region(4096);
        let model_host: Vec<u8> = (0..HOST).map(|i| (i * 31 + 7) as u8).collect();
        host.slice().write_from(0, &model_host).unwrap();
        let model_dram: Vec<u8> = (0..DRAM).map(|i| (i * 17 + 3) as u8).collect();
        device.device_memory().write_from(0, &model_dram).unwrap();
        userdma::dma::Slice::from_region(&guard).fill(0x5a);
        Mutex::new(Fixture {
            device,
            queue,
            _other: other,
            host,
            guard,
            gone,
            ring,
            model_host,
            model_dram,
        })
    })
}

impl Fixture {
    fn addr(&self, addr: &Addr) -> u64 {
        let host = self.host.iova(0).unwrap().raw();
        match *addr {
            Addr::Host(offset) => host + u64::from(offset),
            Addr::Device(offset) => u64::from(offset),
            Addr::Gone(offset) => self.gone + u64::from(offset) % 8192,
            Addr::Raw(raw) => raw,
        }
    }

    /// Never lets a host address aim at a queue's ring: the model does not describe a device
    /// that overwrites a ring. The rings are the lowest mappings, so every host address up to
    /// their end moves to the unmapped range.
    fn avoid_ring(&self, mut command: Command) -> Command {
        if command.opcode == Opcode::ToDevice as u8 && command.src <= self.ring.1 {
            command.src = self.gone;
        }
        if command.opcode == Opcode::ToHost as u8 && command.dst <= self.ring.1 {
            command.dst = self.gone;
        }
        // A Wait on queue 1 for more than it completed would never end: keep it reachable.
        if command.opcode == Opcode::Wait as u8
            && command.args[0] == 1
            && command.args[1] > OTHER_COMPLETED
        {
            command.args[1] %= OTHER_COMPLETED + 1;
        }
        command
    }

    /// Maps the host memory anew (a copy of the model) and unmaps the old mapping, whose IOVAs
    /// become the unmapped range.
    fn remap(&mut self) {
        let fresh = self
            .device
            .dma_space()
            .map(Arc::new(region(HOST)))
            .expect("mapped");
        fresh.slice().write_from(0, &self.model_host).unwrap();
        let old = std::mem::replace(&mut self.host, fresh);
        self.gone = old.iova(0).unwrap().raw();
        old.unmap().expect("unmapped");
    }

    fn command(&self, desc: &Desc) -> Command {
        let command = match desc {
            Desc::Remap => unreachable!("not a descriptor"),
            Desc::Fields {
                opcode,
                flags,
                other_context,
                src,
                dst,
                len,
                args,
                keep_args,
            } => {
                let mut kept = [0u64; 4];
                for (i, arg) in args.iter().enumerate() {
                    if keep_args & (1 << i) != 0 {
                        kept[i] = *arg;
                    }
                }
                Command {
                    opcode: opcode % OPCODES,
                    flags: if flags % 8 == 0 { *flags } else { 0 },
                    command_id: 0,
                    context: if *other_context { CONTEXT + 1 } else { CONTEXT },
                    src: self.addr(src),
                    dst: self.addr(dst),
                    len: match *len {
                        Len::Small(n) => u64::from(n),
                        Len::Medium(n) => u64::from(n),
                        Len::Raw(n) => n,
                    },
                    args: kept,
                }
            }
            Desc::Raw(bytes) => {
                let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
                let mut command = Command {
                    opcode: bytes[0] % OPCODES,
                    flags: bytes[1],
                    command_id: 0,
                    context: u32::from_le_bytes(bytes[4..8].try_into().unwrap()),
                    src: word(8),
                    dst: word(16),
                    len: word(24),
                    args: [word(32), word(40), word(48), word(56)],
                };
                command.context = if command.context % 4 == 0 {
                    CONTEXT
                } else {
                    command.context
                };
                command
            }
            Desc::Layer {
                inputs,
                present,
                out,
                seed,
                skew,
            } => layer_command(inputs, *present, *out, *seed, *skew),
            Desc::Compact {
                src,
                records,
                words,
                score,
                threshold,
                dst,
                capacity,
                skew,
            } => {
                let words = u32::from(*words % 32) + 1;
                let mut record = 4 * words;
                let mut score_at = 4 * (u32::from(*score) % words);
                let mut len = u64::from(record) * (u64::from(*records) + 1);
                let mut src = 4 * u64::from(*src);
                let mut dst = 4 * u64::from(*dst);
                match skew % 16 {
                    1 => record += 2,
                    2 => record = 4100,
                    3 => score_at = record,
                    4 => score_at += 2,
                    5 => len += 4,
                    6 => src += 1,
                    7 => dst = src + len / 2,
                    8 => dst = u64::MAX - 16,
                    9 => dst = DRAM as u64 - 8,
                    10 => len = 0,
                    _ => {}
                }
                if skew & 0x80 != 0 {
                    // The output right after the input: adjacent, not overlapping.
                    dst = src + len;
                }
                let mut command = Descriptor::compact(
                    DeviceOffset(src),
                    len,
                    record,
                    score_at,
                    *threshold,
                    DeviceOffset(dst),
                    u32::from(*capacity % 32),
                )
                .context(CONTEXT)
                .build();
                if skew & 0x70 == 0x70 {
                    command.args[3] = 1 << 32;
                }
                command
            }
        };
        self.avoid_ring(command)
    }

    /// The host offset of `len` bytes at `iova`, if all inside the mapped host memory.
    fn host_range(&self, iova: u64, len: u64) -> Option<usize> {
        let start = self.host.iova(0).unwrap().raw();
        let offset = iova.checked_sub(start)?;
        let end = offset.checked_add(len)?;
        (end <= HOST as u64).then_some(offset as usize)
    }

    /// The model: the documented checks in order, then the effect on the shadow memories.
    fn predict(&mut self, c: &Command) -> (StatusCode, u64) {
        let Some(op) = Opcode::from_raw(c.opcode) else {
            return (StatusCode::BadOpcode, 0);
        };
        if c.flags != 0 {
            return (StatusCode::BadFlags, 0);
        }
        if c.context != CONTEXT {
            return (StatusCode::BadContext, 0);
        }
        match op {
            Opcode::Layer => return self.predict_layer(c),
            Opcode::Compact => return self.predict_compact(c),
            _ => {}
        }
        let a = c.args;
        let args_ok = match op {
            Opcode::Fill => a[0] <= 0xff && a[1] == 0 && a[2] == 0 && a[3] == 0,
            Opcode::Compute => a[0] <= 0xffff_ffff && a[1] <= 0xffff_ffff && a[2] == 0 && a[3] == 0,
            Opcode::Wait => a[2] == 0 && a[3] == 0,
            _ => a == [0; 4],
        };
        let unused_ok = match op {
            Opcode::Nop | Opcode::Wait => c.src == 0 && c.dst == 0,
            Opcode::Fill => c.src == 0,
            _ => true,
        };
        if !args_ok || !unused_ok {
            return (StatusCode::BadArgs, 0);
        }
        if op == Opcode::Wait {
            return match (c.len, a[0]) {
                (0, 1) => {
                    assert!(a[1] <= OTHER_COMPLETED, "an unreachable Wait was generated");
                    (StatusCode::Success, OTHER_COMPLETED)
                }
                // Its own queue (0) or no queue.
                (0, _) => (StatusCode::BadArgs, 0),
                _ => (StatusCode::BadLength, 0),
            };
        }
        if op == Opcode::Nop {
            return if c.len == 0 {
                (StatusCode::Success, 0)
            } else {
                (StatusCode::BadLength, 0)
            };
        }
        if c.len == 0 {
            return (StatusCode::BadLength, 0);
        }
        if op != Opcode::Fill && c.src.checked_add(c.len).is_none() {
            return (StatusCode::AddressOverflow, c.src);
        }
        if c.dst.checked_add(c.len).is_none() {
            return (StatusCode::AddressOverflow, c.dst);
        }
        if op == Opcode::Compute && (c.src % 4 != 0 || c.dst % 4 != 0 || c.len % 4 != 0) {
            return (StatusCode::Misaligned, 0);
        }
        let dram = DRAM as u64;
        let in_dram = |offset: u64| offset + c.len <= dram;
        let len = c.len as usize;
        match op {
            Opcode::ToDevice => {
                if !in_dram(c.dst) {
                    return (StatusCode::DeviceOutOfBounds, c.dst);
                }
                let Some(h) = self.host_range(c.src, c.len) else {
                    return (StatusCode::HostUnmapped, c.src);
                };
                let d = c.dst as usize;
                self.model_dram[d..d + len].copy_from_slice(&self.model_host[h..h + len]);
                (StatusCode::Success, c.len)
            }
            Opcode::ToHost => {
                if !in_dram(c.src) {
                    return (StatusCode::DeviceOutOfBounds, c.src);
                }
                let Some(h) = self.host_range(c.dst, c.len) else {
                    return (StatusCode::HostUnmapped, c.dst);
                };
                let s = c.src as usize;
                self.model_host[h..h + len].copy_from_slice(&self.model_dram[s..s + len]);
                (StatusCode::Success, c.len)
            }
            Opcode::DeviceCopy => {
                for offset in [c.src, c.dst] {
                    if !in_dram(offset) {
                        return (StatusCode::DeviceOutOfBounds, offset);
                    }
                }
                let s = c.src as usize;
                self.model_dram.copy_within(s..s + len, c.dst as usize);
                (StatusCode::Success, c.len)
            }
            Opcode::Fill => {
                if !in_dram(c.dst) {
                    return (StatusCode::DeviceOutOfBounds, c.dst);
                }
                let d = c.dst as usize;
                self.model_dram[d..d + len].fill(a[0] as u8);
                (StatusCode::Success, c.len)
            }
            Opcode::Compute => {
                for offset in [c.src, c.dst] {
                    if !in_dram(offset) {
                        return (StatusCode::DeviceOutOfBounds, offset);
                    }
                }
                let (s, d) = (c.src as usize, c.dst as usize);
                let mut sum = 0u64;
                for i in (0..len).step_by(4) {
                    let w =
                        u32::from_le_bytes(self.model_dram[s + i..s + i + 4].try_into().unwrap());
                    let out = (w ^ a[0] as u32).wrapping_add(a[1] as u32);
                    self.model_dram[d + i..d + i + 4].copy_from_slice(&out.to_le_bytes());
                    sum = sum.wrapping_add(u64::from(out));
                }
                (StatusCode::Success, sum)
            }
            Opcode::Nop | Opcode::Wait => unreachable!("handled above"),
            Opcode::Layer | Opcode::Compact => unreachable!("predicted on their own"),
        }
    }

    /// `Layer`'s checks as documented, then the output from the reference.
    fn predict_layer(&mut self, c: &Command) -> (StatusCode, u64) {
        let a = c.args;
        let low = |w: u64| w & 0xffff_ffff;
        let all = [(c.src, low(a[2])), (a[0], a[2] >> 32), (a[1], low(a[3]))];
        let seed = (a[3] >> 32) as u32;
        if all.iter().any(|&(o, l)| l == 0 && o != 0) {
            return (StatusCode::BadArgs, 0);
        }
        if c.len == 0 || all[0].1 == 0 {
            return (StatusCode::BadLength, 0);
        }
        let present: Vec<(u64, u64)> = all.into_iter().filter(|&(_, l)| l != 0).collect();
        let out = (c.dst, c.len);
        for &(o, l) in present.iter().chain([&out]) {
            if o.checked_add(l).is_none() {
                return (StatusCode::AddressOverflow, o);
            }
        }
        if present
            .iter()
            .chain([&out])
            .any(|&(o, l)| o % 4 != 0 || l % 4 != 0)
        {
            return (StatusCode::Misaligned, 0);
        }
        for &(o, l) in present.iter().chain([&out]) {
            if o + l > DRAM as u64 {
                return (StatusCode::DeviceOutOfBounds, o);
            }
        }
        for &(o, l) in &present {
            if c.dst < o + l && o < c.dst + c.len {
                return (StatusCode::Overlap, o);
            }
        }
        let inputs: Vec<&[u8]> = present
            .iter()
            .map(|&(o, l)| &self.model_dram[o as usize..(o + l) as usize])
            .collect();
        let mut written = vec![0; c.len as usize];
        let sum = reference::layer(seed, &inputs, &mut written).expect("valid layer");
        let d = c.dst as usize;
        self.model_dram[d..d + written.len()].copy_from_slice(&written);
        (StatusCode::Success, sum)
    }

    /// `Compact`'s checks as documented, then the output from the reference.
    fn predict_compact(&mut self, c: &Command) -> (StatusCode, u64) {
        let a = c.args;
        if a.iter().any(|&w| w > u64::from(u32::MAX)) {
            return (StatusCode::BadArgs, 0);
        }
        let (record, score_at) = (a[0], a[1]);
        if !(4..=4096).contains(&record) || score_at + 4 > record {
            return (StatusCode::BadArgs, 0);
        }
        if c.len == 0 || c.len % record != 0 {
            return (StatusCode::BadLength, 0);
        }
        let out_len = 8 + a[3] * record;
        if c.src.checked_add(c.len).is_none() {
            return (StatusCode::AddressOverflow, c.src);
        }
        if c.dst.checked_add(out_len).is_none() {
            return (StatusCode::AddressOverflow, c.dst);
        }
        if c.src % 4 != 0 || c.dst % 4 != 0 || record % 4 != 0 || score_at % 4 != 0 {
            return (StatusCode::Misaligned, 0);
        }
        if c.src + c.len > DRAM as u64 {
            return (StatusCode::DeviceOutOfBounds, c.src);
        }
        if c.dst + out_len > DRAM as u64 {
            return (StatusCode::DeviceOutOfBounds, c.dst);
        }
        if c.dst < c.src + c.len && c.src < c.dst + out_len {
            return (StatusCode::Overlap, c.src);
        }
        let params = Compact {
            record: record as u32,
            score_at: score_at as u32,
            threshold: a[2] as u32,
            capacity: a[3] as u32,
        };
        let (s, d) = (c.src as usize, c.dst as usize);
        let mut written = vec![0; out_len as usize];
        let found = reference::compact(
            &self.model_dram[s..s + c.len as usize],
            params,
            &mut written,
        )
        .expect("valid compact");
        self.model_dram[d..d + written.len()].copy_from_slice(&written);
        (StatusCode::Success, found)
    }

    fn check_memory(&self) {
        let mut host = vec![0u8; HOST];
        self.host.slice().read_into(0, &mut host).unwrap();
        assert!(
            host == self.model_host,
            "host memory differs from the model"
        );
        let mut dram = vec![0u8; DRAM];
        self.device.device_memory().read_into(0, &mut dram).unwrap();
        assert!(
            dram == self.model_dram,
            "device memory differs from the model"
        );
        let mut guard = vec![0u8; 4096];
        userdma::dma::Slice::from_region(&self.guard)
            .read_into(0, &mut guard)
            .unwrap();
        assert!(
            guard.iter().all(|&b| b == 0x5a),
            "unmapped host memory was written"
        );
    }
}

/// A `Layer` command from tensor fields, one of them made wrong by `skew`; when the typed
/// builder can express it, it must build the same command.
fn layer_command(inputs: &[Tensor; 3], present: u8, out: Tensor, seed: u32, skew: u8) -> Command {
    let mut fields = [(0u64, 0u64); 3];
    for (k, (field, t)) in fields.iter_mut().zip(inputs).enumerate() {
        if k == 0 || present & (1 << k) != 0 {
            *field = (t.offset(), t.len());
        }
    }
    if skew & 0x80 != 0 {
        fields[0].1 = 0;
    }
    let (mut dst, mut len) = (out.offset(), out.len());
    match skew % 16 {
        1 => fields[0].0 += 2,
        2 => len += 2,
        3 => fields[2].1 += 1,
        4 => fields[1] = (64, 0),
        5 => dst = fields[0].0 + fields[0].1 / 2,
        6 => dst = fields[0].0,
        7 => fields[1].0 = u64::MAX - 7,
        8 => dst = u64::MAX - 3,
        9 => dst = DRAM as u64 - 4,
        10 => len = 0,
        11 => dst = fields[0].0 + fields[0].1,
        _ => {}
    }
    let [(src, len0), (off1, len1), (off2, len2)] = fields;
    let command = Command {
        opcode: Opcode::Layer as u8,
        flags: 0,
        command_id: 0,
        context: CONTEXT,
        src,
        dst,
        len,
        args: [off1, off2, len0 | len1 << 32, len2 | u64::from(seed) << 32],
    };
    // The builder takes the present inputs in order; it can say this command if the absent
    // ones are the last and name no memory.
    let given: Vec<(DeviceOffset, u64)> = fields
        .iter()
        .take_while(|&&(_, l)| l != 0)
        .map(|&(o, l)| (DeviceOffset(o), l))
        .collect();
    let rest_absent = fields[given.len()..].iter().all(|&f| f == (0, 0));
    if rest_absent && fields.iter().all(|&(_, l)| l <= u64::from(u32::MAX)) {
        if let Ok(built) = Descriptor::layer(&given, DeviceOffset(dst), len, seed) {
            assert_eq!(
                built.context(CONTEXT).build(),
                command,
                "the builder's encoding"
            );
        }
    }
    command
}

fuzz_target!(|descs: Vec<Desc>| {
    let mut fixture = fixture().lock().unwrap_or_else(|p| p.into_inner());
    for desc in descs.iter().take(64) {
        if let Desc::Remap = desc {
            fixture.remap();
            fixture.check_memory();
            continue;
        }
        let command = fixture.command(desc);
        let (code, result) = fixture.predict(&command);
        fixture.queue.submit(command, ()).expect("submitted");
        let done = fixture
            .queue
            .wait(Some(Duration::from_secs(10)))
            .expect("every descriptor completes");
        assert_eq!(
            (done.entry.code(), done.entry.result),
            (code as u16, result),
            "{command:?}"
        );
        fixture.check_memory();
    }
});
