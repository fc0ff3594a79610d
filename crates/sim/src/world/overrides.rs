//! Per-key overrides changed while a scenario runs (issue 25), and the bound they are held
//! to.
//!
//! With [`Scenario::overrides`](super::Scenario::overrides) set, every node's store applies
//! the overrides kept in Redis (`RedisStoreBuilder::overrides(staleness)`), and an
//! **operator**, a host of its own that no fault reaches, writes key 0's override at the
//! scheduled instants with `RedisStore::set_override` and `remove_override`: the shipped
//! `admin.lua` (`ovset`), run by the simulated Redis, which the nodes' stores re-read with
//! `ovread`. A node's store is built with `connect_with` over turmoil streams, which does
//! not subscribe to the overrides' channel (only `connect` and `connect_cluster` do, and
//! the simulated Redis has no `SUBSCRIBE`): a simulated node sees a change by its staleness
//! re-read alone, the bound a store promises whatever happens to its subscription.
//!
//! # The bound
//!
//! Stated for a policy of one fixed window of `L` per `W`, overrides of one fixed window of
//! the same `W` (or removed), partitions as the only faults, and a guard that falls back
//! locally or fails closed (or no guard); [`OverrideBound::new`] is `None` otherwise. Each
//! aligned window is held to
//!
//! `max { limits a Redis admission in it may have been decided by } + Σ fallback shares`.
//!
//! - **Redis.** Every node's decisions count in one key (an override is decided under the
//!   policy's name), so in a window Redis admits at most the highest limit any of its
//!   admissions was decided by: the last admission of the window found the count under
//!   its own limit. A value is decided by from the operator's call that wrote it until
//!   `lag = staleness + 2 × deadline` after the call that replaced it was answered: a store
//!   re-reads at its first decision `staleness` after its last read, which began before the
//!   write ran, and the decision that began just before that runs its script within its
//!   two calls' deadlines (the re-read's and its own).
//! - **A partitioned node keeps the copy it cached**, and decides nothing in Redis while
//!   cut off. Once the partition heals it is back on Redis within `recovery` (the breaker's
//!   longest backoff, two deadlines for the probe that failed and the one that succeeds,
//!   1.5 mean gaps of demand for a request to come, two ticks) and may decide by its old
//!   copy until its next re-read, at most `staleness` after its last read that failed,
//!   which came before it was back: any value in force before the heal is counted from the
//!   heal to `recovery + lag` after it.
//! - **Fallback.** A partitioned node on its local fallback decides by its share of the
//!   **policy's own** limit (`rein::ResilientLimiter` knows the policy table, not the store's
//!   overrides): [`fallback_limit`](super::fallback_limit)'s shares, in every window that
//!   meets the partition or the `recovery` after it.

use std::cell::RefCell;
use std::num::NonZeroU32;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rein::FailurePolicy;
use rein_core::overrides::{KeyMatch, Override};
use rein_core::{Limit, Micros, Timestamp};

use super::bound::fallback_limit;
use super::clock::{self, true_now};
use super::node::{build_store_on, user_key};
use super::{Fault, Guard, REDIS_HOST, Scenario};
use crate::oracle::{AdmissionLog, Window};
use crate::report::{describe_limit, format_duration};

/// One write of key 0's override by the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideChange {
    /// When the operator writes it, from the start of demand.
    pub at: Duration,
    /// What key 0 gets from then on: other limits or none (`Override::Unlimited`); `None`
    /// removes the override, and the key gets its policy's own limits again.
    pub value: Option<Override>,
}

/// The overrides of a scenario: how stale each node's copy may be, and the operator's
/// writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideSchedule {
    /// Each node's store re-reads the overrides at most this often
    /// (`RedisStoreBuilder::overrides`).
    pub staleness: Duration,
    /// The operator's writes, in the order they are made.
    pub changes: Vec<OverrideChange>,
}

impl OverrideSchedule {
    /// The writes in words, for the table: `key 0 overridden: 160 per 1 s at 0.0 s, 30 per
    /// 1 s at 1.4 s (200 ms stale at most)`.
    pub fn describe(&self) -> String {
        let changes: Vec<String> = self
            .changes
            .iter()
            .map(|c| {
                let what = match &c.value {
                    None => "removed".to_owned(),
                    Some(Override::Unlimited) => "unlimited".to_owned(),
                    Some(Override::Limits(policy)) => {
                        let limits: Vec<String> = policy
                            .limits()
                            .iter()
                            .map(|l| match l {
                                Limit::FixedWindow(w) => {
                                    format!("{} per {}", w.limit(), format_duration(w.window()))
                                }
                                other => describe_limit(other),
                            })
                            .collect();
                        limits.join(" + ")
                    }
                };
                format!("{what} at {:.1} s", c.at.as_secs_f64())
            })
            .collect();
        format!(
            "key 0 overridden: {} ({} ms stale at most)",
            changes.join(", "),
            self.staleness.as_millis()
        )
    }
}

/// When one of the operator's writes was made: its call and the answer, true instants. The
/// write took effect in Redis in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// When the operator called the store.
    pub issued: Timestamp,
    /// When the store answered that it was written.
    pub answered: Timestamp,
}

/// The operator's host name.
pub(crate) const OPERATOR_HOST: &str = "operator";

