//! A live dashboard: a page and its JSON, as an axum [`Router`] to
//! [`nest`](Router::nest) anywhere. Feature `dashboard`.
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use tower_sliding_window::{dashboard, PathKey, SlidingWindowLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limit = SlidingWindowLayer::qps(100).key(PathKey);
//! let stats = limit.handle();
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(limit)
//!     // Outside the limiter: the page keeps working under load.
//!     .nest("/limits", dashboard::router(stats));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await.unwrap();
//! axum::serve(listener, app).await.unwrap();
//! # }
//! ```
//!
//! # Routes
//!
//! Relative to where the router is mounted:
//!
//! - `GET /`: the page. Self-contained: its script, style and charts
//!   (hand-drawn SVG) are in the one response, and the only request it
//!   makes is for `stats` next to it, once a second. It works under any
//!   prefix: under `nest("/limits", ..)` it is at `/limits`.
//! - `GET /stats`: the JSON the page reads (below): every key's snapshot
//!   and history. `GET /stats?history=N` includes the history of the `N`
//!   busiest keys only: the page asks for the 100 busiest, which keeps a
//!   table of thousands of keys cheap to serve.
//! - `POST /limit`: changes a key's limit, only when enabled with
//!   [`Options::allow_limit_changes`] (otherwise the route does not exist).
//!
//! The page shows, per key, passes and blocks per second over the last
//! minute (a chart, for the 100 busiest keys), the current window's passes
//! and blocks per second, the average response time, requests in flight and
//! the limit; the keys with the most traffic in the current window come
//! first, and the overflow
//! entry (keys that found no room, see
//! [`max_keys`](crate::SlidingWindowLayer::max_keys)) is marked.
//!
//! # The JSON
//!
//! The keys are listed as columns: index `i` of every array under `keys`
//! is the `i`-th key, the keys with the most traffic in the current window
//! (passes and blocks) first, keys of equal traffic in the byte order of
//! their labels (the missing key and the overflow entry before the others).
//! Numbers are whole; response times are microseconds, `null` when the
//! window has no completion.
//!
//! ```text
//! {
//!   "now_ms": 1732345678123,        // the layer's clock
//!   "window_ms": 1000,              // every key's window
//!   "limits_editable": false,
//!   "total": {                      // StatsHandle::total
//!     "pass": 103, "block": 3, "success": 99, "exception": 0,
//!     "concurrency": 1, "waiting": 0, "limit": 300,
//!     "avg_rt_us": 840, "min_rt_us": 120
//!   },
//!   "keys": {
//!     "key": ["/search", "/users", null],   // KeyLabel; null for the missing key and the overflow
//!     "missing": null,              // index of the missing key (a None key), or null
//!     "overflow": 2,                // index of the overflow entry, or null
//!     // one column per Snapshot figure, read in the same pass as "total":
//!     "pass": [100, 3, 0], "block": [3, 0, 0], "success": [99, 3, 0],
//!     "exception": [0, 0, 0], "concurrency": [1, 0, 0], "waiting": [0, 0, 0],
//!     "limit": [100, 100, 100], "avg_rt_us": [840, 95, null], "min_rt_us": [120, 80, null],
//!     // StatsHandle::history of the first keys (all of them, or the
//!     // busiest N with ?history=N), one column per figure:
//!     "history": [
//!       { "t": [1732345677000, ...], "pass": [...], "block": [...],
//!         "success": [...], "exception": [...], "rt_us": [812, null, ...] },
//!       ...
//!     ]
//!   }
//! }
//! ```
//!
//! The overflow entry is listed while it is in use or has history; the
//! total counts it only while it is in use, as [`StatsHandle::total`]
//! does. Labels are JSON strings with quotes, backslashes and control
//! characters escaped.
//!
//! # Keys
//!
//! The key type must implement [`KeyLabel`], as every
//! built-in key type does (`()`, `String`, `Option<String>`,
//! `Option<IpAddr>`). Keys are shown as text; the page escapes them.
//!
//! # Changing limits
//!
//! Off by default. [`router_with`] and [`Options::allow_limit_changes`]
//! turn it on, with a check that sees each change request's head and
//! decides: no check, no changes. The page then shows a form; it sends
//! `POST limit` with `{"key": "/search", "limit": 50}` (`"key": null` for
//! the missing key), and the browser's own credentials (cookies, HTTP
//! authentication) go with it. Answers: `204` applied, `403` refused by the
//! check, `400` a body that is not that JSON (unknown fields, a limit that
//! is not a whole number from 0 to 2^64 - 1), `404` a key with no entry
//! now, `413` a body over 4 KiB. The change is
//! [`StatsHandle::set_limit`](crate::StatsHandle::set_limit).
//!
//! ```
//! use tower_sliding_window::dashboard::{self, Options};
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! let stats = SlidingWindowLayer::qps(100).key(PathKey).handle();
//! let admin = dashboard::router_with(
//!     stats,
//!     Options::new().allow_limit_changes(|parts| {
//!         parts.headers.get("x-admin-token").is_some_and(|t| t == "s3cret")
//!     }),
//! );
//! # let _: axum::Router = admin;
//! ```

mod json;
mod limit;
mod stats;

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;

use super::KeyLabel;
use crate::handle::StatsHandle;

/// The page: markup, style and script in one response.
const PAGE: &str = concat!(
    include_str!("page.html"),
    "<style>\n",
    include_str!("page.css"),
    "</style>\n<script>\n",
    include_str!("page.js"),
    "</script>\n</body>\n</html>\n"
);

/// A check on a limit-change request: `true` lets it through.
type Check = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// Settings of [`router_with`].
#[derive(Clone, Default)]
pub struct Options {
    allow: Option<Check>,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("limit_changes", &self.allow.is_some())
            .finish()
    }
}

impl Options {
    /// The defaults: a read-only dashboard.
    pub fn new() -> Self {
        Options::default()
    }

    /// Lets the page change limits, for requests that `check` accepts
    /// (it sees the request's head: method, URI, headers, extensions).
    /// Every other change request is answered `403 Forbidden`.
    pub fn allow_limit_changes(
        mut self,
        check: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.allow = Some(Arc::new(check));
        self
    }
}

/// The read-only dashboard of `handle`'s statistics (see the
/// [module docs](self)).
pub fn router<K>(handle: StatsHandle<K>) -> Router
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    router_with(handle, Options::new())
}

/// The dashboard with `options`, for example with limit changes allowed.
pub fn router_with<K>(handle: StatsHandle<K>, options: Options) -> Router
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let editable = options.allow.is_some();
    let reader = handle.clone();
    let mut router = Router::new().route("/", get(page)).route(
        "/stats",
        get(move |uri: http::Uri| {
            let handle = reader.clone();
            async move {
                let Ok(with_history) = stats::history_param(uri.query()) else {
                    return (
                        http::StatusCode::BAD_REQUEST,
                        [(CONTENT_TYPE, "text/plain"), (CACHE_CONTROL, "no-store")],
                        b"history: a whole number of keys\n".to_vec(),
                    );
                };
                (
                    http::StatusCode::OK,
                    [
                        (CONTENT_TYPE, "application/json"),
                        (CACHE_CONTROL, "no-store"),
                    ],
                    stats::json(&handle, editable, with_history.unwrap_or(usize::MAX)),
                )
            }
        }),
    );
    if let Some(check) = options.allow {
        router = router.route(
            "/limit",
            post(move |request: axum::extract::Request| {
                let handle = handle.clone();
                let check = Arc::clone(&check);
                async move { limit::change(&handle, &*check, request).await }
            }),
        );
    }
    router
}

async fn page() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
}
