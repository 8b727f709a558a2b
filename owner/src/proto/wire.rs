//! The wire form of [`Msg`]: [`encode`] writes a message's header and fixed payload,
//! [`decode`] checks every byte a peer controls before it builds one.

#[allow(clippy::wildcard_imports)]
// the protocol's kinds, sizes and types, all of them used here
use super::*;

/// Encodes `msg` into `out` (at least [`MAX_MESSAGE`] bytes); returns the message's length.
///
/// # Panics
/// If `out` is shorter than [`MAX_MESSAGE`] (a caller's bug: the buffer is its own).
pub fn encode(msg: &Msg, out: &mut [u8]) -> usize {
    let mut w = Writer { out, at: HEADER };
    let kind = match msg {
        Msg::Hello { pool_bytes, name } => {
            w.u64(*pool_bytes);
            w.name(name);
            K_HELLO
        }
        Msg::Welcome {
            client,
            pool_bytes,
            sq_entries,
            cq_entries,
            max_streams,
            max_in_flight,
        } => {
            w.u64(*client);
            w.u64(*pool_bytes);
            w.u32(*sq_entries);
            w.u32(*cq_entries);
            w.u32(*max_streams);
            w.u32(*max_in_flight);
            K_WELCOME
        }
        Msg::Declare {
            priority,
            period_ns,
            max_wait_ns,
            name,
            model,
        } => {
            w.u64(u64::from(*priority));
            w.u64(*period_ns);
            w.u64(*max_wait_ns);
            w.name(name);
            w.name(model);
            K_DECLARE
        }
        Msg::Declared {
            stream,
            input_bytes,
            result_bytes,
        } => {
            w.u64(u64::from(*stream));
            w.u64(*input_bytes);
            w.u64(*result_bytes);
            K_DECLARED
        }
        Msg::Close { stream } => {
            w.u64(u64::from(*stream));
            K_CLOSE
        }
        Msg::Closed { stream } => {
            w.u64(u64::from(*stream));
            K_CLOSED
        }
        Msg::Stats => K_STATS,
        Msg::StreamStats(s) => {
            w.u64(u64::from(s.stream));
            w.u64(s.client);
            w.name(&s.name);
            for v in [
                s.frames,
                s.failed,
                s.lost,
                s.latency_p50_ns,
                s.latency_p99_ns,
                s.latency_max_ns,
                s.max_head_wait_ns,
                s.bound_ns,
                s.frame_ns,
                s.period_ns,
            ] {
                w.u64(v);
            }
            K_STREAM_STATS
        }
        Msg::ClientStats(c) => {
            w.u64(c.client);
            w.u32(c.pid);
            w.u32(c.uid);
            w.name(&c.name);
            w.u32(c.streams);
            w.u32(c.in_flight);
            w.u64(c.frames);
            w.u64(c.pool_bytes);
            K_CLIENT_STATS
        }
        Msg::DeviceStats(d) => {
            w.name(&d.device);
            w.u64(d.clock_ns);
            w.u64(u64::from(d.counters.is_some()));
            let c = d.counters.unwrap_or_default();
            for u in [c.copy, c.compute] {
                for v in [
                    u.busy_ns,
                    u.descriptors,
                    u.bytes,
                    u.context_switches,
                    u.errors,
                ] {
                    w.u64(v);
                }
            }
            w.u64(c.sram_hits);
            w.u64(c.sram_touched);
            K_DEVICE_STATS
        }
        Msg::OwnerStats(o) => {
            w.u32(o.clients);
            w.u32(o.streams);
            w.u32(o.in_flight);
            w.u32(o.departing);
            for v in [
                o.mapped_bytes,
                o.frames,
                o.switches,
                o.refused,
                o.closed,
                o.vanished,
                o.left,
                o.resets,
            ] {
                w.u64(v);
            }
            K_OWNER_STATS
        }
        Msg::Event { kind, detail } => {
            w.u64(*kind as u64);
            w.u64(*detail);
            K_EVENT
        }
        Msg::Error { code, fatal, text } => {
            w.u32(*code);
            w.u32(u32::from(*fatal));
            // Cut at a character boundary to fit.
            let mut end = text.len().min(TEXT);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            w.bytes(&text.as_bytes()[..end], TEXT);
            K_ERROR
        }
    };
    let len = w.at;
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&kind.to_le_bytes());
    len
}

