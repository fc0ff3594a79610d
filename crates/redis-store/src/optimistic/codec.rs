//! The optimistic store's Redis commands and stored values: pure encoding and decoding, no
//! I/O.
//!
//! The values are the Lua scripts' own (key formats `v3` and `v4`, `state.rs`): one string
//! per policy; a limit's integers in decimal joined by `:` (`<tat>:<tat_units>`,
//! `<window_start>:<count>`, `<window_start>:<current>:<previous>`), or a sliding log's
//! header `<total>:<newest_at>:<newest_cost>|` and its entries `<at>:<cost>` joined by `,`;
//! a lone fixed window that fits is one integer (integer_window.rs); the limits of a policy
//! of several joined by `;`. Reading goes through `state.rs`, the decoder the Lua store's
//! `state` uses; writing is [`encode_value`] and [`join_parts`], the Rust half of the
//! scripts' encoding. Sharing the format lets both stores decide on the same keys: a
//! script's `SET` touches a watched key like any other write, so a transaction racing a
//! script aborts and retries.

use redis::{Pipeline, Value};
use rein_core::time::MAX_MICROS;
use rein_core::{AcquireError, LimitState, Micros, PolicyState, Timestamp};

use crate::RedisPolicy;
use crate::integer_window::IntegerWindow;
use crate::state::PART_SEPARATOR;
use rein_core::admin::KeyState;

/// The first round trip: forget an earlier `WATCH` left by a denial on this connection
/// (`unwatch`), `WATCH` the keys (`watch`, for operations that may write), `GET` each key
/// and, unless the caller gave `now`, the server's `TIME`. Only the `GET`s and `TIME`
/// reply; the rest is ignored.
pub(crate) fn read_pipeline(keys: &[String], unwatch: bool, watch: bool, time: bool) -> Pipeline {
    let mut pipe = redis::pipe();
    if unwatch {
        pipe.cmd("UNWATCH").ignore();
    }
    if watch {
        pipe.cmd("WATCH").arg(keys).ignore();
    }
    for key in keys {
        pipe.cmd("GET").arg(key);
    }
    if time {
        pipe.cmd("TIME");
    }
    pipe
}

/// Decodes the replies of [`read_pipeline`]: the policy's state (a missing key is a full
/// limit) and the server's clock if it was asked for.
pub(crate) fn decode_read(
    policy: &RedisPolicy,
    mut replies: Vec<Value>,
    time: bool,
) -> Result<(KeyState, Option<Timestamp>), String> {
    let now = if time {
        let reply = replies.pop().ok_or("no TIME reply")?;
        Some(decode_time(reply)?)
    } else {
        None
    };
    let state = crate::state::decode(policy, replies)?;
    Ok((state, now))
}

/// A limit state as the scripts store it; `None` for an empty sliding log, which is stored
/// as no key at all.
pub(crate) fn encode_value(
    state: &LimitState,
    integer_window: Option<IntegerWindow>,
) -> Option<String> {
    Some(match state {
        LimitState::TokenBucket(s) => format!("{}:{}", s.tat.as_micros(), s.tat_units),
        LimitState::FixedWindow(s) => match integer_window {
            Some(layout) => layout.encode(s).to_string(),
            None => format!("{}:{}", s.window_start.as_micros(), s.count),
        },
        LimitState::SlidingCounter(s) => format!(
            "{}:{}:{}",
            s.window_start.as_micros(),
            s.current,
            s.previous
        ),
        LimitState::SlidingLog(s) => {
            // The header: the total cost and the newest entry (the last, oldest first).
            let newest = s.entries().last()?;
            let total: u64 = s.entries().map(|e| e.cost).sum();
            let entries: Vec<String> = s
                .entries()
                .map(|e| format!("{}:{}", e.at.as_micros(), e.cost))
                .collect();
            format!(
                "{total}:{}:{}|{}",
                newest.at.as_micros(),
                newest.cost,
                entries.join(",")
            )
        }
    })
}

