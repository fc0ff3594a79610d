//! The multi-region summary chart: one bar per strategy in three panels, utilisation
//! (admitted ÷ what an exact global limiter admits), over-admission (the worst window's
//! excess over `L`) and decision latency (p50 and p99), so the trade-off of
//! docs/multi-region.md is one picture.
//!
//! Plain SVG written by hand (rectangles and text): three bar panels need no plotting
//! library, and the output is byte-stable for a given input.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::chart::{ChartError, svg_document, write_svg};

/// One strategy's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionRow {
    /// The scenario's name.
    pub name: String,
    /// Admitted ÷ exact, in percent.
    pub utilisation_percent: f64,
    /// The worst window's excess over `L`, in cost units.
    pub over_admission: u64,
    /// Median decision latency, ms.
    pub p50_ms: f64,
    /// 99th percentile decision latency, ms.
    pub p99_ms: f64,
}

/// A panel: its title, a row's (bar, tick) values, the unit printed after them.
type Panel = (
    &'static str,
    Box<dyn Fn(&RegionRow) -> (f64, f64)>,
    &'static str,
);

/// Writes [`render_region_chart`] to `out_dir/multi-region-summary.svg`.
pub fn write_region_chart(rows: &[RegionRow], out_dir: &Path) -> Result<PathBuf, ChartError> {
    write_svg(
        out_dir,
        "multi-region-summary.svg",
        &render_region_chart(rows),
    )
}

/// The chart as an SVG document.
pub fn render_region_chart(rows: &[RegionRow]) -> String {
    let panels: [Panel; 3] = [
        (
            "utilisation: admitted ÷ exact global limiter (%)",
            Box::new(|r: &RegionRow| (r.utilisation_percent, r.utilisation_percent)),
            "%",
        ),
        (
            "over-admission: worst window above L (requests)",
            Box::new(|r: &RegionRow| (r.over_admission as f64, r.over_admission as f64)),
            "",
        ),
        (
            "decision latency: p50 (bar) and p99 (tick), ms",
            Box::new(|r: &RegionRow| (r.p50_ms, r.p99_ms)),
            " ms",
        ),
    ];
    let row_h = 18.0;
    let label_w = 230.0;
    let bar_w = 260.0;
    let panel_w = label_w + bar_w + 70.0;
    let height = 40.0 + row_h * rows.len() as f64;
    let width = panel_w * panels.len() as f64;
    let mut svg = String::new();
    for (p, (title, value, unit)) in panels.iter().enumerate() {
        let x0 = p as f64 * panel_w;
        let max = rows.iter().map(|r| value(r).1).fold(1.0_f64, f64::max);
        let _ = write!(
            svg,
            r#"<text x="{}" y="16" font-weight="bold">{title}</text>"#,
            x0 + 8.0
        );
        for (i, row) in rows.iter().enumerate() {
            let y = 28.0 + row_h * i as f64;
            let (bar, tick) = value(row);
            let len = bar_w * bar / max;
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}">{}</text><rect x="{}" y="{}" width="{len:.1}" height="{}" fill="{}"/>"#,
                x0 + 8.0,
                y + 12.0,
                row.name,
                x0 + label_w,
                y + 2.0,
                row_h - 5.0,
                if p == 1 && bar > 0.0 {
                    "#c0392b"
                } else {
                    "#2e86c1"
                },
            );
            if tick > bar {
                let tx = x0 + label_w + bar_w * tick / max;
                let _ = write!(
                    svg,
                    r#"<rect x="{tx:.1}" y="{}" width="2" height="{}" fill="black"/>"#,
                    y + 1.0,
                    row_h - 3.0
                );
            }
            let shown = if p == 2 { tick } else { bar };
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{}">{shown:.0}{unit}</text>"#,
                x0 + label_w + bar_w * bar.max(tick) / max + 6.0,
                y + 12.0
            );
        }
    }
    svg_document(width, height, &svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_per_strategy_in_each_panel() {
        let row = |name: &str, over| RegionRow {
            name: name.to_owned(),
            utilisation_percent: 90.0,
            over_admission: over,
            p50_ms: 2.0,
            p99_ms: 150.0,
        };
        let svg = render_region_chart(&[row("global", 0), row("async", 40)]);
        assert_eq!(svg.matches("<rect").count(), 1 + 2 * 3 + 2);
        assert!(svg.contains("40</text>") && svg.contains("150 ms</text>"));
    }
}
