//! [`KeySource`]: where a request's rate-limit key comes from.
//!
//! The key decides whose limit a request counts against, so getting it wrong is either a
//! bypass (a client that picks its own key gets a fresh limit per request) or a denial of
//! service (everybody lands in one bucket). Two rules follow:
//!
//! - **Forwarding headers are trusted only as far as configured.** `X-Forwarded-For` and
//!   `Forwarded` are written by the client first and appended to by each proxy, so only the
//!   entries the operator's own proxies appended can be believed. With `trusted_hops = n`
//!   the key is the `n`-th entry from the right, the address the outermost trusted proxy
//!   saw; anything a client wrote further left is never read. With `n = 0` the headers are
//!   ignored and the peer address is the key.
//! - **No key is not a key.** When the source has nothing (no peer address, no header, too
//!   few forwarding entries for the trusted hops, an entry that is not an IP address), the
//!   extractor returns `None` and the layer gives the configured answer; it never falls back
//!   to a shared bucket by itself. Use [`KeySource::fixed`] where one shared bucket is
//!   what you want.

use std::borrow::Cow;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::header::{FORWARDED, HeaderName};
use http::request::Parts;

/// The peer's socket address, as a request extension, for servers other than axum (with
/// plain hyper, insert it per connection). axum's `ConnectInfo<SocketAddr>` is read too,
/// with the `axum` feature (on by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerAddr(pub SocketAddr);

/// Where a request's key comes from. Cheap to clone.
///
/// ```
/// use http::Request;
/// use rein_tower::{KeySource, PeerAddr};
///
/// let request = Request::builder()
///     .header("x-forwarded-for", "203.0.113.9, 10.0.0.7")
///     .extension(PeerAddr("10.0.0.8:41000".parse()?))
///     .body(())?;
/// let (parts, ()) = request.into_parts();
/// // No trusted proxy: the header is ignored, the peer is the client.
/// assert_eq!(KeySource::peer_ip().extract(&parts).as_deref(), Some(&b"10.0.0.8"[..]));
/// // Two trusted proxies (10.0.0.7 appended by the outer one, 10.0.0.8 is the inner one).
/// assert_eq!(
///     KeySource::x_forwarded_for(2).extract(&parts).as_deref(),
///     Some(&b"203.0.113.9"[..])
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct KeySource(Source);

#[derive(Clone)]
enum Source {
    Peer,
    Header(HeaderName),
    XForwardedFor(u8),
    Forwarded(u8),
    Fixed(Arc<[u8]>),
    Custom(Extract),
}

type Extract = Arc<dyn Fn(&Parts) -> Option<Vec<u8>> + Send + Sync>;

impl KeySource {
    /// The peer's IP address (without the port), from [`PeerAddr`] or axum's
    /// `ConnectInfo<SocketAddr>`. Behind a proxy every request has the proxy's address: use
    /// [`x_forwarded_for`](Self::x_forwarded_for) or [`forwarded`](Self::forwarded) there.
    pub fn peer_ip() -> Self {
        Self(Source::Peer)
    }

    /// The value of header `name`, as bytes (an API key). Missing or empty is no key; a
    /// header sent several times counts by its first value.
    pub fn header(name: HeaderName) -> Self {
        Self(Source::Header(name))
    }

    /// The client IP from `X-Forwarded-For`, behind `trusted_hops` proxies of your own: the
    /// `trusted_hops`-th entry from the right. `0` ignores the header and uses the peer
    /// address. Fewer entries than hops, or an entry that is not an IP address, is no key.
    ///
    /// Only correct if every request reaches the server through exactly that many of your
    /// proxies, each appending to the header; a client that can connect directly can choose
    /// its key.
    pub fn x_forwarded_for(trusted_hops: u8) -> Self {
        Self(Source::XForwardedFor(trusted_hops))
    }

