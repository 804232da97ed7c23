//! Per-client limits per route in further windows (`route_rule_per`,
//! `StatsHandle::set_route_limit_per`): the per-client rule "5 logins per
//! minute, 100 per second elsewhere" in one layer, through axum; each
//! window's precedence (the key's own limit, its route's, the window's
//! default); run-time changes without a burst; hostile values.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::key::{ForwardedIpKey, MAX_KEY_BYTES};
use tower_sliding_window::{ClientRouteKey, MatchedPathKey, SlidingWindowLayer, StatsHandle};

use crate::support::{clock, ok_then_429, send, Answer};

type Layer = SlidingWindowLayer<ClientRouteKey<ForwardedIpKey, MatchedPathKey>>;
type Key = (Option<IpAddr>, String);

const LOGIN: &str = "POST /login";
const HOME: &str = "GET /";
const MINUTE: Duration = Duration::from_secs(60);
const SECOND: Duration = Duration::from_secs(1);

/// The proxy in front of the service: it appends the client's address.
const PROXY: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

/// Per client (the address the proxy appended) and matched route: 100 per
/// second and 6 000 per minute, on a manual clock; no route rule yet.
fn base(clock: &ManualClock) -> Layer {
    SlidingWindowLayer::qps(100)
        .key(ClientRouteKey::new(
            ForwardedIpKey::trusted_hops(1),
            MatchedPathKey,
        ))
        .limit_per(MINUTE, 6_000)
        .clock(clock.clone())
}

/// The canonical per-client rule: [`base`] with 5 logins per minute.
fn canonical(clock: &ManualClock) -> Layer {
    base(clock).route_rule_per(LOGIN, MINUTE, 5)
}

fn app(layer: Layer) -> Router {
    Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/", get(|| async { "hi" }))
        .layer(layer)
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4((0x0a01_0000 + n).into())
}

fn key(n: u32, route: &str) -> Key {
    (Some(ip(n)), route.to_owned())
}

/// `method path` from client `n`, through the proxy, with a spoofed
/// leftmost entry that the key must not take.
fn request(method: Method, path: &str, n: u32) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("x-forwarded-for", format!("6.6.6.6, {}", ip(n)))
        .body(Body::empty())
        .unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::new(PROXY, 40_000));
    request
}

async fn answers(app: &Router, method: Method, path: &str, n: u32, count: usize) -> Vec<Answer> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(send(app, request(method.clone(), path, n)).await);
    }
    out
}

async fn statuses(
    app: &Router,
    method: Method,
    path: &str,
    n: u32,
    count: usize,
) -> Vec<StatusCode> {
    answers(app, method, path, n, count)
        .await
        .into_iter()
        .map(|answer| answer.status)
        .collect()
}

async fn logins(app: &Router, n: u32, count: usize) -> Vec<StatusCode> {
    statuses(app, Method::POST, "/login", n, count).await
}

async fn homes(app: &Router, n: u32, count: usize) -> Vec<StatusCode> {
    statuses(app, Method::GET, "/", n, count).await
}

/// `key`'s limit in each window, read from its live entry.
fn limits(stats: &StatsHandle<Key>, key: &Key) -> Vec<(Duration, u64)> {
    stats
        .windows(key)
        .expect("the key has an entry")
        .iter()
        .map(|window| (window.interval, window.limit))
        .collect()
}

#[tokio::test]
async fn the_canonical_rule_gives_each_client_five_logins_a_minute_and_100_a_second_elsewhere() {
    let clock = clock();
    canonical_rule_holds(canonical(&clock), &clock).await;
}

#[tokio::test]
async fn the_canonical_rule_holds_on_a_compact_layer() {
    let clock = clock();
    canonical_rule_holds(canonical(&clock).compact(), &clock).await;
}

