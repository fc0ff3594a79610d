//! Rate shares: a token bucket leased as sub-buckets, the shared state's transitions.
//!
//! A token bucket `(C, r)` cannot be leased as a block of tokens: tokens spent after they
//! were taken over-admit by the refill meanwhile. It is leased as **rate**: each node holds
//! a sub-bucket of burst `cᵢ` and rate `rᵢ`, and the store keeps what is left, the
//! **direct share** `(C − Σcᵢ, r − Σrᵢ)`, which decides requests sent to the store. Any
//! union of streams, each conforming to its own sub-bucket, conforms to `(Σcᵢ, Σrᵢ)` and
//! hence to `(C, r)`: exact, with no slack. docs/leases.md ("Token bucket: lease rate")
//! has the proof, including the renewals that move a share up or down.
//!
//! This module is the store's half: [`RateShares::take`] (grant or renew a node's share),
//! [`RateShares::give_back`] (a node returns its share and unspent tokens) and
//! [`RateShares::direct`] (a request decided against the direct share). The node's half
//! (a sub-bucket spent locally) is [`ShareBucket`]. Both Redis's Lua
//! (`lua/lease_rate.lua` in rein-redis) and the memory store run these same integers.
//!
//! # Units
//! Rate is split in [`RATE_PARTS`] parts (‰ of `r`). Tokens are counted in *share units*,
//! `token_units = RATE_PARTS × units_per_token` to a token, so a share of `p` parts refills
//! exactly `p × units_per_micro` units per µs, an integer (the bucket's emission interval
//! is `units_per_token / units_per_micro` µs). A bucket is shareable when the full bucket
//! (`C × token_units`) and the full rate (`RATE_PARTS × units_per_micro`) stay at most
//! [`MAX_MICROS`], so every quantity is exact in Lua's doubles.
//!
//! # Who holds what
//! Per key the store keeps the direct share's tokens (as `drawn`, units taken from a full
//! bucket, so that an absent key is a full bucket with no shares) and one [`Share`] per
//! node. A share's *reservation* at `t` is the larger of its current grant (while
//! `t < until`) and its *hold* (while `t < hold_until`): an earlier grant of the chain the
//! node may still be spending, because it has not seen (or not yet applied) the later one.
//! The direct share has what no reservation holds.
//!
//! # Contract
//! `now` need not be monotonic: every transition runs at `max(now, at)`, the latest
//! instant the state has seen. Between transitions the direct share refills at the rate the
//! live reservations leave it, piece by piece between the instants where one ends. A
//! denial (of [`direct`](RateShares::direct)) changes nothing; a take or a return always
//! writes. Requests may run late, out of order or never: each carries the node's `seq`,
//! and a stale one changes nothing.

use thiserror::Error;

use crate::{
    Algorithm, ConfigError, Decision, MAX_MICROS, MAX_SPAN, Micros, OverCapacity, Timestamp,
    token_bucket::{TokenBucket, TokenBucketState},
};

/// A token bucket prepared for rate shares: its capacity and rate in share units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateShares {
    /// `C`: the bucket's capacity in tokens.
    capacity: u64,
    /// Share units per token: `RATE_PARTS × units_per_token`.
    token_units: u64,
    /// Share units one part of the rate refills per µs: the bucket's `units_per_micro`.
    part_rate: u64,
}

/// The shared state of one key: the direct share and the nodes' shares.
///
/// The default (nothing drawn, no share) is a full bucket, as is an absent key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RateState {
    /// Share units taken from a full bucket: the direct share holds `C × token_units −
    /// drawn`. Never below the units reserved by the shares (`Σ reserved burst ×
    /// token_units`).
    pub drawn: u64,
    /// The latest instant a transition ran at.
    pub at: Timestamp,
    /// The smallest id the next fresh grant may take (ids only grow).
    pub next_id: u64,
    /// The nodes' shares, ordered by node, at most [`MAX_SHARES`].
    pub shares: Vec<Share>,
}

/// One node's share, as the store keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Share {
    /// The node (1 to [`MAX_MICROS`]).
    pub node: u64,
    /// The grant chain: set by a fresh grant, kept by renewals that continue it.
    pub id: u64,
    /// `cᵢ`: the burst of the current grant, tokens.
    pub burst: u64,
    /// `rᵢ`: the rate of the current grant, in [`RATE_PARTS`].
    pub parts: u64,
    /// The current grant is usable before this instant (store time).
    pub until: Timestamp,
    /// The node's demand as last reported (tokens per second, by convention).
    pub demand: u64,
    /// The `seq` of the last request the store ran for this share.
    pub seq: u64,
    /// The largest burst of this chain's earlier grants still usable (see the module doc).
    pub hold_burst: u64,
    /// The largest rate of this chain's earlier grants still usable.
    pub hold_parts: u64,
    /// The earlier grants are usable before this instant.
    pub hold_until: Timestamp,
}

