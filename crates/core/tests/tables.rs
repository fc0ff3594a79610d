//! Timeline tables: one per algorithm and one for a two-limit policy, each row a request
//! whose answer can be checked by hand (docs/algorithms.md walks through several of them).
//!
//! Rows run in order against one state. Times are microseconds since the epoch, written with
//! the `S` (second) and `MS` (millisecond) constants. A `Refund` row gives back `cost` and is
//! then checked with a cost-0 peek at the same instant. A `NeverFits` row expects
//! `AcquireError::InsufficientCapacity` and ignores the figures. Denials, peeks and errors
//! must leave the state unchanged.

use rein_core::policy::MAX_LIMITS;
use rein_core::time::{MAX_MICROS, MAX_SPAN};
use rein_core::{
    AcquireError, ConfigError, Decision, Limit, LimitState, Micros, OverCapacity, Policy,
    PolicyState, Timestamp,
};

const S: u64 = 1_000_000;
const MS: u64 = 1_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Acquire,
    Peek,
    Refund,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Allowed,
    Denied,
    NeverFits,
}

/// One request and the decision it must get.
#[derive(Debug)]
struct Row {
    label: &'static str,
    now: u64,
    op: Op,
    cost: u64,
    outcome: Expect,
    remaining: u64,
    retry_after: u64,
    reset_after: u64,
}

use Expect::{Allowed, Denied, NeverFits};
use Op::{Acquire, Peek, Refund};

#[rustfmt::skip]
#[test]
fn token_bucket_timeline() {
    // 10 tokens, 1 more per second: the emission interval is exactly 1 s.
    let limit = Limit::token_bucket(10, 1, Micros::from_secs(1)).unwrap();
    run("token bucket 10 @ 1/s", Subject::one(limit), &[
        // A full bucket admits a burst of its whole capacity at one instant.
        Row { label: "first token",            now: 0,            op: Acquire, cost: 1,  outcome: Allowed,   remaining: 9,  retry_after: 0,      reset_after: S },
        Row { label: "rest of the burst",      now: 0,            op: Acquire, cost: 9,  outcome: Allowed,   remaining: 0,  retry_after: 0,      reset_after: 10 * S },
        Row { label: "empty bucket",           now: 0,            op: Acquire, cost: 1,  outcome: Denied,    remaining: 0,  retry_after: S,      reset_after: 10 * S },
        // retry_after is exact: 1 µs early is denied, on time is allowed.
        Row { label: "1 µs early",             now: S - 1,        op: Acquire, cost: 1,  outcome: Denied,    remaining: 0,  retry_after: 1,      reset_after: 9 * S + 1 },
        Row { label: "on time",                now: S,            op: Acquire, cost: 1,  outcome: Allowed,   remaining: 0,  retry_after: 0,      reset_after: 10 * S },
        // Cost 0 answers without consuming; half a token is not a token.
        Row { label: "cost 0 peeks",           now: S,            op: Acquire, cost: 0,  outcome: Allowed,   remaining: 0,  retry_after: 0,      reset_after: 10 * S },
        Row { label: "half a token",           now: S + 500 * MS, op: Acquire, cost: 1,  outcome: Denied,    remaining: 0,  retry_after: 500 * MS, reset_after: 9 * S + 500 * MS },
        Row { label: "cost 3 waits for 3",     now: S + 500 * MS, op: Peek,    cost: 3,  outcome: Denied,    remaining: 0,  retry_after: 2 * S + 500 * MS, reset_after: 9 * S + 500 * MS },
        // Four seconds later four tokens are back; a cost of 3 takes three at once.
        Row { label: "cost 3 after refill",    now: 5 * S,        op: Acquire, cost: 3,  outcome: Allowed,   remaining: 1,  retry_after: 0,      reset_after: 9 * S },
        // A refund moves tat back; it never fills beyond capacity.
        Row { label: "refund 2",               now: 5 * S,        op: Refund,  cost: 2,  outcome: Allowed,   remaining: 3,  retry_after: 0,      reset_after: 7 * S },
        Row { label: "refund beyond full",     now: 5 * S,        op: Refund,  cost: 100, outcome: Allowed,  remaining: 10, retry_after: 0,      reset_after: 0 },
        Row { label: "burst after idle",       now: 20 * S,       op: Acquire, cost: 10, outcome: Allowed,   remaining: 0,  retry_after: 0,      reset_after: 10 * S },
        // More than the capacity can never be admitted, however long the caller waits.
        Row { label: "cost above capacity",    now: 20 * S,       op: Acquire, cost: 11, outcome: NeverFits, remaining: 0,  retry_after: 0,      reset_after: 0 },
        // The clock goes back 5 s: tat is further ahead, so less fits, not more.
        Row { label: "clock back 5 s",         now: 15 * S,       op: Acquire, cost: 1,  outcome: Denied,    remaining: 0,  retry_after: 6 * S,  reset_after: 15 * S },
        Row { label: "clock back 10 s, peek",  now: 10 * S,       op: Peek,    cost: 0,  outcome: Denied,    remaining: 0,  retry_after: 10 * S, reset_after: 20 * S },
        Row { label: "clock caught up",        now: 30 * S,       op: Acquire, cost: 10, outcome: Allowed,   remaining: 0,  retry_after: 0,      reset_after: 10 * S },
    ]);
}

