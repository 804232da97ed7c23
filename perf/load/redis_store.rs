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
//! (the limit is far above the rate); p50 and p99. Throughput: `--connections`
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
         Latency: one caller, every request admitted. Throughput: concurrent callers.\n\n\
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
    Ok(text)
}
