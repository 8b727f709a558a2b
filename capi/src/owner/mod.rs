//! A client of a device owner (`userdma serve`) from C (`udma_owner_client`): connect, declare
//! streams, allocate input and result buffers from the pool the owner made for this client,
//! submit frames by their buffers' offsets, take their completions, read the owner's figures
//! and events. Only the client is linked: the owner is another process.
//!
//! The handle holds the `userdma_owner::Client` and the buffers C allocated, by their offset in
//! the pool (each an `OwnedBuffer`, which keeps the pool mapped). It also remembers the spans
//! of the frames in flight, so that a buffer the device may still write is never freed:
//! `udma_owner_free` refuses it with `UDMA_ERR_BUSY` until its frame's completion is taken. A
//! completion is matched to its submission by stream and tag. Calls on one client are
//! serialized by a mutex, which a wait holds while it sleeps.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use udma::pool::OwnedBuffer;
use userdma_owner::chan::{self, Completion};
use userdma_owner::{proto, Client, Event, Options, Span, Stream, StreamDecl};

use crate::abi;
use crate::device::timeout;
use crate::error::{call, for_c, lib, udma_status, Fail};
use crate::handle::{Kind, Registry};

mod frames;
mod stats;
mod types;
pub use frames::*;
pub use stats::*;
pub use types::*;

/// What a `udma_owner_client` handle holds.
struct ClientEntry {
    /// `None` once disconnected.
    state: Mutex<Option<State>>,
    /// The owner's socket, for messages.
    socket: String,
}

/// A connected client and what the C side has of it.
struct State {
    client: Client,
    /// The streams declared and not closed.
    streams: Vec<Stream>,
    /// The buffers `udma_owner_alloc` gave, by offset in the pool.
    buffers: HashMap<u64, OwnedBuffer>,
    /// The frames submitted whose completions were not taken, oldest first.
    pending: Vec<Pending>,
    /// Events taken from the client and not yet handed to C.
    events: VecDeque<Event>,
}

/// A frame submitted and not completed.
struct Pending {
    stream: u32,
    tag: u64,
    /// The input's and the result's bytes `[start, end)` in the pool, when the owner will
    /// take the frame; `None` for a frame it will refuse (an unknown stream, a span outside
    /// the pool), which touches no memory.
    spans: Option<[(u64, u64); 2]>,
}

static CLIENTS: Registry<Arc<ClientEntry>> = Registry::new(Kind::OwnerClient);

/// A client error as C sees it: its code's status, its message (which carries its cause)
/// naming the C calls.
fn fail(error: userdma_owner::Error) -> Fail {
    Fail::new(udma_status::of(error.code()), for_c(error.to_string()))
}

/// A C string argument `what`: non-NULL, UTF-8, 1 to 32 bytes (a name the owner's protocol
/// carries).
///
/// # Safety
/// `ptr` is NULL or a NUL-terminated string.
unsafe fn name(ptr: *const c_char, what: &str) -> Result<String, Fail> {
    if ptr.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    let bytes = unsafe { CStr::from_ptr(ptr) }.to_bytes();
    if bytes.is_empty() || bytes.len() > proto::NAME {
        return Err(Fail::invalid(format!(
            "{what} is {} bytes long: the owner takes names of 1 to {} bytes",
            bytes.len(),
            proto::NAME
        )));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Fail::invalid(format!("{what} is not UTF-8: {e}")))?;
    Ok(text.to_owned())
}

/// The longest path of a Unix socket (`sun_path` without its NUL).
const SOCKET_PATH: usize = 107;

/// The live client `ptr` names, locked, for `f` (its failures say which owner).
fn with_client<R>(
    ptr: *const udma_owner_client,
    f: impl FnOnce(&mut State) -> Result<R, Fail>,
) -> Result<R, Fail> {
    let entry = CLIENTS.with(ptr, |_, e| Ok(Arc::clone(e)))?;
    // A panic while locked (caught at the boundary) leaves the state usable: the client's
    // own calls keep it consistent, and a pending frame at worst stays pending.
    let mut guard = entry.state.lock().unwrap_or_else(PoisonError::into_inner);
    let state = guard.as_mut().ok_or_else(|| {
        Fail::handle("the owner client was disconnected during this call (by another thread)")
    })?;
    f(state).map_err(|f| f.context(format!("owner at {}", entry.socket)))
}

impl State {
    fn pool_len(&self) -> u64 {
        self.client.pool().mapping().len() as u64
    }

