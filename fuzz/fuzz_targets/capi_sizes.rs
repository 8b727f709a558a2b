//! The C API's size and count arguments, through the exported `udma_*` functions as a C
//! program calls them: model layers and tensor bytes, detections, plan tensor lists and
//! options, pool sizes and options, bulk allocation and free counts, queue depths and
//! indices, wait-any lists, pipeline depths and timeouts, stream lists and options. Every
//! call returns a status (never `UDMA_ERR_INTERNAL`, which a panic caught at the boundary
//! gives; an abort or an allocation failure ends the fuzzer), and a count larger than any
//! list could be is refused before the list is read.
//!
//! A count is either small, with a real array of that many elements, or past what the call
//! could ever take, with an array of one element: the library must refuse it without reading
//! further. Sizes that would succeed by committing gigabytes of host memory are left out (a
//! size is either small or past what the host has), so an input runs in milliseconds.
//!
//! The C API's sources are compiled into this target (as in `capi_handles`).

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

use std::ffi::CString;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

use device::{udma_cost_model, udma_device, udma_device_open_loopback, udma_loopback_options};
use error::udma_status::{self, *};
use memory::*;
use pipeline::*;
use plan::*;
use queue::*;
use streams::*;

/// Elements of a real array at most.
const SMALL: u64 = 64;

/// A count: small (a real array of that many) or past every limit (an array of one).
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Count {
    Small(u8),
    Huge(u64),
}

impl Count {
    /// The count passed, and the elements the array really has.
    fn resolve(self) -> (usize, usize) {
        match self {
            Count::Small(n) => {
                let n = u64::from(n) % (SMALL + 1);
                (n as usize, n as usize)
            }
            // Past the most live handles (2^24) and the most tensors a plan takes (2^20).
            Count::Huge(n) => ((n | (1 << 40)) as usize, 1),
        }
    }

    fn is_huge(self) -> bool {
        matches!(self, Count::Huge(_))
    }
}

/// Bytes: small (up to 64 KiB) or past what the host has (at least 2^40).
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Bytes {
    Small(u16),
    Huge(u64),
    Zero,
}

impl Bytes {
    fn get(self) -> u64 {
        match self {
            Bytes::Small(n) => u64::from(n) + 1,
            Bytes::Huge(n) => n | (1 << 40),
            Bytes::Zero => 0,
        }
    }
}

#[derive(Debug, Arbitrary)]
struct TensorArgs {
    bytes: Bytes,
    offset: u64,
    first: u8,
    last: u8,
    kind: u32,
    flags: u32,
    inplace: u32,
    input: Option<u8>,
}

#[derive(Debug, Arbitrary)]
enum Call {
    Chain {
        layers: u32,
        bytes: Bytes,
        depth: u32,
        batch: u32,
        queue: u32,
        flags: u32,
        results: u32,
        timeout_ns: u64,
        working_set: (u64, u64),
    },
    Yolo {
        detections: u32,
    },
    Plan {
        tensors: Vec<TensorArgs>,
        count: Count,
        align: u64,
        search_nodes: u16,
        strategy: u32,
        flags: u32,
    },
    PoolCreate {
        bytes: Bytes,
        page_size: u32,
        wait_us: u16,
        flags: u32,
    },
    Alloc {
        len: u64,
    },
    AllocBulk {
        len: u64,
        count: Count,
    },
    FreeBulk {
        count: Count,
    },
    Queue {
        depth: u32,
        index: u32,
        unit: u32,
        flags: u32,
        wait: Count,
    },
    Streams {
        count: Count,
        policy: u32,
        batch_k: u32,
        in_flight: u32,
        period_ns: u64,
        max_wait_ns: u64,
        priority: u32,
    },
}

