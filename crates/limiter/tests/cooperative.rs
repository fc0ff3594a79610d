//! A task that loops on decisions the limiter answers without waiting (cached denials) must
//! not starve the other tasks of a single-threaded runtime: seen in a benchmark, where a
//! task spinning on a denied key held the thread until the cached denial ran out, and the
//! limiter's own store calls behind it timed out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rein::{FailurePolicy, PolicyTable, ResilientLimiter, Source};
use rein_core::{Limit, Micros, NamedPolicy, Policy};
use rein_memory::MemoryStore;

#[tokio::test(flavor = "current_thread")]
async fn a_task_spinning_on_cached_denials_lets_other_tasks_run() {
    let policy = NamedPolicy::new(
        "spin",
        Policy::single(Limit::fixed_window(1, Micros::from_secs(3_600)).expect("valid")),
    )
    .expect("valid name");
    let limiter = ResilientLimiter::builder(
        MemoryStore::new(),
        PolicyTable::new(policy),
        FailurePolicy::FailClosed,
    )
    .build()
    .expect("limiter");
    assert!(limiter.acquire("k", 1).await.expect("valid").is_allowed());
    let denied = limiter.acquire("k", 1).await.expect("valid");
    assert_eq!(denied.source, Source::Store);
    assert_eq!(
        limiter.acquire("k", 1).await.expect("valid").source,
        Source::DenyCache
    );

    let other_ran = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let other_ran = Arc::clone(&other_ran);
        async move { other_ran.store(true, Ordering::SeqCst) }
    });
    // Spin on the cached denial, never awaiting anything else. Before the fix the spawned
    // task could not run until the loop ended.
    let mut spins = 0u32;
    while !other_ran.load(Ordering::SeqCst) && spins < 100_000 {
        let decided = limiter.acquire("k", 1).await.expect("valid");
        assert!(!decided.is_allowed());
        spins += 1;
    }
    assert!(
        other_ran.load(Ordering::SeqCst),
        "the other task never ran in {spins} decisions"
    );
    // A few budgets' worth at most (tokio's budget is 128 operations).
    assert!(spins < 1_000, "{spins} decisions before the other task ran");
}
