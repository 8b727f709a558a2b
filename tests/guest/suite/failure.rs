//! Why a case failed: the operation that went wrong and the library error it got, or a check
//! whose expectation was not met.

use std::error::Error as _;
use std::io;

use userdma::{device, dma, irq, memory, mmio, pci, pool};

/// A case's failure. The operation text names the device, path, address or size involved; the
/// library's error is kept as the source, and [`Failure::chain`] prints both.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// An expectation about the device, the kernel or the library was not met.
    #[error("{0}")]
    Check(String),
    /// A system call made by the test itself failed.
    #[error("{op}")]
    Io {
        op: String,
        #[source]
        source: io::Error,
    },
    /// Reading sysfs through `pci::Sysfs` failed.
    #[error("{op}")]
    Pci {
        op: String,
        #[source]
        source: pci::Error,
    },
    /// `pci::Binder` failed.
    #[error("{op}")]
    Bind {
        op: String,
        #[source]
        source: Box<pci::BindError>,
    },
    /// A `dma` space or mapping failed.
    #[error("{op}")]
    Dma {
        op: String,
        #[source]
        source: dma::Error,
    },
    /// Building a `memory::Region` (or reading its physical pages) failed.
    #[error("{op}")]
    Memory {
        op: String,
        #[source]
        source: memory::Error,
    },
    /// A `pool::Pool` operation failed.
    #[error("{op}")]
    Pool {
        op: String,
        #[source]
        source: pool::Error,
    },
    /// Opening or driving a `device::Device` (VFIO, UIO) failed.
    #[error("{op}")]
    Device {
        op: String,
        #[source]
        source: Box<device::Error>,
    },
    /// An interrupt eventfd failed.
    #[error("{op}")]
    Irq {
        op: String,
        #[source]
        source: irq::Error,
    },
    /// A register access failed.
    #[error("{op}")]
    Mmio {
        op: String,
        #[source]
        source: mmio::Error,
    },
    /// A `userdma::Runtime` operation failed (memory, a pool, a queue).
    #[error("{op}")]
    Runtime {
        op: String,
        #[source]
        source: Box<userdma::Error>,
    },
    /// An inference-layer operation failed (a pipeline, staging).
    #[error("{op}")]
    Infer {
        op: String,
        #[source]
        source: Box<userdma_infer::Error>,
    },
}

impl Failure {
    /// The failure and each of its causes, joined with `": "`, on one line.
    pub(crate) fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut cause = self.source();
        while let Some(err) = cause {
            text.push_str(": ");
            text.push_str(&err.to_string());
            cause = err.source();
        }
        text.replace('\n', " ")
    }

    /// The same failure with `what` (the step it happened in: a frame, a stage) put before
    /// its text; the source is kept.
    pub(crate) fn during(self, what: impl FnOnce() -> String) -> Failure {
        let before = |text: String| format!("{}: {text}", what());
        match self {
            Failure::Check(text) => Failure::Check(before(text)),
            Failure::Io { op, source } => Failure::Io {
                op: before(op),
                source,
            },
            Failure::Pci { op, source } => Failure::Pci {
                op: before(op),
                source,
            },
            Failure::Bind { op, source } => Failure::Bind {
                op: before(op),
                source,
            },
            Failure::Dma { op, source } => Failure::Dma {
                op: before(op),
                source,
            },
            Failure::Memory { op, source } => Failure::Memory {
                op: before(op),
                source,
            },
            Failure::Pool { op, source } => Failure::Pool {
                op: before(op),
                source,
            },
            Failure::Device { op, source } => Failure::Device {
                op: before(op),
                source,
            },
            Failure::Irq { op, source } => Failure::Irq {
                op: before(op),
                source,
            },
            Failure::Mmio { op, source } => Failure::Mmio {
                op: before(op),
                source,
            },
            Failure::Runtime { op, source } => Failure::Runtime {
                op: before(op),
                source,
            },
            Failure::Infer { op, source } => Failure::Infer {
                op: before(op),
                source,
            },
        }
    }
}

/// Attaches the operation being done to a library error.
pub(crate) trait Context<T> {
    /// Turns the error into a [`Failure`] naming the operation `op()` describes.
    fn context(self, op: impl FnOnce() -> String) -> Result<T, Failure>;
}

macro_rules! context {
    ($($err:ty => $variant:ident),* $(,)?) => {$(
        impl<T> Context<T> for Result<T, $err> {
            fn context(self, op: impl FnOnce() -> String) -> Result<T, Failure> {
                self.map_err(|source| Failure::$variant {
                    op: op(),
                    source: source.into(),
                })
            }
        }
    )*};
}

context!(
    io::Error => Io,
    pci::Error => Pci,
    pci::BindError => Bind,
    dma::Error => Dma,
    memory::Error => Memory,
    mmio::Error => Mmio,
    pool::Error => Pool,
    device::Error => Device,
    irq::Error => Irq,
    userdma::Error => Runtime,
    userdma_infer::Error => Infer,
);

/// Fails the case with a [`Failure::Check`] unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::failure::Failure::Check(format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_joins_every_cause_on_one_line() {
        let inner = io::Error::other("inner\ncause");
        let failure: Result<(), _> = Err(inner);
        let failure = failure
            .context(|| "open /dev/vfio/7".to_owned())
            .unwrap_err();
        assert_eq!(failure.chain(), "open /dev/vfio/7: inner cause");
    }

    #[test]
    fn during_puts_the_step_first_and_keeps_the_source() {
        let check = Failure::Check("byte 3 differs".to_owned()).during(|| "frame 7".to_owned());
        assert_eq!(check.chain(), "frame 7: byte 3 differs");
        let io: Result<(), _> = Err(io::Error::other("gone"));
        let io = io
            .context(|| "read BAR0".to_owned())
            .unwrap_err()
            .during(|| "frame 2, to device".to_owned());
        assert_eq!(io.chain(), "frame 2, to device: read BAR0: gone");
    }

    #[test]
    fn ensure_fails_only_when_the_condition_is_false() {
        fn check(value: u32) -> Result<(), Failure> {
            ensure!(value == 3, "value is {value}, want 3");
            Ok(())
        }
        assert!(check(3).is_ok());
        assert_eq!(check(4).unwrap_err().chain(), "value is 4, want 3");
    }
}
