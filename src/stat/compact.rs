//! [`CompactWindow`]: one key's admission state in 28 bytes, for the compact
//! key tier. It gives the same decisions, retry times and reset times as a
//! full [`StatisticNode`](super::StatisticNode) of the same shape fed the
//! same requests at the same clock readings, and keeps only what admission
//! needs: the passes of the buckets that can still count, the blocks of the
//! newest bucket, and where the newest bucket lies on the clock.
//!
//! # Layout
//!
//! Seven 32-bit words (align 4, so a table slot of key, state byte and
//! window packs without padding); all-zero bytes are an empty window:
//!
//! ```text
//! head   [LOCKED:1][tag:15][pass:16]      the compare-and-swap word
//! stamp  [stamp_hi:16][block:16]
//! ring   5 words = 10 x u16               final passes of older buckets
//! ```
//!
//! - `pass`: admitted requests in the newest bucket (at most 65 535, which
//!   [`COMPACT_MAX_LIMIT`] keeps it under).
//! - `block`: blocks recorded in the newest bucket, saturating at 65 535.
//! - `tag` and `stamp_hi` together form a 31-bit *stamp* saying where the
//!   newest bucket starts on the clock: the bucket's number modulo
//!   `2^q - 1`, plus one (never 0, so a zero stamp means "never opened"), in
//!   the low `q` bits, and the start's offset within its bucket length (the
//!   phase, see "Clocks") above them, where `q = 31 - ceil(log2(bucket_ms))`.
//!   The stamp therefore knows the start modulo a period `P = bucket_ms x
//!   (2^q - 1)` of 2^30 to 2^31 ms (12 to 24 days); a reading is placed
//!   within half a period of it (see "What differs").
//!   The tag, the stamp's low 15 bits, changes whenever the newest bucket
//!   does, which is what lets the head alone validate a decision.
//! - `ring[i]`: the final passes of the bucket `i + 1` buckets before the
//!   newest, for `i < sample_count`. The last one, `sample_count` buckets
//!   back, has just left the window; a strict window counts it.
//!
//! # Clocks
//!
//! The window works on the clock's own readings: the newest bucket's start
//! is kept as a clock time, and buckets are `bucket_ms` long from there on.
//! A full node instead keeps a *skew* that it adds to the clock when the
//! clock steps back further than a window (`StatisticNode::effective_now`),
//! and starts its buckets at multiples of `bucket_ms` of that skewed time.
//! Both describe the same thing: where the skew of a full node is `S` and
//! its newest bucket starts at `N`, this window's newest bucket starts at
//! `N - S` on the clock, its buckets are the full node's shifted by `S`, and
//! a step back beyond a window moves the newest start to the reading
//! ("re-anchors" it) where the full node raises its skew. Every figure the
//! two give (decisions, waits, resets, counts) depends only on differences
//! of times, so they agree; the times `effective_now` returns differ by the
//! skew, and are only ever handed back to this window.
//!
//! # Concurrency
//!
//! - **Admission** (one compare-and-swap): load `head` (`Acquire`); if the
//!   request falls in the newest bucket, sum the ring's passes of the window
//!   (loads with `Acquire`), decide `window_pass + 1 <= limit`, and swap in
//!   `pass + 1` (`AcqRel`). A failed swap that finds the same tag re-decides
//!   with the new count; anything else starts over.
//! - **Rotation** (once per bucket per key, by the first request that finds
//!   the clock past the newest bucket): swap `head` to itself with `LOCKED`
//!   set (`Acquire`), shift the ring (`Release` stores), store the stamp
//!   (`Release`) and unlock by storing the new head (`Release`), with the
//!   rotating request's own pass already in it. Callers that find `LOCKED`
//!   back off (`sync::backoff`).
//! - **Why the head validates the ring.** The ring and the stamp change only
//!   under the lock, and taking the lock changes the head. A reader that
//!   loaded the head `h` and then read a ring or stamp value written by a
//!   later rotation read it with `Acquire` from a `Release` store that the
//!   rotation's locking swap precedes, so that swap happens-before
//!   everything the reader does next: its own compare-and-swap (or its
//!   second load of the head, for reads) then finds `LOCKED` or a later
//!   head, never `h`, and fails. A decision that succeeds was therefore
//!   taken on the ring and stamp of the head it replaced, as in a sequence
//!   lock. A reader that loaded a head stored by a rotation sees that
//!   rotation's ring and stamp (the unlocking store is `Release`). Every
//!   rotation moves the tag on, and a tag comes back only 2^15 buckets
//!   later (or a stamp period later, if that is sooner): only a caller
//!   stalled that long (33 s with 1 ms buckets, 55 min with 100 ms ones),
//!   finding the head back at the very value it loaded, count included,
//!   could succeed on stale reads. (A full node's round tags have the same
//!   kind of bound: 65 534 rotations of one slot.) A re-anchoring (see
//!   "Clocks") may by chance keep the tag, but it changes no count, so a
//!   decision it overlaps was taken on the same buckets.
//! - **Reads** (counts, waits, idleness) load the head, the stamp and the
//!   ring (`Acquire`), then the head again, and retry unless the tag is the
//!   same and unlocked: a consistent view, as above.
//! - **Blocks** are added to the stamp word by compare-and-swap, checked
//!   against the head as reads are. A block racing a rotation counts in the
//!   bucket it was recorded in (and leaves with it) or in the new one; the
//!   rotation replaces the stamp with a plain store, which loom models as
//!   a `swap` (a plain `store` racing a read-modify-write is mis-modelled
//!   by loom 0.7; see `sync.rs`). A re-anchoring keeps the bucket, so it
//!   rewrites only the stamp half, by compare-and-swap, and keeps every
//!   block added meanwhile.
//!
//! # What differs from a full key
//!
//! - `block` in [`window_counts`](CompactWindow::window_counts) is the
//!   newest bucket's blocks (saturating at 65 535), not the window's: there
//!   is no room for per-bucket blocks. Passes are the window's, exactly.
//! - A reading more than half a period (at least 2^29 ms, 6.2 days) away
//!   from the newest bucket is placed on the wrong side of it: a key left
//!   untouched that long may be taken for one whose clock stepped back
//!   (its stale passes then count for one more window, as after a real step
//!   back: stricter, never looser), and a clock stepping back that far is
//!   taken for a jump forward (the window is then empty, where a full node
//!   would count its passes for one more window).
//! - A request whose time came from [`effective_now`](CompactWindow::effective_now)
//!   before another request re-anchored the window (a clock step back of
//!   more than a window, racing it) is decided as if its clock had jumped
//!   ahead by the step: it may open a new bucket. A full node has the same
//!   race between reading the clock and `effective_now` (a reading from
//!   before the step, skewed by the raised skew, lands ahead of the newest
//!   bucket); here it extends to the decision.
//! - A bucket's passes stop at 65 535: a limit above
//!   [`COMPACT_MAX_LIMIT`] refuses once the newest bucket holds that many.
//! - Readings are clamped at 2^62 ms (146 million years) of the clock,
//!   where a full node clamps its skewed time: after a step back, the two
//!   clamp at different readings.

use super::leap_array::MAX_TIME;
use crate::error::ConfigError;
use crate::flow::{Decision, Pass, Reason, Refusal};
use crate::sync::{backoff, store_racing_rmw, AtomicU32, Ordering};

/// The most buckets a compact window has.
pub(crate) const COMPACT_MAX_BUCKETS: usize = 10;

/// The highest limit a compact window enforces (a bucket's passes are 16
/// bits).
pub(crate) const COMPACT_MAX_LIMIT: u64 = 65_535;

/// The longest bucket a compact window supports: the stamp needs at least
/// two bits of bucket number beside the phase.
const MAX_BUCKET_MS: u64 = 1 << 29;

/// The window's shape: `sample_count` buckets over `interval_ms`, and
/// whether admission also counts the bucket that has just left the window;
/// made by [`new`](Self::new), which works out the arithmetic every
/// request of the window needs once (its fields are read-only for that
/// reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompactShape {
    pub(crate) sample_count: usize,
    pub(crate) interval_ms: u64,
    pub(crate) strict: bool,
    grid: Grid,
}

impl CompactShape {
    /// The shape of `sample_count` buckets over `interval_ms`. Any values
    /// make a shape; [`validate`](Self::validate) says whether a compact
    /// window can have it.
    pub(crate) const fn new(sample_count: usize, interval_ms: u64, strict: bool) -> CompactShape {
        CompactShape {
            sample_count,
            interval_ms,
            strict,
            grid: Grid::new(
                bucket_ms(sample_count, interval_ms),
                sample_count,
                strict,
                interval_ms,
            ),
        }
    }

    /// Length of one bucket.
    #[inline]
    pub(crate) fn bucket_ms(&self) -> u64 {
        bucket_ms(self.sample_count, self.interval_ms)
    }
}

/// Length of one bucket of `sample_count` over `interval` (0 for a shape
/// with no buckets, which `validate` refuses).
const fn bucket_ms(sample_count: usize, interval: u64) -> u64 {
    // A constant divisor per arm is a multiplication, not a division.
    {
        match sample_count {
            1 => interval,
            2 => interval / 2,
            3 => interval / 3,
            4 => interval / 4,
            5 => interval / 5,
            6 => interval / 6,
            7 => interval / 7,
            8 => interval / 8,
            9 => interval / 9,
            10 => interval / 10,
            0 => 0,
            n => interval / n as u64,
        }
    }
}

impl CompactShape {
    /// Checks that a compact window can have this shape.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the setting: `sample_count` outside
    /// `1..=10`, `interval_ms` 0 or not a multiple of `sample_count`, or
    /// buckets longer than 2^29 ms.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.sample_count == 0 || self.sample_count > COMPACT_MAX_BUCKETS {
            return Err(ConfigError::new(
                "sample_count",
                "must be between 1 and 10 for a compact layer",
                format!("got {}", self.sample_count),
            ));
        }
        super::validate_window(self.sample_count, self.interval_ms)?;
        if self.bucket_ms() > MAX_BUCKET_MS {
            return Err(ConfigError::new(
                "interval_ms",
                "must be at most 2^29 ms per bucket for a compact layer",
                format!(
                    "got {} ms over {} buckets",
                    self.interval_ms, self.sample_count
                ),
            ));
        }
        Ok(())
    }
}

/// Remainders by a divisor fixed when a shape is made, as a multiplication
/// and a shift: a request's decode takes one remainder by the period, and
/// a 64-bit division costs tens of cycles where a multiplication costs a
/// few.
///
/// Granlund and Montgomery, "Division by invariant integers using
/// multiplication" (1994), theorem 4.2, for dividends of `N = 63` bits
/// (every time is at most `MAX_TIME`, 2^62): with `l = ceil(log2 d)` and
/// `m = ceil(2^(N + l) / d)`, `floor(n / d) = floor(n * m / 2^(N + l))`
/// for every `n < 2^N`, since `m * d - 2^(N + l) < d <= 2^l`. `m` is
/// below 2^64 for every `d` below 2^63, and the product fits in 128 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Divisor {
    d: u64,
    magic: u64,
    /// `l`: the product is shifted right by `N` (a constant), then by this.
    l: u32,
}

impl Divisor {
    /// Dividend bits covered.
    const N: u32 = 63;

    /// `d` in `1..2^63`.
    const fn new(d: u64) -> Divisor {
        let l = 64 - (d - 1).leading_zeros();
        let magic = (1u128 << (Self::N + l)).div_ceil(d as u128);
        Divisor {
            d,
            magic: magic as u64,
            l,
        }
    }

    /// `n / d`, for `n < 2^63`. The product is below 2^127, so shifted
    /// right by the constant `N` it fits in 64 bits: one double-word shift
    /// by a constant and one shift of a word by `l`, where a shift of the
    /// 128-bit product by `N + l` would be a variable double-word shift
    /// with its branchless fix-ups.
    #[inline]
    fn quotient(&self, n: u64) -> u64 {
        let high = ((u128::from(n) * u128::from(self.magic)) >> Self::N) as u64;
        high >> self.l
    }

    /// `n % d`, for `n < 2^63`.
    #[inline]
    fn rem(&self, n: u64) -> u64 {
        n - self.quotient(n) * self.d
    }
}

