//! The store's connection, and replacing it when it may be dead.
//!
//! Connections such as `ConnectionManager` and `ClusterConnection` heal themselves; a
//! plain `MultiplexedConnection` over a caller's stream does not, and a stream cut by a
//! partition may never report an error: calls just stop being answered. So a store built
//! with a connector forgets its connection after a timeout or a connection error and
//! asks the connector for a new one ([`Replace::WhenSuspect`]).
//!
//! A `ConnectionManager` replaces its socket after an I/O error, but keeps one to a primary
//! demoted in place for ever: every write is refused with `READONLY`, while a managed
//! failover has moved the address (a DNS name, a virtual IP) to the new primary. A store
//! that connected by URL asks for a new manager then, and only then
//! ([`Replace::WhenDemoted`]).
//!
//! Reconnecting runs in a spawned task, one at a time, with its own timeout. Calls that
//! find no connection wait for it within their own deadline, so a slow connect never
//! stretches a call, and a connect outlives the call that started it. After a failed
//! connect, calls fail at once with the connect error until [`RECONNECT_BACKOFF`] has
//! passed, so a dead server is not hammered with connects.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult};
use tokio::sync::watch;
use tokio::time::Instant;

use rein_core::StoreError;
use rein_core::limiter::SourceError;

/// Makes a new connection for a store whose connection may be dead or demoted: the
/// closure given to `RedisStoreBuilder::connect_with`, boxed (called once when the store is
/// built and again after a call timed out or hit a connection error), or a new
/// `ConnectionManager` to the URL a store connected to (after a refused write).
pub(crate) type Connector<C> = Arc<dyn Fn() -> ConnectFuture<C> + Send + Sync>;

/// The future a [`Connector`] returns.
pub(crate) type ConnectFuture<C> = Pin<Box<dyn Future<Output = RedisResult<C>> + Send>>;

/// When a link asks its connector for a new connection.
pub(crate) enum Replace<C> {
    /// Never: a connection that heals itself or not at all (a `ClusterConnection`, one the
    /// caller built).
    Never,
    /// After a call on it timed out or failed as a connection (`connect_with`).
    WhenSuspect(Connector<C>),
    /// Only when the server it reaches refused a write as a replica (`READONLY`): a
    /// `ConnectionManager` made from a URL.
    WhenDemoted(Connector<C>),
}

/// Why a call's connection is suspect, for [`Link::suspect`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suspicion {
    /// A timeout or a connection error.
    Failed,
    /// The server refused a write as a replica (`READONLY`).
    Demoted,
}

/// The connection in use, and how to replace it.
pub(crate) struct Link<C> {
    slot: Mutex<Slot<C>>,
    replace: Replace<C>,
    connect_timeout: Duration,
    /// Bumped after every connect attempt, so waiting calls look again.
    attempts: watch::Sender<u64>,
}

struct Slot<C> {
    conn: Option<C>,
    /// Counts connections made, so a failure on an old one cannot drop a newer one.
    generation: u64,
    connecting: bool,
    /// After a failed connect: no new attempt before this instant.
    retry_at: Option<Instant>,
    /// When the connection in use was made by a reconnect (`None`: the first one).
    made_at: Option<Instant>,
    last_error: Option<RedisError>,
}

