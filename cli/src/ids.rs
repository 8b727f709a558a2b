//! Vendor, device and class names from the PCI ID database (`pci.ids`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// Environment variable naming the `pci.ids` file to use instead of searching
/// [`SEARCH_PATHS`]; set to the empty string, it turns names off.
pub(crate) const IDS_ENV: &str = "USERDMA_PCI_IDS";

/// Where distributions install `pci.ids`, in the order searched (Debian's `pci.ids` package
/// installs the first).
pub(crate) const SEARCH_PATHS: [&str; 3] = [
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
];

/// The most of a PCI ID database the tool reads: 64 MiB. The real `pci.ids` is under 2 MiB;
/// a larger file (or [`IDS_ENV`] pointing at `/dev/zero` or a pipe) is not one, and would
/// otherwise be read until the machine runs out of memory.
pub(crate) const IDS_LIMIT: u64 = 64 << 20;

/// The PCI ID database: names of vendors, devices, subsystems, classes, subclasses and
/// programming interfaces.
///
/// ```
/// use userdma::pci::Ids;
/// let ids = Ids::parse("1af4  Red Hat, Inc.\n\t1041  Virtio 1.0 network device\n\
///                       C 02  Network controller\n\t00  Ethernet controller\n")?;
/// assert_eq!(ids.vendor(0x1af4), Some("Red Hat, Inc."));
/// assert_eq!(ids.device(0x1af4, 0x1041), Some("Virtio 1.0 network device"));
/// assert_eq!(ids.class(0x02_00_00), Some("Ethernet controller"));
/// # Ok::<(), userdma::pci::IdsError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Ids {
    vendors: BTreeMap<u16, Vendor>,
    classes: BTreeMap<u8, Class>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Vendor {
    name: String,
    devices: BTreeMap<u16, Device>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Device {
    name: String,
    subsystems: BTreeMap<(u16, u16), String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Class {
    name: String,
    subclasses: BTreeMap<u8, Subclass>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Subclass {
    name: String,
    prog_ifs: BTreeMap<u8, String>,
}

/// Which entry the next indented line belongs to.
#[derive(Debug, Clone, Copy)]
enum Context {
    Start,
    Vendor(u16),
    Device(u16, u16),
    Class(u8),
    Subclass(u8, u8),
}

impl Ids {
    /// Parses the text of a `pci.ids` file.
    ///
    /// The format: `#` comments and blank lines anywhere; `vvvv  name` (vendor), then under it
    /// `\tdddd  name` (device) and `\t\tssss tttt  name` (subsystem vendor and device); and
    /// `C cc  name` (class), then `\tss  name` (subclass) and `\t\tpp  name` (programming
    /// interface). IDs are hex of exactly the widths shown; the name follows after whitespace
    /// and must not be empty. When an ID repeats, the first entry wins.
    ///
    /// # Errors
    /// [`IdsError::Syntax`] with the line number for a line that fits none of these forms, or an
    /// indented line with no entry above it to belong to.
    pub(crate) fn parse(text: &str) -> Result<Self, IdsError> {
        let mut ids = Self::default();
        let mut ctx = Context::Start;
        for (index, line) in text.lines().enumerate() {
            let fail = |reason| IdsError::syntax(index, line, reason);
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let depth = line.bytes().take_while(|&b| b == b'\t').count();
            let rest = &line[depth..];
            ctx = match (depth, ctx) {
                (0, _) => {
                    if let Some(class) = rest.strip_prefix("C ") {
                        let (id, name) = entry(class, 2).ok_or_else(|| fail(Syntax::Class))?;
                        let id = narrow(id);
                        let new = Class {
                            name,
                            subclasses: BTreeMap::new(),
                        };
                        ids.classes.entry(id).or_insert(new);
                        Context::Class(id)
                    } else {
                        let (id, name) = entry(rest, 4).ok_or_else(|| fail(Syntax::Vendor))?;
                        let id = narrow16(id);
                        let new = Vendor {
                            name,
                            devices: BTreeMap::new(),
                        };
                        ids.vendors.entry(id).or_insert(new);
                        Context::Vendor(id)
                    }
                }
                (1, Context::Vendor(v) | Context::Device(v, _)) => {
                    let (id, name) = entry(rest, 4).ok_or_else(|| fail(Syntax::Device))?;
                    let id = narrow16(id);
                    if let Some(vendor) = ids.vendors.get_mut(&v) {
                        let new = Device {
                            name,
                            subsystems: BTreeMap::new(),
                        };
                        vendor.devices.entry(id).or_insert(new);
                    }
                    Context::Device(v, id)
                }
                (1, Context::Class(c) | Context::Subclass(c, _)) => {
                    let (id, name) = entry(rest, 2).ok_or_else(|| fail(Syntax::Subclass))?;
                    let id = narrow(id);
                    if let Some(class) = ids.classes.get_mut(&c) {
                        let new = Subclass {
                            name,
                            prog_ifs: BTreeMap::new(),
                        };
                        class.subclasses.entry(id).or_insert(new);
                    }
                    Context::Subclass(c, id)
                }
                (2, Context::Device(v, d)) => {
                    let (sv, rest) = rest
                        .split_once(' ')
                        .ok_or_else(|| fail(Syntax::Subsystem))?;
                    let sv = hex_exact(sv, 4).ok_or_else(|| fail(Syntax::Subsystem))?;
                    let (sd, name) = entry(rest, 4).ok_or_else(|| fail(Syntax::Subsystem))?;
                    let device = ids.vendors.get_mut(&v).and_then(|x| x.devices.get_mut(&d));
                    if let Some(device) = device {
                        device
                            .subsystems
                            .entry((narrow16(sv), narrow16(sd)))
                            .or_insert(name);
                    }
                    ctx
                }
                (2, Context::Subclass(c, s)) => {
                    let (id, name) = entry(rest, 2).ok_or_else(|| fail(Syntax::ProgIf))?;
                    let sub = ids
                        .classes
                        .get_mut(&c)
                        .and_then(|x| x.subclasses.get_mut(&s));
                    if let Some(sub) = sub {
                        sub.prog_ifs.entry(narrow(id)).or_insert(name);
                    }
                    ctx
                }
                _ => return Err(fail(Syntax::Orphan)),
            };
        }
        Ok(ids)
    }

    /// Reads and parses the file at `path`. Bytes that are not UTF-8 are replaced, not refused.
    ///
    /// # Errors
    /// [`IdsError::Read`] if the file cannot be read, [`IdsError::TooLarge`] if it holds more
    /// than [`IDS_LIMIT`], [`IdsError::Syntax`] (with the path) if it is not in the `pci.ids`
    /// format.
    pub(crate) fn load_from(path: &Path) -> Result<Self, IdsError> {
        let bytes = crate::bounded::read(path, IDS_LIMIT).map_err(|e| match e {
            crate::bounded::Error::Io(source) => IdsError::Read {
                path: path.to_owned(),
                source,
            },
            crate::bounded::Error::TooLarge { limit } => IdsError::TooLarge {
                path: path.to_owned(),
                limit,
            },
        })?;
        Self::parse(&String::from_utf8_lossy(&bytes)).map_err(|e| e.in_file(path))
    }

    /// Loads the system's database: the file named by [`IDS_ENV`] if that is set (no names if
    /// it is set to the empty string), else the first of [`SEARCH_PATHS`] that exists. `Ok(None)`
    /// when there is none: names are optional.
    ///
    /// # Errors
    /// As [`load_from`](Self::load_from), including when the file named by [`IDS_ENV`] does not
    /// exist (someone asked for it explicitly).
    pub(crate) fn load() -> Result<Option<Self>, IdsError> {
        match std::env::var_os(IDS_ENV) {
            Some(path) if path.is_empty() => Ok(None),
            Some(path) => Self::load_from(Path::new(&path)).map(Some),
            None => {
                let Some(path) = SEARCH_PATHS.iter().map(Path::new).find(|p| p.is_file()) else {
                    return Ok(None);
                };
                Self::load_from(path).map(Some)
            }
        }
    }

    /// The vendor's name.
    pub(crate) fn vendor(&self, vendor: u16) -> Option<&str> {
        self.vendors.get(&vendor).map(|v| v.name.as_str())
    }

    /// The device's name.
    pub(crate) fn device(&self, vendor: u16, device: u16) -> Option<&str> {
        Some(
            self.vendors
                .get(&vendor)?
                .devices
                .get(&device)?
                .name
                .as_str(),
        )
    }

    /// The name of the subsystem (board) `sub_vendor:sub_device` of a device.
    pub(crate) fn subsystem(
        &self,
        vendor: u16,
        device: u16,
        sub_vendor: u16,
        sub_device: u16,
    ) -> Option<&str> {
        let device = self.vendors.get(&vendor)?.devices.get(&device)?;
        device
            .subsystems
            .get(&(sub_vendor, sub_device))
            .map(String::as_str)
    }

    /// The name of base class `base` (e.g. `0x02` "Network controller").
    pub(crate) fn base_class(&self, base: u8) -> Option<&str> {
        self.classes.get(&base).map(|c| c.name.as_str())
    }

    /// The name of subclass `sub` of base class `base` (e.g. `0x02, 0x00` "Ethernet controller").
    pub(crate) fn subclass(&self, base: u8, sub: u8) -> Option<&str> {
        Some(self.classes.get(&base)?.subclasses.get(&sub)?.name.as_str())
    }

    /// The name of programming interface `prog_if` of a subclass (e.g. NVMe's `0x02` "NVM Express").
    #[cfg_attr(not(test), allow(dead_code))] // the tests and the fuzz target ask
    pub(crate) fn prog_if(&self, base: u8, sub: u8, prog_if: u8) -> Option<&str> {
        let sub = self.classes.get(&base)?.subclasses.get(&sub)?;
        sub.prog_ifs.get(&prog_if).map(String::as_str)
    }

    /// The best name for a 24-bit class code (as in sysfs `class`): the subclass name, or the
    /// base class name when the subclass is not listed.
    pub(crate) fn class(&self, class: u32) -> Option<&str> {
        let [_prog_if, sub, base, _] = class.to_le_bytes();
        self.subclass(base, sub).or_else(|| self.base_class(base))
    }

    /// Number of vendors listed.
    #[cfg_attr(not(test), allow(dead_code))] // the tests and the fuzz target ask
    pub(crate) fn vendor_count(&self) -> usize {
        self.vendors.len()
    }

    /// Number of base classes listed.
    #[cfg_attr(not(test), allow(dead_code))] // the tests and the fuzz target ask
    pub(crate) fn class_count(&self) -> usize {
        self.classes.len()
    }
}

/// Parses `ID<whitespace>NAME` with an ID of exactly `width` hex digits and a non-empty name.
fn entry(s: &str, width: usize) -> Option<(u32, String)> {
    let id = s.get(..width)?;
    let rest = s.get(width..)?;
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let name = rest.trim();
    if name.is_empty() {
        return None;
    }
    Some((hex_exact(id, width)?, name.to_owned()))
}

/// Exactly `width` (at most 4) hex digits.
fn hex_exact(s: &str, width: usize) -> Option<u32> {
    if s.len() != width || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

/// A value parsed from 2 hex digits.
fn narrow(v: u32) -> u8 {
    v.to_le_bytes()[0]
}

/// A value parsed from 4 hex digits.
fn narrow16(v: u32) -> u16 {
    let [a, b, _, _] = v.to_le_bytes();
    u16::from_le_bytes([a, b])
}

/// What was wrong with a line of `pci.ids`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syntax {
    /// Not `vvvv  name`.
    Vendor,
    /// Not `\tdddd  name`.
    Device,
    /// Not `\t\tssss tttt  name`.
    Subsystem,
    /// Not `C cc  name`.
    Class,
    /// Not `\tss  name`.
    Subclass,
    /// Not `\t\tpp  name`.
    ProgIf,
    /// Indented deeper than the entry above it allows (or with nothing above it).
    Orphan,
}

impl Syntax {
    fn text(self) -> &'static str {
        match self {
            Self::Vendor => "expected a vendor line `vvvv  name` (4 hex digits)",
            Self::Device => "expected a device line `<tab>dddd  name` (4 hex digits)",
            Self::Subsystem => "expected a subsystem line `<tab><tab>ssss tttt  name`",
            Self::Class => "expected a class line `C cc  name` (2 hex digits)",
            Self::Subclass => "expected a subclass line `<tab>ss  name` (2 hex digits)",
            Self::ProgIf => "expected a programming interface line `<tab><tab>pp  name`",
            Self::Orphan => "indented line with no vendor, device, class or subclass above it",
        }
    }
}

/// A `pci.ids` file that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdsError {
    /// The file could not be read.
    #[error(
        "cannot read the PCI ID database {path}: install it (Debian: apt-get install pci.ids) \
         or point {IDS_ENV} at a copy"
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file holds more than [`IDS_LIMIT`].
    #[error(
        "the PCI ID database {path} is larger than {limit} bytes, the most the tool reads (the \
         real pci.ids is under 2 MiB): point {IDS_ENV} at pci.ids, or set it to the empty string \
         for no names"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        limit: u64,
    },
    /// A line is not in the format.
    #[error(
        "{file}line {line} {text:?} of the PCI ID database: {reason}",
        file = path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default(),
        line = index + 1,
        reason = reason.text()
    )]
    Syntax {
        /// The file, when parsed from one.
        path: Option<PathBuf>,
        /// Line number, from 0.
        index: usize,
        /// The line (cut to 120 characters).
        text: String,
        /// What is wrong.
        reason: Syntax,
    },
}