/// The operator's software: one store (applying no overrides itself), and each write at its
/// instant, noted in `written`. A write that fails fails the world: the operator is never
/// cut off.
pub(crate) async fn run_operator(
    schedule: OverrideSchedule,
    policy: String,
    deadline: Duration,
    connect_timeout: Duration,
    written: Rc<RefCell<Vec<Written>>>,
) -> turmoil::Result {
    let store = build_store_on(REDIS_HOST, deadline, connect_timeout, None, Arc::default()).await?;
    let keys = KeyMatch::Key(user_key(0).into_bytes().into_boxed_slice());
    for change in &schedule.changes {
        let due = clock::start().saturating_add(change.at.into());
        let wait = due.saturating_since(true_now());
        if wait > Micros::ZERO {
            tokio::time::sleep(Duration::from(wait)).await;
        }
        let issued = true_now();
        match &change.value {
            Some(value) => store.set_override(&policy, &keys, value).await?,
            None => store.remove_override(&policy, &keys).await?,
        };
        written.borrow_mut().push(Written {
            issued,
            answered: true_now(),
        });
    }
    Ok(())
}

/// What each aligned window of a run with overrides may admit for key 0 (the module docs
/// derive it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideBound {
    /// The fixed window's length.
    window: Micros,
    /// Each limit Redis may decide by, with the true span `[from, until)` its admissions
    /// may fall in.
    limits: Vec<(u64, Timestamp, Timestamp)>,
    /// Each span `[from, until)` partitioned nodes may be on their local fallback, with
    /// what they admit per window on it.
    fallback: Vec<(Timestamp, Timestamp, u64)>,
}

impl OverrideBound {
    /// The bound of `scenario` whose operator's writes were made at `written`; `None` for a
    /// scenario outside the shapes the module docs state it for.
    pub fn new(scenario: &Scenario, written: &[Written]) -> Option<Self> {
        let schedule = scenario.overrides.as_ref()?;
        let [Limit::FixedWindow(own)] = scenario.policy.limits() else {
            return None;
        };
        let window = own.window();
        if written.len() != schedule.changes.len() {
            return None;
        }
        let expected_nodes: Option<NonZeroU32> = match &scenario.guard {
            None
            | Some(Guard {
                on_failure: FailurePolicy::FailClosed,
                ..
            }) => None,
            Some(Guard {
                on_failure: FailurePolicy::LocalFallback { expected_nodes },
                ..
            }) => Some(*expected_nodes),
            Some(_) => return None,
        };
        // The limits in force, in order: the policy's own until the first write.
        let mut values = vec![(own.limit(), Timestamp::from_micros(0))];
        for (change, at) in schedule.changes.iter().zip(written) {
            let limit = match &change.value {
                None => own.limit(),
                Some(Override::Limits(policy)) => match policy.limits() {
                    [Limit::FixedWindow(w)] if w.window() == window => w.limit(),
                    _ => return None,
                },
                Some(Override::Unlimited) => return None,
            };
            values.push((limit, at.issued));
        }
        let micros = |d: Duration| Micros::from_micros(u64::try_from(d.as_micros()).unwrap_or(0));
        let lag = micros(schedule.staleness + 2 * scenario.deadline);
        let end = Timestamp::from_micros(u64::MAX);
        let mut limits: Vec<(u64, Timestamp, Timestamp)> = values
            .iter()
            .enumerate()
            .map(|(i, &(limit, from))| {
                let until = written
                    .get(i)
                    .map_or(end, |next| next.answered.saturating_add(lag));
                (limit, from, until)
            })
            .collect();
        let recovery = match &scenario.guard {
            Some(guard) => {
                let gap = Duration::from_micros(1_500_000 / scenario.per_node_rate.max(1));
                micros(
                    guard.breaker.max_backoff() + 2 * scenario.deadline + gap + 2 * scenario.tick,
                )
            }
            None => Micros::ZERO,
        };
        let per_host = scenario.nodes_per_host.max(1);
        let skews = scenario.skews();
        let mut fallback = Vec::new();
        for fault in &scenario.faults {
            let Fault::Partition { nodes, from, until } = fault else {
                return None;
            };
            let at = |d: &Duration| clock::start().saturating_add((*d).into());
            let (from, until) = (at(from), at(until));
            // Back on Redis with the copy it cached: any value in force before the heal.
            let stale_until = until.saturating_add(recovery).saturating_add(lag);
            for &(limit, since) in &values {
                if since < until {
                    limits.push((limit, until, stale_until));
                }
            }
            if let Some(expected_nodes) = expected_nodes {
                let offsets: Vec<i64> = (0..scenario.nodes)
                    .filter(|n| nodes.iter().any(|c| c / per_host == n / per_host))
                    .filter_map(|n| skews.get(n).map(|s| s.offset_us))
                    .collect();
                let widened = fallback_limit(&Limit::FixedWindow(*own), expected_nodes, &offsets)
                    .ok()?
                    .capacity();
                fallback.push((from, until.saturating_add(recovery), widened - own.limit()));
            }
        }
        Some(Self {
            window,
            limits,
            fallback,
        })
    }

    /// The fixed window's length: the windows [`at`](Self::at) bounds are aligned to it.
    pub fn window(&self) -> Micros {
        self.window
    }

    /// What the aligned window starting at `start` may admit, in cost units.
    pub fn at(&self, start: Timestamp) -> u64 {
        let end = start.saturating_add(self.window);
        let meets = |from: Timestamp, until: Timestamp| from < end && until > start;
        let redis = self
            .limits
            .iter()
            .filter(|&&(_, from, until)| meets(from, until))
            .map(|&(limit, _, _)| limit)
            .max()
            .unwrap_or(0);
        let fallback: u64 = self
            .fallback
            .iter()
            .filter(|&&(from, until, _)| meets(from, until))
            .map(|&(_, _, shares)| shares)
            .sum();
        redis + fallback
    }

    /// Every aligned window of key 0 that admitted anything, against its bound.
    pub fn check(&self, log: &AdmissionLog) -> Vec<Window> {
        log.aligned_windows(0, self.window, |start| self.at(start))
    }
}
