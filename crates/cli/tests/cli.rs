//! The `rein` binary as an operator runs it: against config files, a private
//! `redis-server` and a private Cluster, with bad input and with Redis down. Each case
//! checks the exit code, and the text or the `--json` document.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use rein_core::{Limit, Limiter, Micros, NamedPolicy, Policy};
use rein_redis::{RedisPolicy, RedisStore, RedisStoreBuilder};
use rein_redis_harness::{RedisCluster, RedisServer};
use serde_json::Value;

const PREFIX: &str = "clitest";

fn rein(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rein"))
        .args(args)
        .env_remove("REIN_CONFIG")
        .env_remove("REIN_REDIS_URL")
        .env_remove("REIN_REDIS_CLUSTER")
        .output()
        .expect("run rein")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("an exit code, not a signal")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// That `text` (an output's stdout or stderr) contains `what`, showing it whole if not.
fn assert_says(text: String, what: &str) {
    assert!(text.contains(what), "{what:?} not in:\n{text}");
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: not one JSON document: {}", stdout(output)))
}

/// A config file in a fresh temporary place: `[redis]` (`redis`, a TOML line or table body)
/// and two policies.
fn config(name: &str, redis: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("rein.toml");
    let text = format!(
        r#"
[redis]
{redis}
key_prefix = "{PREFIX}"

[policies.api]
limits = [
  {{ algorithm = "token_bucket", capacity = 5, refill = 1, period = "1h" }},
  {{ algorithm = "fixed_window", limit = 100, window = "1d" }},
]

[policies.login]
shadow = true
limits = [{{ algorithm = "sliding_log", limit = 3, window = "1m" }}]

[policies.window]
limits = [{{ algorithm = "fixed_window", limit = 4, window = "1h" }}]

[policies.rate]
limits = [{{ algorithm = "token_bucket", capacity = 10, refill = 10, period = "1s" }}]
"#
    );
    std::fs::write(&path, text).expect("write config");
    path
}

/// A lone fixed window, which Redis keeps as one integer (its own key format).
fn window() -> RedisPolicy {
    let limit = Limit::fixed_window(4, Micros::from_secs(3_600)).expect("valid");
    RedisPolicy::prepare(&NamedPolicy::new("window", Policy::single(limit)).expect("valid"))
}

fn api() -> RedisPolicy {
    let limits = [
        Limit::token_bucket(5, 1, Micros::from_secs(3_600)).expect("valid"),
        Limit::fixed_window(100, Micros::from_secs(86_400)).expect("valid"),
    ];
    let named = NamedPolicy::new("api", Policy::new(limits).expect("valid")).expect("valid");
    RedisPolicy::prepare(&named)
}

#[test]
fn config_check_names_each_files_errors_and_exits_1_if_any() {
    let good = config("check", "url = \"redis://127.0.0.1:1/\"");
    let bad = good.with_file_name("bad.toml");
    std::fs::write(
        &bad,
        "[redis]\nurl = \"redis://127.0.0.1:1/\"\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 0, window = \"1s\" }]\n",
    )
    .expect("write");
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../server/examples/config");
    let ok = rein(&["config", "check", good.to_str().expect("utf-8"), rules]);
    assert_eq!(code(&ok), 0, "{}{}", stdout(&ok), stderr(&ok));
    assert_says(stdout(&ok), "ok (rein-tower config: 4 policies");
    assert_says(stdout(&ok), "ok (rein-server rules:");
    let leased = good.with_file_name("leased.toml");
    std::fs::write(
        &leased,
        "[redis]\nurl = \"redis://127.0.0.1:1/\"\n[leases]\nexpected_nodes = 2\n[policies.api]\nlimits = [{ algorithm = \"fixed_window\", limit = 5, window = \"1s\" }]\n",
    )
    .expect("write");
    let ok = rein(&["config", "check", leased.to_str().expect("utf-8")]);
    assert_says(
        stdout(&ok),
        "ok (rein-tower config: 1 policies, 0 routes, leases for 2 servers)",
    );

    let mixed = rein(&[
        "config",
        "check",
        good.to_str().expect("utf-8"),
        bad.to_str().expect("utf-8"),
    ]);
    assert_eq!(code(&mixed), 1);
    assert!(
        stdout(&mixed)
            .contains("bad.toml: line 4: policies.api.limits[0]: limit must be at least 1"),
        "{}",
        stdout(&mixed)
    );
    assert_says(stderr(&mixed), "1 of 2 config files are invalid");

    let document = json(&rein(&[
        "--json",
        "config",
        "check",
        bad.to_str().expect("utf-8"),
    ]));
    assert_eq!(document["files"][0]["ok"], false);
    assert!(
        document["files"][0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("bad.toml: line 4:"))
    );
    assert!(document["error"].is_string());
}

#[test]
fn bad_input_is_a_clear_message_and_a_non_zero_exit_never_a_panic() {
    let path = config("input", "url = \"redis://127.0.0.1:1/\"");
    let path = path.to_str().expect("utf-8");
    // No config at all: exit 1 with the fix.
    let none = rein(&["key", "inspect", "api", "k"]);
    assert_eq!(code(&none), 1);
    assert_says(stderr(&none), "pass --config");
    // An unknown policy names the known ones; an empty key is refused; both before Redis.
    let unknown = rein(&["--config", path, "key", "reset", "apj", "k"]);
    assert_eq!(code(&unknown), 1);
    assert_says(stderr(&unknown), "its policies: api, login");
    let empty = rein(&["--config", path, "key", "inspect", "api", ""]);
    assert_eq!(code(&empty), 1);
    assert_says(stderr(&empty), "the key is empty");
    let long_key = "k".repeat(1_025);
    let long = rein(&["--config", path, "key", "inspect", "api", &long_key]);
    assert_eq!(code(&long), 1, "bad input, not Redis: {}", stderr(&long));
    assert_says(stderr(&long), "over the limit of 1024");
    // A wrong command line: clap's usage error, exit 2.
    assert_eq!(code(&rein(&["key", "inspect", "api"])), 2);
    assert_eq!(code(&rein(&["nonsense"])), 2);
    // An address spelt otherwise than the HTTP layer keys it: said (the key is still the
    // operator's to name; here Redis is down, which comes after).
    for spelt in ["::ffff:203.0.113.7", "2001:DB8:0::1"] {
        let other = rein(&["--config", path, "key", "inspect", "api", spelt]);
        assert_says(stderr(&other), "the HTTP layer keys this client as");
    }
    let canonical = rein(&["--config", path, "key", "inspect", "api", "203.0.113.7"]);
    assert!(
        !stderr(&canonical).contains("keys this client"),
        "{}",
        stderr(&canonical)
    );
    for timeout in ["0s", "2m", "soon"] {
        let refused = rein(&["--timeout", timeout, "--config", path, "policy", "list"]);
        assert_eq!(code(&refused), 2, "{timeout}: {}", stderr(&refused));
    }
    // With --json, the usage error is the document's "error", still exit 2.
    let wrong = rein(&["--json", "key", "penalize", "api", "k", "many"]);
    assert_eq!(code(&wrong), 2);
    let document: Value = serde_json::from_str(&stdout(&wrong)).expect("JSON");
    assert!(
        document["error"]
            .as_str()
            .is_some_and(|e| e.contains("many")),
        "{document}"
    );
    for output in [none, unknown, empty] {
        assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    }
}

#[test]
fn redis_down_is_exit_3_with_where_it_looked() {
    // A loopback port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let path = config("down", &format!("url = \"redis://127.0.0.1:{port}/\""));
    // A key's inspection and a policy's watch: each names where it looked.
    for rest in [
        &["key", "inspect", "api", "k"][..],
        &["watch", "api", "--count", "1"],
    ] {
        let output = with_config(&path, &["--config"], rest);
        assert_eq!(code(&output), 3, "{rest:?}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!(
                "cannot connect to Redis (redis://127.0.0.1:{port}/)"
            )),
            "{rest:?}: {}",
            stderr(&output)
        );
    }
    let document = json(&rein(&[
        "--json",
        "--config",
        path.to_str().expect("utf-8"),
        "key",
        "reset",
        "api",
        "k",
    ]));
    assert!(
        document["error"]
            .as_str()
            .is_some_and(|e| e.contains("cannot connect"))
    );
    // A password in the URL never reaches the message (it may reach a log).
    let secret = format!("redis://:s3cret@127.0.0.1:{port}/");
    let output = with_config(
        &path,
        &["--config"],
        &["--redis-url", &secret, "key", "inspect", "api", "k"],
    );
    assert_eq!(code(&output), 3, "{}", stderr(&output));
    assert_says(
        stderr(&output),
        &format!("(redis://:***@127.0.0.1:{port}/)"),
    );
    assert!(!stderr(&output).contains("s3cret"), "{}", stderr(&output));
    // A URL that cannot name a Redis is the operator's input, not Redis down: exit 1, so a
    // script that retries on 3 does not retry it forever.
    let output = with_config(
        &path,
        &["--config"],
        &[
            "--redis-url",
            "http://127.0.0.1:1/",
            "key",
            "inspect",
            "api",
            "k",
        ],
    );
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    assert_says(stderr(&output), "invalid Redis URL");
}

