//! rein-server's throughput, in two parts (a plain `main`, not criterion: each figure is a
//! sustained rate under concurrent load, measured for a few seconds).
//!
//! 1. **ShouldRateLimit over loopback gRPC**: the service and `CLIENTS` concurrent clients
//!    (tonic, Envoy's generated types) in this process, on the in-process store and on a
//!    private `redis-server`, each without and with leases. Decisions per second, latency
//!    p50/p99, this process's CPU per decision (client and server together) and, over
//!    Redis, the server's CPU and script calls per decision.
//! 2. **Through Envoy**: `wrk` against one Envoy (`--concurrency 1`) with three listeners
//!    to the same trivial upstream: without the `ratelimit` filter, with it calling
//!    rein-server, and with it calling a do-nothing service that answers OK at once (the
//!    ceiling: what the filter and gRPC cost by themselves). Alternating rounds (A B C A B
//!    C ...); the median ratios of requests per second and their spread. Every request is
//!    admitted (the limit is far above the load), so the figure is what asking costs.
//!
//! Everything shares the machine's cores: the figures are for that setting. Needs Envoy
//! (`bash scripts/test-deps`) and `wrk` (`apt-get install -y wrk`).
//!
//! `cargo bench -p rein-benches --bench server` (REIN_BENCH_SECS sets each run's length,
//! default 3).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService as Rls, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use rein::FailurePolicy;
use rein_core::Leasable;
use rein_memory::MemoryStore;
use rein_redis::RedisStoreBuilder;
use rein_redis_harness::RedisServer;
use rein_server::{RateLimitService, RulesConfig, ServiceSettings};

/// The allocator `rein-server`'s binary ships with (its `main.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Concurrent gRPC clients.
const CLIENTS: usize = 64;
/// gRPC connections they share (HTTP/2 multiplexes the rest).
const CHANNELS: usize = 4;
/// Distinct keys the clients spread over.
const KEYS: u64 = 10_000;

const RULES: &str = "
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1000000000 }
";

fn main() {
    let secs: u64 = rein_benches::env_number("REIN_BENCH_SECS", 3);
    let run = Duration::from_secs(secs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("# rein-server, {secs} s per run, {CLIENTS} clients on {CHANNELS} connections");
    println!();
    println!("## ShouldRateLimit over loopback gRPC");
    println!();
    println!(
        "| store | decisions/s | p50 µs | p99 µs | CPU µs/decision (this process) | redis-server CPU µs/decision | Redis calls/decision |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    runtime.block_on(async {
        for leases in [false, true] {
            let memory = service(MemoryStore::new(), leases);
            let (rate, p50, p99, cpu) = grpc_load(memory, run).await;
            let name = if leases {
                "in process, leases"
            } else {
                "in process"
            };
            println!("| {name} | {rate:.0} | {p50} | {p99} | {cpu:.1} | — | — |");
        }
        let redis = RedisServer::start().expect("start redis-server");
        for leases in [false, true] {
            let store = RedisStoreBuilder::new()
                .prefix(if leases {
                    "rein-bench-leased"
                } else {
                    "rein-bench-server"
                })
                .connect(&redis.url())
                .await
                .expect("connect to redis");
            let before = (redis_cpu(&redis), redis_calls(&redis));
            let (rate, p50, p99, cpu) = grpc_load(service(store, leases), run).await;
            let (cpu_after, calls_after) = (redis_cpu(&redis), redis_calls(&redis));
            let total = rate * run.as_secs_f64();
            let name = if leases { "Redis, leases" } else { "Redis" };
            println!(
                "| {name} | {rate:.0} | {p50} | {p99} | {cpu:.1} | {:.1} | {:.3} |",
                (cpu_after - before.0) * 1e6 / total,
                (calls_after - before.1) as f64 / total
            );
        }
        println!();
        println!("RSS after all: {} MiB", rss_mib());
    });
    println!();
    println!("## Through Envoy: requests/s with the ratelimit filter ÷ without");
    println!();
    envoy_rounds(&runtime, run);
}

