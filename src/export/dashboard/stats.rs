//! The JSON of `GET /stats`.

use std::hash::Hash;
use std::ops::Range;
use std::time::Duration;

use super::json::Json;
use crate::export::KeyLabel;
use crate::handle::KeyRow;
use crate::handle::{Snapshot, StatsHandle};
use crate::stat::MetricNode;

/// Bytes a key's history takes at most, about: 60 seconds of a 13-digit
/// timestamp and five small numbers.
const HISTORY_BYTES: usize = 60 * 40 + 64;

/// Every key's snapshot, the busiest first, with the history of the first
/// `with_history` keys (all by default), in the layout the module docs
/// describe.
pub(super) fn json<K>(handle: &StatsHandle<K>, editable: bool, with_history: usize) -> Vec<u8>
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let now = handle.now_ms();
    // Every label copied once into one buffer as its entry is read: sorting
    // compares labels many times, and comparing them where they lie (one
    // allocation per key, all over the heap) would cost a cache miss per
    // comparison. A row's key is its label's place in the buffer, `None`
    // for the missing key.
    let mut labels = String::new();
    let mut rows = handle.rows(now, |key| {
        key.label().map(|label| {
            let from = labels.len();
            labels.push_str(&label);
            from..labels.len()
        })
    });
    rows.extend(handle.overflow_row(now));
    // The total from the rows just read: one window read per entry.
    let total = crate::handle::rows_total(&rows);
    let order = order(&rows, &labels);
    let with_history = with_history.min(order.len());
    let label_of = |row: &KeyRow<Label>| label(row, &labels);

    let mut out = Json::with_capacity(
        512 + labels.len() + order.len() * (4 + 9 * 4) + with_history * HISTORY_BYTES,
    );
    out.raw("{\"now_ms\":");
    out.u64(now);
    out.raw(",\"window_ms\":");
    out.u64(handle.window_ms());
    out.raw(",\"limits_editable\":");
    out.bool(editable);
    out.raw(",\"total\":");
    snapshot(&mut out, &total);

    out.raw(",\"keys\":{\"key\":");
    out.array(&order, |out, &i| match label_of(&rows[i]) {
        Some(label) => out.str(label),
        None => out.raw("null"),
    });
    let missing = order
        .iter()
        .position(|&i| matches!(rows[i].key, Some(None)));
    let overflow = order.iter().position(|&i| rows[i].key.is_none());
    out.raw(",\"missing\":");
    out.opt_u64(missing.map(|i| i as u64));
    out.raw(",\"overflow\":");
    out.opt_u64(overflow.map(|i| i as u64));
    // One column per figure.
    for (name, figure) in FIGURES {
        out.raw(",\"");
        out.raw(name);
        out.raw("\":");
        out.array(&order, |out, &i| out.opt_u64(figure(&rows[i].snapshot)));
    }
    out.raw(",\"history\":");
    out.array(&order[..with_history], |out, &i| {
        history(&mut *out, &rows[i].history(now));
    });
    out.raw("}}");
    out.into_bytes()
}

/// A row's key: its label's place in the label buffer, `None` for the
/// missing key.
type Label = Option<Range<usize>>;

/// `row`'s label, if it has one (not the missing key nor the overflow).
fn label<'a>(row: &KeyRow<Label>, labels: &'a str) -> Option<&'a str> {
    row.key.clone().flatten().map(|range| &labels[range])
}

/// The indexes of `rows` in listing order: busiest first (passes and
/// blocks in the current window); equal traffic by label (the missing key
/// and the overflow entry first), so rows do not jump about between reads.
fn order(rows: &[KeyRow<Label>], labels: &str) -> Vec<usize> {
    /// What orders a row: the labels' first bytes decide most comparisons
    /// without reading the labels.
    struct Listed {
        traffic: u64,
        labelled: bool,
        prefix: u128,
        row: usize,
    }
    let mut listed: Vec<Listed> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let label = label(row, labels);
            Listed {
                traffic: row.snapshot.pass.saturating_add(row.snapshot.block),
                labelled: label.is_some(),
                prefix: label.map_or(0, prefix),
                row: i,
            }
        })
        .collect();
    listed.sort_unstable_by(|a, b| {
        b.traffic
            .cmp(&a.traffic)
            .then(a.labelled.cmp(&b.labelled))
            .then(a.prefix.cmp(&b.prefix))
            .then_with(|| label(&rows[a.row], labels).cmp(&label(&rows[b.row], labels)))
    });
    listed.into_iter().map(|l| l.row).collect()
}

