//! `ForwardedIpKey` against clients that lie in their forwarding headers.

use crate::support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{HeaderValue, Request};
use tower_sliding_window::key::{ForwardedHeader, ForwardedIpKey, MAX_FORWARDED_ENTRIES};
use tower_sliding_window::{KeyExtractor, SlidingWindowLayer};

use support::{at, clock, ok_then_429, send};

const PROXY: &str = "10.0.0.2";
const INNER_PROXY: &str = "10.0.0.3";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

/// A request from `peer` (port 5000) with the given header lines.
fn request(peer: Option<&str>, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut builder = Request::get("/");
    for (name, value) in headers {
        builder = builder.header(*name, HeaderValue::from_bytes(value).expect("header value"));
    }
    let mut request = builder.body(Body::empty()).expect("valid request");
    if let Some(peer) = peer {
        request
            .extensions_mut()
            .insert(SocketAddr::new(ip(peer), 5000));
    }
    request
}

fn parts(request: Request<Body>) -> Parts {
    request.into_parts().0
}

fn key(
    extractor: &ForwardedIpKey,
    peer: Option<&str>,
    headers: &[(&str, &[u8])],
) -> Option<IpAddr> {
    extractor.extract(&parts(request(peer, headers)))
}

fn proxies() -> ForwardedIpKey {
    ForwardedIpKey::trusted_proxies([ip(PROXY), ip(INNER_PROXY)])
}

#[test]
fn one_hop_keys_the_entry_the_proxy_appended_not_the_spoofed_leftmost() {
    let one = ForwardedIpKey::trusted_hops(1);
    let xff = |v: &'static [u8]| [("x-forwarded-for", v)];
    assert_eq!(
        key(&one, Some(PROXY), &xff(b"6.6.6.6, 203.0.113.7")),
        Some(ip("203.0.113.7"))
    );
    assert_eq!(
        key(&one, Some(PROXY), &xff(b"1.2.3.4,5.6.7.8 ,203.0.113.7")),
        Some(ip("203.0.113.7"))
    );
    // Two hops: the outer proxy's view.
    let two = ForwardedIpKey::trusted_hops(2);
    assert_eq!(
        key(&two, Some(PROXY), &xff(b"6.6.6.6, 203.0.113.7, 10.0.0.3")),
        Some(ip("203.0.113.7"))
    );
    // A client that reaches the service directly, without the header.
    assert_eq!(
        key(&one, Some("198.51.100.1"), &[]),
        Some(ip("198.51.100.1"))
    );
    // No peer address known: the peer still counts as the first hop.
    assert_eq!(
        key(&one, None, &xff(b"6.6.6.6, 203.0.113.7")),
        Some(ip("203.0.113.7"))
    );
    assert_eq!(key(&one, None, &[]), None);
}

#[test]
fn trusted_proxies_ignore_headers_from_anyone_else() {
    let key_of = |peer: &str, value: &'static [u8]| {
        key(&proxies(), Some(peer), &[("x-forwarded-for", value)])
    };
    // Through both proxies.
    assert_eq!(
        key_of(PROXY, b"6.6.6.6, 203.0.113.7, 10.0.0.3"),
        Some(ip("203.0.113.7"))
    );
    // Straight from a client: its header is not believed.
    assert_eq!(
        key_of("198.51.100.1", b"203.0.113.7"),
        Some(ip("198.51.100.1"))
    );
    // Every entry a proxy: the walk ends on the peer.
    assert_eq!(key_of(PROXY, b"10.0.0.3, 10.0.0.2"), Some(ip(PROXY)));
}

#[test]
fn entries_that_are_no_address_fall_back_to_the_peer() {
    let one = ForwardedIpKey::trusted_hops(1);
    for value in [
        &b"203.0.113.7, garbage"[..],
        b"203.0.113.7, unknown",
        b"203.0.113.7, 1.2.3.4.5",
        b"203.0.113.7, fe80::1%eth0",
        b"203.0.113.7\xff",
        b"203.0.113.7, \xc3\x28",
    ] {
        assert_eq!(
            key(&one, Some(PROXY), &[("x-forwarded-for", value)]),
            Some(ip(PROXY)),
            "{value:?}"
        );
    }
    // Empty list elements are skipped, as HTTP lists allow.
    assert_eq!(
        key(&one, Some(PROXY), &[("x-forwarded-for", b"203.0.113.7, ,")]),
        Some(ip("203.0.113.7"))
    );
}

#[test]
fn ports_brackets_and_mapped_addresses() {
    // Full IPv6 addresses (a /128), to see that every bit is parsed; then
    // the default /64.
    let full = ForwardedIpKey::trusted_hops(1).ipv6_prefix(128);
    let one = ForwardedIpKey::trusted_hops(1);
    let cases: [(&[u8], &str, &str); 4] = [
        (b"[2001:db8::7]:4711", "2001:db8::7", "2001:db8::"),
        (b"[2001:db8::7]", "2001:db8::7", "2001:db8::"),
        (b"203.0.113.7:80", "203.0.113.7", "203.0.113.7"),
        (b"::ffff:203.0.113.7", "203.0.113.7", "203.0.113.7"),
    ];
    for (value, address, network) in cases {
        assert_eq!(
            key(&full, Some(PROXY), &[("x-forwarded-for", value)]),
            Some(ip(address)),
            "{value:?}"
        );
        assert_eq!(
            key(&one, Some(PROXY), &[("x-forwarded-for", value)]),
            Some(ip(network)),
            "{value:?}"
        );
    }
}

