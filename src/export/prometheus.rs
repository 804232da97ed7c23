//! [`PrometheusCollector`]: the statistics as a `prometheus-client`
//! collector, read at scrape time.

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
    MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;

use super::KeyLabel;
use crate::handle::{Lifetime, StatsHandle};
use crate::stat::{Counts, RtCounts, RtHistogram, DEFAULT_RT_BUCKETS};
use crate::system::{SystemCheck, SystemStatus};

/// The layer's statistics for a [`prometheus_client`] registry, read when
/// the registry is encoded (at scrape time).
///
/// Made by [`StatsHandle::collector`]; register it with
/// [`Registry::register_collector`](prometheus_client::registry::Registry::register_collector).
/// Counters and gauges cost a request nothing: they are read from the
/// statistics the layer keeps anyway, when a scrape asks. The response-time
/// histogram is the one figure a request records for the collector (see
/// below).
///
/// # Metrics
///
/// | name | type | meaning |
/// | --- | --- | --- |
/// | `sliding_window_pass_total` | counter | requests admitted |
/// | `sliding_window_block_total` | counter | requests refused (429) |
/// | `sliding_window_success_total` | counter | admitted requests that completed (failed ones included) |
/// | `sliding_window_exception_total` | counter | completed requests classified as failures |
/// | `sliding_window_response_seconds_total` | counter | the response times of completed requests, summed (divided by `success_total`: the average) |
/// | `sliding_window_response_time_seconds` | histogram, one per layer | time from admission to response, in buckets |
/// | `sliding_window_in_flight` | gauge | requests in flight now |
/// | `sliding_window_limit` | gauge | the limit per window now |
/// | `sliding_window_breakers_not_closed` | gauge | the key's circuit breakers that are open or half-open now (0 without breakers) |
///
/// A layer with a shared store (feature `redis`) adds one series each,
/// with only the `layer` label (see
/// [`StoreStatus`](crate::store::StoreStatus)):
/// `sliding_window_store_round_trips_total`,
/// `sliding_window_store_admitted_total` (the ratio of their rates is the
/// round trips per admission), `sliding_window_store_leased_total`,
/// `sliding_window_store_lease_spent_total`,
/// `sliding_window_store_stranded_total`,
/// `sliding_window_store_answered_locally_total`,
/// `sliding_window_store_failures_total` (counters) and
/// `sliding_window_store_fallback` (gauge: 1 while the failure policy
/// decides).
///
/// # The response-time histogram
///
/// The keys' windows keep response times as sums, which give averages
/// (`sliding_window_response_seconds_total`, per key) but no quantiles. So
/// the collector has the layer count every completed request into one
/// histogram with fixed bounds, from the first collector made for the
/// layer on: two relaxed atomic adds per completed request, on counters
/// the whole layer shares (one histogram per layer, not per key: a
/// histogram per key would multiply the series by the buckets). Its bounds
/// are, in seconds, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
/// 0.5, 1, 2.5, 5 and 10, then `+Inf`; choose others with
/// [`StatsHandle::collector_with_rt_buckets`]. The histogram carries no
/// `key` or `entry` label, only `layer` when the collector has a name.
///
/// # Labels
///
/// Per key (the default), every sample but the histogram's has two labels:
///
/// - `key`: the key as text ([`KeyLabel`]), empty when `entry` is not `key`;
/// - `entry`: `key` for a key with a series of its own; `missing` for the
///   `None` key of an `Option` key type (a request without the header or
///   the address); `overflow` for the entry shared by keys that found no
///   room; `other` for every key without a series of its own, summed
///   (evicted keys included).
///
/// A key has a series of its own if it has a limit of its own (a rule or
/// [`StatsHandle::set_limit`]) or is among the
/// [`top_keys`](Self::top_keys) busiest (10 by default; traffic is passes
/// and blocks counted since the first collector was made). So a metric has
/// at most `top_keys` + 3 series plus one per key with its own limit,
/// whatever the number of clients: 20 000 client addresses make at most 13
/// series per metric, not 20 000. The gauges of `other` are those of the
/// keys it sums that hold an entry now, summed. With [`totals_only`](Self::totals_only) there
/// are no labels: one series per metric, every entry summed (the limit
/// gauge is then the sum of the limits, as in [`StatsHandle::total`]).
///
/// # Who is being limited
///
/// The collector adds no series per blocked client: the clients a limiter
/// refuses are exactly the ones that vary (addresses, tokens), and a
/// series each would grow Prometheus's memory with every new client. The
/// blocks of keys without a series of their own are in `entry="other"`.
/// To name the clients refused most, read
/// [`StatsHandle::top_blocked`] where the application answers operators
/// (an admin route, a log line, the dashboard's "Top blocked clients"
/// table): the keys with the most blocks over the last minute, from a
/// summary of bounded size.
///
/// ```
/// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
///
/// let layer = SlidingWindowLayer::qps(10).key(PeerIpKey);
/// let stats = layer.handle();
/// // In an admin handler, next to the scrape endpoint:
/// for (client, blocks) in stats.top_blocked(10) {
///     let client = client.map_or_else(|| "no address".to_owned(), |ip| ip.to_string());
///     println!("{client}: {blocks} refused in the last minute");
/// }
/// ```
///
/// # Several layers in one scrape
///
/// A registry must not hold two collectors of this crate: each would write
/// every metric's `# HELP` and `# TYPE` again, which `promtool check
/// metrics` refuses and Prometheus reads as one family with the layers'
/// keys mixed. Name each layer's collector with [`layer`](Self::layer),
/// [`join`](Self::join) them into one and register that one: every sample
/// then carries a `layer` label.
///
/// ```
/// use prometheus_client::encoding::text::encode;
/// use prometheus_client::registry::Registry;
/// use tower_sliding_window::{PathKey, PeerIpKey, SlidingWindowLayer};
///
/// let api = SlidingWindowLayer::qps(100).key(PathKey);
/// let clients = SlidingWindowLayer::qps(10).key(PeerIpKey);
/// let collector = api
///     .handle()
///     .collector()
///     .layer("api")
///     .join(clients.handle().collector().layer("clients"));
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(collector));
///
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert_eq!(text.matches("# TYPE sliding_window_pass counter").count(), 1);
/// assert!(text.contains(r#"sliding_window_limit{layer="clients",key="",entry="overflow"} 10"#));
/// ```
///
/// # Counters that never go backwards
///
/// The layer keeps only a one-second and a one-minute window per key, so
/// the collector reads lifetime totals that the statistics keep beside
/// them once a collector exists: when the minute window takes in a
/// finished bucket (once per bucket rotation, never per request) the
/// bucket is also added to the key's totals, and a read adds the buckets
/// not taken in yet. Counting starts when the first collector is made
/// (in the process: the statistics have no setting for it), so events
/// from before it may be missing. The totals live in a table beside the
/// statistics (about 64 bytes per key, freed with the key's entry), so a
/// key's statistics take no more memory with a collector than without.
/// When an idle key is evicted, its totals are added to one store-wide
/// sum, which the `other` series carries. Hence:
///
/// - a series with `entry` `key`, `missing` or `overflow` only grows while
///   its key holds an entry and keeps its series;
/// - the `other` series only grows: a key that gets a series of its own
///   leaves what it counted before in `other`, and a key that loses its
///   series (evicted, or no longer among the busiest) brings only what it
///   counts from then on. The collector remembers, for the keys with a
///   series, where their series started (a few words per such key);
/// - a key that is evicted and comes back starts a new series from zero:
///   Prometheus reads that as a counter reset, and `rate()` and
///   `increase()` stay right. Summed over all series of a metric,
///   `increase()` is the layer's increase; every series of
///   [`totals_only`](Self::totals_only) never decreases between scrapes.
///
/// A pass is counted when its request is admitted, including the passes
/// the `prioritized` option lets borrow from a future bucket, which count
/// when that bucket opens.
///
/// ```
/// use prometheus_client::encoding::text::encode;
/// use prometheus_client::registry::Registry;
/// use tower_sliding_window::{PathKey, SlidingWindowLayer};
///
/// let layer = SlidingWindowLayer::qps(100).key(PathKey);
/// let mut registry = Registry::default();
/// registry.register_collector(Box::new(layer.handle().collector()));
///
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert!(text.contains("# TYPE sliding_window_pass counter"));
/// assert!(text.contains(r#"sliding_window_response_time_seconds_bucket{le="+Inf"} 0"#));
/// ```
pub struct PrometheusCollector {
    /// One per layer; more than one only after [`join`](Self::join), and
    /// then each has a distinct name.
    parts: Vec<Part>,
}

