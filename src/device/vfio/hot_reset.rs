//! Bus (hot) resets of a [`Vfio`] device: what a bus reset would touch, as
//! `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO` says, and the reset itself
//! (`VFIO_DEVICE_PCI_HOT_RESET`) when this process owns every device it touches.

use std::os::fd::AsFd;
use std::time::Duration;

use userdma_sys::vfio::{
    vfio_pci_hot_reset, vfio_pci_hot_reset_info, VFIO_PCI_HOT_RESET_FLAG_DEV_ID,
    VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED,
};

use super::error::Error as VfioError;
use super::info::{put, read_u32};
use super::{Attachment, Vfio};
use crate::device::Error as DeviceError;

impl Vfio {
    /// The devices a bus reset would reset, as the kernel says (`BDF (group N)`).
    pub fn hot_reset_devices(&self) -> Result<Vec<String>, DeviceError> {
        let (_, buf, count) = self.hot_reset_info_raw()?;
        Ok(parse_hot_reset(&buf, count))
    }

    /// `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO`: its flags, the reply and how many devices it
    /// lists.
    fn hot_reset_info_raw(&self) -> Result<(u32, Vec<u8>, usize), DeviceError> {
        let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
        let mut room = 8usize;
        for _ in 0..4 {
            let len = header + room * 8;
            let mut buf = vec![0u8; len];
            put(
                &mut buf,
                0,
                &u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes(),
            );
            let result = self.kernel.hot_reset_info(self.device.as_fd(), &mut buf);
            let count = read_u32(&buf, 8).and_then(|c| usize::try_from(c).ok());
            match result {
                Ok(()) => {
                    let flags = read_u32(&buf, 4).unwrap_or(0);
                    let count = count.unwrap_or(0).min(room);
                    return Ok((flags, buf, count));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    room = count
                        .filter(|&c| c > room && c < 4096)
                        .ok_or(VfioError::Ioctl {
                            bdf: self.bdf,
                            ioctl: "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
                            source: e,
                        })?;
                }
                Err(source) => {
                    return Err(VfioError::Ioctl {
                        bdf: self.bdf,
                        ioctl: "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
                        source,
                    }
                    .into())
                }
            }
        }
        Ok((0, Vec::new(), 0))
    }

    /// Resets the bus the device is on (`VFIO_DEVICE_PCI_HOT_RESET`, a secondary bus reset),
    /// when this process owns every device it touches: on the container path, when they are
    /// all in this device's group (its fd proves the ownership); on the device cdev path, when
    /// the kernel says they are all owned through this iommufd. `Ok(false)` when it cannot:
    /// another group's device is on the bus, or the kernel offers no bus reset. A reset the
    /// kernel finds busy (`EBUSY`: it only tries the locks it needs) is tried again, 1 ms
    /// later and then twice as long each time, for up to half a second.
    pub fn hot_reset(&self) -> Result<bool, DeviceError> {
        self.check_present()?;
        let Ok((flags, buf, count)) = self.hot_reset_info_raw() else {
            return Ok(false);
        };
        if count == 0 {
            return Ok(false);
        }
        let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
        let group_fds: Vec<i32> = match &self.attachment {
            Attachment::Group(group) => {
                if flags & VFIO_PCI_HOT_RESET_FLAG_DEV_ID != 0 {
                    return Ok(false);
                }
                let all_ours =
                    (0..count).all(|i| read_u32(&buf, header + i * 8) == Some(group.number()));
                if !all_ours {
                    return Ok(false);
                }
                vec![group.as_raw_fd()]
            }
            Attachment::Iommufd { .. } => {
                if flags & VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED == 0 {
                    return Ok(false);
                }
                Vec::new()
            }
        };
        let len = std::mem::size_of::<vfio_pci_hot_reset>() + 4 * group_fds.len();
        let mut arg = vec![0u8; len];
        put(
            &mut arg,
            0,
            &u32::try_from(len).unwrap_or(u32::MAX).to_ne_bytes(),
        );
        put(
            &mut arg,
            8,
            &u32::try_from(group_fds.len()).unwrap_or(0).to_ne_bytes(),
        );
        for (i, fd) in group_fds.iter().enumerate() {
            put(&mut arg, 12 + 4 * i, &fd.to_ne_bytes());
        }
        let mut pause = BUSY_FIRST_PAUSE;
        let mut waited = Duration::ZERO;
        loop {
            match self.kernel.hot_reset(self.device.as_fd(), &arg) {
                Ok(()) => return Ok(true),
                // The kernel only tries the locks of the devices the reset touches (and, on
                // older kernels, of every process that maps their BARs) and asks the caller
                // to come back when one is held at that moment (a BAR access or page fault
                // under way, another thread mapping memory): a moment later it is free.
                Err(source)
                    if source.raw_os_error() == Some(libc::EBUSY) && waited < BUSY_PATIENCE =>
                {
                    std::thread::sleep(pause);
                    waited += pause;
                    pause = (pause * 2).min(BUSY_PATIENCE.saturating_sub(waited));
                }
                Err(source) => {
                    return Err(VfioError::Ioctl {
                        bdf: self.bdf,
                        ioctl: "VFIO_DEVICE_PCI_HOT_RESET",
                        source,
                    }
                    .into())
                }
            }
        }
    }
}

/// The first pause after a bus reset the kernel found busy; each further one doubles.
const BUSY_FIRST_PAUSE: Duration = Duration::from_millis(1);

/// How long a bus reset is tried again while the kernel finds it busy (`EBUSY`) before its
/// error is returned.
pub(crate) const BUSY_PATIENCE: Duration = Duration::from_millis(500);

/// The devices of a `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO` reply, as `dddd:bb:dd.f (group N)`.
pub(crate) fn parse_hot_reset(buf: &[u8], count: usize) -> Vec<String> {
    let header = std::mem::size_of::<vfio_pci_hot_reset_info>();
    (0..count)
        .map_while(|i| {
            let at = header.checked_add(i.checked_mul(8)?)?;
            let group = read_u32(buf, at)?;
            let segment = u16::from_ne_bytes(buf.get(at + 4..at + 6)?.try_into().ok()?);
            let bus = *buf.get(at + 6)?;
            let devfn = *buf.get(at + 7)?;
            Some(format!(
                "{segment:04x}:{bus:02x}:{:02x}.{} (group {group})",
                devfn >> 3,
                devfn & 7
            ))
        })
        .collect()
}
