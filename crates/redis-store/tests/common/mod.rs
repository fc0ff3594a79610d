//! Helpers shared by the integration tests: stores over private servers, raw connections
//! for inspecting keys, and fake servers that are not Redis.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, MultiplexedConnection};
use rein_redis::{RedisStore, RedisStoreBuilder};
use rein_redis_harness::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A store over a new `ConnectionManager` to `server`, with a deadline generous enough for
/// a debug build on a busy machine: these tests are about exactness, not latency, and a
/// timed-out call has an unknown effect.
pub async fn store(server: &RedisServer) -> RedisStore<ConnectionManager> {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .connect(&server.url())
        .await
        .expect("connect the store")
}

/// A store over a private Cluster, with the same generous deadline as [`store`].
pub async fn cluster_store(
    cluster: &rein_redis_harness::RedisCluster,
) -> RedisStore<redis::cluster_async::ClusterConnection> {
    RedisStoreBuilder::new()
        .deadline(Duration::from_secs(5))
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
}

/// A plain connection for inspecting and disturbing the server.
pub async fn raw(server: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// A TCP server on 127.0.0.1 that speaks just enough RESP to be mistaken for Redis: it
/// answers every complete command it receives with `reply` (or with nothing at all, if
/// `reply` is empty). It counts the bytes it received.
pub struct FakeServer {
    pub port: u16,
    pub received: Arc<AtomicUsize>,
}

impl FakeServer {
    pub async fn start(reply: &'static [u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let received = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        let n = match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        counter.fetch_add(n, Ordering::SeqCst);
                        buf.extend_from_slice(&chunk[..n]);
                        while let Some(used) = complete_command(&buf) {
                            buf.drain(..used);
                            if !reply.is_empty() && socket.write_all(reply).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { port, received }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

/// The length of the first complete RESP command (an array of bulk strings) in `buf`.
fn complete_command(buf: &[u8]) -> Option<usize> {
    let line = |from: usize| -> Option<(&[u8], usize)> {
        let end = buf.get(from..)?.windows(2).position(|w| w == b"\r\n")? + from;
        Some((&buf[from..end], end + 2))
    };
    let (header, mut at) = line(0)?;
    let count: usize = std::str::from_utf8(header.strip_prefix(b"*")?)
        .ok()?
        .parse()
        .ok()?;
    for _ in 0..count {
        let (len, next) = line(at)?;
        let len: usize = std::str::from_utf8(len.strip_prefix(b"$")?)
            .ok()?
            .parse()
            .ok()?;
        at = next + len + 2;
        if buf.len() < at {
            return None;
        }
    }
    Some(at)
}

/// A `MultiplexedConnection` to `port` that sends nothing on connect, so it can be made to
/// a server that never answers.
pub async fn quiet_connection(port: u16) -> MultiplexedConnection {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let info = redis::RedisConnectionInfo::default().set_skip_set_lib_name();
    let (conn, driver) =
        MultiplexedConnection::new_with_config(&info, stream, redis::AsyncConnectionConfig::new())
            .await
            .expect("multiplexed connection");
    tokio::spawn(driver);
    conn
}
