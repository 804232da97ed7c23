//! Resident memory under a flood of distinct large keys through
//! `axum::serve`: the key table stays within the bound
//! documented on `SlidingWindowLayer::max_keys` however large the header
//! values clients send.
//!
//! One test in its own binary, so that no other test's memory shows in the
//! process's resident set. Linux only (it reads `/proc/self/status`).

#![cfg(target_os = "linux")]

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::{HeaderName, Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower_sliding_window::{HeaderKey, SlidingWindowLayer};

/// Default `max_keys`: the table fills up exactly.
const KEYS: usize = 4096;
/// Bytes per header value: 16 times the longest key kept verbatim.
const VALUE_BYTES: usize = 64 * 1024;
const CONNECTIONS: usize = 8;

/// The bound documented on `max_keys` for the default table.
const TABLE_BOUND: u64 = 21 * 1024 * 1024;
/// What the server's own buffers may add: one request head per connection
/// in flight, and what the allocator keeps of the heads it freed.
const SERVER_ALLOWANCE: u64 = 16 * 1024 * 1024;

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

async fn serve(app: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server runs");
    });
    (addr, server)
}

/// Sends the requests `keys` on one connection, in order.
async fn client(addr: SocketAddr, keys: Vec<usize>) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let connection = tokio::spawn(connection);
    let mut value = vec![b'v'; VALUE_BYTES];
    for key in keys {
        let tag = format!("{key:08}");
        value[..8].copy_from_slice(tag.as_bytes());
        let request = Request::get("/")
            .header("host", "localhost")
            .header("x-key", &value[..])
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let response = sender.send_request(request).await.expect("a response");
        assert_eq!(response.status(), StatusCode::OK);
    }
    drop(sender);
    let _ = connection.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_64_kib_keys_stays_within_the_table_bound() {
    let layer = SlidingWindowLayer::qps(10).key(HeaderKey::new(HeaderName::from_static("x-key")));
    let stats = layer.handle();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let (addr, server) = serve(app).await;

    // Warm up the server, the runtime and the table's fixed part.
    client(addr, vec![99_999_999]).await;
    let before = resident_bytes();

    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let keys = (0..KEYS - 1).filter(|k| k % CONNECTIONS == c).collect();
            tokio::spawn(client(addr, keys))
        })
        .collect();
    for c in clients {
        c.await.expect("client");
    }
    let after = resident_bytes();
    server.abort();

    let grown = after.saturating_sub(before);
    println!(
        "{KEYS} keys of {VALUE_BYTES} bytes: resident {:.1} MiB -> {:.1} MiB (+{:.1} MiB)",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        grown as f64 / 1048576.0
    );
    assert_eq!(stats.len(), KEYS, "every key has its own entry");
    assert!(
        grown <= TABLE_BOUND + SERVER_ALLOWANCE,
        "resident memory grew by {grown} bytes for {KEYS} keys"
    );
}
