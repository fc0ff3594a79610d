//! [`RateBook`]: a node's rate leases of token buckets, as a pure state machine with
//! explicit time.
//!
//! A token bucket is leased as rate, not tokens (docs/leases.md, "Token bucket: lease
//! rate"): for each hot key the node holds a **sub-bucket** (burst `cᵢ`, rate `rᵢ`) granted
//! by the store ([`rein_core::rate_share::RateShares`]) and spends it locally ([`ShareBucket`]). The
//! book renews the share every renewal interval on its timer, reporting the key's demand
//! (the last one reported while the new count is within 25 % of it), so shares follow
//! demand; it confirms a shrink with a take at once (the store frees the old grant only
//! then); it gives the share back, with its unspent tokens, after an interval without a
//! request (keeping the key, whose next take reports the demand it had), when the key goes
//! idle, or when the node shuts down. A request the sub-bucket cannot serve yet while the share is
//! valid is denied locally (what is left belongs to other nodes' shares, or to the direct
//! share the store decides); one it can never serve (above its burst, or a share of no
//! rate) and any request without a valid share (before the first grant, after a failed
//! renewal, after the share lapsed) go to the store's direct share.
//!
//! # The invariant
//! Tokens are spent only from the latest grant the book applied, before its local end
//! `sent_at + V − V/1000 − 1 µs` (the store's grant ends at its own instant `+ V`, which is
//! later), refilled at the granted rate slowed by 1 ‰ (a local clock up to 1 000 ppm fast
//! still refills no faster than the share), and nothing is held from that end on (the
//! tokens are dropped, so a continued grant applied later cannot revive them). A grant is
//! applied only if it answers the one take the book waits for; a fresh grant replaces the
//! tokens held, a continued one keeps them (clamped to the new burst). A return stops
//! spending at once. Each request to the store carries a `seq` from one counter for the
//! whole book, never reused: one the book gave up on cannot undo a later one, and a reply
//! is matched to its take by it even across a key forgotten (idle) and tracked again (a
//! late reply to a take of the key's earlier life once passed for the answer to the new
//! one's first take: a grant long ended in the store, spent again). Everything else (a lost reply, a late grant, a lost
//! return) leaves rate reserved in the store and unused here: under-admission only.
//!
//! # Call order and time
//! Like [`LeaseBook`](super::LeaseBook): [`handle_request`](RateBook::handle_request)
//! per request; drain [`poll_action`](RateBook::poll_action) after every call; report each
//! take with [`handle_taken`](RateBook::handle_taken) (returns need no report); call
//! [`handle_timeout`](RateBook::handle_timeout) at or after
//! [`poll_timeout`](RateBook::poll_timeout); [`handle_shutdown`](RateBook::handle_shutdown)
//! returns every share. `now` need not be monotonic: inputs are taken at the latest instant
//! seen. Nothing panics; only shutdown is sticky.

use std::collections::{BTreeSet, VecDeque};

use hashbrown::HashMap;
use rein_core::time::MAX_MICROS;
use rein_core::{
    Decision, Micros, Outcome, Timestamp,
    rate_share::{RateShares, ReturnRequest, ShareBucket, TakeRequest, Taken},
};

use super::book::{Admit, LeaseConfig, LeaseKey, LeaseKeyRef};
use super::{Book, DirectReason, LeaseStats};

/// A node's rate leases. See the module docs for the call order and the invariant.
#[derive(Debug)]
pub struct RateBook {
    config: LeaseConfig,
    /// This node's id in every share (1 to 2^52 − 1: the driver's builder checks it).
    node: u64,
    leases: HashMap<LeaseKey, RateLease>,
    /// Each lease's next deadline, at most one per lease (`RateLease::timer`).
    timers: BTreeSet<(Timestamp, u32, Box<[u8]>)>,
    actions: VecDeque<RateAction>,
    latest: Timestamp,
    /// The last `seq` sent, for any key: one counter for the whole book, so that a key
    /// forgotten (idle) and tracked again never reuses a `seq`, and a late reply to a take
    /// of its earlier life cannot pass for the answer to a take of the new one.
    seq: u64,
    closed: bool,
    stats: LeaseStats,
}

/// Work for the driver, from [`RateBook::poll_action`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RateAction {
    /// `share_rate(Take(request))` on the key's policy, then
    /// [`handle_taken`](RateBook::handle_taken) with `request.seq`.
    Take {
        /// The key.
        key: LeaseKey,
        /// The request.
        request: TakeRequest,
        /// The instant it was made at.
        at: Timestamp,
    },
    /// `share_rate(Return(request))`; nothing to report.
    Return {
        /// The key.
        key: LeaseKey,
        /// The request.
        request: ReturnRequest,
        /// The instant it was made at.
        at: Timestamp,
    },
}

/// One key's rate share as this node holds it
/// ([`LeasedLimiter::rate_shares`](crate::lease::LeasedLimiter::rate_shares)): per-node shares made
/// visible, the node's own view (the store keeps every node's; each node reports its own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareView {
    /// The name of the key's policy.
    pub policy: String,
    /// The key.
    pub key: Box<[u8]>,
    /// The share's rate, in thousandths of the bucket's (0 while no share is held).
    pub parts: u64,
    /// The share's burst, tokens.
    pub burst: u64,
    /// Tokens held now (refilled to the instant asked).
    pub tokens: u64,
    /// The demand the node reported last, cost per second.
    pub demand: u64,
    /// The local instant the share ends: spending stops there (as if never held: no share).
    pub valid_until: Timestamp,
    /// Tokens' worth of rate the share keeps reserved from the instant asked until it
    /// ends: what the others lose if this node dies now (its share lapses unrenewed).
    pub stranded_if_dead: u64,
}

/// How a take ended, for [`RateBook::handle_taken`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TakeReply {
    /// The store answered.
    Answered(Taken),
    /// No answer (timeout, connection, error): the share may have changed in the store.
    Failed,
}

