//! Per-key overrides in process (`MemoryStore::set_override`): a property test against an
//! oracle that replays the same steps through rein-core, one state per key and shape of
//! limits; and the cases around it (prefixes, unlimited keys, blocks, bad input, the bound).

use std::collections::HashMap;

use proptest::prelude::*;
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::overrides::{KeyMatch, MAX_OVERRIDES, Override};
use rein_core::{KeyError, Limit, Limiter, Micros, NamedPolicy, Policy, PolicyState, Timestamp};
use rein_memory::{FakeClock, MemoryStore};

/// A memory store's future, which is ready at once: its output.
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(future).poll(&mut context) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a memory store never waits"),
    }
}

fn key(k: &[u8]) -> KeyMatch {
    KeyMatch::Key(k.into())
}

fn prefix(p: &[u8]) -> KeyMatch {
    KeyMatch::Prefix(p.into())
}

/// One limit of algorithm `algorithm` (0..4) admitting `n` a minute.
fn limit(algorithm: u8, n: u64) -> Limit {
    let minute = Micros::from_secs(60);
    match algorithm % 4 {
        0 => Limit::token_bucket(n, n, minute),
        1 => Limit::fixed_window(n, minute),
        2 => Limit::sliding_log(n, minute),
        _ => Limit::sliding_counter(n, minute),
    }
    .expect("valid")
}

/// What a policy's state is kept under, the oracle's "key": its algorithms in order (all of
/// one window here: the store keeps limits of other windows apart), and for a lone token
/// bucket whether one token takes a whole number of µs (the store keeps those in 8 bytes,
/// which no other bucket shares; Redis shares every bucket's key).
fn shape(policy: &Policy) -> (Vec<&'static str>, bool) {
    let tags = policy.limits().iter().map(Limit::tag).collect();
    let whole = matches!(policy.limits(), [Limit::TokenBucket(b)] if b.emission_interval().1 == 1);
    (tags, whole)
}

#[derive(Clone, Debug)]
enum Step {
    /// Decide `cost` after `advance` µs.
    Acquire { advance: u64, cost: u64 },
    /// Give back `amount`.
    Refund { amount: u64 },
    /// An override of the key: these limits (algorithm, capacity) or unlimited.
    Set(Option<(u8, u64)>),
    /// The key's override removed.
    Remove,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..20_000_000u64, 1..4u64).prop_map(|(advance, cost)| Step::Acquire { advance, cost }),
        1 => (1..4u64).prop_map(|amount| Step::Refund { amount }),
        2 => proptest::option::weighted(0.85, (0..4u8, 3..12u64)).prop_map(Step::Set),
        1 => Just(Step::Remove),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever overrides come and go, the store answers as rein-core does on one state per
    /// key and shape: limits of the policy's algorithm decide on the key's own state (what
    /// was counted carries over when an override is set and when it is removed), other
    /// algorithms on a state of their own, and an unlimited key counts nothing.
    #[test]
    fn overrides_decide_as_rein_core_on_one_state_per_shape(
        base in (0..4u8, 3..12u64),
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let base = Policy::single(limit(base.0, base.1));
        let store = MemoryStore::new();
        let prepared = prepared(&store, "api", base.clone());
        let mut now = Timestamp::from_micros(1_000_000);
        let mut in_force: Option<Override> = None;
        let mut states: HashMap<(Vec<&'static str>, bool), PolicyState> = HashMap::new();
        for step in steps {
            match step {
                Step::Acquire { advance, cost } => {
                    now = now.saturating_add(Micros::from_micros(advance));
                    let got = ready(store.acquire(Some(now), &prepared, b"k", cost));
                    let want = match &in_force {
                        Some(Override::Unlimited) => Ok(rein_core::overrides::unlimited(&base)),
                        Some(Override::Limits(limits)) => {
                            let state = states.entry(shape(limits)).or_insert_with(|| limits.new_state());
                            limits.acquire(now, state, cost)
                        }
                        None => {
                            let state = states.entry(shape(&base)).or_insert_with(|| base.new_state());
                            base.acquire(now, state, cost)
                        }
                    };
                    match (got, want) {
                        (Ok(got), Ok(want)) => prop_assert_eq!(got, want),
                        (Err(rein_core::DecideError::InsufficientCapacity(_)), Err(rein_core::AcquireError::InsufficientCapacity(_))) => {}
                        (got, want) => prop_assert!(false, "store {:?}, rein-core {:?}", got, want),
                    }
                }
                Step::Refund { amount } => {
                    ready(store.refund(Some(now), &prepared, b"k", amount)).expect("refunded");
                    let limits = match &in_force {
                        Some(Override::Unlimited) => continue,
                        Some(Override::Limits(limits)) => limits,
                        None => &base,
                    };
                    let state = states.entry(shape(limits)).or_insert_with(|| limits.new_state());
                    limits.refund(now, state, amount).expect("same shape");
                }
                Step::Set(value) => {
                    let value = match value {
                        Some((algorithm, n)) => Override::Limits(Policy::single(limit(algorithm, n))),
                        None => Override::Unlimited,
                    };
                    let replaced = store.set_override("api", &key(b"k"), &value).expect("set");
                    prop_assert_eq!(replaced, in_force.is_some());
                    in_force = Some(value);
                }
                Step::Remove => {
                    let removed = store.remove_override("api", &key(b"k")).expect("removed");
                    prop_assert_eq!(removed, in_force.is_some());
                    in_force = None;
                }
            }
        }
    }
}

