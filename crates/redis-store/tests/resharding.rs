//! Resharding under load: the slot of a hot key migrates from one master of a local 3-master
//! Cluster to another while many tasks decide on that key, by hand or with
//! `redis-cli --cluster reshard`. The store follows every `ASK` and `MOVED` (and the
//! `NOSCRIPT` of a target whose script cache is empty) without replaying a call whose
//! outcome is unknown, and a policy's state is one key, which a migration moves whole
//! (issue 22), so no decision fails and the units taken are exactly the decisions admitted.
//! Run with `--nocapture` to see each decision's latency while steady and while migrating.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rein_core::{DecideError, Limit, LimitState, Limiter, Micros, Policy, StoreError};
use rein_redis::{Endpoint, RedisPolicy, RedisStoreBuilder};
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
    assert!(common::admits(&store, &policy, user.as_ref(), 1).await);
    let keys = store.keys(&policy, user).expect("valid key");
    let [key] = keys.as_slice() else {
        panic!("a single-limit policy has one key: {keys:?}")
    };

    let migration = Migration::of(nodes, key);
    let (source, target) = (migration.source, migration.target);
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
                    match store.acquire(None, &policy, user.as_ref(), 1).await {
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
    migration.begin();
    // The key is still on the source, which serves it.
    progress.push(phase("migrating, key on the source").await);
    migration.migrate(&[key]);
    // The source answers `ASK` for every call: `ASKING` and the script on the target.
    progress.push(phase("migrating, key on the target").await);
    migration.finish();
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
        .peek(None, &policy, user.as_ref(), 0)
        .await
        .expect("peek after the migration");
    assert_eq!(
        left.remaining,
        CAPACITY - admitted,
        "{admitted} admitted; phases {progress:?}"
    );
}

/// Issue 22: a policy of three limits used to be three keys, which a migration moved one by
/// one; while they sat on two nodes every call got `TRYAGAIN`, and a store that respects its
/// deadline failed. Its state is one key now. The slot holding a single-limit policy's key
/// and a 3-limit policy's key (one user key: one hash tag) migrates key by key, with pauses
/// between the steps far longer than the store's deadline, under concurrent load: no
/// decision fails, no node ever answers `TRYAGAIN`, and every admission is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_key_by_key_migration_fails_no_decision_of_a_single_or_multi_limit_policy() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let load = Load::start(&cluster, "slow-user").await;
    let [solo_key, trio_key] = load.keys();
    let migration = Migration::of(cluster.nodes(), &solo_key);
    assert_eq!(
        admin(migration.source, &["EXISTS", &trio_key]),
        ":1\r\n",
        "both policies' keys are in the slot"
    );

    load.phase("before").await;
    load.migrating(true);
    migration.begin();
    load.phase("migrating, both keys on the source").await;
    migration.migrate(&[&solo_key]);
    // The single-limit key answers `ASK` (served by the target), the 3-limit key is served
    // by the source: the slot is split, no decision's state is.
    load.phase("migrating, keys on two nodes").await;
    migration.migrate(&[&trio_key]);
    load.phase("migrating, both keys on the target").await;
    migration.finish();
    load.after_the_move(migration.target, &[&solo_key, &trio_key])
        .await;
    assert!(
        error_count(migration.source, "ASK") > 0,
        "the source never answered ASK"
    );
    let report = load.finish(&cluster).await;
    println!("slow key-by-key migration, deadline {DEADLINE:?}:\n{report}");
}

