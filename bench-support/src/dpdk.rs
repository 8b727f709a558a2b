//! DPDK 22.11 as a baseline: `rte_mempool` get/put and `rte_ring` handoffs and pipelines, run
//! by `c/dpdk.c` through the same loops as userdma's own benchmark cases.
//!
//! The EAL is initialized once per process ([`eal`]) with lcores 0 and 1 (CPU 0: the host,
//! the calling thread; CPU 1: the consumer DPDK runs [`Pair`]s on), no PCI, 512 MiB:
//! `--in-memory` on 2 MiB hugepages when at least 256 of them are free, else `--no-huge
//! --no-shconf` on ordinary pages, which [`Eal::memory`] says so that every table can print it.

use std::ffi::{c_char, c_int, c_uint, CStr, CString};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// `struct rte_mempool`, opaque.
#[repr(C)]
struct RteMempool {
    _private: [u8; 0],
}

/// `struct udb_pair` (c/dpdk.c), opaque.
#[repr(C)]
struct UdbPair {
    _private: [u8; 0],
}

const UDB_PIPELINE: c_int = 0;
const UDB_HANDOFF: c_int = 1;

extern "C" {
    fn udb_eal_init(huge: c_int) -> c_int;
    fn udb_errno() -> c_int;
    fn udb_strerror(error: c_int) -> *const c_char;
    fn udb_version() -> *const c_char;
    fn udb_lcore() -> c_uint;
    fn udb_mempool_create(
        name: *const c_char,
        count: c_uint,
        size: c_uint,
        cache: c_uint,
        no_spread: c_int,
    ) -> *mut RteMempool;
    fn udb_mempool_stride(mp: *const RteMempool) -> c_uint;
    fn udb_mempool_free(mp: *mut RteMempool);
    fn udb_mempool_ops(mp: *const RteMempool) -> *const c_char;
    fn udb_mempool_get_put(mp: *mut RteMempool, iters: u64, bulk: c_uint, placement: c_uint)
        -> u64;
    fn udb_pair_start(
        kind: c_int,
        burst: c_uint,
        esize: c_uint,
        mp: *mut RteMempool,
    ) -> *mut UdbPair;
    fn udb_pair_run(pair: *mut UdbPair, objects: u64) -> u64;
    fn udb_pair_stop(pair: *mut UdbPair) -> u64;
}

/// A failed DPDK call: which, and DPDK's `rte_errno` with its text.
#[derive(Debug, Clone)]
pub struct Error {
    /// The operation.
    pub op: &'static str,
    /// `rte_errno` after it.
    pub errno: i32,
    /// `rte_strerror(errno)`.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (rte_errno {})",
            self.op, self.message, self.errno
        )
    }
}

impl std::error::Error for Error {}

/// Copies a C string DPDK returned (static storage, or a pool's own name).
fn text(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: DPDK returns NUL-terminated strings that stay valid at least until the next call
    // on this thread; we copy it at once.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl Error {
    fn last(op: &'static str) -> Self {
        // SAFETY: both read DPDK's per-thread error state; no arguments to get wrong.
        let errno = unsafe { udb_errno() };
        // SAFETY: any errno value is accepted; the result is a static string.
        let message = text(unsafe { udb_strerror(errno) });
        Self { op, errno, message }
    }
}

/// The initialized EAL.
#[derive(Debug)]
pub struct Eal {
    /// DPDK's version string (`rte_version()`).
    pub version: String,
    /// Whether the EAL runs on 2 MiB hugepages (`--in-memory`) rather than `--no-huge`.
    pub hugepages: bool,
}

impl Eal {
    /// One line for a table's heading: version and memory.
    pub fn memory(&self) -> String {
        if self.hugepages {
            format!(
                "{}, EAL on 2 MiB hugepages (--in-memory -m 512)",
                self.version
            )
        } else {
            format!(
                "{}, EAL without hugepages (--no-huge --no-shconf -m 512: fewer than 256 free \
                 2 MiB hugepages reserved)",
                self.version
            )
        }
    }
}

