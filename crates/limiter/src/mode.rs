//! Whether a [`ResilientLimiter`] decides hot keys from leases: [`Direct`] (the default,
//! every request through the gate and the store) or [`Leased`] (turned on by
//! [`ResilientLimiterBuilder::leases`]), or either, chosen at run time ([`MaybeLeased`], for
//! a program that reads the choice from a file or a flag and holds one limiter type). One
//! call shape in every mode: `acquire(key, cost)` returns a [`Decided`] whose [`Source`]
//! says who answered.
//!
//! Where a leased request is decided: the leases' `decide_with` (lease/driver.rs) answers
//! it from a held block or a recent denial, or sends it to the store; sent to the store, it
//! goes through the gate (deadline, breaker, caches, failure policy) as without leases, by
//! the lease driver's own direct decision (a token bucket leased as rate against its direct
//! share), so that its answer carries the gate's source. Reservations, returns and rate
//! shares go through the gate too, as the resilient limiter's [`Leasable`] operations
//! (docs/leases.md, "Failures"); a reservation is not counted as a decision.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rein_core::limiter::{DEADLINE_MARGIN, DEFAULT_DEADLINE};
use rein_core::{DecideError, Leasable, Limiter};

use crate::gate::Ask;
use crate::lease::{
    LeaseConfig, LeaseConfigError, LeaseStats, LeasedLimiter, LeasedPolicy, ShareView,
    decide_direct,
};
use crate::limiter::{Call, ResilientLimiter, ResilientLimiterBuilder, TablePolicy};
use crate::{Decided, RequestError, ResilienceConfigError, Source};

/// How a [`ResilientLimiter`] decides: [`Direct`], [`Leased`], or either chosen at run time
/// ([`MaybeLeased`]). Sealed: these are the only modes.
pub trait Mode<S: Limiter>: sealed::Sealed + Send + Sync + 'static {
    /// Decides `call` in `limiter`, which holds this mode: an acquire or a peek (`ask`).
    #[doc(hidden)]
    fn decide(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
        ask: Ask,
    ) -> impl Future<Output = Result<Decided, RequestError>> + Send
    where
        Self: Sized;

    /// Gives back `call`'s units in `limiter`, which holds this mode.
    #[doc(hidden)]
    fn refund(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
    ) -> impl Future<Output = Result<(), DecideError>> + Send
    where
        Self: Sized;

    /// Whether requests are decided from leases first (and may take [`LEASED_CALLS`]
    /// store calls).
    #[doc(hidden)]
    fn leases(&self) -> bool;
}

/// How many store calls' deadlines a request with leases on may take: a wait for its
/// key's reservation, then a direct call. A leased limiter's deadline is this many times
/// its store call's.
pub const LEASED_CALLS: u32 = 2;

/// The deadline a [`ResilientLimiter`] states ([`Limiter::deadline`]) over a store whose own
/// is `store`: each store call is bounded by the store's deadline
/// ([`DEFAULT_DEADLINE`] for a store that states none) plus [`DEADLINE_MARGIN`], and with
/// `leases` on a request may take [`LEASED_CALLS`] of them. The one statement of the
/// formula: the limiter bounds its store calls with it, and a layer above (rein-tower's
/// config check) sizes its own deadline against it.
pub fn resilient_deadline(store: Option<Duration>, leases: bool) -> Duration {
    let call = store
        .unwrap_or(DEFAULT_DEADLINE)
        .saturating_add(DEADLINE_MARGIN);
    if leases {
        call.saturating_mul(LEASED_CALLS)
    } else {
        call
    }
}

