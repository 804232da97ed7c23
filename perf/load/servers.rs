//! The contenders: one axum app, wrapped in each rate limiter in turn, served
//! on a loopback port from a runtime of its own.
//!
//! Every contender serves the same two routes (`/` and `/items/{id}`) with the
//! same handler, so the only difference between two servers is the layer
//! under test. Each measurement gets a fresh server, so no limiter carries
//! state from one run into the next.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use tower::buffer::BufferLayer;
use tower::limit::RateLimitLayer;
use tower::load_shed::LoadShedLayer;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_governor::GovernorLayer;
use tower_sliding_window::clock::{Clock, ManualClock, SystemClock};

use crate::ours::{self, OurStats};

/// A limit high enough that no contender ever rejects in `bench`.
pub const NEVER_REJECT: u64 = 1_000_000_000;

/// How many requests `tower::buffer::Buffer` may hold in front of
/// `RateLimit`; past that `LoadShed` answers 429. See
/// [`Contender::TowerRateLimit`].
pub const TOWER_BUFFER: usize = 16;

/// One way of serving the app.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contender {
    /// No layer at all: the baseline every ratio is taken against.
    Bare,
    /// A layer that only forwards: what any tower layer costs at the least.
    Noop,
    /// `SlidingWindowLayer::qps(limit)`: one global key.
    OursGlobal,
    /// `SlidingWindowLayer::qps(limit).key(MatchedPathKey)`: a key
    /// per route.
    OursPath,
    /// `SlidingWindowLayer::qps(limit).strict()`: one global key, the limit
    /// held in every interval of 1 s, not only in bucket-aligned windows.
    OursStrict,
    /// `SlidingWindowLayer::qps(limit).throttle(max_wait)`: one global key,
    /// passes paced `1 s / limit` apart, a request waiting up to `max_wait`
    /// for its turn.
    OursThrottle,
    /// tower_governor as it is usually configured for "`limit` per second":
    /// one cell every `1 s / limit`, burst `limit`, one global key.
    GovernorUsual,
    /// tower_governor with one cell every `1 s / limit` and burst 1.
    GovernorBurst1,
    /// `tower::limit::RateLimitLayer::new(limit, 1 s)` made to work under
    /// axum: `HandleErrorLayer` (errors to responses) + `LoadShedLayer` (to
    /// answer instead of waiting) + `BufferLayer` (`RateLimit` is not
    /// `Clone`) in front of it.
    TowerRateLimit,
}

impl Contender {
    /// A short name for tables, charts and file names.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Bare => "bare axum",
            Contender::Noop => "no-op layer",
            Contender::OursGlobal => "sliding window (global)",
            Contender::OursPath => "sliding window (matched path)",
            Contender::OursStrict => "sliding window, strict",
            Contender::OursThrottle => "sliding window, throttle",
            Contender::GovernorUsual => "tower_governor (burst = limit)",
            Contender::GovernorBurst1 => "tower_governor (burst 1)",
            Contender::TowerRateLimit => "tower RateLimit + Buffer + LoadShed",
        }
    }

    /// A file-name friendly identifier.
    pub fn slug(self) -> &'static str {
        match self {
            Contender::Bare => "bare",
            Contender::Noop => "noop",
            Contender::OursGlobal => "ours-global",
            Contender::OursPath => "ours-path",
            Contender::OursStrict => "ours-strict",
            Contender::OursThrottle => "ours-throttle",
            Contender::GovernorUsual => "governor-usual",
            Contender::GovernorBurst1 => "governor-burst1",
            Contender::TowerRateLimit => "tower-ratelimit",
        }
    }
}

/// How a contender is set up for one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Passes per second (per 1 s window for our layer).
    pub limit: u64,
    /// Record the admission time of every request that reaches the handler.
    pub record: bool,
    /// Drive our layer from this clock instead of the system clock.
    pub manual_clock: Option<ManualClock>,
    /// The longest wait for a turn, for [`Contender::OursThrottle`].
    pub max_wait: Duration,
}

