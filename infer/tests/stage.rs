//! Staging files into pool buffers through io_uring: O_DIRECT on the build directory's disk,
//! the buffered fallback on tmpfs, data checked byte for byte; refused requests; EOF and short
//! reads; buffers held by the stager while in flight.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use userdma::memory::PageSize;
use userdma::pool::Pool;
use userdma::Runtime;
use userdma_infer::stage::{self, Direct, Error, File, Mode, Stager};
use userdma_loopback::{self as loopback, LoopbackRuntime};

const MIB: usize = 1 << 20;

fn runtime() -> Runtime {
    Runtime::loopback(loopback::Config::default()).expect("loopback runtime")
}

fn pool(runtime: &Runtime, bytes: usize) -> Arc<Pool> {
    runtime.pool(bytes, PageSize::Base).expect("pool")
}

/// Byte `i` of every test file.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(0x9e37_79b9) >> 13) as u8
}

fn make_file(dir: &Path, name: &str, len: usize) -> PathBuf {
    std::fs::create_dir_all(dir).expect("directory");
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let data: Vec<u8> = (0..len as u64).map(pattern).collect();
    std::fs::write(&path, data).expect("write test file");
    path
}

/// A directory on the disk the crate is built on (`target/tmp`).
fn disk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stage")
}

fn shm_dir() -> PathBuf {
    PathBuf::from("/dev/shm/userdma-stage-tests")
}

fn check_bytes(buffer: &userdma::pool::OwnedBuffer, offset: u64) {
    let mut got = vec![0u8; buffer.len()];
    buffer.read(0, &mut got).expect("read back");
    for (i, byte) in got.iter().enumerate() {
        assert_eq!(
            *byte,
            pattern(offset + i as u64),
            "byte {} of the file",
            offset + i as u64
        );
    }
}

/// Reads the whole file in `chunk`-byte requests, `depth` in flight; returns the bytes read
/// and checks each buffer against the file.
fn read_whole(stager: &mut Stager, file: &File, chunk: usize, size: u64) -> u64 {
    let pool = stager.pool().clone();
    let mut next = 0u64;
    let mut total = 0u64;
    let mut offsets = HashMap::new();
    let mut eof = false;
    loop {
        while !eof
            && (stager.in_flight() as u32) < stager.depth()
            && next < size.next_multiple_of(chunk as u64)
        {
            let ticket = stager
                .read(file, next, pool.alloc_owned(chunk).expect("buffer"))
                .expect("read queued");
            offsets.insert(ticket, next);
            next += chunk as u64;
        }
        let done = match stager.wait() {
            Ok(done) => done,
            Err(Error::Idle) => break,
            Err(e) => panic!("wait: {e}"),
        };
        let offset = offsets.remove(&done.ticket).expect("a ticket we issued");
        assert_eq!(done.offset, offset);
        let transfer = done.result.as_ref().expect("read");
        if transfer.is_short() {
            eof = true;
        }
        assert_eq!(done.buffer.len(), transfer.bytes);
        check_bytes(&done.buffer, offset);
        total += transfer.bytes as u64;
    }
    assert!(offsets.is_empty());
    total
}

#[test]
fn direct_reads_on_the_build_disk_match_the_file_byte_for_byte() {
    let size = 8 * MIB + 4096 * 3 + 512; // ends inside a request
    let path = make_file(&disk_dir(), "direct", size);
    let file = File::open(&path, Direct::Require)
        .expect("the build directory's file system supports O_DIRECT (ext4, xfs, btrfs)");
    assert_eq!(file.mode(), Mode::Direct);
    let align = file.alignment();
    assert!(
        align.offset >= 512 && align.offset.is_power_of_two(),
        "{align:?}"
    );
    let rt = runtime();
    let mut stager =
        Stager::new(pool(&rt, 32 * MIB), stage::Config::default().depth(8)).expect("stager");
    assert_eq!(stager.layout().count(), 1);
    assert_eq!(
        read_whole(&mut stager, &file, MIB, size as u64),
        size as u64
    );
    std::fs::remove_file(path).ok();
}

