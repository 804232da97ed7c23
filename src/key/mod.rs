//! How requests are grouped into keys, each with its own window and limit.
//!
//! A [`KeyExtractor`] looks at the request head ([`http::request::Parts`])
//! and returns a key. Every built-in extractor returns a key for every
//! request: when its source is missing (no peer address, no such header)
//! it returns a documented fallback key, which is counted and limited like
//! any other. Extraction never fails, never panics and never answers 500.
//!
//! | extractor          | key type          | key                                          | fallback                      |
//! |--------------------|-------------------|----------------------------------------------|-------------------------------|
//! | [`GlobalKey`]      | `()`              | one key for all requests (the default)       | —                             |
//! | [`PathKey`]        | `String`          | the path, without the query                  | —                             |
//! | [`MethodPathKey`]  | `String`          | `"GET /users"`                               | —                             |
//! | [`HeaderKey`]      | `Option<String>`  | the header's value                           | `None` (absent header)        |
//! | [`PeerIpKey`]      | `Option<IpAddr>`  | the peer's IP address                        | `None` (no peer address)      |
//! | `MatchedPathKey`   | `String`          | `"GET /users/{id}"` (axum route template)    | `"<unmatched>"`               |
//!
//! Any closure `Fn(&Parts) -> K` is an extractor too:
//!
//! ```
//! use http::request::Parts;
//! use tower_sliding_window::SlidingWindowLayer;
//!
//! // One window per API token; requests without one share the `""` key.
//! let layer = SlidingWindowLayer::qps(50).key(|parts: &Parts| {
//!     parts
//!         .headers
//!         .get("x-api-token")
//!         .and_then(|v| v.to_str().ok())
//!         .unwrap_or_default()
//!         .to_owned()
//! });
//! # let _ = layer;
//! ```
//!
//! Keys should come from a bounded set, or be bounded by
//! [`max_keys`](crate::SlidingWindowLayer::max_keys): keying on the raw path
//! lets a client create a key per request. [`PathKey`] is fine for a known
//! set of paths behind `route_layer`; `MatchedPathKey` is bounded by
//! construction.

mod into;

pub use into::IntoKey;

use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};

use http::request::Parts;
use http::HeaderName;

/// Chooses the key a request is counted and limited under.
///
/// It sees only the request head, so it has no body type parameter:
/// `.key(PathKey)` needs no turbofish whatever the body type. A closure
/// `Fn(&Parts) -> K` implements it.
pub trait KeyExtractor: Clone + Send + Sync + 'static {
    /// The key type. Keys are hashed with a randomly seeded SipHash, so
    /// client-chosen keys cannot be crafted to collide.
    type Key: Clone + Eq + Hash + Send + Sync + 'static;

    /// The key for a request.
    fn extract(&self, parts: &Parts) -> Self::Key;
}

impl<F, K> KeyExtractor for F
where
    F: Fn(&Parts) -> K + Clone + Send + Sync + 'static,
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    type Key = K;

    fn extract(&self, parts: &Parts) -> K {
        self(parts)
    }
}

/// One key for every request: a single global limit. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct GlobalKey;

impl KeyExtractor for GlobalKey {
    type Key = ();

    #[inline]
    fn extract(&self, _parts: &Parts) {}
}

/// The request path, without the query string: `/users/42?x=1` → `"/users/42"`.
///
/// Every distinct path is a key, so put it behind `route_layer` or bound it
/// with [`max_keys`](crate::SlidingWindowLayer::max_keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> String {
        parts.uri.path().to_owned()
    }
}

/// The method and path: `GET /users/42?x=1` → `"GET /users/42"`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> String {
        method_and(&parts.method, parts.uri.path())
    }
}

/// `"METHOD rest"` with one allocation.
fn method_and(method: &http::Method, rest: &str) -> String {
    let method = method.as_str();
    let mut key = String::with_capacity(method.len() + 1 + rest.len());
    key.push_str(method);
    key.push(' ');
    key.push_str(rest);
    key
}

/// The value of one request header, e.g. an API key or tenant id.
///
/// Requests without the header share the key `None`, limited like any other
/// key. A value that is not valid UTF-8 is keyed by its lossy UTF-8
/// rendering. If there are several, the first value counts.
///
/// ```
/// use http::HeaderName;
/// use tower_sliding_window::{HeaderKey, SlidingWindowLayer};
///
/// let layer = SlidingWindowLayer::qps(10)
///     .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
///     .rule(Some("internal".to_owned()), 1_000);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone)]
pub struct HeaderKey {
    name: HeaderName,
}

impl HeaderKey {
    /// Keys requests by the value of `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey { name }
    }
}

