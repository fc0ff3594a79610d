//! Sending one attempt of a script call: to the key's slot through the connection, or to a
//! named Cluster node through a [`Router`].
//!
//! # Why a router captured at construction
//!
//! The store is generic over any `ConnectionLike`, which can only send a command where the
//! connection chooses (for a Cluster connection: the slot's owner in its map). Following an
//! `ASK` needs more: `ASKING` and the script on one chosen node, back to back on the same
//! connection. Only redis-rs's `ClusterConnection` can do that (`route_pipeline` by
//! address). Rather than widen the store's bound with a trait every connection type would
//! have to implement, the constructors that know they hold a `ClusterConnection`
//! ([`connect_cluster`](crate::RedisStoreBuilder::connect_cluster),
//! [`build_cluster`](crate::RedisStoreBuilder::build_cluster)) hand the store a plain
//! function pointer for it. Every other store has none: the pure `Redirects` then follows
//! no `ASK`, and resends a `MOVED` to the slot once the client refreshed its map.

use std::future::Future;
use std::pin::Pin;

use tokio::time::Instant;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, ServerErrorKind, Value};

use crate::AnyConnection;
use crate::redirect::{Node, RESEND_ROOM, Target};
use crate::script::Invocation;

/// Sends `pipeline` to `node` and returns its replies from the `offset`-th on, one
/// reply per command, each still holding its own server error (`NOSCRIPT`); a reply that
/// asks for a redirect or a wait is returned as the `Err`.
pub(crate) type Router<C> = for<'a> fn(&'a mut C, Pipeline, usize, &'a Node) -> RouteFuture<'a>;

/// The future a [`Router`] returns.
pub(crate) type RouteFuture<'a> =
    Pin<Box<dyn Future<Output = RedisResult<Vec<Value>>> + Send + 'a>>;

/// The [`Router`] of a redis-rs Cluster connection.
pub(crate) fn cluster_router() -> Router<ClusterConnection> {
    route_cluster
}

/// The [`Router`] of an [`AnyConnection`]: a Cluster connection's. Given only to a store
/// that holds [`AnyConnection::Cluster`]; a standalone server never redirects.
pub(crate) fn any_router() -> Router<AnyConnection> {
    |conn, pipeline, offset, node| match conn {
        AnyConnection::Cluster(conn) => route_cluster(conn, pipeline, offset, node),
        AnyConnection::Standalone(_) => Box::pin(std::future::ready(Err(RedisError::from((
            ErrorKind::Client,
            "a standalone connection cannot route to a Cluster node",
        ))))),
    }
}

fn route_cluster<'a>(
    conn: &'a mut ClusterConnection,
    pipeline: Pipeline,
    offset: usize,
    node: &'a Node,
) -> RouteFuture<'a> {
    let routing = SingleNodeRoutingInfo::ByAddress {
        host: node.host.clone(),
        port: node.port,
    };
    Box::pin(conn.route_pipeline(pipeline, offset, 1, routing))
}

/// Sends `invocation` to `target` once, by hash, and once more by source on the same
/// target if the node answers `NOSCRIPT` (the script had not run; see
/// `Invocation::by_source`) and the resend has room before `deadline`, as a redirect's
/// must ([`RESEND_ROOM`]): without it, the `NOSCRIPT` that says "did not run".
pub(crate) async fn send<C: ConnectionLike>(
    conn: &mut C,
    router: Option<Router<C>>,
    target: &Target,
    invocation: &Invocation<'_>,
    deadline: Instant,
) -> RedisResult<Value> {
    let sent = Instant::now();
    match send_one(conn, router, target, invocation.by_hash()).await {
        // As long as the first attempt took (at least `RESEND_ROOM`) must be left.
        Err(e)
            if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                && deadline.saturating_duration_since(Instant::now())
                    >= sent.elapsed().max(RESEND_ROOM) =>
        {
            tracing::debug!(?target, "script not cached: sending its source");
            send_one(conn, router, target, invocation.by_source()).await
        }
        reply => reply,
    }
}

async fn send_one<C: ConnectionLike>(
    conn: &mut C,
    router: Option<Router<C>>,
    target: &Target,
    cmd: Cmd,
) -> RedisResult<Value> {
    let node = match target {
        Target::Slot => return conn.req_packed_command(&cmd).await.and_then(own_error),
        Target::Node(node) => node,
    };
    // `Redirects` names a node only when the store has a router.
    let Some(router) = router else {
        return Err(RedisError::from((
            ErrorKind::ClusterConnectionNotFound,
            "this connection cannot send to a node by address",
        )));
    };
    // `ASKING` holds for the next command on its connection only: one pipeline keeps the
    // two adjacent on the multiplexed connection to that node.
    let mut pipeline = redis::pipe();
    if node.asking {
        pipeline.cmd("ASKING");
    }
    pipeline.add_command(cmd);
    let offset = usize::from(node.asking);
    let replies = router(conn, pipeline, offset, node).await?;
    match replies.into_iter().next() {
        Some(reply) => own_error(reply),
        None => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "no reply to a routed script call",
        ))),
    }
}

/// The reply's own error, not its elements': a lean script answers one decision's failure
/// (corrupt state, a write refused) as an element of its array, which the call's other
/// decisions must survive (redis-rs's `query_async` would turn it into the call's error).
fn own_error(reply: Value) -> RedisResult<Value> {
    match reply {
        Value::ServerError(e) => Err(e.into()),
        reply => Ok(reply),
    }
}
