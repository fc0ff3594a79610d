//! Reading stored state back into rein-core's types, as `RedisStore::state` does.
//!
//! The layout is the one the scripts write (key.rs). A limit's state is one string, its
//! integers in decimal joined by `:`. A token bucket is `<tat>:<tat_units>` (or `<tat>` when
//! `tat_units` is 0), a fixed window `<window_start>:<count>` (or, for a lone fixed window
//! small enough, one integer: integer_window.rs), a sliding counter
//! `<window_start>:<current>:<previous>`, and a sliding log a header
//! `<total>:<newest_at>:<newest_cost>|` then its entries oldest first, `<at>:<cost>` joined
//! by `,`. A policy of one limit stores that string alone (key format `v3`); a policy of
//! several stores its limits' strings in one key, in the policy's order, joined by
//! [`PART_SEPARATOR`] (`v4`), an empty part for a limit at its empty state. A missing key,
//! like an empty part, reads as each state's default (a full limit, an empty log). A key an
//! operator blocked holds `B<until>:<reason>` instead (admin.rs).

use redis::Value;
use rein_core::time::MAX_MICROS;
use rein_core::{
    Limit, LimitState, PolicyState, Timestamp,
    fixed_window::FixedWindowState,
    sliding_counter::SlidingCounterState,
    sliding_log::{LogEntry, SlidingLogState},
    token_bucket::TokenBucketState,
};

use crate::RedisPolicy;
use crate::integer_window::IntegerWindow;
use rein_core::admin::KeyState;

/// Decodes the replies of the optimistic store's read: the policy's one value (its `GET`),
/// as [`decode_value`].
pub(crate) fn decode(policy: &RedisPolicy, replies: Vec<Value>) -> Result<KeyState, String> {
    let [reply] = <[Value; 1]>::try_from(replies)
        .map_err(|replies| format!("expected 1 reply, got {}", replies.len()))?;
    decode_value(policy, stored_string(reply)?.as_deref())
}

/// A `GET`'s reply: the value as text, `None` for no key.
pub(crate) fn stored_string(reply: Value) -> Result<Option<String>, String> {
    match reply {
        Value::Nil => Ok(None),
        Value::BulkString(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| "a state that is not UTF-8".to_owned()),
        other => Err(format!("expected a string, got {other:?}")),
    }
}

/// A policy's one value: an operator's block (admin.rs), or its limits' states, split into
/// the limits' parts when it has several.
pub(crate) fn decode_value(policy: &RedisPolicy, stored: Option<&str>) -> Result<KeyState, String> {
    if let Some(blocked) = stored.and_then(crate::admin::parse_block) {
        let (block, reason) = blocked?;
        return Ok(KeyState::Blocked { block, reason });
    }
    let limits = policy.policy().limits();
    let states = match (limits, stored) {
        ([limit], stored) => vec![decode_limit(limit, policy.integer_window(), stored)?],
        (limits, None) => limits
            .iter()
            .map(|limit| decode_limit(limit, None, None))
            .collect::<Result<Vec<_>, _>>()?,
        (limits, Some(stored)) => {
            let parts: Vec<&str> = stored.split(PART_SEPARATOR).collect();
            if parts.len() != limits.len() {
                return Err(format!(
                    "{stored:?}: {} parts for a policy of {} limits",
                    parts.len(),
                    limits.len()
                ));
            }
            limits
                .iter()
                .zip(parts)
                .map(|(limit, part)| {
                    decode_limit(limit, None, Some(part).filter(|p| !p.is_empty()))
                })
                .collect::<Result<Vec<_>, _>>()?
        }
    };
    PolicyState::from_states(states)
        .map(KeyState::Counting)
        .ok_or_else(|| "a policy of no limits".to_owned())
}

fn decode_limit(
    limit: &Limit,
    integer_window: Option<IntegerWindow>,
    stored: Option<&str>,
) -> Result<LimitState, String> {
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
        Limit::FixedWindow(_) => LimitState::FixedWindow(match (integer_window, stored) {
            (Some(layout), Some(value)) => layout.decode(value)?,
            (Some(_), None) => FixedWindowState::default(),
            (None, _) => {
                let [start, count] = integers(stored)?;
                FixedWindowState {
                    window_start: Timestamp::from_micros(start),
                    count,
                }
            }
        }),
        Limit::SlidingCounter(_) => {
            let [start, current, previous] = integers(stored)?;
            LimitState::SlidingCounter(SlidingCounterState {
                window_start: Timestamp::from_micros(start),
                current,
                previous,
            })
        }
        Limit::SlidingLog(_) => LimitState::SlidingLog(sliding_log(stored)?),
    })
}

