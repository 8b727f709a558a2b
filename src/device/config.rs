//! Configuration-space access shared by the PCI backends ([`Vfio`](super::Vfio) through the
//! device fd's config region, [`Uio`](super::Uio) through sysfs `config`): errors name the device
//! and the offset.

use userdma_sys::pci::{PCI_COMMAND, PCI_COMMAND_MASTER, PCI_COMMAND_MEMORY};

use super::Error;
use crate::mmio::{Backend, Block, Raw};
use crate::pci::Bdf;

/// Reads a `u8`/`u16`/`u32` of `bdf`'s configuration space at `offset`.
pub(crate) fn read<B: Backend, T: Raw>(
    config: &Block<B>,
    bdf: Bdf,
    offset: u16,
) -> Result<T, Error> {
    config
        .read(usize::from(offset))
        .map_err(|source| Error::ConfigAccess {
            bdf,
            offset,
            source,
        })
}

/// Writes a `u8`/`u16`/`u32` of `bdf`'s configuration space at `offset`.
pub(crate) fn write<B: Backend, T: Raw>(
    config: &Block<B>,
    bdf: Bdf,
    offset: u16,
    value: T,
) -> Result<(), Error> {
    config
        .write(usize::from(offset), value)
        .map_err(|source| Error::ConfigAccess {
            bdf,
            offset,
            source,
        })
}

/// Turns bus mastering (and memory decoding) on, or bus mastering off; writes the command
/// register only when it changes.
pub(crate) fn set_bus_master<B: Backend>(
    config: &Block<B>,
    bdf: Bdf,
    on: bool,
) -> Result<(), Error> {
    let command: u16 = read(config, bdf, PCI_COMMAND)?;
    let wanted = if on {
        command | PCI_COMMAND_MASTER | PCI_COMMAND_MEMORY
    } else {
        command & !PCI_COMMAND_MASTER
    };
    if wanted != command {
        write(config, bdf, PCI_COMMAND, wanted)?;
    }
    Ok(())
}

/// A PCI backend's public configuration-space methods (`config_read`, `config_write`,
/// `set_bus_master`, over the backend's `config` block and `bdf`, through the helpers above),
/// with each method's doc comment given by the backend: written once for [`Vfio`](super::Vfio)
/// and [`Uio`](super::Uio). Expands to methods: use it inside the backend's `impl` block.
macro_rules! config_methods {
    (
        $(#[$read_doc:meta])*
        fn config_read;
        $(#[$write_doc:meta])*
        fn config_write;
        $(#[$bus_master_doc:meta])*
        fn set_bus_master;
    ) => {
        $(#[$read_doc])*
        pub fn config_read<T: $crate::mmio::Raw>(
            &self,
            offset: u16,
        ) -> Result<T, $crate::device::Error> {
            $crate::device::config::read(&self.config, self.bdf, offset)
        }

        $(#[$write_doc])*
        pub fn config_write<T: $crate::mmio::Raw>(
            &self,
            offset: u16,
            value: T,
        ) -> Result<(), $crate::device::Error> {
            $crate::device::config::write(&self.config, self.bdf, offset, value)
        }

        $(#[$bus_master_doc])*
        pub fn set_bus_master(&self, on: bool) -> Result<(), $crate::device::Error> {
            $crate::device::config::set_bus_master(&self.config, self.bdf, on)
        }
    };
}
pub(crate) use config_methods;
