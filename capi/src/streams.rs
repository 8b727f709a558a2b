//! Streams: several pipelines on a device under a scheduler (`udma_streams`). Each stream
//! has a priority, an arrival process (periodic, or as fast as possible) and an optional
//! maximum wait; each time the device can take a frame the scheduler picks whose, the
//! caller's preprocess callback writes it, and its postprocess callback gets the result.
//! A run reports per stream what it did (`udma_stream_report`).

use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use userdma_infer::pipeline::Pipeline;
use userdma_infer::sched::streams::{Arrivals, RunReport, Stream, Streams};
use userdma_infer::sched::{Policy, StreamSpec, MAX_STREAMS};
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi;
use crate::device::Device;
use crate::error::{call, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};
use crate::pipeline::{
    fill, finish, not_in_callback, udma_frame_input, udma_frame_output, udma_pipeline, PIPELINES,
};

/// Streams of pipelines under a scheduler, made by `udma_streams_create` (which takes the
/// pipelines over), destroyed by `udma_streams_destroy`.
#[derive(Debug)]
pub struct udma_streams {
    _opaque: [u8; 0],
}

struct StreamsEntry {
    /// `None` once destroyed.
    streams: Mutex<Option<Streams>>,
    count: usize,
    /// Keep the devices open for as long as the streams.
    _devices: Vec<Arc<Device>>,
}

impl StreamsEntry {
    fn lock(&self) -> MutexGuard<'_, Option<Streams>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

static STREAMS: Registry<Arc<StreamsEntry>> = Registry::new(Kind::Streams);

/// `udma_streams_options.policy`: how the next stream is chosen.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum udma_policy {
    /// One frame per stream in turn, priorities ignored (the default).
    UDMA_POLICY_ROUND_ROBIN = 0,
    /// The highest priority first, equal priorities in turn; lower streams can starve.
    UDMA_POLICY_STRICT_PRIORITY = 1,
    /// Priority with batch switching: a stream keeps the device for up to `batch_k` frames
    /// while another waits, then a waiting lower stream gets a batch; none starves.
    UDMA_POLICY_BATCH = 2,
}

/// How to schedule the streams. Zero is the default for every field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_streams_options {
    /// `sizeof(udma_streams_options)`.
    pub size: usize,
    /// A `udma_policy`; 0: round-robin.
    pub policy: u32,
    /// Frames per batch under `UDMA_POLICY_BATCH` (at least 1).
    pub batch_k: u32,
    /// Frames on each device at once; 0: 1 (the scheduler decides every frame as the device
    /// becomes free, so its wait bounds hold).
    pub in_flight: u32,
    /// Zero.
    pub reserved: u32,
}

abi::sized!(udma_streams_options);

/// One stream (`udma_streams_create` takes an array of them). Zero is the default for every
/// field but `name` and `pipeline`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct udma_stream_options {
    /// `sizeof(udma_stream_options)`.
    pub size: usize,
    /// Its name in reports and messages, unique among the streams (copied).
    pub name: *const c_char,
    /// The pipeline its frames run through, with nothing in flight: the streams take it
    /// over (its handle is destroyed when `udma_streams_create` succeeds). The stream runs in
    /// the pipeline's device context.
    pub pipeline: *mut udma_pipeline,
    /// One frame every `period_ns` nanoseconds from the start of a run (a camera); 0: the
    /// next frame is ready as soon as the previous one is dispatched (a file played back).
    pub period_ns: u64,
    /// A frame that has waited this long runs next, whatever its priority; 0: no maximum.
    pub max_wait_ns: u64,
    /// Higher runs first, 0 to 255.
    pub priority: u32,
    /// Zero.
    pub reserved: u32,
}

impl Default for udma_stream_options {
    fn default() -> udma_stream_options {
        udma_stream_options {
            size: 0,
            name: std::ptr::null(),
            pipeline: std::ptr::null_mut(),
            period_ns: 0,
            max_wait_ns: 0,
            priority: 0,
            reserved: 0,
        }
    }
}

// SAFETY: `repr(C)`, two raw pointers (any bit pattern is a valid raw pointer value; the name
// is read as a C string, the pipeline is a handle, never dereferenced) and integers,
// 8 * 5 + 4 + 4 = 48 bytes with no padding.
unsafe impl abi::Bytes for udma_stream_options {}
abi::sized!(udma_stream_options);

