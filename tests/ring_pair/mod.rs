//! A host queue and a device's view of the same ring, over loopback DMA memory and a
//! shared-memory BAR: what the ring tests play the device against.

#![allow(dead_code)]

use std::sync::Arc;

use userdma::dma::SoftIommu;
use userdma::irq::EventFd;
use userdma::memory::PageSize;
use userdma::mmio::{Block, Shared};
use userdma::ring::{Command, Config, DeviceQueue, Doorbells, Layout, Memory, Queue, Status};

/// The queue `config` describes, the device side of it (reaching the ring through the
/// loopback space's translation, as a device does) and the space. With `interrupt`, both
/// sides share one eventfd.
pub(crate) fn pair<T: Send>(
    config: Config,
    interrupt: bool,
) -> (
    Queue<Command, Status, T>,
    DeviceQueue<Command, Status>,
    SoftIommu,
) {
    let depth = config.depth();
    let space = SoftIommu::new(48).unwrap();
    let layout = Layout::new::<Command, Status>(depth).unwrap();
    let mapping = userdma::runtime::map_memory(&space, layout.size(), PageSize::Base).unwrap();
    let memory = Memory::from_mapping(Arc::new(mapping), 0, layout.size()).unwrap();
    let doorbells = Doorbells::new(Block::new(Shared::new(4096)).erase(), 0, 64).unwrap();
    let (irq, device_irq) = if interrupt {
        let irq = EventFd::new().unwrap();
        let clone = irq.try_clone().unwrap();
        (Some(irq), Some(clone))
    } else {
        (None, None)
    };
    let queue = Queue::new(config, memory.clone(), doorbells.clone(), irq).unwrap();
    let window = space.translate(memory.iova(), layout.size()).unwrap();
    let device_memory = Memory::from_window(window, memory.iova()).unwrap();
    let device =
        DeviceQueue::new(config.id(), depth, device_memory, doorbells, device_irq).unwrap();
    (queue, device, space)
}
