//! The sliding log's held units (leases, docs/leases.md "Sliding log"), as properties.
//!
//! 1. Decision by decision, a log driven by plain and held acquires, peeks, refunds and
//!    held refunds agrees with a brute-force oracle: a map of stamps, counting every stamp
//!    after `now − window` (future ones included), with exact `retry_after` and
//!    `reset_after`.
//! 2. The definition holds for *real use instants*: units taken with `acquire_held` and
//!    spent at any instant up to `now + hold` (the unused ones given back from their stamp
//!    at any later time), mixed with plain admissions, never put more than `limit` into any
//!    span `(a − window, a]`.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;
use rein_core::{
    Algorithm, Micros, Timestamp,
    sliding_log::{SlidingLog, SlidingLogState},
};

#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(u64),
    Acquire(u64),
    Peek(u64),
    Held {
        cost: u64,
        hold: u64,
    },
    /// Gives back `amount` from the stamp of the `pick`-th held acquire so far (modulo).
    RefundHeld {
        amount: u64,
        pick: usize,
    },
    Refund(u64),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn held_units_agree_with_a_map_of_stamps((limit, window, ops) in case()) {
        let log = SlidingLog::new(limit, Micros::from_micros(window)).unwrap();
        let mut state = SlidingLogState::default();
        let mut oracle = Stamps { window, stamps: BTreeMap::new() };
        let mut held_stamps = Vec::new();
        let mut now = 1_000u64;
        for (i, op) in ops.into_iter().enumerate() {
            let (cost, stamp, write) = match op {
                Op::Advance(d) => {
                    now += d;
                    continue;
                }
                Op::Refund(amount) => {
                    log.refund(at(now), &mut state, amount);
                    oracle.refund(now, amount);
                    continue;
                }
                Op::RefundHeld { amount, pick } => {
                    if let Some(&stamp) = held_stamps.get(pick % held_stamps.len().max(1)) {
                        log.refund_held(at(now), &mut state, amount, at(stamp));
                        oracle.refund_held(stamp, amount);
                    }
                    continue;
                }
                Op::Acquire(cost) => (cost, oracle.stamp_at(now), true),
                Op::Peek(cost) => (cost, oracle.stamp_at(now), false),
                Op::Held { cost, hold } => (cost, now + hold, true),
            };
            let decision = match op {
                Op::Acquire(_) => log.acquire(at(now), &mut state, cost),
                Op::Peek(_) => log.peek(at(now), &state, cost),
                _ => {
                    let Op::Held { hold, .. } = op else { unreachable!() };
                    log.acquire_held(at(now), &mut state, cost, Micros::from_micros(hold))
                }
            }
            .unwrap();
            let admits = oracle.live(now) + cost <= limit;
            prop_assert_eq!(decision.is_allowed(), admits, "op {} {:?} at {}", i, op, now);
            let mut after = oracle.clone();
            if admits && cost > 0 {
                *after.stamps.entry(stamp).or_default() += cost;
            }
            prop_assert_eq!(decision.remaining, limit - after.live(now), "op {} remaining", i);
            let retry = decision.retry_after.as_micros();
            if admits {
                prop_assert_eq!(retry, 0);
            } else {
                prop_assert!(oracle.live(now + retry) + cost <= limit, "op {}: retry soon", i);
                prop_assert!(oracle.live(now + retry - 1) + cost > limit, "op {}: late", i);
            }
            let reset = decision.reset_after.as_micros();
            prop_assert_eq!(after.live(now + reset), 0, "op {}: reset_after too soon", i);
            prop_assert!(reset == 0 || after.live(now + reset - 1) > 0, "op {}: late", i);
            if write {
                if admits && cost > 0 && matches!(op, Op::Held { .. }) {
                    held_stamps.push(stamp);
                }
                oracle = after;
            }
            prop_assert_eq!(log.is_full(at(now), &state), oracle.live(now) == 0);
        }
    }

    #[test]
    fn units_spent_no_later_than_their_stamp_keep_every_span_within_the_limit(
        (limit, window, ops) in case(),
        spend in vec(0..=1_000u64, 64),
    ) {
        let log = SlidingLog::new(limit, Micros::from_micros(window)).unwrap();
        let mut state = SlidingLogState::default();
        let mut now = 1_000u64;
        // Leases still open: (stamp, unused units), and every real use instant.
        let mut open: Vec<(u64, u64)> = Vec::new();
        let mut uses: Vec<u64> = Vec::new();
        let mut spend = spend.into_iter().cycle();
        for op in ops {
            match op {
                Op::Advance(d) => now += d,
                Op::Acquire(cost) if log.acquire(at(now), &mut state, cost).unwrap().is_allowed() => {
                    uses.extend(std::iter::repeat_n(now, cost as usize));
                }
                Op::Held { cost, hold } => {
                    let decision =
                        log.acquire_held(at(now), &mut state, cost, Micros::from_micros(hold));
                    if decision.unwrap().is_allowed() && cost > 0 {
                        open.push((now + hold, cost));
                    }
                }
                Op::RefundHeld { amount, pick } if !open.is_empty() => {
                    // Spend some of a lease at instants in [now, stamp], then give back
                    // some of the rest (the lease is over).
                    let (stamp, units) = open.swap_remove(pick % open.len());
                    let used = amount.min(units);
                    for _ in 0..used {
                        let offset = spend.next().unwrap_or(0) % (stamp.saturating_sub(now) + 1);
                        if now <= stamp {
                            uses.push(now + offset);
                        }
                    }
                    log.refund_held(at(now), &mut state, units - used, at(stamp));
                }
                _ => {}
            }
        }
        uses.sort_unstable();
        for (i, &a) in uses.iter().enumerate() {
            let inside = uses[..=i].iter().filter(|&&u| u + window > a).count()
                + uses[i + 1..].iter().take_while(|&&u| u == a).count();
            prop_assert!(inside as u64 <= limit, "{} units in the span ending at {}", inside, a);
        }
    }
}

