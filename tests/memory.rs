//! What a key costs in memory, including the key, and the bound of the
//! default table under hostile keys.
//!
//! A global allocator tallies, per thread, the bytes allocated and freed.
//! The layer's service is called directly on the test thread (its `call`
//! decides and creates the entry synchronously), so the thread's net bytes
//! are what the table keeps: requests and responses are freed before the
//! count is read.
//!
//! `cargo test --test memory -- --nocapture` prints the figures quoted in
//! the docs of `SlidingWindowLayer::max_keys`.

use std::convert::Infallible;
use std::mem::size_of;

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response};
use tower::{service_fn, Layer, Service};
use tower_sliding_window::clock::ManualClock;
use tower_sliding_window::key::{MAX_DIGEST_KEY_BYTES, MAX_KEY_BYTES};
use tower_sliding_window::stat::StatisticNode;
use tower_sliding_window::{HeaderKey, PathKey, SlidingWindowLayer};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::{allocated_by, live, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Default `max_keys`.
const KEYS: usize = 4096;

/// The bound the docs of `max_keys` state for the default table.
const DOCUMENTED_BOUND: i64 = 21 * 1024 * 1024;

type Svc = tower_sliding_window::SlidingWindow<
    tower::util::ServiceFn<
        fn(Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
    >,
    HeaderKey,
>;

fn ok(_: Request<()>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
    std::future::ready(Ok(Response::new(Body::empty())))
}

/// A layer of limit `limit` keyed by `x-key` on `clock`.
fn header_layer(limit: u64, clock: ManualClock) -> SlidingWindowLayer<HeaderKey> {
    SlidingWindowLayer::qps(limit)
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .clock(clock)
}

/// `layer` around the innermost service, and its handle.
fn built(
    layer: SlidingWindowLayer<HeaderKey>,
) -> (Svc, tower_sliding_window::StatsHandle<Option<String>>) {
    let stats = layer.handle();
    let f: fn(Request<()>) -> _ = ok;
    (layer.layer(service_fn(f)), stats)
}

/// A service keyed by `x-key`, its table built.
fn header_service() -> (Svc, tower_sliding_window::StatsHandle<Option<String>>) {
    built(header_layer(1_000, ManualClock::new(1_000_000)))
}

/// Sends one request with `x-key: value` and drops its future: the entry
/// stays, the request is gone.
fn send(svc: &mut Svc, value: HeaderValue) {
    let request = Request::get("/").header("x-key", value).body(()).unwrap();
    drop(svc.call(request));
}

/// Net bytes the table keeps per key for `KEYS` keys made by `value(i)`.
fn bytes_per_key(value: impl Fn(usize) -> Vec<u8>) -> (i64, usize) {
    let (mut svc, stats) = header_service();
    // The first request builds the table's fixed part; count from there.
    send(&mut svc, HeaderValue::from_static("warm-up"));
    let before = live();
    let mut key_len = 0;
    for i in 0..KEYS - 1 {
        let bytes = value(i);
        send(&mut svc, HeaderValue::from_bytes(&bytes).unwrap());
    }
    let after = live();
    assert_eq!(stats.len(), KEYS, "every key has its own entry");
    stats.for_each(|key, _| key_len = key_len.max(key.as_deref().map_or(0, str::len)));
    ((after - before) / (KEYS as i64 - 1), key_len)
}

/// A distinct value of exactly `len` bytes for every `i`.
fn value_of(i: usize, len: usize, fill: u8) -> Vec<u8> {
    let mut v = vec![fill; len];
    let tag = format!("{i:08}");
    v[..8].copy_from_slice(tag.as_bytes());
    v
}

#[test]
fn a_key_costs_its_entry_its_slot_and_at_most_256_bytes_of_key() {
    let node = {
        let before = live();
        let node = StatisticNode::with_clock(ManualClock::new(0));
        let heap = live() - before;
        drop(node);
        heap + size_of::<StatisticNode>() as i64
    };

    let (longest, longest_len) = bytes_per_key(|i| value_of(i, MAX_KEY_BYTES, b'k'));
    let (long, long_len) = bytes_per_key(|i| value_of(i, 16 * 1024, b'l'));
    let (invalid, invalid_len) = bytes_per_key(|i| value_of(i, 200, 0xff));
    let (short, _) = bytes_per_key(|i| format!("{i}").into_bytes());

    println!("StatisticNode (default windows): {node} bytes");
    println!("per key, {MAX_KEY_BYTES}-byte header values (kept verbatim): {longest} bytes");
    println!("per key, 16 KiB header values (digest form, {long_len} bytes): {long} bytes");
    println!("per key, 200 bytes not UTF-8 (escaped past 256: digest form, {invalid_len} bytes): {invalid} bytes");
    println!("per key, short header values: {short} bytes");
    println!(
        "default table ({KEYS} keys) at the worst case: {:.2} MiB",
        (longest * KEYS as i64) as f64 / (1024.0 * 1024.0)
    );

    assert_eq!(longest_len, MAX_KEY_BYTES);
    assert!(long_len <= MAX_DIGEST_KEY_BYTES, "{long_len}");
    assert!(invalid_len <= MAX_DIGEST_KEY_BYTES, "{invalid_len}");
    // The key's cost is bounded whatever the value: a 16 KiB value costs no
    // more than a 256-byte one.
    assert!(long <= longest, "{long} > {longest}");
    assert!(invalid <= longest, "{invalid} > {longest}");
    assert!(
        longest * KEYS as i64 <= DOCUMENTED_BOUND,
        "{longest} bytes per key x {KEYS} keys exceeds the documented bound"
    );
}

#[test]
fn maximum_size_header_values_keep_a_bounded_key() {
    // hyper's default limit for an HTTP/1 head is about 400 KB.
    let (mut svc, stats) = header_service();
    for i in 0..4 {
        send(
            &mut svc,
            HeaderValue::from_bytes(&value_of(i, 400 * 1024, b'h')).unwrap(),
        );
    }
    let keys = stats.keys();
    assert_eq!(keys.len(), 4);
    for key in keys {
        let key = key.expect("a header value");
        assert!(key.len() <= MAX_DIGEST_KEY_BYTES, "{} bytes", key.len());
        assert!(key.contains("…#"), "{key}");
    }
}

#[test]
fn long_paths_keep_a_bounded_key() {
    let layer = SlidingWindowLayer::qps(1_000)
        .key(PathKey)
        .clock(ManualClock::new(0));
    let stats = layer.handle();
    let mut svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Body::empty()))
    }));
    let long = format!("/{}", "p".repeat(60_000));
    drop(svc.call(Request::get(long.as_str()).body(()).unwrap()));
    drop(svc.call(Request::get("/short").body(()).unwrap()));
    let mut keys = stats.keys();
    keys.sort_by_key(String::len);
    assert_eq!(keys[0], "/short");
    assert!(keys[1].len() <= MAX_DIGEST_KEY_BYTES, "{}", keys[1].len());
    assert!(keys[1].starts_with("/ppp"), "{}", keys[1]);
}

