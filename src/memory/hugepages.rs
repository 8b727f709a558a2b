//! The kernel's hugepage pools: how many pages of each size are reserved, free, promised and
//! surplus, system-wide and per NUMA node; resizing a pool; and a guard that tops a pool up for
//! the length of a test or job and puts it back.
//!
//! Every function takes the sysfs root (`/sys` on a running system, [`SYSFS_ROOT`]) so tests run
//! against fake trees. The files read are
//! `kernel/mm/hugepages/hugepages-<kB>kB/{nr,free,resv,surplus}_hugepages` and
//! `devices/system/node/node<N>/hugepages/hugepages-<kB>kB/{nr,free,surplus}_hugepages`.
//!
//! [`SYSFS_ROOT`]: super::SYSFS_ROOT

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use userdma_sys::mman::{
    FREE_HUGEPAGES, NODE_HUGEPAGES_DIR, NR_HUGEPAGES, RESV_HUGEPAGES, SURPLUS_HUGEPAGES,
};

use super::{Error, PageSize};

/// One hugepage pool's counts: a page size, system-wide or on one NUMA node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Counts {
    /// The page size.
    pub page_size: PageSize,
    /// The NUMA node, or `None` for the system-wide pool.
    pub node: Option<u32>,
    /// Pages in the pool (`nr_hugepages`).
    pub total: u64,
    /// Pages not in use (`free_hugepages`); some of them may be promised to mappings.
    pub free: u64,
    /// Free pages promised to existing mappings but not faulted in yet (`resv_hugepages`);
    /// the kernel reports it system-wide only.
    pub reserved: Option<u64>,
    /// Pages allocated beyond `nr_hugepages` by overcommit (`surplus_hugepages`).
    pub surplus: u64,
}

impl Counts {
    /// Free pages a new mapping can actually get: free minus those promised to others.
    pub fn available(&self) -> u64 {
        self.free.saturating_sub(self.reserved.unwrap_or(0))
    }
}

/// Every hugepage pool the kernel has: each supported size system-wide, then per node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Status {
    /// System-wide pools first (smallest size first), then each node's, by node and size.
    pub pools: Vec<Counts>,
}

impl Status {
    /// The pool of `page_size` on `node` (`None`: system-wide).
    pub fn pool(&self, page_size: PageSize, node: Option<u32>) -> Option<&Counts> {
        self.pools
            .iter()
            .find(|pool| pool.page_size == page_size && pool.node == node)
    }

    /// The NUMA nodes that have hugepage pools, ascending.
    pub fn nodes(&self) -> Vec<u32> {
        let mut nodes: Vec<u32> = self.pools.iter().filter_map(|pool| pool.node).collect();
        nodes.dedup();
        nodes
    }
}

/// The directory of the pool of `page_size` (system-wide for `node == None`).
pub fn pool_dir(sysfs_root: &Path, page_size: PageSize, node: Option<u32>) -> PathBuf {
    let dir = page_size.sysfs_dir().unwrap_or_default();
    match node {
        None => sysfs_root.join("kernel/mm/hugepages").join(dir),
        Some(node) => node_dir(sysfs_root, node)
            .join(NODE_HUGEPAGES_DIR)
            .join(dir),
    }
}

/// `devices/system/node/node<N>` under the sysfs root.
fn node_dir(sysfs_root: &Path, node: u32) -> PathBuf {
    sysfs_root
        .join("devices/system/node")
        .join(format!("node{node}"))
}

/// Reads a count from a sysfs file.
fn read_count(path: &Path) -> Result<u64, Error> {
    let text = fs::read_to_string(path).map_err(|source| Error::SysfsRead {
        path: path.to_owned(),
        source,
    })?;
    text.trim().parse().map_err(|_| Error::SysfsParse {
        path: path.to_owned(),
        content: text.trim().to_owned(),
    })
}