/// `label`'s first 16 bytes as a number, zeros after its end: when two
/// labels' prefixes differ, they order as the labels do (a label that ends
/// first is padded with the smallest byte); only equal prefixes need the
/// labels compared.
fn prefix(label: &str) -> u128 {
    let mut bytes = [0u8; 16];
    let head = &label.as_bytes()[..label.len().min(16)];
    bytes[..head.len()].copy_from_slice(head);
    u128::from_be_bytes(bytes)
}

/// One figure read from a `Snapshot`.
type Figure = fn(&Snapshot) -> Option<u64>;

/// The figures of a `Snapshot` the JSON carries, by name, in their order:
/// the total as one object, the keys as one column each. `None` is `null`.
const FIGURES: [(&str, Figure); 9] = [
    ("pass", |s| Some(s.pass)),
    ("block", |s| Some(s.block)),
    ("success", |s| Some(s.success)),
    ("exception", |s| Some(s.exception)),
    ("concurrency", |s| Some(s.concurrency)),
    ("waiting", |s| Some(s.waiting)),
    ("limit", |s| Some(s.limit)),
    ("avg_rt_us", |s| s.avg_rt.map(micros)),
    ("min_rt_us", |s| s.min_rt.map(micros)),
];

/// A snapshot as one object, every figure named.
fn snapshot(out: &mut Json, s: &Snapshot) {
    for (i, (name, figure)) in FIGURES.into_iter().enumerate() {
        out.raw(if i == 0 { "{\"" } else { ",\"" });
        out.raw(name);
        out.raw("\":");
        out.opt_u64(figure(s));
    }
    out.raw("}");
}

/// A key's history, one column per figure.
fn history(out: &mut Json, nodes: &[MetricNode]) {
    out.raw("{\"t\":");
    out.array(nodes, |out, n| out.u64(n.timestamp_ms));
    out.raw(",\"pass\":");
    out.array(nodes, |out, n| out.u64(n.pass));
    out.raw(",\"block\":");
    out.array(nodes, |out, n| out.u64(n.block));
    out.raw(",\"success\":");
    out.array(nodes, |out, n| out.u64(n.success));
    out.raw(",\"exception\":");
    out.array(nodes, |out, n| out.u64(n.exception));
    out.raw(",\"rt_us\":");
    out.array(nodes, |out, n| out.opt_u64(n.rt.map(micros)));
    out.raw("}");
}

/// Whole microseconds, as `Snapshot`'s serde form writes them.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
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

#[cfg(test)]
mod tests {
    use super::prefix;

    #[test]
    fn prefixes_order_as_their_labels() {
        let labels = [
            "",
            "\u{0}",
            "\u{0}\u{0}",
            "a",
            "a\u{0}",
            "a\u{1}",
            "ab",
            "b",
            "é",
            "0123456789abcdef",
            "0123456789abcdef\u{0}",
            "0123456789abcdefX",
            "0123456789abcdeg",
            "\u{ff}",
        ];
        for a in labels {
            for b in labels {
                if prefix(a) != prefix(b) {
                    assert_eq!(prefix(a) < prefix(b), a < b, "{a:?} against {b:?}");
                }
            }
        }
        // Equal prefixes where the labels differ: the caller compares them.
        assert_eq!(prefix("a"), prefix("a\u{0}"));
        assert_eq!(prefix("0123456789abcdef"), prefix("0123456789abcdefX"));
    }
}
