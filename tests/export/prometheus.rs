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

/// The registry's exposition, checked against the OpenMetrics grammar.
fn exposition(
    registry: &Registry,
) -> (String, MetricsExposition<OpenMetricsType, OpenMetricsValue>) {
    let mut text = String::new();
    encode(&mut text, registry).expect("the collector encodes");
    let parsed = openmetrics_parser::openmetrics::parse_openmetrics(&text)
        .unwrap_or_else(|e| panic!("the exposition does not parse ({e:?}):\n{text}"));
    (text, parsed)
}

fn scrape(registry: &Registry) -> (String, Samples) {
    let (text, parsed) = exposition(registry);
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

/// What Prometheus's `increase()` summed over every series of `metric`
/// gives from `before` to `after`: the change of each series present in
/// both (a series that starts or ends adds nothing).
fn increase(before: &Samples, after: &Samples, metric: &str) -> f64 {
    after
        .iter()
        .filter(|((m, _, _), _)| m == metric)
        .filter_map(|(id, now)| before.get(id).map(|then| now - then))
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
    let seconds = get(samples, "sliding_window_response_seconds", key, entry);
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
    // The idle overflow entry and the empty sum of other keys are there,
    // at zero.
    assert_eq!(get(&samples, "sliding_window_pass", "", "overflow"), 0.0);
    assert_eq!(get(&samples, "sliding_window_pass", "", "other"), 0.0);
    // Every key, once per metric: 4 keys, the overflow and the other sum.
    let passes = samples
        .keys()
        .filter(|(m, _, _)| m == "sliding_window_pass")
        .count();
    assert_eq!(passes, stats.keys().len() + 2, "{text}");
    // Naming conventions: `_total` counters, seconds, no key in the name.
    assert!(text.contains("\nsliding_window_pass_total{"), "{text}");
    assert!(
        text.contains("\nsliding_window_response_seconds_total{"),
        "{text}"
    );
    assert!(
        text.contains("\nsliding_window_response_time_seconds_sum "),
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

    // Two new keys need the room: a and b are idle and evicted. Their
    // series end; what they showed stays theirs, and `other` takes what
    // c and d counted before their series started.
    let (_, totals_later) = scrape(&totals);
    send(&app, req_with("/", "x-tenant", "c")).await;
    send(&app, req_with("/", "x-tenant", "d")).await;
    assert!(stats.snapshot(&key("a")).is_none(), "a was evicted");
    let (_, evicted) = scrape(&registry);
    let (_, totals_evicted) = scrape(&totals);
    assert!(!evicted.contains_key(&("sliding_window_pass".into(), "a".into(), "key".into())));
    for metric in COUNTERS {
        assert!(
            get(&evicted, metric, "", "other") >= get(&later, metric, "", "other"),
            "{metric}"
        );
        assert_eq!(
            increase(&later, &evicted, metric),
            get(&totals_evicted, metric, "", "") - get(&totals_later, metric, "", ""),
            "{metric}"
        );
    }
    assert_eq!(get(&evicted, "sliding_window_pass", "", "other"), 2.0);

    // a returns (after c and d went idle): a new series from zero, `other`
    // does not go backwards, and the increases over all series are the
    // layer's.
    clock.advance(Duration::from_secs(5));
    send(&app, req_with("/", "x-tenant", "a")).await;
    let (_, back) = scrape(&registry);
    let (_, totals_back) = scrape(&totals);
    let a_again = stats.snapshot(&key("a")).unwrap();
    check_key(&back, "a", "key", &a_again, rt);
    for metric in COUNTERS {
        assert!(get(&back, metric, "", "other") >= get(&evicted, metric, "", "other"));
        assert_eq!(
            increase(&evicted, &back, metric),
            get(&totals_back, metric, "", "") - get(&totals_evicted, metric, "", ""),
            "{metric}"
        );
    }
    assert_eq!(
        get(&totals_back, "sliding_window_pass", "", ""),
        (a.pass + b.pass + 2 + a_again.pass) as f64,
        "every pass ever admitted, once"
    );

    // Without labels: one series per metric.
    let (text, total) = scrape(&totals);
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
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let tenant = format!("t{}", n % 6);
                let request = req_with("/", "x-tenant", &tenant);
                app.clone().oneshot(request).await.unwrap();
                sent.fetch_add(1, Ordering::Relaxed);
                n += 2;
                // Every 32 requests, for both senders: `n` of the second
                // is always odd, so `n % 64 == 0` never held for it and it
                // never yielded its worker (the test once hung, its one
                // worker thread busy in a sender).
                round += 1;
                if round % 32 == 0 {
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
            for entry in ["overflow", "other"] {
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

/// One sample of a scrape: the sample's name (with its `_total`,
/// `_bucket`, `_sum` or `_count` suffix), its labels and its value.
#[derive(Debug, Clone)]
struct Line {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Every sample line of an exposition, read off the text (each line checked
/// against the grammar by [`scrape`] first).
fn lines(text: &str) -> Vec<Line> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("a value");
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let mut map = HashMap::new();
        let mut rest = labels;
        while let Some((label, after)) = rest.split_once("=\"") {
            // The value runs to the first quote that is not escaped.
            let mut end = 0;
            let bytes = after.as_bytes();
            while bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            map.insert(
                label.trim_start_matches(',').to_owned(),
                unescape(&after[..end]),
            );
            rest = &after[end + 1..];
        }
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("a number"),
        };
        out.push(Line {
            name: name.to_owned(),
            labels: map,
            value,
        });
    }
    out
}

/// The samples of `name` whose labels include every pair of `with`.
fn pick<'a>(lines: &'a [Line], name: &str, with: &[(&str, &str)]) -> Vec<&'a Line> {
    lines
        .iter()
        .filter(|l| l.name == name)
        .filter(|l| {
            with.iter()
                .all(|(k, v)| l.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The `le` bounds and cumulative counts of the response-time histogram's
/// series labelled `with`, in the order written.
fn buckets(lines: &[Line], with: &[(&str, &str)]) -> Vec<(String, f64)> {
    pick(lines, "sliding_window_response_time_seconds_bucket", with)
        .into_iter()
        .map(|l| (l.labels["le"].clone(), l.value))
        .collect()
}

/// A server whose `/ms/{n}` handler takes `n` ms on the manual clock.
fn timed_app(clock: &ManualClock) -> (Router, StatsHandle<Key>) {
    let layer = SlidingWindowLayer::qps(10_000)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .clock(clock.clone());
    let stats = layer.handle();
    let handler_clock = clock.clone();
    let app = Router::new()
        .route(
            "/ms/{n}",
            routing::get(move |axum::extract::Path(n): axum::extract::Path<u64>| {
                let clock = handler_clock.clone();
                async move {
                    clock.advance(Duration::from_millis(n));
                    "ok"
                }
            }),
        )
        .layer(layer);
    (app, stats)
}

/// The histogram's buckets are Prometheus's (`le="+Inf"`, not `inf`), and
/// there are enough of them for quantiles: each request lands in the
/// bucket its response time belongs to.
#[tokio::test]
async fn the_response_time_histogram_has_real_buckets() {
    let clock = clock();
    let (app, stats) = timed_app(&clock);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    // 1 ms and 5 ms sit on bounds (a bound counts what equals it); 7 ms,
    // 300 ms and 20 s do not; 20 s is past every bound but `+Inf`.
    let times = [1u64, 1, 5, 7, 7, 7, 300, 20_000];
    for (i, ms) in times.iter().enumerate() {
        let tenant = format!("t{}", i % 3);
        send(&app, req_with(&format!("/ms/{ms}"), "x-tenant", &tenant)).await;
    }
    let (text, _) = scrape(&registry);
    assert!(!text.contains("le=\"inf\""), "{text}");
    let lines = lines(&text);
    let got = buckets(&lines, &[]);
    let want = [
        ("0.001", 2.0),
        ("0.0025", 2.0),
        ("0.005", 3.0),
        ("0.01", 6.0),
        ("0.025", 6.0),
        ("0.05", 6.0),
        ("0.1", 6.0),
        ("0.25", 6.0),
        ("0.5", 7.0),
        ("1.0", 7.0),
        ("2.5", 7.0),
        ("5.0", 7.0),
        ("10.0", 7.0),
        ("+Inf", 8.0),
    ];
    let want: Vec<(String, f64)> = want.iter().map(|(l, v)| (l.to_string(), *v)).collect();
    assert_eq!(got, want, "{text}");
    let count = pick(&lines, "sliding_window_response_time_seconds_count", &[]);
    assert_eq!(count.len(), 1, "one histogram for the layer: {text}");
    assert_eq!(count[0].value, 8.0);
    let seconds = pick(&lines, "sliding_window_response_time_seconds_sum", &[])[0].value;
    let want_sum = times.iter().sum::<u64>() as f64 / 1e3;
    assert!((seconds - want_sum).abs() < 1e-9, "{seconds} vs {want_sum}");
}

/// 20 000 client keys: a scrape carries the busiest keys and keys with
/// their own limit one by one, and every other key summed in one series;
/// that sum never goes backwards as keys come, go and change rank.
#[tokio::test]
async fn twenty_thousand_keys_export_the_top_keys_and_one_sum() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(1_000_000)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .max_keys(25_000)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(layer);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    stats.set_limit(key("vip"), 5);
    send(&app, req_with("/", "x-tenant", "vip")).await;
    // Twelve heavy keys: heavy-i sends 20 + i requests.
    for i in 0..12u64 {
        for _ in 0..20 + i {
            send(&app, req_with("/", "x-tenant", &format!("heavy-{i}"))).await;
        }
    }
    for i in 0..20_000 {
        send(
            &app,
            req_with("/", "x-tenant", &format!("10.0.{}.{}", i / 256, i % 256)),
        )
        .await;
    }
    let sent = 1.0 + (0..12).map(|i| 20.0 + i as f64).sum::<f64>() + 20_000.0;

    // The size first: parsing a scrape of every key would take minutes.
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    eprintln!("a scrape of 20 013 keys: {} bytes", text.len());
    assert!(text.len() < 16 * 1024, "{} bytes", text.len());
    let (text, first) = scrape(&registry);
    let passes: Vec<_> = first
        .keys()
        .filter(|(m, _, _)| m == "sliding_window_pass")
        .collect();
    // The ten busiest (heavy-2 to heavy-11), vip (its own limit), the
    // overflow entry and the sum of the others.
    let mut keyed: Vec<&str> = passes
        .iter()
        .filter(|(_, _, e)| e == "key")
        .map(|(_, k, _)| k.as_str())
        .collect();
    keyed.sort_unstable();
    let mut want: Vec<String> = (2..12).map(|i| format!("heavy-{i}")).collect();
    want.push("vip".to_owned());
    want.sort_unstable();
    assert_eq!(keyed, want, "{text}");
    assert_eq!(passes.len(), 13, "{text}");
    assert_eq!(
        get(&first, "sliding_window_pass", "", "other"),
        20_000.0 + 20.0 + 21.0
    );
    assert_eq!(sum(&first, "sliding_window_pass"), sent);

    // A key of the sum becomes the busiest: it gets a series, heavy-2
    // goes to the sum, and the sum does not go backwards.
    for _ in 0..100 {
        send(&app, req_with("/", "x-tenant", "10.0.0.7")).await;
    }
    let (_, second) = scrape(&registry);
    assert_eq!(
        get(&second, "sliding_window_pass", "10.0.0.7", "key"),
        101.0
    );
    assert!(!second.contains_key(&(
        "sliding_window_pass".to_owned(),
        "heavy-2".to_owned(),
        "key".to_owned()
    )));
    let other = |s: &Samples| get(s, "sliding_window_pass", "", "other");
    assert!(
        other(&second) >= other(&first),
        "{} < {}",
        other(&second),
        other(&first)
    );

    // Every idle key is evicted when new ones need the room: the sum
    // keeps what they counted.
    clock.advance(Duration::from_secs(120));
    for i in 0..24_000 {
        send(&app, req_with("/", "x-tenant", &format!("new-{i}"))).await;
    }
    let (_, third) = scrape(&registry);
    assert!(stats.snapshot(&key("10.0.0.7")).is_none(), "evicted");
    assert!(other(&third) >= other(&second) + 23_000.0);
    let everything = sent + 100.0 + 24_000.0;
    let keyed_now: f64 = third
        .iter()
        .filter(|((m, _, e), _)| m == "sliding_window_pass" && e != "other")
        .map(|(_, v)| v)
        .sum();
    assert!(keyed_now + other(&third) <= everything);
    assert!(
        third
            .keys()
            .filter(|(m, _, _)| m == "sliding_window_pass")
            .count()
            <= 13
    );
}

/// The `promtool` binary (Debian's `prometheus` package).
///
/// # Panics
///
/// When it is not on the `PATH`: the test that needs it is ignored unless
/// asked for, and then fails rather than passing without having run.
fn promtool() -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("promtool"))
        .find(|candidate| candidate.is_file())
        .expect(
            "this test needs promtool (Debian: apt-get install prometheus); run the ignored \
             tests with --include-ignored once it is installed",
        )
}

/// Runs `promtool check metrics` on `text`: its exit code and output.
fn promtool_check(promtool: &std::path::Path, text: &str) -> (i32, String) {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("promtool reads the scrape");
    let out = child.wait_with_output().expect("promtool finishes");
    let mut said = String::from_utf8_lossy(&out.stdout).into_owned();
    said.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().expect("an exit code"), said)
}

/// Two layers, one per-client and one per-path, exported into one scrape:
/// every metric once, each sample with its `layer`, and `promtool check
/// metrics` finds no error. Registering the two collectors side by side
/// instead is what promtool refuses (checked too, so that the test shows
/// promtool does catch it).
///
/// promtool reads the text as the older Prometheus format, in which a
/// counter's samples must carry the family's own name: it takes the
/// OpenMetrics samples `<name>_total` of a counter family `<name>` for
/// families without help text and says so (exit code 3, "lint problems").
/// Those notes, one per counter, are the only ones allowed.
///
/// Needs `promtool` (`.ci/run` installs Debian's `prometheus` package and
/// runs it with `--include-ignored`).
#[ignore = "needs promtool"]
#[tokio::test]
async fn two_layers_in_one_scrape_pass_promtool() {
    let promtool = promtool();
    let clock = clock();
    let (clients, client_stats) = app(&clock, 2, 8, Duration::from_millis(3));
    let paths = SlidingWindowLayer::qps(5)
        .key(tower_sliding_window::PathKey)
        .clock(clock.clone());
    let path_stats = paths.handle();
    let by_path = Router::new()
        .route("/a", routing::get(|| async { "ok" }))
        .route("/b", routing::get(|| async { "ok" }))
        .layer(paths);
    // Side by side: every family written twice.
    let mut apart = Registry::default();
    apart.register_collector(Box::new(client_stats.collector()));
    apart.register_collector(Box::new(path_stats.collector()));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(
        client_stats
            .collector()
            .layer("clients")
            .join(path_stats.collector().layer("paths")),
    ));
    for tenant in ["x", "x", "x", "y", r#"we"ird\"#] {
        send(&clients, req_with("/", "x-tenant", tenant)).await;
    }
    send(&clients, req("/")).await;
    for path in ["/a", "/a", "/b"] {
        send(&by_path, req(path)).await;
    }

    let mut text = String::new();
    encode(&mut text, &apart).unwrap();
    let (code, said) = promtool_check(&promtool, &text);
    assert_eq!(code, 1, "promtool accepted a family written twice: {said}");
    assert!(said.contains("second HELP line"), "{said}");

    // Joined: each family once, the layers told apart.
    let (text, _) = exposition(&registry);
    assert_eq!(
        text.matches("# TYPE sliding_window_pass counter\n").count(),
        1,
        "{text}"
    );
    let (code, said) = promtool_check(&promtool, &text);
    eprintln!("promtool check metrics: exit {code}\n{said}");
    assert!(
        code == 0 || code == 3,
        "promtool: exit {code}: {said}\n{text}"
    );
    let counters = [
        "sliding_window_pass",
        "sliding_window_block",
        "sliding_window_success",
        "sliding_window_exception",
        "sliding_window_response_seconds",
    ];
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        let allowed = counters
            .iter()
            .any(|c| line == format!("{c}_total no help text"));
        assert!(allowed, "promtool: {line}\n{said}\n{text}");
    }

    let lines = lines(&text);
    for (layer, key, want) in [
        ("clients", "x", 2.0),
        ("clients", "y", 1.0),
        ("clients", r#"we"ird\"#, 1.0),
        ("paths", "/a", 2.0),
        ("paths", "/b", 1.0),
    ] {
        let got = pick(
            &lines,
            "sliding_window_pass_total",
            &[("layer", layer), ("key", key), ("entry", "key")],
        );
        assert_eq!(got.len(), 1, "{layer} {key}: {text}");
        assert_eq!(got[0].value, want, "{layer} {key}");
    }
    let blocked = pick(
        &lines,
        "sliding_window_block_total",
        &[("layer", "clients"), ("key", "x")],
    );
    assert_eq!(blocked[0].value, 1.0);
    assert_eq!(
        pick(
            &lines,
            "sliding_window_pass_total",
            &[("layer", "clients"), ("entry", "missing")]
        )[0]
        .value,
        1.0
    );
    // One histogram per layer: 5 completed requests of 3 ms, 3 of none.
    let client_buckets = buckets(&lines, &[("layer", "clients")]);
    assert_eq!(client_buckets.last(), Some(&("+Inf".to_owned(), 5.0)));
    assert_eq!(client_buckets[1], ("0.0025".to_owned(), 0.0));
    assert_eq!(client_buckets[2], ("0.005".to_owned(), 5.0));
    let path_buckets = buckets(&lines, &[("layer", "paths")]);
    assert_eq!(path_buckets[0], ("0.001".to_owned(), 3.0));
    // Every sample has its layer.
    assert!(
        lines.iter().all(|l| l.labels.contains_key("layer")),
        "{text}"
    );
}

#[test]
#[should_panic(expected = "every joined collector needs a name")]
fn joining_an_unnamed_collector_is_refused() {
    let a = SlidingWindowLayer::qps(1).handle().collector().layer("a");
    let _ = a.join(SlidingWindowLayer::qps(1).handle().collector());
}

#[test]
#[should_panic(expected = "two joined collectors are named \"a\"")]
fn joining_two_layers_of_one_name_is_refused() {
    let a = SlidingWindowLayer::qps(1).handle().collector().layer("a");
    let _ = a.join(SlidingWindowLayer::qps(1).handle().collector().layer("a"));
}

#[test]
#[should_panic(expected = "collector_with_rt_buckets: bounds must increase")]
fn histogram_bounds_that_do_not_increase_are_refused() {
    let layer = SlidingWindowLayer::qps(1);
    let _ = layer.handle().collector_with_rt_buckets(&[0.5, 0.1]);
}

#[test]
#[should_panic(expected = "already counts with the bounds [0.001")]
fn a_layers_histogram_bounds_cannot_change() {
    let layer = SlidingWindowLayer::qps(1);
    let _first = layer.handle().collector();
    let _ = layer.handle().collector_with_rt_buckets(&[0.5, 1.0]);
}

/// Chosen bounds are the histogram's, and the re-exported crate is the one
/// the collector registers in.
#[tokio::test]
async fn chosen_histogram_bounds() {
    use tower_sliding_window::export::prometheus_client as client;

    let clock = clock();
    let (app, stats) = timed_app(&clock);
    let collector = stats.collector_with_rt_buckets(&[0.002, 0.004]);
    // A second collector of the layer shares the bounds.
    let again = stats.collector().totals_only();
    let mut registry = client::registry::Registry::default();
    registry.register_collector(Box::new(collector));
    registry.register_collector(Box::new(again.layer("again")));
    for ms in [1, 2, 3, 4, 5] {
        send(&app, req(&format!("/ms/{ms}"))).await;
    }
    let mut text = String::new();
    client::encoding::text::encode(&mut text, &registry).unwrap();
    let lines = lines(&text);
    let want: Vec<(String, f64)> = [("0.002", 2.0), ("0.004", 4.0), ("+Inf", 5.0)]
        .iter()
        .map(|(l, v)| (l.to_string(), *v))
        .collect();
    let unnamed: Vec<&Line> = pick(&lines, "sliding_window_response_time_seconds_bucket", &[])
        .into_iter()
        .filter(|l| !l.labels.contains_key("layer"))
        .collect();
    let unnamed: Vec<(String, f64)> = unnamed
        .iter()
        .map(|l| (l.labels["le"].clone(), l.value))
        .collect();
    assert_eq!(unnamed, want, "{text}");
    assert_eq!(buckets(&lines, &[("layer", "again")]), want, "{text}");
}

type PairKey = (Option<std::net::IpAddr>, String);

/// A key made of the client's address (from `x-client`, if it parses) and
/// the path: the collector labels it part by part.
#[tokio::test]
async fn a_tuple_key_is_exported() {
    let layer = SlidingWindowLayer::qps(2).key(|parts: &http::request::Parts| -> PairKey {
        let ip = parts
            .headers
            .get("x-client")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        (ip, parts.uri.path().to_owned())
    });
    let stats: StatsHandle<PairKey> = layer.handle();
    let app = Router::new()
        .route("/a", routing::get(|| async { "ok" }))
        .route("/a,b", routing::get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..3 {
        send(&app, req_with("/a", "x-client", "10.0.0.1")).await;
    }
    send(&app, req_with("/a", "x-client", "::1")).await;
    send(&app, req("/a")).await;
    send(&app, req_with("/a,b", "x-client", "10.0.0.1")).await;

    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let (text, samples) = scrape(&registry);
    for (label, pass, block) in [
        ("10.0.0.1, /a", 2.0, 1.0),
        ("::1, /a", 1.0, 0.0),
        ("-, /a", 1.0, 0.0),
        ("10.0.0.1, /a\\,b", 1.0, 0.0),
    ] {
        assert_eq!(
            get(&samples, "sliding_window_pass", label, "key"),
            pass,
            "{text}"
        );
        assert_eq!(get(&samples, "sliding_window_block", label, "key"), block);
    }
}

/// Keys change rank, lose their series, are evicted and come back, round
/// after round: between any two scrapes, the increases of every series
/// (as Prometheus's `increase()` sums them) are exactly the layer's, and
/// `other` never goes backwards.
#[tokio::test]
async fn series_that_come_and_go_account_for_every_request() {
    let clock = clock();
    let (app, stats) = app(&clock, 1_000, 4, Duration::from_millis(1));
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector().top_keys(2)));
    let mut totals = Registry::default();
    totals.register_collector(Box::new(stats.collector().totals_only()));
    stats.set_limit(key("ruled"), 1_000);

    let (_, mut before) = scrape(&registry);
    let (_, mut totals_before) = scrape(&totals);
    let (mut overflowed, mut changes, mut last_set) = (false, 0, None);
    for round in 0..12u64 {
        // Each round a different pair of keys is busiest; some rounds let
        // every key go idle, so that new keys evict them.
        for (i, tenant) in ["k0", "k1", "k2", "k3", "k4", "k5", "ruled"]
            .iter()
            .enumerate()
        {
            let i = i as u64;
            let n = (round * 7 + i * 3) % 6 + if (round + i) % 5 == 0 { 8 } else { 0 };
            for _ in 0..n {
                send(&app, req_with("/", "x-tenant", tenant)).await;
            }
            if round % 3 == 2 && i % 2 == 1 {
                send(&app, req_with("/fail", "x-tenant", tenant)).await;
            }
        }
        send(&app, req("/")).await;
        if round % 4 == 3 {
            clock.advance(Duration::from_secs(3));
        }
        let (text, after) = scrape(&registry);
        let (_, totals_after) = scrape(&totals);
        let mut metrics = COUNTERS.to_vec();
        metrics.push("sliding_window_response_seconds");
        for metric in metrics {
            let want = get(&totals_after, metric, "", "") - get(&totals_before, metric, "", "");
            let got = increase(&before, &after, metric);
            assert!(
                (got - want).abs() < 1e-9,
                "round {round}, {metric}: the series rose by {got}, the layer by {want}\n{text}"
            );
            assert!(
                get(&after, metric, "", "other") >= get(&before, metric, "", "other"),
                "round {round}, {metric}"
            );
        }
        let keyed = after
            .keys()
            .filter(|(m, _, e)| m == "sliding_window_pass" && e == "key")
            .count();
        assert!(keyed <= 3, "two busiest and the ruled key: {text}");
        overflowed |= get(&after, "sliding_window_pass", "", "overflow") > 0.0;
        let mut with_series: Vec<String> = after
            .keys()
            .filter(|(m, _, e)| m == "sliding_window_pass" && e == "key")
            .map(|(_, k, _)| k.clone())
            .collect();
        with_series.sort_unstable();
        if last_set.as_ref() != Some(&with_series) {
            changes += 1;
        }
        last_set = Some(with_series);
        before = after;
        totals_before = totals_after;
    }
    assert!(overflowed, "the table filled up at some point");
    assert!(
        changes >= 4,
        "the keys with a series changed {changes} times"
    );
}

