//! Helpers shared by the layer's integration tests.
//!
//! Each test file includes this module with `mod support;` and uses only
//! part of it, hence the `dead_code` allowance.

#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::ServiceExt;
use tower_sliding_window::clock::{Clock, ManualClock};

/// Start of the manual clock in most tests: 50 ms into a 100 ms bucket, so
/// the first passes sit in the bucket that starts at 10 000 ms and leave the
/// default 1 s window at exactly 11 000 ms.
pub const START_MS: u64 = 10_050;

/// A manual clock at [`START_MS`].
pub fn clock() -> ManualClock {
    ManualClock::new(START_MS)
}

/// `GET uri` with an empty body.
pub fn req(uri: &str) -> Request<Body> {
    Request::get(uri)
        .body(Body::empty())
        .expect("valid request")
}

/// `GET uri` with one extra header.
pub fn req_with(uri: &str, name: &str, value: &str) -> Request<Body> {
    Request::get(uri)
        .header(name, value)
        .body(Body::empty())
        .expect("valid request")
}

/// A response with its body read to the end.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    /// The value of header `name` as text; panics with the headers if absent.
    pub fn header(&self, name: &str) -> &str {
        match self.headers.get(name) {
            Some(value) => value.to_str().expect("ASCII header value"),
            None => panic!("no `{name}` header in {:?}", self.headers),
        }
    }

    /// `Retry-After` as a number of seconds.
    pub fn retry_after(&self) -> u64 {
        self.header("retry-after")
            .parse()
            .expect("Retry-After in whole seconds")
    }
}

/// Reads a response to the end.
pub async fn read<B>(response: Response<B>) -> Answer
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.expect("readable body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(bytes.to_vec()).expect("UTF-8 body"),
    }
}

/// Sends one request through a clone of `app` and reads the answer.
pub async fn send<S, B>(app: &S, request: Request<Body>) -> Answer
where
    S: tower::Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let response = app.clone().oneshot(request).await.expect("infallible");
    read(response).await
}

/// Sends `n` requests for `uri` and returns their statuses, in order.
pub async fn statuses<S, B>(app: &S, uri: &str, n: usize) -> Vec<StatusCode>
where
    S: tower::Service<Request<Body>, Response = Response<B>, Error = Infallible> + Clone,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(send(app, req(uri)).await.status);
    }
    out
}

/// `n` times `200 OK` then `m` times `429`: what a limit of `n` gives
/// `n + m` requests in one window.
pub fn ok_then_429(n: usize, m: usize) -> Vec<StatusCode> {
    let mut out = vec![StatusCode::OK; n];
    out.extend(std::iter::repeat_n(StatusCode::TOO_MANY_REQUESTS, m));
    out
}

/// Asserts that `ok + refused` requests for `uri`, one after another,
/// are answered `ok` times 200 then `refused` times 429; the message names
/// the path and the clock's time. A macro, so that a failure points at the
/// test's line.
#[allow(unused_macros)]
macro_rules! assert_statuses {
    ($app:expr, $uri:expr, $ok:expr, $refused:expr, $clock:expr) => {
        assert_eq!(
            $crate::support::statuses($app, $uri, $ok + $refused).await,
            $crate::support::ok_then_429($ok, $refused),
            "{} {}",
            $uri,
            $crate::support::at($clock)
        )
    };
}
#[allow(unused_imports)]
pub(crate) use assert_statuses;

/// The clock's time, for assertion messages.
pub fn at(clock: &ManualClock) -> String {
    format!("at t={} ms", clock.now_millis())
}

/// Shorthand for milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A `tracing` subscriber that keeps every event as one line of text:
/// the level, then `name=value` for each field.
#[derive(Clone, Default)]
pub struct Capture(pub Arc<Mutex<Vec<String>>>);

struct Fields<'a>(&'a mut String);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Fields(&mut line));
        self.0.lock().expect("not poisoned").push(line);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A hyper 1 HTTP/1.1 client on one TCP connection.
pub type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Opens a connection to `addr` and hands its driver to a task.
pub async fn connect(addr: SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

/// Sends `GET path` on an open connection and reads the whole response.
pub async fn fetch(sender: &mut Sender, addr: SocketAddr, path: &str) -> Answer {
    sender.ready().await.expect("connection ready");
    let request = Request::get(path)
        .header(header::HOST, addr.to_string())
        .body(Empty::new())
        .expect("request");
    read(sender.send_request(request).await.expect("response")).await
}
