//! `SlidingWindow`: the service that dispatches each request on its key's
//! decisions.
//!
//! `call` asks the layer's system rule first, if it has one (one call,
//! before the key lookup; its refusal is answered once the key is known),
//! then finds the key and its entry, asks the controllers in order (the
//! circuit breakers, the concurrency gauge and warm-up, then one of the
//! shared store, pacing or the window), each of which answers with a
//! [`Decision`], and acts on the one decision that comes out: call the
//! inner service, wait at a gate, or answer the refusal (recorded and built
//! in one place, `quota::refuse`; under `prioritized` a window refusal may
//! become a wait for quota borrowed from a later bucket first). The policy
//! arithmetic lives in [`flow`](crate::flow); what stays here is the glue
//! to tower and tokio.
//!
//! The fast path (a plain limiter's pass) stays in `call`; the paths a
//! plain limiter does not take (`prelude`, `paced`, `defer`, `refused`)
//! are kept out of line, so that they do not weigh on it.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
#[cfg(feature = "tokio")]
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use tower_http::classify::{
    ClassifyResponse, MakeClassifier, ServerErrorsAsFailures, SharedClassifier,
};
use tower_service::Service;

use super::body::{BodyKind, InnerBody};
use super::future::{Completion, ResponseFuture};
#[cfg(feature = "tokio")]
use super::future::{Deferred, Resume};
use super::in_flight::InFlight;
use super::priority::Priority;
use super::quota::{quota, refuse, CompactCounted, CompactSeveral, Counted};
#[cfg(feature = "redis")]
use super::remote;
use super::wait::Gate;
#[cfg(feature = "tokio")]
use super::wait::{self, Waiter};
use crate::clock::{Clock, SharedClock};
#[cfg(feature = "tokio")]
use crate::flow::Reason;
use crate::flow::{self, Decision, Pass, Refusal};
use crate::handle::StatsHandle;
use crate::key::{visit_key, GlobalKey, KeyExtractor};
use crate::response::{Quota, ResponseConfig};
use crate::stat::{CompactShape, CompactWindow};
#[cfg(feature = "redis")]
use crate::store::redis::RemoteWindow;
#[cfg(feature = "redis")]
use crate::store::RemoteLookup;
use crate::store::{
    effective_now, CompactKeys, CompactLookup, Entry, Lookup, Place, RecordBlocked, Registry,
    RemoteSlot, Store, Totals, Window,
};
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
    /// Everything the clones of this service share, behind one reference
    /// count: a router clones the service for every request (axum's
    /// `Route` does), and each reference counted field would cost that
    /// clone, and its drop, an atomic read-modify-write.
    shared: Arc<Shared<X::Key>>,
    body: PhantomData<fn() -> R>,
}

