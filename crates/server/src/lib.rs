//! rein-server: Envoy's rate-limit service, backed by rein.
//!
//! Envoy (and Istio, Envoy Gateway, Contour, Emissary, Kuadrant, or any gRPC client) asks
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` whether a request is over
//! its limits. This crate answers it with rein: the limits are read from envoyproxy/
//! ratelimit's YAML files unchanged ([`RulesConfig`]), extended with rein's algorithms, any
//! window, bursts and several limits per descriptor; each decision goes through
//! `rein::ResilientLimiter` (a deadline, a circuit breaker and a failure policy) over Redis
//! (standalone or Cluster) or, with no Redis configured, the in-process store
//! (`rein_memory::MemoryStore`; one process's limit: a reload keeps an unchanged rule's
//! counts, and starts a rule whose numbers changed afresh, where Redis carries them over).
//!
//! Start with the binary (`rein-server --config DIR`, `--help` lists every setting) or, in
//! code, [`RateLimitService`] with [`grpc::server`] and [`http::router`].
//!
//! # What it does not do
//! - It does not serve xDS-delivered configuration: the rules come from files, reloaded
//!   when they change or on `SIGHUP`.
//!
//! # Key design decision: decisions are rein's, the protocol is Envoy's
//! The service converts Envoy's descriptors into rein policies and keys and nothing more:
//! the algorithms are rein-core's, the failure handling `rein`'s, the headers rein-tower's
//! renderer, so everything measured and proven for those holds behind Envoy unchanged.
//! Several descriptors in one request are decided all or nothing (see [`service`]).
//!
//! # Layout
//! - `config.rs`: [`RulesConfig`], the YAML rules; `yaml.rs`, the spanned YAML tree.
//! - `matcher.rs`: matching a descriptor to a rule.
//! - `service.rs`: [`RateLimitService`], where a request is decided.
//! - `grpc.rs`, `http.rs`: the two front ends; `tls.rs`, TLS for both.
#![deny(missing_docs)]

pub mod config;
pub mod grpc;
pub mod http;
pub mod matcher;
pub mod service;
pub mod tls;
mod yaml;

pub use config::{Problem, RulesConfig, RulesError, RulesWarning};
pub use service::{InvalidRequest, RateLimitService, Reload, ServiceSettings};
