//! Window configuration: every constructor rejects a bad window with a
//! `ConfigError` that names the field and the rule, and none of them panics.

use std::error::Error;
use std::panic;

use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::stat::{
    ArrayMetric, BucketLeapArray, FutureBucketLeapArray, LeapArray, MetricBucket,
    OccupiableBucketLeapArray, StatisticNode,
};
use tower_sliding_window::ConfigError;

/// Builds something from `(sample_count, interval_ms)`, keeping only the
/// outcome.
type Make = fn(usize, u64) -> Result<(), ConfigError>;

/// Every public constructor that takes a window shape.
fn constructors() -> Vec<(&'static str, Make)> {
    vec![
        ("LeapArray::new", |sc, i| {
            LeapArray::<MetricBucket>::new(sc, i).map(drop)
        }),
        ("BucketLeapArray", |sc, i| {
            BucketLeapArray::new(sc, i).map(drop)
        }),
        ("FutureBucketLeapArray::new", |sc, i| {
            FutureBucketLeapArray::new(sc, i).map(drop)
        }),
        ("OccupiableBucketLeapArray::new", |sc, i| {
            OccupiableBucketLeapArray::new(sc, i).map(drop)
        }),
        ("ArrayMetric::new", |sc, i| {
            ArrayMetric::new(sc, i).map(drop)
        }),
        ("ArrayMetric::with_clock", |sc, i| {
            ArrayMetric::with_clock(sc, i, ManualClock::new(0)).map(drop)
        }),
        ("ArrayMetric::occupiable", |sc, i| {
            ArrayMetric::occupiable(sc, i, ManualClock::new(0)).map(drop)
        }),
        ("StatisticNode::with_second_window", |sc, i| {
            StatisticNode::with_second_window(ManualClock::new(0), sc, i).map(drop)
        }),
    ]
}

/// Calls `f`, failing the test (rather than aborting it) if `f` panics.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T + panic::UnwindSafe) -> T {
    panic::catch_unwind(f).unwrap_or_else(|_| panic!("{what} panicked"))
}

fn expect_error(sample_count: usize, interval_ms: u64) -> Vec<(&'static str, ConfigError)> {
    constructors()
        .into_iter()
        .map(|(name, make)| {
            let result = no_panic(name, move || make(sample_count, interval_ms));
            let err = result.expect_err(&format!(
                "{name}({sample_count}, {interval_ms}) must be rejected"
            ));
            (name, err)
        })
        .collect()
}

#[test]
fn zero_sample_count_is_rejected() {
    for (name, err) in expect_error(0, 1000) {
        assert_eq!(err.field(), "sample_count", "{name}");
        assert_eq!(err.rule(), "must be greater than 0", "{name}");
        let text = err.to_string();
        assert!(text.contains("`sample_count`"), "{name}: {text}");
        assert!(text.contains("greater than 0"), "{name}: {text}");
    }
}

#[test]
fn zero_interval_is_rejected() {
    for (name, err) in expect_error(2, 0) {
        assert_eq!(err.field(), "interval_ms", "{name}");
        assert_eq!(err.rule(), "must be greater than 0", "{name}");
        let text = err.to_string();
        assert!(text.contains("`interval_ms`"), "{name}: {text}");
        assert!(text.contains("greater than 0"), "{name}: {text}");
    }
    // Both zero: the sample count is reported first.
    for (name, err) in expect_error(0, 0) {
        assert_eq!(err.field(), "sample_count", "{name}");
    }
}

#[test]
fn an_interval_not_divisible_by_the_sample_count_is_rejected() {
    for (sc, interval) in [(3, 1000), (7, 1000), (2, 1), (1000, 999), (4, 1002)] {
        for (name, err) in expect_error(sc, interval) {
            assert_eq!(err.field(), "interval_ms", "{name}({sc}, {interval})");
            assert_eq!(
                err.rule(),
                "must be a multiple of `sample_count`",
                "{name}({sc}, {interval})"
            );
            let text = err.to_string();
            assert!(text.contains("`interval_ms`"), "{name}: {text}");
            assert!(
                text.contains("multiple of `sample_count`"),
                "{name}: {text}"
            );
            assert!(text.contains(&interval.to_string()), "{name}: {text}");
        }
    }
}

#[test]
fn the_message_has_the_documented_form() {
    let err = ArrayMetric::new(3, 1000).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid `interval_ms`: must be a multiple of `sample_count` (got 1000, sample_count = 3)"
    );
    let err = ArrayMetric::new(0, 1000).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid `sample_count`: must be greater than 0 (got 0)"
    );
}

