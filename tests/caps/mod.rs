//! Dropping a capability in a child process, for the tests that check what the crate says
//! without CAP_IPC_LOCK or CAP_SYS_ADMIN.

#![allow(dead_code)]

use std::io;

/// `CAP_IPC_LOCK` (`<linux/capability.h>`).
pub(crate) const CAP_IPC_LOCK: u32 = 14;
/// `CAP_SYS_ADMIN` (`<linux/capability.h>`).
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` (`<linux/capability.h>`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct` (`<linux/capability.h>`); version 3 uses two of them.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Removes `cap` from this thread's effective and permitted sets (the whole process's, in a
/// single-threaded child).
pub(crate) fn drop_capability(cap: u32) -> io::Result<()> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: version 3 capget writes exactly two CapData into `data`.
    let ret = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    let word = (cap / 32) as usize;
    let bit = 1u32 << (cap % 32);
    data[word].effective &= !bit;
    data[word].permitted &= !bit;
    // SAFETY: version 3 capset reads exactly two CapData from `data`.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
