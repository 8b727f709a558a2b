//! Ops (`udma_op`, `udma_opcode`): one descriptor as C gives it, checked into the loopback
//! device's descriptor.

use udma::dma::{DeviceOffset, Iova};
use userdma_loopback::Descriptor;

use crate::abi;
use crate::error::Fail;
use crate::memory::udma_buffer;

/// What an op does (`udma_op.opcode`): the loopback device's opcodes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_opcode {
    /// Nothing (a marker in the queue's order).
    UDMA_OP_NOP = 0,
    /// Host to device: `len` bytes of `buffer` at `buffer_offset` to device memory at
    /// `device_offset`.
    UDMA_OP_TO_DEVICE = 1,
    /// Device to host: `len` bytes of device memory at `device_offset` into `buffer` at
    /// `buffer_offset`.
    UDMA_OP_TO_HOST = 2,
    /// `len` bytes within device memory, from `device_src` to `device_offset`.
    UDMA_OP_DEVICE_COPY = 3,
    /// `len` bytes of device memory at `device_offset` set to the byte `arg0`.
    UDMA_OP_FILL = 4,
    /// Each 32-bit word `w` of the `len` bytes at `device_src` becomes `(w ^ arg0) + arg1` at
    /// `device_offset` (all multiples of 4); the completion's result is the sum of the words
    /// written.
    UDMA_OP_COMPUTE = 5,
    /// Waits until queue `arg0` of the device has completed `arg1` descriptors.
    UDMA_OP_WAIT = 6,
    /// A model layer: `len` bytes of output at `device_offset` from up to three input tensors
    /// in device memory: input 0 at `device_src`, `arg0` bytes (required); input 1 at `arg1`,
    /// `arg2` bytes; input 2 at `arg3`, `arg4` bytes (a length of 0: the input is absent, and
    /// its offset must be 0; input 2 only with input 1); the layer's seed in `arg5` (32 bits).
    /// Output word `j` (little-endian `u32`) is `mix(seed, j, w_0, w_1, ...)` of word
    /// `j mod words_k` of each present input `k` (a shorter input repeats), where `mix` starts
    /// from `h = seed ^ (j * 0x9e3779b9)` and takes each word `w` as
    /// `h = rotl32((h ^ w) * 0x85ebca6b, 13)` (all 32-bit). Every offset and length a multiple
    /// of 4 (else the completion says `misaligned`), the output overlapping no input (else
    /// `overlap`). The completion's result is the wrapping 64-bit sum of the output words.
    UDMA_OP_LAYER = 7,
    /// Result filtering: of the `len` bytes at `device_src`, read as records of `arg0` bytes
    /// (4 to 4096, a multiple of 4; `len` a multiple of it), keeps those whose little-endian
    /// `u32` score at byte `arg1` of the record (a multiple of 4, inside it) is at least `arg2`;
    /// writes at `device_offset` (`8 + arg3 * arg0` bytes, overlapping no input) the `u32`
    /// count of survivors written (at most the capacity `arg3`), the `u32` count found
    /// (saturating), then the first survivors in input order, packed, and zeros in the slots
    /// left over. The completion's result is the count found. `arg0` to `arg3` are 32-bit.
    UDMA_OP_COMPACT = 8,
}

/// One descriptor to submit. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_op {
    /// `sizeof(udma_op)`.
    pub size: usize,
    /// A `udma_opcode`.
    pub opcode: u32,
    /// The device context (the queue's).
    pub context: u32,
    /// The host buffer of `UDMA_OP_TO_DEVICE` / `UDMA_OP_TO_HOST` (NULL for the others). It
    /// moves into the queue, and comes back with the completion.
    pub buffer: *mut udma_buffer,
    /// Where in `buffer` the bytes start.
    pub buffer_offset: u64,
    /// The device-memory offset the op writes (reads, for `UDMA_OP_TO_HOST`).
    pub device_offset: u64,
    /// The device-memory offset `UDMA_OP_DEVICE_COPY` and `UDMA_OP_COMPUTE` read.
    pub device_src: u64,
    /// Bytes.
    pub len: u64,
    /// The op's first argument (see `udma_opcode`).
    pub arg0: u64,
    /// The op's second argument.
    pub arg1: u64,
    /// The caller's tag, handed back in the completion.
    pub user_data: u64,
    /// The op's third argument (`UDMA_OP_LAYER`, `UDMA_OP_COMPACT`; a program
    /// built with an older, smaller `udma_op` gets 0 here and below).
    pub arg2: u64,
    /// The op's fourth argument.
    pub arg3: u64,
    /// The op's fifth argument.
    pub arg4: u64,
    /// The op's sixth argument.
    pub arg5: u64,
}

