//! Integration tests: rules as data (`Rules` in TOML, JSON and YAML,
//! `StatsHandle::apply_rules`) and, with the `rules-file` feature, the file
//! watcher, and the rules state in the dashboard (feature `dashboard`).
//!
//! One binary for the area, one module per surface.

#[path = "../support/mod.rs"]
mod support;

mod apply;
mod dashboard;
mod format;
mod routes;
#[cfg(feature = "rules-file")]
mod watch;
mod windows;

use axum::routing::get;
use axum::Router;
use tower_sliding_window::{KeyExtractor, SlidingWindowLayer};

/// An app that answers 200 on every path, behind `layer`.
pub fn app<X: KeyExtractor>(layer: SlidingWindowLayer<X>) -> Router {
    Router::new()
        .route("/", get(|| async { "hi" }))
        .route("/{*path}", get(|| async { "hi" }))
        .layer(layer)
}
