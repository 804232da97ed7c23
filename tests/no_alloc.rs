//! The hot path allocates nothing, and what a node costs in memory.
//!
//! A counting global allocator tallies every allocation made by the current
//! thread (test threads run in parallel, so a global tally would pick up the
//! others). Each check warms up first, because the first use of the system
//! clock pins its process-wide anchor and an occupiable window allocates its
//! reservation ring on the first reservation; after that, recording,
//! admission and the scalar reads must not allocate at all, including across
//! bucket rotations.
//!
//! `cargo test --test no_alloc -- --nocapture` also prints the memory
//! figures of a `StatisticNode`.

use std::hint::black_box;
use std::mem::size_of;
use std::time::{Duration, Instant};

use tower_sliding_window::clock::{Clock, ManualClock, SystemClock};
use tower_sliding_window::flow::TryPass;
use tower_sliding_window::stat::{ArrayMetric, MetricBucket, StatisticNode};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[cfg(feature = "axum")]
use counting_alloc::Allocated;
use counting_alloc::{allocated_by, Counting, NOTHING};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Every recording, admission and scalar read of an `ArrayMetric`.
fn exercise_metric(m: &ArrayMetric, limit: u64) {
    let _ = black_box(m.try_pass(1, u64::MAX));
    let _ = black_box(m.try_pass(1, limit));
    let _ = black_box(m.try_pass(3, limit));
    m.add_pass(1);
    m.add_block(1);
    m.add_success(1);
    m.add_exception(1);
    m.add_occupied_pass(1);
    m.add_rt(Duration::from_micros(1_500));
    black_box((m.pass(), m.block(), m.success(), m.exception()));
    black_box((m.occupied_pass(), m.waiting(), m.max_success()));
    black_box((m.previous_window_pass(), m.previous_window_block()));
    black_box((m.rt(), m.min_rt(), m.window_pass(0)));
}

/// One request's bookkeeping on a node, plus the second window's reads.
fn exercise_node(node: &StatisticNode, limit: u64) {
    let admitted = node.try_pass(1, limit).is_pass();
    node.increase_concurrency();
    if admitted {
        node.add_rt_and_success(Duration::from_micros(800), 1);
    } else {
        node.increase_exception_qps(1);
    }
    node.decrease_concurrency();
    node.add_pass_request(1);
    node.increase_block_qps(1);
    black_box((node.pass_qps(), node.block_qps(), node.success_qps()));
    black_box((
        node.exception_qps(),
        node.total_qps(),
        node.max_success_qps(),
    ));
    black_box((node.avg_rt(), node.min_rt(), node.cur_concurrency()));
    black_box(node.waiting());
}

/// The minute window's scalar reads.
fn read_minute(node: &StatisticNode) {
    black_box((node.previous_pass_qps(), node.previous_block_qps()));
    black_box((
        node.total_request(),
        node.total_pass(),
        node.total_success(),
    ));
    black_box((node.total_exception(), node.block_request()));
}

/// Runs `f` repeatedly for at least `at_least` of real time.
fn for_at_least(at_least: Duration, mut f: impl FnMut()) {
    let start = Instant::now();
    while start.elapsed() < at_least {
        for _ in 0..1_000 {
            f();
        }
    }
}

#[test]
fn array_metric_on_the_system_clock_allocates_nothing() {
    let metric = ArrayMetric::new(10, 1000).expect("valid window");
    exercise_metric(&metric, 50);
    // 250 ms: at least two real bucket rotations inside the measurement.
    let ((), allocated) =
        allocated_by(|| for_at_least(Duration::from_millis(250), || exercise_metric(&metric, 50)));
    assert_eq!(allocated, NOTHING);
}

#[test]
fn array_metric_across_rotations_allocates_nothing() {
    let clock = ManualClock::new(1_000_000);
    let metric = ArrayMetric::with_clock(10, 1000, clock.clone()).expect("valid window");
    exercise_metric(&metric, 50);
    // 7 ms steps: a new bucket every 14 or 15 calls, whole windows slide out,
    // the cached sums of older buckets are rebuilt over and over. Then a
    // clock that steps back, and a long idle gap.
    let ((), allocated) = allocated_by(|| {
        for _ in 0..20_000 {
            exercise_metric(&metric, 50);
            clock.advance(Duration::from_millis(7));
        }
        clock.set(clock.now_millis() - 950);
        exercise_metric(&metric, 50);
        clock.advance(Duration::from_secs(3_600));
        exercise_metric(&metric, 50);
    });
    assert_eq!(allocated, NOTHING);
}

