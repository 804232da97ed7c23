//! The tower glue: the layer (a configuration value), the service that
//! decides per request, its response future, the response bodies and the
//! guard that records each request's completion.

mod behaviours;
pub mod body;
mod builder;
pub mod future;
mod in_flight;
mod priority;
mod quota;
mod refusals;
#[cfg(feature = "redis")]
mod remote;
mod service;
// Without a timer (no `tokio` feature) nothing waits, and the waiting
// state is never entered.
#[cfg_attr(not(feature = "tokio"), allow(dead_code, unused_imports))]
mod wait;
mod windows;

pub use builder::{DefaultClassifier, SlidingWindowLayer};
pub use service::SlidingWindow;
