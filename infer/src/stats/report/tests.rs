use super::*;
use crate::stats::Frame;
use std::time::Instant;

fn frame(n: u64, spans: &[(Stage, u64, u64)]) -> Frame {
    let mut f = Frame::new(n, 0);
    for &(s, a, b) in spans {
        f.set(s, a, b);
    }
    f
}

#[test]
fn percentiles_of_a_known_set() {
    let mut r = Recorder::new(Instant::now(), 0);
    // Compute takes 1..=1000 ns: values below 2048 are exact at 3 significant digits.
    for v in 1..=1000u64 {
        r.record(&frame(v, &[(Stage::Compute, 0, v)]));
    }
    let l = *r.report().stage(Stage::Compute);
    assert_eq!(l.count, 1000);
    assert_eq!(l.sum_ns, 500_500);
    assert_eq!(l.mean_ns, 500.5);
    assert_eq!(
        (l.p50_ns, l.p90_ns, l.p99_ns, l.p999_ns, l.max_ns),
        (500, 900, 990, 999, 1000)
    );
    // Above 2048 ns the histogram is within 0.1 %.
    let mut r = Recorder::new(Instant::now(), 0);
    for v in 1..=100u64 {
        r.record(&frame(v, &[(Stage::ToHost, 0, v * 1_000_000)]));
    }
    let l = *r.report().stage(Stage::ToHost);
    assert!(l.p50_ns.abs_diff(50_000_000) <= 50_000, "{}", l.p50_ns);
    assert!(l.p99_ns.abs_diff(99_000_000) <= 99_000, "{}", l.p99_ns);
    assert_eq!(l.mean_ns, 50_500_000.0);
    // The maximum is exact, and no quantile is above it.
    assert_eq!(l.max_ns, 100_000_000);
    assert_eq!(l.p999_ns, 100_000_000);
}

#[test]
fn hand_made_timeline() {
    let mut r = Recorder::new(Instant::now(), 16);
    // Frame 0: DMA [0,10), compute [10,20). Frame 1: DMA [15,25), compute [25,40).
    r.record(&frame(
        0,
        &[(Stage::ToDevice, 0, 10), (Stage::Compute, 10, 20)],
    ));
    r.record(&frame(
        1,
        &[(Stage::ToDevice, 15, 25), (Stage::Compute, 25, 40)],
    ));
    let t = r.report().timeline;
    // Frame 0's compute [10,20) and frame 1's DMA [15,25) overlap on [15,20); frame 0's
    // DMA and compute only touch at 10, and so do frame 1's at 25. Either is active over
    // [0,40).
    assert_eq!(t.dma_compute_overlap, 5.0 / 40.0);
    // In flight: [0,20) and [15,40): 45 ns of frames over a 40 ns window, two at once.
    assert_eq!(t.occupancy_mean, 45.0 / 40.0);
    assert_eq!(t.occupancy_max, 2);
    assert_eq!(t.data_movement_share, 20.0 / 45.0);
    assert_eq!(t.verdict, Verdict::AtOrAboveRule);
    assert_eq!(t.frames, 2);
}

#[test]
fn overlap_of_dma_0_10_and_compute_5_15() {
    let mut r = Recorder::new(Instant::now(), 4);
    r.record(&frame(0, &[(Stage::ToDevice, 0, 10)]));
    r.record(&frame(1, &[(Stage::Compute, 5, 15)]));
    assert_eq!(r.report().timeline.dma_compute_overlap, 5.0 / 15.0);
}

