//! A pool over a shareable region, used by two processes at once: the parent creates it, a
//! child (this test binary, re-run with an environment variable) opens it from the inherited
//! memfd; both allocate and free concurrently, then hold a set of buffers at the same time.
//! No two buffers overlap, each process sees the other's writes, and after both are done the
//! shared counters reconcile: nothing outstanding, every byte accounted for.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Buffer, Config, Exhaustion, Pool};

/// Set in the child: the role it plays.
const ROLE: &str = "USERDMA_POOL_TEST_ROLE";
/// The fd number the child inherits.
const FD: &str = "USERDMA_POOL_TEST_FD";
const LEN: usize = 32 << 20;
const TEST: &str = "two_processes_share_one_pool";

fn config() -> Config {
    Config::default()
        .chunk_size(64 << 10)
        .max_class(64 << 10)
        .thread_cache_bytes(256 << 10)
}

/// xorshift64*: deterministic sizes.
struct Rng(u64);

impl Rng {
    fn size(&mut self) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        // 1 byte ..= 128 KiB, log-uniform: every class plus large (buddy) buffers.
        let bits = 1 + (r % 17) as u32;
        1 + (r >> 20) as usize % (1usize << bits)
    }
}

/// Allocates and frees `rounds` times (up to 64 live), then returns `hold` live buffers, each
/// starting with the byte `marker`.
fn churn_then_hold<'p>(
    pool: &'p Pool,
    seed: u64,
    rounds: usize,
    hold: usize,
    marker: u8,
) -> Vec<Buffer<'p>> {
    let mut rng = Rng(seed);
    let mut live: Vec<Buffer<'p>> = Vec::new();
    for i in 0..rounds {
        if live.len() >= 64 || (i % 3 == 2 && !live.is_empty()) {
            let victim = i % live.len();
            live.swap_remove(victim);
        }
        live.push(pool.alloc(rng.size()).expect("churn allocation"));
    }
    drop(live);
    (0..hold)
        .map(|_| {
            let buffer = pool.alloc(rng.size()).expect("held allocation");
            buffer.write(0, &[marker]).unwrap();
            buffer
        })
        .collect()
}

/// The child process: opens the pool, churns, holds a set and reports it, frees on request.
fn child() {
    let raw: i32 = std::env::var(FD)
        .expect("fd in the environment")
        .parse()
        .expect("an fd number");
    // SAFETY: the parent dup'ed this descriptor for us without CLOEXEC and named it in the
    // environment; nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let region = Region::from_fd(fd, LEN, PageSize::Base).expect("map the shared region");
    let space = SoftIommu::new(48).unwrap();
    let pool = Pool::open_shared(space.map(Arc::new(region)).unwrap(), Exhaustion::Fail)
        .expect("open the parent's pool");
    let held = churn_then_hold(&pool, 0xc41d, 5_000, 150, b'C');
    let mut out = std::io::stdout().lock();
    for buffer in &held {
        writeln!(out, "POOL {} {}", buffer.offset(), buffer.capacity()).unwrap();
    }
    writeln!(out, "POOL READY").unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "FREE");
    drop(held);
    let stats = pool.stats();
    // Size-class counters are this process's own.
    let (allocs, frees): (u64, u64) = stats
        .classes
        .iter()
        .fold((0, 0), |(a, f), c| (a + c.allocs, f + c.frees));
    writeln!(out, "POOL DONE {allocs} {frees}").unwrap();
    out.flush().unwrap();
    // Dropping the pool returns this process's thread-cached blocks to the shared lists.
    drop(pool);
}

