//! The service over real gRPC on loopback (tonic's client, Envoy's generated types), on the
//! in-process store: what Envoy sends and what it gets back, rule by rule. The same through
//! a real Envoy and Redis is `tests/envoy.rs`.

use std::net::SocketAddr;
use std::path::Path;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, rate_limit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use rein::FailurePolicy;
use rein_memory::MemoryStore;
use rein_redis_harness::{Fault, Faulty};
use rein_server::{RateLimitService, Reload, RulesConfig, ServiceSettings};
use tonic::transport::Channel;

/// Every kind of entry the service reads, one rule each.
const RULES: &str = include_str!("rules/shop.yaml");

fn rules(text: &str) -> RulesConfig {
    let mut config = RulesConfig::default();
    config
        .add(Path::new("shop.yaml"), text)
        .expect("valid rules");
    config
}

struct Running {
    service: RateLimitService<MemoryStore>,
    client: RateLimitServiceClient<Channel>,
}

/// A service over `store` deciding the shop's rules, answering by `failure` when the store
/// cannot, without headers of the older convention.
fn shop<S: rein_core::Leasable + Clone + 'static>(
    store: S,
    failure: FailurePolicy,
) -> RateLimitService<S> {
    let settings = ServiceSettings {
        failure,
        shadow_mode: false,
        legacy_headers: false,
        leases: None,
    };
    RateLimitService::new(store, rules(RULES), settings).expect("service")
}

async fn start(text: &str, shadow_mode: bool) -> Running {
    start_with(rules(text), shadow_mode).await
}

async fn start_with(rules: RulesConfig, shadow_mode: bool) -> Running {
    let settings = ServiceSettings {
        failure: FailurePolicy::FailClosed,
        shadow_mode,
        legacy_headers: true,
        leases: None,
    };
    let service = RateLimitService::new(MemoryStore::new(), rules, settings).expect("service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let server = tonic::transport::Server::builder()
        .add_service(rein_server::grpc::server(service.clone()))
        .serve_with_incoming(rein_server::grpc::incoming(listener));
    tokio::spawn(server);
    let client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect");
    Running { service, client }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| rate_limit_descriptor::Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "shop".into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(running: &mut Running, request: RateLimitRequest) -> RateLimitResponse {
    running
        .client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner()
}

/// What one request of `entries` finds left under its rule (it is charged for it too).
async fn remaining(running: &mut Running, entries: &[(&str, &str)]) -> u32 {
    let answer = ask(running, request(vec![descriptor(entries)])).await;
    answer.statuses[0].limit_remaining
}

fn codes(response: &RateLimitResponse) -> (Code, Vec<Code>) {
    let code = |c: i32| Code::try_from(c).expect("a known code");
    (
        code(response.overall_code),
        response.statuses.iter().map(|s| code(s.code)).collect(),
    )
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// A request over two limits shows the longer wait: it is all or nothing, so a client
/// retrying at `Retry-After` passes only once both have cleared (before, the headers showed
/// the first denial, the token bucket's second, and the retry met the hour's window).
#[tokio::test]
async fn a_request_over_two_limits_shows_the_longer_wait() {
    let mut running = start(RULES, false).await;
    ask(&mut running, request(vec![descriptor(&[("cart", "c")])])).await;
    for _ in 0..2 {
        ask(&mut running, request(vec![descriptor(&[("burst", "b")])])).await;
    }
    let denied = ask(
        &mut running,
        request(vec![
            descriptor(&[("burst", "b")]),
            descriptor(&[("cart", "c")]),
        ]),
    )
    .await;
    assert_eq!(
        codes(&denied),
        (Code::OverLimit, vec![Code::OverLimit, Code::OverLimit])
    );
    let longest = denied
        .statuses
        .iter()
        .map(|s| {
            let wait = s.duration_until_reset.expect("a wait");
            let nanos = u64::try_from(wait.nanos).expect("not negative");
            u64::try_from(wait.seconds).expect("not negative") + u64::from(nanos > 0)
        })
        .max();
    let retry = header(&denied, "Retry-After").map(|r| r.parse::<u64>().expect("seconds"));
    assert_eq!(retry, longest, "{denied:?}");
}

#[tokio::test]
async fn exactly_the_limit_is_admitted_then_over_limit_with_the_headers() {
    let mut running = start(RULES, false).await;
    for remaining in [2, 1, 0] {
        let answer = ask(&mut running, request(vec![descriptor(&[("user", "ann")])])).await;
        assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok]));
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
        let limit = answer.statuses[0].current_limit.as_ref().expect("a limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, rate_limit::Unit::Hour as i32)
        );
    }
    let denied = ask(&mut running, request(vec![descriptor(&[("user", "ann")])])).await;
    assert_eq!(codes(&denied), (Code::OverLimit, vec![Code::OverLimit]));
    let retry = header(&denied, "Retry-After").expect("Retry-After");
    assert_eq!(
        header(&denied, "RateLimit"),
        Some(format!("\"shop.user\";r=0;t={retry}").as_str())
    );
    assert_eq!(
        header(&denied, "RateLimit-Policy"),
        Some("\"shop.user\";q=3;w=3600")
    );
    assert_eq!(header(&denied, "X-RateLimit-Limit"), Some("3"));
    // The window is the wall clock's hour (as envoyproxy/ratelimit's), so the wait may be
    // under a second when the test runs just before the hour turns.
    let until = denied.statuses[0].duration_until_reset.expect("a wait");
    let wait = std::time::Duration::new(
        u64::try_from(until.seconds).expect("not negative"),
        u32::try_from(until.nanos).expect("not negative"),
    );
    assert!(
        wait > std::time::Duration::ZERO && wait <= std::time::Duration::from_secs(3_600),
        "{until:?}"
    );
    // Another value of the key counts alone.
    let other = ask(&mut running, request(vec![descriptor(&[("user", "bob")])])).await;
    assert_eq!(codes(&other).0, Code::Ok);
}

