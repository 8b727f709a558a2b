//! Regions that need no hugepages: base-page regions, argument errors, mlock and its failure
//! (in a child process without CAP_IPC_LOCK and with a tiny RLIMIT_MEMLOCK), and the
//! physical-address error without CAP_SYS_ADMIN (in a child process that drops it).

use std::fs;
use std::os::fd::OwnedFd;
use std::process::{Command, Output};

use userdma::dma::Slice;
use userdma::memory::{Backing, Error, MemlockLimit, PageSize, Region};

/// Set in a child process started by a test: names the role it plays.
const CHILD_ROLE: &str = "USERDMA_TEST_CHILD_ROLE";

mod caps;

use caps::{drop_capability, CAP_IPC_LOCK, CAP_SYS_ADMIN};
/// Re-runs this test binary for one test, with `role` in the environment.
fn run_child(test: &str, role: &str) -> Output {
    let output = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture"])
        .env(CHILD_ROLE, role)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "child {role} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn role() -> Option<String> {
    std::env::var(CHILD_ROLE).ok()
}

#[test]
#[cfg_attr(
    any(userdma_sanitize = "address", userdma_sanitize = "thread"),
    ignore = "the sanitizer runtimes make mlock a no-op (scripts/sanitize.sh); the plain run checks it"
)]
fn base_page_region_is_populated_and_locked() {
    let len = 1 << 20;
    let region = Region::builder(len)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    assert_eq!(region.len(), len);
    assert_eq!(region.page_count(), len / PageSize::Base.bytes());
    assert!(region.is_locked());
    // The kernel reports the mapping as locked in /proc/self/smaps.
    let start = format!("{:x}-", region.as_ptr().as_ptr() as usize);
    let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
    let block = smaps
        .split("\n")
        .skip_while(|line| !line.starts_with(&start))
        .take_while(|line| !line.starts_with("VmFlags"))
        .collect::<Vec<_>>();
    let locked = block
        .iter()
        .find_map(|line| line.strip_prefix("Locked:"))
        .expect("the region's mapping is in smaps");
    let kib: usize = locked.trim().trim_end_matches("kB").trim().parse().unwrap();
    assert_eq!(kib, len >> 10, "{block:?}");
    let rss = block
        .iter()
        .find_map(|line| line.strip_prefix("Rss:"))
        .unwrap();
    assert_eq!(rss.trim(), format!("{} kB", len >> 10), "not pre-faulted");
}

#[test]
fn unlocked_region_is_not_locked() {
    let region = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .unwrap();
    assert!(!region.is_locked());
}

#[test]
fn length_must_be_a_positive_multiple_of_the_page() {
    for (len, size, suggested) in [
        (0, PageSize::Huge2M, 2 << 20),
        (3 << 20, PageSize::Huge2M, 4 << 20),
        ((1 << 30) + 1, PageSize::Huge1G, 2 << 30),
        (5000, PageSize::Base, 8192),
    ] {
        let err = Region::builder(len).page_size(size).build().unwrap_err();
        match &err {
            Error::InvalidLength { suggested: got, .. } => assert_eq!(*got, suggested, "{err}"),
            other => panic!("expected InvalidLength, got {other:?}"),
        }
        assert!(
            err.to_string()
                .contains(&format!("multiple of {} bytes", size.bytes())),
            "{err}"
        );
    }
}

#[test]
fn base_page_memfd_is_shared_and_sealed() {
    let first = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .memfd()
        .build()
        .unwrap();
    let fd: OwnedFd = first.fd().unwrap().try_clone_to_owned().unwrap();
    let file = fs::File::from(fd.try_clone().unwrap());
    // Sealed against resizing: a peer cannot truncate the pages out from under us.
    assert!(file.set_len(4096).is_err());
    let second = Region::from_fd(fd, 64 << 10, PageSize::Base).unwrap();
    Slice::from_region(&first).write(8, 5u64).unwrap();
    assert_eq!(Slice::from_region(&second).read::<u64>(8).unwrap(), 5);
}

