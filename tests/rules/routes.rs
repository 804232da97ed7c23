//! The `routes` section of a rules document: a route's limit for every
//! client separately, in TOML, JSON and YAML, applied all or nothing, on
//! full and compact layers; and the `routes` of a further window's section
//! (`windows."60s".routes`).

use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::rules::{Rules, RulesErrorKind, MAX_LIMIT};
use tower_sliding_window::{
    ClientRouteKey, MatchedPathKey, PathKey, PeerIpKey, SlidingWindowLayer, StatsHandle,
};

use crate::support::{clock, ok_then_429, send};

type Layer = SlidingWindowLayer<ClientRouteKey<PeerIpKey, MatchedPathKey>>;
type Key = (Option<IpAddr>, String);

const LOGIN: &str = "POST /login";

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
        .layer(layer)
}

fn client(last: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, last], 40_000))
}

fn key(last: u8, route: &str) -> Key {
    (Some(client(last).ip()), route.to_owned())
}

async fn requests(app: &Router, method: Method, path: &str, last: u8, n: usize) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut request = Request::builder()
            .method(method.clone())
            .uri(path)
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(client(last));
        out.push(send(app, request).await.status);
    }
    out
}

async fn logins(app: &Router, last: u8, n: usize) -> Vec<StatusCode> {
    requests(app, Method::POST, "/login", last, n).await
}

/// The canonical document: 100 per client, 5 logins per client, and one
/// client with 50 logins.
fn canonical() -> Rules {
    Rules::new()
        .default_limit(100)
        .limit("10.0.0.7, POST /login", 50)
        .route_limit(LOGIN, 5)
}

#[test]
fn a_routes_section_reads_the_same_in_toml_json_and_yaml() {
    let toml_text = r#"
default = 100

[limits]
"10.0.0.7, POST /login" = 50

[routes]
"POST /login" = 5
"#;
    let json = r#"{ "default": 100, "limits": { "10.0.0.7, POST /login": 50 },
                    "routes": { "POST /login": 5 } }"#;
    let yaml =
        "default: 100\nlimits:\n  \"10.0.0.7, POST /login\": 50\nroutes:\n  POST /login: 5\n";
    let from_toml: Rules = toml::from_str(toml_text).unwrap();
    let from_json: Rules = serde_json::from_str(json).unwrap();
    let from_yaml: Rules = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(from_toml, canonical());
    assert_eq!(from_json, canonical());
    assert_eq!(from_yaml, canonical());
    // Written back, and read again, it is the same document; a document
    // without routes writes no `routes`.
    let written = serde_json::to_string(&canonical()).unwrap();
    assert_eq!(
        serde_json::from_str::<Rules>(&written).unwrap(),
        canonical()
    );
    assert!(!serde_json::to_string(&Rules::new().limit("a", 1))
        .unwrap()
        .contains("routes"));
    // A route's limit is a number like any other.
    let text = serde_json::from_str::<Rules>(r#"{ "routes": { "POST /login": "five" } }"#);
    assert!(text.is_err());
    let negative = serde_json::from_str::<Rules>(r#"{ "routes": { "POST /login": -1 } }"#);
    assert!(negative.is_err());
}

#[tokio::test]
async fn a_documents_routes_limit_every_client_separately_and_exact_keys_win() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact);
        let stats = layer.handle();
        let app = app(layer);
        assert_eq!(stats.apply_rules(&canonical()), Ok(1));
        assert_eq!(
            logins(&app, 1, 6).await,
            ok_then_429(5, 1),
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, 2, 6).await,
            ok_then_429(5, 1),
            "compact {compact}"
        );
        assert_eq!(
            logins(&app, 7, 6).await,
            ok_then_429(6, 0),
            "compact {compact}"
        );
        assert_eq!(stats.snapshot(&key(7, LOGIN)).unwrap().limit, 50);
        assert_eq!(stats.snapshot(&key(1, LOGIN)).unwrap().limit, 5);
        assert_eq!(
            requests(&app, Method::GET, "/", 1, 101).await,
            ok_then_429(100, 1),
            "compact {compact}"
        );
        assert_eq!(stats.route_limits(), [(LOGIN.to_owned(), 5)]);
    }
}

