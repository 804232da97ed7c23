//! The layer on an axum `Router`, driven with `oneshot` and a `ManualClock`:
//! the limit, the 429 and its header fields, the sliding window, independent
//! keys, per-key rules, live limit changes, `route_layer` and a limit of 0.

use crate::support;

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use http::StatusCode;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{assert_statuses, at, clock, ms, ok_then_429, req, req_with, send, statuses};

async fn hello() -> &'static str {
    "hello"
}

fn app(layer: SlidingWindowLayer<impl tower_sliding_window::KeyExtractor>) -> Router {
    Router::new()
        .route("/", get(hello))
        .route("/a", get(hello))
        .route("/b", get(hello))
        .route("/login", get(hello))
        .layer(layer)
}

#[tokio::test]
async fn exactly_the_limit_passes_then_429_with_the_ratelimit_fields() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5).clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    for i in 0..5 {
        let answer = send(&app, req("/")).await;
        assert_eq!(answer.status, StatusCode::OK, "request {i} {}", at(&clock));
        assert_eq!(answer.body, "hello");
        assert!(
            !answer.headers.contains_key("ratelimit"),
            "RateLimit on a passed response by default {}",
            at(&clock)
        );
    }
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    // The passes sit in the bucket [10 000, 10 100); it leaves the window at
    // 11 000 ms, 950 ms from now: rounded up to 1 s.
    assert_eq!(answer.retry_after(), 1, "{}", at(&clock));
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=5;w=1"#);
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);
    assert!(
        answer.header("content-type").starts_with("text/plain"),
        "{:?}",
        answer.headers
    );
    assert!(
        !answer.body.is_empty() && answer.body.len() < 100,
        "short text body, got {:?}",
        answer.body
    );
    assert!(
        answer.body.contains("Too Many Requests"),
        "{:?}",
        answer.body
    );

    let snap = stats.snapshot(&()).expect("the global key has an entry");
    assert_eq!((snap.pass, snap.block), (5, 1), "{}", at(&clock));
    assert_eq!(snap.success, 5, "blocked requests are not completions");
    assert_eq!(snap.limit, 5);
    assert_eq!(snap.concurrency, 0);
}

#[tokio::test]
async fn blocked_requests_never_reach_the_handler() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let clock = clock();
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                "hello"
            }),
        )
        .layer(SlidingWindowLayer::qps(3).clock(clock.clone()));

    assert_statuses!(&app, "/", 3, 7, &clock);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "{}", at(&clock));
}

