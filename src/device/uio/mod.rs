//! [`Uio`]: a PCI function bound to `uio_pci_generic`.
//!
//! | what | how |
//! |---|---|
//! | BARs | `mmap` of sysfs `resourceN` (memory BARs), `pread`/`pwrite` of it otherwise |
//! | config space | `pread`/`pwrite` of sysfs `config` |
//! | bus mastering | the command register, through `config` |
//! | interrupt (INTx, one vector) | `/dev/uioN`: a relay thread waits on it and signals an [`irq::EventFd`] per interrupt; [`Uio::irq_count`] is the node's total |
//! | masking | `INTX_DISABLE` in the command register (`uio_pci_generic` has no `irqcontrol`: its handler sets the bit, and [`Device::set_masked`]`(0, false)` clears it) |
//! | DMA | [`dma::Physical`] (pagemap, needs `CAP_SYS_ADMIN`), refused when the IOMMU translates the device (group type `DMA`/`DMA-FQ`): physical addresses would fault there |
//! | reset | sysfs `reset`, when the kernel offers one |

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use userdma_sys::pci::{PCI_COMMAND, PCI_COMMAND_INTX_DISABLE};
use userdma_sys::uio::{UIO_DEV_PREFIX, UIO_NAME_PREFIX};

use super::{config, Device, Error as DeviceError, Identity, Kind, Source};
use crate::dma::{self, Mapping, Space, Stats};
use crate::memory::Region;
use crate::mmio::{self, Block, Direct, FileBacked};
use crate::sync::Mutex;
use crate::{irq, pci};

mod error;
mod relay;

pub use self::error::Error;

use self::error::Error as UioError;
use self::relay::Relay;

/// A mapped memory BAR (sysfs `resourceN`), or the file for `pread`/`pwrite`.
#[derive(Debug)]
enum UioBar {
    Mapped {
        // Declared before `map`, so dropped before the mapping it points into.
        direct: Direct,
        map: crate::device::vfio::Mmap,
    },
    File(FileBacked<Arc<File>>),
}

impl mmio::Backend for UioBar {
    fn len(&self) -> usize {
        match self {
            UioBar::Mapped { direct, .. } => direct.len(),
            UioBar::File(file) => file.len(),
        }
    }

    fn read(&self, offset: usize, width: mmio::Width) -> Result<u64, mmio::Error> {
        match self {
            UioBar::Mapped { direct, .. } => direct.read(offset, width),
            UioBar::File(file) => file.read(offset, width),
        }
    }

    fn write(&self, offset: usize, width: mmio::Width, value: u64) -> Result<(), mmio::Error> {
        match self {
            UioBar::Mapped { direct, .. } => direct.write(offset, width, value),
            UioBar::File(file) => file.write(offset, width, value),
        }
    }
}

/// A PCI function opened through `uio_pci_generic`. Implements [`Device`]; `Send + Sync`.
#[derive(Debug)]
pub struct Uio {
    bdf: pci::Bdf,
    identity: Identity,
    dir: PathBuf,
    node_path: PathBuf,
    number: u32,
    info: pci::DeviceInfo,
    bars: Arc<Mutex<Vec<Option<Arc<UioBar>>>>>,
    config: Block<FileBacked<Arc<File>>>,
    /// Removals (the node failing) are reported through it ([`Device::events`]).
    events: Source,
    space: Arc<dyn Space>,
    refusal: Option<(u32, String)>,
    relay: Relay,
    /// Where host memory for the device goes ([`Device::numa_node`]).
    numa_node: Option<u32>,
    /// [`Uio::with_dma_alignment`], [`Device::dma_alignment`].
    dma_alignment: usize,
}

impl Uio {
    /// Opens `bdf` (bound to `uio_pci_generic`) for a device with a 64-bit DMA mask.
    pub fn open(bdf: pci::Bdf) -> Result<Uio, DeviceError> {
        Uio::open_with(bdf, 64)
    }

    /// This device, saying it needs DMA buffers aligned to `bytes` (a power of two; a base
    /// page, 4096, unless stated): [`Device::dma_alignment`], which decides how
    /// [`Runtime::pool`](crate::Runtime::pool) lays its pools out.
    #[must_use]
    pub fn with_dma_alignment(mut self, bytes: usize) -> Uio {
        self.dma_alignment = bytes;
        self
    }

