//! The Prometheus collector, read back through a grammar-based OpenMetrics
//! parser and checked against the stats handle: per-key counters and
//! gauges, escaping of hostile keys, the missing and overflow entries,
//! eviction and return of keys, and totals without labels.

#![cfg(feature = "prometheus")]

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use axum::routing;
use axum::Router;
use http::{HeaderName, StatusCode};
use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use support::{clock, req, req_with, send};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{HeaderKey, SlidingWindowLayer, Snapshot, StatsHandle};

type Key = Option<String>;

/// Every sample of a scrape: (metric, `key` label, `entry` label) -> value.
/// Histograms give `<name>_sum` and `<name>_count`.
type Samples = HashMap<(String, String, String), f64>;

const COUNTERS: [&str; 4] = [
    "sliding_window_pass",
    "sliding_window_block",
    "sliding_window_success",
    "sliding_window_exception",
];

/// Undoes the exposition format's escapes, if the parser kept them.
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn scrape(registry: &Registry) -> (String, Samples) {
    let mut text = String::new();
    encode(&mut text, registry).expect("the collector encodes");
    let parsed: MetricsExposition<OpenMetricsType, OpenMetricsValue> =
        openmetrics_parser::openmetrics::parse_openmetrics(&text)
            .unwrap_or_else(|e| panic!("the exposition does not parse ({e:?}):\n{text}"));
    let mut samples = Samples::new();
    for (name, family) in &parsed.families {
        for sample in family.iter_samples() {
            let labels = sample.get_labelset().expect("labels");
            let label = |wanted: &str| {
                labels
                    .get_label_value(wanted)
                    .map(unescape)
                    .unwrap_or_default()
            };
            let id = |metric: String| (metric, label("key"), label("entry"));
            let mut put = |metric: String, value: f64| {
                let previous = samples.insert(id(metric.clone()), value);
                assert!(previous.is_none(), "duplicate series {metric}:\n{text}");
            };
            match &sample.value {
                OpenMetricsValue::Counter(c) => put(name.clone(), c.value.as_f64()),
                OpenMetricsValue::Gauge(n) => put(name.clone(), n.as_f64()),
                OpenMetricsValue::Histogram(h) => {
                    put(format!("{name}_sum"), h.sum.as_ref().expect("sum").as_f64());
                    put(format!("{name}_count"), h.count.expect("count") as f64);
                }
                other => panic!("unexpected sample {other:?} in {name}"),
            }
        }
    }
    (text, samples)
}

fn get(samples: &Samples, metric: &str, key: &str, entry: &str) -> f64 {
    match samples.get(&(metric.to_owned(), key.to_owned(), entry.to_owned())) {
        Some(v) => *v,
        None => panic!("no {metric}{{key={key:?},entry={entry:?}}} in {samples:#?}"),
    }
}

/// Sum over every series of `metric`.
fn sum(samples: &Samples, metric: &str) -> f64 {
    samples
        .iter()
        .filter(|((m, _, _), _)| m == metric)
        .map(|(_, v)| v)
        .sum()
}

/// The per-key series of `key` against the handle's snapshot (read while
/// the window still holds every event of the key's life).
fn check_key(samples: &Samples, key: &str, entry: &str, snap: &Snapshot, rt: Duration) {
    let figures = [snap.pass, snap.block, snap.success, snap.exception];
    for (metric, want) in COUNTERS.iter().zip(figures) {
        assert_eq!(
            get(samples, metric, key, entry),
            want as f64,
            "{metric} {key}"
        );
    }
    assert_eq!(
        get(samples, "sliding_window_in_flight", key, entry),
        snap.concurrency as f64
    );
    assert_eq!(
        get(samples, "sliding_window_limit", key, entry),
        snap.limit as f64
    );
    let count = get(
        samples,
        "sliding_window_response_time_seconds_count",
        key,
        entry,
    );
    assert_eq!(count, snap.success as f64);
    let seconds = get(
        samples,
        "sliding_window_response_time_seconds_sum",
        key,
        entry,
    );
    let want = rt.as_secs_f64() * snap.success as f64;
    assert!((seconds - want).abs() < 1e-9, "{seconds} vs {want}");
}