/// The state every clone of one [`SlidingWindow`] shares.
///
/// `repr(C)`, the compact path's fields first: with the reference counts
/// before them they take the allocation's first 50 bytes, which a request
/// touches anyway (a router's clone of the service counts on them): one
/// cache line, or two where the allocator places the allocation across a
/// line's end. A compact request reads nothing else of the layer's own.
#[repr(C)]
struct Shared<K> {
    /// The compact table, when the layer is compact: `call` then takes the
    /// compact path (see `compact_decide`).
    compact: Option<Arc<CompactKeys<K>>>,
    /// The registry's clock, and `response`'s settings a compact request
    /// reads, copied here when the service is made (none of them changes
    /// afterwards): read from `registry` and `response`, they would be two
    /// more cache lines per request.
    clock: SharedClock,
    headers_on_pass: bool,
    legacy_headers: bool,
    response: Arc<ResponseConfig>,
    /// The key table, resolved from `store` when the service was made, so
    /// that requests reach it without going through the store.
    registry: Arc<Registry<K>>,
    store: Arc<Store<K>>,
    /// Which requests may borrow quota (`prioritized`). Without the
    /// `tokio` feature nothing waits, so nothing borrows and it is unread:
    /// such a request is refused as any other (as the crate docs say).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    priority: Option<Priority>,
    /// The shared store, if any (feature `redis`).
    remote: RemoteSlot<K>,
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
        let compact = store.compact().cloned();
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
            shared: Arc::new(Shared {
                compact,
                clock: registry.clock().clone(),
                headers_on_pass: response.headers_on_pass,
                legacy_headers: response.legacy_headers,
                response,
                registry,
                store,
                priority,
                remote,
            }),
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
        StatsHandle::new(Arc::clone(&self.shared.store)).with_remote(self.shared.remote.clone())
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

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // A compact layer's requests take their own path, decided once
        // here: a full layer pays one predictable branch for it.
        if let Some(keys) = &self.shared.compact {
            let now = self.shared.clock.now_millis();
            let lookup = CompactLookup {
                keys,
                now,
                decide: |place: Place<'_, CompactWindow>,
                         shape: &CompactShape,
                         key: Option<&X::Key>| {
                    self.compact_decide(keys, place, shape, key, now)
                },
                // What `compact_decide` answers a pass at once with when
                // there are no RateLimit fields to send.
                passed: (!self.shared.headers_on_pass).then_some(|totals: &Totals| {
                    totals.add_pass();
                    CompactOutcome::Pass(None)
                }),
            };
            let outcome = visit_key!(&self.extractor, request, lookup);
            return match outcome {
                // A compact key records nothing on completion: the inner
                // future is driven as it is, with no classifier and no
                // guard. A pass with no RateLimit fields (the default)
                // holds nothing across the inner call, so the inner future
                // is made in its place in ours (see `call_apart`).
                CompactOutcome::Pass(None) => {
                    let legacy_headers = self.shared.legacy_headers;
                    let future = call_apart(&mut self.inner, request);
                    ResponseFuture::forwarded(future, None, legacy_headers)
                }
                CompactOutcome::Pass(quota) => {
                    let legacy_headers = self.shared.legacy_headers;
                    ResponseFuture::forwarded(self.inner.call(request), quota, legacy_headers)
                }
                CompactOutcome::Refused(response, at) => {
                    self.compact_blocked(request, at);
                    ResponseFuture::blocked_boxed(response)
                }
            };
        }
        let registry = &*self.shared.registry;
        // One clock reading: the window's time and the start of the
        // response time.
        let (now, started_us) = registry.clock().now_both();
        // The layer's system rule, if any, before any rule of the key: its
        // refusal is answered once the key is known (a block of the key).
        let system = match registry.system() {
            None => Ok(()),
            Some(system) => system.check(),
        };

        // The key and its entry. The extractor hands its key straight to
        // the table (by reference where it can), reading it from the whole
        // request where it can (see `visit_key`); with a shared store, the
        // same visit gives the key's identity in the store.
        #[cfg(feature = "redis")]
        let (entry, remote_id): (_, RemoteId) = match &self.shared.remote.remote {
            None => {
                let entry = visit_key!(&self.extractor, request, Lookup { registry, now });
                (entry, None)
            }
            Some(remote) => {
                let lookup = RemoteLookup {
                    lookup: Lookup { registry, now },
                    identity: remote.identity_fn(),
                };
                let (entry, id) = visit_key!(&self.extractor, request, lookup);
                (entry, Some(id))
            }
        };
        #[cfg(not(feature = "redis"))]
        let (entry, remote_id): (_, RemoteId) = {
            let entry = visit_key!(&self.extractor, request, Lookup { registry, now });
            (entry, None)
        };
        // A reading behind the key's newest bucket (a clock that stepped
        // back, a thread that read it before another opened that bucket) is
        // moved forward to it, as admission itself does; the decision, the
        // block it records and the counts in the headers are all at that
        // time. A wait computed there is `behind` longer on the clock (0
        // once the key runs on a skew after a step back beyond a window).
        let at = effective_now(&entry, now);
        let times = Times {
            at,
            behind: entry.node.lag(now, at),
            started_us,
        };
        if let Err(refused) = system {
            let refusal = refused.refusal(entry.limit());
            return self.refused(request, entry, None, at, refusal);
        }

        // The decisions, in order: breakers, concurrency and warm-up, then
        // admission, which is asked only if the first ones passed. What
        // they took (a concurrency place, a probe slot) is held beside the
        // decision: it goes along with a pass or a wait, and is given back
        // on a block before the refusal is answered. The decisions never see
        // the request: under `prioritized` its head is read only once the
        // window has refused it (see `refused`).
        let (held, decision) = match self.before_window(&entry, times) {
            Decision::Pass((held, limit)) => (held, self.admit(&entry, remote_id, times, limit)),
            Decision::Block(refusal) => (None, Decision::Block(refusal)),
            Decision::Wait(never) => match never {},
        };
        match decision {
            Decision::Pass(pass) => {
                let quota = self
                    .shared
                    .headers_on_pass
                    .then(|| self.pass_quota(&entry, pass, times));
                let in_flight = match held {
                    Some(in_flight) => in_flight,
                    None => InFlight::start(entry, times.started_us),
                };
                self.forward(request, in_flight, quota)
            }
            Decision::Wait(gate) => self.defer(request, entry, held, gate),
            Decision::Block(refusal) => self.refused(request, entry, held, at, refusal),
        }
    }
}

