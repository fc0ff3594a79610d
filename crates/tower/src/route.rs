//! [`Route`]: which requests a rule covers, and what the rule does with them (policy, key,
//! cost, peek or exempt).
//!
//! A layer holds an ordered list of routes; the **first** route that matches a request's
//! method and path decides what happens to it, so the order reads top-down like the config
//! file. A request no route matches passes unlimited; end the list with [`Route::any`] to
//! limit everything else.

use std::fmt;
use std::sync::Arc;

use http::Method;
use http::request::Parts;

use crate::KeySource;

/// A rule: the requests it covers and how they are limited.
///
/// ```
/// use http::{HeaderName, Method};
/// use rein_core::{Limit, Micros, NamedPolicy, Policy};
/// use rein_memory::MemoryStore;
/// use rein_tower::{KeySource, RateLimitLayer, Route};
///
/// let api_key = KeySource::header(HeaderName::from_static("x-api-key"));
/// let routes = [
///     Route::exact("/login").method(Method::POST).policy("login"),
///     Route::prefix("/api/search")
///         .policy("search")
///         .key(api_key.clone())
///         .cost_fn(|parts| if parts.uri.query().is_some() { 2 } else { 1 }),
///     // Keyed as the search route is: a header's value shares a policy with no other source.
///     Route::exact("/api/quota").policy("search").key(api_key).peek_only(),
///     Route::prefix("/health").exempt(),
///     Route::any().policy("default"),
/// ];
/// let mut layer = RateLimitLayer::builder(MemoryStore::new());
/// for name in ["login", "search", "default"] {
///     let limit = Limit::fixed_window(10, Micros::from_secs(60))?;
///     layer = layer.policy(NamedPolicy::new(name, Policy::single(limit))?);
/// }
/// for route in routes {
///     layer = layer.route(route);
/// }
/// let _layer = layer.build()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Route {
    pub(crate) name: Arc<str>,
    pub(crate) path: PathMatch,
    pub(crate) methods: Vec<Method>,
    pub(crate) policy: Option<Arc<str>>,
    pub(crate) key: Option<KeySource>,
    pub(crate) cost: Cost,
    pub(crate) peek: bool,
}

/// How a route's path matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PathMatch {
    Any,
    Exact(String),
    /// Matches the prefix itself and anything below it: `/api` matches `/api` and
    /// `/api/x`, not `/apix`. A prefix ending in `/` matches like `starts_with`.
    Prefix(String),
}

/// What a request costs.
#[derive(Clone)]
pub(crate) enum Cost {
    Fixed(u64),
    Computed(Arc<dyn Fn(&Parts) -> u64 + Send + Sync>),
}

/// The first two routes, by index, that count one policy's keys from key sources that mix
/// ([`KeySource::mixes_with`]); a route without its own key source uses `default_key`.
pub(crate) fn mixed_key_sources<'a>(
    routes: &'a [Route],
    default_key: &'a KeySource,
) -> Option<(usize, usize)> {
    let source = |route: &'a Route| route.key.as_ref().unwrap_or(default_key);
    routes.iter().enumerate().find_map(|(second, route)| {
        let policy = route.policy.as_ref()?;
        let first = routes[..second].iter().position(|earlier| {
            earlier.policy.as_ref() == Some(policy) && source(earlier).mixes_with(source(route))
        })?;
        Some((first, second))
    })
}

impl Route {
    /// Every request.
    pub fn any() -> Self {
        Self::new(PathMatch::Any, "*")
    }

    /// Requests for exactly `path` (no query), compared as written: a router's `{id}` or
    /// `*` is no pattern here (the config loader refuses them; in code, use
    /// [`prefix`](Self::prefix)).
    pub fn exact(path: impl Into<String>) -> Self {
        let path = path.into();
        let name = path.clone();
        Self::new(PathMatch::Exact(path), &name)
    }

