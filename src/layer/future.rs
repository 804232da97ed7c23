//! The response future of [`SlidingWindow`](crate::SlidingWindow).
//!
//! A passed request's future drives the inner service's future; when the
//! response head is ready it classifies the response, writes the RateLimit
//! fields if configured, and records the completion (or, with
//! [`TrackBody`](crate::body::TrackBody), hands it to the body). A rejected
//! request's future yields the rejection response at once, without calling
//! the inner service.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;
use tower_http::classify::{ClassifiedResponse, ClassifyResponse};

use super::body::{BodyKind, InnerBody, Outcome, Tail};
use super::in_flight::InFlight;
use crate::response::Quota;

pin_project! {
    /// Response future of [`SlidingWindow`](crate::SlidingWindow).
    ///
    /// For a passed request it drives the inner service's future and, when it
    /// resolves, records the completion (success, response time, exception);
    /// for a rejected one it yields the rejection response at once. `R` is
    /// the layer's [`BodyKind`](crate::body::BodyKind).
    pub struct ResponseFuture<F, C, R = InnerBody> {
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
    R: BodyKind<B, C::ClassifyEos>,
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
                Ok(response.map(|body| R::passed(body, tail)))
            }
            Err(error) => {
                let _ = classifier.classify_error(&error);
                in_flight.complete(true);
                Err(error)
            }
        }
    }
}
