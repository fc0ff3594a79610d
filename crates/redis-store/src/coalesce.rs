//! Coalescing: concurrent decisions of one policy sent to Redis as one script call.
//!
//! Every script call costs the server a fixed amount before the script decides anything
//! (parsing the request, `TIME`, the parameters, the reply), and costs the client a
//! redis-rs round of encoding and decoding. Under load many decisions of one policy are
//! waiting at once; the lean scripts decide any number of them in one call, each atomic
//! and in order, at one server `now` (see `lua/single_token_bucket.lua`). This module
//! decides *when* a decision goes alone and which waiting decisions share a call. It is
//! sans-IO: [`Lane`] is the whole rule, `RedisStore` (store.rs) is the thin driver that
//! sends calls and wakes waiters.
//!
//! The rule, per policy (a "lane"):
//! - a decision that finds fewer than [`Coalesce::in_flight`] calls of its lane in flight
//!   is sent at once, alone: an idle store adds no wait and no batching to any decision;
//! - otherwise it waits in the lane, in arrival order;
//! - when a call of the lane ends, the decisions waiting (up to [`Coalesce::batch`], oldest
//!   first, skipping those whose caller gave up) go out as the next call, by whoever ended
//!   the call; if none wait, the lane has one call fewer in flight.
//!
//! So at most `in_flight` calls per lane are on the wire; a decision waits for one call of
//! its lane to end when fewer than `batch` decisions wait ahead of it, and for one more call
//! per `batch` waiting ahead (each call carries the `batch` oldest:
//! `a_call_carries_at_most_batch_decisions_oldest_first`); and nothing is ever sent twice: a decision
//! leaves the lane once, in one call, and a call that fails or times out is never replayed
//! (its decisions answer with its error, as a call of one would).

use std::collections::VecDeque;
use std::num::NonZeroUsize;

/// How a store coalesces concurrent decisions ([`RedisStoreBuilder::coalesce`]).
///
/// [`RedisStoreBuilder::coalesce`]: crate::RedisStoreBuilder::coalesce
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalesce {
    /// Calls of one policy in flight before decisions wait to share the next one.
    pub in_flight: NonZeroUsize,
    /// The most decisions one call carries.
    pub batch: NonZeroUsize,
}

impl Coalesce {
    /// The default: 2 calls of a policy in flight, up to 64 decisions per call. Measured in
    /// docs/performance.md ("Redis with coalescing").
    pub const DEFAULT: Self = Self {
        in_flight: NonZeroUsize::new(2).expect("2 is not zero"),
        batch: NonZeroUsize::new(64).expect("64 is not zero"),
    };

    /// No coalescing: every decision is its own call, whatever the load.
    pub const OFF: Self = Self {
        in_flight: NonZeroUsize::MAX,
        batch: NonZeroUsize::MIN,
    };
}

impl Default for Coalesce {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One policy's decisions: how many calls are in flight, and who waits.
///
/// Invariant: decisions wait only while `in_flight` calls are in flight, so a decision
/// that arrives when fewer are never finds anyone ahead of it.
#[derive(Debug)]
pub(crate) struct Lane<T> {
    waiting: VecDeque<T>,
    in_flight: usize,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            in_flight: 0,
        }
    }
}

impl<T> Lane<T> {
    /// A decision arrives: `true` if it may be sent now, alone (the lane counts the call in
    /// flight); `false` if it must [`wait`](Self::wait) for a call that
    /// [`next_call`](Self::next_call) returns.
    pub(crate) fn try_send(&mut self, limits: Coalesce) -> bool {
        if self.in_flight < limits.in_flight.get() {
            debug_assert!(self.waiting.is_empty());
            self.in_flight += 1;
            true
        } else {
            false
        }
    }

    /// A decision [`try_send`](Self::try_send) refused waits, in arrival order.
    pub(crate) fn wait(&mut self, item: T) {
        self.waiting.push_back(item);
    }

    /// A call of the lane ended (replied, failed, timed out or was dropped). Returns the
    /// next call to send in its place, oldest waiting first, without those `gone` says
    /// their caller abandoned (dropped here: never sent); `None` if nobody waits, and the
    /// lane then has one call fewer in flight.
    pub(crate) fn next_call(
        &mut self,
        limits: Coalesce,
        mut gone: impl FnMut(&T) -> bool,
    ) -> Option<Vec<T>> {
        debug_assert!(self.in_flight > 0);
        let mut call = Vec::new();
        while call.len() < limits.batch.get() {
            match self.waiting.pop_front() {
                Some(item) if gone(&item) => {}
                Some(item) => call.push(item),
                None => break,
            }
        }
        if call.is_empty() {
            self.in_flight = self.in_flight.saturating_sub(1);
            None
        } else {
            Some(call)
        }
    }

