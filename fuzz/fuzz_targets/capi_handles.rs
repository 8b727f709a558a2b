//! The C API's pool and buffer handles against a model, through the exported `udma_*`
//! functions as a C program calls them: pool create / destroy, buffer alloc / free / bulk
//! alloc / bulk free / info / write / read, pool stats, each given live, freed, destroyed,
//! wrong-kind and arbitrary handle values. After every call its status is the model's: a live
//! handle works, a freed or destroyed one is `UDMA_ERR_INVALID_HANDLE`, a pool with buffers out
//! is busy, a buffer is refused by another pool, a bulk call with a bad entry changes nothing;
//! every buffer keeps the bytes written to it, and a pool's stats count the model's buffers.
//! At the end every buffer is freed and every pool destroyed, and the tables hold nothing.
//!
//! The C API's sources are compiled into this target (as its benchmark does: the crate builds
//! no Rust library to link against).

#![no_main]
#![allow(
    dead_code,
    unused_imports,
    non_camel_case_types,
    unreachable_pub,
    missing_docs,
    clippy::all
)]

// The C API's sources call the library `udma`, as their crate's manifest names it.
extern crate userdma as udma;

#[path = "../../capi/src/abi.rs"]
mod abi;
#[path = "../../capi/src/device.rs"]
mod device;
#[path = "../../capi/src/engine.rs"]
mod engine;
#[path = "../../capi/src/error.rs"]
mod error;
#[path = "../../capi/src/handle.rs"]
mod handle;
#[path = "../../capi/src/interop.rs"]
mod interop;
#[path = "../../capi/src/memory.rs"]
mod memory;
#[path = "../../capi/src/pipeline.rs"]
mod pipeline;
#[path = "../../capi/src/plan.rs"]
mod plan;
#[path = "../../capi/src/queue.rs"]
mod queue;
#[path = "../../capi/src/quiesce.rs"]
mod quiesce;
#[path = "../../capi/src/slots.rs"]
mod slots;
#[path = "../../capi/src/streams.rs"]
mod streams;
#[path = "../../capi/src/sync.rs"]
mod sync;

use std::ptr::null_mut;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use device::{udma_cost_model, udma_device, udma_device_open_loopback, udma_loopback_options};
use error::udma_status::{self, *};
use memory::*;

/// Pools at once.
const POOLS: usize = 3;
/// Buffers in a bulk call at most (more than a pool's cache holds, fewer than it has).
const BULK: usize = 40;

#[derive(Debug, Arbitrary)]
enum Op {
    CreatePool {
        big: bool,
    },
    DestroyPool(u8),
    Alloc {
        pool: u8,
        len: u16,
    },
    /// Buffer `buffer` of pool `pool`, freed into pool `into` (its own, or another).
    Free {
        pool: u8,
        buffer: u8,
        into: u8,
    },
    AllocBulk {
        pool: u8,
        len: u16,
        count: u8,
    },
    /// Buffers of pool `pool` picked by `picks` (a pick past the end names a freed buffer, a
    /// repeated pick lists one twice).
    FreeBulk {
        pool: u8,
        picks: Vec<u8>,
    },
    /// A buffer's info and bytes.
    Check {
        pool: u8,
        buffer: u8,
    },
    Stats(u8),
    /// A stale handle (a freed buffer or destroyed pool) used again.
    Stale {
        pick: u8,
        op: u8,
    },
    /// An arbitrary value used as a handle.
    Garbage {
        value: u64,
        op: u8,
    },
}

struct Buf {
    handle: *mut udma_buffer,
    len: u64,
    /// Written at offset 0 when it was allocated.
    tag: u64,
}

struct PoolModel {
    handle: *mut udma_pool,
    max_len: u64,
    buffers: Vec<Buf>,
}

