//! Integration tests: flow behaviours (strict windows, pacing, warm-up, concurrency, prioritized) and circuit breakers, through the layer.
//!
//! One binary for the area (as tower groups its tests), one module per surface.

#[path = "../support/mod.rs"]
mod support;

mod breaker;
mod breaker_axum;
mod flow_concurrency;
mod flow_strict;
mod flow_waiting;
mod system;
