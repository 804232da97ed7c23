//! Three replicas of one HTTP service in one process, sharing one limit
//! through Redis, driven with real HTTP far above the limit; prints the
//! combined pass rate per second against the limit.
//!
//! ```text
//! redis-server --port 6379 &
//! cargo run --example cluster --features redis -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! The URL comes from `--redis <url>`, else `REDIS_URL`, else
//! `redis://127.0.0.1:6379/`. `--seconds <n>` sets the run's length
//! (default 5) and `--limit <n>` the shared limit per second (default 100).
//!
//! Each replica is a router behind its own `SlidingWindowLayer` with its
//! own `RedisStore` (its own connection): 200 if the shared window admits
//! the request, 429 if not. The layer is strict, so every second of the
//! run (however it falls against the window's buckets) is within the
//! limit. The stores connect lazily (`RedisStore::connect_lazy`): the
//! replicas start even when Redis is not up, each falls back to its own
//! window (`StoreFailure::Local`) while Redis is unreachable, and they join
//! the shared limit when it comes up. At the end each replica prints its
//! store's status: round trips, requests refused without one (keys known
//! to be blocked), requests answered by the failure policy, round trips
//! per admission, and the passes its hot key leased, spent with no round
//! trip and stranded (try `--limit 20000`: a limit that high leases).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower_sliding_window::store::{RedisStore, StoreFailure, StoreMode};
use tower_sliding_window::{SlidingWindowLayer, StatsHandle};

const REPLICAS: usize = 3;
const CLIENTS_PER_REPLICA: usize = 4;

struct Settings {
    url: String,
    seconds: u64,
    limit: u64,
}

const USAGE: &str = "usage: cluster [--redis <url>] [--seconds <n>] [--limit <n>]";

fn settings() -> Result<Settings, String> {
    let mut url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let (mut seconds, mut limit) = (5, 100);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: a whole number, not {value:?}"))
        };
        match flag.as_str() {
            "--redis" => url = value.clone(),
            "--seconds" => seconds = number()?,
            "--limit" => limit = number()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Settings {
        url,
        seconds,
        limit,
    })
}

/// Starts one replica on a free loopback port; returns its address and
/// its statistics.
async fn replica(
    url: &str,
    prefix: &str,
    limit: u64,
) -> Result<(SocketAddr, StatsHandle<()>), String> {
    // Lazy: a replica starts whether or not Redis is up yet.
    let store = RedisStore::connect_lazy(url)
        .map_err(|err| format!("cannot use Redis at {url}: {err}"))?
        .prefix(prefix)
        .timeout(Duration::from_millis(50));
    let layer = SlidingWindowLayer::qps(limit)
        .strict()
        .store(store)
        .on_store_error(StoreFailure::Local);
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|err| format!("cannot listen on a loopback port: {err}"))?;
    let addr = listener
        .local_addr()
        .map_err(|err| format!("no local address: {err}"))?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, stats))
}

/// Per second of the run: passed, refused, failed.
struct Tally {
    seconds: Vec<[AtomicU64; 3]>,
}

/// Sends `GET /` over one keep-alive connection until `end`.
async fn client(addr: SocketAddr, start: Instant, end: Instant, tally: Arc<Tally>) {
    let Ok(stream) = TcpStream::connect(addr).await else {
        eprintln!("cannot connect to the replica on {addr}");
        return;
    };
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        eprintln!("no HTTP/1 handshake with the replica on {addr}");
        return;
    };
    tokio::spawn(connection);
    while Instant::now() < end {
        let Ok(request) = http::Request::get("/")
            .header("host", "replica")
            .body(Empty::<bytes::Bytes>::new())
        else {
            return;
        };
        let Ok(response) = sender.send_request(request).await else {
            break;
        };
        let second = start.elapsed().as_secs() as usize;
        let column = match response.status() {
            StatusCode::OK => 0,
            StatusCode::TOO_MANY_REQUESTS => 1,
            _ => 2,
        };
        if let Some(row) = tally.seconds.get(second) {
            row[column].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::main]
async fn main() {
    if let Err(message) = run().await {
        eprintln!("cluster: {message}");
        std::process::exit(2);
    }
}

async fn run() -> Result<(), String> {
    let settings = settings().map_err(|why| format!("{why}\n{USAGE}"))?;
    // One prefix per run, shared by the three replicas.
    let prefix = format!("cluster-example-{}:", std::process::id());
    let (mut addrs, mut stats) = (Vec::new(), Vec::new());
    for _ in 0..REPLICAS {
        let (addr, handle) = replica(&settings.url, &prefix, settings.limit).await?;
        addrs.push(addr);
        stats.push(handle);
    }
    println!(
        "{REPLICAS} replicas on {addrs:?}, limit {} per second shared through {}",
        settings.limit, settings.url
    );
    // The stores connect in the background; give them a moment.
    let connected = Instant::now() + Duration::from_secs(1);
    while Instant::now() < connected && !remote(&stats) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !remote(&stats) {
        println!(
            "Redis at {} is not reachable (yet): each replica limits on its own \
             (up to {REPLICAS} x {} per second) until it is, and joins the shared limit \
             when it comes up (start it with `redis-server --port 6379`)",
            settings.url, settings.limit
        );
    }

    let tally = Arc::new(Tally {
        seconds: (0..settings.seconds).map(|_| Default::default()).collect(),
    });
    let start = Instant::now();
    let end = start + Duration::from_secs(settings.seconds);
    let mut clients = Vec::new();
    for addr in &addrs {
        for _ in 0..CLIENTS_PER_REPLICA {
            clients.push(tokio::spawn(client(*addr, start, end, Arc::clone(&tally))));
        }
    }
    for client in clients {
        let _ = client.await;
    }

    println!("second  passed  limit  refused  other");
    for (second, row) in tally.seconds.iter().enumerate() {
        let [passed, refused, failed] = row.each_ref().map(|c| c.load(Ordering::Relaxed));
        println!(
            "{second:>6}  {passed:>6}  {:>5}  {refused:>7}  {failed:>6}",
            settings.limit
        );
    }
    for (i, handle) in stats.iter().enumerate() {
        if let Some(status) = handle.store_status() {
            println!(
                "replica {i}: {:?}, {} round trips, {} refused without one, {} answered by the \
                 failure policy",
                status.mode, status.round_trips, status.answered_locally, status.fallbacks
            );
            let per_admission = status
                .round_trips_per_admission()
                .map_or("-".to_owned(), |r| format!("{r:.3}"));
            println!(
                "replica {i}: {per_admission} round trips per admission; {} passes leased, {} \
                 spent with no round trip, {} stranded (unspent when their bucket ended)",
                status.leased, status.lease_spent, status.stranded
            );
            if status.evicting {
                println!(
                    "replica {i}: the Redis server evicts keys (maxmemory-policy): set it to \
                     noeviction to share the limit"
                );
            }
        }
    }
    Ok(())
}

/// Whether every replica's store decides in Redis now.
fn remote(stats: &[StatsHandle<()>]) -> bool {
    stats.iter().all(|handle| {
        handle
            .store_status()
            .is_some_and(|s| s.mode == StoreMode::Remote)
    })
}