/// `inner.call(request)`, kept out of its caller, so that the inner future
/// is written straight into the caller's response future.
///
/// An inner future can be large (axum's route future is 320 bytes), and
/// it is made in a place of its own and then copied into ours when either
/// holds: the inner `call`, inlined, still writes to its future after
/// making it (axum's marks it as not the top-level one), or the caller
/// holds something it must drop should the inner call unwind (a compact
/// pass's RateLimit fields). The compact pass without fields, the default,
/// calls through here and holds nothing: no copy (`perf/counts/layer.rs`
/// counts 53 instructions fewer per request behind axum with a header key,
/// 52 with the peer's address).
#[inline(never)]
fn call_apart<S: Service<Request>, Request>(inner: &mut S, request: Request) -> S::Future {
    inner.call(request)
}

/// What the compact path decided for a request: a pass (with its RateLimit
/// fields, when the layer sends them on passes), or the answer to its
/// refusal, already recorded as a block of its window at the time given.
enum CompactOutcome {
    Pass(Option<Box<Quota>>),
    // Boxed here rather than in the future: the outcome is handed back
    // through the table's lookup, and a pass moves two words, not a
    // response head.
    Refused(Box<Response<Bytes>>, u64),
}

/// # The compact path
impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// The decision on a request of a compact layer: the key's window
    /// admits it or not, under the lock of the key's group (so its slot is
    /// never reused meanwhile), and everything its answer needs is read
    /// there too. A compact layer has no breakers, concurrency, warm-up,
    /// pacing, borrowing or shared store (its builder refuses them), so the
    /// window is the only controller.
    #[inline(never)]
    fn compact_decide(
        &self,
        keys: &CompactKeys<X::Key>,
        place: Place<'_, CompactWindow>,
        shape: &CompactShape,
        key: Option<&X::Key>,
        now: u64,
    ) -> CompactOutcome {
        let registry = &*self.shared.registry;
        if place.overflow {
            registry.note_overflow(now);
        }
        if !place.further.is_empty() {
            return self.compact_several(keys, place, shape, key, now);
        }
        let window = place.value;
        if !self.shared.headers_on_pass && window.pass_now(shape, now, place.limit) {
            // A pass at once (`CompactWindow::admit`'s own first step) with
            // nothing to answer but the pass itself: what
            // `compact_answer` makes of it.
            place.totals.add_pass();
            return CompactOutcome::Pass(None);
        }
        // As for a full key (see `call`): a reading behind the key's
        // newest bucket is moved forward to it (`at`, `behind` later
        // than the clock).
        let (at, behind, decision) = window.admit(shape, now, place.limit, place.overflow);
        let counted = CompactCounted {
            window,
            shape,
            tag: place.tag,
            overflow: place.overflow,
            further: None,
        };
        self.compact_answer(&counted, place.totals, (at, behind), decision)
    }

    /// The decision on a request of a compact key with further windows
    /// (`limit_per`): every window or none (see `flow::compact_windows`),
    /// each further window under the key's own limit in it or the window's
    /// default (the registry's, as for a full key), then answered as
    /// [`compact_decide`](Self::compact_decide) answers.
    #[inline(never)]
    fn compact_several(
        &self,
        keys: &CompactKeys<X::Key>,
        place: Place<'_, CompactWindow>,
        shape: &CompactShape,
        key: Option<&X::Key>,
        now: u64,
    ) -> CompactOutcome {
        let registry = &*self.shared.registry;
        let limits = registry.windows();
        let shapes = keys.further_shapes();
        // The key's route, for the route rules of further windows
        // (`route_rule_per`): one load while there are none.
        let route = key
            .filter(|_| limits.routes_active())
            .and_then(|key| registry.routes().route_of(key));
        let mut inline = [0u64; 8];
        let mut heap: Vec<u64>;
        let further_limits: &mut [u64] = if shapes.len() <= inline.len() {
            &mut inline[..shapes.len()]
        } else {
            heap = vec![0; shapes.len()];
            &mut heap
        };
        limits.fill_limits(key, route, further_limits);
        if place.overflow {
            // The overflow window is shared by every key the table had no
            // room for: no key's own or route limit lifts it past the
            // window's default.
            for (i, limit) in further_limits.iter_mut().enumerate() {
                *limit = (*limit).min(limits.default_of(i));
            }
        }
        let further_limits: &[u64] = further_limits;
        let further = |i: usize| flow::CompactFurther {
            window: &place.further[i],
            shape: &shapes[i],
            limit: further_limits[i],
        };
        let window = place.value;
        let (at, behind, decision) = flow::all_compact_windows(
            window,
            shape,
            place.limit,
            shapes.len(),
            further,
            now,
            place.overflow,
        );
        let counted = CompactCounted {
            window,
            shape,
            tag: place.tag,
            overflow: place.overflow,
            further: Some(CompactSeveral {
                windows: place.further,
                shapes,
                limits: further_limits,
            }),
        };
        self.compact_answer(&counted, place.totals, (at, behind), decision)
    }

    /// The answer to the decision on a compact key (one window or several),
    /// counted in its place's lifetime totals: the RateLimit fields of a
    /// pass, when the layer sends them on passes (every window's, for a key
    /// with further windows), or the refusal's response. `at` is the
    /// decision's time, `behind` how far it was moved past the clock.
    #[inline]
    fn compact_answer(
        &self,
        counted: &CompactCounted<'_>,
        totals: &Totals,
        (at, behind): (u64, u64),
        decision: Decision<Pass>,
    ) -> CompactOutcome {
        match decision {
            Decision::Pass(pass) => {
                totals.add_pass();
                CompactOutcome::Pass(self.shared.headers_on_pass.then(|| {
                    let (window, shape) = (counted.window, counted.shape);
                    let window_pass = pass
                        .window_pass
                        .unwrap_or_else(|| window.window_counts(shape, at).0);
                    let reset = pass.reset_ms.unwrap_or_else(|| {
                        window.pass_reset_ms(shape, at, behind, pass.limit, window_pass)
                    });
                    let mut quota = quota(
                        counted,
                        &self.shared.response,
                        pass.limit,
                        window_pass,
                        reset,
                    );
                    // Nothing for a key without further windows.
                    counted.further_windows(&mut quota, at, behind);
                    Box::new(quota)
                }))
            }
            Decision::Block(refusal) => {
                totals.add_block();
                CompactOutcome::Refused(self.refused_compact(counted, at, refusal), at)
            }
            Decision::Wait(never) => match never {},
        }
    }

    /// Notes who a compact key's refused request came from, as for a full
    /// key (see `refused`): its key read again from the head, on this path
    /// only. Out of line, so that the key's second reading is not laid
    /// out among the instructions of a pass in `call`.
    #[inline(never)]
    fn compact_blocked<ReqBody>(&self, request: Request<ReqBody>, at: u64) {
        let blocked = self.shared.registry.blocked();
        visit_key!(
            consume & self.extractor,
            request,
            RecordBlocked { blocked, now: at }
        );
    }

    /// Answers a refused request of a compact key (see `quota::refuse`,
    /// where its block is recorded); the inner service is not called.
    #[inline(never)]
    fn refused_compact(
        &self,
        key: &CompactCounted<'_>,
        at: u64,
        refusal: Refusal,
    ) -> Box<Response<Bytes>> {
        Box::new(refuse(key, at, refusal, &self.shared.response))
    }
}