/// A node asking for its share: a fresh one, or the renewal of the one it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TakeRequest {
    /// Who asks (1 to [`MAX_MICROS`]); one share per node and key.
    pub node: u64,
    /// The id of the grant the node holds and may still spend, or 0 for none. A renewal
    /// continues the share only if this matches and the share is still valid.
    pub held: u64,
    /// The node's count of its requests for this key, growing with each (take or return):
    /// a request older than one the store has run for this share is refused
    /// ([`Taken::Stale`]), so that a request the node gave up on cannot undo a later one.
    pub seq: u64,
    /// The `seq` of the take whose grant the node spends now (the last one it applied), or
    /// 0. When it is the share's latest grant, the node spends nothing older, and the
    /// store stops reserving the chain's earlier grants (so a shrink frees its rate at the
    /// next renewal instead of when every earlier grant has ended).
    pub applied: u64,
    /// The node's observed demand, tokens per second (at most [`MAX_DEMAND`]): shares are
    /// divided in proportion to it.
    pub demand: u64,
    /// How long the grant stays usable from the store's instant (1 µs to
    /// [`MAX_VALIDITY`]).
    pub validity: Micros,
}

/// One operation on a key's rate shares: what a store's
/// [`Leasable::share_rate`](crate::Leasable::share_rate) runs atomically.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateOp {
    /// [`RateShares::take`].
    Take(TakeRequest),
    /// [`RateShares::give_back`].
    Return(ReturnRequest),
    /// [`RateShares::direct`] of this cost.
    Direct(u64),
}

/// The operation a store or limiter names in
/// [`DecideError::Unsupported`](crate::DecideError::Unsupported) when asked to refund a token
/// bucket leased as rate: its state is the nodes' shares, which take no refund (not giving
/// back only under-admits).
pub const REFUND_UNSUPPORTED: &str = "a refund of a token bucket leased as rate";

/// The answer to a [`RateOp`], of the same kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateAnswer {
    /// To [`RateOp::Take`].
    Taken(Taken),
    /// To [`RateOp::Return`]: whether it was applied.
    Returned(bool),
    /// To [`RateOp::Direct`].
    Decided(Decision),
}

/// A node giving its share back: what [`RateShares::give_back`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReturnRequest {
    /// Who returns.
    pub node: u64,
    /// The grant chain returned ([`Grant::id`]).
    pub id: u64,
    /// As in [`TakeRequest::seq`].
    pub seq: u64,
    /// Unspent tokens, share units ([`ShareBucket::units`]).
    pub units: u64,
}

/// The answer to a [`TakeRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Taken {
    /// The node's share from now on (possibly of zero burst and rate, while others hold
    /// everything: its demand is recorded and they shrink at their renewals).
    Granted(Grant),
    /// [`MAX_SHARES`] other nodes hold shares: decide directly.
    Full,
    /// The store has run a later request of this node for this key: nothing changed.
    Stale,
}

/// A share granted to a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The grant chain's id: send it back with the next renewal or the return.
    pub id: u64,
    /// `true` when this renews the chain the node holds (keep its tokens, clamped to the
    /// new burst, plus `moved`); `false` for a fresh share (start from `moved` alone).
    pub continued: bool,
    /// The burst `cᵢ`, tokens.
    pub burst: u64,
    /// The rate `rᵢ`, in [`RATE_PARTS`].
    pub parts: u64,
    /// Share units moved from the direct share into the node's sub-bucket.
    pub moved: u64,
}

