//! The sysfs writes binding makes, behind a trait so tests can play the kernel's part.

use std::io::{self, Write};
use std::path::Path;

/// Where binding writes. The live implementation is [`LiveKernel`]; a test double reacts to the
/// writes as the kernel would (unbind removes the `driver` link, a probe creates one).
pub trait Kernel {
    /// Writes `value` to the sysfs attribute at `path`, which must exist.
    ///
    /// # Errors
    /// The error of `open(2)` or `write(2)`: the kernel's store handler reports refusals there
    /// (`EINVAL`, `ENODEV`, `EBUSY`, `EACCES` for non-root callers).
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
}

impl<K: Kernel + ?Sized> Kernel for &K {
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        (**self).write(path, value)
    }
}

/// The real kernel: each write opens the attribute (never creating it) and writes the value in
/// one `write(2)`. The open truncates, which sysfs ignores, so that a plain file in a copied or
/// fake tree holds exactly the last value written, as an attribute would.
#[derive(Debug, Clone, Copy, Default)]
pub struct LiveKernel;

impl Kernel for LiveKernel {
    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(path)?;
        file.write_all(value.as_bytes())
    }
}
