//! A live demonstration: an axum server with three routes and three limits,
//! real HTTP load from the same process, and a per-second table read from
//! the stats handle.
//!
//! ```sh
//! cargo run --example demo
//! ```
//!
//! The server listens on 127.0.0.1 (a free port). Clients offer more than
//! each route's limit for a few seconds; every second the table shows, per
//! route, what the limiter's statistics say about the last second: requests
//! passed and blocked, requests per second reaching the route, and the
//! average response time of the passed ones. At the end a verdict checks the
//! numbers against the limits. A fourth route, `/flaky`, fails from the 2nd
//! to the 4th second: its circuit breaker opens (503 instead of calling it),
//! probes once the route has healed, and closes again; the table's last
//! column shows the breaker's state.
//!
//! The server also serves the live dashboard while the load runs (its URL is
//! printed first; the crate's examples are built with the `dashboard`
//! feature, see the dev-dependencies in Cargo.toml), and `--serve` keeps the
//! server and the load running after the verdict, until Ctrl-C:
//!
//! ```sh
//! cargo run --example demo -- --serve
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{interval, sleep, sleep_until, Instant, MissedTickBehavior};
use tower_sliding_window::breaker::{Breaker, BreakerState};
use tower_sliding_window::clock::{Clock, SystemClock};
use tower_sliding_window::{MethodPathKey, SlidingWindowLayer, StatsHandle};

/// How long the clients send requests.
const LOAD_SECONDS: u64 = 6;

/// One route of the demo: its limit and the load the clients offer.
struct Route {
    method: Method,
    path: &'static str,
    /// Requests per second the limiter admits.
    limit: u64,
    /// Requests per second the clients send.
    offered: u64,
}

impl Route {
    /// The route's key under `MethodPathKey`: `"GET /search"`.
    fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

const DEFAULT_LIMIT: u64 = 100;

/// Bucket length of the default window (1 s in 10 buckets).
const BUCKET_MS: u64 = 100;

const ROUTES: [Route; 4] = [
    Route {
        method: Method::GET,
        path: "/",
        limit: DEFAULT_LIMIT,
        offered: 150,
    },
    Route {
        method: Method::GET,
        path: "/search",
        limit: 20,
        offered: 40,
    },
    Route {
        method: Method::POST,
        path: "/login",
        limit: 5,
        offered: 12,
    },
    Route {
        method: Method::GET,
        path: "/flaky",
        limit: DEFAULT_LIMIT,
        offered: 20,
    },
];

/// `/flaky` fails (500) from this second of the load...
const FLAKY_FROM: u64 = 2;
/// ...until this one.
const FLAKY_UNTIL: u64 = 4;

/// What the clients saw on one route.
#[derive(Default)]
struct Seen {
    ok: AtomicU64,
    /// 429 with a `Retry-After`.
    too_many: AtomicU64,
    /// 500 from the route itself (only `/flaky` fails).
    failed: AtomicU64,
    /// 503 with a `Retry-After`: cut off by the route's circuit breaker.
    cut_off: AtomicU64,
    /// Anything else, a 429 without `Retry-After` included, or no response.
    other: AtomicU64,
}

/// Set while `/flaky` fails.
static FLAKY: AtomicBool = AtomicBool::new(false);

async fn flaky() -> StatusCode {
    if FLAKY.load(Ordering::Relaxed) {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

async fn home() -> &'static str {
    "home\n"
}

/// A slower route: 5 to 15 ms of "work".
async fn search() -> &'static str {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    sleep(Duration::from_millis(5 + n % 11)).await;
    "results\n"
}

async fn login() -> &'static str {
    "welcome\n"
}