    /// The spans a frame of `stream` reads and writes, when it runs: a stream of this
    /// client's and buffers of this library's at least as long as it needs (as
    /// `Client::submit_spans` checks them; the owner's own checks pass for such buffers).
    fn spans(
        &self,
        stream: u32,
        input: Option<Span>,
        result: Option<Span>,
    ) -> Option<[(u64, u64); 2]> {
        let s = self.streams.iter().find(|s| s.id == stream)?;
        let span = |b: Option<Span>, needed: u64| {
            let b = b.filter(|b| b.len >= needed)?;
            Some((b.offset, b.offset.checked_add(needed)?))
        };
        Some([span(input, s.input_bytes)?, span(result, s.result_bytes)?])
    }

    /// Whether a frame in flight may read or write `[start, end)`.
    fn in_flight(&self, start: u64, end: u64) -> bool {
        self.pending
            .iter()
            .filter_map(|p| p.spans)
            .flatten()
            .any(|(s, e)| s < end && start < e)
    }

    /// Takes `c`'s submission off the pending list: the oldest of its stream and tag that the
    /// owner was expected to treat as it did (refuse or take), else the oldest of its stream
    /// and tag.
    fn completed(&mut self, c: &Completion) {
        let refused = c.status == chan::STATUS_REFUSED;
        let same = |p: &Pending| p.stream == c.stream && p.tag == c.tag;
        let at = self
            .pending
            .iter()
            .position(|p| same(p) && p.spans.is_none() == refused)
            .or_else(|| self.pending.iter().position(same));
        if let Some(at) = at {
            self.pending.remove(at);
        }
    }

    /// Takes the events the client has read, and any waiting on its socket.
    fn take_events(&mut self) -> Result<(), Fail> {
        let events = self.client.events().map_err(fail)?;
        self.events.extend(events);
        Ok(())
    }
}

fn completion(c: &Completion) -> udma_owner_completion {
    udma_owner_completion {
        size: 0,
        stream: c.stream,
        status: c.status,
        tag: c.tag,
        latency_ns: c.latency_ns,
        wait_ns: c.wait_ns,
    }
}

/// Connects to the device owner listening at Unix socket `socket` (a path; `userdma serve`
/// prints it) and takes the pool and rings it makes for this client. `options` may be NULL
/// (a 16 MiB pool, the program's name, one try). Disconnect with `udma_owner_disconnect`.
///
/// Errors: `UDMA_ERR_NOT_FOUND` when no owner listens there (within `wait_ns`);
/// `UDMA_ERR_INVALID_ARGUMENT` for a NULL, empty or too long (over 107 bytes) socket path,
/// or a name that is not 1 to 32 bytes of UTF-8; `UDMA_ERR_REFUSED` when the owner does not
/// allow this process's user or group; `UDMA_ERR_BUSY` when it serves its limit of clients;
/// `UDMA_ERR_DEVICE` for a peer that does not speak the owner's protocol;
/// `UDMA_ERR_TIMEOUT` for an owner that did not answer.
///
/// # Safety
/// `socket` is a NUL-terminated string; `options` is NULL or points to `options->size`
/// readable bytes with `name` NULL or a NUL-terminated string; `client` points to a writable
/// `udma_owner_client *`.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_connect(
    socket: *const c_char,
    options: *const udma_owner_options,
    client: *mut *mut udma_owner_client,
) -> udma_status {
    call("udma_owner_connect", || {
        let out = abi::out(client, "client")?;
        if socket.is_null() {
            return Err(Fail::null("socket"));
        }
        // SAFETY: non-null and NUL-terminated per this function's contract.
        let path = unsafe { CStr::from_ptr(socket) }.to_bytes();
        if path.is_empty() || path.len() > SOCKET_PATH {
            return Err(Fail::invalid(format!(
                "socket is a path of {} bytes: a Unix socket's path has 1 to {SOCKET_PATH}",
                path.len()
            )));
        }
        let path = Path::new(OsStr::from_bytes(path));
        let o = if options.is_null() {
            udma_owner_options::default()
        } else {
            // SAFETY: non-null; readable per this function's contract.
            unsafe { abi::read(options, "options", udma_owner_options::default())? }
        };
        let mut opts = Options::default();
        if o.pool_bytes != 0 {
            opts.pool_bytes = o.pool_bytes;
        }
        if !o.name.is_null() {
            // SAFETY: non-null and NUL-terminated per this function's contract.
            opts.name = unsafe { name(o.name, "options->name")? };
        }
        let connected = match timeout(o.wait_ns) {
            Some(wait) if wait.is_zero() => Client::connect(path, &opts),
            Some(wait) => Client::connect_wait(path, &opts, wait),
            // Until an owner answers: an hour at a time (a deadline no clock overflows).
            None => loop {
                match Client::connect_wait(path, &opts, Duration::from_secs(3600)) {
                    Err(userdma_owner::Error::Connect { .. }) => continue,
                    other => break other,
                }
            },
        };
        let connected = connected.map_err(fail)?;
        let key = CLIENTS.insert(Arc::new(ClientEntry {
            state: Mutex::new(Some(State {
                client: connected,
                streams: Vec::new(),
                buffers: HashMap::new(),
                pending: Vec::new(),
                events: VecDeque::new(),
            })),
            socket: path.display().to_string(),
        }))?;
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { out.write(key.to_ptr(Kind::OwnerClient)) };
        Ok(())
    })
}