    /// Opens `bdf` (bound to `uio_pci_generic`) for a device with a `dma_mask_bits`-bit DMA
    /// mask. Turns bus mastering on and starts the interrupt relay.
    pub fn open_with(bdf: pci::Bdf, dma_mask_bits: u32) -> Result<Uio, DeviceError> {
        Uio::open_in(&pci::Sysfs::system(), bdf, dma_mask_bits)
    }

    /// The open sequence against a sysfs tree.
    pub(crate) fn open_in(
        sysfs: &pci::Sysfs,
        bdf: pci::Bdf,
        dma_mask_bits: u32,
    ) -> Result<Uio, DeviceError> {
        #[cfg(feature = "tracing")]
        let _span = tracing::info_span!("uio.open", %bdf, dma_mask_bits).entered();
        let info = sysfs
            .device(bdf)
            .map_err(|source| DeviceError::Sysfs { bdf, source })?;
        match info.driver.as_deref() {
            Some(d) if d == pci::Driver::UioPciGeneric.name() => {}
            None => return Err(DeviceError::NotBound { bdf }),
            Some(d) => {
                return Err(DeviceError::WrongDriver {
                    bdf,
                    driver: d.to_owned(),
                })
            }
        }
        let dir = sysfs.device_dir(bdf);
        let number = uio_number(bdf, &dir.join("uio"))?;
        let node_path = PathBuf::from(format!("{UIO_DEV_PREFIX}{number}"));
        let node = open_rw(bdf, &node_path)?;
        let config_path = dir.join("config");
        let config_file = Arc::new(open_rw(bdf, &config_path)?);
        let config_len = fs::metadata(&config_path)
            .ok()
            .and_then(|m| usize::try_from(m.len()).ok())
            .filter(|&l| l > 0)
            .unwrap_or(usize::from(userdma_sys::pci::PCI_CFG_SPACE_SIZE));
        let config = Block::new(FileBacked::new(config_file, 0, config_len));
        let refusal = info
            .iommu_group
            .as_ref()
            .filter(|g| g.translates())
            .map(|g| {
                (
                    g.number,
                    g.domain_type.clone().unwrap_or_else(|| "DMA".to_owned()),
                )
            });
        let physical = dma::Physical::new(dma_mask_bits)
            .map_err(|source| DeviceError::DmaSpace { bdf, source })?;
        let space: Arc<dyn Space> = match &refusal {
            None => Arc::new(physical),
            Some((group, domain)) => Arc::new(Refused {
                bdf,
                group: *group,
                domain: domain.clone(),
                mask_bits: dma_mask_bits,
            }),
        };
        let identity = Identity {
            name: format!("{:04x}:{:04x}", info.vendor, info.device),
            kind: Kind::Uio,
            bdf: Some(bdf),
        };
        let events = Source::new(identity.to_string());
        let bars: Arc<Mutex<Vec<Option<Arc<UioBar>>>>> =
            Arc::new(Mutex::new((0..6).map(|_| None).collect()));
        let gone = {
            let (config, events, bars) = (config.clone(), events.clone(), Arc::clone(&bars));
            Box::new(move || cut_off(bdf, &config, &events, &bars))
        };
        let relay = Relay::start(bdf, OwnedFd::from(node), &node_path, gone)?;
        events
            .watch_vector(relay.event())
            .map_err(|source| DeviceError::Interrupt { vector: 0, source })?;
        let uio = Uio {
            bdf,
            identity,
            dir,
            node_path,
            number,
            bars,
            events,
            numa_node: crate::memory::numa::placement(sysfs.root(), info.numa_node),
            dma_alignment: crate::pool::DEFAULT_DMA_ALIGNMENT,
            info,
            config,
            space,
            refusal,
            relay,
        };
        uio.set_bus_master(true)?;
        #[cfg(feature = "tracing")]
        tracing::info!(
            device = %uio.identity,
            node = %uio.node_path.display(),
            dma_refused = uio.refusal.is_some(),
            numa_node = uio.numa_node,
            "device opened"
        );
        Ok(uio)
    }

