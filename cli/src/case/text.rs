//! The report as text: the runs side by side with the published figures, then the targets.

use super::figures::{Report, RunFigures};

pub(super) fn print_text(r: &Report) {
    let p = &r.published;
    let runs = [&r.before, &r.after, &r.strict];
    let head: Vec<String> = runs
        .iter()
        .map(|f| format!("{} ({})", f.name, f.policy))
        .collect();
    // The label column fits the longest label: a stream's name and its longest row's title.
    let longest_name = r
        .before
        .streams
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(0);
    let width = 34.max(longest_name + " longest wait / as bounded / bound ms".len());
    let row = |name: &str, cells: Vec<String>, published: String| {
        let cells: String = cells.iter().map(|c| format!(" {c:>20}")).collect();
        println!("{name:<width$}{cells}   {published:>18}");
    };
    row("", head, "published b -> a".into());
    let each = |f: &dyn Fn(&RunFigures) -> String| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
    row(
        "total frames/s",
        each(&|r| format!("{:.1}", r.total_fps)),
        format!("{} -> {}", p.fps_before, p.fps_after),
    );
    let rate = |r: Option<f64>| r.map_or("-".into(), |r| format!("{:.1} %", 100.0 * r));
    for (i, s) in r.before.streams.iter().enumerate() {
        let top = s.priority
            == r.before
                .streams
                .iter()
                .map(|s| s.priority)
                .max()
                .unwrap_or(0);
        row(
            &format!("{} frames/s", s.name),
            each(&|r| format!("{:.1}", r.streams[i].fps)),
            String::new(),
        );
        row(
            &format!("{} latency mean / p99 ms", s.name),
            each(&|r| {
                format!(
                    "{:.0} / {:.0}",
                    r.streams[i].latency_mean_ms, r.streams[i].latency_p99_ms
                )
            }),
            if top {
                format!(
                    "{} -> {} (mean)",
                    p.latency_mean_ms_before, p.latency_mean_ms_after
                )
            } else {
                String::new()
            },
        );
        row(
            &format!("{} longest wait / as bounded / bound ms", s.name),
            each(&|r| {
                let s = &r.streams[i];
                let b = s
                    .stated_wait_bound_ms
                    .map_or("-".into(), |b| format!("{b:.0}"));
                format!(
                    "{:.0} / {:.0} / {b}",
                    s.longest_wait_ms, s.longest_head_wait_ms
                )
            }),
            String::new(),
        );
        row(
            &format!("{} frame service / model ms", s.name),
            each(&|r| {
                let s = &r.streams[i];
                match (s.frame_service_ms, s.modelled_frame_ms) {
                    (Some(f), Some(m)) => format!("{f:.1} / {m:.1}"),
                    _ => "- / -".into(),
                }
            }),
            String::new(),
        );
        row(
            &format!("{} frames arrived (=)", s.name),
            each(&|r| {
                let s = &r.streams[i];
                format!(
                    "{} = {}+{}+{}+{}+{}",
                    s.arrived, s.frames, s.failed, s.lost, s.dropped, s.left_waiting
                )
            }),
            String::new(),
        );
        row(
            &format!("{} SRAM hit rate", s.name),
            each(&|r| rate(r.streams[i].sram_hit_rate)),
            if top {
                "85 -> >82 %".into()
            } else {
                String::new()
            },
        );
    }
    row(
        "allocations/s",
        each(&|r| format!("{:.0}", r.allocations_per_sec)),
        format!(
            "{} -> {}",
            p.allocations_per_sec_before, p.allocations_per_sec_after
        ),
    );
    row(
        "DMA maps/s",
        each(&|r| format!("{:.0}", r.dma_maps_per_sec)),
        String::new(),
    );
    row(
        "context switches/s (device count)",
        each(&|r| format!("{:.1} ({})", r.switches_per_sec, r.device_switches)),
        format!(
            "~{} -> ~{}",
            p.switches_per_sec_before, p.switches_per_sec_after
        ),
    );
    row(
        "device bound frames/s (ratio)",
        each(&|r| {
            format!(
                "{:.1} ({:.2})",
                r.device_bound_fps,
                r.total_fps / r.device_bound_fps.max(1e-9)
            )
        }),
        String::new(),
    );
    println!(
        "every frame checked: {} wrong; published figures: the case study's own, not measured here",
        runs.iter().map(|r| r.wrong).sum::<u64>()
    );
    println!(
        "frames arrived = done + failed + lost (device faults) + dropped (256 waiting) + left waiting at the end; \
         bound: the longest wait the run's scheduler states for the service per frame beside it \
         (the longer of the model's worst frame and the longest a frame held its device)"
    );
    println!();
    println!("{:<52} {:>10} {:>26}  met", "target", "run", "measured");
    for t in &r.targets {
        println!(
            "{:<52} {:>10} {:>26}  {}",
            t.target,
            t.run,
            t.measured,
            if t.met { "yes" } else { "NO" }
        );
    }
    for p in &r.svg {
        println!("wrote {}", p.display());
    }
}
