//! The criterion group `layer_paired`: every contender in short interleaved
//! rounds, and the per-round cost beyond the no-op layer.
//!
//! A round sends [`BATCH`] requests to each contender in turn (one to each
//! huge-header contender, see [`batch`]), starting one
//! contender further along the list than the previous round, and notes each
//! contender's nanoseconds per request. Slow phases of a shared machine
//! (another process, frequency changes, a timer interrupt) then hit a whole
//! round, or one contender in a rare round, instead of a whole run, and the
//! difference to the no-op layer *within* a round cancels them.
//!
//! Each benchmark of the group (one per contender) runs whole rounds and
//! hands criterion that contender's share of the time, so criterion's
//! figures for this group are interleaved ones. Every round, whichever
//! benchmark ran it, goes into the table printed after the group:
//!
//! - per contender, the median over rounds of its ns per request and of its
//!   difference to the no-op layer in the same round (the no-op layer sent
//!   the same request: `noop_layer_peer_ip` for the peer-address
//!   contenders), with the quartiles of
//!   that difference (how much single rounds vary; the median of tens of
//!   thousands of rounds varies far less within a run, more between runs);
//! - for our contenders, their cost beyond the no-op layer relative to
//!   tower_governor's with the same kind of key (global, the header for
//!   `ours_header` and the compact header contenders, the peer's address
//!   for `ours_peer_ip` and the compact peer contenders): the ratio of the
//!   two medians, and the median of the per-round ratios;
//! - for `ours_global_breaker`, `ours_global_system` and
//!   `ours_global_limit_per`, the median per-round difference to
//!   `ours_global` (the cost of one closed breaker, of a system rule, of a
//!   second window per key), and for the compact contenders on a
//!   `CachedClock` the difference to the same layer on the system clock,
//!   each with its quartiles;
//! - for the huge header, our header-keyed layer's ns per request relative
//!   to the bare router's with the same request (ratio of the medians,
//!   median of the per-round ratios), and the median per-round difference.
//!
//! Nothing is printed when no benchmark of the group ran (another filter,
//! `--list`).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use axum::Router;
use criterion::{Criterion, Throughput};

use super::{runtime, serve_one, Contender};
use crate::report::{in_rounds, print_ratio, print_rows, ratios, Quartiles, RoundTable};

/// Requests per contender per round: long enough that the two clock reads
/// around it cost under a nanosecond per request, short enough (tens of
/// microseconds) that most rounds see no interruption at all.
const BATCH: u32 = 32;

/// Requests to `contender` per round: [`BATCH`], or one for the
/// huge-header contenders, whose requests take tens of microseconds each
/// (32 of them would stretch a round, and the time between the contenders
/// it compares, a hundredfold).
fn batch(contender: Contender) -> u32 {
    if contender.huge_header() {
        1
    } else {
        BATCH
    }
}

const N: usize = Contender::ALL.len();

/// The apps and every round run so far.
struct Rounds {
    apps: Vec<Router>,
    /// Blocks allocated between the apps (see [`HeapPadding`]), kept as
    /// long as the apps are.
    _padding: Vec<Vec<u8>>,
    /// Where the next round starts in [`Contender::ALL`].
    next_start: usize,
    /// Per round, per contender (in [`Contender::ALL`] order): ns per request.
    ns: RoundTable<N>,
}

