//! `SlidingWindow`: the service that decides, per request, pass or block.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
#[cfg(feature = "tokio")]
use std::time::Duration;

use http::{Request, Response};
use tower_http::classify::{
    ClassifyResponse, MakeClassifier, ServerErrorsAsFailures, SharedClassifier,
};
use tower_service::Service;

use super::body::{BodyKind, InnerBody};
#[cfg(feature = "tokio")]
use super::future::Deferred;
use super::future::{Completion, ResponseFuture};
use super::in_flight::InFlight;
use super::priority::Priority;
use super::quota::quota;
#[cfg(feature = "redis")]
use super::remote;
#[cfg(feature = "tokio")]
use super::wait::{self, Gate, Waiter};
#[cfg(feature = "tokio")]
use crate::clock::Clock;
use crate::flow::warm_up::Curve;
use crate::flow::{self, Admission, WarmUpSettings};
#[cfg(feature = "tokio")]
use crate::flow::{Pacer, Turn};
use crate::handle::StatsHandle;
use crate::key::{GlobalKey, KeyExtractor};
use crate::response::{rejection_response, Quota, ResponseConfig};
#[cfg(feature = "redis")]
use crate::store::redis::RemoteWindow;
#[cfg(feature = "redis")]
use crate::store::RemoteLookup;
use crate::store::{effective_now, Entry, Lookup, Registry, RemoteSlot, Store, Window};

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
    /// Which requests may borrow quota (`prioritized`).
    priority: Option<Priority>,
    /// The shared store, if any (feature `redis`).
    remote: RemoteSlot<X::Key>,
    body: PhantomData<fn() -> R>,
}

impl<S> SlidingWindow<S> {
    /// Limits `inner` to `limit` requests per second for one global key:
    /// the same as `SlidingWindowLayer::qps(limit).layer(inner)`. Configure
    /// anything else on the [`SlidingWindowLayer`](crate::SlidingWindowLayer).
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tower_sliding_window::SlidingWindow;
    ///
    /// let service = SlidingWindow::new(
    ///     tower::service_fn(|_: Request<String>| async {
    ///         Ok::<_, Infallible>(Response::new(String::from("hello")))
    ///     }),
    ///     100,
    /// );
    /// let stats = service.handle();
    /// # let _ = stats;
    /// ```
    pub fn new(inner: S, limit: u64) -> Self {
        use tower_layer::Layer as _;
        crate::SlidingWindowLayer::qps(limit).layer(inner)
    }
}

// In an impl of its own, for a fixed inner type, so that
// `SlidingWindow::layer(..)` needs no inner type named.
impl SlidingWindow<()> {
    /// The layer that makes this service:
    /// [`SlidingWindowLayer::qps(limit)`](crate::SlidingWindowLayer::qps).
    ///
    /// ```
    /// use tower::ServiceBuilder;
    /// use tower_sliding_window::SlidingWindow;
    ///
    /// let builder = ServiceBuilder::new().layer(SlidingWindow::layer(100));
    /// # let _ = builder;
    /// ```
    pub fn layer(limit: u64) -> crate::SlidingWindowLayer {
        crate::SlidingWindowLayer::qps(limit)
    }
}

