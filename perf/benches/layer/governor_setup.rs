//! tower_governor as the layer benches and `counts-layer` set it up: a
//! quota no run can exhaust, and a key extractor reading one header into a
//! `String`. Included by path by `perf/counts/layer.rs`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, Request};
use governor::clock::QuantaInstant;
use governor::middleware::NoOpMiddleware;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor as GovernorKeyExtractor;
use tower_governor::{GovernorError, GovernorLayer};

/// A tower_governor key extractor keying by one header's value, read into a
/// `String` (what a user writes for an API-key limit); a request without it
/// (or with a value that is not visible ASCII) is refused.
#[derive(Debug, Clone)]
pub struct HeaderString(pub HeaderName);

impl GovernorKeyExtractor for HeaderString {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get(&self.0)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// tower_governor keyed by `key` with a quota no bench can exhaust: a new
/// cell every nanosecond and a burst of `u32::MAX` cells (its
/// `per_second(n)` would mean one cell every `n` seconds, hence `period`).
pub fn never_rejecting<K: GovernorKeyExtractor>(
    key: K,
) -> GovernorLayer<K, NoOpMiddleware<QuantaInstant>, Body> {
    let config = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1))
        .burst_size(u32::MAX)
        .key_extractor(key)
        .finish()
        .expect("a non-zero period and burst");
    GovernorLayer::new(config)
}
