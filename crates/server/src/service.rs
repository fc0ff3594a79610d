//! [`RateLimitService`]: where the server decides a `ShouldRateLimit` request. The gRPC and
//! JSON front ends only convert to and from Envoy's types; everything else is here.
//!
//! # A request
//! 1. Bounds first: at most [`MAX_DESCRIPTORS`] descriptors of at most [`MAX_ENTRIES`]
//!    entries, entry keys of 1 to [`MAX_TEXT`] bytes, a domain of 1 to [`MAX_TEXT`]. Anything
//!    else is `INVALID_ARGUMENT` after bounded work. Entry values, which a client may
//!    choose (a header, a path), are bounded only by the request's size: refusing a long
//!    one would refuse the whole request, every limit in it, and Envoy's default
//!    (`failure_mode_deny: false`) would then admit it unlimited.
//! 2. Each descriptor is matched ([`crate::matcher`]) in the snapshot of the configuration
//!    taken when the request arrived (a reload never splits a request between two
//!    configurations). A per-descriptor `limit` override replaces the matched rule's numbers.
//!    A rule that another matched rule `replaces` is dropped.
//! 3. **All or nothing.** The descriptors' limits are charged in order through the
//!    resilient limiter. When one denies, every unit already charged for this request in
//!    the store (not what a failure policy admitted, which the store never took) is
//!    refunded, all at once, and the later descriptors are only peeked (to report them), so
//!    a request that is over any limit is charged nowhere. A request Envoy gives up on is
//!    still decided to its end ([`RateLimitService::detached`]). Between a charge and its
//!    refund
//!    another request may see those units taken: a brief under-admission under contention.
//!    A refund lands in the window current when it runs, and a sliding log's removes its
//!    newest entries: a charge and refund that straddle a window boundary can give the next
//!    window up to the cost (docs/server.md, "All or nothing"). A `shadow_mode` rule is
//!    decided and counted like any other but never makes the answer `OVER_LIMIT`.
//! 4. The answer: `OVER_LIMIT` if any descriptor is, one status per descriptor in order,
//!    and the `RateLimit-Policy` / `RateLimit` headers (and `Retry-After` on a denial) of the
//!    descriptor that decided (the longest wait among denials), rendered by rein-tower's
//!    renderer.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as EnvoyUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use rein::{FailurePolicy, PolicyTable, ResilienceConfigError, ResilientLimiter, TablePolicy};
use rein::{
    LeaseConfig,
    lease::{LeaseStats, MaybeLeased},
};
use rein_core::{DecideError, Decision, Leasable, Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_tower::headers;
use thiserror::Error;

use crate::config::{Action, NamedUnit, Rule, RulesConfig, Unit};
use crate::matcher::match_descriptor;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain or entry key, in bytes: both come from Envoy's configuration. An
/// entry's value has no bound of its own but the request's size (gRPC's 4 MiB message, the
/// JSON endpoint's 256 KiB body); a counted key longer than a limiter takes is hashed.
pub const MAX_TEXT: usize = 1_024;
/// The most distinct per-descriptor `limit` overrides (unit and count) the server keeps a
/// limiter for at once. One unused for a whole unit (its window) is dropped to make room:
/// its counts have ended with its window, and in Redis they are kept by name anyway. A
/// descriptor with another one while every kept one was used within its unit (or one of a
/// unit the server does not know) is decided as if it had none, by its rule, and the server
/// logs it and counts it in `rein_server_overrides_left_out_total`: refusing the request
/// would refuse every limit in it, which Envoy's default failure mode then admits.
pub const MAX_LIMIT_OVERRIDES: usize = 256;

/// Server-wide settings of how decisions are made and answered.
#[derive(Clone, Debug)]
pub struct ServiceSettings {
    /// What the limiter answers while the store gives no decision.
    pub failure: FailurePolicy,
    /// Decide and count everything, but answer OK (envoyproxy/ratelimit's global shadow
    /// mode).
    pub shadow_mode: bool,
    /// Also add the legacy `X-RateLimit-Limit`, `-Remaining` and `-Reset` headers.
    pub legacy_headers: bool,
    /// Decide hot keys from leases (the resilient limiter with leases on,
    /// `ResilientLimiterBuilder::leases`): blocks of units reserved in the store and spent
    /// in process, exactly (docs/leases.md); `None`: every decision asks the store.
    pub leases: Option<LeaseConfig>,
}

/// A request the server refuses to decide: Envoy sees `INVALID_ARGUMENT`.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum InvalidRequest {
    /// `domain` is empty or longer than [`MAX_TEXT`].
    #[error("the domain must be 1 to {MAX_TEXT} bytes")]
    Domain,
    /// No descriptors, or more than [`MAX_DESCRIPTORS`].
    #[error("a request carries 1 to {MAX_DESCRIPTORS} descriptors")]
    DescriptorCount,
    /// A descriptor with no entries or more than [`MAX_ENTRIES`].
    #[error("descriptor {0} must carry 1 to {MAX_ENTRIES} entries")]
    EntryCount(usize),
    /// An entry's key is empty, or longer than [`MAX_TEXT`].
    #[error("descriptor {0}: an entry's key must be 1 to {MAX_TEXT} bytes")]
    EntryText(usize),
}

