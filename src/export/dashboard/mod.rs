//! A live dashboard: a page and its JSON, as an axum [`Router`] to
//! [`nest`](Router::nest) anywhere. Feature `dashboard`.
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use tower_sliding_window::dashboard::{self, Options};
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limit = SlidingWindowLayer::qps(100).key(PathKey);
//! let stats = limit.handle();
//! // One check guards every route of the dashboard.
//! let board = dashboard::router_with(
//!     stats,
//!     Options::new().access(|head| {
//!         head.headers.get("x-ops-token").is_some_and(|t| t == "s3cret")
//!     }),
//! );
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(limit)
//!     // Outside the limiter: the page keeps working under load.
//!     .nest("/limits", board);
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
//!   prefix: under `nest("/limits", ..)` it is at `/limits`. A search in
//!   its address (`/limits?search=/api`) fills its search box.
//! - `GET /stats`: the JSON the page reads (below): the busiest keys
//!   ([`Options::top`], 100 by default) with their history.
//!   `?search=text` lists the busiest of the keys whose label contains
//!   `text` (percent-encoded, ASCII case ignored, at most 256 bytes);
//!   `?history=N` gives only the first `N` listed keys their history.
//! - `POST /limit`: changes a key's limit, only when enabled with
//!   [`Options::allow_limit_changes`] (otherwise the route does not exist).
//!
//! The page shows the busiest keys (how many of how many), per key passes
//! and blocks per second over the last minute (a chart), the current
//! window's passes and blocks per second, the average response time,
//! requests in flight, the limit and the state of the key's circuit
//! breakers; above the table, the totals over every key and, with a
//! Redis store, where admissions are decided now. The overflow entry
//! (keys that found no room, see
//! [`max_keys`](crate::SlidingWindowLayer::max_keys)) is marked. Below the
//! keys, a table "Top blocked clients" names the 20 keys refused most over
//! the last minute with their blocks, whatever the search selects
//! ([`StatsHandle::top_blocked`]: a bounded summary that counts every
//! refusal under the request's own key, so a client that shares the
//! overflow entry is named there too).
//!
//! # Access
//!
//! [`router`] has no access check: the page lists every key, and keys are
//! often client addresses, tokens or paths. Mount it only where operators
//! alone can reach it, or give [`Options::access`] a check: it sees each
//! request's head and runs before every route (the page, `stats`,
//! `limit`), and a request it refuses gets `403 Forbidden` and nothing
//! else. The browser's own credentials (cookies, HTTP authentication) go
//! with the page's requests, so a check on a session cookie or an
//! `authorization` header set by a proxy in front works for the page as
//! for any other client.
//!
//! # Cost
//!
//! Reading every key is the expensive part (a table can hold tens of
//! thousands). It is done at most once per [`Options::refresh`] (1 s by
//! default) whatever the number of readers, on a blocking thread
//! (`tokio::task::spawn_blocking`), not on the runtime's workers that
//! serve requests, and one read at a time: readers that arrive while the
//! keys are read wait for that read. The page's JSON is written in the
//! same task and every reader of it gets the same bytes; each search is
//! written once per read. A reader gets figures at most one period old.
//! And since the figures do not change within a period, `stats` gives at
//! most [`Options::answers_per_refresh`] answers per period (32 by
//! default, all readers together): a request past those waits, on a
//! timer, for the next period's read. Readers polling as fast as they can
//! then take a bounded share of the runtime that serves the application.
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
//!   "now_ms": 1732345678123,        // the layer's clock at the read
//!   "window_ms": 1000,              // every key's window
//!   "limits_editable": false,
//!   "keys_total": 20001,            // every key, and the overflow entry if listed
//!   "matched": 20001,               // of those, the ones the search selects
//!   "top": 100,                     // the most keys listed
//!   "search": null,                 // the search, or null
//!   "store": null,                  // StoreStatus of a Redis store, or null
//!   "total": {                      // StatsHandle::total, over every key
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
//!     // the worst state of the key's breakers: "open", "half_open",
//!     // "closed"; null when the layer has no breakers
//!     "breaker": ["closed", "open", "closed"],
//!     // StatsHandle::history of the listed keys (or of the first N with
//!     // ?history=N), one column per figure:
//!     "history": [
//!       { "t": [1732345677000, ...], "pass": [...], "block": [...],
//!         "success": [...], "exception": [...], "rt_us": [812, null, ...] },
//!       ...
//!     ]
//!   },
//!   // StatsHandle::top_blocked(20): the keys with the most blocks over
//!   // the last minute, most first, as columns; a null key is the missing
//!   // key (a None key). Not cut by the search.
//!   "top_blocked": { "key": ["/search", null], "block": [1830, 12] },
//!   // StatsHandle::rules_status: rules documents applied, and why the
//!   // latest attempt failed (its message), or null
//!   "rules": { "version": 2, "last_error": null }
//! }
//! ```
//!
//! The overflow entry is listed while it is in use or has history; the
//! total counts it only while it is in use, as [`StatsHandle::total`]
//! does. Labels are JSON strings with quotes, backslashes and control
//! characters escaped (`top_blocked`'s too). `store` is the layer's `store::StoreStatus` as its serde
//! form writes it (feature `redis`).
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
//! decides: no check, no changes. It runs after the access check, if any:
//! `allow_limit_changes(|_| true)` lets everyone the access check admits
//! change limits. The page then shows a form; it sends `POST limit` with
//! `{"key": "/search", "limit": 50}` (`"key": null` for the missing key)
//! and `content-type: application/json`, and the browser's own
//! credentials go with it.
//!
//! Because those credentials would go with a request that a page on
//! another site makes too, a change is refused unless it is one that such
//! a page cannot send without the browser asking this server first: its
//! `content-type` is `application/json` (a form or `text/plain` body is
//! `415`), its `Sec-Fetch-Site`, if sent, is `same-origin` or `none`, and
//! its `Origin`, if sent, is the request's own `Host` (scheme's default
//! port assumed when none is written), both `403` otherwise. Clients that
//! send neither header (curl, scripts) pass on the content type alone.
//!
//! Answers: `204` applied, `403` refused by a check or as cross-site,
//! `415` not JSON, `400` a body that is not that JSON object (unknown or
//! repeated fields, a limit that is not a whole number from 0 to
//! 2^64 - 1), `404` a key with no entry now, `413` a body over 4 KiB. The
//! change is [`StatsHandle::set_limit`](crate::StatsHandle::set_limit);
//! the next read of `stats` shows it.
//!
//! ```
//! use tower_sliding_window::dashboard::{self, Options};
//! use tower_sliding_window::{PathKey, SlidingWindowLayer};
//!
//! let stats = SlidingWindowLayer::qps(100).key(PathKey).handle();
//! let admin = dashboard::router_with(
//!     stats,
//!     Options::new()
//!         .access(|head| head.headers.get("x-ops-token").is_some_and(|t| t == "s3cret"))
//!         .allow_limit_changes(|head| {
//!             head.headers.get("x-admin-token").is_some_and(|t| t == "0ther")
//!         }),
//! );
//! # let _: axum::Router = admin;
//! ```