#[tokio::test]
async fn retry_after_counts_whole_seconds_until_a_pass_leaves_the_window() {
    let clock = ManualClock::new(20_000);
    let layer = SlidingWindowLayer::qps(3)
        .window(Duration::from_secs(10), 10)
        .clock(clock.clone());
    let app = app(layer);

    assert_eq!(statuses(&app, "/", 3).await, ok_then_429(3, 0));
    // The three passes sit in the 1 s bucket at 20 000 ms, which leaves the
    // 10 s window at 30 000 ms.
    let expectations = [(0, 10), (3_500, 7), (9_000, 1), (9_999, 1)];
    for (offset, secs) in expectations {
        clock.set(20_000 + offset);
        let answer = send(&app, req("/")).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            at(&clock)
        );
        assert_eq!(answer.retry_after(), secs, "{}", at(&clock));
        assert_eq!(answer.header("ratelimit-policy"), r#""default";q=3;w=10"#);
        assert_eq!(
            answer.header("ratelimit"),
            format!(r#""default";r=0;t={secs}"#),
            "{}",
            at(&clock)
        );
    }
    clock.set(30_000);
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::OK,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn retry_after_is_at_least_one_second_for_a_short_window() {
    let clock = ManualClock::new(1_000);
    let layer = SlidingWindowLayer::qps(2)
        .window(Duration::from_millis(500), 5)
        .clock(clock.clone());
    let app = app(layer);

    assert_eq!(statuses(&app, "/", 3).await, ok_then_429(2, 1));
    clock.set(1_499);
    let answer = send(&app, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(
        answer.retry_after(),
        1,
        "1 ms rounds up to 1 s {}",
        at(&clock)
    );
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=2;w=1"#);
    clock.set(1_500);
    assert_eq!(
        send(&app, req("/")).await.status,
        StatusCode::OK,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn the_window_slides_bucket_by_bucket() {
    let clock = clock();
    let app = app(SlidingWindowLayer::qps(5).clock(clock.clone()));

    // 3 passes in the bucket at 10 000, 2 in the bucket at 10 500.
    assert_eq!(statuses(&app, "/", 3).await, ok_then_429(3, 0));
    clock.set(10_500);
    assert_statuses!(&app, "/", 2, 1, &clock);

    // One millisecond before the first bucket leaves: still full.
    clock.set(10_999);
    assert_statuses!(&app, "/", 0, 1, &clock);
    let answer = send(&app, req("/")).await;
    assert_eq!(answer.retry_after(), 1, "{}", at(&clock));
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);

    // The first bucket left: exactly its 3 passes are free again, not 5 (a
    // fixed window would reset to 5 here).
    clock.set(11_000);
    assert_statuses!(&app, "/", 3, 1, &clock);

    // The bucket at 10 500 leaves at 11 500.
    clock.set(11_500);
    assert_statuses!(&app, "/", 2, 1, &clock);

    // A whole window later everything is free.
    clock.set(13_000);
    assert_statuses!(&app, "/", 5, 1, &clock);
}

#[tokio::test]
async fn keys_are_independent() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    assert_statuses!(&app, "/a", 2, 2, &clock);
    assert_statuses!(&app, "/b", 2, 1, &clock);
    // The query is not part of the path key.
    assert_statuses!(&app, "/a?page=2", 0, 1, &clock);

    let a = stats.snapshot("/a").expect("key /a");
    let b = stats.snapshot("/b").expect("key /b");
    assert_eq!((a.pass, a.block), (2, 3), "{}", at(&clock));
    assert_eq!((b.pass, b.block), (2, 1), "{}", at(&clock));
    let mut keys = stats.keys();
    keys.sort();
    assert_eq!(keys, ["/a", "/b"]);
    assert_eq!(stats.len(), 2);
    let total = stats.total();
    assert_eq!((total.pass, total.block, total.limit), (4, 4, 4));
}

#[tokio::test]
async fn a_rule_overrides_the_default_limit_for_its_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(4)
        .key(PathKey)
        .rule("/login", 1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    assert_statuses!(&app, "/login", 1, 2, &clock);
    assert_statuses!(&app, "/a", 4, 1, &clock);
    assert_eq!(stats.snapshot("/login").map(|s| s.limit), Some(1));
    assert_eq!(stats.snapshot("/a").map(|s| s.limit), Some(4));

    let answer = send(&app, req("/login")).await;
    let policy = answer.header("ratelimit-policy");
    assert!(
        policy.starts_with(r#""default-"#) && policy.ends_with(r#"";q=1;w=1"#),
        "a key with its own limit has its own policy name, got {policy}"
    );
    let answer = send(&app, req("/a")).await;
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=4;w=1"#);
}

#[tokio::test]
async fn set_limit_applies_on_the_next_request_without_a_burst() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    assert_eq!(statuses(&app, "/a", 6).await, ok_then_429(6, 0));

    // Lowered below what already passed: the next request is blocked, the
    // six passes stay counted.
    stats.set_limit("/a", 3);
    let answer = send(&app, req("/a")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert!(
        answer.header("ratelimit-policy").ends_with(";q=3;w=1"),
        "{}",
        answer.header("ratelimit-policy")
    );
    assert_eq!(
        stats.snapshot("/a").map(|s| (s.pass, s.limit)),
        Some((6, 3))
    );

    // Raised to 8: two more, not eight more.
    stats.set_limit("/a", 8);
    assert_statuses!(&app, "/a", 2, 2, &clock);

    // Other keys keep the default.
    assert_statuses!(&app, "/b", 10, 1, &clock);

    // After the window slides the new limit holds on its own.
    clock.set(11_000);
    assert_statuses!(&app, "/a", 8, 1, &clock);
}

#[tokio::test]
async fn set_limit_on_the_global_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    assert_eq!(statuses(&app, "/", 1).await, ok_then_429(1, 0));
    stats.set_limit((), 3);
    assert_statuses!(&app, "/", 2, 2, &clock);
    assert_eq!(stats.snapshot(&()).map(|s| s.limit), Some(3));
}

#[tokio::test]
async fn set_limit_on_the_global_key_before_any_request() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    stats.set_limit((), 2);
    let app = app(layer);

    assert_statuses!(&app, "/", 2, 1, &clock);
    assert_eq!(stats.snapshot(&()).map(|s| s.limit), Some(2));
}

#[tokio::test]
async fn set_limit_applies_to_a_key_not_seen_yet() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    stats.set_limit("/b", 2);
    assert!(stats.snapshot("/b").is_none(), "no entry before a request");
    assert_statuses!(&app, "/b", 2, 1, &clock);
    assert_eq!(stats.snapshot("/b").map(|s| s.limit), Some(2));
}

#[tokio::test]
async fn limits_survive_eviction_of_the_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .rule("/login", 1)
        .max_keys(1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    stats.set_limit("/b", 2);

    assert_eq!(statuses(&app, "/login", 2).await, ok_then_429(1, 1));
    assert_eq!(statuses(&app, "/b", 3).await, ok_then_429(2, 1));

    // Past the minute window every key is idle. A new key finds the table
    // full (max_keys 1) and sweeps the idle ones out.
    clock.advance(Duration::from_secs(61));
    assert_statuses!(&app, "/a", 1, 0, &clock);
    clock.advance(ms(100));
    assert_statuses!(&app, "/", 1, 0, &clock);
    assert!(
        stats.snapshot("/login").is_none() && stats.snapshot("/b").is_none(),
        "idle keys evicted {}, keys left: {:?}",
        at(&clock),
        stats.keys()
    );

    // Back again: their own limits still apply.
    assert_statuses!(&app, "/login", 1, 1, &clock);
    assert_statuses!(&app, "/b", 2, 1, &clock);
    assert_eq!(stats.snapshot("/login").map(|s| s.limit), Some(1));
    assert_eq!(stats.snapshot("/b").map(|s| s.limit), Some(2));
}

#[tokio::test]
async fn route_layer_does_not_turn_a_404_into_a_429() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().route("/", get(hello)).route_layer(layer);

    assert_statuses!(&app, "/", 1, 1, &clock);
    for _ in 0..3 {
        let answer = send(&app, req("/missing")).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{}", at(&clock));
    }
    let snap = stats.snapshot(&()).expect("global key");
    assert_eq!((snap.pass, snap.block), (1, 1), "404s are not counted");
}

