//! Keys made of several parts (a tuple of the client's address and the
//! path) in the exporters: the dashboard serves them, labelled part by
//! part. The Prometheus side is in `prometheus.rs`.

#![cfg(feature = "dashboard")]

use crate::support;

use std::net::IpAddr;

use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::StatusCode;
use support::{clock, req, req_with, send};
use tower_sliding_window::{dashboard, SlidingWindowLayer, StatsHandle};

type PairKey = (Option<IpAddr>, String);

/// The client's address from `x-client` (if it parses) and the path.
fn pair(parts: &Parts) -> PairKey {
    let ip = parts
        .headers
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (ip, parts.uri.path().to_owned())
}

#[tokio::test]
async fn the_dashboard_serves_a_tuple_key() {
    let layer = SlidingWindowLayer::qps(10).key(pair).clock(clock());
    let stats: StatsHandle<PairKey> = layer.handle();
    let app = Router::new()
        .route("/a", get(|| async { "ok" }))
        .layer(layer)
        .nest("/limits", dashboard::router(stats));
    send(&app, req_with("/a", "x-client", "10.0.0.1")).await;
    send(&app, req("/a")).await;

    let answer = send(&app, req("/limits/stats")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let json: serde_json::Value = serde_json::from_str(&answer.body).expect("valid JSON");
    let text = json.to_string();
    for label in ["10.0.0.1, /a", "-, /a"] {
        assert!(text.contains(&format!("\"{label}\"")), "{label}: {text}");
    }
    let page = send(&app, req("/limits")).await;
    assert_eq!(page.status, StatusCode::OK);
}
