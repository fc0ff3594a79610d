//! [`Config`]: limits, routes and the Redis connection from a TOML file, validated in full
//! when loaded, with every error pointing at a line and a field path
//! (`line 9: policies.search.limits[1].window: invalid type: integer `3`, expected a
//! duration such as "250ms" or "1m"`).
//!
//! Loading is two passes. serde reads the file into private `Raw*` types that mirror it
//! (through `serde_path_to_error`, which tracks the field path, and toml's spans, which give
//! the line); then validation turns them into the public typed [`Config`], checking what
//! types cannot say (a limit's fields for its algorithm, a route's policy exists). Building
//! from a `Config` cannot fail on anything the file says, only on the Redis connection.
//! docs/config.md documents every field.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use rein::lease::{LEASED_CALLS, LeaseConfigError, MaybeLeased, resilient_deadline};
use rein::{FailurePolicy, LeaseConfig, PolicyTable, ResilienceConfigError, ResilientLimiter};
use rein_core::limiter::DEADLINE_MARGIN;
use rein_core::{Leasable, Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_redis::{ConnectError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX, RedisStoreBuilder};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use thiserror::Error;
use toml::Spanned;

use crate::{
    AdmittedHeaders, Answer, ConfiguredLimiter, ConfiguredStore, KeySource, LayerError,
    RateLimitLayer, Route,
};

/// The methods a config file's route may name: RFC 9110's, PATCH (RFC 5789) and QUERY.
const STANDARD_METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "QUERY",
];

/// A validated configuration: what a file declares, in rein's types.
///
/// ```
/// use rein_tower::Config;
///
/// let config: Config = r#"
///     [redis]
///     url = "redis://127.0.0.1:6379/"
///
///     [policies.api]
///     limits = [{ algorithm = "token_bucket", capacity = 100, refill = 10, period = "1s" }]
///
///     [[routes]]
///     prefix = "/api"
///     policy = "api"
/// "#.parse()?;
/// assert_eq!(config.policies[0].name(), "api");
/// assert_eq!(config.routes[0].policy_name(), Some("api"));
/// # Ok::<(), rein_tower::LoadError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    /// `[redis]`: where the shared state lives.
    pub redis: RedisSettings,
    /// `[failure]`: what the limiter answers while Redis does not (default fail open).
    pub failure: FailurePolicy,
    /// `[leases]`: decide hot keys from leases, blocks of each limit reserved in Redis and
    /// spent in process, still exact (docs/leases.md); `None` without the table.
    pub leases: Option<LeaseConfig>,
    /// `[policies.*]`: every named policy, in name order.
    pub policies: Vec<NamedPolicy>,
    /// The names of the policies with `shadow = true`: decided and counted as usual, but
    /// what they would deny is let through (see [`RateLimitLayerBuilder::shadow`]).
    ///
    /// [`RateLimitLayerBuilder::shadow`]: crate::RateLimitLayerBuilder::shadow
    pub shadow: Vec<String>,
    /// `[http]`: the layer's settings.
    pub http: HttpSettings,
    /// `[[routes]]`, in file order, then `http.default_policy` as a catch-all if set.
    pub routes: Vec<Route>,
}

/// `[redis]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisSettings {
    /// `url` or `cluster`.
    pub endpoint: RedisEndpoint,
    /// `deadline`: the longest one decision may take (default 50 ms).
    pub deadline: Duration,
    /// `connect_timeout`: the longest a connect may take (default 1 s).
    pub connect_timeout: Duration,
    /// `key_prefix`: the first part of every Redis key (default `rein`), checked when the
    /// file is loaded.
    pub key_prefix: String,
    /// `overrides_staleness`: how stale the per-key overrides kept in Redis (`rein override
    /// set`) may be in this process (default 1 s; `rein_redis::RedisStoreBuilder::overrides`).
    pub overrides_staleness: Duration,
    /// `report_counts`: whether this process reports what each policy admits and denies to
    /// Redis once a second, for `rein watch` (default `true`;
    /// `rein_redis::RedisStoreBuilder::report_counts`).
    pub report_counts: bool,
}

/// Where Redis is: `redis.url` or `redis.cluster`.
pub use rein_redis::Endpoint as RedisEndpoint;

/// `[http]`.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// `key`: the key of routes that set none (default the peer IP).
    pub default_key: KeySource,
    /// `on_missing_key` (default 500).
    pub on_missing_key: Answer,
    /// `on_unavailable` (default 503).
    pub on_unavailable: Answer,
    /// `admitted_headers` (default `ratelimit`).
    pub admitted_headers: AdmittedHeaders,
    /// `deadline`: the layer's own bound on a decision (default the limiter's plus 5 ms).
    /// Longer than the limiter's ([`resilient_deadline`]: `redis.deadline` plus 5 ms, times
    /// 2 with `[leases]`), so that the failure policy answers first.
    pub deadline: Option<Duration>,
}

/// Why a configuration file could not be loaded. Every variant but [`Read`](Self::Read)
/// names the line and the field; fix the file there.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read. Check the path and its permissions.
    #[error("cannot read the config file {path}: {source}")]
    Read {
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML (an unclosed string, a duplicate key).
    #[error(
        "{}line {line}, column {column}: invalid TOML: {message}",
        in_file(file)
    )]
    Syntax {
        /// The file, when the text was read from one ([`Config::load`]).
        file: Option<PathBuf>,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What the TOML parser expected.
        message: String,
    },
    /// A field is missing, unknown, of the wrong type, or has a value that is not allowed
    /// (a duration that does not parse, a zero deadline, both `url` and `cluster`).
    #[error("{}line {line}: {path}: {message}", in_file(file))]
    Field {
        /// The file, when the text was read from one ([`Config::load`]).
        file: Option<PathBuf>,
        /// The field's path, e.g. `policies.search.limits[1].window`.
        path: String,
        /// 1-based line: the value's, or for a missing field the line of the table that
        /// lacks it (1 for the file's top level).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A limit's numbers are rejected by rein-core (zero, or too large to stay exact).
    #[error("{}line {line}: {path}: {source}", in_file(file))]
    Limit {
        /// The file, when the text was read from one ([`Config::load`]).
        file: Option<PathBuf>,
        /// The limit's path, e.g. `policies.search.limits[0]`.
        path: String,
        /// 1-based line.
        line: usize,
        /// rein-core's reason.
        source: rein_core::ConfigError,
    },
    /// A route or `http.default_policy` names a policy the file does not declare. Declare
    /// it under `[policies.NAME]` or fix the name.
    #[error(
        "{}line {line}: {path}: no policy named {name:?}; declare it as [policies.{name}]",
        in_file(file)
    )]
    UnknownPolicy {
        /// The file, when the text was read from one ([`Config::load`]).
        file: Option<PathBuf>,
        /// The path of the field naming it.
        path: String,
        /// 1-based line.
        line: usize,
        /// The name given.
        name: String,
    },
}

