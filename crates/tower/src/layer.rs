//! [`RateLimitLayer`] and its [`RateLimitService`]: the request path. Find the route, take
//! the key, ask the limiter within the deadline, and either call the inner service (adding
//! `RateLimit`) or answer by itself (429 with `Retry-After`, or the configured answer to a
//! missing key or an unavailable limiter).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER};
use http::request::Parts;
use http::{Request, Response, StatusCode};
use rein_core::limiter::DEADLINE_MARGIN;
use rein_core::{DecideError, Decision, KeyError, Limiter, NamedPolicy, OverCapacity, StoreError};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use crate::body::RateLimitBody;
use crate::headers::{self, RATELIMIT, RATELIMIT_POLICY};
use crate::{KeySource, LayerError, Route};

/// A `tower::Layer` that rate-limits requests through any [`Limiter`]: a
/// `rein::ResilientLimiter` over Redis for limits shared between servers, a
/// `rein_redis::RedisStore` directly, or a `rein_memory::MemoryStore` in one process.
///
/// The layer is cheap to clone (an `Arc`), keeps no per-connection state, and so does its
/// service: apply it to a whole axum `Router`, to one route with `route_layer`, or to a hyper
/// service through `tower::ServiceBuilder`.
///
/// Per request, the first matching [`Route`] gives the policy, the key ([`KeySource`]) and
/// the cost; then:
///
/// | limiter answer | response |
/// |---|---|
/// | admitted | the inner service's, plus `RateLimit` (see [`AdmittedHeaders`]; none for a policy in [shadow mode](RateLimitLayerBuilder::shadow)) |
/// | denied | `429 Too Many Requests`, `Retry-After`, `RateLimit-Policy`, `RateLimit` |
/// | no key | [`on_missing_key`](RateLimitLayerBuilder::on_missing_key) (default 500, logged) |
/// | no decision in time | [`on_unavailable`](RateLimitLayerBuilder::on_unavailable) (default 503) |
/// | denied, the policy in [shadow mode](RateLimitLayerBuilder::shadow) | the inner service's, without rate-limit headers |
/// | cost above capacity | `413 Content Too Large`: waiting never helps |
///
/// ```
/// use rein::core::{Limit, Micros, NamedPolicy, Policy};
/// use rein::memory::MemoryStore;
/// use rein_tower::{KeySource, RateLimitLayer, Route};
///
/// let api = NamedPolicy::new(
///     "api",
///     Policy::single(Limit::token_bucket(100, 10, Micros::from_secs(1))?),
/// )?;
/// let layer = RateLimitLayer::builder(MemoryStore::new())
///     .policy(api)
///     .default_key(KeySource::peer_ip())
///     .route(Route::prefix("/health").exempt())
///     .route(Route::any().policy("api"))
///     .build()?;
/// let app: axum::Router = axum::Router::new()
///     .route("/", axum::routing::get(|| async { "hello" }))
///     .layer(layer);
/// # let _ = app;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitLayer<L: Limiter> {
    shared: Arc<ArcSwap<Shared<L>>>,
}

/// Settings for a [`RateLimitLayer`], from [`RateLimitLayer::builder`].
pub struct RateLimitLayerBuilder<L> {
    limiter: L,
    policies: Vec<NamedPolicy>,
    shadow: Vec<String>,
    routes: Vec<Route>,
    default_key: KeySource,
    on_missing_key: Answer,
    on_unavailable: Answer,
    admitted: AdmittedHeaders,
    deadline: Option<Duration>,
}

/// The service of a [`RateLimitLayer`] around `S`.
pub struct RateLimitService<L: Limiter, S> {
    inner: S,
    shared: Arc<ArcSwap<Shared<L>>>,
}

/// What the layer does with a request it cannot decide on: answer with a status, or let it
/// through unlimited. In a config file: a status code (`503`) or `"pass"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Answer with this status and a one-line text body; the inner service is not called.
    Status(StatusCode),
    /// Call the inner service as if admitted.
    Pass,
}

/// Which rate-limit headers an admitted response carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AdmittedHeaders {
    /// None.
    None,
    /// `RateLimit` (remaining and reset of the deciding limit). The default.
    #[default]
    RateLimit,
    /// `RateLimit` and `RateLimit-Policy`.
    All,
}

