//! Config files on disk: the shipped example loads and builds a layer; malformed files fail
//! with the variant, field path and line of the mistake.

use std::path::PathBuf;

use http::Method;
use rein::FailurePolicy;
use rein_memory::MemoryStore;
use rein_tower::{Config, LoadError, RedisEndpoint};

fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/rein.toml")
}

fn write(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("rein-tower-{name}-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn the_shipped_example_loads_and_builds_a_layer() {
    let config = Config::load(example()).expect("examples/rein.toml is valid");
    assert_eq!(
        config.redis.endpoint,
        RedisEndpoint::Url("redis://127.0.0.1:6379/".into())
    );
    assert!(matches!(
        config.failure,
        FailurePolicy::LocalFallback { .. }
    ));
    let names: Vec<&str> = config.policies.iter().map(|p| p.name()).collect();
    assert_eq!(names, ["api", "login", "partner"]);
    assert!(
        config.redis.report_counts,
        "servers report for `rein watch` by default"
    );
    assert!(config.routes[1].matches(&Method::POST, "/login"));
    // Over any limiter: a memory store here, through the resilient limiter as in production.
    let limiter = config.resilient(MemoryStore::new()).expect("limiter");
    let layer = config.layer(limiter).expect("layer");
    assert_eq!(layer.policies().len(), 3);

    // What README promises of `cargo run -p rein-tower --example axum`, request by request,
    // over the memory store (the example's handlers, this file's routes).
    use axum::routing::{get, post};
    use tower::ServiceExt;
    let app = axum::Router::new()
        .route("/api/{*rest}", get(|| async { "api" }))
        .route("/login", post(|| async { "welcome" }))
        .layer(layer);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ask = |method: Method, path: &str, api_key: Option<&str>| {
        let mut request = http::Request::builder().method(method).uri(path);
        if let Some(key) = api_key {
            request = request.header("x-api-key", key);
        }
        let request = request
            .extension(rein_tower::PeerAddr(([203, 0, 113, 7], 40_000).into()))
            .body(axum::body::Body::empty())
            .expect("request");
        runtime
            .block_on(app.clone().oneshot(request))
            .expect("infallible")
    };
    let header = |response: &http::Response<_>, name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ASCII").to_owned())
    };
    // A peek spends nothing: the same figures each time.
    let quota = ask(Method::GET, "/api/quota", None);
    assert_eq!(quota.status(), 200);
    let seen = header(&quota, "ratelimit");
    assert_eq!(
        header(&ask(Method::GET, "/api/quota", None), "ratelimit"),
        seen
    );
    // 200 with RateLimit, ten times (a bucket of 10), then 429 with Retry-After.
    for _ in 0..10 {
        let search = ask(Method::GET, "/api/search", None);
        assert_eq!(search.status(), 200);
        assert!(header(&search, "ratelimit").is_some());
    }
    let spent = ask(Method::GET, "/api/search", None);
    assert_eq!(spent.status(), 429);
    assert!(header(&spent, "retry-after").is_some());
    // Five logins a minute.
    for _ in 0..5 {
        assert_eq!(ask(Method::POST, "/login", None).status(), 200);
    }
    assert_eq!(ask(Method::POST, "/login", None).status(), 429);
    // The partner API is keyed by its header: 500 without it.
    assert_eq!(ask(Method::GET, "/api/partner/x", None).status(), 500);
    assert_eq!(ask(Method::GET, "/api/partner/x", Some("k1")).status(), 200);
}

/// `[leases]` turns leases on with its settings; without it, no leases.
#[test]
fn the_leases_table_turns_leases_on_with_its_settings() {
    let head = "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" }]\n";
    let off: Config = head.parse().expect("valid");
    assert_eq!(off.leases, None);
    let on: Config = format!("{head}[leases]\nexpected_nodes = 3\nrenew_interval = \"200ms\"\n")
        .parse()
        .expect("valid");
    assert_eq!(
        on.leases,
        Some(rein::LeaseConfig {
            expected_nodes: std::num::NonZeroU32::new(3).expect("nonzero"),
            renew_interval: rein_core::Micros::from_millis(200),
            ..rein::LeaseConfig::default()
        })
    );
    let limiter = on.limiter(MemoryStore::new()).expect("limiter");
    assert_eq!(
        limiter.lease_stats().map(|stats| stats.reservations),
        Some(0),
        "leases on, nothing reserved yet"
    );
    assert_eq!(
        off.limiter(MemoryStore::new())
            .expect("limiter")
            .lease_stats(),
        None
    );
}

