//! `ClientRouteKey`: a key with a client part and a route part, so that one
//! rule can name a route and apply to every client of it separately.

use std::any::Any;
use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use http::request::Parts;
use http::Request;

use super::head::Head;
use super::{KeyExtractor, KeyVisitor, ToOwnedKey};

/// Keys each request by its client **and** its route: the key is the pair
/// `(client, route)`, for example `(Some(10.0.0.7), "POST /login")`.
///
/// It composes two extractors: `client` (any [`KeyExtractor`]:
/// [`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey),
/// [`HeaderKey`](crate::HeaderKey), a closure) and `route`, a
/// [`RouteExtractor`]: an extractor whose key is the route as text.
/// `MatchedPathKey` (feature `axum`) is the
/// route part to use under axum: it is the method and the route template
/// (`"POST /login"`, `"GET /users/{id}"`), so a client cannot escape a
/// route's limit by varying the path, and every request that matched no
/// route has the route part `"<unmatched>"` (one key per client, whatever
/// paths it tries). [`MethodPathKey`](crate::MethodPathKey) keys by the
/// literal path, which a client can vary: use it only behind a router
/// whose paths are fixed.
///
/// With this key, a layer can give a **route** a limit that applies to
/// every client of the route separately:
/// [`route_rule`](crate::SlidingWindowLayer::route_rule) in the builder,
/// [`StatsHandle::set_route_limit`](crate::StatsHandle::set_route_limit)
/// at run time, and the `routes` section of a
/// [`Rules`](crate::rules::Rules) document. A rule for one exact key
/// ([`rule`](crate::SlidingWindowLayer::rule) with the pair) still wins
/// over its route's rule, and keys of a route without a rule have the
/// layer's default limit. In a further window
/// ([`limit_per`](crate::SlidingWindowLayer::limit_per)) a route's limit is
/// [`route_rule_per`](crate::SlidingWindowLayer::route_rule_per),
/// [`StatsHandle::set_route_limit_per`](crate::StatsHandle::set_route_limit_per)
/// or the window's `routes` in a document: "5 logins per minute, 100 per
/// second elsewhere" per client is one layer. See the
/// [crate docs](crate#per-client-limits-per-route) for the whole setup.
///
/// Route rules work with any extractor whose key is a pair `(C, String)`
/// (a closure returning one, too): the second part is the route.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::net::SocketAddr;
/// use axum::{body::Body, routing::{get, post}, Router};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};
///
/// // 100 per second per client everywhere; 2 per second per client on POST /login.
/// let layer = SlidingWindowLayer::qps(100)
///     .key(ClientRouteKey::new(PeerIpKey, MatchedPathKey))
///     .route_rule("POST /login", 2);
/// let app = Router::new()
///     .route("/login", post(|| async { "welcome" }))
///     .route("/", get(|| async { "hi" }))
///     .layer(layer);
///
/// let login = |peer: &str| {
///     let mut request = Request::post("/login").body(Body::empty()).unwrap();
///     request.extensions_mut().insert(peer.parse::<SocketAddr>().unwrap());
///     app.clone().oneshot(request)
/// };
/// assert_eq!(login("10.0.0.1:1000").await.unwrap().status(), StatusCode::OK);
/// assert_eq!(login("10.0.0.1:1000").await.unwrap().status(), StatusCode::OK);
/// let refused = login("10.0.0.1:1000").await.unwrap();
/// assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
/// // Another client has its own two logins.
/// assert_eq!(login("10.0.0.2:1000").await.unwrap().status(), StatusCode::OK);
/// # }
/// ```
///
/// # Cost
///
/// A request looks its key up by a borrowed form ([`PairKey`]): the route
/// text is written into a buffer on the stack by the route extractor
/// ([`RouteExtractor`]), and the owned key (which owns its route text, at
/// most [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) bytes with the
/// built-in route extractors) is made only for a key the table has not
/// seen. So a request of a known key allocates nothing for its route part;
/// the client part costs what its extractor's key costs
/// ([`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey):
/// nothing). Finding a new key's route rule is one hash lookup of the
/// route part, whatever the number of rules and clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientRouteKey<C, R> {
    client: C,
    route: R,
}

