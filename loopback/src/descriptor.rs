//! Typed descriptors for the loopback device: [`Descriptor`] builds a [`Command`] from an
//! [`Opcode`] and typed addresses ([`Iova`] for host memory, [`DeviceOffset`] for device
//! memory), so a caller never writes `opcode as u8` or swaps a host address for a device one;
//! [`Status::loopback_code`] reads a completion's code back as a [`Code`].
//!
//! The format itself, every field and the order of the device's checks, is documented on
//! [`Opcode`] and [`Code`]; the layout on [`Command`] and [`Status`].

use super::regs::{Opcode, StatusCode};
use userdma::dma::{DeviceOffset, Iova};
use userdma::ring::{Command, Status};

/// A descriptor the format cannot express (the device checks everything else itself).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A layer has 1 to 3 inputs.
    #[error("a layer descriptor has 1 to 3 inputs, not {count}")]
    LayerInputs {
        /// The inputs given.
        count: usize,
    },
    /// A layer input's length is 0 (that marks an absent input) or does not fit its 32 bits.
    #[error("layer input {index} is {len} bytes: expected 1 to u32::MAX")]
    LayerInputLength {
        /// Which input.
        index: usize,
        /// Its length.
        len: u64,
    },
}

/// A loopback descriptor under construction (io-uring's opcode-builder habit): one constructor
/// per [`Opcode`], then the optional context, then [`Descriptor::build`] (or `Command::from`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    command: Command,
}

impl Descriptor {
    fn new(opcode: Opcode, src: u64, dst: u64, len: u64) -> Descriptor {
        Descriptor {
            command: Command {
                opcode: opcode as u8,
                src,
                dst,
                len,
                ..Command::default()
            },
        }
    }

    /// Does nothing (a fence in the queue's order, or a probe).
    pub fn nop() -> Descriptor {
        Descriptor::new(Opcode::Nop, 0, 0, 0)
    }

    /// Copies `len` bytes from host memory at `src` into device memory at `dst`.
    pub fn to_device(src: Iova, dst: DeviceOffset, len: u64) -> Descriptor {
        Descriptor::new(Opcode::ToDevice, src.raw(), dst.raw(), len)
    }

    /// Copies `len` bytes from device memory at `src` into host memory at `dst`.
    pub fn to_host(src: DeviceOffset, dst: Iova, len: u64) -> Descriptor {
        Descriptor::new(Opcode::ToHost, src.raw(), dst.raw(), len)
    }

    /// Copies `len` bytes within device memory (the ranges may overlap).
    pub fn device_copy(src: DeviceOffset, dst: DeviceOffset, len: u64) -> Descriptor {
        Descriptor::new(Opcode::DeviceCopy, src.raw(), dst.raw(), len)
    }

    /// Sets `len` bytes of device memory at `dst` to `byte`.
    pub fn fill(dst: DeviceOffset, len: u64, byte: u8) -> Descriptor {
        let mut d = Descriptor::new(Opcode::Fill, 0, dst.raw(), len);
        d.command.args[0] = u64::from(byte);
        d
    }

    /// The compute pass: each 32-bit word `w` of the `len` bytes at `src` becomes
    /// `(w ^ xor).wrapping_add(add)` at `dst` (all multiples of 4; `src == dst` computes in
    /// place). The completion's result is the wrapping sum of the words written.
    pub fn compute(
        src: DeviceOffset,
        dst: DeviceOffset,
        len: u64,
        xor: u32,
        add: u32,
    ) -> Descriptor {
        let mut d = Descriptor::new(Opcode::Compute, src.raw(), dst.raw(), len);
        d.command.args[0] = u64::from(xor);
        d.command.args[1] = u64::from(add);
        d
    }

    /// A model layer ([`Opcode::Layer`]): `len` bytes of output at `out` mixed from `inputs`
    /// (1 to 3 `(offset, length)` pairs, each length 1 to `u32::MAX`) with layer seed `seed`.
    /// Alignment, bounds and overlap are the device's checks (an error completion).
    pub fn layer(
        inputs: &[(DeviceOffset, u64)],
        out: DeviceOffset,
        len: u64,
        seed: u32,
    ) -> Result<Descriptor, BuildError> {
        if inputs.is_empty() || inputs.len() > 3 {
            return Err(BuildError::LayerInputs {
                count: inputs.len(),
            });
        }
        let mut fields = [(0u64, 0u64); 3];
        for (index, (&(offset, len), field)) in inputs.iter().zip(&mut fields).enumerate() {
            if len == 0 || len > u64::from(u32::MAX) {
                return Err(BuildError::LayerInputLength { index, len });
            }
            *field = (offset.raw(), len);
        }
        let [(src, len0), (off1, len1), (off2, len2)] = fields;
        let mut d = Descriptor::new(Opcode::Layer, src, out.raw(), len);
        d.command.args = [off1, off2, len0 | len1 << 32, len2 | u64::from(seed) << 32];
        Ok(d)
    }

    /// Result filtering ([`Opcode::Compact`]): of the `len` bytes of `record`-byte records at
    /// `src`, the ones whose `u32` score at byte `score_at` is at least `threshold`, at most
    /// `capacity` of them, packed after a count header at `dst` (see
    /// [`reference::compact`](super::reference::compact)).
    pub fn compact(
        src: DeviceOffset,
        len: u64,
        record: u32,
        score_at: u32,
        threshold: u32,
        dst: DeviceOffset,
        capacity: u32,
    ) -> Descriptor {
        let mut d = Descriptor::new(Opcode::Compact, src.raw(), dst.raw(), len);
        d.command.args = [record, score_at, threshold, capacity].map(u64::from);
        d
    }

