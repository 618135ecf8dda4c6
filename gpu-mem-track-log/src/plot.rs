//! `gpu-mem-track plot`: memory over track points as an SVG or PNG, with the source lines as
//! labels, a legend, axes in MiB and the peak marked.
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use crate::log::{
    LogBlock, LogEvent, LogReader, ParsedLog, ALLOCATED, DEVICE_USED, NVML_USED, PEAK_ALLOCATED, TENSOR_USED,
};

/// Errors of [`plot_log`], [`plot_log_file`] and [`plot_timeline`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The output's extension is neither `.svg` nor `.png`.
    #[error("output {0}: the file name must end in .svg or .png")]
    UnsupportedFormat(String),
    /// The log has no track points.
    #[error("the log has no track points to plot")]
    EmptyLog,
    /// No value of the log can be drawn (all out of range).
    #[error("nothing to draw: {0}")]
    NothingToDraw(String),
    /// The log file cannot be read or is not a log.
    #[error(transparent)]
    Log(crate::error::Error),
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

/// Values above this many MiB (about 1 EiB) are not memory figures: skipped with a warning, so
/// an axis never reaches infinity (plotters would loop computing its ticks).
const MAX_MIB: f64 = 1e12;
/// Warnings listed one by one before they are counted.
const MAX_WARNINGS: usize = 5;
/// Track points up to which each tick names its source line.
const MAX_PLACE_LABELS: usize = 40;
/// Distinct source lines named in the axis title.
const MAX_DISTINCT: usize = 4;

/// What a chart of a log shows, gathered in one pass (from a parsed log or a stream).
#[derive(Default)]
struct LogChart {
    series: Vec<Series>,
    /// No block had a tensor total: an NVML watch log (x is the sample number).
    watch: bool,
    tracker_blocks: usize,
    blocks: usize,
    /// `file:line` of each track point while there are few enough to label each.
    places: Vec<String>,
    /// The first few distinct `file:line`s, for the axis title of long logs.
    distinct: Vec<String>,
    /// More distinct places than [`MAX_DISTINCT`] were seen.
    more_places: bool,
    /// The highest value: (series, x, MiB, where).
    highest: Option<(usize, f64, f64, String)>,
    /// Lowest and highest x of the points drawn.
    x_range: Option<(f64, f64)>,
    warnings: Vec<String>,
    more_warnings: usize,
}

impl LogChart {
    fn warn(&mut self, w: String) {
        if self.warnings.len() < MAX_WARNINGS {
            self.warnings.push(w);
        } else {
            self.more_warnings += 1;
        }
    }

