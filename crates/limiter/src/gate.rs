//! [`Gate`]: where the resilient limiter decides what to do with a request, as a pure
//! state machine.
//!
//! Every input is explicit: the instant (`now`, read by the driver from its clock), the
//! request, and how the store's call ended. The gate holds the deny and allow caches, the
//! circuit breaker, the local fallback limiters and the counters, and answers one of two
//! things for a request: an answer right now ([`Step::Answer`]: a cached denial, a reuse,
//! or the failure policy while the breaker is open), or "call the store" ([`Step::Call`],
//! with the breaker's ticket). When that call ends, [`Gate::finish`] turns its outcome into
//! the answer (feeding the caches and the breaker on the way). The driver
//! ([`ResilientLimiter`](crate::ResilientLimiter)) only reads the clock, awaits the store
//! under a deadline and moves data between the two: the decisions are all here, and the
//! tests below walk them on a number line with no runtime.
//!
//! # Call order
//! 1. `begin(now, ..)`; on [`Step::Call`], send the call. A call that no failure policy
//!    answers (a rate share's take or return) asks `open_call(now)` instead, and is not
//!    sent without a ticket.
//! 2. Exactly one of `finish(sent_at, now, ticket, .., reply)` (for such a call,
//!    `close_call`), `refused(now, ticket)` or `abandon(now, ticket)` per ticket, when the
//!    call ends, is refused by the store before any I/O, or is dropped.
//!
//! `now` need not be monotonic (the breaker and the caches take the latest instant they
//! have seen). No error is sticky.

use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rein_core::{Decision, Micros, Outcome, Timestamp};
use rein_memory::MemoryLimiter;

use crate::allow_cache::{AllowCache, AllowCacheConfig};
use crate::bounded::CacheKey;
use crate::breaker::{Breaker, BreakerConfig, BreakerEvent, BreakerState, Ticket};
use crate::decided::{Decided, Source, Unavailable};
use crate::deny_cache::DenyCache;
use crate::fallback::FailurePolicy;
use crate::stats::{Stats, StatsSnapshot};

/// What to do with a request, from [`Gate::begin`].
#[derive(Debug)]
pub(crate) enum Step {
    /// Answer this; the store is not called.
    Answer(Decided),
    /// Call the store, then report with this ticket.
    Call(Ticket),
}

/// How a call to the store ended, as the gate needs to know it.
#[derive(Debug)]
pub(crate) enum Reply {
    /// The store decided.
    Decided(Decision),
    /// The store gave no decision, for this reason.
    Failed(Unavailable),
}

/// The request path's decisions: caches, breaker, failure policy, counters.
pub(crate) struct Gate<K> {
    name: String,
    on_failure: FailurePolicy,
    /// One per policy of the table, in its order, at this node's share; empty unless the
    /// failure policy is [`FailurePolicy::LocalFallback`].
    fallback: Vec<MemoryLimiter<Vec<u8>, K>>,
    /// The latest instant a fallback decision was made at. Fallback decisions run one at a
    /// time under this lock, each at the later of its own `now` and this, so the local
    /// limiters see time move forward only: concurrent requests read the clock before any
    /// lock, in no particular order, and a decision at an instant before the key's last one
    /// reports a reset longer than the limit can take (an HTTP `t` above `w`).
    fallback_clock: Mutex<Timestamp>,
    /// A std mutex: every use is a few comparisons with no await, and the breaker must see
    /// one order of outcomes.
    breaker: Mutex<Breaker>,
    deny_cache: Option<DenyCache>,
    allow_cache: Option<AllowCache>,
    stats: Stats,
}

/// A request as the gate sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    /// The policy's index in the table.
    pub slot: u32,
    /// The policy's capacity (its smallest limit's).
    pub capacity: u64,
    pub key: &'a [u8],
    pub cost: u64,
    /// What it asks of the store.
    pub ask: Ask,
}

impl<'a> Request<'a> {
    /// What the caches keep its answers under.
    fn cache_key(&self) -> CacheKey<'a> {
        CacheKey {
            policy: self.slot,
            key: self.key,
        }
    }
}