#[test]
fn an_absurd_sample_count_is_rejected_not_allocated() {
    for (name, err) in expect_error(usize::MAX, u64::MAX) {
        assert_eq!(err.field(), "sample_count", "{name}");
    }
}

#[test]
fn a_sample_count_above_600_is_rejected() {
    // Each bucket is allocated up front, per key: 2^20 buckets used to be
    // accepted (80 MiB per key).
    for (name, err) in expect_error(601, 601) {
        assert_eq!(err.field(), "sample_count", "{name}");
        assert_eq!(err.rule(), "must be at most 600", "{name}");
        assert!(err.to_string().contains("601"), "{name}: {err}");
    }
    for (name, make) in constructors() {
        assert!(make(600, 60_000).is_ok(), "{name}(600, 60 000)");
    }
}

#[test]
fn valid_shapes_are_accepted() {
    for (sc, interval) in [
        (1, 1),
        (1, 1000),
        (2, 1000),
        (10, 1000),
        (60, 60_000),
        (7, 7),
    ] {
        for (name, make) in constructors() {
            let result = no_panic(name, move || make(sc, interval));
            assert!(result.is_ok(), "{name}({sc}, {interval}): {result:?}");
        }
    }
    let array = BucketLeapArray::new(7, 7).unwrap();
    assert_eq!(array.window_length_ms(), 1);
}

#[test]
fn config_error_is_a_std_error() {
    let err = ArrayMetric::new(0, 10).unwrap_err();
    let boxed: Box<dyn Error + Send + Sync> = Box::new(err.clone());
    assert!(boxed.source().is_none());
    assert_eq!(boxed.to_string(), err.to_string());
    // Also exported from `stat`.
    let same: tower_sliding_window::stat::ConfigError = err.clone();
    assert_eq!(same, err);
    assert!(format!("{err:?}").contains("sample_count"));
}

// ------------------------------------------------- the layer's settings

mod layer {
    use std::convert::Infallible;
    use std::panic::{self, AssertUnwindSafe};
    use std::time::Duration;

    use axum::body::Body;
    use http::{Request, Response, StatusCode};
    use proptest::prelude::*;
    use tower::{service_fn, Layer, ServiceExt};
    use tower_sliding_window::clock::ManualClock;
    use tower_sliding_window::SlidingWindowLayer;