#[test]
fn tmpfs_falls_back_to_buffered_fixed_reads_and_says_so() {
    let size = 3 * MIB + 777;
    let path = make_file(&shm_dir(), "buffered", size);
    let file = File::open(&path, Direct::Prefer).expect("open");
    assert_eq!(file.mode(), Mode::Buffered);
    assert!(file.fallback().is_some(), "the reason is reported");
    let err = File::open(&path, Direct::Require).expect_err("tmpfs has no direct I/O");
    assert!(matches!(err, Error::DirectUnsupported { .. }), "{err}");
    assert!(err.to_string().contains("Direct::Prefer"), "{err}");

    let rt = runtime();
    let mut stager =
        Stager::new(pool(&rt, 16 * MIB), stage::Config::default().depth(4)).expect("stager");
    assert_eq!(
        read_whole(&mut stager, &file, 256 << 10, size as u64),
        size as u64
    );
    // Buffered: any offset and length.
    let mut buffer = stager.pool().alloc_owned(4096).expect("buffer");
    buffer.set_len(3001).expect("len");
    stager.read(&file, 1001, buffer).expect("queued");
    let done = stager.wait().expect("done").into_full().expect("full");
    assert_eq!(done.len(), 3001);
    check_bytes(&done, 1001);
    std::fs::remove_file(path).ok();
}

#[test]
fn misaligned_direct_requests_are_refused_with_the_alignment() {
    let path = make_file(&disk_dir(), "misaligned", 2 * MIB);
    let file = File::open(&path, Direct::Require).expect("O_DIRECT on the build disk");
    let align = file.alignment().offset;
    let rt = runtime();
    let mut stager = Stager::new(pool(&rt, 8 * MIB), stage::Config::default()).expect("stager");
    let pool = stager.pool().clone();

    let refused = stager
        .read(
            &file,
            u64::from(align / 2),
            pool.alloc_owned(64 << 10).expect("buffer"),
        )
        .expect_err("offset");
    assert!(matches!(
        refused.error,
        Error::Misaligned {
            what: "file offset",
            ..
        }
    ));
    assert!(
        refused
            .error
            .to_string()
            .contains(&format!("aligned to {align} bytes")),
        "{}",
        refused.error
    );
    assert_eq!(refused.buffer.len(), 64 << 10, "the buffer comes back");

    let mut buffer = refused.buffer;
    buffer.set_len(align as usize + 1).expect("len");
    let refused = stager.read(&file, 0, buffer).expect_err("length");
    assert!(
        matches!(refused.error, Error::Misaligned { what: "length", .. }),
        "{}",
        refused.error
    );
    assert_eq!(stager.in_flight(), 0, "nothing reached the kernel");

    let mut empty = refused.buffer;
    empty.set_len(0).expect("len");
    assert!(matches!(
        stager.read(&file, 0, empty).expect_err("empty").error,
        Error::Empty
    ));
    // The loopback NPU's pools are cache-coloured by default: their 4 KiB buffers are 256-byte
    // aligned only, so most are refused for direct I/O, with the pool to take them from.
    assert!(pool.is_coloured(4096), "the loopback NPU's default layout");
    let buffers: Vec<_> = (0..4)
        .map(|_| pool.alloc_owned(4096).expect("buffer"))
        .collect();
    let odd = buffers
        .into_iter()
        .find(|b| b.as_ptr().as_ptr().addr() % align as usize != 0)
        .expect("a coloured buffer off the alignment");
    let refused = stager.read(&file, 0, odd).expect_err("address");
    assert!(
        matches!(
            refused.error,
            Error::Misaligned {
                what: "buffer address",
                ..
            }
        ),
        "{}",
        refused.error
    );
    assert!(
        refused.error.to_string().contains("colouring(false)"),
        "{}",
        refused.error
    );
    let far = pool.alloc_owned(4096).expect("buffer");
    assert!(matches!(
        stager
            .read(&file, u64::MAX - 100, far)
            .expect_err("offset")
            .error,
        Error::Offset { .. }
    ));
    std::fs::remove_file(path).ok();
}

