//! Faults: what goes wrong, when, and how it is applied to the turmoil world.
//!
//! A scenario lists its faults with times relative to the start of the demand. The runner
//! turns them into a schedule of [`Action`]s and applies each between simulation steps,
//! from the test body, the way turmoil's own tests script chaos inline: `partition` /
//! `repair` for cut links, `hold` / `release` for stalls (messages delayed, not lost),
//! `partition_oneway` / `repair_oneway` for a link that loses messages one way only, a
//! node's paused process (its links held, its software told by the schedule it gets:
//! see [`Fault::Pause`]),
//! `crash` / `bounce` for a Redis restart (whose data survives or not per the host's
//! [`Persistence`](crate::redis::Persistence)), and an in-place script-cache flush for a
//! failover or `SCRIPT FLUSH` that keeps connections up.

use std::collections::BTreeSet;
use std::time::Duration;

use rein_core::Timestamp;

use crate::oracle::Interval;
use crate::redis::Shared;
use crate::report::FaultSpan;

use super::{REDIS_HOST, host_name};

/// One fault of a scenario. Times are from the start of the demand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The listed nodes cannot reach Redis from `from` until `until`; their open TCP
    /// streams die (turmoil does not retransmit) and connects fail at once.
    Partition {
        /// The nodes cut off.
        nodes: Vec<usize>,
        /// When the cut starts.
        from: Duration,
        /// When it heals.
        until: Duration,
    },
    /// Requests from the listed nodes reach Redis, which runs them, but its replies are lost
    /// from `from` until `until` (turmoil's `partition_oneway` from Redis to the nodes): a
    /// node times out, and falls back, on a decision Redis already counted. A lost message
    /// leaves a gap no later message fills, so the connection is dead until replaced, and a
    /// new one cannot finish its handshake before `until`. Not for a node that also has a
    /// [`Stall`](Fault::Stall) in force: turmoil does not combine the two on one link.
    RepliesLost {
        /// The nodes whose replies are lost.
        nodes: Vec<usize>,
        /// When replies start being lost.
        from: Duration,
        /// When the link heals.
        until: Duration,
    },
    /// Requests from the listed nodes are lost on their way to Redis from `from` until
    /// `until` (turmoil's `partition_oneway` from the nodes to Redis); Redis's replies to
    /// requests already delivered still arrive. Not to overlap a
    /// [`Stall`](Fault::Stall) of the same node, as above.
    RequestsLost {
        /// The nodes whose requests are lost.
        nodes: Vec<usize>,
        /// When requests start being lost.
        from: Duration,
        /// When the link heals.
        until: Duration,
    },
    /// Messages between the listed nodes and Redis are held from `from` and delivered at
    /// `until`: a stall (a Redis busy in a slow command, a paused VM), longer than a
    /// deadline.
    Stall {
        /// The nodes whose links stall.
        nodes: Vec<usize>,
        /// When the stall starts.
        from: Duration,
        /// When held messages are released.
        until: Duration,
    },
    /// The listed nodes' processes are paused from `from` until `until` (`SIGSTOP`, a long
    /// garbage-collection pause, a frozen VM) and then resume where they stopped: their
    /// software does nothing meanwhile. No request is served (those due wait and are
    /// served in order at `until`), no timer of the limiter fires (a leased node's lease
    /// timers stop and start again), and nothing is read or written: their links are held
    /// as for a [`Stall`](Fault::Stall) and delivered at `until`, so a reply that arrives
    /// meanwhile is read at `until`, and what a task of the limiter writes meanwhile leaves
    /// at `until`, as it would after a real pause. Their clocks keep running: at `until`
    /// they read the time the pause took. Messages already in flight at `from` are held
    /// too (a few ms more than a real pause delays them). A pause stops a process: every
    /// node of a listed node's host. Not to overlap a one-way fault of the same node.
    Pause {
        /// The nodes whose processes pause.
        nodes: Vec<usize>,
        /// When the pause starts.
        from: Duration,
        /// When the processes resume.
        until: Duration,
    },
    /// The listed nodes' processes are killed at `at` (`SIGKILL`, a crashed machine) and
    /// never come back: no request due from then on is served, no timer fires, nothing
    /// held is given back (a leased node's blocks and shares stay with the store until
    /// they end), and their links are held for good, so what they had in flight never
    /// arrives. Kills every node of a listed node's host.
    Kill {
        /// The nodes killed.
        nodes: Vec<usize>,
        /// When they die.
        at: Duration,
    },
    /// Redis crashes at `at` and restarts `down` later, with or without its data per the
    /// host's persistence; its script cache is always lost.
    RedisCrash {
        /// When it crashes.
        at: Duration,
        /// How long it stays down.
        down: Duration,
    },
    /// Redis forgets its script cache every `every` from `from` to `until`, keeping data
    /// and connections (a failover to a replica, `SCRIPT FLUSH`).
    ScriptFlush {
        /// The first flush.
        from: Duration,
        /// No flush at or after this.
        until: Duration,
        /// The interval between flushes.
        every: Duration,
    },
    /// Every message's latency is drawn up to `max` from `from` to `until`.
    Latency {
        /// When the slow network starts.
        from: Duration,
        /// When it ends.
        until: Duration,
        /// The largest latency drawn.
        max: Duration,
    },
}

