//! `rein-server`: Envoy's rate-limit service backed by rein. `rein-server --help` teaches
//! every setting; docs/server.md is the full guide.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand, ValueEnum};
use metrics_exporter_prometheus::PrometheusBuilder;
use rein::FailurePolicy;
use rein::lease::LeaseConfigError;
use rein_core::Leasable;
use rein_memory::MemoryStore;
use rein_redis::{Endpoint, RedisStoreBuilder};
use rein_server::{RateLimitService, RulesConfig, ServiceSettings};
use tokio::sync::watch;
use tonic_health::ServingStatus;

/// mimalloc rather than glibc's malloc: tonic and h2 allocate small buffers for every call,
/// and glibc's malloc was about a tenth of the CPU per decision (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Envoy's rate-limit service (RLS v3), backed by rein.
///
/// Reads envoyproxy/ratelimit's YAML rules (one domain per file) from --config, answers
/// Envoy's `ShouldRateLimit` over gRPC and the same as JSON on `POST /json`, and shares
/// every limit through Redis (--redis-url or --redis-cluster) or, without either, decides
/// in this process alone.
///
/// Start it on the shipped example rules, in memory:
///
///     cargo run -p rein-server -- --config crates/server/examples/config
///
/// then ask it:
///
///     curl -s localhost:8080/json -d '{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}'
#[derive(Debug, Parser)]
#[command(name = "rein-server", version, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: Serve,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate a directory (or file) of rules and exit: 0 when valid, 1 with
    /// `file:line:column: field: problem` when not.
    ///
    /// Example: rein-server check-config /etc/ratelimit/config
    CheckConfig {
        /// The directory of `*.yaml` files (or one file).
        dir: PathBuf,
    },
}

#[derive(Debug, Args)]
struct Serve {
    /// The rules: a directory of envoyproxy/ratelimit YAML files (`*.yaml`, `*.yml`), one
    /// domain each, or a single file. Reloaded when a file changes and on SIGHUP.
    #[arg(long, env = "REIN_RULES", value_name = "DIR")]
    config: Option<PathBuf>,

    /// Where Envoy's gRPC `ShouldRateLimit` (and `grpc.health.v1`) is served.
    #[arg(long, env = "REIN_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    grpc_addr: SocketAddr,

    /// Where `POST /json`, `/healthz`, `/readyz` and `/metrics` are served.
    #[arg(long, env = "REIN_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,

    /// One Redis server to share the limits through: `redis://host:6379/` (`rediss://`
    /// for TLS; credentials in the URL). Without this or --redis-cluster, limits are this
    /// process's alone.
    #[arg(long, env = "REIN_REDIS_URL", conflicts_with = "redis_cluster")]
    redis_url: Option<String>,

    /// A Redis Cluster, by the URLs of one or more nodes, comma-separated.
    #[arg(long, env = "REIN_REDIS_CLUSTER", value_delimiter = ',')]
    redis_cluster: Option<Vec<String>>,

    /// The longest one Redis decision may take before the failure policy answers (default:
    /// rein's, 50ms).
    #[arg(long, env = "REIN_REDIS_DEADLINE", value_parser = duration, value_name = "DURATION")]
    redis_deadline: Option<Duration>,

    /// The first part of every Redis key this server writes.
    #[arg(long, env = "REIN_KEY_PREFIX", default_value = "rein-server")]
    key_prefix: String,

    /// What to answer while Redis gives no decision: admit (fail-open), refuse
    /// (fail-closed), or decide in this process at 1/N of every limit (local-fallback,
    /// with --expected-nodes N).
    #[arg(long, env = "REIN_FAILURE", value_enum, default_value = "fail-open")]
    failure: Failure,

