//! One `tracing` event per breaker transition, none per request, and none
//! naming the key.
//!
//! In its own binary: `tracing` caches per call site whether anyone
//! listens (see tests/layer_tracing.rs).

mod support;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{clock, ms, req, send, statuses, Capture};

#[tokio::test]
async fn one_event_per_transition() {
    const SECRET_PATH: &str = "/accounts/8f2d1c";
    let capture = Capture::default();
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture.clone()));
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1_000)
        .key(PathKey)
        .clock(clock.clone())
        .breaker(Breaker::error_count(1).min_requests(1).open_for(ms(100)));
    let app = Router::new()
        .route(
            SECRET_PATH,
            get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .layer(layer);

    // Closed -> open (the second failure), then many refusals.
    let _ = statuses(&app, SECRET_PATH, 10).await;
    // Open -> half-open -> open (the probe fails), many refusals again.
    clock.advance(ms(100));
    let _ = statuses(&app, SECRET_PATH, 10).await;
    // Half-open again; the probe is refused by nothing and fails again.
    clock.advance(ms(100));
    assert_eq!(send(&app, req(SECRET_PATH)).await.status, 500);

    let events = capture.0.lock().expect("not poisoned").clone();
    let transitions: Vec<&String> = events.iter().filter(|e| e.contains("from=")).collect();
    let names: Vec<String> = transitions
        .iter()
        .map(|e| {
            let field = |name: &str| {
                e.split(&format!(" {name}="))
                    .nth(1)
                    .and_then(|v| v.split(' ').next())
                    .unwrap_or("?")
                    .to_owned()
            };
            format!("{}>{}", field("from"), field("to"))
        })
        .collect();
    assert_eq!(
        names,
        [
            "\"closed\">\"open\"",
            "\"open\">\"half_open\"",
            "\"half_open\">\"open\"",
            "\"open\">\"half_open\"",
            "\"half_open\">\"open\"",
        ],
        "{events:#?}"
    );
    assert!(
        transitions[0].starts_with("WARN") && transitions[0].contains("breaker=\"error_count\"")
    );
    for event in &events {
        assert!(
            !event.contains("8f2d1c"),
            "the key leaked into tracing: {event}"
        );
    }
}