/// Why a rate-share request was refused before anything was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum ShareError {
    /// A node id of 0 or above [`MAX_MICROS`]. Fix: pick a node id in range (a random one
    /// per process is fine).
    #[error("node id {0} is not in 1..=2^52-1")]
    Node(u64),
    /// A demand above [`MAX_DEMAND`]. Fix: report tokens per second, capped.
    #[error("demand {0} exceeds {MAX_DEMAND}")]
    Demand(u64),
    /// A validity of zero or above [`MAX_VALIDITY`].
    #[error("validity {0} µs is not in 1..={max}", max = MAX_VALIDITY.as_micros())]
    Validity(u64),
    /// A grant id or a `seq` above [`MAX_MICROS`]: not one the store hands out or keeps.
    #[error("{what} {value} exceeds 2^52-1")]
    TooLarge {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// The policy is not one token bucket whose share units are exact
    /// ([`RateShares::new`]): decide it with `acquire`.
    #[error("the policy is not a single shareable token bucket")]
    NotShareable,
    /// A direct request costing more than the bucket's capacity; see [`OverCapacity`].
    #[error(transparent)]
    InsufficientCapacity(#[from] OverCapacity),
}

impl RateShares {
    /// `bucket` prepared for shares. Errors ([`ConfigError::TooLarge`]) when its capacity
    /// or rate in share units would not be exact: `C × RATE_PARTS × units_per_token` or
    /// `RATE_PARTS × units_per_micro` above [`MAX_MICROS`].
    pub fn new(bucket: &TokenBucket) -> Result<Self, ConfigError> {
        let (units_per_token, units_per_micro) = bucket.emission_interval();
        let token_units =
            crate::exact_product("rate parts × units per token", RATE_PARTS, units_per_token)?;
        crate::exact_product("capacity in share units", bucket.capacity(), token_units)?;
        crate::exact_product("rate parts × units per µs", RATE_PARTS, units_per_micro)?;
        Ok(Self {
            capacity: bucket.capacity(),
            token_units,
            part_rate: units_per_micro,
        })
    }

    /// The capacity `C`, tokens.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Share units per token.
    pub fn token_units(&self) -> u64 {
        self.token_units
    }

    /// Share units one part of the rate refills per µs.
    pub fn part_rate(&self) -> u64 {
        self.part_rate
    }

    /// Runs `op` on `state` (the one dispatch every store uses).
    pub fn apply(
        &self,
        now: Timestamp,
        state: &mut RateState,
        op: RateOp,
    ) -> Result<RateAnswer, ShareError> {
        Ok(match op {
            RateOp::Take(request) => RateAnswer::Taken(self.take(now, state, request)?),
            RateOp::Return(request) => RateAnswer::Returned(self.give_back(now, state, request)?),
            RateOp::Direct(cost) => RateAnswer::Decided(self.direct(now, state, cost)?),
        })
    }

    /// Whether `state` may be forgotten at `now` (every share ended, the direct share full):
    /// a store drops it then.
    pub fn is_forgettable(&self, now: Timestamp, state: &RateState) -> bool {
        now.as_micros().saturating_sub(state.at.as_micros()) >= self.ttl(state).as_micros()
    }

    /// The rate-share state of a key whose plain bucket held `bucket` (an operator's
    /// penalty or set remaining of a key not yet shared, or a node that decided it with
    /// leases off): no share, and the direct share as full at `now` as that bucket, exactly
    /// (`drawn` is the bucket's used units, `C × units_per_token` less what it has left, in
    /// share units). A store adopts the plain state this way the first time a rate-share
    /// operation meets it, then forgets it, so a change an operator made holds for the
    /// leases too. (Before, Redis refused the plain state as another type, read above as
    /// Redis failing, and the memory store decided beside it as if it were full.)
    pub fn adopt(&self, now: Timestamp, bucket: &TokenBucketState) -> RateState {
        // The bucket's used units: `max(tat, now) − now` as whole µs and a remainder, as the
        // bucket itself reads it (a full bucket has used none).
        let (used_us, used_units) = if bucket.is_full_at(now) {
            (0, 0)
        } else {
            // A remainder beyond this bucket's µs (a state its rate, since changed, wrote)
            // counts as the bucket reads it: at most one unit short of a whole µs.
            (
                bucket.tat.as_micros() - now.as_micros(),
                bucket.tat_units.min(self.part_rate - 1),
            )
        };
        let full = self.full_units();
        // Checked before multiplying, as the bucket's own `remaining` is: a state written by
        // another bucket, or before a clock regression, may stand far ahead. Below the
        // bound both terms are at most `full`, so the sum is exact (in Lua's doubles too).
        let drawn = if used_us > full / (RATE_PARTS * self.part_rate) {
            full
        } else {
            (used_us * self.part_rate * RATE_PARTS + used_units.saturating_mul(RATE_PARTS))
                .min(full)
        };
        RateState {
            drawn,
            at: now,
            next_id: 0,
            shares: Vec::new(),
        }
    }

    /// Grants `request.node` its share, or renews it: see [`Taken`]. Always writes (the
    /// share's demand is recorded even when it gets nothing).
    pub fn take(
        &self,
        now: Timestamp,
        state: &mut RateState,
        request: TakeRequest,
    ) -> Result<Taken, ShareError> {
        check_node(request.node)?;
        check_exact("held", request.held)?;
        check_exact("seq", request.seq)?;
        check_exact("applied", request.applied)?;
        if request.demand > MAX_DEMAND {
            return Err(ShareError::Demand(request.demand));
        }
        let validity = request.validity.as_micros();
        if validity == 0 || validity > MAX_VALIDITY.as_micros() {
            return Err(ShareError::Validity(validity));
        }
        let eff = self.advance(now, state);
        let found = state.shares.iter().position(|s| s.node == request.node);
        if found.is_some_and(|i| request.seq <= state.shares[i].seq) {
            return Ok(Taken::Stale);
        }
        if found.is_none() && state.shares.len() >= MAX_SHARES {
            return Ok(Taken::Full);
        }
        let (mut others_burst, mut others_parts, mut others_demand) = (0, 0, 0);
        for share in state.shares.iter().filter(|s| s.node != request.node) {
            let (b, p) = share.reserved(eff);
            others_burst += b;
            others_parts += p;
            others_demand += share.demand;
        }
        let n = state.shares.len() as u64 + u64::from(found.is_none());
        let total_demand = others_demand + request.demand;
        // Parts in proportion to demand, at least a floor so an idle node can start.
        // With no demand anywhere, an equal split.
        let target = (RATE_PARTS * request.demand)
            .checked_div(total_demand)
            .unwrap_or(RATE_PARTS / n)
            .max((RATE_PARTS / (4 * n)).max(1));
        let parts = target.min(RATE_PARTS.saturating_sub(others_parts));
        let burst = (self.capacity * target / RATE_PARTS)
            .max(1)
            .min(self.capacity.saturating_sub(others_burst));
        let level = self.full_units().saturating_sub(state.drawn);
        let old = found.map(|i| state.shares[i]);
        let continued =
            old.filter(|s| request.held != 0 && s.id == request.held && eff < s.until.as_micros());
        let until = Timestamp::from_micros(eff + validity);
        // Whatever the node may still be spending under this share's earlier grants stays
        // reserved until they end, whether this grant continues them or not (a request
        // the node gave up on may run after one it did not). If the node spends the latest
        // grant, that one alone; otherwise all of them, merged (larger, and longer).
        let (hold_burst, hold_parts, hold_until) = match (old, continued) {
            (Some(old), Some(_)) if request.applied != 0 && request.applied == old.seq => {
                (old.burst, old.parts, old.until)
            }
            (Some(old), _) => {
                let (burst, parts) = old.reserved(eff);
                (burst, parts, old.end())
            }
            (None, _) => (0, 0, Timestamp::EPOCH),
        };
        let (id, moved) = match continued {
            // A growing share takes the difference from the direct share: the node holds
            // at most what was reserved for it, so it ends with at most `burst`.
            Some(old) => (
                old.id,
                (burst.saturating_sub(hold_burst) * self.token_units).min(level),
            ),
            // A fresh share (new, or taken over from an ended chain) starts with only what
            // it takes from the direct share now.
            None => {
                let id = eff.max(state.next_id).max(1);
                state.next_id = (id + 1).min(MAX_MICROS);
                (id, (burst * self.token_units).min(level))
            }
        };
        let share = Share {
            node: request.node,
            id,
            burst,
            parts,
            until,
            demand: request.demand,
            seq: request.seq,
            hold_burst,
            hold_parts,
            hold_until,
        };
        state.drawn += moved;
        match found {
            Some(i) => state.shares[i] = share,
            None => {
                let at = state.shares.partition_point(|s| s.node < request.node);
                state.shares.insert(at, share);
            }
        }
        self.clamp(eff, state);
        Ok(Taken::Granted(Grant {
            id: share.id,
            continued: continued.is_some(),
            burst,
            parts,
            moved,
        }))
    }

    /// A node gives back its share with its unspent tokens. Applied only if the share is
    /// that chain, still valid at the store, and the request is not stale (a late return
    /// is ignored: its tokens may belong to a share since reassigned); the tokens go back
    /// to the direct share, at most what the share reserves. Returns whether it was
    /// applied. Always writes.
    pub fn give_back(
        &self,
        now: Timestamp,
        state: &mut RateState,
        request: ReturnRequest,
    ) -> Result<bool, ShareError> {
        check_node(request.node)?;
        check_exact("id", request.id)?;
        check_exact("seq", request.seq)?;
        let eff = self.advance(now, state);
        let Some(i) = state.shares.iter().position(|s| {
            s.node == request.node
                && s.id == request.id
                && request.seq > s.seq
                && eff < s.until.as_micros()
        }) else {
            return Ok(false);
        };
        let (burst, _) = state.shares[i].reserved(eff);
        state.drawn = state
            .drawn
            .saturating_sub(request.units.min(burst * self.token_units));
        state.shares.remove(i);
        self.clamp(eff, state);
        Ok(true)
    }

    /// Decides `cost` against the direct share. A denial changes nothing; its
    /// `retry_after` is a lower bound (shares may hold the rate it needs).
    pub fn direct(
        &self,
        now: Timestamp,
        state: &mut RateState,
        cost: u64,
    ) -> Result<Decision, ShareError> {
        OverCapacity::check(cost, self.capacity)?;
        let mut next = state.clone();
        let eff = self.advance(now, &mut next);
        let level = self.full_units().saturating_sub(next.drawn);
        let need = cost * self.token_units;
        if level >= need {
            next.drawn += need;
            let decision = Decision::allowed(
                self.capacity,
                (level - need) / self.token_units,
                self.ttl(&next),
            );
            if cost > 0 {
                *state = next;
            }
            return Ok(decision);
        }
        let (burst, parts) = next.reserved(eff);
        let rate = RATE_PARTS.saturating_sub(parts) * self.part_rate;
        let retry_after = if rate > 0 && cost <= self.capacity.saturating_sub(burst) {
            div_ceil(need - level, rate)
        } else {
            // The direct share cannot fit it before some share ends.
            next.shares
                .iter()
                .map(|s| s.end().as_micros().saturating_sub(eff))
                .min()
                .unwrap_or(1)
                .max(1)
        };
        Ok(Decision::denied(
            self.capacity,
            level / self.token_units,
            Micros::from_micros(retry_after),
            self.ttl(&next),
        ))
    }

    /// How long after `state.at` the state may be forgotten: every share has ended and the
    /// direct share, refilling at the full rate, is full. A store sets the key's TTL to it.
    pub fn ttl(&self, state: &RateState) -> Micros {
        let at = state.at.as_micros();
        let last_end = state
            .shares
            .iter()
            .map(|s| s.end().as_micros().saturating_sub(at))
            .max()
            .unwrap_or(0);
        Micros::from_micros(last_end + div_ceil(state.drawn, RATE_PARTS * self.part_rate))
    }

    fn full_units(&self) -> u64 {
        self.capacity * self.token_units
    }

    /// Refills the direct share up to `max(now, at)` and drops the shares that ended,
    /// returning that instant. The direct share's rate and burst change only where a
    /// reservation ends, so the refill runs piece by piece between those instants, each
    /// piece at the rate of the reservations live in it: exact.
    fn advance(&self, now: Timestamp, state: &mut RateState) -> u64 {
        let at = state.at.as_micros();
        let eff = now.as_micros().max(at);
        let mut ends: Vec<u64> = state
            .shares
            .iter()
            .flat_map(|s| [s.until.as_micros(), s.hold_until.as_micros()])
            .filter(|&e| at < e && e < eff)
            .collect();
        ends.push(eff);
        ends.sort_unstable();
        let mut cursor = at;
        for end in ends {
            let (burst, parts) = state.reserved(cursor);
            let floor = burst.min(self.capacity) * self.token_units;
            let rate = RATE_PARTS.saturating_sub(parts) * self.part_rate;
            if state.drawn > floor && rate > 0 {
                let excess = state.drawn - floor;
                let dt = end - cursor;
                state.drawn = if dt >= div_ceil(excess, rate) {
                    floor
                } else {
                    state.drawn - dt * rate
                };
            }
            cursor = end;
        }
        state.at = Timestamp::from_micros(eff);
        state.shares.retain(|s| eff < s.end().as_micros());
        eff
    }

    /// The direct share never holds more than the burst no share reserves.
    fn clamp(&self, eff: u64, state: &mut RateState) {
        let (burst, _) = state.reserved(eff);
        state.drawn = state.drawn.max(burst.min(self.capacity) * self.token_units);
    }
}

impl RateState {
    /// Burst and parts the shares reserve at `t`.
    pub fn reserved(&self, t: u64) -> (u64, u64) {
        self.shares.iter().fold((0, 0), |(b, p), s| {
            let (sb, sp) = s.reserved(t);
            (b + sb, p + sp)
        })
    }
}

impl Share {
    /// Burst and parts this share reserves at `t`: its grant's while valid, its hold's
    /// while that lasts, the larger of each.
    pub fn reserved(&self, t: u64) -> (u64, u64) {
        let (mut burst, mut parts) = (0, 0);
        if t < self.until.as_micros() {
            (burst, parts) = (self.burst, self.parts);
        }
        if t < self.hold_until.as_micros() {
            burst = burst.max(self.hold_burst);
            parts = parts.max(self.hold_parts);
        }
        (burst, parts)
    }

    /// When the share reserves nothing any more.
    pub fn end(&self) -> Timestamp {
        self.until.max(self.hold_until)
    }
}

/// A node's sub-bucket: the tokens of its share, spent locally.
///
/// Tokens are counted in share units × 1 000 so that the refill can be slowed by a clock
/// margin in whole units: with `margin` ‰, a node whose clock runs up to `margin` ‰ faster
/// than the store's still refills no faster than its share in store time. The bucket
/// refills only before its local validity `until`, and holds nothing from then on: a node
/// past it may not spend, and a renewal applied later must find nothing to keep (the store
/// may have stopped reserving those tokens). Time is the node's own,
/// explicit; an earlier `now` refills nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShareBucket {
    /// Tokens held, in share units × 1 000.
    milli_units: u128,
    /// The instant `milli_units` was last refilled to.
    at: Timestamp,
    /// Spending and refill stop at this local instant.
    until: Timestamp,
    /// Burst, in share units × 1 000.
    cap: u128,
    /// Refill per µs, share units × 1 000 (already slowed by the margin).
    rate: u128,
}

