//! What a descriptor does: every field checked first ([`check`]), then the memory operation on
//! device memory and on host memory reached only through the device's translation table
//! ([`execute`]). A descriptor that fails a check touches nothing.

use std::ptr::{self, NonNull};

use super::reference::{self, Compact};
use super::regs::StatusCode;
use crate::u64_of;
#[cfg(test)]
use userdma::ring::Command;

mod checks;
mod translate;

pub(super) use self::checks::check;
pub(super) use self::translate::{Host, Span, Translate};

/// Device memory: `len` bytes at `ptr`, owned by the engine's region.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dram {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

/// A checked descriptor: what it will do. Offsets are device-memory offsets, IOVAs host
/// addresses; every range is inside the device memory, none overflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    Nop,
    ToDevice {
        iova: u64,
        dst: usize,
        len: usize,
    },
    ToHost {
        src: usize,
        iova: u64,
        len: usize,
    },
    DeviceCopy {
        src: usize,
        dst: usize,
        len: usize,
    },
    Fill {
        dst: usize,
        len: usize,
        byte: u8,
    },
    Compute {
        src: usize,
        dst: usize,
        len: usize,
        xor: u32,
        add: u32,
    },
    /// The present inputs are `inputs[..count]`, each `(offset, len)`, `len > 0`.
    Layer {
        inputs: [(usize, usize); 3],
        count: usize,
        dst: usize,
        len: usize,
        seed: u32,
    },
    /// `len` bytes of records at `src`; the output (`params.output_len()` bytes) at `dst`.
    Compact {
        src: usize,
        len: usize,
        dst: usize,
        params: Compact,
    },
    /// Wait until queue `queue`'s completed counter reaches `target`: the engine evaluates it
    /// (it knows the queues), `queue` unchecked here.
    Wait {
        queue: u64,
        target: u64,
    },
}

/// How a descriptor ended: status code, result word, and what the cost model charges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Outcome {
    pub(super) code: StatusCode,
    pub(super) result: u64,
    /// The descriptor's `len` if it succeeded (what the `bytes` counter adds).
    pub(super) bytes: u64,
    pub(super) dma_bytes: u64,
    /// What the compute unit reads and writes (the cost module's docs): `len` for `Compute`;
    /// for `Layer` each present input's length up to `len`, plus `len`; for `Compact` `len`
    /// plus the output's `8 + capacity * record`.
    pub(super) compute_bytes: u64,
}

impl Outcome {
    pub(super) fn failed(code: StatusCode, result: u64) -> Outcome {
        Outcome {
            code,
            result,
            bytes: 0,
            dma_bytes: 0,
            compute_bytes: 0,
        }
    }
}

/// Checks and runs `cmd`: the outcome to complete it with (the engine itself checks first, to
/// evaluate a `Wait`, then runs).
#[cfg(test)]
pub(super) fn execute(cmd: &Command, context: u32, dram: Dram, host: &mut Host) -> Outcome {
    let plan = match check(cmd, context, u64_of(dram.len)) {
        Ok(plan) => plan,
        Err((code, result)) => return Outcome::failed(code, result),
    };
    run(plan, dram, host)
}

