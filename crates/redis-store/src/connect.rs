//! Building a store from a URL: standalone (`ConnectionManager`) or Cluster
//! (`ClusterConnection`), plain or TLS (`rediss://`), with credentials from the URL.
//!
//! Each constructor connects, then loads rein's script with `SCRIPT LOAD`, so a server that
//! is not Redis, or an ACL user that may not load scripts, is reported when the store is
//! built rather than on the first decision.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, RedisResult, Value};

use rein_core::StoreError;

use crate::error::store_error;
use crate::link::{Connector, Link, Replace};
use crate::route::Router;
use crate::{AnyConnection, ConnectError, Endpoint, RedisStore, RedisStoreBuilder, SettingsError};

impl RedisStore<ConnectionManager> {
    /// Connects to a standalone Redis with default settings; see
    /// [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        RedisStoreBuilder::new().connect(url).await
    }
}

impl RedisStore<ClusterConnection> {
    /// Connects to a Redis Cluster with default settings; see
    /// [`RedisStoreBuilder::connect_cluster`].
    pub async fn connect_cluster<I, S>(urls: I) -> Result<Self, ConnectError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        RedisStoreBuilder::new().connect_cluster(urls).await
    }
}

impl RedisStoreBuilder {
    /// Connects to a standalone Redis through a `ConnectionManager`, which reconnects by
    /// itself when the connection drops.
    ///
    /// `url` is `redis://[[user]:password@]host[:port][/db]`, or `rediss://...` for TLS
    /// (verified against the platform's root certificates; requires the `tls` feature, on
    /// by default). Credentials in the URL are sent with `AUTH`.
    ///
    /// The manager replaces its socket after an I/O error. When the server refuses a write
    /// as a replica (`READONLY`: the primary was demoted in place, and a managed failover
    /// moved the URL's name or address to the new one), the store makes a new manager to
    /// the same URL, once at a time, within the connect timeout.
    pub async fn connect(self, url: &str) -> Result<RedisStore<ConnectionManager>, ConnectError> {
        let (link, listener) = self.standalone(url, |conn| conn).await?;
        Ok(RedisStore::with_link(self, link)
            .started(Some(listener))
            .await)
    }