/// `FILE: ` for an error in a file, nothing for one in a string.
fn in_file(file: &Option<PathBuf>) -> String {
    file.as_ref()
        .map_or_else(String::new, |file| format!("{}: ", file.display()))
}

impl LoadError {
    /// The error, naming `file` as where it is.
    fn in_file(mut self, path: &Path) -> Self {
        match &mut self {
            LoadError::Read { .. } => {}
            LoadError::Syntax { file, .. }
            | LoadError::Field { file, .. }
            | LoadError::Limit { file, .. }
            | LoadError::UnknownPolicy { file, .. } => *file = Some(path.to_owned()),
        }
        self
    }
}

/// Why [`Config::build`] could not give a layer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Connecting to Redis failed; see [`ConnectError`] for each cause and its fix.
    #[error("cannot connect to Redis: {0}")]
    Connect(#[from] ConnectError),
    /// The resilient limiter rejected the settings; see [`ResilienceConfigError`].
    #[error(transparent)]
    Resilience(#[from] ResilienceConfigError),
    /// The layer rejected the settings; see [`LayerError`].
    #[error(transparent)]
    Layer(#[from] LayerError),
}

impl Config {
    /// Reads and validates the file at `path`. Every error names the file, and where in it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref();
        Self::from_text(path, &Self::read_text(path)?)
    }

    /// The text of the file at `path`, or the error naming it.
    pub(crate) fn read_text(path: &Path) -> Result<String, LoadError> {
        std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })
    }

    /// Validates `text`, read from the file at `path` (which errors name).
    pub(crate) fn from_text(path: &Path, text: &str) -> Result<Self, LoadError> {
        text.parse().map_err(|e: LoadError| e.in_file(path))
    }

    /// The policy table of a resilient limiter: every policy, the first (by name) as the
    /// table's default. The layer picks policies by name, so which is default does not
    /// matter to it.
    pub fn policy_table(&self) -> Result<PolicyTable, ResilienceConfigError> {
        let mut policies = self.policies.iter().cloned();
        // Validation guarantees at least one policy; a table needs a default.
        let Some(first) = policies.next() else {
            return Err(ResilienceConfigError::UnknownPolicy(String::new()));
        };
        policies.try_fold(PolicyTable::new(first), PolicyTable::with_policy)
    }

    /// A `rein::ResilientLimiter` over `store` with the file's policies and failure policy,
    /// without leases whatever `[leases]` says: a limiter that decides every request
    /// through the store, and that leases can be taken over (it is [`Leasable`] where
    /// `store` is). [`limiter`](Self::limiter) applies `[leases]`.
    pub fn resilient<S: Limiter>(
        &self,
        store: S,
    ) -> Result<ResilientLimiter<S>, ResilienceConfigError> {
        ResilientLimiter::builder(store, self.policy_table()?, self.failure).build()
    }

    /// The limiter the file describes over `store`: [`resilient`](Self::resilient)'s, with
    /// leases on if the file has `[leases]` (one type either way). [`build`](Self::build)
    /// and the [`Reloader`](crate::Reloader) serve with it.
    pub fn limiter<S: Leasable + 'static>(
        &self,
        store: S,
    ) -> Result<ResilientLimiter<S, MaybeLeased<S>>, ResilienceConfigError> {
        let builder = ResilientLimiter::builder(store, self.policy_table()?, self.failure);
        Ok(match &self.leases {
            Some(leases) => builder.leases(*leases).build()?.into(),
            None => builder.build()?.into(),
        })
    }

    /// The layer over any `limiter`, with the file's policies, routes and `[http]` settings.
    pub fn layer<L: Limiter>(&self, limiter: L) -> Result<RateLimitLayer<L>, LayerError> {
        let mut builder = RateLimitLayer::builder(limiter)
            .default_key(self.http.default_key.clone())
            .on_missing_key(self.http.on_missing_key)
            .on_unavailable(self.http.on_unavailable)
            .admitted_headers(self.http.admitted_headers);
        if let Some(deadline) = self.http.deadline {
            builder = builder.deadline(deadline);
        }
        for policy in &self.policies {
            builder = builder.policy(policy.clone());
        }
        for name in &self.shadow {
            builder = builder.shadow(name.clone());
        }
        for route in &self.routes {
            builder = builder.route(route.clone());
        }
        builder.build()
    }

    /// Connects to the Redis of `[redis]` (and loads rein's script there).
    pub async fn connect_store(&self) -> Result<ConfiguredStore, ConnectError> {
        let builder = RedisStoreBuilder::new()
            .prefix(self.redis.key_prefix.clone())
            .deadline(self.redis.deadline)
            .connect_timeout(self.redis.connect_timeout)
            .overrides(self.redis.overrides_staleness)
            .report_counts(self.redis.report_counts);
        builder.connect_to(&self.redis.endpoint).await
    }

    /// Everything the file describes: connects to Redis, builds the resilient limiter over
    /// it ([`limiter`](Self::limiter): with leases if the file has `[leases]`), and the
    /// layer over that. The limiter is [`RateLimitLayer::limiter`]; with leases, call its
    /// `shutdown` before exiting to give back what they hold.
    pub async fn build(&self) -> Result<RateLimitLayer<ConfiguredLimiter>, BuildError> {
        let store = self.connect_store().await?;
        let limiter = self.limiter(store)?;
        Ok(self.layer(limiter)?)
    }
}

impl FromStr for Config {
    type Err = LoadError;

    /// Parses and validates a TOML document.
    fn from_str(text: &str) -> Result<Self, LoadError> {
        let document = toml::Deserializer::parse(text).map_err(|e| syntax(text, &e))?;
        let raw: RawConfig = serde_path_to_error::deserialize(document).map_err(|e| {
            let path = field_path(e.path());
            let inner = e.into_inner();
            LoadError::Field {
                file: None,
                path: if path.is_empty() {
                    // An error about the document as a whole (serde names no field).
                    "(file)".to_owned()
                } else {
                    path
                },
                // toml gives every value error a span; the start of the file otherwise.
                line: inner.span().map_or(1, |span| line_of(text, span.start)),
                message: inner.message().to_owned(),
            }
        })?;
        Validator { text }.config(raw)
    }
}

