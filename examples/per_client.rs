//! Per-client limits per route in one layer: 5 `POST /login` per client per
//! minute, 100 requests per client per second elsewhere, each client
//! counted apart, so one client spending its logins locks no one else out.
//!
//! The example serves an axum app on a free loopback port, sends requests
//! to it as two clients behind one reverse proxy (it sets
//! `X-Forwarded-For` as the proxy would), prints every answer and the
//! layer's statistics, and exits.
//!
//! ```sh
//! cargo run --example per_client --features axum
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_sliding_window::key::ForwardedIpKey;
use tower_sliding_window::{ClientRouteKey, MatchedPathKey, SlidingWindowLayer};

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Body>;

/// Sends `method path` as `client` (the address the proxy saw) and prints
/// the answer; returns its status.
async fn send(
    http: &HttpClient,
    addr: SocketAddr,
    client: &str,
    method: Method,
    path: &str,
) -> StatusCode {
    let request = Request::builder()
        .method(method.clone())
        .uri(format!("http://{addr}{path}"))
        .header("x-forwarded-for", client)
        .body(Body::empty())
        .expect("valid request");
    let response = http.request(request).await.expect("the server answers");
    let status = response.status();
    let retry = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(|s| format!(" (Retry-After: {s} s)"))
        .unwrap_or_default();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    println!(
        "{client:<13} {:<5} {path:<14} -> {} {}{retry}",
        method.as_str(),
        status.as_u16(),
        String::from_utf8_lossy(&body).trim()
    );
    status
}

#[tokio::main]
async fn main() {
    // One layer for both limits, each per client: 100 per second on every
    // route (the first window), and a minute's window in which POST /login
    // has 5 and every other route 6 000 (which 100 per second never
    // exceeds).
    let minute = Duration::from_secs(60);
    let limit = SlidingWindowLayer::qps(100)
        // The client is the address the one proxy in front saw; the route
        // is the matched route template, which a client cannot vary.
        .key(ClientRouteKey::new(
            ForwardedIpKey::trusted_hops(1),
            MatchedPathKey,
        ))
        .limit_per(minute, 6_000)
        .route_rule_per("POST /login", minute, 5);
    let stats = limit.handle();

    let app = Router::new()
        .route("/login", post(|| async { "welcome" }))
        .route("/", get(|| async { "home" }))
        .layer(limit);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener.local_addr().expect("a bound address");
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    println!("serving on http://{addr}\n");

    let http: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let (alice, bob) = ("203.0.113.7", "198.51.100.20");

    println!("alice tries to log in 7 times:");
    let mut alice_logins = Vec::new();
    for _ in 0..7 {
        alice_logins.push(send(&http, addr, alice, Method::POST, "/login").await);
    }
    println!("\nbob is not locked out by alice:");
    let bob_login = send(&http, addr, bob, Method::POST, "/login").await;
    println!("\nalice's other requests run on 100 per second:");
    let mut alice_home = Vec::new();
    for _ in 0..3 {
        alice_home.push(send(&http, addr, alice, Method::GET, "/").await);
    }
    println!("\nalice varies the query: still POST /login:");
    let alice_again = send(&http, addr, alice, Method::POST, "/login?next=/admin").await;

    println!("\nper key (client, route), each window's passes and limit:");
    let mut snapshots = stats.snapshots();
    snapshots.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, s) in snapshots {
        let windows = stats.windows(&key).unwrap_or_default();
        let (client, route) = key;
        let client = client.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
        let shown: Vec<String> = windows
            .iter()
            .map(|w| format!("{:>2}/{:<4} per {:?}", w.pass, w.limit, w.interval))
            .collect();
        println!(
            "  {client:<15} {route:<12} block {:>2}  {}",
            s.block,
            shown.join(", ")
        );
    }
    println!(
        "route rules per minute: {:?}",
        stats
            .route_limits_per(minute)
            .expect("the layer has a minute's window")
    );

    server.abort();
    let expected = alice_logins[..5].iter().all(|s| *s == StatusCode::OK)
        && alice_logins[5..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS)
        && bob_login == StatusCode::OK
        && alice_home.iter().all(|s| *s == StatusCode::OK)
        && alice_again == StatusCode::TOO_MANY_REQUESTS;
    if !expected {
        eprintln!("\nunexpected answers: see above");
        std::process::exit(1);
    }
    println!(
        "\nas expected: 5 logins per client per minute, 100 per second elsewhere, each client \
         counted apart"
    );
}