    /// With --failure local-fallback: how many servers share the limits.
    #[arg(
        long,
        env = "REIN_EXPECTED_NODES",
        required_if_eq("failure", "local-fallback")
    )]
    expected_nodes: Option<NonZeroU32>,

    /// Decide and count every request but answer OK to all (try new rules safely).
    #[arg(long, env = "REIN_SHADOW_MODE")]
    shadow_mode: bool,

    /// Decide hot keys from leases: blocks of units reserved in Redis and spent in this
    /// process, still exact (no over-admission while Redis answers; docs/leases.md), far
    /// fewer Redis calls for busy keys. Units a lease holds are given back on reload and
    /// on shutdown.
    #[arg(long, env = "REIN_LEASES")]
    leases: bool,

    /// With --leases: how many servers share the limits (each lease asks for about its
    /// share of a limit).
    #[arg(
        long,
        env = "REIN_LEASE_NODES",
        default_value_t = rein::LeaseConfig::default().expected_nodes,
        requires = "leases"
    )]
    lease_nodes: NonZeroU32,

    /// Also send the legacy X-RateLimit-Limit / -Remaining / -Reset headers.
    #[arg(long, env = "REIN_LEGACY_HEADERS")]
    legacy_headers: bool,

    /// How often to look for changed rule files; 0s turns watching off (SIGHUP still
    /// reloads).
    #[arg(long, env = "REIN_WATCH_INTERVAL", default_value = "1s", value_parser = duration)]
    watch_interval: Duration,

    /// TLS on both listeners: the certificate chain (PEM). With --tls-key.
    #[arg(long, env = "REIN_TLS_CERT", requires = "tls_key", value_name = "PEM")]
    tls_cert: Option<PathBuf>,

    /// TLS: the certificate's private key (PEM).
    #[arg(long, env = "REIN_TLS_KEY", requires = "tls_cert", value_name = "PEM")]
    tls_key: Option<PathBuf>,

    /// Mutual TLS: accept only clients presenting a certificate signed by this CA (PEM).
    #[arg(
        long,
        env = "REIN_TLS_CLIENT_CA",
        requires = "tls_cert",
        value_name = "PEM"
    )]
    tls_client_ca: Option<PathBuf>,

    /// Log lines as `text` or `json`; the level comes from RUST_LOG (default `info`).
    #[arg(long, env = "REIN_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Failure {
    FailOpen,
    FailClosed,
    LocalFallback,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

