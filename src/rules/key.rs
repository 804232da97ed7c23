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

    /// How to read the route part of a key, for a key type that has one
    /// (a pair `(client, route)`, such as
    /// [`ClientRouteKey`](crate::ClientRouteKey)'s): the `routes` of a
    /// document then name routes. `None` (the provided default): a
    /// document with `routes` is refused for this key type.
    fn route_of_key() -> Option<for<'a> fn(&'a Self) -> &'a str> {
        None
    }
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

/// A key made of a client and a route ([`ClientRouteKey`](crate::ClientRouteKey)):
/// the text is the two parts as exporters show the key, joined by `", "`:
/// `"10.0.0.7, POST /login"`. Inside a part, `,` and `\` are written
/// `\,` and `\\`, and a part that reads `-` is written `\-` (a bare `-`
/// stands for a missing client, which a rule cannot name).
///
/// ```
/// use std::net::IpAddr;
/// use tower_sliding_window::rules::RuleKey;
///
/// let key = <(Option<IpAddr>, String)>::from_rule_key("10.0.0.7, POST /login").unwrap();
/// assert_eq!(key, (Some([10, 0, 0, 7].into()), "POST /login".to_owned()));
/// let comma = <(Option<String>, String)>::from_rule_key(r"acme\, inc, GET /").unwrap();
/// assert_eq!(comma, (Some("acme, inc".to_owned()), "GET /".to_owned()));
/// ```
impl<A: RuleKey> RuleKey for (A, String) {
    fn from_rule_key(text: &str) -> Result<Self, String> {
        let [client, route] = split_pair(text)?;
        let client = match client {
            None => {
                return Err(
                    "key's client part is `-`, a request without a client part, which \
                            a rule cannot name (write `\\-` for the text `-`)"
                        .to_owned(),
                );
            }
            Some(client) => {
                A::from_rule_key(&client).map_err(|reason| format!("client part: {reason}"))?
            }
        };
        // `None` (a bare `-`) as the route: no route extractor writes it.
        let route = route.ok_or_else(|| {
            "key's route part is `-`, which no route is (write `\\-` for the text `-`)".to_owned()
        })?;
        let route = String::from_rule_key(&route)?;
        Ok((client, route))
    }

    fn route_of_key() -> Option<for<'a> fn(&'a Self) -> &'a str> {
        Some(crate::key::route_part::<A>)
    }
}

/// The two parts of a pair key's text (see the `RuleKey` impl for pairs):
/// `None` for a bare `-`, else the part unescaped.
fn split_pair(text: &str) -> Result<[Option<String>; 2], String> {
    const FORM: &str = "key must be `client, route`: the two parts joined by `, `, with `,` and \
                        `\\` inside a part written `\\,` and `\\\\`";
    let mut parts: Vec<Option<String>> = Vec::with_capacity(2);
    let mut part = String::new();
    // The part so far is exactly one unescaped `-`.
    let mut bare_dash = false;
    let mut chars = text.chars();
    let finish = |part: &mut String, bare_dash: &mut bool| {
        let done = if *bare_dash && part == "-" {
            None
        } else {
            Some(std::mem::take(part))
        };
        part.clear();
        *bare_dash = false;
        done
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) => {
                    part.push(escaped);
                    bare_dash = false;
                }
                None => return Err(format!("{FORM} (it ends with a lone `\\`)")),
            },
            ',' => {
                if chars.next() != Some(' ') {
                    return Err(format!("{FORM} (a `,` not followed by a space)"));
                }
                parts.push(finish(&mut part, &mut bare_dash));
            }
            '-' if part.is_empty() => {
                part.push('-');
                bare_dash = true;
            }
            c => {
                part.push(c);
                bare_dash = false;
            }
        }
    }
    parts.push(finish(&mut part, &mut bare_dash));
    match <[Option<String>; 2]>::try_from(parts) {
        Ok(pair) => Ok(pair),
        Err(parts) => Err(format!("{FORM} (got {} parts)", parts.len())),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    #[cfg(any(feature = "prometheus", feature = "dashboard"))]
    use crate::export::KeyLabel;

    type Pair = (Option<IpAddr>, String);

    #[cfg(any(feature = "prometheus", feature = "dashboard"))]
    #[test]
    fn a_pair_is_read_back_from_its_label() {
        let keys: [(Option<String>, String); 5] = [
            (Some("acme".into()), "POST /login".into()),
            (Some("a, b\\c".into()), "GET /x,y".into()),
            (Some("-".into()), "GET /".into()),
            (Some("".into()), "".into()),
            (Some("é,".into()), "-".into()),
        ];
        for key in keys {
            let label = key.label().unwrap().into_owned();
            assert_eq!(
                <(Option<String>, String)>::from_rule_key(&label).as_ref(),
                Ok(&key),
                "{label}"
            );
        }
    }

    #[test]
    fn malformed_pairs_are_refused_with_the_reason() {
        for (text, says) in [
            ("10.0.0.7", "got 1 parts"),
            ("10.0.0.7, GET /, x", "got 3 parts"),
            ("10.0.0.7,GET /", "not followed by a space"),
            ("10.0.0.7, GET /\\", "lone"),
            ("-, GET /", "client part is `-`"),
            ("10.0.0.7, -", "route part is `-`"),
            (
                "10.0.0.300, GET /",
                "client part: key must be an IP address",
            ),
        ] {
            let err = Pair::from_rule_key(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
        let long = format!("10.0.0.7, {}", "r".repeat(crate::key::MAX_KEY_BYTES + 1));
        assert!(Pair::from_rule_key(&long).unwrap_err().contains("at most"));
        let max = format!("10.0.0.7, {}", "r".repeat(crate::key::MAX_KEY_BYTES));
        assert!(Pair::from_rule_key(&max).is_ok());
    }

    #[test]
    fn only_pairs_have_a_route_part() {
        assert!(String::route_of_key().is_none());
        let route_of = Pair::route_of_key().unwrap();
        assert_eq!(route_of(&(None, "GET /".to_owned())), "GET /");
    }
}
