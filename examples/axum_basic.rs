//! The minimal setup: one limit per route, and a `/stats` route that serves
//! the limiter's live statistics as JSON.
//!
//! ```sh
//! cargo run --example axum_basic --features serde
//! # in another terminal:
//! for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/; done
//! curl -s localhost:3000/stats
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tower_sliding_window::{MethodPathKey, SlidingWindowLayer, StatsHandle};

async fn root() -> &'static str {
    "Hello!\n"
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_millis(50)).await;
    "Done.\n"
}

/// Every key's snapshot, and the sum over all keys.
async fn stats(stats: StatsHandle<String>) -> Json<Value> {
    let keys: BTreeMap<String, _> = stats.snapshots().into_iter().collect();
    Json(json!({ "keys": keys, "total": stats.total() }))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // 5 requests per second per route.
    let limit = SlidingWindowLayer::qps(5).key(MethodPathKey);
    let handle = limit.handle();

    let app = Router::new()
        .route("/", get(root))
        .route("/slow", get(slow))
        .route_layer(limit)
        // Added after the layer, so `/stats` itself is not limited.
        .route("/stats", get(move || stats(handle.clone())));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!("try: curl localhost:3000/ (5 per second), then curl localhost:3000/stats");
    axum::serve(listener, app).await
}
