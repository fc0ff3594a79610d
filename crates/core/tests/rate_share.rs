//! Rate shares against a brute-force oracle: in random worlds of nodes holding sub-buckets
//! (requests delayed, lost, run after the node gave up on them and so out of order;
//! replies lost; returns lost or late), the union of every admission (direct ones and each
//! node's local ones), replayed in time order through one plain `TokenBucket(C, r)`, is
//! admitted every time. docs/leases.md, "Token bucket: lease rate".

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use rein_core::{
    Algorithm, Micros, Timestamp,
    rate_share::{RateShares, RateState, ReturnRequest, ShareBucket, TakeRequest, Taken},
    token_bucket::{TokenBucket, TokenBucketState},
};

#[derive(Clone, Debug)]
struct World {
    capacity: u64,
    refill: u64,
    period_us: u64,
    nodes: usize,
    steps: Vec<(u64, Action)>,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    /// A request at a node, decided from its sub-bucket.
    Local { node: usize, cost: u64 },
    /// A request decided against the direct share.
    Direct { cost: u64 },
    /// A burst: one-token requests at a node (or at the direct share) until one is
    /// denied, so that anything held beyond what is reserved is spent at once.
    Drain { node: Option<usize> },
    /// A node asks for its share (or renews it).
    Take {
        node: usize,
        demand: u64,
        validity_us: u64,
        /// µs until the store runs it, or `None`: lost.
        exec: Option<u64>,
        /// µs from the store to the node, or `None`: lost.
        reply: Option<u64>,
    },
    /// A node returns its share.
    Return { node: usize, exec: Option<u64> },
}

/// Something in flight, due at an instant.
#[derive(Clone, Copy, Debug)]
enum Event {
    Take {
        node: usize,
        request: TakeRequest,
        sent_at: u64,
        reply: Option<u64>,
    },
    Return(ReturnRequest),
    Reply {
        node: usize,
        seq: u64,
        taken: Taken,
        until: u64,
        /// The burst the store still held for the node's earlier grants when it ran the
        /// take (share units): all a continued grant may find the node holding.
        held_units: u64,
    },
}

#[derive(Clone, Copy, Debug, Default)]
struct Node {
    bucket: ShareBucket,
    held: u64,
    seq: u64,
    /// The seq of the take whose grant the node spends.
    applied: u64,
    /// The seq of the take this node waits for, and until when it waits.
    waiting: Option<(u64, u64)>,
}

/// A node waits this long for a reply, then gives up (the request may still run later).
const GIVE_UP_US: u64 = 20_000;
const START: u64 = 1_000_000_000;

/// How a world's messages and requests are mixed: some worlds are calm, some lose or
/// delay most replies, and the direct path's share of requests varies.
#[derive(Clone, Copy, Debug)]
struct Mix {
    lost: u32,
    slow: u32,
    direct: u32,
    drain: u32,
}

fn mix() -> impl Strategy<Value = Mix> {
    (0..8u32, 0..8u32, 1..8u32, 0..4u32).prop_map(|(lost, slow, direct, drain)| Mix {
        lost,
        slow,
        direct,
        drain,
    })
}

fn action(nodes: usize, mix: Mix) -> impl Strategy<Value = Action> {
    let node = 0..nodes;
    let delay = prop_oneof![
        12 => (0..2_000u64).prop_map(Some),
        1 + mix.slow => (0..30_000u64).prop_map(Some),
        1 + mix.lost => Just(None)
    ];
    prop_oneof![
        16 => (node.clone(), 1..4u64).prop_map(|(node, cost)| Action::Local { node, cost }),
        mix.direct => (1..4u64).prop_map(|cost| Action::Direct { cost }),
        mix.drain => prop::option::of(node.clone()).prop_map(|node| Action::Drain { node }),
        6 => (node.clone(), 0..50u64, 1_000..60_000u64, delay.clone(), delay.clone())
            .prop_map(|(node, demand, validity_us, exec, reply)| Action::Take {
                node,
                demand,
                validity_us,
                exec,
                reply,
            }),
        1 => (node, delay).prop_map(|(node, exec)| Action::Return { node, exec }),
    ]
}

fn world() -> impl Strategy<Value = World> {
    (1..13u64, 1..7u64, 1_000..30_000u64, 1..5usize, mix()).prop_flat_map(
        |(capacity, refill, period_us, nodes, mix)| {
            // Mostly short steps, sometimes a pause long enough for grants to end.
            let gap = prop_oneof![8 => 0..4_000u64, 1 => 0..40_000u64];
            let steps = prop::collection::vec((gap, action(nodes, mix)), 1..300);
            steps.prop_map(move |steps| World {
                capacity,
                refill,
                period_us,
                nodes,
                steps,
            })
        },
    )
}