#[rustfmt::skip]
#[test]
fn token_bucket_fractional_emission_interval() {
    // 3 tokens per second: the emission interval is 333 333⅓ µs, kept exact in thirds of a µs.
    let limit = Limit::token_bucket(3, 3, Micros::from_secs(1)).unwrap();
    run("token bucket 3 @ 3/s", Subject::one(limit), &[
        // A burst of 3 puts tat exactly 1 s ahead.
        Row { label: "burst of 3",             now: 0,             op: Acquire, cost: 3, outcome: Allowed, remaining: 0, retry_after: 0,       reset_after: S },
        // The next token is 333 333⅓ µs away: retry_after rounds up to the first whole µs.
        Row { label: "rounds up",              now: 0,             op: Acquire, cost: 1, outcome: Denied,  remaining: 0, retry_after: 333_334, reset_after: S },
        Row { label: "1 µs early",             now: 333_333,       op: Peek,    cost: 1, outcome: Denied,  remaining: 0, retry_after: 1,       reset_after: 666_667 },
        Row { label: "on time",                now: 333_334,       op: Acquire, cost: 1, outcome: Allowed, remaining: 0, retry_after: 0,       reset_after: S },
        // Three single tokens at one instant: the thirds add up to exactly 1 s.
        Row { label: "⅓ s",                    now: 2 * S,         op: Acquire, cost: 1, outcome: Allowed, remaining: 2, retry_after: 0,       reset_after: 333_334 },
        Row { label: "⅔ s",                    now: 2 * S,         op: Acquire, cost: 1, outcome: Allowed, remaining: 1, retry_after: 0,       reset_after: 666_667 },
        Row { label: "3⁄3 s",                  now: 2 * S,         op: Acquire, cost: 1, outcome: Allowed, remaining: 0, retry_after: 0,       reset_after: S },
        // tat is now exactly 3 s, so the next token is due at 3 s − 666 666⅔ µs.
        Row { label: "⅓ µs short",             now: 2 * S + 333_333, op: Acquire, cost: 1, outcome: Denied,  remaining: 0, retry_after: 1,     reset_after: 666_667 },
        Row { label: "due",                    now: 2 * S + 333_334, op: Acquire, cost: 1, outcome: Allowed, remaining: 0, retry_after: 0,     reset_after: S },
    ]);
}

/// Issue 9: a bucket whose `tat` could run past `MAX_MICROS` was stored with `tat` clamped,
/// so it stopped draining and admitted without limit ("a long burst span over-admits").
/// Near the end of time, a request whose `tat` would pass it is now denied for good.
#[rustfmt::skip]
#[test]
fn token_bucket_at_the_end_of_time_denies_rather_than_clamping_issue_9() {
    // 4 tokens, one every 2^46 µs: the longest span accepted, 2^48 µs.
    const E: u64 = 1 << 46;
    const SPAN: u64 = 1 << 48;
    const T0: u64 = MAX_MICROS - SPAN;
    let limit = Limit::token_bucket(4, 1, Micros::from_micros(E)).unwrap();
    run("token bucket 4 @ 1/2^46 µs, at the end of time", Subject::one(limit), &[
        // The last instant at which a full burst still fits: tat lands on MAX_MICROS.
        Row { label: "burst ends on MAX",   now: T0,          op: Acquire, cost: 4, outcome: Allowed, remaining: 0, retry_after: 0,          reset_after: SPAN },
        Row { label: "empty: an ordinary wait", now: T0,      op: Acquire, cost: 1, outcome: Denied,  remaining: 0, retry_after: E,          reset_after: SPAN },
        // A token is back, but taking it would put tat past MAX_MICROS: denied for good.
        Row { label: "tat would pass MAX",  now: T0 + E,      op: Acquire, cost: 1, outcome: Denied,  remaining: 1, retry_after: MAX_MICROS, reset_after: SPAN - E },
        Row { label: "a peek still answers", now: T0 + E,     op: Peek,    cost: 0, outcome: Allowed, remaining: 1, retry_after: 0,          reset_after: SPAN - E },
        // At the last instant the bucket is full and still takes nothing.
        Row { label: "full at MAX",         now: MAX_MICROS,  op: Acquire, cost: 1, outcome: Denied,  remaining: 4, retry_after: MAX_MICROS, reset_after: 0 },
    ]);
}

