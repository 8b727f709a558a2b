//! Regions on real hugepages (needs root: each test tops the kernel's pool up for what it needs
//! and a guard puts the pool back afterwards, also when the test fails). Tests in this file run
//! one at a time, since they resize the same pools.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use userdma::dma::{Slice, SoftIommu, Space};
use userdma::memory::hugepages;
use userdma::memory::{Backing, Error, PageSize, Region, SYSFS_ROOT};

/// Set in a child process started by a test: names the role it plays.
const CHILD_ROLE: &str = "USERDMA_TEST_CHILD_ROLE";
/// The fd number the child inherits.
const CHILD_FD: &str = "USERDMA_TEST_CHILD_FD";

mod reserve;

use reserve::{reserve, serial};

/// Checks the physical layout of a hugepage region: one address per page, each aligned to the
/// page size (a hugepage is a naturally aligned physical block), all distinct.
fn check_physical(region: &Region) {
    let pages = region.physical_pages().unwrap_or_else(|err| {
        panic!("reading physical addresses needs root (CAP_SYS_ADMIN): {err}")
    });
    let size = region.page_size().bytes() as u64;
    assert_eq!(pages.len(), region.page_count());
    assert_eq!(pages.page_size(), region.page_size());
    let mut seen = pages.as_slice().to_vec();
    for &addr in &seen {
        assert_ne!(addr, 0);
        assert_eq!(addr % size, 0, "page at {addr:#x} not aligned to {size:#x}");
    }
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        pages.len(),
        "two pages share a physical address"
    );
    assert_eq!(pages.addr_of(17), Some(pages.as_slice()[0] + 17));
}

#[test]
fn anonymous_2m_region_is_populated_locked_and_contiguous_hugepages() {
    let _serial = serial();
    let _pool = reserve(4, PageSize::Huge2M);
    let region = Region::builder(8 << 20).build().unwrap();
    assert_eq!(region.len(), 8 << 20);
    assert_eq!(region.page_size(), PageSize::Huge2M);
    assert_eq!(region.page_count(), 4);
    assert!(region.is_locked());
    assert!(region.fd().is_none());
    assert_eq!(region.as_ptr().as_ptr() as usize % (2 << 20), 0);
    // The pool shows the pages in use.
    let pool = hugepages::read_pool(Path::new(SYSFS_ROOT), PageSize::Huge2M, None).unwrap();
    assert!(pool.total - pool.free >= 4, "{pool:?}");

    let slice = Slice::from_region(&region);
    slice
        .write((8 << 20) - 8, 0x0123_4567_89ab_cdefu64)
        .unwrap();
    assert_eq!(
        slice.read::<u64>((8 << 20) - 8).unwrap(),
        0x0123_4567_89ab_cdef
    );
    check_physical(&region);
}

#[test]
fn one_gib_region_is_one_contiguous_page_hugepages() {
    let _serial = serial();
    let _pool = reserve(1, PageSize::Huge1G);
    let region = Region::builder(1 << 30)
        .page_size(PageSize::Huge1G)
        .build()
        .unwrap();
    assert_eq!(region.page_count(), 1);
    let slice = Slice::from_region(&region);
    slice.write(0, 1u32).unwrap();
    slice.write((1 << 30) - 4, 2u32).unwrap();
    assert_eq!(slice.read::<u32>((1 << 30) - 4).unwrap(), 2);
    // All 262144 base pages of the 1 GiB page must have consecutive frame numbers.
    check_physical(&region);
}

#[test]
fn memfd_region_mapped_twice_sees_its_own_writes_hugepages() {
    let _serial = serial();
    let _pool = reserve(2, PageSize::Huge2M);
    let first = Region::builder(4 << 20).memfd().build().unwrap();
    let fd = first
        .fd()
        .expect("memfd regions have an fd")
        .try_clone_to_owned()
        .unwrap();
    let second = Region::from_fd(fd, 4 << 20, PageSize::Huge2M).unwrap();
    assert_ne!(first.as_ptr(), second.as_ptr());
    let (a, b) = (Slice::from_region(&first), Slice::from_region(&second));
    a.write(0x1234 * 8, 0xfeed_f00du64).unwrap();
    assert_eq!(b.read::<u64>(0x1234 * 8).unwrap(), 0xfeed_f00d);
    b.write_from((4 << 20) - 5, b"tail!").unwrap();
    let mut back = [0u8; 5];
    a.read_into((4 << 20) - 5, &mut back).unwrap();
    assert_eq!(&back, b"tail!");
    // Same physical pages behind both mappings.
    assert_eq!(
        first.physical_pages().unwrap(),
        second.physical_pages().unwrap()
    );
}

/// The child half of `memfd_region_is_shared_with_a_child_process_hugepages`.
fn memfd_child() {
    let raw: i32 = std::env::var(CHILD_FD).unwrap().parse().unwrap();
    // SAFETY: the parent dup'ed this descriptor for us without CLOEXEC and named it in the
    // environment; nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let region = Region::from_fd(fd, 4 << 20, PageSize::Huge2M).unwrap();
    let slice = Slice::from_region(&region);
    let mut hello = [0u8; 11];
    slice.read_into(0, &mut hello).unwrap();
    assert_eq!(&hello, b"from parent");
    slice.write_from(2 << 20, b"from child").unwrap();
}

