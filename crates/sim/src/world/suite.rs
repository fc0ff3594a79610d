//! The default scenarios: the report's rows, one per fault class, each with its bound.

use std::num::NonZeroU32;
use std::time::Duration;

use rein::{AllowCacheConfig, BreakerConfig, FailurePolicy};
use rein_core::overrides::Override;
use rein_core::{Limit, Micros, Policy};

use super::{
    Fault, Guard, LimiterKind, OverrideChange, OverrideSchedule, Scenario, TimeSource, Workload,
};
use crate::redis::Persistence;

/// The default suite's scenario names, in report order.
pub const SUITE: &[&str] = &[
    "healthy-token-bucket",
    "healthy-sliding-log",
    "healthy-fixed-window",
    "healthy-sliding-counter",
    "hot-key-bursty",
    "skew-server-time",
    "skew-client-time",
    "redis-crash-data-loss",
    "script-cache-loss",
    "stall-past-deadline",
    "naive-baseline",
    "partition-fail-closed",
    "partition-local-fallback",
    "partition-fail-open",
    "replies-lost-local-fallback",
    "requests-lost-local-fallback",
    "deny-cache",
    "allow-cache",
    "recovery-after-partition",
    "overrides-during-partition",
    "leased-fixed-window",
    "leased-sliding-counter",
    "leased-sliding-log",
    "leased-token-bucket",
    "leased-partition-fixed-window",
    "leased-partition-token-bucket",
    "leased-pause-sliding-log",
    "leased-bursty-fixed-window",
    "leased-bursty-sliding-counter",
    "leased-bursty-sliding-log",
    "leased-bursty-token-bucket",
    "leased-shifting-fixed-window",
    "leased-shifting-sliding-counter",
    "leased-shifting-sliding-log",
    "leased-shifting-token-bucket",
    "leased-killed-fixed-window",
    "leased-killed-sliding-counter",
    "leased-killed-sliding-log",
    "leased-killed-token-bucket",
];