#[test]
fn a_malformed_file_fails_with_the_field_path_and_line() {
    let text = std::fs::read_to_string(example())
        .expect("read")
        .replace(r#"window = "1h""#, r#"window = 3600"#);
    let path = write("malformed", &text);
    let error = Config::load(&path).expect_err("a number is not a duration");
    let LoadError::Field {
        file,
        path: field,
        line,
        message,
    } = &error
    else {
        panic!("expected a field error, got {error:?}");
    };
    assert_eq!(file.as_deref(), Some(path.as_path()), "the file is named");
    assert_eq!(field, "policies.api.limits[1].window");
    let expected_line = text
        .lines()
        .position(|l| l.contains("window = 3600"))
        .map(|i| i + 1)
        .expect("the line");
    assert_eq!(*line, expected_line);
    assert!(message.contains("expected a duration"), "{message}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!(
            "{}: line {expected_line}: policies.api.limits[1].window: ",
            path.display()
        )),
        "{shown}"
    );
}

#[test]
fn a_missing_file_is_a_read_error() {
    let error = Config::load("/nonexistent/rein.toml").expect_err("no such file");
    assert!(matches!(error, LoadError::Read { .. }), "{error:?}");
}

#[test]
fn a_route_to_an_undeclared_policy_names_the_route() {
    let text = std::fs::read_to_string(example())
        .expect("read")
        .replace(r#"policy = "login""#, r#"policy = "logins""#);
    let error = Config::load(write("unknown-policy", &text)).expect_err("undeclared policy");
    let LoadError::UnknownPolicy { path, name, .. } = error else {
        panic!("expected an unknown policy, got {error:?}");
    };
    assert_eq!(
        (path.as_str(), name.as_str()),
        ("routes[1].policy", "logins")
    );
}

#[test]
fn the_complete_file_in_docs_config_md_is_valid() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md"),
    )
    .expect("docs/config.md");
    let section = doc.split("## A complete file").nth(1).expect("the section");
    let toml = section
        .split("```toml\n")
        .nth(1)
        .and_then(|block| block.split("```").next())
        .expect("a toml block");
    let config: Config = toml.parse().expect("the documented file loads");
    assert_eq!(config.routes.len(), 4, "three routes and default_policy");
    assert!(config.leases.is_some(), "leases on");
    assert!(
        matches!(config.redis.endpoint, RedisEndpoint::Url(ref url) if url.starts_with("rediss://"))
    );
}

/// One bad value: the file, the field path the error must name, the line it is on, and
/// words the message must hold.
struct Bad {
    what: &'static str,
    file: &'static str,
    path: &'static str,
    line: usize,
    /// What the message must say after its line and path.
    says: &'static str,
}

