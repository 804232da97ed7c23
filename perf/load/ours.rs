//! Our layer, set up the way the harness needs it.

use std::time::Duration;

use axum::Router;
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{MatchedPathKey, PathKey, SlidingWindowLayer, Snapshot, StatsHandle};

/// The statistics handle of whichever key our contender uses.
#[derive(Debug, Clone)]
pub enum OurStats {
    /// One global key.
    Global(StatsHandle<()>),
    /// String keys (matched path, or path in the soak).
    Keyed(StatsHandle<String>),
}

impl OurStats {
    /// All keys summed: the counts of the current window.
    pub fn total(&self) -> Snapshot {
        match self {
            OurStats::Global(handle) => handle.total(),
            OurStats::Keyed(handle) => handle.total(),
        }
    }

    /// Keys held, the overflow entry included.
    pub fn len(&self) -> usize {
        match self {
            OurStats::Global(handle) => handle.len(),
            OurStats::Keyed(handle) => handle.len(),
        }
    }

    /// The string keys held (empty for the global handle).
    pub fn keys(&self) -> Vec<String> {
        match self {
            OurStats::Global(_) => Vec::new(),
            OurStats::Keyed(handle) => handle.keys(),
        }
    }

    /// The snapshot of one string key (`None` for the global handle).
    pub fn snapshot(&self, key: &str) -> Option<Snapshot> {
        match self {
            OurStats::Global(_) => None,
            OurStats::Keyed(handle) => handle.snapshot(key),
        }
    }
}

/// `SlidingWindowLayer::qps(limit)` around `app`, on `clock` when given.
pub fn global(app: Router, limit: u64, clock: Option<ManualClock>) -> (Router, OurStats) {
    let layer = SlidingWindowLayer::qps(limit);
    let layer = match clock {
        Some(clock) => layer.clock(clock),
        None => layer,
    };
    let handle = layer.handle();
    (app.layer(layer), OurStats::Global(handle))
}

/// `SlidingWindowLayer::qps(limit).strict()` around `app`, on `clock` when
/// given.
pub fn strict(app: Router, limit: u64, clock: Option<ManualClock>) -> (Router, OurStats) {
    let layer = SlidingWindowLayer::qps(limit).strict();
    let layer = match clock {
        Some(clock) => layer.clock(clock),
        None => layer,
    };
    let handle = layer.handle();
    (app.layer(layer), OurStats::Global(handle))
}

/// `SlidingWindowLayer::qps(limit).throttle(max_wait)` around `app`.
pub fn throttle(app: Router, limit: u64, max_wait: Duration) -> (Router, OurStats) {
    let layer = SlidingWindowLayer::qps(limit).throttle(max_wait);
    let handle = layer.handle();
    (app.layer(layer), OurStats::Global(handle))
}

/// `SlidingWindowLayer::qps(limit).key(MatchedPathKey)` around
/// `app`.
pub fn matched_path(app: Router, limit: u64, clock: Option<ManualClock>) -> (Router, OurStats) {
    let layer = SlidingWindowLayer::qps(limit).key(MatchedPathKey);
    let layer = match clock {
        Some(clock) => layer.clock(clock),
        None => layer,
    };
    let handle = layer.handle();
    (app.layer(layer), OurStats::Keyed(handle))
}

/// The soak's layer: a key per request path, at most `max_keys` keys; a
/// compact layer when `compact`.
pub fn per_path(
    app: Router,
    limit: u64,
    max_keys: usize,
    clock: ManualClock,
    compact: bool,
) -> (Router, OurStats) {
    let layer = SlidingWindowLayer::qps(limit)
        .key(PathKey)
        .max_keys(max_keys)
        .clock(clock);
    let layer = if compact { layer.compact() } else { layer };
    let handle = layer.handle();
    (app.layer(layer), OurStats::Keyed(handle))
}
