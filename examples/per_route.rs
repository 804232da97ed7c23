//! Limits per matched route: every `/users/{id}` shares one window whatever
//! the id, `POST /login` has a strict rule of its own, and `route_layer`
//! leaves unknown paths to a plain 404.
//!
//! ```sh
//! cargo run --example per_route --features axum
//! # in another terminal:
//! for i in $(seq 5); do curl -s -X POST -o /dev/null -w '%{http_code}\n' localhost:3000/login; done
//! curl -si localhost:3000/users/42
//! curl -s localhost:3000/stats
//! ```

use std::fmt::Write as _;

use axum::extract::Path;
use axum::routing::{get, post};
use axum::Router;
use tower_sliding_window::{MatchedPathKey, SlidingWindowLayer, StatsHandle};

async fn user(Path(id): Path<u64>) -> String {
    format!("user {id}\n")
}

async fn login() -> &'static str {
    "welcome\n"
}

/// One line per route: passes, blocks and the limit in the current window.
fn report(stats: &StatsHandle<String>) -> String {
    let mut snapshots = stats.snapshots();
    snapshots.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (route, s) in snapshots {
        let _ = writeln!(
            out,
            "{route:<18} pass {:>3}  block {:>3}  limit {:>3}",
            s.pass, s.block, s.limit
        );
    }
    out
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // Keys are route templates such as "GET /users/{id}": bounded by the
    // number of routes, whatever clients put in the URL.
    let limit = SlidingWindowLayer::qps(50)
        .key(MatchedPathKey)
        // Three login attempts per second, for all clients together.
        .rule("POST /login", 3)
        // Tell clients where they stand on every response.
        .headers_on_pass(true);
    let stats = limit.handle();

    let app = Router::new()
        .route("/users/{id}", get(user))
        .route("/login", post(login))
        // Only requests that match a route are counted and limited; anything
        // else gets its 404, never a 429.
        .route_layer(limit)
        .route("/stats", get(move || std::future::ready(report(&stats))));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!(
        "try: curl -X POST localhost:3000/login (3 per second), then curl localhost:3000/stats"
    );
    axum::serve(listener, app).await
}
