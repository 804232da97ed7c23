//! Response options: a custom status, a custom rejection builder, the
//! RateLimit fields on passed responses, the legacy `X-RateLimit-*` fields,
//! policy names (which never carry a raw key), and the settings that panic
//! at construction. The `tracing` side of policy names is in
//! `layer_tracing.rs`.

use crate::support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderName, Request, Response, StatusCode};
use tower_sliding_window::response::Rejection;
use tower_sliding_window::{HeaderKey, KeyExtractor, PathKey, PeerIpKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, req, req_with, send, statuses, Answer};

async fn hello() -> &'static str {
    "hello"
}

fn app<X: KeyExtractor>(layer: SlidingWindowLayer<X>) -> Router {
    Router::new().route("/", get(hello)).layer(layer)
}

#[tokio::test]
async fn a_custom_status_keeps_the_header_fields() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .clock(clock.clone());
    let app = app(layer);

    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.retry_after(), 1);
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=1;w=1"#);
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
    // The default body names the status it is sent with, not 429's.
    assert_eq!(answer.body, "Service Unavailable: retry in 1 s\n");
}

#[tokio::test]
async fn reject_with_builds_the_response_and_the_fields_are_added() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .window(Duration::from_secs(10), 10)
        .reject_with(|rejection| {
            let body = format!(
                r#"{{"error":"rate_limited","limit":{},"window_s":{},"retry_after_s":{},"policy":"{}"}}"#,
                rejection.limit,
                rejection.window.as_secs(),
                rejection.retry_after_secs(),
                rejection.policy
            );
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Bytes::from(body))
                .expect("valid response")
        })
        .clock(clock.clone());
    let app = app(layer);

    assert_eq!(statuses(&app, "/", 2).await, ok_then_429(2, 0));
    clock.advance(Duration::from_millis(2_500));
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.header("content-type"), "application/json");
    // The passes sit in the bucket at 10 000 ms; it leaves the 10 s window at
    // 20 000 ms, 7.45 s from now.
    assert_eq!(
        answer.body,
        r#"{"error":"rate_limited","limit":2,"window_s":10,"retry_after_s":8,"policy":"default"}"#,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.retry_after(), 8, "{}", at(&clock));
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=2;w=10"#);
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=8"#);
}

/// A builder that answers with the refusal's reason and status in the body
/// (`<reason> <status>`), under `status`, and 400 as its own status.
fn naming_builder(rejection: &Rejection) -> Response<Bytes> {
    let body = format!("{:?} {}", rejection.reason(), rejection.status.as_u16());
    Response::builder()
        .status(StatusCode::BAD_REQUEST)
        .body(Bytes::from(body))
        .expect("valid response")
}