#[test]
fn eof_and_short_reads_are_reported() {
    for (dir, direct) in [(disk_dir(), Direct::Require), (shm_dir(), Direct::Off)] {
        let size = 64 << 10;
        let path = make_file(&dir, "eof", size);
        let file = File::open(&path, direct).expect("open");
        let rt = runtime();
        let mut stager = Stager::new(pool(&rt, 8 * MIB), stage::Config::default()).expect("stager");
        let pool = stager.pool().clone();

        stager
            .read(&file, size as u64, pool.alloc_owned(4096).expect("b"))
            .expect("queued");
        let done = stager.wait().expect("done");
        assert_eq!(done.result.as_ref().expect("ok").bytes, 0);
        assert!(matches!(done.into_full(), Err(Error::Eof { .. })));

        let at = size as u64 - 8192;
        stager
            .read(&file, at, pool.alloc_owned(MIB).expect("b"))
            .expect("queued");
        let done = stager.wait().expect("done");
        let transfer = *done.result.as_ref().expect("ok");
        assert_eq!((transfer.bytes, transfer.requested), (8192, MIB));
        check_bytes(&done.buffer, at);
        let err = done.into_full().expect_err("short");
        assert!(
            matches!(err, Error::ShortRead { got: 8192, end, .. } if end == size as u64),
            "{err}"
        );
        assert!(matches!(stager.wait(), Err(Error::Idle)));
        std::fs::remove_file(path).ok();
    }
}

#[test]
fn writes_from_pool_buffers_read_back_the_same() {
    for (dir, direct) in [(disk_dir(), Direct::Require), (shm_dir(), Direct::Prefer)] {
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(format!("written-{}", std::process::id()));
        let file = File::create(&path, direct).expect("create");
        let rt = runtime();
        let mut stager =
            Stager::new(pool(&rt, 8 * MIB), stage::Config::default().depth(4)).expect("stager");
        let pool = stager.pool().clone();
        for i in 0..4u64 {
            let buffer = pool.alloc_owned(MIB).expect("b");
            let data: Vec<u8> = (i * MIB as u64..(i + 1) * MIB as u64)
                .map(pattern)
                .collect();
            buffer.write(0, &data).expect("fill");
            stager.write(&file, i * MIB as u64, buffer).expect("queued");
        }
        for _ in 0..4 {
            stager
                .wait()
                .expect("done")
                .into_full()
                .expect("whole write");
        }
        let mut back = Vec::new();
        std::fs::File::open(&path)
            .expect("open")
            .read_to_end(&mut back)
            .expect("read");
        assert_eq!(back.len(), 4 * MIB);
        assert!(back
            .iter()
            .enumerate()
            .all(|(i, b)| *b == pattern(i as u64)));
        let read_only = File::open(&path, Direct::Off).expect("open");
        let refused = stager
            .write(&read_only, 0, pool.alloc_owned(4096).expect("b"))
            .expect_err("ro");
        assert!(matches!(refused.error, Error::ReadOnly { .. }));
        std::fs::remove_file(path).ok();
    }
}

#[test]
fn the_depth_bounds_what_is_in_flight_and_foreign_buffers_are_refused() {
    let path = make_file(&shm_dir(), "depth", MIB);
    let file = File::open(&path, Direct::Off).expect("open");
    let rt = runtime();
    let mut stager =
        Stager::new(pool(&rt, 8 * MIB), stage::Config::default().depth(2)).expect("stager");
    let pool = stager.pool().clone();
    for _ in 0..2 {
        stager
            .read(&file, 0, pool.alloc_owned(4096).expect("b"))
            .expect("room");
    }
    let refused = stager
        .read(&file, 0, pool.alloc_owned(4096).expect("b"))
        .expect_err("full");
    assert!(matches!(refused.error, Error::Full { depth: 2 }));
    stager.wait().expect("one back");
    stager.read(&file, 0, refused.buffer).expect("room again");

    let other = userdma::Runtime::loopback(loopback::Config::default()).expect("rt");
    let foreign = other.pool(4 * MIB, PageSize::Base).expect("pool");
    let refused = stager
        .read(&file, 0, foreign.alloc_owned(4096).expect("b"))
        .expect_err("foreign");
    assert!(
        matches!(refused.error, Error::NotRegistered { .. }),
        "{}",
        refused.error
    );
    assert!(stager.fixed(&refused.buffer).is_none());
    assert_eq!(
        stager
            .fixed(&pool.alloc_owned(4096).expect("b"))
            .map(|f| f.index),
        Some(0)
    );
    assert!(matches!(
        Stager::new(pool.clone(), stage::Config::default().depth(0)),
        Err(Error::Depth { .. })
    ));
    std::fs::remove_file(path).ok();
}

