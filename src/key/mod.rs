//! How requests are grouped into keys, each with its own window and limit.
//!
//! A [`KeyExtractor`] looks at the request head ([`http::request::Parts`])
//! and returns a key. Every built-in extractor returns a key for every
//! request: when its source is missing (no peer address, no such header)
//! it returns a documented fallback key, which is counted and limited like
//! any other. Extraction never fails, never panics and never answers 500.
//!
//! | extractor            | key type          | key                                          | fallback                      |
//! |----------------------|-------------------|----------------------------------------------|-------------------------------|
//! | [`GlobalKey`]        | `()`              | one key for all requests (the default)       | —                             |
//! | [`PathKey`]          | `String`          | the path, without the query                  | —                             |
//! | [`MethodPathKey`]    | `String`          | `"GET /users"`; `HEAD` is keyed as `GET`     | —                             |
//! | [`HeaderKey`]        | `Option<String>`  | the header's value; not UTF-8: escaped (below) | `None` (absent header)      |
//! | [`PeerIpKey`]        | `Option<IpAddr>`  | the peer's IP address; IPv6: its /64 ([below](self#ipv6-clients)) | `None` (no peer address)      |
//! | [`ForwardedIpKey`]   | `Option<IpAddr>`  | the first address, from the right of the forwarding chain, that is not a trusted proxy; IPv6: its /64 | the peer's address (IPv6: its /64), then `None` |
//! | `MatchedPathKey`     | `String`          | `"GET /users/{id}"` (axum route template); `HEAD` is keyed as `GET` | `"<unmatched>"` |
//! | [`ClientRouteKey`]   | `(C, String)`     | a client extractor's key and a route extractor's key, as a pair: `(Some(10.0.0.7), "POST /login")` | each part's own |
//!
//! axum answers `HEAD` with the `GET` handler, so the method keys name a
//! `HEAD` request `"GET /path"`: a rule for `"GET /path"` limits both, and
//! `HEAD` cannot be used to get past it.
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
//!
//! # IPv6 clients
//!
//! An IPv6 client is given a whole network (a /64 at least, often a /56 or
//! a /48) and may send from any address in it, so the address keys
//! ([`PeerIpKey`], [`ForwardedIpKey`]) key an IPv6 client by its first 64
//! bits, the rest set to zero: every host of `2001:db8:1:2::/64` is the key
//! `2001:db8:1:2::`. `.ipv6_prefix(len)` (1 to 128) chooses another length;
//! IPv4 and IPv4-mapped (`::ffff:a.b.c.d`) clients are keyed by their IPv4
//! address whatever it is. A rule for an IPv6 client names its network
//! address; `key_of(ip)` gives it.
//!
//! ```
//! use std::net::Ipv6Addr;
//! use tower_sliding_window::key::ForwardedIpKey;
//! use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
//!
//! let client: Ipv6Addr = "2001:db8:1:2:aaaa:bbbb:cccc:dddd".parse().unwrap();
//! assert_eq!(PeerIpKey.key_of(client).to_string(), "2001:db8:1:2::");
//!
//! // Group each IPv6 site by its /48 behind one load balancer.
//! let by_site = ForwardedIpKey::trusted_hops(1).ipv6_prefix(48);
//! assert_eq!(by_site.key_of(client).to_string(), "2001:db8:1::");
//! let layer = SlidingWindowLayer::qps(100).key(by_site);
//! # let _ = layer;
//! ```
//!
//! # Header values that are not UTF-8
//!
//! Distinct header values are distinct keys. A value that is valid UTF-8 is
//! its own key. Any other value is keyed as the DEL character (`"\x7f"`),
//! then the value with every `\` written as `\\` and every byte that is not
//! part of valid UTF-8 written as `\xNN` (two lowercase hex digits): `acme`
//! followed by the byte 0xFF is the key `"\x7facme\\xff"` (as a Rust
//! literal). An `http::HeaderValue` never contains DEL, so no valid value
//! has a key starting with it, and the escaping can be undone, so two
//! distinct values never share a key.
//!
//! # Long keys
//!
//! A key is kept as long as its entry, so the built-in string extractors
//! ([`PathKey`], [`MethodPathKey`], [`HeaderKey`], `MatchedPathKey`) bound
//! what it costs: a key longer than [`MAX_KEY_BYTES`] (256) bytes (after
//! the escaping above) is replaced by its *digest form*: its first bytes
//! (at most 64, cut back to a character boundary, with bytes that are not
//! UTF-8 written as `\xNN`), then `…#`, then 32 lowercase hex digits of a
//! 128-bit keyed hash of **all** its bytes, at most
//! [`MAX_DIGEST_KEY_BYTES`] (100) bytes in all:
//!
//! ```text
//! aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa…#3f9c0a1e2b7d4c8f9e0a1b2c3d4e5f60
//! ```
//!
//! The hash is HighwayHash with a 256-bit random key drawn once per
//! process: a keyed pseudorandom function with a 128-bit output, computed in
//! one pass with the CPU's vector instructions where it has them. Two
//! distinct long keys share a digest form with probability about 2^-128,
//! and a client who does not know the per-process key cannot make them
//! collide on purpose (nor make a short key equal to a long key's digest
//! form). A rule names a long key only by its digest form, which
//! changes with every process: give rules to keys of at most 256 bytes.
//! A request with a long key hashes it once (one pass over its bytes) and
//! copies only the 64-byte prefix.

