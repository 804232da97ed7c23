//! `ForwardedIpKey`: the client address behind trusted reverse proxies.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use http::{Extensions, HeaderMap, Request};

use super::{
    canonical_ip_key, checked_ipv6_prefix, ip_key, peer_ip, KeyExtractor, KeyVisitor,
    DEFAULT_IPV6_PREFIX,
};

/// Most entries of a forwarding chain that [`ForwardedIpKey`] examines per
/// request, the peer address included. A longer chain costs no more: the
/// walk stops there and the key falls back to the peer address.
pub const MAX_FORWARDED_ENTRIES: usize = 32;

/// Longest chain entry (or `for=` value) parsed; a longer one is not an
/// address.
const MAX_ENTRY_BYTES: usize = 64;

/// Longest `Forwarded` element (`for=..;by=..;host=..;proto=..`) whose
/// parameters are searched for `for`; a longer one names no address.
const MAX_ELEMENT_BYTES: usize = 1024;

/// Which header [`ForwardedIpKey`] reads the forwarding chain from.
///
/// Exactly one is read: a header your proxy does not set is one a client can
/// send through it as it likes, so reading several would let clients choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for="[2001:db8::1]:4711"`: the `for`
    /// parameter of each element.
    Forwarded,
    /// `X-Real-IP: client`, as nginx's `proxy_set_header X-Real-IP` sets it.
    XRealIp,
}

impl ForwardedHeader {
    fn name(self) -> HeaderName {
        match self {
            ForwardedHeader::XForwardedFor => HeaderName::from_static("x-forwarded-for"),
            ForwardedHeader::Forwarded => FORWARDED,
            ForwardedHeader::XRealIp => HeaderName::from_static("x-real-ip"),
        }
    }
}

/// Whom a [`ForwardedIpKey`] trusts to append to the chain.
#[derive(Debug, Clone)]
enum Trust {
    /// This many proxies in front of the service; the peer is the first.
    Hops(usize),
    /// Exactly these addresses, sorted for a binary search.
    Proxies(Arc<[IpAddr]>),
}

/// The client's IP address for a service behind reverse proxies, read from
/// `X-Forwarded-For`, `Forwarded` or `X-Real-IP` (one of them, see
/// [`header`](Self::header)); key type `Option<IpAddr>`, like
/// [`PeerIpKey`](super::PeerIpKey).
///
/// Every proxy appends the address it received the request from, so the
/// chain reads `client, proxy1, proxy2`, then the peer address of the
/// connection itself (read from where [`PeerIpKey`](super::PeerIpKey)
/// reads it, in full). A client can put anything at the left of the chain;
/// only what trusted proxies appended is true. So the chain is walked
/// **from the right**, starting with the peer address, skipping trusted
/// proxies, and the key is the first address that is not one:
///
/// - [`trusted_hops(n)`](Self::trusted_hops): `n` proxies stand in front of
///   the service, the peer being the first: the key is the `n + 1`-th
///   address from the right. With the peer address unknown, the peer still
///   counts as the first hop.
/// - [`trusted_proxies([..])`](Self::trusted_proxies): these exact addresses
///   are proxies. A request whose peer is not one of them keys by its peer
///   address, whatever its headers say.
///
/// The leftmost, client-supplied entry is never trusted unless the walk
/// reaches it. Entries are separated by commas, also across repeated header
/// lines (in order); empty entries are skipped. An entry may be an IPv4 or
/// IPv6 address, with a port (`192.0.2.1:80`, `[2001:db8::1]:443`) or IPv6
/// in brackets; IPv4-mapped IPv6 addresses are keyed as IPv4. When the walk
/// meets an entry that is no address (`unknown`, an obfuscated `_hidden`,
/// garbage, bytes that are not UTF-8, an entry longer than 64 bytes or a
/// `Forwarded` element longer than 1 KiB), runs out of entries, or has examined
/// [`MAX_FORWARDED_ENTRIES`], the key falls back to the peer address, and to
/// `None` without one: such requests share their proxy's key, which is
/// limited like any other.
///
/// # IPv6 clients
///
/// The address the walk picks is keyed as [`PeerIpKey`](super::PeerIpKey)
/// keys a peer: an IPv6 client by its /64 network (its first
/// [`DEFAULT_IPV6_PREFIX`] bits, the others zero; so
/// `2001:db8:1:2:aaaa:bbbb:cccc:dddd` is keyed as `2001:db8:1:2::`), an
/// IPv4 or IPv4-mapped client by its IPv4 address.
/// [`ipv6_prefix`](Self::ipv6_prefix) sets another length. Only the key
/// is cut to the prefix: the walk compares the chain's full addresses with
/// the trusted proxies, so a host in a proxy's network is not the proxy,
/// and its header is not believed. A fallback to the peer address keys
/// the peer by its prefix too.
///
/// ```
/// use std::net::Ipv4Addr;
/// use tower_sliding_window::key::{ForwardedHeader, ForwardedIpKey};
/// use tower_sliding_window::SlidingWindowLayer;
///
/// // One load balancer in front, which appends to X-Forwarded-For.
/// let behind_one = SlidingWindowLayer::qps(20).key(ForwardedIpKey::trusted_hops(1));
///
/// // Two known proxies that set RFC 7239 `Forwarded`.
/// let behind_known = SlidingWindowLayer::qps(20).key(
///     ForwardedIpKey::trusted_proxies([Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 3)])
///         .header(ForwardedHeader::Forwarded),
/// );
///
/// // IPv6 clients by their /56 rather than their /64.
/// let by_site = SlidingWindowLayer::qps(20).key(ForwardedIpKey::trusted_hops(1).ipv6_prefix(56));
/// # let _ = (behind_one, behind_known, by_site);
/// ```
#[derive(Debug, Clone)]
pub struct ForwardedIpKey {
    header: ForwardedHeader,
    name: HeaderName,
    trust: Trust,
    /// In `1..=128`, checked at construction.
    ipv6_prefix: u8,
}

