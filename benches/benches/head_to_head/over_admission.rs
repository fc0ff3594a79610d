//! Over-admission: independent instances hammering one key with a tight limit.

use std::rc::Rc;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use rein_redis_harness::RedisServer;

use super::*;

pub(crate) struct OverRow {
    pub(crate) kind: RedisKind,
    pub(crate) instances: usize,
    pub(crate) admitted: u64,
    pub(crate) allowed: u64,
    pub(crate) no_decision: u64,
    pub(crate) attempts: u64,
}

/// Each Redis-backed peer with 1, 2 and 4 instances on one key.
pub(crate) fn over_admission_section(server: &RedisServer, run: Duration) -> Vec<OverRow> {
    let url = server.url();
    let mut rows = Vec::new();
    for kind in RedisKind::all() {
        for instances in [1usize, 2, 4] {
            let key = format!("hot-{kind:?}-{instances}");
            rows.push(over_admission(kind, instances, &url, &key, run));
        }
    }
    rows
}

/// `instances` independent instances, each its own thread, current-thread runtime,
/// connection(s) and limiter, with [`HOT_TASKS`] tasks each deciding on `key` for `run`.
pub(crate) fn over_admission(
    kind: RedisKind,
    instances: usize,
    url: &str,
    key: &str,
    run: Duration,
) -> OverRow {
    let ready = Barrier::new(instances);
    let results: Vec<(u64, u64, u64, Duration)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..instances)
            .map(|_| {
                let ready = &ready;
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("tokio runtime");
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async {
                        let peer = Rc::new(
                            RedisPeer::connect(kind, url, LimitSpec::Tight, HOT_TASKS).await,
                        );
                        // All instances start together, as replicas under one burst would.
                        ready.wait();
                        hammer(&peer, key, run).await
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("instance"))
            .collect()
    });
    let elapsed = results.iter().map(|r| r.3).max().unwrap_or_default();
    OverRow {
        kind,
        instances,
        admitted: results.iter().map(|r| r.0).sum(),
        allowed: LimitSpec::Tight.allowed(elapsed),
        no_decision: results.iter().map(|r| r.2).sum(),
        attempts: results.iter().map(|r| r.0 + r.1 + r.2).sum(),
    }
}

/// [`HOT_TASKS`] tasks deciding on `key` for `run`: (admitted, denied, no decision, time).
pub(crate) async fn hammer(
    peer: &Rc<RedisPeer>,
    key: &str,
    run: Duration,
) -> (u64, u64, u64, Duration) {
    let stop = Rc::new(std::cell::Cell::new(false));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..HOT_TASKS {
        let (peer, stop, key) = (peer.clone(), stop.clone(), key.to_owned());
        handles.push(tokio::task::spawn_local(async move {
            let mut counts = (0u64, 0u64, 0u64);
            while !stop.get() {
                match peer.decide(&key).await {
                    Outcome::Admitted => counts.0 += 1,
                    Outcome::Denied => counts.1 += 1,
                    Outcome::NoDecision => counts.2 += 1,
                }
                // A denial from rein's deny cache completes without awaiting anything;
                // without a yield one task would keep the runtime to itself.
                tokio::task::yield_now().await;
            }
            counts
        }));
    }
    tokio::time::sleep(run).await;
    stop.set(true);
    let mut total = (0, 0, 0, Duration::ZERO);
    for handle in handles {
        let (a, d, n) = handle.await.expect("task");
        total.0 += a;
        total.1 += d;
        total.2 += n;
    }
    total.3 = started.elapsed();
    total
}