mod bounded;
mod forwarded;
mod head;
mod into;
mod route;
mod visit;

pub use bounded::{MAX_DIGEST_KEY_BYTES, MAX_KEY_BYTES};
pub use forwarded::{ForwardedHeader, ForwardedIpKey, MAX_FORWARDED_ENTRIES};
pub use into::IntoKey;
pub(crate) use route::route_part;
pub use route::{ClientRouteKey, PairKey, RouteExtractor};
pub(crate) use visit::visit_key;
pub use visit::{KeyVisitor, TextKey, ToOwnedKey};

use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::request::Parts;
use http::{Extensions, HeaderName, Method, Request};

use bounded::{header_key, text_key};
use head::Head;

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

    /// Hands the request's key to `visitor`: what the layer calls.
    ///
    /// The provided method visits [`extract`](Self::extract)'s key as owned.
    /// An extractor that can offer a borrowed form of its key (a `&str` for a
    /// `String` key, written into a buffer on the stack) overrides it and
    /// calls [`KeyVisitor::borrowed`]: the key table then looks the borrowed
    /// form up and builds the owned key only for a key it has not seen, so a
    /// request allocates nothing for its key. Both forms must name the same
    /// key.
    ///
    /// ```
    /// use http::request::Parts;
    /// use tower_sliding_window::key::{KeyExtractor, KeyVisitor};
    ///
    /// /// Keys by the `Host` header, ASCII-lowercased, `""` without one.
    /// #[derive(Clone)]
    /// struct HostKey;
    ///
    /// impl KeyExtractor for HostKey {
    ///     type Key = String;
    ///
    ///     fn extract(&self, parts: &Parts) -> String {
    ///         host(parts).to_ascii_lowercase()
    ///     }
    ///
    ///     fn visit<V: KeyVisitor<String>>(&self, parts: &Parts, visitor: V) -> V::Output {
    ///         let host = host(parts);
    ///         if host.bytes().any(|b| b.is_ascii_uppercase()) {
    ///             return visitor.owned(host.to_ascii_lowercase());
    ///         }
    ///         visitor.borrowed(host, str::to_owned)
    ///     }
    /// }
    ///
    /// fn host(parts: &Parts) -> &str {
    ///     parts.headers.get("host").and_then(|v| v.to_str().ok()).unwrap_or("")
    /// }
    /// ```
    #[inline]
    fn visit<V: KeyVisitor<Self::Key>>(&self, parts: &Parts, visitor: V) -> V::Output {
        visitor.owned(self.extract(parts))
    }

    /// Hands the key of a whole request to `visitor` without splitting the
    /// request, or gives the visitor back (`Err`) to be called through
    /// [`visit`](Self::visit) instead: what the layer calls first.
    ///
    /// Reaching the head as [`Parts`] means splitting the request into its
    /// head and body and putting the two back together afterwards: two
    /// moves of the head, a few hundred bytes, on every request. An
    /// extractor that reads only what `Request`'s accessors give
    /// (`method()`, `uri()`, `headers()`, `extensions()`) overrides this
    /// to spare them; every built-in extractor does. The provided method
    /// gives the visitor back. Both methods must name the same key.
    ///
    /// ```
    /// use http::request::Parts;
    /// use http::{HeaderMap, Request};
    /// use tower_sliding_window::key::{KeyExtractor, KeyVisitor, ToOwnedKey};
    ///
    /// /// Keys by the `x-tenant` header, `""` without one.
    /// #[derive(Clone)]
    /// struct TenantKey;
    ///
    /// fn tenant(headers: &HeaderMap) -> &str {
    ///     headers.get("x-tenant").and_then(|v| v.to_str().ok()).unwrap_or("")
    /// }
    ///
    /// impl KeyExtractor for TenantKey {
    ///     type Key = String;
    ///
    ///     fn extract(&self, parts: &Parts) -> String {
    ///         tenant(&parts.headers).to_owned()
    ///     }
    ///
    ///     fn visit<V: KeyVisitor<String>>(&self, parts: &Parts, visitor: V) -> V::Output {
    ///         visitor.borrowed(tenant(&parts.headers), str::to_owned)
    ///     }
    ///
    ///     fn visit_request<B, V: KeyVisitor<String>>(
    ///         &self,
    ///         request: &Request<B>,
    ///         visitor: V,
    ///     ) -> Result<V::Output, V> {
    ///         Ok(visitor.borrowed(tenant(request.headers()), str::to_owned))
    ///     }
    /// }
    ///
    /// let request = Request::builder().header("x-tenant", "acme").body(()).unwrap();
    /// let Ok(key) = TenantKey.visit_request(&request, ToOwnedKey) else { unreachable!() };
    /// assert_eq!(key, TenantKey.extract(&request.into_parts().0));
    /// ```
    #[inline]
    fn visit_request<B, V: KeyVisitor<Self::Key>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        let _ = request;
        Err(visitor)
    }
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

    #[inline]
    fn visit_request<B, V: KeyVisitor<()>>(
        &self,
        _request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(visitor.owned(()))
    }
}