    /// Requests for `prefix` and anything below it, on segment boundaries: `/api` matches
    /// `/api` and `/api/users`, not `/apis`.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        let name = format!("{prefix}*");
        Self::new(PathMatch::Prefix(prefix), &name)
    }

    /// Only requests with this method; call again to add more (default: every method).
    /// `GET` covers `HEAD` too: a server answers a `HEAD` as the `GET` it mirrors (axum's
    /// `get` handlers run for both), so a `HEAD` must not slip past a `GET` route's limit.
    pub fn method(mut self, method: Method) -> Self {
        self.methods.push(method);
        self
    }

    /// The name in logs, spans and metrics (default: the path pattern, e.g. `/api*`).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into().into();
        self
    }

    /// Limits matching requests by the policy named `policy`, which the layer must hold.
    pub fn policy(mut self, policy: impl Into<String>) -> Self {
        self.policy = Some(policy.into().into());
        self
    }

    /// Lets matching requests through unlimited (the default until [`policy`](Self::policy)
    /// is set). Useful before a broader route: health checks ahead of [`Route::any`].
    pub fn exempt(mut self) -> Self {
        self.policy = None;
        self
    }

    /// Takes the key from `key` instead of the layer's default.
    pub fn key(mut self, key: KeySource) -> Self {
        self.key = Some(key);
        self
    }

    /// Each request costs `cost` units (default 1). Zero takes nothing and never denies:
    /// the request passes with the key's figures ([`peek_only`](Self::peek_only) instead denies once
    /// the key is spent).
    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Cost::Fixed(cost);
        self
    }

    /// Each request costs what `cost` computes from its head (a batch size in the query, a
    /// `Content-Length`). A cost above the policy's capacity can never be admitted and is
    /// answered `413 Content Too Large`.
    pub fn cost_fn<F>(mut self, cost: F) -> Self
    where
        F: Fn(&Parts) -> u64 + Send + Sync + 'static,
    {
        self.cost = Cost::Computed(Arc::new(cost));
        self
    }

    /// Checks the limit without taking from it: a denial answers 429 as usual, an admission
    /// consumes nothing. For endpoints that should stop when the limit is spent but not
    /// count themselves (a status page for the quota).
    pub fn peek_only(mut self) -> Self {
        self.peek = true;
        self
    }

    /// The route's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy's name, or `None` for an exempt route.
    pub fn policy_name(&self) -> Option<&str> {
        self.policy.as_deref()
    }

    /// Whether the route matches a request with this method and path.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        let by_method = |m: &Method| m == method || (m == Method::GET && method == Method::HEAD);
        (self.methods.is_empty() || self.methods.iter().any(by_method))
            && match &self.path {
                PathMatch::Any => true,
                PathMatch::Exact(exact) => path == exact,
                PathMatch::Prefix(prefix) => {
                    path.starts_with(prefix.as_str())
                        && (prefix.ends_with('/')
                            || path.len() == prefix.len()
                            || path.as_bytes().get(prefix.len()) == Some(&b'/'))
                }
            }
    }

    fn new(path: PathMatch, name: &str) -> Self {
        Self {
            name: name.into(),
            path,
            methods: Vec::new(),
            policy: None,
            key: None,
            cost: Cost::Fixed(1),
            peek: false,
        }
    }
}

impl Cost {
    pub(crate) fn of(&self, parts: &Parts) -> u64 {
        match self {
            Cost::Fixed(cost) => *cost,
            Cost::Computed(cost) => cost(parts),
        }
    }
}

/// A computed cost shows as `Computed(..)`: a closure has no `Debug`.
impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::Fixed(cost) => f.debug_tuple("Fixed").field(cost).finish(),
            Cost::Computed(_) => f.write_str("Computed(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_on_segment_boundaries() {
        let api = Route::prefix("/api");
        for path in ["/api", "/api/", "/api/users"] {
            assert!(api.matches(&Method::GET, path), "{path}");
        }
        for path in ["/apis", "/", "/ap"] {
            assert!(!api.matches(&Method::GET, path), "{path}");
        }
        assert!(Route::prefix("/api/").matches(&Method::GET, "/api/x"));
        assert!(!Route::prefix("/api/").matches(&Method::GET, "/api"));
    }

    #[test]
    fn methods_restrict_a_route() {
        let login = Route::exact("/login")
            .method(Method::POST)
            .method(Method::PUT);
        assert!(login.matches(&Method::POST, "/login"));
        assert!(login.matches(&Method::PUT, "/login"));
        assert!(!login.matches(&Method::GET, "/login"));
        assert!(!login.matches(&Method::POST, "/login/x"));
        assert!(!login.matches(&Method::HEAD, "/login"));
    }

    #[test]
    fn a_get_route_limits_head_requests_too() {
        let search = Route::exact("/search").method(Method::GET);
        assert!(search.matches(&Method::HEAD, "/search"));
        assert!(!search.matches(&Method::POST, "/search"));
        let head = Route::exact("/search").method(Method::HEAD);
        assert!(!head.matches(&Method::GET, "/search"), "HEAD covers no GET");
    }
}