/// What a request asks of the store. `pub` in a private module: the sealed
/// [`Mode`](crate::lease::Mode) takes it, and nothing outside the crate can name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// To take `cost`: a decision, answered from the caches when they can.
    Acquire,
    /// Whether `cost` would be admitted, taking nothing: no cache answers or learns from
    /// it, and the local fallback is peeked, not charged.
    Peek,
    /// A lease's reservation of a block: a call on the leases' behalf, not a request's
    /// decision, so not counted among decisions (the requests the block admits are, as
    /// [`Source::Lease`]). Only the store grants a block: the deny cache's exact denial
    /// answers it, the allow cache does not (a reuse is no grant the store counted), and
    /// the failure policy's answer (the local fallback peeked, not charged) only says why
    /// the store gave none, which the resilient limiter returns as an error.
    Reserve,
}

impl<K> Gate<K> {
    pub(crate) fn new(
        name: String,
        on_failure: FailurePolicy,
        fallback: Vec<MemoryLimiter<Vec<u8>, K>>,
        breaker: BreakerConfig,
        deny_cache: Option<NonZeroUsize>,
        allow_cache: Option<AllowCacheConfig>,
        deadline: Duration,
    ) -> Self {
        Self {
            stats: Stats::new(&name),
            name,
            on_failure,
            fallback,
            fallback_clock: Mutex::new(Timestamp::EPOCH),
            breaker: Mutex::new(Breaker::new(breaker)),
            deny_cache: deny_cache.map(|max| DenyCache::new(max, Micros::from(deadline))),
            allow_cache: allow_cache.map(AllowCache::new),
        }
    }

    /// The first step of a valid request at `now`: answer from a cache, refuse to call a
    /// store the breaker keeps away from, or call it.
    pub(crate) fn begin(&self, now: Timestamp, request: Request<'_>) -> Step {
        let Request { cost, ask, .. } = request;
        // A peek, or a zero cost, is a question about the state, which only the store can
        // answer: a cached denial or reuse says what an acquire would get, not what is left.
        if cost > 0
            && ask != Ask::Peek
            && let Some((decision, source)) = self.cached(now, request.cache_key(), cost, ask)
        {
            return Step::Answer(self.count(request, Decided { decision, source }));
        }
        match self.open_call(now) {
            Some(ticket) => Step::Call(ticket),
            None => {
                let decided = self.degrade(Unavailable::BreakerOpen, request, now);
                Step::Answer(self.count(request, decided))
            }
        }
    }

    /// The breaker's ticket for a store call at `now`, or `None` while it keeps the store
    /// away: a request's (from [`begin`](Self::begin)), or a call that no failure policy
    /// answers and no cache knows (a rate share's take, renewal or return), which fails
    /// instead.
    pub(crate) fn open_call(&self, now: Timestamp) -> Option<Ticket> {
        let ticket = self.with_breaker(|b| b.poll_admit(now));
        match ticket {
            Some(_) => self.stats.store_call(),
            None => self.stats.breaker_rejection(),
        }
        ticket
    }

    /// The call of `ticket`, sent at `sent_at`, ended at `now`: answered (`Ok`), or not
    /// (`why`), which the breaker counts toward opening if the store failed
    /// ([`Unavailable::store_failed`]).
    pub(crate) fn close_call(
        &self,
        sent_at: Timestamp,
        now: Timestamp,
        ticket: Ticket,
        answer: Result<(), Unavailable>,
    ) {
        self.stats.store_latency(now.saturating_since(sent_at));
        if let Err(why) = answer {
            self.stats.store_error(why);
        }
        match answer {
            Err(why) if why.store_failed() => {
                self.with_breaker(|b| b.handle_failure(now, ticket));
            }
            _ => self.with_breaker(|b| b.handle_success(now, ticket)),
        }
    }

    /// The answer to a request whose call, sent at `sent_at`, ended at `now` with `reply`.
    pub(crate) fn finish(
        &self,
        sent_at: Timestamp,
        now: Timestamp,
        ticket: Ticket,
        request: Request<'_>,
        reply: Reply,
    ) -> Decided {
        let why = match reply {
            Reply::Decided(decision) => {
                self.close_call(sent_at, now, ticket, Ok(()));
                // A peek took nothing: an allowed peek is no reuse to hand out, and a denied
                // one is already what the next acquire will ask the store about.
                if request.cost > 0 && request.ask != Ask::Peek {
                    self.remember(sent_at, now, request, &decision);
                }
                return self.count(
                    request,
                    Decided {
                        decision,
                        source: Source::Store,
                    },
                );
            }
            Reply::Failed(why) => why,
        };
        self.close_call(sent_at, now, ticket, Err(why));
        let decided = self.degrade(why, request, now);
        self.count(request, decided)
    }

