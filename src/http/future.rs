//! The response future and the guard that records a request's completion.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tower_http::classify::{ClassifiedResponse, ClassifyResponse};

use crate::clock::Clock;
use std::marker::PhantomData;

use crate::http::body::{BodyKind, WrapBody};
use crate::http::response::Quota;
use crate::registry::Entry;

pin_project! {
    /// Response future of [`SlidingWindow`](crate::SlidingWindow).
    ///
    /// For a passed request it drives the inner service's future and, when it
    /// resolves, records the completion (success, response time, exception);
    /// for a rejected one it yields the rejection response at once. `R` is
    /// the layer's [`BodyKind`].
    pub struct ResponseFuture<F, C, R = WrapBody> {
        #[pin]
        kind: Kind<F, C>,
        body: PhantomData<fn() -> R>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, C> {
        Passed {
            #[pin]
            future: F,
            completion: Option<Completion<C>>,
        },
        Blocked {
            // Boxed: a rejection may allocate, and the future every passed
            // request carries stays small.
            response: Option<Box<Response<Bytes>>>,
        },
    }
}

impl<F, C, R> ResponseFuture<F, C, R> {
    pub(crate) fn passed(future: F, completion: Completion<C>) -> Self {
        ResponseFuture {
            kind: Kind::Passed {
                future,
                completion: Some(completion),
            },
            body: PhantomData,
        }
    }

    pub(crate) fn blocked(response: Response<Bytes>) -> Self {
        ResponseFuture {
            kind: Kind::Blocked {
                response: Some(Box::new(response)),
            },
            body: PhantomData,
        }
    }
}

impl<F, C, R, B, E> Future for ResponseFuture<F, C, R>
where
    F: Future<Output = Result<Response<B>, E>>,
    C: ClassifyResponse,
    R: BodyKind<B>,
    E: fmt::Display + 'static,
{
    type Output = Result<Response<R::Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passed { future, completion } => {
                let Some(pending) = completion.as_mut() else {
                    panic!("`ResponseFuture` polled after it completed");
                };
                // If the inner future panics, the guard stays marked as in
                // user code and its drop records the request as a failure.
                pending.in_flight.enter_user_code();
                let poll = future.poll(cx);
                pending.in_flight.leave_user_code();
                let result = ready!(poll);
                let done = completion
                    .take()
                    .expect("checked above, and only taken here");
                Poll::Ready(done.finish::<R, B, E>(result))
            }
            KindProj::Blocked { response } => {
                let response = response
                    .take()
                    .expect("`ResponseFuture` polled after it completed");
                Poll::Ready(Ok((*response).map(R::rejected)))
            }
        }
    }
}

impl<F, C, R> fmt::Debug for ResponseFuture<F, C, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.kind {
            Kind::Passed { .. } => "Passed",
            Kind::Blocked { .. } => "Blocked",
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
        R: BodyKind<B>,
        E: fmt::Display + 'static,
    {
        let Completion {
            mut in_flight,
            classifier,
            quota,
            legacy_headers,
        } = self;
        match result {
            Ok(response) => {
                let failed = match classifier.classify_response(&response) {
                    ClassifiedResponse::Ready(outcome) => outcome.is_err(),
                    // Classes decided at the end of the stream (gRPC trailers)
                    // are not waited for: the response itself succeeded.
                    ClassifiedResponse::RequiresEos(_) => false,
                };
                in_flight.complete(failed);
                let mut response = response.map(R::passed);
                if let Some(quota) = quota {
                    quota.write(response.headers_mut(), legacy_headers);
                }
                Ok(response)
            }
            Err(error) => {
                let _ = classifier.classify_error(&error);
                in_flight.complete(true);
                Err(error)
            }
        }
    }
}

/// Holds a passed request's place in its key's concurrency gauge.
///
/// Dropping it always releases the place, so a request whose future is
/// dropped (client gone, timeout) or whose handler panics cannot leak it.
pub(crate) struct InFlight {
    entry: Arc<Entry>,
    /// `Clock::now_micros` at admission.
    started_us: u64,
    /// Set while the inner service's code runs (its `call`, or a poll of its
    /// future); still set at drop only if that code unwound.
    in_user_code: bool,
    completed: bool,
}

impl InFlight {
    /// Marks a request in flight: one more in the concurrency gauge.
    pub(crate) fn start(entry: Arc<Entry>, started_us: u64) -> Self {
        entry.node.increase_concurrency();
        InFlight {
            entry,
            started_us,
            in_user_code: false,
            completed: false,
        }
    }

    #[inline]
    pub(crate) fn enter_user_code(&mut self) {
        self.in_user_code = true;
    }

    #[inline]
    pub(crate) fn leave_user_code(&mut self) {
        self.in_user_code = false;
    }

    /// Records a completion: one success with its response time, and an
    /// exception on top when it failed.
    fn complete(&mut self, failed: bool) {
        let node = &self.entry.node;
        let rt_us = node.clock().now_micros().saturating_sub(self.started_us);
        node.add_rt_and_success(Duration::from_micros(rt_us), 1);
        if failed {
            node.increase_exception_qps(1);
        }
        self.completed = true;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let node = &self.entry.node;
        if !self.completed && self.in_user_code {
            // The inner service panicked: a failure, not a success.
            node.increase_exception_qps(1);
        }
        // Matched by the increase in `InFlight::start`.
        node.release_concurrency();
    }
}
