//! Reading stored state back into rein-core's types, as `RedisStore::state` does.
//!
//! The layout is the one the scripts write (key format `v2`): one string per limit, its
//! integers in decimal joined by `:`. A token bucket is `<tat>:<tat_units>` (or `<tat>` when
//! `tat_units` is 0), a fixed window
//! `<window_start>:<count>`, a sliding counter `<window_start>:<current>:<previous>`, and a
//! sliding log its entries oldest first, `<at>:<cost>` joined by `,`. A missing key reads as
//! each state's default (a full limit, an empty log).

use redis::{Pipeline, Value};
use rein_core::{
    FixedWindowState, Limit, LimitState, LogEntry, MAX_MICROS, PolicyState, SlidingCounterState,
    SlidingLogState, Timestamp, TokenBucketState,
};

use crate::RedisPolicy;

/// One `GET` per limit.
pub(crate) fn read_pipeline(keys: &[String]) -> Pipeline {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("GET").arg(key);
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
    let stored = match reply {
        Value::Nil => None,
        Value::BulkString(bytes) => {
            Some(String::from_utf8(bytes).map_err(|_| "a state that is not UTF-8".to_owned())?)
        }
        other => return Err(format!("expected a string, got {other:?}")),
    };
    let stored = stored.as_deref();
    Ok(match limit {
        Limit::TokenBucket(_) => {
            // `<tat>` alone when `tat_units` is 0.
            let [tat, tat_units] = match stored {
                Some(s) if !s.contains(':') => [integers::<1>(stored)?[0], 0],
                _ => integers(stored)?,
            };
            LimitState::TokenBucket(TokenBucketState {
                tat: Timestamp::from_micros(tat),
                tat_units,
            })
        }
        Limit::FixedWindow(_) => {
            let [start, count] = integers(stored)?;
            LimitState::FixedWindow(FixedWindowState {
                window_start: Timestamp::from_micros(start),
                count,
            })
        }
        Limit::SlidingCounter(_) => {
            let [start, current, previous] = integers(stored)?;
            LimitState::SlidingCounter(SlidingCounterState {
                window_start: Timestamp::from_micros(start),
                current,
                previous,
            })
        }
        Limit::SlidingLog(_) => {
            let entries = stored
                .unwrap_or("")
                .split(',')
                .filter(|entry| !entry.is_empty())
                .map(|entry| {
                    let [at, cost] = integers(Some(entry))?;
                    Ok(LogEntry {
                        at: Timestamp::from_micros(at),
                        cost,
                    })
                })
                .collect::<Result<Vec<_>, String>>()?;
            LimitState::SlidingLog(
                SlidingLogState::from_entries(entries).map_err(|e| format!("sliding log: {e}"))?,
            )
        }
    })
}

/// `N` decimal integers joined by `:`, each no larger than `MAX_MICROS`, as the scripts
/// write them; all zero for a missing key.
fn integers<const N: usize>(stored: Option<&str>) -> Result<[u64; N], String> {
    let mut values = [0u64; N];
    let Some(stored) = stored else {
        return Ok(values);
    };
    let mut parts = stored.split(':');
    for value in &mut values {
        let part = parts
            .next()
            .ok_or_else(|| format!("{stored:?}: too few fields"))?;
        *value = part
            .parse::<u64>()
            .ok()
            .filter(|&n| n <= MAX_MICROS && part.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("{part:?} is not a stored integer"))?;
    }
    if parts.next().is_some() {
        return Err(format!("{stored:?}: too many fields"));
    }
    Ok(values)
}