    /// The store refused the request before calling anything (it can never be admitted):
    /// no call was made, which tells the breaker nothing; the caller returns an `Err`.
    pub(crate) fn refused(&self, now: Timestamp, ticket: Ticket) {
        self.with_breaker(|b| b.handle_abandoned(now, ticket));
        self.stats.invalid_request();
    }

    /// The call of `ticket` was dropped before it ended (its caller went away).
    pub(crate) fn abandon(&self, now: Timestamp, ticket: Ticket) {
        self.with_breaker(|b| b.handle_abandoned(now, ticket));
    }

    /// Forgets cached answers for `key` under policy `slot`: its capacity came back (a
    /// denial still in flight is not cached either).
    pub(crate) fn forget(&self, now: Timestamp, slot: u32, key: &[u8]) {
        let at = CacheKey { policy: slot, key };
        if let Some(cache) = &self.deny_cache {
            cache.given_back(now, at);
        }
        if let Some(cache) = &self.allow_cache {
            cache.block(now, at);
        }
    }

    /// Counts a request refused before the gate (an `Err` to the caller).
    pub(crate) fn invalid_request(&self) {
        self.stats.invalid_request();
    }

    pub(crate) fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub(crate) fn breaker_state(&self) -> BreakerState {
        self.lock_breaker().state()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn on_failure(&self) -> FailurePolicy {
        self.on_failure
    }

    /// A cache's answer to an acquire: the deny cache's repeated denial, else the allow
    /// cache's reuse (not for a reservation), else none.
    fn cached(
        &self,
        now: Timestamp,
        at: CacheKey<'_>,
        cost: u64,
        ask: Ask,
    ) -> Option<(Decision, Source)> {
        let denied = self.deny_cache.as_ref();
        if let Some(decision) = denied.and_then(|c| c.check(now, at, cost)) {
            return Some((decision, Source::DenyCache));
        }
        if ask == Ask::Reserve {
            return None;
        }
        let decision = self.allow_cache.as_ref()?.check(now, at, cost)?;
        Some((decision, Source::AllowCache))
    }

    /// Counts a request's answer among the decisions (a reservation's is not one).
    fn count(&self, request: Request<'_>, decided: Decided) -> Decided {
        if request.ask != Ask::Reserve {
            self.stats.decided(decided.source, decided.is_allowed());
        }
        decided
    }

    /// Counts an answer the leases gave without the gate (`Source::Lease`, `LocalDenial`).
    pub(crate) fn count_leased(&self, decided: &Decided) {
        self.stats.decided(decided.source, decided.is_allowed());
    }

    /// Feeds a decision from the store to the caches.
    fn remember(&self, sent_at: Timestamp, now: Timestamp, request: Request<'_>, d: &Decision) {
        let (at, cost) = (request.cache_key(), request.cost);
        if d.is_allowed() {
            if let Some(cache) = &self.deny_cache {
                cache.forget(now, at);
            }
            if let Some(cache) = &self.allow_cache {
                cache.record(now, at, cost, d);
            }
        } else {
            // The deny cache's expiry counts from `sent_at`, before the store decided, so
            // it ends no later than the store's denial.
            if let Some(cache) = &self.deny_cache {
                cache.record(sent_at, now, at, cost, d);
            }
            if let Some(cache) = &self.allow_cache {
                cache.block(now, at);
            }
        }
    }

    /// The failure policy's answer, because the store gave none (`why`).
    fn degrade(&self, why: Unavailable, request: Request<'_>, now: Timestamp) -> Decided {
        let Request {
            slot,
            capacity,
            key,
            cost,
            ask,
        } = request;
        match self.on_failure {
            FailurePolicy::FailOpen => Decided {
                decision: Decision::blind(capacity),
                source: Source::FailOpen(why),
            },
            FailurePolicy::FailClosed => Decided {
                decision: Decision::blind_denial(capacity, self.breaker_wait(now)),
                source: Source::FailClosed(why),
            },
            FailurePolicy::LocalFallback { .. } => {
                // The builder made one fallback limiter per table policy.
                let limiter = &self.fallback[slot as usize];
                // Held until the decision is made: see `fallback_clock`. A fallback decision
                // is a few hundred nanoseconds of local work with no await.
                let mut latest = self
                    .fallback_clock
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let now = (*latest).max(now);
                *latest = now;
                // Only a request's acquire is charged: a peek takes nothing, and a
                // reservation's answer here is never spent (see `Ask::Reserve`).
                let local = if ask == Ask::Acquire {
                    limiter.acquire_at(now, key, cost)
                } else {
                    limiter.peek_at(now, key, cost)
                };
                let decision = match local {
                    Ok(decision) => decision,
                    // The cost fits the policy but not this node's share of it: it cannot
                    // be admitted locally, so deny until the store may be asked again.
                    Err(_) => {
                        let wait = self.breaker_wait(now);
                        let peek = limiter.peek_at(now, key, 0).ok();
                        Decision {
                            outcome: Outcome::Denied,
                            limit: limiter.policy().capacity(),
                            remaining: peek.map_or(0, |d| d.remaining),
                            retry_after: wait,
                            reset_after: peek.map_or(wait, |d| d.reset_after.max(wait)),
                            limit_index: peek.map_or(0, |d| d.limit_index),
                        }
                    }
                };
                Decided {
                    decision,
                    source: Source::Fallback(why),
                }
            }
        }
    }

    /// How long until the breaker lets a call through again: zero when closed.
    fn breaker_wait(&self, now: Timestamp) -> Micros {
        self.lock_breaker()
            .poll_timeout()
            .map_or(Micros::ZERO, |at| at.saturating_since(now))
    }

    /// Runs `f` on the breaker, then logs and counts the transitions it made, under the
    /// same lock so that the state gauge follows the breaker's own order.
    fn with_breaker<R>(&self, f: impl FnOnce(&mut Breaker) -> R) -> R {
        let mut breaker = self.lock_breaker();
        let result = f(&mut breaker);
        while let Some(event) = breaker.poll_event() {
            self.stats.breaker_event(&event);
            log_transition(&self.name, &event);
        }
        result
    }

    fn lock_breaker(&self) -> MutexGuard<'_, Breaker> {
        // The breaker's methods do not panic and update it in single assignments.
        self.breaker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn log_transition(limiter: &str, event: &BreakerEvent) {
    match *event {
        BreakerEvent::Opened {
            at,
            from,
            until,
            trips,
        } => tracing::warn!(
            limiter,
            from = from.as_str(),
            trips,
            at_us = at.as_micros(),
            open_for_us = until.saturating_since(at).as_micros(),
            "rein: circuit breaker opened; store calls stop, the failure policy answers"
        ),
        BreakerEvent::HalfOpened { at } => tracing::info!(
            limiter,
            at_us = at.as_micros(),
            "rein: circuit breaker half-open; the next call (a request's, or a lease's) probes the store"
        ),
        BreakerEvent::Closed { at } => tracing::info!(
            limiter,
            at_us = at.as_micros(),
            "rein: circuit breaker closed; the store decides again"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroUsize};
    use std::time::Duration;

    use rein_core::{Limit, Policy};
    use rein_memory::FakeClock;

    use super::*;
    use crate::fallback::local_share;

    const KEY: &[u8] = b"k";

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_micros(ms * 1_000)
    }

    fn request(cost: u64) -> Request<'static> {
        Request {
            slot: 0,
            capacity: 10,
            key: KEY,
            cost,
            ask: Ask::Acquire,
        }
    }

    fn peek(cost: u64) -> Request<'static> {
        Request {
            ask: Ask::Peek,
            ..request(cost)
        }
    }