/// Closes the connection and frees every buffer of the client; the handle is invalid from
/// then on. Frames still in flight run to their end in the owner (which keeps their memory
/// until then); their completions are not delivered. Succeeds also after the owner went away.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_owner_disconnect(client: *mut udma_owner_client) -> udma_status {
    call("udma_owner_disconnect", || {
        let entry = CLIENTS.remove_if(client, |_| Ok(()))?;
        let state = entry
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut state) = state {
            // The buffers go back to the pool before the client unmaps its view of it (each
            // keeps the pool mapped anyway).
            state.buffers.clear();
            drop(state);
        }
        Ok(())
    })
}

/// Declares a stream of frames and fills `*info` with its number and its model's buffer
/// sizes.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a NULL, empty, too long (over 32 bytes) or
/// non-UTF-8 name or model, a priority above 255, or a name this client's streams have
/// already; `UDMA_ERR_NOT_FOUND` for a model the owner does not have (the message lists
/// those it has); `UDMA_ERR_EXHAUSTED` at this client's limit of streams, the owner's (64),
/// or on a device with no queues left for another; `UDMA_ERR_NOT_FOUND` after the owner went
/// away (the message says "the device owner closed the connection").
///
/// # Safety
/// `stream` points to `stream->size` readable bytes, its `name` and `model` NUL-terminated
/// strings; `info` to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_declare(
    client: *mut udma_owner_client,
    stream: *const udma_owner_stream_options,
    info: *mut udma_owner_stream_info,
) -> udma_status {
    call("udma_owner_declare", || {
        // Checked before declaring, so a bad struct does not leave a stream unknown to C.
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", udma_owner_stream_info::default())? };
        // SAFETY: per this function's contract.
        let s = unsafe { abi::read(stream, "stream", udma_owner_stream_options::default())? };
        // SAFETY: NULL or NUL-terminated per this function's contract.
        let stream_name = unsafe { name(s.name, "stream->name")? };
        // SAFETY: as above.
        let model = unsafe { name(s.model, "stream->model")? };
        let priority = u8::try_from(s.priority).map_err(|_| {
            Fail::invalid(format!("stream->priority is {}: use 0 to 255", s.priority))
        })?;
        let mut decl = StreamDecl::new(&stream_name, &model).priority(priority);
        if s.period_ns != 0 {
            decl = decl.period(Duration::from_nanos(s.period_ns));
        }
        if s.max_wait_ns != 0 {
            decl = decl.max_wait(Duration::from_nanos(s.max_wait_ns));
        }
        let declared = with_client(client, |state| {
            let d = state.client.declare(&decl).map_err(fail)?;
            state.streams.push(d.clone());
            Ok(d)
        })?;
        let value = udma_owner_stream_info {
            size: 0,
            stream: declared.id,
            reserved: 0,
            input_bytes: declared.input_bytes,
            result_bytes: declared.result_bytes,
        };
        // SAFETY: per this function's contract (checked above).
        unsafe { abi::write(info, "info", value) }
    })
}