/// Why the service could not start or reload.
#[derive(Debug, Error)]
pub enum ServiceError {
    /// The limiter refused the rules' policies.
    #[error(transparent)]
    Limiter(#[from] ResilienceConfigError),
    /// Leases were asked for outside a tokio runtime: their timers run as tasks.
    #[error("leases need a running tokio runtime")]
    NoRuntime,
}

/// Envoy's rate-limit service over any rein store `S`, with a configuration that can be
/// swapped while it serves ([`RateLimitService::reload`]). Cheap to clone (one `Arc`).
pub struct RateLimitService<S: Leasable + Clone + 'static> {
    shared: Arc<Shared<S>>,
}

impl<S: Leasable + Clone + 'static> Clone for RateLimitService<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

struct Shared<S: Leasable + Clone + 'static> {
    store: S,
    settings: ServiceSettings,
    current: RwLock<Arc<Snapshot<S>>>,
    /// Limiters for per-descriptor `limit` overrides, by (unit, requests per unit).
    overrides: Mutex<Overrides<S>>,
    /// The requests deciding in tasks of their own ([`RateLimitService::detached`]), which
    /// shutdown waits for.
    tasks: tokio_util::task::TaskTracker,
    /// Whether a left-out override was logged at `warn` already (later ones at `debug`).
    override_left_out: std::sync::atomic::AtomicBool,
}

/// The override limiters, by unit and requests per unit, each with when it was last used.
type Overrides<S> = HashMap<(NamedUnit, u64), (Arc<OverrideLimiter<S>>, tokio::time::Instant)>;

/// One configuration with the limiter built for its policies.
struct Snapshot<S: Leasable + Clone + 'static> {
    metrics: RuleMetrics,
    rules: RulesConfig,
    decider: Decider<S>,
}

/// What [`RateLimitService::reload`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "an unchanged reload applied nothing"]
pub enum Reload {
    /// The new rules decide from now on.
    Applied,
    /// The rules are those in force: kept, with their limiters' state (fallback counts,
    /// breaker, leases).
    Unchanged,
}

/// The resilient limiter, with leases off or on (one type either way).
type Deciding<S> = ResilientLimiter<S, MaybeLeased<S>>;

/// What decides the rules' policies: the resilient limiter and its policies, by name.
struct Decider<S: Leasable + Clone + 'static> {
    limiter: Deciding<S>,
    prepared: HashMap<String, TablePolicy>,
}

/// The descriptor whose decision the headers show.
struct Shown<'p> {
    policy: &'p NamedPolicy,
    policy_header: &'p str,
    decision: Decision,
}

struct OverrideLimiter<S: Leasable + Clone + 'static> {
    limiter: Deciding<S>,
    prepared: TablePolicy,
    policy: NamedPolicy,
    policy_header: String,
    unit: NamedUnit,
    requests_per_unit: u64,
}

