//! An axum service rate-limited through Redis by rein-tower, configured from a TOML file.
//!
//! ```text
//! cargo run -p rein-tower --example axum                      # examples/rein.toml, port 3000
//! cargo run -p rein-tower --example axum -- my.toml 0.0.0.0:8080
//! REIN_REDIS_URL=redis://127.0.0.1:6380/ cargo run -p rein-tower --example axum
//! ```
//!
//! Then, from another shell:
//!
//! ```text
//! curl -i localhost:3000/api/search                 # 200, RateLimit: "api.0";r=9;t=...
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/api/search; done
//! curl -i localhost:3000/api/search                 # 429, Retry-After, RateLimit-Policy
//! curl -i localhost:3000/api/quota                  # peeks: spends nothing
//! curl -i -X POST localhost:3000/login              # 5 a minute
//! curl -i localhost:3000/api/partner/x              # 500: no x-api-key header, no key
//! curl -i -H 'x-api-key: k1' localhost:3000/api/partner/x
//! curl -i localhost:3000/health                     # never limited
//! ```
//!
//! Run it twice on two ports: both count against the same limits in Redis.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::routing::{get, post};
use rein_tower::{Config, RedisEndpoint};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rein_tower=debug".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/rein.toml"));
    let listen: SocketAddr = args.next().as_deref().unwrap_or("127.0.0.1:3000").parse()?;

    let mut config = Config::load(&path)?;
    if let Ok(url) = std::env::var("REIN_REDIS_URL") {
        config.redis.endpoint = RedisEndpoint::Url(url);
    }
    let layer = config.build().await?;

    let app = Router::new()
        .route("/health", get(|| async { "ok\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/api/quota", get(|| async { "see the RateLimit header\n" }))
        .route("/api/{*rest}", get(|| async { "api response\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!(
        "listening on http://{} with limits from {}",
        listener.local_addr()?,
        path.display()
    );
    // `ConnectInfo<SocketAddr>` is how the layer learns the peer address, the default key.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
