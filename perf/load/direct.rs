//! Our layer and governor's keyed limiter driven in process, one request at
//! a time, without HTTP: what the memory and eviction modes of the harness
//! and the keyed admission bench (which includes this file by path) measure.
//!
//! Our layer wraps [`Answer`], a service that answers 200 with an empty
//! body at once, and is driven through its `Service::call`; its future is
//! polled once with a waker that does nothing (the inner future is always
//! ready, and our layer neither waits nor sleeps unless it throttles, which
//! nothing here asks it to).
//!
//! The keys are made from an index, so a run never holds them all: IPv4
//! addresses, IPv6 addresses differing in their high 64 bits (one /64 each),
//! and 64-byte strings.

// Each user of this file uses a part of it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use governor::clock::DefaultClock;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use tower::{Layer, Service};
use tower_sliding_window::{KeyExtractor, SlidingWindow, SlidingWindowLayer, StatsHandle};

/// The header the string-keyed subjects key by.
pub const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// Length of the string keys, in bytes.
pub const STRING_KEY_BYTES: usize = 64;

/// The innermost service: 200 with an empty body, ready at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answer;

impl Service<Request<()>> for Answer {
    type Response = Response<Bytes>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Bytes>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<()>) -> Self::Future {
        ready(Ok(Answer::respond(request)))
    }
}

impl Answer {
    /// The answer to `request`: 200, an empty body.
    #[inline]
    pub fn respond(request: Request<()>) -> Response<Bytes> {
        drop(request);
        Response::new(Bytes::new())
    }
}

/// A waker that does nothing: every future polled here is ready at once.
struct NoWake;

impl Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

/// Our layer around [`Answer`], with its statistics handle.
pub struct Driven<X: KeyExtractor> {
    service: SlidingWindow<Answer, X>,
    /// The layer's statistics.
    pub handle: StatsHandle<X::Key>,
    waker: Waker,
}

impl<X: KeyExtractor> Driven<X> {
    /// Builds `layer` (its state included: the handle is taken first).
    pub fn new(layer: SlidingWindowLayer<X>) -> Self {
        let handle = layer.handle();
        Driven {
            service: layer.layer(Answer),
            handle,
            waker: Waker::from(Arc::new(NoWake)),
        }
    }

    /// Sends `request` through the layer; the status of its answer.
    ///
    /// # Panics
    ///
    /// When the layer's future is not ready at its first poll (it waits
    /// only under `throttle`, which no subject here uses).
    #[inline]
    pub fn call(&mut self, request: Request<()>) -> StatusCode {
        let mut cx = Context::from_waker(&self.waker);
        let future = pin!(self.service.call(request));
        match future.poll(&mut cx) {
            Poll::Ready(Ok(response)) => response.status(),
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => panic!("the layer waited; no subject here may"),
        }
    }
}

/// The `i`-th IPv4 key: `i` spread over the whole address space by an odd
/// multiplier (a bijection of `u32`, so distinct indexes stay distinct).
#[inline]
pub fn ipv4(i: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from((i as u32).wrapping_mul(0x9E37_79B1)))
}

/// The `i`-th IPv6 key: `2001:db8::/32` with `i` in bits 64 to 95, so every
/// index is its own /64 (the interface half is the same for all).
#[inline]
pub fn ipv6(i: u64) -> IpAddr {
    let prefix = (0x2001_0db8_u128 << 96) | (u128::from(i as u32) << 64);
    IpAddr::V6(Ipv6Addr::from(prefix | 1))
}

/// The `i`-th string key: `key-` and `i` in decimal, zero-padded to
/// [`STRING_KEY_BYTES`].
#[inline]
pub fn string64(i: u64) -> String {
    format!("key-{i:060}")
}

/// A request from the peer `ip` (a plain `SocketAddr` extension, which
/// `PeerIpKey` reads in every build).
#[inline]
pub fn from_peer(ip: IpAddr) -> Request<()> {
    let mut request = Request::new(());
    request.extensions_mut().insert(SocketAddr::new(ip, 40_000));
    request
}

/// A request carrying `key` in [`API_KEY`].
#[inline]
pub fn with_api_key(key: &str) -> Request<()> {
    let mut request = Request::new(());
    request.headers_mut().insert(
        API_KEY,
        HeaderValue::from_str(key).expect("the keys are visible ASCII"),
    );
    request
}

/// governor's keyed limiter (its default store, a `DashMap`) on its
/// default clock.
pub type GovernorKeyed<K> = RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock>;

/// governor's keyed limiter with a quota that no run exhausts: a burst of
/// `u32::MAX` cells per key.
pub fn governor_keyed<K: Clone + std::hash::Hash + Eq>() -> GovernorKeyed<K> {
    RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX))
}