/// The scenario `name` of the default suite with `nodes` nodes and `seed`; `None` for an
/// unknown name.
pub fn suite_scenario(name: &str, nodes: usize, seed: u64) -> Option<Scenario> {
    let bucket = || policy(Limit::token_bucket(20, 100, Micros::from_secs(1)));
    let window = Micros::from_secs(1);
    let mut s = match name {
        "healthy-token-bucket" => Scenario::new(name, seed, nodes, bucket()),
        "healthy-sliding-log" => {
            Scenario::new(name, seed, nodes, policy(Limit::sliding_log(100, window)))
        }
        "healthy-fixed-window" => {
            Scenario::new(name, seed, nodes, policy(Limit::fixed_window(100, window)))
        }
        "healthy-sliding-counter" => Scenario::new(
            name,
            seed,
            nodes,
            policy(Limit::sliding_counter(100, window)),
        ),
        "hot-key-bursty" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.workload = Workload::HotKey { keys: 8 };
            s.max_latency = Duration::from_millis(8);
            s.faults = vec![Fault::Latency {
                from: Duration::from_millis(500),
                until: Duration::from_millis(1500),
                max: Duration::from_millis(25),
            }];
            s
        }
        "skew-server-time" | "skew-client-time" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.max_skew = Duration::from_millis(100);
            if name == "skew-client-time" {
                s.time = TimeSource::Client;
            }
            s
        }
        "redis-crash-data-loss" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.faults = vec![Fault::RedisCrash {
                at: Duration::from_millis(800),
                down: Duration::from_millis(30),
            }];
            s
        }
        "script-cache-loss" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.persistence = Persistence::KeepData;
            s.faults = vec![Fault::ScriptFlush {
                from: Duration::from_millis(100),
                until: Duration::from_millis(1900),
                every: Duration::from_millis(7),
            }];
            s
        }
        "stall-past-deadline" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.faults = vec![Fault::Stall {
                nodes: (0..nodes).collect(),
                from: Duration::from_millis(700),
                until: Duration::from_millis(1000),
            }];
            s
        }
        "naive-baseline" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.limiter = LimiterKind::Naive;
            s
        }
        "partition-fail-closed" | "partition-local-fallback" | "partition-fail-open" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            let expected_nodes = NonZeroU32::new(nodes.max(1) as u32).unwrap_or(NonZeroU32::MIN);
            s.guard = Some(Guard::new(match name {
                "partition-fail-closed" => FailurePolicy::FailClosed,
                "partition-fail-open" => FailurePolicy::FailOpen,
                _ => FailurePolicy::LocalFallback { expected_nodes },
            }));
            s.span = Duration::from_secs(3);
            s.faults = vec![Fault::Partition {
                nodes: (0..nodes.div_ceil(2)).collect(),
                from: Duration::from_millis(600),
                until: Duration::from_millis(1400),
            }];
            s
        }
        "replies-lost-local-fallback" | "requests-lost-local-fallback" => {
            // The partition scenario's shape with one direction cut: the cut nodes' calls
            // reach Redis, which counts them, but they never hear back (or the calls are
            // lost on the way and Redis hears nothing).
            let mut s = Scenario::new(name, seed, nodes, bucket());
            let expected_nodes = NonZeroU32::new(nodes.max(1) as u32).unwrap_or(NonZeroU32::MIN);
            s.guard = Some(Guard::new(FailurePolicy::LocalFallback { expected_nodes }));
            s.span = Duration::from_secs(3);
            let (nodes, from, until) = (
                (0..nodes.div_ceil(2)).collect(),
                Duration::from_millis(600),
                Duration::from_millis(1400),
            );
            s.faults = vec![if name == "replies-lost-local-fallback" {
                Fault::RepliesLost { nodes, from, until }
            } else {
                Fault::RequestsLost { nodes, from, until }
            }];
            s
        }
        "deny-cache" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            s.guard = Some(Guard::new(FailurePolicy::FailClosed));
            s.workload = Workload::Bursty { burst: 5 };
            s
        }
        "allow-cache" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            let mut guard = Guard::new(FailurePolicy::FailClosed);
            guard.allow_cache = Some(AllowCacheConfig::new(
                Duration::from_millis(100),
                NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN),
            ));
            s.guard = Some(guard);
            s
        }
        "recovery-after-partition" => {
            let mut s = Scenario::new(name, seed, nodes, bucket());
            let expected_nodes = NonZeroU32::new(nodes.max(1) as u32).unwrap_or(NonZeroU32::MIN);
            let mut guard = Guard::new(FailurePolicy::LocalFallback { expected_nodes });
            guard.breaker = BreakerConfig::new()
                .with_backoff(Duration::from_millis(50), Duration::from_millis(400));
            s.guard = Some(guard);
            s.span = Duration::from_secs(4);
            s.faults = vec![Fault::Partition {
                nodes: (0..nodes).collect(),
                from: Duration::from_millis(500),
                until: Duration::from_millis(2000),
            }];
            s
        }
        "overrides-during-partition" => overrides_during_partition(name, seed, nodes),
        "leased-fixed-window"
        | "leased-sliding-counter"
        | "leased-sliding-log"
        | "leased-token-bucket"
        | "leased-partition-fixed-window"
        | "leased-partition-token-bucket"
        | "leased-pause-sliding-log" => leased(name, seed, nodes),
        _ if name.starts_with("leased-bursty-")
            || name.starts_with("leased-shifting-")
            || name.starts_with("leased-killed-") =>
        {
            leased_traffic(name, seed, nodes)?
        }
        _ => return None,
    };
    if nodes == 0 {
        s.nodes = 1;
    }
    Some(s)
}

/// A lease scenario (docs/leases.md, "In the simulator"): nodes behind rein's
/// `LeasedLimiter`, two hot keys asked 120 times a second per node against a limit of 150
/// a second per key, node clocks up to 250 ms apart. Faulted ones last 3 s: half the nodes
/// cut off from Redis 0.6–1.4 s, or node 0's process paused 0.85–2.15 s (longer than any
/// block lives, across two window boundaries).
fn leased(name: &str, seed: u64, nodes: usize) -> Scenario {
    let window = Micros::from_secs(1);
    let limit = match name {
        "leased-fixed-window" | "leased-partition-fixed-window" => Limit::fixed_window(150, window),
        "leased-sliding-counter" => Limit::sliding_counter(150, window),
        "leased-sliding-log" | "leased-pause-sliding-log" => Limit::sliding_log(150, window),
        // Leased as rate: a burst of 30, 150 per second.
        _ => Limit::token_bucket(30, 150, window),
    };
    let mut s = Scenario::new(name, seed, nodes, policy(limit));
    s.limiter = LimiterKind::Leased;
    s.workload = Workload::HotKey { keys: 2 };
    s.per_node_rate = 120;
    s.max_skew = Duration::from_millis(250);
    if name.starts_with("leased-partition") {
        s.span = Duration::from_secs(3);
        s.faults = vec![Fault::Partition {
            nodes: (0..nodes.div_ceil(2)).collect(),
            from: Duration::from_millis(600),
            until: Duration::from_millis(1400),
        }];
    } else if name.starts_with("leased-pause") {
        s.span = Duration::from_secs(3);
        s.faults = vec![Fault::Pause {
            nodes: vec![0],
            from: Duration::from_millis(900),
            until: Duration::from_millis(2150),
        }];
    }
    s
}