async fn canonical_rule_holds(layer: Layer, clock: &ManualClock) {
    let stats = layer.handle();
    let app = app(layer);

    // Client 1: five logins, and the sixth is refused by the minute's
    // window, with that window's wait. The clock is at 10.05 s: the
    // logins sit in the minute's bucket of [6 s, 12 s), which leaves the
    // window at 66 s, 55.95 s from now.
    let answers1 = answers(&app, Method::POST, "/login", 1, 6).await;
    let got: Vec<_> = answers1.iter().map(|a| a.status).collect();
    assert_eq!(got, ok_then_429(5, 1));
    let sixth = &answers1[5];
    assert_eq!(sixth.retry_after(), 56, "{:?}", sixth.headers);
    assert!(
        sixth.header("ratelimit").contains("-60000ms"),
        "the minute's window is the one that refused: {:?}",
        sixth.headers
    );

    // Client 1's logins lock no one else out: client 2 has its own five.
    assert_eq!(logins(&app, 2, 6).await, ok_then_429(5, 1));
    assert_eq!(logins(&app, 3, 1).await, ok_then_429(1, 0));

    // Elsewhere, 100 per second per client, refused with the second's
    // wait; client 1's refused logins did not touch it.
    let home = answers(&app, Method::GET, "/", 1, 101).await;
    let got: Vec<_> = home.iter().map(|a| a.status).collect();
    assert_eq!(got, ok_then_429(100, 1));
    assert_eq!(home[100].retry_after(), 1, "{:?}", home[100].headers);
    assert_eq!(homes(&app, 2, 100).await, ok_then_429(100, 0));

    // A second later, another 100 elsewhere; the minute still refuses
    // client 1's logins, and client 4 still has all five of its own.
    clock.advance(SECOND);
    assert_eq!(homes(&app, 1, 101).await, ok_then_429(100, 1));
    assert_eq!(logins(&app, 1, 1).await, ok_then_429(0, 1));
    assert_eq!(logins(&app, 4, 6).await, ok_then_429(5, 1));

    // Each window of each key, as the handle reads them.
    let windows = stats.windows(&key(1, LOGIN)).unwrap();
    assert_eq!(
        windows
            .iter()
            .map(|w| (w.interval, w.limit, w.pass))
            .collect::<Vec<_>>(),
        [(SECOND, 100, 0), (MINUTE, 5, 5)]
    );
    assert_eq!(
        limits(&stats, &key(1, HOME)),
        [(SECOND, 100), (MINUTE, 6_000)]
    );
    // The spoofed leftmost address keyed nothing.
    assert!(stats
        .windows(&(Some("6.6.6.6".parse().unwrap()), LOGIN.to_owned()))
        .is_none());

    // Once the first logins have left the minute's window, five again.
    clock.set(66_000);
    assert_eq!(logins(&app, 1, 6).await, ok_then_429(5, 1));
}

