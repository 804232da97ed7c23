//! Per-client limits per route in one layer (`ClientRouteKey`,
//! `route_rule`, `StatsHandle::set_route_limit`): a route's rule applies to
//! every client separately, on full and compact layers; an exact key's
//! rule wins; run-time changes keep the windows; hostile clients (a flood
//! of distinct clients, varied paths, a full table) get no more than the
//! route's limit.

use std::net::{IpAddr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{ClientRouteKey, MatchedPathKey, PeerIpKey, SlidingWindowLayer};

use crate::support::{clock, ok_then_429, send};

type Layer = SlidingWindowLayer<ClientRouteKey<PeerIpKey, MatchedPathKey>>;
type Key = (Option<IpAddr>, String);

const LOGIN: &str = "POST /login";

/// 100 per window per client, keyed by peer address and matched route, on
/// a manual clock; compact when `compact`.
fn layer(clock: &ManualClock, compact: bool) -> Layer {
    let layer = SlidingWindowLayer::qps(100)
        .key(ClientRouteKey::new(PeerIpKey, MatchedPathKey))
        .clock(clock.clone());
    if compact {
        layer.compact()
    } else {
        layer
    }
}

fn app(layer: Layer) -> Router {
    Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/", get(|| async { "hi" }))
        .route("/users/{id}", get(|| async { "user" }))
        .layer(layer)
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(n.into())
}

fn client(n: u32) -> SocketAddr {
    SocketAddr::new(ip(n), 40_000)
}

fn key(n: u32, route: &str) -> Key {
    (Some(ip(n)), route.to_owned())
}

/// `method path` from `peer`.
fn request(method: Method, path: &str, peer: SocketAddr) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(peer);
    request
}

/// Statuses of `n` requests `method path` from `peer`.
async fn statuses(
    app: &Router,
    method: Method,
    path: &str,
    peer: SocketAddr,
    n: usize,
) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(send(app, request(method.clone(), path, peer)).await.status);
    }
    out
}

async fn logins(app: &Router, peer: SocketAddr, n: usize) -> Vec<StatusCode> {
    statuses(app, Method::POST, "/login", peer, n).await
}

#[tokio::test]
async fn a_route_rule_limits_every_client_separately_on_full_and_compact_layers() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact).route_rule(LOGIN, 5);
        let stats = layer.handle();
        let app = app(layer);
        // One client spends its logins: the others still have theirs (a
        // layer per route would have locked every client out here).
        assert_eq!(
            logins(&app, client(1), 8).await,
            ok_then_429(5, 3),
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, client(2), 6).await,
            ok_then_429(5, 1),
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, client(3), 1).await,
            ok_then_429(1, 0),
            "compact {compact}"
        );
        // Elsewhere, the default limit per client.
        assert_eq!(
            statuses(&app, Method::GET, "/", client(1), 101).await,
            ok_then_429(100, 1),
            "compact {compact}"
        );
        for (n, pass, block) in [(1, 5, 3), (2, 5, 1), (3, 1, 0)] {
            let snapshot = stats.snapshot(&key(n, LOGIN)).unwrap();
            assert_eq!(
                (snapshot.pass, snapshot.block, snapshot.limit),
                (pass, block, 5),
                "client {n}, compact {compact}"
            );
        }
        assert_eq!(stats.snapshot(&key(1, "GET /")).unwrap().limit, 100);
        // Who is being limited: each client of the route on its own.
        let mut top = stats.top_blocked(5);
        assert_eq!(top.first(), Some(&(key(1, LOGIN), 3)));
        top.sort();
        assert_eq!(
            top,
            [(key(1, "GET /"), 1), (key(1, LOGIN), 3), (key(2, LOGIN), 1)]
        );
        // The next window: each client has its five again.
        clock.advance(std::time::Duration::from_secs(1));
        assert_eq!(
            logins(&app, client(1), 6).await,
            ok_then_429(5, 1),
            "compact {compact}"
        );
    }
}

