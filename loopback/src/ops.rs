//! What a descriptor does: every field checked first ([`check`]), then the memory operation on
//! device memory and on host memory reached only through the device's translation table
//! ([`execute`]). A descriptor that fails a check touches nothing.

use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::reference::{self, Compact};
use super::regs::{Opcode, StatusCode};
use crate::u64_of;
use userdma::dma;
use userdma::memory::Region;
use userdma::ring::Command;

/// Host memory the device resolved: `len` bytes at `ptr`, kept mapped while the span lives.
#[derive(Debug)]
pub(super) struct Span {
    ptr: NonNull<u8>,
    len: usize,
    _keep: Keep,
}

/// What keeps a span's memory mapped.
#[derive(Debug)]
#[allow(dead_code)] // Held for its Drop only.
enum Keep {
    /// A translation of the in-process table (holds the region).
    Window(dma::Window),
    /// A region the device process mapped from a memfd.
    Region(Arc<Region>),
}

// SAFETY: a Span is a pointer into a mapping that its owner keeps alive, accessed only through
// raw pointers (never references); the owners are Send and Sync.
unsafe impl Send for Span {}
// SAFETY: as for Send.
unsafe impl Sync for Span {}

impl Span {
    /// `len` bytes at `offset` of `region` (the caller checked `offset + len <= region.len()`).
    pub(super) fn in_region(region: Arc<Region>, offset: usize, len: usize) -> Option<Span> {
        if offset.checked_add(len)? > region.len() || len == 0 {
            return None;
        }
        // SAFETY: `offset + len <= region.len()`: inside the mapping.
        let ptr = unsafe { region.as_ptr().add(offset) };
        Some(Span {
            ptr,
            len,
            _keep: Keep::Region(region),
        })
    }

    /// `len` bytes at `offset` of the span, holding the same memory; `None` unless inside it
    /// (and `len > 0`).
    pub(super) fn sub(self, offset: usize, len: usize) -> Option<Span> {
        if len == 0 || offset.checked_add(len)? > self.len {
            return None;
        }
        Some(Span {
            // SAFETY: `offset + len <= self.len`: inside the mapping.
            ptr: unsafe { self.ptr.add(offset) },
            len,
            _keep: self._keep,
        })
    }

    /// The first byte (raw).
    pub(super) fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The length.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// The device's translation table: the mapped piece that holds an IOVA, and a generation
/// number that moves on every change of the table.
pub(super) trait Translate: Send + Sync + std::fmt::Debug {
    /// The whole mapped piece holding `iova`: its first and last IOVA and its memory.
    fn piece(&self, iova: u64) -> Option<(u64, u64, Span)>;

    /// Moves on every map and unmap (a piece resolved while it had one value is still mapped
    /// while it has it).
    fn generation(&self) -> u64;

    /// Resolves `len` bytes at `iova` to host memory, or `None` unless they all lie in one
    /// mapped piece (and `len > 0`).
    fn translate(&self, iova: u64, len: usize) -> Option<Span> {
        let (start, _, span) = self.piece(iova)?;
        let at = usize::try_from(iova - start).ok()?;
        span.sub(at, len)
    }
}

impl Translate for dma::SoftIommu {
    fn piece(&self, iova: u64) -> Option<(u64, u64, Span)> {
        let (range, window) = self.piece_at(iova)?;
        Some((
            range.start,
            range.last,
            Span {
                ptr: window.as_ptr(),
                len: window.len(),
                _keep: Keep::Window(window),
            },
        ))
    }

    fn generation(&self) -> u64 {
        dma::SoftIommu::generation(self)
    }
}

/// The piece the engine resolved last, and the table generation it was resolved in.
#[derive(Debug)]
struct Cached {
    generation: u64,
    start: u64,
    last: u64,
    span: Span,
}

/// Host memory as the engine reaches it: through the translation table, with the last piece
/// resolved kept while the table does not change, so a run of descriptors into one mapping
/// costs one lookup (and no lock) instead of one per descriptor.
#[derive(Debug)]
pub(super) struct Host {
    table: Arc<dyn Translate>,
    cached: Option<Cached>,
}

impl Host {
    pub(super) fn new(table: Arc<dyn Translate>) -> Host {
        Host {
            table,
            cached: None,
        }
    }

    /// The table.
    pub(super) fn table(&self) -> &dyn Translate {
        &*self.table
    }