    fn push(&mut self, name: &str, x: f64, y: f64, place: impl FnOnce() -> String) {
        if !(y.is_finite() && (0.0..=MAX_MIB).contains(&y)) {
            self.warn(format!("track point {x} ({}): {name} {y:e} MiB is out of range, not drawn", place()));
            return;
        }
        let i = match self.series.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.series.push(Series { name: name.to_owned(), points: Vec::new() });
                self.series.len() - 1
            }
        };
        self.series[i].points.push((x, y));
        self.x_range = Some(self.x_range.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))));
        if self.highest.as_ref().is_none_or(|h| y > h.2) {
            self.highest = Some((i, x, y, place()));
        }
    }

    fn block(&mut self, b: &LogBlock) {
        let loc = &b.at.location;
        let place = || loc.to_string();
        if b.at.field(TENSOR_USED).is_some() {
            // Track points count from 1, as the axis says.
            self.tracker_blocks += 1;
            let x = self.tracker_blocks as f64;
            for f in &b.at.fields {
                self.push(&f.label, x, f.mib, place);
            }
            let short = short_place(&loc.file, loc.line);
            if !self.distinct.contains(&short) {
                if self.distinct.len() < MAX_DISTINCT {
                    self.distinct.push(short.clone());
                } else {
                    self.more_places = true;
                }
            }
            if self.places.len() < MAX_PLACE_LABELS {
                self.places.push(short);
            }
        } else {
            // A watch sample: `At <file> line <sample>: <process>`.
            let x = loc.line as f64;
            let sample = || format!("sample {}", loc.line);
            if let Some(v) = b.at.field(NVML_USED) {
                self.push(&format!("{} {}", loc.file, loc.function), x, v, sample);
            }
            if let Some(v) = b.at.field(DEVICE_USED) {
                self.push(DEVICE_USED, x, v, sample);
            }
        }
        self.blocks += 1;
    }

    fn finish(mut self) -> Result<Self, PlotError> {
        if self.blocks == 0 {
            return Err(PlotError::EmptyLog);
        }
        self.watch = self.tracker_blocks == 0;
        // Ticks name their source lines only while there are few and they differ (a loop on
        // one line would repeat the same label on every tick).
        if self.tracker_blocks > MAX_PLACE_LABELS || self.distinct.len() < 2 {
            self.places.clear();
        }
        if self.series.iter().all(|s| s.points.is_empty()) {
            return Err(PlotError::NothingToDraw(self.summary().join("; ")));
        }
        Ok(self)
    }

    /// The warnings, the first few then a count.
    fn summary(&self) -> Vec<String> {
        let mut out = self.warnings.clone();
        if self.more_warnings > 0 {
            out.push(format!("... and {} more", self.more_warnings));
        }
        out
    }
}

/// Keeps, per pixel column, the first, lowest, highest and last point (in x order), so a line of
/// any number of points draws the same envelope as all of them, in bounded time.
fn decimate(points: &[(f64, f64)], x_min: f64, x_max: f64, columns: usize) -> Vec<(f64, f64)> {
    if points.len() <= 4 * columns {
        return points.to_vec();
    }
    let width = (x_max - x_min).max(f64::MIN_POSITIVE);
    let column = |x: f64| (((x - x_min) / width * columns as f64) as usize).min(columns - 1);
    let mut out = Vec::with_capacity(4 * columns);
    let mut i = 0;
    while i < points.len() {
        let c = column(points[i].0);
        let start = i;
        let (mut lo, mut hi) = (i, i);
        while i < points.len() && column(points[i].0) == c {
            if points[i].1 < points[lo].1 {
                lo = i;
            }
            if points[i].1 > points[hi].1 {
                hi = i;
            }
            i += 1;
        }
        let mut keep = [start, lo, hi, i - 1];
        keep.sort_unstable();
        let mut last = usize::MAX;
        for k in keep {
            if k != last {
                out.push(points[k]);
                last = k;
            }
        }
    }
    out
}

/// Draws `log` to `out` (`.svg` or `.png`). Returns the warnings about values not drawn (the
/// first few, then a count).
///
/// # Errors
/// [`PlotError`] naming the output or what is missing.
pub fn plot_log(log: &ParsedLog, title: &str, out: &Path) -> Result<Vec<String>, PlotError> {
    check_format(out)?;
    let mut chart = LogChart::default();
    for b in &log.blocks {
        chart.block(b);
    }
    render(chart.finish()?, title, out)
}

/// Reads the log file `path` as a stream (bounded memory besides the points themselves) and
/// draws it to `out`. Returns the warnings: lines skipped and values not drawn, the first few of
/// each, then a count.
///
/// # Errors
/// [`PlotError::Log`] when the file cannot be read or is not a log; the others as [`plot_log`].
pub fn plot_log_file(path: &Path, title: &str, out: &Path) -> Result<Vec<String>, PlotError> {
    check_format(out)?;
    let reader = LogReader::open(path).map_err(PlotError::Log)?;
    let mut chart = LogChart::default();
    for event in reader {
        match event.map_err(PlotError::Log)? {
            LogEvent::Block(b) => chart.block(&b),
            LogEvent::Skipped(e) => chart.warn(format!("skipped {e}")),
            LogEvent::Header(_) | LogEvent::Trailing(_) => {}
        }
    }
    render(chart.finish()?, title, out)
}

