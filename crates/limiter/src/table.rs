//! [`PolicyTable`]: which policy applies to which key (a strategy per key class).

use std::collections::BTreeMap;

use rein_core::NamedPolicy;

use crate::ResilienceConfigError;

/// Named policies, a default, and prefix rules that pick a policy by the key's first bytes.
///
/// A key is classified in one of two ways:
/// - **By name**: [`acquire_as`](crate::ResilientLimiter::acquire_as) names the policy,
///   when the caller knows the class (an endpoint, a plan).
/// - **By prefix**: [`acquire`](crate::ResilientLimiter::acquire) takes the policy of the
///   *longest* prefix rule the key starts with, or the default. Longest match makes the
///   answer independent of the order rules were added in.
///
/// The table is fixed once the limiter is built. Rules are matched one by one, so keep it
/// to tens of rules; a key space with thousands of classes wants a class argument instead.
///
/// ```
/// use rein::PolicyTable;
/// use rein::core::{Limit, Micros, NamedPolicy, Policy};
///
/// let api = NamedPolicy::new("api", Policy::single(Limit::token_bucket(100, 10, Micros::from_secs(1))?))?;
/// let login = NamedPolicy::new("login", Policy::single(Limit::fixed_window(5, Micros::from_secs(60))?))?;
/// let table = PolicyTable::new(api)
///     .with_policy(login)?
///     .route_prefix("login:", "login")?;
/// assert_eq!(table.classify(b"login:alice").name(), "login");
/// assert_eq!(table.classify(b"alice").name(), "api");
/// assert_eq!(table.policy("login").map(|p| p.name()), Some("login"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct PolicyTable {
    /// Index 0 is the default.
    policies: Vec<NamedPolicy>,
    by_name: BTreeMap<String, usize>,
    /// (prefix, policy index), longest prefix first, ties by bytes.
    prefixes: Vec<(Box<[u8]>, usize)>,
}

impl PolicyTable {
    /// A table whose only policy, `default`, applies to every key.
    pub fn new(default: NamedPolicy) -> Self {
        let by_name = BTreeMap::from([(default.name().to_owned(), 0)]);
        Self {
            policies: vec![default],
            by_name,
            prefixes: Vec::new(),
        }
    }

    /// Adds `policy`, reachable by its name. Errors if the name is taken.
    pub fn with_policy(mut self, policy: NamedPolicy) -> Result<Self, ResilienceConfigError> {
        if self.by_name.contains_key(policy.name()) {
            return Err(ResilienceConfigError::DuplicatePolicy(
                policy.name().to_owned(),
            ));
        }
        self.by_name
            .insert(policy.name().to_owned(), self.policies.len());
        self.policies.push(policy);
        Ok(self)
    }

    /// Sends keys that start with `prefix` to the policy named `policy`, unless a longer
    /// prefix matches too. Errors if no policy has that name, or the prefix is empty or
    /// already routed.
    pub fn route_prefix(
        mut self,
        prefix: impl AsRef<[u8]>,
        policy: &str,
    ) -> Result<Self, ResilienceConfigError> {
        let prefix = prefix.as_ref();
        let index = *self
            .by_name
            .get(policy)
            .ok_or_else(|| ResilienceConfigError::UnknownPolicy(policy.to_owned()))?;
        if prefix.is_empty() || self.prefixes.iter().any(|(p, _)| **p == *prefix) {
            return Err(ResilienceConfigError::InvalidPrefix(
                String::from_utf8_lossy(prefix).into_owned(),
            ));
        }
        self.prefixes.push((prefix.into(), index));
        self.prefixes
            .sort_by(|(a, _), (b, _)| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        Ok(self)
    }

    /// The policy for `key`: the longest matching prefix rule's, or the default.
    pub fn classify(&self, key: &[u8]) -> &NamedPolicy {
        &self.policies[self.classify_index(key)]
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&NamedPolicy> {
        self.index_of(name).map(|i| &self.policies[i])
    }

    /// The default policy.
    pub fn default_policy(&self) -> &NamedPolicy {
        &self.policies[0]
    }

    /// Every policy, the default first, then in the order they were added.
    pub fn policies(&self) -> &[NamedPolicy] {
        &self.policies
    }

    pub(crate) fn classify_index(&self, key: &[u8]) -> usize {
        self.prefixes
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix))
            .map_or(0, |&(_, index)| index)
    }

    pub(crate) fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use rein_core::{Limit, Micros, Policy};

    use super::*;

    fn named(name: &str) -> NamedPolicy {
        let limit = Limit::fixed_window(10, Micros::from_secs(1)).unwrap();
        NamedPolicy::new(name, Policy::single(limit)).unwrap()
    }

    #[test]
    fn the_longest_prefix_wins_whatever_the_order_of_rules() {
        let build = |order: &[(&str, &str)]| {
            let mut table = PolicyTable::new(named("default"))
                .with_policy(named("user"))
                .unwrap()
                .with_policy(named("admin"))
                .unwrap();
            for (prefix, policy) in order {
                table = table.route_prefix(prefix, policy).unwrap();
            }
            table
        };
        let rules = [("u:", "user"), ("u:admin:", "admin")];
        let reversed = [rules[1], rules[0]];
        for table in [build(&rules), build(&reversed)] {
            #[rustfmt::skip]
            let rows = [
                ("u:admin:root", "admin"),
                ("u:alice", "user"),
                ("u:", "user"),
                ("u", "default"),
                ("x:u:alice", "default"),
                ("", "default"),
            ];
            for (key, policy) in rows {
                assert_eq!(table.classify(key.as_bytes()).name(), policy, "key {key:?}");
            }
        }
    }

    #[test]
    fn bad_tables_are_config_errors() {
        let table = PolicyTable::new(named("a"));
        assert_eq!(
            table.clone().with_policy(named("a")).err(),
            Some(ResilienceConfigError::DuplicatePolicy("a".into()))
        );
        assert_eq!(
            table.clone().route_prefix("p:", "b").err(),
            Some(ResilienceConfigError::UnknownPolicy("b".into()))
        );
        assert_eq!(
            table.clone().route_prefix("", "a").err(),
            Some(ResilienceConfigError::InvalidPrefix(String::new()))
        );
        let routed = table.route_prefix("p:", "a").unwrap();
        assert_eq!(
            routed.route_prefix("p:", "a").err(),
            Some(ResilienceConfigError::InvalidPrefix("p:".into()))
        );
    }
}