impl<S: Leasable + Clone + 'static> RateLimitService<S> {
    /// The service over `store`, deciding by `rules`.
    pub fn new(
        store: S,
        rules: RulesConfig,
        settings: ServiceSettings,
    ) -> Result<Self, ServiceError> {
        let snapshot = Snapshot::build(store.clone(), rules, settings.failure, settings.leases)?;
        Ok(Self {
            shared: Arc::new(Shared {
                store,
                settings,
                current: RwLock::new(Arc::new(snapshot)),
                overrides: Mutex::new(HashMap::new()),
                tasks: tokio_util::task::TaskTracker::new(),
                override_left_out: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Swaps in `rules` (already validated whole): requests that arrived before keep
    /// deciding on the old rules, later ones on the new, none on a mix. A rule whose place
    /// in the tree is unchanged keeps its counted state in the store (its policy keeps its
    /// name). The limiter's breaker and caches start afresh, and so do the local
    /// fallback's counts and the leases; rules equal to those in force are kept as they are
    /// ([`Reload::Unchanged`]).
    pub fn reload(&self, rules: RulesConfig) -> Result<Reload, ServiceError> {
        // The same rules again (a file touched, or written with what it held): nothing to
        // do. Building anew would forget the local fallback's counts and the breaker's
        // state, and give back and lease again every lease, for no change.
        if self.snapshot().rules == rules {
            return Ok(Reload::Unchanged);
        }
        let snapshot = Snapshot::build(
            self.shared.store.clone(),
            rules,
            self.shared.settings.failure,
            self.shared.settings.leases,
        )?;
        let old = std::mem::replace(
            &mut *self
                .shared
                .current
                .write()
                .unwrap_or_else(PoisonError::into_inner),
            Arc::new(snapshot),
        );
        // The old rules' leases give back what they hold, off the caller's path (with leases
        // on, the snapshot was built inside a runtime; without, there is nothing to give). A
        // reservation a request started on them is waited for and given back; one that does
        // not land within the flight timeout strands until its validity ends (under-admission
        // only), as a crashed holder's would.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { old.release().await });
        }
        Ok(Reload::Applied)
    }

    /// Gives back every unit the leases hold (with leases on); call before exiting.
    pub async fn shutdown(&self) {
        // The requests still deciding first (each within its descriptors' deadlines): one
        // cancelled halfway would leave a charge, or reserve a lease after the release.
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
        self.snapshot().release().await;
    }

    /// The leases' counters (with leases on): how many decisions they answered, what they
    /// reserved, returned and stranded.
    pub fn lease_stats(&self) -> Option<LeaseStats> {
        self.snapshot().decider.limiter.lease_stats()
    }

    /// The domains now served.
    pub fn domains(&self) -> Vec<String> {
        self.snapshot()
            .rules
            .domain_names()
            .map(str::to_owned)
            .collect()
    }

    fn snapshot(&self) -> Arc<Snapshot<S>> {
        Arc::clone(
            &self
                .shared
                .current
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// [`should_rate_limit`](Self::should_rate_limit) in a task of its own, which the
    /// front ends await: a request its caller gives up on (Envoy's `timeout`, a reset
    /// stream) is still decided to its end, so all or nothing holds for it too. Dropped
    /// halfway, a request would leave the units its earlier descriptors took, or a call
    /// already sent, charged with no refund; decided to its end, a denial gives them back,
    /// and an admission stays charged, as for a request answered. The handle's error is the
    /// task's (a panic, or the runtime shutting down).
    pub fn detached(
        &self,
        request: RateLimitRequest,
    ) -> tokio::task::JoinHandle<Result<RateLimitResponse, InvalidRequest>> {
        let service = self.clone();
        self.shared
            .tasks
            .spawn(async move { service.should_rate_limit(&request).await })
    }

    /// Decides `request` as Envoy's `ShouldRateLimit`. Dropped before it ends, it leaves
    /// what its earlier descriptors charged (or a call already sent) charged, with no
    /// refund: a caller that may give up calls [`detached`](Self::detached).
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
    ) -> Result<RateLimitResponse, InvalidRequest> {
        check_bounds(request)?;
        let snapshot = self.snapshot();
        let settings = &self.shared.settings;
        let request_hits = u64::from(request.hits_addend.max(1));
        let Some(domain) = snapshot.rules.domain(&request.domain) else {
            tracing::debug!(domain = %request.domain, "unknown domain: every descriptor OK");
            metrics::counter!("rein_server_unmatched_total", "domain" => "(unknown)")
                .increment(request.descriptors.len() as u64);
            return Ok(all_ok(request.descriptors.len()));
        };
        // Plan every descriptor before charging any.
        let mut plans = Vec::with_capacity(request.descriptors.len());
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let entries = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()));
            let matched = match_descriptor(domain, entries);
            let cost = descriptor
                .hits_addend
                .as_ref()
                .map_or(request_hits, |h| h.value);
            let limiter = match &descriptor.limit {
                // Zero requests per unit: everything is over the limit, as in a rule.
                Some(over) if over.requests_per_unit == 0 => {
                    plans.push(Plan::Zero);
                    continue;
                }
                Some(over) => match self.override_limiter(over.unit, over.requests_per_unit) {
                    Ok(limiter) => Some(limiter),
                    Err(why) => {
                        self.override_left_out(&request.domain, index, over, why);
                        None
                    }
                },
                None => None,
            };
            let plan = match (limiter, matched) {
                (Some(limiter), matched) => {
                    let mut key = Vec::new();
                    crate::matcher::push_counted(&mut key, request.domain.as_bytes());
                    for e in &descriptor.entries {
                        crate::matcher::push_counted(&mut key, e.key.as_bytes());
                        crate::matcher::push_counted(&mut key, e.value.as_bytes());
                    }
                    Plan::Override {
                        limiter,
                        key: crate::matcher::bounded(key),
                        cost,
                        negative: descriptor.is_negative_hits,
                        label: matched.map_or_else(
                            || format!("{}.(override)", request.domain).into(),
                            |m| m.label,
                        ),
                    }
                }
                (None, None) => Plan::Unmatched,
                (None, Some(m)) => Plan::Rule {
                    rule: m.rule,
                    key: m.key,
                    label: m.label,
                    cost,
                    negative: descriptor.is_negative_hits,
                },
            };
            plans.push(plan);
        }
        // `replaces`: a rule whose name a matched rule replaces is not evaluated.
        let replaced: Vec<&str> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Rule { rule, .. } => Some(rule.replaces.iter().map(String::as_str)),
                _ => None,
            })
            .flatten()
            .collect();
        if !replaced.is_empty() {
            for plan in &mut plans {
                if let Plan::Rule { rule, .. } = plan
                    && rule.name.as_deref().is_some_and(|n| replaced.contains(&n))
                {
                    *plan = Plan::Replaced;
                }
            }
        }
        self.execute(&snapshot, &request.domain, plans, settings)
            .await
    }

    async fn execute(
        &self,
        snapshot: &Snapshot<S>,
        domain: &str,
        plans: Vec<Plan<'_, S>>,
        settings: &ServiceSettings,
    ) -> Result<RateLimitResponse, InvalidRequest> {
        let mut statuses = Vec::with_capacity(plans.len());
        // Charged so far: (limiter, prepared, key, cost), refunded if a later one denies.
        let mut charged: Vec<Charge<'_, S>> = Vec::new();
        let mut denied = false;
        // The descriptor whose decision the headers show: of those over their limit, the
        // one with the longest wait, else the one with the fewest remaining.
        let mut shown: Option<Shown<'_>> = None;
        // Shadow mode, the server's or a rule's: decided and counted, answered OK, and never
        // a denial of the request. The one place the server's flag is read.
        let shadowed = |rule: bool| rule || settings.shadow_mode;
        for plan in &plans {
            let status = match plan {
                Plan::Zero => {
                    let shadow = shadowed(false);
                    denied |= !shadow;
                    DescriptorStatus {
                        code: if shadow { Code::Ok } else { Code::OverLimit } as i32,
                        ..Default::default()
                    }
                }
                Plan::Unmatched | Plan::Replaced => {
                    if matches!(plan, Plan::Unmatched) {
                        tracing::debug!(domain, "a descriptor matched no rule: OK");
                        metrics::counter!("rein_server_unmatched_total", "domain" => domain.to_owned())
                            .increment(1);
                    }
                    ok_status()
                }
                Plan::Rule {
                    rule,
                    key,
                    label,
                    cost,
                    negative,
                } => match &rule.action {
                    Action::Unlimited => {
                        snapshot.metrics.count(label, Outcome::Unlimited);
                        DescriptorStatus {
                            code: Code::Ok as i32,
                            limit_remaining: u32::MAX,
                            ..Default::default()
                        }
                    }
                    Action::DenyAll { unit } => {
                        let status = over_limit_status(rule, *unit, 0);
                        if shadowed(rule.shadow_mode) {
                            snapshot.metrics.count(label, Outcome::Shadow);
                            DescriptorStatus {
                                code: Code::Ok as i32,
                                ..status
                            }
                        } else {
                            snapshot.metrics.count(label, Outcome::Over);
                            denied = true;
                            status
                        }
                    }
                    Action::Limit {
                        policy,
                        header_policy,
                        policy_header,
                        limits,
                    } => {
                        let Some(target) = snapshot.target(policy.name()) else {
                            // Built from the same rules: every policy is in the table.
                            statuses.push(ok_status());
                            continue;
                        };
                        let decision =
                            decide(&target, key, *cost, *negative, denied, &mut charged).await;
                        self.status(
                            &snapshot.metrics,
                            decision,
                            shadowed(rule.shadow_mode),
                            label,
                            rule.name.as_deref(),
                            limits,
                            (header_policy, policy_header),
                            &mut denied,
                            &mut shown,
                        )
                    }
                },
                Plan::Override {
                    limiter,
                    key,
                    cost,
                    negative,
                    label,
                } => {
                    let target = Target(&limiter.limiter, &limiter.prepared, limiter.policy.name());
                    let decision =
                        decide(&target, key, *cost, *negative, denied, &mut charged).await;
                    self.status(
                        &snapshot.metrics,
                        decision,
                        shadowed(false),
                        label,
                        None,
                        &[(Unit::Named(limiter.unit), limiter.requests_per_unit)],
                        (&limiter.policy, &limiter.policy_header),
                        &mut denied,
                        &mut shown,
                    )
                }
            };
            statuses.push(status);
        }
        if denied {
            // All or nothing: give back what this request took before it was denied, all
            // at once (each bounded by the store's deadline).
            let refunds = charged.iter().map(|charge| async move {
                if let Err(error) = charge.target.refund(&charge.key, charge.cost).await {
                    tracing::warn!(%error, "refunding a denied request's charge failed");
                }
            });
            futures_util::future::join_all(refunds).await;
        }
        // Every status is OK under shadow mode, and `denied` is only set outside it.
        let mut response = RateLimitResponse {
            overall_code: if denied { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            ..Default::default()
        };
        // A request over a limit that decided nothing (a zero limit, a `deny_all`, a cost no
        // limit holds) has no decision to show: an admitted descriptor's headers would say
        // "remaining" on a 429.
        let shown = shown.filter(|shown| !denied || !shown.decision.is_allowed());
        if let Some(shown) = shown {
            response.response_headers_to_add = self.headers(&shown);
        }
        Ok(response)
    }

    /// The status of one decided descriptor, counting it and updating the request's state.
    #[allow(clippy::too_many_arguments)]
    fn status<'p>(
        &self,
        metrics: &RuleMetrics,
        decision: Result<Decision, DecideError>,
        shadow: bool,
        label: &str,
        name: Option<&str>,
        limits: &[(Unit, u64)],
        (header_policy, policy_header): (&'p NamedPolicy, &'p str),
        denied: &mut bool,
        shown: &mut Option<Shown<'p>>,
    ) -> DescriptorStatus {
        // The limit that decided (the first when there is no decision).
        let index = decision
            .as_ref()
            .map_or(0, |d| usize::from(d.limit_index))
            .min(limits.len().saturating_sub(1));
        let current_limit = limits
            .get(index)
            .map(|&(unit, requests_per_unit)| RateLimit {
                name: name.unwrap_or_default().to_owned(),
                requests_per_unit: u32::try_from(requests_per_unit).unwrap_or(u32::MAX),
                unit: envoy_unit(unit) as i32,
            });
        let decision = match decision {
            Ok(decision) => decision,
            // A cost no limit of the rule can ever admit: over the limit, as Envoy expects.
            Err(DecideError::InsufficientCapacity(_)) => {
                metrics.count(
                    label,
                    if shadow {
                        Outcome::Shadow
                    } else {
                        Outcome::Over
                    },
                );
                if !shadow {
                    *denied = true;
                }
                return DescriptorStatus {
                    code: if shadow { Code::Ok } else { Code::OverLimit } as i32,
                    current_limit,
                    ..Default::default()
                };
            }
            Err(error) => {
                // The resilient limiter answers from its failure policy instead of failing;
                // what is left (a refund's failure, a rate share the store refuses that the
                // table let through) is the store's refusal, not a limit: OK, and logged.
                tracing::warn!(%error, "no decision: OK");
                return DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                };
            }
        };
        if decision.is_blind() && decision.is_allowed() {
            // A failure policy's "fail open": nothing is known of the limit. OK with no
            // figures and no `current_limit`, never the descriptor the headers show, and not
            // counted as near the limit (before, `limit_remaining: 0`, `r=0;t=0` and
            // `near_limit` for every request while Redis was away). Envoy's own
            // `x-ratelimit-*` headers take the least `limit_remaining` of the statuses that
            // have a `current_limit`, so one with it would read "0 remaining, reset 0" on
            // every admission. The limiter counts it by its source.
            metrics.count(label, Outcome::Within);
            return DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            };
        }
        let allowed = decision.is_allowed();
        let outcome = if !allowed {
            if shadow {
                Outcome::Shadow
            } else {
                Outcome::Over
            }
        } else if decision.remaining.saturating_mul(5) < decision.limit {
            // Less than a fifth left: envoyproxy/ratelimit's near-limit ratio of 0.8.
            Outcome::Near
        } else {
            Outcome::Within
        };
        metrics.count(label, outcome);
        // Shadowed, by the rule or the server: answered OK, charged as admitted, and never
        // the descriptor the headers show (an OK answer carries no `Retry-After`).
        let over = !allowed && !shadow;
        if over {
            *denied = true;
        }
        let better = match shown {
            None => true,
            Some(Shown {
                decision: current, ..
            }) => match (current.is_allowed(), allowed) {
                (true, false) => true,
                (false, true) => false,
                // The request is all or nothing: a retry can pass only once every denial has
                // cleared, so the headers show the longest wait.
                (false, false) => decision.retry_after > current.retry_after,
                (true, true) => decision.remaining < current.remaining,
            },
        };
        if better && (over || allowed) {
            *shown = Some(Shown {
                policy: header_policy,
                policy_header,
                decision,
            });
        }
        // As the `RateLimit` header's `t`: on a denial the exact wait, on an admission the
        // deciding limit's reset (bounded by its longest, see rein_tower::headers).
        let until = if allowed {
            let deciding = headers::deciding_limit(header_policy.policy(), &decision);
            Micros::from_secs(headers::reset_secs(
                header_policy.policy(),
                deciding,
                &decision,
            ))
            .min(decision.reset_after)
        } else {
            decision.retry_after
        };
        // A failure policy's "fail closed" knows nothing of the limit: no `current_limit`
        // (Envoy's `x-ratelimit-*` headers would say "reset 0": retry now) and no reset;
        // the `Retry-After` of `headers` says when to come back.
        let known = !decision.is_blind();
        DescriptorStatus {
            code: if over { Code::OverLimit } else { Code::Ok } as i32,
            current_limit: current_limit.filter(|_| known),
            limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
            duration_until_reset: known.then(|| proto_duration(until)),
            ..Default::default()
        }
    }

    fn headers(&self, shown: &Shown<'_>) -> Vec<HeaderValue> {
        let (policy, decision) = (shown.policy, &shown.decision);
        let deciding = headers::deciding_limit(policy.policy(), decision);
        let header = |key: &str, value: String| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        };
        let mut out = vec![header("RateLimit-Policy", shown.policy_header.to_owned())];
        // A failure policy's "fail closed" knows nothing of the limit: no figures (before,
        // `r=0;t=0` and `Retry-After: 0` while the breaker was closed).
        let figures = headers::render_rate_limit(policy, deciding, decision);
        let known = figures.is_some();
        if let Some(figures) = figures {
            out.push(header("RateLimit", figures));
        }
        if !decision.is_allowed() {
            let seconds = headers::retry_after_secs(decision);
            out.push(header("Retry-After", seconds.to_string()));
        }
        if self.shared.settings.legacy_headers && known {
            let limits = policy.policy().limits();
            let limit = limits.get(deciding).map_or(decision.limit, Limit::capacity);
            out.push(header("X-RateLimit-Limit", limit.to_string()));
            out.push(header(
                "X-RateLimit-Remaining",
                decision.remaining.to_string(),
            ));
            out.push(header(
                "X-RateLimit-Reset",
                headers::reset_secs(policy.policy(), deciding, decision).to_string(),
            ));
        }
        out
    }

    /// Logs and counts a descriptor's override left out (`why`): the first at `warn`, the
    /// rest at `debug` (a client could send one with every request), all counted.
    fn override_left_out(
        &self,
        domain: &str,
        index: usize,
        over: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride,
        why: &str,
    ) {
        metrics::counter!("rein_server_overrides_left_out_total").increment(1);
        let first = !self
            .shared
            .override_left_out
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        let (unit, count) = (over.unit, over.requests_per_unit);
        if first {
            tracing::warn!(
                domain,
                descriptor = index,
                unit,
                requests_per_unit = count,
                "a descriptor's limit override left out ({why}): decided by its rule (later \
                 ones are logged at debug; rein_server_overrides_left_out_total counts them)"
            );
        } else {
            tracing::debug!(
                domain,
                descriptor = index,
                unit,
                requests_per_unit = count,
                "a descriptor's limit override left out ({why}): decided by its rule"
            );
        }
    }

    /// The limiter of a descriptor's `limit` override, or why the server keeps none for it.
    fn override_limiter(
        &self,
        unit: i32,
        requests_per_unit: u32,
    ) -> Result<Arc<OverrideLimiter<S>>, &'static str> {
        let unit = match EnvoyUnit::try_from(unit) {
            Ok(EnvoyUnit::Second) => NamedUnit::Second,
            Ok(EnvoyUnit::Minute) => NamedUnit::Minute,
            Ok(EnvoyUnit::Hour) => NamedUnit::Hour,
            Ok(EnvoyUnit::Day) => NamedUnit::Day,
            Ok(EnvoyUnit::Week) => NamedUnit::Week,
            Ok(EnvoyUnit::Month) => NamedUnit::Month,
            Ok(EnvoyUnit::Year) => NamedUnit::Year,
            _ => return Err("a unit this server does not know"),
        };
        let count = u64::from(requests_per_unit);
        let now = tokio::time::Instant::now();
        let mut overrides = self
            .shared
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((found, used)) = overrides.get_mut(&(unit, count)) {
            *used = now;
            return Ok(Arc::clone(found));
        }
        if overrides.len() >= MAX_LIMIT_OVERRIDES {
            // Those unused for a whole window hold no count (before, none was ever dropped,
            // and once 256 had been seen every new one was left out until a restart).
            overrides.retain(|(unit, _), (_, used)| now.duration_since(*used) < unit.duration());
        }
        if overrides.len() >= MAX_LIMIT_OVERRIDES {
            return Err(
                "more distinct overrides in use than the server keeps (MAX_LIMIT_OVERRIDES)",
            );
        }
        // Limits, names and limiters rein refuses: numbers too large to stay exact.
        const NOT_KEPT: &str = "numbers rein cannot keep exact";
        // A zero count never reaches here (`Plan::Zero`).
        let limit =
            Limit::fixed_window(count, Micros::from(unit.duration())).map_err(|_| NOT_KEPT)?;
        let name = format!(
            "override-{}-{count}",
            format!("{unit:?}").to_ascii_lowercase()
        );
        let policy = NamedPolicy::new(name, Policy::single(limit)).map_err(|_| NOT_KEPT)?;
        // Its own name in the limiter metrics (`limiter="override-minute-100"`): its breaker
        // is its own, and under the default name it wrote the rules' `rein_breaker_state`
        // (a new override's limiter set it to closed while Redis was down).
        let limiter = ResilientLimiter::builder(
            self.shared.store.clone(),
            PolicyTable::new(policy.clone()),
            self.shared.settings.failure,
        )
        .name(policy.name())
        .build()
        .map_err(|_| NOT_KEPT)?
        .into();
        let prepared = Limiter::prepare(&limiter, &policy).map_err(|_| NOT_KEPT)?;
        let built = Arc::new(OverrideLimiter {
            limiter,
            prepared,
            policy_header: headers::render_policy(&policy),
            policy,
            unit,
            requests_per_unit: count,
        });
        overrides.insert((unit, count), (Arc::clone(&built), now));
        Ok(built)
    }
}