static LOCAL: AtomicU64 = AtomicU64::new(0);
static DIRECT: AtomicU64 = AtomicU64::new(0);

fn run(world: &World) -> Result<(), TestCaseError> {
    let bucket = TokenBucket::new(
        world.capacity,
        world.refill,
        Micros::from_micros(world.period_us),
    )
    .expect("bucket");
    let shares = RateShares::new(&bucket).expect("shareable");
    let mut state = RateState::default();
    let mut nodes = vec![Node::default(); world.nodes];
    let mut events: Vec<(u64, u64, Event)> = Vec::new();
    let mut order = 0u64;
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut now = START;
    for &(dt, action) in &world.steps {
        let next = now + dt;
        // Everything due by `next`, in time order (ties in the order sent).
        while let Some(i) = (0..events.len())
            .filter(|&i| events[i].0 <= next)
            .min_by_key(|&i| (events[i].0, events[i].1))
        {
            let (at, _, event) = events.swap_remove(i);
            let t = Timestamp::from_micros(at);
            match event {
                Event::Take {
                    node,
                    request,
                    sent_at,
                    reply,
                } => {
                    let taken = shares.take(t, &mut state, request).expect("valid request");
                    let held_units = state
                        .shares
                        .iter()
                        .find(|s| s.node == request.node)
                        .map_or(0, |s| s.hold_burst * shares.token_units());
                    if let Some(d) = reply {
                        order += 1;
                        let until = sent_at + request.validity.as_micros();
                        let reply = Event::Reply {
                            node,
                            seq: request.seq,
                            taken,
                            until,
                            held_units,
                        };
                        events.push((at + d, order, reply));
                    }
                }
                Event::Return(request) => {
                    shares
                        .give_back(t, &mut state, request)
                        .expect("valid return");
                }
                Event::Reply {
                    node,
                    seq,
                    taken,
                    until,
                    held_units,
                } => {
                    let n = &mut nodes[node];
                    // Applied only if the node still waits for it.
                    if n.waiting.is_some_and(|(s, end)| s == seq && at < end) {
                        n.waiting = None;
                        if let Taken::Granted(grant) = taken {
                            // A continued grant keeps what the node holds: the store must
                            // still have been reserving it (what made the node-level
                            // proptest's saved case over-admit, once spent).
                            n.bucket.refill(t);
                            prop_assert!(
                                !grant.continued || n.bucket.units() <= held_units,
                                "at +{} µs node {node} holds {} units, the store held {held_units}",
                                at - START,
                                n.bucket.units()
                            );
                            n.bucket
                                .apply(t, &shares, &grant, Timestamp::from_micros(until), 0);
                            n.held = grant.id;
                            n.applied = seq;
                        }
                    }
                }
            }
        }
        now = next;
        let t = Timestamp::from_micros(now);
        match action {
            Action::Local { node, cost } => {
                let cost = cost.min(world.capacity);
                if nodes[node].bucket.try_take(t, &shares, cost) {
                    admitted.push((now, cost));
                    LOCAL.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::Drain { node: Some(node) } => {
                while nodes[node].bucket.try_take(t, &shares, 1) {
                    admitted.push((now, 1));
                    LOCAL.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::Drain { node: None } => {
                while shares.direct(t, &mut state, 1).expect("cost").is_allowed() {
                    admitted.push((now, 1));
                    DIRECT.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::Direct { cost } => {
                let cost = cost.min(world.capacity);
                if shares
                    .direct(t, &mut state, cost)
                    .expect("cost")
                    .is_allowed()
                {
                    admitted.push((now, cost));
                    DIRECT.fetch_add(1, Ordering::Relaxed);
                }
            }
            Action::Take {
                node,
                demand,
                validity_us,
                exec,
                reply,
            } => {
                let n = &mut nodes[node];
                if n.waiting.is_some_and(|(_, end)| now < end) {
                    continue;
                }
                n.seq += 1;
                n.waiting = Some((n.seq, now + GIVE_UP_US));
                let request = TakeRequest {
                    node: node as u64 + 1,
                    held: n.held,
                    seq: n.seq,
                    applied: n.applied,
                    demand,
                    validity: Micros::from_micros(validity_us),
                };
                if let Some(d) = exec {
                    order += 1;
                    let event = Event::Take {
                        node,
                        request,
                        sent_at: now,
                        reply,
                    };
                    events.push((now + d, order, event));
                }
            }
            Action::Return { node, exec } => {
                let n = &mut nodes[node];
                if n.held == 0 || n.waiting.is_some_and(|(_, end)| now < end) {
                    continue;
                }
                n.seq += 1;
                n.bucket.refill(t);
                let request = ReturnRequest {
                    node: node as u64 + 1,
                    id: n.held,
                    seq: n.seq,
                    units: n.bucket.units(),
                };
                // The node spends nothing of the share from the moment it sends this.
                n.bucket.clear();
                n.held = 0;
                n.applied = 0;
                if let Some(d) = exec {
                    order += 1;
                    events.push((now + d, order, Event::Return(request)));
                }
            }
        }
    }
    // The oracle: one plain token bucket, every admission in time order.
    let mut oracle = TokenBucketState::default();
    for &(at, cost) in &admitted {
        let decision = bucket
            .acquire(Timestamp::from_micros(at), &mut oracle, cost)
            .expect("cost");
        prop_assert!(
            decision.is_allowed(),
            "over-admission at {} (+{} µs) of {cost}: {admitted:?}",
            at,
            at - START
        );
    }
    Ok(())
}

#[test]
fn every_admission_of_shares_and_direct_path_together_conforms_to_the_bucket() {
    let config = Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/rate_share.proptest-regressions",
        ))),
        // `PROPTEST_CASES` deepens a run.
        ..Config::with_cases(
            std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1_000),
        )
    };
    proptest!(config, |(w in world())| run(&w)?);
    // The worlds exercised both paths.
    assert!(LOCAL.load(Ordering::Relaxed) > 1_000);
    assert!(DIRECT.load(Ordering::Relaxed) > 100);
}

/// A plain bucket's state adopted by the rate shares ([`RateShares::adopt`]) is the same
/// bucket: from the instant of adoption, direct decisions (no share taken) admit, deny and
/// count what the plain bucket would have, request for request, including the fraction of
/// a token a rate of uneven emission interval leaves (`tat_units`). So an operator's
/// penalty of a key not yet shared holds for the leases, no more and no less.
#[test]
fn an_adopted_plain_bucket_decides_as_the_bucket_would_have() {
    let config = Config {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/rate_share.proptest-regressions",
        ))),
        ..Config::with_cases(500)
    };
    let plan = (
        1u64..=40,
        1u64..=9,
        1u64..=5_000_000,
        proptest::collection::vec((0u64..300_000, 0u64..=40), 0..12),
        0u64..2_000_000,
        proptest::collection::vec((0u64..300_000, 0u64..=40), 1..20),
    );
    proptest!(config, |((capacity, refill, period_us, before, gap, after) in plan)| {
        let bucket = TokenBucket::new(capacity, refill, Micros::from_micros(period_us))
            .expect("valid bucket");
        let shares = RateShares::new(&bucket).expect("shareable");
        let mut plain = TokenBucketState::default();
        let mut now = 1_000_000u64;
        for (dt, cost) in before {
            now += dt;
            let _ = bucket.acquire(Timestamp::from_micros(now), &mut plain, cost.min(capacity));
        }
        now += gap;
        let mut state = shares.adopt(Timestamp::from_micros(now), &plain);
        for (dt, cost) in after {
            now += dt;
            let t = Timestamp::from_micros(now);
            let cost = cost.min(capacity);
            let want = bucket.acquire(t, &mut plain, cost).expect("within capacity");
            let got = shares.direct(t, &mut state, cost).expect("within capacity");
            prop_assert_eq!(got.is_allowed(), want.is_allowed(), "cost {} at {}", cost, now);
            prop_assert_eq!(got.remaining, want.remaining, "cost {} at {}", cost, now);
            prop_assert_eq!(got.retry_after, want.retry_after, "cost {} at {}", cost, now);
        }
    });
}

/// A plain state's remainder beyond the bucket's µs (written under another rate) is read as
/// the bucket reads it, at most a unit short of a µs, as `lease_rate.lua` reads it.
#[test]
fn an_adopted_remainder_beyond_the_bucket_is_clamped() {
    let bucket = TokenBucket::new(10, 10, Micros::from_secs(1)).expect("valid");
    let shares = RateShares::new(&bucket).expect("shareable");
    let now = Timestamp::from_micros(1_000_000);
    let plain = |tat_units| TokenBucketState {
        tat: Timestamp::from_micros(1_050_000),
        tat_units,
    };
    // One unit a µs: no remainder at all.
    assert_eq!(shares.adopt(now, &plain(7)), shares.adopt(now, &plain(0)));
    assert_eq!(shares.adopt(now, &plain(0)).drawn, 50_000 * 1_000);
}
