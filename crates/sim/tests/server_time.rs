//! rein-redis's store on the server's clock, decision by decision, against rein-core.
//!
//! rein-redis's own differential test (`crates/redis-store/tests/differential.rs`) passes
//! every `now` to the scripts, because a real Redis's `TIME` cannot be set. The paths that
//! read `TIME` (what `RedisStore::acquire` and a lease's `acquire_held(None, ..)` use) and
//! the calls that carry several coalesced decisions are pinned here instead, on the
//! simulated Redis, whose `TIME` is a clock this test moves and whose Lua and commands are
//! pinned to Redis 7's replies by `tests/differential.rs`. The store is rein-redis's own,
//! unmodified, over redis-rs, with the default `min_ttl` of zero: the integer fixed
//! window's common admission that sets no TTL, and every key's expiry, are on the path.
//!
//! After every step the decisions must equal rein-core's at the simulated `TIME`, and the
//! stored state rein-core's, limit by limit, but for a limit both hold full: a store may
//! forget a full limit, and the server expires a key whose every limit is full
//! (`Policy::is_full`); an expiry too early shows as a limit stored full that rein-core
//! holds not full. A step of several concurrent
//! decisions goes through the store's coalescing; the test checks that the calls did carry
//! several decisions where the store coalesces (one fixed window, sliding log or token
//! bucket) and never where it does not (a lone sliding counter and policies of several
//! limits run the policy script, one decision a call).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo};
use rein_core::DecideError;
use rein_core::{
    Algorithm, Decision, Leasable, Limit, Limiter, Micros, OverCapacity, Policy, PolicyState,
    Timestamp,
};
use rein_redis::{Coalesce, RedisPolicy, RedisStore, RedisStoreBuilder};
use sim::redis::{ManualClock, Observer, Reply, Shared, serve_connection_observed};

/// The most keys one of the store's `EVALSHA` calls named: how many decisions it carried.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<usize>>);

