//! An operator's changes to one key of a policy (rein-core's `KeyAdmin`, which says what
//! they mean): the changes ([`Change`]) and their new value, pure; `RedisStore`'s
//! implementation of `KeyAdmin` (store.rs) does the I/O.
//!
//! A change is a compare-and-set (lua/admin.lua): read the key and the server's clock,
//! compute the new value with rein-core itself ([`Policy::penalize`],
//! [`Policy::with_remaining`], [`Block`]), and write it only if the key still holds what was
//! read; a decision that ran in between makes the write fail and the change start again.
//! So the algorithms exist once, in rein-core, and no decision is lost or counted twice.
//!
//! A block is stored in the policy's key in place of its state: `B<until>:<reason>`, with
//! the key's TTL ending when the block does. Every state the scripts write starts with a
//! digit, so a script recognises a block only where its state did not parse, at no cost on
//! the common path (lua/preamble.lua, `block_left`).

use rein_core::admin::{KeyState, Until};
use rein_core::{AcquireError, Block, Decision, Policy, PolicyState, Timestamp};

use crate::RedisPolicy;

/// What an operator does to one key.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Change<'a> {
    /// [`Policy::penalize`] by this amount. A blocked key is left blocked.
    Penalize(u64),
    /// [`Policy::with_remaining`]: this many left in every limit. Replaces a block.
    SetRemaining(u64),
    /// Blocks the key until the instant, replacing its state or an earlier block.
    Block { until: Until, reason: &'a str },
    /// Lifts a block that holds: the key is then as one never seen.
    Unblock,
}

/// What a change did: the figures after it, or for a block and an unblock whether it
/// changed anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Changed {
    /// The figures of a zero-cost decision after the change (a block's denial, if blocked).
    Figures(Decision),
    /// `true`: the key was blocked (by `Block`) or unblocked (by `Unblock`); `false` for an
    /// unblock of a key that held no block.
    Done(bool),
}

/// The value to write (`None`: delete the key) and its TTL in ms.
pub(crate) type Write = (Option<String>, u64);

/// The change's outcome on `current` at `now`, and the write it needs (`None`: nothing).
pub(crate) fn apply(
    policy: &RedisPolicy,
    current: KeyState,
    now: Timestamp,
    change: Change<'_>,
    min_ttl_ms: u64,
) -> Result<(Changed, Option<Write>), AcquireError> {
    let rules: &Policy = policy.policy();
    // A block that has ended is a key never seen.
    let current = match current {
        KeyState::Blocked { block, .. } if !block.holds_at(now) => {
            KeyState::Counting(rules.new_state())
        }
        current => current,
    };
    let counted = |state: &PolicyState, before: Option<&PolicyState>| {
        crate::optimistic::codec::encode_policy(policy, now, state, before, min_ttl_ms)
    };
    Ok(match (change, current) {
        (Change::Penalize(_), KeyState::Blocked { block, .. }) => {
            let denial = block
                .decide(rules, now)
                .ok_or(AcquireError::StateMismatch)?;
            (Changed::Figures(denial), None)
        }
        (Change::Penalize(amount), KeyState::Counting(mut state)) => {
            let before = state.clone();
            let figures = rules.penalize(now, &mut state, amount)?;
            let write = (state != before)
                .then(|| counted(&state, Some(&before)))
                .transpose()?;
            (Changed::Figures(figures), write)
        }
        (Change::SetRemaining(remaining), _) => {
            let (state, figures) = rules.with_remaining(now, remaining)?;
            (Changed::Figures(figures), Some(counted(&state, None)?))
        }
        (Change::Block { until, reason }, _) => {
            let until = match until {
                Until::At(until) => until,
                Until::For(span) => now.saturating_add(span),
            };
            let block = Block::until(until);
            match block.holds_at(now) {
                true => {
                    let ttl = until.saturating_since(now).as_micros().div_ceil(1_000);
                    (
                        Changed::Done(true),
                        Some((Some(block_value(until, reason)), ttl)),
                    )
                }
                // A block that would already have ended blocks nothing.
                false => (Changed::Done(false), None),
            }
        }
        (Change::Unblock, KeyState::Blocked { .. }) => (Changed::Done(true), Some((None, 0))),
        (Change::Unblock, KeyState::Counting(_)) => (Changed::Done(false), None),
    })
}

