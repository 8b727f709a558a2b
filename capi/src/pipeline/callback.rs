//! The frame views callbacks get (`udma_frame_input`, `udma_frame_output`): this thread's
//! running callback and its token, running a fill or result callback, refusing a re-entering
//! call, and writing a frame's input or reading its result through a view.
//!
//! A view is written into this thread's block for the callback's nesting depth (`views`),
//! memory that is never freed, and the thread's record (`Current`) says which view is live.
//! An accessor accepts the live view by its address without reading it, refuses unread any
//! other pointer into the blocks (a view kept past its callback, another thread's view, live
//! or not), and reads only the token of anything else (the caller's own copy of a view,
//! accepted if it carries the running callback's token). So a view pointer kept too long is
//! refused with the usual error, and what the check reads is always memory that exists.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use userdma_infer::pipeline::{Finished, Input, Output};

use super::views::{self, Block, Lease};
use crate::error::{call, udma_status, Fail};

/// A frame's input, inside a fill or preprocess callback: write it with
/// `udma_frame_input_write`. Valid for that callback only: a pointer to it kept past the
/// callback still points to readable memory, but every call refuses it (inside a later
/// callback at the same nesting depth on the same thread it is that callback's view again,
/// the same address). Read its fields inside the callback only, and do not write them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_frame_input {
    /// `sizeof(udma_frame_input)` of the library.
    pub size: usize,
    /// The frame's number in its pipeline (from 0).
    pub frame: u64,
    /// Bytes of the input: write all of them (what is not written keeps an earlier frame's
    /// bytes).
    pub len: u64,
    /// The library's check that a copy of the view belongs to the running callback (unique
    /// in the process, never 0).
    pub token: u64,
}

/// A finished frame, inside a result or postprocess callback: read its result with
/// `udma_frame_output_read`. Valid for that callback only, as `udma_frame_input` is. Read
/// its fields inside the callback only, and do not write them.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_frame_output {
    /// `sizeof(udma_frame_output)` of the library.
    pub size: usize,
    /// The frame's number in its pipeline (from 0, in order).
    pub frame: u64,
    /// Bytes of the result (0 for a failed frame).
    pub len: u64,
    /// Nanoseconds from the start of its preprocessing to its result.
    pub latency_ns: u64,
    /// The completion's result field of the failed step (an address or offset), or 0.
    pub fault: u64,
    /// 0: the device ran the frame; otherwise the loopback device's code of the step that
    /// failed (`udma_op_status_name` names it), and the frame has no result.
    pub status: u32,
    /// The step that failed: 0 the H2D copy, then the model's steps, then the D2H copy.
    pub step: u32,
    /// The library's check that a copy of the view belongs to the running callback (unique
    /// in the process, never 0).
    pub token: u64,
}

/// What the running callback on this thread may touch: its frame's input or output, the
/// view it was given (in this thread's block for its depth, see `views`) and that view's
/// token; plus how deep in callbacks the thread is. This record is the views' "live" marker:
/// a view is live while it is the one recorded here.
#[derive(Clone, Copy)]
struct Current {
    token: u64,
    /// A fill callback's view and frame (null otherwise).
    input_view: *const udma_frame_input,
    input: *const (),
    /// A result callback's view (null otherwise), and its frame's result (null for a failed
    /// frame, and outside result callbacks).
    output_view: *const udma_frame_output,
    output: *const (),
    /// A result callback's frame number and status, for the message about a failed frame.
    frame: u64,
    status: u32,
    depth: u32,
}

const OUTSIDE: Current = Current {
    token: 0,
    input_view: std::ptr::null(),
    input: std::ptr::null(),
    output_view: std::ptr::null(),
    output: std::ptr::null(),
    frame: 0,
    status: 0,
    depth: 0,
};

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(OUTSIDE) };
}

/// The next view token: unique in the process (across threads, so a copy of one thread's
/// view never matches another thread's running callback), never 0.
fn next_token() -> u64 {
    /// Tokens handed out so far.
    static TOKENS: AtomicU64 = AtomicU64::new(0);
    loop {
        // Relaxed: a token only has to differ from every other one, which the atomic
        // read-modify-write guarantees on its own (each `fetch_add` reads the value the
        // previous one wrote, in the counter's single modification order); nothing else is
        // published through the counter. It wraps after 2^64 callbacks, never in practice.
        let token = TOKENS.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        if token != 0 {
            return token;
        }
    }
}