#[test]
fn two_processes_share_one_pool() {
    if std::env::var(ROLE).as_deref() == Ok("child") {
        return child();
    }
    let region = Region::builder(LEN)
        .page_size(PageSize::Base)
        .memfd()
        .build()
        .expect("a 32 MiB memfd region of base pages (run as root or raise RLIMIT_MEMLOCK)");
    let region = Arc::new(region);
    let space = SoftIommu::new(48).unwrap();
    let pool = Pool::create_shared(space.map(Arc::clone(&region)).unwrap(), config()).unwrap();
    let fd = region.fd().expect("a memfd region has a descriptor");
    // SAFETY: dup has no memory-safety preconditions; the copy lacks CLOEXEC, so the child
    // inherits it; we close ours below.
    let inherited = unsafe { libc::dup(fd.as_raw_fd()) };
    assert!(inherited >= 0, "dup: {}", std::io::Error::last_os_error());
    // SAFETY: `inherited` was just returned by dup and is owned by nothing else.
    let inherited = unsafe { OwnedFd::from_raw_fd(inherited) };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, "child")
        .env(FD, inherited.as_raw_fd().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("re-run the test binary as the child");
    drop(inherited);
    let child_ready = AtomicBool::new(false);
    let mut child_out = BufReader::new(child.stdout.take().unwrap());
    // The parent churns on a second thread while the child churns, until the child holds its
    // set; then both hold theirs at the same time.
    let (ours, theirs) = std::thread::scope(|s| {
        let churner = s.spawn(|| {
            let mut seed = 0x9a7e;
            while !child_ready.load(Ordering::Acquire) {
                drop(churn_then_hold(&pool, seed, 500, 0, b'P'));
                seed += 1;
            }
            let held = churn_then_hold(&pool, seed, 100, 150, b'P');
            pool.flush_thread_cache();
            held
        });
        // Read the child's report in a closure, then release the churner whatever happened:
        // a panic here must not leave the churner spinning, which would hang the scope.
        let read_report = || {
            let mut theirs = Vec::new();
            let mut line = String::new();
            loop {
                line.clear();
                let n = child_out.read_line(&mut line).unwrap();
                assert!(n > 0, "the child ended before reporting its buffers");
                // Text before the prefix, and lines without it, are the test harness's own
                // output (it prints "test <name> ... " without a newline before the test's
                // output).
                let Some(at) = line.find("POOL ") else {
                    continue;
                };
                let report = line[at + "POOL ".len()..].trim();
                if report == "READY" {
                    break;
                }
                let mut words = report
                    .split_whitespace()
                    .map(|w| w.parse::<usize>().unwrap());
                theirs.push((words.next().unwrap(), words.next().unwrap()));
            }
            theirs
        };
        let theirs = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read_report));
        child_ready.store(true, Ordering::Release);
        let ours = churner.join().unwrap();
        match theirs {
            Ok(theirs) => (ours, theirs),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    });
    assert_eq!(theirs.len(), 150);
    // No two live buffers of the two processes overlap.
    let mut all: Vec<(usize, usize, char)> = ours
        .iter()
        .map(|b| (b.offset(), b.capacity(), 'P'))
        .collect();
    all.extend(
        theirs
            .iter()
            .map(|&(offset, capacity)| (offset, capacity, 'C')),
    );
    all.sort_unstable();
    for pair in all.windows(2) {
        let ((a, len, who_a), (b, _, who_b)) = (pair[0], pair[1]);
        assert!(
            a + len <= b,
            "{who_a} buffer at {a:#x}+{len:#x} overlaps {who_b} buffer at {b:#x}"
        );
    }
    // The parent sees the child's writes through its own mapping of the same pages.
    let slice = pool.mapping().slice();
    for (i, &(offset, _)) in theirs.iter().enumerate() {
        assert_eq!(
            slice.read::<u8>(offset).unwrap(),
            b'C',
            "child buffer {i} at {offset:#x}"
        );
    }
    let stats = pool.stats();
    let outstanding: u64 = stats.classes.iter().map(|c| c.outstanding).sum();
    let held_small = ours.iter().filter(|b| b.capacity() <= 64 << 10).count()
        + theirs.iter().filter(|&&(_, c)| c <= 64 << 10).count();
    assert!(
        outstanding >= held_small as u64,
        "shared counters cover both processes"
    );
    // Let the child free everything and go.
    writeln!(child.stdin.as_mut().unwrap(), "FREE").unwrap();
    let mut done = String::new();
    while !done.contains("POOL DONE") {
        done.clear();
        let n = child_out.read_line(&mut done).unwrap();
        assert!(n > 0, "the child ended without reporting its counts");
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
    let counts: Vec<u64> = done[done.find("POOL DONE").unwrap() + "POOL DONE".len()..]
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(counts[0], counts[1], "child allocations and frees");
    assert!(counts[0] >= 4_000, "child allocated {}", counts[0]);
    drop(ours);
    pool.flush_thread_cache();
    let stats = pool.stats();
    for class in &stats.classes {
        assert_eq!(
            class.outstanding, 0,
            "class {}: blocks still out after both processes",
            class.size
        );
        assert_eq!(class.in_use, 0);
        assert_eq!(
            class.free, class.carved,
            "class {}: every carved block is free",
            class.size
        );
    }
    assert_eq!(stats.large.in_use_bytes, 0);
    assert_eq!(
        stats.large.allocs, stats.large.frees,
        "large buffers of both processes"
    );
    assert_eq!(
        stats.accounted_bytes(),
        stats.arena_bytes,
        "every byte accounted for"
    );
}