impl fmt::Debug for PrometheusCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for part in &self.parts {
            list.entry(&format_args!(
                "layer {:?}, per key: {}, top keys: {}",
                part.layer, part.per_key, part.top_keys
            ));
        }
        list.finish()
    }
}

/// The default of [`PrometheusCollector::top_keys`].
const DEFAULT_TOP_KEYS: usize = 10;

impl PrometheusCollector {
    /// Exports one series per metric, every entry summed, with no `key` or
    /// `entry` label: for services whose keys are too many, or too
    /// private, for labels. On a joined collector, applies to every layer.
    pub fn totals_only(mut self) -> Self {
        for part in &mut self.parts {
            part.per_key = false;
        }
        self
    }

    /// How many of the busiest keys get a series of their own (10 by
    /// default); every other key without a limit of its own is summed in
    /// the series with `entry="other"`. Busiest means the most passes and
    /// blocks since counting started (see "Counters that never go
    /// backwards"), so the set changes slowly and series come and go
    /// rarely. `0` leaves only keys with their own limit, the missing and
    /// overflow entries and the sum. On a joined collector, applies to
    /// every layer.
    ///
    /// ```
    /// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
    ///
    /// let layer = SlidingWindowLayer::qps(10).key(PeerIpKey);
    /// let collector = layer.handle().collector().top_keys(50);
    /// ```
    pub fn top_keys(mut self, n: usize) -> Self {
        for part in &mut self.parts {
            part.top_keys = n;
        }
        self
    }

