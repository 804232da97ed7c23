//! What the layer answers: the rejection response and the RateLimit header
//! fields.
//!
//! # The rejection
//!
//! A request over its key's limit is answered without calling the inner
//! service. By default the answer is `429 Too Many Requests` with the text
//! body `Too Many Requests: retry in <n> s` and these fields:
//!
//! | field | value |
//! |---|---|
//! | `Retry-After` | whole seconds until enough passes leave the window for one more request: rounded up, at least 1 ([RFC 9110]) |
//! | `RateLimit-Policy` | `"<policy>";q=<limit>;w=<window seconds>` |
//! | `RateLimit` | `"<policy>";r=<remaining>;t=<seconds until more quota>` |
//! | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | the same three numbers, only with [`legacy_headers`](crate::SlidingWindowLayer::legacy_headers) |
//!
//! `RateLimit-Policy` and `RateLimit` use the structured-field syntax of
//! [draft-ietf-httpapi-ratelimit-headers-11]. With
//! [`headers_on_pass`](crate::SlidingWindowLayer::headers_on_pass) they go on
//! passed responses too.
//!
//! The status is set with [`status`](crate::SlidingWindowLayer::status); the
//! whole response with [`reject_with`](crate::SlidingWindowLayer::reject_with),
//! whose builder gets a [`Rejection`] (the configured status included).
//! `Retry-After` and the RateLimit fields are added to whatever it builds,
//! unless it set them itself.
//!
//! # Policy names
//!
//! Keys on the default limit are named `"default"` (see
//! [`policy_name`](crate::SlidingWindowLayer::policy_name)). A key with its
//! own limit is named `"<name>-<8 hex digits>"` from a randomly seeded hash of
//! the key, so clients can tell policies apart but a header never carries the
//! key itself (an IP address, a token). A key that found no room in the
//! key table shares the overflow entry and is named `"overflow"` (see
//! [`max_keys`](crate::SlidingWindowLayer::max_keys)): a client refused
//! there can tell a full table from its own spent quota.
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! retry-after: 1
//! ratelimit-policy: "default";q=100;w=1
//! ratelimit: "default";r=0;t=1
//! content-type: text/plain; charset=utf-8
//!
//! Too Many Requests: retry in 1 s
//! ```
//!
//! [RFC 9110]: https://www.rfc-editor.org/rfc/rfc9110#field.retry-after
//! [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/

mod headers;

pub(crate) use headers::{validate_policy_name, PolicyName, Quota};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use headers::ceil_secs;

/// A request the layer rejected, handed to a custom response builder (see
/// [`reject_with`](crate::SlidingWindowLayer::reject_with)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rejection {
    /// The status set with [`status`](crate::SlidingWindowLayer::status)
    /// (429 unless changed): the builder decides whether to use it.
    pub status: StatusCode,
    /// The limit of the key's window.
    pub limit: u64,
    /// The length of the window.
    pub window: Duration,
    /// How long until one more request fits, if nothing else passes.
    pub retry_after: Duration,
    /// The policy name used in the RateLimit headers (never the raw key).
    pub policy: String,
}

impl Rejection {
    /// `Retry-After` in whole seconds: rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        ceil_secs(u64::try_from(self.retry_after.as_millis()).unwrap_or(u64::MAX)).max(1)
    }
}

/// Builds the response for a rejected request.
pub(crate) type RejectFn = Arc<dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync>;

/// How a layer answers: its response settings.
#[derive(Clone)]
pub(crate) struct ResponseConfig {
    pub(crate) status: StatusCode,
    pub(crate) reject_with: Option<RejectFn>,
    pub(crate) headers_on_pass: bool,
    pub(crate) legacy_headers: bool,
    pub(crate) policy_name: Arc<str>,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            reject_with: None,
            headers_on_pass: false,
            legacy_headers: false,
            policy_name: Arc::from("default"),
        }
    }
}

impl fmt::Debug for ResponseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseConfig")
            .field("status", &self.status)
            .field("reject_with", &self.reject_with.as_ref().map(|_| ".."))
            .field("headers_on_pass", &self.headers_on_pass)
            .field("legacy_headers", &self.legacy_headers)
            .field("policy_name", &self.policy_name)
            .finish()
    }
}

/// The response for a rejected request: the configured builder's, or a short
/// text body with the configured status; then `Retry-After` and the
/// RateLimit fields, unless the builder set them itself.
pub(crate) fn rejection_response(
    config: &ResponseConfig,
    quota: &Quota,
    retry_after_ms: u64,
) -> Response<Bytes> {
    let rejection = Rejection {
        status: config.status,
        limit: quota.limit,
        window: Duration::from_millis(quota.window_ms),
        retry_after: Duration::from_millis(retry_after_ms),
        policy: quota.policy.to_string(),
    };
    let retry_after = rejection.retry_after_secs();
    let mut response = match &config.reject_with {
        Some(build) => build(&rejection),
        None => {
            let body = format!("Too Many Requests: retry in {retry_after} s\n");
            let mut response = Response::new(Bytes::from(body));
            *response.status_mut() = config.status;
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            response
        }
    };
    let headers = response.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    quota.write(headers, config.legacy_headers);
    response
}

#[cfg(test)]
mod tests {
    use super::headers::tests::quota;
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let config = ResponseConfig::default();
        let r = rejection_response(&config, &quota(None), 1);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let r = rejection_response(&config, &quota(None), 1_001);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = rejection_response(&config, &quota(None), 0);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.body(), "Too Many Requests: retry in 1 s\n");
    }

    #[test]
    fn a_builder_sees_the_configured_status() {
        let config = ResponseConfig {
            status: StatusCode::SERVICE_UNAVAILABLE,
            reject_with: Some(Arc::new(|rejection: &Rejection| {
                let mut response = Response::new(Bytes::from_static(b"busy"));
                *response.status_mut() = rejection.status;
                response
            })),
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, &quota(None), 1);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }
}
