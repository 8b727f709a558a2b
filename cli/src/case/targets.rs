//! The case's targets, met or not: every run's (every frame accounted for, every stream within
//! its stated bound) and an "after" run's against "before".

use super::figures::{RunFigures, StreamFigures, Target};

/// The targets every run has: every frame accounted for, and (for the runs a scheduler
/// dispatches to devices) no stream waiting longer than its stated bound.
pub(super) fn run_targets(r: &RunFigures) -> Vec<Target> {
    let mut t = Vec::new();
    let accounted = r.streams.iter().all(StreamFigures::accounted);
    let arrived: u64 = r.streams.iter().map(|s| s.arrived).sum();
    t.push(Target {
        target: "every frame accounted for".into(),
        run: r.name,
        measured: format!("{arrived} arrived"),
        met: accounted,
    });
    if r.streams.iter().any(|s| s.bound_at_model_ms.is_some()) {
        // A stream with a bound at the model's pace but none at its device's: the device ran
        // so far behind its model that no bound exists (its forced frames could fill it).
        let unbounded = r
            .streams
            .iter()
            .find(|s| s.bound_at_model_ms.is_some() && s.stated_wait_bound_ms.is_none());
        let within = unbounded.is_none()
            && r.streams.iter().all(|s| {
                s.stated_wait_bound_ms
                    .is_none_or(|bound| s.longest_head_wait_ms <= bound)
            });
        let measured = match unbounded {
            Some(s) => format!(
                "{}: no bound at a {:.0} ms frame (model {:.0} ms)",
                s.name,
                s.frame_service_ms.unwrap_or(0.0),
                s.modelled_frame_ms.unwrap_or(0.0)
            ),
            None => {
                let worst = r
                    .streams
                    .iter()
                    .filter_map(|s| s.stated_wait_bound_ms.map(|b| s.longest_head_wait_ms / b))
                    .fold(0.0f64, f64::max);
                format!("longest wait {worst:.2}x its bound")
            }
        };
        t.push(Target {
            target: "every stream within its stated wait bound".into(),
            run: r.name,
            measured,
            met: within,
        });
    }
    t
}

/// The case's targets for an "after" run against "before".
pub(super) fn targets(b: &RunFigures, a: &RunFigures) -> Vec<Target> {
    let mut t = Vec::new();
    let mut add = |target: String, measured: String, met: bool| {
        t.push(Target {
            target,
            run: a.name,
            measured,
            met,
        });
    };
    let ratio = a.total_fps / b.total_fps.max(1e-9);
    add(
        "total frames/s at least 2x before".into(),
        format!("{ratio:.2}x"),
        ratio >= 2.0,
    );
    let share = a.total_fps / a.device_bound_fps.max(1e-9);
    add(
        "total frames/s at least 0.95x the device bound".into(),
        format!("{share:.3}x"),
        share >= 0.95,
    );
    add(
        "0 allocations/s and 0 DMA maps/s".into(),
        format!("{:.0} / {:.0}", a.allocations_per_sec, a.dma_maps_per_sec),
        a.allocations_per_sec == 0.0 && a.dma_maps_per_sec == 0.0,
    );
    let fewer = 1.0 - a.switches_per_sec / b.switches_per_sec.max(1e-9);
    add(
        "context switches down at least 70 %".into(),
        format!("{:.0} %", 100.0 * fewer),
        b.switches_per_sec > 0.0 && fewer >= 0.70,
    );
    for s in &a.streams {
        if let Some(fps) = s.target_fps {
            // The first and last frame of a run fall at its edges: 1 frame of slack.
            let keeps = s.fps * a.seconds + 1.0 >= f64::from(fps) * a.seconds;
            let budget = 1000.0 / f64::from(fps);
            add(
                format!("{} keeps {fps} FPS with p99 under {budget:.0} ms", s.name),
                format!("{:.1} FPS, p99 {:.1} ms", s.fps, s.latency_p99_ms),
                keeps && s.latency_p99_ms < budget,
            );
        }
        if let Some(w) = s.max_wait_ms {
            add(
                format!("no {} frame waits longer than W = {w} ms", s.name),
                format!("longest {:.1} ms", s.longest_wait_ms),
                s.longest_wait_ms <= w as f64,
            );
        }
    }
    t
}
