//! `load redis`: what a shared limit in Redis costs, side by side in one
//! run (feature `redis` of this package).
//!
//! Three admission paths, each wrapped as a tower service that answers 200
//! or 429, driven in-process (no HTTP, so the figures are the limiter's and
//! the Redis round trip's):
//!
//! - `local`: the layer alone (`SlidingWindowLayer`, one global key), the
//!   baseline of one replica;
//! - `layer + redis-store`: the same layer with `.store(RedisStore)`: what
//!   a shared limit adds per admitted request;
//! - `redis-store`: `RedisStore::admit` (the bucketed-window script);
//! - `redis-gcra`: a GCRA Lua script as users write it with the `redis`
//!   crate (`Script` over a `ConnectionManager`, the time from `TIME`, one
//!   `SET ... PX` per admission), the usual peer.
//!
//! Latency: one caller, `--overhead-requests` admissions, all admitted
//! (the limit is far above the rate); p50 and p99. The store's key is hot
//! there, so it leases: most admissions make no round trip.
//!
//! Then a shared limit under overload: three replicas (each its own
//! store and connection), one hot key, 100 000 a second, twice that
//! offered by paced callers: the layer alone, the layer with the store
//! (leases on, then off), and the GCRA peer; admitted per second, round
//! trips per admission and leased passes stranded. Throughput: `--connections`
//! concurrent callers for `--bench-secs`, admitted requests per second.
//! The server is `REDIS_URL` if set, else a `redis-server` this mode starts
//! on a free loopback port (and stops).

use std::convert::Infallible;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{service_fn, ServiceExt};
use tower_sliding_window::store::RedisStore;
use tower_sliding_window::SlidingWindowLayer;

use crate::cli::Config;

/// A limit no run reaches: every request is admitted.
const UNREACHED: u64 = 1_000_000_000;

/// One admission path's figures.
#[derive(Debug)]
pub struct Row {
    pub name: &'static str,
    pub p50_us: f64,
    pub p99_us: f64,
    pub admitted_per_sec: f64,
}

/// A `redis-server` started for the run, stopped on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> Result<(String, Server), String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let dir = std::env::temp_dir().join(format!("load-redis-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run redis-server (set REDIS_URL or install it): {e}"))?;
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("redis-server did not listen on port {port}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((format!("redis://127.0.0.1:{port}/"), server))
}

/// The GCRA peer: the theoretical arrival time (TAT) of the key, in ms on
/// the server's clock; a request is admitted if its TAT minus the burst
/// tolerance is not in the future.
const GCRA_LUA: &str = r"
local emission = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local next_tat = tat + emission
if next_tat - tolerance > now then
  return {0, math.ceil(next_tat - tolerance - now)}
end
redis.call('SET', KEYS[1], next_tat, 'PX', math.ceil(next_tat - now) + 1)
return {1, 0}
";

fn answer(passed: bool) -> Response<Full<Bytes>> {
    let status = if passed {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    };
    let mut response = Response::new(Full::default());
    *response.status_mut() = status;
    response
}

type BoxService =
    tower::util::BoxCloneSyncService<Request<String>, Response<Full<Bytes>>, Infallible>;

fn local() -> BoxService {
    let inner = service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(answer(true)) });
    let layered = tower::Layer::layer(&SlidingWindowLayer::qps(UNREACHED), inner);
    BoxService::new(layered)
}

fn layer_with_store(store: RedisStore) -> BoxService {
    let inner = service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(answer(true)) });
    let layer = SlidingWindowLayer::qps(UNREACHED).store(store);
    BoxService::new(tower::Layer::layer(&layer, inner))
}

fn store(store: RedisStore) -> BoxService {
    BoxService::new(service_fn(move |_req: Request<String>| {
        let store = store.clone();
        async move {
            let passed = matches!(store.admit("GET /", UNREACHED).await, Ok(v) if v.passed);
            Ok::<_, Infallible>(answer(passed))
        }
    }))
}

fn gcra(connection: redis::aio::ConnectionManager) -> BoxService {
    let script = Arc::new(redis::Script::new(GCRA_LUA));
    // One request every 1e-6 ms, a burst of a million: never refuses.
    BoxService::new(service_fn(move |_req: Request<String>| {
        let (script, mut connection) = (Arc::clone(&script), connection.clone());
        async move {
            let reply: redis::RedisResult<Vec<i64>> = script
                .key("gcra:{GET /}")
                .arg(0.000_001)
                .arg(1.0)
                .invoke_async(&mut connection)
                .await;
            let passed = matches!(reply.as_deref(), Ok([1, _]));
            Ok::<_, Infallible>(answer(passed))
        }
    }))
}

