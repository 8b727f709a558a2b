//! Names from the PCI ID database, loaded only by the commands that show them, and the small
//! formatting helpers the text output shares.

use userdma::pci::DeviceInfo;

use crate::ids::Ids;

/// The PCI ID database, if there is one. A database that cannot be read or parsed costs the
/// names, not the command: it is reported on stderr as a warning.
pub(crate) fn load() -> Option<Ids> {
    match Ids::load() {
        Ok(ids) => ids,
        Err(e) => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text.push_str(": ");
                text.push_str(&s.to_string());
                source = s.source();
            }
            eprintln!("userdma: warning: {text}; names are left out");
            None
        }
    }
}

/// Names for one device, each `None` when unknown.
#[derive(Debug, Default)]
pub(crate) struct Names<'a> {
    pub(crate) vendor: Option<&'a str>,
    pub(crate) device: Option<&'a str>,
    pub(crate) subsystem: Option<&'a str>,
    pub(crate) class: Option<&'a str>,
}

impl<'a> Names<'a> {
    /// Looks up `dev` in `ids`.
    pub(crate) fn of(ids: Option<&'a Ids>, dev: &DeviceInfo) -> Self {
        let Some(ids) = ids else {
            return Self::default();
        };
        let subsystem = match (dev.subsystem_vendor, dev.subsystem_device) {
            (Some(sv), Some(sd)) => ids.subsystem(dev.vendor, dev.device, sv, sd),
            _ => None,
        };
        Self {
            vendor: ids.vendor(dev.vendor),
            device: ids.device(dev.vendor, dev.device),
            subsystem,
            class: ids.class(dev.class),
        }
    }

    /// `Vendor Device`, with `Device xxxx` for an unknown device of a known vendor; `None` when
    /// the vendor is unknown.
    pub(crate) fn description(&self, dev: &DeviceInfo) -> Option<String> {
        let vendor = self.vendor?;
        Some(match self.device {
            Some(device) => format!("{vendor} {device}"),
            None => format!("{vendor} Device {:04x}", dev.device),
        })
    }
}

/// `text`, or `-` for none.
pub(crate) fn or_dash(text: Option<&str>) -> &str {
    text.unwrap_or("-")
}

/// A size in bytes as the largest whole binary unit (`512 KiB`), or bytes.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && value >= 1024 && value % 1024 == 0 {
        value /= 1024;
        unit += 1;
    }
    format!("{value} {}", UNITS[unit])
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 bytes");
        assert_eq!(size(100), "100 bytes");
        assert_eq!(size(0x8_0000), "512 KiB");
        assert_eq!(size(0x4000_0000), "1 GiB");
        assert_eq!(size(1536), "1536 bytes");
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["A".to_owned(), "BB".to_owned(), "C".to_owned()],
            vec!["long".to_owned(), "x".to_owned(), "tail text".to_owned()],
        ];
        assert_eq!(table(&rows), "A     BB  C\nlong  x   tail text\n");
    }
}