#[tokio::test]
async fn refusals_under_a_route_rule_carry_the_routes_limit_in_their_headers() {
    for compact in [false, true] {
        let clock = clock();
        let app = app(layer(&clock, compact).route_rule(LOGIN, 2));
        logins(&app, client(1), 2).await;
        let refused = send(&app, request(Method::POST, "/login", client(1))).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        let policy = refused.header("ratelimit-policy").to_owned();
        assert!(policy.contains("q=2;w=1"), "{policy}");
        // Every client of the route runs on the route's one policy.
        logins(&app, client(2), 2).await;
        let other = send(&app, request(Method::POST, "/login", client(2))).await;
        assert_eq!(
            other.header("ratelimit-policy"),
            policy,
            "compact {compact}"
        );
        assert!(refused.retry_after() >= 1);
    }
}

#[tokio::test]
async fn a_flood_of_distinct_clients_on_one_route_gets_one_count_each() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact).route_rule(LOGIN, 3).max_keys(4_096);
        let stats = layer.handle();
        let app = app(layer);
        let clients = 2_000u32;
        for n in 0..clients {
            let got = logins(&app, client(n), 4).await;
            assert_eq!(got, ok_then_429(3, 1), "client {n}, compact {compact}");
        }
        // Memory is the keys themselves: one per client, the route's rule
        // is still one rule.
        assert_eq!(stats.len(), clients as usize, "compact {compact}");
        assert_eq!(stats.route_limits(), [(LOGIN.to_owned(), 3)]);
        let total = stats.total();
        assert_eq!(
            (total.pass, total.block),
            (3 * u64::from(clients), u64::from(clients))
        );
    }
}

#[tokio::test]
async fn an_exact_key_rule_wins_over_its_routes_rule_and_removing_it_returns_to_the_route() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact)
            .route_rule(LOGIN, 5)
            .rule(key(7, LOGIN), 8);
        let stats = layer.handle();
        let app = app(layer);
        assert_eq!(
            logins(&app, client(7), 9).await,
            ok_then_429(8, 1),
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, client(8), 6).await,
            ok_then_429(5, 1),
            "compact {compact}"
        );
        // Without its own rule, client 7 is on the route's 5 (not the
        // default 100): its 8 passes already exceed it.
        assert!(stats.remove_limit(&key(7, LOGIN)));
        assert_eq!(
            stats.snapshot(&key(7, LOGIN)).unwrap().limit,
            5,
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, client(7), 1).await,
            ok_then_429(0, 1),
            "compact {compact}"
        );
        // A run-time exact limit wins again (named by client and route).
        stats.set_limit((ip(7), LOGIN), 20);
        assert_eq!(
            logins(&app, client(7), 1).await,
            ok_then_429(1, 0),
            "compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(7, LOGIN)).unwrap().limit, 20);
    }
}

#[tokio::test]
async fn route_limits_changed_at_run_time_keep_every_window_and_reach_new_clients() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact).route_rule(LOGIN, 5);
        let stats = layer.handle();
        let app = app(layer);
        assert_eq!(logins(&app, client(1), 3).await, ok_then_429(3, 0));
        // Lower: one more pass, not a fresh four (no burst).
        stats.set_route_limit(LOGIN, 4).unwrap();
        assert_eq!(
            logins(&app, client(1), 2).await,
            ok_then_429(1, 1),
            "compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(1, LOGIN)).unwrap().limit, 4);
        // A client not seen yet gets the new limit.
        assert_eq!(
            logins(&app, client(2), 5).await,
            ok_then_429(4, 1),
            "compact {compact}"
        );
        // Higher: only the difference.
        stats.set_route_limit(LOGIN, 6).unwrap();
        assert_eq!(
            logins(&app, client(1), 3).await,
            ok_then_429(2, 1),
            "compact {compact}"
        );
        // Removed: back on the default limit, the window kept.
        assert!(stats.remove_route_limit(LOGIN));
        assert!(!stats.remove_route_limit(LOGIN));
        assert_eq!(stats.snapshot(&key(1, LOGIN)).unwrap().limit, 100);
        let passed = logins(&app, client(1), 100).await;
        let passes = passed.iter().filter(|s| **s == StatusCode::OK).count();
        assert_eq!(passes, 94, "compact {compact}");
        // A rule set at run time on a route no rule named before.
        stats.set_route_limit("GET /", 1).unwrap();
        assert_eq!(
            statuses(&app, Method::GET, "/", client(3), 2).await,
            ok_then_429(1, 1),
            "compact {compact}"
        );
    }
}