    /// The error of an operation on a removed device.
    fn check_present(&self) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            return Err(DeviceError::Removed {
                device: self.identity.to_string(),
            });
        }
        Ok(())
    }

    /// The PCI address.
    pub fn bdf(&self) -> pci::Bdf {
        self.bdf
    }

    /// `/dev/uioN`.
    pub fn node(&self) -> &Path {
        &self.node_path
    }

    /// `N` of `/dev/uioN`.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The node's total interrupt count, as last read by the relay.
    pub fn irq_count(&self) -> u32 {
        self.relay.count()
    }

    /// `Ok` if physical-address DMA can work for this device; the reason it cannot otherwise
    /// (the IOMMU translates it). [`Device::dma_space`]'s `map` fails with the same reason.
    pub fn check_dma(&self) -> Result<(), DeviceError> {
        match &self.refusal {
            None => Ok(()),
            Some((group, domain)) => Err(UioError::IommuTranslates {
                bdf: self.bdf,
                group: *group,
                domain: domain.clone(),
            }
            .into()),
        }
    }

    config::config_methods! {
        /// Reads a `u8`/`u16`/`u32` of configuration space at `offset`.
        fn config_read;
        /// Writes a `u8`/`u16`/`u32` of configuration space at `offset`.
        fn config_write;
        /// Turns bus mastering (and memory decoding) on, or bus mastering off.
        fn set_bus_master;
    }

    /// Whether INTx is masked (`INTX_DISABLE` set).
    pub fn intx_masked(&self) -> Result<bool, DeviceError> {
        let command: u16 = self.config_read(PCI_COMMAND)?;
        Ok(command & PCI_COMMAND_INTX_DISABLE != 0)
    }

    fn bar_of(&self, index: usize) -> Result<Arc<UioBar>, DeviceError> {
        self.check_present()?;
        let bar_index = u8::try_from(index).map_err(|_| DeviceError::NoBar {
            bdf: self.bdf,
            index,
        })?;
        let resource = self
            .info
            .bars()
            .find(|r| r.kind() == pci::ResourceKind::Bar(bar_index))
            .copied()
            .ok_or(DeviceError::NoBar {
                bdf: self.bdf,
                index,
            })?;
        let mut bars = self
            .bars
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Some(bar)) = bars.get(index) {
            return Ok(Arc::clone(bar));
        }
        // Under the lock the relay cuts the BARs off under: a BAR mapped now is cut off too.
        self.check_present()?;
        let path = self.dir.join(format!("resource{index}"));
        let file = open_rw(self.bdf, &path)?;
        let len = usize::try_from(resource.size()).map_err(|_| DeviceError::NoBar {
            bdf: self.bdf,
            index,
        })?;
        let bar = if resource.is_mem() {
            let map =
                crate::device::vfio::Mmap::shared(file.as_fd(), 0, len).map_err(|source| {
                    UioError::Node {
                        bdf: self.bdf,
                        path: path.clone(),
                        operation: "mmap",
                        source,
                    }
                })?;
            // SAFETY: `map` is a fresh shared read-write mapping of the BAR that the `UioBar`
            // owns and drops after `direct` (field order); its bytes are touched only by
            // `Direct`'s volatile accesses.
            let direct =
                unsafe { Direct::new(map.as_ptr(), map.len()) }.map_err(|_| UioError::Node {
                    bdf: self.bdf,
                    path: path.clone(),
                    operation: "mmap (unaligned)",
                    source: io::Error::from(io::ErrorKind::InvalidInput),
                })?;
            UioBar::Mapped { direct, map }
        } else {
            UioBar::File(FileBacked::new(Arc::new(file), 0, len))
        };
        let bar = Arc::new(bar);
        if let Some(slot) = bars.get_mut(index) {
            *slot = Some(Arc::clone(&bar));
        }
        Ok(bar)
    }
}

impl Device for Uio {
    fn identity(&self) -> &Identity {
        &self.identity
    }

    fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    fn dma_alignment(&self) -> usize {
        self.dma_alignment
    }

