//! A bucket's counts as plain numbers, and the response-time arithmetic
//! every read path shares.
//!
//! Response times are sums of microseconds that saturate at `u64::MAX`
//! rather than wrap (see `tallies`), so an average can come out low after
//! absurd samples. Every average handed out goes through [`Counts::avg_rt`]
//! or [`clamp_avg`], which keep it at or above the window's minimum: a
//! reader never sees `avg_rt < min_rt`.

use std::time::Duration;

/// A bucket's (or a window's) counters as plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) pass: u64,
    pub(crate) block: u64,
    pub(crate) exception: u64,
    pub(crate) success: u64,
    pub(crate) rt_micros: u64,
    pub(crate) occupied_pass: u64,
    /// `u64::MAX` when none.
    pub(crate) min_rt_micros: u64,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            pass: 0,
            block: 0,
            exception: 0,
            success: 0,
            rt_micros: 0,
            occupied_pass: 0,
            min_rt_micros: u64::MAX,
        }
    }
}

impl Counts {
    /// Adds `other` into `self`, saturating.
    pub(crate) fn merge(&mut self, other: &Counts) {
        self.pass = self.pass.saturating_add(other.pass);
        self.block = self.block.saturating_add(other.block);
        self.exception = self.exception.saturating_add(other.exception);
        self.success = self.success.saturating_add(other.success);
        self.rt_micros = self.rt_micros.saturating_add(other.rt_micros);
        self.occupied_pass = self.occupied_pass.saturating_add(other.occupied_pass);
        self.min_rt_micros = self.min_rt_micros.min(other.min_rt_micros);
    }

    /// Whether any event was recorded.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Counts::default()
    }

    /// The smallest response time, `None` when none was recorded.
    pub(crate) fn min_rt(&self) -> Option<Duration> {
        min_rt(self.min_rt_micros)
    }

    /// The average response time over the successes, never below
    /// [`min_rt`](Self::min_rt); `None` without successes.
    pub(crate) fn avg_rt(&self) -> Option<Duration> {
        clamp_avg(average_rt(self.rt_micros, self.success), self.min_rt_micros)
    }
}

/// `rt_sum / successes`, or `None` without successes. The raw quotient: a
/// caller that also has the minimum passes the result through [`clamp_avg`].
pub(crate) fn average_rt(rt_micros: u64, successes: u64) -> Option<Duration> {
    let nanos = u128::from(rt_micros) * 1000 / u128::from(successes.max(1));
    (successes != 0).then(|| Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
}

/// Raises an average to the minimum when it fell below it. That happens
/// only when the sum saturated after absurd response times, or when
/// successes were recorded without their response times; either way the
/// minimum is the better lower bound.
pub(crate) fn clamp_avg(avg: Option<Duration>, min_rt_micros: u64) -> Option<Duration> {
    avg.map(|avg| match min_rt(min_rt_micros) {
        Some(min) => avg.max(min),
        None => avg,
    })
}

/// A stored minimum (`u64::MAX` for none) as a duration.
pub(crate) fn min_rt(min_rt_micros: u64) -> Option<Duration> {
    (min_rt_micros != u64::MAX).then(|| Duration::from_micros(min_rt_micros))
}

/// A response time in whole microseconds, saturating.
pub(crate) fn micros(rt: Duration) -> u64 {
    u64::try_from(rt.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_never_drops_below_the_minimum() {
        // A saturated sum over two successes of half the range each.
        let counts = Counts {
            success: 4,
            rt_micros: u64::MAX,
            min_rt_micros: u64::MAX / 2,
            ..Counts::default()
        };
        assert_eq!(counts.avg_rt(), counts.min_rt());
        assert!(counts.avg_rt() >= counts.min_rt());
    }

    #[test]
    fn average_without_rt_is_the_plain_quotient() {
        let counts = Counts {
            success: 2,
            rt_micros: 10,
            ..Counts::default()
        };
        assert_eq!(counts.avg_rt(), Some(Duration::from_micros(5)));
        assert_eq!(Counts::default().avg_rt(), None);
    }
}