    /// As [`x_forwarded_for`](Self::x_forwarded_for), from the `for=` parameters of the
    /// standard `Forwarded` header (RFC 7239). Obfuscated identifiers (`_hidden`,
    /// `unknown`) are no key.
    pub fn forwarded(trusted_hops: u8) -> Self {
        Self(Source::Forwarded(trusted_hops))
    }

    /// The same key for every request: one bucket shared by all clients, on purpose (a
    /// global limit on an expensive endpoint).
    pub fn fixed(key: impl Into<Vec<u8>>) -> Self {
        Self(Source::Fixed(key.into().into()))
    }

    /// A key from a request extension of type `T`, such as an authenticated user inserted
    /// by an auth layer that runs first. No extension is no key.
    pub fn extension<T, F>(key: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> Vec<u8> + Send + Sync + 'static,
    {
        Self::from_fn(move |parts| parts.extensions.get::<T>().map(&key))
    }

    /// A key computed by `key` from the request's head; `None` is no key.
    pub fn from_fn<F>(key: F) -> Self
    where
        F: Fn(&Parts) -> Option<Vec<u8>> + Send + Sync + 'static,
    {
        Self(Source::Custom(Arc::new(key)))
    }

    /// The key of the request whose head is `parts`, or `None` if it has none. An empty
    /// value is returned as such; the layer treats it as no key.
    pub fn extract<'a>(&'a self, parts: &'a Parts) -> Option<Cow<'a, [u8]>> {
        match &self.0 {
            Source::Peer => peer_ip(parts).map(ip_key),
            Source::Header(name) => parts
                .headers
                .get(name)
                .map(|value| Cow::Borrowed(value.as_bytes())),
            Source::XForwardedFor(0) | Source::Forwarded(0) => peer_ip(parts).map(ip_key),
            Source::XForwardedFor(hops) => nth_from_right(entries(parts, &X_FORWARDED_FOR), *hops)
                .and_then(parse_ip)
                .map(ip_key),
            Source::Forwarded(hops) => nth_from_right(entries(parts, &FORWARDED), *hops)
                .and_then(forwarded_for)
                .and_then(parse_ip)
                .map(ip_key),
            Source::Fixed(key) => Some(Cow::Borrowed(&key[..])),
            Source::Custom(extract) => extract(parts).map(Cow::Owned),
        }
    }
}

impl KeySource {
    /// Whether keys from `self` and from `other`, counted under one policy, could be the
    /// same bytes for different clients: a header's value, which the client writes, can be
    /// another client's address, another header's value or a fixed key, and so spend that
    /// limit. Addresses and fixed keys are not the client's to choose: the peer address and
    /// the forwarding headers all name a client by its address, and share keys as they
    /// should. A custom function's keys are its own to keep apart: never reported.
    pub(crate) fn mixes_with(&self, other: &KeySource) -> bool {
        match (&self.0, &other.0) {
            (Source::Custom(_), _) | (_, Source::Custom(_)) => false,
            (Source::Header(a), Source::Header(b)) => a != b,
            (Source::Header(_), _) | (_, Source::Header(_)) => true,
            _ => false,
        }
    }

    /// The source in a config file's words, for error messages.
    pub(crate) fn describe(&self) -> String {
        match &self.0 {
            Source::Peer => "the peer address".into(),
            Source::Header(name) => format!("header {name}"),
            Source::XForwardedFor(hops) => format!("x-forwarded-for ({hops} trusted hops)"),
            Source::Forwarded(hops) => format!("forwarded ({hops} trusted hops)"),
            Source::Fixed(key) => format!("the fixed key {:?}", String::from_utf8_lossy(key)),
            Source::Custom(_) => "a key function".into(),
        }
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Peer => f.write_str("KeySource::peer_ip()"),
            Source::Header(name) => write!(f, "KeySource::header({name:?})"),
            Source::XForwardedFor(hops) => write!(f, "KeySource::x_forwarded_for({hops})"),
            Source::Forwarded(hops) => write!(f, "KeySource::forwarded({hops})"),
            Source::Fixed(key) => write!(f, "KeySource::fixed({:?})", String::from_utf8_lossy(key)),
            Source::Custom(_) => f.write_str("KeySource::from_fn(..)"),
        }
    }
}

