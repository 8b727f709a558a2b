//! SVG plots of a [`Recorder`]: the latency CDF and the timeline of recent frames.
//!
//! Each plot is drawn into memory with `plotters`' SVG backend, then written to the path the
//! caller names; nothing else touches the file system.

use std::path::Path;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use super::{Error, Recorder, Stage};

/// Plot size in pixels.
const SIZE: (u32, u32) = (1000, 600);

/// One line per stage in the CDF plot and one bar colour per stage in the legend.
fn stage_colour(stage: Stage) -> RGBColor {
    match stage {
        Stage::Preprocess => RGBColor(0x8c, 0x56, 0x4b),
        Stage::QueueWait => RGBColor(0x7f, 0x7f, 0x7f),
        Stage::ToDevice => RGBColor(0x1f, 0x77, 0xb4),
        Stage::Compute => RGBColor(0xd6, 0x27, 0x28),
        Stage::ToHost => RGBColor(0x2c, 0xa0, 0x2c),
        Stage::Postprocess => RGBColor(0x94, 0x67, 0xbd),
    }
}

fn draw_error<E: std::error::Error + Send + Sync>(
    path: &Path,
) -> impl FnOnce(DrawingAreaErrorKind<E>) -> Error + '_ {
    move |e| Error::Draw {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

fn write(path: &Path, svg: &str) -> Result<(), Error> {
    std::fs::write(path, svg).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

/// The CDF of a histogram as a step line: `(latency_ms, fraction at or below)`, rising at each
/// recorded value from the fraction below it.
fn cdf(h: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    let total = h.len() as f64;
    if total == 0.0 {
        return Vec::new();
    }
    let mut points = Vec::new();
    let mut seen = 0u64;
    for v in h.iter_recorded() {
        let x = h.highest_equivalent(v.value_iterated_to()) as f64 / 1e6;
        points.push((x, seen as f64 / total));
        seen += v.count_since_last_iteration();
        points.push((x, seen as f64 / total));
    }
    points
}

/// Draws the end-to-end latency CDF, with one line per stage that has values, to `path`
/// (x: latency in ms, y: fraction of frames at or below it).
///
/// An empty recorder gives empty axes.
pub fn latency_cdf(recorder: &Recorder, path: impl AsRef<Path>) -> Result<(), Error> {
    let mut lines = vec![Line {
        label: "end_to_end",
        colour: BLACK.to_rgba(),
        points: cdf(recorder.end_to_end_histogram()),
        dashed: false,
    }];
    for stage in Stage::ALL {
        let points = cdf(recorder.histogram(stage));
        if !points.is_empty() {
            lines.push(Line {
                label: stage.name(),
                colour: stage_colour(stage).to_rgba(),
                points,
                dashed: false,
            });
        }
    }
    draw_cdfs("Latency CDF", &lines, path.as_ref())
}

/// One CDF line to draw.
struct Line<'a> {
    label: &'a str,
    colour: RGBAColor,
    points: Vec<(f64, f64)>,
    dashed: bool,
}

/// Draws CDF lines on one pair of axes (x: latency in ms, y: fraction at or below), with a
/// legend, to `path`.
fn draw_cdfs(title: &str, lines: &[Line<'_>], path: &Path) -> Result<(), Error> {
    let x_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|&(x, _)| x))
        .fold(0.0f64, f64::max)
        .max(1e-6);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error(path))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max * 1.05, 0.0..1.0)
            .map_err(draw_error(path))?;
        chart
            .configure_mesh()
            .x_desc("latency (ms)")
            .y_desc("fraction of frames")
            .draw()
            .map_err(draw_error(path))?;
        for line in lines {
            let style = line.colour.stroke_width(2);
            let points = line.points.iter().copied();
            let series = if line.dashed {
                chart.draw_series(DashedLineSeries::new(points, 8, 5, style))
            } else {
                chart.draw_series(LineSeries::new(points, style))
            };
            let dashed = line.dashed;
            series
                .map_err(draw_error(path))?
                .label(line.label)
                .legend(move |(x, y)| {
                    let end = if dashed { x + 8 } else { x + 20 };
                    PathElement::new([(x, y), (end, y)], style)
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(draw_error(path))?;
        root.present().map_err(draw_error(path))?;
    }
    write(path, &svg)
}

/// Draws the timeline frames to `path`: one row per stage, one bar per span, bars coloured by
/// frame number (a cycling palette), x = time in ms since the first span start.
///
/// Where a DMA row's bar sits above a compute bar, data moved while the device computed; a
/// column with no bar in the compute row is a bubble.
pub fn timeline(recorder: &Recorder, path: impl AsRef<Path>) -> Result<(), Error> {
    let path = path.as_ref();
    let spans: Vec<(u64, Stage, super::Span)> = recorder
        .timeline()
        .flat_map(|f| {
            Stage::ALL
                .into_iter()
                .filter_map(move |s| f.span(s).map(|span| (f.frame, s, span)))
        })
        .collect();
    let origin = spans.iter().map(|(_, _, s)| s.start_ns).min().unwrap_or(0);
    let end = spans.iter().map(|(_, _, s)| s.end_ns).max().unwrap_or(0);
    let ms = |ns: u64| (ns - origin) as f64 / 1e6;
    let x_max = ms(end.max(origin)).max(1e-6);
    // Segments 0..=5 of the y axis, one per stage, preprocess at the top.
    let top = Stage::Postprocess as i32;
    let row = |s: Stage| top - s as i32;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error(path))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Pipeline timeline (last frames)", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(100)
            .build_cartesian_2d(0.0..x_max * 1.02, (0..top).into_segmented())
            .map_err(draw_error(path))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("time (ms)")
            .y_desc("stage")
            .y_labels(Stage::ALL.len())
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(top - i)
                    .ok()
                    .and_then(|i| Stage::ALL.get(i))
                    .map_or_else(String::new, |s| s.name().to_owned()),
                SegmentValue::Last => String::new(),
            })
            .draw()
            .map_err(draw_error(path))?;
        chart
            .draw_series(spans.iter().map(|&(frame, stage, span)| {
                let colour = Palette99::pick(usize::try_from(frame % 99).unwrap_or(0));
                Rectangle::new(
                    [
                        (ms(span.start_ns), SegmentValue::Exact(row(stage))),
                        (ms(span.end_ns), SegmentValue::Exact(row(stage) + 1)),
                    ],
                    colour.filled(),
                )
            }))
            .map_err(draw_error(path))?;
        root.present().map_err(draw_error(path))?;
    }
    write(path, &svg)
}