/// The key's identity in the shared store, when the layer has one.
#[cfg(feature = "redis")]
type RemoteId = Option<crate::store::redis::KeyId>;
#[cfg(not(feature = "redis"))]
type RemoteId = Option<std::convert::Infallible>;

/// The times of one request: `at`, the window's time of its decisions;
/// `behind`, how far `at` was moved forward from the clock; `started_us`,
/// the start of its response time.
#[derive(Debug, Clone, Copy)]
struct Times {
    at: u64,
    behind: u64,
    started_us: u64,
}

/// What the controllers before the window hand on with a pass: the
/// request's concurrency place (carrying its probe slots, if any), if one
/// was taken, and the limit to admit it against.
type Go = (Option<InFlight>, u64);

/// # The decisions
impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// The circuit breakers, the concurrency gauge and warm-up, when
    /// configured or, for breakers, when one is not closed: a plain
    /// limiter, or one whose breakers are all closed, pays one predictable
    /// check of three values and passes with the key's limit.
    #[inline]
    fn before_window(&self, entry: &Arc<Entry>, times: Times) -> Decision<Go> {
        let behaviours = &self.shared.registry.window().behaviours;
        if behaviours.max_concurrency.is_none()
            && behaviours.warm_up.is_none()
            && entry.breakers.none_open()
        {
            Decision::Pass((None, entry.limit()))
        } else {
            self.prelude(entry, times)
        }
    }

    /// What comes before the window, in order: the circuit breakers (no
    /// request bypasses them), a concurrency place (taken before the window
    /// is asked, so a request refused here records no pass; from here on
    /// the guard's drop gives it back on every path), and the warmed limit
    /// (warm-up moves the limit, never the admission step).
    #[inline(never)]
    fn prelude(&self, entry: &Arc<Entry>, times: Times) -> Decision<Go> {
        let window = self.shared.registry.window();
        let limit = entry.limit();
        // A probe slot taken here is freed at once if a controller below
        // refuses the request (the probe is dropped), or when it is
        // cancelled.
        entry
            .enter_breakers(times.at)
            .and_then(|probe| match window.behaviours.max_concurrency {
                None => Decision::Pass((probe, None)),
                Some(max) => InFlight::try_start(entry, times.started_us, max, limit)
                    .map(|place| (probe, Some(place))),
            })
            .map(|(probe, place)| {
                let limit = match (window.behaviours.warm_up, entry.warm_up()) {
                    (Some(settings), Some(state)) => flow::warm_up::warmed_limit(
                        settings,
                        state,
                        times.at,
                        limit,
                        window.interval_ms,
                    ),
                    _ => limit,
                };
                // A probe keeps its slot through everything after, a wait
                // included: it rides on the in-flight guard (taken now if
                // no concurrency place was), whose drop frees the slot if
                // the request is refused or dropped before it completes.
                let place = match probe {
                    None => place,
                    Some(probe) => {
                        let mut in_flight = place.unwrap_or_else(|| {
                            InFlight::start(Arc::clone(entry), times.started_us)
                        });
                        in_flight.hold_probe(probe);
                        Some(in_flight)
                    }
                };
                (place, limit)
            })
    }

    /// The admission: the shared store's decision if the layer has one,
    /// else pacing's under `throttle`, else the window's.
    #[inline]
    fn admit(
        &self,
        entry: &Arc<Entry>,
        remote_id: RemoteId,
        times: Times,
        limit: u64,
    ) -> Decision<Pass, Gate> {
        let window = self.shared.registry.window();
        #[cfg(feature = "redis")]
        if let (Some(id), Some(remote)) = (remote_id, &self.shared.remote.remote) {
            return remote::decide(
                &remote.store,
                self.shared.remote.policy,
                entry,
                id,
                limit,
                window.interval_ms,
            );
        }
        #[cfg(not(feature = "redis"))]
        let _ = remote_id;
        #[cfg(feature = "tokio")]
        if let Some(max_wait) = window.behaviours.throttle {
            return self.paced(entry, times, limit, max_wait);
        }
        let at = times.at;
        if let Some(windows) = entry.windows() {
            return several_windows(entry, windows, times, limit, window);
        }
        match flow::window(
            &entry.node,
            (at, times.behind),
            limit,
            window.interval_ms,
            || entry.is_overflow(),
        ) {
            Decision::Pass(pass) => {
                if window.behaviours.warm_up.is_some() {
                    record_warm_up_pass(entry, window, at);
                }
                Decision::Pass(pass)
            }
            Decision::Block(refusal) => Decision::Block(refusal),
            Decision::Wait(never) => match never {},
        }
    }
}