#[tokio::test]
async fn varying_the_path_does_not_escape_the_route_or_the_unmatched_fallback() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact)
            .route_rule("GET /users/{id}", 3)
            .route_rule(MatchedPathKey::UNMATCHED, 2);
        let stats = layer.handle();
        let app = app(layer);
        // Every id is the one route template.
        let mut got = Vec::new();
        for id in 0..5 {
            got.extend(statuses(&app, Method::GET, &format!("/users/{id}"), client(1), 1).await);
        }
        assert_eq!(got, ok_then_429(3, 2), "compact {compact}");
        // Paths that match no route, long and odd ones included, are one
        // bounded key per client.
        let long = format!("/{}", "x".repeat(8 * 1024));
        let mut got = Vec::new();
        for path in ["/a", "/b/c", "/%ff%fe", "/login/../x", long.as_str()] {
            got.extend(statuses(&app, Method::GET, path, client(1), 1).await);
        }
        // Passed requests reach the router, which answers 404.
        assert_eq!(got[..2], [StatusCode::NOT_FOUND; 2], "compact {compact}");
        assert!(
            got[2..].iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS),
            "{got:?}"
        );
        let keys = stats.keys();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert!(keys.contains(&key(1, MatchedPathKey::UNMATCHED)));
    }
}

#[tokio::test]
async fn a_rule_for_a_route_that_does_not_exist_matches_no_request() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact).route_rule("POST /nowhere", 0);
        let stats = layer.handle();
        let app = app(layer);
        assert_eq!(
            logins(&app, client(1), 3).await,
            ok_then_429(3, 0),
            "compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(1, LOGIN)).unwrap().limit, 100);
        assert_eq!(stats.route_limits(), [("POST /nowhere".to_owned(), 0)]);
    }
}

#[test]
fn routes_longer_than_a_key_are_refused_by_the_builder_and_the_handle() {
    let max = "r".repeat(tower_sliding_window::key::MAX_KEY_BYTES);
    let layer = layer(&clock(), false).route_rule(max.as_str(), 1);
    let stats = layer.handle();
    assert_eq!(stats.route_limits(), [(max.clone(), 1)]);

    let long = format!("{max}r");
    let panic = catch_unwind(AssertUnwindSafe(|| {
        layer.clone().route_rule(long.as_str(), 1)
    }))
    .expect_err("a route longer than MAX_KEY_BYTES is refused");
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.starts_with(
            "SlidingWindowLayer::route_rule: invalid `route`: route must be at most 256 bytes"
        ),
        "{message}"
    );
    let err = stats.set_route_limit(&long, 1).unwrap_err();
    assert_eq!(err.field(), Some("route"));
    assert!(err.rule().unwrap().starts_with("routes[\"rrr"), "{err}");
    assert_eq!(stats.route_limits(), [(max, 1)]);
}