impl ForwardedIpKey {
    /// Trusts the `n` proxies nearest to the service (the peer and the
    /// `n - 1` entries it and the others appended).
    ///
    /// # Panics
    ///
    /// When `n` is 0 (that trusts no proxy: use
    /// [`PeerIpKey`](super::PeerIpKey)) or not below
    /// [`MAX_FORWARDED_ENTRIES`].
    pub fn trusted_hops(n: usize) -> Self {
        assert!(
            n > 0,
            "ForwardedIpKey::trusted_hops: invalid `trusted_hops`: must be at least 1 \
             (got 0; to trust no proxy, use PeerIpKey)"
        );
        assert!(
            n < MAX_FORWARDED_ENTRIES,
            "ForwardedIpKey::trusted_hops: invalid `trusted_hops`: must be below \
             MAX_FORWARDED_ENTRIES = {MAX_FORWARDED_ENTRIES} (got {n})"
        );
        Self::with(Trust::Hops(n))
    }

    /// Trusts exactly these proxy addresses (no ranges). IPv4-mapped IPv6
    /// addresses are taken as IPv4.
    ///
    /// # Panics
    ///
    /// When `proxies` is empty (that trusts no proxy: use
    /// [`PeerIpKey`](super::PeerIpKey)).
    pub fn trusted_proxies<I>(proxies: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<IpAddr>,
    {
        let mut proxies: Vec<IpAddr> = proxies
            .into_iter()
            .map(|ip| ip.into().to_canonical())
            .collect();
        assert!(
            !proxies.is_empty(),
            "ForwardedIpKey::trusted_proxies: invalid `trusted_proxies`: must name at least \
             one address (got none; to trust no proxy, use PeerIpKey)"
        );
        proxies.sort_unstable();
        proxies.dedup();
        Self::with(Trust::Proxies(proxies.into()))
    }

    fn with(trust: Trust) -> Self {
        let header = ForwardedHeader::default();
        ForwardedIpKey {
            header,
            name: header.name(),
            trust,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Reads the chain from `header` (default
    /// [`XForwardedFor`](ForwardedHeader::XForwardedFor)): the one your
    /// proxies set.
    pub fn header(self, header: ForwardedHeader) -> Self {
        ForwardedIpKey {
            header,
            name: header.name(),
            ..self
        }
    }

    /// Keys IPv6 clients by their first `len` bits (default
    /// [`DEFAULT_IPV6_PREFIX`], 64), the others set to zero; `128` keys
    /// them by their full address. IPv4 and IPv4-mapped clients are keyed
    /// by their IPv4 address whatever the length. Which address is the
    /// client's does not change: see [IPv6 clients](Self#ipv6-clients).
    ///
    /// ```
    /// use std::net::IpAddr;
    /// use http::Request;
    /// use tower_sliding_window::key::ForwardedIpKey;
    /// use tower_sliding_window::KeyExtractor;
    ///
    /// let key = ForwardedIpKey::trusted_hops(1).ipv6_prefix(48);
    /// let request = Request::get("/")
    ///     .header("x-forwarded-for", "2001:db8:7:12ab::1")
    ///     .body(())
    ///     .unwrap();
    /// let ip = key.extract(&request.into_parts().0);
    /// assert_eq!(ip, Some("2001:db8:7::".parse::<IpAddr>().unwrap()));
    /// ```
    ///
    /// # Panics
    ///
    /// When `len` is not in `1..=128`.
    #[track_caller]
    pub fn ipv6_prefix(self, len: u8) -> Self {
        ForwardedIpKey {
            ipv6_prefix: checked_ipv6_prefix("ForwardedIpKey::ipv6_prefix", len),
            ..self
        }
    }

    /// The key of a client found at `ip`: `ip` itself for IPv4, the IPv4
    /// address of an IPv4-mapped one, the network address of the prefix
    /// for any other IPv6 address. What a rule for that client names.
    pub fn key_of(&self, ip: impl Into<IpAddr>) -> IpAddr {
        ip_key(ip.into(), self.ipv6_prefix)
    }

    /// The chain's header entries, right to left, each parsed (`None`: no
    /// address); empty entries left out. Lazy: nothing past what the walk
    /// takes is split or parsed.
    fn entries_from_right<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> impl Iterator<Item = Entry> + 'a {
        let header = self.header;
        headers
            .get_all(&self.name)
            .iter()
            .rev()
            .flat_map(|value| value.as_bytes().rsplit(|&b| b == b','))
            .map(move |entry| {
                let entry = entry.trim_ascii();
                if entry.is_empty() {
                    Entry::Empty
                } else {
                    Entry::from(match header {
                        ForwardedHeader::Forwarded => parse_forwarded_element(entry),
                        _ => parse_node(entry),
                    })
                }
            })
    }
}

/// One entry of the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Addr(IpAddr),
    NotAnAddress,
    Empty,
}

impl From<Option<IpAddr>> for Entry {
    fn from(ip: Option<IpAddr>) -> Self {
        ip.map_or(Entry::NotAnAddress, Entry::Addr)
    }
}

impl KeyExtractor for ForwardedIpKey {
    type Key = Option<IpAddr>;

    fn extract(&self, parts: &Parts) -> Option<IpAddr> {
        self.key_in(&parts.headers, &parts.extensions)
    }

    #[inline]
    fn visit_request<B, V: KeyVisitor<Option<IpAddr>>>(
        &self,
        request: &Request<B>,
        visitor: V,
    ) -> Result<V::Output, V> {
        Ok(visitor.owned(self.key_in(request.headers(), request.extensions())))
    }
}

impl ForwardedIpKey {
    /// The key of a request with these headers and extensions.
    fn key_in(&self, headers: &HeaderMap, extensions: &Extensions) -> Option<IpAddr> {
        // The peer's full address: trust is decided on exact addresses,
        // only the key is cut to the prefix.
        let peer = peer_ip(extensions);
        // The whole chain from the right: the peer, then the header's
        // entries; at most MAX_FORWARDED_ENTRIES of it, empty ones included,
        // so that no header makes the walk longer.
        let chain = peer
            .map(Entry::Addr)
            .into_iter()
            .chain(self.entries_from_right(headers))
            .take(MAX_FORWARDED_ENTRIES)
            .filter(|entry| *entry != Entry::Empty);
        let found = match &self.trust {
            Trust::Hops(n) => {
                // The peer is the first hop whether or not its address is
                // known; an unknown one is simply not in the chain.
                let skip = if peer.is_some() { *n } else { n - 1 };
                chain.into_iter().nth(skip)
            }
            Trust::Proxies(proxies) => {
                let is_proxy = |ip: &IpAddr| proxies.binary_search(ip).is_ok();
                let mut chain = chain;
                chain.find(|entry| !matches!(entry, Entry::Addr(ip) if is_proxy(ip)))
            }
        };
        let ip = match found {
            Some(Entry::Addr(ip)) => Some(ip),
            _ => peer,
        };
        // Canonical: the peer's from `peer_ip`, a header's from `parse_node`.
        ip.map(|ip| canonical_ip_key(ip, self.ipv6_prefix))
    }
}

/// A node as `X-Forwarded-For` or `X-Real-IP` write it, or as the value of a
/// `for=` parameter: an address, an address with a port, or an IPv6 address
/// in brackets with or without a port.
fn parse_node(entry: &[u8]) -> Option<IpAddr> {
    if entry.len() > MAX_ENTRY_BYTES {
        return None;
    }
    let text = std::str::from_utf8(entry).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Some(addr.ip().to_canonical());
    }
    let bracketed = text.strip_prefix('[')?.strip_suffix(']')?;
    bracketed
        .parse::<Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

/// The address in the `for` parameter of one `Forwarded` element
/// (`for=192.0.2.60;proto=http;by=203.0.113.43`), if it names one.
fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    if element.len() > MAX_ELEMENT_BYTES {
        return None;
    }
    let value = element.split(|&b| b == b';').find_map(|pair| {
        let pair = pair.trim_ascii();
        let (name, value) = pair.split_at(pair.iter().position(|&b| b == b'=')?);
        name.trim_ascii()
            .eq_ignore_ascii_case(b"for")
            .then(|| value[1..].trim_ascii())
    })?;
    let value = match value {
        [b'"', inner @ .., b'"'] => inner,
        _ => value,
    };
    parse_node(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes() {
        let v4 = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(parse_node(b"192.0.2.1"), v4("192.0.2.1"));
        assert_eq!(parse_node(b"192.0.2.1:8080"), v4("192.0.2.1"));
        assert_eq!(parse_node(b"[2001:db8::1]:443"), v4("2001:db8::1"));
        assert_eq!(parse_node(b"[2001:db8::1]"), v4("2001:db8::1"));
        assert_eq!(parse_node(b"2001:db8::1"), v4("2001:db8::1"));
        assert_eq!(parse_node(b"::ffff:10.0.0.1"), v4("10.0.0.1"));
        for garbage in [
            &b"unknown"[..],
            b"_hidden",
            b"",
            b"1.2.3",
            b"[1.2.3.4]",
            b"fe80::1%eth0",
            b"10.0.0.1\xff",
        ] {
            assert_eq!(parse_node(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn forwarded_elements() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(
            parse_forwarded_element(b"for=192.0.2.60;proto=http;by=203.0.113.43"),
            ip("192.0.2.60")
        );
        assert_eq!(
            parse_forwarded_element(b"proto=https; For=\"[2001:db8:cafe::17]:4711\""),
            ip("2001:db8:cafe::17")
        );
        assert_eq!(parse_forwarded_element(b"for=_hidden"), None);
        assert_eq!(parse_forwarded_element(b"for=unknown"), None);
        assert_eq!(parse_forwarded_element(b"by=192.0.2.1"), None);
        assert_eq!(parse_forwarded_element(b"for"), None);
        assert_eq!(parse_forwarded_element(b"for=\""), None);
        let mut padded = b"for=192.0.2.60".to_vec();
        padded.extend(std::iter::repeat_n(b';', MAX_ELEMENT_BYTES));
        assert_eq!(parse_forwarded_element(&padded), None);
    }
}
