//! The optimistic store's Redis commands and stored values: pure encoding and decoding, no
//! I/O.
//!
//! Each limit's state is one Redis STRING under the key `key.rs` gives that limit: a format
//! byte ([`FORMAT`]) followed by rein-core's own persisted form of the limit state
//! ([`LimitState::encode`]: an algorithm tag and fixed little-endian words, or a sliding
//! log's entries). A STRING is what one `GET` reads and one `SET … PX` writes, so the
//! transaction stays two round trips whatever the algorithm; the Lua store's HASH and ZSET
//! layout would need a different read command per algorithm and a rewrite of whole logs.

use redis::{Pipeline, Value};
use rein_core::{Limit, LimitState, MAX_MICROS, Micros, PolicyState, Timestamp};

use crate::NamedPolicy;

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
    policy: &NamedPolicy,
    replies: Vec<Value>,
    time: bool,
) -> Result<(PolicyState, Option<Timestamp>), String> {
    let limits = policy.policy().limits();
    let expected = limits.len() + usize::from(time);
    if replies.len() != expected {
        return Err(format!(
            "expected {expected} replies, got {}",
            replies.len()
        ));
    }
    let mut replies = replies.into_iter();
    let mut states = Vec::with_capacity(limits.len());
    for (index, limit) in limits.iter().enumerate() {
        let reply = replies.next().ok_or("a missing reply")?;
        states.push(decode_value(limit, reply).map_err(|e| format!("limit {index}: {e}"))?);
    }
    let now = match (time, replies.next()) {
        (true, Some(reply)) => Some(decode_time(reply)?),
        _ => None,
    };
    let state = PolicyState::from_states(states).ok_or("a policy of no limits")?;
    Ok((state, now))
}

/// One limit's stored value, or a full limit for a missing key.
fn decode_value(limit: &Limit, reply: Value) -> Result<LimitState, String> {
    let bytes = match reply {
        Value::Nil => return Ok(limit.new_state()),
        Value::BulkString(bytes) => bytes,
        other => return Err(format!("expected a string, got {other:?}")),
    };
    let Some((&FORMAT, encoded)) = bytes.split_first() else {
        return Err("a value that is not rein's optimistic-store format".to_owned());
    };
    let (state, used) = LimitState::decode(encoded).map_err(|e| e.to_string())?;
    if used != encoded.len() {
        return Err("trailing bytes after the state".to_owned());
    }
    // The key names the algorithm, so a mismatch is another program's value.
    if std::mem::discriminant(&state) != std::mem::discriminant(&limit.new_state()) {
        return Err("a state of another algorithm".to_owned());
    }
    Ok(state)
}

/// The value [`decode_value`] reads back.
pub(crate) fn encode_value(state: &LimitState) -> Vec<u8> {
    let mut out = vec![FORMAT];
    state.encode(&mut out);
    out
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

/// The second round trip: `MULTI`, one `SET … PX` (or `DEL`) per changed limit, `EXEC`.
/// `writes` holds each key with its new value and TTL in ms; a TTL of zero deletes the key,
/// as the Lua store does for a limit that is full again.
pub(crate) fn write_transaction(writes: &[(&str, Vec<u8>, u64)]) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for (key, value, ttl_ms) in writes {
        if *ttl_ms == 0 {
            pipe.cmd("DEL").arg(*key);
        } else {
            pipe.cmd("SET")
                .arg(*key)
                .arg(value.as_slice())
                .arg("PX")
                .arg(*ttl_ms);
        }
    }
    pipe
}

/// A written key's TTL in ms: its limit's `reset_after` rounded up, at least `min_ttl_ms`;
/// zero means "delete it". The same rule as the Lua store's, so both free memory alike.
pub(crate) fn ttl_millis(reset_after: Micros, min_ttl_ms: u64) -> u64 {
    reset_after
        .as_micros()
        .div_ceil(1_000)
        .max(min_ttl_ms)
        .min(MAX_MICROS)
}

/// The format byte in front of every stored value. Bump it (and the default key prefix's
/// version) if the encoding ever changes, so old values fail to decode instead of being
/// misread.
pub(crate) const FORMAT: u8 = 1;

#[cfg(test)]
mod tests {
    use rein_core::{Policy, SlidingLogState, TokenBucketState};

    use super::*;

    fn policy() -> NamedPolicy {
        let limits = [
            Limit::token_bucket(10, 1, Micros::from_secs(1)).unwrap(),
            Limit::sliding_log(5, Micros::from_secs(1)).unwrap(),
        ];
        NamedPolicy::new("api", Policy::new(limits).unwrap()).unwrap()
    }

    fn bulk(bytes: Vec<u8>) -> Value {
        Value::BulkString(bytes)
    }

    #[test]
    fn missing_keys_read_as_full_limits_and_time_is_decoded() {
        let time = Value::Array(vec![bulk(b"1700000000".to_vec()), bulk(b"123456".to_vec())]);
        let (state, now) =
            decode_read(&policy(), vec![Value::Nil, Value::Nil, time], true).unwrap();
        assert_eq!(state, policy().policy().new_state());
        assert_eq!(now, Some(Timestamp::from_micros(1_700_000_000_123_456)));
    }

    #[test]
    fn values_round_trip() {
        let bucket = LimitState::TokenBucket(TokenBucketState {
            tat: Timestamp::from_micros(42),
            tat_units: 7,
        });
        let log = LimitState::SlidingLog(SlidingLogState::default());
        let replies = vec![bulk(encode_value(&bucket)), bulk(encode_value(&log))];
        let (state, now) = decode_read(&policy(), replies, false).unwrap();
        assert_eq!(now, None);
        assert_eq!(state, PolicyState::from_states([bucket, log]).unwrap());
    }

    #[test]
    fn foreign_values_are_errors_not_full_limits() {
        let bucket = encode_value(&LimitState::TokenBucket(TokenBucketState::default()));
        let cases = [
            vec![bulk(b"10".to_vec()), Value::Nil],   // a plain counter
            vec![bulk(vec![]), Value::Nil],           // empty
            vec![bulk(vec![FORMAT + 1]), Value::Nil], // a future format
            vec![Value::Nil, bulk(bucket.clone())],   // another algorithm's state
            vec![Value::Int(3), Value::Nil],          // not a string
            vec![bulk([bucket.clone(), vec![0]].concat()), Value::Nil], // trailing bytes
        ];
        for replies in cases {
            assert!(
                decode_read(&policy(), replies.clone(), false).is_err(),
                "{replies:?}"
            );
        }
    }

    #[test]
    fn ttl_rounds_up_to_milliseconds_and_respects_the_minimum() {
        assert_eq!(ttl_millis(Micros::ZERO, 0), 0);
        assert_eq!(ttl_millis(Micros::from_micros(1), 0), 1);
        assert_eq!(ttl_millis(Micros::from_micros(1_001), 0), 2);
        assert_eq!(ttl_millis(Micros::ZERO, 5_000), 5_000);
    }
}