/// One admitted request, as seen around the limiter.
///
/// `before_ms` and `before_us` are read before the request enters the
/// limiter, `pass_us` when the limiter hands the request on (in the `call`
/// of a service just inside it, in the same synchronous step as its
/// decision, or at the end of its wait for one that paces), `after_ms` in
/// the handler, all from the same [`SystemClock`] our layer reads; the
/// limiter decided somewhere in `[before_ms, after_ms]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    /// Milliseconds before the limiter saw the request.
    pub before_ms: u64,
    /// Microseconds before the limiter saw the request.
    pub before_us: u64,
    /// Microseconds when the limiter let the request through (the exact
    /// pass timestamp: the sliding window and the wait are taken from it).
    pub pass_us: u64,
    /// Milliseconds when the handler ran.
    pub after_ms: u64,
}

impl Admit {
    /// How long the request spent between the reading before the limiter
    /// and its pass, microseconds: the wait a pacing limiter added, plus
    /// the few microseconds any limiter takes to decide.
    pub fn wait_us(&self) -> u64 {
        self.pass_us.saturating_sub(self.before_us)
    }
}

/// One 429, as seen around the limiter: it decided somewhere in
/// `[before_ms, after_ms]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Milliseconds before the limiter saw the request.
    pub before_ms: u64,
    /// Microseconds before the limiter saw the request.
    pub before_us: u64,
    /// Milliseconds when the 429 came back out of the limiter.
    pub after_ms: u64,
}

/// The handler-level admission recorder, with the 429s seen around it.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every admission, in the order the handler saw them.
    admits: Mutex<Vec<Admit>>,
    /// Every 429 answered by the limiter.
    blocks: Mutex<Vec<Block>>,
}

impl Recorder {
    /// Notes one admission, with the stamps the request carries.
    fn record(&self, before: Option<Stamp>, pass: Option<PassStamp>) {
        let clock = SystemClock::new();
        let after_ms = clock.now_millis();
        let after_us = clock.now_micros();
        let pass_us = pass.map_or(after_us, |p| p.0);
        let admit = Admit {
            before_ms: before.map_or(after_ms, |s| s.ms),
            before_us: before.map_or(pass_us, |s| s.us),
            pass_us,
            after_ms,
        };
        // A poisoned lock only means a handler panicked mid-push; the data
        // pushed so far is still sound.
        self.admits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(admit);
    }

