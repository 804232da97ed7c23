//! The JSON of `GET /stats`.

use std::borrow::Cow;
use std::hash::Hash;
use std::ops::Range;
use std::time::Duration;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::export::KeyLabel;
use crate::handle::KeyRow;
use crate::handle::{Snapshot, StatsHandle};
use crate::stat::MetricNode;

/// Bytes a key's history takes at most, about: 60 seconds of a 13-digit
/// timestamp and five small numbers.
const HISTORY_BYTES: usize = 60 * 40 + 64;

/// Keys in the page's "Top blocked clients" table: `top_blocked` of the
/// JSON.
pub(super) const TOP_BLOCKED: usize = 20;

/// Every key's row read once, in listing order: what each reader's JSON is
/// cut from. Built at most once per refresh period (see `super::Board`),
/// off the runtime's workers.
pub(super) struct Table {
    now: u64,
    window_ms: u64,
    total: Snapshot,
    /// Every label, back to back; a row's key is its place here.
    labels: String,
    /// `labels` with ASCII letters lowered, at the same places: what a
    /// search reads.
    lowered: String,
    /// The rows, the busiest first (see [`order`]).
    rows: Vec<KeyRow<Label>>,
    /// The layer's Redis store status, if it has a store.
    store: Option<Store>,
    /// The layer's rules state: documents applied, the last error.
    rules: RulesView,
    /// `StatsHandle::top_blocked(TOP_BLOCKED)`, each key as its label
    /// (`None`: the missing key).
    blocked: Vec<(Option<String>, u64)>,
    /// The layer's system rule, if it has one.
    system: Option<crate::system::SystemStatus>,
}

/// What one reader asks of the table: `?search=` and `?history=`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(super) struct View {
    /// Only keys whose label contains this (ASCII case ignored).
    search: Option<String>,
    /// How many of the listed keys carry their history (`None`: all).
    history: Option<usize>,
}

/// The longest search accepted, in bytes: longer than any label worth
/// typing, short enough that a search costs no more than a read.
pub(super) const MAX_SEARCH: usize = 256;

/// Reads every key of `handle` into a [`Table`].
pub(super) fn build<K>(handle: &StatsHandle<K>) -> Table
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
    let blocked = handle
        .top_blocked(TOP_BLOCKED)
        .into_iter()
        .map(|(key, blocks)| (key.label().map(Cow::into_owned), blocks))
        .collect();
    let mut slots: Vec<Option<KeyRow<Label>>> = rows.into_iter().map(Some).collect();
    let rows = order.into_iter().filter_map(|i| slots[i].take()).collect();
    Table {
        now,
        window_ms: handle.window_ms(),
        total,
        lowered: labels.to_ascii_lowercase(),
        labels,
        rows,
        store: store_status(handle),
        rules: RulesView::of(handle.rules_status()),
        blocked,
        system: handle.system(),
    }
}

#[cfg(feature = "redis")]
fn store_status<K>(handle: &StatsHandle<K>) -> Option<Store>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    handle.store_status()
}

#[cfg(not(feature = "redis"))]
fn store_status<K>(_: &StatsHandle<K>) -> Option<Store> {
    None
}

/// The first `top` keys of `table` that `view` selects, the busiest first,
/// in the layout the module docs describe, serialized straight into one
/// buffer sized for it. The error is `serde_json`'s; nothing written here
/// makes one (numbers, strings, `null`, arrays and objects with string
/// keys), but the caller answers it rather than assume so.
pub(super) fn json(
    table: &Table,
    editable: bool,
    top: usize,
    view: &View,
) -> Result<Vec<u8>, serde_json::Error> {
    let needle = view.search.as_deref().map(str::to_ascii_lowercase);
    let selected = |row: &KeyRow<Label>| match (&needle, &row.key) {
        (None, _) => true,
        (Some(needle), Some(Some(range))) => table.lowered[range.clone()].contains(needle.as_str()),
        // The missing key and the overflow entry have no label to match.
        (Some(_), _) => false,
    };
    let mut matched = 0usize;
    let mut listed: Vec<&KeyRow<Label>> = Vec::with_capacity(top.min(table.rows.len()));
    for row in table.rows.iter().filter(|row| selected(row)) {
        matched += 1;
        if listed.len() < top {
            listed.push(row);
        }
    }
    let with_history = view.history.unwrap_or(usize::MAX).min(listed.len());
    let label_bytes: usize = listed
        .iter()
        .map(|row| label(row, &table.labels).map_or(4, str::len))
        .chain(
            table
                .blocked
                .iter()
                .map(|(key, _)| key.as_ref().map_or(4, String::len) + 24),
        )
        .sum();
    let document = Document {
        now_ms: table.now,
        window_ms: table.window_ms,
        limits_editable: editable,
        keys_total: table.rows.len(),
        matched,
        top,
        search: view.search.as_deref(),
        store: table.store.as_ref(),
        total: &table.total,
        keys: Keys {
            now: table.now,
            labels: &table.labels,
            listed: &listed,
            with_history,
        },
        top_blocked: Blocked(&table.blocked),
        rules: &table.rules,
        system: table.system.as_ref().map(SystemJson::of),
    };
    let mut out = Vec::with_capacity(
        1024 + label_bytes + listed.len() * (4 + 10 * 4) + with_history * HISTORY_BYTES,
    );
    serde_json::to_writer(&mut out, &document)?;
    Ok(out)
}