/// One key's rate lease.
#[derive(Debug)]
struct RateLease {
    shares: RateShares,
    bucket: ShareBucket,
    /// The grant spent now, if any.
    holding: Option<Holding>,
    flight: Option<Flight>,
    /// The next take is due at this instant.
    renew_at: Timestamp,
    /// Demand: cost asked for since `asked_since`.
    asked: u64,
    asked_since: Timestamp,
    /// Whether a take was sent since the key was tracked. Until then the key is cold while
    /// its demand over a renewal interval is below `min_demand`; after, it is hot until it
    /// is forgotten (idle, or a shutdown).
    taken: bool,
    /// The demand (per second) the last take that saw requests reported: what a node back
    /// from a quiet spell reports at first, rather than its first request's cost over an
    /// interval (issue 23: a node bursting on and off started each burst near the floor).
    remembered: u64,
    last_request: Timestamp,
    timer: Option<Timestamp>,
}

/// The grant a node spends now: what its next take names to the store.
#[derive(Clone, Copy, Debug)]
struct Holding {
    /// The grant chain held.
    id: u64,
    /// The `seq` of the take whose grant this is.
    applied: u64,
    /// Its rate (parts): a smaller one next is a shrink.
    parts: u64,
    /// Its burst, tokens.
    burst: u64,
    /// The next take only confirms a shrink ([`RateBook::handle_taken`]): it reports the
    /// demand reported last and keeps measuring.
    confirm: bool,
}

/// The one take in flight.
#[derive(Clone, Copy, Debug)]
struct Flight {
    seq: u64,
    /// When the book asked for it: the grant's validity counts from here (the store's
    /// instant is no earlier).
    sent_at: Timestamp,
    /// When it left for the store (a take a request triggered waits for that request's
    /// direct decision, [`RateBook::take_left`]): its give-up counts from here.
    left_at: Timestamp,
    validity: Micros,
}

impl RateBook {
    /// An empty book for node `node` (1 to 2^52 − 1, as the driver's builder checks). The
    /// validity of a grant is [`LeaseConfig::share_validity_intervals`] renewal
    /// intervals.
    pub fn new(config: LeaseConfig, node: u64) -> Self {
        Self {
            config,
            node,
            leases: HashMap::new(),
            timers: BTreeSet::new(),
            actions: VecDeque::new(),
            latest: Timestamp::EPOCH,
            seq: 0,
            closed: false,
            stats: LeaseStats::default(),
        }
    }

    /// A request for `cost` tokens (`0 < cost ≤ capacity`, checked by the caller) of `key`,
    /// whose policy is the token bucket `shares`, at `now`. Never [`Admit::Wait`]: without a
    /// valid share the store's direct share decides.
    pub fn handle_request(
        &mut self,
        now: Timestamp,
        key: LeaseKeyRef<'_>,
        cost: u64,
        shares: &RateShares,
    ) -> Admit {
        let now = self.observe(now);
        if self.closed {
            return self.count(Admit::Direct(DirectReason::Closed));
        }
        if !self.leases.contains_key(&key) {
            if self.leases.len() >= self.config.max_keys.get() {
                return self.count(Admit::Direct(DirectReason::Untracked));
            }
            let owned = LeaseKey {
                slot: key.slot,
                key: key.key.into(),
            };
            let lease = RateLease {
                shares: *shares,
                bucket: ShareBucket::default(),
                holding: None,
                flight: None,
                renew_at: now,
                asked: 0,
                asked_since: now,
                taken: false,
                remembered: 0,
                last_request: now,
                timer: None,
            };
            self.leases.insert(owned, lease);
        }
        let config = self.config;
        let node = self.node;
        let Some((owned, lease)) = self.leases.get_key_value_mut(&key) else {
            return self.count(Admit::Direct(DirectReason::Untracked));
        };
        // A key that sent no take since it was tracked is cold until it asks for
        // `min_demand` within a renewal interval: before, its requests go direct and take
        // no share (a take for a key that asks once would cost a store call, and a return
        // or a lapse, for nothing). The window book checks demand at every reservation;
        // here only before the first take: a share's renewals follow demand themselves.
        let cold = !lease.taken;
        if cold && now >= lease.asked_since.saturating_add(config.renew_interval) {
            lease.asked = 0;
            lease.asked_since = now;
        }
        lease.asked = lease.asked.saturating_add(cost);
        lease.last_request = now;
        let cold = cold && lease.asked < config.min_demand;
        let admit = if lease.bucket.try_take(now, &lease.shares, cost) {
            // As a direct decision's: the bucket's tokens and its time to full, read off this
            // share (every sub-bucket is the bucket scaled by its share), not the share's own
            // few tokens and a reset of zero (issue 23: headers said "full again now").
            Admit::Leased(Decision {
                outcome: Outcome::Allowed,
                limit: lease.shares.capacity(),
                remaining: lease.bucket.scaled_tokens(&lease.shares),
                retry_after: Micros::ZERO,
                // A share of no rate never fills: until it ends, then (never "full now",
                // which is what a fail open's blind admission says).
                reset_after: lease.bucket.full_after().unwrap_or_else(|| {
                    lease
                        .bucket
                        .until()
                        .saturating_since(now)
                        .max(Micros::from_micros(1))
                }),
                limit_index: 0,
            })
        } else if now < lease.bucket.until()
            && let Some(wait) = lease.bucket.wait_for(&lease.shares, cost)
        {
            // A valid share that will have the tokens: the rest of the bucket is other
            // shares', or the direct share's, so the store would not do better now.
            let retry_after = wait.min(config.renew_interval).max(Micros::from_micros(1));
            Admit::Denied(Decision {
                outcome: Outcome::Denied,
                limit: lease.shares.capacity(),
                remaining: lease.bucket.scaled_tokens(&lease.shares),
                retry_after,
                reset_after: lease
                    .bucket
                    .full_after()
                    .unwrap_or(Micros::ZERO)
                    .max(retry_after),
                limit_index: 0,
            })
        } else if now < lease.bucket.until() {
            // Above this node's burst, or a share of no rate: only the store can say.
            Admit::Direct(DirectReason::AboveShare)
        } else if cold {
            Admit::Direct(DirectReason::Cold)
        } else {
            Admit::Direct(DirectReason::NoShare)
        };
        // A take needs a fresh `seq`; with every one used (2^52 − 1 requests), the book
        // takes no more and the key is decided directly.
        if !cold && lease.flight.is_none() && now >= lease.renew_at && self.seq < MAX_MICROS {
            self.seq += 1;
            let take = Self::take(config, node, self.seq, now, lease);
            lease.taken = true;
            self.actions.push_back(RateAction::Take {
                key: owned.clone(),
                request: take,
                at: now,
            });
            self.stats.reservations += 1;
        }
        // Most requests find their timer already armed no later than needed: no key copy.
        if lease
            .timer
            .is_none_or(|t| t > Self::due(config, now, lease))
        {
            let owned = owned.clone();
            self.arm(now, &owned);
        }
        self.count(admit)
    }