impl<C, R> ClientRouteKey<C, R> {
    /// Keys requests by `client`'s key and `route`'s key, as a pair.
    pub fn new(client: C, route: R) -> Self {
        ClientRouteKey { client, route }
    }

    /// The extractor of the client part.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// The extractor of the route part.
    pub fn route(&self) -> &R {
        &self.route
    }
}

impl<C, R> KeyExtractor for ClientRouteKey<C, R>
where
    C: KeyExtractor,
    R: RouteExtractor,
{
    type Key = (C::Key, String);

    #[inline]
    fn extract(&self, parts: &Parts) -> (C::Key, String) {
        (self.client.extract(parts), self.route.extract(parts))
    }

    #[inline]
    fn visit<V: KeyVisitor<Self::Key>>(&self, parts: &Parts, visitor: V) -> V::Output {
        let client = self.client.extract(parts);
        self.route
            .visit_route(parts, |route| visit_pair(&client, route, visitor))
    }

    /// Reads the pair from the whole request when the route part is one of
    /// the crate's route extractors (`MatchedPathKey`, `MethodPathKey`,
    /// `PathKey`) and the client part reads its key from a whole request
    /// too; gives the visitor back otherwise.
    #[inline]
    fn visit_request<B, V: KeyVisitor<Self::Key>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        let Some(route) = BuiltinRoute::of(&self.route) else {
            return Err(visitor);
        };
        let Ok(client) = self.client.visit_request(request, ToOwnedKey) else {
            return Err(visitor);
        };
        Ok(route.visit(request, |route| visit_pair(&client, route, visitor)))
    }
}

/// Visits the pair `(client, route)` by reference.
#[inline]
fn visit_pair<C: Clone + Hash + Eq, V: KeyVisitor<(C, String)>>(
    client: &C,
    route: &str,
    visitor: V,
) -> V::Output {
    let pair = PairRef { client, route };
    let pair: &dyn PairKey<C> = &pair;
    visitor.borrowed(pair, pair_to_owned::<C>)
}

/// The crate's route extractors, each read from a request's head as its
/// `visit_route` reads it from `Parts`.
#[derive(Debug, Clone, Copy)]
enum BuiltinRoute {
    Path,
    MethodPath,
    #[cfg(feature = "axum")]
    MatchedPath,
}

impl BuiltinRoute {
    /// Which one `route` is, if it is one of them. The type ids are
    /// constants of the build: the answer is folded away.
    #[inline]
    fn of<R: RouteExtractor>(route: &R) -> Option<BuiltinRoute> {
        let route: &dyn Any = route;
        #[cfg(feature = "axum")]
        if route.is::<super::MatchedPathKey>() {
            return Some(BuiltinRoute::MatchedPath);
        }
        if route.is::<super::MethodPathKey>() {
            Some(BuiltinRoute::MethodPath)
        } else if route.is::<super::PathKey>() {
            Some(BuiltinRoute::Path)
        } else {
            None
        }
    }

    /// Calls `f` with the route of `head`.
    #[inline]
    fn visit<H: Head, T>(self, head: &H, f: impl FnOnce(&str) -> T) -> T {
        match self {
            BuiltinRoute::Path => {
                let path = head.uri().path();
                if path.len() > super::MAX_KEY_BYTES {
                    return f(&super::bounded::text_key(&[path]));
                }
                f(path)
            }
            BuiltinRoute::MethodPath => super::with_method_and(head.method(), head.uri().path(), f),
            #[cfg(feature = "axum")]
            BuiltinRoute::MatchedPath => {
                match head.extensions().get::<axum::extract::MatchedPath>() {
                    Some(path) => super::with_method_and(head.method(), path.as_str(), f),
                    None => f(super::MatchedPathKey::UNMATCHED),
                }
            }
        }
    }
}