/// Issue 9's example: one token a week with a burst of 5000 spans 96 years, which no
/// clock reading today can store ahead of itself. It is refused when built.
#[test]
fn long_burst_span_is_a_config_error_not_an_over_admission_issue_9() {
    let week = Micros::from_secs(604_800);
    assert_eq!(
        Limit::token_bucket(5000, 1, week),
        Err(ConfigError::SpanTooLong {
            what: "capacity × period / refill",
            span: 5000 * 604_800 * S,
            max: MAX_SPAN.as_micros(),
        })
    );
    // The same rate with a burst that fits in MAX_SPAN (465 weeks, 8.9 years) is accepted.
    assert!(Limit::token_bucket(465, 1, week).is_ok());
    assert!(Limit::token_bucket(466, 1, week).is_err());
}

#[rustfmt::skip]
#[test]
fn fixed_window_timeline() {
    // 5 per 10 s, windows [0 s, 10 s), [10 s, 20 s), ...
    let limit = Limit::fixed_window(5, Micros::from_secs(10)).unwrap();
    run("fixed window 5 / 10 s", Subject::one(limit), &[
        // The window resets at its aligned end, whenever the first request came.
        Row { label: "first",                  now: 3 * S,         op: Acquire, cost: 1, outcome: Allowed,   remaining: 4, retry_after: 0,        reset_after: 7 * S },
        Row { label: "fill at 9 s",            now: 9 * S,         op: Acquire, cost: 4, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: S },
        Row { label: "full",                   now: 9 * S + 500 * MS, op: Acquire, cost: 1, outcome: Denied, remaining: 0, retry_after: 500 * MS, reset_after: 500 * MS },
        Row { label: "1 µs before boundary",   now: 10 * S - 1,    op: Peek,    cost: 1, outcome: Denied,    remaining: 0, retry_after: 1,        reset_after: 1 },
        // The boundary burst: 4 at 9 s and 5 at 10 s, 9 > 5 within 1 s; up to 2 × limit.
        Row { label: "boundary burst",         now: 10 * S,        op: Acquire, cost: 5, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 10 * S },
        Row { label: "next window full",       now: 10 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 10 * S,   reset_after: 10 * S },
        // Refunds uncount from the current window, never below zero.
        Row { label: "refund 2",               now: 12 * S,        op: Refund,  cost: 2, outcome: Allowed,   remaining: 2, retry_after: 0,        reset_after: 8 * S },
        Row { label: "refund beyond zero",     now: 12 * S,        op: Refund,  cost: 10, outcome: Allowed,  remaining: 5, retry_after: 0,        reset_after: 0 },
        Row { label: "refill the window",      now: 12 * S,        op: Acquire, cost: 5, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 8 * S },
        Row { label: "cost above limit",       now: 12 * S,        op: Acquire, cost: 6, outcome: NeverFits, remaining: 0, retry_after: 0,        reset_after: 0 },
        // Back to 5 s, in the window before: it does not reopen; the wait runs to 20 s.
        Row { label: "clock back to 5 s",      now: 5 * S,         op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 15 * S,   reset_after: 15 * S },
        Row { label: "cost 0 peeks",           now: 15 * S,        op: Acquire, cost: 0, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 5 * S },
        Row { label: "next window",            now: 20 * S,        op: Acquire, cost: 1, outcome: Allowed,   remaining: 4, retry_after: 0,        reset_after: 10 * S },
    ]);
}

