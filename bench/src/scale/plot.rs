//! scale-<dim>.png: one panel per figure of a dimension, every target on
//! the same axes: the size across on a log axis (sizes grow 10x a step),
//! the figure up on a linear axis from zero, with ticks in the figure's own
//! precision (`0.5`, not `0`; `1000`, not `1000.0`) and room above the
//! data for the legend; a line with points per target; a second, thinner
//! line for a companion figure (p99 beside p50); a vertical bar from the
//! lowest to the highest run where there were several. The run's date is
//! in the bottom right corner.

use std::path::Path;

use plotters::prelude::*;

use super::{Dim, Row};
use crate::targets::Kind;
use baton_jepsen::plot::{font, num, perr, render_png, stamp, Area};

/// One panel: its title, the main figure, a companion drawn thinner, and
/// the keys of the main figure's run spread.
struct Panel {
    title: &'static str,
    key: &'static str,
    second: Option<(&'static str, &'static str)>,
    spread: Option<(&'static str, &'static str)>,
}

const fn p(title: &'static str, key: &'static str) -> Panel {
    Panel { title, key, second: None, spread: None }
}

fn panels(d: Dim) -> Vec<Panel> {
    match d {
        Dim::Nodes => vec![
            p("RSS, largest member (MB)", "rss_mb_max"),
            p("data dir on disk, largest member (MB)", "disk_mb_max"),
            p("snapshot size (MB)", "snapshot_mb"),
            p("lagging follower catch-up (s)", "catchup_s"),
            p("restart to serving (s)", "restart_s"),
            p("fill rate (nodes/s)", "writes_per_sec"),
        ],
        Dim::Sessions => vec![
            p("CPU, 3 members (% of a core)", "cpu_pct_sum"),
            p("RSS, largest member (MB)", "rss_mb_max"),
            Panel {
                title: "expiry: late after the timeout, p50 and p99 (thin) (ms)",
                key: "expiry_late_p50_ms",
                second: Some(("p99", "expiry_late_p99_ms")),
                spread: None,
            },
            p("opening them (s)", "open_s"),
        ],
        Dim::Watches => {
            vec![p("RSS growth, largest member (MB)", "rss_growth_mb_max"), p("registering them (s)", "register_s")]
        }
        Dim::Fanout => vec![
            Panel {
                title: "one write to all watchers: p50 and p99 (thin) (ms)",
                key: "p50_ms",
                second: Some(("p99", "p99_ms")),
                spread: None,
            },
            p("until the last watcher has it (ms)", "all_ms"),
        ],
        Dim::Locks => vec![
            Panel {
                title: "handoff: p50 and p99 (thin) (ms)",
                key: "handoff_p50_ms",
                second: Some(("p99", "handoff_p99_ms")),
                spread: None,
            },
            p("wake-ups per release (1 = no herd)", "wakeups_per_release"),
            p("handoffs/s", "handoffs_per_sec"),
        ],
        Dim::Clients => vec![
            Panel {
                title: "write: ops/s (median, min-max)",
                key: "write_ops_per_sec",
                second: None,
                spread: Some(("write_ops_per_sec_min", "write_ops_per_sec_max")),
            },
            Panel {
                title: "write: p99 (ms, median, min-max)",
                key: "write_p99_ms",
                second: None,
                spread: Some(("write_p99_ms_min", "write_p99_ms_max")),
            },
            Panel {
                title: "lock-independent: ops/s (median, min-max)",
                key: "lock_ops_per_sec",
                second: None,
                spread: Some(("lock_ops_per_sec_min", "lock_ops_per_sec_max")),
            },
            Panel {
                title: "lock-independent: p99 (ms, median, min-max)",
                key: "lock_p99_ms",
                second: None,
                spread: Some(("lock_p99_ms_min", "lock_p99_ms_max")),
            },
        ],
    }
}

fn color(k: Kind) -> RGBColor {
    match k {
        Kind::Baton => RGBColor(0x1f, 0x77, 0xb4),
        Kind::Etcd => RGBColor(0x2c, 0xa0, 0x2c),
        Kind::BatonZk => RGBColor(0x9e, 0xc5, 0xe8),
        Kind::Zookeeper => RGBColor(0xff, 0x7f, 0x0e),
    }
}

/// 1000 → 1k, 1000000 → 1M, 0.5 → 0.5.
fn human(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", (v / 1e5).round() / 10.0)
    } else if v >= 1e3 {
        format!("{}k", (v / 1e2).round() / 10.0)
    } else {
        num(v)
    }
}