/// A server whose handler takes `rt` on the manual clock, limited per
/// `x-tenant` header to `limit` per second with room for `max_keys` keys.
fn app(
    clock: &ManualClock,
    limit: u64,
    max_keys: usize,
    rt: Duration,
) -> (Router, StatsHandle<Key>) {
    let layer = SlidingWindowLayer::qps(limit)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .max_keys(max_keys)
        .clock(clock.clone());
    let stats = layer.handle();
    let handler_clock = clock.clone();
    let app = Router::new()
        .route(
            "/",
            routing::get(move || {
                let clock = handler_clock.clone();
                async move {
                    clock.advance(rt);
                    "ok"
                }
            }),
        )
        .route(
            "/fail",
            routing::get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .layer(layer);
    (app, stats)
}

fn key(s: &str) -> Key {
    Some(s.to_owned())
}

#[tokio::test]
async fn per_key_series_match_the_handle() {
    let clock = clock();
    let rt = Duration::from_millis(3);
    let (app, stats) = app(&clock, 2, 8, rt);
    let hostile = r#"we"ird\key, =}"#;
    for _ in 0..3 {
        send(&app, req_with("/", "x-tenant", "a")).await;
    }
    send(&app, req_with("/fail", "x-tenant", "b")).await;
    send(&app, req_with("/", "x-tenant", hostile)).await;
    send(&app, req("/")).await;

    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let (text, samples) = scrape(&registry);

    // `/fail` answers at once: no time passes on the manual clock.
    for (label, entry, k, rt) in [
        ("a", "key", key("a"), rt),
        ("b", "key", key("b"), Duration::ZERO),
        (hostile, "key", key(hostile), rt),
        ("", "missing", None, rt),
    ] {
        let snap = stats.snapshot(&k).expect("the key has an entry");
        check_key(&samples, label, entry, &snap, rt);
    }
    let a = stats.snapshot(&key("a")).unwrap();
    assert!(
        a.pass > 0 && a.block > 0,
        "the load went over the limit: {a:?}"
    );
    let b = stats.snapshot(&key("b")).unwrap();
    assert_eq!(b.exception, 1, "{b:?}");
    // The idle overflow entry and the empty evicted sum are there, at zero.
    assert_eq!(get(&samples, "sliding_window_pass", "", "overflow"), 0.0);
    assert_eq!(get(&samples, "sliding_window_pass", "", "evicted"), 0.0);
    // Every key, once per metric: 4 keys, the overflow and the evicted sum.
    let passes = samples
        .keys()
        .filter(|(m, _, _)| m == "sliding_window_pass")
        .count();
    assert_eq!(passes, stats.keys().len() + 2, "{text}");
    // Naming conventions: `_total` counters, seconds, no key in the name.
    assert!(text.contains("\nsliding_window_pass_total{"), "{text}");
    assert!(
        text.contains("\nsliding_window_response_time_seconds_sum{"),
        "{text}"
    );
}

#[tokio::test]
async fn counters_survive_eviction_and_return() {
    let clock = clock();
    let rt = Duration::from_millis(2);
    let (app, stats) = app(&clock, 3, 2, rt);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let mut totals = Registry::default();
    totals.register_collector(Box::new(stats.collector().totals_only()));

    for _ in 0..5 {
        send(&app, req_with("/", "x-tenant", "a")).await;
    }
    for _ in 0..2 {
        send(&app, req_with("/", "x-tenant", "b")).await;
    }
    let a = stats.snapshot(&key("a")).unwrap();
    let b = stats.snapshot(&key("b")).unwrap();
    let (_, first) = scrape(&registry);
    check_key(&first, "a", "key", &a, rt);
    check_key(&first, "b", "key", &b, rt);

    // The keys' windows empty out: snapshots forget, counters do not.
    clock.advance(Duration::from_secs(5));
    assert_eq!(stats.snapshot(&key("a")).unwrap().pass, 0);
    let (_, later) = scrape(&registry);
    for metric in COUNTERS {
        assert_eq!(
            get(&later, metric, "a", "key"),
            get(&first, metric, "a", "key")
        );
    }

    // Two new keys need the room: a and b are idle and evicted.
    send(&app, req_with("/", "x-tenant", "c")).await;
    send(&app, req_with("/", "x-tenant", "d")).await;
    assert!(stats.snapshot(&key("a")).is_none(), "a was evicted");
    let (_, evicted) = scrape(&registry);
    for metric in COUNTERS {
        let gone = get(&first, metric, "a", "key") + get(&first, metric, "b", "key");
        assert_eq!(get(&evicted, metric, "", "evicted"), gone, "{metric}");
        assert!(sum(&evicted, metric) >= sum(&later, metric), "{metric}");
    }
    assert!(!evicted.contains_key(&("sliding_window_pass".into(), "a".into(), "key".into())));

    // a returns (after c and d went idle): a new series from zero, the
    // evicted sum keeps what it had, and no sum goes backwards.
    clock.advance(Duration::from_secs(5));
    send(&app, req_with("/", "x-tenant", "a")).await;
    let (_, back) = scrape(&registry);
    let a_again = stats.snapshot(&key("a")).unwrap();
    check_key(&back, "a", "key", &a_again, rt);
    for metric in COUNTERS {
        assert!(get(&back, metric, "", "evicted") >= get(&evicted, metric, "", "evicted"));
        assert!(sum(&back, metric) >= sum(&evicted, metric), "{metric}");
    }
    assert_eq!(
        sum(&back, "sliding_window_pass"),
        (a.pass + b.pass + 2 + a_again.pass) as f64,
        "every pass ever admitted, once"
    );

    // Without labels: one series per metric, equal to the sums above.
    let (text, total) = scrape(&totals);
    for metric in COUNTERS {
        assert_eq!(get(&total, metric, "", ""), sum(&back, metric), "{metric}");
    }
    assert!(!text.contains("key=\""), "{text}");
    assert_eq!(
        get(&total, "sliding_window_limit", "", ""),
        stats.total().limit as f64
    );
}

#[tokio::test]
async fn the_overflow_entry_is_labelled_as_such() {
    let clock = clock();
    let (app, stats) = app(&clock, 1, 1, Duration::ZERO);
    send(&app, req_with("/", "x-tenant", "first")).await;
    // The only slot is busy (its window holds a pass): new keys overflow.
    for tenant in ["x", "y", "z"] {
        send(&app, req_with("/", "x-tenant", tenant)).await;
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let (_, samples) = scrape(&registry);
    let overflow = stats.overflow();
    assert_eq!(overflow.pass + overflow.block, 3, "{overflow:?}");
    check_key(&samples, "", "overflow", &overflow, Duration::ZERO);
    for tenant in ["x", "y", "z"] {
        assert!(
            !samples.keys().any(|(_, k, _)| k == tenant),
            "{tenant} has no series"
        );
    }
}

/// Real time and real threads: buckets rotate (and roll into the lifetime
/// totals) while requests are recorded and scrapes read. Totals never go
/// backwards between scrapes, and at the end every request is counted
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_never_go_backwards_under_concurrent_load() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;

    let layer = SlidingWindowLayer::qps(50)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .max_keys(3);
    let stats = layer.handle();
    let app = Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(layer);
    let mut totals = Registry::default();
    totals.register_collector(Box::new(stats.collector().totals_only()));
    let mut per_key = Registry::default();
    per_key.register_collector(Box::new(stats.collector()));

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut senders = Vec::new();
    for worker in 0..2u64 {
        let (app, stop, sent) = (app.clone(), Arc::clone(&stop), Arc::clone(&sent));
        senders.push(tokio::spawn(async move {
            let mut n = worker;
            while !stop.load(Ordering::Relaxed) {
                let tenant = format!("t{}", n % 6);
                let request = req_with("/", "x-tenant", &tenant);
                app.clone().oneshot(request).await.unwrap();
                sent.fetch_add(1, Ordering::Relaxed);
                n += 2;
                if n % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    let started = std::time::Instant::now();
    let mut last_total: Option<Samples> = None;
    let mut last_shared: Option<Samples> = None;
    let mut scrapes = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        let (_, total) = scrape(&totals);
        let (_, keyed) = scrape(&per_key);
        if let Some(last) = &last_total {
            for metric in COUNTERS {
                assert!(
                    get(&total, metric, "", "") >= get(last, metric, "", ""),
                    "{metric}"
                );
            }
        }
        if let Some(last) = &last_shared {
            for entry in ["overflow", "evicted"] {
                for metric in COUNTERS {
                    assert!(get(&keyed, metric, "", entry) >= get(last, metric, "", entry));
                }
            }
        }
        last_total = Some(total);
        last_shared = Some(keyed);
        scrapes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for sender in senders {
        sender.await.unwrap();
    }
    let (_, total) = scrape(&totals);
    let counted =
        get(&total, "sliding_window_pass", "", "") + get(&total, "sliding_window_block", "", "");
    assert_eq!(
        counted,
        sent.load(Ordering::Relaxed) as f64,
        "every request once"
    );
    assert!(scrapes > 10, "{scrapes} scrapes");
    let (_, keyed) = scrape(&per_key);
    assert!(
        get(&keyed, "sliding_window_pass", "", "overflow")
            + get(&keyed, "sliding_window_block", "", "overflow")
            > 0.0,
        "six tenants, room for three: the overflow entry was used"
    );
}

#[tokio::test]
async fn a_tripped_breaker_shows_in_its_keys_gauge() {
    use tower_sliding_window::breaker::{Breaker, BreakerState};

    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .breaker(Breaker::error_count(1).min_requests(1))
        .breaker(Breaker::error_ratio(1.0).min_requests(10))
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .route(
            "/fail",
            routing::get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        )
        .layer(layer);
    send(&app, req_with("/", "x-tenant", "healthy")).await;
    send(&app, req_with("/fail", "x-tenant", "failing")).await;
    send(&app, req_with("/fail", "x-tenant", "failing")).await;
    assert!(matches!(
        stats.breakers(&key("failing"))[..],
        [BreakerState::Open { .. }, BreakerState::Closed]
    ));

    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let (_, samples) = scrape(&registry);
    let gauge = "sliding_window_breakers_not_closed";
    assert_eq!(get(&samples, gauge, "failing", "key"), 1.0);
    assert_eq!(get(&samples, gauge, "healthy", "key"), 0.0);

    let mut totals = Registry::default();
    totals.register_collector(Box::new(stats.collector().totals_only()));
    let (_, samples) = scrape(&totals);
    assert_eq!(get(&samples, gauge, "", ""), 1.0);
}