#[rustfmt::skip]
#[test]
fn sliding_log_timeline() {
    // 3 in any 10 s: the window at `now` is (now − 10 s, now].
    let limit = Limit::sliding_log(3, Micros::from_secs(10)).unwrap();
    run("sliding log 3 / 10 s", Subject::one(limit), &[
        // reset_after runs until the newest admission leaves the window.
        Row { label: "at 1 s",                 now: S,             op: Acquire, cost: 1, outcome: Allowed,   remaining: 2, retry_after: 0,     reset_after: 10 * S },
        Row { label: "at 4 s",                 now: 4 * S,         op: Acquire, cost: 1, outcome: Allowed,   remaining: 1, retry_after: 0,     reset_after: 10 * S },
        Row { label: "at 6 s",                 now: 6 * S,         op: Acquire, cost: 1, outcome: Allowed,   remaining: 0, retry_after: 0,     reset_after: 10 * S },
        // Full: wait for the oldest admission (1 s) to leave at 11 s; a cost of 2 for two.
        Row { label: "full at 8 s",            now: 8 * S,         op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 3 * S, reset_after: 8 * S },
        Row { label: "cost 2 waits for 4 s",   now: 8 * S,         op: Peek,    cost: 2, outcome: Denied,    remaining: 0, retry_after: 6 * S, reset_after: 8 * S },
        Row { label: "1 µs early",             now: 11 * S - 1,    op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 1,     reset_after: 5 * S + 1 },
        Row { label: "1 s has left",           now: 11 * S,        op: Acquire, cost: 1, outcome: Allowed,   remaining: 0, retry_after: 0,     reset_after: 10 * S },
        // No boundary burst: 4 s is still in (3 s, 13 s].
        Row { label: "4 s still counts",       now: 13 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: S,     reset_after: 8 * S },
        // Back to 9 s: judged at the newest admission (11 s), where 3 still count.
        Row { label: "clock back to 9 s",      now: 9 * S,         op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 5 * S, reset_after: 12 * S },
        // A refund removes the newest admission (11 s).
        Row { label: "refund 1",               now: 13 * S,        op: Refund,  cost: 1, outcome: Allowed,   remaining: 1, retry_after: 0,     reset_after: 3 * S },
        Row { label: "cost above limit",       now: 13 * S,        op: Acquire, cost: 4, outcome: NeverFits, remaining: 0, retry_after: 0,     reset_after: 0 },
        // After a quiet window the log is empty again.
        Row { label: "quiet",                  now: 30 * S,        op: Peek,    cost: 0, outcome: Allowed,   remaining: 3, retry_after: 0,     reset_after: 0 },
        Row { label: "burst of 3",             now: 30 * S,        op: Acquire, cost: 3, outcome: Allowed,   remaining: 0, retry_after: 0,     reset_after: 10 * S },
        Row { label: "1 µs before 40 s",       now: 40 * S - 1,    op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 1,     reset_after: 1 },
        Row { label: "at 40 s",                now: 40 * S,        op: Acquire, cost: 3, outcome: Allowed,   remaining: 0, retry_after: 0,     reset_after: 10 * S },
    ]);
}