/// A policy's state as its one value and TTL in ms, as the scripts write it: the TTL ends
/// when the last of its limits is full again (or `min_ttl_ms`, if longer); a limit that
/// changed from `before` (every limit, without it) and whose own TTL is zero is stored as its
/// empty part, as its key would have been deleted when each limit had one. `None` as the
/// value: every limit empty, no key.
pub(crate) fn encode_policy(
    policy: &RedisPolicy,
    now: Timestamp,
    state: &PolicyState,
    before: Option<&PolicyState>,
    min_ttl_ms: u64,
) -> Result<(Option<String>, u64), AcquireError> {
    let mut ttl = 0;
    let mut parts = Vec::with_capacity(state.len());
    for (index, (limit, new)) in policy
        .policy()
        .limits()
        .iter()
        .zip(state.iter())
        .enumerate()
    {
        let limit_ttl = ttl_millis(limit.peek(now, new, 0)?.reset_after, min_ttl_ms);
        ttl = ttl.max(limit_ttl);
        let changed = before.is_none_or(|b| b.iter().nth(index) != Some(new));
        parts.push(if changed && limit_ttl == 0 {
            None
        } else {
            encode_value(new, policy.integer_window())
        });
    }
    Ok((join_parts(parts), ttl))
}

/// A policy's one value from its limits' values in order (`None`: an empty log): the value
/// alone for one limit (key format `v3`), else the values joined by `;` with an empty part
/// for each `None` (`v4`, state.rs). `None` when every limit is empty: the key is deleted.
pub(crate) fn join_parts(parts: Vec<Option<String>>) -> Option<String> {
    if parts.iter().all(Option::is_none) {
        return None;
    }
    let mut parts = parts.into_iter().map(Option::unwrap_or_default);
    let first = parts.next().unwrap_or_default();
    Some(parts.fold(first, |mut joined, part| {
        joined.push(PART_SEPARATOR);
        joined.push_str(&part);
        joined
    }))
}

/// `TIME`: seconds and microseconds as two decimal strings.
fn decode_time(reply: Value) -> Result<Timestamp, String> {
    let Value::Array(parts) = reply else {
        return Err(format!("TIME: expected an array, got {reply:?}"));
    };
    let number = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<u64>().ok()),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    match parts.as_slice() {
        [secs, micros] => match (number(secs), number(micros)) {
            (Some(secs), Some(micros)) => Ok(Timestamp::from_micros(
                secs.saturating_mul(1_000_000).saturating_add(micros),
            )),
            _ => Err(format!("TIME: not two integers: {parts:?}")),
        },
        _ => Err(format!("TIME: expected two parts, got {}", parts.len())),
    }
}

/// The second round trip: `MULTI`, a `SET … PX` (or `DEL`) of the policy's key, `EXEC`.
/// Each write is a key, its new value (`None`: every limit empty) and its TTL in ms; a zero
/// TTL or no value deletes the key, as the scripts do.
pub(crate) fn write_transaction(writes: &[(&str, Option<String>, u64)]) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (key, value, ttl_ms) in writes {
        match value {
            Some(value) if *ttl_ms > 0 => {
                pipe.cmd("SET").arg(*key).arg(value).arg("PX").arg(*ttl_ms)
            }
            _ => pipe.cmd("DEL").arg(*key),
        };
    }
    pipe
}

/// A written key's TTL in ms: its limit's `reset_after` rounded up, at least `min_ttl_ms`;
/// zero means "delete it". The scripts' rule, so both stores free memory alike.
pub(crate) fn ttl_millis(reset_after: Micros, min_ttl_ms: u64) -> u64 {
    reset_after
        .as_micros()
        .div_ceil(1_000)
        .max(min_ttl_ms)
        .min(MAX_MICROS)
}

#[cfg(test)]
mod tests {
    use rein_core::{
        Limit, Policy,
        fixed_window::FixedWindowState,
        sliding_counter::SlidingCounterState,
        sliding_log::{LogEntry, SlidingLogState},
        token_bucket::TokenBucketState,
    };

    use super::*;

