//! Checking a descriptor ([`check`]): every field, in the order the register map documents,
//! before anything is touched; a descriptor that passes becomes a [`Plan`] whose ranges all lie
//! inside the device memory, none overflowing.

use super::Plan;
use crate::reference::Compact;
use crate::regs::{Opcode, StatusCode};
use crate::u64_of;
use userdma::ring::Command;

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
pub(crate) fn check(
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
