//! What the builder refuses: the bounds of a compact key, the settings a
//! compact key cannot support, and the checks of further windows
//! (`limit_per`) against the first window and the compact bounds. Apart
//! from the builder and the impl blocks that call them, so that each of
//! those depends on this file and none on another.

use std::time::Duration;

use crate::stat::{COMPACT_MAX_BUCKETS, COMPACT_MAX_LIMIT};
use crate::store::{shape_of, Settings, Window};

/// Panics, naming `method` and `compact`, when a compact window would have
/// more buckets than a compact key keeps.
pub(super) fn check_compact_buckets(method: &str, sample_count: usize) {
    if sample_count > COMPACT_MAX_BUCKETS {
        panic!(
            "SlidingWindowLayer::{method}: invalid `sample_count` on a `compact` layer: at most \
             {COMPACT_MAX_BUCKETS} buckets (got {sample_count})"
        );
    }
}

/// Panics, naming `method` and the setting, when a window's shape is not
/// one a compact key keeps (see `CompactShape::validate`: at most 2^29 ms
/// per bucket, besides the bucket count checked first).
pub(super) fn check_compact_shape(method: &str, window: &Window) {
    if let Err(err) = shape_of(window).validate() {
        panic!("SlidingWindowLayer::{method}: on a `compact` layer, {err}");
    }
}

/// Panics, naming `method`, `setting` and `compact`, when a limit is above
/// what a compact window counts.
pub(super) fn check_compact_limit(method: &str, setting: &str, limit: u64) {
    if limit > COMPACT_MAX_LIMIT {
        panic!(
            "SlidingWindowLayer::{method}: invalid `{setting}` on a `compact` layer: at most \
             {COMPACT_MAX_LIMIT} per window (got {limit})"
        );
    }
}

/// Why a compact layer cannot have each setting (see
/// [`SlidingWindowLayer::compact`]).
pub(super) const BREAKER_WHY: &str =
    "a compact key keeps no completions (success, failure, response time) for a breaker to judge";
pub(super) const CONCURRENCY_WHY: &str = "a compact key keeps no gauge of requests in flight";
pub(super) const WARM_UP_WHY: &str = "a compact key keeps no warm-up state";
pub(super) const PRIORITIZED_WHY: &str =
    "a compact key keeps no borrowed passes for a later bucket";
pub(super) const THROTTLE_WHY: &str = "a compact key keeps no pacing turns";
pub(super) const SYSTEM_WHY: &str = "a compact layer records no completions (response times, \
     requests in flight) for the system rule to read; give the rule to a full layer behind it";
#[cfg(feature = "redis")]
pub(super) const STORE_WHY: &str =
    "a compact key keeps no local window beside the store's for the failure policy to fall back on";

/// Panics, naming `setting` and `compact`, when a layer that is `compact`
/// is given `setting`, which a compact key cannot support (`why`).
pub(super) fn refuse_on_compact(compact: bool, setting: &str, why: &str) {
    if compact {
        panic!(
            "SlidingWindowLayer::{setting}: invalid `{setting}` on a `compact` layer: {why}; \
             drop `compact` (a full key records everything) or `{setting}`"
        );
    }
}

/// The most further windows a layer may have (see
/// [`SlidingWindowLayer::limit_per`], "Memory").
pub(crate) const MAX_FURTHER_WINDOWS: usize = 1024;

/// Why a layer with further windows cannot have each setting.
pub(super) const FURTHER_THROTTLE_WHY: &str =
    "pacing spaces passes by the first window's limit alone and would not charge the further windows";
pub(super) const FURTHER_PRIORITIZED_WHY: &str =
    "a borrowed pass is taken from a later bucket of the first \
     window alone and would not be charged to the further windows";