/// A FIFO with a writer held open: reads from it stay in flight until data is written.
fn fifo(name: &str) -> (PathBuf, std::fs::File) {
    let dir = shm_dir();
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // Read-write so opening does not wait for a reader.
    let writer = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("writer");
    (path, writer)
}

#[test]
fn a_buffer_in_flight_is_the_stagers_until_its_completion() {
    let (path, mut writer) = fifo("inflight");
    let file = File::open(&path, Direct::Off).expect("open fifo");
    let rt = runtime();
    let pool = pool(&rt, 8 * MIB);
    let mut stager = Stager::new(pool.clone(), stage::Config::default().depth(4)).expect("stager");
    // The buffer moves into the stager: it cannot be dropped, read or reused here (the
    // compiler refuses any use of `buffer` after this line).
    let buffer = pool.alloc_owned(4096).expect("b");
    let ticket = stager.read(&file, 0, buffer).expect("queued");
    stager.submit().expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        stager.try_wait().expect("poll").is_none(),
        "the pipe is empty: still in flight"
    );
    assert_eq!(stager.in_flight(), 1);
    // Cancelling hands the buffer back through its completion, not before.
    assert!(stager.cancel(ticket).expect("cancel"));
    let done = stager.wait().expect("completion");
    assert_eq!(done.ticket, ticket);
    assert!(
        matches!(done.result, Err(Error::Cancelled { .. })),
        "{:?}",
        done.result
    );
    assert!(
        !stager.cancel(ticket).expect("gone"),
        "a completed ticket is not in flight"
    );

    // A read that completes after being queued gets the data.
    let ticket = stager.read(&file, 0, done.buffer).expect("queued");
    stager.submit().expect("submit");
    writer.write_all(b"frame").expect("write");
    let done = stager.wait().expect("completion");
    assert_eq!(done.ticket, ticket);
    assert_eq!(done.result.as_ref().expect("ok").bytes, 5);
    let mut text = [0u8; 5];
    done.buffer.read(0, &mut text).expect("read");
    assert_eq!(&text, b"frame");
    std::fs::remove_file(path).ok();
}

#[test]
fn dropping_the_stager_with_reads_in_flight_cancels_them_before_freeing() {
    let (path, mut writer) = fifo("drop");
    let file = File::open(&path, Direct::Off).expect("open fifo");
    let rt = runtime();
    let pool = pool(&rt, 8 * MIB);
    let before = pool.stats();
    let mut stager = Stager::new(pool.clone(), stage::Config::default().depth(8)).expect("stager");
    for _ in 0..8 {
        let buffer = pool.alloc_owned(4096).expect("b");
        buffer.write(0, &[0xaa; 16]).expect("fill");
        stager.read(&file, 0, buffer).expect("queued");
    }
    stager.submit().expect("submit");
    std::thread::sleep(Duration::from_millis(20));
    drop(stager); // cancels all eight and waits for their completions
                  // The kernel no longer reads the pipe: what is written now stays there.
    writer.write_all(b"after drop").expect("write");
    let mut back = [0u8; 10];
    writer.read_exact(&mut back).expect("still in the pipe");
    assert_eq!(&back, b"after drop");
    // The buffers went back to the pool, untouched by the pipe's data.
    let reused = pool.alloc_owned(4096).expect("b");
    let mut head = [0u8; 16];
    reused.read(0, &mut head).expect("read");
    assert_eq!(head, [0xaa; 16]);
    assert_eq!(userdma::pool::leaked_mappings(), 0);
    drop(reused);
    let _ = before;
    std::fs::remove_file(path).ok();
}

#[test]
fn errors_convert_into_the_crate_error_with_codes() {
    let err: userdma_infer::Error = Error::Full { depth: 1 }.into();
    assert_eq!(err.code(), userdma::Code::Exhausted);
    let err: userdma_infer::Error = File::open("/nonexistent/stage", Direct::Off)
        .expect_err("missing")
        .into();
    assert_eq!(err.code(), userdma::Code::NotFound);
    let text = Error::MemlockLimit {
        needed: 1 << 30,
        limit: 8 << 20,
        source: std::io::Error::from_raw_os_error(libc::ENOMEM),
    }
    .to_string();
    assert!(
        text.contains("1073741824") && text.contains("ulimit -l") && text.contains("CAP_IPC_LOCK"),
        "{text}"
    );
}