// A request with a huge header value copied the value into
// its key (and made it three times larger when it was not UTF-8).
#[test]
fn a_request_with_a_huge_header_value_copies_only_its_key() {
    let (mut svc, _stats) = header_service();
    for (name, fill) in [("valid", b'h'), ("not UTF-8", 0xff)] {
        let value = HeaderValue::from_bytes(&vec![fill; 400 * 1024]).unwrap();
        send(&mut svc, value.clone());
        let request = Request::get("/").header("x-key", value).body(()).unwrap();
        let bytes = allocated_by(|| drop(svc.call(request))).1.bytes;
        println!("a request with a 400 KiB {name} header value allocates {bytes} bytes");
        assert!(bytes < 1024, "{name}: {bytes} bytes");
    }
}

/// Net bytes the table keeps per key, with keys of the short form
/// `format!("{i}")`, on a header-keyed layer made by `layer`.
fn bytes_per_short_key(
    layer: impl Fn(SlidingWindowLayer<HeaderKey>) -> SlidingWindowLayer<HeaderKey>,
) -> i64 {
    let layer = layer(
        SlidingWindowLayer::qps(1_000)
            .key(HeaderKey::new(HeaderName::from_static("x-key")))
            .clock(ManualClock::new(1_000_000)),
    );
    let f: fn(Request<()>) -> _ = ok;
    let mut svc: Svc = layer.layer(service_fn(f));
    send(&mut svc, HeaderValue::from_static("warm-up"));
    let keys = 1_000;
    let before = live();
    for i in 0..keys {
        send(&mut svc, HeaderValue::from_str(&format!("{i}")).unwrap());
    }
    (live() - before) / keys
}

