//! The `windows` section of a rules document: the further windows'
//! defaults and per-key limits (`SlidingWindowLayer::limit_per`), all or
//! nothing, errors naming the rule and the field, in every format.

use std::time::Duration;

use http::StatusCode;
use tower_sliding_window::rules::{Rules, RulesErrorKind, WindowRules, MAX_LIMIT};
use tower_sliding_window::{PathKey, SlidingWindowLayer, StatsHandle};

use crate::app;
use crate::support::{clock, ok_then_429, statuses};

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3_600);

/// Every window's limit of `/a`, `/b` and a key with no rule.
fn limits(stats: &StatsHandle<String>) -> Vec<Vec<u64>> {
    ["/a", "/b", "/other"]
        .iter()
        .map(|k| {
            stats
                .limits_per(&(*k).to_owned())
                .into_iter()
                .map(|(_, limit)| limit)
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_document_sets_the_further_windows_and_leaves_the_first_to_default_and_limits() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .limit_per(MINUTE, 50)
        .limit_per(HOUR, 500)
        .rule_per("/b", HOUR, 7)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = app(layer);
    let toml = r#"
        default = 5
        [limits]
        "/a" = 4

        [windows."60s"]
        default = 3
        [windows."60s".limits]
        "/a" = 2

        [windows."60m".limits]
        "/b" = 1
    "#;
    let rules: Rules = toml::from_str(toml).unwrap();
    let mut hour = WindowRules::default();
    hour.limits.insert("/b".to_owned(), 1);
    let mut expected = Rules::new()
        .default_limit(5)
        .limit("/a", 4)
        .window_default(MINUTE, 3)
        .window_limit(MINUTE, "/a", 2);
    // The builder writes the minute "60s"; the document wrote the hour "60m".
    expected.windows.insert("60m".to_owned(), hour);
    assert_eq!(rules, expected);
    assert_eq!(stats.apply_rules(&rules), Ok(1));
    assert_eq!(
        limits(&stats),
        vec![vec![4, 2, 500], vec![5, 3, 1], vec![5, 3, 500]],
        "the rule_per of /b was replaced by the document's"
    );
    // The limits are the ones the layer admits against.
    assert_eq!(statuses(&app, "/a", 4).await, ok_then_429(2, 2));
    assert_eq!(statuses(&app, "/b", 3).await, ok_then_429(1, 2));
    assert_eq!(statuses(&app, "/c", 5).await, ok_then_429(3, 2));

    // A later document without `windows`: every window back to its
    // `limit_per` default, no per-key limit left.
    assert_eq!(stats.apply_rules(&Rules::new()), Ok(2));
    assert_eq!(
        limits(&stats),
        vec![vec![10, 50, 500], vec![10, 50, 500], vec![10, 50, 500]]
    );
    clock.advance(Duration::from_secs(1));
    let status = statuses(&app, "/a", 1).await;
    assert_eq!(status, vec![StatusCode::OK], "2 of 50 in the minute");
}

#[test]
fn every_invalid_window_rule_names_its_rule_and_field_and_changes_nothing() {
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .limit_per(MINUTE, 50);
    let stats = layer.handle();
    stats
        .apply_rules(&Rules::new().default_limit(8).window_limit(MINUTE, "/a", 9))
        .unwrap();
    let before = limits(&stats);
    let with = |interval: &str, window: WindowRules| {
        let mut rules = Rules::new().default_limit(1).limit("/a", 1);
        rules.windows.insert(interval.to_owned(), window);
        rules
    };
    let default = |limit| {
        let mut w = WindowRules::default();
        w.default = Some(limit);
        w
    };
    let keyed = |key: &str, limit| {
        let mut w = WindowRules::default();
        w.limits.insert(key.to_owned(), limit);
        w
    };
    let cases = [
        (
            with("7s", default(1)),
            r#"windows["7s"]"#,
            "interval",
            "no `limit_per` window of 7000 ms",
        ),
        (
            with("60", default(1)),
            r#"windows["60"]"#,
            "interval",
            "with a unit",
        ),
        (
            with("m", default(1)),
            r#"windows["m"]"#,
            "interval",
            "whole number",
        ),
        (
            with("99999999999999999999d", default(1)),
            r#"windows["99999999999999999999d"]"#,
            "interval",
            "whole number",
        ),
        (
            with("1m", default(MAX_LIMIT + 1)),
            r#"windows["1m"].default"#,
            "limit",
            "at most",
        ),
        (
            with("1m", keyed("/a", u64::MAX)),
            r#"windows["1m"].limits["/a"]"#,
            "limit",
            "at most",
        ),
        (
            with("60s", keyed(&"x".repeat(300), 1)),
            r#"windows["60s"].limits["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…"]"#,
            "key",
            "",
        ),
    ];
    for (rules, rule, field, reason) in cases {
        let err = stats.apply_rules(&rules).unwrap_err();
        assert_eq!(err.kind(), RulesErrorKind::Invalid);
        assert_eq!(err.rule(), Some(rule), "{err}");
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(err.reason().contains(reason), "{err}");
        assert_eq!(limits(&stats), before, "nothing applied: {err}");
    }
    // Two spellings of one window.
    let mut twice = Rules::new();
    twice.windows.insert("1m".to_owned(), default(3));
    twice.windows.insert("60s".to_owned(), default(4));
    let err = stats.apply_rules(&twice).unwrap_err();
    assert_eq!(err.field(), Some("interval"));
    assert!(err.reason().contains("same window"), "{err}");
    assert_eq!(limits(&stats), before);
    assert_eq!(stats.rules_status().version, 1);
}

#[test]
fn the_windows_section_reads_the_same_in_json_and_yaml_and_refuses_unknown_fields() {
    let json = r#"{ "windows": { "1h": { "default": 100, "limits": { "/a": 1 } } } }"#;
    let yaml = "windows:\n  1h:\n    default: 100\n    limits:\n      /a: 1\n";
    let from_json: Rules = serde_json::from_str(json).unwrap();
    let from_yaml: Rules = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(from_json, from_yaml);
    let round = serde_json::to_string(&from_json).unwrap();
    assert_eq!(serde_json::from_str::<Rules>(&round).unwrap(), from_json);
    let typo = r#"{ "windows": { "1h": { "defualt": 1 } } }"#;
    let err = serde_json::from_str::<Rules>(typo).unwrap_err();
    assert!(err.to_string().contains("unknown field `defualt`"), "{err}");
}

#[test]
fn a_layer_without_further_windows_refuses_a_windows_section() {
    let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
    let err = stats
        .apply_rules(&Rules::new().window_default(MINUTE, 1))
        .unwrap_err();
    assert_eq!(err.rule(), Some(r#"windows["60s"]"#));
    assert_eq!(err.field(), Some("interval"));
}

/// On a compact layer, a document's `windows` section sets the further
/// windows' defaults and per-key limits its keys admit against; a limit
/// above what a compact window counts (65 535) is taken as that maximum.
#[tokio::test]
async fn a_documents_windows_section_applies_to_a_compact_layer() {
    let layer = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .compact()
        .limit_per(MINUTE, 50)
        .clock(clock());
    let stats = layer.handle();
    let app = app(layer);
    let toml = r#"
        [windows."60s"]
        default = 3
        [windows."60s".limits]
        "/a" = 2
        "/b" = 100000
    "#;
    let rules: Rules = toml::from_str(toml).unwrap();
    assert_eq!(stats.apply_rules(&rules), Ok(1));
    assert_eq!(
        limits(&stats),
        vec![vec![10, 2], vec![10, 65_535], vec![10, 3]]
    );
    assert_eq!(statuses(&app, "/a", 4).await, ok_then_429(2, 2));
    assert_eq!(statuses(&app, "/c", 5).await, ok_then_429(3, 2));
    let windows = stats.windows(&"/a".to_owned()).unwrap();
    assert_eq!(
        windows
            .iter()
            .map(|w| (w.limit, w.pass))
            .collect::<Vec<_>>(),
        vec![(10, 2), (2, 2)]
    );
}