/// The request path, without the query string: `/users/42?x=1` → `"/users/42"`.
///
/// Every distinct path is a key, so put it behind `route_layer` or bound it
/// with [`max_keys`](crate::SlidingWindowLayer::max_keys). A path longer
/// than [`MAX_KEY_BYTES`] is keyed by its digest form (see
/// [Long keys](self#long-keys)).
#[derive(Debug, Clone, Copy, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> String {
        text_key(&[parts.uri.path()])
    }

    fn visit<V: KeyVisitor<String>>(&self, parts: &Parts, visitor: V) -> V::Output {
        visit_path(parts, visitor)
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<String>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(visit_path(request, visitor))
    }
}

/// [`PathKey`]'s key, visited.
#[inline]
fn visit_path<H: Head, V: KeyVisitor<String>>(head: &H, visitor: V) -> V::Output {
    let path = head.uri().path();
    if path.len() > MAX_KEY_BYTES {
        return visitor.owned(text_key(&[path]));
    }
    visitor.borrowed(path, str::to_owned)
}

/// The method and path: `GET /users/42?x=1` → `"GET /users/42"`.
///
/// `HEAD` is keyed as `GET` (axum answers it with the `GET` handler), so a
/// rule for `"GET /users/42"` limits both. A key longer than
/// [`MAX_KEY_BYTES`] is keyed by its digest form (see
/// [Long keys](self#long-keys)).
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    type Key = String;

    fn extract(&self, parts: &Parts) -> String {
        text_key(&[method_name(&parts.method), " ", parts.uri.path()])
    }

    fn visit<V: KeyVisitor<String>>(&self, parts: &Parts, visitor: V) -> V::Output {
        visit_method_and(&parts.method, parts.uri.path(), visitor)
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<String>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(visit_method_and(
            request.method(),
            request.uri().path(),
            visitor,
        ))
    }
}

/// The method as keys name it: `HEAD` as `GET`.
#[inline]
fn method_name(method: &Method) -> &str {
    if *method == Method::HEAD {
        Method::GET.as_str()
    } else {
        method.as_str()
    }
}

/// Calls `f` with `"METHOD rest"` (`HEAD` as `GET`), written into a buffer
/// on the stack when it is short enough to be kept verbatim, else its
/// digest form: the text [`visit_method_and`] visits.
#[inline]
fn with_method_and<T>(method: &Method, rest: &str, f: impl FnOnce(&str) -> T) -> T {
    let method = method_name(method);
    let len = method.len() + 1 + rest.len();
    let mut buf = [0u8; MAX_KEY_BYTES];
    if len <= MAX_KEY_BYTES {
        buf[..method.len()].copy_from_slice(method.as_bytes());
        buf[method.len()] = b' ';
        buf[method.len() + 1..len].copy_from_slice(rest.as_bytes());
        // Always valid: the concatenation of two strings and a space.
        if let Ok(key) = std::str::from_utf8(&buf[..len]) {
            return f(key);
        }
    }
    f(&text_key(&[method, " ", rest]))
}

/// Visits the key `"METHOD rest"`, written into a buffer on the stack and
/// visited as `&str` when it is short enough to be kept verbatim.
#[inline]
fn visit_method_and<V: KeyVisitor<String>>(method: &Method, rest: &str, visitor: V) -> V::Output {
    let method = method_name(method);
    let len = method.len() + 1 + rest.len();
    let mut buf = [0u8; MAX_KEY_BYTES];
    if len <= MAX_KEY_BYTES {
        buf[..method.len()].copy_from_slice(method.as_bytes());
        buf[method.len()] = b' ';
        buf[method.len() + 1..len].copy_from_slice(rest.as_bytes());
        // Always valid: the concatenation of two strings and a space.
        if let Ok(key) = std::str::from_utf8(&buf[..len]) {
            return visitor.borrowed(key, str::to_owned);
        }
    }
    visitor.owned(text_key(&[method, " ", rest]))
}

/// The value of one request header, e.g. an API key or tenant id.
///
/// Requests without the header share the key `None`, limited like any other
/// key. If there are several, the first value counts. Distinct values are
/// distinct keys: a value that is not valid UTF-8 is escaped, never
/// replaced (see [Header values that are not UTF-8](self#header-values-that-are-not-utf-8)),
/// and a value longer than [`MAX_KEY_BYTES`] is keyed by its digest form
/// (see [Long keys](self#long-keys)).
///
/// A request whose key the table already holds allocates nothing for it:
/// the value is handed to the table as text ([`KeyVisitor::some_text`]),
/// which a compact table compares with its keys as it is and a full table
/// looks up by reference to a copy in a buffer kept per thread; only a new
/// key is made owned.
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
            .map(|value| header_key(value.as_bytes()))
    }

    #[inline]
    fn visit<V: KeyVisitor<Option<String>>>(&self, parts: &Parts, visitor: V) -> V::Output {
        self.visit_in(parts, visitor)
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<Option<String>>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(self.visit_in(request, visitor))
    }
}

