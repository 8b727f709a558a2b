//! IOMMU faults as the kernel reports them: the lines the Intel (`DMAR: `) and AMD (`AMD-Vi: `)
//! drivers log when a device's DMA is refused, parsed into [`IommuFault`]s, and [`KernelLog`],
//! which reads new kernel messages from `/dev/kmsg` without blocking.
//!
//! The formats, unchanged from Linux 6.1 to 6.12 (`drivers/iommu/intel/dmar.c`,
//! `dmar_fault_do_one`; `drivers/iommu/amd/iommu.c`, `amd_iommu_report_page_fault`):
//!
//! ```text
//! DMAR: [DMA Write NO_PASID] Request device [00:03.0] fault addr 0x6400000 [fault reason 0x05] PTE Write access is not set
//! DMAR: [DMA Read PASID 0x1] Request device [00:03.0] fault addr 0x6400000 [fault reason 0x06] PTE Read access is not set
//! vfio-pci 0000:00:03.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000b address=0x6400000 flags=0x0020]
//! AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:00:03.0 domain=0x000b address=0x6400000 flags=0x0020]
//! ```
//!
//! The Intel line names no PCI segment: its device is taken to be in segment 0. Interrupt
//! remapping faults (`[INTR-REMAP]`) are not DMA faults and are not parsed. The kernel rate-limits
//! these messages (ten in five seconds per IOMMU unit, or per device for AMD), so a burst of
//! faults may be reported as fewer lines.
//!
//! ```no_run
//! use userdma::pci::faults::KernelLog;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut log = KernelLog::open()?; // from now on
//! // ... a DMA the IOMMU refuses ...
//! for fault in log.faults()? {
//!     println!("{} {:?} at {:#x}: {}", fault.bdf, fault.kind, fault.addr, fault.reason);
//! }
//! # Ok(()) }
//! ```

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use super::Bdf;

/// The kernel's message device.
pub const KMSG_PATH: &str = "/dev/kmsg";
/// The largest record read at once: a message (at most 1 KiB in the kernel's buffer) and its
/// dictionary lines.
const RECORD_MAX: usize = 16 << 10;
/// How often [`KernelLog::wait_for`] looks for new messages.
const POLL: Duration = Duration::from_millis(10);

/// Which access the device made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// The device read memory (a DMA from host memory to the device).
    Read,
    /// The device wrote memory (a DMA from the device to host memory).
    Write,
}

/// One DMA fault an IOMMU driver logged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IommuFault {
    /// The requester (for Intel, in segment 0: the line names none).
    pub bdf: Bdf,
    /// The address the device used (an IOVA behind a translating IOMMU).
    pub addr: u64,
    /// Read or write.
    pub kind: Access,
    /// Why: for Intel the fault reason code and text (`0x05 PTE Write access is not set`),
    /// for AMD the event and its fields (`IO_PAGE_FAULT domain=0x000b flags=0x0020`).
    pub reason: String,
}

/// Parses one kernel message (the text of a `/dev/kmsg` record, or a `dmesg` line with its
/// time stamp) into the DMA fault it reports, or `None` when it reports none. Never panics.
pub fn parse_fault(line: &str) -> Option<IommuFault> {
    if let Some((_, rest)) = line.split_once("DMAR: ") {
        return parse_intel(rest);
    }
    if let Some((before, rest)) = line.split_once("AMD-Vi: ") {
        return parse_amd(before, rest);
    }
    None
}

/// `[DMA Write NO_PASID] Request device [00:03.0] fault addr 0x... [fault reason 0x05] text`.
fn parse_intel(rest: &str) -> Option<IommuFault> {
    let rest = rest.strip_prefix("[DMA ")?;
    let (kind, rest) = if let Some(rest) = rest.strip_prefix("Read") {
        (Access::Read, rest)
    } else {
        (Access::Write, rest.strip_prefix("Write")?)
    };
    // " NO_PASID]" or " PASID 0x1]".
    let (pasid, rest) = rest.split_once(']')?;
    let pasid = pasid.strip_prefix(' ')?;
    if pasid != "NO_PASID" {
        hex(pasid.strip_prefix("PASID ")?)?;
    }
    let rest = rest.strip_prefix(" Request device [")?;
    let (device, rest) = rest.split_once(']')?;
    let bdf: Bdf = device.parse().ok()?;
    let rest = rest.strip_prefix(" fault addr ")?;
    let (addr, rest) = rest.split_once(' ')?;
    let addr = hex(addr)?;
    let rest = rest.strip_prefix("[fault reason ")?;
    let (code, text) = rest.split_once(']')?;
    let code = hex(code)?;
    let text = text.trim();
    let reason = if text.is_empty() {
        format!("{code:#04x}")
    } else {
        format!("{code:#04x} {text}")
    };
    Some(IommuFault {
        bdf,
        addr,
        kind,
        reason,
    })
}