impl Default for udma_op {
    fn default() -> udma_op {
        udma_op {
            size: 0,
            opcode: 0,
            context: 0,
            buffer: std::ptr::null_mut(),
            buffer_offset: 0,
            device_offset: 0,
            device_src: 0,
            len: 0,
            arg0: 0,
            arg1: 0,
            user_data: 0,
            arg2: 0,
            arg3: 0,
            arg4: 0,
            arg5: 0,
        }
    }
}

// SAFETY: `repr(C)`, integers and a raw pointer (any bit pattern is a valid raw pointer value;
// never dereferenced: a handle), 8 + 4 + 4 + 12 * 8 = 112 bytes with no padding.
unsafe impl abi::Bytes for udma_op {}
abi::sized!(udma_op);

pub(super) fn descriptor(op: &udma_op, iova: Option<u64>) -> Result<Descriptor, Fail> {
    let host = || Iova(iova.unwrap_or(0));
    let dev = DeviceOffset;
    let arg32 = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| Fail::invalid(format!("{what} {v:#x} does not fit 32 bits")))
    };
    let d = match op.opcode {
        0 => Descriptor::nop(),
        1 => Descriptor::to_device(host(), dev(op.device_offset), op.len),
        2 => Descriptor::to_host(dev(op.device_offset), host(), op.len),
        3 => Descriptor::device_copy(dev(op.device_src), dev(op.device_offset), op.len),
        4 => {
            let byte = u8::try_from(op.arg0).map_err(|_| {
                Fail::invalid(format!("fill byte (arg0) {:#x} is above 0xff", op.arg0))
            })?;
            Descriptor::fill(dev(op.device_offset), op.len, byte)
        }
        5 => Descriptor::compute(
            dev(op.device_src),
            dev(op.device_offset),
            op.len,
            arg32(op.arg0, "xor (arg0)")?,
            arg32(op.arg1, "add (arg1)")?,
        ),
        6 => {
            let q = u16::try_from(op.arg0)
                .map_err(|_| Fail::invalid(format!("queue (arg0) {} is out of range", op.arg0)))?;
            Descriptor::wait(q, op.arg1)
        }
        7 => layer(op)?,
        8 => Descriptor::compact(
            dev(op.device_src),
            op.len,
            arg32(op.arg0, "record size (arg0)")?,
            arg32(op.arg1, "score offset (arg1)")?,
            arg32(op.arg2, "threshold (arg2)")?,
            dev(op.device_offset),
            arg32(op.arg3, "capacity (arg3)")?,
        ),
        other => {
            return Err(Fail::invalid(format!(
                "opcode {other} is not a udma_opcode (0 to 8)"
            )))
        }
    };
    Ok(d.context(op.context))
}

/// The `UDMA_OP_LAYER` descriptor of `op`: inputs `(device_src, arg0)`, `(arg1, arg2)`,
/// `(arg3, arg4)`, seed `arg5`. What the format cannot say is refused here; alignment, bounds
/// and overlap are the device's checks (an error completion).
fn layer(op: &udma_op) -> Result<Descriptor, Fail> {
    let given = [
        (op.device_src, op.arg0, "input 0 (device_src, arg0)"),
        (op.arg1, op.arg2, "input 1 (arg1, arg2)"),
        (op.arg3, op.arg4, "input 2 (arg3, arg4)"),
    ];
    let mut inputs = Vec::with_capacity(3);
    for (index, &(offset, len, what)) in given.iter().enumerate() {
        if len == 0 {
            if index == 0 {
                return Err(Fail::invalid(format!(
                    "{what} has length 0: a layer needs input 0"
                )));
            }
            if offset != 0 {
                return Err(Fail::invalid(format!(
                    "{what} has length 0 (absent) but offset {offset:#x}: an absent input's \
                     offset is 0"
                )));
            }
            continue;
        }
        if inputs.len() != index {
            return Err(Fail::invalid(format!(
                "{what} is given without input {}: inputs are filled in order",
                index - 1
            )));
        }
        inputs.push((DeviceOffset(offset), len));
    }
    let seed = u32::try_from(op.arg5)
        .map_err(|_| Fail::invalid(format!("seed (arg5) {:#x} does not fit 32 bits", op.arg5)))?;
    Descriptor::layer(&inputs, DeviceOffset(op.device_offset), op.len, seed)
        .map_err(|e| Fail::invalid(format!("{e}")))
}
