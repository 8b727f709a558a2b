//! The live view's screen: a sample as lines of text (pure; the terminal module draws them).

use super::sample::Sample;

/// What the screen says besides the sample.
#[derive(Debug, Clone)]
pub(crate) struct Frame<'a> {
    /// Seconds between samples.
    pub(crate) interval_s: f64,
    /// How to quit ("q quits", or "Ctrl-C quits" when stdin is not a terminal).
    pub(crate) quit: &'a str,
    /// A line about the run top wraps (its command, its demo streams), if any.
    pub(crate) wrapped: Option<&'a str>,
    /// This process's user id (said when the owner shows only its own client).
    pub(crate) uid: u32,
}

/// The screen's lines for `s`.
pub(crate) fn render(s: &Sample, f: &Frame<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let measured = s.interval_s > 0.0;
    out.push(format!(
        "userdma top · owner {} · every {} · sample {} · {}",
        s.socket,
        seconds(f.interval_s),
        s.sample,
        f.quit
    ));
    if let Some(w) = f.wrapped {
        out.push(w.to_owned());
    }
    out.push(String::new());
    let d = &s.device;
    out.push(format!(
        "device {} · owner up {}",
        if d.name.is_empty() {
            "(unnamed)"
        } else {
            &d.name
        },
        seconds(d.owner_up_s)
    ));
    match (d.copy, d.compute) {
        (Some(copy), Some(compute)) => {
            out.push(format!(
                "  {:<8} {:>7} {:>14} {:>12} {:>13} {:>8}",
                "unit", "busy", "descriptors/s", "switches/s", "descriptors", "errors"
            ));
            for (name, u) in [("copy", copy), ("compute", compute)] {
                out.push(format!(
                    "  {:<8} {:>7} {:>14} {:>12} {:>13} {:>8}",
                    name,
                    if measured {
                        format!("{:.1} %", u.busy_share * 100.0)
                    } else {
                        "-".into()
                    },
                    rate(measured, u.descriptors_per_s),
                    rate(measured, u.context_switches_per_s),
                    u.descriptors,
                    u.errors
                ));
            }
            out.push(match d.sram_hit_rate {
                Some(r) => format!(
                    "  SRAM hit rate {:.1} % since the device started",
                    r * 100.0
                ),
                None => "  SRAM hit rate: no working set touched yet".into(),
            });
        }
        _ => out.push(
            "  (the owner reads no counters of this device: no busy share, descriptors or \
             device switches)"
                .into(),
        ),
    }
    let o = &s.owner;
    out.push(String::new());
    out.push(format!(
        "owner: {} clients, {} streams · {} frames/s · scheduler switches {}/s · {} resets",
        o.clients,
        o.streams,
        rate(measured, o.frames_per_s),
        rate(measured, o.switches_per_s),
        o.resets
    ));
    out.push(format!(
        "pool: {} mapped for the device · {} frames on the device, {} taken and not completed{}",
        mib(o.mapped_bytes),
        o.on_device,
        o.frames_out,
        if o.departing > 0 {
            format!(" · {} departed clients' pools held", o.departing)
        } else {
            String::new()
        }
    ));
    if !s.sees_all {
        out.push(format!(
            "only this view's own client is shown: the owner shows every client to uid 0 and \
             its own user; this is uid {} (run top as one of them)",
            f.uid
        ));
    }
    out.push(String::new());
    out.push(format!(
        "{:<16} {:<22} {:>9} {:>8} {:>8} {:>8} {:>15} {:>9} {:>5}",
        "stream",
        "client",
        "frames/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "wait/bound ms",
        "frames",
        "lost"
    ));
    if s.streams.is_empty() {
        out.push("(no streams)".into());
    }
    for st in &s.streams {
        let client = match (&st.client_name, st.pid) {
            (Some(n), Some(pid)) => format!("{} {} pid {}", st.client, cut(n, 10), pid),
            _ => format!("{} (gone)", st.client),
        };
        let bound = st.wait_bound_ms.map_or("-".into(), |b| format!("{b:.2}"));
        out.push(format!(
            "{:<16} {:<22} {:>9} {:>8.2} {:>8.2} {:>8.2} {:>15} {:>9} {:>5}",
            cut(&st.name, 16),
            cut(&client, 22),
            rate(measured, st.frames_per_s),
            st.latency_p50_ms,
            st.latency_p99_ms,
            st.latency_max_ms,
            format!("{:.2}/{bound}", st.max_wait_ms),
            st.frames,
            st.lost
        ));
    }
    out.push(String::new());
    out.push(format!(
        "{:<7} {:>8} {:>6}  {:<20} {:>7} {:>9} {:>10} {:>9}",
        "client", "pid", "uid", "name", "streams", "frames/s", "frames out", "pool"
    ));
    for c in &s.clients {
        out.push(format!(
            "{:<7} {:>8} {:>6}  {:<20} {:>7} {:>9} {:>10} {:>9}{}",
            c.client,
            c.pid,
            c.uid,
            cut(&c.name, 20),
            c.streams,
            rate(measured, c.frames_per_s),
            c.frames_out,
            mib(c.pool_bytes),
            if c.this_view { "  (this view)" } else { "" }
        ));
    }
    out.push(String::new());
    out.push(format!(
        "rates and busy shares: over the last {} of the owner's clock",
        if measured {
            seconds(s.interval_s)
        } else {
            "interval (measuring)".into()
        }
    ));
    out.push(
        "latency: since each stream began, from the owner taking a frame to its completion".into(),
    );
    out
}