    /// A link to a `ConnectionManager` to `url` (its scripts loaded), as the store's
    /// connection type by `wrap`, that makes another manager to `url` when the server was
    /// demoted ([`Replace::WhenDemoted`]); and the client that listens for override changes.
    async fn standalone<C: Clone + Send + 'static>(
        &self,
        url: &str,
        wrap: fn(ConnectionManager) -> C,
    ) -> Result<(Link<C>, Client), ConnectError> {
        self.validate()?;
        install_crypto_provider();
        let client = client(url)?;
        let listener = client.clone();
        let timeout = self.shared.connect_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            // The store's deadline bounds every call; a second, shorter timer inside
            // redis-rs would only race it.
            .set_response_timeout(None)
            // redis-rs's default reconnect backoff grows to seconds during a long outage;
            // capped at 100 ms, a restarted server is back in use within about half a
            // second (measured in tests/resilience.rs; docs/failure.md).
            .set_max_delay(Duration::from_millis(100));
        let again = (client.clone(), config.clone());
        let connector: Connector<C> = Arc::new(move || {
            let (client, config) = again.clone();
            Box::pin(async move {
                let made = client.get_connection_manager_with_config(config).await;
                made.map(wrap)
            })
        });
        let conn = first_connection(timeout, async move {
            // One plain connection first: the manager retries a failed connect with backoff,
            // which would turn a wrong password or an untrusted certificate into a timeout.
            // Its PING reports a missing password as NOAUTH (and a least-privilege user's
            // NOPERM for PING itself is no concern).
            let probe = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout));
            let mut probe = client
                .get_multiplexed_async_connection_with_config(&probe)
                .await?;
            match redis::cmd("PING").query_async::<Value>(&mut probe).await {
                Err(e) if is_auth_error(&e) => return Err(e),
                _ => drop(probe),
            }
            client.get_connection_manager_with_config(config).await
        })
        .await?;
        load_script(conn.clone(), deadline, timeout).await?;
        let link = Link::new(wrap(conn), Replace::WhenDemoted(connector), timeout);
        Ok((link, listener))
    }

    /// Connects to a Redis Cluster, given one or more of its nodes.
    ///
    /// URLs are as for [`connect`](Self::connect), each with the same credentials and scheme
    /// (redis-rs refuses nodes that differ: `InvalidUrl`).
    ///
    /// redis-rs's own retries are off (`retries(0)`): they resend after a broken
    /// connection too, when the script may have run, and would count it twice. The store
    /// follows resharding itself instead, resending only replies that prove the script did
    /// not run: `MOVED` to the new owner, `ASK` as `ASKING` and the script on the importing
    /// node, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` and `READONLY` after a short
    /// wait; at most 5 resends, within the call's deadline (docs/redis.md, "Redis Cluster").
    pub async fn connect_cluster<I, S>(
        self,
        urls: I,
    ) -> Result<RedisStore<ClusterConnection>, ConnectError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let (conn, listener) = self.cluster(&urls).await?;
        Ok(self.build_cluster(conn)?.started(listener).await)
    }

    /// A Cluster connection to the nodes of `urls`, the script loaded on every master, and
    /// the client that listens for override changes.
    async fn cluster(
        &self,
        urls: &[String],
    ) -> Result<(ClusterConnection, Option<Client>), ConnectError> {
        self.validate()?;
        install_crypto_provider();
        // A publication reaches every node of a Cluster: one node's subscription hears it.
        let listener = match urls.first() {
            Some(url) => Some(client(url)?),
            None => None,
        };
        let timeout = self.shared.connect_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let client = ClusterClientBuilder::new(urls.iter().map(String::as_str))
            .tcp_settings(tcp_settings())
            .retries(0)
            .connection_timeout(timeout)
            // Bounds the client's own requests (slot map refreshes, the fan-out of SCRIPT
            // LOAD); the store's deadline, usually shorter, bounds each decision.
            .response_timeout(timeout)
            .build()
            .map_err(ConnectError::InvalidUrl)?;
        let conn =
            first_connection(timeout, async move { client.get_async_connection().await }).await?;
        load_script(conn.clone(), deadline, timeout).await?;
        Ok((conn, listener))
    }

    /// Connects to `endpoint`, a standalone server or a Cluster as a configuration file or
    /// a flag says, as [`connect`](Self::connect) or [`connect_cluster`](Self::connect_cluster)
    /// would, into one store type whichever it is.
    pub async fn connect_to(
        self,
        endpoint: &Endpoint,
    ) -> Result<RedisStore<AnyConnection>, ConnectError> {
        let (store, listener) = match endpoint {
            Endpoint::Url(url) => {
                let (link, listener) = self.standalone(url, AnyConnection::Standalone).await?;
                (RedisStore::with_link(self, link), Some(listener))
            }
            Endpoint::Cluster(urls) => {
                let (conn, listener) = self.cluster(urls).await?;
                let conn = AnyConnection::Cluster(conn);
                (self.routed(conn, crate::route::any_router())?, listener)
            }
        };
        Ok(store.started(listener).await)
    }

    /// A store over a Cluster connection the caller built, following `MOVED`, `ASK` and
    /// transient cluster states as [`connect_cluster`](Self::connect_cluster) does
    /// ([`build`](Self::build) would not: it cannot route to a node by address).
    ///
    /// Build the client with `ClusterClientBuilder::retries(0)`: with retries, redis-rs
    /// resends a call whose connection broke after sending, and a script that had run
    /// would count twice.
    ///
    /// A Cluster store does not coalesce decisions ([`coalesce`](Self::coalesce)): the keys
    /// of one script call must share a hash slot, and concurrent decisions rarely do.
    pub fn build_cluster(
        self,
        conn: ClusterConnection,
    ) -> Result<RedisStore<ClusterConnection>, SettingsError> {
        self.routed(conn, crate::route::cluster_router())
    }

    /// A Cluster store over `conn`, sending to a node by address through `router`: one
    /// that does not coalesce (a script's keys must share a slot).
    fn routed<C>(self, conn: C, router: Router<C>) -> Result<RedisStore<C>, SettingsError>
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        self.validate()?;
        let builder = self.coalesce(crate::Coalesce::OFF);
        Ok(RedisStore::routed(builder, Link::fixed(conn), Some(router)))
    }
}

