//! The machine's NUMA nodes as sysfs lists them, and which node a device's memory goes on.
//!
//! A [`Region`](super::Region) is placed on a node with
//! [`Builder::node`](super::Builder::node) (`mbind(MPOL_BIND)` before its pages are faulted in)
//! and where its pages are is read back with [`Region::page_nodes`](super::Region::page_nodes).
//! The lists here say which nodes can be asked for: `devices/system/node/online` (the nodes
//! that exist) and `devices/system/node/has_memory` (those with memory to give), each in the
//! kernel's list format (`0`, `0-1`, `0,2-3`).
//!
//! Every function takes the sysfs root (`/sys` on a running system, [`SYSFS_ROOT`]) so tests
//! run against fake trees.
//!
//! [`SYSFS_ROOT`]: super::SYSFS_ROOT

use std::fmt;
use std::fs;
use std::io;
use std::path::Path;

use super::shim;
use super::{Error, PageSize};

/// `devices/system/node/online`, relative to the sysfs root.
pub const ONLINE: &str = "devices/system/node/online";
/// `devices/system/node/has_memory`, relative to the sysfs root.
pub const HAS_MEMORY: &str = "devices/system/node/has_memory";

/// A set of NUMA nodes, ascending, shown the way the kernel writes it (`0-1,3`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeList(pub Vec<u32>);

impl NodeList {
    /// Whether `node` is in the list.
    pub fn contains(&self, node: u32) -> bool {
        self.0.binary_search(&node).is_ok()
    }

    /// The nodes, ascending.
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }
}

impl fmt::Display for NodeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        let mut index = 0;
        while let Some(&start) = self.0.get(index) {
            let mut end = start;
            while self.0.get(index + 1) == end.checked_add(1).as_ref() {
                end += 1;
                index += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            index += 1;
        }
        Ok(())
    }
}

/// Parses the kernel's node-list format (`0`, `0-3`, `0,2-3`, an empty line for none):
/// ascending and without duplicates, or `None` for text that is not such a list.
pub fn parse_list(text: &str) -> Option<NodeList> {
    let text = text.trim();
    let mut nodes = Vec::new();
    if text.is_empty() {
        return Some(NodeList(nodes));
    }
    for part in text.split(',') {
        let (start, end) = match part.split_once('-') {
            Some((start, end)) => (start.parse::<u32>().ok()?, end.parse::<u32>().ok()?),
            None => {
                let node = part.parse::<u32>().ok()?;
                (node, node)
            }
        };
        if start > end || nodes.last().is_some_and(|&last| last >= start) {
            return None;
        }
        nodes.extend(start..=end);
    }
    Some(NodeList(nodes))
}

/// Reads one node list under the sysfs root; `None` when the file does not exist (a kernel
/// without NUMA support lists no nodes).
fn read_list(sysfs_root: &Path, file: &str) -> Result<Option<NodeList>, Error> {
    let path = sysfs_root.join(file);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::SysfsRead { path, source }),
    };
    match parse_list(&text) {
        Some(list) => Ok(Some(list)),
        None => Err(Error::SysfsParse {
            path,
            content: text.trim().to_owned(),
        }),
    }
}

/// The NUMA nodes that exist (`devices/system/node/online`); empty on a kernel without NUMA.
///
/// # Errors
/// [`Error::SysfsRead`] / [`Error::SysfsParse`] if the file exists but cannot be read or parsed.
pub fn online(sysfs_root: &Path) -> Result<NodeList, Error> {
    Ok(read_list(sysfs_root, ONLINE)?.unwrap_or_default())
}

/// The NUMA nodes that have memory (`devices/system/node/has_memory`); empty on a kernel
/// without NUMA.
///
/// # Errors
/// As [`online`].
pub fn with_memory(sysfs_root: &Path) -> Result<NodeList, Error> {
    Ok(read_list(sysfs_root, HAS_MEMORY)?.unwrap_or_default())
}

/// `Ok` if `node` is online; otherwise [`Error::NoSuchNode`] naming the nodes that are.
///
/// # Errors
/// [`Error::NoSuchNode`]; [`Error::SysfsRead`] / [`Error::SysfsParse`] as [`online`].
pub fn check(sysfs_root: &Path, node: u32) -> Result<(), Error> {
    let online = online(sysfs_root)?;
    if online.contains(node) {
        Ok(())
    } else {
        Err(Error::NoSuchNode {
            node,
            online,
            path: sysfs_root.join(ONLINE),
        })
    }
}

