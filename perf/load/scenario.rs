//! Offered-load scenarios: how many requests, and exactly when.
//!
//! Times are microseconds after a start instant that lies on a whole second
//! of the clock our layer reads, so "the start of a second" and "a window
//! boundary" mean the same instants to the client and to the layer.

use std::fmt;

/// How far after a second boundary a "burst at the start of a second" is
/// due. A burst due at the exact boundary can be judged, by the layer's
/// clock reading taken a little earlier or on another thread, to belong to
/// the window before, which says more about thread scheduling than about the
/// limiter (and with a `CachedClock` the reading may lag by a refresh
/// interval). 5 ms puts the burst inside the new second by any reading in the
/// process.
pub const BURST_DELAY_US: u64 = 5_000;

/// How the offered requests are spread over each second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Evenly spaced, all the time.
    Steady,
    /// Each second's requests all due at the start of that second (5 ms
    /// after the boundary, see [`BURST_DELAY_US`]).
    BurstStart,
    /// Each second's requests spread over the 100 ms around a second
    /// boundary (50 ms before to 50 ms after), straddling both a window
    /// boundary and a bucket boundary.
    BurstStraddle,
}

/// One accuracy scenario: a shape at a multiple of the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    /// Offered load as a multiple of the limit.
    pub factor: u64,
    /// How the load is spread.
    pub shape: Shape,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = match self.shape {
            Shape::Steady => "steady",
            Shape::BurstStart => "burst at second start",
            Shape::BurstStraddle => "burst straddling a boundary",
        };
        write!(f, "{}x {shape}", self.factor)
    }
}

impl Scenario {
    /// Every scenario of the accuracy run: 2x, 5x, 20x, each shape.
    pub fn all() -> Vec<Scenario> {
        let mut all = Vec::new();
        for factor in [2, 5, 20] {
            for shape in [Shape::Steady, Shape::BurstStart, Shape::BurstStraddle] {
                all.push(Scenario { factor, shape });
            }
        }
        all
    }

    /// A file-name friendly identifier.
    pub fn slug(&self) -> String {
        let shape = match self.shape {
            Shape::Steady => "steady",
            Shape::BurstStart => "burst-start",
            Shape::BurstStraddle => "burst-straddle",
        };
        format!("{}x-{shape}", self.factor)
    }

    /// Due times (microseconds after the start) for `seconds` seconds of
    /// load at `factor x limit` requests per second.
    pub fn offsets_us(&self, limit: u64, seconds: u64) -> Vec<u64> {
        let per_second = self.factor * limit;
        match self.shape {
            Shape::Steady => {
                let total = per_second * seconds;
                (0..total).map(|i| i * 1_000_000 / per_second).collect()
            }
            Shape::BurstStart => (0..seconds)
                .flat_map(|s| {
                    std::iter::repeat(s * 1_000_000 + BURST_DELAY_US).take(per_second as usize)
                })
                .collect(),
            Shape::BurstStraddle => (1..=seconds)
                .flat_map(|s| {
                    (0..per_second).map(move |j| s * 1_000_000 - 50_000 + j * 100_000 / per_second)
                })
                .collect(),
        }
    }

    /// How long the offered load lasts, in milliseconds.
    pub fn length_ms(&self, seconds: u64) -> u64 {
        match self.shape {
            Shape::Steady | Shape::BurstStart => seconds * 1000,
            Shape::BurstStraddle => seconds * 1000 + 50,
        }
    }
}
