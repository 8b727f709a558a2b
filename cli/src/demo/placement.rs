//! Where the engine and the host threads run: the CPUs this process may use, the engine on
//! one of its own, the host threads pinned to the others.

use std::io;

use serde::Serialize;

use super::{DemoArgs, DemoError};

/// The CPUs the calling thread may run on (`sched_getaffinity`), in ascending order.
pub(super) fn allowed_cpus() -> io::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    let cpus = (0..nix::sched::CpuSet::count()).filter(|&cpu| set.is_set(cpu).unwrap_or(false));
    Ok(cpus.collect())
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity`; each below `CPU_SETSIZE`).
fn pin_to(cpus: &[usize]) -> io::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &cpu in cpus {
        // A CPU past the set's size is EINVAL.
        set.set(cpu)?;
    }
    Ok(nix::sched::sched_setaffinity(
        nix::unistd::Pid::from_raw(0),
        &set,
    )?)
}

/// Where the engine and the host threads run: the engine on a CPU of its own (`--engine-cpu`,
/// or the last allowed one), the host threads on the other allowed CPUs; nothing pinned with
/// `--no-pin` or a single allowed CPU.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Placement {
    pub(super) engine_cpu: Option<u32>,
    /// The host threads' CPUs (empty: wherever the scheduler puts them).
    host_cpus: Vec<usize>,
}

impl Placement {
    pub(super) fn of(args: &DemoArgs) -> Result<Placement, DemoError> {
        if args.no_pin {
            return Ok(Placement::default());
        }
        let allowed = allowed_cpus().map_err(|source| DemoError::Affinity {
            cpus: Vec::new(),
            source,
        })?;
        let engine = match args.engine_cpu {
            Some(cpu) => Some(cpu),
            None if allowed.len() > 1 => allowed.last().and_then(|&c| u32::try_from(c).ok()),
            None => None,
        };
        let host_cpus = match engine {
            Some(cpu) => allowed
                .into_iter()
                .filter(|&c| u32::try_from(c).ok() != Some(cpu))
                .collect(),
            None => Vec::new(),
        };
        Ok(Placement {
            engine_cpu: engine,
            host_cpus,
        })
    }

    /// Pins the calling host thread (nothing if no CPUs are left for it).
    pub(super) fn pin_host_thread(&self) -> Result<(), DemoError> {
        if self.host_cpus.is_empty() {
            return Ok(());
        }
        pin_to(&self.host_cpus).map_err(|source| DemoError::Affinity {
            cpus: self.host_cpus.clone(),
            source,
        })
    }
}