/// The NUMA node of each `page_size` page of `[addr, addr + len)` (its first byte's), in
/// order, as the kernel reports it: `move_pages(2)` for this process with no target nodes, a
/// query that moves nothing. For any memory of this process, a [`Region`](super::Region)'s
/// ([`Region::page_nodes`](super::Region::page_nodes)) or a device's memory mapped from a
/// file; the range is never dereferenced, so any address is safe to ask about.
///
/// # Errors
/// [`Error::NodeQuery`] if the query fails (a kernel without NUMA answers `ENOSYS`);
/// [`Error::PageNode`] for a page the kernel gives no node for (not mapped: `EFAULT`; not
/// faulted in yet: `ENOENT`).
pub fn page_nodes(addr: *const u8, len: usize, page_size: PageSize) -> Result<Vec<u32>, Error> {
    let page = page_size.bytes();
    raw_page_nodes(addr, len, page_size)?
        .into_iter()
        .enumerate()
        .map(|(index, status)| {
            u32::try_from(status).map_err(|_| Error::PageNode {
                offset: index * page,
                source: io::Error::from_raw_os_error(status.saturating_neg()),
            })
        })
        .collect()
}

/// `move_pages`' answer for each page of `[addr, addr + len)`: a node, or a negative errno.
pub(super) fn raw_page_nodes(
    addr: *const u8,
    len: usize,
    page_size: PageSize,
) -> Result<Vec<i32>, Error> {
    let pages: Vec<*mut libc::c_void> = (0..len.div_ceil(page_size.bytes()))
        .map(|index| {
            addr.wrapping_add(index * page_size.bytes())
                .cast_mut()
                .cast()
        })
        .collect();
    shim::page_nodes(&pages).map_err(|source| Error::NodeQuery { source })
}

/// The node a device's host memory goes on: the device's own `node` when that node has memory,
/// `None` otherwise (no node, a memoryless node, or the lists cannot be read), so that placing
/// memory near a device never makes allocating it fail where it worked without placement.
// Its callers are the device openers, which a `--cfg loom` build leaves out.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn placement(sysfs_root: &Path, node: Option<u32>) -> Option<u32> {
    let node = node?;
    with_memory(sysfs_root)
        .ok()
        .filter(|nodes| nodes.contains(node))
        .map(|_| node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_list("0\n"), Some(NodeList(vec![0])));
        assert_eq!(parse_list("0-1\n"), Some(NodeList(vec![0, 1])));
        assert_eq!(parse_list("0,2-3,7"), Some(NodeList(vec![0, 2, 3, 7])));
        assert_eq!(parse_list("\n"), Some(NodeList(vec![])));
        for bad in ["x", "1-0", "0,0", "2,1", "0-", "-1", "0,,1"] {
            assert_eq!(parse_list(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn lists_print_as_ranges() {
        for text in ["0", "0-1", "0,2-3,7", "none"] {
            let list = parse_list(text).unwrap_or_default();
            assert_eq!(list.to_string(), text);
        }
        assert_eq!(NodeList(vec![0, 1, 2, 5, 6]).to_string(), "0-2,5-6");
    }

    #[test]
    fn a_missing_node_is_an_error_naming_the_online_ones() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("devices/system/node");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("online"), "0-1\n").unwrap();
        fs::write(dir.join("has_memory"), "1\n").unwrap();
        assert!(check(root.path(), 1).is_ok());
        let err = check(root.path(), 7).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("node 7") && text.contains("0-1"), "{text}");
        // Only nodes with memory are where a device's memory goes.
        assert_eq!(placement(root.path(), Some(1)), Some(1));
        assert_eq!(placement(root.path(), Some(0)), None);
        assert_eq!(placement(root.path(), None), None);
    }

    #[test]
    fn a_kernel_without_numa_lists_no_node() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(online(root.path()).unwrap(), NodeList::default());
        let text = check(root.path(), 0).unwrap_err().to_string();
        assert!(text.contains("none"), "{text}");
        assert_eq!(placement(root.path(), Some(0)), None);
    }
}