impl<S: Leasable + Clone + 'static> Snapshot<S> {
    fn build(
        store: S,
        rules: RulesConfig,
        failure: FailurePolicy,
        leases: Option<LeaseConfig>,
    ) -> Result<Self, ServiceError> {
        let mut policies = rules.policies().into_iter();
        // A table needs a policy; a configuration may have none (every rule unlimited).
        let first = policies.next().unwrap_or_else(placeholder_policy);
        let table = policies.try_fold(PolicyTable::new(first), PolicyTable::with_policy)?;
        let names: Vec<NamedPolicy> = table.policies().to_vec();
        let builder = ResilientLimiter::builder(store, table, failure);
        let limiter: Deciding<S> = match leases {
            None => builder.build()?.into(),
            Some(config) => {
                // Leases renew and return from spawned tasks, their timers included (the
                // limiter starts them in `build`): a runtime must be running.
                tokio::runtime::Handle::try_current().map_err(|_| ServiceError::NoRuntime)?;
                builder.leases(config).build()?.into()
            }
        };
        let decider = Decider {
            prepared: prepare_all(&limiter, &names)?,
            limiter,
        };
        Ok(Self {
            metrics: RuleMetrics::new(&rules),
            rules,
            decider,
        })
    }

    /// Where the policy named `name` is decided.
    fn target(&self, name: &str) -> Option<Target<'_, S>> {
        let (name, prepared) = self.decider.prepared.get_key_value(name)?;
        Some(Target(&self.decider.limiter, prepared, name))
    }

    /// Gives back every unit this snapshot's leases hold and stops their timers (after a
    /// reload swapped it out, or at shutdown): `shutdown` ends the limiter's timer loop.
    async fn release(&self) {
        self.decider.limiter.shutdown().await;
    }
}

