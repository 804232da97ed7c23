//! The dashboard router: the JSON against the handle, ordering and the
//! overflow mark, mounting under a prefix, a self-contained page, and
//! hostile requests to the limit-change endpoint.

#![cfg(feature = "dashboard")]

#[cfg(feature = "redis")]
use crate::redis_server;
use crate::support;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, StatusCode};
use serde_json::Value;
use support::{clock, req, req_with, send};
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::dashboard::{self, Options};
use tower_sliding_window::{HeaderKey, PathKey, SlidingWindowLayer, StatsHandle};

fn app(limit: u64, max_keys: usize) -> (Router, StatsHandle<String>) {
    let layer = SlidingWindowLayer::qps(limit)
        .key(PathKey)
        .max_keys(max_keys)
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    (app, stats)
}

async fn json(app: &Router, uri: &str) -> Value {
    let answer = send(app, req(uri)).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.header("content-type"), "application/json");
    serde_json::from_str(&answer.body).expect("valid JSON")
}

/// The figures of a snapshot, as `keys` has a column for each.
const FIGURES: [&str; 9] = [
    "pass",
    "block",
    "success",
    "exception",
    "concurrency",
    "waiting",
    "limit",
    "avg_rt_us",
    "min_rt_us",
];

/// The `keys` columns of a `/stats` answer as one object per key, in
/// order: `key`, `kind` ("key", "missing" or "overflow"), `traffic` (pass
/// and block), `snapshot` (every figure) and `history` (`null` past the
/// keys that carry one). Checks the layout on the way: every column as long
/// as `key`, at most one missing and one overflow entry, each with a `null`
/// key, and no more histories than keys.
fn listed(s: &Value) -> Vec<Value> {
    let keys = &s["keys"];
    let labels = keys["key"].as_array().expect("a key column");
    let n = labels.len();
    let index = |name: &str| match &keys[name] {
        Value::Null => None,
        i => Some(i.as_u64().expect("an index") as usize),
    };
    let (missing, overflow) = (index("missing"), index("overflow"));
    assert!(missing.is_none() || missing != overflow, "{keys}");
    let histories = keys["history"].as_array().expect("a history column");
    assert!(
        histories.len() <= n,
        "{} histories, {n} keys",
        histories.len()
    );
    for figure in FIGURES.iter().chain(&["breaker"]) {
        let column = keys[figure].as_array().expect(figure);
        assert_eq!(column.len(), n, "the {figure} column");
    }
    (0..n)
        .map(|i| {
            let kind = if Some(i) == overflow {
                "overflow"
            } else if Some(i) == missing {
                "missing"
            } else {
                "key"
            };
            if kind != "key" {
                assert!(labels[i].is_null(), "the {kind} entry has no key");
            } else {
                assert!(labels[i].is_string(), "key {i}: {}", labels[i]);
            }
            let snapshot: serde_json::Map<String, Value> = FIGURES
                .iter()
                .map(|&figure| (figure.to_owned(), keys[figure][i].clone()))
                .collect();
            let traffic = snapshot["pass"].as_u64().unwrap() + snapshot["block"].as_u64().unwrap();
            serde_json::json!({
                "key": labels[i],
                "kind": kind,
                "traffic": traffic,
                "snapshot": snapshot,
                "breaker": keys["breaker"][i],
                "history": histories.get(i).cloned().unwrap_or(Value::Null),
            })
        })
        .collect()
}

#[tokio::test]
async fn stats_match_the_handle_most_traffic_first() {
    let (app, stats) = app(3, 2);
    for (path, n) in [("/a", 1), ("/b", 5), ("/c", 2)] {
        for _ in 0..n {
            send(&app, req(path)).await;
        }
    }
    let board = Router::new().nest("/limits", dashboard::router(stats.clone()));
    let s = json(&board, "/limits/stats").await;
    let keys = listed(&s);
    // Two keys of their own, then /c found no room: the overflow entry.
    assert_eq!(keys.len(), stats.keys().len() + 1);
    let traffic: Vec<u64> = keys
        .iter()
        .map(|k| k["traffic"].as_u64().unwrap())
        .collect();
    assert!(traffic.windows(2).all(|w| w[0] >= w[1]), "{traffic:?}");
    for k in &keys {
        match k["kind"].as_str().unwrap() {
            "key" => {
                let key = k["key"].as_str().unwrap();
                let snap = stats.snapshot(key).unwrap();
                assert_eq!(k["snapshot"]["pass"], snap.pass);
                assert_eq!(k["snapshot"]["block"], snap.block);
                assert_eq!(k["snapshot"]["limit"], snap.limit);
                assert_eq!(k["traffic"], snap.pass + snap.block);
            }
            "overflow" => {
                assert!(k["key"].is_null());
                let overflow = stats.overflow();
                assert_eq!(k["snapshot"]["pass"], overflow.pass);
                assert_eq!(k["snapshot"]["block"], overflow.block);
            }
            other => panic!("unexpected kind {other}"),
        }
    }
    assert_eq!(keys[0]["key"], "/b", "the busiest key first");
    // The total, read in the same pass as the rows, is the handle's.
    assert_eq!(s["total"], serde_json::to_value(stats.total()).unwrap());
    assert_eq!(s["limits_editable"], false);
}

