//! The tables printed and the charts written.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::*;

pub(crate) fn print_tables(memory: &[MemoryRow], redis: &[RedisRow], over: &[OverRow]) {
    println!();
    println!("In process: 2 threads, {MEMORY_KEYS} keys; latency one thread, per call");
    println!();
    println!(
        "| peer | decisions/s | vs rein, per round: median (spread) | CPU ns/decision | vs rein | \
         p50 ns | p99 ns | heap bytes/key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in memory {
        println!(
            "| {} | {:.0} | {} | {:.0} | {:.2} | {:.0} | {:.0} | {:.1} |",
            r.name,
            r.decisions_per_sec,
            r.vs_rein,
            r.cpu_ns,
            r.cpu_vs_rein,
            r.p50_ns,
            r.p99_ns,
            r.bytes_per_key
        );
    }
    println!();
    println!(
        "Through Redis: 1 instance, {REDIS_TASKS} tasks, {REDIS_KEYS} keys; latency 1 task; \
         memory after {MEMORY_REDIS_KEYS} keys"
    );
    println!();
    println!(
        "| peer | decisions/s | vs rein store, per round: median (spread) | no decision | client CPU µs/dec | server CPU \
         µs/dec | p50 µs | p99 µs | Redis keys/key | used_memory B/key | MEMORY USAGE B/Redis key |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in redis {
        println!(
            "| {} | {:.0} | {} | {:.1} % | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} |",
            r.kind.label(),
            r.decisions_per_sec,
            r.vs_rein,
            r.no_decision_share * 100.0,
            r.client_cpu_us,
            r.server_cpu_us,
            r.p50_us,
            r.p99_us,
            r.redis_keys_per_key,
            r.used_memory_per_key,
            r.memory_usage_per_redis_key
        );
    }
    println!();
    println!(
        "Over-admission: one key, limit {TIGHT_LIMIT} per {TIGHT_PERIOD_SECS} s, {HOT_TASKS} \
         tasks per instance"
    );
    println!();
    println!("| peer | instances | attempts | admitted | allowed | over-admitted | no decision |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in over {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.kind.label(),
            r.instances,
            r.attempts,
            r.admitted,
            r.allowed,
            r.admitted.saturating_sub(r.allowed),
            r.no_decision
        );
    }
}

pub(crate) fn write_charts(
    dir: &std::path::Path,
    memory: &[MemoryRow],
    redis: &[RedisRow],
    over: &[OverRow],
) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut names: Vec<String> = memory
        .iter()
        .map(|r| format!("{} (in process)", r.name))
        .collect();
    names.extend(redis.iter().map(|r| r.kind.label().to_owned()));
    let rates: Vec<f64> = memory
        .iter()
        .map(|r| r.decisions_per_sec)
        .chain(redis.iter().map(|r| r.decisions_per_sec))
        .collect();
    let svg = bar_chart(
        "Head to head: decisions per second (log scale; same machine, same run)",
        "decisions per second (in process: 2 threads; Redis: 1 instance, 64 tasks)",
        &names,
        &[("decisions/s", PALETTE[0], rates)],
        true,
        None,
    )?;
    std::fs::write(dir.join("head-to-head-throughput.svg"), svg)?;

    let p50: Vec<f64> = memory
        .iter()
        .map(|r| r.p50_ns / 1e3)
        .chain(redis.iter().map(|r| r.p50_us))
        .collect();
    let p99: Vec<f64> = memory
        .iter()
        .map(|r| r.p99_ns / 1e3)
        .chain(redis.iter().map(|r| r.p99_us))
        .collect();
    let svg = bar_chart(
        "Head to head: latency of one decision, one caller (log scale)",
        "µs per decision",
        &names,
        &[("p50", PALETTE[0], p50), ("p99", PALETTE[1], p99)],
        true,
        None,
    )?;
    std::fs::write(dir.join("head-to-head-latency.svg"), svg)?;

    let kinds: Vec<RedisKind> = redis.iter().map(|r| r.kind).collect();
    let series: Vec<(&str, RGBColor, Vec<f64>)> = [1usize, 2, 4]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let label = match n {
                1 => "1 instance",
                2 => "2 instances",
                _ => "4 instances",
            };
            let values = kinds
                .iter()
                .map(|&k| {
                    over.iter()
                        .find(|r| r.kind == k && r.instances == n)
                        .map_or(0.0, |r| r.admitted as f64)
                })
                .collect();
            (label, PALETTE[i], values)
        })
        .collect();
    let names: Vec<String> = kinds.iter().map(|k| k.label().to_owned()).collect();
    let svg = bar_chart(
        &format!("Head to head: admitted on one key, limit {TIGHT_LIMIT} per hour (log scale)"),
        &format!(
            "requests admitted by all instances together ({HOT_TASKS} tasks each); dashed: \
             what the limit allows ({TIGHT_LIMIT})"
        ),
        &names,
        &series,
        true,
        Some(TIGHT_LIMIT as f64),
    )?;
    std::fs::write(dir.join("head-to-head-overadmission.svg"), svg)?;
    Ok(())
}

