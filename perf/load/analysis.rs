//! Accuracy maths on recorded admissions: bucket-aligned windows, the exact
//! sliding window, and the long-run rate.
//!
//! Everything here is a pure function of the admission records, so it is
//! checked on hand-made data in `short` mode (see [`self_check`]).

use crate::servers::{Admit, Block};

/// The window grid of our layer with default settings: 10 buckets of 100 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Bucket length in milliseconds.
    pub bucket_ms: u64,
    /// Buckets per window.
    pub buckets: u64,
}

impl Grid {
    /// Sentinel's second window as this crate configures it by default.
    pub const DEFAULT: Grid = Grid {
        bucket_ms: 100,
        buckets: 10,
    };

    /// The window length in milliseconds.
    pub fn window_ms(self) -> u64 {
        self.bucket_ms * self.buckets
    }
}

/// The measured interval of a run, in clock milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First due instant, aligned to a bucket start.
    pub start_ms: u64,
    /// Last due instant (exclusive end of the offered load).
    pub end_ms: u64,
}

/// What one contender did in one scenario.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accuracy {
    /// Requests admitted.
    pub passes: u64,
    /// Largest count in any bucket-aligned window, each admission placed in
    /// the bucket of its handler reading.
    pub bucket_max: u64,
    /// Largest count any bucket-aligned window can have had, allowing every
    /// admission to lie anywhere between its two readings.
    pub bucket_max_bound: u64,
    /// Smallest count over bucket-aligned windows lying wholly inside the
    /// offered load.
    pub bucket_min_full: u64,
    /// Those windows.
    pub full_windows: u64,
    /// Those windows whose count equals the limit.
    pub full_windows_at_limit: u64,
    /// 429s answered while the bucket-aligned window had room, at both
    /// readings around the limiter: admissions the limit did not require
    /// refusing (under-admission).
    pub blocked_with_room: u64,
    /// Admissions whose two readings fall in different buckets.
    pub straddling: u64,
    /// Largest count in one 100 ms bucket. A true 1 s window covers one
    /// bucket-aligned window plus part of the bucket before it, so the
    /// sliding maximum is at most `bucket_max` plus this.
    pub bucket_peak: u64,
    /// Largest count in any true sliding window (exact, over the
    /// microsecond pass timestamps, every start point).
    pub sliding_max: u64,
    /// Where that window starts, microseconds after the span's start.
    pub sliding_at_us: u64,
    /// Admissions per second inside the offered interval.
    pub rate: f64,
    /// Admissions per second after the first second of the offered interval.
    pub rate_after_first: f64,
    /// The wait between the reading before the limiter and the pass, over
    /// every admission: median, 99th percentile and largest, microseconds.
    pub wait_us: [u64; 3],
    /// Passes per 100 ms (by pass timestamp) in the buckets during which
    /// some admitted request was waiting all the time (the limiter was
    /// saturated): smallest and largest.
    pub saturated: Option<(u64, u64)>,
    /// How many buckets were saturated in that sense.
    pub saturated_buckets: u64,
    /// The long-run rate (as `rate_after_first`) an exact limiter would
    /// have given the same arrivals: one that keeps a log of pass times and
    /// admits a request when fewer than the limit passed in the 1 s before
    /// its arrival at the limiter. The most any limiter that holds the limit
    /// in every 1 s interval can admit of them.
    pub exact_log_rate: f64,
}

/// Bucket index of `ms` relative to the bucket holding `origin_ms`.
fn bucket_of(ms: u64, origin_ms: u64, grid: Grid) -> i64 {
    let b = i64::try_from(ms / grid.bucket_ms).unwrap_or(i64::MAX);
    let o = i64::try_from(origin_ms / grid.bucket_ms).unwrap_or(i64::MAX);
    b.saturating_sub(o)
}

/// Cumulative counts of bucket indexes, for window sums in O(1).
struct Cumulative {
    /// The smallest bucket index counted.
    first: i64,
    /// `sums[i]` = number of values with bucket index `<= first + i - 1`.
    sums: Vec<u64>,
}

