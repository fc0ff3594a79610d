//! Contract: with room for every key, `MemoryLimiter` answers exactly as rein-core does on
//! a plain `HashMap` of one `PolicyState` per key, for any sequence of acquires (with or
//! without figures), peeks, refunds and clock moves (backwards included), and for every
//! algorithm.

use std::collections::HashMap;

use proptest::prelude::*;
use rein_core::{Limit, Micros, Policy, PolicyState, Timestamp};
use rein_memory::MemoryLimiter;

#[derive(Clone, Debug)]
enum Op {
    Acquire {
        key: u8,
        cost: u64,
    },
    /// `try_acquire_at`, against the outcome of the model's `acquire`.
    TryAcquire {
        key: u8,
        cost: u64,
    },
    Peek {
        key: u8,
        cost: u64,
    },
    Refund {
        key: u8,
        amount: u64,
    },
    /// Moves the clock forward, in µs.
    Advance(u64),
    /// Moves the clock backward, in µs.
    Rewind(u64),
}

/// The naive model: rein-core applied to a map the test owns.
struct Model {
    policy: Policy,
    states: HashMap<u8, PolicyState>,
}

impl Model {
    fn state(&mut self, key: u8) -> &mut PolicyState {
        let policy = &self.policy;
        self.states.entry(key).or_insert_with(|| policy.new_state())
    }
}

fn policies() -> Vec<Policy> {
    let ms = Micros::from_millis;
    vec![
        Policy::single(Limit::token_bucket(5, 2, ms(1_000)).unwrap()),
        // An emission interval that is not a whole number of µs (3 per second).
        Policy::single(Limit::token_bucket(4, 3, ms(1_000)).unwrap()),
        Policy::single(Limit::fixed_window(4, ms(1_000)).unwrap()),
        Policy::single(Limit::sliding_log(4, ms(1_000)).unwrap()),
        Policy::single(Limit::sliding_counter(6, ms(1_000)).unwrap()),
        Policy::new([
            Limit::token_bucket(3, 1, ms(500)).unwrap(),
            Limit::sliding_log(5, ms(2_000)).unwrap(),
            Limit::fixed_window(7, ms(3_000)).unwrap(),
        ])
        .unwrap(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    // Costs up to 8 exceed every capacity above, so errors are compared too.
    prop_oneof![
        4 => (key.clone(), 0..=8u64).prop_map(|(key, cost)| Op::Acquire { key, cost }),
        2 => (key.clone(), 0..=8u64).prop_map(|(key, cost)| Op::TryAcquire { key, cost }),
        1 => (key.clone(), 0..=8u64).prop_map(|(key, cost)| Op::Peek { key, cost }),
        1 => (key, 0..=4u64).prop_map(|(key, amount)| Op::Refund { key, amount }),
        2 => prop_oneof![0..1_000u64, 0..3_000_000u64].prop_map(Op::Advance),
        1 => prop_oneof![0..1_000u64, 0..2_000_000u64].prop_map(Op::Rewind),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn store_answers_as_the_core_does_on_a_map(
        which in 0..policies().len(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let policy = policies().swap_remove(which);
        let limiter = MemoryLimiter::<u8>::new(policy.clone());
        let mut model = Model { policy: policy.clone(), states: HashMap::new() };
        let mut now = START;
        for (step, op) in ops.iter().enumerate() {
            let t = Timestamp::from_micros(now);
            match *op {
                Op::Acquire { key, cost } => {
                    let want = policy.acquire(t, model.state(key), cost);
                    prop_assert_eq!(limiter.acquire_at(t, &key, cost), want, "step {} {:?}", step, op);
                }
                Op::TryAcquire { key, cost } => {
                    let want = policy.acquire(t, model.state(key), cost).map(|d| d.outcome);
                    prop_assert_eq!(limiter.try_acquire_at(t, &key, cost), want, "step {} {:?}", step, op);
                }
                Op::Peek { key, cost } => {
                    let want = policy.peek(t, model.state(key), cost);
                    prop_assert_eq!(limiter.peek_at(t, &key, cost), want, "step {} {:?}", step, op);
                }
                Op::Refund { key, amount } => {
                    let want = policy.refund(t, model.state(key), amount);
                    prop_assert_eq!(limiter.refund_at(t, &key, amount), want, "step {} {:?}", step, op);
                }
                Op::Advance(us) => now += us,
                Op::Rewind(us) => now = now.saturating_sub(us),
            }
        }
        // And they end in the same place for every key, stored or not.
        let t = Timestamp::from_micros(now);
        for key in 0..KEYS {
            let want = policy.peek(t, model.state(key), 1);
            prop_assert_eq!(limiter.peek_at(t, &key, 1), want, "final peek of key {}", key);
        }
    }
}

/// Keys the operations spread over: few, so they meet often.
const KEYS: u8 = 4;
/// The clock's start, in µs: mid-2023, far from zero so rewinds stay in range.
const START: u64 = 1_690_000_000_000_000;