#[tokio::test]
async fn the_descriptors_of_one_request_are_decided_all_or_nothing() {
    let mut running = start(RULES, false).await;
    // The cart's single unit is spent.
    let spent = ask(&mut running, request(vec![descriptor(&[("cart", "c1")])])).await;
    assert_eq!(codes(&spent).0, Code::Ok);
    // The user's limit is charged first, then the cart denies: the user's unit comes back.
    for _ in 0..5 {
        let both = request(vec![
            descriptor(&[("user", "cy")]),
            descriptor(&[("cart", "c1")]),
        ]);
        let answer = ask(&mut running, both).await;
        assert_eq!(
            codes(&answer),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
        );
    }
    assert_eq!(
        remaining(&mut running, &[("user", "cy")]).await,
        2,
        "five denied requests charged the user nothing"
    );
}

#[tokio::test]
async fn unlimited_blocked_shadow_and_unmatched_rules_answer_as_configured() {
    let mut running = start(RULES, false).await;
    let answer = ask(
        &mut running,
        request(vec![
            descriptor(&[("vip", "v")]),
            descriptor(&[("nothing", "here")]),
            descriptor(&[("trial", "t")]),
            descriptor(&[("trial", "t")]),
        ]),
    )
    .await;
    // The second trial descriptor is over its limit of 1, but the rule is in shadow mode.
    assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok; 4]));
    assert_eq!(answer.statuses[0].limit_remaining, u32::MAX, "unlimited");
    assert!(answer.statuses[1].current_limit.is_none(), "unmatched");
    let banned = ask(&mut running, request(vec![descriptor(&[("banned", "x")])])).await;
    assert_eq!(codes(&banned), (Code::OverLimit, vec![Code::OverLimit]));
    // Over a limit of zero beside an admitted descriptor: the 429 shows no admitted
    // descriptor's `remaining`.
    let beside = request(vec![
        descriptor(&[("user", "zed")]),
        descriptor(&[("banned", "x")]),
    ]);
    let beside = ask(&mut running, beside).await;
    assert_eq!(codes(&beside).0, Code::OverLimit);
    assert_eq!(header(&beside, "RateLimit"), None, "{beside:?}");
    // An unknown domain limits nothing.
    let mut unknown = request(vec![descriptor(&[("user", "ann")])]);
    unknown.domain = "elsewhere".into();
    assert_eq!(
        codes(&ask(&mut running, unknown).await),
        (Code::Ok, vec![Code::Ok])
    );
}

