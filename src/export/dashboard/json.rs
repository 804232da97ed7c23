//! A small JSON writer for `GET /stats`: numbers, strings, `null` and
//! punctuation appended to one buffer. The response is made of a few
//! thousand short strings and small numbers, so writing them directly (no
//! intermediate values, no escaping of field names known in advance) is
//! what keeps a table of thousands of keys cheap to serve.

/// "00", "01", .. "99" back to back: the two digits of every number below
/// 100.
const PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        pairs[2 * i] = b'0' + (i / 10) as u8;
        pairs[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    pairs
};

/// The JSON text being written.
pub(super) struct Json {
    out: Vec<u8>,
}

impl Json {
    /// An empty text with room for `capacity` bytes.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Json {
            out: Vec::with_capacity(capacity),
        }
    }

    /// The text written so far.
    pub(super) fn into_bytes(self) -> Vec<u8> {
        self.out
    }

    /// Appends `text` as it is: punctuation and field names, which the
    /// caller writes already quoted (`"{\"pass\":"`).
    #[inline]
    pub(super) fn raw(&mut self, text: &str) {
        self.out.extend_from_slice(text.as_bytes());
    }

    /// Appends `n` in decimal, two digits at a time.
    #[inline]
    pub(super) fn u64(&mut self, mut n: u64) {
        if n < 10 {
            // The common case in a table of keys: one digit.
            self.out.push(b'0' + n as u8);
            return;
        }
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        while n >= 100 {
            at -= 2;
            let pair = 2 * (n % 100) as usize;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
            n /= 100;
        }
        if n >= 10 {
            at -= 2;
            let pair = 2 * n as usize;
            digits[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        } else {
            at -= 1;
            digits[at] = b'0' + n as u8;
        }
        self.out.extend_from_slice(&digits[at..]);
    }

    /// Appends `n` in decimal, or `null`.
    #[inline]
    pub(super) fn opt_u64(&mut self, n: Option<u64>) {
        match n {
            Some(n) => self.u64(n),
            None => self.raw("null"),
        }
    }

    /// Appends `b` as `true` or `false`.
    pub(super) fn bool(&mut self, b: bool) {
        self.raw(if b { "true" } else { "false" });
    }

    /// Appends `s` as a JSON string: quotes, backslashes and the control
    /// characters U+0000 to U+001F escaped, everything else as it is (the
    /// text is UTF-8 already, so the output is too).
    pub(super) fn str(&mut self, s: &str) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let bytes = s.as_bytes();
        self.out.push(b'"');
        let mut plain = 0;
        for (i, &b) in bytes.iter().enumerate() {
            let short: &[u8] = match b {
                b'"' => b"\\\"",
                b'\\' => b"\\\\",
                b'\n' => b"\\n",
                b'\r' => b"\\r",
                b'\t' => b"\\t",
                0x08 => b"\\b",
                0x0c => b"\\f",
                0x00..=0x1f => b"",
                _ => continue,
            };
            self.out.extend_from_slice(&bytes[plain..i]);
            plain = i + 1;
            if short.is_empty() {
                let hex = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(b >> 4)],
                    HEX[usize::from(b & 0xf)],
                ];
                self.out.extend_from_slice(&hex);
            } else {
                self.out.extend_from_slice(short);
            }
        }
        self.out.extend_from_slice(&bytes[plain..]);
        self.out.push(b'"');
    }

    /// Appends `items` as an array, each written by `write`.
    #[inline]
    pub(super) fn array<T>(
        &mut self,
        items: impl IntoIterator<Item = T>,
        mut write: impl FnMut(&mut Self, T),
    ) {
        self.out.push(b'[');
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            write(self, item);
        }
        self.out.push(b']');
    }
}

#[cfg(test)]
mod tests {
    use super::Json;

    fn text(write: impl FnOnce(&mut Json)) -> String {
        let mut json = Json::with_capacity(0);
        write(&mut json);
        String::from_utf8(json.into_bytes()).expect("UTF-8")
    }

    #[test]
    fn numbers_cover_the_whole_range() {
        let mut n = 1u64;
        let mut samples = vec![0, u64::MAX, 1_732_345_678_123];
        for _ in 0..20 {
            samples.extend([n - 1, n, n + 1, n.saturating_mul(5)]);
            n = n.saturating_mul(10);
        }
        samples.extend(0..1000);
        for n in samples {
            assert_eq!(text(|j| j.u64(n)), n.to_string());
        }
        assert_eq!(text(|j| j.opt_u64(None)), "null");
        assert_eq!(text(|j| j.opt_u64(Some(7))), "7");
    }

    #[test]
    fn strings_read_back_as_written() {
        let mut hostile: String = (0u8..0x20).map(char::from).collect();
        hostile.push_str("\"\\/ plain \u{7f} é 😀 \u{2028}\u{2029} </script>");
        for s in ["", "/search", "\"", "\\", "a\"b\\c", hostile.as_str()] {
            let written = text(|j| j.str(s));
            let back: String = serde_json::from_str(&written).expect(&written);
            assert_eq!(back, s);
        }
        // The short escapes where JSON has them, `\u00XX` for the rest.
        assert_eq!(text(|j| j.str("\n\t\u{1}")), r#""\n\t\u0001""#);
    }

    #[test]
    fn arrays_are_comma_separated() {
        assert_eq!(text(|j| j.array([] as [u64; 0], Json::u64)), "[]");
        assert_eq!(text(|j| j.array([1u64, 2, 3], Json::u64)), "[1,2,3]");
        let nested = text(|j| j.array([[1u64], [2]], |j, a| j.array(a, Json::u64)));
        assert_eq!(nested, "[[1],[2]]");
    }
}