/// The JSON of `GET /stats`, field by field in the order it is written.
#[derive(Serialize)]
struct Document<'a> {
    now_ms: u64,
    window_ms: u64,
    limits_editable: bool,
    keys_total: usize,
    matched: usize,
    top: usize,
    search: Option<&'a str>,
    store: Option<&'a Store>,
    /// `Snapshot`'s own serde form: every figure named, in the order of
    /// [`FIGURES`].
    total: &'a Snapshot,
    keys: Keys<'a>,
    top_blocked: Blocked<'a>,
    rules: &'a RulesView,
    /// Only for a layer with a system rule: absent otherwise, so a layer
    /// without one writes what it wrote before the rule existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<SystemJson>,
}

/// The system rule's state in `GET /stats`: the CPU use and its threshold,
/// whether BBR runs, the layer's requests in flight against BBR's estimate,
/// and the refusals per check (`SystemCheck::as_str` names) since the layer
/// was built.
#[derive(Serialize)]
struct SystemJson {
    cpu: f64,
    cpu_threshold: f64,
    bbr_active: bool,
    in_flight: u64,
    max_in_flight: u64,
    refusals: std::collections::BTreeMap<&'static str, u64>,
}

impl SystemJson {
    fn of(status: &crate::system::SystemStatus) -> SystemJson {
        SystemJson {
            cpu: status.cpu,
            cpu_threshold: status.cpu_threshold,
            bbr_active: status.bbr_active,
            in_flight: status.in_flight,
            max_in_flight: status.max_in_flight,
            refusals: crate::system::SystemCheck::ALL
                .into_iter()
                .map(|check| (check.as_str(), status.refusals_of(check)))
                .collect(),
        }
    }
}

/// `StatsHandle::rules_status` as the JSON writes it: the error as its
/// message.
#[derive(Serialize)]
struct RulesView {
    version: u64,
    last_error: Option<String>,
}

impl RulesView {
    fn of(status: crate::rules::RulesStatus) -> Self {
        RulesView {
            version: status.version,
            last_error: status.last_error.map(|err| err.to_string()),
        }
    }
}

/// The layer's store status: `StoreStatus` with a Redis store.
#[cfg(feature = "redis")]
type Store = crate::store::StoreStatus;

/// No store without feature `redis`: `store` is always `null`.
#[cfg(not(feature = "redis"))]
type Store = ();

/// The listed keys as columns (see the module docs): written column by
/// column straight from the rows, no column is collected first.
struct Keys<'a> {
    now: u64,
    labels: &'a str,
    listed: &'a [&'a KeyRow<Label>],
    /// How many of the listed keys carry their history.
    with_history: usize,
}

impl Serialize for Keys<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let rows = self.listed;
        let index = |of: fn(&KeyRow<Label>) -> bool| rows.iter().position(|row| of(row));
        let mut keys = serializer.serialize_struct("Keys", 5 + FIGURES.len())?;
        keys.serialize_field(
            "key",
            &Column(|| rows.iter().map(|row| label(row, self.labels))),
        )?;
        keys.serialize_field("missing", &index(|row| matches!(row.key, Some(None))))?;
        keys.serialize_field("overflow", &index(|row| row.key.is_none()))?;
        // One column per figure.
        for (name, figure) in FIGURES {
            keys.serialize_field(
                name,
                &Column(|| rows.iter().map(|row| figure(&row.snapshot))),
            )?;
        }
        keys.serialize_field(
            "breaker",
            &Column(|| rows.iter().map(|row| row.breaker(self.now))),
        )?;
        keys.serialize_field(
            "history",
            &Column(|| {
                rows[..self.with_history]
                    .iter()
                    .map(|row| History(row.history(self.now)))
            }),
        )?;
        keys.end()
    }
}

/// The keys with the most blocks over the last minute, most first, as two
/// columns: `key` (the label, `null` for the missing key) and `block`.
struct Blocked<'a>(&'a [(Option<String>, u64)]);

