//! Benches of the HTTP layer: one request through an axum `Router`, called
//! in process as a tower `Service` on a current-thread Tokio runtime (no
//! sockets, no HTTP parsing), with and without each layer.
//!
//! Every contender serves the same app (`/` and `/items/{id}`, one handler
//! answering `"ok"`) and is sent `GET /items/7` carrying the header
//! `x-api-key: client-42`; the two huge-header contenders send a 64 KiB
//! `x-api-key` value instead. Each request is built, sent with
//! `ready().call()`, and its body read to the end, as a server would. The
//! router is prepared with `with_state(())`, as `axum::serve` prepares it for
//! each connection. Only the layer differs (and the request: the 64 KiB
//! header of the huge-header contenders, the peer's address of the
//! peer-address ones):
//!
//! | id                       | layer                                                    |
//! |--------------------------|----------------------------------------------------------|
//! | `bare_router`            | none                                                     |
//! | `noop_layer`             | a `Router::layer` whose service only forwards            |
//! | `ours_global`            | `SlidingWindowLayer::qps(u64::MAX / 4)`, the global key (default body: the inner service's) |
//! | `ours_global_breaker`    | `ours_global`'s layer with one `Breaker::error_ratio(0.5)` (closed throughout) |
//! | `ours_global_limit_per`  | `ours_global`'s layer with `.limit_per(60 s, u64::MAX / 4)`: a second window per key |
//! | `ours_global_system`     | `ours_global`'s layer with `.system(SystemRule::bbr())` (one request in flight, so the check never reads the CPU) |
//! | `ours_global_track_body` | the same with `.track_body()` (`ResponseBody`, boxed again by axum) |
//! | `ours_matched_path`      | the same with the matched route as the key (`"GET /items/{id}"`) |
//! | `ours_header`            | the same keyed by `HeaderKey::new(x-api-key)`            |
//! | `tower_governor`         | `GovernorLayer`, global key, one cell per ns, burst `u32::MAX` |
//! | `tower_governor_header`  | the same keyed by the `x-api-key` value as a `String`    |
//! | `noop_layer_peer_ip`     | `noop_layer`; the request carries the peer's address     |
//! | `ours_peer_ip`           | `ours_global`'s layer keyed by `PeerIpKey`; the same request |
//! | `tower_governor_peer_ip` | `tower_governor` keyed by its `PeerIpKeyExtractor`; the same request |
//! | `ours_compact_header`    | `ours_header`'s key, `.compact()`, see below              |
//! | `ours_compact_peer_ip`   | `ours_peer_ip`'s key, `.compact()`, see below; the peer request |
//! | `ours_compact_header_cached_clock` | `ours_compact_header`'s layer on a `CachedClock` (its own) |
//! | `ours_compact_peer_ip_cached_clock` | `ours_compact_peer_ip`'s layer on a `CachedClock` (its own); the peer request |
//! | `bare_router_huge_header`| none; the request's `x-api-key` is 64 KiB                |
//! | `ours_header_huge_header`| `ours_header`'s layer; the request's `x-api-key` is 64 KiB |
//!
//! A compact key counts at most 65 535 passes per window, and one thread
//! sends a key more than that per second, so the compact contenders use a
//! window of 10 ms in 10 buckets of 1 ms with a limit of 65 535 (6.5 million
//! per second): the same work per request as the default window, with a
//! bucket rotation every millisecond (once per a few hundred requests in
//! `layer`, once a round, every 32 to 45 of the contender's requests, in
//! `layer_paired`) instead of every 100 ms.
//!
//! The peer-address contenders' requests carry axum's
//! `ConnectInfo<SocketAddr>` extension, as `axum::serve` with
//! `into_make_service_with_connect_info` sets it; inserting it costs an
//! allocation, so their cost is taken beyond `noop_layer_peer_ip`, which is
//! sent the same request.
//!
//! The huge header value is built from its bytes on every request
//! (`HeaderValue::from_bytes`: checked and copied), as a server builds it
//! when it parses the request, so both huge-header contenders pay for
//! receiving it and only ours pays for keying by it (a key longer than
//! `MAX_KEY_BYTES` is replaced by a digest of all its bytes).
//!
//! No contender ever rejects: each is checked when it is built.
//!
//! - `sequential`: the criterion group `layer`, one contender after another.
//! - `paired`: the criterion group `layer_paired`, which runs all contenders
//!   in short interleaved rounds and prints the per-round cost beyond the
//!   no-op layer.
//! - `threads`: the criterion group `layer_threads`, the per-client
//!   contenders (peer address and header) on two threads at once sharing
//!   one layer, in interleaved rounds: many clients spread over both
//!   threads, and one client on both.

