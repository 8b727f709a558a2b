//! `membarrier(2)`: a memory barrier on every thread of the process (or of the system) at once,
//! which lets a rarely taken path pay for the store-load ordering that a hot path on other
//! threads then need not pay for (an "asymmetric fence").
//!
//! `syscall(SYS_membarrier, cmd, flags, cpu_id)`; [`MEMBARRIER_CMD_QUERY`] returns the
//! commands the kernel supports as a bit mask of their values. The private expedited command
//! (Linux 4.14) needs a one-time registration by the process
//! ([`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`]); the global one (Linux 4.3, named
//! `MEMBARRIER_CMD_SHARED` before 4.16) needs none and is much slower (it waits for an RCU grace
//! period).

use libc::c_int;

/// The `membarrier` system call number for this target.
pub use libc::SYS_membarrier;

/// Which commands the kernel supports (a mask of their values).
pub const MEMBARRIER_CMD_QUERY: c_int = 0;
/// A barrier on every running thread of the system (waits for an RCU grace period).
pub const MEMBARRIER_CMD_GLOBAL: c_int = 1 << 0;
/// A barrier on every running thread of the calling process, by IPI (Linux 4.14).
pub const MEMBARRIER_CMD_PRIVATE_EXPEDITED: c_int = 1 << 3;
/// Registers the process for [`MEMBARRIER_CMD_PRIVATE_EXPEDITED`] (Linux 4.14).
pub const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: c_int = 1 << 4;
