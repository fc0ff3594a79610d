//! Per-key overrides of a policy: another limit for one tenant, or none, without a deploy.
//!
//! An [`Override`] replaces a policy's limits for the keys a [`KeyMatch`] selects (one key,
//! or every key with a prefix); [`Overrides`] finds the one that applies to a key. Stores
//! keep them and look them up on the decision path (rein-redis: `RedisStoreBuilder::
//! overrides`); this module is their meaning and their text form, with no I/O.
//!
//! The override keeps the policy's name, so a store keeps counting the key where it did: a
//! raised limit keeps what was already counted, and a lowered one applies to it at once.
//! Only a change of algorithm (or of a window, for a lone fixed window kept as one integer
//! in Redis) counts afresh, in a state of the new shape.

use std::collections::HashMap;

use thiserror::Error;

use crate::admin::AdminError;
use crate::{ConfigError, Decision, KeyError, Limit, Micros, NamedPolicy, Outcome, Policy};

/// The most overrides one store holds (a Redis deployment, or one in-process store): one
/// more is refused, so that each process's copy and each re-read stay small.
pub const MAX_OVERRIDES: usize = 10_000;

/// What the keys an override selects get instead of their policy's limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Override {
    /// These limits, decided under the policy's name.
    Limits(Policy),
    /// No limit: every request admitted, and no store asked.
    Unlimited,
}

/// Which keys an override applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyMatch {
    /// This key only.
    Key(Box<[u8]>),
    /// Every key that starts with these bytes, unless an exact key or a longer prefix
    /// matches too.
    Prefix(Box<[u8]>),
}

/// One override: the policy it overrides, by name, the keys it selects, and what they get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverrideEntry {
    /// The policy it overrides, by name.
    pub policy: String,
    /// The keys it applies to.
    pub keys: KeyMatch,
    /// What they get.
    pub value: Override,
}

/// Where a store reads overrides from when they are not kept in the store itself: the
/// application's own database, a config service. A store built with such a source (rein-
/// redis: `RedisStoreBuilder::override_source`) calls [`load`](Self::load) at its first
/// decision and then at most once per its staleness, from the decision that finds its copy
/// that old, within the store's deadline; a failed load keeps the copy it had.
pub trait OverrideSource: Send + Sync + 'static {
    /// Every override there is now.
    fn load(&self) -> BoxFuture<'_, Result<Vec<OverrideEntry>, crate::limiter::SourceError>>;
}

/// A boxed, sendable future: what [`OverrideSource::load`] returns, so that a store can
/// hold any source behind one pointer.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Why an override's text did not read.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// Not `unlimited`, nor limits written as [`Override::encode`] writes them.
    #[error("{text:?}: {why}")]
    Syntax {
        /// The text.
        text: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The limits read, but rein-core does not accept them.
    #[error("{text:?}: {error}")]
    Limit {
        /// The text.
        text: String,
        /// Why the limit or policy was refused.
        error: ConfigError,
    },
}

/// Checks what an override is written for: a policy name rein accepts
/// ([`NamedPolicy::check_name`]) and a key or prefix a limiter takes ([`KeyError::check`]).
pub fn check_target(policy: &str, keys: &KeyMatch) -> Result<(), AdminError> {
    NamedPolicy::check_name(policy).map_err(|e| AdminError::InvalidOverride(e.to_string()))?;
    match keys {
        KeyMatch::Key(k) | KeyMatch::Prefix(k) => {
            KeyError::check(k).map_err(AdminError::InvalidKey)
        }
    }
}

/// What an [`Override::Unlimited`] key is answered, with no store asked: admitted, and as
/// full as `policy` (its capacity as `limit` and `remaining`).
pub fn unlimited(policy: &Policy) -> Decision {
    let capacity = policy.capacity();
    Decision {
        outcome: Outcome::Allowed,
        limit: capacity,
        remaining: capacity,
        retry_after: Micros::ZERO,
        reset_after: Micros::ZERO,
        limit_index: 0,
    }
}

