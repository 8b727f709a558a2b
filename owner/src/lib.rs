//! userdma-owner: several processes on one device.
//!
//! VFIO gives a device to one process. The **owner** (`server::Owner`, `userdma serve`) is
//! that process: it opens the device, owns its DMA space, queues and memory, and runs the
//! streams of every client under one scheduler, so the scheduler that cuts context switches
//! and bounds every stream's wait sees every stream on the device. A **client**
//! ([`Client`]) connects over a Unix socket, declares streams (priority, rate, maximum wait,
//! model), takes buffers from a pool the owner made for it and maps for the device, and
//! submits frames and takes their results through rings in shared memory: no copy, and no
//! system call per frame while the owner is busy.
//!
//! | module | owns |
//! |---|---|
//! | [`proto`] | the control messages: fixed layouts, checked decoding |
//! | [`chan`] | the submission and completion rings and their idle flags, in shared memory |
//! | [`client`] | [`Client`]: connect, declare, submit, wait, stats, events |
//! | `server` | (feature `server`) `server::Owner`: access, per-client pools and rings, scheduling, crashes, faults, the device's counters in stats (`server::CounterSource`) |
//!
//! A client links only the driver (`userdma`); the owner needs the inference layer
//! (`userdma-infer`) for its pipelines and scheduler, behind the `server` feature.

pub mod chan;
// The loom build models the rings only (`chan`'s loom tests).
#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
mod error;
pub mod proto;
#[cfg(all(feature = "server", not(loom)))]
pub mod server;
#[cfg(not(loom))]
mod spin;

#[cfg(not(loom))]
pub use self::client::{Client, Event, Options, Span, Stats, Stream, StreamDecl};
#[cfg(not(loom))]
pub use self::error::Error;
pub use self::proto::EventKind;