    /// Names the layer: every sample gets a `layer` label with this value,
    /// so that collectors of several layers can be [joined](Self::join)
    /// into one.
    ///
    /// # Panics
    ///
    /// If `name` is empty, or if this collector was already joined (name
    /// each collector before joining).
    pub fn layer(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        assert!(
            !name.is_empty(),
            "PrometheusCollector::layer: the name must not be empty"
        );
        assert!(
            self.parts.len() == 1,
            "PrometheusCollector::layer: name each collector before joining them \
             (this one already holds {} layers)",
            self.parts.len()
        );
        self.parts[0].layer = Some(name);
        self
    }

    /// One collector for this layer and `other`'s (and for every layer
    /// either was joined with): each metric is written once, with the
    /// series of every layer told apart by their `layer` label. Register
    /// only the joined collector. See "Several layers in one scrape" above.
    ///
    /// # Panics
    ///
    /// If a layer has no name ([`layer`](Self::layer)), or if two have the
    /// same name: their series could not be told apart.
    pub fn join(mut self, other: PrometheusCollector) -> Self {
        self.parts.extend(other.parts);
        let mut names = HashSet::new();
        for part in &self.parts {
            let Some(name) = &part.layer else {
                panic!(
                    "PrometheusCollector::join: every joined collector needs a name, \
                     given with `.layer(name)` before joining"
                );
            };
            assert!(
                names.insert(name.as_str()),
                "PrometheusCollector::join: two joined collectors are named {name:?}; \
                 each layer needs a name of its own"
            );
        }
        self
    }
}

/// # Exporting
impl<K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// A Prometheus collector reading this handle's statistics at scrape
    /// time (see [`PrometheusCollector`] for the metric and label names).
    /// Its response-time histogram has the default bounds, or those of an
    /// earlier [`collector_with_rt_buckets`](Self::collector_with_rt_buckets)
    /// call on this layer. Feature `prometheus`.
    ///
    /// The collector of a [`compact`](crate::SlidingWindowLayer::compact)
    /// layer exports the layer's lifetime passes and blocks (every key's,
    /// evicted keys' and the overflow's) in one series without a `key`
    /// label, as [`totals_only`](PrometheusCollector::totals_only) does: a
    /// compact key keeps no lifetime counts of its own, and such a layer
    /// has too many keys for a series each. Completions, response times and
    /// the in-flight gauge stay at zero: a compact key records none.
    ///
    /// ```
    /// use prometheus_client::registry::Registry;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(100);
    /// let mut registry = Registry::default();
    /// registry.register_collector(Box::new(layer.handle().collector()));
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    pub fn collector(&self) -> PrometheusCollector {
        let slot = self.rt_slot();
        if slot.get().is_none() {
            let default = RtHistogram::new(&DEFAULT_RT_BUCKETS, "collector")
                .expect("the default bounds are valid");
            // Another collector may have installed its bounds meanwhile:
            // those stay, as if it had come first.
            let _ = slot.set(default);
        }
        self.make_collector()
    }

    /// Like [`collector`](Self::collector), with these upper bounds (in
    /// seconds, increasing) for the response-time histogram; a `+Inf`
    /// bucket is always added. The bounds belong to the layer: every
    /// collector of the layer shares them, and they cannot change once
    /// counting has started. Feature `prometheus`.
    ///
    /// ```
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(100);
    /// let collector = layer
    ///     .handle()
    ///     .collector_with_rt_buckets(&[0.0005, 0.001, 0.002, 0.004, 0.008, 0.016]);
    /// ```
    ///
    /// # Panics
    ///
    /// If `bounds` is empty or longer than 64, if a bound is not a finite
    /// number of seconds of at least a microsecond, if the bounds do not
    /// increase by at least a microsecond each, or if the layer's
    /// histogram already counts with other bounds (set by an earlier
    /// collector of the layer).
    #[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
    pub fn collector_with_rt_buckets(&self, bounds: &[f64]) -> PrometheusCollector {
        let wanted = RtHistogram::new(bounds, "collector_with_rt_buckets")
            .unwrap_or_else(|message| panic!("{message}"));
        let installed = self.rt_slot().get_or_init(|| wanted);
        assert!(
            installed.bounds() == bounds,
            "collector_with_rt_buckets: this layer's response-time histogram already counts \
             with the bounds {:?} (given to an earlier collector of the layer); a layer has \
             one set of bounds",
            installed.bounds()
        );
        self.make_collector()
    }

    fn make_collector(&self) -> PrometheusCollector {
        crate::stat::want_lifetime_totals();
        PrometheusCollector {
            parts: vec![Part {
                layer: None,
                // A compact layer keeps no lifetime totals per key: its
                // collector exports the layer's totals.
                per_key: !self.is_compact(),
                top_keys: DEFAULT_TOP_KEYS,
                source: Box::new(self.clone()),
                other: Mutex::new(OtherState::default()),
            }],
        }
    }
}

