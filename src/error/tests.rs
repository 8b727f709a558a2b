//! Each wrapped error's code: the existing mappings, the new typed errors (once strings with
//! `InvalidArgument`), and the variants given a code deliberately when the wildcard went.

use std::io;
use std::sync::Arc;

use super::*;
use crate::memory::PageSize;

#[test]
fn module_errors_convert_with_their_codes_and_messages() {
    let e: Error = pool::Error::Exhausted {
        len: 4096,
        waited: std::time::Duration::ZERO,
    }
    .into();
    assert_eq!(e.code(), Code::Exhausted);
    let e: Error = device::Error::QueueBusy { queue: 3 }.into();
    assert_eq!((e.code(), e.code().raw()), (Code::Busy, 4));
    assert!(e.to_string().contains('3'), "{e}");
    let e: Error = dma::Error::InvalidDmaMask { bits: 99 }.into();
    assert_eq!(e.code(), Code::InvalidArgument);
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    assert!(boxed.to_string().contains("99"));
}

fn bdf() -> pci::Bdf {
    "0000:01:00.0".parse().unwrap()
}

fn os(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

/// Asserts each error's code and that its message is the wrapped error's (or its own).
fn check(table: Vec<(Error, Code)>) {
    for (e, code) in table {
        assert_eq!(e.code(), code, "{e:?}");
        assert!(!e.to_string().is_empty(), "{e:?}");
    }
}

/// The variants that fell under the old wildcard arm (`System`) and were given a code of
/// their own (or their wrapped error's), and some that stay `System`.
#[test]
fn variants_once_under_the_wildcard_have_their_chosen_codes() {
    let open = |source| device::Error::Open {
        bdf: bdf(),
        path: "/dev/vfio/7".into(),
        source,
    };
    let read = mmio::Error::Read {
        offset: 0,
        file_offset: 0,
        width: mmio::Width::U32,
        source: os(libc::EIO),
    };
    let outside = || mmio::Error::OutOfBounds {
        offset: 8,
        len: 4,
        size: 8,
    };
    let not_contiguous = memory::Error::NotContiguous {
        offset: 0,
        page_size: PageSize::Base,
        subpage: 1,
        expected: 2,
        found: 3,
    };
    let unmap = dma::Error::Unmap {
        kind: dma::Kind::Type1,
        iova: 0x1000,
        len: 0x1000,
        source: os(libc::EINVAL),
    };
    let path = || std::path::PathBuf::from("f");
    check(vec![
        // A device node: missing, forbidden, held by another process, other.
        (open(os(libc::ENOENT)).into(), Code::NotFound),
        (open(os(libc::EACCES)).into(), Code::Refused),
        (open(os(libc::EBUSY)).into(), Code::Busy),
        (open(os(libc::EIO)).into(), Code::System),
        // Wrapped module errors give their own codes.
        (
            device::Error::Register {
                offset: 8,
                source: outside(),
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            device::Error::Register {
                offset: 0,
                source: read,
            }
            .into(),
            Code::System,
        ),
        (
            device::Error::ConfigAccess {
                bdf: bdf(),
                offset: 0x100,
                source: outside(),
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            device::Error::Interrupt {
                vector: 0,
                source: irq::Error::Create {
                    source: os(libc::EMFILE),
                },
            }
            .into(),
            Code::System,
        ),
        (
            device::Error::Events {
                source: irq::Error::UnknownToken { token: 1 },
            }
            .into(),
            Code::NotFound,
        ),
        (
            device::Error::DmaSpace {
                bdf: bdf(),
                source: dma::Error::InvalidDmaMask { bits: 0 },
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            dma::Error::Physical {
                source: not_contiguous,
            }
            .into(),
            Code::Unsupported,
        ),
        (
            dma::Error::Physical {
                source: memory::Error::PhysicalAddressHidden,
            }
            .into(),
            Code::Unsupported,
        ),
        (
            dma::Error::UnmapFailed {
                source: Arc::new(unmap),
            }
            .into(),
            Code::System,
        ),
        (
            dma::Error::IovaUnavailable {
                range: dma::IovaRange {
                    start: 0x1000,
                    last: 0x1fff,
                },
                mask_bits: 32,
                ranges: dma::RangeList(Vec::new()),
            }
            .into(),
            Code::Busy,
        ),
        (
            ring::Error::Interrupt {
                queue: 0,
                source: irq::Error::UnknownToken { token: 2 },
            }
            .into(),
            Code::NotFound,
        ),
        (
            ring::Error::Quiesce {
                queue: 0,
                in_flight: 1,
                leaked: 1,
                source: io::ErrorKind::TimedOut.into(),
            }
            .into(),
            Code::Device,
        ),
        // The caller's file or setting.
        (
            memory::Error::UnexpectedHugetlbfs {
                block_size: 2 << 20,
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            memory::Error::FileTooShort {
                len: 8192,
                file_len: 4096,
            }
            .into(),
            Code::InvalidArgument,
        ),
        (
            device::Error::Vfio(device::vfio::Error::ContainerMask {
                bdf: bdf(),
                wanted: 32,
                space: 64,
            })
            .into(),
            Code::InvalidArgument,
        ),
        (
            device::Error::Vfio(device::vfio::Error::ContainerModel {
                bdf: bdf(),
                model: "no-IOMMU",
            })
            .into(),
            Code::InvalidArgument,
        ),
        // Failing system calls, and the kernel's own answers, stay `System`.
        (
            memory::Error::WrongNode {
                offset: 0,
                node: 1,
                found: 0,
            }
            .into(),
            Code::System,
        ),
        (
            pci::Error::Parse {
                path: path(),
                value: "x".into(),
                expected: "hex",
            }
            .into(),
            Code::System,
        ),
    ]);
}

#[test]
fn unsupported_is_its_own_code() {
    let unsupported = Error::Unsupported {
        device: "d".into(),
        what: "x",
        hint: "y",
    };
    check(vec![(unsupported, Code::Unsupported)]);
}

/// A backend outside the driver (the loopback NPU, a vendor's) keeps its own code and message
/// through `device::Error::Backend`, and gives its error back by type.
#[test]
fn a_backends_error_keeps_its_code_message_and_type() {
    #[derive(Debug, thiserror::Error)]
    #[error("vendor engine {0} hung")]
    struct Hung(u32);
    let e: Error = device::Error::Backend(device::Backend::new(Code::Timeout, Hung(3))).into();
    assert_eq!(e.code(), Code::Timeout);
    assert_eq!(e.to_string(), "vendor engine 3 hung");
    let Error::Device(device::Error::Backend(backend)) = e else {
        panic!("{e:?}");
    };
    assert_eq!(backend.downcast_ref::<Hung>().map(|h| h.0), Some(3));
    let hung = backend.downcast::<Hung>().expect("a Hung");
    assert_eq!(hung.0, 3);
    let other = device::Backend::new(Code::Device, std::io::Error::other("x"));
    assert!(other.downcast::<Hung>().is_err());
}

/// Every code comes back from its number (another process's, an older build's); other
/// numbers are no code.
#[test]
fn every_code_comes_back_from_its_number() {
    for (i, code) in Code::ALL.into_iter().enumerate() {
        assert_eq!(code.raw(), i as i32 + 1);
        assert_eq!(Code::from_raw(code.raw()), Some(code));
    }
    for n in [0, 11, -1, i32::MAX] {
        assert_eq!(Code::from_raw(n), None);
    }
}