#[test]
fn a_compact_layer_refuses_a_route_limit_it_cannot_count() {
    let too_high = catch_unwind(AssertUnwindSafe(|| {
        layer(&clock(), true).route_rule(LOGIN, 65_536)
    }));
    let message = too_high
        .unwrap_err()
        .downcast_ref::<String>()
        .unwrap()
        .clone();
    assert!(
        message.contains("route_rule") && message.contains("compact"),
        "{message}"
    );
    let too_high_first = catch_unwind(AssertUnwindSafe(|| {
        layer(&clock(), false).route_rule(LOGIN, 65_536).compact()
    }));
    let message = too_high_first
        .unwrap_err()
        .downcast_ref::<String>()
        .unwrap()
        .clone();
    assert!(
        message.contains("route_rule") && message.contains("compact"),
        "{message}"
    );
    // At run time it is taken as the most a compact window counts.
    let stats = layer(&clock(), true).handle();
    stats.set_route_limit(LOGIN, 1 << 40).unwrap();
    assert_eq!(stats.route_limits(), [(LOGIN.to_owned(), 65_535)]);
}

#[tokio::test]
async fn a_full_table_sends_a_routes_new_clients_to_an_overflow_limited_by_the_route() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact).route_rule(LOGIN, 5).max_keys(2);
        let stats = layer.handle();
        let app = app(layer);
        // Two busy clients fill the table.
        logins(&app, client(1), 1).await;
        logins(&app, client(2), 1).await;
        // New clients of the route share an overflow that admits at most
        // the route's 5, not the default overflow limit of 100.
        let mut passed = 0;
        for n in 3..40 {
            passed += logins(&app, client(n), 1)
                .await
                .iter()
                .filter(|s| **s == StatusCode::OK)
                .count();
        }
        assert_eq!(passed, 5, "compact {compact}");
        assert!(stats.snapshot(&key(3, LOGIN)).is_none());
        // Other routes' new clients still get the default overflow limit.
        assert_eq!(
            statuses(&app, Method::GET, "/", client(50), 6).await,
            ok_then_429(6, 0),
            "compact {compact}"
        );
        // Every pass is in the total, the overflowed ones included.
        assert_eq!(stats.total().pass, 1 + 1 + 5 + 6, "compact {compact}");
    }
}

#[tokio::test]
async fn clients_that_come_back_after_eviction_get_the_routes_rule_again() {
    let clock = clock();
    let layer = layer(&clock, false).route_rule(LOGIN, 2).max_keys(1);
    let app = app(layer);
    assert_eq!(logins(&app, client(1), 3).await, ok_then_429(2, 1));
    clock.advance(std::time::Duration::from_secs(2));
    // Client 2 takes the only slot (client 1 is idle and evicted).
    assert_eq!(logins(&app, client(2), 3).await, ok_then_429(2, 1));
    clock.advance(std::time::Duration::from_secs(2));
    assert_eq!(logins(&app, client(1), 3).await, ok_then_429(2, 1));
}

#[test]
fn route_rules_given_before_key_are_dropped_for_another_key_type_and_kept_for_the_same() {
    use tower_sliding_window::key::ForwardedIpKey;
    let kept = layer(&clock(), false)
        .route_rule(LOGIN, 5)
        .key(ClientRouteKey::new(
            ForwardedIpKey::trusted_hops(1),
            MatchedPathKey,
        ));
    assert_eq!(kept.handle().route_limits(), [(LOGIN.to_owned(), 5)]);
    let by_header = layer(&clock(), false)
        .route_rule(LOGIN, 5)
        .key(ClientRouteKey::new(
            tower_sliding_window::HeaderKey::new(http::HeaderName::from_static("x-api-key")),
            MatchedPathKey,
        ));
    assert!(by_header.handle().route_limits().is_empty());
}

#[cfg(feature = "prometheus")]
#[tokio::test]
async fn one_collector_exports_every_client_of_every_route() {
    let clock = clock();
    let layer = layer(&clock, false).route_rule(LOGIN, 1);
    let stats = layer.handle();
    let app = app(layer);
    logins(&app, client(1), 2).await;
    logins(&app, client(2), 1).await;
    statuses(&app, Method::GET, "/", client(1), 1).await;
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(stats.collector()));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for label in [
        "0.0.0.1, POST /login",
        "0.0.0.2, POST /login",
        "0.0.0.1, GET /",
    ] {
        assert!(
            text.contains(&format!("key=\"{label}\"")),
            "{label} in\n{text}"
        );
    }
}