/// The peer's IP address from rein-tower's or axum's extension.
fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = parts.extensions.get::<PeerAddr>() {
        return Some(addr.ip());
    }
    #[cfg(feature = "axum")]
    if let Some(axum::extract::ConnectInfo(addr)) = parts
        .extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
    {
        return Some(addr.ip());
    }
    no_peer_address();
    None
}

/// Logs, once per process, that a request carried no peer address: the server was started
/// without passing it, so every peer-keyed route answers `on_missing_key`. Per request it
/// would flood the log; never, and the cause stays hidden behind a 500.
fn no_peer_address() {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| {
        tracing::error!(
            "rein-tower: a request has no peer address, so every route keyed by the peer IP \
             answers on_missing_key (500 by default). With axum, serve \
             `app.into_make_service_with_connect_info::<std::net::SocketAddr>()`; with plain \
             hyper, insert rein_tower::PeerAddr into each request's extensions. Logged once \
             per process."
        );
    });
}

/// The key of an IP address: its canonical text, so that `::ffff:1.2.3.4` and `1.2.3.4`
/// are one client.
fn ip_key(ip: IpAddr) -> Cow<'static, [u8]> {
    Cow::Owned(ip.to_canonical().to_string().into_bytes())
}

/// The entry `hops` places from the right (1 is the last), if there are that many: read
/// from the right, so a long client-written left part costs nothing.
fn nth_from_right<'a>(
    mut entries: impl DoubleEndedIterator<Item = &'a [u8]>,
    hops: u8,
) -> Option<&'a str> {
    let entry = entries.nth_back(usize::from(hops).checked_sub(1)?)?;
    Some(std::str::from_utf8(entry).ok()?.trim())
}

/// The comma-separated entries of every `name` header, as bytes. A value is split before
/// it is decoded: a client can write any byte into the part of a forwarding header it
/// controls (the left), and that must not cost the entries trusted proxies appended to the
/// same line. Only the entry chosen must be text.
fn entries<'a>(parts: &'a Parts, name: &HeaderName) -> impl DoubleEndedIterator<Item = &'a [u8]> {
    parts
        .headers
        .get_all(name)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
}

/// The `for=` value of one `Forwarded` element, unquoted.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim().trim_matches('"'))
    })
}

