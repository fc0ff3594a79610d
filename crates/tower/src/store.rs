//! [`ConfiguredStore`]: the Redis store a config file names, standalone or Cluster, as one
//! type, so that a limiter built from a file has one type whatever the file says.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use rein_core::admin::{AdminError, KeyAdmin, KeyState, Until};
use rein_core::overrides::{KeyMatch, Override, OverrideEntry};
use rein_core::{
    DecideError, Decision, Held, KeyError, Leasable, Limiter, Micros, NamedPolicy, PrepareError,
    StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp},
};
use rein_redis::{RedisPolicy, RedisStore};

/// Runs `$call` on the store held, whichever it is: one expression for both arms.
macro_rules! on_store {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            Self::Standalone($store) => $call,
            Self::Cluster($store) => $call,
        }
    };
}

/// A `rein_redis::RedisStore` over a standalone server or a Cluster. Implements
/// [`Limiter`], [`Leasable`] and [`KeyAdmin`] by forwarding every operation to the store it
/// holds.
#[derive(Clone, Debug)]
pub enum ConfiguredStore {
    /// `redis.url`: one server through a self-healing `ConnectionManager`.
    Standalone(RedisStore<ConnectionManager>),
    /// `redis.cluster`: a Redis Cluster.
    Cluster(RedisStore<ClusterConnection>),
}

/// The overrides of the deployment (`rein override ...`), its reported counts (`rein
/// watch`) and Redis's clock, forwarded to the store held.
impl ConfiguredStore {
    /// [`RedisStore::set_override`].
    pub async fn set_override(
        &self,
        policy: &str,
        keys: &KeyMatch,
        value: &Override,
    ) -> Result<bool, AdminError> {
        on_store!(self, store => store.set_override(policy, keys, value).await)
    }

    /// [`RedisStore::remove_override`].
    pub async fn remove_override(&self, policy: &str, keys: &KeyMatch) -> Result<bool, AdminError> {
        on_store!(self, store => store.remove_override(policy, keys).await)
    }

    /// [`RedisStore::overrides`].
    pub async fn overrides(&self) -> Result<Vec<OverrideEntry>, AdminError> {
        on_store!(self, store => store.overrides().await)
    }

    /// [`RedisStore::counts`].
    pub async fn counts(
        &self,
        policy: &str,
        first: u64,
        last: u64,
    ) -> Result<Vec<rein_redis::watch::Counted>, AdminError> {
        on_store!(self, store => store.counts(policy, first, last).await)
    }

    /// [`RedisStore::rate_state`].
    pub async fn rate_state(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
    ) -> Result<Option<rein_core::rate_share::RateState>, rein_redis::StateError> {
        on_store!(self, store => store.rate_state(policy, key).await)
    }

    /// [`RedisStore::server_time`].
    pub async fn server_time(&self) -> Result<Timestamp, StoreError> {
        on_store!(self, store => store.server_time().await)
    }

    /// [`RedisStore::keys`].
    pub fn keys(&self, policy: &RedisPolicy, key: &[u8]) -> Result<Vec<String>, KeyError> {
        on_store!(self, store => store.keys(policy, key))
    }
}

impl KeyAdmin for ConfiguredStore {
    async fn inspect(&self, policy: &RedisPolicy, key: &[u8]) -> Result<KeyState, AdminError> {
        on_store!(self, store => store.inspect(policy, key).await)
    }

    async fn reset(&self, policy: &RedisPolicy, key: &[u8]) -> Result<bool, AdminError> {
        on_store!(self, store => store.reset(policy, key).await)
    }

    async fn penalize(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<Decision, AdminError> {
        on_store!(self, store => store.penalize(policy, key, amount).await)
    }

    async fn set_remaining(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        remaining: u64,
    ) -> Result<Decision, AdminError> {
        on_store!(self, store => store.set_remaining(policy, key, remaining).await)
    }

    async fn block(
        &self,
        policy: &RedisPolicy,
        key: &[u8],
        until: Until,
        reason: &str,
    ) -> Result<bool, AdminError> {
        on_store!(self, store => store.block(policy, key, until, reason).await)
    }

    async fn unblock(&self, policy: &RedisPolicy, key: &[u8]) -> Result<bool, AdminError> {
        on_store!(self, store => store.unblock(policy, key).await)
    }
}

impl Limiter for ConfiguredStore {
    type Prepared = RedisPolicy;

    fn prepare(&self, policy: &NamedPolicy) -> Result<RedisPolicy, PrepareError> {
        on_store!(self, store => store.prepare(policy))
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        on_store!(self, store => Limiter::acquire(store, now, policy, key, cost).await)
    }

    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        on_store!(self, store => Limiter::peek(store, now, policy, key, cost).await)
    }

    async fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        on_store!(self, store => Limiter::refund(store, now, policy, key, amount).await)
    }

    fn deadline(&self) -> Option<Duration> {
        on_store!(self, store => Limiter::deadline(store))
    }
}

impl Leasable for ConfiguredStore {
    async fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> Result<Held, DecideError> {
        on_store!(self, s => Leasable::acquire_held(s, now, policy, key, cost, hold).await)
    }

    async fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), DecideError> {
        on_store!(self, s => Leasable::refund_held(s, now, policy, key, amount, stamp).await)
    }

    async fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        on_store!(self, s => Leasable::share_rate(s, now, policy, key, op).await)
    }
}
