//! The layer is a configuration value: a setter on one value never reaches
//! another (clones included), the state is built when the layer is first
//! used (a service or a handle) and shared from then on, and a setter after
//! that starts a new state for its own value only. No setter order panics;
//! what `key` drops is a documented rule, checked here.

use crate::support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_sliding_window::{HeaderKey, MethodPathKey, PathKey, SlidingWindowLayer};

use support::{at, clock, ok_then_429, req, send};

/// The statuses of `n` requests for `path` through `layer`.
async fn statuses<L>(layer: L, path: &str, n: usize) -> Vec<StatusCode>
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<
            http::Request<axum::body::Body>,
            Response = http::Response<axum::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<http::Request<axum::body::Body>>>::Future: Send + 'static,
{
    let app = Router::new()
        .route("/login", get(|| async { "ok" }))
        .route("/other", get(|| async { "ok" }))
        .layer(layer);
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(send(&app, req(path)).await.status);
    }
    got
}

/// Regression: clones shared their unbuilt settings, so the last `rule`
/// given to any clone was the limit of all of them (50 for all three).
#[tokio::test]
async fn a_setter_on_a_clone_never_reaches_the_original_or_another_clone() {
    let clock = clock();
    let base = SlidingWindowLayer::qps(8).key(PathKey).clock(clock.clone());
    let five = base.clone().rule("/login", 5);
    let three = base.clone().rule("/login", 3);

    assert_eq!(
        statuses(five, "/login", 7).await,
        ok_then_429(5, 2),
        "{}",
        at(&clock)
    );
    assert_eq!(
        statuses(three, "/login", 5).await,
        ok_then_429(3, 2),
        "{}",
        at(&clock)
    );
    assert_eq!(
        statuses(base, "/login", 10).await,
        ok_then_429(8, 2),
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn the_state_is_built_at_first_use_and_shared_by_clones_made_before_it() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(4).clock(clock.clone());
    let twin = layer.clone();
    let stats = layer.handle();
    // The twin was made before the handle: it shares the built state, so
    // its requests and the layer's count against one window.
    assert_eq!(
        statuses(twin, "/login", 3).await,
        ok_then_429(3, 0),
        "{}",
        at(&clock)
    );
    assert_eq!(
        statuses(layer, "/login", 3).await,
        ok_then_429(1, 2),
        "{}",
        at(&clock)
    );
    let total = stats.total();
    assert_eq!((total.pass, total.block), (4, 2), "{}", at(&clock));
}

#[tokio::test]
async fn a_setter_after_first_use_starts_a_new_state_for_its_value_only() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(4).clock(clock.clone());
    let stats = layer.handle();
    let stricter = layer.clone().rule((), 1);

    // The new value has its own state, with its own limit...
    assert_eq!(
        statuses(stricter, "/login", 3).await,
        ok_then_429(1, 2),
        "{}",
        at(&clock)
    );
    // ...that the old handle does not see, and the old value keeps its
    // limit and its (still empty) windows.
    assert_eq!(stats.total().pass, 0, "{}", at(&clock));
    assert_eq!(
        statuses(layer, "/login", 5).await,
        ok_then_429(4, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(stats.total().pass, 4, "{}", at(&clock));
}

#[tokio::test]
async fn key_keeps_rules_of_the_same_key_type_and_drops_the_others() {
    let clock = clock();
    // Both extractors key by `String`: the rule carries over, and names a
    // `MethodPathKey` key.
    let same = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .rule("GET /login", 2)
        .key(MethodPathKey)
        .clock(clock.clone());
    assert_eq!(
        statuses(same, "/login", 4).await,
        ok_then_429(2, 2),
        "{}",
        at(&clock)
    );

    // A `PathKey` rule cannot name a `HeaderKey` key (`Option<String>`): it
    // is dropped, whatever the setter order, and nothing panics.
    let other = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .rule("/login", 2)
        .key(HeaderKey::new(http::HeaderName::from_static("x-api-key")))
        .clock(clock.clone());
    let stats = other.handle();
    assert_eq!(
        statuses(other, "/login", 6).await,
        ok_then_429(5, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(stats.snapshot(&None::<String>).map(|s| s.limit), Some(5));
}
