//! A full key table says so: the operator gets a `warn` event naming
//! `max_keys` (one per minute at most, however many requests overflow),
//! and a client sent to the overflow entry reads the policy `"overflow"` in
//! its RateLimit fields, not the default policy as if its own quota were
//! spent.
//!
//! In its own binary: `tracing` caches per call site whether anyone
//! listens (see tests/layer_tracing.rs).

mod support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{at, clock, req, send, Capture};

#[tokio::test]
async fn an_overflow_is_logged_once_a_minute_and_named_in_the_response() {
    let capture = Capture::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture.clone()));
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2)
        .key(PathKey)
        .max_keys(2)
        .headers_on_pass(true)
        .clock(clock.clone());
    let app = Router::new()
        .route("/{client}", get(|| async { "hello" }))
        .layer(layer);
    let warnings = || {
        capture
            .0
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|e| e.starts_with("WARN") && e.contains("max_keys"))
            .cloned()
            .collect::<Vec<_>>()
    };

    // Two clients fill the table; nothing to say yet.
    for client in ["/a", "/b"] {
        let answer = send(&app, req(client)).await;
        assert_eq!(answer.header("ratelimit"), "\"default\";r=1;t=1");
    }
    assert!(warnings().is_empty());

    // Ten new clients share the overflow entry's 2 per second.
    let mut answers = Vec::new();
    for n in 0..10 {
        answers.push(send(&app, req(&format!("/new-{n}"))).await);
    }
    assert_eq!(answers[0].status, StatusCode::OK);
    assert_eq!(
        answers[0].header("ratelimit-policy"),
        "\"overflow\";q=2;w=1"
    );
    // The third new client's first request: refused, and told why.
    let refused = &answers[2];
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("ratelimit"), "\"overflow\";r=0;t=1");
    assert_eq!(refused.header("ratelimit-policy"), "\"overflow\";q=2;w=1");
    // One warning for ten overflowed requests, naming max_keys.
    let logged = warnings();
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(logged[0].contains(" max_keys=2"), "{}", logged[0]);
    assert!(logged[0].contains(" overflow_requests=1"), "{}", logged[0]);

    // 59 s later the table is still full of busy clients: no new warning.
    clock.advance(Duration::from_secs(59));
    for client in ["/a", "/b", "/late-1"] {
        let _ = send(&app, req(client)).await;
    }
    assert_eq!(warnings().len(), 1, "{}", at(&clock));
    // A minute after the first: the next one, counting the 11 requests
    // sent to the overflow entry since (9 new clients, /late-1, /late-2).
    clock.advance(Duration::from_secs(1));
    for client in ["/a", "/b", "/late-2"] {
        let _ = send(&app, req(client)).await;
    }
    let logged = warnings();
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert!(logged[1].contains(" overflow_requests=11"), "{}", logged[1]);
    // Clients with room of their own still read the default policy.
    assert_eq!(
        send(&app, req("/a")).await.header("ratelimit-policy"),
        "\"default\";q=2;w=1"
    );
}
