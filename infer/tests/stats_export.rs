//! The report's exports: Prometheus text that follows the 0.0.4 exposition grammar, JSON, and
//! the SVG plots written to files.

use std::collections::HashMap;
use std::time::Instant;

use userdma_infer::stats::{self, svg, Frame, Recorder, Stage};

/// A pipelined run: frame `n` starts at `n * 100` ns, so DMA of one frame overlaps compute of
/// the one before it.
fn recorder(frames: u64) -> Recorder {
    let mut r = Recorder::new(Instant::now(), 32);
    for n in 0..frames {
        let t = n * 100;
        let mut f = Frame::new(n, (n % 2) as u32);
        f.set(Stage::Preprocess, t, t + 20)
            .set(Stage::ToDevice, t + 20, t + 50)
            .set(Stage::QueueWait, t + 50, t + 60)
            .set(Stage::Compute, t + 60, t + 160)
            .set(Stage::ToHost, t + 160, t + 180);
        if n % 2 == 0 {
            f.set(Stage::Postprocess, t + 180, t + 200);
        }
        r.record(&f);
        r.counters.frames += 1;
        r.counters.doorbells += 2;
        r.counters.bytes_to_device += 4096;
    }
    r
}

fn is_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A parsed sample: metric name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses `{a="x",b="y"}` (the braces stripped) into pairs; `Err` on any syntax error.
fn labels(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or(format!("no '=' in {rest:?}"))?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let value = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or(format!("unquoted value in {rest:?}"))?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in value.char_indices() {
            match (escaped, c) {
                (true, '\\' | '"' | 'n') => escaped = false,
                (true, _) => return Err(format!("bad escape in {value:?}")),
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, '\n') => return Err("newline in label value".into()),
                (false, _) => {}
            }
        }
        let end = end.ok_or(format!("unterminated value in {rest:?}"))?;
        out.push((name.to_owned(), value[..end].to_owned()));
        rest = &value[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.is_empty() {
            return Err(format!("junk after label: {rest:?}"));
        }
    }
    Ok(out)
}

/// Checks `text` against the text exposition format 0.0.4 line by line: HELP and TYPE lines
/// well formed, one TYPE per family before its samples, sample names and labels by the
/// grammar, values floats, summaries' quantile labels and `_sum`/`_count`. Returns the
/// samples as `(name, labels, value)`.
fn check(text: &str) -> Result<Vec<Sample>, String> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    if !text.ends_with('\n') {
        return Err("text does not end with a newline".into());
    }
    for (i, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let tail = parts.next().unwrap_or("");
            if !is_name(name) {
                return Err(at(format!("bad metric name {name:?}")));
            }
            match kw {
                "HELP" => {}
                "TYPE" => {
                    if !["counter", "gauge", "summary", "histogram", "untyped"].contains(&tail) {
                        return Err(at(format!("bad type {tail:?}")));
                    }
                    if types.insert(name.to_owned(), tail.to_owned()).is_some() {
                        return Err(at("second TYPE for a family".into()));
                    }
                    if samples
                        .iter()
                        .any(|(n, _, _): &(String, _, _)| n.starts_with(name))
                    {
                        return Err(at("TYPE after the family's samples".into()));
                    }
                }
                _ => return Err(at("comment that is neither HELP nor TYPE".into())),
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            return Err(at("empty line or malformed comment".into()));
        }
        let (head, value) = line.rsplit_once(' ').ok_or(at("no value".into()))?;
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .map_err(|_| at(format!("value {v:?} is not a float")))?,
        };
        if value.is_nan() {
            return Err(at("NaN".into()));
        }
        let (name, labels) = match head.split_once('{') {
            Some((n, l)) => (
                n,
                labels(l.strip_suffix('}').ok_or(at("no closing brace".into()))?).map_err(at)?,
            ),
            None => (head, Vec::new()),
        };
        if !is_name(name) {
            return Err(at(format!("bad metric name {name:?}")));
        }
        let family = [
            name,
            name.trim_end_matches("_sum"),
            name.trim_end_matches("_count"),
        ]
        .into_iter()
        .find(|f| types.contains_key(*f))
        .ok_or(at("sample without a TYPE before it".into()))?;
        let kind = &types[family];
        let has_quantile = labels.iter().any(|(k, _)| k == "quantile");
        match kind.as_str() {
            "summary" if name == family => {
                let q = labels
                    .iter()
                    .find(|(k, _)| k == "quantile")
                    .ok_or(at("no quantile".into()))?;
                let q: f64 = q.1.parse().map_err(|_| at("quantile not a float".into()))?;
                if !(0.0..=1.0).contains(&q) {
                    return Err(at("quantile out of [0, 1]".into()));
                }
            }
            "summary" if has_quantile => return Err(at("quantile on _sum or _count".into())),
            "counter" if !name.ends_with("_total") => {
                return Err(at("counter without _total".into()))
            }
            "counter" | "gauge" if name != family => {
                return Err(at("suffix on a counter or gauge".into()))
            }
            "counter" if value < 0.0 => return Err(at("negative counter".into())),
            _ => {}
        }
        samples.push((name.to_owned(), labels, value));
    }
    Ok(samples)
}

