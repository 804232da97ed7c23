//! `SlidingWindow`: the service that decides, per request, pass or block.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_http::classify::{
    ClassifyResponse, MakeClassifier, ServerErrorsAsFailures, SharedClassifier,
};
use tower_service::Service;

use super::body::{BodyKind, InnerBody};
use super::future::{Completion, ResponseFuture};
use super::in_flight::InFlight;
use crate::clock::Clock;
use crate::flow::{self, Admission};
use crate::handle::StatsHandle;
use crate::key::{GlobalKey, KeyExtractor};
use crate::response::{rejection_response, PolicyName, Quota, ResponseConfig};
use crate::store::{Entry, Registry, Store};

mod controlled;

/// Limits requests per key with a sliding window; made by
/// [`SlidingWindowLayer`](crate::SlidingWindowLayer).
///
/// Cloning it shares the limiter state: every clone counts against the same
/// windows.
pub struct SlidingWindow<
    S,
    X: KeyExtractor = GlobalKey,
    M = SharedClassifier<ServerErrorsAsFailures>,
    R = InnerBody,
> {
    inner: S,
    extractor: X,
    make_classifier: M,
    response: Arc<ResponseConfig>,
    /// The key table, resolved from `store` when the service was made, so
    /// that requests reach it without going through the store.
    registry: Arc<Registry<X::Key>>,
    store: Arc<Store<X::Key>>,
    body: PhantomData<fn() -> R>,
}

impl<S, X: KeyExtractor, M, R> SlidingWindow<S, X, M, R> {
    pub(crate) fn from_parts(
        inner: S,
        extractor: X,
        make_classifier: M,
        response: Arc<ResponseConfig>,
        store: Arc<Store<X::Key>>,
    ) -> Self {
        SlidingWindow {
            inner,
            extractor,
            make_classifier,
            response,
            registry: Arc::clone(store.registry()),
            store,
            body: PhantomData,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Consumes the limiter, returning the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// A handle on the live statistics and limits.
    pub fn handle(&self) -> StatsHandle<X::Key> {
        StatsHandle::new(Arc::clone(&self.store))
    }

    /// The RateLimit fields for `entry` after a decision at `now`.
    fn quota(&self, entry: &Entry, limit: u64, window_pass: u64, reset_ms: u64) -> Quota {
        Quota {
            policy: PolicyName {
                base: Arc::clone(&self.response.policy_name),
                tag: entry.policy_tag(),
            },
            limit,
            window_ms: self.registry.window().interval_ms,
            remaining: limit.saturating_sub(window_pass),
            reset_ms,
        }
    }
}

impl<S, X, M, R, ReqBody, ResBody> Service<Request<ReqBody>> for SlidingWindow<S, X, M, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: fmt::Display + 'static,
    X: KeyExtractor,
    M: MakeClassifier,
    R: BodyKind<ResBody, <M::Classifier as ClassifyResponse>::ClassifyEos>,
{
    type Response = Response<R::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, M::Classifier, R>;

    /// Forwards to the inner service. The limit is enforced in `call`, which
    /// answers rejected requests itself; nothing is reserved here (see
    /// "Differences from `tower::limit::RateLimit`" in the crate docs).
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // Split and reassemble: both move, nothing is cloned.
        let (parts, body) = request.into_parts();
        let key = self.extractor.extract(&parts);
        let request = Request::from_parts(parts, body);

        // Flow behaviours (strict aside, which lives in the window) take
        // their own path; a plain limiter pays one predictable check of a
        // configuration value for them.
        if !self.registry.window().behaviours.is_plain() {
            return self.call_controlled(request, key);
        }

        let registry = &self.registry;
        let clock = registry.clock();
        let now = clock.now_millis();
        let entry = registry.entry(key, now);
        let limit = entry.limit();
        let response = &*self.response;

        match flow::admit(&entry.node, now, 1, limit) {
            Admission::Pass { window_pass } => {
                let quota = response.headers_on_pass.then(|| {
                    let reset = flow::retry_after_ms(
                        &entry.node,
                        now,
                        limit.saturating_sub(window_pass).saturating_add(1),
                        limit,
                    )
                    .unwrap_or(0);
                    Box::new(self.quota(&entry, limit, window_pass, reset))
                });
                let legacy_headers = response.legacy_headers;
                let classifier = self.make_classifier.make_classifier(&request);
                let mut in_flight = InFlight::start(entry, clock.now_micros());
                // A panic in the inner `call` itself unwinds through here and
                // drops the guard while it is marked as in user code.
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
            Admission::Block { window_pass } => {
                let retry_after_ms = flow::retry_after_ms(&entry.node, now, 1, limit)
                    .unwrap_or(registry.window().interval_ms);
                let quota = self.quota(&entry, limit, window_pass, retry_after_ms);
                tracing::debug!(
                    policy = %quota.policy,
                    limit,
                    retry_after_ms,
                    "request rejected by the sliding-window limit"
                );
                ResponseFuture::blocked(rejection_response(response, &quota, retry_after_ms))
            }
        }
    }
}

impl<S: Clone, X: KeyExtractor, M: Clone, R> Clone for SlidingWindow<S, X, M, R> {
    fn clone(&self) -> Self {
        SlidingWindow {
            inner: self.inner.clone(),
            extractor: self.extractor.clone(),
            make_classifier: self.make_classifier.clone(),
            response: Arc::clone(&self.response),
            registry: Arc::clone(&self.registry),
            store: Arc::clone(&self.store),
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, X: KeyExtractor + fmt::Debug, M, R> fmt::Debug for SlidingWindow<S, X, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindow")
            .field("inner", &self.inner)
            .field("key", &self.extractor)
            .field("state", &self.store)
            .finish_non_exhaustive()
    }
}
