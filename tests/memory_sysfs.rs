//! Hugepage pool status and resizing against fake sysfs trees: parsing, per-node pools, and
//! every error.

use std::fs;
use std::path::Path;

use userdma::memory::hugepages::{self, Guard};
use userdma::memory::{Error, PageSize};

/// Writes one pool's files: `[nr, free, resv, surplus]` (`resv` only exists system-wide).
fn pool(root: &Path, size: PageSize, node: Option<u32>, counts: [u64; 4]) {
    let dir = hugepages::pool_dir(root, size, node);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("nr_hugepages"), format!("{}\n", counts[0])).unwrap();
    fs::write(dir.join("free_hugepages"), format!("{}\n", counts[1])).unwrap();
    if node.is_none() {
        fs::write(dir.join("resv_hugepages"), format!("{}\n", counts[2])).unwrap();
    }
    fs::write(dir.join("surplus_hugepages"), format!("{}\n", counts[3])).unwrap();
}

/// A two-node machine with both page sizes.
fn two_node_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    pool(root, PageSize::Huge2M, None, [12, 9, 3, 0]);
    pool(root, PageSize::Huge1G, None, [2, 1, 0, 1]);
    pool(root, PageSize::Huge2M, Some(0), [8, 6, 0, 0]);
    pool(root, PageSize::Huge2M, Some(1), [4, 3, 0, 0]);
    pool(root, PageSize::Huge1G, Some(0), [0, 0, 0, 0]);
    pool(root, PageSize::Huge1G, Some(1), [2, 1, 0, 1]);
    // Files that are not nodes are ignored.
    fs::write(root.join("devices/system/node/online"), "0-1\n").unwrap();
    dir
}

#[test]
fn status_lists_sizes_system_wide_then_per_node() {
    let tree = two_node_tree();
    let status = hugepages::status(tree.path()).unwrap();
    let order: Vec<(PageSize, Option<u32>)> = status
        .pools
        .iter()
        .map(|pool| (pool.page_size, pool.node))
        .collect();
    assert_eq!(
        order,
        vec![
            (PageSize::Huge2M, None),
            (PageSize::Huge1G, None),
            (PageSize::Huge2M, Some(0)),
            (PageSize::Huge1G, Some(0)),
            (PageSize::Huge2M, Some(1)),
            (PageSize::Huge1G, Some(1)),
        ]
    );
    let global = status.pool(PageSize::Huge2M, None).unwrap();
    assert_eq!(
        (global.total, global.free, global.reserved),
        (12, 9, Some(3))
    );
    assert_eq!(global.available(), 6);
    let node1 = status.pool(PageSize::Huge1G, Some(1)).unwrap();
    assert_eq!((node1.total, node1.free, node1.surplus), (2, 1, 1));
    assert_eq!(node1.reserved, None);
    assert_eq!(status.nodes(), vec![0, 1]);
}

#[test]
#[cfg(feature = "serde")]
fn status_serialises_for_the_cli() {
    let tree = two_node_tree();
    let status = hugepages::status(tree.path()).unwrap();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["pools"][0]["page_size"], "2M");
    assert_eq!(json["pools"][0]["node"], serde_json::Value::Null);
    assert_eq!(json["pools"][0]["reserved"], 3);
    assert_eq!(json["pools"][5]["node"], 1);
}

#[test]
fn reserve_writes_the_pool_file_and_reports_the_grant() {
    let tree = two_node_tree();
    let reservation = hugepages::reserve(tree.path(), 10, PageSize::Huge1G, Some(0)).unwrap();
    assert_eq!(reservation.previous, 0);
    assert_eq!(reservation.granted, 10);
    assert!(reservation.is_complete());
    let file = hugepages::pool_dir(tree.path(), PageSize::Huge1G, Some(0)).join("nr_hugepages");
    assert_eq!(fs::read_to_string(file).unwrap(), "10");
    // The system-wide file is untouched.
    let global = hugepages::read_pool(tree.path(), PageSize::Huge1G, None).unwrap();
    assert_eq!(global.total, 2);
}

#[test]
fn unreadable_or_unwritable_pool_file_names_the_path_and_root() {
    let tree = two_node_tree();
    let file = hugepages::pool_dir(tree.path(), PageSize::Huge2M, None).join("nr_hugepages");
    // A directory where the file should be: reading the previous count fails.
    fs::remove_file(&file).unwrap();
    fs::create_dir(&file).unwrap();
    let err = hugepages::reserve(tree.path(), 4, PageSize::Huge2M, None).unwrap_err();
    assert!(matches!(err, Error::SysfsRead { .. }), "{err:?}");
    fs::remove_dir(&file).unwrap();
    // A file that reads as a count but refuses writes even from root (a 0444 sysctl).
    std::os::unix::fs::symlink("/proc/sys/kernel/ngroups_max", &file).unwrap();
    let err = hugepages::reserve(tree.path(), 4, PageSize::Huge2M, None).unwrap_err();
    match &err {
        Error::SysfsWrite { path, count, .. } => {
            assert_eq!((path, *count), (&file, 4));
        }
        other => panic!("expected a write error, got {other:?}"),
    }
    assert!(err.to_string().contains("needs root"), "{err}");
}

#[test]
fn missing_pool_is_named() {
    let tree = two_node_tree();
    let err = hugepages::reserve(tree.path(), 1, PageSize::Huge2M, Some(7)).unwrap_err();
    assert!(
        matches!(err, Error::NoSuchPool { node: Some(7), .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("node7/hugepages/hugepages-2048kB"), "{text}");
    assert!(text.contains("NUMA node 7"), "{text}");
}

#[test]
fn garbage_in_a_count_file_is_reported_with_its_content() {
    let tree = two_node_tree();
    let file = hugepages::pool_dir(tree.path(), PageSize::Huge1G, Some(1)).join("free_hugepages");
    fs::write(&file, "-1\n").unwrap();
    let err = hugepages::status(tree.path()).unwrap_err();
    match &err {
        Error::SysfsParse { path, content } => {
            assert_eq!(path, &file);
            assert_eq!(content, "-1");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn guard_restores_the_pool_even_when_the_holder_panics() {
    let tree = two_node_tree();
    let root = tree.path().to_owned();
    let file = hugepages::pool_dir(&root, PageSize::Huge2M, Some(1)).join("nr_hugepages");
    let result = std::panic::catch_unwind(|| {
        // Node 1 has 3 free; 5 needed: grow by 2.
        let _guard = Guard::ensure_available(&root, 5, PageSize::Huge2M, Some(1)).unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap(), "6");
        panic!("the test using the pages fails");
    });
    assert!(result.is_err());
    assert_eq!(fs::read_to_string(&file).unwrap(), "4");
}