#[tokio::test]
async fn in_each_window_a_keys_own_limit_wins_over_its_routes_which_wins_over_the_default() {
    let clock = clock();
    let layer = canonical(&clock)
        .route_rule(LOGIN, 3)
        .rule_per(key(7, LOGIN), MINUTE, 8);
    let stats = layer.handle();
    let app = app(layer);

    // Client 7's own minute limit (8) wins over the route's (5); its
    // second's window is the route's first-window rule (3).
    assert_eq!(logins(&app, 7, 4).await, ok_then_429(3, 1));
    assert_eq!(limits(&stats, &key(7, LOGIN)), [(SECOND, 3), (MINUTE, 8)]);
    clock.advance(SECOND);
    assert_eq!(logins(&app, 7, 4).await, ok_then_429(3, 1));
    clock.advance(SECOND);
    // 6 of its 8 spent: two more.
    assert_eq!(logins(&app, 7, 3).await, ok_then_429(2, 1));

    // Another client of the route: the route's rule in each window.
    assert_eq!(logins(&app, 1, 4).await, ok_then_429(3, 1));
    assert_eq!(limits(&stats, &key(1, LOGIN)), [(SECOND, 3), (MINUTE, 5)]);
    // Another route: each window's default.
    assert!(stats.windows(&key(1, HOME)).is_none());
    homes(&app, 1, 1).await;
    assert_eq!(
        limits(&stats, &key(1, HOME)),
        [(SECOND, 100), (MINUTE, 6_000)]
    );

    // Removing client 7's own limit brings it back to its route's: 8
    // passes in the window are over the route's 5, so it is refused.
    clock.advance(SECOND);
    assert!(stats.remove_limit_per(key(7, LOGIN), MINUTE).unwrap());
    assert_eq!(limits(&stats, &key(7, LOGIN)), [(SECOND, 3), (MINUTE, 5)]);
    assert_eq!(logins(&app, 7, 1).await, ok_then_429(0, 1));
    // Setting it at run time wins again over the route's.
    stats.set_limit_per(key(7, LOGIN), MINUTE, 9).unwrap();
    assert_eq!(logins(&app, 7, 2).await, ok_then_429(1, 1));

    // Removing the route's rule brings its keys to the window's default;
    // client 7 keeps its own.
    assert!(stats.remove_route_limit_per(LOGIN, MINUTE).unwrap());
    assert!(!stats.remove_route_limit_per(LOGIN, MINUTE).unwrap());
    assert_eq!(
        limits(&stats, &key(1, LOGIN)),
        [(SECOND, 3), (MINUTE, 6_000)]
    );
    assert_eq!(limits(&stats, &key(7, LOGIN)), [(SECOND, 3), (MINUTE, 9)]);
    assert!(stats.route_limits_per(MINUTE).unwrap().is_empty());
    // The first window's route rule is its own, untouched.
    assert_eq!(stats.route_limits(), [(LOGIN.to_owned(), 3)]);
}

#[tokio::test]
async fn a_routes_minute_limit_changed_at_run_time_keeps_every_window_and_reaches_new_clients() {
    let clock = clock();
    // No route rule when built: the first comes from the handle.
    let layer = base(&clock);
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(3, 0));
    homes(&app, 1, 2).await;

    stats.set_route_limit_per(LOGIN, MINUTE, 4).unwrap();
    assert_eq!(
        stats.route_limits_per(MINUTE).unwrap(),
        [(LOGIN.to_owned(), 4)]
    );
    // The 3 passes stay counted: one more, no burst of four.
    clock.advance(SECOND);
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(1, 1));
    // A client not seen yet gets the new limit; another route keeps the
    // default.
    assert_eq!(logins(&app, 2, 5).await, ok_then_429(4, 1));
    assert_eq!(
        limits(&stats, &key(1, HOME)),
        [(SECOND, 100), (MINUTE, 6_000)]
    );

    // Lowered under what was passed: refused at once.
    stats.set_route_limit_per(LOGIN, MINUTE, 2).unwrap();
    clock.advance(SECOND);
    assert_eq!(logins(&app, 1, 1).await, ok_then_429(0, 1));
    // Raised: only the difference.
    stats.set_route_limit_per(LOGIN, MINUTE, 7).unwrap();
    assert_eq!(logins(&app, 1, 4).await, ok_then_429(3, 1));
    assert_eq!(stats.windows(&key(1, LOGIN)).unwrap()[1].pass, 7);

    // Removed: back to the window's default, the window kept.
    assert!(stats.remove_route_limit_per(LOGIN, MINUTE).unwrap());
    clock.advance(SECOND);
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(3, 0));
    assert_eq!(stats.windows(&key(1, LOGIN)).unwrap()[1].pass, 10);
}