#[cfg(feature = "dashboard")]
#[tokio::test]
async fn one_dashboard_lists_every_client_of_every_route_with_its_limit() {
    use tower_sliding_window::dashboard;
    let clock = clock();
    let layer = layer(&clock, false).route_rule(LOGIN, 2);
    let stats = layer.handle();
    let app = app(layer);
    logins(&app, client(1), 3).await;
    logins(&app, client(2), 1).await;
    let board = dashboard::router(stats);
    let answer = send(&board, crate::support::req("/stats")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    let s: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    let column = |name: &str| s["keys"][name].as_array().expect("a column").clone();
    let mut rows: Vec<(String, u64, u64)> = column("key")
        .iter()
        .zip(column("pass"))
        .zip(column("limit"))
        .map(|((key, pass), limit)| {
            (
                key.as_str().unwrap().to_owned(),
                pass.as_u64().unwrap(),
                limit.as_u64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        [
            ("0.0.0.1, POST /login".to_owned(), 2, 2),
            ("0.0.0.2, POST /login".to_owned(), 1, 2)
        ],
        "{s}"
    );
}

/// Real threads, two clients and a frozen clock, on full and compact
/// layers: client 1, with an exact rule of 50, passes exactly 50 whatever
/// the interleaving; client 2, on the route's 50, has the route's limit
/// lowered to 20 while the threads run, and passes between 20 and 50 (it
/// keeps what it passed before the change, and never gets a fresh window).
#[test]
fn concurrent_requests_of_one_client_pass_exactly_the_routes_limit() {
    use std::sync::{Arc, Barrier};
    use tower::ServiceExt;
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact)
            .route_rule(LOGIN, 50)
            .rule(key(1, LOGIN), 50);
        let stats = layer.handle();
        let app = app(layer);
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads + 1));
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let app = app.clone();
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    barrier.wait();
                    let mut passed = [0u64; 2];
                    for i in 0..100 {
                        // Clients 1 and 2, alternately.
                        let which = (t + i) % 2;
                        let request = request(Method::POST, "/login", client(which as u32 + 1));
                        let status = runtime
                            .block_on(app.clone().oneshot(request))
                            .unwrap()
                            .status();
                        if status == StatusCode::OK {
                            passed[which] += 1;
                        }
                    }
                    passed
                })
            })
            .collect();
        barrier.wait();
        stats.set_route_limit(LOGIN, 20).unwrap();
        let mut passed = [0u64; 2];
        for worker in workers {
            let [a, b] = worker.join().unwrap();
            passed[0] += a;
            passed[1] += b;
        }
        assert_eq!(passed[0], 50, "compact {compact}");
        assert!(
            (20..=50).contains(&passed[1]),
            "{passed:?}, compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(1, LOGIN)).unwrap().pass, 50);
        assert_eq!(stats.snapshot(&key(2, LOGIN)).unwrap().pass, passed[1]);
    }
}