#[tokio::test]
async fn a_rule_that_replaces_another_is_decided_instead_of_it() {
    let mut running = start(RULES, false).await;
    let both = || {
        request(vec![
            descriptor(&[("tier", "gold"), ("user", "dee")]),
            descriptor(&[("promo", "p"), ("user", "dee")]),
        ])
    };
    // The gold rule (5 an hour) is replaced by the promo rule (2 an hour) and untouched.
    for _ in 0..2 {
        assert_eq!(codes(&ask(&mut running, both()).await).0, Code::Ok);
    }
    assert_eq!(codes(&ask(&mut running, both()).await).0, Code::OverLimit);
    assert_eq!(
        remaining(&mut running, &[("tier", "gold"), ("user", "dee")]).await,
        4,
        "the replaced rule was not charged"
    );
}

#[tokio::test]
async fn hits_addend_negative_hits_and_overrides_are_honoured() {
    let mut running = start(RULES, false).await;
    // A request-level addend of 2, then a descriptor's own addend of 1.
    let mut two = request(vec![descriptor(&[("user", "eve")])]);
    two.hits_addend = 2;
    assert_eq!(ask(&mut running, two).await.statuses[0].limit_remaining, 1);
    let mut own = request(vec![descriptor(&[("user", "eve")])]);
    own.hits_addend = 2;
    own.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    assert_eq!(ask(&mut running, own).await.statuses[0].limit_remaining, 0);
    // Negative hits give units back.
    let mut back = request(vec![descriptor(&[("user", "eve")])]);
    back.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    back.descriptors[0].is_negative_hits = true;
    let answer = ask(&mut running, back).await;
    assert_eq!(
        (codes(&answer).0, answer.statuses[0].limit_remaining),
        (Code::Ok, 2)
    );
    // A cost above every capacity is over the limit, as Envoy expects.
    let mut huge = request(vec![descriptor(&[("user", "eve")])]);
    huge.hits_addend = 4;
    assert_eq!(codes(&ask(&mut running, huge).await).0, Code::OverLimit);
    // The override replaces the configured numbers: 1 a minute.
    let mut overridden = request(vec![descriptor(&[("user", "fay")])]);
    overridden.descriptors[0].limit = Some(rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 1,
        unit: rate_limit::Unit::Minute as i32,
    });
    assert_eq!(
        codes(&ask(&mut running, overridden.clone()).await).0,
        Code::Ok
    );
    assert_eq!(
        codes(&ask(&mut running, overridden).await).0,
        Code::OverLimit
    );
}

/// An override the server keeps no limiter for (past `MAX_LIMIT_OVERRIDES` distinct ones
/// used within their unit, or of a unit it does not know) is left out: its descriptor is
/// decided by its rule, and the request's other limits with it (before, the whole request
/// was refused, which Envoy's default failure mode admits unlimited). Once the kept ones
/// have gone unused for their unit, a new one is kept again (before, none was ever dropped:
/// after 256 distinct ones, every new override was left out until a restart).
#[tokio::test(start_paused = true)]
async fn an_override_the_server_cannot_keep_is_decided_by_its_rule() {
    let service = shop(MemoryStore::new(), FailurePolicy::FailClosed);
    let with_override = |user: &str, unit: rate_limit::Unit, count: u32| {
        let mut asked = request(vec![descriptor(&[("user", user)])]);
        asked.descriptors[0].limit = Some(rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: count,
            unit: unit as i32,
        });
        asked
    };
    let max = u32::try_from(rein_server::service::MAX_LIMIT_OVERRIDES).expect("small");
    for count in 1..=max {
        let kept = with_override("filler", rate_limit::Unit::Second, 1_000 + count);
        service.should_rate_limit(&kept).await.expect("an answer");
    }
    // The user rule's 3 an hour, not the override's 100 a minute, nor a refusal.
    for (user, unit) in [
        ("one-more", rate_limit::Unit::Minute),
        ("unknown-unit", rate_limit::Unit::Unknown),
    ] {
        let asked = with_override(user, unit, 100);
        let mut answers = Vec::new();
        for _ in 0..4 {
            let answer = service.should_rate_limit(&asked).await.expect("an answer");
            answers.push(codes(&answer).0);
        }
        assert_eq!(
            answers,
            [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
            "{user}"
        );
    }
    // A second on, the fillers have gone unused for their whole window: 2 a minute is kept.
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    let asked = with_override("a-second-on", rate_limit::Unit::Minute, 2);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let answer = service.should_rate_limit(&asked).await.expect("an answer");
        answers.push(codes(&answer).0);
    }
    assert_eq!(answers, [Code::Ok, Code::Ok, Code::OverLimit]);
}