mod common;
mod governor_setup;
pub(crate) mod paired;
pub(crate) mod sequential;
pub(crate) mod threads;

use common::NoopLayer;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderName, HeaderValue, Request, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::BodyExt;
use tokio::runtime::Runtime;
use tower::ServiceExt;
use tower_governor::key_extractor::{GlobalKeyExtractor, PeerIpKeyExtractor};
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::clock::CachedClock;
use tower_sliding_window::system::SystemRule;
use tower_sliding_window::{HeaderKey, KeyExtractor, PeerIpKey, SlidingWindowLayer};

/// Our limit: far above anything one thread can send in a window.
const NEVER_REJECT: u64 = u64::MAX / 4;

/// The request every contender is sent.
const PATH: &str = "/items/7";

/// The header the header-keyed contenders key by.
const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Its value on every request but the huge-header ones.
pub(crate) const CLIENT: &str = "client-42";

/// The peer of the peer-address contenders' requests.
pub(crate) const PEER: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)), 40_000);

/// Length of the huge header value, in bytes.
const HUGE_HEADER_BYTES: usize = 64 * 1024;

/// Requests each contender must answer with 200 when it is built.
const CHECK_REQUESTS: usize = 1_000;

/// One way of serving the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    Bare,
    Noop,
    OursGlobal,
    OursGlobalBreaker,
    OursGlobalLimitPer,
    OursGlobalSystem,
    OursGlobalTrackBody,
    OursMatchedPath,
    OursHeader,
    TowerGovernor,
    TowerGovernorHeader,
    BareHugeHeader,
    OursHeaderHugeHeader,
    NoopPeerIp,
    OursPeerIp,
    TowerGovernorPeerIp,
    OursCompactHeader,
    OursCompactPeerIp,
    OursCompactHeaderCachedClock,
    OursCompactPeerIpCachedClock,
}

impl Contender {
    /// Every contender, in the order of the reports. The no-op layer must
    /// stay in the list: the paired figures are taken against it.
    pub(crate) const ALL: [Contender; 20] = [
        Contender::Bare,
        Contender::Noop,
        Contender::OursGlobal,
        Contender::OursGlobalBreaker,
        Contender::OursGlobalLimitPer,
        Contender::OursGlobalSystem,
        Contender::OursGlobalTrackBody,
        Contender::OursMatchedPath,
        Contender::OursHeader,
        Contender::TowerGovernor,
        Contender::TowerGovernorHeader,
        Contender::BareHugeHeader,
        Contender::OursHeaderHugeHeader,
        Contender::NoopPeerIp,
        Contender::OursPeerIp,
        Contender::TowerGovernorPeerIp,
        Contender::OursCompactHeader,
        Contender::OursCompactPeerIp,
        Contender::OursCompactHeaderCachedClock,
        Contender::OursCompactPeerIpCachedClock,
    ];

