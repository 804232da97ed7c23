//! `IntoKey`: what `rule`, `set_limit` and friends accept as a key.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A value that names a key of type `K`: what
/// [`rule`](crate::SlidingWindowLayer::rule) and
/// [`set_limit`](crate::StatsHandle::set_limit) accept.
///
/// Every key type names itself. On top of that, a rule can be written the
/// way the key reads:
///
/// | key type | also accepts |
/// |---|---|
/// | `String` ([`PathKey`](crate::PathKey), [`MethodPathKey`](crate::MethodPathKey), `MatchedPathKey`) | `&str`, `&String`, `Cow<str>`, `Box<str>` |
/// | `Option<T>` ([`HeaderKey`](crate::HeaderKey), [`PeerIpKey`](crate::PeerIpKey)) | a `T`, which names `Some(T)` |
/// | `Option<String>` ([`HeaderKey`](crate::HeaderKey)) | `&str`, `&String` |
/// | `IpAddr`, `Option<IpAddr>` | `Ipv4Addr`, `Ipv6Addr` |
/// | `Arc<str>`, `Box<str>` | `&str`, `String` |
/// | `(C, String)` ([`ClientRouteKey`](crate::ClientRouteKey)) | `(client, &str)`, where `client` names a `C` as above: `(Ipv4Addr::LOCALHOST, "POST /login")` |
///
/// ```
/// use std::net::Ipv4Addr;
/// use http::HeaderName;
/// use tower_sliding_window::{HeaderKey, PeerIpKey, SlidingWindowLayer};
///
/// let by_tenant = SlidingWindowLayer::qps(10)
///     .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
///     .rule("internal", 1_000); // the key `Some("internal")`
/// let by_peer = SlidingWindowLayer::qps(10)
///     .key(PeerIpKey)
///     .rule(Ipv4Addr::LOCALHOST, 1_000); // the key `Some(127.0.0.1)`
/// # let _ = (by_tenant, by_peer);
/// ```
///
/// A closure extractor's own key type names itself; implement this trait
/// for other values that should name it.
pub trait IntoKey<K> {
    /// The key this value names.
    fn into_key(self) -> K;
}

impl<K> IntoKey<K> for K {
    fn into_key(self) -> K {
        self
    }
}

/// A value names the key `Some(value)`: a header value, a peer address.
impl<T> IntoKey<Option<T>> for T {
    fn into_key(self) -> Option<T> {
        Some(self)
    }
}

impl IntoKey<String> for &str {
    fn into_key(self) -> String {
        self.to_owned()
    }
}

impl IntoKey<String> for &String {
    fn into_key(self) -> String {
        self.clone()
    }
}

impl IntoKey<String> for Cow<'_, str> {
    fn into_key(self) -> String {
        self.into_owned()
    }
}

impl IntoKey<String> for Box<str> {
    fn into_key(self) -> String {
        self.into()
    }
}

impl IntoKey<Option<String>> for &str {
    fn into_key(self) -> Option<String> {
        Some(self.to_owned())
    }
}

impl IntoKey<Option<String>> for &String {
    fn into_key(self) -> Option<String> {
        Some(self.clone())
    }
}

impl IntoKey<Arc<str>> for &str {
    fn into_key(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoKey<Arc<str>> for String {
    fn into_key(self) -> Arc<str> {
        Arc::from(self)
    }
}

impl IntoKey<Box<str>> for &str {
    fn into_key(self) -> Box<str> {
        Box::from(self)
    }
}

impl IntoKey<Box<str>> for String {
    fn into_key(self) -> Box<str> {
        self.into_boxed_str()
    }
}

impl IntoKey<IpAddr> for Ipv4Addr {
    fn into_key(self) -> IpAddr {
        IpAddr::V4(self)
    }
}

impl IntoKey<IpAddr> for Ipv6Addr {
    fn into_key(self) -> IpAddr {
        IpAddr::V6(self)
    }
}

impl IntoKey<Option<IpAddr>> for Ipv4Addr {
    fn into_key(self) -> Option<IpAddr> {
        Some(IpAddr::V4(self))
    }
}

impl IntoKey<Option<IpAddr>> for Ipv6Addr {
    fn into_key(self) -> Option<IpAddr> {
        Some(IpAddr::V6(self))
    }
}

/// A client and a route name a pair key `(client, route)`: the client as
/// it names the client part, the route as text.
impl<C, T: IntoKey<C>> IntoKey<(C, String)> for (T, &str) {
    fn into_key(self) -> (C, String) {
        (self.0.into_key(), self.1.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<K>(value: impl IntoKey<K>) -> K {
        value.into_key()
    }

    #[test]
    fn strings_name_string_and_optional_string_keys() {
        assert_eq!(key::<String>("/a"), "/a");
        assert_eq!(key::<Option<String>>("t"), Some("t".to_owned()));
        assert_eq!(key::<Option<String>>("t".to_owned()), Some("t".to_owned()));
        assert_eq!(key::<Option<String>>(None), None);
        assert_eq!(&*key::<Arc<str>>("x"), "x");
    }

    #[test]
    fn a_client_and_a_route_name_a_pair() {
        assert_eq!(
            key::<(Option<IpAddr>, String)>((Ipv4Addr::LOCALHOST, "POST /login")),
            (
                Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                "POST /login".to_owned()
            )
        );
        assert_eq!(
            key::<(Option<String>, String)>(("acme", "GET /")),
            (Some("acme".to_owned()), "GET /".to_owned())
        );
        assert_eq!(
            key::<(Option<IpAddr>, String)>((None, "GET /")),
            (None, "GET /".to_owned())
        );
    }

    #[test]
    fn addresses_name_optional_addresses() {
        assert_eq!(
            key::<Option<IpAddr>>(Ipv4Addr::LOCALHOST),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(
            key::<Option<IpAddr>>(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            Some(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
    }
}