/// The future of [`RateLimitService::call`].
pub struct ResponseFuture<B, E> {
    inner: Pin<Box<dyn Future<Output = Answered<B, E>> + Send>>,
}

/// What the service answers: a response, or the inner service's error.
type Answered<B, E> = Result<Response<RateLimitBody<B>>, E>;

struct Shared<L: Limiter> {
    limiter: L,
    policies: Vec<PolicyEntry<L::Prepared>>,
    routes: Vec<CompiledRoute>,
    default_key: KeySource,
    on_missing_key: Answer,
    on_unavailable: Answer,
    admitted: AdmittedHeaders,
    deadline: Option<Duration>,
}

/// A policy prepared for the limiter, with its `RateLimit-Policy` value rendered once.
struct PolicyEntry<P> {
    named: NamedPolicy,
    prepared: P,
    policy_header: Option<HeaderValue>,
    /// In shadow mode: what it denies is let through, and counted here.
    shadow: Option<Shadow>,
}

/// A policy in shadow mode: its count of what it would have denied.
struct Shadow {
    #[cfg(feature = "metrics")]
    denials: metrics::Counter,
}

impl Shadow {
    fn new(policy: &str) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = policy;
        Self {
            #[cfg(feature = "metrics")]
            denials: metrics::counter!(
                "rein_http_shadow_denials_total",
                "policy" => policy.to_owned(),
            ),
        }
    }
}

/// A route with its policy resolved to an index into `Shared::policies`.
struct CompiledRoute {
    route: Route,
    policy: Option<usize>,
    #[cfg(feature = "metrics")]
    counters: crate::metrics::RouteCounters,
}

/// What the layer decided for one request, before the inner service runs.
enum Verdict {
    /// Call the inner service; add these headers to its response.
    Pass(Vec<(HeaderName, HeaderValue)>),
    /// Answer with this status, headers and text.
    Respond(StatusCode, Vec<(HeaderName, HeaderValue)>, String),
}

/// How a request ended at the layer: the `outcome` of spans and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HttpOutcome {
    Allowed,
    Denied,
    /// No usable key: no decision (the span records it, the metrics count it).
    MissingKey,
    Unavailable,
    TooCostly,
    /// Denied by a policy in shadow mode, and let through.
    ShadowDenied,
}

impl<L: Limiter> RateLimitLayer<L> {
    /// Settings for a layer over `limiter`. Defaults: no policies and no routes (add both),
    /// the key is the peer IP, a missing key answers 500, an unavailable limiter 503,
    /// admitted responses carry `RateLimit`, and the deadline is the limiter's own
    /// ([`Limiter::deadline`]) plus 5 ms, or none for a limiter that never waits.
    pub fn builder(limiter: L) -> RateLimitLayerBuilder<L> {
        RateLimitLayerBuilder {
            limiter,
            policies: Vec::new(),
            shadow: Vec::new(),
            routes: Vec::new(),
            default_key: KeySource::peer_ip(),
            on_missing_key: Answer::Status(StatusCode::INTERNAL_SERVER_ERROR),
            on_unavailable: Answer::Status(StatusCode::SERVICE_UNAVAILABLE),
            admitted: AdmittedHeaders::RateLimit,
            deadline: None,
        }
    }

    /// The limiter the layer asks now (another after a [`replace`](Self::replace)).
    pub fn limiter(&self) -> impl std::ops::Deref<Target = L> + use<L> {
        Current(self.shared.load_full())
    }

    /// The policies, in the order they were added.
    pub fn policies(&self) -> Vec<NamedPolicy> {
        let shared = self.shared.load();
        shared.policies.iter().map(|e| e.named.clone()).collect()
    }

    /// The longest the layer waits for the limiter before answering
    /// [`on_unavailable`](RateLimitLayerBuilder::on_unavailable), if bounded.
    pub fn deadline(&self) -> Option<Duration> {
        self.shared.load().deadline
    }

