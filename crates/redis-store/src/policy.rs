use std::sync::Arc;

use rein_core::{Algorithm, ConfigError, Limit, NamedPolicy, Policy, token_bucket::TokenBucket};

use crate::integer_window::IntegerWindow;
use crate::script::ScriptKind;

/// A [`NamedPolicy`] prepared for Redis: its keys' suffixes, which script it runs, and that
/// script's arguments, computed once. What [`RedisStore`](crate::RedisStore) decides with,
/// and its [`Limiter::Prepared`](rein_core::Limiter::Prepared) type.
///
/// The name becomes part of the policy's key, next to its limits' algorithms (see
/// docs/redis.md, "Key layout"), so two policies never share state and a policy whose shape
/// changes (a limit added, removed, reordered or of another algorithm) starts from fresh
/// state instead of reading a state of another shape. Changing only a limit's
/// numbers (a higher capacity, a longer window) keeps the stored state, which rein-core
/// reads safely under the new parameters; except a lone fixed window kept as one integer
/// (see docs/redis.md, "Stored state"), whose key names its window, so a new window length
/// (or a limit past what the integer holds) starts from fresh state.
///
/// The script's parameters are computed once here, not per call, and so is the choice of
/// script: a policy of one token bucket, fixed window or sliding log runs that algorithm's
/// lean script; any other policy runs the generic one (see docs/redis.md, "The scripts").
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
    /// The key format's version (key.rs): `v3` for a policy of one limit, `v4` for a
    /// policy of several, whose limits share one key.
    key_version: &'static str,
    /// The end of the policy's one key: `:<name>:0:<tag>` for one limit (the `v3` name,
    /// kept), `:<name>:<tag>+<tag>...` for several, in the policy's order, so a policy whose
    /// shape changes reads a fresh key.
    key_suffix: String,
    /// A lone fixed window whose state the lean script keeps as one integer
    /// (integer_window.rs); its key's tag then names the window.
    integer_window: Option<IntegerWindow>,
    /// The script this policy runs.
    script: ScriptKind,
    /// The script's arguments after the common header: for a lean script, its limit's
    /// parameters; for the generic script, each limit's tag, then its parameters. Shared
    /// by clones, whose decisions can then share a script call (see [`lane`](Self::lane)).
    script_args: Arc<[String]>,
    /// What the policy admitted and denied since a reporting store last took it
    /// (watch.rs); shared by clones.
    tally: crate::watch::Tally,
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
        let integer_window = match policy.limits() {
            [Limit::FixedWindow(w)] => IntegerWindow::new(w),
            _ => None,
        };
        let (key_version, key_suffix) = match (policy.limits(), integer_window) {
            (_, Some(layout)) => (KEY_V3, format!(":{name}:0:{}", layout.tag())),
            ([limit], None) => (KEY_V3, format!(":{name}:0:{}", limit.tag())),
            (limits, None) => {
                let tags: Vec<&str> = limits.iter().map(Limit::tag).collect();
                (KEY_V4, format!(":{name}:{}", tags.join("+")))
            }
        };
        let (script, script_args) = script_for(policy);
        Self {
            named: named.clone(),
            key_version,
            key_suffix,
            integer_window,
            script,
            script_args: script_args.into(),
            tally: crate::watch::Tally::default(),
        }
    }

    /// The counters a reporting store adds this policy's decisions to (watch.rs).
    pub(crate) fn tally(&self) -> &crate::watch::Tally {
        &self.tally
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

    /// The key format's version, `:v3` or `:v4` (key.rs).
    pub(crate) fn key_version(&self) -> &'static str {
        self.key_version
    }

    /// What follows the hash tag in the policy's key.
    pub(crate) fn key_suffix(&self) -> &str {
        &self.key_suffix
    }

    /// The integer layout of a lone fixed window's state, if it has one.
    pub(crate) fn integer_window(&self) -> Option<IntegerWindow> {
        self.integer_window
    }

    pub(crate) fn script(&self) -> ScriptKind {
        self.script
    }

    /// Which lane of the store this policy's decisions wait in to share a call
    /// (coalesce.rs): the same for every clone, so they share calls, and distinct for two
    /// policies alive at once (it is the address of their shared arguments). Decisions of
    /// one lane have the same script and arguments, which one call needs.
    pub(crate) fn lane(&self) -> usize {
        Arc::as_ptr(&self.script_args).cast::<()>() as usize
    }

    pub(crate) fn script_args(&self) -> &[String] {
        &self.script_args
    }
}

/// The key format of a policy of one limit (key.rs): its value is that limit's state alone.
/// Unchanged since version 3, so single-limit policies keep their keys across the upgrade.
const KEY_V3: &str = ":v3";

/// The key format of a policy of several limits (key.rs): one key, the limits' states
/// joined by `;` (issue 22).
const KEY_V4: &str = ":v4";

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
                args.push(limit.tag().to_owned());
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

#[cfg(test)]
mod tests {
    use rein_core::Micros;

    use super::*;

    fn named(limits: impl IntoIterator<Item = Limit>) -> RedisPolicy {
        RedisPolicy::new("p", Policy::new(limits).unwrap()).unwrap()
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
    fn a_lone_fixed_window_that_fits_an_integer_names_its_window_in_its_key() {
        let minute = Micros::from_secs(60);
        let window = |limit| Limit::fixed_window(limit, minute).unwrap();
        let lone = named([window(100)]);
        assert_eq!(
            (lone.key_version(), lone.key_suffix()),
            (":v3", ":p:0:fw60000000")
        );
        assert!(lone.integer_window().is_some());
        // 2^25 is half the modulus for a minute (2^26): the string form, the plain tag.
        let large = named([window(1 << 25)]);
        assert_eq!(
            (large.key_version(), large.key_suffix()),
            (":v3", ":p:0:fw")
        );
        assert_eq!(large.integer_window(), None);
        assert!(named([window((1 << 25) - 1)]).integer_window().is_some());
        // In a policy of several limits the generic script keeps the string.
        let bucket = Limit::token_bucket(5, 1, minute).unwrap();
        let two = named([window(100), bucket]);
        assert_eq!((two.key_version(), two.key_suffix()), (":v4", ":p:fw+tb"));
        assert_eq!(two.integer_window(), None);
    }

    #[test]
    fn a_fractional_emission_interval_splits_the_tolerance_into_us_and_units() {
        // 3 per second: one token every 333 333⅓ µs, so 1 000 000 / 3 units; a burst of 2
        // is 2 000 000 units = 666 666 µs and 2 units.
        let bucket = named([Limit::token_bucket(2, 3, Micros::from_secs(1)).unwrap()]);
        assert_eq!(bucket.script_args(), ["2", "1000000", "3", "666666", "2"]);
    }
}
