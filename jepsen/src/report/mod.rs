//! Report output of a test run: Jepsen-style latency and rate plots (PNG,
//! drawn with the shared [`crate::plot`]) and a per-process timeline page
//! ([`timeline`], self-contained HTML).
//!
//! - [`latency_png`]: every operation as a point, x = invocation time since
//!   the start of the test, y = latency (log scale); colour = outcome, marker
//!   shape = function (`f`). Like Jepsen's `latency-raw.png`.
//! - [`rate_png`]: completions per second (1 s buckets), one line per
//!   function and outcome. Like Jepsen's `rate.png`.
//! - [`timeline_html`]: one column per process, each operation a box from its
//!   invocation to its completion, with a hover title. Like Jepsen's
//!   `timeline.html`.
//!
//! All three shade the nemesis' fault windows (one colour per fault kind,
//! labelled with the kind). The PNGs need the font ([`crate::plot`]); the
//! HTML timeline does not.
//!
//! # Colours
//! ok = green, fail = red, info (completed as indeterminate) = purple,
//! never completed (the test ended first; also indeterminate) = grey.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Result;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use baton_checker::history::{FaultWindow, History, OpType, Pair};

use crate::plot::{font, perr, render_png, stamp, utc_stamp, Area};

pub mod timeline;
pub use timeline::{timeline_html, TIMELINE_MAX_OPS};

const NS_PER_S: f64 = 1e9;
const NS_PER_MS: f64 = 1e6;

// ---------------------------------------------------------------------------
// Shared model
// ---------------------------------------------------------------------------

/// How an operation ended, for colouring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Outcome {
    Ok,
    Fail,
    /// Completed with `info`: indeterminate.
    Info,
    /// Never completed: the test ended first (also indeterminate).
    Pending,
}

impl Outcome {
    fn of(p: &Pair<'_>) -> Outcome {
        match p.complete.map(|c| c.ty) {
            Some(OpType::Ok) => Outcome::Ok,
            Some(OpType::Fail) => Outcome::Fail,
            Some(OpType::Info) => Outcome::Info,
            Some(OpType::Invoke) | None => Outcome::Pending,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "never completed",
        }
    }
    fn css(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        }
    }
    fn color(self) -> RGBColor {
        match self {
            Outcome::Ok => RGBColor(0x2c, 0xa0, 0x2c),
            Outcome::Fail => RGBColor(0xd6, 0x27, 0x28),
            Outcome::Info => RGBColor(0x94, 0x67, 0xbd),
            Outcome::Pending => RGBColor(0x7f, 0x7f, 0x7f),
        }
    }
}

/// Fault-band colours, one per fault kind (chosen to differ from the outcome
/// colours).
const FAULT_COLORS: [RGBColor; 6] = [
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];

const MARKER_NAMES: [&str; 8] =
    ["circle", "triangle", "square", "diamond", "x", "plus", "hollow circle", "hollow square"];

/// Line dash patterns per function in the rate plot: (dash, gap) in pixels,
/// (0, 0) = solid.
const DASHES: [(i32, i32); 5] = [(0, 0), (10, 5), (3, 3), (16, 4), (6, 2)];

fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// A fault window resolved for drawing: seconds, end clamped to `x_end`.
struct Band<'a> {
    w: &'a FaultWindow,
    kind_idx: usize,
    start_s: f64,
    end_s: f64,
}

/// Distinct fault kinds, sorted (index = colour).
fn fault_kinds(faults: &[FaultWindow]) -> Vec<&str> {
    faults.iter().map(|w| w.kind.as_str()).collect::<BTreeSet<_>>().into_iter().collect()
}

/// A window whose `end` is before its `start` (or `u64::MAX`) is taken to be
/// still open at the end of the test.
fn window_end(w: &FaultWindow, open_end_ns: u64) -> u64 {
    if w.end < w.start || w.end == u64::MAX {
        open_end_ns.max(w.start)
    } else {
        w.end
    }
}

