//! [`MemoryStore`]: rein-memory behind the one [`Limiter`] trait.
//!
//! A [`MemoryLimiter`] applies one policy to many keys; the trait prepares any number of
//! named policies and decides by the prepared one. So the store is only a factory of
//! limiters sharing one clock and one size bound per policy: each prepared policy *is* a
//! [`MemoryLimiter`] of byte-string keys, and a decision is its synchronous call wrapped in
//! a future that is ready at once.

use std::collections::HashMap;
use std::future::{Future, Ready, ready};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use rein_core::{
    AcquireError, DecideError, Decision, Held, KeyError, Leasable, Limiter, Micros, NamedPolicy,
    Policy, PrepareError, StoreError, Timestamp,
    admin::{AdminError, KeyAdmin, KeyState, Until, check_reason},
    overrides::{KeyMatch, Override, OverrideEntry, unlimited},
    rate_share::{RateAnswer, RateOp},
};

use crate::overrides::{Apart, Book, Kept};
use crate::{Clock, MemoryLimiter, SystemClock};

/// Per-key limits in this process, for any number of named policies: the in-process
/// [`Limiter`].
///
/// Each [`prepare`](Limiter::prepare)d policy gets its own keyed table (at most
/// [`max_keys`](Self::max_keys) keys, and as many again in each of its other tables:
/// blocks, rate shares, override limits of another form), so two policies never share
/// state; the same policy
/// prepared again while it is held gets the same table ([`MemoryPolicy`]), as in Redis.
/// Calls never wait: the futures are ready when returned. A `None` for `now` reads the
/// store's clock.
///
/// ```
/// use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy, Timestamp};
/// use rein_memory::MemoryStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let api = store.prepare(&NamedPolicy::new(
///     "api",
///     Policy::single(Limit::fixed_window(2, Micros::from_secs(60))?),
/// )?)?;
/// let now = Some(Timestamp::from_micros(0));
/// assert!(store.acquire(now, &api, b"user-42", 2).await?.is_allowed());
/// assert!(!store.acquire(now, &api, b"user-42", 1).await?.is_allowed());
/// # Ok(())
/// # }
/// ```
///
/// # Overrides
/// [`set_override`](Self::set_override) gives the keys of one policy other limits, or none,
/// while the store serves, as rein-redis does for a deployment: the key's own override
/// wins, then the longest prefix. Limits of the same algorithms in the same order, with
/// the same windows, decide on the key's own state, so a raised limit keeps what was
/// counted and a lowered one applies to it; other algorithms or windows count afresh in a
/// table of their own (Redis shares a sliding log's or counter's state across windows). An unlimited key
/// is admitted with nothing counted. A change applies to every decision that starts after
/// it returns, in every clone of the store; a store with no override pays one atomic load
/// per decision for them. Leases keep the policy's own limits.
///
/// ```
/// use rein_core::overrides::{KeyMatch, Override};
/// use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy, Timestamp};
/// use rein_memory::MemoryStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let hourly = |n| Limit::fixed_window(n, Micros::from_secs(3_600));
/// let store = MemoryStore::new();
/// let api = store.prepare(&NamedPolicy::new("api", Policy::single(hourly(2)?))?)?;
/// let now = Some(Timestamp::from_micros(0));
/// assert!(store.acquire(now, &api, b"tenant-7", 2).await?.is_allowed());
/// assert!(!store.acquire(now, &api, b"tenant-7", 1).await?.is_allowed());
/// // Tenant 7 gets 5 an hour: the 2 it used still count.
/// let more = Override::Limits(Policy::single(hourly(5)?));
/// store.set_override("api", &KeyMatch::Key(b"tenant-7".as_slice().into()), &more)?;
/// assert_eq!(store.acquire(now, &api, b"tenant-7", 1).await?.remaining, 2);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore<C = SystemClock> {
    clock: C,
    max_keys: NonZeroUsize,
    overrides: Arc<Book>,
    /// The tables of the policies prepared and still held, by policy: see [`MemoryPolicy`].
    prepared: Arc<Mutex<HashMap<NamedPolicy, Weak<Tables<C>>>>>,
}

