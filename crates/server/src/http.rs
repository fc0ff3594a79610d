//! The HTTP front end: `POST /json` (the same request and answer as gRPC, as JSON, for
//! clients without gRPC), `GET /healthz` (the process is up), `GET /readyz` (it serves a
//! configuration), and `GET /metrics` (Prometheus text, from the `metrics` facade).
//!
//! The JSON names follow protobuf's JSON mapping (camelCase), as envoyproxy/ratelimit's
//! `/json` endpoint does: `{"domain": "d", "descriptors": [{"entries": [{"key": "k",
//! "value": "v"}]}], "hitsAddend": 1}`, answered `{"overallCode": "OVER_LIMIT", "statuses":
//! [{"code": "OVER_LIMIT", "currentLimit": {"requestsPerUnit": 5, "unit": "MINUTE"},
//! "limitRemaining": 0, "durationUntilReset": "12.5s"}], "responseHeadersToAdd": [...]}`.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use metrics_exporter_prometheus::PrometheusHandle;
use rein_core::Leasable;
use serde::{Deserialize, Serialize};

use crate::service::RateLimitService;

/// The HTTP router over `service`; `/metrics` renders `metrics` (none: 404).
pub fn router<S: Leasable + Clone + 'static>(
    service: RateLimitService<S>,
    metrics: Option<PrometheusHandle>,
) -> Router {
    Router::new()
        .route("/json", post(json::<S>))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .route("/healthz", get(|| async { "OK\n" }))
        .route("/readyz", get(ready::<S>))
        .with_state(service)
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics {
                        Some(handle) => handle.render().into_response(),
                        None => StatusCode::NOT_FOUND.into_response(),
                    }
                }
            }),
        )
}

async fn ready<S: Leasable + Clone + 'static>(
    State(service): State<RateLimitService<S>>,
) -> Response {
    let domains = service.domains();
    if domains.is_empty() {
        // Every descriptor would be answered OK without a limit: not what to route to.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no domain loaded\n",
        )
            .into_response();
    }
    (StatusCode::OK, format!("OK: {} domain(s)\n", domains.len())).into_response()
}

/// Any content type is read as JSON (`curl -d` sends a form type); a body that is not the
/// request is `400` with serde's message, which names the line, column and field. The
/// status says the overall code, as envoyproxy/ratelimit's `/json` does: `429` for
/// `OVER_LIMIT`, `200` otherwise.
async fn json<S: Leasable + Clone + 'static>(
    State(service): State<RateLimitService<S>>,
    body: axum::body::Bytes,
) -> Response {
    let request: JsonRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("invalid request: {error}\n"),
            )
                .into_response();
        }
    };
    let request = request.into_proto();
    match service.detached(request).await {
        Err(failed) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no answer: {failed}\n"),
        )
            .into_response(),
        Ok(Ok(response)) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, Json(JsonResponse::from_proto(&response))).into_response()
        }
        Ok(Err(refused)) => (StatusCode::BAD_REQUEST, format!("{refused}\n")).into_response(),
    }
}

/// `RateLimitRequest` as JSON, read as protobuf's JSON mapping reads it: each field by its
/// JSON name (`hitsAddend`) or its proto name (`hits_addend`), an integer as a number or a
/// decimal string (protobuf writes 64-bit integers as strings), an enum by name or number.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JsonRequest {
    /// The domain.
    pub domain: String,
    /// The descriptors, in order.
    #[serde(default)]
    pub descriptors: Vec<JsonDescriptor>,
    /// Units each descriptor costs (0 or absent: 1).
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_u32")]
    pub hits_addend: u32,
}

/// One descriptor as JSON.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JsonDescriptor {
    /// `[{"key": .., "value": ..}]`.
    pub entries: Vec<JsonEntry>,
    /// This descriptor's cost, overriding the request's.
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_opt_u64")]
    pub hits_addend: Option<u64>,
    /// Give `hits_addend` units back instead of taking them.
    #[serde(default, alias = "is_negative_hits")]
    pub is_negative_hits: bool,
    /// A limit that replaces the configured one: `{"requestsPerUnit": 5, "unit": "MINUTE"}`.
    #[serde(default)]
    pub limit: Option<JsonLimit>,
}

