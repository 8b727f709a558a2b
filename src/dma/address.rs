//! Address newtypes: [`Iova`], an address in a device's DMA space, and [`DeviceOffset`], a
//! byte offset in a device's own memory (a memory BAR). Both are `u64` underneath; keeping them
//! apart means one cannot be passed where the other is meant (the vm-memory `GuestAddress`
//! habit).

use std::fmt;

/// An address in a device's DMA address space: what the device puts on the bus to reach host
/// memory (an IOVA behind an IOMMU, a physical address without one, an address of the loopback
/// device's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Iova(pub u64);

/// A byte offset in a device's own memory (the loopback device's BAR 2, an NPU's DRAM window).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct DeviceOffset(pub u64);

macro_rules! address {
    ($name:ident) => {
        impl $name {
            /// The raw value.
            #[inline(always)]
            pub const fn raw(self) -> u64 {
                self.0
            }

            /// `self + bytes`, or `None` if it overflows.
            #[inline]
            pub const fn checked_add(self, bytes: u64) -> Option<$name> {
                match self.0.checked_add(bytes) {
                    Some(sum) => Some($name(sum)),
                    None => None,
                }
            }

            /// The bytes from `base` to `self`, or `None` if `self` is below `base`.
            #[inline]
            pub const fn checked_offset_from(self, base: $name) -> Option<u64> {
                self.0.checked_sub(base.0)
            }

            /// Whether the address is a multiple of `align` (a power of two).
            #[inline]
            pub const fn is_aligned(self, align: u64) -> bool {
                align.is_power_of_two() && self.0 & (align - 1) == 0
            }
        }

        impl std::ops::Add<u64> for $name {
            type Output = $name;
            /// `self + bytes` (overflow is a bug: it panics in debug builds, as integer `+`).
            #[inline(always)]
            fn add(self, bytes: u64) -> $name {
                $name(self.0 + bytes)
            }
        }

        impl std::ops::AddAssign<u64> for $name {
            #[inline(always)]
            fn add_assign(&mut self, bytes: u64) {
                self.0 += bytes;
            }
        }

        impl std::ops::Sub<u64> for $name {
            type Output = $name;
            #[inline(always)]
            fn sub(self, bytes: u64) -> $name {
                $name(self.0 - bytes)
            }
        }

        impl std::ops::Sub for $name {
            type Output = u64;
            /// The bytes from `base` up to `self`.
            #[inline(always)]
            fn sub(self, base: $name) -> u64 {
                self.0 - base.0
            }
        }

        impl std::ops::Rem<u64> for $name {
            type Output = u64;
            /// The offset of `self` past the last multiple of `align`.
            #[inline(always)]
            fn rem(self, align: u64) -> u64 {
                self.0 % align
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }
    };
}

address!(Iova);
address!(DeviceOffset);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_checks_overflow_and_order() {
        assert_eq!(Iova(0x1000).checked_add(0x10), Some(Iova(0x1010)));
        assert_eq!(Iova(u64::MAX).checked_add(1), None);
        assert_eq!(Iova(0x1010).checked_offset_from(Iova(0x1000)), Some(0x10));
        assert_eq!(Iova(0x1000).checked_offset_from(Iova(0x1010)), None);
        assert!(DeviceOffset(0x200).is_aligned(0x100));
        assert!(!DeviceOffset(0x280).is_aligned(0x100));
        assert!(!DeviceOffset(0x0).is_aligned(3));
        assert_eq!(Iova(0xfeed).to_string(), "0xfeed");
        assert_eq!(format!("{:x}", DeviceOffset(0xab)), "ab");
        assert_eq!(Iova(0x1000) + 0x10, Iova(0x1010));
        assert_eq!(Iova(0x1010) - Iova(0x1000), 0x10);
        assert_eq!(Iova(0x1010) - 0x10, Iova(0x1000));
        assert_eq!(Iova(0x1010) % 0x100, 0x10);
        let mut at = DeviceOffset(4);
        at += 4;
        assert_eq!(at, DeviceOffset(8));
    }
}