/// The same proof with the tool operators use: `redis-cli --cluster reshard` moves the
/// slot holding both policies' keys (and its neighbours) to another master under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_reshard_fails_no_decision_of_a_single_or_multi_limit_policy() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    // `reshard` moves the source's lowest slots first: pick a user key in one of them.
    let ranges = slot_ranges(&cluster.nodes()[0]);
    let (probe, _) = Load::policies();
    let probe_store = RedisStoreBuilder::new()
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    let user = (0..100_000)
        .map(|i| format!("reshard-{i}"))
        .find(|user| {
            let key = &probe_store.keys(&probe, user.as_str()).expect("valid key")[0];
            let slot = integer(&admin(&cluster.nodes()[0], &["CLUSTER", "KEYSLOT", key]));
            ranges.iter().any(|(_, first, last)| {
                (*first..=*last).contains(&slot) && slot < first + RESHARD_SLOTS
            })
        })
        .expect("a user key in some master's first slots");
    let user: &'static str = Box::leak(user.into_boxed_str());

    let load = Load::start(&cluster, user).await;
    let [solo_key, trio_key] = load.keys();
    let migration = Migration::of(cluster.nodes(), &solo_key);
    load.phase("before").await;
    load.migrating(true);
    let output = tokio::task::spawn_blocking({
        let (from, to) = (migration.source_id.clone(), migration.target_id.clone());
        let seed = format!("127.0.0.1:{}", migration.source.port());
        move || {
            let started = Instant::now();
            let output = std::process::Command::new("redis-cli")
                .args(["--cluster", "reshard", &seed, "--cluster-from", &from])
                .args(["--cluster-to", &to, "--cluster-slots"])
                .arg(RESHARD_SLOTS.to_string())
                .arg("--cluster-yes")
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run redis-cli --cluster reshard");
            (output, started.elapsed())
        }
    });
    // Decisions go on while it runs.
    while !output.is_finished() {
        load.phase("resharding").await;
    }
    let (output, resharding) = output.await.expect("reshard task");
    assert!(
        output.status.success(),
        "redis-cli --cluster reshard: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    load.after_the_move(migration.target, &[&solo_key, &trio_key])
        .await;
    let report = load.finish(&cluster).await;
    println!(
        "redis-cli --cluster reshard of {RESHARD_SLOTS} slots ({resharding:?}), \
         deadline {DEADLINE:?}:\n{report}"
    );
}

/// The load of the migration tests: [`TASKS`] deciders on a single-limit policy and as many
/// on a 3-limit policy, on one user key (so both keys share a slot), through a store with a
/// realistic deadline. Each decision's latency is kept, tagged steady or migrating.
struct Load {
    store: Store,
    solo: Arc<RedisPolicy>,
    trio: Arc<RedisPolicy>,
    user: &'static str,
    stop: Arc<AtomicBool>,
    migrating: Arc<AtomicBool>,
    /// Decisions so far, per policy: each phase must see some of both.
    decided: [Arc<AtomicU64>; 2],
    tasks: Vec<tokio::task::JoinHandle<Tally>>,
    phases: std::sync::Mutex<Vec<(&'static str, u64, u64)>>,
}

/// The store a deployment built from a configuration file or a flag holds
/// (`connect_to`, as rein-tower's `ConfiguredStore`, rein-server and the CLI connect): the
/// two tests of both policies run on it, the first test on `connect_cluster`'s.
type Store = rein_redis::RedisStore<rein_redis::AnyConnection>;

/// One decider's outcome.
#[derive(Default)]
struct Tally {
    /// 0: the single-limit policy, 1: the 3-limit one.
    which: usize,
    admitted: u64,
    denied: u64,
    failures: Vec<DecideError>,
    steady: Vec<Duration>,
    migrating: Vec<Duration>,
}

impl Load {
    /// A single token bucket of [`CAPACITY`], and a token bucket, a fixed window and a
    /// sliding counter of [`TRIO_CAPACITY`] each, refilled or rolled over too slowly to
    /// matter within the test (the windows are days, aligned to the epoch: one rolls over
    /// during a run about once in 20 000 runs), so every decision is admitted and each
    /// limit's remaining count is exact.
    fn policies() -> (RedisPolicy, RedisPolicy) {
        let day = Micros::from_secs(86_400);
        let bucket = |capacity| {
            Limit::token_bucket(capacity, 1, Micros::from_secs(600)).expect("valid bucket")
        };
        let trio = [
            bucket(TRIO_CAPACITY),
            Limit::fixed_window(TRIO_CAPACITY, day).expect("valid window"),
            Limit::sliding_counter(TRIO_CAPACITY, day).expect("valid counter"),
        ];
        (
            RedisPolicy::new("solo", Policy::single(bucket(CAPACITY))).expect("valid name"),
            RedisPolicy::new("trio", Policy::new(trio).expect("valid policy")).expect("valid name"),
        )
    }

