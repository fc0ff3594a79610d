//! Properties of the service: matching never panics on arbitrary descriptors, and random
//! requests of several descriptors get exactly what an oracle of plain counters says: each
//! matched rule's limit per key, the descriptors of one request all or nothing.
//!
//! Windows are 1 000 hours long, so no window ends while the test runs and the in-process
//! store's clock cannot change an outcome.

use std::collections::HashMap;
use std::path::Path;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use rein::FailurePolicy;
use rein_memory::MemoryStore;
use rein_server::matcher::match_descriptor;
use rein_server::{RateLimitService, RulesConfig, ServiceSettings};

const RULES: &str = "
domain: p
descriptors:
  - key: a
    rate_limit: { window: 1000h, requests_per_unit: 5 }
  - key: a
    value: x*
    rate_limit: { window: 1000h, requests_per_unit: 3, algorithm: sliding_log }
  - key: b
    descriptors:
      - key: c
        rate_limit: { window: 1000h, requests_per_unit: 4, algorithm: sliding_counter }
  - key: d
    value: x*
    share_threshold: true
    rate_limit: { window: 1000h, requests_per_unit: 2 }
";

fn rules() -> RulesConfig {
    let mut config = RulesConfig::default();
    config.add(Path::new("p.yaml"), RULES).expect("valid");
    config
}

/// Which counter a descriptor's entries charge, and its limit: the oracle's own reading of
/// the rules above, written independently of the matcher.
fn oracle_counter(entries: &[(String, String)]) -> Option<(String, u64)> {
    match entries {
        [(k, v)] if k == "a" && v.starts_with('x') => Some((format!("a-x:{v}"), 3)),
        [(k, v)] if k == "a" => Some((format!("a:{v}"), 5)),
        [(b, bv), (c, cv)] if b == "b" && c == "c" => Some((format!("bc:{bv}/{cv}"), 4)),
        [(k, v)] if k == "d" && v.starts_with('x') => Some(("d-x*".to_owned(), 2)),
        _ => None,
    }
}

/// One descriptor of a request: its entries and its cost.
type Descriptor = (Vec<(String, String)>, u64);

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x1".to_owned()),
        Just("x2".to_owned()),
        Just("y".to_owned()),
        Just(String::new()),
        "[a-z*\u{1f}=é]{0,6}",
    ]
}

fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
    prop_oneof![
        value().prop_map(|v| vec![("a".to_owned(), v)]),
        value().prop_map(|v| vec![("d".to_owned(), v)]),
        (value(), value()).prop_map(|(b, c)| vec![("b".to_owned(), b), ("c".to_owned(), c)]),
        prop::collection::vec(("[a-d*]{1,2}", value()), 1..=4),
    ]
}

fn descriptor(entries: &[(String, String)], cost: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| rate_limit_descriptor::Entry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        hits_addend: Some(UInt64Value { value: cost }),
        ..Default::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn matching_never_panics_on_arbitrary_descriptors(
        entries in prop::collection::vec((".{0,8}", ".{0,8}"), 0..40),
    ) {
        let config = rules();
        let domain = config.domain("p").expect("domain");
        let _ = match_descriptor(domain, entries.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }

    #[test]
    fn requests_get_what_plain_counters_say_all_or_nothing(
        requests in prop::collection::vec(
            prop::collection::vec((entries(), 1..=4u64), 1..=3),
            1..=25,
        ),
    ) {
        check_against_counters(requests, None)?;
    }

    /// With leases on, hot keys are decided from blocks held in process: never more than
    /// the counters allow, all or nothing, but a request may be refused that the counters
    /// would admit (its units split between a block and the store: leases trade a little
    /// utilisation for speed, docs/leases.md).
    #[test]
    fn with_leases_no_request_is_admitted_past_what_plain_counters_allow(
        requests in prop::collection::vec(
            prop::collection::vec((entries(), 1..=4u64), 1..=3),
            1..=25,
        ),
    ) {
        check_against_counters(requests, Some(rein::LeaseConfig::default()))?;
    }
}

/// Runs `requests` through the service and through plain counters. Without leases every
/// answer must agree; with them, every admission must fit the counters (which then follow
/// the service's admissions).
fn check_against_counters(
    requests: Vec<Vec<Descriptor>>,
    leases: Option<rein::LeaseConfig>,
) -> Result<(), TestCaseError> {
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let settings = ServiceSettings {
            failure: FailurePolicy::FailClosed,
            shadow_mode: false,
            legacy_headers: false,
            leases,
        };
        let _entered = runtime.enter();
        let service =
            RateLimitService::new(MemoryStore::new(), rules(), settings).expect("service");
        let mut counts: HashMap<String, u64> = HashMap::new();
        for request in requests {
            let proto = RateLimitRequest {
                domain: "p".into(),
                descriptors: request
                    .iter()
                    .map(|(e, cost)| descriptor(e, *cost))
                    .collect(),
                hits_addend: 0,
            };
            let answer = runtime
                .block_on(service.should_rate_limit(&proto))
                .expect("a valid request");
            // The oracle: charge in order on a copy; the first that does not fit denies the
            // request, later ones are only checked; the copy is kept only if none denied.
            let mut trial = counts.clone();
            let mut denied = false;
            let mut expected = Vec::new();
            for (entries, cost) in &request {
                let code = match oracle_counter(entries) {
                    None => Code::Ok,
                    Some((counter, limit)) => {
                        let used = trial.get(&counter).copied().unwrap_or(0);
                        let fits = used + cost <= limit;
                        if fits && !denied {
                            trial.insert(counter, used + cost);
                        }
                        if !fits {
                            denied = true;
                        }
                        if fits { Code::Ok } else { Code::OverLimit }
                    }
                };
                expected.push(code as i32);
            }
            if leases.is_some() {
                // Under-admission is allowed, and with it this cannot tell a partial charge
                // of a denied request (it only under-admits later; the case without leases
                // checks all or nothing). Over-admission is not.
                if answer.overall_code == Code::Ok as i32 {
                    for (entries, cost) in &request {
                        if let Some((counter, limit)) = oracle_counter(entries) {
                            let used = counts.entry(counter).or_insert(0);
                            *used += cost;
                            prop_assert!(*used <= limit, "over the limit: {:?}", request);
                        }
                    }
                }
                continue;
            }
            if !denied {
                counts = trial;
            }
            let codes: Vec<i32> = answer.statuses.iter().map(|s| s.code).collect();
            prop_assert_eq!(&codes, &expected, "request {:?}", request);
            let overall = if denied { Code::OverLimit } else { Code::Ok };
            prop_assert_eq!(answer.overall_code, overall as i32);
        }
    }
    Ok(())
}