#[test]
fn inspect_shows_what_redis_counted_and_reset_forgets_it_standalone() {
    let server = RedisServer::start().expect("start redis-server");
    let path = config("standalone", &format!("url = \"{}\"", server.url()));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = store_on(&server, RedisStoreBuilder::new()).await;
        take_three(&store).await;
        let window = store.acquire(None, &window(), b"user-42", 3).await;
        assert!(window.expect("decision").is_allowed());
    });
    inspect_then_reset(&path, &["--config"]);
    change_then_inspect(&path, &["--config"]);
    overrides(&path, &["--config"]);
    // An entry no server reads (written by hand): named, left out, and nothing else fails
    // (before, every inspect and list failed with exit 3, "Redis unavailable").
    server
        .command(&[
            "HSET",
            &format!("{PREFIX}:overrides"),
            "api:=broken",
            "fw:0:1",
        ])
        .expect("HSET");
    let listed = with_config(&path, &["--config"], &["--json", "override", "list"]);
    assert_eq!(code(&listed), 0, "{}", stderr(&listed));
    assert_says(stderr(&listed), "field \"api:=broken\"");
    let unreadable = json(&listed)["unreadable"].clone();
    assert_eq!(unreadable.as_array().map(Vec::len), Some(1), "{unreadable}");
    let inspect = with_config(&path, &["--config"], &["key", "inspect", "api", "k"]);
    assert_eq!(code(&inspect), 0, "{}", stderr(&inspect));
    assert_says(stderr(&inspect), "left out: field \"api:=broken\"");
    server
        .command(&["HDEL", &format!("{PREFIX}:overrides"), "api:=broken"])
        .expect("HDEL");
    // An override of a policy the config no longer has can still be removed (before, exit
    // 1, "no policy named"): it counts toward the servers' cap, and revives with the name.
    server
        .command(&[
            "HSET",
            &format!("{PREFIX}:overrides"),
            "gone:=k",
            "fw:3:3600000000",
        ])
        .expect("HSET");
    let removed = json_ok(
        &path,
        &["--config"],
        &["override", "rm", "gone", "--key", "k"],
    );
    assert_eq!(removed["removed"], true, "{removed}");
    // Overrides that cannot be read at all: a key change is refused, exit 3, rather than
    // made to the policy's own key when an override may name another.
    let hash = format!("{PREFIX}:overrides");
    server.command(&["RENAME", &hash, "kept"]).expect("RENAME");
    server.command(&["SET", &hash, "not a hash"]).expect("SET");
    let refused = with_config(
        &path,
        &["--config"],
        &["key", "penalize", "api", "u-3", "2"],
    );
    assert_eq!(code(&refused), 3, "{}", stderr(&refused));
    assert_says(stderr(&refused), "reading the overrides");
    server.command(&["DEL", &hash]).expect("DEL");
    server.command(&["RENAME", "kept", &hash]).expect("RENAME");
    // A user of the decisions' ACL alone may not read the overrides, which every change
    // reads first: exit 1, naming what to grant (before, exit 3, "Redis unavailable").
    // The docs' user, on this test's prefix.
    let keys = format!("~{PREFIX}:*");
    let acl: Vec<&str> = rein_redis_harness::LEAST_PRIVILEGE
        .iter()
        .map(|&word| {
            if word == "~rein:*" {
                keys.as_str()
            } else {
                word
            }
        })
        .collect();
    assert_eq!(server.command(&acl).expect("ACL SETUSER"), "+OK\r\n");
    let url = format!("url = \"redis://rein:pw@127.0.0.1:{}/\"", server.port());
    let limited = config("acl", &url);
    let refused = with_config(&limited, &["--config"], &["key", "reset", "api", "u-3"]);
    assert_eq!(code(&refused), 1, "{}", stderr(&refused));
    assert_says(stderr(&refused), "may not run a command this needs");
    assert_says(stderr(&refused), "+hget +hgetall");
    let untouched = with_config(
        &path,
        &["--config"],
        &["--json", "key", "inspect", "api", "u-3"],
    );
    assert_eq!(
        json(&untouched)["limits"][0]["remaining"],
        5,
        "{}",
        stdout(&untouched)
    );
    // With leases, an override reaches only what the leases do not answer: said.
    let leased = config("leased", &format!("url = \"{}\"", server.url()));
    let text = std::fs::read_to_string(&leased).expect("read config");
    std::fs::write(&leased, text + "\n[leases]\nexpected_nodes = 2\n").expect("write config");
    let set = with_config(
        &leased,
        &["--config"],
        &["override", "set", "api", "--key", "t", "--limit", "fw:1/1h"],
    );
    assert_eq!(code(&set), 0, "{}", stderr(&set));
    assert_says(stdout(&set), "note: the config leases its policies");
    watch(&server, &path);
    rate_shares(&server, &path);
    // Through a tunnel slower than the config's 50 ms deadline (a proxy holding each
    // command 80 ms): within --timeout's default 2 s, the change is made once and reported
    // (before, the servers' deadline applied: exit 3, for a change Redis then made); under
    // a --timeout shorter than the tunnel, exit 3.
    let tunnel = format!(
        "redis://{}/",
        rein_redis_harness::Proxy::start(server.addr(), Duration::from_millis(80)).addr()
    );
    let through = |timeout: &[&str]| {
        let mut args = vec!["--redis-url", tunnel.as_str()];
        args.extend_from_slice(timeout);
        args.extend(["--json", "key", "penalize", "api", "slow-1", "1"]);
        with_config(&path, &["--config"], &args)
    };
    let slow = through(&[]);
    assert_eq!(code(&slow), 0, "{}", stderr(&slow));
    assert_eq!(json(&slow)["remaining"], 4, "{}", stdout(&slow));
    assert_eq!(code(&through(&["--timeout", "20ms"])), 3);
    // The integer form of a lone fixed window reads and resets the same way.
    let path = path.to_str().expect("utf-8");
    let inspect = || {
        json(&rein(&[
            "--json", "-c", path, "key", "inspect", "window", "user-42",
        ]))
    };
    assert_eq!(inspect()["limits"][0]["remaining"], 1);
    let reset = json(&rein(&[
        "--json", "-c", path, "key", "reset", "window", "user-42",
    ]));
    assert_eq!(reset["reset"], true);
    assert_eq!(inspect()["limits"][0]["remaining"], 4);
}

