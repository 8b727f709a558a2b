//! Memory placed on a device's NUMA node, in the boot with two nodes ([`Boot::has_numa`]): the
//! second edu sits behind a `pxb-pcie` expander bridge on node 1, so sysfs gives it
//! `numa_node` 1. A `Runtime` that owns it, through VFIO and through UIO, maps its memory
//! (hugepages, base pages, a pool) on node 1, as `move_pages` reads back page by page; memory
//! asked for on node 0 is on node 0; and edu copies through the node-1 memory.
//!
//! [`Boot::has_numa`]: crate::Boot::has_numa

use std::path::Path;
use std::sync::Arc;

use userdma::device::{Device, Uio, Vfio};
use userdma::dma::Mapping;
use userdma::memory::{hugepages, numa, PageSize, SYSFS_ROOT};
use userdma::pci::{Bdf, Driver};
use userdma::Runtime;

use super::{round_trip, Buffer, GUARD, TRANSFER};
use crate::edu::{self, Edu};
use crate::env::Env;
use crate::failure::{ensure, Context, Failure};

const HUGE: usize = 2 << 20;
/// Base-page memory each check maps: 64 pages.
const BASE_LEN: usize = 256 << 10;
/// A pool over four 2 MiB pages (a chunk is a hugepage; a base-page pool needs its memory
/// IOVA-contiguous per chunk, which a physical-address space does not give).
const POOL_LEN: usize = 4 * HUGE;

/// Checks that every page of `mapping` is on `node` and that its region says it was bound there.
fn expect_on(mapping: &Mapping, node: u32, what: &str) -> Result<(), Failure> {
    let region = mapping.region();
    let nodes = region
        .page_nodes()
        .context(|| format!("read back the nodes of {what}"))?;
    ensure!(
        nodes.len() == region.page_count() && nodes.iter().all(|&n| n == node),
        "{what}: {} pages on nodes {nodes:?}, want every one on node {node}",
        region.page_count()
    );
    ensure!(
        region.node() == Some(node),
        "{what}: the region says it is bound to {:?}, want node {node}",
        region.node()
    );
    println!(
        "INFO numa-placement: {what}: {} {} pages, all on node {node}",
        nodes.len(),
        region.page_size()
    );
    Ok(())
}

/// What a runtime for the node-1 edu maps: on node 1 by default, on node 0 when asked; and an
/// edu round trip through the node-1 hugepages.
fn check_runtime(runtime: &Runtime, device: &Edu, path: &str) -> Result<(), Failure> {
    ensure!(
        runtime.numa_node() == Some(1),
        "{path}: the runtime places memory on {:?}, want node 1 (the device's)",
        runtime.numa_node()
    );
    let huge = runtime
        .map_memory(2 * HUGE, PageSize::Huge2M)
        .context(|| format!("{path}: map two 2 MiB pages for the node-1 edu"))?;
    expect_on(&huge, 1, &format!("{path}: map_memory, 2 MiB pages"))?;
    let base = runtime
        .map_memory(BASE_LEN, PageSize::Base)
        .context(|| format!("{path}: map {BASE_LEN:#x} bytes of base pages"))?;
    expect_on(&base, 1, &format!("{path}: map_memory, base pages"))?;
    let pool = runtime
        .pool(POOL_LEN, PageSize::Huge2M)
        .context(|| format!("{path}: a pool over {POOL_LEN:#x} bytes of 2 MiB pages"))?;
    expect_on(pool.mapping(), 1, &format!("{path}: pool"))?;
    let near = runtime
        .map_memory_on(HUGE, PageSize::Huge2M, Some(0))
        .context(|| format!("{path}: map a 2 MiB page on node 0"))?;
    expect_on(
        &near,
        0,
        &format!("{path}: map_memory_on(node 0), 2 MiB pages"),
    )?;
    let near_base = runtime
        .map_memory_on(BASE_LEN, PageSize::Base, Some(0))
        .context(|| format!("{path}: map base pages on node 0"))?;
    expect_on(
        &near_base,
        0,
        &format!("{path}: map_memory_on(node 0), base pages"),
    )?;
    // The device reaches the memory placed for it: a copy through edu, node 1 to node 1.
    round_trip(
        device,
        &Buffer::at(&huge, 0, TRANSFER)?,
        &Buffer::at(&huge, HUGE, TRANSFER + GUARD)?,
        61,
    )
}