#[tokio::test]
async fn reject_with_sees_window_and_overflow_refusals_with_their_reason() {
    let clock = clock();
    // One slot in the key table, held by `a`; every other key shares the
    // overflow entry, which admits nothing.
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .max_keys(1)
        .overflow_limit(0)
        .status(StatusCode::IM_A_TEAPOT)
        .reject_with(naming_builder)
        .clock(clock.clone());
    let app = app(layer);

    assert_eq!(
        send(&app, req_with("/", "x-key", "a")).await.status,
        StatusCode::OK
    );
    let window = send(&app, req_with("/", "x-key", "a")).await;
    assert_eq!(
        window.status,
        StatusCode::BAD_REQUEST,
        "the builder's status"
    );
    assert_eq!(window.body, "Window 418", "{}", at(&clock));
    assert_eq!(window.header("ratelimit-policy"), r#""default";q=1;w=1"#);

    let overflow = send(&app, req_with("/", "x-key", "b")).await;
    assert_eq!(overflow.body, "Overflow 418", "{}", at(&clock));
    assert_eq!(overflow.header("ratelimit-policy"), r#""overflow";q=0;w=1"#);
    assert_eq!(overflow.retry_after(), 1);
}

#[tokio::test]
async fn reject_with_keeps_fields_the_builder_set() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(0)
        .reject_with(|_| {
            Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .header(header::RETRY_AFTER, "120")
                .header("ratelimit-policy", r#""mine";q=0;w=60"#)
                .body(Bytes::from_static(b"slow down"))
                .expect("valid response")
        })
        .clock(clock.clone());
    let answer = send(&app(layer), req("/")).await;
    assert_eq!(answer.header("retry-after"), "120");
    assert_eq!(answer.header("ratelimit-policy"), r#""mine";q=0;w=60"#);
    // The field the builder left out is still added.
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
    assert_eq!(answer.body, "slow down");
}

#[tokio::test]
async fn headers_on_pass_count_the_remaining_quota_down() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3)
        .headers_on_pass(true)
        .clock(clock.clone());
    let app = app(layer);

    for remaining in [2, 1, 0] {
        let answer = send(&app, req("/")).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", at(&clock));
        assert_eq!(answer.body, "hello");
        assert_eq!(answer.header("ratelimit-policy"), r#""default";q=3;w=1"#);
        assert_eq!(
            answer.header("ratelimit"),
            format!(r#""default";r={remaining};t=1"#),
            "{}",
            at(&clock)
        );
        assert!(!answer.headers.contains_key("retry-after"));
        assert!(!answer.headers.contains_key("x-ratelimit-limit"));
    }
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
}

#[tokio::test]
async fn legacy_headers_on_rejections_and_with_headers_on_pass() {
    let clock = clock();
    let legacy_only = app(SlidingWindowLayer::qps(1)
        .legacy_headers(true)
        .clock(clock.clone()));
    let passed = send(&legacy_only, req("/")).await;
    assert!(
        !passed.headers.contains_key("x-ratelimit-limit"),
        "only on rejections unless headers_on_pass"
    );
    let answer = send(&legacy_only, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.header("x-ratelimit-limit"), "1");
    assert_eq!(answer.header("x-ratelimit-remaining"), "0");
    assert_eq!(answer.header("x-ratelimit-reset"), "1");
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);

    let both = app(SlidingWindowLayer::qps(4)
        .legacy_headers(true)
        .headers_on_pass(true)
        .clock(clock.clone()));
    let answer = send(&both, req("/")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("x-ratelimit-limit"), "4");
    assert_eq!(answer.header("x-ratelimit-remaining"), "3");
    assert_eq!(answer.header("x-ratelimit-reset"), "1");
}

#[tokio::test]
async fn policy_name_names_the_default_and_the_keyed_policies() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(PathKey)
        .rule("/strict", 0)
        .policy_name("api-v1")
        .clock(clock.clone());
    let app = Router::new()
        .route("/", get(hello))
        .route("/strict", get(hello))
        .layer(layer);

    assert_eq!(statuses(&app, "/", 1).await, ok_then_429(1, 0));
    let answer = send(&app, req("/")).await;
    assert_eq!(answer.header("ratelimit-policy"), r#""api-v1";q=1;w=1"#);
    let answer = send(&app, req("/strict")).await;
    let policy = answer.header("ratelimit-policy");
    assert_tagged(policy, "api-v1", ";q=0;w=1");
    assert!(!policy.contains("strict"), "{policy}");
}

/// Checks `value` is `"<base>-<8 hex digits>"` followed by `rest`.
fn assert_tagged(value: &str, base: &str, rest: &str) -> String {
    let prefix = format!("\"{base}-");
    let tag = value
        .strip_prefix(&prefix)
        .and_then(|v| v.strip_suffix(rest))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{value:?} is not \"{base}-<tag>\"{rest}"));
    assert!(
        tag.len() == 8 && tag.bytes().all(|b| b.is_ascii_hexdigit()),
        "tag {tag:?} in {value:?}"
    );
    tag.to_owned()
}

/// Every header value and the body of `answer`, as one string.
fn everything(answer: &Answer) -> String {
    let mut all = answer.body.clone();
    for (name, value) in &answer.headers {
        let _ = write!(
            all,
            "\n{name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        );
    }
    all
}

#[tokio::test]
async fn policy_names_never_carry_the_raw_key() {
    const SECRET: &str = "sk_live_5f3c9a1e77";
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .rule(Some(SECRET.to_owned()), 1)
        .headers_on_pass(true)
        .legacy_headers(true)
        .clock(clock.clone());
    let stats = layer.handle();
    stats.set_limit(Some("another-secret-key".to_owned()), 1);
    let app = app(layer);

    let passed = send(&app, req_with("/", "x-api-key", SECRET)).await;
    let blocked = send(&app, req_with("/", "x-api-key", SECRET)).await;
    assert_eq!(
        (passed.status, blocked.status),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
        "{}",
        at(&clock)
    );
    let tag = assert_tagged(blocked.header("ratelimit-policy"), "default", ";q=1;w=1");
    assert_tagged(passed.header("ratelimit-policy"), "default", ";q=1;w=1");
    for answer in [&passed, &blocked] {
        let all = everything(answer);
        assert!(!all.contains(SECRET), "the key leaked: {all}");
        assert!(!all.contains("sk_live"), "part of the key leaked: {all}");
    }

    // Another key with its own limit gets another name.
    send(&app, req_with("/", "x-api-key", "another-secret-key")).await;
    let other = send(&app, req_with("/", "x-api-key", "another-secret-key")).await;
    let other_tag = assert_tagged(other.header("ratelimit-policy"), "default", ";q=1;w=1");
    assert_ne!(tag, other_tag, "two keys, two policy names");
    assert!(!everything(&other).contains("another-secret-key"));
}

#[tokio::test]
async fn an_ip_with_its_own_limit_is_not_in_the_headers() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3)
        .key(PeerIpKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let ip = "203.0.113.77".parse().expect("IP");
    stats.set_limit(Some(ip), 1);
    let app = app(layer);
    let from = || {
        let mut request: Request<Body> = req("/");
        request.extensions_mut().insert(SocketAddr::new(ip, 40_000));
        request
    };

    assert_eq!(send(&app, from()).await.status, StatusCode::OK);
    let answer = send(&app, from()).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_tagged(answer.header("ratelimit-policy"), "default", ";q=1;w=1");
    let all = everything(&answer);
    assert!(!all.contains("203.0.113"), "the IP leaked: {all}");
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::max_keys")]
fn max_keys_zero_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(1).max_keys(0);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::window")]
fn a_window_not_divisible_into_buckets_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(1).window(Duration::from_millis(1_000), 7);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::window")]
fn a_window_of_zero_buckets_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(1).window(Duration::from_secs(1), 0);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::window")]
fn a_sub_millisecond_window_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(1).window(Duration::from_micros(1_500), 1);
}