/// One layer of a collector.
struct Part {
    /// The `layer` label, if named.
    layer: Option<String>,
    per_key: bool,
    top_keys: usize,
    source: Box<dyn Source>,
    /// What the `other` series has exported (see [`OtherState`]).
    other: Mutex<OtherState>,
}

/// A layer's statistics, whatever its key type.
trait Source: Send + Sync {
    fn read(&self) -> Reading;
}

/// One read of a layer.
struct Reading {
    /// Every evicted key's lifetime totals, summed.
    evicted: Tally,
    /// Every key holding an entry: its label (`None`: the missing key).
    keys: Vec<(Option<String>, Lifetime)>,
    overflow: Lifetime,
    histogram: Option<RtCounts>,
    /// The layer's system rule, if it has one.
    system: Option<SystemStatus>,
    /// The layer's shared store, if it has one.
    #[cfg(feature = "redis")]
    store: Option<crate::store::StoreStatus>,
}

impl<K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static> Source for StatsHandle<K> {
    /// The evicted sum is read first: a key evicted during the visit is
    /// then missing from this read rather than counted twice, so sums
    /// never run ahead of the next read.
    fn read(&self) -> Reading {
        let evicted = Tally::of(&self.evicted_lifetime());
        let mut keys = Vec::new();
        self.for_each_lifetime(|key, lifetime| {
            keys.push((key.label().map(|label| label.into_owned()), lifetime));
        });
        Reading {
            evicted,
            keys,
            overflow: self.overflow_lifetime(),
            // A compact layer records no response times.
            histogram: if self.is_compact() {
                None
            } else {
                self.rt_slot().get().map(RtHistogram::read)
            },
            system: self.system(),
            #[cfg(feature = "redis")]
            store: self.store_status(),
        }
    }
}

/// The counters of a series.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    pass: u64,
    block: u64,
    success: u64,
    exception: u64,
    rt_micros: u64,
}

impl Tally {
    fn of(counts: &Counts) -> Tally {
        Tally {
            pass: counts.pass,
            block: counts.block,
            success: counts.success,
            exception: counts.exception,
            rt_micros: counts.rt_micros,
        }
    }

    fn zip(self, other: Tally, f: impl Fn(u64, u64) -> u64) -> Tally {
        Tally {
            pass: f(self.pass, other.pass),
            block: f(self.block, other.block),
            success: f(self.success, other.success),
            exception: f(self.exception, other.exception),
            rt_micros: f(self.rt_micros, other.rt_micros),
        }
    }

    fn plus(self, other: Tally) -> Tally {
        self.zip(other, u64::saturating_add)
    }

    fn minus(self, other: Tally) -> Tally {
        self.zip(other, u64::saturating_sub)
    }

    fn traffic(&self) -> u64 {
        self.pass.saturating_add(self.block)
    }
}