/// Writes `out/scale-<dim>.png` for every dimension with rows.
pub fn charts(all: &[Row], out: &Path) -> anyhow::Result<()> {
    for d in Dim::ALL {
        let rows: Vec<&Row> = all.iter().filter(|r| r.dim == d && !r.figures.is_empty()).collect();
        if rows.is_empty() {
            continue;
        }
        let ps = panels(d);
        const COLS: usize = 2;
        let n_rows = ps.len().div_ceil(COLS).max(1);
        // Targets run at different times (an older file's rows) name each.
        let mut dates: Vec<&str> = Vec::new();
        for d in rows.iter().filter_map(|r| r.date.as_deref()) {
            if !dates.contains(&d) {
                dates.push(d);
            }
        }
        let joined = dates.join(", ");
        let date = (!dates.is_empty()).then_some(joined.as_str());
        render_png(&out.join(format!("scale-{}.png", d.name())), (1100, 330 * n_rows as u32 + 16), |root| {
            let (plots, _) = root.split_vertically(330 * n_rows as u32);
            for (pn, area) in ps.iter().zip(plots.split_evenly((n_rows, COLS)).iter()) {
                panel(area, d, pn, &rows)?;
            }
            stamp(root, date)
        })?;
    }
    Ok(())
}

fn panel(area: &Area<'_>, d: Dim, pn: &Panel, rows: &[&Row]) -> anyhow::Result<()> {
    let mut targets: Vec<Kind> = rows.iter().map(|r| r.target).collect();
    targets.sort();
    targets.dedup();
    let sizes = || rows.iter().map(|r| r.size as f64).filter(|s| *s > 0.0);
    let x_min = sizes().fold(f64::INFINITY, f64::min).min(1e12) / 1.6;
    let x_max = sizes().fold(1.0, f64::max) * 1.6;
    let val = |r: &Row, k: &str| r.get(k).filter(|v| v.is_finite());
    let y_max = rows
        .iter()
        .flat_map(|r| {
            let mut v = vec![val(r, pn.key)];
            v.extend(pn.second.map(|(_, k)| val(r, k)));
            v.extend(pn.spread.map(|(_, hi)| val(r, hi)));
            v
        })
        .flatten()
        .fold(0.0, f64::max);
    // The top three eighths stay free for the legend.
    let y_max = if y_max > 0.0 { y_max * 1.6 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(pn.title, font(15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(64)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0f64..y_max)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc(d.unit())
        .x_labels(8)
        .x_label_formatter(&|v| human(*v))
        .y_label_formatter(&|v| human(*v))
        .label_style(font(12))
        .draw()
        .map_err(perr)?;
    for t in targets {
        let c = color(t);
        let mut mine: Vec<&Row> = rows.iter().copied().filter(|r| r.target == t).collect();
        mine.sort_by_key(|r| r.size);
        let pts: Vec<(f64, f64)> = mine.iter().filter_map(|r| Some((r.size as f64, val(r, pn.key)?))).collect();
        if pts.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(perr)?
            .label(t.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&(x, y)| Circle::new((x, y), 4, c.filled()))).map_err(perr)?;
        if let Some((_, k2)) = pn.second {
            let pts2: Vec<(f64, f64)> = mine.iter().filter_map(|r| Some((r.size as f64, val(r, k2)?))).collect();
            chart.draw_series(LineSeries::new(pts2.clone(), c.stroke_width(1))).map_err(perr)?;
            chart.draw_series(pts2.iter().map(|&(x, y)| Cross::new((x, y), 4, c.stroke_width(1)))).map_err(perr)?;
        }
        if let Some((lo, hi)) = pn.spread {
            for r in &mine {
                if let (Some(l), Some(h)) = (val(r, lo), val(r, hi)) {
                    let x = r.size as f64;
                    chart.draw_series([PathElement::new(vec![(x, l), (x, h)], BLACK.stroke_width(2))]).map_err(perr)?;
                }
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(font(12))
        .draw()
        .map_err(perr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::human;

    #[test]
    fn axis_labels() {
        assert_eq!(human(0.0), "0");
        assert_eq!(human(512.0), "512");
        assert_eq!(human(10_000.0), "10k");
        assert_eq!(human(1_000_000.0), "1M");
        assert_eq!(human(2_500.0), "2.5k");
        assert_eq!(human(0.5), "0.5");
        assert_eq!(human(1.0), "1");
    }
}