/// `policy`, named `name`, prepared by `store`.
fn prepared<L: Limiter>(store: &L, name: &str, policy: Policy) -> L::Prepared {
    let named = NamedPolicy::new(name, policy).expect("named");
    store.prepare(&named).expect("prepared")
}

fn hourly(n: u64) -> Policy {
    Policy::single(Limit::fixed_window(n, Micros::from_secs(3_600)).expect("valid"))
}

#[test]
fn a_key_beats_a_prefix_a_longer_prefix_a_shorter_and_other_policies_are_untouched() {
    let store = MemoryStore::with_clock(FakeClock::new(Timestamp::EPOCH));
    let api = prepared(&store, "api", hourly(1));
    let web = prepared(&store, "web", hourly(1));
    let over = |n| Override::Limits(hourly(n));
    store
        .set_override("api", &prefix(b"t"), &over(2))
        .expect("set");
    store
        .set_override("api", &prefix(b"tenant-"), &over(3))
        .expect("set");
    store
        .set_override("api", &key(b"tenant-7"), &over(4))
        .expect("set");
    let admitted = |policy, k: &[u8]| {
        (0..10)
            .take_while(|_| {
                ready(store.acquire(None, policy, k, 1))
                    .expect("decided")
                    .is_allowed()
            })
            .count()
    };
    assert_eq!(admitted(&api, b"tenant-7"), 4);
    assert_eq!(admitted(&api, b"tenant-8"), 3);
    assert_eq!(admitted(&api, b"tx"), 2);
    assert_eq!(admitted(&api, b"guest"), 1);
    assert_eq!(admitted(&web, b"tenant-7"), 1, "another policy's key");
    let mut listed: Vec<_> = store
        .overrides()
        .into_iter()
        .map(|e| (e.policy, e.keys, e.value.encode()))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("api".into(), key(b"tenant-7"), "fw:4:3600000000".into()),
            ("api".into(), prefix(b"t"), "fw:2:3600000000".into()),
            ("api".into(), prefix(b"tenant-"), "fw:3:3600000000".into()),
        ]
    );
}

/// An override of the policy's algorithm with another window counts apart, and limits:
/// before, it decided on the policy's table, which dropped each new state as full by the
/// policy's own window, so every request of a key first seen off that window's start began
/// afresh (unlimited).
#[test]
fn an_override_of_another_window_limits_the_key() {
    let clock = FakeClock::new(Timestamp::from_micros(3_600_000_000));
    let store = MemoryStore::with_clock(clock.clone());
    let minute = Policy::single(Limit::fixed_window(100, Micros::from_secs(60)).expect("valid"));
    let api = prepared(&store, "api", minute);
    store
        .set_override("api", &key(b"k"), &Override::Limits(hourly(3)))
        .expect("set");
    // Five minutes into the hour: off the policy's minute windows' start.
    clock.advance(Micros::from_secs(300));
    let admitted = (0..5)
        .filter(|_| {
            ready(store.acquire(None, &api, b"k", 1))
                .expect("decided")
                .is_allowed()
        })
        .count();
    assert_eq!(admitted, 3);
    // A reset forgets that count even once the override is gone: given again, it starts
    // full (before, only the table of the override in force was reset, and the old count
    // came back with the override).
    store.remove_override("api", &key(b"k")).expect("removed");
    assert!(
        ready(store.reset(&api, b"k")).expect("reset"),
        "it had a count"
    );
    store
        .set_override("api", &key(b"k"), &Override::Limits(hourly(3)))
        .expect("set again");
    assert!(
        ready(store.acquire(None, &api, b"k", 3))
            .expect("decided")
            .is_allowed()
    );
}

