//! A device's address ranges (BARs, expansion ROM, bridge windows) from its sysfs `resource` file.

use std::fmt;

use super::regs::*;

/// One line of a sysfs `resource` file: an address range the kernel assigned to the function.
///
/// The file has one line per resource, `0x<start> 0x<end> 0x<flags>`, in the kernel's resource
/// order: lines 0..=5 are the BARs, line 6 the expansion ROM, and further lines (present on
/// kernels with SR-IOV, and on bridges) the SR-IOV VF BARs or bridge windows. Unused lines are
/// all zero. Only the parser builds a `Resource`, so `start <= end` always holds when `end != 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    index: usize,
    start: u64,
    end: u64,
    flags: u64,
}

/// Which kind of range a resource line describes, from its position in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    /// BAR `0..=5`.
    Bar(u8),
    /// The expansion ROM (line 6).
    Rom,
    /// A later line: an SR-IOV VF BAR or a bridge window (the line number is in
    /// [`Resource::index`]).
    Other,
}

impl Resource {
    /// Line number in the file (the kernel's resource index).
    pub fn index(&self) -> usize {
        self.index
    }

    /// What the line describes.
    pub fn kind(&self) -> ResourceKind {
        match u8::try_from(self.index) {
            Ok(i @ 0..=5) => ResourceKind::Bar(i),
            Ok(6) => ResourceKind::Rom,
            _ => ResourceKind::Other,
        }
    }

    /// First address (bus address as the CPU sees it; for I/O resources a port number).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Last address, inclusive; 0 when the resource is unused.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The kernel's `IORESOURCE_*` flags.
    pub fn flags(&self) -> u64 {
        self.flags
    }

    /// Size in bytes: `end - start + 1`, or 0 for an unused line (`end == 0`).
    pub fn size(&self) -> u64 {
        if self.end == 0 {
            return 0;
        }
        // The parser checked `start <= end` and that the size does not overflow.
        (self.end - self.start).saturating_add(1)
    }

    /// Whether the line is unused (size 0).
    pub fn is_empty(&self) -> bool {
        self.size() == 0
    }

    /// An I/O port range.
    pub fn is_io(&self) -> bool {
        self.flags & IORESOURCE_IO != 0
    }

    /// A memory range.
    pub fn is_mem(&self) -> bool {
        self.flags & IORESOURCE_MEM != 0
    }

    /// Prefetchable memory.
    pub fn is_prefetchable(&self) -> bool {
        self.flags & IORESOURCE_PREFETCH != 0
    }

    /// A 64-bit memory BAR (it uses two BAR slots).
    pub fn is_64bit(&self) -> bool {
        self.flags & IORESOURCE_MEM_64 != 0
    }

    /// Read-only (an expansion ROM).
    pub fn is_read_only(&self) -> bool {
        self.flags & IORESOURCE_READONLY != 0
    }

    /// Disabled, or no address assigned yet (not usable until the kernel assigns one).
    pub fn is_unassigned(&self) -> bool {
        self.flags & (IORESOURCE_DISABLED | IORESOURCE_UNSET) != 0
    }
}

/// Most lines a `resource` file may have; the kernel writes at most 17.
pub const MAX_RESOURCE_LINES: usize = 64;

/// Parses the text of a sysfs `resource` file into one [`Resource`] per line (unused lines
/// included, with size 0).
///
/// Every line must be three `0x`-prefixed hex numbers of at most 16 digits separated by single
/// spaces or tabs (the kernel writes `0x%016llx`), and, for a used line, `start <= end` with a
/// size that fits in `u64`. A final newline is optional; blank lines are not accepted.
///
/// ```
/// use userdma::pci::{parse_resource, ResourceKind};
/// let text = "0x00000000fe000000 0x00000000fe003fff 0x0000000000140204\n\
///             0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
/// let r = parse_resource(text)?;
/// assert_eq!(r[0].kind(), ResourceKind::Bar(0));
/// assert_eq!(r[0].size(), 0x4000);
/// assert!(r[0].is_mem() && r[0].is_64bit() && !r[0].is_prefetchable());
/// assert!(r[1].is_empty());
/// # Ok::<(), userdma::pci::ResourceError>(())
/// ```
///
/// # Errors
/// [`ResourceError`] naming the line and what is wrong with it.
pub fn parse_resource(text: &str) -> Result<Vec<Resource>, ResourceError> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (index, line) in body.split('\n').enumerate() {
        let fail = |reason| ResourceError::new(index, line, reason);
        if index >= MAX_RESOURCE_LINES {
            return Err(fail(ResourceReason::TooManyLines));
        }
        if line.is_empty() {
            return Err(fail(ResourceReason::FieldCount));
        }
        let mut fields = line.split([' ', '\t']);
        let mut next = || -> Result<u64, ResourceError> {
            let field = fields
                .next()
                .ok_or_else(|| fail(ResourceReason::FieldCount))?;
            hex_u64(field).ok_or_else(|| fail(ResourceReason::NotHex))
        };
        let (start, end, flags) = (next()?, next()?, next()?);
        if fields.next().is_some() {
            return Err(fail(ResourceReason::FieldCount));
        }
        if end != 0 {
            let span = end
                .checked_sub(start)
                .ok_or_else(|| fail(ResourceReason::EndBeforeStart))?;
            span.checked_add(1)
                .ok_or_else(|| fail(ResourceReason::SizeOverflow))?;
        }
        out.push(Resource {
            index,
            start,
            end,
            flags,
        });
    }
    Ok(out)
}

