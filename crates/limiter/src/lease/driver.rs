//! [`LeasedLimiter`]: the thin async driver of a [`LeaseBook`] over any store that
//! implements [`Leasable`] (besides [`Limiter`]).
//!
//! It reads the clock, asks the book, and carries out the book's actions with the store's
//! [`Leasable`] operations (`acquire_held` reserves, `refund_held` returns, `share_rate`
//! runs a token bucket's rate shares), each in a task of its own so that no request waits
//! for a return or a renewal. Requests that find their
//! key's reservation in flight wait for it on a [`Notify`] (single flight); everything
//! else is answered under one short lock with no await.
//!
//! # Composition with the resilient limiter
//! Wrap leases around resilience: `LeasedLimiter<ResilientLimiter<S>>`. Held blocks are
//! then spent without asking anyone while the store is down, until their validity ends;
//! reservations and direct requests go through the resilient limiter, whose failure
//! policy answers requests when the store cannot. It never answers a reservation: only
//! the store grants a block, so a reservation the store gave no answer to fails, and
//! requests go direct for an interval and get the failure policy's per-request answer. The reverse order would let the breaker or a
//! cache answer before the held blocks are consulted. docs/leases.md, "Failures".

use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

use rein_core::{
    DecideError, Decision, KeyError, Leasable, Limiter, Micros, NamedPolicy, OverCapacity,
    PrepareError, StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp, RateShares, ReturnRequest, TakeRequest, check_node},
    time::MAX_MICROS,
};
use rein_memory::Clock;
use tokio::sync::Notify;

use super::book::{
    Action, Admit, Attempt, LeaseBook, LeaseConfig, LeaseConfigError, LeaseKey, LeaseKeyRef,
    Reserved,
};
use super::rate::{RateAction, RateBook, ShareView, TakeReply};
use super::terms::{LeaseTerms, Unleasable};
use super::{Book, LeaseStats};
use crate::owner::Owner;
use crate::{Decided, Source, TimeSource, TokioClock};

/// Leases over a store: hot keys decided locally from blocks reserved in the store, exactly
/// (docs/leases.md), everything else decided by the store.
///
/// Cheap to clone (one `Arc`). Needs a tokio runtime: reservations, returns and the timers
/// run in spawned tasks. The timers (unused units returned before their window ends, rate
/// shares renewed and given back, idle keys released) run on a task the limiter starts
/// itself, in `build` inside a runtime or at the first request, and stop at
/// [`shutdown`](Self::shutdown) or when the last handle is dropped. Call `shutdown` before
/// dropping it to give back what it holds.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use rein::core::{Limit, Limiter, Micros, NamedPolicy, Policy};
/// use rein::memory::MemoryStore;
/// use rein::{LeaseConfig, Source, lease::LeasedLimiter};
///
/// let store = MemoryStore::new();
/// // Its timers start with it: nothing to spawn.
/// let leased = LeasedLimiter::builder(store).config(LeaseConfig::default()).build()?;
/// let per_second = Limit::fixed_window(1_000, Micros::from_secs(1))?;
/// let policy = leased.prepare(&NamedPolicy::new("api", Policy::single(per_second))?)?;
/// let decided = leased.acquire_leased(None, &policy, b"user-1", 1).await?;
/// println!("{:?} from {:?}", decided.decision.outcome, decided.source);
/// leased.shutdown().await;
/// # Ok(()) }
/// ```
///
/// The store must implement [`Leasable`]: one that only decides ([`Limiter`] alone) cannot
/// be leased over, by compile error, rather than be leased in part.
/// ```compile_fail,E0277
/// use std::future::{Future, ready};
/// use std::time::Duration;
/// use rein::core::{DecideError, Decision, Limiter, NamedPolicy, PrepareError, Timestamp};
///
/// /// A [`Limiter`], and not [`Leasable`](rein_core::Leasable).
/// struct DecidesOnly;
///
/// impl Limiter for DecidesOnly {
///     type Prepared = ();
///     fn prepare(&self, _: &NamedPolicy) -> Result<(), PrepareError> {
///         Ok(())
///     }
///     fn acquire(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<Decision, DecideError>> + Send {
///         ready(Err(DecideError::Unsupported { operation: "acquire" }))
///     }
///     fn peek(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<Decision, DecideError>> + Send {
///         ready(Err(DecideError::Unsupported { operation: "peek" }))
///     }
///     fn refund(&self, _: Option<Timestamp>, _: &(), _: &[u8], _: u64)
///         -> impl Future<Output = Result<(), DecideError>> + Send {
///         ready(Ok(()))
///     }
///     fn deadline(&self) -> Option<Duration> {
///         None
///     }
/// }
///
/// // error[E0277]: the trait bound `DecidesOnly: Leasable` is not satisfied
/// let leased = rein::lease::LeasedLimiter::builder(DecidesOnly).build();
/// ```
pub struct LeasedLimiter<S: Leasable> {
    shared: Arc<Shared<S>>,
}

/// Builds a [`LeasedLimiter`].
pub struct LeasedLimiterBuilder<S> {
    store: S,
    config: LeaseConfig,
    node: Option<u64>,
    clock: Option<Box<dyn Clock + Send + Sync>>,
    time_source: TimeSource,
    manual_timers: bool,
}