mod limit;
mod stats;

use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::request::Parts;
use http::StatusCode;

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

/// A check on a request's head: `true` lets it through.
type Check = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// Keys listed by default (see [`Options::top`]).
pub const DEFAULT_TOP: usize = 100;

/// How long one read of the keys serves every reader by default (see
/// [`Options::refresh`]): the page's own polling period.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(1);

/// Answers of `stats` per refresh period by default (see
/// [`Options::answers_per_refresh`]).
pub const DEFAULT_ANSWERS_PER_REFRESH: usize = 32;

/// Searches whose JSON is kept per refresh period, at most: a reader
/// typing a new search each time still costs one answer each.
const KEPT_VIEWS: usize = 64;

/// Settings of [`router_with`].
#[derive(Clone)]
pub struct Options {
    access: Option<Check>,
    allow: Option<Check>,
    top: usize,
    refresh: Duration,
    answers: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            access: None,
            allow: None,
            top: DEFAULT_TOP,
            refresh: DEFAULT_REFRESH,
            answers: DEFAULT_ANSWERS_PER_REFRESH,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("access_check", &self.access.is_some())
            .field("limit_changes", &self.allow.is_some())
            .field("top", &self.top)
            .field("refresh", &self.refresh)
            .field("answers_per_refresh", &self.answers)
            .finish()
    }
}

impl Options {
    /// The defaults: a read-only dashboard open to whoever reaches it,
    /// listing the [`DEFAULT_TOP`] busiest keys, read once per
    /// [`DEFAULT_REFRESH`].
    pub fn new() -> Self {
        Options::default()
    }

    /// Guards every route of the dashboard (the page, `stats` and `limit`)
    /// with `check`, which sees each request's head (method, URI, headers,
    /// extensions) before anything else is done: a request it refuses is
    /// answered `403 Forbidden` and reads nothing. The page lists client
    /// keys (addresses, tokens, paths): give a check unless only operators
    /// can reach the router. See the [module docs](self#access).
    ///
    /// ```
    /// use tower_sliding_window::dashboard::{self, Options};
    /// use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};
    ///
    /// let stats = SlidingWindowLayer::qps(100).key(PeerIpKey).handle();
    /// let board = dashboard::router_with(
    ///     stats,
    ///     Options::new().access(|head| {
    ///         head.headers
    ///             .get("cookie")
    ///             .and_then(|c| c.to_str().ok())
    ///             .is_some_and(|c| c.split("; ").any(|c| c == "ops=s3cret"))
    ///     }),
    /// );
    /// # let _: axum::Router = board;
    /// ```
    pub fn access(mut self, check: impl Fn(&Parts) -> bool + Send + Sync + 'static) -> Self {
        self.access = Some(Arc::new(check));
        self
    }

