//! The JSON of `GET /stats`.

use std::hash::Hash;

use serde::Serialize;

use crate::export::KeyLabel;
use crate::stat::MetricNode;
use crate::{Snapshot, StatsHandle};

#[derive(Serialize)]
struct Stats {
    now_ms: u64,
    window_ms: u64,
    limits_editable: bool,
    total: Snapshot,
    keys: Vec<KeyStats>,
}

#[derive(Serialize)]
struct KeyStats {
    key: Option<String>,
    kind: &'static str,
    traffic: u64,
    snapshot: Snapshot,
    history: History,
}

/// A key's history, one column per figure.
#[derive(Serialize, Default)]
struct History {
    t: Vec<u64>,
    pass: Vec<u64>,
    block: Vec<u64>,
    success: Vec<u64>,
    exception: Vec<u64>,
    rt_us: Vec<Option<u64>>,
}

impl KeyStats {
    fn new(
        key: Option<String>,
        kind: &'static str,
        snapshot: Snapshot,
        nodes: &[MetricNode],
    ) -> Self {
        let mut history = History::default();
        let mut traffic = snapshot.pass.saturating_add(snapshot.block);
        for node in nodes {
            traffic = traffic.saturating_add(node.pass.saturating_add(node.block));
            history.t.push(node.timestamp_ms);
            history.pass.push(node.pass);
            history.block.push(node.block);
            history.success.push(node.success);
            history.exception.push(node.exception);
            history.rt_us.push(
                node.rt
                    .map(|rt| u64::try_from(rt.as_micros()).unwrap_or(u64::MAX)),
            );
        }
        KeyStats {
            key,
            kind,
            traffic,
            snapshot,
            history,
        }
    }
}

/// Every key's snapshot and history, the most traffic first.
pub(super) fn json<K>(handle: &StatsHandle<K>, editable: bool) -> Vec<u8>
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let now = handle.now_ms();
    let mut keys = Vec::new();
    handle.for_each_with_history(now, |key, snapshot, history| {
        let (label, kind) = match key.label() {
            Some(label) => (Some(label.into_owned()), "key"),
            None => (None, "missing"),
        };
        keys.push(KeyStats::new(label, kind, snapshot, &history));
    });
    if let Some((snapshot, history)) = handle.overflow_with_history(now) {
        keys.push(KeyStats::new(None, "overflow", snapshot, &history));
    }
    // Most traffic first; equal traffic by key, so rows do not jump about.
    keys.sort_unstable_by(|a, b| b.traffic.cmp(&a.traffic).then_with(|| a.key.cmp(&b.key)));
    let stats = Stats {
        now_ms: now,
        window_ms: handle.window_ms(),
        limits_editable: editable,
        total: handle.total(),
        keys,
    };
    // Serializing plain numbers and strings into memory cannot fail.
    serde_json::to_vec(&stats).unwrap_or_default()
}