/// A policy prepared by a [`LeasedLimiter`]: the store's form, and whether it is leased.
pub struct LeasedPolicy<P> {
    /// The limiter that prepared it, whose slot `slot` is.
    owner: Owner,
    slot: u32,
    inner: Arc<P>,
    capacity: u64,
    terms: Result<LeaseTerms, Unleasable>,
    /// For a policy of one token bucket: leased as rate (`rate.rs`).
    rate: Option<RateShares>,
    /// Set once the store answered that it has no rate shares: the bucket is then decided
    /// with plain `acquire`, and no more takes are sent.
    no_rate: AtomicBool,
}

struct Shared<S: Leasable> {
    /// This limiter's identity, in each [`LeasedPolicy`] it prepares.
    owner: Owner,
    store: S,
    clock: Box<dyn Clock + Send + Sync>,
    time_source: TimeSource,
    /// A std mutex: every use is a few map operations with no await.
    book: Mutex<LeaseBook>,
    /// The rate leases of token buckets, under their own short lock.
    rates: Mutex<RateBook>,
    /// Prepared policies by slot, with their names, for reservations and returns made away
    /// from a request.
    policies: RwLock<Vec<(NamedPolicy, Arc<S::Prepared>)>>,
    /// Waiters for reservations, sharded by key hash.
    wakers: Box<[Notify]>,
    /// Wakes a shutdown waiting for the reservations in flight, as each one ends.
    settled: Notify,
    /// Reservations ended after a shutdown whose grants are being given back. Raised under
    /// the book's lock as the book counts the reservation ended, and read under it, so a
    /// shutdown reading both misses none.
    settling: AtomicU64,
    /// Wakes the timer loop when a deadline earlier than its sleep appears, or when the
    /// limiter is dropped (shared with the spawned loop, which holds only a weak reference).
    timers: Arc<Notify>,
    /// Whether the timers run on their own task (the default), spawned once.
    auto_timers: bool,
    timers_started: AtomicBool,
    /// How long a request may wait for its key's reservations, all together, before it is
    /// decided a last time ([`Attempt::Last`]): one store call's deadline, so that with
    /// the direct call after it a request takes at most
    /// [`LEASED_CALLS`](crate::lease::LEASED_CALLS) calls' time.
    wait_budget: Duration,
    direct_unleasable: AtomicU64,
    returns_failed: AtomicU64,
}

