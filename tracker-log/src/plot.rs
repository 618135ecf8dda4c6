//! `gpu-mem-track plot`: memory over track points as an SVG or PNG, with the source lines as
//! labels, a legend, axes in MiB and the peak marked.
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::log::{ParsedLog, DEVICE_USED, NVML_USED};
use crate::report::Dialect;

/// Errors of [`plot_log`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The output's extension is neither `.svg` nor `.png`.
    #[error("output {0}: the file name must end in .svg or .png")]
    UnsupportedFormat(String),
    /// The log has no track points.
    #[error("the log has no track points to plot")]
    EmptyLog,
    /// Drawing or writing failed.
    #[error("cannot draw {path}: {message}")]
    Draw {
        /// The output.
        path: String,
        /// The backend's message.
        message: String,
    },
}

const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1400, 800);

/// Draws with `$draw` (a function of the drawing area) on an SVG or PNG backend chosen by the
/// output's extension, then writes the file.
macro_rules! draw_to_file {
    ($out:expr, $draw:expr) => {{
        let out: &Path = $out;
        let draw_err = |e: String| PlotError::Draw { path: out.display().to_string(), message: e };
        match out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("svg") => {
                let root = SVGBackend::new(out, SIZE).into_drawing_area();
                $draw(&root).map_err(draw_err)?;
                root.present().map_err(|e| draw_err(e.to_string()))
            }
            Some("png") => {
                let root = BitMapBackend::new(out, SIZE).into_drawing_area();
                $draw(&root).map_err(draw_err)?;
                root.present().map_err(|e| draw_err(e.to_string()))
            }
            _ => Err(PlotError::UnsupportedFormat(out.display().to_string())),
        }
    }};
}
static FONT_BYTES: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn ensure_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bundled font is valid; a failure would only mean text is not drawn.
        let _ = register_font(FONT, FontStyle::Normal, FONT_BYTES);
    });
}

/// One line of the chart.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// The series of a log: one per figure for tracker logs, one per process for watch logs.
fn series_of(log: &ParsedLog) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    let mut push = |name: String, x: f64, y: f64| match out.iter_mut().find(|s| s.name == name) {
        Some(s) => s.points.push((x, y)),
        None => out.push(Series { name, points: vec![(x, y)] }),
    };
    let watch = Dialect::detect(log) == Dialect::Watch;
    for (i, b) in log.blocks.iter().enumerate() {
        if watch {
            let x = b.at.location.line as f64;
            if let Some(v) = b.at.field(NVML_USED) {
                push(format!("{} {}", b.at.location.file, b.at.location.function), x, v);
            }
            if let Some(v) = b.at.field(DEVICE_USED) {
                push(DEVICE_USED.to_owned(), x, v);
            }
        } else {
            for f in &b.at.fields {
                push(f.label.clone(), i as f64, f.mib);
            }
        }
    }
    out
}

/// Draws `log` to `out` (`.svg` or `.png`).
///
/// # Errors
/// [`PlotError`] naming the output or what is missing.
pub fn plot_log(log: &ParsedLog, title: &str, out: &Path) -> Result<(), PlotError> {
    if log.blocks.is_empty() {
        return Err(PlotError::EmptyLog);
    }
    ensure_font();
    draw_to_file!(out, |root| draw(root, log, title))
}