/// `Event logged [IO_PAGE_FAULT device=0000:00:03.0 domain=0x000b address=0x... flags=0x0020]`,
/// without `device=` when the message is the device's own (`vfio-pci 0000:00:03.0: AMD-Vi: ...`).
fn parse_amd(before: &str, rest: &str) -> Option<IommuFault> {
    let rest = rest.strip_prefix("Event logged [IO_PAGE_FAULT ")?;
    let (fields, _) = rest.split_once(']')?;
    let mut device = None;
    let mut addr = None;
    let mut flags = None;
    let mut kept = vec!["IO_PAGE_FAULT"];
    for field in fields.split_whitespace() {
        let (key, value) = field.split_once('=')?;
        match key {
            "device" => device = Some(value.parse::<Bdf>().ok()?),
            "address" => addr = Some(hex(value)?),
            "flags" => {
                flags = Some(hex(value)?);
                kept.push(field);
            }
            _ => kept.push(field),
        }
    }
    let bdf = match device {
        Some(bdf) => bdf,
        // dev_printk's prefix: "<driver> <device>: ".
        None => before
            .trim_end()
            .strip_suffix(':')?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()?,
    };
    // EVENT_FLAG_RW: set for a write.
    let kind = if flags? & 0x20 != 0 {
        Access::Write
    } else {
        Access::Read
    };
    Some(IommuFault {
        bdf,
        addr: addr?,
        kind,
        reason: kept.join(" "),
    })
}

/// A hex number with its `0x` (the kernel's `0x%llx`, `0x%02x`).
fn hex(text: &str) -> Option<u64> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))?;
    if digits.is_empty() || digits.len() > 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// The message of a `/dev/kmsg` record line (`PRIO,SEQ,USEC,FLAGS[,...];text`), or the line as
/// it is when it has no such header (a `dmesg` line, a file of messages). `None` for a record's
/// dictionary lines (they start with a space: ` SUBSYSTEM=pci`).
pub fn kmsg_message(line: &str) -> Option<&str> {
    if line.starts_with(' ') || line.is_empty() {
        return None;
    }
    match line.split_once(';') {
        Some((header, text))
            if header
                .split(',')
                .take(3)
                .all(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit())) =>
        {
            Some(text)
        }
        _ => Some(line),
    }
}

/// Reading the kernel log failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelLogError {
    /// The log cannot be opened (not root, or no `/dev/kmsg`).
    #[error("cannot open the kernel log {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The log cannot be positioned at its end.
    #[error("cannot seek to the end of the kernel log {path}")]
    Seek {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A read failed.
    #[error("cannot read the kernel log {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Where [`KernelLog::open_path`] starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// Only messages logged after opening.
    Now,
    /// Every message the file holds.
    Start,
}

/// New kernel messages, read without blocking: from `/dev/kmsg` (one record per read), or from
/// a file of messages, one a line.
#[derive(Debug)]
pub struct KernelLog {
    file: File,
    path: PathBuf,
    /// The end of the last read when it stopped inside a line (a file; kmsg reads whole records).
    partial: Vec<u8>,
    /// Records the kernel overwrote before they were read (`EPIPE` from kmsg).
    lost: u64,
}

impl KernelLog {
    /// `/dev/kmsg`, from now on. Needs `CAP_SYSLOG` or `kernel.dmesg_restrict = 0`.
    ///
    /// # Errors
    /// [`KernelLogError::Open`] or [`KernelLogError::Seek`].
    pub fn open() -> Result<KernelLog, KernelLogError> {
        KernelLog::open_path(Path::new(KMSG_PATH), ReadFrom::Now)
    }

