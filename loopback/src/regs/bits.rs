//! The register map's flag registers: the bits of the device's `status` and `control`, a
//! queue's `control` and `status`, the fault block's `control`, and the activity block's
//! `control` and per-unit `status`, each a `bitflags` type that
//! is a register [`Value`] keeping unknown bits.

use userdma::mmio::Value;

/// Implements [`Value`] for a `bitflags` type over `u32`, keeping unknown bits.
macro_rules! u32_value {
    ($($ty:ty),*) => {$(
        impl Value for $ty {
            type Raw = u32;
            fn from_raw(raw: u32) -> Self {
                <$ty>::from_bits_retain(raw)
            }
            fn to_raw(self) -> u32 {
                self.bits()
            }
        }
    )*};
}

bitflags::bitflags! {
    /// [`GlobalRegs::status`](super::GlobalRegs::status).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct DeviceStatus: u32 {
        /// The engine is running and accepts work.
        const READY = 1 << 0;
    }

    /// [`GlobalRegs::control`](super::GlobalRegs::control).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Control: u32 {
        /// Reset the device: every queue stopped and its registers zeroed, vectors unmasked and
        /// nothing pending, counters zeroed, device memory zeroed, activity records disabled and
        /// their registers zeroed; then `reset_count` increments.
        const RESET = 1 << 0;
    }

    /// [`QueueRegs::control`](super::QueueRegs::control).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct QueueControl: u32 {
        /// Serve the queue.
        const ENABLE = 1 << 0;
    }

    /// [`FaultRegs::control`](super::FaultRegs::control).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FaultControl: u32 {
        /// Program the selected queue with the fault registers.
        const APPLY = 1 << 0;
        /// Remove the selected queue's programme.
        const CLEAR = 1 << 1;
    }

    /// [`ActivityRegs::control`](super::ActivityRegs::control).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ActivityControl: u32 {
        /// Write activity records (each unit acknowledges in its own `status`).
        const ENABLE = 1 << 0;
    }

    /// [`ActivityUnitRegs::status`](super::ActivityUnitRegs::status).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ActivityStatus: u32 {
        /// The unit writes a record per descriptor it completes (acknowledges `ENABLE`;
        /// cleared once it has stopped writing records after `ENABLE` was cleared).
        const ENABLED = 1 << 0;
        /// The unit stopped writing records on an error
        /// ([`ActivityUnitRegs::fault`](super::ActivityUnitRegs::fault) says which); clear
        /// `ENABLE` to acknowledge.
        const FAULT = 1 << 1;
    }

    /// [`QueueRegs::status`](super::QueueRegs::status).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct QueueStatus: u32 {
        /// The engine serves the queue (acknowledges `ENABLE`; cleared once it has stopped
        /// touching the queue's memory after `ENABLE` was cleared).
        const ENABLED = 1 << 0;
        /// The queue stopped on an error ([`QueueRegs::fault`](super::QueueRegs::fault) says
        /// which); clear `ENABLE` to acknowledge.
        const FAULT = 1 << 1;
    }
}

u32_value!(
    DeviceStatus,
    Control,
    QueueControl,
    QueueStatus,
    FaultControl,
    ActivityControl,
    ActivityStatus
);