    fn gate(on_failure: FailurePolicy) -> Gate<FakeClock> {
        let policy = Policy::single(Limit::fixed_window(10, Micros::from_secs(1)).unwrap());
        let fallback = match on_failure {
            FailurePolicy::LocalFallback { expected_nodes } => {
                vec![
                    MemoryLimiter::builder(local_share(&policy, expected_nodes).unwrap())
                        .clock(FakeClock::new(at(0)))
                        .build(),
                ]
            }
            _ => Vec::new(),
        };
        let breaker = BreakerConfig::new()
            .with_failure_threshold(NonZeroU32::new(2).unwrap())
            .with_backoff(Duration::from_millis(100), Duration::from_secs(1))
            .with_probe_timeout(Duration::from_millis(50));
        Gate::new(
            "test".into(),
            on_failure,
            fallback,
            breaker,
            NonZeroUsize::new(16),
            None,
            Duration::from_millis(50),
        )
    }

    fn denied(retry_ms: u64) -> Decision {
        Decision {
            outcome: Outcome::Denied,
            limit: 10,
            remaining: 0,
            retry_after: Micros::from_millis(retry_ms),
            reset_after: Micros::from_millis(retry_ms),
            limit_index: 0,
        }
    }

    fn allowed() -> Decision {
        Decision {
            outcome: Outcome::Allowed,
            limit: 10,
            remaining: 9,
            retry_after: Micros::ZERO,
            reset_after: Micros::from_millis(100),
            limit_index: 0,
        }
    }