#[tokio::test]
async fn a_system_rule_exports_its_refusals_per_check_and_its_cpu() {
    use tower_sliding_window::system::SystemRule;

    let layer = SlidingWindowLayer::qps(100)
        .clock(clock())
        .system(SystemRule::bbr().max_qps(2).cpu_source(|| 0.375));
    let stats = layer.handle();
    let app = Router::new()
        .route("/", routing::get(|| async { "ok" }))
        .layer(layer);
    for expected in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::SERVICE_UNAVAILABLE,
    ] {
        assert_eq!(send(&app, req("/")).await.status, expected);
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(stats.collector().layer("api")));
    let (text, _) = exposition(&registry);
    for line in [
        r#"sliding_window_system_refusals_total{layer="api",check="qps"} 1"#,
        r#"sliding_window_system_refusals_total{layer="api",check="bbr"} 0"#,
        r#"sliding_window_system_cpu{layer="api"} 0.375"#,
        r#"sliding_window_system_in_flight{layer="api"} 0"#,
        r#"sliding_window_system_max_in_flight{layer="api"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    // A layer without a system rule writes none of these.
    let plain = SlidingWindowLayer::qps(100).handle();
    let mut registry = Registry::default();
    registry.register_collector(Box::new(plain.collector()));
    let (text, _) = exposition(&registry);
    assert!(!text.contains("sliding_window_system"), "{text}");
}