/// Turns the raw file into a [`Config`], with lines from `text`.
struct Validator<'a> {
    text: &'a str,
}

impl Validator<'_> {
    fn config(&self, raw: RawConfig) -> Result<Config, LoadError> {
        let Some(raw_redis) = raw.redis else {
            return Err(field(
                "redis",
                1,
                "missing: add a [redis] table, e.g. url = \"redis://127.0.0.1:6379/\"",
            ));
        };
        let redis = self.redis(raw_redis)?;
        let failure = match raw.failure {
            None => FailurePolicy::FailOpen,
            Some(failure) => self.failure(failure)?,
        };
        let leases = raw
            .leases
            .map(|leases| self.leases(leases, redis.deadline))
            .transpose()?;
        if raw.policies.is_empty() {
            return Err(field(
                "policies",
                1,
                "missing: declare at least one policy, e.g. [policies.api]",
            ));
        }
        let policies = raw
            .policies
            .iter()
            .map(|(name, policy)| self.policy(name, policy))
            .collect::<Result<Vec<_>, _>>()?;
        let names: Vec<&str> = policies.iter().map(NamedPolicy::name).collect();
        let shadow = raw
            .policies
            .iter()
            .filter(|(_, policy)| policy.get_ref().shadow == Some(true))
            .map(|(name, _)| name.clone())
            .collect();
        let raw_http = raw.http.unwrap_or_default();
        let mut routes = raw
            .routes
            .iter()
            .enumerate()
            .map(|(index, route)| self.route(index, route, &policies))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(default) = &raw_http.default_policy {
            self.known_policy("http.default_policy", default, &names)?;
            routes.push(Route::any().policy(default.get_ref().clone()));
        }
        let http = HttpSettings {
            default_key: match &raw_http.key {
                Some(key) => self.key("http.key", key)?,
                None => KeySource::peer_ip(),
            },
            on_missing_key: raw_http
                .on_missing_key
                .unwrap_or(Answer::Status(StatusCode::INTERNAL_SERVER_ERROR)),
            on_unavailable: raw_http
                .on_unavailable
                .unwrap_or(Answer::Status(StatusCode::SERVICE_UNAVAILABLE)),
            admitted_headers: match raw_http.admitted_headers {
                None | Some(RawAdmitted::Ratelimit) => AdmittedHeaders::RateLimit,
                Some(RawAdmitted::None) => AdmittedHeaders::None,
                Some(RawAdmitted::All) => AdmittedHeaders::All,
            },
            deadline: match &raw_http.deadline {
                None => None,
                Some(deadline) => {
                    Some(self.layer_deadline(deadline, redis.deadline, leases.is_some())?)
                }
            },
        };
        if let Some((first, second)) = crate::route::mixed_key_sources(&routes, &http.default_key) {
            // The later route names the conflict: `http.default_policy`'s is the last.
            let (at, line) = match raw.routes.get(second) {
                // A route without its own key counts by `http.key`.
                Some(route) if route.get_ref().key.is_none() => {
                    (format!("routes[{second}]"), self.line(route))
                }
                Some(route) => (format!("routes[{second}].key"), self.line(route)),
                None => (
                    "http.default_policy".to_owned(),
                    raw_http.default_policy.as_ref().map_or(1, |d| self.line(d)),
                ),
            };
            let key = |route: &Route| route.key.as_ref().unwrap_or(&http.default_key).describe();
            return Err(field(
                &at,
                line,
                &format!(
                    "policy {:?} is counted here by {} and by route {:?} by {}: a client could \
                     send another's key and spend its limit; give each its own policy",
                    routes[second].policy_name().unwrap_or_default(),
                    key(&routes[second]),
                    routes[first].name(),
                    key(&routes[first]),
                ),
            ));
        }
        Ok(Config {
            redis,
            failure,
            leases,
            policies,
            shadow,
            http,
            routes,
        })
    }

    fn redis(&self, raw: Spanned<RawRedis>) -> Result<RedisSettings, LoadError> {
        let line = self.line(&raw);
        let raw = raw.into_inner();
        if let Some(old) = &raw.prefix {
            return Err(field(
                "redis.prefix",
                self.line(old),
                "renamed to `key_prefix` (a route's `prefix` is a path prefix; this one \
                 starts every Redis key)",
            ));
        }
        // Each URL is parsed here, so that a malformed one is a load error with its line,
        // before anything connects.
        let parsed = |name: &str, line: usize, url: &str| {
            redis::IntoConnectionInfo::into_connection_info(url)
                .map(|_| url.to_owned())
                .map_err(|e| {
                    field(
                        name,
                        line,
                        &format!("not a Redis URL (redis://host:port/ or rediss://...): {e}"),
                    )
                })
        };
        let endpoint = match (raw.url, raw.cluster) {
            (Some(url), None) => {
                RedisEndpoint::Url(parsed("redis.url", self.line(&url), url.get_ref())?)
            }
            (None, Some(nodes)) if !nodes.get_ref().is_empty() => RedisEndpoint::Cluster(
                nodes
                    .get_ref()
                    .iter()
                    .enumerate()
                    .map(|(i, url)| {
                        parsed(
                            &format!("redis.cluster[{i}]"),
                            self.line(url),
                            url.get_ref(),
                        )
                    })
                    .collect::<Result<_, _>>()?,
            ),
            (None, Some(nodes)) => {
                return Err(field(
                    "redis.cluster",
                    self.line(&nodes),
                    "list at least one node URL",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(field("redis", line, "set `url` or `cluster`, not both"));
            }
            (None, None) => {
                return Err(field(
                    "redis",
                    line,
                    "set `url` (e.g. \"redis://127.0.0.1:6379/\") or `cluster`",
                ));
            }
        };
        let key_prefix = match raw.key_prefix {
            None => DEFAULT_PREFIX.to_owned(),
            Some(prefix) => {
                // The store checks it again when it connects; checked here so that a bad
                // prefix is a load error with its line, before anything connects.
                rein_redis::check_key_prefix(prefix.get_ref()).map_err(|_| {
                    field(
                        "redis.key_prefix",
                        self.line(&prefix),
                        "1 to 64 printable ASCII bytes, no spaces or braces",
                    )
                })?;
                prefix.into_inner()
            }
        };
        Ok(RedisSettings {
            endpoint,
            deadline: match &raw.deadline {
                Some(d) => self.positive("redis.deadline", d)?,
                None => DEFAULT_DEADLINE,
            },
            connect_timeout: match &raw.connect_timeout {
                Some(d) => self.positive("redis.connect_timeout", d)?,
                None => DEFAULT_CONNECT_TIMEOUT,
            },
            key_prefix,
            overrides_staleness: match &raw.overrides_staleness {
                Some(d) => self.positive("redis.overrides_staleness", d)?,
                None => rein_redis::DEFAULT_OVERRIDES_STALENESS,
            },
            report_counts: raw.report_counts.is_none_or(Spanned::into_inner),
        })
    }

    /// `[leases]`, checked ([`LeaseConfig::check_over_store`]) over a store of deadline
    /// `store`, at the table's line: what the limiter's build would refuse.
    fn leases(&self, raw: Spanned<RawLeases>, store: Duration) -> Result<LeaseConfig, LoadError> {
        let table = self.table("leases", &raw);
        let raw = raw.get_ref();
        let nodes = table.needs(
            raw.expected_nodes.as_ref(),
            "expected_nodes",
            "missing: how many servers share the limits (each lease asks for about its share)",
        )?;
        let mut config = LeaseConfig {
            expected_nodes: self.nodes("leases.expected_nodes", nodes)?,
            ..LeaseConfig::default()
        };
        if let Some(interval) = &raw.renew_interval {
            config.renew_interval = Micros::from(self.positive("leases.renew_interval", interval)?);
        }
        let message = match config.check_over_store(Some(store)) {
            Ok(()) => return Ok(config),
            // The file does not set the flight timeout: the deadline is what to change.
            Err(LeaseConfigError::FlightTimeout {
                flight_timeout,
                deadline,
            }) => format!(
                "redis.deadline with the limiter's margin ({deadline:?}) is longer than the \
                 leases' flight timeout ({flight_timeout:?}): a grant that comes back later \
                 would be stranded; shorten redis.deadline"
            ),
            Err(other) => other.to_string(),
        };
        Err(field("leases", table.line, &message))
    }

    fn failure(&self, raw: Spanned<RawFailure>) -> Result<FailurePolicy, LoadError> {
        let line = self.line(&raw);
        let raw = raw.into_inner();
        let Some(policy) = raw.policy else {
            return Err(field(
                "failure.policy",
                line,
                "missing: \"fail_open\", \"fail_closed\" or \"local_fallback\"",
            ));
        };
        Ok(match (policy, raw.expected_nodes) {
            (RawFailurePolicy::FailOpen, None) => FailurePolicy::FailOpen,
            (RawFailurePolicy::FailClosed, None) => FailurePolicy::FailClosed,
            (RawFailurePolicy::LocalFallback, Some(nodes)) => FailurePolicy::LocalFallback {
                expected_nodes: self.nodes("failure.expected_nodes", &nodes)?,
            },
            (RawFailurePolicy::LocalFallback, None) => {
                return Err(field(
                    "failure.expected_nodes",
                    line,
                    "local_fallback needs the number of servers sharing the limits",
                ));
            }
            (_, Some(nodes)) => {
                return Err(field(
                    "failure.expected_nodes",
                    self.line(&nodes),
                    "only used with policy = \"local_fallback\"",
                ));
            }
        })
    }

    fn policy(&self, name: &str, raw: &Spanned<RawPolicy>) -> Result<NamedPolicy, LoadError> {
        let path = format!("policies.{name}");
        let line = self.line(raw);
        let Some(limits) = &raw.get_ref().limits else {
            return Err(field(
                &format!("{path}.limits"),
                line,
                "missing: a list of limits, e.g. [{ algorithm = \"fixed_window\", \
                 limit = 100, window = \"1m\" }]",
            ));
        };
        let limits = limits
            .iter()
            .enumerate()
            .map(|(index, limit)| self.limit(&format!("{path}.limits[{index}]"), limit))
            .collect::<Result<Vec<_>, _>>()?;
        let policy = Policy::new(limits).map_err(|source| LoadError::Limit {
            file: None,
            path: format!("{path}.limits"),
            line,
            source,
        })?;
        NamedPolicy::new(name, policy).map_err(|_| {
            field(
                &path,
                line,
                "a policy name is 1 to 64 ASCII letters, digits, `_`, `-` or `.`",
            )
        })
    }

    fn limit(&self, path: &str, raw: &Spanned<RawLimit>) -> Result<Limit, LoadError> {
        let table = self.table(path, raw);
        let limit = raw.get_ref();
        let kind = table.needs(
            limit.algorithm,
            "algorithm",
            "missing: \"token_bucket\", \"fixed_window\", \"sliding_log\" or \
             \"sliding_counter\"",
        )?;
        let algorithm = kind.as_str();
        let kind_of = format!("a {algorithm} limit");
        let missing = |name: &str| format!("missing: {kind_of} needs `{name}`");
        let need = |value: Option<Whole<u64>>, name: &str| {
            table.needs(value.map(|n| n.0), name, &missing(name))
        };
        let need_duration = |value: Option<Dur>, name: &str| {
            table.needs(value.map(|d| Micros::from(d.0)), name, &missing(name))
        };
        let refuse = |present: bool, name: &str| table.refuse(present, name, &kind_of);
        let built = match kind {
            RawAlgorithm::TokenBucket => {
                refuse(limit.limit.is_some(), "limit")?;
                refuse(limit.window.is_some(), "window")?;
                Limit::token_bucket(
                    need(limit.capacity, "capacity")?,
                    need(limit.refill, "refill")?,
                    need_duration(limit.period, "period")?,
                )
            }
            window => {
                refuse(limit.capacity.is_some(), "capacity")?;
                refuse(limit.refill.is_some(), "refill")?;
                refuse(limit.period.is_some(), "period")?;
                let count = need(limit.limit, "limit")?;
                let span = need_duration(limit.window, "window")?;
                match window {
                    RawAlgorithm::FixedWindow => Limit::fixed_window(count, span),
                    RawAlgorithm::SlidingLog => Limit::sliding_log(count, span),
                    _ => Limit::sliding_counter(count, span),
                }
            }
        };
        built.map_err(|source| LoadError::Limit {
            file: None,
            path: path.to_owned(),
            line: table.line,
            source,
        })
    }

    fn route(
        &self,
        index: usize,
        raw: &Spanned<RawRoute>,
        declared: &[NamedPolicy],
    ) -> Result<Route, LoadError> {
        let path = format!("routes[{index}]");
        let line = self.line(raw);
        let r = raw.get_ref();
        let names: Vec<&str> = declared.iter().map(NamedPolicy::name).collect();
        let policies = names.as_slice();
        // A request's path starts with `/` and holds no query: another pattern never
        // matches, and the route would be silently unlimited.
        let url_path = |name: &str, value: &str| {
            if !value.starts_with('/') || value.contains(['?', '#']) {
                Err(field(
                    &format!("{path}.{name}"),
                    line,
                    "a request path starts with `/` and has no `?` or `#`: this pattern \
                     would match no request",
                ))
            } else if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
                // A request target holds none: the path is compared as sent, encoded.
                Err(field(
                    &format!("{path}.{name}"),
                    line,
                    "a request path holds no spaces or control characters (they arrive \
                     percent-encoded: write `%20` for a space): this pattern would match no \
                     request",
                ))
            } else if value.contains(['{', '}', '*']) {
                // A router's syntax: rein compares paths as written.
                Err(field(
                    &format!("{path}.{name}"),
                    line,
                    "`{..}` and `*` are a router's syntax; rein matches `path` exactly and \
                     `prefix` by its start, as written: this pattern would match no request \
                     (for `/users/{id}`, write `prefix = \"/users/\"`)",
                ))
            } else {
                Ok(value.to_owned())
            }
        };
        let mut route = match (&r.path, &r.prefix) {
            (Some(exact), None) => Route::exact(url_path("path", exact)?),
            (None, Some(prefix)) => Route::prefix(url_path("prefix", prefix)?),
            (None, None) => Route::any(),
            (Some(_), Some(_)) => {
                return Err(field(&path, line, "set `path` or `prefix`, not both"));
            }
        };
        if r.methods.as_ref().is_some_and(Vec::is_empty) {
            return Err(field(
                &format!("{path}.methods"),
                line,
                "list at least one method, or leave `methods` out for every method",
            ));
        }
        for (i, method) in r.methods.iter().flatten().enumerate() {
            // Any token is an HTTP method to the `http` crate, so a misspelling (`PSOT`)
            // would load and match nothing, leaving the route unlimited: only the standard
            // methods are taken here (another one is for a route made in code).
            let upper = method.get_ref().to_ascii_uppercase();
            let parsed = STANDARD_METHODS
                .contains(&upper.as_str())
                .then(|| Method::from_bytes(upper.as_bytes()).ok())
                .flatten()
                .ok_or_else(|| {
                    field(
                        &format!("{path}.methods[{i}]"),
                        self.line(method),
                        &format!(
                            "not a standard HTTP method (one of {}); a route for another \
                             method is made in code, with `Route::method`",
                            STANDARD_METHODS.join(", ")
                        ),
                    )
                })?;
            route = route.method(parsed);
        }
        if let Some(name) = &r.name {
            route = route.named(name.clone());
        }
        route = match (&r.policy, r.exempt) {
            (Some(policy), None | Some(false)) => {
                self.known_policy(&format!("{path}.policy"), policy, policies)?;
                route.policy(policy.get_ref().clone())
            }
            (None, Some(true)) => {
                // What only a limited route uses would be silently ignored.
                let unused = [
                    ("cost", r.cost.is_some()),
                    ("peek", r.peek.is_some()),
                    ("key", r.key.is_some()),
                ];
                if let Some((name, _)) = unused.iter().find(|(_, set)| *set) {
                    return Err(field(
                        &format!("{path}.{name}"),
                        line,
                        "an exempt route is not limited: it has no cost, peek or key",
                    ));
                }
                route.exempt()
            }
            (Some(_), Some(true)) => {
                return Err(field(&path, line, "an exempt route has no `policy`"));
            }
            (None, _) => {
                return Err(field(
                    &path,
                    line,
                    "set `policy = \"NAME\"` or `exempt = true`",
                ));
            }
        };
        if let Some(cost) = r.cost {
            // A cost no limit of the policy can hold answers every request 413: refused
            // here rather than served.
            let capacity = r.policy.as_ref().and_then(|name| {
                let named = declared.iter().find(|p| p.name() == name.get_ref())?;
                Some(named.policy().capacity())
            });
            if let Some(capacity) = capacity.filter(|&capacity| cost.0 > capacity) {
                return Err(field(
                    &format!("{path}.cost"),
                    line,
                    &format!(
                        "{} is more than the policy's capacity ({capacity}): every request \
                         would be refused",
                        cost.0
                    ),
                ));
            }
            route = route.cost(cost.0);
        }
        if r.peek == Some(true) {
            route = route.peek_only();
        }
        if let Some(key) = &r.key {
            route = route.key(self.key(&format!("{path}.key"), key)?);
        }
        Ok(route)
    }

    fn key(&self, path: &str, raw: &Spanned<RawKey>) -> Result<KeySource, LoadError> {
        let table = self.table(path, raw);
        let key = raw.get_ref();
        let from = table.needs(
            key.from,
            "from",
            "missing: \"peer\", \"header\", \"x-forwarded-for\", \"forwarded\" or \
             \"fixed\"",
        )?;
        let unused = |present: bool, name: &str, from: &str| {
            table.refuse(present, name, &format!("from = \"{from}\""))
        };
        match from {
            RawKeyFrom::Peer => {
                unused(key.name.is_some(), "name", "peer")?;
                unused(key.trusted_hops.is_some(), "trusted_hops", "peer")?;
                unused(key.value.is_some(), "value", "peer")?;
                Ok(KeySource::peer_ip())
            }
            RawKeyFrom::Header => {
                unused(key.trusted_hops.is_some(), "trusted_hops", "header")?;
                unused(key.value.is_some(), "value", "header")?;
                let name = table.needs(key.name.as_ref(), "name", "missing: the header's name")?;
                let name = HeaderName::from_bytes(name.get_ref().as_bytes()).map_err(|_| {
                    field(
                        &format!("{path}.name"),
                        self.line(name),
                        "not a valid header name",
                    )
                })?;
                Ok(KeySource::header(name))
            }
            RawKeyFrom::XForwardedFor | RawKeyFrom::Forwarded => {
                let forwarded = from == RawKeyFrom::Forwarded;
                let from = if forwarded {
                    "forwarded"
                } else {
                    "x-forwarded-for"
                };
                unused(key.name.is_some(), "name", from)?;
                unused(key.value.is_some(), "value", from)?;
                let hops = table.needs(
                    key.trusted_hops.map(|n| n.0),
                    "trusted_hops",
                    "missing: how many proxies of yours append to the header (0 ignores it)",
                )?;
                Ok(if forwarded {
                    KeySource::forwarded(hops)
                } else {
                    KeySource::x_forwarded_for(hops)
                })
            }
            RawKeyFrom::Fixed => {
                unused(key.name.is_some(), "name", "fixed")?;
                unused(key.trusted_hops.is_some(), "trusted_hops", "fixed")?;
                match key.value.as_deref() {
                    Some(value) if !value.is_empty() => {
                        match rein_core::KeyError::check(value.as_bytes()) {
                            Ok(()) => Ok(KeySource::fixed(value)),
                            // Every request would have no key.
                            Err(e) => Err(table
                                .field("value", &format!("{e}: every request would have no key"))),
                        }
                    }
                    _ => Err(table.field("value", "missing: the one key every request shares")),
                }
            }
        }
    }

    fn known_policy(
        &self,
        path: &str,
        name: &Spanned<String>,
        policies: &[&str],
    ) -> Result<(), LoadError> {
        if policies.contains(&name.get_ref().as_str()) {
            Ok(())
        } else {
            Err(LoadError::UnknownPolicy {
                file: None,
                path: path.to_owned(),
                line: self.line(name),
                name: name.get_ref().clone(),
            })
        }
    }

    /// A duration of at least 1 µs, the unit rein counts in (a shorter one would be zero),
    /// and at most [`MAX_DURATION`](rein_redis::MAX_DURATION), an hour (a longer one would
    /// overflow the clock at the first call).
    fn positive(&self, path: &str, duration: &Spanned<Dur>) -> Result<Duration, LoadError> {
        let d = duration.get_ref().0;
        if d.is_zero() {
            Err(field(path, self.line(duration), "must be longer than zero"))
        } else if d > rein_redis::MAX_DURATION {
            Err(field(path, self.line(duration), "must be at most an hour"))
        } else if d.as_micros() == 0 {
            Err(field(
                path,
                self.line(duration),
                "must be at least 1µs (rein counts whole microseconds)",
            ))
        } else {
            Ok(d)
        }
    }

    /// `http.deadline`: positive, and longer than the limiter's ([`resilient_deadline`]:
    /// `redis.deadline` plus [`DEADLINE_MARGIN`], times [`LEASED_CALLS`] with `[leases]`),
    /// or the layer would give up on every call to a frozen Redis before the limiter's
    /// failure policy could answer (the breaker sees only abandoned calls, never opens, and
    /// every request fails). The same check as the layer's build, made here so that the
    /// file's line is named.
    fn layer_deadline(
        &self,
        deadline: &Spanned<Dur>,
        store: Duration,
        leased: bool,
    ) -> Result<Duration, LoadError> {
        let layer = self.positive("http.deadline", deadline)?;
        let limiter = resilient_deadline(Some(store), leased);
        if layer <= limiter {
            let leases = if leased {
                format!(", times {LEASED_CALLS} with [leases]")
            } else {
                String::new()
            };
            return Err(field(
                "http.deadline",
                self.line(deadline),
                &format!(
                    "must be longer than the limiter's deadline ({}: redis.deadline plus {}\
                     {leases}): the limiter answers from its failure policy when the store's \
                     deadline passes, and a layer that gives up first never lets it; leave it \
                     out for the limiter's deadline plus {}",
                    humantime::format_duration(limiter),
                    humantime::format_duration(DEADLINE_MARGIN),
                    humantime::format_duration(DEADLINE_MARGIN),
                ),
            ));
        }
        Ok(layer)
    }

    fn line<T>(&self, spanned: &Spanned<T>) -> usize {
        line_of(self.text, spanned.span().start)
    }

    /// A count of servers (`expected_nodes`): at least 1.
    fn nodes(&self, path: &str, nodes: &Spanned<Whole<u32>>) -> Result<NonZeroU32, LoadError> {
        NonZeroU32::new(nodes.get_ref().0)
            .ok_or_else(|| field(path, self.line(nodes), "must be at least 1"))
    }

    fn table<'p, T>(&self, path: &'p str, raw: &Spanned<T>) -> Table<'p> {
        Table {
            path,
            line: self.line(raw),
        }
    }
}