/// A unit's figures on the wire ([`UnitFigures`]: five u64).
const UNIT: usize = 40;

/// The payload length of each kind.
pub(super) fn payload_len(kind: u16) -> Option<usize> {
    Some(match kind {
        K_HELLO => 8 + NAME,
        K_WELCOME => 32,
        K_DECLARE => 24 + 2 * NAME,
        K_DECLARED => 24,
        K_CLOSE | K_CLOSED => 8,
        K_STATS => 0,
        K_STREAM_STATS => 16 + NAME + 80,
        K_CLIENT_STATS => 16 + NAME + 24,
        K_DEVICE_STATS => NAME + 16 + 2 * UNIT + 16,
        K_OWNER_STATS => 16 + 64,
        K_EVENT => 16,
        K_ERROR => 8 + TEXT,
        _ => return None,
    })
}

/// Decodes one message, checking everything the peer controls.
///
/// # Errors
/// [`ProtoError`]: what was wrong, for the error message the peer gets.
pub fn decode(bytes: &[u8]) -> Result<Msg, ProtoError> {
    if bytes.len() < HEADER {
        return Err(ProtoError::Short { len: bytes.len() });
    }
    let magic = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if magic != MAGIC {
        return Err(ProtoError::Magic { found: magic });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != VERSION {
        return Err(ProtoError::Version { found: version });
    }
    let kind = u16::from_le_bytes([bytes[6], bytes[7]]);
    let expected = payload_len(kind).ok_or(ProtoError::Kind { kind })?;
    let payload = &bytes[HEADER..];
    if payload.len() != expected {
        return Err(ProtoError::Length {
            kind,
            len: payload.len(),
            expected,
        });
    }
    let mut r = Reader {
        bytes: payload,
        at: 0,
    };
    let msg = match kind {
        K_HELLO => Msg::Hello {
            pool_bytes: r.u64(),
            name: r.name()?,
        },
        K_WELCOME => Msg::Welcome {
            client: r.u64(),
            pool_bytes: r.u64(),
            sq_entries: r.u32(),
            cq_entries: r.u32(),
            max_streams: r.u32(),
            max_in_flight: r.u32(),
        },
        K_DECLARE => {
            let priority = r.u64();
            let priority = u8::try_from(priority).map_err(|_| ProtoError::Field {
                field: "priority",
                value: priority,
                why: "a priority is 0 to 255",
            })?;
            Msg::Declare {
                priority,
                period_ns: r.u64(),
                max_wait_ns: r.u64(),
                name: r.name()?,
                model: r.name()?,
            }
        }
        K_DECLARED => Msg::Declared {
            stream: r.u32_in_u64("stream")?,
            input_bytes: r.u64(),
            result_bytes: r.u64(),
        },
        K_CLOSE => Msg::Close {
            stream: r.u32_in_u64("stream")?,
        },
        K_CLOSED => Msg::Closed {
            stream: r.u32_in_u64("stream")?,
        },
        K_STATS => Msg::Stats,
        K_STREAM_STATS => Msg::StreamStats(StreamFigures {
            stream: r.u32_in_u64("stream")?,
            client: r.u64(),
            name: r.name()?,
            frames: r.u64(),
            failed: r.u64(),
            lost: r.u64(),
            latency_p50_ns: r.u64(),
            latency_p99_ns: r.u64(),
            latency_max_ns: r.u64(),
            max_head_wait_ns: r.u64(),
            bound_ns: r.u64(),
            frame_ns: r.u64(),
            period_ns: r.u64(),
        }),
        K_CLIENT_STATS => Msg::ClientStats(ClientFigures {
            client: r.u64(),
            pid: r.u32(),
            uid: r.u32(),
            name: r.name()?,
            streams: r.u32(),
            in_flight: r.u32(),
            frames: r.u64(),
            pool_bytes: r.u64(),
        }),
        K_DEVICE_STATS => {
            let device = r.name()?;
            let clock_ns = r.u64();
            let known = r.u64();
            let mut unit = || UnitFigures {
                busy_ns: r.u64(),
                descriptors: r.u64(),
                bytes: r.u64(),
                context_switches: r.u64(),
                errors: r.u64(),
            };
            let counters = DeviceCounters {
                copy: unit(),
                compute: unit(),
                sram_hits: r.u64(),
                sram_touched: r.u64(),
            };
            let counters = match known {
                1 => Some(counters),
                // Without counters every counter word is zero: what decodes encodes back to
                // the same bytes.
                0 if counters == DeviceCounters::default() => None,
                0 => {
                    return Err(ProtoError::Field {
                        field: "counters",
                        value: 0,
                        why: "counters absent (0) with counter words that are not zero",
                    })
                }
                _ => {
                    return Err(ProtoError::Field {
                        field: "counters",
                        value: known,
                        why: "0 (absent) or 1 (present)",
                    })
                }
            };
            Msg::DeviceStats(DeviceFigures {
                device,
                clock_ns,
                counters,
            })
        }
        K_OWNER_STATS => Msg::OwnerStats(OwnerFigures {
            clients: r.u32(),
            streams: r.u32(),
            in_flight: r.u32(),
            departing: r.u32(),
            mapped_bytes: r.u64(),
            frames: r.u64(),
            switches: r.u64(),
            refused: r.u64(),
            closed: r.u64(),
            vanished: r.u64(),
            left: r.u64(),
            resets: r.u64(),
        }),
        K_EVENT => {
            let value = r.u64();
            let kind = u32::try_from(value)
                .ok()
                .and_then(EventKind::from_u32)
                .ok_or(ProtoError::Field {
                    field: "event",
                    value,
                    why: "an event is 1 (reset), 2 (removed) or 3 (shutdown)",
                })?;
            Msg::Event {
                kind,
                detail: r.u64(),
            }
        }
        K_ERROR => {
            let code = r.u32();
            let fatal = r.u32();
            if fatal > 1 {
                return Err(ProtoError::Field {
                    field: "fatal",
                    value: u64::from(fatal),
                    why: "0 or 1",
                });
            }
            let raw = r.take(TEXT);
            let end = raw.iter().position(|&b| b == 0).unwrap_or(TEXT);
            // A text cut by the sender mid-character is still shown; replacement characters
            // can make it longer than the wire holds, so it is cut again to fit (at a
            // character boundary): what decodes encodes back to itself.
            let mut text = String::from_utf8_lossy(&raw[..end]).into_owned();
            let mut fit = text.len().min(TEXT);
            while !text.is_char_boundary(fit) {
                fit -= 1;
            }
            text.truncate(fit);
            Msg::Error {
                code,
                fatal: fatal == 1,
                text,
            }
        }
        _ => return Err(ProtoError::Kind { kind }),
    };
    Ok(msg)
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn u64(&mut self, v: u64) {
        self.out[self.at..self.at + 8].copy_from_slice(&v.to_le_bytes());
        self.at += 8;
    }
    fn u32(&mut self, v: u32) {
        self.out[self.at..self.at + 4].copy_from_slice(&v.to_le_bytes());
        self.at += 4;
    }
    fn bytes(&mut self, b: &[u8], width: usize) {
        self.out[self.at..self.at + b.len()].copy_from_slice(b);
        self.out[self.at + b.len()..self.at + width].fill(0);
        self.at += width;
    }
    fn name(&mut self, n: &Name) {
        self.bytes(n.as_str().as_bytes(), NAME);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    // Lengths were checked against the kind's fixed layout before any read.
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u32_in_u64(&mut self, field: &'static str) -> Result<u32, ProtoError> {
        let v = self.u64();
        u32::try_from(v).map_err(|_| ProtoError::Field {
            field,
            value: v,
            why: "a stream number fits 32 bits",
        })
    }
    fn name(&mut self) -> Result<Name, ProtoError> {
        let raw = self.take(NAME);
        let end = raw.iter().position(|&b| b == 0).unwrap_or(NAME);
        if raw[end..].iter().any(|&b| b != 0) {
            return Err(ProtoError::Name {
                len: end,
                why: "padded with zeros after its text",
            });
        }
        let text = std::str::from_utf8(&raw[..end]).map_err(|_| ProtoError::Name {
            len: end,
            why: "UTF-8",
        })?;
        Name::new(text)
    }
}