/// One change to the world at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Partition(Vec<usize>),
    Repair(Vec<usize>),
    /// Messages from Redis to the nodes are lost (`true`), or from the nodes to Redis.
    CutOneWay {
        nodes: Vec<usize>,
        replies: bool,
    },
    RepairOneWay {
        nodes: Vec<usize>,
        replies: bool,
    },
    Hold(Vec<usize>),
    Release(Vec<usize>),
    Crash,
    Restart,
    FlushScripts,
    MaxLatency(Duration),
}

impl Fault {
    /// Its actions, at times from the start of the demand.
    pub(crate) fn actions(&self, base_latency: Duration) -> Vec<(Duration, Action)> {
        match self {
            Fault::Partition { nodes, from, until } => vec![
                (*from, Action::Partition(nodes.clone())),
                (*until, Action::Repair(nodes.clone())),
            ],
            Fault::RepliesLost { nodes, from, until }
            | Fault::RequestsLost { nodes, from, until } => {
                let replies = matches!(self, Fault::RepliesLost { .. });
                let nodes = nodes.clone();
                vec![
                    (
                        *from,
                        Action::CutOneWay {
                            nodes: nodes.clone(),
                            replies,
                        },
                    ),
                    (*until, Action::RepairOneWay { nodes, replies }),
                ]
            }
            Fault::Stall { nodes, from, until } | Fault::Pause { nodes, from, until } => vec![
                (*from, Action::Hold(nodes.clone())),
                (*until, Action::Release(nodes.clone())),
            ],
            Fault::Kill { nodes, at } => vec![(*at, Action::Hold(nodes.clone()))],
            Fault::RedisCrash { at, down } => {
                vec![(*at, Action::Crash), (*at + *down, Action::Restart)]
            }
            Fault::ScriptFlush { from, until, every } => {
                let mut at = *from;
                let mut actions = Vec::new();
                while at < *until && !every.is_zero() {
                    actions.push((at, Action::FlushScripts));
                    at += *every;
                }
                actions
            }
            Fault::Latency { from, until, max } => vec![
                (*from, Action::MaxLatency(*max)),
                (*until, Action::MaxLatency(base_latency)),
            ],
        }
    }

