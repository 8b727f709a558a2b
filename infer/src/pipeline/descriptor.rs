//! A frame's ops: the tag each carries (its slot, its step, whether it is the frame's last),
//! the order they go in across the queues ([`Next`]), each one built from the model and a slot
//! ([`op_of`]), and its name in error messages ([`step_name`]).

use super::{Model, Slot};
use crate::accel::{HostSpan, Op};
use userdma::pool::OwnedBuffer;

/// One entry of a frame's op plan in [`Pipeline::try_submit`].
///
/// [`Pipeline::try_submit`]: super::Pipeline::try_submit
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Op `k` of the frame (0 the H2D copy, `steps + 1` the D2H copy).
    Step(usize),
    /// Every model step, 1 to `steps`.
    Steps,
    /// A wait until everything pushed to that queue so far has completed.
    WaitOn(usize),
}

/// The step number of a wait (for error messages).
pub(super) const WAIT_STEP: u16 = u16::MAX;

/// The tag of op `step` of the frame in slot `slot`; `last` for the frame's last op.
#[inline]
pub(super) fn tag(slot: usize, step: u16, last: bool) -> u64 {
    (u64::from(last) << 63) | ((slot as u64 & 0xFFFF) << 16) | u64::from(step)
}

/// The slot, step and last flag of a tag.
#[inline]
pub(super) fn untag(tag: u64) -> (usize, u16, bool) {
    (
        ((tag >> 16) & 0xFFFF) as usize,
        (tag & 0xFFFF) as u16,
        tag >> 63 == 1,
    )
}

/// What op `step` of a frame is, for error messages.
pub(super) fn step_name(step: u16, steps: usize) -> &'static str {
    match usize::from(step) {
        0 => "H2D copy of the input",
        _ if step == WAIT_STEP => "wait for the other unit",
        s if s <= steps => "model step",
        _ => "D2H copy of the result",
    }
}

/// A host buffer as ops name it.
#[inline]
pub(super) fn span(buffer: &OwnedBuffer, len: u64) -> HostSpan {
    HostSpan {
        iova: buffer.iova(),
        ptr: buffer.as_ptr(),
        len,
    }
}

/// Op `k` of a frame of `model` in `slot`: 0 the H2D copy, then each step at the slot's arena,
/// then the D2H copy.
#[inline]
pub(super) fn op_of(model: &Model, slot: &Slot, k: usize) -> Op {
    let (i, r) = (model.input(), model.result());
    op_at(
        model,
        slot.arena,
        span(&slot.input, i.bytes),
        span(&slot.result, r.bytes),
        k,
    )
}

/// Op `k` of a frame of `model` in the arena at `arena`, its input in `input` and its result
/// going to `result`: 0 the H2D copy, then each step, then the D2H copy.
#[inline]
pub(super) fn op_at(model: &Model, arena: u64, input: HostSpan, result: HostSpan, k: usize) -> Op {
    if k == 0 {
        Op::ToDevice {
            from: input,
            to: arena + model.input().offset,
        }
    } else if let Some(&step) = model.steps().get(k - 1) {
        Op::Step { arena, step }
    } else {
        Op::ToHost {
            from: arena + model.result().offset,
            to: result,
        }
    }
}