impl ShareBucket {
    /// Applies a grant received at `now`, usable before the local instant `until`: a
    /// continued grant keeps the tokens (clamped to the new burst), a fresh one starts from
    /// none; both add the moved units.
    pub fn apply(
        &mut self,
        now: Timestamp,
        shares: &RateShares,
        grant: &Grant,
        until: Timestamp,
        margin: u64,
    ) {
        self.refill(now);
        if !grant.continued {
            self.milli_units = 0;
        }
        self.cap = u128::from(grant.burst) * u128::from(shares.token_units) * 1_000;
        self.rate = u128::from(grant.parts)
            * u128::from(shares.part_rate)
            * u128::from(1_000 - margin.min(999));
        self.milli_units = (self.milli_units + u128::from(grant.moved) * 1_000).min(self.cap);
        self.until = until;
    }

    /// Refills up to `now`; from `until` on, holds nothing.
    ///
    /// Tokens past the local end are dropped, not kept: the store may have stopped
    /// reserving them (a grant the node spends is held only until it ends), and a continued
    /// grant applied later keeps what the bucket holds.
    pub fn refill(&mut self, now: Timestamp) {
        if now >= self.until {
            self.milli_units = 0;
        } else {
            let dt = now.saturating_since(self.at).as_micros();
            self.milli_units = (self.milli_units + u128::from(dt) * self.rate).min(self.cap);
        }
        self.at = self.at.max(now);
    }

