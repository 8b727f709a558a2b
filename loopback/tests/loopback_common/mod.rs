//! What the loopback device's byte-level tests share: a device with 1 MiB of memory and no
//! cost, host memory mapped into its DMA space, deterministic bytes, one descriptor run to
//! its completion, and reads of device and host memory.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use userdma::device::Device;
use userdma::dma::Mapping;
use userdma::memory::PageSize;
use userdma::ring::{Command, Queue, Status};
use userdma_loopback::{Config, Cost, Loopback};

/// The device's memory.
pub(crate) const MEMORY: usize = 1 << 20;
/// The longest any completion may take.
pub(crate) const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));

/// A zero-cost loopback device with [`MEMORY`] bytes of memory and `queues` queues.
pub(crate) fn device(queues: u16) -> Arc<Loopback> {
    let config = Config::default()
        .cost(Cost::zero())
        .memory_size(MEMORY)
        .queues(queues);
    Arc::new(Loopback::new(config).expect("loopback device"))
}

/// `len` bytes of host memory mapped into the device's DMA space.
pub(crate) fn host_memory(device: &Loopback, len: usize) -> Mapping {
    userdma::runtime::map_memory(device.dma_space().as_ref(), len, PageSize::Base)
        .expect("host memory mapped into the device's DMA space")
}

/// Deterministic bytes.
pub(crate) fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Submits `command` and waits for its completion.
pub(crate) fn run(queue: &mut Queue<Command, Status, ()>, command: Command) -> Status {
    queue.submit(command, ()).expect("submitted");
    queue.wait(TIMEOUT).expect("completed").entry
}

/// `len` bytes of device memory at `offset`.
pub(crate) fn device_bytes(device: &Loopback, offset: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    device
        .device_memory()
        .read_into(offset as usize, &mut bytes)
        .expect("in bounds");
    bytes
}

/// All of `mapping`.
pub(crate) fn host_bytes(mapping: &Mapping) -> Vec<u8> {
    let mut bytes = vec![0; mapping.len()];
    mapping.slice().read_into(0, &mut bytes).expect("in bounds");
    bytes
}