#[test]
fn from_fd_checks_filesystem_and_length() {
    let region = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .memfd()
        .build()
        .unwrap();
    let fd = || region.fd().unwrap().try_clone_to_owned().unwrap();
    // A base-page memfd is no hugetlbfs file.
    let err = Region::from_fd(fd(), 2 << 20, PageSize::Huge2M).unwrap_err();
    assert!(matches!(err, Error::NotHugetlbfs { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("mount -t hugetlbfs -o pagesize=2M"),
        "{err}"
    );
    // Longer than the file.
    let err = Region::from_fd(fd(), 128 << 10, PageSize::Base).unwrap_err();
    assert!(
        matches!(
            err,
            Error::FileTooShort {
                len: 131072,
                file_len: 65536
            }
        ),
        "{err:?}"
    );
}

#[test]
fn file_backing_must_be_hugetlbfs_for_hugepages() {
    let dir = tempfile::tempdir().unwrap();
    let err = Region::builder(2 << 20)
        .backing(Backing::File(dir.path().join("not-huge")))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::NotHugetlbfs { .. }), "{err:?}");
    let err = Region::builder(2 << 20)
        .backing(Backing::File(dir.path().join("missing-dir/file")))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::OpenFile { .. }), "{err:?}");
}

/// Child: without CAP_IPC_LOCK and with RLIMIT_MEMLOCK at 64 KiB, locking 1 MiB must fail and
/// say what the limit is and how to raise it.
fn lock_child() {
    let limit = libc::rlimit {
        rlim_cur: 64 << 10,
        rlim_max: 64 << 10,
    };
    // SAFETY: `limit` is a valid rlimit for the call.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0);
    drop_capability(CAP_IPC_LOCK).unwrap();
    let err = Region::builder(1 << 20)
        .page_size(PageSize::Base)
        .build()
        .unwrap_err();
    match &err {
        Error::Lock { soft, hard, .. } => {
            assert_eq!(*soft, MemlockLimit::Bytes(64 << 10));
            assert_eq!(*hard, MemlockLimit::Bytes(64 << 10));
        }
        other => panic!("expected a lock failure, got {other:?}"),
    }
    println!("CHILD-ERROR: {err}");
}

#[test]
#[cfg_attr(
    any(userdma_sanitize = "address", userdma_sanitize = "thread"),
    ignore = "the sanitizer runtimes make mlock a no-op (scripts/sanitize.sh); the plain run checks it"
)]
fn lock_failure_reports_the_memlock_limit() {
    if role().as_deref() == Some("lock") {
        return lock_child();
    }
    let output = run_child("lock_failure_reports_the_memlock_limit", "lock");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|line| line.starts_with("CHILD-ERROR: "))
        .unwrap_or_else(|| panic!("child printed no error: {stdout}"));
    assert!(line.contains("RLIMIT_MEMLOCK is 64 KiB"), "{line}");
    assert!(line.contains("ulimit -l"), "{line}");
    assert!(line.contains("/etc/security/limits.d/"), "{line}");
}

/// Child: without CAP_SYS_ADMIN, pagemap hides frame numbers; the error must say so.
fn pagemap_child() {
    drop_capability(CAP_SYS_ADMIN).unwrap();
    let region = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    let err = region.physical_pages().unwrap_err();
    assert!(matches!(err, Error::PhysicalAddressHidden), "{err:?}");
    println!("CHILD-ERROR: {err}");
}

#[test]
fn physical_addresses_without_cap_sys_admin_are_a_clear_error() {
    if role().as_deref() == Some("pagemap") {
        return pagemap_child();
    }
    let output = run_child(
        "physical_addresses_without_cap_sys_admin_are_a_clear_error",
        "pagemap",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("CAP_SYS_ADMIN"), "{stdout}");
}

#[test]
fn base_pages_have_physical_addresses_as_root() {
    let region = Region::builder(64 << 10)
        .page_size(PageSize::Base)
        .build()
        .unwrap();
    let pages = region.physical_pages().unwrap_or_else(|err| {
        panic!("this test needs root (CAP_SYS_ADMIN) to read physical addresses: {err}")
    });
    assert_eq!(pages.len(), 16);
    assert!(pages
        .as_slice()
        .iter()
        .all(|&addr| addr != 0 && addr % 4096 == 0));
}