impl Override {
    /// The override as one line of text, the form stores keep: `unlimited`, or the limits
    /// joined by `;`, each `tb:<capacity>:<refill>:<period µs>`, `fw:<limit>:<window µs>`,
    /// `sl:<limit>:<window µs>` or `sc:<limit>:<window µs>`. [`decode`](Self::decode) reads
    /// it back to an equal override.
    ///
    /// ```
    /// use rein_core::{Limit, Micros, Policy, overrides::Override};
    ///
    /// let more = Override::Limits(Policy::single(Limit::fixed_window(1_000, Micros::from_secs(60))?));
    /// assert_eq!(more.encode(), "fw:1000:60000000");
    /// assert_eq!(Override::decode("fw:1000:60000000")?, more);
    /// assert_eq!(Override::decode("unlimited")?, Override::Unlimited);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn encode(&self) -> String {
        let Override::Limits(policy) = self else {
            return UNLIMITED.to_owned();
        };
        let limits: Vec<String> = policy
            .limits()
            .iter()
            .map(|limit| match limit {
                // The emission interval in lowest terms: the same bucket, read back equal.
                Limit::TokenBucket(b) => {
                    let (period, refill) = b.emission_interval();
                    format!("tb:{}:{refill}:{period}", limit.capacity())
                }
                Limit::FixedWindow(w) => format!("fw:{}:{}", w.limit(), w.window().as_micros()),
                Limit::SlidingLog(w) => format!("sl:{}:{}", w.limit(), w.window().as_micros()),
                Limit::SlidingCounter(w) => {
                    format!("sc:{}:{}", w.limit(), w.window().as_micros())
                }
            })
            .collect();
        limits.join(";")
    }

    /// Reads [`encode`](Self::encode)'s text. Every limit is checked as when it is built
    /// ([`ConfigError`]), and a policy holds 1 to [`MAX_LIMITS`](crate::policy::MAX_LIMITS).
    pub fn decode(text: &str) -> Result<Self, OverrideError> {
        if text == UNLIMITED {
            return Ok(Override::Unlimited);
        }
        let syntax = |why| OverrideError::Syntax {
            text: text.to_owned(),
            why,
        };
        let refused = |error| OverrideError::Limit {
            text: text.to_owned(),
            error,
        };
        let mut limits = Vec::new();
        for part in text.split(';') {
            let mut fields = part.split(':');
            let tag = fields.next().unwrap_or_default();
            let numbers: Vec<u64> = fields
                .map(|f| {
                    f.bytes()
                        .all(|b| b.is_ascii_digit())
                        .then(|| f.parse().ok())
                        .flatten()
                        .ok_or_else(|| syntax("a field that is not a decimal integer"))
                })
                .collect::<Result<_, _>>()?;
            let limit = match (tag, numbers.as_slice()) {
                ("tb", &[capacity, refill, period]) => {
                    Limit::token_bucket(capacity, refill, Micros::from_micros(period))
                }
                ("fw", &[limit, window]) => Limit::fixed_window(limit, Micros::from_micros(window)),
                ("sl", &[limit, window]) => Limit::sliding_log(limit, Micros::from_micros(window)),
                ("sc", &[limit, window]) => {
                    Limit::sliding_counter(limit, Micros::from_micros(window))
                }
                ("tb" | "fw" | "sl" | "sc", _) => return Err(syntax("the wrong number of fields")),
                _ => {
                    return Err(syntax(
                        "a limit is tb, fw, sl or sc, or the whole is unlimited",
                    ));
                }
            };
            limits.push(limit.map_err(refused)?);
        }
        Policy::new(limits).map(Override::Limits).map_err(refused)
    }
}

const UNLIMITED: &str = "unlimited";

/// One policy's overrides, each held as `T` (an [`Override`], or a store's prepared form
/// of it), looked up by key: the key's own override first, then the one of the longest
/// prefix it starts with. Exact keys are one hash lookup; prefixes are tried in turn,
/// longest first, so keep them to tens.
///
/// ```
/// use rein_core::overrides::{KeyMatch, Overrides};
///
/// let mut overrides = Overrides::default();
/// overrides.insert(KeyMatch::Prefix(b"tenant-7:".as_slice().into()), "seven");
/// overrides.insert(KeyMatch::Prefix(b"tenant-".as_slice().into()), "any tenant");
/// overrides.insert(KeyMatch::Key(b"tenant-7:admin".as_slice().into()), "its admin");
/// assert_eq!(overrides.get(b"tenant-7:alice"), Some(&"seven"));
/// assert_eq!(overrides.get(b"tenant-9:bob"), Some(&"any tenant"));
/// assert_eq!(overrides.get(b"tenant-7:admin"), Some(&"its admin"));
/// assert_eq!(overrides.get(b"guest"), None);
/// ```
#[derive(Clone, Debug)]
pub struct Overrides<T> {
    exact: HashMap<Box<[u8]>, T>,
    /// Longest first; an equal prefix replaces.
    prefixes: Vec<(Box<[u8]>, T)>,
}