    /// The host address of `len` bytes at `iova`, or `None` unless they all lie in one mapped
    /// piece (and `len > 0`). The address stays valid until the next call (the cache keeps
    /// its piece mapped).
    fn resolve(&mut self, iova: u64, len: usize) -> Option<NonNull<u8>> {
        let last = iova.checked_add(u64_of(len).checked_sub(1)?)?;
        let generation = self.table.generation();
        let hit = self
            .cached
            .as_ref()
            .is_some_and(|c| c.generation == generation && c.start <= iova && iova <= c.last);
        if !hit {
            // Drop the old piece first: it may be the last hold on an unmapped region.
            self.cached = None;
            let (start, end, span) = self.table.piece(iova)?;
            self.cached = Some(Cached {
                generation,
                start,
                last: end,
                span,
            });
        }
        let cached = self.cached.as_ref()?;
        if last > cached.last {
            return None;
        }
        let at = usize::try_from(iova - cached.start).ok()?;
        // `iova..=last` lies in the piece, so `at + len <= span.len()`.
        debug_assert!(at + len <= cached.span.len());
        // SAFETY: `at + len <= span.len()` (the range lies in the piece): inside the mapping.
        Some(unsafe { cached.span.as_ptr().add(at) })
    }
}

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

/// `addr + len` without overflow, or the failure naming `addr`.
fn end_of(addr: u64, len: u64) -> Result<u64, (StatusCode, u64)> {
    addr.checked_add(len)
        .ok_or((StatusCode::AddressOverflow, addr))
}

/// A device range `offset..offset + len` (already overflow-checked) as `usize`s inside
/// `memory_size`, or the failure naming `offset`.
fn device_range(offset: u64, len: u64, memory_size: u64) -> Result<usize, (StatusCode, u64)> {
    let end = end_of(offset, len)?;
    if end > memory_size {
        return Err((StatusCode::DeviceOutOfBounds, offset));
    }
    usize::try_from(offset).map_err(|_| (StatusCode::DeviceOutOfBounds, offset))
}

/// Checks every field of `cmd` for a queue of context `context` and a device memory of
/// `memory_size` bytes, in the order the register map documents; `Err((code, result))` on the
/// first problem.
pub(super) fn check(
    cmd: &Command,
    context: u32,
    memory_size: u64,
) -> Result<Plan, (StatusCode, u64)> {
    let op = Opcode::from_raw(cmd.opcode).ok_or((StatusCode::BadOpcode, 0))?;
    if cmd.flags != 0 {
        return Err((StatusCode::BadFlags, 0));
    }
    if cmd.context != context {
        return Err((StatusCode::BadContext, 0));
    }
    // Their fields are laid out otherwise: checked by their own functions, in the same order
    // of codes.
    match op {
        Opcode::Layer => return check_layer(cmd, memory_size),
        Opcode::Compact => return check_compact(cmd, memory_size),
        _ => {}
    }
    let args = cmd.args;
    let zero_from = |first: usize| args[first..].iter().all(|&a| a == 0);
    let args_ok = match op {
        Opcode::Nop | Opcode::ToDevice | Opcode::ToHost | Opcode::DeviceCopy => zero_from(0),
        Opcode::Fill => args[0] <= 0xff && zero_from(1),
        Opcode::Compute => {
            u32::try_from(args[0]).is_ok() && u32::try_from(args[1]).is_ok() && zero_from(2)
        }
        Opcode::Layer | Opcode::Compact => unreachable!("checked by their own functions"),
        Opcode::Wait => zero_from(2),
    };
    // Address fields an opcode does not use must be zero too.
    let unused_ok = match op {
        Opcode::Nop | Opcode::Wait => cmd.src == 0 && cmd.dst == 0,
        Opcode::Fill => cmd.src == 0,
        _ => true,
    };
    if !args_ok || !unused_ok {
        return Err((StatusCode::BadArgs, 0));
    }
    let len = cmd.len;
    match (op, len) {
        (Opcode::Nop, 0) => return Ok(Plan::Nop),
        (Opcode::Wait, 0) => {
            return Ok(Plan::Wait {
                queue: args[0],
                target: args[1],
            })
        }
        (Opcode::Nop | Opcode::Wait, _) | (_, 0) => return Err((StatusCode::BadLength, 0)),
        _ => {}
    }
    let ulen = usize::try_from(len).map_err(|_| (StatusCode::BadLength, 0))?;
    let uses_src = op != Opcode::Fill;
    if uses_src {
        end_of(cmd.src, len)?;
    }
    end_of(cmd.dst, len)?;
    if op == Opcode::Compute && (cmd.src % 4 != 0 || cmd.dst % 4 != 0 || len % 4 != 0) {
        return Err((StatusCode::Misaligned, 0));
    }
    Ok(match op {
        Opcode::ToDevice => Plan::ToDevice {
            iova: cmd.src,
            dst: device_range(cmd.dst, len, memory_size)?,
            len: ulen,
        },
        Opcode::ToHost => Plan::ToHost {
            src: device_range(cmd.src, len, memory_size)?,
            iova: cmd.dst,
            len: ulen,
        },
        Opcode::DeviceCopy => Plan::DeviceCopy {
            src: device_range(cmd.src, len, memory_size)?,
            dst: device_range(cmd.dst, len, memory_size)?,
            len: ulen,
        },
        Opcode::Fill => Plan::Fill {
            dst: device_range(cmd.dst, len, memory_size)?,
            len: ulen,
            // Checked above: at most 0xff.
            byte: args[0] as u8,
        },
        Opcode::Compute => Plan::Compute {
            src: device_range(cmd.src, len, memory_size)?,
            dst: device_range(cmd.dst, len, memory_size)?,
            len: ulen,
            // Checked above: both fit in 32 bits.
            xor: args[0] as u32,
            add: args[1] as u32,
        },
        Opcode::Nop => Plan::Nop,
        Opcode::Wait => Plan::Wait {
            queue: args[0],
            target: args[1],
        },
        Opcode::Layer | Opcode::Compact => unreachable!("checked by their own functions"),
    })
}

/// The low and high 32 bits of an `args` word.
fn halves(word: u64) -> (u32, u32) {
    // The mask and the shift leave 32 bits each.
    ((word & 0xffff_ffff) as u32, (word >> 32) as u32)
}

/// Whether `a..a + a_len` and `b..b + b_len` (device ranges, already checked) share a byte.
fn overlaps(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a < b + b_len && b < a + a_len
}

/// [`check`] for [`Opcode::Layer`] (the header fields already checked).
fn check_layer(cmd: &Command, memory_size: u64) -> Result<Plan, (StatusCode, u64)> {
    let (len0, len1) = halves(cmd.args[2]);
    let (len2, seed) = halves(cmd.args[3]);
    let all = [(cmd.src, len0), (cmd.args[0], len1), (cmd.args[1], len2)]
        .map(|(offset, len)| (offset, u64::from(len)));
    // An absent input names no memory.
    if all.iter().any(|&(offset, len)| len == 0 && offset != 0) {
        return Err((StatusCode::BadArgs, 0));
    }
    if cmd.len == 0 || len0 == 0 {
        return Err((StatusCode::BadLength, 0));
    }
    let ulen = usize::try_from(cmd.len).map_err(|_| (StatusCode::BadLength, 0))?;
    let present = || all.iter().copied().filter(|&(_, len)| len != 0);
    for (offset, len) in present() {
        end_of(offset, len)?;
    }
    end_of(cmd.dst, cmd.len)?;
    let aligned = |v: u64| v % 4 == 0;
    if !present()
        .chain([(cmd.dst, cmd.len)])
        .all(|(offset, len)| aligned(offset) && aligned(len))
    {
        return Err((StatusCode::Misaligned, 0));
    }
    let mut inputs = [(0usize, 0usize); 3];
    let mut count = 0;
    for (offset, len) in present() {
        let at = device_range(offset, len, memory_size)?;
        let len = usize::try_from(len).map_err(|_| (StatusCode::DeviceOutOfBounds, offset))?;
        inputs[count] = (at, len);
        count += 1;
    }
    let dst = device_range(cmd.dst, cmd.len, memory_size)?;
    if let Some(&(at, _)) = inputs[..count]
        .iter()
        .find(|&&(at, len)| overlaps(dst, ulen, at, len))
    {
        return Err((StatusCode::Overlap, u64_of(at)));
    }
    Ok(Plan::Layer {
        inputs,
        count,
        dst,
        len: ulen,
        seed,
    })
}

/// [`check`] for [`Opcode::Compact`] (the header fields already checked).
fn check_compact(cmd: &Command, memory_size: u64) -> Result<Plan, (StatusCode, u64)> {
    let [record, score_at, threshold, capacity] = cmd.args.map(u32::try_from);
    let (Ok(record), Ok(score_at), Ok(threshold), Ok(capacity)) =
        (record, score_at, threshold, capacity)
    else {
        return Err((StatusCode::BadArgs, 0));
    };
    if !(4..=Compact::MAX_RECORD).contains(&record) || u64::from(score_at) + 4 > u64::from(record) {
        return Err((StatusCode::BadArgs, 0));
    }
    if cmd.len == 0 || cmd.len % u64::from(record) != 0 {
        return Err((StatusCode::BadLength, 0));
    }
    let ulen = usize::try_from(cmd.len).map_err(|_| (StatusCode::BadLength, 0))?;
    let params = Compact {
        record,
        score_at,
        threshold,
        capacity,
    };
    let out_len = params.output_len();
    end_of(cmd.src, cmd.len)?;
    end_of(cmd.dst, out_len)?;
    if cmd.src % 4 != 0 || cmd.dst % 4 != 0 || record % 4 != 0 || score_at % 4 != 0 {
        return Err((StatusCode::Misaligned, 0));
    }
    let src = device_range(cmd.src, cmd.len, memory_size)?;
    let dst = device_range(cmd.dst, out_len, memory_size)?;
    let out_ulen =
        usize::try_from(out_len).map_err(|_| (StatusCode::DeviceOutOfBounds, cmd.dst))?;
    if overlaps(dst, out_ulen, src, ulen) {
        return Err((StatusCode::Overlap, cmd.src));
    }
    Ok(Plan::Compact {
        src,
        len: ulen,
        dst,
        params,
    })
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
            let Some(from) = host.resolve(iova, len) else {
                return Outcome::failed(StatusCode::HostUnmapped, iova);
            };
            // SAFETY: see above: `len` readable bytes at `from`, `len` writable bytes at
            // `base + dst`, in two different mappings.
            unsafe { ptr::copy_nonoverlapping(from.as_ptr(), base.add(dst), len) };
            moved(len, u64_of(len))
        }
        Plan::ToHost { src, iova, len } => {
            let Some(to) = host.resolve(iova, len) else {
                return Outcome::failed(StatusCode::HostUnmapped, iova);
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
