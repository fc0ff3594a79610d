//! The lease summary: per lease scenario, utilisation (admitted ÷ what an exact limiter
//! admits), the share admitted from held blocks, over-admission against the limit itself
//! (no allowance: leases promise none) and what the reserved units came to (returned,
//! stranded, in doubt), as a table and one chart (docs/leases.md, "In the simulator").
//!
//! Plain SVG written by hand, like the multi-region chart: two bar panels need no plotting
//! library, and the output is byte-stable for a given input.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::chart::{ChartError, svg_document, write_svg};
use super::describe::format_percent;
use crate::oracle::Fraction;

/// One lease scenario's numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRow {
    /// The scenario's name.
    pub name: String,
    /// Cost admitted, all nodes and keys.
    pub admitted: u64,
    /// What one exact limiter would have admitted given the same requests.
    pub exact: u64,
    /// Of `admitted`: from held blocks, with no store call.
    pub from_leases: u64,
    /// The worst window's over-admission as a share of the limit (zero when within).
    pub over: Fraction,
    /// Units granted in usable reservations, all nodes.
    pub reserved: u64,
    /// Units given back to the store.
    pub returned: u64,
    /// Units granted and neither spent nor returned; `None` for a token bucket, leased as
    /// a rate share: an unused share strands rate, which its counters do not count.
    pub stranded: Option<u64>,
    /// Units of reservations that failed or were presumed lost: possibly taken, never spent.
    pub in_doubt: u64,
    /// The occupancy measure of the run's key 0 (`Run::steady_occupancy`: every span of one
    /// window, a token bucket from its first second), and after a kill from the kill on;
    /// `None` where not measured.
    pub occupancy: Option<Fraction>,
    /// The occupancy measure from the first kill on, for a scenario with one.
    pub occupancy_after_kill: Option<Fraction>,
    /// A token bucket's: tokens' worth of rate the nodes' shares held with no request
    /// (`LeaseStats::rate_idle`), and the killed nodes' shares stranded from their death
    /// until they lapsed; `None` for blocks.
    pub rate_idle_stranded: Option<(u64, u64)>,
    /// Script runs Redis made per 1 000 decisions (reservations, returns, takes and direct
    /// decisions alike).
    pub calls_per_1000: u64,
}

impl LeaseRow {
    /// Admitted ÷ exact, in percent (100 when the exact limiter admits nothing).
    pub fn utilisation_percent(&self) -> f64 {
        percent(self.admitted, self.exact)
    }

    /// From leases ÷ admitted, in percent.
    pub fn lease_percent(&self) -> f64 {
        percent(self.from_leases, self.admitted)
    }

    /// Stranded ÷ reserved, in percent; `None` when stranded units are not counted.
    pub fn stranded_percent(&self) -> Option<f64> {
        self.stranded.map(|s| percent(s, self.reserved))
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return if part == 0 { 100.0 } else { 0.0 };
    }
    part as f64 * 100.0 / whole as f64
}

/// The rows as an aligned plain-text table. Empty input gives the header.
pub fn render_lease_table(rows: &[LeaseRow]) -> String {
    let mut out = format!(
        "{:<32} {:>8} {:>6} {:>7} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8}\n",
        "leases",
        "admitted",
        "exact",
        "util %",
        "occup %",
        "killed %",
        "leased %",
        "over %",
        "reserved",
        "returned",
        "stranded",
        "in doubt",
        "rate idle/dead",
        "calls/1k"
    );
    for row in rows {
        let stranded = row.stranded.map_or("-".to_owned(), |s| s.to_string());
        let occupancy = |f: Option<Fraction>| {
            f.map_or("-".to_owned(), |f| format!("{:.1}", f.to_f64() * 100.0))
        };
        let _ = writeln!(
            out,
            "{:<32} {:>8} {:>6} {:>7.1} {:>8} {:>8} {:>9.1} {:>7} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8}",
            row.name,
            row.admitted,
            row.exact,
            row.utilisation_percent(),
            occupancy(row.occupancy),
            occupancy(row.occupancy_after_kill),
            row.lease_percent(),
            format_percent(row.over),
            row.reserved,
            row.returned,
            stranded,
            row.in_doubt,
            row.rate_idle_stranded
                .map_or("-".to_owned(), |(idle, dead)| format!("{idle}/{dead}")),
            row.calls_per_1000,
        );
    }
    out
}