    /// Refills to `now` and takes `cost` tokens if held and `now` is before `until`.
    pub fn try_take(&mut self, now: Timestamp, shares: &RateShares, cost: u64) -> bool {
        self.refill(now);
        let need = u128::from(cost) * u128::from(shares.token_units) * 1_000;
        if now < self.until && self.milli_units >= need {
            self.milli_units -= need;
            true
        } else {
            false
        }
    }

    /// How long until `cost` tokens are held at this rate, or `None` if they never will be
    /// (no rate, or a cost above the burst).
    pub fn wait_for(&self, shares: &RateShares, cost: u64) -> Option<Micros> {
        let need = u128::from(cost) * u128::from(shares.token_units) * 1_000;
        if need > self.cap || self.rate == 0 {
            return None;
        }
        let wait = need.saturating_sub(self.milli_units).div_ceil(self.rate);
        Some(Micros::from_micros(u64::try_from(wait).unwrap_or(u64::MAX)))
    }

    /// How long until this sub-bucket is full at its rate, rounded up (zero when full),
    /// as refilled last; `None` with no rate. A leased admission's `reset_after`: the time
    /// the whole bucket takes to fill, were every share as full as this one (sub-buckets
    /// are the bucket scaled by their share, burst and rate alike).
    pub fn full_after(&self) -> Option<Micros> {
        if self.rate == 0 {
            return None;
        }
        let wait = self
            .cap
            .saturating_sub(self.milli_units)
            .div_ceil(self.rate);
        Some(Micros::from_micros(u64::try_from(wait).unwrap_or(u64::MAX)))
    }