/// A [`KeyExtractor`] whose key is a route as text, usable as the route
/// part of a [`ClientRouteKey`]: it can hand the route over borrowed, so
/// that a request of a known key allocates nothing for it.
///
/// Implemented by `MatchedPathKey`, [`MethodPathKey`](crate::MethodPathKey)
/// and [`PathKey`](crate::PathKey), which write the route into a buffer on
/// the stack, and by every closure `Fn(&Parts) -> String` (with the
/// provided method: the closure's `String`). An extractor of your own whose
/// key is a `String` implements it with an empty `impl` block, or
/// overrides [`visit_route`](Self::visit_route).
///
/// ```
/// use http::request::Parts;
/// use tower_sliding_window::key::RouteExtractor;
/// use tower_sliding_window::{ClientRouteKey, KeyExtractor, PeerIpKey, SlidingWindowLayer};
///
/// /// The API version, from the first path segment.
/// #[derive(Clone)]
/// struct Version;
///
/// impl KeyExtractor for Version {
///     type Key = String;
///     fn extract(&self, parts: &Parts) -> String {
///         parts.uri.path().split('/').nth(1).unwrap_or_default().to_owned()
///     }
/// }
///
/// impl RouteExtractor for Version {}
///
/// let layer = SlidingWindowLayer::qps(10)
///     .key(ClientRouteKey::new(PeerIpKey, Version))
///     .route_rule("v1", 2);
/// # let _ = layer;
/// ```
pub trait RouteExtractor: KeyExtractor<Key = String> {
    /// Calls `f` with the route of the request: the text
    /// [`extract`](KeyExtractor::extract) would return, borrowed where the
    /// extractor can. The provided method calls `extract`.
    #[inline]
    fn visit_route<T>(&self, parts: &Parts, f: impl FnOnce(&str) -> T) -> T {
        f(&self.extract(parts))
    }
}

impl<F> RouteExtractor for F where F: Fn(&Parts) -> String + Clone + Send + Sync + 'static {}

impl RouteExtractor for super::PathKey {
    #[inline]
    fn visit_route<T>(&self, parts: &Parts, f: impl FnOnce(&str) -> T) -> T {
        BuiltinRoute::Path.visit(parts, f)
    }
}

impl RouteExtractor for super::MethodPathKey {
    #[inline]
    fn visit_route<T>(&self, parts: &Parts, f: impl FnOnce(&str) -> T) -> T {
        BuiltinRoute::MethodPath.visit(parts, f)
    }
}

#[cfg(feature = "axum")]
impl RouteExtractor for super::MatchedPathKey {
    #[inline]
    fn visit_route<T>(&self, parts: &Parts, f: impl FnOnce(&str) -> T) -> T {
        BuiltinRoute::MatchedPath.visit(parts, f)
    }
}

/// The borrowed form of a pair key `(client, route)`, which the key table
/// looks a request's key up by (see [`KeyExtractor::visit`]): `(C, String)`
/// borrows as `dyn PairKey<C>`, which hashes and compares as the pair does.
/// The layer uses it; you need it only to write a [`KeyVisitor`].
pub trait PairKey<C> {
    /// The client part.
    fn client(&self) -> &C;
    /// The route part.
    fn route(&self) -> &str;
}

impl<C> PairKey<C> for (C, String) {
    fn client(&self) -> &C {
        &self.0
    }

    fn route(&self) -> &str {
        &self.1
    }
}

/// A request's pair key, borrowed.
struct PairRef<'a, C> {
    client: &'a C,
    route: &'a str,
}

impl<C> PairKey<C> for PairRef<'_, C> {
    fn client(&self) -> &C {
        self.client
    }

    fn route(&self) -> &str {
        self.route
    }
}

/// As the pair `(C, String)` hashes: its client part, then its route part
/// as a `str` (what a `String` hashes as), with nothing between them.
impl<C: Hash> Hash for dyn PairKey<C> + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.client().hash(state);
        self.route().hash(state);
    }
}

impl<C: PartialEq> PartialEq for dyn PairKey<C> + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.client() == other.client() && self.route() == other.route()
    }
}

impl<C: Eq> Eq for dyn PairKey<C> + '_ {}

