//! Header rendering against `Decision`, as properties: rounding up, zero, and values up to
//! rein's largest (2^52 µs) and past the structured-field integer range.

use std::ops::RangeInclusive;

use http::HeaderValue;
use proptest::prelude::*;
use proptest::strategy::Union;
use rein_core::time::{MAX_MICROS, MAX_SPAN};
use rein_core::{ConfigError, Decision, Limit, Micros, NamedPolicy, Outcome, Policy};
use rein_tower::headers::{
    SF_INTEGER_MAX, deciding_limit, longest_reset_secs, render, reset_secs, retry_after_secs,
    window_secs,
};

/// Microseconds weighted towards the edges: zero, whole seconds and one either side, and
/// the largest.
fn micros() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(MAX_MICROS),
        (0..10_000u64).prop_flat_map(|s| (s * 1_000_000).saturating_sub(1)..=(s * 1_000_000 + 1)),
        0..=MAX_MICROS,
    ]
}

fn quantity() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(u64::MAX),
        Just(SF_INTEGER_MAX + 1),
        any::<u64>()
    ]
}

/// How a window limit is made from its count and its window.
type Window = fn(u64, Micros) -> Result<Limit, ConfigError>;

/// One of `windows` (in that order) of `count` per `span` µs, or a token bucket of
/// `capacity` refilled by `refill` every `span` µs, each as likely; invalid settings are
/// left out.
fn limits(
    windows: &[Window],
    count: RangeInclusive<u64>,
    span: RangeInclusive<u64>,
    capacity: RangeInclusive<u64>,
    refill: RangeInclusive<u64>,
) -> impl Strategy<Value = Limit> {
    let mut kinds: Vec<BoxedStrategy<Result<Limit, ConfigError>>> = windows
        .iter()
        .map(|&make| {
            (count.clone(), span.clone())
                .prop_map(move |(n, w)| make(n, Micros::from_micros(w)))
                .boxed()
        })
        .collect();
    kinds.push(
        (capacity, refill, span)
            .prop_map(|(c, r, p)| Limit::token_bucket(c, r, Micros::from_micros(p)))
            .boxed(),
    );
    Union::new(kinds).prop_filter_map("valid limit", Result::ok)
}

fn limit() -> impl Strategy<Value = Limit> {
    limits(
        &[Limit::fixed_window, Limit::sliding_counter],
        1..=MAX_MICROS / 1_000_000,
        1..=1_000_000_000,
        1..=1_000,
        1..=1_000,
    )
}

fn policy() -> impl Strategy<Value = NamedPolicy> {
    (
        prop::collection::vec(limit(), 1..=4),
        "[a-z][a-z0-9_.-]{0,20}",
    )
        .prop_map(|(limits, name)| {
            NamedPolicy::new(name, Policy::new(limits).expect("1 to 4 limits")).expect("valid name")
        })
}

fn decision() -> impl Strategy<Value = Decision> {
    (any::<bool>(), quantity(), quantity(), micros(), micros()).prop_map(
        |(allowed, limit, remaining, retry, reset)| Decision {
            outcome: if allowed {
                Outcome::Allowed
            } else {
                Outcome::Denied
            },
            limit,
            remaining,
            retry_after: if allowed {
                Micros::ZERO
            } else {
                Micros::from_micros(retry)
            },
            reset_after: Micros::from_micros(reset),
            limit_index: 0,
        },
    )
}

/// `(name, [(parameter, value)])` of each item of a rendered list.
fn parse_list(value: &str) -> Vec<(String, Vec<(String, u64)>)> {
    value
        .split(", ")
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().expect("name");
            assert!(
                name.len() >= 2 && name.starts_with('"') && name.ends_with('"'),
                "{item}"
            );
            let parameters = parts
                .map(|p| {
                    let (key, number) = p.split_once('=').expect("key=value");
                    assert!(
                        number.len() <= 15,
                        "an sf-integer has at most 15 digits: {item}"
                    );
                    (key.to_owned(), number.parse().expect("integer"))
                })
                .collect();
            (name[1..name.len() - 1].to_owned(), parameters)
        })
        .collect()
}

/// `span` in whole seconds, rounded up.
fn ceil(span: Micros) -> u64 {
    span.as_micros().div_ceil(1_000_000)
}