impl LeaseConfig {
    /// [`check`](Self::check) for leases in front of a [`ResilientLimiter`] over a store
    /// whose deadline is `store`: what [`LeasedBuilder::build`] refuses, for a front end
    /// that reads the settings itself and names its own field (rein-tower's file,
    /// rein-server's flags) before anything connects.
    pub fn check_over_store(&self, store: Option<Duration>) -> Result<(), LeaseConfigError> {
        self.check(Some(resilient_deadline(store, false)))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Direct {}
    impl<S: rein_core::Leasable> Sealed for super::Leased<S> {}
    impl<S: rein_core::Leasable> Sealed for super::MaybeLeased<S> {}
}

/// Every request through the gate and the store: the default mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Direct;

/// Hot keys decided from leases first (docs/leases.md): a [`ResilientLimiter`] built with
/// [`ResilientLimiterBuilder::leases`]. Its leases' counters, settings and shares are read
/// from the limiter ([`lease_stats`](ResilientLimiter::lease_stats)); call
/// [`shutdown`](ResilientLimiter::shutdown) before exiting to give back what it holds.
pub struct Leased<S: Leasable> {
    leases: LeasedLimiter<ResilientLimiter<S>>,
    /// The table's policies prepared for the leases, in the table's order.
    policies: Arc<[LeasedPolicy<TablePolicy>]>,
}

/// Leases on or off, as a value: the mode of a [`ResilientLimiter`] made from a limiter of
/// either mode (`From`), for a program that reads the choice from a file or a flag and
/// holds one limiter type either way (rein-tower's `[leases]`, rein-server's `--leases`).
/// It decides exactly as the limiter it was made from.
/// ```
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rein::lease::MaybeLeased;
/// use rein::memory::MemoryStore;
/// use rein::{FailurePolicy, LeaseConfig, Limit, Micros, NamedPolicy, Policy, PolicyTable, ResilientLimiter};
///
/// let leases: Option<LeaseConfig> = None; // read from a file, say
/// let api = NamedPolicy::new("api", Policy::single(Limit::fixed_window(100, Micros::from_secs(1))?))?;
/// let builder = ResilientLimiter::builder(MemoryStore::new(), PolicyTable::new(api), FailurePolicy::FailClosed);
/// let limiter: ResilientLimiter<MemoryStore, MaybeLeased<MemoryStore>> = match leases {
///     Some(config) => builder.leases(config).build()?.into(),
///     None => builder.build()?.into(),
/// };
/// assert!(limiter.acquire("user-42", 1).await?.is_allowed());
/// assert_eq!(limiter.lease_stats(), None);
/// # Ok(()) }
/// ```
pub enum MaybeLeased<S: Leasable> {
    /// Leases off: as [`Direct`].
    Direct,
    /// Leases on: as [`Leased`].
    Leased(Leased<S>),
}

impl<S: Limiter> Mode<S> for Direct {
    /// The gate's decision itself, with no future around it.
    fn decide(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
        ask: Ask,
    ) -> impl Future<Output = Result<Decided, RequestError>> + Send {
        limiter.decide_plain(call, ask)
    }

    fn refund(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        limiter.inner.refund(call)
    }

    fn leases(&self) -> bool {
        false
    }
}

impl<S: Leasable + 'static> Mode<S> for Leased<S> {
    fn decide(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
        ask: Ask,
    ) -> impl Future<Output = Result<Decided, RequestError>> + Send {
        limiter.mode.decide_in(limiter, call, ask)
    }

    fn refund(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        limiter.mode.refund_in(limiter, call)
    }

    fn leases(&self) -> bool {
        true
    }
}

impl<S: Leasable + 'static> Mode<S> for MaybeLeased<S> {
    async fn decide(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
        ask: Ask,
    ) -> Result<Decided, RequestError> {
        match &limiter.mode {
            MaybeLeased::Direct => limiter.decide_plain(call, ask).await,
            MaybeLeased::Leased(leased) => leased.decide_in(limiter, call, ask).await,
        }
    }

    async fn refund(
        limiter: &ResilientLimiter<S, Self>,
        call: Call<'_>,
    ) -> Result<(), DecideError> {
        match &limiter.mode {
            MaybeLeased::Direct => limiter.inner.refund(call).await,
            MaybeLeased::Leased(leased) => leased.refund_in(limiter, call).await,
        }
    }

    fn leases(&self) -> bool {
        matches!(self, MaybeLeased::Leased(_))
    }
}