/// Closes stream `stream`: its frames in flight complete first (their completions come as
/// usual, those not yet run with `UDMA_OWNER_STATUS_CLOSED`), then the owner frees its
/// pipeline. Later submissions to it complete with `UDMA_OWNER_STATUS_REFUSED`.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for a stream this client did not declare (or closed
/// already); the owner's refusal; `UDMA_ERR_NOT_FOUND` after the owner went away.
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_owner_close_stream(
    client: *mut udma_owner_client,
    stream: u32,
) -> udma_status {
    call("udma_owner_close_stream", || {
        with_client(client, |state| {
            let at = state
                .streams
                .iter()
                .position(|s| s.id == stream)
                .ok_or_else(|| {
                    Fail::invalid(format!(
                        "stream {stream} is not one of this client's (declared and not closed)"
                    ))
                })?;
            let s = state.streams[at].clone();
            state.client.close_stream(&s).map_err(fail)?;
            state.streams.remove(at);
            Ok(())
        })
    })
}

/// The client's state: its number, its pool's bytes, its frames in flight and limits, and
/// whether the owner went away.
///
/// # Safety
/// `info` points to `info->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_get_info(
    client: *const udma_owner_client,
    info: *mut udma_owner_info,
) -> udma_status {
    call("udma_owner_get_info", || {
        let value = with_client(client, |state| {
            let c = &state.client;
            Ok(udma_owner_info {
                size: 0,
                client: c.id(),
                pool_bytes: state.pool_len(),
                in_flight: c.in_flight(),
                max_in_flight: c.max_in_flight(),
                max_streams: c.max_streams(),
                gone: u32::from(c.is_gone()),
            })
        })?;
        // SAFETY: per this function's contract.
        unsafe { abi::write(info, "info", value) }
    })
}

/// Allocates a buffer of `len` bytes from the client's pool, which the owner maps for the
/// device, and fills `*buffer`: its host address and its offset, which `udma_owner_submit`
/// takes. The buffer is the client's until `udma_owner_free` (or `udma_owner_disconnect`).
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for `len` 0 or above the pool's largest block;
/// `UDMA_ERR_EXHAUSTED` when the pool has no room (free buffers, or connect with a larger
/// `pool_bytes`).
///
/// # Safety
/// `buffer` points to `buffer->size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_alloc(
    client: *mut udma_owner_client,
    len: usize,
    buffer: *mut udma_owner_buffer,
) -> udma_status {
    call("udma_owner_alloc", || {
        // Checked before allocating, so a bad struct loses no buffer.
        // SAFETY: per this function's contract.
        unsafe { abi::declared(buffer.cast_const(), "buffer", "udma_owner_buffer")? };
        with_client(client, |state| {
            let pool = Arc::clone(state.client.pool());
            if len == 0 || len > pool.max_len() {
                return Err(Fail::invalid(format!(
                    "len {len} is out of range: the client's pool gives 1 to {} bytes",
                    pool.max_len()
                )));
            }
            let b = pool.alloc_owned(len).map_err(lib)?;
            let value = udma_owner_buffer {
                size: 0,
                host: b.as_ptr().as_ptr().cast(),
                len: b.len(),
                offset: b.as_buffer().offset() as u64,
            };
            // SAFETY: per this function's contract (its size checked above).
            unsafe { abi::write(buffer, "buffer", value)? };
            state.buffers.insert(value.offset, b);
            Ok(())
        })
    })
}

/// Frees the buffer at `offset` (as `udma_owner_alloc` gave it) back into the client's pool.
///
/// Errors: `UDMA_ERR_INVALID_ARGUMENT` for an offset that is no buffer of this client's (freed
/// already, or never allocated); `UDMA_ERR_BUSY` for a buffer a frame in flight names (take
/// its completion first: the device may still read or write it).
///
/// # Safety
/// None (any value is checked, none is dereferenced).
#[no_mangle]
pub unsafe extern "C" fn udma_owner_free(
    client: *mut udma_owner_client,
    offset: u64,
) -> udma_status {
    call("udma_owner_free", || {
        with_client(client, |state| {
            let Some(b) = state.buffers.get(&offset) else {
                return Err(Fail::invalid(format!(
                    "no buffer of this client's starts at offset {offset:#x}: pass the offset \
                     udma_owner_alloc gave, once"
                )));
            };
            let end = offset.saturating_add(b.capacity() as u64);
            if state.in_flight(offset, end) {
                return Err(Fail::new(
                    udma_status::UDMA_ERR_BUSY,
                    format!(
                        "the buffer at offset {offset:#x} belongs to a frame in flight: take its \
                         completion (udma_owner_wait, udma_owner_poll) before freeing it"
                    ),
                ));
            }
            drop(state.buffers.remove(&offset));
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests;
