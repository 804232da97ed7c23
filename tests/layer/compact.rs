//! The compact key tier (`SlidingWindowLayer::compact`): the same admission
//! as a full key (a differential property test through both layers), exact
//! under real threads, bounded under floods of distinct keys, the settings
//! it refuses, and the handle's reads and limits.

use crate::support;

use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, Request, Response, StatusCode};
use proptest::prelude::*;
use tower::{service_fn, Layer, Service};
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::clock::{CachedClock, Clock, ManualClock};
use tower_sliding_window::{HeaderKey, SlidingWindowLayer, Snapshot, StatsHandle};

use support::{clock, req_with};

const KEY_HEADER: &str = "x-key";

fn keyed(limit: u64) -> SlidingWindowLayer<HeaderKey> {
    SlidingWindowLayer::qps(limit).key(HeaderKey::new(HeaderName::from_static(KEY_HEADER)))
}

fn key(name: &str) -> Option<String> {
    Some(name.to_owned())
}

pub(super) type Inner = tower::util::ServiceFn<
    fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
>;

pub(super) fn inner() -> Inner {
    fn ok(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
    service_fn(ok as fn(_) -> _)
}

/// A request of `key` (`None`: without the header).
fn request(key: Option<&str>) -> Request<Body> {
    match key {
        Some(key) => req_with("/", KEY_HEADER, key),
        None => Request::get("/").body(Body::empty()).unwrap(),
    }
}

/// Sends one request through `service` outside any runtime (the inner
/// service answers at once; nothing waits) and returns its status and
/// headers.
fn call<S, B>(service: &mut S, key: Option<&str>) -> (StatusCode, Vec<(String, String)>)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let response = tokio_test::block_on(service.call(request(key))).unwrap();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = value.to_str().unwrap();
            (name.as_str().to_owned(), without_tags(value))
        })
        .collect();
    headers.sort();
    (response.status(), headers)
}

