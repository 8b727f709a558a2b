//! Frames: taken from the clients' rings (checked), dispatched in the scheduler's order
//! straight from and to the clients' buffers, reaped into the clients' completion rings;
//! streams retired once nothing of theirs is on the device; device faults recovered from.

use std::time::Instant;

use userdma::pool::MIN_ALIGN;
use userdma::Code;
use userdma_infer::accel::HostSpan;
use userdma_infer::sched::Nanos;

use super::conn::Ending;
use super::{OnDevice, Owner, Pending};
use crate::chan::{self, Completion};
use crate::proto::{EventKind, Msg};

/// The span of `len` bytes at `offset` of `pool`'s region, if it can be one of the client's
/// buffers: inside the pool's buffer area, starting where a buffer may start (every buffer's
/// IOVA is aligned to [`MIN_ALIGN`]) and contiguous for the device.
///
/// That is all the owner can know of it. The client allocates its buffers in its own process,
/// from lists in the shared pool's metadata that the owner neither reads nor trusts: which
/// buffer an offset starts, how long that buffer is and whether it is still allocated are
/// known to the client alone, whose library checks them before a frame is sent
/// ([`crate::Client::submit`], [`crate::Client::submit_spans`]). A span that passes here lies
/// in the client's own pool, so a frame that names the wrong bytes can only spoil that
/// client's memory, never another client's or the owner's.
fn span_of(pool: &userdma::pool::Pool, offset: u64, len: u64) -> Option<HostSpan> {
    let mapping = pool.mapping();
    let start = u64::try_from(pool.arena_offset()).ok()?;
    let end = start.checked_add(u64::try_from(pool.arena_len()).ok()?)?;
    let last = offset.checked_add(len)?;
    if offset < start || last > end || len == 0 {
        return None;
    }
    let at = usize::try_from(offset).ok()?;
    let len_usize = usize::try_from(len).ok()?;
    if mapping.contiguous_len(at) < len_usize {
        return None;
    }
    let iova = mapping.iova(at)?;
    // `MIN_ALIGN` is a `usize` power of two; it fits in a `u64`.
    if iova.0 % MIN_ALIGN as u64 != 0 {
        return None;
    }
    // SAFETY: `at + len <= end <= mapping.len()`: the pointer stays inside the mapping.
    let ptr = unsafe { mapping.as_ptr().add(at) };
    Some(HostSpan { iova, ptr, len })
}