impl<S: Leasable + 'static> LeasedLimiter<S> {
    /// A builder over `store`, with [`LeaseConfig::default`], a [`TokioClock`] and the
    /// store deciding on its own clock ([`TimeSource::Store`]).
    pub fn builder(store: S) -> LeasedLimiterBuilder<S> {
        LeasedLimiterBuilder {
            store,
            config: LeaseConfig::default(),
            node: None,
            clock: None,
            time_source: TimeSource::Store,
            manual_timers: false,
        }
    }

    /// Decides `cost` of `key` under `policy`: from a held block when possible, otherwise
    /// through the store. `now` is the instant to decide at (`None`: the limiter's clock);
    /// store calls get it only if given, or under [`TimeSource::LocalClock`].
    ///
    /// The answer says where it came from: [`Source::Lease`], [`Source::LocalDenial`], or
    /// [`Source::Store`] for the store below (for a store that is a `ResilientLimiter`, turn
    /// leases on in its builder instead, [`leases`](crate::ResilientLimiterBuilder::leases):
    /// there a direct answer carries the resilient limiter's own source, a fallback's too).
    ///
    /// `now`, when given, must advance with real time like the store's clock: a block's
    /// life is measured from it (docs/leases.md). At most two store calls' time: waits for
    /// its key's reservations, all within one store call's deadline
    /// ([`LeaseConfig::flight_timeout`] for a store that states none), then, if no block
    /// served it, a direct call.
    pub fn acquire_leased<'a>(
        &'a self,
        now: Option<Timestamp>,
        policy: &'a LeasedPolicy<S::Prepared>,
        key: &'a [u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decided, DecideError>> + Send + 'a {
        let valid = self
            .owns(policy)
            .and_then(|()| policy.admissible(key, cost));
        async move {
            valid?;
            self.decide_with(now, policy, key, cost, move |after| async move {
                let store_now = now.or_else(|| self.shared.store_time(self.shared.clock.now()));
                let store = &self.shared.store;
                let decision =
                    decide_direct(store, &policy.inner, policy, store_now, key, cost, false).await;
                // The rate book's actions go out once the store decided.
                drop(after);
                Ok(Decided {
                    decision: decision?,
                    source: Source::Store,
                })
            })
            .await
        }
    }

    /// `Ok` if this limiter prepared `policy`: its slot names this limiter's book.
    fn owns(&self, policy: &LeasedPolicy<S::Prepared>) -> Result<(), DecideError> {
        if policy.owner == self.shared.owner {
            Ok(())
        } else {
            Err(DecideError::ForeignPolicy)
        }
    }

    /// Decides a request the caller checked can be admitted (`0 < cost ≤` the policy's
    /// capacity, a key not empty) here, from a held block or a recent denial
    /// ([`Source::Lease`], [`Source::LocalDenial`]), or by `direct`, given the rate book's
    /// actions to drop once the store decided. The one place both
    /// [`acquire_leased`](Self::acquire_leased) and the resilient limiter with leases on
    /// decide; a lease hit never waits on anything but the runtime's budget.
    pub(crate) async fn decide_with<'a, E, F, Fut>(
        &'a self,
        now: Option<Timestamp>,
        policy: &'a LeasedPolicy<S::Prepared>,
        key: &'a [u8],
        cost: u64,
        direct: F,
    ) -> Result<Decided, E>
    where
        F: FnOnce(Deferred<'a, S>) -> Fut,
        Fut: Future<Output = Result<Decided, E>>,
    {
        self.shared.start_timers();
        // Lease hits complete without waiting: count each against the task's cooperative
        // budget so a spinning caller cannot starve the runtime (limiter.rs does the same).
        tokio::task::coop::consume_budget().await;
        let shared = &self.shared;
        let store = |actions| Deferred { shared, actions };
        if let Some(shares) = policy.rate_shares() {
            if cost == 0 {
                return direct(store(None)).await;
            }
            let at = LeaseKeyRef {
                slot: policy.slot,
                key,
            };
            let t = now.unwrap_or_else(|| shared.clock.now());
            let (admit, actions) =
                shared.with_rates(|rates| rates.handle_request(t, at, cost, shares));
            // A direct request is decided before the take it triggered goes out: a take that
            // ran first could move the direct share's tokens into this node's share and deny
            // a request the bucket had room for. Sent even if the request's future is
            // dropped. The rate book never waits: without a share, the direct share decides.
            return match admit {
                Admit::Leased(decision) => {
                    shared.dispatch(actions);
                    Ok(here(decision, Source::Lease))
                }
                Admit::Denied(decision) => {
                    shared.dispatch(actions);
                    Ok(here(decision, Source::LocalDenial))
                }
                Admit::Direct(_) | Admit::Wait => direct(store(Some(actions))).await,
            };
        }
        let terms = match (&policy.terms, cost) {
            (Err(_), _) => {
                shared.direct_unleasable.fetch_add(1, Ordering::Relaxed);
                return direct(store(None)).await;
            }
            (Ok(_), 0) => return direct(store(None)).await,
            (Ok(terms), _) => terms,
        };
        let at = LeaseKeyRef {
            slot: policy.slot,
            key,
        };
        let waker = shared.waker(key);
        let mut attempt = Attempt::First;
        let mut give_up = None;
        loop {
            // Registered before asking the book, so a reply between the two is not missed.
            let mut woken = pin!(waker.notified());
            woken.as_mut().enable();
            let t = now.unwrap_or_else(|| shared.clock.now());
            let (admit, actions) =
                shared.with_book(|book| book.request(t, at, cost, terms, attempt));
            shared.dispatch(actions);
            match admit {
                Admit::Leased(decision) => return Ok(here(decision, Source::Lease)),
                Admit::Denied(decision) => return Ok(here(decision, Source::LocalDenial)),
                // Also a request whose time to wait is spent (`DirectReason::Waited`).
                Admit::Direct(_) => return direct(store(None)).await,
                // Waits, all together, within one store call's deadline from the first;
                // then the book is asked a last time, and never answers `Wait` to that.
                Admit::Wait => {
                    let give_up = *give_up
                        .get_or_insert_with(|| tokio::time::Instant::now() + shared.wait_budget);
                    let _ = tokio::time::timeout_at(give_up, woken).await;
                    attempt = if tokio::time::Instant::now() < give_up {
                        Attempt::Again
                    } else {
                        Attempt::Last
                    };
                }
            }
        }
    }

    /// Runs `refund` of `key` under `policy`, lifting the local denial the book holds for
    /// the key ([`LeaseBook::forget_denial`]) before it and again once it ran (a reservation
    /// denied while it ran may have been decided before it), as the deny cache forgets its
    /// own: before, the denial hid the refunded units until it ended.
    pub(crate) async fn refunding<T>(
        &self,
        policy: &LeasedPolicy<S::Prepared>,
        key: &[u8],
        refund: impl Future<Output = T>,
    ) -> T {
        let forget = || {
            let at = LeaseKeyRef {
                slot: policy.slot,
                key,
            };
            let ((), actions) = self.shared.with_book(|book| book.forget_denial(at));
            self.shared.dispatch(actions);
        };
        forget();
        let refunded = refund.await;
        forget();
        refunded
    }

    /// Runs the book's timers until [`shutdown`](Self::shutdown): returns unused units
    /// before their window ends, renews and gives back rate shares, releases idle keys,
    /// expires lost reservations. Only with
    /// [`manual_timers`](LeasedLimiterBuilder::manual_timers): by default the limiter runs
    /// them on a task of its own (spawned by `build` inside a tokio runtime, else by the
    /// first request), and this returns at once.
    pub async fn run_timers(&self) {
        if self.shared.auto_timers {
            return;
        }
        let shared = &self.shared;
        loop {
            let mut changed = pin!(shared.timers.notified());
            changed.as_mut().enable();
            let (next, closed) = shared.next_timer();
            if closed {
                return;
            }
            match next {
                Some(at) => {
                    let wait = Duration::from(at.saturating_since(shared.clock.now()));
                    let _ = tokio::time::timeout(wait, changed).await;
                }
                None => changed.await,
            }
            shared.fire_timers();
        }
    }

    /// Gives back every unit still returnable (awaiting the returns), stops
    /// [`run_timers`](Self::run_timers), and sends every later request to the store.
    ///
    /// A reservation still in flight is waited for, at most the flight timeout
    /// ([`LeaseConfig::flight_timeout`]) on the limiter's clock: its grant, if any, is
    /// given back as it lands, and one that has not landed by then is presumed lost.
    pub async fn shutdown(&self) {
        let shared = &self.shared;
        let now = shared.clock.now();
        shared
            .step_both(
                |book| book.handle_shutdown(now),
                |rates| rates.handle_shutdown(now),
            )
            .await;
        shared.await_flights().await;
        shared.timers.notify_one();
    }

    /// The counters so far.
    pub fn stats(&self) -> LeaseStats {
        let mut stats = self.shared.lock().stats();
        stats.add(&self.shared.lock_rates().stats());
        stats.direct_unleasable = self.shared.direct_unleasable.load(Ordering::Relaxed);
        stats.direct += stats.direct_unleasable;
        stats.returns_failed = self.shared.returns_failed.load(Ordering::Relaxed);
        stats
    }

    /// This node's rate share of every token-bucket key it leases, now: per-node shares
    /// made visible (each node reports its own; `stranded_if_dead` is what the others would
    /// lose were this node to die now). Each names its key's policy: a name prepared twice
    /// here (a [`PolicyTable`](crate::PolicyTable) refuses that) shows as two entries.
    pub fn rate_shares(&self) -> Vec<ShareView> {
        let now = self.shared.clock.now();
        let policies = self
            .shared
            .policies
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let name = |slot: u32| {
            policies
                .get(slot as usize)
                .map(|(n, _)| n.name().to_owned())
        };
        self.shared
            .lock_rates()
            .shares(now, |slot| name(slot).unwrap_or_default())
    }

    /// The settings.
    pub fn config(&self) -> LeaseConfig {
        *self.shared.lock().config()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.shared.store
    }
}

