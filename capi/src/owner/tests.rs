use super::*;
use crate::error::cstr;

#[test]
fn every_status_has_its_name_and_others_are_unknown() {
    // SAFETY: static NUL-terminated strings.
    let name = |s| unsafe { CStr::from_ptr(udma_owner_status_name(s)) };
    assert_eq!(name(0).to_str(), Ok("ok"));
    assert!(name(3).to_str().unwrap().starts_with("refused"));
    assert_eq!(name(6).to_str(), Ok("unknown status"));
    assert_eq!(name(u32::MAX).to_str(), Ok("unknown status"));
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: opens a Unix socket, which Miri does not emulate"
)]
fn bad_arguments_are_refused_before_any_connection() {
    let mut client = std::ptr::null_mut();
    // SAFETY: NULL and valid strings, a writable out-parameter.
    let status = unsafe { udma_owner_connect(std::ptr::null(), std::ptr::null(), &mut client) };
    assert_eq!(status, udma_status::UDMA_ERR_INVALID_ARGUMENT);
    let missing = cstr(b"/nonexistent/userdma-owner.sock\0");
    // SAFETY: as above.
    let status = unsafe { udma_owner_connect(missing.as_ptr(), std::ptr::null(), &mut client) };
    assert_eq!(status, udma_status::UDMA_ERR_NOT_FOUND);
    // SAFETY: any value is checked.
    let status = unsafe { udma_owner_submit(std::ptr::null_mut(), 0, 0, 0, 0) };
    assert_eq!(status, udma_status::UDMA_ERR_INVALID_HANDLE);
}