impl HeaderKey {
    /// The key of `head`'s header, visited: a value that is its own key
    /// (UTF-8, at most [`MAX_KEY_BYTES`]) is lent as text
    /// ([`KeyVisitor::some_text`]), so that a key the table holds costs no
    /// allocation; any other is built (escaped, or its digest form) and
    /// visited as owned.
    #[inline]
    fn visit_in<H: Head, V: KeyVisitor<Option<String>>>(&self, head: &H, visitor: V) -> V::Output {
        let Some(value) = head.headers().get(&self.name) else {
            return visitor.owned(None);
        };
        let bytes = value.as_bytes();
        if bytes.len() > MAX_KEY_BYTES {
            return visitor.owned(Some(header_key(bytes)));
        }
        // Most values are visible ASCII, which `to_str` checks in one
        // cheap pass; any other is checked as UTF-8.
        match value
            .to_str()
            .ok()
            .or_else(|| std::str::from_utf8(bytes).ok())
        {
            Some(text) => visitor.some_text(text),
            None => visitor.owned(Some(header_key(bytes))),
        }
    }
}

thread_local! {
    /// A `Some` key of [`HeaderKey`] being looked up, kept from one request
    /// to the next on this thread so that its bytes are copied, never
    /// allocated. At most [`MAX_KEY_BYTES`] long (longer values take the
    /// owned path), so what it keeps is bounded.
    static HEADER_KEY: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Visits the key `Some(text)` by reference to this thread's key buffer;
/// as owned when the buffer is in use (a visit within a visit) or gone
/// (the thread is ending).
#[inline]
pub(crate) fn visit_some_text<V: KeyVisitor<Option<String>>>(text: &str, visitor: V) -> V::Output {
    if HEADER_KEY.try_with(|_| ()).is_err() {
        return visitor.owned(Some(text.to_owned()));
    }
    // Cannot fail: the buffer was there just above, on this thread.
    HEADER_KEY.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buffer) => {
            let key = buffer.get_or_insert_with(|| String::with_capacity(text.len()));
            key.clear();
            key.push_str(text);
            visitor.referenced(&*buffer)
        }
        Err(_) => visitor.owned(Some(text.to_owned())),
    })
}

/// The IP address of the connection's peer; an IPv6 peer by its /64
/// network.
///
/// Read from axum's `ConnectInfo<SocketAddr>` extension (with the `axum`
/// feature; serve the app with
/// `into_make_service_with_connect_info::<SocketAddr>()`) or from a plain
/// [`SocketAddr`] extension (set by your own hyper accept loop). Without
/// either, the key is `None`: all such requests share one limited key, and
/// nothing fails.
///
/// # IPv6 clients
///
/// An IPv6 client is given a whole network, at least a /64, and can send
/// from any of its 2^64 addresses: keyed by its full address, one host
/// would be as many clients as it likes (and fill the key table). So an
/// IPv6 peer is keyed by its first [`DEFAULT_IPV6_PREFIX`] (64) bits, with
/// the rest set to zero: `2001:db8:1:2:aaaa:bbbb:cccc:dddd` is keyed as
/// `2001:db8:1:2::`, the key of every address of `2001:db8:1:2::/64`. The
/// key is still an `Option<IpAddr>`. [`ipv6_prefix`](Self::ipv6_prefix)
/// keys by another prefix length: shorter to group a site's /56 or /48,
/// 128 to key by the full address.
///
/// An IPv4 address is keyed as it is, and so is an IPv4-mapped IPv6
/// address (`::ffff:10.0.0.1`, how a dual-stack listener sees IPv4 peers),
/// which is keyed as the IPv4 address (`10.0.0.1`): the prefix length
/// applies to IPv6 clients only.
///
/// A rule for an IPv6 client names its key, the network address:
/// [`key_of`](Self::key_of) gives it.
///
/// ```
/// use std::net::Ipv6Addr;
/// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
///
/// // Each IPv6 client by its /64 (the default), IPv4 clients by address.
/// let by_client = SlidingWindowLayer::qps(10).key(PeerIpKey);
///
/// // A site's whole /56 shares one limit, and one network has its own.
/// let partner: Ipv6Addr = "2001:db8:7:1200::".parse().unwrap();
/// let by_site = SlidingWindowLayer::qps(100)
///     .key(PeerIpKey.ipv6_prefix(56))
///     .rule(PeerIpKey.ipv6_prefix(56).key_of(partner), 1_000);
/// # let _ = (by_client, by_site);
/// ```
///
/// This is the TCP peer. Behind a reverse proxy that is the proxy; use
/// [`ForwardedIpKey`] there.
// A unit struct, so that `.key(PeerIpKey)` keeps compiling: a struct with
// a private field cannot be written as a value, and a `const PeerIpKey`
// beside it would make every doc link to `PeerIpKey` ambiguous (struct or
// constant). The configurable form is `PeerIpPrefixKey`, which keys as
// this does at /64.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIpKey;

