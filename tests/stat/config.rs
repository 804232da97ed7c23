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
