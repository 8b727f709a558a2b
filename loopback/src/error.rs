//! What goes wrong in the loopback device: [`Error`].

use std::io;
use std::path::PathBuf;

use super::regs::{ActivityFault, Fault, Unit};

/// What went wrong in the loopback device (converts into [`device::Error`](userdma::device::Error)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration value out of range.
    #[error(
        "loopback device configuration: {field} = {value} is out of range (expected {expected})"
    )]
    Config {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: u64,
        /// What is accepted.
        expected: &'static str,
    },

    /// The device stopped a queue on a fault.
    #[error("queue {queue} faulted: {fault}")]
    QueueFault {
        /// The queue.
        queue: u16,
        /// Why.
        fault: Fault,
    },

    /// A unit refused the activity buffer it was given (records stay off).
    #[error("the {unit:?} unit refused the activity buffer: {fault} (give it host memory mapped read-write into the device's DMA space, 64-byte aligned, both units' rings in one mapping: activity::Log does)")]
    ActivityFault {
        /// The unit.
        unit: Unit,
        /// Why.
        fault: ActivityFault,
    },

    /// The device's engine is not running (stopped, or its process exited).
    #[error("the device's engine is not running{}", exit_detail(.exit))]
    Stopped {
        /// How the device process ended (an out-of-process device whose process exited).
        exit: Option<std::process::ExitStatus>,
    },

    /// Starting the engine thread failed.
    #[error("starting the loopback engine thread failed")]
    Thread {
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Starting the device process failed.
    #[error("starting the loopback device process {program:?} failed: pass the `userdma` binary (or any program that runs `device::loopback::serve_process`) in loopback::Mode::Process")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// Talking to the device process failed.
    #[error("{operation} over the device process's control socket failed")]
    Control {
        /// What was being done.
        operation: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },

    /// The device process answered something malformed.
    #[error("the device process's reply to {operation} is malformed: {defect}")]
    Protocol {
        /// What was being done.
        operation: &'static str,
        /// What is wrong.
        defect: &'static str,
    },

    /// This process was started as a device process without the control socket.
    #[error("this process was not started as a loopback device process: {variable} is {defect} (it is set by loopback::Mode::Process)")]
    NotDeviceProcess {
        /// The environment variable.
        variable: &'static str,
        /// What is wrong with it.
        defect: &'static str,
    },
}

impl Error {
    /// The kind of failure, as a stable [`Code`](userdma::Code). Exhaustive: a new variant
    /// must be given its code here.
    pub fn code(&self) -> userdma::Code {
        use userdma::Code;
        match self {
            // A setting, or the environment `serve_process` was started with, is wrong.
            Error::Config { .. } | Error::NotDeviceProcess { .. } => Code::InvalidArgument,
            // The host gave the device a buffer it cannot write.
            Error::ActivityFault { .. } => Code::InvalidArgument,
            Error::QueueFault { .. } | Error::Stopped { .. } | Error::Protocol { .. } => {
                Code::Device
            }
            // A thread, a process, or a control-socket call (or the call the device process
            // made for it, its errno sent back) failed.
            Error::Thread { .. } | Error::Spawn { .. } | Error::Control { .. } => Code::System,
        }
    }
}

/// ` (its process exited ...)` when known.
fn exit_detail(exit: &Option<std::process::ExitStatus>) -> String {
    exit.as_ref()
        .map_or_else(String::new, |exit| format!(" (its process ended: {exit})"))
}

impl Error {
    /// The loopback device's error inside a driver device error
    /// ([`device::Error::Backend`](userdma::device::Error::Backend)), if that is what it is.
    pub fn of(error: &userdma::device::Error) -> Option<&Error> {
        match error {
            userdma::device::Error::Backend(backend) => backend.downcast_ref::<Error>(),
            _ => None,
        }
    }

    /// [`Error::of`] by value: the loopback device's error, or the device error back.
    ///
    /// # Errors
    /// `error` itself when it is not a loopback device's error.
    pub fn from_device(error: userdma::device::Error) -> Result<Error, userdma::device::Error> {
        match error {
            userdma::device::Error::Backend(backend) => backend
                .downcast::<Error>()
                .map_err(userdma::device::Error::Backend),
            other => Err(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::Error;
    use userdma::{device, Code};

    /// The device's errors keep their codes through the driver's errors, and come back by type.
    #[test]
    fn errors_keep_their_codes_through_the_drivers_and_come_back() {
        let table = [
            (
                Error::NotDeviceProcess {
                    variable: "X",
                    defect: "unset",
                },
                Code::InvalidArgument,
            ),
            (
                Error::Control {
                    operation: "MAP",
                    source: io::Error::from_raw_os_error(libc::ENOMEM),
                },
                Code::System,
            ),
        ];
        for (e, code) in table {
            let message = e.to_string();
            let device: device::Error = e.into();
            assert_eq!(device.code(), code, "{device:?}");
            assert_eq!(device.to_string(), message);
            assert!(Error::of(&device).is_some(), "{device:?}");
            let driver: userdma::Error = device.into();
            assert_eq!(driver.code(), code);
            let userdma::Error::Device(device) = driver else {
                panic!("{driver:?}");
            };
            assert!(Error::from_device(device).is_ok());
        }
        let other = device::Error::QueueBusy { queue: 1 };
        assert!(Error::of(&other).is_none());
        assert!(Error::from_device(other).is_err());
    }
}
