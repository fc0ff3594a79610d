//! One SVG chart per scenario: what the nodes admitted, bucket by bucket, against what the
//! policy allows, with the faults shaded.
//!
//! The chart is for people; the verdict is the oracle's, and the title carries it. Lines
//! per node show who admitted, a thick line shows the total, and each limit contributes a
//! solid "sustained" line and a dashed "ceiling" line (see [`super::series`] for why one
//! line would mislead). A ceiling far above everything else would flatten the data into
//! the axis, so it is then listed in the legend as off scale instead of drawn.

use std::fmt;
use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use rein_core::Timestamp;

use super::describe::{format_duration, format_percent};
use super::scenario::ScenarioResult;
use super::series::LineKind;

/// Why a chart could not be written.
#[derive(Debug)]
pub enum ChartError {
    /// The output directory or file could not be created or written: check the path and
    /// its permissions.
    Io(std::io::Error),
    /// plotters refused to draw, which with the SVG backend means a bug in this module.
    Draw(String),
}

/// Renders the scenario's chart and writes it to `<out_dir>/<name>.svg`, creating
/// `out_dir` if needed. Characters of the name other than ASCII letters, digits, `-`, `_`
/// and `.` become `_` in the file name. Returns the path written.
pub fn write_chart(result: &ScenarioResult, out_dir: &Path) -> Result<PathBuf, ChartError> {
    let svg = render_chart(result)?;
    write_svg(
        out_dir,
        &format!("{}.svg", file_stem(&result.facts.name)),
        &svg,
    )
}

/// A hand-written SVG document `width` by `height`, on white, around `body`.
pub(crate) fn svg_document(width: f64, height: f64, body: &str) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>"#
    );
    svg.push_str(body);
    svg.push_str("</svg>\n");
    svg
}

/// Writes `svg` to `<out_dir>/<file>`, creating `out_dir` if needed. Returns the path
/// written.
pub(crate) fn write_svg(out_dir: &Path, file: &str, svg: &str) -> Result<PathBuf, ChartError> {
    std::fs::create_dir_all(out_dir).map_err(ChartError::Io)?;
    let path = out_dir.join(file);
    std::fs::write(&path, svg).map_err(ChartError::Io)?;
    Ok(path)
}

/// The scenario's chart as an SVG document.
pub fn render_chart(result: &ScenarioResult) -> Result<String, ChartError> {
    let legend = legend_entries(result);
    let legend_rows = legend_rows(&legend);
    let band = LEGEND_PADDING * 2 + LEGEND_ROW * legend_rows.len() as u32;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, PLOT_HEIGHT + band)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_failed)?;
        let (plot, key) = root.split_vertically(PLOT_HEIGHT);
        draw_plot(result, &plot)?;
        draw_legend(&legend_rows, &key)?;
        root.present().map_err(draw_failed)?;
    }
    Ok(svg)
}

impl fmt::Display for ChartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChartError::Io(e) => write!(f, "could not write the chart: {e}"),
            ChartError::Draw(e) => write!(f, "could not draw the chart: {e}"),
        }
    }
}

impl std::error::Error for ChartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChartError::Io(e) => Some(e),
            ChartError::Draw(_) => None,
        }
    }
}

/// One legend entry: a line sample and its text.
struct LegendEntry {
    label: String,
    colour: RGBColor,
    width: u32,
    dashed: bool,
    /// Limit lines have long labels: one row each.
    own_row: bool,
}