impl Owner {
    /// Takes every client's waiting submissions, as far as its in-flight limit and the room
    /// in its completion ring allow; refuses the ones that name a stream not the client's or
    /// a span that cannot be a buffer of its pool (see `span_of`).
    /// Returns whether any was taken.
    pub(super) fn take_submissions(&mut self) -> bool {
        let now = self.now();
        let limit = self.config.limits.in_flight;
        let mut any = false;
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_mut() else {
                continue;
            };
            let id = conn.id;
            let Some(ready) = conn.ready_mut() else {
                continue;
            };
            let rings = ready.shared.rings();
            let checked = rings
                .submissions(ready.sq_head)
                .and_then(|waiting| Ok((waiting, rings.completion_room(ready.cq_tail)?)));
            let (waiting, room) = match checked {
                Ok(w) => w,
                Err(e) => {
                    let why = super::conn::error(Code::InvalidArgument, true, format!("{e}"));
                    self.close(slot, Ending::Misbehaved, Some(why));
                    continue;
                }
            };
            if waiting == 0 {
                continue;
            }
            // Every frame taken gets a completion: take no more than fit.
            let can = u64::from(limit.saturating_sub(ready.in_flight))
                .min(room.saturating_sub(u64::from(ready.in_flight)))
                .min(waiting);
            let mut refused = false;
            for _ in 0..can {
                let sub = rings.read_submission(ready.sq_head);
                ready.sq_head = ready.sq_head.wrapping_add(1);
                ready.in_flight += 1;
                any = true;
                let stream = self
                    .streams
                    .iter_mut()
                    .find(|s| s.client == id && s.number == sub.stream && !s.closing);
                let status = match stream {
                    None => chan::STATUS_REFUSED,
                    Some(_) if self.removed => chan::STATUS_REMOVED,
                    Some(s) => {
                        let (i, r) = (s.pipeline.model().input(), s.pipeline.model().result());
                        match (
                            span_of(&ready.pool, sub.input, i.bytes),
                            span_of(&ready.pool, sub.result, r.bytes),
                        ) {
                            (Some(input), Some(result)) => {
                                s.waiting.push_back(Pending {
                                    input,
                                    result,
                                    tag: sub.tag,
                                    arrival: now,
                                });
                                continue;
                            }
                            _ => chan::STATUS_REFUSED,
                        }
                    }
                };
                refused = true;
                ready.cq_tail = rings.post(
                    ready.cq_tail,
                    &Completion {
                        stream: sub.stream,
                        status,
                        tag: sub.tag,
                        latency_ns: 0,
                        wait_ns: 0,
                    },
                );
                ready.in_flight -= 1;
            }
            rings.consumed(ready.sq_head);
            if refused {
                ready.wake_client();
            }
        }
        any
    }

    /// Gives the device frames while it has room, in the scheduler's order. Returns whether
    /// any went.
    pub(super) fn dispatch(&mut self) -> bool {
        let mut any = false;
        loop {
            let on_device: usize = self.streams.iter().map(|s| s.on_device.len()).sum();
            if on_device >= self.config.in_flight || self.removed {
                return any;
            }
            let Some(scheduler) = self.scheduler.as_mut() else {
                return any;
            };
            for (o, s) in self.oldest.iter_mut().zip(&self.streams) {
                *o = s.waiting.front().map(|p| p.arrival);
            }
            let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let Some(d) = scheduler.decide(now, &self.oldest) else {
                return any;
            };
            let s = &mut self.streams[d.stream.0];
            let Some(p) = s.waiting.pop_front() else {
                return any;
            };
            // SAFETY: the spans lie inside the client's pool mapping (checked when taken),
            // mapped into the device's space; the stream holds an `Arc` of that pool until
            // nothing of it is on the device (`retire_streams`), and a recovery hands every
            // frame back before the stream can go.
            let submitted = unsafe { s.pipeline.try_submit_spans(p.input, p.result) };
            match submitted.and_then(|f| s.pipeline.flush().map(|()| f)) {
                Ok(Some(_)) => {
                    let head = p.arrival.max(s.last_dispatch);
                    s.max_head_wait = s.max_head_wait.max(now.saturating_sub(head));
                    s.last_dispatch = now;
                    s.on_device.push_back(OnDevice {
                        tag: p.tag,
                        arrival: p.arrival,
                        dispatch: now,
                    });
                    let key = (s.client, s.number);
                    // The previous frame held the device until this decision if a frame
                    // was waiting when that one finished (the device had work all along).
                    if let Some((prev_key, prev)) = self.last_dispatch {
                        if self.waiting_at_done && self.last_done >= prev {
                            let held = now.saturating_sub(prev);
                            if let Some(ps) = self
                                .streams
                                .iter_mut()
                                .find(|x| (x.client, x.number) == prev_key)
                            {
                                ps.frame_ns = ps.frame_ns.max(held);
                            }
                            if held > self.service_ns {
                                self.service_ns = held;
                                self.restate();
                            }
                        }
                    }
                    self.last_dispatch = Some((key, now));
                    if on_device == 0 {
                        self.progress = Instant::now();
                    }
                    any = true;
                }
                Ok(None) => {
                    // Its pipeline's slots are all busy: its frame waits.
                    s.waiting.push_front(p);
                    return any;
                }
                Err(e) => {
                    s.on_device.push_back(OnDevice {
                        tag: p.tag,
                        arrival: p.arrival,
                        dispatch: now,
                    });
                    self.fault(&e);
                    return true;
                }
            }
        }
    }

    /// Takes every finished frame off the device into its client's completion ring.
    /// Returns whether any finished.
    pub(super) fn reap(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.streams.len() {
            if self.streams[i].on_device.is_empty() {
                continue;
            }
            self.finished.clear();
            let finished = &mut self.finished;
            let number = self.streams[i].number;
            let polled = self.streams[i].pipeline.poll(|f| {
                let status = match f.result {
                    Ok(_) => None,
                    Err(e) => Some(e.code),
                };
                finished.push((number, status));
            });
            if let Err(e) = polled {
                if is_device_fault(&e) {
                    self.fault(&e);
                    return true;
                }
            }
            if self.finished.is_empty() {
                continue;
            }
            any = true;
            self.progress = Instant::now();
            let now = self.now();
            for k in 0..self.finished.len() {
                let status = match self.finished[k].1 {
                    None => chan::STATUS_OK,
                    Some(_) => chan::STATUS_FAILED,
                };
                self.complete(i, status, now);
            }
        }
        any
    }

    /// The oldest frame of stream `i` on the device is done with `status`: counted and posted.
    fn complete(&mut self, i: usize, status: u32, now: Nanos) {
        let s = &mut self.streams[i];
        let Some(f) = s.on_device.pop_front() else {
            return;
        };
        let latency = now.saturating_sub(f.arrival);
        self.last_done = now;
        self.waiting_at_done = self.streams.iter().any(|x| !x.waiting.is_empty());
        let s = &mut self.streams[i];
        match status {
            chan::STATUS_OK => {
                s.frames += 1;
                s.latency.saturating_record(latency.max(1));
            }
            chan::STATUS_LOST => s.lost += 1,
            _ => s.failed += 1,
        }
        self.figures.frames += 1;
        let c = Completion {
            stream: s.number,
            status,
            tag: f.tag,
            latency_ns: latency,
            wait_ns: f.dispatch.saturating_sub(f.arrival),
        };
        let (client, slot) = (s.client, s.slot);
        self.post(client, slot, &c);
    }

    /// Posts `c` to the client `client` in `slot` (nothing if it is gone).
    fn post(&mut self, client: u64, slot: usize, c: &Completion) {
        let Some(Some(conn)) = self.conns.get_mut(slot) else {
            return;
        };
        if conn.id != client {
            return;
        }
        let Some(ready) = conn.ready_mut() else {
            return;
        };
        let rings = ready.shared.rings();
        match rings.completion_room(ready.cq_tail) {
            Ok(room) if room > 0 => {
                ready.cq_tail = rings.post(ready.cq_tail, c);
                ready.in_flight = ready.in_flight.saturating_sub(1);
                ready.frames += 1;
                ready.wake_client();
            }
            // Room was reserved when the frame was taken: only a client that moved its
            // completion head back can get here.
            other => {
                let text = match other {
                    Err(e) => format!("{e}"),
                    Ok(_) => "the completion ring has no room for a frame taken: the client \
                              moved its completion head back"
                        .into(),
                };
                let why = super::conn::error(Code::InvalidArgument, true, text);
                self.close(slot, Ending::Misbehaved, Some(why));
            }
        }
    }

    /// Drops every waiting frame of every stream, each posted with `status`.
    pub(super) fn drop_waiting(&mut self, status: u32) {
        for i in 0..self.streams.len() {
            self.drop_waiting_at(i, status);
        }
    }

    /// Drops the waiting frames of `client`'s streams (one stream, or all).
    pub(super) fn drop_waiting_of(&mut self, client: u64, stream: Option<u32>, status: u32) {
        for i in 0..self.streams.len() {
            let s = &self.streams[i];
            if s.client == client && stream.is_none_or(|n| n == s.number) {
                self.drop_waiting_at(i, status);
            }
        }
    }

    fn drop_waiting_at(&mut self, i: usize, status: u32) {
        while let Some(p) = self.streams[i].waiting.pop_front() {
            let s = &self.streams[i];
            let c = Completion {
                stream: s.number,
                status,
                tag: p.tag,
                latency_ns: 0,
                wait_ns: 0,
            };
            let (client, slot) = (s.client, s.slot);
            self.post(client, slot, &c);
        }
    }

    /// Removes closing streams with nothing on the device: their pipelines shut down, their
    /// queues freed, their client's pool unmapped with the last of them.
    pub(super) fn retire_streams(&mut self) {
        let mut changed = false;
        let mut i = 0;
        while i < self.streams.len() {
            let s = &self.streams[i];
            if !(s.closing && s.on_device.is_empty() && s.waiting.is_empty()) {
                i += 1;
                continue;
            }
            let s = self.streams.remove(i);
            changed = true;
            let (base, n) = (usize::from(s.queues.0), usize::from(s.queues.1));
            for q in &mut self.queues_used[base..base + n] {
                *q = false;
            }
            if let Some(Some(conn)) = self.conns.get_mut(s.slot) {
                if conn.id == s.client {
                    if let Some(r) = conn.ready_mut() {
                        r.streams = r.streams.saturating_sub(1);
                    }
                }
            }
            let (client, slot, number, reply) = (s.client, s.slot, s.number, s.reply_closed);
            // Nothing of it is on the device: the pipeline's queues stop with nothing in
            // flight, and its hold on the client's pool goes.
            drop(s);
            if reply && self.conn_alive(client, slot) {
                self.reply(slot, &Msg::Closed { stream: number });
            }
        }
        if changed {
            self.reschedule();
        }
    }

    /// A device busy with no progress for its pipelines' timeout is a fault.
    pub(super) fn check_overdue(&mut self) {
        let Some(busy) = self.streams.iter().find(|s| !s.on_device.is_empty()) else {
            return;
        };
        let timeout = busy.pipeline.config().timeout;
        let waited = self.progress.elapsed();
        if waited > timeout {
            let err = busy.pipeline.overdue(waited);
            self.fault(&err);
        }
    }

    /// A device fault: the device reset (unless removed), every pipeline's slots taken back,
    /// frames that finished posted, the others posted lost; every client told.
    pub(super) fn fault(&mut self, err: &userdma_infer::Error) {
        let removed = self.device.is_removed() || err.code() == Code::Removed;
        let reset = if removed {
            Ok(())
        } else {
            self.figures.resets += 1;
            self.device.reset()
        };
        let lost_status = if removed {
            chan::STATUS_REMOVED
        } else {
            chan::STATUS_LOST
        };
        let mut broken = reset.is_err();
        // Told before the frames come back: a client that sees a lost frame has the event
        // waiting on its socket already.
        if removed || broken {
            self.broadcast(EventKind::Removed, err.code() as u64);
        } else {
            self.broadcast(EventKind::Reset, err.code() as u64);
        }
        let was_broken = broken;
        let now = self.now();
        for i in 0..self.streams.len() {
            self.finished.clear();
            let finished = &mut self.finished;
            let number = self.streams[i].number;
            let recovered = self.streams[i].pipeline.reclaim(|f| {
                finished.push((number, f.result.err().map(|e| e.code)));
            });
            for k in 0..self.finished.len() {
                let status = match self.finished[k].1 {
                    None => chan::STATUS_OK,
                    Some(_) => chan::STATUS_FAILED,
                };
                self.complete(i, status, now);
            }
            if recovered.is_err() {
                broken = true;
            }
            // Whatever did not finish was taken back from the device: lost.
            while !self.streams[i].on_device.is_empty() {
                self.complete(i, lost_status, now);
            }
        }
        if removed || broken {
            self.removed = true;
            if broken && !was_broken && !removed {
                // A pipeline could not be brought back after the reset: the device is lost.
                self.broadcast(EventKind::Removed, err.code() as u64);
            }
            self.drop_waiting(chan::STATUS_REMOVED);
        }
        self.progress = Instant::now();
    }
}

/// Whether `err` is a device fault the owner recovers from: a wait that timed out, the
/// device breaking its protocol, or its removal.
fn is_device_fault(err: &userdma_infer::Error) -> bool {
    matches!(err.code(), Code::Timeout | Code::Device | Code::Removed)
}
