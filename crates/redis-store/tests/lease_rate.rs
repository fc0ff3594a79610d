//! `lua/lease_rate.lua` is rein-core's `RateShares`, not a second guess: random token
//! buckets and random sequences of takes, renewals, returns (valid, stale, of other chains)
//! and direct decisions, with clocks that stall and go back, give the same answers and the
//! same stored state (read back field by field) from a real redis-server as from the core,
//! after every step. Corrupt state and arguments are refused with an error, never used.

mod common;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use rein_core::admin::{KeyAdmin, Until};
use rein_core::time::MAX_MICROS;
use rein_core::token_bucket::TokenBucketState;
use rein_core::{
    Algorithm, DecideError, Leasable, Limit, Limiter, Micros, Policy, Timestamp,
    rate_share::{
        RateAnswer, RateOp, RateShares, RateState, ReturnRequest, ShareError, TakeRequest, Taken,
    },
};
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;

#[derive(Clone, Debug)]
struct Case {
    capacity: u64,
    refill: u64,
    period_us: u64,
    start: u64,
    /// Plain decisions (`acquire`, leases off, or an operator's change) before the first
    /// rate-share operation, each this many µs after the last, of this cost: the rate
    /// shares adopt that state.
    plain: Vec<(u64, u64)>,
    steps: Vec<(i64, Step)>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// A take by `node`, holding its latest grant (or a wrong id), with its next seq (or a
    /// stale one).
    Take {
        node: u64,
        right_id: bool,
        stale: bool,
        demand: u64,
        validity_us: u64,
    },
    Return {
        node: u64,
        right_id: bool,
        units: u64,
    },
    Direct(u64),
}

#[test]
fn script_matches_core_answers_and_state_at_every_step() {
    common::check_cases(
        200,
        "tests/lease_rate.proptest-regressions",
        "rate",
        case(),
        |store, _conn, case| async move { run_case(&store, &case).await },
    );
}

async fn run_case(store: &RedisStore<ConnectionManager>, case: &Case) -> Result<(), TestCaseError> {
    let bucket = Limit::token_bucket(
        case.capacity,
        case.refill,
        Micros::from_micros(case.period_us),
    )
    .expect("valid bucket");
    let Limit::TokenBucket(tb) = bucket else {
        unreachable!()
    };
    let shares = RateShares::new(&tb).expect("shareable");
    let policy = RedisPolicy::new("p", Policy::single(bucket)).expect("policy");
    let mut state = RateState::default();
    // Per node: its latest grant id, its seq, and the seq of its latest grant.
    let mut nodes = [(0u64, 0u64, 0u64); 6];
    let mut now = case.start;
    // The plain bucket's state, until the first operation the core runs adopts it (Redis
    // keeps the plain string until then).
    let mut plain = None;
    for &(dt, cost) in &case.plain {
        now = now.saturating_add(dt).min(MAX_MICROS);
        let t = Timestamp::from_micros(now);
        let cost = cost.min(case.capacity);
        let bucket_state = plain.get_or_insert_with(TokenBucketState::default);
        let core = tb.acquire(t, bucket_state, cost).expect("within capacity");
        let redis = store
            .acquire(Some(t), &policy, b"user", cost)
            .await
            .map_err(|e| TestCaseError::fail(format!("plain acquire: {e}")))?;
        prop_assert_eq!(core, redis, "plain acquire of {} at {}", cost, now);
    }
    for (i, &(dt, step)) in case.steps.iter().enumerate() {
        now = now.saturating_add_signed(dt).min(MAX_MICROS);
        let t = Timestamp::from_micros(now);
        let op = match step {
            Step::Take {
                node,
                right_id,
                stale,
                demand,
                validity_us,
            } => {
                let (id, seq, applied) = &mut nodes[node as usize];
                if !stale {
                    *seq += 1;
                }
                RateOp::Take(TakeRequest {
                    node,
                    held: if right_id { *id } else { *id + 7 },
                    seq: *seq,
                    applied: if right_id { *applied } else { 0 },
                    demand,
                    validity: Micros::from_micros(validity_us),
                })
            }
            Step::Return {
                node,
                right_id,
                units,
            } => {
                let (id, seq, _) = &mut nodes[node as usize];
                *seq += 1;
                RateOp::Return(ReturnRequest {
                    node,
                    id: if right_id { *id } else { *id + 1 },
                    seq: *seq,
                    units,
                })
            }
            Step::Direct(cost) => RateOp::Direct(cost),
        };
        let before = format!("{state:?} (plain {plain:?})");
        let mut next = match plain {
            Some(bucket_state) => shares.adopt(t, &bucket_state),
            None => state.clone(),
        };
        let core = shares.apply(t, &mut next, op);
        if core.is_ok() {
            state = next;
            plain = None;
        }
        let redis = store.share_rate(Some(t), &policy, b"user", op).await;
        match (&core, &redis) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "step {} {:?} from {}", i, op, before),
            (Err(a), Err(DecideError::InvalidShare(b))) => prop_assert_eq!(a, b),
            _ => {
                return Err(TestCaseError::fail(format!(
                    "step {i} {op:?}: core {core:?}, redis {redis:?}"
                )));
            }
        }
        if let (Ok(RateAnswer::Taken(Taken::Granted(g))), RateOp::Take(r)) = (core, op) {
            nodes[r.node as usize].0 = g.id;
            nodes[r.node as usize].2 = r.seq;
        }
        if plain.is_some() {
            continue;
        }
        let stored = store
            .rate_state(&policy, b"user")
            .await
            .map_err(|e| TestCaseError::fail(format!("reading the shares: {e}")))?
            .unwrap_or_default();
        prop_assert_eq!(&stored, &state, "state after step {} {:?}", i, op);
    }
    Ok(())
}

