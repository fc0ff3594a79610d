//! The response headers of a decision, rendered as text: `Retry-After` (RFC 9110) and the
//! `RateLimit-Policy` / `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers
//! (versions -09 to -11), in the structured-field syntax of RFC 9651.
//!
//! Pure functions of a policy, the index of the limit that decided, and a [`Decision`]: no
//! I/O and no clock, so a property test pins them (`tests/headers.rs`).
//!
//! # What the fields say
//! - `RateLimit-Policy: "api";q=100;w=60`: one item per limit of the policy. `q` is the
//!   limit's capacity in cost units; `w` its window in seconds. A token bucket has no
//!   window: its `w` is the time it takes to refill from empty to full
//!   (`capacity × emission_interval`), so `q / w` is its sustained rate (a bucket of 10
//!   refilling 1 per second says `q=10;w=10`, whatever `period` the config gave).
//! - `RateLimit: "api";r=0;t=30`: the limit that decided (the one with the fewest units
//!   left). `r` is what remains of it after this request; `t` is a number of seconds whose
//!   meaning depends on the outcome ([`reset_secs`]):
//!   - **on a denial**, `t` is `Retry-After`: the seconds until the same request would be
//!     admitted. Both name the same instant, as draft -09 asks of a response that sends
//!     both, and `Retry-After` is never earlier than `t`, as -10 and -11 ask.
//!   - **on an admission**, `t` is the seconds until the named limit is full again if
//!     nothing else is admitted (the "quota reset" of draft -09). For one limit that is its
//!     own reset; in a multi-limit policy the decision carries only the policy's longest
//!     reset, so `t` is that, bounded by the named limit's longest possible reset: never
//!     earlier than the named limit's own. It is at most `w`, except for a sliding
//!     counter, whose previous window's count takes one more window to decay (at most
//!     `2w`).
//!
//!   Drafts -10 and -11 read `t` as "until more quota is available"; on an admission rein's
//!   `t` is the later instant when all of it is, so a client pacing itself on `t` waits
//!   longer than it must, never less.
//! - `Retry-After: 7`: on a denial, the seconds until the same request would be admitted.
//!
//! A single-limit policy's item is named after the policy (`"api"`); the limits of a
//! multi-limit policy are named `"api.0"`, `"api.1"`, ... in the policy's order, so a client
//! can tell which one spoke. On a denial the named limit is one that denied; when several
//! did, `t` (like `Retry-After`) is the longest of their waits, which may exceed the named
//! limit's `w`.
//!
//! # Rounding
//! Every time is rounded **up** to whole seconds: a client that waits `Retry-After` or `t`
//! seconds never arrives early. Zero stays zero, but for a failure policy's denial
//! ([`Decision::is_blind`]), told to wait a second at least. Numbers beyond the structured-field integer
//! range (15 digits) are clamped to its maximum; no rein quantity comes close in practice
//! (the largest is 2^52 µs, about 4.5 × 10^9 s).

use std::fmt::Write as _;

use http::header::HeaderName;
use rein_core::{Algorithm, Decision, Limit, Micros, NamedPolicy, Policy};

/// The `RateLimit-Policy` header (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The `RateLimit` header (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The limit of `policy` that decided `decision`: the one to name in `RateLimit`.
///
/// It is [`Decision::limit_index`]: the limit whose `limit` and `remaining` the decision
/// reports (the fewest remaining, among the deniers on a denial, the first on a tie). An
/// index past the policy's limits
/// (a decision from another policy) is read as the last limit.
pub fn deciding_limit(policy: &Policy, decision: &Decision) -> usize {
    usize::from(decision.limit_index).min(policy.limits().len().saturating_sub(1))
}

/// The three header values of one decision, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedHeaders {
    /// The `RateLimit-Policy` value: every limit of the policy.
    pub policy: String,
    /// The `RateLimit` value: the deciding limit's remaining units and reset time; `None`
    /// for a failure policy's answer ([`Decision::is_blind`]), which knows neither.
    pub rate_limit: Option<String>,
    /// The `Retry-After` value in whole seconds, for a denial; `None` when admitted.
    pub retry_after: Option<u64>,
}