impl<S: Leasable + 'static> Leased<S> {
    /// A request decided with leases, in a limiter of mode `M` ([`Leased`] itself, or
    /// [`MaybeLeased`] with leases on).
    async fn decide_in<M: Mode<S>>(
        &self,
        limiter: &ResilientLimiter<S, M>,
        call: Call<'_>,
        ask: Ask,
    ) -> Result<Decided, RequestError> {
        let inner = &*limiter.inner;
        // Checked (and an error counted) once, before the leases or the gate see it.
        let capacity = inner.check(call)?;
        let policy = &self.policies[call.index];
        // The gate's decision (deadline, breaker, caches, failure policy) by the leases' own
        // direct decision: for a token bucket leased as rate, against its direct share.
        let direct = |ask: Ask| async move {
            let peek = ask == Ask::Peek;
            limiter
                .decide_checked(
                    call,
                    capacity,
                    ask,
                    |store, prepared, store_now| async move {
                        let (key, cost) = (call.key, call.units);
                        let decision =
                            decide_direct(store, prepared, policy, store_now, key, cost, peek)
                                .await?;
                        Ok((decision, None))
                    },
                )
                .await
                .map(|(decided, _)| decided)
        };
        // A peek is the store's answer: units held by leases are not the store's to report.
        if ask == Ask::Peek {
            return direct(Ask::Peek)
                .await
                .map(|decided| inner.shadowed(call.index, decided));
        }
        let decided = self
            .leases
            .decide_with(call.now, policy, call.key, call.units, |after| async move {
                let decided = direct(Ask::Acquire).await;
                // The rate book's actions go out once the store decided.
                drop(after);
                decided
            })
            .await?;
        if matches!(decided.source, Source::Lease | Source::LocalDenial) {
            inner.gate.count_leased(&decided);
        }
        Ok(inner.shadowed(call.index, decided))
    }

    /// A refund with leases on, in a limiter of mode `M`.
    async fn refund_in<M: Mode<S>>(
        &self,
        limiter: &ResilientLimiter<S, M>,
        call: Call<'_>,
    ) -> Result<(), DecideError> {
        let policy = &self.policies[call.index];
        policy.refundable()?;
        // The leases' local denial is forgotten as the gate's caches are.
        let refund = async { limiter.inner.refund(call).await };
        self.leases.refunding(policy, call.key, refund).await
    }
}

impl<S: Leasable + 'static> ResilientLimiter<S, Leased<S>> {
    /// Gives back every unit the leases hold (awaiting the returns), stops their timers,
    /// and sends every later request through the gate and the store. Call it before
    /// exiting: what is not given back stays counted until its window ends.
    pub async fn shutdown(&self) {
        self.mode.leases.shutdown().await;
    }

    /// The leases' counters (reservations, returns, units stranded). Their decisions are
    /// also in [`stats`](Self::stats), as [`Source::Lease`](crate::Source::Lease) and
    /// [`Source::LocalDenial`](crate::Source::LocalDenial).
    pub fn lease_stats(&self) -> LeaseStats {
        self.mode.leases.stats()
    }

    /// This node's rate share of every token-bucket key it leases, now.
    pub fn rate_shares(&self) -> Vec<ShareView> {
        self.mode.leases.rate_shares()
    }

    /// The lease settings.
    pub fn lease_config(&self) -> LeaseConfig {
        self.mode.leases.config()
    }
}

/// With leases on or off, as chosen.
impl<S: Leasable + 'static> ResilientLimiter<S, MaybeLeased<S>> {
    /// With leases on, gives back every unit they hold, as
    /// [`ResilientLimiter::shutdown`](ResilientLimiter#method.shutdown) does; with leases
    /// off, nothing to give back.
    pub async fn shutdown(&self) {
        if let MaybeLeased::Leased(leased) = &self.mode {
            leased.leases.shutdown().await;
        }
    }

    /// Whether leases are on.
    pub fn is_leased(&self) -> bool {
        matches!(self.mode, MaybeLeased::Leased(_))
    }

    /// The leases' counters, or `None` with leases off.
    pub fn lease_stats(&self) -> Option<LeaseStats> {
        match &self.mode {
            MaybeLeased::Direct => None,
            MaybeLeased::Leased(leased) => Some(leased.leases.stats()),
        }
    }
}

impl<S: Leasable> From<ResilientLimiter<S>> for ResilientLimiter<S, MaybeLeased<S>> {
    fn from(limiter: ResilientLimiter<S>) -> Self {
        ResilientLimiter {
            inner: limiter.inner,
            mode: MaybeLeased::Direct,
        }
    }
}

impl<S: Leasable> From<ResilientLimiter<S, Leased<S>>> for ResilientLimiter<S, MaybeLeased<S>> {
    fn from(limiter: ResilientLimiter<S, Leased<S>>) -> Self {
        ResilientLimiter {
            inner: limiter.inner,
            mode: MaybeLeased::Leased(limiter.mode),
        }
    }
}