    fn policy() -> RedisPolicy {
        let second = Micros::from_secs(1);
        let limits = [
            Limit::token_bucket(10, 1, second).unwrap(),
            Limit::fixed_window(5, second).unwrap(),
            Limit::sliding_counter(5, second).unwrap(),
            Limit::sliding_log(5, second).unwrap(),
        ];
        RedisPolicy::new("api", Policy::new(limits).unwrap()).unwrap()
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn missing_keys_read_as_full_limits_and_time_is_decoded() {
        let time = Value::Array(vec![bulk("1700000000"), bulk("123456")]);
        let replies = vec![Value::Nil, time];
        let (state, now) = decode_read(&policy(), replies, true).unwrap();
        assert_eq!(state, KeyState::Counting(policy().policy().new_state()));
        assert_eq!(now, Some(Timestamp::from_micros(1_700_000_000_123_456)));
    }

    #[test]
    fn written_values_read_back_through_the_scripts_decoder() {
        let t = Timestamp::from_micros;
        let log = SlidingLogState::from_entries([
            LogEntry { at: t(5), cost: 2 },
            LogEntry { at: t(9), cost: 1 },
        ])
        .unwrap();
        let states = [
            LimitState::TokenBucket(TokenBucketState {
                tat: t(42),
                tat_units: 7,
            }),
            LimitState::FixedWindow(FixedWindowState {
                window_start: t(1_000_000),
                count: 3,
            }),
            LimitState::SlidingCounter(SlidingCounterState {
                window_start: t(2_000_000),
                current: 1,
                previous: 4,
            }),
            LimitState::SlidingLog(log),
        ];
        let values: Vec<_> = states
            .iter()
            .map(|s| encode_value(s, None).unwrap())
            .collect();
        assert_eq!(
            values,
            ["42:7", "1000000:3", "2000000:1:4", "3:9:1|5:2,9:1"]
        );
        let joined = join_parts(values.into_iter().map(Some).collect()).unwrap();
        assert_eq!(joined, "42:7;1000000:3;2000000:1:4;3:9:1|5:2,9:1");
        let (state, now) = decode_read(&policy(), vec![bulk(&joined)], false).unwrap();
        assert_eq!(now, None);
        assert_eq!(
            state,
            KeyState::Counting(PolicyState::from_states(states).unwrap())
        );
    }

    #[test]
    fn an_empty_log_is_no_key() {
        let empty = LimitState::SlidingLog(SlidingLogState::default());
        assert_eq!(encode_value(&empty, None), None);
    }

    #[test]
    fn empty_parts_are_empty_limits_and_no_parts_no_key() {
        assert_eq!(join_parts(vec![None, None]), None);
        let joined = join_parts(vec![None, Some("1000000:3".into()), None, None]).unwrap();
        assert_eq!(joined, ";1000000:3;;");
        let (state, _) = decode_read(&policy(), vec![bulk(&joined)], false).unwrap();
        let mut expected = policy().policy().new_state();
        let fixed = FixedWindowState {
            window_start: Timestamp::from_micros(1_000_000),
            count: 3,
        };
        let limits: Vec<_> = expected
            .iter()
            .enumerate()
            .map(|(i, s)| match i {
                1 => LimitState::FixedWindow(fixed),
                _ => s.clone(),
            })
            .collect();
        expected = PolicyState::from_states(limits).unwrap();
        assert_eq!(state, KeyState::Counting(expected));
        // One limit: its value alone, no separator.
        assert_eq!(join_parts(vec![Some("42".into())]).as_deref(), Some("42"));
    }

    #[test]
    fn foreign_values_are_errors_not_full_limits() {
        for bad in [
            // Another number of parts than the policy's 4 limits.
            "",
            "abc",
            "42:7;1000000:3;2000000:1:4",
            "42:7;1000000:3;2000000:1:4;3:9:1|5:2,9:1;",
            ";;;;",
            // One part foreign: ("10" alone is a token bucket's `tat` with no remainder.)
            "1:2:3;;;",
            "a:b;;;",
            "-1:0;;;",
            // A plain counter where a fixed window's `window_start:count` belongs.
            ";10;;",
            ";;1:2;",
            ";;;5:2,9:1",
        ] {
            assert!(
                decode_read(&policy(), vec![bulk(bad)], false).is_err(),
                "{bad:?}"
            );
        }
        let not_a_string = vec![Value::Int(3)];
        assert!(decode_read(&policy(), not_a_string, false).is_err());
        let two_replies = vec![Value::Nil, Value::Nil];
        assert!(decode_read(&policy(), two_replies, false).is_err());
    }

    #[test]
    fn ttl_rounds_up_to_milliseconds_and_respects_the_minimum() {
        assert_eq!(ttl_millis(Micros::ZERO, 0), 0);
        assert_eq!(ttl_millis(Micros::from_micros(1), 0), 1);
        assert_eq!(ttl_millis(Micros::from_micros(1_001), 0), 2);
        assert_eq!(ttl_millis(Micros::ZERO, 5_000), 5_000);
    }
}
