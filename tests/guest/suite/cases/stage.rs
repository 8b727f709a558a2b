//! The NVMe disk to edu with no CPU copy: the emulated NVMe controller bound to the kernel's
//! `nvme` driver, the blocks the `nvme-vfio` case wrote read with O_DIRECT through
//! `stage::Stager` (io_uring `READ_FIXED`) into pool buffers of a runtime that owns edu through
//! VFIO, and those buffers handed to edu's DMA engine by IOVA, into the device and back out
//! into other pool buffers. The process never writes the data: the input buffers are filled
//! with a canary before the reads, hold the disk's pattern after them (the controller DMAed it
//! there, the stager's path is direct), and edu is given exactly their IOVAs.
//!
//! The kernel's driver is loaded by this case (`insmod` of `nvme.ko` and what it needs, from
//! the initramfs) and unloaded at its end, so the controller is unbound again; the case runs
//! after every case that gives the controller to `vfio-pci` (a loaded `nvme` would claim it
//! whenever one of them returns it to no driver).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use userdma::memory::PageSize;
use userdma::pool::Config;
use userdma_infer::stage::{self, Direct, File, Mode, Stager};

use super::nvme::Plan;
use super::vfio;
use super::{compare, Buffer, CANARY};
use crate::edu::Direction;
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

/// The modules of the kernel's NVMe driver in load order, those of every guest kernel: 6.1's
/// `nvme-core` needs `t10-pi`, which needs the two CRCs; 6.12's needs `nvme-auth`.
/// `tests/guest/run.sh` puts each kernel's in the initramfs; those there are loaded.
const MODULES: &[&str] = &[
    "crct10dif_common",
    "crc-t10dif",
    "crc64",
    "crc64-rocksoft",
    "t10-pi",
    "nvme-auth",
    "nvme-core",
    "nvme",
];

/// The modules every kernel must have.
const REQUIRED: &[&str] = &["nvme-core", "nvme"];

/// Bytes per read request and per pool buffer (a multiple of the 512- or 4096-byte LBA).
const CHUNK: usize = 4096;
/// Bytes per edu transfer (its buffer takes at most 4095, see `edu`).
const PIECE: usize = 2048;
/// How long the kernel's driver may take to bring the namespace up (software emulation).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// The pool: two 2 MiB hugepage chunks (hugetlb memory, which io_uring registers on 6.1).
const POOL_LEN: usize = 4 << 20;

/// Word `k` (8 bytes, little-endian) of block `lba` as `examples/nvme` writes it:
/// `splitmix64((seed * 0x9e3779b97f4a7c15) ^ (lba << 16) ^ k)`.
fn block_pattern(seed: u64, lba: u64, lba_size: usize) -> Vec<u8> {
    fn splitmix64(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    (0..(lba_size / 8) as u64)
        .flat_map(|k| {
            splitmix64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (lba << 16) ^ k).to_le_bytes()
        })
        .collect()
}