    /// The take `seq` of `key` left for the store at `now`: its give-up counts from here. A
    /// take a request triggered is held back until that request's direct decision is made
    /// (so that it cannot move the direct share's tokens first); timed from the request, a
    /// store answering in about half a renewal interval had every such take given up as it
    /// landed, and the key was never leased, each grant reserving rate nobody spent.
    pub fn take_left(&mut self, now: Timestamp, key: &LeaseKey, seq: u64) {
        let now = self.observe(now);
        if let Some(flight) = self
            .leases
            .get_mut(key)
            .and_then(|lease| lease.flight.as_mut())
            .filter(|flight| flight.seq == seq)
        {
            flight.left_at = flight.left_at.max(now);
        }
    }

    /// The take `seq` of `key` ended at `now` with `reply`. A reply the book no longer waits
    /// for is ignored (its share stays unused in the store until it lapses).
    pub fn handle_taken(&mut self, now: Timestamp, key: &LeaseKey, seq: u64, reply: TakeReply) {
        let now = self.observe(now);
        let config = self.config;
        // Only a grant is a late grant; a late failure or refusal changes nothing.
        let late = matches!(reply, TakeReply::Answered(Taken::Granted(_)));
        let Some(lease) = self.leases.get_mut(key) else {
            self.stats.late_grants += u64::from(late);
            return;
        };
        // A take past its timeout is given up even if its timer has not fired yet (a late
        // timer, or one paused): its reply is never applied. Not after a shutdown, which
        // waits for takes up to the flight timeout so that what they grant goes back.
        if !self.closed {
            give_up_lost(lease, &mut self.stats, now, config);
        }
        let flight = match lease.flight {
            Some(f) if f.seq == seq => f,
            _ => {
                self.stats.late_grants += u64::from(late);
                return;
            }
        };
        lease.flight = None;
        match reply {
            TakeReply::Answered(Taken::Granted(grant)) => {
                let v = flight.validity.as_micros();
                // From before the store decided, less a 1 000 ppm clock margin.
                let until = Timestamp::from_micros(
                    (flight.sent_at.as_micros() + v).saturating_sub(v / 1_000 + 1),
                );
                lease
                    .bucket
                    .apply(now, &lease.shares, &grant, until, CLOCK_MARGIN_PERMILLE);
                // A shrink keeps the old grant reserved in the store (the node may still be
                // spending it) until a take names this one as applied: name it at once
                // rather than an interval later, so the rate it frees reaches the growing
                // shares sooner (issue 23: a hot node that cooled down cost 7 of 150 tokens
                // per shift in the simulator).
                let shrunk = lease.holding.is_some_and(|h| grant.parts < h.parts);
                let confirm = grant.continued && shrunk;
                if confirm {
                    lease.renew_at = now;
                }
                lease.holding = Some(Holding {
                    id: grant.id,
                    applied: flight.seq,
                    parts: grant.parts,
                    burst: grant.burst,
                    confirm,
                });
                self.stats.reservations_granted += 1;
                self.stats.units_reserved += grant.moved / lease.shares.token_units();
            }
            TakeReply::Answered(Taken::Full | Taken::Stale) => {
                self.stats.reservations_denied += 1;
                lease.renew_at = now.saturating_add(config.renew_interval);
            }
            TakeReply::Failed => {
                self.stats.reservations_failed += 1;
                lease.renew_at = now.saturating_add(config.renew_interval);
            }
        }
        // The next deadline is now the renewal, not the flight's timeout.
        if let Some(t) = lease.timer.take() {
            self.timers.remove(&(t, key.slot, key.key.clone()));
        }
        if self.closed {
            // The take shutdown waited for has ended: its share goes back, and the key is
            // let go.
            self.release(now, key);
        } else {
            self.arm(now, key);
        }
    }

