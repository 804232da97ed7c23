//! `StatsHandle::apply_rules`: all or nothing, errors that name the rule and
//! the field, no burst on a change.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Barrier};

use http::StatusCode;
use tower_sliding_window::rules::{Rules, RulesErrorKind, MAX_LIMIT};
use tower_sliding_window::{
    GlobalKey, HeaderKey, PathKey, PeerIpKey, SlidingWindowLayer, StatsHandle,
};

use crate::app;
use crate::support::{assert_statuses, at, clock, ok_then_429, req, send, statuses};

/// `(pass, limit)` of every key with an entry, sorted, and the overflow
/// entry's limit: what a rejected document must leave as it was.
fn state(stats: &StatsHandle<String>) -> (Vec<(String, u64, u64)>, u64) {
    let mut keys: Vec<_> = stats
        .snapshots()
        .into_iter()
        .map(|(key, s)| (key, s.pass, s.limit))
        .collect();
    keys.sort();
    (keys, stats.overflow().limit)
}

#[tokio::test]
async fn every_invalid_document_names_its_rule_and_field_and_changes_nothing() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    stats
        .apply_rules(&Rules::new().default_limit(4).limit("/a", 2))
        .unwrap();
    statuses(&app, "/a", 3).await;
    statuses(&app, "/b", 1).await;
    let before = state(&stats);
    assert_eq!(
        before,
        (vec![("/a".into(), 2, 2), ("/b".into(), 1, 4)], 4),
        "{}",
        at(&clock)
    );

    let long = format!("/{}", "x".repeat(300));
    // Each document has valid rules before the bad one (keys are checked
    // in order): applying part of it would show.
    let cases: Vec<(Rules, &str, &str, String)> = vec![
        (
            Rules::new().default_limit(MAX_LIMIT + 1).limit("/a", 100),
            "default",
            "limit",
            format!(
                "rules: default: limit must be at most {MAX_LIMIT} (got {})",
                MAX_LIMIT + 1
            ),
        ),
        (
            Rules::new()
                .default_limit(100)
                .limit("/a", 100)
                .limit("/login", u64::MAX),
            r#"limits["/login"]"#,
            "limit",
            format!(
                r#"rules: limits["/login"]: limit must be at most {MAX_LIMIT} (got {})"#,
                u64::MAX
            ),
        ),
        (
            Rules::new()
                .default_limit(100)
                .limit("/a", 100)
                .limit(long.clone(), 1),
            "",
            "key",
            format!(
                "rules: limits[\"/{}…\"]: key must be at most 256 bytes, as a longer one is \
                 keyed by its digest (got 301 bytes)",
                "x".repeat(63)
            ),
        ),
    ];
    for (i, (rules, rule, field, message)) in cases.into_iter().enumerate() {
        let err = stats.apply_rules(&rules).unwrap_err();
        assert_eq!(err.to_string(), message, "case {i}");
        assert_eq!(err.kind(), RulesErrorKind::Invalid, "case {i}");
        assert_eq!(err.field(), Some(field), "case {i}");
        if !rule.is_empty() {
            assert_eq!(err.rule(), Some(rule), "case {i}");
        }
        assert_eq!(state(&stats), before, "case {i}: {}", at(&clock));
        let status = stats.rules_status();
        assert_eq!(status.version, 1, "case {i}");
        assert_eq!(status.last_error, Some(err), "case {i}");
        // And requests see the old limits: /a is full at 2, /b has 3 left.
        assert_eq!(statuses(&app, "/a", 1).await, ok_then_429(0, 1), "case {i}");
    }
    assert_statuses!(&app, "/b", 3, 1, &clock);

    // A good document clears the error.
    assert_eq!(stats.apply_rules(&Rules::new()), Ok(2));
    assert_eq!(stats.rules_status().last_error, None);
}

