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
//! The tap is an [`Observer`] of the simulated Redis's own server loop
//! ([`host_observed`](crate::redis::host_observed)): the same request parsing, the same
//! [`Shared`] node, the same restart semantics on `bounce`, and no server code of its own.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rein_core::Timestamp;

use super::clock::true_now;
use crate::redis::{self, Observer, Persistence, Reply, Shared};

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
    redis::host_observed(node, port, persistence, tap)
}

/// The tap notes every script call that ran (any reply but an error), at the simulated
/// instant it ran, under the caller's address.
impl Observer for ScriptTap {
    fn ran(&self, peer: SocketAddr, args: &[Bytes], reply: &Reply) {
        let Some(name) = args.first() else { return };
        // A transaction that ran (an `EXEC` answered with its replies, not nil) is the
        // optimistic store's decision taking effect, as a script run is the Lua store's.
        if name.eq_ignore_ascii_case(b"EXEC") && matches!(reply, Reply::Array(_)) {
            self.note(peer, true_now());
            return;
        }
        let by_source = name.eq_ignore_ascii_case(b"EVAL");
        if (by_source || name.eq_ignore_ascii_case(b"EVALSHA")) && !matches!(reply, Reply::Error(_))
        {
            self.note(peer, true_now());
            if by_source {
                self.by_source.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