    /// Lets the page change limits, for requests that `check` accepts
    /// (it sees the request's head: method, URI, headers, extensions).
    /// It runs after the [`access`](Self::access) check, on change
    /// requests only: `|_| true` lets everyone the access check admits
    /// change limits. Every other change request is answered
    /// `403 Forbidden`.
    pub fn allow_limit_changes(
        mut self,
        check: impl Fn(&Parts) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.allow = Some(Arc::new(check));
        self
    }

    /// Lists the `n` keys with the most traffic (the busiest of those a
    /// search selects), [`DEFAULT_TOP`] unless set. The total and the key
    /// count still cover every key.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or over 100 000 (the page draws one row per key).
    pub fn top(mut self, n: usize) -> Self {
        assert!(
            (1..=100_000).contains(&n),
            "dashboard Options::top: {n} keys; it must be from 1 to 100000"
        );
        self.top = n;
        self
    }

    /// How long one read of every key serves all readers:
    /// [`DEFAULT_REFRESH`] unless set. The keys are read at most once per
    /// `period` whatever the number of readers, one read at a time, on a
    /// blocking thread (not the runtime's workers that serve requests); a
    /// reader gets figures at most `period` old. `Duration::ZERO` reads
    /// them for every request (still one read at a time).
    ///
    /// # Panics
    ///
    /// If `period` is over one hour.
    pub fn refresh(mut self, period: Duration) -> Self {
        assert!(
            period <= Duration::from_secs(3600),
            "dashboard Options::refresh: {period:?}; it must be at most one hour"
        );
        self.refresh = period;
        self
    }

    /// How many answers `stats` gives per refresh period, all readers
    /// together: [`DEFAULT_ANSWERS_PER_REFRESH`] unless set. The figures
    /// change once per period, so a reader asking again within it would
    /// get the same bytes: past `n` answers, a request waits (a timer, no
    /// work) for the next period's read and gets that. This bounds what
    /// readers polling as fast as they can take from the runtime that
    /// serves the application. Each page polls once a second: `n` is about
    /// the number of pages served at full rate with the default period.
    /// With a zero period every answer is a read of its own and there is
    /// no bound.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn answers_per_refresh(mut self, n: usize) -> Self {
        assert!(
            n > 0,
            "dashboard Options::answers_per_refresh: 0; it must be at least 1"
        );
        self.answers = n;
        self
    }
}

/// The read-only dashboard of `handle`'s statistics, with the default
/// [`Options`]: no access check (see the [module docs](self#access)).
pub fn router<K>(handle: StatsHandle<K>) -> Router
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    router_with(handle, Options::new())
}

/// The dashboard with `options`: an access check, limit changes, how many
/// keys it lists and how often it reads them.
pub fn router_with<K>(handle: StatsHandle<K>, options: Options) -> Router
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    let board = Arc::new(Board {
        handle: handle.clone(),
        editable: options.allow.is_some(),
        top: options.top,
        refresh: options.refresh,
        answers: options.answers,
        table: Arc::new(tokio::sync::Mutex::new(None)),
    });
    let reader = Arc::clone(&board);
    let mut router = Router::new().route("/", get(page)).route(
        "/stats",
        get(move |uri: http::Uri| {
            let board = Arc::clone(&reader);
            async move { board.stats(uri.query()).await }
        }),
    );
    if let Some(check) = options.allow {
        let board = Arc::clone(&board);
        router = router.route(
            "/limit",
            post(move |request: Request| {
                let board = Arc::clone(&board);
                let check = Arc::clone(&check);
                async move {
                    let answer = limit::change(&board.handle, &*check, request).await;
                    if answer.status().is_success() {
                        // The next read shows the new limit.
                        *board.table.lock().await = None;
                    }
                    answer
                }
            }),
        );
    }
    if let Some(access) = options.access {
        router = router.route_layer(middleware::from_fn(move |request: Request, next: Next| {
            let access = Arc::clone(&access);
            async move {
                let (parts, body) = request.into_parts();
                if !access(&parts) {
                    return (
                        StatusCode::FORBIDDEN,
                        [(CONTENT_TYPE, "text/plain"), (CACHE_CONTROL, "no-store")],
                        "dashboard access refused\n",
                    )
                        .into_response();
                }
                next.run(Request::from_parts(parts, body)).await
            }
        }));
    }
    router
}