/// What one stream did in a run (`udma_streams_run`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_stream_report {
    /// `sizeof(udma_stream_report)`.
    pub size: usize,
    /// Frames finished.
    pub frames: u64,
    /// Frames the device failed.
    pub failed: u64,
    /// Frames that arrived while 256 of its frames were waiting, never run.
    pub dropped: u64,
    /// Frames that had arrived but were still waiting when the run ended.
    pub left_waiting: u64,
    /// Frames finished per second of the run.
    pub fps: f64,
    /// Mean latency from arrival to the result handed over, in ns.
    pub latency_mean_ns: f64,
    /// Its median.
    pub latency_p50_ns: u64,
    /// Its 99th percentile.
    pub latency_p99_ns: u64,
    /// Its maximum.
    pub latency_max_ns: u64,
    /// The longest wait from arrival to dispatch, in ns.
    pub max_wait_ns: u64,
    /// Frames in flight when its device failed and was recovered (or removed), never
    /// finished. A program built against a header without it passes a smaller size
    /// and does not get it.
    pub lost: u64,
}

abi::sized!(udma_stream_report);

/// What a whole run did (`udma_streams_run`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, Immutable)]
pub struct udma_run_report {
    /// `sizeof(udma_run_report)`.
    pub size: usize,
    /// Seconds it ran (the duration, plus draining the frames in flight).
    pub seconds: f64,
    /// Context switches the schedulers' decisions caused.
    pub switches: u64,
    /// Decisions made.
    pub decisions: u64,
    /// Device faults the run survived (a device reset and its pipelines recovered, or a
    /// device removed and its streams stopped while the others went on).
    pub faults: u64,
    /// Of those, devices removed.
    pub removals: u64,
    /// Of those, devices quarantined: they kept failing (5 faults in a row, or 6 resets of
    /// one fault that failed), and their streams get no more frames, in this run or the next.
    /// A program built against a header without it passes a smaller size and does not get
    /// it.
    pub quarantines: u64,
}

abi::sized!(udma_run_report);

/// Writes a dispatched frame's input (`udma_streams_run`): `input` is valid during the call.
pub type udma_preprocess_fn = Option<
    unsafe extern "C" fn(user: *mut c_void, stream: u32, frame: u64, input: *mut udma_frame_input),
>;

/// Takes a stream's finished frame (`udma_streams_run`): `output` is valid during the call.
pub type udma_postprocess_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, stream: u32, output: *const udma_frame_output)>;

/// The stride of a caller's array of size-prefixed structs: the first element's size, which
/// every element must declare.
///
/// # Safety
/// `first` is non-null and points to a readable `size_t`.
unsafe fn stride<T>(first: *const T, what: &str) -> Result<usize, Fail> {
    // SAFETY: the caller's promise; unaligned for safety.
    let size = unsafe { first.cast::<usize>().read_unaligned() };
    if size < std::mem::size_of::<usize>() {
        return Err(Fail::invalid(format!(
            "{what}[0].size is {size}: set each element's size to sizeof its struct"
        )));
    }
    Ok(size)
}

fn policy(o: &udma_streams_options) -> Result<Policy, Fail> {
    match o.policy {
        0 => Ok(Policy::RoundRobin),
        1 => Ok(Policy::StrictPriority),
        2 if o.batch_k == 0 => Err(Fail::invalid(
            "UDMA_POLICY_BATCH with batch_k 0: batch_k is how many frames a stream runs \
             before another may, give at least 1",
        )),
        2 => Ok(Policy::Batch { k: o.batch_k }),
        other => Err(Fail::invalid(format!(
            "policy {other} is not a udma_policy (UDMA_POLICY_ROUND_ROBIN 0, \
             UDMA_POLICY_STRICT_PRIORITY 1, UDMA_POLICY_BATCH 2)"
        ))),
    }
}