/// What a layer's `other` series has exported, so that it never goes
/// backwards while keys get and lose series of their own.
///
/// A key with a series of its own exports its whole lifetime total there;
/// `other` keeps, of such a key, only what it counted before its series
/// started (`start`). When the key loses its series, `other` takes it back
/// whole, less what its series showed (`retired` adds that), so nothing
/// is counted in `other` twice and nothing leaves it:
///
/// `other = Σ non-selected keys + Σ start of selected keys + evicted − retired`
///
/// and each term changes between reads only by what keys counted
/// meanwhile. A key evicted while a read visits the table is missing from
/// that read (and counted, as evicted, by the next), so a read can come
/// out lower than the one before: `last` keeps the series from showing it.
#[derive(Default)]
struct OtherState {
    /// Whether a read has been made: keys selected by the first read
    /// start their series at zero (nothing was exported in `other` yet).
    started: bool,
    /// Per key with a series: (what `other` kept of it, its total at the
    /// last read). Keyed by label (`None`: the missing key).
    selected: HashMap<Option<String>, (Tally, Tally)>,
    /// What the series of keys that lost them had shown beyond their start.
    retired: Tally,
    /// The `other` series as last exported.
    last: Tally,
}

/// What a series stands for (the `entry` label).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Key,
    Missing,
    Overflow,
    Other,
    /// Every entry summed (`totals_only`): no labels.
    Total,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Key => "key",
            Kind::Missing => "missing",
            Kind::Overflow => "overflow",
            Kind::Other => "other",
            Kind::Total => "",
        }
    }
}

/// One series of every metric but the histogram: the figures of one entry
/// (or a sum).
struct Row {
    key: String,
    kind: Kind,
    tally: Tally,
    /// In flight, limit, breakers not closed.
    gauges: (u64, u64, u64),
}

fn gauges(lifetime: &Lifetime) -> (u64, u64, u64) {
    (
        lifetime.concurrency,
        lifetime.limit,
        lifetime.breakers_not_closed,
    )
}

fn add_gauges(sum: &mut (u64, u64, u64), more: (u64, u64, u64)) {
    sum.0 = sum.0.saturating_add(more.0);
    sum.1 = sum.1.saturating_add(more.1);
    sum.2 = sum.2.saturating_add(more.2);
}

/// Whether the overflow entry counts in sums: its limit only when in use,
/// as in [`StatsHandle::total`].
fn overflow_in_use(overflow: &Lifetime) -> bool {
    overflow.concurrency > 0 || !overflow.counts.is_empty()
}

impl Part {
    /// Every series of this layer but the histogram, from one read.
    fn rows(&self, reading: &Reading) -> Vec<Row> {
        if !self.per_key {
            return vec![total(reading)];
        }
        let mut guard = self.other.lock().unwrap_or_else(PoisonError::into_inner);
        let other = &mut *guard;
        let first_read = !std::mem::replace(&mut other.started, true);

        // The keys with a series: their own limit, the missing key, and
        // the busiest of the rest (ties by label, for a stable choice).
        let mut ranked: Vec<usize> = (0..reading.keys.len())
            .filter(|&i| {
                let (label, lifetime) = &reading.keys[i];
                label.is_some() && !lifetime.own_limit
            })
            .collect();
        let busiest_first = |&a: &usize, &b: &usize| {
            let ((label_a, a), (label_b, b)) = (&reading.keys[a], &reading.keys[b]);
            let traffic = |l: &Lifetime| Tally::of(&l.counts).traffic();
            traffic(b)
                .cmp(&traffic(a))
                .then_with(|| label_a.cmp(label_b))
        };
        if ranked.len() > self.top_keys {
            ranked.select_nth_unstable_by(self.top_keys, busiest_first);
            ranked.truncate(self.top_keys);
        }
        let mut chosen = vec![false; reading.keys.len()];
        for i in ranked {
            chosen[i] = true;
        }
        for (i, (label, lifetime)) in reading.keys.iter().enumerate() {
            if label.is_none() || lifetime.own_limit {
                chosen[i] = true;
            }
        }

        let mut rows = Vec::new();
        let mut unselected = Tally::default();
        let mut starts = Tally::default();
        let mut other_gauges = (0, 0, 0);
        let mut still = HashMap::with_capacity(other.selected.len());
        for ((label, lifetime), chosen) in reading.keys.iter().zip(chosen) {
            let tally = Tally::of(&lifetime.counts);
            if !chosen {
                unselected = unselected.plus(tally);
                add_gauges(&mut other_gauges, gauges(lifetime));
                continue;
            }
            let start = match other.selected.remove(label) {
                Some((start, _)) => start,
                None if first_read => Tally::default(),
                // A key that had no series: `other` holds what it counted
                // so far, and keeps it.
                None => tally,
            };
            starts = starts.plus(start);
            still.insert(label.clone(), (start, tally));
            rows.push(Row {
                key: label.clone().unwrap_or_default(),
                kind: if label.is_some() {
                    Kind::Key
                } else {
                    Kind::Missing
                },
                tally,
                gauges: gauges(lifetime),
            });
        }
        // Keys that lost their series (evicted, or no longer the busiest):
        // what their series showed stays theirs.
        for (_, (start, last)) in other.selected.drain() {
            other.retired = other.retired.plus(last.minus(start));
        }
        other.selected = still;
        let computed = unselected
            .plus(starts)
            .plus(reading.evicted)
            .minus(other.retired);
        other.last = other.last.zip(computed, u64::max);
        rows.sort_by(|a, b| (a.kind as u8, &a.key).cmp(&(b.kind as u8, &b.key)));
        rows.push(Row {
            key: String::new(),
            kind: Kind::Overflow,
            tally: Tally::of(&reading.overflow.counts),
            gauges: gauges(&reading.overflow),
        });
        rows.push(Row {
            key: String::new(),
            kind: Kind::Other,
            tally: other.last,
            gauges: other_gauges,
        });
        rows
    }
}

