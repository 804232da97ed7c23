//! Sentinel-style sliding-window statistics and exact rate limiting for
//! [tower], [hyper] and [axum].
//!
//! [tower]: https://docs.rs/tower
//! [hyper]: https://docs.rs/hyper
//! [axum]: https://docs.rs/axum

#![forbid(unsafe_code)]
#![deny(missing_docs, missing_debug_implementations, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod clock;
mod error;
pub mod flow;
pub mod stat;
mod sync;

pub use error::ConfigError;