impl IdsError {
    fn syntax(index: usize, line: &str, reason: Syntax) -> Self {
        Self::Syntax {
            path: None,
            index,
            text: line.chars().take(120).collect(),
            reason,
        }
    }

    fn in_file(self, file: &Path) -> Self {
        match self {
            Self::Syntax {
                index,
                text,
                reason,
                ..
            } => Self::Syntax {
                path: Some(file.to_owned()),
                index,
                text,
                reason,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
# comment
#\tcomment with tab

8086  Intel Corporation
\t0d57  Host bridge
\t\t8086 0001  Some board
\t\t1028 0002\tAnother board
# interleaved comment
\t10d3  82574L Gigabit Network Connection
1af4  Red Hat, Inc.
\t1041  Virtio 1.0 network device
8086  Duplicate vendor loses
C 01  Mass storage controller
\t08  Non-Volatile memory controller
\t\t02  NVM Express
C 02  Network controller
\t00  Ethernet controller
C ff  Unassigned class
";

    #[test]
    fn parses_every_kind_of_line() {
        let ids = Ids::parse(SAMPLE).unwrap();
        assert_eq!(ids.vendor(0x8086), Some("Intel Corporation"));
        assert_eq!(ids.device(0x8086, 0x0d57), Some("Host bridge"));
        assert_eq!(
            ids.device(0x8086, 0x10d3),
            Some("82574L Gigabit Network Connection")
        );
        assert_eq!(
            ids.subsystem(0x8086, 0x0d57, 0x8086, 0x0001),
            Some("Some board")
        );
        assert_eq!(
            ids.subsystem(0x8086, 0x0d57, 0x1028, 0x0002),
            Some("Another board")
        );
        assert_eq!(ids.subsystem(0x8086, 0x10d3, 0x8086, 0x0001), None);
        assert_eq!(
            ids.device(0x1af4, 0x1041),
            Some("Virtio 1.0 network device")
        );
        assert_eq!(ids.device(0x1af4, 0x1042), None);
        assert_eq!(ids.vendor(0x1234), None);
        assert_eq!(ids.base_class(0x01), Some("Mass storage controller"));
        assert_eq!(
            ids.subclass(0x01, 0x08),
            Some("Non-Volatile memory controller")
        );
        assert_eq!(ids.prog_if(0x01, 0x08, 0x02), Some("NVM Express"));
        assert_eq!(ids.class(0x02_00_00), Some("Ethernet controller"));
        assert_eq!(ids.class(0x02_80_00), Some("Network controller"));
        assert_eq!(ids.class(0xff_ff_00), Some("Unassigned class"));
        assert_eq!(ids.class(0x12_00_00), None);
        assert_eq!((ids.vendor_count(), ids.class_count()), (2, 3));
    }

    #[test]
    fn accepts_crlf_and_empty_input() {
        let ids = Ids::parse("1af4  Red Hat\r\n\t1041  Virtio net\r\n").unwrap();
        assert_eq!(ids.device(0x1af4, 0x1041), Some("Virtio net"));
        assert_eq!(Ids::parse("").unwrap(), Ids::default());
    }

    #[test]
    fn rejects_malformed_lines_with_their_number() {
        let cases = [
            ("123  short vendor", Syntax::Vendor),
            ("12345 long vendor", Syntax::Vendor),
            ("zzzz  not hex", Syntax::Vendor),
            ("1af4", Syntax::Vendor),
            ("1af4   ", Syntax::Vendor),
            ("1af4-name", Syntax::Vendor),
            ("\t1041  device before vendor", Syntax::Orphan),
            ("1af4  v\n\t104  d", Syntax::Device),
            (
                "1af4  v\n\t\t1af4 0001  subsystem without device",
                Syntax::Orphan,
            ),
            (
                "1af4  v\n\t1041  d\n\t\t1af4  no subdevice",
                Syntax::Subsystem,
            ),
            ("1af4  v\n\t1041  d\n\t\tzzzz 0001  x", Syntax::Subsystem),
            (
                "1af4  v\n\t1041  d\n\t\t\t1af4 0001  too deep",
                Syntax::Orphan,
            ),
            ("C 0  short class", Syntax::Class),
            ("C 02  c\n\t0  short subclass", Syntax::Subclass),
            ("C 02  c\n\t\t00  prog-if without subclass", Syntax::Orphan),
            ("C 02  c\n\t00  s\n\t\t0g  bad", Syntax::ProgIf),
            ("é1af4  non-ascii", Syntax::Vendor),
            ("1af4  v\n\t1é41  non-ascii", Syntax::Device),
        ];
        for (text, reason) in cases {
            let err = Ids::parse(text).unwrap_err();
            let IdsError::Syntax {
                index, reason: got, ..
            } = &err
            else {
                panic!("{err}")
            };
            assert_eq!(
                (*index, *got),
                (text.lines().count() - 1, reason),
                "{text:?}"
            );
            assert!(err.to_string().contains("line "), "{err}");
        }
    }

    #[test]
    fn load_from_reports_path_for_missing_and_malformed_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let missing = dir.join("missing.ids");
        let err = Ids::load_from(&missing).unwrap_err();
        assert!(matches!(err, IdsError::Read { .. }));
        assert!(err.to_string().contains("missing.ids") && err.to_string().contains("pci.ids"));
        let bad = dir.join("bad.ids");
        std::fs::write(&bad, "1af4  ok\nnonsense\n").unwrap();
        let err = Ids::load_from(&bad).unwrap_err();
        assert!(err.to_string().contains("bad.ids: line 2"), "{err}");
        let good = dir.join("good.ids");
        std::fs::write(&good, b"1af4  Red \xffHat\n").unwrap();
        assert_eq!(
            Ids::load_from(&good).unwrap().vendor(0x1af4),
            Some("Red \u{fffd}Hat")
        );
    }

    /// `USERDMA_PCI_IDS=/dev/zero` (or a huge file) is refused at the limit, not read until
    /// memory runs out.
    #[test]
    fn load_from_refuses_a_file_past_the_limit() {
        let err = Ids::load_from(Path::new("/dev/zero")).unwrap_err();
        assert!(
            matches!(
                err,
                IdsError::TooLarge {
                    limit: IDS_LIMIT,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        assert!(err.to_string().contains(IDS_ENV), "{err}");
    }

    /// The machine's own pci.ids (Debian: the `pci.ids` package) parses, with known names.
    #[test]
    fn system_pci_ids_parses() {
        let path = SEARCH_PATHS
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
            .unwrap_or_else(|| {
                panic!(
                    "no pci.ids in {SEARCH_PATHS:?}: install it (Debian: apt-get install pci.ids)"
                )
            });
        let ids = Ids::load_from(path).unwrap();
        assert!(ids.vendor_count() > 1000, "{} vendors", ids.vendor_count());
        assert!(ids.class_count() > 10);
        assert_eq!(ids.vendor(0x8086), Some("Intel Corporation"));
        assert_eq!(ids.class(0x02_00_00), Some("Ethernet controller"));
    }
}