#[test]
fn corrupt_state_bad_arguments_and_unshareable_policies_are_refused() {
    let server = RedisServer::start().expect("start redis-server");
    let rt = common::runtime();
    rt.block_on(async {
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client.get_connection_manager().await.expect("connect");
        let store = RedisStoreBuilder::new().build(conn.clone()).expect("store");
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap();
        let policy = RedisPolicy::new("p", Policy::single(bucket)).unwrap();
        let key = store.keys(&policy, b"k").unwrap().remove(0);
        let t = Some(Timestamp::from_micros(1_000_000));
        let take = common::first_take(5, Micros::from_millis(100));
        for (field, value) in [
            ("s", "1:2"),
            ("s", "99999999999:0:0"),
            ("n1", "1:2:3"),
            ("n1", "1:11:0:0:0:0:0:0:0"),
            ("n0", "1:1:1:1:1:1:1:1:1"),
            ("x", "1"),
        ] {
            let _: () = conn.del(&key).await.unwrap();
            let _: () = conn.hset(&key, field, value).await.unwrap();
            let answer = store.share_rate(t, &policy, b"k", take).await;
            common::assert_matches!(answer, Err(DecideError::Unavailable(_)), "{field}={value}");
        }
        // A plain bucket's string that is not one: refused, not read as a full bucket.
        for value in ["12:x", "12:", "-5", "99999999999999999"] {
            let _: () = conn.set(&key, value).await.unwrap();
            let answer = store.share_rate(t, &policy, b"k", take).await;
            common::assert_matches!(answer, Err(DecideError::Unavailable(_)), "{value}");
        }
        // A remainder beyond this bucket's µs (its rate changed since) reads as the bucket
        // script reads it, clamped: adopted, not refused as corrupt (a refusal reads as
        // Redis failing, and fail open would admit the key).
        let _: () = conn.set(&key, "1050000:7").await.unwrap();
        let direct = store.share_rate(t, &policy, b"k", RateOp::Direct(1)).await;
        assert!(
            matches!(direct, Ok(RateAnswer::Decided(d)) if d.is_allowed() && d.remaining == 8),
            "{direct:?}"
        );
        // A plain bucket's state is adopted: an operator's penalty of a key not yet shared
        // holds for the leases (before, the script failed with WRONGTYPE until the plain
        // state expired, which the resilient limiter read as Redis failing: fail open
        // admitted the key). A denial writes the adopted state too.
        let _: () = conn.del(&key).await.unwrap();
        let penalized = KeyAdmin::penalize(&store, &policy, b"k", 8).await;
        assert!(matches!(penalized, Ok(d) if d.remaining == 2), "{penalized:?}");
        let direct = store.share_rate(None, &policy, b"k", RateOp::Direct(3)).await;
        assert!(
            matches!(direct, Ok(RateAnswer::Decided(d)) if !d.is_allowed() && d.remaining == 2),
            "{direct:?}"
        );
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.unwrap();
        assert_eq!(kind, "hash");
        // A key an operator blocked holds for the leases: a direct decision is the block's
        // denial, a take finds no room, a return gives back nothing (before, each failed
        // with WRONGTYPE, which the resilient limiter above read as Redis failing: its
        // failure policy answered, fail open admitting the blocked key).
        let _: () = conn.del(&key).await.unwrap();
        let blocked = KeyAdmin::block(&store, &policy, b"k", Until::For(Micros::from_secs(60)), "x");
        assert!(matches!(blocked.await, Ok(true)));
        let direct = store.share_rate(None, &policy, b"k", RateOp::Direct(1)).await;
        assert!(
            matches!(direct, Ok(RateAnswer::Decided(d)) if !d.is_allowed() && d.retry_after > Micros::from_secs(59)),
            "{direct:?}"
        );
        let taken = store.share_rate(None, &policy, b"k", take).await;
        assert!(matches!(taken, Ok(RateAnswer::Taken(Taken::Full))), "{taken:?}");
        let give_back = RateOp::Return(ReturnRequest {
            node: 1,
            id: 1,
            seq: 2,
            units: 5,
        });
        let returned = store.share_rate(None, &policy, b"k", give_back).await;
        assert!(matches!(returned, Ok(RateAnswer::Returned(false))), "{returned:?}");
        // At and after its end, before Redis expires its key, the block is as a key never
        // seen: a full bucket, whose state the decision writes in the block's place.
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970");
        let ended = Timestamp::from_micros(wall.as_micros() as u64 + 3_600_000_000);
        let direct = store.share_rate(Some(ended), &policy, b"k", RateOp::Direct(1)).await;
        assert!(
            matches!(direct, Ok(RateAnswer::Decided(d)) if d.is_allowed() && d.remaining == 9),
            "{direct:?}"
        );
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.unwrap();
        assert_eq!(kind, "hash");
        // A state ahead of the request's clock (a clock behind: a failover, a node's own
        // clock) keeps its key as long as its shares hold rate, counted from that clock
        // (before, from the state's own instant: the key went early, and the rate its
        // shares held with it, to be granted again).
        let _: () = conn.del(&key).await.unwrap();
        let ahead = Timestamp::from_micros(5_000_000);
        let taken = store.share_rate(Some(ahead), &policy, b"k", take).await;
        assert!(matches!(taken, Ok(RateAnswer::Taken(Taken::Granted(_)))), "{taken:?}");
        let mut second = take;
        if let RateOp::Take(request) = &mut second {
            request.node = 2;
        }
        let behind = Timestamp::from_micros(1_000_000);
        let answer = store.share_rate(Some(behind), &policy, b"k", second).await;
        assert!(matches!(answer, Ok(RateAnswer::Taken(_))), "{answer:?}");
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.unwrap();
        // The first share runs to 5.1 s on the requests' clock: 4.1 s from `behind`.
        assert!(ttl >= 4_100, "PTTL {ttl} ms");
        // Bad requests are the core's typed errors, before any call.
        let _: () = conn.del(&key).await.unwrap();
        let bad = RateOp::Take(TakeRequest {
            node: 0,
            held: 0,
            seq: 1,
            applied: 0,
            demand: 5,
            validity: Micros::from_millis(100),
        });
        let answer = store.share_rate(t, &policy, b"k", bad).await;
        assert!(matches!(
            answer,
            Err(DecideError::InvalidShare(ShareError::Node(0)))
        ));
        let window = Limit::fixed_window(10, Micros::from_secs(1)).unwrap();
        let fw = RedisPolicy::new("w", Policy::single(window)).unwrap();
        let answer = store.share_rate(t, &fw, b"k", take).await;
        assert!(matches!(
            answer,
            Err(DecideError::InvalidShare(ShareError::NotShareable))
        ));
        // Raw script calls with out-of-range arguments are refused by the script itself.
        let source = rein_redis::SCRIPTS
            .iter()
            .find(|(name, _)| *name == "lease_rate")
            .expect("registered")
            .1;
        for argv in [
            vec!["take", "1", "0", "10", "1000", "1", "1", "0", "1", "0", "5"],
            vec![
                "take", "1", "0", "10", "1000", "1", "1", "0", "1", "0", "5", "-1",
            ],
            vec!["direct", "1", "0", "10", "1000", "1", "1.5"],
            vec!["direct", "1", "0", "0", "1000", "1", "1"],
            vec!["direct", "1", "0", "10", "1000", "1", "11"],
            vec!["steal", "1", "0", "10", "1000", "1", "1"],
        ] {
            let reply: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
                .arg(source)
                .arg(1)
                .arg("rate-raw")
                .arg(&argv)
                .query_async(&mut conn)
                .await;
            assert!(reply.is_err(), "{argv:?}: {reply:?}");
        }
    });
}