impl<S, X: KeyExtractor, M, R> SlidingWindow<S, X, M, R> {
    pub(crate) fn from_parts(
        inner: S,
        extractor: X,
        make_classifier: M,
        response: Arc<ResponseConfig>,
        store: Arc<Store<X::Key>>,
        priority: Option<Priority>,
        #[allow(unused_mut)] mut remote: RemoteSlot<X::Key>,
    ) -> Self {
        let registry = Arc::clone(store.registry());
        // The store decides on this layer's window, as it is once built.
        #[cfg(feature = "redis")]
        if let Some(remote) = &mut remote.remote {
            let window = registry.window();
            remote.store = remote.store.clone().with_window(RemoteWindow {
                sample_count: window.sample_count,
                interval_ms: window.interval_ms,
                strict: window.strict,
            });
        }
        SlidingWindow {
            inner,
            extractor,
            make_classifier,
            response,
            registry,
            store,
            priority,
            remote,
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
        StatsHandle::new(Arc::clone(&self.store)).with_remote(self.remote.clone())
    }
}

impl<S, X, M, R, ReqBody, ResBody> Service<Request<ReqBody>> for SlidingWindow<S, X, M, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Error: fmt::Display + 'static,
    ReqBody: Send + 'static,
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
        // With a shared store, the same visit gives the key's identity in
        // the store.
        #[cfg(feature = "redis")]
        let (entry, remote_id) = match &self.remote.remote {
            None => (self.extractor.visit(&parts, Lookup { registry, now }), None),
            Some(remote) => {
                let lookup = RemoteLookup {
                    lookup: Lookup { registry, now },
                    identity: remote.identity_fn(),
                };
                let (entry, id) = self.extractor.visit(&parts, lookup);
                (entry, Some(id))
            }
        };
        #[cfg(not(feature = "redis"))]
        let entry = self.extractor.visit(&parts, Lookup { registry, now });
        let request = Request::from_parts(parts, body);
        let limit = entry.limit();

        // A reading behind the key's newest bucket (a clock that stepped
        // back, a thread that read it before another opened that bucket) is
        // moved forward to it, as admission itself does; the decision, the
        // block it records and the counts in the headers are all at that
        // time. A wait computed there is `behind` longer on the clock (0
        // once the key runs on a skew after a step back beyond a window).
        let at = effective_now(&entry, now);
        let behind = entry.node.lag(now, at);

        // Circuit breakers, concurrency and warm-up first, when configured
        // or, for breakers, when one is not closed (a plain limiter, or one
        // whose breakers are all closed, pays one predictable check of three
        // values): see `prelude`.
        let behaviours = &window.behaviours;
        let (reserved, limit) = if behaviours.max_concurrency.is_none()
            && behaviours.warm_up.is_none()
            && entry.breakers.none_open()
        {
            (None, limit)
        } else {
            match self.prelude(&entry, at, started_us, limit) {
                Ok(go) => go,
                Err(refused) => return refused,
            }
        };

        // With a shared store, Redis decides (see `super::remote`).
        #[cfg(feature = "redis")]
        if let Some(id) = remote_id {
            return self.remote_admit(request, entry, reserved, id, at, limit);
        }

        #[cfg(feature = "tokio")]
        if let Some(max_wait) = behaviours.throttle {
            return self.throttled(request, entry, reserved, (at, started_us), limit, max_wait);
        }

        match flow::try_admit(&entry.node, at, 1, limit) {
            Admission::Pass { window_pass } => {
                if behaviours.warm_up.is_some() {
                    record_warm_up_pass(&entry, window, at);
                }
                let quota = self.response.headers_on_pass.then(|| {
                    let more = limit.saturating_sub(window_pass).saturating_add(1);
                    let reset = retry_after(&entry, at, behind, more, limit).unwrap_or(0);
                    Box::new(quota(&entry, &self.response, limit, window_pass, reset))
                });
                let in_flight = match reserved {
                    Some(in_flight) => in_flight,
                    None => InFlight::start(entry, started_us),
                };
                self.forward(request, in_flight, quota)
            }
            Admission::Block { window_pass } => {
                self.blocked(request, entry, reserved, (at, behind), limit, window_pass)
            }
        }
    }
}

/// Milliseconds until `n` more passes fit under `limit` on `entry` at `at`,
/// on the clock: a wait computed at a reading moved forward by `behind` is
/// that much longer (see `effective_now`).
fn retry_after(entry: &Entry, at: u64, behind: u64, n: u64, limit: u64) -> Option<u64> {
    flow::retry_after_ms(&entry.node, at, n, limit).map(|ms| {
        if ms == 0 {
            0
        } else {
            ms.saturating_add(behind)
        }
    })
}

