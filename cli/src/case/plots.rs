//! The plots of `--svg`: every stream's latency CDF in every run, and per run a timeline of
//! which stream's frame held each device when.

use std::path::{Path, PathBuf};

use userdma_infer::stats::{self, svg};

use super::figures::Run;
use super::mix::Mix;
use crate::pipeline::Error;

/// Writes the plots of `runs` to `dir`; returns their paths.
pub(super) fn plots(dir: &Path, mix: &Mix, runs: &[&Run]) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let labels: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            mix.streams
                .iter()
                .map(|s| format!("{} {}", s.name, r.figures.name))
                .collect()
        })
        .collect();
    let mut lines = Vec::new();
    for (r, run) in runs.iter().enumerate() {
        for (i, h) in run.latency.iter().enumerate() {
            lines.push(svg::Cdf {
                label: &labels[r][i],
                histogram: h,
                colour: r * mix.len() + i,
                dashed: r == 0,
            });
        }
    }
    let path = dir.join("latency.svg");
    svg::cdfs(
        "Latency from arrival per stream (dashed: before)",
        &lines,
        &path,
    )?;
    written.push(path);
    let lanes: Vec<String> = (0..mix.len())
        .map(|i| format!("device {} {}", mix.device[i], mix.streams[i].name))
        .collect();
    for run in runs {
        // The last second of the run (or all of it): frames from dispatch to result.
        let end = run.timeline.iter().map(|f| f.done_ns).max().unwrap_or(0);
        let from = end.saturating_sub(1_000_000_000);
        let bars: Vec<svg::Bar> = run
            .timeline
            .iter()
            .filter(|f| f.done_ns >= from)
            .map(|f| svg::Bar {
                lane: f.stream.0,
                span: stats::Span::new(f.dispatch_ns.max(from), f.done_ns),
                colour: f.stream.0,
            })
            .collect();
        let path = dir.join(format!("timeline-{}.svg", run.figures.name));
        let title = format!(
            "{} ({}): which stream held its device, last second",
            run.figures.name, run.figures.policy
        );
        svg::lanes(&title, &lanes, &bars, &path)?;
        written.push(path);
    }
    Ok(written)
}