#[test]
fn statistic_node_request_allocates_nothing() {
    let node = StatisticNode::new();
    exercise_node(&node, 1_000);
    let ((), allocated) =
        allocated_by(|| for_at_least(Duration::from_millis(250), || exercise_node(&node, 1_000)));
    assert_eq!(allocated, NOTHING);
}

#[test]
fn statistic_node_across_rotations_allocates_nothing() {
    let clock = ManualClock::new(5_000_000);
    let node = StatisticNode::with_clock(clock.clone());
    exercise_node(&node, 200);
    let ((), allocated) = allocated_by(|| {
        // 13 ms steps through more than a minute: both windows rotate.
        for _ in 0..6_000 {
            exercise_node(&node, 200);
            clock.advance(Duration::from_millis(13));
        }
    });
    assert_eq!(allocated, NOTHING);
}

#[test]
fn statistic_node_minute_reads_allocate_nothing() {
    let clock = ManualClock::new(7_000_000);
    let node = StatisticNode::with_clock(clock.clone());
    exercise_node(&node, 500);
    read_minute(&node);
    let ((), allocated) = allocated_by(|| {
        // 170 ms steps through more than a minute, a request at each.
        for _ in 0..500 {
            exercise_node(&node, 500);
            read_minute(&node);
            clock.advance(Duration::from_millis(170));
        }
    });
    assert_eq!(allocated, NOTHING);
}

#[test]
fn borrowing_quota_allocates_only_the_reservation_ring_once() {
    let clock = ManualClock::new(2_000_000);
    let node = StatisticNode::with_clock(clock.clone());
    let ((), first) = allocated_by(|| node.add_waiting_request(clock.now_millis() + 300, 1));
    assert_eq!(first.count, 1, "the reservation ring, allocated lazily");
    let ((), allocated) = allocated_by(|| {
        for _ in 0..5_000 {
            let now = clock.now_millis();
            if let Some(wait) = node.try_occupy_next(now, 1, 1_000.0) {
                node.add_waiting_request(now + wait, 1);
                node.add_occupied_pass(1);
            }
            exercise_node(&node, 100);
            clock.advance(Duration::from_millis(11));
        }
    });
    assert_eq!(allocated, NOTHING);
}

#[test]
fn time_until_pass_allocates_nothing() {
    let metric = ArrayMetric::new(10, 1000).expect("valid window");
    for _ in 0..100 {
        metric.add_pass(1);
    }
    let _ = metric.time_until_pass(1, 10);
    let (wait, allocated) = allocated_by(|| metric.time_until_pass(1, 10));
    assert!(wait.is_some_and(|w| w > Duration::ZERO));
    assert_eq!(allocated, NOTHING);
}

#[test]
fn memory_per_statistic_node() {
    // Pin the clock's process-wide anchor first: it is not part of any node.
    let _ = SystemClock::new().now_millis();

    let bucket = size_of::<MetricBucket>();
    let (metric, metric_heap) = allocated_by(|| ArrayMetric::new(10, 1000));
    let metric = metric.expect("valid window");
    let (node, node_heap) = allocated_by(StatisticNode::new);
    let future = node.second_window().interval_ms() / 2;
    let ((), ring) = allocated_by(|| node.add_waiting_request(future, 1));
    let inline = size_of::<StatisticNode>() as u64;

    println!("MetricBucket: {bucket} bytes (one 64-byte cache line per slot with its stamp)");
    println!(
        "ArrayMetric (10 x 100 ms): {} bytes inline + {} bytes heap in {} allocations",
        size_of::<ArrayMetric>(),
        metric_heap.bytes,
        metric_heap.count,
    );
    println!(
        "StatisticNode: {inline} bytes inline + {} bytes heap in {} allocations \
         (second ring 10 buckets, minute ring 60 buckets) = {} bytes",
        node_heap.bytes,
        node_heap.count,
        inline + node_heap.bytes,
    );
    println!(
        "  + {} bytes in {} allocation on the first add_waiting_request (reservation ring) = {} bytes",
        ring.bytes,
        ring.count,
        inline + node_heap.bytes + ring.bytes,
    );

    assert!(bucket <= 64, "a MetricBucket must fit in a cache line");
    // 70 slots of one cache line each, plus small per-ring bookkeeping.
    assert!(node_heap.bytes >= 70 * 64, "{node_heap:?}");
    assert!(inline + node_heap.bytes <= 6 * 1024, "{node_heap:?}");
    assert!(ring.bytes >= 10 * 64 && ring.bytes <= 2 * 1024, "{ring:?}");

    // The documented formula (beside the `sample_count` cap in
    // `src/stat/leap_array.rs`): 80 bytes per second-window bucket, 64 per
    // minute-window bucket, 64 per reservation bucket once used.
    assert_eq!(node_heap.bytes, 80 * 10 + 64 * 60, "{node_heap:?}");
    assert_eq!(ring.bytes, 64 * 10, "{ring:?}");
    #[cfg(target_pointer_width = "64")]
    assert_eq!(
        inline + node_heap.bytes,
        4_952,
        "the figure in StatisticNode's docs"
    );
    let clock = ManualClock::new(0);
    let (largest, largest_heap) =
        allocated_by(|| StatisticNode::with_second_window(clock, 600, 60_000));
    largest.expect("600 is the largest sample count");
    assert_eq!(largest_heap.bytes, 80 * 600 + 64 * 60, "{largest_heap:?}");
    drop(metric);
}