/// Renders all three headers for `decision`, made under `policy`, whose limit number
/// `deciding` decided (see [`deciding_limit`]). An index past the policy's limits is read as
/// the last limit.
///
/// ```
/// use rein::core::{Decision, Limit, Micros, NamedPolicy, Outcome, Policy};
/// use rein_tower::headers::render;
///
/// let policy = NamedPolicy::new(
///     "per-user",
///     Policy::single(Limit::fixed_window(100, Micros::from_secs(60))?),
/// )?;
/// let denied = Decision {
///     outcome: Outcome::Denied,
///     limit: 100,
///     remaining: 0,
///     retry_after: Micros::from_millis(29_001),
///     reset_after: Micros::from_millis(29_001),
///     limit_index: 0,
/// };
/// let headers = render(&policy, 0, &denied);
/// assert_eq!(headers.policy, r#""per-user";q=100;w=60"#);
/// assert_eq!(headers.rate_limit.as_deref(), Some(r#""per-user";r=0;t=30"#));
/// assert_eq!(headers.retry_after, Some(30));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn render(policy: &NamedPolicy, deciding: usize, decision: &Decision) -> RenderedHeaders {
    RenderedHeaders {
        policy: render_policy(policy),
        rate_limit: render_rate_limit(policy, deciding, decision),
        retry_after: (!decision.is_allowed()).then(|| retry_after_secs(decision)),
    }
}

/// The `RateLimit-Policy` value of `policy`: one item per limit. It depends only on the
/// policy, so the layer renders it once.
pub fn render_policy(policy: &NamedPolicy) -> String {
    let limits = policy.policy().limits();
    let mut out = String::new();
    for (index, limit) in limits.iter().enumerate() {
        if index > 0 {
            out.push_str(", ");
        }
        push_item_name(&mut out, policy.name(), limits.len(), index);
        // Writing to a `String` cannot fail.
        let _ = write!(
            out,
            ";q={};w={}",
            sf_integer(limit.capacity()),
            sf_integer(window_secs(limit))
        );
    }
    out
}

/// The `RateLimit` value of `decision`: the deciding limit's item with `r` (remaining) and
/// `t` ([`reset_secs`]). `None` for a failure policy's answer ([`Decision::is_blind`]): it
/// knows nothing of the limit, and `r=0;t=0` ("nothing left, full now") on every response
/// while Redis is away would send clients straight back.
pub fn render_rate_limit(
    policy: &NamedPolicy,
    deciding: usize,
    decision: &Decision,
) -> Option<String> {
    if decision.is_blind() {
        return None;
    }
    let count = policy.policy().limits().len();
    let deciding = deciding.min(count.saturating_sub(1));
    let mut out = String::new();
    push_item_name(&mut out, policy.name(), count, deciding);
    // Writing to a `String` cannot fail.
    let _ = write!(
        out,
        ";r={};t={}",
        sf_integer(decision.remaining),
        sf_integer(reset_secs(policy.policy(), deciding, decision))
    );
    Some(out)
}

/// `RateLimit`'s `t` for `decision`, made under `policy`, whose limit number `deciding` it
/// names (an index past the policy's limits is read as the last limit):
/// - a denial: [`retry_after_secs`], the same instant as `Retry-After`;
/// - an admission: `reset_after` rounded up, at most [`longest_reset_secs`] of the named
///   limit. For a single limit the bound never bites when time moves forward (its reset is
///   at most that long); in a multi-limit policy `reset_after` is the longest reset among
///   all limits, and the bound keeps `t` about the limit the item names.
///
/// ```
/// use rein::core::{Limit, Micros, Policy, Timestamp};
/// use rein_tower::headers::{reset_secs, retry_after_secs};
///
/// // A sliding log of 7 per 3 s: 1 admitted at 0 s, 6 at 2.2 s.
/// let policy = Policy::single(Limit::sliding_log(7, Micros::from_secs(3))?);
/// let mut state = policy.new_state();
/// policy.acquire(Timestamp::from_micros(0), &mut state, 1)?;
/// policy.acquire(Timestamp::from_micros(2_200_000), &mut state, 6)?;
/// let denied = policy.acquire(Timestamp::from_micros(2_200_000), &mut state, 1)?;
/// // The first entry leaves the window at 3 s: admitted 0.8 s later, so both say 1 s.
/// assert_eq!(retry_after_secs(&denied), 1);
/// assert_eq!(reset_secs(&policy, 0, &denied), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn reset_secs(policy: &Policy, deciding: usize, decision: &Decision) -> u64 {
    if !decision.is_allowed() {
        return retry_after_secs(decision);
    }
    let limits = policy.limits();
    let reset = ceil_secs(decision.reset_after);
    match limits.get(deciding).or(limits.last()) {
        Some(named) => reset.min(longest_reset_secs(named)),
        None => reset,
    }
}