/// Time of the last history entry, and of the last fault end (ns).
fn extent_ns(h: &History, faults: &[FaultWindow]) -> u64 {
    let ops = h.ops.iter().map(|o| o.time).max().unwrap_or(0);
    let f = faults.iter().map(|w| if w.end == u64::MAX { w.start } else { w.end.max(w.start) }).max().unwrap_or(0);
    ops.max(f)
}

fn bands<'a>(faults: &'a [FaultWindow], kinds: &[&str], x_end_ns: u64) -> Vec<Band<'a>> {
    let mut out: Vec<Band<'a>> = faults
        .iter()
        .map(|w| Band {
            w,
            kind_idx: kinds.iter().position(|k| *k == w.kind).unwrap_or(0),
            start_s: w.start as f64 / NS_PER_S,
            end_s: window_end(w, x_end_ns) as f64 / NS_PER_S,
        })
        .collect();
    out.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    out
}

/// Functions (`f`), sorted; index = marker / dash pattern.
fn functions<'a>(pairs: &[Pair<'a>]) -> Vec<&'a str> {
    pairs.iter().map(|p| p.invoke.f.as_str()).collect::<BTreeSet<_>>().into_iter().collect()
}

/// Evaluates `$body` with `$mk` bound to a closure that makes, for a
/// coordinate, a marker of the given shape (index into [`MARKER_NAMES`],
/// cycling) and colour centred on it. (A macro rather than a function
/// returning `DynElement`, whose lifetime bounds do not fit `draw_series`
/// with a borrowed `BitMapBackend`.)
macro_rules! with_marker {
    ($shape:expr, $color:expr, |$mk:ident| $body:expr) => {{
        let color: RGBColor = $color;
        let r: i32 = 4;
        let fill = color.mix(0.75).filled();
        let line = ShapeStyle::from(color.mix(0.9)).stroke_width(2);
        let hollow = ShapeStyle::from(color).stroke_width(2);
        match $shape % MARKER_NAMES.len() {
            0 => {
                let $mk = |at| EmptyElement::at(at) + Circle::new((0, 0), r, fill);
                $body
            }
            1 => {
                let $mk = |at| EmptyElement::at(at) + Polygon::new(vec![(0, -r - 1), (r + 1, r), (-r - 1, r)], fill);
                $body
            }
            2 => {
                let $mk = |at| EmptyElement::at(at) + Rectangle::new([(-r + 1, -r + 1), (r - 1, r - 1)], fill);
                $body
            }
            3 => {
                let $mk = |at| {
                    EmptyElement::at(at) + Polygon::new(vec![(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)], fill)
                };
                $body
            }
            4 => {
                let $mk = |at| {
                    EmptyElement::at(at)
                        + PathElement::new(vec![(-r, -r), (r, r)], line)
                        + PathElement::new(vec![(-r, r), (r, -r)], line)
                };
                $body
            }
            5 => {
                let $mk = |at| {
                    EmptyElement::at(at)
                        + PathElement::new(vec![(-r - 1, 0), (r + 1, 0)], line)
                        + PathElement::new(vec![(0, -r - 1), (0, r + 1)], line)
                };
                $body
            }
            6 => {
                let $mk = |at| EmptyElement::at(at) + Circle::new((0, 0), r, hollow);
                $body
            }
            _ => {
                let $mk = |at| EmptyElement::at(at) + Rectangle::new([(-r, -r), (r, r)], hollow);
                $body
            }
        }
    }};
}

/// Legend entries drawn in a side panel (outside the plot, so they never
/// hide data).
enum LegendItem {
    Heading(String),
    Marker { shape: usize, color: RGBColor, text: String },
    Line { dash: (i32, i32), shape: usize, color: RGBColor, text: String },
    Band { color: RGBColor, text: String },
    Note(String),
}