/// A book's action as the driver carries it out (`Shared::carry`, `Shared::carry_rate`): a
/// reservation or take is one store call whose reply goes back to its book; a return is
/// one store call.
trait Carry<S: Leasable + 'static>: Send + Sized + 'static {
    /// Carries it out in a task of its own.
    fn spawn(self, shared: &Arc<Shared<S>>);
    /// If it gives units or a share back (all a closed book emits): that store call.
    fn into_return(self, shared: &Shared<S>) -> Option<impl Future<Output = ()> + Send + '_>;
}

impl<S: Leasable + 'static> Carry<S> for Action {
    fn spawn(self, shared: &Arc<Shared<S>>) {
        tokio::spawn(Arc::clone(shared).carry(self));
    }

    fn into_return(self, shared: &Shared<S>) -> Option<impl Future<Output = ()> + Send + '_> {
        match self {
            Action::Return {
                key,
                units,
                at,
                stamp,
            } => Some(shared.give_back(key, units, at, stamp)),
            Action::Reserve { .. } => None,
        }
    }
}

impl<S: Leasable + 'static> Carry<S> for RateAction {
    fn spawn(self, shared: &Arc<Shared<S>>) {
        tokio::spawn(Arc::clone(shared).carry_rate(self));
    }

    fn into_return(self, shared: &Shared<S>) -> Option<impl Future<Output = ()> + Send + '_> {
        match self {
            RateAction::Return { key, request, at } => Some(shared.return_share(key, request, at)),
            RateAction::Take { .. } => None,
        }
    }
}

/// A grant being given back after a shutdown ([`Shared::settling`]).
struct Settling<'a, S: Leasable>(&'a Shared<S>);

impl<S: Leasable> Drop for Settling<'_, S> {
    fn drop(&mut self) {
        self.0.settling.fetch_sub(1, Ordering::Relaxed);
        self.0.settled.notify_waiters();
    }
}