#[tokio::test]
async fn an_override_needs_its_domain_in_the_rules_as_in_envoyproxy_ratelimit() {
    let mut config = rules(RULES);
    // A domain with no descriptors: known, so an override in it is decided.
    config
        .add(Path::new("bare.yaml"), "domain: bare\n")
        .expect("a domain without descriptors is valid");
    let mut running = start_with(config, false).await;
    let overridden = |domain: &str| {
        let mut asked = request(vec![descriptor(&[("anything", "x")])]);
        asked.domain = domain.to_owned();
        asked.descriptors[0].limit = Some(rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1,
            unit: rate_limit::Unit::Minute as i32,
        });
        asked
    };
    for expected in [Code::Ok, Code::OverLimit] {
        assert_eq!(
            codes(&ask(&mut running, overridden("bare")).await).0,
            expected
        );
    }
    // An unknown domain answers OK, its override unread.
    for _ in 0..3 {
        assert_eq!(
            codes(&ask(&mut running, overridden("nowhere")).await),
            (Code::Ok, vec![Code::Ok])
        );
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments_after_bounded_work() {
    let mut running = start(RULES, false).await;
    let long = "x".repeat(rein_server::service::MAX_TEXT + 1);
    let cases = [
        request(vec![]),
        request(vec![descriptor(&[]); 1]),
        request(vec![
            descriptor(&[("user", "a")]);
            rein_server::service::MAX_DESCRIPTORS + 1
        ]),
        request(vec![descriptor(&[("", "a")])]),
        request(vec![descriptor(&[(long.as_str(), "a")])]),
        RateLimitRequest {
            domain: String::new(),
            ..request(vec![descriptor(&[("user", "a")])])
        },
    ];
    for case in cases {
        let status = running
            .client
            .should_rate_limit(case)
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    // A value a client chose, however long, refuses nothing: it is counted (by a hash of
    // its key) like any other, and the other descriptors are decided beside it (before,
    // one value over 1 KiB refused the whole request, which Envoy's default failure mode
    // admits unlimited).
    let padded = "p".repeat(64 * 1024);
    let both = || {
        request(vec![
            descriptor(&[("user", &padded)]),
            descriptor(&[("cart", "c")]),
        ])
    };
    assert_eq!(
        codes(&ask(&mut running, both()).await),
        (Code::Ok, vec![Code::Ok, Code::Ok])
    );
    assert_eq!(
        codes(&ask(&mut running, both()).await),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );
}

#[tokio::test]
async fn global_shadow_mode_decides_and_counts_but_answers_ok() {
    let mut running = start(RULES, true).await;
    for _ in 0..2 {
        let answer = ask(&mut running, request(vec![descriptor(&[("cart", "c")])])).await;
        assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok]));
        // An OK answer, though the second is over the cart's limit of 1: Envoy adds these
        // headers to the upstream's response, so a denial's wait must not show.
        assert_eq!(header(&answer, "Retry-After"), None, "{answer:?}");
    }
}