#[tokio::test]
async fn a_route_changed_by_a_document_keeps_every_window() {
    for compact in [false, true] {
        let clock = clock();
        let layer = layer(&clock, compact);
        let stats = layer.handle();
        let app = app(layer);
        stats
            .apply_rules(&Rules::new().route_limit(LOGIN, 5))
            .unwrap();
        assert_eq!(logins(&app, 1, 3).await, ok_then_429(3, 0));
        stats
            .apply_rules(&Rules::new().route_limit(LOGIN, 4))
            .unwrap();
        assert_eq!(
            logins(&app, 1, 2).await,
            ok_then_429(1, 1),
            "compact {compact}"
        );
        // A document without the route: the route's clients are back on
        // the default, their windows kept.
        stats.apply_rules(&Rules::new().default_limit(6)).unwrap();
        assert!(stats.route_limits().is_empty());
        assert_eq!(
            logins(&app, 1, 3).await,
            ok_then_429(2, 1),
            "compact {compact}"
        );
    }
}

#[tokio::test]
async fn a_document_without_routes_removes_the_builders_route_rules() {
    let clock = clock();
    let layer = layer(&clock, false).route_rule(LOGIN, 1);
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(1, 1));
    stats.apply_rules(&Rules::new()).unwrap();
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(2, 0));
    assert_eq!(logins(&app, 2, 2).await, ok_then_429(2, 0));
}

/// Route rules, and each key's passes and limit.
type State = (Vec<(String, u64)>, Vec<(Key, u64, u64)>);

/// Route rules, each key's passes and limit, sorted: what a rejected
/// document must leave as it was.
fn state(stats: &StatsHandle<Key>) -> State {
    let mut keys: Vec<_> = stats
        .snapshots()
        .into_iter()
        .map(|(key, s)| (key, s.pass, s.limit))
        .collect();
    keys.sort();
    (stats.route_limits(), keys)
}

#[tokio::test]
async fn an_invalid_route_rule_names_its_rule_and_field_and_changes_nothing() {
    let clock = clock();
    let layer = layer(&clock, false);
    let stats = layer.handle();
    let app = app(layer);
    stats.apply_rules(&canonical()).unwrap();
    logins(&app, 1, 2).await;
    let before = state(&stats);

    let long = "r".repeat(tower_sliding_window::key::MAX_KEY_BYTES + 1);
    let cases = [
        (
            canonical().route_limit(long.as_str(), 1),
            format!("routes[\"{}…\"]", "r".repeat(64)),
            "route",
            "route must be at most 256 bytes",
        ),
        (
            canonical().route_limit("GET /", MAX_LIMIT + 1),
            r#"routes["GET /"]"#.to_owned(),
            "limit",
            "limit must be at most",
        ),
        (
            canonical().route_limit("GET /", 1).limit("10.0.0.7", 3),
            r#"limits["10.0.0.7"]"#.to_owned(),
            "key",
            "key must be `client, route`",
        ),
        (
            canonical().limit("10.0.0.300, GET /", 3),
            r#"limits["10.0.0.300, GET /"]"#.to_owned(),
            "key",
            "client part: key must be an IP address",
        ),
    ];
    for (rules, rule, field, says) in cases {
        let err = stats.apply_rules(&rules).unwrap_err();
        assert_eq!(err.kind(), RulesErrorKind::Invalid);
        assert_eq!(err.rule(), Some(rule.as_str()), "{err}");
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(err.reason().contains(says), "{err}");
        assert_eq!(state(&stats), before, "{err}");
        assert_eq!(stats.rules_status().version, 1);
    }
    // The limits still work as the first document set them.
    assert_eq!(logins(&app, 1, 4).await, ok_then_429(3, 1));
}

