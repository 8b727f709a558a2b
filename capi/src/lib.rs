//! The C API of userdma: `libuserdma.so` / `libuserdma.a`, declared by `include/userdma.h`
//! (generated from this crate by cbindgen, see `capi/gen-header.sh`).
//!
//! | module | owns |
//! |---|---|
//! | `error` | `udma_status`, the thread's last error, the boundary every call goes through |
//! | `handle` | handles: tagged, generation-checked keys, never dereferenced |
//! | `slots` | lock-free handle slots for buffers and pools (the hot path) |
//! | `sync` | loom's atomics under `cfg(loom)`, std's otherwise |
//! | `abi` | structs that grow: `size` first, older sizes accepted |
//! | `device` | the loopback device, PCI functions (VFIO, UIO), interrupt fds |
//! | `bar` | BAR access: checked 8- to 64-bit register reads and writes |
//! | `dram` | device memory as ranges: alloc, alloc at an offset, free, info |
//! | `memory` | mappings, pools, buffers |
//! | `queue` | queues: submit, poll, wait, wait on many |
//! | `plan` | the static buffer planner |
//! | `pipeline` | models, pipelines, the frame views callbacks get |
//! | `streams` | streams of pipelines under a scheduler |
//! | `interop` | dma-buf, fences, descriptors passed to another process |
//! | `owner` | a client of a device owner process (`userdma serve`) |
//!
//! Every C name (`udma_*`) is spelled here as C spells it.
#![allow(non_camel_case_types)]
// Under loom (`RUSTFLAGS="--cfg loom"`), userdma builds its concurrency core only, and this
// crate its handle slots and what they need, for their loom models.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

#[cfg(not(loom))]
mod abi;
#[cfg(not(loom))]
mod bar;
#[cfg(not(loom))]
mod device;
#[cfg(not(loom))]
mod dram;
#[cfg(not(loom))]
mod engine;
mod error;
mod handle;
#[cfg(not(loom))]
mod memory;
#[cfg(not(loom))]
mod pipeline;
#[cfg(not(loom))]
mod plan;
#[cfg(not(loom))]
mod queue;
mod quiesce;
mod slots;
#[cfg(not(loom))]
mod streams;
mod sync;
// After streams: the header declares its functions last.
#[cfg(not(loom))]
mod interop;
// After interop: the header declares the owner client's functions after everything else.
#[cfg(not(loom))]
mod owner;

#[cfg(not(loom))]
pub use bar::*;
#[cfg(not(loom))]
pub use device::*;
#[cfg(not(loom))]
pub use dram::*;
#[cfg(not(loom))]
pub use engine::*;
pub use error::{udma_last_error, udma_status, udma_status_name};
#[cfg(not(loom))]
pub use interop::*;
#[cfg(not(loom))]
pub use memory::*;
#[cfg(not(loom))]
pub use owner::*;
#[cfg(not(loom))]
pub use pipeline::*;
#[cfg(not(loom))]
pub use plan::*;
#[cfg(not(loom))]
pub use queue::*;
#[cfg(not(loom))]
pub use streams::*;

/// The major version of the header (the library's is `udma_version() >> 16`).
pub const UDMA_VERSION_MAJOR: u32 = 0;
/// The minor version of the header.
pub const UDMA_VERSION_MINOR: u32 = 1;
/// The patch version of the header.
pub const UDMA_VERSION_PATCH: u32 = 0;
/// The header's version as one number, `major << 16 | minor << 8 | patch`: compare it with
/// `udma_version()`.
pub const UDMA_VERSION: u32 =
    UDMA_VERSION_MAJOR << 16 | UDMA_VERSION_MINOR << 8 | UDMA_VERSION_PATCH;

/// The library's version, `major << 16 | minor << 8 | patch` (as `UDMA_VERSION`). A program
/// built against major version M runs with a library of the same M and a minor version at
/// least its own.
#[no_mangle]
pub extern "C" fn udma_version() -> u32 {
    UDMA_VERSION
}

/// The library's version as text (`"0.1.0"`), a static string.
#[no_mangle]
pub extern "C" fn udma_version_string() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_constants_are_the_package_version() {
        let v = |s: &str| s.parse::<u32>().expect("a number");
        assert_eq!(
            super::UDMA_VERSION_MAJOR,
            v(env!("CARGO_PKG_VERSION_MAJOR"))
        );
        assert_eq!(
            super::UDMA_VERSION_MINOR,
            v(env!("CARGO_PKG_VERSION_MINOR"))
        );
        assert_eq!(
            super::UDMA_VERSION_PATCH,
            v(env!("CARGO_PKG_VERSION_PATCH"))
        );
    }
}
