//! The owner's figures and events from C (`udma_owner_get_stats`, `udma_owner_next_event`)
//! and the names of completion statuses (`udma_owner_status_name`).

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use userdma_owner::chan;
use userdma_owner::EventKind;

use crate::abi;
use crate::error::{call, cstr, udma_status, Fail};

use super::{
    fail, udma_owner_client, udma_owner_event, udma_owner_event_kind, udma_owner_figures,
    udma_owner_stream_figures, with_client,
};

/// Asks the owner for its figures: fills `streams[0..min(count, capacity)]` with this
/// client's streams' (`count` being how many it has; `streams` may be NULL with `capacity`
/// 0, to learn the count) and `*owner` with the owner's totals (`owner` may be NULL). Sets
/// `*count`.
///
/// Errors: `UDMA_ERR_NOT_FOUND` after the owner went away; `UDMA_ERR_TIMEOUT` when it did not
/// answer.
///
/// # Safety
/// `streams` is NULL (with `capacity` 0) or points to `capacity` structs of `streams[0].size`
/// bytes each; `count` to a writable `size_t`; `owner` is NULL or points to `owner->size`
/// writable bytes.
#[no_mangle]
pub unsafe extern "C" fn udma_owner_get_stats(
    client: *mut udma_owner_client,
    streams: *mut udma_owner_stream_figures,
    capacity: usize,
    count: *mut usize,
    owner: *mut udma_owner_figures,
) -> udma_status {
    call("udma_owner_get_stats", || {
        let count = abi::out(count, "count")?;
        if capacity != 0 && streams.is_null() {
            return Err(Fail::null("streams"));
        }
        let stride = if capacity == 0 {
            0
        } else {
            // SAFETY: non-null with `capacity` elements per this function's contract.
            unsafe {
                abi::declared(
                    streams.cast_const(),
                    "streams",
                    <udma_owner_stream_figures as abi::Sized>::NAME,
                )?
            }
        };
        if !owner.is_null() {
            // SAFETY: non-null; writable per this function's contract.
            unsafe { abi::write(owner, "owner", udma_owner_figures::default())? };
        }
        let stats = with_client(client, |state| state.client.stats().map_err(fail))?;
        for (i, s) in stats.streams.iter().take(capacity).enumerate() {
            let value = udma_owner_stream_figures {
                size: 0,
                stream: s.stream,
                reserved: 0,
                frames: s.frames,
                failed: s.failed,
                lost: s.lost,
                latency_p50_ns: s.latency_p50_ns,
                latency_p99_ns: s.latency_p99_ns,
                latency_max_ns: s.latency_max_ns,
                max_head_wait_ns: s.max_head_wait_ns,
                bound_ns: s.bound_ns,
                frame_ns: s.frame_ns,
                period_ns: s.period_ns,
            };
            // SAFETY: `capacity` elements of `stride` bytes per this function's contract;
            // each declares its own size.
            let at =
                unsafe { streams.cast::<u8>().add(i * stride) }.cast::<udma_owner_stream_figures>();
            // SAFETY: as above.
            unsafe { abi::write(at, "streams[i]", value) }
                .map_err(|f| f.context(format!("streams[{i}]")))?;
        }
        if !owner.is_null() {
            let o = &stats.owner;
            let value = udma_owner_figures {
                size: 0,
                clients: o.clients,
                streams: o.streams,
                in_flight: o.in_flight,
                departing: o.departing,
                mapped_bytes: o.mapped_bytes,
                frames: o.frames,
                switches: o.switches,
                refused: o.refused,
                closed: o.closed,
                vanished: o.vanished,
                left: o.left,
                resets: o.resets,
            };
            // SAFETY: non-null; writable per this function's contract.
            unsafe { abi::write(owner, "owner", value)? };
        }
        // SAFETY: checked non-null; writable per this function's contract.
        unsafe { count.write(stats.streams.len()) };
        Ok(())
    })
}

/// The oldest event the owner sent that this client has not handed out (a device reset or
/// removal, the owner's shutdown), without waiting; `event->kind` is
/// `UDMA_OWNER_EVENT_NONE` when there is none. Reads what is waiting on the socket.
///
/// Errors: `UDMA_ERR_DEVICE` for a message from the owner this client cannot read.
///
/// # Safety
/// `event` points to `event->size` writable bytes (set `event->size = sizeof *event`).
#[no_mangle]
pub unsafe extern "C" fn udma_owner_next_event(
    client: *mut udma_owner_client,
    event: *mut udma_owner_event,
) -> udma_status {
    call("udma_owner_next_event", || {
        // Checked before taking, so a bad struct loses no event.
        // SAFETY: per this function's contract.
        unsafe { abi::write(event, "event", udma_owner_event::default())? };
        let next = with_client(client, |state| {
            state.take_events()?;
            Ok(state.events.pop_front())
        })?;
        let (kind, detail) = match next {
            None => (udma_owner_event_kind::UDMA_OWNER_EVENT_NONE, 0),
            Some(e) => (
                match e.kind {
                    EventKind::Reset => udma_owner_event_kind::UDMA_OWNER_EVENT_RESET,
                    EventKind::Removed => udma_owner_event_kind::UDMA_OWNER_EVENT_REMOVED,
                    EventKind::Shutdown => udma_owner_event_kind::UDMA_OWNER_EVENT_SHUTDOWN,
                },
                e.detail,
            ),
        };
        let value = udma_owner_event {
            size: 0,
            kind: kind as u32,
            reserved: 0,
            detail,
        };
        // SAFETY: per this function's contract.
        unsafe { abi::write(event, "event", value) }
    })
}

/// The highest status with a name; above it, "unknown status".
const LAST_STATUS: u32 = chan::STATUS_CLOSED;

/// What a completion's `status` means (`"ok"`, `"refused (unknown stream, ...)"`), a static
/// string; `"unknown status"` for a value that is not a `udma_owner_status`.
#[no_mangle]
pub extern "C" fn udma_owner_status_name(status: u32) -> *const c_char {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..=LAST_STATUS + 1)
            .map(|s| CString::new(chan::status_name(s)).unwrap_or_default())
            .collect()
    });
    names
        .get(status.min(LAST_STATUS + 1) as usize)
        .map_or(cstr(b"unknown status\0").as_ptr(), |n| n.as_ptr())
}
