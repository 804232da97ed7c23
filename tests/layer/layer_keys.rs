//! Key extractors through an axum `Router`: each built-in, closures, and the
//! fallback key of every built-in whose source is missing. A missing source
//! is limited like any other key: never a 500, never a panic.

use crate::support;

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, MatchedPath};
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{HeaderName, Request, StatusCode};
use tower_sliding_window::{HeaderKey, KeyExtractor, MethodPathKey, PeerIpKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, req, req_with, send};

async fn hello() -> &'static str {
    "hello"
}

fn app<X: KeyExtractor>(layer: SlidingWindowLayer<X>) -> Router {
    Router::new()
        .route("/", get(hello).post(hello))
        .route("/users/{id}", get(hello))
        .layer(layer)
}

/// Sends `requests` in order and returns their statuses.
async fn run(app: &Router, requests: Vec<Request<axum::body::Body>>) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for request in requests {
        out.push(send(app, request).await.status);
    }
    out
}

fn with_peer(addr: &str) -> Request<axum::body::Body> {
    let mut request = req("/");
    let addr: SocketAddr = addr.parse().expect("socket address");
    request.extensions_mut().insert(addr);
    request
}

fn with_connect_info(addr: &str) -> Request<axum::body::Body> {
    let mut request = req("/");
    let addr: SocketAddr = addr.parse().expect("socket address");
    request.extensions_mut().insert(ConnectInfo(addr));
    request
}

#[tokio::test]
async fn header_key_falls_back_to_none_for_an_absent_header() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let anonymous = run(&app, (0..3).map(|_| req("/")).collect()).await;
    assert_eq!(anonymous, ok_then_429(2, 1), "{}", at(&clock));
    let keyed = run(
        &app,
        (0..3).map(|_| req_with("/", "x-api-key", "k1")).collect(),
    )
    .await;
    assert_eq!(keyed, ok_then_429(2, 1), "{}", at(&clock));

    assert_eq!(
        stats.snapshot(&None).map(|s| (s.pass, s.block)),
        Some((2, 1))
    );
    assert_eq!(
        stats
            .snapshot(&Some("k1".to_owned()))
            .map(|s| (s.pass, s.block)),
        Some((2, 1))
    );
    assert_eq!(stats.len(), 2);
}

#[tokio::test]
async fn header_key_rule_on_the_absent_header() {
    // Requests without the header can get their own (here: stricter) limit.
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .rule(None, 1)
        .clock(clock.clone());
    let app = app(layer);

    let anonymous = run(&app, (0..2).map(|_| req("/")).collect()).await;
    assert_eq!(anonymous, ok_then_429(1, 1), "{}", at(&clock));
    let keyed = run(
        &app,
        (0..2).map(|_| req_with("/", "x-api-key", "k")).collect(),
    )
    .await;
    assert_eq!(keyed, ok_then_429(2, 0), "{}", at(&clock));
}

#[tokio::test]
async fn header_key_with_a_non_utf8_value_is_still_a_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .clock(clock.clone());
    let app = app(layer);
    let odd = || {
        Request::get("/")
            .header(
                "x-api-key",
                http::HeaderValue::from_bytes(b"\xff\xfe").expect("opaque header value"),
            )
            .body(axum::body::Body::empty())
            .expect("valid request")
    };
    assert_eq!(run(&app, vec![odd(), odd()]).await, ok_then_429(1, 1));
}

#[tokio::test]
async fn peer_ip_key_falls_back_to_none_without_a_peer_address() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(&app, (0..3).map(|_| req("/")).collect()).await;
    assert_eq!(got, ok_then_429(2, 1), "{}", at(&clock));
    assert_eq!(stats.keys(), [None]);
}

#[tokio::test]
async fn peer_ip_key_reads_a_socket_addr_extension() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(
        &app,
        vec![
            with_peer("10.0.0.1:1000"),
            // Same IP, another port: the same key.
            with_peer("10.0.0.1:2000"),
            with_peer("[2001:db8::1]:443"),
            req("/"),
        ],
    )
    .await;
    use StatusCode as S;
    assert_eq!(
        got,
        [S::OK, S::TOO_MANY_REQUESTS, S::OK, S::OK],
        "{}",
        at(&clock)
    );
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    assert_eq!(
        stats.snapshot(&Some(ip)).map(|s| (s.pass, s.block)),
        Some((1, 1))
    );
    assert_eq!(stats.len(), 3, "{:?}", stats.keys());
}

#[tokio::test]
async fn peer_ip_key_treats_an_ipv4_mapped_address_as_the_ipv4_address() {
    // A dual-stack listener (bound to `[::]`) sees IPv4 clients as
    // `::ffff:a.b.c.d`. A rule written for the IPv4 address must apply, and
    // both forms of one client must share one window.
    let clock = clock();
    let ip: IpAddr = "10.0.0.1".parse().unwrap();
    let layer = SlidingWindowLayer::qps(5)
        .key(PeerIpKey)
        .rule(Some(ip), 1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(
        &app,
        vec![
            with_peer("[::ffff:10.0.0.1]:1000"),
            with_peer("10.0.0.1:2000"),
        ],
    )
    .await;
    assert_eq!(got, ok_then_429(1, 1), "{}", at(&clock));
    assert_eq!(stats.keys(), [Some(ip)]);
}

/// With the crate's `axum` feature, axum's `ConnectInfo<SocketAddr>` is read.
#[cfg(feature = "axum")]
#[tokio::test]
async fn peer_ip_key_reads_connect_info() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(
        &app,
        vec![
            with_connect_info("192.0.2.7:5000"),
            with_connect_info("192.0.2.7:5001"),
            with_connect_info("192.0.2.8:5000"),
        ],
    )
    .await;
    use StatusCode as S;
    assert_eq!(got, [S::OK, S::TOO_MANY_REQUESTS, S::OK], "{}", at(&clock));
    let ip: IpAddr = "192.0.2.7".parse().unwrap();
    assert_eq!(stats.snapshot(&Some(ip)).map(|s| s.block), Some(1));
    assert!(stats.snapshot(&None).is_none(), "{:?}", stats.keys());
}