/// What a further window (`limit_per`) adds to every key, against the
/// figures its docs give (`SlidingWindowLayer::limit_per`, "Memory": about
/// 1 KiB with the default 10 buckets, the first one a little more for the
/// box it shares with throttle and warm-up, about 80 bytes more under
/// `strict`).
#[test]
fn a_further_window_costs_what_limit_per_documents() {
    let minute = std::time::Duration::from_secs(60);
    let one = bytes_per_short_key(|l| l);
    let two = bytes_per_short_key(|l| l.limit_per(minute, 1_000));
    let three = bytes_per_short_key(|l| {
        l.limit_per(minute, 1_000)
            .limit_per(std::time::Duration::from_secs(3_600), 1_000)
    });
    let strict_one = bytes_per_short_key(|l| l.strict());
    let strict_two = bytes_per_short_key(|l| l.strict().limit_per(minute, 1_000));
    println!("per key: one window {one} bytes, two {two}, three {three}");
    println!("per key under strict: one window {strict_one} bytes, two {strict_two}");
    let first = two - one;
    let second = three - two;
    println!(
        "a further window: {first} bytes (the first, with the optional box), {second} (each \
         next); under strict {}",
        strict_two - strict_one
    );
    assert!(first <= 1_100, "{first}");
    assert!(second <= 1_000, "{second}");
    assert!(
        strict_two - strict_one <= 1_200,
        "{}",
        strict_two - strict_one
    );
}

/// Net bytes a compact layer keeps once built, with `max_keys` and
/// `further` windows (`limit_per`, of 1, 2, ... minutes), before any key.
fn compact_layer_bytes(max_keys: usize, further: u64) -> i64 {
    let before = live();
    let mut layer = SlidingWindowLayer::qps(1_000)
        .key(HeaderKey::new(HeaderName::from_static("x-key")))
        .clock(ManualClock::new(1_000_000))
        .max_keys(max_keys)
        .compact();
    for i in 1..=further {
        layer = layer.limit_per(std::time::Duration::from_secs(60 * i), 1_000);
    }
    let f: fn(Request<()>) -> _ = ok;
    let mut svc: Svc = layer.layer(service_fn(f));
    // The first request builds the table.
    send(&mut svc, HeaderValue::from_static("warm-up"));
    let bytes = live() - before;
    drop(svc);
    bytes
}

/// What a further window (`limit_per`) adds to a compact layer: one compact
/// window (28 bytes) per slot, made with the table, 8/7 slots per key at
/// most: 32 bytes per key and further window, against the figure
/// `SlidingWindowLayer::limit_per` documents ("Memory"). A layer without
/// further windows keeps nothing for them.
#[test]
fn a_further_window_of_a_compact_layer_costs_one_compact_window_per_slot() {
    let max_keys = 65_536;
    let none = compact_layer_bytes(max_keys, 0);
    let one = compact_layer_bytes(max_keys, 1);
    let two = compact_layer_bytes(max_keys, 2);
    let first = (one - none) as f64 / max_keys as f64;
    let second = (two - one) as f64 / max_keys as f64;
    println!(
        "a compact layer of {max_keys} keys: {none} bytes built, a further window {first:.1} \
         bytes per key, the next {second:.1}"
    );
    for per_key in [first, second] {
        assert!((28.0..=32.5).contains(&per_key), "{per_key}");
    }
    // Without further windows, the table holding its first key is the
    // groups' headers and block indexes (68 bytes per 16 slots, at a load
    // of 7/8: 4.9 bytes per key) and the first chunk of 64 blocks of
    // slots (1 560 bytes a block with header keys): no byte per key for
    // windows it does not have.
    let first_chunk = 64 * 1_560;
    assert!(
        ((none - first_chunk) as f64 / max_keys as f64) < 5.25,
        "{none} bytes for {max_keys} keys"
    );
}

/// Net bytes a compact layer of `KEYS` keys keeps per key, the table's
/// headers included, with a warm-up key (which builds the table) and
/// `KEYS - 1` distinct header values of `len` bytes (at least 8). Every
/// group of the table takes keys, so the slots cost the same whatever the
/// keys: what differs between two lengths is what their text costs beside
/// the slots.
fn compact_bytes_per_key(len: usize) -> f64 {
    let layer = header_layer(1_000, ManualClock::new(1_000_000));
    let (mut svc, stats) = built(layer.max_keys(KEYS).compact());
    let before = live();
    send(&mut svc, HeaderValue::from_static("warm-up"));
    for i in 0..KEYS - 1 {
        send(
            &mut svc,
            HeaderValue::from_bytes(&value_of(i, len, b'k')).unwrap(),
        );
    }
    let bytes = live() - before;
    // Keys that found no slot share the overflow entry: fewer than 1 %.
    assert!(stats.len() * 100 >= KEYS * 99, "{} keys held", stats.len());
    bytes as f64 / KEYS as f64
}