#[rustfmt::skip]
#[test]
fn sliding_counter_timeline() {
    // About 10 per 10 s: estimate = previous × (10 s − elapsed) / 10 s + current.
    let limit = Limit::sliding_counter(10, Micros::from_secs(10)).unwrap();
    run("sliding counter 10 / 10 s", Subject::one(limit), &[
        // 8 in [0 s, 10 s); reset_after runs until both counters have decayed (20 s).
        Row { label: "8 at 9 s",               now: 9 * S,         op: Acquire, cost: 8, outcome: Allowed,   remaining: 2, retry_after: 0,        reset_after: 11 * S },
        // 2 s into the next window, 8 × 8/10 = 6.4 of them still count: 3 fit.
        Row { label: "6.4 still count",        now: 12 * S,        op: Peek,    cost: 0, outcome: Allowed,   remaining: 3, retry_after: 0,        reset_after: 8 * S },
        Row { label: "3 fit",                  now: 12 * S,        op: Acquire, cost: 3, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 18 * S },
        // 6.4 + 3 + 1 > 10 until the weight is 8 × 7.5/10 = 6, at 12.5 s.
        Row { label: "6.4 + 3 + 1 > 10",       now: 12 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 500 * MS, reset_after: 18 * S },
        Row { label: "1 µs early",             now: 12 * S + 500 * MS - 1, op: Peek, cost: 1, outcome: Denied, remaining: 0, retry_after: 1,      reset_after: 17 * S + 500 * MS + 1 },
        Row { label: "6 + 3 + 1 = 10",         now: 12 * S + 500 * MS, op: Acquire, cost: 1, outcome: Allowed, remaining: 0, retry_after: 0,      reset_after: 17 * S + 500 * MS },
        // A cost of 6 only fits at 20 s, when the 4 become the previous window: 4 + 6 = 10.
        Row { label: "cost 6 waits a window",  now: 12 * S + 500 * MS, op: Peek, cost: 6, outcome: Denied,  remaining: 0, retry_after: 7 * S + 500 * MS, reset_after: 17 * S + 500 * MS },
        Row { label: "1 µs before 20 s",       now: 20 * S - 1,    op: Peek,    cost: 6, outcome: Denied,    remaining: 5, retry_after: 1,        reset_after: 10 * S + 1 },
        Row { label: "4 + 6 at 20 s",          now: 20 * S,        op: Acquire, cost: 6, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 20 * S },
        // The worst case: a full window bunched at its end is under-counted in the next.
        // 10 + 1 + 4 + 3 = 18 admitted within [49 s, 58.5 s], a span shorter than the window.
        Row { label: "10 at 49 s",             now: 49 * S,        op: Acquire, cost: 10, outcome: Allowed,  remaining: 0, retry_after: 0,        reset_after: 11 * S },
        Row { label: "10 × 9/10 + 1",          now: 51 * S,        op: Acquire, cost: 1, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 19 * S },
        Row { label: "10 × 5/10 + 1 + 4",      now: 55 * S,        op: Acquire, cost: 4, outcome: Allowed,   remaining: 0, retry_after: 0,        reset_after: 15 * S },
        Row { label: "10 × 1.5/10 + 5 + 3",    now: 58 * S + 500 * MS, op: Acquire, cost: 3, outcome: Allowed, remaining: 0, retry_after: 0,      reset_after: 11 * S + 500 * MS },
        // Back to 45 s, before the stored window: judged at its start (50 s), where the
        // previous window weighs fully; 1 fits at 59 s (10 × 1/10 + 8 + 1 = 10).
        Row { label: "clock back to 45 s",     now: 45 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 14 * S,   reset_after: 25 * S },
        Row { label: "cost above limit",       now: 58 * S + 500 * MS, op: Acquire, cost: 11, outcome: NeverFits, remaining: 0, retry_after: 0,  reset_after: 0 },
        // A refund uncounts from the current window.
        Row { label: "refund 3",               now: 58 * S + 500 * MS, op: Refund, cost: 3, outcome: Allowed,  remaining: 3, retry_after: 0,      reset_after: 11 * S + 500 * MS },
        // Regression: with nothing counted, a clock behind the stored window is already
        // full, so reset_after is 0 (it was the distance to the window's start).
        Row { label: "quiet, then 1",          now: 100 * S,       op: Acquire, cost: 1, outcome: Allowed,   remaining: 9, retry_after: 0,        reset_after: 20 * S },
        Row { label: "refunded",               now: 100 * S,       op: Refund,  cost: 1, outcome: Allowed,   remaining: 10, retry_after: 0,       reset_after: 0 },
        Row { label: "clock back, empty",      now: 95 * S,        op: Peek,    cost: 0, outcome: Allowed,   remaining: 10, retry_after: 0,       reset_after: 0 },
    ]);
}

#[rustfmt::skip]
#[test]
fn policy_of_two_limits_timeline() {
    // Bursts of 5 refilled at 1/s, and at most 8 per minute: all-or-nothing.
    let policy = Policy::new([
        Limit::token_bucket(5, 1, Micros::from_secs(1)).unwrap(),
        Limit::fixed_window(8, Micros::from_secs(60)).unwrap(),
    ])
    .unwrap();
    run("policy bucket 5 @ 1/s + window 8 / 60 s", Subject::many(policy), &[
        // Figures combine: fewest remaining, longest retry_after, longest reset_after.
        Row { label: "burst of 5",             now: 0,             op: Acquire, cost: 5, outcome: Allowed,   remaining: 0, retry_after: 0,      reset_after: 60 * S },
        Row { label: "bucket denies",          now: 0,             op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: S,      reset_after: 60 * S },
        // 5 + 3 = 8 fits the window: the denied request above was not counted there.
        Row { label: "window not charged",     now: 3 * S,         op: Acquire, cost: 3, outcome: Allowed,   remaining: 0, retry_after: 0,      reset_after: 57 * S },
        Row { label: "window denies",          now: 10 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: 50 * S, reset_after: 50 * S },
        Row { label: "window denies 5",        now: 57 * S,        op: Acquire, cost: 5, outcome: Denied,    remaining: 0, retry_after: 3 * S,  reset_after: 5 * S },
        // A burst of 5 at 60 s: the bucket was not charged for the denial at 57 s.
        Row { label: "bucket not charged",     now: 60 * S,        op: Acquire, cost: 5, outcome: Allowed,   remaining: 0, retry_after: 0,      reset_after: 60 * S },
        Row { label: "bucket denies again",    now: 60 * S,        op: Acquire, cost: 1, outcome: Denied,    remaining: 0, retry_after: S,      reset_after: 60 * S },
        // Both deny (bucket 4 s, window 60 s): the longer wait is the policy's.
        Row { label: "both deny",              now: 60 * S,        op: Acquire, cost: 4, outcome: Denied,    remaining: 0, retry_after: 60 * S, reset_after: 60 * S },
        // A refund goes to every limit: bucket 3 left, window 5 left.
        Row { label: "refund 2",               now: 61 * S,        op: Refund,  cost: 2, outcome: Allowed,   remaining: 3, retry_after: 0,      reset_after: 59 * S },
        // The largest cost is the smallest capacity.
        Row { label: "cost above bucket",      now: 61 * S,        op: Acquire, cost: 6, outcome: NeverFits, remaining: 0, retry_after: 0,      reset_after: 0 },
    ]);
}