#[test]
#[should_panic(expected = "SlidingWindowLayer::policy_name")]
fn a_policy_name_with_a_quote_panics_at_construction() {
    let _ = SlidingWindowLayer::qps(1).policy_name("a\"b");
}

/// Settings are a value: taking a handle builds the state; a setter given
/// after it starts a new state for the value it is called on, which the
/// early handle and a clone taken early do not share; nothing panics
/// because of the order of the builder methods.
#[tokio::test]
async fn configuring_after_taking_the_handle_starts_a_new_state() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let early_clone = layer.clone();
    let layer = layer.rule("/late", 1);
    let app = Router::new()
        .route("/late", get(hello))
        .layer(layer.clone());
    assert_eq!(
        statuses(&app, "/late", 3).await,
        ok_then_429(1, 2),
        "{}",
        at(&clock)
    );
    let snapshot = layer
        .handle()
        .snapshot("/late")
        .expect("the new value's handle sees its key");
    assert_eq!((snapshot.pass, snapshot.block, snapshot.limit), (1, 2, 1));
    // The early handle and the early clone keep the state they had: no
    // request of the new value, and the limit of 5.
    assert!(stats.snapshot("/late").is_none(), "{}", at(&clock));
    let early = Router::new().route("/late", get(hello)).layer(early_clone);
    assert_eq!(
        statuses(&early, "/late", 6).await,
        ok_then_429(5, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(stats.snapshot("/late").map(|s| s.pass), Some(5));
}

/// Rules given before `key` carry over when the key type is the same.
#[tokio::test]
async fn rules_survive_a_change_of_extractor_with_the_same_key_type() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .rule("GET /strict", 1)
        .key(tower_sliding_window::MethodPathKey)
        .clock(clock.clone());
    let app = Router::new().route("/strict", get(hello)).layer(layer);
    assert_eq!(
        statuses(&app, "/strict", 2).await,
        ok_then_429(1, 1),
        "{}",
        at(&clock)
    );
}

/// A limiter setting given after the state is in use starts a new state for
/// that layer value; the services made before keep theirs.
#[tokio::test]
async fn configuring_a_layer_in_use_starts_a_new_state() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1).clock(clock.clone());
    let first = app(layer.clone());
    assert_eq!(
        statuses(&first, "/", 2).await,
        ok_then_429(1, 1),
        "{}",
        at(&clock)
    );
    let second = app(layer.max_keys(10));
    assert_eq!(
        statuses(&second, "/", 2).await,
        ok_then_429(1, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(
        statuses(&first, "/", 1).await,
        ok_then_429(0, 1),
        "{}",
        at(&clock)
    );
}

/// `status` and `reject_with` compose: the builder is handed the status.
#[tokio::test]
async fn reject_with_is_handed_the_configured_status() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .reject_with(|rejection| {
            Response::builder()
                .status(rejection.status)
                .body(Bytes::from_static(b"slow down"))
                .expect("valid response")
        })
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .clock(clock.clone());
    let app = app(layer);
    assert_eq!(send(&app, req("/")).await.status, StatusCode::OK);
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.body, "slow down");
    assert_eq!(answer.retry_after(), 1);
}

/// The layer answers with the inner service's own body type by default
/// (axum's `Body` here): passes go through untouched, and a rejection
/// carries the same text and headers as with the wrapper.
#[tokio::test]
async fn the_default_answers_with_the_inner_body_type() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);

    // The layer's service answers `Response<axum::body::Body>` itself.
    let service = tower::Layer::layer(
        &SlidingWindowLayer::qps(1),
        tower::service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("inner")))
        }),
    );
    let response: Response<Body> = tower::ServiceExt::oneshot(service, req("/"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);

    assert_eq!(
        statuses(&app, "/", 3).await,
        ok_then_429(2, 1),
        "{}",
        at(&clock)
    );
    let rejected = send(&app, req("/")).await;
    assert_eq!(
        rejected.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(rejected.headers[header::RETRY_AFTER], "1", "{}", at(&clock));
    assert_eq!(
        rejected.headers["ratelimit-policy"],
        "\"default\";q=2;w=1",
        "{}",
        at(&clock)
    );
    assert_eq!(
        rejected.body,
        "Too Many Requests: retry in 1 s\n",
        "{}",
        at(&clock)
    );
    let total = stats.total();
    assert_eq!((total.pass, total.block), (2, 2), "{}", at(&clock));
}