/// Panics, naming `method`, `setting` and `limit_per`, when a layer with
/// further windows (`has_windows`) is given `setting`, which cannot count
/// them (`why`).
#[cfg_attr(not(any(feature = "tokio", feature = "redis")), allow(dead_code))]
pub(super) fn refuse_with_windows(has_windows: bool, method: &str, setting: &str, why: &str) {
    if has_windows {
        panic!(
            "SlidingWindowLayer::{method}: invalid `{setting}` with `limit_per`: {why}; drop \
             `limit_per` or `{setting}`"
        );
    }
}

/// The interval of `method`'s `interval` argument in whole milliseconds,
/// or a panic naming the setting.
pub(super) fn interval_ms(method: &str, interval: Duration) -> u64 {
    assert!(
        interval.subsec_nanos() % 1_000_000 == 0,
        "SlidingWindowLayer::{method}: invalid `interval`: must be a whole number of milliseconds \
         (got {interval:?})"
    );
    let Ok(ms) = u64::try_from(interval.as_millis()) else {
        panic!("SlidingWindowLayer::{method}: invalid `interval`: too long (got {interval:?})");
    };
    if ms == 0 {
        panic!("SlidingWindowLayer::{method}: invalid `interval`: must be at least 1 ms (got 0)");
    }
    ms
}

/// Checks that the further window of `interval_ms` fits the first window
/// `window`: its interval is a whole number of the first window's buckets'
/// count, and the strict span fits. Panics naming `method` otherwise.
pub(super) fn check_further(method: &str, interval_ms: u64, window: &Window) {
    let buckets = window.sample_count as u64;
    if interval_ms % buckets != 0 {
        panic!(
            "SlidingWindowLayer::{method}: invalid `interval` of a `limit_per` window: must be a \
             multiple of the window's `sample_count` ({buckets}) in milliseconds, as each \
             further window has as many buckets as the first (got {interval_ms} ms)"
        );
    }
    if interval_ms == window.interval_ms {
        panic!(
            "SlidingWindowLayer::{method}: invalid `interval` of a `limit_per` window: must \
             differ from the first window's interval ({interval_ms} ms); change that window's \
             limit with `qps`, `rule` or `set_limit`"
        );
    }
    if window.strict && interval_ms.checked_add(interval_ms / buckets).is_none() {
        panic!(
            "SlidingWindowLayer::{method}: invalid `interval` of a `limit_per` window: under \
             `strict`, the interval plus one bucket must be at most u64::MAX ms (got \
             {interval_ms} ms)"
        );
    }
}

/// On a `compact` layer: panics, naming `method` and the setting, when a
/// further window of `limit_per` is not one a compact key keeps beside a
/// first window `window` (at most 2^29 ms per bucket), or a limit of it (a
/// default, or a key's own from `rule_per`) is above what a compact window
/// counts (65 535).
pub(super) fn check_compact_further<K>(method: &str, settings: &Settings<K>, window: &Window) {
    check_compact_windows(method, &settings.limit_per.windows, window);
    for limits in settings.limit_per.rules.values() {
        if let Some(&limit) = limits.values().max() {
            check_compact_limit(method, "rule_per", limit);
        }
    }
}

/// [`check_compact_further`] for the further windows `windows` alone.
pub(super) fn check_compact_windows(method: &str, windows: &[(u64, u64)], window: &Window) {
    for &(interval_ms, limit) in windows {
        check_compact_limit(method, "limit_per", limit);
        let further = Window {
            interval_ms,
            ..*window
        };
        if let Err(err) = shape_of(&further).validate() {
            panic!(
                "SlidingWindowLayer::{method}: invalid `limit_per` window of {interval_ms} ms on \
                 a `compact` layer: {err}"
            );
        }
    }
}

/// Checks every further window of `settings` against a first window about
/// to become `window` (from `SlidingWindowLayer::window`).
pub(super) fn check_all_further<K>(method: &str, settings: &Settings<K>, window: &Window) {
    for &(interval_ms, _) in &settings.limit_per.windows {
        check_further(method, interval_ms, window);
    }
}
