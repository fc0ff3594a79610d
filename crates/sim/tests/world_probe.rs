use sim::world::suite_scenario;

#[test]
fn probe() {
    for name in ["partition-fail-closed","partition-local-fallback","partition-fail-open","deny-cache","allow-cache","recovery-after-partition"] {
        let t = std::time::Instant::now();
        let s = suite_scenario(name, 4, 1).unwrap();
        let run = s.run().unwrap();
        let fb = s.fallback_bound(2).map(|p| run.log.check_policy(&p, 0).is_within_bound());
        let ab = s.allow_cache_bound().map(|p| run.log.check_policy(&p, 0).is_within_bound());
        eprintln!("{} | within(allowance) {} fb {:?} ab {:?} | sources {:?} | fallback {:?} | untraced {} | {:?}", run.summary(), run.result().is_within_bound(), fb, ab, run.by_source(), run.fallback_time(), run.untraced(), t.elapsed());
        if name.starts_with("recovery") || name.starts_with("partition") {
            let until = sim::world::EPOCH_SECS * 1_000_000 + 200_000 + if name.starts_with("recovery") {2_000_000} else {1_400_000};
            for n in 0..4 { eprintln!("  node {n} back on redis after {:?} µs", run.back_on_redis(n, rein_core::Timestamp::from_micros(until)).map(|t| t.as_micros() - until)); }
        }
    }
}
