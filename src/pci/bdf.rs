//! PCI addresses: domain, bus, device, function.

use std::fmt;
use std::str::FromStr;

/// The address of a PCI function: `DDDD:BB:DD.F` (domain, bus, device, function), as the kernel
/// names it under `/sys/bus/pci/devices`.
///
/// Parsing is strict and accepts exactly the kernel's forms, in either letter case:
///
/// * `DDDD:BB:DD.F` — a domain of 4 to 8 hex digits (Linux prints 4; domains above `ffff`, as
///   Intel VMD creates, print with more), a 2-digit bus, a 2-digit device `<= 1f` and a 1-digit
///   function `<= 7`;
/// * `BB:DD.F` — the same without a domain, meaning domain 0 (the form `lspci` prints).
///
/// [`Display`](fmt::Display) prints the canonical lower-case form with a domain of at least 4
/// digits, so `parse(display(x)) == x` for every address. Ordering is numeric (domain, then bus,
/// device, function), which is also the order of the canonical strings. Serializes as the string.
///
/// ```
/// use userdma::pci::Bdf;
/// let bdf: Bdf = "00:1F.3".parse()?;
/// assert_eq!(bdf.to_string(), "0000:00:1f.3");
/// assert_eq!((bdf.bus(), bdf.device(), bdf.function()), (0, 0x1f, 3));
/// assert!("0000:00:20.0".parse::<Bdf>().is_err()); // device > 1f
/// # Ok::<(), userdma::pci::BdfError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

/// Largest device number on a bus.
const MAX_DEVICE: u8 = 0x1f;
/// Largest function number of a device.
const MAX_FUNCTION: u8 = 7;
/// Longest input quoted back in an error message.
const MAX_QUOTED: usize = 64;

impl Bdf {
    /// The address `domain:bus:device.function`.
    ///
    /// # Errors
    /// [`BdfError`] if `device > 0x1f` or `function > 7`.
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Result<Self, BdfError> {
        let bdf = Self {
            domain,
            bus,
            device,
            function,
        };
        if device > MAX_DEVICE {
            return Err(BdfError::new(&bdf.unchecked_string(), Reason::DeviceRange));
        }
        if function > MAX_FUNCTION {
            return Err(BdfError::new(
                &bdf.unchecked_string(),
                Reason::FunctionRange,
            ));
        }
        Ok(bdf)
    }

    /// The PCI segment (domain).
    pub fn domain(&self) -> u32 {
        self.domain
    }

    /// The bus number.
    pub fn bus(&self) -> u8 {
        self.bus
    }

    /// The device (slot) number, `0..=0x1f`.
    pub fn device(&self) -> u8 {
        self.device
    }

    /// The function number, `0..=7`.
    pub fn function(&self) -> u8 {
        self.function
    }

    fn unchecked_string(&self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl fmt::Debug for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bdf({self})")
    }
}

/// Parses exactly `n_min..=n_max` hex digits (either case) into a `u32`.
fn hex_field(s: &str, n_min: usize, n_max: usize, reason: Reason) -> Result<u32, Reason> {
    if s.len() < n_min || s.len() > n_max || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(reason);
    }
    // At most 8 hex digits, all checked above: this always fits a u32.
    u32::from_str_radix(s, 16).map_err(|_| reason)
}

impl FromStr for Bdf {
    type Err = BdfError;

    fn from_str(input: &str) -> Result<Self, BdfError> {
        let fail = |reason| BdfError::new(input, reason);
        let (rest, function) = input.rsplit_once('.').ok_or_else(|| fail(Reason::Shape))?;
        let mut parts = rest.split(':').rev();
        let (device, bus) = match (parts.next(), parts.next()) {
            (Some(d), Some(b)) => (d, b),
            _ => return Err(fail(Reason::Shape)),
        };
        let domain = parts.next();
        if parts.next().is_some() {
            return Err(fail(Reason::Shape));
        }
        let domain = match domain {
            Some(d) => hex_field(d, 4, 8, Reason::Domain).map_err(fail)?,
            None => 0,
        };
        let bus = hex_field(bus, 2, 2, Reason::Bus).map_err(fail)?;
        let device = hex_field(device, 2, 2, Reason::Device).map_err(fail)?;
        let function = hex_field(function, 1, 1, Reason::Function).map_err(fail)?;
        let narrow = |v: u32, r| u8::try_from(v).map_err(|_| fail(r));
        let (bus, device, function) = (
            narrow(bus, Reason::Bus)?,
            narrow(device, Reason::DeviceRange)?,
            narrow(function, Reason::FunctionRange)?,
        );
        if device > MAX_DEVICE {
            return Err(fail(Reason::DeviceRange));
        }
        if function > MAX_FUNCTION {
            return Err(fail(Reason::FunctionRange));
        }
        Ok(Self {
            domain,
            bus,
            device,
            function,
        })
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Bdf {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Bdf {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What was wrong with a PCI address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Shape,
    Domain,
    Bus,
    Device,
    Function,
    DeviceRange,
    FunctionRange,
}

impl Reason {
    fn text(self) -> &'static str {
        match self {
            Reason::Shape => "missing or extra ':' or '.' separators",
            Reason::Domain => "the domain must be 4 to 8 hex digits",
            Reason::Bus => "the bus must be 2 hex digits",
            Reason::Device => "the device must be 2 hex digits",
            Reason::Function => "the function must be 1 hex digit",
            Reason::DeviceRange => "the device number must be at most 1f",
            Reason::FunctionRange => "the function number must be at most 7",
        }
    }
}

/// A string that is not a PCI address. The message quotes the input and gives the expected form.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid PCI address {input:?}: {reason}; expected DDDD:BB:DD.F or BB:DD.F in hex \
     (e.g. 0000:01:00.0; `userdma list` shows the devices present)",
    reason = reason.text()
)]
pub struct BdfError {
    input: String,
    reason: Reason,
}