fn draw_legend(area: &Area<'_>, items: &[LegendItem]) -> Result<()> {
    let (_, h) = area.dim_in_pixel();
    let row = 19;
    let mut y = 50;
    let max_rows = ((h as i32 - y - 10) / row).max(1) as usize;
    let shown = if items.len() > max_rows { max_rows - 1 } else { items.len() };
    for item in &items[..shown] {
        match item {
            LegendItem::Heading(t) => {
                area.draw(&Text::new(t.clone(), (8, y - 6), font(15))).map_err(perr)?;
            }
            LegendItem::Marker { shape, color, text } => {
                with_marker!(*shape, *color, |mk| area.draw(&mk((22, y))).map_err(perr))?;
                area.draw(&Text::new(text.clone(), (40, y - 7), font(13))).map_err(perr)?;
            }
            LegendItem::Line { dash, shape, color, text } => {
                let style = ShapeStyle::from(*color).stroke_width(2);
                let (x0, x1) = (6, 38);
                if dash.0 == 0 {
                    area.draw(&PathElement::new(vec![(x0, y), (x1, y)], style)).map_err(perr)?;
                } else {
                    let mut x = x0;
                    while x < x1 {
                        area.draw(&PathElement::new(vec![(x, y), ((x + dash.0).min(x1), y)], style)).map_err(perr)?;
                        x += dash.0 + dash.1;
                    }
                }
                with_marker!(*shape, *color, |mk| area.draw(&mk((22, y))).map_err(perr))?;
                area.draw(&Text::new(text.clone(), (46, y - 7), font(13))).map_err(perr)?;
            }
            LegendItem::Band { color, text } => {
                area.draw(&Rectangle::new([(10, y - 7), (34, y + 7)], color.mix(0.25).filled())).map_err(perr)?;
                area.draw(&Rectangle::new([(10, y - 7), (34, y + 7)], color.mix(0.8))).map_err(perr)?;
                area.draw(&Text::new(text.clone(), (40, y - 7), font(13))).map_err(perr)?;
            }
            LegendItem::Note(t) => {
                area.draw(&Text::new(t.clone(), (8, y - 7), font(12).color(&RGBColor(0x55, 0x55, 0x55))))
                    .map_err(perr)?;
            }
        }
        y += row;
    }
    if shown < items.len() {
        let t = format!("... and {} more", items.len() - shown);
        area.draw(&Text::new(t, (8, y - 7), font(12))).map_err(perr)?;
    }
    Ok(())
}

fn fault_legend(items: &mut Vec<LegendItem>, faults: &[FaultWindow], kinds: &[&str]) {
    if kinds.is_empty() {
        return;
    }
    items.push(LegendItem::Heading("faults".into()));
    for (i, k) in kinds.iter().enumerate() {
        let n = faults.iter().filter(|w| w.kind == *k).count();
        items.push(LegendItem::Band { color: FAULT_COLORS[i % FAULT_COLORS.len()], text: format!("{k} ({n})") });
    }
}