#[tokio::test]
async fn history_is_the_handles() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(2).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    for second in 0..3u64 {
        for _ in 0..=second {
            send(&app, req("/x")).await;
        }
        clock.advance(std::time::Duration::from_secs(1));
    }
    let board = dashboard::router(stats.clone());
    let s = json(&board, "/stats").await;
    let history = &listed(&s)[0]["history"];
    let want = stats.history("/x");
    assert_eq!(want.len(), 3);
    for (i, node) in want.iter().enumerate() {
        assert_eq!(history["t"][i], node.timestamp_ms);
        assert_eq!(history["pass"][i], node.pass);
        assert_eq!(history["block"][i], node.block);
    }
}

#[tokio::test]
async fn history_can_be_limited_to_the_busiest_keys() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    for (path, n) in [("/a", 3), ("/b", 2), ("/c", 1)] {
        for _ in 0..n {
            send(&app, req(path)).await;
        }
    }
    clock.advance(std::time::Duration::from_millis(500));
    let board = dashboard::router(stats.clone());
    let s = json(&board, "/stats?history=2").await;
    let keys = listed(&s);
    assert_eq!(keys.len(), 3);
    let with: Vec<bool> = keys.iter().map(|k| !k["history"].is_null()).collect();
    assert_eq!(with, [true, true, false], "the two busiest carry history");
    let all = json(&board, "/stats?history=10").await;
    assert!(listed(&all).iter().all(|k| k["history"].is_object()));
    for bad in ["-1", "x", "1.5", "99999999999999999999999"] {
        let answer = send(&board, req(&format!("/stats?history={bad}"))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "history={bad}");
    }
}

#[tokio::test]
async fn option_keys_are_marked_missing() {
    let layer = SlidingWindowLayer::qps(5)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    send(&app, req("/")).await;
    send(&app, req_with("/", "x-tenant", "<script>")).await;
    let s = json(&dashboard::router(stats), "/stats").await;
    let keys = listed(&s);
    let kinds: Vec<(&str, &Value)> = keys
        .iter()
        .map(|k| (k["kind"].as_str().unwrap(), &k["key"]))
        .collect();
    assert!(kinds.contains(&("missing", &Value::Null)), "{kinds:?}");
    assert!(
        kinds.contains(&("key", &Value::from("<script>"))),
        "{kinds:?}"
    );
}

#[tokio::test]
async fn the_page_is_self_contained_under_any_prefix() {
    let (_, stats) = app(5, 10);
    let board = Router::new().nest("/ops/limits", dashboard::router(stats));
    let page = send(&board, req("/ops/limits")).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.header("content-type").starts_with("text/html"));
    // No request leaves the service: no absolute URL, no external script,
    // style or image; the script fetches `stats` relative to the page.
    for outside in ["http://", "https://", "src=", "href=", "@import", "url("] {
        assert!(
            !page.body.contains(outside),
            "the page contains {outside:?}"
        );
    }
    assert!(page.body.contains("base + \"stats"));
    assert_eq!(
        send(&board, req("/ops/limits/stats")).await.status,
        StatusCode::OK
    );
}

fn post(uri: &str, token: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut request = Request::post(uri).header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("x-admin-token", token);
    }
    request.body(body.into()).unwrap()
}

fn editable(stats: StatsHandle<String>) -> Router {
    dashboard::router_with(
        stats,
        Options::new().allow_limit_changes(|parts| {
            parts
                .headers
                .get("x-admin-token")
                .is_some_and(|t| t == "s3cret")
        }),
    )
}

