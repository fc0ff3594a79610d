//! A bounded pool of connections, each lent to one call at a time.
//!
//! `WATCH` belongs to a connection: it guards the writes of the `EXEC` that the *same*
//! connection sends next. A multiplexed connection shared by concurrent callers would send
//! one caller's `WATCH` and another's `EXEC` on the same socket (the second would then pass
//! or fail on the first one's watch), and a pool that picks a socket per command could send
//! the `EXEC` on a socket that never watched anything, which commits blindly. So each call
//! borrows a whole connection for its read and its transaction, and nobody else sends a
//! command on it until it is returned.
//!
//! A connection that saw a timeout or an error is never returned: its socket may still
//! carry an unanswered request, or an open `MULTI`, and the next borrower would read the
//! wrong reply. Dropping a [`Lease`] without [`Lease::release`] closes it, which makes
//! cancellation (a deadline firing mid-call) safe by construction. Connections are
//! `MultiplexedConnection`s, because redis-rs 1.x has no other async single-server
//! connection, but each is used by one borrower at a time, so it behaves as a dedicated
//! socket. Never a `ConnectionManager`: it reconnects by itself, so a `WATCH` could be sent
//! on one socket and the `EXEC` on its replacement.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::link::RECONNECT_BACKOFF;

/// Makes a new connection: called whenever a call finds no idle one.
pub(crate) type Connector = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = RedisResult<MultiplexedConnection>> + Send>>
        + Send
        + Sync,
>;

/// One pooled connection and what the server still holds for it.
pub(crate) struct Conn {
    pub(crate) conn: MultiplexedConnection,
    /// A denial or a peek after a `WATCH` leaves the keys watched (sending `UNWATCH` right
    /// away would cost a round trip per denial); the next borrower sends `UNWATCH` first.
    pub(crate) watching: bool,
}

pub(crate) struct Pool {
    /// Shared with the connects in flight, which leave their connection here when the call
    /// that asked for it has gone.
    idle: Arc<Mutex<Vec<Conn>>>,
    permits: Semaphore,
    size: usize,
    connector: Connector,
    /// How long a connect may take, apart from any call's deadline.
    connect_timeout: Duration,
    /// The connects in flight, and when the next may start after one failed.
    connects: Arc<Mutex<Connects>>,
    /// Woken when a connect ends: a call that found as many in flight as the pool holds
    /// waits for one to land (or fail) rather than failing at once.
    ended: Arc<tokio::sync::Notify>,
}

/// What [`Pool::start_connect`] did.
enum Connect {
    /// A connect is on its way, in a task of its own: its connection, or its error.
    Started(tokio::sync::oneshot::Receiver<RedisResult<MultiplexedConnection>>),
    /// As many connects are in flight as the pool holds: wait for one to end.
    Busy,
    /// The last connect failed under [`RECONNECT_BACKOFF`] ago.
    Paced,
}

/// What bounds the pool's connects: at most as many in flight as the pool holds
/// connections, and none for [`RECONNECT_BACKOFF`] after one failed. (Each call that found
/// none idle started its own, unbounded: against a server that drops packets, a connect a
/// call for as long as each took, and against a dead one, a connect a call.)
#[derive(Default)]
struct Connects {
    in_flight: usize,
    retry_at: Option<std::time::Instant>,
}