/// The figures to show for a peek of `cost`: a peek's are those of the admission it would
/// be, but nothing was taken, so an admitted one shows what is left now (the named limit
/// had `cost` more: every limit had at least `cost`, and each loses the same). Its `t`
/// stays the admission's, never earlier than the limit's reset. A denial, and a failure
/// policy's answer ([`Decision::is_blind`]), are shown as they are. rein-tower's peek
/// routes and rein-server's checks (a cost of zero) both show these.
pub fn peeked(mut decision: Decision, cost: u64) -> Decision {
    if decision.is_allowed() && !decision.is_blind() {
        decision.remaining = decision.remaining.saturating_add(cost).min(decision.limit);
    }
    decision
}

/// `Retry-After` in whole seconds: `retry_after` rounded up, so that a client waiting that
/// long is admitted.
pub fn retry_after_secs(decision: &Decision) -> u64 {
    let secs = ceil_secs(decision.retry_after);
    // A failure policy's denial ([`Decision::is_blind`]): at least a second, never "retry
    // now" at a store that just failed (its wait is zero while the breaker is closed).
    if decision.is_blind() {
        secs.max(1)
    } else {
        secs
    }
}

/// The window a limit's quota refers to, in whole seconds (rounded up, at least 1): a
/// window algorithm's window, or the time a token bucket takes to refill from empty.
pub fn window_secs(limit: &Limit) -> u64 {
    let micros: u128 = match limit {
        Limit::FixedWindow(l) => l.window().as_micros().into(),
        Limit::SlidingLog(l) => l.window().as_micros().into(),
        Limit::SlidingCounter(l) => l.window().as_micros().into(),
        Limit::TokenBucket(bucket) => {
            // One token every `per_token / per_micro` µs; a full refill is `capacity` tokens.
            let (per_token, per_micro) = bucket.emission_interval();
            let capacity = u128::from(bucket.capacity());
            (capacity * u128::from(per_token)).div_ceil(u128::from(per_micro.max(1)))
        }
    };
    let secs = micros.div_ceil(MICROS_PER_SEC.into());
    u64::try_from(secs).unwrap_or(u64::MAX).max(1)
}

/// The longest a limit can take, after an admission, to be full again, in whole seconds
/// (rounded up, at least 1): [`window_secs`], except for a sliding counter, whose current
/// window's count weighs on the estimate until the end of the next window (`2w`).
pub fn longest_reset_secs(limit: &Limit) -> u64 {
    match limit {
        Limit::SlidingCounter(l) => {
            let micros = 2 * u128::from(l.window().as_micros());
            let secs = micros.div_ceil(MICROS_PER_SEC.into());
            u64::try_from(secs).unwrap_or(u64::MAX).max(1)
        }
        other => window_secs(other),
    }
}

/// A span in whole seconds, rounded up.
fn ceil_secs(span: Micros) -> u64 {
    span.as_micros().div_ceil(MICROS_PER_SEC)
}

/// Appends the item name of limit `index` of a policy of `count` limits, as an sf-string.
fn push_item_name(out: &mut String, name: &str, count: usize, index: usize) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            // sf-string allows visible ASCII and space only. `NamedPolicy` names never hold
            // anything else; replacing keeps the header valid if that rule ever changes.
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    if count > 1 {
        // Writing to a `String` cannot fail.
        let _ = write!(out, ".{index}");
    }
    out.push('"');
}

/// `n` clamped to the structured-field integer range.
fn sf_integer(n: u64) -> u64 {
    n.min(SF_INTEGER_MAX)
}

const MICROS_PER_SEC: u64 = 1_000_000;