impl Observer for Calls {
    fn ran(&self, _peer: std::net::SocketAddr, args: &[Bytes], _reply: &Reply) {
        if args
            .first()
            .is_some_and(|a| a.eq_ignore_ascii_case(b"EVALSHA"))
        {
            let keys = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
                .unwrap_or(0);
            let mut widest = self.0.lock().unwrap_or_else(|p| p.into_inner());
            *widest = (*widest).max(keys);
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire(u64),
    Peek(u64),
    Refund(u64),
    /// `acquire_held` on the server's clock, with this cost and hold.
    Hold(u64, u64),
    /// `refund_held` of this amount from the stamp of the `.1`-th hold so far (modulo; none
    /// yet: from the server's `now`).
    Settle(u64, usize),
}

#[derive(Clone, Debug)]
enum Step {
    /// Move the server's clock forward (or back) by this many µs.
    Clock(i64),
    /// One operation on user key `.0`.
    One(usize, Op),
    /// Concurrent acquires and peeks, on user keys `.0`, started in this order.
    Together(Vec<(usize, bool, u64)>),
}

#[derive(Clone, Debug)]
struct Case {
    policy: Policy,
    start: u64,
    coalesce: Coalesce,
    steps: Vec<Step>,
}

const USER_KEYS: [&str; 3] = ["alice", "bob", "k\u{e9}y:with;separators"];

#[test]
fn the_store_on_the_servers_clock_and_coalesced_matches_core_at_every_step() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut runner = TestRunner::new(Config {
        cases: 160,
        rng_seed: RngSeed::Fixed(0x5EED_0026),
        ..Config::default()
    });
    // Per kind of policy: the most keys one call carried, over every case.
    let carried = Mutex::new([0usize; 5]);
    let result = runner.run(&case(), |case| {
        let widest = runtime.block_on(run_case(&case))?;
        let kind = kind(&case.policy);
        let mut carried = carried.lock().unwrap_or_else(|p| p.into_inner());
        carried[kind] = carried[kind].max(widest);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let carried = carried.into_inner().unwrap_or_else(|p| p.into_inner());
    for (kind, name) in KINDS.iter().enumerate() {
        if kind < 3 {
            assert!(carried[kind] > 1, "{name}: no call carried two decisions");
        } else {
            assert_eq!(
                carried[kind], 1,
                "{name}: the policy script decides one a call"
            );
        }
    }
}

const KINDS: [&str; 5] = [
    "one token bucket",
    "one fixed window",
    "one sliding log",
    "one sliding counter",
    "several limits",
];

fn kind(policy: &Policy) -> usize {
    match policy.limits() {
        [Limit::TokenBucket(_)] => 0,
        [Limit::FixedWindow(_)] => 1,
        [Limit::SlidingLog(_)] => 2,
        [Limit::SlidingCounter(_)] => 3,
        _ => 4,
    }
}

/// The store over one redis-rs connection to a fresh simulated Redis at `clock`.
async fn store(
    clock: &ManualClock,
    calls: Calls,
    coalesce: Coalesce,
) -> (RedisStore<MultiplexedConnection>, Shared) {
    let node = Shared::new(clock.clock());
    let (client, server) = tokio::io::duplex(1 << 16);
    // A duplex stream has no peer address: the observer is shown none.
    let nobody = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
    tokio::spawn(serve_connection_observed(
        server,
        nobody,
        node.clone(),
        calls,
    ));
    let info = RedisConnectionInfo::default().set_skip_set_lib_name();
    let config = AsyncConnectionConfig::new();
    let (conn, driver) = MultiplexedConnection::new_with_config(&info, client, config)
        .await
        .expect("a connection to the simulated Redis");
    tokio::spawn(driver);
    let store = RedisStoreBuilder::new()
        // Nothing here waits on real time: the simulated server answers at once.
        .deadline(Duration::from_secs(10))
        .coalesce(coalesce)
        .build(conn)
        .expect("store");
    (store, node)
}

async fn run_case(case: &Case) -> Result<usize, TestCaseError> {
    let clock = ManualClock::new(Timestamp::from_micros(case.start));
    let calls = Calls::default();
    let (store, node) = store(&clock, calls.clone(), case.coalesce).await;
    let named = RedisPolicy::new("p", case.policy.clone()).expect("a valid name");
    let policy = &case.policy;
    let mut states: Vec<PolicyState> = USER_KEYS.iter().map(|_| policy.new_state()).collect();
    let mut stamps: Vec<Timestamp> = Vec::new();
    for (i, step) in case.steps.iter().enumerate() {
        let t = clock.now();
        match step {
            Step::Clock(by) => {
                let now = t.as_micros().saturating_add_signed(*by);
                clock.set(Timestamp::from_micros(now));
            }
            Step::One(user, op) => {
                let (key, state) = (USER_KEYS[*user], &mut states[*user]);
                let before = format!("{state:?} at {t:?}");
                let context = |e: String| {
                    TestCaseError::fail(format!("step {i} {step:?}: {e}\nbefore: {before}"))
                };
                match *op {
                    Op::Acquire(cost) => {
                        let core = policy.acquire(t, state, cost);
                        let redis = store.acquire(None, &named, key.as_ref(), cost).await;
                        same(core, redis).map_err(context)?;
                    }
                    Op::Peek(cost) => {
                        let core = policy.peek(t, state, cost);
                        let redis = store.peek(None, &named, key.as_ref(), cost).await;
                        same(core, redis).map_err(context)?;
                    }
                    Op::Refund(amount) => {
                        policy.refund(t, state, amount).expect("shape");
                        store
                            .refund(None, &named, key.as_ref(), amount)
                            .await
                            .map_err(|e| context(e.to_string()))?;
                    }
                    Op::Hold(cost, hold) => {
                        let hold = Micros::from_micros(hold);
                        let core = policy.acquire_held(t, state, cost, hold);
                        let redis = Leasable::acquire_held(
                            &store,
                            None,
                            &named,
                            key.as_bytes(),
                            cost,
                            hold,
                        )
                        .await;
                        if let Ok(held) = &redis {
                            if held.stamp != t.saturating_add(hold) {
                                return Err(context(format!("stamp {:?}", held.stamp)));
                            }
                            stamps.push(held.stamp);
                        }
                        same(core, redis.map(|h| h.decision)).map_err(context)?;
                    }
                    Op::Settle(amount, pick) => {
                        let stamp = stamps.get(pick % stamps.len().max(1)).copied().unwrap_or(t);
                        policy.refund_held(t, state, amount, stamp).expect("shape");
                        Leasable::refund_held(&store, None, &named, key.as_bytes(), amount, stamp)
                            .await
                            .map_err(|e| context(e.to_string()))?;
                    }
                }
            }
            Step::Together(asks) => {
                // Started in order, so they reach the policy's lane in order: the first
                // (or first two) go at once, the rest wait and share the next calls.
                let handles: Vec<_> = asks
                    .iter()
                    .map(|&(user, acquire, cost)| {
                        let (store, named) = (store.clone(), named.clone());
                        tokio::spawn(async move {
                            let key = USER_KEYS[user];
                            if acquire {
                                store.acquire(None, &named, key.as_ref(), cost).await
                            } else {
                                store.peek(None, &named, key.as_ref(), cost).await
                            }
                        })
                    })
                    .collect();
                for (j, (&(user, acquire, cost), handle)) in asks.iter().zip(handles).enumerate() {
                    let redis = handle.await.expect("the decision's task");
                    let state = &mut states[user];
                    let core = if acquire {
                        policy.acquire(t, state, cost)
                    } else {
                        policy.peek(t, state, cost)
                    };
                    same(core, redis).map_err(|e| {
                        TestCaseError::fail(format!("step {i}, decision {j} of {asks:?}: {e}"))
                    })?;
                }
            }
        }
        // The state of every user key, at the server's `now`: rein-core's, or, limit by
        // limit, another that is full too (a store may forget a full limit, and the
        // server expires a key whose every limit is full; `Policy::is_full`). Then the
        // next step starts from what the store holds, so each step is checked exactly.
        let now = clock.now();
        for (user, key) in USER_KEYS.iter().enumerate() {
            let stored = store
                .state(&named, key)
                .await
                .map_err(|e| TestCaseError::fail(format!("step {i}: reading state: {e}")))?;
            let state = &mut states[user];
            let alike = policy
                .limits()
                .iter()
                .zip(stored.iter().zip(state.iter()))
                .all(|(limit, (stored, core))| {
                    stored == core || (limit.is_full(now, stored) && limit.is_full(now, core))
                });
            if !alike || stored.len() != state.len() {
                let expired = store
                    .keys(&named, key)
                    .expect("keys")
                    .iter()
                    .all(|k| node.watch(k.as_bytes()).is_none());
                return Err(TestCaseError::fail(format!(
                    "step {i} {step:?}, key {key:?} at {now:?}: stored {stored:?} \
                     (expired: {expired}), core {state:?}"
                )));
            }
            *state = stored;
        }
    }
    let widest = *calls.0.lock().unwrap_or_else(|p| p.into_inner());
    Ok(widest)
}

fn same(
    core: Result<Decision, rein_core::AcquireError>,
    redis: Result<Decision, DecideError>,
) -> Result<(), String> {
    match (core, redis) {
        (Ok(core), Ok(redis)) if core == redis => Ok(()),
        (
            Err(rein_core::AcquireError::InsufficientCapacity(OverCapacity { cost, capacity })),
            Err(DecideError::InsufficientCapacity(OverCapacity {
                cost: c2,
                capacity: k2,
            })),
        ) if (cost, capacity) == (c2, k2) => Ok(()),
        (core, redis) => Err(format!("core {core:?}, redis {redis:?}")),
    }
}

// ---- strategies ----

fn case() -> impl Strategy<Value = Case> {
    // Lone limits of each algorithm as often as policies of several.
    let limits = prop_oneof![
        3 => limit().prop_map(|l| vec![l]),
        1 => prop::collection::vec(limit(), 2..=3),
    ];
    let coalesce = (1usize..=2, 1usize..=4).prop_map(|(in_flight, batch)| Coalesce {
        in_flight: in_flight.try_into().expect("not zero"),
        batch: batch.try_into().expect("not zero"),
    });
    let start = prop_oneof![
        // Redis's TIME today is about 1.8e15 µs.
        3 => 1_700_000_000_000_000u64..=1_900_000_000_000_000,
        1 => 0u64..=1 << 40,
    ];
    (limits, start, coalesce).prop_flat_map(|(limits, start, coalesce)| {
        let policy = Policy::new(limits).expect("1 to 3 limits");
        let capacity = policy.capacity();
        let scale = policy.limits().iter().map(span).max().unwrap_or(1);
        prop::collection::vec(step(capacity, scale), 30..=48).prop_map(move |steps| Case {
            policy: policy.clone(),
            start,
            coalesce,
            steps,
        })
    })
}

/// Small, denial-prone limits of every algorithm, with awkward periods.
fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..=8, 1u64..=5, 1u64..=2_000_000).prop_filter_map("valid", |(c, r, p)| {
            Limit::token_bucket(c, r, Micros::from_micros(p)).ok()
        }),
        (1u64..=8, 1u64..=2_000_000).prop_filter_map("valid", |(l, w)| {
            Limit::fixed_window(l, Micros::from_micros(w)).ok()
        }),
        (1u64..=8, 1u64..=2_000_000).prop_filter_map("valid", |(l, w)| {
            Limit::sliding_log(l, Micros::from_micros(w)).ok()
        }),
        (1u64..=8, 1u64..=2_000_000).prop_filter_map("valid", |(l, w)| {
            Limit::sliding_counter(l, Micros::from_micros(w)).ok()
        }),
    ]
}