/// A protobuf JSON integer: a number, or a decimal string.
fn proto_u64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct ProtoInt;
    impl serde::de::Visitor<'_> for ProtoInt {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a whole number, or one as a decimal string")
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
        }
        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<u64, E> {
            text.parse()
                .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(text), &self))
        }
    }
    deserializer.deserialize_any(ProtoInt)
}

/// [`proto_u64`] within `u32`.
fn proto_u32<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let n = proto_u64(deserializer)?;
    u32::try_from(n).map_err(|_| serde::de::Error::custom(format!("{n} is more than a uint32")))
}

/// [`proto_u64`], or `null` for none.
fn proto_opt_u64<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(deserialize_with = "proto_u64")] u64);
    Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|Wrapped(n)| n))
}

/// A protobuf JSON enum of `RateLimit.Unit`: its name, or its number.
fn proto_unit<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NameOrNumber {
        Name(String),
        Number(i32),
    }
    let unit = match NameOrNumber::deserialize(deserializer)? {
        NameOrNumber::Name(name) => rate_limit::Unit::from_str_name(&name),
        NameOrNumber::Number(n) => rate_limit::Unit::try_from(n).ok(),
    };
    // A unit the service cannot count in is the caller's mistake: refused here (400), not
    // left for the service, which decides such a descriptor by its rule as it must for
    // Envoy.
    match unit {
        Some(unit) if unit != rate_limit::Unit::Unknown => Ok(unit.as_str_name().to_owned()),
        _ => Err(serde::de::Error::custom(
            "unknown unit: SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR (or its number)",
        )),
    }
}

/// One entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonEntry {
    /// The key.
    pub key: String,
    /// The value.
    #[serde(default)]
    pub value: String,
}

/// A limit override.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonLimit {
    /// Requests per unit.
    #[serde(alias = "requests_per_unit", deserialize_with = "proto_u32")]
    pub requests_per_unit: u32,
    /// `SECOND`, `MINUTE`, `HOUR`, `DAY`, `WEEK`, `MONTH` or `YEAR` (or its number).
    #[serde(deserialize_with = "proto_unit")]
    pub unit: String,
    /// The rule's name, in answers.
    #[serde(default, skip_serializing_if = "String::is_empty", skip_deserializing)]
    pub name: String,
}

impl JsonRequest {
    fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain,
            hits_addend: self.hits_addend,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| rate_limit_descriptor::Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit: d.limit.map(|l| rate_limit_descriptor::RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        // A name `proto_unit` took.
                        unit: rate_limit::Unit::from_str_name(&l.unit).map_or(0, |u| u as i32),
                    }),
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
        }
    }
}

/// `RateLimitResponse` as JSON.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    /// `OK` or `OVER_LIMIT`.
    pub overall_code: String,
    /// One per descriptor, in order.
    pub statuses: Vec<JsonStatus>,
    /// Headers for the client's response.
    #[serde(default)]
    pub response_headers_to_add: Vec<JsonHeader>,
}

/// One descriptor's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonStatus {
    /// `OK` or `OVER_LIMIT`.
    pub code: String,
    /// The limit that applied, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_limit: Option<JsonCurrentLimit>,
    /// Units left.
    #[serde(default)]
    pub limit_remaining: u32,
    /// Until the limit resets (admitted) or the request would be admitted (over the
    /// limit), as protobuf JSON writes a duration: `"12.5s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_until_reset: Option<String>,
}

/// The limit in an answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonCurrentLimit {
    /// The rule's `name`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit, `UNKNOWN` for a window that is none.
    pub unit: String,
}

/// One header.
#[derive(Debug, Serialize, Deserialize)]
pub struct JsonHeader {
    /// Its name.
    pub key: String,
    /// Its value.
    pub value: String,
}

