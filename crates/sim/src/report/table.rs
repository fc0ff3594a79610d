//! Scenario results as tables: aligned plain text for a terminal, and Markdown for docs.
//!
//! Both renderers share one list of columns, so a number reads the same in either. The
//! plain-text table keeps only numbers in its rows, to stay narrow enough for a terminal;
//! the policy, the faults and where the worst window fell follow as one line each below.
//! The Markdown table can be wide (it wraps when rendered), so it carries the policy and
//! faults as columns and the worst windows as a list.

use std::fmt::Write;

use rein_core::Timestamp;

use super::describe::{describe_limit, format_amount, format_percent};
use super::scenario::ScenarioResult;

/// The results as an aligned plain-text table, one row per scenario, followed by one
/// `name: policy …; faults …; worst …` line per scenario. Empty input gives the header.
pub fn render_text(results: &[ScenarioResult]) -> String {
    let rows: Vec<Vec<String>> = results.iter().map(numeric_cells).collect();
    let widths: Vec<usize> = NUMERIC_COLUMNS
        .iter()
        .enumerate()
        .map(|(i, column)| {
            rows.iter()
                .map(|row| row[i].chars().count())
                .chain([column.heading.chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let headings: Vec<String> = NUMERIC_COLUMNS
        .iter()
        .map(|c| c.heading.to_owned())
        .collect();
    for row in std::iter::once(&headings).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(NUMERIC_COLUMNS)
            .zip(&widths)
            .map(|((cell, column), &width)| pad(cell, width, column.align))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    push_lines(&mut out, results, |result| {
        format!(
            "{}: policy {}; faults {}; {}",
            result.facts.name,
            result.policy,
            result.facts.faults,
            worst_in_words(result)
        )
    });
    out
}

/// The results as a GitHub-flavoured Markdown table (numbers right-aligned), with the
/// policy and faults as columns, then a list of where each worst window fell.
pub fn render_markdown(results: &[ScenarioResult]) -> String {
    let mut out = String::new();
    let headings: Vec<&str> = NUMERIC_COLUMNS
        .iter()
        .map(|c| c.heading)
        .chain(["policy", "faults"])
        .collect();
    let rule: Vec<&str> = NUMERIC_COLUMNS
        .iter()
        .map(|c| match c.align {
            Align::Left => ":---",
            Align::Right => "---:",
        })
        .chain([":---", ":---"])
        .collect();
    let _ = writeln!(out, "| {} |", headings.join(" | "));
    let _ = writeln!(out, "|{}|", rule.join("|"));
    for result in results {
        let cells: Vec<String> = numeric_cells(result)
            .into_iter()
            .chain([result.policy.clone(), result.facts.faults.clone()])
            .map(|cell| escape_markdown(&cell))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    push_lines(&mut out, results, |result| {
        format!(
            "- **{}**: {}",
            escape_markdown(&result.facts.name),
            escape_markdown(&worst_in_words(result))
        )
    });
    out
}

/// Appends `line` of each result below the table, after a blank line (nothing for no
/// results).
fn push_lines(
    out: &mut String,
    results: &[ScenarioResult],
    line: impl Fn(&ScenarioResult) -> String,
) {
    if !results.is_empty() {
        out.push('\n');
    }
    for result in results {
        let _ = writeln!(out, "{}", line(result));
    }
}

/// One column of the numeric table.
struct Column {
    heading: &'static str,
    align: Align,
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// The row of numbers for one scenario, in [`NUMERIC_COLUMNS`] order.
fn numeric_cells(result: &ScenarioResult) -> Vec<String> {
    let micros =
        |m: Option<rein_core::Micros>| m.map_or("-".to_owned(), |m| m.as_micros().to_string());
    let worst = result.worst().map_or("-".to_owned(), |(_, w)| {
        format!("{}/{}", w.admitted, format_amount(w.bound))
    });
    vec![
        result.facts.name.clone(),
        result.facts.seed.to_string(),
        result.facts.nodes.to_string(),
        result.facts.demanded.to_string(),
        result.admitted.to_string(),
        result.facts.exact_admitted.to_string(),
        format_percent(result.under_admission()),
        worst,
        format_percent(result.over_admission()),
        format_percent(result.fallback_share()),
        micros(result.latencies.p50()),
        micros(result.latencies.p99()),
    ]
}

/// Where the worst window fell and what it held, e.g. `worst: key 1, token bucket of 10,
/// refill 1 per 100 ms: 14 in [2.000 s, 2.300 s] against a bound of 12.99`.
fn worst_in_words(result: &ScenarioResult) -> String {
    let Some((verdict, window)) = result.worst() else {
        return "nothing admitted".to_owned();
    };
    let seconds = |t: Timestamp| {
        let us = t.as_micros().saturating_sub(result.start().as_micros());
        format!("{}.{:03} s", us / 1_000_000, us % 1_000_000 / 1_000)
    };
    let held = if window.is_within_bound() {
        "within"
    } else {
        "OVER"
    };
    let mut words = format!(
        "worst: key {}, {}: {} in [{}, {}] against a bound of {} ({held})",
        verdict.key,
        describe_limit(&verdict.limit),
        window.admitted,
        seconds(window.span.first),
        seconds(window.span.last),
        format_amount(window.bound),
    );
    if let Some(exact) = verdict.against_exact_log {
        let _ = write!(
            words,
            "; {} % over an exact sliding log",
            format_percent(exact.over_admission())
        );
    }
    words
}

fn pad(cell: &str, width: usize, align: Align) -> String {
    match align {
        Align::Left => format!("{cell:<width$}"),
        Align::Right => format!("{cell:>width$}"),
    }
}

/// Keeps a cell inside its Markdown column.
fn escape_markdown(cell: &str) -> String {
    cell.replace('|', "\\|").replace('\n', " ")
}

/// The numeric table's columns: the scenario's name, then numbers, right-aligned. `exact`
/// is what an exact limiter would have admitted; `worst window` is admitted/bound in the
/// window with the largest relative excess; the percentages are exact, rounded down, with
/// `<0.01` for tiny positives.
#[rustfmt::skip]
const NUMERIC_COLUMNS: [Column; 12] = [
    Column { heading: "scenario", align: Align::Left },
    number("seed"), number("nodes"), number("demanded"), number("admitted"), number("exact"),
    number("under %"), number("worst window"), number("over %"), number("fallback %"),
    number("p50 µs"), number("p99 µs"),
];

/// A column of numbers: right-aligned.
const fn number(heading: &'static str) -> Column {
    Column {
        heading,
        align: Align::Right,
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Micros, Policy};

    use super::*;
    use crate::oracle::{Admission, AdmissionLog, Interval};
    use crate::report::scenario::measured;
    use crate::report::{FaultSpan, ScenarioFacts};

    fn result(name: &str, costs: &[(u64, u64)]) -> ScenarioResult {
        let policy = Policy::single(Limit::sliding_log(5, Micros::from_secs(1)).unwrap());
        let log: AdmissionLog = costs
            .iter()
            .map(|&(ms, cost)| Admission {
                at: Timestamp::from_micros(ms * 1_000),
                node: 0,
                key: 1,
                cost,
            })
            .collect();
        let run = Interval::new(Timestamp::EPOCH, Timestamp::from_micros(2_000_000));
        let facts = ScenarioFacts {
            name: name.to_owned(),
            seed: 42,
            nodes: 2,
            faults: "partition | node 1".to_owned(),
            fault_spans: vec![FaultSpan {
                during: Interval::new(
                    Timestamp::from_micros(500_000),
                    Timestamp::from_micros(1_000_000),
                ),
                label: "partition".to_owned(),
            }],
            run,
            demanded: 20,
            exact_admitted: 8,
            extra_allowance: 0,
            fallback: vec![Micros::from_millis(500), Micros::ZERO],
        };
        measured(
            facts,
            &policy,
            &log,
            1,
            vec![Micros::from_micros(250), Micros::from_micros(1_900)],
        )
    }

    #[test]
    fn the_text_table_is_aligned_and_says_where_the_worst_window_fell() {
        let over = result("over-admits", &[(0, 3), (500, 3), (1_200, 2)]);
        let quiet = result("quiet", &[]);
        let text = render_text(&[over, quiet]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("scenario     seed  nodes  demanded"),
            "{text}"
        );
        // Right-aligned columns end together.
        let end = |line: &str| line.chars().count();
        assert_eq!(end(lines[0]), end(lines[1]));
        assert_eq!(end(lines[1]), end(lines[2]));
        assert!(
            lines[1].contains("  6/5  ") && lines[1].contains("  20.00  "),
            "{text}"
        );
        // 8 admitted, as an exact limiter would; 0.5 s of 2 nodes × 2 s on fallback.
        assert!(
            lines[1].contains("  0.00  ") && lines[1].contains("  12.50  "),
            "{text}"
        );
        assert!(lines[1].ends_with(" 250    1900"), "{text}");
        assert!(
            lines[2].contains("100.00") && lines[2].contains(" - "),
            "{text}"
        );
        assert!(
            text.contains(
                "over-admits: policy sliding log of 5 per 1 s; faults partition | node 1; worst: \
             key 1, sliding log of 5 per 1 s: 6 in [0.000 s, 0.500 s] against a bound of 5 (OVER)"
            ),
            "{text}"
        );
        assert!(text.contains(
            "quiet: policy sliding log of 5 per 1 s; faults partition | node 1; nothing admitted"
        ));
        assert_eq!(render_text(&[]).lines().count(), 1);
    }

    #[test]
    fn the_markdown_table_escapes_pipes_and_aligns_numbers_right() {
        let markdown = render_markdown(&[result("over-admits", &[(0, 3), (500, 3)])]);
        let lines: Vec<&str> = markdown.lines().collect();
        assert!(
            lines[0].starts_with("| scenario | seed | nodes |")
                && lines[0].ends_with("| policy | faults |")
        );
        assert!(lines[1].starts_with("|:---|---:|---:|"));
        assert!(
            lines[2].ends_with("| sliding log of 5 per 1 s | partition \\| node 1 |"),
            "{markdown}"
        );
        assert_eq!(
            lines[0].matches(" | ").count(),
            lines[2].matches(" | ").count()
        );
        assert!(
            lines[4].starts_with("- **over-admits**: worst: key 1"),
            "{markdown}"
        );
    }
}
