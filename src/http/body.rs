use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of [`SlidingWindow`](crate::SlidingWindow): the inner
    /// service's body for passed requests, the rejection text otherwise.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Full { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
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

impl<B> Body for ResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Full { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("ResponseBody::Inner"),
            Kind::Full { data } => f
                .debug_tuple("ResponseBody::Full")
                .field(&data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}

/// How a [`SlidingWindow`](crate::SlidingWindow)'s response body relates to
/// the inner service's. Chosen on the layer: [`WrapBody`] by default,
/// [`InnerBody`] with [`inner_body`](crate::SlidingWindowLayer::inner_body).
///
/// Sealed: the two kinds below are the only ones.
pub trait BodyKind<B>: sealed::Sealed + Send + Sync + 'static {
    /// The response body type.
    type Body;

    /// The body of a passed request's response.
    fn passed(body: B) -> Self::Body;

    /// The body of a rejection.
    fn rejected(text: Bytes) -> Self::Body;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::WrapBody {}
    impl Sealed for super::InnerBody {}
}

/// Responses carry a [`ResponseBody`] wrapping the inner body: works with
/// every body type. The default.
///
/// Under axum this costs one allocation per request: axum boxes any body
/// that is not its own `Body`. [`InnerBody`] avoids it.
#[derive(Debug, Clone, Copy, Default)]
pub struct WrapBody;

/// Responses carry the inner service's own body type, and a rejection's text
/// is turned into that type with `From<Bytes>` (axum's `Body`,
/// `http_body_util::Full<Bytes>` and most bodies of concrete frameworks
/// implement it). Nothing is wrapped, so axum has nothing to box.
#[derive(Debug, Clone, Copy, Default)]
pub struct InnerBody;

impl<B> BodyKind<B> for WrapBody
where
    B: Body<Data = Bytes>,
{
    type Body = ResponseBody<B>;

    #[inline]
    fn passed(body: B) -> ResponseBody<B> {
        ResponseBody::inner(body)
    }

    fn rejected(text: Bytes) -> ResponseBody<B> {
        ResponseBody::full(text)
    }
}

impl<B> BodyKind<B> for InnerBody
where
    B: From<Bytes>,
{
    type Body = B;

    #[inline]
    fn passed(body: B) -> B {
        body
    }

    fn rejected(text: Bytes) -> B {
        B::from(text)
    }
}
