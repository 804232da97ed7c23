//! gRPC refusals (see [`grpc`](crate::SlidingWindowLayer::grpc)): a
//! trailers-only response whose status travels in `grpc-status`,
//! `grpc-message` and `grpc-status-details-bin`.
//!
//! The details are a `google.rpc.Status` holding one `google.rpc.RetryInfo`
//! (packed in a `google.protobuf.Any`). The four messages are tiny, so they
//! are written here by hand (varints and length-delimited fields) rather than
//! with a protobuf library: nothing is added to the crate's dependencies.
//! The unit tests below decode every encoding with prost's generated types.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use tower_http::classify::GrpcCode;

use super::{Reason, Rejection};

/// The type URL of `google.rpc.RetryInfo` in its `Any`.
const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The largest `google.protobuf.Duration`: 10 000 years, in seconds. A
/// longer retry time is sent as this one (decoders reject more).
const MAX_DURATION_SECS: u64 = 315_576_000_000;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The gRPC status of a refusal for `reason`: `UNAVAILABLE` (14) for an open
/// breaker, whose upstream is failing, and for the system rule, whose
/// service is overloaded (a transient state that gRPC clients retry, as
/// Netflix's concurrency limiter answers); `RESOURCE_EXHAUSTED` (8) for
/// every other reason, each of which is about the client's quota or the
/// layer's capacity per key. The match names every reason, so a new one is decided here.
pub(crate) fn code_of(reason: Reason) -> GrpcCode {
    match reason {
        Reason::Breaker | Reason::System => GrpcCode::Unavailable,
        Reason::Window
        | Reason::Concurrency
        | Reason::Throttle
        | Reason::Store
        | Reason::Overflow => GrpcCode::ResourceExhausted,
    }
}

/// The default `grpc-message` of a refusal for `reason`, with the retry time
/// in whole seconds (as in `Retry-After`).
pub(crate) fn message_of(reason: Reason, retry_after_secs: u64) -> String {
    let what = match reason {
        Reason::Window => "rate limit reached",
        Reason::Concurrency => "too many requests in flight",
        Reason::Throttle => "rate limit reached (throttled)",
        Reason::Store => "rate limit reached (shared store)",
        Reason::Overflow => "rate limit reached (overflow)",
        Reason::Breaker => "circuit breaker open",
        Reason::System => "service overloaded",
    };
    format!("{what}: retry in {retry_after_secs} s")
}

/// A trailers-only gRPC response: HTTP 200, `content-type:
/// application/grpc`, no body, and the status in the headers, with a
/// `RetryInfo` of `retry_after_ms` in its details.
pub(crate) fn trailers_only(code: GrpcCode, message: &str, retry_after_ms: u64) -> Response<Bytes> {
    let code = code as i32;
    let details = encode_status(code, message, retry_after_ms);
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(GRPC_STATUS, HeaderValue::from(code));
    headers.insert(GRPC_MESSAGE, ascii_value(percent_encode(message)));
    headers.insert(GRPC_STATUS_DETAILS, ascii_value(base64_unpadded(&details)));
    response
}