    /// The message of the panic `build` ends with, or `None` if it builds.
    fn construction_panic<T>(build: impl FnOnce() -> T) -> Option<String> {
        let outcome = panic::catch_unwind(AssertUnwindSafe(build));
        match outcome {
            Ok(_) => None,
            Err(payload) => Some(
                payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        }
    }

    /// The longest interval of 600 buckets, as a hostile operator writes it.
    fn longest_600() -> Duration {
        Duration::from_millis(u64::MAX / 600 * 600)
    }

    #[test]
    fn a_strict_window_whose_departed_bucket_overflows_is_rejected_in_either_order() {
        let messages = [
            construction_panic(|| {
                SlidingWindowLayer::qps(10)
                    .window(longest_600(), 600)
                    .strict()
            }),
            construction_panic(|| {
                SlidingWindowLayer::qps(10)
                    .strict()
                    .window(longest_600(), 600)
            }),
        ];
        for message in messages {
            let message = message.expect("built, then every request would panic");
            assert!(message.contains("invalid `interval`"), "{message}");
            assert!(message.contains("strict"), "{message}");
        }
        // Half of it is still fine.
        let half = Duration::from_millis(u64::MAX / 1200 * 600);
        assert!(
            construction_panic(|| SlidingWindowLayer::qps(10).window(half, 600).strict()).is_none()
        );
    }

    #[test]
    fn a_rejection_status_that_is_not_an_error_is_rejected() {
        for code in [100, 101, 200, 204, 302, 304] {
            let status = StatusCode::from_u16(code).unwrap();
            let message = construction_panic(|| SlidingWindowLayer::qps(10).status(status))
                .unwrap_or_else(|| panic!("status({code}) accepted"));
            assert!(message.contains("invalid `status`"), "{message}");
            assert!(message.contains(&code.to_string()), "{message}");
        }
        for code in [400, 403, 429, 499, 500, 503, 599] {
            let status = StatusCode::from_u16(code).unwrap();
            assert!(
                construction_panic(|| SlidingWindowLayer::qps(10).status(status)).is_none(),
                "status({code}) refused"
            );
        }
    }

    /// A behaviour, with its hostile argument.
    #[derive(Debug, Clone)]
    enum Behaviour {
        Plain,
        Throttle(Duration),
        WarmUp(Duration),
        Concurrency(u64),
        WarmThrottle(Duration, Duration),
        Prioritized,
    }

    fn durations() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::from_millis(1)),
            Just(Duration::from_secs(10)),
            Just(Duration::from_millis(u64::MAX)),
            Just(Duration::MAX),
            (1..u64::MAX).prop_map(Duration::from_millis),
        ]
    }

    fn behaviours() -> impl Strategy<Value = Behaviour> {
        prop_oneof![
            Just(Behaviour::Plain),
            durations().prop_map(Behaviour::Throttle),
            durations().prop_map(Behaviour::WarmUp),
            prop_oneof![Just(1), Just(u64::MAX), any::<u64>()].prop_map(Behaviour::Concurrency),
            (durations(), durations()).prop_map(|(w, p)| Behaviour::WarmThrottle(w, p)),
            Just(Behaviour::Prioritized),
        ]
    }

    fn u64s() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            Just(1),
            Just(u64::MAX),
            Just(u64::MAX / 2),
            Just(u64::MAX - 1),
            any::<u64>(),
        ]
    }

    /// A window `(interval, sample_count)` that may or may not be valid.
    fn windows() -> impl Strategy<Value = (Duration, usize)> {
        prop_oneof![Just(1usize), Just(2), Just(10), Just(600), 1usize..=600].prop_flat_map(
            |sample_count| {
                let longest = u64::MAX / sample_count as u64;
                (
                    Just(sample_count),
                    prop_oneof![
                        Just(1u64),
                        Just(1_000),
                        // The longest valid interval, and the longest a
                        // strict window accepts.
                        Just(longest),
                        Just(longest / 2),
                        Just(longest - 1),
                        1..=longest,
                        any::<u64>(),
                    ],
                )
                    .prop_map(|(sample_count, per_bucket)| {
                        let interval = per_bucket.saturating_mul(sample_count as u64);
                        (Duration::from_millis(interval), sample_count)
                    })
            },
        )
    }

    /// Builds a layer from hostile settings; a setting the builder refuses
    /// must be refused with a message naming it. Returns the layer if it was
    /// built.
    fn build(
        limit: u64,
        (interval, sample_count): (Duration, usize),
        strict: bool,
        behaviour: &Behaviour,
        clock: &ManualClock,
    ) -> Option<SlidingWindowLayer> {
        let behaviour = behaviour.clone();
        let clock = clock.clone();
        let outcome = panic::catch_unwind(AssertUnwindSafe(move || {
            let mut layer = SlidingWindowLayer::qps(limit)
                .window(interval, sample_count)
                .clock(clock);
            if strict {
                layer = layer.strict();
            }
            match behaviour {
                Behaviour::Plain => layer,
                Behaviour::Throttle(wait) => layer.throttle(wait),
                Behaviour::WarmUp(period) => layer.warm_up(period),
                Behaviour::Concurrency(n) => layer.max_concurrency(n),
                Behaviour::WarmThrottle(wait, period) => layer.throttle(wait).warm_up(period),
                Behaviour::Prioritized => layer.prioritized(|_| true),
            }
        }));
        match outcome {
            Ok(layer) => Some(layer),
            Err(payload) => {
                let message = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                assert!(
                    message.contains("SlidingWindowLayer::") && message.contains("invalid `"),
                    "refused without naming the setting: {message:?}"
                );
                None
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Whatever the settings and the clock's readings, a layer that was
        /// built answers every request: no overflow, no panic.
        #[test]
        fn no_request_panics_under_extreme_settings(
            limit in u64s(),
            window in windows(),
            strict in any::<bool>(),
            behaviour in behaviours(),
            start in u64s(),
            steps in proptest::collection::vec(u64s(), 1..6),
        ) {
            let clock = ManualClock::new(start);
            let Some(layer) = build(limit, window, strict, &behaviour, &clock) else {
                return Ok(());
            };
            let stats = layer.handle();
            let service = layer.layer(service_fn(|_: Request<Body>| async {
                Ok::<_, Infallible>(Response::new(Body::empty()))
            }));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async {
                for step in steps {
                    for _ in 0..3 {
                        let request = service.clone().oneshot(Request::new(Body::empty()));
                        // A request that waits is given up after a second
                        // (the paused clock gets there at once).
                        if let Ok(response) =
                            tokio::time::timeout(Duration::from_secs(1), request).await
                        {
                            let status = response.unwrap().status();
                            assert!(
                                status == StatusCode::OK
                                    || status == StatusCode::TOO_MANY_REQUESTS,
                                "{status}"
                            );
                        }
                    }
                    let _ = stats.snapshot(&());
                    let _ = stats.snapshots();
                    clock.set(step);
                }
            });
        }
    }
}
