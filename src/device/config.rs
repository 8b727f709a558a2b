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
