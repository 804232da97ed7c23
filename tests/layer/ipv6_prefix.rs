//! IPv6 clients keyed by their network prefix (a /64 unless told
//! otherwise) in `PeerIpKey` and `ForwardedIpKey`.
//!
//! A client is given at least a /64, so it can pick any of 2^64 source
//! addresses: keyed by the whole address, one host would be a million
//! clients. These tests flood one /64 with random host bits and check that
//! it is one key, limited as one client, while distinct networks stay
//! distinct keys and IPv4 clients are keyed as before.

use crate::support;

use std::collections::HashSet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{HeaderValue, Request, StatusCode};
use tower_sliding_window::key::{ForwardedHeader, ForwardedIpKey};
use tower_sliding_window::{KeyExtractor, PeerIpKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, send};

/// A small deterministic generator (SplitMix64), so a failure names the
/// addresses it used: rerunning gives the same ones.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn next_u128(&mut self) -> u128 {
        (u128::from(self.next()) << 64) | u128::from(self.next())
    }
}

/// The /64 the floods come from: `2001:db8:5:7::/64`.
const NETWORK: u128 = 0x2001_0db8_0005_0007 << 64;

fn v6(bits: u128) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(bits))
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// `count` addresses of `NETWORK` with random host bits, all distinct.
fn hosts_of_one_network(count: usize, seed: u64) -> Vec<IpAddr> {
    let mut rng = SplitMix(seed);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let host = v6(NETWORK | u128::from(rng.next()));
        if seen.insert(host) {
            out.push(host);
        }
    }
    out
}

/// A request from `peer` (port 5000) with the given header lines.
fn request(peer: Option<IpAddr>, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut builder = Request::get("/");
    for (name, value) in headers {
        builder = builder.header(*name, HeaderValue::from_bytes(value).expect("header value"));
    }
    let mut request = builder.body(Body::empty()).expect("valid request");
    if let Some(peer) = peer {
        request.extensions_mut().insert(SocketAddr::new(peer, 5000));
    }
    request
}

fn parts(request: Request<Body>) -> Parts {
    request.into_parts().0
}

fn peer_key<E: KeyExtractor<Key = Option<IpAddr>>>(extractor: &E, peer: IpAddr) -> Option<IpAddr> {
    extractor.extract(&parts(request(Some(peer), &[])))
}

fn app(layer: SlidingWindowLayer<impl KeyExtractor<Key = Option<IpAddr>>>) -> Router {
    Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer)
}

/// The IPv6 proxy in front of the service in the forwarding tests.
const PROXY: &str = "2001:db8:ffff::1";