    /// The log at `path` (`/dev/kmsg`, or a file of messages), from `from`.
    ///
    /// # Errors
    /// [`KernelLogError::Open`] or [`KernelLogError::Seek`].
    pub fn open_path(path: &Path, from: ReadFrom) -> Result<KernelLog, KernelLogError> {
        let mut file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|source| KernelLogError::Open {
                path: path.to_owned(),
                source,
            })?;
        if from == ReadFrom::Now {
            // On /dev/kmsg SEEK_END means "after the last record".
            file.seek(SeekFrom::End(0))
                .map_err(|source| KernelLogError::Seek {
                    path: path.to_owned(),
                    source,
                })?;
        }
        Ok(KernelLog {
            file,
            path: path.to_owned(),
            partial: Vec::new(),
            lost: 0,
        })
    }

    /// The messages logged since the last call (or since opening), without waiting.
    ///
    /// # Errors
    /// [`KernelLogError::Read`].
    pub fn messages(&mut self) -> Result<Vec<String>, KernelLogError> {
        let mut out = Vec::new();
        let mut buf = vec![0_u8; RECORD_MAX];
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    self.partial
                        .extend_from_slice(buf.get(..n).unwrap_or_default());
                    while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = self.partial.drain(..=end).collect();
                        let line = String::from_utf8_lossy(line.get(..end).unwrap_or_default());
                        if let Some(text) = kmsg_message(&line) {
                            out.push(text.to_owned());
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // kmsg: records were overwritten before this reader got to them; the next read
                // returns the oldest one left.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => self.lost += 1,
                Err(source) => {
                    return Err(KernelLogError::Read {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
        Ok(out)
    }

    /// The DMA faults among [`KernelLog::messages`].
    ///
    /// # Errors
    /// [`KernelLogError::Read`].
    pub fn faults(&mut self) -> Result<Vec<IommuFault>, KernelLogError> {
        Ok(self
            .messages()?
            .iter()
            .filter_map(|m| parse_fault(m))
            .collect())
    }

    /// Waits up to `timeout` for a fault `wanted` accepts, and returns it with every fault seen
    /// meanwhile (in order, the accepted one last), or `None` and the faults seen.
    ///
    /// # Errors
    /// [`KernelLogError::Read`].
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        wanted: impl Fn(&IommuFault) -> bool,
    ) -> Result<(Option<IommuFault>, Vec<IommuFault>), KernelLogError> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            for fault in self.faults()? {
                if wanted(&fault) {
                    return Ok((Some(fault), seen));
                }
                seen.push(fault);
            }
            if start.elapsed() >= timeout {
                return Ok((None, seen));
            }
            thread::sleep(POLL);
        }
    }

    /// How many records the kernel overwrote before this reader got to them.
    pub fn lost(&self) -> u64 {
        self.lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bdf(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    // Lines the guests printed (QEMU's intel-iommu, edu at 00:01.0, an unmapped IOVA): Debian
    // 12's 6.1 (the iommu-strict boot's vfio-isolation case).
    const INTEL_6_1_WRITE: &str = "DMAR: [DMA Write NO_PASID] Request device [00:01.0] fault addr 0x7800000 [fault reason 0x05] PTE Write access is not set";
    const INTEL_6_1_READ: &str = "DMAR: [DMA Read NO_PASID] Request device [00:01.0] fault addr 0x7600000 [fault reason 0x06] PTE Read access is not set";
    // Debian 13's 6.12 (the iommufd boot's vfio-isolation case), the same format.
    const INTEL_6_12_WRITE: &str = "DMAR: [DMA Write NO_PASID] Request device [00:01.0] fault addr 0xe600000 [fault reason 0x05] PTE Write access is not set";
    const INTEL_6_12_READ: &str = "DMAR: [DMA Read NO_PASID] Request device [00:01.0] fault addr 0xe600000 [fault reason 0x06] PTE Read access is not set";

    #[test]
    fn intel_lines_of_both_kernels() {
        let f = parse_fault(INTEL_6_1_WRITE).unwrap();
        assert_eq!(f.bdf, bdf("0000:00:01.0"));
        assert_eq!(f.addr, 0x780_0000);
        assert_eq!(f.kind, Access::Write);
        assert_eq!(f.reason, "0x05 PTE Write access is not set");
        let f = parse_fault(INTEL_6_1_READ).unwrap();
        assert_eq!((f.kind, f.addr), (Access::Read, 0x760_0000));
        assert_eq!(f.reason, "0x06 PTE Read access is not set");
        let f = parse_fault(INTEL_6_12_WRITE).unwrap();
        assert_eq!(
            (f.bdf, f.kind, f.addr),
            (bdf("00:01.0"), Access::Write, 0xe60_0000)
        );
        assert_eq!(f.reason, "0x05 PTE Write access is not set");
        let f = parse_fault(INTEL_6_12_READ).unwrap();
        assert_eq!(
            (f.bdf, f.kind, f.addr),
            (bdf("00:01.0"), Access::Read, 0xe60_0000)
        );
    }

    #[test]
    fn intel_with_pasid_timestamp_and_kmsg_header() {
        let line = "[   12.345678] DMAR: [DMA Write PASID 0x1] Request device [3a:1f.7] fault addr 0xfffff000 [fault reason 0x05] PTE Write access is not set";
        let f = parse_fault(line).unwrap();
        assert_eq!(f.bdf, bdf("3a:1f.7"));
        assert_eq!(f.addr, 0xffff_f000);
        let record = format!("3,812,40512345,-;{INTEL_6_12_READ}");
        assert_eq!(kmsg_message(&record), Some(INTEL_6_12_READ));
        assert!(parse_fault(kmsg_message(&record).unwrap()).is_some());
        assert_eq!(kmsg_message(" SUBSYSTEM=pci"), None);
        assert_eq!(kmsg_message("no header; here"), Some("no header; here"));
    }

    #[test]
    fn intel_lines_that_are_not_dma_faults() {
        for line in [
            "DMAR: DRHD: handling fault status reg 2",
            "DMAR: [INTR-REMAP] Request device [00:03.0] fault index 0x10 [fault reason 0x25] Blocked a compatibility format interrupt request",
            "DMAR: [DMA Write NO_PASID] Request device [00:20.0] fault addr 0x1 [fault reason 0x05] x",
            "DMAR: [DMA Write NO_PASID] Request device [00:03.0] fault addr 6600000 [fault reason 0x05] x",
            "DMAR: [DMA Write NO_PASID] Request device [00:03.0] fault addr 0x11112222333344445 [fault reason 0x05] x",
            "DMAR: IOMMU enabled",
            "",
        ] {
            assert_eq!(parse_fault(line), None, "{line}");
        }
    }

    #[test]
    fn amd_lines_with_and_without_the_device_prefix() {
        let own = "vfio-pci 0000:00:03.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000b address=0x6600000 flags=0x0020]";
        let f = parse_fault(own).unwrap();
        assert_eq!(f.bdf, bdf("0000:00:03.0"));
        assert_eq!((f.kind, f.addr), (Access::Write, 0x660_0000));
        assert_eq!(f.reason, "IO_PAGE_FAULT domain=0x000b flags=0x0020");
        let other = "AMD-Vi: Event logged [IO_PAGE_FAULT device=0001:c1:00.2 domain=0x0000 address=0xfee00000 flags=0x0000]";
        let f = parse_fault(other).unwrap();
        assert_eq!(f.bdf, bdf("0001:c1:00.2"));
        assert_eq!(f.kind, Access::Read);
        assert_eq!(
            parse_fault("AMD-Vi: Event logged [ILLEGAL_DEV_TABLE_ENTRY device=0000:00:03.0]"),
            None
        );
        assert_eq!(
            parse_fault(
                "AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000b address=0x1 flags=0x0020]"
            ),
            None,
            "no device at all"
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "Miri: opens the log with O_NONBLOCK, which Miri's file emulation refuses"
    )]
    fn a_log_file_read_in_pieces_from_the_start_or_the_end() {
        let dir = std::env::temp_dir().join(format!("userdma-faults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log");
        std::fs::write(
            &path,
            format!("6,1,1,-;hello\n SUBSYSTEM=pci\n3,2,2,-;{INTEL_6_1_WRITE}\n"),
        )
        .unwrap();
        let mut from_start = KernelLog::open_path(&path, ReadFrom::Start).unwrap();
        let faults = from_start.faults().unwrap();
        assert_eq!(faults.len(), 1);
        assert_eq!(faults[0].kind, Access::Write);
        let mut from_now = KernelLog::open_path(&path, ReadFrom::Now).unwrap();
        assert!(from_now.messages().unwrap().is_empty());
        {
            use std::io::Write;
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            let line = format!("3,3,3,-;{INTEL_6_12_READ}\n");
            let (head, tail) = line.split_at(40);
            f.write_all(head.as_bytes()).unwrap();
            assert!(from_now.messages().unwrap().is_empty(), "half a line");
            f.write_all(tail.as_bytes()).unwrap();
        }
        let (found, before) = from_now
            .wait_for(Duration::from_secs(1), |f| f.kind == Access::Read)
            .unwrap();
        assert!(before.is_empty());
        assert_eq!(found.unwrap().reason, "0x06 PTE Read access is not set");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