/// Reads one pool.
pub fn read_pool(
    sysfs_root: &Path,
    page_size: PageSize,
    node: Option<u32>,
) -> Result<Counts, Error> {
    let dir = pool_dir(sysfs_root, page_size, node);
    if !page_size.is_huge() || !dir.is_dir() {
        return Err(Error::NoSuchPool {
            page_size,
            node,
            path: dir,
        });
    }
    Ok(Counts {
        page_size,
        node,
        total: read_count(&dir.join(NR_HUGEPAGES))?,
        free: read_count(&dir.join(FREE_HUGEPAGES))?,
        reserved: match node {
            None => Some(read_count(&dir.join(RESV_HUGEPAGES))?),
            Some(_) => None,
        },
        surplus: read_count(&dir.join(SURPLUS_HUGEPAGES))?,
    })
}

/// The NUMA nodes listed under `devices/system/node` (none on a kernel without NUMA).
fn list_nodes(sysfs_root: &Path) -> Result<Vec<u32>, Error> {
    let dir = sysfs_root.join("devices/system/node");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::SysfsRead { path: dir, source }),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::SysfsRead {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|name| name.strip_prefix("node"))
            .and_then(|digits| digits.parse::<u32>().ok());
        if let Some(node) = number {
            nodes.push(node);
        }
    }
    nodes.sort_unstable();
    Ok(nodes)
}

/// Reads every pool: each hugepage size the kernel offers, system-wide and per node.
pub fn status(sysfs_root: &Path) -> Result<Status, Error> {
    let sizes: Vec<PageSize> = PageSize::HUGE
        .into_iter()
        .filter(|&size| pool_dir(sysfs_root, size, None).is_dir())
        .collect();
    let mut pools = Vec::new();
    for &size in &sizes {
        pools.push(read_pool(sysfs_root, size, None)?);
    }
    for node in list_nodes(sysfs_root)? {
        for &size in &sizes {
            if pool_dir(sysfs_root, size, Some(node)).is_dir() {
                pools.push(read_pool(sysfs_root, size, Some(node))?);
            }
        }
    }
    Ok(Status { pools })
}

/// What a resize of a pool achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Reservation {
    /// The page size.
    pub page_size: PageSize,
    /// The node, or `None` for the system-wide pool.
    pub node: Option<u32>,
    /// `nr_hugepages` before.
    pub previous: u64,
    /// `nr_hugepages` asked for.
    pub requested: u64,
    /// `nr_hugepages` after: what the kernel granted (it can grant fewer when memory is
    /// fragmented, and shrinks only by free pages).
    pub granted: u64,
}

impl Reservation {
    /// Whether the kernel granted exactly what was asked.
    pub fn is_complete(&self) -> bool {
        self.granted == self.requested
    }

    /// [`Error::ReserveShort`] unless the kernel granted at least what was asked.
    pub fn require_complete(&self) -> Result<(), Error> {
        if self.granted >= self.requested {
            Ok(())
        } else {
            Err(Error::ReserveShort {
                page_size: self.page_size,
                node: self.node,
                requested: self.requested,
                granted: self.granted,
            })
        }
    }
}

/// Sets the pool of `page_size` (on `node`, or system-wide) to `count` pages by writing
/// `nr_hugepages` (needs root), and reads back what the kernel granted.
pub fn reserve(
    sysfs_root: &Path,
    count: u64,
    page_size: PageSize,
    node: Option<u32>,
) -> Result<Reservation, Error> {
    let dir = pool_dir(sysfs_root, page_size, node);
    if !page_size.is_huge() || !dir.is_dir() {
        return Err(Error::NoSuchPool {
            page_size,
            node,
            path: dir,
        });
    }
    let path = dir.join(NR_HUGEPAGES);
    let previous = read_count(&path)?;
    fs::write(&path, count.to_string()).map_err(|source| Error::SysfsWrite {
        path: path.clone(),
        count,
        source,
    })?;
    let granted = read_count(&path)?;
    Ok(Reservation {
        page_size,
        node,
        previous,
        requested: count,
        granted,
    })
}