/// The service over `store` on the bench's rules, with leases if `leases`. Its lease timers
/// (if any) run on the caller's runtime.
fn service<S: Leasable + Clone + 'static>(store: S, leases: bool) -> RateLimitService<S> {
    let mut rules = RulesConfig::default();
    rules
        .add(Path::new("bench.yaml"), RULES)
        .expect("valid rules");
    let settings = ServiceSettings {
        failure: FailurePolicy::FailOpen,
        shadow_mode: false,
        legacy_headers: false,
        leases: leases.then(rein::LeaseConfig::default),
    };
    RateLimitService::new(store, rules, settings).expect("service")
}

/// Serves `service` on loopback and drives it from `CLIENTS` tasks for `run`.
async fn grpc_load<S: Leasable + Clone + 'static>(
    service: RateLimitService<S>,
    run: Duration,
) -> (f64, u64, u64, f64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(rein_server::grpc::server(service))
            .serve_with_incoming(rein_server::grpc::incoming(listener)),
    );
    let mut channels = Vec::new();
    for _ in 0..CHANNELS {
        channels.push(
            RateLimitServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connect"),
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let mut channel = channels[client % CHANNELS].clone();
        let stop = Arc::clone(&stop);
        let done = Arc::clone(&done);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut key = client as u64;
            while !stop.load(Ordering::Relaxed) {
                key = (key * 6364136223846793005 + 1442695040888963407) % KEYS;
                let request = RateLimitRequest {
                    domain: "bench".into(),
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![rate_limit_descriptor::Entry {
                            key: "user".into(),
                            value: key.to_string(),
                        }],
                        ..Default::default()
                    }],
                    hits_addend: 0,
                };
                let sent = Instant::now();
                channel.should_rate_limit(request).await.expect("an answer");
                latencies.push(sent.elapsed().as_micros() as u64);
                done.fetch_add(1, Ordering::Relaxed);
            }
            latencies
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("client"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu() - cpu_before;
    server.abort();
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let count = done.load(Ordering::Relaxed) as f64;
    (count / elapsed, at(0.5), at(0.99), cpu * 1e6 / count)
}