#[tokio::test]
async fn limit_changes_are_off_by_default() {
    let (app, stats) = app(5, 10);
    send(&app, req("/a")).await;
    let board = dashboard::router(stats.clone());
    let answer = send(
        &board,
        post("/limit", Some("s3cret"), r#"{"key":"/a","limit":1}"#),
    )
    .await;
    assert!(answer.status.is_client_error(), "{answer:?}");
    assert_eq!(stats.snapshot("/a").unwrap().limit, 5);
}

#[tokio::test]
async fn limit_changes_need_the_check_and_valid_input() {
    let (app, stats) = app(5, 10);
    send(&app, req("/a")).await;
    let board = editable(stats.clone());
    let s = json(&board, "/stats").await;
    assert_eq!(s["limits_editable"], true);

    let cases: Vec<(Option<&str>, Body, StatusCode)> = vec![
        // Missing and wrong credentials.
        (
            None,
            r#"{"key":"/a","limit":1}"#.into(),
            StatusCode::FORBIDDEN,
        ),
        (
            Some("guess"),
            r#"{"key":"/a","limit":1}"#.into(),
            StatusCode::FORBIDDEN,
        ),
        // Not JSON, wrong shapes, invalid bytes.
        (Some("s3cret"), "limit=1".into(), StatusCode::BAD_REQUEST),
        (Some("s3cret"), "".into(), StatusCode::BAD_REQUEST),
        (
            Some("s3cret"),
            vec![0xff, 0xfe, b'{'].into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a"}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":1,"x":2}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"["/a",1]"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        // Bad numbers.
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":-1}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":1.5}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":"7"}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":1e30}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("s3cret"),
            r#"{"key":"/a","limit":18446744073709551616}"#.into(),
            StatusCode::BAD_REQUEST,
        ),
        // A key with no entry.
        (
            Some("s3cret"),
            r#"{"key":"/nobody","limit":1}"#.into(),
            StatusCode::NOT_FOUND,
        ),
        (
            Some("s3cret"),
            r#"{"key":null,"limit":1}"#.into(),
            StatusCode::NOT_FOUND,
        ),
        // A huge body.
        (
            Some("s3cret"),
            format!(r#"{{"key":"{}","limit":1}}"#, "a".repeat(1 << 20)).into(),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (i, (token, body, want)) in cases.into_iter().enumerate() {
        let answer = send(&board, post("/limit", token, body)).await;
        assert_eq!(answer.status, want, "case {i}, {token:?}: {}", answer.body);
        assert_eq!(stats.snapshot("/a").unwrap().limit, 5, "nothing changed");
    }

    let answer = send(
        &board,
        post("/limit", Some("s3cret"), r#"{"key":"/a","limit":1}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT, "{}", answer.body);
    assert_eq!(stats.snapshot("/a").unwrap().limit, 1);
    let u64_max = format!(r#"{{"key":"/a","limit":{}}}"#, u64::MAX);
    let answer = send(&board, post("/limit", Some("s3cret"), u64_max)).await;
    assert_eq!(answer.status, StatusCode::NO_CONTENT);
    assert_eq!(stats.snapshot("/a").unwrap().limit, u64::MAX);
}

#[tokio::test]
async fn the_check_runs_before_the_body_is_read() {
    let (app, stats) = app(5, 10);
    send(&app, req("/a")).await;
    let board = editable(stats);
    // A body that never ends: refused at once by the check.
    let endless = Body::new(futures_stream());
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        send(&board, post("/limit", None, endless)),
    )
    .await
    .expect("answered without reading the body");
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
}

/// A body stream that never yields.
fn futures_stream() -> impl futures_core_like::Stream {
    futures_core_like::Pending
}

mod futures_core_like {
    //! The smallest never-ending body stream, without a stream crate.
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub trait Stream:
        http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible> + Send + 'static
    {
    }
    impl<T> Stream for T where
        T: http_body::Body<Data = bytes::Bytes, Error = std::convert::Infallible> + Send + 'static
    {
    }

    pub struct Pending;

    impl http_body::Body for Pending {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }
}

#[tokio::test]
async fn the_total_leaves_out_an_idle_overflow_entry_listed_for_its_history() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .max_keys(1)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    send(&app, req("/own")).await;
    // No room left: `/other` goes to the overflow entry.
    send(&app, req("/other")).await;
    // Two seconds on, the second window is empty everywhere, but the
    // overflow entry's last minute still has a finished second to show.
    clock.advance(std::time::Duration::from_secs(2));
    let board = dashboard::router(stats.clone());
    let s = json(&board, "/stats").await;
    let keys = listed(&s);
    let kinds: Vec<&str> = keys.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"overflow"), "{kinds:?}");
    let total = stats.total();
    assert_eq!(s["total"], serde_json::to_value(total).unwrap());
    // Only `/own`'s limit: the idle overflow entry adds none.
    assert_eq!(total.limit, 5);
}

/// Labels that JSON has to escape, or that order only by their later bytes.
const AWKWARD: [&str; 12] = [
    "",
    "\u{0}",
    "a",
    "a\u{0}",
    "ab",
    "quote \" and backslash \\",
    "controls \u{1}\u{8}\u{9}\u{a}\u{c}\u{d}\u{1b}\u{1f} and DEL \u{7f}",
    "é 😀 \u{2028}\u{2029} </script>",
    "/a/long/common/prefix/of/many/bytes/x",
    "/a/long/common/prefix/of/many/bytes/y",
    "/a/long/common/prefix/of/many/bytes",
    "/a/long/common/prefix/of/many/bytes/x/",
];

/// A layer keyed by the `x-k` header's index into [`AWKWARD`].
fn awkward_app() -> (Router, StatsHandle<String>) {
    let layer = SlidingWindowLayer::qps(5)
        .key(|parts: &http::request::Parts| {
            let i: usize = parts.headers["x-k"].to_str().unwrap().parse().unwrap();
            AWKWARD[i].to_owned()
        })
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    (app, stats)
}