    fn bar(&self, index: usize) -> Result<mmio::DynBlock, DeviceError> {
        let bar: Arc<dyn mmio::Backend> = self.bar_of(index)?;
        Ok(Block::new(bar))
    }

    fn dma_space(&self) -> Arc<dyn Space> {
        Arc::clone(&self.space)
    }

    fn vectors(&self) -> u32 {
        1
    }

    fn interrupt(&self, vector: u32) -> Result<irq::EventFd, DeviceError> {
        if vector != 0 {
            return Err(DeviceError::NoSuchVector {
                bdf: self.bdf,
                vector,
                count: 1,
            });
        }
        self.relay
            .event()
            .try_clone()
            .map_err(|source| DeviceError::Interrupt { vector, source })
    }

    fn set_masked(&self, vector: u32, masked: bool) -> Result<(), DeviceError> {
        if vector != 0 {
            return Err(DeviceError::NoSuchVector {
                bdf: self.bdf,
                vector,
                count: 1,
            });
        }
        let command: u16 = self.config_read(PCI_COMMAND)?;
        let wanted = if masked {
            command | PCI_COMMAND_INTX_DISABLE
        } else {
            command & !PCI_COMMAND_INTX_DISABLE
        };
        self.config_write(PCI_COMMAND, wanted)
    }

    fn event_source(&self) -> Option<&Source> {
        Some(&self.events)
    }

    fn stop_queue(&self, _queue: u16, _timeout: std::time::Duration) -> Result<(), DeviceError> {
        if self.events.is_removed() {
            // Bus mastering went off (or the device is gone) before the removal was reported.
            return Ok(());
        }
        self.reset()
    }

    fn reset(&self) -> Result<(), DeviceError> {
        self.check_present()?;
        let path = self.dir.join("reset");
        if !path.exists() {
            return Err(DeviceError::NoReset {
                bdf: self.bdf,
                affected: Vec::new(),
            });
        }
        let uio = |source| UioError::Node {
            bdf: self.bdf,
            path: path.clone(),
            operation: "write 1 to",
            source,
        };
        let mut file = OpenOptions::new().write(true).open(&path).map_err(uio)?;
        file.write_all(b"1").map_err(uio)?;
        #[cfg(feature = "tracing")]
        tracing::info!(device = %self.identity, reset = "sysfs", "device reset");
        self.set_bus_master(true)
    }
}

/// What a UIO device does when its node fails (the device was removed: hot-unplug, `remove`,
/// an unbind): bus mastering off (through sysfs `config`, which fails if the device is gone
/// already — it cannot DMA then either), the mapped BARs replaced by memory that reads
/// all-ones, so that a register block still held reaches no device (the kernel may give the
/// BAR's addresses to another one), then the removal reported ([`Source::report_removal`]:
/// queues wake and hand their buffers back; whoever sees it finds the BARs cut off).
fn cut_off(
    bdf: pci::Bdf,
    config: &Block<FileBacked<Arc<File>>>,
    events: &Source,
    bars: &Mutex<Vec<Option<Arc<UioBar>>>>,
) {
    let _ = config::set_bus_master(config, bdf, false);
    let held = bars
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for bar in held.iter().flatten() {
        if let UioBar::Mapped { map, .. } = bar.as_ref() {
            if let Err(err) = map.cut_off() {
                eprintln!("warning: {bdf}: cutting off a BAR mapping failed ({err})");
            }
        }
    }
    // Reported under the lock: `bar_of` maps no BAR after the cut-off without seeing it.
    events.report_removal();
    drop(held);
}

/// The number `N` of the one `uioN` entry in `dir`.
fn uio_number(bdf: pci::Bdf, dir: &Path) -> Result<u32, DeviceError> {
    let missing = || UioError::NoUioNode {
        bdf,
        dir: dir.to_owned(),
    };
    let entries = fs::read_dir(dir).map_err(|_| missing())?;
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .find_map(|name| name.strip_prefix(UIO_NAME_PREFIX)?.parse::<u32>().ok())
        .ok_or_else(missing)
        .map_err(Into::into)
}