    fn call(gate: &Gate<FakeClock>, now: Timestamp, cost: u64) -> Ticket {
        match gate.begin(now, request(cost)) {
            Step::Call(ticket) => ticket,
            Step::Answer(d) => panic!("expected a store call at {now:?}, got {d:?}"),
        }
    }

    fn answer(gate: &Gate<FakeClock>, now: Timestamp, cost: u64) -> Decided {
        match gate.begin(now, request(cost)) {
            Step::Answer(d) => d,
            Step::Call(_) => panic!("expected a local answer at {now:?}"),
        }
    }

    /// What the gate does along one timeline: each row is one request, in order.
    struct Row {
        label: &'static str,
        at_ms: u64,
        /// A peek of `cost` rather than an acquire.
        peek: bool,
        cost: u64,
        /// `Some(reply)`: the gate must call the store, which replies this, `ms` later.
        store: Option<(Reply, u64)>,
        source: Source,
        allowed: bool,
    }

    fn run(gate: &Gate<FakeClock>, rows: Vec<Row>) {
        for row in rows {
            let now = at(row.at_ms);
            let asked = if row.peek {
                peek(row.cost)
            } else {
                request(row.cost)
            };
            let decided = match (row.store, gate.begin(now, asked)) {
                (Some((reply, took)), Step::Call(ticket)) => {
                    gate.finish(now, at(row.at_ms + took), ticket, asked, reply)
                }
                (None, Step::Answer(decided)) => decided,
                (store, step) => panic!(
                    "{}: expected a store call: {}, got {step:?}",
                    row.label,
                    store.is_some()
                ),
            };
            assert_eq!(decided.source, row.source, "{}", row.label);
            assert_eq!(decided.is_allowed(), row.allowed, "{}", row.label);
        }
    }