/// Makes streams of `count` pipelines under one scheduler per device (`options` may be
/// NULL: round-robin, one frame in flight). On success every pipeline handle in `streams`
/// is destroyed: the streams own the pipelines. On a refused argument they stay the
/// caller's.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for no streams or more than 64, a NULL, empty or
/// duplicate name, a priority above 255, a pipeline listed twice, a bad policy, or
/// `batch_k` 0 under `UDMA_POLICY_BATCH`; `UDMA_ERR_INVALID_HANDLE` for a pipeline handle
/// that is not live; `UDMA_ERR_BUSY` for a pipeline with frames in flight.
///
/// # Safety
/// `options` is NULL or points to `options->size` readable bytes; `streams` to `count`
/// structs of `streams[0].size` bytes each, their names NUL-terminated strings; `out` to a
/// writable `udma_streams *`.
#[no_mangle]
pub unsafe extern "C" fn udma_streams_create(
    options: *const udma_streams_options,
    streams: *const udma_stream_options,
    count: usize,
    out: *mut *mut udma_streams,
) -> udma_status {
    call("udma_streams_create", || {
        not_in_callback()?;
        let out = abi::out(out, "out")?;
        let o = if options.is_null() {
            udma_streams_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_streams_options::default())? }
        };
        let policy = policy(&o)?;
        if streams.is_null() {
            return Err(Fail::null("streams"));
        }
        if count == 0 || count > MAX_STREAMS {
            return Err(Fail::invalid(format!(
                "count is {count}: give 1 to {MAX_STREAMS} streams (one scheduler per device \
                 takes at most {MAX_STREAMS})"
            )));
        }
        // SAFETY: non-null, and its first element readable per this function's contract.
        let stride = unsafe { stride(streams, "streams")? };
        let mut specs = Vec::with_capacity(count);
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: `count` elements of `stride` bytes per this function's contract.
            let at = unsafe { streams.cast::<u8>().add(i * stride) }.cast::<udma_stream_options>();
            // SAFETY: as above: `stride` readable bytes at `at`, its declared size.
            let s = unsafe { abi::read(at, "streams[i]", udma_stream_options::default()) }
                .map_err(|f| f.context(format!("streams[{i}]")))?;
            if s.name.is_null() {
                return Err(Fail::invalid(format!(
                    "streams[{i}].name is NULL: name every stream"
                )));
            }
            // SAFETY: non-null and NUL-terminated per this function's contract.
            let name = unsafe { CStr::from_ptr(s.name) }
                .to_string_lossy()
                .into_owned();
            if name.is_empty() {
                return Err(Fail::invalid(format!(
                    "streams[{i}].name is empty: name every stream, reports use the names"
                )));
            }
            if let Some(j) = specs
                .iter()
                .position(|(n, ..): &(String, _, _, _)| *n == name)
            {
                return Err(Fail::invalid(format!(
                    "streams[{j}] and streams[{i}] are both named {name:?}: give each its own"
                )));
            }
            let priority = u8::try_from(s.priority).map_err(|_| {
                Fail::invalid(format!(
                    "streams[{i}].priority is {}: use 0 to 255",
                    s.priority
                ))
            })?;
            let entry = PIPELINES
                .with(s.pipeline, |_, p| Ok(Arc::clone(p)))
                .map_err(|f| f.context(format!("streams[{i}].pipeline")))?;
            if entries.iter().any(|e: &Arc<_>| Arc::ptr_eq(e, &entry)) {
                return Err(Fail::invalid(format!(
                    "streams[{i}].pipeline is listed twice: give each stream its own pipeline"
                )));
            }
            let in_flight = entry.lock().as_ref().map_or(0, Pipeline::in_flight);
            if in_flight > 0 {
                return Err(Fail::new(
                    udma_status::UDMA_ERR_BUSY,
                    format!(
                        "streams[{i}]: {} has {in_flight} frames in flight: take them first \
                         (udma_pipeline_wait)",
                        entry.name
                    ),
                ));
            }
            let arrivals = match s.period_ns {
                0 => Arrivals::Asap,
                period => Arrivals::Periodic { period },
            };
            specs.push((name, priority, arrivals, s.max_wait_ns));
            entries.push(entry);
        }
        // Every check passed: take the pipelines over.
        let mut list = Vec::with_capacity(count);
        let mut devices = Vec::with_capacity(count);
        for (i, ((name, priority, arrivals, max_wait), entry)) in
            specs.into_iter().zip(&entries).enumerate()
        {
            // SAFETY: `count` elements of `stride` bytes per this function's contract.
            let at = unsafe { streams.cast::<u8>().add(i * stride) }.cast::<udma_stream_options>();
            // SAFETY: read above already.
            let s = unsafe { abi::read(at, "streams[i]", udma_stream_options::default())? };
            drop(PIPELINES.remove_if(s.pipeline, |_| Ok(()))?);
            let pipeline = entry.lock().take().ok_or_else(|| {
                Fail::handle(format!("{} was destroyed during this call", entry.name))
            })?;
            let mut spec = StreamSpec::new(name, priority, pipeline.config().context);
            if max_wait != 0 {
                spec = spec.with_max_wait(max_wait);
            }
            list.push(Stream {
                spec,
                arrivals,
                pipeline,
            });
            devices.extend(entry.device.clone());
        }
        let in_flight = if o.in_flight == 0 {
            1
        } else {
            o.in_flight as usize
        };
        let made = Streams::new(policy, list, in_flight).map_err(Fail::from)?;
        let key = STREAMS.insert(Arc::new(StreamsEntry {
            streams: Mutex::new(Some(made)),
            count,
            _devices: devices,
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::Streams)) };
        Ok(())
    })
}

