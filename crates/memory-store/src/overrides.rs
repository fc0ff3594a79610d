//! Per-key overrides in process ([`MemoryStore::set_override`](crate::MemoryStore::set_override)):
//! where a [`MemoryStore`](crate::MemoryStore) keeps them and how a decision finds the one
//! that applies.
//!
//! They are read on every decision of a store that has any, so the common case is one
//! atomic load: while no override is set, nothing else is read. With some set, a decision
//! takes the book's read lock for one lookup ([`Overrides::get`]: the key, then the longest
//! prefix); writes take the write lock and are seen by every decision that starts after
//! they return, so in one process a change has no staleness window at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rein_core::{
    Policy, Timestamp,
    admin::AdminError,
    overrides::{KeyMatch, MAX_OVERRIDES, Override, OverrideEntry, Overrides, check_target},
};

use crate::limiter::Form;
use crate::{Clock, MemoryLimiter};

/// Every override of one store, by policy name. Shared by the store's clones.
#[derive(Debug, Default)]
pub(crate) struct Book {
    /// How many overrides there are, over every policy: the decision path's fast check.
    count: AtomicUsize,
    /// Incremented by every write: tells a prepared policy when to drop the tables of
    /// limits no override names any more.
    version: AtomicU64,
    by_policy: RwLock<HashMap<Box<str>, Overrides<Kept>>>,
}

/// An override as the decision path uses it: limits behind an `Arc`, so a decision takes
/// them out of the lock for the price of a reference count.
#[derive(Clone, Debug)]
pub(crate) enum Kept {
    Unlimited,
    Limits(Arc<Policy>),
}

impl Book {
    /// The override of `key` under `policy`, if any.
    #[inline]
    pub(crate) fn get(&self, policy: &str, key: &[u8]) -> Option<Kept> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let book = self
            .by_policy
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        book.get(policy)?.get(key).cloned()
    }

    /// Sets or (`None`) removes the override of `keys` under `policy`; `true` if one was
    /// there. At most [`MAX_OVERRIDES`] over every policy.
    pub(crate) fn write(
        &self,
        policy: &str,
        keys: &KeyMatch,
        value: Option<&Override>,
    ) -> Result<bool, AdminError> {
        check_target(policy, keys)?;
        let mut book = self
            .by_policy
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let full = self.count.load(Ordering::Relaxed) >= MAX_OVERRIDES;
        let held = || {
            book.get(policy)
                .is_some_and(|o| o.iter().any(|(held, _)| held == *keys))
        };
        if value.is_some() && full && !held() {
            return Err(AdminError::InvalidOverride(format!(
                "the store holds {MAX_OVERRIDES} overrides, the most it may"
            )));
        }
        let mine = book.entry(policy.into()).or_default();
        let replaced = mine.remove(keys).is_some();
        match value {
            None => {}
            Some(Override::Unlimited) => mine.insert(keys.clone(), Kept::Unlimited),
            Some(Override::Limits(limits)) => {
                mine.insert(keys.clone(), Kept::Limits(Arc::new(limits.clone())));
            }
        }
        if mine.is_empty() {
            book.remove(policy);
        }
        let count = book.values().map(Overrides::len).sum();
        self.count.store(count, Ordering::Release);
        self.version.fetch_add(1, Ordering::Release);
        Ok(replaced)
    }

    /// Every override, by policy name, in no particular order.
    pub(crate) fn entries(&self) -> Vec<OverrideEntry> {
        let book = self
            .by_policy
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for (policy, overrides) in book.iter() {
            out.extend(overrides.iter().map(|(keys, kept)| OverrideEntry {
                policy: policy.to_string(),
                keys,
                value: match kept {
                    Kept::Unlimited => Override::Unlimited,
                    Kept::Limits(limits) => Override::Limits(Policy::clone(limits)),
                },
            }));
        }
        out
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The forms of the limits `policy`'s overrides give.
    fn forms(&self, policy: &str) -> Vec<Form> {
        let book = self
            .by_policy
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(overrides) = book.get(policy) else {
            return Vec::new();
        };
        overrides
            .iter()
            .filter_map(|(_, kept)| match kept {
                Kept::Limits(limits) => Some(Form::of(limits)),
                Kept::Unlimited => None,
            })
            .collect()
    }
}

/// The tables of one prepared policy's overrides whose limits cannot decide on the key's
/// own state (another [`Form`]): one per form, so that limits of one form share a key's
/// count between them as Redis does in another key. A table is dropped once no override
/// of the policy has its form and every key in it is full (as Redis lets such a key
/// expire), so a form given up and given again within a window still counts.
pub(crate) struct Apart<C> {
    /// The book's version when the tables were last pruned.
    pruned_at: u64,
    tables: HashMap<Form, Arc<MemoryLimiter<Vec<u8>, C>>>,
}

impl<C> Default for Apart<C> {
    fn default() -> Self {
        Self {
            pruned_at: 0,
            tables: HashMap::new(),
        }
    }
}

impl<C: Clock + Clone> Apart<C> {
    /// The table in which limits of `limits`' form count for `policy`, made on first use
    /// with `base`'s bound and clock. Decide in it with
    /// [`MemoryLimiter::change_as`]: its own policy may be other limits of the form.
    pub(crate) fn table(
        cell: &Mutex<Self>,
        book: &Book,
        policy: &str,
        limits: &Policy,
        base: &MemoryLimiter<Vec<u8>, C>,
        now: Timestamp,
    ) -> Arc<MemoryLimiter<Vec<u8>, C>> {
        let mut apart = cell.lock().unwrap_or_else(PoisonError::into_inner);
        let version = book.version();
        if apart.pruned_at != version {
            let forms = book.forms(policy);
            apart.tables.retain(|form, table| {
                forms.contains(form) || {
                    table.purge_full_at(now);
                    !table.is_empty()
                }
            });
            apart.pruned_at = version;
        }
        let max_keys = std::num::NonZeroUsize::new(base.max_keys())
            .unwrap_or(crate::limiter::DEFAULT_MAX_KEYS);
        apart
            .tables
            .entry(Form::of(limits))
            .or_insert_with(|| {
                Arc::new(
                    MemoryLimiter::builder(limits.clone())
                        .max_keys(max_keys)
                        .clock(base.clock().clone())
                        .build(),
                )
            })
            .clone()
    }

    /// Forgets `key`'s count in every table, and says whether any held one (a block and a
    /// reset replace what was counted in every form: a key of a table kept for a form given
    /// up would otherwise resume its count if the form is given again, and, blocked, decide
    /// without asking for the block).
    pub(crate) fn forget(cell: &Mutex<Self>, key: &[u8]) -> bool {
        let apart = cell.lock().unwrap_or_else(PoisonError::into_inner);
        apart
            .tables
            .values()
            .fold(false, |held, table| table.reset(key) | held)
    }
}