    /// The span it is in force, in true time, and a label for the chart.
    pub(crate) fn span(&self, start: Timestamp) -> FaultSpan {
        let at = |d: &Duration| start.saturating_add(rein_core::Micros::from(*d));
        let (from, until, label) = match self {
            Fault::Partition { nodes, from, until } => {
                (from, until, format!("partition: {}", nodes_label(nodes)))
            }
            Fault::Stall { nodes, from, until } => {
                (from, until, format!("stall: {}", nodes_label(nodes)))
            }
            Fault::Pause { nodes, from, until } => {
                (from, until, format!("paused: {}", nodes_label(nodes)))
            }
            Fault::Kill { nodes, at } => {
                return FaultSpan {
                    during: Interval::new(
                        start.saturating_add((*at).into()),
                        start.saturating_add((*at + KILLED_FOR).into()),
                    ),
                    label: format!("killed: {}", nodes_label(nodes)),
                };
            }
            Fault::RepliesLost { nodes, from, until } => {
                (from, until, format!("replies lost: {}", nodes_label(nodes)))
            }
            Fault::RequestsLost { nodes, from, until } => (
                from,
                until,
                format!("requests lost: {}", nodes_label(nodes)),
            ),
            Fault::RedisCrash { at, down } => {
                return FaultSpan {
                    during: Interval::new(
                        start.saturating_add((*at).into()),
                        start.saturating_add((*at + *down).into()),
                    ),
                    label: "redis down".to_owned(),
                };
            }
            Fault::ScriptFlush { from, until, every } => (
                from,
                until,
                format!("script flush every {} ms", every.as_millis()),
            ),
            Fault::Latency { from, until, max } => {
                (from, until, format!("latency ≤ {} ms", max.as_millis()))
            }
        };
        FaultSpan {
            during: Interval::new(at(from), at(until)),
            label,
        }
    }

    /// The fault in words, for the table.
    pub fn describe(&self) -> String {
        let s = |d: &Duration| format!("{:.1} s", d.as_secs_f64());
        let on = |nodes: &[usize], before, after| format!("{before}{}{after}", nodes_label(nodes));
        // What the fault does, then when: `at <from>–<until>`.
        let (what, from, until) = match self {
            Fault::Partition { nodes, from, until } => {
                (on(nodes, "partition ", " from Redis"), from, until)
            }
            Fault::Stall { nodes, from, until } => (on(nodes, "stall ", " ↔ Redis"), from, until),
            Fault::Pause { nodes, from, until } => {
                (on(nodes, "process of ", " paused"), from, until)
            }
            Fault::RepliesLost { nodes, from, until } => {
                (on(nodes, "replies from Redis to ", " lost"), from, until)
            }
            Fault::RequestsLost { nodes, from, until } => {
                (on(nodes, "requests from ", " to Redis lost"), from, until)
            }
            Fault::Kill { nodes, at } => {
                return format!("process of {} killed at {}", nodes_label(nodes), s(at));
            }
            Fault::RedisCrash { at, down } => {
                return format!("Redis crash at {}, down {} ms", s(at), down.as_millis());
            }
            Fault::ScriptFlush { from, until, every } => (
                format!("script cache flushed every {} ms", every.as_millis()),
                from,
                until,
            ),
            Fault::Latency { from, until, max } => {
                (format!("latency up to {} ms", max.as_millis()), from, until)
            }
        };
        format!("{what} at {}–{}", s(from), s(until))
    }
}

impl Fault {
    /// The true instants `[from, until)` during which node `node` (on hosts of `per_host`
    /// nodes) is paused by this fault, if it is.
    pub(crate) fn pause_of(&self, node: usize, per_host: usize) -> Option<(Timestamp, Timestamp)> {
        let (nodes, from, until) = match self {
            Fault::Pause { nodes, from, until } => (nodes, *from, *until),
            Fault::Kill { nodes, at } => (nodes, *at, *at + KILLED_FOR),
            _ => return None,
        };
        let per_host = per_host.max(1);
        let at = |d: &Duration| super::clock::start().saturating_add(rein_core::Micros::from(*d));
        nodes
            .iter()
            .any(|n| n / per_host == node / per_host)
            .then(|| (at(&from), at(&until)))
    }