impl KeyExtractor for HeaderKey {
    type Key = Option<String>;

    fn extract(&self, parts: &Parts) -> Option<String> {
        parts
            .headers
            .get(&self.name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
    }
}

/// The IP address of the connection's peer.
///
/// Read from axum's `ConnectInfo<SocketAddr>` extension (with the `axum`
/// feature; serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or from a plain
/// [`SocketAddr`] extension (set by your own hyper accept loop). Without
/// either, the key is `None`: all such requests share one limited key, and
/// nothing fails.
///
/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, how a dual-stack
/// listener sees IPv4 peers) is keyed as the IPv4 address (`10.0.0.1`).
///
/// This is the TCP peer. Behind a reverse proxy that is the proxy; key on a
/// header the proxy sets instead ([`HeaderKey`] or a closure), and trust it
/// only if every request passes through that proxy.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIpKey;

impl KeyExtractor for PeerIpKey {
    type Key = Option<IpAddr>;

    fn extract(&self, parts: &Parts) -> Option<IpAddr> {
        #[cfg(feature = "axum")]
        if let Some(info) = parts
            .extensions
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
        {
            return Some(info.0.ip().to_canonical());
        }
        // `to_canonical`: a dual-stack listener sees IPv4 peers as
        // `::ffff:a.b.c.d`; key them by their IPv4 address, so one client
        // has one key and rules written for IPv4 addresses apply.
        parts
            .extensions
            .get::<SocketAddr>()
            .map(|addr| addr.ip().to_canonical())
    }
}

/// The method and axum route template: `GET /users/42` on the route
/// `/users/{id}` → `"GET /users/{id}"`.
///
/// The number of keys is bounded by the number of routes. axum sets the
/// matched path before middleware added with `Router::route_layer` or
/// `Router::layer` runs (not across `nest_service`). A request that matched
/// no route gets the key `"<unmatched>"`; use `route_layer` to leave those
/// unlimited (and let them 404).
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default)]
pub struct MatchedPathKey;

#[cfg(feature = "axum")]
impl MatchedPathKey {
    /// The key of requests that matched no route.
    pub const UNMATCHED: &'static str = "<unmatched>";
}

#[cfg(feature = "axum")]
impl KeyExtractor for MatchedPathKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> String {
        match parts.extensions.get::<axum::extract::MatchedPath>() {
            Some(path) => method_and(&parts.method, path.as_str()),
            None => Self::UNMATCHED.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(req: Request<()>) -> Parts {
        req.into_parts().0
    }

    #[test]
    fn path_key_drops_the_query() {
        let p = parts(Request::get("/users/42?x=1").body(()).unwrap());
        assert_eq!(PathKey.extract(&p), "/users/42");
        assert_eq!(MethodPathKey.extract(&p), "GET /users/42");
    }

    #[test]
    fn header_key_falls_back_to_none() {
        let key = HeaderKey::new(HeaderName::from_static("x-tenant"));
        let with = parts(Request::get("/").header("x-tenant", "a").body(()).unwrap());
        let without = parts(Request::get("/").body(()).unwrap());
        assert_eq!(key.extract(&with).as_deref(), Some("a"));
        assert_eq!(key.extract(&without), None);
    }

    #[test]
    fn header_key_renders_non_utf8_lossily() {
        let key = HeaderKey::new(HeaderName::from_static("x-tenant"));
        let value = http::HeaderValue::from_bytes(b"a\xffb").unwrap();
        let p = parts(
            Request::get("/")
                .header("x-tenant", value)
                .body(())
                .unwrap(),
        );
        assert_eq!(key.extract(&p).as_deref(), Some("a\u{fffd}b"));
    }

    #[test]
    fn peer_ip_from_socket_addr_extension_or_none() {
        let mut req = Request::get("/").body(()).unwrap();
        assert_eq!(
            PeerIpKey.extract(&parts(Request::get("/").body(()).unwrap())),
            None
        );
        let addr: SocketAddr = "10.1.2.3:4567".parse().unwrap();
        req.extensions_mut().insert(addr);
        assert_eq!(PeerIpKey.extract(&parts(req)), Some(addr.ip()));
    }

    #[cfg(feature = "axum")]
    #[test]
    fn peer_ip_from_connect_info() {
        let addr: SocketAddr = "[::1]:80".parse().unwrap();
        let mut req = Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        assert_eq!(PeerIpKey.extract(&parts(req)), Some(addr.ip()));
    }

    #[test]
    fn closures_are_extractors() {
        let by_host = |p: &Parts| p.headers.get("host").is_some();
        let p = parts(Request::get("/").header("host", "x").body(()).unwrap());
        assert!(by_host.extract(&p));
    }
}
