//! The tower glue: the layer (a configuration value), the service that
//! decides per request, its response future, the response bodies and the
//! guard that records each request's completion.

mod behaviours;
pub mod body;
mod breaker;
mod builder;
pub mod future;
mod in_flight;
mod service;

pub use builder::{DefaultClassifier, SlidingWindowLayer};
pub use service::SlidingWindow;