    /// Notes one 429 answered between `before` and now.
    fn block(&self, before: Stamp) {
        let after_ms = SystemClock::new().now_millis();
        self.blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Block {
                before_ms: before.ms,
                before_us: before.us,
                after_ms,
            });
    }

    /// Takes every admission recorded so far.
    pub fn take(&self) -> Vec<Admit> {
        std::mem::take(&mut *self.admits.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes every 429 recorded so far.
    pub fn take_blocks(&self) -> Vec<Block> {
        std::mem::take(&mut *self.blocks.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The time a request reached the outermost layer, as a request extension.
#[derive(Debug, Clone, Copy)]
struct Stamp {
    /// Milliseconds.
    ms: u64,
    /// Microseconds.
    us: u64,
}

/// The time the limiter handed a request on, as a request extension.
#[derive(Debug, Clone, Copy)]
struct PassStamp(u64);

/// The layer just inside the limiter of a recording server: stamps each
/// request with the time it is handed on, in `call`, with no await between
/// the limiter's decision and the reading.
#[derive(Debug, Clone, Copy)]
struct PassStampLayer;

impl<S> Layer<S> for PassStampLayer {
    type Service = PassStamped<S>;

    fn layer(&self, inner: S) -> PassStamped<S> {
        PassStamped { inner }
    }
}

/// The service of [`PassStampLayer`].
#[derive(Debug, Clone)]
struct PassStamped<S> {
    /// The wrapped service.
    inner: S,
}

impl<S, B> Service<http::Request<B>> for PassStamped<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let us = SystemClock::new().now_micros();
        request.extensions_mut().insert(PassStamp(us));
        self.inner.call(request)
    }
}

/// State shared by the handlers.
#[derive(Debug, Clone, Default)]
struct AppState {
    /// Present when admissions are recorded.
    recorder: Option<Arc<Recorder>>,
}

/// The one handler: records the admission when asked to and answers "ok".
async fn handler(State(state): State<AppState>, request: Request) -> &'static str {
    if let Some(recorder) = &state.recorder {
        let extensions = request.extensions();
        recorder.record(
            extensions.get::<Stamp>().copied(),
            extensions.get::<PassStamp>().copied(),
        );
    }
    "ok"
}

/// Outermost middleware of a recording server: stamps each request with the
/// time before any limiter sees it, and notes every 429 that comes back.
async fn observe(
    State(recorder): State<Arc<Recorder>>,
    mut request: Request,
    next: Next,
) -> Response {
    let clock = SystemClock::new();
    let stamp = Stamp {
        ms: clock.now_millis(),
        us: clock.now_micros(),
    };
    request.extensions_mut().insert(stamp);
    let response = next.run(request).await;
    if response.status() == StatusCode::TOO_MANY_REQUESTS {
        recorder.block(stamp);
    }
    response
}

/// The app every contender wraps: `/` and `/items/{id}`.
fn base(recorder: Option<Arc<Recorder>>) -> Router {
    Router::new()
        .route("/", get(handler))
        .route("/items/{id}", get(handler))
        .with_state(AppState { recorder })
}

/// The app with no limiter and no recorder, for callers that add their own
/// layer (the soak, the short checks).
pub fn base_router() -> Router {
    base(None)
}

/// Everything a started contender hands back.
#[derive(Debug)]
pub struct Built {
    /// The app, ready to serve.
    pub router: Router,
    /// The admissions, when `Settings::record` was set.
    pub recorder: Option<Arc<Recorder>>,
    /// Our layer's statistics, for our contenders.
    pub stats: Option<OurStats>,
}

/// Builds `contender` as configured by `settings`.
///
/// Must run inside a Tokio runtime: `BufferLayer` spawns its worker when it
/// wraps the route.
pub fn build(contender: Contender, settings: &Settings) -> Result<Built, String> {
    let recorder = settings.record.then(|| Arc::new(Recorder::default()));
    let app = base(recorder.clone());
    // Innermost around the routes, so the limiter added below wraps it.
    let app = if recorder.is_some() {
        app.layer(PassStampLayer)
    } else {
        app
    };
    let limit = settings.limit;
    let mut stats = None;
    let app = match contender {
        Contender::Bare => app,
        Contender::Noop => app.layer(NoopLayer),
        Contender::OursGlobal => {
            let (app, handle) = ours::global(app, limit, settings.manual_clock.clone());
            stats = Some(handle);
            app
        }
        Contender::OursPath => {
            let (app, handle) = ours::matched_path(app, limit, settings.manual_clock.clone());
            stats = Some(handle);
            app
        }
        Contender::OursStrict => {
            let (app, handle) = ours::strict(app, limit, settings.manual_clock.clone());
            stats = Some(handle);
            app
        }
        Contender::OursThrottle => {
            let (app, handle) = ours::throttle(app, limit, settings.max_wait);
            stats = Some(handle);
            app
        }
        Contender::GovernorUsual => app.layer(governor(limit, limit)?),
        Contender::GovernorBurst1 => app.layer(governor(limit, 1)?),
        Contender::TowerRateLimit => app.layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(tower_error_to_response))
                .layer(LoadShedLayer::new())
                .layer(BufferLayer::new(TOWER_BUFFER))
                .layer(RateLimitLayer::new(limit, Duration::from_secs(1))),
        ),
    };
    // Outermost, so the stamp is taken before the limiter decides.
    let router = match &recorder {
        Some(recorder) => app.layer(axum::middleware::from_fn_with_state(
            Arc::clone(recorder),
            observe,
        )),
        None => app,
    };
    Ok(Built {
        router,
        recorder,
        stats,
    })
}

/// tower_governor for `limit` requests per second with the given burst.
///
/// Its `per_second(n)` sets a *period* (one cell every `n` seconds), so a
/// rate of `limit` per second is written as a period of `1 s / limit`.
fn governor(
    limit: u64,
    burst: u64,
) -> Result<
    GovernorLayer<
        GlobalKeyExtractor,
        ::governor::middleware::NoOpMiddleware<::governor::clock::QuantaInstant>,
        axum::body::Body,
    >,
    String,
