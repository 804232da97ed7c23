//! The RateLimit header fields: what they say, and how they are written.

use std::fmt;
use std::sync::Arc;

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Everything the RateLimit fields of one response say.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    pub(crate) policy: PolicyName,
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
    pub(crate) remaining: u64,
    /// Milliseconds until more quota is available.
    pub(crate) reset_ms: u64,
    /// Every window of a key with further windows (`limit_per`), the first
    /// one first, for `RateLimit-Policy`; the fields above then describe
    /// the tightest of them, named by `policy.window`. `None`: one window,
    /// the one above.
    pub(crate) policies: Option<Box<[PolicyItem]>>,
}

/// One window in `RateLimit-Policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PolicyItem {
    /// The window's interval in ms when it is a further window (its name
    /// then ends in `-<ms>ms`); `None` for the first window.
    pub(crate) window: Option<u64>,
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
}

/// The policy name of the overflow entry's keys (see
/// [`max_keys`](crate::SlidingWindowLayer::max_keys)).
pub(crate) const OVERFLOW_POLICY_NAME: &str = "overflow";

/// A policy name, formatted only when a header is written.
#[derive(Debug, Clone)]
pub(crate) struct PolicyName {
    pub(crate) base: Arc<str>,
    /// The key's own policy's tag; `None` on the default limit.
    pub(crate) tag: Option<u32>,
    /// The key found no room in the key table and shares the overflow
    /// entry: named [`OVERFLOW_POLICY_NAME`], whatever the base, so a
    /// client can tell a full table from its own spent quota.
    pub(crate) overflow: bool,
    /// A further window's interval in ms (`limit_per`): the name ends in
    /// `-<ms>ms`, so that each window of a key has its own policy name.
    /// `None` for the first window, named as it always was.
    pub(crate) window: Option<u64>,
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tag {
            _ if self.overflow => f.write_str(OVERFLOW_POLICY_NAME)?,
            None => f.write_str(&self.base)?,
            Some(tag) => write!(f, "{}-{tag:08x}", self.base)?,
        }
        match self.window {
            None => Ok(()),
            Some(ms) => write!(f, "-{ms}ms"),
        }
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

/// Milliseconds as whole seconds, rounded up.
pub(crate) fn ceil_secs(ms: u64) -> u64 {
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
        let window_secs = ceil_secs(self.window_ms).max(1);
        let reset_secs = ceil_secs(self.reset_ms);
        let mut put = |name: &HeaderName, value: HeaderValue| {
            if !headers.contains_key(name) {
                headers.insert(name.clone(), value);
            }
        };
        let policy = match &self.policies {
            None => header_value(format_args!(
                "\"{}\";q={};w={}",
                self.policy, self.limit, window_secs
            )),
            Some(items) => header_value(PolicyList {
                name: &self.policy,
                items,
            }),
        };
        put(&RATELIMIT_POLICY, policy);
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

/// Every window of a key as the items of one `RateLimit-Policy` list.
struct PolicyList<'a> {
    name: &'a PolicyName,
    items: &'a [PolicyItem],
}

impl fmt::Display for PolicyList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            let name = PolicyName {
                window: item.window,
                ..self.name.clone()
            };
            write!(
                f,
                "\"{name}\";q={};w={}",
                item.limit,
                ceil_secs(item.window_ms).max(1)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn quota(tag: Option<u32>) -> Quota {
        Quota {
            policy: PolicyName {
                base: Arc::from("default"),
                tag,
                overflow: false,
                window: None,
            },
            limit: 100,
            window_ms: 1000,
            remaining: 0,
            reset_ms: 1,
            policies: None,
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
    fn the_overflow_entry_is_named_overflow_whatever_the_base() {
        let mut headers = HeaderMap::new();
        let mut overflowed = quota(None);
        overflowed.policy.base = Arc::from("api");
        overflowed.policy.overflow = true;
        overflowed.write(&mut headers, false);
        assert_eq!(headers["ratelimit-policy"], "\"overflow\";q=100;w=1");
        assert_eq!(headers["ratelimit"], "\"overflow\";r=0;t=1");
    }

    #[test]
    fn several_windows_are_listed_and_the_tightest_is_reported() {
        let mut headers = HeaderMap::new();
        let mut several = quota(Some(0xbeef));
        several.policy.window = Some(60_000);
        several.limit = 300;
        several.window_ms = 60_000;
        several.reset_ms = 12_500;
        several.policies = Some(Box::new([
            PolicyItem {
                window: None,
                limit: 100,
                window_ms: 1_000,
            },
            PolicyItem {
                window: Some(60_000),
                limit: 300,
                window_ms: 60_000,
            },
        ]));
        several.write(&mut headers, true);
        assert_eq!(
            headers["ratelimit-policy"],
            "\"default-0000beef\";q=100;w=1, \"default-0000beef-60000ms\";q=300;w=60"
        );
        assert_eq!(
            headers["ratelimit"],
            "\"default-0000beef-60000ms\";r=0;t=13"
        );
        assert_eq!(headers["x-ratelimit-limit"], "300");
    }

    #[test]
    fn policy_names_are_checked() {
        assert!(validate_policy_name("api-v1").is_ok());
        assert!(validate_policy_name("").is_err());
        assert!(validate_policy_name("a\"b").is_err());
        assert!(validate_policy_name("é").is_err());
    }
}