/// The decision of a key with further windows (`limit_per`): every window
/// or none (see `flow::windows`).
#[inline(never)]
fn several_windows(
    entry: &Entry,
    windows: &crate::stat::ExtraWindows,
    times: Times,
    limit: u64,
    window: &Window,
) -> Decision<Pass, Gate> {
    let at = times.at;
    match flow::all_windows(
        &entry.node,
        windows,
        (at, times.behind),
        limit,
        window.interval_ms,
        || entry.is_overflow(),
    ) {
        Decision::Pass(pass) => {
            if window.behaviours.warm_up.is_some() {
                record_warm_up_pass(entry, window, at);
            }
            Decision::Pass(pass)
        }
        Decision::Block(refusal) => Decision::Block(refusal),
        Decision::Wait(never) => match never {},
    }
}

/// Counts a pass towards `entry`'s warm-up.
#[inline(never)]
fn record_warm_up_pass(entry: &Entry, window: &Window, at: u64) {
    if let (Some(settings), Some(state)) = (window.behaviours.warm_up, entry.warm_up()) {
        flow::warm_up::record_pass(settings, state, at, entry.limit(), window.interval_ms);
    }
}

/// # Waiting: pacing and borrowed quota
#[cfg(feature = "tokio")]
impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// Under `throttle`: pacing's decision, its wait turned into a gate on
    /// a timer (a refusal if this runtime cannot wait).
    #[inline(never)]
    fn paced(
        &self,
        entry: &Arc<Entry>,
        times: Times,
        limit: u64,
        max_wait: Duration,
    ) -> Decision<Pass, Gate> {
        let window = self.shared.registry.window();
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
        match flow::pace(
            entry.pacer(),
            times.started_us,
            limit,
            window.interval_ms,
            max_wait,
        ) {
            Decision::Pass(pass) => {
                record_paced_pass(entry, times.at, window);
                Decision::Pass(pass)
            }
            Decision::Wait(turn) => {
                let waiter = Waiter::new(Arc::clone(entry), Some((turn.at_ns, turn.cost_ns)));
                let Some(timer) = wait::timer(turn.wait) else {
                    // Gives the turn back, then refuses.
                    drop(waiter);
                    return Decision::Block(turn.refusal(limit));
                };
                let window = *window;
                Decision::Wait(wait::after(timer, waiter, move |entry| {
                    let now = effective_now(entry, entry.node.clock().now_millis());
                    record_paced_pass(entry, now, &window);
                }))
            }
            Decision::Block(refusal) => Decision::Block(refusal),
        }
    }

    /// Under `prioritized`, for a request the window refused at `at` under
    /// `limit`: borrows a pass from a later bucket if the request is
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
        let Some(priority) = &self.shared.priority else {
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
        let interval_ms = self.shared.registry.window().interval_ms;
        let Some(wait_ms) = flow::occupy_wait_ms(&entry.node, at, limit, interval_ms) else {
            return (request, None);
        };
        let Some(timer) = wait::timer(Duration::from_millis(wait_ms)) else {
            return (request, None);
        };
        flow::occupy(&entry.node, at, wait_ms);
        let waiter = Waiter::new(Arc::clone(entry), None);
        // The pass is already in the bucket it borrowed from.
        (request, Some(wait::after(timer, waiter, |_| {})))
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

/// # Acting on the decision
impl<S, X: KeyExtractor, M: MakeClassifier, R> SlidingWindow<S, X, M, R> {
    /// Calls the inner service for a request that passed, holding its
    /// place in flight until it completes.
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
                legacy_headers: self.shared.legacy_headers,
            },
        )
    }

    /// The RateLimit fields of a passed request's response.
    #[inline(never)]
    fn pass_quota(&self, entry: &Entry, pass: Pass, times: Times) -> Box<Quota> {
        let Times { at, behind, .. } = times;
        let window_pass = pass
            .window_pass
            .unwrap_or_else(|| entry.node.window_counts(at).pass);
        let reset = pass.reset_ms.unwrap_or_else(|| {
            flow::pass_reset_ms(&entry.node, at, behind, pass.limit, window_pass)
        });
        let mut quota = quota(entry, &self.shared.response, pass.limit, window_pass, reset);
        entry.further_windows(&mut quota, at, behind);
        Box::new(quota)
    }

    /// The response future of a request that waits at `gate` before it
    /// reaches the inner service. The inner service is called after the
    /// wait, on the ready instance `poll_ready` prepared (a clone takes its
    /// place here, as `tower`'s own waiting middleware do).
    #[cfg(feature = "tokio")]
    #[inline(never)]
    fn defer<ReqBody: Send + 'static>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        reserved: Option<InFlight>,
        gate: Gate,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>> + Clone + Send + 'static,
    {
        let classifier = self.make_classifier.make_classifier(&request);
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(
            gate,
            Deferred {
                call: Box::new(Resumed {
                    ready,
                    request,
                    extractor: self.extractor.clone(),
                    registry: Arc::clone(&self.shared.registry),
                }),
                entry,
                reserved,
                classifier,
                response: Arc::clone(&self.shared.response),
            },
        )
    }

    /// Without a timer nothing waits: no controller answers with a wait.
    #[cfg(not(feature = "tokio"))]
    fn defer<ReqBody>(
        &mut self,
        _request: Request<ReqBody>,
        _entry: Arc<Entry>,
        _reserved: Option<InFlight>,
        _gate: Gate,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>>,
    {
        unreachable!("no controller waits without the `tokio` feature")
    }

    /// Answers a refused request (see `quota::refuse`, where its block is
    /// recorded); the inner service is not called. A prioritized request
    /// the window refused may wait for quota borrowed from a later bucket
    /// instead (under `prioritized`): that needs the request's head, which
    /// the decisions are not lent, so it is asked here, off the path of a
    /// pass.
    #[inline(never)]
    fn refused<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
        entry: Arc<Entry>,
        held: Option<InFlight>,
        at: u64,
        refusal: Refusal,
    ) -> ResponseFuture<S::Future, M::Classifier, R>
    where
        S: Service<Request<ReqBody>> + Clone + Send + 'static,
        ReqBody: Send + 'static,
    {
        #[cfg(feature = "tokio")]
        let request = match refusal.reason {
            Reason::Window | Reason::Overflow => {
                match self.borrow_for_priority(request, &entry, at, refusal.limit) {
                    (request, Some(gate)) => return self.defer(request, entry, held, gate),
                    (request, None) => request,
                }
            }
            _ => request,
        };
        // Who was refused: the key is read again from the request's head,
        // here only, so that a pass pays nothing for it.
        let blocked = self.shared.registry.blocked();
        visit_key!(
            consume & self.extractor,
            request,
            RecordBlocked { blocked, now: at }
        );
        // Gives the concurrency place and the probe slot back first.
        drop(held);
        ResponseFuture::blocked(refuse(&*entry, at, refusal, &self.shared.response))
    }
}

