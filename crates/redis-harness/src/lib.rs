//! Private `redis-server` processes for tests: rein's tests never touch a shared Redis.
//!
//! [`RedisServer::start`] spawns `redis-server` on a free loopback port with persistence
//! off and its own working directory, waits until it answers `PING`, and kills it when
//! dropped. [`RedisCluster::start`] does the same for three masters joined with
//! `redis-cli --cluster create`. Faults are process-level and real: [`RedisServer::pause`]
//! (`SIGSTOP`), [`RedisServer::resume`], [`RedisServer::kill`] and [`RedisServer::restart`]
//! (same port, empty dataset).
//!
//! A missing binary is an error whose message says how to install it; tests `expect` it,
//! so they fail loudly instead of skipping.
//!
//! Faults a process cannot give on cue (a store that answers some keys and not others,
//! late by a set delay, or never) come from [`Faulty`], a double around any rein store.
#![deny(missing_docs)]

pub mod faulty;

pub use faulty::{Fault, Faulty};

/// The least-privilege user docs/redis.md recommends (its "TLS, AUTH and a least-privilege
/// user"), as an `ACL SETUSER` command: `rein` with the password `pw`, on the keys
/// `~rein:*`; a Cluster's adds [`CLUSTER_PRIVILEGE`].
pub const LEAST_PRIVILEGE: [&str; 17] = [
    "ACL",
    "SETUSER",
    "rein",
    "reset",
    "on",
    ">pw",
    "~rein:*",
    "-@all",
    "+evalsha",
    "+eval",
    "+script|load",
    "+time",
    "+get",
    "+set",
    "+del",
    "+incrby",
    "+pexpire",
];

/// What a Cluster's least-privilege user needs besides [`LEAST_PRIVILEGE`]: the topology,
/// and `ASKING` to follow a slot's migration.
pub const CLUSTER_PRIVILEGE: [&str; 2] = ["+cluster|slots", "+asking"];

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// A loopback TCP proxy for tests. Each connection made through it goes to its target of
/// the moment ([`retarget`](Self::retarget): a managed failover moving an address to a new
/// primary, while connections already made stay with the old one), and each chunk a client
/// sends is held for `delay` (a slow tunnel). Its threads live as long as the test
/// process; a refused bind is a panic, as for a test fixture.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    target: std::sync::Arc<std::sync::Mutex<SocketAddr>>,
}

impl Proxy {
    /// A proxy to `target`, holding each chunk a client sends for `delay`.
    pub fn start(target: SocketAddr, delay: Duration) -> Self {
        use std::net::Shutdown;
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
        let now = std::sync::Arc::clone(&target);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let to = *now
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let Ok(server) = TcpStream::connect(to) else {
                    continue;
                };
                let (Ok(mut from_client), Ok(mut to_server)) =
                    (client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while let Ok(n @ 1..) = from_client.read(&mut buf) {
                        if !delay.is_zero() {
                            std::thread::sleep(delay);
                        }
                        if to_server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown(Shutdown::Write);
                });
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || std::io::copy(&mut from_server, &mut to_client));
            }
        });
        Self { addr, target }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends the connections made from now on to `target`.
    pub fn retarget(&self, target: SocketAddr) {
        *self
            .target
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = target;
    }
}

/// `command`'s figures in the text of `INFO commandstats` (lower case, e.g. `"evalsha"`):
/// zeros when the section has no line for it (never run), an error when the text is not that
/// section or the line does not read as `cmdstat_<command>:calls=N,usec=N,...`, so that a
/// changed format fails a test instead of reading as zero.
pub fn parse_commandstat(info: &str, command: &str) -> Result<CommandStat, HarnessError> {
    if !info.contains("# Commandstats") {
        return Err(HarnessError::Format(format!(
            "no `# Commandstats` section in {info:?}"
        )));
    }
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|l| l.strip_prefix(prefix.as_str())) else {
        return Ok(CommandStat { calls: 0, usec: 0 });
    };
    let field = |name: &str| -> Result<u64, HarnessError> {
        line.trim_end()
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                HarnessError::Format(format!("no `{name}=N` in cmdstat_{command}:{line}"))
            })
    };
    Ok(CommandStat {
        calls: field("calls")?,
        usec: field("usec")?,
    })
}