impl<C: Clone + Send + 'static> Link<C> {
    /// A link over a connection that is never replaced.
    pub(crate) fn fixed(conn: C) -> Self {
        Self::new(conn, Replace::Never, Duration::MAX)
    }

    /// A link over `conn`, replaced as `replace` says, each connect within `timeout`.
    pub(crate) fn new(conn: C, replace: Replace<C>, connect_timeout: Duration) -> Self {
        Self {
            slot: Mutex::new(Slot {
                conn: Some(conn),
                generation: 0,
                connecting: false,
                retry_at: None,
                made_at: None,
                last_error: None,
            }),
            replace,
            connect_timeout,
            attempts: watch::Sender::new(0),
        }
    }

    /// The current connection and its generation, waiting for a reconnect if there is
    /// none. The caller bounds the wait with its deadline.
    pub(crate) async fn get(self: &Arc<Self>) -> Result<(C, u64), StoreError> {
        loop {
            let mut attempts = {
                let mut slot = self.lock();
                if let Some(conn) = &slot.conn {
                    return Ok((conn.clone(), slot.generation));
                }
                if !slot.connecting {
                    if slot.retry_at.is_some_and(|at| Instant::now() < at) {
                        return Err(StoreError::Connection(SourceError::new(
                            slot.last_error.clone().unwrap_or_else(|| {
                                RedisError::from((ErrorKind::Io, "not connected"))
                            }),
                        )));
                    }
                    slot.connecting = true;
                    tokio::spawn(Arc::clone(self).reconnect());
                }
                // Subscribed under the lock: an attempt that ends after it is seen.
                self.attempts.subscribe()
            };
            if attempts.changed().await.is_err() {
                return Err(StoreError::Connection(SourceError::new(RedisError::from(
                    (ErrorKind::Io, "the store was dropped while reconnecting"),
                ))));
            }
        }
    }

    /// Forgets the connection of `generation` after a call on it failed as `why` says, if
    /// the link replaces a connection for that, so the next call reconnects.
    pub(crate) fn suspect(&self, generation: u64, why: Suspicion) {
        // Decided without the lock where it can be (a Cluster's link never replaces).
        let paced = match self.replace {
            Replace::Never => return,
            Replace::WhenSuspect(_) => false,
            Replace::WhenDemoted(_) if why != Suspicion::Demoted => return,
            Replace::WhenDemoted(_) => true,
        };
        let mut slot = self.lock();
        // Not again within RECONNECT_BACKOFF of the last replacement: while a failover's
        // address still leads to the demoted server, each new connection reaches it again,
        // and replacing each at once would be a connect per call.
        if paced
            && slot
                .made_at
                .is_some_and(|at| at.elapsed() < RECONNECT_BACKOFF)
        {
            return;
        }
        if slot.generation == generation && slot.conn.is_some() {
            tracing::debug!(generation, "rein-redis: dropping a suspect connection");
            slot.conn = None;
        }
    }

    async fn reconnect(self: Arc<Self>) {
        // Clears `connecting` even if this task is cancelled (a runtime shutting down).
        struct Attempt<'a, C: Clone + Send + 'static>(&'a Link<C>);
        impl<C: Clone + Send + 'static> Drop for Attempt<'_, C> {
            fn drop(&mut self) {
                self.0.lock().connecting = false;
                self.0.attempts.send_modify(|n| *n += 1);
            }
        }
        let _attempt = Attempt(&self);
        let connector = match &self.replace {
            Replace::Never => return,
            Replace::WhenSuspect(connector) | Replace::WhenDemoted(connector) => {
                Arc::clone(connector)
            }
        };
        let result = match tokio::time::timeout(self.connect_timeout, connector()).await {
            Ok(result) => result,
            Err(_) => Err(RedisError::from((
                ErrorKind::Io,
                "connect timed out",
                format!("after {:?}", self.connect_timeout),
            ))),
        };
        let mut slot = self.lock();
        match result {
            Ok(conn) => {
                slot.generation += 1;
                slot.conn = Some(conn);
                slot.retry_at = None;
                slot.made_at = Some(Instant::now());
                slot.last_error = None;
                tracing::debug!(generation = slot.generation, "rein-redis: reconnected");
            }
            Err(e) => {
                tracing::debug!(error = %e, "rein-redis: reconnect failed");
                slot.retry_at = Some(Instant::now() + RECONNECT_BACKOFF);
                slot.last_error = Some(e);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<C>> {
        // Nothing panics while holding the lock, and every update leaves the slot valid.
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How long after a failed connect calls fail at once instead of connecting again. Long
/// enough that thousands of calls per second against a dead server cost ten connects per
/// second, short enough that a restarted server is back in use within a tenth of a second.
/// The optimistic store's pool waits as long between failed connects.
pub(crate) const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
