//! NUMA placement on this machine's own nodes (node 0 exists everywhere, so one node is enough):
//! memory bound to node 0 reads back as node 0 page by page and carries the kernel's
//! `MPOL_BIND` policy for exactly that node; a node that does not exist is an error naming the
//! online ones, from a region, the runtime and the loopback device alike; and a loopback device
//! on node 0 has its own memory, and the pools, mappings and rings a runtime makes for it, on
//! node 0, end to end through a pool. The hugepage test needs root (it tops node 0's pool up and
//! puts it back).

use std::path::Path;
use std::time::Duration;

use userdma::dma::DeviceOffset;
use userdma::memory::hugepages::Guard;
use userdma::memory::numa;
use userdma::memory::{Backing, Error, PageSize, Region, SYSFS_ROOT};
use userdma::{ring, Runtime};
use userdma_loopback::{self as loopback, Cost, Descriptor, LoopbackRuntime};

const TIMEOUT: Option<Duration> = Some(Duration::from_secs(10));
/// `get_mempolicy` flag: the policy of the mapping at `addr` (`<linux/mempolicy.h>`).
const MPOL_F_ADDR: libc::c_ulong = 1 << 1;

/// `get_mempolicy(MPOL_F_ADDR)` at `addr`: the policy mode of the mapping there and its node
/// mask's first word.
fn policy_at(addr: *const u8) -> (i32, libc::c_ulong) {
    let mut mode: libc::c_int = -1;
    let mut mask = [0 as libc::c_ulong; 16];
    let maxnode = libc::c_ulong::try_from(mask.len() * libc::c_ulong::BITS as usize).unwrap();
    // SAFETY: `mode` is a writable int and `mask` holds `maxnode` bits, which is all the
    // kernel writes; with MPOL_F_ADDR `addr` is only looked up among this process's mappings,
    // never dereferenced.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            maxnode,
            addr,
            MPOL_F_ADDR,
        )
    };
    assert_eq!(ret, 0, "get_mempolicy: {}", std::io::Error::last_os_error());
    (mode, mask[0])
}

/// The first node at or above 7 that is not online.
fn missing_node() -> u32 {
    let online = numa::online(Path::new(SYSFS_ROOT)).expect("the online node list");
    assert!(
        online.contains(0),
        "node 0 should be online, sysfs lists {online}"
    );
    (7..).find(|&node| !online.contains(node)).unwrap()
}

/// Every cause of `err`, joined, as a user would see it printed with its chain.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[test]
fn base_page_regions_bound_to_node_0_have_every_page_there() {
    for (what, backing) in [("anonymous", Backing::Anonymous), ("memfd", Backing::Memfd)] {
        let region = Region::builder(1 << 20)
            .page_size(PageSize::Base)
            .backing(backing)
            .lock(false)
            .node(0)
            .build()
            .unwrap_or_else(|err| panic!("{what} region on node 0: {}", chain(&err)));
        assert_eq!(region.node(), Some(0));
        let nodes = region.page_nodes().expect("page nodes");
        assert_eq!(nodes.len(), region.page_count(), "{what}");
        assert!(nodes.iter().all(|&node| node == 0), "{what}: {nodes:?}");
        // The placement is the kernel's policy for the range, not just where pages happened
        // to land: MPOL_BIND, node 0 only, also at the last page.
        let last = region.as_ptr().as_ptr().wrapping_add(region.len() - 1);
        for addr in [region.as_ptr().as_ptr().cast_const(), last.cast_const()] {
            assert_eq!(policy_at(addr), (libc::MPOL_BIND, 1), "{what}");
        }
    }
}

#[test]
fn a_region_without_a_node_keeps_the_default_policy_and_reads_back_its_nodes() {
    let region = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .lock(false)
        .node(None)
        .build()
        .expect("region");
    assert_eq!(region.node(), None);
    assert_eq!(policy_at(region.as_ptr().as_ptr()).0, libc::MPOL_DEFAULT);
    let online = numa::online(Path::new(SYSFS_ROOT)).unwrap();
    let nodes = region.page_nodes().expect("page nodes");
    assert_eq!(nodes.len(), 16);
    assert!(nodes.iter().all(|&node| online.contains(node)), "{nodes:?}");
    // Memory that is not mapped has no node: an error naming the page, not a made-up node.
    let err = numa::page_nodes(std::ptr::null(), 4096, PageSize::Base).unwrap_err();
    assert!(matches!(err, Error::PageNode { offset: 0, .. }), "{err}");
}

#[test]
fn hugepage_region_bound_to_node_0_comes_from_its_pool_hugepages() {
    let root = Path::new(SYSFS_ROOT);
    let guard = Guard::ensure_available(root, 2, PageSize::Huge2M, Some(0)).unwrap_or_else(|err| {
        panic!("this test needs 2 free 2 MiB hugepages on node 0 and root to reserve them: {err}")
    });
    let region = Region::builder(4 << 20)
        .page_size(PageSize::Huge2M)
        .memfd()
        .node(Some(0))
        .build()
        .unwrap_or_else(|err| panic!("hugepage region on node 0: {}", chain(&err)));
    assert_eq!(region.page_nodes().expect("page nodes"), vec![0, 0]);
    assert_eq!(policy_at(region.as_ptr().as_ptr()), (libc::MPOL_BIND, 1));
    drop(region);
    guard.restore().expect("node 0's pool put back");
}