#[test]
fn routes_are_refused_for_a_layer_whose_keys_have_no_route_part() {
    let stats = SlidingWindowLayer::qps(10).key(PathKey).handle();
    let err = stats
        .apply_rules(&Rules::new().limit("/a", 1).route_limit(LOGIN, 5))
        .unwrap_err();
    assert_eq!(err.rule(), Some(r#"routes["POST /login"]"#));
    assert_eq!(err.field(), Some("route"));
    assert!(err.reason().contains("no route part"), "{err}");
    assert_eq!(stats.rules_status().version, 0);
    assert_eq!(stats.rules_status().last_error, Some(err));
}

#[tokio::test]
async fn routes_with_invalid_bytes_or_control_characters_are_refused_or_kept_harmless() {
    // Bytes that are not UTF-8 are not a document, in any format.
    let json = b"{ \"routes\": { \"POST /\xff\": 5 } }";
    assert!(serde_json::from_slice::<Rules>(json).is_err());
    assert!(serde_yaml_ng::from_slice::<Rules>(b"routes:\n  \"POST /\xfe\": 5\n").is_err());
    assert!(toml::from_slice::<Rules>(b"[routes]\n\"POST /\xff\" = 5\n").is_err());

    // Control characters are text: a route rule that no request matches,
    // and an error names it escaped, on one line.
    let clock = clock();
    let layer = layer(&clock, false);
    let stats = layer.handle();
    let app = app(layer);
    let odd = "POST /login\n\u{0}\u{1b}[31m";
    stats
        .apply_rules(&Rules::new().route_limit(odd, 0))
        .unwrap();
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(2, 0));
    let err = stats
        .apply_rules(&Rules::new().route_limit(odd, MAX_LIMIT + 1))
        .unwrap_err();
    let shown = err.to_string();
    assert!(
        !shown.contains('\n') && !shown.contains('\u{1b}'),
        "{shown}"
    );
    assert!(
        shown.starts_with(r#"rules: routes["POST /login\n\0\u{1b}[31m"]: limit"#),
        "{shown}"
    );
    assert_eq!(stats.route_limits(), [(odd.to_owned(), 0)]);
}

/// 100 per second and 6 000 per minute per client and route: the layer of
/// the per-client rule, its minute's route rules coming from documents.
fn minute_layer(clock: &ManualClock) -> Layer {
    layer(clock, false).limit_per(MINUTE, 6_000)
}

const MINUTE: std::time::Duration = std::time::Duration::from_secs(60);

/// The per-client rule as a document: 5 logins per client per minute,
/// and one client with 8.
fn minute_rules() -> Rules {
    Rules::new()
        .default_limit(100)
        .window_route_limit(MINUTE, LOGIN, 5)
        .window_limit(MINUTE, "10.0.0.7, POST /login", 8)
}

/// The minute's route rules, and each key's limit in each window.
type WindowState = (Vec<(String, u64)>, Vec<(Key, Vec<u64>)>);

/// The minute's route rules, and each key's limit in each window, sorted:
/// what a rejected document must leave as it was.
fn window_state(stats: &StatsHandle<Key>) -> WindowState {
    let mut keys: Vec<_> = stats
        .snapshots()
        .into_iter()
        .map(|(key, _)| {
            let limits = stats
                .windows(&key)
                .unwrap()
                .iter()
                .map(|w| w.limit)
                .collect();
            (key, limits)
        })
        .collect();
    keys.sort();
    (stats.route_limits_per(MINUTE).unwrap(), keys)
}

#[test]
fn a_windows_routes_section_reads_the_same_in_toml_json_and_yaml() {
    let toml_text = r#"
default = 100

[windows."60s".routes]
"POST /login" = 5

[windows."1m".limits]
"10.0.0.7, POST /login" = 8
"#;
    let json = r#"{ "default": 100, "windows": {
        "60s": { "routes": { "POST /login": 5 }, "limits": { "10.0.0.7, POST /login": 8 } } } }"#;
    let yaml = "default: 100\nwindows:\n  60s:\n    routes:\n      POST /login: 5\n    \
                limits:\n      \"10.0.0.7, POST /login\": 8\n";
    let from_json: Rules = serde_json::from_str(json).unwrap();
    let from_yaml: Rules = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(from_json, minute_rules());
    assert_eq!(from_yaml, minute_rules());
    // TOML names the window twice ("60s" and "1m"): the same window, which
    // applying refuses; as one name it reads as the others.
    let from_toml: Rules = toml::from_str(toml_text).unwrap();
    assert_eq!(from_toml.windows["60s"].routes[LOGIN], 5);
    let one_name: Rules = toml::from_str(&toml_text.replace("\"1m\"", "\"60s\"")).unwrap();
    assert_eq!(one_name, minute_rules());
    // Written back, and read again, it is the same document; a window
    // without routes writes no `routes`.
    let written = serde_json::to_string(&minute_rules()).unwrap();
    assert_eq!(
        serde_json::from_str::<Rules>(&written).unwrap(),
        minute_rules()
    );
    assert!(
        !serde_json::to_string(&Rules::new().window_default(MINUTE, 1))
            .unwrap()
            .contains("routes")
    );
    // A misspelt field inside a window is an error, not a silent no-op.
    let typo =
        serde_json::from_str::<Rules>(r#"{ "windows": { "60s": { "route": { "a": 1 } } } }"#);
    assert!(typo
        .unwrap_err()
        .to_string()
        .contains("unknown field `route`"));
    let text =
        serde_json::from_str::<Rules>(r#"{ "windows": { "60s": { "routes": { "a": "5" } } } }"#);
    assert!(text.is_err());

    // Applied, two names of one window are refused, naming the second.
    let clock = clock();
    let stats = minute_layer(&clock).handle();
    let err = stats.apply_rules(&from_toml).unwrap_err();
    assert_eq!(err.field(), Some("interval"), "{err}");
    assert_eq!(stats.apply_rules(&one_name), Ok(1));
}

#[tokio::test]
async fn a_documents_minute_route_rule_limits_every_client_and_exact_keys_win() {
    let clock = clock();
    let layer = minute_layer(&clock);
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(stats.apply_rules(&minute_rules()), Ok(1));
    assert_eq!(
        stats.route_limits_per(MINUTE).unwrap(),
        [(LOGIN.to_owned(), 5)]
    );
    // Each client: five logins a minute, across seconds.
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(3, 0));
    clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(2, 1));
    assert_eq!(logins(&app, 2, 6).await, ok_then_429(5, 1));
    // Client 7's own minute limit wins over its route's.
    assert_eq!(logins(&app, 7, 9).await, ok_then_429(8, 1));
    // Elsewhere, 100 a second.
    assert_eq!(
        requests(&app, Method::GET, "/", 1, 101).await,
        ok_then_429(100, 1)
    );
    assert_eq!(stats.windows(&key(1, "GET /")).unwrap()[1].limit, 6_000);

    // Changed by a later document: the windows are kept (no burst).
    stats
        .apply_rules(&Rules::new().window_route_limit(MINUTE, LOGIN, 7))
        .unwrap();
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(2, 1));
    // Client 7's own limit was not in that document: it is on its
    // route's 7 now, with 8 passed.
    assert_eq!(logins(&app, 7, 1).await, ok_then_429(0, 1));
    // A document without the route: back to the window's default.
    stats.apply_rules(&Rules::new()).unwrap();
    assert!(stats.route_limits_per(MINUTE).unwrap().is_empty());
    assert_eq!(logins(&app, 1, 3).await, ok_then_429(3, 0));
    assert_eq!(stats.windows(&key(1, LOGIN)).unwrap()[1].limit, 6_000);
}