/// The time over which a limit changes: its window, or the time to refill it.
fn span(limit: &Limit) -> u64 {
    match limit {
        Limit::TokenBucket(b) => {
            let (micros, per) = b.emission_interval();
            (micros / per).max(1).saturating_mul(b.capacity())
        }
        Limit::FixedWindow(w) => w.window().as_micros(),
        Limit::SlidingLog(w) => w.window().as_micros(),
        Limit::SlidingCounter(w) => w.window().as_micros(),
    }
}

fn step(capacity: u64, scale: u64) -> impl Strategy<Value = Step> {
    let scale = i64::try_from(scale.max(1)).unwrap_or(i64::MAX);
    let cost = prop_oneof![
        8 => 0..=capacity.min(4),
        1 => Just(capacity),
        1 => Just(capacity + 1),
    ];
    let user = 0..USER_KEYS.len();
    let op = prop_oneof![
        5 => cost.clone().prop_map(Op::Acquire),
        2 => cost.clone().prop_map(Op::Peek),
        1 => (0..=capacity + 1).prop_map(Op::Refund),
        2 => (cost.clone(), 0..=scale as u64).prop_map(|(c, h)| Op::Hold(c, h)),
        1 => (0..=capacity + 1, 0..8usize).prop_map(|(a, p)| Op::Settle(a, p)),
    ];
    let together = prop::collection::vec((user.clone(), prop::bool::weighted(0.8), cost), 3..=8);
    prop_oneof![
        4 => prop_oneof![
            4 => 0..=scale / 4,
            2 => 0..=scale.saturating_mul(2),
            1 => -scale..=0,
        ]
        .prop_map(Step::Clock),
        4 => (user, op).prop_map(|(u, op)| Step::One(u, op)),
        3 => together.prop_map(Step::Together),
    ]
}