#[test]
fn a_node_that_does_not_exist_is_an_error_naming_the_online_ones() {
    let node = missing_node();
    let online = numa::online(Path::new(SYSFS_ROOT)).unwrap();
    let err = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .lock(false)
        .node(node)
        .build()
        .unwrap_err();
    match &err {
        Error::NoSuchNode {
            node: asked,
            online: listed,
            ..
        } => {
            assert_eq!(*asked, node);
            assert_eq!(listed, &online);
        }
        other => panic!("expected NoSuchNode, got {other}"),
    }
    let text = err.to_string();
    let want = format!("NUMA node {node} does not exist");
    assert!(text.contains(&want), "{text}");
    assert!(
        text.contains(&format!("online nodes as {online};")),
        "{text}"
    );

    // The same error through the runtime and the loopback device.
    let runtime = Runtime::loopback(loopback::Config::default().cost(Cost::zero())).unwrap();
    let err = runtime
        .map_memory_on(4096, PageSize::Base, Some(node))
        .unwrap_err();
    assert!(chain(&err).contains(&want), "{}", chain(&err));
    let err = Runtime::loopback(loopback::Config::default().numa_node(Some(node))).unwrap_err();
    assert!(chain(&err).contains(&want), "{}", chain(&err));
}

#[test]
fn loopback_on_node_0_places_its_memory_there_end_to_end_through_a_pool() {
    let config = loopback::Config::default()
        .cost(Cost::zero())
        .memory_size(1 << 20)
        .numa_node(Some(0));
    assert_eq!(config.memory_node(), Some(0));
    let runtime = Runtime::loopback(config).unwrap_or_else(|err| panic!("{}", chain(&err)));
    assert_eq!(runtime.numa_node(), Some(0));
    assert_eq!(runtime.device().numa_node(), Some(0));

    // The device's own memory (host RAM standing in for an NPU's DRAM).
    let device = runtime.loopback_device().expect("the loopback device");
    let dram = device.device_memory();
    let nodes = numa::page_nodes(dram.as_ptr().as_ptr(), dram.len(), PageSize::Base).unwrap();
    assert_eq!(nodes.len(), (1 << 20) / PageSize::Base.bytes());
    assert!(nodes.iter().all(|&node| node == 0), "{nodes:?}");
    assert_eq!(policy_at(dram.as_ptr().as_ptr()), (libc::MPOL_BIND, 1));

    // A pool the runtime makes for it, and a transfer there and back through it.
    let pool = runtime.pool(4 << 20, PageSize::Base).expect("pool");
    let region = pool.mapping().region();
    assert_eq!(region.node(), Some(0));
    assert!(region.page_nodes().unwrap().iter().all(|&node| node == 0));
    assert_eq!(policy_at(region.as_ptr().as_ptr()), (libc::MPOL_BIND, 1));
    let mut queue = runtime.queue(ring::Config::new(64)).expect("queue");
    let source = pool.alloc_owned(4096).expect("source");
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    source.write(0, &payload).expect("write");
    let destination = pool.alloc_owned(4096).expect("destination");
    let (src, dst) = (source.iova(), destination.iova());
    queue
        .submit(
            Descriptor::to_device(src, DeviceOffset(0x1000), 4096).build(),
            source,
        )
        .expect("to device");
    let there = queue.wait(TIMEOUT).expect("to device done");
    assert!(there.entry.is_success());
    queue
        .submit(
            Descriptor::to_host(DeviceOffset(0x1000), dst, 4096).build(),
            destination,
        )
        .expect("to host");
    let back = queue.wait(TIMEOUT).expect("to host done");
    assert!(back.entry.is_success());
    let mut got = vec![0u8; 4096];
    back.payload.read(0, &mut got).expect("read");
    assert_eq!(got, payload);

    // Explicit placement overrides the device's, and `None` is no placement.
    let unplaced = runtime
        .map_memory_on(4096, PageSize::Base, None)
        .expect("memory on no node");
    assert_eq!(unplaced.region().node(), None);
    assert_eq!(
        policy_at(unplaced.region().as_ptr().as_ptr()).0,
        libc::MPOL_DEFAULT
    );
}

#[test]
fn loopback_without_a_node_places_nothing() {
    let runtime = Runtime::loopback(loopback::Config::default().cost(Cost::zero())).unwrap();
    assert_eq!(runtime.numa_node(), None);
    let mapping = runtime.map_memory(4096, PageSize::Base).expect("memory");
    assert_eq!(mapping.region().node(), None);
    assert_eq!(
        policy_at(mapping.region().as_ptr().as_ptr()).0,
        libc::MPOL_DEFAULT
    );
    let placed = runtime
        .map_memory_on(4096, PageSize::Base, Some(0))
        .expect("memory on node 0");
    assert_eq!(placed.region().node(), Some(0));
    assert_eq!(placed.region().page_nodes().unwrap(), vec![0]);
}