#[tokio::test]
async fn a_document_without_a_windows_routes_removes_the_builders_route_rules_per_window() {
    let clock = clock();
    let layer = minute_layer(&clock).route_rule_per(LOGIN, MINUTE, 1);
    let stats = layer.handle();
    let app = app(layer);
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(1, 1));
    stats.apply_rules(&Rules::new()).unwrap();
    clock.advance(std::time::Duration::from_secs(1));
    assert_eq!(logins(&app, 1, 2).await, ok_then_429(2, 0));
    assert_eq!(logins(&app, 2, 2).await, ok_then_429(2, 0));
}

#[tokio::test]
async fn an_invalid_windows_route_rule_names_its_rule_and_field_and_changes_nothing() {
    let clock = clock();
    let layer = minute_layer(&clock);
    let stats = layer.handle();
    let app = app(layer);
    stats.apply_rules(&minute_rules()).unwrap();
    logins(&app, 1, 2).await;
    let before = window_state(&stats);

    let long = "r".repeat(tower_sliding_window::key::MAX_KEY_BYTES + 1);
    let seven = std::time::Duration::from_secs(7);
    let cases = [
        (
            minute_rules().window_route_limit(seven, LOGIN, 1),
            r#"windows["7s"]"#.to_owned(),
            "interval",
            "no `limit_per` window of 7000 ms",
        ),
        (
            minute_rules().window_route_limit(std::time::Duration::from_secs(1), LOGIN, 1),
            r#"windows["1s"]"#.to_owned(),
            "interval",
            "no `limit_per` window of 1000 ms",
        ),
        (
            minute_rules().window_route_limit(MINUTE, long.as_str(), 1),
            format!("windows[\"60s\"].routes[\"{}…\"]", "r".repeat(64)),
            "route",
            "route must be at most 256 bytes",
        ),
        (
            minute_rules().window_route_limit(MINUTE, "GET /", MAX_LIMIT + 1),
            r#"windows["60s"].routes["GET /"]"#.to_owned(),
            "limit",
            "limit must be at most",
        ),
        (
            minute_rules().window_route_limit(MINUTE, "GET /", u64::MAX),
            r#"windows["60s"].routes["GET /"]"#.to_owned(),
            "limit",
            "(got 18446744073709551615)",
        ),
    ];
    for (rules, rule, field, says) in cases {
        let err = stats.apply_rules(&rules).unwrap_err();
        assert_eq!(err.kind(), RulesErrorKind::Invalid);
        assert_eq!(err.rule(), Some(rule.as_str()), "{err}");
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(err.reason().contains(says), "{err}");
        assert_eq!(window_state(&stats), before, "{err}");
        assert_eq!(stats.rules_status().version, 1);
    }
    // The largest limit and 0 are rules: 0 refuses every login.
    stats
        .apply_rules(&Rules::new().window_route_limit(MINUTE, LOGIN, MAX_LIMIT))
        .unwrap();
    assert_eq!(
        stats.route_limits_per(MINUTE).unwrap(),
        [(LOGIN.to_owned(), MAX_LIMIT)]
    );
    stats
        .apply_rules(&Rules::new().window_route_limit(MINUTE, LOGIN, 0))
        .unwrap();
    assert_eq!(logins(&app, 3, 2).await, ok_then_429(0, 2));
    assert_eq!(
        requests(&app, Method::GET, "/", 3, 2).await,
        ok_then_429(2, 0)
    );
}

#[test]
fn a_windows_routes_section_is_refused_for_a_layer_whose_keys_have_no_route_part() {
    let stats = SlidingWindowLayer::qps(10)
        .key(PathKey)
        .limit_per(MINUTE, 100)
        .handle();
    let err = stats
        .apply_rules(
            &Rules::new()
                .window_limit(MINUTE, "/a", 1)
                .window_route_limit(MINUTE, LOGIN, 5),
        )
        .unwrap_err();
    assert_eq!(err.rule(), Some(r#"windows["60s"].routes["POST /login"]"#));
    assert_eq!(err.field(), Some("route"));
    assert!(err.reason().contains("no route part"), "{err}");
    assert_eq!(stats.rules_status().version, 0);
    assert_eq!(stats.limits_per("/a")[1], (MINUTE, 100));
}