/// A waiting request: the ready inner service and the request, with what
/// names its key should its wait end in a refusal. Only the refusal reads
/// the key (from the request's head, as `refused` does); the clone of the
/// extractor it carries allocates nothing for the built-in ones (unit
/// structs, a header name, a shared list of proxies).
#[cfg(feature = "tokio")]
struct Resumed<S, X: KeyExtractor, B> {
    ready: S,
    request: Request<B>,
    extractor: X,
    registry: Arc<Registry<X::Key>>,
}

#[cfg(feature = "tokio")]
impl<S, X, B> Resume<S::Future> for Resumed<S, X, B>
where
    S: Service<Request<B>> + Send,
    X: KeyExtractor,
    B: Send,
{
    fn call(self: Box<Self>) -> S::Future {
        let Resumed {
            mut ready, request, ..
        } = *self;
        ready.call(request)
    }

    fn refused(self: Box<Self>, at: u64) {
        let Resumed {
            request,
            extractor,
            registry,
            ..
        } = *self;
        let blocked = registry.blocked();
        visit_key!(
            consume & extractor,
            request,
            RecordBlocked { blocked, now: at }
        );
    }
}

impl<S: Clone, X: KeyExtractor, M: Clone, R> Clone for SlidingWindow<S, X, M, R> {
    fn clone(&self) -> Self {
        SlidingWindow {
            inner: self.inner.clone(),
            extractor: self.extractor.clone(),
            make_classifier: self.make_classifier.clone(),
            shared: Arc::clone(&self.shared),
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, X: KeyExtractor + fmt::Debug, M, R> fmt::Debug for SlidingWindow<S, X, M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlidingWindow")
            .field("inner", &self.inner)
            .field("key", &self.extractor)
            .field("state", &self.shared.store)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields a compact request reads of the layer's shared state
    /// come right after the `Arc`'s two counts, within the allocation's
    /// first 64 bytes.
    #[test]
    fn a_compact_request_reads_the_first_64_bytes_of_the_shared_state() {
        type S = Shared<Option<std::net::IpAddr>>;
        let counts = 2 * std::mem::size_of::<usize>();
        for end in [
            std::mem::offset_of!(S, compact) + std::mem::size_of::<Option<Arc<()>>>(),
            std::mem::offset_of!(S, clock) + std::mem::size_of::<SharedClock>(),
            std::mem::offset_of!(S, headers_on_pass) + 1,
            std::mem::offset_of!(S, legacy_headers) + 1,
        ] {
            assert!(counts + end <= 64, "{}", counts + end);
        }
    }
}