#[test]
fn keys_are_checked_against_the_key_type() {
    // Two texts of one address.
    let peers = SlidingWindowLayer::qps(10).key(PeerIpKey).handle();
    let err = peers
        .apply_rules(&Rules::new().limit("::1", 1).limit("0::1", 2))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rules: limits["::1"]: key names the same key as limits["0::1"]"#
    );
    let err = peers
        .apply_rules(
            &Rules::new()
                .limit("10.0.0.7", 1)
                .limit("::ffff:10.0.0.7", 2),
        )
        .unwrap_err();
    assert_eq!(err.field(), Some("key"));
    assert!(err.to_string().contains("names the same key as"), "{err}");
    let err = peers
        .apply_rules(&Rules::new().limit("localhost", 1))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rules: limits["localhost"]: key must be an IP address (invalid IP address syntax)"#
    );
    // Hostile text in a key is escaped in the message.
    let err = peers
        .apply_rules(&Rules::new().limit("1.2.3.4\nrules: forged", 1))
        .unwrap_err();
    assert_eq!(err.rule(), Some(r#"limits["1.2.3.4\nrules: forged"]"#));
    assert!(!err.to_string().contains('\n'));
    assert_eq!(peers.rules_status().version, 0);
    assert_eq!(
        peers.apply_rules(&Rules::new().limit("::ffff:10.0.0.7", 2)),
        Ok(1)
    );
    assert!(peers.remove_limit(&Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 7)))));

    // The global key takes a default only.
    let global = SlidingWindowLayer::qps(10).key(GlobalKey).handle();
    let err = global
        .apply_rules(&Rules::new().limit("all", 1))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"rules: limits["all"]: the layer has one global key: set its limit with `default`"#
    );

    // A header value names `Some(value)`.
    let tenants = SlidingWindowLayer::qps(10)
        .key(HeaderKey::new(http::HeaderName::from_static("x-tenant")))
        .handle();
    tenants.apply_rules(&Rules::new().limit("a", 1)).unwrap();
    assert!(tenants.remove_limit(&Some("a".to_owned())));
}

#[tokio::test]
async fn applying_keeps_every_window_no_burst() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);

    assert_eq!(statuses(&app, "/a", 6).await, ok_then_429(6, 0));
    assert_eq!(statuses(&app, "/b", 4).await, ok_then_429(4, 0));

    // /a lowered below what passed, the default lowered under /b's four
    // passes plus one: /a refuses at once, /b takes one more.
    stats
        .apply_rules(&Rules::new().default_limit(5).limit("/a", 3))
        .unwrap();
    assert_statuses!(&app, "/a", 0, 1, &clock);
    assert_statuses!(&app, "/b", 1, 1, &clock);
    let answer = send(&app, req("/a")).await;
    assert!(answer.header("ratelimit-policy").ends_with(";q=3;w=1"));

    // Raised: only the difference passes, not a fresh window.
    stats
        .apply_rules(&Rules::new().default_limit(7).limit("/a", 8))
        .unwrap();
    assert_statuses!(&app, "/a", 2, 2, &clock);
    assert_statuses!(&app, "/b", 2, 1, &clock);

    // /a's rule gone and no default: /a and /b are back on the layer's own
    // 10, with their passes (8 and 7) counted.
    stats.apply_rules(&Rules::new()).unwrap();
    assert_statuses!(&app, "/a", 2, 1, &clock);
    assert_statuses!(&app, "/b", 3, 1, &clock);
    assert_eq!(
        send(&app, req("/a")).await.header("ratelimit-policy"),
        r#""default";q=10;w=1"#
    );
    assert_eq!(
        stats.snapshot("/a").map(|s| (s.pass, s.limit)),
        Some((10, 10))
    );

    // Once the window has slid, the limits hold on their own.
    stats
        .apply_rules(&Rules::new().default_limit(2).limit("/a", 4))
        .unwrap();
    clock.set(11_000);
    assert_statuses!(&app, "/a", 4, 1, &clock);
    assert_statuses!(&app, "/b", 2, 1, &clock);
    assert_statuses!(&app, "/new", 2, 1, &clock);
}

#[tokio::test]
async fn a_document_replaces_builder_rules_and_set_limit() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .rule("/built", 1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    stats.set_limit("/set", 1);
    stats.apply_rules(&Rules::new().limit("/file", 1)).unwrap();
    for path in ["/built", "/set"] {
        assert_eq!(statuses(&app, path, 3).await, ok_then_429(3, 0), "{path}");
        assert!(!stats.remove_limit(path), "{path}");
    }
    assert_eq!(statuses(&app, "/file", 2).await, ok_then_429(1, 1));
}

#[tokio::test]
async fn the_overflow_entry_follows_the_default_unless_it_has_its_own() {
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .max_keys(1)
        .clock(clock());
    let stats = layer.handle();
    let app = app(layer);
    statuses(&app, "/a", 1).await;
    assert_eq!(statuses(&app, "/b", 1).await, vec![StatusCode::OK]);
    stats.apply_rules(&Rules::new().default_limit(2)).unwrap();
    assert_eq!(stats.overflow().limit, 2);
    assert_eq!(statuses(&app, "/c", 2).await, ok_then_429(1, 1));

    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .max_keys(1)
        .overflow_limit(5)
        .clock(clock());
    let stats = layer.handle();
    stats.apply_rules(&Rules::new().default_limit(2)).unwrap();
    assert_eq!(stats.overflow().limit, 5);
}