    /// The benchmark id within a group.
    pub(crate) fn id(self) -> &'static str {
        match self {
            Contender::Bare => "bare_router",
            Contender::Noop => "noop_layer",
            Contender::OursGlobal => "ours_global",
            Contender::OursGlobalBreaker => "ours_global_breaker",
            Contender::OursGlobalLimitPer => "ours_global_limit_per",
            Contender::OursGlobalSystem => "ours_global_system",
            Contender::OursGlobalTrackBody => "ours_global_track_body",
            Contender::OursMatchedPath => "ours_matched_path",
            Contender::OursHeader => "ours_header",
            Contender::TowerGovernor => "tower_governor",
            Contender::TowerGovernorHeader => "tower_governor_header",
            Contender::BareHugeHeader => "bare_router_huge_header",
            Contender::OursHeaderHugeHeader => "ours_header_huge_header",
            Contender::NoopPeerIp => "noop_layer_peer_ip",
            Contender::OursPeerIp => "ours_peer_ip",
            Contender::TowerGovernorPeerIp => "tower_governor_peer_ip",
            Contender::OursCompactHeader => "ours_compact_header",
            Contender::OursCompactPeerIp => "ours_compact_peer_ip",
            Contender::OursCompactHeaderCachedClock => "ours_compact_header_cached_clock",
            Contender::OursCompactPeerIpCachedClock => "ours_compact_peer_ip_cached_clock",
        }
    }

    /// Whether this contender's requests carry the peer's address.
    pub(crate) fn peer_ip(self) -> bool {
        matches!(
            self,
            Contender::NoopPeerIp
                | Contender::OursPeerIp
                | Contender::TowerGovernorPeerIp
                | Contender::OursCompactPeerIp
                | Contender::OursCompactPeerIpCachedClock
        )
    }

    /// The no-op contender this one's cost is taken beyond: the one sent
    /// the same request.
    pub(crate) fn baseline(self) -> Contender {
        if self.peer_ip() {
            Contender::NoopPeerIp
        } else {
            Contender::Noop
        }
    }

    /// Whether this contender is sent the 64 KiB header value.
    pub(crate) fn huge_header(self) -> bool {
        matches!(
            self,
            Contender::BareHugeHeader | Contender::OursHeaderHugeHeader
        )
    }

    /// The request this contender is sent, built anew for each request.
    #[inline]
    pub(crate) fn request(self) -> Request<Body> {
        self.request_as(CLIENT, PEER)
    }

    /// [`request`](Self::request) from the client `client` (the
    /// `x-api-key` value, unless this contender sends the huge one) at
    /// `peer` (where this contender's requests carry the peer's address).
    #[inline]
    pub(crate) fn request_as(self, client: &'static str, peer: SocketAddr) -> Request<Body> {
        let value = if self.huge_header() {
            HeaderValue::from_bytes(huge_header_value()).expect("a valid header value")
        } else {
            HeaderValue::from_static(client)
        };
        let mut request = Request::get(PATH)
            .header(API_KEY, value)
            .body(Body::empty())
            .expect("a valid request");
        if self.peer_ip() {
            request.extensions_mut().insert(ConnectInfo(peer));
            // Without axum's extension support, `PeerIpKey` reads a plain
            // `SocketAddr`.
            #[cfg(not(feature = "axum"))]
            request.extensions_mut().insert(peer);
        }
        request
    }

    /// The app with this contender's layer, checked to answer 200 with the
    /// handler's body.
    pub(crate) fn app(self, runtime: &Runtime) -> Router {
        let app = base();
        let app = match self {
            Contender::Bare | Contender::BareHugeHeader => app,
            Contender::Noop | Contender::NoopPeerIp => app.layer(NoopLayer),
            Contender::OursGlobal => app.layer(SlidingWindowLayer::qps(NEVER_REJECT)),
            // The handler always succeeds, so the breaker stays closed: what
            // a healthy route pays for being protected.
            Contender::OursGlobalBreaker => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).breaker(Breaker::error_ratio(0.5)))
            }
            // Two windows: every pass is charged to the minute's window too.
            Contender::OursGlobalLimitPer => app.layer(
                SlidingWindowLayer::qps(NEVER_REJECT)
                    .limit_per(Duration::from_secs(60), NEVER_REJECT),
            ),
            // One request at a time: the check's fast path (in flight at
            // most one, so neither the CPU nor the estimate is read) and
            // the layer-wide node every request records into.
            Contender::OursGlobalSystem => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).system(SystemRule::bbr()))
            }
            // The body wrapped in `ResponseBody` (completion at its end), which
            // axum then boxes.
            Contender::OursGlobalTrackBody => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).track_body())
            }
            Contender::OursMatchedPath => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).key(matched_path_key()))
            }
            Contender::OursHeader | Contender::OursHeaderHugeHeader => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).key(HeaderKey::new(API_KEY)))
            }
            Contender::OursPeerIp => {
                app.layer(SlidingWindowLayer::qps(NEVER_REJECT).key(PeerIpKey))
            }
            Contender::TowerGovernor => {
                app.layer(governor_setup::never_rejecting(GlobalKeyExtractor))
            }
            Contender::TowerGovernorPeerIp => {
                app.layer(governor_setup::never_rejecting(PeerIpKeyExtractor))
            }
            Contender::OursCompactHeader => {
                app.layer(compact_never_rejecting(HeaderKey::new(API_KEY)))
            }
            Contender::OursCompactPeerIp => app.layer(compact_never_rejecting(PeerIpKey)),
            // Each with an upkeep thread of its own, stopped when the app
            // is dropped at the end of the group.
            Contender::OursCompactHeaderCachedClock => app
                .layer(compact_never_rejecting(HeaderKey::new(API_KEY)).clock(CachedClock::new())),
            Contender::OursCompactPeerIpCachedClock => {
                app.layer(compact_never_rejecting(PeerIpKey).clock(CachedClock::new()))
            }
            Contender::TowerGovernorHeader => app.layer(governor_setup::never_rejecting(
                governor_setup::HeaderString(API_KEY),
            )),
        };
        // What `axum::serve` does once per connection. Without it, a router
        // called as a service turns each handler into a route on every
        // request, calling every `Layer::layer` and boxing the result again
        // per request: a cost no served app pays.
        let mut app = app.with_state(());
        runtime.block_on(check(self, &mut app));
        app
    }
}