/// Each policy prepared by `limiter`, by name.
fn prepare_all<L: Limiter>(
    limiter: &L,
    policies: &[NamedPolicy],
) -> Result<HashMap<String, L::Prepared>, ServiceError> {
    policies
        .iter()
        .map(|policy| {
            Limiter::prepare(limiter, policy)
                .map(|prepared| (policy.name().to_owned(), prepared))
                .map_err(|e| ServiceError::Limiter(ResilienceConfigError::from(e)))
        })
        .collect()
}

/// What to do with one descriptor.
enum Plan<'a, S: Leasable + Clone + 'static> {
    Unmatched,
    /// A `limit` override of zero requests: over the limit, nothing to decide.
    Zero,
    Replaced,
    Rule {
        rule: &'a Rule,
        key: Vec<u8>,
        label: Cow<'a, str>,
        cost: u64,
        negative: bool,
    },
    Override {
        limiter: Arc<OverrideLimiter<S>>,
        key: Vec<u8>,
        cost: u64,
        negative: bool,
        label: Cow<'a, str>,
    },
}

/// Where one descriptor is decided: a limiter and one of its policies, prepared and by
/// name. (The trait's methods are called by path: `ResilientLimiter`'s inherent ones of the
/// same names take a policy name.)
struct Target<'a, S: Leasable + Clone + 'static>(&'a Deciding<S>, &'a TablePolicy, &'a str);

impl<S: Leasable + Clone + 'static> Clone for Target<'_, S> {
    fn clone(&self) -> Self {
        Target(self.0, self.1, self.2)
    }
}

impl<S: Leasable + Clone + 'static> Target<'_, S> {
    /// Charges `cost`: the decision, and whether the store counted it (its own answer, or
    /// a lease's, whose block it counted). A failure policy's admission, or a reuse of the
    /// allow cache, was never counted there: a refund of it would give the store units it
    /// never took.
    async fn acquire(&self, key: &[u8], cost: u64) -> Result<(Decision, bool), DecideError> {
        let decided = self
            .0
            .acquire_as(self.2, key, cost)
            .await
            .map_err(DecideError::from)?;
        // An admission is the store's own exactly when its source is exact (the store, or
        // a lease it counted); the callers charge admissions only.
        let counted = decided.source.is_exact();
        Ok((decided.decision, counted))
    }

    async fn peek(&self, key: &[u8], cost: u64) -> Result<Decision, DecideError> {
        Limiter::peek(self.0, None, self.1, key, cost).await
    }

    /// A refund goes to the store either way (a leased admission's too: docs/leases.md).
    /// A token bucket leased as rate has none: refusing it only under-admits.
    async fn refund(&self, key: &[u8], amount: u64) -> Result<(), DecideError> {
        Limiter::refund(self.0, None, self.1, key, amount).await
    }
}

struct Charge<'a, S: Leasable + Clone + 'static> {
    target: Target<'a, S>,
    key: Vec<u8>,
    cost: u64,
}

/// Decides one descriptor: gives `cost` back (`is_negative_hits`), peeks (the request is
/// already denied, or the cost is zero), or charges it and remembers the charge.
async fn decide<'a, S: Leasable + Clone + 'static>(
    target: &Target<'a, S>,
    key: &[u8],
    cost: u64,
    negative: bool,
    denied: bool,
    charged: &mut Vec<Charge<'a, S>>,
) -> Result<Decision, DecideError> {
    if negative {
        target.refund(key, cost).await?;
        return target.peek(key, 0).await;
    }
    if denied || cost == 0 {
        // Nothing is taken. A check (a cost of zero) asks whether one more would be
        // admitted, so it can answer OVER_LIMIT, as envoyproxy/ratelimit's "check only"
        // can (before, a cost of zero was always admitted); an admitted look shows what is
        // left now, not after a cost it did not take. With leases on, a look asks the store,
        // which counts the units servers hold as taken: a check there only looks (it would
        // refuse while this server holds units).
        let asked = if cost == 0 && target.0.is_leased() {
            0
        } else {
            cost.max(1)
        };
        return Ok(headers::peeked(target.peek(key, asked).await?, asked));
    }
    let (decision, counted) = target.acquire(key, cost).await?;
    if decision.is_allowed() && counted {
        charged.push(Charge {
            target: target.clone(),
            key: key.to_vec(),
            cost,
        });
    }
    Ok(decision)
}

fn check_bounds(request: &RateLimitRequest) -> Result<(), InvalidRequest> {
    if request.domain.is_empty() || request.domain.len() > MAX_TEXT {
        return Err(InvalidRequest::Domain);
    }
    if request.descriptors.is_empty() || request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(InvalidRequest::DescriptorCount);
    }
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        check_descriptor(index, descriptor)?;
    }
    Ok(())
}