#[test]
#[rustfmt::skip]
fn invalid_settings_are_config_errors() {
    let two_52 = MAX_MICROS + 1;
    let too_large = |what, value| ConfigError::TooLarge {
        what,
        value,
        max: MAX_MICROS,
    };
    let zero = |what| ConfigError::Zero { what };
    let us = Micros::from_micros;
    let too_long = |what, span| ConfigError::SpanTooLong {
        what,
        span,
        max: MAX_SPAN.as_micros(),
    };
    let span = MAX_SPAN.as_micros();
    let cases: [(&str, Result<Limit, ConfigError>, ConfigError); 21] = [
        ("bucket capacity 0", Limit::token_bucket(0, 1, us(1)), zero("capacity")),
        ("bucket refill 0", Limit::token_bucket(1, 0, us(1)), zero("refill")),
        ("bucket period 0", Limit::token_bucket(1, 1, us(0)), zero("period")),
        ("bucket capacity 2^52", Limit::token_bucket(two_52, 1, us(1)), too_large("capacity", two_52)),
        ("bucket refill 2^52", Limit::token_bucket(1, two_52, us(1)), too_large("refill", two_52)),
        ("bucket tolerance 2^40 × 1 s", Limit::token_bucket(1 << 40, 1, Micros::from_secs(1)), too_large("capacity × emission interval", (1 << 40) * S)),
        ("bucket tolerance overflows u64", Limit::token_bucket(1 << 51, 1, Micros::MAX), too_large("capacity × emission interval", u64::MAX)),
        ("bucket span 2^48 + 1 µs", Limit::token_bucket(1, 1, us(span + 1)), too_long("capacity × period / refill", span + 1)),
        ("bucket span rounds up past 2^48 µs", Limit::token_bucket(3, 3, us(span + 1)), too_long("capacity × period / refill", span + 1)),
        ("window span", Limit::fixed_window(1, us(span + 1)), too_long("window", span + 1)),
        ("log span", Limit::sliding_log(1, us(span + 1)), too_long("window", span + 1)),
        ("counter span", Limit::sliding_counter(1, us(span + 1)), too_long("window", span + 1)),
        ("window limit 0", Limit::fixed_window(0, us(1)), zero("limit")),
        ("window length 0", Limit::fixed_window(1, us(0)), zero("window")),
        ("window limit 2^52", Limit::fixed_window(two_52, us(1)), too_large("limit", two_52)),
        ("log limit 0", Limit::sliding_log(0, us(1)), zero("limit")),
        ("log window 0", Limit::sliding_log(1, us(0)), zero("window")),
        ("log limit 2^52", Limit::sliding_log(two_52, us(1)), too_large("limit", two_52)),
        ("counter limit 0", Limit::sliding_counter(0, us(1)), zero("limit")),
        ("counter window 0", Limit::sliding_counter(1, us(0)), zero("window")),
        ("counter limit × window", Limit::sliding_counter(10, Micros::MAX), too_large("limit × window", 10 * MAX_MICROS)),
    ];
    for (label, built, expected) in cases {
        assert_eq!(built, Err(expected), "{label}");
    }

    // The largest exact settings and the longest spans are accepted.
    let max = MAX_SPAN;
    assert!(Limit::token_bucket(MAX_MICROS, MAX_MICROS, us(1)).is_ok());
    assert!(Limit::token_bucket(1, 1, max).is_ok());
    assert!(Limit::token_bucket(3, 3, max).is_ok());
    assert!(Limit::fixed_window(MAX_MICROS, max).is_ok());
    assert!(Limit::sliding_log(MAX_MICROS, max).is_ok());
    assert!(Limit::sliding_counter(1, max).is_ok());

    let one = Limit::fixed_window(1, us(1)).unwrap();
    assert_eq!(Policy::new([]), Err(ConfigError::NoLimits));
    assert_eq!(
        Policy::new([one; MAX_LIMITS + 1]),
        Err(ConfigError::TooManyLimits {
            got: MAX_LIMITS + 1,
            max: MAX_LIMITS
        })
    );
    assert!(Policy::new([one; MAX_LIMITS]).is_ok());
}