// ---- strategies ----

fn case() -> impl Strategy<Value = Case> {
    let bucket = prop_oneof![
        (1u64..=12, 1u64..=7, 1_000u64..=3_000_000),
        // Fractional emission intervals and deep buckets near the exactness bound.
        (1u64..=100_000, 1u64..=999, 1u64..=7_000_000),
    ]
    .prop_filter("shareable", |&(c, r, p)| {
        Limit::token_bucket(c, r, Micros::from_micros(p))
            .ok()
            .and_then(|l| match l {
                Limit::TokenBucket(tb) => RateShares::new(&tb).ok(),
                _ => None,
            })
            .is_some()
    });
    let start = prop_oneof![Just(0u64), 1u64..=2_000_000_000_000_000];
    let plain = prop_oneof![
        Just(vec![]),
        prop::collection::vec((0u64..=200_000, 0u64..=13), 1..=6),
    ];
    (bucket, start, plain, prop::collection::vec(step(), 30..=60)).prop_map(
        |((capacity, refill, period_us), start, plain, steps)| Case {
            capacity,
            refill,
            period_us,
            start,
            plain,
            steps,
        },
    )
}

fn step() -> impl Strategy<Value = (i64, Step)> {
    let dt = prop_oneof![
        4 => 0i64..=50_000,
        1 => Just(0i64),
        1 => -50_000i64..0,
        1 => 0i64..=5_000_000,
    ];
    let node = 1u64..=5;
    let op = prop_oneof![
        4 => (
            node.clone(),
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.1),
            prop_oneof![Just(0u64), 0u64..100, Just(u64::from(u32::MAX))],
            1u64..=200_000,
        )
            .prop_map(|(node, right_id, stale, demand, validity_us)| Step::Take {
                node,
                right_id,
                stale,
                demand,
                validity_us,
            }),
        1 => (node, prop::bool::weighted(0.8), 0u64..=u64::from(u32::MAX)).prop_map(
            |(node, right_id, units)| Step::Return {
                node,
                right_id,
                units,
            }
        ),
        3 => (0u64..=13).prop_map(Step::Direct),
    ];
    (dt, op)
}