    /// Whether the lane holds nothing: no call in flight, nobody waiting. An idle lane can
    /// be forgotten.
    pub(crate) fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.waiting.is_empty()
    }

    /// Calls in flight.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(in_flight: usize, batch: usize) -> Coalesce {
        Coalesce {
            in_flight: NonZeroUsize::new(in_flight).unwrap(),
            batch: NonZeroUsize::new(batch).unwrap(),
        }
    }

    /// One event on a lane, and what must follow.
    enum Step {
        /// Decision `n` arrives: sent alone (`true`) or waits.
        Arrive(u32, bool),
        /// A call ends; the next call carries these decisions (empty: none).
        End(&'static [u32]),
        /// Decision `n`'s caller gives up while it waits.
        GiveUp(u32),
    }
    use Step::{Arrive, End, GiveUp};

    /// Runs `steps` on a fresh lane; checks every outcome and the calls in flight after.
    fn run(limits: Coalesce, steps: &[(Step, usize)]) {
        let mut lane = Lane::default();
        let mut abandoned = Vec::new();
        for (i, (step, in_flight)) in steps.iter().enumerate() {
            match step {
                Arrive(n, alone) => {
                    let sent = lane.try_send(limits);
                    if !sent {
                        lane.wait(*n);
                    }
                    assert_eq!(sent, *alone, "step {i}")
                }
                End(expected) => {
                    let call = lane.next_call(limits, |n| abandoned.contains(n));
                    assert_eq!(call.as_deref().unwrap_or(&[]), *expected, "step {i}");
                }
                GiveUp(n) => abandoned.push(*n),
            }
            assert_eq!(lane.in_flight(), *in_flight, "in flight after step {i}");
        }
    }

    #[test]
    fn an_idle_lane_sends_each_decision_at_once_and_alone() {
        // The uncontended path: never a wait, never a batch.
        run(
            limits(2, 8),
            &[
                (Arrive(1, true), 1),
                (End(&[]), 0),
                (Arrive(2, true), 1),
                (Arrive(3, true), 2),
                (End(&[]), 1),
                (End(&[]), 0),
            ],
        );
    }

    #[test]
    fn decisions_wait_only_when_the_lane_is_full_then_share_the_next_call() {
        run(
            limits(1, 8),
            &[
                (Arrive(1, true), 1),
                (Arrive(2, false), 1),
                (Arrive(3, false), 1),
                (Arrive(4, false), 1),
                // The call of 1 ends: 2, 3 and 4 go out together, in arrival order.
                (End(&[2, 3, 4]), 1),
                (Arrive(5, false), 1),
                (End(&[5]), 1),
                (End(&[]), 0),
                (Arrive(6, true), 1),
            ],
        );
    }

    #[test]
    fn a_call_carries_at_most_batch_decisions_oldest_first() {
        run(
            limits(1, 2),
            &[
                (Arrive(1, true), 1),
                (Arrive(2, false), 1),
                (Arrive(3, false), 1),
                (Arrive(4, false), 1),
                (End(&[2, 3]), 1),
                (End(&[4]), 1),
                (End(&[]), 0),
            ],
        );
    }

    #[test]
    fn an_abandoned_decision_is_never_sent() {
        // Its caller's deadline passed while it waited: dropped, not sent late.
        run(
            limits(1, 8),
            &[
                (Arrive(1, true), 1),
                (Arrive(2, false), 1),
                (Arrive(3, false), 1),
                (GiveUp(2), 1),
                (End(&[3]), 1),
                (Arrive(4, false), 1),
                (GiveUp(4), 1),
                // Only an abandoned one waits: no call, one fewer in flight.
                (End(&[]), 0),
            ],
        );
    }

    #[test]
    fn off_sends_everything_alone() {
        let mut lane = Lane::default();
        for _ in 0..1000 {
            assert!(lane.try_send(Coalesce::OFF));
        }
        assert!(lane.next_call(Coalesce::OFF, |_: &u32| false).is_none());
        assert_eq!(lane.in_flight(), 999);
    }
}
