//! The `rein-server` binary as an operator runs it, on the in-process store: it serves,
//! refuses a bad rules file on SIGHUP while the rules in force keep serving (logging the
//! file, line and field), takes a good one, and exits cleanly on SIGTERM; a shadow rule's
//! would-be refusal is counted as `shadow_mode`. `check-config` exits 0 or 1 with the
//! error's position.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use support::{Running, exit_status, free_addr, post_json, signal, temp_dir, wait_for_port};

const RULES: &str = "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n";

/// `POST /json` for user `ann`; the answer's text.
fn ask(http: SocketAddr) -> String {
    post_json(
        http,
        r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#,
    )
}

#[test]
fn a_bad_reload_is_refused_a_good_one_taken_and_sigterm_exits_cleanly() {
    let dir = temp_dir("ops");
    let file = dir.join("ops.yaml");
    std::fs::write(&file, RULES).expect("write");
    std::fs::write(
        dir.join("shadow.yaml"),
        "domain: shadow\ndescriptors:\n  - key: user\n    shadow_mode: true\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n",
    )
    .expect("write");
    let (http, grpc) = (free_addr(), free_addr());
    let log = dir.join("server.log");
    let mut child = Running(
        support::server(&dir, grpc, http)
            // Reloads only on SIGHUP, so the test decides when.
            .args(["--watch-interval", "0s"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("start rein-server"),
    );
    wait_for_port(http, "rein-server", None);
    assert!(ask(http).contains(r#""overallCode":"OK""#));

    // A shadow rule asked more than its capacity at once: answered OK and counted as what
    // it would have been refused as, `shadow_mode`, not `over_limit`.
    let shadow = post_json(
        http,
        r#"{"domain":"shadow","descriptors":[{"entries":[{"key":"user","value":"ann"}],"hitsAddend":"5"}]}"#,
    );
    assert!(shadow.contains(r#""overallCode":"OK""#), "{shadow}");
    let scraped = support::get(http, "/metrics");
    let counted = |outcome: &str| {
        let series =
            format!(r#"rein_server_decisions_total{{rule="shadow.user",outcome="{outcome}"}} "#);
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(str::to_owned)
    };
    assert_eq!(
        (counted("shadow_mode"), counted("over_limit")),
        (Some("1".into()), Some("0".into())),
        "{scraped}"
    );

    // A bad file: refused, logged with its position, and the old rules still serve.
    std::fs::write(&file, RULES.replace("unit: hour", "unit: fortnight")).expect("write");
    signal(child.id(), "HUP");
    let logged = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(needle) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in the log:\n{text}"
            );
            thread::sleep(Duration::from_millis(50));
        }
    };
    let text = logged("reload refused");
    assert!(text.contains("ops.yaml:4:"), "{text}");
    assert!(text.contains("descriptors[0].rate_limit.unit"), "{text}");
    let second = ask(http);
    assert!(second.contains(r#""overallCode":"OK""#), "{second}");
    assert!(
        second.contains(r#""limitRemaining":0"#),
        "the old limit of 2 counts on: {second}"
    );

    // A good file: taken. In process, a changed rule counts afresh (Redis would keep the
    // count; docs/server.md): the new limit of 3, then over it.
    std::fs::write(
        &file,
        RULES.replace("requests_per_unit: 2", "requests_per_unit: 3"),
    )
    .expect("write");
    signal(child.id(), "HUP");
    logged("rules reloaded");
    for _ in 0..3 {
        let answer = ask(http);
        assert!(answer.contains(r#""overallCode":"OK""#), "{answer}");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    let over = ask(http);
    assert!(over.contains("OVER_LIMIT"), "{over}");
    assert!(
        over.starts_with("HTTP/1.1 429"),
        "as envoyproxy/ratelimit's /json: {over}"
    );

    signal(child.id(), "TERM");
    let status = exit_status(&mut child, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_exits_zero_or_one_with_the_position() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/config");
    let ok = Command::new(env!("CARGO_BIN_EXE_rein-server"))
        .args(["check-config", &examples.display().to_string()])
        .output()
        .expect("run");
    assert!(ok.status.success(), "{ok:?}");
    let bad = std::env::temp_dir().join(format!("rein-server-bad-{}.yaml", std::process::id()));
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - value: x\n").expect("write");
    let refused = Command::new(env!("CARGO_BIN_EXE_rein-server"))
        .args(["check-config", &bad.display().to_string()])
        .output()
        .expect("run");
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(":3:") && stderr.contains("descriptors[0].key"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&bad);
}

/// `--leases` with a `--redis-deadline` longer than the leases' flight timeout: refused at
/// start, before anything connects (the Redis URL names a port nobody listens on), in the
/// flags' words; a deadline within it passes the check and fails only at the connection.
#[test]
fn leases_over_a_deadline_they_cannot_wait_for_are_refused_before_connecting() {
    let dir = temp_dir("lease-flags");
    std::fs::write(dir.join("rules.yaml"), RULES).expect("write");
    let start = |deadline: &str| {
        support::server(&dir, free_addr(), free_addr())
            .args(["--leases", "--redis-deadline", deadline])
            .args([
                "--redis-url",
                &format!("redis://127.0.0.1:{}/", support::free_port()),
            ])
            .env("NO_COLOR", "1")
            .output()
            .expect("run")
    };
    let refused = start("2s");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--redis-deadline 2s with --leases")
            && stderr.contains("shorten --redis-deadline"),
        "{stderr}"
    );
    let unreachable = start("50ms");
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        !unreachable.status.success() && stderr.contains("cannot connect to Redis"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--redis-cluster`: the limits live in a 3-master Redis Cluster (the harness's, on
/// loopback); two descriptors of one request whose keys hash to different slots are still
/// decided all or nothing, and a limit is admitted exactly.
#[test]
fn over_a_redis_cluster_the_limit_is_exact_and_requests_all_or_nothing() {
    let cluster = rein_redis_harness::RedisCluster::start().expect("start the cluster");
    let dir = temp_dir("cluster");
    std::fs::write(
        dir.join("ops.yaml"),
        "domain: ops\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 2 }\n  - key: cart\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    )
    .expect("write");
    let (http, grpc) = (free_addr(), free_addr());
    let _server = Running(
        support::server(&dir, grpc, http)
            .args(["--redis-cluster", &cluster.urls().join(",")])
            .args(["--failure", "fail-closed", "--redis-deadline", "500ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rein-server"),
    );
    wait_for_port(http, "rein-server", None);
    let post = |body: &str| post_json(http, body);
    let both = r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"ann"}]},{"entries":[{"key":"cart","value":"c1"}]}]}"#;
    let user = r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;
    assert!(post(both).contains(r#""overallCode":"OK""#));
    // The cart is spent: denied, and the user's unit given back each time.
    for _ in 0..3 {
        assert!(post(both).contains(r#""overallCode":"OVER_LIMIT""#));
    }
    let answer = post(user);
    assert!(
        answer.contains(r#""limitRemaining":0"#),
        "one left before, none now: {answer}"
    );
    assert!(post(user).contains("OVER_LIMIT"));
    // As protobuf's JSON mapping reads it: proto names, a UInt64Value as a string, a unit
    // by number (2: MINUTE).
    let proto = r#"{"domain":"ops","descriptors":[{"entries":[{"key":"user","value":"bo"}],"hits_addend":"2","limit":{"requests_per_unit":"3","unit":2}}]}"#;
    let answer = post(proto);
    assert!(answer.contains(r#""overallCode":"OK""#), "{answer}");
    assert!(
        answer.contains(r#""limitRemaining":1"#),
        "2 of 3 taken: {answer}"
    );
    // A unit the service cannot count in is the JSON caller's mistake: 400, naming it.
    for unit in [r#""FORTNIGHT""#, "9", r#""UNKNOWN""#] {
        let bad = format!(
            r#"{{"domain":"ops","descriptors":[{{"entries":[{{"key":"user","value":"cy"}}],"limit":{{"requestsPerUnit":3,"unit":{unit}}}}}]}}"#
        );
        let answer = post(&bad);
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("unknown unit"),
            "{unit}: {answer}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// gRPC health answers what `/readyz` does, for the rate limit service's name and for the
/// server as a whole (`""`, what Envoy's `grpc_health_check` asks by default): not serving
/// with no domain loaded (every descriptor would be answered OK, unlimited), serving once
/// one is. Before, `""` was SERVING from the start, whatever the rules.
#[test]
fn grpc_health_for_the_whole_server_follows_the_rules_loaded() {
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
    let dir = temp_dir("health");
    let (http, grpc) = (free_addr(), free_addr());
    let mut child = Running(
        support::server(&dir, grpc, http)
            .args(["--watch-interval", "0s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rein-server"),
    );
    wait_for_port(grpc, "rein-server", None);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let status = |service: &str| {
        runtime.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
            let request = HealthCheckRequest {
                service: service.to_owned(),
            };
            let answer = client.check(request).await.expect("an answer");
            ServingStatus::try_from(answer.into_inner().status).expect("a known status")
        })
    };
    const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";
    assert_eq!(status(""), ServingStatus::NotServing);
    assert_eq!(status(RLS), ServingStatus::NotServing);
    std::fs::write(dir.join("ops.yaml"), RULES).expect("write");
    signal(child.id(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while status("") != ServingStatus::Serving {
        assert!(Instant::now() < deadline, "not serving after the reload");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status(RLS), ServingStatus::Serving);
    // The clients' connections close with their runtime: a graceful stop waits for them.
    drop(runtime);
    signal(child.id(), "TERM");
    assert!(exit_status(&mut child, Duration::from_secs(10)).success());
    let _ = std::fs::remove_dir_all(&dir);
}