/// Every entry of a read summed, in one row.
fn total(reading: &Reading) -> Row {
    let mut tally = reading.evicted;
    let mut sum = (0, 0, 0);
    for (_, lifetime) in &reading.keys {
        tally = tally.plus(Tally::of(&lifetime.counts));
        add_gauges(&mut sum, gauges(lifetime));
    }
    tally = tally.plus(Tally::of(&reading.overflow.counts));
    if overflow_in_use(&reading.overflow) {
        add_gauges(&mut sum, gauges(&reading.overflow));
    }
    Row {
        key: String::new(),
        kind: Kind::Total,
        tally,
        gauges: sum,
    }
}

/// The labels of a series: `layer` if named, then `key` and `entry` for a
/// per-key series.
struct Labels<'a> {
    layer: Option<&'a str>,
    key: Option<(&'a str, &'static str)>,
}

/// A label value written with the exposition format's escapes: keys come
/// from clients and may hold quotes, backslashes or line breaks.
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['\\', '"', '\n']) {
            encoder.write_str(&rest[..at])?;
            encoder.write_str(match rest.as_bytes()[at] {
                b'\\' => "\\\\",
                b'"' => "\\\"",
                _ => "\\n",
            })?;
            rest = &rest[at + 1..];
        }
        encoder.write_str(rest)
    }
}

impl EncodeLabelSet for Labels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        let layer = self.layer.map(|layer| ("layer", layer));
        let key = self.key.map(|(key, _)| ("key", key));
        let entry = self.key.map(|(_, entry)| ("entry", entry));
        for (name, value) in [layer, key, entry].into_iter().flatten() {
            let mut label = encoder.encode_label();
            let mut key = label.encode_label_key()?;
            key.write_str(name)?;
            let mut value_encoder = key.encode_label_value()?;
            Escaped(value).encode(&mut value_encoder)?;
            value_encoder.finish()?;
        }
        Ok(())
    }
}

/// A counter or a gauge, written for every row, or the histogram, written
/// once per layer.
enum Series {
    Counter(fn(&Tally) -> u64),
    /// A counter of seconds, kept in microseconds.
    Seconds(fn(&Tally) -> u64),
    Gauge(fn((u64, u64, u64)) -> u64),
    Histogram,
}

const METRICS: [(&str, &str, Series); 9] = [
    (
        "sliding_window_pass",
        "Requests admitted by the sliding-window limiter.",
        Series::Counter(|t| t.pass),
    ),
    (
        "sliding_window_block",
        "Requests refused by the sliding-window limiter.",
        Series::Counter(|t| t.block),
    ),
    (
        "sliding_window_success",
        "Admitted requests that completed, failed ones included.",
        Series::Counter(|t| t.success),
    ),
    (
        "sliding_window_exception",
        "Completed requests classified as failures.",
        Series::Counter(|t| t.exception),
    ),
    (
        "sliding_window_response_seconds",
        "Response times of completed requests, summed.",
        Series::Seconds(|t| t.rt_micros),
    ),
    (
        "sliding_window_response_time_seconds",
        "Time from admission to response of completed requests, for the whole layer.",
        Series::Histogram,
    ),
    (
        "sliding_window_in_flight",
        "Requests in flight now.",
        Series::Gauge(|(concurrency, _, _)| concurrency),
    ),
    (
        "sliding_window_limit",
        "The limit per window now.",
        Series::Gauge(|(_, limit, _)| limit),
    ),
    (
        "sliding_window_breakers_not_closed",
        "Circuit breakers of the key that are open or half-open now.",
        Series::Gauge(|(_, _, breakers)| breakers),
    ),
];

