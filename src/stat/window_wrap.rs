use std::fmt;

/// One bucket of a [`LeapArray`](super::LeapArray) together with the window it
/// belongs to: Sentinel's `WindowWrap`.
///
/// A `WindowWrap` is a view taken at one moment. The array reuses its buckets
/// in place, so a wrap kept past the end of its window may show the counts of
/// a later window that has taken over the same slot; take a fresh one per
/// read.
pub struct WindowWrap<'a, B> {
    window_start: u64,
    window_length_ms: u64,
    value: &'a B,
}

impl<'a, B> WindowWrap<'a, B> {
    pub(crate) fn new(window_start: u64, window_length_ms: u64, value: &'a B) -> Self {
        WindowWrap {
            window_start,
            window_length_ms,
            value,
        }
    }

    /// Start of the bucket's window, in clock milliseconds.
    pub fn window_start(&self) -> u64 {
        self.window_start
    }

    /// Length of one bucket, in milliseconds.
    pub fn window_length_ms(&self) -> u64 {
        self.window_length_ms
    }

    /// The bucket's value.
    pub fn value(&self) -> &'a B {
        self.value
    }

    /// Whether `time_ms` falls in `[window_start, window_start + length)`.
    pub fn is_time_in_window(&self, time_ms: u64) -> bool {
        time_ms >= self.window_start && time_ms - self.window_start < self.window_length_ms
    }
}

impl<B> Clone for WindowWrap<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for WindowWrap<'_, B> {}

impl<B: fmt::Debug> fmt::Debug for WindowWrap<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowWrap")
            .field("window_start", &self.window_start)
            .field("window_length_ms", &self.window_length_ms)
            .field("value", self.value)
            .finish()
    }
}