/// The admissions and every limit line, drawn on time × cost-per-bucket axes.
fn draw_plot<DB: DrawingBackend>(
    result: &ScenarioResult,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let series = &result.series;
    let bucket_seconds = series.bucket.as_micros() as f64 / 1e6;
    let x_end = (result.facts.run.length().as_micros() as f64 / 1e6).max(bucket_seconds);
    let global = series.global();
    // Each bucket's count is drawn at the bucket's middle.
    let middle = |i: usize| (i as f64 + 0.5) * bucket_seconds;
    let y_top = y_range(result, &global) * HEAD_ROOM;

    let verdict = if result.is_within_bound() {
        "within bound"
    } else {
        "OVER the bound"
    };
    let title = format!(
        "{}: over-admission {} % ({verdict})",
        result.facts.name,
        format_percent(result.over_admission())
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_end, 0f64..y_top)
        .map_err(draw_failed)?;
    chart
        .configure_mesh()
        .x_desc("simulated time since start (s)")
        .y_desc(format!(
            "admitted cost per {} (one key)",
            format_duration(series.bucket)
        ))
        .axis_desc_style(("sans-serif", 15))
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(draw_failed)?;

    // Faults first, so the lines are drawn over the shading.
    let seconds =
        |t: Timestamp| t.saturating_since(result.facts.run.start).as_micros() as f64 / 1e6;
    for (i, fault) in result.facts.fault_spans.iter().enumerate() {
        let (start, end) = (seconds(fault.during.start), seconds(fault.during.end));
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(start.min(x_end), 0.0), (end.min(x_end), y_top)],
                FAULT_FILL.filled(),
            )))
            .map_err(draw_failed)?;
        // Labels step down so that overlapping faults stay readable.
        let label_y = y_top * (0.98 - 0.05 * (i % 4) as f64);
        chart
            .draw_series(std::iter::once(Text::new(
                fault.label.clone(),
                (start.min(x_end) + x_end * 0.004, label_y),
                ("sans-serif", 13).into_font().color(&FAULT_TEXT),
            )))
            .map_err(draw_failed)?;
    }

    // Limits under the data, so a node line on a limit line stays visible.
    for (i, line) in result.limit_lines.iter().enumerate() {
        let value = line.per_bucket.to_f64();
        if !on_scale(result, &global, value) {
            continue;
        }
        let style = limit_colour(i).stroke_width(2);
        let ends = [(0.0, value), (x_end, value)];
        match line.kind {
            LineKind::Sustained => chart.draw_series(LineSeries::new(ends, style)),
            LineKind::Ceiling => chart.draw_series(DashedLineSeries::new(ends, 8, 5, style)),
        }
        .map_err(draw_failed)?;
    }
    // Each node's counts, thin, then the global count, thick, over them.
    let per_node = series.per_node.iter().enumerate();
    let lines = per_node
        .map(|(node, counts)| (counts, node_colour(node).stroke_width(1)))
        .chain([(&global, BLACK.stroke_width(3))]);
    for (counts, style) in lines {
        chart
            .draw_series(LineSeries::new(
                counts
                    .iter()
                    .enumerate()
                    .map(|(i, &c)| (middle(i), c as f64)),
                style,
            ))
            .map_err(draw_failed)?;
    }
    Ok(())
}

/// The legend, below the plot rather than on it, where it would hide data or fault labels.
fn draw_legend<DB: DrawingBackend>(
    rows: &[Vec<(u32, &LegendEntry)>],
    area: &DrawingArea<DB, Shift>,
) -> Result<(), ChartError>
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 13).into_font();
    for (row, entries) in rows.iter().enumerate() {
        let y = (LEGEND_PADDING + LEGEND_ROW * row as u32 + LEGEND_ROW / 2) as i32;
        for &(x, entry) in entries {
            let x = x as i32;
            let style = entry.colour.stroke_width(entry.width);
            let sample = if entry.dashed {
                vec![[(x, y), (x + 9, y)], [(x + 15, y), (x + 24, y)]]
            } else {
                vec![[(x, y), (x + 24, y)]]
            };
            for segment in sample {
                area.draw(&PathElement::new(segment, style))
                    .map_err(draw_failed)?;
            }
            area.draw(&Text::new(
                entry.label.clone(),
                (x + LEGEND_SAMPLE as i32, y - 7),
                font.color(&BLACK),
            ))
            .map_err(draw_failed)?;
        }
    }
    Ok(())
}