/// Writes [`render_lease_chart`] to `out_dir/leases-summary.svg`.
pub fn write_lease_chart(rows: &[LeaseRow], out_dir: &Path) -> Result<PathBuf, ChartError> {
    write_svg(out_dir, "leases-summary.svg", &render_lease_chart(rows))
}

/// The chart as an SVG document: two panels, one row per scenario. Left: utilisation (bar)
/// and the share admitted from leases (a thinner bar under it), in percent. Right: what the
/// reserved units came to, returned and stranded, in percent of reserved, with the
/// over-admission in the label (red when above zero).
pub fn render_lease_chart(rows: &[LeaseRow]) -> String {
    let row_h = 24.0;
    let label_w = 230.0;
    let bar_w = 260.0;
    let panel_w = label_w + bar_w + 70.0;
    let height = 40.0 + row_h * rows.len() as f64;
    let width = panel_w * 2.0;
    let mut svg = String::new();
    let titles = [
        "utilisation: admitted ÷ exact (blue), from leases (green), %",
        "reserved units: returned (grey), stranded (orange), %",
    ];
    for (p, title) in titles.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<text x="{}" y="16" font-weight="bold">{title}</text>"#,
            p as f64 * panel_w + 8.0
        );
    }
    for (i, row) in rows.iter().enumerate() {
        let y = 28.0 + row_h * i as f64;
        let over = format_percent(row.over);
        let (label, colour) = if row.over.is_positive() {
            (format!("{} (over {over} %)", row.name), "#c0392b")
        } else {
            (row.name.clone(), "black")
        };
        let returned = percent(row.returned, row.reserved);
        let bars = [
            (0, row.utilisation_percent(), "#2e86c1", 0.0),
            (0, row.lease_percent(), "#27ae60", 1.0),
            (1, returned, "#95a5a6", 0.0),
            (1, row.stranded_percent().unwrap_or(0.0), "#e67e22", 1.0),
        ];
        for p in 0..2 {
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" fill="{colour}">{label}</text>"#,
                p as f64 * panel_w + 8.0,
                y + 14.0
            );
        }
        for (p, value, fill, lane) in bars {
            let x0 = p as f64 * panel_w + label_w;
            let top = y + 2.0 + lane * (row_h - 4.0) / 2.0;
            let len = bar_w * value.clamp(0.0, 100.0) / 100.0;
            let shown = if p == 1 && lane > 0.0 && row.stranded.is_none() {
                "n/a".to_owned()
            } else {
                format!("{value:.1} %")
            };
            let _ = write!(
                svg,
                r#"<rect x="{x0}" y="{top}" width="{len:.1}" height="{}" fill="{fill}"/><text x="{:.1}" y="{}" font-size="10">{shown}</text>"#,
                (row_h - 4.0) / 2.0 - 1.0,
                x0 + len + 4.0,
                top + 9.0
            );
        }
    }
    svg_document(width, height, &svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, over: Fraction, stranded: Option<u64>) -> LeaseRow {
        LeaseRow {
            name: name.to_owned(),
            admitted: 90,
            exact: 100,
            from_leases: 45,
            over,
            reserved: 80,
            returned: 20,
            stranded,
            in_doubt: 0,
            occupancy: None,
            occupancy_after_kill: None,
            rate_idle_stranded: None,
            calls_per_1000: 0,
        }
    }

    #[test]
    fn the_table_shows_utilisation_lease_share_and_units_with_a_dash_for_rates() {
        let table = render_lease_table(&[
            row("leased-fixed-window", Fraction::ZERO, Some(8)),
            row("leased-token-bucket", Fraction::ZERO, None),
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].contains("90.0") && lines[1].contains("50.0"));
        assert!(
            lines[1].contains("0.00")
                && lines[1].ends_with("       8        0              -        0")
        );
        assert!(
            lines[2].ends_with("       -        0              -        0"),
            "{}",
            lines[2]
        );
    }

    #[test]
    fn two_bars_per_row_in_each_panel_and_over_admission_in_red() {
        let over = Fraction::new(1, 10).unwrap();
        let svg = render_lease_chart(&[row("a", Fraction::ZERO, Some(8)), row("b", over, None)]);
        assert_eq!(svg.matches("<rect").count(), 1 + 2 * 4);
        assert!(svg.contains("90.0 %") && svg.contains("10.0 %") && svg.contains("n/a"));
        assert!(svg.contains("b (over 10.00 %)") && svg.contains("#c0392b"));
        assert!(!svg.contains("a (over"));
    }
}
