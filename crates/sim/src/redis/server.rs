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

use super::keyspace::Entry;
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
            if let Err(e) = serve_connection_observed(stream, peer, node, observer).await {
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
    serve_connection_observed(stream, nobody, node, ()).await
}

/// [`serve_connection`], with every command shown to `observer` as it runs, as sent by
/// `peer`.
pub async fn serve_connection_observed<S, O>(
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
    let mut transaction = Transaction::default();
    loop {
        if stream.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
        loop {
            match request::parse(&input) {
                Ok(Some((args, used))) => {
                    input.advance(used);
                    if !args.is_empty() {
                        let reply = transaction
                            .handle(&node, &args)
                            .unwrap_or_else(|| node.execute_args(&args));
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

/// One connection's optimistic transaction (`WATCH`, `MULTI`, `EXEC`, `DISCARD`,
/// `UNWATCH`): the watched keys with what they held, and the queued commands. The optimistic
/// store (rein-redis's `OptimisticStore`) is the only client that sends these.
#[derive(Default)]
struct Transaction {
    watched: Vec<(Bytes, Option<Entry>)>,
    queued: Option<Vec<Vec<Bytes>>>,
}

impl Transaction {
    /// The reply to `args` if it is a transaction command or queued by `MULTI`; `None` for
    /// a command to run now.
    fn handle(&mut self, node: &Shared, args: &[Bytes]) -> Option<Reply> {
        let name = args[0].to_ascii_uppercase();
        let reply = match (name.as_slice(), self.queued.as_mut()) {
            (b"MULTI", Some(_)) => Reply::error("ERR MULTI calls can not be nested"),
            (b"MULTI", None) => {
                self.queued = Some(Vec::new());
                Reply::ok()
            }
            (b"WATCH", Some(_)) => Reply::error("ERR WATCH inside MULTI is not allowed"),
            (b"WATCH", None) if args.len() < 2 => {
                Reply::error("ERR wrong number of arguments for 'watch' command")
            }
            (b"WATCH", None) => {
                for key in &args[1..] {
                    self.watched.push((key.clone(), node.watch(key)));
                }
                Reply::ok()
            }
            (b"UNWATCH", _) => {
                self.watched.clear();
                Reply::ok()
            }
            (b"DISCARD", None) => Reply::error("ERR DISCARD without MULTI"),
            (b"DISCARD", Some(_)) => {
                self.queued = None;
                self.watched.clear();
                Reply::ok()
            }
            (b"EXEC", None) => Reply::error("ERR EXEC without MULTI"),
            (b"EXEC", Some(_)) => {
                let queued = self.queued.take().unwrap_or_default();
                let reply = node.exec(&self.watched, &queued);
                self.watched.clear();
                reply
            }
            (_, Some(queued)) => {
                queued.push(args.to_vec());
                Reply::Status(Bytes::from_static(b"QUEUED"))
            }
            (_, None) => return None,
        };
        Some(reply)
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

    /// A RESP request from words.
    fn resp(words: &[&str]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            out.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
        }
        out
    }

    #[tokio::test]
    async fn exec_runs_the_queue_unless_a_watched_key_changed_meanwhile() {
        let node = node();
        node.execute(["SET", "k", "1"]);
        // Untouched: the queue runs, atomically, and answers its replies.
        let mut input = resp(&["WATCH", "k"]);
        input.extend(resp(&["MULTI"]));
        input.extend(resp(&["SET", "k", "2", "PX", "1000"]));
        input.extend(resp(&["GET", "k"]));
        input.extend(resp(&["EXEC"]));
        let output = exchange(&node, &input).await;
        assert_eq!(
            output,
            b"+OK\r\n+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n$1\r\n2\r\n"
        );
        // Written by another client between WATCH and EXEC: nothing runs, the answer is nil.
        let (mut client, server) = duplex(1 << 16);
        let serving = tokio::spawn(serve_connection(server, node.clone()));
        client
            .write_all(&resp(&["WATCH", "k"]))
            .await
            .expect("write");
        let mut first = [0u8; 5];
        client.read_exact(&mut first).await.expect("read");
        assert_eq!(&first, b"+OK\r\n");
        node.execute(["SET", "k", "3"]);
        let mut rest = resp(&["MULTI"]);
        rest.extend(resp(&["SET", "k", "4"]));
        rest.extend(resp(&["EXEC"]));
        client.write_all(&rest).await.expect("write");
        client.shutdown().await.expect("shutdown");
        let mut output = Vec::new();
        client.read_to_end(&mut output).await.expect("read");
        serving.await.expect("join").expect("serve");
        assert_eq!(output, b"+OK\r\n+QUEUED\r\n$-1\r\n");
        assert_eq!(node.execute(["GET", "k"]), Reply::bulk("3"));
        // Misuse answers Redis's errors.
        let output = exchange(
            &node,
            &[
                resp(&["EXEC"]),
                resp(&["MULTI"]),
                resp(&["MULTI"]),
                resp(&["WATCH", "k"]),
            ]
            .concat(),
        )
        .await;
        assert_eq!(
            output,
            b"-ERR EXEC without MULTI\r\n+OK\r\n-ERR MULTI calls can not be nested\r\n-ERR WATCH inside MULTI is not allowed\r\n"
        );
    }
}
