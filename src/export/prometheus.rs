//! [`PrometheusCollector`]: the statistics as a `prometheus-client`
//! collector, read at scrape time.

use std::fmt::{self, Write as _};
use std::hash::Hash;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, LabelSetEncoder, LabelValueEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::MetricType;

use super::KeyLabel;
use crate::handle::{Lifetime, StatsHandle};
use crate::stat::Counts;

/// The layer's statistics for a [`prometheus_client`] registry, read when
/// the registry is encoded (at scrape time).
///
/// Made by [`StatsHandle::collector`]; register it with
/// [`Registry::register_collector`](prometheus_client::registry::Registry::register_collector).
/// Recording requests pays nothing for it: every figure is read from the
/// statistics the layer keeps anyway, when a scrape asks.
///
/// # Metrics
///
/// | name | type | meaning |
/// | --- | --- | --- |
/// | `sliding_window_pass_total` | counter | requests admitted |
/// | `sliding_window_block_total` | counter | requests refused (429) |
/// | `sliding_window_success_total` | counter | admitted requests that completed (failed ones included) |
/// | `sliding_window_exception_total` | counter | completed requests classified as failures |
/// | `sliding_window_response_time_seconds` | histogram (`_sum`, `_count`, one `+Inf` bucket) | time from admission to response, over completed requests |
/// | `sliding_window_in_flight` | gauge | requests in flight now |
/// | `sliding_window_limit` | gauge | the limit per window now |
/// | `sliding_window_breakers_not_closed` | gauge | the key's circuit breakers that are open or half-open now (0 without breakers) |
///
/// # Labels
///
/// Per key (the default), every sample has two labels:
///
/// - `key`: the key as text ([`KeyLabel`]), empty when `entry` is not `key`;
/// - `entry`: `key` for a key with its own statistics; `missing` for the
///   `None` key of an `Option` key type (a request without the header or
///   the address); `overflow` for the entry shared by keys that found no
///   room; `evicted` for the totals of every key evicted so far (counters
///   only).
///
/// So a metric has at most `max_keys` series of keys, plus the overflow
/// and evicted series, plus keys with their own limit (which never share
/// the overflow entry, and whose number the operator's rules bound). With
/// [`totals_only`](Self::totals_only) there are no labels: one series per
/// metric, every entry summed (the limit gauge is then the sum of the
/// limits, as in [`StatsHandle::total`]).
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
/// key's statistics take no more memory with a collector than without. When an idle
/// key is evicted, its totals are added to one store-wide sum, exported
/// with `entry="evicted"`. Hence:
///
/// - a series with `entry` `key`, `missing` or `overflow` only grows while
///   its key holds an entry;
/// - the `evicted` series only grows;
/// - a key that is evicted and comes back starts a new series from zero
///   (its earlier counts are in `evicted`): Prometheus reads that as a
///   counter reset, and `rate()` and `increase()` stay right. The sum over
///   all series of a metric, and every series with
///   [`totals_only`](Self::totals_only), never decreases between scrapes.
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
/// ```
pub struct PrometheusCollector<K> {
    handle: StatsHandle<K>,
    per_key: bool,
}

impl<K> fmt::Debug for PrometheusCollector<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrometheusCollector")
            .field("per_key", &self.per_key)
            .finish_non_exhaustive()
    }
}

impl<K> PrometheusCollector<K> {
    /// Exports one series per metric, every entry summed, with no label:
    /// for services whose keys are too many, or too private, for labels.
    pub fn totals_only(mut self) -> Self {
        self.per_key = false;
        self
    }
}

/// # Exporting
impl<K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static> StatsHandle<K> {
    /// A Prometheus collector reading this handle's statistics at scrape
    /// time (see [`PrometheusCollector`] for the metric and label names).
    /// Feature `prometheus`.
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
    pub fn collector(&self) -> PrometheusCollector<K> {
        crate::stat::want_lifetime_totals();
        PrometheusCollector {
            handle: self.clone(),
            per_key: true,
        }
    }
}

/// What a series stands for (the `entry` label).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Key,
    Missing,
    Overflow,
    Evicted,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Key => "key",
            Kind::Missing => "missing",
            Kind::Overflow => "overflow",
            Kind::Evicted => "evicted",
        }
    }
}

/// One series of every metric: the figures of one entry (or a sum).
struct Row {
    key: String,
    kind: Kind,
    counts: Counts,
    /// In flight, limit, breakers not closed; `None` for the evicted sum,
    /// which has no gauges.
    gauges: Option<(u64, u64, u64)>,
}

