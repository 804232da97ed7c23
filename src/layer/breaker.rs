//! The answer to a request refused by one of its key's circuit breakers.

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use tower_http::classify::MakeClassifier;

use super::future::ResponseFuture;
use super::service::SlidingWindow;
use crate::key::KeyExtractor;
use crate::store::Entry;

impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// Refuses a request at `now` because a breaker of `entry` is open (or
    /// half-open with its probe out): a block in the key's statistics, and
    /// `503 Service Unavailable` with `Retry-After` (whole seconds until
    /// half-open, at least 1). The inner service is not called.
    pub(super) fn cut_off<F>(
        &self,
        entry: &Entry,
        now: u64,
        half_open_in_ms: u64,
    ) -> ResponseFuture<F, M::Classifier, R> {
        entry.node.record_block_at(now, 1);
        tracing::debug!(half_open_in_ms, "request rejected: circuit breaker open");
        ResponseFuture::blocked(unavailable(half_open_in_ms))
    }
}

/// `503 Service Unavailable`, `Retry-After` in whole seconds (rounded up,
/// at least 1) and a short text body.
fn unavailable(half_open_in_ms: u64) -> Response<Bytes> {
    let secs = half_open_in_ms.div_ceil(1000).max(1);
    let body = format!("Service Unavailable: retry in {secs} s\n");
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(unavailable(0).headers()[RETRY_AFTER], "1");
        assert_eq!(unavailable(1_001).headers()[RETRY_AFTER], "2");
        assert_eq!(unavailable(5_000).headers()[RETRY_AFTER], "5");
        assert_eq!(unavailable(0).status(), StatusCode::SERVICE_UNAVAILABLE);
    }
}
