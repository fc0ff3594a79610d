use rein_core::{Algorithm, ConfigError, Limit, NamedPolicy, Policy};

use crate::script::ScriptKind;

/// A [`NamedPolicy`] prepared for Redis: its keys' suffixes, which script it runs, and that
/// script's arguments, computed once. What [`RedisStore`](crate::RedisStore) decides with,
/// and its [`Limiter::Prepared`](rein_core::Limiter::Prepared) type.
///
/// The name becomes part of every key of the policy, next to each limit's index and
/// algorithm (see docs/redis.md, "Key layout"), so two policies never share state and a
/// policy whose shape changes (a limit added, removed, or of another algorithm) starts
/// from fresh state instead of reading a state of another shape. Changing only a limit's
/// numbers (a higher capacity, a longer window) keeps the stored state, which rein-core
/// reads safely under the new parameters.
///
/// The script's parameters are computed once here, not per call, and so is the choice of
/// script: a policy of one token bucket, fixed window or sliding log runs that algorithm's
/// lean script; any other policy runs the generic one (see docs/redis.md, "Scripts").
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
    /// The script this policy runs.
    script: ScriptKind,
    /// The script's arguments after the common header: for a lean script, its limit's
    /// parameters; for the generic script, each limit's tag, then its parameters.
    script_args: Vec<String>,
}

impl RedisPolicy {
    /// Names `policy` and prepares it. Errors if the name is invalid (see [`NamedPolicy`]).
    pub fn new(name: impl Into<String>, policy: Policy) -> Result<Self, ConfigError> {
        Ok(Self::prepare(&NamedPolicy::new(name, policy)?))
    }

    /// Prepares `named` for the scripts.
    pub fn prepare(named: &NamedPolicy) -> Self {
        let name = named.name();
        let policy = named.policy();
        let key_suffixes = policy
            .limits()
            .iter()
            .enumerate()
            .map(|(index, limit)| format!(":{name}:{index}:{}", limit.tag()))
            .collect();
        let (script, script_args) = script_for(policy);
        Self {
            named: named.clone(),
            key_suffixes,
            script,
            script_args,
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

    pub(crate) fn script(&self) -> ScriptKind {
        self.script
    }

    pub(crate) fn script_args(&self) -> &[String] {
        &self.script_args
    }
}

/// The script a policy runs and its precomputed arguments. Everything a lean script would
/// otherwise derive on every call (the tolerance split into whole µs and a remainder) is
/// computed here; the scripts still check every argument, as anyone with the ACL may call
/// them.
fn script_for(policy: &Policy) -> (ScriptKind, Vec<String>) {
    let strings = |numbers: &[u64]| numbers.iter().map(u64::to_string).collect();
    match policy.limits() {
        [Limit::TokenBucket(bucket)] => {
            let (units_per_token, units_per_micro) = bucket.emission_interval();
            // The core validated `capacity × units_per_token` to stay exact.
            let tolerance = bucket.capacity() * units_per_token;
            let (tol_us, tol_units) = (tolerance / units_per_micro, tolerance % units_per_micro);
            let args = [
                bucket.capacity(),
                units_per_token,
                units_per_micro,
                tol_us,
                tol_units,
            ];
            (ScriptKind::TokenBucket, strings(&args))
        }
        [Limit::FixedWindow(w)] => (
            ScriptKind::FixedWindow,
            strings(&[w.limit(), w.window().as_micros()]),
        ),
        [Limit::SlidingLog(w)] => (
            ScriptKind::SlidingLog,
            strings(&[w.limit(), w.window().as_micros()]),
        ),
        limits => {
            let mut args = Vec::with_capacity(limits.len() * 5);
            for limit in limits {
                args.push(limit.tag().to_owned());
                let params: Vec<u64> = match limit {
                    Limit::TokenBucket(bucket) => {
                        let (units_per_token, units_per_micro) = bucket.emission_interval();
                        let tolerance = bucket.capacity() * units_per_token;
                        vec![
                            bucket.capacity(),
                            units_per_token,
                            units_per_micro,
                            tolerance,
                        ]
                    }
                    Limit::FixedWindow(w) => vec![w.limit(), w.window().as_micros()],
                    Limit::SlidingLog(w) => vec![w.limit(), w.window().as_micros()],
                    Limit::SlidingCounter(w) => vec![w.limit(), w.window().as_micros()],
                };
                args.extend(params.iter().map(u64::to_string));
            }
            (ScriptKind::Policy, args)
        }
    }
}
