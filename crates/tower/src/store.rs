//! [`ConfiguredStore`]: the Redis store a config file names, standalone or Cluster, as one
//! type, so that a limiter built from a file has one type whatever the file says.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;
use rein_core::{
    DecideError, Decision, Held, KeyError, Leasable, Limiter, Micros, NamedPolicy, PolicyState,
    PrepareError, StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp},
};
use rein_redis::{RedisPolicy, RedisStore, StateError};

/// A `rein_redis::RedisStore` over a standalone server or a Cluster. Implements
/// [`Limiter`] and [`Leasable`] by forwarding every operation to the store it holds.
#[derive(Clone, Debug)]
pub enum ConfiguredStore {
    /// `redis.url`: one server through a self-healing `ConnectionManager`.
    Standalone(RedisStore<ConnectionManager>),
    /// `redis.cluster`: a Redis Cluster.
    Cluster(RedisStore<ClusterConnection>),
}

/// An operator's reads and resets (`rein key inspect|reset`), forwarded to the store held.
impl ConfiguredStore {
    /// [`RedisStore::state`].
    pub async fn state(&self, policy: &RedisPolicy, key: &[u8]) -> Result<PolicyState, StateError> {
        match self {
            Self::Standalone(store) => store.state(policy, key).await,
            Self::Cluster(store) => store.state(policy, key).await,
        }
    }

    /// [`RedisStore::reset`].
    pub async fn reset(&self, policy: &RedisPolicy, key: &[u8]) -> Result<bool, StateError> {
        match self {
            Self::Standalone(store) => store.reset(policy, key).await,
            Self::Cluster(store) => store.reset(policy, key).await,
        }
    }

    /// [`RedisStore::server_time`].
    pub async fn server_time(&self) -> Result<Timestamp, StoreError> {
        match self {
            Self::Standalone(store) => store.server_time().await,
            Self::Cluster(store) => store.server_time().await,
        }
    }

    /// [`RedisStore::keys`].
    pub fn keys(&self, policy: &RedisPolicy, key: &[u8]) -> Result<Vec<String>, KeyError> {
        match self {
            Self::Standalone(store) => store.keys(policy, key),
            Self::Cluster(store) => store.keys(policy, key),
        }
    }
}

impl Limiter for ConfiguredStore {
    type Prepared = RedisPolicy;

    fn prepare(&self, policy: &NamedPolicy) -> Result<RedisPolicy, PrepareError> {
        match self {
            Self::Standalone(store) => store.prepare(policy),
            Self::Cluster(store) => store.prepare(policy),
        }
    }

    async fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        match self {
            Self::Standalone(store) => Limiter::acquire(store, now, policy, key, cost).await,
            Self::Cluster(store) => Limiter::acquire(store, now, policy, key, cost).await,
        }
    }

    async fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        match self {
            Self::Standalone(store) => Limiter::peek(store, now, policy, key, cost).await,
            Self::Cluster(store) => Limiter::peek(store, now, policy, key, cost).await,
        }
    }

    async fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
    ) -> Result<(), DecideError> {
        match self {
            Self::Standalone(store) => Limiter::refund(store, now, policy, key, amount).await,
            Self::Cluster(store) => Limiter::refund(store, now, policy, key, amount).await,
        }
    }

    fn deadline(&self) -> Option<Duration> {
        match self {
            Self::Standalone(store) => Limiter::deadline(store),
            Self::Cluster(store) => Limiter::deadline(store),
        }
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
        match self {
            Self::Standalone(s) => Leasable::acquire_held(s, now, policy, key, cost, hold).await,
            Self::Cluster(s) => Leasable::acquire_held(s, now, policy, key, cost, hold).await,
        }
    }

    async fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> Result<(), DecideError> {
        match self {
            Self::Standalone(s) => Leasable::refund_held(s, now, policy, key, amount, stamp).await,
            Self::Cluster(s) => Leasable::refund_held(s, now, policy, key, amount, stamp).await,
        }
    }

    async fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &RedisPolicy,
        key: &[u8],
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        match self {
            Self::Standalone(s) => Leasable::share_rate(s, now, policy, key, op).await,
            Self::Cluster(s) => Leasable::share_rate(s, now, policy, key, op).await,
        }
    }
}