impl<S: Leasable + 'static> Shared<S> {
    /// Spawns the timer loop once, if the timers are the limiter's own and a tokio runtime
    /// is at hand (a relaxed load on every request once started).
    fn start_timers(self: &Arc<Self>) {
        if !self.auto_timers || self.timers_started.load(Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.timers_started.swap(true, Ordering::AcqRel) {
            return;
        }
        runtime.spawn(timer_loop(Arc::downgrade(self), Arc::clone(&self.timers)));
    }

    /// Waits until no reservation is awaited and no grant is still being given back (each
    /// reservation's or take's end gives back its grant, see `after_reply`), at most the
    /// flight timeout; then presumes what is still in flight lost, which lets its key go.
    async fn await_flights(self: &Arc<Self>) {
        let flight_timeout = self.lock().config().flight_timeout;
        let give_up = self.clock.now().saturating_add(flight_timeout);
        let settled = async {
            loop {
                let mut woken = pin!(self.settled.notified());
                woken.as_mut().enable();
                {
                    let book = self.lock();
                    let rates = self.lock_rates();
                    let pending =
                        book.stats().reservations_pending() + rates.stats().reservations_pending();
                    if pending == 0 && self.settling.load(Ordering::Relaxed) == 0 {
                        return;
                    }
                }
                woken.await;
            }
        };
        // Outside a runtime no reservation's task runs (nothing was spawned), and there is no
        // timer to wait with: what is in flight is presumed lost at once.
        if tokio::runtime::Handle::try_current().is_ok() {
            let _ = tokio::time::timeout(Duration::from(flight_timeout), settled).await;
        }
        let now = self.clock.now().max(give_up);
        self.step_both(
            |book| book.handle_timeout(now),
            |rates| rates.handle_timeout(now),
        )
        .await;
    }

    /// Takes one step of each book (`window`, then `rate`) and carries out every action
    /// they emit, [`CARRIED_AT_ONCE`] at a time, awaiting them all: a shutdown holding many
    /// keys used to wait out one store call after another (minutes for ten thousand keys
    /// with the store away, past any orchestrator's grace period), and all at once they
    /// would queue past a short store deadline. A panic in one is raised here once the rest
    /// are done. Outside a runtime, where nothing can be spawned, one after the other.
    async fn step_both(
        self: &Arc<Self>,
        window: impl FnOnce(&mut LeaseBook),
        rate: impl FnOnce(&mut RateBook),
    ) {
        type Carried = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
        let ((), actions) = self.with_book(window);
        let ((), rate_actions) = self.with_rates(rate);
        let carried = actions
            .into_iter()
            .map(|action| Box::pin(Arc::clone(self).carry(action)) as Carried)
            .chain(
                rate_actions
                    .into_iter()
                    .map(|action| Box::pin(Arc::clone(self).carry_rate(action)) as Carried),
            );
        if tokio::runtime::Handle::try_current().is_err() {
            for action in carried {
                action.await;
            }
            return;
        }
        let mut running = tokio::task::JoinSet::new();
        let mut panicked = None;
        let mut joined = |done: Option<Result<(), tokio::task::JoinError>>| {
            if let Some(Err(error)) = done
                && error.is_panic()
            {
                panicked.get_or_insert(error.into_panic());
            }
        };
        for action in carried {
            if running.len() >= CARRIED_AT_ONCE {
                joined(running.join_next().await);
            }
            running.spawn(action);
        }
        while let Some(done) = running.join_next().await {
            joined(Some(done));
        }
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
    }

    /// One pass of the timers at the clock's now: what is due, handled and dispatched.
    fn fire_timers(self: &Arc<Self>) {
        let now = self.clock.now();
        let ((), actions) = self.with_book(|book| book.handle_timeout(now));
        self.dispatch(actions);
        let ((), actions) = self.with_rates(|rates| rates.handle_timeout(now));
        self.dispatch(actions);
    }

    /// The next deadline of either book, and whether the limiter was shut down.
    fn next_timer(&self) -> (Option<Timestamp>, bool) {
        let book = self.lock();
        let rates = self.lock_rates();
        let next = match (book.poll_timeout(), rates.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (next, book.is_closed())
    }

    fn with_rates<R>(&self, f: impl FnOnce(&mut RateBook) -> R) -> (R, Vec<RateAction>) {
        self.run_on(&self.rates, f)
    }

    /// Carries out one action of the rate book.
    async fn carry_rate(self: Arc<Self>, action: RateAction) {
        match action {
            RateAction::Take { key, request, at } => self.take(key, request, at).await,
            RateAction::Return { key, request, at } => self.return_share(key, request, at).await,
        }
    }

    /// Sends a take of the rate book and hands its reply back to the book.
    async fn take(self: Arc<Self>, key: LeaseKey, request: TakeRequest, at: Timestamp) {
        let left = self.clock.now();
        let ((), actions) = self.with_rates(|rates| rates.take_left(left, &key, request.seq));
        self.dispatch(actions);
        let reply = match self.policy(key.slot) {
            Some(policy) => {
                let now = self.store_time(at);
                let op = RateOp::Take(request);
                match self.store.share_rate(now, &policy, &key.key, op).await {
                    Ok(RateAnswer::Taken(taken)) => TakeReply::Answered(taken),
                    _ => TakeReply::Failed,
                }
            }
            None => TakeReply::Failed,
        };
        let now = self.clock.now();
        let (settling, actions) = self.with_rates(|rates| {
            rates.handle_taken(now, &key, request.seq, reply);
            rates.is_closed().then(|| self.settling())
        });
        self.after_reply(settling, actions).await;
    }

    /// A reservation (or take) ended after a shutdown, its grant being given back: counted
    /// in `settling` until the returned guard drops (the returns awaited, or the task
    /// dropped), which wakes the shutdown. Call it under the book's lock, as the book counts
    /// the reservation ended.
    fn settling(&self) -> Settling<'_, S> {
        self.settling.fetch_add(1, Ordering::Relaxed);
        Settling(self)
    }

    /// Gives a rate share back to the store, counting a return that fails.
    async fn return_share(&self, key: LeaseKey, request: ReturnRequest, at: Timestamp) {
        let returned = match self.policy(key.slot) {
            Some(policy) => {
                let (now, op) = (self.store_time(at), RateOp::Return(request));
                let back = self.store.share_rate(now, &policy, &key.key, op);
                back.await.is_ok()
            }
            None => false,
        };
        if !returned {
            self.returns_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn lock_rates(&self) -> MutexGuard<'_, RateBook> {
        lock_book(&self.rates)
    }

    fn with_book<R>(&self, f: impl FnOnce(&mut LeaseBook) -> R) -> (R, Vec<Action>) {
        self.run_on(&self.book, f)
    }

    /// Runs `f` on `book` and drains its actions; wakes the timer task if `f` added a
    /// deadline earlier than any before.
    fn run_on<B: Book, R>(
        &self,
        book: &Mutex<B>,
        f: impl FnOnce(&mut B) -> R,
    ) -> (R, Vec<B::Action>) {
        let mut book = lock_book(book);
        let before = book.poll_timeout();
        let result = f(&mut book);
        let after = book.poll_timeout();
        let mut actions = Vec::new();
        while let Some(action) = book.poll_action() {
            actions.push(action);
        }
        drop(book);
        if after.is_some_and(|a| before.is_none_or(|b| a < b)) {
            self.timers.notify_one();
        }
        (result, actions)
    }

    /// Carries out each action in a task of its own. Outside a runtime (a future dropped
    /// as its runtime shuts down) nothing can be sent: the book presumes a reservation or
    /// take that never left lost after its flight timeout, and a return counts as failed.
    fn dispatch<A: Carry<S>>(self: &Arc<Self>, actions: Vec<A>) {
        // Most decisions emit nothing: no runtime lookup for them (it clones an `Arc`).
        if actions.is_empty() {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            let returns = actions
                .into_iter()
                .filter_map(|a| a.into_return(self))
                .count();
            self.returns_failed
                .fetch_add(returns as u64, Ordering::Relaxed);
            return;
        }
        for action in actions {
            action.spawn(self);
        }
    }

    /// What follows a book's reply: with a shutdown waiting for it (`settling`), the
    /// returns the reply emitted (a closed book emits nothing else) are carried before the
    /// shutdown is told it ended; otherwise every action is dispatched.
    async fn after_reply<A: Carry<S>>(
        self: &Arc<Self>,
        settling: Option<Settling<'_, S>>,
        actions: Vec<A>,
    ) {
        match settling {
            Some(_settling) => {
                for action in actions {
                    if let Some(returned) = action.into_return(self) {
                        returned.await;
                    }
                }
            }
            None => self.dispatch(actions),
        }
    }

    /// Carries out one action of the lease book.
    async fn carry(self: Arc<Self>, action: Action) {
        match action {
            Action::Reserve {
                key,
                id,
                units,
                at,
                hold,
            } => self.reserve(key, id, units, at, hold).await,
            Action::Return {
                key,
                units,
                at,
                stamp,
            } => self.give_back(key, units, at, stamp).await,
        }
    }

    /// Sends a reservation of the lease book and hands its reply back to the book.
    async fn reserve(
        self: Arc<Self>,
        key: LeaseKey,
        id: u64,
        units: u64,
        at: Timestamp,
        hold: Micros,
    ) {
        let reply = match self.policy(key.slot) {
            // A window's grant is held for no time (`hold` is zero): the store's stamp
            // names the window the units were counted in, and the block's returns go to
            // that window only (`refund_held`), however late they execute.
            Some(policy) => {
                let now = self.store_time(at);
                let held = self.store.acquire_held(now, &policy, &key.key, units, hold);
                match held.await {
                    Ok(held) => Reserved::Decided(held.decision, held.stamp),
                    Err(_) => Reserved::Failed,
                }
            }
            None => Reserved::Failed,
        };
        let now = self.clock.now();
        let (settling, actions) = self.with_book(|book| {
            book.handle_reserved(now, &key, id, reply);
            book.is_closed().then(|| self.settling())
        });
        self.waker(&key.key).notify_waiters();
        self.after_reply(settling, actions).await;
    }

    /// Gives `units` of `key` back to the store (from `stamp`, the grant's), counting a
    /// return that fails.
    async fn give_back(&self, key: LeaseKey, units: u64, at: Timestamp, stamp: Timestamp) {
        let now = self.store_time(at);
        let returned = match self.policy(key.slot) {
            Some(policy) => {
                let back = self.store.refund_held(now, &policy, &key.key, units, stamp);
                back.await.is_ok()
            }
            None => false,
        };
        if !returned {
            self.returns_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn policy(&self, slot: u32) -> Option<Arc<S::Prepared>> {
        let policies = self.policies.read().unwrap_or_else(|p| p.into_inner());
        policies.get(slot as usize).map(|(_, p)| Arc::clone(p))
    }

    /// The `now` a store call gets for a local instant.
    fn store_time(&self, local: Timestamp) -> Option<Timestamp> {
        (self.time_source == TimeSource::LocalClock).then_some(local)
    }

    fn waker(&self, key: &[u8]) -> &Notify {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        &self.wakers[(hasher.finish() % self.wakers.len() as u64) as usize]
    }

    fn lock(&self) -> MutexGuard<'_, LeaseBook> {
        lock_book(&self.book)
    }
}

/// Locks a book. Its methods do not panic, so a poisoned lock still holds a consistent book.
fn lock_book<B>(book: &Mutex<B>) -> MutexGuard<'_, B> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Leasable + 'static> Limiter for LeasedLimiter<S> {
    type Prepared = LeasedPolicy<S::Prepared>;

    /// Prepares `policy` once: preparing it again (a layer rebuilt on reload, a policy per
    /// tenant prepared per call) gives the same slot, so the slots stay as many as the
    /// distinct policies.
    fn prepare(&self, policy: &NamedPolicy) -> Result<Self::Prepared, PrepareError> {
        let lock = &self.shared.policies;
        let seen = |policies: &[(NamedPolicy, Arc<S::Prepared>)]| {
            let slot = policies.iter().position(|(named, _)| named == policy)?;
            Some((slot as u32, Arc::clone(&policies[slot].1)))
        };
        // Prepared before (the usual case): a shared read. Else looked for again under the
        // write lock (another thread may have just added it), and added.
        let known = seen(&lock.read().unwrap_or_else(|p| p.into_inner()));
        let (slot, inner) = match known {
            Some(known) => known,
            None => {
                let mut policies = lock.write().unwrap_or_else(|p| p.into_inner());
                match seen(&policies) {
                    Some(known) => known,
                    None => {
                        let inner = Arc::new(self.shared.store.prepare(policy)?);
                        policies.push((policy.clone(), Arc::clone(&inner)));
                        ((policies.len() - 1) as u32, inner)
                    }
                }
            }
        };
        Ok(LeasedPolicy {
            owner: self.shared.owner,
            slot,
            inner,
            capacity: policy.policy().capacity(),
            terms: LeaseTerms::with_log_hold_divisor(
                policy.policy(),
                u64::from(self.config().log_hold_divisor.get()),
            ),
            rate: super::terms::rate_shares(policy.policy()),
            no_rate: AtomicBool::new(false),
        })
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        Ok(self.acquire_leased(now, policy, key, cost).await?.decision)
    }

    /// The store's answer: units held by leases are not the store's to report.
    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        self.owns(policy)?;
        let now = now.or_else(|| self.shared.store_time(self.shared.clock.now()));
        let store = &self.shared.store;
        decide_direct(store, &policy.inner, policy, now, key, cost, true).await
    }

    /// Straight to the store: a refund of an admission (leased or not) gives capacity back
    /// to everyone, in the store's current window. A token bucket leased as rate has no
    /// refund ([`DecideError::Unsupported`]): not giving back only under-admits.
    async fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        self.owns(policy)?;
        policy.refundable()?;
        let now = now.or_else(|| self.shared.store_time(self.shared.clock.now()));
        // Made inside the future: a store may run it as it is called.
        let refund = async {
            self.shared
                .store
                .refund(now, &policy.inner, key, amount)
                .await
        };
        self.refunding(policy, key, refund).await
    }

    /// [`LEASED_CALLS`](crate::lease::LEASED_CALLS) times the store's: a request may wait
    /// for a reservation, then call directly.
    fn deadline(&self) -> Option<Duration> {
        let calls = crate::lease::LEASED_CALLS;
        self.shared
            .store
            .deadline()
            .map(|d| d.saturating_mul(calls))
    }
}