fn check_format(out: &Path) -> Result<(), PlotError> {
    match out.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg" | "png") => Ok(()),
        _ => Err(PlotError::UnsupportedFormat(out.display().to_string())),
    }
}

fn render(chart: LogChart, title: &str, out: &Path) -> Result<Vec<String>, PlotError> {
    ensure_font();
    draw_to_file!(out, |root| draw(root, &chart, title))?;
    Ok(chart.summary())
}

fn short_place(file: &str, line: u32) -> String {
    let name = Path::new(file).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}:{line}")
}

/// Pixel columns of the plotting area (the chart is SIZE.0 wide less margins and the y labels).
const COLUMNS: usize = SIZE.0 as usize - 160;

/// The title, and the highest point in words, above the chart (never over a line).
fn draw_heading<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    highest: &str,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    area.draw_text(title, &(FONT, 24).into_font().color(&BLACK), (30, 10)).map_err(e)?;
    area.draw_text(highest, &(FONT, 16).into_font().color(&RED), (30, 44)).map_err(e)?;
    Ok(())
}

/// Draws the chart; returns the plot area in pixels (for tests of what lies outside it).
fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    c: &LogChart,
    title: &str,
) -> Result<(std::ops::Range<i32>, std::ops::Range<i32>), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (head, body) = root.split_vertically(76);
    let (x_min, x_max) = c.x_range.map_or((0.0, 1.0), |(lo, hi)| (lo, hi.max(lo + 1.0)));
    // `highest` is the largest value drawn (all of them are at least 0).
    let y_max = c.highest.as_ref().map_or(0.0, |h| h.2);
    let y_top = if y_max > 0.0 { y_max * 1.12 } else { 1.0 };
    let highest = c.highest.as_ref().map_or(String::new(), |(i, _, y, place)| {
        format!("highest: {y:.1} MiB ({}) at {place}", c.series[*i].name)
    });
    draw_heading(&head, title, &highest)?;
    let mut chart = ChartBuilder::on(&body)
        .margin(20)
        .margin_right(40)
        .x_label_area_size(if c.places.is_empty() { 50 } else { 90 })
        .y_label_area_size(80)
        .build_cartesian_2d(x_min - 0.5..x_max + 0.5, 0.0..y_top)
        .map_err(e)?;
    // Ticks fall on whole track points (plotters may pick halves on short ranges: left blank).
    let label_of = |x: &f64| match whole(*x) {
        None => String::new(),
        Some(n) if c.places.is_empty() => n.to_string(),
        Some(n) => c.places.get((n as usize).wrapping_sub(1)).cloned().unwrap_or_default(),
    };
    let x_desc = match (c.watch, c.places.is_empty()) {
        (true, _) => "sample".to_owned(),
        (false, false) => "track point (source line)".to_owned(),
        (false, true) => {
            let more = if c.more_places { ", ..." } else { "" };
            format!("track point (1 to {}) at {}{more}", c.tracker_blocks, c.distinct.join(", "))
        }
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("MiB")
        .x_labels(if c.places.is_empty() { 10 } else { c.places.len().clamp(2, MAX_PLACE_LABELS) })
        .x_label_formatter(&label_of)
        .x_label_style(TextStyle::from((FONT, 13).into_font()).transform(if c.places.is_empty() {
            FontTransform::None
        } else {
            FontTransform::Rotate90
        }))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(e)?;
    let (px, py) = chart.plotting_area().get_pixel_range();
    draw_lines(root, &mut chart, c, (x_min, x_max), (px.clone(), py.clone()))?;
    if let Some((_, x, y, _)) = &c.highest {
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((*x, *y)) + Circle::new((0, 0), 7, RED.stroke_width(3)),
            ))
            .map_err(e)?;
    }
    draw_legend(&mut chart)?;
    Ok((px, py))
}

