//! The `_IOC` ioctl number encoding of `<asm-generic/ioctl.h>`, as `const fn`s.
//!
//! An ioctl request number packs four fields into 32 bits:
//!
//! ```text
//!  31 30 29          16 15        8 7          0
//! +-----+--------------+-----------+------------+
//! | dir |     size     |   type    |     nr     |
//! +-----+--------------+-----------+------------+
//! ```
//!
//! `dir` says which way the argument travels ([`IOC_WRITE`]: user to kernel, [`IOC_READ`]: kernel to
//! user), `size` is `sizeof` the argument, `type` is the driver's magic byte and `nr` the command.
//! This is the layout of x86, arm, arm64, riscv, s390 and loongarch. PowerPC, MIPS, SPARC and Alpha
//! use a different split and are refused at compile time.
//!
//! Numbers are [`libc::Ioctl`], the type `libc::ioctl` takes.

use core::mem::size_of;

pub use libc::Ioctl;

#[cfg(any(
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "mips",
    target_arch = "mips32r6",
    target_arch = "mips64",
    target_arch = "mips64r6",
    target_arch = "sparc",
    target_arch = "sparc64",
))]
compile_error!("userdma-sys encodes ioctl numbers the asm-generic way; this architecture uses another encoding");

/// Width of the command number field.
#[doc(alias = "_IOC_NRBITS")]
pub const IOC_NRBITS: u32 = 8;
/// Width of the type (driver magic) field.
#[doc(alias = "_IOC_TYPEBITS")]
pub const IOC_TYPEBITS: u32 = 8;
/// Width of the argument size field.
#[doc(alias = "_IOC_SIZEBITS")]
pub const IOC_SIZEBITS: u32 = 14;
/// Width of the direction field.
#[doc(alias = "_IOC_DIRBITS")]
pub const IOC_DIRBITS: u32 = 2;

/// Largest argument size an ioctl number can encode (`(1 << 14) - 1` bytes).
#[doc(alias = "_IOC_SIZEMASK")]
pub const IOC_SIZEMASK: u32 = (1 << IOC_SIZEBITS) - 1;
/// Largest direction value.
#[doc(alias = "_IOC_DIRMASK")]
pub const IOC_DIRMASK: u32 = (1 << IOC_DIRBITS) - 1;

/// Bit position of the command number.
#[doc(alias = "_IOC_NRSHIFT")]
pub const IOC_NRSHIFT: u32 = 0;
/// Bit position of the type field.
#[doc(alias = "_IOC_TYPESHIFT")]
pub const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
/// Bit position of the size field.
#[doc(alias = "_IOC_SIZESHIFT")]
pub const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
/// Bit position of the direction field.
#[doc(alias = "_IOC_DIRSHIFT")]
pub const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;

/// Direction: no argument is copied (the argument, if any, is passed by value).
#[doc(alias = "_IOC_NONE")]
pub const IOC_NONE: u32 = 0;
/// Direction: user space writes the argument, the kernel reads it.
#[doc(alias = "_IOC_WRITE")]
pub const IOC_WRITE: u32 = 1;
/// Direction: the kernel writes the argument, user space reads it.
#[doc(alias = "_IOC_READ")]
pub const IOC_READ: u32 = 2;

/// Composes an ioctl number from its four fields, like the kernel's `_IOC(dir, type, nr, size)`.
///
/// # Panics
///
/// If `dir` does not fit in two bits or `size` does not fit in 14 bits. Ioctl numbers are
/// constants, so in practice this is a compile-time error in the `const` item that calls it.
#[doc(alias = "_IOC")]
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> Ioctl {
    assert!(dir <= IOC_DIRMASK, "ioctl direction does not fit in 2 bits");
    assert!(
        size <= IOC_SIZEMASK as usize,
        "ioctl argument larger than 16383 bytes"
    );
    // Both asserts above bound the values, so the shifts stay inside 32 bits and `size as u32` is
    // exact.
    let number = (dir << IOC_DIRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT);
    // `Ioctl` is `c_ulong` on glibc (widening) and `c_int` on musl, where the kernel reads the same
    // 32 bits back as an unsigned int; the cast keeps the bit pattern either way.
    number as Ioctl
}

/// `_IO(type, nr)`: an ioctl with no argument copied through the number's size field.
///
/// VFIO and iommufd use this form for every ioctl, passing the struct pointer as the argument and
/// its length in the struct's own `argsz`/`size` field.
#[doc(alias = "_IO")]
pub const fn io(ty: u8, nr: u8) -> Ioctl {
    ioc(IOC_NONE, ty, nr, 0)
}

