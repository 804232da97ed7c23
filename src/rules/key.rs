//! `RuleKey`: how a rules document's text names a key of the layer.

use std::net::IpAddr;
use std::sync::Arc;

use crate::key::MAX_KEY_BYTES;

/// A key type that rules documents can name: read from the text a document
/// writes the key as (see the [module docs](super#how-keys-are-written)).
///
/// Implemented for the key types of the built-in extractors. A closure
/// extractor's own key type implements it to be named by rules:
///
/// ```
/// use tower_sliding_window::rules::{RuleKey, Rules};
/// use tower_sliding_window::SlidingWindowLayer;
///
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct Tenant(u32);
///
/// impl RuleKey for Tenant {
///     fn from_rule_key(text: &str) -> Result<Self, String> {
///         text.parse()
///             .map(Tenant)
///             .map_err(|_| "key must be a tenant number".to_owned())
///     }
/// }
///
/// let layer = SlidingWindowLayer::qps(10).key(|parts: &http::request::Parts| {
///     Tenant(parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0))
/// });
/// let stats = layer.handle();
/// stats.apply_rules(&Rules::new().limit("7", 100)).unwrap();
/// let err = stats.apply_rules(&Rules::new().limit("seven", 100)).unwrap_err();
/// assert_eq!(err.to_string(), r#"rules: limits["seven"]: key must be a tenant number"#);
/// ```
pub trait RuleKey: Sized {
    /// The key `text` names, or why it names none (the error then reads
    /// `rules: limits["<text>"]: <reason>`).
    fn from_rule_key(text: &str) -> Result<Self, String>;
}

/// A text key the built-in extractors could produce: at most
/// [`MAX_KEY_BYTES`], since a longer one is keyed by its digest.
fn text_key(text: &str) -> Result<&str, String> {
    if text.len() > MAX_KEY_BYTES {
        return Err(format!(
            "key must be at most {MAX_KEY_BYTES} bytes, as a longer one is keyed by its digest \
             (got {} bytes)",
            text.len()
        ));
    }
    Ok(text)
}

/// Paths, methods and paths, matched routes.
impl RuleKey for String {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        text_key(text).map(str::to_owned)
    }
}

impl RuleKey for Arc<str> {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        text_key(text).map(Arc::from)
    }
}

impl RuleKey for Box<str> {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        text_key(text).map(Box::from)
    }
}

/// A header's value: the text names `Some(value)`.
impl RuleKey for Option<String> {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        String::from_rule_key(text).map(Some)
    }
}

/// An address; an IPv4-mapped IPv6 address names its IPv4 address, as
/// the built-in extractors key it.
impl RuleKey for IpAddr {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        text.parse::<IpAddr>()
            .map(|ip| ip.to_canonical())
            .map_err(|err| format!("key must be an IP address ({err})"))
    }
}

/// A client's address: the text names `Some(address)`.
impl RuleKey for Option<IpAddr> {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        IpAddr::from_rule_key(text).map(Some)
    }
}

/// The one key of [`GlobalKey`](crate::GlobalKey): no text names it, as
/// `default` is its limit.
impl RuleKey for () {
    fn from_rule_key(_: &str) -> Result<Self, String> {
        Err("the layer has one global key: set its limit with `default`".to_owned())
    }
}
