//! `RulesError`: why a rules document (or file) was not applied.

use std::fmt;

/// What went wrong with a rules document or file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RulesErrorKind {
    /// A rule's key or value is not valid for the layer: nothing was
    /// applied. [`RulesError::rule`] and [`RulesError::field`] name it.
    Invalid,
    /// The file is not a rules document: not UTF-8, not in its format, or
    /// with a field that does not exist.
    Parse,
    /// The file could not be read (missing, not permitted, ...).
    Read,
    /// The file is larger than the watcher reads.
    TooLarge,
    /// The watcher could not start (for example, its directory does not
    /// exist).
    Watch,
}

/// Why rules were not applied: the rule and the field that are wrong, and
/// why.
///
/// Its `Display` reads `rules: <rule>: <reason>`, where the rule is
/// `default` or `limits["<key>"]` (a key longer than 64 bytes is cut, with
/// `…`), for example
/// `rules: limits["/login"]: limit must be at most 9007199254740992 (got 18446744073709551615)`.
/// Errors of a file read by the watcher name the file instead of a rule.
///
/// ```
/// use tower_sliding_window::rules::{Rules, RulesErrorKind};
/// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
///
/// let stats = SlidingWindowLayer::qps(10).key(PeerIpKey).handle();
/// let err = stats
///     .apply_rules(&Rules::new().limit("10.0.0.300", 5))
///     .unwrap_err();
/// assert_eq!(err.kind(), RulesErrorKind::Invalid);
/// assert_eq!(err.rule(), Some(r#"limits["10.0.0.300"]"#));
/// assert_eq!(err.field(), Some("key"));
/// assert_eq!(
///     err.to_string(),
///     r#"rules: limits["10.0.0.300"]: key must be an IP address (invalid IP address syntax)"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesError {
    kind: RulesErrorKind,
    /// `default`, `limits["<key>"]`, or the file's path.
    rule: Option<String>,
    field: Option<&'static str>,
    reason: String,
}

/// Bytes of a key kept in an error message.
const SHOWN_KEY_BYTES: usize = 64;

/// How an error names the rule of `key`: `limits["<key>"]`, the key escaped
/// as a Rust string and cut at [`SHOWN_KEY_BYTES`], so that a hostile key
/// can neither forge lines in a log nor make the message long.
pub(crate) fn rule_name(key: &str) -> String {
    entry_name("limits", key)
}

/// How an error names the route rule of `route`: `routes["<route>"]`,
/// escaped and cut as [`rule_name`] does.
pub(crate) fn route_rule_name(route: &str) -> String {
    entry_name("routes", route)
}

fn entry_name(section: &str, key: &str) -> String {
    let mut end = key.len().min(SHOWN_KEY_BYTES);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    let shown: String = key[..end].escape_debug().collect();
    let more = if end < key.len() { "…" } else { "" };
    format!("{section}[\"{shown}{more}\"]")
}

impl RulesError {
    pub(crate) fn invalid(
        rule: impl Into<String>,
        field: &'static str,
        reason: impl Into<String>,
    ) -> Self {
        RulesError {
            kind: RulesErrorKind::Invalid,
            rule: Some(rule.into()),
            field: Some(field),
            reason: reason.into(),
        }
    }

    /// An error of the file at `source` (its path, as shown).
    #[cfg_attr(not(feature = "rules-file"), allow(dead_code))]
    pub(crate) fn file(kind: RulesErrorKind, source: String, reason: impl Into<String>) -> Self {
        RulesError {
            kind,
            rule: Some(source),
            field: None,
            reason: reason.into(),
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> RulesErrorKind {
        self.kind
    }

    /// The rule that is wrong (`default`, `limits["<key>"]` or
    /// `routes["<route>"]`), or for an error of a file, the file's path.
    pub fn rule(&self) -> Option<&str> {
        self.rule.as_deref()
    }

    /// The field of the rule that is wrong: `"limit"`, `"key"` or
    /// `"route"`; `None` for an error of the file as a whole.
    pub fn field(&self) -> Option<&'static str> {
        self.field
    }

    /// Why, without the rule's name.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(rule) => write!(f, "rules: {rule}: {}", self.reason),
            None => write!(f, "rules: {}", self.reason),
        }
    }
}

impl std::error::Error for RulesError {}

#[cfg(test)]
mod tests {
    use super::rule_name;

    #[test]
    fn rule_names_escape_and_cut_keys() {
        assert_eq!(rule_name("/login"), r#"limits["/login"]"#);
        assert_eq!(rule_name("a\"\n"), r#"limits["a\"\n"]"#);
        let long = "é".repeat(100);
        let name = rule_name(&long);
        assert_eq!(name, format!("limits[\"{}…\"]", "é".repeat(32)));
        assert_eq!(
            super::route_rule_name("POST /a\u{1b}"),
            r#"routes["POST /a\u{1b}"]"#
        );
    }
}
