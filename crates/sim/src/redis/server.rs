//! The socket side: accept connections on a turmoil listener, read requests, write replies.
//!
//! This is the only file that does I/O. Each connection is a task that parses as many
//! pipelined requests as have arrived, runs each against the [`Shared`] node, and writes all
//! their replies at once. A malformed request gets Redis's protocol error and the connection
//! is closed; nothing from the network can panic the server.

use std::cell::Cell;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::node::{Persistence, Shared};
use super::reply::Reply;
use super::request;

/// Sees every command the server ran, with its caller and its reply, as it ran: the
/// supported way for a simulation to note *when* something happened on the server (the
/// world's script tap does), without a server loop of its own. Called with no await in
/// between the command and its observation, at the simulated instant it ran.
pub trait Observer: Clone + Send + 'static {
    /// `args` ran for the client at `peer` and answered `reply`.
    fn ran(&self, peer: SocketAddr, args: &[Bytes], reply: &Reply);
}

/// No observer.
impl Observer for () {
    fn ran(&self, _peer: SocketAddr, _args: &[Bytes], _reply: &Reply) {}
}

/// A turmoil host factory for `Sim::host`: binds `port` and serves `node`.
///
/// turmoil runs the factory again on every `bounce`; from the second run on, `persistence`
/// decides what the restarted server finds. The first run leaves the node as it is, so a
/// test may load data before the simulation starts.
///
/// ```no_run
/// use sim::redis::{Clock, Persistence, Shared, host};
///
/// let mut world = turmoil::Builder::new().build();
/// let redis = Shared::new(Clock::turmoil());
/// world.host("redis", host(redis.clone(), 6379, Persistence::LoseData));
/// ```
pub fn host(
    node: Shared,
    port: u16,
    persistence: Persistence,
) -> impl Fn() -> Pin<Box<dyn Future<Output = turmoil::Result>>> + 'static {
    host_observed(node, port, persistence, ())
}

/// [`host`], with every command shown to `observer` as it runs.
pub fn host_observed<O: Observer>(
    node: Shared,
    port: u16,
    persistence: Persistence,
    observer: O,
) -> impl Fn() -> Pin<Box<dyn Future<Output = turmoil::Result>>> + 'static {
    let started = Cell::new(false);
    move || {
        if started.replace(true) {
            node.restart(persistence);
        }
        let (node, observer) = (node.clone(), observer.clone());
        Box::pin(async move {
            let address = (IpAddr::V4(Ipv4Addr::UNSPECIFIED), port);
            let listener = turmoil::net::TcpListener::bind(address).await?;
            serve_observed(listener, node, observer).await?;
            Ok(())
        })
    }
}

/// Accepts connections forever, serving each in its own task.
pub async fn serve(listener: turmoil::net::TcpListener, node: Shared) -> std::io::Result<()> {
    serve_observed(listener, node, ()).await
}

async fn serve_observed<O: Observer>(
    listener: turmoil::net::TcpListener,
    node: Shared,
    observer: O,
) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let (node, observer) = (node.clone(), observer.clone());
        tokio::spawn(async move {
            if let Err(e) = serve_observed_connection(stream, peer, node, observer).await {
                tracing::debug!(%peer, error = %e, "redis connection ended");
            }
        });
    }
}

/// Serves one connection until the peer closes it or sends a malformed request. Works on any
/// byte stream, so tests can drive it without turmoil.
pub async fn serve_connection<S>(stream: S, node: Shared) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let nobody = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    serve_observed_connection(stream, nobody, node, ()).await
}

async fn serve_observed_connection<S, O>(
    mut stream: S,
    peer: SocketAddr,
    node: Shared,
    observer: O,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    O: Observer,
{
    let mut input = BytesMut::with_capacity(4096);
    let mut output = Vec::new();
    loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        loop {
            match request::parse(&input) {
                Ok(Some((args, used))) => {
                    input.advance(used);
                    if !args.is_empty() {
                        let reply = node.execute_args(&args);
                        observer.ran(peer, &args, &reply);
                        reply.encode(&mut output);
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    error.reply().encode(&mut output);
                    stream.write_all(&output).await?;
                    return Ok(());
                }
            }
        }
        if input.len() > MAX_QUERY_BUFFER {
            let reply = super::Reply::error("ERR Protocol error: query buffer over 64 MiB");
            reply.encode(&mut output);
            stream.write_all(&output).await?;
            return Ok(());
        }
        if !output.is_empty() {
            stream.write_all(&output).await?;
            output.clear();
        }
    }
}

/// The most unparsed input one connection may hold: far above any request rein sends, far
/// below what would exhaust memory in a simulation of many nodes.
const MAX_QUERY_BUFFER: usize = 64 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use rein_core::Timestamp;
    use tokio::io::duplex;

    use super::super::clock::ManualClock;
    use super::*;

    async fn exchange(node: &Shared, input: &[u8]) -> Vec<u8> {
        let (mut client, server) = duplex(1 << 16);
        let serving = tokio::spawn(serve_connection(server, node.clone()));
        client.write_all(input).await.expect("write");
        client.shutdown().await.expect("shutdown");
        let mut output = Vec::new();
        client.read_to_end(&mut output).await.expect("read");
        serving.await.expect("join").expect("serve");
        output
    }

    fn node() -> Shared {
        Shared::new(ManualClock::new(Timestamp::from_micros(0)).clock())
    }

    #[tokio::test]
    async fn pipelined_requests_get_their_replies_in_order() {
        let node = node();
        let output = exchange(
            &node,
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n7\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\
              *2\r\n$3\r\nDEL\r\n$1\r\nk\r\n*0\r\n*1\r\n$4\r\nPING\r\n",
        )
        .await;
        assert_eq!(output, b"+OK\r\n$1\r\n7\r\n:1\r\n+PONG\r\n");
    }

    #[tokio::test]
    async fn a_malformed_request_gets_a_protocol_error_and_the_connection_closes() {
        let node = node();
        let output = exchange(&node, b"*1\r\n$4\r\nPING\r\n*1\r\n$99999999999\r\n").await;
        assert_eq!(
            output,
            b"+PONG\r\n-ERR Protocol error: invalid bulk length\r\n"
        );
    }
}