impl<S> LeasedLimiterBuilder<S>
where
    S: Leasable + 'static,
{
    /// The lease settings.
    pub fn config(mut self, config: LeaseConfig) -> Self {
        self.config = config;
        self
    }

    /// This node's id in the store's rate shares of token buckets: 1 to 2^52 − 1 (`build`
    /// refuses others), unique among the nodes sharing a store (default: drawn from the
    /// process id and the start time). Two nodes with one id would be one share's holders:
    /// both would spend it.
    pub fn node_id(mut self, node: u64) -> Self {
        self.node = Some(node);
        self
    }

    /// The local clock (default [`TokioClock`]): block lifetimes, demand, timers.
    pub fn clock(mut self, clock: impl Clock + Send + Sync + 'static) -> Self {
        self.clock = Some(Box::new(clock));
        self
    }

    /// Whose clock the store decides on (default [`TimeSource::Store`]). Leases are exact
    /// with either: a block's life is measured from the store's own `reset_after`.
    pub fn time_source(mut self, source: TimeSource) -> Self {
        self.time_source = source;
        self
    }

    /// Run the timers by hand with [`LeasedLimiter::run_timers`] rather than on a task
    /// the limiter spawns itself: for a driver that must stop them (the simulator pauses a
    /// node's process). Without it, forgetting to run them cannot happen.
    pub fn manual_timers(mut self) -> Self {
        self.manual_timers = true;
        self
    }

    /// The limiter. Inside a tokio runtime, its timers start at once on a task of their
    /// own (otherwise at the first request), which ends when the limiter is shut down or
    /// its last handle is dropped.
    ///
    /// Errors: settings that [`LeaseConfig::check`] refuses over this store's deadline, or
    /// a [`node_id`](Self::node_id) out of range.
    pub fn build(self) -> Result<LeasedLimiter<S>, LeaseConfigError> {
        let deadline = self.store.deadline();
        self.config.check(deadline)?;
        let node = match self.node {
            Some(node) => {
                check_node(node).map_err(|_| LeaseConfigError::NodeId(node))?;
                node
            }
            None => node_id(),
        };
        // One store call's deadline (`check` made the book's bound on a reservation's flight
        // no shorter), or that bound for a store that states none: by then the book
        // presumes the flight lost and sends its waiters direct.
        let wait_budget = deadline.unwrap_or(Duration::from(self.config.flight_timeout));
        let leased = LeasedLimiter {
            shared: Arc::new(Shared {
                owner: Owner::new(),
                store: self.store,
                clock: self.clock.unwrap_or_else(|| Box::new(TokioClock::new())),
                time_source: self.time_source,
                book: Mutex::new(LeaseBook::new(self.config)),
                rates: Mutex::new(RateBook::new(self.config, node)),
                policies: RwLock::new(Vec::new()),
                wakers: (0..WAKER_SHARDS).map(|_| Notify::new()).collect(),
                settled: Notify::new(),
                settling: AtomicU64::new(0),
                timers: Arc::new(Notify::new()),
                auto_timers: !self.manual_timers,
                timers_started: AtomicBool::new(false),
                wait_budget,
                direct_unleasable: AtomicU64::new(0),
                returns_failed: AtomicU64::new(0),
            }),
        };
        leased.shared.start_timers();
        Ok(leased)
    }
}

