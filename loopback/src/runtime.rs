//! The loopback NPU on the driver's runtime ([`LoopbackRuntime`]).

use std::sync::Arc;

use userdma::device::Wait;
use userdma::{ring, Error, Runtime};

use crate::{Config, Loopback, NpuFormat, Queue, Unit};

/// The loopback NPU on the driver's [`Runtime`]: [`LoopbackRuntime`] starts a device and owns
/// it (`Runtime::loopback(config)`), opens queues in the device's own queue format
/// (`runtime.queue(config)`, [`NpuFormat`]) and gives the device back for what only it has
/// (`runtime.loopback_device()`: counters, faults, device memory). Bring the trait into scope
/// (`use userdma_loopback::LoopbackRuntime;`) and the runtime reads as if these were its own.
///
/// ```
/// use std::time::Duration;
/// use userdma::dma::DeviceOffset;
/// use userdma::memory::PageSize;
/// use userdma::{ring, Runtime};
/// use userdma_loopback::{self as loopback, Descriptor, LoopbackRuntime};
///
/// # fn main() -> Result<(), userdma::Error> {
/// let runtime = Runtime::loopback(loopback::Config::default())?;
/// let pool = runtime.pool(4 << 20, PageSize::Base)?;
/// let mut queue = runtime.queue(ring::Config::new(64))?;
///
/// let buffer = pool.alloc_owned(4096)?;
/// buffer.write(0, b"hello, device")?;
/// let to_device = Descriptor::to_device(buffer.iova(), DeviceOffset(0), 13);
/// queue.submit(to_device.build(), buffer)?;
/// let done = queue.wait(Some(Duration::from_secs(5)))?;
/// assert!(done.entry.is_success());
/// # Ok(())
/// # }
/// ```
pub trait LoopbackRuntime: Sized {
    /// Starts a loopback device (in a thread or a child process, as `config` says) and owns it.
    ///
    /// # Errors
    /// [`Error::Device`] if the device does not start (a bad configuration, the engine CPU).
    fn loopback(config: Config) -> Result<Self, Error>;

    /// The device as the loopback device, when it is one (its counters, faults, device
    /// memory).
    fn loopback_device(&self) -> Option<&Arc<Loopback>>;

    /// Opens queue `config.id()` in the loopback device's queue format ([`NpuFormat`]:
    /// [`Command`](ring::Command) / [`Status`](ring::Status)) on its copy engine, waiting on
    /// its interrupt. Payloads are [`OwnedBuffer`](userdma::pool::OwnedBuffer)s; for other
    /// payloads or for polling use [`LoopbackRuntime::queue_with`].
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a runtime whose device is not the loopback device (open its
    /// queues with [`Runtime::open_queue`] and its driver's queue format); otherwise as
    /// [`userdma::device::open_queue`].
    fn queue(&self, config: ring::Config) -> Result<Queue, Error> {
        self.queue_with(config, Wait::Interrupt)
    }

    /// [`LoopbackRuntime::queue`] with any payload type and either way of waiting.
    ///
    /// # Errors
    /// As [`LoopbackRuntime::queue`].
    fn queue_with<T: Send>(&self, config: ring::Config, wait: Wait) -> Result<Queue<T>, Error> {
        self.queue_on(config, wait, Unit::Copy)
    }

    /// [`LoopbackRuntime::queue_with`] on a queue served by `unit` of the loopback device (its
    /// copy engine or its compute unit, which run concurrently).
    ///
    /// # Errors
    /// As [`LoopbackRuntime::queue`].
    fn queue_on<T: Send>(
        &self,
        config: ring::Config,
        wait: Wait,
        unit: Unit,
    ) -> Result<Queue<T>, Error>;
}

impl LoopbackRuntime for Runtime {
    fn loopback(config: Config) -> Result<Runtime, Error> {
        let device = Arc::new(Loopback::new(config)?);
        Ok(Runtime::from_concrete(device))
    }

    fn loopback_device(&self) -> Option<&Arc<Loopback>> {
        self.device_as::<Loopback>()
    }

    fn queue_on<T: Send>(
        &self,
        config: ring::Config,
        wait: Wait,
        unit: Unit,
    ) -> Result<Queue<T>, Error> {
        let device = self.loopback_device().ok_or_else(|| Error::Unsupported {
            device: self.device().identity().to_string(),
            what: "built-in queue format",
            hint: "open its queues with Runtime::open_queue and the device::QueueFormat of its driver",
        })?;
        self.open_queue(NpuFormat::new(Arc::clone(device)).unit(unit), config, wait)
    }
}