#[test]
fn inspect_and_reset_work_on_a_cluster() {
    let cluster = RedisCluster::start().expect("start a private Redis Cluster");
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let path = config("cluster", &format!("cluster = [{}]", nodes.join(", ")));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = RedisStoreBuilder::new()
            .prefix(PREFIX)
            .connect_cluster(cluster.urls())
            .await
            .expect("connect");
        take_three(&store).await;
    });
    inspect_then_reset(&path, &["-c"]);
    change_then_inspect(&path, &["-c"]);
    overrides(&path, &["-c"]);
    // The Cluster from the command line, over a config that names a dead server.
    let dead = config("cluster-flag", "url = \"redis://127.0.0.1:1/\"");
    let nodes = cluster.urls().join(",");
    let flagged = json_ok(
        &dead,
        &["--redis-cluster", &nodes, "-c"],
        &["key", "inspect", "api", "user-42"],
    );
    assert_eq!(flagged["limits"][0]["remaining"], 5, "{flagged}");
    let both = with_config(
        &dead,
        &[
            "--redis-cluster",
            &nodes,
            "--redis-url",
            "redis://127.0.0.1:1/",
            "-c",
        ],
        &["key", "inspect", "api", "user-42"],
    );
    assert_eq!(code(&both), 2, "one or the other: {}", stderr(&both));
}