    /// The whole bucket's tokens were every share as full as this one: `tokens × C / cᵢ`,
    /// rounded down, at most `C` (0 with no burst). A leased admission's `remaining`, the
    /// same scale as a direct decision's (the sub-bucket's own tokens are about `1/n` of it).
    pub fn scaled_tokens(&self, shares: &RateShares) -> u64 {
        if self.cap == 0 {
            return 0;
        }
        let scaled = self.milli_units * u128::from(shares.capacity) / self.cap;
        u64::try_from(scaled)
            .unwrap_or(u64::MAX)
            .min(shares.capacity)
    }

    /// The local instant spending ends.
    pub fn until(&self) -> Timestamp {
        self.until
    }

    /// Whole share units held (what a return gives back), rounded down.
    pub fn units(&self) -> u64 {
        u64::try_from(self.milli_units / 1_000).unwrap_or(u64::MAX)
    }

    /// Whole tokens held, rounded down.
    pub fn tokens(&self, shares: &RateShares) -> u64 {
        self.units() / shares.token_units
    }

    /// Ends the sub-bucket (a return was sent, or the grant was dropped): nothing held,
    /// nothing spendable.
    pub fn clear(&mut self) {
        *self = Self {
            at: self.at,
            ..Self::default()
        };
    }
}

/// Whether `node` can hold shares: 1 to [`MAX_MICROS`] (2^52 − 1, exact in Lua's numbers).
/// Every operation checks its node with it; a leased limiter's builder checks a given id.
pub fn check_node(node: u64) -> Result<(), ShareError> {
    if node == 0 || node > MAX_MICROS {
        Err(ShareError::Node(node))
    } else {
        Ok(())
    }
}