/// Draws each series of `c` as a line (and a square per point on short logs), clipped to the
/// plot area `(px, py)` in pixels, with its legend entry.
fn draw_lines<'a, DB: DrawingBackend + 'a>(
    root: &DrawingArea<DB, Shift>,
    chart: &mut Chart<'a, DB>,
    c: &LogChart,
    (x_min, x_max): (f64, f64),
    (px, py): (std::ops::Range<i32>, std::ops::Range<i32>),
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    let points = c.series.iter().map(|s| s.points.len()).max().unwrap_or(0);
    // Lines are drawn in pixels, as 1-px polylines side by side for width, clamped to the plot
    // area: plotters' own thick lines are polygons whose joins spike far out of the data at
    // sharp turns and jump to the image's corner where two points share a pixel (a zero-length
    // segment has no direction), which drew over the title and below 0 on long logs.
    let dense = c.series.iter().any(|s| s.points.len() > COLUMNS / 3);
    // One column per pixel of the plot area, so every pixel column gets its envelope.
    let columns = usize::try_from(px.end - px.start).unwrap_or(COLUMNS).max(1);
    // Nested widths so equal lines all show: peak allocated is a wide pale band, allocated a
    // medium line on it, tensor-used a thin dark line on top.
    let mut order: Vec<usize> = (0..c.series.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(line_width(&c.series[i].name, dense)));
    for i in order {
        let s = &c.series[i];
        let color = series_color(&s.name, i);
        let width = line_width(&s.name, dense);
        let color = if width >= 7 { color.mix(0.35) } else { color.to_rgba() };
        let mut pixels: Vec<(i32, i32)> = Vec::new();
        for p in decimate(&s.points, x_min, x_max, columns) {
            let (x, y) = chart.backend_coord(&p);
            let q = (x.clamp(px.start, px.end - 1), y.clamp(py.start, py.end - 1));
            if pixels.last() != Some(&q) {
                pixels.push(q);
            }
        }
        let half = i32::from(width) / 2;
        for dy in -half..i32::from(width) - half {
            let shifted = pixels.iter().map(|&(x, y)| (x, (y + dy).clamp(py.start, py.end - 1)));
            root.draw(&PathElement::new(shifted.collect::<Vec<_>>(), color.stroke_width(1))).map_err(e)?;
        }
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
            .map_err(e)?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                Rectangle::new(
                    [(x, y - i32::from(width) / 2 - 1), (x + 24, y + i32::from(width) / 2 + 1)],
                    color.filled(),
                )
            });
        if points <= 200 {
            // A square per point, clipped like the lines.
            let r = i32::from(width.max(4)) / 2 + 1;
            for &p in &s.points {
                let (x, y) = chart.backend_coord(&p);
                let corner = |dx: i32, dy: i32| {
                    ((x + dx).clamp(px.start, px.end - 1), (y + dy).clamp(py.start, py.end - 1))
                };
                root.draw(&Rectangle::new([corner(-r, -r), corner(r, r)], color.filled())).map_err(e)?;
            }
        }
    }
    Ok(())
}

/// Line width in pixels by series: nested, widest drawn first (see `draw`).
fn line_width(name: &str, dense: bool) -> u8 {
    match (name, dense) {
        (PEAK_ALLOCATED, false) => 9,
        (PEAK_ALLOCATED, true) => 7,
        (ALLOCATED, false) => 5,
        (ALLOCATED, true) => 3,
        (TENSOR_USED, _) => 2,
        (_, false) => 3,
        (_, true) => 1,
    }
}