/// `0x` followed by 1..=16 hex digits.
fn hex_u64(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x")?;
    if digits.is_empty() || digits.len() > 16 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

/// What was wrong with a line of a `resource` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceReason {
    /// Not exactly three fields.
    FieldCount,
    /// A field is not `0x` and 1 to 16 hex digits.
    NotHex,
    /// The end address is below the start address.
    EndBeforeStart,
    /// The range covers all 2^64 addresses.
    SizeOverflow,
    /// More lines than any kernel writes.
    TooManyLines,
}

impl fmt::Display for ResourceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FieldCount => "expected three fields `0xSTART 0xEND 0xFLAGS`",
            Self::NotHex => "a field is not 0x followed by 1 to 16 hex digits",
            Self::EndBeforeStart => "the end address is below the start address",
            Self::SizeOverflow => "the range size does not fit in 64 bits",
            Self::TooManyLines => "more lines than the kernel writes (at most 64 accepted)",
        })
    }
}

/// A `resource` file that is not in the kernel's format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line} {text:?}: {reason}", line = index + 1)]
pub struct ResourceError {
    /// Line number, from 0.
    pub index: usize,
    /// The line (cut to 120 characters).
    pub text: String,
    /// What is wrong with it.
    pub reason: ResourceReason,
}

impl ResourceError {
    fn new(index: usize, line: &str, reason: ResourceReason) -> Self {
        Self {
            index,
            text: line.chars().take(120).collect(),
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZERO: &str = "0x0000000000000000 0x0000000000000000 0x0000000000000000";

    #[test]
    fn parses_this_machines_virtio_resource_file() {
        let mut text = String::from("0x0000004000000000 0x000000400007ffff 0x0000000000140204\n");
        for _ in 0..6 {
            text.push_str(ZERO);
            text.push('\n');
        }
        let r = parse_resource(&text).unwrap();
        assert_eq!(r.len(), 7);
        assert_eq!(r[0].kind(), ResourceKind::Bar(0));
        assert_eq!(
            (r[0].start(), r[0].end(), r[0].size()),
            (0x40_0000_0000, 0x40_0007_ffff, 0x8_0000)
        );
        assert!(r[0].is_mem() && r[0].is_64bit() && !r[0].is_io() && !r[0].is_prefetchable());
        assert!(!r[0].is_read_only() && !r[0].is_unassigned());
        assert_eq!(r[6].kind(), ResourceKind::Rom);
        assert!(r[1..].iter().all(Resource::is_empty));
    }

    #[test]
    fn flags_and_kinds() {
        let text = format!(
            "0x1000 0x10ff 0x101\n{ZERO}\n0x0 0xfff 0x20002200\n{ZERO}\n{ZERO}\n{ZERO}\n\
             0xc0000 0xdffff 0x4200\n0xe0000000 0xe00fffff 0x102200\n"
        );
        let r = parse_resource(&text).unwrap();
        assert!(r[0].is_io() && r[0].size() == 0x100);
        assert!(r[2].is_prefetchable() && r[2].is_unassigned() && r[2].size() == 0x1000);
        assert!(r[6].is_read_only() && r[6].kind() == ResourceKind::Rom);
        assert_eq!(r[7].kind(), ResourceKind::Other);
        assert_eq!(r[7].index(), 7);
        assert!(r[7].is_64bit());
    }

    #[test]
    fn empty_file_has_no_resources() {
        assert_eq!(parse_resource("").unwrap(), []);
        assert_eq!(parse_resource("\n").unwrap(), []);
    }

    #[test]
    fn rejects_each_malformation() {
        let cases = [
            ("0x1 0x2", ResourceReason::FieldCount),
            ("0x1 0x2 0x3 0x4", ResourceReason::FieldCount),
            ("0x1  0x2 0x3", ResourceReason::NotHex),
            ("1 0x2 0x3", ResourceReason::NotHex),
            ("0x 0x2 0x3", ResourceReason::NotHex),
            ("0xg 0x2 0x3", ResourceReason::NotHex),
            ("0x1 0x12345678901234567 0x3", ResourceReason::NotHex),
            ("0x10 0xf 0x200", ResourceReason::EndBeforeStart),
            ("0x0 0xffffffffffffffff 0x200", ResourceReason::SizeOverflow),
            ("\n", ResourceReason::FieldCount),
        ];
        for (text, reason) in cases {
            let input = format!("{ZERO}\n{text}\n");
            let e = parse_resource(&input).unwrap_err();
            assert_eq!((e.index, e.reason), (1, reason), "{text:?}");
            assert!(e.to_string().starts_with("line 2 "), "{e}");
        }
        let many = format!("{ZERO}\n").repeat(MAX_RESOURCE_LINES + 1);
        let e = parse_resource(&many).unwrap_err();
        assert_eq!(
            (e.index, e.reason),
            (MAX_RESOURCE_LINES, ResourceReason::TooManyLines)
        );
    }

    #[test]
    fn large_ranges_do_not_overflow() {
        let r = parse_resource("0x1 0xffffffffffffffff 0x200").unwrap();
        assert_eq!(r[0].size(), u64::MAX);
        let r = parse_resource("0xffffffffffffffff 0xffffffffffffffff 0x200").unwrap();
        assert_eq!(r[0].size(), 1);
    }
}
