//! [`ReloadableMemoryStore`]: the in-process store for a server whose rules reload. A plain
//! `rein_memory::MemoryStore` makes a new table each time a policy is prepared, and a
//! reload prepares every policy again: its counts would start over. This store hands out
//! the same table for the same policy (name and limits) for as long as the store lives, so
//! a rule that a reload leaves unchanged keeps its counts, as it does in Redis. A changed
//! rule starts afresh in memory (Redis keeps its state where the algorithm allows).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use rein_core::{
    DecideError, Decision, Held, Leasable, Limiter, Micros, NamedPolicy, PrepareError, Timestamp,
};
use rein_memory::MemoryStore;

type Table = <MemoryStore as Limiter>::Prepared;

/// The in-process store of `rein-server`; see the module doc.
#[derive(Clone, Default)]
pub struct ReloadableMemoryStore {
    store: MemoryStore,
    tables: Arc<Mutex<HashMap<NamedPolicy, Arc<Table>>>>,
}

impl ReloadableMemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the tables of policies not in `keep` (after a reload), so that memory
    /// follows the rules in force.
    pub fn retain(&self, keep: &[NamedPolicy]) {
        self.tables
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|policy, _| keep.contains(policy));
    }
}

impl Limiter for ReloadableMemoryStore {
    type Prepared = Arc<Table>;

    fn prepare(&self, policy: &NamedPolicy) -> Result<Self::Prepared, PrepareError> {
        let mut tables = self.tables.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(table) = tables.get(policy) {
            return Ok(Arc::clone(table));
        }
        let table = Arc::new(self.store.prepare(policy)?);
        tables.insert(policy.clone(), Arc::clone(&table));
        Ok(table)
    }

    fn acquire(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.store.acquire(now, policy, key, cost)
    }

    fn peek(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
    ) -> impl Future<Output = Result<Decision, DecideError>> + Send {
        self.store.peek(now, policy, key, cost)
    }

    fn refund(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.store.refund(now, policy, key, amount)
    }

    fn deadline(&self) -> Option<std::time::Duration> {
        self.store.deadline()
    }
}

impl Leasable for ReloadableMemoryStore {
    fn acquire_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        cost: u64,
        hold: Micros,
    ) -> impl Future<Output = Result<Held, DecideError>> + Send {
        self.store.acquire_held(now, policy, key, cost, hold)
    }

    fn refund_held(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        amount: u64,
        stamp: Timestamp,
    ) -> impl Future<Output = Result<(), DecideError>> + Send {
        self.store.refund_held(now, policy, key, amount, stamp)
    }

    fn share_rate(
        &self,
        now: Option<Timestamp>,
        policy: &Self::Prepared,
        key: &[u8],
        op: rein_core::rate_share::RateOp,
    ) -> impl Future<Output = Result<rein_core::rate_share::RateAnswer, DecideError>> + Send {
        self.store.share_rate(now, policy, key, op)
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{
        Limit, Policy,
        rate_share::{RateAnswer, RateOp},
    };

    use super::*;

    /// Leasing over the store reaches the memory store, on the table a reload keeps.
    #[tokio::test]
    async fn every_lease_operation_reaches_the_table_a_reload_keeps() {
        let store = ReloadableMemoryStore::new();
        let t = Timestamp::from_micros(1_000_000);
        let bucket = Limit::token_bucket(2, 1, Micros::from_secs(3600)).unwrap();
        let bucket = NamedPolicy::new("bucket", Policy::single(bucket)).unwrap();
        for remaining in [1, 0] {
            // Prepared again each time, as a reload does: the same table, the same shares.
            let prepared = store.prepare(&bucket).unwrap();
            let answer = store
                .share_rate(Some(t), &prepared, b"k", RateOp::Direct(1))
                .await;
            assert!(
                matches!(answer, Ok(RateAnswer::Decided(d))
                    if d.is_allowed() && d.remaining == remaining),
                "{answer:?}"
            );
        }

        let log = Limit::sliding_log(2, Micros::from_secs(1)).unwrap();
        let log = store
            .prepare(&NamedPolicy::new("log", Policy::single(log)).unwrap())
            .unwrap();
        let hold = Micros::from_secs(1);
        let held = store.acquire_held(Some(t), &log, b"k", 2, hold).await;
        let held = held.unwrap();
        assert!(held.decision.is_allowed());
        assert_eq!(held.stamp, t.saturating_add(hold));
        store
            .refund_held(Some(t), &log, b"k", 2, held.stamp)
            .await
            .unwrap();
        let again = store.acquire(Some(t), &log, b"k", 2).await.unwrap();
        assert!(again.is_allowed(), "{again:?}");
    }
}