/// The node-1 edu's sysfs node, the nodes the guest has, and the runtime's placement through
/// VFIO and UIO.
pub(crate) fn placement(env: &Env) -> Result<(), Failure> {
    let bdf: Bdf = env.numa_edu.ok_or_else(|| {
        Failure::Check("this boot has no edu behind the expander bridge".to_owned())
    })?;
    let root = Path::new(SYSFS_ROOT);
    let online = numa::online(root).context(|| "read the online NUMA nodes".to_owned())?;
    let with_memory =
        numa::with_memory(root).context(|| "read the NUMA nodes with memory".to_owned())?;
    ensure!(
        online.as_slice() == [0, 1] && with_memory.as_slice() == [0, 1],
        "the guest should have nodes 0-1, both with memory: online {online}, with memory \
         {with_memory}"
    );
    let info = env
        .sysfs
        .device(bdf)
        .context(|| format!("read {bdf} in sysfs"))?;
    ensure!(
        info.numa_node == Some(1),
        "{bdf} behind the expander bridge: sysfs numa_node {:?}, want 1",
        info.numa_node
    );
    let first = env
        .sysfs
        .device(env.edu)
        .context(|| format!("read {} in sysfs", env.edu))?;
    ensure!(
        first.numa_node.is_none(),
        "{} on bus 0: sysfs numa_node {:?}, want none",
        env.edu,
        first.numa_node
    );
    let pools = hugepages::status(root).context(|| "read the hugepage pools".to_owned())?;
    for node in [0, 1] {
        if let Some(pool) = pools.pool(PageSize::Huge2M, Some(node)) {
            println!(
                "INFO numa-placement: node {node}: {} of {} 2 MiB hugepages free",
                pool.free, pool.total
            );
        }
    }
    println!(
        "INFO numa-placement: edu {bdf} on node 1, edu {} on none",
        env.edu
    );

    // VFIO (type1 in this boot).
    let bound = env.bind(bdf, Driver::VfioPci)?;
    let options = userdma::device::vfio::Options::new().dma_mask_bits(edu::DMA_MASK_BITS);
    let vfio =
        Arc::new(Vfio::open_with(bdf, &options).context(|| format!("open {bdf} through VFIO"))?);
    let device = Edu::new(vfio.bar(0).context(|| format!("BAR0 of {bdf}"))?)?;
    ensure!(
        vfio.numa_node() == Some(1),
        "VFIO: {bdf} reports node {:?}, want 1",
        vfio.numa_node()
    );
    let runtime = Runtime::from_device(Arc::clone(&vfio) as Arc<dyn Device>);
    check_runtime(&runtime, &device, "VFIO")?;
    drop(device);
    drop(runtime);
    drop(vfio);
    bound.release()?;

    // UIO (physical addresses: this boot's IOMMU passes an unbound device through).
    let bound = env.bind(bdf, Driver::UioPciGeneric)?;
    let uio = Arc::new(
        Uio::open_with(bdf, edu::DMA_MASK_BITS).context(|| format!("open {bdf} through UIO"))?,
    );
    let device = Edu::new(uio.bar(0).context(|| format!("BAR0 of {bdf}"))?)?;
    let runtime = Runtime::from_device(Arc::clone(&uio) as Arc<dyn Device>);
    check_runtime(&runtime, &device, "UIO")?;
    drop(device);
    drop(runtime);
    drop(uio);
    bound.release()
}