/// One table of the file (a limit, a route's key) whose fields depend on its kind: where
/// it is, for errors that name one of its fields.
#[derive(Clone, Copy)]
struct Table<'a> {
    /// Its path, e.g. `policies.api.limits[0]`.
    path: &'a str,
    /// The line it starts on.
    line: usize,
}

impl Table<'_> {
    /// An error about its field `name`.
    fn field(self, name: &str, message: &str) -> LoadError {
        field(&format!("{}.{name}", self.path), self.line, message)
    }

    /// The field `name`'s value, or `message` for its absence.
    fn needs<T>(self, value: Option<T>, name: &str, message: &str) -> Result<T, LoadError> {
        value.ok_or_else(|| self.field(name, message))
    }

    /// An error if the field `name` is set: it is not a setting of `kind_of` (`a
    /// token_bucket limit`, `from = "peer"`).
    fn refuse(self, present: bool, name: &str, kind_of: &str) -> Result<(), LoadError> {
        if present {
            Err(self.field(name, &format!("not a setting of {kind_of}")))
        } else {
            Ok(())
        }
    }
}

fn field(path: &str, line: usize, message: &str) -> LoadError {
    LoadError::Field {
        file: None,
        path: path.to_owned(),
        line,
        message: message.to_owned(),
    }
}

