//! Demand: what each node is asked to admit, and when, drawn from the scenario's seed.
//!
//! A workload is generated before the world runs, as one list of [`Request`]s per node, so
//! the demand of a scenario is a pure function of its seed: faults and latencies change
//! what is admitted, never what was asked. Each node sends its requests one after another
//! (a request due while the previous one is in flight waits for it), which is how one
//! worker of an application server calls its limiter.

use std::time::Duration;

use super::rng::Rng;

/// The shape of the demand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// One key, arrivals at `per_node_rate` per second per node, each gap jittered
    /// uniformly within ±50 % of the mean.
    Steady,
    /// One key, arrivals in bursts of `burst` back-to-back requests, bursts spaced so the
    /// mean rate is `per_node_rate`.
    Bursty {
        /// Requests per burst.
        burst: u32,
    },
    /// Steady timing; 80 % of requests on key 0, the rest spread over keys `1..keys`.
    HotKey {
        /// How many keys in all (at least 2).
        keys: u64,
    },
    /// Steady timing; every request on a key drawn uniformly from `0..keys`.
    ManyKeys {
        /// How many keys.
        keys: u64,
    },
    /// One key, steady timing, except that node 0 asks only in on-phases of `on`, each
    /// followed by a silence of `off` (a client that comes and goes, issue 23).
    OnOff {
        /// How long each on-phase lasts.
        on: Duration,
        /// How long each silence lasts.
        off: Duration,
    },
    /// One key, steady timing; the hot node changes every `every` (node 0 first, then 1,
    /// …, round the nodes) and asks `hot` times as often as the others.
    Shifting {
        /// How long each node stays hot.
        every: Duration,
        /// How many times the others' rate the hot node asks at.
        hot: u32,
    },
}

/// One request a node will make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// When it is due, from the start of the demand.
    pub due: Duration,
    /// The key it is for.
    pub key: u64,
    /// The cost it asks for.
    pub cost: u64,
}

impl Workload {
    /// Each node's requests over `span`, at `per_node_rate` requests per second per node,
    /// drawn from `rng`'s child per node.
    pub fn generate(
        &self,
        rng: &Rng,
        nodes: usize,
        per_node_rate: u64,
        span: Duration,
    ) -> Vec<Vec<Request>> {
        (0..nodes)
            .map(|node| self.for_node(rng.child(node as u64), (node, nodes), per_node_rate, span))
            .collect()
    }

    /// A short description for tables, e.g. `hot key (80 % of 8 keys)`.
    pub fn describe(&self) -> String {
        match self {
            Workload::Steady => "steady, one key".to_owned(),
            Workload::Bursty { burst } => format!("bursts of {burst}, one key"),
            Workload::HotKey { keys } => format!("hot key (80 % on 1 of {keys} keys)"),
            Workload::ManyKeys { keys } => format!("{keys} keys, uniform"),
            Workload::OnOff { on, off } => format!(
                "one key, node 0 on {} ms / off {} ms",
                on.as_millis(),
                off.as_millis()
            ),
            Workload::Shifting { every, hot } => format!(
                "one key, hot node ({hot}×) shifting every {} ms",
                every.as_millis()
            ),
        }
    }

