//! Pieces userdma's benchmarks share, and the baseline they are held against.
//!
//! - [`dpdk`]: DPDK 22.11 (`rte_mempool`, `rte_ring`) run through the same loops as the
//!   benchmarks' own cases, from a small C part compiled against Debian's `libdpdk-dev`.
//! - [`cpu`]: pinning to the host CPU (0) and the device CPU (1), and the cache-line ping-pong
//!   between them that every two-thread figure is printed with.
//!
//! A crate of its own because Cargo has no bench-only dependencies: userdma takes it as a
//! dev-dependency, so the library never links DPDK, and the build script that compiles the C
//! part belongs to this crate alone.

pub mod cpu;
pub mod dpdk;