#[tokio::test]
async fn router_layer_limits_unmatched_requests_too() {
    // The contrast to `route_layer`: `Router::layer` also wraps the fallback.
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1).clock(clock.clone());
    let app = Router::new().route("/", get(hello)).layer(layer);

    assert_eq!(statuses(&app, "/", 1).await, ok_then_429(1, 0));
    let answer = send(&app, req("/missing")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn method_router_route_layer_leaves_a_405_alone() {
    // `MethodRouter::route_layer` wraps only the methods it serves; the
    // router's own 405 answer stays outside the limit. (`Router::route_layer`
    // in axum 0.8 wraps the whole route, 405 fallback included.)
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1).clock(clock.clone());
    let app = Router::new().route("/", post(hello).route_layer(layer));

    let post = http::Request::post("/")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(send(&app, post).await.status, StatusCode::OK);
    for _ in 0..2 {
        // A method the route does not serve is answered by the router.
        let answer = send(&app, req("/")).await;
        assert_eq!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{}",
            at(&clock)
        );
    }
}

#[tokio::test]
async fn a_limit_of_zero_blocks_everything() {
    let clock = clock();
    let app1 = app(SlidingWindowLayer::qps(0).clock(clock.clone()));
    let answer = send(&app1, req("/")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.retry_after(), 1, "the 1 s window {}", at(&clock));
    assert_eq!(answer.header("ratelimit-policy"), r#""default";q=0;w=1"#);
    assert_eq!(answer.header("ratelimit"), r#""default";r=0;t=1"#);

    let app10 = app(SlidingWindowLayer::qps(0)
        .window(Duration::from_secs(10), 5)
        .clock(clock.clone()));
    for _ in 0..3 {
        let answer = send(&app10, req("/")).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{}",
            at(&clock)
        );
        assert_eq!(answer.retry_after(), 10, "the window length {}", at(&clock));
        clock.advance(Duration::from_secs(30));
    }

    let short = app(SlidingWindowLayer::qps(0)
        .window(Duration::from_millis(200), 2)
        .clock(clock.clone()));
    let answer = send(&short, req("/")).await;
    assert_eq!(answer.retry_after(), 1, "at least 1 {}", at(&clock));
}

#[tokio::test]
async fn set_limit_zero_blocks_one_key() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    stats.set_limit("/a", 0);
    let answer = send(&app, req("/a")).await;
    assert_eq!(
        answer.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        at(&clock)
    );
    assert_eq!(answer.retry_after(), 1, "{}", at(&clock));
    clock.advance(Duration::from_secs(5));
    assert_statuses!(&app, "/a", 0, 2, &clock);
    assert_statuses!(&app, "/b", 1, 0, &clock);
}

