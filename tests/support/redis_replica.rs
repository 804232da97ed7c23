//! Replicas for the Redis store's layer tests: a router behind a
//! [`SlidingWindowLayer`] with its own store (connection), and the requests
//! the tests send through it. Used by the single-server and the cluster
//! suites alike.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

/// One replica: a router that answers `ok` on every path behind its
/// layer, and the layer's handle.
pub struct Replica {
    pub app: Router,
    pub stats: StatsHandle<String>,
}

impl Replica {
    /// A replica behind `layer` (keyed by path, its store set).
    pub fn new(layer: SlidingWindowLayer<PathKey>) -> Replica {
        let stats = layer.handle();
        let app = Router::new()
            .route("/{*path}", get(|| async { "ok" }))
            .layer(layer);
        Replica { app, stats }
    }
}

/// The status of one `GET path`.
pub async fn send(app: &Router, path: &str) -> StatusCode {
    let request = Request::get(path).body(Body::empty()).expect("request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}

/// The status of one `GET path` and how long it took; panics on anything
/// but 200 or 429.
pub async fn timed(app: &Router, path: &str) -> (StatusCode, Duration) {
    let started = Instant::now();
    let status = send(app, path).await;
    assert!(
        status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
        "{path}: unexpected status {status}"
    );
    (status, started.elapsed())
}

/// Sends `per_replica` concurrent requests for `path` to each replica;
/// returns how many were answered 200, and panics on anything but 200/429.
pub async fn burst<'a>(
    replicas: impl IntoIterator<Item = &'a Replica>,
    path: &str,
    per_replica: usize,
) -> u64 {
    let mut tasks = Vec::new();
    for replica in replicas {
        for _ in 0..per_replica {
            let (app, path) = (replica.app.clone(), path.to_owned());
            tasks.push(tokio::spawn(async move { timed(&app, &path).await }));
        }
    }
    let mut ok = 0;
    for task in tasks {
        if task.await.expect("no panic").0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

/// `count` requests for `path`, one after another; how many were answered
/// 200 (anything but 200/429 panics).
pub async fn in_turn(app: &Router, path: &str, count: usize) -> u64 {
    let mut ok = 0;
    for _ in 0..count {
        if timed(app, path).await.0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}