    /// Runs the timers due at `now`: takes presumed lost, idle keys returned.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let now = self.observe(now);
        while let Some((at, slot, key)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            let key = LeaseKey { slot, key };
            if let Some(lease) = self.leases.get_mut(&key) {
                lease.timer = None;
            }
            self.service(now, &key);
        }
    }

    /// Gives every share back and sends every later request to the store. A key with a
    /// take in flight is let go when the take ends: its reply
    /// ([`handle_taken`](Self::handle_taken)) gives back the share it granted, and a reply
    /// that never comes is presumed lost at the take's timeout
    /// ([`handle_timeout`](Self::handle_timeout)).
    pub fn handle_shutdown(&mut self, now: Timestamp) {
        let now = self.observe(now);
        self.closed = true;
        let settled: Vec<LeaseKey> = self
            .leases
            .iter()
            .filter(|(_, lease)| lease.flight.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        for key in settled {
            self.release(now, &key);
        }
    }

    /// `true` after [`handle_shutdown`](Self::handle_shutdown).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The counters so far.
    pub fn stats(&self) -> LeaseStats {
        self.stats
    }

    /// Every key's share as this node holds it at `now` (ascending by policy slot and key),
    /// naming each key's policy by `policy_name` of its slot.
    pub fn shares(&self, now: Timestamp, policy_name: impl Fn(u32) -> String) -> Vec<ShareView> {
        let now = now.max(self.latest);
        let mut views: Vec<(u32, ShareView)> = self
            .leases
            .iter()
            .map(|(key, lease)| {
                let mut bucket = lease.bucket;
                bucket.refill(now);
                let live = lease.holding.filter(|_| now < bucket.until());
                let parts = live.map_or(0, |h| h.parts);
                let view = ShareView {
                    policy: policy_name(key.slot),
                    key: key.key.clone(),
                    parts,
                    burst: live.map_or(0, |h| h.burst),
                    tokens: bucket.tokens(&lease.shares),
                    demand: lease.remembered,
                    valid_until: bucket.until(),
                    stranded_if_dead: rate_tokens(
                        &lease.shares,
                        parts,
                        bucket.until().saturating_since(now),
                    ),
                };
                (key.slot, view)
            })
            .collect();
        views.sort_by(|(a, va), (b, vb)| (a, &va.key).cmp(&(b, &vb.key)));
        views.into_iter().map(|(_, view)| view).collect()
    }

    /// The number of keys held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// `true` when no key is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    fn observe(&mut self, now: Timestamp) -> Timestamp {
        self.latest = self.latest.max(now);
        self.latest
    }

    fn count(&mut self, admit: Admit) -> Admit {
        self.stats.count(&admit);
        admit
    }

    /// Take `seq` for `lease`: its demand since the last take, per second, measured over at
    /// least one renewal interval. A key's first take leaves with the request that made it
    /// hot, `min_demand` within an interval, often a few µs after its first: a rate over that
    /// span would claim about `cost × 10⁶` per second and, until the next renewal, shrink
    /// every other node's share for a guess. Over an interval a new key starts modestly
    /// (more of its requests go direct for one interval, which is exact), and a burst
    /// shorter than an interval is not extrapolated.
    fn take(
        config: LeaseConfig,
        node: u64,
        seq: u64,
        now: Timestamp,
        lease: &mut RateLease,
    ) -> TakeRequest {
        if let Some(h) = lease.holding.as_mut()
            && std::mem::take(&mut h.confirm)
        {
            let demand = lease.remembered;
            return Self::send(config, node, seq, now, lease, demand);
        }
        let elapsed = now
            .saturating_since(lease.asked_since)
            .max(config.renew_interval)
            .as_micros()
            .max(1);
        let per_second = u128::from(lease.asked) * 1_000_000 / u128::from(elapsed);
        let measured = u64::try_from(per_second)
            .unwrap_or(u64::MAX)
            .min(rein_core::rate_share::MAX_DEMAND);
        // A node back from a quiet spell (no share held) reports at least what it reported
        // before it: its first request over an interval would claim almost nothing, and the
        // node would get rate only as the others shrink, one renewal at a time. The next
        // renewal reports what it measures.
        let demand = if lease.holding.is_none() {
            measured.max(lease.remembered)
        } else if within_band(measured, lease.remembered) {
            // Noise, not a change: shares sized from each interval's count would wobble,
            // and every wobble costs rate (a shrinking share stays reserved until its old
            // grant ends, while the growing one gets only what is free at its take).
            lease.remembered
        } else {
            measured
        };
        if lease.asked > 0 {
            lease.remembered = demand;
        }
        lease.asked = 0;
        lease.asked_since = now;
        Self::send(config, node, seq, now, lease, demand)
    }

    /// The take `seq` for `lease`, reporting `demand`, now in flight.
    fn send(
        config: LeaseConfig,
        node: u64,
        seq: u64,
        now: Timestamp,
        lease: &mut RateLease,
        demand: u64,
    ) -> TakeRequest {
        let validity = Micros::from_micros(
            config
                .renew_interval
                .as_micros()
                .saturating_mul(u64::from(config.share_validity_intervals.get()))
                .clamp(1, rein_core::rate_share::MAX_VALIDITY.as_micros()),
        );
        lease.flight = Some(Flight {
            seq,
            sent_at: now,
            left_at: now,
            validity,
        });
        lease.renew_at = now.saturating_add(config.renew_interval);
        TakeRequest {
            node,
            held: lease.holding.map_or(0, |h| h.id),
            seq,
            applied: lease.holding.map_or(0, |h| h.applied),
            demand,
            validity,
        }
    }

    /// Registers the lease's next deadline: its flight's timeout, or its idle time.
    fn arm(&mut self, now: Timestamp, key: &LeaseKey) {
        let config = self.config;
        let Some(lease) = self.leases.get_mut(key) else {
            return;
        };
        let due = Self::due(config, now, lease);
        // Only an earlier deadline re-arms: a later one is found when the earlier fires.
        if lease.timer.is_some_and(|t| t <= due) {
            return;
        }
        if let Some(old) = lease.timer.replace(due) {
            self.timers.remove(&(old, key.slot, key.key.clone()));
        }
        self.timers.insert((due, key.slot, key.key.clone()));
    }

    /// When `lease` next needs its timer: its flight's timeout, its renewal while it holds a
    /// share, or its idle time.
    fn due(config: LeaseConfig, now: Timestamp, lease: &RateLease) -> Timestamp {
        let idle = lease.last_request.saturating_add(config.idle_after);
        match lease.flight {
            Some(f) => f.left_at.saturating_add(take_timeout(config)),
            None if lease.holding.is_some() => lease.renew_at.min(idle),
            None => idle,
        }
        .max(now)
    }

    /// A fired timer of `key`: a lost take, an idle key, or neither yet.
    fn service(&mut self, now: Timestamp, key: &LeaseKey) {
        let config = self.config;
        let Some(lease) = self.leases.get_mut(key) else {
            return;
        };
        give_up_lost(lease, &mut self.stats, now, config);
        let idle = now >= lease.last_request.saturating_add(config.idle_after);
        // After a shutdown a key is kept only until its take ends.
        if lease.flight.is_none() && (idle || self.closed) {
            self.release(now, key);
            return;
        }
        // Renewals run on the timer, not only from requests: a share follows demand even
        // when requests stop. A share with no request over a whole interval goes back at
        // once, its rate to the others' next renewals, rather than stay reserved for
        // nothing until it lapses (issue 23: a node silent for less than `idle_after`
        // kept its share through every silence).
        if lease.flight.is_none() && lease.holding.is_some() && now >= lease.renew_at {
            if now >= lease.last_request.saturating_add(config.renew_interval) {
                self.give_back(now, key);
            } else if self.seq < MAX_MICROS {
                self.seq += 1;
                let node = self.node;
                if let Some(lease) = self.leases.get_mut(key) {
                    let take = Self::take(config, node, self.seq, now, lease);
                    self.actions.push_back(RateAction::Take {
                        key: key.clone(),
                        request: take,
                        at: now,
                    });
                    self.stats.reservations += 1;
                }
            }
        }
        self.arm(now, key);
    }

    /// Gives `key`'s share back (its unspent tokens, if still valid) and forgets the key.
    fn release(&mut self, now: Timestamp, key: &LeaseKey) {
        self.give_back(now, key);
        if let Some(lease) = self.leases.remove(key)
            && let Some(t) = lease.timer
        {
            self.timers.remove(&(t, key.slot, key.key.clone()));
        }
    }

    /// Gives `key`'s share back (its unspent tokens, if still valid) and keeps the key,
    /// holding no share: its next request goes to the direct share and takes anew.
    fn give_back(&mut self, now: Timestamp, key: &LeaseKey) {
        let Some(lease) = self.leases.get_mut(key) else {
            return;
        };
        // Nothing to give back, or no `seq` left for it (the share then lapses in the store).
        let Some(holding) = lease.holding else {
            return;
        };
        if self.seq >= MAX_MICROS {
            return;
        }
        self.seq += 1;
        lease.bucket.refill(now);
        let units = if now < lease.bucket.until() {
            lease.bucket.units()
        } else {
            0
        };
        let idle_until = now.min(lease.bucket.until());
        self.stats.rate_idle += rate_tokens(
            &lease.shares,
            holding.parts,
            idle_until.saturating_since(lease.last_request),
        );
        lease.bucket.clear();
        lease.holding = None;
        let id = holding.id;
        self.stats.returns += 1;
        self.stats.units_returned += units / lease.shares.token_units();
        self.actions.push_back(RateAction::Return {
            key: key.clone(),
            request: ReturnRequest {
                node: self.node,
                id,
                seq: self.seq,
                units,
            },
            at: now,
        });
    }
}