#[tokio::test]
async fn a_reload_changes_the_limit_and_keeps_what_unchanged_rules_counted() {
    let mut running = start(RULES, false).await;
    for _ in 0..2 {
        ask(&mut running, request(vec![descriptor(&[("user", "gus")])])).await;
    }
    // The user rule unchanged, the cart raised to 3.
    let reloaded = running
        .service
        .reload(rules(&RULES.replace(
            "key: cart\n    rate_limit: { unit: hour, requests_per_unit: 1 }",
            "key: cart\n    rate_limit: { unit: hour, requests_per_unit: 3 }",
        )))
        .expect("reload");
    assert_eq!(reloaded, Reload::Applied);
    assert_eq!(
        remaining(&mut running, &[("user", "gus")]).await,
        0,
        "the user's count survived the reload"
    );
    for _ in 0..3 {
        let cart = ask(&mut running, request(vec![descriptor(&[("cart", "k")])])).await;
        assert_eq!(codes(&cart).0, Code::Ok);
    }
    let cart = ask(&mut running, request(vec![descriptor(&[("cart", "k")])])).await;
    assert_eq!(codes(&cart).0, Code::OverLimit);
}

/// `--leases`: a hot key is decided from leases (blocks reserved in the store and spent in
/// process), the limit is still admitted exactly, and shutting down gives back every unit
/// the leases hold: the store then holds exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leases_a_hot_key_is_exact_and_shutdown_gives_back_what_leases_hold() {
    let text = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 200 }\n";
    let store = MemoryStore::new();
    let settings = ServiceSettings {
        failure: FailurePolicy::FailClosed,
        shadow_mode: false,
        legacy_headers: false,
        leases: Some(rein::LeaseConfig::default()),
    };
    let service = RateLimitService::new(store.clone(), rules(text), settings).expect("service");
    let mut admitted = 0;
    for _ in 0..300 {
        let answer = service
            .should_rate_limit(&request(vec![descriptor(&[("user", "hot")])]))
            .await
            .expect("an answer");
        admitted += u64::from(answer.overall_code == Code::Ok as i32);
    }
    assert_eq!(admitted, 200, "exactly the limit");
    let stats = service.lease_stats().expect("leases are on");
    assert!(stats.leased > 0, "no decision came from a lease: {stats:?}");

    service.shutdown().await;
    // The store's own count: what was admitted, nothing more held.
    let policy = rules(text).policies().remove(0);
    let table = rein_core::Limiter::prepare(&store, &policy).expect("prepare");
    let config = rules(text);
    let domain = config.domain("shop").expect("domain");
    // What the store holds for `user`, without charging it.
    let stored = async |user: &str| {
        let key = rein_server::matcher::match_descriptor(domain, [("user", user)])
            .expect("a rule")
            .key;
        let peek = rein_core::Limiter::peek(&store, None, &table, &key, 0).await;
        peek.expect("peek").remaining
    };
    assert_eq!(stored("hot").await, 0, "after 200 admitted of 200");
    // And a key that leased but spent little gets its units back.
    for _ in 0..30 {
        service
            .should_rate_limit(&request(vec![descriptor(&[("user", "warm")])]))
            .await
            .expect("an answer");
    }
    service.shutdown().await;
    assert_eq!(
        stored("warm").await,
        170,
        "30 admitted; every held unit returned"
    );
}

/// All or nothing gives back only what the store counted: a descriptor the local fallback
/// admitted while the store gave no answer took nothing there, so its refund would give the
/// store units it never lost (and admit that many more later).
#[tokio::test]
async fn all_or_nothing_refunds_only_what_the_store_counted() {
    // A descriptor's value is part of its store key: a user `down-…` gets no answer.
    let store = Faulty::new(MemoryStore::new(), Fault::DownFor(b"down"));
    let refunds = store.clone();
    let fallback = FailurePolicy::LocalFallback {
        expected_nodes: std::num::NonZeroU32::MIN,
    };
    let service = shop(store, fallback);
    let spend = request(vec![descriptor(&[("cart", "c")])]);
    let answer = service.should_rate_limit(&spend).await.expect("an answer");
    assert_eq!(codes(&answer), (Code::Ok, vec![Code::Ok]));
    // The user's key gets no answer from the store (the fallback admits it), then the
    // spent cart denies the request: nothing to give back to the store.
    let both = request(vec![
        descriptor(&[("user", "down-ann")]),
        descriptor(&[("cart", "c")]),
    ]);
    let answer = service.should_rate_limit(&both).await.expect("an answer");
    assert_eq!(codes(&answer).0, Code::OverLimit);
    assert_eq!(
        refunds.refunds(),
        0,
        "a fallback's admission refunded to the store"
    );
    // A store-counted charge is still given back.
    let counted = request(vec![
        descriptor(&[("user", "ann")]),
        descriptor(&[("cart", "c")]),
    ]);
    let answer = service
        .should_rate_limit(&counted)
        .await
        .expect("an answer");
    assert_eq!(codes(&answer).0, Code::OverLimit);
    assert_eq!(refunds.refunds(), 1);
}