impl Rounds {
    /// Runs `rounds` rounds; returns the time spent in contender `of`.
    async fn run(&mut self, rounds: u64, of: usize) -> Duration {
        let mut spent = Duration::ZERO;
        for _ in 0..rounds {
            let start = self.next_start;
            self.next_start = (start + 1) % N;
            let mut ns = [0.0; N];
            for k in 0..N {
                let i = (start + k) % N;
                let contender = Contender::ALL[i];
                let requests = batch(contender);
                let app = &mut self.apps[i];
                let begin = Instant::now();
                for _ in 0..requests {
                    serve_one(contender, app).await;
                }
                let elapsed = begin.elapsed();
                ns[i] = elapsed.as_nanos() as f64 / f64::from(requests);
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
        // Each beyond the no-op layer sent the same request (see
        // [`Contender::baseline`]).
        let rows = self.ns.rows(Contender::ALL.iter().map(|c| c.id()), |i| {
            index(Contender::ALL[i].baseline())
        });
        let heading = format!(
            "layer_paired: {} rounds of {BATCH} requests per contender (1 per huge-header \
             contender), rotated order",
            self.ns.len()
        );
        print_rows(&heading, "beyond no-op", 24, &rows);
        for (ours, governor) in [
            (Contender::OursGlobal, Contender::TowerGovernor),
            (Contender::OursGlobalTrackBody, Contender::TowerGovernor),
            (Contender::OursMatchedPath, Contender::TowerGovernor),
            (Contender::OursHeader, Contender::TowerGovernorHeader),
            (Contender::OursHeader, Contender::TowerGovernor),
            (Contender::OursPeerIp, Contender::TowerGovernorPeerIp),
            (Contender::OursCompactHeader, Contender::TowerGovernorHeader),
            (Contender::OursCompactPeerIp, Contender::TowerGovernorPeerIp),
            (
                Contender::OursCompactHeaderCachedClock,
                Contender::TowerGovernorHeader,
            ),
            (
                Contender::OursCompactPeerIpCachedClock,
                Contender::TowerGovernorPeerIp,
            ),
        ] {
            print_ratio(&rows[index(ours)], &rows[index(governor)], "no-op");
        }
        // What one closed breaker, a system rule and a second window
        // (`limit_per`) add to the same layer, and what the cached clock
        // saves the compact layers, round by round.
        for (added, to) in [
            (Contender::OursGlobalBreaker, Contender::OursGlobal),
            (Contender::OursGlobalSystem, Contender::OursGlobal),
            (Contender::OursGlobalLimitPer, Contender::OursGlobal),
            (
                Contender::OursCompactHeaderCachedClock,
                Contender::OursCompactHeader,
            ),
            (
                Contender::OursCompactPeerIpCachedClock,
                Contender::OursCompactPeerIp,
            ),
        ] {
            let difference = Quartiles::of(self.ns.beyond(index(added), index(to)));
            println!(
                "{} - {}: {:.1} ns (median per-round difference) [{:.1}, {:.1}]",
                added.id(),
                to.id(),
                difference.median,
                difference.lower,
                difference.upper
            );
        }
        let bare = self.ns.column(index(Contender::BareHugeHeader));
        let ours = self.ns.column(index(Contender::OursHeaderHugeHeader));
        let (of_medians, per_round) = ratios(&ours, &bare);
        let difference = self.ns.beyond(
            index(Contender::OursHeaderHugeHeader),
            index(Contender::BareHugeHeader),
        );
        println!(
            "{} / {}: {of_medians:.2} (ratio of medians), {per_round:.2} (median \
             per-round ratio), {:.1} ns more (median per-round difference)",
            Contender::OursHeaderHugeHeader.id(),
            Contender::BareHugeHeader.id(),
            Quartiles::of(difference).median
        );
    }
}

fn index(contender: Contender) -> usize {
    Contender::ALL
        .iter()
        .position(|&c| c == contender)
        .expect("every contender is in ALL")
}

/// With `LAYER_PAIRED_HEAP_SEED` set to a number, a block of 16 to 4 096
/// bytes, its size drawn from that seed, is allocated before each app is
/// built, so that every contender's state lies elsewhere on the heap than
/// in a run without it: where the heap puts each contender's state moves
/// its figures as much as where the linker puts its code does
/// (`perf/layouts.sh` varies both). Unset, nothing is allocated.
struct HeapPadding {
    state: Option<u64>,
}

impl HeapPadding {
    fn from_env() -> HeapPadding {
        let state = std::env::var("LAYER_PAIRED_HEAP_SEED").ok().map(|seed| {
            seed.parse::<u64>()
                .expect("LAYER_PAIRED_HEAP_SEED: a whole number")
        });
        HeapPadding { state }
    }

    /// The next block, if a seed was given (SplitMix64 draws its size).
    fn next_block(&mut self) -> Option<Vec<u8>> {
        let state = self.state.as_mut()?;
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let size = 16 * (1 + (z % 256) as usize);
        Some(vec![1u8; size])
    }
}

pub(crate) fn bench(c: &mut Criterion) {
    let runtime = runtime();
    let mut heap = HeapPadding::from_env();
    let mut padding = Vec::new();
    let mut apps = Vec::new();
    for contender in Contender::ALL {
        padding.extend(heap.next_block());
        apps.push(contender.app(&runtime));
    }
    let rounds = RefCell::new(Rounds {
        apps,
        _padding: padding,
        next_start: 0,
        ns: RoundTable::new(),
    });
    let mut group = c.benchmark_group("layer_paired");
    group
        .throughput(Throughput::Elements(1))
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    for (i, contender) in Contender::ALL.iter().enumerate() {
        group.bench_function(contender.id(), |b| {
            b.iter_custom(|iters| {
                in_rounds(iters, u64::from(batch(*contender)), |needed| {
                    runtime.block_on(rounds.borrow_mut().run(needed, i))
                })
            })
        });
    }
    group.finish();
    rounds.into_inner().report();
}