/// How long a take waits for its reply before the book gives it up and may take again: the
/// flight timeout, but no longer than the validity less one renewal interval, so that a
/// renewal whose reply is lost is retried (and answered) while the grant being spent is
/// still valid, rather than after it lapsed. Giving up is safe whenever it happens: a
/// reply to a take given up is never applied.
fn take_timeout(config: LeaseConfig) -> Micros {
    let interval = config.renew_interval.as_micros();
    let spare = interval
        .saturating_mul(u64::from(config.share_validity_intervals.get()))
        .saturating_sub(interval)
        .max(1);
    config.flight_timeout.min(Micros::from_micros(spare))
}

/// Gives up `lease`'s take if its timeout has passed at `now`: presumed lost, its reply
/// never applied.
fn give_up_lost(
    lease: &mut RateLease,
    stats: &mut LeaseStats,
    now: Timestamp,
    config: LeaseConfig,
) {
    if let Some(f) = lease.flight
        && now >= f.left_at.saturating_add(take_timeout(config))
    {
        lease.flight = None;
        stats.reservations_lost += 1;
    }
}

/// Tokens' worth of rate `parts` refill over `span`.
fn rate_tokens(shares: &RateShares, parts: u64, span: Micros) -> u64 {
    let units = u128::from(parts) * u128::from(shares.part_rate()) * u128::from(span.as_micros());
    u64::try_from(units / u128::from(shares.token_units().max(1))).unwrap_or(u64::MAX)
}

/// Whether `measured` is within [`DEMAND_BAND_PERCENT`] of `reported` (a positive demand).
fn within_band(measured: u64, reported: u64) -> bool {
    let (m, r) = (u128::from(measured), u128::from(reported));
    r > 0
        && m * 100 >= r * (100 - DEMAND_BAND_PERCENT)
        && m * 100 <= r * (100 + DEMAND_BAND_PERCENT)
}

/// A renewal reports the demand it reported before while what it measured is within this
/// many percent of it: at 3× demand in the simulator's real-traffic scenarios, shares
/// resized to every interval's count lost 6–7 % of the rate to the reservations a change
/// keeps (docs/leases.md, "Utilisation under real traffic").
const DEMAND_BAND_PERCENT: u128 = 25;

/// The local refill is slowed by this much (‰): a clock up to 1 000 ppm fast still
/// refills no faster than the share.
const CLOCK_MARGIN_PERMILLE: u64 = 1;