/// Why a server could not be started or controlled.
#[derive(Debug)]
pub enum HarnessError {
    /// `redis-server` or `redis-cli` is not on `PATH`.
    MissingBinary(&'static str),
    /// The server did not answer `PING` (or the cluster did not converge) in time.
    NotReady(String),
    /// Spawning or signalling the process failed.
    Io(std::io::Error),
    /// A reply the harness reads (`INFO commandstats`) is not in the format it knows: a
    /// test that counted commands from it would read zeros and pass for nothing.
    Format(String),
}

impl std::fmt::Display for HarnessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HarnessError::MissingBinary(bin) => write!(
                f,
                "`{bin}` was not found on PATH. rein's Redis tests start their own private \
                 server; install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu) \
                 and run the tests again"
            ),
            HarnessError::NotReady(why) => write!(f, "redis-server did not become ready: {why}"),
            HarnessError::Io(e) => write!(f, "redis-server process error: {e}"),
            HarnessError::Format(what) => write!(f, "unexpected reply format: {what}"),
        }
    }
}

impl std::error::Error for HarnessError {}

impl From<std::io::Error> for HarnessError {
    fn from(e: std::io::Error) -> Self {
        HarnessError::Io(e)
    }
}

/// One private `redis-server` process on `127.0.0.1`.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra_args: Vec<String>,
    child: Option<Child>,
    /// Kills the server if this process dies without dropping it (a panic that aborts, a
    /// killed test run, or a server kept in a `static`, which is never dropped).
    watchdog: Option<Child>,
}

impl RedisServer {
    /// Starts a standalone server on a free port.
    pub fn start() -> Result<Self, HarnessError> {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (e.g. `["--requirepass", "x"]`).
    pub fn start_with(extra_args: &[&str]) -> Result<Self, HarnessError> {
        let extra_args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let mut last_error = None;
        // A port found free can be taken before the server binds it; try a few.
        for _ in 0..5 {
            let port = free_port(false)?;
            let dir = work_dir(port)?;
            let mut server = Self {
                port,
                dir,
                extra_args: extra_args.clone(),
                child: None,
                watchdog: None,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e @ HarnessError::MissingBinary(_)) => return Err(e),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| HarnessError::NotReady("no free port".into())))
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The socket address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Freezes the process (`SIGSTOP`): connections stay open, nothing is answered.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("-STOP")
    }

