//! How long a rejected caller waits: pure arithmetic over the window's
//! `(bucket start, passes)`, no atomics and no clock.

/// Milliseconds from `now_ms` until `n` more passes fit under `limit`,
/// assuming nothing else passes meanwhile; `None` if they never can
/// (`n > limit`).
///
/// `buckets` are the window's buckets as `(start, pass)`, oldest first. A
/// bucket stops counting `interval_ms` after its start, so the wait is until
/// enough of the oldest buckets have slid out.
pub(crate) fn wait_for_quota<I>(
    buckets: I,
    now_ms: u64,
    interval_ms: u64,
    n: u64,
    limit: u64,
) -> Option<u64>
where
    I: IntoIterator<Item = (u64, u64)>,
    I::IntoIter: Clone,
{
    if n > limit {
        return None;
    }
    // Two passes over the buckets rather than a copy, so that nothing is
    // allocated on the rejection path. The second pass may see newer counts
    // than the first; the fallback at the end covers a window that emptied
    // in between.
    let buckets = buckets.into_iter();
    let total = buckets
        .clone()
        .fold(0u64, |sum, (_, pass)| sum.saturating_add(pass));
    let mut excess = total.saturating_add(n).saturating_sub(limit);
    if excess == 0 {
        return Some(0);
    }
    for (start, pass) in buckets {
        excess = excess.saturating_sub(pass);
        if excess == 0 {
            return Some(
                start
                    .saturating_add(interval_ms)
                    .saturating_sub(now_ms)
                    .max(1),
            );
        }
    }
    // The buckets hold fewer passes than the excess (they changed while
    // being read): once the whole window has slid out, anything fits.
    Some(interval_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_now() {
        assert_eq!(wait_for_quota([(0, 3)], 10, 1000, 1, 5), Some(0));
    }

    #[test]
    fn waits_for_the_oldest_buckets_to_leave() {
        // Buckets at 0 (4 passes), 100 (3), 200 (3); limit 10, now 250.
        let buckets = [(0, 4), (100, 3), (200, 3)];
        // One more needs 1 freed: the bucket at 0 leaves at 1000.
        assert_eq!(wait_for_quota(buckets, 250, 1000, 1, 10), Some(750));
        // Five more need 5 freed: buckets at 0 and 100 must leave (1100).
        assert_eq!(wait_for_quota(buckets, 250, 1000, 5, 10), Some(850));
    }

    #[test]
    fn never_fits_when_n_exceeds_limit() {
        assert_eq!(wait_for_quota([], 0, 1000, 1, 0), None);
        assert_eq!(wait_for_quota([(0, 1)], 0, 1000, 3, 2), None);
    }

    #[test]
    fn wait_is_at_least_one_millisecond() {
        assert_eq!(wait_for_quota([(0, 1)], 1000, 1000, 1, 1), Some(1));
    }
}