/// New clients of a route arrive on real threads while the route's limit
/// changes: once the change has returned, every key of the route, made
/// before, during or after it, is on the new limit (a key made while the
/// change walked the table did not keep the old one).
#[test]
fn keys_made_while_a_route_limit_changes_all_end_on_the_new_limit() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact)
            .route_rule(LOGIN, 7)
            .max_keys(100_000);
        let stats = layer.handle();
        let app = app(layer);
        let next = Arc::new(AtomicU32::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (app, next, stop) = (app.clone(), Arc::clone(&next), Arc::clone(&stop));
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let request = request(Method::POST, "/login", client(n));
                        runtime.block_on(app.clone().oneshot(request)).unwrap();
                    }
                })
            })
            .collect();
        // Each change waits for 200 more new clients than the one before,
        // so keys are made before, between and during the changes on a
        // machine of any speed.
        for (round, limit) in (1u32..).zip([3, 9, 4, 11, 2]) {
            while next.load(Ordering::Relaxed) < 200 * round {
                std::thread::yield_now();
            }
            stats.set_route_limit(LOGIN, limit).unwrap();
            let seen = stats.snapshots();
            assert!(!seen.is_empty());
            for (key, snapshot) in seen {
                assert!(
                    [limit, 3, 9, 4, 11, 2, 7].contains(&snapshot.limit),
                    "{key:?}: {snapshot:?}"
                );
            }
        }
        // And some after the last change.
        let after = next.load(Ordering::Relaxed);
        while next.load(Ordering::Relaxed) < after + 50 {
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        for worker in workers {
            worker.join().unwrap();
        }
        let keys = stats.snapshots();
        assert!(keys.len() > 1_000, "{}", keys.len());
        for (key, snapshot) in keys {
            assert_eq!(snapshot.limit, 2, "{key:?}, compact {compact}");
        }
    }
}

/// One step of the differential test below.
#[derive(Debug, Clone)]
enum Step {
    /// A request of client `.0` on route `.1`, after the clock moves `.2` ms.
    Request(u32, usize, u64),
    /// `set_route_limit(route, limit)`.
    SetRoute(usize, u64),
    /// `remove_route_limit(route)`.
    RemoveRoute(usize),
    /// `set_limit((client, route), limit)`.
    SetExact(u32, usize, u64),
    /// `remove_limit((client, route))`.
    RemoveExact(u32, usize),
}

const ROUTES: [(&str, &str); 3] = [("POST", "/login"), ("GET", "/"), ("GET", "/a")];

fn route_name(route: usize) -> String {
    let (method, path) = ROUTES[route];
    format!("{method} {path}")
}

fn steps() -> impl proptest::strategy::Strategy<Value = Vec<Step>> {
    use proptest::prelude::*;
    let step = prop_oneof![
        8 => (0u32..5, 0usize..3, 0u64..250).prop_map(|(c, r, ms)| Step::Request(c, r, ms)),
        1 => (0usize..3, 0u64..8).prop_map(|(r, l)| Step::SetRoute(r, l)),
        1 => (0usize..3).prop_map(Step::RemoveRoute),
        1 => (0u32..5, 0usize..3, 0u64..8).prop_map(|(c, r, l)| Step::SetExact(c, r, l)),
        1 => (0u32..5, 0usize..3).prop_map(|(c, r)| Step::RemoveExact(c, r)),
    ];
    proptest::collection::vec(step, 1..120)
}

