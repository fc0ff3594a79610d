//! [`Endpoint`] and [`AnyConnection`]: a standalone server or a Cluster, chosen when the
//! program runs (by a configuration file, a flag), as one store type,
//! `RedisStore<AnyConnection>` ([`RedisStoreBuilder::connect_to`](crate::RedisStoreBuilder::connect_to)).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// One server: `redis://` or, for TLS, `rediss://`.
    Url(String),
    /// A Cluster, by one or more of its nodes' URLs.
    Cluster(Vec<String>),
}

/// The URL, or `cluster ` and the nodes' URLs: for a message naming the Redis a program
/// uses or could not reach.
impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(url) => f.write_str(url),
            Self::Cluster(urls) => write!(f, "cluster {}", urls.join(", ")),
        }
    }
}

/// A connection to a standalone server or to a Cluster: what a store built by
/// [`connect_to`](crate::RedisStoreBuilder::connect_to) holds. Each command goes to the
/// connection held; a Cluster store also follows `MOVED` and `ASK` by node address, as one
/// built by [`connect_cluster`](crate::RedisStoreBuilder::connect_cluster) does.
#[derive(Clone)]
pub enum AnyConnection {
    /// One server, through a `ConnectionManager`, which reconnects by itself.
    Standalone(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for AnyConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

impl std::fmt::Debug for AnyConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Standalone(_) => "AnyConnection::Standalone",
            Self::Cluster(_) => "AnyConnection::Cluster",
        })
    }
}