/// The reply of lua/admin.lua's `read`: the server's clock and the key's value.
pub(crate) fn decode_read(reply: redis::Value) -> Result<(Timestamp, Option<String>), String> {
    use redis::Value;
    let Value::Array(parts) = reply else {
        return Err(format!("expected an array, got {reply:?}"));
    };
    let mut parts = parts.into_iter();
    let (Some(Value::Int(now)), value, None) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected the clock and the value".to_owned());
    };
    let now = u64::try_from(now).map_err(|_| format!("a clock of {now}"))?;
    let value = crate::state::stored_string(value.unwrap_or(Value::Nil))?;
    Ok((Timestamp::from_micros(now), value))
}

/// A block's stored value: `B<until>:<reason>`.
fn block_value(until: Timestamp, reason: &str) -> String {
    format!("B{}:{reason}", until.as_micros())
}

/// A stored value read as a block: `None` if it is not one (it does not start with `B`),
/// an error if it starts like one but does not parse.
pub(crate) fn parse_block(stored: &str) -> Option<Result<(Block, String), String>> {
    let rest = stored.strip_prefix('B')?;
    Some(
        rest.split_once(':')
            .and_then(|(digits, reason)| {
                // Digits only, as the scripts' `^B(%d+):` reads it (Rust's parse takes a '+').
                let until: u64 = digits
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| digits.parse().ok())??;
                (until <= rein_core::time::MAX_MICROS).then(|| {
                    (
                        Block::until(Timestamp::from_micros(until)),
                        reason.to_owned(),
                    )
                })
            })
            .ok_or_else(|| format!("{stored:?}: not a block")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rein_core::{Limit, Micros, NamedPolicy};

    fn policy() -> RedisPolicy {
        let policy = Policy::single(Limit::fixed_window(10, Micros::from_secs(60)).unwrap());
        RedisPolicy::prepare(&NamedPolicy::new("p", policy).unwrap())
    }

    #[test]
    fn a_block_reads_back_and_other_values_are_not_blocks() {
        let value = block_value(Timestamp::from_micros(42), "abuse: 10 bad logins");
        let (block, reason) = parse_block(&value).unwrap().unwrap();
        assert_eq!(block.ends_at(), Timestamp::from_micros(42));
        assert_eq!(reason, "abuse: 10 bad logins");
        assert!(parse_block("12:3").is_none());
        for bad in [
            "B",
            "Bx:y",
            "B12",
            "B-1:r",
            "B+1:r",
            "B99999999999999999999:r",
        ] {
            assert!(parse_block(bad).unwrap().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_block_for_the_past_writes_nothing_and_an_unblock_only_lifts_a_block() {
        let now = Timestamp::from_micros(1_000_000);
        let full = KeyState::Counting(policy().policy().new_state());
        let past = Change::Block {
            until: Until::At(now),
            reason: "",
        };
        assert_eq!(
            apply(&policy(), full.clone(), now, past, 0).unwrap(),
            (Changed::Done(false), None)
        );
        let (changed, write) = apply(&policy(), full.clone(), now, Change::Unblock, 0).unwrap();
        assert_eq!((changed, write), (Changed::Done(false), None));
        let block = Change::Block {
            until: Until::For(Micros::from_micros(2_500_001)),
            reason: "r",
        };
        let (_, write) = apply(&policy(), full, now, block, 0).unwrap();
        // 2.500001 s, rounded up to whole ms: the key outlives the block by under 1 ms.
        assert_eq!(write, Some((Some("B3500001:r".to_owned()), 2_501)));
    }
}