/// Keeps at least a number of pages of one pool free, growing the pool if needed, and puts the
/// pool back to its previous size on drop (or on [`Guard::restore`], which reports errors).
///
/// Meant for tests and short jobs on machines whose pools are not set up at boot. Drop the
/// regions using the pages before the guard, so the kernel can shrink the pool again.
#[derive(Debug)]
#[must_use = "dropping the guard shrinks the pool again"]
pub struct Guard {
    sysfs_root: PathBuf,
    page_size: PageSize,
    node: Option<u32>,
    /// `nr_hugepages` to write back, if the guard grew the pool.
    restore_to: Option<u64>,
}

impl Guard {
    /// Makes sure `needed` pages of `page_size` are available (free and not promised) in the
    /// pool (on `node`, or system-wide), growing it by what is missing (needs root).
    pub fn ensure_available(
        sysfs_root: &Path,
        needed: u64,
        page_size: PageSize,
        node: Option<u32>,
    ) -> Result<Guard, Error> {
        let pool = read_pool(sysfs_root, page_size, node)?;
        let mut guard = Guard {
            sysfs_root: sysfs_root.to_owned(),
            page_size,
            node,
            restore_to: None,
        };
        let available = pool.available();
        if available >= needed {
            return Ok(guard);
        }
        let target = pool.total.saturating_add(needed - available);
        let reservation = reserve(sysfs_root, target, page_size, node)?;
        guard.restore_to = Some(reservation.previous);
        // From here on, dropping the guard on an error path shrinks the pool again.
        reservation.require_complete()?;
        Ok(guard)
    }

    /// The page size of the guarded pool.
    pub fn page_size(&self) -> PageSize {
        self.page_size
    }

    /// Whether the guard grew the pool (and so will shrink it back).
    pub fn grew(&self) -> bool {
        self.restore_to.is_some()
    }

    /// Puts the pool back to its previous size now, reporting a failure.
    pub fn restore(mut self) -> Result<(), Error> {
        self.restore_inner()
    }

