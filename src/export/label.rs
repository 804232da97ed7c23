//! [`KeyLabel`]: how a key is shown as text in exports.

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

/// A key that exporters can show as text: the `key` label of the Prometheus
/// collector, the key column of the dashboard.
///
/// Implemented for every built-in key type: `()` ([`GlobalKey`](crate::GlobalKey),
/// shown as `all`), `String` ([`PathKey`](crate::PathKey),
/// [`MethodPathKey`](crate::MethodPathKey), `MatchedPathKey`),
/// `Option<String>` ([`HeaderKey`](crate::HeaderKey)) and `Option<IpAddr>`
/// ([`PeerIpKey`](crate::PeerIpKey), [`ForwardedIpKey`](crate::ForwardedIpKey)),
/// and for the usual types of closure keys: strings, integers, addresses,
/// `http::Method`, `Option`s of them, references, `Box`es and `Arc`s of
/// them, and tuples of up to eight of them, such as `(Option<IpAddr>,
/// String)` for a key made of the client's address and the path.
/// `Display` alone would not do: the built-in `Option` keys have none, and
/// their `None` (a request without the header or the address) must stay
/// apart from every `Some` value, the empty string included. A key type of
/// your own implements the one method; two different keys must get
/// different labels, or exporters show them as one.
///
/// # Tuples
///
/// A tuple's label is its parts' labels joined with `", "`: `(Some(ip),
/// "/users")` is `127.0.0.1, /users`. A part that is missing (`None`) is
/// written `-`; inside a part, `\` and `,` are escaped with a backslash,
/// and a part whose text is `-` is written `\-`. So no two tuples share a
/// label, whatever their parts hold, and a tuple is never missing as a
/// whole (its label is never `None`).
///
/// ```
/// use std::net::IpAddr;
/// use tower_sliding_window::export::KeyLabel;
///
/// assert_eq!("/users".to_owned().label().as_deref(), Some("/users"));
/// let ip: Option<IpAddr> = Some([127, 0, 0, 1].into());
/// assert_eq!(ip.label().as_deref(), Some("127.0.0.1"));
/// assert_eq!(None::<String>.label(), None);
///
/// let pair: (Option<IpAddr>, String) = (ip, "/users".to_owned());
/// assert_eq!(pair.label().as_deref(), Some("127.0.0.1, /users"));
/// let pair: (Option<IpAddr>, String) = (None, "/a, b".to_owned());
/// assert_eq!(pair.label().as_deref(), Some(r"-, /a\, b"));
/// ```
pub trait KeyLabel {
    /// The key as text, or `None` for a key that stands for "missing" (the
    /// `None` of an `Option` key). Exporters mark such a key apart (label
    /// `entry="missing"`, a marked row) instead of inventing a text for it.
    fn label(&self) -> Option<Cow<'_, str>>;
}

impl KeyLabel for () {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed("all"))
    }
}

impl KeyLabel for String {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl KeyLabel for str {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl<T: KeyLabel + ?Sized> KeyLabel for &T {
    fn label(&self) -> Option<Cow<'_, str>> {
        T::label(self)
    }
}

impl<T: KeyLabel + ?Sized> KeyLabel for Box<T> {
    fn label(&self) -> Option<Cow<'_, str>> {
        T::label(self)
    }
}

impl<T: KeyLabel + ?Sized> KeyLabel for Arc<T> {
    fn label(&self) -> Option<Cow<'_, str>> {
        T::label(self)
    }
}

impl KeyLabel for Cow<'static, str> {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self))
    }
}

impl<T: KeyLabel> KeyLabel for Option<T> {
    fn label(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(T::label)
    }
}

/// Types shown with their `Display`.
macro_rules! display_label {
    ($($t:ty),*) => {$(
        impl KeyLabel for $t {
            fn label(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Owned(self.to_string()))
            }
        }
    )*};
}

display_label!(
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, bool, char, u8, u16, u32, u64, u128, usize, i8, i16,
    i32, i64, i128, isize
);

impl KeyLabel for http::Method {
    fn label(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.as_str()))
    }
}

/// Appends one part of a tuple's label to `out` (see "Tuples" on
/// [`KeyLabel`]): `-` for a missing part, the text with `\` and `,`
/// escaped otherwise, and `\-` for the text `-`, so that the parts can
/// be told apart again and a missing part from every text.
fn push_part(out: &mut String, part: Option<Cow<'_, str>>) {
    match part.as_deref() {
        None => out.push('-'),
        Some("-") => out.push_str("\\-"),
        Some(text) => {
            for c in text.chars() {
                if matches!(c, '\\' | ',') {
                    out.push('\\');
                }
                out.push(c);
            }
        }
    }
}

/// Tuples of labelled parts, labelled part by part.
macro_rules! tuple_label {
    ($($part:ident)+) => {
        impl<$($part: KeyLabel),+> KeyLabel for ($($part,)+) {
            #[allow(non_snake_case)]
            fn label(&self) -> Option<Cow<'_, str>> {
                let ($($part,)+) = self;
                let mut out = String::new();
                let mut first = true;
                $(
                    if !std::mem::take(&mut first) {
                        out.push_str(", ");
                    }
                    push_part(&mut out, $part.label());
                )+
                Some(Cow::Owned(out))
            }
        }
    };
}

tuple_label!(A);
tuple_label!(A B);
tuple_label!(A B C);
tuple_label!(A B C D);
tuple_label!(A B C D E);
tuple_label!(A B C D E F);
tuple_label!(A B C D E F G);
tuple_label!(A B C D E F G H);

#[cfg(test)]
mod tests {
    use super::*;

    fn label<K: KeyLabel>(key: &K) -> Option<String> {
        key.label().map(Cow::into_owned)
    }

    /// Tuples whose parts hold the separator, the escape, the missing
    /// marker and nothing: every one gets a label of its own.
    #[test]
    fn tuple_labels_tell_every_key_apart() {
        let s = |t: &str| Some(t.to_owned());
        let keys: Vec<(Option<String>, Option<String>)> = vec![
            (s("a, b"), s("c")),
            (s("a"), s("b, c")),
            (s("a,"), s(" b, c")),
            (s("a"), s(" b, c")),
            (None, s("x")),
            (s("-"), s("x")),
            (s("\\-"), s("x")),
            (s(""), s("x")),
            (s("\\"), s("x")),
            (s("\\,"), s("x")),
            (s(","), s("x")),
            (s(", -"), None),
            (s(""), None),
            (None, None),
            (None, s("")),
            (s(""), s("")),
            (s("a\\"), s(", b")),
            (s("a\\,"), s(" b")),
        ];
        let labels: Vec<String> = keys.iter().map(|k| label(k).expect("a label")).collect();
        for (i, a) in labels.iter().enumerate() {
            for (j, b) in labels.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?}", keys[i], keys[j]);
            }
        }
        assert_eq!(labels[0], "a\\, b, c");
        assert_eq!(labels[4], "-, x");
        assert_eq!(labels[5], "\\-, x");
    }

    #[test]
    fn nested_and_wrapped_parts() {
        let ip: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let key = (ip, (http::Method::POST, "/login".to_owned()), 7u16);
        assert_eq!(label(&key).as_deref(), Some("10.0.0.1, POST\\, /login, 7"));
        let boxed: Box<str> = "b".into();
        let shared: Arc<str> = "s".into();
        assert_eq!(label(&(boxed, shared, "t")).as_deref(), Some("b, s, t"));
        assert_eq!(label(&((),)).as_deref(), Some("all"));
        assert_eq!(label(&Arc::new(None::<String>)), None);
    }
}