impl<'a, C: 'a> Borrow<dyn PairKey<C> + 'a> for (C, String) {
    fn borrow(&self) -> &(dyn PairKey<C> + 'a) {
        self
    }
}

/// The owned pair of a borrowed one: made only for a key the table has not
/// seen.
fn pair_to_owned<'p, C: Clone>(pair: &(dyn PairKey<C> + 'p)) -> (C, String) {
    (pair.client().clone(), pair.route().to_owned())
}

/// The route part of a pair key: what route rules are looked up by.
#[inline]
pub(crate) fn route_part<C>(key: &(C, String)) -> &str {
    key.1.as_str()
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, SocketAddr};

    use http::Request;

    use super::*;
    use crate::key::{PeerIpKey, MAX_KEY_BYTES};
    use crate::MethodPathKey;

    fn parts(request: Request<()>) -> Parts {
        request.into_parts().0
    }

    #[test]
    fn the_key_is_the_client_and_the_route() {
        let key = ClientRouteKey::new(PeerIpKey, MethodPathKey);
        let mut request = Request::post("/login?next=/").body(()).unwrap();
        let peer: SocketAddr = "10.0.0.7:5000".parse().unwrap();
        request.extensions_mut().insert(peer);
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(
            key.extract(&parts(request)),
            (Some(ip), "POST /login".to_owned())
        );
        let no_peer = parts(Request::get("/").body(()).unwrap());
        assert_eq!(key.extract(&no_peer), (None, "GET /".to_owned()));
    }

    /// The borrowed form hashes and compares as the owned pair, and each
    /// route extractor's borrowed route is its key.
    #[test]
    fn the_borrowed_pair_is_the_owned_pair() {
        use std::hash::BuildHasher;
        let hasher = std::hash::RandomState::new();
        let long = format!("/{}", "p".repeat(MAX_KEY_BYTES));
        for uri in ["/login?x=1", "/", long.as_str()] {
            for method in [http::Method::GET, http::Method::HEAD, http::Method::POST] {
                let mut request = Request::get(uri).body(()).unwrap();
                *request.method_mut() = method.clone();
                let peer: SocketAddr = "10.0.0.7:5000".parse().unwrap();
                request.extensions_mut().insert(peer);
                let p = parts(request);
                let by_method = ClientRouteKey::new(PeerIpKey, MethodPathKey);
                let by_path = ClientRouteKey::new(PeerIpKey, crate::PathKey);
                for key in [by_method.extract(&p), by_path.extract(&p)] {
                    let borrowed: &dyn PairKey<Option<IpAddr>> = &key;
                    assert_eq!(hasher.hash_one(&key), hasher.hash_one(borrowed));
                }
                assert_eq!(
                    by_method.visit(&p, crate::key::ToOwnedKey),
                    by_method.extract(&p)
                );
                assert_eq!(
                    by_path.visit(&p, crate::key::ToOwnedKey),
                    by_path.extract(&p)
                );
                let closure = ClientRouteKey::new(PeerIpKey, |p: &Parts| p.uri.path().to_owned());
                assert_eq!(
                    closure.visit(&p, crate::key::ToOwnedKey),
                    closure.extract(&p)
                );
            }
        }
        let a = (Some(1u8), "x".to_owned());
        let b = (Some(1u8), "y".to_owned());
        let (a, b): (&dyn PairKey<Option<u8>>, &dyn PairKey<Option<u8>>) = (&a, &b);
        assert!(a != b);
        assert!(a == a);
    }

    #[test]
    fn a_long_route_is_bounded_by_the_route_extractor() {
        let key = ClientRouteKey::new(PeerIpKey, MethodPathKey);
        let long = format!("/{}", "a".repeat(16 * 1024));
        let (_, route) = key.extract(&parts(Request::get(long.as_str()).body(()).unwrap()));
        assert!(route.len() <= crate::key::MAX_DIGEST_KEY_BYTES, "{route}");
        assert!(MAX_KEY_BYTES < long.len());
        assert_eq!(route_part(&(None::<IpAddr>, route.clone())), route);
    }
}
