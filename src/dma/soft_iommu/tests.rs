use std::sync::Mutex as StdMutex;

use super::*;
use crate::memory::PageSize;

fn region(len: usize) -> Arc<Region> {
    let region = Region::builder(len)
        .page_size(PageSize::Base)
        .memfd()
        .lock(false)
        .build();
    Arc::new(region.expect("a memfd region"))
}

/// What a watcher saw: (mapped?, range, offset).
type Seen = Arc<StdMutex<Vec<(bool, IovaRange, usize)>>>;

fn recorder(seen: &Seen, fail_maps: bool) -> impl Fn(&Change<'_>) -> io::Result<()> {
    let seen = Arc::clone(seen);
    move |change| {
        let offset = change.mapped().map_or(0, |(_, offset)| offset);
        let mapped = change.mapped().is_some();
        seen.lock().unwrap().push((mapped, change.range(), offset));
        if mapped && fail_maps {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

#[test]
fn watchers_hear_every_change_in_order() {
    let space = SoftIommu::new(32).unwrap();
    let before = space.map(region(8 << 10)).unwrap();
    let g0 = space.generation();
    let seen = Seen::default();
    let watching = space.watch(recorder(&seen, false)).unwrap();
    let first = IovaRange::from_len(before.iova(0).unwrap().raw(), 8 << 10).unwrap();
    // Told of what was mapped already.
    assert_eq!(*seen.lock().unwrap(), vec![(true, first, 0)]);
    let mapping = space.map(region(16 << 10)).unwrap();
    let second = IovaRange::from_len(mapping.iova(0).unwrap().raw(), 16 << 10).unwrap();
    assert!(space.generation() > g0);
    let g1 = space.generation();
    drop(mapping);
    assert!(space.generation() > g1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(true, first, 0), (true, second, 0), (false, second, 0)]
    );
    drop(watching);
    drop(before);
    assert_eq!(
        seen.lock().unwrap().len(),
        3,
        "no calls after the registration is gone"
    );
}

#[test]
fn a_failing_watcher_undoes_the_map() {
    let space = SoftIommu::new(32).unwrap();
    let seen = Seen::default();
    let _watching = space.watch(recorder(&seen, true)).unwrap();
    let err = space.map(region(8 << 10)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Map {
                kind: Kind::SoftIommu,
                ..
            }
        ),
        "{err}"
    );
    assert!(space.mapped_ranges().is_empty());
    // The watcher heard of the piece and of its removal; the IOVAs went back.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].0 && !seen[1].0 && seen[0].1 == seen[1].1);
    assert_eq!(space.stats().map_errors, 1);
    drop(_watching);
    let again = space.map(region(8 << 10)).unwrap();
    assert_eq!(
        again.iova(0),
        Some(Iova(seen[0].1.start)),
        "the IOVAs were freed"
    );
}

#[test]
fn a_failed_unmap_notice_keeps_the_iovas_reserved() {
    let space = SoftIommu::new(32).unwrap();
    let refuse = Arc::new(StdMutex::new(false));
    let r = Arc::clone(&refuse);
    let _watching = space
        .watch(move |change| {
            if change.mapped().is_none() && *r.lock().unwrap() {
                return Err(io::Error::from_raw_os_error(libc::EBUSY));
            }
            Ok(())
        })
        .unwrap();
    let mapping = space.map(region(8 << 10)).unwrap();
    let iova = mapping.iova(0).unwrap();
    *refuse.lock().unwrap() = true;
    let err = mapping.unmap().unwrap_err();
    let Error::UnmapFailed { source } = &err else {
        panic!("not an unmap failure: {err}");
    };
    assert!(
        matches!(**source, Error::Unmap { iova: i, .. } if i == iova.raw()),
        "{err}"
    );
    assert!(space.translate(iova, 1).is_none(), "gone from the table");
    *refuse.lock().unwrap() = false;
    let next = space.map(region(8 << 10)).unwrap();
    assert_ne!(next.iova(0), Some(iova), "the refused range is not reused");
}

#[test]
fn pieces_cover_whole_mappings() {
    let space = SoftIommu::new(32).unwrap();
    let mapping = space.map(region(16 << 10)).unwrap();
    let iova = mapping.iova(0).unwrap();
    let (range, window) = space.piece_at((iova + 0x1234).raw()).unwrap();
    assert_eq!(range, IovaRange::from_len(iova.raw(), 16 << 10).unwrap());
    assert_eq!(window.len(), 16 << 10);
    assert_eq!(window.as_ptr(), mapping.as_ptr());
    assert!(space.piece_at((iova + (16 << 10)).raw()).is_none());
    assert!(space.translate(iova + 0x3fff, 2).is_none(), "past the end");
    assert_eq!(space.translate(iova + 0x3fff, 1).unwrap().len(), 1);
}
