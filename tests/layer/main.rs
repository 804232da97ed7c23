//! Integration tests: the tower layer and its keys, through tower, axum and real sockets.
//!
//! One binary for the area (as tower groups its tests), one module per surface.

#[path = "../support/mod.rs"]
mod support;

// `MatchedPathKey`, the route part of these keys, is behind `axum`.
#[cfg(feature = "axum")]
mod client_route_windows;
// `MatchedPathKey`, the route part of these keys, is behind `axum`.
#[cfg(feature = "axum")]
mod client_routes;
mod compact;
mod compact_peer;
mod contract;
mod forwarded_ip;
mod hostile_keys;
mod ipv6_prefix;
mod key_table;
mod layer_axum;
mod layer_concurrency;
mod layer_keys;
mod layer_options;
mod layer_recording;
mod layer_socket;
mod layer_streaming;
mod layer_tower;
mod snapshot_serde;
mod top_blocked;
mod value;
mod windows;