/// `_IOR(type, nr, T)`: the kernel writes a `T` that user space reads.
///
/// # Panics
///
/// If `size_of::<T>()` exceeds 16383 bytes (a compile-time error in a `const` item).
#[doc(alias = "_IOR")]
pub const fn ior<T>(ty: u8, nr: u8) -> Ioctl {
    ioc(IOC_READ, ty, nr, size_of::<T>())
}

/// `_IOW(type, nr, T)`: user space writes a `T` that the kernel reads.
///
/// # Panics
///
/// If `size_of::<T>()` exceeds 16383 bytes (a compile-time error in a `const` item).
#[doc(alias = "_IOW")]
pub const fn iow<T>(ty: u8, nr: u8) -> Ioctl {
    ioc(IOC_WRITE, ty, nr, size_of::<T>())
}

/// `_IOWR(type, nr, T)`: a `T` travels both ways.
///
/// # Panics
///
/// If `size_of::<T>()` exceeds 16383 bytes (a compile-time error in a `const` item).
#[doc(alias = "_IOWR")]
pub const fn iowr<T>(ty: u8, nr: u8) -> Ioctl {
    ioc(IOC_READ | IOC_WRITE, ty, nr, size_of::<T>())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference values are the kernel's own, as `<linux/...>` headers expand them on x86_64.
    #[test]
    fn io_matches_kernel_numbers() {
        // VFIO_GET_API_VERSION = _IO(';', 100)
        assert_eq!(io(b';', 100), 0x3B64);
        // KVM_CREATE_VM = _IO(0xAE, 0x01)
        assert_eq!(io(0xAE, 0x01), 0xAE01);
        // UI_DEV_CREATE = _IO('U', 1)
        assert_eq!(io(b'U', 1), 0x5501);
    }

    #[test]
    fn ior_iow_iowr_match_kernel_numbers() {
        // FS_IOC_GETFLAGS = _IOR('f', 1, long), FS_IOC_SETFLAGS = _IOW('f', 2, long)
        assert_eq!(ior::<libc::c_long>(b'f', 1), 0x8008_6601);
        assert_eq!(iow::<libc::c_long>(b'f', 2), 0x4008_6602);
        // TIOCGPTN = _IOR('T', 0x30, unsigned int), TIOCSPTLCK = _IOW('T', 0x31, int)
        assert_eq!(ior::<libc::c_uint>(b'T', 0x30), 0x8004_5430);
        assert_eq!(iow::<libc::c_int>(b'T', 0x31), 0x4004_5431);
        // KVM_SET_USER_MEMORY_REGION = _IOW(0xAE, 0x46, struct kvm_userspace_memory_region /* 32
        // */)
        assert_eq!(iow::<[u64; 4]>(0xAE, 0x46), 0x4020_AE46);
        // VIDIOC_G_FMT = _IOWR('V', 4, struct v4l2_format /* 208 */)
        assert_eq!(iowr::<[u64; 26]>(b'V', 4), 0xC0D0_5604);
    }

    #[test]
    fn agrees_with_libc() {
        assert_eq!(ior::<libc::c_uint>(b'T', 0x30), libc::TIOCGPTN);
        assert_eq!(iow::<libc::c_int>(b'T', 0x31), libc::TIOCSPTLCK);
        assert_eq!(ior::<libc::c_long>(b'f', 1), libc::FS_IOC_GETFLAGS);
    }

    #[test]
    fn fields_land_in_their_bits() {
        let n = ioc(IOC_READ | IOC_WRITE, 0xAB, 0xCD, IOC_SIZEMASK as usize);
        assert_eq!(n, 0xFFFF_ABCD);
        assert_eq!(ioc(IOC_NONE, 0, 0, 0), 0);
        assert_eq!(IOC_DIRSHIFT, 30);
        assert_eq!(IOC_SIZESHIFT, 16);
        assert_eq!(IOC_TYPESHIFT, 8);
    }

    #[test]
    #[should_panic(expected = "larger than 16383")]
    fn oversized_argument_is_refused() {
        let _ = ior::<[u8; 16384]>(b'x', 0);
    }

    #[test]
    #[should_panic(expected = "direction")]
    fn bad_direction_is_refused() {
        let _ = ioc(4, b'x', 0, 0);
    }
}
