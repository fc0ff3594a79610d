use rein_core::{ConfigError, Limit, NamedPolicy, Policy};

/// A [`NamedPolicy`] prepared for Redis: its keys' suffixes and the script's arguments,
/// computed once. What [`RedisStore`](crate::RedisStore) decides with, and its
/// [`Limiter::Prepared`](rein_core::Limiter::Prepared) type.
///
/// The name becomes part of every key of the policy, next to each limit's index and
/// algorithm (see docs/redis.md, "Key layout"), so two policies never share state and a
/// policy whose shape changes (a limit added, removed, or of another algorithm) starts
/// from fresh state instead of reading a state of another shape. Changing only a limit's
/// numbers (a higher capacity, a longer window) keeps the stored state, which rein-core
/// reads safely under the new parameters.
///
/// The script's parameters are computed once here, not per call.
///
/// ```
/// use rein_core::{Limit, Micros, Policy};
/// use rein_redis::RedisPolicy;
///
/// let login = RedisPolicy::new(
///     "login",
///     Policy::new([
///         Limit::token_bucket(5, 1, Micros::from_secs(10))?,   // bursts of 5, 1 per 10 s
///         Limit::fixed_window(50, Micros::from_secs(86_400))?, // 50 a day
///     ])?,
/// )?;
/// assert_eq!(login.name(), "login");
/// assert_eq!(login.policy().capacity(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisPolicy {
    named: NamedPolicy,
    /// Per limit, in order: `:<name>:<index>:<tag>`, the end of its key.
    key_suffixes: Vec<String>,
    /// The script's per-limit arguments: each limit's tag, then its parameters.
    limit_args: Vec<String>,
}

impl RedisPolicy {
    /// Names `policy` and prepares it. Errors if the name is invalid (see [`NamedPolicy`]).
    pub fn new(name: impl Into<String>, policy: Policy) -> Result<Self, ConfigError> {
        Ok(Self::prepare(&NamedPolicy::new(name, policy)?))
    }

    /// Prepares `named` for the script.
    pub fn prepare(named: &NamedPolicy) -> Self {
        let name = named.name();
        let policy = named.policy();
        let mut key_suffixes = Vec::with_capacity(policy.limits().len());
        let mut limit_args = Vec::with_capacity(policy.limits().len() * 5);
        for (index, limit) in policy.limits().iter().enumerate() {
            let tag = algorithm_tag(limit);
            key_suffixes.push(format!(":{name}:{index}:{tag}"));
            limit_args.push(tag.to_owned());
            match limit {
                Limit::TokenBucket(bucket) => {
                    let (units_per_token, units_per_micro) = bucket.emission_interval();
                    // The core validated `capacity × units_per_token` to stay exact.
                    let tolerance = bucket.capacity() * units_per_token;
                    limit_args.extend(
                        [
                            bucket.capacity(),
                            units_per_token,
                            units_per_micro,
                            tolerance,
                        ]
                        .map(|n| n.to_string()),
                    );
                }
                Limit::FixedWindow(w) => {
                    limit_args.extend([w.limit(), w.window().as_micros()].map(|n| n.to_string()))
                }
                Limit::SlidingLog(w) => {
                    limit_args.extend([w.limit(), w.window().as_micros()].map(|n| n.to_string()))
                }
                Limit::SlidingCounter(w) => {
                    limit_args.extend([w.limit(), w.window().as_micros()].map(|n| n.to_string()))
                }
            }
        }
        Self {
            named: named.clone(),
            key_suffixes,
            limit_args,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.named.name()
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        self.named.policy()
    }

    /// The policy and its name.
    pub fn named(&self) -> &NamedPolicy {
        &self.named
    }

    pub(crate) fn key_suffixes(&self) -> &[String] {
        &self.key_suffixes
    }

    pub(crate) fn limit_args(&self) -> &[String] {
        &self.limit_args
    }
}

/// The short algorithm tag used in keys and in the script's arguments.
pub(crate) fn algorithm_tag(limit: &Limit) -> &'static str {
    match limit {
        Limit::TokenBucket(_) => "tb",
        Limit::FixedWindow(_) => "fw",
        Limit::SlidingLog(_) => "sl",
        Limit::SlidingCounter(_) => "sc",
    }
}