/// A compact layer keyed by a header holds a key's text in its slot when it
/// is at most 64 bytes long (`SlidingWindowLayer::compact`, "Memory"): a
/// 64-byte key costs what an 8-byte key costs, no heap block of its own
/// beside the slot; a 65-byte key keeps its text (65 bytes) in a block of
/// its own, listed in its group's table of long texts (16 pointers, 256
/// bytes a group: about 18 a key at the table's load of 7/8).
#[test]
fn a_compact_header_key_of_up_to_64_bytes_keeps_no_block_beside_its_slot() {
    let short = compact_bytes_per_key(8);
    let sixty_four = compact_bytes_per_key(64);
    let sixty_five = compact_bytes_per_key(65);
    println!(
        "compact header keys, bytes per key: 8-byte {short:.1}, 64-byte {sixty_four:.1}, \
         65-byte {sixty_five:.1}"
    );
    assert!(
        (sixty_four - short).abs() < 1.0,
        "a 64-byte key costs {sixty_four:.1} bytes, an 8-byte one {short:.1}"
    );
    assert!(
        (65.0..=85.0).contains(&(sixty_five - short)),
        "a 65-byte key costs {sixty_five:.1} bytes, an 8-byte one {short:.1}"
    );
}

/// A flood of distinct header keys of the longest verbatim length (256
/// bytes: a key held beside the slots, in a heap block of its own) into a
/// compact layer of 4 096 keys, clients turning over as their windows
/// empty: what the table keeps stays within one slot, one pointer of its
/// group's table of long texts and one text per slot, plus the groups'
/// fixed parts; and it stops growing once the table has filled, however
/// many more keys arrive (evicted keys' texts are freed).
///
/// The overflow window's limit lets every key that finds no slot pass, so
/// that nothing is refused: refused keys are also remembered by the
/// summary of who is being limited (`StatsHandle::top_blocked`), which
/// has a bound of its own.
#[test]
fn a_flood_of_long_keys_into_a_compact_layer_stays_within_its_bound() {
    let clock = ManualClock::new(1_000_000);
    let layer = header_layer(1, clock.clone()).max_keys(KEYS);
    let (mut svc, stats) = built(layer.overflow_limit(65_535).compact());
    send(&mut svc, HeaderValue::from_static("warm-up"));
    let before = live();
    let mut flood = |from: usize, to: usize| {
        for i in from..to {
            // A second later every earlier key is idle and may be evicted.
            if i % KEYS == 0 {
                clock.advance(std::time::Duration::from_millis(1_100));
            }
            let value = value_of(i, MAX_KEY_BYTES, b'k');
            send(&mut svc, HeaderValue::from_bytes(&value).unwrap());
        }
        live() - before
    };
    let filled = flood(0, 4 * KEYS);
    let flooded = flood(4 * KEYS, 12 * KEYS);
    // The table's slots (16 a group), a group's block and its table of 16
    // long texts (with an allocator header of 16 bytes each), and a text
    // of 256 bytes (plus its allocator header) per slot.
    let groups = (KEYS * 8).div_ceil(7).div_ceil(16) as i64;
    let per_group = 16 * 96 + 24 + 16 + 16 * 16 + 16;
    let bound = groups * per_group + groups * 16 * (MAX_KEY_BYTES as i64 + 16);
    println!(
        "compact layer flooded with 256-byte keys: {filled} bytes after {} keys, {flooded} \
         after {} (bound {bound}, {} keys held)",
        4 * KEYS,
        12 * KEYS,
        stats.len()
    );
    assert!(filled <= bound, "{filled} bytes kept, bound {bound}");
    assert!(flooded <= bound, "{flooded} bytes kept, bound {bound}");
    assert!(
        flooded <= filled + filled / 100,
        "the table grew from {filled} to {flooded} bytes while its keys turned over"
    );
    assert!(stats.len() <= KEYS + 1, "{} keys held", stats.len());
    assert_eq!(stats.total().block, 0, "nothing was refused");
}
