//! The request path with flow behaviours configured (crate docs, "Flow
//! behaviours"). A limiter with none of them never comes here: `call`
//! checks one configuration value and keeps its own path.

use std::fmt;
use std::sync::Arc;

use http::{Request, Response};
use tower_http::classify::{ClassifyResponse, MakeClassifier};
use tower_service::Service;

use super::SlidingWindow;
use crate::clock::Clock;
use crate::flow::{self, Admission};
use crate::key::KeyExtractor;
use crate::layer::body::BodyKind;
use crate::layer::future::{Completion, ResponseFuture};
use crate::layer::in_flight::InFlight;
use crate::response::rejection_response;
use crate::store::Entry;

impl<S, X, M, R> SlidingWindow<S, X, M, R>
where
    X: KeyExtractor,
    M: MakeClassifier,
{
    /// `call` for a limiter with flow behaviours, in this order: take a
    /// place in the key's concurrency gauge (if limited), then the window's
    /// admission; a refusal at any step undoes the steps before it and
    /// counts one block.
    pub(super) fn call_controlled<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        key: X::Key,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        S::Error: fmt::Display + 'static,
        R: BodyKind<ResBody, <M::Classifier as ClassifyResponse>::ClassifyEos>,
    {
        let registry = Arc::clone(&self.registry);
        let behaviours = registry.window().behaviours;
        let clock = registry.clock();
        let now = clock.now_millis();
        let entry = registry.entry(key, now);
        let limit = entry.limit();

        // 1. Concurrency: a place is reserved before the window is asked, so
        //    a request refused here has recorded no pass. From here on the
        //    guard's drop gives the place back on every path.
        let in_flight = match behaviours.max_concurrency {
            Some(max) => match InFlight::try_start(Arc::clone(&entry), clock.now_micros(), max) {
                Some(in_flight) => Some(in_flight),
                None => {
                    entry.node.record_block_at(now, 1);
                    let window_pass = entry.node.window_counts(now).pass;
                    tracing::debug!(
                        max_concurrency = max.get(),
                        "request rejected: too many in flight for its key"
                    );
                    return self.refuse(
                        &entry,
                        limit,
                        window_pass,
                        flow::concurrency::RETRY_AFTER_MS,
                    );
                }
            },
            None => None,
        };

        // 2. The window.
        match flow::admit(&entry.node, now, 1, limit) {
            Admission::Pass { window_pass } => {
                let in_flight = in_flight
                    .unwrap_or_else(|| InFlight::start(Arc::clone(&entry), clock.now_micros()));
                self.forward(request, &entry, now, limit, window_pass, in_flight)
            }
            Admission::Block { window_pass } => {
                // Gives the concurrency place back, if one was taken.
                drop(in_flight);
                let retry_after_ms = flow::retry_after_ms(&entry.node, now, 1, limit)
                    .unwrap_or(registry.window().interval_ms);
                tracing::debug!(
                    limit,
                    retry_after_ms,
                    "request rejected by the sliding-window limit"
                );
                self.refuse(&entry, limit, window_pass, retry_after_ms)
            }
        }
    }

    /// Calls the inner service for an admitted request, as `call` does.
    fn forward<ReqBody, ResBody>(
        &mut self,
        request: Request<ReqBody>,
        entry: &Entry,
        now: u64,
        limit: u64,
        window_pass: u64,
        mut in_flight: InFlight,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        let response = &*self.response;
        let quota = response.headers_on_pass.then(|| {
            let reset = flow::retry_after_ms(
                &entry.node,
                now,
                limit.saturating_sub(window_pass).saturating_add(1),
                limit,
            )
            .unwrap_or(0);
            Box::new(self.quota(entry, limit, window_pass, reset))
        });
        let legacy_headers = response.legacy_headers;
        let classifier = self.make_classifier.make_classifier(&request);
        in_flight.enter_user_code();
        let future = self.inner.call(request);
        in_flight.leave_user_code();
        ResponseFuture::passed(
            future,
            Completion {
                in_flight,
                classifier,
                quota,
                legacy_headers,
            },
        )
    }

    /// The rejection response (the block is already recorded).
    fn refuse<F>(
        &self,
        entry: &Entry,
        limit: u64,
        window_pass: u64,
        retry_after_ms: u64,
    ) -> ResponseFuture<F, M::Classifier, R> {
        let quota = self.quota(entry, limit, window_pass, retry_after_ms);
        ResponseFuture::blocked(rejection_response(&self.response, &quota, retry_after_ms))
    }
}