fn check_exact(what: &'static str, value: u64) -> Result<(), ShareError> {
    if value > MAX_MICROS {
        Err(ShareError::TooLarge { what, value })
    } else {
        Ok(())
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    if b == 0 {
        MAX_SPAN.as_micros()
    } else {
        a.div_ceil(b)
    }
}

/// Rate is divided into this many parts (‰): fine enough to follow demand, small enough
/// that `RATE_PARTS × units_per_micro` stays exact for every usual rate.
pub const RATE_PARTS: u64 = 1_000;

/// The most nodes holding shares of one key at once; more go direct. Bounds the state
/// (one Redis hash field per share) and the work per call.
pub const MAX_SHARES: usize = 64;

/// The largest demand a node may report: `RATE_PARTS × demand` and the sum of
/// [`MAX_SHARES`] demands stay exact.
pub const MAX_DEMAND: u64 = (1 << 32) - 1;

/// The longest validity of a grant: one hour. A silent node's share is reassigned only
/// after it, so long validities strand rate.
pub const MAX_VALIDITY: Micros = Micros::from_secs(3_600);

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(capacity: u64, refill: u64, period_ms: u64) -> RateShares {
        let bucket = TokenBucket::new(capacity, refill, Micros::from_millis(period_ms)).unwrap();
        RateShares::new(&bucket).unwrap()
    }

    fn request(node: u64, held: u64, seq: u64, demand: u64) -> TakeRequest {
        TakeRequest {
            node,
            held,
            seq,
            applied: 0,
            demand,
            validity: Micros::from_millis(100),
        }
    }

    fn take(s: &RateShares, now: u64, state: &mut RateState, request: TakeRequest) -> Grant {
        match s.take(Timestamp::from_micros(now), state, request).unwrap() {
            Taken::Granted(g) => g,
            other => panic!("{other:?}"),
        }
    }

    fn back(node: u64, id: u64, seq: u64, units: u64) -> ReturnRequest {
        ReturnRequest {
            node,
            id,
            seq,
            units,
        }
    }

    #[test]
    fn a_lone_node_gets_the_whole_bucket_and_the_direct_share_nothing() {
        let s = shares(100, 100, 1_000);
        let mut state = RateState::default();
        let g = take(&s, 1_000, &mut state, request(7, 0, 1, 50));
        assert_eq!((g.burst, g.parts, g.continued), (100, 1_000, false));
        assert_eq!(g.moved, 100 * s.token_units());
        let t = Timestamp::from_micros(1_000);
        assert!(!s.direct(t, &mut state, 1).unwrap().is_allowed());
        // Returned: the tokens come back, the direct share is whole again.
        let t = Timestamp::from_micros(2_000);
        assert!(
            s.give_back(t, &mut state, back(7, g.id, 2, g.moved))
                .unwrap()
        );
        assert_eq!(state.drawn, 0);
        assert!(state.shares.is_empty());
        assert!(s.direct(t, &mut state, 100).unwrap().is_allowed());
    }

    #[test]
    fn shares_follow_demand_and_a_shrink_stays_reserved_until_the_old_grant_ends() {
        let s = shares(100, 100, 1_000);
        let mut state = RateState::default();
        let a = take(&s, 0, &mut state, request(1, 0, 1, 100));
        assert_eq!(a.parts, 1_000);
        // B arrives while A holds everything: recorded, granted nothing yet.
        let b = take(&s, 10_000, &mut state, request(2, 0, 1, 300));
        assert_eq!((b.burst, b.parts), (0, 0));
        // A renews: its target is 1/4, but its old grant stays reserved until 100 ms.
        let a2 = take(&s, 50_000, &mut state, request(1, a.id, 2, 100));
        assert!(a2.continued);
        assert_eq!((a2.burst, a2.parts), (25, 250));
        assert_eq!(state.reserved(50_000), (100, 1_000));
        // B renews after A's old grant ended: it gets the other 3/4.
        let b2 = take(&s, 100_000, &mut state, request(2, b.id, 2, 300));
        assert!(b2.continued);
        assert_eq!((b2.burst, b2.parts), (75, 750));
        // A stale request of A (older seq) changes nothing.
        let before = state.clone();
        let t = Timestamp::from_micros(100_000);
        assert_eq!(s.take(t, &mut state, request(1, 0, 2, 9)), Ok(Taken::Stale));
        assert_eq!(state, before);
        // A return of another chain, or after the share's validity, is ignored.
        let t = Timestamp::from_micros(120_000);
        assert!(!s.give_back(t, &mut state, back(1, a.id + 1, 3, 5)).unwrap());
        let t = Timestamp::from_micros(160_000);
        assert!(!s.give_back(t, &mut state, back(1, a.id, 3, 5)).unwrap());
    }

    /// A's shrink reaches the store but not A, twice: A still spends its first grant, so
    /// that grant stays reserved until it ends, and B cannot take its rate meanwhile. Once
    /// A renews naming the latest grant, only that one is held.
    #[test]
    fn a_grant_the_node_never_saw_does_not_release_the_one_it_spends() {
        let s = shares(10, 10_000, 1_000);
        let mut state = RateState::default();
        let a1 = take(&s, 0, &mut state, request(1, 0, 1, 100));
        assert_eq!((a1.burst, a1.parts), (10, 1_000));
        take(&s, 1_000, &mut state, request(2, 0, 1, 100));
        // Two renewals of A whose replies are lost: A still spends a1 (seq 1).
        let applied_1 = |seq| TakeRequest {
            applied: 1,
            ..request(1, a1.id, seq, 100)
        };
        take(&s, 2_000, &mut state, applied_1(2));
        take(&s, 3_000, &mut state, applied_1(3));
        let a = state.shares.iter().find(|x| x.node == 1).copied().unwrap();
        assert_eq!(a.reserved(3_000), (10, 1_000));
        assert_eq!(a.reserved(99_999), (10, 1_000));
        // A hears back and renews naming its latest grant (seq 4): only that is held.
        let a4 = take(&s, 4_000, &mut state, applied_1(4));
        let named = TakeRequest {
            applied: 4,
            ..request(1, a1.id, 5, 100)
        };
        take(&s, 5_000, &mut state, named);
        let a = state.shares.iter().find(|x| x.node == 1).copied().unwrap();
        assert_eq!(a.reserved(5_000), (a4.burst, a4.parts));
    }

    /// The saved failure of the node-level proptest, on a number line. A's renewal shrinks
    /// its share but the reply is lost; A's first grant ends (locally, then in the store,
    /// which gives its burst to the direct share, spent there); A renews again, naming the
    /// first grant, and the store continues the chain (its latest grant is still valid).
    /// A's sub-bucket held 5 tokens when the first grant ended: they are gone, not kept by
    /// the continued grant, so every admission still conforms to the bucket.
    #[test]
    fn a_continued_grant_applied_after_the_local_end_does_not_revive_the_old_tokens() {
        let bucket = TokenBucket::new(5, 1_000, Micros::from_secs(1)).unwrap(); // 1 per ms
        let s = RateShares::new(&bucket).unwrap();
        let ms = |ms: u64| Timestamp::from_micros(1_000_000 + ms * 1_000);
        let mut state = RateState::default();
        let mut admitted = Vec::new();
        let with = |seq, held, applied, demand, validity_ms| TakeRequest {
            applied,
            validity: Micros::from_millis(validity_ms),
            ..request(1, held, seq, demand)
        };
        let g1 = match s.take(ms(0), &mut state, with(1, 0, 0, 100, 10)).unwrap() {
            Taken::Granted(g) => g,
            other => panic!("{other:?}"),
        };
        let mut a = ShareBucket::default();
        a.apply(ms(0), &s, &g1, ms(10), 0);
        // B asks (nothing left yet); A renews at 1 ms, shrinking to 1 token: reply lost.
        take(&s, 1_000_000, &mut state, request(2, 0, 1, 900));
        let g2 = match s
            .take(ms(1), &mut state, with(2, g1.id, 1, 100, 30))
            .unwrap()
        {
            Taken::Granted(g) => g,
            other => panic!("{other:?}"),
        };
        assert_eq!((g2.burst, g2.continued), (1, true));
        // A's first grant ends at 10 ms holding 5 tokens; the direct share then refills
        // (4 tokens, B's share has none) and spends them.
        a.refill(ms(9));
        assert_eq!(a.tokens(&s), 5);
        for cost in [4, 1] {
            if s.direct(ms(15), &mut state, cost).unwrap().is_allowed() {
                admitted.push((ms(15), cost));
            }
        }
        // A renews naming its first grant: continued (the latest grant is valid until
        // 31 ms), applied at once.
        let g3 = match s
            .take(ms(15), &mut state, with(3, g1.id, 1, 1_000, 30))
            .unwrap()
        {
            Taken::Granted(g) => g,
            other => panic!("{other:?}"),
        };
        assert!(g3.continued);
        a.apply(ms(15), &s, &g3, ms(45), 0);
        assert_eq!(a.units(), g3.moved);
        while a.try_take(ms(15), &s, 1) {
            admitted.push((ms(15), 1));
        }
        let mut oracle = crate::token_bucket::TokenBucketState::default();
        for (t, cost) in admitted {
            assert!(bucket.acquire(t, &mut oracle, cost).unwrap().is_allowed());
        }
    }

    #[test]
    fn bad_requests_are_typed_errors() {
        let s = shares(10, 1, 1_000);
        let mut state = RateState::default();
        let t = Timestamp::from_micros(5);
        let ok = request(1, 0, 1, 1);
        for (request, error) in [
            (TakeRequest { node: 0, ..ok }, ShareError::Node(0)),
            (
                TakeRequest {
                    demand: MAX_DEMAND + 1,
                    ..ok
                },
                ShareError::Demand(MAX_DEMAND + 1),
            ),
            (
                TakeRequest {
                    validity: Micros::ZERO,
                    ..ok
                },
                ShareError::Validity(0),
            ),
        ] {
            assert_eq!(s.take(t, &mut state, request), Err(error));
        }
        assert_eq!(
            s.direct(t, &mut state, 11),
            Err(ShareError::InsufficientCapacity(OverCapacity {
                cost: 11,
                capacity: 10
            }))
        );
        assert_eq!(state, RateState::default());
    }

    #[test]
    fn buckets_whose_share_units_would_not_be_exact_are_refused() {
        let deep = TokenBucket::new(1 << 43, 1, Micros::from_micros(1)).unwrap();
        let fine = TokenBucket::new(1, (1 << 50) + 1, Micros::from_micros(1 << 20)).unwrap();
        for bucket in [deep, fine] {
            assert!(matches!(
                RateShares::new(&bucket),
                Err(ConfigError::TooLarge { .. })
            ));
        }
    }

    #[test]
    fn a_sub_bucket_refills_at_its_share_slowed_by_the_margin_and_only_while_valid() {
        let s = shares(10, 1_000, 1_000); // 1 token per ms
        let grant = Grant {
            id: 1,
            continued: false,
            burst: 10,
            parts: 500,
            moved: 0,
        };
        let mut b = ShareBucket::default();
        let t = |ms: u64| Timestamp::from_micros(ms * 1_000);
        b.apply(t(0), &s, &grant, t(100), 0);
        // Half the rate: one token every 2 ms.
        assert!(!b.try_take(t(1), &s, 1));
        assert!(b.try_take(t(2), &s, 1));
        // With a 1 ‰ margin, 2 ms is not quite enough.
        let mut slow = ShareBucket::default();
        slow.apply(t(0), &s, &grant, t(100), 1);
        assert!(!slow.try_take(t(2), &s, 1));
        assert!(slow.try_take(Timestamp::from_micros(2_003), &s, 1));
        // Continued at 2 ms (nothing held), usable before 6 ms: a token by 4 ms.
        let continued = Grant {
            continued: true,
            ..grant
        };
        b.apply(t(2), &s, &continued, t(6), 0);
        b.refill(t(4));
        assert_eq!(b.tokens(&s), 1);
        // A clock going back refills nothing.
        b.refill(t(3));
        assert_eq!(b.tokens(&s), 1);
        // Past validity nothing is spent, and nothing is held: a continued grant applied
        // later starts from its moved units alone (the store stopped reserving the old
        // tokens when that grant ended).
        assert!(!b.try_take(t(50), &s, 1));
        assert_eq!(b.tokens(&s), 0);
        b.apply(t(50), &s, &continued, t(100), 0);
        assert_eq!(b.tokens(&s), 0);
        assert!(!b.try_take(t(50), &s, 1));
    }
}
