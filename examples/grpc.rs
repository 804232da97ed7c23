//! A tonic gRPC server behind the layer with `.grpc()`, and a tonic client
//! that runs into its limit and its breaker: it prints the status codes,
//! the retry delay it decodes from the status details, and the metadata.
//! Runs on a free loopback port and exits by itself.
//!
//! ```sh
//! cargo run --example grpc
//! ```

use std::time::Duration;

use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::Status;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_types::StatusExt;
use tower_sliding_window::breaker::Breaker;
use tower_sliding_window::SlidingWindowLayer;

fn describe(status: &Status) -> String {
    let delay = status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
        .map_or("none".to_string(), |delay| format!("{delay:?}"));
    let retry_after = status
        .metadata()
        .get("retry-after")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("-");
    format!(
        "{:?} \"{}\" (RetryInfo delay {delay}, retry-after {retry_after})",
        status.code(),
        status.message()
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 3 RPCs per 10 s.
    let limit = SlidingWindowLayer::qps(3)
        .window(Duration::from_secs(10), 10)
        .grpc();
    let stats = limit.handle();

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(limit)
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    println!("gRPC health service on {addr}, 3 RPCs per 10 s");

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.to_string(),
    };

    // The quota: three pass, the fourth is refused with RESOURCE_EXHAUSTED
    // and the time until the window has room again.
    for i in 1..=4 {
        match client.check(check("")).await {
            Ok(response) => println!("check {i}: {:?}", response.into_inner().status()),
            Err(status) => println!("check {i}: {}", describe(&status)),
        }
    }

    // The breaker, on a second server with room to spare: RPCs that fail
    // (an unknown service is NOT_FOUND) count as exceptions by their
    // grpc-status; more than 2 in a second open the breaker for 5 s, and
    // the next RPC reads UNAVAILABLE.
    let limit = SlidingWindowLayer::qps(100)
        .breaker(
            Breaker::error_count(2)
                .min_requests(3)
                .open_for(Duration::from_secs(5)),
        )
        .grpc();
    let breaker_stats = limit.handle();
    let (_reporter2, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr2 = listener.local_addr()?;
    let (stop2, stopped2) = tokio::sync::oneshot::channel::<()>();
    let server2 = tokio::spawn(
        Server::builder()
            .layer(limit)
            .add_service(health)
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped2.await;
            }),
    );
    let channel = Endpoint::from_shared(format!("http://{addr2}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for i in 1..=4 {
        match client.check(check("no.such.Service")).await {
            Ok(response) => println!("unknown {i}: {:?}", response.into_inner().status()),
            Err(status) => println!("unknown {i}: {}", describe(&status)),
        }
    }
    println!("breaker: {:?}", breaker_stats.breakers(&()));

    let total = stats.total();
    println!(
        "quota layer: {} passed, {} refused; breaker layer: {} exceptions",
        total.pass,
        total.block,
        breaker_stats.total().exception
    );

    let _ = stop.send(());
    let _ = stop2.send(());
    server.await??;
    server2.await??;
    Ok(())
}