/// Every legend entry: the nodes (one entry when there are many), the total, then each
/// limit line with its exact height, noting those too high to draw.
fn legend_entries(result: &ScenarioResult) -> Vec<LegendEntry> {
    let nodes = result.series.per_node.len();
    let mut entries: Vec<LegendEntry> = if nodes > LEGEND_NODES {
        vec![LegendEntry {
            label: format!("nodes 0–{} (one line each)", nodes - 1),
            colour: node_colour(0),
            width: 2,
            dashed: false,
            own_row: false,
        }]
    } else {
        (0..nodes)
            .map(|node| LegendEntry {
                label: format!("node {node}"),
                colour: node_colour(node),
                width: 2,
                dashed: false,
                own_row: false,
            })
            .collect()
    };
    entries.push(LegendEntry {
        label: "all nodes".to_owned(),
        colour: BLACK,
        width: 3,
        dashed: false,
        own_row: false,
    });
    let global = result.series.global();
    for (i, line) in result.limit_lines.iter().enumerate() {
        let value = line.per_bucket.to_f64();
        let off_scale = if on_scale(result, &global, value) {
            ""
        } else {
            " (off scale, not drawn)"
        };
        entries.push(LegendEntry {
            label: format!("{}: {value:.2}{off_scale}", line.label),
            colour: limit_colour(i),
            width: 2,
            dashed: line.kind == LineKind::Ceiling,
            own_row: true,
        });
    }
    entries
}

/// Lays the legend out: node and total entries flow along rows, each limit line gets a
/// row of its own (their labels are long). Returns each row's entries with their x.
fn legend_rows(entries: &[LegendEntry]) -> Vec<Vec<(u32, &LegendEntry)>> {
    let mut rows: Vec<Vec<(u32, &LegendEntry)>> = vec![];
    let mut x = LEGEND_LEFT;
    for entry in entries {
        // Roughly the naive font metrics plotters uses for SVG: 6 px per character at 13 px.
        let width = LEGEND_SAMPLE + entry.label.chars().count() as u32 * 6 + 24;
        if rows.is_empty() || entry.own_row || x + width > WIDTH {
            rows.push(vec![]);
            x = LEGEND_LEFT;
        }
        if let Some(row) = rows.last_mut() {
            row.push((x, entry));
        }
        x += width;
    }
    rows
}

/// The height the plot must reach: the data, every sustained line, and every ceiling
/// that is on scale.
fn y_range(result: &ScenarioResult, global: &[u64]) -> f64 {
    result
        .limit_lines
        .iter()
        .map(|l| l.per_bucket.to_f64())
        .filter(|&v| on_scale(result, global, v))
        .fold(base_height(result, global), f64::max)
}

/// The larger of the data's peak and the highest sustained line, at least 1.
fn base_height(result: &ScenarioResult, global: &[u64]) -> f64 {
    let data = global.iter().copied().max().unwrap_or(0) as f64;
    result
        .limit_lines
        .iter()
        .filter(|l| l.kind == LineKind::Sustained)
        .map(|l| l.per_bucket.to_f64())
        .fold(data.max(1.0), f64::max)
}

/// `false` for a line so high that drawing it would flatten the data into the axis.
fn on_scale(result: &ScenarioResult, global: &[u64], value: f64) -> bool {
    value <= base_height(result, global) * OFF_SCALE
}

fn node_colour(node: usize) -> RGBColor {
    NODE_COLOURS[node % NODE_COLOURS.len()]
}

/// Sustained and ceiling lines of one limit come in pairs and share a colour.
fn limit_colour(line: usize) -> RGBColor {
    LIMIT_COLOURS[(line / 2) % LIMIT_COLOURS.len()]
}

fn draw_failed(e: impl std::error::Error) -> ChartError {
    ChartError::Draw(e.to_string())
}

/// The scenario name as a file name: no separators, no surprises for a shell.
fn file_stem(name: &str) -> String {
    let stem: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if stem.is_empty() || stem.starts_with('.') {
        format!("scenario{stem}")
    } else {
        stem
    }
}