/// A policy prepared by a [`MemoryStore`]: its name (which overrides name) and the
/// [`MemoryLimiter`] that keeps its keys. Preparing the same policy (name and limits) again
/// while one of its preparations is still held gives the same table, so its keys keep
/// their counts, as they keep their state in Redis (a server reloading its rules prepares
/// them all again); once none is held, the table is freed.
pub struct MemoryPolicy<C = SystemClock>(Arc<Tables<C>>);

/// What a [`MemoryPolicy`] shares between its preparations.
struct Tables<C> {
    name: Box<str>,
    limiter: MemoryLimiter<Vec<u8>, C>,
    apart: Mutex<Apart<C>>,
}

impl<C> MemoryPolicy<C> {
    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The limiter that keeps the policy's keys (overrides are the store's: a decision made
    /// here directly does not see them).
    pub fn limiter(&self) -> &MemoryLimiter<Vec<u8>, C> {
        &self.0.limiter
    }
}

impl<C> std::fmt::Debug for MemoryPolicy<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPolicy")
            .field("name", &self.0.name)
            .field("policy", self.0.limiter.policy())
            .finish_non_exhaustive()
    }
}

/// How a key of a prepared policy is decided, given its override.
enum Route<'a, C> {
    /// By the policy: no override.
    Own,
    /// Admitted, with nothing counted.
    Unlimited,
    /// By an override's limits, on the key's state in this table: the policy's own when
    /// the limits share its form, else the table of their form. Blocks are the policy's.
    Other(Arc<Policy>, Table<'a, C>),
}

/// Where an override's limits count a key.
enum Table<'a, C> {
    /// The policy's own table (the limits share its form).
    Own(&'a MemoryLimiter<Vec<u8>, C>),
    /// The table of the limits' form.
    Apart(Arc<MemoryLimiter<Vec<u8>, C>>),
}

impl<C> std::ops::Deref for Table<'_, C> {
    type Target = MemoryLimiter<Vec<u8>, C>;

    fn deref(&self) -> &Self::Target {
        match self {
            Table::Own(table) => table,
            Table::Apart(table) => table,
        }
    }
}

impl MemoryStore<SystemClock> {
    /// A store on the [`SystemClock`], with room for 2^20 keys per policy.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }
}

impl Default for MemoryStore<SystemClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C> MemoryStore<C> {
    /// A store reading `clock` when a call passes no `now`.
    pub fn with_clock(clock: C) -> Self {
        Self {
            clock,
            max_keys: crate::limiter::DEFAULT_MAX_KEYS,
            overrides: Arc::default(),
            prepared: Arc::default(),
        }
    }

    /// Sets what `keys` of the policy named `policy` get instead of its limits (see
    /// [Overrides](Self#overrides)); `true` if it replaced one. At most
    /// [`MAX_OVERRIDES`](rein_core::overrides::MAX_OVERRIDES) per store. The name is not
    /// checked against the prepared policies: an override of a name never prepared does
    /// nothing.
    pub fn set_override(
        &self,
        policy: &str,
        keys: &KeyMatch,
        value: &Override,
    ) -> Result<bool, AdminError> {
        self.overrides.write(policy, keys, Some(value))
    }

    /// Removes the override of `keys` of `policy`; `true` if there was one.
    pub fn remove_override(&self, policy: &str, keys: &KeyMatch) -> Result<bool, AdminError> {
        self.overrides.write(policy, keys, None)
    }

    /// Every override of the store, in no particular order.
    pub fn overrides(&self) -> Vec<OverrideEntry> {
        self.overrides.entries()
    }

    /// At most `max_keys` keys in each table of a prepared policy (see [`MemoryLimiter`] for
    /// eviction): its own, one per form of override limits that count apart, its blocks,
    /// and, for a lone token bucket, its rate shares. So a policy holds at most
    /// `(3 + forms) × max_keys` key states; each table is bounded alone. The store it
    /// returns prepares its own tables: none of those prepared before.
    pub fn max_keys(mut self, max_keys: NonZeroUsize) -> Self {
        self.max_keys = max_keys;
        self.prepared = Arc::default();
        self
    }
}

