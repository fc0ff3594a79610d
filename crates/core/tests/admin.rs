//! An operator's changes to one key, as properties: a penalty takes exactly what it says
//! from every limit (up to what is left), a key set to `remaining` has that many left in
//! each limit (up to its capacity), and a block denies until its end and no longer.

use proptest::collection::vec;
use proptest::prelude::*;
use rein_core::{Block, Limit, Micros, Policy, Timestamp};

/// Any algorithm with small numbers, so that prior traffic reaches every shape of state.
fn limit() -> impl Strategy<Value = Limit> {
    (0..4u8, 1..=12u64, 1..=5u64, 1..=3_000u64).prop_map(|(kind, capacity, refill, span)| {
        let span = Micros::from_micros(span);
        match kind {
            0 => Limit::token_bucket(capacity, refill, span),
            1 => Limit::fixed_window(capacity, span),
            2 => Limit::sliding_log(capacity, span),
            _ => Limit::sliding_counter(capacity, span),
        }
        .expect("small settings are valid")
    })
}

/// A policy of one to three limits, and earlier traffic: (µs later, cost) pairs.
fn case() -> impl Strategy<Value = (Policy, Vec<(u64, u64)>, u64, u64)> {
    (
        vec(limit(), 1..=3),
        vec((0..=800u64, 0..=4u64), 0..30),
        0..=800u64,
        0..=15u64,
    )
        .prop_map(|(limits, traffic, later, amount)| {
            let policy = Policy::new(limits).expect("1 to 3 limits");
            (policy, traffic, later, amount)
        })
}

/// Each limit's own remaining at `now`: a zero-cost peek of it alone.
fn each_remaining(policy: &Policy, state: &rein_core::PolicyState, now: Timestamp) -> Vec<u64> {
    policy
        .limits()
        .iter()
        .zip(state.iter())
        .map(|(limit, s)| limit.peek(now, s, 0).expect("its own state").remaining)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_penalty_takes_its_amount_or_what_is_left_from_every_limit(
        (policy, traffic, later, amount) in case(),
    ) {
        let mut state = policy.new_state();
        let mut now = 1_000_000u64;
        for (step, cost) in traffic {
            now += step;
            policy.acquire(Timestamp::from_micros(now), &mut state, cost.min(policy.capacity())).unwrap();
        }
        let now = Timestamp::from_micros(now + later);
        let before = each_remaining(&policy, &state, now);
        let decision = policy.penalize(now, &mut state, amount).unwrap();
        let after = each_remaining(&policy, &state, now);
        for (b, a) in before.iter().zip(&after) {
            prop_assert_eq!(*a, b - amount.min(*b));
        }
        prop_assert_eq!(decision.remaining, *after.iter().min().unwrap());
        // The state is one the policy decides on as usual: what is left is admitted.
        let left = decision.remaining;
        if left > 0 {
            prop_assert!(policy.acquire(now, &mut state, left).unwrap().is_allowed());
        }
    }

    #[test]
    fn a_key_set_to_remaining_has_that_many_left_in_each_limit(
        (policy, _traffic, later, remaining) in case(),
    ) {
        let now = Timestamp::from_micros(1_000_000 + later);
        let (state, decision) = policy.with_remaining(now, remaining).unwrap();
        let each = each_remaining(&policy, &state, now);
        for (limit, left) in policy.limits().iter().zip(&each) {
            prop_assert_eq!(*left, remaining.min(limit.capacity()));
        }
        prop_assert_eq!(decision.remaining, remaining.min(policy.capacity()));
        prop_assert_eq!(policy.is_full(now, &state), remaining >= policy.limits().iter().map(Limit::capacity).max().unwrap());
    }

    #[test]
    fn a_block_denies_until_its_end_and_then_no_longer(
        (policy, _traffic, later, _amount) in case(),
        until in 0..=5_000u64,
    ) {
        let block = Block::until(Timestamp::from_micros(until));
        let now = Timestamp::from_micros(later * 5);
        match block.decide(&policy, now) {
            Some(denied) => {
                prop_assert!(now.as_micros() < until);
                prop_assert!(!denied.is_allowed());
                prop_assert_eq!(denied.remaining, 0);
                prop_assert_eq!(denied.retry_after.as_micros(), until - now.as_micros());
                prop_assert_eq!(denied.reset_after, denied.retry_after);
                prop_assert_eq!(denied.limit, policy.limits()[0].capacity());
            }
            None => prop_assert!(now.as_micros() >= until),
        }
    }
}