impl Serialize for Blocked<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let rows = self.0;
        let mut blocked = serializer.serialize_struct("Blocked", 2)?;
        blocked.serialize_field("key", &Column(|| rows.iter().map(|(key, _)| key)))?;
        blocked.serialize_field("block", &Column(|| rows.iter().map(|(_, n)| n)))?;
        blocked.end()
    }
}

/// A JSON array of what the iterator `F` makes yields, written as it is
/// read.
struct Column<F>(F);

impl<F, I> Serialize for Column<F>
where
    F: Fn() -> I,
    I: IntoIterator,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq((self.0)())
    }
}

/// A key's history, one column per figure.
struct History(Vec<MetricNode>);

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let nodes = &self.0;
        let column = |figure: fn(&MetricNode) -> u64| Column(move || nodes.iter().map(figure));
        let mut history = serializer.serialize_struct("History", 6)?;
        history.serialize_field("t", &column(|n| n.timestamp_ms))?;
        history.serialize_field("pass", &column(|n| n.pass))?;
        history.serialize_field("block", &column(|n| n.block))?;
        history.serialize_field("success", &column(|n| n.success))?;
        history.serialize_field("exception", &column(|n| n.exception))?;
        history.serialize_field("rt_us", &Column(|| nodes.iter().map(|n| n.rt.map(micros))))?;
        history.end()
    }
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

/// The figures of a `Snapshot` the JSON carries, by name, in their order
/// (the order of `Snapshot`'s serde form, which writes the total): the
/// keys as one column each. `None` is `null`.
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