#[test]
fn share_below_the_rule_and_split() {
    let mut r = Recorder::new(Instant::now(), 4);
    r.counters.frames = 2;
    r.counters.doorbells = 6;
    // Each frame: 10 pre, 5 queue, 10 to device, 160 compute, 5 to host, 10 post = 200.
    for n in 0..2 {
        let t = n * 1000;
        r.record(&frame(
            n,
            &[
                (Stage::Preprocess, t, t + 10),
                (Stage::QueueWait, t + 10, t + 15),
                (Stage::ToDevice, t + 15, t + 25),
                (Stage::Compute, t + 25, t + 185),
                (Stage::ToHost, t + 185, t + 190),
                (Stage::Postprocess, t + 190, t + 200),
            ],
        ));
    }
    let rep = r.report();
    assert_eq!(rep.timeline.data_movement_share, 0.075);
    assert_eq!(rep.timeline.verdict, Verdict::BelowRule);
    assert_eq!(
        rep.split,
        Split {
            queue_wait_ns: 5.0,
            dma_ns: 15.0,
            compute_ns: 160.0,
            host_ns: 20.0,
            gaps_ns: 0.0
        }
    );
    assert_eq!(rep.wall_ns, 1200);
    assert_eq!(rep.frames_per_second, 2.0 / 1.2e-6);
    assert_eq!(rep.counters_per_frame.doorbells, 3.0);
    assert_eq!(rep.counters_per_frame.frames, 1.0);
    // Half of the window has a frame in flight.
    assert_eq!(rep.timeline.occupancy_mean, 400.0 / 1200.0);
    assert_eq!(rep.timeline.occupancy_max, 1);
}

#[test]
fn frame_with_missing_stages() {
    let mut r = Recorder::new(Instant::now(), 4);
    // Compute only, then queue wait and a gap before to-host: 100 ns in flight.
    r.record(&frame(
        0,
        &[(Stage::QueueWait, 0, 20), (Stage::ToHost, 60, 100)],
    ));
    let mut failed = frame(1, &[]);
    failed.ok = false;
    r.record(&failed);
    let rep = r.report();
    assert_eq!(rep.frames, 2);
    assert_eq!(rep.failed_frames, 1);
    assert_eq!(rep.stage(Stage::Compute).count, 0);
    assert_eq!(rep.stage(Stage::QueueWait).count, 1);
    assert_eq!(rep.end_to_end.count, 1);
    assert_eq!(rep.end_to_end.max_ns, 100);
    // Per recorded frame (2): 10 queue, 20 DMA; end to end 50 per frame, so 20 of gaps.
    assert_eq!(rep.split.queue_wait_ns, 10.0);
    assert_eq!(rep.split.dma_ns, 20.0);
    assert_eq!(rep.split.gaps_ns, 20.0);
    assert_eq!(rep.timeline.dma_compute_overlap, 0.0);
    assert_eq!(rep.timeline.data_movement_share, 0.4);
}

#[test]
fn empty_recorder_reports_zeros() {
    let r = Recorder::new(Instant::now(), 8);
    let rep = r.report();
    assert_eq!(rep.frames, 0);
    assert_eq!(rep.wall_ns, 0);
    assert_eq!(rep.frames_per_second, 0.0);
    assert_eq!(rep.end_to_end, Latency::default());
    assert!(rep.stages.iter().all(|s| s.latency == Latency::default()));
    assert_eq!(rep.split, Split::default());
    assert_eq!(rep.timeline.dma_compute_overlap, 0.0);
    assert_eq!(rep.timeline.occupancy_mean, 0.0);
    assert_eq!(rep.timeline.occupancy_max, 0);
    assert_eq!(rep.timeline.data_movement_share, 0.0);
    assert_eq!(rep.timeline.verdict, Verdict::NoData);
    assert_eq!(rep.counters_per_frame, CountersPerFrame::default());
    let json = rep.to_json_string();
    assert!(!json.contains("NaN") && !json.contains("null"), "{json}");
    assert!(!rep.prometheus("x").contains("NaN"));
}

#[test]
fn json_names_the_fields() {
    let mut r = Recorder::new(Instant::now(), 1);
    r.record(&frame(0, &[(Stage::Compute, 0, 7)]));
    let v: serde_json::Value = serde_json::from_str(&r.report().to_json_string()).unwrap();
    assert_eq!(v["frames"], 1);
    assert_eq!(v["stages"][3]["stage"], "compute");
    assert_eq!(v["stages"][3]["p50_ns"], 7);
    assert_eq!(v["timeline"]["verdict"], "below_rule");
    assert_eq!(v["counters"]["doorbells"], 0);
}

#[test]
fn prefix_is_sanitised() {
    assert_eq!(sanitise("my-app.v2"), "my_app_v2");
    assert_eq!(sanitise("9lives"), "_9lives");
    assert_eq!(sanitise("ns:sub"), "ns:sub");
}
