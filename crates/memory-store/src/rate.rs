//! Rate shares in process: the state of
//! [`Leasable::share_rate`](rein_core::Leasable::share_rate) for a policy of one token
//! bucket, one [`RateState`] per key under one lock.
//!
//! A leased token bucket's keys are few (the hot ones) and each call is a renewal or a
//! direct decision, so one mutex over one map is enough; it is separate from the shard
//! tables because the state is another shape (docs/leases.md). Memory is bounded: a state
//! that may be forgotten ([`RateShares::is_forgettable`]) is dropped when the map is full,
//! and a new key beyond the bound is refused rather than evicting a key whose shares may
//! still be spent (evicting one would forget reserved rate: over-admission).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use rein_core::{
    DecideError, Policy, StoreError, Timestamp,
    rate_share::{RateAnswer, RateOp, RateShares, RateState, ShareError},
};

/// The rate-share states of one policy's keys.
pub(crate) struct RateTable<K> {
    shares: RateShares,
    max_keys: usize,
    states: Mutex<HashMap<K, RateState>>,
}

impl<K> RateTable<K> {
    /// The table for `policy`, or `None` if it is not one shareable token bucket.
    pub(crate) fn new(policy: &Policy, max_keys: usize) -> Option<Self> {
        let [rein_core::Limit::TokenBucket(bucket)] = policy.limits() else {
            return None;
        };
        Some(Self {
            shares: RateShares::new(bucket).ok()?,
            max_keys,
            states: Mutex::new(HashMap::new()),
        })
    }
}

impl<K: Hash + Eq + Clone> RateTable<K> {
    /// Runs `op` on `key`'s state at `now`.
    pub(crate) fn apply(
        &self,
        now: Timestamp,
        key: &K,
        op: RateOp,
    ) -> Result<RateAnswer, DecideError> {
        // No user code runs under the lock but `K`'s Hash and Eq; a poisoned map is still
        // consistent (the core's transitions do not panic), so it is recovered.
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        if !states.contains_key(key) && states.len() >= self.max_keys {
            let shares = self.shares;
            states.retain(|_, state| !shares.is_forgettable(now, state));
            if states.len() >= self.max_keys {
                return Err(StoreError::UnexpectedReply(
                    "rate-share table full: every key may still hold shares".into(),
                )
                .into());
            }
        }
        let mut state = states.get(key).cloned().unwrap_or_default();
        let answer = self.shares.apply(now, &mut state, op)?;
        if self.shares.is_forgettable(now, &state) {
            states.remove(key);
        } else {
            states.insert(key.clone(), state);
        }
        Ok(answer)
    }
}

/// For a policy that cannot be shared.
pub(crate) fn not_shareable() -> DecideError {
    ShareError::NotShareable.into()
}
