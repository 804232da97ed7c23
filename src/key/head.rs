//! The request head as the built-in extractors read it: from [`Parts`]
//! (what [`KeyExtractor::visit`](super::KeyExtractor::visit) is given) or
//! from the whole [`Request`] (what
//! [`KeyExtractor::visit_request`](super::KeyExtractor::visit_request) is
//! given), so that each extractor is written once for both.

use http::request::Parts;
use http::{Extensions, HeaderMap, Method, Request, Uri};

/// What a key is read from.
pub(crate) trait Head {
    fn method(&self) -> &Method;
    fn uri(&self) -> &Uri;
    fn headers(&self) -> &HeaderMap;
    // Read by `MatchedPathKey` only, which needs the `axum` feature.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    fn extensions(&self) -> &Extensions;
}

impl Head for Parts {
    #[inline]
    fn method(&self) -> &Method {
        &self.method
    }

    #[inline]
    fn uri(&self) -> &Uri {
        &self.uri
    }

    #[inline]
    fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    #[inline]
    fn extensions(&self) -> &Extensions {
        &self.extensions
    }
}

impl<B> Head for Request<B> {
    #[inline]
    fn method(&self) -> &Method {
        self.method()
    }

    #[inline]
    fn uri(&self) -> &Uri {
        self.uri()
    }

    #[inline]
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }

    #[inline]
    fn extensions(&self) -> &Extensions {
        self.extensions()
    }
}