/// Whole seconds `s` are `span` rounded up: the smallest `s` with `s` seconds ≥ `span`.
fn is_ceiling(seconds: u64, span: Micros) -> bool {
    let us = u128::from(span.as_micros());
    u128::from(seconds) * 1_000_000 >= us
        && (seconds == 0 || u128::from(seconds - 1) * 1_000_000 < us)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn retry_after_is_retry_after_rounded_up_and_only_on_denials(
        policy in policy(), decision in decision(),
    ) {
        let deciding = deciding_limit(policy.policy(), &decision);
        let headers = render(&policy, deciding, &decision);
        match headers.retry_after {
            None => prop_assert!(decision.is_allowed()),
            Some(seconds) => {
                prop_assert!(!decision.is_allowed());
                prop_assert_eq!(seconds, retry_after_secs(&decision));
                if decision.is_blind() {
                    // A failure policy's denial: a second at least, never "now".
                    prop_assert!(seconds >= 1);
                } else {
                    prop_assert!(is_ceiling(seconds, decision.retry_after));
                    prop_assert_eq!(seconds == 0, decision.retry_after == Micros::ZERO);
                }
            }
        }
    }

    #[test]
    fn rate_limit_reports_the_deciding_limit_remaining_and_reset(
        policy in policy(), decision in decision(),
    ) {
        let deciding = deciding_limit(policy.policy(), &decision);
        prop_assert!(deciding < policy.policy().limits().len());
        let headers = render(&policy, deciding, &decision);
        // A failure policy's answer shows no figures.
        let Some(rate_limit) = headers.rate_limit else {
            prop_assert!(decision.is_blind());
            return Ok(());
        };
        prop_assert!(!decision.is_blind());
        prop_assert!(HeaderValue::from_str(&rate_limit).is_ok());
        let items = parse_list(&rate_limit);
        prop_assert_eq!(items.len(), 1);
        let (name, parameters) = &items[0];
        let expected_name = if policy.policy().limits().len() == 1 {
            policy.name().to_owned()
        } else {
            format!("{}.{deciding}", policy.name())
        };
        prop_assert_eq!(name, &expected_name);
        prop_assert_eq!(&parameters[0].0, "r");
        prop_assert_eq!(parameters[0].1, decision.remaining.min(SF_INTEGER_MAX));
        prop_assert_eq!(&parameters[1].0, "t");
        let t = parameters[1].1;
        if decision.is_allowed() {
            let bound = longest_reset_secs(&policy.policy().limits()[deciding]);
            prop_assert_eq!(t, ceil(decision.reset_after).min(bound).min(SF_INTEGER_MAX));
        } else {
            // A denial's `t` is `Retry-After`: the same instant.
            prop_assert_eq!(t, retry_after_secs(&decision).min(SF_INTEGER_MAX));
        }
    }

    #[test]
    fn rate_limit_policy_lists_every_limit_with_its_quota_and_window(policy in policy()) {
        let decision = Decision {
            outcome: Outcome::Allowed,
            limit: 1,
            remaining: 0,
            retry_after: Micros::ZERO,
            reset_after: Micros::ZERO,
            limit_index: 0,
        };
        let headers = render(&policy, 0, &decision);
        prop_assert!(HeaderValue::from_str(&headers.policy).is_ok());
        let items = parse_list(&headers.policy);
        let limits = policy.policy().limits();
        prop_assert_eq!(items.len(), limits.len());
        for (item, limit) in items.iter().zip(limits) {
            prop_assert_eq!(&item.1[0], &("q".to_owned(), limit.capacity().min(SF_INTEGER_MAX)));
            prop_assert_eq!(&item.1[1], &("w".to_owned(), window_secs(limit)));
            prop_assert!(item.1[1].1 >= 1);
        }
    }
}