#[tokio::test]
async fn awkward_labels_read_back_as_they_are_in_label_order() {
    let (app, stats) = awkward_app();
    // Equal traffic everywhere: the order is the labels' byte order.
    for i in 0..AWKWARD.len() {
        send(&app, req_with("/", "x-k", &i.to_string())).await;
    }
    let s = json(&dashboard::router(stats.clone()), "/stats").await;
    let keys = listed(&s);
    let labels: Vec<&str> = keys.iter().map(|k| k["key"].as_str().unwrap()).collect();
    let mut want = AWKWARD.to_vec();
    want.sort_unstable();
    assert_eq!(labels, want);
    for k in &keys {
        let snap = stats.snapshot(k["key"].as_str().unwrap()).unwrap();
        assert_eq!(k["snapshot"]["pass"], snap.pass);
    }
}

#[tokio::test]
async fn header_keys_with_invalid_bytes_are_listed() {
    let layer = SlidingWindowLayer::qps(5)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let request = Request::get("/")
        .header(
            "x-tenant",
            http::HeaderValue::from_bytes(b"t\xff\xfe\"\\").unwrap(),
        )
        .body(Body::empty())
        .unwrap();
    send(&app, request).await;
    let s = json(&dashboard::router(stats.clone()), "/stats").await;
    let keys = listed(&s);
    assert_eq!(keys.len(), 1);
    let held = stats.keys().pop().flatten().expect("a key for the header");
    assert_eq!(keys[0]["key"].as_str(), Some(held.as_str()));
    assert_eq!(keys[0]["kind"], "key");
}

#[tokio::test]
async fn no_keys_is_empty_columns() {
    let (_, stats) = app(5, 10);
    let s = json(&dashboard::router(stats.clone()), "/stats").await;
    assert!(listed(&s).is_empty());
    assert!(s["keys"]["missing"].is_null());
    assert!(s["keys"]["overflow"].is_null());
    assert_eq!(s["keys"]["history"], serde_json::json!([]));
    assert_eq!(s["total"], serde_json::to_value(stats.total()).unwrap());
    assert_eq!(s["total"]["pass"], 0);
}

#[tokio::test]
async fn the_overflow_and_missing_entries_are_marked_by_index() {
    let layer = SlidingWindowLayer::qps(5)
        .key(HeaderKey::new(HeaderName::from_static("x-tenant")))
        .max_keys(2)
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    // The missing key, then one tenant, then tenants that find no room.
    send(&app, req("/")).await;
    for tenant in ["a", "b", "b", "c", "c", "c"] {
        send(&app, req_with("/", "x-tenant", tenant)).await;
    }
    let s = json(&dashboard::router(stats.clone()), "/stats?history=1").await;
    let keys = listed(&s);
    let kinds: Vec<&str> = keys.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    // The overflow entry holds b's and c's five requests: the busiest.
    assert_eq!(kinds, ["overflow", "missing", "key"], "{s}");
    assert_eq!(keys[0]["traffic"], 5);
    assert_eq!(keys[0]["snapshot"]["pass"], stats.overflow().pass);
    assert!(keys[0]["history"].is_object());
    assert!(keys[1]["history"].is_null());
}

#[tokio::test]
async fn idle_keys_read_as_the_handle_reads_them() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(5).key(PathKey).clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    for path in ["/idle", "/idle", "/busy"] {
        send(&app, req(path)).await;
    }
    // A window and a half on, only /busy has traffic again.
    clock.advance(std::time::Duration::from_millis(1500));
    send(&app, req("/busy")).await;
    let board = dashboard::router(stats.clone());
    let s = json(&board, "/stats").await;
    let keys = listed(&s);
    assert_eq!(keys.len(), 2);
    for k in &keys {
        let key = k["key"].as_str().unwrap();
        let snap = serde_json::to_value(stats.snapshot(key).unwrap()).unwrap();
        assert_eq!(k["snapshot"], snap, "{key}");
    }
    assert_eq!(keys[0]["key"], "/busy");
    assert_eq!(keys[0]["snapshot"]["pass"], 1);
    assert_eq!(keys[1]["snapshot"]["pass"], 0, "/idle's window is empty");
    assert_eq!(s["total"], serde_json::to_value(stats.total()).unwrap());
}

