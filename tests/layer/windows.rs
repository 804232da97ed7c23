//! Several windows per key (`SlidingWindowLayer::limit_per`): a request
//! passes only if every window admits it and is charged to all or none
//! (also under real threads with a frozen clock), the RateLimit fields and
//! `Retry-After` over every window, per-key limits of each window, the
//! settings it refuses, and hostile values.

use crate::support;

use std::convert::Infallible;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, Request, Response, StatusCode};
use tower::{service_fn, Layer, Service};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::{HeaderKey, SlidingWindowLayer, StatsHandle, WindowCount};

use support::{clock, req_with};

const KEY_HEADER: &str = "x-key";
const MINUTE: Duration = Duration::from_secs(60);

fn keyed(limit: u64) -> SlidingWindowLayer<HeaderKey> {
    SlidingWindowLayer::qps(limit).key(HeaderKey::new(HeaderName::from_static(KEY_HEADER)))
}

fn key(name: &str) -> Option<String> {
    Some(name.to_owned())
}

type Inner = tower::util::ServiceFn<
    fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
>;

fn inner() -> Inner {
    fn ok(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
    service_fn(ok as fn(_) -> _)
}

/// The answer to one request, outside any runtime (nothing waits).
struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
}

impl Answer {
    fn header(&self, name: &str) -> &str {
        match self.headers.get(name) {
            Some(value) => value.to_str().unwrap(),
            None => panic!("no `{name}` in {:?}", self.headers),
        }
    }
}

fn call<S, B>(service: &mut S, key: &str) -> Answer
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let response = tokio_test::block_on(service.call(req_with("/", KEY_HEADER, key))).unwrap();
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
    }
}

/// Each window's passes of `key`, first window first.
fn passes(stats: &StatsHandle<Option<String>>, name: &str) -> Vec<u64> {
    stats
        .windows(&key(name))
        .unwrap_or_else(|| panic!("no statistics for {name}"))
        .iter()
        .map(|w| w.pass)
        .collect()
}

fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("the configuration panics");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn a_request_passes_only_if_every_window_admits_it() {
    let clock = clock();
    // 2 per second, 3 per 10 s, 4 per minute.
    let layer = keyed(2)
        .limit_per(Duration::from_secs(10), 3)
        .limit_per(MINUTE, 4)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let mut statuses = Vec::new();
    for _ in 0..12 {
        for _ in 0..3 {
            statuses.push(call(&mut service, "a").status.as_u16());
        }
        clock.advance(Duration::from_secs(1));
    }
    let passed = statuses.iter().filter(|&&s| s == 200).count();
    // Second 0: 2 pass (the second's window); second 1: 1 more (the 10 s
    // window); then nothing until the 10 s window slides at 10 s, where the
    // minute's window lets one more through.
    assert_eq!(passed, 4, "{statuses:?}");
    assert_eq!(&statuses[..6], &[200, 200, 429, 200, 429, 429]);
    let windows = stats.windows(&key("a")).unwrap();
    assert_eq!(
        windows
            .iter()
            .map(|w| (w.interval, w.limit))
            .collect::<Vec<_>>(),
        vec![
            (Duration::from_secs(1), 2),
            (Duration::from_secs(10), 3),
            (MINUTE, 4)
        ]
    );
    assert_eq!(windows[2].pass, 4);
}

/// The all-or-none rule on one thread: a window that refuses leaves the
/// others' counts as they were, whichever window it is. (Without the
/// give-back, the further window would hold the passes of requests the
/// first window refused.)
#[test]
fn a_refusal_by_one_window_leaves_the_other_windows_counts_as_they_were() {
    let clock = clock();
    // The first window is the tighter one: 1 per second, 5 per minute.
    let layer = keyed(1).limit_per(MINUTE, 5).clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    for _ in 0..4 {
        call(&mut service, "a");
    }
    assert_eq!(
        passes(&stats, "a"),
        vec![1, 1],
        "refused by the first window"
    );

    // The further window is the tighter one: 10 per second, 2 per minute.
    let layer = keyed(10).limit_per(MINUTE, 2).clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    for _ in 0..5 {
        call(&mut service, "a");
    }
    assert_eq!(
        passes(&stats, "a"),
        vec![2, 2],
        "refused by the further window"
    );
    assert_eq!(stats.snapshot(&key("a")).unwrap().block, 3);
}