/// Writes one sample of `series` for `row` into `metric`.
fn write_row(metric: &mut MetricEncoder<'_>, series: &Series, row: &Row) -> fmt::Result {
    match series {
        Series::Counter(get) => metric.encode_counter::<NoLabelSet, _, u64>(&get(&row.tally), None),
        Series::Seconds(get) => {
            metric.encode_counter::<NoLabelSet, _, f64>(&(get(&row.tally) as f64 / 1e6), None)
        }
        Series::Gauge(get) => metric.encode_gauge(&get(row.gauges)),
        Series::Histogram => Ok(()),
    }
}

/// Writes a layer's histogram into `metric`.
fn write_histogram(metric: &mut MetricEncoder<'_>, counts: &RtCounts) -> fmt::Result {
    // prometheus-client writes `+Inf` for a bound of `f64::MAX` only.
    let buckets: Vec<(f64, u64)> = counts
        .buckets
        .iter()
        .map(|&(bound, n)| (if bound.is_finite() { bound } else { f64::MAX }, n))
        .collect();
    metric.encode_histogram::<NoLabelSet>(counts.sum_seconds, counts.count, &buckets, None)
}

impl Collector for PrometheusCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let reads: Vec<(&Part, Reading)> = self
            .parts
            .iter()
            .map(|part| (part, part.source.read()))
            .collect();
        let rows: Vec<Vec<Row>> = reads
            .iter()
            .map(|(part, reading)| part.rows(reading))
            .collect();
        for (name, help, series) in &METRICS {
            let metric_type = match series {
                Series::Counter(_) | Series::Seconds(_) => MetricType::Counter,
                Series::Gauge(_) => MetricType::Gauge,
                Series::Histogram => MetricType::Histogram,
            };
            // The unit is in the name; no `# UNIT` line, which some
            // parsers refuse on histograms.
            let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
            for ((part, reading), rows) in reads.iter().zip(&rows) {
                let layer = part.layer.as_deref();
                if let Series::Histogram = series {
                    let Some(counts) = &reading.histogram else {
                        continue;
                    };
                    match layer {
                        Some(_) => write_histogram(
                            &mut metric.encode_family(&Labels { layer, key: None })?,
                            counts,
                        )?,
                        None => write_histogram(&mut metric, counts)?,
                    }
                    continue;
                }
                for row in rows {
                    let key =
                        (row.kind != Kind::Total).then(|| (row.key.as_str(), row.kind.as_str()));
                    if layer.is_none() && key.is_none() {
                        write_row(&mut metric, series, row)?;
                    } else {
                        let labels = Labels { layer, key };
                        write_row(&mut metric.encode_family(&labels)?, series, row)?;
                    }
                }
            }
        }
        write_system(&mut encoder, &reads)?;
        #[cfg(feature = "redis")]
        write_store(&mut encoder, &reads)?;
        Ok(())
    }
}

/// A counter of a layer's shared store: name, help, and its reading.
#[cfg(feature = "redis")]
type StoreCounter = (
    &'static str,
    &'static str,
    fn(&crate::store::StoreStatus) -> u64,
);