impl Book for RateBook {
    type Action = RateAction;

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.timers.first().map(|(at, _, _)| *at)
    }

    fn poll_action(&mut self) -> Option<RateAction> {
        self.actions.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{rate_share::Grant, token_bucket::TokenBucket};

    use super::*;

    const KEY: LeaseKeyRef<'static> = LeaseKeyRef { slot: 0, key: b"k" };

    fn ms(ms: u64) -> Timestamp {
        Timestamp::from_micros(1_000_000_000 + ms * 1_000)
    }

    /// 100 tokens, 1 per ms.
    fn shares() -> RateShares {
        RateShares::new(&TokenBucket::new(100, 1_000, Micros::from_secs(1)).unwrap()).unwrap()
    }

    /// Every key hot from its first request (`min_demand` 1): a cold key's own test sets
    /// the default.
    fn book() -> RateBook {
        let config = LeaseConfig {
            min_demand: 1,
            ..LeaseConfig::default()
        };
        RateBook::new(config, 9)
    }

    fn take_of(book: &mut RateBook) -> (LeaseKey, TakeRequest) {
        match book.poll_action() {
            Some(RateAction::Take { key, request, .. }) => (key, request),
            other => panic!("expected a take, got {other:?}"),
        }
    }

    /// A book that has seen one request for `KEY`, at 0 ms, and the take it sent for it.
    fn asked_once(s: &RateShares) -> (RateBook, LeaseKey, TakeRequest) {
        let mut b = book();
        b.handle_request(ms(0), KEY, 1, s);
        let (key, take) = take_of(&mut b);
        (b, key, take)
    }

    fn grant(id: u64, continued: bool, burst: u64, parts: u64, moved_tokens: u64) -> TakeReply {
        TakeReply::Answered(Taken::Granted(Grant {
            id,
            continued,
            burst,
            parts,
            moved: moved_tokens * shares().token_units(),
        }))
    }

    /// A take a request triggered waits for that request's direct decision: its give-up
    /// counts from when it left, not from the request. Asked at 0, sent at 60 ms (a slow
    /// direct call), granted at 120 ms: applied (before, given up at 100 ms as it landed, a
    /// late grant; at such latencies the key was never leased).
    #[test]
    fn a_take_held_back_by_its_direct_call_is_timed_from_when_it_left() {
        let s = shares();
        let (mut b, key, take) = asked_once(&s);
        b.take_left(ms(60), &key, take.seq);
        b.handle_timeout(ms(100));
        b.handle_taken(ms(120), &key, take.seq, grant(1, false, 50, 500, 50));
        assert_eq!(b.stats().late_grants, 0);
        assert!(matches!(
            b.handle_request(ms(120), KEY, 1, &s),
            Admit::Leased(_)
        ));
        // Still given up once its own timeout has passed from when it left.
        let (mut late, key, take) = asked_once(&s);
        late.take_left(ms(60), &key, take.seq);
        late.handle_timeout(ms(160));
        late.handle_taken(ms(161), &key, take.seq, grant(1, false, 50, 500, 50));
        assert_eq!(late.stats().late_grants, 1);
    }

    /// With the default `min_demand` of 2, a key asked for once per renewal interval is
    /// cold: it goes direct and never takes a share. Twice within an interval, it takes one.
    #[test]
    fn a_cold_key_goes_direct_and_takes_no_share_until_its_demand_is_min_demand() {
        let s = shares();
        let mut b = RateBook::new(LeaseConfig::default(), 9);
        for i in 0..5 {
            assert_eq!(
                b.handle_request(ms(150 * i), KEY, 1, &s),
                Admit::Direct(DirectReason::Cold)
            );
            assert_eq!(b.poll_action(), None, "no take for a cold key");
        }
        assert_eq!(
            b.handle_request(ms(650), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare),
            "the second unit within 100 ms"
        );
        let (key, take) = take_of(&mut b);
        assert_eq!(
            take.demand, 20,
            "2 tokens over one renewal interval, per second"
        );
        assert_eq!(b.stats().reservations, 1);
        // A failed first take leaves the key hot: asked once more a renewal interval later,
        // it takes again.
        b.handle_taken(ms(651), &key, take.seq, TakeReply::Failed);
        assert_eq!(
            b.handle_request(ms(760), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare)
        );
        let (_, again) = take_of(&mut b);
        // Forgotten once idle, the key is cold again.
        b.handle_taken(ms(761), &key, again.seq, TakeReply::Failed);
        b.handle_timeout(ms(5_000));
        assert_eq!(
            b.handle_request(ms(5_001), KEY, 1, &s),
            Admit::Direct(DirectReason::Cold)
        );
        assert_eq!(b.poll_action(), None);
        // With `min_demand` 0, no key is cold.
        let mut hot = RateBook::new(
            LeaseConfig {
                min_demand: 0,
                ..LeaseConfig::default()
            },
            9,
        );
        let _ = hot.handle_request(ms(0), KEY, 1, &s);
        let _ = take_of(&mut hot);
    }

    #[test]
    fn the_first_request_goes_direct_and_asks_for_a_share_then_requests_spend_it_locally() {
        let s = shares();
        let mut b = book();
        assert_eq!(
            b.handle_request(ms(0), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare)
        );
        let (key, take) = take_of(&mut b);
        assert_eq!((take.node, take.held, take.seq), (9, 0, 1));
        // Valid for two renewal intervals (the default).
        assert_eq!(take.validity, Micros::from_millis(200));
        // One token, measured over one renewal interval (100 ms), not over the 0 µs since
        // the key appeared (which would claim 10⁶ per second).
        assert_eq!(take.demand, 10);
        // In flight: still direct, no second take (single flight).
        assert_eq!(
            b.handle_request(ms(1), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare)
        );
        assert_eq!(b.poll_action(), None);
        b.handle_taken(ms(2), &key, 1, grant(77, false, 10, 500, 10));
        for i in 0..10 {
            let Admit::Leased(d) = b.handle_request(ms(2), KEY, 1, &s) else {
                panic!("not leased");
            };
            // As a direct decision reads: the bucket's tokens (this share's 9 − i of 10,
            // scaled to the bucket's 100) and its time to full (the share's 1 + i missing
            // tokens at half of 1 per ms, less 1 ‰), never "full again now".
            assert_eq!(d.remaining, (9 - i) * 10);
            assert!(
                d.reset_after >= Micros::from_micros(2_000 * (1 + i)),
                "{d:?}"
            );
            assert!(
                d.reset_after <= Micros::from_micros(2_003 * (1 + i)),
                "{d:?}"
            );
        }
        // Empty: denied locally, the wait is the local rate (half of 1 per ms, less 1 ‰).
        let Admit::Denied(d) = b.handle_request(ms(2), KEY, 1, &s) else {
            panic!("not denied locally");
        };
        assert_eq!(d.retry_after, Micros::from_micros(2_003));
        assert!(matches!(
            b.handle_request(ms(5), KEY, 1, &s),
            Admit::Leased(_)
        ));
    }

    #[test]
    fn renewals_report_demand_keep_the_chain_and_never_spend_past_the_local_end() {
        let s = shares();
        let (mut b, key, _) = asked_once(&s);
        b.handle_taken(ms(1), &key, 1, grant(77, false, 10, 1_000, 10));
        for i in 0..50 {
            b.handle_request(ms(2 + i), KEY, 1, &s);
        }
        // Due one interval after the last take: 51 tokens asked since, over 100 ms: 510/s.
        b.handle_request(ms(100), KEY, 1, &s);
        let (_, take) = take_of(&mut b);
        assert_eq!((take.held, take.seq, take.demand), (77, 2, 510));
        // Its reply is lost; the first grant ends locally at 200 ms − 200 µs − 1 µs.
        b.handle_taken(ms(150), &key, 2, TakeReply::Failed);
        assert!(matches!(
            b.handle_request(ms(199), KEY, 1, &s),
            Admit::Leased(_)
        ));
        let end = Timestamp::from_micros(ms(200).as_micros() - 201);
        assert!(matches!(
            b.handle_request(end, KEY, 1, &s),
            Admit::Direct(_)
        ));
    }

    /// A renewal's reply is lost, the grant the book spends ends locally with tokens
    /// unspent, then a later renewal continues the chain: those tokens are not kept (the
    /// store may have stopped reserving them and handed them to the direct share).
    #[test]
    fn a_continued_grant_after_the_local_end_starts_from_what_it_moved() {
        let s = shares();
        let (mut b, key, _) = asked_once(&s);
        b.handle_taken(ms(1), &key, 1, grant(77, false, 10, 1_000, 10));
        b.handle_request(ms(100), KEY, 1, &s);
        let (_, take) = take_of(&mut b);
        b.handle_taken(ms(150), &key, take.seq, TakeReply::Failed);
        // Past the first grant's local end (200 ms − 201 µs), holding 9 tokens.
        b.handle_request(ms(301), KEY, 1, &s);
        let (_, take) = take_of(&mut b);
        assert_eq!((take.held, take.applied), (77, 1));
        b.handle_taken(ms(302), &key, take.seq, grant(77, true, 10, 1_000, 1));
        assert!(matches!(
            b.handle_request(ms(302), KEY, 1, &s),
            Admit::Leased(_)
        ));
        assert!(matches!(
            b.handle_request(ms(302), KEY, 1, &s),
            Admit::Denied(_)
        ));
    }

    /// The saved failure of the lossy node-level proptest, on a number line: a take's reply
    /// is slow, the book gives up on it, the key goes idle and is forgotten (nothing held,
    /// nothing to return), then is asked for again. The new life's first take must not
    /// share a `seq` with the old one: else the old reply, arriving now, passes for its
    /// answer and the book spends a grant that ended in the store long ago.
    #[test]
    fn a_key_forgotten_and_tracked_again_never_takes_a_late_reply_of_its_earlier_life() {
        let s = shares();
        let (mut b, key, first) = asked_once(&s);
        // Given up on at 100 ms; idle (no request for 1 s) at 1 s: forgotten, no return.
        b.handle_timeout(ms(1_000));
        assert_eq!(b.stats().reservations_lost, 1);
        assert!(b.is_empty());
        assert_eq!(b.poll_action(), None);
        // Asked again: a new take, whose seq was never sent before.
        b.handle_request(ms(1_100), KEY, 1, &s);
        let (_, second) = take_of(&mut b);
        assert!(second.seq > first.seq);
        // The first take's reply arrives now: not the one the book waits for.
        b.handle_taken(ms(1_150), &key, first.seq, grant(5, false, 100, 1_000, 100));
        assert_eq!(b.stats().late_grants, 1);
        assert!(matches!(
            b.handle_request(ms(1_150), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare)
        ));
        // A return after a later life's take carries a seq above it too.
        b.handle_taken(ms(1_160), &key, second.seq, grant(6, false, 10, 1_000, 10));
        b.handle_shutdown(ms(1_170));
        match b.poll_action() {
            Some(RateAction::Return { request, .. }) => assert!(request.seq > second.seq),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reply_for_a_take_given_up_on_is_never_applied() {
        let s = shares();
        let (mut b, key, _) = asked_once(&s);
        // A take is given up on after the validity less an interval (100 ms), below the
        // flight timeout (1 s): a lost renewal is retried while its share is still valid.
        assert_eq!(b.poll_timeout(), Some(ms(100)));
        b.handle_timeout(ms(99));
        assert_eq!(b.stats().reservations_lost, 0);
        b.handle_timeout(ms(1_000));
        assert_eq!(b.stats().reservations_lost, 1);
        b.handle_taken(ms(1_001), &key, 1, grant(5, false, 100, 1_000, 100));
        assert_eq!(b.stats().late_grants, 1);
        assert!(matches!(
            b.handle_request(ms(1_002), KEY, 1, &s),
            Admit::Direct(_)
        ));
    }

    /// A reply after the take's timeout is never applied, though the timer that gives the
    /// take up has not fired (a late timer, or one paused); and a late reply that granted
    /// nothing (a failure, a full table) is no late grant.
    #[test]
    fn a_reply_after_the_take_timeout_is_never_applied_before_the_timer_fires() {
        let s = shares();
        let (mut b, key, first) = asked_once(&s);
        // Due at 100 ms; no timer runs. The reply comes at 100 ms: too late.
        b.handle_taken(ms(100), &key, first.seq, grant(5, false, 100, 1_000, 100));
        assert_eq!((b.stats().reservations_lost, b.stats().late_grants), (1, 1));
        assert!(matches!(
            b.handle_request(ms(101), KEY, 1, &s),
            Admit::Direct(_)
        ));
        b.handle_taken(ms(102), &key, first.seq, TakeReply::Failed);
        b.handle_taken(ms(103), &key, first.seq, TakeReply::Answered(Taken::Full));
        assert_eq!(b.stats().late_grants, 1, "refusals are no grants");
    }

    /// Issue 23: shares follow demand on the timer. A renewal goes out every interval
    /// whether a request comes at that instant or not; a demand within the band of the
    /// last one reports the last one (no wobble); a shrink is named as applied by a take
    /// at once; a share with no request for a whole interval goes back, the key stays
    /// tracked, and its next take reports the demand it had, not its first request's.
    #[test]
    fn shares_renew_on_the_timer_confirm_shrinks_at_once_and_go_back_when_quiet() {
        let s = shares();
        let (mut b, key, _) = asked_once(&s);
        b.handle_taken(ms(1), &key, 1, grant(77, false, 10, 500, 10));
        assert_eq!(b.poll_timeout(), Some(ms(100)));
        // 40 requests by 99 ms, none at 100 ms: the timer renews, reporting 400/s.
        for i in 0..40 {
            b.handle_request(ms(60 + i), KEY, 1, &s);
        }
        assert_eq!(b.poll_action(), None);
        b.handle_timeout(ms(100));
        let (_, take) = take_of(&mut b);
        assert_eq!(
            (take.held, take.applied, take.seq, take.demand),
            (77, 1, 2, 400)
        );
        b.handle_taken(ms(101), &key, 2, grant(77, true, 10, 500, 0));
        // 45 more by 200 ms: within 25 % of 400, so 400 again.
        for i in 0..45 {
            b.handle_request(ms(150 + i), KEY, 1, &s);
        }
        b.handle_timeout(ms(200));
        let (_, take) = take_of(&mut b);
        assert_eq!((take.seq, take.demand), (3, 400));
        // The store shrinks the share: a take names it as applied at once, reporting the
        // same demand, so the old grant stops being reserved now.
        b.handle_taken(ms(201), &key, 3, grant(77, true, 5, 300, 0));
        assert_eq!(b.poll_timeout(), Some(ms(201)));
        b.handle_timeout(ms(201));
        let (_, take) = take_of(&mut b);
        assert_eq!((take.applied, take.seq, take.demand), (3, 4, 400));
        b.handle_taken(ms(202), &key, 4, grant(77, true, 5, 300, 0));
        // The node's share, visible: 3/10 of the rate (0.3 tokens per ms) until 200 ms
        // after the take at 201 ms, less the clock margin: 45 tokens' worth left at 250 ms.
        let view = &b.shares(ms(250), |_| String::new())[0];
        assert_eq!((view.parts, view.burst, view.demand), (300, 5, 400));
        assert_eq!(view.stranded_if_dead, 45);
        // No request after 194 ms: at the renewal (301 ms) the last request is 107 ms
        // old, a whole interval: the share goes back, the key stays, and the 107 ms of
        // rate it held unused are counted (0.3 × 107 = 32 tokens).
        b.handle_timeout(ms(301));
        match b.poll_action() {
            Some(RateAction::Return { request, .. }) => assert_eq!(request.id, 77),
            other => panic!("expected a return, got {other:?}"),
        }
        assert_eq!(b.len(), 1);
        assert_eq!(b.stats().rate_idle, 32);
        assert_eq!(b.shares(ms(302), |_| String::new())[0].parts, 0);
        // Back after 400 ms of silence: direct, and a fresh take that reports the demand
        // it had (400/s), not one request over an interval (10/s).
        assert_eq!(
            b.handle_request(ms(700), KEY, 1, &s),
            Admit::Direct(DirectReason::NoShare)
        );
        let (_, take) = take_of(&mut b);
        assert_eq!((take.held, take.demand), (0, 400));
    }

    #[test]
    fn an_idle_key_returns_its_unspent_tokens_and_is_forgotten_and_shutdown_returns_all() {
        let s = shares();
        let (mut b, key, _) = asked_once(&s);
        b.handle_taken(ms(1), &key, 1, grant(77, false, 10, 100, 4));
        assert!(matches!(
            b.handle_request(ms(2), KEY, 3, &s),
            Admit::Leased(_)
        ));
        // Idle for 1 s, but the share ended locally at 200 ms: nothing to give back.
        b.handle_timeout(ms(1_002));
        match b.poll_action() {
            Some(RateAction::Return { request, .. }) => {
                assert_eq!((request.id, request.seq, request.units), (77, 2, 0));
            }
            other => panic!("{other:?}"),
        }
        assert!(b.is_empty());
        // Shutdown while valid: the unspent tokens go back.
        b.handle_request(ms(2_000), KEY, 1, &s);
        let (key, take) = take_of(&mut b);
        b.handle_taken(ms(2_001), &key, take.seq, grant(90, false, 10, 100, 4));
        b.handle_shutdown(ms(2_001));
        match b.poll_action() {
            Some(RateAction::Return { request, .. }) => {
                assert_eq!(request.id, 90);
                assert_eq!(request.units, 4 * s.token_units());
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            b.handle_request(ms(2_002), KEY, 1, &s),
            Admit::Direct(DirectReason::Closed)
        );
    }

    #[test]
    fn a_take_in_flight_at_shutdown_gives_its_share_back_when_it_lands_or_is_lost() {
        let s = shares();
        // Landing: the share it grants goes straight back, and the key is let go.
        let (mut b, key, take) = asked_once(&s);
        b.handle_shutdown(ms(1));
        assert!(b.poll_action().is_none(), "nothing held yet");
        assert!(!b.is_empty(), "kept for the take in flight");
        b.handle_taken(ms(2), &key, take.seq, grant(41, false, 10, 100, 4));
        match b.poll_action() {
            Some(RateAction::Return { request, .. }) => {
                assert_eq!((request.id, request.units), (41, 4 * s.token_units()));
            }
            other => panic!("{other:?}"),
        }
        assert!(b.is_empty());
        assert_eq!(b.stats().late_grants, 0);
        assert_eq!(b.stats().reservations_pending(), 0);
        // Lost: let go at the take's timeout; a reply after that is late and unused.
        let (mut b, key, take) = asked_once(&s);
        b.handle_shutdown(ms(1));
        b.handle_timeout(ms(99));
        assert!(!b.is_empty());
        b.handle_timeout(ms(100));
        assert!(b.is_empty());
        assert_eq!(b.stats().reservations_lost, 1);
        b.handle_taken(ms(150), &key, take.seq, grant(42, false, 10, 100, 4));
        assert!(b.poll_action().is_none());
        assert_eq!(b.stats().late_grants, 1);
        // Landing past the take's timeout with no timer run (a driver stops its timers at
        // shutdown and waits for takes up to the flight timeout): still given back.
        let (mut b, key, take) = asked_once(&s);
        b.handle_shutdown(ms(1));
        b.handle_taken(ms(150), &key, take.seq, grant(43, false, 10, 100, 4));
        assert!(
            matches!(b.poll_action(), Some(RateAction::Return { .. })),
            "{:?}",
            b.stats()
        );
        assert_eq!(b.stats().reservations_lost, 0);
    }

    #[test]
    fn a_clock_stepping_back_neither_refills_nor_stretches_the_share() {
        let s = shares();
        let mut b = book();
        b.handle_request(ms(10), KEY, 1, &s);
        let (key, _) = take_of(&mut b);
        b.handle_taken(ms(11), &key, 1, grant(1, false, 2, 1_000, 2));
        assert!(matches!(
            b.handle_request(ms(11), KEY, 2, &s),
            Admit::Leased(_)
        ));
        // Back to 0: taken at 11 ms, nothing refilled.
        assert!(matches!(
            b.handle_request(ms(0), KEY, 1, &s),
            Admit::Denied(_)
        ));
    }
}
