//! The timeline page of a test run (self-contained HTML, no font needed):
//! one column per process, each operation a box from its invocation to its
//! completion, with a hover title, over the nemesis's fault windows. Like
//! Jepsen's `timeline.html`. Colours are the report's ([`super`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use baton_checker::history::{FaultWindow, History};

use plotters::style::RGBColor;

use super::{extent_ns, fault_kinds, hex, shorten, window_end, Outcome, FAULT_COLORS, NS_PER_MS, NS_PER_S};

/// The timeline shows at most this many operations (the earliest invoked);
/// the page says so when the history is longer.
pub const TIMELINE_MAX_OPS: usize = 10_000;

fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' => out.push_str("&#10;"),
            _ => out.push(c),
        }
    }
    out
}

fn secs(ns: u64) -> String {
    format!("{:.6} s", ns as f64 / NS_PER_S)
}

fn json_short(v: &serde_json::Value) -> String {
    shorten(&v.to_string(), 300)
}

/// A "nice" step (1, 2 or 5 times a power of ten) of at least `x`.
fn nice_step(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * p).find(|s| *s >= x).unwrap_or(10.0 * p)
}

const TIMELINE_CSS: &str = r#"
body { font-family: sans-serif; font-size: 13px; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 8px 0; }
.note { background: #fff4d6; border: 1px solid #e0c060; padding: 6px 10px; display: inline-block; }
.empty { font-size: 16px; color: #666; }
.legend span.sw { display: inline-block; width: 14px; height: 14px; vertical-align: middle; margin: 0 4px 0 12px; border: 1px solid #0004; }
table.faults { border-collapse: collapse; margin: 8px 0; }
table.faults td, table.faults th { border: 1px solid #ccc; padding: 2px 8px; text-align: left; }
.heads { position: sticky; top: 0; z-index: 10; background: #fff; height: 24px; border-bottom: 1px solid #999; }
.lane-head { position: absolute; top: 4px; font-weight: bold; text-align: center; overflow: hidden; white-space: nowrap; }
.timeline { position: relative; }
.lane { position: absolute; top: 0; bottom: 0; background: #f6f6f6; border-right: 1px solid #e4e4e4; }
.lane:nth-child(even) { background: #fbfbfb; }
.tick { position: absolute; left: 0; border-top: 1px solid #ddd; font-size: 10px; color: #666; padding-left: 2px; z-index: 0; }
.fault { position: absolute; z-index: 1; border-top: 1px dashed; border-bottom: 1px dashed; }
.fault span { position: sticky; left: 0; font-size: 11px; font-weight: bold; padding: 0 3px; }
.op { position: absolute; z-index: 2; box-sizing: border-box; min-height: 3px; border: 1px solid #0005; border-radius: 2px;
      font-size: 10px; line-height: 11px; overflow: hidden; white-space: nowrap; padding: 0 2px; }
.op:hover { outline: 2px solid #000; z-index: 3; }
.ok { background: #8fd18f; }
.fail { background: #f08a8a; }
.info { background: #c3a8e0; }
.pending { background: repeating-linear-gradient(45deg, #cfcfcf, #cfcfcf 4px, #e8e8e8 4px, #e8e8e8 8px); border-style: dashed; }
"#;

/// Writes a self-contained HTML timeline (no external scripts or CSS) to
/// `path`.
///
/// One column ("lane") per process, ordered by process id; each operation is
/// a box from its invocation to its completion (vertical axis = time since
/// start, with a ruler on the left), coloured by outcome (ok green, fail red,
/// info purple; never completed: grey hatched, reaching to the last history
/// entry). Hovering a box shows process, f, key, invocation value, result
/// value, error, and times. Fault windows are bands across all lanes,
/// labelled with their kind, and listed in a table at the top.
///
/// Only the first [`TIMELINE_MAX_OPS`] operations (by invocation) are drawn;
/// the page says so when it truncates. Boxes are at least 3 px tall, so very
/// short operations are visible but their height then overstates latency.
pub fn timeline_html(h: &History, faults: &[FaultWindow], path: &Path) -> Result<()> {
    let all = h.pairs();
    let total = all.len();
    let truncated = total > TIMELINE_MAX_OPS;
    let shown = &all[..total.min(TIMELINE_MAX_OPS)];
    let kinds = fault_kinds(faults);

    // Time span drawn, in ns.
    let history_end = h.ops.iter().map(|o| o.time).max().unwrap_or(0);
    let view_end = if truncated {
        shown.iter().map(|p| p.complete.map(|c| c.time).unwrap_or(p.invoke.time)).max().unwrap_or(0)
    } else {
        extent_ns(h, faults)
    };
    let view_end = view_end.max(1);
    let pending_end = history_end.min(view_end).max(1);

    let procs: Vec<u64> = shown.iter().map(|p| p.invoke.process).collect::<BTreeSet<_>>().into_iter().collect();
    let lane_of: HashMap<u64, usize> = procs.iter().enumerate().map(|(i, p)| (*p, i)).collect();
    let mut per_lane = vec![0usize; procs.len()];
    for p in shown {
        per_lane[lane_of[&p.invoke.process]] += 1;
    }
    let busiest = per_lane.iter().copied().max().unwrap_or(0);

    // Vertical scale: about 10 px per operation in the busiest lane, between
    // 600 and 50,000 px in total.
    let view_s = view_end as f64 / NS_PER_S;
    let height_px = (busiest as f64 * 10.0).clamp(600.0, 50_000.0);
    let px_per_s = height_px / view_s;
    let y = |ns: u64| ns as f64 / NS_PER_S * px_per_s;
    let ruler_w = 70.0;
    let lane_w = if procs.len() <= 20 { 120.0 } else { 72.0 };
    let width = ruler_w + lane_w * procs.len().max(4) as f64;

    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    for p in &all {
        *counts.entry(Outcome::of(p)).or_default() += 1;
    }

    let mut s = String::with_capacity(1024 + shown.len() * 400);
    s.push_str(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Baton Jepsen timeline</title>\n",
    );
    let _ = write!(s, "<style>{TIMELINE_CSS}</style>\n</head>\n<body>\n<h1>Timeline</h1>\n");
    let _ = writeln!(
        s,
        "<p>{} operations by {} processes over {:.3} s: {} ok, {} fail, {} info, {} never completed.</p>",
        total,
        all.iter().map(|p| p.invoke.process).collect::<BTreeSet<_>>().len(),
        history_end as f64 / NS_PER_S,
        counts.get(&Outcome::Ok).unwrap_or(&0),
        counts.get(&Outcome::Fail).unwrap_or(&0),
        counts.get(&Outcome::Info).unwrap_or(&0),
        counts.get(&Outcome::Pending).unwrap_or(&0),
    );
    if truncated {
        let _ = writeln!(
            s,
            "<p class=\"note\">Showing only the first {} of {} operations (those invoked up to {}); \
             the rest are in the history file and in the plots.</p>",
            shown.len(),
            total,
            secs(shown.last().map(|p| p.invoke.time).unwrap_or(0)),
        );
    }
    s.push_str("<p class=\"legend\">Outcome:");
    for o in [Outcome::Ok, Outcome::Fail, Outcome::Info, Outcome::Pending] {
        let _ = write!(s, "<span class=\"sw {}\"></span>{}", o.css(), o.name());
    }
    s.push_str(". Hover over a box for details. Time runs downwards.</p>\n");

    if !faults.is_empty() {
        s.push_str(
            "<table class=\"faults\">\n<tr><th></th><th>fault</th><th>detail</th><th>start</th><th>end</th></tr>\n",
        );
        let mut sorted: Vec<&FaultWindow> = faults.iter().collect();
        sorted.sort_by_key(|w| w.start);
        for w in sorted {
            let ki = kinds.iter().position(|k| *k == w.kind).unwrap_or(0);
            let end = if w.end < w.start || w.end == u64::MAX { "open".to_string() } else { secs(w.end) };
            let _ = writeln!(
                s,
                "<tr><td><span class=\"sw\" style=\"display:inline-block;width:14px;height:14px;background:{}\"></span></td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                hex(FAULT_COLORS[ki % FAULT_COLORS.len()]),
                esc(&w.kind),
                esc(&w.detail),
                secs(w.start),
                end
            );
        }
        s.push_str("</table>\n");
    }

    if shown.is_empty() {
        s.push_str("<p class=\"empty\">No operations in history: nothing to draw.</p>\n");
    }

    // Lane headers (sticky while scrolling).
    let _ = writeln!(s, "<div class=\"heads\" style=\"width:{width:.0}px\">");
    for (i, p) in procs.iter().enumerate() {
        let _ = writeln!(
            s,
            "<div class=\"lane-head\" style=\"left:{:.0}px;width:{:.0}px\">process {p}</div>",
            ruler_w + lane_w * i as f64,
            lane_w
        );
    }
    s.push_str("</div>\n");

    let _ = writeln!(s, "<div class=\"timeline\" style=\"width:{width:.0}px;height:{:.0}px\">", y(view_end) + 20.0);
    for (i, p) in procs.iter().enumerate() {
        let _ = writeln!(
            s,
            "<div class=\"lane\" data-process=\"{p}\" style=\"left:{:.0}px;width:{:.0}px\"></div>",
            ruler_w + lane_w * i as f64,
            lane_w
        );
    }
    // Ruler: a tick about every 80 px.
    let step = nice_step(80.0 / px_per_s);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let mut k = 0u64;
    while k as f64 * step <= view_s + step * 1e-6 {
        let t = k as f64 * step;
        let _ = writeln!(
            s,
            "<div class=\"tick\" style=\"top:{:.1}px;width:{width:.0}px\">{t:.decimals$} s</div>",
            t * px_per_s
        );
        k += 1;
    }
    // Fault bands, across all lanes.
    for w in faults {
        if w.start > view_end {
            continue;
        }
        let ki = kinds.iter().position(|k| *k == w.kind).unwrap_or(0);
        let c = FAULT_COLORS[ki % FAULT_COLORS.len()];
        let end = window_end(w, view_end).min(view_end);
        let top = y(w.start);
        let hgt = (y(end) - top).max(2.0);
        let title = format!("{}: {}\nfrom {} to {}", w.kind, w.detail, secs(w.start), secs(window_end(w, history_end)));
        let _ = writeln!(
            s,
            "<div class=\"fault\" data-kind=\"{}\" style=\"top:{top:.1}px;height:{hgt:.1}px;left:{ruler_w:.0}px;width:{:.0}px;\
             background:rgba({},{},{},0.16);border-color:{}\" title=\"{}\"><span style=\"color:{}\">{}</span></div>",
            esc(&w.kind),
            width - ruler_w,
            c.0,
            c.1,
            c.2,
            hex(c),
            esc(&title),
            hex(RGBColor(c.0 / 2, c.1 / 2, c.2 / 2)),
            esc(&w.kind),
        );
    }
    // Operations.
    for p in shown {
        let o = Outcome::of(p);
        let inv = p.invoke;
        let end = match p.complete {
            Some(c) if o != Outcome::Pending => c.time,
            _ => pending_end.max(inv.time),
        };
        let top = y(inv.time);
        let hgt = (y(end) - top).max(3.0);
        let left = ruler_w + lane_w * lane_of[&inv.process] as f64 + 3.0;

        let mut title = format!("process {}\n{}", inv.process, inv.f);
        if let Some(k) = &inv.key {
            let _ = write!(title, " key={k}");
        }
        let _ = write!(title, "\ninvoke value: {}", json_short(&inv.value));
        match p.complete {
            Some(c) if o != Outcome::Pending => {
                let _ = write!(title, "\n{}: {}", o.name(), json_short(&c.value));
                if let Some(e) = &c.error {
                    let _ = write!(title, "\nerror: {}", shorten(e, 300));
                }
                let _ = write!(
                    title,
                    "\ninvoked {}, completed {} ({:.3} ms)\nhistory index {}..{}",
                    secs(inv.time),
                    secs(c.time),
                    c.time.saturating_sub(inv.time) as f64 / NS_PER_MS,
                    inv.index,
                    c.index
                );
            }
            _ => {
                let _ = write!(
                    title,
                    "\nnever completed (indeterminate)\ninvoked {}\nhistory index {}",
                    secs(inv.time),
                    inv.index
                );
            }
        }
        let label = if hgt >= 12.0 {
            let mut l = inv.f.clone();
            if let Some(k) = &inv.key {
                l.push(' ');
                l.push_str(k);
            }
            esc(&shorten(&l, 30))
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "<div class=\"op {}\" style=\"left:{left:.0}px;top:{top:.1}px;height:{hgt:.1}px;width:{:.0}px\" title=\"{}\">{label}</div>",
            o.css(),
            lane_w - 6.0,
            esc(&title),
        );
    }
    s.push_str("</div>\n</body>\n</html>\n");
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_helpers() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(7.0), 10.0);
        assert_eq!(esc("a<b>\"c\"&'"), "a&lt;b&gt;&quot;c&quot;&amp;&#39;");
    }
}