    async fn start(cluster: &RedisCluster, user: &'static str) -> Self {
        let store = RedisStoreBuilder::new()
            .deadline(DEADLINE)
            .connect_to(&Endpoint::Cluster(cluster.urls()))
            .await
            .expect("connect to the cluster");
        let (solo, trio) = Self::policies();
        let (solo, trio) = (Arc::new(solo), Arc::new(trio));
        // One admission each before the load: both keys exist.
        for policy in [&solo, &trio] {
            let decision = store
                .acquire(None, policy, user.as_ref(), 1)
                .await
                .expect("first decision");
            assert!(decision.is_allowed());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let migrating = Arc::new(AtomicBool::new(false));
        let decided = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
        let mut tasks = Vec::new();
        for (which, policy) in [&solo, &trio].into_iter().enumerate() {
            for _ in 0..TASKS {
                let (store, policy) = (store.clone(), Arc::clone(policy));
                let (stop, migrating) = (Arc::clone(&stop), Arc::clone(&migrating));
                let decided = Arc::clone(&decided[which]);
                tasks.push(tokio::spawn(async move {
                    let mut tally = Tally {
                        which,
                        ..Tally::default()
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let during = migrating.load(Ordering::Relaxed);
                        let started = Instant::now();
                        let result = store.acquire(None, &policy, user.as_ref(), 1).await;
                        let took = started.elapsed();
                        match result {
                            Ok(d) if d.is_allowed() => tally.admitted += 1,
                            Ok(_) => tally.denied += 1,
                            Err(e) => {
                                tally.failures.push(e);
                                continue;
                            }
                        }
                        decided.fetch_add(1, Ordering::Relaxed);
                        if during {
                            tally.migrating.push(took);
                        } else {
                            tally.steady.push(took);
                        }
                    }
                    tally
                }));
            }
        }
        Self {
            store,
            solo,
            trio,
            user,
            stop,
            migrating,
            decided,
            tasks,
            phases: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The single-limit policy's key and the 3-limit policy's.
    fn keys(&self) -> [String; 2] {
        [&self.solo, &self.trio].map(|policy| {
            let keys = self.store.keys(policy, self.user).expect("valid key");
            let [key] = <[String; 1]>::try_from(keys).expect("a policy's state is one key");
            key
        })
    }

    fn migrating(&self, on: bool) {
        self.migrating.store(on, Ordering::Relaxed);
    }

    /// Lets the load run for [`SLOW_PHASE`], and notes how many decisions each policy got.
    async fn phase(&self, name: &'static str) {
        let before = self.decided.each_ref().map(|d| d.load(Ordering::Relaxed));
        tokio::time::sleep(SLOW_PHASE).await;
        let after = self.decided.each_ref().map(|d| d.load(Ordering::Relaxed));
        self.phases.lock().expect("no panic holding it").push((
            name,
            after[0] - before[0],
            after[1] - before[1],
        ));
    }

    /// Stops the load and checks it: no failure, decisions in every phase, no `TRYAGAIN`
    /// anywhere, and exactly one unit taken from every limit per admission. Returns the
    /// latency report.
    /// The end of a migration: a phase with the slot moved, one with the migration over,
    /// and then every key of `keys` is on `target`.
    async fn after_the_move(&self, target: &RedisServer, keys: &[&str]) {
        self.phase("moved").await;
        self.migrating(false);
        self.phase("after").await;
        let exists = admin(target, &[&["EXISTS"], keys].concat());
        assert_eq!(
            exists,
            format!(":{}\r\n", keys.len()),
            "every key is on the target"
        );
    }

    async fn finish(self, cluster: &RedisCluster) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let mut tallies = Vec::new();
        for task in self.tasks {
            tallies.push(task.await.expect("decider task"));
        }
        let phases = self.phases.into_inner().expect("no panic holding it");
        let failures: Vec<_> = tallies.iter().flat_map(|t| &t.failures).collect();
        assert!(
            failures.is_empty(),
            "{} failed decisions, first: {:?}; phases {phases:?}",
            failures.len(),
            failures.first()
        );
        for (name, solo, trio) in &phases {
            assert!(
                *solo > 0 && *trio > 0,
                "a policy had no decision during {name:?}: {phases:?}"
            );
        }
        for node in cluster.nodes() {
            assert_eq!(
                error_count(node, "TRYAGAIN"),
                0,
                "a decision's state was split"
            );
        }
        let mut report = String::new();
        for (which, policy) in [&self.solo, &self.trio].into_iter().enumerate() {
            let mine = || tallies.iter().filter(|t| t.which == which);
            assert_eq!(mine().map(|t| t.denied).sum::<u64>(), 0);
            // The first decision of `start`, then every admission of the load.
            let admitted = 1 + mine().map(|t| t.admitted).sum::<u64>();
            let left = self
                .store
                .peek(None, policy, self.user.as_ref(), 0)
                .await
                .expect("peek after the migration");
            assert_eq!(
                left.remaining,
                policy.policy().capacity() - admitted,
                "{}: {admitted} admitted; phases {phases:?}",
                policy.name()
            );
            // Each limit on its own: the window and the counter counted every admission.
            let state = self.store.state(policy, self.user).await.expect("state");
            for limit in state.iter() {
                match limit {
                    LimitState::FixedWindow(w) => assert_eq!(w.count, admitted),
                    LimitState::SlidingCounter(c) => {
                        assert_eq!((c.current, c.previous), (admitted, 0))
                    }
                    LimitState::TokenBucket(_) | LimitState::SlidingLog(_) => {}
                }
            }
            let steady: Vec<_> = mine().flat_map(|t| t.steady.iter().copied()).collect();
            let migrating: Vec<_> = mine().flat_map(|t| t.migrating.iter().copied()).collect();
            report += &format!(
                "  {}: {admitted} admitted; steady {}; migrating {}\n",
                policy.name(),
                percentiles(steady),
                percentiles(migrating)
            );
        }
        report + &format!("  phases (name, single-limit, 3-limit decisions): {phases:?}")
    }
}

/// `n=…, p50 …, p99 …, max …` of some latencies.
fn percentiles(mut latencies: Vec<Duration>) -> String {
    latencies.sort_unstable();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len());
        latencies[i - 1]
    };
    if latencies.is_empty() {
        return "n=0".to_owned();
    }
    format!(
        "n={}, p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    )
}

/// Each master's slot range, from `CLUSTER NODES`: (node id, first slot, last slot).
fn slot_ranges(node: &RedisServer) -> Vec<(String, u64, u64)> {
    let nodes = admin(node, &["CLUSTER", "NODES"]);
    nodes
        .lines()
        .filter(|line| line.contains("master"))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (first, last) = fields.get(8)?.split_once('-')?;
            Some((
                fields[0].to_owned(),
                first.parse().ok()?,
                last.parse().ok()?,
            ))
        })
        .collect()
}