impl Row {
    fn of(key: String, kind: Kind, lifetime: Lifetime) -> Row {
        Row {
            key,
            kind,
            counts: lifetime.counts,
            gauges: Some((
                lifetime.concurrency,
                lifetime.limit,
                lifetime.breakers_not_closed,
            )),
        }
    }
}

/// The labels of a per-key series.
struct Labels<'a> {
    key: &'a str,
    entry: &'static str,
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
        for (name, value) in [("key", self.key), ("entry", self.entry)] {
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

impl<K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static> PrometheusCollector<K> {
    /// Every series, read now. The evicted sum is read first: a key evicted
    /// during the visit is then missing from this scrape rather than
    /// counted twice, so sums never run ahead of the next scrape.
    fn rows(&self) -> Vec<Row> {
        let evicted = self.handle.evicted_lifetime();
        let mut rows = Vec::new();
        self.handle.for_each_lifetime(|key, lifetime| {
            let (label, kind) = match key.label() {
                Some(label) => (label.into_owned(), Kind::Key),
                None => (String::new(), Kind::Missing),
            };
            rows.push(Row::of(label, kind, lifetime));
        });
        rows.push(Row::of(
            String::new(),
            Kind::Overflow,
            self.handle.overflow_lifetime(),
        ));
        rows.push(Row {
            key: String::new(),
            kind: Kind::Evicted,
            counts: evicted,
            gauges: None,
        });
        if self.per_key {
            return rows;
        }
        let mut total = Row {
            key: String::new(),
            kind: Kind::Key,
            counts: Counts::default(),
            gauges: Some((0, 0, 0)),
        };
        for row in &rows {
            total.counts.merge(&row.counts);
            if let (Some((c, l, b)), Some((tc, tl, tb))) = (row.gauges, total.gauges.as_mut()) {
                // The idle overflow entry adds its limit only when in use,
                // as in `StatsHandle::total`.
                if row.kind == Kind::Overflow && row.counts.is_empty() && c == 0 {
                    continue;
                }
                *tc = tc.saturating_add(c);
                *tl = tl.saturating_add(l);
                *tb = tb.saturating_add(b);
            }
        }
        vec![total]
    }
}

/// A counter, a gauge or the RT histogram, written for every row.
enum Series {
    Counter(fn(&Counts) -> u64),
    Gauge(fn((u64, u64, u64)) -> u64),
    Rt,
}

const METRICS: [(&str, &str, Series); 8] = [
    (
        "sliding_window_pass",
        "Requests admitted by the sliding-window limiter.",
        Series::Counter(|c| c.pass),
    ),
    (
        "sliding_window_block",
        "Requests refused by the sliding-window limiter.",
        Series::Counter(|c| c.block),
    ),
    (
        "sliding_window_success",
        "Admitted requests that completed, failed ones included.",
        Series::Counter(|c| c.success),
    ),
    (
        "sliding_window_exception",
        "Completed requests classified as failures.",
        Series::Counter(|c| c.exception),
    ),
    (
        "sliding_window_response_time_seconds",
        "Time from admission to response of completed requests.",
        Series::Rt,
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

impl<K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static> Collector for PrometheusCollector<K> {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let rows = self.rows();
        for (name, help, series) in &METRICS {
            let metric_type = match series {
                Series::Counter(_) => MetricType::Counter,
                Series::Gauge(_) => MetricType::Gauge,
                Series::Rt => MetricType::Histogram,
            };
            // The unit is in the name; no `# UNIT` line, which some
            // parsers refuse on histograms.
            let mut metric = encoder.encode_descriptor(name, help, None, metric_type)?;
            for row in &rows {
                let labels = Labels {
                    key: &row.key,
                    entry: row.kind.as_str(),
                };
                let write =
                    |metric: &mut prometheus_client::encoding::MetricEncoder<'_>| match series {
                        Series::Counter(get) => {
                            metric.encode_counter::<NoLabelSet, _, u64>(&get(&row.counts), None)
                        }
                        Series::Gauge(get) => match row.gauges {
                            Some(gauges) => metric.encode_gauge(&get(gauges)),
                            None => Ok(()),
                        },
                        Series::Rt => metric.encode_histogram::<NoLabelSet>(
                            row.counts.rt_micros as f64 / 1e6,
                            row.counts.success,
                            &[(f64::INFINITY, row.counts.success)],
                            None,
                        ),
                    };
                if self.per_key {
                    if matches!(series, Series::Gauge(_)) && row.gauges.is_none() {
                        continue;
                    }
                    write(&mut metric.encode_family(&labels)?)?;
                } else {
                    write(&mut metric)?;
                }
            }
        }
        Ok(())
    }
}
