//! The criterion group `keyed_admission`: one admission on a table of many
//! keys, each request from a random one of them, against governor's keyed
//! limiter holding the same keys, in interleaved rounds.
//!
//! Every contender is sent the same kind of request: an empty request from
//! an IPv4 peer (a `SocketAddr` extension), built anew each time, the peer
//! drawn at random (a fixed-seed generator per contender, so contenders with
//! the same number of keys see the same sequence) from a fixed set of
//! distinct addresses. All keys are inserted before the first round, so
//! every admission finds its key in a table of that many.
//!
//! | id               | what a request goes through |
//! |------------------|-----------------------------|
//! | `service_alone`  | the innermost service (200, empty body), no limiter: the floor |
//! | `governor_1m`    | the peer's address read from the request, governor's `check_key` on a keyed limiter (`DashMap`) of 1 000 000 keys, then the service |
//! | `ours_compact_1m`| our layer keyed by `PeerIpKey`, compact tier, 1 000 000 keys (`max_keys` the same), then the service |
//! | `ours_full_100k` | our layer keyed by `PeerIpKey`, full tier, 100 000 keys (a full key costs about 5 KiB, so fewer of them) |
//! | `governor_100k`  | `governor_1m` with 100 000 keys |
//! | `ours_compact_16`| `ours_compact_1m` with 16 keys, which stay in the cache |
//! | `governor_16`    | `governor_1m` with 16 keys |
//!
//! Our layer runs on the system clock and governor on its default clock;
//! the limits are far above what any key is sent. After the group, the
//! table printed gives per contender the median ns per request and the
//! median per-round difference to `service_alone`, and the ratio of ours to
//! governor's beyond the floor with the same number of keys.
//!
//! Our contenders go through the layer's `Service::call` and its future,
//! governor's through a plain function: the 16-key pair measures what
//! that and a lookup in the cache cost, and the report also gives what a
//! table of 1 000 000 keys adds to each (the 1m contender beyond the
//! 16-key one, round by round: the lookup's cache misses), so the table's
//! share can be compared apart from the layer's.

use std::cell::RefCell;
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use http::{Request, StatusCode};
use tower_sliding_window::{PeerIpKey, SlidingWindowLayer};

use crate::direct::{self, Answer, Driven, GovernorKeyed};
use crate::report::{in_rounds, print_ratio, print_rows, RoundTable, Row};

/// Keys of the large tables.
const KEYS: u64 = 1_000_000;

/// Keys of the full tier (and of the governor it is compared with).
const FULL_KEYS: u64 = 100_000;

/// Keys of the small tables, which stay in the cache.
const SMALL_KEYS: u64 = 16;

/// Requests per contender per round.
const BATCH: u32 = 64;

/// Our limit: the most a compact key may have, far above what any key is
/// sent here.
const LIMIT: u64 = 65_535;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    ServiceAlone,
    Governor1m,
    OursCompact1m,
    OursFull100k,
    Governor100k,
    OursCompact16,
    Governor16,
}

impl Contender {
    const ALL: [Contender; 7] = [
        Contender::ServiceAlone,
        Contender::Governor1m,
        Contender::OursCompact1m,
        Contender::OursFull100k,
        Contender::Governor100k,
        Contender::OursCompact16,
        Contender::Governor16,
    ];

    fn id(self) -> &'static str {
        match self {
            Contender::ServiceAlone => "service_alone",
            Contender::Governor1m => "governor_1m",
            Contender::OursCompact1m => "ours_compact_1m",
            Contender::OursFull100k => "ours_full_100k",
            Contender::Governor100k => "governor_100k",
            Contender::OursCompact16 => "ours_compact_16",
            Contender::Governor16 => "governor_16",
        }
    }

    /// How many keys its requests are drawn from.
    fn keys(self) -> u64 {
        match self {
            Contender::ServiceAlone | Contender::Governor1m | Contender::OursCompact1m => KEYS,
            Contender::OursFull100k | Contender::Governor100k => FULL_KEYS,
            Contender::OursCompact16 | Contender::Governor16 => SMALL_KEYS,
        }
    }
}

const N: usize = Contender::ALL.len();

/// The seed of every contender's generator.
const SEED: u64 = 0x853C_49E6_748F_EA9B;

/// The next random index below `n` (xorshift64*).
#[inline]
fn next_index(state: &mut u64, n: u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) % n
}

/// A request from the `i`-th peer.
#[inline]
fn request(i: u64) -> Request<()> {
    direct::from_peer(direct::ipv4(i))
}

/// The innermost service alone: what its `call` does, without the
/// (always ready) future around it.
#[inline]
fn serve(request: Request<()>) -> StatusCode {
    let response = Answer::respond(request);
    let status = response.status();
    drop(black_box(response));
    status
}

