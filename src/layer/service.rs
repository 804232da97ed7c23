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
use crate::flow::{self, Admission};
use crate::handle::StatsHandle;
use crate::key::{GlobalKey, KeyExtractor};
use crate::response::{rejection_response, PolicyName, Quota, ResponseConfig};
use crate::store::{effective_now, Entry, Lookup, Registry, Store};

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
        let registry = &*self.registry;
        let window = registry.window();
        // One clock reading: the window's time and the start of the
        // response time.
        let (now, started_us) = registry.clock().now_both();
        // Split and reassemble: both move, nothing is cloned. The extractor
        // hands its key straight to the table (by reference where it can).
        let (parts, body) = request.into_parts();
        let entry = self.extractor.visit(&parts, Lookup { registry, now });
        let request = Request::from_parts(parts, body);
        let limit = entry.limit();

        // A reading behind the key's newest bucket (a clock that stepped
        // back, a thread that read it before another opened that bucket) is
        // moved forward to it, as admission itself does; the decision, the
        // block it records and the counts in the headers are all at that
        // time. A wait computed there is `behind` longer on the clock.
        let at = effective_now(&entry, now);
        let behind = at - now;
        let wait = |n: u64| {
            flow::retry_after_ms(&entry.node, at, n, limit).map(|ms| {
                if ms == 0 {
                    0
                } else {
                    ms.saturating_add(behind)
                }
            })
        };

        // Circuit breakers before every flow rule: no request bypasses
        // them. A probe slot taken here is freed at once if a flow rule
        // below refuses the request (the guard is dropped), or when the
        // request is cancelled.
        let probe = match entry.enter_breakers(at) {
            Ok(probe) => probe,
            Err(half_open_in_ms) => return self.cut_off(&entry, at, half_open_in_ms),
        };

        // Concurrency first, when limited (a plain limiter pays one
        // predictable check of a configuration value): a place is reserved
        // before the window is asked, so a request refused here records no
        // pass. From here on the guard's drop gives the place back on every
        // path.
        let reserved = match window.behaviours.max_concurrency {
            None => None,
            Some(max) => match InFlight::try_start(Arc::clone(&entry), started_us, max) {
                Some(in_flight) => Some(in_flight),
                None => {
                    entry.node.record_block_at(at, 1);
                    let window_pass = entry.node.window_counts(at).pass;
                    return self.refuse(
                        &entry,
                        limit,
                        window_pass,
                        flow::concurrency::RETRY_AFTER_MS,
                        "request rejected: too many in flight for its key",
                    );
                }
            },
        };

        match flow::admit(&entry.node, at, 1, limit) {
            Admission::Pass { window_pass } => {
                let quota = self.response.headers_on_pass.then(|| {
                    let reset =
                        wait(limit.saturating_sub(window_pass).saturating_add(1)).unwrap_or(0);
                    Box::new(self.quota(&entry, limit, window_pass, reset))
                });
                let mut in_flight = match reserved {
                    Some(in_flight) => in_flight,
                    None => InFlight::start(entry, started_us),
                };
                in_flight.hold_probe(probe);
                self.forward(request, in_flight, quota)
            }
            Admission::Block { window_pass } => {
                // Gives the concurrency place back, if one was taken.
                drop(reserved);
                let retry_after_ms = wait(1).unwrap_or(window.interval_ms);
                self.refuse(
                    &entry,
                    limit,
                    window_pass,
                    retry_after_ms,
                    "request rejected by the sliding-window limit",
                )
            }
        }
    }
}

impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// Calls the inner service for an admitted request, holding its place
    /// in flight until it completes.
    fn forward<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
        mut in_flight: InFlight,
        quota: Option<Box<Quota>>,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>>,
    {
        let classifier = self.make_classifier.make_classifier(&request);
        // A panic in the inner `call` itself unwinds through here and drops
        // the guard while it is marked as in user code.
        in_flight.enter_user_code();
        let future = self.inner.call(request);
        in_flight.leave_user_code();
        ResponseFuture::passed(
            future,
            Completion {
                in_flight,
                classifier,
                quota,
                legacy_headers: self.response.legacy_headers,
            },
        )
    }

    /// The rejection response (the block is already recorded), with a
    /// debug event that names the policy, never the key.
    fn refuse<F>(
        &self,
        entry: &Entry,
        limit: u64,
        window_pass: u64,
        retry_after_ms: u64,
        why: &'static str,
    ) -> ResponseFuture<F, M::Classifier, R> {
        let quota = self.quota(entry, limit, window_pass, retry_after_ms);
        tracing::debug!(policy = %quota.policy, limit, retry_after_ms, "{why}");
        ResponseFuture::blocked(rejection_response(&self.response, &quota, retry_after_ms))
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
