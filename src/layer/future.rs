//! The response future of [`SlidingWindow`](crate::SlidingWindow).
//!
//! A passed request's future drives the inner service's future; when the
//! response head is ready it classifies the response, writes the RateLimit
//! fields if configured, and records the completion (or, with
//! [`TrackBody`](crate::body::TrackBody), hands it to the body). A rejected
//! request's future yields the rejection response at once, without calling
//! the inner service. A request that must wait first (a turn under
//! `throttle`, borrowed quota under `prioritized`) polls its gate, then
//! calls the inner service or yields the rejection.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tower_http::classify::{ClassifiedResponse, ClassifyResponse};

use super::body::{BodyKind, InnerBody, Outcome, Tail};
use super::in_flight::InFlight;
use super::quota::{quota, refuse};
use super::wait::Gate;
use crate::clock::Clock;
use crate::flow::{self, Decision, Refusal};
use crate::response::{Quota, ResponseConfig};
use crate::store::{effective_now, Entry};

pin_project! {
    /// Response future of [`SlidingWindow`](crate::SlidingWindow).
    ///
    /// For a passed request it drives the inner service's future and, when it
    /// resolves, records the completion (success, response time, exception);
    /// for a rejected one it yields the rejection response at once; a request
    /// that waits for its turn first does so here, then calls the inner
    /// service. `R` is the layer's [`BodyKind`](crate::body::BodyKind).
    pub struct ResponseFuture<F, C, R = InnerBody> {
        #[pin]
        kind: Kind<F, C>,
        body: PhantomData<fn() -> R>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        // The inner service's future, and what happens when it resolves.
        Running {
            #[pin]
            future: F,
            then: Outlined<Then<C>>,
        },
        Blocked {
            // Boxed: a rejection may allocate, and the future every passed
            // request carries stays small.
            response: Outlined<Box<Response<Bytes>>>,
        },
        Waiting {
            // Boxed for the same reason as `Blocked`.
            waiting: Outlined<Box<Waiting<F, C>>>,
        },
    }
}

/// What a running request does when its inner future resolves.
enum Then<C> {
    /// Records the completion of a full key.
    Record(Completion<C>),
    /// Nothing to record (a compact key): only the RateLimit fields to
    /// write, if the layer sends them on passes (taken when written).
    Write {
        quota: Option<Box<Quota>>,
        legacy_headers: bool,
    },
}

/// A value dropped out of line (`None` once taken).
///
/// Every variant of [`Kind`] holds its fields beside the inner future in
/// one of these, so the response future's drop is a call or two: small
/// enough to be inlined where a caller boxes the future (axum's router
/// does, for every request), which lets the compiler make the future in
/// place there rather than make it and copy it.
struct Outlined<T>(ManuallyDrop<Option<T>>);

impl<T> Outlined<T> {
    fn new(value: T) -> Self {
        Outlined(ManuallyDrop::new(Some(value)))
    }

    fn get_mut(&mut self) -> Option<&mut T> {
        self.0.as_mut()
    }

    fn take(&mut self) -> Option<T> {
        self.0.take()
    }
}

impl<T> Drop for Outlined<T> {
    #[inline(never)]
    fn drop(&mut self) {
        // The value, if still here, is dropped now; the emptied
        // `ManuallyDrop` holds nothing to drop.
        drop(self.take());
    }
}

/// A request waiting for its gate, and what it needs once it has passed.
struct Waiting<F, C> {
    gate: Gate,
    deferred: Deferred<F, C>,
}

/// A waiting request's way on, once its gate has decided: to the inner
/// service, or, refused, into the layer's top-blocked summary under its
/// key.
pub(crate) trait Resume<F>: Send {
    /// Calls the inner service (a ready clone of it, taken at `call`) with
    /// the request.
    fn call(self: Box<Self>) -> F;

    /// Records the request, refused at `at`, as a block of its key in the
    /// top-blocked summary: the key is read from the request's head here,
    /// so a wait that passes pays nothing for it.
    fn refused(self: Box<Self>, at: u64);
}

/// A waiting request: how to call the inner service once its gate passes,
/// and what its completion or rejection needs.
pub(crate) struct Deferred<F, C> {
    /// The inner service and the request (see [`Resume`]).
    pub(crate) call: Box<dyn Resume<F>>,
    pub(crate) entry: Arc<Entry>,
    /// A concurrency place taken before the wait, held through it.
    pub(crate) reserved: Option<InFlight>,
    pub(crate) classifier: C,
    pub(crate) response: Arc<ResponseConfig>,
}

