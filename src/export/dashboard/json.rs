//! A small JSON writer for `GET /stats`: numbers, strings, `null` and
//! punctuation appended to one buffer. The response is made of a few
//! thousand short strings and small numbers, so writing them directly (no
//! intermediate values, no escaping of field names known in advance) is
//! what keeps a table of thousands of keys cheap to serve.

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

    /// Appends `n` in decimal.
    #[inline]
    pub(super) fn u64(&mut self, mut n: u64) {
        if n < 10 {
            // The common case in a table of keys: one digit.
            self.out.push(b'0' + n as u8);
            return;
        }
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            // `n % 10` is below 10: the cast keeps it whole.
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
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
        for n in [0, 1, 9, 10, 99, 100, 1_732_345_678_123, u64::MAX] {
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