fn shorten(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max_chars.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// Shades the fault windows over the whole height of the plot, `y` spanning
/// `y_lo..y_hi` in chart coordinates. Labels are drawn separately
/// ([`draw_band_labels`]) so they stay on top of the data.
fn draw_bands<Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, crate::plot::Backend<'_>, Cartesian2d<RangedCoordf64, Y>>,
    bands: &[Band<'_>],
    x_max: f64,
    y_lo: f64,
    y_hi: f64,
) -> Result<()> {
    // Keep instantaneous faults visible: at least 1/500 of the x axis.
    let min_w = x_max / 500.0;
    for b in bands {
        let color = FAULT_COLORS[b.kind_idx % FAULT_COLORS.len()];
        let (x0, x1) = (b.start_s.min(x_max), b.end_s.min(x_max).max(b.start_s.min(x_max) + min_w));
        chart
            .draw_series(std::iter::once(Rectangle::new([(x0, y_lo), (x1, y_hi)], color.mix(0.16).filled())))
            .map_err(perr)?;
        let edge = ShapeStyle::from(color.mix(0.6)).stroke_width(1);
        chart.draw_series(std::iter::once(PathElement::new(vec![(x0, y_lo), (x0, y_hi)], edge))).map_err(perr)?;
        chart.draw_series(std::iter::once(PathElement::new(vec![(x1, y_lo), (x1, y_hi)], edge))).map_err(perr)?;
    }
    Ok(())
}

/// Writes each band's kind at its top left, staggered over three rows so
/// that neighbouring bands' labels do not overlap.
fn draw_band_labels<Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, crate::plot::Backend<'_>, Cartesian2d<RangedCoordf64, Y>>,
    bands: &[Band<'_>],
    x_max: f64,
    y_hi: f64,
) -> Result<()> {
    // Each label goes on the first of four rows where it overlaps no
    // other label; one that fits on none is left out (the legend lists
    // every fault kind).
    const ROWS: usize = 4;
    let mut row_end = [i32::MIN; ROWS];
    for b in bands {
        if b.start_s > x_max {
            continue;
        }
        let color = FAULT_COLORS[b.kind_idx % FAULT_COLORS.len()];
        let dark = RGBColor(color.0 / 2, color.1 / 2, color.2 / 2);
        let label = shorten(&b.w.kind, 24);
        let x0 = chart.backend_coord(&(b.start_s, y_hi)).0 + 3;
        // DejaVu Sans at 13 px: about 7.5 px a character.
        let width = (label.chars().count() as f64 * 7.5).ceil() as i32;
        let Some(row) = (0..ROWS).find(|r| row_end[*r] + 6 <= x0) else { continue };
        row_end[row] = x0 + width;
        let el =
            EmptyElement::at((b.start_s, y_hi)) + Text::new(label, (3, 4 + row as i32 * 15), font(13).color(&dark));
        chart.draw_series(std::iter::once(el)).map_err(perr)?;
    }
    Ok(())
}

/// Draws a centred "no data" message on the plotting area.
fn draw_no_data(area: &Area<'_>, msg: &str) -> Result<()> {
    let (w, h) = area.dim_in_pixel();
    let style = font(22).color(&RGBColor(0x66, 0x66, 0x66)).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Center,
    ));
    area.draw(&Text::new(msg.to_string(), (w as i32 / 2, h as i32 / 2), style)).map_err(perr)?;
    Ok(())
}

fn fmt_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}s", trim_num(v / 1000.0))
    } else if v >= 1.0 {
        format!("{}ms", trim_num(v))
    } else {
        format!("{}µs", trim_num(v * 1000.0))
    }
}

