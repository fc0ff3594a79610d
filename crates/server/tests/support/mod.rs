//! What the tests that run `rein-server` as a process share: ports, waiting for a listener,
//! a scratch directory, and `POST /json` and `GET` over plain HTTP.

#![allow(dead_code)] // Each test binary uses its own part.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// `rein-server` reading its rules from `config` (a file or a directory) and listening for
/// gRPC on `grpc` and HTTP on `http`; the caller adds the rest and spawns it.
pub fn server(config: &Path, grpc: SocketAddr, http: SocketAddr) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rein-server"));
    command
        .args(["--config", &config.display().to_string()])
        .args([
            "--grpc-addr",
            &grpc.to_string(),
            "--http-addr",
            &http.to_string(),
        ]);
    command
}

/// A port nobody listens on now (the OS's choice; taken back at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A loopback address on a free port.
pub fn free_addr() -> SocketAddr {
    ([127, 0, 0, 1], free_port()).into()
}

/// Waits until `addr` accepts connections, or fails naming `what` and its log (if any).
pub fn wait_for_port(addr: SocketAddr, what: &str, log: Option<&Path>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} did not listen on {addr}:\n{}",
            log.and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A fresh directory under the system's temporary one, named for `name` and this process.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rein-server-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `POST /json` with `body` on a new plain-HTTP connection; the whole answer as text.
pub fn post_json(http: SocketAddr, body: &str) -> String {
    let head = format!("POST /json HTTP/1.1\r\ncontent-length: {}\r\n", body.len());
    exchange(http, &head, body)
}

/// `GET path` on a new plain-HTTP connection; the whole answer as text.
pub fn get(http: SocketAddr, path: &str) -> String {
    exchange(http, &format!("GET {path} HTTP/1.1\r\n"), "")
}

/// Sends a request of `head` (its request line and headers but `host` and `connection`)
/// and `body`, the connection closed after the answer; the whole answer as text.
fn exchange(http: SocketAddr, head: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(http).expect("connect");
    let request = format!("{head}host: t\r\nconnection: close\r\n\r\n{body}");
    stream.write_all(request.as_bytes()).expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    text
}

/// Sends signal `name` (`HUP`, `TERM`) to process `pid`.
pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// How `child` exited, waiting at most `within` for it (a failure after that).
pub fn exit_status(child: &mut std::process::Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process that is killed (and reaped) when dropped, a failing test's included, so
/// no server outlives its test.
pub struct Running(pub std::process::Child);

impl std::ops::Deref for Running {
    type Target = std::process::Child;

    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