fn syntax(text: &str, error: &toml::de::Error) -> LoadError {
    let start = error.span().map_or(0, |span| span.start);
    let before = text.get(..start).unwrap_or(text);
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    LoadError::Syntax {
        file: None,
        line: line_of(text, start),
        column,
        message: error.message().to_owned(),
    }
}

/// `serde_path_to_error`'s path as the file spells it: `policies.search.limits[1].window`,
/// without the inner segment toml's `Spanned` wrappers add.
fn field_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let spanned = spanned_segment();
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if Some(key.as_str()) == spanned => {}
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(".?"),
        }
    }
    out
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset).unwrap_or(text).matches('\n').count() + 1
}

// The file as serde reads it. Every table denies unknown fields, so a typo is an error
// with its path rather than a silently ignored setting. Tables whose fields depend on a
// variant (a limit's algorithm, a key's source) are flat structs checked by the validator:
// serde's internally tagged enums buffer their content and lose the field path and line.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    redis: Option<Spanned<RawRedis>>,
    failure: Option<Spanned<RawFailure>>,
    leases: Option<Spanned<RawLeases>>,
    #[serde(default)]
    policies: BTreeMap<String, Spanned<RawPolicy>>,
    http: Option<RawHttp>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<Spanned<String>>,
    cluster: Option<Spanned<Vec<Spanned<String>>>>,
    deadline: Option<Spanned<Dur>>,
    connect_timeout: Option<Spanned<Dur>>,
    key_prefix: Option<Spanned<String>>,
    overrides_staleness: Option<Spanned<Dur>>,
    report_counts: Option<Spanned<bool>>,
    /// `key_prefix`'s old name: refused with the new one.
    prefix: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailure {
    policy: Option<RawFailurePolicy>,
    expected_nodes: Option<Spanned<Whole<u32>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLeases {
    expected_nodes: Option<Spanned<Whole<u32>>>,
    renew_interval: Option<Spanned<Dur>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawFailurePolicy {
    FailOpen,
    FailClosed,
    LocalFallback,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    limits: Option<Vec<Spanned<RawLimit>>>,
    shadow: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    algorithm: Option<RawAlgorithm>,
    capacity: Option<Whole<u64>>,
    refill: Option<Whole<u64>>,
    period: Option<Dur>,
    limit: Option<Whole<u64>>,
    window: Option<Dur>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawAlgorithm {
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingCounter,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    key: Option<Spanned<RawKey>>,
    on_missing_key: Option<Answer>,
    on_unavailable: Option<Answer>,
    admitted_headers: Option<RawAdmitted>,
    default_policy: Option<Spanned<String>>,
    deadline: Option<Spanned<Dur>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawAdmitted {
    None,
    Ratelimit,
    All,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    from: Option<RawKeyFrom>,
    name: Option<Spanned<String>>,
    trusted_hops: Option<Whole<u8>>,
    value: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum RawKeyFrom {
    Peer,
    Header,
    XForwardedFor,
    Forwarded,
    Fixed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    path: Option<String>,
    prefix: Option<String>,
    methods: Option<Vec<Spanned<String>>>,
    policy: Option<Spanned<String>>,
    exempt: Option<bool>,
    cost: Option<Whole<u64>>,
    peek: Option<bool>,
    key: Option<Spanned<RawKey>>,
}

impl RawAlgorithm {
    fn as_str(self) -> &'static str {
        match self {
            RawAlgorithm::TokenBucket => "token_bucket",
            RawAlgorithm::FixedWindow => "fixed_window",
            RawAlgorithm::SlidingLog => "sliding_log",
            RawAlgorithm::SlidingCounter => "sliding_counter",
        }
    }
}

/// A duration written as text for humans: `"250ms"`, `"1m"`, `"1h 30m"`, `"1d"`.
#[derive(Clone, Copy)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurVisitor;
        impl Visitor<'_> for DurVisitor {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"a duration such as "250ms" or "1m""#)
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Dur, E> {
                humantime::parse_duration(text).map(Dur).map_err(|e| {
                    E::custom(format_args!(
                        r#"expected a duration such as "250ms" or "1m", got {text:?}: {e}"#
                    ))
                })
            }
        }
        deserializer.deserialize_str(DurVisitor)
    }
}

/// A whole number in the file, as a `T`: out of range, it is refused in words ("expected a
/// whole number from 0 to 255"), where serde's own message names the Rust type ("expected
/// u8"), which says little to whoever edits the file.
#[derive(Clone, Copy)]
struct Whole<T>(T);

/// The integer types a [`Whole`] reads, with their largest value.
trait WholeType: TryFrom<u64> {
    const MAX: u64;
}

impl WholeType for u8 {
    const MAX: u64 = u8::MAX as u64;
}

impl WholeType for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl WholeType for u64 {
    const MAX: u64 = u64::MAX;
}

impl<'de, T: WholeType> Deserialize<'de> for Whole<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct WholeVisitor<T>(std::marker::PhantomData<T>);
        impl<T: WholeType> Visitor<'_> for WholeVisitor<T> {
            type Value = Whole<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                match T::MAX {
                    u64::MAX => f.write_str("a whole number, 0 or more"),
                    max => write!(f, "a whole number from 0 to {max}"),
                }
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Whole<T>, E> {
                T::try_from(n)
                    .map(Whole)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Whole<T>, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(n), &self)),
                }
            }
        }
        deserializer.deserialize_u64(WholeVisitor(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for Answer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AnswerVisitor;
        impl Visitor<'_> for AnswerVisitor {
            type Value = Answer;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(r#"an HTTP error status code (400 to 599) such as 503, or "pass""#)
            }
            // An error status: a success or informational code would tell the client its
            // request was served when it was not, and break the protocol for some.
            fn visit_i64<E: de::Error>(self, code: i64) -> Result<Answer, E> {
                u16::try_from(code)
                    .ok()
                    .filter(|code| (400..=599).contains(code))
                    .and_then(|code| StatusCode::from_u16(code).ok())
                    .map(Answer::Status)
                    .ok_or_else(|| E::invalid_value(de::Unexpected::Signed(code), &self))
            }
            fn visit_u64<E: de::Error>(self, code: u64) -> Result<Answer, E> {
                self.visit_i64(i64::try_from(code).unwrap_or(i64::MAX))
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Answer, E> {
                if text == "pass" {
                    Ok(Answer::Pass)
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(text), &self))
                }
            }
        }
        deserializer.deserialize_any(AnswerVisitor)
    }
}