/// The migration tests' store deadline: realistic for a LAN (a debug build on a loaded
/// 2-core machine still decides well within it), and far below the pauses between the
/// migration's steps, so that what the tests prove is that no step splits a decision's
/// state, not that the deadline outlasts the split.
const DEADLINE: Duration = Duration::from_millis(150);

/// How long the migration tests let the load run per phase, the pauses between a slow
/// migration's steps among them: more than twice [`DEADLINE`].
const SLOW_PHASE: Duration = Duration::from_millis(400);

/// Each limit of the 3-limit policy: the most a sliding counter over a day holds exactly
/// (`limit × window` stays below 2^52), far more than the test decides.
const TRIO_CAPACITY: u64 = 50_000;

/// How many slots `redis-cli --cluster reshard` moves, the keys' among them.
const RESHARD_SLOTS: u64 = 20;

/// The least-privilege user of docs/redis.md on a Cluster follows a migration: a decision
/// on a key already moved is served by the importing node after `ASKING`. Without
/// `+asking` the call bounces between the two nodes (the importing node answers the
/// unflagged script with `MOVED`), and ends with a server error naming `+asking` (before, a
/// connection error once its resends ran out, which named nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privilege_user_follows_a_migration_and_a_refused_asking_is_named() {
    let cluster = RedisCluster::start().expect("start redis cluster");
    let nodes = cluster.nodes();
    // ACLs are each node's own.
    for node in nodes {
        for (user, asking) in [("rein", true), ("noask", false)] {
            let acl: Vec<&str> = common::LEAST_PRIVILEGE
                .iter()
                .chain(&common::CLUSTER_PRIVILEGE)
                .map(|part| if *part == "rein" { user } else { part })
                .filter(|part| asking || *part != "+asking")
                .collect();
            assert_ok(admin(node, &acl));
        }
    }
    let connect = |user: &'static str| {
        let urls: Vec<String> = nodes
            .iter()
            .map(|n| format!("redis://{user}:pw@127.0.0.1:{}/", n.port()))
            .collect();
        RedisStoreBuilder::new()
            .deadline(Duration::from_secs(5))
            .connect_cluster(urls)
    };
    let asks = connect("rein").await.expect("connect as the ACL user");
    let refused = connect("noask").await.expect("connect without +asking");
    let bucket = Limit::token_bucket(10, 1, Micros::from_secs(600)).expect("valid");
    let policy = RedisPolicy::new("acl", Policy::single(bucket)).expect("valid name");
    assert!(common::admits(&asks, &policy, b"moved", 1).await);
    let keys = asks.keys(&policy, "moved").expect("valid key");
    let migration = Migration::of(nodes, &keys[0]);
    migration.begin();
    migration.migrate(&[&keys[0]]);
    assert!(
        common::admits(&asks, &policy, b"moved", 1).await,
        "served by the importing node"
    );
    // Reading the key follows the migration too (before, a plain `GET`, answered `ASK`):
    // two tokens taken of ten.
    let read = asks
        .state(&policy, "moved")
        .await
        .expect("the moved key's state");
    let now = rein_core::Timestamp::from_micros(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_micros() as u64,
    );
    let left = policy
        .policy()
        .peek(now, &read, 0)
        .expect("a peek")
        .remaining;
    assert_eq!(
        left, 8,
        "two taken, none back within the test (one per 10 min)"
    );
    // So does a reset, through the operators' script (before, a plain `DEL`: `ASK`).
    let reset = rein_core::admin::KeyAdmin::reset(&asks, &policy, b"moved").await;
    assert!(matches!(reset, Ok(true)), "{reset:?}");
    match refused.acquire(None, &policy, b"moved", 1).await {
        Err(DecideError::Unavailable(StoreError::Server(e)))
            if e.to_string().contains("+asking") => {}
        other => panic!("expected an error naming +asking: {other:?}"),
    }
    migration.finish();
}