    fn for_node(
        &self,
        mut rng: Rng,
        (node, nodes): (usize, usize),
        per_node_rate: u64,
        span: Duration,
    ) -> Vec<Request> {
        let span_us = span.as_micros() as u64;
        let mean_gap = 1_000_000 / per_node_rate.max(1);
        let mut requests = Vec::new();
        // A random phase, so nodes do not all start on the same tick.
        let mut at = rng.below(mean_gap.max(1));
        while at < span_us {
            match *self {
                Workload::Bursty { burst } => {
                    for _ in 0..burst.max(1) {
                        requests.push(request(at, 0));
                    }
                    let gap = mean_gap * u64::from(burst.max(1));
                    at += rng.between(gap / 2, gap + gap / 2);
                    continue;
                }
                Workload::Steady => requests.push(request(at, 0)),
                Workload::HotKey { keys } => {
                    let key = if keys < 2 || rng.chance(80) {
                        0
                    } else {
                        1 + rng.below(keys - 1)
                    };
                    requests.push(request(at, key));
                }
                Workload::ManyKeys { keys } => requests.push(request(at, rng.below(keys.max(1)))),
                Workload::OnOff { on, off } => {
                    let (on, off) = (on.as_micros() as u64, off.as_micros() as u64);
                    let cycle = (on + off).max(1);
                    if node == 0 && at % cycle >= on {
                        // Silent until the next on-phase.
                        at += cycle - at % cycle;
                        continue;
                    }
                    requests.push(request(at, 0));
                }
                Workload::Shifting { every, hot } => {
                    requests.push(request(at, 0));
                    let turn = at / (every.as_micros() as u64).max(1);
                    if turn % nodes.max(1) as u64 == node as u64 {
                        let gap = mean_gap / u64::from(hot.max(1));
                        at += rng.between(gap / 2, gap + gap / 2).max(1);
                        continue;
                    }
                }
            }
            at += rng.between(mean_gap / 2, mean_gap + mean_gap / 2).max(1);
        }
        requests
    }
}

fn request(at_us: u64, key: u64) -> Request {
    Request {
        due: Duration::from_micros(at_us),
        key,
        cost: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_a_function_of_the_seed_and_near_the_rate() {
        let span = Duration::from_secs(10);
        let a = Workload::HotKey { keys: 8 }.generate(&Rng::new(1), 3, 100, span);
        let b = Workload::HotKey { keys: 8 }.generate(&Rng::new(1), 3, 100, span);
        assert_eq!(a, b);
        assert_ne!(
            a,
            Workload::HotKey { keys: 8 }.generate(&Rng::new(2), 3, 100, span)
        );
        for node in &a {
            assert!((900..=1100).contains(&node.len()), "{}", node.len());
            assert!(node.windows(2).all(|w| w[0].due <= w[1].due));
            assert!(node.iter().all(|r| r.due < span && r.key < 8));
        }
        let bursty = Workload::Bursty { burst: 5 }.generate(&Rng::new(1), 1, 100, span);
        assert!((900..=1100).contains(&bursty[0].len()));
    }

    #[test]
    fn an_on_off_node_is_silent_between_its_phases_and_a_shifting_hot_node_asks_more() {
        let span = Duration::from_secs(7);
        let (on, off) = (Duration::from_millis(300), Duration::from_millis(400));
        let a = Workload::OnOff { on, off }.generate(&Rng::new(3), 3, 100, span);
        // Node 0 asks only in the first 300 ms of every 700: 3/7 of the others' demand.
        assert!(a[0].iter().all(|r| r.due.as_micros() % 700_000 < 300_000));
        assert!((250..=350).contains(&a[0].len()), "{}", a[0].len());
        assert!((600..=800).contains(&a[1].len()), "{}", a[1].len());
        let every = Duration::from_secs(1);
        let b = Workload::Shifting { every, hot: 5 }.generate(&Rng::new(3), 2, 100, span);
        // Node 0 is hot in even seconds, node 1 in odd ones, at five times the rate.
        let in_second = |node: &[Request], s: u128| {
            node.iter()
                .filter(|r| r.due.as_micros() / 1_000_000 == s)
                .count()
        };
        assert!(
            (400..=600).contains(&in_second(&b[0], 2)),
            "{}",
            in_second(&b[0], 2)
        );
        assert!(
            (80..=120).contains(&in_second(&b[0], 3)),
            "{}",
            in_second(&b[0], 3)
        );
        assert!(
            (400..=600).contains(&in_second(&b[1], 3)),
            "{}",
            in_second(&b[1], 3)
        );
    }
}
