//! Reading stored state back into rein-core's types, as `RedisStore::state` does.
//!
//! The layout is the one the script writes: a HASH per token bucket (`tat`, `tat_units`),
//! fixed window (`window_start`, `count`) and sliding counter (`window_start`, `current`,
//! `previous`), and a ZSET per sliding log whose members are `"<at>:<cost>"` scored by
//! `at`. A missing key or field reads as zero, which is each state's default.

use redis::{Pipeline, Value};
use rein_core::{
    FixedWindowState, Limit, LimitState, LogEntry, MAX_MICROS, PolicyState, SlidingCounterState,
    SlidingLogState, Timestamp, TokenBucketState,
};

use crate::RedisPolicy;

/// One read per limit: `HMGET` of its fields, or `ZRANGE 0 -1` of its log.
pub(crate) fn read_pipeline(policy: &RedisPolicy, keys: &[String]) -> Pipeline {
    let mut pipe = redis::pipe();
    for (limit, key) in policy.policy().limits().iter().zip(keys) {
        match limit {
            Limit::SlidingLog(_) => pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1),
            _ => pipe.cmd("HMGET").arg(key).arg(fields(limit)),
        };
    }
    pipe
}

/// Decodes the replies of [`read_pipeline`].
pub(crate) fn decode(policy: &RedisPolicy, replies: Vec<Value>) -> Result<PolicyState, String> {
    let limits = policy.policy().limits();
    if replies.len() != limits.len() {
        return Err(format!(
            "expected {} replies, got {}",
            limits.len(),
            replies.len()
        ));
    }
    let states = limits
        .iter()
        .zip(replies)
        .map(|(limit, reply)| decode_limit(limit, reply))
        .collect::<Result<Vec<_>, _>>()?;
    PolicyState::from_states(states).ok_or_else(|| "a policy of no limits".to_owned())
}

fn decode_limit(limit: &Limit, reply: Value) -> Result<LimitState, String> {
    let Value::Array(items) = reply else {
        return Err(format!("expected an array, got {reply:?}"));
    };
    if let Limit::SlidingLog(_) = limit {
        let entries = items
            .iter()
            .map(|item| {
                let member = text(item)?.ok_or("a nil log entry")?;
                let (at, cost) = member.split_once(':').ok_or("a log entry without ':'")?;
                Ok(LogEntry {
                    at: Timestamp::from_micros(integer(at)?),
                    cost: integer(cost)?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        return SlidingLogState::from_entries(entries)
            .map(LimitState::SlidingLog)
            .map_err(|e| format!("sliding log: {e}"));
    }
    let expected = fields(limit).len();
    if items.len() != expected {
        return Err(format!("expected {expected} fields, got {}", items.len()));
    }
    let mut values = [0u64; 3];
    for (value, item) in values.iter_mut().zip(&items) {
        *value = match text(item)? {
            Some(s) => integer(&s)?,
            None => 0,
        };
    }
    let [a, b, c] = values;
    Ok(match limit {
        Limit::TokenBucket(_) => LimitState::TokenBucket(TokenBucketState {
            tat: Timestamp::from_micros(a),
            tat_units: b,
        }),
        Limit::FixedWindow(_) => LimitState::FixedWindow(FixedWindowState {
            window_start: Timestamp::from_micros(a),
            count: b,
        }),
        Limit::SlidingCounter(_) => LimitState::SlidingCounter(SlidingCounterState {
            window_start: Timestamp::from_micros(a),
            current: b,
            previous: c,
        }),
        // Returned early above; kept as an error rather than a panic.
        Limit::SlidingLog(_) => return Err("a sliding log read as a hash".to_owned()),
    })
}

/// The hash fields of a limit's state, in the order of the state type's fields.
fn fields(limit: &Limit) -> &'static [&'static str] {
    match limit {
        Limit::TokenBucket(_) => &["tat", "tat_units"],
        Limit::FixedWindow(_) => &["window_start", "count"],
        Limit::SlidingCounter(_) => &["window_start", "current", "previous"],
        Limit::SlidingLog(_) => &[],
    }
}

/// A bulk string as text, or `None` for nil.
fn text(value: &Value) -> Result<Option<String>, String> {
    match value {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => String::from_utf8(bytes.clone())
            .map(Some)
            .map_err(|_| "a field that is not UTF-8".to_owned()),
        other => Err(format!("expected a string, got {other:?}")),
    }
}

/// A decimal integer no larger than `MAX_MICROS`, as the script writes them.
fn integer(s: &str) -> Result<u64, String> {
    s.parse::<u64>()
        .ok()
        .filter(|&n| n <= MAX_MICROS && s.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("{s:?} is not a stored integer"))
}