/// Pixels: wide enough for a few hundred buckets to stay distinct.
const WIDTH: u32 = 1200;
/// The plot's height; the legend band below grows with its rows.
const PLOT_HEIGHT: u32 = 560;
/// One legend row, and the margin above and below the rows.
const LEGEND_ROW: u32 = 20;
const LEGEND_PADDING: u32 = 6;
/// Where legend entries start (under the y axis), and the room for a line sample.
const LEGEND_LEFT: u32 = 90;
const LEGEND_SAMPLE: u32 = 32;
/// A ceiling higher than this many times the data (or sustained line) is listed, not drawn.
const OFF_SCALE: f64 = 2.5;
/// The y axis runs this much above the highest line drawn.
const HEAD_ROOM: f64 = 1.25;
/// With more nodes than this, the legend names them as one entry.
const LEGEND_NODES: usize = 8;
/// Light red, translucent: shading must not hide the lines.
const FAULT_FILL: RGBAColor = RGBAColor(220, 40, 40, 0.13);
const FAULT_TEXT: RGBColor = RGBColor(150, 20, 20);
/// Node lines: Tableau 10 without its red, which belongs to the limits and the faults.
const NODE_COLOURS: [RGBColor; 9] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(118, 183, 178),
    RGBColor(89, 161, 79),
    RGBColor(237, 201, 72),
    RGBColor(176, 122, 161),
    RGBColor(255, 157, 167),
    RGBColor(156, 117, 95),
    RGBColor(186, 176, 172),
];
/// One colour per limit of the policy: dark and saturated, apart from the node colours.
const LIMIT_COLOURS: [RGBColor; 3] = [
    RGBColor(200, 0, 0),
    RGBColor(140, 0, 150),
    RGBColor(90, 90, 0),
];

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Micros, Policy, PolicyState, Timestamp};

    use super::*;
    use crate::oracle::{Admission, AdmissionLog, Interval};
    use crate::report::scenario::measured;
    use crate::report::{FaultSpan, ScenarioFacts};

    /// Three nodes share a bucket (capacity 20, 100 per second) through one state, but
    /// during a 2 s partition each falls back to a full local copy of the policy: the
    /// kind of fallback whose over-admission the chart must make visible.
    fn partitioned_run() -> ScenarioResult {
        let policy = Policy::single(Limit::token_bucket(20, 100, Micros::from_secs(1)).unwrap());
        let nodes = 3;
        let at = Timestamp::from_micros;
        let partition = Interval::new(at(2_000_000), at(4_000_000));
        let mut shared = policy.new_state();
        let mut local: Vec<PolicyState> = (0..nodes).map(|_| policy.new_state()).collect();
        let mut exact = policy.new_state();
        let (mut log, mut demanded, mut exact_admitted) = (AdmissionLog::new(), 0, 0);
        // Together the nodes ask for 1 every 2 ms, in turn: 5× the refill.
        for ms in (0..6_000u64).step_by(2) {
            let node = (ms % 6 / 2) as usize;
            let now = at(ms * 1_000);
            demanded += 1;
            if policy.acquire(now, &mut exact, 1).unwrap().is_allowed() {
                exact_admitted += 1;
            }
            let state = if partition.contains(now) {
                &mut local[node]
            } else {
                &mut shared
            };
            if policy.acquire(now, state, 1).unwrap().is_allowed() {
                log.record(Admission {
                    at: now,
                    node,
                    key: 1,
                    cost: 1,
                });
            }
        }
        let facts = ScenarioFacts {
            name: "partition-fallback".to_owned(),
            seed: 7,
            nodes,
            faults: "partition: every node from Redis at 2–4 s, local fallback".to_owned(),
            fault_spans: vec![FaultSpan {
                during: partition,
                label: "partition: nodes | redis".to_owned(),
            }],
            run: Interval::new(at(0), at(6_000_000)),
            demanded,
            exact_admitted,
            extra_allowance: 0,
            fallback: vec![partition.length(); nodes],
        };
        measured(
            facts,
            &policy,
            &log,
            1,
            (0..100)
                .map(|i| Micros::from_micros(200 + i * 10))
                .collect(),
        )
    }

    #[test]
    fn a_chart_is_an_svg_titled_with_the_scenario_and_its_verdict() {
        let result = partitioned_run();
        assert!(!result.is_within_bound(), "the fallback over-admits");
        // SIM_CHART_DIR keeps the chart for a look (rsvg-convert it to PNG).
        let keep = std::env::var_os("SIM_CHART_DIR");
        let out_dir = keep.clone().map_or_else(
            || std::env::temp_dir().join(format!("sim-report-chart-{}", std::process::id())),
            PathBuf::from,
        );
        let path = write_chart(&result, &out_dir).unwrap();
        assert_eq!(path, out_dir.join("partition-fallback.svg"));
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.trim_start().starts_with("<svg"),
            "{}",
            &svg[..80.min(svg.len())]
        );
        assert!(svg.trim_end().ends_with("</svg>"));
        let title = format!(
            "partition-fallback: over-admission {} % (OVER the bound)",
            format_percent(result.over_admission())
        );
        assert!(svg.contains(&title), "no title {title:?}");
        assert!(svg.contains("partition: nodes | redis"));
        assert!(svg.contains("simulated time since start (s)"));
        if keep.is_none() {
            std::fs::remove_dir_all(&out_dir).unwrap();
        }
    }

    #[test]
    fn many_nodes_share_one_legend_entry_and_a_far_ceiling_is_listed_not_drawn() {
        // 20 nodes through one shared state (an exact limiter), 2000 requests per second
        // against 200 per second and 600 per 10 s: the log's ceiling of 600 per bucket
        // would flatten the chart.
        let policy = Policy::new([
            Limit::token_bucket(50, 200, Micros::from_secs(1)).unwrap(),
            Limit::sliding_log(600, Micros::from_secs(10)).unwrap(),
        ])
        .unwrap();
        let at = |ms: u64| Timestamp::from_micros(ms * 1_000);
        let mut state = policy.new_state();
        let mut log = AdmissionLog::new();
        for ms in (0..12_000u64).step_by(10) {
            for node in 0..20 {
                if policy.acquire(at(ms), &mut state, 1).unwrap().is_allowed() {
                    log.record(Admission {
                        at: at(ms),
                        node,
                        key: 3,
                        cost: 1,
                    });
                }
            }
        }
        let fault = |from, to, label: &str| FaultSpan {
            during: Interval::new(at(from), at(to)),
            label: label.to_owned(),
        };
        let facts = ScenarioFacts {
            name: "twenty-nodes".to_owned(),
            seed: 11,
            nodes: 20,
            faults: "redis stall 5–5.5 s; node 3 clock +200 ms 5.2–7 s".to_owned(),
            fault_spans: vec![
                fault(5_000, 5_500, "redis stall"),
                fault(5_200, 7_000, "node 3 clock +200 ms"),
            ],
            run: Interval::new(at(0), at(12_000)),
            demanded: 24_000,
            exact_admitted: log.admitted(),
            extra_allowance: 0,
            fallback: vec![Micros::ZERO; 20],
        };
        let result = measured(facts, &policy, &log, 3, vec![Micros::from_micros(300)]);
        assert!(result.is_within_bound());
        let keep = std::env::var_os("SIM_CHART_DIR").map(PathBuf::from);
        if let Some(dir) = &keep {
            write_chart(&result, dir).unwrap();
        }
        let svg = render_chart(&result).unwrap();
        assert!(svg.contains("twenty-nodes: over-admission 0.00 % (within bound)"));
        assert!(svg.contains("nodes 0–19 (one line each)"));
        assert!(!svg.contains("node 7\n"), "one legend entry for all nodes");
        assert!(
            svg.contains("ceiling per 100 ms (limit in any window): 600.00 (off scale, not drawn)")
        );
        assert!(svg.contains("ceiling per 100 ms (capacity + refill): 70.00\n"));
    }

    #[test]
    fn an_empty_scenario_still_charts() {
        let policy = Policy::single(Limit::fixed_window(10, Micros::from_secs(1)).unwrap());
        let log = AdmissionLog::new();
        let facts = ScenarioFacts {
            name: "nothing/at all".to_owned(),
            seed: 0,
            nodes: 0,
            faults: "none".to_owned(),
            fault_spans: vec![],
            run: Interval::new(Timestamp::EPOCH, Timestamp::EPOCH),
            demanded: 0,
            exact_admitted: 0,
            extra_allowance: 0,
            fallback: vec![],
        };
        let result = measured(facts, &policy, &log, 0, vec![]);
        let svg = render_chart(&result).unwrap();
        assert!(svg.contains("nothing/at all: over-admission 0.00 % (within bound)"));
        assert_eq!(file_stem(&result.facts.name), "nothing_at_all");
        assert_eq!(file_stem(".."), "scenario..");
    }
}
