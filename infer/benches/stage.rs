//! Staging a file into pool buffers, four ways in one run:
//!
//! | name | what one iteration is |
//! |---|---|
//! | `uring_direct` | the whole file by io_uring `READ_FIXED` with O_DIRECT into registered pool buffers (the storage device DMAs into them) |
//! | `uring_buffered` | the same without O_DIRECT (one kernel copy from the page cache) |
//! | `read_memcpy` | `pread` into a heap buffer, then `memcpy` into a pool buffer: the usual path, the baseline |
//! | `read_into_pool` | `pread` straight into the pool buffer (one kernel copy, one request at a time) |
//!
//! Requests of 1 MiB, 8 in flight for the io_uring paths, on a file in the build directory (a
//! real disk; the bench fails if it does not take O_DIRECT). After criterion's groups, a summary
//! measures each path again over whole-file passes and prints GB/s and CPU time per GB
//! (`getrusage`, every thread of the process, kernel workers included), each as a ratio to
//! `read_memcpy`. The buffered paths read from the page cache (the file is warm after the
//! first pass); O_DIRECT reads the device every time, so its throughput is the disk's.
//!
//! ```text
//! cargo bench --bench stage                  # 256 MiB file
//! cargo bench --bench stage -- --test        # quick: 8 MiB file, each bench once, a short summary
//! ```

use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use userdma::dma::{SoftIommu, Space};
use userdma::memory::{PageSize, Region};
use userdma::pool::{Config, Pool};
use userdma_infer::stage::{self, Direct, File, Mode, Stager};

const REQUEST: usize = 1 << 20;
const DEPTH: u32 = 8;

fn pool() -> Arc<Pool> {
    let region = Region::builder(32 << 20)
        .page_size(PageSize::Base)
        .lock(false)
        .build()
        .expect("32 MiB region");
    let mapping = SoftIommu::new(48)
        .expect("loopback DMA space")
        .map(Arc::new(region))
        .expect("mapping");
    Arc::new(Pool::new(mapping, Config::default()).expect("pool"))
}

fn make_file(len: usize) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).expect("target tmp dir");
    let path = dir.join(format!("stage-bench-{}", std::process::id()));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&path, data).expect("bench file");
    path
}

/// Reads the whole file through the stager; returns the bytes read.
fn uring(stager: &mut Stager, file: &File, size: u64) -> u64 {
    let pool = stager.pool().clone();
    let (mut next, mut total) = (0u64, 0u64);
    loop {
        while next < size && (stager.in_flight() as u32) < DEPTH {
            let buffer = pool.alloc_owned(REQUEST).expect("buffer");
            stager.read(file, next, buffer).expect("queued");
            next += REQUEST as u64;
        }
        match stager.wait() {
            Ok(done) => total += done.result.expect("read").bytes as u64,
            Err(stage::Error::Idle) => return total,
            Err(e) => panic!("{e}"),
        }
    }
}

fn pread(fd: i32, dst: *mut u8, len: usize, offset: u64) -> usize {
    // SAFETY: `dst` is `len` writable bytes the caller owns (a heap buffer, or a pool buffer
    // no device is working on); `fd` is open.
    let n = unsafe { libc::pread(fd, dst.cast(), len, offset as libc::off_t) };
    usize::try_from(n).expect("pread")
}

/// The usual path: `pread` into the heap, `memcpy` into a pool buffer.
fn read_memcpy(pool: &Arc<Pool>, file: &std::fs::File, size: u64, heap: &mut [u8]) -> u64 {
    let (mut at, mut total) = (0u64, 0u64);
    let buffer = pool.alloc_owned(REQUEST).expect("buffer");
    while at < size {
        let n = pread(file.as_raw_fd(), heap.as_mut_ptr(), REQUEST, at);
        // SAFETY: `n <= REQUEST` bytes from the heap buffer into the pool buffer's `REQUEST`
        // bytes, which this thread owns and no device touches; the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(heap.as_ptr(), buffer.as_ptr().as_ptr(), n) };
        black_box(&buffer);
        total += n as u64;
        at += REQUEST as u64;
    }
    total
}

