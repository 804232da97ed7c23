//! Keys chosen by a hostile client, through an axum `Router`: header
//! values that are not UTF-8, maximum-size header values and paths, and
//! `HEAD` requests against `GET` rules.

use crate::support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use tower_sliding_window::{HeaderKey, KeyExtractor, MethodPathKey, PathKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, send};

async fn hello() -> &'static str {
    "hello"
}

fn app<X: KeyExtractor>(layer: SlidingWindowLayer<X>) -> Router {
    Router::new()
        .route("/x", get(hello))
        .route("/users/{id}", get(hello))
        .layer(layer)
}

fn request(method: Method, uri: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .expect("valid request")
}

fn with_key(value: &[u8]) -> Request<Body> {
    Request::get("/x")
        .header(
            "x-key",
            HeaderValue::from_bytes(value).expect("a valid header value"),
        )
        .body(Body::empty())
        .expect("valid request")
}

async fn statuses(
    app: &Router,
    requests: impl IntoIterator<Item = Request<Body>>,
) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for request in requests {
        out.push(send(app, request).await.status);
    }
    out
}

// Axum answers HEAD with the GET handler, and HEAD was keyed
// `HEAD /x`, so a strict `GET /x` rule let every HEAD through.
#[tokio::test]
async fn head_requests_count_against_the_get_rule_of_method_path_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(50)
        .key(MethodPathKey)
        .rule("GET /x", 2)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let heads = statuses(&app, (0..3).map(|_| request(Method::HEAD, "/x"))).await;
    assert_eq!(heads, ok_then_429(2, 1), "{}", at(&clock));
    let get = statuses(&app, [request(Method::GET, "/x")]).await;
    assert_eq!(
        get,
        ok_then_429(0, 1),
        "GET shares the limit, {}",
        at(&clock)
    );
    assert_eq!(stats.keys(), ["GET /x".to_owned()]);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn head_requests_count_against_the_get_rule_of_matched_path_key() {
    use tower_sliding_window::MatchedPathKey;

    let clock = clock();
    let layer = SlidingWindowLayer::qps(50)
        .key(MatchedPathKey)
        .rule("GET /users/{id}", 2)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/users/{id}", get(hello))
        .route_layer(layer);

    let mixed = statuses(
        &app,
        [
            request(Method::HEAD, "/users/1"),
            request(Method::GET, "/users/2"),
            request(Method::HEAD, "/users/3"),
            request(Method::GET, "/users/4"),
        ],
    )
    .await;
    assert_eq!(mixed, ok_then_429(2, 2), "{}", at(&clock));
    let snapshot = stats.snapshot("GET /users/{id}").expect("one key");
    assert_eq!((snapshot.pass, snapshot.block), (2, 2));
    assert_eq!(stats.len(), 1);
}

// Lossy conversion put these three values under one key.
#[tokio::test]
async fn header_values_that_differ_in_invalid_bytes_are_distinct_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let values: [&[u8]; 4] = [
        b"acme\xff",
        b"acme\xfe",
        "acme\u{fffd}".as_bytes(),
        b"acme\\xff",
    ];
    let first = statuses(&app, values.iter().map(|v| with_key(v))).await;
    assert_eq!(first, ok_then_429(4, 0), "four keys, {}", at(&clock));
    let again = statuses(&app, values.iter().map(|v| with_key(v))).await;
    assert_eq!(
        again,
        ok_then_429(0, 4),
        "each at its limit, {}",
        at(&clock)
    );
    assert_eq!(stats.len(), 4);

    // The documented forms: valid UTF-8 verbatim, the rest escaped after DEL.
    let mut keys: Vec<String> = stats.keys().into_iter().flatten().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "acme\\xff",
            "acme\u{fffd}",
            "\x7facme\\xfe",
            "\x7facme\\xff"
        ]
    );
    assert!(stats.snapshot(&Some("\x7facme\\xff".to_owned())).is_some());
}

// A header value of ~400 KB was kept whole as the key.
#[tokio::test]
async fn maximum_size_header_values_are_kept_as_short_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    let big = |last: u8| {
        let mut value = vec![b'v'; 400 * 1024];
        *value.last_mut().expect("not empty") = last;
        value
    };
    // Differing only in their last byte: still two keys, each limited.
    let answers = statuses(
        &app,
        [
            with_key(&big(b'a')),
            with_key(&big(b'b')),
            with_key(&big(b'a')),
        ],
    )
    .await;
    assert_eq!(
        answers,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "{}",
        at(&clock)
    );
    let keys = stats.keys();
    assert_eq!(keys.len(), 2);
    for key in keys.into_iter().flatten() {
        assert!(key.len() <= 100, "a key of {} bytes", key.len());
        assert!(key.starts_with(&"v".repeat(64)), "{key}");
    }
}

#[tokio::test]
async fn long_paths_are_kept_as_short_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(hello).layer(layer);

    let long_a = format!("/{}a", "p".repeat(8 * 1024));
    let long_b = format!("/{}b", "p".repeat(8 * 1024));
    let answers = statuses(
        &app,
        [
            request(Method::GET, &long_a),
            request(Method::GET, &long_b),
            request(Method::GET, &long_a),
        ],
    )
    .await;
    assert_eq!(
        answers,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "{}",
        at(&clock)
    );
    for key in stats.keys() {
        assert!(key.len() <= 100, "a key of {} bytes", key.len());
    }
}