/// A store on `server` under the config's key prefix, as the servers the CLI watches.
async fn store_on(
    server: &RedisServer,
    builder: RedisStoreBuilder,
) -> RedisStore<redis::aio::ConnectionManager> {
    builder
        .prefix(PREFIX)
        .connect(&server.url())
        .await
        .expect("connect")
}

/// Takes 3 of `api`'s bucket and window for `user-42`, as a server deciding requests would.
async fn take_three<C>(store: &RedisStore<C>)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    for _ in 0..3 {
        let decision = store.acquire(None, &api(), b"user-42", 1).await;
        assert!(decision.expect("decision").is_allowed());
    }
}

/// 3 of the bucket's 5 and of the window's 100 were taken for `user-42`: inspect shows it,
/// reset forgets it, a second reset finds nothing.
fn inspect_then_reset(path: &std::path::Path, flag: &[&str]) {
    let path = path.to_str().expect("utf-8");
    let args = |rest: &[&'static str]| -> Vec<&str> {
        let mut args = flag.to_vec();
        args.push(path);
        args.extend_from_slice(rest);
        args
    };
    let text = rein(&args(&["key", "inspect", "api", "user-42"]));
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    let shown = stdout(&text);
    assert!(
        shown.contains("limit 0: token bucket of 5, one token every 1h: 2 of 5 left"),
        "{shown}"
    );
    assert!(
        shown.contains("limit 1: fixed window, 100 per 1day: 97 of 100 left"),
        "{shown}"
    );

    let document = json(&rein(&args(&[
        "--json", "key", "inspect", "api", "user-42",
    ])));
    assert_eq!(document["limits"][0]["remaining"], 2);
    assert_eq!(document["limits"][1]["remaining"], 97);
    assert_eq!(document["full"], false);
    assert_eq!(document["redis_keys"].as_array().map(Vec::len), Some(1));
    // The bucket refills one token an hour: 3 tokens are 3 hours away, less what passed.
    let reset = document["limits"][0]["reset_after_us"]
        .as_u64()
        .expect("a number");
    assert!(
        (3 * 3_600_000_000 - 60_000_000..=3 * 3_600_000_000).contains(&reset),
        "{reset}"
    );

    let reset = json(&rein(&args(&["--json", "key", "reset", "api", "user-42"])));
    assert_eq!(reset["reset"], true);
    let after = json(&rein(&args(&[
        "--json", "key", "inspect", "api", "user-42",
    ])));
    assert_eq!(after["full"], true);
    assert_eq!(after["limits"][0]["remaining"], 5);
    assert_eq!(after["limits"][1]["remaining"], 100);
    let again = rein(&args(&["key", "reset", "api", "user-42"]));
    assert_eq!(code(&again), 0);
    assert_says(stdout(&again), "nothing was counted");
    // Another key was never touched.
    let other = json(&rein(&args(&["--json", "key", "inspect", "api", "user-7"])));
    assert_eq!(other["full"], true);
}

