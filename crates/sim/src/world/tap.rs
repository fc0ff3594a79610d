//! The simulated Redis host, with a tap that notes when each script call ran.
//!
//! The oracle needs every admission at the instant it took effect: for the Redis store,
//! when its script ran on the server, not when the node sent the call or read the reply
//! (those differ by the network latency, and a bound checked at the wrong instants could
//! pass or fail wrongly). The store does not return that instant, and must run unmodified,
//! so the server side notes it: for every `EVALSHA`/`EVAL` that ran (any reply but an
//! error), the simulated instant, under the caller's address. A node sends one call at a
//! time and replaces its connection after any failure, so when a call succeeds, the latest
//! script run under the node's current connection address is that call's.
//!
//! Apart from the tap this is [`sim::redis::host`](crate::redis::host): the same request
//! parsing, the same [`Shared`] node, the same restart semantics on `bounce`.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use rein_core::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::clock::true_now;
use crate::redis::{Persistence, Reply, Session, Shared, parse_request};

/// When the latest script call from each client address ran. Clones share one record.
#[derive(Clone, Debug, Default)]
pub struct ScriptTap {
    runs: Arc<Mutex<BTreeMap<SocketAddr, Timestamp>>>,
    /// Script runs sent as `EVAL` with the source: the store's answer to `NOSCRIPT`.
    by_source: Arc<AtomicU64>,
    /// Every script run, whether or not its reply reached the caller.
    total: Arc<AtomicU64>,
}

impl ScriptTap {
    /// The instant the latest script call from `peer` ran, if any did.
    pub fn last_run(&self, peer: SocketAddr) -> Option<Timestamp> {
        self.lock().get(&peer).copied()
    }

    /// How many script runs came as `EVAL` with the source, i.e. after a `NOSCRIPT`: proof
    /// that a script-cache loss was felt.
    pub fn runs_by_source(&self) -> u64 {
        self.by_source.load(Ordering::Relaxed)
    }

    /// How many script calls ran, answered or not: more than the decisions nodes got from
    /// Redis when replies were lost (each such run charged Redis for a request no node was
    /// told about).
    pub fn runs(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn note(&self, peer: SocketAddr, at: Timestamp) {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(peer, at);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SocketAddr, Timestamp>> {
        // Nothing panics under the lock; a poisoned map is still a valid map.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A turmoil host factory serving `node` on `port`, noting script runs in `tap`. On every
/// run after the first (a `bounce`), `persistence` decides what the server finds.
pub fn tapped_host(
    node: Shared,
    port: u16,
    persistence: Persistence,
    tap: ScriptTap,
) -> impl Fn() -> Pin<Box<dyn Future<Output = turmoil::Result>>> + 'static {
    let started = Cell::new(false);
    move || {
        if started.replace(true) {
            node.restart(persistence);
        }
        let (node, tap) = (node.clone(), tap.clone());
        Box::pin(async move {
            let address = (IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            let listener = turmoil::net::TcpListener::bind(address).await?;
            loop {
                let (stream, peer) = listener.accept().await?;
                let (node, tap) = (node.clone(), tap.clone());
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, peer, node, tap).await {
                        tracing::debug!(%peer, error = %e, "redis connection ended");
                    }
                });
            }
        })
    }
}

async fn serve(
    mut stream: turmoil::net::TcpStream,
    peer: SocketAddr,
    node: Shared,
    tap: ScriptTap,
) -> std::io::Result<()> {
    let mut input = BytesMut::with_capacity(4096);
    let mut output = Vec::new();
    let mut session = Session::default();
    loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        loop {
            match parse_request(&input) {
                Ok(Some((args, used))) => {
                    input.advance(used);
                    let Some(name) = args.first() else { continue };
                    let reply = node.execute_in(&mut session, &args);
                    let script =
                        name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL");
                    if script && !matches!(reply, Reply::Error(_)) {
                        tap.note(peer, true_now());
                        if name.eq_ignore_ascii_case(b"EVAL") {
                            tap.by_source.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reply.encode(&mut output);
                }
                Ok(None) => break,
                Err(error) => {
                    error.reply().encode(&mut output);
                    stream.write_all(&output).await?;
                    return Ok(());
                }
            }
        }
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }
    }
}