/// Allocations of one request through `app` (built beforehand), on a
/// current-thread runtime, so every allocation lands on this thread; the
/// response must have `status`.
#[cfg(feature = "axum")]
fn request_allocations(
    app: &axum::Router,
    rt: &tokio::runtime::Runtime,
    uri: &str,
    status: http::StatusCode,
) -> Allocated {
    use tower::ServiceExt;
    let request = http::Request::get(uri)
        .body(axum::body::Body::empty())
        .expect("valid request");
    let app = app.clone();
    let (response, allocated) = allocated_by(|| rt.block_on(app.oneshot(request)));
    let response = response.expect("infallible");
    assert_eq!(response.status(), status);
    allocated
}

// `MatchedPathKey` built a `String` for every request.
#[cfg(feature = "axum")]
#[test]
fn matched_path_key_allocates_nothing_for_a_key_it_has_seen() {
    use axum::routing::get;
    use tower_sliding_window::{MatchedPathKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let router = || axum::Router::new().route("/users/{id}", get(|| async { "hi" }));
    let global = router().route_layer(SlidingWindowLayer::qps(1_000_000).clock(clock.clone()));
    let matched = router().route_layer(
        SlidingWindowLayer::qps(1_000_000)
            .key(MatchedPathKey)
            .clock(clock.clone()),
    );
    let by_closure = router().route_layer(
        SlidingWindowLayer::qps(1_000_000)
            .key(|p: &http::request::Parts| p.uri.path().to_owned())
            .clock(clock.clone()),
    );
    // Warm up: the first request for a key creates its entry.
    for app in [&global, &matched, &by_closure] {
        request_allocations(app, &rt, "/users/1", http::StatusCode::OK);
    }

    let baseline = request_allocations(&global, &rt, "/users/2", http::StatusCode::OK);
    let keyed = request_allocations(&matched, &rt, "/users/3", http::StatusCode::OK);
    let owned_key = request_allocations(&by_closure, &rt, "/users/1", http::StatusCode::OK);
    println!("allocations per request: global key {baseline:?}, MatchedPathKey {keyed:?}, closure {owned_key:?}");
    assert_eq!(
        keyed.count, baseline.count,
        "MatchedPathKey allocates beyond the global key's request"
    );
    // The harness sees a key's allocation: a closure building a `String`.
    assert!(
        owned_key.count > baseline.count,
        "{owned_key:?} vs {baseline:?}"
    );
}

#[test]
fn ip_keys_of_ipv6_clients_allocate_nothing() {
    use std::net::SocketAddr;
    use tower_sliding_window::key::{ForwardedIpKey, KeyExtractor, ToOwnedKey};
    use tower_sliding_window::PeerIpKey;

    let peer: SocketAddr = "[2001:db8:ffff::1]:443".parse().expect("address");
    let mut request = http::Request::get("/")
        .header(
            "x-forwarded-for",
            "2001:db8:6::6, [2001:db8:1:2:3:4:5:6]:80",
        )
        .body(())
        .expect("valid request");
    request.extensions_mut().insert(peer);
    let (parts, ()) = request.into_parts();
    let by_site = PeerIpKey.ipv6_prefix(56);
    let hops = ForwardedIpKey::trusted_hops(1).ipv6_prefix(48);
    let proxies = ForwardedIpKey::trusted_proxies([peer.ip()]);

    let (keys, allocated) = allocated_by(|| {
        (
            PeerIpKey.visit(&parts, ToOwnedKey),
            by_site.visit(&parts, ToOwnedKey),
            hops.visit(&parts, ToOwnedKey),
            proxies.visit(&parts, ToOwnedKey),
        )
    });
    assert_eq!(allocated, NOTHING);
    let ip = |s: &str| Some(s.parse().expect("address"));
    assert_eq!(
        keys,
        (
            ip("2001:db8:ffff::"),
            ip("2001:db8:ffff::"),
            ip("2001:db8:1::"),
            ip("2001:db8:1:2::")
        )
    );
}

/// A refusal records its key for `StatsHandle::top_blocked`: for a key
/// that already holds a counter, looked up by its borrowed form, that
/// allocates nothing beyond what the refusal of the one global key (which
/// needs no key at all) does; a key built as a `String` shows up.
#[cfg(feature = "axum")]
#[test]
fn recording_a_refused_known_key_allocates_nothing() {
    use axum::routing::get;
    use tower_sliding_window::{MatchedPathKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let router = || axum::Router::new().route("/users/{id}", get(|| async { "hi" }));
    let layer = || SlidingWindowLayer::qps(0).clock(clock.clone());
    let global = router().route_layer(layer());
    let matched = router().route_layer(layer().key(MatchedPathKey));
    let by_closure =
        router().route_layer(layer().key(|p: &http::request::Parts| p.uri.path().to_owned()));
    // Warm up: the first refusal of a key creates its entry and its
    // counter (and the summary's storage).
    for app in [&global, &matched, &by_closure] {
        request_allocations(app, &rt, "/users/1", http::StatusCode::TOO_MANY_REQUESTS);
    }
    let baseline = request_allocations(
        &global,
        &rt,
        "/users/2",
        http::StatusCode::TOO_MANY_REQUESTS,
    );
    let keyed = request_allocations(
        &matched,
        &rt,
        "/users/3",
        http::StatusCode::TOO_MANY_REQUESTS,
    );
    let owned_key = request_allocations(
        &by_closure,
        &rt,
        "/users/1",
        http::StatusCode::TOO_MANY_REQUESTS,
    );
    println!("allocations per refusal: global key {baseline:?}, MatchedPathKey {keyed:?}, closure {owned_key:?}");
    assert_eq!(
        keyed.count, baseline.count,
        "recording a known MatchedPathKey allocates beyond the global key's refusal"
    );
    assert!(
        owned_key.count > baseline.count,
        "{owned_key:?} vs {baseline:?}"
    );
}

/// Allocations of one request `POST /login` from `peer` through `app`,
/// which it passes.
#[cfg(feature = "axum")]
fn login_allocations(
    app: &axum::Router,
    rt: &tokio::runtime::Runtime,
    peer: std::net::SocketAddr,
) -> Allocated {
    use tower::ServiceExt;
    let mut request = http::Request::post("/login")
        .body(axum::body::Body::empty())
        .expect("valid request");
    request.extensions_mut().insert(peer);
    let app = app.clone();
    let (response, allocated) = allocated_by(|| rt.block_on(app.oneshot(request)));
    assert_eq!(response.expect("infallible").status(), http::StatusCode::OK);
    allocated
}

// `ClientRouteKey` built its route part as a `String` for every request.
/// A request of a (client, route) key already in the table allocates
/// nothing beyond the global key's request: on a full layer, and on a
/// compact one with a route rule (whose rule is read on every request).
#[cfg(feature = "axum")]
#[test]
fn client_route_keys_allocate_nothing_for_a_key_they_have_seen() {
    use axum::routing::post;
    use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let router = || axum::Router::new().route("/login", post(|| async { "welcome" }));
    let layer = || SlidingWindowLayer::qps(60_000).clock(clock.clone());
    let key = || ClientRouteKey::new(PeerIpKey, MatchedPathKey);
    let global = router().layer(layer());
    let full = router().layer(layer().key(key()).route_rule("POST /login", 60_000));
    let compact = router().layer(
        layer()
            .key(key())
            .route_rule("POST /login", 60_000)
            .compact(),
    );
    let peer: std::net::SocketAddr = "10.0.0.1:4000".parse().expect("address");
    for app in [&global, &full, &compact] {
        login_allocations(app, &rt, peer);
    }
    let baseline = login_allocations(&global, &rt, peer);
    let on_full = login_allocations(&full, &rt, peer);
    let on_compact = login_allocations(&compact, &rt, peer);
    println!("allocations per request: global key {baseline:?}, full {on_full:?}, compact {on_compact:?}");
    assert_eq!(
        on_full.count, baseline.count,
        "full: {on_full:?} vs {baseline:?}"
    );
    assert_eq!(
        on_compact.count, baseline.count,
        "compact: {on_compact:?} vs {baseline:?}"
    );
}

/// A flood of distinct clients on one route: what the layer allocates for
/// 2 700 new clients is the same with a rule for the route as without one,
/// on full and compact layers: the rule keeps nothing per client.
#[cfg(feature = "axum")]
#[test]
fn a_route_rule_allocates_nothing_per_client() {
    use axum::routing::post;
    use tower::ServiceExt;
    use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let flood = |app: &axum::Router, clients: std::ops::Range<u32>| {
        let mut total = Allocated { count: 0, bytes: 0 };
        for n in clients {
            let mut request = http::Request::post("/login")
                .body(axum::body::Body::empty())
                .expect("valid request");
            let peer = std::net::SocketAddr::from((std::net::Ipv4Addr::from(n), 4000));
            request.extensions_mut().insert(peer);
            let app = app.clone();
            let (response, allocated) = allocated_by(|| rt.block_on(app.oneshot(request)));
            assert_eq!(response.expect("infallible").status(), http::StatusCode::OK);
            total.count += allocated.count;
            total.bytes += allocated.bytes;
        }
        total
    };
    for compact in [false, true] {
        let app = |rule: bool| {
            let mut layer = SlidingWindowLayer::qps(10)
                .clock(clock.clone())
                .key(ClientRouteKey::new(PeerIpKey, MatchedPathKey))
                .max_keys(4_096);
            if rule {
                layer = layer.route_rule("POST /login", 5);
            }
            if compact {
                layer = layer.compact();
            }
            let stats = layer.handle();
            let app = axum::Router::new()
                .route("/login", post(|| async { "welcome" }))
                .layer(layer);
            (app, stats)
        };
        let (without, without_stats) = app(false);
        let (with, with_stats) = app(true);
        // Warm up: each layer's first requests make what it makes once.
        flood(&without, 1_000_000..1_000_010);
        flood(&with, 1_000_000..1_000_010);
        // The full table spreads keys over 16 shards by a randomly seeded
        // hash, and a shard's table doubles at 56, 112 and 224 entries
        // (4.4 KiB at the second). With 2 000 clients, how many shards
        // pass 112 differed between the two tables from run to run, by up
        // to 17 KiB in all. With 2 710 keys a shard holds 169 on average
        // (standard deviation 12.6), so every shard of both tables passes
        // 56 and 112 and none reaches 224 (each 4.4 deviations away): the
        // two tables grow alike. Anything kept per client would be 2 700
        // allocations, or 21 600 bytes for one more word in each entry.
        let plain = flood(&without, 0..2_700);
        let ruled = flood(&with, 0..2_700);
        println!("2 700 new clients, compact {compact}: without a route rule {plain:?}, with one {ruled:?}");
        assert!(
            ruled.count.abs_diff(plain.count) <= 20,
            "compact {compact}: {ruled:?} vs {plain:?}"
        );
        assert!(
            ruled.bytes.abs_diff(plain.bytes) <= 16_000,
            "compact {compact}: {ruled:?} vs {plain:?}"
        );
        assert_eq!(with_stats.len(), 2_710);
        assert_eq!(without_stats.len(), 2_710);
        assert_eq!(
            with_stats
                .snapshot(&(
                    Some(std::net::Ipv4Addr::from(7u32).into()),
                    "POST /login".to_owned()
                ))
                .expect("a key")
                .limit,
            5
        );
    }
}

// `HeaderKey` built a `String` for every request (its key type,
// `Option<String>`, borrows as nothing shorter); then, on a compact layer
// holding the text inline, a lookup by reference made one from the slot.
#[cfg(feature = "axum")]
#[test]
fn header_keys_allocate_nothing_for_a_key_seen_before_on_full_and_compact_layers() {
    use axum::routing::get;
    use tower::ServiceExt;
    use tower_sliding_window::{HeaderKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let router = || axum::Router::new().route("/", get(|| async { "hi" }));
    let header = || HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let global = router().route_layer(SlidingWindowLayer::qps(60_000).clock(clock.clone()));
    let full = router().route_layer(
        SlidingWindowLayer::qps(60_000)
            .key(header())
            .clock(clock.clone()),
    );
    let compact = router().route_layer(
        SlidingWindowLayer::qps(60_000)
            .key(header())
            .compact()
            .clock(clock.clone()),
    );
    // Values of every inline length, one past it, and not UTF-8 (escaped,
    // so made owned: allocates, as the baseline shows).
    let values: Vec<http::HeaderValue> =
        ["", "k", &"k".repeat(64), &"k".repeat(70), &"k".repeat(71)]
            .iter()
            .map(|v| http::HeaderValue::from_str(v).expect("visible ASCII"))
            .collect();
    let allocations = |app: &axum::Router, value: &http::HeaderValue| {
        let request = http::Request::get("/")
            .header("x-api-key", value.clone())
            .body(axum::body::Body::empty())
            .expect("valid request");
        let app = app.clone();
        let (response, allocated) = allocated_by(|| rt.block_on(app.oneshot(request)));
        assert_eq!(response.expect("infallible").status(), http::StatusCode::OK);
        allocated
    };
    for value in &values {
        // The first request of a key makes its entry.
        for app in [&global, &full, &compact] {
            allocations(app, value);
        }
        let baseline = allocations(&global, value);
        let on_full = allocations(&full, value);
        let on_compact = allocations(&compact, value);
        println!(
            "{} bytes: global key {baseline:?}, full {on_full:?}, compact {on_compact:?}",
            value.len()
        );
        assert_eq!(on_full.count, baseline.count, "full, {} bytes", value.len());
        assert_eq!(
            on_compact.count,
            baseline.count,
            "compact, {} bytes",
            value.len()
        );
    }
}

// The BBR estimate folds the layer-wide node's last 10 s (the peaks and the
// shortest response times of its per-second roll-up) on every check made
// while the CPU is busy beyond two requests in flight: no allocation.
#[cfg(feature = "axum")]
#[test]
fn reading_the_bbr_estimate_allocates_nothing() {
    use axum::routing::get;
    use tower_sliding_window::system::SystemRule;
    use tower_sliding_window::SlidingWindowLayer;

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let layer = SlidingWindowLayer::qps(1_000_000)
        .clock(clock.clone())
        .system(SystemRule::bbr().cpu_source(|| 1.0));
    let stats = layer.handle();
    let app = axum::Router::new()
        .route("/", get(|| async { "hi" }))
        .route_layer(layer);
    // Completions over 12 s, so that buckets roll up with their peaks and
    // some leave the 10 s.
    for step in 0..120 {
        clock.set(1_000_000 + step * 100);
        for _ in 0..3 {
            request_allocations(&app, &rt, "/", http::StatusCode::OK);
        }
    }
    let status = stats.system().expect("a system rule");
    assert_eq!(
        status.max_success_qps, 30,
        "3 completions per 100 ms bucket"
    );
    let (status, allocated) = allocated_by(|| stats.system());
    assert_eq!(allocated, NOTHING, "{status:?}");
}

// Every insert of a compact key locked its two groups into a `Vec`.
#[cfg(feature = "axum")]
#[test]
fn a_new_address_key_of_a_compact_table_allocates_nothing_once_its_groups_are_in_use() {
    use axum::routing::post;
    use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_000_000);
    let app = axum::Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route_layer(
            SlidingWindowLayer::qps(1_000)
                .key(PeerIpKey)
                .max_keys(1_024)
                .clock(clock.clone())
                .compact(),
        );
    let peer =
        |i: u32| std::net::SocketAddr::from((std::net::Ipv4Addr::from(0x0A00_0000 + i), 4_000));
    // The table full (the last 76 keys share the overflow entry, under
    // its limit), every group's slots allocated, then every key idle: a
    // new key takes an idle key's slot.
    for i in 0..1_100 {
        login_allocations(&app, &rt, peer(i));
    }
    clock.advance(Duration::from_secs(5));
    let known = login_allocations(&app, &rt, peer(7));
    let mut new_keys = Vec::new();
    for i in 10_000..10_050 {
        new_keys.push(login_allocations(&app, &rt, peer(i)).count);
    }
    println!("allocations per request: a known key {known:?}, new keys {new_keys:?}");
    assert!(
        new_keys.iter().all(|&count| count == known.count),
        "a new key allocated beyond a known key's {known:?}: {new_keys:?}"
    );
}