/// One line of a [`cdfs`] plot.
#[derive(Debug, Clone, Copy)]
pub struct Cdf<'a> {
    /// Its legend.
    pub label: &'a str,
    /// The values (ns).
    pub histogram: &'a hdrhistogram::Histogram<u64>,
    /// Its colour, an index into a fixed palette (equal indices, equal colours).
    pub colour: usize,
    /// Drawn dashed (e.g. the baseline of a before/after pair).
    pub dashed: bool,
}

/// Draws several latency CDFs on one pair of axes to `path` (x: latency in ms, y: fraction of
/// frames at or below it): e.g. each stream before and after a change. Lines with no values
/// are left out of the plot but keep their legend.
pub fn cdfs(title: &str, lines: &[Cdf<'_>], path: impl AsRef<Path>) -> Result<(), Error> {
    let lines: Vec<Line<'_>> = lines
        .iter()
        .map(|l| Line {
            label: l.label,
            colour: Palette99::pick(l.colour).to_rgba(),
            points: cdf(l.histogram),
            dashed: l.dashed,
        })
        .collect();
    draw_cdfs(title, &lines, path.as_ref())
}

/// One bar of a [`lanes`] plot: `[start_ns, end_ns)` in lane `lane`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bar {
    /// Its lane (index into the lane names).
    pub lane: usize,
    /// Its span (ns on any common clock).
    pub span: super::Span,
    /// Its colour, an index into the palette of [`cdfs`].
    pub colour: usize,
}

/// Draws bars in named lanes to `path` (x: time in ms from the earliest bar, one row per lane,
/// the first at the top): e.g. which stream's frame held the device when, one lane per
/// stream, so a change of lane is a context switch and a gap is an idle device.
///
/// # Errors
/// [`Error::Draw`] for a bar whose lane has no name; [`Error::Write`] when the file cannot
/// be written.
pub fn lanes(
    title: &str,
    names: &[String],
    bars: &[Bar],
    path: impl AsRef<Path>,
) -> Result<(), Error> {
    let path = path.as_ref();
    if let Some(b) = bars.iter().find(|b| b.lane >= names.len()) {
        return Err(Error::Draw {
            path: path.to_owned(),
            reason: format!(
                "a bar in lane {} of {} named lanes: name every lane",
                b.lane,
                names.len()
            ),
        });
    }
    let origin = bars.iter().map(|b| b.span.start_ns).min().unwrap_or(0);
    let end = bars.iter().map(|b| b.span.end_ns).max().unwrap_or(0);
    let ms = |ns: u64| ns.saturating_sub(origin) as f64 / 1e6;
    let x_max = ms(end).max(1e-6);
    let rows = i32::try_from(names.len().max(1)).unwrap_or(i32::MAX);
    let row = |lane: usize| rows - 1 - i32::try_from(lane).unwrap_or(0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_error(path))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(160)
            // Segments 0..=rows-1, one per lane (a segmented range holds its end too).
            .build_cartesian_2d(0.0..x_max * 1.02, (0..(rows - 1).max(1)).into_segmented())
            .map_err(draw_error(path))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("time (ms)")
            .y_labels(names.len().max(1))
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => usize::try_from(rows - 1 - i)
                    .ok()
                    .and_then(|i| names.get(i))
                    .cloned()
                    .unwrap_or_default(),
                SegmentValue::Last => String::new(),
            })
            .draw()
            .map_err(draw_error(path))?;
        chart
            .draw_series(bars.iter().map(|b| {
                Rectangle::new(
                    [
                        (ms(b.span.start_ns), SegmentValue::Exact(row(b.lane))),
                        (ms(b.span.end_ns), SegmentValue::Exact(row(b.lane) + 1)),
                    ],
                    Palette99::pick(b.colour).filled(),
                )
            }))
            .map_err(draw_error(path))?;
        // A thin white edge, so back-to-back bars stay apart.
        chart
            .draw_series(bars.iter().map(|b| {
                Rectangle::new(
                    [
                        (ms(b.span.start_ns), SegmentValue::Exact(row(b.lane))),
                        (ms(b.span.end_ns), SegmentValue::Exact(row(b.lane) + 1)),
                    ],
                    WHITE.stroke_width(1),
                )
            }))
            .map_err(draw_error(path))?;
        root.present().map_err(draw_error(path))?;
    }
    write(path, &svg)
}
