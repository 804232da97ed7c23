//! Response bodies: which body type the layer answers with, and when a
//! request counts as complete.
//!
//! | mode | body type | completes when | costs |
//! |---|---|---|---|
//! | [`InnerBody`] (default) | the inner service's `B` (needs `B: From<Bytes>`) | the response head is ready | nothing: under axum, no allocation per request |
//! | [`TrackBody`] ([`track_body`](crate::SlidingWindowLayer::track_body)) | [`ResponseBody<B>`] (any `B`) | the body has ended | under axum, one allocation per request (axum boxes bodies that are not its own) |
//!
//! An inner body type that cannot be made from `Bytes` takes
//! [`TrackBody`], which wraps it.
//!
//! "Completes" is when the request's success, response time and exception
//! are recorded and it leaves the concurrency gauge. With [`TrackBody`] a
//! server-sent event stream or a download counts as in flight until its
//! last frame; its response time covers the whole body; a body that fails
//! mid-stream is an exception; and a classifier that decides at the end of
//! the stream (tower-http's `GrpcErrorsAsFailures`, which reads
//! `grpc-status` from the trailers) is asked then. A body dropped before its
//! end (the client went away) records nothing more, like a dropped
//! response future: the pass stays, the concurrency slot is released.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_http::classify::{ClassifyEos, NeverClassifyEos, ServerErrorsFailureClass};

use super::in_flight::InFlight;

/// The end-of-stream classifier of the default classifier (it never runs:
/// server errors are decided by the response head).
pub type DefaultEos = NeverClassifyEos<ServerErrorsFailureClass>;

pin_project! {
    /// The response body of [`SlidingWindow`](crate::SlidingWindow) with
    /// [`TrackBody`]: the inner service's body for passed
    /// requests, the rejection text otherwise. `E` is the classifier's
    /// end-of-stream classifier (see the [module docs](self)).
    pub struct ResponseBody<B, E = DefaultEos> {
        #[pin]
        kind: Kind<B, E>,
    }

}