#[test]
fn memfd_region_is_shared_with_a_child_process_hugepages() {
    if std::env::var(CHILD_ROLE).as_deref() == Ok("memfd") {
        return memfd_child();
    }
    let _serial = serial();
    let _pool = reserve(2, PageSize::Huge2M);
    let region = Region::builder(4 << 20).memfd().build().unwrap();
    let slice = Slice::from_region(&region);
    slice.write_from(0, b"from parent").unwrap();
    let fd = region.fd().unwrap();
    // SAFETY: dup has no memory-safety preconditions; the copy lacks CLOEXEC, so the child
    // inherits it, and it is closed below.
    let inherited = unsafe { libc::dup(fd.as_raw_fd()) };
    assert!(inherited >= 0, "dup: {}", io::Error::last_os_error());
    // SAFETY: `inherited` was just returned by dup and is owned by nothing else.
    let inherited = unsafe { OwnedFd::from_raw_fd(inherited) };
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "memfd_region_is_shared_with_a_child_process_hugepages",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ROLE, "memfd")
        .env(CHILD_FD, inherited.as_raw_fd().to_string())
        .output()
        .unwrap();
    drop(inherited);
    assert!(
        output.status.success(),
        "child failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut reply = [0u8; 10];
    slice.read_into(2 << 20, &mut reply).unwrap();
    assert_eq!(&reply, b"from child");
}

/// A hugetlbfs mount on a temporary directory, unmounted on drop.
struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    fn hugetlbfs(size: PageSize) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let target = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("pagesize={}", size.label())).unwrap();
        // SAFETY: every pointer is a valid C string living across the call.
        let ret = unsafe {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"hugetlbfs".as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            ret,
            0,
            "mounting hugetlbfs needs root: {}",
            io::Error::last_os_error()
        );
        Mount { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let target = CString::new(self.dir.path().as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; MNT_DETACH never blocks on busy files.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn hugetlbfs_file_region_is_shared_by_path_hugepages() {
    let _serial = serial();
    let _pool = reserve(1, PageSize::Huge2M);
    let mount = Mount::hugetlbfs(PageSize::Huge2M);
    let path = mount.path("buffers");
    let first = Region::builder(2 << 20)
        .backing(Backing::File(path.clone()))
        .build()
        .unwrap();
    let second = Region::builder(2 << 20)
        .backing(Backing::File(path))
        .build()
        .unwrap();
    Slice::from_region(&first).write(64, 99u16).unwrap();
    assert_eq!(Slice::from_region(&second).read::<u16>(64).unwrap(), 99);
    assert!(first.fd().is_some());
    drop((first, second));

    // A file of another page size's mount is refused, naming the mount to make.
    let wrong = Region::builder(1 << 30)
        .page_size(PageSize::Huge1G)
        .backing(Backing::File(mount.path("wrong")))
        .build()
        .unwrap_err();
    assert!(matches!(wrong, Error::NotHugetlbfs { .. }), "{wrong:?}");
    assert!(wrong.to_string().contains("pagesize=1G"), "{wrong}");
}

#[test]
fn shortage_error_names_counts_sysfs_file_and_command_hugepages() {
    let _serial = serial();
    let pool = hugepages::read_pool(Path::new(SYSFS_ROOT), PageSize::Huge1G, None).unwrap();
    // One more 1 GiB page than the pool has available: the mmap must fail at reservation time.
    let needed = pool.available() + 1;
    let len = usize::try_from(needed << 30).unwrap();
    let err = Region::builder(len)
        .page_size(PageSize::Huge1G)
        .build()
        .unwrap_err();
    let Error::HugepagesUnavailable {
        needed: reported,
        free,
        hint,
        ..
    } = &err
    else {
        panic!("expected a shortage, got {err:?}");
    };
    assert_eq!(*reported, needed);
    assert_eq!(*free, pool.available());
    assert_eq!(hint.count, pool.total + 1);
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "echo {} > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            pool.total + 1
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "userdma hugepages --reserve {} --size 1G",
            pool.total + 1
        )),
        "{text}"
    );
}

#[test]
fn numa_node_binding_is_checked_hugepages() {
    let _serial = serial();
    let _pool = reserve(1, PageSize::Huge2M);
    let status = hugepages::status(Path::new(SYSFS_ROOT)).unwrap();
    let node = *status
        .nodes()
        .first()
        .expect("the machine lists no NUMA node in /sys/devices/system/node");
    let region = Region::builder(2 << 20).node(node).build().unwrap();
    assert_eq!(region.node(), Some(node));
    check_physical(&region);
    drop(region);

    // A node the machine does not have: the kernel refuses the binding, and the error names
    // the nodes it has.
    let err = Region::builder(2 << 20).node(1023).build().unwrap_err();
    assert!(
        matches!(&err, Error::NoSuchNode { node: 1023, online, .. } if online.contains(node)),
        "{err:?}"
    );
}

#[test]
fn guard_restores_the_pool_hugepages() {
    let _serial = serial();
    let root = Path::new(SYSFS_ROOT);
    let before = hugepages::read_pool(root, PageSize::Huge2M, None).unwrap();
    let want = before.available() + 3;
    let guard = reserve(want, PageSize::Huge2M);
    assert!(guard.grew());
    let during = hugepages::read_pool(root, PageSize::Huge2M, None).unwrap();
    assert!(during.available() >= want, "{during:?}");
    guard.restore().unwrap();
    let after = hugepages::read_pool(root, PageSize::Huge2M, None).unwrap();
    assert_eq!(after.total, before.total);
}

#[test]
fn loopback_mapping_of_hugepages_is_aligned_hugepages() {
    let _serial = serial();
    let _pool = reserve(2, PageSize::Huge2M);
    let region = Arc::new(Region::builder(4 << 20).build().unwrap());
    let space = SoftIommu::new(28).unwrap();
    let mapping = space.map(Arc::clone(&region)).unwrap();
    let iova = mapping.iova(0).unwrap();
    assert_eq!(iova % (2 << 20), 0);
    assert!((iova + (4 << 20) - 1).raw() < 1 << 28);
    assert_eq!(mapping.contiguous_len(0), 4 << 20);
}