/// The inner path segment a `toml::Spanned` wrapper adds to a field's path, which is not
/// the file's, learnt once by asking for it rather than written here: its name belongs to
/// serde_spanned's private protocol. `None` if a wrapper adds none.
fn spanned_segment() -> Option<&'static str> {
    use std::sync::OnceLock;
    static SEGMENT: OnceLock<Option<String>> = OnceLock::new();
    SEGMENT
        .get_or_init(|| {
            #[derive(Deserialize)]
            struct Probe {
                #[allow(dead_code)]
                x: Spanned<u8>,
            }
            let document = toml::Deserializer::parse("x = 'not a number'").ok()?;
            let error = serde_path_to_error::deserialize::<_, Probe>(document).err()?;
            match error.path().iter().nth(1)? {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                _ => None,
            }
        })
        .as_deref()
}

/// The Redis store's deadline, named here so that `Config` shows the value in force (defined
/// once, in rein-core; the prefix and connect timeout come from rein-redis).
const DEFAULT_DEADLINE: Duration = rein_core::limiter::DEFAULT_DEADLINE;

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, LoadError> {
        text.parse()
    }

    const MINIMAL: &str = r#"
[redis]
url = "redis://127.0.0.1:6379/"

[policies.api]
limits = [{ algorithm = "fixed_window", limit = 10, window = "1m" }]
"#;

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let config = load(MINIMAL).unwrap();
        assert_eq!(
            config.redis.endpoint,
            RedisEndpoint::Url("redis://127.0.0.1:6379/".into())
        );
        assert_eq!(config.redis.deadline, Duration::from_millis(50));
        assert_eq!(config.failure, FailurePolicy::FailOpen);
        assert!(config.routes.is_empty());
        assert_eq!(
            config.http.on_missing_key,
            Answer::Status(StatusCode::INTERNAL_SERVER_ERROR)
        );
    }

    #[test]
    fn a_bad_duration_names_its_field_path_and_line() {
        let text = r#"
[redis]
url = "redis://127.0.0.1:6379/"

[policies.search]
limits = [
  { algorithm = "token_bucket", capacity = 10, refill = 1, period = "1s" },
  { algorithm = "fixed_window", limit = 100, window = 3 },
]
"#;
        let Err(LoadError::Field {
            path,
            line,
            message,
            ..
        }) = load(text)
        else {
            panic!("expected a field error");
        };
        assert_eq!(path, "policies.search.limits[1].window");
        assert_eq!(line, 8);
        assert!(message.contains("expected a duration"), "{message}");
    }

    #[test]
    fn an_unparsable_duration_names_its_field() {
        let text = MINIMAL.replace(r#"window = "1m""#, r#"window = "soon""#);
        let Err(LoadError::Field { path, line, .. }) = load(&text) else {
            panic!("expected a field error");
        };
        assert_eq!(path, "policies.api.limits[0].window");
        assert_eq!(line, 6);
    }

    #[test]
    fn a_route_naming_an_undeclared_policy_is_refused() {
        let text = format!("{MINIMAL}\n[[routes]]\nprefix = \"/x\"\npolicy = \"serach\"\n");
        let Err(LoadError::UnknownPolicy {
            path, line, name, ..
        }) = load(&text)
        else {
            panic!("expected an unknown policy");
        };
        assert_eq!(
            (path.as_str(), line, name.as_str()),
            ("routes[0].policy", 10, "serach")
        );
    }

    #[test]
    fn limit_values_rein_core_refuses_are_reported_with_its_reason() {
        let text = MINIMAL.replace("limit = 10", "limit = 0");
        let Err(LoadError::Limit { path, source, .. }) = load(&text) else {
            panic!("expected a limit error");
        };
        assert_eq!(path, "policies.api.limits[0]");
        assert!(matches!(source, rein_core::ConfigError::Zero { .. }));
    }

    #[test]
    fn unknown_fields_and_wrong_algorithm_fields_are_errors() {
        let typo = MINIMAL.replace("[redis]", "[redis]\ndeadlin = \"5ms\"");
        let Err(LoadError::Field { path, .. }) = load(&typo) else {
            panic!("expected a field error");
        };
        assert_eq!(path, "redis.deadlin");
        let mixed = MINIMAL.replace("limit = 10,", "limit = 10, capacity = 3,");
        let Err(LoadError::Field { path, .. }) = load(&mixed) else {
            panic!("expected a field error");
        };
        assert_eq!(path, "policies.api.limits[0].capacity");
    }

    #[test]
    fn syntax_errors_have_a_line_and_column() {
        let Err(LoadError::Syntax { line, .. }) = load("[redis]\nurl = \"unclosed\n") else {
            panic!("expected a syntax error");
        };
        assert_eq!(line, 2);
    }

    #[test]
    fn routes_keys_and_answers_are_read() {
        let text = format!(
            "{MINIMAL}{}",
            r#"
[http]
key = { from = "x-forwarded-for", trusted_hops = 1 }
on_missing_key = 400
on_unavailable = "pass"
admitted_headers = "all"
default_policy = "api"

[policies.partner]
limits = [{ algorithm = "fixed_window", limit = 10, window = "1m" }]

[[routes]]
path = "/login"
methods = ["post"]
policy = "partner"
cost = 2
key = { from = "header", name = "x-api-key" }

[[routes]]
prefix = "/health"
exempt = true
"#
        );
        let config = load(&text).unwrap();
        assert_eq!(config.routes.len(), 3);
        assert!(config.routes[0].matches(&Method::POST, "/login"));
        assert!(!config.routes[0].matches(&Method::GET, "/login"));
        assert_eq!(config.routes[1].policy_name(), None);
        assert_eq!(config.routes[0].policy_name(), Some("partner"));
        assert_eq!(config.routes[2].policy_name(), Some("api"));
        assert_eq!(config.http.on_unavailable, Answer::Pass);
        assert_eq!(
            config.http.on_missing_key,
            Answer::Status(StatusCode::BAD_REQUEST)
        );
        assert_eq!(config.http.admitted_headers, AdmittedHeaders::All);
    }

    #[test]
    fn local_fallback_needs_the_node_count() {
        let text = format!("{MINIMAL}\n[failure]\npolicy = \"local_fallback\"\n");
        let Err(LoadError::Field { path, .. }) = load(&text) else {
            panic!("expected a field error");
        };
        assert_eq!(path, "failure.expected_nodes");
        let text =
            format!("{MINIMAL}\n[failure]\npolicy = \"local_fallback\"\nexpected_nodes = 3\n");
        assert_eq!(
            load(&text).unwrap().failure,
            FailurePolicy::LocalFallback {
                expected_nodes: NonZeroU32::new(3).unwrap()
            }
        );
    }
}