impl<C> MemoryStore<C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    fn decide<T>(
        &self,
        now: Option<Timestamp>,
        key: &[u8],
        call: impl FnOnce(Timestamp) -> Result<T, AcquireError>,
    ) -> Ready<Result<T, DecideError>> {
        if let Err(e) = KeyError::check(key) {
            return ready(Err(e.into()));
        }
        let now = now.unwrap_or_else(|| self.clock.now());
        ready(call(now).map_err(from_core))
    }

    /// How `key` of `policy` is decided: where the store decides what an override does.
    fn route<'a>(&self, policy: &'a MemoryPolicy<C>, key: &[u8], now: Timestamp) -> Route<'a, C> {
        match self.overrides.get(&policy.0.name, key) {
            None => Route::Own,
            Some(Kept::Unlimited) => Route::Unlimited,
            Some(Kept::Limits(limits)) if policy.0.limiter.shares_state_with(&limits) => {
                Route::Other(limits, Table::Own(&policy.0.limiter))
            }
            Some(Kept::Limits(limits)) => {
                let table = Apart::table(
                    &policy.0.apart,
                    &self.overrides,
                    &policy.0.name,
                    &limits,
                    &policy.0.limiter,
                    now,
                );
                Route::Other(limits, Table::Apart(table))
            }
        }
    }
}

impl<C> Limiter for MemoryStore<C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    type Prepared = MemoryPolicy<C>;

    fn prepare(&self, policy: &NamedPolicy) -> Result<Self::Prepared, PrepareError> {
        let mut prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner);
        prepared.retain(|_, tables| tables.strong_count() > 0);
        if let Some(tables) = prepared.get(policy).and_then(Weak::upgrade) {
            return Ok(MemoryPolicy(tables));
        }
        let tables = Arc::new(Tables {
            name: policy.name().into(),
            limiter: MemoryLimiter::builder(policy.policy().clone())
                .max_keys(self.max_keys)
                .clock(self.clock.clone())
                .build(),
            apart: Mutex::default(),
        });
        prepared.insert(policy.clone(), Arc::downgrade(&tables));
        Ok(MemoryPolicy(tables))
    }

    fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.decide(now, key, |now| {
            let own = &policy.0.limiter;
            match self.route(policy, key, now) {
                Route::Own => own.acquire_at(now, key, cost),
                Route::Unlimited => Ok(unlimited(own.policy())),
                Route::Other(limits, table) => table.change_as(
                    now,
                    key,
                    || own.blocked_as(now, key, cost, &limits),
                    |at, s| limits.acquire(at, s, cost),
                ),
            }
        })
    }

    fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.decide(now, key, |now| {
            let own = &policy.0.limiter;
            match self.route(policy, key, now) {
                Route::Own => own.peek_at(now, key, cost),
                Route::Unlimited => Ok(unlimited(own.policy())),
                Route::Other(limits, table) => own
                    .blocked_as(now, key, cost, &limits)
                    .unwrap_or_else(|| limits.peek(now, &table.state_of(key), cost)),
            }
        })
    }

    fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        // A token bucket leased as rate takes no refund, as in Redis. (An invalid key is
        // never in the table; `decide` refuses it.)
        let at = now.unwrap_or_else(|| self.clock.now());
        if policy.0.limiter.shares_rate(at, key) {
            return ready(Err(DecideError::Unsupported {
                operation: rein_core::rate_share::REFUND_UNSUPPORTED,
            }));
        }
        self.decide(Some(at), key, |now| {
            let own = &policy.0.limiter;
            match self.route(policy, key, now) {
                Route::Own => own.refund_at(now, key, amount),
                Route::Unlimited => Ok(()),
                Route::Other(limits, table) => {
                    table.change_as(now, key, || None, |at, s| limits.refund(at, s, amount))
                }
            }
        })
    }

    /// A local store never waits.
    fn deadline(&self) -> Option<std::time::Duration> {
        None
    }
}