/// A failure policy's answer knows nothing of the limit: no figures, no `current_limit`
/// and no `RateLimit` header. Failing open, OK (before, `limit_remaining: 0`, `r=0;t=0` and
/// a `near_limit` count for every request while Redis was away; then, until 2026-11-28, a
/// `current_limit` with `limit_remaining` 0, which Envoy's own `x-ratelimit-*` headers
/// read as "0 remaining, reset 0" on every admission); failing closed, `OVER_LIMIT` with a
/// `Retry-After` of a second at least (before, `r=0;t=0` and `Retry-After: 0` while the
/// breaker was closed).
#[tokio::test]
async fn failure_policy_answers_carry_no_figures() {
    for (failure, code) in [
        (FailurePolicy::FailOpen, Code::Ok),
        (FailurePolicy::FailClosed, Code::OverLimit),
    ] {
        let store = Faulty::new(MemoryStore::new(), Fault::DownFor(b"down"));
        let service = shop(store, failure);
        // Past the breaker's five failures: while closed (its wait zero) and once open.
        for _ in 0..7 {
            let answer = service
                .should_rate_limit(&request(vec![descriptor(&[("user", "down-ann")])]))
                .await
                .expect("an answer");
            assert_eq!(codes(&answer), (code, vec![code]), "{failure:?}");
            let status = &answer.statuses[0];
            assert_eq!(
                (&status.current_limit, status.limit_remaining),
                (&None, 0),
                "{failure:?}"
            );
            assert_eq!(status.duration_until_reset, None, "{failure:?}");
            assert_eq!(header(&answer, "ratelimit"), None, "{answer:?}");
            if code == Code::OverLimit {
                let retry = header(&answer, "retry-after").expect("a Retry-After");
                assert!(retry.parse::<u64>().expect("seconds") >= 1, "{answer:?}");
            }
        }
    }
}

/// A request's `limit` override is decided by a limiter of its own, with its own breaker,
/// named apart in the limiter metrics: building one leaves the rules' breaker gauge alone
/// (before, every limiter was `limiter="rein"`, and a new override's set the gauge to
/// closed while Redis was down and the rules' breaker open).
#[tokio::test(flavor = "current_thread")]
async fn an_override_limiter_keeps_to_its_own_breaker_gauge() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let scrape = recorder.handle();
    let _installed = metrics::set_default_local_recorder(&recorder);
    let store = Faulty::new(MemoryStore::new(), Fault::DownFor(b"down"));
    let service = shop(store, FailurePolicy::FailClosed);
    let gauge = |limiter: &str| {
        let series = format!("rein_breaker_state{{limiter=\"{limiter}\"}} ");
        scrape
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()).map(str::to_owned))
    };
    for _ in 0..20 {
        let down = request(vec![descriptor(&[("user", "down-ann")])]);
        let _ = service.should_rate_limit(&down).await;
    }
    assert_eq!(gauge("rein").as_deref(), Some("2"), "open");
    let mut overridden = request(vec![descriptor(&[("user", "down-bob")])]);
    overridden.descriptors[0].limit = Some(rate_limit_descriptor::RateLimitOverride {
        requests_per_unit: 7,
        unit: rate_limit::Unit::Minute as i32,
    });
    let _ = service.should_rate_limit(&overridden).await;
    assert_eq!(gauge("rein").as_deref(), Some("2"), "still open");
    assert!(gauge("override-minute-7").is_some(), "{}", scrape.render());
}

