//! Resharding under load: the slot of a hot key migrates by hand from one master of a local
//! 3-master Cluster to another while many tasks decide on that key. The store follows every
//! `ASK` and `MOVED` (and the `NOSCRIPT` of a target whose script cache is empty) without
//! replaying a call whose outcome is unknown, so no decision fails and the tokens taken are
//! exactly the decisions admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rein_core::{Limit, Micros, Policy};
use rein_redis::{RedisPolicy, RedisStoreBuilder};
use rein_redis_harness::{RedisCluster, RedisServer};

/// Far more tokens than the test can take, so every decision is admitted and the bucket's
/// remaining tokens count exactly the decisions that took one. One token back every
/// 10 minutes: none within the test.
const CAPACITY: u64 = 100_000;

/// Concurrent deciders on the hot key.
const TASKS: usize = 16;

/// How long each phase of the migration runs under load.
const PHASE: Duration = Duration::from_millis(150);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_hot_keys_slot_fails_no_decision_and_counts_each_admission_once() {
    let started = Instant::now();
    let cluster = RedisCluster::start().expect("start redis cluster");
    let nodes = cluster.nodes();
    let store = RedisStoreBuilder::new()
        // Generous for a debug build on a loaded 2-core machine: a timeout would be a
        // failed decision, and this test is about redirects, not latency.
        .deadline(Duration::from_secs(5))
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    let bucket =
        Limit::token_bucket(CAPACITY, 1, Micros::from_secs(600)).expect("valid token bucket");
    let policy = Arc::new(RedisPolicy::new("hot", Policy::single(bucket)).expect("valid name"));
    let user = "hot-user";
    assert!(
        store
            .acquire(&policy, user, 1)
            .await
            .expect("first decision")
            .is_allowed()
    );
    let keys = store.keys(&policy, user).expect("valid key");
    let [key] = keys.as_slice() else {
        panic!("a single-limit policy has one key: {keys:?}")
    };

    // Where the key lives, and where it goes.
    let slot = integer(&admin(&nodes[0], &["CLUSTER", "KEYSLOT", key]));
    let slot = slot.to_string();
    let source = (0..nodes.len())
        .find(|&i| admin(&nodes[i], &["EXISTS", key]) == ":1\r\n")
        .expect("the key is on one node");
    let target = (source + 1) % nodes.len();
    let (source, target, other) = (
        &nodes[source],
        &nodes[target],
        &nodes[(target + 1) % nodes.len()],
    );
    let source_id = bulk(&admin(source, &["CLUSTER", "MYID"]));
    let target_id = bulk(&admin(target, &["CLUSTER", "MYID"]));
    // The target then answers the first `EVALSHA` it is asked for with `NOSCRIPT`.
    assert_ok(admin(target, &["SCRIPT", "FLUSH"]));

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (store, policy) = (store.clone(), Arc::clone(&policy));
            let (stop, admitted, denied) = (stop.clone(), admitted.clone(), denied.clone());
            let failures = Arc::clone(&failures);
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match store.acquire(&policy, user, 1).await {
                        Ok(d) if d.is_allowed() => admitted.fetch_add(1, Ordering::Relaxed),
                        Ok(_) => denied.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            failures.lock().expect("no panic holding it").push(e);
                            continue;
                        }
                    };
                }
            })
        })
        .collect();

    // Each phase must see decisions, or the migration did not happen under load.
    let mut progress = Vec::new();
    let phase = |name: &'static str| {
        let admitted = Arc::clone(&admitted);
        let before = admitted.load(Ordering::Relaxed);
        async move {
            tokio::time::sleep(PHASE).await;
            (name, admitted.load(Ordering::Relaxed) - before)
        }
    };
    progress.push(phase("before").await);
    assert_ok(admin(
        target,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
    ));
    assert_ok(admin(
        source,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
    ));
    // The key is still on the source, which serves it.
    progress.push(phase("migrating, key on the source").await);
    let migrate = [
        "MIGRATE",
        "127.0.0.1",
        &target.port().to_string(),
        "",
        "0",
        "5000",
        "KEYS",
        key,
    ];
    assert_ok(admin(source, &migrate));
    // The source answers `ASK` for every call: `ASKING` and the script on the target.
    progress.push(phase("migrating, key on the target").await);
    for node in [target, source, other] {
        assert_ok(admin(
            node,
            &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id],
        ));
    }
    // The source answers `MOVED` until the client has refreshed its slot map.
    progress.push(phase("moved").await);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("decider task");
    }

    let failures = std::mem::take(&mut *failures.lock().expect("no panic holding it"));
    assert!(
        failures.is_empty(),
        "{} failed decisions, first: {:?}",
        failures.len(),
        failures.first()
    );
    for (name, decisions) in &progress {
        assert!(
            *decisions > 0,
            "no decision during phase {name:?}: {progress:?}"
        );
    }
    // The redirects really happened, and the target needed the script's source.
    assert!(
        error_count(source, "ASK") > 0,
        "the source never answered ASK"
    );
    assert!(
        error_count(source, "MOVED") > 0,
        "the source never answered MOVED"
    );
    assert!(
        error_count(target, "NOSCRIPT") > 0,
        "the target never lacked the script"
    );
    assert_eq!(
        admin(target, &["EXISTS", key]),
        ":1\r\n",
        "the key is on the target"
    );

    // Exactly one token per admission: none replayed, none lost in the move.
    let admitted = admitted.load(Ordering::Relaxed) + 1;
    assert_eq!(denied.load(Ordering::Relaxed), 0);
    // A peek of cost 0: the tokens left, with nothing taken.
    let left = store
        .peek(&policy, user, 0)
        .await
        .expect("peek after the migration");
    assert_eq!(
        left.remaining,
        CAPACITY - admitted,
        "{admitted} admitted; phases {progress:?}"
    );
    // The harness's cluster takes a few seconds to form; the rest must stay well short.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

/// One admin command to one node, as its raw RESP reply. Blocking, and short: run in place
/// on the runtime's worker, while the deciders use the other.
fn admin(node: &RedisServer, args: &[&str]) -> String {
    tokio::task::block_in_place(|| node.command(args)).expect("admin command")
}

fn assert_ok(reply: String) {
    assert_eq!(reply, "+OK\r\n");
}

/// `:123\r\n` → 123.
fn integer(reply: &str) -> u64 {
    reply
        .strip_prefix(':')
        .and_then(|r| r.trim_end().parse().ok())
        .unwrap_or_else(|| panic!("not an integer reply: {reply:?}"))
}

/// `$40\r\n<text>\r\n` → text.
fn bulk(reply: &str) -> String {
    reply
        .split("\r\n")
        .nth(1)
        .filter(|_| reply.starts_with('$'))
        .unwrap_or_else(|| panic!("not a bulk reply: {reply:?}"))
        .to_owned()
}

/// How many times `node` answered with the error `code` (`INFO errorstats`).
fn error_count(node: &RedisServer, code: &str) -> u64 {
    let info = admin(node, &["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    info.split("\r\n")
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