// --- the words -------------------------------------------------------------

/// `head`: a rotation holds the window.
const LOCKED: u32 = 1 << 31;
/// `head`: the newest bucket's passes; `stamp`: its blocks.
const COUNT_MASK: u32 = 0xFFFF;
const TAG_SHIFT: u32 = 16;
const TAG_BITS: u32 = 15;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
/// `head` without its count: lock bit and tag.
const STATE_MASK: u32 = !COUNT_MASK;
const RING_WORDS: usize = COMPACT_MAX_BUCKETS / 2;

#[inline]
fn stamp_of(head: u32, stamp: u32) -> u32 {
    ((head >> TAG_SHIFT) & TAG_MASK) | ((stamp >> TAG_SHIFT) << TAG_BITS)
}

#[inline]
fn head_word(stamp: u32, pass: u32) -> u32 {
    ((stamp & TAG_MASK) << TAG_SHIFT) | pass
}

#[inline]
fn stamp_word(stamp: u32, block: u32) -> u32 {
    ((stamp >> TAG_BITS) << TAG_SHIFT) | block
}

/// The shape's arithmetic, with the stamp's encoding: worked out once, when
/// the shape is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grid {
    len: u64,
    sample_count: usize,
    strict: bool,
    interval: u64,
    /// Bits of bucket number in a stamp.
    q: u32,
    /// Bucket numbers are kept modulo this (plus one).
    rounds: u64,
    /// `len * rounds`: a stamp knows the newest start modulo this.
    period: u64,
    /// Remainders by `period`, without a division.
    by_period: Divisor,
    /// Quotients by `len` and remainders by `rounds` (a rotation's
    /// arithmetic), without a division.
    by_len: Divisor,
    by_rounds: Divisor,
    /// Per ring word, the halves admission counts: both for entries below
    /// [`depth`](Self::depth), none past it (see
    /// [`CompactWindow::window_ring_sum`]).
    depth_masks: [u32; RING_WORDS],
}

impl Grid {
    const fn new(bucket_ms: u64, sample_count: usize, strict: bool, interval: u64) -> Grid {
        let len = if bucket_ms == 0 { 1 } else { bucket_ms };
        let phase_bits = 64 - (len - 1).leading_zeros();
        let q = 31u32.saturating_sub(phase_bits);
        let q = if q < 2 { 2 } else { q };
        let rounds = (1u64 << q) - 1;
        let sample_count = if sample_count == 0 {
            1
        } else if sample_count > COMPACT_MAX_BUCKETS {
            COMPACT_MAX_BUCKETS
        } else {
            sample_count
        };
        let period = len * rounds;
        let mut grid = Grid {
            len,
            sample_count,
            strict,
            interval,
            q,
            rounds,
            period,
            by_period: Divisor::new(period),
            by_len: Divisor::new(len),
            by_rounds: Divisor::new(rounds),
            depth_masks: [0; RING_WORDS],
        };
        let depth = grid.depth();
        let mut word = 0;
        while word < RING_WORDS {
            // Ring entries `2 * word` (low half) and `2 * word + 1` (high).
            grid.depth_masks[word] = if depth > 2 * word + 1 {
                u32::MAX
            } else if depth > 2 * word {
                0xFFFF
            } else {
                0
            };
            word += 1;
        }
        grid
    }

    #[inline]
    fn of(shape: &CompactShape) -> &Grid {
        &shape.grid
    }

    /// How many buckets before the newest admission counts: the window's
    /// older buckets, and the one that has just left it on a strict window.
    #[inline]
    const fn depth(&self) -> usize {
        self.sample_count - 1 + self.strict as usize
    }

    /// The stamp of a bucket starting at `start` (at most `MAX_TIME`) on
    /// the clock (never 0).
    #[inline]
    fn encode(&self, start: u64) -> u32 {
        debug_assert!(start <= MAX_TIME);
        let bucket = self.by_len.quotient(start);
        let number = self.by_rounds.rem(bucket) + 1;
        let phase = start - bucket * self.len;
        ((number | (phase << self.q)) & 0x7FFF_FFFF) as u32
    }

    /// The stamp of the bucket holding `now` (at most `MAX_TIME`) on the
    /// grid of whole bucket lengths from the clock's 0, phase 0: where a
    /// window's buckets lie unless a clock step back re-anchored it. A
    /// window whose stamp is this one has its newest bucket at
    /// `now - now % len`, the bucket of `now` (what [`decode`](Self::decode)
    /// gives for it): the common test of a request, with one product and
    /// one remainder instead of a decode.
    #[inline]
    fn aligned_stamp(&self, now: u64) -> u32 {
        debug_assert!(now <= MAX_TIME);
        let number = self.by_rounds.rem(self.by_len.quotient(now)) + 1;
        // `number` is at most `rounds` (below 2^31), the phase 0.
        number as u32
    }

    /// Where the bucket of `stamp` starts, placed within half a period of
    /// `now`; `None` for the zero stamp of a window never opened.
    #[inline]
    fn decode(&self, stamp: u32, now: u64) -> Option<u64> {
        let stamp = u64::from(stamp);
        let number = stamp & ((1 << self.q) - 1);
        if number == 0 {
            return None;
        }
        // The one division of a request's decode is `now % period`: an
        // encoded stamp's value is below the period, and the difference of
        // two values below it is below twice it, so the other two remainders
        // are a comparison (any other stamp still takes the division).
        let value = (number - 1) * self.len + (stamp >> self.q);
        let value = if value < self.period {
            value
        } else {
            value % self.period
        };
        let now = now.min(MAX_TIME);
        let behind = self.by_period.rem(now) + self.period - value;
        let behind = if behind < self.period {
            behind
        } else {
            behind - self.period
        };
        if behind <= self.period / 2 && behind <= now {
            Some(now - behind)
        } else {
            Some(now + (self.period - behind))
        }
    }

    /// The start of the bucket holding `t` on the grid of `newest`, for
    /// `newest <= t <= MAX_TIME`.
    #[inline]
    fn advance(&self, newest: u64, t: u64) -> u64 {
        newest + self.by_len.quotient(t - newest) * self.len
    }
}

/// One key's admission state (module docs). All-zero bytes are an empty
/// window.
#[derive(Debug)]
pub(crate) struct CompactWindow {
    /// `[LOCKED:1][tag:15][pass:16]`. Every decision is a compare-and-swap
    /// of this word; taking the rotation lock sets `LOCKED`, so any
    /// decision whose reads a rotation overlapped fails its swap (module
    /// docs, "Why the head validates the ring"). `Acquire` loads, `AcqRel`
    /// swaps, `Release` unlocking store: a reader of a head sees the ring
    /// and stamp stored before it.
    head: AtomicU32,
    /// `[stamp_hi:16][block:16]`. The stamp half changes only under the
    /// lock (`swap`, `Release`), the block half by compare-and-swap at any
    /// time; loads are `Acquire`.
    stamp: AtomicU32,
    /// Two 16-bit pass counts per word, entry `i` in word `i / 2`, low half
    /// first: the final passes of the bucket `i + 1` buckets before the
    /// newest. Written only under the lock (`Release`), read with
    /// `Acquire`, validated by the head.
    ring: [AtomicU32; RING_WORDS],
}

/// A consistent read of the window.
#[derive(Debug, Clone, Copy)]
struct View {
    /// Start of the newest bucket on the clock; `None` if never opened.
    newest: Option<u64>,
    /// `passes[0]`: the newest bucket's; `passes[i]`: the bucket `i`
    /// buckets before it.
    passes: [u16; COMPACT_MAX_BUCKETS + 1],
    block: u16,
}

/// What [`CompactWindow::in_newest`] decided.
enum InNewest {
    Passed(u64),
    Refused(View, u64),
    Changed,
}

/// What [`CompactWindow::swap_in_pass`] did.
enum Swapped {
    /// Recorded, with the passes it leaves in the window.
    Passed(u64),
    /// No room: the head and the window's passes it was judged on.
    Full(u32, u64),
    /// A rotation intervened.
    Changed,
}

/// The passes of the first `entries` entries of a ring read whole.
#[inline]
fn ring_passes(ring: &[u16; COMPACT_MAX_BUCKETS], entries: usize) -> u64 {
    ring[..entries].iter().map(|&p| u64::from(p)).sum()
}

impl View {
    /// Where `at` lies: how many buckets after the newest its bucket is
    /// (negative when before it), and where its bucket starts; `None` with
    /// nothing opened.
    fn locate(&self, grid: &Grid, at: u64) -> Option<(i128, i128)> {
        let newest = self.newest?;
        let at = at.min(MAX_TIME);
        let len = i128::from(grid.len);
        let back = if at >= newest {
            // The common case, without a 128-bit division.
            i128::from(grid.by_len.quotient(at - newest))
        } else {
            (i128::from(at) - i128::from(newest)).div_euclid(len)
        };
        Some((back, i128::from(newest) + back * len))
    }

    /// Passes of the bucket `offset` buckets before the one holding `at`,
    /// where that one is `back` buckets after the newest.
    #[inline]
    fn pass_at(&self, back: i128, offset: usize) -> u64 {
        let i = offset as i128 - back;
        if (0..=COMPACT_MAX_BUCKETS as i128).contains(&i) {
            u64::from(self.passes[i as usize])
        } else {
            0
        }
    }

    /// Passes counted at `at` over the `depth + 1` newest buckets of its
    /// window.
    fn sum(&self, grid: &Grid, at: u64, depth: usize) -> u64 {
        match self.locate(grid, at) {
            None => 0,
            Some((back, _)) => (0..=depth).map(|o| self.pass_at(back, o)).sum(),
        }
    }

    /// Milliseconds from `at` until `n` more passes fit under `limit`, as
    /// `flow::retry_on_clock` computes it for a full node: the admission
    /// buckets at `at` (led, on a strict window, by the one that has just
    /// left it) through `wait_for_quota`, plus `behind` unless it is 0.
    fn retry(&self, grid: &Grid, at: u64, behind: u64, n: u64, limit: u64) -> Option<u64> {
        let depth = grid.depth();
        let span = grid.interval + if grid.strict { grid.len } else { 0 };
        let mut buckets = [(0u64, 0u64); COMPACT_MAX_BUCKETS + 1];
        let at = at.min(MAX_TIME);
        // Times shifted by `shift`, so that a bucket before time 0 on the
        // clock (after a re-anchoring near 0) still has a start; the wait
        // depends only on differences.
        let shift = (depth as u64 + 1) * grid.len;
        if let Some((back, start)) = self.locate(grid, at) {
            for (slot, offset) in buckets.iter_mut().zip((0..=depth).rev()) {
                let begins = start + i128::from(shift) - offset as i128 * i128::from(grid.len);
                *slot = (
                    u64::try_from(begins).unwrap_or(0),
                    self.pass_at(back, offset),
                );
            }
        }
        let ms = crate::flow::wait_for_quota(
            buckets[..=depth].iter().copied(),
            at + shift,
            span,
            n,
            limit,
        )?;
        Some(if ms == 0 {
            0
        } else {
            ms.saturating_add(behind)
        })
    }
}

impl Default for CompactWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl CompactWindow {
    /// An empty window (all zero bits).
    #[cfg(not(loom))]
    pub(crate) const fn new() -> Self {
        CompactWindow {
            head: AtomicU32::new(0),
            stamp: AtomicU32::new(0),
            ring: [
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
                AtomicU32::new(0),
            ],
        }
    }