impl PeerIpKey {
    /// Keys IPv6 peers by their first `len` bits (default
    /// [`DEFAULT_IPV6_PREFIX`], 64): a [`PeerIpPrefixKey`], which keys as
    /// `PeerIpKey` does with that length. IPv4 peers are keyed as before.
    ///
    /// ```
    /// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
    ///
    /// // Every address of a /48 is one client.
    /// let layer = SlidingWindowLayer::qps(50).key(PeerIpKey.ipv6_prefix(48));
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    ///
    /// When `len` is not in `1..=128`.
    #[track_caller]
    pub fn ipv6_prefix(self, len: u8) -> PeerIpPrefixKey {
        PeerIpPrefixKey {
            ipv6_prefix: checked_ipv6_prefix("PeerIpKey::ipv6_prefix", len),
        }
    }

    /// The key of a peer at `ip`: `ip` itself for IPv4, the IPv4 address
    /// of an IPv4-mapped one, and the /64 network address of any other
    /// IPv6 address (`2001:db8::7` → `2001:db8::`). What a rule for that
    /// client names.
    pub fn key_of(&self, ip: impl Into<IpAddr>) -> IpAddr {
        ip_key(ip.into(), DEFAULT_IPV6_PREFIX)
    }
}

impl KeyExtractor for PeerIpKey {
    type Key = Option<IpAddr>;

    #[inline]
    fn extract(&self, parts: &Parts) -> Option<IpAddr> {
        peer_ip(&parts.extensions).map(|ip| canonical_ip_key(ip, DEFAULT_IPV6_PREFIX))
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<Option<IpAddr>>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        let key = peer_ip(request.extensions()).map(|ip| canonical_ip_key(ip, DEFAULT_IPV6_PREFIX));
        Ok(visitor.owned(key))
    }
}

/// [`PeerIpKey`] with an IPv6 prefix length of your choice: made by
/// [`PeerIpKey::ipv6_prefix`]; key type `Option<IpAddr>`.
///
/// An IPv6 peer is keyed by its first `len` bits, the others set to zero;
/// an IPv4 (or IPv4-mapped) peer by its IPv4 address; no peer address
/// known, `None`. With a length of 64 it keys as `PeerIpKey` does.
///
/// ```
/// use std::net::{IpAddr, SocketAddr};
/// use http::Request;
/// use tower_sliding_window::{KeyExtractor, PeerIpKey};
///
/// let by_site = PeerIpKey.ipv6_prefix(56);
/// let peer: SocketAddr = "[2001:db8:7:12ab::1]:443".parse().unwrap();
/// let mut request = Request::new(());
/// request.extensions_mut().insert(peer);
/// let key = by_site.extract(&request.into_parts().0);
/// assert_eq!(key, Some("2001:db8:7:1200::".parse::<IpAddr>().unwrap()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIpPrefixKey {
    /// In `1..=128`, checked at construction.
    ipv6_prefix: u8,
}

impl PeerIpPrefixKey {
    /// Keys IPv6 peers by their first `len` bits instead.
    ///
    /// # Panics
    ///
    /// When `len` is not in `1..=128`.
    #[track_caller]
    pub fn ipv6_prefix(self, len: u8) -> Self {
        PeerIpPrefixKey {
            ipv6_prefix: checked_ipv6_prefix("PeerIpPrefixKey::ipv6_prefix", len),
        }
    }

    /// The IPv6 prefix length peers are keyed by.
    pub fn ipv6_prefix_len(&self) -> u8 {
        self.ipv6_prefix
    }

    /// The key of a peer at `ip`: `ip` itself for IPv4, the IPv4 address
    /// of an IPv4-mapped one, and the network address of the prefix for
    /// any other IPv6 address. What a rule for that client names.
    pub fn key_of(&self, ip: impl Into<IpAddr>) -> IpAddr {
        ip_key(ip.into(), self.ipv6_prefix)
    }
}

impl Default for PeerIpPrefixKey {
    /// A /64, as [`PeerIpKey`].
    fn default() -> Self {
        PeerIpPrefixKey {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }
}

impl From<PeerIpKey> for PeerIpPrefixKey {
    fn from(_: PeerIpKey) -> Self {
        PeerIpPrefixKey::default()
    }
}

impl KeyExtractor for PeerIpPrefixKey {
    type Key = Option<IpAddr>;

    #[inline]
    fn extract(&self, parts: &Parts) -> Option<IpAddr> {
        peer_ip(&parts.extensions).map(|ip| canonical_ip_key(ip, self.ipv6_prefix))
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<Option<IpAddr>>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        let key = peer_ip(request.extensions()).map(|ip| canonical_ip_key(ip, self.ipv6_prefix));
        Ok(visitor.owned(key))
    }
}

/// The IPv6 prefix length that [`PeerIpKey`] and [`ForwardedIpKey`] key
/// IPv6 clients by unless told otherwise: 64, the smallest network a
/// client is normally given (a single LAN), so that a client cannot
/// become many keys by changing the host bits of its address.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// The peer's full address, IPv4-mapped IPv6 as IPv4; `None` without one.
#[inline(always)]
fn peer_ip(extensions: &Extensions) -> Option<IpAddr> {
    // `to_canonical`: a dual-stack listener sees IPv4 peers as
    // `::ffff:a.b.c.d`; key them by their IPv4 address, so one client
    // has one key and rules written for IPv4 addresses apply.
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip().to_canonical());
    }
    extensions
        .get::<SocketAddr>()
        .map(|addr| addr.ip().to_canonical())
}