#[test]
fn ten_thousand_hosts_of_one_network_are_one_peer_key() {
    let hosts = hosts_of_one_network(10_000, 1);
    let keys: HashSet<_> = hosts.iter().map(|&h| peer_key(&PeerIpKey, h)).collect();
    assert!(
        keys == HashSet::from([Some(ip("2001:db8:5:7::"))]),
        "{} keys, e.g. {:?}",
        keys.len(),
        keys.iter().take(3).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_flood_from_one_network_is_limited_as_one_client() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let mut answers = Vec::with_capacity(10_000);
    for host in hosts_of_one_network(10_000, 2) {
        answers.push(send(&app, request(Some(host), &[])).await.status);
    }
    assert!(
        answers == ok_then_429(5, 9_995),
        "{} passed of 10 000, {}",
        answers.iter().filter(|s| **s == StatusCode::OK).count(),
        at(&clock)
    );
    assert_eq!(
        stats.len(),
        1,
        "{:?}",
        stats.keys().iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(stats.keys(), [Some(ip("2001:db8:5:7::"))]);
    let snapshot = stats.snapshot(&Some(ip("2001:db8:5:7::"))).expect("a key");
    assert_eq!((snapshot.pass, snapshot.block), (5, 9_995));
}

#[tokio::test]
async fn a_flood_through_a_trusted_proxy_is_limited_as_one_client() {
    // The attacker varies both its real source address (within its /64)
    // and the entries it puts at the left of the chain.
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(ForwardedIpKey::trusted_proxies([ip(PROXY)]))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let mut rng = SplitMix(3);
    let mut answers = Vec::with_capacity(10_000);
    for host in hosts_of_one_network(10_000, 4) {
        let spoofed = v6(rng.next_u128());
        let chain = format!("{spoofed}, {host}");
        let req = request(Some(ip(PROXY)), &[("x-forwarded-for", chain.as_bytes())]);
        answers.push(send(&app, req).await.status);
    }
    assert!(
        answers == ok_then_429(5, 9_995),
        "{} passed of 10 000, {}",
        answers.iter().filter(|s| **s == StatusCode::OK).count(),
        at(&clock)
    );
    assert_eq!(
        stats.len(),
        1,
        "{:?}",
        stats.keys().iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(stats.keys(), [Some(ip("2001:db8:5:7::"))]);
}

#[tokio::test]
async fn clients_of_distinct_networks_are_distinct_keys() {
    // 2 000 networks, each differing from the others somewhere in its 64
    // prefix bits (some only in the last one), each with random host bits.
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let mut rng = SplitMix(5);
    let mut networks = HashSet::new();
    let mut hosts = Vec::new();
    for i in 0..2_000u128 {
        let network = if i < 1_000 {
            NETWORK ^ (i << 64)
        } else {
            u128::from(rng.next()) << 64
        };
        if networks.insert(network) {
            hosts.push(v6(network | u128::from(rng.next())));
        }
    }
    let keys: HashSet<_> = hosts.iter().map(|&h| peer_key(&PeerIpKey, h)).collect();
    assert_eq!(keys.len(), hosts.len());

    for &host in &hosts {
        assert_eq!(
            send(&app, request(Some(host), &[])).await.status,
            StatusCode::OK,
            "{host} shares a key, {}",
            at(&clock)
        );
    }
    assert_eq!(stats.len(), hosts.len());
    // A second host of the first network is limited with the first.
    let sibling = v6(NETWORK | 0xdead_beef);
    assert_eq!(
        send(&app, request(Some(sibling), &[])).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn ipv4_and_ipv4_mapped_peers_are_keyed_by_their_ipv4_address() {
    for (peer, key) in [
        ("203.0.113.7", "203.0.113.7"),
        ("255.255.255.255", "255.255.255.255"),
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("::ffff:255.255.255.255", "255.255.255.255"),
    ] {
        assert_eq!(peer_key(&PeerIpKey, ip(peer)), Some(ip(key)), "{peer}");
        assert_eq!(
            peer_key(&ForwardedIpKey::trusted_hops(1), ip(peer)),
            Some(ip(key)),
            "{peer}"
        );
    }
}

#[test]
fn forwarded_ip_key_masks_the_address_it_picks() {
    let xff = |v: &str| key_with_xff(&ForwardedIpKey::trusted_hops(1), ip(PROXY), v);
    assert_eq!(
        xff("6.6.6.6, [2001:db8:1:2:aaaa:bbbb:cccc:dddd]:443"),
        Some(ip("2001:db8:1:2::"))
    );
    // Spoofed entries left of the one the proxy appended change nothing.
    assert_eq!(
        xff("2001:db8:1:3::1, 2001:db8:1:2::9"),
        Some(ip("2001:db8:1:2::"))
    );
    // IPv4 and IPv4-mapped clients behind an IPv6 proxy: as before.
    assert_eq!(xff("203.0.113.7"), Some(ip("203.0.113.7")));
    assert_eq!(xff("::ffff:203.0.113.7"), Some(ip("203.0.113.7")));
    // No address: the proxy's key, which is its network too.
    assert_eq!(xff("2001:db8:1:2::9, unknown"), Some(ip("2001:db8:ffff::")));
}

#[test]
fn forwarded_ip_key_trusts_exact_proxy_addresses_not_their_network() {
    // A host next to the proxy, in its /64, is not the proxy: its
    // forwarding header is not believed, and it is keyed by its own
    // network (the proxy's).
    let trusted = ForwardedIpKey::trusted_proxies([ip(PROXY)]);
    assert_eq!(
        key_with_xff(&trusted, ip("2001:db8:ffff::2"), "203.0.113.7"),
        Some(ip("2001:db8:ffff::"))
    );
    // The proxy itself is believed.
    assert_eq!(
        key_with_xff(&trusted, ip(PROXY), "203.0.113.7"),
        Some(ip("203.0.113.7"))
    );
    // An entry in the proxy's /64 that is not the proxy ends the walk.
    assert_eq!(
        key_with_xff(&trusted, ip(PROXY), "203.0.113.7, 2001:db8:ffff::2"),
        Some(ip("2001:db8:ffff::"))
    );
    // An IPv6 inner proxy, listed exactly, is skipped.
    let both = ForwardedIpKey::trusted_proxies([ip(PROXY), ip("2001:db8:fffe::3")]);
    assert_eq!(
        key_with_xff(
            &both,
            ip(PROXY),
            "6.6.6.6, 2001:db8:1:2:3:4:5:6, 2001:db8:fffe::3"
        ),
        Some(ip("2001:db8:1:2::"))
    );
}

fn key_with_xff(extractor: &ForwardedIpKey, peer: IpAddr, value: &str) -> Option<IpAddr> {
    extractor.extract(&parts(request(
        Some(peer),
        &[("x-forwarded-for", value.as_bytes())],
    )))
}

/// Keys of `peer` by `PeerIpKey.ipv6_prefix(len)` and by a one-hop
/// `ForwardedIpKey` with that length reading it from `X-Forwarded-For`;
/// both must agree.
fn keys_at(len: u8, client: &str) -> Option<IpAddr> {
    let peer = peer_key(&PeerIpKey.ipv6_prefix(len), ip(client));
    let forwarded = key_with_xff(
        &ForwardedIpKey::trusted_hops(1).ipv6_prefix(len),
        ip(PROXY),
        client,
    );
    assert_eq!(peer, forwarded, "/{len} of {client}");
    peer
}

#[test]
fn prefix_lengths_mask_bit_exactly() {
    let all = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
    let host = "2001:db8:abcd:12ff:89ab:cdef:123:4567";
    let cases = [
        (1, all, "8000::"),
        (1, "7fff:ffff::1", "::"),
        (48, all, "ffff:ffff:ffff::"),
        (48, host, "2001:db8:abcd::"),
        (56, all, "ffff:ffff:ffff:ff00::"),
        (56, host, "2001:db8:abcd:1200::"),
        (64, all, "ffff:ffff:ffff:ffff::"),
        (64, host, "2001:db8:abcd:12ff::"),
        (127, all, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"),
        (127, host, "2001:db8:abcd:12ff:89ab:cdef:123:4566"),
        (128, all, all),
        (128, host, host),
        // Lengths that are not a multiple of 8 or 16.
        (61, all, "ffff:ffff:ffff:fff8::"),
        (13, host, "2000::"),
    ];
    for (len, client, key) in cases {
        assert_eq!(keys_at(len, client), Some(ip(key)), "/{len} of {client}");
    }
}

#[test]
fn a_prefix_keeps_its_last_bit_and_drops_the_first_host_bit() {
    // For each length: two addresses that differ only in the last bit of
    // the prefix are two keys; two that differ only in the first bit after
    // it are one.
    let mut rng = SplitMix(6);
    for len in [1u8, 48, 56, 64, 127, 128] {
        for _ in 0..100 {
            let bits = rng.next_u128();
            let last = 1u128 << (128 - u32::from(len));
            let a = v6(bits).to_string();
            let b = v6(bits ^ last).to_string();
            assert_ne!(keys_at(len, &a), keys_at(len, &b), "/{len}: {a} and {b}");
            if len < 128 {
                let c = v6(bits ^ (last >> 1)).to_string();
                assert_eq!(keys_at(len, &a), keys_at(len, &c), "/{len}: {a} and {c}");
            }
        }
    }
}

#[test]
fn ipv4_and_mapped_clients_ignore_the_prefix_length() {
    for len in [1, 48, 56, 64, 127, 128] {
        for (client, key) in [
            ("203.0.113.7", "203.0.113.7"),
            ("::ffff:203.0.113.7", "203.0.113.7"),
            ("::ffff:255.255.255.255", "255.255.255.255"),
        ] {
            assert_eq!(keys_at(len, client), Some(ip(key)), "/{len} of {client}");
        }
    }
}

#[test]
#[should_panic(expected = "PeerIpKey::ipv6_prefix: invalid `len`: must be 1..=128 (got 0)")]
fn peer_ip_key_refuses_a_zero_prefix() {
    let _ = PeerIpKey.ipv6_prefix(0);
}

#[test]
#[should_panic(expected = "PeerIpKey::ipv6_prefix: invalid `len`: must be 1..=128 (got 129)")]
fn peer_ip_key_refuses_a_prefix_of_129() {
    let _ = PeerIpKey.ipv6_prefix(129);
}

#[test]
#[should_panic(expected = "PeerIpPrefixKey::ipv6_prefix: invalid `len`: must be 1..=128 (got 0)")]
fn a_configured_peer_ip_key_refuses_a_zero_prefix() {
    let _ = PeerIpKey.ipv6_prefix(64).ipv6_prefix(0);
}

#[test]
#[should_panic(expected = "ForwardedIpKey::ipv6_prefix: invalid `len`: must be 1..=128 (got 0)")]
fn forwarded_ip_key_refuses_a_zero_prefix() {
    let _ = ForwardedIpKey::trusted_hops(1).ipv6_prefix(0);
}

#[test]
#[should_panic(expected = "ForwardedIpKey::ipv6_prefix: invalid `len`: must be 1..=128 (got 129)")]
fn forwarded_ip_key_refuses_a_prefix_of_129() {
    let _ = ForwardedIpKey::trusted_proxies([ip(PROXY)]).ipv6_prefix(129);
}

#[test]
fn forwarded_ip_key_keeps_its_protections_under_a_prefix() {
    // Hostile chains give the same answers as before, cut to the prefix.
    let hops = ForwardedIpKey::trusted_hops(1).ipv6_prefix(48);
    // Garbage, obfuscated or non-UTF-8 entries: the proxy's key.
    for value in [
        &b"2001:db8:1:2::9, garbage"[..],
        b"2001:db8:1:2::9, _hidden",
        b"2001:db8:1:2::9\xff",
        b"2001:db8:1:2::9, fe80::1%eth0",
    ] {
        assert_eq!(
            hops.extract(&parts(request(
                Some(ip(PROXY)),
                &[("x-forwarded-for", value)]
            ))),
            Some(ip("2001:db8:ffff::")),
            "{value:?}"
        );
    }
    // A chain far past MAX_FORWARDED_ENTRIES of trusted proxies: the peer.
    let trusted = ForwardedIpKey::trusted_proxies([ip(PROXY), ip("2001:db8:fffe::3")]);
    let mut value = String::from("2001:db8:1:2::9");
    for _ in 0..10_000 {
        value.push_str(", 2001:db8:fffe::3");
    }
    assert_eq!(
        key_with_xff(&trusted, ip(PROXY), &value),
        Some(ip("2001:db8:ffff::"))
    );
    // The other headers: the prefix applies to what they name.
    let forwarded = ForwardedIpKey::trusted_hops(1)
        .ipv6_prefix(56)
        .header(ForwardedHeader::Forwarded);
    assert_eq!(
        forwarded.extract(&parts(request(
            Some(ip(PROXY)),
            &[(
                "forwarded",
                b"for=\"[2001:db8:6:6::6]\", for=\"[2001:db8:7:12ab::1]:4711\""
            )]
        ))),
        Some(ip("2001:db8:7:1200::"))
    );
    let real_ip = ForwardedIpKey::trusted_hops(1)
        .header(ForwardedHeader::XRealIp)
        .ipv6_prefix(56);
    assert_eq!(
        real_ip.extract(&parts(request(
            Some(ip(PROXY)),
            &[("x-real-ip", b"2001:db8:7:12ab::1")]
        ))),
        Some(ip("2001:db8:7:1200::"))
    );
    // No peer address known: the peer still counts as the first hop.
    assert_eq!(
        hops.extract(&parts(request(
            None,
            &[("x-forwarded-for", b"2001:db8:6::6, 2001:db8:7:12ab::1")]
        ))),
        Some(ip("2001:db8:7::"))
    );
    assert_eq!(hops.extract(&parts(request(None, &[]))), None);
}

#[tokio::test]
async fn rules_name_the_network_address() {
    let clock = clock();
    let partner = ip("2001:db8:7:12ab::1");
    let key = PeerIpKey.ipv6_prefix(56);
    let layer = SlidingWindowLayer::qps(1)
        .key(key)
        .rule(key.key_of(partner), 3)
        .clock(clock.clone());
    let app = app(layer);
    let mut answers = Vec::new();
    for host in [
        "2001:db8:7:12ab::1",
        "2001:db8:7:1200::2",
        "2001:db8:7:12ff::3",
        "2001:db8:7:1234::4",
    ] {
        answers.push(send(&app, request(Some(ip(host)), &[])).await.status);
    }
    assert_eq!(answers, ok_then_429(3, 1), "{}", at(&clock));
    assert_eq!(key.key_of(partner), ip("2001:db8:7:1200::"));
    assert_eq!(PeerIpKey.key_of(partner), ip("2001:db8:7:12ab::"));
}