/// A sliding log: the header `<total>:<newest_at>:<newest_cost>|`, then the entries oldest
/// first, `<at>:<cost>` joined by `,`, the header checked against them; an empty log for a
/// missing key.
fn sliding_log(stored: Option<&str>) -> Result<SlidingLogState, String> {
    let Some(stored) = stored else {
        return Ok(SlidingLogState::default());
    };
    let (header, list) = stored
        .split_once('|')
        .ok_or_else(|| format!("{stored:?}: no header"))?;
    let [total, newest_at, newest_cost] = integers(Some(header))?;
    let entries = list
        .split(',')
        .map(|entry| {
            let [at, cost] = integers(Some(entry))?;
            Ok(LogEntry {
                at: Timestamp::from_micros(at),
                cost,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let sum = entries
        .iter()
        .try_fold(0u64, |sum, e| sum.checked_add(e.cost));
    let newest = entries.last().map(|e| (e.at.as_micros(), e.cost));
    if sum != Some(total) || newest != Some((newest_at, newest_cost)) {
        return Err(format!("{stored:?}: the header does not match the entries"));
    }
    SlidingLogState::from_entries(entries).map_err(|e| format!("sliding log: {e}"))
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

/// Joins the limits' states in a policy's one value (key format `v4`). No limit's state
/// uses it (they hold digits, `:`, `|` and `,`), so splitting on it is unambiguous without
/// escaping, in Lua (one plain `string.find` per limit) as here.
pub(crate) const PART_SEPARATOR: char = ';';

/// The hash `lua/lease_rate.lua` keeps in a token bucket's key while it is leased as rate,
/// decoded as rein-core's `RateState`: the field `s` is `drawn:at:next_id`, each `n<node>`
/// a share's nine numbers in `Share`'s order; shares ordered by node, as the core keeps
/// them. `Err` names what does not read.
pub(crate) fn decode_rate_state(
    fields: Vec<(String, String)>,
) -> Result<rein_core::rate_share::RateState, String> {
    use rein_core::rate_share::{RATE_PARTS, RateState, Share};

    let in_field = |field: &str, e: String| format!("rate share field {field:?}: {e}");
    let mut state = RateState::default();
    for (field, value) in fields {
        if field == "s" {
            let n = integers::<3>(Some(&value)).map_err(|e| in_field(&field, e))?;
            (state.drawn, state.at, state.next_id) = (n[0], Timestamp::from_micros(n[1]), n[2]);
            continue;
        }
        let node = field
            .strip_prefix('n')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("rate share field {field:?} names no node"))?;
        let n = integers::<9>(Some(&value)).map_err(|e| in_field(&field, e))?;
        // A share is a part of the whole rate, in thousandths: never more than all of it.
        if n[2] > RATE_PARTS || n[7] > RATE_PARTS {
            return Err(format!(
                "rate share field {field:?} holds more than the whole rate"
            ));
        }
        state.shares.push(Share {
            node,
            id: n[0],
            burst: n[1],
            parts: n[2],
            until: Timestamp::from_micros(n[3]),
            demand: n[4],
            seq: n[5],
            hold_burst: n[6],
            hold_parts: n[7],
            hold_until: Timestamp::from_micros(n[8]),
        });
    }
    state.shares.sort_by_key(|s| s.node);
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_log_is_read_only_with_a_header_that_matches_its_entries() {
        let log = sliding_log(Some("3:9:1|5:2,9:1")).expect("a v3 log");
        let entries: Vec<_> = log.entries().map(|e| (e.at.as_micros(), e.cost)).collect();
        assert_eq!(entries, [(5, 2), (9, 1)]);
        assert_eq!(sliding_log(None), Ok(SlidingLogState::default()));
        for (stored, why) in [
            ("5:2,9:1", "no header (key format v2)"),
            ("4:9:1|5:2,9:1", "a total the entries do not sum to"),
            ("3:5:2|5:2,9:1", "a newest entry that is not the last"),
            ("3:9:2|5:2,9:1", "the newest entry's cost"),
            ("0:0:0|", "a header without entries"),
            ("3:9:1|5:2,9:1,", "a trailing ','"),
            ("3:9:1|9:1,5:2", "entries out of order"),
        ] {
            assert!(sliding_log(Some(stored)).is_err(), "{why}: {stored:?} read");
        }
    }

    #[test]
    fn a_rate_share_reads_only_stored_integers_and_parts_of_the_whole_rate() {
        let field = |f: &str, v: &str| vec![(f.to_owned(), v.to_owned())];
        let state = decode_rate_state(field("n2", "1:5:400:9:3:1:0:0:0")).expect("a share");
        assert_eq!((state.shares[0].node, state.shares[0].parts), (2, 400));
        for (fields, why) in [
            (
                field("n2", "1:5:1001:9:3:1:0:0:0"),
                "parts past the whole rate",
            ),
            (
                field("n2", "1:5:0:9:3:1:0:1001:0"),
                "held parts past the whole rate",
            ),
            (field("n2", "1:5:+4:9:3:1:0:0:0"), "a sign"),
            (field("n2", "1:5:4:9:3:1:0:0"), "too few numbers"),
            (field("s", "1:2:3:4"), "too many numbers"),
            (field("s", "9007199254740993:0:0"), "past 2^53"),
            (field("x2", "1:5:4:9:3:1:0:0:0"), "no node"),
        ] {
            assert!(decode_rate_state(fields).is_err(), "{why} read");
        }
    }
}
