//! What the layer answers: the refusal responses and the RateLimit header
//! fields.
//!
//! # The refusals
//!
//! A refused request is answered without calling the inner service. Every
//! refusal has a [`Reason`], and every refusal is built here, from its
//! reason: one path, which [`reject_with`](crate::SlidingWindowLayer::reject_with)
//! shapes for all of them.
//!
//! | reason | default status | RateLimit fields | `Retry-After`: until |
//! |---|---|---|---|
//! | [`Window`](Reason::Window): the key's window holds its limit (under warm-up, its warmed limit) | 429, or [`status`](crate::SlidingWindowLayer::status) | yes | enough passes leave the window for one more |
//! | [`Concurrency`](Reason::Concurrency): [`max_concurrency`](crate::SlidingWindowLayer::max_concurrency) requests in flight | 429, or `status` | yes | 1 s (in-flight requests end at no predictable time) |
//! | [`Throttle`](Reason::Throttle): the key's next turn is further than [`throttle`](crate::SlidingWindowLayer::throttle)'s longest wait | 429, or `status` | yes | a turn would be within the longest wait |
//! | [`Store`](Reason::Store): the shared store refused (feature `redis`) | 429, or `status` | yes, with the store's figures | the store's answer |
//! | [`Overflow`](Reason::Overflow): the key found no room in the key table and the shared overflow entry holds its limit | 429, or `status` | yes, policy `"overflow"` | as for `Window` |
//! | [`Breaker`](Reason::Breaker): a circuit breaker of the key is open, or half-open with its probe out | 503 | no | the breaker turns half-open |
//! | [`System`](Reason::System): the layer's [`system`](crate::SlidingWindowLayer::system) rule (adaptive protection) | 503 | no | 1 s (an overload ends at no predictable time) |
//!
//! [`status`](crate::SlidingWindowLayer::status) sets the status of the
//! rate-limit refusals (every reason but `Breaker` and `System`). A
//! breaker's refusal stays `503 Service Unavailable`: the upstream is
//! failing, which is not the client's quota, so it carries no RateLimit
//! fields either; the same goes for the system rule's, whose service is
//! overloaded. Both are
//! defaults: a [`reject_with`](crate::SlidingWindowLayer::reject_with)
//! builder gets a [`Rejection`] for every refusal, with its reason and the
//! status the layer would have sent, and may send any response.
//!
//! Without a builder the body is the status's reason phrase and the retry
//! time, as text: `Too Many Requests: retry in <n> s`, or
//! `Service Unavailable: retry in <n> s` for a breaker (or under
//! `status(StatusCode::SERVICE_UNAVAILABLE)`). The fields:
//!
//! | field | value |
//! |---|---|
//! | `Retry-After` | whole seconds until the request could pass (see the table above): rounded up, at least 1 ([RFC 9110]) |
//! | `RateLimit-Policy` | `"<policy>";q=<limit>;w=<window seconds>` |
//! | `RateLimit` | `"<policy>";r=<remaining>;t=<seconds until more quota>` |
//! | `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` | the same three numbers, only with [`legacy_headers`](crate::SlidingWindowLayer::legacy_headers) |
//!
//! `RateLimit-Policy` and `RateLimit` use the structured-field syntax of
//! [draft-ietf-httpapi-ratelimit-headers-11]. With
//! [`headers_on_pass`](crate::SlidingWindowLayer::headers_on_pass) they go on
//! passed responses too. `Retry-After` and the RateLimit fields are added
//! to whatever a builder returns, unless it set them itself.
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
//! # gRPC
//!
//! Under [`grpc`](crate::SlidingWindowLayer::grpc) the default refusal is
//! a trailers-only gRPC response, whose status a gRPC client reads from the
//! headers; a plain 429 would read as `UNAVAILABLE` (gRPC's mapping of HTTP
//! statuses), which many retry policies retry at once.
//!
//! | reason | `grpc-status` | RateLimit fields |
//! |---|---|---|
//! | `Window`, `Concurrency`, `Throttle`, `Store`, `Overflow` | 8 `RESOURCE_EXHAUSTED`: the client's quota or the layer's capacity | yes |
//! | `Breaker` | 14 `UNAVAILABLE`: the upstream is failing | no |
//!
//! | field | value |
//! |---|---|
//! | HTTP status | `200 OK`, whatever [`status`](crate::SlidingWindowLayer::status) says: a gRPC status travels in a 200 |
//! | `content-type` | `application/grpc` |
//! | `grpc-status` | the code above |
//! | `grpc-message` | `<what>: retry in <n> s`, such as `rate limit reached: retry in 2 s` or `circuit breaker open: retry in 10 s`, percent-encoded as gRPC requires (bytes outside space to `~`, and `%`, as `%XX`) |
//! | `grpc-status-details-bin` | base64 without padding of a `google.rpc.Status` with the same code and message, whose `details` hold one `Any` of type `type.googleapis.com/google.rpc.RetryInfo`: `retry_delay` is the retry time to the millisecond, at most 10 000 years (the largest `google.protobuf.Duration`) |
//! | `Retry-After`, the RateLimit fields | as for every refusal (above); ASCII metadata that gRPC clients pass on and ignore otherwise |
//!
//! There is no body: the response ends with its headers. A
//! [`reject_with`](crate::SlidingWindowLayer::reject_with) builder makes
//! the whole response, as without `grpc`: it gets the same [`Rejection`]
//! (its [`status`](Rejection::status) is still the HTTP status a plain
//! refusal would have) and builds a gRPC answer with
//! [`Rejection::grpc_response`] and [`Rejection::grpc_code`]. A builder
//! that returns anything else is sent as it is, and a gRPC client reads it
//! by gRPC's HTTP mapping.
//!
//! ```text
//! HTTP/2 200
//! content-type: application/grpc
//! grpc-status: 8
//! grpc-message: rate limit reached: retry in 1 s
//! grpc-status-details-bin: CAgSIHJhdGUgbGltaXQgcmVhY2hlZDogcmV0cnkgaW4gMSBzGjQKKHR5cGUuZ29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5SZXRyeUluZm8SCAoGEICWrNsB
//! retry-after: 1
//! ratelimit-policy: "default";q=100;w=1
//! ratelimit: "default";r=0;t=1
//! ```
//!
//! [RFC 9110]: https://www.rfc-editor.org/rfc/rfc9110#field.retry-after
//! [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/