    /// An empty window (loom's atomics have no `const` constructor).
    #[cfg(loom)]
    pub(crate) fn new() -> Self {
        CompactWindow {
            head: AtomicU32::new(0),
            stamp: AtomicU32::new(0),
            ring: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// As `StatisticNode::effective_now`: the time to decide at for a
    /// request whose clock reads `now`. A reading behind the newest bucket
    /// by at most a window is moved forward to that bucket's start (it
    /// waits `lag` on the clock); one behind it by more re-anchors the
    /// newest bucket at the reading (module docs, "Clocks"), as a full node
    /// raises its skew, and is returned as it is.
    pub(crate) fn effective_now(&self, shape: &CompactShape, now: u64) -> u64 {
        self.effective_now_moved(shape, now).0
    }

    /// [`effective_now`](Self::effective_now), and how far back this call
    /// re-anchored the newest bucket (0 if it did not): a key's further
    /// windows are moved back as far ([`shift_back`](Self::shift_back)), as
    /// a full key's further windows keep running with its first window's
    /// skew.
    pub(crate) fn effective_now_moved(&self, shape: &CompactShape, now: u64) -> (u64, u64) {
        let grid = Grid::of(shape);
        let mut round = 0;
        loop {
            let Some((head, stamp)) = self.stamps() else {
                backoff(&mut round);
                continue;
            };
            let Some(newest) = grid.decode(stamp_of(head, stamp), now) else {
                return (now, 0);
            };
            if newest <= now {
                return (now, 0);
            }
            if newest - now <= grid.interval {
                return (newest, 0);
            }
            if self.reanchor(grid, head, now) {
                return (now, newest - now);
            }
            backoff(&mut round);
        }
    }

    /// Moves the newest bucket's start `by` milliseconds back on the clock,
    /// keeping every count (as a re-anchoring does), for a further window
    /// of a key whose first window was just re-anchored that far
    /// ([`effective_now_moved`](Self::effective_now_moved)): the key's
    /// windows keep their places relative to each other, as a full key's
    /// do under its skew. `near` is a reading near the newest bucket (the
    /// first window's newest start before the move). A start that would
    /// fall before time 0 on the clock is kept at its phase in the first
    /// bucket length of the clock instead.
    pub(crate) fn shift_back(&self, shape: &CompactShape, by: u64, near: u64) {
        let grid = Grid::of(shape);
        let mut round = 0;
        loop {
            // Acquire: as in `decide`.
            let head = self.head.load(Ordering::Acquire);
            if head & LOCKED != 0 {
                backoff(&mut round);
                continue;
            }
            let Some(head) = self.lock(head) else {
                backoff(&mut round);
                continue;
            };
            // Relaxed: see `rotated`.
            let stamp = self.stamp.load(Ordering::Relaxed);
            let Some(newest) = grid.decode(stamp_of(head, stamp), near) else {
                self.unlock(head);
                return;
            };
            let moved = newest.checked_sub(by).unwrap_or(newest % grid.len);
            // The bucket and its counts stay; only its start moves.
            self.restamp_locked(head, grid.encode(moved));
            return;
        }
    }

    /// As `StatisticNode::lag`: how long the clock, reading `now`, must run
    /// to reach `at`, a result of [`effective_now`](Self::effective_now) at
    /// `now`.
    #[inline]
    pub(crate) fn lag(&self, _shape: &CompactShape, now: u64, at: u64) -> u64 {
        at.saturating_sub(now)
    }

    /// One request at `at` (from [`effective_now`](Self::effective_now),
    /// `behind` its [`lag`](Self::lag)) against `limit`: the decision
    /// `flow::window` gives a full key with the same history. A pass is
    /// recorded in the same compare-and-swap; a refusal records nothing
    /// (see [`record_block`](Self::record_block)) and says `Overflow` when
    /// `overflow`, else `Window`.
    pub(crate) fn decide(
        &self,
        shape: &CompactShape,
        (at, behind): (u64, u64),
        limit: u64,
        overflow: bool,
    ) -> Decision<Pass> {
        self.decide_placed(shape, (at, behind), limit, overflow).0
    }

    /// [`decide`](Self::decide), with the start of the bucket a pass landed
    /// in (`None` for a refusal): the newest bucket of the moment, which is
    /// the bucket of `at` unless a rotation moved the window past it in the
    /// meantime (the pass then lands in the newest bucket, as a late
    /// caller's does). [`give_back`](Self::give_back) takes it.
    pub(crate) fn decide_placed(
        &self,
        shape: &CompactShape,
        (at, behind): (u64, u64),
        limit: u64,
        overflow: bool,
    ) -> (Decision<Pass>, Option<u64>) {
        let grid = Grid::of(shape);
        // Clamped as the full node clamps its buckets; the rotation places
        // `at` clamped too, so the two always agree.
        let at = at.min(MAX_TIME);
        let refuse = |view: &View, window_pass: u64| {
            Decision::Block(Refusal {
                reason: Reason::of_window(overflow),
                retry_after_ms: view
                    .retry(grid, at, behind, 1, limit)
                    .unwrap_or(shape.interval_ms),
                limit,
                window_pass: Some(window_pass),
            })
        };
        let passed = |window_pass: u64| {
            Decision::Pass(Pass {
                limit,
                window_pass: Some(window_pass),
                reset_ms: None,
            })
        };
        let mut round = 0;
        'fresh: loop {
            // Acquire: the ring and stamp of this head's rotation are
            // visible below.
            let head = self.head.load(Ordering::Acquire);
            if head & LOCKED != 0 {
                backoff(&mut round);
                continue;
            }
            let stamp = self.stamp.load(Ordering::Acquire);
            let newest = grid.decode(stamp_of(head, stamp), at);
            let Some(newest) = newest.filter(|&newest| at < newest + grid.len) else {
                // `at` is past the newest bucket (or nothing was opened):
                // rotate, deciding under the lock.
                match self.lock(head) {
                    Some(locked) => match self.rotate(grid, locked, at, limit) {
                        Some((view, before, true)) => return (passed(before + 1), view.newest),
                        Some((view, before, false)) => return (refuse(&view, before), None),
                        None => continue 'fresh,
                    },
                    None => {
                        backoff(&mut round);
                        continue 'fresh;
                    }
                }
            };
            match self.in_newest(grid, head, newest, limit) {
                InNewest::Passed(window_pass) => return (passed(window_pass), Some(newest)),
                InNewest::Refused(view, window_pass) => return (refuse(&view, window_pass), None),
                InNewest::Changed => continue 'fresh,
            }
        }
    }

    /// [`effective_now`](Self::effective_now), [`lag`](Self::lag) and
    /// [`decide`](Self::decide) for a request whose clock reads `now`:
    /// `(at, behind, decision)`, as the three in turn give them. A pass at
    /// a reading at or after the newest bucket's start (the common case,
    /// while the key is under its limit) is decided at once, with
    /// `at = now` (see [`pass_at_once`](Self::pass_at_once)); anything
    /// else (a refusal, a clock behind the newest bucket, a window never
    /// opened) takes the three in turn, out of line.
    #[inline(always)]
    pub(crate) fn admit(
        &self,
        shape: &CompactShape,
        now: u64,
        limit: u64,
        overflow: bool,
    ) -> (u64, u64, Decision<Pass>) {
        match self.pass_at_once(Grid::of(shape), now, limit) {
            Some(window_pass) => (
                now,
                0,
                Decision::Pass(Pass {
                    limit,
                    window_pass: Some(window_pass),
                    reset_ms: None,
                }),
            ),
            None => self.admit_in_turn(shape, now, limit, overflow),
        }
    }

    /// Whether [`admit`](Self::admit) passes a request at `now` at once (see
    /// [`pass_at_once`](Self::pass_at_once); the pass is recorded), for a
    /// caller that needs no more of the decision; `false` records nothing,
    /// and the request is then to be decided by `admit`.
    #[inline(always)]
    pub(crate) fn pass_now(&self, shape: &CompactShape, now: u64, limit: u64) -> bool {
        self.pass_at_once(Grid::of(shape), now, limit).is_some()
    }

    /// [`admit`](Self::admit) for a reading it did not pass at once.
    #[inline(never)]
    fn admit_in_turn(
        &self,
        shape: &CompactShape,
        now: u64,
        limit: u64,
        overflow: bool,
    ) -> (u64, u64, Decision<Pass>) {
        let at = self.effective_now(shape, now);
        let behind = self.lag(shape, now, at);
        (
            at,
            behind,
            self.decide(shape, (at, behind), limit, overflow),
        )
    }

    /// A pass at `now`, if `now` is at or after the newest bucket's start
    /// and the window admits it, with the passes it leaves in the window:
    /// in the newest bucket, recorded by a compare-and-swap of the head;
    /// past its end, in the bucket of `now`, opened by
    /// [`pass_rotating`](Self::pass_rotating). `None` for anything else (a
    /// reading before the newest bucket, a window never opened, a refusal,
    /// a rotation under way or overlapping the reads), which
    /// [`decide`](Self::decide) answers.
    ///
    /// `effective_now` gives `now` itself for a reading at or after the
    /// newest bucket's start, and `decide` at `now` passes in the bucket of
    /// `now` as this does: a pass here is the pass `decide` would record,
    /// and the head's swap (or the rotation lock) validates the reads
    /// (module docs).
    #[inline(always)]
    fn pass_at_once(&self, grid: &Grid, now: u64, limit: u64) -> Option<u64> {
        // Acquire: as in `decide`.
        let head = self.head.load(Ordering::Acquire);
        if head & LOCKED != 0 || now > MAX_TIME {
            return None;
        }
        let stamp = self.stamp.load(Ordering::Acquire);
        let newest_stamp = stamp_of(head, stamp);
        if newest_stamp != grid.aligned_stamp(now) {
            return self.pass_decoded(grid, (head, stamp), now, limit);
        }
        // `now` is in the newest bucket (see `aligned_stamp`).
        debug_assert_eq!(
            grid.decode(newest_stamp, now),
            Some(now - grid.by_len.rem(now))
        );
        self.pass_in_newest(grid, head, limit)
    }

    /// [`pass_at_once`](Self::pass_at_once) for a window whose newest
    /// bucket is not the aligned bucket of `now`: a reading past it (a new
    /// bucket), before it, or on a window a clock step back re-anchored
    /// off the aligned grid. `head` and `stamp` as loaded, unlocked.
    #[inline(never)]
    fn pass_decoded(
        &self,
        grid: &Grid,
        (head, stamp): (u32, u32),
        now: u64,
        limit: u64,
    ) -> Option<u64> {
        let newest = grid.decode(stamp_of(head, stamp), now)?;
        if now < newest {
            return None;
        }
        if now >= newest + grid.len {
            return self.pass_rotating(grid, (head, stamp), newest, now, limit);
        }
        self.pass_in_newest(grid, head, limit)
    }

    /// One pass in the newest bucket, read with the unlocked `head`, if
    /// the window has room (see [`pass_at_once`](Self::pass_at_once)).
    #[inline(always)]
    fn pass_in_newest(&self, grid: &Grid, head: u32, limit: u64) -> Option<u64> {
        match self.swap_in_pass(head, self.window_ring_sum(grid), limit) {
            Swapped::Passed(window_pass) => Some(window_pass),
            Swapped::Full(..) | Swapped::Changed => None,
        }
    }

    /// Records one pass in the newest bucket, as of the unlocked `head`,
    /// with `before` passes in the window's older buckets, against
    /// `limit`: by a compare-and-swap of the head, retried while a failure
    /// finds the same tag (only the count moved). `Full` when the window
    /// has no room, with the head and the passes it was judged on (nothing
    /// swapped: the caller validates its reads); `Changed` when a rotation
    /// intervened.
    #[inline(always)]
    fn swap_in_pass(&self, mut head: u32, before: u64, limit: u64) -> Swapped {
        loop {
            let pass = head & COUNT_MASK;
            let window_pass = before + u64::from(pass);
            if window_pass >= limit || pass >= COUNT_MASK {
                return Swapped::Full(head, window_pass);
            }
            // AcqRel: the pass is ordered after every read it was decided
            // on; a rotation begun since has changed the head, so the swap
            // fails (module docs).
            match self
                .head
                .compare_exchange(head, head + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Swapped::Passed(window_pass + 1),
                Err(actual) if actual & STATE_MASK == head & STATE_MASK => head = actual,
                Err(_) => return Swapped::Changed,
            }
        }
    }

    /// [`pass_at_once`](Self::pass_at_once) for a reading at or past
    /// the end of the newest bucket (starting at `newest`, decoded from
    /// the unlocked `head` and `stamp`): the first request of a new bucket,
    /// and the common case of a client seen less often than a bucket.
    /// Takes the rotation lock, moves the window to the bucket of `now` and
    /// records the pass there, as [`decide`](Self::decide) would, in one
    /// pass over the words. `None`, with nothing changed, if the lock is
    /// not to be had, if a re-anchoring moved the newest bucket since the
    /// read, or if the window refuses (`decide` then rotates and answers
    /// the refusal).
    #[inline(never)]
    fn pass_rotating(
        &self,
        grid: &Grid,
        (head, stamp): (u32, u32),
        newest: u64,
        now: u64,
        limit: u64,
    ) -> Option<u64> {
        let head = self.lock(head)?;
        // Relaxed: see `rotated`. A re-anchoring may keep the tag, so the
        // head alone does not say that `newest` still holds: the stamp's
        // half does, as only a holder of the lock writes it.
        if self.stamp.load(Ordering::Relaxed) >> TAG_SHIFT != stamp >> TAG_SHIFT {
            self.unlock(head);
            return None;
        }
        let ring = self.shifted(grid, head, newest, now);
        let before = ring_passes(&ring, grid.depth());
        if before >= limit {
            self.unlock(head);
            return None;
        }
        self.publish(grid, grid.advance(newest, now), &ring, 1, 0);
        Some(before + 1)
    }

    /// [`ring_sum`](Self::ring_sum) of the entries admission counts
    /// ([`Grid::depth`]), in straight-line code: every word is loaded and
    /// masked, so a pass runs no loop and no branch on the shape. The
    /// words past the depth are read and ignored.
    #[inline(always)]
    fn window_ring_sum(&self, grid: &Grid) -> u64 {
        let mut sum = 0u64;
        for (word, mask) in self.ring.iter().zip(grid.depth_masks) {
            // Acquire: as in `load_ring`.
            let counted = word.load(Ordering::Acquire) & mask;
            sum += u64::from(counted & 0xFFFF) + u64::from(counted >> 16);
        }
        sum
    }

    /// The sum of the ring's first `entries` pass counts, read as
    /// [`load_ring`](Self::load_ring) reads them, without unpacking them.
    #[inline(always)]
    fn ring_sum(&self, entries: usize) -> u64 {
        let mut sum = 0u64;
        let mut last = 0u32;
        for word in self.ring.iter().take(entries.div_ceil(2)) {
            // Acquire: as in `load_ring`.
            last = word.load(Ordering::Acquire);
            sum += u64::from(last & 0xFFFF) + u64::from(last >> 16);
        }
        // An odd count read the high half of its last word too.
        if entries % 2 == 1 {
            sum -= u64::from(last >> 16);
        }
        sum
    }

    /// One request in the newest bucket (starting at `newest`, read with
    /// the unlocked `head`) against `limit`: a pass recorded by a
    /// compare-and-swap of the head, with the passes it leaves in the
    /// window; or a refusal with the view it was decided on and the passes
    /// in the window; or `Changed` if a rotation overlapped the reads.
    #[inline]
    fn in_newest(&self, grid: &Grid, head: u32, newest: u64, limit: u64) -> InNewest {
        let ring = self.load_ring(grid.depth());
        match self.swap_in_pass(head, ring_passes(&ring, grid.depth()), limit) {
            Swapped::Passed(window_pass) => InNewest::Passed(window_pass),
            Swapped::Changed => InNewest::Changed,
            Swapped::Full(head, window_pass) => {
                // A refusal swaps nothing: check that no rotation
                // overlapped the reads (Relaxed after the Acquire loads
                // above, as a sequence lock's second read).
                if self.head.load(Ordering::Relaxed) & STATE_MASK != head & STATE_MASK {
                    return InNewest::Changed;
                }
                let mut passes = [0u16; COMPACT_MAX_BUCKETS + 1];
                passes[0] = (head & COUNT_MASK) as u16;
                passes[1..].copy_from_slice(&ring);
                let view = View {
                    newest: Some(newest),
                    passes,
                    block: 0,
                };
                InNewest::Refused(view, window_pass)
            }
        }
    }

    /// Records one block at `at`, in the newest bucket (opening the bucket
    /// of `at` first if `at` is past it, as a full node does).
    pub(crate) fn record_block(&self, shape: &CompactShape, at: u64) {
        let grid = Grid::of(shape);
        // Clamped as in `decide`.
        let at = at.min(MAX_TIME);
        let mut round = 0;
        loop {
            let Some((head, stamp)) = self.stamps() else {
                backoff(&mut round);
                continue;
            };
            let newest = grid.decode(stamp_of(head, stamp), at);
            if newest.is_some_and(|newest| at < newest + grid.len) {
                let block = stamp & COUNT_MASK;
                if block == COUNT_MASK {
                    return;
                }
                // AcqRel: part of the stamp word's modification order, which
                // readers load with Acquire; a failure re-reads.
                if self
                    .stamp
                    .compare_exchange(stamp, stamp + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            if let Some(locked) = self.lock(head) {
                if self.rotate_block(grid, locked, at) {
                    return;
                }
            }
            backoff(&mut round);
        }
    }

    /// Takes back one pass that landed in the bucket starting at `at` (as
    /// [`decide_placed`](Self::decide_placed) says), for a request another
    /// window of its key refused (all or none, see `flow::compact_windows`).
    /// The pass is found where it landed: in the newest bucket, with a
    /// compare-and-swap of the head; in an older bucket of the ring (a
    /// rotation sealed it meanwhile), under the rotation lock; nowhere once
    /// its bucket has left the ring. Every
    /// later admission sums the ring afresh, so a pass given back into a
    /// sealed bucket is seen by the next decision.
    ///
    /// A decision that read the ring before the give-back and is validated
    /// after it (the lock is released with the head it was taken from, as
    /// the ring's entry changes and the bucket does not) counted the pass
    /// still there: it can only have refused more, never admitted more.
    pub(crate) fn give_back(&self, shape: &CompactShape, at: u64) {
        let grid = Grid::of(shape);
        let at = at.min(MAX_TIME);
        let mut round = 0;
        loop {
            // Acquire: as in `decide`, the ring and stamp of this head's
            // rotation are visible below.
            let head = self.head.load(Ordering::Acquire);
            if head & LOCKED != 0 {
                backoff(&mut round);
                continue;
            }
            let stamp = self.stamp.load(Ordering::Acquire);
            let Some(newest) = grid.decode(stamp_of(head, stamp), at) else {
                return;
            };
            // Buckets from the newest back to the one holding `at`; a
            // reading at or past the newest is in it (a re-anchoring after a
            // clock step back moves the newest bucket's start behind the
            // passes it holds).
            let back = if at >= newest {
                0
            } else {
                (newest - at).div_ceil(grid.len)
            };
            if back == 0 {
                if head & COUNT_MASK == 0 {
                    return;
                }
                // AcqRel: as an admission's swap; a rotation begun since
                // changed the head, and the bucket is looked for again.
                if self
                    .head
                    .compare_exchange(head, head - 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            let Ok(entry) = usize::try_from(back - 1) else {
                return;
            };
            if entry >= grid.sample_count {
                // Its bucket has left the ring: nothing counts it any more.
                return;
            }
            let Some(locked) = self.lock(head) else {
                backoff(&mut round);
                continue;
            };
            let word = &self.ring[entry / 2];
            let shift = 16 * (entry % 2) as u32;
            // Relaxed: the lock's Acquire made the last holder's stores
            // visible, and only a holder stores the ring.
            let value = word.load(Ordering::Relaxed);
            if (value >> shift) & COUNT_MASK != 0 {
                // Release: as the ring's stores in `publish`.
                word.store(value - (1 << shift), Ordering::Release);
            }
            self.unlock(locked);
            return;
        }
    }

    /// Milliseconds from `at` (moved forward by `behind` from the clock)
    /// until `n` more passes fit under `limit`, 0 if they fit now, plus
    /// `behind` unless 0; `None` if they never can (as
    /// `flow::retry_on_clock` for a full node).
    pub(crate) fn retry_ms(
        &self,
        shape: &CompactShape,
        at: u64,
        behind: u64,
        n: u64,
        limit: u64,
    ) -> Option<u64> {
        let grid = Grid::of(shape);
        self.view(grid, at).retry(grid, at, behind, n, limit)
    }

    /// As `flow::pass_reset_ms`: the `reset` of a pass at `at` (moved
    /// forward by `behind`) that left `window_pass` passes in the window,
    /// until the window could take everything left of `limit` and one more.
    pub(crate) fn pass_reset_ms(
        &self,
        shape: &CompactShape,
        at: u64,
        behind: u64,
        limit: u64,
        window_pass: u64,
    ) -> u64 {
        let grid = Grid::of(shape);
        let more = limit.saturating_sub(window_pass).saturating_add(1);
        self.view(grid, at)
            .retry(grid, at, behind, more, limit)
            .unwrap_or(0)
    }

    /// The window's passes at `now`, taken as
    /// [`effective_now`](Self::effective_now) takes it (re-anchoring after
    /// a far step back, as a full key's snapshot raises its skew), as a
    /// full key's snapshot counts them; and the newest bucket's blocks if
    /// that bucket is in the window (module docs, "What differs").
    pub(crate) fn window_counts(&self, shape: &CompactShape, now: u64) -> (u64, u64) {
        let grid = Grid::of(shape);
        let at = self.effective_now(shape, now);
        let view = self.view(grid, at);
        let pass = view.sum(grid, at, grid.sample_count - 1);
        let block = if view.newest_in_window(grid, at) {
            u64::from(view.block)
        } else {
            0
        };
        (pass, block)
    }

    /// Whether no pass is left in the window at `now` (taken as
    /// [`effective_now`](Self::effective_now) takes it), the bucket that has
    /// just left the window included on a strict window, and no rotation is
    /// under way: a key that may be forgotten without handing it a fresh
    /// allowance.
    pub(crate) fn is_idle(&self, shape: &CompactShape, now: u64) -> bool {
        let grid = Grid::of(shape);
        // A reading at or after the newest bucket's start (nearly every
        // key an insert passes over) is its own effective time, with
        // nothing to re-anchor: judged on the words as they are, the ring
        // read only as far as it counts at `now`. A newest bucket older
        // than the whole window leaves the key idle whatever the ring
        // holds; one in the window with passes leaves it busy.
        let head = self.head.load(Ordering::Acquire);
        if head & LOCKED == 0 {
            let stamp = self.stamp.load(Ordering::Acquire);
            let now = now.min(MAX_TIME);
            let newest = grid.decode(stamp_of(head, stamp), now);
            if newest.is_none_or(|newest| newest <= now) {
                let depth = grid.depth() as u64;
                // Never opened: nothing counts, as if long gone.
                let back = newest.map_or(depth + 1, |newest| grid.by_len.quotient(now - newest));
                if back <= depth {
                    if head & COUNT_MASK != 0 {
                        return false;
                    }
                    // Ring entry `i` is `back + i + 1` buckets before the
                    // reading's: counted for `i < depth - back`.
                    if self.ring_sum((depth - back) as usize) != 0 {
                        return false;
                    }
                }
                // Relaxed after Acquire loads: the sequence lock's second
                // read (a change meanwhile: not idle).
                return self.head.load(Ordering::Relaxed) == head;
            }
        }
        let at = self.effective_now(shape, now);
        self.idle_at(grid, at)
    }

    /// [`is_idle`](Self::is_idle) at `at`, a result of `effective_now`, on
    /// a consistent view of the whole window: the path of a reading before
    /// the newest bucket, and the tests' reference for the quick one.
    fn idle_at(&self, grid: &Grid, at: u64) -> bool {
        // One attempt: a window changing under the read is not idle.
        let head = self.head.load(Ordering::Acquire);
        if head & LOCKED != 0 {
            return false;
        }
        let stamp = self.stamp.load(Ordering::Acquire);
        let ring = self.load_ring(COMPACT_MAX_BUCKETS);
        // Relaxed after Acquire loads: the sequence lock's second read.
        if self.head.load(Ordering::Relaxed) != head {
            return false;
        }
        let view = View::from_words(grid, head, stamp, &ring, at);
        view.sum(grid, at, grid.depth()) == 0
    }

    /// Seals the window if `idle` judges it idle: takes its rotation lock
    /// and keeps it, so that every decision begun on it fails its swap (or
    /// waits for the lock) until [`clear`](Self::clear) or
    /// [`copy_from`](Self::copy_from) unlocks it. The judgement and the
    /// seal are one step: the seal is a compare-and-swap from the head the
    /// judgement began on, which any pass recorded since has changed.
    /// Whether it sealed. For the compact table, under the slot's group
    /// write lock, before the slot changes keys (see its module docs).
    pub(crate) fn seal_if(&self, idle: impl Fn(&Self) -> bool) -> bool {
        let mut round = 0;
        loop {
            // Acquire: as in `decide`.
            let head = self.head.load(Ordering::Acquire);
            if head & LOCKED != 0 {
                backoff(&mut round);
                continue;
            }
            if !idle(self) {
                return false;
            }
            if self.lock(head).is_some() {
                return true;
            }
        }
    }

    /// Seals the window whatever it holds (see [`seal_if`](Self::seal_if)).
    pub(crate) fn seal(&self) {
        self.seal_if(|_| true);
    }

    /// Seals the window of a vacant table slot, unless it is sealed
    /// already: a vacant slot's window is sealed from when its key left
    /// (or has never been used), and no request can hold its lock, so a
    /// locked head here is that seal.
    pub(crate) fn seal_vacant(&self) {
        // Relaxed: under the slot's group write lock, which ordered the
        // seal this may find.
        let head = self.head.load(Ordering::Relaxed);
        if head & LOCKED == 0 {
            let sealed = self.lock(head);
            debug_assert!(sealed.is_some(), "no request holds a vacant slot's window");
        }
    }

    /// Empties the window (all zero bits again), for a slot that is given
    /// to another key. The caller keeps every other user away from the
    /// window meanwhile: the compact table holds the slot's group write
    /// lock (admissions under its read lock wait) and has sealed the window
    /// (admissions without the lock fail), which this unseals.
    pub(crate) fn clear(&self) {
        // Relaxed: ordered before the head's `Release` store, which a
        // decision's `Acquire` load of the head pairs with.
        for word in &self.ring {
            word.store(0, Ordering::Relaxed);
        }
        store_racing_rmw(&self.stamp, 0, Ordering::Relaxed);
        self.head.store(0, Ordering::Release);
    }

    /// Makes this window hold what `from` holds, unlocked (whether `from`
    /// is sealed or not), for a key's window moved between two places of
    /// the compact table. The caller keeps every other user away from both
    /// windows meanwhile, as for [`clear`](Self::clear): the table holds
    /// the key's group write locks and the side map's write lock, and has
    /// sealed a slot's window it moves a key into or out of.
    pub(crate) fn copy_from(&self, from: &CompactWindow) {
        // Relaxed: ordered before the head's `Release` store, as in `clear`.
        for (to, word) in self.ring.iter().zip(&from.ring) {
            to.store(word.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        store_racing_rmw(
            &self.stamp,
            from.stamp.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        self.head.store(
            from.head.load(Ordering::Relaxed) & !LOCKED,
            Ordering::Release,
        );
    }

    // --- internals -----------------------------------------------------------

    /// A consistent `(head, stamp)` pair with the head unlocked, or `None`
    /// while a rotation holds the window or one overlapped the read.
    #[inline]
    fn stamps(&self) -> Option<(u32, u32)> {
        let head = self.head.load(Ordering::Acquire);
        if head & LOCKED != 0 {
            return None;
        }
        let stamp = self.stamp.load(Ordering::Acquire);
        // Relaxed after an Acquire load: a sequence lock's second read.
        let again = self.head.load(Ordering::Relaxed);
        (again & STATE_MASK == head & STATE_MASK).then_some((again, stamp))
    }

    /// The first `entries` ring entries (the rest zero).
    #[inline]
    fn load_ring(&self, entries: usize) -> [u16; COMPACT_MAX_BUCKETS] {
        let mut ring = [0u16; COMPACT_MAX_BUCKETS];
        for (w, word) in self.ring.iter().enumerate().take(entries.div_ceil(2)) {
            // Acquire: a value stored by a rotation makes that rotation's
            // lock visible to the head operations that follow.
            let value = word.load(Ordering::Acquire);
            ring[2 * w] = value as u16;
            ring[2 * w + 1] = (value >> 16) as u16;
        }
        ring
    }

    /// A consistent view, its newest bucket placed relative to `now`.
    fn view(&self, grid: &Grid, now: u64) -> View {
        let mut round = 0;
        loop {
            let head = self.head.load(Ordering::Acquire);
            if head & LOCKED == 0 {
                let stamp = self.stamp.load(Ordering::Acquire);
                let ring = self.load_ring(COMPACT_MAX_BUCKETS);
                // Relaxed after Acquire loads: the sequence lock's second
                // read.
                let again = self.head.load(Ordering::Relaxed);
                if again & STATE_MASK == head & STATE_MASK {
                    return View::from_words(grid, again, stamp, &ring, now);
                }
            }
            backoff(&mut round);
        }
    }

    /// Takes the rotation lock from an unlocked `head`; the head as it was.
    #[inline]
    fn lock(&self, head: u32) -> Option<u32> {
        // Acquire: everything the previous holder stored before unlocking
        // (Release) is visible. The ring and stamp stores that follow are
        // Release, so a reader that sees one of them also sees this lock.
        self.head
            .compare_exchange(head, head | LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .ok()
    }

    /// Releases the lock without a change.
    #[inline]
    fn unlock(&self, head: u32) {
        // Release: pairs with the next holder's Acquire.
        self.head.store(head, Ordering::Release);
    }

    /// Under the lock taken from `head`: moves the window to the bucket of
    /// `at` and decides one pass there against `limit`. `None` (lock
    /// released, nothing changed) if `at` is not past the newest bucket
    /// after all; else the new view, the passes admission counted before
    /// this request, and whether its pass was recorded.
    fn rotate(&self, grid: &Grid, head: u32, at: u64, limit: u64) -> Option<(View, u64, bool)> {
        let (newest, ring) = self.rotated(grid, head, at)?;
        let before = ring_passes(&ring, grid.depth());
        // The new bucket is empty, so its count has room.
        let pass = u32::from(before < limit);
        self.publish(grid, newest, &ring, pass, 0);
        let mut passes = [0u16; COMPACT_MAX_BUCKETS + 1];
        passes[0] = pass as u16;
        passes[1..].copy_from_slice(&ring);
        Some((
            View {
                newest: Some(newest),
                passes,
                block: 0,
            },
            before,
            pass == 1,
        ))
    }

    /// [`rotate`](Self::rotate) for a block: the new bucket starts with it.
    fn rotate_block(&self, grid: &Grid, head: u32, at: u64) -> bool {
        match self.rotated(grid, head, at) {
            Some((newest, ring)) => {
                self.publish(grid, newest, &ring, 0, 1);
                true
            }
            None => false,
        }
    }

    /// Under the lock taken from `head`: the newest bucket's start and the
    /// ring once the window has moved to the bucket of `at`, or `None`
    /// (lock released) if `at` is not past the newest bucket.
    fn rotated(
        &self,
        grid: &Grid,
        head: u32,
        at: u64,
    ) -> Option<(u64, [u16; COMPACT_MAX_BUCKETS])> {
        // Relaxed: the lock's Acquire made the last holder's stores
        // visible, and only a holder stores the stamp half.
        let stamp = self.stamp.load(Ordering::Relaxed);
        let at = at.min(MAX_TIME);
        let Some(newest) = grid.decode(stamp_of(head, stamp), at) else {
            // Never opened: the first bucket lies on the clock's own grid,
            // as a full node's first bucket does (its skew is 0 then).
            return Some((at - at % grid.len, [0; COMPACT_MAX_BUCKETS]));
        };
        if at < newest + grid.len {
            self.unlock(head);
            return None;
        }
        Some((
            grid.advance(newest, at),
            self.shifted(grid, head, newest, at),
        ))
    }

    /// Under the lock taken from `head`: the ring once the window has moved
    /// from the newest bucket (starting at `newest`) to the bucket of `at`,
    /// at least one bucket later.
    #[inline]
    fn shifted(&self, grid: &Grid, head: u32, newest: u64, at: u64) -> [u16; COMPACT_MAX_BUCKETS] {
        let moved = grid.by_len.quotient(at - newest);
        let mut ring = [0u16; COMPACT_MAX_BUCKETS];
        // Bucket `moved` buckets before the new newest is the old newest;
        // the old ring follows it, and the buckets skipped over are empty.
        let count = grid.sample_count;
        if let Ok(moved) = usize::try_from(moved) {
            if moved <= count {
                let old = self.load_ring(count);
                ring[moved - 1] = (head & COUNT_MASK) as u16;
                ring[moved..count].copy_from_slice(&old[..count - moved]);
            }
        }
        ring
    }

    /// Moves the newest bucket's start to `anchored` with its counts kept,
    /// and unlocks: `head` is the head word this caller locked. A block
    /// added meanwhile (by compare-and-swap, outside the lock) makes the
    /// stamp's swap fail and take the new count. Release: as the ring's
    /// stores in `publish`.
    fn restamp_locked(&self, head: u32, anchored: u32) {
        let _ = self
            .stamp
            .fetch_update(Ordering::Release, Ordering::Relaxed, |current| {
                Some(stamp_word(anchored, current & COUNT_MASK))
            });
        self.unlock(head_word(anchored, head & COUNT_MASK));
    }

    /// Re-anchors the newest bucket at `now` (module docs, "Clocks") if it
    /// is still more than a window ahead of it, keeping every count.
    /// `false` if the lock could not be taken or there was nothing to do
    /// any more: the caller reads again.
    fn reanchor(&self, grid: &Grid, head: u32, now: u64) -> bool {
        let Some(head) = self.lock(head) else {
            return false;
        };
        // Relaxed: see `rotated`.
        let stamp = self.stamp.load(Ordering::Relaxed);
        let now = now.min(MAX_TIME);
        match grid.decode(stamp_of(head, stamp), now) {
            Some(newest) if newest > now && newest - now > grid.interval => {
                // The bucket stays the newest, so its counts stay.
                self.restamp_locked(head, grid.encode(now));
                true
            }
            _ => {
                // Another caller re-anchored it meanwhile: read again.
                self.unlock(head);
                false
            }
        }
    }

    /// Under the lock: stores the ring, the stamp of `newest` with `block`,
    /// and unlocks with `pass` in the head.
    fn publish(
        &self,
        grid: &Grid,
        newest: u64,
        ring: &[u16; COMPACT_MAX_BUCKETS],
        pass: u32,
        block: u32,
    ) {
        for (w, word) in self
            .ring
            .iter()
            .enumerate()
            .take(grid.sample_count.div_ceil(2))
        {
            let value = u32::from(ring[2 * w]) | (u32::from(ring[2 * w + 1]) << 16);
            // Release: a reader that loads this value (Acquire) also sees
            // the lock taken before it, and fails its validation.
            word.store(value, Ordering::Release);
        }
        let stamp = grid.encode(newest);
        // A store (Release, as above) racing the blocks' compare-and-swap
        // on this word, which loom sees as a swap (see `sync.rs`).
        store_racing_rmw(&self.stamp, stamp_word(stamp, block), Ordering::Release);
        // Release: the unlock publishes everything above.
        self.unlock(head_word(stamp, pass));
    }
}

impl View {
    fn from_words(
        grid: &Grid,
        head: u32,
        stamp: u32,
        ring: &[u16; COMPACT_MAX_BUCKETS],
        now: u64,
    ) -> View {
        let mut passes = [0u16; COMPACT_MAX_BUCKETS + 1];
        passes[0] = (head & COUNT_MASK) as u16;
        passes[1..].copy_from_slice(ring);
        View {
            newest: grid.decode(stamp_of(head, stamp), now),
            passes,
            block: (stamp & COUNT_MASK) as u16,
        }
    }

    /// Whether the newest bucket is in the window at `at`.
    fn newest_in_window(&self, grid: &Grid, at: u64) -> bool {
        self.locate(grid, at)
            .is_some_and(|(back, _)| (0..grid.sample_count as i128).contains(&back))
    }
}

/// Model-checked with loom (`ci/loom.sh` runs every `loom_models` test):
/// two buckets of 1 ms, so a reading of 1 or 2 makes a rotation that the
/// other threads race.
#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    fn shape(strict: bool) -> CompactShape {
        CompactShape::new(2, 2, strict)
    }

    /// One request as the layer makes it: `true` if it passed; a refusal
    /// records its block.
    fn request(window: &CompactWindow, shape: &CompactShape, now: u64, limit: u64) -> bool {
        let (at, _, decision) = window.admit(shape, now, limit, false);
        match decision {
            Decision::Pass(pass) => {
                assert!(pass.window_pass.is_some_and(|w| w <= limit));
                true
            }
            Decision::Block(_) => {
                window.record_block(shape, at);
                false
            }
            Decision::Wait(never) => match never {},
        }
    }

    /// Limit 1, the bucket at 0 open and empty. One thread requests at 0
    /// (in that bucket), one at 1 (opening the next, in whose window the
    /// bucket at 0 still counts), while the model's own thread reads the
    /// window: exactly one passes, whichever order their loads and swaps
    /// take; an admission decided on the bucket at 0 never lands after the
    /// rotation, and the reader never sees more than the limit.
    #[test]
    fn an_admission_racing_a_rotation_admits_the_limit() {
        loom::model(|| {
            let shape = shape(false);
            let window = Arc::new(CompactWindow::new());
            window.record_block(&shape, 0);
            let racers: Vec<_> = [0, 1]
                .into_iter()
                .map(|now| {
                    let window = Arc::clone(&window);
                    thread::spawn(move || request(&window, &shape, now, 1))
                })
                .collect();
            // Read at 0: a view torn between the bucket at 0 and the ring
            // written when the bucket at 1 opens would count the pass at 0
            // twice.
            let (pass, _) = window.window_counts(&shape, 0);
            assert!(pass <= 1, "read {pass} passes");
            let passed = racers
                .into_iter()
                .map(|t| t.join().unwrap())
                .filter(|&p| p)
                .count();
            assert_eq!(passed, 1);
            assert_eq!(window.window_counts(&shape, 1).0, 1);
        });
    }

    /// Limit 2, one pass in the bucket at 0. Two threads request at 1,
    /// racing to open that bucket: exactly one more passes, and nothing is
    /// lost in the rotation (the window holds both passes and the
    /// refusal's block).
    ///
    /// No third thread here: loom 0.7 reschedules a thread that backs off
    /// without charging a preemption, so two threads waiting for one
    /// rotation can hand the processor back and forth forever while the
    /// rotating thread never runs (see `tests/loom.rs`).
    #[test]
    fn two_rotations_racing_admit_the_limit_and_lose_nothing() {
        loom::model(|| {
            let shape = shape(false);
            let window = Arc::new(CompactWindow::new());
            assert!(request(&window, &shape, 0, 2));
            let racer = {
                let window = Arc::clone(&window);
                thread::spawn(move || request(&window, &shape, 1, 2))
            };
            let own = request(&window, &shape, 1, 2);
            let passed = usize::from(racer.join().unwrap()) + usize::from(own);
            assert_eq!(passed, 1);
            assert_eq!(window.window_counts(&shape, 1), (2, 1));
        });
    }

    /// A block recorded while a clock far behind re-anchors the window
    /// (module docs, "Clocks") is kept: the bucket stays the newest, and
    /// so do its blocks.
    #[test]
    fn a_reanchoring_keeps_a_block_recorded_meanwhile() {
        loom::model(|| {
            let shape = shape(false);
            let window = Arc::new(CompactWindow::new());
            assert!(request(&window, &shape, 100, 1));
            let blocker = {
                let window = Arc::clone(&window);
                thread::spawn(move || window.record_block(&shape, 100))
            };
            // More than the 2 ms window behind: re-anchored at 10.
            assert_eq!(window.effective_now(&shape, 10), 10);
            blocker.join().unwrap();
            // Recorded before the re-anchoring, the block is in the bucket
            // of the pass, which stays the newest; after it, 100 lies 90 ms
            // past the re-anchored bucket and opens a new one (module docs,
            // "What differs"). Either way it is counted once.
            let (pass, block) = window.window_counts(&shape, 10);
            assert_eq!(block, 1, "block lost");
            assert!(pass <= 1);
        });
    }

    /// Strict, limit 1, one pass in the bucket at 0. One thread requests at
    /// 2 (the bucket at 0 has just left the window: strict still counts
    /// it), one at 3 (it has gone): whichever rotates first, exactly one
    /// passes, and it is counted.
    #[test]
    fn strict_rotations_in_either_order_admit_the_limit() {
        loom::model(|| {
            let shape = shape(true);
            let window = Arc::new(CompactWindow::new());
            assert!(request(&window, &shape, 0, 1));
            let early = {
                let window = Arc::clone(&window);
                thread::spawn(move || request(&window, &shape, 2, 1))
            };
            let late = request(&window, &shape, 3, 1);
            let early = early.join().unwrap();
            assert_eq!(usize::from(early) + usize::from(late), 1);
            assert_eq!(window.window_counts(&shape, 3).0, 1);
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SharedClock};
    use crate::stat::StatisticNode;
    use proptest::prelude::*;

    /// What a decision says, comparable.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Said {
        Pass(Pass, u64),
        Block(Refusal),
    }

    fn shape(sample_count: usize, interval_ms: u64, strict: bool) -> CompactShape {
        let shape = CompactShape::new(sample_count, interval_ms, strict);
        shape.validate().expect("valid shape");
        shape
    }

    /// A full node and a compact window of one shape, fed the same requests
    /// at the same clock readings, asserting after each step that they say
    /// the same.
    struct Pair {
        shape: CompactShape,
        node: StatisticNode,
        compact: CompactWindow,
    }

    impl Pair {
        fn new(sample_count: usize, interval_ms: u64, strict: bool) -> Pair {
            let shape = shape(sample_count, interval_ms, strict);
            let node = StatisticNode::build(
                SharedClock::new(ManualClock::new(0)),
                sample_count,
                interval_ms,
                strict,
            )
            .expect("valid node");
            Pair {
                shape,
                node,
                compact: CompactWindow::new(),
            }
        }

        /// One request at the clock reading `now`, as the layer makes it:
        /// the decision, the reset of a pass, the block of a refusal.
        fn request(&self, now: u64, limit: u64, overflow: bool) -> Said {
            let at = self.node.effective_now(now);
            let behind = self.node.lag(now, at);
            let full = match crate::flow::window(
                &self.node,
                (at, behind),
                limit,
                self.shape.interval_ms,
                || overflow,
            ) {
                Decision::Pass(pass) => {
                    let reset = crate::flow::pass_reset_ms(
                        &self.node,
                        at,
                        behind,
                        limit,
                        pass.window_pass.expect("the window knows"),
                    );
                    Said::Pass(pass, reset)
                }
                Decision::Block(refusal) => {
                    self.node.record_block_at(at, 1);
                    Said::Block(refusal)
                }
                Decision::Wait(never) => match never {},
            };
            // As the layer asks it: the three steps in one.
            let (c_at, c_behind, decision) = self.compact.admit(&self.shape, now, limit, overflow);
            assert_eq!(c_behind, behind, "lag at {now}");
            let compact = match decision {
                Decision::Pass(pass) => {
                    let reset = self.compact.pass_reset_ms(
                        &self.shape,
                        c_at,
                        c_behind,
                        limit,
                        pass.window_pass.expect("the window knows"),
                    );
                    Said::Pass(pass, reset)
                }
                Decision::Block(refusal) => {
                    self.compact.record_block(&self.shape, c_at);
                    Said::Block(refusal)
                }
                Decision::Wait(never) => match never {},
            };
            assert_eq!(compact, full, "request at {now}, limit {limit}");
            self.check(now);
            compact
        }

        /// A block recorded at `now` without a decision (another
        /// controller's refusal).
        fn block(&self, now: u64) {
            let at = self.node.effective_now(now);
            self.node.record_block_at(at, 1);
            let c_at = self.compact.effective_now(&self.shape, now);
            self.compact.record_block(&self.shape, c_at);
            self.check(now);
        }

        /// The snapshot's figures and idleness agree at `now`.
        fn check(&self, now: u64) {
            let at = self.node.effective_now(now);
            let pass = self.node.window_counts(at).pass;
            let array = self.node.second_window().array();
            let block = array.newest_bucket_start().map_or(0, |newest| {
                let len = self.shape.bucket_ms();
                let in_window = at - at % len - newest < self.shape.interval_ms;
                match array.main.held(newest) {
                    Some(bucket) if in_window => bucket.counts().block,
                    _ => 0,
                }
            });
            let idle = self
                .node
                .admission_passes(at)
                .0
                .map(|(_, passes)| passes)
                .sum::<u64>()
                == 0;
            assert_eq!(
                self.compact.window_counts(&self.shape, now),
                (pass, block),
                "counts at {now}"
            );
            assert_eq!(
                self.compact.is_idle(&self.shape, now),
                idle,
                "idle at {now}"
            );
        }
    }

    fn passed(said: Said) -> Option<u64> {
        match said {
            Said::Pass(pass, _) => pass.window_pass,
            Said::Block(_) => None,
        }
    }

    fn refused(said: Said) -> Refusal {
        match said {
            Said::Block(refusal) => refusal,
            Said::Pass(..) => panic!("expected a refusal, got {said:?}"),
        }
    }

    #[test]
    fn twenty_eight_bytes_and_all_zero_is_empty() {
        assert_eq!(std::mem::size_of::<CompactWindow>(), 28);
        assert_eq!(std::mem::align_of::<CompactWindow>(), 4);
        let shape = shape(10, 1_000, true);
        let window = CompactWindow::new();
        assert_eq!(window.effective_now(&shape, 123_456), 123_456);
        assert_eq!(window.window_counts(&shape, 123_456), (0, 0));
        assert!(window.is_idle(&shape, 123_456));
        assert_eq!(window.pass_reset_ms(&shape, 123_456, 0, 5, 0), 0);
        // The first bucket lies on the clock's grid: 123 400.
        assert_eq!(passed(decide(&window, &shape, 123_456, 1)), Some(1));
        assert_eq!(
            refused(decide(&window, &shape, 123_499, 1)).retry_after_ms,
            123_400 + 1_000 + 100 - 123_499
        );
    }

    fn decide(window: &CompactWindow, shape: &CompactShape, now: u64, limit: u64) -> Said {
        let at = window.effective_now(shape, now);
        match window.decide(shape, (at, window.lag(shape, now, at)), limit, false) {
            Decision::Pass(pass) => Said::Pass(pass, 0),
            Decision::Block(refusal) => Said::Block(refusal),
            Decision::Wait(never) => match never {},
        }
    }

    /// Passes slide out bucket by bucket, and a refusal waits exactly for
    /// the oldest bucket that frees enough.
    #[test]
    fn rotation_slides_passes_out_of_the_window() {
        let pair = Pair::new(10, 1_000, false);
        for t in [10_000, 10_050, 10_120, 10_350] {
            assert!(passed(pair.request(t, 4, false)).is_some());
        }
        let refusal = refused(pair.request(10_360, 4, true));
        assert_eq!(refusal.reason, Reason::Overflow);
        assert_eq!(refusal.window_pass, Some(4));
        // The bucket at 10 000 holds two: it leaves at 11 000.
        assert_eq!(refusal.retry_after_ms, 11_000 - 10_360);
        assert_eq!(pair.compact.window_counts(&pair.shape, 10_999), (4, 1));
        assert_eq!(pair.compact.window_counts(&pair.shape, 11_000), (2, 1));
        assert_eq!(passed(pair.request(11_000, 4, false)), Some(3));
        // At 11 100 the bucket at 10 100 has left too.
        assert_eq!(passed(pair.request(11_100, 4, false)), Some(3));
        assert_eq!(passed(pair.request(11_100, 4, false)), Some(4));
        // The bucket at 10 300 frees one at 11 300.
        assert_eq!(refused(pair.request(11_100, 4, false)).retry_after_ms, 200);
        assert_eq!(pair.compact.window_counts(&pair.shape, 12_350), (0, 0));
        assert!(pair.compact.is_idle(&pair.shape, 12_100));
        assert!(!pair.compact.is_idle(&pair.shape, 12_099));
    }

    /// Buckets skipped over are empty, whether the jump is shorter than
    /// the window, exactly as long, or longer.
    #[test]
    fn skipped_buckets_are_empty() {
        for jump in [200, 700, 900, 1_000, 1_100, 5_000] {
            let pair = Pair::new(10, 1_000, false);
            for _ in 0..3 {
                pair.request(20_000, 5, false);
            }
            pair.request(20_100, 5, false);
            pair.block(20_100);
            let after = 20_100 + jump;
            pair.request(after, 5, false);
            pair.request(after, 5, false);
            pair.request(after + 100, 5, false);
            for t in (after..after + 2_000).step_by(50) {
                pair.check(t);
            }
        }
    }

    /// A strict window counts the bucket that has just left the window,
    /// until one bucket length after it would have left a plain window.
    #[test]
    fn strict_counts_the_departing_bucket() {
        let pair = Pair::new(2, 1_000, true);
        for _ in 0..3 {
            pair.request(0, 4, false);
        }
        assert_eq!(passed(pair.request(500, 4, false)), Some(4));
        // At 1 000 the bucket at 0 has left the window; strict still
        // counts its three.
        assert_eq!(pair.compact.window_counts(&pair.shape, 1_000), (1, 0));
        let refusal = refused(pair.request(1_000, 4, false));
        assert_eq!(refusal.window_pass, Some(4));
        assert_eq!(refusal.retry_after_ms, 500);
        assert!(!pair.compact.is_idle(&pair.shape, 1_999));
        // At 1 500 it is gone: the bucket at 500 departs.
        assert_eq!(passed(pair.request(1_500, 4, false)), Some(2));
        assert!(!pair.compact.is_idle(&pair.shape, 2_999));
        assert!(pair.compact.is_idle(&pair.shape, 3_000));

        // The same history on a plain window admits at 1 000.
        let plain = Pair::new(2, 1_000, false);
        for _ in 0..3 {
            plain.request(0, 4, false);
        }
        plain.request(500, 4, false);
        assert_eq!(passed(plain.request(1_000, 4, false)), Some(2));
    }

    /// The stamp keeps bucket numbers modulo `2^q - 1` and its low 15 bits
    /// in the head: decisions stay the full node's across both wraps.
    #[test]
    fn stamp_and_tag_wrap_around() {
        // One-millisecond buckets: the tag wraps every 32 768 buckets.
        let pair = Pair::new(5, 5, true);
        let wrap = 1 << TAG_BITS;
        for t in wrap - 20..wrap + 20 {
            pair.request(t, 3, false);
        }
        // Buckets of 2^16 + 1 ms: q = 14, the number wraps every 16 383
        // buckets (about 12 days); key kept busy across it.
        let len = (1 << 16) + 1;
        let pair = Pair::new(2, 2 * len, false);
        let grid = Grid::of(&pair.shape);
        assert_eq!(grid.q, 14);
        let wrap = grid.period;
        for t in (wrap - 4 * len..wrap + 4 * len).step_by(len as usize / 3) {
            pair.request(t, 2, false);
            pair.request(t, 2, false);
        }
        // The tag changes on every rotation, also at the wrap.
        for start in [wrap - 2 * len, wrap - len, wrap, wrap + len] {
            let tag = |s: u64| grid.encode(s) & TAG_MASK;
            assert_ne!(tag(start), tag(start + len), "at {start}");
            assert_ne!(grid.encode(start), 0);
        }
    }

    /// Counts stop at 65 535 instead of wrapping into the tag, and the
    /// ring carries a full bucket.
    #[test]
    fn counts_saturate_at_65_535() {
        let shape = shape(2, 200, false);
        let window = CompactWindow::new();
        for i in 0..COMPACT_MAX_LIMIT {
            assert_eq!(
                passed(decide(&window, &shape, 1_000, COMPACT_MAX_LIMIT)),
                Some(i + 1)
            );
        }
        let refusal = refused(decide(&window, &shape, 1_000, COMPACT_MAX_LIMIT));
        assert_eq!(refusal.window_pass, Some(COMPACT_MAX_LIMIT));
        // A limit past the maximum: the bucket is full all the same.
        let refusal = refused(decide(&window, &shape, 1_050, u64::MAX));
        assert_eq!(refusal.window_pass, Some(COMPACT_MAX_LIMIT));
        for _ in 0..COMPACT_MAX_LIMIT + 10 {
            window.record_block(&shape, 1_050);
        }
        assert_eq!(
            window.window_counts(&shape, 1_050),
            (COMPACT_MAX_LIMIT, COMPACT_MAX_LIMIT)
        );
        // The next bucket counts the full one from the ring.
        let refusal = refused(decide(&window, &shape, 1_100, COMPACT_MAX_LIMIT));
        assert_eq!(refusal.window_pass, Some(COMPACT_MAX_LIMIT));
        assert_eq!(refusal.retry_after_ms, 100);
        assert_eq!(window.window_counts(&shape, 1_100), (COMPACT_MAX_LIMIT, 0));
        assert_eq!(passed(decide(&window, &shape, 1_200, 2)), Some(1));
    }

    /// Clocks that step back a little (moved forward to the newest
    /// bucket, the wait that much longer), step back far (re-anchored, the
    /// passes count for one more window), near time 0, and jump far ahead.
    #[test]
    fn odd_clocks_give_the_full_nodes_answers() {
        let pair = Pair::new(10, 1_000, false);
        pair.request(50_000, 2, false);
        pair.request(50_450, 2, false);
        // A little back: decided at 50 400, the wait 30 ms longer.
        let refusal = refused(pair.request(50_370, 2, false));
        assert_eq!(refusal.retry_after_ms, 51_000 - 50_400 + 30);
        assert_eq!(pair.compact.effective_now(&pair.shape, 50_370), 50_400);
        // Far back: re-anchored, no lag, the two passes still count.
        let refusal = refused(pair.request(7, 2, false));
        assert_eq!(refusal.retry_after_ms, 600);
        assert_eq!(pair.compact.effective_now(&pair.shape, 8), 8);
        pair.request(606, 2, false);
        pair.request(607, 2, false);
        for t in 607..2_200 {
            if t % 7 == 0 {
                pair.request(t, 2, false);
            }
            pair.check(t);
        }
        // Far ahead, then back again by less and by more than a window.
        for t in [
            400_000_000,
            399_999_500,
            400_000_100,
            399_000_000,
            399_000_001,
        ] {
            pair.request(t, 2, false);
            pair.request(t, 2, false);
        }
        // Near 0 after a far step back: older buckets lie before 0 on the
        // clock.
        let pair = Pair::new(4, 400, true);
        pair.request(1_000_000, 3, false);
        pair.request(1_000_150, 3, false);
        pair.request(1_000_250, 3, false);
        for t in [1, 2, 5, 90, 101, 250, 399, 401, 650] {
            pair.request(t, 3, false);
        }
    }

    /// A snapshot taken while the clock is far behind re-anchors the
    /// window, as the full snapshot raises the node's skew: later answers
    /// are then measured from the snapshot's reading, not the next
    /// request's.
    #[test]
    fn a_snapshot_after_a_far_step_back_anchors_as_the_full_one() {
        let pair = Pair::new(10, 1_000, false);
        pair.request(50_000, 1, false);
        let full = pair.node.window_counts(pair.node.effective_now(10)).pass;
        assert_eq!(pair.compact.window_counts(&pair.shape, 10), (full, 0));
        // The pass counts until 490 ms of the clock after the snapshot's
        // reading would have taken the full node to 51 000.
        let refusal = refused(pair.request(500, 1, false));
        assert_eq!(refusal.retry_after_ms, 510);
    }

    /// Documented difference: a key untouched for more than half a period
    /// is placed as if its clock had stepped back, and its stale passes
    /// count for one more window (stricter than a full key, never looser).
    #[test]
    fn a_key_untouched_for_over_half_a_period_is_stricter_for_a_window() {
        let shape = shape(10, 1_000, false);
        let grid = Grid::of(&shape);
        let window = CompactWindow::new();
        assert_eq!(passed(decide(&window, &shape, 0, 1)), Some(1));
        // Within half a period: empty again.
        let t = grid.period / 2 - 1_000;
        assert_eq!(window.window_counts(&shape, t), (0, 0));
        assert!(window.is_idle(&shape, t + 1_000));
        // Past it: taken for a step back, so the pass counts for a window.
        let t = grid.period / 2 + 10_000;
        assert!(!window.is_idle(&shape, t));
        assert!(window.is_idle(&shape, t + 1_000));
        assert_eq!(passed(decide(&window, &shape, t + 1_000, 1)), Some(1));
    }

    /// A cleared window is a new one: no counts, no anchor, first bucket
    /// on the clock's grid again.
    #[test]
    fn a_cleared_window_is_empty() {
        let shape = shape(4, 400, true);
        let window = CompactWindow::new();
        for now in [10_050, 10_150, 10_250, 10_350] {
            assert!(passed(decide(&window, &shape, now, 9)).is_some());
        }
        window.record_block(&shape, 10_350);
        // Far back: re-anchored at 33, off the clock's grid.
        assert_eq!(window.effective_now(&shape, 33), 33);
        assert_eq!(window.window_counts(&shape, 33), (4, 1));
        window.clear();
        assert_eq!(
            std::array::from_fn::<u32, 7, _>(|i| match i {
                0 => window.head.load(Ordering::Relaxed),
                1 => window.stamp.load(Ordering::Relaxed),
                _ => window.ring[i - 2].load(Ordering::Relaxed),
            }),
            [0; 7]
        );
        assert_eq!(window.window_counts(&shape, 33), (0, 0));
        assert!(window.is_idle(&shape, 33));
        assert_eq!(passed(decide(&window, &shape, 150, 9)), Some(1));
        // The bucket starts at 100 (the grid), not at 33 + k * 100.
        assert_eq!(
            refused(decide(&window, &shape, 150, 1)).retry_after_ms,
            100 + 500 - 150
        );
    }

    /// Readings at the end of time: clamped at 2^62 ms like a full node's
    /// buckets, so every call returns (a reading past the clamp once
    /// looped between the placement and the rotation for ever).
    #[test]
    fn readings_past_the_clamp_are_answered() {
        let shape = shape(10, 1_000, true);
        let window = CompactWindow::new();
        for now in [
            MAX_TIME - 1,
            MAX_TIME,
            MAX_TIME + 150,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let at = window.effective_now(&shape, now);
            let behind = window.lag(&shape, now, at);
            let _ = window.decide(&shape, (at, behind), 2, false);
            window.record_block(&shape, at);
            let _ = window.pass_reset_ms(&shape, at, behind, 2, 1);
            assert!(window.window_counts(&shape, now).0 <= 2);
        }
        assert!(!window.is_idle(&shape, u64::MAX));
    }

    /// Shapes `validate` refuses still never make a method panic.
    #[test]
    fn a_shape_that_was_never_validated_does_not_panic() {
        for (sample_count, interval_ms) in [(0, 1_000), (11, 1_100), (3, 0), (2, 1 << 41)] {
            let shape = CompactShape::new(sample_count, interval_ms, true);
            let window = CompactWindow::new();
            for now in [0, 5, 1 << 40, 3 << 41, 7] {
                let at = window.effective_now(&shape, now);
                let behind = window.lag(&shape, now, at);
                let _ = window.decide(&shape, (at, behind), 3, false);
                window.record_block(&shape, at);
                let _ = window.pass_reset_ms(&shape, at, behind, 3, 1);
                let _ = window.window_counts(&shape, now);
                let _ = window.is_idle(&shape, now);
            }
        }
    }

    #[test]
    fn shapes_a_compact_window_cannot_have_are_refused() {
        let bad = |sample_count, interval_ms| {
            CompactShape::new(sample_count, interval_ms, false)
                .validate()
                .expect_err("invalid")
                .field()
        };
        assert_eq!(bad(0, 1_000), "sample_count");
        assert_eq!(bad(11, 1_100), "sample_count");
        assert_eq!(bad(3, 1_000), "interval_ms");
        assert_eq!(bad(1, 0), "interval_ms");
        assert_eq!(bad(1, (1 << 29) + 1), "interval_ms");
        shape(1, 1 << 29, true);
        shape(10, 10, true);
    }

    /// One step of a random history: the clock moves by `step` (backwards
    /// when negative, never below 0), then a request (or, when `block`, a
    /// block recorded without a decision) against `limit`.
    #[derive(Debug, Clone, Copy)]
    struct Step {
        step: i64,
        block: bool,
        limit: u64,
        overflow: bool,
    }

    fn steps(bucket_ms: u64) -> impl Strategy<Value = Step> {
        let len = bucket_ms as i64;
        let step = prop_oneof![
            6 => 0..=len * 2,
            2 => Just(0i64),
            2 => -len * 2..0,
            1 => -len * 30..-len * 10,
            1 => 1..=len * 40,
            1 => 100_000_000i64..=400_000_000,
            1 => -400_000_000i64..=-100_000_000,
        ];
        (step, proptest::bool::weighted(0.1), 0u64..=3, any::<bool>()).prop_map(
            |(step, block, extra, overflow)| Step {
                step,
                block,
                limit: extra,
                overflow,
            },
        )
    }

    fn history() -> impl Strategy<Value = (usize, u64, bool, u64, u64, Vec<Step>)> {
        let bucket = prop_oneof![4 => 1u64..=5, 4 => 6u64..=300, 1 => 1_000u64..=70_000];
        (1usize..=10, bucket, any::<bool>(), 1u64..=50, 0u64..1 << 40).prop_flat_map(
            |(sample_count, bucket_ms, strict, limit, start)| {
                (
                    Just(sample_count),
                    Just(bucket_ms),
                    Just(strict),
                    Just(limit),
                    Just(start),
                    proptest::collection::vec(steps(bucket_ms), 1..300),
                )
            },
        )
    }

    /// Divisors at the edges: 1, powers of two and their neighbours, the
    /// periods of real shapes, the largest below 2^63.
    fn edge_divisors() -> Vec<u64> {
        let mut divisors = vec![1, 2, 3, 5, 7, 10, (1 << 63) - 1, (1 << 62) + 1];
        for k in 1..63 {
            divisors.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        for (samples, interval) in [(1, 1), (10, 1_000), (10, 10), (2, 60_000), (10, 1 << 30)] {
            divisors.push(CompactShape::new(samples, interval, false).grid.period);
        }
        divisors
    }

    #[test]
    fn the_remainder_without_a_division_is_the_remainder_at_the_edges() {
        for d in edge_divisors() {
            let by = Divisor::new(d);
            for n in [
                0,
                1,
                d - 1,
                d,
                d.saturating_add(1),
                MAX_TIME - 1,
                MAX_TIME,
                (1 << 63) - 1,
            ] {
                assert_eq!(by.rem(n), n % d, "{n} % {d}");
                assert_eq!(by.quotient(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn a_shape_works_out_the_grid_its_fields_describe() {
        let shape = CompactShape::new(10, 1_000, true);
        assert_eq!(shape.bucket_ms(), 100);
        assert_eq!(Grid::of(&shape).len, 100);
        assert_eq!(Grid::of(&shape).period % 100, 0);
        // No bucket at all (refused by `validate`) still makes a grid.
        assert_eq!(CompactShape::new(0, 0, false).bucket_ms(), 0);
        assert_eq!(Grid::of(&CompactShape::new(0, 0, false)).len, 1);
        assert!(CompactShape::new(0, 0, false).validate().is_err());
    }

    #[test]
    fn the_straight_line_sum_counts_exactly_the_entries_of_the_depth() {
        // Every entry holds a distinct power of two (plus the largest
        // count in the last), so a sum that takes an entry too many or too
        // few, or a half of the wrong word, gives another figure.
        let window = CompactWindow::new();
        for (i, word) in window.ring.iter().enumerate() {
            let low = 1u32 << (2 * i);
            let high = if i == RING_WORDS - 1 {
                0xFFFF
            } else {
                2u32 << (2 * i)
            };
            word.store(low | high << 16, Ordering::Relaxed);
        }
        for sample_count in 1..=COMPACT_MAX_BUCKETS {
            for strict in [false, true] {
                let shape = CompactShape::new(sample_count, 1_000, strict);
                let grid = Grid::of(&shape);
                let depth = sample_count - 1 + usize::from(strict);
                assert_eq!(grid.depth(), depth);
                let expected = (0..depth)
                    .map(|entry| {
                        let word = window.ring[entry / 2].load(Ordering::Relaxed);
                        u64::from(if entry % 2 == 0 {
                            word & 0xFFFF
                        } else {
                            word >> 16
                        })
                    })
                    .sum::<u64>();
                assert_eq!(
                    window.window_ring_sum(grid),
                    expected,
                    "{sample_count} buckets, strict {strict}"
                );
                assert_eq!(window.ring_sum(depth), expected);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_remainder_without_a_division_is_the_remainder(
            d in 1u64..(1 << 63),
            n in 0u64..=MAX_TIME,
        ) {
            prop_assert_eq!(Divisor::new(d).rem(n), n % d);
            prop_assert_eq!(Divisor::new(d).quotient(n), n / d);
        }

        /// Random shapes and histories (passes, then a clock that moves on
        /// by up to three windows, or back by up to one): the quick idleness
        /// judgements (from the head and the stamp) are the one the ring's
        /// sum gives, at every step.
        #[test]
        fn idleness_judged_from_the_head_is_the_rings_sum(
            samples in 1usize..=10,
            bucket in 1u64..=50,
            strict: bool,
            start in 0u64..1_000_000,
            steps in proptest::collection::vec(
                (0u64..=3, -1i64..=3, 0u64..=3, 0u8..=2),
                1..60,
            ),
        ) {
            let shape = CompactShape::new(samples, bucket * samples as u64, strict);
            let grid = Grid::of(&shape);
            let window = CompactWindow::new();
            let mut now = start;
            for (requests, windows, extra, then) in steps {
                let interval = shape.interval_ms as i64;
                now = now.saturating_add_signed(windows * interval + extra as i64);
                for _ in 0..requests {
                    let _ = window.admit(&shape, now, 3, false);
                }
                // A block recorded by another controller (it may open a
                // bucket with no pass), or a pass taken back (it may leave
                // the newest bucket with none).
                let at = window.effective_now(&shape, now);
                match then {
                    1 => window.record_block(&shape, at),
                    2 => window.give_back(&shape, at),
                    _ => {}
                }
                let at = window.effective_now(&shape, now);
                let reference = window.idle_at(grid, at);
                prop_assert_eq!(window.is_idle(&shape, now), reference, "now {}", now);
            }
        }

        #[test]
        fn a_stamp_and_an_advance_are_what_the_divisions_give(
            samples in 1usize..=10,
            bucket in 1u64..=(1 << 29),
            strict: bool,
            start in 0u64..=MAX_TIME,
            later in 0u64..=MAX_TIME,
        ) {
            let grid = CompactShape::new(samples, bucket * samples as u64, strict).grid;
            let number = (start / grid.len) % grid.rounds + 1;
            let phase = start % grid.len;
            let stamp = ((number | (phase << grid.q)) & 0x7FFF_FFFF) as u32;
            prop_assert_eq!(grid.encode(start), stamp);
            let (newest, t) = (start.min(later), start.max(later));
            prop_assert_eq!(grid.advance(newest, t), newest + (t - newest) / grid.len * grid.len);
        }

        /// A window opened at the aligned bucket of a reading has the
        /// reading's aligned stamp, and a window with that stamp has its
        /// newest bucket there, as the decode says.
        #[test]
        fn the_aligned_stamp_is_the_decoded_bucket_of_the_reading(
            samples in 1usize..=10,
            bucket in 1u64..=(1 << 29),
            strict: bool,
            now in 0u64..=MAX_TIME,
        ) {
            let grid = CompactShape::new(samples, bucket * samples as u64, strict).grid;
            let aligned = now - now % grid.len;
            prop_assert_eq!(grid.aligned_stamp(now), grid.encode(aligned));
            prop_assert_eq!(grid.decode(grid.aligned_stamp(now), now), Some(aligned));
        }

        #[test]
        fn the_remainder_by_a_real_period_is_the_remainder(
            samples in 1usize..=10,
            bucket in 1u64..=(1 << 29),
            n in 0u64..=MAX_TIME,
        ) {
            let period = CompactShape::new(samples, bucket * samples as u64, false).grid.period;
            prop_assert_eq!(Divisor::new(period).rem(n), n % period);
        }

        /// Random shapes, limits and clocks (small steps, steps back by a
        /// little and by many windows, jumps ahead by days): a compact
        /// window says what a full node says after every step (decisions,
        /// refusal reasons, retry times, window passes, resets, lag, window
        /// counts, idleness), checked inside `Pair`.
        #[test]
        fn compact_window_decides_as_a_full_node(
            (sample_count, bucket_ms, strict, limit, start, steps) in history()
        ) {
            let pair = Pair::new(sample_count, bucket_ms * sample_count as u64, strict);
            let mut now = start;
            for step in steps {
                now = now.saturating_add_signed(step.step);
                // The limit moves a little around its base, as `set_limit`
                // may move it (to 0, too).
                let limit = (limit + step.limit).saturating_sub(1);
                if step.block {
                    pair.block(now);
                } else {
                    pair.request(now, limit, step.overflow);
                }
            }
        }
    }

    /// Real threads, frozen clock: of any number of concurrent attempts,
    /// exactly `limit` pass in each window, the first attempts of a window
    /// racing its rotation; every refusal's block is counted, and a reader
    /// running alongside never sees more than `limit` passes.
    #[test]
    fn frozen_clock_admits_exactly_the_limit_on_real_threads() {
        use std::sync::atomic::AtomicU64 as Count;
        use std::sync::Barrier;
        const THREADS: usize = 4;
        const ATTEMPTS: u64 = 15_000;
        for (shape, limit) in [
            (shape(10, 1_000, false), 1),
            (shape(10, 1_000, true), 7),
            (shape(3, 30, true), 2_500),
            (shape(1, 10, false), COMPACT_MAX_LIMIT),
        ] {
            let clock = ManualClock::new(1_000_000);
            let window = CompactWindow::new();
            // Rounds a window and a bucket apart: nothing carries over.
            for round in 0..5u64 {
                clock.set(1_000_000 + round * (shape.interval_ms + shape.bucket_ms()));
                let barrier = Barrier::new(THREADS);
                let passed = Count::new(0);
                let done = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|s| {
                    s.spawn(|| {
                        while !done.load(Ordering::Relaxed) {
                            let now = crate::clock::Clock::now_millis(&clock);
                            let (pass, _) = window.window_counts(&shape, now);
                            assert!(pass <= limit, "read {pass} passes, limit {limit}");
                            std::thread::yield_now();
                        }
                    });
                    let admitting: Vec<_> = (0..THREADS)
                        .map(|_| {
                            s.spawn(|| {
                                barrier.wait();
                                for _ in 0..ATTEMPTS {
                                    let now = crate::clock::Clock::now_millis(&clock);
                                    let at = window.effective_now(&shape, now);
                                    let behind = window.lag(&shape, now, at);
                                    match window.decide(&shape, (at, behind), limit, false) {
                                        Decision::Pass(pass) => {
                                            assert!(pass.window_pass.is_some_and(|w| w <= limit));
                                            passed.fetch_add(1, Ordering::Relaxed);
                                        }
                                        Decision::Block(_) => window.record_block(&shape, at),
                                        Decision::Wait(never) => match never {},
                                    }
                                }
                            })
                        })
                        .collect();
                    for thread in admitting {
                        thread.join().expect("an admitting thread panicked");
                    }
                    done.store(true, Ordering::Relaxed);
                });
                let now = crate::clock::Clock::now_millis(&clock);
                let expected = limit.min(THREADS as u64 * ATTEMPTS);
                assert_eq!(passed.load(Ordering::Relaxed), expected, "{shape:?}");
                let blocks = (THREADS as u64 * ATTEMPTS - expected).min(65_535);
                assert_eq!(
                    window.window_counts(&shape, now),
                    (expected, blocks),
                    "{shape:?}"
                );
            }
        }
    }
}