impl<S: Leasable> Drop for Shared<S> {
    fn drop(&mut self) {
        // The timer loop may be asleep with no deadline: wake it to find the limiter gone.
        self.timers.notify_one();
    }
}

/// The limiter's own timer loop: `LeasedLimiter::run_timers`' loop over a weak reference,
/// so that a limiter whose handles are all dropped is dropped (and the loop ends) rather
/// than kept alive by its own timers.
async fn timer_loop<S: Leasable + 'static>(shared: Weak<Shared<S>>, wake: Arc<Notify>) {
    loop {
        let mut changed = pin!(wake.notified());
        changed.as_mut().enable();
        let (next, now) = {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let (next, closed) = shared.next_timer();
            if closed {
                return;
            }
            (next, shared.clock.now())
        };
        match next {
            Some(at) => {
                let _ =
                    tokio::time::timeout(Duration::from(at.saturating_since(now)), changed).await;
            }
            None => changed.await,
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.fire_timers();
    }
}

impl<P> LeasedPolicy<P> {
    /// The lease terms, or why this policy is decided directly.
    pub fn terms(&self) -> Result<&LeaseTerms, Unleasable> {
        self.terms.as_ref().map_err(|why| *why)
    }

    /// The store's prepared form.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The rate shares of a token bucket leased as rate, over a store that has rate shares
    /// (as far as it has said); `None` for any other policy.
    fn rate_shares(&self) -> Option<&RateShares> {
        self.rate
            .as_ref()
            .filter(|_| !self.no_rate.load(Ordering::Relaxed))
    }