fn trim_num(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

const PNG_SIZE: (u32, u32) = (1400, 760);
const LEGEND_W: u32 = 270;

// ---------------------------------------------------------------------------
// Latency plot
// ---------------------------------------------------------------------------

/// Writes a Jepsen-style raw latency plot (PNG) to `path`.
///
/// One point per operation: x = invocation time in seconds since the start of
/// the test, y = latency (completion time - invocation time) in ms on a log
/// scale (latencies under 1 µs are drawn at 1 µs). Colour = outcome (ok
/// green, fail red, info purple); marker shape = function `f` (legend on the
/// right, with counts). Operations completed with `info` are drawn at their
/// `info` latency (usually the client's timeout).
///
/// Operations that **never completed** (no completion entry in the history)
/// are **drawn at the top edge** of the plot, at their invocation time, in
/// grey with their function's marker: their latency is unbounded.
///
/// Fault windows are shaded vertical bands, one colour per kind, labelled with
/// the kind at their top. An empty history gives a valid plot saying "no
/// operations in history". `path` is written as a PNG whatever its extension
/// (via a temporary file beside it, renamed into place).
pub fn latency_png(h: &History, faults: &[FaultWindow], path: &Path) -> Result<()> {
    let pairs = h.pairs();
    let fs = functions(&pairs);
    let kinds = fault_kinds(faults);
    let x_end_ns = extent_ns(h, faults);
    let x_max = (x_end_ns as f64 / NS_PER_S * 1.02).max(1.0);
    let bands = bands(faults, &kinds, x_end_ns);

    // (outcome, f index) -> points; drawn in outcome order so rarer outcomes
    // land on top of the many oks.
    let mut series: BTreeMap<(Outcome, usize), Vec<(f64, f64)>> = BTreeMap::new();
    let mut pending: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for p in &pairs {
        let fi = fs.iter().position(|f| *f == p.invoke.f).unwrap_or(0);
        let t = p.invoke.time as f64 / NS_PER_S;
        match p.complete {
            Some(c) if c.ty != OpType::Invoke => {
                let lat = (c.time.saturating_sub(p.invoke.time) as f64 / NS_PER_MS).max(1e-3);
                lo = lo.min(lat);
                hi = hi.max(lat);
                series.entry((Outcome::of(p), fi)).or_default().push((t, lat));
            }
            _ => pending.entry(fi).or_default().push(t),
        }
    }
    if hi == 0.0 {
        (lo, hi) = (1.0, 100.0);
    }
    let y_lo = 10f64.powf((lo * 0.8).log10().floor());
    let mut y_hi = 10f64.powf((hi * 2.0).log10().ceil());
    if y_hi / y_lo < 100.0 {
        y_hi = y_lo * 100.0;
    }
    let y_pending = y_hi / 1.3;

    let mut legend = vec![LegendItem::Heading("operations".into())];
    for (fi, f) in fs.iter().enumerate() {
        for o in [Outcome::Ok, Outcome::Fail, Outcome::Info] {
            if let Some(pts) = series.get(&(o, fi)) {
                let text = format!("{} {} ({})", shorten(f, 14), o.name(), pts.len());
                legend.push(LegendItem::Marker { shape: fi, color: o.color(), text });
            }
        }
        if let Some(ts) = pending.get(&fi) {
            let text = format!("{} never completed ({})", shorten(f, 10), ts.len());
            legend.push(LegendItem::Marker { shape: fi, color: Outcome::Pending.color(), text });
        }
    }
    if !pending.is_empty() {
        legend.push(LegendItem::Note("never completed: drawn at top edge".into()));
    }
    if pairs.is_empty() {
        legend.push(LegendItem::Note("(no data)".into()));
    }
    fault_legend(&mut legend, faults, &kinds);

    render_png(path, PNG_SIZE, |root| {
        let (left, right) = root.split_horizontally(PNG_SIZE.0 - LEGEND_W);
        let caption = format!("Latency (raw): {} operations", pairs.len());
        let mut chart = ChartBuilder::on(&left)
            .caption(caption, font(22))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, (y_lo..y_hi).log_scale())
            .map_err(perr)?;
        chart
            .configure_mesh()
            .x_desc("time since start (s)")
            .y_desc("latency (log scale)")
            .axis_desc_style(font(15))
            .label_style(font(13))
            .x_label_formatter(&|v| trim_num(*v))
            .y_label_formatter(&|v| fmt_ms(*v))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .bold_line_style(RGBColor(0xcc, 0xcc, 0xcc))
            .draw()
            .map_err(perr)?;
        draw_bands(&mut chart, &bands, x_max, y_lo, y_hi)?;
        for (&(o, fi), pts) in &series {
            with_marker!(fi, o.color(), |mk| chart.draw_series(pts.iter().map(|&p| mk(p))).map_err(perr))?;
        }
        for (&fi, ts) in &pending {
            with_marker!(fi, Outcome::Pending.color(), |mk| {
                chart.draw_series(ts.iter().map(|&t| mk((t, y_pending)))).map_err(perr)
            })?;
        }
        draw_band_labels(&mut chart, &bands, x_max, y_hi)?;
        if pairs.is_empty() {
            draw_no_data(&chart.plotting_area().strip_coord_spec(), "no operations in history")?;
        }
        draw_legend(&right, &legend)?;
        stamp(root, Some(&utc_stamp(std::time::SystemTime::now())))
    })
}

// ---------------------------------------------------------------------------
// Rate plot
// ---------------------------------------------------------------------------

