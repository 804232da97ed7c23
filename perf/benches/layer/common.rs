//! What both paired benches share: the no-op layer they measure against (a
//! service that only forwards, the least any `Router::layer` costs) and one
//! request served to the end of its body. Used by the criterion benches and
//! by `perf/load/paired-base` (which includes this file by path).

use std::convert::Infallible;
use std::hint::black_box;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use tower::{Layer, Service, ServiceExt};

/// `request` through `app`, its body read to the end; the status.
#[inline]
pub async fn serve(app: &mut Router, request: Request<Body>) -> StatusCode {
    let ready = ServiceExt::<Request<Body>>::ready(app)
        .await
        .unwrap_or_else(|never: Infallible| match never {});
    let response = ready
        .call(request)
        .await
        .unwrap_or_else(|never| match never {});
    let status = response.status();
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        black_box(frame.expect("the handler's body cannot fail"));
    }
    status
}

/// A layer that wraps each route in a service that only forwards: the least
/// any `Router::layer` costs.
#[derive(Debug, Clone, Copy)]
pub struct NoopLayer;

impl<S> Layer<S> for NoopLayer {
    type Service = Forward<S>;

    fn layer(&self, inner: S) -> Forward<S> {
        Forward(inner)
    }
}

/// The service of [`NoopLayer`].
#[derive(Debug, Clone)]
pub struct Forward<S>(S);

impl<S: Service<R>, R> Service<R> for Forward<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.0.call(request)
    }
}