/// What a governor middleware keyed by the peer does: read the address,
/// ask the limiter, serve.
#[inline]
fn governed(limiter: &GovernorKeyed<IpAddr>, request: Request<()>) -> StatusCode {
    let peer = request
        .extensions()
        .get::<SocketAddr>()
        .map(SocketAddr::ip)
        .expect("every request carries its peer");
    if limiter.check_key(&peer).is_ok() {
        serve(request)
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

/// The tables, the generators and every round run so far.
struct Rounds {
    governor_1m: GovernorKeyed<IpAddr>,
    ours_compact: Driven<PeerIpKey>,
    ours_full: Driven<PeerIpKey>,
    governor_100k: GovernorKeyed<IpAddr>,
    ours_compact_16: Driven<PeerIpKey>,
    governor_16: GovernorKeyed<IpAddr>,
    rng: [u64; N],
    next_start: usize,
    /// Per round, per contender: ns per request.
    ns: RoundTable<N>,
}

impl Rounds {
    fn new() -> Rounds {
        let governor = |keys: u64| {
            let limiter = direct::governor_keyed::<IpAddr>();
            for i in 0..keys {
                assert!(limiter.check_key(&direct::ipv4(i)).is_ok());
            }
            assert_eq!(limiter.len() as u64, keys, "governor holds every key");
            limiter
        };
        let ours = |compact: bool, keys: u64| {
            let layer = SlidingWindowLayer::qps(LIMIT)
                .key(PeerIpKey)
                .max_keys(keys as usize);
            let mut driven = Driven::new(if compact { layer.compact() } else { layer });
            for i in 0..keys {
                assert_eq!(driven.call(request(i)), StatusCode::OK);
            }
            // A compact table may leave a few keys without room (both of
            // their groups full): they share the overflow entry.
            let held = driven.handle.len() as u64;
            assert!(
                held * 100 >= keys * 99,
                "our layer (compact: {compact}) holds {held} of {keys} keys"
            );
            driven
        };
        Rounds {
            governor_1m: governor(KEYS),
            ours_compact: ours(true, KEYS),
            ours_full: ours(false, FULL_KEYS),
            governor_100k: governor(FULL_KEYS),
            ours_compact_16: ours(true, SMALL_KEYS),
            governor_16: governor(SMALL_KEYS),
            rng: [SEED; N],
            next_start: 0,
            ns: RoundTable::new(),
        }
    }

    /// `BATCH` requests to contender `i`; the time they took.
    #[inline(never)]
    fn batch(&mut self, i: usize) -> Duration {
        let contender = Contender::ALL[i];
        let keys = contender.keys();
        let rng = &mut self.rng[i];
        let start = Instant::now();
        for _ in 0..BATCH {
            let request = request(next_index(rng, keys));
            let status = match contender {
                Contender::ServiceAlone => serve(request),
                Contender::Governor1m => governed(&self.governor_1m, request),
                Contender::OursCompact1m => self.ours_compact.call(request),
                Contender::OursFull100k => self.ours_full.call(request),
                Contender::Governor100k => governed(&self.governor_100k, request),
                Contender::OursCompact16 => self.ours_compact_16.call(request),
                Contender::Governor16 => governed(&self.governor_16, request),
            };
            black_box(status);
        }
        start.elapsed()
    }

    /// Runs `rounds` rounds; the time spent in contender `of`.
    fn run(&mut self, rounds: u64, of: usize) -> Duration {
        let mut spent = Duration::ZERO;
        for _ in 0..rounds {
            let start = self.next_start;
            self.next_start = (start + 1) % N;
            let mut ns = [0.0; N];
            for k in 0..N {
                let i = (start + k) % N;
                let elapsed = self.batch(i);
                ns[i] = elapsed.as_nanos() as f64 / f64::from(BATCH);
                if i == of {
                    spent += elapsed;
                }
            }
            self.ns.push(ns);
        }
        spent
    }

    fn report(&self) {
        if self.ns.is_empty() {
            return;
        }
        let floor = index(Contender::ServiceAlone);
        let rows = self
            .ns
            .rows(Contender::ALL.iter().map(|c| c.id()), |_| floor);
        let heading = format!(
            "keyed_admission: {} rounds of {BATCH} requests per contender, rotated order, \
             random keys",
            self.ns.len()
        );
        print_rows(&heading, "beyond floor", 18, &rows);
        for (ours, governor) in [
            (Contender::OursCompact1m, Contender::Governor1m),
            (Contender::OursFull100k, Contender::Governor100k),
            (Contender::OursCompact16, Contender::Governor16),
        ] {
            print_ratio(&rows[index(ours)], &rows[index(governor)], "the floor");
        }
        // What a table of 1 000 000 keys adds to a lookup in the cache.
        let added = |large: Contender, small: Contender| Row {
            id: large.id(),
            ns: self.ns.column(index(large)),
            beyond: self.ns.beyond(index(large), index(small)),
        };
        let added = [
            added(Contender::OursCompact1m, Contender::OursCompact16),
            added(Contender::Governor1m, Contender::Governor16),
        ];
        print_rows(
            "keyed_admission: what 1 000 000 keys add to 16 (the same contender's \
             16-key twin in the same round)",
            "beyond 16",
            18,
            &added,
        );
        print_ratio(&added[0], &added[1], "their 16-key twins");
    }
}

fn index(contender: Contender) -> usize {
    Contender::ALL
        .iter()
        .position(|&c| c == contender)
        .expect("every contender is in ALL")
}

pub(crate) fn bench(c: &mut Criterion) {
    // Filled only when a benchmark of the group runs (not for `--list` or
    // another filter): filling takes seconds and hundreds of MiB.
    let rounds: RefCell<Option<Rounds>> = RefCell::new(None);
    let mut group = c.benchmark_group("keyed_admission");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    for (i, contender) in Contender::ALL.iter().enumerate() {
        group.bench_function(contender.id(), |b| {
            let mut rounds = rounds.borrow_mut();
            let rounds = rounds.get_or_insert_with(Rounds::new);
            b.iter_custom(|iters| {
                in_rounds(iters, u64::from(BATCH), |needed| rounds.run(needed, i))
            })
        });
    }
    group.finish();
    if let Some(rounds) = rounds.into_inner() {
        rounds.report();
    }
}