fn report(r: &RunReport, i: usize) -> udma_stream_report {
    let s = &r.streams[i];
    udma_stream_report {
        size: 0,
        frames: s.frames,
        failed: s.failed,
        dropped: s.dropped,
        left_waiting: s.left_waiting,
        fps: s.fps,
        latency_mean_ns: s.latency_mean_ns,
        latency_p50_ns: s.latency_p50_ns,
        latency_p99_ns: s.latency_p99_ns,
        latency_max_ns: s.latency_max_ns,
        max_wait_ns: s.max_wait_ns,
        lost: s.lost,
    }
}

/// Runs the streams for `duration_ns`: frames arrive, each device's scheduler picks whose
/// frame goes whenever the device can take one, `preprocess(user, stream, frame, input)`
/// writes it (may be NULL: the slot's input stays as it was), `postprocess(user, stream,
/// output)` gets each result (may be NULL: results are dropped); then the frames in flight
/// are drained. `stream` is the index in the array given to `udma_streams_create`. Fills
/// `reports[0..count]` (`count` the number of streams; `reports` may be NULL with `count`
/// 0) and `*run` (may be NULL). The counts start again at every run. Both callbacks must
/// return normally (see the callbacks note in the header).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a `count` other than 0 or the number of
/// streams; `UDMA_ERR_TIMEOUT` or `UDMA_ERR_DEVICE` for a device that stopped answering.
///
/// # Safety
/// The callbacks are safe to call with `user`; `reports` points to `count` structs of
/// `reports[0].size` bytes each; `run` is NULL or points to `run->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_streams_run(
    streams: *mut udma_streams,
    duration_ns: u64,
    preprocess: udma_preprocess_fn,
    postprocess: udma_postprocess_fn,
    user: *mut c_void,
    reports: *mut udma_stream_report,
    count: usize,
    run: *mut udma_run_report,
) -> udma_status {
    call("udma_streams_run", || {
        not_in_callback()?;
        let entry = STREAMS.with(streams, |_, s| Ok(Arc::clone(s)))?;
        if count != 0 && count != entry.count {
            return Err(Fail::invalid(format!(
                "count is {count} but there are {} streams: pass a report for each (or 0 \
                 and NULL for none)",
                entry.count
            )));
        }
        if count != 0 && reports.is_null() {
            return Err(Fail::null("reports"));
        }
        let stride = if count == 0 {
            0
        } else {
            // SAFETY: non-null with `count` elements per this function's contract.
            unsafe { stride(reports.cast_const(), "reports")? }
        };
        let mut guard = entry.lock();
        let s = guard
            .as_mut()
            .ok_or_else(|| Fail::handle("the streams were destroyed during this call"))?;
        let result = s.run(
            Duration::from_nanos(duration_ns),
            |id, n, input| {
                if let Some(f) = preprocess {
                    // SAFETY: the caller's promise: `preprocess` may be called with `user`;
                    // the view lives for the call.
                    fill(input, n, |view| unsafe { f(user, id.0 as u32, n, view) });
                }
                Ok(())
            },
            |id, done| {
                if let Some(f) = postprocess {
                    // SAFETY: as above, for `postprocess`.
                    finish(&done, |view| unsafe { f(user, id.0 as u32, view) });
                }
            },
        );
        let r = result.map_err(lib)?;
        for i in 0..count {
            // SAFETY: `count` elements of `stride` bytes per this function's contract.
            let at = unsafe { reports.cast::<u8>().add(i * stride) }.cast::<udma_stream_report>();
            // SAFETY: as above; each element declares its own size.
            unsafe { abi::write(at, "reports[i]", report(&r, i)) }
                .map_err(|f| f.context(format!("reports[{i}]")))?;
        }
        if !run.is_null() {
            let value = udma_run_report {
                size: 0,
                seconds: r.seconds,
                switches: r.switches,
                decisions: r.decisions,
                faults: r.faults.len() as u64,
                removals: r.faults.iter().filter(|f| f.removed).count() as u64,
                quarantines: r.faults.iter().filter(|f| f.quarantined).count() as u64,
            };
            // SAFETY: non-null; writable per this function's contract.
            unsafe { abi::write(run, "run", value)? };
        }
        Ok(())
    })
}

/// Drains the streams' pipelines (results discarded), gives their buffers back and destroys
/// the streams. The handle is invalid from then on, even when a drain fails.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_streams_destroy(streams: *mut udma_streams) -> udma_status {
    call("udma_streams_destroy", || {
        not_in_callback()?;
        let entry = STREAMS.remove_if(streams, |_| Ok(()))?;
        let Some(s) = entry.lock().take() else {
            return Ok(());
        };
        let mut first = Ok(());
        for stream in s.into_streams() {
            let name = stream.spec.name.clone();
            if let Err(e) = stream.pipeline.shutdown(|_| {}) {
                if first.is_ok() {
                    first = Err(lib(e).context(format!("stream {name:?}")));
                }
            }
        }
        first
    })
}