/// A lease scenario under real traffic (issue 23; docs/leases.md, "Utilisation under real
/// traffic"): one key, a limit of 150 per second (a token bucket: a burst of 30, 150 per
/// second), demand about three times the limit split unevenly, for 4 s, node clocks up to
/// 250 ms apart:
/// - `bursty`: node 0 asks only in on-phases of 300 ms, each followed by 400 ms of silence
///   (shorter than a second), the others steadily; 130 per second per node when asking;
/// - `shifting`: the hot node changes every second and asks five times as often as the
///   others (56 per second, 280 hot);
/// - `killed`: as `shifting`, and node 1 is killed at 1.5 s, half-way through its hot
///   second: its blocks and shares are never given back.
///
/// `None` for an unknown algorithm suffix.
fn leased_traffic(name: &str, seed: u64, nodes: usize) -> Option<Scenario> {
    let window = Micros::from_secs(1);
    let limit = if name.ends_with("-fixed-window") {
        Limit::fixed_window(150, window)
    } else if name.ends_with("-sliding-counter") {
        Limit::sliding_counter(150, window)
    } else if name.ends_with("-sliding-log") {
        Limit::sliding_log(150, window)
    } else if name.ends_with("-token-bucket") {
        Limit::token_bucket(30, 150, window)
    } else {
        return None;
    };
    let mut s = Scenario::new(name, seed, nodes, policy(limit));
    s.limiter = LimiterKind::Leased;
    s.max_skew = Duration::from_millis(250);
    s.span = Duration::from_secs(4);
    if name.starts_with("leased-bursty-") {
        s.workload = Workload::OnOff {
            on: Duration::from_millis(300),
            off: Duration::from_millis(400),
        };
        s.per_node_rate = 130;
    } else {
        s.workload = Workload::Shifting {
            every: Duration::from_secs(1),
            hot: 5,
        };
        s.per_node_rate = 56;
    }
    if name.starts_with("leased-killed-") {
        s.faults = vec![Fault::Kill {
            nodes: vec![1.min(nodes.saturating_sub(1))],
            at: Duration::from_millis(1_500),
        }];
    }
    Some(s)
}

/// Key 0's override changed while node 0 cannot reach Redis (issue 25; overrides.rs states
/// the bound). One key, a fixed window of 100 per second, 150 requests per second per node
/// (every window saturated), each store re-reading the overrides at most every 200 ms, a
/// local fallback at a share of the policy's own limit, no deny cache (every decision of a
/// node that reaches Redis asks it: the harsher case), a breaker probing every 50 ms; for
/// 4.5 s, with
/// Redis's windows at 0.8 s, 1.8 s, ... from the start of demand:
/// - 0.0 s: the operator raises key 0 to 160 per second;
/// - 0.9 s: node 0 is cut off from Redis, holding its copy of the raised override;
/// - 1.1 s: the operator lowers key 0 to 30 per second, when its window has counted more
///   than that: what the other nodes admit until they re-read is over the new limit. 30 is
///   below the policy's share for three nodes (33): what node 0 admits on its own then
///   shows which limit its fallback follows;
/// - 3.0 s: the partition heals; node 0 decides in Redis by its copy of the raised override
///   until it re-reads, then by the lowered one.
fn overrides_during_partition(name: &str, seed: u64, nodes: usize) -> Scenario {
    let window = Micros::from_secs(1);
    let mut s = Scenario::new(name, seed, nodes, policy(Limit::fixed_window(100, window)));
    let expected_nodes = NonZeroU32::new(nodes.max(1) as u32).unwrap_or(NonZeroU32::MIN);
    let mut guard = Guard::new(FailurePolicy::LocalFallback { expected_nodes });
    guard.deny_cache = false;
    guard.breaker =
        BreakerConfig::new().with_backoff(Duration::from_millis(50), Duration::from_millis(50));
    s.guard = Some(guard);
    s.per_node_rate = 150;
    s.span = Duration::from_millis(4_500);
    s.faults = vec![Fault::Partition {
        nodes: vec![0],
        from: Duration::from_millis(900),
        until: Duration::from_millis(3_000),
    }];
    let to = |limit: u64| Some(Override::Limits(policy(Limit::fixed_window(limit, window))));
    s.overrides = Some(OverrideSchedule {
        staleness: Duration::from_millis(200),
        changes: vec![
            OverrideChange {
                at: Duration::ZERO,
                value: to(160),
            },
            OverrideChange {
                at: Duration::from_millis(1_100),
                value: to(30),
            },
        ],
    });
    s
}

fn policy(limit: Result<Limit, rein_core::ConfigError>) -> Policy {
    // The suite's limits are constants, valid by construction.
    Policy::single(limit.expect("the suite's limits are valid"))
}