#[tokio::test]
async fn cloned_layers_and_routers_share_one_state() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3).clock(clock.clone());
    let stats = layer.handle();
    // The same layer on two routers, merged: one limit, not two.
    let one = Router::new().route("/a", get(hello)).layer(layer.clone());
    let two = Router::new().route("/b", get(hello)).layer(layer);
    let app = one.merge(two);

    let mut got = statuses(&app, "/a", 2).await;
    got.extend(statuses(&app, "/b", 2).await);
    assert_eq!(got, ok_then_429(3, 1), "{}", at(&clock));
    assert_eq!(stats.snapshot(&()).map(|s| s.pass), Some(3));
}

#[tokio::test]
async fn header_keys_limit_each_client() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(tower_sliding_window::HeaderKey::new(
            http::HeaderName::from_static("x-client"),
        ))
        .clock(clock.clone());
    let app = app(layer);

    for client in ["alice", "bob"] {
        let first = send(&app, req_with("/", "x-client", client)).await;
        let second = send(&app, req_with("/", "x-client", client)).await;
        assert_eq!(
            (first.status, second.status),
            (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS),
            "{client} {}",
            at(&clock)
        );
    }
}

#[tokio::test]
async fn set_limit_gives_an_overflowed_key_its_own_entry() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .max_keys(1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    // "/a" takes the only slot; "/b" shares the overflow entry.
    assert_eq!(statuses(&app, "/a", 1).await, ok_then_429(1, 0));
    assert_eq!(statuses(&app, "/b", 1).await, ok_then_429(1, 0));
    assert!(stats.snapshot("/b").is_none(), "{:?}", stats.keys());
    assert_eq!(stats.overflow().pass, 1);

    stats.set_limit("/b", 2);
    assert_statuses!(&app, "/b", 2, 1, &clock);
    assert_eq!(
        stats.snapshot("/b").map(|s| (s.pass, s.limit)),
        Some((2, 2))
    );
    assert_eq!(
        stats.overflow().pass,
        1,
        "the overflow entry was not used again"
    );
}

#[tokio::test]
async fn a_flood_of_other_keys_does_not_dilute_a_rule() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .rule("/login", 2)
        .max_keys(4)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new().fallback(hello).layer(layer);

    for i in 0..50 {
        send(&app, req(&format!("/flood/{i}"))).await;
    }
    assert_eq!(
        stats.len(),
        5,
        "4 keys and the overflow entry: {:?}",
        stats.keys()
    );
    assert_statuses!(&app, "/login", 2, 1, &clock);
    assert_eq!(stats.snapshot("/login").map(|s| s.limit), Some(2));
}