    #[test]
    #[rustfmt::skip]
    fn a_denial_is_repeated_locally_until_its_retry_after_then_the_store_is_asked_again() {
        let g = gate(FailurePolicy::FailClosed);
        run(&g, vec![
            Row { label: "the store denies for 100 ms", at_ms: 0, peek: false, cost: 1, store: Some((Reply::Decided(denied(100)), 1)), source: Source::Store, allowed: false },
            // Counted from the send (0 ms), not the reply (1 ms).
            Row { label: "same cost, cached", at_ms: 50, peek: false, cost: 1, store: None, source: Source::DenyCache, allowed: false },
            Row { label: "a larger cost, cached too", at_ms: 99, peek: false, cost: 5, store: None, source: Source::DenyCache, allowed: false },
            Row { label: "the denial ran out: ask", at_ms: 100, peek: false, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
            Row { label: "an admission clears the cache", at_ms: 101, peek: false, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn a_zero_cost_peek_is_never_answered_from_the_cache() {
        let g = gate(FailurePolicy::FailClosed);
        run(&g, vec![
            Row { label: "denied", at_ms: 0, peek: false, cost: 1, store: Some((Reply::Decided(denied(100)), 1)), source: Source::Store, allowed: false },
            Row { label: "peek asks the store", at_ms: 10, peek: false, cost: 0, store: Some((Reply::Decided(denied(90)), 1)), source: Source::Store, allowed: false },
        ]);
    }

    #[test]
    #[rustfmt::skip]
    fn a_peek_goes_through_the_breaker_but_never_through_the_caches() {
        let g = gate(FailurePolicy::FailOpen);
        let timeout = || Some((Reply::Failed(Unavailable::Timeout), 50));
        run(&g, vec![
            Row { label: "denied for 100 ms", at_ms: 0, peek: false, cost: 1, store: Some((Reply::Decided(denied(100)), 1)), source: Source::Store, allowed: false },
            Row { label: "a peek asks the store, not the deny cache", at_ms: 10, peek: true, cost: 1, store: Some((Reply::Decided(denied(90)), 1)), source: Source::Store, allowed: false },
            Row { label: "an allowed peek", at_ms: 20, peek: true, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
            Row { label: "left the cached denial as it was", at_ms: 30, peek: false, cost: 1, store: None, source: Source::DenyCache, allowed: false },
            Row { label: "a peek times out", at_ms: 100, peek: true, cost: 1, store: timeout(), source: Source::FailOpen(Unavailable::Timeout), allowed: true },
            Row { label: "a second trips the breaker", at_ms: 160, peek: true, cost: 1, store: timeout(), source: Source::FailOpen(Unavailable::Timeout), allowed: true },
            Row { label: "open: the failure policy answers the peek", at_ms: 220, peek: true, cost: 1, store: None, source: Source::FailOpen(Unavailable::BreakerOpen), allowed: true },
            Row { label: "half-open: a peek is the probe", at_ms: 310, peek: true, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
        ]);
        assert_eq!(g.breaker_state(), BreakerState::Closed);
    }

    #[test]
    fn a_peek_answered_by_the_local_fallback_takes_nothing_from_it() {
        let g = gate(FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::new(4).unwrap(),
        });
        // 10 per second over 4 nodes: 2 each. Peeks of the whole share, then of more.
        let failed = |ms: u64, asked: Request<'static>| match g.begin(at(ms), asked) {
            Step::Answer(d) => d,
            Step::Call(ticket) => g.finish(
                at(ms),
                at(ms),
                ticket,
                asked,
                Reply::Failed(Unavailable::Timeout),
            ),
        };
        for ms in 0..5 {
            let d = failed(ms, peek(2));
            assert!(matches!(d.source, Source::Fallback(_)), "{d:?}");
            assert!(d.is_allowed(), "{d:?}");
            assert_eq!(
                d.decision.remaining, 0,
                "what is left after the peeked cost"
            );
        }
        let d = failed(5, peek(3));
        assert!(!d.is_allowed(), "more than the node's share: {d:?}");
        let admitted: u64 = (6..10)
            .map(|ms| u64::from(failed(ms, request(1)).is_allowed()))
            .sum();
        assert_eq!(admitted, 2, "the peeks took nothing from the share");
    }

    #[test]
    #[rustfmt::skip]
    fn failures_trip_the_breaker_and_the_failure_policy_answers_until_a_probe_succeeds() {
        let g = gate(FailurePolicy::FailOpen);
        let timeout = || Some((Reply::Failed(Unavailable::Timeout), 50));
        run(&g, vec![
            Row { label: "first timeout", at_ms: 0, peek: false, cost: 1, store: timeout(), source: Source::FailOpen(Unavailable::Timeout), allowed: true },
            Row { label: "second trips it (open 100 ms)", at_ms: 60, peek: false, cost: 1, store: timeout(), source: Source::FailOpen(Unavailable::Timeout), allowed: true },
            Row { label: "open: not called", at_ms: 120, peek: false, cost: 1, store: None, source: Source::FailOpen(Unavailable::BreakerOpen), allowed: true },
            Row { label: "half-open: the probe", at_ms: 210, peek: false, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
            Row { label: "closed again", at_ms: 212, peek: false, cost: 1, store: Some((Reply::Decided(allowed()), 1)), source: Source::Store, allowed: true },
        ]);
        assert_eq!(g.breaker_state(), BreakerState::Closed);
        let stats = g.stats();
        assert_eq!(stats.store_calls, 4);
        assert_eq!(stats.breaker_rejections, 1);
    }

    #[test]
    #[rustfmt::skip]
    fn fail_closed_denies_until_the_breaker_lets_a_call_through() {
        let g = gate(FailurePolicy::FailClosed);
        let refused = || Some((Reply::Failed(Unavailable::Connection), 1));
        run(&g, vec![
            Row { label: "refused", at_ms: 0, peek: false, cost: 1, store: refused(), source: Source::FailClosed(Unavailable::Connection), allowed: false },
            Row { label: "refused, trips", at_ms: 2, peek: false, cost: 1, store: refused(), source: Source::FailClosed(Unavailable::Connection), allowed: false },
        ]);
        // Open from 3 ms for 100 ms: the denial says when the store will be asked.
        let d = answer(&g, at(53), 1);
        assert_eq!(d.source, Source::FailClosed(Unavailable::BreakerOpen));
        assert_eq!(d.decision.retry_after, Micros::from_millis(50));
    }

    #[test]
    fn the_local_fallback_admits_this_nodes_share_and_no_more() {
        let g = gate(FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::new(4).unwrap(),
        });
        // 10 per second over 4 nodes: 2 each, decided locally while the store is away.
        let mut admitted = 0;
        for ms in 0..10 {
            let decided = match g.begin(at(ms), request(1)) {
                Step::Answer(d) => d,
                Step::Call(ticket) => g.finish(
                    at(ms),
                    at(ms),
                    ticket,
                    request(1),
                    Reply::Failed(Unavailable::Timeout),
                ),
            };
            assert!(matches!(decided.source, Source::Fallback(_)), "{decided:?}");
            admitted += u64::from(decided.is_allowed());
        }
        assert_eq!(admitted, 2);
    }

    #[test]
    fn fallback_decisions_never_go_back_in_time_so_a_reset_never_exceeds_the_window() {
        // Two requests read the clock at 2 100 ms and 1 900 ms and reach the fallback in that
        // order (the second was slower to get there). Decided at 1 900 ms, the second would
        // count in the window the first opened, [2 000, 3 000), and report its end as
        // 1 100 ms away: longer than the 1 s window.
        let g = gate(FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::new(1).unwrap(),
        });
        let fallback = |now| {
            let Step::Call(ticket) = g.begin(now, request(1)) else {
                panic!("the breaker is closed");
            };
            let failed = Reply::Failed(Unavailable::Timeout);
            g.finish(now, now, ticket, request(1), failed)
        };
        let first = fallback(at(2_100));
        let second = fallback(at(1_900));
        assert!(matches!(second.source, Source::Fallback(_)), "{second:?}");
        assert_eq!(first.decision.reset_after, Micros::from_millis(900));
        // Decided at 2 100 ms, the later instant: 900 ms to go.
        assert_eq!(second.decision.reset_after, Micros::from_millis(900));
        assert_eq!(second.decision.remaining, 8);
    }

    #[test]
    fn a_refused_request_or_a_dropped_call_leaves_the_breaker_as_it_was() {
        let g = gate(FailurePolicy::FailOpen);
        let ticket = call(&g, at(0), 1);
        g.refused(at(1), ticket);
        let ticket = call(&g, at(2), 1);
        g.abandon(at(3), ticket);
        assert_eq!(g.breaker_state(), BreakerState::Closed);
        assert_eq!(g.stats().invalid_requests, 1);
    }

    #[test]
    fn with_the_default_breaker_a_recovered_store_decides_again_within_a_second() {
        // docs/failure.md, "Recovery": t_up + B + 2D + S + g with the defaults (B = 800 ms,
        // D = 50 ms, S = 5 ms) and requests every g = 10 ms, after an outage long enough for
        // the open period to reach its maximum.
        let guard = Duration::from_millis(55);
        let mut g = gate(FailurePolicy::FailOpen);
        g.breaker = Mutex::new(Breaker::new(BreakerConfig::new().with_probe_timeout(guard)));
        let t_up = 3_600;
        let mut now = 0;
        let recovered = loop {
            assert!(now < t_up + 5_000, "never recovered");
            match g.begin(at(now), request(1)) {
                Step::Answer(_) => now += 10,
                Step::Call(ticket) if now < t_up => {
                    // Down: the call times out at the guard deadline.
                    let ended = now + 55;
                    let reply = Reply::Failed(Unavailable::Timeout);
                    let _ = g.finish(at(now), at(ended), ticket, request(1), reply);
                    now = ended;
                }
                Step::Call(ticket) => {
                    let d = g.finish(
                        at(now),
                        at(now + 1),
                        ticket,
                        request(1),
                        Reply::Decided(allowed()),
                    );
                    assert_eq!(d.source, Source::Store);
                    break now + 1;
                }
            }
        };
        let took = recovered - t_up;
        assert!(took <= 905 + 10, "recovery took {took} ms");
    }
}