fn check_descriptor(index: usize, descriptor: &RateLimitDescriptor) -> Result<(), InvalidRequest> {
    if descriptor.entries.is_empty() || descriptor.entries.len() > MAX_ENTRIES {
        return Err(InvalidRequest::EntryCount(index));
    }
    let bad = |e: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry| {
        e.key.is_empty() || e.key.len() > MAX_TEXT
    };
    if descriptor.entries.iter().any(bad) {
        return Err(InvalidRequest::EntryText(index));
    }
    Ok(())
}

fn all_ok(count: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: (0..count).map(|_| ok_status()).collect(),
        ..Default::default()
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    }
}

fn over_limit_status(rule: &Rule, unit: Unit, requests_per_unit: u64) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::OverLimit as i32,
        current_limit: Some(RateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: u32::try_from(requests_per_unit).unwrap_or(u32::MAX),
            unit: envoy_unit(unit) as i32,
        }),
        ..Default::default()
    }
}

fn envoy_unit(unit: Unit) -> EnvoyUnit {
    match unit {
        Unit::Named(NamedUnit::Second) => EnvoyUnit::Second,
        Unit::Named(NamedUnit::Minute) => EnvoyUnit::Minute,
        Unit::Named(NamedUnit::Hour) => EnvoyUnit::Hour,
        Unit::Named(NamedUnit::Day) => EnvoyUnit::Day,
        Unit::Named(NamedUnit::Week) => EnvoyUnit::Week,
        Unit::Named(NamedUnit::Month) => EnvoyUnit::Month,
        Unit::Named(NamedUnit::Year) => EnvoyUnit::Year,
        Unit::Window(_) => EnvoyUnit::Unknown,
    }
}