/// What the routes share: the handle and the last read of its keys.
struct Board<K> {
    handle: StatsHandle<K>,
    editable: bool,
    top: usize,
    refresh: Duration,
    /// Answers per read (see [`Options::answers_per_refresh`]).
    answers: usize,
    /// The last read of the keys and when it was made. An async lock: the
    /// reader that finds it stale reads the keys again while holding it,
    /// so there is one read at a time and the readers that arrive
    /// meanwhile wait for that read instead of making their own.
    table: Arc<tokio::sync::Mutex<Option<Read>>>,
}

/// One read of the keys, and the answers cut from it so far. Cloned out
/// of the lock for each reader (a few `Arc`s).
#[derive(Clone)]
struct Read {
    at: Instant,
    table: Arc<stats::Table>,
    /// The JSON of each view asked for since the read (the page's own view
    /// first): every reader of a view gets the same bytes. At most
    /// [`KEPT_VIEWS`] views.
    kept: Arc<Mutex<Vec<(stats::View, Bytes)>>>,
    /// Answers given from this read. Only a count that readers take
    /// numbers from (`fetch_add`): Relaxed, nothing else is published
    /// through it.
    served: Arc<AtomicUsize>,
}

impl<K> Board<K>
where
    K: KeyLabel + Clone + Eq + Hash + Send + Sync + 'static,
{
    /// `GET stats`: the JSON of the view `query` asks for, from a read of
    /// the keys at most `refresh` old.
    async fn stats(self: Arc<Self>, query: Option<&str>) -> Response {
        let view = match stats::view(query) {
            Ok(view) => view,
            Err(message) => return plain(StatusCode::BAD_REQUEST, format!("{message}\n")),
        };
        let read = loop {
            let read = match self.fresh_table().await {
                Ok(read) => read,
                Err(message) => return plain(StatusCode::INTERNAL_SERVER_ERROR, message),
            };
            if self.refresh.is_zero() || read.served.fetch_add(1, Ordering::Relaxed) < self.answers
            {
                break read;
            }
            // This read's answers are spent: the next read, once due.
            tokio::time::sleep_until(read.at + self.refresh).await;
        };
        let Read { table, kept, .. } = read;
        let known = lock(&kept)
            .iter()
            .find(|(v, _)| *v == view)
            .map(|(_, bytes)| bytes.clone());
        let bytes = match known {
            Some(bytes) => bytes,
            None => {
                // A search reads every label: off the workers too.
                let (editable, top) = (self.editable, self.top);
                let cut = view.clone();
                let written = tokio::task::spawn_blocking(move || {
                    stats::json(&table, editable, top, &cut).map(Bytes::from)
                })
                .await;
                let Ok(Ok(bytes)) = written else {
                    return plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the dashboard could not write its JSON\n".to_owned(),
                    );
                };
                let mut kept = lock(&kept);
                if kept.len() < KEPT_VIEWS && !kept.iter().any(|(v, _)| *v == view) {
                    kept.push((view, bytes.clone()));
                }
                bytes
            }
        };
        (
            StatusCode::OK,
            [
                (CONTENT_TYPE, "application/json"),
                (CACHE_CONTROL, "no-store"),
            ],
            bytes,
        )
            .into_response()
    }

    /// The current read of the keys, made now (on a blocking thread, with
    /// the page's default view written in the same task) if the last one
    /// is older than `refresh`.
    async fn fresh_table(self: &Arc<Self>) -> Result<Read, String> {
        let mut slot = Arc::clone(&self.table).lock_owned().await;
        if let Some(read) = slot.as_ref() {
            if read.at.elapsed() < self.refresh {
                return Ok(read.clone());
            }
        }
        let board = Arc::clone(self);
        // The lock goes with the read: a reader that stops waiting (its
        // client went away) does not let a second read start beside this
        // one, which finishes and is kept for the next readers.
        let built = tokio::task::spawn_blocking(move || {
            let table = stats::build(&board.handle);
            let page = stats::json(&table, board.editable, board.top, &stats::View::default())
                .map_err(|_| "the dashboard could not write its JSON\n".to_owned())?;
            let read = Read {
                at: Instant::now(),
                table: Arc::new(table),
                kept: Arc::new(Mutex::new(vec![(
                    stats::View::default(),
                    Bytes::from(page),
                )])),
                served: Arc::new(AtomicUsize::new(0)),
            };
            *slot = Some(read.clone());
            Ok(read)
        })
        .await;
        match built {
            Ok(read) => read,
            Err(_) => Err("the dashboard could not read the keys\n".to_owned()),
        }
    }
}

/// The kept answers, even if a thread panicked holding them (they are
/// whole answers either way).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn plain(status: StatusCode, message: String) -> Response {
    (
        status,
        [(CONTENT_TYPE, "text/plain"), (CACHE_CONTROL, "no-store")],
        message,
    )
        .into_response()
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