/// The shared stores' series, for the layers that have one (none at all,
/// descriptors included, when no layer has): the round trips and what
/// they admitted (their ratio is the round trips per admission), the
/// leases of hot keys, the failures and the mode.
#[cfg(feature = "redis")]
fn write_store(encoder: &mut DescriptorEncoder<'_>, reads: &[(&Part, Reading)]) -> fmt::Result {
    use crate::store::{StoreMode, StoreStatus};

    let stores: Vec<(Option<&str>, &StoreStatus)> = reads
        .iter()
        .filter_map(|(part, reading)| Some((part.layer.as_deref(), reading.store.as_ref()?)))
        .collect();
    if stores.is_empty() {
        return Ok(());
    }
    let counters: [StoreCounter; 7] = [
        (
            "sliding_window_store_round_trips",
            "Round trips to the shared store (script calls); divided by admitted: round trips per admission.",
            |s| s.round_trips,
        ),
        (
            "sliding_window_store_admitted",
            "Requests admitted through the shared store (by their own call or a leased pass).",
            |s| s.admitted,
        ),
        (
            "sliding_window_store_leased",
            "Passes leased by hot keys: granted beyond the calling request's own, for later requests.",
            |s| s.leased,
        ),
        (
            "sliding_window_store_lease_spent",
            "Leased passes spent: requests admitted with no round trip.",
            |s| s.lease_spent,
        ),
        (
            "sliding_window_store_stranded",
            "Leased passes not spent before their bucket ended (they stay counted as passes).",
            |s| s.stranded,
        ),
        (
            "sliding_window_store_answered_locally",
            "Requests refused with no round trip, for a key known to be blocked.",
            |s| s.answered_locally,
        ),
        (
            "sliding_window_store_failures",
            "Round trips to the shared store that failed (an error, a reply that made no sense, a timeout).",
            |s| s.failures,
        ),
    ];
    for (name, help, get) in counters {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (layer, status) in &stores {
            let value = get(status);
            match layer {
                Some(_) => metric
                    .encode_family(&SystemLabels {
                        layer: *layer,
                        check: None,
                    })?
                    .encode_counter::<NoLabelSet, _, u64>(&value, None)?,
                None => metric.encode_counter::<NoLabelSet, _, u64>(&value, None)?,
            }
        }
    }
    let mut metric = encoder.encode_descriptor(
        "sliding_window_store_fallback",
        "1 while the failure policy decides instead of the shared store, else 0.",
        None,
        MetricType::Gauge,
    )?;
    for (layer, status) in &stores {
        let fallback = u64::from(status.mode == StoreMode::Fallback);
        write_system_gauge(&mut metric, *layer, &fallback)?;
    }
    Ok(())
}

/// The labels of a system rule's series: `layer` if named, and `check`
/// for its refusals.
struct SystemLabels<'a> {
    layer: Option<&'a str>,
    check: Option<&'static str>,
}

impl EncodeLabelSet for SystemLabels<'_> {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> fmt::Result {
        let layer = self.layer.map(|layer| ("layer", layer));
        let check = self.check.map(|check| ("check", check));
        for (name, value) in [layer, check].into_iter().flatten() {
            let mut label = encoder.encode_label();
            let mut key = label.encode_label_key()?;
            key.write_str(name)?;
            let mut value_encoder = key.encode_label_value()?;
            Escaped(value).encode(&mut value_encoder)?;
            value_encoder.finish()?;
        }
        Ok(())
    }
}

/// A whole-number gauge of a system rule: name, help, and its reading.
type SystemGauge = (&'static str, &'static str, fn(&SystemStatus) -> u64);

/// One gauge sample of a layer's system rule.
fn write_system_gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    metric: &mut MetricEncoder<'_>,
    layer: Option<&str>,
    value: &V,
) -> fmt::Result {
    match layer {
        Some(_) => metric
            .encode_family(&SystemLabels { layer, check: None })?
            .encode_gauge(value),
        None => metric.encode_gauge(value),
    }
}

/// The system rules' series, for the layers that have one (none at all,
/// descriptors included, when no layer has): refusals per check, the CPU
/// use, and the requests in flight against the BBR estimate.
fn write_system(encoder: &mut DescriptorEncoder<'_>, reads: &[(&Part, Reading)]) -> fmt::Result {
    let systems: Vec<(Option<&str>, &SystemStatus)> = reads
        .iter()
        .filter_map(|(part, reading)| Some((part.layer.as_deref(), reading.system.as_ref()?)))
        .collect();
    if systems.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(
        "sliding_window_system_refusals",
        "Requests refused by the layer's system rule (adaptive protection), per check.",
        None,
        MetricType::Counter,
    )?;
    for (layer, status) in &systems {
        for check in SystemCheck::ALL {
            let labels = SystemLabels {
                layer: *layer,
                check: Some(check.as_str()),
            };
            metric
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, _, u64>(&status.refusals_of(check), None)?;
        }
    }
    let mut metric = encoder.encode_descriptor(
        "sliding_window_system_cpu",
        "The CPU use the system rule reads, as a fraction of the CPU the service may use.",
        None,
        MetricType::Gauge,
    )?;
    for (layer, status) in &systems {
        write_system_gauge(&mut metric, *layer, &status.cpu)?;
    }
    let gauges: [SystemGauge; 2] = [
        (
            "sliding_window_system_in_flight",
            "Requests of the whole layer in flight now.",
            |s| s.in_flight,
        ),
        (
            "sliding_window_system_max_in_flight",
            "The BBR estimate: requests in flight the service holds at its best throughput and latency.",
            |s| s.max_in_flight,
        ),
    ];
    for (name, help, get) in gauges {
        let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (layer, status) in &systems {
            write_system_gauge(&mut metric, *layer, &get(status))?;
        }
    }
    Ok(())
}