fn proto_duration(span: Micros) -> ProtoDuration {
    let us = span.as_micros();
    ProtoDuration {
        seconds: i64::try_from(us / 1_000_000).unwrap_or(i64::MAX),
        // Below 10^9: fits.
        nanos: ((us % 1_000_000) * 1_000) as i32,
    }
}

/// How a rule's descriptor was answered, as `rein_server_decisions_total`'s `outcome`.
#[derive(Clone, Copy)]
enum Outcome {
    Within,
    Near,
    Over,
    Shadow,
    Unlimited,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Within,
        Outcome::Near,
        Outcome::Over,
        Outcome::Shadow,
        Outcome::Unlimited,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Within => "within_limit",
            Outcome::Near => "near_limit",
            Outcome::Over => "over_limit",
            Outcome::Shadow => "shadow_mode",
            Outcome::Unlimited => "unlimited",
        }
    }
}

/// `rein_server_decisions_total`'s counters of every rule, registered once per
/// configuration: a counter looked up by its labels on every decision cost more than the
/// decision in process (hashing the labels, a registry lookup).
#[derive(Default)]
struct RuleMetrics {
    by_label: HashMap<String, [metrics::Counter; 5]>,
}

impl RuleMetrics {
    fn new(rules: &RulesConfig) -> Self {
        let mut by_label = HashMap::new();
        for label in rules.rule_labels() {
            let counters = Outcome::ALL.map(|outcome| {
                metrics::counter!(
                    "rein_server_decisions_total",
                    "rule" => label.clone(),
                    "outcome" => outcome.as_str()
                )
            });
            by_label.insert(label, counters);
        }
        Self { by_label }
    }