impl<F, C> Deferred<F, C> {
    /// Calls the inner service for the request whose gate passed.
    fn forward(self) -> (F, Completion<C>) {
        let Deferred {
            call,
            entry,
            reserved,
            classifier,
            response,
        } = self;
        let now_us = entry.node.clock().now_micros();
        let quota = response.headers_on_pass.then(|| {
            let limit = entry.limit();
            let now = entry.node.clock().now_millis();
            let window_pass = entry.node.window_counts(now).pass;
            // As for a request that passed at once.
            let reset = flow::pass_reset_ms(&entry.node, now, 0, limit, window_pass);
            Box::new(quota(&*entry, &response, limit, window_pass, reset))
        });
        let mut in_flight = match reserved {
            // The response time starts now, after the wait.
            Some(mut in_flight) => {
                in_flight.restart(now_us);
                in_flight
            }
            None => InFlight::start(entry, now_us),
        };
        in_flight.enter_user_code();
        let future = call.call();
        in_flight.leave_user_code();
        (
            future,
            Completion {
                in_flight,
                classifier,
                quota,
                legacy_headers: response.legacy_headers,
            },
        )
    }

    /// The answer for a request its gate refused: its block is recorded
    /// now, with the answer (see `quota::refuse`).
    fn refuse(self, refusal: Refusal) -> Response<Bytes> {
        let at = effective_now(&self.entry, self.entry.node.clock().now_millis());
        self.call.refused(at);
        refuse(&*self.entry, at, refusal, &self.response)
    }
}

impl<F, C, R> ResponseFuture<F, C, R> {
    pub(crate) fn passed(future: F, completion: Completion<C>) -> Self {
        ResponseFuture {
            kind: Kind::Running {
                future,
                then: Outlined::new(Then::Record(completion)),
            },
            body: PhantomData,
        }
    }

    /// The future of a pass that records nothing on completion: `quota`
    /// is written on the response, if any; nothing else happens.
    pub(crate) fn forwarded(future: F, quota: Option<Box<Quota>>, legacy_headers: bool) -> Self {
        ResponseFuture {
            kind: Kind::Running {
                future,
                then: Outlined::new(Then::Write {
                    quota,
                    legacy_headers,
                }),
            },
            body: PhantomData,
        }
    }

    pub(crate) fn blocked(response: Response<Bytes>) -> Self {
        Self::blocked_boxed(Box::new(response))
    }

    /// [`blocked`](Self::blocked), for a response boxed already.
    pub(crate) fn blocked_boxed(response: Box<Response<Bytes>>) -> Self {
        ResponseFuture {
            kind: Kind::Blocked {
                response: Outlined::new(response),
            },
            body: PhantomData,
        }
    }

    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn waiting(gate: Gate, deferred: Deferred<F, C>) -> Self {
        ResponseFuture {
            kind: Kind::Waiting {
                waiting: Outlined::new(Box::new(Waiting { gate, deferred })),
            },
            body: PhantomData,
        }
    }
}

impl<F, C, R, B, E> Future for ResponseFuture<F, C, R>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: ClassifyResponse,
    R: BodyKind<B, C::ClassifyEos>,
    E: fmt::Display + 'static,
{
    type Output = Result<Response<R::Body>, E>;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // A compact pass with no fields to write, the common case of a
        // compact layer: the inner poll's result is handed on as it comes.
        if let KindProj::Running { future, then } = self.as_mut().project().kind.project() {
            if let Some(Then::Write { quota: None, .. }) = then.get_mut() {
                return future
                    .poll(cx)
                    .map(|result| result.map(|response| R::passed_response(response, None)));
            }
        }
        self.poll_other(cx)
    }
}