/// This process's user + system CPU seconds.
fn process_cpu() -> f64 {
    // SAFETY: getrusage writes into the struct we pass and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// The script calls redis-server has run so far (`EVALSHA`, from `INFO commandstats`).
fn redis_calls(redis: &RedisServer) -> u64 {
    redis
        .commandstat_calls("evalsha")
        .expect("INFO commandstats")
}

/// redis-server's CPU seconds so far (`INFO cpu`).
fn redis_cpu(redis: &RedisServer) -> f64 {
    let info = redis.command(&["INFO", "cpu"]).expect("INFO cpu");
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|field| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

fn rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Envoy with and without the filter, in alternating rounds.
fn envoy_rounds(runtime: &tokio::runtime::Runtime, run: Duration) {
    let envoy_bin = std::env::var_os("REIN_ENVOY").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/envoy-venv/bin/envoy"),
        PathBuf::from,
    );
    assert!(
        envoy_bin.is_file(),
        "Envoy not found at {}: run `bash scripts/test-deps`",
        envoy_bin.display()
    );
    assert!(
        Command::new("wrk").arg("--version").output().is_ok(),
        "wrk not found: apt-get install -y wrk"
    );
    // The service and the upstream, in this process's runtime.
    let (grpc, null, upstream) = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let grpc = listener.local_addr().expect("addr");
        let rein = rein_server::grpc::server(service(MemoryStore::new(), false));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(rein)
                .serve_with_incoming(rein_server::grpc::incoming(listener)),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let null = listener.local_addr().expect("addr");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RateLimitServiceServer::new(Null))
                .serve_with_incoming(rein_server::grpc::incoming(listener)),
        );
        (grpc, null, start_upstream().await)
    });
    let dir = std::env::temp_dir().join(format!("rein-bench-envoy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (with, without, ceiling) = (free_port(), free_port(), free_port());
    let config = envoy_config(
        without,
        with,
        ceiling,
        upstream.port(),
        grpc.port(),
        null.port(),
    );
    std::fs::write(dir.join("envoy.yaml"), config).expect("write");
    let mut envoy = EnvoyProcess(
        Command::new(&envoy_bin)
            .args(["-c", &dir.join("envoy.yaml").display().to_string()])
            .args(["--concurrency", "1", "--log-level", "error"])
            .args(["--base-id", &with.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("envoy.log")).expect("log"))
            .spawn()
            .expect("start envoy"),
    );
    for port in [with, without, ceiling] {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "envoy did not listen:\n{}",
                std::fs::read_to_string(dir.join("envoy.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // Warm up all three.
    for port in [with, without, ceiling] {
        wrk(port, Duration::from_secs(1));
    }
    println!(
        "| round | without the filter, req/s | rein-server, req/s | do-nothing service, req/s | rein ÷ without | do-nothing ÷ without | rein ÷ do-nothing |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let (mut rein, mut nothing, mut relative) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=5 {
        let base = wrk(without, run);
        let limited = wrk(with, run);
        let null = wrk(ceiling, run);
        rein.push(limited / base);
        nothing.push(null / base);
        relative.push(limited / null);
        println!(
            "| {round} | {base:.0} | {limited:.0} | {null:.0} | {:.2} | {:.2} | {:.2} |",
            limited / base,
            null / base,
            limited / null
        );
    }
    println!();
    for (what, mut ratios) in [
        ("rein-server ÷ without the filter (goal ≥ 0.5)", rein),
        ("do-nothing service ÷ without the filter", nothing),
        ("rein-server ÷ do-nothing service", relative),
    ] {
        ratios.sort_by(f64::total_cmp);
        println!(
            "{what}: median {:.2} (spread {:.2}–{:.2})",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
    let _ = envoy.0.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

struct EnvoyProcess(Child);

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ceiling: a service that answers OK to every descriptor without looking at it.
struct Null;

#[tonic::async_trait]
impl Rls for Null {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            ..Default::default()
        };
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![ok; request.get_ref().descriptors.len()],
            ..Default::default()
        }))
    }
}

/// `wrk` for `run` against `port`: requests per second.
fn wrk(port: u16, run: Duration) -> f64 {
    let output = Command::new("wrk")
        .args(["-t1", "-c32", &format!("-d{}s", run.as_secs().max(1))])
        .args(["-H", "x-user: bench"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&output.stdout);
    let non_2xx = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .map(str::trim);
    assert!(
        non_2xx.is_none(),
        "refused or failed requests: {non_2xx:?}\n{text}"
    );
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no rate in wrk's output:\n{text}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A trivial upstream: `200 ok` to everything, HTTP/1.1 keep-alive.
async fn start_upstream() -> SocketAddr {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let service = service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Envoy's configuration: three listeners to one upstream, one without the ratelimit
/// filter, one whose filter asks rein-server (cluster `rein_rls`), one whose filter asks the
/// do-nothing service (cluster `nothing_rls`; not `null`, which YAML reads as nothing).
fn envoy_config(
    without: u16,
    with: u16,
    ceiling: u16,
    upstream: u16,
    rein: u16,
    null: u16,
) -> String {
    let mut yaml = String::from("static_resources:\n  listeners:\n");
    yaml.push_str(&listener("without", without, None));
    yaml.push_str(&listener("rein", with, Some("rein_rls")));
    yaml.push_str(&listener("nothing", ceiling, Some("nothing_rls")));
    yaml.push_str("  clusters:\n");
    yaml.push_str(&cluster("upstream", upstream, false));
    yaml.push_str(&cluster("rein_rls", rein, true));
    yaml.push_str(&cluster("nothing_rls", null, true));
    yaml
}

/// A listener routing everything to `upstream`, with the ratelimit filter asking
/// `rls` (a cluster) if given.
fn listener(name: &str, port: u16, rls: Option<&str>) -> String {
    let (rate_limits, filter) = match rls {
        None => (String::new(), String::new()),
        Some(cluster) => (
            "                  rate_limits:\n                  - actions:\n                    - request_headers: { header_name: x-user, descriptor_key: user }\n".to_owned(),
            format!(
                r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              timeout: 1s
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{ envoy_grpc: {{ cluster_name: {cluster} }} }}
"#
            ),
        ),
    };
    format!(
        r#"  - name: {name}
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {name}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream
{rate_limits}          http_filters:
{filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
"#
    )
}

/// A static cluster of one endpoint; `grpc` ones speak HTTP/2.
fn cluster(name: &str, port: u16, grpc: bool) -> String {
    let http2 = if grpc {
        r#"    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: { http2_protocol_options: {} }
"#
    } else {
        ""
    };
    format!(
        r#"  - name: {name}
    type: STATIC
    connect_timeout: 1s
{http2}    load_assignment:
      cluster_name: {name}
      endpoints:
      - lb_endpoints:
        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }}
"#
    )
}