/// Free 2 MiB hugepages on this machine (0 if the kernel has none configured).
pub fn free_hugepages() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The EAL, initialized on the first call (the calling thread becomes lcore 0 and is pinned to
/// CPU 0; call it from the thread that times the host side, before spawning others).
///
/// # Errors
/// `rte_eal_init` failed (e.g. fewer than two CPUs, or too little memory).
pub fn eal() -> Result<&'static Eal, Error> {
    static EAL: OnceLock<Result<Eal, Error>> = OnceLock::new();
    EAL.get_or_init(|| {
        let hugepages = free_hugepages() >= 256;
        // SAFETY: called once per process (the OnceLock), before any other DPDK call.
        if unsafe { udb_eal_init(c_int::from(hugepages)) } != 0 {
            return Err(Error::last("rte_eal_init (-l 0-1 --no-pci -m 512)"));
        }
        // SAFETY: no arguments; a static string.
        let version = text(unsafe { udb_version() });
        Ok(Eal { version, hugepages })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether the calling thread is DPDK's lcore 0 (where the mempool caches and the timing run).
fn on_main_lcore() -> bool {
    // SAFETY: reads a thread-local; no arguments.
    unsafe { udb_lcore() == 0 }
}

/// An `rte_mempool` of fixed-size objects with a per-lcore cache (`rte_mempool_create`,
/// default ring backend).
#[derive(Debug)]
pub struct Mempool {
    mp: NonNull<RteMempool>,
}

impl Mempool {
    /// `count` objects of `size` bytes, a per-lcore cache of `cache`, laid out as DPDK does
    /// by default: each object after a 64-byte header, the stride padded so that objects
    /// spread over cache sets and memory channels (4 KiB objects: a 4160-byte stride).
    ///
    /// # Errors
    /// The EAL is not up, or `rte_mempool_create` failed.
    pub fn new(name: &str, count: u32, size: u32, cache: u32) -> Result<Self, Error> {
        Self::create(name, count, size, cache, false)
    }

    /// As [`Mempool::new`] with `RTE_MEMPOOL_F_NO_SPREAD`: header and object back to back, no
    /// padding. With `size` = 4096 - 64 the objects are 4096 bytes apart, the layout of a pool
    /// of page-aligned 4 KiB buffers (every object's first line in the same L1 cache set).
    ///
    /// # Errors
    /// As [`Mempool::new`].
    pub fn unspread(name: &str, count: u32, size: u32, cache: u32) -> Result<Self, Error> {
        Self::create(name, count, size, cache, true)
    }

    /// Bytes from one object to the next (header, object, trailer).
    pub fn stride(&self) -> u32 {
        // SAFETY: `mp` is a live pool.
        unsafe { udb_mempool_stride(self.mp.as_ptr()) }
    }

    fn create(
        name: &str,
        count: u32,
        size: u32,
        cache: u32,
        no_spread: bool,
    ) -> Result<Self, Error> {
        eal()?;
        let name = CString::new(name).map_err(|_| Error {
            op: "rte_mempool_create",
            errno: libc::EINVAL,
            message: "name contains NUL".into(),
        })?;
        // SAFETY: the EAL is initialized; `name` is NUL-terminated and copied by DPDK.
        let mp = unsafe {
            udb_mempool_create(name.as_ptr(), count, size, cache, c_int::from(no_spread))
        };
        NonNull::new(mp)
            .map(|mp| Self { mp })
            .ok_or_else(|| Error::last("rte_mempool_create"))
    }

    /// The backend's name (`ring_mp_mc` by default).
    pub fn ops(&self) -> String {
        // SAFETY: `mp` is a live pool.
        text(unsafe { udb_mempool_ops(self.mp.as_ptr()) })
    }

    /// `iters` rounds of: get `bulk` objects (1 or 32; `rte_mempool_get` for one), write 8 bytes
    /// at offset 0 of each, put them back. The time taken. `placement` (an index into
    /// [`PLACEMENTS`](crate::PLACEMENTS)) picks the copy of the loop whose code starts that
    /// many bytes into a 64-byte line.
    ///
    /// Panics if called on another thread than the one that initialized the EAL (DPDK would
    /// bypass its per-lcore cache there), if `bulk` is not in 1..=32, if `placement` is out of
    /// range, or if the pool ran dry.
    pub fn get_put(&self, iters: u64, bulk: u32, placement: usize) -> Duration {
        assert!(on_main_lcore(), "mempool timings run on lcore 0");
        assert!((1..=32).contains(&bulk), "bulk {bulk} outside 1..=32");
        assert!(
            placement < crate::PLACEMENTS.len(),
            "placement {placement} outside 0..{}",
            crate::PLACEMENTS.len()
        );
        // SAFETY: `mp` is a live pool whose objects are at least 8 bytes (the C side writes 8 at
        // offset 0); this thread is an EAL thread; `placement` is in range (checked above).
        let ns = unsafe { udb_mempool_get_put(self.mp.as_ptr(), iters, bulk, placement as c_uint) };
        assert!(ns != 0 || iters == 0, "rte_mempool_get failed: pool empty");
        Duration::from_nanos(ns)
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        // SAFETY: created by `rte_mempool_create`, freed once; every `Pair` borrowing it
        // (the only other user) is gone.
        unsafe { udb_mempool_free(self.mp.as_ptr()) };
    }
}

/// Set while a [`Pair`] runs on lcore 1 (one at a time).
static LCORE1_BUSY: AtomicBool = AtomicBool::new(false);

/// A two-thread case: the caller (lcore 0, CPU 0) produces, a consumer launched on lcore 1
/// (CPU 1) consumes until the pair is dropped.
#[derive(Debug)]
pub struct Pair<'mp> {
    pair: NonNull<UdbPair>,
    _pool: PhantomData<&'mp Mempool>,
}

impl Pair<'static> {
    /// `rte_ring` SP/SC handoff of `esize`-byte elements (8: a value; 64: a descriptor with
    /// `src`, `dst`, `len` set) over 256 slots, `burst` (1..=32) per enqueue: one
    /// `rte_ring_sp_enqueue_elem`, or waiting for room for the burst and one
    /// `rte_ring_sp_enqueue_bulk_elem`. The consumer dequeues up to 32 at a time and adds up a
    /// field of each.
    ///
    /// # Errors
    /// The EAL is not up, lcore 1 is busy with another pair, or the ring could not be made.
    pub fn handoff(burst: u32, esize: u32) -> Result<Self, Error> {
        Self::start(UDB_HANDOFF, burst, esize, None)
    }
}

impl<'mp> Pair<'mp> {
    /// The pipeline: get `burst` (1..=32) objects from `mp` on lcore 0 (after waiting for room
    /// for them in a 1024-slot SP/SC `rte_ring`), write 8 bytes into each, enqueue them; lcore
    /// 1 dequeues up to `burst`, reads the 8 bytes of each and puts them back in bulk.
    ///
    /// # Errors
    /// As [`Pair::handoff`].
    pub fn pipeline(mp: &'mp Mempool, burst: u32) -> Result<Self, Error> {
        Self::start(UDB_PIPELINE, burst, 8, Some(mp))
    }

    fn start(kind: c_int, burst: u32, esize: u32, mp: Option<&'mp Mempool>) -> Result<Self, Error> {
        eal()?;
        if LCORE1_BUSY.swap(true, Ordering::Acquire) {
            return Err(Error {
                op: "rte_eal_remote_launch",
                errno: libc::EBUSY,
                message: "another pair runs on lcore 1".into(),
            });
        }
        let mp = mp.map_or(std::ptr::null_mut(), |mp| mp.mp.as_ptr());
        // SAFETY: the EAL is up and lcore 1 is idle (the flag above); `mp` is null or a live
        // pool that outlives the pair ('mp); the C side checks `burst` and `esize`.
        let pair = unsafe { udb_pair_start(kind, burst, esize, mp) };
        match NonNull::new(pair) {
            Some(pair) => Ok(Self {
                pair,
                _pool: PhantomData,
            }),
            None => {
                let error = Error::last("udb_pair_start");
                LCORE1_BUSY.store(false, Ordering::Release);
                Err(error)
            }
        }
    }

    /// Produces `objects` objects (in bursts) and returns the time from the first get or
    /// enqueue until the consumer has taken the last one.
    ///
    /// Panics if the pipeline's pool ran dry.
    pub fn run(&mut self, objects: u64) -> Duration {
        assert!(on_main_lcore(), "pairs are driven from lcore 0");
        // SAFETY: a live pair, driven only from this thread (`&mut self`).
        let ns = unsafe { udb_pair_run(self.pair.as_ptr(), objects) };
        assert!(
            ns != 0 || objects == 0,
            "rte_mempool_get failed: pool empty"
        );
        Duration::from_nanos(ns)
    }
}

impl Drop for Pair<'_> {
    fn drop(&mut self) {
        // SAFETY: a live pair, stopped once; it waits for lcore 1 to return.
        unsafe { udb_pair_stop(self.pair.as_ptr()) };
        LCORE1_BUSY.store(false, Ordering::Release);
    }
}