/// One zero-cost loopback device for the whole run, with room for the queues asked for.
fn device() -> *mut udma_device {
    static DEVICE: OnceLock<usize> = OnceLock::new();
    let addr = *DEVICE.get_or_init(|| {
        let options = udma_loopback_options {
            size: size_of::<udma_loopback_options>(),
            cost_model: udma_cost_model::UDMA_COST_ZERO as u32,
            memory_bytes: 4 << 20,
            queues: 8,
            max_depth: 1024,
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

/// A 4 MiB pool on the device for the whole run.
fn pool() -> *mut udma_pool {
    static POOL: OnceLock<usize> = OnceLock::new();
    let addr = *POOL.get_or_init(|| {
        let options = udma_pool_options {
            size: size_of::<udma_pool_options>(),
            bytes: 4 << 20,
            ..udma_pool_options::default()
        };
        let mut pool = null_mut();
        // SAFETY: a live device, a whole options struct, a writable pointer.
        let s = unsafe { udma_pool_create(device(), &options, &mut pool) };
        assert_eq!(s, UDMA_OK, "{}", last_error());
        pool as usize
    });
    addr as *mut udma_pool
}

fn last_error() -> String {
    // SAFETY: a NUL-terminated string, valid until the next failing call; copied at once.
    unsafe { std::ffi::CStr::from_ptr(error::udma_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A status, never the one a panic gives; `refused`: the call must have failed.
#[track_caller]
fn status(s: udma_status, what: &str, refused: bool) {
    assert_ne!(s, UDMA_ERR_INTERNAL, "{what}: {}", last_error());
    if refused {
        assert_ne!(s, UDMA_OK, "{what} must be refused");
        assert!(!last_error().is_empty(), "{what}: no message");
    }
}

/// A pipeline for a chain model of `layers` x `bytes` on the shared device, with `options`.
fn pipeline_of(model: *mut udma_model, options: &udma_pipeline_options) -> *mut udma_pipeline {
    let mut p = null_mut();
    // SAFETY: live handles, a whole options struct, a writable pointer.
    let s = unsafe { udma_pipeline_create(device(), model, options, &mut p) };
    status(s, "udma_pipeline_create", false);
    if s == UDMA_OK {
        p
    } else {
        assert!(p.is_null());
        null_mut()
    }
}

fn small_model() -> *mut udma_model {
    let mut m = null_mut();
    // SAFETY: a writable pointer.
    let s = unsafe { udma_model_create_chain(2, 1024, &mut m) };
    assert_eq!(s, UDMA_OK, "{}", last_error());
    m
}

fn run(call: Call) {
    match call {
        Call::Chain {
            layers,
            bytes,
            depth,
            batch,
            queue,
            flags,
            results,
            timeout_ns,
            working_set,
        } => {
            let mut m = null_mut();
            // SAFETY: a writable pointer.
            let s = unsafe { udma_model_create_chain(layers, bytes.get(), &mut m) };
            status(s, "udma_model_create_chain", layers > 4096);
            if s != UDMA_OK {
                assert!(m.is_null());
                return;
            }
            let mut info = udma_model_info {
                size: size_of::<udma_model_info>(),
                ..udma_model_info::default()
            };
            // SAFETY: a live model, a whole info struct.
            let s = unsafe { udma_model_get_info(m, &mut info) };
            assert_eq!(s, UDMA_OK, "{}", last_error());
            // The host's copy of the result: only where it is small or cannot be had.
            let arena = info.arena_bytes;
            if arena <= 1 << 20 || arena >= 1 << 40 {
                let input = vec![0u8; info.input_bytes.min(1 << 20) as usize];
                let mut result = vec![0u8; info.result_bytes.min(1 << 20) as usize];
                // SAFETY: the lengths are the vectors'.
                let s = unsafe {
                    udma_model_expected(
                        m,
                        input.as_ptr().cast(),
                        input.len(),
                        result.as_mut_ptr().cast(),
                        result.len(),
                    )
                };
                status(s, "udma_model_expected", arena >= 1 << 40);
            }
            // Pipelines whose memory is small, or more than the device has.
            let per_slot = info.input_bytes.saturating_add(info.result_bytes);
            let slots = u64::from(depth.min(2048).max(1));
            let host = per_slot.saturating_mul(slots);
            if (host <= 4 << 20 && arena <= 4 << 20) || arena >= 1 << 40 {
                let options = udma_pipeline_options {
                    size: size_of::<udma_pipeline_options>(),
                    depth,
                    batch,
                    queue: queue % 10,
                    context: 1,
                    flags,
                    results,
                    timeout_ns,
                    working_set_private: working_set.0,
                    working_set_shared: working_set.1,
                    ..udma_pipeline_options::default()
                };
                let p = pipeline_of(m, &options);
                if !p.is_null() {
                    // SAFETY: a live pipeline, destroyed once.
                    let s = unsafe { udma_pipeline_destroy(p) };
                    assert_eq!(s, UDMA_OK, "{}", last_error());
                }
            }
            // SAFETY: a live model, destroyed once.
            assert_eq!(unsafe { udma_model_destroy(m) }, UDMA_OK);
        }
        Call::Yolo { detections } => {
            let mut m = null_mut();
            // SAFETY: a writable pointer.
            let s = unsafe { udma_model_create_yolov5s(detections, &mut m) };
            status(s, "udma_model_create_yolov5s", detections > 25_200);
            if s == UDMA_OK {
                // SAFETY: a live model, destroyed once.
                assert_eq!(unsafe { udma_model_destroy(m) }, UDMA_OK);
            }
        }
        Call::Plan {
            tensors,
            count,
            align,
            search_nodes,
            strategy,
            flags,
        } => {
            let (count, real) = count.resolve();
            let op = CString::new("Add").unwrap();
            let inputs: Vec<u64> = tensors
                .iter()
                .map(|t| u64::from(t.input.unwrap_or(0)))
                .collect();
            let list: Vec<udma_tensor> = (0..real.max(1))
                .map(|i| {
                    let t = tensors.get(i);
                    udma_tensor {
                        size: size_of::<udma_tensor>(),
                        id: i as u64,
                        bytes: t.map_or(64, |t| t.bytes.get()),
                        offset: t.map_or(0, |t| t.offset),
                        first: t.map_or(0, |t| u32::from(t.first)),
                        last: t.map_or(0, |t| u32::from(t.last)),
                        kind: t.map_or(0, |t| t.kind),
                        flags: t.map_or(0, |t| t.flags),
                        op: if t.is_some_and(|t| t.input.is_some()) {
                            op.as_ptr()
                        } else {
                            null()
                        },
                        inputs: if t.is_some_and(|t| t.input.is_some()) {
                            &inputs[i]
                        } else {
                            null()
                        },
                        input_count: u32::from(t.is_some_and(|t| t.input.is_some())),
                        inplace: t.map_or(0, |t| t.inplace),
                    }
                })
                .collect();
            let options = udma_plan_options {
                size: size_of::<udma_plan_options>(),
                align,
                search_nodes: u64::from(search_nodes),
                strategy,
                flags,
            };
            let mut plan = null_mut();
            // SAFETY: `list` holds `count` elements, or the count is past every limit (and
            // must be refused before the second is read); a whole options struct.
            let s = unsafe { udma_plan_create(list.as_ptr(), count, &options, &mut plan) };
            status(s, "udma_plan_create", real < count);
            if s == UDMA_OK {
                let mut offsets = vec![0u64; count];
                // SAFETY: `count` writable offsets.
                let s = unsafe { udma_plan_offsets(plan, offsets.as_mut_ptr(), count) };
                assert_eq!(s, UDMA_OK, "{}", last_error());
                // SAFETY: a live plan, destroyed once.
                assert_eq!(unsafe { udma_plan_destroy(plan) }, UDMA_OK);
            }
        }
        Call::PoolCreate {
            bytes,
            page_size,
            wait_us,
            flags,
        } => {
            let huge = matches!(bytes, Bytes::Huge(_));
            let options = udma_pool_options {
                size: size_of::<udma_pool_options>(),
                // Up to 4 MiB, or past what the host has.
                bytes: match bytes {
                    Bytes::Small(n) => u64::from(n) * 64,
                    other => other.get(),
                },
                page_size,
                wait_us: u32::from(wait_us),
                flags,
                ..udma_pool_options::default()
            };
            let mut p = null_mut();
            // SAFETY: a live device, a whole options struct, a writable pointer.
            let s = unsafe { udma_pool_create(device(), &options, &mut p) };
            status(s, "udma_pool_create", huge);
            if s == UDMA_OK {
                // SAFETY: a live pool, destroyed once.
                assert_eq!(unsafe { udma_pool_destroy(p) }, UDMA_OK);
            }
        }
        Call::Alloc { len } => {
            let mut b = null_mut();
            // SAFETY: a live pool, a writable pointer.
            let s = unsafe { udma_pool_alloc(pool(), len, &mut b) };
            status(s, "udma_pool_alloc", len > 4 << 20);
            if s == UDMA_OK {
                // SAFETY: a live buffer of this pool, freed once.
                assert_eq!(unsafe { udma_pool_free(pool(), b) }, UDMA_OK);
            }
        }
        Call::AllocBulk { len, count } => {
            let (count, real) = count.resolve();
            let mut out = vec![null_mut::<udma_buffer>(); real.max(1)];
            // SAFETY: `out` has `count` slots, or the count is past every limit (refused
            // before a slot is written).
            let s = unsafe { udma_pool_alloc_bulk(pool(), len, count, out.as_mut_ptr()) };
            status(s, "udma_pool_alloc_bulk", real < count);
            if s == UDMA_OK {
                // SAFETY: the `count` buffers just allocated, freed once.
                let s = unsafe { udma_pool_free_bulk(pool(), out.as_ptr(), count) };
                assert_eq!(s, UDMA_OK, "{}", last_error());
            } else {
                assert!(out.iter().all(|b| b.is_null()), "a failed bulk call wrote");
            }
        }
        Call::FreeBulk { count } => {
            let (count, real) = count.resolve();
            let list = vec![null_mut::<udma_buffer>(); real.max(1)];
            // SAFETY: `list` holds `count` handles (all NULL), or the count is past every
            // limit (refused before the list is read).
            let s = unsafe { udma_pool_free_bulk(pool(), list.as_ptr(), count) };
            status(s, "udma_pool_free_bulk", count > 0);
        }
        Call::Queue {
            depth,
            index,
            unit,
            flags,
            wait,
        } => {
            let options = udma_queue_options {
                size: size_of::<udma_queue_options>(),
                depth,
                index,
                context: 7,
                unit,
                flags,
                ..udma_queue_options::default()
            };
            let mut q = null_mut();
            // SAFETY: a live device, a whole options struct, a writable pointer.
            let s = unsafe { udma_queue_create(device(), &options, &mut q) };
            status(s, "udma_queue_create", depth > 1024 || index >= 8);
            if s != UDMA_OK {
                return;
            }
            let (count, real) = wait.resolve();
            let list = vec![q; real.max(1)];
            let mut ready = 0usize;
            // SAFETY: `list` holds `count` queue handles, or the count is past every limit
            // (refused before the list is read).
            let s = unsafe { udma_queue_wait_any(list.as_ptr(), count, 0, &mut ready) };
            // Nothing in flight: a timeout at best; the same queue twice is refused.
            status(s, "udma_queue_wait_any", true);
            // SAFETY: a live queue, destroyed once.
            assert_eq!(unsafe { udma_queue_destroy(q) }, UDMA_OK);
        }
        Call::Streams {
            count,
            policy,
            batch_k,
            in_flight,
            period_ns,
            max_wait_ns,
            priority,
        } => {
            let (count, real) = count.resolve();
            // At most two real pipelines (each holds device memory and queues).
            let (count, real) = if real > 2 { (2, 2) } else { (count, real) };
            let model = small_model();
            let names: Vec<CString> = (0..real.max(1))
                .map(|i| CString::new(format!("s{}", i % 2)).unwrap())
                .collect();
            let list: Vec<udma_stream_options> = (0..real.max(1))
                .map(|i| {
                    let options = udma_pipeline_options {
                        size: size_of::<udma_pipeline_options>(),
                        queue: 3 * i as u32,
                        context: i as u32 + 1,
                        ..udma_pipeline_options::default()
                    };
                    udma_stream_options {
                        size: size_of::<udma_stream_options>(),
                        name: names[i].as_ptr(),
                        pipeline: if i < real {
                            pipeline_of(model, &options)
                        } else {
                            null_mut()
                        },
                        period_ns,
                        max_wait_ns,
                        priority,
                        ..udma_stream_options::default()
                    }
                })
                .collect();
            let options = udma_streams_options {
                size: size_of::<udma_streams_options>(),
                policy,
                batch_k,
                in_flight,
                ..udma_streams_options::default()
            };
            let mut out = null_mut();
            // SAFETY: `list` holds `count` streams, or the count is past every limit
            // (refused before the list is read).
            let s = unsafe { udma_streams_create(&options, list.as_ptr(), count, &mut out) };
            status(s, "udma_streams_create", real < count);
            if s == UDMA_OK {
                // SAFETY: live streams, destroyed once (their pipelines with them).
                assert_eq!(unsafe { udma_streams_destroy(out) }, UDMA_OK);
            } else {
                for stream in &list[..real] {
                    if !stream.pipeline.is_null() {
                        // SAFETY: the pipeline is still the caller's after a refusal.
                        let s = unsafe { udma_pipeline_destroy(stream.pipeline) };
                        assert_eq!(s, UDMA_OK, "{}", last_error());
                    }
                }
            }
            // SAFETY: a live model, destroyed once.
            assert_eq!(unsafe { udma_model_destroy(model) }, UDMA_OK);
        }
    }
}

fuzz_target!(|calls: Vec<Call>| {
    for call in calls.into_iter().take(16) {
        run(call);
    }
});