/// Restores the thread's previous callback state when the callback returns (or unwinds),
/// then lets go of the callback's block (`lease`, dropped after `drop` runs).
struct InCallback {
    previous: Current,
    _lease: Lease,
}

impl Drop for InCallback {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

impl InCallback {
    /// Marks the thread as inside a callback, in a block of its own; `set` fills in what the
    /// callback may touch (its views, its frame) from the block and the new token.
    fn enter(set: impl FnOnce(&'static Block, Current) -> Current) -> InCallback {
        let previous = CURRENT.with(Cell::get);
        let depth = previous.depth.saturating_add(1);
        let lease = Lease::at(depth);
        let now = set(
            lease.block(),
            Current {
                token: next_token(),
                depth,
                ..OUTSIDE
            },
        );
        CURRENT.with(|c| c.set(now));
        InCallback {
            previous,
            _lease: lease,
        }
    }
}

/// Refuses a call that would re-enter a pipeline from one of its callbacks.
pub(crate) fn not_in_callback() -> Result<(), Fail> {
    if CURRENT.with(|c| c.get().depth) > 0 {
        return Err(Fail::new(
            udma_status::UDMA_ERR_BUSY,
            "called from inside a fill, result, preprocess or postprocess callback: the \
             pipeline is running it; return from the callback first (only the udma_frame_*, \
             udma_model_* and buffer calls are allowed inside)",
        ));
    }
    Ok(())
}

/// Runs the C fill or preprocess callback `f` on `input` (frame `frame`), with a view in the
/// thread's block.
pub(crate) fn fill(input: &Input<'_>, frame: u64, f: impl FnOnce(*mut udma_frame_input)) {
    let mut view = std::ptr::null_mut();
    let _guard = InCallback::enter(|block, now| {
        view = block.input.get();
        // SAFETY: `view` comes from the `UnsafeCell` of a block that is never freed, so it is
        // valid and aligned for a `udma_frame_input`. The block is this thread's until the
        // guard is dropped (`views::Block`'s `Sync` proof): no other thread's library code
        // reads or writes it, and nothing of the library holds a reference into it (the C
        // callback of this thread's earlier frame has returned; the accessors never read a
        // block).
        unsafe {
            view.write(udma_frame_input {
                size: std::mem::size_of::<udma_frame_input>(),
                frame,
                len: input.len() as u64,
                token: now.token,
            });
        }
        Current {
            input_view: view,
            input: std::ptr::from_ref(input).cast(),
            ..now
        }
    });
    f(view);
}

/// Runs the C result or postprocess callback `f` on `done`, with a view in the thread's
/// block.
pub(crate) fn finish(done: &Finished<'_>, f: impl FnOnce(*const udma_frame_output)) {
    let t = &done.times;
    let latency = t.to_host.saturating_duration_since(t.preprocess);
    let (output, status, step, fault) = match &done.result {
        Ok(out) => (Some(out), 0, 0, 0),
        Err(e) => (None, e.code, u32::from(e.step), e.result),
    };
    let mut view = std::ptr::null_mut();
    let _guard = InCallback::enter(|block, now| {
        view = block.output.get();
        // SAFETY: as in `fill`.
        unsafe {
            view.write(udma_frame_output {
                size: std::mem::size_of::<udma_frame_output>(),
                frame: done.frame,
                len: output.map_or(0, |o| o.len() as u64),
                latency_ns: u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
                fault,
                status,
                step,
                token: now.token,
            });
        }
        Current {
            output_view: view,
            output: output.map_or(std::ptr::null(), |o| std::ptr::from_ref(o).cast()),
            frame: done.frame,
            status,
            ..now
        }
    });
    f(view);
}

/// Whether `view`, a view pointer the caller passed (non-null), is the running callback's
/// `live` view (null: the running callback has none of this kind, or none runs). The view
/// the callback was given is recognised by its address; a pointer into the library's view
/// blocks other than that one (a view kept past its callback, another thread's) is refused
/// unread; anything else is the caller's copy of a view, which matches if its token is the
/// running callback's (tokens are unique in the process).
///
/// # Safety
/// `view` points to a readable `T` unless it points into the library's view blocks (the
/// accessors' contract), and `read_token` reads the token of a readable `T`.
unsafe fn is_running<T>(
    view: *const T,
    live: *const T,
    token: u64,
    read_token: unsafe fn(*const T) -> u64,
) -> bool {
    if live.is_null() {
        return false;
    }
    if view == live {
        return true;
    }
    if views::is_library_view(view.cast(), std::mem::size_of::<T>()) {
        return false;
    }
    // SAFETY: not in the library's blocks, so the caller's memory, readable per the contract.
    unsafe { read_token(view) == token }
}

/// The token of the caller's copy of an input view.
///
/// # Safety
/// `view` points to a readable `udma_frame_input`.
unsafe fn input_token(view: *const udma_frame_input) -> u64 {
    // SAFETY: the caller's promise; unaligned, as the caller's copy may be anywhere.
    unsafe { std::ptr::addr_of!((*view).token).read_unaligned() }
}

/// The token of the caller's copy of an output view.
///
/// # Safety
/// `view` points to a readable `udma_frame_output`.
unsafe fn output_token(view: *const udma_frame_output) -> u64 {
    // SAFETY: as in `input_token`.
    unsafe { std::ptr::addr_of!((*view).token).read_unaligned() }
}

fn stale_view(what: &str) -> Fail {
    Fail::invalid(format!(
        "{what} is not the view of the running callback on this thread (a view is valid inside \
         its callback only): write or read the frame before the callback returns"
    ))
}

/// Copies `len` bytes from `src` into the frame's input at `offset` (into the slot's DMA
/// buffer). Inside a fill or preprocess callback only.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback (kept past it, or
/// another thread's), a NULL pointer, or a range past the input's `len`.
///
/// # Safety
/// `input` is NULL, a view the library passed to a callback (even one that has returned, on
/// any thread), or points to a readable `udma_frame_input` (a copy of a view); `src` to `len`
/// readable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_frame_input_write(
    input: *const udma_frame_input,
    offset: u64,
    src: *const c_void,
    len: usize,
) -> udma_status {
    call("udma_frame_input_write", || {
        if input.is_null() {
            return Err(Fail::null("input"));
        }
        if src.is_null() && len > 0 {
            return Err(Fail::null("src"));
        }
        let current = CURRENT.with(Cell::get);
        // SAFETY: non-null; readable per this function's contract, or one of the library's
        // views (which `is_running` does not read).
        if !unsafe { is_running(input, current.input_view, current.token, input_token) } {
            return Err(stale_view("input"));
        }
        // SAFETY: `current.input` was set by `fill` from a live `&Input` for the callback
        // running now on this thread (`input` is its view), which outlives this call; the
        // guard clears it when the callback returns.
        let frame = unsafe { &*current.input.cast::<Input<'_>>() };
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at.checked_add(len).is_none_or(|end| end > frame.len()) {
            return Err(Fail::invalid(format!(
                "{len} bytes at offset {offset} run past the frame's {}-byte input",
                frame.len()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: non-null and `len` readable bytes per this function's contract.
        let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
        frame.write(at, bytes).map_err(Fail::from)
    })
}

/// Copies `len` bytes of the frame's result at `offset` into `dst`. Inside a result or
/// postprocess callback only.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback (kept past it, or
/// another thread's), a failed frame (no result), a NULL pointer, or a range past the
/// result's `len`.
///
/// # Safety
/// `output` is NULL, a view the library passed to a callback (even one that has returned, on
/// any thread), or points to a readable `udma_frame_output` (a copy of a view); `dst` to
/// `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_frame_output_read(
    output: *const udma_frame_output,
    offset: u64,
    dst: *mut c_void,
    len: usize,
) -> udma_status {
    call("udma_frame_output_read", || {
        if output.is_null() {
            return Err(Fail::null("output"));
        }
        if dst.is_null() && len > 0 {
            return Err(Fail::null("dst"));
        }
        let current = CURRENT.with(Cell::get);
        // SAFETY: as in `udma_frame_input_write`.
        if !unsafe { is_running(output, current.output_view, current.token, output_token) } {
            return Err(stale_view("output"));
        }
        if current.output.is_null() {
            return Err(Fail::invalid(format!(
                "frame {} failed on the device ({}) and has no result: check \
                 output->status first",
                current.frame,
                crate::queue::op_status(current.status).to_string_lossy()
            )));
        }
        // SAFETY: as in `udma_frame_input_write`: set by `finish` from a live `&Output` for
        // the running callback, cleared when it returns.
        let result = unsafe { &*current.output.cast::<Output<'_>>() };
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at.checked_add(len).is_none_or(|end| end > result.len()) {
            return Err(Fail::invalid(format!(
                "{len} bytes at offset {offset} run past the frame's {}-byte result",
                result.len()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        // SAFETY: non-null and `len` writable bytes per this function's contract.
        let bytes = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
        result.read(at, bytes).map_err(Fail::from)
    })
}
