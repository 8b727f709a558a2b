//! One sample of the live view: two stats answers of the owner, the figures of the interval
//! between them (shares, rates) beside the counts since the start. Pure: the owner's clock
//! gives the interval, so a late answer does not skew a rate.

use serde::Serialize;
use userdma_owner::proto::{ClientFigures, StreamFigures, UnitFigures};
use userdma_owner::Stats;

/// What one line of `userdma top --json` holds (docs/cli.md lists the fields).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    /// 1, 2, ...: samples since the view started (the answer before the first is its base).
    pub(crate) sample: u64,
    /// Seconds since the view started, on its own clock.
    pub(crate) elapsed_s: f64,
    /// The interval the rates and shares cover: the owner's clock between this answer and
    /// the one before, in seconds.
    pub(crate) interval_s: f64,
    /// The owner's socket.
    pub(crate) socket: String,
    /// Whether the owner showed every client and stream (it does to uid 0 and its own user).
    pub(crate) sees_all: bool,
    /// The owner's number for this view's own client.
    pub(crate) this_client: u64,
    pub(crate) device: DeviceSample,
    pub(crate) owner: OwnerSample,
    pub(crate) streams: Vec<StreamSample>,
    pub(crate) clients: Vec<ClientSample>,
}

/// The owner's device.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DeviceSample {
    /// As its engine names itself.
    pub(crate) name: String,
    /// Seconds since the owner started.
    pub(crate) owner_up_s: f64,
    /// Whether the owner reads the device's counters (then `copy` and `compute` are set).
    pub(crate) counters: bool,
    pub(crate) copy: Option<UnitSample>,
    pub(crate) compute: Option<UnitSample>,
    /// SRAM hits over bytes touched by compute with a working set, since the device started
    /// (`None`: nothing touched yet).
    pub(crate) sram_hit_rate: Option<f64>,
}

/// One unit of the device.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct UnitSample {
    /// Its busy time over the interval, 0 to 1 (busy time is counted as each descriptor
    /// ends, so a descriptor that began in the interval before counts whole in this one:
    /// clamped to 1).
    pub(crate) busy_share: f64,
    /// Since the device started.
    pub(crate) busy_ns: u64,
    pub(crate) descriptors: u64,
    /// Over the interval.
    pub(crate) descriptors_per_s: f64,
    pub(crate) context_switches: u64,
    pub(crate) context_switches_per_s: f64,
    pub(crate) errors: u64,
}

/// The owner's totals.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct OwnerSample {
    pub(crate) clients: u32,
    pub(crate) streams: u32,
    /// Frames on the device now.
    pub(crate) on_device: u32,
    /// Frames taken from the clients and not completed yet, over the clients shown.
    pub(crate) frames_out: u64,
    /// Clients gone whose memory the owner holds until their frames leave the device.
    pub(crate) departing: u32,
    /// Bytes of client pools mapped for the device (this view's own included).
    pub(crate) mapped_bytes: u64,
    /// Frames completed since the owner started, and per second over the interval.
    pub(crate) frames: u64,
    pub(crate) frames_per_s: f64,
    /// Context switches the owner's scheduler caused, and per second.
    pub(crate) switches: u64,
    pub(crate) switches_per_s: f64,
    pub(crate) resets: u64,
    pub(crate) refused: u64,
    pub(crate) closed: u64,
    pub(crate) vanished: u64,
    pub(crate) left: u64,
}

/// One stream.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StreamSample {
    /// Its client (the owner's number), that client's pid and name when shown.
    pub(crate) client: u64,
    pub(crate) pid: Option<u32>,
    pub(crate) client_name: Option<String>,
    /// Its number for its client, and its name.
    pub(crate) stream: u32,
    pub(crate) name: String,
    /// Frames finished since it began, and per second over the interval.
    pub(crate) frames: u64,
    pub(crate) frames_per_s: f64,
    pub(crate) failed: u64,
    pub(crate) lost: u64,
    /// Latency from the owner taking a frame to its completion, since the stream began
    /// (the owner's histogram), ms.
    pub(crate) latency_p50_ms: f64,
    pub(crate) latency_p99_ms: f64,
    pub(crate) latency_max_ms: f64,
    /// Its longest wait as the scheduler's bounds count it, and the bound the owner
    /// states (`None`: none stated), ms.
    pub(crate) max_wait_ms: f64,
    pub(crate) wait_bound_ms: Option<f64>,
    /// Its declared period (`None`: as fast as possible), ms.
    pub(crate) period_ms: Option<f64>,
}

/// One client.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClientSample {
    pub(crate) client: u64,
    pub(crate) pid: u32,
    pub(crate) uid: u32,
    pub(crate) name: String,
    pub(crate) streams: u32,
    /// Frames taken and not completed.
    pub(crate) frames_out: u32,
    /// Frames completed, and per second over the interval.
    pub(crate) frames: u64,
    pub(crate) frames_per_s: f64,
    pub(crate) pool_bytes: u64,
    /// This view's own connection.
    pub(crate) this_view: bool,
}