/// An operator's changes to `user-9` of `api` (a bucket of 5 and a window of 100): each
/// prints what the key has left, a block shows in `inspect` with its reason, and bad input
/// is exit 1 (or clap's 2) with nothing changed.
fn change_then_inspect(path: &std::path::Path, flag: &[&str]) {
    let run = |rest: &[&str]| with_config(path, flag, rest);
    let remaining = |rest: &[&str]| json_ok(path, flag, rest);
    let penalized = run(&["key", "penalize", "api", "user-9", "2"]);
    assert_eq!(code(&penalized), 0, "{}", stderr(&penalized));
    assert!(
        stdout(&penalized).contains("penalized by 2; 3 of 5 left (limit 0)"),
        "{}",
        stdout(&penalized)
    );
    assert_eq!(
        remaining(&["key", "reward", "api", "user-9", "1"])["remaining"],
        4
    );
    assert_eq!(
        remaining(&["key", "set", "api", "user-9", "1"])["remaining"],
        1
    );
    let inspect = remaining(&["key", "inspect", "api", "user-9"]);
    assert_eq!(inspect["limits"][0]["remaining"], 1);
    assert_eq!(inspect["limits"][1]["remaining"], 1);

    let blocked = run(&[
        "key", "block", "api", "user-9", "--for", "10m", "--reason", "ticket 9",
    ]);
    assert_eq!(code(&blocked), 0, "{}", stderr(&blocked));
    let shown = stdout(&run(&["key", "inspect", "api", "user-9"]));
    assert!(
        shown.contains("blocked until") && shown.contains(": ticket 9"),
        "{shown}"
    );
    let document = remaining(&["key", "inspect", "api", "user-9"]);
    assert_eq!(document["blocked"]["reason"], "ticket 9");
    let left = document["blocked"]["for_us"].as_u64().expect("a number");
    assert!((590_000_000..=600_000_000).contains(&left), "{left}");
    // A penalty or a reward of a blocked key changes nothing the block does not hide, and
    // the key starts afresh when it ends: refused, exit 1 (before, "penalized by 1" and
    // "rewarded 1", exit 0), and the block is left as it was.
    for change in ["penalize", "reward"] {
        let refused = run(&["key", change, "api", "user-9", "1"]);
        assert_eq!(code(&refused), 1, "{change}: {}", stderr(&refused));
        assert_says(stderr(&refused), "the key is blocked");
    }
    let still = remaining(&["key", "inspect", "api", "user-9"]);
    assert_eq!(still["blocked"]["reason"], "ticket 9");

    // Bad input: exit 1 for a reason too long, 2 for what clap refuses; nothing changes.
    let long = "x".repeat(201);
    let refused = run(&[
        "key", "block", "api", "user-9", "--for", "1m", "--reason", &long,
    ]);
    assert_eq!(code(&refused), 1, "{}", stderr(&refused));
    assert_says(stderr(&refused), "at most 200");
    for bad in [
        &["key", "block", "api", "user-9", "--for", "soon"][..],
        // A block of no time would block nothing (before, exit 0).
        &["key", "block", "api", "user-9", "--for", "0s"],
        &["key", "block", "api", "user-9"],
        &["key", "set", "api", "user-9", "-1"],
        &["key", "penalize", "api", "user-9", "many"],
    ] {
        let output = run(bad);
        assert_eq!(code(&output), 2, "{bad:?}: {}", stderr(&output));
    }
    assert_eq!(
        remaining(&["key", "inspect", "api", "user-9"])["blocked"]["reason"],
        "ticket 9"
    );

    let lifted = run(&["key", "unblock", "api", "user-9"]);
    assert_says(stdout(&lifted), "unblocked");
    let again = run(&["key", "unblock", "api", "user-9"]);
    assert_says(stdout(&again), "was not blocked");
    assert_eq!(
        remaining(&["key", "inspect", "api", "user-9"])["full"],
        true
    );
}