impl<T> Default for Overrides<T> {
    fn default() -> Self {
        Self {
            exact: HashMap::new(),
            prefixes: Vec::new(),
        }
    }
}

impl<T> Overrides<T> {
    /// Sets the override of `keys`, replacing one for the same key or prefix.
    pub fn insert(&mut self, keys: KeyMatch, value: T) {
        match keys {
            KeyMatch::Key(key) => {
                self.exact.insert(key, value);
            }
            KeyMatch::Prefix(prefix) => {
                match self.prefixes.iter().position(|(p, _)| *p == prefix) {
                    Some(at) => self.prefixes[at].1 = value,
                    None => {
                        let at = self
                            .prefixes
                            .partition_point(|(p, _)| p.len() >= prefix.len());
                        self.prefixes.insert(at, (prefix, value));
                    }
                }
            }
        }
    }

    /// The override that applies to `key`, if any.
    pub fn get(&self, key: &[u8]) -> Option<&T> {
        self.exact.get(key).or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| key.starts_with(prefix))
                .map(|(_, value)| value)
        })
    }

    /// Removes the override of `keys` (not of a longer or shorter prefix); what it was.
    pub fn remove(&mut self, keys: &KeyMatch) -> Option<T> {
        match keys {
            KeyMatch::Key(key) => self.exact.remove(key),
            KeyMatch::Prefix(prefix) => {
                let at = self.prefixes.iter().position(|(p, _)| p == prefix)?;
                Some(self.prefixes.remove(at).1)
            }
        }
    }

    /// Every override with what it selects: the keys first, then the prefixes, longest
    /// first.
    pub fn iter(&self) -> impl Iterator<Item = (KeyMatch, &T)> {
        let keys = self
            .exact
            .iter()
            .map(|(k, v)| (KeyMatch::Key(k.clone()), v));
        let prefixes = self
            .prefixes
            .iter()
            .map(|(p, v)| (KeyMatch::Prefix(p.clone()), v));
        keys.chain(prefixes)
    }

    /// How many overrides there are.
    pub fn len(&self) -> usize {
        self.exact.len() + self.prefixes.len()
    }

    /// `true` if there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_reads_back_equal_and_bad_text_is_refused() {
        let policy = Policy::new([
            Limit::token_bucket(200, 100, Micros::from_secs(1)).unwrap(),
            Limit::token_bucket(7, 3, Micros::from_secs(1)).unwrap(),
            Limit::fixed_window(1_000, Micros::from_secs(3_600)).unwrap(),
            Limit::sliding_log(10, Micros::from_secs(60)).unwrap(),
            Limit::sliding_counter(50, Micros::from_secs(60)).unwrap(),
        ])
        .unwrap();
        let limits = Override::Limits(policy);
        assert_eq!(Override::decode(&limits.encode()), Ok(limits));
        for bad in [
            "",
            "fw:10",
            "fw:10:0",
            "fw:ten:60",
            "fw:+1:60",
            "xx:1:2",
            "fw:1:1;",
            "Unlimited",
            "fw:1:1;fw:1:1;fw:1:1;fw:1:1;fw:1:1;fw:1:1;fw:1:1;fw:1:1;fw:1:1",
        ] {
            assert!(Override::decode(bad).is_err(), "{bad:?} read");
        }
    }

    #[test]
    fn an_equal_prefix_replaces_and_longer_prefixes_win() {
        let mut overrides = Overrides::default();
        overrides.insert(KeyMatch::Prefix(b"a".as_slice().into()), 1);
        overrides.insert(KeyMatch::Prefix(b"abc".as_slice().into()), 3);
        overrides.insert(KeyMatch::Prefix(b"ab".as_slice().into()), 2);
        overrides.insert(KeyMatch::Prefix(b"ab".as_slice().into()), 20);
        assert_eq!(overrides.get(b"abcd"), Some(&3));
        assert_eq!(overrides.get(b"abd"), Some(&20));
        assert_eq!(overrides.get(b"ax"), Some(&1));
        assert_eq!(overrides.get(b"b"), None);
        assert_eq!(overrides.len(), 3);
        assert_eq!(
            overrides.remove(&KeyMatch::Prefix(b"abc".as_slice().into())),
            Some(3)
        );
        assert_eq!(
            overrides.remove(&KeyMatch::Key(b"abc".as_slice().into())),
            None
        );
        assert_eq!(overrides.get(b"abcd"), Some(&20));
        assert_eq!(overrides.len(), 2);
    }
}
