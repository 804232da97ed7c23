//! The `tracing` event on a block: debug level, names the key's policy and
//! never the raw key (here an API key taken from a header).
//!
//! One test in its own binary on purpose: `tracing` caches per call site
//! whether anyone listens, and a call site first reached by another test's
//! thread while this test installs its subscriber could be cached as
//! unobserved.

mod support;

use axum::routing::get;
use axum::Router;
use http::{HeaderName, StatusCode};
use tower_sliding_window::{HeaderKey, SlidingWindowLayer};

use support::{at, clock, req, req_with, send, Capture};

#[tokio::test]
async fn a_block_emits_a_debug_event_naming_the_policy_not_the_key() {
    const SECRET: &str = "sk_live_5f3c9a1e77";
    let capture = Capture::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture.clone()));

    let clock = clock();
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-api-key")))
        .rule(Some(SECRET.to_owned()), 2)
        .clock(clock.clone());
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);

    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(send(&app, req_with("/", "x-api-key", SECRET)).await);
    }
    let anonymous = [send(&app, req("/")).await, send(&app, req("/")).await];
    assert_eq!(
        statuses.iter().map(|a| a.status).collect::<Vec<_>>(),
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ],
        "{}",
        at(&clock)
    );
    assert_eq!(anonymous[1].status, StatusCode::TOO_MANY_REQUESTS);
    let policy = statuses[2].header("ratelimit-policy");
    let name = policy
        .strip_prefix('"')
        .and_then(|p| p.split('"').next())
        .expect("a quoted policy name");

    let events = capture.0.lock().expect("not poisoned").clone();
    let debug: Vec<&String> = events.iter().filter(|e| e.starts_with("DEBUG")).collect();
    assert_eq!(debug.len(), 2, "one debug event per block: {events:#?}");
    assert!(
        debug[0].contains(&format!("policy={name}")) && debug[0].contains("limit=2"),
        "the keyed block names its policy {name}: {}",
        debug[0]
    );
    assert!(
        debug[1].contains("policy=default ") && debug[1].contains("limit=1"),
        "the anonymous block is on the default policy: {}",
        debug[1]
    );
    for event in &events {
        assert!(
            !event.contains(SECRET),
            "the key leaked into tracing: {event}"
        );
        assert!(
            !event.contains("sk_live"),
            "part of the key leaked: {event}"
        );
    }
}