    /// When node `node` (on hosts of `per_host` nodes) is killed by this fault, if it is:
    /// from the start of the demand.
    pub(crate) fn kill_of(&self, node: usize, per_host: usize) -> Option<Duration> {
        let Fault::Kill { nodes, at } = self else {
            return None;
        };
        let per_host = per_host.max(1);
        nodes
            .iter()
            .any(|n| n / per_host == node / per_host)
            .then_some(*at)
    }
}

impl Action {
    /// Applies the action to the world, between steps, with `per_host` nodes to a turmoil
    /// host: a link is a host's, so an action on one node reaches every node of its host.
    pub(crate) fn apply(&self, sim: &mut turmoil::Sim<'_>, redis: &Shared, per_host: usize) {
        let names = |nodes: &[usize]| {
            // Each host once, in a stable order.
            let hosts: BTreeSet<String> = nodes.iter().map(|&n| host_name(n, per_host)).collect();
            hosts.into_iter().collect::<Vec<_>>()
        };
        // A change to the links between each of `nodes`' hosts and Redis, made from Redis
        // to the host where `from_redis`, else from the host to Redis.
        let (nodes, from_redis, change): (&[usize], bool, LinkChange) = match self {
            Action::Partition(nodes) => (nodes, false, |sim, a, b| sim.partition(a, b)),
            Action::Repair(nodes) => (nodes, false, |sim, a, b| sim.repair(a, b)),
            Action::CutOneWay { nodes, replies } => {
                (nodes, *replies, |sim, a, b| sim.partition_oneway(a, b))
            }
            Action::RepairOneWay { nodes, replies } => {
                (nodes, *replies, |sim, a, b| sim.repair_oneway(a, b))
            }
            Action::Hold(nodes) => (nodes, false, |sim, a, b| sim.hold(a, b)),
            Action::Release(nodes) => (nodes, false, |sim, a, b| sim.release(a, b)),
            Action::Crash => return sim.crash(REDIS_HOST),
            Action::Restart => return sim.bounce(REDIS_HOST),
            Action::FlushScripts => return redis.restart_keeping_data(),
            Action::MaxLatency(max) => return sim.set_max_message_latency(*max),
        };
        for n in names(nodes) {
            if from_redis {
                change(sim, REDIS_HOST, n.as_str());
            } else {
                change(sim, n.as_str(), REDIS_HOST);
            }
        }
    }
}

/// A change to the link between two hosts, made from the first to the second.
type LinkChange = fn(&mut turmoil::Sim<'_>, &str, &str);

/// `node 2`, `nodes 0, 2` or `nodes 0–127, 130`: runs of three or more as ranges, so a
/// fault on half of 256 nodes stays one short label.
fn nodes_label(nodes: &[usize]) -> String {
    if let [one] = nodes {
        return format!("node {one}");
    }
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let mut j = i;
        while j + 1 < nodes.len() && nodes[j + 1] == nodes[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}–{}", nodes[i], nodes[j]));
        } else {
            parts.extend(nodes[i..=j].iter().map(usize::to_string));
        }
        i = j + 1;
    }
    format!("nodes {}", parts.join(", "))
}

/// A killed process is paused for this long: longer than any simulation runs
/// (`Scenario::run` bounds a world at its span plus 60 s).
const KILLED_FOR: Duration = Duration::from_secs(3_600);

#[cfg(test)]
mod tests {
    use super::nodes_label;

    #[test]
    fn node_labels_shorten_runs_to_ranges() {
        assert_eq!(nodes_label(&[2]), "node 2");
        assert_eq!(nodes_label(&[0, 1]), "nodes 0, 1");
        assert_eq!(nodes_label(&[0, 1, 3]), "nodes 0, 1, 3");
        assert_eq!(
            nodes_label(&(0..128).chain([130, 131, 132]).collect::<Vec<_>>()),
            "nodes 0–127, 130–132"
        );
    }
}
