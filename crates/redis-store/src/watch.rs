//! Live counts for `rein watch`: how many decisions each policy admitted and denied, per
//! second, summed over every process of a deployment that reports them.
//!
//! A store built with [`RedisStoreBuilder::report_counts`](crate::RedisStoreBuilder::report_counts)
//! adds one to its policy's counter at each `acquire` (a relaxed atomic addition, no call),
//! and once a second adds what it counted to `<prefix>:watch:{<policy>}:<Unix second>`, a
//! hash with the fields `a` (admitted) and `d` (denied) kept for two minutes: one pipelined
//! call per policy that decided anything, none for one that did not. So a decision costs
//! Redis nothing more, and a process at most one small write per active policy a second.
//!
//! What the counts are: the store's decisions, at the second the process reported them (at
//! most [`REPORT_EVERY`] after they were made). A second is complete once every process has
//! reported it, [`COMPLETE_AFTER`] after it began by the reporters' clocks. Not in them: a
//! failure policy's local answers while Redis is away, and a report that fails or misses
//! its deadline (dropped, never replayed: a replay could count twice), so a second may read
//! low while Redis is slow; it never reads high.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How often a process reports what it counted.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// How long after a second begins its counts are complete: every process has reported it
/// by then, if its clock is within a second of the reader's.
pub const COMPLETE_AFTER: Duration = Duration::from_secs(2);

/// How long a second's counts are kept.
pub(crate) const KEEP: Duration = Duration::from_secs(120);

/// The most seconds one read returns: as many as are still kept once complete, for
/// reporters whose clocks are within a second of Redis's (two minutes less
/// [`COMPLETE_AFTER`] less that second: 117 s). A longer read would count seconds whose
/// counts have expired as zero and report less than the deployment decided.
pub const MAX_SECONDS_READ: u64 = KEEP.as_secs() - COMPLETE_AFTER.as_secs() - CLOCK_SPREAD;

/// How far a reporter's clock may be from Redis's, in seconds, for the counts it reports
/// to be read complete and kept ([`COMPLETE_AFTER`] waits this long for them too).
const CLOCK_SPREAD: u64 = 1;

/// What a deployment's processes counted for one policy in one second
/// ([`RedisStore::counts`](crate::RedisStore::counts)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// The Unix second.
    pub second: u64,
    /// Decisions that admitted.
    pub admitted: u64,
    /// Decisions that denied.
    pub denied: u64,
}

/// The hash of `policy`'s counts for `second`: the policy's name is the Cluster hash tag,
/// so one policy's seconds share a slot and one read is one call.
pub(crate) fn key(prefix: &str, policy: &str, second: u64) -> String {
    format!("{prefix}:watch:{{{policy}}}:{second}")
}

#[derive(Debug, Default)]
struct Counts {
    admitted: AtomicU64,
    denied: AtomicU64,
    /// Known to a reporter: the decision path registers a policy only once.
    registered: AtomicBool,
}

/// A policy's counters, shared by its clones. Not part of what the policy is: two equal
/// policies compare equal whatever they counted.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally(Arc<Counts>);

impl PartialEq for Tally {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Tally {}

/// The policies one store reports, and whether its reporting task runs.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    /// Held strongly, so that what a policy counted just before it was dropped is still
    /// reported; forgotten at the report after that.
    policies: Mutex<Vec<(String, Arc<Counts>)>>,
    started: AtomicBool,
}

impl Reporter {
    /// Counts one decision of `policy`. `true` the first time anything is counted, when the
    /// caller starts the reporting task. A policy decided through two reporting stores
    /// is reported by the first.
    #[inline]
    pub(crate) fn record(&self, policy: &str, tally: &Tally, allowed: bool) -> bool {
        let counter = if allowed {
            &tally.0.admitted
        } else {
            &tally.0.denied
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if tally.0.registered.load(Ordering::Relaxed)
            || tally.0.registered.swap(true, Ordering::AcqRel)
        {
            return false;
        }
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        policies.push((policy.to_owned(), Arc::clone(&tally.0)));
        !self.started.swap(true, Ordering::AcqRel)
    }

    /// What each policy counted since the last call, taken (policies with nothing counted
    /// are left out; policies dropped are forgotten once their counts are taken).
    pub(crate) fn take(&self) -> Vec<(String, u64, u64)> {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        let mut taken: Vec<(String, u64, u64)> = Vec::new();
        for (name, counts) in policies.iter() {
            let admitted = counts.admitted.swap(0, Ordering::Relaxed);
            let denied = counts.denied.swap(0, Ordering::Relaxed);
            if admitted + denied == 0 {
                continue;
            }
            match taken.iter_mut().find(|(n, _, _)| n == name) {
                Some(same) => {
                    same.1 += admitted;
                    same.2 += denied;
                }
                None => taken.push((name.clone(), admitted, denied)),
            }
        }
        // Only the reporter holds it: the policy is gone, and what it counted was taken.
        policies.retain(|(_, counts)| Arc::strong_count(counts) > 1);
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_summed_by_name_and_forgotten_with_their_policy() {
        let reporter = Reporter::default();
        let (a, b, c) = (Tally::default(), Tally::default(), Tally::default());
        assert!(
            reporter.record("api", &a, true),
            "the first starts the task"
        );
        assert!(!reporter.record("api", &a, false));
        assert!(
            !reporter.record("api", &b, true),
            "another clone-less policy of one name"
        );
        assert!(!reporter.record("web", &c, false));
        let mut taken = reporter.take();
        taken.sort();
        assert_eq!(
            taken,
            vec![("api".to_owned(), 2, 1), ("web".to_owned(), 0, 1)]
        );
        assert!(reporter.take().is_empty(), "taken once");
        // What a policy counted before it was dropped is taken, then it is forgotten.
        reporter.record("web", &c, true);
        drop(c);
        reporter.record("api", &a, true);
        let mut taken = reporter.take();
        taken.sort();
        assert_eq!(
            taken,
            vec![("api".to_owned(), 1, 0), ("web".to_owned(), 1, 0)]
        );
        assert_eq!(reporter.policies.lock().map(|p| p.len()).unwrap_or(0), 2);
    }
}