/// The oracle: stamps and their costs, never forgotten.
#[derive(Clone, Debug)]
struct Stamps {
    window: u64,
    stamps: BTreeMap<u64, u64>,
}

impl Stamps {
    fn live(&self, now: u64) -> u64 {
        self.stamps
            .iter()
            .filter(|&(&t, _)| t + self.window > now)
            .map(|(_, &c)| c)
            .sum()
    }

    fn stamp_at(&self, now: u64) -> u64 {
        self.stamps.keys().next_back().map_or(now, |&t| t.max(now))
    }

    fn refund(&mut self, now: u64, mut amount: u64) {
        while amount > 0 {
            let Some((&t, c)) = self.stamps.iter_mut().next_back() else {
                break;
            };
            if t + self.window <= now {
                break;
            }
            let taken = amount.min(*c);
            *c -= taken;
            amount -= taken;
            if *c == 0 {
                self.stamps.remove(&t);
            }
        }
    }

    fn refund_held(&mut self, stamp: u64, amount: u64) {
        if let Some(c) = self.stamps.get_mut(&stamp) {
            *c -= amount.min(*c);
            if *c == 0 {
                self.stamps.remove(&stamp);
            }
        }
    }
}

fn at(micros: u64) -> Timestamp {
    Timestamp::from_micros(micros)
}

/// A limit of 1 to 6 in a window of 1 to 400 µs, and up to 80 operations with holds up to
/// a window and steps mostly within a quarter window.
fn case() -> impl Strategy<Value = (u64, u64, Vec<Op>)> {
    (1..=6u64, 1..=400u64).prop_flat_map(|(limit, window)| {
        let cost = 0..=limit;
        let step = prop_oneof![3 => 0..=window / 4 + 1, 1 => 0..=2 * window];
        let op = prop_oneof![
            3 => step.prop_map(Op::Advance),
            2 => cost.clone().prop_map(Op::Acquire),
            1 => cost.clone().prop_map(Op::Peek),
            3 => (cost.clone(), 0..=window).prop_map(|(cost, hold)| Op::Held { cost, hold }),
            2 => (0..=limit, 0..8usize).prop_map(|(amount, pick)| Op::RefundHeld { amount, pick }),
            1 => cost.prop_map(Op::Refund),
        ];
        (Just(limit), Just(window), vec(op, 1..80))
    })
}