/// Whole microseconds, as `Snapshot`'s serde form writes them.
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Reads `?search=` (percent-encoded, `+` for a space, at most
/// [`MAX_SEARCH`] bytes; empty is no search) and `?history=` (a whole
/// number of keys). Other parameters are ignored.
pub(super) fn view(query: Option<&str>) -> Result<View, String> {
    let mut view = View::default();
    for pair in query.unwrap_or_default().split('&') {
        if let Some(n) = pair.strip_prefix("history=") {
            let n = n
                .parse()
                .map_err(|_| "history: a whole number of keys".to_owned())?;
            view.history = Some(n);
        } else if let Some(text) = pair.strip_prefix("search=") {
            let text =
                percent_decoded(text).ok_or_else(|| "search: percent-encoded UTF-8".to_owned())?;
            if text.len() > MAX_SEARCH {
                return Err(format!("search: at most {MAX_SEARCH} bytes"));
            }
            view.search = Some(text).filter(|t| !t.is_empty());
        }
    }
    Ok(view)
}

/// `text` from a query string: `%XX` bytes and `+` for a space; `None` for
/// a bad escape or bytes that are not UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = rest.get(..2)?;
                if !hex.iter().all(u8::is_ascii_hexdigit) {
                    return None;
                }
                bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                rest = &rest[2..];
            }
            _ => bytes.push(b),
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use http::StatusCode;
    use tower::ServiceExt;

    use super::{build, json, percent_decoded, prefix, view, View};
    use crate::breaker::Breaker;
    use crate::clock::ManualClock;
    use crate::SlidingWindowLayer;

    /// Labels that need escaping or are long: control characters (each
    /// with its short escape or `\u00XX`), quotes and backslashes, what a
    /// lossy read of invalid bytes leaves, characters JSON may carry as
    /// they are, and a label longer than any buffer estimate.
    fn labels() -> Vec<String> {
        let mut controls: String = (0u8..0x20).map(char::from).collect();
        controls.push('\u{7f}');
        vec![
            "/plain".to_owned(),
            controls,
            "q\"uo\\te\"".to_owned(),
            "t\u{fffd}\u{fffd}\"\\".to_owned(),
            "é 😀 \u{2028}\u{2029} </script>".to_owned(),
            format!("/long/{}\n{}", "x".repeat(3000), "\u{1}".repeat(40)),
            "Case/Search".to_owned(),
        ]
    }

    /// Every view [`json`] is asked for in [`the_json_is_the_recorded_json`]:
    /// (editable, top, query).
    const VIEWS: [(bool, usize, &str); 6] = [
        (false, 100, ""),
        (true, 3, ""),
        (false, 100, "history=2"),
        (false, 100, "search=case"),
        (false, 2, "search=%22&history=1"),
        (false, 100, "search=%09%01%5C%22no+match"),
    ];

    /// The JSON of every view in [`VIEWS`], one document a line, for a
    /// layer on a manual clock: the labels of [`labels`] (one of them
    /// failing until its breaker opens), the missing key, the overflow
    /// entry, response times, five seconds of history and traffic in the
    /// current window.
    async fn documents() -> String {
        let clock = ManualClock::new(1_732_345_670_000);
        let labels = labels();
        let layer = SlidingWindowLayer::qps(3)
            .max_keys(labels.len() + 1)
            .key(|parts: &http::request::Parts| {
                let i: usize = parts.headers.get("x-k")?.to_str().ok()?.parse().ok()?;
                Some(
                    self::labels()
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| format!("/extra/{i}")),
                )
            })
            .breaker(Breaker::error_count(2).min_requests(2))
            .clock(clock.clone());
        let stats = layer.handle();
        let slow = clock.clone();
        let app = Router::new()
            .route(
                "/fail",
                get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
            )
            .route(
                "/slow",
                get(move || {
                    slow.advance(Duration::from_millis(7));
                    async { "ok" }
                }),
            )
            .route("/", get(|| async { "ok" }))
            .layer(layer);
        let send = |path: &str, key: Option<usize>| {
            let mut request = http::Request::get(path);
            if let Some(i) = key {
                request = request.header("x-k", i.to_string());
            }
            app.clone().oneshot(request.body(Body::empty()).unwrap())
        };
        for second in 0..6usize {
            if second > 0 {
                clock.advance(Duration::from_millis(1000 - 7 * 4 * (second as u64 % 2)));
            }
            for (i, _) in labels.iter().enumerate() {
                // Different traffic per key, some over the limit.
                for _ in 0..=(i + second) % 5 {
                    let path = match i {
                        1 => "/slow",
                        3 if second < 2 => "/fail",
                        _ => "/",
                    };
                    send(path, Some(i)).await.unwrap();
                }
            }
            // The missing key, and keys past `max_keys` in the overflow
            // entry, each with traffic of its own.
            for _ in 0..second % 3 + 1 {
                send("/", None).await.unwrap();
            }
            for extra in 0..second + 5 {
                send("/", Some(100 + extra)).await.unwrap();
            }
        }
        let table = build(&stats);
        let mut out = String::new();
        for (editable, top, query) in VIEWS {
            let view: View = view(Some(query)).unwrap();
            let text = String::from_utf8(json(&table, editable, top, &view).unwrap()).unwrap();
            out.push_str(&text);
            out.push('\n');
        }
        out
    }

    /// The JSON is the one recorded from the dashboard's hand-written JSON
    /// writer before `serde_json` replaced it: byte for byte, and as
    /// values, but for `top_blocked` and `rules`, added since as its last
    /// fields.
    #[tokio::test]
    async fn the_json_is_the_recorded_json() {
        let got = documents().await;
        let want = include_str!("stats.recorded.jsonl");
        for (got, want) in got.lines().zip(want.lines()) {
            let (got, rules) = got.rsplit_once(",\"rules\":").expect("rules, last");
            assert_eq!(rules, r#"{"version":0,"last_error":null}}"#);
            let got = format!("{got}}}");
            let (got, top_blocked) = got
                .rsplit_once(",\"top_blocked\":")
                .expect("top_blocked, last");
            let top_blocked: serde_json::Value =
                serde_json::from_str(top_blocked.strip_suffix('}').unwrap()).unwrap();
            // The labels of [`labels`] over the limit: most blocks first.
            let blocks = top_blocked["block"].as_array().unwrap();
            assert!(!blocks.is_empty(), "{top_blocked}");
            assert!(blocks.windows(2).all(|w| w[0].as_u64() >= w[1].as_u64()));
            assert_eq!(top_blocked["key"].as_array().unwrap().len(), blocks.len());
            let got = format!("{got}}}");
            let value = |text: &str| -> serde_json::Value {
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
            };
            assert_eq!(value(&got), value(want));
            assert_eq!(got, want);
        }
        assert_eq!(got.lines().count(), VIEWS.len());
        assert_eq!(want.lines().count(), VIEWS.len());
    }

    #[test]
    fn search_and_history_are_read_from_the_query() {
        assert_eq!(view(None).unwrap(), Default::default());
        let v = view(Some("history=3&search=%2Fapi%2Fb+x&x=1")).unwrap();
        assert_eq!(v.search.as_deref(), Some("/api/b x"));
        assert_eq!(v.history, Some(3));
        assert_eq!(view(Some("search=")).unwrap().search, None);
        assert_eq!(percent_decoded("%C3%A9").as_deref(), Some("é"));
        for bad in [
            "search=%",
            "search=%4",
            "search=%zz",
            "search=%FF",
            "search=%+1",
            "history=-1",
            "history=x",
        ] {
            assert!(view(Some(bad)).is_err(), "{bad}");
        }
        let long = format!("search={}", "a".repeat(super::MAX_SEARCH + 1));
        assert!(view(Some(&long)).is_err());
    }

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