    /// Puts `next`'s limiter, policies, routes and settings in the place of this layer's,
    /// at once, for this layer, every clone of it and every service made from them (an
    /// axum `Router` already serving included). A request already being decided finishes
    /// with what it started with; every request that starts after this returns is decided
    /// by `next`'s. Nothing is counted twice: the limiter's state lives in its store, under
    /// the policies' names, so a policy kept by name keeps what it counted (a changed one
    /// continues from its stored state with the new numbers). `next` itself is left as
    /// it was. [`crate::Reloader`] does this from a config file.
    pub fn replace(&self, next: &RateLimitLayer<L>) {
        self.shared.store(next.shared.load_full());
    }
}

/// The limiter of what a layer held at one moment.
struct Current<L: Limiter>(Arc<Shared<L>>);

impl<L: Limiter> std::ops::Deref for Current<L> {
    type Target = L;

    fn deref(&self) -> &L {
        &self.0.limiter
    }
}

impl<L: Limiter> RateLimitLayerBuilder<L> {
    /// Adds a policy that routes can name. Its name must be unique in the layer.
    pub fn policy(mut self, policy: NamedPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// Puts the policy named `policy` in shadow mode, to try a limit on live traffic
    /// before it denies anyone: its requests are decided and counted as usual, no response
    /// shows it (no rate-limit headers, admitted or not: a client pacing itself on them
    /// would slow down for a trial), and a request it would deny is passed to the inner
    /// service, logged at debug level and counted in `rein_http_shadow_denials_total{policy}` (with
    /// the `metrics` feature; the route's `rein_http_requests_total` counts it as
    /// `shadow_denied`). Such a request takes nothing from the limit, as for any denial.
    /// What it cannot decide passes too, counted as it is (`missing_key`, `too_costly`,
    /// `unavailable`): a trial refuses no one. A config file sets it with `shadow = true` under `[policies.NAME]`; a reload
    /// ([`crate::Reloader`]) turns it on or off without a restart.
    pub fn shadow(mut self, policy: impl Into<String>) -> Self {
        self.shadow.push(policy.into());
        self
    }

    /// Adds a route after those already added (the first matching route applies).
    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// The key of routes that set none (default [`KeySource::peer_ip`]).
    pub fn default_key(mut self, key: KeySource) -> Self {
        self.default_key = key;
        self
    }

    /// The answer to a request whose key cannot be extracted (default 500, with an error
    /// log line naming the route). [`Answer::Pass`] lets it through unlimited.
    pub fn on_missing_key(mut self, answer: Answer) -> Self {
        self.on_missing_key = answer;
        self
    }

    /// The answer when the limiter gives no decision within the deadline (default 503).
    /// Over a `rein::ResilientLimiter` its failure policy answers first, for acquires and
    /// peeks alike; this applies to what still fails (a limiter without a failure policy,
    /// or this layer's own deadline).
    pub fn on_unavailable(mut self, answer: Answer) -> Self {
        self.on_unavailable = answer;
        self
    }

    /// Which headers admitted responses carry (default [`AdmittedHeaders::RateLimit`]).
    pub fn admitted_headers(mut self, headers: AdmittedHeaders) -> Self {
        self.admitted = headers;
        self
    }

    /// The longest the layer waits for one decision (default: the limiter's deadline plus
    /// 5 ms, or none if the limiter states none). A limiter that bounds its own calls
    /// normally answers first; this one makes sure no request hangs on a limiter that does
    /// not.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The layer. Errors if two policies share a name, a route names a policy not added,
    /// routes count one policy by key sources whose keys could be another client's
    /// ([`LayerError::MixedKeySources`]), the limiter cannot prepare a policy, or the
    /// deadline is zero or not longer than the limiter's own.
    pub fn build(self) -> Result<RateLimitLayer<L>, LayerError> {
        if self.deadline.is_some_and(|d| d.is_zero()) {
            return Err(LayerError::ZeroDeadline);
        }
        if let (Some(layer), Some(limiter)) = (self.deadline, self.limiter.deadline())
            && layer <= limiter
        {
            return Err(LayerError::DeadlineNotAboveLimiter { layer, limiter });
        }
        let mut policies: Vec<PolicyEntry<L::Prepared>> = Vec::with_capacity(self.policies.len());
        for named in self.policies {
            if policies.iter().any(|p| p.named.name() == named.name()) {
                return Err(LayerError::DuplicatePolicy(named.name().to_owned()));
            }
            let prepared = self.limiter.prepare(&named)?;
            let policy_header = HeaderValue::try_from(headers::render_policy(&named)).ok();
            let shadow = if self.shadow.iter().any(|s| s == named.name()) {
                Some(Shadow::new(named.name()))
            } else {
                None
            };
            policies.push(PolicyEntry {
                named,
                prepared,
                policy_header,
                shadow,
            });
        }
        if let Some(unknown) = self
            .shadow
            .iter()
            .find(|name| !policies.iter().any(|p| p.named.name() == name.as_str()))
        {
            return Err(LayerError::UnknownShadowPolicy(unknown.clone()));
        }
        if let Some((first, second)) =
            crate::route::mixed_key_sources(&self.routes, &self.default_key)
        {
            let (first, second) = (&self.routes[first], &self.routes[second]);
            return Err(LayerError::MixedKeySources {
                policy: second.policy_name().unwrap_or_default().to_owned(),
                first: first.name().to_owned(),
                second: second.name().to_owned(),
            });
        }
        let routes = self
            .routes
            .into_iter()
            .map(|route| {
                let policy = match route.policy_name() {
                    None => None,
                    Some(name) => Some(
                        policies
                            .iter()
                            .position(|p| p.named.name() == name)
                            .ok_or_else(|| LayerError::UnknownPolicy {
                                route: route.name().to_owned(),
                                policy: name.to_owned(),
                            })?,
                    ),
                };
                Ok(CompiledRoute {
                    #[cfg(feature = "metrics")]
                    counters: crate::metrics::RouteCounters::new(route.name()),
                    route,
                    policy,
                })
            })
            .collect::<Result<Vec<_>, LayerError>>()?;
        let deadline = self.deadline.or_else(|| {
            self.limiter
                .deadline()
                .map(|d| d.saturating_add(DEADLINE_MARGIN))
        });
        Ok(RateLimitLayer {
            shared: Arc::new(ArcSwap::from_pointee(Shared {
                limiter: self.limiter,
                policies,
                routes,
                default_key: self.default_key,
                on_missing_key: self.on_missing_key,
                on_unavailable: self.on_unavailable,
                admitted: self.admitted,
                deadline,
            })),
        })
    }
}

impl<L: Limiter, S> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimitService<L, S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L, S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<L, S>
where
    L: Limiter + 'static,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready is the one to call; the clone stays behind for
        // the next request (tower's usual pattern for services called from a future).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // What the layer holds now: a `replace` while this request runs does not change it.
        let shared = self.shared.load_full();
        ResponseFuture {
            inner: Box::pin(async move {
                let (parts, body) = request.into_parts();
                match shared.check(&parts).await {
                    Verdict::Pass(headers) => {
                        let response = inner.call(Request::from_parts(parts, body)).await?;
                        let mut response = response.map(RateLimitBody::inner);
                        response.headers_mut().extend(headers);
                        Ok(response)
                    }
                    Verdict::Respond(status, headers, text) => {
                        let mut response = Response::new(RateLimitBody::message(text));
                        *response.status_mut() = status;
                        let map = response.headers_mut();
                        map.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                        map.extend(headers);
                        Ok(response)
                    }
                }
            }),
        }
    }
}