/// The app every contender wraps.
fn base() -> Router {
    Router::new()
        .route("/", get(handler))
        .route("/items/{id}", get(handler))
}

async fn handler() -> &'static str {
    "ok"
}

/// A compact layer keyed by `key` that one thread cannot make refuse: a
/// limit of 65 535 (the most a compact key counts) per 10 ms window.
fn compact_never_rejecting<X: KeyExtractor>(key: X) -> SlidingWindowLayer<X> {
    SlidingWindowLayer::qps(65_535)
        .window(Duration::from_millis(10), 10)
        .key(key)
        .compact()
}

/// The matched route plus the method, as `MatchedPathKey` builds it.
#[cfg(feature = "axum")]
fn matched_path_key() -> impl KeyExtractor<Key = String> {
    tower_sliding_window::MatchedPathKey
}

/// Without the `axum` feature: a closure building the same key from axum's
/// `MatchedPath` extension, so the contender exists in every build.
#[cfg(not(feature = "axum"))]
fn matched_path_key() -> impl KeyExtractor<Key = String> {
    |parts: &axum::http::request::Parts| {
        let Some(path) = parts.extensions.get::<axum::extract::MatchedPath>() else {
            return String::from("<unmatched>");
        };
        let (method, path) = (parts.method.as_str(), path.as_str());
        let mut key = String::with_capacity(method.len() + 1 + path.len());
        key.push_str(method);
        key.push(' ');
        key.push_str(path);
        key
    }
}

/// The huge header value: `client-42` padded with `x` to
/// [`HUGE_HEADER_BYTES`].
fn huge_header_value() -> &'static [u8] {
    static VALUE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    VALUE.get_or_init(|| {
        let mut value = CLIENT.as_bytes().to_vec();
        value.resize(HUGE_HEADER_BYTES, b'x');
        value
    })
}

/// Sends `contender`'s request through `app` and reads the response body
/// to the end; returns the status.
#[inline]
pub(crate) async fn serve_one(contender: Contender, app: &mut Router) -> StatusCode {
    common::serve(app, contender.request()).await
}

/// Panics unless `app` answers every one of [`CHECK_REQUESTS`] requests with
/// 200 and the handler's body.
async fn check(contender: Contender, app: &mut Router) {
    for n in 0..CHECK_REQUESTS {
        let response = ServiceExt::<Request<Body>>::oneshot(app.clone(), contender.request())
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the handler's body cannot fail")
            .to_bytes();
        assert!(
            status == StatusCode::OK && body == "ok",
            "{}: request {n} answered {status} {body:?}; no contender may reject",
            contender.id()
        );
    }
    assert_eq!(serve_one(contender, app).await, StatusCode::OK);
}

/// The runtime every layer bench runs on: one thread, the caller's.
pub(crate) fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime")
}