/// Runs a connect future within `timeout`, sorting its failure.
pub(crate) async fn first_connection<C>(
    timeout: Duration,
    connect: impl Future<Output = RedisResult<C>>,
) -> Result<C, ConnectError> {
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(connect_error(e, timeout)),
        Err(_) => Err(StoreError::Timeout(timeout).into()),
    }
}

/// `SCRIPT LOAD` of every script (on every master, for a Cluster connection), checking the
/// SHA-1 each returns, all by `deadline`: the end of the connect's `timeout`, which bounds
/// the connect as a whole (each load with a timeout of its own made a slow server's
/// connect take several times the setting).
async fn load_script<C: ConnectionLike>(
    mut conn: C,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<(), ConnectError> {
    for (load, sha1) in crate::script::load_commands() {
        match tokio::time::timeout_at(deadline, load.query_async::<Value>(&mut conn)).await {
            Ok(Ok(reply)) => crate::script::check_load_reply(&reply, sha1)?,
            Ok(Err(e)) if is_auth_error(&e) => return Err(ConnectError::Auth(e)),
            Ok(Err(e)) => return Err(store_error(e, timeout).into()),
            Err(_) => return Err(StoreError::Timeout(timeout).into()),
        }
    }
    Ok(())
}

/// A refused or missing login: matched on the error code, never on message text.
fn is_auth_error(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed || matches!(e.code(), Some("WRONGPASS" | "NOAUTH"))
}

fn connect_error(e: RedisError, timeout: Duration) -> ConnectError {
    match e.kind() {
        _ if is_auth_error(&e) => ConnectError::Auth(e),
        ErrorKind::InvalidClientConfig => ConnectError::InvalidUrl(e),
        _ => match store_error(e, timeout) {
            // Before a connection exists, a server error is a refused connection too.
            StoreError::Server(e) => StoreError::Connection(e).into(),
            other => other.into(),
        },
    }
}

/// A client of the server at `url`, its connections made with [`tcp_settings`].
pub(crate) fn client(url: &str) -> Result<Client, ConnectError> {
    let info =
        redis::IntoConnectionInfo::into_connection_info(url).map_err(ConnectError::InvalidUrl)?;
    Client::open(info.set_tcp_settings(tcp_settings())).map_err(ConnectError::InvalidUrl)
}

/// How long a peer may leave sent data unacknowledged before the kernel gives the
/// connection up (`TCP_USER_TIMEOUT`, Linux): a server whose host is lost, or a failover
/// that only moved its address, answers no more and sends no reset, and without this the
/// kernel retries for about 15 minutes while every call times out. With it, the
/// connection fails after 10 s and is made again (a paused or overloaded server's kernel
/// still acknowledges: it is not given up).
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);

/// The TCP settings of every connection the stores make ([`TCP_USER_TIMEOUT`] where the
/// platform has it).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    let settings = redis::io::tcp::TcpSettings::default();
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let settings = settings.set_user_timeout(TCP_USER_TIMEOUT);
    settings
}

/// redis-rs builds its rustls config with the process-wide default crypto provider; name
/// `ring` unless the application installed one already.
pub(crate) fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    {
        // An error means a provider is installed already, which is what we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user timeout reaches the client's connection info (redis-rs applies it to the
    /// socket it opens).
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    #[test]
    fn every_client_gives_up_a_silent_peer() {
        let client = client("redis://127.0.0.1:6399/").expect("a client");
        let settings = client.get_connection_info().tcp_settings();
        assert_eq!(settings.user_timeout(), Some(TCP_USER_TIMEOUT));
        assert_eq!(tcp_settings().user_timeout(), Some(TCP_USER_TIMEOUT));
    }
}
