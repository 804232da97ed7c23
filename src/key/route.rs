//! `ClientRouteKey`: a key with a client part and a route part, so that one
//! rule can name a route and apply to every client of it separately.

use http::request::Parts;

use super::KeyExtractor;

/// Keys each request by its client **and** its route: the key is the pair
/// `(client, route)`, for example `(Some(10.0.0.7), "POST /login")`.
///
/// It composes two extractors: `client` (any [`KeyExtractor`]:
/// [`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey),
/// [`HeaderKey`](crate::HeaderKey), a closure) and `route`, an extractor
/// whose key is the route as text. `MatchedPathKey` (feature `axum`) is the
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
/// layer's default limit. See the
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
/// The key owns its route text (at most
/// [`MAX_KEY_BYTES`](crate::key::MAX_KEY_BYTES) bytes with the built-in
/// route extractors, which key a longer route by its digest form), so a
/// request builds it: one allocation of the route's length per request,
/// besides the client part's own. Finding a new key's route rule is one
/// hash lookup of the route part, whatever the number of rules and clients.
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
    R: KeyExtractor<Key = String>,
{
    type Key = (C::Key, String);

    #[inline]
    fn extract(&self, parts: &Parts) -> (C::Key, String) {
        (self.client.extract(parts), self.route.extract(parts))
    }
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