/// Moving one slot by hand, in the order Redis documents: `IMPORTING` on the target,
/// `MIGRATING` on the source, `MIGRATE` of its keys, then `NODE` on every node, the
/// target first.
struct Migration<'a> {
    slot: String,
    source: &'a RedisServer,
    target: &'a RedisServer,
    other: &'a RedisServer,
    source_id: String,
    target_id: String,
}

impl<'a> Migration<'a> {
    /// The slot of `key`, from the node that holds it to the next one.
    fn of(nodes: &'a [RedisServer], key: &str) -> Self {
        let slot = integer(&admin(&nodes[0], &["CLUSTER", "KEYSLOT", key])).to_string();
        let source = (0..nodes.len())
            .find(|&i| admin(&nodes[i], &["EXISTS", key]) == ":1\r\n")
            .expect("the key is on one node");
        let target = (source + 1) % nodes.len();
        let (source, target, other) = (
            &nodes[source],
            &nodes[target],
            &nodes[(target + 1) % nodes.len()],
        );
        Self {
            slot,
            source_id: bulk(&admin(source, &["CLUSTER", "MYID"])),
            target_id: bulk(&admin(target, &["CLUSTER", "MYID"])),
            source,
            target,
            other,
        }
    }

    fn begin(&self) {
        let slot = self.slot.as_str();
        assert_ok(admin(
            self.target,
            &["CLUSTER", "SETSLOT", slot, "IMPORTING", &self.source_id],
        ));
        assert_ok(admin(
            self.source,
            &["CLUSTER", "SETSLOT", slot, "MIGRATING", &self.target_id],
        ));
    }

    fn migrate(&self, keys: &[&str]) {
        let port = self.target.port().to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        migrate.extend_from_slice(keys);
        assert_ok(admin(self.source, &migrate));
    }

    fn finish(&self) {
        for node in [self.target, self.source, self.other] {
            assert_ok(admin(
                node,
                &["CLUSTER", "SETSLOT", &self.slot, "NODE", &self.target_id],
            ));
        }
    }
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