impl Cumulative {
    /// Builds the cumulative counts of `buckets` over `first..=last`.
    fn new(buckets: &[i64], first: i64, last: i64) -> Cumulative {
        let len = usize::try_from(last - first + 1).unwrap_or(0);
        let mut counts = vec![0u64; len];
        for &b in buckets {
            let i = usize::try_from((b - first).clamp(0, last - first)).unwrap_or(0);
            counts[i] += 1;
        }
        let mut sums = Vec::with_capacity(len + 1);
        sums.push(0);
        let mut acc = 0;
        for c in counts {
            acc += c;
            sums.push(acc);
        }
        Cumulative { first, sums }
    }

    /// Values with bucket index `<= b`.
    fn at_most(&self, b: i64) -> u64 {
        let i = (b - self.first + 1).clamp(0, self.sums.len() as i64 - 1);
        self.sums[usize::try_from(i).unwrap_or(0)]
    }
}

/// Analyses the admissions of one run against `limit`.
pub fn analyse(admits: &[Admit], blocks: &[Block], span: Span, grid: Grid, limit: u64) -> Accuracy {
    let mut result = Accuracy {
        passes: admits.len() as u64,
        ..Accuracy::default()
    };
    if admits.is_empty() {
        return result;
    }
    let origin = span.start_ms;
    let after: Vec<i64> = admits
        .iter()
        .map(|a| bucket_of(a.after_ms, origin, grid))
        .collect();
    let before: Vec<i64> = admits
        .iter()
        .map(|a| bucket_of(a.before_ms.min(a.after_ms), origin, grid))
        .collect();
    result.straddling = before.iter().zip(&after).filter(|(b, a)| b != a).count() as u64;
    let first = before
        .iter()
        .chain(&after)
        .copied()
        .min()
        .unwrap_or(0)
        .min(0);
    let last_end = bucket_of(span.end_ms.max(origin), origin, grid);
    let last = before
        .iter()
        .chain(&after)
        .copied()
        .max()
        .unwrap_or(0)
        .max(last_end);
    let by_after = Cumulative::new(&after, first, last);
    let by_before = Cumulative::new(&before, first, last);
    let width = i64::try_from(grid.buckets).unwrap_or(1);
    // Windows lying wholly inside the offered load.
    let full_from = width - 1;
    let full_to = last_end - 1;
    for end in first..=last + width {
        let start = end - width + 1;
        let count = by_after.at_most(end) - by_after.at_most(start - 1);
        // Admissions that may lie in the window: decided no later than its
        // last bucket and no earlier than its first.
        let bound = by_before.at_most(end) - by_after.at_most(start - 1);
        result.bucket_max = result.bucket_max.max(count);
        result.bucket_peak = result
            .bucket_peak
            .max(by_after.at_most(end) - by_after.at_most(end - 1));
        result.bucket_max_bound = result.bucket_max_bound.max(bound);
        if end >= full_from && end <= full_to {
            result.full_windows += 1;
            if count == limit {
                result.full_windows_at_limit += 1;
            }
            result.bucket_min_full = if result.full_windows == 1 {
                count
            } else {
                result.bucket_min_full.min(count)
            };
        }
    }
    let window_at = |b: i64| by_after.at_most(b) - by_after.at_most(b - width);
    result.blocked_with_room = blocks
        .iter()
        .filter(|k| {
            let early = bucket_of(k.before_ms.min(k.after_ms), origin, grid);
            let late = bucket_of(k.after_ms, origin, grid);
            window_at(early) < limit && window_at(late) < limit
        })
        .count() as u64;
    let mut micros: Vec<u64> = admits.iter().map(|a| a.pass_us).collect();
    micros.sort_unstable();
    let (max, at) = sliding_max(&micros, grid.window_ms() * 1000);
    result.wait_us = wait_quantiles(admits);
    let mut arrivals: Vec<u64> = admits
        .iter()
        .map(|a| a.before_us)
        .chain(blocks.iter().map(|b| b.before_us))
        .collect();
    arrivals.sort_unstable();
    let exact = exact_log(&arrivals, grid.window_ms() * 1000, limit);
    if seconds_of(span) > 1.0 {
        let from = (span.start_ms + 1000) * 1000;
        let later = exact
            .iter()
            .filter(|&&t| t >= from && t < span.end_ms * 1000)
            .count();
        result.exact_log_rate = later as f64 / (seconds_of(span) - 1.0);
    }
    let counts = saturated_counts(admits, span, grid);
    result.saturated_buckets = counts.len() as u64;
    result.saturated = counts
        .iter()
        .min()
        .copied()
        .zip(counts.iter().max().copied());
    result.sliding_max = max;
    result.sliding_at_us = at.saturating_sub(span.start_ms * 1000);
    let seconds = seconds_of(span);
    // Requests queued in the client or server can still be admitted after
    // the offered load ends; the rate counts only admissions inside it.
    let inside = admits
        .iter()
        .filter(|a| a.after_ms >= span.start_ms && a.after_ms < span.end_ms)
        .count();
    if seconds > 0.0 {
        result.rate = inside as f64 / seconds;
    }
    if seconds > 1.0 {
        let later = admits
            .iter()
            .filter(|a| a.after_ms >= span.start_ms + 1000 && a.after_ms < span.end_ms)
            .count();
        result.rate_after_first = later as f64 / (seconds - 1.0);
    }
    result
}