/// Counts a pass towards `entry`'s warm-up.
#[inline(never)]
fn record_warm_up_pass(entry: &Entry, window: &Window, at: u64) {
    if let (Some(settings), Some(state)) = (window.behaviours.warm_up, entry.warm_up()) {
        let curve = warm_up_curve(settings, entry.limit(), window.interval_ms);
        state.record_pass(at, window.interval_ms, &curve);
    }
}

/// A request that may go on to the window: its concurrency place, if one
/// was taken, and the limit to admit it against.
type Go = (Option<InFlight>, u64);

/// # The paths a plain limiter does not take
impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// What comes before the window, in order: the circuit breakers (no
    /// request bypasses them), a concurrency place (reserved before the
    /// window is asked, so a request refused here records no pass; from
    /// here on the guard's drop gives it back on every path), and the warmed
    /// limit (warm-up moves the limit, never the admission step). Returns
    /// the place, if one was taken, and the limit, or the refusal.
    #[inline(never)]
    fn prelude<F>(
        &self,
        entry: &Arc<Entry>,
        at: u64,
        started_us: u64,
        limit: u64,
    ) -> Result<Go, ResponseFuture<F, M::Classifier, R>> {
        let window = self.registry.window();
        // A probe slot taken here is freed at once if a rule below refuses
        // the request (the guard is dropped), or when it is cancelled.
        let probe = match entry.enter_breakers(at) {
            Ok(probe) => probe,
            Err(half_open_in_ms) => return Err(self.cut_off(entry, at, half_open_in_ms)),
        };
        let reserved = match window.behaviours.max_concurrency {
            None => None,
            Some(max) => match InFlight::try_start(Arc::clone(entry), started_us, max) {
                Some(in_flight) => Some(in_flight),
                None => {
                    entry.node.record_block_at(at, 1);
                    let window_pass = entry.node.window_counts(at).pass;
                    return Err(self.refuse(
                        entry,
                        limit,
                        window_pass,
                        flow::concurrency::RETRY_AFTER_MS,
                        "request rejected: too many in flight for its key",
                    ));
                }
            },
        };
        let limit = match (window.behaviours.warm_up, entry.warm_up()) {
            (Some(settings), Some(state)) => {
                let curve = warm_up_curve(settings, limit, window.interval_ms);
                state.limit_at(at, window.interval_ms, &curve)
            }
            _ => limit,
        };
        // A probe keeps its slot through everything after, a wait
        // included: it rides on the in-flight guard (taken now if no
        // concurrency place was), whose drop frees the slot if the request
        // is refused or dropped before it completes.
        let reserved = match probe {
            None => reserved,
            Some(probe) => {
                let mut in_flight =
                    reserved.unwrap_or_else(|| InFlight::start(Arc::clone(entry), started_us));
                in_flight.hold_probe(Some(probe));
                Some(in_flight)
            }
        };
        Ok((reserved, limit))
    }

    /// A request the window refused: a prioritized one may wait for quota
    /// borrowed from a later bucket; any other is answered with the
    /// rejection.
    #[inline(never)]
    fn blocked<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        reserved: Option<InFlight>,
        (at, behind): (u64, u64),
        limit: u64,
        window_pass: u64,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>> + Clone + Send + 'static,
        ReqBody: Send + 'static,
    {
        #[cfg(feature = "tokio")]
        let request = match self.borrow_for_priority(request, &entry, at, limit) {
            (request, Some(gate)) => return self.defer(request, entry, reserved, gate),
            (request, None) => request,
        };
        drop(request);
        entry.node.record_block_at(at, 1);
        // Gives the concurrency place back, if one was taken.
        drop(reserved);
        let retry_after_ms =
            retry_after(&entry, at, behind, 1, limit).unwrap_or(self.registry.window().interval_ms);
        self.refuse(
            &entry,
            limit,
            window_pass,
            retry_after_ms,
            "request rejected by the sliding-window limit",
        )
    }
}