/// Colours by series (Tableau's, without red, which marks the highest point).
fn series_color(name: &str, i: usize) -> RGBColor {
    const OTHERS: [RGBColor; 5] = [
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    match name {
        TENSOR_USED => RGBColor(31, 119, 180),
        ALLOCATED => RGBColor(255, 127, 14),
        PEAK_ALLOCATED => RGBColor(44, 160, 44),
        _ => OTHERS[i % OTHERS.len()],
    }
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
    check_format(out)?;
    let points = highest_per_column(trace.timeline_points(), trace.events.len(), COLUMNS);
    if points.is_empty() {
        return Err(PlotError::EmptyLog);
    }
    ensure_font();
    draw_to_file!(out, |root| draw_timeline(root, &points, title))
}

/// `x` as a whole number, if it is one: axes count track points and events, so plotters' ticks
/// between them are left blank.
fn whole(x: f64) -> Option<i64> {
    ((x - x.round()).abs() <= 1e-6).then(|| x.round() as i64)
}

/// A timeline of more points (`len`) than the chart has pixel columns reduced to the highest point
/// of each column (and the last point), so the stacked areas show every peak and draw in bounded
/// time; read one point at a time, so a long trace's timeline is never held whole. A kept point
/// is placed at its column's first event, so its step holds over the whole column: a one-event
/// peak among more events than pixels is drawn a column wide at its height, not as a sliver the
/// rasteriser drops.
fn highest_per_column(
    points: impl Iterator<Item = crate::trace::TimelinePoint>,
    len: usize,
    columns: usize,
) -> Vec<crate::trace::TimelinePoint> {
    if len <= columns {
        return points.collect();
    }
    let per = len.div_ceil(columns);
    let mut out: Vec<crate::trace::TimelinePoint> = Vec::with_capacity(columns + 1);
    let mut best: Option<crate::trace::TimelinePoint> = None;
    let mut last = None;
    for (i, p) in points.enumerate() {
        // The first of equal maxima, as `Trace::peak` names it.
        if best.as_ref().is_none_or(|b| p.total > b.total) {
            best = Some(crate::trace::TimelinePoint { event: i - i % per, ..p.clone() });
        }
        if (i + 1) % per == 0 {
            out.extend(best.take());
        }
        last = Some(p);
    }
    out.extend(best);
    out.extend(last.filter(|l| out.last().is_none_or(|p| p.event < l.event)));
    out
}

/// A timeline's points as steps: memory after an event holds until the next point (and the last
/// for one event), so an area drawn through them shows a one-event peak at its height over its
/// whole width, where joining the points would draw a thin triangle below it.
fn steps(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (x, y) in points {
        if let Some(&(_, held)) = out.last() {
            out.push((x, held));
        }
        out.push((x, y));
    }
    if let Some(&(x, y)) = out.last() {
        out.push((x + 1.0, y));
    }
    out
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
    let n = points.last().map_or(1.0, |p| p.event as f64 + 1.0);
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
        // Events are whole numbers: "1000", not "1000.0" (fractional ticks are left blank).
        .x_label_formatter(&|x: &f64| whole(*x).map_or_else(String::new, |n| n.to_string()))
        .y_desc("MiB")
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(e)?;
    // Stack: draw cumulative tops from the last category down so each band shows. A category the
    // run never held (a single process has no FSDP buffers) has no band and no legend entry.
    for (ci, cat) in Category::ALL.iter().enumerate().rev() {
        if points.iter().all(|p| p.bytes[ci].1 == 0) {
            continue;
        }
        let color = Palette99::pick(ci).to_rgba();
        let top =
            move |p: &crate::trace::TimelinePoint| -> f64 { p.bytes[..=ci].iter().map(|b| mib(b.1)).sum() };
        chart
            .draw_series(AreaSeries::new(
                steps(points.iter().map(|p| (p.event as f64, top(p)))),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_steps_hold_each_value_until_the_next_event() {
        // 100 MiB, a one-event spike to 135.5 at event 5, back to 100 at event 6.
        let got = steps([(4.0, 100.0), (5.0, 135.5), (6.0, 100.0)].into_iter());
        assert_eq!(
            got,
            vec![(4.0, 100.0), (5.0, 100.0), (5.0, 135.5), (6.0, 135.5), (6.0, 100.0), (7.0, 100.0)]
        );
        // The spike spans event 5 to 6 at its full height.
        let at = |x: f64| got.iter().filter(|p| p.0 == x).map(|p| p.1).fold(0.0, f64::max);
        assert_eq!((at(5.0), at(6.0)), (135.5, 135.5));
        assert!(steps(std::iter::empty()).is_empty());
    }

    #[test]
    fn a_one_event_peak_among_more_events_than_pixels_holds_a_whole_column() {
        use crate::trace::{Category, Phase, TimelinePoint};
        // The demo's history on an H200: 2 465 events, a one-event peak of 135.5 MiB at 2 438
        // between 123.3 MiB ones, drawn on 1 240 columns (two events each).
        let (len, columns) = (2465usize, 1240usize);
        let point = |event: usize| {
            let total: u64 = match event {
                2438 => 135_500_000,
                2437 | 2439 => 123_300_000,
                _ => 68_000_000,
            };
            TimelinePoint {
                event,
                phase: Phase::Unmarked,
                iteration: 0,
                bytes: vec![(Category::Temporary, total)],
                total,
            }
        };
        let kept = highest_per_column((0..len).map(point), len, columns);
        assert!(kept.len() <= columns + 1, "{}", kept.len());
        let peak = kept.iter().position(|p| p.total == 135_500_000).expect("the peak is kept");
        // Its step holds from its column's first event to the next column's: at least a pixel.
        let width = kept[peak + 1].event - kept[peak].event;
        assert!(width >= len.div_ceil(columns), "the peak holds {width} event(s)");
        assert_eq!(kept[peak].event, 2438, "the column of events 2438 and 2439 starts at 2438");
        for w in kept.windows(2) {
            assert!(w[0].event < w[1].event, "points in order: {} then {}", w[0].event, w[1].event);
        }
        assert_eq!(kept.last().map(|p| p.event), Some(len - 1), "the last point ends the chart");
    }

    /// A chart of a loop: `n` points swinging between 1 and 11 MiB, tensor-used under allocated.
    fn swinging(n: usize) -> LogChart {
        let mut c = LogChart::default();
        for i in 0..n {
            let y = if i % 3 == 1 { 11.0 } else { 1.0 };
            c.push(TENSOR_USED, i as f64, y, String::new);
            c.push("Total Allocated Memory", i as f64, y, String::new);
        }
        c.tracker_blocks = n;
        c.blocks = n;
        c.finish().unwrap()
    }

    /// Renders into an RGB buffer, as the PNG output does.
    fn pixels(c: &LogChart) -> Vec<u8> {
        ensure_font();
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            draw(&root, c, "t").unwrap();
            root.present().unwrap();
        }
        buf
    }

    #[test]
    fn dense_lines_stay_inside_the_plot_area() {
        for n in [1_000, 5_000, 300_000] {
            let buf = pixels(&swinging(n));
            // The bottom rows hold nothing (the axis description is above them): thick-line
            // miters used to spike down here, below 0 and over the labels.
            let row = (SIZE.0 * 3) as usize;
            let bottom = &buf[buf.len() - 10 * row..];
            assert!(bottom.iter().all(|&b| b == 255), "{n} points: something drawn in the bottom rows");
        }
    }

    #[test]
    fn decimation_keeps_first_last_and_extremes_per_column() {
        let points: Vec<(f64, f64)> =
            (0..1_000_000i64).map(|i| (i as f64, ((i * 7919) % 1000) as f64)).collect();
        let kept = decimate(&points, 0.0, 999_999.0, 1000);
        assert!(kept.len() <= 4000, "{}", kept.len());
        assert_eq!(kept.first(), points.first());
        assert_eq!(kept.last(), points.last());
        let max = kept.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        let min = kept.iter().map(|p| p.1).fold(f64::MAX, f64::min);
        assert_eq!((min, max), (0.0, 999.0));
        assert!(kept.windows(2).all(|w| w[0].0 < w[1].0), "in x order");
    }

    #[test]
    fn values_out_of_range_are_skipped_with_a_bounded_list_of_warnings() {
        let mut c = LogChart::default();
        c.push(TENSOR_USED, 0.0, 5.0, String::new);
        for (i, y) in [f64::INFINITY, 1.7e308, f64::NAN, -1.0].into_iter().cycle().take(40).enumerate() {
            c.push(TENSOR_USED, i as f64 + 1.0, y, || "a.rs line 1: f".into());
        }
        c.blocks = 41;
        c.tracker_blocks = 41;
        let c = c.finish().unwrap();
        let w = c.summary();
        assert_eq!(w.len(), MAX_WARNINGS + 1, "{w:?}");
        assert!(w[0].contains("out of range") && w[0].contains("a.rs line 1"), "{w:?}");
        assert_eq!(w.last().unwrap(), "... and 35 more");
        assert_eq!(c.series[0].points, vec![(0.0, 5.0)]);
    }
}

#[cfg(test)]
mod pixel_tests {
    use super::*;
    use crate::log::parse_log;

    /// A tracker log of `n` track points, values from `value(i)`, three source lines.
    pub(crate) fn log_text(n: usize, value: impl Fn(usize) -> f64) -> String {
        let mut s =
            "GPU Memory Track | t | Total Tensor Used Memory:0.0 Mb Total Allocated Memory:0.0 Mb\n\n"
                .to_owned();
        for i in 0..n {
            let v = value(i);
            s += &format!(
                "At a.rs line {}: f Total Tensor Used Memory:{v} Mb Total Allocated Memory:{} Mb Peak Allocated Memory:{} Mb\n\n",
                39 + i % 3,
                v + 1.0,
                v + 2.0
            );
        }
        s
    }

    /// Renders `text` into an RGB buffer; returns it with the plot area.
    fn render_rgb(text: &str) -> (Vec<u8>, (std::ops::Range<i32>, std::ops::Range<i32>)) {
        let log = parse_log(text).unwrap();
        let mut chart = LogChart::default();
        log.blocks.iter().for_each(|b| chart.block(b));
        let chart = chart.finish().unwrap();
        ensure_font();
        let mut buf = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
        let area = {
            let root = BitMapBackend::with_buffer(&mut buf, SIZE).into_drawing_area();
            let area = draw(&root, &chart, "title").unwrap();
            root.present().unwrap();
            area
        };
        (buf, area)
    }

    /// Pixels outside the plot area in a series colour: only text (black, grey) and the red
    /// heading may be there.
    fn coloured_outside(buf: &[u8], (px, py): &(std::ops::Range<i32>, std::ops::Range<i32>)) -> usize {
        let mut n = 0;
        for (i, p) in buf.chunks_exact(3).enumerate() {
            let (x, y) = ((i % SIZE.0 as usize) as i32, (i / SIZE.0 as usize) as i32);
            if px.contains(&x) && py.contains(&y) {
                continue;
            }
            let (r, g, b) = (p[0], p[1], p[2]);
            let neutral = r.max(g).max(b) - r.min(g).min(b) <= 30;
            let red = g.abs_diff(b) <= 10 && r >= g;
            if !neutral && !red {
                if n < 5 {
                    eprintln!("outside the plot area {px:?} x {py:?}: ({x}, {y}) = {p:?}");
                }
                n += 1;
            }
        }
        n
    }

    #[test]
    fn long_sawtooth_logs_stay_inside_the_plot_area() {
        // Old code: thick polylines spiked over the title (5 000 points) and below 0 (1 000).
        for n in [10, 1_000, 5_000] {
            let text = log_text(n, |i| if i % 2 == 0 { 0.0 } else { 100.0 + (i % 7) as f64 });
            let (buf, area) = render_rgb(&text);
            assert_eq!(coloured_outside(&buf, &area), 0, "{n} points draw outside the plot area");
        }
    }
}
