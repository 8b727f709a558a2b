//! The calls of the stage module: `statx` for the direct-I/O alignment (raw `libc`: `nix`
//! has no `statx`), `getrlimit` and `getrusage` (through `nix`), and the io_uring sysctl.
//! Each fills only memory it owns, so all are safe wrappers; errno becomes `io::Error` here.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

/// What `statx` says of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stat {
    /// `Some((memory, offset))` when the kernel reports `STATX_DIOALIGN` (zeros: no direct
    /// I/O for this file).
    pub(super) dio: Option<(u32, u32)>,
    /// The device the file lives on (major, minor).
    pub(super) dev: (u32, u32),
    /// For a block device node, the block device it is (major, minor): its queue, not the
    /// file system holding the node (devtmpfs), has the direct-I/O alignment.
    pub(super) block: Option<(u32, u32)>,
    /// The file's size in bytes.
    pub(super) size: u64,
}

/// `statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_SIZE | STATX_TYPE)`.
pub(super) fn statx(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    let mut buf = MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a valid NUL-terminated (empty) string, `buf` is a writable `statx`
    // the kernel fills; `fd` is open for the duration of the call (borrowed).
    let ret = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN | libc::STATX_SIZE | libc::STATX_TYPE,
            buf.as_mut_ptr(),
        )
    };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised and then filled by a successful `statx`: every field is an
    // integer, valid for any bit pattern.
    let buf = unsafe { buf.assume_init() };
    let dio = (buf.stx_mask & libc::STATX_DIOALIGN != 0)
        .then_some((buf.stx_dio_mem_align, buf.stx_dio_offset_align));
    let block = (buf.stx_mask & libc::STATX_TYPE != 0
        && u32::from(buf.stx_mode) & libc::S_IFMT == libc::S_IFBLK)
        .then_some((buf.stx_rdev_major, buf.stx_rdev_minor));
    Ok(Stat {
        dio,
        dev: (buf.stx_dev_major, buf.stx_dev_minor),
        block,
        size: buf.stx_size,
    })
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`u64::MAX`: unlimited).
pub(super) fn memlock_limit() -> io::Result<u64> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)?;
    Ok(if soft == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        soft
    })
}

/// CPU time (user + system) this process has used so far, every thread included — the
/// kernel's io_uring workers too (`getrusage(RUSAGE_SELF)`). Subtract two readings to get
/// the CPU cost of what ran between them.
pub fn process_cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    // Only EFAULT/EINVAL are possible, and neither applies: report no time if it ever fails.
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_micros(u64::try_from(t.num_microseconds()).unwrap_or(0))
    };
    time(usage.user_time()) + time(usage.system_time())
}

/// The value of `/proc/sys/kernel/io_uring_disabled` (absent: 0, an older kernel).
pub(super) fn io_uring_disabled() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// The logical block size of block device `(major, minor)` from sysfs, for a whole disk or a
/// partition (whose queue is its parent's); `None` for a device with no block queue (tmpfs,
/// overlay and other anonymous devices).
pub(super) fn logical_block_size(dev: (u32, u32)) -> Option<u32> {
    let base = format!("/sys/dev/block/{}:{}", dev.0, dev.1);
    ["queue/logical_block_size", "../queue/logical_block_size"]
        .iter()
        .find_map(|tail| {
            std::fs::read_to_string(format!("{base}/{tail}"))
                .ok()
                .and_then(|text| text.trim().parse::<u32>().ok())
        })
        .filter(|size| size.is_power_of_two())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "Miri: calls statx(2), which Miri does not emulate")]
    fn statx_reports_the_size_of_a_file() {
        let mut file = tempfile::tempfile().expect("temp file");
        std::io::Write::write_all(&mut file, &[7u8; 1000]).expect("write");
        let stat = statx(std::os::fd::AsFd::as_fd(&file)).expect("statx");
        assert_eq!(stat.size, 1000);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: calls getrusage(2), which Miri does not emulate")]
    fn cpu_time_moves_forward() {
        let before = process_cpu_time();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(process_cpu_time() >= before);
        assert!(memlock_limit().expect("getrlimit") > 0);
    }
}