async fn call(service: &BoxService) -> bool {
    let response = service
        .clone()
        .oneshot(Request::new(String::new()))
        .await
        .unwrap_or_else(|never| match never {});
    response.status() == StatusCode::OK
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn measure(name: &'static str, service: BoxService, config: &Config) -> Result<Row, String> {
    // Warm-up, and a check that the path admits.
    for _ in 0..1_000 {
        if !call(&service).await {
            return Err(format!("{name}: a request was refused or failed"));
        }
    }
    let mut latencies = Vec::with_capacity(config.overhead_requests as usize);
    for _ in 0..config.overhead_requests {
        let started = Instant::now();
        let passed = call(&service).await;
        let took = started.elapsed();
        if passed {
            latencies.push(took.as_secs_f64() * 1e6);
        }
    }
    latencies.sort_by(f64::total_cmp);

    // Each caller stops at the deadline on its own: a local admission never
    // yields, so a stop flag set by another task might never be read.
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + config.bench_time;
    let mut callers = Vec::new();
    for _ in 0..config.connections {
        let (service, admitted) = (service.clone(), Arc::clone(&admitted));
        callers.push(tokio::spawn(async move {
            let mut calls = 0u64;
            while Instant::now() < deadline {
                if call(&service).await {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                calls += 1;
                if calls % 64 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for caller in callers {
        let _ = caller.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let total = admitted.load(Ordering::Relaxed);
    Ok(Row {
        name,
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        admitted_per_sec: total as f64 / elapsed,
    })
}

/// The shared limit of the overload table, per second.
const SHARED_LIMIT: u64 = 100_000;
/// Replicas sharing it.
const REPLICAS: usize = 3;
/// Offered load, as a multiple of the limit.
const OVERLOAD: u64 = 2;
/// The window fills in its first second; admissions are counted after it.
const FILL: Duration = Duration::from_secs(1);

/// One path's figures under overload.
#[derive(Debug)]
pub struct SharedRow {
    pub name: &'static str,
    pub offered_per_sec: f64,
    pub admitted_per_sec: f64,
    /// Round trips to Redis per admitted request (`None`: no Redis).
    pub trips_per_admitted: Option<f64>,
    /// Leased passes stranded per second (store paths).
    pub stranded_per_sec: Option<f64>,
}

/// `replicas` services (one per replica), each driven by
/// `config.connections` callers paced so that together they offer
/// `OVERLOAD x SHARED_LIMIT` requests a second (a caller that falls behind
/// catches up without pause: the load offered is what the path can take,
/// up to that). Counts after the window's first second, for
/// `config.bench_time`. `trips` reads the round trips and stranded passes
/// so far.
async fn overload(
    name: &'static str,
    replicas: Vec<BoxService>,
    config: &Config,
    trips: impl Fn() -> Option<(u64, u64)>,
) -> SharedRow {
    let callers = config.connections.max(1);
    let per_caller = (OVERLOAD * SHARED_LIMIT) as f64 / (replicas.len() * callers) as f64;
    let gap = Duration::from_secs_f64(1.0 / per_caller);
    let admitted = Arc::new(AtomicU64::new(0));
    let offered = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let from = started + FILL;
    let until = from + config.bench_time;
    let mut tasks = Vec::new();
    for (r, service) in replicas.iter().enumerate() {
        for c in 0..callers {
            let (service, admitted, offered) =
                (service.clone(), Arc::clone(&admitted), Arc::clone(&offered));
            // Callers start spread over one gap.
            let offset = gap.mul_f64((r * callers + c) as f64 / (replicas.len() * callers) as f64);
            tasks.push(tokio::spawn(async move {
                let mut next = started + offset;
                loop {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    if now < next {
                        tokio::time::sleep_until(next.into()).await;
                    }
                    next += gap;
                    let counted = Instant::now() >= from;
                    let passed = call(&service).await;
                    if counted {
                        offered.fetch_add(1, Ordering::Relaxed);
                        if passed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    tokio::time::sleep_until(from.into()).await;
    let before = trips();
    for task in tasks {
        let _ = task.await;
    }
    let after = trips();
    let secs = config.bench_time.as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed);
    let delta = before
        .zip(after)
        .map(|((t0, s0), (t1, s1))| (t1 - t0, s1 - s0));
    SharedRow {
        name,
        offered_per_sec: offered.load(Ordering::Relaxed) as f64 / secs,
        admitted_per_sec: admitted as f64 / secs,
        trips_per_admitted: delta.map(|(t, _)| t as f64 / admitted.max(1) as f64),
        stranded_per_sec: delta.map(|(_, s)| s as f64 / secs),
    }
}

/// A GCRA service at `SHARED_LIMIT` a second with a burst of one second,
/// counting its calls (its round trips).
fn gcra_limited(connection: redis::aio::ConnectionManager, calls: Arc<AtomicU64>) -> BoxService {
    let script = Arc::new(redis::Script::new(GCRA_LUA));
    let emission_ms = 1_000.0 / SHARED_LIMIT as f64;
    BoxService::new(service_fn(move |_req: Request<String>| {
        let (script, mut connection) = (Arc::clone(&script), connection.clone());
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::Relaxed);
            let reply: redis::RedisResult<Vec<i64>> = script
                .key("gcra-shared:{hot}")
                .arg(emission_ms)
                .arg(1_000.0)
                .invoke_async(&mut connection)
                .await;
            let passed = matches!(reply.as_deref(), Ok([1, _]));
            Ok::<_, Infallible>(answer(passed))
        }
    }))
}

fn shared_layer(store: Option<RedisStore>) -> BoxService {
    let inner = service_fn(|_req: Request<String>| async { Ok::<_, Infallible>(answer(true)) });
    let layer = SlidingWindowLayer::qps(SHARED_LIMIT);
    match store {
        Some(store) => BoxService::new(tower::Layer::layer(&layer.store(store), inner)),
        None => BoxService::new(tower::Layer::layer(&layer, inner)),
    }
}

/// The overload table: the layer alone, the layer with the store (leases
/// on, then off) on three replicas, and the GCRA peer.
async fn shared(url: &str, config: &Config) -> Result<Vec<SharedRow>, String> {
    let mut rows = Vec::new();
    // The layer alone: one process holds the limit, every caller shares it.
    let alone = shared_layer(None);
    rows.push(
        overload(
            "layer, no store (one process)",
            vec![alone.clone(), alone.clone(), alone],
            config,
            || None,
        )
        .await,
    );
    for (name, leases) in [
        ("layer + redis-store, leases on", true),
        ("layer + redis-store, leases off", false),
    ] {
        let mut stores = Vec::new();
        let prefix = format!("load-shared-{}-{leases}:", std::process::id());
        for _ in 0..REPLICAS {
            let store = RedisStore::connect(url)
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))?
                .prefix(prefix.clone())
                .timeout(Duration::from_secs(1))
                .leases(leases);
            stores.push(store);
        }
        let services = stores
            .iter()
            .map(|s| shared_layer(Some(s.clone())))
            .collect();
        let status = || {
            Some(stores.iter().fold((0, 0), |(t, s), store| {
                let status = store.status();
                (t + status.round_trips, s + status.stranded)
            }))
        };
        rows.push(overload(name, services, config, status).await);
    }
    let calls = Arc::new(AtomicU64::new(0));
    let mut services = Vec::new();
    for _ in 0..REPLICAS {
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let manager = redis::aio::ConnectionManager::new(client)
            .await
            .map_err(|e| format!("cannot connect to {url}: {e}"))?;
        services.push(gcra_limited(manager, Arc::clone(&calls)));
    }
    rows.push(
        overload("redis-gcra (GCRA Lua peer)", services, config, || {
            Some((calls.load(Ordering::Relaxed), 0))
        })
        .await,
    );
    Ok(rows)
}

/// Runs the three paths; returns the Markdown report.
pub async fn run(config: &Config) -> Result<String, String> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let (url, server) = start_server()?;
            (url, Some(server))
        }
    };
    let redis_store = RedisStore::connect(&url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?
        .prefix(format!("load-{}:", std::process::id()))
        .timeout(Duration::from_secs(1));
    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let manager = redis::aio::ConnectionManager::new(client)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;

    let mut rows = Vec::new();
    rows.push(measure("local (layer, no Redis)", local(), config).await?);
    rows.push(
        measure(
            "layer + redis-store (.store)",
            layer_with_store(redis_store.clone()),
            config,
        )
        .await?,
    );
    rows.push(
        measure(
            "redis-store (RedisStore::admit)",
            store(redis_store),
            config,
        )
        .await?,
    );
    rows.push(measure("redis-gcra (GCRA Lua peer)", gcra(manager), config).await?);

    let mut text = String::from(
        "## Redis: latency and throughput of one replica\n\n\
         In-process tower services (no HTTP), release build, Redis over loopback. \
         Latency: one caller, every request admitted. Throughput: concurrent callers. \
         The store's key is hot: it leases, and most admissions make no round trip.\n\n\
         | path | p50 µs | p99 µs | admitted/s |\n|---|---|---|---|\n",
    );
    for row in &rows {
        text.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.0} |\n",
            row.name, row.p50_us, row.p99_us, row.admitted_per_sec
        ));
    }
    text.push_str(&format!(
        "\n{} latency samples per path; throughput over {} s with {} callers.\n",
        config.overhead_requests,
        config.bench_time.as_secs(),
        config.connections
    ));

    let rows = shared(&url, config).await?;
    let alone = rows[0].admitted_per_sec;
    text.push_str(&format!(
        "\n## A shared limit under overload\n\n\
         {REPLICAS} replicas (in-process, each with its own connection), one hot key, \
         limit {SHARED_LIMIT}/s, {OVERLOAD}x the limit offered ({} callers a replica, paced; \
         a caller that falls behind catches up without pause). Counted over {} s after the \
         window's first second. `layer, no store`: one layer instance that every caller \
         shares (the limit held by one process).\n\n\
         | path | offered/s | admitted/s | vs no store | round trips / admitted | stranded/s |\n\
         |---|---|---|---|---|---|\n",
        config.connections,
        config.bench_time.as_secs()
    ));
    for row in &rows {
        let trips = row
            .trips_per_admitted
            .map_or("-".to_owned(), |t| format!("{t:.4}"));
        let stranded = row
            .stranded_per_sec
            .map_or("-".to_owned(), |s| format!("{s:.0}"));
        text.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2}x | {trips} | {stranded} |\n",
            row.name,
            row.offered_per_sec,
            row.admitted_per_sec,
            row.admitted_per_sec / alone,
        ));
    }
    Ok(text)
}