mod grpc;
mod headers;

pub(crate) use headers::{validate_policy_name, PolicyItem, PolicyName, Quota};

pub use crate::flow::Reason;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use headers::ceil_secs;

/// A request the layer refused, handed to a custom response builder (see
/// [`reject_with`](crate::SlidingWindowLayer::reject_with)): every refusal,
/// whatever its [`reason`](Self::reason).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rejection {
    /// The status the layer would answer with: the one set with
    /// [`status`](crate::SlidingWindowLayer::status) (429 unless changed)
    /// for a rate-limit refusal, 503 for a breaker's. The builder decides
    /// whether to use it. Under [`grpc`](crate::SlidingWindowLayer::grpc)
    /// it is still the status a plain refusal would have; the layer's own
    /// gRPC answer is a `200 OK` (see [`Rejection::grpc_response`]).
    pub status: StatusCode,
    /// Why the request was refused.
    pub reason: Reason,
    /// The limit the request was refused against (for a breaker's refusal,
    /// the key's limit).
    pub limit: u64,
    /// The length of the window.
    pub window: Duration,
    /// How long until the request could pass, if nothing else changes.
    pub retry_after: Duration,
    /// The policy name used in the RateLimit headers (never the raw key).
    pub policy: String,
}

impl Rejection {
    /// `Retry-After` in whole seconds: rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        retry_after_secs(u64::try_from(self.retry_after.as_millis()).unwrap_or(u64::MAX))
    }

    /// Why the request was refused (the same as the field).
    pub fn reason(&self) -> Reason {
        self.reason
    }
}

/// `Retry-After` in whole seconds: rounded up, at least 1.
fn retry_after_secs(ms: u64) -> u64 {
    ceil_secs(ms).max(1)
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
    /// Refusals are trailers-only gRPC responses
    /// ([`grpc`](crate::SlidingWindowLayer::grpc)).
    pub(crate) grpc: bool,
}

