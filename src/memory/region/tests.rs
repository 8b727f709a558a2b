use super::*;

fn meminfo(available_kib: u64) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        file.path(),
        format!("MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:   {available_kib} kB\n"),
    )
    .expect("written");
    file
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri: the host-memory check reads /proc/meminfo, skipped under Miri (its pages are the interpreter's)"
)]
fn base_pages_beyond_what_the_host_has_available_are_refused_before_mapping() {
    let small = meminfo(1024);
    let error = Region::builder(4 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .meminfo(small.path())
        .build()
        .expect_err("4 MiB is more than 1 MiB available");
    match &error {
        Error::HostMemory { len, available, .. } => {
            assert_eq!((*len, *available), (4 << 20, 1 << 20));
        }
        other => panic!("{other:?}"),
    }
    assert!(error
        .to_string()
        .contains("1048576 bytes the host has available"));
    let plenty = meminfo(1 << 30);
    Region::builder(4 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .meminfo(plenty.path())
        .build()
        .expect("4 MiB of a TiB available");
}

#[test]
fn mem_available_reads_kib_and_ignores_what_it_cannot_read() {
    assert_eq!(mem_available(meminfo(7).path()), Some(7 * 1024));
    assert_eq!(mem_available(Path::new("/nonexistent/meminfo")), None);
    let odd = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(odd.path(), "MemAvailable: lots\n").unwrap();
    assert_eq!(mem_available(odd.path()), None);
}