impl<F, C, R, B, E> ResponseFuture<F, C, R>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: ClassifyResponse,
    R: BodyKind<B, C::ClassifyEos>,
    E: fmt::Display + 'static,
{
    /// [`poll`](Future::poll) for every other state, out of line so that
    /// the compact pass's poll stays small.
    #[inline(never)]
    fn poll_other(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Response<R::Body>, E>> {
        let mut kind = self.as_mut().project().kind;
        match kind.as_mut().project() {
            KindProj::Running { future, then } => match then.get_mut() {
                Some(Then::Record(pending)) => {
                    // If the inner future panics, the guard stays marked as
                    // in user code and its drop records the request as a
                    // failure.
                    pending.in_flight.enter_user_code();
                    let poll = future.poll(cx);
                    pending.in_flight.leave_user_code();
                    let result = ready!(poll);
                    let Some(Then::Record(done)) = then.take() else {
                        unreachable!("checked above, and only taken here");
                    };
                    return Poll::Ready(done.finish::<R, B, E>(result));
                }
                Some(Then::Write {
                    quota,
                    legacy_headers,
                }) => {
                    let mut result = ready!(future.poll(cx));
                    if let (Ok(response), Some(quota)) = (&mut result, quota.take()) {
                        quota.write(response.headers_mut(), *legacy_headers);
                    }
                    return Poll::Ready(result.map(|response| R::passed_response(response, None)));
                }
                None => panic!("`ResponseFuture` polled after it completed"),
            },
            KindProj::Blocked { response } => {
                let response = response
                    .take()
                    .expect("`ResponseFuture` polled after it completed");
                return Poll::Ready(Ok((*response).map(R::rejected)));
            }
            KindProj::Waiting { waiting } => {
                let Some(pending) = waiting.get_mut() else {
                    panic!("`ResponseFuture` polled after it completed");
                };
                let decision = ready!(pending.gate.as_mut().poll(cx));
                let Some(pending) = waiting.take() else {
                    unreachable!("checked above, and only taken here");
                };
                let Waiting { deferred, .. } = *pending;
                match decision {
                    Decision::Pass(()) => {
                        // A panic in the inner `call` unwinds through here;
                        // the guard, marked as in user code, records it.
                        let (future, completion) = deferred.forward();
                        kind.set(Kind::Running {
                            future,
                            then: Outlined::new(Then::Record(completion)),
                        });
                    }
                    Decision::Block(refusal) => {
                        let response = deferred.refuse(refusal);
                        return Poll::Ready(Ok(response.map(R::rejected)));
                    }
                    Decision::Wait(never) => match never {},
                }
            }
        }
        // The gate passed: the inner service's future starts now. (Kept out
        // of a loop so that the common case, `Running`, is one match.)
        self.poll(cx)
    }
}

impl<F, C, R> fmt::Debug for ResponseFuture<F, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Running { .. } => "Passed",
            Kind::Blocked { .. } => "Blocked",
            Kind::Waiting { .. } => "Waiting",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// What a passed request still has to record when it completes.
pub(crate) struct Completion<C> {
    pub(crate) in_flight: InFlight,
    pub(crate) classifier: C,
    /// RateLimit fields for the response, when configured (boxed: rare, and
    /// the future of every passed request carries this field).
    pub(crate) quota: Option<Box<Quota>>,
    pub(crate) legacy_headers: bool,
}

impl<C: ClassifyResponse> Completion<C> {
    fn finish<R, B, E>(self, result: Result<Response<B>, E>) -> Result<Response<R::Body>, E>
    where
        R: BodyKind<B, C::ClassifyEos>,
        E: fmt::Display + 'static,
    {
        let Completion {
            mut in_flight,
            classifier,
            quota,
            legacy_headers,
        } = self;
        match result {
            Ok(mut response) => {
                let outcome = match classifier.classify_response(&response) {
                    ClassifiedResponse::Ready(class) => Outcome::Decided(class.is_err()),
                    ClassifiedResponse::RequiresEos(eos) => Outcome::AtEnd(eos),
                };
                let tail = if R::TRACKS_BODY {
                    Some(Tail { in_flight, outcome })
                } else {
                    // Completion at the head: a class decided at the end of
                    // the stream (gRPC trailers) cannot be seen here, and the
                    // response itself succeeded.
                    in_flight.complete(matches!(outcome, Outcome::Decided(true)));
                    None
                };
                if let Some(quota) = quota {
                    quota.write(response.headers_mut(), legacy_headers);
                }
                Ok(R::passed_response(response, tail))
            }
            Err(error) => {
                let _ = classifier.classify_error(&error);
                in_flight.complete(true);
                Err(error)
            }
        }
    }
}
