//! rein: rate limits shared between servers, exact, that keep answering when the store
//! does not.
//!
//! This is the one dependency an application adds for the common paths; the crates behind
//! it (`rein-core`, `rein-memory`, `rein-redis`, `rein-resilient`, `rein-tower`) are
//! reachable from here (`rein::core`, `rein::memory`, `rein::redis`, `rein::http`), so
//! nothing else needs importing.
//!
//! # Where to start
//! - **The limits**: [`Limit`] (token bucket, fixed window, sliding log, sliding counter),
//!   [`Policy`] (up to 8 limits decided all or nothing), [`NamedPolicy`], [`Micros`]; the
//!   rest of their crate is [`core`]: the exact math at an explicit
//!   [`Timestamp`](core::Timestamp), the [`Decision`](core::Decision) every answer carries,
//!   and the [`Limiter`](core::Limiter) trait the stores implement.
//! - **The stores**: [`redis::RedisStore`] (limits shared through Redis; the default
//!   `redis` feature) and [`memory::MemoryStore`] (in process).
//! - **[`ResilientLimiter`]** over a store: every request gets an answer within the
//!   store's deadline, by the [`FailurePolicy`] the operator chose, and each answer says
//!   where it came from ([`Decided`], [`Source`]). Build it with a [`PolicyTable`] (which
//!   policy a key gets) and, if needed, [`BreakerConfig`], [`AllowCacheConfig`], a clock.
//! - **Leases**, an option of the same builder
//!   ([`ResilientLimiterBuilder::leases`] with a [`LeaseConfig`], over a leasable store):
//!   hot keys decided from blocks reserved in the store, at memory speed and with zero
//!   over-admission; the same `acquire` and the same [`Decided`], whose [`Source`] is
//!   `Lease` or `LocalDenial` when the leases answered (docs/leases.md).
//! - **HTTP** (the `http` feature): `rein::http` is rein-tower, a `tower` layer for axum
//!   and hyper services with the IETF `RateLimit` headers, whose limits, routes and Redis
//!   come from a TOML file (`rein::http::Config`; docs/http.md, docs/config.md).
//! - The machinery, for those who need it: [`breaker`], [`lease`], [`region`],
//!   [`fallback`], [`stats`].
//!
//! ```toml
//! [dependencies]
//! rein = { version = "0.1", features = ["http"] }
//! ```
//!
//! docs/architecture.md draws the crates and the decision path; docs/failure.md states
//! what each failure policy guarantees while Redis is away.
#![deny(missing_docs)]

pub use rein_resilient::*;

/// rein-tower: rate limits for HTTP services as a `tower::Layer` ([`http::RateLimitLayer`]),
/// with the IETF `RateLimit` headers, and the policies, routes and Redis of a TOML file
/// ([`http::Config`]). With the `http` feature.
#[cfg(feature = "http")]
pub use rein_tower as http;

/// The README's examples, compiled and run as doctests so that they stay true.
#[cfg(all(doctest, feature = "http"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