/// An operator's changes to one key, in this process: each under the key's shard lock, so
/// atomic against every decision, and computed by rein-core as in Redis. A block is kept
/// beside the key's state (which it replaces: the key is as one never seen at its end).
impl<C> KeyAdmin for MemoryStore<C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    fn inspect(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<KeyState, AdminError>> + Send {
        ready(self.admin(key, |now| {
            let own = &policy.0.limiter;
            Ok(match self.route(policy, key, now) {
                Route::Own | Route::Unlimited => own.inspect_at(now, key),
                Route::Other(_, table) => match own.block_of(now, key) {
                    Some((block, reason)) => KeyState::Blocked { block, reason },
                    None => KeyState::Counting(table.state_of(key)),
                },
            })
        }))
    }

    fn reset(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, AdminError>> + Send {
        ready(self.admin(key, |now| {
            // Every override table's count too, as a block forgets them (before, only the
            // table of the override in force: one given up resumed its count when given
            // again).
            let apart = Apart::forget(&policy.0.apart, key);
            Ok(policy.0.limiter.reset_at(now, key) | apart)
        }))
    }

    fn penalize(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<Decision, AdminError>> + Send {
        let own = &policy.0.limiter;
        ready(self.change_count(
            policy,
            key,
            |now| own.penalize_at(now, key, amount),
            |now, limits, table| {
                table.change_as(
                    now,
                    key,
                    || own.blocked_as(now, key, 0, limits),
                    |at, s| limits.penalize(at, s, amount),
                )
            },
        ))
    }

    fn set_remaining(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        remaining: u64,
    ) -> impl Future<Output = Result<Decision, AdminError>> + Send {
        let own = &policy.0.limiter;
        ready(self.change_count(
            policy,
            key,
            |now| own.set_remaining_at(now, key, remaining),
            |now, limits, table| {
                // Counted, then unblocked: as `set_remaining_at`.
                let set = table.change_as(
                    now,
                    key,
                    || None,
                    |at, s| {
                        let (set, figures) = limits.with_remaining(at, remaining)?;
                        *s = set;
                        Ok(figures)
                    },
                );
                own.forget_block(key);
                set
            },
        ))
    }

    fn block(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
        until: Until,
        reason: &str,
    ) -> impl Future<Output = Result<bool, AdminError>> + Send {
        ready(check_reason(reason).and_then(|()| {
            self.admin(key, |now| {
                // The override alone first: routing would build another shape's table for
                // nothing.
                let overridden = self.overrides.get(&policy.0.name, key);
                if matches!(overridden, Some(Kept::Unlimited)) {
                    return Err(AdminError::unlimited_block());
                }
                if policy.0.limiter.shares_rate(now, key) {
                    return Err(AdminError::rate_shared());
                }
                let until = match until {
                    Until::At(at) => at,
                    Until::For(span) => now.saturating_add(span),
                };
                let blocked = policy.0.limiter.block_at(now, key, until, reason);
                // A block replaces what was counted (the key is as one never seen at its
                // end), in every state the key's decisions read: an override of another form
                // counts apart, as Redis's other key, which its block replaces. Forgotten
                // after the block is recorded, as in `block_at`: a key with a state is
                // decided without a look at the blocks.
                if blocked {
                    Apart::forget(&policy.0.apart, key);
                }
                Ok(blocked)
            })
        }))
    }

    fn unblock(
        &self,
        policy: &Self::Prepared,
        key: &[u8],
    ) -> impl Future<Output = Result<bool, AdminError>> + Send {
        ready(self.admin(key, |now| Ok(policy.0.limiter.unblock_at(now, key))))
    }
}

impl<C> MemoryStore<C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    /// An operator's change at the clock's `now`; a key a limiter does not take (empty, or
    /// over 1 KiB) is refused.
    fn admin<T>(
        &self,
        key: &[u8],
        change: impl FnOnce(Timestamp) -> Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        KeyError::check(key)?;
        change(self.clock.now())
    }

    /// An operator's change of what `key` has counted (a penalty, a set remaining): `own` on
    /// the policy's table, or `other` on an override's limits and the table they count in,
    /// at the clock's `now`. Refused while the key's token bucket shares rate: the shares
    /// are its count then, and a change of the plain bucket would not be read (a plain
    /// state the shares meet later is adopted).
    fn change_count(
        &self,
        policy: &MemoryPolicy<C>,
        key: &[u8],
        own: impl FnOnce(Timestamp) -> Result<Decision, AcquireError>,
        other: impl FnOnce(Timestamp, &Policy, Table<'_, C>) -> Result<Decision, AcquireError>,
    ) -> Result<Decision, AdminError> {
        self.admin(key, |now| {
            if policy.0.limiter.shares_rate(now, key) {
                return Err(AdminError::rate_shared());
            }
            match self.route(policy, key, now) {
                Route::Own | Route::Unlimited => own(now),
                Route::Other(limits, table) => other(now, &limits, table),
            }
            .map_err(admin_error)
        })
    }
}

/// rein-core's errors cannot come from a store-made state; reported, not panicked on.
fn admin_error(e: AcquireError) -> AdminError {
    AdminError::Unavailable(StoreError::UnexpectedReply(e.to_string()))
}

impl<C> Leasable for MemoryStore<C>
where
    C: Clock + Clone + Send + Sync + 'static,
{
    fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> impl Future<Output = Result<Held, DecideError>> + Send {
        self.decide(now, key, |now| {
            let (decision, stamp) = policy.0.limiter.acquire_held_at(now, key, cost, hold)?;
            Ok(Held { decision, stamp })
        })
    }

    fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.decide(now, key, |now| {
            policy.0.limiter.refund_held_at(now, key, amount, stamp)
        })
    }

    fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        op: RateOp,
    ) -> impl Future<Output = Result<RateAnswer, DecideError>> + Send {
        if let Err(e) = KeyError::check(key) {
            return ready(Err(e.into()));
        }
        let now = now.unwrap_or_else(|| self.clock.now());
        ready(policy.0.limiter.share_rate_at(now, &key.to_vec(), op))
    }
}

