//! The no-op layer both paired benches measure against: a service that only
//! forwards, the least any `Router::layer` costs. Shared by the criterion
//! benches and `perf/load/paired-base` (which includes this file by path).

use std::task::{Context, Poll};

use tower::{Layer, Service};

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