type KeyedLayer =
    SlidingWindowLayer<ClientRouteKey<PeerIpKey, tower_sliding_window::MethodPathKey>>;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Random requests of a few clients on a few routes, with route rules
    /// and exact rules given and removed between them, through a full
    /// layer and a compact one with the same settings: the same status and
    /// `Retry-After` for every request, and the same pass count and limit
    /// for every key at the end. A compact layer with route rules limits
    /// each client exactly as a full one does.
    #[test]
    fn a_compact_layer_with_route_rules_answers_exactly_as_a_full_layer(
        default in 1u64..6,
        login in proptest::option::of(0u64..6),
        steps in steps(),
    ) {
        use tower::{Layer as _, Service as _};
        let clock = ManualClock::new(10_000);
        let configure = |compact: bool| {
            let mut layer: KeyedLayer = SlidingWindowLayer::qps(default)
                .key(ClientRouteKey::new(PeerIpKey, tower_sliding_window::MethodPathKey))
                .clock(clock.clone());
            if let Some(limit) = login {
                layer = layer.route_rule(route_name(0), limit);
            }
            if compact { layer.compact() } else { layer }
        };
        let (full, compact) = (configure(false), configure(true));
        let stats = [full.handle(), compact.handle()];
        let inner = || tower::service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let mut services = [full.layer(inner()), compact.layer(inner())];
        for (i, step) in steps.iter().enumerate() {
            match *step {
                Step::Request(c, r, ms) => {
                    clock.advance(std::time::Duration::from_millis(ms));
                    let (method, path) = ROUTES[r];
                    let answers: Vec<(StatusCode, Option<String>)> = services
                        .iter_mut()
                        .map(|service| {
                            let request = request(method.parse().unwrap(), path, client(c));
                            let response = tokio_test::block_on(service.call(request)).unwrap();
                            let retry = response
                                .headers()
                                .get("retry-after")
                                .map(|v| v.to_str().unwrap().to_owned());
                            (response.status(), retry)
                        })
                        .collect();
                    proptest::prop_assert_eq!(&answers[0], &answers[1], "step {}: {:?}", i, step);
                }
                Step::SetRoute(r, limit) => {
                    for s in &stats {
                        s.set_route_limit(&route_name(r), limit).unwrap();
                    }
                }
                Step::RemoveRoute(r) => {
                    let had: Vec<bool> = stats.iter().map(|s| s.remove_route_limit(&route_name(r))).collect();
                    proptest::prop_assert_eq!(had[0], had[1]);
                }
                Step::SetExact(c, r, limit) => {
                    for s in &stats {
                        s.set_limit(key(c, &route_name(r)), limit);
                    }
                }
                Step::RemoveExact(c, r) => {
                    let had: Vec<bool> = stats.iter().map(|s| s.remove_limit(&key(c, &route_name(r)))).collect();
                    proptest::prop_assert_eq!(had[0], had[1]);
                }
            }
        }
        for c in 0..5 {
            for r in 0..3 {
                let k = key(c, &route_name(r));
                let got: Vec<Option<(u64, u64)>> = stats
                    .iter()
                    .map(|s| s.snapshot(&k).map(|s| (s.pass, s.limit)))
                    .collect();
                proptest::prop_assert_eq!(got[0], got[1], "{:?}", k);
            }
        }
    }
}

/// A route of exactly the longest text a rule can name is matched by its
/// rule, on full and compact layers; a longer one is keyed by its digest
/// form, which no rule can name, and runs on the default limit.
#[tokio::test]
async fn a_route_of_the_longest_nameable_size_is_matched_and_a_longer_one_is_bounded() {
    let max = tower_sliding_window::key::MAX_KEY_BYTES;
    // "GET " and a path: exactly `max` bytes, and one more.
    let path = format!("/{}", "a".repeat(max - "GET /".len()));
    let longer = format!("{path}b");
    for compact in [false, true] {
        let clock = clock();
        let route = format!("GET {path}");
        assert_eq!(route.len(), max);
        let layer = layer(&clock, compact).route_rule(route.as_str(), 1);
        let stats = layer.handle();
        let app = Router::new()
            .route(&path, get(|| async { "max" }))
            .route(&longer, get(|| async { "longer" }))
            .layer(layer);
        assert_eq!(
            statuses(&app, Method::GET, &path, client(1), 2).await,
            ok_then_429(1, 1),
            "compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(1, &route)).unwrap().limit, 1);
        assert_eq!(
            statuses(&app, Method::GET, &longer, client(1), 3).await,
            ok_then_429(3, 0),
            "compact {compact}"
        );
        let keys = stats.keys();
        let digest = keys
            .iter()
            .find(|(_, r)| r != &route)
            .expect("the longer route's key");
        assert!(
            digest.1.len() <= tower_sliding_window::key::MAX_DIGEST_KEY_BYTES,
            "{digest:?}"
        );
        assert!(digest.1.contains("…#"), "{digest:?}");
    }
}