    /// Counts one descriptor of `label` (a rule's, or with `detailed_metric` one naming
    /// the matched values, registered on first use: at most [`MAX_DETAILED_LABELS`] of
    /// those per process, the values past them counted as [`DETAILED_OVERFLOW`]).
    fn count(&self, label: &str, outcome: Outcome) {
        if let Some(counters) = self.by_label.get(label) {
            counters[outcome as usize].increment(1);
            return;
        }
        let label = detailed_label(label);
        metrics::counter!(
            "rein_server_decisions_total",
            "rule" => label.to_owned(),
            "outcome" => outcome.as_str()
        )
        .increment(1);
    }
}

/// The most distinct `detailed_metric` labels one process exports: each is a series the
/// exporter keeps for the life of the process, and the values come from requests
/// (a `remote_address` rule would otherwise grow one per client address).
pub const MAX_DETAILED_LABELS: usize = 10_000;

/// The longest `detailed_metric` label exported: every scrape carries each one.
pub const MAX_DETAILED_LABEL_BYTES: usize = 256;

/// The `rule` label of the `detailed_metric` counts past [`MAX_DETAILED_LABELS`] or
/// [`MAX_DETAILED_LABEL_BYTES`].
pub const DETAILED_OVERFLOW: &str = "detailed_overflow";

/// The `detailed_metric` labels exported so far, across reloads (the exporter keeps them).
static DETAILED_LABELS: std::sync::OnceLock<RwLock<std::collections::HashSet<String>>> =
    std::sync::OnceLock::new();

/// `label` if it is exported already or there is room for it (and it is at most
/// [`MAX_DETAILED_LABEL_BYTES`] long), else [`DETAILED_OVERFLOW`].
fn detailed_label(label: &str) -> &str {
    if label.len() > MAX_DETAILED_LABEL_BYTES {
        return DETAILED_OVERFLOW;
    }
    let labels = DETAILED_LABELS.get_or_init(RwLock::default);
    // A label seen before (the usual case) costs a shared read, not the lock.
    if labels
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(label)
    {
        return label;
    }
    let mut seen = labels.write().unwrap_or_else(PoisonError::into_inner);
    if seen.contains(label) {
        label
    } else if seen.len() < MAX_DETAILED_LABELS {
        seen.insert(label.to_owned());
        label
    } else {
        DETAILED_OVERFLOW
    }
}

/// The table's policy when the rules have none: never decided with.
fn placeholder_policy() -> NamedPolicy {
    // Valid by construction: a literal name and limit.
    let limit = Limit::fixed_window(1, Micros::from_secs(1));
    match limit.map(|l| NamedPolicy::new("rein-server-none", Policy::single(l))) {
        Ok(Ok(policy)) => policy,
        _ => unreachable!("a literal policy is valid"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detailed_labels_stop_at_their_bound_and_keep_those_exported() {
        let label = |i: usize| format!("d.remote_address_10.0.{}.{}", i / 256, i % 256);
        for i in 0..MAX_DETAILED_LABELS {
            assert_eq!(detailed_label(&label(i)), label(i));
        }
        assert_eq!(detailed_label("d.remote_address_new"), DETAILED_OVERFLOW);
        let long = format!("d.path_{}", "x".repeat(MAX_DETAILED_LABEL_BYTES));
        assert_eq!(detailed_label(&long), DETAILED_OVERFLOW, "too long a label");
        assert_eq!(
            detailed_label(&label(7)),
            label(7),
            "one exported stays its own"
        );
    }
}
