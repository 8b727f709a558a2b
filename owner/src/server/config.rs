//! What an owner is told: its socket, who may connect, its limits per client, its models,
//! and the errors starting or running it fails with.

use std::path::PathBuf;
use std::sync::Arc;

use userdma_infer::pipeline::{self, Model};
use userdma_infer::sched::Policy;

use super::CounterSource;

/// Who may connect.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Access {
    /// User ids allowed.
    pub uids: Vec<u32>,
    /// Group ids allowed (a peer's primary group).
    pub gids: Vec<u32>,
}

impl Access {
    /// Only the owner's own user.
    pub fn own_user() -> Access {
        Access {
            uids: vec![nix::unistd::geteuid().as_raw()],
            gids: Vec::new(),
        }
    }

    /// Whether a peer of `uid` and `gid` may connect.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }
}

/// What each client may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Clients at once.
    pub clients: u32,
    /// Bytes of one client's pool (a larger request is cut to this).
    pub pool_bytes: u64,
    /// Streams per client.
    pub streams: u32,
    /// Frames a client may have taken and not completed (its rings' sizes follow).
    pub in_flight: u32,
}

impl Default for Limits {
    /// 16 clients, 64 MiB pools, 4 streams and 64 frames each.
    fn default() -> Limits {
        Limits {
            clients: 16,
            pool_bytes: 64 << 20,
            streams: 4,
            in_flight: 64,
        }
    }
}

/// A model clients may name, with the pipeline settings its streams get (the owner chooses
/// each stream's queues and context, and copies results to the client's buffer).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its name in declarations.
    pub name: String,
    /// The model.
    pub model: Model,
    /// Its pipelines' settings (depth, batch, split, wait, timeout, working set).
    pub pipeline: pipeline::Config,
}

/// How the owner runs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The socket's path.
    pub socket: PathBuf,
    /// The socket file's mode (who may connect at all, before the allow-list).
    pub mode: u32,
    /// The allow-list.
    pub access: Access,
    /// Per-client limits.
    pub limits: Limits,
    /// The scheduling policy over every client's streams.
    pub policy: Policy,
    /// Frames on the device at once (1: the scheduler decides every frame when the device
    /// is free, so its stated bounds hold).
    pub in_flight: usize,
    /// The models clients may name.
    pub models: Vec<Entry>,
    /// Users who see every client's figures in stats (others see their own).
    pub admins: Vec<u32>,
    /// The device's counters, for the stats' device figures (`None`: the answer carries the
    /// device's name and the owner's clock only).
    pub counters: Option<Arc<dyn CounterSource>>,
}

impl Config {
    /// Listens at `socket` (mode 0660, the owner's own user only), batch switching K = 4, one
    /// frame on the device at a time, default limits, no models yet.
    pub fn new(socket: impl Into<PathBuf>) -> Config {
        Config {
            socket: socket.into(),
            mode: 0o660,
            access: Access::own_user(),
            limits: Limits::default(),
            policy: Policy::Batch { k: 4 },
            in_flight: 1,
            models: Vec::new(),
            admins: vec![0, nix::unistd::geteuid().as_raw()],
            counters: None,
        }
    }

    /// With `entry` in the catalogue.
    #[must_use]
    pub fn model(mut self, entry: Entry) -> Config {
        self.models.push(entry);
        self
    }
}

/// What starting or running the owner fails with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be made.
    #[error("cannot listen at {path}: {source} ({hint})")]
    Listen {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
        /// What to do.
        hint: &'static str,
    },
    /// A system call of the loop failed.
    #[error("{what} failed: {source}")]
    Io {
        /// What.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A configuration the owner cannot run.
    #[error("{0}")]
    Config(String),
    /// The device.
    #[error("the device: {0}")]
    Device(#[from] userdma_infer::Error),
}