/// `len` if it is a valid IPv6 prefix length; else a panic naming
/// `setting` and the rule.
#[track_caller]
fn checked_ipv6_prefix(setting: &str, len: u8) -> u8 {
    assert!(
        (1..=128).contains(&len),
        "{setting}: invalid `len`: must be 1..=128 (got {len})"
    );
    len
}

/// The key of a client at `ip`: an IPv4 (or IPv4-mapped) address as IPv4,
/// an IPv6 address with every bit after the first `ipv6_prefix` cleared.
///
/// `ipv6_prefix` is in `1..=128` (checked at construction), so the shift
/// is in `0..=127`: one shift and one AND on a `u128`, no branch on the
/// length.
#[inline]
fn ip_key(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    canonical_ip_key(ip.to_canonical(), ipv6_prefix)
}

/// [`ip_key`] of an address already canonical (IPv4-mapped addresses
/// given as IPv4), as [`peer_ip`] and the forwarded headers' parser give
/// them: the request path does not convert the address a second time.
#[inline(always)]
fn canonical_ip_key(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    debug_assert_eq!(ip, ip.to_canonical(), "an address not canonical");
    match ip {
        IpAddr::V6(v6) => {
            let mask = u128::MAX << (128 - u32::from(ipv6_prefix));
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
        v4 => v4,
    }
}

/// The method and axum route template: `GET /users/42` on the route
/// `/users/{id}` → `"GET /users/{id}"`.
///
/// The number of keys is bounded by the number of routes. axum sets the
/// matched path before middleware added with `Router::route_layer` or
/// `Router::layer` runs (not across `nest_service`). A request that matched
/// no route gets the key `"<unmatched>"`; use `route_layer` to leave those
/// unlimited (and let them 404). `HEAD` is keyed as `GET`, as axum answers
/// it with the `GET` handler.
///
/// A request for a key already in the table allocates nothing: the key is
/// written into a buffer on the stack and looked up as a `&str` (see
/// [`KeyExtractor::visit`]).
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
            Some(path) => text_key(&[method_name(&parts.method), " ", path.as_str()]),
            None => Self::UNMATCHED.to_owned(),
        }
    }

    fn visit<V: KeyVisitor<String>>(&self, parts: &Parts, visitor: V) -> V::Output {
        visit_matched_path(parts, visitor)
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<String>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(visit_matched_path(request, visitor))
    }
}