/// The core's request errors as the trait's: a state mismatch cannot happen here (the
/// limiter builds every state from its own policy), so it is reported as corrupt state.
fn from_core(error: AcquireError) -> DecideError {
    match error {
        AcquireError::InsufficientCapacity(over) => over.into(),
        AcquireError::StateMismatch => {
            StoreError::UnexpectedReply("stored state does not match its policy".into()).into()
        }
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Micros, Policy};

    use super::*;
    use crate::FakeClock;
    use rein_core::OverCapacity;

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        // Every future of this store is ready when returned.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        match future.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(output) => output,
            std::task::Poll::Pending => panic!("a memory store future was pending"),
        }
    }

    #[test]
    fn prepared_policies_keep_separate_state_and_read_the_clock_when_no_now_is_given() {
        let clock = FakeClock::new(Timestamp::from_micros(0));
        let store = MemoryStore::with_clock(clock.clone());
        let one = Policy::single(Limit::fixed_window(1, Micros::from_secs(1)).unwrap());
        let a = store
            .prepare(&NamedPolicy::new("a", one.clone()).unwrap())
            .unwrap();
        let b = store.prepare(&NamedPolicy::new("b", one).unwrap()).unwrap();
        assert!(
            block_on(store.acquire(None, &a, b"k", 1))
                .unwrap()
                .is_allowed()
        );
        assert!(
            block_on(store.acquire(None, &b, b"k", 1))
                .unwrap()
                .is_allowed()
        );
        assert!(
            !block_on(store.acquire(None, &a, b"k", 1))
                .unwrap()
                .is_allowed()
        );
        clock.advance(Micros::from_secs(1));
        assert!(
            block_on(store.peek(None, &a, b"k", 1))
                .unwrap()
                .is_allowed()
        );
    }

    /// A block of a key overridden as unlimited is refused: its decisions read no state and
    /// would never see it. Without the override, the same block holds.
    #[test]
    fn a_block_of_an_unlimited_key_is_refused() {
        use rein_core::admin::{AdminError, KeyAdmin, Until};
        use rein_core::overrides::{KeyMatch, Override};
        let store = MemoryStore::new();
        let api = NamedPolicy::new(
            "api",
            Policy::single(Limit::fixed_window(5, Micros::from_secs(60)).unwrap()),
        )
        .unwrap();
        let p = store.prepare(&api).unwrap();
        let vip = KeyMatch::Key(b"vip".as_slice().into());
        store
            .set_override("api", &vip, &Override::Unlimited)
            .unwrap();
        let block = || block_on(store.block(&p, b"vip", Until::For(Micros::from_secs(60)), "x"));
        assert!(
            matches!(block(), Err(AdminError::NotApplicable(_))),
            "{:?}",
            block()
        );
        assert!(
            block_on(store.acquire(None, &p, b"vip", 1))
                .unwrap()
                .is_allowed()
        );
        store.remove_override("api", &vip).unwrap();
        assert!(matches!(block(), Ok(true)));
        assert!(
            !block_on(store.acquire(None, &p, b"vip", 1))
                .unwrap()
                .is_allowed()
        );
    }

    /// A policy prepared again while held (a server reloading its rules prepares the new
    /// ones before it lets go of the old) keeps its keys' counts; one with other limits
    /// under the same name, or prepared after the last was dropped, starts afresh.
    #[test]
    fn a_policy_prepared_again_while_held_keeps_its_counts() {
        let store = MemoryStore::new();
        let t = Some(Timestamp::from_micros(0));
        let hourly = |n| Policy::single(Limit::fixed_window(n, Micros::from_secs(3_600)).unwrap());
        let api = NamedPolicy::new("api", hourly(2)).unwrap();
        let remaining = |p: &MemoryPolicy| block_on(store.peek(t, p, b"k", 0)).unwrap().remaining;
        let first = store.prepare(&api).unwrap();
        assert!(
            block_on(store.acquire(t, &first, b"k", 1))
                .unwrap()
                .is_allowed()
        );

        let again = store.prepare(&api).unwrap();
        assert_eq!(
            remaining(&again),
            1,
            "the same table while the first is held"
        );
        let raised = store
            .prepare(&NamedPolicy::new("api", hourly(3)).unwrap())
            .unwrap();
        assert_eq!(remaining(&raised), 3, "other limits: a table of their own");
        let other = store
            .prepare(&NamedPolicy::new("web", hourly(2)).unwrap())
            .unwrap();
        assert_eq!(remaining(&other), 2, "another name: a table of its own");

        drop((first, again));
        let fresh = store.prepare(&api).unwrap();
        assert_eq!(
            remaining(&fresh),
            2,
            "none held: freed, and prepared afresh"
        );
        let sized = store.clone().max_keys(NonZeroUsize::MIN);
        let resized = sized.prepare(&api).unwrap();
        assert_eq!(
            remaining(&resized),
            2,
            "a store with another size: its own tables"
        );
        let entries = store.prepared.lock().unwrap().len();
        assert_eq!(
            entries, 3,
            "the freed table's entry is gone: api, its raise, web"
        );
    }

    #[test]
    fn empty_keys_and_impossible_costs_are_typed_errors() {
        let store = MemoryStore::new();
        let p = Policy::single(Limit::fixed_window(2, Micros::from_secs(1)).unwrap());
        let p = store.prepare(&NamedPolicy::new("p", p).unwrap()).unwrap();
        assert!(matches!(
            block_on(store.acquire(None, &p, b"", 1)),
            Err(DecideError::InvalidKey(KeyError::Empty))
        ));
        assert!(matches!(
            block_on(store.acquire(None, &p, b"k", 3)),
            Err(DecideError::InsufficientCapacity(OverCapacity {
                cost: 3,
                capacity: 2
            }))
        ));
        assert!(matches!(
            block_on(store.refund(None, &p, b"", 1)),
            Err(DecideError::InvalidKey(KeyError::Empty))
        ));
    }

    /// A store whose clock (operators' changes read it) stands at the decisions' instants
    /// here, 1 ms, with a policy of one bucket of 10 a second.
    fn ten_a_second() -> (
        FakeClock,
        MemoryStore<FakeClock>,
        <MemoryStore<FakeClock> as Limiter>::Prepared,
        Limit,
    ) {
        let clock = FakeClock::new(Timestamp::from_micros(1_000));
        let store = MemoryStore::with_clock(clock.clone());
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).unwrap();
        let p = store
            .prepare(&NamedPolicy::new("p", Policy::single(bucket)).unwrap())
            .unwrap();
        (clock, store, p, bucket)
    }

    /// An operator's change of a key not yet shared holds for the leases: the rate shares
    /// adopt the plain bucket's state ([`RateShares::adopt`]) the first time they meet the
    /// key, and the key keeps one state. Before, the rate shares decided beside it, as if
    /// the bucket were full: a penalty did nothing.
    ///
    /// [`RateShares::adopt`]: rein_core::rate_share::RateShares::adopt
    #[test]
    fn a_penalty_of_a_key_not_yet_shared_holds_for_the_rate_shares() {
        use rein_core::admin::KeyAdmin;
        use rein_core::rate_share::{RateAnswer, RateOp};
        let (clock, store, p, _) = ten_a_second();
        let now = Some(clock.now());
        let direct = |cost| match block_on(store.share_rate(now, &p, b"k", RateOp::Direct(cost))) {
            Ok(RateAnswer::Decided(d)) => d,
            other => panic!("{other:?}"),
        };
        assert_eq!(block_on(store.penalize(&p, b"k", 8)).unwrap().remaining, 2);
        let denied = direct(3);
        assert!(!denied.is_allowed() && denied.remaining == 2, "{denied:?}");
        assert!(direct(2).is_allowed());
        assert!(!direct(1).is_allowed());
        // One state: the plain one is forgotten once adopted, so an inspection or a plain
        // decision does not read a second, stale count.
        assert_eq!(
            block_on(store.peek(now, &p, b"k", 0)).unwrap().remaining,
            10
        );
        // So does a set remaining, here of a key the shares had never met.
        assert_eq!(
            block_on(store.set_remaining(&p, b"j", 1))
                .unwrap()
                .remaining,
            1
        );
        let second = block_on(store.share_rate(now, &p, b"j", RateOp::Direct(1)));
        assert!(matches!(second, Ok(RateAnswer::Decided(d)) if d.is_allowed() && d.remaining == 0));
        // And a penalty of a key whose shares' state may be forgotten (full, no share: as a
        // Redis key expired) but is still in the table (before, that stale state was used,
        // and the penalty never read).
        clock.advance(Micros::from_secs(60));
        let later = Some(clock.now());
        assert_eq!(block_on(store.penalize(&p, b"k", 9)).unwrap().remaining, 1);
        let after = block_on(store.share_rate(later, &p, b"k", RateOp::Direct(2)));
        assert!(
            matches!(after, Ok(RateAnswer::Decided(d)) if !d.is_allowed()),
            "{after:?}"
        );
    }

    /// The core's transitions per key, a state apart from the plain bucket's, and a typed
    /// error for a policy that is not one token bucket.
    #[test]
    fn rate_shares_run_the_core_transitions_per_key() {
        use rein_core::rate_share::{
            RateAnswer, RateOp, RateShares, RateState, TakeRequest, Taken,
        };
        let (clock, store, p, bucket) = ten_a_second();
        let Limit::TokenBucket(tb) = bucket else {
            unreachable!()
        };
        let shares = RateShares::new(&tb).unwrap();
        let mut core = RateState::default();
        let t = Timestamp::from_micros(1_000);
        let take = RateOp::Take(TakeRequest {
            node: 3,
            held: 0,
            seq: 1,
            applied: 0,
            demand: 10,
            validity: Micros::from_millis(100),
        });
        let expected = shares.apply(t, &mut core, take).unwrap();
        assert!(matches!(expected, RateAnswer::Taken(Taken::Granted(_))));
        assert_eq!(
            block_on(store.share_rate(Some(t), &p, b"k", take)).unwrap(),
            expected
        );
        // Its state is the shares: a block, a penalty or a set could not change it.
        {
            use rein_core::admin::{AdminError, KeyAdmin, Until};
            let not_applied =
                |r: Result<(), AdminError>| matches!(r, Err(AdminError::NotApplicable(_)));
            let block = block_on(store.block(&p, b"k", Until::For(Micros::from_secs(1)), "x"));
            assert!(not_applied(block.map(|_| ())));
            assert!(not_applied(
                block_on(store.penalize(&p, b"k", 1)).map(|_| ())
            ));
            assert!(not_applied(
                block_on(store.set_remaining(&p, b"k", 1)).map(|_| ())
            ));
            let refund = block_on(store.refund(Some(t), &p, b"k", 1));
            assert!(
                matches!(refund, Err(DecideError::Unsupported { .. })),
                "{refund:?}"
            );
        }
        // The plain bucket is untouched; the direct share has nothing left.
        assert_eq!(
            block_on(store.peek(Some(t), &p, b"k", 0))
                .unwrap()
                .remaining,
            10
        );
        let direct = block_on(store.share_rate(Some(t), &p, b"k", RateOp::Direct(1))).unwrap();
        assert_eq!(
            direct,
            shares.apply(t, &mut core, RateOp::Direct(1)).unwrap()
        );
        // A reset forgets the shares, as Redis's `DEL` does: the direct share is full again.
        {
            use rein_core::admin::KeyAdmin;
            let other = Timestamp::from_micros(2_000);
            let take = |node| {
                RateOp::Take(TakeRequest {
                    node,
                    held: 0,
                    seq: 1,
                    applied: 0,
                    demand: 10,
                    validity: Micros::from_millis(100),
                })
            };
            block_on(store.share_rate(Some(other), &p, b"r", take(3))).unwrap();
            let spent = block_on(store.share_rate(Some(other), &p, b"r", RateOp::Direct(10)));
            assert!(matches!(spent, Ok(RateAnswer::Decided(d)) if !d.is_allowed()));
            assert!(block_on(store.reset(&p, b"r")).unwrap());
            let full = block_on(store.share_rate(Some(other), &p, b"r", RateOp::Direct(10)));
            assert!(matches!(full, Ok(RateAnswer::Decided(d)) if d.is_allowed()));
        }
        // Long after the share ended, the whole bucket is the direct share's again, and a
        // state that may be forgotten is as none: an operator may block the key.
        let later = Timestamp::from_micros(10_000_000);
        let full = block_on(store.share_rate(Some(later), &p, b"k", RateOp::Direct(10))).unwrap();
        assert!(matches!(full, RateAnswer::Decided(d) if d.is_allowed()));
        clock.advance(Micros::from_secs(60));
        let blocked = block_on(rein_core::admin::KeyAdmin::block(
            &store,
            &p,
            b"k",
            rein_core::admin::Until::For(Micros::from_secs(1)),
            "x",
        ));
        assert!(matches!(blocked, Ok(true)), "{blocked:?}");
        // The block holds for the leases too: a direct decision is its denial, a take finds
        // no room (before, both went on as if the key were not blocked).
        let now = Some(clock.now());
        let direct = block_on(store.share_rate(now, &p, b"k", RateOp::Direct(1))).unwrap();
        assert!(
            matches!(direct, RateAnswer::Decided(d) if !d.is_allowed() && d.retry_after == Micros::from_secs(1)),
            "{direct:?}"
        );
        let taken = block_on(store.share_rate(now, &p, b"k", take)).unwrap();
        assert!(matches!(taken, RateAnswer::Taken(Taken::Full)), "{taken:?}");
        let window = Limit::fixed_window(2, Micros::from_secs(1)).unwrap();
        let w = store
            .prepare(&NamedPolicy::new("w", Policy::single(window)).unwrap())
            .unwrap();
        assert!(matches!(
            block_on(store.share_rate(Some(t), &w, b"k", take)),
            Err(DecideError::InvalidShare(
                rein_core::rate_share::ShareError::NotShareable
            ))
        ));
    }
}