impl Serve {
    fn tls(&self) -> Option<rein_server::tls::TlsFiles> {
        Some(rein_server::tls::TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (e.g. \"50ms\", \"1s\")"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::CheckConfig { dir }) = &cli.command {
        return check_config(dir);
    }
    init_logging(cli.serve.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("rein-server: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(cli.serve)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            eprintln!("rein-server: {message}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(dir: &Path) -> ExitCode {
    match RulesConfig::load(dir) {
        Ok(rules) => {
            for warning in rules.warnings() {
                eprintln!("warning: {warning}");
            }
            let domains: Vec<&str> = rules.domain_names().collect();
            println!(
                "{}: valid: {} domain(s) ({}), {} rule(s)",
                dir.display(),
                domains.len(),
                domains.join(", "),
                rules.rule_count()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Logs what the rules say that does not do what it seems to.
fn log_warnings(rules: &RulesConfig) {
    for warning in rules.warnings() {
        tracing::warn!(
            file = %warning.file.display(),
            line = warning.line,
            field = %warning.field,
            "{}",
            warning.problem
        );
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Logs go to stderr: stdout stays free for what a command prints.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn serve(args: Serve) -> Result<(), String> {
    let Some(config) = args.config.clone() else {
        return Err(
            "no rules: pass --config DIR (a directory of envoyproxy/ratelimit YAML \
                    files), or set REIN_RULES; `rein-server --help` shows every setting"
                .into(),
        );
    };
    let rules = RulesConfig::load(&config).map_err(|e| format!("cannot load the rules: {e}"))?;
    log_warnings(&rules);
    let failure = match args.failure {
        Failure::FailOpen => FailurePolicy::FailOpen,
        Failure::FailClosed => FailurePolicy::FailClosed,
        Failure::LocalFallback => FailurePolicy::LocalFallback {
            expected_nodes: args.expected_nodes.unwrap_or(NonZeroU32::MIN),
        },
    };
    let settings = ServiceSettings {
        failure,
        shadow_mode: args.shadow_mode,
        legacy_headers: args.legacy_headers,
        leases: args.leases.then(|| rein::LeaseConfig {
            expected_nodes: args.lease_nodes,
            ..rein::LeaseConfig::default()
        }),
    };
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    // The recorder keeps every histogram sample until upkeep drains it, which a scrape does
    // too: without this, a server nobody scrapes grows by each decision's latency sample
    // (about 8 bytes a decision, on every store).
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(METRICS_UPKEEP);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let builder = || {
        let builder = RedisStoreBuilder::new().prefix(args.key_prefix.clone());
        match args.redis_deadline {
            Some(deadline) => builder.deadline(deadline),
            None => builder,
        }
    };
    let endpoint = match (&args.redis_url, &args.redis_cluster) {
        (Some(url), _) => Some(Endpoint::Url(url.clone())),
        (None, Some(nodes)) => Some(Endpoint::Cluster(nodes.clone())),
        (None, None) => None,
    };
    // Only Redis calls run under --redis-deadline: the in-process store states none.
    if args.redis_deadline.is_some() && endpoint.is_none() {
        tracing::warn!(
            "--redis-deadline (REIN_REDIS_DEADLINE) is set but no Redis is: it bounds nothing \
             on the in-process store"
        );
    }
    if let (Some(leases), Some(deadline), Some(_)) =
        (&settings.leases, args.redis_deadline, &endpoint)
    {
        lease_flags(leases, deadline)?;
    }
    let redis = match endpoint {
        Some(endpoint) => {
            let store = builder()
                .connect_to(&endpoint)
                .await
                .map_err(|e| format!("cannot connect to Redis at {endpoint}: {e}"))?;
            tracing::info!(redis = %endpoint, "sharing limits through Redis");
            Some(store)
        }
        None => None,
    };
    let start = Start {
        rules,
        settings,
        config,
        metrics,
    };
    match redis {
        Some(store) => run(store, start, &args).await,
        None => {
            tracing::warn!(
                "no Redis configured: every limit is this process's alone (pass --redis-url \
                 to share them between servers)"
            );
            run(MemoryStore::new(), start, &args).await
        }
    }
}

/// `--leases` over a store of deadline `--redis-deadline`: what the limiter's build would
/// refuse ([`rein::LeaseConfig::check_over_store`]), refused before anything connects, in the flags'
/// words.
fn lease_flags(leases: &rein::LeaseConfig, deadline: Duration) -> Result<(), String> {
    leases
        .check_over_store(Some(deadline))
        .map_err(|e| match e {
            // The flight timeout is not a flag: the deadline is what to change.
            LeaseConfigError::FlightTimeout {
                flight_timeout,
                deadline: limiter,
            } => format!(
                "--redis-deadline {} with --leases: with the limiter's margin ({limiter:?}) it \
             is longer than the leases' flight timeout ({flight_timeout:?}), so a grant that \
             comes back later would be stranded; shorten --redis-deadline",
                humantime::format_duration(deadline)
            ),
            other => other.to_string(),
        })
}

/// What serving starts from, whatever the store.
struct Start {
    rules: RulesConfig,
    settings: ServiceSettings,
    config: PathBuf,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// Serves until SIGTERM over `store`.
async fn run<S: Leasable + Clone + 'static>(
    store: S,
    start: Start,
    args: &Serve,
) -> Result<(), String> {
    let Start {
        rules,
        settings,
        config,
        metrics,
    } = start;
    let domains = rules.domain_names().map(str::to_owned).collect::<Vec<_>>();
    let service = RateLimitService::new(store, rules, settings)
        .map_err(|e| format!("cannot build the limiter: {e}"))?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Before listening: a SIGHUP that arrives once clients can connect must find its
    // handler (the default action would end the process).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot handle SIGTERM: {e}"))?;

    let grpc = tokio::net::TcpListener::bind(args.grpc_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (gRPC): {e}", args.grpc_addr))?;
    let http = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (HTTP): {e}", args.http_addr))?;
    let grpc_addr = grpc.local_addr().map_err(|e| e.to_string())?;
    let http_addr = http.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        domains = ?domains,
        "rein-server serving"
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    report_health::<S>(&health, service.domains().len()).await;
    let mut grpc_builder = tonic::transport::Server::builder();
    let mut https = None;
    if let Some(files) = &args.tls() {
        let pem = files.pem().map_err(|e| format!("TLS: {e}"))?;
        let mut config = tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(pem.cert, pem.key));
        if let Some(ca) = pem.client_ca {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        grpc_builder = grpc_builder
            .tls_config(config)
            .map_err(|e| format!("TLS for gRPC: {e}"))?;
        https = Some(tokio_rustls::TlsAcceptor::from(
            files.rustls().map_err(|e| format!("TLS: {e}"))?,
        ));
    }
    let mut grpc_shutdown = shutdown_rx.clone();
    let grpc_server = grpc_builder
        .add_service(health_service)
        .add_service(rein_server::grpc::server(service.clone()))
        .serve_with_incoming_shutdown(rein_server::grpc::incoming(grpc), async move {
            let _ = grpc_shutdown.wait_for(|stop| *stop).await;
        });
    let router = rein_server::http::router(service.clone(), Some(metrics));
    let http_shutdown = shutdown_rx.clone();
    let http_server = rein_server::http::serve(
        http,
        https,
        router,
        http_shutdown,
        rein_server::http::HEADER_TIMEOUT,
    );
    let reloader = tokio::spawn(watch_rules(
        service.clone(),
        health,
        config,
        args.watch_interval,
        hangup,
        shutdown_rx.clone(),
    ));
    let signals = tokio::spawn(async move {
        wait_for_stop(terminate).await;
        tracing::info!("stopping: answering the requests in flight, then exiting");
        let _ = shutdown_tx.send(true);
    });
    let (grpc_result, http_result) = tokio::join!(grpc_server, http_server);
    signals.abort();
    reloader.abort();
    // Leases give back what they hold before the process goes.
    service.shutdown().await;
    grpc_result.map_err(|e| format!("gRPC server: {e}"))?;
    http_result.map_err(|e| format!("HTTP server: {e}"))?;
    tracing::info!("stopped");
    Ok(())
}

/// How often the metrics recorder's upkeep runs (the exporter's own default interval).
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// gRPC health says what `/readyz` says: serving while a domain is loaded. Without one,
/// every descriptor would be answered OK, unlimited: not a service to route to. Both the
/// rate limit service's name and the server as a whole (`""`, what Envoy's
/// `grpc_health_check` asks by default; before, always SERVING).
async fn report_health<S: Leasable + Clone + 'static>(
    health: &tonic_health::server::HealthReporter,
    domains: usize,
) {
    let status = if domains == 0 {
        ServingStatus::NotServing
    } else {
        ServingStatus::Serving
    };
    set_health::<S>(health, status).await;
}

async fn set_health<S: Leasable + Clone + 'static>(
    health: &tonic_health::server::HealthReporter,
    status: ServingStatus,
) {
    type Served<S> = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer<rein_server::grpc::Grpc<S>>;
    for service in [<Served<S> as tonic::server::NamedService>::NAME, ""] {
        health.set_service_status(service, status).await;
    }
}

/// Resolves on SIGTERM (its handler made before listening) or Ctrl-C.
async fn wait_for_stop(mut terminate: tokio::signal::unix::Signal) {
    tokio::select! {
        biased;
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Reloads the rules when a file of `config` changes (checked every `interval`) or on
/// SIGHUP. A new set is validated whole and swapped in at once; a bad one is refused with
/// its file, line and field, and the rules in force keep serving.
async fn watch_rules<S: Leasable + Clone + 'static>(
    service: RateLimitService<S>,
    health: tonic_health::server::HealthReporter,
    config: PathBuf,
    interval: Duration,
    mut hangup: tokio::signal::unix::Signal,
    mut stop: watch::Receiver<bool>,
) {
    let mut seen = fingerprint(&config);
    // A change seen on one tick, loaded only once the files stay the same for a whole
    // period: a file being written, or a set of files being replaced, is never read half
    // done. SIGHUP loads at once.
    let mut settling = None;
    let period = if interval.is_zero() {
        Duration::from_secs(3_600)
    } else {
        interval
    };
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let hup = hangup.recv();
        let forced = tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => None,
            _ = hup => Some(true),
            _ = ticks.tick() => Some(false),
        };
        let Some(forced) = forced else {
            // Health checks steer traffic away as the listeners drain (before, SERVING
            // through shutdown). Here, where reloads report health, so none of them can
            // report SERVING after it.
            set_health::<S>(&health, ServingStatus::NotServing).await;
            return;
        };
        let Some(now) = off_the_runtime({
            let config = config.clone();
            move || fingerprint(&config)
        })
        .await
        else {
            continue;
        };
        if !forced {
            if interval.is_zero() || now == seen {
                settling = None;
                continue;
            }
            if settling.as_ref() != Some(&now) {
                settling = Some(now);
                continue;
            }
        }
        settling = None;
        // Read, parse and check off the runtime's workers, which answer requests: a large
        // set takes a while.
        let Some((loaded, after)) = off_the_runtime({
            let config = config.clone();
            move || (RulesConfig::load(&config), fingerprint(&config))
        })
        .await
        else {
            continue;
        };
        if !forced && after != now {
            // Changed while it was read: looked at again once it settles.
            continue;
        }
        seen = now;
        match loaded {
            // Every domain gone at once is far likelier a directory being replaced than
            // the intent: refused unless asked for by SIGHUP.
            Ok(rules) if !forced && rules.domain_names().next().is_none() => {
                metrics::counter!("rein_server_config_reload_failures_total").increment(1);
                tracing::error!(
                    "reload refused: the rules now hold no domain; send SIGHUP to apply that"
                );
            }
            Ok(rules) => {
                let count = rules.rule_count();
                log_warnings(&rules);
                let Some(reloaded) = off_the_runtime({
                    let service = service.clone();
                    move || service.reload(rules)
                })
                .await
                else {
                    continue;
                };
                match reloaded {
                    Ok(rein_server::Reload::Applied) => {
                        metrics::counter!("rein_server_config_reloads_total").increment(1);
                        tracing::info!(rules = count, forced, "rules reloaded");
                        report_health::<S>(&health, service.domains().len()).await;
                    }
                    Ok(rein_server::Reload::Unchanged) => {
                        tracing::info!(rules = count, forced, "rules unchanged: kept as they are");
                    }
                    Err(error) => {
                        metrics::counter!("rein_server_config_reload_failures_total").increment(1);
                        tracing::error!(%error, "reload refused; the rules in force keep serving");
                    }
                }
            }
            Err(error) => {
                metrics::counter!("rein_server_config_reload_failures_total").increment(1);
                tracing::error!(%error, "reload refused; the rules in force keep serving");
            }
        }
    }
}

/// Runs `work` on tokio's blocking threads, off the workers that answer requests; `None`
/// if it panicked (logged: the reloader goes on with the rules in force).
async fn off_the_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => Some(done),
        Err(error) => {
            metrics::counter!("rein_server_config_reload_failures_total").increment(1);
            tracing::error!(%error, "reading the rules failed; the rules in force keep serving");
            None
        }
    }
}

/// What changes when a rule file does: each rule file's name, length and modification time
/// (only the files a load reads: another file changing is no reason to reload).
fn fingerprint(config: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let files = rein_server::config::rule_files(config).unwrap_or_default();
    files
        .into_iter()
        .filter_map(|path| {
            let meta = std::fs::metadata(&path).ok()?;
            Some((path, meta.len(), meta.modified().ok()))
        })
        .collect()
}
