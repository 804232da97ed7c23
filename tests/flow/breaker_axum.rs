//! A route that starts failing is cut off with 503 and recovers once it
//! heals, over a real socket (`axum::serve` on 127.0.0.1:0) with the system
//! clock; a healthy route of the same app is never cut off.

#![cfg(feature = "axum")]

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::StatusCode;
use tokio::net::TcpListener;
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::{Clock, SystemClock};
use tower_sliding_window::{MatchedPathKey, SlidingWindowLayer};

use support::{connect, fetch};

#[tokio::test]
async fn a_failing_route_is_cut_off_and_recovers_when_it_heals() {
    const OPEN_FOR: Duration = Duration::from_secs(2);
    let healthy = Arc::new(AtomicBool::new(true));
    let calls = Arc::new(AtomicUsize::new(0));
    let orders = {
        let (healthy, calls) = (Arc::clone(&healthy), Arc::clone(&calls));
        move || {
            let (healthy, calls) = (Arc::clone(&healthy), Arc::clone(&calls));
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                if healthy.load(Ordering::SeqCst) {
                    (StatusCode::OK, "orders")
                } else {
                    (StatusCode::BAD_GATEWAY, "upstream down")
                }
            }
        }
    };
    let layer = SlidingWindowLayer::qps(10_000).key(MatchedPathKey).breaker(
        Breaker::error_ratio(0.5)
            .min_requests(3)
            .stat_interval(Duration::from_secs(60))
            .open_for(OPEN_FOR),
    );
    let stats = layer.handle();
    let app = Router::new()
        .route("/orders", get(orders))
        .route("/health", get(|| async { "ok" }))
        .route_layer(layer);

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut client = connect(addr).await;

    // The breaker counts in one bucket of a minute on the clock's minutes:
    // the successes and failures below must fall in one of them, or the
    // failures open it early. They take well under a second; start them
    // at least 5 s before a minute ends.
    let into_minute = SystemClock::new().now_millis() % 60_000;
    if into_minute > 55_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into_minute + 100)).await;
    }
    for _ in 0..5 {
        assert_eq!(
            fetch(&mut client, addr, "/orders").await.status,
            StatusCode::OK
        );
    }
    // The upstream goes down: failures until the breaker opens.
    healthy.store(false, Ordering::SeqCst);
    let mut failures = 0;
    let refused = loop {
        let answer = fetch(&mut client, addr, "/orders").await;
        match answer.status {
            StatusCode::BAD_GATEWAY => failures += 1,
            StatusCode::SERVICE_UNAVAILABLE => break answer,
            other => panic!("unexpected {other}: {}", answer.body),
        }
        assert!(
            failures <= 10,
            "still not cut off after {failures} failures"
        );
    };
    // 5 successes, then failures: the ratio passes 50% at the 6th failure.
    assert_eq!(failures, 6);
    // Whole seconds until half-open: OPEN_FOR, less the moments since.
    let retry_after = refused.retry_after();
    assert!(
        (1..=OPEN_FOR.as_secs()).contains(&retry_after),
        "Retry-After {retry_after}"
    );
    let cut_off_at = calls.load(Ordering::SeqCst);
    // Well within OPEN_FOR, however slow the machine.
    for _ in 0..10 {
        let answer = fetch(&mut client, addr, "/orders").await;
        assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            fetch(&mut client, addr, "/health").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        cut_off_at,
        "no call while open"
    );
    assert!(matches!(
        stats.breakers("GET /orders")[..],
        [BreakerState::Open { .. }] | [BreakerState::HalfOpen]
    ));

    // The upstream heals; once open_for has passed, the probe closes it.
    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(OPEN_FOR + Duration::from_millis(50)).await;
    assert_eq!(stats.breakers("GET /orders"), [BreakerState::HalfOpen]);
    for _ in 0..5 {
        assert_eq!(
            fetch(&mut client, addr, "/orders").await.status,
            StatusCode::OK
        );
    }
    assert_eq!(stats.breakers("GET /orders"), [BreakerState::Closed]);
    assert_eq!(stats.breakers("GET /health"), [BreakerState::Closed]);

    server.abort();
    let _ = server.await;
}