fn short_place(file: &str, line: u32) -> String {
    let name = Path::new(file).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}:{line}")
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, log: &ParsedLog, title: &str) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let series = series_of(log);
    let watch = Dialect::detect(log) == Dialect::Watch;
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0f64, f64::max);
    let x_min = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(x_max, f64::min);
    let y_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(0.0f64, f64::max);
    let y_top = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 24))
        .margin(20)
        .margin_right(40)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(x_min - 0.5..x_max.max(x_min + 1.0) + 0.5, 0.0..y_top)
        .map_err(e)?;
    let labels: Vec<String> =
        log.blocks.iter().map(|b| short_place(&b.at.location.file, b.at.location.line)).collect();
    let label_of = |x: &f64| {
        if watch {
            format!("{}", x.round() as i64)
        } else {
            labels.get(x.round() as usize).cloned().unwrap_or_default()
        }
    };
    chart
        .configure_mesh()
        .x_desc(if watch { "sample" } else { "track point (source line)" })
        .y_desc("MiB")
        .x_labels(labels.len().clamp(2, 10))
        .x_label_formatter(&label_of)
        .x_label_style(TextStyle::from((FONT, 13).into_font()).transform(if watch {
            FontTransform::None
        } else {
            FontTransform::Rotate90
        }))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(e)?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = ShapeStyle { color, filled: false, stroke_width: 2 };
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if s.points.len() <= 200 {
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 2, color.filled()))).map_err(e)?;
        }
    }
    // Mark the highest point of the chart (the first one, if it repeats).
    let peak = series.iter().flat_map(|s| s.points.iter().map(move |&p| (s, p))).fold(
        None,
        |best: Option<(&Series, (f64, f64))>, (s, p)| match best {
            Some((_, b)) if b.1 >= p.1 => best,
            _ => Some((s, p)),
        },
    );
    if let Some((s, (x, y))) = peak {
        let place = if watch {
            format!("sample {}", x as i64)
        } else {
            let loc = &log.blocks[x as usize].at.location;
            format!("{} line {}: {}", loc.file, loc.line, loc.function)
        };
        let text = format!("peak {} {y:.1} MiB at {place}", s.name);
        mark_peak(&mut chart, (x, y), text, (x - x_min) / (x_max - x_min).max(1.0))?;
    }
    draw_legend(&mut chart)
}

type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A red ring at the peak and its label, placed left of the point near the right edge.
fn mark_peak<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    at: (f64, f64),
    text: String,
    x_frac: f64,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    chart
        .draw_series(std::iter::once(EmptyElement::at(at) + Circle::new((0, 0), 7, RED.stroke_width(3))))
        .map_err(e)?;
    let anchor = if x_frac > 0.6 { -12 - 7 * text.len() as i32 } else { 12 };
    chart
        .draw_series(std::iter::once(
            EmptyElement::at(at) + Text::new(text, (anchor, -18), (FONT, 15).into_font().color(&RED)),
        ))
        .map_err(e)?;
    Ok(())
}

/// The legend box, top left.
fn draw_legend<'a, DB: DrawingBackend + 'a>(chart: &mut Chart<'a, DB>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|x| x.to_string())
}

/// Draws a stacked-area memory timeline of an estimate's trace, by category, to `.svg` or `.png`.
///
/// # Errors
/// [`PlotError`] naming the output.
pub fn plot_timeline(trace: &crate::trace::Trace, title: &str, out: &Path) -> Result<(), PlotError> {
    let points = trace.timeline();
    if points.is_empty() {
        return Err(PlotError::EmptyLog);
    }
    ensure_font();
    draw_to_file!(out, |root| draw_timeline(root, &points, title))
}

fn draw_timeline<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    points: &[crate::trace::TimelinePoint],
    title: &str,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    use crate::trace::Category;
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    let mib = |b: u64| b as f64 / 1048576.0;
    root.fill(&WHITE).map_err(e)?;
    let y_max = points.iter().map(|p| mib(p.total)).fold(0.0, f64::max).max(1e-6) * 1.15;
    let n = points.len() as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 24))
        .margin(20)
        .margin_right(40)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..n, 0.0..y_max)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("allocation event")
        .y_desc("MiB")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(e)?;
    // Stack: draw cumulative tops from the last category down so each band shows.
    for (ci, cat) in Category::ALL.iter().enumerate().rev() {
        let color = Palette99::pick(ci).to_rgba();
        let top =
            move |p: &crate::trace::TimelinePoint| -> f64 { p.bytes[..=ci].iter().map(|b| mib(b.1)).sum() };
        chart
            .draw_series(AreaSeries::new(
                points.iter().map(|p| (p.event as f64, top(p))),
                0.0,
                color.mix(0.85),
            ))
            .map_err(e)?
            .label(cat.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    if let Some(peak) = points.iter().fold(None, |best: Option<&crate::trace::TimelinePoint>, p| match best {
        Some(b) if b.total >= p.total => Some(b),
        _ => Some(p),
    }) {
        let (x, y) = (peak.event as f64, mib(peak.total));
        let text = format!("peak {y:.1} MiB ({}, iteration {})", peak.phase, peak.iteration);
        mark_peak(&mut chart, (x, y), text, x / n)?;
    }
    draw_legend(&mut chart)
}