/// Without the crate's `axum` feature, `ConnectInfo` is not looked at (the
/// crate does not know the type): such requests share the fallback key.
#[cfg(not(feature = "axum"))]
#[tokio::test]
async fn peer_ip_key_without_the_axum_feature_ignores_connect_info() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(
        &app,
        vec![
            with_connect_info("192.0.2.7:5000"),
            with_connect_info("192.0.2.8:5000"),
        ],
    )
    .await;
    assert_eq!(got, ok_then_429(1, 1), "{}", at(&clock));
    assert_eq!(stats.keys(), [None]);
}

#[tokio::test]
async fn method_path_key_tells_methods_apart() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(MethodPathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    let post = || {
        Request::post("/")
            .body(axum::body::Body::empty())
            .expect("valid request")
    };

    let got = run(&app, vec![req("/"), post(), req("/?q=1"), post()]).await;
    use StatusCode as S;
    assert_eq!(
        got,
        [S::OK, S::OK, S::TOO_MANY_REQUESTS, S::TOO_MANY_REQUESTS],
        "{}",
        at(&clock)
    );
    let mut keys = stats.keys();
    keys.sort();
    assert_eq!(keys, ["GET /", "POST /"]);
}

#[tokio::test]
async fn a_closure_reads_the_matched_path_without_the_axum_feature() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .key(|parts: &Parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map(|path| path.as_str().to_owned())
        })
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let got = run(
        &app,
        vec![req("/users/1"), req("/users/2"), req("/users/3"), req("/")],
    )
    .await;
    use StatusCode as S;
    assert_eq!(
        got,
        [S::OK, S::OK, S::TOO_MANY_REQUESTS, S::OK],
        "every user id shares the route's key {}",
        at(&clock)
    );
    assert_eq!(
        stats
            .snapshot(&Some("/users/{id}".to_owned()))
            .map(|s| s.pass),
        Some(2)
    );

    // Under `Router::layer`, unmatched requests reach the layer with no
    // matched path: they share the `None` key and still get their 404.
    for _ in 0..2 {
        let answer = send(&app, req("/nowhere")).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", at(&clock));
    }
    assert_eq!(stats.snapshot(&None).map(|s| s.pass), Some(2));
}

#[cfg(feature = "axum")]
mod matched_path {
    use super::*;
    use tower_sliding_window::MatchedPathKey;

    #[tokio::test]
    async fn keys_by_method_and_route_template() {
        let clock = clock();
        let layer = SlidingWindowLayer::qps(2)
            .key(MatchedPathKey)
            .rule("GET /", 1)
            .clock(clock.clone());
        let stats = layer.handle();
        let app = app(layer);

        let got = run(
            &app,
            vec![
                req("/users/1"),
                req("/users/2?x=y"),
                req("/users/3"),
                req("/"),
                req("/"),
            ],
        )
        .await;
        use StatusCode as S;
        assert_eq!(
            got,
            [
                S::OK,
                S::OK,
                S::TOO_MANY_REQUESTS,
                S::OK,
                S::TOO_MANY_REQUESTS
            ],
            "{}",
            at(&clock)
        );
        let mut keys = stats.keys();
        keys.sort();
        assert_eq!(keys, ["GET /", "GET /users/{id}"]);
    }

    #[tokio::test]
    async fn unmatched_requests_share_one_limited_key_and_keep_their_404() {
        let clock = clock();
        let layer = SlidingWindowLayer::qps(2)
            .key(MatchedPathKey)
            .clock(clock.clone());
        let stats = layer.handle();
        let app = app(layer);

        let mut got = Vec::new();
        for path in ["/a", "/b", "/c"] {
            got.push(send(&app, req(path)).await.status);
        }
        use StatusCode as S;
        assert_eq!(
            got,
            [S::NOT_FOUND, S::NOT_FOUND, S::TOO_MANY_REQUESTS],
            "{}",
            at(&clock)
        );
        assert_eq!(stats.keys(), [MatchedPathKey::UNMATCHED]);
    }

    #[tokio::test]
    async fn under_route_layer_unmatched_requests_are_not_counted() {
        let clock = clock();
        let layer = SlidingWindowLayer::qps(1)
            .key(MatchedPathKey)
            .clock(clock.clone());
        let stats = layer.handle();
        let app = Router::new()
            .route("/users/{id}", get(hello))
            .route_layer(layer);

        for _ in 0..3 {
            assert_eq!(
                send(&app, req("/nowhere")).await.status,
                StatusCode::NOT_FOUND
            );
        }
        assert_eq!(send(&app, req("/users/9")).await.status, StatusCode::OK);
        assert_eq!(stats.keys(), ["GET /users/{id}"]);
    }
}