    /// Thaws a paused process (`SIGCONT`).
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("-CONT")
    }

    /// Kills the process; the dataset is lost (persistence is off).
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        if let Some(mut child) = self.child.take() {
            // A stopped process must be continued to act on SIGKILL promptly everywhere.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Kills the process if running, then starts a fresh one on the same port.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                // The old socket may linger for a moment.
                Err(HarnessError::NotReady(_)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one command in RESP and returns the raw reply (for test setup, not for rein).
    pub fn command(&self, args: &[&str]) -> Result<String, HarnessError> {
        raw_command(self.port, args)
    }

    /// How many times the server has run `command` (lower case, e.g. `"evalsha"`), from
    /// `INFO commandstats`; 0 if never.
    pub fn commandstat_calls(&self, command: &str) -> Result<u64, HarnessError> {
        Ok(self.commandstat(command)?.calls)
    }

    /// `command`'s line of `INFO commandstats` (lower case, e.g. `"evalsha"`): its calls and
    /// the µs spent in them; zeros if never run.
    pub fn commandstat(&self, command: &str) -> Result<CommandStat, HarnessError> {
        parse_commandstat(&self.command(&["INFO", "commandstats"])?, command)
    }

    fn spawn(&mut self) -> Result<(), HarnessError> {
        let port = self.port.to_string();
        let dir = self.dir.to_string_lossy().into_owned();
        let mut args = vec![
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir,
            "--protected-mode",
            "no",
            "--loglevel",
            "warning",
        ];
        args.extend(self.extra_args.iter().map(String::as_str));
        let child = Command::new("redis-server")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(not_started("redis-server"))?;
        self.watchdog = spawn_watchdog(child.id());
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(reply) = raw_command(self.port, &["PING"])
                && (reply.starts_with("+PONG") || reply.starts_with("-NOAUTH"))
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(HarnessError::NotReady(format!("exited with {status}")));
            }
            if Instant::now() > deadline {
                let _ = self.kill();
                return Err(HarnessError::NotReady("no PONG within 5 s".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, sig: &str) -> Result<(), HarnessError> {
        let child = self
            .child
            .as_ref()
            .ok_or_else(|| HarnessError::NotReady("not running".into()))?;
        let status = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::NotReady(format!("kill {sig} failed")))
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A local Redis Cluster of three masters (no replicas), each a [`RedisServer`].
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers and joins them, covering all 16384 slots.
    pub fn start() -> Result<Self, HarnessError> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let mut last_error = None;
            let mut started = None;
            for _ in 0..5 {
                // The cluster bus listens on port + 10000, so both must be free.
                let port = free_port(true)?;
                let dir = work_dir(port)?;
                let args = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ];
                let mut server = RedisServer {
                    port,
                    dir,
                    extra_args: args.iter().map(|s| s.to_string()).collect(),
                    child: None,
                    watchdog: None,
                };
                match server.spawn() {
                    Ok(()) => {
                        started = Some(server);
                        break;
                    }
                    Err(e @ HarnessError::MissingBinary(_)) => return Err(e),
                    Err(e) => last_error = Some(e),
                }
            }
            nodes.push(started.ok_or_else(|| {
                last_error.unwrap_or_else(|| HarnessError::NotReady("no free port".into()))
            })?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let status = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(not_started("redis-cli"))?;
        if !status.success() {
            return Err(HarnessError::NotReady(format!(
                "redis-cli --cluster create: {status}"
            )));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|n| {
            n.command(&["CLUSTER", "INFO"])
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        }) {
            if Instant::now() > deadline {
                return Err(HarnessError::NotReady(
                    "cluster_state never became ok".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self { nodes })
    }

    /// `redis://127.0.0.1:PORT/` of every node, as the cluster client's seed list.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}

/// The error of a command that did not start: [`HarnessError::MissingBinary`] naming `bin`
/// when it is not installed (the message says how to install it), else the I/O error.
fn not_started(bin: &'static str) -> impl FnOnce(std::io::Error) -> HarnessError {
    move |e| match e.kind() {
        std::io::ErrorKind::NotFound => HarnessError::MissingBinary(bin),
        _ => HarnessError::Io(e),
    }
}

/// A shell loop that kills `server` once this process is gone. `None` if `sh` is missing:
/// the server is then only stopped by `Drop`.
fn spawn_watchdog(server: u32) -> Option<Child> {
    let script = format!(
        "while kill -0 {} 2>/dev/null; do sleep 0.5; done; kill -9 {server} 2>/dev/null",
        std::process::id()
    );
    Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// A port on 127.0.0.1 that was free a moment ago (and, if `with_bus`, port + 10000 too).
fn free_port(with_bus: bool) -> Result<u16, HarnessError> {
    // Walk a process-specific sequence rather than asking the OS for an ephemeral port:
    // ephemeral ports sit above 32768, where port + 10000 can overflow.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 2_000) as u16 * 10;
    for _ in 0..2_000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % 20_000;
        let port = 20_000 + (base - 20_000 + offset) % 20_000;
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && (!with_bus || free(port + 10_000)) {
            return Ok(port);
        }
    }
    Err(HarnessError::NotReady("no free loopback port found".into()))
}

fn work_dir(port: u16) -> Result<PathBuf, HarnessError> {
    let dir = std::env::temp_dir().join(format!("rein-redis-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn raw_command(port: u16, args: &[&str]) -> Result<String, HarnessError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    // Test-setup replies are small; read until a complete line-terminated reply arrives.
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buf[..n]);
        if reply_complete(&reply) {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Whether `reply` holds one whole simple or bulk reply.
fn reply_complete(reply: &[u8]) -> bool {
    let Some(line_end) = reply.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    match reply.first() {
        Some(b'$') => {
            let len: i64 = std::str::from_utf8(&reply[1..line_end])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            len < 0 || reply.len() >= line_end + 2 + len as usize + 2
        }
        _ => true,
    }
}

/// One command's counters from `INFO commandstats` ([`RedisServer::commandstat`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandStat {
    /// Times the command ran.
    pub calls: u64,
    /// µs spent running it, in all.
    pub usec: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_starts_answers_and_restarts_empty() {
        let mut server = RedisServer::start().expect("start redis-server");
        assert!(
            server
                .command(&["SET", "k", "v"])
                .unwrap()
                .starts_with("+OK")
        );
        server.restart().unwrap();
        assert_eq!(server.command(&["DBSIZE"]).unwrap(), ":0\r\n");
    }

    #[test]
    fn cluster_starts_with_all_slots() {
        let cluster = RedisCluster::start().expect("start redis cluster");
        let info = cluster.nodes()[0].command(&["CLUSTER", "INFO"]).unwrap();
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    }
}

#[cfg(test)]
mod commandstat_tests {
    use super::*;

    #[test]
    fn a_changed_format_is_an_error_not_zero_calls() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=42,usec=840,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(
            parse_commandstat(info, "evalsha").expect("known format"),
            CommandStat {
                calls: 42,
                usec: 840
            }
        );
        // Never run: no line, zeros.
        assert_eq!(
            parse_commandstat(info, "exec").expect("known format"),
            CommandStat::default()
        );
        // Not the section, or a line in another shape: errors.
        assert!(parse_commandstat("# Server\r\nredis_version:7.0.15\r\n", "exec").is_err());
        let other = "# Commandstats\r\ncmdstat_exec:count=3;time=9\r\n";
        assert!(parse_commandstat(other, "exec").is_err());
    }
}