/// Runs a checked plan (a [`Plan::Wait`] is the engine's to evaluate: here it fails with
/// [`StatusCode::BadArgs`]).
pub(super) fn run(plan: Plan, dram: Dram, host: &mut Host) -> Outcome {
    let base = dram.ptr.as_ptr();
    let moved = |len: usize, dma: u64| Outcome {
        code: StatusCode::Success,
        result: u64_of(len),
        bytes: u64_of(len),
        dma_bytes: dma,
        compute_bytes: 0,
    };
    // Memory safety of every access below: `check` put each device range inside `dram`
    // (`offset + len <= dram.len`), and each host range is one `Host::resolve` returned, `len`
    // bytes of a live mapping (its cache holds the mapping until the next lookup). The device memory is a separate memfd that is never
    // mapped into the DMA space, so a host span never overlaps it. Accesses are raw-pointer
    // copies: no reference to device-visible memory is made. The bytes of a buffer named by a
    // descriptor belong to the device until its completion (the ring keeps the buffer in its
    // in-flight table), so the host does not access them meanwhile.
    match plan {
        Plan::Nop => moved(0, 0),
        Plan::Wait { .. } => Outcome::failed(StatusCode::BadArgs, 0),
        Plan::ToDevice { iova, dst, len } => {
            let from = match host.resolve_for(iova, len, false) {
                Ok(from) => from,
                Err(code) => return Outcome::failed(code, iova),
            };
            // SAFETY: see above: `len` readable bytes at `from`, `len` writable bytes at
            // `base + dst`, in two different mappings.
            unsafe { ptr::copy_nonoverlapping(from.as_ptr(), base.add(dst), len) };
            moved(len, u64_of(len))
        }
        Plan::ToHost { src, iova, len } => {
            let to = match host.resolve_for(iova, len, true) {
                Ok(to) => to,
                Err(code) => return Outcome::failed(code, iova),
            };
            // SAFETY: as for `ToDevice`, the other way.
            unsafe { ptr::copy_nonoverlapping(base.add(src), to.as_ptr(), len) };
            moved(len, u64_of(len))
        }
        Plan::DeviceCopy { src, dst, len } => {
            // SAFETY: both ranges inside device memory; `ptr::copy` allows overlap.
            unsafe { ptr::copy(base.add(src), base.add(dst), len) };
            moved(len, u64_of(len).saturating_mul(2))
        }
        Plan::Fill { dst, len, byte } => {
            // SAFETY: the range is inside device memory.
            unsafe { ptr::write_bytes(base.add(dst), byte, len) };
            moved(len, u64_of(len))
        }
        Plan::Compute {
            src,
            dst,
            len,
            xor,
            add,
        } => {
            // SAFETY: both ranges are inside device memory, `len` a multiple of 4 (checked);
            // the kernel keeps the ascending word order that defines overlapping ranges, and
            // reads and writes device memory through raw pointers only, making no reference
            // to it.
            let sum =
                unsafe { reference::compute_raw(xor, add, base.add(src), base.add(dst), len) };
            Outcome {
                code: StatusCode::Success,
                result: sum,
                bytes: u64_of(len),
                dma_bytes: 0,
                compute_bytes: u64_of(len),
            }
        }
        Plan::Layer {
            inputs,
            count,
            dst,
            len,
            seed,
        } => {
            let inputs = &inputs[..count];
            let mut raw = [(ptr::null::<u8>(), 0usize); 3];
            for (r, &(at, in_len)) in raw.iter_mut().zip(inputs) {
                // SAFETY: the input range is inside device memory (checked).
                *r = (unsafe { base.add(at) }.cast_const(), in_len);
            }
            // SAFETY: each input range and the output range are inside device memory, the
            // lengths positive multiples of 4 (checked); the output overlaps no input
            // (checked); the kernel reads and writes device memory through raw pointers only,
            // making no reference to it.
            let sum = unsafe { reference::layer_raw(seed, &raw[..count], base.add(dst), len) };
            // Each input word the output uses, read once (a shorter input repeats from the
            // compute unit's buffer), and the output written.
            let read: usize = inputs.iter().map(|&(_, in_len)| in_len.min(len)).sum();
            Outcome {
                code: StatusCode::Success,
                result: sum,
                bytes: u64_of(len),
                dma_bytes: 0,
                compute_bytes: u64_of(read).saturating_add(u64_of(len)),
            }
        }
        Plan::Compact {
            src,
            len,
            dst,
            params,
        } => {
            let record = params.record as usize;
            let score_at = params.score_at as usize;
            let capacity = params.capacity as usize;
            let slots = dst + reference::COMPACT_HEADER as usize;
            let (mut written, mut found) = (0usize, 0u64);
            for r in (src..src + len).step_by(record) {
                // SAFETY: the input range is inside device memory and `r + score_at + 4 <=
                // r + record <= src + len` (checked: the score lies inside the record, `len`
                // is a multiple of the record); an unaligned read.
                let score =
                    u32::from_le(unsafe { base.add(r + score_at).cast::<u32>().read_unaligned() });
                if !params.survives(score) {
                    continue;
                }
                found += 1;
                if written < capacity {
                    // SAFETY: the record is inside the input range; slot `written <
                    // capacity` is inside the output range (`8 + capacity * record` bytes),
                    // which does not overlap the input (checked).
                    unsafe {
                        ptr::copy_nonoverlapping(
                            base.add(r),
                            base.add(slots + written * record),
                            record,
                        )
                    };
                    written += 1;
                }
            }
            // SAFETY: slots `written..capacity` are inside the output range.
            unsafe {
                ptr::write_bytes(
                    base.add(slots + written * record),
                    0,
                    (capacity - written) * record,
                )
            };
            let header = [
                u32::try_from(written).unwrap_or(u32::MAX),
                u32::try_from(found).unwrap_or(u32::MAX),
            ];
            for (i, h) in header.into_iter().enumerate() {
                // SAFETY: the header's two words are the first 8 bytes of the output range.
                unsafe {
                    base.add(dst + 4 * i)
                        .cast::<u32>()
                        .write_unaligned(h.to_le())
                };
            }
            let out_len = params.output_len();
            Outcome {
                code: StatusCode::Success,
                result: found,
                bytes: u64_of(len),
                dma_bytes: 0,
                compute_bytes: u64_of(len).saturating_add(out_len),
            }
        }
    }
}

#[cfg(test)]
mod tests;