impl Default for ResponseConfig {
    fn default() -> Self {
        ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            reject_with: None,
            headers_on_pass: false,
            legacy_headers: false,
            policy_name: Arc::from("default"),
            grpc: false,
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
            .field("grpc", &self.grpc)
            .finish()
    }
}

/// The status the layer answers a refusal for `reason` with, unless a
/// builder says otherwise: 503 for a breaker and for the system rule, the
/// configured one (429 by default) for every rate-limit refusal.
fn status_of(config: &ResponseConfig, reason: Reason) -> StatusCode {
    match reason {
        Reason::Breaker | Reason::System => StatusCode::SERVICE_UNAVAILABLE,
        _ => config.status,
    }
}

/// Whether the RateLimit fields go on a refusal for `reason`: not on a
/// breaker's or the system rule's, which say nothing about the client's
/// quota.
fn writes_quota(reason: Reason) -> bool {
    !matches!(reason, Reason::Breaker | Reason::System)
}

/// The response for a request refused for `reason`: the configured
/// builder's (the [`Rejection`] is made only for it), or else, under
/// `grpc`, a trailers-only gRPC response with the code for `reason`, or a
/// short text body with the status for `reason`; then `Retry-After` and,
/// but for a breaker's refusal, the RateLimit fields, unless the builder
/// set them.
pub(crate) fn rejection_response(
    config: &ResponseConfig,
    reason: Reason,
    quota: &Quota,
    retry_after_ms: u64,
) -> Response<Bytes> {
    let status = status_of(config, reason);
    let retry_after = retry_after_secs(retry_after_ms);
    let mut response = match &config.reject_with {
        Some(build) => build(&Rejection {
            status,
            reason,
            limit: quota.limit,
            window: Duration::from_millis(quota.window_ms),
            retry_after: Duration::from_millis(retry_after_ms),
            policy: quota.policy.to_string(),
        }),
        None if config.grpc => grpc::trailers_only(
            grpc::code_of(reason),
            &grpc::message_of(reason, retry_after),
            retry_after_ms,
        ),
        None => default_response(status, retry_after),
    };
    let headers = response.headers_mut();
    if !headers.contains_key(RETRY_AFTER) {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after));
    }
    if writes_quota(reason) {
        quota.write(headers, config.legacy_headers);
    }
    response
}