#[tokio::test]
async fn the_global_key_takes_the_default_before_and_after_its_first_request() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10).clock(clock.clone());
    let stats = layer.handle();
    stats.apply_rules(&Rules::new().default_limit(2)).unwrap();
    let app = app(layer);
    assert_statuses!(&app, "/", 2, 1, &clock);
    stats.apply_rules(&Rules::new().default_limit(4)).unwrap();
    assert_statuses!(&app, "/", 2, 1, &clock);
    assert_eq!(stats.snapshot(&()).map(|s| s.limit), Some(4));
}

/// A first request of the global key racing a document: whichever comes
/// first, the key ends on the document's limit.
#[test]
fn the_global_key_never_keeps_an_old_default_after_a_race() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for round in 0..2000 {
        let layer = SlidingWindowLayer::qps(10).clock(clock());
        let stats = layer.handle();
        let app = app(layer);
        let barrier = Arc::new(Barrier::new(2));
        let applier = {
            let (stats, barrier) = (stats.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                stats.apply_rules(&Rules::new().default_limit(1)).unwrap();
            })
        };
        barrier.wait();
        runtime.block_on(send(&app, req("/")));
        applier.join().unwrap();
        assert_eq!(
            stats.snapshot(&()).map(|s| s.limit),
            Some(1),
            "round {round}"
        );
    }
}

/// Documents applied from several threads at once are applied one after
/// the other: the table ends on one whole document.
#[tokio::test]
async fn documents_applied_at_once_never_mix() {
    let layer = SlidingWindowLayer::qps(10).key(PathKey).clock(clock());
    let stats = layer.handle();
    let app = app(layer);
    let paths: Vec<String> = (0..64).map(|i| format!("/k{i}")).collect();
    for path in &paths {
        statuses(&app, path, 1).await;
    }
    let threads: Vec<_> = (1..=4u64)
        .map(|n| {
            let (stats, paths) = (stats.clone(), paths.clone());
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let mut rules = Rules::new().default_limit(n);
                    for path in &paths {
                        rules = rules.limit(path.clone(), n * 100);
                    }
                    stats.apply_rules(&rules).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let limits: std::collections::BTreeSet<u64> = stats
        .snapshots()
        .into_iter()
        .map(|(_, s)| s.limit)
        .collect();
    assert_eq!(limits.len(), 1, "{limits:?}");
    assert_eq!(stats.rules_status().version, 200);
}

// A compact layer once took no part of a document but its route rules:
// `apply_rules` wrote the default and the per-key limits where only a full
// table reads them, so a compact layer kept its builder limits whatever
// the document said.
#[tokio::test]
async fn a_compact_layer_takes_the_documents_default_and_per_key_limits() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .clock(clock.clone())
        .rule("/old", 1)
        .compact();
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(statuses(&app, "/a", 3).await, ok_then_429(3, 0));
    stats
        .apply_rules(&Rules::new().default_limit(4).limit("/seven", 7))
        .unwrap();
    assert_eq!(
        statuses(&app, "/a", 2).await,
        ok_then_429(1, 1),
        "{}",
        at(&clock)
    );
    assert_eq!(statuses(&app, "/b", 5).await, ok_then_429(4, 1));
    assert_eq!(statuses(&app, "/seven", 8).await, ok_then_429(7, 1));
    // The builder's rule is gone: /old is on the default.
    assert_eq!(statuses(&app, "/old", 5).await, ok_then_429(4, 1));
    assert_eq!(stats.snapshot("/seven").unwrap().limit, 7);
    assert_eq!(stats.snapshot("/a").unwrap().limit, 4);
    assert_eq!(stats.overflow().limit, 4);
    // A document without the rule: /seven back on the default, its
    // window kept; without a default, the layer's own.
    stats.apply_rules(&Rules::new().default_limit(8)).unwrap();
    assert!(!stats.remove_limit("/seven"));
    assert_eq!(statuses(&app, "/seven", 2).await, ok_then_429(1, 1));
    stats.apply_rules(&Rules::new()).unwrap();
    assert_eq!(stats.snapshot("/a").unwrap().limit, 10);
    assert_eq!(stats.overflow().limit, 10);
}