/// Where the view stands: what it needs besides the two answers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) sample: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) socket: &'a str,
    pub(crate) this_client: u64,
}

/// The figures of the interval from `before` to `now` (`before` `None`: no interval yet,
/// every rate and share 0 and `interval_s` 0: the first screen, before a second answer).
pub(crate) fn sample(at: At<'_>, before: Option<&Stats>, now: &Stats) -> Sample {
    let clock = |s: &Stats| s.device.clock_ns;
    let interval_ns = before.map_or(0, |b| clock(now).saturating_sub(clock(b)));
    let secs = interval_ns as f64 / 1e9;
    let rate = |now: u64, then: u64| {
        if interval_ns == 0 {
            0.0
        } else {
            now.saturating_sub(then) as f64 / secs
        }
    };
    let unit = |pick: fn(&userdma_owner::proto::DeviceCounters) -> UnitFigures| {
        let u = pick(&now.device.counters?);
        let b = before
            .and_then(|b| b.device.counters)
            .map(|c| pick(&c))
            .unwrap_or(u);
        let share = if interval_ns == 0 {
            0.0
        } else {
            (u.busy_ns.saturating_sub(b.busy_ns) as f64 / interval_ns as f64).clamp(0.0, 1.0)
        };
        Some(UnitSample {
            busy_share: share,
            busy_ns: u.busy_ns,
            descriptors: u.descriptors,
            descriptors_per_s: rate(u.descriptors, b.descriptors),
            context_switches: u.context_switches,
            context_switches_per_s: rate(u.context_switches, b.context_switches),
            errors: u.errors,
        })
    };
    let counters = now.device.counters;
    let device = DeviceSample {
        name: now.device.device.as_str().to_owned(),
        owner_up_s: now.device.clock_ns as f64 / 1e9,
        counters: counters.is_some(),
        copy: unit(|c| c.copy),
        compute: unit(|c| c.compute),
        sram_hit_rate: counters
            .filter(|c| c.sram_touched > 0)
            .map(|c| c.sram_hits as f64 / c.sram_touched as f64),
    };
    let o = &now.owner;
    let o_before = before.map_or(o, |b| &b.owner);
    let owner = OwnerSample {
        clients: o.clients,
        streams: o.streams,
        on_device: o.in_flight,
        frames_out: now.clients.iter().map(|c| u64::from(c.in_flight)).sum(),
        departing: o.departing,
        mapped_bytes: o.mapped_bytes,
        frames: o.frames,
        frames_per_s: rate(o.frames, o_before.frames),
        switches: o.switches,
        switches_per_s: rate(o.switches, o_before.switches),
        resets: o.resets,
        refused: o.refused,
        closed: o.closed,
        vanished: o.vanished,
        left: o.left,
    };
    let client_of = |id: u64| now.clients.iter().find(|c| c.client == id);
    let mut streams: Vec<StreamSample> = now
        .streams
        .iter()
        .chain(&now.others)
        .map(|s| {
            // A stream new in this interval ran all its frames in it.
            let then = before
                .and_then(|b| find_stream(b, s.client, s.stream))
                .map_or(0, |p| p.frames);
            let ms = |ns: u64| ns as f64 / 1e6;
            let c = client_of(s.client);
            StreamSample {
                client: s.client,
                pid: c.map(|c| c.pid),
                client_name: c.map(|c| c.name.as_str().to_owned()),
                stream: s.stream,
                name: s.name.as_str().to_owned(),
                frames: s.frames,
                frames_per_s: rate(s.frames, then),
                failed: s.failed,
                lost: s.lost,
                latency_p50_ms: ms(s.latency_p50_ns),
                latency_p99_ms: ms(s.latency_p99_ns),
                latency_max_ms: ms(s.latency_max_ns),
                max_wait_ms: ms(s.max_head_wait_ns),
                wait_bound_ms: (s.bound_ns > 0).then(|| ms(s.bound_ns)),
                period_ms: (s.period_ns > 0).then(|| ms(s.period_ns)),
            }
        })
        .collect();
    streams.sort_by_key(|s| (s.client, s.stream));
    let mut clients: Vec<ClientSample> = now
        .clients
        .iter()
        .map(|c| {
            let then = before
                .and_then(|b| find_client(b, c.client))
                .map_or(0, |p| p.frames);
            ClientSample {
                client: c.client,
                pid: c.pid,
                uid: c.uid,
                name: c.name.as_str().to_owned(),
                streams: c.streams,
                frames_out: c.in_flight,
                frames: c.frames,
                frames_per_s: rate(c.frames, then),
                pool_bytes: c.pool_bytes,
                this_view: c.client == at.this_client,
            }
        })
        .collect();
    clients.sort_by_key(|c| c.client);
    Sample {
        sample: at.sample,
        elapsed_s: at.elapsed_s,
        interval_s: secs,
        socket: at.socket.to_owned(),
        sees_all: now.sees_all(),
        this_client: at.this_client,
        device,
        owner,
        streams,
        clients,
    }
}