/// A header value of `text`, which the callers make of visible ASCII and
/// spaces only (a percent-encoding, a base64 text), so it is always valid;
/// an empty value stands in should that ever not hold.
fn ascii_value(text: String) -> HeaderValue {
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// # gRPC
///
/// For builders given to [`reject_with`](crate::SlidingWindowLayer::reject_with)
/// on a [`grpc`](crate::SlidingWindowLayer::grpc) layer.
impl Rejection {
    /// The gRPC status the layer answers this refusal with under
    /// [`grpc`](crate::SlidingWindowLayer::grpc): `UNAVAILABLE` for an open
    /// breaker, `RESOURCE_EXHAUSTED` for every other reason.
    ///
    /// ```
    /// use tower_http::classify::GrpcCode;
    /// use tower_sliding_window::response::Reason;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// let layer = SlidingWindowLayer::qps(10).grpc().reject_with(|rejection| {
    ///     let message = match rejection.reason {
    ///         Reason::Breaker => "the catalogue is down",
    ///         _ => "slow down",
    ///     };
    ///     rejection.grpc_response(rejection.grpc_code(), message)
    /// });
    /// # let _ = layer;
    /// ```
    pub fn grpc_code(&self) -> GrpcCode {
        code_of(self.reason)
    }

    /// A trailers-only gRPC response with `code` and `message`: HTTP 200,
    /// `content-type: application/grpc`, `grpc-status`, `grpc-message`
    /// (percent-encoded: any text may be given) and
    /// `grpc-status-details-bin`, a `google.rpc.Status` with the same code
    /// and message and a `google.rpc.RetryInfo` whose `retry_delay` is
    /// [`retry_after`](Self::retry_after) (at most 10 000 years, the
    /// largest `google.protobuf.Duration`). The layer adds `Retry-After`
    /// and the RateLimit fields as to any refusal.
    ///
    /// ```
    /// use tower_http::classify::GrpcCode;
    /// use tower_sliding_window::SlidingWindowLayer;
    ///
    /// // Tell clients the service is unavailable, whatever the reason.
    /// let layer = SlidingWindowLayer::qps(10)
    ///     .grpc()
    ///     .reject_with(|rejection| rejection.grpc_response(GrpcCode::Unavailable, "busy"));
    /// # let _ = layer;
    /// ```
    pub fn grpc_response(&self, code: GrpcCode, message: &str) -> Response<Bytes> {
        trailers_only(code, message, duration_ms(self.retry_after))
    }
}

/// `duration` in whole milliseconds, saturating.
fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `google.rpc.Status { code, message, details: [Any { RetryInfo {
/// retry_delay } }] }`, encoded.
fn encode_status(code: i32, message: &str, retry_after_ms: u64) -> Vec<u8> {
    let mut delay = Vec::with_capacity(16);
    let (seconds, nanos) = delay_parts(retry_after_ms);
    // google.protobuf.Duration: seconds = 1 (int64), nanos = 2 (int32).
    put_varint_field(&mut delay, 1, seconds);
    put_varint_field(&mut delay, 2, nanos);
    // google.rpc.RetryInfo: retry_delay = 1.
    let mut retry_info = Vec::with_capacity(delay.len() + 2);
    put_message_field(&mut retry_info, 1, &delay);
    // google.protobuf.Any: type_url = 1, value = 2.
    let mut any = Vec::with_capacity(RETRY_INFO_TYPE_URL.len() + retry_info.len() + 4);
    put_bytes_field(&mut any, 1, RETRY_INFO_TYPE_URL.as_bytes());
    put_bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status: code = 1 (int32), message = 2, details = 3.
    let mut status = Vec::with_capacity(message.len() + any.len() + 16);
    // An int32 is written as its sign-extended 64-bit value.
    put_varint_field(&mut status, 1, i64::from(code) as u64);
    put_bytes_field(&mut status, 2, message.as_bytes());
    put_message_field(&mut status, 3, &any);
    status
}

/// A `google.protobuf.Duration` of `ms`, as (seconds, nanos), capped at the
/// largest duration the type allows.
fn delay_parts(ms: u64) -> (u64, u64) {
    let seconds = ms / 1000;
    if seconds >= MAX_DURATION_SECS {
        return (MAX_DURATION_SECS, 0);
    }
    (seconds, (ms % 1000) * 1_000_000)
}

/// Wire type 0 (varint).
const VARINT: u8 = 0;
/// Wire type 2 (length-delimited).
const LEN: u8 = 2;

/// A varint field; left out when 0, as proto3 writes scalars.
fn put_varint_field(out: &mut Vec<u8>, field: u8, value: u64) {
    if value != 0 {
        put_varint(out, u64::from(field << 3 | VARINT));
        put_varint(out, value);
    }
}

/// A string or bytes field; left out when empty, as proto3 writes them.
fn put_bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    if !bytes.is_empty() {
        put_message_field(out, field, bytes);
    }
}

/// A message field, written even when the message is empty (all its fields
/// 0): a message field is present or absent, and a zero `retry_delay` is
/// not a missing one.
fn put_message_field(out: &mut Vec<u8>, field: u8, message: &[u8]) {
    put_varint(out, u64::from(field << 3 | LEN));
    put_varint(out, message.len() as u64);
    out.extend_from_slice(message);
}

/// `value` as a base-128 varint: seven bits a byte, least significant
/// first, the high bit set on every byte but the last.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `text` percent-encoded as gRPC encodes `grpc-message`: every UTF-8 byte
/// outside space to `~` (0x20..=0x7E), and `%` itself, as `%XX`.
fn percent_encode(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
    out
}