/// `insmod` of each module there and not loaded yet (some are built in, or loaded already);
/// pushes each one loaded to `loaded`.
fn load_driver(loaded: &mut Vec<&'static str>) -> Result<(), Failure> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .context(|| "read the kernel release".to_owned())?;
    let dir = PathBuf::from("/lib/modules").join(release.trim());
    for &name in MODULES {
        let path = dir.join(format!("{name}.ko"));
        if !path.exists() {
            ensure!(
                !REQUIRED.contains(&name),
                "{} is not in the initramfs (tests/guest/run.sh puts the NVMe driver's modules there)",
                path.display()
            );
            continue;
        }
        if Path::new("/sys/module")
            .join(name.replace('-', "_"))
            .exists()
        {
            continue;
        }
        let out = Command::new("insmod")
            .arg(&path)
            .output()
            .context(|| format!("run insmod {}", path.display()))?;
        ensure!(
            out.status.success(),
            "insmod {} failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        loaded.push(name);
    }
    Ok(())
}

/// `rmmod` of the modules the case loaded, last loaded first (the controller is then unbound).
fn unload_driver(loaded: &[&str]) -> Result<(), Failure> {
    for name in loaded.iter().rev() {
        let out = Command::new("rmmod")
            .arg(name)
            .output()
            .context(|| format!("run rmmod {name}"))?;
        ensure!(
            out.status.success(),
            "rmmod {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The controller's first namespace once the kernel's driver has brought it up:
/// `(/dev/nvmeXnY, its logical block size)`.
fn namespace(env: &Env) -> Result<(PathBuf, usize), Failure> {
    let start = Instant::now();
    let ctrl_dir = env.device_file(env.nvme, "nvme");
    loop {
        let driver = env
            .sysfs
            .driver(env.nvme)
            .context(|| format!("read the driver of {}", env.nvme))?;
        if driver.as_deref() == Some("nvme") {
            let found = std::fs::read_dir(&ctrl_dir).ok().and_then(|ctrls| {
                ctrls.flatten().find_map(|ctrl| {
                    let ctrl_name = ctrl.file_name().into_string().ok()?;
                    std::fs::read_dir(ctrl.path())
                        .ok()?
                        .flatten()
                        .find_map(|e| {
                            let name = e.file_name().into_string().ok()?;
                            (name.starts_with(&ctrl_name)
                                && name[ctrl_name.len()..].starts_with('n'))
                            .then_some(name)
                        })
                })
            });
            if let Some(name) = found {
                let node = PathBuf::from("/dev").join(&name);
                let size_file = PathBuf::from("/sys/block")
                    .join(&name)
                    .join("queue/logical_block_size");
                if let (true, Ok(text)) = (node.exists(), std::fs::read_to_string(&size_file)) {
                    let size = text.trim().parse::<usize>().map_err(|_| {
                        Failure::Check(format!("{}: {text:?} is no size", size_file.display()))
                    })?;
                    println!(
                        "INFO stage-nvme-edu: the kernel's nvme driver has {} ({size}-byte blocks) after {} ms",
                        node.display(),
                        start.elapsed().as_millis()
                    );
                    return Ok((node, size));
                }
            }
        }
        ensure!(
            start.elapsed() < PROBE_TIMEOUT,
            "{} has driver {driver:?} and no namespace block device after {PROBE_TIMEOUT:?}",
            env.nvme
        );
        thread::sleep(Duration::from_millis(50));
    }
}

fn stage_err(e: stage::Error) -> userdma_infer::Error {
    userdma_infer::Error::from(e)
}

/// Disk → pool buffer (O_DIRECT, io_uring fixed buffers) → edu → pool buffer, byte for byte.
pub(crate) fn nvme_disk_to_edu(env: &Env) -> Result<(), Failure> {
    let cmdline =
        std::fs::read_to_string("/proc/cmdline").context(|| "read /proc/cmdline".to_owned())?;
    let plan = Plan::from_cmdline(&cmdline)?;
    let driver_before = env
        .sysfs
        .driver(env.nvme)
        .context(|| format!("read the driver of {}", env.nvme))?;
    ensure!(
        driver_before.is_none(),
        "{} is bound to {driver_before:?} before the case",
        env.nvme
    );
    let mut loaded = Vec::new();
    let result = load_driver(&mut loaded).and_then(|()| disk_to_edu(env, plan));
    let unloaded = unload_driver(&loaded);
    result?;
    unloaded?;
    let after = env
        .sysfs
        .driver(env.nvme)
        .context(|| format!("read the driver of {}", env.nvme))?;
    ensure!(
        after.is_none(),
        "{} is bound to {after:?} after the nvme driver was unloaded",
        env.nvme
    );
    Ok(())
}

fn disk_to_edu(env: &Env, plan: Plan) -> Result<(), Failure> {
    let (node, lba_size) = namespace(env)?;
    ensure!(
        CHUNK % lba_size == 0,
        "{}: {lba_size}-byte blocks do not divide the {CHUNK}-byte requests",
        node.display()
    );
    let start = plan.lba * lba_size as u64;
    let total = plan.blocks as usize * lba_size;
    ensure!(
        total % CHUNK == 0 && start % CHUNK as u64 == 0,
        "blocks {}..{} of {lba_size} bytes are not whole {CHUNK}-byte requests",
        plan.lba,
        plan.lba + plan.blocks
    );
    let mut expected = Vec::with_capacity(total);
    for lba in plan.lba..plan.lba + plan.blocks {
        expected.extend(block_pattern(plan.seed, lba, lba_size));
    }

    let (bound, vfio_dev, edu) = vfio::open(env, &vfio::options(env))?;
    let runtime = vfio::runtime(&vfio_dev);
    let pool = runtime
        .pool_with(POOL_LEN, PageSize::Huge2M, Config::default())
        .context(|| format!("make a pool over {POOL_LEN:#x} bytes of hugepages"))?;
    let disk = File::open(&node, Direct::Require)
        .map_err(stage_err)
        .context(|| format!("open {} with O_DIRECT", node.display()))?;
    ensure!(
        disk.mode() == Mode::Direct,
        "{} opened in {} mode",
        node.display(),
        disk.mode()
    );
    let align = disk.alignment();
    let chunks = total / CHUNK;
    let mut stager = Stager::new(
        pool.clone(),
        stage::Config::default().depth(chunks.min(16) as u32),
    )
    .map_err(stage_err)
    .context(|| "make a stager over the pool".to_owned())?;

    // The inputs, filled with the canary by the CPU: what they hold afterwards, only the
    // reads wrote.
    let mut inputs = Vec::with_capacity(chunks);
    for _ in 0..chunks {
        let buffer = pool
            .alloc_owned(CHUNK)
            .context(|| format!("allocate {CHUNK} bytes"))?;
        buffer.slice().fill(CANARY);
        inputs.push(Some(buffer));
    }
    let mut ticket_of = Vec::with_capacity(chunks);
    let mut next = 0;
    let mut done = 0;
    let mut iovas = Vec::with_capacity(chunks);
    while done < chunks {
        while next < chunks && (stager.in_flight() as u32) < stager.depth() {
            let buffer = inputs[next]
                .take()
                .ok_or_else(|| Failure::Check(format!("input {next} queued twice")))?;
            let ticket = stager
                .read(&disk, start + (next * CHUNK) as u64, buffer)
                .map_err(|r| stage_err(r.error))
                .context(|| format!("queue the read of chunk {next}"))?;
            ticket_of.push(ticket);
            next += 1;
        }
        let completion = stager
            .wait()
            .map_err(stage_err)
            .context(|| "wait for a read".to_owned())?;
        let index = ticket_of
            .iter()
            .position(|&t| t == completion.ticket)
            .ok_or_else(|| Failure::Check("a completion of no read queued".to_owned()))?;
        let buffer = completion
            .into_full()
            .map_err(stage_err)
            .context(|| format!("read chunk {index} of {}", node.display()))?;
        inputs[index] = Some(buffer);
        done += 1;
    }
    let inputs: Vec<_> = inputs.into_iter().flatten().collect();
    ensure!(
        inputs.len() == chunks,
        "{} of {chunks} reads came back",
        inputs.len()
    );
    for (i, buffer) in inputs.iter().enumerate() {
        let mut got = vec![0u8; CHUNK];
        buffer
            .read(0, &mut got)
            .context(|| format!("read input {i}"))?;
        compare(&expected[i * CHUNK..(i + 1) * CHUNK], &got).map_err(|why| {
            Failure::Check(format!(
                "chunk {i} read from {} (LBA {}..) into the pool buffer at IOVA {:#x}: {why}",
                node.display(),
                plan.lba + (i * CHUNK / lba_size) as u64,
                buffer.iova().raw()
            ))
        })?;
        iovas.push(buffer.iova().raw());
    }

    // Each input to edu by its IOVA and back out into another pool buffer.
    let mut transfers = 0;
    for (i, input) in inputs.iter().enumerate() {
        let output = pool
            .alloc_owned(CHUNK)
            .context(|| format!("allocate {CHUNK} bytes"))?;
        output.slice().fill(CANARY);
        for off in (0..CHUNK).step_by(PIECE) {
            let src = Buffer::in_pool(input.as_buffer(), off, PIECE)?;
            let dst = Buffer::in_pool(output.as_buffer(), off, PIECE)?;
            edu.dma(Direction::ToDevice, src.addr, PIECE)?;
            edu.dma(Direction::FromDevice, dst.addr, PIECE)?;
            transfers += 2;
        }
        let mut got = vec![0u8; CHUNK];
        output
            .read(0, &mut got)
            .context(|| format!("read output {i}"))?;
        compare(&expected[i * CHUNK..(i + 1) * CHUNK], &got).map_err(|why| {
            Failure::Check(format!(
                "chunk {i}: the disk's data from IOVA {:#x} through edu to IOVA {:#x}: {why}",
                input.iova().raw(),
                output.iova().raw()
            ))
        })?;
    }
    let first = iovas.iter().copied().min().unwrap_or(0);
    let last = iovas.iter().copied().max().unwrap_or(0);
    println!(
        "INFO stage-nvme-edu: {total} bytes (LBA {}..{}, seed {}) from {} in {} mode (alignment {}/{}) by READ_FIXED into {chunks} pool buffers in fixed buffer {} at IOVAs {first:#x}..={last:#x}, then {transfers} edu transfers of {PIECE} bytes from those IOVAs and back; every byte as nvme-vfio wrote it",
        plan.lba,
        plan.lba + plan.blocks,
        plan.seed,
        node.display(),
        disk.mode(),
        align.memory,
        align.offset,
        inputs
            .first()
            .and_then(|b| stager.fixed(b))
            .map_or(u16::MAX, |f| f.index),
    );
    drop(inputs);
    drop(stager);
    drop(disk);
    drop(pool);
    drop(edu);
    drop(runtime);
    drop(vfio_dev);
    bound.release()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_pattern_is_the_nvme_examples() {
        // Block 0, seed 0: word 0 is splitmix64(0).
        let block = block_pattern(0, 0, 512);
        assert_eq!(block.len(), 512);
        assert_eq!(
            u64::from_le_bytes(block[..8].try_into().unwrap()),
            0xe220_a839_7b1d_cdaf
        );
        assert_ne!(block_pattern(1, 0, 512), block);
        assert_ne!(block_pattern(0, 1, 512), block);
    }
}
