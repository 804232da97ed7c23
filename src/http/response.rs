//! What the layer answers: the 429 for a rejected request and the
//! RateLimit header fields.
//!
//! A rejection carries
//!
//! - `Retry-After`: whole seconds until enough passes leave the window for
//!   one more request, rounded up, at least 1 (RFC 9110);
//! - `RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>` and
//!   `RateLimit: "<policy>";r=<remaining>;t=<seconds>` in the structured-field
//!   syntax of draft-ietf-httpapi-ratelimit-headers-11;
//! - optionally the legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//!   `X-RateLimit-Reset` (seconds until more quota).
//!
//! The policy name is `"default"` (see
//! [`policy_name`](crate::SlidingWindowLayer::policy_name)) for keys on the
//! default limit. A key with its own limit is named `"<name>-<8 hex digits>"`
//! from a randomly seeded hash of the key, so clients can tell policies apart
//! but the header never carries the key itself (an IP, a token).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

/// A request the layer rejected, handed to a custom response builder (see
/// [`reject_with`](crate::SlidingWindowLayer::reject_with)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rejection {
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
        ceil_secs(self.retry_after).max(1)
    }
}

/// Builds the response for a rejected request.
pub(crate) type RejectFn = Arc<dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync>;

/// Response settings of a layer.
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

/// Checks a policy name: the draft puts it in a structured-field string, so
/// printable ASCII without `"` and `\`.
pub(crate) fn validate_policy_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if !name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
    {
        return Err("must be printable ASCII without `\"` or `\\`");
    }
    Ok(())
}

/// Everything the RateLimit fields of one response say.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    pub(crate) policy: PolicyName,
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
    pub(crate) remaining: u64,
    /// Milliseconds until more quota is available.
    pub(crate) reset_ms: u64,
}

/// A policy name, formatted only when a header is written.
#[derive(Debug, Clone)]
pub(crate) struct PolicyName {
    pub(crate) base: Arc<str>,
    pub(crate) tag: Option<u32>,
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            None => f.write_str(&self.base),
            Some(tag) => write!(f, "{}-{tag:08x}", self.base),
        }
    }
}

fn ceil_secs(d: Duration) -> u64 {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    ms.div_ceil(1000)
}

fn header_value(value: impl fmt::Display) -> HeaderValue {
    // Every value written here is ASCII digits, policy names checked by
    // `validate_policy_name`, and punctuation: always a valid header value.
    HeaderValue::try_from(value.to_string()).unwrap_or_else(|_| HeaderValue::from_static(""))
}

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

impl Quota {
    /// Writes the RateLimit fields (and the legacy ones if asked), leaving
    /// any the response already carries.
    pub(crate) fn write(&self, headers: &mut HeaderMap, legacy: bool) {
        let window_secs = self.window_ms.div_ceil(1000).max(1);
        let reset_secs = self.reset_ms.div_ceil(1000);
        let mut put = |name: &HeaderName, value: HeaderValue| {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value);
            }
        };
        put(
            &RATELIMIT_POLICY,
            header_value(format_args!(
                "\"{}\";q={};w={}",
                self.policy, self.limit, window_secs
            )),
        );
        put(
            &RATELIMIT,
            header_value(format_args!(
                "\"{}\";r={};t={}",
                self.policy, self.remaining, reset_secs
            )),
        );
        if legacy {
            put(&X_RATELIMIT_LIMIT, HeaderValue::from(self.limit));
            put(&X_RATELIMIT_REMAINING, HeaderValue::from(self.remaining));
            put(&X_RATELIMIT_RESET, HeaderValue::from(reset_secs));
        }
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
    use super::*;

    fn quota(tag: Option<u32>) -> Quota {
        Quota {
            policy: PolicyName {
                base: Arc::from("default"),
                tag,
            },
            limit: 100,
            window_ms: 1000,
            remaining: 0,
            reset_ms: 1,
        }
    }

    #[test]
    fn draft_11_syntax() {
        let mut headers = HeaderMap::new();
        quota(None).write(&mut headers, false);
        assert_eq!(headers["ratelimit-policy"], "\"default\";q=100;w=1");
        assert_eq!(headers["ratelimit"], "\"default\";r=0;t=1");
        assert!(!headers.contains_key("x-ratelimit-limit"));
    }

    #[test]
    fn tagged_policy_and_legacy_headers() {
        let mut headers = HeaderMap::new();
        quota(Some(0xbeef)).write(&mut headers, true);
        assert_eq!(
            headers["ratelimit-policy"],
            "\"default-0000beef\";q=100;w=1"
        );
        assert_eq!(headers["x-ratelimit-limit"], "100");
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        assert_eq!(headers["x-ratelimit-reset"], "1");
    }

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
    fn policy_names_are_checked() {
        assert!(validate_policy_name("api-v1").is_ok());
        assert!(validate_policy_name("").is_err());
        assert!(validate_policy_name("a\"b").is_err());
        assert!(validate_policy_name("é").is_err());
    }
}