    fn restore_inner(&mut self) -> Result<(), Error> {
        match self.restore_to.take() {
            Some(previous) => {
                reserve(&self.sysfs_root, previous, self.page_size, self.node).map(drop)
            }
            None => Ok(()),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Best effort: a Drop cannot return the error; callers who need it call `restore`.
        // A failed shrink leaves the pool larger than before, which wastes memory but breaks
        // nothing.
        let _ = self.restore_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a fake pool directory.
    fn fake_pool(root: &Path, size: PageSize, node: Option<u32>, counts: [u64; 4]) {
        let dir = pool_dir(root, size, node);
        fs::create_dir_all(&dir).unwrap();
        let names = [
            "nr_hugepages",
            "free_hugepages",
            "resv_hugepages",
            "surplus_hugepages",
        ];
        for (name, count) in names.iter().zip(counts) {
            if node.is_some() && *name == "resv_hugepages" {
                continue;
            }
            fs::write(dir.join(name), format!("{count}\n")).unwrap();
        }
    }

    #[test]
    fn status_reads_system_and_node_pools() {
        let root = tempfile::tempdir().unwrap();
        fake_pool(root.path(), PageSize::Huge2M, None, [8, 6, 2, 1]);
        fake_pool(root.path(), PageSize::Huge1G, None, [1, 1, 0, 0]);
        fake_pool(root.path(), PageSize::Huge2M, Some(0), [5, 4, 0, 1]);
        fake_pool(root.path(), PageSize::Huge2M, Some(1), [3, 2, 0, 0]);
        fake_pool(root.path(), PageSize::Huge1G, Some(1), [1, 1, 0, 0]);
        fs::create_dir_all(root.path().join("devices/system/node/possible_not_a_node")).unwrap();
        let status = status(root.path()).unwrap();
        assert_eq!(status.pools.len(), 5);
        let global = status.pool(PageSize::Huge2M, None).unwrap();
        assert_eq!(
            (global.total, global.free, global.reserved, global.surplus),
            (8, 6, Some(2), 1)
        );
        assert_eq!(global.available(), 4);
        let node1 = status.pool(PageSize::Huge2M, Some(1)).unwrap();
        assert_eq!((node1.total, node1.free, node1.reserved), (3, 2, None));
        assert_eq!(status.nodes(), vec![0, 1]);
        assert!(status.pool(PageSize::Huge1G, Some(0)).is_none());
    }

    #[test]
    fn status_without_hugetlb_is_empty() {
        let root = tempfile::tempdir().unwrap();
        assert!(status(root.path()).unwrap().pools.is_empty());
    }

    #[test]
    fn garbage_count_is_a_parse_error_naming_the_file() {
        let root = tempfile::tempdir().unwrap();
        fake_pool(root.path(), PageSize::Huge2M, None, [1, 1, 0, 0]);
        let file = pool_dir(root.path(), PageSize::Huge2M, None).join("free_hugepages");
        fs::write(&file, "lots\n").unwrap();
        let err = status(root.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("free_hugepages") && text.contains("lots"),
            "{text}"
        );
    }

    #[test]
    fn missing_count_file_is_a_read_error() {
        let root = tempfile::tempdir().unwrap();
        fake_pool(root.path(), PageSize::Huge2M, None, [1, 1, 0, 0]);
        fs::remove_file(pool_dir(root.path(), PageSize::Huge2M, None).join("surplus_hugepages"))
            .unwrap();
        assert!(matches!(status(root.path()), Err(Error::SysfsRead { .. })));
    }

    #[test]
    fn reserve_writes_and_reads_back() {
        let root = tempfile::tempdir().unwrap();
        fake_pool(root.path(), PageSize::Huge1G, Some(0), [0, 0, 0, 0]);
        let reservation = reserve(root.path(), 3, PageSize::Huge1G, Some(0)).unwrap();
        assert_eq!(
            (
                reservation.previous,
                reservation.requested,
                reservation.granted
            ),
            (0, 3, 3)
        );
        assert!(reservation.is_complete());
        let file = pool_dir(root.path(), PageSize::Huge1G, Some(0)).join("nr_hugepages");
        assert_eq!(fs::read_to_string(file).unwrap(), "3");
    }

    #[test]
    fn reserve_on_missing_pool_names_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let err = reserve(root.path(), 1, PageSize::Huge1G, Some(4)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("node4/hugepages/hugepages-1048576kB"),
            "{text}"
        );
        assert!(matches!(
            reserve(root.path(), 1, PageSize::Base, None),
            Err(Error::NoSuchPool { .. })
        ));
    }

    #[test]
    fn short_grant_is_an_error_with_a_boot_time_hint() {
        let reservation = Reservation {
            page_size: PageSize::Huge1G,
            node: None,
            previous: 0,
            requested: 4,
            granted: 2,
        };
        assert!(!reservation.is_complete());
        let text = reservation.require_complete().unwrap_err().to_string();
        assert!(
            text.contains("granted 2") && text.contains("hugepagesz=1G hugepages=4"),
            "{text}"
        );
    }

    #[test]
    fn guard_grows_by_what_is_missing_and_restores() {
        let root = tempfile::tempdir().unwrap();
        // 4 pages, 3 free, 1 of them promised: 2 available.
        fake_pool(root.path(), PageSize::Huge2M, None, [4, 3, 1, 0]);
        let file = pool_dir(root.path(), PageSize::Huge2M, None).join("nr_hugepages");
        let guard = Guard::ensure_available(root.path(), 5, PageSize::Huge2M, None).unwrap();
        assert!(guard.grew());
        assert_eq!(fs::read_to_string(&file).unwrap(), "7");
        drop(guard);
        assert_eq!(fs::read_to_string(&file).unwrap(), "4");

        let guard = Guard::ensure_available(root.path(), 2, PageSize::Huge2M, None).unwrap();
        assert!(!guard.grew());
        guard.restore().unwrap();
        assert_eq!(fs::read_to_string(&file).unwrap().trim(), "4");
    }
}