#[tokio::test]
async fn hostile_route_rules_of_further_windows_get_errors_naming_the_field_and_change_nothing() {
    let clock = clock();
    let layer = canonical(&clock);
    let stats = layer.handle();
    let app = app(layer);
    let before = stats.route_limits_per(MINUTE).unwrap();

    // No window of that interval: the first window's, an unknown one, one
    // that is not whole milliseconds, the longest there is.
    for interval in [
        SECOND,
        Duration::from_secs(7),
        Duration::from_micros(60_000_500),
        Duration::MAX,
    ] {
        let err = stats.set_route_limit_per(LOGIN, interval, 1).unwrap_err();
        assert_eq!(err.field(), Some("interval"), "{err}");
        assert!(err.rule().unwrap().starts_with("windows[\""), "{err}");
        assert!(
            err.rule().unwrap().ends_with(r#"].routes["POST /login"]"#),
            "{err}"
        );
        let err = stats.remove_route_limit_per(LOGIN, interval).unwrap_err();
        assert_eq!(err.field(), Some("interval"), "{err}");
        assert_eq!(
            stats.route_limits_per(interval).unwrap_err().field(),
            "interval"
        );
    }
    let err = stats
        .set_route_limit_per(LOGIN, Duration::from_secs(7), 1)
        .unwrap_err();
    assert_eq!(err.rule(), Some(r#"windows["7s"].routes["POST /login"]"#));

    // A route longer than any key: refused, named, nothing kept.
    let long = "r".repeat(MAX_KEY_BYTES + 1);
    let err = stats.set_route_limit_per(&long, MINUTE, 1).unwrap_err();
    assert_eq!(err.field(), Some("route"), "{err}");
    assert_eq!(
        err.rule(),
        Some(format!("windows[\"60s\"].routes[\"{}…\"]", "r".repeat(64)).as_str())
    );
    assert!(err.reason().contains("at most 256 bytes"), "{err}");
    assert_eq!(stats.route_limits_per(MINUTE).unwrap(), before);
    // A route of exactly the longest key is a rule.
    let longest = "r".repeat(MAX_KEY_BYTES);
    stats.set_route_limit_per(&longest, MINUTE, 1).unwrap();
    assert!(stats.remove_route_limit_per(&longest, MINUTE).unwrap());

    // u64::MAX: the minute never refuses; the second's window still does.
    stats.set_route_limit_per(LOGIN, MINUTE, u64::MAX).unwrap();
    assert_eq!(logins(&app, 1, 101).await, ok_then_429(100, 1));
    assert_eq!(
        limits(&stats, &key(1, LOGIN)),
        [(SECOND, 100), (MINUTE, u64::MAX)]
    );
    // 0: every login refused, for clients seen and new; other routes
    // unaffected.
    stats.set_route_limit_per(LOGIN, MINUTE, 0).unwrap();
    clock.advance(SECOND);
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(0, 2));
    assert_eq!(logins(&app, 2, 2).await, ok_then_429(0, 2));
    assert_eq!(homes(&app, 2, 2).await, ok_then_429(2, 0));
}

#[test]
fn the_builder_refuses_a_route_rule_for_a_window_it_lacks_or_a_route_too_long() {
    let clock = clock();
    let panic_of = |f: Box<dyn FnOnce() -> Layer>| {
        let err = catch_unwind(AssertUnwindSafe(f)).unwrap_err();
        err.downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| err.downcast_ref::<&str>().unwrap().to_string())
    };
    let c = clock.clone();
    let message = panic_of(Box::new(move || {
        base(&c).route_rule_per(LOGIN, Duration::from_secs(7), 5)
    }));
    assert!(
        message.contains("route_rule_per: invalid `interval`"),
        "{message}"
    );
    let c = clock.clone();
    let message = panic_of(Box::new(move || {
        base(&c).route_rule_per("r".repeat(MAX_KEY_BYTES + 1), MINUTE, 5)
    }));
    assert!(
        message.contains("route_rule_per: invalid `route`"),
        "{message}"
    );
    // Given twice, the later limit stands.
    let stats = canonical(&clock).route_rule_per(LOGIN, MINUTE, 2).handle();
    assert_eq!(
        stats.route_limits_per(MINUTE).unwrap(),
        [(LOGIN.to_owned(), 2)]
    );
}

#[tokio::test]
async fn a_full_table_sends_a_routes_new_clients_to_an_overflow_with_the_routes_minute_limit() {
    let clock = clock();
    let layer = canonical(&clock).max_keys(2);
    let stats = layer.handle();
    let app = app(layer);
    // Two busy clients fill the table.
    logins(&app, 1, 1).await;
    logins(&app, 2, 1).await;
    // New clients of the route share an overflow entry that admits the
    // route's 5 a minute, not the windows' defaults (100 and 6 000), even
    // across seconds.
    let mut passed = 0;
    for n in 3..40 {
        if n % 10 == 0 {
            clock.advance(SECOND);
        }
        passed += logins(&app, n, 1)
            .await
            .iter()
            .filter(|s| **s == StatusCode::OK)
            .count();
    }
    assert_eq!(passed, 5);
    assert!(stats.windows(&key(3, LOGIN)).is_none());
    // A higher route limit reaches that overflow entry too: two more,
    // its five kept.
    stats.set_route_limit_per(LOGIN, MINUTE, 7).unwrap();
    let mut ok = 0;
    for n in 50..60 {
        if send(&app, request(Method::POST, "/login", n)).await.status == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(ok, 2);
    // Other routes' new clients still get the default overflow limits.
    assert_eq!(homes(&app, 70, 6).await, ok_then_429(6, 0));
    // Every pass is in the total, the overflowed ones included.
    assert_eq!(stats.total().pass, 6 + 2);
}

/// A compact layer's full table sends new clients to its one shared
/// overflow window, which a route's minute limit caps too: the clients the
/// table has no room for never get more logins a minute than the route
/// allows one client (the window's default, 6 000, would let them all in).
#[tokio::test]
async fn a_full_compact_table_caps_its_overflow_by_the_routes_minute_limit() {
    let clock = clock();
    let layer = canonical(&clock).compact().max_keys(16);
    let app = app(layer);
    // Busy clients fill every slot: their passes keep them in the minute.
    for n in 1..=64 {
        assert_eq!(homes(&app, n, 1).await, ok_then_429(1, 0));
    }
    let mut passed = 0;
    for n in 100..160 {
        if n % 10 == 0 {
            clock.advance(SECOND);
        }
        passed += logins(&app, n, 1)
            .await
            .iter()
            .filter(|s| **s == StatusCode::OK)
            .count();
    }
    assert!(passed <= 5, "{passed} logins passed through the overflow");
}

/// One client's logins from 8 threads at once: the minute's route rule
/// admits exactly 5, however the requests interleave.
#[test]
fn concurrent_logins_of_one_client_pass_exactly_the_routes_minute_limit() {
    use std::sync::{Arc, Barrier};
    use tower::ServiceExt;
    let clock = clock();
    let layer = canonical(&clock);
    let stats = layer.handle();
    let app = app(layer);
    let threads = 8;
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let app = app.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                barrier.wait();
                let mut passed = 0;
                for _ in 0..10 {
                    let request = request(Method::POST, "/login", 1);
                    let status = runtime
                        .block_on(app.clone().oneshot(request))
                        .unwrap()
                        .status();
                    passed += u64::from(status == StatusCode::OK);
                }
                passed
            })
        })
        .collect();
    let passed: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(passed, 5);
    let windows = stats.windows(&key(1, LOGIN)).unwrap();
    assert_eq!((windows[0].pass, windows[1].pass), (5, 5));
}

/// New clients of a route arrive on real threads while the route's minute
/// limit is set, changed and set again (the first rule given at run time):
/// once the last change has returned, every key of the route, made before,
/// during or after the changes, is on the last limit.
#[test]
fn keys_made_while_a_routes_minute_limit_changes_all_end_on_the_new_limit() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    use tower::ServiceExt;
    let clock = clock();
    let layer = base(&clock).max_keys(100_000);
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
                    let request = request(Method::POST, "/login", n);
                    runtime.block_on(app.clone().oneshot(request)).unwrap();
                }
            })
        })
        .collect();
    let mut mark = 0;
    for limit in [3, 9, 4, 11, 2] {
        mark += 200;
        while next.load(Ordering::Relaxed) < mark {
            std::thread::yield_now();
        }
        stats.set_route_limit_per(LOGIN, MINUTE, limit).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    let keys = stats.snapshots();
    assert!(keys.len() > 1_000, "{}", keys.len());
    for (key, _) in keys {
        assert_eq!(
            limits(&stats, &key),
            [(SECOND, 100), (MINUTE, 2)],
            "{key:?}"
        );
    }
}