/// Rules equal to those in force (a file touched, or saved unchanged) are kept as they are:
/// while Redis is away, the local fallback's counts go on (before, each such reload built a
/// new limiter, and every key got a fresh fallback share: 2 more an hour per touch).
#[tokio::test]
async fn an_unchanged_reload_keeps_the_fallbacks_counts() {
    let text = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let store = Faulty::new(MemoryStore::new(), Fault::DownFor(b"down"));
    let fallback = FailurePolicy::LocalFallback {
        expected_nodes: std::num::NonZeroU32::MIN,
    };
    let settings = ServiceSettings {
        failure: fallback,
        shadow_mode: false,
        legacy_headers: false,
        leases: None,
    };
    let service = RateLimitService::new(store, rules(text), settings).expect("service");
    let ask = async || {
        let down = request(vec![descriptor(&[("user", "down-ann")])]);
        codes(&service.should_rate_limit(&down).await.expect("an answer")).0
    };
    assert_eq!(ask().await, Code::Ok);
    assert_eq!(ask().await, Code::Ok);
    assert_eq!(ask().await, Code::OverLimit);
    assert_eq!(
        service.reload(rules(text)).expect("reload"),
        Reload::Unchanged
    );
    assert_eq!(ask().await, Code::OverLimit, "the fallback's count kept");
}

/// A descriptor of `hits_addend: 0` checks without taking: admitted while one more would
/// be, showing what is left, and over the limit once nothing is (Envoy's budget pattern
/// checks this way at the request and charges at the stream's end; before, a cost of zero
/// was always admitted, so the check could never reject).
#[tokio::test]
async fn a_zero_hits_check_takes_nothing_and_rejects_once_nothing_is_left() {
    let text = "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n";
    let mut running = start(text, false).await;
    let check = || {
        let mut check = request(vec![descriptor(&[("user", "ann")])]);
        check.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
        check
    };
    let charge = || request(vec![descriptor(&[("user", "ann")])]);
    let answer = ask(&mut running, check()).await;
    assert_eq!(
        (codes(&answer).0, answer.statuses[0].limit_remaining),
        (Code::Ok, 3),
        "nothing taken"
    );
    for _ in 0..3 {
        assert_eq!(codes(&ask(&mut running, charge()).await).0, Code::Ok);
    }
    let answer = ask(&mut running, check()).await;
    assert_eq!(codes(&answer).0, Code::OverLimit, "{answer:?}");

    // With leases on, the store counts the units this server holds as taken: a check only
    // looks, rather than refuse while this server still holds what it reserved.
    let settings = ServiceSettings {
        failure: FailurePolicy::FailClosed,
        shadow_mode: false,
        legacy_headers: false,
        leases: Some(rein::LeaseConfig {
            expected_nodes: std::num::NonZeroU32::MIN,
            min_demand: 1,
            ..rein::LeaseConfig::default()
        }),
    };
    let leased = RateLimitService::new(MemoryStore::new(), rules(text), settings).expect("service");
    for _ in 0..2 {
        let answer = leased
            .should_rate_limit(&charge())
            .await
            .expect("an answer");
        assert_eq!(codes(&answer).0, Code::Ok);
    }
    // The renewal then in flight reserves the last unit: the store has none left, this
    // server holds one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while leased.lease_stats().is_none_or(|s| s.units_reserved < 3) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            leased.lease_stats()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let answer = leased.should_rate_limit(&check()).await.expect("an answer");
    assert_eq!(codes(&answer).0, Code::Ok, "{answer:?}");
    leased.shutdown().await;
}