#[test]
fn state_of_another_shape_is_a_mismatch() {
    let bucket = Limit::token_bucket(1, 1, Micros::from_secs(1)).unwrap();
    let window = Limit::fixed_window(1, Micros::from_secs(1)).unwrap();
    let now = Timestamp::from_micros(0);
    let mut state = window.new_state();
    let before = state.clone();
    assert_eq!(
        bucket.acquire(now, &mut state, 1),
        Err(AcquireError::StateMismatch)
    );
    assert_eq!(
        bucket.refund(now, &mut state, 1),
        Err(AcquireError::StateMismatch)
    );
    assert_eq!(state, before);

    let two = Policy::new([bucket, window]).unwrap();
    let mut one_state = Policy::single(bucket).new_state();
    assert_eq!(
        two.acquire(now, &mut one_state, 1),
        Err(AcquireError::StateMismatch)
    );
    // Right length, wrong order: nothing is consumed from the limit that did match.
    let mut swapped = PolicyState::from_states([
        LimitState::TokenBucket(Default::default()),
        window.new_state(),
    ])
    .unwrap();
    let swapped_before = swapped.clone();
    let reversed = Policy::new([window, window]).unwrap();
    assert_eq!(
        reversed.acquire(now, &mut swapped, 1),
        Err(AcquireError::StateMismatch)
    );
    assert_eq!(swapped, swapped_before);
}

/// A limit or a policy with its state, driven by the table runner: the limit's own
/// transitions, or the policy's over its limits.
enum Subject {
    One(Limit, LimitState),
    Many(Policy, PolicyState),
}

impl Subject {
    fn one(limit: Limit) -> Self {
        let state = limit.new_state();
        Self::One(limit, state)
    }

    fn many(policy: Policy) -> Self {
        let state = policy.new_state();
        Self::Many(policy, state)
    }

    fn acquire(&mut self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        match self {
            Self::One(limit, state) => limit.acquire(now, state, cost),
            Self::Many(policy, state) => policy.acquire(now, state, cost),
        }
    }

    fn peek(&self, now: Timestamp, cost: u64) -> Result<Decision, AcquireError> {
        match self {
            Self::One(limit, state) => limit.peek(now, state, cost),
            Self::Many(policy, state) => policy.peek(now, state, cost),
        }
    }

    fn refund(&mut self, now: Timestamp, amount: u64) {
        match self {
            Self::One(limit, state) => limit.refund(now, state, amount).unwrap(),
            Self::Many(policy, state) => policy.refund(now, state, amount).unwrap(),
        }
    }

    fn capacity(&self) -> u64 {
        match self {
            Self::One(limit, _) => limit.capacity(),
            Self::Many(policy, _) => policy.capacity(),
        }
    }

    /// `Decision::limit` for every decision, when it does not depend on the row: a
    /// policy's figures come from whichever limit has the fewest remaining.
    fn decision_limit(&self) -> Option<u64> {
        match self {
            Self::One(limit, _) => Some(limit.capacity()),
            Self::Many(..) => None,
        }
    }

    /// The state, to check that a row left it unchanged.
    fn snapshot(&self) -> String {
        match self {
            Self::One(_, state) => format!("{state:?}"),
            Self::Many(_, state) => format!("{state:?}"),
        }
    }
}

/// The figures a row compares: outcome, remaining, retry_after, reset_after.
type Figures = (Expect, u64, u64, u64);