fn open_rw(bdf: pci::Bdf, path: &Path) -> Result<File, DeviceError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| DeviceError::Open {
            bdf,
            path: path.to_owned(),
            source,
        })
}

/// The DMA space of a UIO device the IOMMU translates: every map is refused with the reason.
#[derive(Debug)]
struct Refused {
    bdf: pci::Bdf,
    group: u32,
    domain: String,
    mask_bits: u32,
}

impl Space for Refused {
    fn map(&self, region: Arc<Region>) -> Result<Mapping, dma::Error> {
        let reason = UioError::IommuTranslates {
            bdf: self.bdf,
            group: self.group,
            domain: self.domain.clone(),
        };
        Err(dma::Error::Refused {
            kind: dma::Kind::Physical,
            len: crate::memory::u64_of(region.len()),
            source: io::Error::new(io::ErrorKind::PermissionDenied, reason),
        })
    }

    fn stats(&self) -> Stats {
        Stats::default()
    }

    fn kind(&self) -> dma::Kind {
        dma::Kind::Physical
    }

    fn dma_mask_bits(&self) -> u32 {
        self.mask_bits
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    const BDF: &str = "0000:00:05.0";

    /// A tree with one device (edu's IDs), bound to `driver` if given, in group 2 of `domain`
    /// type if given.
    fn tree(driver: Option<&str>, domain: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let dev = root.join("devices/pci0000:00").join(BDF);
        fs::create_dir_all(&dev).unwrap();
        fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        symlink(&dev, root.join("bus/pci/devices").join(BDF)).unwrap();
        fs::write(dev.join("vendor"), "0x1234\n").unwrap();
        fs::write(dev.join("device"), "0x11e8\n").unwrap();
        fs::write(dev.join("class"), "0x00ff00\n").unwrap();
        fs::write(dev.join("resource"), "0x0 0x0 0x0\n").unwrap();
        if let Some(driver) = driver {
            let d = root.join("bus/pci/drivers").join(driver);
            fs::create_dir_all(&d).unwrap();
            symlink(&d, dev.join("driver")).unwrap();
        }
        if let Some(domain) = domain {
            let g = root.join("kernel/iommu_groups/2");
            fs::create_dir_all(g.join("devices")).unwrap();
            fs::write(g.join("type"), format!("{domain}\n")).unwrap();
            symlink(&dev, g.join("devices").join(BDF)).unwrap();
            symlink(&g, dev.join("iommu_group")).unwrap();
        }
        dir
    }

    fn open(dir: &tempfile::TempDir) -> Result<Uio, DeviceError> {
        Uio::open_in(&pci::Sysfs::new(dir.path()), BDF.parse().unwrap(), 28)
    }

    #[test]
    fn refusals() {
        let err = open(&tree(None, None)).unwrap_err();
        assert!(matches!(err, DeviceError::NotBound { .. }), "{err:?}");
        let err = open(&tree(Some("vfio-pci"), None)).unwrap_err();
        assert!(matches!(err, DeviceError::WrongDriver { .. }), "{err:?}");
        let err = open(&tree(Some("uio_pci_generic"), Some("DMA"))).unwrap_err();
        assert!(
            matches!(err, DeviceError::Uio(UioError::NoUioNode { .. })),
            "{err:?}"
        );
        assert!(err.to_string().contains("uio_pci_generic"), "{err}");
    }

    #[test]
    fn refused_space_says_why() {
        let space = Refused {
            bdf: BDF.parse().unwrap(),
            group: 2,
            domain: "DMA-FQ".to_owned(),
            mask_bits: 28,
        };
        assert_eq!(space.kind(), dma::Kind::Physical);
        assert_eq!(space.dma_mask_bits(), 28);
        let region = crate::memory::Region::builder(0x1000)
            .page_size(crate::memory::PageSize::Base)
            .build()
            .unwrap();
        let err = space.map(Arc::new(region)).unwrap_err();
        let mut text = err.to_string();
        let mut cause = std::error::Error::source(&err);
        while let Some(c) = cause {
            text.push_str(&c.to_string());
            cause = c.source();
        }
        assert!(
            text.contains("iommu=pt") && text.contains("DMA-FQ"),
            "{text}"
        );
    }
}
