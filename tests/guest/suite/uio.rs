//! A device bound to `uio_pci_generic`: its `/dev/uioN` node (interrupts), BAR0 through sysfs
//! `resource0`, and configuration space through sysfs `config`.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::Duration;

use userdma::mmio::{Block, FileBacked};
use userdma::pci::Bdf;
use userdma::sys::pci::{PCI_CFG_SPACE_SIZE, PCI_COMMAND, PCI_COMMAND_INTX_DISABLE};
use userdma::sys::uio::{IrqWord, UIO_CLASS_DIR, UIO_DEV_PREFIX, UIO_MAPS_DIR, UIO_NAME_PREFIX};

use crate::edu::{self, Edu};
use crate::env::Env;
use crate::failure::{Context, Failure};
use crate::mmap::Mmap;
use crate::vfio::set_command_bits;

/// The UIO node of a device bound to `uio_pci_generic`, and its configuration space.
///
/// `uio_pci_generic` (Linux 6.1) has no `irqcontrol`: writing the enable word to `/dev/uioN`
/// fails with `ENOSYS`. Its interrupt handler masks INTx by setting `INTX_DISABLE` in the
/// command register; user space unmasks by clearing it again.
#[derive(Debug)]
pub(crate) struct Uio {
    node: File,
    path: PathBuf,
    number: u32,
    config: File,
    config_path: PathBuf,
}

impl Uio {
    /// Opens the `/dev/uioN` node of `bdf` (named in sysfs `uio/uioN`) and its sysfs `config`.
    pub(crate) fn open(env: &Env, bdf: Bdf) -> Result<Uio, Failure> {
        let dir = env.device_file(bdf, "uio");
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).context(|| format!("list {}", dir.display()))? {
            let entry = entry.context(|| format!("list {}", dir.display()))?;
            if let Some(name) = entry.file_name().to_str() {
                if name.starts_with(UIO_NAME_PREFIX) {
                    names.push(name.to_owned());
                }
            }
        }
        let [name] = names.as_slice() else {
            return Err(Failure::Check(format!(
                "{} lists {names:?}, want one uioN entry",
                dir.display()
            )));
        };
        let number: u32 = name[UIO_NAME_PREFIX.len()..]
            .parse()
            .map_err(|_| Failure::Check(format!("{}: {name} is not uio<number>", dir.display())))?;
        let path = PathBuf::from(format!("{UIO_DEV_PREFIX}{number}"));
        let node = open_rw(&path)?;
        let config_path = env.device_file(bdf, "config");
        let config = open_rw(&config_path)?;
        Ok(Uio {
            node,
            path,
            number,
            config,
            config_path,
        })
    }

    /// The node's path.
    pub(crate) fn path(&self) -> &PathBuf {
        &self.path
    }

    /// `N` of `/dev/uioN`.
    pub(crate) fn number(&self) -> u32 {
        self.number
    }

    /// The node (to map its memory maps).
    pub(crate) fn node(&self) -> &File {
        &self.node
    }

    fn command(&self) -> Block<FileBacked<&File>> {
        Block::new(FileBacked::new(
            &self.config,
            0,
            usize::from(PCI_CFG_SPACE_SIZE),
        ))
    }

    /// Whether INTx is masked (`INTX_DISABLE` set in the command register).
    pub(crate) fn intx_masked(&self) -> Result<bool, Failure> {
        let command: u16 = self.command().read(usize::from(PCI_COMMAND)).context(|| {
            format!(
                "read the command register from {}",
                self.config_path.display()
            )
        })?;
        Ok(command & PCI_COMMAND_INTX_DISABLE != 0)
    }

    /// Unmasks INTx: clears `INTX_DISABLE` in the command register.
    pub(crate) fn unmask_intx(&self) -> Result<(), Failure> {
        let config = self.command();
        let at = usize::from(PCI_COMMAND);
        let what = || format!("clear INTX_DISABLE through {}", self.config_path.display());
        let command: u16 = config.read(at).context(what)?;
        config
            .write(at, command & !PCI_COMMAND_INTX_DISABLE)
            .context(what)
    }

    /// Waits up to `timeout` for an interrupt; returns the node's interrupt count, or `None`
    /// when none came.
    pub(crate) fn wait_irq(&mut self, timeout: Duration) -> Result<Option<u32>, Failure> {
        let mut pfd = libc::pollfd {
            fd: self.node.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `pfd` is one valid pollfd that lives across the call, and nfds is 1.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready < 0 {
            return Err(std::io::Error::last_os_error())
                .context(|| format!("poll {}", self.path.display()));
        }
        if ready == 0 {
            return Ok(None);
        }
        let mut word = [0_u8; size_of::<IrqWord>()];
        self.node
            .read_exact(&mut word)
            .context(|| format!("read the interrupt count from {}", self.path.display()))?;
        Ok(Some(u32::from_ne_bytes(word)))
    }
}

fn open_rw(path: &std::path::Path) -> Result<File, Failure> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .context(|| format!("open {}", path.display()))
}

/// Maps edu's BAR0 through sysfs `resource0`.
pub(crate) fn map_edu(env: &Env, bdf: Bdf) -> Result<Edu, Failure> {
    let path = env.device_file(bdf, "resource0");
    let file = open_rw(&path)?;
    let len = usize::try_from(edu::BAR0_LEN)
        .map_err(|_| Failure::Check("BAR0 length does not fit usize".to_owned()))?;
    let map = Mmap::shared(file.as_fd(), 0, len).context(|| format!("mmap {}", path.display()))?;
    Edu::new(map)
}

/// Sets memory decoding and bus mastering through sysfs `config`.
pub(crate) fn enable_bus_master(env: &Env, bdf: Bdf) -> Result<(), Failure> {
    let path = env.device_file(bdf, "config");
    let file = open_rw(&path)?;
    let config = Block::new(FileBacked::new(
        file.as_fd(),
        0,
        usize::from(PCI_CFG_SPACE_SIZE),
    ));
    set_command_bits(&config, &path.display().to_string())
}

/// Whether `/dev/uioN` exists for `bdf` right now.
pub(crate) fn has_node(env: &Env, bdf: Bdf) -> bool {
    env.device_file(bdf, "uio").is_dir()
}

/// Map `index` of `/dev/uioN` as its sysfs attributes describe it:
/// `/sys/class/uio/uioN/maps/mapM/{addr,size,offset}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MapInfo {
    /// Physical address of the page holding the map's first byte.
    pub(crate) addr: u64,
    /// Bytes mapped (whole pages).
    pub(crate) size: u64,
    /// Offset of the map's first byte in its first page.
    pub(crate) offset: u64,
}

/// Reads map `index` of `uio`.
pub(crate) fn map_info(uio: &Uio, index: u32) -> Result<MapInfo, Failure> {
    let dir = PathBuf::from(format!(
        "{UIO_CLASS_DIR}/{UIO_NAME_PREFIX}{}/{UIO_MAPS_DIR}/map{index}",
        uio.number()
    ));
    let read = |name: &str| -> Result<u64, Failure> {
        let path = dir.join(name);
        let text = fs::read_to_string(&path).context(|| format!("read {}", path.display()))?;
        userdma::pci::parse_hex(text.trim(), 64).ok_or_else(|| {
            Failure::Check(format!(
                "{} holds {:?}, not a hex number",
                path.display(),
                text.trim()
            ))
        })
    };
    Ok(MapInfo {
        addr: read("addr")?,
        size: read("size")?,
        offset: read("offset")?,
    })
}