impl BdfError {
    fn new(input: &str, reason: Reason) -> Self {
        let mut quoted: String = input.chars().take(MAX_QUOTED).collect();
        if quoted.len() < input.len() {
            quoted.push('…');
        }
        Self {
            input: quoted,
            reason,
        }
    }

    /// The rejected input (cut to 64 characters and `…` when longer).
    pub fn input(&self) -> &str {
        &self.input
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Bdf, BdfError> {
        s.parse()
    }

    #[test]
    fn parses_kernel_forms() {
        let b = p("0000:00:01.0").unwrap();
        assert_eq!(
            (b.domain(), b.bus(), b.device(), b.function()),
            (0, 0, 1, 0)
        );
        assert_eq!(p("00:01.0").unwrap(), b);
        let b = p("10000:E1:1f.7").unwrap();
        assert_eq!(
            (b.domain(), b.bus(), b.device(), b.function()),
            (0x10000, 0xe1, 0x1f, 7)
        );
        assert_eq!(b.to_string(), "10000:e1:1f.7");
        assert_eq!(p("ffffffff:ff:1f.7").unwrap().domain(), u32::MAX);
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "0000:00:00.0",
            "0001:02:03.4",
            "abcd:ef:1e.7",
            "12345678:00:00.0",
        ] {
            assert_eq!(p(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_each_malformation_with_its_reason() {
        let cases = [
            ("", Reason::Shape),
            ("0000:00:01", Reason::Shape),
            ("0000:00.1", Reason::Bus),
            ("0:0000:00:01.0", Reason::Shape),
            ("000:00:01.0", Reason::Domain),
            ("123456789:00:01.0", Reason::Domain),
            ("g000:00:01.0", Reason::Domain),
            ("0000:0:01.0", Reason::Bus),
            ("0000:100:01.0", Reason::Bus),
            ("0000:00:1.0", Reason::Device),
            ("0000:00:+1.0", Reason::Device),
            ("0000:00:01.", Reason::Function),
            ("0000:00:01.10", Reason::Function),
            ("0000:00:20.0", Reason::DeviceRange),
            ("0000:00:01.8", Reason::FunctionRange),
            (" 0000:00:01.0", Reason::Domain),
            ("0000:00:01.0\n", Reason::Function),
        ];
        for (input, reason) in cases {
            let e = p(input).unwrap_err();
            assert_eq!(e.reason, reason, "{input:?}");
            assert_eq!(e.input(), input);
            let msg = e.to_string();
            assert!(msg.contains(&format!("{input:?}")), "{msg}");
            assert!(msg.contains("DDDD:BB:DD.F"), "{msg}");
        }
    }

    #[test]
    fn long_input_is_cut_in_the_message() {
        let long = "x".repeat(1000);
        let e = p(&long).unwrap_err();
        assert_eq!(e.input().chars().count(), MAX_QUOTED + 1);
        assert!(e.to_string().len() < 300);
    }

    #[test]
    fn new_checks_ranges() {
        assert!(Bdf::new(0, 0xff, 0x1f, 7).is_ok());
        assert_eq!(
            Bdf::new(0, 0, 0x20, 0).unwrap_err().reason,
            Reason::DeviceRange
        );
        assert_eq!(
            Bdf::new(0, 0, 0, 8).unwrap_err().reason,
            Reason::FunctionRange
        );
    }

    #[test]
    fn orders_numerically_like_its_strings() {
        let mut v: Vec<Bdf> = [
            "0001:00:00.0",
            "0000:01:00.0",
            "0000:00:1f.7",
            "0000:00:02.1",
        ]
        .iter()
        .map(|s| p(s).unwrap())
        .collect();
        v.sort();
        let s: Vec<String> = v.iter().map(Bdf::to_string).collect();
        let mut sorted = s.clone();
        sorted.sort();
        assert_eq!(s, sorted);
        assert_eq!(s[0], "0000:00:02.1");
    }

    #[test]
    #[cfg(feature = "serde")]
    fn serde_uses_the_string() {
        let b = p("0000:03:00.1").unwrap();
        assert_eq!(serde_json::to_string(&b).unwrap(), "\"0000:03:00.1\"");
        let back: Bdf = serde_json::from_str("\"03:00.1\"").unwrap();
        assert_eq!(back, b);
        assert!(serde_json::from_str::<Bdf>("\"03:00.9\"").is_err());
    }
}