/// One zero-cost loopback device for the whole run (a device per input would start an
/// engine thread per input).
fn device() -> *mut udma_device {
    static DEVICE: OnceLock<usize> = OnceLock::new();
    let addr = *DEVICE.get_or_init(|| {
        let options = udma_loopback_options {
            size: size_of::<udma_loopback_options>(),
            cost_model: udma_cost_model::UDMA_COST_ZERO as u32,
            memory_bytes: 1 << 20,
            queues: 1,
            ..udma_loopback_options::default()
        };
        let mut dev = null_mut();
        // SAFETY: a whole options struct and a writable pointer.
        let s = unsafe { udma_device_open_loopback(&options, &mut dev) };
        assert_eq!(s, UDMA_OK);
        dev as usize
    });
    addr as *mut udma_device
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string, valid until the next failing call; copied at once.
    unsafe { std::ffi::CStr::from_ptr(error::udma_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[track_caller]
fn expect(got: udma_status, want: udma_status, what: &str) {
    assert_eq!(got, want, "{what}: {}", last_error());
}

struct Model {
    pools: Vec<PoolModel>,
    /// Destroyed pools and freed buffers: every use is `UDMA_ERR_INVALID_HANDLE`.
    stale_pools: Vec<*mut udma_pool>,
    stale_buffers: Vec<*mut udma_buffer>,
    tags: u64,
}

impl Model {
    fn pool(&mut self, pick: u8) -> Option<&mut PoolModel> {
        let n = self.pools.len();
        (n > 0).then(|| &mut self.pools[usize::from(pick) % n])
    }

    fn is_live_pool(&self, p: *mut udma_pool) -> bool {
        self.pools.iter().any(|m| m.handle == p)
    }

    fn is_live_buffer(&self, b: *mut udma_buffer) -> bool {
        self.pools
            .iter()
            .any(|m| m.buffers.iter().any(|x| x.handle == b))
    }

    fn next_tag(&mut self) -> u64 {
        self.tags += 1;
        self.tags.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    /// Writes `tag` at offset 0 of a live buffer of at least 8 bytes.
    fn stamp(b: &Buf) {
        if b.len >= 8 {
            // SAFETY: 8 readable bytes.
            let s = unsafe { udma_buffer_write(b.handle, 0, (&raw const b.tag).cast(), 8) };
            expect(s, UDMA_OK, "udma_buffer_write");
        }
    }

    fn check(b: &Buf) {
        let mut info = info_struct();
        // SAFETY: a whole info struct.
        expect(
            unsafe { udma_buffer_get_info(b.handle, &mut info) },
            UDMA_OK,
            "udma_buffer_get_info",
        );
        assert_eq!(info.len, b.len);
        assert!(info.capacity >= b.len);
        assert_eq!(info.state, udma_buffer_state::UDMA_BUFFER_HOST as u32);
        if b.len >= 8 {
            let mut got = 0u64;
            // SAFETY: 8 writable bytes.
            let s = unsafe { udma_buffer_read(b.handle, 0, (&raw mut got).cast(), 8) };
            expect(s, UDMA_OK, "udma_buffer_read");
            assert_eq!(got, b.tag, "a buffer's bytes changed");
        }
    }

    fn alloc_status(m: &PoolModel, len: u64) -> Option<udma_status> {
        (len == 0 || len > m.max_len).then_some(UDMA_ERR_INVALID_ARGUMENT)
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::CreatePool { big } => {
                if self.pools.len() == POOLS {
                    return;
                }
                let options = udma_pool_options {
                    size: size_of::<udma_pool_options>(),
                    bytes: if big { 8 << 20 } else { 4 << 20 },
                    ..udma_pool_options::default()
                };
                let mut pool = null_mut();
                // SAFETY: a whole options struct and a writable pointer.
                let s = unsafe { udma_pool_create(device(), &options, &mut pool) };
                expect(s, UDMA_OK, "udma_pool_create");
                let mut stats = stats_struct();
                // SAFETY: a whole stats struct.
                expect(
                    unsafe { udma_pool_get_stats(pool, &mut stats) },
                    UDMA_OK,
                    "udma_pool_get_stats",
                );
                self.pools.push(PoolModel {
                    handle: pool,
                    max_len: stats.max_len,
                    buffers: Vec::new(),
                });
            }
            Op::DestroyPool(pick) => {
                let n = self.pools.len();
                if n == 0 {
                    return;
                }
                let at = usize::from(pick) % n;
                let m = &self.pools[at];
                // SAFETY: any value is checked.
                let s = unsafe { udma_pool_destroy(m.handle) };
                if m.buffers.is_empty() {
                    expect(s, UDMA_OK, "udma_pool_destroy");
                    let m = self.pools.swap_remove(at);
                    self.stale_pools.push(m.handle);
                } else {
                    expect(s, UDMA_ERR_BUSY, "udma_pool_destroy with buffers out");
                    let want = format!("{} buffers out", m.buffers.len());
                    assert!(last_error().contains(&want), "{}", last_error());
                }
            }
            Op::Alloc { pool, len } => {
                let tag = self.next_tag();
                let Some(m) = self.pool(pool) else { return };
                let len = u64::from(len) % 9000;
                let mut b = null_mut();
                // SAFETY: a writable pointer.
                let s = unsafe { udma_pool_alloc(m.handle, len, &mut b) };
                match Model::alloc_status(m, len) {
                    Some(want) => expect(s, want, "udma_pool_alloc out of range"),
                    None if s == UDMA_ERR_EXHAUSTED => {}
                    None => {
                        expect(s, UDMA_OK, "udma_pool_alloc");
                        let buf = Buf {
                            handle: b,
                            len,
                            tag,
                        };
                        Model::stamp(&buf);
                        m.buffers.push(buf);
                    }
                }
            }
            Op::Free { pool, buffer, into } => {
                let n = self.pools.len();
                if n == 0 {
                    return;
                }
                let (from, to) = (usize::from(pool) % n, usize::from(into) % n);
                let count = self.pools[from].buffers.len();
                if count == 0 {
                    return;
                }
                let at = usize::from(buffer) % count;
                let b = self.pools[from].buffers[at].handle;
                // SAFETY: handles only (checked, never dereferenced).
                let s = unsafe { udma_pool_free(self.pools[to].handle, b) };
                if from == to {
                    expect(s, UDMA_OK, "udma_pool_free");
                    self.pools[from].buffers.swap_remove(at);
                    self.stale_buffers.push(b);
                } else {
                    expect(
                        s,
                        UDMA_ERR_INVALID_ARGUMENT,
                        "udma_pool_free into another pool",
                    );
                    assert!(last_error().contains("another pool"), "{}", last_error());
                }
            }
            Op::AllocBulk { pool, len, count } => {
                let first_tag = self.next_tag();
                let Some(m) = self.pool(pool) else { return };
                let len = u64::from(len) % 9000;
                let count = usize::from(count) % (BULK + 1);
                let mut out = vec![null_mut(); count];
                // SAFETY: `count` writable pointers.
                let s = unsafe { udma_pool_alloc_bulk(m.handle, len, count, out.as_mut_ptr()) };
                match Model::alloc_status(m, len) {
                    // An empty bulk call allocates nothing, whatever the length.
                    Some(_) if count == 0 => expect(s, UDMA_OK, "an empty udma_pool_alloc_bulk"),
                    Some(want) => expect(s, want, "udma_pool_alloc_bulk out of range"),
                    None if s == UDMA_ERR_EXHAUSTED => {}
                    None => {
                        expect(s, UDMA_OK, "udma_pool_alloc_bulk");
                        for (i, handle) in out.into_iter().enumerate() {
                            let buf = Buf {
                                handle,
                                len,
                                tag: first_tag ^ (i as u64) << 48,
                            };
                            Model::stamp(&buf);
                            m.buffers.push(buf);
                        }
                    }
                }
            }
            Op::FreeBulk { pool, picks } => {
                let n = self.pools.len();
                if n == 0 {
                    return;
                }
                let from = usize::from(pool) % n;
                let count = self.pools[from].buffers.len();
                let picks: Vec<u8> = picks.into_iter().take(BULK).collect();
                let mut list = Vec::new();
                let mut stale = false;
                let mut twice = false;
                let mut chosen = Vec::new();
                for p in picks {
                    let p = usize::from(p);
                    if p < count {
                        twice |= chosen.contains(&p);
                        chosen.push(p);
                        list.push(self.pools[from].buffers[p].handle);
                    } else if let Some(&b) = self.stale_buffers.get(p - count) {
                        stale = true;
                        list.push(b);
                    }
                }
                // SAFETY: `list.len()` readable handles.
                let s = unsafe {
                    udma_pool_free_bulk(self.pools[from].handle, list.as_ptr(), list.len())
                };
                if stale || twice {
                    // All or nothing: refused, and every listed live buffer stays live.
                    assert!(
                        s == UDMA_ERR_INVALID_HANDLE || s == UDMA_ERR_INVALID_ARGUMENT,
                        "udma_pool_free_bulk with a bad entry: {s:?}: {}",
                        last_error()
                    );
                    for b in &self.pools[from].buffers {
                        Model::check(b);
                    }
                } else {
                    expect(s, UDMA_OK, "udma_pool_free_bulk");
                    chosen.sort_unstable();
                    for &p in chosen.iter().rev() {
                        let b = self.pools[from].buffers.swap_remove(p);
                        self.stale_buffers.push(b.handle);
                    }
                }
            }
            Op::Check { pool, buffer } => {
                let Some(m) = self.pool(pool) else { return };
                if m.buffers.is_empty() {
                    return;
                }
                let at = usize::from(buffer) % m.buffers.len();
                Model::check(&m.buffers[at]);
            }
            Op::Stats(pick) => {
                let Some(m) = self.pool(pick) else { return };
                let mut stats = stats_struct();
                // SAFETY: a whole stats struct.
                let s = unsafe { udma_pool_get_stats(m.handle, &mut stats) };
                expect(s, UDMA_OK, "udma_pool_get_stats");
                assert_eq!(stats.handles, m.buffers.len() as u64);
                assert_eq!(stats.in_use, m.buffers.len() as u64);
            }
            Op::Stale { pick, op } => {
                let pools = self.stale_pools.len();
                let total = pools + self.stale_buffers.len();
                if total == 0 {
                    return;
                }
                let at = usize::from(pick) % total;
                let s = if at < pools {
                    let p = self.stale_pools[at];
                    let mut b = null_mut();
                    // SAFETY: handles and a writable pointer.
                    unsafe {
                        match op % 3 {
                            0 => udma_pool_alloc(p, 64, &mut b),
                            1 => udma_pool_destroy(p),
                            _ => udma_pool_get_stats(p, &mut stats_struct()),
                        }
                    }
                } else {
                    let b = self.stale_buffers[at - pools];
                    let mut word = 0u64;
                    // SAFETY: handles and 8 writable bytes.
                    unsafe {
                        match (op % 3, self.pools.first()) {
                            (0, Some(m)) => udma_pool_free(m.handle, b),
                            (1, _) => udma_buffer_read(b, 0, (&raw mut word).cast(), 8),
                            _ => udma_buffer_get_info(b, &mut info_struct()),
                        }
                    }
                };
                expect(s, UDMA_ERR_INVALID_HANDLE, "a stale handle");
            }
            Op::Garbage { value, op } => {
                let as_pool = value as usize as *mut udma_pool;
                let as_buffer = value as usize as *mut udma_buffer;
                // A value may happen to be a live handle: then the call is a real one, and
                // the model cannot follow it.
                if self.is_live_pool(as_pool) || self.is_live_buffer(as_buffer) {
                    return;
                }
                let mut b = null_mut();
                let mut word = 0u64;
                // SAFETY: any value is checked, never dereferenced.
                let s = unsafe {
                    match op % 5 {
                        0 => udma_pool_alloc(as_pool, 64, &mut b),
                        1 => udma_pool_destroy(as_pool),
                        2 => match self.pools.first() {
                            Some(m) => udma_pool_free(m.handle, as_buffer),
                            None => udma_pool_free(as_pool, as_buffer),
                        },
                        3 => udma_buffer_read(as_buffer, 0, (&raw mut word).cast(), 8),
                        _ => udma_buffer_get_info(as_buffer, &mut info_struct()),
                    }
                };
                assert_ne!(s, UDMA_OK, "a value that is no live handle was taken");
                expect(s, UDMA_ERR_INVALID_HANDLE, "an arbitrary handle value");
            }
        }
    }

    /// Frees every buffer and destroys every pool.
    fn finish(mut self) {
        for m in self.pools.drain(..) {
            for b in &m.buffers {
                Model::check(b);
                // SAFETY: handles only.
                expect(
                    unsafe { udma_pool_free(m.handle, b.handle) },
                    UDMA_OK,
                    "udma_pool_free at the end",
                );
            }
            // SAFETY: a handle only.
            expect(
                unsafe { udma_pool_destroy(m.handle) },
                UDMA_OK,
                "udma_pool_destroy at the end",
            );
        }
    }
}

fn stats_struct() -> udma_pool_stats {
    udma_pool_stats {
        size: size_of::<udma_pool_stats>(),
        ..udma_pool_stats::default()
    }
}

fn info_struct() -> udma_buffer_info {
    udma_buffer_info {
        size: size_of::<udma_buffer_info>(),
        host: null_mut(),
        iova: 0,
        len: 0,
        capacity: 0,
        state: 0,
        reserved: 0,
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut model = Model {
        pools: Vec::new(),
        stale_pools: Vec::new(),
        stale_buffers: Vec::new(),
        tags: 0,
    };
    for op in ops.into_iter().take(256) {
        model.step(op);
    }
    model.finish();
});