#[test]
fn an_unlimited_key_counts_nothing_and_a_block_still_denies_an_overridden_key() {
    let clock = FakeClock::new(Timestamp::EPOCH);
    let store = MemoryStore::with_clock(clock.clone());
    let api = prepared(&store, "api", hourly(2));
    store
        .set_override("api", &key(b"vip"), &Override::Unlimited)
        .expect("set");
    for _ in 0..100 {
        let answer = ready(store.acquire(None, &api, b"vip", 1)).expect("decided");
        assert!(answer.is_allowed());
        assert_eq!((answer.limit, answer.remaining), (2, 2));
    }
    store.remove_override("api", &key(b"vip")).expect("removed");
    assert_eq!(
        ready(store.acquire(None, &api, b"vip", 1))
            .expect("decided")
            .remaining,
        1,
        "nothing was counted while unlimited"
    );

    // A raised key, then blocked: denied with the time left, and inspected as blocked.
    store
        .set_override("api", &key(b"ann"), &Override::Limits(hourly(10)))
        .expect("set");
    assert!(
        ready(store.block(&api, b"ann", Until::For(Micros::from_secs(60)), "abuse"))
            .expect("blocked")
    );
    let denied = ready(store.acquire(None, &api, b"ann", 1)).expect("decided");
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after, Micros::from_secs(60));
    assert!(matches!(
        ready(store.inspect(&api, b"ann")),
        Ok(KeyState::Blocked { .. })
    ));
    // Setting what is left replaces the block, by the override's limits.
    let set = ready(store.set_remaining(&api, b"ann", 7)).expect("set");
    assert_eq!((set.limit, set.remaining), (10, 7));
    // Another algorithm counts in a state of its own, and reset forgets it too.
    let bucket = Policy::single(Limit::token_bucket(3, 3, Micros::from_secs(60)).expect("valid"));
    store
        .set_override("api", &key(b"ann"), &Override::Limits(bucket))
        .expect("set");
    assert_eq!(
        ready(store.acquire(None, &api, b"ann", 1))
            .expect("decided")
            .remaining,
        2
    );
    assert!(ready(store.reset(&api, b"ann")).expect("reset"));
    assert_eq!(
        ready(store.peek(None, &api, b"ann", 0))
            .expect("peeked")
            .remaining,
        3
    );
    // A block replaces what that state counted, as Redis's block replaces the other key's:
    // once it ends the key is as one never seen (before, the count resumed).
    let _ = ready(store.acquire(None, &api, b"ann", 2)).expect("decided");
    assert!(
        ready(store.block(&api, b"ann", Until::For(Micros::from_secs(1)), "abuse"))
            .expect("blocked")
    );
    clock.advance(Micros::from_secs(2));
    assert_eq!(
        ready(store.peek(None, &api, b"ann", 0))
            .expect("peeked")
            .remaining,
        3,
        "full after the block"
    );
}

#[test]
fn bad_overrides_are_typed_errors_and_the_bound_holds() {
    let store = MemoryStore::new();
    let value = Override::Limits(hourly(5));
    assert!(matches!(
        store.set_override("api", &key(b""), &value),
        Err(AdminError::InvalidKey(KeyError::Empty))
    ));
    assert!(matches!(
        store.set_override("", &key(b"k"), &value),
        Err(AdminError::InvalidOverride(_))
    ));
    for i in 0..MAX_OVERRIDES {
        store
            .set_override("api", &key(format!("k{i}").as_bytes()), &value)
            .expect("within the bound");
    }
    assert!(matches!(
        store.set_override("api", &key(b"one-more"), &value),
        Err(AdminError::InvalidOverride(_))
    ));
    // Replacing one at the bound is not one more; removing one makes room.
    let ok = |result: Result<bool, AdminError>| result.expect("written");
    assert!(ok(store.set_override(
        "api",
        &key(b"k0"),
        &Override::Unlimited
    )));
    assert!(ok(store.remove_override("api", &key(b"k1"))));
    assert!(!ok(store.remove_override("api", &key(b"k1"))));
    assert!(!ok(store.set_override("api", &key(b"one-more"), &value)));
    assert_eq!(store.overrides().len(), MAX_OVERRIDES);
}
