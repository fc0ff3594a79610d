//! The optimistic store's retry storm (issue 12): nodes running rein-redis's
//! `OptimisticStore` (`WATCH`, read, decide in the client, `MULTI`/`EXEC`, retry when `EXEC`
//! aborts) on one hot key. It stays exact, the oracle checks every window with no
//! allowance; but as nodes are added, more transactions lose their race, decisions wait
//! through more backoffs, and more of them give up (`Contended`) without a decision. Seeds
//! are pinned and printed.

mod common;

use std::time::Duration;

use common::run;
use rein_core::{Limit, Micros, Policy};
use sim::world::{LimiterKind, Scenario, Workload};

#[test]
fn the_optimistic_store_stays_exact_while_its_retries_storm_as_contention_grows() {
    let mut rows = Vec::new();
    for (seed, nodes) in [(951, 2), (952, 6), (953, 12)] {
        // A limit far above the demand: every decision admits, so every one writes, and
        // every write aborts the transactions that read before it.
        let run = exact_on_a_hot_key("optimistic-storm", seed, nodes, 100_000, 1_000);
        let decisions = run.events.len();
        let failed = run.failures();
        let mut latencies = run.latencies();
        latencies.sort();
        let p99 = latencies[latencies.len() * 99 / 100].as_micros();
        eprintln!(
            "{nodes} nodes: {decisions} decisions, {} admitted, {failed} without a decision, \
             p99 {p99} µs",
            run.admitted()
        );
        rows.push((nodes, failed * 1_000 / decisions.max(1), p99));
    }
    // Exact where the limit binds: 6 nodes asking 1 200 a second of a limit of 300, so every
    // window fills and a store that lost a race's write would over-admit (the limit above is
    // out of the demand's reach, so its check alone could not fail).
    let run = exact_on_a_hot_key("optimistic-exact", 954, 6, 300, 2_000);
    let denied = run.events.len() as u64 - run.failures() as u64 - run.admitted();
    assert!(
        denied > run.admitted() / 2 && run.admitted() >= 450,
        "the limit bound and was used: {} admitted, {denied} denied",
        run.admitted()
    );
    // The storm: with more writers on the key, more decisions run out of attempts and the
    // slowest ones wait longer.
    let (few, many) = (rows[0], rows[2]);
    assert!(
        many.1 > few.1,
        "failures per 1000 grew with contention: {rows:?}"
    );
    assert!(many.2 > few.2, "p99 latency grew with contention: {rows:?}");
}

/// `nodes` optimistic stores, 200 requests a second each, on a hot key of a fixed window of
/// `limit` a second for `span_ms`: the run, every window checked with no allowance.
fn exact_on_a_hot_key(
    name: &str,
    seed: u64,
    nodes: usize,
    limit: u64,
    span_ms: u64,
) -> sim::world::Run {
    let limit = Limit::fixed_window(limit, Micros::from_secs(1)).expect("valid");
    let mut s = Scenario::new(name, seed, nodes, Policy::single(limit));
    s.limiter = LimiterKind::Optimistic;
    s.workload = Workload::HotKey { keys: 1 };
    s.per_node_rate = 200;
    s.span = Duration::from_millis(span_ms);
    let run = run(&s);
    let result = run.result_with_allowance(0);
    assert!(
        result.is_within_bound(),
        "{name}, seed {seed}: over-admission {}",
        result.over_admission()
    );
    run
}
