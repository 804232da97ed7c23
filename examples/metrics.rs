//! A Prometheus endpoint for the limiter's statistics: an axum server with
//! one limited route and `/metrics` (OpenMetrics text), read at scrape time.
//!
//! ```sh
//! cargo run --example metrics --features prometheus
//! # then, in another shell:
//! curl -s localhost:3000/hello; curl -s localhost:3000/metrics
//! ```
//!
//! `PORT` picks another port. The collector's metric and label names are
//! listed on `tower_sliding_window::export::PrometheusCollector`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
// The prometheus-client the collector is built for, re-exported: no second
// version can slip in through Cargo.toml.
use tower_sliding_window::export::prometheus_client::encoding::text::encode;
use tower_sliding_window::export::prometheus_client::registry::Registry;
use tower_sliding_window::{PathKey, SlidingWindowLayer};

async fn metrics(State(registry): State<Arc<Registry>>) -> impl IntoResponse {
    let mut body = String::new();
    // Encoding into a String fails only if a collector reports an error;
    // ours never does.
    if encode(&mut body, &registry).is_err() {
        return (
            http::StatusCode::INTERNAL_SERVER_ERROR,
            [(CONTENT_TYPE, "text/plain")],
            String::new(),
        );
    }
    (
        http::StatusCode::OK,
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Five requests per second per path.
    let limit = SlidingWindowLayer::qps(5).key(PathKey);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(limit.handle().collector()));

    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/hello/{name}", get(|| async { "hello you\n" }))
        // Only the routes above are limited; `/metrics` is not.
        .route_layer(limit)
        .route("/metrics", get(metrics))
        .with_state(Arc::new(registry));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".to_owned());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("metrics on http://{}/metrics", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