/// The largest structured-field integer (RFC 9651 §3.3.1: at most 15 decimal digits).
pub const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::Outcome;

    fn named(name: &str, limits: Vec<Limit>) -> NamedPolicy {
        NamedPolicy::new(name, Policy::new(limits).unwrap()).unwrap()
    }

    fn decision(outcome: Outcome, limit: u64, remaining: u64, retry: u64, reset: u64) -> Decision {
        Decision {
            outcome,
            limit,
            remaining,
            retry_after: Micros::from_micros(retry),
            reset_after: Micros::from_micros(reset),
            limit_index: 0,
        }
    }

    #[test]
    fn token_bucket_window_is_the_time_to_refill_from_empty() {
        // 100 tokens at 10 per second: 10 s.
        let bucket = Limit::token_bucket(100, 10, Micros::from_secs(1)).unwrap();
        assert_eq!(window_secs(&bucket), 10);
        // 3 tokens at 3 per second: 1 s, although 1/3 s per token is not a whole µs.
        let thirds = Limit::token_bucket(3, 3, Micros::from_secs(1)).unwrap();
        assert_eq!(window_secs(&thirds), 1);
        // A sub-second window reports 1, never 0.
        let fast = Limit::fixed_window(5, Micros::from_millis(250)).unwrap();
        assert_eq!(window_secs(&fast), 1);
    }

    #[test]
    fn a_multi_limit_policy_lists_every_limit_and_names_the_deciding_one() {
        let policy = named(
            "login",
            vec![
                Limit::token_bucket(5, 1, Micros::from_secs(10)).unwrap(),
                Limit::fixed_window(50, Micros::from_secs(86_400)).unwrap(),
            ],
        );
        assert_eq!(
            render_policy(&policy),
            r#""login.0";q=5;w=50, "login.1";q=50;w=86400"#
        );
        // On a denial `t` is `Retry-After`, not the reset.
        let denied = decision(Outcome::Denied, 50, 0, 1_500_000, 3_000_000);
        let headers = render(&policy, 1, &denied);
        assert_eq!(headers.rate_limit.as_deref(), Some(r#""login.1";r=0;t=2"#));
        assert_eq!(headers.retry_after, Some(2));
        // On an admission the policy's longest reset (the daily window's 20 h) is bounded
        // by the named bucket's refill from empty, 50 s.
        let mut allowed = decision(Outcome::Allowed, 5, 1, 0, 72_000_000_000);
        allowed.limit_index = 0;
        assert_eq!(
            render(&policy, 0, &allowed).rate_limit.as_deref(),
            Some(r#""login.0";r=1;t=50"#)
        );
    }

    #[test]
    fn a_sliding_counter_may_take_two_windows_to_be_full_again() {
        let counter = Limit::sliding_counter(10, Micros::from_millis(1_500)).unwrap();
        assert_eq!(window_secs(&counter), 2);
        assert_eq!(longest_reset_secs(&counter), 3);
        let bucket = Limit::token_bucket(10, 1, Micros::from_secs(1)).unwrap();
        assert_eq!(longest_reset_secs(&bucket), window_secs(&bucket));
    }

    #[test]
    fn the_deciding_limit_is_the_decisions_own_index_within_the_policy() {
        let policy = named(
            "p",
            vec![
                Limit::fixed_window(9, Micros::from_secs(1)).unwrap(),
                Limit::fixed_window(3, Micros::from_secs(1)).unwrap(),
                Limit::fixed_window(3, Micros::from_secs(60)).unwrap(),
            ],
        );
        let mut second = decision(Outcome::Allowed, 3, 1, 0, 0);
        second.limit_index = 1;
        assert_eq!(deciding_limit(policy.policy(), &second), 1);
        // An index past the policy (a decision from another policy) reads as its last limit.
        second.limit_index = 7;
        assert_eq!(deciding_limit(policy.policy(), &second), 2);
        let single = named(
            "s",
            vec![Limit::fixed_window(9, Micros::from_secs(1)).unwrap()],
        );
        assert_eq!(deciding_limit(single.policy(), &second), 0);
    }

    #[test]
    fn admitted_decisions_have_no_retry_after() {
        let policy = named(
            "a",
            vec![Limit::fixed_window(2, Micros::from_secs(1)).unwrap()],
        );
        let allowed = decision(Outcome::Allowed, 2, 1, 0, 1);
        let headers = render(&policy, 0, &allowed);
        assert_eq!(headers.retry_after, None);
        assert_eq!(headers.rate_limit.as_deref(), Some(r#""a";r=1;t=1"#));
    }
}
