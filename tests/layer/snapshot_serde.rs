//! With the `serde` feature, `Snapshot` serializes: counts as numbers,
//! response times as whole microseconds under `*_us` names, `null` when
//! there were none.

#![cfg(feature = "serde")]

use crate::support;

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use serde_json::json;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

use support::{at, clock, req, send};

fn routes(clock: &ManualClock) -> Router {
    let slow = clock.clone();
    Router::new()
        .route(
            "/slow",
            get(move |query: axum::extract::RawQuery| {
                let clock = slow.clone();
                async move {
                    let us = query.0.and_then(|q| q.parse().ok()).unwrap_or(0);
                    clock.advance(Duration::from_micros(us));
                    "done"
                }
            }),
        )
        .route("/idle", get(|| async { "idle" }))
}

#[tokio::test]
async fn a_snapshot_serializes_to_the_documented_json() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = routes(&clock).layer(layer);

    for us in ["1500", "2500", "0", "0"] {
        send(&app, req(&format!("/slow?{us}"))).await;
    }
    let snapshot = stats.snapshot("/slow").expect("key /slow");
    let value = serde_json::to_value(snapshot).expect("serializes");
    assert_eq!(
        value,
        json!({
            "pass": 3,
            "block": 1,
            "success": 3,
            "exception": 0,
            "concurrency": 0,
            "waiting": 0,
            "limit": 3,
            "avg_rt_us": 1333,
            "min_rt_us": 0,
        }),
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn a_snapshot_without_completions_has_null_response_times() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(0).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = routes(&clock).layer(layer);

    send(&app, req("/idle")).await;
    let value = serde_json::to_value(stats.snapshot("/idle").expect("key")).expect("serializes");
    assert_eq!(
        value,
        json!({
            "pass": 0,
            "block": 1,
            "success": 0,
            "exception": 0,
            "concurrency": 0,
            "waiting": 0,
            "limit": 0,
            "avg_rt_us": null,
            "min_rt_us": null,
        }),
        "{}",
        at(&clock)
    );
}

#[tokio::test]
async fn every_snapshot_and_the_total_serialize() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = routes(&clock).layer(layer);

    send(&app, req("/slow?4000")).await;
    send(&app, req("/idle")).await;
    let mut all = stats.snapshots();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let value = serde_json::to_value(&all).expect("serializes");
    assert_eq!(value[0][0], "/idle");
    assert_eq!(value[1][0], "/slow");
    assert_eq!(value[1][1]["avg_rt_us"], 4000, "{}", at(&clock));
    assert_eq!(value[1][1]["pass"], 1);

    let total = serde_json::to_value(stats.total()).expect("serializes");
    assert_eq!(total["pass"], 2);
    assert_eq!(total["limit"], 20);
    assert_eq!(total["avg_rt_us"], 2000, "{}", at(&clock));
    assert_eq!(total["min_rt_us"], 0);
}