/// Settings for a [`ResilientLimiter`] with leases on, from
/// [`ResilientLimiterBuilder::leases`].
pub struct LeasedBuilder<S> {
    resilient: ResilientLimiterBuilder<S>,
    config: LeaseConfig,
    node: Option<u64>,
}

impl<S: Leasable + 'static> ResilientLimiterBuilder<S> {
    /// Turns leases on (docs/leases.md): hot keys are decided from blocks of the limit
    /// reserved in the store, at memory speed and with zero over-admission while the store
    /// answers; the rest as without. The limiter's clock and time source are the leases'
    /// too; their timers run on a task of their own. Set the resilient settings first: this
    /// returns the leases' builder.
    ///
    /// Only a store that leases ([`Leasable`]) has this option: one that only decides
    /// cannot be leased over, by compile error.
    /// ```compile_fail,E0599
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use rein::{FailurePolicy, LeaseConfig, Limit, Micros, NamedPolicy, Policy, PolicyTable, ResilientLimiter};
    /// // The optimistic store decides, and does not lease.
    /// let store = rein::redis::OptimisticStore::connect("redis://127.0.0.1:6379/").await?;
    /// let api = NamedPolicy::new("api", Policy::single(Limit::fixed_window(100, Micros::from_secs(1))?))?;
    /// let limiter = ResilientLimiter::builder(store, PolicyTable::new(api), FailurePolicy::FailClosed)
    ///     .leases(LeaseConfig::default())
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn leases(self, config: LeaseConfig) -> LeasedBuilder<S> {
        LeasedBuilder {
            resilient: self,
            config,
            node: None,
        }
    }
}

impl<S: Leasable + 'static> LeasedBuilder<S> {
    /// This node's id in the store's rate shares of token buckets (see
    /// [`LeasedLimiterBuilder::node_id`](crate::lease::LeasedLimiterBuilder::node_id);
    /// default: drawn from the process id and the start time).
    pub fn node_id(mut self, node: u64) -> Self {
        self.node = Some(node);
        self
    }

    /// The limiter, its leases' timers started (inside a tokio runtime; otherwise at the
    /// first request). Errors as [`ResilientLimiterBuilder::build`], and
    /// [`ResilienceConfigError::Leases`] for lease settings
    /// ([`LeaseConfig::check`](crate::lease::LeaseConfig::check)) that cannot run over this
    /// limiter's deadline, or a [`node_id`](Self::node_id) outside 1 to 2^52 − 1.
    pub fn build(self) -> Result<ResilientLimiter<S, Leased<S>>, ResilienceConfigError> {
        let direct = self.resilient.build()?;
        let mut leases = LeasedLimiter::builder(direct.clone())
            .config(self.config)
            .clock(Arc::clone(&direct.inner.clock))
            .time_source(direct.inner.time_source);
        if let Some(node) = self.node {
            leases = leases.node_id(node);
        }
        let leases = leases.build()?;
        let policies = direct
            .inner
            .table
            .policies()
            .iter()
            .map(|named| leases.prepare(named))
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(ResilientLimiter {
            inner: direct.inner,
            mode: Leased { leases, policies },
        })
    }
}

impl<S: Leasable> Clone for Leased<S> {
    fn clone(&self) -> Self {
        Self {
            leases: self.leases.clone(),
            policies: Arc::clone(&self.policies),
        }
    }
}

impl<S: Leasable> Clone for MaybeLeased<S> {
    fn clone(&self) -> Self {
        match self {
            MaybeLeased::Direct => MaybeLeased::Direct,
            MaybeLeased::Leased(leased) => MaybeLeased::Leased(leased.clone()),
        }
    }
}

impl<S: Leasable> fmt::Debug for MaybeLeased<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaybeLeased::Direct => f.write_str("MaybeLeased::Direct"),
            MaybeLeased::Leased(leased) => {
                f.debug_tuple("MaybeLeased::Leased").field(leased).finish()
            }
        }
    }
}

impl<S: Leasable> fmt::Debug for Leased<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leased")
            .field("policies", &self.policies.len())
            .finish_non_exhaustive()
    }
}

impl<S> fmt::Debug for LeasedBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedBuilder")
            .field("config", &self.config)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}