/// `pread` straight into a pool buffer.
fn read_into_pool(pool: &Arc<Pool>, file: &std::fs::File, size: u64) -> u64 {
    let (mut at, mut total) = (0u64, 0u64);
    let buffer = pool.alloc_owned(REQUEST).expect("buffer");
    while at < size {
        total += pread(file.as_raw_fd(), buffer.as_ptr().as_ptr(), REQUEST, at) as u64;
        at += REQUEST as u64;
    }
    total
}

struct Paths {
    pool: Arc<Pool>,
    stager: Stager,
    direct: File,
    buffered: File,
    plain: std::fs::File,
    heap: Vec<u8>,
    size: u64,
}

impl Paths {
    fn run(&mut self, name: &str) -> u64 {
        match name {
            "uring_direct" => uring(&mut self.stager, &self.direct, self.size),
            "uring_buffered" => uring(&mut self.stager, &self.buffered, self.size),
            "read_memcpy" => read_memcpy(&self.pool, &self.plain, self.size, &mut self.heap),
            _ => read_into_pool(&self.pool, &self.plain, self.size),
        }
    }
}

const NAMES: [&str; 4] = [
    "uring_direct",
    "uring_buffered",
    "read_memcpy",
    "read_into_pool",
];

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let size = if quick { 8 << 20 } else { 256 << 20 };
    let path = make_file(size);
    let pool = pool();
    let direct = File::open(&path, Direct::Require)
        .expect("the build directory's file system takes O_DIRECT (ext4, xfs, btrfs)");
    assert_eq!(direct.mode(), Mode::Direct);
    let mut paths = Paths {
        stager: Stager::new(pool.clone(), stage::Config::default().depth(DEPTH)).expect("stager"),
        pool,
        direct,
        buffered: File::open(&path, Direct::Off).expect("open"),
        plain: std::fs::File::open(&path).expect("open"),
        heap: vec![0u8; REQUEST],
        size: size as u64,
    };
    for name in NAMES {
        assert_eq!(paths.run(name), size as u64, "{name} reads the whole file");
    }

    let mut criterion = Criterion::default().configure_from_args();
    {
        let mut group = criterion.benchmark_group("stage_1MiB_depth8");
        group.throughput(Throughput::Bytes(size as u64));
        group.sample_size(10);
        for name in NAMES {
            group.bench_function(name, |b| b.iter(|| black_box(paths.run(name))));
        }
        group.finish();
    }
    criterion.final_summary();

    // The summary: whole-file passes for a fixed time each, wall and CPU time.
    let budget = if quick {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(3)
    };
    let mut rows = Vec::new();
    for name in NAMES {
        let (start, cpu) = (Instant::now(), stage::process_cpu_time());
        let mut bytes = 0u64;
        while start.elapsed() < budget || bytes == 0 {
            bytes += paths.run(name);
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = stage::process_cpu_time().saturating_sub(cpu).as_secs_f64();
        let gb = bytes as f64 / 1e9;
        rows.push((name, gb / secs, cpu / gb));
    }
    let (_, base_rate, base_cpu) = rows[2];
    println!(
        "\nstage summary ({} MiB file, 1 MiB requests, depth {DEPTH}; ratios against read_memcpy)",
        size >> 20
    );
    println!(
        "{:<16} {:>9} {:>8} {:>12} {:>8}",
        "path", "GB/s", "ratio", "CPU s/GB", "ratio"
    );
    for (name, rate, cpu) in rows {
        println!(
            "{name:<16} {rate:>9.2} {:>8.2} {cpu:>12.4} {:>8.2}",
            rate / base_rate,
            if base_cpu > 0.0 { cpu / base_cpu } else { 0.0 }
        );
    }
    drop(paths);
    std::fs::remove_file(path).ok();
}
