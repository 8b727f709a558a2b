//! Memory the caller owns as DMA memory (`Region::borrowed`): anonymous and shared-file
//! mappings the test makes itself, mapped into a software IOMMU and reached through it; left
//! mapped (with what the device wrote) when the region and its mapping are gone; and every
//! refusal: a start off a page, a length that is not whole pages, a hole in the range, a
//! read-only and a PROT_NONE mapping.

use std::ptr::NonNull;
use std::sync::Arc;

use userdma::dma::{Iova, SoftIommu, Space};
use userdma::memory::{self, PageSize, Region};
use userdma::Code;

const PAGE: usize = 4096;

/// `pages` base pages mapped with `prot` (and `flags`, and `fd`), unmapped on drop.
struct Map {
    ptr: NonNull<u8>,
    len: usize,
}

impl Map {
    fn new(pages: usize, prot: libc::c_int, flags: libc::c_int, fd: libc::c_int) -> Map {
        let len = pages * PAGE;
        // SAFETY: a fresh mapping of our own; the kernel picks the address.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        assert_ne!(
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Map {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned a null mapping"),
            len,
        }
    }

    fn anonymous(pages: usize) -> Map {
        Map::new(
            pages,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
        )
    }

    /// Page `k`'s address.
    fn page(&self, k: usize) -> NonNull<u8> {
        // SAFETY: inside the mapping for k < pages (the tests ask only for those).
        unsafe { self.ptr.add(k * PAGE) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the tests dropped every region over it first.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[test]
fn the_callers_memory_is_reached_by_iova_and_left_mapped() {
    let space = SoftIommu::new(48).unwrap();
    // Anonymous memory, and a memfd mapped shared (file-backed).
    // SAFETY: a plain memfd_create with a static name.
    let fd = unsafe { libc::memfd_create(c"caller-memory".as_ptr(), 0) };
    assert!(fd >= 0);
    // SAFETY: our fd, sized before it is mapped.
    assert_eq!(unsafe { libc::ftruncate(fd, (4 * PAGE) as libc::off_t) }, 0);
    let maps = [
        Map::anonymous(4),
        Map::new(4, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd),
    ];
    for map in &maps {
        // SAFETY: `map` stays mapped until after the region and its mapping are dropped, and
        // the test makes no reference into it while they live.
        let region = unsafe { Region::borrowed(map.ptr, map.len, PageSize::Base) }.unwrap();
        assert!(!region.is_owned());
        assert_eq!(region.as_ptr(), map.ptr);
        let mapping = space.map(Arc::new(region)).unwrap();
        let iova = mapping.iova(PAGE).unwrap();
        // The device's view: the IOVA resolves to the caller's page 1.
        let window = space.translate(iova, 8).unwrap();
        assert_eq!(window.as_ptr(), map.page(1));
        window.slice().write_from(0, b"written!").unwrap();
        // Past the mapping: nothing.
        assert!(space
            .translate(Iova(iova.raw() + 3 * PAGE as u64), 8)
            .is_none());
        drop(window);
        drop(mapping);
        // Still the caller's, with what the device wrote.
        let mut got = [0u8; 8];
        // SAFETY: page 1 of our own mapping, nothing else touches it now.
        unsafe { std::ptr::copy_nonoverlapping(map.page(1).as_ptr(), got.as_mut_ptr(), 8) };
        assert_eq!(&got, b"written!");
    }
    assert_eq!(space.stats().maps, 2);
    drop(maps);
    // SAFETY: our own fd, closed once, after its mapping is gone.
    unsafe { libc::close(fd) };
}

/// `Region::borrowed` over a range the test expects it to refuse; its error.
fn refused(ptr: NonNull<u8>, len: usize, page_size: PageSize) -> memory::Error {
    // SAFETY: every range given here is the test's own (or refused before any use): nothing
    // is mapped into a device, and a region that was made is dropped at once.
    let made = unsafe { Region::borrowed(ptr, len, page_size) };
    made.expect_err("refused")
}

#[test]
fn what_cannot_be_given_to_a_device_is_refused_with_what_to_do() {
    let map = Map::anonymous(3);
    let off_a_page = NonNull::new(map.ptr.as_ptr().wrapping_add(64)).unwrap();
    let err = refused(off_a_page, PAGE, PageSize::Base);
    assert!(matches!(err, memory::Error::Unaligned { .. }), "{err}");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = refused(map.ptr, PAGE + 1, PageSize::Base);
    assert!(err.to_string().contains("multiple"), "{err}");
    let err = refused(map.ptr, 0, PageSize::Base);
    assert!(matches!(err, memory::Error::InvalidLength { .. }), "{err}");
    // A 2 MiB page size over 12 KiB of base pages.
    let err = refused(map.ptr, 3 * PAGE, PageSize::Huge2M);
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    // A hole: the middle page unmapped.
    let holed = Map::anonymous(3);
    // SAFETY: the middle page of our own mapping, which nothing uses.
    let unmapped = unsafe { libc::munmap(holed.page(1).as_ptr().cast(), PAGE) };
    assert_eq!(unmapped, 0);
    let err = refused(holed.ptr, 3 * PAGE, PageSize::Base);
    assert!(matches!(err, memory::Error::NotMapped { .. }), "{err}");
    assert!(err.to_string().contains("not all mapped"), "{err}");
    // The rest goes with `Map::drop` (munmap over a hole is fine).

    // Read-only and PROT_NONE: refused, nothing changed.
    for prot in [libc::PROT_READ, libc::PROT_NONE] {
        let m = Map::new(2, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1);
        let err = refused(m.ptr, 2 * PAGE, PageSize::Base);
        assert!(matches!(err, memory::Error::NotPinnable { .. }), "{err}");
        assert_eq!(err.code(), Code::Refused);
        assert!(err.to_string().contains("writable"), "{err}");
    }
}