pin_project! {
    #[project = KindProj]
    enum Kind<B, E> {
        Inner { #[pin] body: B },
        Tracked { #[pin] body: B, tail: Option<Tail<E>> },
        Full { data: Option<Bytes> },
    }
}

/// What a request whose completion waits for the end of its body still has
/// to record.
pub(crate) struct Tail<E> {
    pub(crate) in_flight: InFlight,
    pub(crate) outcome: Outcome<E>,
}

/// Whether a request failed, as far as the response head tells.
pub(crate) enum Outcome<E> {
    /// Decided by the head: `true` when it failed.
    Decided(bool),
    /// To be decided at the end of the stream.
    AtEnd(E),
}

impl<E: ClassifyEos> Tail<E> {
    /// Records the completion at the end of the stream, with the trailers
    /// if there were any.
    fn end(self, trailers: Option<&HeaderMap>) {
        let Tail {
            mut in_flight,
            outcome,
        } = self;
        let failed = match outcome {
            Outcome::Decided(failed) => failed,
            Outcome::AtEnd(eos) => eos.classify_eos(trailers).is_err(),
        };
        in_flight.complete(failed);
    }

    /// Records the completion of a body that failed mid-stream.
    fn fail<Err: fmt::Display + 'static>(self, error: &Err) {
        let Tail {
            mut in_flight,
            outcome,
        } = self;
        if let Outcome::AtEnd(eos) = outcome {
            let _ = eos.classify_error(error);
        }
        in_flight.complete(true);
    }
}

impl<B, E> ResponseBody<B, E> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn tracked(body: B, tail: Tail<E>) -> Self {
        ResponseBody {
            kind: Kind::Tracked {
                body,
                tail: Some(tail),
            },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B, E> Body for ResponseBody<B, E>
where
    B: Body<Data = Bytes>,
    B::Error: fmt::Display + 'static,
    E: ClassifyEos,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Tracked { mut body, tail } => {
                if let Some(tail) = tail.as_mut() {
                    tail.in_flight.enter_user_code();
                }
                let poll = body.as_mut().poll_frame(cx);
                if let Some(tail) = tail.as_mut() {
                    tail.in_flight.leave_user_code();
                }
                let Poll::Ready(frame) = poll else {
                    return Poll::Pending;
                };
                match &frame {
                    Some(Ok(frame)) => {
                        if let Some(trailers) = frame.trailers_ref() {
                            if let Some(tail) = tail.take() {
                                tail.end(Some(trailers));
                            }
                        } else if body.is_end_stream() {
                            if let Some(tail) = tail.take() {
                                tail.end(None);
                            }
                        }
                    }
                    Some(Err(error)) => {
                        if let Some(tail) = tail.take() {
                            tail.fail(error);
                        }
                    }
                    None => {
                        if let Some(tail) = tail.take() {
                            tail.end(None);
                        }
                    }
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Tracked { body, .. } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Tracked { body, .. } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B, E> fmt::Debug for ResponseBody<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Tracked { tail, .. } => f
                .debug_struct("ResponseBody::Tracked")
                .field("ended", &tail.is_none())
                .finish_non_exhaustive(),
            Kind::Full { data } => f
                .debug_tuple("ResponseBody::Full")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

/// How a [`SlidingWindow`](crate::SlidingWindow)'s response body relates to
/// the inner service's, and when a request completes: [`InnerBody`] (the
/// default) or [`TrackBody`], chosen on the layer. See the
/// [module docs](self).
///
/// Sealed: the two kinds of this module are the only ones. `E` is the
/// classifier's end-of-stream classifier.
pub trait BodyKind<B, E>: sealed::Sealed + Send + Sync + 'static {
    /// The response body type.
    type Body;

    /// Whether a request completes at the end of its body rather than at
    /// its response head.
    #[doc(hidden)]
    const TRACKS_BODY: bool;

    /// The body of a passed request's response, carrying `tail` when the
    /// kind tracks bodies.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn passed(body: B, tail: Option<Tail<E>>) -> Self::Body;

    /// A passed request's response: [`passed`](Self::passed) applied to
    /// its body. A kind whose body is the inner one returns the response
    /// as it is, spared taking it apart and putting it back together.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    #[inline]
    fn passed_response(response: Response<B>, tail: Option<Tail<E>>) -> Response<Self::Body> {
        response.map(|body| Self::passed(body, tail))
    }

    /// The body of a rejection.
    #[doc(hidden)]
    fn rejected(text: Bytes) -> Self::Body;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::InnerBody {}
    impl Sealed for super::TrackBody {}
}

/// Responses carry the inner service's own body type, and a rejection's text
/// is turned into that type with `From<Bytes>` (axum's `Body`,
/// `http_body_util::Full<Bytes>` and most bodies of concrete frameworks
/// implement it). Nothing is wrapped, so axum has nothing to box. A request
/// completes at its response head. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct InnerBody;

/// Responses carry a [`ResponseBody`] that records the request's completion
/// when the body ends: for streamed responses (see the [module docs](self)),
/// and for inner body types that cannot be made from `Bytes` (it works with
/// every body type).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackBody;

impl<B, E> BodyKind<B, E> for InnerBody
where
    B: From<Bytes>,
{
    type Body = B;
    const TRACKS_BODY: bool = false;

    #[inline]
    #[allow(private_interfaces)]
    fn passed(body: B, _tail: Option<Tail<E>>) -> B {
        body
    }

    #[inline]
    #[allow(private_interfaces)]
    fn passed_response(response: Response<B>, _tail: Option<Tail<E>>) -> Response<B> {
        response
    }

    fn rejected(text: Bytes) -> B {
        B::from(text)
    }
}

impl<B, E> BodyKind<B, E> for TrackBody
where
    B: Body<Data = Bytes>,
    E: ClassifyEos,
{
    type Body = ResponseBody<B, E>;
    const TRACKS_BODY: bool = true;

    #[inline]
    #[allow(private_interfaces)]
    fn passed(body: B, tail: Option<Tail<E>>) -> ResponseBody<B, E> {
        match tail {
            // hyper never polls a body that is at its end from the start
            // (it checks `is_end_stream` first): it ends here.
            Some(tail) if body.is_end_stream() => {
                tail.end(None);
                ResponseBody::inner(body)
            }
            Some(tail) => ResponseBody::tracked(body, tail),
            None => ResponseBody::inner(body),
        }
    }

    fn rejected(text: Bytes) -> ResponseBody<B, E> {
        ResponseBody::full(text)
    }
}