/// `value` with every policy tag (`p-` and 8 hex digits: a keyed hash,
/// random per layer) replaced by `p-TAG`, so two layers' fields compare.
fn without_tags(value: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find("p-") {
        out.push_str(&rest[..at + 2]);
        let after = &rest[at + 2..];
        let hex = after
            .chars()
            .take(8)
            .filter(|c| c.is_ascii_hexdigit())
            .count();
        if hex == 8 {
            out.push_str("TAG");
            rest = &after[8..];
        } else {
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The message of the panic `f` raises.
fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("the configuration panics");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn a_compact_key_is_limited_and_answered_as_a_full_key_is() {
    let clock = clock();
    let layer = keyed(2)
        .compact()
        .clock(clock.clone())
        .headers_on_pass(true);
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
    let (status, headers) = call(&mut service, Some("a"));
    assert_eq!(status, StatusCode::OK);
    assert!(headers.iter().any(|(n, _)| n == "ratelimit"), "{headers:?}");
    let (status, headers) = call(&mut service, Some("a"));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // The passes at 10 050 leave the window at 11 000: 950 ms, 1 s.
    assert!(
        headers.contains(&("retry-after".to_owned(), "1".to_owned())),
        "{headers:?}"
    );
    assert_eq!(call(&mut service, Some("b")).0, StatusCode::OK);
    let a = stats.snapshot(&key("a")).unwrap();
    assert_eq!((a.pass, a.block, a.limit), (2, 1, 2));
    // Nothing else is recorded for a compact key.
    assert_eq!(
        (a.success, a.exception, a.concurrency, a.waiting),
        (0, 0, 0, 0)
    );
    assert_eq!((a.avg_rt, a.min_rt), (None, None));
    assert!(stats.history(&key("a")).is_empty());
    assert!(stats.breakers(&key("a")).is_empty());
    clock.advance(Duration::from_millis(950));
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
}

#[test]
fn the_handle_reads_every_compact_key_and_changes_its_limits() {
    let clock = clock();
    let layer = keyed(3).compact().clock(clock.clone()).rule("vip", 5);
    let stats = layer.handle();
    assert!(stats.is_empty());
    let mut service = layer.layer(inner());
    for (name, n) in [("a", 1), ("b", 4), ("vip", 6)] {
        for _ in 0..n {
            call(&mut service, Some(name));
        }
    }
    let mut keys = stats.keys();
    keys.sort();
    assert_eq!(keys, vec![key("a"), key("b"), key("vip")]);
    assert_eq!(stats.len(), 3);
    let mut snapshots = stats.snapshots();
    snapshots.sort_by(|x, y| x.0.cmp(&y.0));
    let counts: Vec<(u64, u64, u64)> = snapshots
        .iter()
        .map(|(_, s)| (s.pass, s.block, s.limit))
        .collect();
    assert_eq!(counts, vec![(1, 0, 3), (3, 1, 3), (5, 1, 5)]);
    let mut visited = 0;
    stats.for_each(|k, s| {
        visited += 1;
        assert_eq!(Some(s), stats.snapshot(k));
    });
    assert_eq!(visited, 3);
    let total = stats.total();
    assert_eq!((total.pass, total.block, total.limit), (9, 2, 11));
    assert_eq!(stats.overflow(), Snapshot::default().with_limit_for_test(3));

    // A limit set at run time applies from the next request, against the
    // window as it is; removing it goes back to the default.
    stats.set_limit("b", 4);
    assert_eq!(call(&mut service, Some("b")).0, StatusCode::OK);
    assert_eq!(
        call(&mut service, Some("b")).0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(stats.remove_limit(&key("b")));
    assert!(!stats.remove_limit(&key("b")));
    let b = stats.snapshot(&key("b")).unwrap();
    assert_eq!((b.pass, b.block, b.limit), (4, 2, 3));
    assert_eq!(
        call(&mut service, Some("b")).0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Above what a compact window counts: the maximum, and no panic.
    stats.set_limit("a", 1_000_000);
    assert_eq!(stats.snapshot(&key("a")).unwrap().limit, 65_535);
}

/// `Snapshot` is non-exhaustive: the overflow's expected snapshot, built
/// from a default one.
trait WithLimit {
    fn with_limit_for_test(self, limit: u64) -> Snapshot;
}

impl WithLimit for Snapshot {
    fn with_limit_for_test(mut self, limit: u64) -> Snapshot {
        self.limit = limit;
        self
    }
}

#[test]
fn a_flood_of_distinct_keys_stays_within_max_keys_and_every_limit() {
    let clock = clock();
    let limit = 3;
    let layer = keyed(limit)
        .compact()
        .max_keys(64)
        .overflow_limit(2)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    // A client spends its allowance...
    for _ in 0..limit {
        assert_eq!(call(&mut service, Some("client")).0, StatusCode::OK);
    }
    let (_, refused) = call(&mut service, Some("client"));
    // ...then 5 000 spoofed keys (addresses, random API keys) arrive in the
    // same window, each passing once if it can.
    let mut passed = 0;
    for i in 0..5_000 {
        clock.set(10_050 + i / 10);
        let name = format!("10.{}.{}.{}", i / 65_536, (i / 256) % 256, i % 256);
        if call(&mut service, Some(&name)).0 == StatusCode::OK {
            passed += 1;
        }
        assert!(stats.len() <= 64 + 1, "{} entries", stats.len());
    }
    // Every key that found a slot passed once; the rest shared the
    // overflow entry, which let 2 through.
    assert_eq!(passed, 63 + 2);
    assert_eq!(stats.overflow().pass, 2);
    // The client was never evicted (its passes are in the window): it is
    // still refused, as before the flood, and no key passed twice.
    let (status, after) = call(&mut service, Some("client"));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry = |headers: &[(String, String)]| {
        headers
            .iter()
            .find(|(n, _)| n == "retry-after")
            .map(|(_, v)| v.clone())
    };
    assert_eq!(retry(&after), retry(&refused));
    assert_eq!(stats.snapshot(&key("client")).unwrap().pass, limit);
    stats.for_each(|k, s| assert!(s.pass <= limit, "{k:?}: {s:?}"));
    // A window after its last pass the client may be evicted, and comes
    // back with a fresh allowance only then.
    clock.set(11_600);
    for i in 0..10 {
        call(&mut service, Some(&format!("late-{i}")));
    }
    assert!(stats.len() <= 64 + 1);
    assert_eq!(call(&mut service, Some("client")).0, StatusCode::OK);
}

#[test]
fn frozen_clock_real_threads_exactly_the_limit_passes_per_key() {
    let limit = 50;
    let layer = keyed(limit)
        .compact()
        .strict()
        .clock(ManualClock::new(10_050));
    let stats = layer.handle();
    let passed = passes_from_threads(layer.layer(inner()), |_, _, _| {});
    assert_exactly_the_limit_passed(&stats, &passed, limit);
}

/// Keys of [`passes_from_threads`].
const THREAD_KEYS: usize = 8;

/// Requests each key is sent by [`passes_from_threads`]: 4 threads, 40
/// rounds each.
const THREAD_SENDS: u64 = 160;

/// Key `i` of [`passes_from_threads`]: `k0`, `k2`... short enough to be
/// held in the slot's own words (and passed without the group's lock),
/// the odd ones 90 bytes long (held beside the slots, compared under the
/// group's lock).
fn thread_key(i: usize) -> String {
    if i % 2 == 0 {
        return format!("k{i}");
    }
    format!("k{i}-{}", "x".repeat(87))
}

/// Sends [`THREAD_SENDS`] requests for each of the keys [`thread_key`] 0
/// to 7 from four threads at once (each thread 40 rounds over every key)
/// through clones of `service`; `refused` sees the key, status and headers
/// of every answer other than 200. The passes per key.
fn passes_from_threads<S>(
    service: S,
    refused: fn(&str, StatusCode, &[(String, String)]),
) -> Vec<u64>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let keys: Vec<String> = (0..THREAD_KEYS).map(thread_key).collect();
    let passed: Arc<Vec<AtomicU64>> =
        Arc::new((0..keys.len()).map(|_| AtomicU64::new(0)).collect());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mut service = service.clone();
            let keys = keys.clone();
            let passed = Arc::clone(&passed);
            thread::spawn(move || {
                for _ in 0..40 {
                    for (i, name) in keys.iter().enumerate() {
                        let (status, headers) = call(&mut service, Some(name));
                        if status == StatusCode::OK {
                            passed[i].fetch_add(1, Ordering::Relaxed);
                        } else {
                            refused(name, status, &headers);
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    passed.iter().map(|p| p.load(Ordering::Relaxed)).collect()
}

/// Header clients turning over a small table under real threads, as
/// address clients do in `compact_peer.rs`: half of each burst's keys
/// are short enough to pass without the group's lock, the other half 90
/// bytes long (held beside the slots, compared under the lock), so that
/// long keys evict short ones and the other way round while passes
/// without the lock run. Every client that found a slot passes exactly the
/// limit in its burst.
#[test]
fn header_clients_turning_over_the_table_under_real_threads_pass_exactly_the_limit() {
    let limit = 5;
    let clock = ManualClock::new(1_000_000);
    let layer = keyed(limit).compact().max_keys(16).clock(clock.clone());
    let stats = layer.handle();
    super::compact_peer::clients_turning_over(
        layer.layer(inner()),
        &clock,
        limit,
        |burst, i| {
            if i % 2 == 0 {
                return format!("b{burst}-c{i}");
            }
            format!("b{burst}-c{i}-{}", "x".repeat(82))
        },
        |service, client| call(service, Some(client)).0,
        |client| stats.snapshot(&key(client)),
        || stats.len(),
    );
}

/// Exactly `limit` of [`passes_from_threads`]' requests passed for every
/// key, and the handle counts the rest as blocks.
fn assert_exactly_the_limit_passed(
    stats: &StatsHandle<Option<String>>,
    passed: &[u64],
    limit: u64,
) {
    assert_eq!(passed.len(), THREAD_KEYS);
    for (i, &passes) in passed.iter().enumerate() {
        let name = thread_key(i);
        assert_eq!(passes, limit, "{name}");
        let snapshot = stats.snapshot(&Some(name.clone())).unwrap();
        assert_eq!(
            (snapshot.pass, snapshot.block),
            (limit, THREAD_SENDS - limit),
            "{name}"
        );
    }
}

/// The cheaper clock the README suggests for a compact layer: its
/// millisecond is a cached load that an upkeep thread moves, so real
/// threads decide on readings the clock hands out while it runs. A minute's
/// window (two buckets of 30 s) keeps every pass of the test in it, so
/// exactly the limit passes per key, each refusal says when to retry, and
/// the handle counts what the threads saw.
///
/// A compact key counts the blocks of its newest bucket only, so the test
/// starts at least 10 s before the next bucket boundary (waiting for one
/// if the clock is in the last third of a bucket): a boundary crossed
/// while the threads send would leave the handle fewer blocks than they
/// saw. Every bucket starts at a multiple of 30 s of the clock's reading.
#[test]
fn a_compact_layer_on_a_cached_clock_admits_exactly_the_limit_on_real_threads() {
    let limit = 50;
    let clock = CachedClock::new();
    let into_bucket = clock.now_millis() % 30_000;
    if into_bucket > 20_000 {
        thread::sleep(Duration::from_millis(30_000 - into_bucket + 20));
    }
    let layer = keyed(limit)
        .window(Duration::from_secs(60), 2)
        .compact()
        .clock(clock);
    let stats = layer.handle();
    let passed = passes_from_threads(layer.layer(inner()), |name, status, headers| {
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{name}");
        let retry_after = headers
            .iter()
            .find(|(header, _)| header == "retry-after")
            .map(|(_, value)| value.parse::<u64>().unwrap());
        assert!(
            retry_after.is_some_and(|seconds| (1..=60).contains(&seconds)),
            "{name}: {headers:?}"
        );
    });
    assert_exactly_the_limit_passed(&stats, &passed, limit);
}

/// A change to a layer's configuration.
type Configure = fn(SlidingWindowLayer<HeaderKey>) -> SlidingWindowLayer<HeaderKey>;

#[test]
fn compact_refuses_each_setting_it_cannot_keep_in_either_order() {
    fn check(message: String, setting: &str) {
        assert!(
            message.contains(&format!("`{setting}`")) && message.contains("`compact`"),
            "{setting}: {message}"
        );
    }
    let cases: [(&str, Configure); 6] = [
        ("breaker", |l| l.breaker(Breaker::error_ratio(0.5))),
        ("system", |l| {
            l.system(tower_sliding_window::system::SystemRule::bbr().max_qps(100))
        }),
        ("max_concurrency", |l| l.max_concurrency(4)),
        ("warm_up", |l| l.warm_up(Duration::from_secs(10))),
        ("throttle", |l| l.throttle(Duration::from_millis(100))),
        ("prioritized", |l| {
            l.prioritized(|_: &http::request::Parts| true)
        }),
    ];
    for (setting, set) in cases {
        check(panic_message(|| drop(set(keyed(10)).compact())), setting);
        check(panic_message(|| drop(set(keyed(10).compact()))), setting);
        // With other settings in between, and on a clone.
        check(
            panic_message(|| drop(set(keyed(10).compact().strict().clone().max_keys(8)))),
            setting,
        );
    }
}

#[test]
fn compact_refuses_more_buckets_and_larger_limits_than_it_counts() {
    let window = Duration::from_secs(1);
    for message in [
        panic_message(|| drop(keyed(10).window(window, 20).compact())),
        panic_message(|| drop(keyed(10).compact().window(window, 20))),
    ] {
        assert!(
            message.contains("`sample_count`") && message.contains("`compact`"),
            "{message}"
        );
        assert!(message.contains("at most 10"), "{message}");
    }
    for message in [
        panic_message(|| drop(keyed(65_536).compact())),
        panic_message(|| drop(keyed(10).rule("a", 70_000).compact())),
        panic_message(|| drop(keyed(10).compact().rule("a", 70_000))),
        panic_message(|| drop(keyed(10).overflow_limit(65_536).compact())),
        panic_message(|| drop(keyed(10).compact().overflow_limit(65_536))),
    ] {
        assert!(
            message.contains("`compact`") && message.contains("65535"),
            "{message}"
        );
    }
    // A bucket longer than a compact window places (2^29 ms), either order.
    let long = Duration::from_millis(1 << 30);
    for message in [
        panic_message(|| drop(keyed(10).window(long, 1).compact())),
        panic_message(|| drop(keyed(10).compact().window(long, 1))),
    ] {
        assert!(
            message.contains("`compact`") && message.contains("`interval_ms`"),
            "{message}"
        );
    }
    // At the bounds, it builds.
    drop(
        keyed(65_535)
            .window(window, 10)
            .compact()
            .rule("a", 65_535)
            .handle(),
    );
}

#[cfg(feature = "prometheus")]
#[test]
fn the_collector_of_a_compact_layer_exports_the_layers_totals_without_keys() {
    let clock = clock();
    let layer = keyed(1).compact().clock(clock.clone());
    let stats = layer.handle();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let mut service = layer.layer(inner());
    for name in ["a", "a", "b", "c", "c", "c"] {
        call(&mut service, Some(name));
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let value = |metric: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(metric))
            .unwrap_or_else(|| panic!("no {metric} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("sliding_window_pass_total"), 3.0, "{text}");
    assert_eq!(value("sliding_window_block_total"), 3.0, "{text}");
    assert!(!text.contains("key="), "{text}");
    // A compact layer records no response times: the histogram is empty.
    assert!(!text.contains("response_time_seconds_bucket"), "{text}");
}

/// One step of the differential test, after the clock moved by `step_ms`
/// (forward mostly; now and then back, as a clock stepped back): a
/// request of key `key` (an index in `KEYS`), or a change of its limit at
/// run time.
#[derive(Debug, Clone)]
struct Step {
    key: usize,
    step_ms: i64,
    action: Action,
}

#[derive(Debug, Clone)]
enum Action {
    Request,
    SetLimit(u64),
    RemoveLimit,
}

/// The keys of the differential test; `None` sends no header.
/// Keys of the differential test: short ones, the longest text a compact
/// slot holds in place (64 bytes), one byte more (kept beside the slots,
/// and compared only under the group's lock), and the header's absence.
const KEYS: [Option<&str>; 7] = [
    Some("a"),
    Some("b"),
    Some("rule"),
    None,
    Some(""),
    Some("0123456789012345678901234567890123456789012345678901234567890123"),
    Some("01234567890123456789012345678901234567890123456789012345678901234"),
];

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let action = prop_oneof![
        12 => Just(Action::Request),
        1 => (0u64..6).prop_map(Action::SetLimit),
        1 => Just(Action::RemoveLimit),
    ];
    prop::collection::vec(
        (
            0..KEYS.len(),
            prop_oneof![
                6 => Just(0i64),
                6 => 0..40i64,
                6 => 0..400i64,
                1 => -3_000..0i64,
            ],
            action,
        )
            .prop_map(|(key, step_ms, action)| Step {
                key,
                step_ms,
                action,
            }),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// One random sequence of keys and clock readings through a full layer
    /// and a compact one with the same settings: the same status,
    /// `Retry-After`, RateLimit fields (and legacy fields) for every
    /// request, and the same counts at the end. Neither evicts (the table
    /// is far from full). With further windows (`limit_per`, none to two of
    /// 2 to 6 times the first window's interval), `Retry-After` is the
    /// longest wait among the refusing windows, `RateLimit-Policy` lists
    /// every window and `RateLimit` names the tightest, in both.
    #[test]
    fn a_compact_layer_answers_exactly_as_a_full_layer(
        limit in 1u64..6,
        rule in prop::option::of(0u64..8),
        further in prop::collection::btree_map(2u64..=6, 1u64..12, 0..=2),
        strict in any::<bool>(),
        (sample_count, bucket_ms) in (prop::sample::select(vec![1usize, 2, 4, 5, 10]), prop::sample::select(vec![10u64, 50, 100])),
        start in 0u64..5_000,
        steps in steps(),
    ) {
        // With further windows, the clock stays far from 0: a further
        // window of a compact key cannot start before the clock's time 0,
        // where a full key's may, under its skew (see `limit_per`).
        let start = if further.is_empty() { start } else { start + 1_000_000 };
        let clock = ManualClock::new(start);
        let interval = Duration::from_millis(sample_count as u64 * bucket_ms);
        let configure = |layer: SlidingWindowLayer<HeaderKey>| {
            let mut layer = layer
                .window(interval, sample_count)
                .clock(clock.clone())
                .headers_on_pass(true)
                .legacy_headers(true)
                .policy_name("p");
            if strict {
                layer = layer.strict();
            }
            if let Some(rule) = rule {
                layer = layer.rule("rule", rule);
            }
            for (&times, &limit) in &further {
                layer = layer.limit_per(interval * times as u32, limit);
            }
            layer
        };
        let full = configure(keyed(limit));
        let compact = configure(keyed(limit)).compact();
        let (full_stats, compact_stats) = (full.handle(), compact.handle());
        let mut full = full.layer(inner());
        let mut compact = compact.layer(inner());
        for (i, step) in steps.iter().enumerate() {
            let now = clock.now_millis();
            clock.set(now.saturating_add_signed(step.step_ms));
            let key = KEYS[step.key];
            let owned = key.map(str::to_owned);
            match step.action {
                Action::Request => {
                    let expected = call(&mut full, key);
                    let got = call(&mut compact, key);
                    prop_assert_eq!(&got, &expected, "request {} ({:?})", i, key);
                }
                Action::SetLimit(limit) => {
                    full_stats.set_limit(owned.clone(), limit);
                    compact_stats.set_limit(owned, limit);
                }
                Action::RemoveLimit => {
                    prop_assert_eq!(
                        compact_stats.remove_limit(&owned),
                        full_stats.remove_limit(&owned)
                    );
                }
            }
        }
        // The same passes in every key's window (an idle key may have gone
        // from one table and not the other: both count as no passes), and
        // the same limit where both hold the key.
        for key in KEYS {
            let key = key.map(str::to_owned);
            let (f, c) = (full_stats.snapshot(&key), compact_stats.snapshot(&key));
            let pass = |s: Option<Snapshot>| s.map_or(0, |s| s.pass);
            prop_assert_eq!(pass(f), pass(c), "{:?}", key);
            if let (Some(f), Some(c)) = (f, c) {
                prop_assert_eq!(f.limit, c.limit, "{:?}", key);
            }
            if let (Some(f), Some(c)) = (full_stats.windows(&key), compact_stats.windows(&key)) {
                prop_assert_eq!(f, c, "{:?}", key);
            }
        }
    }
}

/// The shared store keeps its window in Redis and falls back on the
/// replica's own full window: refused on a compact layer, in either order.
/// (Port 9 on loopback: the lazy store never connects in this test.)
#[cfg(feature = "redis")]
#[tokio::test]
async fn compact_refuses_a_shared_store_in_either_order() {
    use tower_sliding_window::store::RedisStore;
    let store = || RedisStore::connect_lazy("redis://127.0.0.1:9/").unwrap();
    for message in [
        panic_message(|| drop(keyed(10).store(store()).compact())),
        panic_message(|| drop(keyed(10).compact().store(store()))),
    ] {
        assert!(
            message.contains("`store`") && message.contains("`compact`"),
            "{message}"
        );
    }
}

#[cfg(feature = "dashboard")]
#[test]
fn the_dashboard_lists_a_compact_layers_keys_and_total() {
    use tower_sliding_window::dashboard;
    let layer = keyed(2).compact().clock(clock());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    for name in ["a", "a", "a", "b"] {
        call(&mut service, Some(name));
    }
    let board = dashboard::router(stats.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let answer = runtime.block_on(support::send(&board, support::req("/stats")));
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let s: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(s["total"], serde_json::to_value(stats.total()).unwrap());
    assert_eq!(
        (s["total"]["pass"].as_u64(), s["total"]["block"].as_u64()),
        (Some(3), Some(1))
    );
    let keys = s["keys"]["key"].as_array().expect("a key column");
    assert_eq!(keys.len(), 2, "{s}");
    let passes: u64 = s["keys"]["pass"]
        .as_array()
        .expect("a pass column")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(passes, 3, "{s}");
}

#[test]
fn a_compact_global_limit_admits_exactly_its_limit() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(3).compact().clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let statuses: Vec<StatusCode> = (0..5).map(|_| call(&mut service, None).0).collect();
    assert_eq!(statuses, support::ok_then_429(3, 2));
    let snapshot = stats.snapshot(&()).unwrap();
    assert_eq!((snapshot.pass, snapshot.block, snapshot.limit), (3, 2, 3));
    assert_eq!(stats.len(), 1);
    clock.advance(Duration::from_secs(1));
    assert_eq!(call(&mut service, None).0, StatusCode::OK);
}

/// Under `strict`, the bucket that has just left the window still counts:
/// a key whose passes are only there is not idle, and a flood cannot evict
/// it to hand it a fresh allowance.
#[test]
fn under_strict_a_flood_never_evicts_a_key_whose_passes_only_strict_counts() {
    let clock = clock();
    let limit = 2;
    let layer = keyed(limit)
        .compact()
        .strict()
        .max_keys(16)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    for _ in 0..limit {
        assert_eq!(call(&mut service, Some("client")).0, StatusCode::OK);
    }
    // 11 050: the passes' bucket [10 000, 10 100) has left the window, and
    // only `strict` counts it; every other key of the table is idle.
    clock.set(11_050);
    for i in 0..2_000 {
        call(&mut service, Some(&format!("spoofed-{i}")));
    }
    assert!(stats.len() <= 16 + 1);
    assert_eq!(
        call(&mut service, Some("client")).0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Once it has left the strict span too, the client passes again.
    clock.set(11_100);
    assert_eq!(call(&mut service, Some("client")).0, StatusCode::OK);
}

#[test]
fn a_compact_pass_hands_on_the_inner_body_error_and_rate_limit_fields() {
    use http_body_util::BodyExt;

    // The inner service answers "hello", or fails for the path `/fail`.
    let inner = service_fn(|request: Request<Body>| async move {
        if request.uri().path() == "/fail" {
            return Err("the inner service failed");
        }
        Ok(Response::new(Body::from("hello")))
    });
    let layer = keyed(2)
        .compact()
        .clock(clock())
        .headers_on_pass(true)
        .legacy_headers(true)
        .track_body();
    let stats = layer.handle();
    let mut service = layer.layer(inner);
    let response = tokio_test::block_on(service.call(request(Some("a")))).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let names: Vec<&str> = response.headers().keys().map(|n| n.as_str()).collect();
    for name in ["ratelimit", "ratelimit-policy", "x-ratelimit-remaining"] {
        assert!(names.contains(&name), "{name} missing: {names:?}");
    }
    assert_eq!(
        response.headers()["x-ratelimit-remaining"]
            .to_str()
            .unwrap(),
        "1"
    );
    let body = tokio_test::block_on(response.into_body().collect()).unwrap();
    assert_eq!(body.to_bytes(), "hello");
    let failing = req_with("/fail", KEY_HEADER, "a");
    let error = tokio_test::block_on(service.call(failing)).unwrap_err();
    assert_eq!(error, "the inner service failed");
    // Both passed, and a third is refused; nothing else is recorded.
    let a = stats.snapshot(&key("a")).unwrap();
    assert_eq!((a.pass, a.success, a.exception), (2, 0, 0));
    let response = tokio_test::block_on(service.call(request(Some("a")))).unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

const MINUTE: Duration = Duration::from_secs(60);

/// Further windows (`limit_per`) on a compact layer obey what a compact
/// window counts: limits above 65 535 (a window's default or a key's own)
/// and buckets longer than 2^29 ms are refused, naming the setting, in
/// either order.
#[test]
fn compact_limit_per_refuses_what_a_compact_window_cannot_count() {
    for message in [
        panic_message(|| drop(keyed(10).limit_per(MINUTE, 70_000).compact())),
        panic_message(|| drop(keyed(10).compact().limit_per(MINUTE, 70_000))),
    ] {
        assert!(
            message.contains("`limit_per`")
                && message.contains("`compact`")
                && message.contains("65535"),
            "{message}"
        );
    }
    for message in [
        panic_message(|| {
            drop(
                keyed(10)
                    .limit_per(MINUTE, 5)
                    .rule_per("a", MINUTE, 70_000)
                    .compact(),
            )
        }),
        panic_message(|| {
            drop(
                keyed(10)
                    .compact()
                    .limit_per(MINUTE, 5)
                    .rule_per("a", MINUTE, 70_000),
            )
        }),
    ] {
        assert!(message.contains("rule_per"), "{message}");
        assert!(
            message.contains("`compact`") && message.contains("65535"),
            "{message}"
        );
    }
    // Ten buckets of 2^30 ms: longer than a compact window places.
    let long = Duration::from_millis(10 << 30);
    for message in [
        panic_message(|| drop(keyed(10).limit_per(long, 5).compact())),
        panic_message(|| drop(keyed(10).compact().limit_per(long, 5))),
    ] {
        assert!(
            message.contains("`limit_per`") && message.contains("`compact`"),
            "{message}"
        );
        assert!(message.contains("interval_ms"), "{message}");
    }
    // At the bounds, it builds.
    drop(
        keyed(10)
            .compact()
            .limit_per(MINUTE, 65_535)
            .rule_per("a", MINUTE, 65_535)
            .handle(),
    );
}

/// Real threads, frozen clock, a compact layer with two windows: of 160
/// requests per key, exactly the tighter limit pass, and each window holds
/// exactly the passes of the requests admitted (a refusal by either is
/// charged to none), whichever window is the tighter.
#[test]
fn frozen_clock_real_threads_each_window_of_a_compact_key_holds_exactly_what_was_admitted() {
    for (first, further) in [(30u64, 50u64), (50, 30), (40, 40)] {
        let layer = keyed(first)
            .compact()
            .limit_per(MINUTE, further)
            .clock(ManualClock::new(10_050));
        let stats = layer.handle();
        let passed = passes_from_threads(layer.layer(inner()), |_, _, _| {});
        let limit = first.min(further);
        for (i, &passes) in passed.iter().enumerate() {
            let name = &thread_key(i);
            assert_eq!(passes, limit, "{name}");
            let windows = stats.windows(&key(name)).unwrap();
            let counts: Vec<(Duration, u64, u64)> = windows
                .iter()
                .map(|w| (w.interval, w.limit, w.pass))
                .collect();
            assert_eq!(
                counts,
                vec![
                    (Duration::from_secs(1), first, limit),
                    (MINUTE, further, limit)
                ],
                "{name}"
            );
            let snapshot = stats.snapshot(&key(name)).unwrap();
            assert_eq!(snapshot.block, THREAD_SENDS - limit, "{name}");
        }
    }
}

/// A compact key's own limits in further windows (`rule_per`,
/// `set_limit_per`, `remove_limit_per`) apply from its next request, and
/// the handle reads them (`limits_per`, `windows`).
#[test]
fn per_key_limits_of_further_windows_apply_to_compact_keys() {
    let clock = clock();
    let layer = keyed(100)
        .compact()
        .limit_per(MINUTE, 3)
        .rule_per("a", MINUTE, 1)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
    let refused = call(&mut service, Some("a"));
    assert_eq!(refused.0, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        refused
            .1
            .contains(&("retry-after".to_owned(), "56".to_owned())),
        "{refused:?}"
    );
    assert_eq!(
        stats.limits_per(&key("a")),
        vec![(Duration::from_secs(1), 100), (MINUTE, 1)]
    );
    // Raised for "a" from its next request; "b" runs on the default (3).
    stats.set_limit_per("a", MINUTE, 2).unwrap();
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
    assert_eq!(
        call(&mut service, Some("a")).0,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(call(&mut service, Some("b")).0, StatusCode::OK);
    }
    assert_eq!(
        call(&mut service, Some("b")).0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(stats.remove_limit_per("a", MINUTE).unwrap());
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
    assert_eq!(
        call(&mut service, Some("a")).0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let windows = stats.windows(&key("a")).unwrap();
    assert_eq!(
        windows
            .iter()
            .map(|w| (w.interval, w.limit, w.pass))
            .collect::<Vec<_>>(),
        vec![(Duration::from_secs(1), 100, 3), (MINUTE, 3, 3)]
    );
    // Above what a compact window counts: taken as 65 535.
    stats.set_limit_per("b", MINUTE, 100_000).unwrap();
    assert_eq!(stats.limits_per(&key("b"))[1], (MINUTE, 65_535));
}

/// A compact key may be evicted only when it is idle in every window: a
/// key whose first window is empty but whose further window still holds a
/// pass keeps its slot (a new key goes to the overflow window), and gives
/// it up once that pass has left too.
#[test]
fn a_compact_key_is_evicted_only_when_idle_in_every_window() {
    let clock = clock();
    let layer = keyed(5)
        .compact()
        .max_keys(1)
        .limit_per(MINUTE, 2)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    assert_eq!(call(&mut service, Some("a")).0, StatusCode::OK);
    clock.advance(Duration::from_secs(2));
    // "a" is idle in its first window, not in its minute's.
    assert_eq!(call(&mut service, Some("b")).0, StatusCode::OK);
    assert!(
        stats.windows(&key("b")).is_none(),
        "b is on the overflow window"
    );
    assert_eq!(stats.windows(&key("a")).unwrap()[1].pass, 1);
    clock.advance(MINUTE);
    assert_eq!(call(&mut service, Some("c")).0, StatusCode::OK);
    assert!(stats.windows(&key("a")).is_none(), "a was evicted");
    let windows = stats.windows(&key("c")).unwrap();
    assert_eq!((windows[0].pass, windows[1].pass), (1, 1));
}

/// Sends one request with `x-key` set to the raw bytes `value` and returns
/// its status.
fn call_bytes<S, B>(service: &mut S, value: &[u8]) -> StatusCode
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let request = Request::get("/")
        .header(KEY_HEADER, http::HeaderValue::from_bytes(value).unwrap())
        .body(Body::empty())
        .unwrap();
    tokio_test::block_on(service.call(request))
        .unwrap()
        .status()
}

/// Header values around the lengths a compact slot holds in place (64
/// bytes of text) and the longest key kept verbatim (256 bytes, then a
/// digest form): empty, 64, 65, 70, 71 and 256 bytes, 257 and 16 KiB (digest
/// forms), multi-byte characters ending at and across the 64-byte line (and
/// the 70-byte line slots held before), and bytes that are not UTF-8
/// (escaped after DEL, short and past 256 bytes).
fn hostile_values() -> Vec<Vec<u8>> {
    let mut values: Vec<Vec<u8>> = [0usize, 1, 63, 64, 65, 69, 70, 71, 72, 255, 256, 257]
        .into_iter()
        .map(|len| vec![b'k'; len])
        .collect();
    values.push(vec![b'x'; 16 * 1024]);
    // 32 and 35 two-byte characters: 64 and 70 bytes; one more byte, and
    // the last character ends past the line.
    values.push("é".repeat(32).into_bytes());
    values.push(format!("k{}", "é".repeat(32)).into_bytes());
    values.push("é".repeat(35).into_bytes());
    values.push(format!("k{}", "é".repeat(35)).into_bytes());
    values.push("€".repeat(24).into_bytes());
    values.push(b"acme\xff".to_vec());
    values.push(b"acme\xfe".to_vec());
    values.push(vec![0xff; 60]);
    values.push(vec![0x80; 200]);
    values
}

/// Keys of every length a header can give, on a compact layer (whose slots
/// hold a header key's text in place when short, else in a block of its
/// own): each is a key of its own, limited on its own, and reads back from
/// the handle exactly as a full layer keys it.
#[test]
fn hostile_header_keys_are_kept_as_a_full_layer_keeps_them() {
    let clock = clock();
    let compact = keyed(1).compact().clock(clock.clone());
    let full = keyed(1).clock(clock.clone());
    let (compact_stats, full_stats) = (compact.handle(), full.handle());
    let mut compact = compact.layer(inner());
    let mut full = full.layer(inner());
    let values = hostile_values();
    for value in &values {
        assert_eq!(call_bytes(&mut compact, value), StatusCode::OK, "{value:?}");
        assert_eq!(call_bytes(&mut full, value), StatusCode::OK, "{value:?}");
    }
    assert_eq!(call(&mut compact, None).0, StatusCode::OK);
    assert_eq!(call(&mut full, None).0, StatusCode::OK);
    // Each at its limit: a second request of each is refused.
    for value in &values {
        assert_eq!(
            call_bytes(&mut compact, value),
            StatusCode::TOO_MANY_REQUESTS,
            "{value:?}"
        );
    }
    assert_eq!(call(&mut compact, None).0, StatusCode::TOO_MANY_REQUESTS);
    let mut compact_keys = compact_stats.keys();
    let mut full_keys = full_stats.keys();
    compact_keys.sort();
    full_keys.sort();
    assert_eq!(compact_keys.len(), values.len() + 1);
    assert_eq!(compact_keys, full_keys);
    for key in &compact_keys {
        let snapshot = compact_stats.snapshot(key).expect("the key reads back");
        assert_eq!((snapshot.pass, snapshot.block), (1, 1), "{key:?}");
    }
    // The forms the key docs give, found by the handle in either layer.
    for text in ["", &"k".repeat(70), &"k".repeat(71), "\x7facme\\xff"] {
        let key = Some(text.to_owned());
        assert!(compact_stats.snapshot(&key).is_some(), "{text:?}");
        assert_eq!(
            compact_stats.snapshot(&key).map(|s| s.pass),
            full_stats.snapshot(&key).map(|s| s.pass)
        );
    }
    // Own limits move hostile keys to the side map and back again.
    for key in &compact_keys {
        compact_stats.set_limit(key.clone(), 5);
        assert_eq!(compact_stats.snapshot(key).map(|s| s.pass), Some(1));
        assert!(compact_stats.remove_limit(key));
        assert_eq!(compact_stats.snapshot(key).map(|s| s.pass), Some(1));
    }
    let mut again = compact_stats.keys();
    again.sort();
    assert_eq!(again, compact_keys);
}

/// A small compact table flooded, window after window, with distinct keys
/// of every length (short ones held in their slot, long ones in a block of
/// their own, and digest forms): idle keys are evicted for new ones, and
/// every key the handle reads back is one that was sent, in the form a full
/// layer (holding every key, the oracle) gives it, with the passes the full
/// layer counts. Keys evicted long ago come back as new keys.
#[test]
fn a_flood_of_distinct_keys_of_every_length_reads_back_as_sent() {
    let clock = clock();
    let max_keys = 48;
    let compact = keyed(1)
        .compact()
        .max_keys(max_keys)
        .overflow_limit(65_535)
        .clock(clock.clone());
    let full = keyed(1).clock(clock.clone());
    let (stats, full_stats) = (compact.handle(), full.handle());
    let mut compact = compact.layer(inner());
    let mut full = full.layer(inner());
    let lengths = [0usize, 5, 64, 65, 70, 71, 150, 256, 300];
    // Distinct per (round, i), `lengths[i % 9]` bytes long (at least its
    // numbers), mostly two-byte characters.
    let name = |round: usize, i: usize| -> String {
        let head = format!("{round}-{i}-");
        let len = lengths[i % lengths.len()].max(head.len());
        let mut text = head;
        while text.len() + 2 <= len {
            text.push('é');
        }
        if text.len() < len {
            text.push('k');
        }
        text
    };
    for round in 0..6 {
        // A round a window (1 s) after the last: every key sent before is
        // idle, and may be evicted. Rounds 4 and 5 send the keys of rounds
        // 0 and 1 again.
        clock.set(20_000 + round as u64 * 2_000);
        for i in 0..200 {
            let name = name(round % 4, i);
            assert_eq!(call_bytes(&mut compact, name.as_bytes()), StatusCode::OK);
            assert_eq!(call_bytes(&mut full, name.as_bytes()), StatusCode::OK);
        }
        let held = stats.keys();
        assert!(held.len() <= max_keys, "round {round}: {} keys", held.len());
        let sent: std::collections::HashSet<Option<String>> =
            full_stats.keys().into_iter().collect();
        let mut seen = std::collections::HashSet::new();
        let mut of_this_round = 0;
        for key in held {
            assert!(sent.contains(&key), "round {round}: {key:?} was not sent");
            assert!(seen.insert(key.clone()), "{key:?} twice");
            let pass = stats.snapshot(&key).expect("a held key reads back").pass;
            let full_pass = full_stats.snapshot(&key).expect("sent").pass;
            assert_eq!(pass, full_pass, "round {round}: {key:?}");
            of_this_round += usize::from(pass == 1);
        }
        assert!(
            of_this_round >= max_keys / 2,
            "round {round}: {of_this_round} keys of the round held"
        );
    }
}
