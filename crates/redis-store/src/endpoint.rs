//! [`Endpoint`] and [`AnyConnection`]: a standalone server or a Cluster, chosen when the
//! program runs (by a configuration file, a flag), as one store type,
//! `RedisStore<AnyConnection>` ([`RedisStoreBuilder::connect_to`](crate::RedisStoreBuilder::connect_to)).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Where Redis is. Shown (`Display` and `Debug`) with its secrets written `***`.
#[derive(Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// One server: `redis://` or, for TLS, `rediss://`.
    Url(String),
    /// A Cluster, by one or more of its nodes' URLs.
    Cluster(Vec<String>),
}

/// The URL, or `cluster ` and the nodes' URLs: for a message naming the Redis a program
/// uses or could not reach. A password in a URL is written `***` (a message may reach a
/// log), and so is a user name given without one, which may be a token.
impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Url(url) => f.write_str(&redacted(url)),
            Self::Cluster(urls) => {
                f.write_str("cluster ")?;
                for (i, url) in urls.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(&redacted(url))?;
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({self})")
    }
}

/// `url` with its secrets written `***`: the user information's
/// (`scheme://user:secret@host`, up to the URL's last `@`, since a secret may hold an
/// unescaped `/` or `?`), and a `pass` or `password` parameter's (`unix` URLs).
fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.into();
    };
    let mut shown = url[..scheme_end].to_owned();
    let rest = match url[scheme_end..].rfind('@') {
        Some(at) => {
            match url[scheme_end..scheme_end + at].split_once(':') {
                Some((user, _)) => shown.push_str(&format!("{user}:***")),
                None => shown.push_str("***"),
            }
            &url[scheme_end + at..]
        }
        None => &url[scheme_end..],
    };
    let (head, query) = rest.split_at(rest.find('?').unwrap_or(rest.len()));
    shown.push_str(head);
    for (i, pair) in query.trim_start_matches('?').split('&').enumerate() {
        if query.is_empty() {
            break;
        }
        shown.push(if i == 0 { '?' } else { '&' });
        match pair.split_once('=') {
            Some((name, _)) if name == "pass" || name == "password" => {
                shown.push_str(&format!("{name}=***"));
            }
            _ => shown.push_str(pair),
        }
    }
    if shown == url {
        url.into()
    } else {
        shown.into()
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn a_shown_endpoint_hides_its_secrets() {
        let shown = |url: &str| Endpoint::Url(url.to_owned()).to_string();
        assert_eq!(
            shown("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(shown("redis://:s3cret@h:6379/"), "redis://:***@h:6379/");
        assert_eq!(shown("rediss://app:s3:cret@h/2"), "rediss://app:***@h/2");
        assert_eq!(shown("redis://token@h"), "redis://***@h");
        // A secret holding an unescaped `/` (such a URL does not parse, and its error
        // message is where it would show).
        assert_eq!(shown("redis://:pa/ss@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(shown("redis://:pa?ss@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(
            shown("redis+unix:///run/redis.sock?db=1&pass=s3cret"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(shown("unix:///s?password=x"), "unix:///s?password=***");
        assert_eq!(
            shown("redis://h:1/2?protocol=resp3"),
            "redis://h:1/2?protocol=resp3"
        );
        assert_eq!(shown("not a url"), "not a url");
        assert_eq!(
            format!("{:?}", Endpoint::Url("redis://:s@h".to_owned())),
            "Endpoint(redis://:***@h)"
        );
        let cluster =
            Endpoint::Cluster(vec!["redis://u:p@a:1".to_owned(), "redis://b:2".to_owned()]);
        assert_eq!(
            cluster.to_string(),
            "cluster redis://u:***@a:1, redis://b:2"
        );
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