    /// Waits until queue `queue` of the device has completed at least `count` descriptors
    /// ([`Opcode::Wait`]): the queue holding it serves nothing after it until then, and then
    /// sees everything that queue's unit wrote to device memory before. The completion's
    /// result is the count seen.
    pub fn wait(queue: u16, count: u64) -> Descriptor {
        let mut d = Descriptor::new(Opcode::Wait, 0, 0, 0);
        d.command.args[0] = u64::from(queue);
        d.command.args[1] = count;
        d
    }

    /// Runs in device context `context` (it must be the queue's: a descriptor naming another
    /// completes with [`StatusCode::BadContext`]). The default is 0.
    pub fn context(mut self, context: u32) -> Descriptor {
        self.command.context = context;
        self
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        // Every constructor stores an `Opcode`.
        Opcode::from_raw(self.command.opcode).unwrap_or(Opcode::Nop)
    }

    /// The descriptor.
    pub fn build(self) -> Command {
        self.command
    }
}

impl From<Descriptor> for Command {
    fn from(descriptor: Descriptor) -> Command {
        descriptor.build()
    }
}

/// A completion's code read as the loopback device defines it: bring the trait into scope
/// (`use userdma_loopback::LoopbackStatus;`) and ask any [`Status`] for its
/// [`loopback_code`](LoopbackStatus::loopback_code).
pub trait LoopbackStatus {
    /// The completion's code as the loopback device defines it, or the raw value if it is not
    /// one of its codes (a completion from another device format).
    fn loopback_code(&self) -> Result<StatusCode, u16>;
}

impl LoopbackStatus for Status {
    fn loopback_code(&self) -> Result<StatusCode, u16> {
        StatusCode::from_raw(self.code()).ok_or(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builder_fills_the_fields_its_opcode_documents() {
        let c = Descriptor::to_device(Iova(0x1000), DeviceOffset(0x40), 64)
            .context(3)
            .build();
        assert_eq!(
            (c.opcode, c.src, c.dst, c.len, c.context),
            (Opcode::ToDevice as u8, 0x1000, 0x40, 64, 3)
        );
        let c = Descriptor::to_host(DeviceOffset(0x40), Iova(0x2000), 8).build();
        assert_eq!(
            (c.opcode, c.src, c.dst),
            (Opcode::ToHost as u8, 0x40, 0x2000)
        );
        let c = Descriptor::fill(DeviceOffset(8), 16, 0xab).build();
        assert_eq!((c.src, c.dst, c.args[0]), (0, 8, 0xab));
        let c = Descriptor::compute(DeviceOffset(0), DeviceOffset(4), 4, 7, 9).build();
        assert_eq!(c.args, [7, 9, 0, 0]);
        let c = Descriptor::layer(
            &[(DeviceOffset(0x10), 8), (DeviceOffset(0x20), 4)],
            DeviceOffset(0x40),
            16,
            0xabcd,
        )
        .unwrap()
        .build();
        assert_eq!(
            (c.opcode, c.src, c.dst, c.len),
            (Opcode::Layer as u8, 0x10, 0x40, 16)
        );
        assert_eq!(c.args, [0x20, 0, 8 | 4 << 32, 0xabcd << 32]);
        let c = Descriptor::layer(
            &[
                (DeviceOffset(4), 4),
                (DeviceOffset(8), 8),
                (DeviceOffset(12), 12),
            ],
            DeviceOffset(0),
            4,
            u32::MAX,
        )
        .unwrap()
        .build();
        assert_eq!(c.args, [8, 12, 4 | 8 << 32, 12 | 0xffff_ffff << 32]);
        let c =
            Descriptor::compact(DeviceOffset(0x100), 64, 16, 4, 77, DeviceOffset(0x200), 3).build();
        assert_eq!(
            (c.opcode, c.src, c.dst, c.len, c.args),
            (Opcode::Compact as u8, 0x100, 0x200, 64, [16, 4, 77, 3])
        );
        let c = Descriptor::wait(2, 1 << 40).build();
        assert_eq!(
            (c.opcode, c.src, c.dst, c.len, c.args),
            (Opcode::Wait as u8, 0, 0, 0, [2, 1 << 40, 0, 0])
        );
        let c = Descriptor::device_copy(DeviceOffset(1), DeviceOffset(2), 3);
        assert_eq!(c.opcode(), Opcode::DeviceCopy);
        assert_eq!(Command::from(Descriptor::nop()), Command::default());
    }

    #[test]
    fn layer_builder_refuses_what_the_format_cannot_say() {
        let input = (DeviceOffset(0), 4);
        assert_eq!(
            Descriptor::layer(&[], DeviceOffset(0), 4, 0),
            Err(BuildError::LayerInputs { count: 0 })
        );
        assert_eq!(
            Descriptor::layer(&[input; 4], DeviceOffset(0), 4, 0),
            Err(BuildError::LayerInputs { count: 4 })
        );
        assert_eq!(
            Descriptor::layer(&[input, (DeviceOffset(8), 0)], DeviceOffset(0), 4, 0),
            Err(BuildError::LayerInputLength { index: 1, len: 0 })
        );
        assert_eq!(
            Descriptor::layer(&[(DeviceOffset(0), 1 << 32)], DeviceOffset(0), 4, 0),
            Err(BuildError::LayerInputLength {
                index: 0,
                len: 1 << 32
            })
        );
    }

    #[test]
    fn status_codes_read_back_typed() {
        assert_eq!(
            Status::new(1, 0, 0).loopback_code(),
            Ok(StatusCode::Success)
        );
        assert_eq!(
            Status::new(1, 9, 0).loopback_code(),
            Ok(StatusCode::HostUnmapped)
        );
        assert_eq!(Status::new(1, 999, 0).loopback_code(), Err(999));
    }
}