/// The length of `span` in seconds.
fn seconds_of(span: Span) -> f64 {
    span.end_ms.saturating_sub(span.start_ms) as f64 / 1000.0
}

/// The arrivals (sorted) an exact sliding-log limiter admits: each one
/// when fewer than `limit` admitted ones lie in the `window` before it
/// (`(t - window, t]`). Admitting whenever there is room is the most any
/// limiter that holds the limit in every window can admit.
pub fn exact_log(sorted: &[u64], window: u64, limit: u64) -> Vec<u64> {
    let mut admitted: Vec<u64> = Vec::new();
    let mut oldest = 0;
    for &t in sorted {
        while oldest < admitted.len() && admitted[oldest] + window <= t {
            oldest += 1;
        }
        if ((admitted.len() - oldest) as u64) < limit {
            admitted.push(t);
        }
    }
    admitted
}

/// The largest number of `sorted` values inside any half-open window
/// `[t, t + window)`, and the `t` where it is first reached.
///
/// A window holding the most values can always be slid right until it
/// starts on one of them, so only windows starting on a value are tried.
pub fn sliding_max(sorted: &[u64], window: u64) -> (u64, u64) {
    let mut best = (0u64, sorted.first().copied().unwrap_or(0));
    let mut hi = 0;
    for (lo, &t) in sorted.iter().enumerate() {
        hi = hi.max(lo);
        while hi < sorted.len() && sorted[hi] < t.saturating_add(window) {
            hi += 1;
        }
        let n = (hi - lo) as u64;
        if n > best.0 {
            best = (n, t);
        }
    }
    best
}

/// The median, 99th percentile and largest of [`Admit::wait_us`] (the
/// nearest rank; zeros when nothing was admitted).
pub fn wait_quantiles(admits: &[Admit]) -> [u64; 3] {
    let mut waits: Vec<u64> = admits.iter().map(Admit::wait_us).collect();
    waits.sort_unstable();
    nearest_ranks(&waits)
}

/// The median, 99th percentile and largest of `sorted` by nearest rank
/// (zeros when it is empty).
pub fn nearest_ranks(sorted: &[u64]) -> [u64; 3] {
    if sorted.is_empty() {
        return [0; 3];
    }
    let rank = |q: f64| {
        let i = (q * sorted.len() as f64).ceil() as usize;
        sorted[i.clamp(1, sorted.len()) - 1]
    };
    [rank(0.5), rank(0.99), rank(1.0)]
}

