//! The frame views callbacks get (`udma_frame_input`, `udma_frame_output`): this thread's
//! running callback and its token, running a fill or result callback, refusing a re-entering
//! call, and writing a frame's input or reading its result through a view.

use std::cell::Cell;
use std::ffi::c_void;

use userdma_infer::pipeline::{Finished, Input, Output};

use crate::error::{call, udma_status, Fail};

/// A frame's input, inside a fill or preprocess callback: write it with
/// `udma_frame_input_write`. Valid for that callback only.
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
    /// The library's check that the view belongs to the running callback.
    pub token: u64,
}

/// A finished frame, inside a result or postprocess callback: read its result with
/// `udma_frame_output_read`. Valid for that callback only.
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
    /// The library's check that the view belongs to the running callback.
    pub token: u64,
}

/// What the running callback on this thread may touch: its frame's input or output, under a
/// token; plus how deep in callbacks the thread is.
#[derive(Clone, Copy)]
struct Current {
    token: u64,
    input: *const (),
    output: *const (),
    depth: u32,
}

thread_local! {
    static CURRENT: Cell<Current> = const {
        Cell::new(Current {
            token: 0,
            input: std::ptr::null(),
            output: std::ptr::null(),
            depth: 0,
        })
    };
    static TOKENS: Cell<u64> = const { Cell::new(0) };
}

/// Restores the thread's previous callback state when the callback returns (or unwinds).
struct InCallback(Current);

impl Drop for InCallback {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

/// Marks the thread as inside a callback with `input` or `output` as its frame; returns the
/// view's token and the guard that ends it.
fn enter(input: Option<&Input<'_>>, output: Option<&Output<'_>>) -> (u64, InCallback) {
    let token = TOKENS.with(|t| {
        let next = t.get().wrapping_add(1).max(1);
        t.set(next);
        next
    });
    let previous = CURRENT.with(|c| {
        let previous = c.get();
        c.set(Current {
            token,
            input: input.map_or(std::ptr::null(), |i| std::ptr::from_ref(i).cast()),
            output: output.map_or(std::ptr::null(), |o| std::ptr::from_ref(o).cast()),
            depth: previous.depth + 1,
        });
        previous
    });
    (token, InCallback(previous))
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

/// Runs the C fill or preprocess callback `f` on `input` (frame `frame`).
pub(crate) fn fill(input: &Input<'_>, frame: u64, f: impl FnOnce(*mut udma_frame_input)) {
    let (token, _guard) = enter(Some(input), None);
    let mut view = udma_frame_input {
        size: std::mem::size_of::<udma_frame_input>(),
        frame,
        len: input.len() as u64,
        token,
    };
    f(&mut view);
}

/// Runs the C result or postprocess callback `f` on `done`.
pub(crate) fn finish(done: &Finished<'_>, f: impl FnOnce(*const udma_frame_output)) {
    let t = &done.times;
    let latency = t.to_host.saturating_duration_since(t.preprocess);
    let (output, status, step, fault) = match &done.result {
        Ok(out) => (Some(out), 0, 0, 0),
        Err(e) => (None, e.code, u32::from(e.step), e.result),
    };
    let (token, _guard) = enter(None, output);
    let view = udma_frame_output {
        size: std::mem::size_of::<udma_frame_output>(),
        frame: done.frame,
        len: output.map_or(0, |o| o.len() as u64),
        latency_ns: u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX),
        fault,
        status,
        step,
        token,
    };
    f(&view);
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
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback, a NULL pointer, or a
/// range past the input's `len`.
///
/// # Safety
/// `input` is NULL or points to a readable `udma_frame_input`; `src` to `len` readable bytes.
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
        // SAFETY: non-null and readable per this function's contract; unaligned for safety.
        let token = unsafe { std::ptr::addr_of!((*input).token).read_unaligned() };
        let current = CURRENT.with(Cell::get);
        if current.token != token || current.input.is_null() {
            return Err(stale_view("input"));
        }
        // SAFETY: `current.input` was set by `enter` from a live `&Input` for the callback
        // running now on this thread (the token matches), which outlives this call; the guard
        // clears it when the callback returns.
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
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a view outside its callback, a failed frame (no
/// result), a NULL pointer, or a range past the result's `len`.
///
/// # Safety
/// `output` is NULL or points to a readable `udma_frame_output`; `dst` to `len` writable bytes.
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
        // SAFETY: non-null and readable per this function's contract; unaligned for safety.
        let (token, frame, status) = unsafe {
            (
                std::ptr::addr_of!((*output).token).read_unaligned(),
                std::ptr::addr_of!((*output).frame).read_unaligned(),
                std::ptr::addr_of!((*output).status).read_unaligned(),
            )
        };
        let current = CURRENT.with(Cell::get);
        if current.token != token {
            return Err(stale_view("output"));
        }
        if current.output.is_null() {
            return Err(Fail::invalid(format!(
                "frame {frame} failed on the device ({}) and has no result: check \
                 output->status first",
                crate::queue::op_status(status).to_string_lossy()
            )));
        }
        // SAFETY: as in `udma_frame_input_write`: set from a live `&Output` for the running
        // callback, cleared when it returns.
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