/// Real threads on a frozen clock, with several keys whose tightest window
/// differs (the first window, the middle or the last): every window of
/// every key holds exactly the passes that were admitted, the tightest
/// limit of each key, never a pass counted in one window only.
#[test]
fn under_real_threads_each_window_holds_exactly_what_was_admitted() {
    let clock = ManualClock::new(7_000);
    let ten = Duration::from_secs(10);
    let layer = keyed(300)
        .limit_per(ten, 500)
        .limit_per(MINUTE, 700)
        .clock(clock)
        // Key "mid": its 10 s window is the tightest; "last": its minute.
        .rule_per("mid", ten, 120)
        .rule_per("last", MINUTE, 90)
        .rule("last", 1_000);
    let stats = layer.handle();
    let service = layer.layer(inner());
    let names = ["first", "mid", "last"];
    let threads = 8;
    let per_thread = 300;
    let admitted: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let mut service = service.clone();
            let admitted = Arc::clone(&admitted);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                for i in 0..per_thread {
                    let k = (i + t) % names.len();
                    if call(&mut service, names[k]).status == StatusCode::OK {
                        admitted[k].fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    for (k, (name, expected)) in names.iter().zip([300, 120, 90]).enumerate() {
        let admitted = admitted[k].load(Ordering::Relaxed);
        assert_eq!(admitted, expected, "{name}: the tightest limit, exactly");
        assert_eq!(
            passes(&stats, name),
            vec![admitted; 3],
            "{name}: every window holds exactly what was admitted"
        );
        let snapshot = stats.snapshot(&key(name)).unwrap();
        assert_eq!(
            snapshot.pass + snapshot.block,
            (threads * per_thread / 3) as u64
        );
    }
}

#[test]
fn retry_after_is_the_longest_wait_and_ratelimit_reports_the_tightest_window() {
    let clock = ManualClock::new(0);
    let layer = keyed(2)
        .limit_per(Duration::from_secs(10), 3)
        .limit_per(MINUTE, 100)
        .clock(clock.clone())
        .headers_on_pass(true);
    let mut service = layer.layer(inner());
    let first = call(&mut service, "a");
    assert_eq!(
        first.header("ratelimit-policy"),
        r#""default";q=2;w=1, "default-10000ms";q=3;w=10, "default-60000ms";q=100;w=60"#
    );
    // After one pass the second's window has 1 left, the tightest.
    assert_eq!(first.header("ratelimit"), r#""default";r=1;t=1"#);
    call(&mut service, "a");
    clock.set(900);
    call(&mut service, "a")
        .status
        .is_client_error()
        .then_some(())
        .unwrap();
    clock.set(1_000);
    assert_eq!(call(&mut service, "a").status, StatusCode::OK);
    // Now the second's window (1 of 2) refuses until 1 000 + 1 000, the 10 s
    // window (3 of 3) until its bucket at 0 leaves at 10 000: the longest.
    call(&mut service, "a");
    clock.set(1_500);
    let refused = call(&mut service, "a");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), "9");
    assert_eq!(refused.header("ratelimit"), r#""default-10000ms";r=0;t=9"#);
}

#[test]
fn rule_and_set_limit_change_the_first_window_and_the_per_window_methods_the_others() {
    let clock = clock();
    let layer = keyed(1)
        .limit_per(MINUTE, 3)
        .clock(clock.clone())
        .rule("a", 2)
        .rule_per("b", MINUTE, 1);
    let stats = layer.handle();
    assert_eq!(
        stats.limits_per(&key("a")),
        vec![(Duration::from_secs(1), 2), (MINUTE, 3)]
    );
    assert_eq!(
        stats.limits_per(&key("b")),
        vec![(Duration::from_secs(1), 1), (MINUTE, 1)]
    );
    let mut service = layer.layer(inner());
    let sent = |service: &mut _, name| {
        (0..4)
            .filter(|_| call(service, name).status == StatusCode::OK)
            .count()
    };
    assert_eq!(sent(&mut service, "a"), 2);
    assert_eq!(sent(&mut service, "b"), 1);
    // A key not seen yet gets its limit from the next request.
    stats.set_limit("c", 5);
    stats.set_limit_per("c", MINUTE, 4).unwrap();
    assert_eq!(sent(&mut service, "c"), 4);
    // A live key's further limit changes at once, passes kept (no burst).
    stats.set_limit_per("a", MINUTE, 10).unwrap();
    clock.advance(Duration::from_secs(1));
    assert_eq!(sent(&mut service, "a"), 2);
    assert_eq!(passes(&stats, "a"), vec![2, 4]);
    assert!(stats.remove_limit_per("a", MINUTE).unwrap());
    assert!(!stats.remove_limit_per("a", MINUTE).unwrap());
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        sent(&mut service, "a"),
        0,
        "back on the default 3 per minute"
    );
    let err = stats
        .set_limit_per("a", Duration::from_secs(2), 1)
        .unwrap_err();
    assert_eq!(err.field(), "interval");
    assert!(err.to_string().contains("limit_per"), "{err}");
}

#[test]
fn a_key_with_passes_in_a_further_window_is_not_evicted() {
    let clock = clock();
    let layer = keyed(10)
        .limit_per(MINUTE, 2)
        .max_keys(1)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    call(&mut service, "a");
    call(&mut service, "a");
    // The second's window is empty, the minute's is not: "a" stays, so its
    // passes stay counted, and "b" shares the overflow entry.
    clock.advance(Duration::from_secs(5));
    call(&mut service, "b");
    assert_eq!(
        call(&mut service, "a").status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(passes(&stats, "a"), vec![0, 2]);
    assert!(
        stats.windows(&key("b")).is_none(),
        "b is on the overflow entry"
    );
    // Once the minute is over, "a" is idle and makes room.
    clock.advance(MINUTE);
    call(&mut service, "b");
    assert!(stats.windows(&key("b")).is_some());
}

#[test]
fn strict_counts_the_departed_bucket_in_every_window() {
    let clock = ManualClock::new(950);
    // 100 per second, 3 per 10 s: strict in both.
    let layer = keyed(100)
        .limit_per(Duration::from_secs(10), 3)
        .strict()
        .clock(clock.clone());
    let mut service = layer.layer(inner());
    for _ in 0..3 {
        assert_eq!(call(&mut service, "a").status, StatusCode::OK);
    }
    // At 10 950 the bucket [0, 1 000) has left the 10 s window, but the
    // interval [950, 10 950) holds its 3 passes: still refused.
    clock.set(10_950);
    assert_eq!(
        call(&mut service, "a").status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.set(11_000);
    assert_eq!(call(&mut service, "a").status, StatusCode::OK);
}

#[test]
fn invalid_windows_are_refused_at_construction_naming_the_setting() {
    let message = panic_message(|| drop(keyed(1).limit_per(Duration::ZERO, 5)));
    assert!(
        message.contains("limit_per") && message.contains("`interval`"),
        "{message}"
    );
    assert!(message.contains("at least 1 ms"), "{message}");
    let message = panic_message(|| drop(keyed(1).limit_per(Duration::from_millis(15), 5)));
    assert!(
        message.contains("multiple of the window's `sample_count` (10)"),
        "{message}"
    );
    let message = panic_message(|| drop(keyed(1).limit_per(Duration::from_secs(1), 5)));
    assert!(
        message.contains("differ from the first window"),
        "{message}"
    );
    let message = panic_message(|| drop(keyed(1).limit_per(MINUTE, 5).limit_per(MINUTE, 6)));
    assert!(message.contains("window of 60000 ms already"), "{message}");
    let message = panic_message(|| drop(keyed(1).limit_per(Duration::from_micros(1_500), 5)));
    assert!(
        message.contains("whole number of milliseconds"),
        "{message}"
    );
    // A later `window` must keep every further window valid.
    let message = panic_message(|| drop(keyed(1).limit_per(MINUTE, 5).window(MINUTE, 10)));
    assert!(message.contains("SlidingWindowLayer::window"), "{message}");
    let message = panic_message(|| {
        drop(
            keyed(1)
                .limit_per(Duration::from_millis(1_010), 5)
                .window(Duration::from_secs(2), 20),
        )
    });
    assert!(
        message.contains("multiple of the window's `sample_count` (20)"),
        "{message}"
    );
    let message = panic_message(|| drop(keyed(1).rule_per("a", MINUTE, 5)));
    assert!(
        message.contains("rule_per") && message.contains("no `limit_per` window"),
        "{message}"
    );
    // Under strict, the interval plus one bucket must fit in u64 ms.
    let huge = Duration::from_millis(u64::MAX - u64::MAX % 10);
    let message = panic_message(|| drop(keyed(1).strict().limit_per(huge, 5)));
    assert!(message.contains("under `strict`"), "{message}");
    let message = panic_message(|| drop(keyed(1).limit_per(huge, 5).strict()));
    assert!(message.contains("SlidingWindowLayer::strict"), "{message}");
}

#[test]
fn throttle_and_prioritized_are_refused_with_limit_per_in_either_order() {
    // A compact layer takes further windows, in either order.
    drop(keyed(1).limit_per(MINUTE, 5).compact().handle());
    drop(keyed(1).compact().limit_per(MINUTE, 5).handle());
    for message in [
        panic_message(|| {
            drop(
                keyed(1)
                    .limit_per(MINUTE, 5)
                    .throttle(Duration::from_secs(1)),
            )
        }),
        panic_message(|| {
            drop(
                keyed(1)
                    .throttle(Duration::from_secs(1))
                    .limit_per(MINUTE, 5),
            )
        }),
    ] {
        assert!(
            message.contains("`throttle`") && message.contains("`limit_per`"),
            "{message}"
        );
    }
    let prioritized = |p: &http::request::Parts| p.headers.contains_key("x-priority");
    for message in [
        panic_message(|| drop(keyed(1).limit_per(MINUTE, 5).prioritized(prioritized))),
        panic_message(|| drop(keyed(1).prioritized(prioritized).limit_per(MINUTE, 5))),
    ] {
        assert!(
            message.contains("`prioritized`") && message.contains("`limit_per`"),
            "{message}"
        );
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_shared_store_takes_limit_per_in_either_order_and_its_fallback_keeps_every_window() {
    use tower::ServiceExt;
    use tower_sliding_window::store::{RedisStore, StoreFailure};
    // Lazy, on a port nothing listens on: the store stays in fallback, and
    // the failure policy (this replica's own windows) answers.
    let store = RedisStore::connect_lazy("redis://127.0.0.1:1/").unwrap();
    let clock = clock();
    for layer in [
        keyed(5).limit_per(MINUTE, 3).store(store.clone()),
        keyed(5).store(store.clone()).limit_per(MINUTE, 3),
    ] {
        let layer = layer
            .clock(clock.clone())
            .on_store_error(StoreFailure::Local);
        let stats = layer.handle();
        let service = layer.layer(inner());
        let mut statuses = Vec::new();
        for _ in 0..4 {
            let response = service
                .clone()
                .oneshot(req_with("/", KEY_HEADER, "k"))
                .await
                .unwrap();
            statuses.push(response.status());
        }
        // The minute's 3 passes, then its refusal; charged to both windows.
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
        assert_eq!(passes(&stats, "k"), [3, 3]);
        clock.advance(Duration::from_secs(1));
    }
}

#[test]
fn hostile_limits_and_intervals_are_handled() {
    let clock = clock();
    // u64::MAX in every window: everything passes, headers are well formed.
    let layer = keyed(u64::MAX)
        .limit_per(MINUTE, u64::MAX)
        .clock(clock.clone())
        .headers_on_pass(true);
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    for _ in 0..100 {
        assert_eq!(call(&mut service, "a").status, StatusCode::OK);
    }
    let answer = call(&mut service, "a");
    assert!(answer
        .header("ratelimit-policy")
        .contains(&format!("q={}", u64::MAX)));
    assert_eq!(passes(&stats, "a"), vec![101, 101]);

    // A window whose limit is 0 refuses everything, for its whole length,
    // and charges no other window.
    let layer = keyed(10).limit_per(MINUTE, 0).clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let refused = call(&mut service, "a");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), "60");
    assert_eq!(passes(&stats, "a"), vec![0, 0]);

    // 1 ms and one year.
    let year = Duration::from_secs(365 * 24 * 3600);
    let layer = keyed(3)
        .window(Duration::from_millis(2), 1)
        .limit_per(Duration::from_millis(1), 2)
        .limit_per(year, 5)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let mut passed = 0;
    for _ in 0..20 {
        for _ in 0..4 {
            passed += usize::from(call(&mut service, "a").status == StatusCode::OK);
        }
        clock.advance(Duration::from_millis(1));
    }
    assert_eq!(passed, 5, "the year's window holds");
    assert_eq!(stats.windows(&key("a")).unwrap()[2].pass, 5);
    let refused = call(&mut service, "a");
    let retry: u64 = refused.header("retry-after").parse().unwrap();
    assert!(retry > 364 * 24 * 3600, "about a year: {retry}");
}

#[test]
fn a_thousand_windows_are_all_charged_or_none() {
    let clock = clock();
    let mut layer = keyed(1_000).clock(clock.clone());
    // 2 s .. 1 001 s; the longest has the smallest limit.
    for i in 0..1_000u64 {
        layer = layer.limit_per(Duration::from_secs(i + 2), 2_000 - i);
    }
    let last = Duration::from_secs(1_001);
    let layer = layer.rule_per("a", last, 3);
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let passed = (0..10)
        .filter(|_| call(&mut service, "a").status == StatusCode::OK)
        .count();
    assert_eq!(passed, 3);
    let windows: Vec<WindowCount> = stats.windows(&key("a")).unwrap();
    assert_eq!(windows.len(), 1_001);
    assert!(windows.iter().all(|w| w.pass == 3), "every window holds 3");
    assert_eq!(windows[1_000].limit, 3);
    // One more window than the maximum is refused.
    let message = panic_message(|| {
        let mut layer = keyed(1);
        for i in 0..1_025u64 {
            layer = layer.limit_per(Duration::from_secs(i + 2), 1);
        }
    });
    assert!(message.contains("at most 1024"), "{message}");
}

#[test]
fn the_global_key_and_the_overflow_entry_have_every_window() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .limit_per(MINUTE, 2)
        .clock(clock.clone());
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    let ok = (0..4)
        .filter(|_| call(&mut service, "x").status == StatusCode::OK)
        .count();
    assert_eq!(ok, 2);
    assert_eq!(
        stats
            .windows(&())
            .unwrap()
            .iter()
            .map(|w| w.pass)
            .collect::<Vec<_>>(),
        vec![2, 2]
    );

    let layer = keyed(5).limit_per(MINUTE, 2).max_keys(1).clock(clock);
    let mut service = layer.layer(inner());
    call(&mut service, "a");
    let ok = (0..4)
        .filter(|_| call(&mut service, "b").status == StatusCode::OK)
        .count();
    assert_eq!(ok, 2, "the overflow entry has the minute's window too");
    // Its passes at 10 050 are in the minute's bucket [6 000, 12 000),
    // which leaves the window at 66 000.
    let refused = call(&mut service, "c");
    assert_eq!(
        refused.header("ratelimit"),
        r#""overflow-60000ms";r=0;t=56"#
    );
}

#[test]
fn a_compact_layer_reads_its_one_window() {
    let clock = clock();
    let layer = keyed(3).compact().clock(clock);
    let stats = layer.handle();
    let mut service = layer.layer(inner());
    call(&mut service, "a");
    stats.set_limit("a", 7);
    assert_eq!(
        stats.limits_per(&key("a")),
        vec![(Duration::from_secs(1), 7)]
    );
    assert_eq!(
        stats.limits_per(&key("b")),
        vec![(Duration::from_secs(1), 3)]
    );
    let windows = stats.windows(&key("a")).unwrap();
    assert_eq!(
        windows
            .iter()
            .map(|w| (w.interval, w.limit, w.pass))
            .collect::<Vec<_>>(),
        vec![(Duration::from_secs(1), 7, 1)]
    );
}

mod differential {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// A further window that can never refuse changes no answer: the
        /// same statuses and `Retry-After` as the layer without it, for any
        /// arrival times and any first limit (0 included).
        #[test]
        fn a_window_that_never_refuses_changes_no_answer(
            steps in proptest::collection::vec((0u64..400, 1usize..4), 1..40),
            limit in 0u64..6,
        ) {
            let clock_one = ManualClock::new(10_000);
            let clock_two = ManualClock::new(10_000);
            let mut one = keyed(limit).clock(clock_one.clone()).layer(inner());
            let mut two = keyed(limit)
                .limit_per(MINUTE, u64::MAX)
                .clock(clock_two.clone())
                .layer(inner());
            for (advance, burst) in steps {
                clock_one.advance(Duration::from_millis(advance));
                clock_two.advance(Duration::from_millis(advance));
                for _ in 0..burst {
                    let a = call(&mut one, "k");
                    let b = call(&mut two, "k");
                    prop_assert_eq!(a.status, b.status);
                    prop_assert_eq!(
                        a.headers.get("retry-after"),
                        b.headers.get("retry-after")
                    );
                }
            }
        }
    }
}
