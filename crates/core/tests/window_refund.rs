//! Returns into a window (`refund_in_window`, what a lease gives back), as a property: a
//! fixed window and a sliding counter that lend blocks (units taken at once, spent one by
//! one until the block's window ends) and get the unused rest back at *any* later time,
//! however late, mixed with plain admissions, admit in real use no more than the limit
//! allows. Real uses (direct admissions, and each spent unit at the instant it was spent),
//! replayed in time order through a fresh limit of the same kind, are all admitted.
//!
//! A plain `refund` at the return's arrival fails this as soon as a return arrives in a
//! later window than the one that counted its units: the last test shows the property
//! bites, finding such a world among the generated ones for each kind.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use rein_core::{
    Algorithm, Micros, Timestamp, fixed_window::FixedWindow, sliding_counter::SlidingCounter,
};

/// One step of a world: time passes, a direct request, or a block is taken.
#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(u64),
    Direct(u64),
    /// A block of `units`; `spend` of them are used, spread until the block's window ends;
    /// the rest goes back `delay` µs after the block was taken (possibly windows later).
    Block {
        units: u64,
        spend: u64,
        delay: u64,
    },
}

fn ops(window: u64) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        (0..window / 2).prop_map(Op::Advance),
        (1u64..4).prop_map(Op::Direct),
        (1u64..12, 0u64..12, 0..3 * window).prop_map(|(units, spend, delay)| Op::Block {
            units,
            spend,
            delay,
        }),
    ];
    vec(op, 1..80)
}

/// A limit, its window (µs), and the steps of one world of that window.
fn worlds() -> impl Strategy<Value = (u64, u64, Vec<Op>)> {
    (1u64..30, 1_000u64..50_000).prop_flat_map(|(l, w)| (Just(l), Just(w), ops(w)))
}

fn at(us: u64) -> Timestamp {
    Timestamp::from_micros(us)
}

/// Runs `ops` against a limit with `acquire`, `refund_in_window` (via `give_back`, the
/// limit's own method) and a replay of the real uses through `check` (a fresh limit of the
/// same kind): the number of real uses the fresh limit refuses.
fn world<A: Algorithm>(
    limit: A,
    window: u64,
    ops: &[Op],
    give_back: impl Fn(&A, Timestamp, &mut A::State, u64, Timestamp),
) -> usize {
    let acquire = |t, s: &mut A::State, c| limit.acquire(t, s, c).is_ok_and(|d| d.is_allowed());
    let check = |t, s: &mut A::State| acquire(t, s, 1);
    let mut state = A::State::default();
    let mut now = 1_000_000_000;
    // (instant, units) of every real use, and the pending returns (due, unused, stamp).
    let mut uses: Vec<(u64, u64)> = Vec::new();
    let mut returns: Vec<(u64, u64, u64)> = Vec::new();
    let settle = |now: u64, state: &mut A::State, returns: &mut Vec<(u64, u64, u64)>| {
        returns.sort_unstable();
        while returns.first().is_some_and(|r| r.0 <= now) {
            let (due, unused, stamp) = returns.remove(0);
            give_back(&limit, at(due), state, unused, at(stamp));
        }
    };
    for op in ops {
        match *op {
            Op::Advance(us) => now += us,
            Op::Direct(cost) => {
                settle(now, &mut state, &mut returns);
                if acquire(at(now), &mut state, cost) {
                    uses.push((now, cost));
                }
            }
            Op::Block {
                units,
                spend,
                delay,
            } => {
                settle(now, &mut state, &mut returns);
                if acquire(at(now), &mut state, units) {
                    // Spent one by one, evenly, before the window ends.
                    let end = now - now % window + window;
                    let spend = spend.min(units);
                    for i in 0..spend {
                        uses.push((now + (end - now) * i / spend.max(1), 1));
                    }
                    returns.push((now + delay, units - spend, now));
                }
            }
        }
    }
    let end = now + 4 * window;
    settle(end, &mut state, &mut returns);
    uses.sort_unstable();
    let mut fresh = A::State::default();
    uses.iter()
        .flat_map(|&(t, cost)| std::iter::repeat_n(t, cost as usize))
        .filter(|&t| !check(at(t), &mut fresh))
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_fixed_window_lending_blocks_admits_no_more_than_its_limit_in_real_use(
        (limit, window, ops) in worlds()
    ) {
        let fw = FixedWindow::new(limit, Micros::from_micros(window)).unwrap();
        prop_assert_eq!(world(fw, window, &ops, FixedWindow::refund_in_window), 0);
    }

    #[test]
    fn a_sliding_counter_lending_blocks_admits_no_more_than_its_limit_in_real_use(
        (limit, window, ops) in worlds()
    ) {
        let sc = SlidingCounter::new(limit, Micros::from_micros(window)).unwrap();
        prop_assert_eq!(world(sc, window, &ops, SlidingCounter::refund_in_window), 0);
    }
}

/// The negative control: with a plain `refund` at the return's arrival in place of
/// `refund_in_window`, some generated world over-admits, for each kind. (A property that
/// no give-back could fail would pass the tests above for nothing.)
#[test]
fn a_plain_refund_at_arrival_fails_the_property_for_both_kinds() {
    fn plain<A: Algorithm>(
        limit: &A,
        now: Timestamp,
        state: &mut A::State,
        unused: u64,
        _: Timestamp,
    ) {
        limit.refund(now, state, unused);
    }
    let mut runner = TestRunner::deterministic();
    let mut failed = [false; 2];
    for _ in 0..512 {
        let (limit, window, ops) = worlds().new_tree(&mut runner).expect("a world").current();
        let span = Micros::from_micros(window);
        let fw = FixedWindow::new(limit, span).expect("valid");
        let sc = SlidingCounter::new(limit, span).expect("valid");
        failed[0] |= world(fw, window, &ops, plain) > 0;
        failed[1] |= world(sc, window, &ops, plain) > 0;
        if failed == [true; 2] {
            return;
        }
    }
    panic!("no world caught a plain refund (fixed window, sliding counter): {failed:?}");
}