    /// Whether `cost` of `key` can ever be admitted: a key, and a cost within the capacity.
    fn admissible(&self, key: &[u8], cost: u64) -> Result<(), DecideError> {
        KeyError::check(key)?;
        OverCapacity::check(cost, self.capacity)?;
        Ok(())
    }

    /// Whether a refund can be given (not for a token bucket leased as rate, where not
    /// giving back only under-admits).
    pub(crate) fn refundable(&self) -> Result<(), DecideError> {
        if self.rate_shares().is_some() {
            return Err(DecideError::Unsupported {
                operation: rein_core::rate_share::REFUND_UNSUPPORTED,
            });
        }
        Ok(())
    }
}

/// An answer the books gave here.
fn here(decision: Decision, source: Source) -> Decided {
    Decided { decision, source }
}

/// A direct decision of `store` for a leased limiter's `policy` (`peek`: what it would
/// answer, taking nothing): a token bucket leased as rate against what the shares leave
/// (its direct share; units held by shares are not the store's to report), or by plain
/// `acquire` / `peek` if the store has no rate shares (then no share exists either: the
/// store cannot have granted one), remembered for the policy; any other policy by
/// `acquire` / `peek`. Generic over the store so that the resilient limiter with leases on
/// decides through its gate with it.
pub(crate) async fn decide_direct<S: Leasable, P>(
    store: &S,
    prepared: &S::Prepared,
    policy: &LeasedPolicy<P>,
    now: Option<Timestamp>,
    key: &[u8],
    cost: u64,
    peek: bool,
) -> Result<Decision, DecideError> {
    let plain = || async {
        if peek {
            store.peek(now, prepared, key, cost).await
        } else {
            store.acquire(now, prepared, key, cost).await
        }
    };
    if policy.rate_shares().is_none() {
        return plain().await;
    }
    // A peek asks the direct share with a cost of zero, which takes nothing.
    let taken = if peek { 0 } else { cost };
    let mut decision = match store
        .share_rate(now, prepared, key, RateOp::Direct(taken))
        .await
    {
        Ok(RateAnswer::Decided(decision)) => decision,
        Ok(other) => {
            return Err(StoreError::UnexpectedReply(format!(
                "a direct rate decision answered {other:?}"
            ))
            .into());
        }
        Err(DecideError::Unsupported { .. }) => {
            policy.no_rate.store(true, Ordering::Relaxed);
            return plain().await;
        }
        Err(e) => return Err(e),
    };
    // As every store's peek: the figures of the admission it would be (what is left after
    // `cost`), or a denial.
    if peek && decision.remaining < cost {
        decision.outcome = rein_core::Outcome::Denied;
        decision.retry_after = decision.retry_after.max(Micros::from_micros(1));
    } else if peek {
        decision.remaining -= cost;
    }
    Ok(decision)
}

impl<S: Leasable> Clone for LeasedLimiter<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Leasable> fmt::Debug for LeasedLimiter<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedLimiter").finish_non_exhaustive()
    }
}

impl<S> fmt::Debug for LeasedLimiterBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedLimiterBuilder")
            .field("config", &self.config)
            .field("time_source", &self.time_source)
            .finish_non_exhaustive()
    }
}

impl<P> fmt::Debug for LeasedPolicy<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedPolicy")
            .field("slot", &self.slot)
            .field("capacity", &self.capacity)
            .field("terms", &self.terms)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

/// Rate-book actions sent when dropped: after the request that made them was decided, or
/// when its future is dropped first.
pub(crate) struct Deferred<'a, S: Leasable + 'static> {
    shared: &'a Arc<Shared<S>>,
    actions: Option<Vec<RateAction>>,
}

impl<S: Leasable + 'static> Drop for Deferred<'_, S> {
    fn drop(&mut self) {
        if let Some(actions) = self.actions.take() {
            self.shared.dispatch(actions);
        }
    }
}

/// A node id for rate shares: std's randomly keyed hasher over the process id and the
/// time, so two processes (or two limiters in one) practically never share one, taken
/// into the range the store accepts (1 to 2^52 − 1).
fn node_id() -> u64 {
    use std::hash::BuildHasher;
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let drawn = std::collections::hash_map::RandomState::new().hash_one((std::process::id(), time));
    (drawn & MAX_MICROS).max(1)
}

/// How many of a step's store calls (a shutdown's returns) [`Shared::step_both`] has in
/// flight at once: enough that ten thousand keys are given back in well under a second
/// from a healthy store, few enough that the last do not queue past a short deadline.
const CARRIED_AT_ONCE: usize = 64;

/// Waiter shards: a reply wakes the waiters of 1/64 of the keys, not all of them.
const WAKER_SHARDS: usize = 64;