/// Passes per bucket (by pass timestamp) in every bucket of the span that
/// lies wholly inside the union of the admitted requests' waits
/// `[before_us, pass_us]`: the buckets during which the limiter always had
/// a request waiting for its turn.
pub fn saturated_counts(admits: &[Admit], span: Span, grid: Grid) -> Vec<u64> {
    let mut waits: Vec<(u64, u64)> = admits
        .iter()
        .filter(|a| a.pass_us > a.before_us)
        .map(|a| (a.before_us, a.pass_us))
        .collect();
    waits.sort_unstable();
    // Merge overlapping (or touching) waits into disjoint busy intervals.
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for (from, to) in waits {
        match busy.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => busy.push((from, to)),
        }
    }
    let mut passes: Vec<u64> = admits.iter().map(|a| a.pass_us).collect();
    passes.sort_unstable();
    let bucket_us = grid.bucket_ms * 1000;
    let mut counts = Vec::new();
    let mut start = span.start_ms * 1000;
    while start + bucket_us <= span.end_ms * 1000 {
        let end = start + bucket_us;
        // The busy interval starting at or before `start`, if any.
        let i = busy.partition_point(|b| b.0 <= start);
        if i > 0 && busy[i - 1].1 >= end {
            let n = passes.partition_point(|&p| p < end) - passes.partition_point(|&p| p < start);
            counts.push(n as u64);
        }
        start = end;
    }
    counts
}

/// Admissions per bucket from `span.start_ms` on, by handler reading.
pub fn per_bucket(admits: &[Admit], span: Span, grid: Grid) -> Vec<u64> {
    let len = span
        .end_ms
        .saturating_sub(span.start_ms)
        .div_ceil(grid.bucket_ms) as usize;
    let mut counts = vec![0u64; len];
    for a in admits {
        let b = bucket_of(a.after_ms, span.start_ms, grid);
        if let Ok(i) = usize::try_from(b) {
            if let Some(c) = counts.get_mut(i) {
                *c += 1;
            }
        }
    }
    counts
}

/// The count in the trailing window `(t - window, t]` at every `step_ms`
/// from the span's start to its end, by handler reading in microseconds.
pub fn trailing(admits: &[Admit], span: Span, grid: Grid, step_ms: u64) -> Vec<(f64, u64)> {
    let mut micros: Vec<u64> = admits.iter().map(|a| a.pass_us).collect();
    micros.sort_unstable();
    let window = grid.window_ms() * 1000;
    let mut points = Vec::new();
    let mut t = span.start_ms * 1000;
    let end = span.end_ms * 1000;
    while t <= end {
        let hi = micros.partition_point(|&m| m <= t);
        let lo = micros.partition_point(|&m| m <= t.saturating_sub(window));
        let x = (t - span.start_ms * 1000) as f64 / 1e6;
        points.push((x, (hi - lo) as u64));
        t += step_ms * 1000;
    }
    points
}