/// Every field's bad values, each in a small file whose line numbers are easy to read: the
/// error must name the field's path and its line (for a missing field, the line of the
/// table that lacks it) and say what is wrong in the file's words (no Rust type names),
/// whatever stage refuses it (serde, the validator, rein-core, the Redis store's prefix
/// rule), and before anything connects.
#[test]
#[rustfmt::skip]
fn every_bad_value_is_refused_at_load_with_its_field_path_and_line() {
    let rows = [
        // The file as a whole.
        Bad { what: "an empty file", file: "", path: "redis", line: 1, says: "missing: add a [redis] table" },
        Bad { what: "no policy", file: "[redis]\nurl = \"redis://h/\"\n", path: "policies", line: 1, says: "declare at least one policy" },
        Bad { what: "an unknown table", file: "[redis]\nurl = \"redis://h/\"\n[polices.api]\n", path: "polices", line: 3, says: "unknown field `polices`" },
        // [redis]
        Bad { what: "no url", file: "[redis]\ndeadline = \"5ms\"\n", path: "redis", line: 1, says: "set `url`" },
        Bad { what: "url and cluster", file: "\n[redis]\nurl = \"redis://h/\"\ncluster = [\"redis://h/\"]\n", path: "redis", line: 2, says: "not both" },
        Bad { what: "an empty cluster", file: "[redis]\n\ncluster = []\n", path: "redis.cluster", line: 3, says: "at least one node URL" },
        Bad { what: "a url that is a number", file: "[redis]\nurl = 6379\n", path: "redis.url", line: 2, says: "expected a string" },
        Bad { what: "a url that is no Redis URL", file: "[redis]\n\nurl = \"http://h/\"\n", path: "redis.url", line: 3, says: "not a Redis URL" },
        Bad { what: "a cluster node that is no URL", file: "[redis]\ncluster = [\"redis://a/\", \"b:6379\"]\n", path: "redis.cluster[1]", line: 2, says: "not a Redis URL" },
        // Named at its own line, not the list's.
        Bad { what: "a cluster node that is no URL, on a line of its own", file: "[redis]\ncluster = [\n  \"redis://a/\",\n  \"b:6379\",\n]\n", path: "redis.cluster[1]", line: 4, says: "not a Redis URL" },
        Bad { what: "a zero deadline", file: "[redis]\nurl = \"redis://h/\"\n\ndeadline = \"0ms\"\n", path: "redis.deadline", line: 4, says: "must be longer than zero" },
        Bad { what: "a deadline that is no duration", file: "[redis]\nurl = \"redis://h/\"\ndeadline = \"soon\"\n", path: "redis.deadline", line: 3, says: "expected a duration such as" },
        Bad { what: "a zero connect timeout", file: "[redis]\nurl = \"redis://h/\"\nconnect_timeout = \"0s\"\n", path: "redis.connect_timeout", line: 3, says: "must be longer than zero" },
        Bad { what: "a connect timeout that would overflow the clock", file: "[redis]\nurl = \"redis://h/\"\nconnect_timeout = \"300000000000y\"\n", path: "redis.connect_timeout", line: 3, says: "must be at most an hour" },
        Bad { what: "a key prefix with a brace", file: "[redis]\nurl = \"redis://h/\"\nkey_prefix = \"my{app}\"\n", path: "redis.key_prefix", line: 3, says: "no spaces or braces" },
        Bad { what: "an empty key prefix", file: "[redis]\nurl = \"redis://h/\"\n\nkey_prefix = \"\"\n", path: "redis.key_prefix", line: 4, says: "1 to 64 printable ASCII bytes" },
        Bad { what: "a key prefix with a space", file: "[redis]\nurl = \"redis://h/\"\nkey_prefix = \"my app\"\n", path: "redis.key_prefix", line: 3, says: "no spaces or braces" },
        Bad { what: "the old name of key_prefix", file: "[redis]\nurl = \"redis://h/\"\nprefix = \"myapp\"\n", path: "redis.prefix", line: 3, says: "renamed to `key_prefix`" },
        Bad { what: "report_counts not a bool", file: "[redis]\nurl = \"redis://h/\"\nreport_counts = \"yes\"\n", path: "redis.report_counts", line: 3, says: "expected a boolean" },
        Bad { what: "an unknown redis field", file: "[redis]\nurl = \"redis://h/\"\ndeadlin = \"5ms\"\n", path: "redis.deadlin", line: 3, says: "unknown field `deadlin`" },
        // [failure]
        Bad { what: "no failure policy", file: "[redis]\nurl = \"redis://h/\"\n[failure]\nexpected_nodes = 2\n", path: "failure.policy", line: 3, says: "missing: \"fail_open\"" },
        Bad { what: "an unknown failure policy", file: "[redis]\nurl = \"redis://h/\"\n[failure]\npolicy = \"retry\"\n", path: "failure.policy", line: 4, says: "unknown variant `retry`" },
        Bad { what: "zero nodes", file: "[redis]\nurl = \"redis://h/\"\n[failure]\npolicy = \"local_fallback\"\nexpected_nodes = 0\n", path: "failure.expected_nodes", line: 5, says: "must be at least 1" },
        Bad { what: "negative nodes", file: "[redis]\nurl = \"redis://h/\"\n[failure]\npolicy = \"local_fallback\"\nexpected_nodes = -2\n", path: "failure.expected_nodes", line: 5, says: "integer `-2`, expected a whole number from 0 to 4294967295" },
        Bad { what: "nodes without local_fallback", file: "[redis]\nurl = \"redis://h/\"\n[failure]\npolicy = \"fail_open\"\n\nexpected_nodes = 2\n", path: "failure.expected_nodes", line: 6, says: "only used with policy = \"local_fallback\"" },
        // [leases]
        Bad { what: "leases without nodes", file: "[redis]\nurl = \"redis://h/\"\n[leases]\nrenew_interval = \"1s\"\n", path: "leases.expected_nodes", line: 3, says: "missing: how many servers share the limits" },
        Bad { what: "zero lease nodes", file: "[redis]\nurl = \"redis://h/\"\n[leases]\nexpected_nodes = 0\n", path: "leases.expected_nodes", line: 4, says: "must be at least 1" },
        Bad { what: "negative lease nodes", file: "[redis]\nurl = \"redis://h/\"\n[leases]\nexpected_nodes = -1\n", path: "leases.expected_nodes", line: 4, says: "integer `-1`, expected a whole number from 0 to 4294967295" },
        Bad { what: "a zero renew interval", file: "[redis]\nurl = \"redis://h/\"\n[leases]\nexpected_nodes = 2\nrenew_interval = \"0ms\"\n", path: "leases.renew_interval", line: 5, says: "must be longer than zero" },
        Bad { what: "a store deadline past the leases' flight timeout", file: "[redis]\nurl = \"redis://h/\"\ndeadline = \"2s\"\n[leases]\nexpected_nodes = 2\n", path: "leases", line: 4, says: "(2.005s) is longer than the leases' flight timeout (1s): a grant that comes back later would be stranded; shorten redis.deadline" },
        Bad { what: "an unknown leases field", file: "[redis]\nurl = \"redis://h/\"\n[leases]\nexpected_nodes = 2\nblock = 10\n", path: "leases.block", line: 5, says: "unknown field `block`, expected `expected_nodes` or `renew_interval`" },
        Bad { what: "local_fallback without nodes", file: "[redis]\nurl = \"redis://h/\"\n[failure]\npolicy = \"local_fallback\"\n", path: "failure.expected_nodes", line: 3, says: "needs the number of servers" },
        // [policies.*]
        Bad { what: "no limits", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\n", path: "policies.api.limits", line: 3, says: "missing: a list of limits" },
        Bad { what: "shadow not a boolean", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nshadow = \"yes\"\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" }]\n", path: "policies.api.shadow", line: 4, says: "expected a boolean" },
        Bad { what: "an empty list of limits", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = []\n", path: "policies.api.limits", line: 3, says: "at least one limit" },
        Bad { what: "a bad policy name", file: "[redis]\nurl = \"redis://h/\"\n[policies.\"a b\"]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" }]\n", path: "policies.a b", line: 3, says: "a policy name is 1 to 64" },
        Bad { what: "no algorithm", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [\n  { limit = 1, window = \"1s\" },\n]\n", path: "policies.api.limits[0].algorithm", line: 5, says: "missing: \"token_bucket\"" },
        Bad { what: "an unknown algorithm", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"leaky\", limit = 1, window = \"1s\" }]\n", path: "policies.api.limits[0].algorithm", line: 4, says: "unknown variant `leaky`" },
        Bad { what: "a zero limit", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [\n  { algorithm = \"sliding_log\", limit = 0, window = \"1s\" },\n]\n", path: "policies.api.limits[0]", line: 5, says: "limit must be at least 1" },
        Bad { what: "a negative limit", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = -1, window = \"1s\" }]\n", path: "policies.api.limits[0].limit", line: 4, says: "integer `-1`, expected a whole number, 0 or more" },
        Bad { what: "a zero window", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"0s\" }]\n", path: "policies.api.limits[0]", line: 4, says: "window must be at least 1" },
        Bad { what: "a window that is a number", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = 60 }]\n", path: "policies.api.limits[0].window", line: 4, says: "expected a duration such as" },
        Bad { what: "a window without its limit", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"sliding_counter\", window = \"1s\" }]\n", path: "policies.api.limits[0].limit", line: 4, says: "a sliding_counter limit needs `limit`" },
        Bad { what: "a bucket's field on a window", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\", refill = 1 }]\n", path: "policies.api.limits[0].refill", line: 4, says: "not a setting of a fixed_window limit" },
        Bad { what: "a bucket without its period", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", capacity = 5, refill = 1 }]\n", path: "policies.api.limits[0].period", line: 4, says: "a token_bucket limit needs `period`" },
        Bad { what: "a bucket refilling nothing", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", capacity = 5, refill = 0, period = \"1s\" }]\n", path: "policies.api.limits[0]", line: 4, says: "refill must be at least 1" },
        Bad { what: "a window's field on a bucket", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", capacity = 5, refill = 1, period = \"1s\", window = \"1s\" }]\n", path: "policies.api.limits[0].window", line: 4, says: "not a setting of a token_bucket limit" },
        Bad { what: "an unknown limit field", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\", burst = 2 }]\n", path: "policies.api.limits[0].burst", line: 4, says: "unknown field `burst`" },
        Bad { what: "nine limits", file: "[redis]\nurl = \"redis://h/\"\n[policies.api]\nlimits = [\n{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" },{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" }]\n", path: "policies.api.limits", line: 3, says: "at most 8 limits, got 9" },
    ];
    // The validator reads [redis] and [failure] before the policies: no policy needed.
    check(&rows, "");
}

/// A `[http]` fixed key of 1 025 bytes, one over what a limiter takes.
fn long_fixed_key() -> &'static str {
    let file = format!(
        "[http]\nkey = {{ from = \"fixed\", value = \"{}\" }}\n",
        "k".repeat(1_025)
    );
    file.leak()
}

/// `[http]` and `[[routes]]`: each file below follows a valid `[redis]` and policy (lines 1
/// to 5).
#[test]
#[rustfmt::skip]
fn every_bad_http_or_route_value_is_refused_at_load_with_its_field_path_and_line() {
    const HEAD: &str = "[redis]\nurl = \"redis://h/\"\ndeadline = \"40ms\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 1, window = \"1s\" }]\n";
    let rows = [
        // [http]: lines from 6 on.
        Bad { what: "a zero layer deadline", file: "[http]\ndeadline = \"0ms\"\n", path: "http.deadline", line: 7, says: "must be longer than zero" },
        Bad { what: "a layer deadline below the store's", file: "[http]\n\ndeadline = \"15ms\"\n", path: "http.deadline", line: 8, says: "must be longer than the limiter's deadline (45ms: redis.deadline plus 5ms)" },
        Bad { what: "a layer deadline equal to the limiter's", file: "[http]\ndeadline = \"45ms\"\n", path: "http.deadline", line: 7, says: "must be longer than the limiter's deadline (45ms" },
        Bad { what: "a layer deadline within the leased limiter's", file: "[leases]\nexpected_nodes = 2\n[http]\ndeadline = \"60ms\"\n", path: "http.deadline", line: 9, says: "(90ms: redis.deadline plus 5ms, times 2 with [leases])" },
        Bad { what: "a layer deadline under a microsecond", file: "[http]\ndeadline = \"500ns\"\n", path: "http.deadline", line: 7, says: "must be at least 1µs" },
        Bad { what: "an answer that is no status", file: "[http]\non_unavailable = 42\n", path: "http.on_unavailable", line: 7, says: "expected an HTTP error status code" },
        Bad { what: "an answer that is a success", file: "[http]\non_missing_key = 200\n", path: "http.on_missing_key", line: 7, says: "expected an HTTP error status code (400 to 599)" },
        Bad { what: "an answer word", file: "[http]\non_missing_key = \"deny\"\n", path: "http.on_missing_key", line: 7, says: "string \"deny\", expected an HTTP error status code" },
        Bad { what: "admitted headers", file: "[http]\nadmitted_headers = \"some\"\n", path: "http.admitted_headers", line: 7, says: "unknown variant `some`" },
        Bad { what: "an undeclared default policy", file: "[http]\ndefault_policy = \"apj\"\n", path: "http.default_policy", line: 7, says: "no policy named \"apj\"" },
        Bad { what: "a key source", file: "[http]\nkey = { from = \"cookie\" }\n", path: "http.key.from", line: 7, says: "unknown variant `cookie`" },
        Bad { what: "a key without a source", file: "[http]\nkey = { name = \"x-api-key\" }\n", path: "http.key.from", line: 7, says: "missing: \"peer\"" },
        Bad { what: "a header key without a name", file: "[http]\nkey = { from = \"header\" }\n", path: "http.key.name", line: 7, says: "missing: the header's name" },
        Bad { what: "a header name", file: "[http]\nkey = { from = \"header\", name = \"x api\" }\n", path: "http.key.name", line: 7, says: "not a valid header name" },
        Bad { what: "forwarding without hops", file: "[http]\nkey = { from = \"x-forwarded-for\" }\n", path: "http.key.trusted_hops", line: 7, says: "how many proxies of yours" },
        Bad { what: "hops past a byte", file: "[http]\nkey = { from = \"forwarded\", trusted_hops = 300 }\n", path: "http.key.trusted_hops", line: 7, says: "integer `300`, expected a whole number from 0 to 255" },
        Bad { what: "a peer key with a name", file: "[http]\nkey = { from = \"peer\", name = \"x\" }\n", path: "http.key.name", line: 7, says: "not a setting of from = \"peer\"" },
        Bad { what: "a fixed key without a value", file: "[http]\nkey = { from = \"fixed\" }\n", path: "http.key.value", line: 7, says: "missing: the one key" },
        Bad { what: "an unknown http field", file: "[http]\ntimeout = \"1s\"\n", path: "http.timeout", line: 7, says: "unknown field `timeout`" },
        // [[routes]]: lines from 6 on.
        Bad { what: "a route with no policy", file: "[[routes]]\nprefix = \"/x\"\n", path: "routes[0]", line: 6, says: "or `exempt = true`" },
        Bad { what: "an undeclared policy", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"apj\"\n", path: "routes[0].policy", line: 8, says: "no policy named \"apj\"" },
        Bad { what: "path and prefix", file: "[[routes]]\npath = \"/x\"\nprefix = \"/x\"\npolicy = \"api\"\n", path: "routes[0]", line: 6, says: "set `path` or `prefix`, not both" },
        Bad { what: "exempt with a policy", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\nexempt = true\n", path: "routes[0]", line: 6, says: "an exempt route has no `policy`" },
        Bad { what: "a method", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\nmethods = [\"GET\",\n  \"P O S T\"]\n", path: "routes[0].methods[1]", line: 10, says: "not a standard HTTP method" },
        Bad { what: "a misspelt method", file: "[[routes]]\nprefix = \"/login\"\npolicy = \"api\"\nmethods = [\"PSOT\"]\n", path: "routes[0].methods[0]", line: 9, says: "not a standard HTTP method (one of GET, HEAD, POST" },
        Bad { what: "a path with a space", file: "[[routes]]\npath = \"/login \"\npolicy = \"api\"\n", path: "routes[0].path", line: 6, says: "no spaces or control characters" },
        Bad { what: "no methods", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\nmethods = []\n", path: "routes[0].methods", line: 6, says: "list at least one method" },
        Bad { what: "a path without its slash", file: "[[routes]]\npath = \"login\"\npolicy = \"api\"\n", path: "routes[0].path", line: 6, says: "would match no request" },
        Bad { what: "a router's pattern", file: "[[routes]]\npath = \"/users/{id}\"\npolicy = \"api\"\n", path: "routes[0].path", line: 6, says: "a router's syntax" },
        Bad { what: "a router's wildcard", file: "[[routes]]\nprefix = \"/api/*\"\npolicy = \"api\"\n", path: "routes[0].prefix", line: 6, says: "a router's syntax" },
        Bad { what: "a prefix with a query", file: "[[routes]]\nprefix = \"/search?q=\"\npolicy = \"api\"\n", path: "routes[0].prefix", line: 6, says: "has no `?` or `#`" },
        Bad { what: "a cost over the capacity", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\ncost = 2\n", path: "routes[0].cost", line: 6, says: "2 is more than the policy's capacity (1)" },
        Bad { what: "a negative cost", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\ncost = -1\n", path: "routes[0].cost", line: 9, says: "integer `-1`, expected a whole number, 0 or more" },
        Bad { what: "a route key", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\nkey = { from = \"header\", name = \"x\", trusted_hops = 1 }\n", path: "routes[0].key.trusted_hops", line: 9, says: "not a setting of from = \"header\"" },
        Bad { what: "the second route", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\n[[routes]]\nprefix = \"/y\"\npolicy = \"apj\"\n", path: "routes[1].policy", line: 11, says: "no policy named \"apj\"" },
        Bad { what: "an unknown route field", file: "[[routes]]\nprefix = \"/x\"\npolicy = \"api\"\nweight = 2\n", path: "routes[0].weight", line: 9, says: "unknown field `weight`" },
        Bad { what: "an exempt route's cost", file: "[[routes]]\nprefix = \"/h\"\nexempt = true\ncost = 2\n", path: "routes[0].cost", line: 6, says: "an exempt route is not limited" },
        Bad { what: "an exempt route's key", file: "[[routes]]\nprefix = \"/h\"\nexempt = true\nkey = { from = \"peer\" }\n", path: "routes[0].key", line: 6, says: "an exempt route is not limited" },
        Bad { what: "a fixed key too long to be a key", file: long_fixed_key(), path: "http.key.value", line: 7, says: "the user key is 1025 bytes, over the limit of 1024" },
        // One policy counted by keys that could be another client's.
        Bad { what: "a header and the address under one policy", file: "[[routes]]\nprefix = \"/a\"\npolicy = \"api\"\n[[routes]]\nprefix = \"/b\"\npolicy = \"api\"\nkey = { from = \"header\", name = \"x-api-key\" }\n", path: "routes[1].key", line: 9, says: "policy \"api\" is counted here by header x-api-key and by route \"/a*\" by the peer address" },
        Bad { what: "a header route and the default policy", file: "[http]\ndefault_policy = \"api\"\n[[routes]]\nprefix = \"/b\"\npolicy = \"api\"\nkey = { from = \"header\", name = \"x-api-key\" }\n", path: "http.default_policy", line: 7, says: "by the peer address and by route \"/b*\" by header x-api-key" },
    ];
    check(&rows, HEAD);
}

/// Loads each row's file after `head` and checks the error's path, line and text.
fn check(rows: &[Bad], head: &str) {
    for row in rows {
        let text = format!("{head}{}", row.file);
        let error = match text.parse::<Config>() {
            Ok(_) => panic!("{}: loaded\n{text}", row.what),
            Err(error) => error,
        };
        let (path, line) = match &error {
            LoadError::Field { path, line, .. }
            | LoadError::Limit { path, line, .. }
            | LoadError::UnknownPolicy { path, line, .. } => (path.as_str(), *line),
            other => panic!("{}: {other:?}", row.what),
        };
        assert_eq!(
            (path, line),
            (row.path, row.line),
            "{}: {error}\n{text}",
            row.what
        );
        let shown = error.to_string();
        let head = format!("line {}: {}: ", row.line, row.path);
        assert!(
            shown.starts_with(&head) && shown[head.len()..].contains(row.says),
            "{}: {shown:?} should start {head:?} and say {:?}",
            row.what,
            row.says
        );
    }
}
