//! Starting the loopback device: its cost model (`udma_cost_model`), its options
//! (`udma_loopback_options`), checked into its configuration.

use udma::Runtime;
use userdma_loopback::{self as loopback, LoopbackRuntime};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::{register, udma_device};
use crate::abi;
use crate::error::{call, udma_status, Fail};

/// The loopback device's cost model (`udma_loopback_options.cost_model`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_cost_model {
    /// A small NPU behind PCIe (the default): 12 GB/s DMA, 1 µs a descriptor, 6 GB/s compute,
    /// 20 µs a context switch; the engine holds each completion back until its modelled time.
    UDMA_COST_NPU = 0,
    /// No cost: the engine runs as fast as the host can and never waits (tests).
    UDMA_COST_ZERO = 1,
}

/// `udma_loopback_options.flags`: pin the engine to `engine_cpu`.
pub const UDMA_LOOPBACK_PIN_ENGINE: u32 = 1;

/// How to start the loopback device. Zero is the default for every field: a zeroed struct with
/// `size` set is the default device.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_loopback_options {
    /// `sizeof(udma_loopback_options)`.
    pub size: usize,
    /// Bytes of device memory (BAR 2); 0: 64 MiB.
    pub memory_bytes: u64,
    /// Queues (and interrupt vectors), 1 to 32; 0: 4.
    pub queues: u32,
    /// A `udma_cost_model`; 0: `UDMA_COST_NPU`.
    pub cost_model: u32,
    /// The largest queue depth the device accepts (a power of two); 0: 4096.
    pub max_depth: u32,
    /// The device's DMA mask width, 12 to 64; 0: 48.
    pub dma_mask_bits: u32,
    /// `UDMA_LOOPBACK_PIN_ENGINE` or 0.
    pub flags: u32,
    /// With `UDMA_LOOPBACK_PIN_ENGINE`: the CPU the engine runs on.
    pub engine_cpu: u32,
}

abi::sized!(udma_loopback_options);

fn loopback_config(o: &udma_loopback_options) -> Result<loopback::Config, Fail> {
    let mut config = loopback::Config::default();
    if o.memory_bytes != 0 {
        let bytes = usize::try_from(o.memory_bytes)
            .map_err(|_| Fail::invalid(format!("memory_bytes {} is too large", o.memory_bytes)))?;
        config = config.memory_size(bytes);
    }
    if o.queues != 0 {
        let queues = u16::try_from(o.queues)
            .map_err(|_| Fail::invalid(format!("queues {} is above 32", o.queues)))?;
        config = config.queues(queues);
    }
    config = match o.cost_model {
        x if x == udma_cost_model::UDMA_COST_NPU as u32 => config.cost(loopback::Cost::npu()),
        x if x == udma_cost_model::UDMA_COST_ZERO as u32 => config.cost(loopback::Cost::zero()),
        other => {
            return Err(Fail::invalid(format!(
                "cost_model {other} is not a udma_cost_model (UDMA_COST_NPU 0, UDMA_COST_ZERO 1)"
            )))
        }
    };
    if o.max_depth != 0 {
        config = config.max_depth(o.max_depth);
    }
    if o.dma_mask_bits != 0 {
        config = config.dma_mask_bits(o.dma_mask_bits);
    }
    if o.flags & !UDMA_LOOPBACK_PIN_ENGINE != 0 {
        return Err(Fail::invalid(format!(
            "flags {:#x} has bits that are not UDMA_LOOPBACK_* flags",
            o.flags
        )));
    }
    if o.flags & UDMA_LOOPBACK_PIN_ENGINE != 0 {
        config = config.engine_cpu(o.engine_cpu);
    }
    Ok(config)
}

/// Starts a loopback device (`options` may be NULL: the defaults) and returns it in `*device`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an option out of range (the message names it),
/// `UDMA_ERR_SYSTEM` if the engine does not start.
///
/// # Safety
/// `options` is NULL or points to `options->size` readable bytes; `device` points to a
/// writable `udma_device *`.
#[no_mangle]
pub unsafe extern "C" fn udma_device_open_loopback(
    options: *const udma_loopback_options,
    device: *mut *mut udma_device,
) -> udma_status {
    call("udma_device_open_loopback", || {
        let out = abi::out(device, "device")?;
        let options = if options.is_null() {
            udma_loopback_options::default()
        } else {
            // SAFETY: non-null, and readable per this function's contract.
            unsafe { abi::read(options, "options", udma_loopback_options::default())? }
        };
        let config = loopback_config(&options)?;
        let runtime = Runtime::loopback(config).map_err(Fail::from)?;
        register(runtime, out)
    })
}