fn rate(measured: bool, v: f64) -> String {
    if measured {
        format!("{v:.1}")
    } else {
        "-".into()
    }
}

fn seconds(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// `text` cut to `n` characters.
fn cut(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::super::sample::{
        ClientSample, DeviceSample, OwnerSample, Sample, StreamSample, UnitSample,
    };
    use super::*;

    fn a_sample(sees_all: bool) -> Sample {
        let unit = UnitSample {
            busy_share: 0.25,
            busy_ns: 1,
            descriptors: 2,
            descriptors_per_s: 3.0,
            context_switches: 4,
            context_switches_per_s: 5.0,
            errors: 0,
        };
        Sample {
            sample: 3,
            elapsed_s: 3.0,
            interval_s: 1.0,
            socket: "/run/o.sock".into(),
            sees_all,
            this_client: 2,
            device: DeviceSample {
                name: "loopback owner0".into(),
                owner_up_s: 12.0,
                counters: true,
                copy: Some(unit),
                compute: Some(unit),
                sram_hit_rate: Some(0.85),
            },
            owner: OwnerSample {
                clients: 2,
                streams: 1,
                on_device: 1,
                frames_out: 2,
                departing: 0,
                mapped_bytes: 4 << 20,
                frames: 100,
                frames_per_s: 50.0,
                switches: 7,
                switches_per_s: 1.5,
                resets: 0,
                refused: 0,
                closed: 0,
                vanished: 0,
                left: 0,
            },
            streams: vec![StreamSample {
                client: 1,
                pid: Some(42),
                client_name: Some("camera".into()),
                stream: 0,
                name: "live".into(),
                frames: 100,
                frames_per_s: 50.0,
                failed: 0,
                lost: 0,
                latency_p50_ms: 0.5,
                latency_p99_ms: 1.5,
                latency_max_ms: 2.0,
                max_wait_ms: 0.25,
                wait_bound_ms: Some(3.0),
                period_ms: None,
            }],
            clients: vec![ClientSample {
                client: 2,
                pid: 43,
                uid: 0,
                name: "userdma top".into(),
                streams: 0,
                frames_out: 0,
                frames: 0,
                frames_per_s: 0.0,
                pool_bytes: 2 << 20,
                this_view: true,
            }],
        }
    }

    #[test]
    fn the_screen_shows_units_streams_clients_and_a_partial_view() {
        let f = Frame {
            interval_s: 1.0,
            quit: "q quits",
            wrapped: None,
            uid: 1000,
        };
        let text = render(&a_sample(true), &f).join("\n");
        for want in [
            "copy",
            "25.0 %",
            "SRAM hit rate 85.0 %",
            "live",
            "1 camera pid 42",
            "0.25/3.00",
            "(this view)",
            "4.0 MiB",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        assert!(!text.contains("only this view"));
        let text = render(&a_sample(false), &f).join("\n");
        assert!(text.contains("this is uid 1000"), "{text}");
        // No escape sequences: the terminal module adds those.
        assert!(!text.contains('\x1b'));
    }
}
