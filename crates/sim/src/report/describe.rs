//! How limits, durations and shares are written for people: one wording shared by the
//! tables and the charts, exact where the number is exact.

use rein_core::{Algorithm, Limit, Micros, Policy};

use crate::oracle::Fraction;

/// A limit in words, e.g. `token bucket of 10, refill 1 per 100 ms` or `sliding log of 100
/// per 1 min`.
///
/// A token bucket's refill is shown reduced (10 per second reads `1 per 100 ms`): rein-core
/// keeps only the reduced emission interval, and the two describe the same bucket.
pub fn describe_limit(limit: &Limit) -> String {
    match limit {
        Limit::TokenBucket(bucket) => {
            let (per_token, per_micro) = bucket.emission_interval();
            format!(
                "token bucket of {}, refill {} per {}",
                bucket.capacity(),
                per_micro,
                format_duration(Micros::from_micros(per_token))
            )
        }
        Limit::FixedWindow(l) => format!(
            "fixed window of {} per {}",
            l.limit(),
            format_duration(l.window())
        ),
        Limit::SlidingLog(l) => format!(
            "sliding log of {} per {}",
            l.limit(),
            format_duration(l.window())
        ),
        Limit::SlidingCounter(l) => format!(
            "sliding counter of {} per {}",
            l.limit(),
            format_duration(l.window())
        ),
    }
}

/// Every limit of a policy in words, joined by ` + ` (all must admit).
pub fn describe_policy(policy: &Policy) -> String {
    let limits: Vec<String> = policy.limits().iter().map(describe_limit).collect();
    limits.join(" + ")
}

/// A duration in the largest unit that writes it as a whole number: `1 min`, `1500 ms`,
/// `7 µs`.
pub fn format_duration(duration: Micros) -> String {
    let us = duration.as_micros();
    match us {
        0 => "0 µs".to_owned(),
        _ if us.is_multiple_of(60_000_000) => format!("{} min", us / 60_000_000),
        _ if us.is_multiple_of(1_000_000) => format!("{} s", us / 1_000_000),
        _ if us.is_multiple_of(1_000) => format!("{} ms", us / 1_000),
        _ => format!("{us} µs"),
    }
}

/// A share as a percentage with two decimals, rounded down, computed exactly: `12.50`.
/// A positive share below 0.01 % prints `<0.01` rather than a misleading `0.00`.
pub fn format_percent(share: Fraction) -> String {
    // Hundredths of a percent, i.e. share × 10 000, rounded towards −∞.
    let hundredths =
        Fraction::new(share.numerator() * 10_000, share.denominator()).map_or(0, |f| f.floor());
    if hundredths == 0 && share.is_positive() {
        return "<0.01".to_owned();
    }
    let sign = if hundredths < 0 { "-" } else { "" };
    let hundredths = hundredths.unsigned_abs();
    format!("{sign}{}.{:02}", hundredths / 100, hundredths % 100)
}

/// A fraction for a table cell: whole numbers as they are, others with two decimals
/// (display only; the verdict compares exact fractions).
pub(crate) fn format_amount(amount: Fraction) -> String {
    if amount.denominator() == 1 {
        amount.numerator().to_string()
    } else {
        format!("{:.2}", amount.to_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_english() {
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap();
        assert_eq!(
            describe_limit(&bucket),
            "token bucket of 10, refill 1 per 100 ms"
        );
        let thirds = Limit::token_bucket(3, 3, Micros::from_secs(1)).unwrap();
        assert_eq!(
            describe_limit(&thirds),
            "token bucket of 3, refill 3 per 1 s"
        );
        let policy = Policy::new([
            Limit::sliding_log(100, Micros::from_secs(60)).unwrap(),
            Limit::fixed_window(5, Micros::from_millis(1_500)).unwrap(),
        ])
        .unwrap();
        assert_eq!(
            describe_policy(&policy),
            "sliding log of 100 per 1 min + fixed window of 5 per 1500 ms"
        );
    }

    #[test]
    fn percentages_round_down_but_never_hide_an_excess() {
        let percent = |n, d| format_percent(Fraction::new(n, d).unwrap());
        assert_eq!(percent(1, 8), "12.50");
        assert_eq!(percent(2, 3), "66.66");
        assert_eq!(percent(0, 1), "0.00");
        assert_eq!(percent(1, 1_000_000), "<0.01");
        assert_eq!(percent(3, 1), "300.00");
        assert_eq!(percent(-1, 4), "-25.00");
        assert_eq!(format_duration(Micros::from_micros(7)), "7 µs");
    }
}