/// Runs `rows` in order against `subject`, naming the table and the row on failure.
fn run(table: &str, mut subject: Subject, rows: &[Row]) {
    for row in rows {
        let now = Timestamp::from_micros(row.now);
        let before = subject.snapshot();
        let result = match row.op {
            Acquire => subject.acquire(now, row.cost),
            Peek => subject.peek(now, row.cost),
            Refund => {
                subject.refund(now, row.cost);
                subject.peek(now, 0)
            }
        };
        let unchanged = subject.snapshot() == before;
        match (row.outcome, result) {
            (
                NeverFits,
                Err(AcquireError::InsufficientCapacity(OverCapacity { cost, capacity })),
            ) => {
                assert_eq!(
                    (cost, capacity),
                    (row.cost, subject.capacity()),
                    "{table}: row {:?}",
                    row.label
                );
                assert!(unchanged, "{table}: row {:?} changed the state", row.label);
            }
            (_, Ok(decision)) => {
                let outcome = if decision.is_allowed() {
                    Allowed
                } else {
                    Denied
                };
                let seen: Figures = (
                    outcome,
                    decision.remaining,
                    decision.retry_after.as_micros(),
                    decision.reset_after.as_micros(),
                );
                let expected: Figures =
                    (row.outcome, row.remaining, row.retry_after, row.reset_after);
                assert_eq!(
                    seen, expected,
                    "{table}: row {:?}: (outcome, remaining, retry_after, reset_after)",
                    row.label
                );
                if let Some(limit) = subject.decision_limit() {
                    assert_eq!(decision.limit, limit, "{table}: row {:?}", row.label);
                }
                let writes = row.op == Refund || (row.op == Acquire && outcome == Allowed);
                if !writes || row.cost == 0 {
                    assert!(unchanged, "{table}: row {:?} changed the state", row.label);
                }
            }
            (_, result) => panic!("{table}: row {:?}: got {result:?}", row.label),
        }
    }
}

/// What a key keeps when its limit's numbers change (docs/operations.md, "What a key keeps
/// when its numbers change"): each row takes `taken` under the old limit at 0, then reads
/// the state under the new one at 0 (what is left), and at `later` (whether one unit is
/// admitted then). The state is the same bytes whatever the numbers, as in Redis.
#[test]
#[rustfmt::skip]
fn a_state_read_under_new_numbers_keeps_what_operations_md_says() {
    let tb = |capacity, refill, period| Limit::token_bucket(capacity, refill, Micros::from_micros(period)).unwrap();
    let fw = |limit, window| Limit::fixed_window(limit, Micros::from_micros(window)).unwrap();
    let sc = |limit, window| Limit::sliding_counter(limit, Micros::from_micros(window)).unwrap();
    let sl = |limit, window| Limit::sliding_log(limit, Micros::from_micros(window)).unwrap();
    let (minute, hour) = (60 * S, 3_600 * S);
    // (what, old limit, taken, new limit, left at 0, later, a unit admitted then)
    let rows = [
        ("a raised window limit keeps the count", fw(5, hour), 5, fw(10, hour), 5, 0, true),
        ("a lowered one applies to it", fw(10, hour), 5, fw(3, hour), 0, 0, false),
        ("a bucket's capacity, the same rate", tb(10, 1, S), 5, tb(20, 1, S), 15, 0, true),
        ("a bucket's rate over the same time to fill: the share", tb(10, 10, minute), 5, tb(20, 20, minute), 10, 0, true),
        ("a shorter time to fill: empty until the debt is paid", tb(100, 100, hour), 100, tb(1_000, 1_000, S), 0, hour - S, false),
        ("... which it is after an hour", tb(100, 100, hour), 100, tb(1_000, 1_000, S), 0, hour, true),
        ("a longer time to fill: nearly full", tb(100, 100, S), 100, tb(100, 100, hour), 99, 0, true),
        ("a fixed window's new length counts afresh", fw(10, minute), 10, fw(10, hour), 10, 0, true),
        ("so does a sliding counter's", sc(10, minute), 10, sc(10, hour), 10, 0, true),
        ("a shortened one, once its first new window has passed", fw(10, hour), 10, fw(10, minute), 10, 0, true),
        ("a sliding log reads its entries under a longer window", sl(10, minute), 10, sl(10, hour), 0, minute, false),
    ];
    // 90 s into an hour: the old minute window did not start at the new hour.
    let at = |us: u64| Timestamp::from_micros(10 * hour + 90 * S + us);
    for (what, old, taken, new, left, later, admitted) in rows {
        let (old, new) = (Policy::single(old), Policy::single(new));
        let mut state = old.new_state();
        assert!(old.acquire(at(0), &mut state, taken).unwrap().is_allowed(), "{what}");
        assert_eq!(new.peek(at(0), &state, 0).unwrap().remaining, left, "{what}");
        assert_eq!(new.peek(at(later), &state, 1).unwrap().is_allowed(), admitted, "{what}");
    }
}