/// An IP address from a forwarding entry: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`,
/// `[2001:db8::1]` or `[2001:db8::1]:80`.
fn parse_ip(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    entry
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .and_then(|inner| inner.parse().ok())
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(headers: &[(&str, &str)], peer: Option<&str>) -> Parts {
        let mut request = Request::builder();
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(peer) = peer {
            request = request.extension(PeerAddr(peer.parse().unwrap()));
        }
        request.body(()).unwrap().into_parts().0
    }

    fn key(source: &KeySource, parts: &Parts) -> Option<String> {
        source
            .extract(parts)
            .map(|k| String::from_utf8(k.into_owned()).unwrap())
    }

    /// Checks the key `source` takes from `request` with each number of trusted hops.
    fn assert_keys(request: &Parts, source: fn(u8) -> KeySource, expected: &[(u8, Option<&str>)]) {
        for &(hops, want) in expected {
            let source = source(hops);
            assert_eq!(key(&source, request).as_deref(), want, "{source:?}");
        }
    }

    #[test]
    fn without_trusted_hops_forwarding_headers_change_nothing() {
        let spoofed = parts(
            &[("x-forwarded-for", "1.2.3.4"), ("forwarded", "for=5.6.7.8")],
            Some("192.0.2.1:5000"),
        );
        for source in [
            KeySource::peer_ip(),
            KeySource::x_forwarded_for(0),
            KeySource::forwarded(0),
        ] {
            assert_eq!(
                key(&source, &spoofed).as_deref(),
                Some("192.0.2.1"),
                "{source:?}"
            );
        }
    }

    #[test]
    fn a_client_written_byte_that_is_not_text_costs_no_trusted_entry() {
        // The client's own line ends with the address its proxy appended (as nginx's
        // `$proxy_add_x_forwarded_for` writes it); the client put a byte ≥ 0x80 in its part.
        let mut request = Request::builder();
        for (name, value) in [
            ("x-forwarded-for", &b"6.6.6.6\xff, 198.51.100.7"[..]),
            ("forwarded", &b"for=\"\xfe\", for=198.51.100.8"[..]),
        ] {
            let value = http::HeaderValue::from_bytes(value).unwrap();
            request = request.header(name, value);
        }
        let request = request.body(()).unwrap().into_parts().0;
        let x = [(1, Some("198.51.100.7")), (2, None)];
        assert_keys(&request, KeySource::x_forwarded_for, &x);
        let forwarded = [(1, Some("198.51.100.8")), (2, None)];
        assert_keys(&request, KeySource::forwarded, &forwarded);
    }

    #[test]
    fn trusted_hops_read_only_what_trusted_proxies_appended() {
        // The client wrote "6.6.6.6"; proxy 1 appended the client's real address, proxy 2
        // appended proxy 1's.
        let request = parts(
            &[
                ("x-forwarded-for", "6.6.6.6, 198.51.100.7"),
                ("x-forwarded-for", "10.0.0.1"),
            ],
            Some("10.0.0.2:1"),
        );
        let expected = [
            (2, Some("198.51.100.7")),
            (1, Some("10.0.0.1")),
            // More hops than entries: no key, never the leftmost (client-written) entry.
            (4, None),
        ];
        assert_keys(&request, KeySource::x_forwarded_for, &expected);
    }

    #[test]
    fn forwarded_for_parameters_are_parsed_with_ports_and_brackets() {
        let request = parts(
            &[(
                "forwarded",
                r#"for=192.0.2.60;proto=http, For="[2001:db8:cafe::17]:4711";by=x, for=_hidden"#,
            )],
            None,
        );
        let expected = [
            (3, Some("192.0.2.60")),
            (2, Some("2001:db8:cafe::17")),
            (1, None),
        ];
        assert_keys(&request, KeySource::forwarded, &expected);
    }

    #[test]
    fn missing_sources_are_no_key() {
        let bare = parts(&[], None);
        assert_eq!(key(&KeySource::peer_ip(), &bare), None);
        assert_eq!(
            key(
                &KeySource::header(HeaderName::from_static("x-api-key")),
                &bare
            ),
            None
        );
        assert_eq!(key(&KeySource::x_forwarded_for(1), &bare), None);
        assert_eq!(key(&KeySource::fixed("all"), &bare).as_deref(), Some("all"));
    }

    #[test]
    fn extensions_and_closures_give_keys() {
        #[derive(Clone)]
        struct User(u64);
        let mut request = parts(&[], None);
        let by_user = KeySource::extension(|user: &User| user.0.to_string().into_bytes());
        assert_eq!(key(&by_user, &request), None);
        request.extensions.insert(User(42));
        assert_eq!(key(&by_user, &request).as_deref(), Some("42"));
        let by_path = KeySource::from_fn(|parts| Some(parts.uri.path().as_bytes().to_vec()));
        assert_eq!(key(&by_path, &request).as_deref(), Some("/"));
    }

    #[test]
    fn mapped_ipv4_addresses_are_one_client() {
        let mapped = parts(&[], Some("[::ffff:192.0.2.1]:80"));
        assert_eq!(
            key(&KeySource::peer_ip(), &mapped).as_deref(),
            Some("192.0.2.1")
        );
    }
}
