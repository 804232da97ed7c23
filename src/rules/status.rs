//! What the handle says about rules: how many documents were applied, and
//! the last one that was not.

use std::sync::Mutex;

use super::RulesError;

/// The rules state of a layer, from
/// [`StatsHandle::rules_status`](crate::StatsHandle::rules_status).
///
/// ```
/// use tower_sliding_window::rules::Rules;
/// use tower_sliding_window::{PathKey, SlidingWindowLayer};
///
/// let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
/// assert_eq!(stats.rules_status().version, 0);
/// let _ = stats.apply_rules(&Rules::new().limit("/a", u64::MAX));
/// let status = stats.rules_status();
/// assert_eq!(status.version, 0);
/// assert_eq!(status.last_error.unwrap().field(), Some("limit"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RulesStatus {
    /// How many documents were applied to the layer (by
    /// [`apply_rules`](crate::StatsHandle::apply_rules) or a watcher):
    /// 0 until the first, then one more for each. A watcher applies a file
    /// again only when its bytes changed.
    pub version: u64,
    /// Why the latest attempt failed, if it did (a document that did not
    /// validate, a file that could not be read or parsed); `None` once a
    /// document is applied after it. The limits are those of the last
    /// document applied.
    pub last_error: Option<RulesError>,
}

/// The layer's rules state, shared by its handles.
#[derive(Debug, Default)]
pub(crate) struct Status {
    /// Held for a whole apply, so that two documents applied at once are
    /// applied one after the other, never interleaved key by key.
    pub(crate) applying: Mutex<()>,
    state: Mutex<RulesStatus>,
}

impl Status {
    pub(crate) fn get(&self) -> RulesStatus {
        lock(&self.state).clone()
    }

    /// A document was applied; returns the new version.
    pub(crate) fn applied(&self) -> u64 {
        let mut state = lock(&self.state);
        state.version = state.version.saturating_add(1);
        state.last_error = None;
        state.version
    }

    /// An attempt failed with `error`.
    pub(crate) fn failed(&self, error: &RulesError) {
        lock(&self.state).last_error = Some(error.clone());
    }
}

/// Locks `mutex`, through poisoning: the state is written in single steps
/// that leave it whole.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
