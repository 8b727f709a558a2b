//! The open sequence, BAR access, interrupts, reset and drop order against a double of the
//! kernel (the fds are real files; only the ioctls are faked) and a fake sysfs tree. The
//! iommufd path is tested here only: the guest kernels the harness boots lack CONFIG_IOMMUFD.

use std::collections::HashMap;
use std::ffi::CStr;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{symlink, FileExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use userdma_sys::vfio::{
    vfio_device_info, vfio_irq_info, VFIO_TYPE1v2_IOMMU, VFIO_DEVICE_FLAGS_PCI,
    VFIO_DEVICE_FLAGS_RESET, VFIO_GROUP_FLAGS_VIABLE, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_NOIOMMU_IOMMU, VFIO_REGION_INFO_CAP_SPARSE_MMAP,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

use super::hot_reset::parse_hot_reset;
use super::info::read_u32;
use super::info::tests::{reply, sparse_body};
use super::irqs::irq_set;
use super::kernel::{Kernel, SpaceError};
use super::open::Host;
use super::*;
use crate::device::vfio::Error as VfioError;
use crate::device::{Device, Error, Kind};
use crate::dma::{IommufdIoctl, IovaRange, Type1Ioctl};

const BDF: &str = "0000:00:03.0";
const OTHER: &str = "0000:00:04.0";
/// Where region `i` starts in the fake device file.
const REGION_STRIDE: u64 = 0x10_0000;
const BAR0_LEN: u64 = 0x4000;

fn bdf() -> pci::Bdf {
    BDF.parse().unwrap()
}

/// What an fd of the double stands for.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Container,
    Group(u32),
    Device,
    Iommufd,
}

#[derive(Debug, Default)]
struct State {
    nodes: HashMap<RawFd, Node>,
    log: Vec<String>,
    fail: Vec<&'static str>,
    viable: bool,
    noiommu_ok: bool,
    device_flags: u32,
    irq_sets: Vec<Vec<u8>>,
    existing: Vec<PathBuf>,
    api_version: i32,
    /// The function has an error (AER) IRQ.
    err_irq: bool,
    /// The group of the device sharing the bus (5, the device's own, when `None`).
    neighbour_group: Option<u32>,
    /// Bus resets still to fail with `EBUSY` (a lock the kernel's reset tries is held).
    busy: u32,
}

/// The kernel double.
#[derive(Debug)]
struct Fake {
    state: Mutex<State>,
    device_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Arc<Fake> {
        let dir = tempfile::tempdir().unwrap();
        let device_file = dir.path().join("device");
        let file = File::create(&device_file).unwrap();
        file.set_len(8 * REGION_STRIDE).unwrap();
        // Config space (region 7): edu's IDs; command register 0.
        let mut config = vec![0u8; 256];
        config[0..2].copy_from_slice(&0x1234u16.to_le_bytes());
        config[2..4].copy_from_slice(&0x11e8u16.to_le_bytes());
        file.write_all_at(&config, 7 * REGION_STRIDE).unwrap();
        Arc::new(Fake {
            state: Mutex::new(State {
                viable: true,
                noiommu_ok: true,
                device_flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
                api_version: 0,
                ..State::default()
            }),
            device_file,
            _dir: dir,
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn fail(&self, op: &'static str) {
        self.state().fail.push(op);
    }

    fn log(&self) -> Vec<String> {
        self.state().log.clone()
    }

    /// Logs `op` and fails it if asked to.
    fn call(&self, op: &str) -> io::Result<()> {
        let mut state = self.state();
        state.log.push(op.to_owned());
        if state.fail.contains(&op) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        if state.busy > 0 && op.starts_with("VFIO_DEVICE_PCI_HOT_RESET ") {
            state.busy -= 1;
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        Ok(())
    }

    fn node(&self, fd: BorrowedFd<'_>) -> Option<Node> {
        self.state().nodes.get(&fd.as_raw_fd()).cloned()
    }

    fn new_fd(&self, node: Node) -> io::Result<OwnedFd> {
        let file = match node {
            Node::Device => OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.device_file)?,
            _ => OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?,
        };
        let fd = OwnedFd::from(file);
        self.state().nodes.insert(fd.as_raw_fd(), node);
        Ok(fd)
    }

    fn device_bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        File::open(&self.device_file)
            .unwrap()
            .read_exact_at(&mut buf, offset)
            .unwrap();
        buf
    }
}

impl Kernel for Fake {
    fn open(&self, path: &Path) -> io::Result<OwnedFd> {
        let text = path.to_string_lossy().into_owned();
        self.call(&format!("open {text}"))?;
        let node = if text == "/dev/vfio/vfio" {
            Node::Container
        } else if text == "/dev/iommu" {
            Node::Iommufd
        } else if text.starts_with("/dev/vfio/devices/") {
            Node::Device
        } else if let Some(n) = text.strip_prefix("/dev/vfio/noiommu-") {
            Node::Group(
                n.parse()
                    .map_err(|_| io::Error::from(io::ErrorKind::NotFound))?,
            )
        } else if let Some(n) = text.strip_prefix("/dev/vfio/") {
            Node::Group(
                n.parse()
                    .map_err(|_| io::Error::from(io::ErrorKind::NotFound))?,
            )
        } else {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        };
        self.new_fd(node)
    }

    fn exists(&self, path: &Path) -> bool {
        self.state().existing.iter().any(|p| p == path)
    }

    fn api_version(&self, container: BorrowedFd<'_>) -> io::Result<i32> {
        self.call("VFIO_GET_API_VERSION")?;
        assert_eq!(self.node(container), Some(Node::Container));
        Ok(self.state().api_version)
    }

    fn check_extension(&self, _container: BorrowedFd<'_>, model: u32) -> io::Result<bool> {
        self.call(&format!("VFIO_CHECK_EXTENSION {model}"))?;
        Ok(model == VFIO_TYPE1v2_IOMMU || (model == VFIO_NOIOMMU_IOMMU && self.state().noiommu_ok))
    }

    fn set_iommu(&self, container: BorrowedFd<'_>, model: u32) -> io::Result<()> {
        assert_eq!(self.node(container), Some(Node::Container));
        self.call(&format!("VFIO_SET_IOMMU {model}"))
    }

    fn group_status(&self, group: BorrowedFd<'_>) -> io::Result<u32> {
        self.call("VFIO_GROUP_GET_STATUS")?;
        assert!(matches!(self.node(group), Some(Node::Group(_))));
        Ok(if self.state().viable {
            VFIO_GROUP_FLAGS_VIABLE
        } else {
            0
        })
    }

    fn group_set_container(
        &self,
        group: BorrowedFd<'_>,
        container: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let Some(Node::Group(n)) = self.node(group) else {
            panic!("SET_CONTAINER on a non-group fd");
        };
        assert_eq!(self.node(container), Some(Node::Container));
        self.call(&format!("VFIO_GROUP_SET_CONTAINER {n}"))
    }

    fn group_unset_container(&self, group: BorrowedFd<'_>) -> io::Result<()> {
        let Some(Node::Group(n)) = self.node(group) else {
            panic!("UNSET_CONTAINER on a non-group fd");
        };
        self.call(&format!("VFIO_GROUP_UNSET_CONTAINER {n}"))
    }

    fn group_device_fd(&self, group: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
        assert!(matches!(self.node(group), Some(Node::Group(_))));
        self.call(&format!(
            "VFIO_GROUP_GET_DEVICE_FD {}",
            name.to_string_lossy()
        ))?;
        self.new_fd(Node::Device)
    }

    fn device_info(&self, device: BorrowedFd<'_>) -> io::Result<vfio_device_info> {
        assert_eq!(self.node(device), Some(Node::Device));
        self.call("VFIO_DEVICE_GET_INFO")?;
        Ok(vfio_device_info {
            argsz: 24,
            flags: self.state().device_flags,
            num_regions: 9,
            num_irqs: 5,
            cap_offset: 0,
            pad: 0,
        })
    }

    fn region_info(&self, device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        assert_eq!(self.node(device), Some(Node::Device));
        let index = read_u32(buf, 8).unwrap();
        self.call(&format!("VFIO_DEVICE_GET_REGION_INFO {index}"))?;
        if index == 8 {
            // No VGA, as vfio-pci says it.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        let offset = u64::from(index) * REGION_STRIDE;
        let full = match index {
            // BAR0: 16 KiB, mappable except 0x1000..0x2000 and 0x3000..0x4000.
            0 => reply(
                0,
                BAR0_LEN,
                offset,
                rw | VFIO_REGION_INFO_FLAG_MMAP,
                &[(
                    VFIO_REGION_INFO_CAP_SPARSE_MMAP as u16,
                    sparse_body(&[(0, 0x1000), (0x2000, 0x1000)]),
                )],
            ),
            // BAR2: 256 bytes, not mappable (I/O ports).
            2 => reply(2, 0x100, offset, rw, &[]),
            7 => reply(7, 256, offset, rw, &[]),
            _ => reply(index, 0, offset, 0, &[]),
        };
        let argsz = read_u32(buf, 0).unwrap() as usize;
        if full.len() > argsz {
            // As the kernel does: the header, with argsz saying how much is needed.
            buf[..32].copy_from_slice(&full[..32]);
            buf[12..16].copy_from_slice(&0u32.to_ne_bytes());
            buf[0..4].copy_from_slice(&(full.len() as u32).to_ne_bytes());
        } else {
            buf[..full.len()].copy_from_slice(&full);
        }
        Ok(())
    }

    fn irq_info(&self, device: BorrowedFd<'_>, index: u32) -> io::Result<vfio_irq_info> {
        assert_eq!(self.node(device), Some(Node::Device));
        self.call(&format!("VFIO_DEVICE_GET_IRQ_INFO {index}"))?;
        if index == 3 && !self.state().err_irq {
            // No error IRQ on a conventional PCI function, as vfio-pci says it.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let (flags, count) = match index {
            0 => (
                VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED,
                1,
            ),
            1 => (VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE, 4),
            2 => (VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE, 0),
            _ => (VFIO_IRQ_INFO_EVENTFD, 1),
        };
        Ok(vfio_irq_info {
            argsz: 16,
            flags,
            index,
            count,
        })
    }

    fn set_irqs(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        assert_eq!(self.node(device), Some(Node::Device));
        assert_eq!(read_u32(buf, 0).unwrap() as usize, buf.len());
        self.call(&format!(
            "VFIO_DEVICE_SET_IRQS {:#x} {} {} {}",
            read_u32(buf, 4).unwrap(),
            read_u32(buf, 8).unwrap(),
            read_u32(buf, 12).unwrap(),
            read_u32(buf, 16).unwrap()
        ))?;
        self.state().irq_sets.push(buf.to_vec());
        Ok(())
    }

    fn reset(&self, device: BorrowedFd<'_>) -> io::Result<()> {
        assert_eq!(self.node(device), Some(Node::Device));
        self.call("VFIO_DEVICE_RESET")
    }

    fn hot_reset(&self, device: BorrowedFd<'_>, buf: &[u8]) -> io::Result<()> {
        assert_eq!(self.node(device), Some(Node::Device));
        let count = read_u32(buf, 8).unwrap();
        let fds: Vec<String> = (0..count as usize)
            .map(|i| {
                let fd = i32::from_ne_bytes(buf[12 + 4 * i..16 + 4 * i].try_into().unwrap());
                // SAFETY: the library passes the fds of groups it holds open across the call.
                format!("{:?}", self.node(unsafe { BorrowedFd::borrow_raw(fd) }))
            })
            .collect();
        self.call(&format!("VFIO_DEVICE_PCI_HOT_RESET {}", fds.join(",")))
    }

    fn hot_reset_info(&self, _device: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<()> {
        self.call("VFIO_DEVICE_GET_PCI_HOT_RESET_INFO")?;
        // Two devices: the device itself and its neighbour, in group 5 (the neighbour in
        // `neighbour_group` when set).
        buf[8..12].copy_from_slice(&2u32.to_ne_bytes());
        if buf.len() < 12 + 16 {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let neighbour = self.state().neighbour_group.unwrap_or(5);
        for (i, devfn) in [(0usize, 3u8 << 3), (1, 4 << 3)] {
            let at = 12 + i * 8;
            let group = if i == 0 { 5u32 } else { neighbour };
            buf[at..at + 4].copy_from_slice(&group.to_ne_bytes());
            buf[at + 4..at + 6].copy_from_slice(&0u16.to_ne_bytes());
            buf[at + 6] = 0;
            buf[at + 7] = devfn;
        }
        Ok(())
    }

    fn bind_iommufd(&self, device: BorrowedFd<'_>, iommufd: BorrowedFd<'_>) -> io::Result<u32> {
        assert_eq!(self.node(device), Some(Node::Device));
        assert_eq!(self.node(iommufd), Some(Node::Iommufd));
        self.call("VFIO_DEVICE_BIND_IOMMUFD")?;
        Ok(42)
    }

    fn attach_pt(&self, device: BorrowedFd<'_>, pt_id: u32) -> io::Result<()> {
        assert_eq!(self.node(device), Some(Node::Device));
        self.call(&format!("VFIO_DEVICE_ATTACH_IOMMUFD_PT {pt_id}"))
    }

    fn type1_space(
        &self,
        container: BorrowedFd<'_>,
        mask_bits: u32,
    ) -> Result<dma::Type1, SpaceError> {
        assert_eq!(self.node(container), Some(Node::Container));
        self.call("type1 space").map_err(SpaceError::Dup)?;
        dma::Type1::with_ioctl(FakeType1, mask_bits).map_err(SpaceError::Space)
    }

    fn iommufd_space(&self, iommufd: OwnedFd, mask_bits: u32) -> Result<dma::Iommufd, SpaceError> {
        // A duplicate of the `/dev/iommu` fd (the double does not track dups): open, at least.
        assert!(iommufd.as_raw_fd() >= 0);
        self.call("iommufd space").map_err(SpaceError::Dup)?;
        dma::Iommufd::with_ioctl(FakeIommufd, mask_bits).map_err(SpaceError::Space)
    }
}

/// A type1 container that maps anything, with no capabilities.
#[derive(Debug)]
struct FakeType1;

impl Type1Ioctl for FakeType1 {
    fn get_info(&self, buf: &mut [u8]) -> io::Result<()> {
        buf[4..8].copy_from_slice(&userdma_sys::vfio::VFIO_IOMMU_INFO_PGSIZES.to_ne_bytes());
        buf[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        Ok(())
    }
    fn map_dma(&self, _vaddr: u64, _iova: u64, _size: u64) -> io::Result<()> {
        Ok(())
    }
    fn unmap_dma(&self, _iova: u64, size: u64) -> io::Result<u64> {
        Ok(size)
    }
}

/// An IOAS with one 48-bit range.
#[derive(Debug)]
struct FakeIommufd;

impl IommufdIoctl for FakeIommufd {
    fn ioas_alloc(&self) -> io::Result<u32> {
        Ok(7)
    }
    fn ioas_iova_ranges(&self, _ioas: u32, out: &mut [IovaRange]) -> io::Result<(usize, u64)> {
        if let Some(first) = out.first_mut() {
            *first = IovaRange::new(0, (1 << 48) - 1).unwrap();
        }
        Ok((1, 0x1000))
    }
    fn ioas_map(&self, _ioas: u32, _vaddr: u64, _iova: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn ioas_unmap(&self, _ioas: u32, _iova: u64, len: u64) -> io::Result<u64> {
        Ok(len)
    }
    fn destroy(&self, _id: u32) -> io::Result<()> {
        Ok(())
    }
}

/// A fake sysfs tree: `BDF` (edu's IDs) and `OTHER`, both in IOMMU group 5.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().unwrap();
        let t = Tree { dir };
        for d in ["bus/pci/devices", "bus/pci/drivers", "devices/pci0000:00"] {
            fs::create_dir_all(t.root().join(d)).unwrap();
        }
        for b in [BDF, OTHER] {
            let dev = t.dev_dir(b);
            fs::create_dir_all(&dev).unwrap();
            symlink(
                format!("../../../devices/pci0000:00/{b}"),
                t.root().join("bus/pci/devices").join(b),
            )
            .unwrap();
            fs::write(dev.join("vendor"), "0x1234\n").unwrap();
            fs::write(dev.join("device"), "0x11e8\n").unwrap();
            fs::write(dev.join("class"), "0x00ff00\n").unwrap();
            let mut resource = format!(
                "0x{:016x} 0x{:016x} 0x{:016x}\n",
                0xfe00_0000u64, 0xfe00_3fffu64, 0x40200u64
            );
            for _ in 1..7 {
                resource.push_str(&format!("0x{0:016x} 0x{0:016x} 0x{0:016x}\n", 0));
            }
            fs::write(dev.join("resource"), resource).unwrap();
        }
        t
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn dev_dir(&self, bdf: &str) -> PathBuf {
        self.root().join("devices/pci0000:00").join(bdf)
    }

    fn bind(&self, bdf: &str, driver: &str) -> &Tree {
        fs::create_dir_all(self.root().join("bus/pci/drivers").join(driver)).unwrap();
        symlink(
            format!("../../../bus/pci/drivers/{driver}"),
            self.dev_dir(bdf).join("driver"),
        )
        .unwrap();
        self
    }

    fn group(&self, n: u32, name: Option<&str>) -> &Tree {
        let dir = self.root().join(format!("kernel/iommu_groups/{n}"));
        fs::create_dir_all(dir.join("devices")).unwrap();
        fs::write(dir.join("type"), "DMA\n").unwrap();
        if let Some(name) = name {
            fs::write(dir.join("name"), format!("{name}\n")).unwrap();
        }
        for m in [BDF, OTHER] {
            symlink(
                format!("../../../../devices/pci0000:00/{m}"),
                dir.join("devices").join(m),
            )
            .unwrap();
            symlink(
                format!("../../../kernel/iommu_groups/{n}"),
                self.dev_dir(m).join("iommu_group"),
            )
            .unwrap();
        }
        self
    }

    fn cdev(&self, name: &str) -> &Tree {
        fs::create_dir_all(self.dev_dir(BDF).join("vfio-dev").join(name)).unwrap();
        self
    }

    fn host(&self, fake: &Arc<Fake>) -> Host {
        Host {
            sysfs: pci::Sysfs::new(self.root()),
            kernel: Arc::clone(fake) as Arc<dyn Kernel>,
        }
    }
}

/// The usual setup: `BDF` on vfio-pci, `OTHER` unbound, group 5.
fn setup() -> (Tree, Arc<Fake>) {
    let tree = Tree::new();
    tree.bind(BDF, "vfio-pci").group(5, None);
    (tree, Fake::new())
}

fn opts() -> Options {
    Options::new().dma_mask_bits(28)
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn the_opener_states_the_dma_alignment() {
    let (tree, fake) = setup();
    // QEMU's edu takes any byte address.
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts().dma_alignment(1)).unwrap();
    assert_eq!(Device::dma_alignment(&vfio), 1);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn type1_open_sequence_and_info() {
    let (tree, fake) = setup();
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    assert_eq!(vfio.mode(), Mode::Type1);
    assert_eq!(vfio.group(), Some(5));
    assert_eq!(vfio.bdf(), bdf());
    assert_eq!(vfio.identity().kind, Kind::Vfio);
    assert_eq!(vfio.identity().name, "1234:11e8");
    // A PCI function the library knows nothing about needs a page, unless its opener says.
    assert_eq!(Device::dma_alignment(&vfio), 4096);
    let log = fake.log();
    let order = [
        "open /dev/vfio/vfio",
        "VFIO_GET_API_VERSION",
        "open /dev/vfio/5",
        "VFIO_GROUP_GET_STATUS",
        "VFIO_GROUP_SET_CONTAINER 5",
        "VFIO_CHECK_EXTENSION 3",
        "VFIO_SET_IOMMU 3",
        "type1 space",
        "VFIO_GROUP_GET_DEVICE_FD 0000:00:03.0",
        "VFIO_DEVICE_GET_INFO",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|op| {
            log.iter()
                .position(|l| l == op)
                .unwrap_or_else(|| panic!("{op} not in {log:?}"))
        })
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{log:?}");
    // Region info: BAR0's sparse areas were read after the buffer grew.
    assert_eq!(vfio.regions().len(), 9);
    let bar0 = &vfio.regions()[0];
    assert_eq!(bar0.size, BAR0_LEN);
    assert_eq!(bar0.sparse.as_ref().map(Vec::len), Some(2));
    assert_eq!(vfio.irqs().len(), 5);
    assert!(vfio.irqs()[0].maskable());
    assert_eq!(vfio.irqs()[1].count, 4);
    assert_eq!(vfio.irqs()[3].count, 0);
    assert_eq!(vfio.regions()[8].size, 0);
    // Bus mastering and memory decoding were turned on through config space.
    let command = fake.device_bytes(7 * REGION_STRIDE + 4, 2);
    assert_eq!(u16::from_le_bytes([command[0], command[1]]) & 0x6, 0x6);
    let vendor: u16 = vfio.config_read(0).unwrap();
    assert_eq!(vendor, 0x1234);
    assert!(vfio.config_read::<u32>(254).is_err());
    assert_eq!(vfio.dma_space().kind(), dma::Kind::Type1);
    assert_eq!(vfio.dma_space().dma_mask_bits(), 28);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn sparse_bar_maps_allowed_areas_and_serves_the_rest_by_file() {
    let (tree, fake) = setup();
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    assert_eq!(vfio.bar_mapped_len(0).unwrap(), 0x2000);
    let bar = vfio.bar(0).unwrap();
    assert_eq!(bar.len(), BAR0_LEN as usize);
    // One write in a mapped area, one in the hole; both land in the device file.
    bar.write(0x10, 0xdead_beef_u32).unwrap();
    bar.write(0x1010, 0x1234_5678_u32).unwrap();
    bar.write(0x3ff8, 0x0102_0304_0506_0708_u64).unwrap();
    assert_eq!(fake.device_bytes(0x10, 4), 0xdead_beef_u32.to_le_bytes());
    assert_eq!(fake.device_bytes(0x1010, 4), 0x1234_5678_u32.to_le_bytes());
    assert_eq!(bar.read::<u32>(0x1010).unwrap(), 0x1234_5678);
    assert_eq!(bar.read::<u64>(0x3ff8).unwrap(), 0x0102_0304_0506_0708);
    assert_eq!(bar.read::<u32>(0x10).unwrap(), 0xdead_beef);
    assert!(bar.read::<u32>(0x4000).is_err());
    // BAR2 is not mappable: file-backed only. BAR1 does not exist.
    assert_eq!(vfio.bar_mapped_len(2).unwrap(), 0);
    let io = vfio.bar(2).unwrap();
    io.write(0x4, 7_u8).unwrap();
    assert_eq!(io.read::<u8>(0x4).unwrap(), 7);
    assert!(matches!(vfio.bar(1), Err(Error::NoBar { index: 1, .. })));
    assert!(matches!(vfio.bar(6), Err(Error::NoBar { index: 6, .. })));
    // A block outlives the device: the mapping and fd stay valid.
    drop(vfio);
    assert_eq!(bar.read::<u32>(0x10).unwrap(), 0xdead_beef);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn interrupts_enable_replace_mask_and_disable() {
    let (tree, fake) = setup();
    let vfio = Vfio::open_in(
        &tree.host(&fake),
        bdf(),
        &opts().interrupts(IrqKind::Msi, 2),
    )
    .unwrap();
    assert_eq!(vfio.vectors(), 2);
    assert_eq!(vfio.interrupt_kind(), Some(IrqKind::Msi));
    let sets = fake.state().irq_sets.clone();
    let last = sets.last().unwrap();
    assert_eq!(
        read_u32(last, 4).unwrap(),
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER
    );
    assert_eq!((read_u32(last, 8), read_u32(last, 16)), (Some(1), Some(2)));
    assert_eq!(last.len(), 20 + 8);
    // The eventfds given to the kernel are the ones handed out.
    let fd0 = i32::from_ne_bytes(last[20..24].try_into().unwrap());
    let event = vfio.interrupt(0).unwrap();
    event.signal().unwrap();
    let mut word = [0u8; 8];
    // SAFETY: `fd0` is the eventfd the device still owns; read 8 bytes into `word`.
    let n = unsafe { libc::read(fd0, word.as_mut_ptr().cast(), 8) };
    assert_eq!(n, 8);
    assert_eq!(u64::from_ne_bytes(word), 1);
    assert!(matches!(
        vfio.interrupt(2),
        Err(Error::NoSuchVector {
            vector: 2,
            count: 2,
            ..
        })
    ));
    // MSI is not maskable per the fake's flags.
    assert!(matches!(
        vfio.set_masked(0, true),
        Err(Error::Vfio(VfioError::NotMaskable {
            kind: IrqKind::Msi,
            ..
        }))
    ));
    // More vectors than the device has, a kind it lacks.
    assert!(matches!(
        vfio.enable_interrupts(IrqKind::Msi, 5),
        Err(Error::Vfio(VfioError::NoSuchIrq {
            requested: 5,
            available: 4,
            ..
        }))
    ));
    assert!(matches!(
        vfio.enable_interrupts(IrqKind::MsiX, 1),
        Err(Error::Vfio(VfioError::NoSuchIrq { available: 0, .. }))
    ));
    // Switching to INTx disables MSI first, then unmask works.
    vfio.enable_interrupts(IrqKind::Intx, 1).unwrap();
    vfio.set_masked(0, false).unwrap();
    let log = fake.log();
    let disable = format!(
        "VFIO_DEVICE_SET_IRQS {:#x} 1 0 0",
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER
    );
    let unmask = format!(
        "VFIO_DEVICE_SET_IRQS {:#x} 0 0 1",
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_UNMASK
    );
    assert!(log.contains(&disable), "{log:?}");
    assert!(log.contains(&unmask), "{log:?}");
    assert_eq!(vfio.vectors(), 1);
    vfio.disable_interrupts().unwrap();
    assert_eq!(vfio.vectors(), 0);
    assert!(vfio.set_masked(0, false).is_err());
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn set_irqs_failure_is_reported() {
    let (tree, fake) = setup();
    fake.fail("VFIO_DEVICE_SET_IRQS 0x24 1 0 1");
    let err = Vfio::open_in(
        &tree.host(&fake),
        bdf(),
        &opts().interrupts(IrqKind::Msi, 1),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Vfio(VfioError::Ioctl {
                ioctl: "VFIO_DEVICE_SET_IRQS",
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains(BDF));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn reset_and_hot_reset_fallback() {
    let (tree, fake) = setup();
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    vfio.reset().unwrap();
    assert!(fake.log().contains(&"VFIO_DEVICE_RESET".to_owned()));
    drop(vfio);
    fake.state().device_flags = VFIO_DEVICE_FLAGS_PCI;
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    // No function reset, but every device on the bus is in this device's group: a bus reset,
    // proving ownership with the group's fd.
    vfio.reset().unwrap();
    let log = fake.log();
    assert!(
        log.contains(&"VFIO_DEVICE_PCI_HOT_RESET Some(Group(5))".to_owned()),
        "{log:?}"
    );
    // A device of another group on the bus: no bus reset, and the message names it.
    fake.state().neighbour_group = Some(6);
    match vfio.reset() {
        Err(Error::NoReset { affected, .. }) => {
            assert_eq!(
                affected,
                vec![
                    "0000:00:03.0 (group 5)".to_owned(),
                    "0000:00:04.0 (group 6)".to_owned()
                ]
            );
        }
        other => panic!("{other:?}"),
    }
    let text = vfio.reset().unwrap_err().to_string();
    assert!(text.contains("0000:00:04.0"), "{text}");
    let resets = fake
        .log()
        .iter()
        .filter(|l| l.starts_with("VFIO_DEVICE_PCI_HOT_RESET"))
        .count();
    assert_eq!(resets, 1, "no bus reset while another group is on the bus");
    // No bus reset either (edu in the guest): the message says what is left to do.
    fake.fail("VFIO_DEVICE_GET_PCI_HOT_RESET_INFO");
    let text = vfio.reset().unwrap_err().to_string();
    assert!(
        text.contains("no bus reset") && text.contains(BDF),
        "{text}"
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn drop_releases_in_order_and_group_is_attached_once() {
    let (tree, fake) = setup();
    let container = Container::open_in(Arc::clone(&fake) as Arc<dyn Kernel>).unwrap();
    let options = opts().container(Arc::clone(&container));
    let first = Vfio::open_in(&tree.host(&fake), bdf(), &options).unwrap();
    let second = Vfio::open_in(&tree.host(&fake), bdf(), &options).unwrap();
    assert_eq!(container.groups(), vec![5]);
    let log = fake.log();
    let count = |op: &str| log.iter().filter(|l| l.as_str() == op).count();
    assert_eq!(count("VFIO_GROUP_SET_CONTAINER 5"), 1, "{log:?}");
    assert_eq!(count("VFIO_SET_IOMMU 3"), 1);
    assert_eq!(count("type1 space"), 1);
    assert_eq!(count("VFIO_GROUP_GET_DEVICE_FD 0000:00:03.0"), 2);
    // Both share the space.
    let region = Arc::new(
        crate::memory::Region::builder(0x1000)
            .page_size(crate::memory::PageSize::Base)
            .build()
            .unwrap(),
    );
    let mapping = first.dma_space().map(region).unwrap();
    assert_eq!(second.dma_space().stats().maps, 1);
    drop(mapping);
    first.enable_interrupts(IrqKind::Intx, 1).unwrap();
    drop(first);
    assert!(!fake
        .log()
        .contains(&"VFIO_GROUP_UNSET_CONTAINER 5".to_owned()));
    let disable = format!(
        "VFIO_DEVICE_SET_IRQS {:#x} 0 0 0",
        VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER
    );
    assert!(fake.log().contains(&disable), "interrupts disabled on drop");
    drop(second);
    assert!(fake
        .log()
        .contains(&"VFIO_GROUP_UNSET_CONTAINER 5".to_owned()));
    assert!(container.groups().is_empty());
    // A narrower mask than the shared space's is refused; a wider one is fine.
    let wide = Vfio::open_in(
        &tree.host(&fake),
        bdf(),
        &Options::new().container(Arc::clone(&container)),
    )
    .unwrap();
    let narrow = Vfio::open_in(
        &tree.host(&fake),
        bdf(),
        &opts().container(Arc::clone(&container)),
    );
    assert!(matches!(
        narrow,
        Err(Error::Vfio(VfioError::ContainerMask {
            wanted: 28,
            space: 64,
            ..
        }))
    ));
    drop(wide);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn iommufd_path_when_offered() {
    let (tree, fake) = setup();
    tree.cdev("vfio3");
    fake.state().existing = vec![
        PathBuf::from("/dev/iommu"),
        PathBuf::from("/dev/vfio/devices/vfio3"),
    ];
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    assert_eq!(vfio.mode(), Mode::Iommufd);
    assert_eq!(vfio.group(), None);
    assert!(vfio.container().is_none());
    assert_eq!(vfio.dma_space().kind(), dma::Kind::Iommufd);
    let log = fake.log();
    for op in [
        "open /dev/vfio/devices/vfio3",
        "open /dev/iommu",
        "iommufd space",
        "VFIO_DEVICE_BIND_IOMMUFD",
        "VFIO_DEVICE_ATTACH_IOMMUFD_PT 7",
    ] {
        assert!(log.contains(&op.to_owned()), "{op} not in {log:?}");
    }
    assert!(!log.iter().any(|l| l.starts_with("open /dev/vfio/vfio")));
    drop(vfio);
    // Opting out takes the container path.
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts().iommufd(false)).unwrap();
    assert_eq!(vfio.mode(), Mode::Type1);
    drop(vfio);
    // A failed bind is an error naming the ioctl and what the kernel needs.
    fake.fail("VFIO_DEVICE_BIND_IOMMUFD");
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(err.to_string().contains("CONFIG_IOMMUFD"), "{err}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn without_iommufd_node_the_container_path_is_used() {
    let (tree, fake) = setup();
    tree.cdev("vfio3");
    fake.state().existing = vec![PathBuf::from("/dev/vfio/devices/vfio3")];
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    assert_eq!(vfio.mode(), Mode::Type1);
}

#[test]
fn refusals_before_any_kernel_call() {
    // Unbound.
    let tree = Tree::new();
    tree.group(5, None);
    let fake = Fake::new();
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(matches!(err, Error::NotBound { .. }));
    assert!(err
        .to_string()
        .contains("userdma bind 0000:00:03.0 --driver vfio-pci"));
    assert!(fake.log().is_empty());
    // Bound elsewhere.
    tree.bind(BDF, "nvme");
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(matches!(err, Error::WrongDriver { ref driver, .. } if driver == "nvme"));
    assert!(err.to_string().contains("userdma bind"));
    // Not a device at all.
    let err =
        Vfio::open_in(&tree.host(&fake), "0000:00:09.0".parse().unwrap(), &opts()).unwrap_err();
    assert!(matches!(err, Error::Sysfs { .. }));
}

#[test]
fn group_viability_names_the_culprits() {
    let (tree, fake) = setup();
    tree.bind(OTHER, "e1000e");
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    match &err {
        Error::Vfio(VfioError::GroupNotViable {
            group, culprits, ..
        }) => {
            assert_eq!(*group, 5);
            assert_eq!(
                culprits,
                &vec![(OTHER.parse().unwrap(), "e1000e".to_owned())]
            );
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("0000:00:04.0 (e1000e)") && text.contains("userdma bind 0000:00:04.0"),
        "{text}"
    );
    assert!(fake.log().is_empty());
}

#[test]
fn group_not_viable_per_kernel() {
    let (tree, fake) = setup();
    fake.state().viable = false;
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(
        matches!(err, Error::Vfio(VfioError::GroupNotViable { ref culprits, .. }) if culprits.is_empty())
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn noiommu_needs_the_opt_in() {
    let tree = Tree::new();
    tree.bind(BDF, "vfio-pci").group(5, Some("vfio-noiommu"));
    let fake = Fake::new();
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(matches!(
        err,
        Error::Vfio(VfioError::NoIommuRefused { group: 5, .. })
    ));
    assert!(err.to_string().contains("allow_noiommu"));
    assert!(fake.log().is_empty());
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts().allow_noiommu(true)).unwrap();
    assert_eq!(vfio.mode(), Mode::NoIommu);
    assert_eq!(vfio.dma_space().kind(), dma::Kind::Physical);
    let log = fake.log();
    assert!(
        log.contains(&"open /dev/vfio/noiommu-5".to_owned()),
        "{log:?}"
    );
    assert!(log.contains(&format!("VFIO_SET_IOMMU {VFIO_NOIOMMU_IOMMU}")));
    // A container set to no-IOMMU does not take a type1 device.
    let container = vfio.container().unwrap();
    let tree2 = Tree::new();
    tree2.bind(BDF, "vfio-pci").group(6, None);
    let err = Vfio::open_in(&tree2.host(&fake), bdf(), &opts().container(container)).unwrap_err();
    assert!(
        matches!(err, Error::Vfio(VfioError::ContainerModel { .. })),
        "{err}"
    );
}

#[test]
fn no_group_is_an_error() {
    let tree = Tree::new();
    tree.bind(BDF, "vfio-pci");
    let fake = Fake::new();
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(matches!(err, Error::Vfio(VfioError::NoGroup { .. })));
}

#[test]
fn every_kernel_failure_in_the_open_sequence_is_an_error_and_releases() {
    let ops = [
        "open /dev/vfio/vfio",
        "VFIO_GET_API_VERSION",
        "open /dev/vfio/5",
        "VFIO_GROUP_GET_STATUS",
        "VFIO_GROUP_SET_CONTAINER 5",
        "VFIO_CHECK_EXTENSION 3",
        "VFIO_SET_IOMMU 3",
        "type1 space",
        "VFIO_GROUP_GET_DEVICE_FD 0000:00:03.0",
        "VFIO_DEVICE_GET_INFO",
        "VFIO_DEVICE_GET_REGION_INFO 0",
        "VFIO_DEVICE_GET_IRQ_INFO 1",
    ];
    // Under Miri (scripts/miri.sh) every third, the last included: each open is ~3.5 s
    // interpreted, and the failures share the same release path (those before and after the
    // container is attached are both in the sample).
    let step = if cfg!(miri) { 3 } else { 1 };
    for op in ops.iter().copied().rev().step_by(step) {
        let (tree, fake) = setup();
        fake.fail(op);
        let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(BDF) || text.contains("/dev/vfio/vfio"),
            "{op}: {text}"
        );
        // Whatever was attached was detached again.
        let log = fake.log();
        let attached = log.iter().any(|l| l == "VFIO_GROUP_SET_CONTAINER 5")
            && op != "VFIO_GROUP_SET_CONTAINER 5";
        let detached = log.iter().any(|l| l == "VFIO_GROUP_UNSET_CONTAINER 5");
        assert_eq!(attached, detached, "{op}: {log:?}");
    }
}

#[test]
fn wrong_api_version_is_refused() {
    let (tree, fake) = setup();
    fake.state().api_version = 1;
    // The double answers 0 (VFIO_API_VERSION) unless told otherwise.
    let err = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap_err();
    assert!(
        matches!(err, Error::Vfio(VfioError::Unsupported { .. })),
        "{err}"
    );
}

#[test]
fn irq_set_layout() {
    let buf = irq_set(0x24, 1, 2, 3, &[1, 0, 0, 0]);
    assert_eq!(buf.len(), 24);
    assert_eq!(read_u32(&buf, 0), Some(24));
    assert_eq!(read_u32(&buf, 4), Some(0x24));
    assert_eq!(read_u32(&buf, 8), Some(1));
    assert_eq!(read_u32(&buf, 12), Some(2));
    assert_eq!(read_u32(&buf, 16), Some(3));
    assert_eq!(&buf[20..], &[1, 0, 0, 0]);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn a_bus_reset_the_kernel_finds_busy_is_tried_again_for_a_while() {
    let (tree, fake) = setup();
    fake.state().device_flags = VFIO_DEVICE_FLAGS_PCI;
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    let tries = || {
        fake.log()
            .iter()
            .filter(|l| l.starts_with("VFIO_DEVICE_PCI_HOT_RESET "))
            .count()
    };
    // Busy twice, then free: the third try resets.
    fake.state().busy = 2;
    assert!(vfio.hot_reset().unwrap());
    assert_eq!(tries(), 3);
    // Busy for longer than the patience: the kernel's error, after tries spread over it.
    fake.state().busy = u32::MAX;
    let start = std::time::Instant::now();
    let err = vfio.hot_reset().unwrap_err();
    let took = start.elapsed();
    assert!(
        took >= super::hot_reset::BUSY_PATIENCE && took < 10 * super::hot_reset::BUSY_PATIENCE,
        "{took:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("VFIO_DEVICE_PCI_HOT_RESET") && text.contains(BDF),
        "{text}"
    );
    let more = tries() - 3;
    assert!((5..=20).contains(&more), "{more} tries");
    // Any other error is returned at once.
    fake.state().busy = 0;
    fake.fail("VFIO_DEVICE_PCI_HOT_RESET Some(Group(5))");
    let before = tries();
    assert!(vfio.hot_reset().is_err());
    assert_eq!(tries(), before + 1);
}

#[test]
fn hot_reset_parse_stops_at_the_end() {
    let mut buf = vec![0u8; 12 + 8];
    buf[12..16].copy_from_slice(&9u32.to_ne_bytes());
    buf[18] = 0x02;
    buf[19] = (0x1f << 3) | 7;
    assert_eq!(
        parse_hot_reset(&buf, 3),
        vec!["0000:02:1f.7 (group 9)".to_owned()]
    );
    assert!(parse_hot_reset(&buf[..10], 1).is_empty());
}

/// The eventfd the library gave the fake for irq `index` (the last registration of it).
fn registered_eventfd(fake: &Fake, index: u32) -> RawFd {
    let sets = fake.state().irq_sets.clone();
    let set = sets
        .iter()
        .rev()
        .find(|s| {
            read_u32(s, 8) == Some(index)
                && read_u32(s, 4) == Some(VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER)
                && read_u32(s, 16) == Some(1)
        })
        .unwrap_or_else(|| panic!("no eventfd registered for irq index {index}: {sets:?}"));
    i32::from_ne_bytes(set[20..24].try_into().unwrap())
}

/// Raises the eventfd `fd` the way the kernel signals it.
fn raise(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: `fd` is an eventfd the device holds open; writes 8 bytes from `one`.
    let n = unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
    assert_eq!(n, 8);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn the_kernels_request_cuts_the_device_off_and_releases_it() {
    use crate::device::Event;
    let (tree, fake) = setup();
    let vfio = Vfio::open_in(
        &tree.host(&fake),
        bdf(),
        &opts().interrupts(IrqKind::Msi, 2),
    )
    .unwrap();
    assert!(vfio.watches_removal());
    let mut events = vfio.events().unwrap();
    let bar = vfio.bar(0).unwrap();
    bar.write::<u32>(0x10, 0x1234_5678).unwrap();
    assert_eq!(bar.read::<u32>(0x10).unwrap(), 0x1234_5678);
    let command: u16 = vfio.config_read(userdma_sys::pci::PCI_COMMAND).unwrap();
    assert_ne!(
        command & userdma_sys::pci::PCI_COMMAND_MASTER,
        0,
        "open turns DMA on"
    );
    let vector = vfio.interrupt(1).unwrap();
    assert_eq!(events.try_next(), None);

    raise(registered_eventfd(&fake, VFIO_PCI_REQ_IRQ_INDEX));
    let event = events
        .wait(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    assert_eq!(event, Some(Event::Removal));
    assert!(vfio.is_removed());
    // Bus mastering went off in the device's config space before anything else.
    let mut config = [0u8; 2];
    File::open(&fake.device_file)
        .unwrap()
        .read_exact_at(&mut config, 7 * REGION_STRIDE + 4)
        .unwrap();
    assert_eq!(
        u16::from_le_bytes(config) & userdma_sys::pci::PCI_COMMAND_MASTER,
        0
    );
    // The vectors were signalled, so a queue asleep on one wakes.
    assert_eq!(vector.try_read().unwrap(), Some(1));
    // The release happens right after the report: wait for the device fd to become /dev/null.
    let null = fs::metadata("/dev/null").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let path = format!("/proc/self/fd/{}", vfio.device.as_raw_fd());
        let now = fs::metadata(path).unwrap();
        if std::os::unix::fs::MetadataExt::rdev(&now) == std::os::unix::fs::MetadataExt::rdev(&null)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the device fd was not released"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // The mapped part of the BAR reads all-ones and a write reaches no device (below); the
    // file-backed part fails.
    assert_eq!(bar.read::<u32>(0x10).unwrap(), u32::MAX);
    assert_eq!(bar.read::<u64>(0x2008).unwrap(), u64::MAX);
    bar.write::<u32>(0x10, 0).unwrap();
    assert!(bar.read::<u32>(0x1000).is_err());
    // The device file itself was not written by the cut-off.
    let mut word = [0u8; 4];
    File::open(&fake.device_file)
        .unwrap()
        .read_exact_at(&mut word, 0x10)
        .unwrap();
    assert_eq!(u32::from_ne_bytes(word), 0x1234_5678);
    // Everything that needs the device says it was removed.
    assert!(matches!(vfio.bar(2), Err(Error::Removed { .. })));
    assert!(matches!(vfio.reset(), Err(Error::Removed { .. })));
    assert!(matches!(
        vfio.enable_interrupts(IrqKind::Msi, 1),
        Err(Error::Removed { .. })
    ));
    assert!(vfio.stop_queue(0, std::time::Duration::ZERO).is_ok());
    let err = crate::Error::from(vfio.reset().unwrap_err());
    assert_eq!(err.code(), crate::Code::Removed);
    assert!(err.to_string().contains("1234:11e8"), "{err}");
    // A second request changes nothing; a late subscriber still sees the removal.
    raise(registered_eventfd(&fake, VFIO_PCI_REQ_IRQ_INDEX));
    let mut late = vfio.events().unwrap();
    assert_eq!(late.try_next(), Some(Event::Removal));
    drop(bar);
    drop(vfio);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the device's removal watcher polls the request eventfd with poll(2), which Miri does not emulate"
)]
fn error_interrupts_are_counted_and_reported() {
    use crate::device::Event;
    let (tree, fake) = setup();
    // The fake's function has no error IRQ (conventional PCI): it is not registered.
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    let sets = fake.state().irq_sets.clone();
    assert!(sets
        .iter()
        .all(|s| read_u32(s, 8) != Some(VFIO_PCI_ERR_IRQ_INDEX)));
    drop(vfio);
    // A PCIe function with one.
    fake.state().err_irq = true;
    let vfio = Vfio::open_in(&tree.host(&fake), bdf(), &opts()).unwrap();
    let mut events = vfio.events().unwrap();
    let fd = registered_eventfd(&fake, VFIO_PCI_ERR_IRQ_INDEX);
    raise(fd);
    raise(fd);
    let mut total = 0;
    while total < 2 {
        match events
            .wait(Some(std::time::Duration::from_secs(10)))
            .unwrap()
        {
            Some(Event::Error { count, total: t }) => {
                total += count;
                assert_eq!(t, total);
            }
            other => panic!("expected an error event, got {other:?}"),
        }
    }
    assert_eq!(vfio.events().unwrap().errors(), 2);
    assert!(!vfio.is_removed(), "an error is not a removal");
    assert!(vfio.bar(0).is_ok());
}