/// Two rules whose readable paths are the same (`a_b`, and `a` with value `b`) are two
/// policies, each deciding with its own numbers.
#[tokio::test]
async fn rules_whose_labels_collide_keep_their_own_limits() {
    let text = "domain: shop\ndescriptors:\n  - key: a_b\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n  - key: a\n    value: b\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";
    let mut running = start(text, false).await;
    let mut codes_of = async |entries: &[(&str, &str)]| {
        let answer = ask(&mut running, request(vec![descriptor(entries)])).await;
        codes(&answer).0
    };
    assert_eq!(codes_of(&[("a_b", "x")]).await, Code::Ok);
    assert_eq!(
        codes_of(&[("a_b", "x")]).await,
        Code::OverLimit,
        "1 an hour"
    );
    assert_eq!(codes_of(&[("a", "b")]).await, Code::Ok);
    assert_eq!(codes_of(&[("a", "b")]).await, Code::Ok, "2 an hour");
    assert_eq!(codes_of(&[("a", "b")]).await, Code::OverLimit);
}

/// A request its caller gives up on (Envoy's `timeout`, a reset stream) is decided to its
/// end: here its user's charge was counted by the store, its answer still on the way, when
/// the caller gave up, and the spent cart then denies the request, so all or nothing gives
/// the user's unit back (before, the request was dropped halfway and the unit stayed
/// charged; a drop guard over the charges answered so far could not see it either).
#[tokio::test]
async fn a_request_given_up_on_is_decided_to_its_end() {
    use std::time::Duration;

    let store = Faulty::new(
        MemoryStore::new(),
        Fault::LateReply(Duration::from_millis(40)),
    );
    let service = shop(store, FailurePolicy::FailClosed);
    let cart = request(vec![descriptor(&[("cart", "c")])]);
    let spent = service.should_rate_limit(&cart).await.expect("an answer");
    assert_eq!(codes(&spent).0, Code::Ok);
    let both = request(vec![
        descriptor(&[("user", "ann")]),
        descriptor(&[("cart", "c")]),
    ]);
    let gave_up = tokio::time::timeout(Duration::from_millis(20), service.detached(both));
    assert!(gave_up.await.is_err(), "answered within 20 ms");
    // The user's answer at 40 ms, the cart's denial at 80, the refund after.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The user's 3 an hour are whole.
    let user = request(vec![descriptor(&[("user", "ann")])]);
    for expected in [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = service.should_rate_limit(&user).await.expect("an answer");
        assert_eq!(codes(&answer).0, expected);
    }
}

/// The HTTP listener closes a connection whose client sends no complete request headers in
/// time, whether it sent half a request or went quiet after an answer on a kept-alive
/// connection, and shutdown does not wait for one. (Before, the plain-HTTP listener had no
/// such timeout: a client sending half a request held its connection, and kept shutdown
/// waiting, for ever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_clients_that_send_no_headers_in_time_are_closed_and_hold_no_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let router =
        rein_server::http::router(shop(MemoryStore::new(), FailurePolicy::FailClosed), None);
    let timeout = std::time::Duration::from_millis(200);
    let server = tokio::spawn(rein_server::http::serve(
        listener, None, router, stopped, timeout,
    ));
    let connect = || async { tokio::net::TcpStream::connect(addr).await.expect("connect") };
    let mut half = connect().await;
    half.write_all(b"GET /healthz HT").await.expect("write");
    let mut quiet = connect().await;
    quiet
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: rein\r\n\r\n")
        .await
        .expect("write");
    // Both are closed by the server: reading to the end returns, the kept-alive one after
    // its answer. (A guard far past the timeout, so that a hang fails rather than waits.)
    let guard = std::time::Duration::from_secs(5);
    for (what, connection) in [
        ("half a request", &mut half),
        ("quiet after an answer", &mut quiet),
    ] {
        let mut read = Vec::new();
        let closed = tokio::time::timeout(guard, connection.read_to_end(&mut read)).await;
        assert!(closed.is_ok(), "{what}: still open");
        if what.starts_with("quiet") {
            assert!(
                read.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&read)
            );
        }
    }
    // One more client sending half a request as the server stops: shutdown returns.
    let mut last = connect().await;
    last.write_all(b"POST /json HTTP/1.1\r\n")
        .await
        .expect("write");
    stop.send(true).expect("the server listens");
    let stopped = tokio::time::timeout(guard, server).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}
