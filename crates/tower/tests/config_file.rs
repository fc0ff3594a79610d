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
    assert_eq!(names, ["api", "login"]);
    assert!(config.routes[1].matches(&Method::POST, "/login"));
    // Over any limiter: a memory store here, through the resilient limiter as in production.
    let limiter = config.resilient(MemoryStore::new()).expect("limiter");
    let layer = config.layer(limiter).expect("layer");
    assert_eq!(layer.policies().count(), 2);
}

#[test]
fn a_malformed_file_fails_with_the_field_path_and_line() {
    let text = std::fs::read_to_string(example())
        .expect("read")
        .replace(r#"window = "1h""#, r#"window = 3600"#);
    let path = write("malformed", &text);
    let error = Config::load(&path).expect_err("a number is not a duration");
    let LoadError::Field {
        path: field,
        line,
        message,
    } = &error
    else {
        panic!("expected a field error, got {error:?}");
    };
    assert_eq!(field, "policies.api.limits[1].window");
    let expected_line = text
        .lines()
        .position(|l| l.contains("window = 3600"))
        .map(|i| i + 1);
    assert_eq!(*line, expected_line);
    assert!(message.contains("expected a duration"), "{message}");
    let shown = error.to_string();
    assert!(
        shown.starts_with(&format!(
            "line {}: policies.api.limits[1].window: ",
            expected_line.unwrap_or_default()
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
    assert!(
        matches!(config.redis.endpoint, RedisEndpoint::Url(ref url) if url.starts_with("rediss://"))
    );
}