/// Sends `route.offered` requests per second until `until`, each from its
/// own task, over a pooled client.
async fn drive(
    client: Client<HttpConnector, Empty<Bytes>>,
    base: String,
    route: &'static Route,
    until: Instant,
    seen: Arc<Seen>,
) {
    let mut tick = interval(Duration::from_secs(1) / route.offered as u32);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut in_flight = JoinSet::new();
    loop {
        let at = tick.tick().await;
        if at >= until {
            break;
        }
        let request = Request::builder()
            .method(route.method.clone())
            .uri(format!("{base}{}", route.path))
            .body(Empty::new())
            .expect("valid request");
        let client = client.clone();
        let seen = Arc::clone(&seen);
        in_flight.spawn(async move {
            let counter = match client.request(request).await {
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response.headers().contains_key(RETRY_AFTER);
                    // Read the body so the connection goes back to the pool.
                    let _ = response.into_body().collect().await;
                    match status {
                        StatusCode::OK => &seen.ok,
                        StatusCode::TOO_MANY_REQUESTS if retry_after => &seen.too_many,
                        StatusCode::INTERNAL_SERVER_ERROR => &seen.failed,
                        StatusCode::SERVICE_UNAVAILABLE if retry_after => &seen.cut_off,
                        _ => &seen.other,
                    }
                }
                Err(_) => &seen.other,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
    }
    while in_flight.join_next().await.is_some() {}
}

fn format_rt(rt: Option<Duration>) -> String {
    match rt {
        Some(rt) if rt < Duration::from_millis(1) => format!("{} µs", rt.as_micros()),
        Some(rt) => format!("{:.1} ms", rt.as_secs_f64() * 1000.0),
        None => "-".to_owned(),
    }
}

/// Prints one second of the table and returns each route's pass count.
fn print_second(second: u64, stats: &StatsHandle<String>) -> Vec<u64> {
    let mut passes = Vec::new();
    for (i, route) in ROUTES.iter().enumerate() {
        let snapshot = stats.snapshot(&route.key()).unwrap_or_default();
        // The window is 1 s, so counts in the window are counts per second.
        let qps = snapshot.pass + snapshot.block;
        let t = if i == 0 {
            format!("{second}s")
        } else {
            String::new()
        };
        let breaker = stats
            .breakers(&route.key())
            .first()
            .map_or("closed", |b| b.name());
        println!(
            "{t:>4}  {:<13} {:>5} {:>6} {:>6} {:>6} {:>9}  {breaker}",
            route.key(),
            snapshot.limit,
            snapshot.pass,
            snapshot.block,
            qps,
            format_rt(snapshot.avg_rt),
        );
        passes.push(snapshot.pass);
    }
    passes
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let serve = std::env::args().skip(1).any(|arg| arg == "--serve");

    // One layer, keyed by method and path: the default limit for `GET /`,
    // stricter rules for the other two routes.
    // Every route also has its own circuit breaker: open for 1 s when more
    // than half of at least 5 requests in a second fail.
    let mut layer = SlidingWindowLayer::qps(DEFAULT_LIMIT)
        .key(MethodPathKey)
        .breaker(Breaker::error_ratio(0.5).open_for(Duration::from_secs(1)));
    for route in ROUTES.iter().filter(|r| r.limit != DEFAULT_LIMIT) {
        layer = layer.rule(route.key(), route.limit);
    }
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(home))
        .route("/search", get(search))
        .route("/login", post(login))
        .route("/flaky", get(flaky))
        // Only matched routes are limited; anything else is a plain 404.
        .route_layer(layer);
    // The dashboard, outside the limiter.
    let app = app.nest(
        "/dashboard",
        tower_sliding_window::dashboard::router(stats.clone()),
    );

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    println!("dashboard: http://{addr}/dashboard");
    println!("server on http://{addr}, load for {LOAD_SECONDS} s:");
    for route in &ROUTES {
        println!(
            "  {:<13} limit {:>3}/s, offered {:>3}/s",
            route.key(),
            route.limit,
            route.offered
        );
    }
    println!();
    println!("   t  route         limit   pass  block    qps    avg rt  breaker");

    let client = Client::builder(TokioExecutor::new()).build_http();
    let load_start = Instant::now();
    // A little past the last sample, so the last row is a full second too.
    let until = load_start + Duration::from_secs(LOAD_SECONDS) + Duration::from_millis(250);
    let seen: Vec<Arc<Seen>> = ROUTES.iter().map(|_| Arc::default()).collect();
    let mut drivers = JoinSet::new();
    for (route, seen) in ROUTES.iter().zip(&seen) {
        let base = format!("http://{addr}");
        drivers.spawn(drive(client.clone(), base, route, until, Arc::clone(seen)));
    }

    let clock = SystemClock::new();
    let mut max_pass = vec![0u64; ROUTES.len()];
    for second in 1..=LOAD_SECONDS {
        sleep_until(load_start + Duration::from_secs(second)).await;
        FLAKY.store(
            (FLAKY_FROM..FLAKY_UNTIL).contains(&second),
            Ordering::Relaxed,
        );
        // The window is the current 100 ms bucket and the nine before it.
        // Read it near the end of a bucket, when it spans almost a full
        // second, not just after a bucket opened (then it spans 0.9 s).
        let into_bucket = clock.now_millis() % BUCKET_MS;
        if into_bucket < BUCKET_MS - 5 {
            sleep(Duration::from_millis(BUCKET_MS - 5 - into_bucket)).await;
        }
        for (max, pass) in max_pass.iter_mut().zip(print_second(second, &stats)) {
            *max = (*max).max(pass);
        }
    }
    while drivers.join_next().await.is_some() {}

    println!();
    println!("clients saw:");
    let mut problems = Vec::new();
    let mut rejected = 0;
    let mut errors = 0;
    for ((route, seen), max) in ROUTES.iter().zip(&seen).zip(&max_pass) {
        let ok = seen.ok.load(Ordering::Relaxed);
        let too_many = seen.too_many.load(Ordering::Relaxed);
        let other = seen.other.load(Ordering::Relaxed);
        let (failed, cut_off) = (
            seen.failed.load(Ordering::Relaxed),
            seen.cut_off.load(Ordering::Relaxed),
        );
        println!(
            "  {:<13} {ok:>5} x 200, {too_many:>5} x 429, {failed:>3} x 500, {cut_off:>3} x 503, {other} other",
            route.key()
        );
        if route.path == "/flaky" {
            if cut_off == 0 {
                problems.push("/flaky was never cut off by its breaker".to_owned());
            }
            if stats.breakers(&route.key()).first() != Some(&BreakerState::Closed) {
                problems.push("/flaky's breaker did not close again".to_owned());
            }
        } else if failed + cut_off > 0 {
            problems.push(format!("{} failed or was cut off", route.key()));
        }
        rejected += too_many;
        errors += other;
        if *max > route.limit {
            problems.push(format!(
                "{} passed {max} in one window (limit {})",
                route.key(),
                route.limit
            ));
        }
        // Any 1 s window holds at most `limit` passes, and the load spans
        // fewer than LOAD_SECONDS + 1 such windows.
        if ok > route.limit * (LOAD_SECONDS + 1) {
            problems.push(format!("{} answered {ok} requests with 200", route.key()));
        }
        // A route whose clients sent more than any stretch of the load
        // could admit must have seen 429s. Judged on what was sent, not on
        // the rate asked for: a machine too busy to send that rate is not
        // the limiter's failure.
        let sent = ok + too_many + failed + cut_off + other;
        if route.offered > route.limit && sent > route.limit * (LOAD_SECONDS + 1) && too_many == 0 {
            problems.push(format!(
                "{} was never limited ({sent} requests sent)",
                route.key()
            ));
        }
    }
    if errors > 0 {
        problems.push(format!("{errors} requests failed or got another status"));
    }

    let maxima: Vec<String> = ROUTES
        .iter()
        .zip(&max_pass)
        .map(|(route, max)| format!("{} {max}/{}", route.key(), route.limit))
        .collect();
    let passed = problems.is_empty();
    if passed {
        println!(
            "verdict: PASS: no route passed more than its limit in any sampled window \
             (max/limit: {}); {rejected} excess requests got 429 with Retry-After; no errors; {:.1} s",
            maxima.join(", "),
            started.elapsed().as_secs_f64()
        );
    } else {
        println!("verdict: FAIL: {}", problems.join("; "));
    }
    if serve {
        serve_until_interrupted(client, addr).await;
    }
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}

/// `--serve`: keeps the server up, with the clients offering the same load,
/// until Ctrl-C.
async fn serve_until_interrupted(
    client: Client<HttpConnector, Empty<Bytes>>,
    addr: std::net::SocketAddr,
) {
    println!("serving on http://{addr} with the same load until Ctrl-C");
    let until = Instant::now() + Duration::from_secs(365 * 24 * 3600);
    for route in &ROUTES {
        let base = format!("http://{addr}");
        tokio::spawn(drive(client.clone(), base, route, until, Arc::default()));
    }
    let _ = tokio::signal::ctrl_c().await;
}