/// `POST /limit` with the admin token, a valid body and `headers` on top.
fn hostile_post(uri: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut request = Request::post(uri)
        .header("host", "limits.internal:8080")
        .header("x-admin-token", "s3cret");
    let mut typed = false;
    for (name, value) in headers {
        typed |= name.eq_ignore_ascii_case("content-type");
        request = request.header(*name, *value);
    }
    if !typed {
        request = request.header("content-type", "application/json");
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

#[tokio::test]
async fn cross_site_limit_changes_are_refused() {
    let (app, stats) = app(5, 10);
    send(&app, req("/a")).await;
    send(&app, req("/b")).await;
    let board = editable(stats.clone());
    let body = r#"{"key":"/a","limit":1}"#;
    // What a page on another site can send without a preflight, all at
    // once and each alone: every one is refused.
    type Headers = Vec<(&'static str, &'static str)>;
    let cases: Vec<(Headers, &str, StatusCode)> = vec![
        (
            vec![
                ("content-type", "text/plain"),
                ("origin", "http://evil.example"),
                ("sec-fetch-site", "cross-site"),
            ],
            body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            vec![("content-type", "text/plain")],
            body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            vec![("content-type", "text/plain;charset=UTF-8")],
            body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            vec![("content-type", "application/x-www-form-urlencoded")],
            body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            vec![("content-type", "multipart/form-data; boundary=x")],
            body,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            vec![("origin", "http://evil.example")],
            body,
            StatusCode::FORBIDDEN,
        ),
        // The same host name on another port, a look-alike, and `null`
        // (a sandboxed frame or a redirect).
        (
            vec![("origin", "http://limits.internal:9090")],
            body,
            StatusCode::FORBIDDEN,
        ),
        (
            vec![("origin", "http://limits.internal:8080.evil.example")],
            body,
            StatusCode::FORBIDDEN,
        ),
        (vec![("origin", "null")], body, StatusCode::FORBIDDEN),
        (
            vec![("sec-fetch-site", "cross-site")],
            body,
            StatusCode::FORBIDDEN,
        ),
        (
            vec![("sec-fetch-site", "same-site")],
            body,
            StatusCode::FORBIDDEN,
        ),
        // A field given twice: which one wins must not be a guess.
        (
            vec![],
            r#"{"key":"/b","key":"/a","limit":1}"#,
            StatusCode::BAD_REQUEST,
        ),
        (
            vec![],
            r#"{"key":"/a","limit":9,"limit":1}"#,
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (i, (headers, body, want)) in cases.into_iter().enumerate() {
        let answer = send(&board, hostile_post("/limit", &headers, body)).await;
        assert_eq!(answer.status, want, "case {i} {headers:?}: {}", answer.body);
        assert_eq!(
            stats.snapshot("/a").unwrap().limit,
            5,
            "case {i} changed /a"
        );
        assert_eq!(
            stats.snapshot("/b").unwrap().limit,
            5,
            "case {i} changed /b"
        );
    }

    // What the page itself sends from its own origin is applied.
    for headers in [
        vec![
            ("origin", "http://limits.internal:8080"),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
        ],
        vec![("content-type", "application/json; charset=utf-8")],
        vec![("sec-fetch-site", "none")],
    ] {
        let answer = send(&board, hostile_post("/limit", &headers, body)).await;
        assert_eq!(
            answer.status,
            StatusCode::NO_CONTENT,
            "{headers:?}: {}",
            answer.body
        );
        assert_eq!(stats.snapshot("/a").unwrap().limit, 1);
        stats.set_limit("/a", 5);
    }
}

/// The dashboard of `stats` behind an access check on an `ops=1` cookie,
/// with limit changes for everyone it admits.
fn guarded(stats: StatsHandle<String>) -> Router {
    let options = Options::new()
        .access(|head| {
            head.headers
                .get_all("cookie")
                .iter()
                .filter_map(|c| c.to_str().ok())
                .any(|c| c.split("; ").any(|c| c == "ops=1"))
        })
        .allow_limit_changes(|_| true);
    Router::new().nest("/limits", dashboard::router_with(stats, options))
}

#[tokio::test]
async fn an_access_check_guards_every_route() {
    let (app, stats) = app(5, 10);
    send(&app, req("/10.1.2.3")).await;
    let board = guarded(stats.clone());
    let routes = |cookie: Option<&str>| {
        let change = r#"{"key":"/10.1.2.3","limit":1}"#;
        [
            ("GET", "/limits", ""),
            ("GET", "/limits/stats", ""),
            ("GET", "/limits/stats?history=1&search=10.1", ""),
            ("POST", "/limits/limit", change),
        ]
        .map(|(method, uri, body)| {
            let mut request = Request::builder()
                .method(method)
                .uri(uri)
                .header("content-type", "application/json");
            if let Some(cookie) = cookie {
                request = request.header("cookie", cookie);
            }
            (uri, request.body(Body::from(body)).unwrap())
        })
    };
    for cookie in [None, Some("ops=0"), Some("xops=1; ops=2")] {
        for (uri, request) in routes(cookie) {
            let answer = send(&board, request).await;
            assert_eq!(
                answer.status,
                StatusCode::FORBIDDEN,
                "{uri} with {cookie:?}"
            );
            assert!(!answer.body.contains("10.1.2.3"), "{uri}: {}", answer.body);
        }
        assert_eq!(stats.snapshot("/10.1.2.3").unwrap().limit, 5);
    }
    let wants = [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::NO_CONTENT,
    ];
    for ((uri, request), want) in routes(Some("theme=dark; ops=1")).into_iter().zip(wants) {
        let answer = send(&board, request).await;
        assert_eq!(answer.status, want, "{uri}: {}", answer.body);
    }
    assert_eq!(stats.snapshot("/10.1.2.3").unwrap().limit, 1);
    // The change's own check still applies after the access check.
    let read_only = dashboard::router_with(
        stats.clone(),
        Options::new()
            .access(|_| true)
            .allow_limit_changes(|_| false),
    );
    let answer = send(
        &read_only,
        post("/limit", None, r#"{"key":"/10.1.2.3","limit":3}"#),
    )
    .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert_eq!(stats.snapshot("/10.1.2.3").unwrap().limit, 1);
}

#[tokio::test]
async fn the_busiest_keys_are_listed_and_a_search_finds_the_others() {
    let (app, stats) = app(1000, 1000);
    for i in 0..5 {
        for _ in 0..3 {
            send(&app, req(&format!("/hot/{i}"))).await;
        }
    }
    for i in 0..250 {
        send(&app, req(&format!("/K/{i:03}"))).await;
    }
    let board = dashboard::router(stats.clone());
    let s = json(&board, "/stats").await;
    let keys = listed(&s);
    assert_eq!(keys.len(), 100, "the default top 100 of 255 keys");
    assert_eq!(
        (s["keys_total"].as_u64(), s["matched"].as_u64()),
        (Some(255), Some(255))
    );
    assert_eq!(s["top"], 100);
    assert_eq!(s["search"], Value::Null);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(k["traffic"], if i < 5 { 3 } else { 1 }, "{k}");
        // The page's default: a history for every listed key, no others.
        assert!(k["history"].is_object(), "{k}");
    }
    // The total still covers every key.
    assert_eq!(s["total"]["pass"], 5 * 3 + 250);

    // A search, ASCII case ignored, percent-encoded in the query.
    let found = json(&board, "/stats?search=%2Fk%2F24").await;
    let labels: Vec<String> = listed(&found)
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (240..250).map(|i| format!("/K/{i}")).collect();
    assert_eq!(labels, want);
    assert_eq!(found["matched"], 10);
    let anywhere = json(&board, "/stats?search=24").await;
    assert_eq!(
        anywhere["matched"], 13,
        "/K/024, /K/124, /K/224, /K/240..249"
    );
    assert_eq!(found["search"], "/k/24");
    let hot = json(&board, "/stats?search=hot/&history=2").await;
    let hot = listed(&hot);
    assert_eq!(hot.len(), 5);
    assert_eq!(hot.iter().filter(|k| k["history"].is_object()).count(), 2);
    let none = json(&board, "/stats?search=%3Cscript%3E").await;
    assert_eq!(
        (listed(&none).len(), none["matched"].as_u64()),
        (0, Some(0))
    );
    for bad in ["%zz", "%FF", "%", &"a".repeat(257)] {
        let answer = send(&board, req(&format!("/stats?search={bad}"))).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "search={bad}");
    }

    let three = dashboard::router_with(stats, Options::new().top(3));
    let s = json(&three, "/stats").await;
    assert_eq!(listed(&s).len(), 3);
    assert_eq!(s["top"], 3);
}

#[test]
fn options_out_of_range_are_refused_naming_the_setting() {
    for run in [
        (|| drop(Options::new().top(0))) as fn(),
        || drop(Options::new().top(100_001)),
        || drop(Options::new().refresh(std::time::Duration::from_secs(3601))),
        || drop(Options::new().answers_per_refresh(0)),
    ] {
        let message = std::panic::catch_unwind(run).expect_err("refused");
        let text = match message.downcast_ref::<&str>() {
            Some(text) => text.to_string(),
            None => message
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default(),
        };
        assert!(text.starts_with("dashboard Options::"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_within_a_refresh_period_share_one_read() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    send(&app, req("/a")).await;
    let board = dashboard::router_with(
        stats.clone(),
        Options::new().refresh(std::time::Duration::from_secs(3600)),
    );
    let first = send(&board, req("/stats")).await.body;
    // New traffic at a later time: within the period, every reader gets
    // the one read already made, byte for byte.
    clock.advance(std::time::Duration::from_millis(300));
    send(&app, req("/b")).await;
    let readers: Vec<_> = (0..8)
        .map(|_| {
            let board = board.clone();
            tokio::spawn(async move { send(&board, req("/stats")).await.body })
        })
        .collect();
    for reader in readers {
        assert_eq!(reader.await.unwrap(), first);
    }
    assert!(!first.contains("\"/b\""));
    // With no period, each request reads the keys again.
    let live = dashboard::router_with(stats, Options::new().refresh(std::time::Duration::ZERO));
    let s = json(&live, "/stats").await;
    assert_eq!(s["now_ms"], support::START_MS + 300);
    assert_eq!(listed(&s).len(), 2);
}

/// A key whose label notes the thread that asked for it.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Spied(String);

static LABELLED_ON: std::sync::Mutex<Vec<std::thread::ThreadId>> =
    std::sync::Mutex::new(Vec::new());

impl tower_sliding_window::export::KeyLabel for Spied {
    fn label(&self) -> Option<std::borrow::Cow<'_, str>> {
        LABELLED_ON
            .lock()
            .unwrap()
            .push(std::thread::current().id());
        Some(std::borrow::Cow::Borrowed(&self.0))
    }
}

// One worker thread, the test's own: a read of the keys made there would
// hold up every request the runtime serves.
#[tokio::test(flavor = "current_thread")]
async fn the_keys_are_read_off_the_runtime_worker() {
    let layer = SlidingWindowLayer::qps(100)
        .key(|head: &http::request::Parts| Spied(head.uri.path().to_owned()))
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    for i in 0..50 {
        send(&app, req(&format!("/{i}"))).await;
    }
    let board = dashboard::router(stats);
    let s = json(&board, "/stats?search=4").await;
    assert_eq!(listed(&s).len(), 14, "/4, /14, /24, /34 and /40../49");
    let worker = std::thread::current().id();
    let seen = LABELLED_ON.lock().unwrap().clone();
    assert!(seen.len() >= 50, "every key labelled: {}", seen.len());
    assert!(
        seen.iter().all(|&thread| thread != worker),
        "a label was read on the runtime's worker"
    );
}

#[tokio::test]
async fn rows_show_the_breaker_state_and_the_store_status() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone())
        .breaker(Breaker::error_count(1).min_requests(1));
    let stats = layer.handle();
    let service = Router::new()
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "no") }),
        )
        .route("/fine", get(|| async { "ok" }))
        .layer(layer);
    send(&service, req("/fine")).await;
    for _ in 0..3 {
        send(&service, req("/fail")).await;
    }
    let open = stats.breakers("/fail");
    assert!(
        open.iter().any(|s| s.name() == "open"),
        "the breaker opened: {open:?}"
    );
    let live = Options::new().refresh(std::time::Duration::ZERO);
    let s = json(&dashboard::router_with(stats.clone(), live), "/stats").await;
    let breaker = |key: &str| {
        listed(&s)
            .into_iter()
            .find(|k| k["key"] == key)
            .unwrap_or_else(|| panic!("{key} listed"))["breaker"]
            .clone()
    };
    assert_eq!(breaker("/fail"), "open");
    assert_eq!(breaker("/fine"), "closed");
    // No store: no store status.
    assert_eq!(s["store"], Value::Null);
    // A layer without breakers has no state to show.
    let (plain, plain_stats) = app(5, 10);
    send(&plain, req("/x")).await;
    let s = json(&dashboard::router(plain_stats), "/stats").await;
    assert_eq!(listed(&s)[0]["breaker"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_past_the_period_budget_wait_for_the_next_read() {
    let clock = clock();
    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock.clone());
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    send(&app, req("/a")).await;
    // Long enough that three answers fit in it on a loaded machine.
    let period = std::time::Duration::from_millis(1_000);
    let board =
        dashboard::router_with(stats, Options::new().refresh(period).answers_per_refresh(3));
    let start = tokio::time::Instant::now();
    let first = json(&board, "/stats").await;
    // A search is an answer like any other.
    for uri in ["/stats?search=a", "/stats"] {
        assert_eq!(json(&board, uri).await["now_ms"], first["now_ms"]);
    }
    assert!(start.elapsed() < period, "three answers within the period");
    clock.advance(std::time::Duration::from_millis(100));
    // The fourth waits for the next read, and gets it.
    let fourth = json(&board, "/stats").await;
    assert!(start.elapsed() >= period, "{:?}", start.elapsed());
    assert_eq!(fourth["now_ms"], support::START_MS + 100);
}

/// With a Redis store, the JSON carries its status: remote while Redis
/// answers, fallback once it is gone.
#[cfg(feature = "redis")]
#[ignore = "needs redis-server"]
#[tokio::test]
async fn the_store_status_is_the_stores() {
    use tower_sliding_window::store::{RedisStore, StoreFailure};
    let mut server = redis_server::RedisServer::start();
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .timeout(std::time::Duration::from_millis(200));
    let layer = SlidingWindowLayer::qps(5)
        .key(PathKey)
        .store(store)
        .on_store_error(StoreFailure::Allow);
    let stats = layer.handle();
    let service = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    send(&service, req("/a")).await;
    let board = dashboard::router_with(
        stats.clone(),
        Options::new().refresh(std::time::Duration::ZERO),
    );
    let s = json(&board, "/stats").await;
    let want = serde_json::to_value(stats.store_status().expect("a store")).unwrap();
    assert_eq!(s["store"], want);
    assert_eq!(s["store"]["mode"], "Remote");
    assert!(
        s["store"]["round_trips"].as_u64() >= Some(1),
        "{}",
        s["store"]
    );

    server.kill();
    send(&service, req("/a")).await;
    let s = json(&board, "/stats").await;
    assert_eq!(s["store"]["mode"], "Fallback", "{}", s["store"]);
    assert!(s["store"]["failures"].as_u64() >= Some(1), "{}", s["store"]);
}

/// Hostile header values as keys, refused: markup, quotes and
/// backslashes, bytes that are not UTF-8, a value far past the key bound,
/// and no header at all. `top_blocked` in the JSON lists them as the
/// handle does, most blocks first, each label as the key is held (escaped
/// bytes, the long key's bounded digest form), the missing key as `null`;
/// at most 20 keys, whatever the search.
#[tokio::test]
async fn top_blocked_lists_hostile_keys_as_the_handle_does() {
    let layer = SlidingWindowLayer::qps(1)
        .key(HeaderKey::new(HeaderName::from_static("x-client")))
        .clock(clock());
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let long = "L".repeat(20_000);
    let hostile: Vec<Option<&[u8]>> = vec![
        Some(b"<img src=x onerror=\"document.title='pwned'\">"),
        Some(b"q\"uo\\te</script>"),
        Some(b"t\xff\xfe\"\\"),
        Some(long.as_bytes()),
        None,
    ];
    // Value `i` is sent `i + 3` times: `i + 2` blocks.
    for (i, value) in hostile.iter().enumerate() {
        for _ in 0..i + 3 {
            let mut request = Request::get("/");
            if let Some(value) = value {
                request = request.header("x-client", http::HeaderValue::from_bytes(value).unwrap());
            }
            send(&app, request.body(Body::empty()).unwrap()).await;
        }
    }
    // Twenty-five more keys, one block each.
    for i in 0..25 {
        for _ in 0..2 {
            send(&app, req_with("/", "x-client", &format!("light-{i}"))).await;
        }
    }
    let board = dashboard::router(stats.clone());
    for query in ["/stats", "/stats?search=nothing-matches"] {
        let s = json(&board, query).await;
        let top = &s["top_blocked"];
        let keys = top["key"].as_array().expect("a key column");
        let blocks = top["block"].as_array().expect("a block column");
        assert_eq!((keys.len(), blocks.len()), (20, 20), "{top}");
        let want = stats.top_blocked(20);
        // The five hostile keys first (6 to 2 blocks), then light ones.
        for (i, (key, count)) in want.iter().take(5).enumerate() {
            assert_eq!(blocks[i], *count, "{top}");
            assert_eq!(keys[i].as_str(), key.as_deref(), "{top}");
            assert_eq!(*count, 6 - i as u64, "{want:?}");
        }
        assert_eq!(keys[0], Value::Null, "the missing key blocked most");
        let labels: Vec<&str> = keys[1..5].iter().map(|k| k.as_str().unwrap()).collect();
        assert!(labels[0].len() <= tower_sliding_window::key::MAX_DIGEST_KEY_BYTES);
        assert!(
            labels[0].starts_with("LLLL") && labels[0].contains("…#"),
            "{}",
            labels[0]
        );
        assert_eq!(labels[1], "\u{7f}t\\xff\\xfe\"\\\\");
        assert_eq!(labels[2], "q\"uo\\te</script>");
        assert_eq!(labels[3], "<img src=x onerror=\"document.title='pwned'\">");
        assert!(blocks[5..].iter().all(|b| *b == 1), "{top}");
    }
}

#[tokio::test]
async fn stats_show_the_system_rule_only_for_a_layer_with_one() {
    use tower_sliding_window::system::SystemRule;

    let layer = SlidingWindowLayer::qps(100)
        .key(PathKey)
        .clock(clock())
        .system(SystemRule::bbr().max_qps(1).cpu_source(|| 0.5));
    let stats = layer.handle();
    let app = Router::new()
        .route("/{*path}", get(|| async { "ok" }))
        .layer(layer);
    assert_eq!(send(&app, req("/a")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, req("/a")).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let s = json(&dashboard::router(stats), "/stats").await;
    let system = &s["system"];
    assert_eq!(system["cpu"], 0.5);
    assert_eq!(system["cpu_threshold"], 0.8);
    assert_eq!(system["bbr_active"], false);
    assert_eq!(system["in_flight"], 0);
    assert_eq!(system["refusals"]["qps"], 1);
    assert_eq!(system["refusals"]["bbr"], 0);
    let (_, plain) = app_plain();
    let s = json(&dashboard::router(plain), "/stats").await;
    assert!(s.get("system").is_none(), "{s}");
}

fn app_plain() -> (Router, StatsHandle<String>) {
    app(10, 16)
}