#[test]
fn rfc_7239_forwarded() {
    let one = ForwardedIpKey::trusted_hops(1).header(ForwardedHeader::Forwarded);
    let forwarded = |v: &'static [u8]| [("forwarded", v)];
    let ipv6 = forwarded(b"for=6.6.6.6, for=\"[2001:db8:cafe::17]:4711\";proto=https");
    assert_eq!(
        key(&one.clone().ipv6_prefix(128), Some(PROXY), &ipv6),
        Some(ip("2001:db8:cafe::17"))
    );
    // Keyed by its /64 by default.
    assert_eq!(key(&one, Some(PROXY), &ipv6), Some(ip("2001:db8:cafe::")));
    assert_eq!(
        key(
            &one,
            Some(PROXY),
            &forwarded(b"proto=http;For=203.0.113.7;by=10.0.0.2")
        ),
        Some(ip("203.0.113.7"))
    );
    // Obfuscated or unknown: no address, so the proxy's key.
    assert_eq!(
        key(
            &one,
            Some(PROXY),
            &forwarded(b"for=203.0.113.7, for=_hidden")
        ),
        Some(ip(PROXY))
    );
    assert_eq!(
        key(&one, Some(PROXY), &forwarded(b"for=unknown")),
        Some(ip(PROXY))
    );
    // X-Forwarded-For is not read when Forwarded is configured.
    assert_eq!(
        key(&one, Some(PROXY), &[("x-forwarded-for", b"203.0.113.7")]),
        Some(ip(PROXY))
    );
}

#[test]
fn x_real_ip() {
    let one = ForwardedIpKey::trusted_hops(1).header(ForwardedHeader::XRealIp);
    assert_eq!(
        key(&one, Some(PROXY), &[("x-real-ip", b"203.0.113.7")]),
        Some(ip("203.0.113.7"))
    );
}

#[test]
fn repeated_header_lines_are_one_list_in_order() {
    let two = ForwardedIpKey::trusted_hops(2);
    let headers: [(&str, &[u8]); 2] = [
        ("x-forwarded-for", b"6.6.6.6, 203.0.113.7"),
        ("x-forwarded-for", b"10.0.0.3"),
    ];
    assert_eq!(key(&two, Some(PROXY), &headers), Some(ip("203.0.113.7")));
}

#[test]
fn a_chain_of_ten_thousand_entries_is_cut_short() {
    // 10 000 entries that all name a trusted proxy, behind the client: the
    // walk stops after MAX_FORWARDED_ENTRIES and keys by the peer.
    let mut value = b"203.0.113.7".to_vec();
    for _ in 0..10_000 {
        value.extend_from_slice(b", 10.0.0.3");
    }
    assert_eq!(
        key(&proxies(), Some(PROXY), &[("x-forwarded-for", &value)]),
        Some(ip(PROXY))
    );
    // Within the cap, the same chain reaches the client.
    let mut short = b"203.0.113.7".to_vec();
    for _ in 0..MAX_FORWARDED_ENTRIES - 2 {
        short.extend_from_slice(b", 10.0.0.3");
    }
    assert_eq!(
        key(&proxies(), Some(PROXY), &[("x-forwarded-for", &short)]),
        Some(ip("203.0.113.7"))
    );
    // 10 000 empty elements count towards the cap too.
    let commas = format!("203.0.113.7{}", ",".repeat(10_000));
    assert_eq!(
        key(
            &ForwardedIpKey::trusted_hops(1),
            Some(PROXY),
            &[("x-forwarded-for", commas.as_bytes())]
        ),
        Some(ip(PROXY))
    );
}

#[test]
#[should_panic(expected = "invalid `trusted_hops`")]
fn zero_trusted_hops_is_rejected_at_construction() {
    let _ = ForwardedIpKey::trusted_hops(0);
}

#[test]
#[should_panic(expected = "invalid `trusted_proxies`")]
fn an_empty_proxy_set_is_rejected_at_construction() {
    let _ = ForwardedIpKey::trusted_proxies(Vec::<Ipv4Addr>::new());
}

#[tokio::test]
async fn clients_that_vary_the_spoofed_entry_share_one_limit() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .key(ForwardedIpKey::trusted_hops(1))
        .rule(Ipv4Addr::new(198, 51, 100, 50), 3)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "hi" }))
        .layer(layer);

    let mut answers = Vec::new();
    for i in 0..4 {
        let value = format!("10.9.9.{i}, 203.0.113.7");
        let req = request(Some(PROXY), &[("x-forwarded-for", value.as_bytes())]);
        answers.push(send(&app, req).await.status);
    }
    assert_eq!(answers, ok_then_429(2, 2), "{}", at(&clock));
    assert_eq!(
        stats.snapshot(&Some(ip("203.0.113.7"))).map(|s| s.block),
        Some(2)
    );
    // Rules name the client's address.
    let mut answers = Vec::new();
    for _ in 0..4 {
        let req = request(Some(PROXY), &[("x-forwarded-for", b"198.51.100.50")]);
        answers.push(send(&app, req).await.status);
    }
    assert_eq!(answers, ok_then_429(3, 1), "{}", at(&clock));
}