> {
    let limit32 = u32::try_from(limit).map_err(|_| format!("limit {limit} exceeds u32"))?;
    let burst = u32::try_from(burst).map_err(|_| format!("burst {burst} exceeds u32"))?;
    let period = Duration::from_secs(1) / limit32.max(1);
    let config = GovernorConfigBuilder::default()
        .period(period)
        .burst_size(burst)
        .key_extractor(GlobalKeyExtractor)
        .finish()
        .ok_or_else(|| format!("tower_governor refused period {period:?}, burst {burst}"))?;
    Ok(GovernorLayer::new(config))
}

/// `HandleErrorLayer`'s handler for the tower stack: `LoadShed`'s
/// `Overloaded` means "rate limited"; anything else (the buffer's worker
/// gone) is a server error.
async fn tower_error_to_response(error: BoxError) -> (StatusCode, String) {
    if error.is::<tower::load_shed::error::Overloaded>() {
        (StatusCode::TOO_MANY_REQUESTS, "rate limited".to_owned())
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}"))
    }
}

/// A layer that adds a service wrapper and nothing else.
#[derive(Debug, Clone, Copy)]
pub struct NoopLayer;

impl<S> Layer<S> for NoopLayer {
    type Service = Noop<S>;

    fn layer(&self, inner: S) -> Noop<S> {
        Noop { inner }
    }
}

/// The service [`NoopLayer`] produces: forwards both calls untouched.
#[derive(Debug, Clone)]
pub struct Noop<S> {
    /// The wrapped service.
    inner: S,
}

impl<S, R> Service<R> for Noop<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.inner.call(request)
    }
}

/// A contender serving on a loopback port from its own runtime.
///
/// Dropping it stops the runtime, which closes the listener and every
/// connection task.
#[derive(Debug)]
pub struct Server {
    /// The server's runtime; `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The admissions, when recorded.
    pub recorder: Option<Arc<Recorder>>,
    /// Our layer's statistics, for our contenders.
    pub stats: Option<OurStats>,
}

impl Server {
    /// Builds `contender` and serves it on `127.0.0.1` with `threads` workers.
    pub fn start(
        contender: Contender,
        settings: &Settings,
        threads: usize,
    ) -> Result<Server, String> {
        Server::start_with(threads, || build(contender, settings))
    }

    /// Serves whatever `make` builds (inside the server's runtime).
    pub fn start_with(
        threads: usize,
        make: impl FnOnce() -> Result<Built, String>,
    ) -> Result<Server, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("load-server")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a server runtime: {e}"))?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(|e| format!("cannot bind a loopback port: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("cannot make the listener non-blocking: {e}"))?;
        let built = {
            let _guard = runtime.enter();
            let built = make()?;
            let listener = tokio::net::TcpListener::from_std(listener)
                .map_err(|e| format!("cannot register the listener: {e}"))?;
            let router = built.router.clone();
            runtime.spawn(async move {
                if let Err(error) = axum::serve(listener, router).await {
                    eprintln!("load: server on {addr} stopped: {error}");
                }
            });
            built
        };
        Ok(Server {
            runtime: Some(runtime),
            addr,
            recorder: built.recorder,
            stats: built.stats,
        })
    }
}

impl Server {
    /// Starts a task on the server's runtime that sleeps until a fixed
    /// instant every [`PROBE_PERIOD`] and notes how late it woke, in
    /// microseconds: the timer lateness any waiting request on this runtime
    /// also meets. It stops with the runtime.
    pub fn timer_probe(&self) -> Arc<Mutex<Vec<u64>>> {
        let lateness = Arc::new(Mutex::new(Vec::new()));
        if let Some(runtime) = &self.runtime {
            let notes = Arc::clone(&lateness);
            runtime.spawn(async move {
                let mut due = tokio::time::Instant::now();
                loop {
                    due += PROBE_PERIOD;
                    tokio::time::sleep_until(due).await;
                    let late = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                    notes
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(late);
                }
            });
        }
        lateness
    }
}

/// How often [`Server::timer_probe`] wakes.
pub const PROBE_PERIOD: Duration = Duration::from_millis(10);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            // Safe from inside another runtime, unlike a blocking shutdown.
            runtime.shutdown_background();
        }
    }
}
