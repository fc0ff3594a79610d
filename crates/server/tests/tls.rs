//! TLS on both listeners, with client certificates required: the `rein-server` binary
//! started with `--tls-cert`, `--tls-key` and `--tls-client-ca` (test certificates in
//! `tests/tls/`: a CA, a server certificate for localhost and 127.0.0.1, a client
//! certificate). A client with a certificate from the CA is served over gRPC and HTTPS; one
//! without, or speaking plain text, is not, and the server keeps serving. At SIGTERM an
//! HTTPS request in flight is answered before the process exits.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use support::{Running, free_addr, wait_for_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tls")
        .join(name)
}

struct Server {
    child: Running,
    grpc: SocketAddr,
    http: SocketAddr,
}

fn start() -> Server {
    let (grpc, http) = (free_addr(), free_addr());
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/config");
    let child = support::server(&rules, grpc, http)
        .args(["--tls-cert", &tls_file("server.crt").display().to_string()])
        .args(["--tls-key", &tls_file("server.key").display().to_string()])
        .args(["--tls-client-ca", &tls_file("ca.crt").display().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rein-server");
    wait_for_port(http, "rein-server (HTTPS)", None);
    wait_for_port(grpc, "rein-server (gRPC)", None);
    Server {
        child: Running(child),
        grpc,
        http,
    }
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "example".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![rate_limit_descriptor::Entry {
                key: "remote_address".into(),
                value: "10.0.0.1".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn grpc_client(
    addr: SocketAddr,
    with_identity: bool,
) -> Result<Channel, tonic::transport::Error> {
    let ca = std::fs::read(tls_file("ca.crt")).expect("ca");
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if with_identity {
        let cert = std::fs::read(tls_file("client.crt")).expect("client cert");
        let key = std::fs::read(tls_file("client.key")).expect("client key");
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// `POST /json` over TLS; the answer's text, or the error.
/// A TLS connection to `addr`, with the test client's certificate or without.
async fn https_connect(
    addr: SocketAddr,
    with_identity: bool,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls_file("ca.crt")).expect("ca") {
        roots.add(cert.expect("ca cert")).expect("add");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let config = if with_identity {
        let certs = CertificateDer::pem_file_iter(tls_file("client.crt"))
            .expect("cert")
            .collect::<Result<Vec<_>, _>>()
            .expect("certs");
        let key = PrivateKeyDer::from_pem_file(tls_file("client.key")).expect("key");
        builder.with_client_auth_cert(certs, key).expect("identity")
    } else {
        builder.with_no_client_auth()
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("name");
    connector.connect(name, stream).await
}

const BODY: &str = r#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.2"}]}]}"#;

/// `POST /json` over a new TLS connection: its head and body, to send.
fn json_request() -> String {
    format!(
        "POST /json HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    )
}

async fn https_json(addr: SocketAddr, with_identity: bool) -> std::io::Result<String> {
    let mut tls = https_connect(addr, with_identity).await?;
    tls.write_all(json_request().as_bytes()).await?;
    let mut text = String::new();
    tls.read_to_string(&mut text).await?;
    Ok(text)
}

#[tokio::test]
async fn both_listeners_speak_tls_and_require_a_client_certificate() {
    let server = start();

    // gRPC with a client certificate: served.
    let channel = grpc_client(server.grpc, true).await.expect("a TLS channel");
    let answer = RateLimitServiceClient::new(channel)
        .should_rate_limit(request())
        .await
        .expect("an answer over mutual TLS")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);

    // gRPC without one: the handshake or the call fails.
    let refused = match grpc_client(server.grpc, false).await {
        Err(_) => true,
        Ok(channel) => RateLimitServiceClient::new(channel)
            .should_rate_limit(request())
            .await
            .is_err(),
    };
    assert!(refused, "a client without a certificate was served");

    // HTTPS with a client certificate: served.
    let text = https_json(server.http, true)
        .await
        .expect("an HTTPS answer");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains(r#""overallCode":"OK""#), "{text}");

    // HTTPS without one, and plain HTTP: no answer.
    let without = https_json(server.http, false).await;
    assert!(
        without.as_ref().map_or(true, |t| !t.contains("200 OK")),
        "served without a client certificate: {without:?}"
    );
    let mut plain = tokio::net::TcpStream::connect(server.http)
        .await
        .expect("connect");
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send");
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut reply)).await;
    assert!(
        !String::from_utf8_lossy(&reply).contains("200 OK"),
        "plain text served"
    );

    // And it still serves the client that presents its certificate.
    let text = https_json(server.http, true).await.expect("still serving");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// SIGTERM while an HTTPS request is half received: the server stops accepting, answers
/// that request once its body arrives, and exits cleanly. Before, the HTTPS listener
/// returned at once and the runtime's end cut the connection.
#[tokio::test]
async fn sigterm_answers_the_https_request_in_flight_then_exits() {
    let mut server = start();
    let mut tls = https_connect(server.http, true).await.expect("connect");
    let request = json_request();
    let (head, rest) = request.split_at(request.len() - BODY.len() / 2);
    tls.write_all(head.as_bytes()).await.expect("send the head");
    tls.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_millis(200)).await;
    support::signal(server.child.id(), "TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    tls.write_all(rest.as_bytes()).await.expect("send the rest");
    let mut text = String::new();
    let _ = tls.read_to_string(&mut text).await;
    assert!(
        text.starts_with("HTTP/1.1 200"),
        "the request in flight: {text:?}"
    );
    let exited = support::exit_status(&mut server.child, Duration::from_secs(15));
    assert!(exited.success(), "{exited:?}");
}

#[test]
fn an_unreadable_certificate_stops_the_start_with_its_path() {
    let output = Command::new(env!("CARGO_BIN_EXE_rein-server"))
        .args([
            "--config",
            &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("examples/config")
                .display()
                .to_string(),
        ])
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--tls-cert", "/nonexistent/server.crt"])
        .args(["--tls-key", &tls_file("server.key").display().to_string()])
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/server.crt"), "{stderr}");
}