fn find_stream(stats: &Stats, client: u64, stream: u32) -> Option<&StreamFigures> {
    stats
        .streams
        .iter()
        .chain(&stats.others)
        .find(|s| s.client == client && s.stream == stream)
}

fn find_client(stats: &Stats, client: u64) -> Option<&ClientFigures> {
    stats.clients.iter().find(|c| c.client == client)
}

#[cfg(test)]
mod tests {
    use userdma_owner::proto::{DeviceCounters, DeviceFigures, Name, OwnerFigures};

    use super::*;

    fn stats(clock_ms: u64, copy_busy_ms: u64, frames: u64, with_other: bool) -> Stats {
        let stream = |client, name: &str, frames| StreamFigures {
            stream: 0,
            client,
            name: Name::new(name).unwrap(),
            frames,
            latency_p99_ns: 2_000_000,
            ..StreamFigures::default()
        };
        let client = |client, name: &str, frames| ClientFigures {
            client,
            pid: 100 + client as u32,
            name: Name::new(name).unwrap(),
            frames,
            ..ClientFigures::default()
        };
        let mut clients = vec![client(1, "top", 0)];
        let mut others = Vec::new();
        if with_other {
            clients.push(client(2, "cam", frames));
            others.push(stream(2, "live", frames));
        }
        Stats {
            streams: Vec::new(),
            others,
            clients,
            device: DeviceFigures {
                device: Name::new("npu").unwrap(),
                clock_ns: clock_ms * 1_000_000,
                counters: Some(DeviceCounters {
                    copy: UnitFigures {
                        busy_ns: copy_busy_ms * 1_000_000,
                        descriptors: frames * 2,
                        ..UnitFigures::default()
                    },
                    sram_hits: 3,
                    sram_touched: 4,
                    ..DeviceCounters::default()
                }),
            },
            owner: OwnerFigures {
                clients: 2,
                streams: 1,
                frames,
                ..OwnerFigures::default()
            },
        }
    }

    fn at(n: u64) -> At<'static> {
        At {
            sample: n,
            elapsed_s: 1.0,
            socket: "/s",
            this_client: 1,
        }
    }

    #[test]
    fn rates_and_shares_cover_the_owners_interval() {
        let a = stats(1000, 100, 10, true);
        let b = stats(1500, 300, 60, true);
        let s = sample(at(1), Some(&a), &b);
        assert_eq!(s.interval_s, 0.5);
        let copy = s.device.copy.unwrap();
        assert!((copy.busy_share - 0.4).abs() < 1e-9, "{copy:?}");
        assert_eq!(copy.descriptors_per_s, 200.0);
        assert_eq!(s.device.compute.unwrap().busy_share, 0.0);
        assert_eq!(s.device.sram_hit_rate, Some(0.75));
        assert_eq!(s.owner.frames_per_s, 100.0);
        assert_eq!(s.streams.len(), 1);
        assert_eq!(s.streams[0].name, "live");
        assert_eq!(s.streams[0].client_name.as_deref(), Some("cam"));
        assert_eq!(s.streams[0].frames_per_s, 100.0);
        assert_eq!(s.streams[0].latency_p99_ms, 2.0);
        assert!(s.clients[0].this_view && !s.clients[1].this_view);
        assert!(s.sees_all);
    }

    #[test]
    fn a_share_past_the_interval_is_clamped_and_the_first_screen_has_no_rates() {
        // A descriptor that began before the interval counts whole at its end.
        let a = stats(1000, 0, 0, true);
        let b = stats(1100, 150, 5, true);
        assert_eq!(
            sample(at(1), Some(&a), &b).device.copy.unwrap().busy_share,
            1.0
        );
        let first = sample(at(0), None, &b);
        assert_eq!(first.interval_s, 0.0);
        assert_eq!(first.owner.frames_per_s, 0.0);
        assert_eq!(first.device.copy.unwrap().busy_share, 0.0);
    }

    #[test]
    fn a_new_stream_counts_all_its_frames_and_a_partial_view_says_so() {
        let a = stats(1000, 0, 0, false);
        let b = stats(2000, 0, 30, true);
        let s = sample(at(1), Some(&a), &b);
        assert_eq!(s.streams[0].frames_per_s, 30.0);
        // The owner holds a client and a stream it did not show.
        let mut hidden = b.clone();
        hidden.others.clear();
        hidden.clients.truncate(1);
        assert!(!sample(at(2), Some(&b), &hidden).sees_all);
    }

    #[test]
    fn a_device_without_counters_has_no_units() {
        let mut b = stats(1000, 0, 0, false);
        b.device.counters = None;
        let s = sample(at(1), None, &b);
        assert!(!s.device.counters && s.device.copy.is_none() && s.device.sram_hit_rate.is_none());
    }
}