/// A connection lent to one call. Dropped without [`release`](Self::release), the
/// connection is closed rather than returned.
pub(crate) struct Lease<'a> {
    conn: Option<Conn>,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub(crate) fn new(
        size: usize,
        connector: Connector,
        first: MultiplexedConnection,
        connect_timeout: Duration,
    ) -> Self {
        Self {
            idle: Arc::new(Mutex::new(vec![Conn {
                conn: first,
                watching: false,
            }])),
            permits: Semaphore::new(size),
            size,
            connector,
            connect_timeout,
            connects: Arc::default(),
            ended: Arc::default(),
        }
    }

    /// Waits for a free slot, then lends an idle connection or makes a new one (or waits
    /// for one on its way, when as many are as the pool holds). The caller's deadline
    /// bounds every wait.
    pub(crate) async fn lease(&self) -> RedisResult<Lease<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            // The semaphore lives as long as the pool and is never closed.
            .map_err(|_| redis::RedisError::from((redis::ErrorKind::Client, "pool closed")))?;
        let conn = loop {
            // Listening before looking, so that a connect ending in between is heard: a
            // `Notified` hears `notify_waiters` from its creation, unpolled (tokio's
            // docs), so it needs no `enable`, which would take the wait list's lock on
            // every lease.
            let ended = self.ended.notified();
            if let Some(conn) = self.lock().pop() {
                break conn;
            }
            match self.start_connect() {
                Connect::Started(made) => {
                    let made = made.await.unwrap_or_else(|_| {
                        Err(redis::RedisError::from((
                            redis::ErrorKind::Client,
                            "the connect task ended without a reply",
                        )))
                    });
                    break Conn {
                        conn: made?,
                        watching: false,
                    };
                }
                // It lands in the pool (its caller gone) or fails: look again.
                Connect::Busy => ended.await,
                Connect::Paced => {
                    return Err(not_connected(
                        "the last connect failed: waiting before the next",
                    ));
                }
            }
        };
        Ok(Lease {
            conn: Some(conn),
            pool: self,
            _permit: permit,
        })
    }

    /// Starts a new connection in a task of its own, within `connect_timeout`, unless as
    /// many are in flight as the pool holds or the last failed under [`RECONNECT_BACKOFF`]
    /// ago (each call that found none idle used to start its own: a connect per call
    /// against a dead or silent Redis). A call whose deadline ends first stops waiting, and
    /// the connection, once made, waits in the pool for the next call. (Made inside the
    /// call, a connect longer than the deadline, a TLS handshake to a Redis a few
    /// milliseconds away, was dropped with each call, and the store never connected again.)
    fn start_connect(&self) -> Connect {
        {
            let mut connects = lock(&self.connects);
            if connects
                .retry_at
                .is_some_and(|at| std::time::Instant::now() < at)
            {
                return Connect::Paced;
            }
            if connects.in_flight >= self.size {
                return Connect::Busy;
            }
            connects.in_flight += 1;
        }
        // Counted out however the connect ends: a connector that panics, a task dropped
        // unpolled by a runtime shutting down, must not leave the pool believing a connect
        // is still on its way; and the calls waiting for one to end are woken.
        struct InFlight {
            connects: Arc<Mutex<Connects>>,
            ended: Arc<tokio::sync::Notify>,
            made: bool,
        }
        impl Drop for InFlight {
            fn drop(&mut self) {
                {
                    let mut connects = lock(&self.connects);
                    connects.in_flight -= 1;
                    connects.retry_at =
                        (!self.made).then(|| std::time::Instant::now() + RECONNECT_BACKOFF);
                }
                self.ended.notify_waiters();
            }
        }
        let mut in_flight = InFlight {
            connects: Arc::clone(&self.connects),
            ended: Arc::clone(&self.ended),
            made: false,
        };
        let (sent, made) = tokio::sync::oneshot::channel();
        let (connector, idle) = (Arc::clone(&self.connector), Arc::clone(&self.idle));
        let (size, timeout) = (self.size, self.connect_timeout);
        tokio::spawn(async move {
            let made = match tokio::time::timeout(timeout, connector()).await {
                Ok(made) => made,
                Err(_) => Err(redis::RedisError::from(std::io::Error::from(
                    std::io::ErrorKind::TimedOut,
                ))),
            };
            in_flight.made = made.is_ok();
            if let Err(Ok(conn)) = sent.send(made) {
                let mut idle = lock(&idle);
                if idle.len() < size {
                    idle.push(Conn {
                        conn,
                        watching: false,
                    });
                }
            }
            // Counted out, and the waiting calls woken, once the connection is in the pool.
            drop(in_flight);
        });
        Connect::Started(made)
    }

    pub(crate) fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        lock(&self.idle)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A std mutex, not tokio's: it is held for one push, pop or count and never across an
    // await. A panic cannot leave what it guards half-changed, so poisoning is ignored.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A call's error when the pool makes no connect for it: the store is not connected.
fn not_connected(why: &'static str) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, why))
}

impl Lease<'_> {
    pub(crate) fn conn(&mut self) -> &mut Conn {
        // Invariant: `conn` is `Some` from construction until `release` consumes the lease.
        self.conn
            .as_mut()
            .expect("a lease holds its connection until released")
    }

    /// Returns the connection for reuse: only after a complete, understood exchange, and
    /// only while the pool holds fewer than its size idle (a connect whose call had gone
    /// may have filled it meanwhile); else it is closed.
    pub(crate) fn release(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut idle = self.pool.lock();
            if idle.len() < self.pool.size {
                idle.push(conn);
            }
        }
    }
}
