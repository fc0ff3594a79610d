//! rein-tower: rate limits for HTTP services, shared through Redis, as a `tower::Layer`.
//!
//! An application reaches this crate as `rein::http`, through its one dependency `rein`
//! (the `http` feature); the examples here name it `rein_tower`.
//!
//! [`RateLimitLayer`] puts any rein-core [`Limiter`](rein_core::Limiter) in front of a
//! tower service (an axum `Router` or route, a hyper service): a `rein::ResilientLimiter`
//! over Redis so that every server of a deployment counts against one limit and keeps
//! answering when Redis does not, or a `rein_memory::MemoryStore` for one process. Per
//! request it picks a [`Route`] (path and method), a key ([`KeySource`]: peer IP, an API-key
//! header, an authenticated user, a closure; forwarding headers only through a configured
//! number of trusted proxies) and a cost, asks the limiter within its deadline, and answers
//! a denial with `429 Too Many Requests`, `Retry-After` and the IETF `RateLimit-Policy` /
//! `RateLimit` headers ([`headers`]). [`Config`] reads policies, routes and the Redis
//! connection from a TOML file and builds the limiter and the layer (docs/config.md);
//! docs/http.md measures what the layer adds per request.
//!
//! ```no_run
//! use rein_tower::Config;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = Config::load("rein.toml")?.build().await?;
//! let app: axum::Router = axum::Router::new()
//!     .route("/api/search", axum::routing::get(|| async { "results" }))
//!     .layer(layer);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // `ConnectInfo` gives the layer the peer address, the default key.
//! let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Key design decision: one generic layer over the one limiter trait
//! The layer is generic over `L: Limiter` and decides nothing itself: failure policies,
//! the circuit breaker and caches are `rein::ResilientLimiter`'s, and the math is
//! rein-core's. The layer only maps requests to `(policy, key, cost)` and decisions to
//! responses, so what is tested and measured for the limiter holds behind HTTP unchanged,
//! and a test swaps Redis for memory without touching the layer. Its state is one `Arc`
//! shared by every clone and connection: nothing is per connection (unlike tower's own
//! `RateLimit`), and nothing runs in the background (no cleanup thread; a [`Reloader`]'s
//! file watch only if asked for).
//!
//! # What it does not do
//! - It does not choose a failure policy or retry: give it a `rein::ResilientLimiter` for
//!   that; what still fails gets the layer's configured answer (503 or pass).
//! - It does not trust `X-Forwarded-For` or `Forwarded` by default, and it cannot verify
//!   that a request came through your proxies: with `trusted_hops = n`, make sure clients
//!   cannot reach the server except through exactly `n` of them.
//! - It does not group IPv6 clients by prefix: each address is its own key. Use
//!   [`KeySource::from_fn`] to key by a /64.
//! - It does not refund: a request admitted then failed still counts.
//!
//! # Layout
//! - `layer.rs`: [`RateLimitLayer`], its builder and [`RateLimitService`]: the request path.
//! - `route.rs`: [`Route`]. `key.rs`: [`KeySource`], [`PeerAddr`].
//! - `headers.rs`: rendering decisions as header values, pure.
//! - `body.rs`: [`RateLimitBody`]. `config.rs`: [`Config`] from TOML.
//! - `reload.rs`: [`Reloader`], a layer built from a file and reloaded from it while it
//!   serves.
#![deny(missing_docs)]

mod body;
mod config;
pub mod headers;
mod key;
mod layer;
#[cfg(feature = "metrics")]
mod metrics;
mod reload;
mod route;

use thiserror::Error;

pub use body::RateLimitBody;
pub use config::{BuildError, Config, HttpSettings, LoadError, RedisEndpoint, RedisSettings};
pub use key::{KeySource, PeerAddr};
pub use layer::{
    AdmittedHeaders, Answer, RateLimitLayer, RateLimitLayerBuilder, RateLimitService,
    ResponseFuture,
};
pub use reload::{ConfiguredLayer, Reload, ReloadError, Reloader};
pub use route::Route;

/// The Redis store a config file names, standalone or Cluster, as one type, so that a
/// limiter built from a file has one type whatever the file says
/// ([`Config::connect_store`]).
pub type ConfiguredStore = rein_redis::RedisStore<rein_redis::AnyConnection>;

/// The resilient limiter a config file builds over [`ConfiguredStore`], with leases or
/// without as its `[leases]` says, as one type ([`Config::limiter`]).
pub type ConfiguredLimiter =
    rein::ResilientLimiter<ConfiguredStore, rein::lease::MaybeLeased<ConfiguredStore>>;

/// Why a [`RateLimitLayer`] could not be built. Raised once, by
/// [`RateLimitLayerBuilder::build`], never per request.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LayerError {
    /// Two policies have the same name. Names select policies and are part of their store
    /// keys, so they must be unique: rename one.
    #[error("two policies are named {0:?}")]
    DuplicatePolicy(String),
    /// A route names a policy the layer does not hold. Add it with
    /// [`RateLimitLayerBuilder::policy`] or fix the route.
    #[error("route {route:?} names policy {policy:?}, which the layer does not hold")]
    UnknownPolicy {
        /// The route's name.
        route: String,
        /// The policy it names.
        policy: String,
    },
    /// A policy set to shadow mode ([`RateLimitLayerBuilder::shadow`]) is not one the layer
    /// holds. Add it with [`RateLimitLayerBuilder::policy`] or fix the name.
    #[error("shadow mode names policy {0:?}, which the layer does not hold")]
    UnknownShadowPolicy(String),
    /// The limiter cannot prepare a policy; over a `rein::ResilientLimiter`, the policy is
    /// not in its table (or differs from the table's policy of that name). Build both from
    /// the same policies.
    #[error(transparent)]
    Prepare(#[from] rein_core::PrepareError),
    /// Two routes count one policy's keys by a header and by another source (the peer
    /// address, another header, a fixed key): a client could write another's key in its
    /// header and spend that client's limit. Give each its own policy (the same limits
    /// under another name count apart).
    #[error(
        "routes {first:?} and {second:?} count policy {policy:?} by key sources whose keys \
         could be the same for different clients: a client could send another's key and \
         spend its limit; give each key source its own policy"
    )]
    MixedKeySources {
        /// The policy.
        policy: String,
        /// The earlier route.
        first: String,
        /// The later route.
        second: String,
    },
    /// The deadline is zero: every request would time out. Set a positive deadline.
    #[error("the deadline must be longer than zero")]
    ZeroDeadline,
    /// The layer's deadline is not longer than the limiter's
    /// ([`Limiter::deadline`](rein_core::Limiter::deadline)): with a frozen store every
    /// request would time out in the layer before the limiter's failure policy could
    /// answer, its breaker would see only abandoned calls and never open, and the layer
    /// would answer `on_unavailable` for as long as the store stays frozen. Leave the
    /// deadline unset (the limiter's plus 5 ms) or make it longer than the limiter's.
    #[error(
        "the layer's deadline ({layer:?}) must be longer than the limiter's ({limiter:?}), or \
         the limiter's failure policy never answers"
    )]
    DeadlineNotAboveLimiter {
        /// The layer's deadline.
        layer: std::time::Duration,
        /// The limiter's.
        limiter: std::time::Duration,
    },
}