#[test]
fn the_checker_rejects_bad_text() {
    assert!(
        check("# TYPE a counter\na_total 1\n").is_err(),
        "TYPE names a, sample a_total"
    );
    assert!(check("x 1\n").is_err(), "no TYPE");
    assert!(check("# TYPE x gauge\nx{a=\"1\" 1\n").is_err());
    assert!(check("# TYPE x gauge\nx{1a=\"1\"} 1\n").is_err());
    assert!(check("# TYPE x gauge\nx one\n").is_err());
    assert!(check("# TYPE x gauge\nx NaN\n").is_err());
    assert!(check("# TYPE 9x gauge\n9x 1\n").is_err());
    assert!(
        check("# TYPE s summary\ns 1\n").is_err(),
        "summary sample without quantile"
    );
    assert!(check("# TYPE x gauge\nx{a=\"1\",b=\"q\\\"\"} 1.5e3\n").is_ok());
}

#[test]
fn prometheus_text_follows_the_grammar() {
    let report = recorder(50).report();
    let text = report.prometheus("npu-pipeline");
    let samples = check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let get = |name: &str, label: Option<(&str, &str)>| {
        samples
            .iter()
            .find(|(n, l, _)| {
                n == name && label.is_none_or(|(k, v)| l.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no {name} {label:?} in\n{text}"))
    };
    assert_eq!(get("npu_pipeline_recorded_frames_total", None), 50.0);
    assert_eq!(get("npu_pipeline_doorbells_total", None), 100.0);
    assert_eq!(
        get("npu_pipeline_bytes_to_device_total", None),
        50.0 * 4096.0
    );
    assert_eq!(
        get(
            "npu_pipeline_stage_latency_seconds_count",
            Some(("stage", "postprocess"))
        ),
        25.0
    );
    assert_eq!(
        get(
            "npu_pipeline_stage_latency_seconds",
            Some(("stage", "compute"))
        ),
        100e-9
    );
    assert_eq!(
        get(
            "npu_pipeline_stage_latency_seconds_sum",
            Some(("stage", "compute"))
        ),
        5000e-9
    );
    assert_eq!(
        get(
            "npu_pipeline_end_to_end_latency_seconds",
            Some(("quantile", "0.99"))
        ),
        200e-9
    );
    assert_eq!(
        get("npu_pipeline_data_movement_share", None),
        report.timeline.data_movement_share
    );
    // Six stages, four quantiles each, plus four for end to end.
    let quantiles = samples
        .iter()
        .filter(|(_, l, _)| l.iter().any(|(k, _)| k == "quantile"));
    assert_eq!(quantiles.count(), 6 * 4 + 4);
    assert!(text.contains("# TYPE npu_pipeline_dma_compute_overlap_ratio gauge\n"));
    assert!(text.contains("# TYPE npu_pipeline_stage_latency_seconds summary\n"));
    // No prefix: bare names.
    assert!(check(&report.prometheus(""))
        .unwrap()
        .iter()
        .any(|(n, _, _)| n == "frames_per_second"));
}

#[test]
fn pipelined_run_overlaps_dma_and_compute() {
    let t = recorder(50).report().timeline;
    // The timeline keeps frames 18..=49. Frame n's DMA to the device lies inside frame n-1's
    // compute (30 ns, for n = 19..=49) and its DMA to the host overlaps frame n+1's compute
    // (20 ns, for n = 18..=48): 31 * 50 = 1550 ns with both. DMA or compute is active from
    // 1820 (frame 18 to device) to 5080 (frame 49 to host) except frame 18's queue wait,
    // [1850, 1860): 3250 ns.
    assert_eq!(t.frames, 32);
    assert_eq!(t.dma_compute_overlap, 1550.0 / 3250.0);
    // In flight: 16 frames of 200 ns and 16 of 180 ns over [1800, 5080).
    assert_eq!(t.occupancy_mean, (16.0 * 200.0 + 16.0 * 180.0) / 3280.0);
    assert_eq!(t.occupancy_max, 2);
    // DMA is 50 ns of each frame.
    assert_eq!(
        t.data_movement_share,
        32.0 * 50.0 / (16.0 * 200.0 + 16.0 * 180.0)
    );
}

#[test]
fn json_round_trips_through_serde_json() {
    let report = recorder(10).report();
    let v: serde_json::Value = serde_json::from_str(&report.to_json_string()).unwrap();
    assert_eq!(v["frames"], 10);
    assert_eq!(v["counters"]["doorbells"], 20);
    assert_eq!(v["counters_per_frame"]["doorbells"], 2.0);
    assert_eq!(v["stages"].as_array().unwrap().len(), 6);
    assert_eq!(v["timeline"]["verdict"], "at_or_above_rule");
}

#[test]
fn svg_plots_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let r = recorder(20);
    let spans: usize = r.timeline().map(|f| f.spans.iter().flatten().count()).sum();
    assert_eq!(spans, 20 * 5 + 10);

    let timeline = dir.path().join("timeline.svg");
    svg::timeline(&r, &timeline).unwrap();
    let text = std::fs::read_to_string(&timeline).unwrap();
    assert!(
        text.starts_with("<svg") && text.trim_end().ends_with("</svg>"),
        "{text:.200}"
    );
    assert!(
        text.matches("<rect").count() >= spans,
        "{} rects",
        text.matches("<rect").count()
    );
    assert!(text.contains("time (ms)") && text.contains("compute") && text.contains("queue_wait"));

    let cdf = dir.path().join("cdf.svg");
    svg::latency_cdf(&r, &cdf).unwrap();
    let text = std::fs::read_to_string(&cdf).unwrap();
    assert!(text.starts_with("<svg"));
    // End to end and six stages: one line each, and one in the legend for each.
    let lines: Vec<&str> = text
        .split("<polyline")
        .skip(1)
        .filter(|l| {
            l.split('>')
                .next()
                .unwrap_or("")
                .contains("stroke-width=\"2\"")
        })
        .collect();
    assert_eq!(lines.len(), 14, "{text}");
    // The end-to-end line (black) steps up at 180 ns to 0.5 and at 200 ns to 1: four points.
    let end_to_end = lines
        .iter()
        .find(|l| l.contains("stroke=\"#000000\"") && l.contains("points"))
        .expect("no end-to-end line");
    let points = end_to_end
        .split("points=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert_eq!(points.split_whitespace().count(), 4, "{points}");
    assert!(text.contains("latency (ms)") && text.contains("Latency CDF"));

    // An empty recorder still draws (empty axes).
    let empty = Recorder::new(Instant::now(), 4);
    svg::timeline(&empty, dir.path().join("empty-timeline.svg")).unwrap();
    svg::latency_cdf(&empty, dir.path().join("empty-cdf.svg")).unwrap();
}

#[test]
fn an_unwritable_path_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("plot.svg");
    let err = svg::latency_cdf(&recorder(3), &path).unwrap_err();
    assert!(matches!(err, stats::Error::Write { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("plot.svg") && text.contains("directory exists"),
        "{text}"
    );
}

#[test]
fn cdfs_and_lanes_draw_what_they_are_given() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).unwrap();
    let mut b = a.clone();
    for v in [10_000_000u64, 20_000_000] {
        a.record(v).unwrap();
    }
    b.record(5_000_000).unwrap();
    let empty = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let path = dir.path().join("cdfs.svg");
    let lines = [
        svg::Cdf {
            label: "live before",
            histogram: &a,
            colour: 0,
            dashed: true,
        },
        svg::Cdf {
            label: "live after",
            histogram: &b,
            colour: 0,
            dashed: false,
        },
        svg::Cdf {
            label: "none",
            histogram: &empty,
            colour: 1,
            dashed: false,
        },
    ];
    svg::cdfs("Latency per stream", &lines, &path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("<svg") && text.contains("Latency per stream"));
    for label in ["live before", "live after", "none"] {
        assert!(text.contains(label), "{label} missing");
    }
    // The dashed line is drawn as many short pieces, the solid one as one polyline.
    assert!(text.matches("<polyline").count() > 4, "{text:.400}");

    let names = vec!["dev0 live".to_owned(), "dev0 playback".to_owned()];
    let bars: Vec<svg::Bar> = (0..10u64)
        .map(|i| svg::Bar {
            lane: (i % 2) as usize,
            span: stats::Span::new(i * 20_000_000, i * 20_000_000 + 18_000_000),
            colour: (i % 2) as usize,
        })
        .collect();
    let path = dir.path().join("lanes.svg");
    svg::lanes("Who ran when", &names, &bars, &path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("Who ran when") && text.contains("dev0 playback"));
    assert!(text.matches("<rect").count() >= 10);
    // A bar in a lane with no name is refused, naming the file.
    let bad = [svg::Bar { lane: 2, ..bars[0] }];
    let err = svg::lanes("x", &names, &bad, dir.path().join("bad.svg")).unwrap_err();
    assert!(err.to_string().contains("lane 2"), "{err}");
    assert!(!dir.path().join("bad.svg").exists());
}