/// `bytes` in base64 (the standard alphabet) without padding, as gRPC
/// sends `-bin` metadata.
fn base64_unpadded(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextet = |n: u32, shift: u32| char::from(ALPHABET[((n >> shift) & 0x3f) as usize]);
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    let mut chunks = bytes.chunks_exact(3);
    for chunk in chunks.by_ref() {
        let n = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        out.extend([sextet(n, 18), sextet(n, 12), sextet(n, 6), sextet(n, 0)]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend([sextet(n, 18), sextet(n, 12)]);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend([sextet(n, 18), sextet(n, 12), sextet(n, 6)]);
        }
        _ => {}
    }
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    use prost::Message;

    /// The `google.rpc.Status` in a response's details, decoded by prost.
    fn details(response: &Response<Bytes>) -> tonic_types::Status {
        let text = response.headers()[GRPC_STATUS_DETAILS]
            .to_str()
            .expect("ASCII");
        assert!(!text.contains('='), "unpadded: {text}");
        let bytes = decode_base64(text);
        tonic_types::Status::decode(bytes.as_slice()).expect("a google.rpc.Status")
    }

    /// The `RetryInfo` delay of a decoded status, checking its type URL.
    fn retry_delay(status: &tonic_types::Status) -> prost_types::Duration {
        assert_eq!(status.details.len(), 1);
        let any = &status.details[0];
        assert_eq!(any.type_url, "type.googleapis.com/google.rpc.RetryInfo");
        let info = tonic_types::pb::RetryInfo::decode(any.value.as_slice()).expect("a RetryInfo");
        info.retry_delay.expect("a retry delay")
    }

    /// A plain base64 decoder (padded or not) for the tests, written apart
    /// from the encoder it checks.
    fn decode_base64(text: &str) -> Vec<u8> {
        let value = |c: u8| -> u32 {
            match c {
                b'A'..=b'Z' => u32::from(c - b'A'),
                b'a'..=b'z' => u32::from(c - b'a') + 26,
                b'0'..=b'9' => u32::from(c - b'0') + 52,
                b'+' => 62,
                b'/' => 63,
                _ => panic!("not base64: {c:?}"),
            }
        };
        let mut out = Vec::new();
        let (mut bits, mut acc) = (0u32, 0u32);
        for &c in text.trim_end_matches('=').as_bytes() {
            acc = acc << 6 | value(c);
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
                acc &= (1 << bits) - 1;
            }
        }
        assert_eq!(acc, 0, "no stray bits");
        out
    }

    #[test]
    fn a_flow_refusal_is_resource_exhausted_with_its_exact_delay() {
        let r = trailers_only(GrpcCode::ResourceExhausted, "rate limit reached", 1_250);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc");
        assert_eq!(r.headers()[GRPC_STATUS], "8");
        assert_eq!(r.headers()[GRPC_MESSAGE], "rate limit reached");
        assert!(r.body().is_empty());
        let status = details(&r);
        assert_eq!(status.code, 8);
        assert_eq!(status.message, "rate limit reached");
        let delay = retry_delay(&status);
        assert_eq!((delay.seconds, delay.nanos), (1, 250_000_000));
    }

    #[test]
    fn every_reason_has_its_code() {
        for (reason, code) in [
            (Reason::Window, GrpcCode::ResourceExhausted),
            (Reason::Concurrency, GrpcCode::ResourceExhausted),
            (Reason::Throttle, GrpcCode::ResourceExhausted),
            (Reason::Store, GrpcCode::ResourceExhausted),
            (Reason::Overflow, GrpcCode::ResourceExhausted),
            (Reason::Breaker, GrpcCode::Unavailable),
            (Reason::System, GrpcCode::Unavailable),
        ] {
            assert_eq!(code_of(reason), code, "{reason:?}");
        }
        assert_eq!(GrpcCode::ResourceExhausted as i32, 8);
        assert_eq!(GrpcCode::Unavailable as i32, 14);
    }

    #[test]
    fn a_huge_retry_time_is_capped_at_the_largest_duration() {
        for ms in [
            u64::MAX,
            MAX_DURATION_SECS * 1000,
            MAX_DURATION_SECS * 1000 + 999,
        ] {
            let r = trailers_only(GrpcCode::ResourceExhausted, "x", ms);
            let delay = retry_delay(&details(&r));
            assert_eq!((delay.seconds, delay.nanos), (315_576_000_000, 0), "{ms}");
            // The decoded value is a valid duration.
            std::time::Duration::try_from(delay).expect("in range");
        }
        let just_under = MAX_DURATION_SECS * 1000 - 1;
        let r = trailers_only(GrpcCode::ResourceExhausted, "x", just_under);
        let delay = retry_delay(&details(&r));
        assert_eq!((delay.seconds, delay.nanos), (315_575_999_999, 999_000_000));
    }

    #[test]
    fn a_zero_delay_is_an_empty_duration_still_present() {
        let r = trailers_only(GrpcCode::ResourceExhausted, "x", 0);
        let delay = retry_delay(&details(&r));
        assert_eq!((delay.seconds, delay.nanos), (0, 0));
    }

    #[test]
    fn the_message_is_percent_encoded_and_the_details_keep_it_whole() {
        let message = "quota 100% spent\r\n\u{7f}: réessayez, 稍后 🙂";
        let r = trailers_only(GrpcCode::ResourceExhausted, message, 1_000);
        let encoded = r.headers()[GRPC_MESSAGE].to_str().expect("ASCII");
        assert_eq!(
            encoded,
            "quota 100%25 spent%0D%0A%7F: r%C3%A9essayez, %E7%A8%8D%E5%90%8E %F0%9F%99%82"
        );
        assert_eq!(details(&r).message, message);
        // An empty message: an empty header, and no field in the details.
        let r = trailers_only(GrpcCode::Unavailable, "", 1_000);
        assert_eq!(r.headers()[GRPC_MESSAGE], "");
        let status = details(&r);
        assert_eq!((status.code, status.message.as_str()), (14, ""));
    }

    #[test]
    fn varints_and_negative_codes_decode_as_written() {
        // Every length of varint, through prost's decoder.
        for value in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::MAX >> 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            let mut slice = out.as_slice();
            assert_eq!(
                prost::encoding::decode_varint(&mut slice).expect("a varint"),
                value
            );
            assert!(slice.is_empty());
        }
        // A negative code (never sent, but an int32 must encode in 10 bytes).
        let status = tonic_types::Status::decode(encode_status(-1, "m", 5).as_slice())
            .expect("a google.rpc.Status");
        assert_eq!(status.code, -1);
        // The hand-written bytes equal prost's own encoding of the same value.
        let expected = tonic_types::Status {
            code: 8,
            message: "m".repeat(200),
            details: vec![prost_types::Any {
                type_url: RETRY_INFO_TYPE_URL.to_string(),
                value: tonic_types::pb::RetryInfo {
                    retry_delay: Some(prost_types::Duration {
                        seconds: 3,
                        nanos: 7_000_000,
                    }),
                }
                .encode_to_vec(),
            }],
        };
        assert_eq!(
            encode_status(8, &"m".repeat(200), 3_007),
            expected.encode_to_vec()
        );
    }

    #[test]
    fn base64_is_the_standard_alphabet_without_padding() {
        // RFC 4648's test vectors, without their padding.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_unpadded(plain.as_bytes()), encoded);
        }
        let all: Vec<u8> = (0..=255).collect();
        let encoded = base64_unpadded(&all);
        assert!(encoded.ends_with("+/w"), "{encoded}");
        assert_eq!(decode_base64(&encoded), all);
    }

    #[test]
    fn a_rejection_builds_its_grpc_response_from_its_retry_time() {
        let rejection = Rejection {
            status: StatusCode::TOO_MANY_REQUESTS,
            reason: Reason::Breaker,
            limit: 5,
            window: Duration::from_secs(1),
            retry_after: Duration::from_millis(2_500),
            policy: "default".to_string(),
        };
        assert_eq!(rejection.grpc_code(), GrpcCode::Unavailable);
        let r = rejection.grpc_response(GrpcCode::Aborted, "later");
        assert_eq!(r.headers()[GRPC_STATUS], "10");
        let delay = retry_delay(&details(&r));
        assert_eq!((delay.seconds, delay.nanos), (2, 500_000_000));
    }

    /// The example in the response docs (`response#grpc`) is what the
    /// layer sends for a window refusal 460 ms before the window has room.
    #[test]
    fn the_documented_example_is_the_encoding() {
        let r = trailers_only(code_of(Reason::Window), &message_of(Reason::Window, 1), 460);
        assert_eq!(
            r.headers()[GRPC_MESSAGE],
            "rate limit reached: retry in 1 s"
        );
        assert_eq!(
            r.headers()[GRPC_STATUS_DETAILS],
            "CAgSIHJhdGUgbGltaXQgcmVhY2hlZDogcmV0cnkgaW4gMSBzGjQKKHR5cGUuZ29vZ2xlYXBpcy5jb20vZ29vZ2xlLnJwYy5SZXRyeUluZm8SCAoGEICWrNsB"
        );
        let docs = include_str!("mod.rs");
        assert!(docs.contains(r.headers()[GRPC_STATUS_DETAILS].to_str().expect("ASCII")));
    }

    #[test]
    fn the_default_message_names_the_reason_and_the_retry_time() {
        assert_eq!(
            message_of(Reason::Window, 2),
            "rate limit reached: retry in 2 s"
        );
        assert_eq!(
            message_of(Reason::Breaker, 30),
            "circuit breaker open: retry in 30 s"
        );
    }
}