impl<L: Limiter> Shared<L> {
    /// Everything before the inner service: route, key, cost, decision.
    async fn check(&self, parts: &Parts) -> Verdict {
        let path = parts.uri.path();
        let Some(route) = self
            .routes
            .iter()
            .find(|r| r.route.matches(&parts.method, path))
        else {
            return Verdict::Pass(Vec::new());
        };
        let Some(entry) = route.policy.map(|index| &self.policies[index]) else {
            return Verdict::Pass(Vec::new());
        };
        let source = route.route.key.as_ref().unwrap_or(&self.default_key);
        let span = tracing::debug_span!(
            "rein_http",
            route = route.route.name(),
            policy = entry.named.name(),
            cost = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        // Empty, or longer than a limiter takes (`MAX_KEY_BYTES`): no key.
        let key = match source.extract(parts) {
            Some(key) if KeyError::check(&key).is_ok() => key,
            _ => return self.missing_key(&span, route, source, entry),
        };
        let cost = route.route.cost.of(parts);
        span.record("cost", cost);
        let result = self
            .decide(route.route.peek, entry, &key, cost)
            .instrument(span.clone())
            .await;
        let (outcome, verdict) = match result {
            // (A policy in shadow mode shows clients nothing: `shadowed` below.)
            Ok(decision) if decision.is_allowed() => (
                HttpOutcome::Allowed,
                Verdict::Pass(self.admitted_headers(entry, &decision)),
            ),
            Ok(decision) => match &entry.shadow {
                None => (HttpOutcome::Denied, denied(entry, &decision)),
                Some(shadow) => {
                    tracing::debug!(
                        route = route.route.name(),
                        policy = entry.named.name(),
                        retry_after_us = decision.retry_after.as_micros(),
                        "shadow mode: would have denied; passing"
                    );
                    #[cfg(feature = "metrics")]
                    shadow.denials.increment(1);
                    #[cfg(not(feature = "metrics"))]
                    let _ = shadow;
                    (HttpOutcome::ShadowDenied, Verdict::Pass(Vec::new()))
                }
            },
            Err(DecideError::InsufficientCapacity(OverCapacity { cost, capacity })) => (
                HttpOutcome::TooCostly,
                Verdict::Respond(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Vec::new(),
                    format!("this request costs {cost}, more than the limit's {capacity}\n"),
                ),
            ),
            Err(DecideError::InvalidKey(_)) => {
                return self.missing_key(&span, route, source, entry);
            }
            Err(error) => {
                let _entered = span.enter();
                tracing::warn!(%error, route = route.route.name(), "the rate limiter gave no decision");
                (
                    HttpOutcome::Unavailable,
                    answer(
                        self.on_unavailable,
                        "the rate limiter is unavailable; try again later\n",
                    ),
                )
            }
        };
        span.record("outcome", outcome.as_str());
        #[cfg(feature = "metrics")]
        route.counters.count(outcome);
        shadowed(entry, verdict)
    }

    /// Asks the limiter, bounded by the deadline.
    async fn decide(
        &self,
        peek: bool,
        entry: &PolicyEntry<L::Prepared>,
        key: &[u8],
        cost: u64,
    ) -> Result<Decision, DecideError> {
        let call = async {
            if peek {
                let peeked = self.limiter.peek(None, &entry.prepared, key, cost).await;
                peeked.map(|decision| headers::peeked(decision, cost))
            } else {
                self.limiter.acquire(None, &entry.prepared, key, cost).await
            }
        };
        match self.deadline {
            None => call.await,
            Some(deadline) => tokio::time::timeout(deadline, call)
                .await
                .unwrap_or(Err(StoreError::Timeout(deadline).into())),
        }
    }

    fn missing_key(
        &self,
        span: &tracing::Span,
        route: &CompiledRoute,
        source: &KeySource,
        entry: &PolicyEntry<L::Prepared>,
    ) -> Verdict {
        span.record("outcome", HttpOutcome::MissingKey.as_str());
        // Debug, not error: any client can send a request without the header, and one line
        // each would let it fill the log (a missing peer address, the deployment's fault,
        // is logged at error once by the key's extraction). Counted as `missing_key`.
        tracing::debug!(
            route = route.route.name(),
            key = ?source,
            on_missing_key = ?self.on_missing_key,
            "no usable rate-limit key in the request (none, empty, or over 1 KiB)"
        );
        #[cfg(feature = "metrics")]
        route.counters.count(HttpOutcome::MissingKey);
        shadowed(
            entry,
            answer(
                self.on_missing_key,
                "this request carries no rate-limit key\n",
            ),
        )
    }

    fn admitted_headers(
        &self,
        entry: &PolicyEntry<L::Prepared>,
        decision: &Decision,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::new();
        if self.admitted == AdmittedHeaders::None {
            return out;
        }
        if self.admitted == AdmittedHeaders::All
            && let Some(policy) = &entry.policy_header
        {
            out.push((RATELIMIT_POLICY.clone(), policy.clone()));
        }
        if let Some(value) = rate_limit_value(entry, decision) {
            out.push((RATELIMIT.clone(), value));
        }
        out
    }
}

/// The 429 for a denial: `Retry-After`, `RateLimit-Policy`, `RateLimit`. A failure
/// policy's "fail closed" ([`Decision::is_blind`]) knows nothing of the limit: no
/// `RateLimit`, and a `Retry-After` of at least a second (before, `0` and `r=0;t=0` while
/// the breaker was closed, which sent clients straight back at a struggling Redis).
fn denied<P>(entry: &PolicyEntry<P>, decision: &Decision) -> Verdict {
    let blind = decision.is_blind();
    let retry_after = headers::retry_after_secs(decision);
    let mut out = vec![(RETRY_AFTER, HeaderValue::from(retry_after))];
    if let Some(policy) = &entry.policy_header {
        out.push((RATELIMIT_POLICY.clone(), policy.clone()));
    }
    if let Some(value) = rate_limit_value(entry, decision) {
        out.push((RATELIMIT.clone(), value));
    }
    let body = match blind {
        true => format!("the rate limit cannot be checked now; retry in {retry_after} s\n"),
        false => format!("rate limit exceeded; retry in {retry_after} s\n"),
    };
    Verdict::Respond(StatusCode::TOO_MANY_REQUESTS, out, body)
}

/// The `RateLimit` header of `decision`, none for a failure policy's answer (see
/// [`headers::render_rate_limit`]).
fn rate_limit_value<P>(entry: &PolicyEntry<P>, decision: &Decision) -> Option<HeaderValue> {
    let deciding = headers::deciding_limit(entry.named.policy(), decision);
    let text = headers::render_rate_limit(&entry.named, deciding, decision)?;
    // Rendered text is visible ASCII only, so this never fails; no header beats a panic.
    HeaderValue::try_from(text).ok()
}

/// `verdict`, except that a policy in shadow mode shows clients nothing: it refuses no one
/// (what it could not decide, no key, a cost above its capacity, no decision in time,
/// passes, counted and logged as it is, as a denial it would have given does), and adds no
/// headers (a client pacing itself on `RateLimit` would be slowed by a trial).
fn shadowed<P>(entry: &PolicyEntry<P>, verdict: Verdict) -> Verdict {
    match entry.shadow {
        Some(_) => Verdict::Pass(Vec::new()),
        None => verdict,
    }
}

fn answer(answer: Answer, text: &str) -> Verdict {
    match answer {
        Answer::Status(status) => Verdict::Respond(status, Vec::new(), text.to_owned()),
        Answer::Pass => Verdict::Pass(Vec::new()),
    }
}

impl HttpOutcome {
    /// `allowed`, `denied`, `missing_key`, `unavailable`, `too_costly` or `shadow_denied`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HttpOutcome::Allowed => "allowed",
            HttpOutcome::Denied => "denied",
            HttpOutcome::MissingKey => "missing_key",
            HttpOutcome::Unavailable => "unavailable",
            HttpOutcome::TooCostly => "too_costly",
            HttpOutcome::ShadowDenied => "shadow_denied",
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<L: Limiter> Clone for RateLimitLayer<L> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: Limiter, S: Clone> Clone for RateLimitService<L, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: Limiter> std::fmt::Debug for RateLimitLayer<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.shared.load();
        f.debug_struct("RateLimitLayer")
            .field(
                "policies",
                &shared
                    .policies
                    .iter()
                    .map(|p| p.named.name())
                    .collect::<Vec<_>>(),
            )
            .field(
                "routes",
                &shared.routes.iter().map(|r| &r.route).collect::<Vec<_>>(),
            )
            .field("default_key", &shared.default_key)
            .field("on_missing_key", &shared.on_missing_key)
            .field("on_unavailable", &shared.on_unavailable)
            .field("admitted", &shared.admitted)
            .field("deadline", &shared.deadline)
            .finish_non_exhaustive()
    }
}

impl<L: Limiter, S: std::fmt::Debug> std::fmt::Debug for RateLimitService<L, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<B, E> std::fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}