impl JsonResponse {
    fn from_proto(response: &RateLimitResponse) -> Self {
        let code = |c: i32| {
            Code::try_from(c)
                .unwrap_or(Code::Unknown)
                .as_str_name()
                .to_owned()
        };
        JsonResponse {
            overall_code: code(response.overall_code),
            statuses: response
                .statuses
                .iter()
                .map(|s| JsonStatus {
                    code: code(s.code),
                    current_limit: s.current_limit.as_ref().map(|l| JsonCurrentLimit {
                        name: l.name.clone(),
                        requests_per_unit: l.requests_per_unit,
                        unit: rate_limit::Unit::try_from(l.unit)
                            .unwrap_or(rate_limit::Unit::Unknown)
                            .as_str_name()
                            .to_owned(),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s.duration_until_reset.as_ref().map(|d| {
                        if d.nanos == 0 {
                            format!("{}s", d.seconds)
                        } else {
                            let text = format!("{}.{:09}", d.seconds, d.nanos);
                            format!("{}s", text.trim_end_matches('0'))
                        }
                    }),
                })
                .collect(),
            response_headers_to_add: response
                .response_headers_to_add
                .iter()
                .map(|h| JsonHeader {
                    key: h.key.clone(),
                    value: h.value.clone(),
                })
                .collect(),
        }
    }
}

/// Serves `router` on `listener`, over TLS with `tls`, until `shutdown` turns true:
/// HTTP/1.1 per connection. A client has [`CLIENT_TIMEOUT`] to complete the TLS handshake,
/// and `header_timeout` ([`HEADER_TIMEOUT`] in the server) to send each request's headers,
/// the first or the next on a kept-alive connection: a client that sends nothing, or half a
/// request, holds no connection longer (one that never timed out could be held forever,
/// and kept shutdown waiting for it). A client that fails the handshake (no certificate when
/// one is required, a plain-text request) is dropped and logged at debug; the listener
/// keeps serving. At shutdown it stops accepting, lets each connection answer the request it
/// is serving and close (an idle one closes at once), and returns once they have, or after
/// [`CLIENT_TIMEOUT`] at most, as gRPC does (without waiting, the runtime's end would cut
/// those requests off).
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    header_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: pause rather than spin.
            Err(error) => {
                tracing::warn!(%error, "accepting an HTTP connection failed");
                tokio::time::sleep(crate::grpc::ACCEPT_PAUSE).await;
                continue;
            }
        };
        // Answers are small and wanted at once.
        let _ = stream.set_nodelay(true);
        let (tls, router) = (tls.clone(), router.clone());
        // Taken before the handshake, so that shutdown also waits for one under way.
        let watcher = graceful.watcher();
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(header_timeout);
        let service = hyper_util::service::TowerToHyperService::new(router);
        tokio::spawn(async move {
            let served = match tls {
                None => {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    watcher.watch(http.serve_connection(io, service)).await
                }
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(CLIENT_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(error)) => {
                                tracing::debug!(%error, "TLS handshake refused");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!("TLS handshake timed out");
                                return;
                            }
                        };
                    let io = hyper_util::rt::TokioIo::new(tls);
                    watcher.watch(http.serve_connection(io, service)).await
                }
            };
            if let Err(error) = served {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
        });
    }
    let open = graceful.count();
    if tokio::time::timeout(CLIENT_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(open, "HTTP connections did not all close in time: exiting");
    }
    Ok(())
}

/// The longest an HTTP client may take to complete the TLS handshake; and the longest
/// shutdown waits for the connections' last answers.
pub const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest an HTTP connection waits for a request's headers, the first or the next on
/// a kept-alive connection (hyper's one timer covers both): longer than the idle timeout of
/// the proxies and load balancers that keep connections to a server (60 s for most), so
/// that they, not the server, close an idle one (a server closing first races a request
/// sent on it, which the proxy answers 502).
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(75);

/// The largest `/json` body: far above what [`crate::service::MAX_DESCRIPTORS`] descriptors
/// of [`crate::service::MAX_ENTRIES`] short entries need, and bounded.
const MAX_BODY: usize = 256 * 1024;