/// Writes a Jepsen-style throughput plot (PNG) to `path`.
///
/// Completions per second, counted in 1 s buckets by completion time, one
/// line per function `f` and outcome (ok / fail / info): colour = outcome,
/// dash pattern and marker = function (legend on the right, with totals).
/// Each bucket is plotted at its midpoint, and empty buckets are plotted as
/// 0, so outages show as drops to zero. The last bucket usually ends early,
/// at the last history entry: its rate is divided by the time it covers, and
/// it is left out of the lines (not the totals) if that is under 0.25 s.
/// Operations that never completed are not counted (they have no
/// completion). Fault windows are shaded bands as in [`latency_png`]. An
/// empty history gives a valid plot saying so.
pub fn rate_png(h: &History, faults: &[FaultWindow], path: &Path) -> Result<()> {
    let pairs = h.pairs();
    let fs = functions(&pairs);
    let kinds = fault_kinds(faults);
    let x_end_ns = extent_ns(h, faults);
    let x_max = (x_end_ns as f64 / NS_PER_S * 1.02).max(1.0);
    let bands = bands(faults, &kinds, x_end_ns);
    // Buckets cover the history (not faults after it): [i, i + 1) s, the
    // last one cut at the last entry.
    let hist_end_s = h.ops.iter().map(|o| o.time).max().unwrap_or(0) as f64 / NS_PER_S;
    let n_buckets = (hist_end_s.ceil() as usize).max(1);
    let covered = |i: usize| (hist_end_s.min(i as f64 + 1.0) - i as f64).max(1e-3);

    let mut counts: BTreeMap<(usize, Outcome), Vec<u32>> = BTreeMap::new();
    let mut pending = 0usize;
    for p in &pairs {
        let o = Outcome::of(p);
        let Some(c) = p.complete.filter(|_| o != Outcome::Pending) else {
            pending += 1;
            continue;
        };
        let fi = fs.iter().position(|f| *f == p.invoke.f).unwrap_or(0);
        let b = ((c.time / 1_000_000_000) as usize).min(n_buckets - 1);
        counts.entry((fi, o)).or_insert_with(|| vec![0; n_buckets])[b] += 1;
    }
    let rates: BTreeMap<(usize, Outcome), Vec<(f64, f64)>> = counts
        .iter()
        .map(|(k, v)| {
            let pts = v
                .iter()
                .enumerate()
                .filter(|&(i, _)| i == 0 || covered(i) >= 0.25)
                .map(|(i, &n)| (i as f64 + covered(i) / 2.0, n as f64 / covered(i)))
                .collect();
            (*k, pts)
        })
        .collect();
    let y_max = rates.values().flatten().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    // Markers on at most ~60 points per line so long runs stay readable.
    let marker_step = n_buckets.div_ceil(60).max(1);

    let mut legend = vec![LegendItem::Heading("completions".into())];
    for (&(fi, o), v) in &counts {
        let total: u32 = v.iter().sum();
        let text = format!("{} {} ({total})", shorten(fs[fi], 14), o.name());
        legend.push(LegendItem::Line { dash: DASHES[fi % DASHES.len()], shape: fi, color: o.color(), text });
    }
    if pending > 0 {
        legend.push(LegendItem::Note(format!("{pending} never completed: not counted")));
    }
    if pairs.is_empty() {
        legend.push(LegendItem::Note("(no data)".into()));
    }
    legend.push(LegendItem::Note("1 s buckets, by completion time".into()));
    fault_legend(&mut legend, faults, &kinds);

    render_png(path, PNG_SIZE, |root| {
        let (left, right) = root.split_horizontally(PNG_SIZE.0 - LEGEND_W);
        let caption = format!("Throughput: {} operations", pairs.len());
        let mut chart = ChartBuilder::on(&left)
            .caption(caption, font(22))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(perr)?;
        chart
            .configure_mesh()
            .x_desc("time since start (s)")
            .y_desc("completions per second")
            .axis_desc_style(font(15))
            .label_style(font(13))
            .x_label_formatter(&|v| trim_num(*v))
            .y_label_formatter(&|v| trim_num(*v))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .bold_line_style(RGBColor(0xcc, 0xcc, 0xcc))
            .draw()
            .map_err(perr)?;
        draw_bands(&mut chart, &bands, x_max, 0.0, y_max)?;
        for (&(fi, o), pts) in &rates {
            let style = ShapeStyle::from(o.color()).stroke_width(2);
            let (dash, gap) = DASHES[fi % DASHES.len()];
            if dash == 0 {
                chart.draw_series(LineSeries::new(pts.iter().copied(), style)).map_err(perr)?;
            } else {
                chart.draw_series(DashedLineSeries::new(pts.iter().copied(), dash, gap, style)).map_err(perr)?;
            }
            with_marker!(fi, o.color(), |mk| {
                chart.draw_series(pts.iter().step_by(marker_step).map(|&p| mk(p))).map_err(perr)
            })?;
        }
        draw_band_labels(&mut chart, &bands, x_max, y_max)?;
        if pairs.is_empty() {
            draw_no_data(&chart.plotting_area().strip_coord_spec(), "no operations in history")?;
        }
        draw_legend(&right, &legend)?;
        stamp(root, Some(&utc_stamp(std::time::SystemTime::now())))
    })
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use baton_checker::history::Op;
    use serde_json::json;
    use std::path::PathBuf;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    fn op(process: u64, ty: OpType, f: &str, key: &str, value: serde_json::Value, time: u64) -> Op {
        Op {
            index: 0,
            process,
            ty,
            f: f.into(),
            key: Some(key.into()),
            value,
            time,
            error: if matches!(ty, OpType::Fail | OpType::Info) { Some("timeout <&>".into()) } else { None },
        }
    }

    /// Four client lanes over ~12 s doing reads and writes; a partition from
    /// 3 s to 6 s makes operations slow, fail or time out (`info`); a kill at
    /// 8-9 s. A process that gets an `info` is replaced by a fresh one (id +
    /// 10), as Jepsen does; process 99's write never completes.
    fn sample() -> (History, Vec<FaultWindow>) {
        let mut events: Vec<Op> = Vec::new();
        let mut i: u64 = 0;
        for lane in 0..4u64 {
            let mut process = lane;
            let mut t = lane * 7 * MS;
            while t < 12 * S {
                i += 1;
                let f = if i.is_multiple_of(3) { "write" } else { "read" };
                let key = if i.is_multiple_of(2) { "x" } else { "y" };
                let in_partition = (3 * S..6 * S).contains(&t);
                let (ty, lat) = match (in_partition, i % 4) {
                    (true, 0) => (OpType::Fail, 20 * MS + (i % 7) * MS),
                    (true, 1) => (OpType::Info, 500 * MS),
                    (true, _) => (OpType::Ok, 50 * MS + (i % 11) * 10 * MS),
                    (false, _) => (OpType::Ok, MS / 2 + (i % 13) * MS / 3),
                };
                let v = if f == "write" { json!(i) } else { json!(null) };
                events.push(op(process, OpType::Invoke, f, key, v, t));
                let result = if f == "read" && ty == OpType::Ok { json!(i % 5) } else { json!(null) };
                events.push(op(process, ty, f, key, result, t + lat));
                t += lat + 40 * MS;
                if ty == OpType::Info {
                    process += 10;
                }
            }
        }
        events.push(op(99, OpType::Invoke, "write", "x", json!(99), 12 * S + 5 * MS));
        events.sort_by_key(|o| o.time);
        let mut h = History::default();
        for e in events {
            h.push(e);
        }
        let faults = vec![
            FaultWindow { kind: "partition".into(), detail: "n1 | n2 n3".into(), start: 3 * S, end: 6 * S },
            FaultWindow { kind: "kill".into(), detail: "n2".into(), start: 8 * S, end: 9 * S },
        ];
        (h, faults)
    }

    fn sample_dir() -> Option<PathBuf> {
        // Keep copies to look at by hand when asked to.
        std::env::var_os("BATON_REPORT_SAMPLE_DIR").map(PathBuf::from)
    }

    fn assert_png(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 5_000, "{} is only {} bytes", path.display(), bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} is not a PNG", path.display());
    }

    #[test]
    fn report_writes_all_outputs() {
        let (h, faults) = sample();
        assert!(h.pairs().iter().any(|p| p.complete.is_none()));
        let dir = tempfile::tempdir().unwrap();
        let lat = dir.path().join("latency-raw.png");
        let rate = dir.path().join("rate.png");
        let html = dir.path().join("timeline.html");
        latency_png(&h, &faults, &lat).unwrap();
        rate_png(&h, &faults, &rate).unwrap();
        timeline_html(&h, &faults, &html).unwrap();
        assert_png(&lat);
        assert_png(&rate);
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.len() > 10_000);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(!page.contains("<script src") && !page.contains("<link"), "must be self-contained");
        for p in h.ops.iter().map(|o| o.process).collect::<BTreeSet<_>>() {
            assert!(page.contains(&format!("data-process=\"{p}\"")), "lane for process {p} missing");
            assert!(page.contains(&format!(">process {p}</div>")), "header for process {p} missing");
        }
        assert!(page.contains("class=\"fault\" data-kind=\"partition\""));
        assert!(page.contains("class=\"fault\" data-kind=\"kill\""));
        assert!(page.contains("class=\"op ok\""));
        assert!(page.contains("class=\"op fail\""));
        assert!(page.contains("class=\"op info\""));
        assert!(page.contains("class=\"op pending\""));
        assert!(page.contains("timeout &lt;&amp;&gt;"), "errors are shown, escaped");
        assert!(!page.contains("Showing only"));
        // No temporary files left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
        if let Some(d) = sample_dir() {
            std::fs::create_dir_all(&d).unwrap();
            for f in [&lat, &rate, &html] {
                std::fs::copy(f, d.join(f.file_name().unwrap())).unwrap();
            }
        }
    }

    #[test]
    fn report_empty_history() {
        let h = History::default();
        let dir = tempfile::tempdir().unwrap();
        let lat = dir.path().join("latency-raw.png");
        let rate = dir.path().join("rate.png");
        let html = dir.path().join("timeline.html");
        latency_png(&h, &[], &lat).unwrap();
        rate_png(&h, &[], &rate).unwrap();
        timeline_html(&h, &[], &html).unwrap();
        assert_png(&lat);
        assert_png(&rate);
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("No operations in history"));
        assert!(page.ends_with("</html>\n"));
        // Faults without operations are fine too.
        let faults = [FaultWindow { kind: "pause".into(), detail: "n1".into(), start: S, end: 2 * S }];
        latency_png(&h, &faults, &lat).unwrap();
        rate_png(&h, &faults, &rate).unwrap();
        timeline_html(&h, &faults, &html).unwrap();
        assert_png(&lat);
        assert!(std::fs::read_to_string(&html).unwrap().contains("data-kind=\"pause\""));
        if let Some(d) = sample_dir() {
            std::fs::create_dir_all(&d).unwrap();
            std::fs::copy(&lat, d.join("empty-latency-raw.png")).unwrap();
            std::fs::copy(&rate, d.join("empty-rate.png")).unwrap();
            std::fs::copy(&html, d.join("empty-timeline.html")).unwrap();
        }
    }

    #[test]
    fn report_timeline_is_capped() {
        let mut h = History::default();
        for i in 0..(TIMELINE_MAX_OPS as u64 + 50) {
            let p = i % 4;
            h.push(op(p, OpType::Invoke, "read", "x", json!(null), i * MS));
            h.push(op(p, OpType::Ok, "read", "x", json!(1), i * MS + MS / 2));
        }
        let dir = tempfile::tempdir().unwrap();
        let html = dir.path().join("timeline.html");
        timeline_html(&h, &[], &html).unwrap();
        let page = std::fs::read_to_string(&html).unwrap();
        assert!(page.contains("Showing only the first 10000 of 10050 operations"));
        assert_eq!(page.matches("<div class=\"op ").count(), TIMELINE_MAX_OPS);
    }

    #[test]
    fn report_png_any_extension() {
        let (h, faults) = sample();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("latency");
        latency_png(&h, &faults, &p).unwrap();
        assert_png(&p);
    }

    #[test]
    fn report_helpers() {
        assert_eq!(fmt_ms(0.5), "500µs");
        assert_eq!(fmt_ms(10.0), "10ms");
        assert_eq!(fmt_ms(1500.0), "1.5s");
        assert_eq!(shorten("abcdef", 4), "abc…");
    }
}