/// Overrides set, read, listed and removed; each applies to the decisions `rein key` shows,
/// and bad input is exit 1 (or clap's 2).
fn overrides(path: &std::path::Path, flag: &[&str]) {
    let run = |rest: &[&str]| with_config(path, flag, rest);
    let ok = |rest: &[&str]| json_ok(path, flag, rest);
    let set = run(&[
        "override", "set", "api", "--key", "tenant-7", "--limit", "fw:3/1h",
    ]);
    assert_eq!(code(&set), 0, "{}", stderr(&set));
    assert_says(stdout(&set), "fixed window, 3 per 1h (new)");
    let set = ok(&[
        "override",
        "set",
        "api",
        "--prefix",
        "internal:",
        "--unlimited",
    ]);
    assert_eq!(set["replaced"], false);
    let set = ok(&[
        "override",
        "set",
        "api",
        "--key",
        "tenant-7",
        "--limit",
        "tb:20:10/1s",
        "--limit",
        "fw:300/1h",
    ]);
    assert_eq!(set["replaced"], true);
    // The stored form keeps the rate in lowest terms: one token every 100 ms.
    assert_eq!(set["value"], "tb:20:1:100000;fw:300:3600000000");

    let got = ok(&["override", "get", "api", "internal:svc"]);
    assert_eq!(got["unlimited"], true);
    assert_eq!(got["prefix"], "internal:");
    // A block of an unlimited key would never be seen: refused (exit 1), nothing written.
    let block = run(&["key", "block", "api", "internal:svc", "--for", "10m"]);
    assert_eq!(code(&block), 1, "{}", stderr(&block));
    assert_says(stderr(&block), "makes it unlimited");
    // Nor is there anything to reward (before, "rewarded 1", exit 0).
    let reward = run(&["key", "reward", "api", "internal:svc", "1"]);
    assert_eq!(code(&reward), 1, "{}", stderr(&reward));
    assert_says(stderr(&reward), "nothing to reward");
    // A penalty changes the policy's own count, read once the override goes: said.
    let penalty = run(&["key", "penalize", "api", "internal:svc", "1"]);
    assert_eq!(code(&penalty), 0, "{}", stderr(&penalty));
    assert_says(stderr(&penalty), "makes it unlimited");
    let got = ok(&["override", "get", "api", "tenant-7"]);
    assert_eq!(got["limits"][1]["capacity"], 300);
    assert_eq!(
        ok(&["override", "get", "api", "guest"])["value"],
        Value::Null
    );
    let listed = ok(&["override", "list"]);
    assert_eq!(listed["overrides"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        ok(&["override", "list", "window"])["overrides"],
        serde_json::json!([])
    );
    // The CLI's own store applies the override to what it changes: a set of 250 is 250 of
    // the override's 300 in its window.
    let after = ok(&["key", "set", "api", "tenant-7", "250"]);
    assert_eq!(after["remaining"], 20, "the bucket of 20 names the fewest");
    // Inspect shows the override and reads the key by its limits.
    let seen = ok(&["key", "inspect", "api", "tenant-7"]);
    assert_eq!(seen["override"]["key"], "tenant-7", "{seen}");
    assert_eq!(
        (
            &seen["limits"][0]["remaining"],
            &seen["limits"][1]["remaining"]
        ),
        (&Value::from(20), &Value::from(250)),
        "{seen}"
    );
    let text = run(&["key", "inspect", "api", "tenant-7"]);
    assert_says(stdout(&text), "override: ");
    // Limits of another algorithm count in another key: a penalty, inspect and reset all
    // reach it.
    ok(&[
        "override", "set", "api", "--key", "tenant-8", "--limit", "sl:5/1m",
    ]);
    assert_eq!(
        ok(&["key", "penalize", "api", "tenant-8", "2"])["remaining"],
        3
    );
    assert_eq!(
        ok(&["key", "inspect", "api", "tenant-8"])["limits"][0]["remaining"],
        3
    );
    assert_eq!(ok(&["key", "reset", "api", "tenant-8"])["reset"], true);
    assert_eq!(
        ok(&["key", "inspect", "api", "tenant-8"])["limits"][0]["remaining"],
        5
    );
    ok(&["override", "rm", "api", "--key", "tenant-8"]);

    // A block made under an override of another shape is seen where the key's decisions
    // read: a reward of it is refused (before, the check read the policy's own key, and the
    // reward reported done, giving nothing back).
    ok(&[
        "override", "set", "api", "--key", "tenant-9", "--limit", "sl:5/1m",
    ]);
    ok(&["key", "block", "api", "tenant-9", "--for", "10m"]);
    let reward = run(&["key", "reward", "api", "tenant-9", "1"]);
    assert_eq!(code(&reward), 1, "{}", stderr(&reward));
    assert_says(stderr(&reward), "the key is blocked");
    // It is in the policy's own key too, where leases decide and the key's decisions go
    // back once the override goes (before, the override's removal unblocked the key, and
    // leases never saw the block).
    ok(&["override", "rm", "api", "--key", "tenant-9"]);
    let seen = ok(&["key", "inspect", "api", "tenant-9"]);
    assert!(seen["blocked"].is_object(), "{seen}");
    assert_eq!(
        ok(&["key", "unblock", "api", "tenant-9"])["unblocked"],
        true
    );
    // A set replaces a block in both keys (before, the policy's own key stayed blocked:
    // leases were denied, and so was the key once the override went).
    ok(&[
        "override", "set", "api", "--key", "tenant-9", "--limit", "fw:7/1h",
    ]);
    ok(&["key", "block", "api", "tenant-9", "--for", "10m"]);
    ok(&["key", "set", "api", "tenant-9", "3"]);
    ok(&["override", "rm", "api", "--key", "tenant-9"]);
    let seen = ok(&["key", "inspect", "api", "tenant-9"]);
    assert_eq!(seen["blocked"], Value::Null, "{seen}");
    // A block made before such an override stays in the policy's own key, where decisions
    // go back once the override goes: an unblock under the override lifts it too (before,
    // "was not blocked", and the key was denied again once the override was removed).
    ok(&["override", "rm", "api", "--key", "tenant-9"]);
    ok(&["key", "block", "api", "tenant-9", "--for", "10m"]);
    ok(&[
        "override", "set", "api", "--key", "tenant-9", "--limit", "sl:5/1m",
    ]);
    assert_eq!(
        ok(&["key", "unblock", "api", "tenant-9"])["unblocked"],
        true
    );
    ok(&["override", "rm", "api", "--key", "tenant-9"]);
    let seen = ok(&["key", "inspect", "api", "tenant-9"]);
    assert_eq!(seen["blocked"], Value::Null, "{seen}");

    // Bad input.
    for (bad, exit) in [
        (
            &["override", "set", "api", "--key", "k", "--limit", "fw:0/1h"][..],
            2,
        ),
        (
            &["override", "set", "api", "--key", "k", "--limit", "fw:3"],
            2,
        ),
        (&["override", "set", "api", "--key", "k"], 2),
        (&["override", "set", "api", "--limit", "fw:3/1h"], 2),
        (
            &[
                "override",
                "set",
                "api",
                "--key",
                "k",
                "--prefix",
                "p",
                "--unlimited",
            ],
            2,
        ),
        (&["override", "set", "nope", "--key", "k", "--unlimited"], 1),
        (&["override", "set", "api", "--key", "", "--unlimited"], 1),
    ] {
        let output = run(bad);
        assert_eq!(code(&output), exit, "{bad:?}: {}", stderr(&output));
        assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    }

    let removed = ok(&["override", "rm", "api", "--key", "tenant-7"]);
    assert_eq!(removed["removed"], true);
    let again = run(&["override", "rm", "api", "--key", "tenant-7"]);
    assert_says(stdout(&again), "had no override");
    ok(&["override", "rm", "api", "--prefix", "internal:"]);
    assert_eq!(
        ok(&["override", "list"])["overrides"],
        serde_json::json!([])
    );
}

/// A server reporting its counts decides `window` (4 an hour) 7 times for a new key:
/// `watch` shows 4 admitted and 3 denied in its window, as JSON lines and as text.
fn watch(server: &RedisServer, path: &std::path::Path) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = store_on(server, RedisStoreBuilder::new().report_counts(true)).await;
        for _ in 0..7 {
            store
                .acquire(None, &window(), b"watched", 1)
                .await
                .expect("decision");
        }
        // Reported within a second, complete two seconds after the second began.
        tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    });
    let output = with_config(
        path,
        &["-c"],
        &[
            "--json", "watch", "window", "--window", "30s", "--count", "2",
        ],
    );
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let lines: Vec<Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", stdout(&output));
    let last = &lines[1];
    assert_eq!(
        (&last["policy"], &last["window_s"]),
        (&Value::from("window"), &Value::from(30))
    );
    assert_eq!(
        (&last["window_admitted"], &last["window_denied"]),
        (&Value::from(4), &Value::from(3)),
        "{last}"
    );
    let text = with_config(path, &["-c"], &["watch", "window", "--count", "1"]);
    assert_eq!(code(&text), 0, "{}", stderr(&text));
    assert_says(stdout(&text), "window: ");
    assert_says(stdout(&text), "admitted/s");
    let longest = with_config(
        path,
        &["-c"],
        &["watch", "window", "--window", "117s", "--count", "1"],
    );
    assert_eq!(code(&longest), 0, "{}", stderr(&longest));
    assert_says(stdout(&longest), "last 1m 57s");
    // Redis frozen for a refresh (the server stopped, its connections open): the refresh
    // shows as a line with the error, and the watch goes on (before, it exited 3).
    let mut child = Command::new(env!("CARGO_BIN_EXE_rein"))
        .args([
            "-c",
            path.to_str().expect("utf-8"),
            "--json",
            "watch",
            "window",
        ])
        .args(["--count", "4"])
        .env_remove("REIN_REDIS_URL")
        .env_remove("REIN_REDIS_CLUSTER")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run rein");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut next = || -> Value {
        let line = lines.next().expect("a line").expect("utf-8");
        serde_json::from_str(&line).expect("one JSON object per line")
    };
    assert_eq!(next()["window_admitted"], 4);
    server.pause().expect("SIGSTOP");
    let frozen = next();
    server.resume().expect("SIGCONT");
    assert!(
        frozen["error"]
            .as_str()
            .is_some_and(|e| e.contains("no reply")),
        "{frozen}"
    );
    let rest: Vec<Value> = (0..2).map(|_| next()).collect();
    assert!(
        rest.iter().any(|line| line["window_admitted"] == 4),
        "{rest:?}"
    );
    let status = child.wait().expect("rein exits");
    assert_eq!(status.code(), Some(0));
    // Bad input: an unknown policy (exit 1), a window rein refuses (clap's exit 2).
    let unknown = with_config(path, &["-c"], &["watch", "apj", "--count", "1"]);
    assert_eq!(code(&unknown), 1);
    assert_says(stderr(&unknown), "its policies");
    // 118 s could reach a second whose counts Redis has already let expire.
    for window in ["0s", "118s", "2h", "1.5s", "soon"] {
        let bad = with_config(
            path,
            &["-c"],
            &["watch", "api", "--window", window, "--count", "1"],
        );
        assert_eq!(code(&bad), 2, "--window {window}: {}", stderr(&bad));
    }
}

