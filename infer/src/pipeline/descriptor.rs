//! A frame's descriptors: what each carries ([`Payload`]), the order they go in across the
//! queues ([`Next`]), each one built from the model and a slot ([`command_of`], [`command`])
//! and queued ([`push`]), and its name in error messages ([`step_name`]).

use super::{Model, Slot, Step};
use userdma::dma::{DeviceOffset, Iova};
use userdma::ring::Command;
use userdma_loopback::{self as loopback, Descriptor};

/// A descriptor's payload: the frame's earlier descriptors carry its slot and step, the
/// D2H copy the slot itself.
#[derive(Debug)]
pub(super) enum Payload {
    Step { slot: usize, step: u16 },
    Last { slot: Slot, step: u16 },
}

/// One entry of a frame's descriptor plan in [`Pipeline::try_submit`].
///
/// [`Pipeline::try_submit`]: super::Pipeline::try_submit
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// Descriptor `k` of the frame (0 the H2D copy, `steps + 1` the D2H copy).
    Step(usize),
    /// Every model step, 1 to `steps`.
    Steps,
    /// A `Wait` until everything pushed to that queue so far has completed.
    WaitOn(usize),
}

/// The step number of a `Wait` descriptor (for error messages).
pub(super) const WAIT_STEP: u16 = u16::MAX;

/// What descriptor `step` of a frame is, for error messages.
pub(super) fn step_name(step: u16, steps: usize) -> &'static str {
    match usize::from(step) {
        0 => "H2D copy of the input",
        _ if step == WAIT_STEP => "wait for the other unit",
        s if s <= steps => "model step",
        _ => "D2H copy of the result",
    }
}

/// Descriptor `k` of a frame in `slot`: 0 the H2D copy, then each step at the slot's arena,
/// then the D2H copy.
#[inline]
pub(super) fn command_of(model: &Model, slot: &Slot, k: usize) -> Command {
    command(model, slot.arena, slot.input.iova(), slot.result.iova(), k)
}

/// Queues `command`. The ring holds every slot's descriptors, and a slot of the ring is free
/// once the completion that frees it was taken (the device writes its SQ head back before each
/// completion), so a refusal here is an error, never a moment to wait out.
pub(super) fn push<T: Send>(
    queue: &mut loopback::Queue<T>,
    command: Command,
    payload: T,
) -> Result<(), crate::Error> {
    queue.push(command, payload)?;
    Ok(())
}

/// Descriptor `k` of a frame of `model` in the arena at `base`, with its input and result at
/// host IOVAs `input` and `result`: 0 the H2D copy, then each step, then the D2H copy.
#[inline]
pub(super) fn command(
    model: &Model,
    base: DeviceOffset,
    input: Iova,
    result: Iova,
    k: usize,
) -> Command {
    let steps = model.steps();
    let d = if k == 0 {
        let i = model.input();
        Descriptor::to_device(input, base + i.offset, i.bytes)
    } else if let Some(step) = steps.get(k - 1) {
        match *step {
            Step::Compute {
                src,
                dst,
                len,
                xor,
                add,
            } => Descriptor::compute(base + src, base + dst, len, xor, add),
            Step::Layer {
                inputs,
                count,
                dst,
                len,
                seed,
            } => {
                let mut at = [(base, 0); 3];
                for (a, &(offset, bytes)) in at.iter_mut().zip(&inputs) {
                    *a = (base + offset, bytes);
                }
                // One to three inputs of at most 4 GiB each: checked when the model was built.
                Descriptor::layer(&at[..usize::from(count)], base + dst, len, seed)
                    .unwrap_or_else(|_| Descriptor::nop())
            }
            Step::Compact {
                src,
                len,
                dst,
                params,
            } => Descriptor::compact(
                base + src,
                len,
                params.record,
                params.score_at,
                params.threshold,
                base + dst,
                params.capacity,
            ),
        }
    } else {
        let r = model.result();
        Descriptor::to_host(base + r.offset, result, r.bytes)
    };
    d.build()
}