/// Checks the maths above on hand-made admissions; returns what failed.
pub fn self_check() -> Vec<String> {
    let mut failures = Vec::new();
    let mut expect = |what: &str, got: u64, want: u64| {
        if got != want {
            failures.push(format!("{what}: got {got}, expected {want}"));
        }
    };
    let at = |ms: u64| Admit {
        before_ms: ms,
        before_us: ms * 1000,
        pass_us: ms * 1000,
        after_ms: ms,
    };
    // 1 000 ms apart is outside a half-open 1 s window; 999 ms is inside.
    expect(
        "sliding, 1 s apart",
        sliding_max(&[0, 1_000_000], 1_000_000).0,
        1,
    );
    expect(
        "sliding, 999 ms apart",
        sliding_max(&[0, 999_000], 1_000_000).0,
        2,
    );
    expect("sliding, empty", sliding_max(&[], 1_000_000).0, 0);
    // Five at the end of one second and five at the start of the next:
    // bucket-aligned windows see at most 10 and the sliding window 10.
    let span = Span {
        start_ms: 10_000,
        end_ms: 13_000,
    };
    let mut admits: Vec<Admit> = (0..5).map(|i| at(10_950 + i)).collect();
    admits.extend((0..5).map(|i| at(11_000 + i)));
    let r = analyse(&admits, &[], span, Grid::DEFAULT, 5);
    expect("edge burst, bucket max", r.bucket_max, 10);
    expect("edge burst, sliding max", r.sliding_max, 10);
    expect("edge burst, straddling", r.straddling, 0);
    expect("edge burst, largest bucket", r.bucket_peak, 5);
    // An admission whose readings straddle a bucket edge widens the bound.
    let mut straddler = at(10_100);
    straddler.before_ms = 10_099;
    let r = analyse(&[at(10_000), straddler], &[], span, Grid::DEFAULT, 5);
    expect("straddler, straddling", r.straddling, 1);
    expect("straddler, bound", r.bucket_max_bound, 2);
    // A steady 5 per second for 3 s: every full window holds exactly 5.
    let steady: Vec<Admit> = (0..15).map(|i| at(10_000 + i * 200)).collect();
    let r = analyse(&steady, &[], span, Grid::DEFAULT, 5);
    expect("steady, bucket max", r.bucket_max, 5);
    expect("steady, min full", r.bucket_min_full, 5);
    // A 429 while the window is full is justified; one with room is not.
    let full = [Block {
        before_us: 10_900_000,
        before_ms: 10_900,
        after_ms: 10_900,
    }];
    let r = analyse(&steady, &full, span, Grid::DEFAULT, 5);
    expect("steady, 429 in a full window", r.blocked_with_room, 0);
    let early = [Block {
        before_us: 10_000_000,
        before_ms: 10_000,
        after_ms: 10_000,
    }];
    let r = analyse(&steady, &early, span, Grid::DEFAULT, 5);
    expect("steady, 429 with room", r.blocked_with_room, 1);
    expect(
        "steady, all full windows at limit",
        r.full_windows_at_limit,
        r.full_windows,
    );
    expect(
        "steady, per-bucket total",
        per_bucket(&steady, span, Grid::DEFAULT).iter().sum(),
        15,
    );
    // Paced passes, one every 10 ms from 10 000 to 10 500 ms, each having
    // waited 15 ms: the buckets wholly inside the waits are the five from
    // 10 000 to 10 500, each with ten passes.
    let paced: Vec<Admit> = (0..=50)
        .map(|i| {
            let mut a = at(10_000 + i * 10);
            a.before_us = a.pass_us.saturating_sub(15_000);
            a
        })
        .collect();
    let counts = saturated_counts(&paced, span, Grid::DEFAULT);
    expect("paced, saturated buckets", counts.len() as u64, 5);
    expect(
        "paced, fewest passes in a saturated bucket",
        counts.iter().copied().min().unwrap_or(0),
        10,
    );
    expect(
        "paced, most passes in a saturated bucket",
        counts.iter().copied().max().unwrap_or(0),
        10,
    );
    let [p50, p99, p100] = wait_quantiles(&paced);
    expect("paced, median wait", p50, 15_000);
    expect("paced, p99 wait", p99, 15_000);
    expect("paced, largest wait", p100, 15_000);
    let mut slow = paced.clone();
    slow[7].before_us -= 5_000;
    expect("one slower wait, largest", wait_quantiles(&slow)[2], 20_000);
    expect("one slower wait, median", wait_quantiles(&slow)[0], 15_000);
    // The exact log, limit 2: of three at 0, 1 and 2 ms it admits two;
    // one at 1 s goes in (the first is a window old by then), one at
    // 1.0005 s does not; no window of what it admits holds more than 2.
    let log = exact_log(&[0, 1_000, 2_000, 1_000_000, 1_000_500], 1_000_000, 2);
    expect("exact log, admitted", log.len() as u64, 3);
    expect(
        "exact log, last admitted",
        log.last().copied().unwrap_or(0),
        1_000_000,
    );
    expect("exact log, sliding max", sliding_max(&log, 1_000_000).0, 2);
    // Admissions that never waited leave no bucket saturated.
    expect(
        "steady, saturated buckets",
        saturated_counts(&steady, span, Grid::DEFAULT).len() as u64,
        0,
    );
    failures
}