/// The warm-up curve of a key whose limit is `limit` per `interval_ms`.
fn warm_up_curve(settings: WarmUpSettings, limit: u64, interval_ms: u64) -> Curve {
    let period_windows = settings.period_ms as f64 / interval_ms as f64;
    Curve::new(limit, period_windows, settings.cold_factor)
}

/// # Waiting: pacing and borrowed quota
#[cfg(feature = "tokio")]
impl<S: Clone + Send + 'static, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// Under `throttle`: takes the key's next turn, then passes at once
    /// (turn now), waits for it (turn within `max_wait`), or refuses.
    fn throttled<ReqBody: Send + 'static>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        reserved: Option<InFlight>,
        (at, now_us): (u64, u64),
        limit: u64,
        max_wait: Duration,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>>,
    {
        let window = self.registry.window();
        let refused = |this: &Self, entry: &Entry, retry_after_ms: u64, why: &'static str| {
            entry.node.record_block_at(at, 1);
            let window_pass = entry.node.window_counts(at).pass;
            this.refuse(entry, limit, window_pass, retry_after_ms, why)
        };
        let Some(cost_ns) = Pacer::cost_ns(window.interval_ms, limit) else {
            return refused(
                self,
                &entry,
                window.interval_ms,
                "request rejected: its key's limit is 0",
            );
        };
        // Outside a tokio runtime nothing can wait: only a turn due now.
        // Inside one, a turn is taken only if it is `TIMER_TICK` inside
        // `max_wait`: tokio's timer fires on millisecond ticks, so the wait,
        // timer included, stays within `max_wait` while the runtime keeps
        // up.
        let max_wait = if wait::can_wait() {
            max_wait.saturating_sub(wait::TIMER_TICK)
        } else {
            Duration::ZERO
        };
        // Every entry of a throttled layer has a pacer; without one nothing
        // could be paced, and the request is refused for a window.
        let turn = entry.pacer().map_or(
            Turn::Refuse {
                retry_after: Duration::from_millis(window.interval_ms),
            },
            |pacer| pacer.reserve(now_us.saturating_mul(1_000), cost_ns, max_wait),
        );
        match turn {
            Turn::Wait { wait, at_ns } if wait.is_zero() => {
                if let Some(pacer) = entry.pacer() {
                    pacer.used(at_ns);
                }
                record_paced_pass(&entry, at, window);
                let quota = self.response.headers_on_pass.then(|| {
                    let window_pass = entry.node.window_counts(at).pass;
                    Box::new(quota(
                        &entry,
                        &self.response,
                        limit,
                        window_pass,
                        cost_ns.div_ceil(1_000_000),
                    ))
                });
                let in_flight = match reserved {
                    Some(in_flight) => in_flight,
                    None => InFlight::start(entry, now_us),
                };
                self.forward(request, in_flight, quota)
            }
            Turn::Wait { wait, at_ns } => {
                let waiter = Waiter::new(Arc::clone(&entry), Some((at_ns, cost_ns)));
                let Some(timer) = wait::timer(wait) else {
                    // Gives the turn back, then refuses.
                    drop(waiter);
                    drop(reserved);
                    return refused(
                        self,
                        &entry,
                        u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
                        "request rejected: its turn is later and this runtime cannot wait",
                    );
                };
                let window = *window;
                let gate = wait::after(timer, waiter, move |entry| {
                    let now = effective_now(entry, entry.node.clock().now_millis());
                    record_paced_pass(entry, now, &window);
                });
                self.defer(request, entry, reserved, gate)
            }
            Turn::Refuse { retry_after } => {
                drop(reserved);
                let retry_after_ms = u64::try_from(retry_after.as_nanos().div_ceil(1_000_000))
                    .unwrap_or(u64::MAX)
                    .max(1);
                refused(
                    self,
                    &entry,
                    retry_after_ms,
                    "request rejected: its turn is further away than the throttle's max wait",
                )
            }
        }
    }

    /// With a shared store: refuses a key the store knows to be blocked at
    /// once, else waits at a gate for the store's verdict (or the failure
    /// policy's).
    #[cfg(feature = "redis")]
    fn remote_admit<ReqBody: Send + 'static>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        reserved: Option<InFlight>,
        id: crate::store::redis::KeyId,
        at: u64,
        limit: u64,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>>,
    {
        let Some(remote) = &self.remote.remote else {
            unreachable!("called only with a store");
        };
        let store = remote.store.clone();
        if let Some(verdict) = store.known_blocked(id, 1) {
            drop(request);
            entry.node.record_block_at(at, 1);
            drop(reserved);
            let retry_after_ms = verdict
                .retry_after
                .map_or(1, |wait| {
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
                })
                .max(1);
            return self.refuse(
                &entry,
                verdict.limit,
                verdict.window_pass,
                retry_after_ms,
                "request rejected: its key is blocked in the shared store",
            );
        }
        let interval_ms = self.registry.window().interval_ms;
        let gate = remote::gate(
            store,
            self.remote.policy,
            Arc::clone(&entry),
            id,
            limit,
            interval_ms,
        );
        self.defer(request, entry, reserved, gate)
    }

    /// Under `prioritized`, for a request the window refused: borrows a
    /// pass from a later bucket (Sentinel's occupy) if the request is
    /// prioritized and one fits within the occupy timeout, and returns the
    /// gate that waits for it (`None`: refuse it). The request is handed
    /// back either way.
    fn borrow_for_priority<ReqBody>(
        &self,
        request: Request<ReqBody>,
        entry: &Arc<Entry>,
        at: u64,
        limit: u64,
    ) -> (Request<ReqBody>, Option<Gate>) {
        let Some(priority) = &self.priority else {
            return (request, None);
        };
        if !wait::can_wait() {
            return (request, None);
        }
        let (parts, body) = request.into_parts();
        let prioritized = priority(&parts);
        let request = Request::from_parts(parts, body);
        if !prioritized {
            return (request, None);
        }
        // `try_occupy_next` takes its threshold per second.
        let interval_ms = self.registry.window().interval_ms;
        let per_second = limit as f64 * 1000.0 / interval_ms as f64;
        let Some(wait_ms) = entry.node.try_occupy_next(at, 1, per_second) else {
            return (request, None);
        };
        let Some(timer) = wait::timer(Duration::from_millis(wait_ms)) else {
            return (request, None);
        };
        entry
            .node
            .add_waiting_request(at.saturating_add(wait_ms), 1);
        entry.node.add_occupied_pass(1);
        let waiter = Waiter::new(Arc::clone(entry), None);
        // The pass is already in the bucket it borrowed from.
        let gate = wait::after(timer, waiter, |_| {});
        (request, Some(gate))
    }

    /// The response future of a request that waits at `gate` before it
    /// reaches the inner service. The inner service is called after the
    /// wait, on the ready instance `poll_ready` prepared (a clone takes its
    /// place here, as `tower`'s own waiting middleware do).
    fn defer<ReqBody: Send + 'static>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        reserved: Option<InFlight>,
        gate: Gate,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>>,
    {
        let classifier = self.make_classifier.make_classifier(&request);
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(
            gate,
            Deferred {
                call: Box::new(move || ready.call(request)),
                entry,
                reserved,
                classifier,
                response: Arc::clone(&self.response),
            },
        )
    }
}

/// Records a pass that pacing let through at `now`: the window counts it
/// without a limit check (the pacer is the limit), and warm-up sees it.
#[cfg(feature = "tokio")]
fn record_paced_pass(entry: &Entry, now: u64, window: &Window) {
    let _ = entry.node.try_add_pass_at(now, 1, |_| true);
    if window.behaviours.warm_up.is_some() {
        record_warm_up_pass(entry, window, now);
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
        let quota = quota(entry, &self.response, limit, window_pass, retry_after_ms);
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
            priority: self.priority.clone(),
            remote: self.remote.clone(),
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
