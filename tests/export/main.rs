//! Integration tests: the Prometheus collector and the dashboard (its JSON, its limit form, and the page in headless Chromium).
//!
//! One binary for the area (as tower groups its tests), one module per surface.

#[path = "../support/mod.rs"]
mod support;

#[cfg(feature = "redis")]
#[path = "../support/redis_server.rs"]
mod redis_server;

mod dashboard;
mod export_keys;
// Drives headless Chromium against the dashboard: built only with it.
#[cfg(feature = "dashboard")]
mod dashboard_browser;
mod prometheus;