/// `MatchedPathKey`'s key, visited.
#[cfg(feature = "axum")]
#[inline]
fn visit_matched_path<H: Head, V: KeyVisitor<String>>(head: &H, visitor: V) -> V::Output {
    match head.extensions().get::<axum::extract::MatchedPath>() {
        Some(path) => visit_method_and(head.method(), path.as_str(), visitor),
        None => visitor.borrowed(MatchedPathKey::UNMATCHED, str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;
    use std::borrow::Borrow;

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
    fn header_key_escapes_non_utf8() {
        let key = HeaderKey::new(HeaderName::from_static("x-tenant"));
        let value = http::HeaderValue::from_bytes(b"a\xffb").unwrap();
        let p = parts(
            Request::get("/")
                .header("x-tenant", value)
                .body(())
                .unwrap(),
        );
        assert_eq!(key.extract(&p).as_deref(), Some("\x7fa\\xffb"));
    }

    /// Requests with hostile heads: no header, an empty one, a value of
    /// exactly and one past `MAX_KEY_BYTES`, bytes that are not UTF-8,
    /// non-ASCII UTF-8, `HEAD`, a long path, peers over IPv4, IPv6 and
    /// IPv4-mapped IPv6, a forwarding chain with garbage in it.
    fn hostile_requests() -> Vec<Request<()>> {
        let mut values: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"client-42".to_vec(),
            "caf\u{e9}-\u{1f600}".as_bytes().to_vec(),
            b"a\xffb".to_vec(),
            b"\\x41\xfe".to_vec(),
            vec![b'k'; MAX_KEY_BYTES],
            vec![b'k'; MAX_KEY_BYTES + 1],
            vec![0xff; MAX_KEY_BYTES],
        ];
        let mut near_limit = "\u{e9}".repeat(MAX_KEY_BYTES / 2).into_bytes();
        near_limit.push(b'x');
        values.push(near_limit);
        let peers: [Option<SocketAddr>; 4] = [
            None,
            Some("10.1.2.3:4".parse().unwrap()),
            Some("[2001:db8:1:2:aaaa::7]:80".parse().unwrap()),
            Some("[::ffff:10.9.8.7]:80".parse().unwrap()),
        ];
        let long_path = format!("/{}", "p".repeat(MAX_KEY_BYTES));
        let mut requests = Vec::new();
        for (i, value) in values.into_iter().map(Some).chain([None]).enumerate() {
            for peer in peers {
                let method = if i % 2 == 0 {
                    Method::HEAD
                } else {
                    Method::POST
                };
                let path = if i % 3 == 0 {
                    long_path.as_str()
                } else {
                    "/a/b?q=1"
                };
                let mut request = Request::builder().method(method).uri(path);
                if let Some(value) = &value {
                    let value = http::HeaderValue::from_bytes(value).unwrap();
                    request = request
                        .header("x-tenant", value.clone())
                        .header("x-tenant", "second");
                }
                request = request.header("x-forwarded-for", "garbage, 192.0.2.9, [2001:db8::1]:5");
                let mut request = request.body(()).unwrap();
                if let Some(peer) = peer {
                    request.extensions_mut().insert(peer);
                }
                requests.push(request);
            }
        }
        requests
    }

    /// `visit_request` of `extractor`: the key it visits, or `None` when it
    /// declines.
    fn of_request<X: KeyExtractor>(extractor: &X, request: &Request<()>) -> Option<X::Key> {
        extractor.visit_request(request, ToOwnedKey).ok()
    }

    #[test]
    fn every_built_in_extractor_reads_the_same_key_from_the_whole_request() {
        let header = HeaderKey::new(HeaderName::from_static("x-tenant"));
        let forwarded = ForwardedIpKey::trusted_hops(1);
        for request in hostile_requests() {
            let (head, body) = request.into_parts();
            let request = Request::from_parts(head.clone(), body);
            let head = &head;
            GlobalKey.extract(head);
            assert_eq!(of_request(&GlobalKey, &request), Some(()));
            assert_eq!(of_request(&PathKey, &request), Some(PathKey.extract(head)));
            assert_eq!(
                of_request(&MethodPathKey, &request),
                Some(MethodPathKey.extract(head))
            );
            assert_eq!(of_request(&header, &request), Some(header.extract(head)));
            assert_eq!(header.visit(head, ToOwnedKey), header.extract(head));
            assert_eq!(
                of_request(&PeerIpKey, &request),
                Some(PeerIpKey.extract(head))
            );
            let prefix = PeerIpKey.ipv6_prefix(48);
            assert_eq!(of_request(&prefix, &request), Some(prefix.extract(head)));
            assert_eq!(
                of_request(&forwarded, &request),
                Some(forwarded.extract(head))
            );
            #[cfg(feature = "axum")]
            assert_eq!(
                of_request(&MatchedPathKey, &request),
                Some(MatchedPathKey.extract(head))
            );
            // A pair reads itself from the request when both its parts can.
            let pairs = (
                ClientRouteKey::new(PeerIpKey, MethodPathKey),
                ClientRouteKey::new(forwarded.clone(), PathKey),
                ClientRouteKey::new(header.clone(), MethodPathKey),
            );
            assert_eq!(of_request(&pairs.0, &request), Some(pairs.0.extract(head)));
            assert_eq!(of_request(&pairs.1, &request), Some(pairs.1.extract(head)));
            assert_eq!(of_request(&pairs.2, &request), Some(pairs.2.extract(head)));
            #[cfg(feature = "axum")]
            {
                let matched = ClientRouteKey::new(PeerIpKey, MatchedPathKey);
                assert_eq!(of_request(&matched, &request), Some(matched.extract(head)));
            }
            // And declines when either part cannot.
            let closure_route = ClientRouteKey::new(PeerIpKey, |p: &Parts| p.uri.path().to_owned());
            assert_eq!(of_request(&closure_route, &request), None);
            let closure_client = ClientRouteKey::new(|p: &Parts| p.uri.path().len(), PathKey);
            assert_eq!(of_request(&closure_client, &request), None);
        }
    }

    #[test]
    fn a_closure_declines_to_read_the_whole_request() {
        let closure = |parts: &Parts| parts.uri.path().to_owned();
        let request = Request::get("/a").body(()).unwrap();
        assert!(closure.visit_request(&request, ToOwnedKey).is_err());
    }

    /// Visits its key as owned; inside a borrowed visit, first visits the
    /// header key of `inner` with a visitor of its own, as a visit within
    /// a visit on one thread would.
    struct Nested<'a> {
        inner: &'a Request<()>,
        seen: &'a std::cell::RefCell<Vec<(bool, Option<String>)>>,
    }

    impl KeyVisitor<Option<String>> for Nested<'_> {
        type Output = ();

        fn owned(self, key: Option<String>) {
            self.seen.borrow_mut().push((false, key));
        }

        fn borrowed<Q>(self, key: &Q, to_owned: fn(&Q) -> Option<String>)
        where
            Option<String>: Borrow<Q>,
            Q: Hash + Eq + ?Sized,
        {
            let header = HeaderKey::new(HeaderName::from_static("x-tenant"));
            let inner = of_request(&header, self.inner).expect("never declines");
            self.seen.borrow_mut().push((true, to_owned(key)));
            self.seen.borrow_mut().push((false, inner));
        }
    }

    #[test]
    fn a_header_key_visited_within_a_visit_is_still_its_own_key() {
        let header = HeaderKey::new(HeaderName::from_static("x-tenant"));
        let outer = Request::get("/")
            .header("x-tenant", "outer")
            .body(())
            .unwrap();
        let inner = Request::get("/")
            .header("x-tenant", "inner")
            .body(())
            .unwrap();
        let seen = std::cell::RefCell::new(Vec::new());
        let visited = header.visit_request(
            &outer,
            Nested {
                inner: &inner,
                seen: &seen,
            },
        );
        assert!(visited.is_ok());
        assert_eq!(
            seen.into_inner(),
            [
                (true, Some("outer".to_owned())),
                (false, Some("inner".to_owned()))
            ]
        );
    }

    #[test]
    fn visit_and_extract_agree() {
        let long = format!("/{}", "p".repeat(MAX_KEY_BYTES));
        for uri in ["/users/42?x=1", "/", long.as_str()] {
            for method in [Method::GET, Method::HEAD, Method::POST] {
                let mut request = Request::get(uri).body(()).unwrap();
                *request.method_mut() = method.clone();
                let p = parts(request);
                assert_eq!(PathKey.visit(&p, ToOwnedKey), PathKey.extract(&p));
                assert_eq!(
                    MethodPathKey.visit(&p, ToOwnedKey),
                    MethodPathKey.extract(&p)
                );
            }
        }
    }

    #[test]
    fn head_is_keyed_as_get() {
        let p = parts(Request::head("/a").body(()).unwrap());
        assert_eq!(MethodPathKey.extract(&p), "GET /a");
        assert_eq!(MethodPathKey.visit(&p, ToOwnedKey), "GET /a");
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
        let addr: SocketAddr = "[2001:db8::1]:80".parse().unwrap();
        let mut req = Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(addr));
        let req = parts(req);
        assert_eq!(PeerIpKey.extract(&req), Some(ip("2001:db8::")));
        assert_eq!(PeerIpKey.ipv6_prefix(128).extract(&req), Some(addr.ip()));
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Bit `i` of `bits`, counting from the most significant.
    fn bit(bits: u128, i: u32) -> bool {
        bits & (1 << (127 - i)) != 0
    }

    #[test]
    fn ipv6_keys_keep_exactly_the_prefix_bits() {
        // Against a bit-by-bit oracle, for every length and for addresses
        // with all bits set, one bit set, and mixed bits.
        let samples = [
            u128::MAX,
            1,
            1 << 127,
            0x2001_0db8_85a3_08d3_1319_8a2e_0370_7344,
            0xfedc_ba98_7654_3210_0123_4567_89ab_cdef,
        ];
        for len in 1..=128u8 {
            for &bits in &samples {
                let key = match ip_key(IpAddr::V6(Ipv6Addr::from(bits)), len) {
                    IpAddr::V6(v6) => u128::from(v6),
                    v4 => panic!("{v4} from an IPv6 address"),
                };
                for i in 0..128 {
                    let want = i < u32::from(len) && bit(bits, i);
                    assert_eq!(bit(key, i), want, "/{len} of {bits:#x}, bit {i}");
                }
            }
        }
    }

    #[test]
    fn ipv4_and_mapped_keys_ignore_the_prefix() {
        for len in [1, 8, 32, 64, 96, 127, 128] {
            assert_eq!(ip_key(ip("192.0.2.255"), len), ip("192.0.2.255"));
            assert_eq!(ip_key(ip("::ffff:192.0.2.255"), len), ip("192.0.2.255"));
        }
    }

    #[test]
    fn prefix_lengths_outside_1_to_128_are_refused() {
        for len in [0, 129, 255] {
            let refused = std::panic::catch_unwind(|| PeerIpKey.ipv6_prefix(len));
            assert!(refused.is_err(), "/{len} accepted");
        }
        assert_eq!(PeerIpKey.ipv6_prefix(1).ipv6_prefix_len(), 1);
        assert_eq!(PeerIpKey.ipv6_prefix(128).ipv6_prefix_len(), 128);
        assert_eq!(PeerIpPrefixKey::default().ipv6_prefix_len(), 64);
    }

    #[test]
    fn peer_keys_and_key_of_agree() {
        let prefixed = PeerIpKey.ipv6_prefix(56);
        for peer in [
            "[2001:db8:7:12ab::1]:1",
            "[::ffff:10.0.0.1]:1",
            "10.0.0.1:1",
        ] {
            let addr: SocketAddr = peer.parse().unwrap();
            let mut req = Request::get("/").body(()).unwrap();
            req.extensions_mut().insert(addr);
            // The request path's reading (`visit_request`), which takes
            // the address as `peer_ip` made it canonical.
            assert_eq!(
                PeerIpKey.visit_request(&req, ToOwnedKey).ok(),
                Some(Some(PeerIpKey.key_of(addr.ip())))
            );
            assert_eq!(
                prefixed.visit_request(&req, ToOwnedKey).ok(),
                Some(Some(prefixed.key_of(addr.ip())))
            );
            let req = parts(req);
            assert_eq!(PeerIpKey.extract(&req), Some(PeerIpKey.key_of(addr.ip())));
            assert_eq!(
                PeerIpPrefixKey::from(PeerIpKey).extract(&req),
                PeerIpKey.extract(&req)
            );
            assert_eq!(prefixed.extract(&req), Some(prefixed.key_of(addr.ip())));
            assert_eq!(PeerIpKey.visit(&req, ToOwnedKey), PeerIpKey.extract(&req));
        }
    }

    #[test]
    fn closures_are_extractors() {
        let by_host = |p: &Parts| p.headers.get("host").is_some();
        let p = parts(Request::get("/").header("host", "x").body(()).unwrap());
        assert!(by_host.extract(&p));
    }
}
