//! Configuration errors.

use std::fmt;

/// A window or metric was configured with values that cannot work.
///
/// The message names the field and the rule it broke, for example
/// ``invalid `sample_count`: must be greater than 0 (got 0)``.
///
/// # Examples
///
/// ```
/// use tower_sliding_window::stat::ArrayMetric;
///
/// let err = ArrayMetric::new(3, 1000).unwrap_err();
/// assert_eq!(err.field(), "interval_ms");
/// assert_eq!(
///     err.to_string(),
///     "invalid `interval_ms`: must be a multiple of `sample_count` (got 1000, sample_count = 3)",
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConfigError {
    field: &'static str,
    rule: &'static str,
    detail: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, rule: &'static str, detail: impl Into<String>) -> Self {
        ConfigError {
            field,
            rule,
            detail: detail.into(),
        }
    }

    /// The name of the setting that was rejected, e.g. `"sample_count"`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// The rule the setting broke, e.g. `"must be greater than 0"`.
    pub fn rule(&self) -> &'static str {
        self.rule
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid `{}`: {} ({})",
            self.field, self.rule, self.detail
        )
    }
}

impl std::error::Error for ConfigError {}
