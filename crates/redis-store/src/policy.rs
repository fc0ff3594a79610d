use rein_core::{Limit, Policy, TokenBucket};

use crate::ConfigError;
use crate::script::ScriptKind;

/// A [`Policy`] under a name, ready to be sent to Redis.
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
/// lean script; any other policy runs the generic one (see docs/redis.md, "The scripts").
///
/// ```
/// use rein_core::{Limit, Micros, Policy};
/// use rein_redis::NamedPolicy;
///
/// let login = NamedPolicy::new(
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
pub struct NamedPolicy {
    name: String,
    policy: Policy,
    /// Per limit, in order: `:<name>:<index>:<tag>`, the end of its key.
    key_suffixes: Vec<String>,
    /// The script this policy runs.
    script: ScriptKind,
    /// The script's arguments after the common header: for a lean script, its limit's
    /// parameters; for the generic script, each limit's tag, then its parameters.
    script_args: Vec<String>,
}

impl NamedPolicy {
    /// Names `policy`. Errors if the name is empty, longer than 64 bytes, or holds anything
    /// but ASCII letters, digits, `_`, `-` and `.`.
    pub fn new(name: impl Into<String>, policy: Policy) -> Result<Self, ConfigError> {
        let name = name.into();
        let valid = (1..=MAX_NAME_LEN).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid {
            return Err(ConfigError::InvalidPolicyName(name));
        }
        let key_suffixes = policy
            .limits()
            .iter()
            .enumerate()
            .map(|(index, limit)| format!(":{name}:{index}:{}", algorithm_tag(limit)))
            .collect();
        let (script, script_args) = script_for(&policy);
        Ok(Self {
            name,
            policy,
            key_suffixes,
            script,
            script_args,
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
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
    let strings = |numbers: &[u64]| numbers.iter().map(u64::to_string).collect::<Vec<_>>();
    match policy.limits() {
        [Limit::TokenBucket(bucket)] => (ScriptKind::TokenBucket, bucket_args(bucket)),
        [Limit::FixedWindow(w)] => (
            ScriptKind::FixedWindow,
            strings(&[w.limit(), w.window().as_micros()]),
        ),
        [Limit::SlidingLog(w)] => (
            ScriptKind::SlidingLog,
            strings(&[w.limit(), w.window().as_micros()]),
        ),
        limits => {
            let mut args = Vec::with_capacity(limits.len() * 6);
            for limit in limits {
                args.push(algorithm_tag(limit).to_owned());
                match limit {
                    Limit::TokenBucket(bucket) => args.extend(bucket_args(bucket)),
                    Limit::FixedWindow(w) => {
                        args.extend(strings(&[w.limit(), w.window().as_micros()]))
                    }
                    Limit::SlidingLog(w) => {
                        args.extend(strings(&[w.limit(), w.window().as_micros()]))
                    }
                    Limit::SlidingCounter(w) => {
                        args.extend(strings(&[w.limit(), w.window().as_micros()]))
                    }
                }
            }
            (ScriptKind::Policy, args)
        }
    }
}

/// A token bucket's parameters, as both scripts take them: capacity, units_per_token,
/// units_per_micro, and the tolerance (`capacity × units_per_token`, which the core
/// validated to stay exact) split into whole µs and a remainder in units, as `tat` is.
fn bucket_args(bucket: &TokenBucket) -> Vec<String> {
    let (units_per_token, units_per_micro) = bucket.emission_interval();
    let tolerance = bucket.capacity() * units_per_token;
    [
        bucket.capacity(),
        units_per_token,
        units_per_micro,
        tolerance / units_per_micro,
        tolerance % units_per_micro,
    ]
    .iter()
    .map(u64::to_string)
    .collect()
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

/// The longest policy name: it is repeated in every key of the policy.
const MAX_NAME_LEN: usize = 64;

#[cfg(test)]
mod tests {
    use rein_core::Micros;

    use super::*;

    fn named(limits: impl IntoIterator<Item = Limit>) -> NamedPolicy {
        NamedPolicy::new("p", Policy::new(limits).unwrap()).unwrap()
    }

    #[test]
    fn one_limit_runs_its_lean_script_and_several_the_policy_script() {
        // docs/redis.md's example: 20 tokens, 5 per second (one every 200 000 µs).
        let bucket = Limit::token_bucket(20, 5, Micros::from_secs(1)).unwrap();
        let window = Limit::fixed_window(100, Micros::from_secs(60)).unwrap();
        let one = named([bucket]);
        assert_eq!(one.script(), ScriptKind::TokenBucket);
        assert_eq!(one.script_args(), ["20", "200000", "1", "4000000", "0"]);
        let two = named([bucket, window]);
        assert_eq!(two.script(), ScriptKind::Policy);
        assert_eq!(
            two.script_args(),
            [
                "tb", "20", "200000", "1", "4000000", "0", "fw", "100", "60000000"
            ]
        );
        let log = named([Limit::sliding_log(5, Micros::from_secs(1)).unwrap()]);
        assert_eq!(
            (log.script(), log.script_args()),
            (
                ScriptKind::SlidingLog,
                &["5".to_owned(), "1000000".to_owned()][..]
            )
        );
        let counter = named([Limit::sliding_counter(5, Micros::from_secs(1)).unwrap()]);
        assert_eq!(counter.script(), ScriptKind::Policy);
        assert_eq!(counter.script_args(), ["sc", "5", "1000000"]);
    }

    #[test]
    fn a_fractional_emission_interval_splits_the_tolerance_into_us_and_units() {
        // 3 per second: one token every 333 333⅓ µs, so 1 000 000 / 3 units; a burst of 2
        // is 2 000 000 units = 666 666 µs and 2 units.
        let bucket = named([Limit::token_bucket(2, 3, Micros::from_secs(1)).unwrap()]);
        assert_eq!(bucket.script_args(), ["2", "1000000", "3", "666666", "2"]);
    }
}