#[test]
fn zero_and_the_largest_values_render() {
    let policy = NamedPolicy::new(
        "p",
        Policy::single(Limit::fixed_window(MAX_MICROS, MAX_SPAN).expect("valid")),
    )
    .expect("valid name");
    let largest = Decision {
        outcome: Outcome::Denied,
        limit: u64::MAX,
        remaining: u64::MAX,
        retry_after: Micros::MAX,
        reset_after: Micros::MAX,
        limit_index: 0,
    };
    let headers = render(&policy, 0, &largest);
    // 2^52 - 1 µs is 4 503 599 628 s and a fraction: rounded up.
    assert_eq!(headers.retry_after, Some(4_503_599_628));
    assert_eq!(
        headers.rate_limit,
        Some(format!("\"p\";r={SF_INTEGER_MAX};t=4503599628"))
    );
    assert_eq!(
        headers.policy,
        // The longest window, MAX_SPAN = 2^48 µs, is 281 474 976.7 s: rounded up.
        format!("\"p\";q={SF_INTEGER_MAX};w=281474977")
    );
    let zero = Decision {
        outcome: Outcome::Denied,
        limit: 0,
        remaining: 0,
        retry_after: Micros::ZERO,
        reset_after: Micros::from_micros(1),
        limit_index: 0,
    };
    let headers = render(&policy, 0, &zero);
    assert_eq!(headers.retry_after, Some(0));
    assert_eq!(headers.rate_limit.as_deref(), Some("\"p\";r=0;t=0"));
    // Full again now as well: a failure policy's denial, which knows no wait but is told
    // to take a second.
    let blind = Decision::blind_denial(0, Micros::ZERO);
    assert_eq!(render(&policy, 0, &blind).retry_after, Some(1));
    assert_eq!(render(&policy, 0, &blind).rate_limit, None, "no figures");
}

/// A limit small enough that random histories exhaust it, with windows and periods that are
/// not whole seconds, so rounding is exercised.
fn small_limit() -> impl Strategy<Value = Limit> {
    limits(
        &[
            Limit::fixed_window,
            Limit::sliding_log,
            Limit::sliding_counter,
        ],
        1..=8,
        200_000..=5_000_000,
        1..=8,
        1..=4,
    )
}

/// A client's history: before each request, a wait (often none, so bursts deny), then a
/// cost.
fn history() -> impl Strategy<Value = Vec<(u64, u64)>> {
    let wait = prop_oneof![Just(0u64), 0..=100_000u64, 0..=3_000_000u64];
    prop::collection::vec((wait, 1..=4u64), 1..=60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// The defect this pins: a sliding log of 7 per 3 s denied with `Retry-After: 1` and
    /// `t=3` (the newest entry's exit), although waiting 1 s admitted the request.
    #[test]
    fn a_client_that_waits_t_on_a_denial_is_admitted_and_waits_less_than_a_second_too_long(
        limits in prop::collection::vec(small_limit(), 1..=3),
        steps in history(),
    ) {
        let named = NamedPolicy::new("p", Policy::new(limits).expect("1 to 3 limits"))
            .expect("valid name");
        let policy = named.policy();
        let mut state = policy.new_state();
        let mut now = 0u64;
        for (wait, cost) in steps {
            now += wait;
            let cost = cost.min(policy.capacity());
            let at = |us: u64| rein_core::Timestamp::from_micros(us);
            let decision = policy.acquire(at(now), &mut state, cost).expect("cost fits");
            let deciding = deciding_limit(policy, &decision);
            let headers = render(&named, deciding, &decision);
            let t = reset_secs(policy, deciding, &decision);
            let named_limit = &policy.limits()[deciding];
            if decision.is_allowed() {
                prop_assert_eq!(headers.retry_after, None);
                prop_assert!(t <= longest_reset_secs(named_limit));
                if policy.limits().len() == 1 {
                    // The renderer's input itself, unbounded: with time moving forward a
                    // limit is full again within its longest reset (`t ≤ w`, or `2w` for a
                    // sliding counter).
                    prop_assert!(ceil(decision.reset_after) <= longest_reset_secs(named_limit));
                }
                continue;
            }
            // A denial: `t` and `Retry-After` name the same instant...
            prop_assert_eq!(headers.retry_after, Some(t));
            // ... at which the same request is admitted,
            let mut waited = state.clone();
            prop_assert!(
                policy.acquire(at(now + t * 1_000_000), &mut waited, cost).expect("fits")
                    .is_allowed(),
                "waited t={} s after {:?}", t, decision
            );
            // ... and which is the least wait rounded up to a second: a microsecond before
            // `retry_after` it is still denied.
            let least = decision.retry_after.as_micros();
            prop_assert!(t * 1_000_000 - least < 1_000_000);
            if least > 0 {
                let mut early = state.clone();
                prop_assert!(
                    !policy.acquire(at(now + least - 1), &mut early, cost).expect("fits")
                        .is_allowed()
                );
            }
        }
    }
}
