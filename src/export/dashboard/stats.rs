//! The JSON of `GET /stats`.

use std::hash::Hash;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::export::KeyLabel;
use crate::stat::MetricNode;
use crate::{Snapshot, StatsHandle};

#[derive(Serialize)]
struct Stats<'a> {
    now_ms: u64,
    window_ms: u64,
    limits_editable: bool,
    total: Snapshot,
    keys: Vec<KeyStats<'a>>,
}

#[derive(Serialize)]
struct KeyStats<'a> {
    key: Option<&'a str>,
    kind: &'static str,
    traffic: u64,
    snapshot: Snapshot,
    history: Option<Columns>,
}

/// A key's history, one column per figure, written straight from the
/// `MetricNode`s (no column is collected first).
struct Columns(Vec<MetricNode>);

impl Serialize for Columns {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// One column, serialized as a sequence as it is read.
        struct Column<'a, T, F: Fn(&MetricNode) -> T>(&'a [MetricNode], F);
        impl<T: Serialize, F: Fn(&MetricNode) -> T> Serialize for Column<'_, T, F> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(&self.1))
            }
        }
        let nodes = &self.0[..];
        let mut map = serializer.serialize_map(Some(6))?;
        map.serialize_entry("t", &Column(nodes, |n| n.timestamp_ms))?;
        map.serialize_entry("pass", &Column(nodes, |n| n.pass))?;
        map.serialize_entry("block", &Column(nodes, |n| n.block))?;
        map.serialize_entry("success", &Column(nodes, |n| n.success))?;
        map.serialize_entry("exception", &Column(nodes, |n| n.exception))?;
        map.serialize_entry(
            "rt_us",
            &Column(nodes, |n| {
                n.rt.map(|rt| u64::try_from(rt.as_micros()).unwrap_or(u64::MAX))
            }),
        )?;
        map.end()
    }
}

/// Every key's snapshot, the busiest first, with the history of the first
/// `with_history` keys (all by default).
pub(super) fn json<K>(handle: &StatsHandle<K>, editable: bool, with_history: usize) -> Vec<u8>
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let now = handle.now_ms();
    let mut rows = handle.rows(now);
    rows.extend(handle.overflow_row(now));
    // The total from the rows just read: one window read per entry.
    let total = crate::handle::rows_total(&rows);
    let mut listed: Vec<_> = rows
        .into_iter()
        .map(|row| {
            let (label, kind) = match &row.key {
                Some(key) => match key.label() {
                    Some(label) => (Some(label.into_owned()), "key"),
                    None => (None, "missing"),
                },
                None => (None, "overflow"),
            };
            let traffic = row.snapshot.pass.saturating_add(row.snapshot.block);
            (traffic, label, kind, row)
        })
        .collect();
    // Busiest first; equal traffic by key, so rows do not jump about.
    listed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let keys = listed
        .iter()
        .enumerate()
        .map(|(i, (traffic, label, kind, row))| KeyStats {
            key: label.as_deref(),
            kind,
            traffic: *traffic,
            snapshot: row.snapshot,
            history: (i < with_history).then(|| Columns(row.history(now))),
        })
        .collect();
    let stats = Stats {
        now_ms: now,
        window_ms: handle.window_ms(),
        limits_editable: editable,
        total,
        keys,
    };
    // Serializing plain numbers and strings into memory cannot fail.
    serde_json::to_vec(&stats).unwrap_or_default()
}

/// The `history` query parameter: how many keys carry their history
/// (`None`: all; `Err`: not a whole number).
pub(super) fn history_param(query: Option<&str>) -> Result<Option<usize>, ()> {
    let Some(query) = query else {
        return Ok(None);
    };
    match query
        .split('&')
        .find_map(|pair| pair.strip_prefix("history="))
    {
        Some(n) => n.parse().map(Some).map_err(|_| ()),
        None => Ok(None),
    }
}
