//! Turning a scenario's measurements into something to read: a result per scenario, a
//! table of results (plain text or Markdown) and one SVG chart per scenario.
//!
//! Pure data in, text or SVG out: nothing here runs a simulation or reads a clock, so each
//! piece is tested on hand-made inputs. The numbers that are verdicts (over-admission,
//! under-admission, the fallback share) are exact [`Fraction`](crate::oracle::Fraction)s
//! and percentiles are nearest-rank on integers; floats appear only where a chart places a
//! point and where a bound that is not whole is printed with two decimals.
//!
//! # For a scenario author
//! Fill a [`ScenarioInputs`] (the run's [`ScenarioFacts`]: its faults, the demand, what an
//! exact limiter would have admitted, per-node fallback time; then the admission log and the
//! latency samples), call
//! [`ScenarioResult::measure`], assert [`ScenarioResult::is_within_bound`] (or the
//! documented over-admission), then [`render_text`] / [`render_markdown`] the results and
//! [`write_chart`] each one.

mod chart;
mod describe;
mod leases;
mod regions;
mod scenario;
mod series;
mod table;

pub use chart::{ChartError, render_chart, write_chart};
pub use describe::{describe_limit, describe_policy, format_duration, format_percent};
pub use leases::{LeaseRow, render_lease_chart, render_lease_table, write_lease_chart};
pub use regions::{RegionRow, render_region_chart, write_region_chart};
pub use scenario::{
    CHART_BUCKET, FaultSpan, LatencySamples, ScenarioFacts, ScenarioInputs, ScenarioResult,
};
pub use series::{AdmissionSeries, LimitLine, LineKind};
pub use table::{render_markdown, render_text};