/// The default refusal: `status`, and its reason phrase with the retry
/// time as a text body (the status code itself if it has no phrase).
fn default_response(status: StatusCode, retry_after_secs: u64) -> Response<Bytes> {
    let body = match status.canonical_reason() {
        Some(phrase) => format!("{phrase}: retry in {retry_after_secs} s\n"),
        None => format!("{}: retry in {retry_after_secs} s\n", status.as_str()),
    };
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::headers::tests::quota;
    use super::*;

    use std::sync::Mutex;

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        let config = ResponseConfig::default();
        let r = rejection_response(&config, Reason::Window, &quota(None), 1);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let r = rejection_response(&config, Reason::Window, &quota(None), 1_001);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        let r = rejection_response(&config, Reason::Window, &quota(None), 0);
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
        let r = rejection_response(&config, Reason::Window, &quota(None), 1);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }

    #[test]
    fn the_default_body_names_the_status_it_is_sent_with() {
        let config = ResponseConfig {
            status: StatusCode::SERVICE_UNAVAILABLE,
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Window, &quota(None), 2_000);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.body(), "Service Unavailable: retry in 2 s\n");
        // A status without a reason phrase is named by its code.
        let odd = StatusCode::from_u16(599).expect("a valid code");
        let config = ResponseConfig {
            status: odd,
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Window, &quota(None), 1);
        assert_eq!(r.body(), "599: retry in 1 s\n");
    }

    #[test]
    fn a_breaker_refusal_is_503_whatever_the_status_without_ratelimit_fields() {
        let config = ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            legacy_headers: true,
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Breaker, &quota(None), 1_001);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "2");
        assert_eq!(r.body(), "Service Unavailable: retry in 2 s\n");
        assert!(!r.headers().contains_key("ratelimit"));
        assert!(!r.headers().contains_key("ratelimit-policy"));
        assert!(!r.headers().contains_key("x-ratelimit-limit"));
        let config = ResponseConfig {
            status: StatusCode::IM_A_TEAPOT,
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Breaker, &quota(None), 0);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
    }

    #[test]
    fn a_system_refusal_is_503_whatever_the_status_without_ratelimit_fields() {
        let config = ResponseConfig {
            status: StatusCode::TOO_MANY_REQUESTS,
            legacy_headers: true,
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::System, &quota(None), 1_000);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.body(), "Service Unavailable: retry in 1 s\n");
        assert!(!r.headers().contains_key("ratelimit"));
        assert!(!r.headers().contains_key("ratelimit-policy"));
        assert!(!r.headers().contains_key("x-ratelimit-limit"));
    }

    #[test]
    fn under_grpc_every_reason_is_a_trailers_only_answer_whatever_the_status() {
        let config = ResponseConfig {
            grpc: true,
            status: StatusCode::IM_A_TEAPOT,
            ..ResponseConfig::default()
        };
        for (reason, code, quota_fields) in [
            (Reason::Window, "8", true),
            (Reason::Concurrency, "8", true),
            (Reason::Throttle, "8", true),
            (Reason::Store, "8", true),
            (Reason::Overflow, "8", true),
            (Reason::Breaker, "14", false),
            (Reason::System, "14", false),
        ] {
            let r = rejection_response(&config, reason, &quota(None), 1_500);
            assert_eq!(r.status(), StatusCode::OK, "{reason:?}");
            assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
            assert_eq!(r.headers()["grpc-status"], code, "{reason:?}");
            assert!(r.headers()["grpc-message"]
                .to_str()
                .expect("ASCII")
                .ends_with(": retry in 2 s"));
            assert!(r.headers().contains_key("grpc-status-details-bin"));
            assert!(r.body().is_empty());
            assert_eq!(r.headers()[RETRY_AFTER], "2");
            assert_eq!(r.headers().contains_key("ratelimit"), quota_fields);
            assert_eq!(r.headers().contains_key("ratelimit-policy"), quota_fields);
        }
    }

    #[test]
    fn under_grpc_a_builder_shapes_the_answer() {
        let config = ResponseConfig {
            grpc: true,
            reject_with: Some(Arc::new(|rejection: &Rejection| {
                rejection.grpc_response(rejection.grpc_code(), "ralentissez \u{e9}")
            })),
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Window, &quota(None), 1);
        assert_eq!(r.headers()["grpc-status"], "8");
        assert_eq!(r.headers()["grpc-message"], "ralentissez %C3%A9");
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert!(r.headers().contains_key("ratelimit"));
        // A builder that answers otherwise is sent as it is.
        let config = ResponseConfig {
            grpc: true,
            reject_with: Some(Arc::new(|rejection: &Rejection| {
                let mut response = Response::new(Bytes::from_static(b"no"));
                *response.status_mut() = rejection.status;
                response
            })),
            ..ResponseConfig::default()
        };
        let r = rejection_response(&config, Reason::Breaker, &quota(None), 1);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!r.headers().contains_key("grpc-status"));
        assert_eq!(r.body(), "no");
    }

    #[test]
    fn a_builder_sees_every_reason_and_its_status() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let config = ResponseConfig {
            status: StatusCode::IM_A_TEAPOT,
            reject_with: Some(Arc::new(move |rejection: &Rejection| {
                log.lock()
                    .expect("not poisoned")
                    .push((rejection.reason(), rejection.status));
                Response::new(Bytes::from_static(b"no"))
            })),
            ..ResponseConfig::default()
        };
        for reason in [Reason::Window, Reason::Breaker, Reason::Overflow] {
            let _ = rejection_response(&config, reason, &quota(None), 1);
        }
        assert_eq!(
            *seen.lock().expect("not poisoned"),
            [
                (Reason::Window, StatusCode::IM_A_TEAPOT),
                (Reason::Breaker, StatusCode::SERVICE_UNAVAILABLE),
                (Reason::Overflow, StatusCode::IM_A_TEAPOT),
            ]
        );
    }
}