/// Two servers take shares of `rate`'s token bucket for one key, one renewing, one whose
/// share lapsed: `inspect` shows both from Redis, the lapsed one as stranded.
fn rate_shares(server: &RedisServer, path: &std::path::Path) {
    use rein_core::Leasable;
    use rein_core::rate_share::{RateAnswer, RateOp, TakeRequest};

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = store_on(server, RedisStoreBuilder::new()).await;
        let bucket = Limit::token_bucket(10, 10, Micros::from_secs(1)).expect("valid");
        let named = NamedPolicy::new("rate", Policy::single(bucket)).expect("valid");
        let policy = RedisPolicy::prepare(&named);
        for (node, validity) in [(1, Micros::from_secs(60)), (2, Micros::from_millis(1))] {
            let take = RateOp::Take(TakeRequest {
                node,
                held: 0,
                seq: 1,
                applied: 0,
                demand: 5,
                validity,
            });
            let answer = store.share_rate(None, &policy, b"shared", take).await;
            assert!(
                matches!(answer, Ok(RateAnswer::Taken(_))),
                "node {node}: {answer:?}"
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    });
    let seen = json_ok(path, &["-c"], &["key", "inspect", "rate", "shared"]);
    let shares = &seen["rate_shares"];
    assert_eq!(shares["shares"].as_array().map(Vec::len), Some(2), "{seen}");
    assert_eq!(
        (
            &shares["shares"][0]["lapsed"],
            &shares["shares"][1]["lapsed"]
        ),
        (&Value::from(false), &Value::from(true)),
        "{seen}"
    );
    let lapsed = shares["shares"][1]["rate_parts"].as_u64().expect("parts");
    assert_eq!(shares["lapsed_parts"].as_u64(), Some(lapsed), "{seen}");
    let text = with_config(path, &["-c"], &["key", "inspect", "rate", "shared"]);
    assert_says(stdout(&text), "stranded");
    // Its state is the shares: a block, a penalty or a set cannot change it (exit 1, not
    // "Redis unavailable"); a reset can.
    for change in [
        &["key", "block", "rate", "shared", "--for", "1m"][..],
        &["key", "penalize", "rate", "shared", "2"],
        &["key", "reward", "rate", "shared", "2"],
    ] {
        let refused = with_config(path, &["-c"], change);
        assert_eq!(code(&refused), 1, "{change:?}: {}", stderr(&refused));
        assert_says(stderr(&refused), "leased as rate");
    }
    // It holds no block, so an unblock lifts nothing, and says so (before, exit 1 "not
    // changed: ... leased as rate").
    let unblock = json_ok(path, &["-c"], &["key", "unblock", "rate", "shared"]);
    assert_eq!(unblock["unblocked"], false, "{unblock}");
    // A key decided without leases reads as counts, as before.
    let plain = json_ok(path, &["-c"], &["key", "inspect", "rate", "plain"]);
    assert_eq!(plain["limits"][0]["remaining"], 10, "{plain}");
}

/// `rein FLAG PATH REST...`.
fn with_config(path: &std::path::Path, flag: &[&str], rest: &[&str]) -> Output {
    let mut args = flag.to_vec();
    args.push(path.to_str().expect("utf-8"));
    args.extend_from_slice(rest);
    rein(&args)
}

/// `rein FLAG PATH --json REST...`, which must succeed: its document.
fn json_ok(path: &std::path::Path, flag: &[&str], rest: &[&str]) -> Value {
    let mut args = vec!["--json"];
    args.extend_from_slice(rest);
    let output = with_config(path, flag, &args);
    assert_eq!(code(&output), 0, "{rest:?}: {}", stderr(&output));
    json(&output)
}