/// Horizontal grouped bars: one group per name (top to bottom), one bar per series, each
/// labelled with its value. `reference` draws a dashed vertical line (1.0 = the limit).
pub(crate) fn bar_chart(
    title: &str,
    x_desc: &str,
    names: &[String],
    series: &[(&str, RGBColor, Vec<f64>)],
    log: bool,
    reference: Option<f64>,
) -> Result<String, Box<dyn std::error::Error>> {
    let values = || series.iter().flat_map(|s| s.2.iter().copied());
    let max = values().fold(0.0f64, f64::max).max(1e-9);
    let min = values().filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
    let height = 140 + (names.len() * (18 + 18 * series.len())) as u32;
    let chart = BarChart {
        title,
        x_desc,
        names,
        series,
        reference,
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        if log {
            // At least a third of a decade below the smallest bar, so that every bar shows.
            let lo = 10f64.powf((min.min(max).log10() - 0.3).floor());
            let hi = 10f64.powf((max * 4.0).log10().ceil());
            chart.render(&root, (lo..hi).log_scale(), lo)?;
        } else {
            let hi = (max * 1.3).max(reference.unwrap_or(0.0) * 1.3);
            chart.render(&root, 0f64..hi, 0.0)?;
        }
        root.present()?;
    }
    Ok(svg)
}

pub(crate) struct BarChart<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_desc: &'a str,
    pub(crate) names: &'a [String],
    pub(crate) series: &'a [(&'a str, RGBColor, Vec<f64>)],
    pub(crate) reference: Option<f64>,
}

impl BarChart<'_> {
    /// Draws on `root` with `x` as the value axis; bars start at `floor`.
    fn render<X>(
        &self,
        root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
        x: X,
        floor: f64,
    ) -> Result<(), Box<dyn std::error::Error>>
    where
        X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
        X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    {
        let groups = self.names.len() as f64;
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, ("sans-serif", 22))
            .margin(16)
            .margin_right(60)
            .x_label_area_size(50)
            .y_label_area_size(210)
            .build_cartesian_2d(x, 0f64..groups)?;
        // The project's mesh style (crates/sim/src/report/chart.rs); names are drawn below.
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .axis_desc_style(("sans-serif", 15))
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(215, 215, 215))
            .disable_y_mesh()
            .x_label_formatter(&|v| format_value(*v))
            .y_label_formatter(&|_| String::new())
            .draw()?;
        let n = self.series.len() as f64;
        // Group i spans [groups - i - 1, groups - i); its bars fill the middle 80 %.
        let bar = |i: usize, j: usize| {
            let top = groups - i as f64 - 0.1 - 0.8 * j as f64 / n;
            (top - 0.8 / n + 0.03, top)
        };
        let font = ("sans-serif", 13).into_font();
        let value_style = font.color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
        for (j, (label, colour, values)) in self.series.iter().enumerate() {
            let colour = *colour;
            chart
                .draw_series(values.iter().enumerate().map(|(i, &v)| {
                    let (bottom, top) = bar(i, j);
                    Rectangle::new([(floor, bottom), (v.max(floor), top)], colour.filled())
                }))?
                .label(*label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 16, y + 5)], colour.filled())
                });
            chart.draw_series(values.iter().enumerate().map(|(i, &v)| {
                let (bottom, top) = bar(i, j);
                Text::new(
                    format!(" {}", format_value(v)),
                    (v.max(floor), (bottom + top) / 2.0),
                    value_style.clone(),
                )
            }))?;
        }
        if let Some(x) = self.reference {
            chart.draw_series(DashedLineSeries::new(
                [(x, 0.0), (x, groups)],
                6,
                4,
                RGBColor(200, 0, 0).stroke_width(2),
            ))?;
        }
        if self.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.9))
                .border_style(RGBColor(215, 215, 215))
                .label_font(("sans-serif", 13))
                .draw()?;
        }
        // Group names left of the axis, right-aligned at each group's centre.
        let name_style = font.color(&BLACK).pos(Pos::new(HPos::Right, VPos::Center));
        let (x0, _) = chart.plotting_area().get_pixel_range();
        for (i, name) in self.names.iter().enumerate() {
            let (_, y) = chart.backend_coord(&(floor, groups - i as f64 - 0.5));
            root.draw(&Text::new(
                name.as_str(),
                (x0.start - 8, y),
                name_style.clone(),
            ))?;
        }
        Ok(())
    }
}

/// 1234567 → "1.23 M", 0.0123 → "0.012": three significant digits at most.
pub(crate) fn format_value(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.3} M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

pub(crate) const WIDTH: u32 = 1200;
pub(crate) const PALETTE: [RGBColor; 3] = [
    RGBColor(78, 121, 167),
    RGBColor(242, 142, 43),
    RGBColor(118, 183, 178),
];
