//! What runs without a dma-buf exporter: every refusal, the huge-page policy, the reverse
//! lookup's arithmetic, the list layout, and the import paths over a memfd standing in for a
//! dma-buf's mapping. The kernel's side (udmabuf, the system heap, V4L2) is the guest suite's
//! `dmabuf-*` cases.

use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::Arc;

use super::export::{shmem_thp_possible, CreateList};
use super::*;
use crate::dma::{Access, Iova, Physical, SoftIommu};
use crate::memory::{Backing, PageSize, Region};

fn memfd_region(len: usize) -> Arc<Region> {
    Arc::new(
        Region::builder(len)
            .page_size(PageSize::Base)
            .backing(Backing::Memfd)
            .lock(false)
            .build()
            .unwrap(),
    )
}

/// A memfd's descriptor posing as a dma-buf's: what `import` does with a dma-buf it did not
/// export (map it, map that) works on any shared file.
fn stand_in(region: &Region) -> DmaBuf {
    let fd = region.fd().unwrap().try_clone_to_owned().unwrap();
    DmaBuf {
        fd,
        len: region.len(),
        inode: u64::MAX,
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn a_file_that_is_not_a_dma_buf_is_refused_with_its_filesystem() {
    let region = memfd_region(4096);
    let fd = region.fd().unwrap().try_clone_to_owned().unwrap();
    let err = DmaBuf::from_fd(fd).unwrap_err();
    assert!(
        matches!(err, Error::NotDmaBuf { magic } if magic != 0x444d_4142),
        "{err}"
    );
    assert_eq!(err.code(), crate::Code::InvalidArgument);
    assert!(err.to_string().contains("udmabuf"), "{err}");
}

#[test]
fn bad_ranges_are_refused_before_the_kernel_is_asked() {
    let region = memfd_region(64 << 10);
    let page = crate::memory::base_page_size();
    for (offset, len) in [
        (0, 0),
        (100, page),
        (0, page + 1),
        (60 << 10, 8 << 10),
        (usize::MAX - page + 1, page),
    ] {
        let err = export_range(&region, offset, len, Importers::Any).unwrap_err();
        assert!(
            matches!(err, Error::Range { offset: o, len: l, .. } if o == offset && l == len),
            "{offset:#x}+{len:#x}: {err}"
        );
    }
    let err = export(&region, &[], Importers::Any).unwrap_err();
    assert!(matches!(err, Error::RangeCount { count: 0, .. }), "{err}");
    let many = vec![(0, page); 1025];
    let err = export(&region, &many, Importers::Any).unwrap_err();
    assert!(
        matches!(err, Error::RangeCount { count: 1025, .. }),
        "{err}"
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn memory_outside_a_memfd_is_refused_and_says_how_to_make_it() {
    let anonymous = Arc::new(
        Region::builder(8192)
            .page_size(PageSize::Base)
            .lock(false)
            .build()
            .unwrap(),
    );
    let err = export_range(&anonymous, 0, 4096, Importers::Any).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotMemfd {
                what: "anonymous memory"
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("Backing::Memfd"), "{err}");
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn export_reaches_udmabuf_or_says_the_kernel_lacks_it() {
    let region = memfd_region(64 << 10);
    match export_range(&region, 8192, 16384, Importers::Any) {
        Ok(export) => {
            // A kernel with udmabuf: the dma-buf is the range, and the lookup finds it.
            assert_eq!(export.dmabuf().len(), 16384);
            assert_eq!(export.dmabuf().exporter().as_deref(), Some("udmabuf"));
            let found = origin(export.dmabuf()).expect("the export is in the table");
            assert!(Arc::ptr_eq(&found.region, &region));
            assert_eq!(found.region_offset(5), Some(8197));
        }
        Err(err) => {
            assert!(
                !Path::new("/dev/udmabuf").exists(),
                "udmabuf is there, yet: {err}"
            );
            assert!(matches!(err, Error::NoUdmabuf { .. }), "{err}");
            assert_eq!(err.code(), crate::Code::Unsupported);
            assert!(err.to_string().contains("CONFIG_UDMABUF"), "{err}");
        }
    }
}

#[test]
fn huge_pages_are_refused_for_kernel_mapping_importers_before_the_fix() {
    let dir = tempfile_dir("thp-off");
    std::fs::write(
        dir.join("shmem_enabled"),
        "always within_size advise [never] deny force\n",
    )
    .unwrap();
    let release = kernel_release();
    let fixed = major_minor(&release).is_some_and(|v| v >= (6, 17));
    let got = export::check_page_size(PageSize::Huge2M, &dir);
    if fixed {
        got.unwrap();
    } else {
        let err = got.unwrap_err();
        assert!(
            matches!(err, Error::HugePages { backing, .. } if backing.contains("hugetlb")),
            "{err}"
        );
        assert!(err.to_string().contains("Importers::DmaOnly"), "{err}");
        assert_eq!(err.code(), crate::Code::Refused);
    }
    // Base pages with shmem THP off pass on every kernel.
    export::check_page_size(PageSize::Base, &dir).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn shmem_thp_policy_is_read_from_the_selected_values() {
    let dir = tempfile_dir("thp-policy");
    let write = |path: &str, text: &str| {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    assert!(!shmem_thp_possible(&dir), "no files: no THP");
    write(
        "shmem_enabled",
        "always within_size [advise] never deny force\n",
    );
    assert!(
        !shmem_thp_possible(&dir),
        "advise needs madvise, which regions do not do"
    );
    write(
        "hugepages-64kB/shmem_enabled",
        "always [inherit] within_size advise never\n",
    );
    assert!(!shmem_thp_possible(&dir), "inherits advise");
    write(
        "hugepages-2048kB/shmem_enabled",
        "always inherit [within_size] advise never\n",
    );
    assert!(
        shmem_thp_possible(&dir),
        "a size on within_size gives huge folios"
    );
    write(
        "hugepages-2048kB/shmem_enabled",
        "always inherit within_size advise [never]\n",
    );
    write(
        "shmem_enabled",
        "[always] within_size advise never deny force\n",
    );
    assert!(shmem_thp_possible(&dir));
    write(
        "shmem_enabled",
        "always within_size advise never deny [force]\n",
    );
    assert!(shmem_thp_possible(&dir));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn kernel_releases_parse_to_major_and_minor() {
    assert_eq!(major_minor("6.12.118+deb13-amd64"), Some((6, 12)));
    assert_eq!(major_minor("6.1.0-57-amd64"), Some((6, 1)));
    assert_eq!(major_minor("7.3"), Some((7, 3)));
    assert_eq!(major_minor("unknown"), None);
    assert_eq!(major_minor(""), None);
}

#[test]
fn the_reverse_lookup_walks_ranges_in_dma_buf_order() {
    let region = memfd_region(64 << 10);
    let origin = Origin {
        region,
        ranges: vec![(0x8000, 0x1000), (0x2000, 0x2000), (0x4000, 0x1000)],
    };
    assert_eq!(origin.region_offset(0), Some(0x8000));
    assert_eq!(origin.region_offset(0xfff), Some(0x8fff));
    assert_eq!(origin.region_offset(0x1000), Some(0x2000));
    assert_eq!(origin.region_offset(0x2fff), Some(0x3fff));
    assert_eq!(origin.region_offset(0x3000), Some(0x4000));
    assert_eq!(origin.region_offset(0x4000), None);
    assert_eq!(origin.contiguous(), None);
    let joined = Origin {
        region: Arc::clone(&origin.region),
        ranges: vec![(0x2000, 0x2000), (0x4000, 0x1000)],
    };
    assert_eq!(joined.contiguous(), Some((0x2000, 0x3000)));
}

#[test]
fn a_create_list_is_the_header_then_the_items() {
    let list = CreateList::new(7, &[(0x1000, 0x2000), (0x5000, 0x1000)]);
    // SAFETY: the list is a header and two items in one live allocation.
    let (header, items) = unsafe {
        let header = list.as_ptr().read();
        let first = list
            .as_ptr()
            .add(1)
            .cast::<userdma_sys::dmabuf::udmabuf_create_item>();
        (header, [first.read(), first.add(1).read()])
    };
    assert_eq!(
        (header.flags, header.count),
        (userdma_sys::dmabuf::UDMABUF_FLAGS_CLOEXEC, 2)
    );
    assert_eq!(
        (items[0].memfd, items[0].offset, items[0].size),
        (7, 0x1000, 0x2000)
    );
    assert_eq!(
        (items[1].memfd, items[1].offset, items[1].size),
        (7, 0x5000, 0x1000)
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn a_foreign_buffer_imports_by_address_on_the_software_iommu() {
    let region = memfd_region(16384);
    let buf = stand_in(&region);
    let space = SoftIommu::new(48).unwrap();
    let imported = import(&space, &buf, Access::ReadOnly).unwrap();
    assert_eq!(imported.via(), Via::Address);
    assert_eq!(imported.len(), 16384);
    assert_eq!(imported.mapping().access(), Access::ReadOnly);
    // The device's view and the exporter's memory are the same bytes.
    // SAFETY: the region is this test's; nothing else touches it now.
    unsafe { region.as_ptr().as_ptr().add(100).write(0x5a) };
    let window = space.translate(imported.iova(), 16384).expect("mapped");
    // SAFETY: the window is the mapping of the region's 16 KiB, alive while `imported` is.
    let byte = unsafe { window.as_ptr().as_ptr().add(100).read_volatile() };
    assert_eq!(byte, 0x5a);
    assert_eq!(imported.iova_at(16384), None);
    assert!(imported.iova_at(16383).is_some());
    let iova: Iova = imported.iova();
    drop(imported);
    assert!(
        space.translate(iova, 1).is_none(),
        "unmapped with the import"
    );
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn a_physical_space_refuses_imports_and_says_why() {
    let region = memfd_region(8192);
    let buf = stand_in(&region);
    let space = Physical::new(64).unwrap();
    let err = import(&space, &buf, Access::ReadWrite).unwrap_err();
    assert!(
        matches!(err, Error::NotImportable { source: None, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("physical addresses"), "{err}");
    assert_eq!(err.code(), crate::Code::Unsupported);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: needs a memfd (and fstatfs, udmabuf), which Miri does not emulate"
)]
fn cpu_view_of_a_shared_file_sees_its_bytes() {
    let region = memfd_region(8192);
    let buf = stand_in(&region);
    let view = buf.cpu_view().unwrap();
    assert_eq!(view.len(), 8192);
    // SAFETY: both are mappings of the same 8 KiB memfd, owned by this test.
    unsafe {
        region.as_ptr().as_ptr().add(4097).write(9);
        assert_eq!(view.as_ptr().as_ptr().add(4097).read_volatile(), 9);
    }
    assert!(view.fd().is_some_and(|fd| fd.as_fd().as_raw_fd() >= 0));
}

/// A fresh directory under the test target's temporary directory.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("userdma-dmabuf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
